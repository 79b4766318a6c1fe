"""lcmac.distributed on 1, 2, 4, … GPUs against torch.matmul on one GPU and against the plain
distributed GEMM, in one run.  Launch with torchrun, one process per GPU:

    torchrun --nproc-per-node 4 scripts/bench_distributed.py --sizes 16384 32768 \\
        --weak 16384 --host 98304 --algos strassen winograd strassen^2 --out DIR

Three parts, each over the ranks in ``--ranks`` (subgroups of the world: 1, 2, 4 of 4 GPUs):

- strong: n = each of ``--sizes``, A and B on every rank, C on rank 0.  Per round, torch.matmul
  on one GPU, the plain GEMM split over p GPUs (``algo="gemm"``: rows of A) and each LCMA of
  ``--algos`` (its products spread by the plan), interleaved; median and spread of the
  rounds, then each run back to back for ``--sustained`` seconds.  A call's time is the
  slowest rank's wall clock, the product complete on every GPU.
- weak: n_p = ``--weak`` · p^(1/3) (a GPU's work constant), the same variants; efficiency =
  (FLOP/s on p GPUs) / (p · FLOP/s of torch.matmul at n_1 on one GPU).
- host: n = each of ``--host`` (sizes whose A, B and C do not fit one GPU), A, B and C in shared
  host memory, ``host_matmul`` on p GPUs with each tile's product by ``--host-local``.

Errors: each variant's C on 64 rows against float64, beside torch.matmul's.  Effective
FLOP/s = 2·M·N·K / time.  Results JSON (``--out``) and a plot of the scaling.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time


def _setup():
    import torch
    import torch.distributed as dist
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    return dist.get_rank(), dist.get_world_size()


def _inputs(n, dtype, seed):
    import torch
    g = torch.Generator(device="cuda").manual_seed(seed)      # the same values on every GPU
    A = torch.randn(n, n, device="cuda", generator=g, dtype=torch.float32).to(dtype)
    B = (torch.randn(n, n, device="cuda", generator=g, dtype=torch.float32) / n ** 0.5).to(dtype)
    return A, B


def _rel_err(C, A, B, rows):
    ref = A[rows].double() @ B.double()
    return float((C[rows].double() - ref).abs().max() / ref.abs().max())


def _timed(fn, group, calls):
    """Seconds per call: the slowest member's wall clock, the work complete on its GPU."""
    import torch
    import torch.distributed as dist
    dist.barrier(group=group, device_ids=[torch.cuda.current_device()])
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    t = torch.tensor([time.perf_counter() - t0], device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return t.item() / calls


def _sustained(fn, group, seconds):
    """Seconds per call over at least ``seconds`` of back-to-back calls (all members agree on
    the count: rank 0's clock decides when to stop)."""
    import torch
    import torch.distributed as dist
    n, t0 = 0, time.perf_counter()
    while True:
        for _ in range(4):
            fn()
        n += 4
        torch.cuda.synchronize()
        go = torch.tensor([float(time.perf_counter() - t0 < seconds)], device="cuda")
        dist.broadcast(go, src=dist.get_global_rank(group, 0) if group is not None else 0, group=group)
        if not go.item():
            break
    t = torch.tensor([time.perf_counter() - t0], device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return t.item() / n


def _variants(algos, local):
    """(name, algo, local) of the plain GEMM and of each ``--algos`` entry: ``ALGO`` or
    ``ALGO/LOCAL`` (an lcmac algorithm for each product's GEMM: ``gemm/winograd^2`` is the row
    split with lcmac's Winograd² kernel on each GPU)."""
    out = [("gemm", "gemm", local)]
    for a in algos:
        algo, _, loc = a.partition("/")
        if a != "gemm":
            out.append((a, algo, loc or local))
    return out


def _resident(n, groups, args, dtype, rank, world, seed):
    """One size: torch.matmul on one GPU and every (p, variant), interleaved rounds."""
    import torch
    import torch.distributed as dist

    import lcmac.parallel.distributed as ld
    A, B = _inputs(n, dtype, seed)
    flops = 2.0 * n ** 3
    rows = torch.randperm(n, generator=torch.Generator().manual_seed(1))[:64].cuda()
    runs = {}
    cases = [(p, name, algo, local) for p in args.ranks for name, algo, local in _variants(args.algos, args.local)]
    one = groups[1]

    def call(p, algo, local):
        return lambda: ld.matmul(A, B, algo=algo, group=groups[p], dst=0, local=local)
    # first calls: plans, errors (and they warm up)
    errors, plans = {}, {}
    if rank == 0:
        errors["torch"] = _rel_err(A @ B, A, B, rows)
    for p, name, algo, local in cases:
        if rank < p:
            C, plan = ld.matmul(A, B, algo=algo, group=groups[p], dst=0, local=local, return_plan=True)
            if rank == 0:
                errors[(p, name)] = _rel_err(C, A, B, rows)
                plans[(p, name)] = plan.why
            del C
        dist.barrier()
    for _ in range(args.rounds):
        if rank == 0:
            runs.setdefault("torch", []).append(_timed(lambda: torch.matmul(A, B), one, args.calls))
        dist.barrier()
        for p, name, algo, local in cases:
            if rank < p:
                t = _timed(call(p, algo, local), groups[p], args.calls)
                runs.setdefault((p, name), []).append(t)
            dist.barrier()
    sustained = {}
    if args.sustained:
        if rank == 0:
            sustained["torch"] = _sustained(lambda: torch.matmul(A, B), one, args.sustained)
        dist.barrier()
        for p, name, algo, local in cases:
            if rank < p:
                sustained[(p, name)] = _sustained(call(p, algo, local), groups[p], args.sustained)
            dist.barrier()
    rows_out = []
    if rank == 0:
        t1 = statistics.median(runs["torch"])
        for key in ["torch"] + [(p, name) for p, name, _, _ in cases]:
            ts = runs[key]
            med = statistics.median(ts)
            p, name = (1, "torch.matmul") if key == "torch" else key
            gemm = statistics.median(runs[(p, "gemm")]) if key != "torch" else med
            rows_out.append({
                "n": n, "gpus": p, "variant": name, "ms": med * 1e3,
                "spread": (max(ts) - min(ts)) / med, "tflops": flops / med / 1e12,
                "vs_torch_1gpu": t1 / med, "vs_plain_distributed": gemm / med,
                "sustained_ms": sustained[key] * 1e3 if key in sustained else None,
                "sustained_vs_torch_1gpu": (sustained["torch"] / sustained[key]) if key in sustained else None,
                "rel_err": errors[key], "plan": plans.get(key)})
    return rows_out


def _host(n, groups, args, dtype, rank):
    """host_matmul at n (A, B, C in shared host memory) on each p of --ranks."""
    import torch
    import torch.distributed as dist

    import lcmac.parallel.distributed as ld
    shm = args.shm
    files = [os.path.join(shm, f"lcmac-bench-{n}-{x}.bin") for x in "ABC"]
    mk = lambda f: torch.from_file(f, shared=True, size=n * n, dtype=dtype).view(n, n)
    world = dist.get_world_size()
    if rank == 0:
        for f in files:
            if os.path.exists(f):
                os.remove(f)
    dist.barrier()
    A, B, C = (mk(f) for f in files)
    # each rank fills its share of A's and B's rows from its GPU (the same generator per block)
    step = 4096
    with torch.no_grad():
        for X, off in ((A, 0), (B, 1)):
            for b, r0 in enumerate(range(0, n, step)):
                if b % world == rank:
                    g = torch.Generator(device="cuda").manual_seed(10_000 * off + b)
                    blk = torch.randn(min(step, n - r0), n, device="cuda", generator=g)
                    X[r0:r0 + step].copy_((blk / (n ** 0.5 if off else 1.0)).to(dtype).cpu())
    dist.barrier()
    rows = torch.randperm(n, generator=torch.Generator().manual_seed(1))[:64]
    out = []
    for p in args.ranks:
        for local in args.host_local:
            t = None
            if rank < p:
                ts = []
                for _ in range(args.host_warmup):      # pinned buffers allocated, pages touched
                    ld.host_matmul(A, B, C, group=groups[p], local=local)
                for _ in range(args.host_rounds):
                    ts.append(_timed(lambda: ld.host_matmul(A, B, C, group=groups[p], local=local),
                                     groups[p], 1))
                t = ts
            dist.barrier()
            if rank == 0:
                err = _host_err(A, B, C, rows)
                med = statistics.median(t)
                out.append({"n": n, "gpus": p, "variant": f"host_matmul/{local}", "ms": med * 1e3,
                            "rounds_ms": [x * 1e3 for x in t], "warmup_calls": args.host_warmup,
                            "spread": (max(t) - min(t)) / med, "tflops": 2.0 * n ** 3 / med / 1e12,
                            "rel_err": err, "bytes_per_matrix": n * n * C.element_size(),
                            "fits_one_gpu": 3 * n * n * C.element_size() <
                            torch.cuda.get_device_properties(0).total_memory})
            dist.barrier()
    dist.barrier()
    if rank == 0:
        for f in files:
            os.remove(f)
    return out


def _host_err(A, B, C, rows, blocks=4, cols=4096):
    """C's ``rows`` × ``blocks`` random column blocks against float64 (a spot check: all of B
    in float64 would not fit)."""
    import torch
    a = A[rows].cuda().double()
    err = ref_max = 0.0
    g = torch.Generator().manual_seed(2)
    for c0 in torch.randint(0, max(1, B.shape[1] - cols), (blocks,), generator=g).tolist():
        ref = a @ B[:, c0:c0 + cols].cuda().double()
        err = max(err, float((C[rows, c0:c0 + cols].cuda().double() - ref).abs().max()))
        ref_max = max(ref_max, float(ref.abs().max()))
    return err / ref_max


def _plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    parts = sorted({r["part"] for r in rows})
    fig, axes = plt.subplots(1, len(parts), figsize=(5 * len(parts), 4), squeeze=False)
    for ax, part in zip(axes[0], parts):
        sel = [r for r in rows if r["part"] == part and r["variant"] != "torch.matmul"]
        for key in sorted({(r["variant"], r["n"] if part != "weak" else 0) for r in sel}):
            pts = sorted((r["gpus"], r["tflops"]) for r in sel if (r["variant"], r["n"] if part != "weak" else 0) == key)
            ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o",
                    label=key[0] if part == "weak" else f"{key[0]} n={key[1]}")
        ax.set_xlabel("GPUs")
        ax.set_ylabel("effective TFLOP/s")
        ax.set_title(part)
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _report(rows, dev, args, argv, final: bool):
    """Weak-scaling efficiencies, the JSON and plot (after every part: a run cut short keeps
    what it measured), and the table at the end."""
    from lcmac.tune.measure import run_header
    base = [r for r in rows if r["part"] == "weak" and r["variant"] == "torch.matmul"]
    one = min(base, key=lambda r: r["n"]) if base else None
    for r in rows:
        if r["part"] == "weak" and one:
            r["efficiency_vs_1gpu_torch"] = r["tflops"] / (r["gpus"] * one["tflops"])
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        doc = {**run_header("distributed", dev, __file__, argv), "dtype": args.dtype, "rows": rows}
        with open(os.path.join(args.out, "distributed.json"), "w") as f:
            json.dump(doc, f, indent=1)
        _plot(rows, os.path.join(args.out, "distributed.png"))
    if not final:
        return
    print(f"{'part':6} {'n':>6} {'gpus':>4} {'variant':24} {'ms':>9} {'spread':>6} {'TFLOP/s':>8} "
          f"{'vs 1 GPU':>8} {'vs plain':>8} {'sust.':>6} {'rel err':>8}")
    for r in rows:
        print(f"{r['part']:6} {r['n']:6d} {r['gpus']:4d} {r['variant']:24} {r['ms']:9.1f} "
              f"{r['spread']:6.1%} {r['tflops']:8.1f} {r.get('vs_torch_1gpu') or 0:8.3f} "
              f"{r.get('vs_plain_distributed') or 0:8.3f} {r.get('sustained_vs_torch_1gpu') or 0:6.3f} "
              f"{r['rel_err']:8.2e}", flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--sizes", type=int, nargs="*", default=[16384, 32768], help="strong scaling: n")
    ap.add_argument("--weak", type=int, default=None, help="weak scaling: n on one GPU")
    ap.add_argument("--host", type=int, nargs="*", default=[], help="host_matmul: n (host memory)")
    ap.add_argument("--ranks", type=int, nargs="+", default=None, help="GPU counts (default 1, 2, 4, … up to the world)")
    ap.add_argument("--algos", nargs="+", default=["strassen", "winograd", "strassen^2"])
    ap.add_argument("--local", default="vendor", help="each product's GEMM (vendor or an lcmac algorithm)")
    ap.add_argument("--host-local", nargs="+", default=["vendor"])
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=3)
    ap.add_argument("--host-rounds", type=int, default=2)
    ap.add_argument("--host-warmup", type=int, default=1, help="untimed host_matmul calls first")
    ap.add_argument("--sustained", type=float, default=2.0, help="seconds back to back per variant (0: skip)")
    ap.add_argument("--shm", default="/dev/shm", help="where the host part's shared matrices live")
    ap.add_argument("--out", help="directory for the JSON and the plot")
    args = ap.parse_args(argv)
    import torch
    import torch.distributed as dist
    if "RANK" not in os.environ:
        print("bench_distributed: launch with torchrun --nproc-per-node N (one process per GPU)",
              file=sys.stderr)
        return 2
    rank, world = _setup()
    args.ranks = args.ranks or [p for p in (1, 2, 4, 8, 16) if p <= world]
    if max(args.ranks) > world:
        print(f"bench_distributed: --ranks {max(args.ranks)} > the {world} processes", file=sys.stderr)
        return 2
    groups = {p: dist.new_group(list(range(p))) for p in args.ranks if p != world}
    groups[world] = dist.group.WORLD
    if 1 not in groups:
        groups[1] = dist.new_group([0])
    dtype = getattr(torch, args.dtype)
    rows = []
    dev = f"{world}x {torch.cuda.get_device_name(0)}"
    save = lambda final: _report(rows, dev, args, argv, final) if rank == 0 else None
    for n in args.sizes:
        rows += [dict(r, part="strong") for r in _resident(n, groups, args, dtype, rank, world, n)]
        torch.cuda.empty_cache()
        save(False)
    if args.weak:
        for p in args.ranks:
            n = int(round(args.weak * p ** (1 / 3) / 1024)) * 1024
            sub = argparse.Namespace(**{**vars(args), "ranks": [p]})
            rows += [dict(r, part="weak") for r in _resident(n, groups, sub, dtype, rank, world, n)
                     if r["gpus"] == p or r["variant"] == "torch.matmul"]
        save(False)
    for n in args.host:
        rows += [dict(r, part="host") for r in _host(n, groups, args, dtype, rank)]
    save(True)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
