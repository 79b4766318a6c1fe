#!/usr/bin/env python
"""GF(2) products of bit matrices on an NVIDIA GPU: lcmac's kernels and LCMA levels, against
lcmac's own cubic kernel and torch's int8 product, in one run.

Variants, each on the same random n×n packed operands (CudaBits, already on the GPU):

    mma             the 1-bit tensor-core kernel alone (AND + count, parity): the cubic product
    bitwise         the CUDA-core kernel alone (LOP3: acc ^= a & b)
    wino-L1…        Strassen–Winograd over GF(2), 1, 2 … levels above the mma kernel
    wino-ab-L2      the alternative basis (12 core XORs a level) at 2 levels
    torch-int8      what a torch user would write: the 0/1 matrices as int8, torch._int_mm
                    (cuBLAS, int32 counts), & 1; operands unpacked beforehand (B column-major,
                    the layout cuBLASLt's int8 kernels take), not timed

Every variant's result is checked equal to the cubic mma product before timing (and that to
torch-int8's where it runs).  Rounds are interleaved (every variant once per round); each
reports the median and spread of the rounds (burst), then ``--sustained`` seconds of back-to-
back calls with the board's energy counter read around them (NVML): seconds per call, joules
per call, mean SM clock.  Effective bit operations per second = 2·n³/t (n³ ANDs and n³ XORs of
the classical product whatever the algorithm does, so saved work shows as a higher rate).

    python scripts/bench_bits_cuda.py --sizes 16384 32768 65536 --out bench/results/x.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "research"))

CONVENTION = ("effective bit operations per second = 2*n^3 / t (n^3 ANDs and n^3 XORs of the "
              "classical product)")


def make_variants(P, Q, n, levels, int8_max):
    import torch

    from lcmac.bits import gf2_matmul
    from lcmac.bits.cuda import unpack
    v = {"mma": lambda: gf2_matmul(P, Q, algo="m4r", kernel="mma"),
         "bitwise": lambda: gf2_matmul(P, Q, algo="m4r", kernel="bitwise")}
    for L in levels:
        if n // 2 ** L >= 1024:
            v[f"wino-L{L}"] = (lambda L=L: gf2_matmul(P, Q, algo="winograd", levels=L, kernel="mma"))
    if n // 4 >= 1024:
        v["wino-ab-L2"] = lambda: gf2_matmul(P, Q, algo="winograd-ab", levels=2, kernel="mma")
    if n <= int8_max:
        A8 = unpack(P).to(torch.int8)
        B8 = unpack(Q).to(torch.int8).t().contiguous().t()   # column-major: cuBLASLt's int8 layout
        v["torch-int8"] = lambda: torch._int_mm(A8, B8) & 1
    return v


def same(x, ref) -> bool:
    import torch

    from lcmac.bits.cuda import CudaBits, unpack
    if isinstance(x, CudaBits) and isinstance(ref, CudaBits):   # packed: the same words
        return x.shape == ref.shape and bool(torch.equal(x.words, ref.words))
    x = x if isinstance(x, torch.Tensor) else unpack(x)
    r = ref if isinstance(ref, torch.Tensor) else unpack(ref)
    return bool(torch.equal(x.to(torch.uint8), r.to(torch.uint8)))


def bench_size(n, args, nvml):
    import torch

    from bench_cuda import sustained

    from lcmac.bits.cuda import CudaBits
    from lcmac.tune.measure import gpu_rounds
    g = torch.Generator(device="cuda").manual_seed(n)
    words = n // 64
    P = CudaBits(torch.randint(-2 ** 63, 2 ** 63 - 1, (n, words), device="cuda", generator=g,
                               dtype=torch.int64), n, n)
    Q = CudaBits(torch.randint(-2 ** 63, 2 ** 63 - 1, (n, words), device="cuda", generator=g,
                               dtype=torch.int64), n, n)
    variants = make_variants(P, Q, n, args.levels, args.int8_max)
    ref = variants["mma"]()
    checks = {name: same(fn(), ref) for name, fn in variants.items()}
    torch.cuda.synchronize()
    bad = [k for k, ok in checks.items() if not ok]
    if bad:
        raise SystemExit(f"n={n}: {', '.join(bad)} differ from the cubic mma product")
    calls = max(1, int(args.target_s / max(1e-6, 2 * n ** 3 / 5e14)))
    times, _ = gpu_rounds(list(variants.items()), args.rounds, calls)
    row = {"n": n, "calls_per_round": calls, "checked_equal": sorted(checks), "variants": {}}
    base = statistics.median(times["mma"])
    for name, fn in variants.items():
        ts = times[name]
        med = statistics.median(ts)
        t_s, joules, clock = sustained(fn, args.sustained, nvml) if args.sustained else (None,) * 3
        row["variants"][name] = {
            "median_s": med, "rounds_s": ts, "spread": (max(ts) - min(ts)) / med,
            "effective_bops": 2 * n ** 3 / med, "vs_cubic_mma": base / med,
            "sustained_s": t_s, "sustained_effective_bops": 2 * n ** 3 / t_s if t_s else None,
            "joules_per_call": joules, "effective_bops_per_joule": 2 * n ** 3 / joules if joules else None,
            "mean_sm_clock_mhz": clock}
        r = row["variants"][name]
        sus = (f"  sustained {r['sustained_effective_bops'] / 1e15:6.3f} Pbop/s"
               + (f" {joules / t_s:5.0f} W {clock:5.0f} MHz" if joules else "")) if t_s else ""
        print(f"  n={n:6d} {name:12s} {med * 1e3:10.3f} ms  spread {r['spread'] * 100:4.1f}%  "
              f"{r['effective_bops'] / 1e15:6.3f} Pbop/s  {r['vs_cubic_mma']:5.2f}x cubic{sus}",
              flush=True)
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--sizes", type=int, nargs="+", default=[8192, 16384, 32768])
    ap.add_argument("--levels", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--target-s", type=float, default=0.05, help="about this long per round and variant")
    ap.add_argument("--sustained", type=float, default=2.0, help="seconds of back-to-back calls (0: none)")
    ap.add_argument("--int8-max", type=int, default=32768, help="largest n for torch-int8 (its int32 C is 4n² bytes)")
    ap.add_argument("--out", help="write the results as JSON here")
    args = ap.parse_args(argv)
    import torch
    if not torch.cuda.is_available():
        print("bench_bits_cuda: no CUDA GPU", file=sys.stderr)
        return 2
    try:
        from probe_energy import Nvml
        nvml = Nvml()
    except Exception as e:  # noqa: BLE001 - no NVML: times only
        print(f"# no NVML ({e}): no energy figures")
        nvml = None
    name = torch.cuda.get_device_name(0)
    print(f"# {name}, torch {torch.__version__}; {CONVENTION}")
    results = [bench_size(n, args, nvml) for n in args.sizes]
    if args.out:
        from lcmac.bits.cuda import AUTO_KERNEL
        from lcmac.tune.measure import run_header
        doc = {**run_header("GF(2) products on the GPU: lcmac kernels and LCMA levels", name,
                            __file__, argv), "torch": torch.__version__, "convention": CONVENTION,
               "auto_kernel": AUTO_KERNEL, "results": results}
        Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
