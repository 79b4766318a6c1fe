"""Batches of small products on the GPU: lcmac's batched kernel against torch.bmm (cuBLAS
batched) and torch.matmul, in one run.

    python scripts/bench_batched.py --sizes 16 32 64 128 256 512 --batch 10000 \\
        --dtypes bfloat16 float32 --sustained 2 --out bench/results/h100-batched.json --plot

Per (dtype, size n, batch): A [batch, n, n], B [batch, n, n] random normal, C = A·B by
``lcmac.bmm(A, B, algo="gemm")`` (its kernel compiled once per (n, dtype) into the kernel
cache, the batch count a kernel argument), ``torch.bmm`` and ``torch.matmul``, timed with CUDA
events in interleaved rounds (median over the rounds and the spread: the burst figure) and,
with ``--sustained S``, S seconds back to back each (the sustained figure).  float32 is TF32
on both sides (lcmac's kernels multiply float32 as TF32; ``allow_tf32`` is set for torch).
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
    ap.add_argument("--sizes", type=int, nargs="+", default=[16, 32, 64, 128, 256, 512])
    ap.add_argument("--batch", type=int, default=10000, help="products per batch")
    ap.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"],
                    choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=20, help="back-to-back calls per timed round")
    ap.add_argument("--sustained", type=float, default=0.0, metavar="S")
    ap.add_argument("--out", help="write the results as JSON here")
    ap.add_argument("--plot", action="store_true", help="with --out: a PNG beside the JSON")
    ap.add_argument("--jobs", type=int, default=8, help="kernels compiled at once before timing")
    ap.add_argument("--variants", type=json.loads, default=[], metavar="JSON",
                    help='further template options to time beside the default, e.g. '
                         '\'[{"products_per_cta": 8}]\' (named lcmac[key=value])')
    args = ap.parse_args(argv)
    import torch

    import lcmac
    from lcmac.batched import batched_kernel
    from lcmac.call_args import target_for
    from lcmac.costmodel.small import predict_batched
    from lcmac.schedules.cuda.config import small_tile_defaults
    from lcmac.tune.measure import gpu_rounds
    if not torch.cuda.is_available():
        print("bench_batched: needs a CUDA GPU", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = True
    name = torch.cuda.get_device_name()
    configs = [{}] + list(args.variants)
    _compile_all([(dtype, n, c) for dtype in args.dtypes for n in args.sizes for c in configs], args.jobs)
    print(f"# {name}, torch {torch.__version__}, batch {args.batch}")
    print(f"{'dtype':9s} {'n':>4s} {'lcmac us':>9s} {'bmm us':>9s} {'matmul us':>9s} {'vs bmm':>7s} "
          f"{'lcmac TF/s':>10s} {'lcmac GB/s':>10s} {'model us':>9s} {'bound':8s} "
          + (f"{'sust. vs bmm':>12s} " if args.sustained else "") + f"{'err':>9s} {'bmm err':>9s}")
    results = []
    for dtype in args.dtypes:
        tdt = getattr(torch, dtype)
        for n in args.sizes:
            g = torch.Generator(device="cuda").manual_seed(n)
            A = torch.randn(args.batch, n, n, device="cuda", generator=g).to(tdt)
            B = (torch.randn(args.batch, n, n, device="cuda", generator=g) / n ** 0.5).to(tdt)
            C = torch.empty(args.batch, n, n, device="cuda", dtype=tdt)
            lcmac.bmm(A, B, algo="gemm", out=C)              # compile / load, first launch
            torch.cuda.synchronize()
            k = min(args.batch, 512)                          # the error on the first products
            ref = torch.bmm(A[:k].double(), B[:k].double())
            rel = lambda X: ((X[:k].double() - ref).norm() / ref.norm()).item()  # noqa: E731
            err, err_bmm = rel(C), rel(torch.bmm(A, B))
            variants = [("lcmac", lambda: lcmac.bmm(A, B, algo="gemm", out=C)),
                        ("torch.bmm", lambda: torch.bmm(A, B, out=C)),
                        ("torch.matmul", lambda: torch.matmul(A, B, out=C))]
            for cfg in args.variants:
                fn = batched_kernel(target_for("cuda"), dtype, (n, n, n), cfg)
                label = "lcmac[" + ",".join(f"{k}={v}" for k, v in cfg.items()) + "]"
                variants.append((label, lambda fn=fn: fn(A, B, out=C)))
                fn(A, B, out=C)
                r_err = rel(C)
                if r_err > 4 * err + 1e-6:
                    print(f"# {label} at n={n}: error {r_err:.2e} (default {err:.2e})", flush=True)
            ref = None
            rounds, sustained = gpu_rounds(variants, args.rounds, args.calls, args.sustained)
            med = {k: statistics.median(v) for k, v in rounds.items()}
            spread = {k: [min(v), max(v)] for k, v in rounds.items()}
            flops = 2.0 * args.batch * n ** 3
            nbytes = 3.0 * args.batch * n * n * A.element_size()
            tile = small_tile_defaults(n, n, n, dtype)
            est = predict_batched(n, n, n, dtype, args.batch, tile)
            r = {"dtype": dtype, "n": n, "batch": args.batch, "tile": tile, "seconds": med,
                 "spread_s": spread, "vs_bmm": med["torch.bmm"] / med["lcmac"],
                 "vs_matmul": med["torch.matmul"] / med["lcmac"],
                 "tflops": {k: flops / t / 1e12 for k, t in med.items()},
                 "gbps": {k: nbytes / t / 1e9 for k, t in med.items()},
                 "model_s": est.t, "model_bound": est.bound, "rel_error": err, "rel_error_bmm": err_bmm}
            line = (f"{dtype:9s} {n:4d} {med['lcmac'] * 1e6:9.1f} {med['torch.bmm'] * 1e6:9.1f} "
                    f"{med['torch.matmul'] * 1e6:9.1f} {r['vs_bmm']:6.3f}x {r['tflops']['lcmac']:10.1f} "
                    f"{r['gbps']['lcmac']:10.0f} {est.t * 1e6:9.1f} {est.bound:8s} ")
            if args.sustained:
                r["sustained_s"] = sustained
                r["sustained_vs_bmm"] = sustained["torch.bmm"] / sustained["lcmac"]
                line += f"{r['sustained_vs_bmm']:11.3f}x "
            print(line + f"{err:9.2e} {err_bmm:9.2e}", flush=True)
            for label in med:
                if label.startswith("lcmac["):
                    print(f"{'':14s} {label}: {med[label] * 1e6:9.1f} us, "
                          f"{med['torch.bmm'] / med[label]:.3f}x torch.bmm", flush=True)
            results.append(r)
            A = B = C = ref = None                           # free before the next size
            torch.cuda.empty_cache()
    if args.out:
        from lcmac.tune.measure import run_header
        doc = {**run_header("batched small products: lcmac.bmm (algo='gemm') vs torch.bmm and torch.matmul",
                            name, __file__, argv),
               "torch": torch.__version__,
               "rounds": args.rounds, "calls": args.calls, "sustained_s": args.sustained,
               "results": results}
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)
        print(f"wrote {args.out}")
        if args.plot:
            _plot(results, args.out.rsplit(".", 1)[0] + ".png", name, args.batch)
    return 0


def _compile_all(cases, jobs: int) -> None:
    """Every (dtype, n) kernel into the kernel cache first, ``jobs`` compiles at a time (each
    in its own worker process), so that no compile runs between timings."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    from lcmac.batched import batched_kernel
    from lcmac.call_args import target_for
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max(1, jobs)) as pool:
        list(pool.map(lambda c: batched_kernel(target_for("cuda"), c[0], (c[1],) * 3, c[2]), cases))
    print(f"# {len(cases)} kernels ready in {time.perf_counter() - t0:.0f} s", flush=True)


def _plot(results, path, device, batch):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    for dtype in sorted({r["dtype"] for r in results}):
        rs = [r for r in results if r["dtype"] == dtype]
        ns = [r["n"] for r in rs]
        for who, style in (("lcmac", "-o"), ("torch.bmm", "--s")):
            ax.plot(ns, [r["tflops"][who] for r in rs], style, label=f"{who} {dtype}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("n (products of n×n by n×n)")
    ax.set_ylabel("effective TFLOP/s")
    ax.set_title(f"{batch} products per batch, {device}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


if __name__ == "__main__":
    sys.exit(main())
