"""The CUDA templates' config: ``CudaConfig``, its knobs and their checks, the defaults a
build fills in, and the generation of the templates tuned configs were measured on."""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace

from lcmac.core.errors import LcmacError
from lcmac.spec.cuda.bsr import BSR_BLOCKS
from lcmac.spec.cuda.dtypes import FP64_DTYPES, FP64_TILE_DEFAULTS
from lcmac.spec.cuda.operands import (
    FP8_TILE_DEFAULTS, OPERAND_MODES, SPLIT_TILE_DEFAULTS, SPLIT_TILE_DEFAULTS_SM80)
from lcmac.spec.cuda.smem import SMEM_PER_CTA, persistent_tile_bytes, stage_bytes
from lcmac.spec.cuda.support import persistent_why


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
                 block scales (Ã 1×128, B̃ 128×128; lcmac.spec.fp8).  Algorithm 1 and the plain GEMM only.
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
    dynamic_rows M is a kernel argument (``schedules.cuda.rows``): one artifact serves any
                 row count, the shape's M being the most rows one launch takes; rows past M
                 read as zero (TMA's out-of-bounds fill) and are never written.
    dynamic_shape  M, N and K are kernel arguments (``schedules.cuda.rows``, implies
                 run-time rows): one artifact serves every shape up to the shape it was
                 built for (N and K multiples of 16 bytes: the TMA row strides); the plain
                 GEMM, Algorithm 1 and the fused grid form.
    dmma         float64: the fp64 tensor-core instruction, "m8n8k4" (TileLang's, sm_80 and
                 sm_90a) or "m16n8k4" (sm_90a: pairs of m8n8k4 sharing B issued as one,
                 ``host_source.dmma_pairs``), "m16n8k8" / "m16n8k16" (sm_90a: two / four of
                 those along K, ``host_source.dmma_k_groups``), in the plain GEMM and
                 Algorithm 1's batched GEMM.
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
    dynamic_rows: bool = False
    dynamic_shape: bool = False
    dmma: str = "m8n8k4"

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict | None, dtype: str | None = None, arch: str | None = None,
                  lcma: bool = True) -> "CudaConfig":
        """``d`` (a dict of fields) as a config.  With ``dtype`` and ``arch``, where ``d`` is
        silent: an LCMA's batched GEMM (``lcma``) is persistent wherever that template exists
        and, with the stages asked for, fits (the plain GEMM keeps the grid kernel); the
        pipeline is the deepest, up to ``stages``'s default, that fits the arch's shared
        memory.  operands="fp8" / "fp16x2" and float64 fill in their own tile defaults."""
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
        if dtype in FP64_DTYPES and not d.get("batched"):
            d = {**FP64_TILE_DEFAULTS, **d}      # float64 accumulators: a 128² tile
        cfg = cls(**d)
        if lcma and dtype is not None and arch is not None and "persistent" not in d:
            on = cls(**{**d, "persistent": True})
            room = SMEM_PER_CTA[arch] - persistent_tile_bytes(on, dtype)
            fits = fit_stages or on.stages * stage_bytes(on, dtype) <= room
            if fits and persistent_why(on, dtype, arch) is None:
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
        if self.dmma not in DMMA_SHAPES:
            raise LcmacError(f"dmma must be one of {DMMA_SHAPES}, not {self.dmma!r}")
        if self.bsr and (self.bsr not in BSR_BLOCKS or self.batched):
            raise LcmacError(f"bsr must be 0 (a dense A) or a block size in {BSR_BLOCKS}, and "
                             f"apart from batched; got bsr={self.bsr}")


#: Generation of the CUDA templates tuned configs were measured on (see lcmac.spec.cpu.config's).
#: 2: the plain and batched GEMMs store their output tile through shared memory.
SCHEDULE_VERSION = 2

#: CudaConfig.direct_views values: the operand sides read in place where a product's operand is
#: one input block
DIRECT_VIEWS = ("auto", "none", "a", "b", "ab")
#: CudaConfig.batched_template values
BATCHED_TEMPLATES = ("auto", "small", "gemm")
#: CudaConfig.dmma values: the fp64 mma.sync shapes a float64 GEMM stage issues
DMMA_SHAPES = ("m8n8k4", "m16n8k4", "m16n8k8", "m16n8k16")


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

