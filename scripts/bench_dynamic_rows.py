#!/usr/bin/env python
"""Time CUDA kernels whose row count M is a run-time value (``CudaConfig.dynamic_rows``: one
kernel per N×K and algorithm) against the exact-shape kernel of the same algorithm and knobs
and against torch.matmul (cuBLAS), at a few (M, N, K).

    python scripts/bench_dynamic_rows.py                              # the LLM default cases
    python scripts/bench_dynamic_rows.py --algos gemm,strassen --M 4096 20480 --NK 8192x28672
    python scripts/bench_dynamic_rows.py --jobs 8 --build-s 1800 --out bench/results/x.json

Builds first, in parallel (``--jobs`` TileLang worker processes, each with
``LCMAC_NVCC_JOBS`` nvcc processes): per algorithm and N×K one run-time-M kernel (taking up to
max(--M) rows a launch) and one exact kernel per M with the same resolved config but
``dynamic_rows`` off (so the exact kernel may read operands in place, ``direct_views``,
which the run-time-M form does not).  Builds not started within ``--build-s`` seconds are
skipped, and their cases reported as such.  Then per case: the error of each variant against
float64 on the first and last rows (the output poisoned with NaN first), and interleaved
rounds (``lcmac.tune.measure.gpu_rounds``: the variants take turns, each round starting at
another) of ``--calls`` back-to-back calls; median and spread per variant, and the ratios
exact/dynamic (> 1: the run-time-M kernel is faster; the goal is ≥ 0.97) and
fastest-baseline/variant.  Writes JSON with device, date and command (``--out``, default
bench/results/<gpu>-<dtype>-dynamic-rows.json).  Needs a CUDA GPU; nothing is measured
without one.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

#: LLM MLP projections (70B-class): up (N 28672, K 8192) and down (N 8192, K 28672)
DEFAULT_M = [4096, 12288, 20480, 32768]
DEFAULT_NK = ["28672x8192", "8192x28672"]
DEFAULT_ALGOS = "gemm,strassen^2,winograd^2"
CHECK_ROWS = 512           # rows at each end of C checked against float64


def _resolved(algo: str, dtype: str, arch: str) -> dict:
    """The config the run-time-M build resolves to (the worker's defaults)."""
    from lcmac.spec.cuda.config import CudaConfig
    return CudaConfig.from_dict({"dynamic_rows": True}, dtype=dtype, arch=arch,
                                lcma=algo != "gemm").to_dict()


def _build_all(todo: list[dict], jobs: int, budget_s: float, out: Path) -> dict:
    """{key: manifest path, or the error text} for ``todo`` ([{key, algo, shape, config}]),
    built ``jobs`` at a time; builds not started within ``budget_s`` seconds are skipped."""
    import lcmac
    t0 = time.perf_counter()
    done: dict = {}

    def one(item):
        if time.perf_counter() - t0 > budget_s:
            return item["key"], "skipped: --build-s budget spent before this build started"
        t = time.perf_counter()
        try:
            path = lcmac.build(item["algo"], "cuda", item["dtype"], item["shape"], config=item["config"],
                               out_dir=str(out / item["dir"]))
        except Exception as e:          # one failed build must not stop the others
            return item["key"], f"build failed: {type(e).__name__}: {e}"
        print(f"  built {item['dir']} in {time.perf_counter() - t:.0f} s", flush=True)
        return item["key"], str(path)
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for key, got in pool.map(one, todo):
            done[key] = got
    return done


def _inputs(M, N, K, dtype):
    import torch
    g = torch.Generator(device="cuda").manual_seed(M * 7 + N)
    A = torch.randn(M, K, device="cuda", generator=g).to(dtype)
    B = (torch.randn(K, N, device="cuda", generator=g) / K ** 0.5).to(dtype)
    return A, B


def _error(fn, A, B, C) -> float:
    """‖C−ref‖/‖ref‖ over C's first and last CHECK_ROWS rows, C poisoned with NaN first."""
    import torch
    C.fill_(float("nan"))
    fn()
    torch.cuda.synchronize()
    M = A.shape[0]
    rows = torch.cat([torch.arange(min(M, CHECK_ROWS)), torch.arange(max(0, M - CHECK_ROWS), M)]).unique()
    rows = rows.to("cuda")
    ref = A[rows].double() @ B.double()
    got = C[rows].double()
    if not torch.isfinite(got).all():
        return float("nan")
    return float((got - ref).norm() / ref.norm())


def _short(kernel: str) -> str:
    """A kernel's name without its signature and lcmac's prefix."""
    return kernel.split("(")[0].removeprefix("lcmac_").removesuffix("_kernel")


def bench_case(M, N, K, algo, fns: dict, args, other: str = "dynamic") -> dict:
    """Interleaved rounds of torch.matmul and the loaded kernels ``fns`` {variant: callable},
    with ``args.sustained`` seconds each back to back where the command has that option; the
    exact kernel over the variant ``other`` (the run-time-M kernel, or a bundle's), per round."""
    import torch
    from lcmac.tune.measure import gpu_rounds
    dtype = getattr(torch, args.dtype)
    A, B = _inputs(M, N, K, dtype)
    C = torch.empty(M, N, device="cuda", dtype=dtype)
    variants = [("torch.matmul", lambda: torch.matmul(A, B, out=C))]
    variants += [(name, (lambda f=f: f(A, B, out=C))) for name, f in fns.items()]
    errors = {name: _error(fn, A, B, C) for name, fn in variants}
    for name, fn in variants:          # warm: clocks up, workspaces allocated
        t_end = time.perf_counter() + 0.2
        while time.perf_counter() < t_end:
            fn()
        torch.cuda.synchronize()
    rounds, sustained = gpu_rounds(variants, args.rounds, args.calls, getattr(args, "sustained", 0.0))
    med = {name: statistics.median(ts) for name, ts in rounds.items()}
    flops = 2.0 * M * N * K
    rows = {name: {"median_s": med[name], "seconds": ts, "spread": (max(ts) - min(ts)) / med[name],
                   "tflops": flops / med[name] / 1e12, "vs_torch": med["torch.matmul"] / med[name],
                   "rel_error_vs_float64": errors[name],
                   **({"sustained_s": sustained[name],
                       "sustained_vs_torch": sustained["torch.matmul"] / sustained[name]} if sustained else {})}
            for name, ts in rounds.items()}
    out = {"M": M, "N": N, "K": K, "algorithm": algo, "variants": rows}
    if getattr(args, "kernels", False):
        # where each variant's time goes: µs per call by kernel (torch's profiler)
        from lcmac.tune.measure import gpu_kernel_times
        out["kernels_us"] = {name: gpu_kernel_times(fn, args.calls) for name, fn in variants if name != "torch.matmul"}
    key = f"exact_over_{other}"
    if "exact" in med and other in med:
        out[key] = med["exact"] / med[other]
        # paired per round: the same round's two times (the variants ran back to back)
        out[key + "_rounds"] = [e / d for e, d in zip(rounds["exact"], rounds[other])]
        if sustained:
            out[key + "_sustained"] = sustained["exact"] / sustained[other]
    print(f"\n{algo} {M}x{N}x{K} {args.dtype}  (median of {args.rounds} rounds x {args.calls} calls)")
    print(f"  {'variant':14s} {'ms':>9s} {'spread':>7s} {'TFLOP/s':>8s} {'vs torch':>9s} {'rel.err':>9s}"
          + (f" {'sust. ms':>9s} {'vs torch':>9s}" if sustained else ""))
    for name, r in rows.items():
        print(f"  {name:14s} {r['median_s'] * 1e3:9.3f} {r['spread'] * 100:6.1f}% {r['tflops']:8.1f} "
              f"{r['vs_torch']:8.3f}x {r['rel_error_vs_float64']:9.2e}"
              + (f" {r['sustained_s'] * 1e3:9.3f} {r['sustained_vs_torch']:8.3f}x" if sustained else ""))
    for name, ks in out.get("kernels_us", {}).items():
        print(f"  {name} by kernel (us per call): " + ", ".join(f"{_short(k)} {us:.0f}" for k, us in ks.items()))
    if key in out:
        paired = out[key + "_rounds"]
        print(f"  {'exact/' + other:14s} {out[key]:.3f}  (rounds {min(paired):.3f} .. {max(paired):.3f}"
              + (f"; sustained {out[key + '_sustained']:.3f}" if sustained else "") + "; goal >= 0.97)")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--algos", default=DEFAULT_ALGOS, help="comma-separated (default %(default)s; gemm: the plain GEMM)")
    ap.add_argument("--M", type=int, nargs="+", default=DEFAULT_M, help="rows of A (default %(default)s)")
    ap.add_argument("--NK", nargs="+", default=DEFAULT_NK, help="weights as NxK (default %(default)s)")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    ap.add_argument("--rounds", type=int, default=7, help="interleaved rounds (default %(default)s)")
    ap.add_argument("--calls", type=int, default=10, help="calls per timed round (default %(default)s)")
    ap.add_argument("--kernels", action="store_true",
                    help="also each variant's time by kernel (torch's profiler), printed and in the JSON")
    ap.add_argument("--jobs", type=int, default=4, help="builds in parallel (default %(default)s)")
    ap.add_argument("--build-s", type=float, default=3600.0,
                    help="no build starts after this many seconds (default %(default)s)")
    ap.add_argument("--artifacts", type=Path, help="keep the builds here (default: a temporary directory)")
    ap.add_argument("--out", help="results JSON (default bench/results/<gpu>-<dtype>-dynamic-rows.json)")
    args = ap.parse_args(argv)
    import torch
    if not torch.cuda.is_available():
        print("bench_dynamic_rows: needs a CUDA GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    import lcmac
    from lcmac.spec.targets import get_target
    from lcmac.tune.measure import run_header
    arch = get_target("cuda").arch
    algos = [a.strip() for a in args.algos.split(",") if a.strip()]
    nks = [tuple(int(x) for x in s.lower().split("x")) for s in args.NK]
    max_rows = max(args.M)
    todo = []
    for algo in algos:
        cfg = _resolved(algo, args.dtype, arch)
        tag = algo.replace("^", "sq")
        for N, K in nks:
            todo.append({"key": (algo, N, K, "dynamic"), "algo": algo, "dtype": args.dtype,
                         "shape": (max_rows, N, K), "config": cfg, "dir": f"{tag}-dyn-{N}x{K}"})
            for M in args.M:
                todo.append({"key": (algo, N, K, M), "algo": algo, "dtype": args.dtype, "shape": (M, N, K),
                             "config": dict(cfg, dynamic_rows=False), "dir": f"{tag}-{M}x{N}x{K}"})
    os.environ.setdefault("LCMAC_NVCC_JOBS", "2")
    with tempfile.TemporaryDirectory() as tmp:
        art = args.artifacts or Path(tmp)
        print(f"building {len(todo)} kernels, {args.jobs} at a time, into {art}", flush=True)
        t0 = time.perf_counter()
        built = _build_all(todo, args.jobs, args.build_s, art)
        print(f"builds done in {time.perf_counter() - t0:.0f} s", flush=True)
        results, missing = [], []
        for algo in algos:
            for N, K in nks:
                dyn = built[(algo, N, K, "dynamic")]
                for M in args.M:
                    exact = built[(algo, N, K, M)]
                    fns = {}
                    for name, got in (("exact", exact), ("dynamic", dyn)):
                        if os.path.isfile(got):
                            fns[name] = lcmac.load(got)
                        else:
                            missing.append({"algorithm": algo, "M": M, "N": N, "K": K, "variant": name, "why": got})
                            print(f"{algo} {M}x{N}x{K} {name}: {got}", flush=True)
                    if fns:
                        results.append(bench_case(M, N, K, algo, fns, args))
                    torch.cuda.empty_cache()
    device = torch.cuda.get_device_name(0)
    ratios = [r["exact_over_dynamic"] for r in results if "exact_over_dynamic" in r]
    summary = {"cases": len(results), "exact_over_dynamic_min": min(ratios) if ratios else None,
               "exact_over_dynamic_median": statistics.median(ratios) if ratios else None,
               "within_3_percent": all(x >= 0.97 for x in ratios) if ratios else None}
    doc = {**run_header("dynamic-rows", device, __file__, argv), "dtype": args.dtype, "arch": arch,
           "rounds": args.rounds, "calls": args.calls, "max_rows": max_rows, "summary": summary,
           "results": results, "not_run": missing}
    out = args.out or os.path.join(ROOT, "bench", "results",
                                   f"{device.lower().replace('nvidia ', '').replace(' ', '-')}-"
                                   f"{args.dtype}-dynamic-rows.json")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        json.dump(doc, f, indent=1)
    print(f"\nexact/dynamic over {len(ratios)} cases: min {summary['exact_over_dynamic_min']}, "
          f"median {summary['exact_over_dynamic_median']}; within 3 %: {summary['within_3_percent']}")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
