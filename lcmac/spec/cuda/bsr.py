"""The fused block-sparse product (``CudaConfig.bsr``): its block sizes, tile defaults and
the shapes it takes."""
from __future__ import annotations

from lcmac.core.dtypes import ITEMSIZE
from lcmac.core.errors import ShapeError
from lcmac.spec.cuda.smem import SMEM_PER_CTA

#: block sizes of the fused block-sparse product (``CudaConfig.bsr``)
BSR_BLOCKS = (16, 32, 64, 128)


def bsr_tile_defaults(bs: int, dtype: str) -> dict:
    """The tile of the fused block-sparse product (``schedules.cuda.bsr``): a CTA owns one
    block row (bs rows) of C by ``block_n`` columns.  64- and 128-blocks: one warpgroup per
    64 rows (wgmma; TF32 mma.sync for float32), 256 columns but 128 for float32 128-blocks;
    16- and 32-blocks: four warps side by side over 128 columns (mma.sync).
    The K slab: the whole block up to 64 (32 for float32); stages: as many as fit, up to 4;
    the C tile stored through shared memory by TMA.  Both won on the H100 (docs/batched.md):
    the TMA store over stores from registers, most at low density; 256 columns over 128
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
