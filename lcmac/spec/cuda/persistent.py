"""The persistent grid: CTAs per SM, the static schedule of the persistent fused kernel
(``PersistentPlan``) and the rasterised tile order its CTAs walk."""
from __future__ import annotations

from dataclasses import asdict, dataclass

from lcmac.core.dtypes import ITEMSIZE
from lcmac.spec.cuda.blocking import Blocking, ceil_div
from lcmac.spec.cuda.smem import SMEM_PER_CTA


def ctas_per_sm(cfg: "CudaConfig", dtype: str, smem_per_sm: int = SMEM_PER_CTA["sm_90a"],
                regs_per_sm: int = 65536) -> int:
    """CTAs of the fused kernel that fit on one SM at once (shared memory of the pipeline,
    accumulator registers of the consumers; the TMA producer warpgroup adds 128 threads)."""
    bk = cfg.bk(dtype)
    smem = cfg.stages * (cfg.block_m * bk + bk * cfg.block_n) * ITEMSIZE[dtype] + 1024
    regs = cfg.threads * (cfg.block_m * cfg.block_n // cfg.threads + 40) + 128 * 40
    return max(1, min(smem_per_sm // smem, regs_per_sm // regs, 2048 // (cfg.threads + 128)))


@dataclass(frozen=True)
class PersistentPlan:
    """The static schedule of the persistent fused kernel (shape, tile, R and P are known at
    compile time, so every index below is a constant or an affine function of the CTA id).

    Groups g = 0..T-1 (one per tile position, rasterised like TileLang's 2-D row swizzle).
    Rounds: CTA u runs groups u, u+P, … (``rounds`` of them), whole, all CTAs walking the
    products in the same order (cache-aware).  Tail: the last ``rem`` groups form a list of
    rem·R steps, cut into chunks of ``Lt`` steps; CTA u runs steps [u·Lt, (u+1)·Lt).  With
    Lt < R a group spans several CTAs: its *lead* piece (the one holding its first step) adds
    into C like a whole group, every other piece accumulates into fp32 workspace slot u (one
    per CTA: a chunk of ≤ R steps starts mid-group at most once), and the fixup kernel adds
    the slots of each tail group into C in CTA order."""
    P: int
    T: int
    R: int
    gx: int
    gy: int
    rounds: int
    rem: int
    Lt: int
    split: bool
    tail_ctas: int
    max_pieces: int

    @property
    def tail_steps(self) -> int:
        return self.rem * self.R

    @property
    def waves(self) -> int:
        """Product-times (one bm×bn×K tile product each) of the busiest CTA."""
        return self.rounds * self.R + (self.Lt if self.rem else 0)

    @property
    def slots(self) -> int:
        return self.tail_ctas if self.split else 0

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(waves=self.waves, slots=self.slots)
        return d


def persistent_plan(blk: Blocking, cfg: "CudaConfig", dtype: str, units: int) -> PersistentPlan:
    """``units``: SMs of the GPU the artifact is built for (from the target's profile)."""
    P = cfg.persistent_ctas or units * ctas_per_sm(cfg, dtype)
    gx, gy = ceil_div(blk.Nb, cfg.block_n), ceil_div(blk.Mb, cfg.block_m)
    T, R = gx * gy, blk.R
    rounds, rem = divmod(T, P)
    Lt = ceil_div(rem * R, P) if (cfg.split_group and rem) else R
    split = Lt < R
    if not split:
        Lt = R
    tail_ctas = ceil_div(rem * R, Lt) if rem else 0
    mp = 1
    if rem:
        mp = max((gt * R + R - 1) // Lt - (gt * R) // Lt + 1 for gt in range(rem))
    return PersistentPlan(P=P, T=T, R=R, gx=gx, gy=gy, rounds=rounds, rem=rem, Lt=Lt,
                          split=split, tail_ctas=tail_ctas, max_pieces=mp)


def raster(g: int, gx: int, gy: int, panel: int) -> tuple[int, int]:
    """(row, col) tile position of linear index g: TileLang's rasterization2DRow (what
    ``T.use_swizzle(panel)`` does to a gx × gy grid); ``common.raster`` emits the same."""
    if panel <= 0:
        return g // gx, g % gx
    psize = panel * gx
    off, idx = g % psize, g // psize
    last = (gx * gy - 1) // psize
    stride = panel if idx < last else gy - last * panel
    col = gx - 1 - off // stride if idx % 2 == 1 else off // stride
    return off % stride + idx * panel, col
