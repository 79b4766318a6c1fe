#!/usr/bin/env python
"""The operator sweep of FalconGEMM's evaluation on the GPU at hand: ``lcmac.matmul`` (auto)
against ``torch.matmul`` (cuBLAS) at every (N, K) of ``bench/llm_shapes.json`` × M, in one run.

    python scripts/bench_sweep.py --dtype bf16 --out bench/results/h200-bfloat16-sweep.json

Per shape: the decision (``lcmac.plan``: what ``lcmac.matmul`` runs there, and why), then,
after every kernel the decisions need is compiled in parallel (``--jobs``; shapes whose
kernels are not built by ``--build-s`` run what ``lcmac.matmul`` runs without them, and are
marked), both calls timed in interleaved rounds (``gpu_rounds``: the first place in a round
rotates) on the same operands, CUDA events around ``--calls`` back-to-back calls: the median
and spread over ``--rounds`` rounds (burst), and with ``--sustained S`` each call also run
back to back for S seconds.  Ratio = torch.matmul's time / lcmac.matmul's.  The result is
checked against torch.matmul's on a band of rows.  Writes the JSON (device, date, command) and,
with ``--plot``, the ratios per shape and their distribution.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import statistics
import sys
import time

#: FalconGEMM's operator sweep, eight of its row counts
M_SWEEP = (512, 1024, 2048, 4096, 8192, 12288, 16384, 20480)
CHECK_ROWS = 512


def _decide_some(shapes, dtype: str, target: str) -> tuple[list, dict]:
    """(shape, plan, kernel keys) for each shape, as ``lcmac.matmul`` would decide it (no
    compile), and the planner's cache entries those decisions made."""
    import lcmac
    from lcmac.api import matmul as ops
    from lcmac.policy import planner
    out = []
    for M, N, K in shapes:
        p = lcmac.plan(M, N, K, dtype=dtype, target=target)
        keys = [] if p.is_vendor else ops.kernel_keys(M, N, K, dtype, algo="auto", target=target)
        out.append(((M, N, K), p, keys))
    return out, dict(planner._plans)


def decide(shapes, dtype: str, target: str, jobs: int = 1) -> dict:
    """shape → (plan, kernel keys), decided in ``jobs`` processes at once (a first decision
    at a large shape takes seconds of Python); the plans go into this process's planner cache,
    so ``lcmac.matmul`` here runs them without deciding again."""
    import multiprocessing

    from lcmac.policy import planner
    parts = [shapes[i::jobs] for i in range(jobs)]
    ctx = multiprocessing.get_context("spawn")     # no CUDA state forked into the workers
    with cf.ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
        done = list(pool.map(_decide_some, parts, [dtype] * jobs, [target] * jobs))
    out = {}
    for rows, plans in done:
        planner._plans.update(plans)
        out.update({s: (p, keys) for s, p, keys in rows})
    return out


def build(decisions: dict, jobs: int, seconds: float) -> set:
    """Compile every kernel the decisions name, ``jobs`` at a time, for at most ``seconds``:
    the shapes whose kernels all exist."""
    from lcmac.api import matmul as ops
    keys = {k for _, ks in decisions.values() for k in ks}
    done, t0 = set(), time.time()
    pool = cf.ThreadPoolExecutor(max_workers=jobs)
    futs = {pool.submit(ops.kernel, *k): k for k in keys}
    try:
        for f in cf.as_completed(futs, timeout=seconds):
            if f.exception() is None:
                done.add(futs[f])
            print(f"  built {len(done)}/{len(keys)} after {time.time() - t0:.0f}s", flush=True)
    except cf.TimeoutError:
        print(f"  build budget of {seconds:.0f}s spent: {len(done)}/{len(keys)} kernels", flush=True)
    pool.shutdown(wait=False, cancel_futures=True)
    return {s for s, (_, ks) in decisions.items() if all(k in done for k in ks)}


def bench_shape(shape, args, dtype) -> dict:
    import torch

    import lcmac
    from lcmac.api.matmul import release_kernels
    from lcmac.tune.measure import gpu_rounds
    M, N, K = shape
    g = torch.Generator(device="cuda").manual_seed(0)
    A = torch.randn(M, K, device="cuda", dtype=dtype, generator=g)
    B = torch.randn(K, N, device="cuda", dtype=dtype, generator=g) / K ** 0.5
    band = slice(0, min(M, CHECK_ROWS))
    ref = torch.matmul(A, B)[band].double()
    diff = ((lcmac.matmul(A, B)[band].double() - ref).norm() / ref.norm()).item()
    torch.cuda.synchronize()
    calls = max(1, min(50, int(2e-3 / max(2.0 * M * N * K / 700e12, 1e-6))))   # ≥ ~2 ms a round
    rounds, sustained = gpu_rounds([("torch.matmul", lambda: torch.matmul(A, B)),
                                    ("lcmac.matmul", lambda: lcmac.matmul(A, B))],
                                   args.rounds, calls, args.sustained)
    del A, B, ref
    release_kernels()
    torch.cuda.empty_cache()
    t, l = (statistics.median(rounds[n]) for n in ("torch.matmul", "lcmac.matmul"))
    row = {"shape": [M, N, K], "calls": calls, "torch_s": t, "lcmac_s": l, "ratio": t / l,
           "spread": {n: (max(v) - min(v)) / statistics.median(v) for n, v in rounds.items()},
           "rel_diff_vs_torch": diff, "tflops_lcmac": 2.0 * M * N * K / l / 1e12}
    if sustained:
        row["sustained_ratio"] = sustained["torch.matmul"] / sustained["lcmac.matmul"]
    return row


def paired_records(rows, target: str, dtype: str, device: str, torch_version: str) -> list:
    """Tuning records of the shapes where an lcmac kernel ran: the vendor GEMM's time and the
    kernel's as a ``confirm`` record with ``vendor_paired_s`` (timed in the same rounds of the
    same process), so that the decision puts the vendor at the paired ratio to the logged
    kernels there (``lcmac.policy.measured.confirmed_ratio``)."""
    from lcmac.artifact import tuning_log as tdb
    out = []
    for r in rows:
        if r["plan"] == "vendor" or not r.get("built", True):
            continue
        shape, n = r["shape"], r.get("rounds", 0)
        name, h = tdb.algo_identity(r["plan"])
        out.append(tdb.make_record(
            target=target, dtype=dtype, algorithm=tdb.VENDOR, algorithm_hash=tdb.VENDOR,
            shape=shape, config={"api": "torch.matmul", "library": "cublas", "tf32": False,
                                 "torch": torch_version},
            time_s=r["torch_s"], spread=r["spread"]["torch.matmul"], repeats=n, device=device,
            tag="sweep"))
        out.append(tdb.make_record(
            target=target, dtype=dtype, algorithm=name, algorithm_hash=h, shape=shape,
            config={}, time_s=r["lcmac_s"], spread=r["spread"]["lcmac.matmul"], repeats=n,
            device=device, tag="sweep", confirm=True, vendor_paired_s=r["torch_s"]))
    return out


def plot(rows, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
    ms = sorted({r["shape"][0] for r in rows})
    for nk in sorted({tuple(r["shape"][1:]) for r in rows}):
        pts = sorted((r["shape"][0], r["ratio"]) for r in rows if tuple(r["shape"][1:]) == nk)
        a.plot([ms.index(m) for m, _ in pts], [v for _, v in pts], marker=".", lw=0.7, alpha=0.7)
    a.axhline(1.0, color="k", lw=0.8)
    a.axhline(0.98, color="r", lw=0.6, ls="--")
    a.set_xticks(range(len(ms)), [str(m) for m in ms])
    a.set_xlabel("M (tokens)")
    a.set_ylabel("torch.matmul time / lcmac.matmul time")
    a.set_title("per (N, K)")
    b.hist([r["ratio"] for r in rows], bins=30)
    b.axvline(1.0, color="k", lw=0.8)
    b.set_xlabel("ratio")
    b.set_title(f"{len(rows)} shapes")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--target", default=None, help="default: this GPU's")
    ap.add_argument("--m", type=int, nargs="+", default=list(M_SWEEP), help="row counts")
    ap.add_argument("--limit", type=int, default=None, help="at most this many (N, K)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--sustained", type=float, default=0.0, metavar="S")
    ap.add_argument("--jobs", type=int, default=16, help="kernels compiled in parallel")
    ap.add_argument("--build-s", type=float, default=300.0, help="seconds of compiling at most")
    ap.add_argument("--plan-jobs", type=int, default=16, help="processes deciding in parallel")
    ap.add_argument("--out", default=None)
    ap.add_argument("--logs", default=None, metavar="DIR",
                    help="append paired records of the shapes an lcmac kernel ran at to the "
                         "tuning logs in DIR (lcmac's decision then reads the paired ratio)")
    ap.add_argument("--plot", default=None, metavar="PNG")
    args = ap.parse_args(argv)
    import torch

    from lcmac.api import matmul as ops
    from lcmac.core.dtypes import normalize_dtype
    from lcmac.tune.llm_shapes import llm_shapes
    from lcmac.tune.measure import run_header
    dtype = normalize_dtype(args.dtype)
    tdtype = getattr(torch, dtype)
    target = args.target or ops.target_for("cuda")
    shapes = [s for _, s in llm_shapes(ms=[args.m[0]])]
    nks = [s[1:] for s in shapes][:args.limit]
    shapes = [(m, n, k) for m in args.m for n, k in nks]
    t0 = time.time()
    decisions = decide(shapes, dtype, target, args.plan_jobs)
    print(f"decided {len(shapes)} shapes in {time.time() - t0:.0f} s", flush=True)
    lcma = [s for s, (p, _) in decisions.items() if p.runs != "vendor"]
    print(f"{torch.cuda.get_device_name(0)}: {len(shapes)} shapes, an lcmac kernel runs at "
          f"{len(lcma)}", flush=True)
    ready = build(decisions, args.jobs, args.build_s)
    rows = []
    with torch.no_grad():
        for s in shapes:
            p, keys = decisions[s]
            row = bench_shape(s, args, tdtype)
            row.update(plan=p.runs, why=p.why, built=s in ready or not keys, rounds=args.rounds,
                       kernels=[list(map(str, k)) for k in keys])   # buckets or one run-time-M kernel
            rows.append(row)
            print(f"{'x'.join(map(str, s)):>20s} {p.runs:>14s} {row['ratio']:6.3f}x "
                  f"(spread {max(row['spread'].values()) * 100:4.1f}%)"
                  + ("" if row["built"] else " [not built]"), flush=True)
    ratios = [r["ratio"] for r in rows]
    summary = {"shapes": len(rows), "lcmac_kernels_at": len(lcma), "min_ratio": min(ratios),
               "median_ratio": statistics.median(ratios),
               "below_0.98": sum(r < 0.98 for r in ratios), "wall_s": round(time.time() - t0, 1)}
    print(json.dumps(summary))
    if args.out:
        doc = {**run_header("operator sweep: lcmac.matmul (auto) vs torch.matmul",
                            torch.cuda.get_device_name(0), __file__, argv),
               "dtype": dtype, "target": target, "torch": torch.__version__,
               "summary": summary, "rows": rows}
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)
    if args.plot:
        plot(rows, args.plot)
    if args.logs:
        from lcmac.artifact.tuning_log import TuningDB
        recs = paired_records(rows, target, dtype, torch.cuda.get_device_name(0), torch.__version__)
        TuningDB(args.logs).append(recs)
        print(f"{len(recs)} records appended to {args.logs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
