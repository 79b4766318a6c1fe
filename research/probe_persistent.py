#!/usr/bin/env python
"""Probe: does a persistent batched GEMM hide the per-tile start and store that a grid of
one-tile CTAs pays?

Strassen²'s 49 products at 16384³ are 4096³ GEMMs: each 128x256 tile runs a 64-step K loop,
and a one-tile CTA fills its pipeline after launch and drains it to store before the next CTA
can start on that SM.  The persistent form here runs one pipeline over every (tile, k) step
of a CTA, so the TMA producer already loads the next tile's first slabs while the consumers
store the last one.  Timed in one process on the GPU present (CUDA events):

- ``grid``: lcmac's batched GEMM (Algorithm 1's GEMM stage, cache-aware order);
- ``persist-smem``: persistent, one pipeline over (tile, k), 3 stages + a 64 KB output tile
  stored through shared memory (TMA);
- ``persist-reg``: the same with 4 stages, the output stored from registers;
- ``cublas``: torch.matmul at the full size, for scale.

Checked first: each persistent kernel's H equals the grid kernel's bit for bit.

    python research/probe_persistent.py --out bench/results/h100-bfloat16-persistent.json
"""
import argparse, json, os, sys, time

# bench_cuda.py (scripts/) holds the timers and the record head these probes share
SCRIPTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts")

import tilelang
import tilelang.language as T


def persistent_bgemm(R: int, h: int, P: int, bm=128, bn=256, bk=64, stages=3, panel=8,
                     via_smem=True):
    """H_r = At_r · Bt_r for all r; P CTAs, CTA pid takes tiles pid, pid + P, ... in the
    grid kernel's order (r slowest, TileLang's rasterization2DRow within a product)."""
    from lcmac.schedules.cuda.common import raster as _raster
    gx, gy, nk = h // bn, h // bm, h // bk
    tiles = R * gx * gy

    @T.prim_func
    def persist(At: T.Tensor((R, h, h), "bfloat16"), Bt: T.Tensor((R, h, h), "bfloat16"),
                H: T.Tensor((R, h, h), "bfloat16")):
        with T.Kernel(P, threads=256) as pid:
            A_s = T.alloc_shared((bm, bk), "bfloat16")
            B_s = T.alloc_shared((bk, bn), "bfloat16")
            C_l = T.alloc_fragment((bm, bn), "float32")
            C_s = T.alloc_shared((bm, bn), "bfloat16")
            for it in T.Pipelined(T.ceildiv(tiles - pid, P) * nk, num_stages=stages):
                ko = it % nk
                t = (it // nk) * P + pid
                r = t // (gx * gy)
                by, bx = _raster(t % (gx * gy), gx, gy, panel)
                T.copy(At[r, by * bm:(by + 1) * bm, ko * bk:(ko + 1) * bk], A_s)
                T.copy(Bt[r, ko * bk:(ko + 1) * bk, bx * bn:(bx + 1) * bn], B_s)
                T.gemm(A_s, B_s, C_l, policy=T.GemmWarpPolicy.FullRow, clear_accum=ko == 0)
                if ko == nk - 1:
                    if via_smem:
                        T.copy(C_l, C_s)
                        T.copy(C_s, H[r, by * bm:(by + 1) * bm, bx * bn:(bx + 1) * bn])
                    else:
                        T.copy(C_l, H[r, by * bm:(by + 1) * bm, bx * bn:(bx + 1) * bn])

    return persist


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=16384)
    ap.add_argument("--levels", type=int, nargs="+", default=[2, 1],
                    help="1: 7 products of n/2; 2: 49 products of n/4")
    ap.add_argument("--sms", type=int, default=0, help="persistent CTAs (0: the GPU's SM count)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--sustained", type=float, default=2.0)
    ap.add_argument("--source-only", action="store_true", help="print the generated CUDA and stop")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    n = args.n
    if args.source_only:
        from lcmac.targets.tilelang_worker import lower_to_cuda
        print(lower_to_cuda(persistent_bgemm(49, n // 4, args.sms or 132), "sm_90a"))
        return
    import torch
    sys.path.insert(0, SCRIPTS)
    from bench_cuda import burst_and_sustained, probe_record
    from lcmac.spec.cuda import Blocking, CudaConfig
    from lcmac.schedules.cuda.gemm import batched_gemm
    tgt = {"kind": "cuda", "arch": "sm_90a"}
    P = args.sms or torch.cuda.get_device_properties(0).multi_processor_count
    g = torch.Generator(device="cuda").manual_seed(0)
    A = torch.randn(n, n, device="cuda", dtype=torch.bfloat16, generator=g)
    B = torch.randn(n, n, device="cuda", dtype=torch.bfloat16, generator=g)
    C = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
    out = probe_record("persistent batched GEMM (one pipeline over every (tile, k) step) vs the grid kernel",
                       n=n, ctas=P, levels={})

    def timed(name, fn, flops, into):
        burst_and_sustained(name, fn, flops, args.reps, args.sustained, into)

    timed("cublas", lambda: torch.matmul(A, B, out=C), 2.0 * n ** 3, out)
    for lv in args.levels:
        R, h = 7 ** lv, n // 2 ** lv
        t0 = time.time()
        kern = {"grid": tilelang.compile(batched_gemm(Blocking(M=2 * h, N=2 * h, K=2 * h, m=2, k=2, n=2, R=R),
                                                      "bfloat16", CudaConfig()), target=tgt),
                "persist-smem": tilelang.compile(persistent_bgemm(R, h, P), target=tgt),
                "persist-reg": tilelang.compile(persistent_bgemm(R, h, P, stages=4, via_smem=False),
                                                target=tgt)}
        print(f"level {lv}: {R} products of {h}³, compiled in {time.time() - t0:.0f} s", flush=True)
        At = torch.randn(R, h, h, device="cuda", dtype=torch.bfloat16, generator=g)
        Bt = torch.randn(R, h, h, device="cuda", dtype=torch.bfloat16, generator=g)
        Hs = {k: torch.empty(R, h, h, device="cuda", dtype=torch.bfloat16) for k in kern}
        for k, f in kern.items():
            f(At, Bt, Hs[k])
        torch.cuda.synchronize()
        res = {"products": R, "block": h}
        for k in kern:
            if k != "grid":
                res[f"{k}_identical"] = bool(torch.equal(Hs[k], Hs["grid"]))
                print(f"  {k} == grid: {res[f'{k}_identical']}")
        for k, f in kern.items():
            timed(f"L{lv}-{k}", (lambda f=f, H=Hs[k]: f(At, Bt, H)), 2.0 * R * h ** 3, res)
        out["levels"][str(lv)] = res
        del At, Bt, Hs
        torch.cuda.empty_cache()
    if args.out:
        open(args.out, "w").write(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
