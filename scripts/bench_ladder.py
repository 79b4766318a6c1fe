"""The GEMM optimisation ladder on the GPU: each step (``config={"ladder": k}``, k = 1..7;
``lcmac.schedules.cuda.ladder``, docs/ladder.md) built through the kernel cache, checked
against a float64 product and timed beside torch.matmul (cuBLAS), in one run.

    python scripts/bench_ladder.py --out bench/results/ladder --plot
    python scripts/bench_ladder.py --dtype float32 --out bench/results/ladder --plot

The steps are compiled in parallel (one TileLang worker process each, ``--jobs``); a step
already in the kernel cache loads at once.  Every result is compared in full with a float64
product on the GPU (relative Frobenius error).  Timing: interleaved rounds (the variants take
turns within a round; CUDA events), each variant running back to back for about
``--round-s`` seconds per round (one call at least: the naive step takes about a second at
4096³), median and spread over ``--rounds`` rounds: the burst figure; then each variant back
to back for ``--sustained`` seconds (the clocks at the power cap): the sustained figure.
TFLOP/s = 2·M·N·K / time.  For float32, steps 1–5 (CUDA-core FP32) are compared with cuBLAS
FP32 and steps 6–7 (TF32 tensor cores) with cuBLAS TF32; both are timed.

``--out DIR`` writes ``ladder-<dtype>-<M>x<N>x<K>.json`` (device, date, command, per step:
TFLOP/s, ratio to the previous step and to cuBLAS, the kernel's launch shape, shared memory
and registers); ``--plot`` a bar chart beside it (``.png``).
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import statistics
import sys
import time
from pathlib import Path

#: what each step is (the template's names are in lcmac.schedules.cuda.ladder, which imports
#: TileLang; this process must not)
STEPS = {1: "naive", 2: "shared-memory tiling", 3: "register tiling", 4: "vectorised loads",
         5: "double buffering", 6: "tensor cores (mma)", 7: "async pipelined tensor cores"}
#: relative error above which a result is wrong: 2-byte outputs round at 2^-8; float32 on the
#: CUDA cores is exact to ~1e-6, on the TF32 tensor cores (steps 6–7) to ~1e-3
TOLERANCE = {"bfloat16": 2e-2, "float16": 2e-2, "float32": 1e-4, "tf32": 1e-2}


def build_steps(steps, target: str, dtype: str, shape, jobs: int, cache_dir) -> dict:
    """{step: (CacheHit, seconds)}: every step through the kernel cache, ``jobs`` at a time
    (each build is a compiler worker process of its own)."""
    from lcmac.artifact.cache import cached_build

    def one(k):
        t0 = time.perf_counter()
        hit = cached_build("gemm", target, dtype, shape, config={"ladder": k}, cache_dir=cache_dir)
        return hit, time.perf_counter() - t0

    t0 = time.perf_counter()
    with cf.ThreadPoolExecutor(max_workers=max(1, jobs)) as ex:
        futures = {k: ex.submit(one, k) for k in steps}
        built = {}
        for k, fut in futures.items():
            built[k] = fut.result()
            hit, s = built[k]
            print(f"  step {k} {STEPS[k]:30s} {'compiled' if hit.compiled else 'cached':8s} {s:6.1f} s",
                  flush=True)
    print(f"  {len(built)} builds, {jobs} at a time: {time.perf_counter() - t0:.1f} s", flush=True)
    return built


def kernel_facts(fn) -> dict:
    """Launch shape, shared memory and registers per thread of the artifact's one kernel."""
    extra = fn.manifest.extra or {}
    k = (extra.get("kernels") or [{}])[0]
    regs = [r for v in (extra.get("ptxas") or {}).values() for r in v.get("registers", [])]
    spills = [s for v in (extra.get("ptxas") or {}).values() for s in v.get("spill_stores", [])]
    return {"grid": k.get("grid"), "block": k.get("block"), "smem_bytes": k.get("smem_bytes"),
            "registers": max(regs) if regs else None, "spill_stores": sum(spills)}


def repeated(fn, n: int):
    """``fn`` called ``n`` times back to back (one timed "call" of a round)."""
    def run():
        for _ in range(n):
            fn()
    return run


def calls_per_round(fn, round_s: float) -> int:
    """Back-to-back calls of ``fn`` that last about ``round_s`` seconds (at least one)."""
    import torch
    from lcmac.tune.measure import gpu_timer
    fn()
    torch.cuda.synchronize()
    t = gpu_timer()(fn, 1)
    return max(1, min(1000, round(round_s / max(t, 1e-7))))


def rel_error(C, ref) -> float:
    return ((C.double() - ref).norm() / ref.norm()).item()


def measure(variants: dict, args) -> dict:
    """{name: {"burst": ..., "sustained": ...}} for {name: fn}: interleaved rounds, then
    the sustained run of each (``lcmac.tune.measure.gpu_rounds``)."""
    from lcmac.tune.measure import gpu_rounds
    reps = {name: calls_per_round(fn, args.round_s) for name, fn in variants.items()}
    timed = [(name, repeated(fn, reps[name])) for name, fn in variants.items()]
    gpu_rounds(timed, 1, 1)                  # one untimed round: clocks up, libraries loaded
    rounds, sustained = gpu_rounds(timed, args.rounds, 1, args.sustained)
    out = {}
    for name, ts in rounds.items():
        per_call = [t / reps[name] for t in ts]
        med = statistics.median(per_call)
        r = {"burst": {"median_s": med, "seconds": per_call, "spread": (max(per_call) - min(per_call)) / med,
                       "calls_per_round": reps[name]}}
        if sustained:
            r["sustained"] = {"seconds_per_call": sustained[name] / reps[name]}
        out[name] = r
    return out


def summarise(steps, built, timings, errors, flops, dtype) -> tuple[list, dict]:
    """The per-step rows (TFLOP/s, × previous, × cuBLAS) and the cuBLAS rows; ``built``:
    {step: (CacheHit, build seconds, loaded function)}."""
    def tflops(t):
        return flops / t / 1e12

    cublas = {}
    for name in ("cuBLAS", "cuBLAS TF32"):
        if name in timings:
            t = timings[name]
            cublas[name] = {"tflops": tflops(t["burst"]["median_s"]), "spread": t["burst"]["spread"],
                            "burst": t["burst"], "rel_error_vs_float64": errors[name]}
            if "sustained" in t:
                cublas[name]["sustained_tflops"] = tflops(t["sustained"]["seconds_per_call"])
    rows, prev = [], None
    for k in steps:
        hit, build_s, fn = built[k]
        t = timings[f"step {k}"]
        base = "cuBLAS TF32" if (dtype == "float32" and k >= 6) else "cuBLAS"
        row = {"step": k, "name": STEPS[k], "tflops": tflops(t["burst"]["median_s"]),
               "spread": t["burst"]["spread"], "burst": t["burst"],
               "vs_previous": None, "vs_cublas": None, "compared_with": base,
               "rel_error_vs_float64": errors[f"step {k}"],
               "compiled": hit.compiled, "build_s": round(build_s, 1),
               "kernel": kernel_facts(fn)}
        if "sustained" in t:
            row["sustained_tflops"] = tflops(t["sustained"]["seconds_per_call"])
        if prev is not None:
            row["vs_previous"] = row["tflops"] / prev["tflops"]
        if base in cublas:
            row["vs_cublas"] = row["tflops"] / cublas[base]["tflops"]
            if "sustained_tflops" in row and "sustained_tflops" in cublas[base]:
                row["sustained_vs_cublas"] = row["sustained_tflops"] / cublas[base]["sustained_tflops"]
        rows.append(row)
        prev = row
    return rows, cublas


def print_table(rows, cublas, dtype) -> None:
    sus = any("sustained_tflops" in r for r in rows)
    print(f"\n  {'step':34s} {'TFLOP/s':>8s} {'spread':>7s} {'x prev':>7s} {'x cuBLAS':>8s}"
          + (f" {'sust.':>7s} {'x cuBLAS':>8s}" if sus else "") + f" {'rel.err':>9s}  {'regs':>4s} {'smem KB':>7s}")
    for r in rows:
        kf = r["kernel"] or {}
        prev = f"{r['vs_previous']:6.2f}x" if r["vs_previous"] else f"{'-':>7s}"
        line = (f"  {r['step']} {r['name']:32s} {r['tflops']:8.2f} {r['spread'] * 100:6.1f}% "
                f"{prev} {(r['vs_cublas'] or 0):7.3f}x")
        if sus:
            line += f" {r.get('sustained_tflops', 0):7.2f} {r.get('sustained_vs_cublas', 0):7.3f}x"
        ok = "" if r["rel_error_vs_float64"] <= _tolerance(dtype, r["step"]) else "  WRONG"
        print(line + f" {r['rel_error_vs_float64']:9.2e}  {kf.get('registers') or '?':>4} "
                     f"{(kf.get('smem_bytes') or 0) / 1024:7.1f}{ok}")
    for name, c in cublas.items():
        line = f"  - {name:32s} {c['tflops']:8.2f} {c['spread'] * 100:6.1f}% {'':7s} {1:7.3f}x"
        if sus:
            line += f" {c.get('sustained_tflops', 0):7.2f} {1:7.3f}x"
        print(line + f" {c['rel_error_vs_float64']:9.2e}")


def _tolerance(dtype: str, step: int) -> float:
    return TOLERANCE["tf32" if (dtype == "float32" and step >= 6) else dtype]


def plot(doc: dict, path: Path) -> None:
    """Bars of TFLOP/s per step (log scale: the steps span three orders of magnitude), the
    burst figure with its spread, cuBLAS as dashed lines."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = doc["steps"]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    xs = list(range(len(rows)))
    ys = [r["tflops"] for r in rows]
    colors = ["#4c72b0" if r["step"] <= 5 else "#dd8452" for r in rows]
    ax.bar(xs, ys, color=colors)
    for x, r in zip(xs, rows):
        ax.annotate(f"{r['tflops']:.3g}", (x, r["tflops"]), ha="center", va="bottom", fontsize=8)
    for (name, c), style in zip(doc["cublas"].items(), ("--", ":")):
        ax.axhline(c["tflops"], color="k", ls=style, lw=1, label=f"{name} {c['tflops']:.0f} TFLOP/s")
    ax.set_yscale("log")
    ax.set_xticks(xs)
    ax.set_xticklabels([f"{r['step']} {r['name']}" for r in rows], rotation=25, ha="right", fontsize=8)
    ax.set_ylabel("TFLOP/s (2MNK / t, median of rounds)")
    M, N, K = doc["shape"]
    ax.set_title(f"GEMM ladder, {doc['device']}, {doc['dtype']} {M}x{N}x{K} "
                 f"(blue: CUDA cores, orange: tensor cores)", fontsize=9)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run(args, argv) -> int:
    import torch

    import lcmac
    from lcmac.core.shapes import parse_shape
    if not torch.cuda.is_available():
        print("bench_ladder: needs a CUDA GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    M, N, K = parse_shape(args.shape)
    steps = sorted(set(args.steps))
    props = torch.cuda.get_device_properties(0)
    print(f"# {props.name}, torch {torch.__version__}, {args.dtype} {M}x{N}x{K}, steps {steps}", flush=True)
    built = build_steps(steps, args.target, args.dtype, (M, N, K), args.jobs, args.cache_dir)
    built = {k: (hit, s, lcmac.load(hit)) for k, (hit, s) in built.items()}

    dtype = getattr(torch, args.dtype)
    g = torch.Generator(device="cuda").manual_seed(0)
    A = torch.randn(M, K, device="cuda", dtype=dtype, generator=g)
    B = torch.randn(K, N, device="cuda", dtype=dtype, generator=g) / K ** 0.5
    C = torch.empty(M, N, device="cuda", dtype=dtype)
    ref = A.double() @ B.double()

    def cublas(tf32: bool):
        def call():
            torch.backends.cuda.matmul.allow_tf32 = tf32
            torch.matmul(A, B, out=C)
        return call

    variants = {f"step {k}": (lambda f=f: f(A, B, out=C)) for k, (_, _, f) in built.items()}
    variants["cuBLAS"] = cublas(False)
    if args.dtype == "float32" and any(k >= 6 for k in steps):
        variants["cuBLAS TF32"] = cublas(True)
    errors = {}
    with torch.no_grad():
        for name, fn in variants.items():
            C.fill_(float("nan"))            # every element must be written
            fn()
            errors[name] = rel_error(C, ref)
        del ref
        torch.cuda.synchronize()
        print("  timing ...", flush=True)
        timings = measure(variants, args)
    torch.backends.cuda.matmul.allow_tf32 = False
    rows, cub = summarise(steps, built, timings, errors, 2.0 * M * N * K, args.dtype)
    print_table(rows, cub, args.dtype)
    wrong = [r["step"] for r in rows if r["rel_error_vs_float64"] > _tolerance(args.dtype, r["step"])]
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        from lcmac.tune.measure import run_header
        doc = {**run_header("GEMM optimisation ladder (lcmac config ladder=1..7) vs torch.matmul (cuBLAS)",
                            props.name, __file__, argv),
               "dtype": args.dtype, "shape": [M, N, K], "target": args.target, "torch": torch.__version__,
               "timing": {"rounds": args.rounds, "round_s": args.round_s, "sustained_s": args.sustained},
               "steps": rows, "cublas": cub, "wrong": wrong}
        path = out / f"ladder-{args.dtype}-{M}x{N}x{K}.json"
        path.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"\nwrote {path}")
        if args.plot:
            png = path.with_suffix(".png")
            plot(doc, png)
            print(f"wrote {png}")
    if wrong:
        print(f"bench_ladder: steps {wrong} are wrong (relative error above tolerance)", file=sys.stderr)
        return 1
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--shape", default="4096x4096x4096", help="MxNxK (default %(default)s)")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--steps", type=int, nargs="+", default=list(STEPS), choices=list(STEPS),
                    help="ladder steps to run (default: all)")
    ap.add_argument("--target", default="cuda-sm90a", help="lcmac CUDA target (default %(default)s)")
    ap.add_argument("--jobs", type=int, default=min(len(STEPS), os.cpu_count() or 1),
                    help="builds at once (default: one per step, up to the cores)")
    ap.add_argument("--cache-dir", default=None, help="kernel cache root (default: lcmac's)")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved timed rounds (default %(default)s)")
    ap.add_argument("--round-s", type=float, default=0.1,
                    help="seconds each variant runs per round, one call at least (default %(default)s)")
    ap.add_argument("--sustained", type=float, default=2.0, metavar="S",
                    help="then each variant back to back for S seconds; 0: off (default %(default)s)")
    ap.add_argument("--out", help="directory for the JSON (and with --plot the PNG)")
    ap.add_argument("--plot", action="store_true", help="also write a bar chart (needs matplotlib)")
    args = ap.parse_args(argv)
    if args.plot and not args.out:
        ap.error("--plot writes beside the JSON: give --out DIR")
    return run(args, argv)


if __name__ == "__main__":
    sys.exit(main())
