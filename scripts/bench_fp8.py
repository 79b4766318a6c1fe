#!/usr/bin/env python
"""Time FP8 prefill products on the GPU, bf16 in and out, all in one process in interleaved
rounds: cuBLAS's FP8 GEMM on the contract's operands (lcmac.spec.fp8: A per 1×128, the weights
per 128×128) with the quantisation of A timed in (the weights quantised beforehand, once),
lcmac's plain fp8 GEMM and LCMAs in the fp8 operand mode (the same contract: A quantised in
its Combine-A pass, timed in; B̃ combined and quantised once: ``prepare_b``), and
torch.matmul in bf16, at 8192³, 16384³ and the 70B-class MLP shapes at 16k and 32k rows.

    python scripts/bench_fp8.py --list                            # what would be built and timed
    python scripts/bench_fp8.py --build-only --jobs 8 --artifacts DIR   # compile first (no GPU)
    python scripts/bench_fp8.py --artifacts DIR --sustained 5     # burst and sustained, reusing them
    python scripts/bench_fp8.py --shapes 8192x8192x8192 --algos gemm,strassen --rounds 5
    python scripts/bench_fp8.py --algos gemm,gemm+stages=6,gemm+block_m=64+block_n=256+policy=fullcol

cuBLAS runs through ``lcmac.torch.fp8.scaled_mm``: DeepSeek-V3's recipe (A per 1×128, the
weights per 128×128; ``torch.nn.functional.scaled_mm``, SM90 with cuBLASLt ≥ 12.9), else
rowwise scales, whichever this torch and cuBLAS run correctly first (the JSON says which and
why); A's quantisation (``lcmac.spec.fp8``'s contract, ``torch.compile``d unless
``--quantize eager`` or the compile fails) is timed in, and alone, and cuBLAS without it.
Schemes the fp8 mode refuses (Winograd², Strassen²: R × blocks per combine over 256) are
recorded under ``not_run`` with the reason.  Per shape: each variant's error on the first
and last ``CHECK_ROWS`` rows against float64 (the output poisoned with NaN first), beside the
error of the float64 product of the contract's dequantised operands (the FP8 floor) and
cuBLAS's error against the product of its own dequantised operands; then interleaved rounds
(``lcmac.tune.measure.gpu_rounds``, each round starting at another variant) of ``--calls``
back-to-back calls: median, spread, TFLOP/s and the ratio fastest-baseline/variant, the
baselines being torch.matmul (bf16) and cuBLAS FP8 with A's quantisation; with
``--sustained S`` also each variant's mean over S seconds of back-to-back calls (the GPU at
its power cap), and the ratios of those.  The issue's targets (``TARGETS``: lcmac's plain
fp8 GEMM ≥ 0.97× cuBLAS FP8, an LCMA ≥ 1.08× at 16384³) are judged in the JSON.  Writes JSON
with device, date and command after every shape (``--out``, default
bench/results/<gpu>-bfloat16-fp8-prefill.json).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

#: M×N×K: squares, then Llama-70B-class MLP layers (up: N 28672, K 8192; down: N 8192,
#: K 28672) at 16k and 32k prefill tokens
DEFAULT_SHAPES = ["8192x8192x8192", "16384x16384x16384", "16384x28672x8192", "16384x8192x28672",
                  "32768x28672x8192", "32768x8192x28672"]
DEFAULT_ALGOS = "gemm,strassen,winograd"
#: what the fp8 work is judged by: lcmac's variant ÷ cuBLAS FP8 (with A's quantisation), as
#: speed ratios, at these shapes
TARGETS = {"lcmac-gemm-fp8": {"shape": [16384, 16384, 16384], "min_vs_cublas_fp8": 0.97},
           "lcmac-lcma-fp8": {"shape": [16384, 16384, 16384], "min_vs_cublas_fp8": 1.08}}
#: fp8 operands need sm_90a's FP8 tensor cores
TARGET = "cuda-sm90a"
CHECK_ROWS = 256
#: cuBLAS recipes tried in order: (name, A's blocks, W's blocks given K)
RECIPES = [("1x128,128x128", lambda K: ((1, 128), (128, 128))), ("rowwise", lambda K: ((1, K), (1, K)))]


def _shape(s: str) -> tuple[int, int, int]:
    try:
        M, N, K = (int(x) for x in s.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"a shape is MxNxK, got {s!r}") from None
    return M, N, K


def _tag(spec, shape) -> str:
    return f"{re.sub('[^A-Za-z0-9_.-]', '_', spec.replace('^', 'sq'))}-fp8-{'x'.join(map(str, shape))}"


def _knob(v: str):
    return {"true": True, "false": False}.get(v.lower(), int(v) if v.lstrip("-").isdigit() else v)


def _split(spec: str) -> tuple[str, dict]:
    """``algo[+knob=value...]`` → (algo, CudaConfig knobs): a scheme with its config changed,
    so that one run compares tiles, depths or stores of one scheme (``gemm+stages=6``)."""
    algo, *knobs = spec.split("+")
    out = {}
    for kv in knobs:
        k, eq, v = kv.partition("=")
        if not eq or not k:
            raise SystemExit(f"bench_fp8: a knob is name=value after '+', got {kv!r} in {spec!r}")
        out[k] = _knob(v)
    return algo, out


def _config(spec: str) -> dict:
    algo, knobs = _split(spec)
    return {"operands": "fp8", **({} if algo == "gemm" else {"fused": False}), **knobs}


def plan(algos, shapes, args) -> dict:
    """What a run builds and times (``--list``): the artifacts, by tag and config, and the
    variants timed at every shape."""
    cublas = [f"cublas-fp8-{name}" for name, _ in RECIPES]
    return {"target": TARGET, "dtype": "bfloat16", "shapes": [list(s) for s in shapes],
            "builds": [{"tag": _tag(a, s), "algorithm": a, "shape": list(s), "config": _config(a)}
                       for a in algos for s in shapes],
            "variants": ["torch.matmul-bf16", f"{cublas[0]} (else {', '.join(cublas[1:])}; A's "
                         "quantisation timed in)", "...-gemm-only", "quantize-a-..."]
                        + [f"lcmac-{a}-fp8 (A quantised in its combine, B prepared)" for a in algos],
            "rounds": args.rounds, "calls": args.calls, "sustained_s": args.sustained,
            "targets": TARGETS}


def build_all(algos, shapes, art: Path, jobs: int, budget_s: float) -> dict:
    """{(algo, shape): manifest path or the reason there is none}; a manifest already in
    ``art`` is reused; builds not started within ``budget_s`` seconds are skipped."""
    import lcmac
    t0 = time.perf_counter()

    def one(key):
        algo, shape = key
        out = art / _tag(algo, shape)
        man = out / "lcmac.json"
        if man.is_file():
            return key, str(man)
        if time.perf_counter() - t0 > budget_s:
            return key, "skipped: --build-s spent before this build started"
        t = time.perf_counter()
        try:
            path = lcmac.build(_split(algo)[0], TARGET, "bfloat16", shape, config=_config(algo), out_dir=str(out), name="lcmac")
        except Exception as e:      # a refused scheme or a failed build is a result, not a stop
            return key, f"build failed: {type(e).__name__}: {str(e)[:600]}"
        print(f"  built {out.name} in {time.perf_counter() - t:.0f} s", flush=True)
        return key, str(path)
    keys = [(a, s) for a in algos for s in shapes]
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return dict(pool.map(one, keys))


def _quantizer(mode: str, block, A):
    """(quantize(A) -> (q, scales), how): torch.compile'd unless ``mode`` is "eager" or the
    compile fails on A (its error kept); compiled before it is timed."""
    import torch
    from lcmac.torch.fp8 import quantize

    def eager(x):
        return quantize(x, block)
    if mode == "eager":
        return eager, "eager"
    try:
        compiled = torch.compile(eager, dynamic=False)
        compiled(A)                 # torch.compile compiles at the first call
        torch.cuda.synchronize()
        return compiled, "torch.compile"
    except Exception as e:          # noqa: BLE001 - no inductor here: time the eager one
        return eager, f"eager (torch.compile failed: {type(e).__name__}: {str(e)[:200]})"


def _check_rows(M: int):
    import torch
    return torch.cat([torch.arange(min(M, CHECK_ROWS)), torch.arange(max(0, M - CHECK_ROWS), M)]).unique().cuda()


def _rel(x, ref) -> float:
    import torch
    x = x.double()
    if not torch.isfinite(x).all():
        return float("nan")
    return float(torch.linalg.norm(x - ref) / torch.linalg.norm(ref))


def cublas_variants(A, W, qmode: str, rows) -> tuple[list, dict]:
    """The cuBLAS FP8 variants of the first recipe that runs and matches the product of its
    own dequantised operands: ([(name, fn, output getter)], facts)."""
    import torch
    from lcmac.torch.fp8 import dequantize, quantize, scaled_mm
    M, K = A.shape
    tried = {}
    for name, blocks in RECIPES:
        a_block, w_block = blocks(K)
        try:
            qw, sw = quantize(W, w_block)
            qa, sa = quantize(A, a_block)
            C = scaled_mm(qa, sa, a_block, qw, sw, w_block)
            torch.cuda.synchronize()
        except Exception as e:      # noqa: BLE001 - a recipe this torch / cuBLAS lacks
            tried[name] = f"{type(e).__name__}: {str(e)[:300]}"
            continue
        own = dequantize(qa[rows], sa[rows] if sa.shape[0] == M else sa, a_block) @ dequantize(qw, sw, w_block).t()
        e_own = _rel(C[rows], own)
        if not e_own < 1e-2:        # the output's rounding is ~1e-3: a misread scale layout
            tried[name] = f"wrong result: {e_own:.3g} from the product of its dequantised operands"
            continue
        quant, how = _quantizer(qmode, a_block, A)
        out = {}

        def with_quant(quant=quant):
            q, s = quant(A)
            out["C"] = scaled_mm(q, s, a_block, qw, sw, w_block)

        def gemm_only():
            out["C"] = scaled_mm(qa, sa, a_block, qw, sw, w_block)
        facts = {"recipe": name, "a_block": list(a_block), "w_block": list(w_block), "quantize_a": how,
                 "error_vs_own_dequantised_product": e_own, "recipes_refused": tried}
        return [(f"cublas-fp8-{name}", with_quant, lambda: out["C"]),
                (f"cublas-fp8-{name}-gemm-only", gemm_only, lambda: out["C"]),
                (f"quantize-a-{name}", lambda: quant(A), None)], facts
    return [], {"recipe": None, "recipes_refused": tried}


def lcmac_variant(f, A, B, C):
    """(fn, how B is given): B̃ prepared once where the artifact can, else B each call."""
    try:
        Bp = f.prepare_b(B)
        return (lambda: f(A, Bp, out=C)), "prepared once (B̃ and its scales)"
    except Exception as e:          # noqa: BLE001 - the plain GEMM's B may have nothing to prepare
        return (lambda: f(A, B, out=C)), f"combined each call ({type(e).__name__}: {str(e)[:160]})"


def bench_shape(shape, algos, built, args) -> tuple[dict, list]:
    import torch
    import lcmac
    from lcmac.spec.fp8 import CONTRACT
    from lcmac.torch.fp8 import dequantize, quantize
    from lcmac.tune.measure import gpu_rounds
    M, N, K = shape
    g = torch.Generator(device="cuda").manual_seed(M + 7 * N + 13 * K)
    A = torch.randn(M, K, device="cuda", generator=g).bfloat16()
    B = (torch.randn(K, N, device="cuda", generator=g) / K ** 0.5).bfloat16()
    W = B.t().contiguous()
    C = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    rows = _check_rows(M)
    exact = A[rows].double() @ B.double()
    qa, sa = quantize(A[rows], CONTRACT.a_block)
    qw, sw = quantize(W, CONTRACT.b_block)
    floor = _rel(dequantize(qa, sa, CONTRACT.a_block) @ dequantize(qw, sw, CONTRACT.b_block).t(), exact)
    del qa, sa, qw, sw
    variants = [("torch.matmul-bf16", lambda: torch.matmul(A, B, out=C), lambda: C)]
    cub, facts = cublas_variants(A, W, args.quantize, rows)
    variants += cub
    notes, missing = {}, []
    for algo in algos:
        got = built.get((algo, shape))
        if got is None or not os.path.isfile(got):
            missing.append({"algorithm": algo, "shape": list(shape), "why": got or "not built"})
            continue
        try:
            f = lcmac.load(got)
            fn, how = lcmac_variant(f, A, B, C)
        except Exception as e:      # noqa: BLE001 - a load failure is recorded, the run goes on
            missing.append({"algorithm": algo, "shape": list(shape), "why": f"load failed: {type(e).__name__}: {e}"})
            continue
        notes[f"lcmac-{algo}-fp8"] = how
        variants.append((f"lcmac-{algo}-fp8", fn, lambda: C))
    errors, diffs, first = {}, {}, {}
    for name, fn, output in variants:
        if output is None:
            continue
        C.fill_(float("nan"))
        fn()
        torch.cuda.synchronize()
        first[name] = output()[rows].clone()
        errors[name] = _rel(first[name], exact)
    if cub:      # lcmac's kernels and cuBLAS on the same contract: close, not bit for bit
        ref_cub = first[cub[0][0]].double()
        diffs = {n: _rel(c, ref_cub) for n, c in first.items() if n.startswith("lcmac-")}
    del first
    for _, fn, _ in variants:        # warm: clocks up, workspaces allocated
        t_end = time.perf_counter() + 0.2
        while time.perf_counter() < t_end:
            fn()
        torch.cuda.synchronize()
    rounds, sustained = gpu_rounds([(n, fn) for n, fn, _ in variants], args.rounds, args.calls,
                                   sustained_s=args.sustained or 0.0)
    med = {n: statistics.median(ts) for n, ts in rounds.items()}
    base_names = ["torch.matmul-bf16"] + [n for n, _, _ in cub[:1]]
    fastest = min(base_names, key=lambda n: med[n])
    cublas = cub[0][0] if cub else None
    flops = 2.0 * M * N * K
    res = {}
    for name, ts in rounds.items():
        product = not name.startswith("quantize")       # A's quantisation alone is no product
        r = {"median_s": med[name], "seconds": ts, "spread": (max(ts) - min(ts)) / med[name],
             "tflops": flops / med[name] / 1e12 if product else None,
             "vs_fastest_baseline": med[fastest] / med[name] if product else None,
             **{f"vs_{b}": med[b] / med[name] if product else None for b in base_names},
             "vs_cublas_fp8": med[cublas] / med[name] if product and cublas else None,
             "rel_error_vs_float64": errors.get(name), "rel_diff_vs_cublas_fp8": diffs.get(name),
             "b_operand": notes.get(name)}
        if sustained:
            r["sustained_s"] = sustained[name]
            r["sustained_vs_cublas_fp8"] = sustained[cublas] / sustained[name] if product and cublas else None
        res[name] = r
    out = {"M": M, "N": N, "K": K, "fastest_baseline": fastest, "cublas_fp8": cublas,
           "fp8_floor_rel_error": floor, "cublas": facts, "sustained_s": args.sustained, "variants": res,
           "targets": _judged(shape, res)}
    print(f"\n{M}x{N}x{K} bf16 in/out (median of {args.rounds} rounds x {args.calls} calls; "
          f"fp8 floor {floor:.2e}; cuBLAS recipe {facts.get('recipe')})")
    print(f"  {'variant':34s} {'ms':>9s} {'spread':>7s} {'TFLOP/s':>8s} {'vs fastest':>10s} {'rel.err':>9s}")
    for name, r in res.items():
        tfl = f"{r['tflops']:8.1f}" if r["tflops"] else f"{'-':>8s}"
        vs = f"{r['vs_fastest_baseline']:9.3f}x" if r["vs_fastest_baseline"] else f"{'-':>10s}"
        err = r["rel_error_vs_float64"]
        print(f"  {name:34s} {r['median_s'] * 1e3:9.3f} {r['spread'] * 100:6.1f}% {tfl} {vs} "
              f"{'-' if err is None else f'{err:9.2e}'}")
    return out, missing


def _judged(shape, res: dict) -> dict:
    """``TARGETS`` at this shape: each one's best lcmac variant, its ratio, met or not."""
    out = {}
    for key, t in TARGETS.items():
        if list(shape) != t["shape"]:
            continue
        plain = [n for n in res if n.startswith("lcmac-gemm-fp8") or n.startswith("lcmac-gemm+")]
        names = plain if key == "lcmac-gemm-fp8" else [n for n in res if n.startswith("lcmac-") and n not in plain]
        got = {n: res[n]["vs_cublas_fp8"] for n in names if res[n].get("vs_cublas_fp8")}
        if got:
            best = max(got, key=got.get)
            out[key] = {"variant": best, "vs_cublas_fp8": got[best], "target": t["min_vs_cublas_fp8"],
                        "met": got[best] >= t["min_vs_cublas_fp8"]}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--shapes", type=_shape, nargs="+", default=[_shape(s) for s in DEFAULT_SHAPES],
                    help="MxNxK (default: %(default)s)")
    ap.add_argument("--algos", default=DEFAULT_ALGOS, help="lcmac schemes, comma-separated; gemm: the plain "
                    "fp8 GEMM; none: cuBLAS only; a scheme with CudaConfig knobs changed: "
                    "gemm+stages=6+block_n=256 (default %(default)s)")
    ap.add_argument("--rounds", type=int, default=7, help="interleaved rounds (default %(default)s)")
    ap.add_argument("--calls", type=int, default=10, help="calls per timed round (default %(default)s)")
    ap.add_argument("--quantize", choices=["compiled", "eager"], default="compiled",
                    help="how A's quantisation for cuBLAS runs (default %(default)s)")
    ap.add_argument("--jobs", type=int, default=4, help="builds in parallel (default %(default)s)")
    ap.add_argument("--build-s", type=float, default=3600.0,
                    help="no build starts after this many seconds (default %(default)s)")
    ap.add_argument("--artifacts", type=Path, help="keep (and reuse) the builds here (default: a temporary directory)")
    ap.add_argument("--build-only", action="store_true", help="build the kernels and stop (no GPU needed)")
    ap.add_argument("--sustained", type=float, metavar="S",
                    help="also time each variant over S seconds of back-to-back calls (power-capped clocks)")
    ap.add_argument("--list", action="store_true", help="print the builds and variants and stop (no GPU, "
                    "no compiler)")
    ap.add_argument("--out", help="results JSON (default bench/results/<gpu>-bfloat16-fp8-prefill.json)")
    args = ap.parse_args(argv)
    algos = [a.strip() for a in args.algos.split(",") if a.strip() and a.strip() != "none"]
    if args.build_only and not args.artifacts:
        ap.error("--build-only needs --artifacts (where the builds are kept)")
    if args.sustained is not None and not 0 < args.sustained <= 60:
        ap.error(f"--sustained takes seconds in (0, 60], got {args.sustained:g}")
    if args.list:
        print(json.dumps(plan(algos, args.shapes, args), indent=1))
        return 0
    import torch
    if not args.build_only:
        if not torch.cuda.is_available():
            print("bench_fp8: needs a CUDA GPU (torch.cuda.is_available() is False)", file=sys.stderr)
            return 2
        if torch.cuda.get_device_capability() != (9, 0):
            print(f"bench_fp8: the fp8 kernels and cuBLAS's blockwise recipe need sm_90 (H100/H200); "
                  f"this GPU is {torch.cuda.get_device_name()}", file=sys.stderr)
            return 2
    os.environ.setdefault("LCMAC_NVCC_JOBS", "2")
    with tempfile.TemporaryDirectory() as tmp:
        art = args.artifacts or Path(tmp)
        t0 = time.perf_counter()
        print(f"building {len(algos) * len(args.shapes)} kernels, {args.jobs} at a time, into {art}", flush=True)
        built = build_all(algos, args.shapes, art, args.jobs, args.build_s) if algos else {}
        print(f"builds done in {time.perf_counter() - t0:.0f} s", flush=True)
        for key, got in built.items():
            if not os.path.isfile(got):
                print(f"  {key[0]} {'x'.join(map(str, key[1]))}: {got}", flush=True)
        if args.build_only:
            return 0
        from lcmac.tune.measure import run_header
        device = torch.cuda.get_device_name(0)
        out = args.out or os.path.join(ROOT, "bench", "results", f"{device.lower().replace('nvidia ', '').replace(' ', '-')}"
                                                                 f"-bfloat16-fp8-prefill.json")
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        doc = {**run_header("fp8-prefill", device, __file__, argv), "torch": torch.__version__,
               "cuda": torch.version.cuda, "rounds": args.rounds, "calls": args.calls, "algorithms": algos,
               "results": [], "not_run": []}
        for shape in args.shapes:
            try:
                res, missing = bench_shape(shape, algos, built, args)
                doc["results"].append(res)
                doc["not_run"] += missing
            except torch.cuda.OutOfMemoryError as e:
                doc["not_run"].append({"shape": list(shape), "why": f"out of memory: {str(e)[:300]}"})
            torch.cuda.empty_cache()
            with open(out, "w") as fh:          # after every shape: a cut-off run keeps what it measured
                json.dump(doc, fh, indent=1)
    for m in doc["not_run"]:
        print(f"not run: {m}")
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
