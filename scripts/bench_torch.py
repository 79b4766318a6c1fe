"""lcmac inside PyTorch against torch on the GPU, in one run: ``torch.matmul`` (cuBLAS) and
``torch.nn.functional.linear`` as the baselines, ``lcmac.matmul`` (A and B both new) and
``lcmac.nn.Linear`` (the weight prepared once) with each algorithm asked for.

    python scripts/bench_torch.py --sizes 8192 16384 --algos strassen winograd^2 --sustained 2 \\
        --out bench/results/h100-torch-bf16.json

Per size (M = N = K, or --shape MxNxK for one shape) every variant is timed in interleaved
rounds (CUDA events around ``--calls`` back-to-back calls; median and spread over the
rounds): the burst figure.  With ``--sustained S`` each variant then also runs back to back
for S seconds and its mean over that window is the sustained figure (the GPU at its power
cap).  Effective TFLOP/s = 2·M·N·K / time; "vs torch" = torch.matmul's time / this one.
Each result is compared with torch.matmul's on a band of rows (relative difference printed).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys

#: rows of C compared with torch.matmul in float64 (the whole product would not fit beside the
#: operands at 32768²)
CHECK_ROWS = 1024


def variants(M: int, N: int, K: int, algos, dtype):
    """(name, call, result) per variant; the lcmac ones compile on first use (kernel cache)."""
    import torch
    import torch.nn.functional as F

    import lcmac
    from lcmac.torch.nn import Linear
    g = torch.Generator(device="cuda").manual_seed(0)
    A = torch.randn(M, K, device="cuda", dtype=dtype, generator=g)
    W = torch.randn(N, K, device="cuda", dtype=dtype, generator=g) / K ** 0.5   # nn.Linear's weight
    Wt = W.t().contiguous()
    out = [("torch.matmul", lambda: A @ Wt), ("F.linear", lambda: F.linear(A, W))]
    for algo in algos:
        lin = Linear(K, N, bias=False, device="cuda", dtype=dtype, algo=algo)
        with torch.no_grad():
            lin.weight.copy_(W)
        out.append((f"lcmac.matmul[{algo}]", lambda algo=algo: lcmac.matmul(A, Wt, algo=algo)))
        out.append((f"lcmac.nn.Linear[{algo}]", lambda lin=lin: lin(A)))
    return out


def bench_shape(M, N, K, args, dtype) -> dict:
    import torch

    from lcmac.api.matmul import release_kernels
    from lcmac.tune.measure import gpu_rounds
    with torch.no_grad():
        vs = variants(M, N, K, args.algos, dtype)
        band = slice(0, min(M, CHECK_ROWS))       # checked on a band of rows: float64 is big
        ref = vs[0][1]()[band].double()
        diff = {}
        for name, fn in vs:                      # first calls: compile, prepare, check
            C = fn()[band].double()
            diff[name] = ((C - ref).norm() / ref.norm()).item()
        del C, ref
        torch.cuda.synchronize()
        rounds, sustained = gpu_rounds(vs, args.rounds, args.calls, args.sustained)
    del vs
    release_kernels()                              # this shape's workspaces and prepared weights
    torch.cuda.empty_cache()
    flops = 2.0 * M * N * K
    base = statistics.median(rounds["torch.matmul"])
    base_s = sustained.get("torch.matmul")
    rows = {}
    print(f"\n{M}x{N}x{K} {args.dtype}  (burst: median of {args.rounds} rounds x {args.calls} calls"
          + (f"; sustained: {args.sustained:g} s each)" if args.sustained else ")"))
    print(f"  {'variant':32s} {'ms':>8s} {'spread':>7s} {'TFLOP/s':>8s} {'vs torch':>8s}"
          + (f" {'sust. ms':>9s} {'vs torch':>8s}" if args.sustained else "") + f" {'rel.diff':>9s}")
    for name, ts in rounds.items():
        med = statistics.median(ts)
        r = {"median_s": med, "seconds": ts, "spread": (max(ts) - min(ts)) / med,
             "tflops": flops / med / 1e12, "vs_torch_matmul": base / med, "rel_diff": diff[name]}
        line = (f"  {name:32s} {med * 1e3:8.3f} {r['spread'] * 100:6.1f}% {r['tflops']:8.1f} "
                f"{r['vs_torch_matmul']:7.3f}x")
        if args.sustained:
            r["sustained_s"] = sustained[name]
            r["sustained_vs_torch_matmul"] = base_s / sustained[name]
            line += f" {sustained[name] * 1e3:9.3f} {r['sustained_vs_torch_matmul']:7.3f}x"
        rows[name] = r
        print(line + f" {diff[name]:9.2e}")
    return {"M": M, "N": N, "K": K, "variants": rows}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--sizes", type=int, nargs="*", default=[8192, 16384], help="square sizes M = N = K")
    ap.add_argument("--shape", action="append", default=[], metavar="MxNxK",
                    help="a shape (C = A·B with A MxK; repeatable), besides --sizes")
    ap.add_argument("--algos", nargs="+", default=["strassen", "strassen^2"],
                    help="lcmac algorithms to time (catalogue names or expressions, or auto)")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--rounds", type=int, default=7, help="interleaved rounds (burst figure)")
    ap.add_argument("--calls", type=int, default=10, help="calls per timed round")
    ap.add_argument("--sustained", type=float, default=0.0, metavar="S",
                    help="also time each variant back to back for S seconds (>= 2 for the power cap)")
    ap.add_argument("--out", help="write the results as JSON here")
    args = ap.parse_args(argv)
    import torch

    from lcmac.core.shapes import parse_shape
    if not torch.cuda.is_available():
        print("bench_torch: needs a CUDA GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    dtype = getattr(torch, args.dtype)
    shapes = [(s, s, s) for s in args.sizes] + [parse_shape(s) for s in args.shape]
    props = torch.cuda.get_device_properties(0)
    print(f"# {props.name}, torch {torch.__version__}")
    results = [bench_shape(M, N, K, args, dtype) for M, N, K in shapes]
    if args.out:
        from lcmac.tune.measure import run_header
        doc = {**run_header("lcmac in PyTorch vs torch.matmul / F.linear", props.name, __file__, argv),
               "dtype": args.dtype, "torch": torch.__version__, "results": results}
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)
        print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
