"""The tiles of a batched product (``CudaConfig.batched``, ``lcmac.bmm``), chosen per shape and
dtype without a compiler: which template runs it (``batched_template``: ``schedules.cuda.small``
up to 128 per side, the production GEMM template's ``batched_products`` beyond) and the
template's defaults (``small_tile_defaults``, ``splitk_tile_defaults``,
``gemm_batch_tile_defaults``).  The TileLang worker fills a batched config in from these; the
benchmark and the cost model read them.
"""
from __future__ import annotations

from lcmac.core.dtypes import ITEMSIZE
from lcmac.core.errors import DTypeError, ShapeError
from lcmac.spec.cuda.dtypes import FP64_DTYPES, fp64_why
from lcmac.spec.cuda.smem import SMEM_PER_CTA

#: largest max(M, N) a batched product runs on the small template under "auto"
SMALL_TEMPLATE_MAX = 128


def batched_template(template: str | None, M: int, N: int, dtype: str | None = None) -> str:
    """The template a batched M×N product runs on (``CudaConfig.batched_template``): "auto"
    (or None) is "small" up to ``SMALL_TEMPLATE_MAX`` per side and "gemm" beyond; float64
    (``FP64_DTYPES``) is always "small" (the GEMM template's wgmma has no fp64: asking
    for it with float64 is a DTypeError)."""
    if dtype in FP64_DTYPES:
        if template == "gemm":
            raise DTypeError(fp64_why(dtype, {"batched": True, "batched_template": "gemm"}))
        return "small"
    if template in (None, "auto"):
        return "gemm" if max(M, N) > SMALL_TEMPLATE_MAX else "small"
    return template


def small_tile_defaults(M: int, N: int, K: int, dtype: str, policy: str | None = None,
                        template: str | None = None, persistent: bool | None = None,
                        arch: str = "sm_90a") -> dict:
    """The tile of a batched small product (``CudaConfig.batched``), the fastest on the H100
    for bf16 (bench/experiments/batched.md): up to 64 per side the smallest of 16², 32²
    (one warp, mma) and 64² (a warpgroup, wgmma) covering max(M, N), 16 products per CTA in
    one pipeline (faster than one product per CTA at 16³); 128² one
    product per CTA.  Beyond 128 per side the production GEMM template's tile
    (``gemm_batch_tile_defaults`` for ``arch``, ``persistent`` as asked); on the small
    template (``template="small"``) 128×256 tiles with two consumer warpgroups and 3 stages
    (faster than 128² tiles from 256³).  The K slab the whole K up to
    64 (32 for float32), in 16s; two stages where K has more than one slab or several
    products share the CTA."""
    if policy == "splitk":
        return splitk_tile_defaults(M, N, K, dtype)
    if batched_template(template, M, N, dtype) == "gemm":
        return gemm_batch_tile_defaults(M, N, K, dtype, persistent, arch)
    if dtype == "float64":
        return float64_tile_defaults(M, N, K)
    side = max(M, N)
    cap = 32 if dtype == "float32" else 64
    block_k = min(cap, -(-K // 16) * 16)
    if side > 128:
        return {"block_m": 128, "block_n": 256 if N > 128 else 128, "block_k": block_k,
                "threads": 256, "stages": 3, "policy": "fullrow", "products_per_cta": 1}
    tile = next(t for t in (16, 32, 64, 128) if side <= t)
    per_cta = 16 if tile <= 64 else 1
    return {"block_m": tile, "block_n": tile, "block_k": block_k,
            "threads": 32 if tile <= 32 else 128,
            "stages": 2 if K > block_k or per_cta > 1 else 1,
            "policy": "square" if tile <= 32 else "fullrow", "products_per_cta": per_cta}


def float64_tile_defaults(M: int, N: int, K: int) -> dict:
    """The tile of a float64 batched product (the small template at every size: the fp64
    tensor cores are mma.sync's m8n8k4, one warp each, float64 accumulators).  The tiles
    of the other dtypes up to 64 per side (16² and 32² one warp, 64² four), 16 products per
    CTA; beyond, 128² tiles of 8 warps (four warps would hold 128 float64 accumulators, 256
    registers, each) one product per CTA.  The warps split rows and columns ("square": a warp
    of the 64² tile owns 32×32 of C, so each fragment it loads from shared memory serves four
    mma, where a 16-row strip's serve two).  The K slab 16 deep (128 bytes of a row, as the
    other dtypes': a 128² tile's stage is 32 KiB); two stages where K has more than one slab
    or several products share the CTA, three on 128² tiles with three or more slabs."""
    side = max(M, N)
    block_k = 16
    num_k = -(-K // block_k)
    tile = next((t for t in (16, 32, 64) if side <= t), 128)
    per_cta = 16 if tile <= 64 else 1
    stages = 3 if tile == 128 and num_k >= 3 else 2 if num_k > 1 or per_cta > 1 else 1
    return {"block_m": tile, "block_n": tile, "block_k": block_k,
            "threads": 32 if tile <= 32 else 128 if tile == 64 else 256,
            "stages": stages, "policy": "square", "products_per_cta": per_cta}


def gemm_batch_tile_defaults(M: int, N: int, K: int, dtype: str, persistent: bool | None = None,
                             arch: str = "sm_90a") -> dict:
    """The tile of a batched product on the production GEMM template
    (``batched_template="gemm"``): the plain GEMM's 128×256, or 128×128 where that pads N
    less (N ≤ 128, or 384: 256-wide tiles would leave a third of the columns idle), two
    consumer warpgroups under its "auto" policy, its rasterisation panel of 8, C stored
    through shared memory; the K slab the whole K up to 64 (32 for float32), in 16s.
    ``persistent`` (None: for 2-byte dtypes with rows of 16-byte multiples; float32's TF32
    stage has no persistent grid, nor has sm_80 or a shape whose copies are not TMA's:
    ``persistent_why``): a CTA per SM walking the tiles in one pipeline, so the next tile's loads
    overlap this one's store (faster than the grid: docs/batched.md).  Stages: as many, up to 4, as fit beside the
    persistent grid's C tile in ``arch``'s shared memory (the grid's aliases the drained
    pipeline)."""
    if persistent is None:
        persistent = ITEMSIZE[dtype] == 2 and arch == "sm_90a" and persistent_why(N, K, dtype) is None
    block_k = min(32 if dtype == "float32" else 64, -(-K // 16) * 16)
    block_n = 256 if -(-N // 256) * 256 <= -(-N // 128) * 128 else 128
    stage = (128 + block_n) * block_k * ITEMSIZE[dtype]
    room = SMEM_PER_CTA[arch] - (128 * block_n * ITEMSIZE[dtype] if persistent else 0)
    return {"block_m": 128, "block_n": block_n, "block_k": block_k, "threads": 256,
            "stages": max(1, min(4, room // stage)), "policy": "auto", "swizzle": 8,
            "store_via_smem": True, "persistent": persistent, "products_per_cta": 1,
            "batched_template": "gemm"}


def persistent_why(N: int, K: int, dtype: str) -> str | None:
    """Why a batched product of N columns and K depth cannot run on the GEMM template's
    persistent grid (None: it can): its walk has a run-time trip count, which TileLang 0.1.15
    pipelines for TMA copies only; rows that are not 16-byte multiples take cp.async copies."""
    vec = 16 // ITEMSIZE[dtype]
    if K % vec or N % vec:
        return (f"its copies are TMA's only where N and K are multiples of {vec} for {dtype} "
                f"(got N={N}, K={K})")
    return None


#: warps of the 3D partition (``policy="splitk"``): one per tensor core of the SM
SPLITK_WARPS = 4


def splitk_tile_defaults(M: int, N: int, K: int, dtype: str) -> dict:
    """The tile of the 3D partition (``policy="splitk"``, ``schedules.cuda.small``): the 16²
    or 32² tile of a one-warp product (a product of up to 32 per side; beyond, a warpgroup
    already covers the tile), 4 warps each taking a quarter of every K slab, the slab up to
    4·64 (4·32 for float32) deep, so a warp's share is what one warp takes alone in the 1D/2D
    kernel; 4 products per CTA in one pipeline."""
    side = max(M, N)
    if side > 32:
        raise ShapeError(f"policy 'splitk' is for products of up to 32×32 (got {M}×{N}): "
                         f"a larger tile has a warpgroup splitting M and N already")
    unit = 16 * SPLITK_WARPS
    cap = SPLITK_WARPS * {"float32": 32, "float64": 16}.get(dtype, 64)
    tile = 16 if side <= 16 else 32
    return {"block_m": tile, "block_n": tile, "block_k": min(cap, -(-K // unit) * unit),
            "threads": 32 * SPLITK_WARPS, "stages": 2, "policy": "splitk", "products_per_cta": 4}
