#!/usr/bin/env python
"""GPU tuning campaigns for the committed logs (issue 5), through the tuner API.

One process, one pool of compile threads for every campaign (each config is built once, in
campaign order: the first campaign's artifacts are ready first), one measuring process, and
one ``lcmac.tune.tune`` call per (shape, algorithm) — the records are the tuner's own.
Measuring overlaps compiling (the GPU's timing does not share the CPU's cores' work; the
compilers run at nice 10).  Stops starting new shapes after ``--deadline`` seconds and
copies the logs to ``--out`` after every shape, so a time limit still leaves data.

    python scripts/tune_gpu.py --campaigns exhaustive-bf16 llm-bf16-8192 --jobs 14 \\
        --deadline 480 --out "$OUT"

Campaigns (``CAMPAIGNS``):
  exhaustive-<dtype>     plain GEMM at 8192x8192x4096 (Qwen3 q_proj, M=8192), every fitting
                         config of the tuner's space (tag "exhaustive": the search metrics)
  llm-<dtype>-<M>        every distinct (N, K) of bench/llm_shapes.json at token count M:
                         the vendor GEMM (cuBLAS), the default config, then GEMM (budget 3),
                         Strassen (2) and Strassen² (1) in the model's order (tag "llm")
  lcma-<dtype>-<M>       the same shapes, for a new device's decision: the vendor GEMM and
                         the model's first config of Strassen² and Winograd² (tag "lcma")
  llama70b-<dtype>-<M>   the MLP layers of a 70B-class Llama (hidden 8192, intermediate
                         28672: N,K = 28672,8192 and 8192,28672) as lcma-, tag "llama70b"
  llama70b-wide-<dtype>-<M>  those layers and the attention's 8192x8192 projections with more
                         schemes: Winograd² and the <4,2,4;26> schemes (K cut in two: deeper
                         products where K is the short side) two configs each, Strassen² and
                         Strassen one; the vendor GEMM first (tag "llama70b")
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

EXHAUSTIVE_SHAPE = (8192, 8192, 4096)
LLM_BUDGETS = (("gemm", 3), ("strassen", 2), ("strassen^2", 1))
LCMA_BUDGETS = (("strassen^2", 1), ("winograd^2", 1))
LLAMA70B_NK = (("llama70b/gate_or_up", (28672, 8192)), ("llama70b/down", (8192, 28672)))
LLAMA70B_WIDE_NK = LLAMA70B_NK + (("llama70b/q_or_o", (8192, 8192)),)
LLAMA70B_WIDE_BUDGETS = (("winograd^2", 2), ("at-2x4x4-r26@4x2x4", 2), ("fg-2x4x4-r26@4x2x4", 2),
                         ("strassen^2", 1), ("strassen", 1))


def campaign(name: str):
    """[(label, shape, algorithm, budget, options)] of one campaign."""
    from lcmac.tune.llm_shapes import llm_shapes
    kind, dtype, *rest = name.split("-")
    if (kind, dtype) == ("llama70b", "wide"):
        kind, (dtype, *rest) = "llama70b-wide", rest
    dtype = {"bf16": "bfloat16", "fp32": "float32", "fp16": "float16"}.get(dtype, dtype)
    if kind == "exhaustive":
        return dtype, [("exhaustive", EXHAUSTIVE_SHAPE, "gemm", 0,
                        dict(exhaustive=True, tag="exhaustive", vendor=True))]
    if kind == "llm":
        M = int(rest[0])
        out = []
        for label, shape in llm_shapes(ms=[M]):
            for i, (algo, budget) in enumerate(LLM_BUDGETS):
                out.append((label, shape, algo, budget,
                            dict(tag="llm", vendor=i == 0, measure_default=True)))
        return dtype, out
    if kind == "llama70b-wide":
        M = int(rest[0])
        return dtype, [(label, (M, n, k), algo, budget, dict(tag="llama70b", vendor=i == 0))
                       for label, (n, k) in LLAMA70B_WIDE_NK
                       for i, (algo, budget) in enumerate(LLAMA70B_WIDE_BUDGETS)]
    if kind in ("lcma", "llama70b"):
        M = int(rest[0])
        shapes = (llm_shapes(ms=[M]) if kind == "lcma"
                  else [(label, (M, n, k)) for label, (n, k) in LLAMA70B_NK])
        return dtype, [(label, shape, algo, budget, dict(tag=kind, vendor=i == 0))
                       for label, shape in shapes for i, (algo, budget) in enumerate(LCMA_BUDGETS)]
    raise SystemExit(f"unknown campaign {name!r}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--campaigns", nargs="+", required=True)
    ap.add_argument("--target", default="cuda-sm90a")
    ap.add_argument("--jobs", type=int, default=14, help="parallel compiles")
    ap.add_argument("--deadline", type=float, default=480, help="seconds: start no shape after")
    ap.add_argument("--logs", default=os.path.join(ROOT, "lcmac", "data", "tuning_logs"))
    ap.add_argument("--build-dir", default="/tmp/lcmac-tune-art")
    ap.add_argument("--out", default=os.environ.get("OUT"))
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--limit", type=int, default=None, help="at most this many shapes per campaign")
    ap.add_argument("--build-only", action="store_true",
                    help="compile the planned configs into --build-dir (index.jsonl) and stop")
    ap.add_argument("--prebuilt", default=None, metavar="DIR",
                    help="artifacts of an earlier --build-only (index.jsonl), used first")
    ap.add_argument("--nice", type=int, default=10, help="compilers' nice value")
    ap.add_argument("--reverse", action="store_true",
                    help="with --build-only: build the plan from its end (another machine "
                         "builds from its start)")
    args = ap.parse_args()
    t0 = time.time()

    import torch
    from lcmac.tune import builders, tuner
    from lcmac.artifact.tuning_log import TuningDB, log_path
    from lcmac.tune.measure import MeasureWorker
    try:
        dev = torch.cuda.get_device_name(0)
    except Exception as e:  # noqa: BLE001 - a dry run of the flow on a machine without a GPU
        dev = f"no GPU ({type(e).__name__})"
    print(f"device: {dev}, torch {torch.__version__}, {os.cpu_count()} cpus", flush=True)
    store = TuningDB(args.logs)
    plans = []
    for c in args.campaigns:
        dtype, items = campaign(c)
        if args.limit:
            keep = []
            for it in items:
                if it[1] not in keep:
                    keep.append(it[1])
            keep = set(keep[:args.limit])
            items = [it for it in items if it[1] in keep]
        plans.append((c, dtype, items))

    pre = builders.Prebuilder(args.jobs, args.build_dir, nice=args.nice)
    old = builders.load_prebuilt(args.prebuilt) if args.prebuilt else None
    if old is not None:
        print(f"{old.n_entries} prebuilt artifacts in {args.prebuilt}", flush=True)
    n_old = 0
    todo = []
    for c, dtype, items in plans:
        for label, shape, algo, budget, opt in items:
            for pt in tuner.plan_points(algo, args.target, dtype, shape, budget, db=store,
                                        exhaustive=opt.get("exhaustive", False),
                                        measure_default=opt.get("measure_default", False)):
                if old is not None and old(pt, args.target, dtype, shape):
                    n_old += 1
                    continue
                todo.append((pt, dtype, shape))
    if args.build_only and args.reverse:
        todo.reverse()
    for pt, dtype, shape in todo:
        pre.submit(pt, args.target, dtype, shape)
    if args.build_only:
        import concurrent.futures as cf
        n = len(pre.futs)
        print(f"building {n} artifacts into {args.build_dir}", flush=True)
        for i, _ in enumerate(cf.as_completed(list(pre.futs.values())), 1):
            if i % 10 == 0 or i == n:
                print(f"  {i}/{n} after {time.time() - t0:.0f}s ({pre.failed} failed)", flush=True)
        return 0

    def lookup(dtype, shape):
        new = pre.lookup(args.target, dtype, shape)
        if old is None:
            return new
        return lambda pt: old(pt, args.target, dtype, shape) or new(pt)
    n_sub = len(pre.futs)
    print(f"{n_sub} builds submitted ({args.jobs} at a time), {n_old} prebuilt, after "
          f"{time.time() - t0:.0f}s", flush=True)

    def save():
        if not args.out:
            return
        os.makedirs(args.out, exist_ok=True)
        for d in sorted({d for _, d, _ in plans}):
            src = log_path(args.logs, args.target, d)
            if src.is_file():
                shutil.copy(src, os.path.join(args.out, src.name))
        idx = os.path.join(args.build_dir, "index.jsonl")
        if os.path.isfile(idx):
            shutil.copy(idx, os.path.join(args.out, "build-index.jsonl"))

    worker = MeasureWorker()
    summary, stopped = [], None
    try:
        for c, dtype, items in plans:
            for label, shape, algo, budget, opt in items:
                if time.time() - t0 > args.deadline:
                    stopped = f"deadline {args.deadline:.0f}s reached before {c} {label} {algo}"
                    break
                ts = time.time()
                r = tuner.tune(algo, args.target, dtype, shape, budget or 1, jobs=1, db=store,
                               worker=worker, prebuilt=lookup(dtype, shape),
                               repeats=args.repeats, warmup=3, min_run_s=0.01, **opt)
                b = r.best
                row = {"campaign": c, "label": label, "shape": list(shape), "algorithm": algo,
                       "trials": len(r.trials), "ok": len(r.ok_trials()),
                       "best_ms": b.time_s * 1e3 if b else None,
                       "vendor_ms": r.vendor_time * 1e3 if r.vendor_time else None,
                       "stopped": r.stopped.get(algo, ""), "wall_s": round(time.time() - ts, 1),
                       "errors": sorted({t.error[:120] for t in r.trials if not t.ok})[:2]}
                summary.append(row)
                print(json.dumps(row), flush=True)
                save()
            if stopped:
                break
    finally:
        worker.close()
        save()
        built, failed = pre.built, pre.failed
        if args.out:
            with open(os.path.join(args.out, "summary.json"), "w") as f:
                json.dump({"campaigns": args.campaigns, "wall_s": round(time.time() - t0, 1),
                           "builds_submitted": n_sub, "built": built, "build_failed": failed,
                           "stopped": stopped, "rows": summary}, f, indent=1)
    print(f"done in {time.time() - t0:.0f}s: {built} built, {failed} failed, "
          f"{sum(r['ok'] for r in summary)} measured; {stopped or 'all shapes done'}", flush=True)
    sys.stdout.flush()
    os._exit(0)  # do not wait for compiles still running (their results are not needed)


if __name__ == "__main__":
    main()
