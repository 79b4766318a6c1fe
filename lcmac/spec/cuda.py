"""Configs and shape bookkeeping for the CUDA (TileLang) templates.

Nothing here imports TileLang: the runtime, the tests, the cost model and the tuner read
these without a compiler.  The templates live beside it (``gemm``, ``combines``, ``fused``,
``low_precision``) and are imported only inside the TileLang worker process.  What the
knobs do and why the defaults are what they are: docs/cuda-templates.md.

Layout of an LCMA run on the GPU (one artifact, one shape M×N×K, row-major operands):

    A (M×K) ──combine_a──► Ã  [R, Mb, Kb]   (workspace)
    B (K×N) ──combine_b──► B̃  [R, Kb, Nb]   (workspace)
    fused:    C_ij tile += W[r,i,j] · (Ã_r · B̃_r) tile, r in a fixed order, per CTA
    unfused:  H [R, Mb, Nb] = batched GEMM;  C = combine_h(H)

Mb = ceil(M/m) rounded up to a multiple of 8 (16-byte rows for TMA), likewise Kb, Nb; the
padding is zero in Ã, B̃ (the combine kernels read A, B masked), and rows/columns of C beyond
M, N are never written.
"""
from __future__ import annotations

import math
import struct
from dataclasses import asdict, dataclass, field, fields, replace

import numpy as np

from lcmac.core.dtypes import ITEMSIZE
from lcmac.core.errors import LcmacError, ShapeError


class NotSupportedYet(LcmacError, NotImplementedError):
    """A feature of the CUDA backend that is not implemented yet (named in the message)."""


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def round_up(a: int, b: int) -> int:
    return ceil_div(a, b) * b


@dataclass(frozen=True)
class CudaConfig:
    """Template options the tuner may vary (docs/cuda-templates.md: each knob, its default
    and the measurements behind it).

    fused        True: group-parallel combines + fused GEMM/Combine-H kernel (FalconGEMM);
                 False: Algorithm 1 (combines, batched GEMM writing H, Combine-H kernel).
    block_*      GEMM tile (a CTA owns a block_m × block_n tile position of every C_ij);
                 block_k 0: 64 for 2-byte dtypes, 32 for float32, 16 for float64
                 (128 bytes of a row; shared-memory fit).
    stages       software-pipeline depth of the K loop (TMA + mbarriers on sm_90a).
    threads      consumer threads per CTA (TileLang adds a producer warpgroup on sm_90a).
    swizzle      threadblock rasterisation panel (0 = off) for L2 reuse.
    policy       warpgroup split: "square", "fullrow" (64×256 wgmma), "fullcol", or "auto"
                 (fullrow for 2-byte types, square for float32).
    r_order      "natural" (r = 0..R-1) or "greedy" (an order that finishes C tiles early;
                 only affects the epilogue traffic, the result is the same up to rounding).
    cache_aware  CTAs resident at the same time work on the same product r and share its
                 Ã_r/B̃_r panels in L2 (FalconGEMM's cache-aware order).  Unfused: r is the
                 slowest grid index; False makes r the fastest (the ablation).  Fused: every
                 CTA walks its group's products in the same order; False rotates each
                 group's walk by its tile position, an ablation the build refuses (it hangs).
    overlap_epilogue  one software pipeline over all (r, k) steps of a CTA, so the TMA producer
                 loads the next product's tiles while the consumers run the Combine-H epilogue
                 (instead of one pipeline per product with a barrier between them).
    split_group  fused only: a persistent grid of P CTAs (``persistent_plan``) running whole
                 groups (a tile position's R products) in rounds of P, the groups of the
                 partial last round cut into pieces of Lt = ceil(rem·R/P) products (FalconGEMM
                 §III-B; waves = ceil(R·T/P)).  A piece that does not start its group writes
                 fp32 partial C tiles to a workspace slot of its own, which a second kernel
                 adds into C in a fixed order (deterministic, no atomics).
    persistent   fused: the persistent grid without splitting (the ablation of split_group).
                 Unfused (sm_90a, native 2-byte operands, ``persistent_gemm``): P CTAs walk the
                 output tiles in the grid kernel's order with one software pipeline over every
                 (tile, k) step; the output tile then needs shared memory of its own.  The
                 default for an LCMA's batched GEMM where it applies and fits (``from_dict``).
    persistent_ctas  P, the persistent grid size; 0 = SMs of the target's profile × CTAs that
                 fit on one SM.
    tma_reduce   fused only (sm_90a, native 2-byte operands, C blocks the tile divides): the
                 Combine-H epilogue runs on the TMA engine (``fused.reduce_gemm_h``): no H,
                 no Combine-H pass, C holds the partial sums in its dtype.
    tf32_wgmma   float32 on sm_90a: B̃ K-major and TF32 wgmma (cp.async loads) instead of
                 TF32 mma.sync with TMA loads.
    combine_*    tile and threads of the element-wise combine kernels.
    operands     how the GEMM stage's operands Ã/B̃ are stored (``OPERAND_MODES``):
                 "native" (float32: TF32 on the tensor cores); "fp16": fp16 scaled by a power
                 of two from an amax pass over A and B (H kept fp32); "fp16x2": float32 only,
                 hi + 2¹¹·lo fp16 halves, H = hi·hi + 2⁻¹¹(hi·lo + lo·hi); "fp8": E4M3 with
                 1×128 block scales.  Algorithm 1 and the plain GEMM only.
    cluster      2: CTAs run in clusters of two that own vertically adjacent tiles and read
                 each B slab once from L2 by TMA multicast into both (``cluster_kernels``).
    store_via_smem  the GEMM stage writes its output tile through shared memory (stmatrix,
                 then TMA stores on sm_90a); False: from registers.  The fused kernels'
                 read-modify-write epilogue stores from registers either way.
    direct_views  Algorithm 1 on sm_90a with native 2-byte operands (``direct_views_why``):
                 products whose operand on a side ("a", "b", "ab"; "none") is one input block
                 with coefficient ±1 read that block of A / B in place, and the combine
                 writes only the other operands; "auto": "ab" where the shape allows it.
    batched      the artifact computes a batch of independent products C[b] = A[b]·B[b] of one
                 (M, N, K), the batch count given at each call (``batched_template``);
                 its tile defaults come from ``batched_tiles``.  The plain GEMM only.
    products_per_cta  batched: the products one CTA runs in one pipeline (tiny products
                 amortise a CTA's start and overlap one product's loads with another's work).
    batched_template  batched: "small" (``schedules.cuda.small``), "gemm" (the production
                 GEMM template, ``schedules.cuda.gemm.batched_products``: warp-specialised
                 TMA pipeline, C stored through shared memory, the tiles rasterised within
                 each product, the batch the slowest grid index) or "auto"
                 (``batched_tiles.batched_template``: "small" up to 128 per side, "gemm" beyond).
    bsr          0: a dense A.  16, 32, 64 or 128: the artifact computes C = A·B for a block-sparse
                 A of bsr×bsr blocks in BSR form (the blocks sorted by block row, row
                 pointers and block columns given at each call, with M, K and N:
                 ``schedules.cuda.bsr``); its tile defaults come from ``bsr_tile_defaults``.
    ladder       0: the templates above.  1–7: the plain GEMM as that step of the GEMM
                 optimisation ladder (``schedules.cuda.ladder``, docs/ladder.md), for
                 teaching and measurement; the other knobs then only size its tiles.
    """
    fused: bool = False
    block_m: int = 128
    block_n: int = 256
    block_k: int = 0
    stages: int = 4
    threads: int = 256
    swizzle: int = 8
    policy: str = "auto"
    r_order: str = "natural"
    cache_aware: bool = True
    split_group: bool = False
    persistent: bool = False
    persistent_ctas: int = 0
    overlap_epilogue: bool = False
    tf32_wgmma: bool = False
    combine_rows: int = 4         # 4 × 256: one 4-wide vector per thread
    combine_cols: int = 256
    combine_threads: int = 256
    operands: str = "native"
    cluster: int = 1
    store_via_smem: bool = True
    tma_reduce: bool = False
    direct_views: str = "auto"
    batched: bool = False
    products_per_cta: int = 1
    batched_template: str = "auto"
    bsr: int = 0
    ladder: int = 0

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict | None, dtype: str | None = None, arch: str | None = None,
                  lcma: bool = True) -> "CudaConfig":
        """``d`` (a dict of fields) as a config.  With ``dtype`` and ``arch``, where ``d`` is
        silent: an LCMA's batched GEMM (``lcma``) is persistent wherever that template exists
        and, with the stages asked for, fits (the plain GEMM keeps the grid kernel); the
        pipeline is the deepest, up to ``stages``'s default, that fits the arch's shared
        memory.  operands="fp8" / "fp16x2" fill in their own tile defaults."""
        d = dict(d or {})
        names = {f.name for f in fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise LcmacError(f"unknown CUDA config keys {sorted(unknown)}; known: {sorted(names)}")
        fit_stages = dtype is not None and arch is not None and "stages" not in d
        if d.get("operands") == "fp8":
            d = {**FP8_TILE_DEFAULTS, **d}
        if d.get("operands") == "fp16x2":
            # four fp16 tiles per stage and two fp32 accumulators; explicit values still win
            d = {**(SPLIT_TILE_DEFAULTS_SM80 if arch == "sm_80" else SPLIT_TILE_DEFAULTS), **d}
        cfg = cls(**d)
        if lcma and dtype is not None and arch is not None and "persistent" not in d:
            on = cls(**{**d, "persistent": True})
            room = SMEM_PER_CTA[arch] - persistent_tile_bytes(on, dtype)
            fits = fit_stages or on.stages * stage_bytes(on, dtype) <= room
            if fits and _persistent_why(on, dtype, arch) is None:
                cfg = on
        if fit_stages:
            room = SMEM_PER_CTA[arch] - persistent_tile_bytes(cfg, dtype)
            fit = max(1, min(cfg.stages, room // max(stage_bytes(cfg, dtype), 1)))
            if fit != cfg.stages:
                cfg = replace(cfg, stages=fit)
        return cfg

    def bk(self, dtype: str) -> int:
        """The K slab: ``block_k``, or 128 bytes of a row (64 for 2-byte dtypes, 32 for
        float32, 16 for float64) where it is 0."""
        if self.block_k:
            return self.block_k
        return {"float32": 32, "float64": 16}.get(dtype, 64)

    def _check_splitk(self) -> None:
        """The 3D partition (``schedules.cuda.small.batched_splitk_gemm``): W = threads / 32
        warps each take block_k / W of every K slab, a whole number of the mma's k (16)."""
        warps = self.threads // 32
        if not self.batched:
            raise LcmacError("policy 'splitk' (warps splitting K) is a batched small product's "
                             "partition: use it with batched=True")
        if self.threads % 32 or warps < 2:
            raise LcmacError(f"policy 'splitk' needs two or more whole warps, not threads={self.threads}")
        if not self.block_k or self.block_k % (16 * warps):
            raise LcmacError(f"policy 'splitk' splits block_k among {warps} warps in 16s: block_k "
                             f"must be a multiple of {16 * warps}, not {self.block_k}")

    def check(self) -> None:
        if self.policy not in ("auto", "square", "fullrow", "fullcol", "splitk"):
            raise LcmacError(f"policy must be square, fullrow, fullcol or splitk, not {self.policy!r}")
        if self.policy == "splitk":
            self._check_splitk()
        if self.persistent_ctas < 0:
            raise LcmacError(f"persistent_ctas must be >= 0, not {self.persistent_ctas}")
        if self.operands not in OPERAND_MODES:
            raise LcmacError(f"operands must be one of {OPERAND_MODES}, not {self.operands!r}")
        if self.r_order not in ("natural", "greedy"):
            raise LcmacError(f"r_order must be 'natural' or 'greedy', not {self.r_order!r}")
        if self.cluster not in (1, 2):
            raise LcmacError(f"cluster must be 1 or 2, not {self.cluster!r}")
        if self.direct_views not in DIRECT_VIEWS:
            raise LcmacError(f"direct_views must be one of {DIRECT_VIEWS}, not {self.direct_views!r}")
        if self.products_per_cta < 1:
            raise LcmacError(f"products_per_cta must be >= 1, not {self.products_per_cta}")
        if self.batched_template not in BATCHED_TEMPLATES:
            raise LcmacError(f"batched_template must be one of {BATCHED_TEMPLATES}, not {self.batched_template!r}")
        if self.batched_template == "gemm" and (self.policy == "splitk" or self.products_per_cta != 1):
            raise LcmacError("batched_template 'gemm' runs one product per CTA under a warpgroup "
                             "policy: products_per_cta 1, policy not 'splitk' (those are the small "
                             "template's)")
        if self.bsr and (self.bsr not in BSR_BLOCKS or self.batched or self.ladder):
            raise LcmacError(f"bsr must be 0 (a dense A) or a block size in {BSR_BLOCKS}, and "
                             f"apart from batched and ladder; got bsr={self.bsr}")
        if self.ladder not in range(LADDER_STEPS + 1):
            raise LcmacError(f"ladder must be 0 (off) or a step 1..{LADDER_STEPS}, not {self.ladder!r}")


def cluster_kernels(cfg: CudaConfig, dtype: str, arch: str) -> tuple[str, ...]:
    """Kernels built as 2-CTA clusters sharing B slabs by multicast (none when cluster is 1);
    a config asking for clusters where the template has none is refused by name."""
    if cfg.cluster == 1:
        return ()
    why = _cluster_why(cfg, dtype, arch)
    if why:
        raise NotSupportedYet(f"cluster=2 applies to the native 2-byte GEMM stage on sm_90a "
                              f"only: {why} (use cluster=1)")
    return ("gemm", "batched_gemm")


@dataclass(frozen=True)
class Blocking:
    """Block sizes of one LCMA on one problem shape (see the module docstring)."""
    M: int
    N: int
    K: int
    m: int
    k: int
    n: int
    R: int
    k_align: int = 8          # 16 for 1-byte (fp8) operands: TMA rows are multiples of 16 bytes
    Mb: int = field(init=False)
    Kb: int = field(init=False)
    Nb: int = field(init=False)

    def __post_init__(self):
        object.__setattr__(self, "Mb", round_up(ceil_div(self.M, self.m), 8))
        object.__setattr__(self, "Kb", round_up(ceil_div(self.K, self.k), self.k_align))
        object.__setattr__(self, "Nb", round_up(ceil_div(self.N, self.n), 8))

    def workspace_elems(self, fused: bool) -> dict[str, int]:
        ws = {"At": self.R * self.Mb * self.Kb, "Bt": self.R * self.Kb * self.Nb}
        if not fused:
            ws["H"] = self.R * self.Mb * self.Nb
        return ws


SUPPORTED_DTYPES = ("bfloat16", "float16", "float32")
#: dtypes only the batched small template builds (``schedules.cuda.small``; a config with
#: ``batched``): float64 on the fp64 tensor cores (mma.sync m8n8k4, float64 accumulators;
#: wgmma has no fp64, so the production GEMM template and the LCMA kernels have none)
BATCHED_ONLY_DTYPES = ("float64",)
#: what a batched product (``CudaConfig.batched``) takes
BATCHED_DTYPES = SUPPORTED_DTYPES + BATCHED_ONLY_DTYPES


def accum_dtype(dtype: str) -> str:
    """The accumulators of a GEMM stage on ``dtype`` operands: float64 for float64 (the fp64
    tensor cores accumulate in float64), float32 for every other dtype."""
    return "float64" if dtype == "float64" else "float32"


def batched_only_why(dtype: str, config: dict | None) -> str | None:
    """Why a build of ``dtype`` with ``config`` (a dict of CudaConfig fields) is refused
    because the dtype is one only the batched small template builds (None: it is not)."""
    if dtype not in BATCHED_ONLY_DTYPES:
        return None
    cfg = config or {}
    if not cfg.get("batched"):
        return (f"{dtype} is built for batched products only (lcmac.bmm(A, B, algo='gemm'), a "
                f"config with batched=True); the CUDA backend's other kernels take "
                f"{', '.join(SUPPORTED_DTYPES)}")
    if cfg.get("batched_template") == "gemm":
        return (f"the production GEMM template (batched_template='gemm') has no {dtype}: its "
                f"tensor-core path is wgmma, which has no fp64; {dtype} runs on the small "
                f"template (batched_template 'small' or 'auto')")
    return None


#: the GEMM optimisation ladder's steps (``CudaConfig.ladder``)
LADDER_STEPS = 7
#: Generation of the CUDA templates tuned configs were measured on (see cpu_config's).
#: 2: the plain and batched GEMMs store their output tile through shared memory.
SCHEDULE_VERSION = 2

#: dynamic shared memory one CTA may use, per architecture (bytes)
SMEM_PER_CTA = {"sm_90a": 227 * 1024, "sm_80": 163 * 1024}

#: CudaConfig.direct_views values: the operand sides read in place where a product's operand is
#: one input block
DIRECT_VIEWS = ("auto", "none", "a", "b", "ab")
#: CudaConfig.operands values
OPERAND_MODES = ("native", "fp16", "fp16x2", "fp8")
#: operands="fp8": E4M3 with one float32 scale per 1×128 block along K (Ã: per row, B̃: per
#: column), each block scaled so that its largest |value| maps to E4M3's largest, 448
FP8_BLOCK = 128
FP8_MAX = 448.0
#: smallest block amax scaled to FP8_MAX: 448/1e-30 is a finite float32, and an all-zero
#: block gets a finite scale (its zeros stay zeros, never 0·inf)
FP8_TINY = 1e-30
#: largest R × (blocks per combine input) an fp8 artifact is built for (fp8_combine_size)
FP8_MAX_COMBINE = 256
#: what CudaConfig.from_dict fills in for operands="fp8": a 128×128 tile (two fp32
#: accumulators: the K slab's wgmma result and the scaled running sum), a 128-wide K slab
#: (one scale block), 4 stages of 32 KB, fp32 H stored from registers
FP8_TILE_DEFAULTS = {"block_m": 128, "block_n": 128, "block_k": 128, "stages": 4,
                     "store_via_smem": False}
#: what CudaConfig.from_dict fills in for operands="fp16x2" where the caller is silent
SPLIT_TILE_DEFAULTS = {"block_m": 128, "block_n": 128, "stages": 3}
#: the same on sm_80 (cp.async pipeline, no warp specialisation): a tile ptxas does not spill
SPLIT_TILE_DEFAULTS_SM80 = {"block_m": 128, "block_n": 64, "stages": 2}
#: scaled fp16 operands: every Ã/B̃ entry is scaled below 2**SCALED_TOP (fp16's largest
#: finite value is 65504 < 2**16; the lo half of a split is at most 2**(SCALED_TOP-11)·2**11)
SCALED_TOP = 15
#: the lo half of an fp16x2 split is stored multiplied by 2**SPLIT_SHIFT (fp16's mantissa
#: width + 1), so it keeps 11 significant bits instead of falling into fp16's subnormals
SPLIT_SHIFT = 11


def stage_bytes(cfg: "CudaConfig", dtype: str) -> int:
    """Shared memory of one stage of the GEMM stage's K loop: the A and B slabs, in the
    operand storage type (two halves each for fp16x2)."""
    if cfg.operands == "native":
        return (cfg.block_m + cfg.block_n) * cfg.bk(dtype) * ITEMSIZE[dtype]
    if cfg.operands == "fp8":
        return (cfg.block_m + cfg.block_n) * cfg.bk("float8_e4m3") + 4 * (cfg.block_m + cfg.block_n)
    halves = 2 if cfg.operands == "fp16x2" else 1
    return (cfg.block_m + cfg.block_n) * cfg.bk("float16") * 2 * halves


def persistent_gemm(cfg: "CudaConfig", dtype: str, arch: str) -> bool:
    """Whether the unfused GEMM stage (plain GEMM, Algorithm 1's batched GEMM) runs as a
    persistent kernel; a config asking for it where that template has none is refused by
    name."""
    if not cfg.persistent or cfg.fused:
        return False
    why = _persistent_why(cfg, dtype, arch)
    if why:
        raise NotSupportedYet(f"persistent=True for the unfused GEMM stage applies to native "
                              f"2-byte operands on sm_90a only: {why} (use persistent=False)")
    return True


def _cluster_why(cfg: "CudaConfig", dtype: str, arch: str) -> str | None:
    """Why the GEMM stage cannot be built as 2-CTA clusters with ``cfg`` (None: it can)."""
    return ("sm_80 has no thread-block clusters" if arch != "sm_90a" else
            "float32's GEMM stage is TF32 mma.sync" if dtype == "float32" else
            f"operands={cfg.operands!r} has its own GEMM template" if cfg.operands != "native" else
            "the fused kernel is not clustered" if cfg.fused else
            "the clustered batched GEMM runs the cache-aware order only (cache_aware=False)"
            if not cfg.cache_aware else None)


def arch_why(cfg: "CudaConfig", dtype: str, arch: str) -> str | None:
    """Why no shape can be built with ``cfg`` for ``arch`` and ``dtype`` (None: some can);
    the build refuses each of these by name, the tuner prunes them from its space."""
    if cfg.cluster != 1 and (why := _cluster_why(cfg, dtype, arch)):
        return f"cluster=2: {why}"
    if cfg.persistent and not cfg.fused and (why := _persistent_why(cfg, dtype, arch)):
        return f"persistent=True: {why}"
    if cfg.fused and cfg.tma_reduce and (why := _no_tma(arch)):
        return f"tma_reduce=True: {why}"
    if cfg.direct_views not in ("none", "auto") and (why := _views_why(cfg, dtype, arch)):
        return f"direct_views={cfg.direct_views!r}: {why}"
    if cfg.fused and (cfg.split_group or cfg.persistent) and cfg.overlap_epilogue and arch == "sm_80":
        return ("split_group/persistent with overlap_epilogue: sm_80's cp.async pipeline needs a "
                "constant trip count (use overlap_epilogue=False there)")
    return None


def _persistent_why(cfg: "CudaConfig", dtype: str, arch: str) -> str | None:
    """Why the unfused GEMM stage cannot be persistent with ``cfg`` (None: it can)."""
    return ("the fused kernel has its own persistent grid" if cfg.fused else
            "sm_80's cp.async pipeline needs a constant trip count (TileLang 0.1.15)"
            if arch != "sm_90a" else
            "float32's GEMM stage is TF32" if dtype == "float32" else
            f"operands={cfg.operands!r} has its own GEMM template" if cfg.operands != "native" else
            "the clustered GEMM is not persistent (cluster=2)" if cfg.cluster != 1 else None)


def persistent_tile_bytes(cfg: "CudaConfig", dtype: str) -> int:
    """Shared memory the persistent unfused GEMM keeps for its output tile beside the
    pipeline (a one-tile CTA's tile aliases the drained pipeline buffers instead)."""
    if not cfg.store_via_smem or not (cfg.persistent and not cfg.fused or cfg.fused and cfg.tma_reduce):
        return 0
    return cfg.block_m * cfg.block_n * ITEMSIZE.get(dtype, 4)


def _no_tma(arch: str) -> str | None:
    """Why ``arch`` cannot run a template built on TMA descriptors (None: it can)."""
    return None if arch == "sm_90a" else f"{arch} has no TMA"


def _whole_tiles(cfg: "CudaConfig", blk: "Blocking", dtype: str, with_k: bool) -> bool:
    """Whether the tiles split the blocks of C (``with_k``: of A and B too) exactly, with no
    padding: a TMA box is clipped to the whole matrix, not to its block, so a tile must not
    reach across a block boundary into the next block."""
    whole = (blk.M == blk.m * blk.Mb and blk.N == blk.n * blk.Nb
             and blk.Mb % cfg.block_m == 0 and blk.Nb % cfg.block_n == 0)
    return whole and (not with_k or (blk.K == blk.k * blk.Kb and blk.Kb % cfg.bk(dtype) == 0))


def tma_reduce_why(cfg: "CudaConfig", blk: "Blocking", dtype: str, arch: str) -> str | None:
    """Why the fused kernel cannot run its epilogue on the TMA engine (None: it can)."""
    if why := _no_tma(arch):
        return why
    if dtype not in ("bfloat16", "float16") or cfg.operands != "native":
        return f"it stores native 2-byte outputs, not {dtype} with operands={cfg.operands!r}"
    if (cfg.split_group or cfg.cluster != 1 or not cfg.store_via_smem or cfg.r_order != "natural"
            or not cfg.cache_aware):
        return ("it has its own persistent grid and product order, always cache-aware "
                "(split_group=False, cluster=1, store_via_smem=True, r_order='natural', "
                "cache_aware=True)")
    if not _whole_tiles(cfg, blk, dtype, with_k=False):
        return (f"the C blocks ({blk.Mb}x{blk.Nb} of {blk.M}x{blk.N}) must be whole multiples of "
                f"the {cfg.block_m}x{cfg.block_n} tile")
    return None


def _views_why(cfg: "CudaConfig", dtype: str, arch: str) -> str | None:
    """The shape-independent part of ``direct_views_why``."""
    if why := _no_tma(arch):
        return why
    if dtype not in ("bfloat16", "float16") or cfg.operands != "native":
        return f"the GEMM stage reads native 2-byte operands, not {dtype} with operands={cfg.operands!r}"
    if cfg.fused or cfg.cluster != 1 or cfg.tf32_wgmma:
        return "Algorithm 1's batched GEMM only (fused=False, cluster=1)"
    return None


def view_sides(cfg: "CudaConfig", blk: "Blocking", dtype: str, arch: str) -> str:
    """The operand sides ("", "a", "b", "ab") the batched GEMM reads in place with ``cfg``:
    "auto" resolved (both where ``direct_views_why`` accepts the shape, else none); an
    explicit choice as given (the build refuses it where it cannot apply)."""
    if cfg.direct_views == "auto":
        return "" if direct_views_why(cfg, blk, dtype, arch) else "ab"
    return "" if cfg.direct_views == "none" else cfg.direct_views


def side_read_in_place(direct: int, R: int) -> bool:
    """Whether a side with ``direct`` of its ``R`` operands a bare input block is read in
    place: some but not all (with none there is nothing to skip, with all nothing to combine)."""
    return 0 < direct < R


def operand_sources(R: int, direct: dict[int, int]) -> list[int]:
    """Where each of R products reads its operand on one side when the products in
    ``direct`` ({r: input slot}, ``ir.program.direct_outputs``) read their block of A / B in
    place (``CudaConfig.direct_views``): the workspace slot (≥ 0) the combine writes it to,
    or −1 − slot for input block ``slot`` (p·Q + q: A has m × k blocks, B k × n)."""
    written = [r for r in range(R) if r not in direct]
    return [-1 - direct[r] if r in direct else written.index(r) for r in range(R)]


def direct_views_why(cfg: "CudaConfig", blk: "Blocking", dtype: str, arch: str) -> str | None:
    """Why the batched GEMM cannot read single-block operands in place (None: it can)."""
    if why := _views_why(cfg, dtype, arch):
        return why
    if not _whole_tiles(cfg, blk, dtype, with_k=True):
        return (f"the blocks ({blk.Mb}x{blk.Kb} of A, {blk.Kb}x{blk.Nb} of B) must split "
                f"{blk.M}x{blk.K} and {blk.K}x{blk.N} exactly into whole "
                f"{cfg.block_m}x{cfg.bk(dtype)} / {cfg.bk(dtype)}x{cfg.block_n} tiles")
    return None


def check_smem(kernels: list[dict], arch: str) -> None:
    """Every kernel's dynamic shared memory (as lowered) within what one CTA may use on the
    arch: a kernel over it compiles but fails at launch, so the build refuses it here."""
    limit = SMEM_PER_CTA[arch]
    over = [k for k in kernels if k.get("smem_bytes", 0) > limit]
    if over:
        k = over[0]
        raise LcmacError(f"kernel {k['name']!r} needs {k['smem_bytes'] // 1024} KB of shared memory "
                         f"per CTA, more than {arch}'s {limit // 1024} KB: use fewer stages or a "
                         f"smaller block_m/block_n/block_k in the config")


def default_config(target, dtype: str = "bfloat16", algorithm=None, shape=None) -> "CudaConfig":
    """What ``lcmac build`` / the tuner use with no config: the measured defaults, with the
    pipeline depth cut to what the target's shared memory holds."""
    return CudaConfig.from_dict({}, dtype=dtype, arch=getattr(target, "arch", None) or "sm_90a",
                                lcma=is_lcma(algorithm))


def is_lcma(algorithm) -> bool:
    """Whether ``algorithm`` (None, a name, an Algorithm) is an LCMA rather than the plain
    GEMM (None, "gemm", a 1x1x1 scheme)."""
    if algorithm is None or algorithm == "gemm":
        return False
    R = getattr(algorithm, "R", None)
    return R is None or R > 1


def fp8_combine_size(m: int, k: int, n: int, R: int) -> int:
    """The fp8 combines' per-product block reductions, R × (blocks per combine input): each
    is its own reduction in the unrolled kernel, and TileLang's lowering time grows faster
    than linearly with their number.  Builds above FP8_MAX_COMBINE are refused."""
    return R * max(m * k, k * n)


def check_operands(cfg: "CudaConfig", dtype: str) -> None:
    """The operand modes each dtype and path supports (a clear error otherwise)."""
    if cfg.operands == "native":
        return
    if cfg.operands == "fp8":
        if dtype not in ("bfloat16", "float16"):
            raise LcmacError(f"operands='fp8' quantizes bfloat16/float16 operands, not {dtype}")
        if cfg.bk("float8_e4m3") != FP8_BLOCK:
            raise LcmacError(f"operands='fp8' needs block_k={FP8_BLOCK} (one scale block per K "
                             f"slab), not {cfg.block_k}")
    if cfg.operands == "fp16x2" and dtype != "float32":
        raise LcmacError(f"operands='fp16x2' splits float32 operands; for {dtype} use "
                         f"operands='fp16' (or 'native')")
    if cfg.fused:
        raise NotSupportedYet(f"operands={cfg.operands!r} runs on Algorithm 1 and the plain GEMM; "
                              f"the fused kernel is not supported with it yet (use fused=False)")
    if cfg.tf32_wgmma:
        raise LcmacError(f"tf32_wgmma applies to operands='native' only, not {cfg.operands!r}")


def bound_exponent(coeffs) -> int:
    """l with Σ|c| < 2**l for the worst row of a combine matrix (R × ...): every combined
    operand is then below 2**l · amax of its input, with room for fp32 rounding."""
    rows = np.abs(np.asarray(coeffs, dtype=float).reshape(len(coeffs), -1)).sum(axis=1)
    return int(math.floor(math.log2(max(float(rows.max()), 1.0)))) + 1


def scale_exponent(amax: float, l: int) -> int:
    """e of the power-of-two scale 2**e applied to an operand whose input has |x| ≤ amax and
    combine bound 2**l (the kernels compute the same from amax's float32 bits: biased
    exponent E, amax < 2**(E-126)); clamped so that 2**e and 2**-e are normal floats."""
    E = struct.unpack("<i", struct.pack("<f", float(amax)))[0] >> 23
    return max(min(SCALED_TOP + 126 - E - l, 126), -126)

#: TileLang/TVM index arithmetic is int32 unless a buffer's extents are int64.  Flattening a
#: buffer access folds its compile-time-constant part (r·Mb·Nb for an unrolled product index
#: r, i·Mb·N for a C block row) in the extents' type, and an int32 fold wraps silently
#: (tile-ai/tilelang#2560): the wrapped offset is a wrong address (an illegal access, or a
#: wrong result when it lands inside another workspace buffer).  TileLang promotes an index
#: to int64 only when its run-time range exceeds int32, after that fold.  So every global
#: buffer of more than INDEX_INT32_MAX elements is declared with int64 extents.
INDEX_INT32_MAX = 2**31 - 1


def needs_int64(dims) -> bool:
    """Does a buffer of these extents need 64-bit index arithmetic?"""
    n = 1
    for d in dims:
        n *= int(d)
    return n > INDEX_INT32_MAX


def buffer_shapes(blk: "Blocking", fused: bool, kmajor_b: bool = False) -> dict[str, tuple]:
    """The global buffers of one LCMA artifact (user operands and workspaces) and their
    shapes, as the templates declare them."""
    out = {"A": (blk.M, blk.K), "B": (blk.K, blk.N), "C": (blk.M, blk.N),
           "At": (blk.R, blk.Mb, blk.Kb),
           "Bt": (blk.R, blk.Nb, blk.Kb) if kmajor_b else (blk.R, blk.Kb, blk.Nb)}
    if not fused:
        out["H"] = (blk.R, blk.Mb, blk.Nb)
    return out


def int64_buffers(blk: "Blocking", fused: bool, kmajor_b: bool = False) -> list[str]:
    """Names of the buffers indexed in 64 bits (more than 2³¹−1 elements)."""
    return [k for k, v in buffer_shapes(blk, fused, kmajor_b).items() if needs_int64(v)]


#: CudaConfig.batched_template values
BATCHED_TEMPLATES = ("auto", "small", "gemm")

#: block sizes of the fused block-sparse product (``CudaConfig.bsr``)
BSR_BLOCKS = (16, 32, 64, 128)


def bsr_tile_defaults(bs: int, dtype: str) -> dict:
    """The tile of the fused block-sparse product (``schedules.cuda.bsr``): a CTA owns one
    block row (bs rows) of C by ``block_n`` columns.  64- and 128-blocks: one warpgroup per
    64 rows (wgmma; TF32 mma.sync for float32), 256 columns but 128 for float32 128-blocks;
    16- and 32-blocks: four warps side by side over 128 columns (mma.sync).
    The K slab: the whole block up to 64 (32 for float32); stages: as many as fit, up to 4;
    the C tile stored through shared memory by TMA.  Measured on the H100 (A 8192×8192 at
    1–20 %, B 8192×4096, docs/batched.md): the TMA store 2.0–2.2× faster than stores from
    registers at 1 % in bf16, 1.1–1.3× at 20 %; 256 columns 6–19 % ahead of 128 at 20 %
    (bf16 64- and 128-blocks, float32 64-blocks)."""
    if bs not in BSR_BLOCKS:
        raise ShapeError(f"the fused block-sparse kernel takes blocks of {BSR_BLOCKS}, not {bs}")
    item = ITEMSIZE[dtype]
    block_k = min(bs, 32 if item == 4 else 64)
    block_n = 256 if bs == 64 or (bs == 128 and item == 2) else 128
    stage = (bs * block_k + block_k * block_n) * item
    return {"block_m": bs, "block_n": block_n, "block_k": block_k,
            "threads": 256 if bs == 128 else 128, "stages": min(4, SMEM_PER_CTA["sm_90a"] // stage),
            "policy": "fullrow" if bs >= 64 else "fullcol", "store_via_smem": True}


def bsr_shape_why(M: int, K: int, N: int, bs: int, dtype: str) -> str | None:
    """Why the fused block-sparse kernel cannot take these sizes (None: it can)."""
    vec = 16 // ITEMSIZE[dtype]         # B's rows in 16-byte units: its TMA loads
    if M <= 0 or K <= 0 or M % bs or K % bs:
        return f"M and K must be positive multiples of {bs} (the block size), not M={M}, K={K}"
    if N % vec:
        return f"N must be a multiple of {vec} for {dtype} (B's rows in 16 bytes), not {N}"
    return f"C's {M}x{N} elements must be fewer than 2^31 (32-bit indices)" if M * N >= 2**31 else None


def check_batched_shape(M: int, N: int, K: int) -> None:
    """A batched small product takes any positive sizes (its copies check bounds)."""
    if min(M, N, K) <= 0:
        raise ShapeError(f"shape must be positive, got M={M} N={N} K={K}")


def check_shape(M: int, N: int, K: int, dtype: str) -> None:
    if min(M, N, K) <= 0:
        raise ShapeError(f"shape must be positive, got M={M} N={N} K={K}")
    vec = 16 // ITEMSIZE[dtype]
    if K % vec or N % vec:
        raise ShapeError(f"the CUDA backend needs K and N to be multiples of {vec} for {dtype} "
                         f"(16-byte rows for the TMA copies); got K={K}, N={N} (M may be any size)")


def r_order(W, order: str) -> list[int]:
    """The order in which a CTA computes its R products.

    "greedy": repeatedly take the product that completes the most C tiles soonest (fewest
    remaining contributions), so partial C tiles live for the shortest time."""
    R = W.shape[0]
    if order == "natural":
        return list(range(R))
    nz = [(np.asarray(W[r]) != 0) for r in range(R)]
    remaining = sum(x.astype(int) for x in nz)
    left = set(range(R))
    out = []
    while left:
        best = min(left, key=lambda r: (int((remaining[nz[r]]).min()) if nz[r].any() else 0, r))
        out.append(best)
        left.remove(best)
        remaining = remaining - nz[best].astype(int)
    return out


def ctas_per_sm(cfg: CudaConfig, dtype: str, smem_per_sm: int = SMEM_PER_CTA["sm_90a"],
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


def persistent_plan(blk: Blocking, cfg: CudaConfig, dtype: str, units: int) -> PersistentPlan:
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


def combine_h_steps(W, order: list[int]):
    """The Combine-H epilogue of the fused kernels, step by step.

    Returns (steps, nxt): steps[s] = [(i, j, w, first, prev)] for the product order[s]:
    its non-zero W[r,i,j], ``first`` = C_ij's first contribution when the walk starts at
    step 0, ``prev`` = the previous step (cyclically) that contributes to C_ij;
    nxt[(i, j)][s] = steps from s (cyclically) to the next one contributing to C_ij."""
    R = len(order)
    W = np.asarray(W, dtype=object)
    m, n = W.shape[1], W.shape[2]
    at = {}
    for s, r in enumerate(order):
        for i in range(m):
            for j in range(n):
                if W[r, i, j] != 0:
                    at.setdefault((i, j), []).append(s)
    seen, steps = set(), []
    for s, r in enumerate(order):
        items = []
        for i in range(m):
            for j in range(n):
                if W[r, i, j] != 0:
                    st = at[(i, j)]
                    items.append((i, j, W[r, i, j], (i, j) not in seen, st[st.index(s) - 1]))
                    seen.add((i, j))
        steps.append(items)
    nxt = {ij: [min((t - s) % R for t in st) for s in range(R)] for ij, st in at.items()}
    return steps, nxt


def reduce_groups(W, order: list[int]):
    """The TMA epilogue of ``tma_reduce`` step by step: groups[s] = [(w, [(i, j, first)])],
    product order[s]'s non-zero W[r,i,j] grouped by coefficient (w = 1 first), ``first`` =
    C_ij's first contribution in a walk over the whole group (a store; the rest add)."""
    steps, _ = combine_h_steps(W, order)
    groups = []
    for items in steps:
        by_w = {}
        for (i, j, w, first, _prev) in items:
            by_w.setdefault(w, []).append((i, j, first))
        groups.append(sorted(by_w.items(), key=lambda kv: kv[0] != 1))
    return groups


def first_in_piece(s0: int, prev: int, st: int, R: int) -> bool:
    """Is step s0 the first, in a walk starting at step st (st, st+1, … mod R), to add into
    a C tile whose previous contributing step (cyclically) is ``prev``?  (prev == s0: the
    only one.)  The fused templates emit the same test when st is a run-time value."""
    return (s0 - st) % R <= (prev - st) % R
