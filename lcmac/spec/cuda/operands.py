"""How the GEMM stage's operands are stored (``CudaConfig.operands``): native; fp16 scaled by
a power of two; fp16x2, a float32 split into hi and lo fp16 halves; fp8 E4M3 with block
scales.  Their constants, tile defaults, limits and scale exponents."""
from __future__ import annotations

import math
import struct

import numpy as np

from lcmac.core.errors import LcmacError
from lcmac.spec.cuda.dtypes import FP64_DTYPES
from lcmac.spec.cuda.support import NotSupportedYet

#: CudaConfig.operands values
OPERAND_MODES = ("native", "fp16", "fp16x2", "fp8")
#: operands="fp8": E4M3 with float32 decode scales amax/448 per 1×128 block of Ã (a row, 128
#: K) and per 128×128 block of B̃ (lcmac.spec.fp8.CONTRACT), its largest |value| mapped to 448
FP8_BLOCK = 128
FP8_MAX = 448.0
#: smallest block amax scaled to FP8_MAX: 448/1e-30 is a finite float32, and an all-zero
#: block gets a finite scale (its zeros stay zeros, never 0·inf)
FP8_TINY = 1e-30
#: largest R × (blocks per combine input) an fp8 artifact is built for (fp8_combine_size)
FP8_MAX_COMBINE = 256
#: what CudaConfig.from_dict fills in for operands="fp8": a 128×192 tile (two fp32
#: accumulators: the K slab's wgmma result and the scaled running sum; the widest that
#: fits the registers, and fewer operand bytes per product than 128×128's, as measured:
#: docs/fp8.md), a 128-wide K slab (one scale block), 4 stages of 40 KB, fp32 H stored
#: from registers
FP8_TILE_DEFAULTS = {"block_m": 128, "block_n": 192, "block_k": 128, "stages": 4,
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


def fp8_combine_size(m: int, k: int, n: int, R: int) -> int:
    """The fp8 combines' per-product block reductions, R × (blocks per combine input): each
    is its own reduction in the unrolled kernel, and TileLang's lowering time grows faster
    than linearly with their number.  Builds above FP8_MAX_COMBINE are refused."""
    return R * max(m * k, k * n)


def fp8_tile_scale_blocks(block_n: int) -> int:
    """How many of B̃'s 128-column scale blocks one GEMM tile of ``block_n`` columns meets at
    most: tiles start at multiples of block_n, so within a block at an offset that is a
    multiple of gcd(block_n, 128) (a 192-wide tile meets two, a 64-wide one)."""
    return -(-(FP8_BLOCK - math.gcd(block_n, FP8_BLOCK) + block_n) // FP8_BLOCK)


def fp8_scale_shapes(R: int, Mb: int, Nb: int, Kb: int, block_m: int, block_n: int) -> dict:
    """The fp8 kernels' scale buffers: SA [R, nkb, Mb'] (a K block's scales of all Ã rows
    together, Mb' = Mb rounded up to the GEMM tile) and SB [R, Nb', L4] (one per 128×128
    block of B̃, its K blocks contiguous and padded to L4, a multiple of 4 — 16 bytes a row,
    as cuBLAS's scale_b; Nb' = the 128-column blocks the last column tile reads), so that the
    GEMM never reads past them (the padding only meets outputs that are never stored)."""
    nkb = -(-Kb // FP8_BLOCK)
    mp = -(-Mb // block_m) * block_m
    nbp = (-(-Nb // block_n) - 1) * block_n // FP8_BLOCK + fp8_tile_scale_blocks(block_n)
    return {"SA": (R, nkb, mp), "SB": (R, nbp, -(-nkb // 4) * 4)}


def check_operands(cfg: "CudaConfig", dtype: str) -> None:
    """The operand modes each dtype and path supports (a clear error otherwise)."""
    if cfg.operands == "native":
        return
    if dtype in FP64_DTYPES:
        raise LcmacError(f"operands={cfg.operands!r} narrows operands to fp16 or fp8; {dtype} "
                         f"multiplies on the fp64 tensor cores in {dtype} (operands='native')")
    if cfg.operands == "fp8":
        if dtype not in ("bfloat16", "float16"):
            raise LcmacError(f"operands='fp8' quantizes bfloat16/float16 operands, not {dtype}")
        if cfg.bk("float8_e4m3") != FP8_BLOCK:
            raise LcmacError(f"operands='fp8' needs block_k={FP8_BLOCK} (one scale block per K "
                             f"slab), not {cfg.block_k}")
        if cfg.block_n % 16 or not 16 <= cfg.block_n <= 256:
            raise LcmacError(f"operands='fp8' needs block_n a multiple of 16 in [16, 256] (one fp8 "
                             f"wgmma's N), not {cfg.block_n}")
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
