"""Does fusing the combines into their neighbours pay?  A decoder's projection
``y = residual + linear(rmsnorm(x))`` under ``torch.compile`` on the GPU, in one run:

    torch        residual + F.linear(rmsnorm(x), W)                 (cuBLAS)
    op[ALGO]     residual + torch.ops.lcmac.linear(rmsnorm(x), W)   (lcmac's kernel, W prepared once)
    graph[ALGO]  residual + combine_h(bmm(combine_a(rmsnorm(x)), B̃))  (lcmac.torch.graph_stages:
                 Inductor fuses Combine A into the norm and Combine H into the add; B̃ once)

    python scripts/bench_graph_stages.py --tokens 8192 32768 --algos strassen strassen^2 \\
        --sustained 2 --out bench/results/h100-graph-stages-bf16.json

Per (tokens, layer shape) every variant is timed in interleaved rounds (CUDA events around
``--calls`` calls; median and spread): the burst figure; with ``--sustained S`` each also runs
S seconds back to back (the GPU at its power cap).  "vs torch" = torch's time / this one.
Each result's relative error against a float64 reference on the first rows is printed.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys

#: Llama-70B-class projections (N, K): attention output, MLP up, MLP down
LAYERS = {"o_proj": (8192, 8192), "up_proj": (28672, 8192), "down_proj": (8192, 28672)}
CHECK_ROWS = 512
EPS = 1e-5


def rmsnorm(x, w):
    import torch
    v = x.float()
    return (v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + EPS)).to(x.dtype) * w


def variants(T: int, N: int, K: int, algos, op_algos, dtype):
    import torch
    import torch.nn.functional as F

    from lcmac.torch import graph_stages as gs
    from lcmac.api import matmul as ops
    from lcmac.artifact.build import resolve_algorithm
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(T, K, device="cuda", dtype=dtype, generator=g)
    res = torch.randn(T, N, device="cuda", dtype=dtype, generator=g)
    nw = 1 + 0.1 * torch.randn(K, device="cuda", dtype=dtype, generator=g)
    W = torch.randn(N, K, device="cuda", dtype=dtype, generator=g) / K ** 0.5
    ops.register()
    out = [("torch", torch.compile(lambda: res + F.linear(rmsnorm(x, nw), W)))]
    for a in op_algos:
        out.append((f"op[{a}]", torch.compile(
            lambda a=a: res + torch.ops.lcmac.linear(rmsnorm(x, nw), W, a, None))))
    for a in algos:
        alg = resolve_algorithm(a)[0]
        if not gs.fits(alg, T, N, K):
            continue
        c = gs.coefficients(alg)
        Bt = gs.combine_b(W.t(), c).contiguous()
        out.append((f"graph[{a}]", torch.compile(
            lambda c=c, Bt=Bt: res + gs.lcma_matmul(rmsnorm(x, nw), Bt, c))))
    ref = (res[:CHECK_ROWS].double()
           + rmsnorm(x[:CHECK_ROWS].float(), nw.float()).double() @ W.double().t())
    return out, ref


def _time(fn, calls: int) -> float:
    from lcmac.tune.measure import gpu_timer
    return gpu_timer()(fn, calls) / calls


def bench_case(T, name, N, K, args, dtype) -> dict:
    import torch
    from lcmac.tune.measure import gpu_sustained
    vs, ref = variants(T, N, K, args.algos, args.op_algos, dtype)
    errors = {}
    for label, fn in vs:                       # compile, warm up, check
        y = fn()
        torch.cuda.synchronize()
        errors[label] = float((y[:CHECK_ROWS].double() - ref).norm() / ref.norm())
        del y
    times = {label: [] for label, _ in vs}
    for _ in range(args.rounds):
        for label, fn in vs:
            times[label].append(_time(fn, args.calls))
    flops = 2.0 * T * N * K
    base = statistics.median(times["torch"])
    rows = {}
    for label, fn in vs:
        med = statistics.median(times[label])
        r = {"ms": med * 1e3, "spread_ms": [min(times[label]) * 1e3, max(times[label]) * 1e3],
             "tflops": flops / med / 1e12, "vs_torch": base / med, "rel_error": errors[label]}
        if args.sustained:
            r["sustained_ms"] = gpu_sustained(fn, args.sustained) * 1e3
        rows[label] = r
    if args.sustained:
        sb = rows["torch"]["sustained_ms"]
        for r in rows.values():
            r["sustained_vs_torch"] = sb / r["sustained_ms"]
    del vs
    torch.cuda.empty_cache()
    return {"tokens": T, "layer": name, "N": N, "K": K, "variants": rows}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--tokens", type=int, nargs="+", default=[8192, 32768])
    ap.add_argument("--layers", nargs="+", default=list(LAYERS), choices=list(LAYERS))
    ap.add_argument("--algos", nargs="*", default=["strassen", "strassen^2"],
                    help="LCMAs run as graph stages")
    ap.add_argument("--op-algos", nargs="*", default=["strassen^2"],
                    help="LCMAs run as lcmac's kernel (torch.ops.lcmac.linear)")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--sustained", type=float, default=0.0, metavar="S",
                    help="also run each variant S seconds back to back")
    ap.add_argument("--out", help="write the results as JSON here")
    args = ap.parse_args(argv)
    import torch
    if not torch.cuda.is_available():
        print("bench_graph_stages needs a CUDA GPU", file=sys.stderr)
        return 2
    dtype = getattr(torch, args.dtype)
    results = []
    for T in args.tokens:
        for name in args.layers:
            N, K = LAYERS[name]
            r = bench_case(T, name, N, K, args, dtype)
            results.append(r)
            print(f"\n{T} tokens, {name} ({T}x{N}x{K}):")
            for label, v in r["variants"].items():
                sus = (f"  sustained {v['sustained_ms']:8.3f} ms {v['sustained_vs_torch']:.3f}×"
                       if "sustained_ms" in v else "")
                print(f"  {label:18s} {v['ms']:8.3f} ms  {v['tflops']:6.1f} TFLOP/s  "
                      f"{v['vs_torch']:.3f}× torch  err {v['rel_error']:.2e}{sus}", flush=True)
    if args.out:
        doc = {"what": "y = residual + linear(rmsnorm(x)) compiled: torch vs lcmac kernel vs "
                       "LCMA graph stages", "device": torch.cuda.get_device_name(),
               "date": dt.date.today().isoformat(), "command": " ".join(sys.argv),
               "torch": torch.__version__, "dtype": args.dtype, "results": results}
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
