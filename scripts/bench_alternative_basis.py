#!/usr/bin/env python
"""Winograd against its alternative-basis pair (``lcmac.api.alternative``) on lcmac's real-valued
kernels, with torch.matmul, in one run; the cost model's prediction beside each.

Variants at each n (square, ``--dtype``, operands on the GPU, or numpy on this CPU with
``--device cpu``):

    torch             torch.matmul (cuBLAS), or numpy's matmul on the CPU
    winograd          lcmac's Winograd kernel (one level), its tuned config
    ab                ab_matmul: φ(A), ψ(B), the pair's core kernel (the same config), υ⁻¹(C)
    ab-in-basis       the core kernel alone on operands already in the basis, C left in it
                      (what a chained product with a static B pays)

Every result is checked against float64 (ab-in-basis after ``from_basis``).  Rounds are
interleaved; median and spread of ``--rounds``.

    python scripts/bench_alternative_basis.py --sizes 16384 32768 --out bench/results/x.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--sizes", type=int, nargs="+", default=[16384, 32768])
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    import numpy as np

    from lcmac.api.alternative import ab_matmul, from_basis, pair_for, to_basis
    from lcmac.artifact.build import build_config, resolve_target
    from lcmac.artifact.cache import cached_build
    from lcmac.costmodel.alternative_basis import compare
    from lcmac.costmodel import profile_for_target
    from lcmac.ir.catalogue import get
    from lcmac.runtime.loader import load
    from lcmac.tune.measure import run_header
    cuda = args.device == "cuda"
    if cuda:
        import torch
        from lcmac.tune.measure import gpu_rounds
        dev = torch.cuda.get_device_name(0)
    else:
        dev = "this CPU"
    target = resolve_target("cuda" if cuda else None)
    profile = profile_for_target(target.name)
    wino, pair = get("winograd"), pair_for("winograd-ab")
    rows = []
    for n in args.sizes:
        shape = (n, n, n)
        cfg = build_config(target, args.dtype, None, wino, False, shape, notes=[])
        f_w = load(cached_build(wino, target, args.dtype, shape, config=cfg).manifest)
        if cuda:
            g = torch.Generator(device="cuda").manual_seed(n)
            td = getattr(torch, args.dtype)
            A = torch.randn(n, n, device="cuda", generator=g).to(td)
            B = torch.randn(n, n, device="cuda", generator=g).to(td)
            ref = (A[:256].double() @ B.double())
        else:
            rng = np.random.default_rng(n)
            A = rng.standard_normal((n, n)).astype(args.dtype)
            B = rng.standard_normal((n, n)).astype(args.dtype)
            ref = A[:256].astype(np.float64) @ B.astype(np.float64)
        A1, B1 = to_basis(A, pair, "A"), to_basis(B, pair, "B")
        variants = {"torch": lambda: A @ B, "winograd": lambda: f_w(A, B),
                    "ab": lambda: ab_matmul(A, B, pair, config=cfg),
                    "ab-in-basis": lambda: ab_matmul(A1, B1, pair, inputs_in_basis=True,
                                                     output_in_basis=True, config=cfg)}
        errors = {}
        for name, fn in variants.items():
            C = fn()
            if name == "ab-in-basis":
                C = from_basis(C, pair)
            d = (C[:256].double() - ref) if cuda else (C[:256].astype(np.float64) - ref)
            errors[name] = float((d ** 2).sum() ** 0.5 / (ref ** 2).sum() ** 0.5)
        if cuda:
            times, _ = gpu_rounds(list(variants.items()), args.rounds, 3)
        else:
            times = {k: [] for k in variants}
            for _ in range(args.rounds):
                for k, fn in variants.items():
                    t0 = time.perf_counter()
                    fn()
                    times[k].append(time.perf_counter() - t0)
        model = {"single": compare(wino, pair, n, n, n, args.dtype, profile).to_dict(),
                 "chained_static_b": compare(wino, pair, n, n, n, args.dtype, profile,
                                             static_b=True, chained=True).to_dict()}
        row = {"n": n, "config": cfg, "model": model, "variants": {}}
        base = statistics.median(times["winograd"])
        for k, ts in times.items():
            med = statistics.median(ts)
            row["variants"][k] = {"median_s": med, "rounds_s": ts, "spread": (max(ts) - min(ts)) / med,
                                  "rel_error": errors[k], "winograd_over_this": base / med,
                                  "tflops": 2 * n ** 3 / med / 1e12}
            print(f"  n={n} {k:12s} {med * 1e3:9.3f} ms  spread {row['variants'][k]['spread'] * 100:4.1f}%  "
                  f"{base / med:6.3f}x winograd  err {errors[k]:.2e}", flush=True)
        print(f"  model: ab {model['single']['speedup']:.4f}x winograd, in basis with a static B "
              f"{model['chained_static_b']['speedup']:.4f}x")
        rows.append(row)
    if args.out:
        doc = {**run_header("Winograd against its alternative-basis pair on lcmac kernels", dev,
                            __file__, argv), "dtype": args.dtype, "results": rows}
        Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
