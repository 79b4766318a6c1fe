"""What ``lcmac.matmul(algo="auto")`` costs over ``torch.matmul`` where it runs the vendor GEMM:
per-call time of both on the same tensors, from tiny products (host overhead alone) to
1024x512x4096, on the device at hand (CUDA when present, else the CPU).

    python3 scripts/bench_dispatch.py                          # default shapes, float32 / bf16
    python3 scripts/bench_dispatch.py --shapes 8x32x64 1024x512x4096 --rounds 31 --out r.json

Shapes are MxNxK (A is MxK, B is KxN).  Each round times a batch of back-to-back calls of one
and then of the other, the order alternating between rounds (CUDA events around the batch on
a GPU, ``perf_counter`` on the CPU); a batch runs at least ``--batch-ms``.  Reported per
shape: the median per-call time of each over the rounds, the spread ((max - min) / median),
and the ratio torch.matmul / lcmac.matmul (the paired median over rounds: 1.0 = as fast,
below 1 = lcmac slower), with the plan lcmac ran.  ``--numpy`` adds numpy arrays on the CPU
(numpy.matmul against lcmac.matmul).  Autograd is on (operands that do not require grad, as a
plain call runs), ``--no-grad`` times under ``torch.no_grad()``.  The smallest shape's paired
difference is the host overhead per call.  ``--out`` writes JSON with the device, date and command.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from datetime import datetime, timezone

DEFAULT_SHAPES = ("1x1x1", "8x32x64", "64x64x64", "256x256x256", "1024x512x4096")


def parse_shape(s: str) -> tuple[int, int, int]:
    try:
        M, N, K = (int(x) for x in s.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"a shape is MxNxK (e.g. 1024x512x4096), got {s!r}")
    return M, N, K


def device_name(cuda: bool) -> str:
    if cuda:
        import torch
        return torch.cuda.get_device_name()
    from lcmac.spec.device import cpu_identity
    return f"{cpu_identity().name}, {platform.machine()}, {platform.system()} {platform.release()}"


def _batch_timer(cuda: bool):
    """time(fn, n) → seconds per call of ``n`` back-to-back calls."""
    if not cuda:
        def run(fn, n):
            t = time.perf_counter()
            for _ in range(n):
                fn()
            return (time.perf_counter() - t) / n
        return run
    import torch
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def run(fn, n):
        start.record()
        for _ in range(n):
            fn()
        stop.record()
        stop.synchronize()
        return start.elapsed_time(stop) / 1e3 / n
    return run


def compare(base, mine, *, rounds: int, batch_s: float, cuda: bool) -> dict:
    """Interleaved rounds of ``base`` and ``mine``; medians, spreads and the paired ratio."""
    timer = _batch_timer(cuda)
    for fn in (base, mine):                 # warm-up: first-call decisions, allocator
        timer(fn, 20)
    n = 1
    while timer(base, n) * n < batch_s and n < 1 << 20:
        n *= 2
    t_base, t_mine = [], []
    for r in range(rounds):
        order = ((base, t_base), (mine, t_mine)) if r % 2 == 0 else ((mine, t_mine), (base, t_base))
        for fn, out in order:
            out.append(timer(fn, n))
    med_b, med_m = statistics.median(t_base), statistics.median(t_mine)
    return {"calls_per_round": n, "rounds": rounds,
            "base_us": med_b * 1e6, "lcmac_us": med_m * 1e6,
            "base_spread": (max(t_base) - min(t_base)) / med_b,
            "lcmac_spread": (max(t_mine) - min(t_mine)) / med_m,
            "ratio": statistics.median(b / m for b, m in zip(t_base, t_mine)),
            "overhead_us": statistics.median(m - b for b, m in zip(t_base, t_mine)) * 1e6}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", nargs="+", type=parse_shape,
                    default=[parse_shape(s) for s in DEFAULT_SHAPES])
    ap.add_argument("--dtype", default=None, help="default: bfloat16 on CUDA, float32 on the CPU")
    ap.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    ap.add_argument("--rounds", type=int, default=21)
    ap.add_argument("--batch-ms", type=float, default=5.0, help="least time of one timed batch")
    ap.add_argument("--numpy", action="store_true", help="also numpy arrays (CPU)")
    ap.add_argument("--threads", type=int, help="torch.set_num_threads first (CPU: one thread "
                    "keeps a loaded machine's descheduled workers out of small products)")
    ap.add_argument("--no-grad", action="store_true",
                    help="time under torch.no_grad() (default: autograd on, as a plain call runs; "
                         "the operands never require grad)")
    ap.add_argument("--out", help="write the results as JSON here")
    args = ap.parse_args(argv)

    import numpy as np
    import torch

    import lcmac
    from lcmac.api.call_args import target_for
    from lcmac.runtime import cpu_vendor
    if args.threads:
        torch.set_num_threads(args.threads)
    cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    dev = "cuda" if cuda else "cpu"
    dtype = getattr(torch, args.dtype or ("bfloat16" if cuda else "float32"))
    g = torch.Generator(device=dev).manual_seed(0)
    rows = []
    print(f"{device_name(cuda)}; torch {torch.__version__}, {torch.get_num_threads()} threads; "
          f"{str(dtype).replace('torch.', '')}")
    print(f"{'operands':8s} {'shape':>16s} {'base us':>10s} {'lcmac us':>10s} {'ratio':>7s} "
          f"{'over us':>8s} {'spread':>13s}  plan")
    kinds = ["torch"] + (["numpy"] if args.numpy and not cuda else [])
    with torch.set_grad_enabled(not args.no_grad):
        for kind in kinds:
            for M, N, K in args.shapes:
                A = torch.randn(M, K, device=dev, generator=g).to(dtype)
                B = torch.randn(K, N, device=dev, generator=g).to(dtype)
                if kind == "numpy":
                    A, B = A.float().numpy(), B.float().numpy()
                    base = lambda A=A, B=B: np.matmul(A, B)          # noqa: E731
                else:
                    base = lambda A=A, B=B: torch.matmul(A, B)       # noqa: E731
                mine = lambda A=A, B=B: lcmac.matmul(A, B)           # noqa: E731
                same = bool((base() == mine()).all())               # the vendor path: identical
                dt = "float32" if kind == "numpy" else str(dtype).replace("torch.", "")
                p = lcmac.plan(M, N, K, dt, target=target_for(dev))
                r = compare(base, mine, rounds=args.rounds, batch_s=args.batch_ms / 1e3, cuda=cuda)
                r.update(operands=kind, shape=[M, N, K], dtype=dt, plan=p.runs,
                         baseline="numpy.matmul" if kind == "numpy" else "torch.matmul",
                         identical=same)
                rows.append(r)
                print(f"{kind:8s} {f'{M}x{N}x{K}':>16s} {r['base_us']:10.2f} {r['lcmac_us']:10.2f} "
                      f"{r['ratio']:7.3f} {r['overhead_us']:8.2f} "
                      f"{r['base_spread']:6.1%}/{r['lcmac_spread']:6.1%}  {p.runs}"
                      f"{'' if same else ' (results differ)'}")
    tiny = [r for r in rows if r["operands"] == "torch"]
    tiny = min(tiny, key=lambda r: r["shape"][0] * r["shape"][1] * r["shape"][2]) if tiny else None
    if tiny is not None:
        print(f"host overhead over torch.matmul (at {'x'.join(map(str, tiny['shape']))}): "
              f"{tiny['overhead_us']:.2f} us per call")
    if args.out:
        doc = {"schema": "lcmac-bench-dispatch/1",
               "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
               "command": " ".join(["python3", "scripts/bench_dispatch.py", *sys.argv[1:]]),
               "device": device_name(cuda), "torch": torch.__version__, "numpy": np.__version__,
               "lcmac": lcmac.__version__, "threads": torch.get_num_threads(),
               "numpy_threads": cpu_vendor.numpy_threads(),
               "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
               "timing": f"{'CUDA events' if cuda else 'perf_counter'} around the batch",
               "grad_enabled": not args.no_grad,
               "ratio": "torch.matmul (numpy.matmul) time / lcmac.matmul time, paired median "
                        "over rounds",
               "host_overhead_us": None if tiny is None else tiny["overhead_us"],
               "results": rows}
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
