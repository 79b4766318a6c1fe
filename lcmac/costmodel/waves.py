"""Wave quantisation on GPUs and the on-chip fit check.

Tiles and groups
----------------
An LCMA ``<m,k,n;R>`` on an M×N output computes R block products, each with an
(M/m)×(N/n) output.  Cut into ``bm×bn`` output tiles, one product has
``T = ceil(M/m / bm) · ceil(N/n / bn)`` tiles, the GEMM stage ``R·T`` H-tiles.  A *group* is
the R H-tiles that sit at the same tile position of every product: together they feed the
m·n C tiles at that position, so a fused Combine H (H never written) wants a group's tiles
scheduled together.  There are ``T`` groups of ``R`` tiles.

Three schedules over P units (SMs), one tile taking one unit-slot of time:

* per-tile      each H-tile is an independent CTA (a batched GEMM, unfused Combine H):
                ``ceil(R·T / P)`` waves.
* whole-group   one CTA runs a whole group (R tiles back to back):
                ``ceil(T / P) · R`` waves: the last round of groups leaves SMs idle for R
                tile-times.
* split-group   persistent CTAs walk the group-ordered tile list in P contiguous chunks;
                a group cut by a chunk boundary is finished by two units (their partial C
                tiles meet in L2), so the waves are ``ceil(R·T / P)`` again while all
                other groups stay whole.

FalconGEMM's worked example (Strassen, 4096³, 128×128 tiles, H20 with 78 SMs):
T = 16·16 = 256 groups, R·T = 1792 H-tiles; per-tile and split-group need
ceil(1792/78) = 23 waves, whole-group ceil(256/78)·7 = 4·7 = 28 waves.
(The paper text was not retrievable here beyond its abstract; these formulas are derived
from the definitions above and reproduce both numbers.)
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from math import ceil, gcd

from lcmac.core.dtypes import ITEMSIZE, normalize_model_dtype

from lcmac.spec.profiles import HardwareProfile, get_profile

SCHEDULES = ("per-tile", "whole-group", "split-group")


@dataclass(frozen=True)
class WaveAnalysis:
    tile: tuple[int, int]
    units: int
    tiles_per_product: int      # T: tile positions of one product = number of groups
    products: int               # R: group size
    waves_per_tile: int
    waves_whole_group: int
    waves_split_group: int
    split_groups: int           # groups cut across two units by the split-group schedule

    @property
    def tiles(self) -> int:
        return self.tiles_per_product * self.products

    @property
    def groups(self) -> int:
        return self.tiles_per_product

    @property
    def group_size(self) -> int:
        return self.products

    def waves(self, schedule: str = "split-group") -> int:
        if schedule == "per-tile":
            return self.waves_per_tile
        if schedule == "whole-group":
            return self.waves_whole_group
        if schedule == "split-group":
            return self.waves_split_group
        raise ValueError(f"unknown schedule {schedule!r}; choose one of {', '.join(SCHEDULES)}")

    def efficiency(self, schedule: str = "split-group") -> float:
        """Busy fraction of the unit-slots: tiles / (waves · units)."""
        return self.tiles / (self.waves(schedule) * self.units)

    def to_dict(self) -> dict:
        return {"tile": list(self.tile), "units": self.units, "tiles": self.tiles,
                "groups": self.groups, "group_size": self.group_size,
                "waves": {s: self.waves(s) for s in SCHEDULES},
                "efficiency": {s: round(self.efficiency(s), 6) for s in SCHEDULES},
                "split_groups": self.split_groups}


def _split_groups(tiles: int, R: int, units: int) -> int:
    """Groups a contiguous P-way partition of the group-ordered tile list cuts in two: of the
    chunk boundaries pos_j = j·q + min(j, r) (j = 1 … P−1; q, r = divmod(tiles, P)) inside
    the list, those that are not a multiple of R.  Counted in closed form, not by walking
    the P boundaries."""
    if units <= 1 or R <= 1:
        return 0
    q, r = divmod(tiles, units)
    if q == 0:                  # boundaries 1 … tiles−1, then the rest sit at the end
        return (tiles - 1) - (tiles - 1) // R
    # every boundary is inside; pos_j = j·(q+1) up to j = r, then j·q + r
    return (units - 1) - _solutions(q + 1, 0, R, 1, r) - _solutions(q, r, R, r + 1, units - 1)


def _solutions(c: int, d: int, R: int, a: int, b: int) -> int:
    """How many integers j in [a, b] have c·j + d ≡ 0 (mod R)."""
    if a > b:
        return 0
    g = gcd(c, R)
    if d % g:
        return 0
    step = R // g
    j0 = (-(d // g) * pow(c // g, -1, step)) % step
    return (b - j0) // step - (a - 1 - j0) // step


def wave_analysis(M: int, N: int, *, units: int, tile=(128, 128), m: int = 1, n: int = 1,
                  R: int = 1) -> WaveAnalysis:
    """Tiles, groups and waves of the GEMM stage of an LCMA with output grid m×n and rank R
    (``m=n=R=1`` is the plain GEMM) on ``units`` SMs with ``bm×bn`` output tiles."""
    bm, bn = int(tile[0]), int(tile[1])
    if min(M, N, units, bm, bn, m, n, R) < 1:
        raise ValueError("M, N, units, tile sizes, m, n and R must all be positive")
    return _wave_analysis(M, N, units, bm, bn, m, n, R)


@functools.lru_cache(maxsize=1 << 14)
def _wave_analysis(M, N, units, bm, bn, m, n, R) -> WaveAnalysis:
    # memoised: a ranking asks the same grid for many candidates and for both Combine-H
    # variants, and the split count walks every unit
    T = ceil(ceil(M / m) / bm) * ceil(ceil(N / n) / bn)
    tiles = R * T
    return WaveAnalysis(tile=(bm, bn), units=units, tiles_per_product=T, products=R,
                        waves_per_tile=ceil(tiles / units),
                        waves_whole_group=ceil(T / units) * R,
                        waves_split_group=ceil(tiles / units),
                        split_groups=_split_groups(tiles, R, units))


def waves_for(alg, M: int, N: int, profile, tile=(128, 128)) -> WaveAnalysis:
    """``wave_analysis`` for an ``Algorithm`` (or None for plain GEMM) on a profile."""
    p = get_profile(profile) if not isinstance(profile, HardwareProfile) else profile
    if alg is None:
        return wave_analysis(M, N, units=p.units, tile=tile)
    return wave_analysis(M, N, units=p.units, tile=tile, m=alg.m, n=alg.n, R=alg.R)


# ---- on-chip fit -------------------------------------------------------------------------
@dataclass(frozen=True)
class FitReport:
    fits: bool
    onchip_bytes: int           # GPU: shared memory; CPU: L1-resident B micro-panel
    onchip_limit: int
    register_bytes: int         # accumulators
    register_limit: int
    l2_bytes: int = 0           # CPU: A block in L2
    l2_limit: int = 0
    reason: str = ""

    def __bool__(self):
        return self.fits

    def to_dict(self) -> dict:
        return dict(self.__dict__)


#: fraction of the register file a CTA's accumulators may take (the rest: operand
#: fragments, addresses); 128×256 fp32 accumulators (128 KiB) fit Hopper's 256 KiB at 0.5.
GPU_ACC_REG_FRACTION = 0.5
#: CPU: share of the vector register file for the micro-tile accumulators; share of L1 for
#: the kc×nr B micro-panel and of L2 for the mc×kc A block.
CPU_ACC_REG_FRACTION = 0.75
CPU_L1_FRACTION = 0.5
CPU_L2_FRACTION = 1.0        # measured: an mc×kc A block of a whole L2 (mc=504, kc=1024) was fastest
CPU_PANEL_L2_FRACTION = 0.25


def onchip_fit(profile, dtype, config: dict) -> FitReport:
    """Does a kernel config fit on chip?  Used by the tuner to prune before compiling.

    GPU config keys: ``block_m``, ``block_n``, ``block_k``, ``stages`` (pipeline depth,
    default 3), ``accumulators`` (fp32 bm×bn accumulator tiles held per CTA, default 1;
    a fused Combine H that keeps the m·n C tiles on chip needs 1 + m·n),
    ``acc_in_smem`` (accumulators beyond the register budget may live in shared memory,
    default False), ``epilogue_smem`` (stage C through shared memory, default True).
    CPU config keys: ``mr``, ``nr`` (register micro-tile), ``kc``, ``mc`` (cache blocks).
    """
    p = get_profile(profile) if not isinstance(profile, HardwareProfile) else profile
    d = normalize_model_dtype(dtype)
    s = ITEMSIZE[d]
    acc = 8 if d == "float64" else 4
    if p.kind == "gpu":
        bm, bn, bk = (int(config[k]) for k in ("block_m", "block_n", "block_k"))
        stages = int(config.get("stages", 3))
        nacc = int(config.get("accumulators", 1))
        smem = stages * (bm * bk + bk * bn) * s
        if config.get("epilogue_smem", True):
            smem += bm * bn * max(s, 2)
        regs = nacc * bm * bn * acc
        reg_limit = int(p.regs_per_unit * GPU_ACC_REG_FRACTION)
        if config.get("acc_in_smem", False) and regs > reg_limit:
            smem += regs - reg_limit
            regs = reg_limit
        fits = smem <= p.onchip_per_unit and regs <= reg_limit
        why = "" if fits else (
            f"shared memory {smem} B > {p.onchip_per_unit} B" if smem > p.onchip_per_unit
            else f"accumulators {regs} B > {reg_limit} B of registers")
        return FitReport(fits, smem, p.onchip_per_unit, regs, reg_limit, reason=why)
    mr, nr = int(config.get("mr", 8)), int(config.get("nr", 32))
    kc, mc = int(config.get("kc", 128)), int(config.get("mc", 64))
    regs = mr * nr * acc
    reg_limit = int(p.regs_per_unit * CPU_ACC_REG_FRACTION)
    l1 = kc * nr * s
    # The B micro-panel is re-read for every mr rows; it may outgrow L1 and stream from L2
    # with prefetch, and the longer kc still wins on AVX-512 (bench/experiments/cpu.md).
    l1_limit = int(max(p.onchip_per_unit * CPU_L1_FRACTION, p.l2_bytes * CPU_PANEL_L2_FRACTION))
    l2 = mc * kc * s
    l2_limit = int(p.l2_bytes * CPU_L2_FRACTION)
    fits = regs <= reg_limit and l1 <= l1_limit and l2 <= l2_limit
    why = "" if fits else ("; ".join(x for x, bad in (
        (f"micro-tile accumulators {regs} B > {reg_limit} B of vector registers", regs > reg_limit),
        (f"B micro-panel {l1} B > {l1_limit} B (L1, streamed from L2)", l1 > l1_limit),
        (f"A block {l2} B > {l2_limit} B of L2", l2 > l2_limit)) if bad))
    return FitReport(fits, l1, l1_limit, regs, reg_limit, l2, l2_limit, reason=why)
