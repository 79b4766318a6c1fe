"""Batches of small products on the GPU: lcmac's batched kernel against torch.bmm (cuBLAS
batched) and torch.matmul, in one run.

    python scripts/bench_batched.py --sizes 16 32 64 128 256 512 --batch 10000 \\
        --dtypes bfloat16 float32 --sustained 2 --out bench/results/h100-batched.json --plot

The grid behind ``algo="auto"``'s rule (``lcmac.policy.batched.choose_batched``):

    python scripts/bench_batched.py --sizes 8 16 24 32 48 64 --shapes 16x16x64 16x64x16 \
        64x16x16 16x16x256 32x32x512 17x19x300 --batch 100 1000 10000 100000 \
        --dtypes bfloat16 float16 float32 --variants '[{"policy": "splitk"}]' --auto \
        --out bench/results/h100-batched-auto.json

float64 (the small template at every size):

    python scripts/bench_batched.py --sizes 16 32 64 128 256 --batch 10000 --dtypes float64 \
        --rounds 5 --calls 10 --sustained 2 --out bench/results/h100-batched-float64.json --plot

Products wider than 128 (the production GEMM template) against the small template's 128×256
kernel and the persistent grid, each size with a batch of its own (``MxNxK@batch``):

    python scripts/bench_batched.py --sizes --shapes 256x256x256@20000 512x512x512@4000 \
        1024x1024x1024@1000 --variants '[{"batched_template": "small"}, {"persistent": true}]' \
        --sustained 2 --out bench/results/h100-batched-large.json

Per (dtype, shape M×N×K from --sizes n (n³) and --shapes, batch from --batch or the shape's
``@batch``): A [batch, M, K],
B [batch, K, N] random normal, C = A·B by
``lcmac.bmm(A, B, algo="gemm")`` (its kernel compiled once per (n, dtype) into the kernel
cache, the batch count a kernel argument), ``torch.bmm`` and ``torch.matmul``, timed with CUDA
events in interleaved rounds (median over the rounds and the spread: the burst figure) and,
with ``--sustained S``, S seconds back to back each (the sustained figure).  float32 is TF32
on both sides (lcmac's kernels multiply float32 as TF32; ``allow_tf32`` is set for torch when
float32 is among ``--dtypes``); float64 is float64 on both sides (fp64 tensor cores, float64
accumulators; its reference is the CPU's float64 product).
Effective TFLOP/s = 2·batch·n³ / time; the bandwidth column counts each product's A, B and C
once.  Each result is checked against a float64 product (relative Frobenius error, beside
torch.bmm's own, on the first 512 products).  ``model µs``: the clock-cycle model's prediction
(``lcmac.costmodel.small``) and what bounds it.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--sizes", type=int, nargs="*", default=[16, 32, 64, 128, 256, 512])
    ap.add_argument("--shapes", nargs="+", default=[], metavar="MxNxK[@batch]",
                    help="further shapes, each with --batch's counts or its own (@batch)")
    ap.add_argument("--batch", type=int, nargs="+", default=[10000], help="products per batch")
    ap.add_argument("--auto", action="store_true", help='also time lcmac.bmm(A, B) (algo="auto")')
    ap.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"],
                    choices=["bfloat16", "float16", "float32", "float64"])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=20, help="back-to-back calls per timed round")
    ap.add_argument("--sustained", type=float, default=0.0, metavar="S")
    ap.add_argument("--out", help="write the results as JSON here")
    ap.add_argument("--plot", action="store_true", help="with --out: a PNG beside the JSON")
    ap.add_argument("--jobs", type=int, default=8, help="kernels compiled at once before timing")
    ap.add_argument("--variants", type=json.loads, default=[], metavar="JSON",
                    help='further template options to time beside the default, e.g. '
                         '\'[{"products_per_cta": 8}]\' (named lcmac[key=value]); a variant '
                         'the template refuses for a shape is left out there')
    args = ap.parse_args(argv)
    own = dict(_shape(s) for s in args.shapes)           # shape → its own batch count, or None
    shapes = [(n, n, n) for n in args.sizes] + list(own)
    import torch

    import lcmac
    from lcmac.api.bmm import batched_kernel
    from lcmac.api.call_args import target_for
    from lcmac.costmodel.small import bmm_floor, predict_batched
    from lcmac.policy.batched import choose_batched
    from lcmac.schedules.cuda.batched_tiles import small_tile_defaults
    from lcmac.tune.measure import gpu_rounds
    if not torch.cuda.is_available():
        print("bench_batched: needs a CUDA GPU", file=sys.stderr)
        return 2
    # float32 is TF32 on both sides; the flag touches float32 alone (float64 stays float64)
    torch.backends.cuda.matmul.allow_tf32 = "float32" in args.dtypes
    name = torch.cuda.get_device_name()
    configs = [{}] + list(args.variants)
    built = _compile_all([(dtype, shp, c) for dtype in args.dtypes for shp in shapes for c in configs], args.jobs)
    print(f"# {name}, torch {torch.__version__}, batch {args.batch}")
    print(f"{'dtype':9s} {'M x N x K':>11s} {'batch':>6s} {'lcmac us':>9s} {'bmm us':>9s} {'matmul us':>9s} {'vs bmm':>7s} "
          f"{'lcmac TF/s':>10s} {'lcmac GB/s':>10s} {'model us':>9s} {'bound':8s} "
          + (f"{'sust. vs bmm':>12s} " if args.sustained else "") + f"{'err':>9s} {'bmm err':>9s}")
    results = []
    runs = [(d, s, b) for d in args.dtypes for s in shapes for b in ([own[s]] if own.get(s) else args.batch)]
    for dtype, (M, N, K), batch in runs:
            tdt = getattr(torch, dtype)
            n = max(M, N, K)
            g = torch.Generator(device="cuda").manual_seed(M * 10007 + N * 101 + K)
            gdt = torch.float64 if dtype == "float64" else torch.float32     # float64: all 53 bits
            A = torch.randn(batch, M, K, device="cuda", generator=g, dtype=gdt).to(tdt)
            B = (torch.randn(batch, K, N, device="cuda", generator=g, dtype=gdt) / K ** 0.5).to(tdt)
            C = torch.empty(batch, M, N, device="cuda", dtype=tdt)
            lcmac.bmm(A, B, algo="gemm", out=C)              # compile / load, first launch
            torch.cuda.synchronize()
            k = min(batch, 512)                          # the error on the first products
            # against float64 (float64 itself: on the CPU, another implementation than cuBLAS's)
            ref = (torch.bmm(A[:k].cpu(), B[:k].cpu()).cuda() if dtype == "float64"
                   else torch.bmm(A[:k].double(), B[:k].double()))
            rel = lambda X: ((X[:k].double() - ref).norm() / ref.norm()).item()  # noqa: E731
            err, err_bmm = rel(C), rel(torch.bmm(A, B))
            variant_err = {}
            variants = [("lcmac", lambda: lcmac.bmm(A, B, algo="gemm", out=C)),
                        ("torch.bmm", lambda: torch.bmm(A, B, out=C)),
                        ("torch.matmul", lambda: torch.matmul(A, B, out=C))]
            if args.auto:
                variants.append(("auto", lambda: lcmac.bmm(A, B, out=C)))
                auto_pick = choose_batched("cuda", dtype, M, N, K, batch,
                                           tf32=bool(torch.backends.cuda.matmul.allow_tf32))
            for cfg in args.variants:
                if (dtype, (M, N, K), json.dumps(cfg, sort_keys=True)) not in built:
                    continue
                fn = batched_kernel(target_for("cuda"), dtype, (M, N, K), cfg)
                label = "lcmac[" + ",".join(f"{k}={v}" for k, v in cfg.items()) + "]"
                variants.append((label, lambda fn=fn: fn(A, B, out=C)))
                fn(A, B, out=C)
                r_err = rel(C)
                variant_err[label] = r_err
                if r_err > 4 * err + 1e-6:
                    print(f"# {label} at {M}x{N}x{K}: error {r_err:.2e} (default {err:.2e})", flush=True)
            ref = None
            rounds, sustained = gpu_rounds(variants, args.rounds, args.calls, args.sustained)
            med = {k: statistics.median(v) for k, v in rounds.items()}
            spread = {k: [min(v), max(v)] for k, v in rounds.items()}
            flops = 2.0 * batch * M * N * K
            nbytes = float(batch) * (M * K + K * N + M * N) * A.element_size()
            tile = small_tile_defaults(M, N, K, dtype)
            est = predict_batched(M, N, K, dtype, batch, tile)
            r = {"dtype": dtype, "n": n, "shape": [M, N, K], "batch": batch, "tile": tile, "seconds": med,
                 "spread_s": spread, "vs_bmm": med["torch.bmm"] / med["lcmac"],
                 "vs_matmul": med["torch.matmul"] / med["lcmac"],
                 "variants_vs_bmm": {k: med["torch.bmm"] / t for k, t in med.items() if k.startswith("lcmac[")},
                 "tflops": {k: flops / t / 1e12 for k, t in med.items()},
                 "gbps": {k: nbytes / t / 1e9 for k, t in med.items()},
                 "model_s": est.t, "model_bound": est.bound, "model_bmm_s": bmm_floor(M, N, K, dtype, batch),
                 "rel_error": err, "rel_error_bmm": err_bmm, "rel_error_variants": variant_err}
            if args.auto:
                r["auto_pick"] = auto_pick
                r["auto_vs_bmm"] = med["torch.bmm"] / med["auto"]
            line = (f"{dtype:9s} {M:3d}x{N:3d}x{K:3d} {batch:6d} {med['lcmac'] * 1e6:9.1f} {med['torch.bmm'] * 1e6:9.1f} "
                    f"{med['torch.matmul'] * 1e6:9.1f} {r['vs_bmm']:6.3f}x {r['tflops']['lcmac']:10.1f} "
                    f"{r['gbps']['lcmac']:10.0f} {est.t * 1e6:9.1f} {est.bound:8s} ")
            if args.sustained:
                r["sustained_s"] = sustained
                r["sustained_vs_bmm"] = sustained["torch.bmm"] / sustained["lcmac"]
                line += f"{r['sustained_vs_bmm']:11.3f}x "
            if args.auto:
                line += f"auto {r['auto_vs_bmm']:.3f}x ({'torch.bmm' if auto_pick is None else 'lcmac'}) "
            print(line + f"{err:9.2e} {err_bmm:9.2e}", flush=True)
            for label in med:
                if label.startswith("lcmac["):
                    print(f"{'':14s} {label}: {med[label] * 1e6:9.1f} us, "
                          f"{med['torch.bmm'] / med[label]:.3f}x torch.bmm", flush=True)
            results.append(r)
            if args.out:                                     # as it goes: a cut-off run keeps its rows
                _write(args, argv, name, results)
            A = B = C = ref = None                           # free before the next size
            torch.cuda.empty_cache()
    if args.out:
        _write(args, argv, name, results)
        print(f"wrote {args.out}")
        if args.plot:
            _plot([r for r in results if r["shape"][0] == r["shape"][1] == r["shape"][2]],
                  args.out.rsplit(".", 1)[0] + ".png", name)
    return 0


def _write(args, argv, device: str, results: list) -> None:
    import torch

    from lcmac.tune.measure import run_header
    doc = {**run_header("batched small products: lcmac.bmm (algo='gemm') vs torch.bmm and torch.matmul",
                        device, __file__, argv),
           "torch": torch.__version__, "allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
           "rounds": args.rounds, "calls": args.calls, "sustained_s": args.sustained,
           "results": results}
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)


def _shape(text: str) -> tuple:
    """``MxNxK`` or ``MxNxK@batch`` → ((M, N, K), batch or None)."""
    dims, _, batch = text.lower().partition("@")
    try:
        M, N, K = (int(x) for x in dims.split("x"))
        return (M, N, K), int(batch) if batch else None
    except ValueError:
        raise SystemExit(f"--shapes takes MxNxK or MxNxK@batch (positive integers), not {text!r}")


def _compile_all(cases, jobs: int) -> set:
    """Every (dtype, shape, config) kernel into the kernel cache first, ``jobs`` compiles at a
    time (each in its own worker process), so that no compile runs between timings.  Returns
    the cases built; a variant the template refuses for a shape (a ``splitk`` tile for a
    product wider than 32) is reported and left out."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    from lcmac.api.bmm import batched_kernel
    from lcmac.api.call_args import target_for
    from lcmac.core.errors import LcmacError
    t0 = time.perf_counter()

    def one(c):
        try:
            batched_kernel(target_for("cuda"), c[0], c[1], c[2])
            return (c[0], c[1], json.dumps(c[2], sort_keys=True))
        except LcmacError as e:
            if not c[2]:
                raise
            print(f"# left out {c[2]} at {c[1]} {c[0]}: {str(e).splitlines()[0][:160]}", flush=True)
            return None

    with ThreadPoolExecutor(max(1, jobs)) as pool:
        built = {b for b in pool.map(one, cases) if b is not None}
    print(f"# {len(built)} kernels ready in {time.perf_counter() - t0:.0f} s", flush=True)
    return built


def _plot(results, path, device):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    for dtype, batch in sorted({(r["dtype"], r["batch"]) for r in results}):
        rs = [r for r in results if r["dtype"] == dtype and r["batch"] == batch]
        ax.plot([r["n"] for r in rs], [r["vs_bmm"] for r in rs], "-o", label=f"{dtype}, batch {batch}")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("n (products of n×n by n×n)")
    ax.set_ylabel("torch.bmm time / lcmac time")
    ax.set_title(f"lcmac's batched kernel against torch.bmm (n³), {device}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


if __name__ == "__main__":
    sys.exit(main())
