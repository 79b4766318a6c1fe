"""A clock-cycle model of batched small products (``schedules.cuda.small``: one CTA per output
tile of one product, a K loop over shared-memory slabs).

One CTA's life, in SM clock cycles, with ``num_k = ceil(K / bk)`` slabs:

    load   = L + (bm·bk + bk·bn)·s / β_sm            one slab from memory: latency L plus its bytes
                                                     at the SM's share β_sm of DRAM bandwidth
    mma    = 2·bm·bn·bk / F_w                        one slab's tensor-core work; F_w = the flops
                                                     per cycle the CTA's warps reach (a warp
                                                     drives one of the SM's 4 tensor cores)
    cta    = load + (P·num_k − 1)·step + mma + P·store − (P − 1)·L
                                                     step = max(load, mma) / min(stages, 2)^*
    store  = L + bm·bn·s / β_sm

for a CTA running P products (``products_per_cta``) in one pipeline.  (* with two or more
stages the next slab's load overlaps this slab's multiply; the first load is never hidden,
and each product's store pays its bytes, the latency only once: stores do not wait.)  An SM holds ``c`` CTAs at once (limited by 32 blocks, 2048
threads and its shared memory), which overlap, so the SM's time per wave is ``cta`` and
its ``c`` tiles share the bandwidth:

    waves  = ceil(tiles / (SMs · c))
    t      = max(waves · cta / f,  bytes / BW,  flops / F_peak)

where ``bytes = batch·(M·K + K·N + M·N)·s`` (each product's operands read once, C written
once) and ``f`` the SM clock.

Worked example (H100 SXM: 132 SMs, f = 1.755 GHz, BW = 3.35 TB/s, so β_sm = BW / (132·f) =
14.46 B/cycle; F_w = 989.4 TFLOP/s / (132·f) = 4271 flop/cycle for a warpgroup; L = 800
cycles; bf16, 10 000 products of 128³, tile 128×128×64, 128 threads, 2 stages): load = 800 +
32768/14.46 = 3066, mma = 2·128·128·64/4271 = 491, store = 3066, step = 3066/2 = 1533,
cta = 3066 + 1·1533 + 491 + 3066 = 8156 cycles; 2 stages × 32 KiB of shared memory → c = 3
CTAs per SM (228 KiB), waves = ceil(10000 / 396) = 26, 26·8156/f = 121 µs; bytes =
10000·3·32768 = 983 MB → 293 µs at 3.35 TB/s: memory-bound, so no kernel, cuBLAS's batched
GEMM included, beats 293 µs here, and an LCMA's saved multiplications buy nothing.  L and the
bandwidth share are priors, not measured.
"""
from __future__ import annotations

from dataclasses import dataclass
from math import ceil

from lcmac.core.dtypes import ITEMSIZE
from lcmac.spec.profiles import HardwareProfile, get_profile

#: the SM clock the H100's peak rates are quoted at (boost), Hz
SM_CLOCK_HZ = 1.755e9
#: DRAM round trip seen by a CTA's first load, cycles (a prior)
LATENCY_CYCLES = 800
#: per-SM limits on sm_90
MAX_CTAS_PER_SM, MAX_THREADS_PER_SM = 32, 2048


@dataclass(frozen=True)
class SmallEstimate:
    cta_cycles: float           # one CTA's life
    ctas_per_sm: int
    waves: int
    t_latency: float            # waves · cta / f
    t_memory: float             # DRAM bytes / bandwidth
    t_compute: float            # flops / peak
    t: float                    # the largest of the three

    @property
    def bound(self) -> str:
        return max((self.t_latency, "latency"), (self.t_memory, "memory"),
                   (self.t_compute, "compute"))[1]


def predict_batched(M: int, N: int, K: int, dtype: str, batch: int, tile: dict,
                    profile: HardwareProfile | str = "h100") -> SmallEstimate:
    """The model above for ``batch`` products of (M, N, K) with ``tile`` (block_m, block_n,
    block_k, threads, stages, products_per_cta: the keys of
    ``schedules.cuda.batched_tiles.small_tile_defaults``)."""
    p = get_profile(profile) if isinstance(profile, str) else profile
    s = ITEMSIZE[dtype]
    bm, bn, bk = tile["block_m"], tile["block_n"], tile["block_k"]
    threads, stages = tile["threads"], tile["stages"]
    peak = p.mul_flops.get("tfloat32" if dtype == "float32" else dtype, 0.0)   # float32 runs TF32
    per_sm_cycle = peak / (p.units * SM_CLOCK_HZ)           # the SM's flops per cycle
    warps = max(1, threads // 32)
    f_w = per_sm_cycle * min(warps, 4) / 4
    beta = p.mem_bw / (p.units * SM_CLOCK_HZ)                # bytes per cycle per SM
    load = LATENCY_CYCLES + (bm * bk + bk * bn) * s / beta
    mma = 2.0 * bm * bn * bk / f_w
    store = LATENCY_CYCLES + bm * bn * s / beta
    num_k = ceil(K / bk)
    per_cta = tile.get("products_per_cta", 1)
    step = max(load, mma) / min(stages, 2)
    cta = load + (per_cta * num_k - 1) * step + mma + per_cta * store - (per_cta - 1) * LATENCY_CYCLES
    smem = stages * (bm * bk + bk * bn) * s
    # TileLang's TMA-fed kernels on sm_90a add a producer warpgroup (128 threads); float64's
    # copies are cp.async (schedules.cuda.small), issued by the consumers themselves
    resident = threads + (0 if dtype == "float64" else 128)
    c = max(1, min(MAX_CTAS_PER_SM, MAX_THREADS_PER_SM // resident,
                   p.onchip_per_unit // max(smem, 1)))
    tiles = ceil(batch / per_cta) * ceil(M / bm) * ceil(N / bn)
    waves = ceil(tiles / (p.units * c))
    t_lat = waves * cta / SM_CLOCK_HZ
    t_mem = batch * (M * K + K * N + M * N) * s / p.mem_bw
    t_cmp = 2.0 * batch * M * N * K / peak if peak else 0.0
    return SmallEstimate(cta, c, waves, t_lat, t_mem, t_cmp, max(t_lat, t_mem, t_cmp))


def bmm_floor(M: int, N: int, K: int, dtype: str, batch: int,
              profile: HardwareProfile | str = "h100") -> float:
    """Seconds to move each product's A and B in and C out once at the DRAM bandwidth: no
    batched GEMM, the vendor's included, is faster."""
    p = get_profile(profile) if isinstance(profile, str) else profile
    return batch * (M * K + K * N + M * N) * ITEMSIZE[dtype] / p.mem_bw
