"""Block-scaled FP8 operands as data, and a numpy reference for them: the contract that
fp8 kernels (the quantisation, Combine A fused into it, B̃ prepared once, the GEMM stage,
Combine H) are checked against.

The format is DeepSeek-V3's recipe as DeepGEMM's SM90 kernels (``per_token_cast_to_fp8``,
``per_block_cast_to_fp8``, ``fp8_gemm_nt``) and cuBLAS's blockwise FP8 GEMM
(``torch.nn.functional.scaled_mm`` with ``ScalingType.BlockWise1x128`` for A and
``BlockWise128x128`` for B, SM90, cuBLASLt ≥ 12.9) take it:

  element   E4M3 "fn" (OCP): 3 mantissa bits, largest finite 448, no infinities, NaN.
  A side    one float32 scale per 1×128 block: one row of A (of Ã_r), 128 consecutive K.
  B side    one float32 scale per 128×128 block: 128 K × 128 N of B (of B̃_r).
  scale     the decode scale s = amax / 448 (x ≈ q·s), amax = max |x| over the block,
            floored at ``amax_floor``; an ordinary float32, not a power of two (DeepGEMM's
            UE8M0 power-of-two scales are its SM100 path, not the SM90 recipe).
  quantise  q = E4M3(x · (448 / amax)): the float32 quotient, the float32 product, rounded
            to nearest even and saturated to ±448 (CUDA's satfinite conversion; torch's
            own cast may map values beyond 464 to NaN, so a torch quantiser clamps first).
  ragged    rows or K not a multiple of the block are padded with zeros; zeros never raise
            an amax, so a partial block is scaled by its real elements.
  GEMM      per 128-wide K block kb, the exact product of the E4M3 values, rounded to
            float32, times sa[row, kb]·sb[kb, col] (a float32 product), added into a float32
            running sum (DeepGEMM promotes every K block: Hopper's FP8 tensor cores keep
            about 14 bits while they accumulate, DeepSeek-V3 §3.3.2, so no more than one K
            block is summed there).
  LCMA      Ã_r = Σ U[r,i,l]·A_il formed from the bf16 blocks and rounded to float32 once,
            then quantised per 1×128 of Ã_r (what a Combine-A kernel fused into the
            quantisation writes); B̃_r = Σ V[r,l,j]·B_lj likewise, quantised per 128×128 of
            B̃_r, once (weights); H_r = the GEMM above; C_ij = Σ_r W[r,i,j]·H_r in float32,
            rounded once to the output dtype.
  NaN, Inf  a block holding a NaN or ±inf has a NaN or infinite amax, so every value of it
            dequantises to NaN (0·inf or NaN·s): never to a finite number.  Kernels whose
            block maximum skips NaN (CUDA's fmaxf) keep only that element NaN; either way the
            outputs it reaches are not finite.

``CONTRACT`` is that format, and ``OPERAND_MODE`` (what the CUDA backend's ``operands="fp8"``
kernels, lcmac.schedules.cuda.low_precision, compute) is it too: one fp8 mode, so an lcmac
kernel and cuBLAS's blockwise GEMM take the same operands.  ``PER_COLUMN`` is the mode's
former B side (128×1 blocks, s = amax·fl(1/448)), kept for comparisons; ``DEEPGEMM`` floors
amax at 1e-4 as DeepGEMM's casts do.  ``kernel_scales`` lays a reference's scales out as
the kernels keep them (``LAYOUTS``).  The blocking of an LCMA is the CUDA
backend's (``spec.cuda.blocking.Blocking``, K blocks rounded to 16 bytes).

An input already on the grid — E4M3 values times a power of two, its largest magnitude 448
times that power — is quantised and dequantised exactly by ``CONTRACT``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lcmac.ir import catalogue
from lcmac.spec.cuda.blocking import Blocking, ceil_div
from lcmac.spec.cuda.operands import FP8_BLOCK, FP8_MAX, FP8_TILE_DEFAULTS, FP8_TINY, fp8_scale_shapes

#: the element type (torch.float8_e4m3fn, CUDA's __nv_fp8_e4m3) and the scales' type
ELEMENT = "float8_e4m3fn"
SCALE_DTYPE = "float32"
#: smallest normal E4M3 exponent, and its mantissa bits
E4M3_MIN_EXP = -6
E4M3_MANTISSA = 3
#: DeepGEMM's casts clamp a block's amax to at least this
DEEPGEMM_AMAX_FLOOR = 1e-4

#: where the kernels keep each piece: row-major extents, "K-major" = K contiguous
LAYOUTS = {
    "A_values": "[R, Mb, Kb] E4M3, K-major",
    "A_scales": "[R, ceil(Kb/128), Mb'] float32: one K block's scales of all rows together, "
                "Mb' = Mb rounded up to the GEMM tile (scaled_mm's scale_a [M, K/128] with "
                "strides (1, M))",
    "B_values": "[R, Nb, Kb] E4M3, K-major (B̃ transposed; scaled_mm's mat_b is its .t())",
    "B_scales": "[R, Nb', L4] float32: the K blocks of each 128 columns contiguous, padded to "
                "L4 = ceil(Kb/128) rounded up to 4 (scaled_mm's scale_b [L4, N/128] with strides "
                "(1, L4); DeepGEMM's [N/128, K/128]), Nb' = ceil(Nb/128) rounded up to the tile",
}


@dataclass(frozen=True)
class Fp8BlockFormat:
    """One block-scaled E4M3 format: the blocks of each side (rows × cols of A [M, K] and
    of B [K, N]; both must span the same K), the largest E4M3 magnitude, the floor of a
    block's amax, and how the decode scale is computed from it."""
    a_block: tuple[int, int] = (1, FP8_BLOCK)
    b_block: tuple[int, int] = (FP8_BLOCK, FP8_BLOCK)
    max_value: float = FP8_MAX
    amax_floor: float = FP8_TINY
    #: s = amax · fl(1/448) (lcmac's operands="fp8" kernels) instead of amax / 448
    scale_by_reciprocal: bool = False

    def __post_init__(self):
        for name, blk in (("a_block", self.a_block), ("b_block", self.b_block)):
            if len(blk) != 2 or min(blk) < 1:
                raise ValueError(f"{name} must be (rows, cols) of positive sizes, got {blk!r}")
        if self.a_block[1] != self.b_block[0]:
            raise ValueError(f"A's blocks span {self.a_block[1]} of K and B's {self.b_block[0]}: "
                             f"the GEMM applies one scale pair per K block, so they must agree")


CONTRACT = Fp8BlockFormat()
OPERAND_MODE = CONTRACT
PER_COLUMN = Fp8BlockFormat(b_block=(FP8_BLOCK, 1), scale_by_reciprocal=True)
DEEPGEMM = Fp8BlockFormat(amax_floor=DEEPGEMM_AMAX_FLOOR)


@dataclass(frozen=True)
class BlockQuantized:
    """E4M3 values (as float32, the input's shape: padding cut off) and their float32 decode
    scales [..., ceil(rows/br), ceil(cols/bc)] for blocks ``block`` = (br, bc) over the last
    two dimensions."""
    values: np.ndarray
    scales: np.ndarray
    block: tuple[int, int]


def round_e4m3(x) -> np.ndarray:
    """float32 → the nearest E4M3 value (ties to even; normals down to 2⁻⁶, subnormal steps
    of 2⁻⁹), saturated to ±448 (±inf too), NaN kept; returned as float32."""
    x = np.asarray(x, dtype=np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        _, e = np.frexp(x)                      # |x| = f·2^e, 0.5 ≤ f < 1 (0, inf, NaN: e = 0)
        # the spacing of E4M3 values at |x|: 2^(exponent − mantissa bits), no finer than the subnormals'
        step = np.ldexp(np.float32(1), np.maximum(e - 1, E4M3_MIN_EXP) - E4M3_MANTISSA).astype(np.float32)
        y = np.rint(x / step) * step
    return np.clip(y, -FP8_MAX, FP8_MAX).astype(np.float32)


def _pad_to_blocks(x: np.ndarray, block) -> np.ndarray:
    br, bc = block
    pr, pc = -x.shape[-2] % br, -x.shape[-1] % bc
    if not (pr or pc):
        return x
    return np.pad(x, [(0, 0)] * (x.ndim - 2) + [(0, pr), (0, pc)])


def _block_view(xp: np.ndarray, block) -> np.ndarray:
    """[..., R, C] (multiples of the block) as [..., R/br, br, C/bc, bc]."""
    br, bc = block
    *lead, r, c = xp.shape
    return xp.reshape(*lead, r // br, br, c // bc, bc)


def expand_scales(scales: np.ndarray, block, shape) -> np.ndarray:
    """Each element's scale: ``scales`` [..., nrb, ncb] repeated over its blocks and cut to
    ``shape``'s last two extents."""
    br, bc = block
    full = np.repeat(np.repeat(scales, br, axis=-2), bc, axis=-1)
    return full[..., :shape[-2], :shape[-1]]


def quantize_blocks(x, block=CONTRACT.a_block, fmt: Fp8BlockFormat = CONTRACT) -> BlockQuantized:
    """``x`` (float32, or what rounds to it; blocks over its last two dimensions) quantised
    to E4M3 with one decode scale per ``block``, as the module doc says."""
    x = np.asarray(x, dtype=np.float32)
    if x.ndim < 2:
        raise ValueError(f"quantize_blocks takes a matrix (or a stack of them), got shape {x.shape}")
    block = (int(block[0]), int(block[1]))
    view = _block_view(_pad_to_blocks(x, block), block)
    with np.errstate(invalid="ignore"):
        amax = np.abs(view).max(axis=(-3, -1))          # NaN propagates, as it must
        amax = np.maximum(amax, np.float32(fmt.amax_floor))
        if fmt.scale_by_reciprocal:
            scales = amax * np.float32(1.0 / fmt.max_value)
        else:
            scales = amax / np.float32(fmt.max_value)
        mult = np.float32(fmt.max_value) / amax
        q = round_e4m3(view * mult[..., :, None, :, None])
    values = q.reshape(view.shape[:-4] + (view.shape[-4] * block[0], view.shape[-2] * block[1]))
    return BlockQuantized(values[..., :x.shape[-2], :x.shape[-1]], scales.astype(np.float32), block)


def dequantize(bq: BlockQuantized) -> np.ndarray:
    """The values times their scales, in float64 (exact: 4 significant bits times 24)."""
    s = expand_scales(bq.scales.astype(np.float64), bq.block, bq.values.shape)
    with np.errstate(invalid="ignore"):
        return bq.values.astype(np.float64) * s


def kernel_scales(a: "BlockQuantized", b: "BlockQuantized", tile=None) -> dict:
    """The scales of ``combine_then_quantize`` (Ã) and ``prepare_b_fp8`` (B̃) as the fp8
    kernels keep them (``LAYOUTS``; ``tile`` = (block_m, block_n), default the fp8 mode's):
    {"SA": [R, nkb, Mb'], "SB": [R, Nb', L4]} float32, the padding zero."""
    if a.block != CONTRACT.a_block or b.block != CONTRACT.b_block:
        raise ValueError(f"the kernels keep 1x128 and 128x128 scales, not {a.block} and {b.block}")
    bm, bn = tile or (FP8_TILE_DEFAULTS["block_m"], FP8_TILE_DEFAULTS["block_n"])
    R, Mb, Kb = a.values.shape
    Nb = b.values.shape[-1]
    shapes = fp8_scale_shapes(R, Mb, Nb, Kb, bm, bn)
    sa, sb = np.zeros(shapes["SA"], np.float32), np.zeros(shapes["SB"], np.float32)
    sa[:, :, :Mb] = a.scales.transpose(0, 2, 1)
    sb[:, :b.scales.shape[2], :b.scales.shape[1]] = b.scales.transpose(0, 2, 1)
    return {"SA": sa, "SB": sb}


# ---- an LCMA through the pieces --------------------------------------------------------------
def _algorithm(alg):
    if alg is None:
        return catalogue.get("naive-1x1x1")
    return catalogue.get(alg) if isinstance(alg, str) else alg


def lcma_blocking(M: int, N: int, K: int, alg=None) -> Blocking:
    """The CUDA backend's blocks of ``alg`` (None: the plain GEMM) on M×N×K with 1-byte
    operands (K blocks rounded to 16 bytes)."""
    a = _algorithm(alg)
    return Blocking(M, N, K, a.m, a.k, a.n, a.R, k_align=16)


def _blocks_of(X: np.ndarray, p: int, q: int, rb: int, cb: int) -> np.ndarray:
    """X cut into p × q blocks of rb × cb (zero-padded past X), as [p·q, rb, cb] float64."""
    Xp = np.zeros((p * rb, q * cb))
    r, c = min(X.shape[0], p * rb), min(X.shape[1], q * cb)
    Xp[:r, :c] = X[:r, :c]
    return Xp.reshape(p, rb, q, cb).transpose(0, 2, 1, 3).reshape(p * q, rb, cb)


def _combined(coeffs: np.ndarray, X, p: int, q: int, rb: int, cb: int) -> np.ndarray:
    """Σ coeffs[r, i, l]·X_il over the nonzero coefficients (a block a product does not read
    stays out of it, inf or not) for every r, in float64, rounded to float32 once."""
    blocks = _blocks_of(np.asarray(X, dtype=np.float32).astype(np.float64), p, q, rb, cb)
    flat = coeffs.reshape(coeffs.shape[0], p * q)
    out = np.zeros((flat.shape[0], rb, cb))
    with np.errstate(invalid="ignore"):
        for r, row in enumerate(flat):
            for i in np.flatnonzero(row):
                out[r] += row[i] * blocks[i]
    return out.astype(np.float32)


def _checked_blocking(blocking: Blocking | None, a, M: int, N: int, K: int, sides: str) -> Blocking:
    """``blocking`` (default: the CUDA backend's for ``a``), checked against the operand's
    extents (``sides``: "MK" for A, "KN" for B)."""
    blk = blocking or lcma_blocking(M, N, K, a)
    if (blk.m, blk.k, blk.n) != a.grid:
        raise ValueError(f"the blocking is for a {blk.m}x{blk.k}x{blk.n} grid, {a.name} has {a.grid}")
    got, want = {"M": blk.M, "N": blk.N, "K": blk.K}, {"M": M, "N": N, "K": K}
    if any(got[d] != want[d] for d in sides):
        raise ValueError(f"the blocking is for {'x'.join(str(got[d]) for d in sides)} operands, "
                         f"this one is {'x'.join(str(want[d]) for d in sides)}")
    return blk


def combine_then_quantize(A, alg=None, fmt: Fp8BlockFormat = CONTRACT,
                          blocking: Blocking | None = None) -> BlockQuantized:
    """What a Combine-A kernel fused into the quantisation writes: every Ã_r of ``alg``
    (None: the plain GEMM, Ã = A) formed from A's blocks [Mb, Kb] (zero-padded) in float32,
    quantised per ``fmt.a_block`` of Ã_r: values [R, Mb, Kb], scales [R, Mb, ceil(Kb/128)]."""
    a = _algorithm(alg)
    A = np.asarray(A)
    M, K = A.shape
    blk = _checked_blocking(blocking, a, M, a.n, K, "MK")
    U, _, _ = a.as_float(np.float64)
    return quantize_blocks(_combined(U, A, a.m, a.k, blk.Mb, blk.Kb), fmt.a_block, fmt)


def prepare_b_fp8(B, alg=None, fmt: Fp8BlockFormat = CONTRACT,
                  blocking: Blocking | None = None) -> BlockQuantized:
    """B̃_r of ``alg`` (None: B) formed from B's blocks [Kb, Nb] in float32 and quantised per
    ``fmt.b_block`` of B̃_r (K × N), once: values [R, Kb, Nb], scales
    [R, ceil(Kb/128), ceil(Nb/bc)] (the kernels keep both K-major: ``LAYOUTS``)."""
    a = _algorithm(alg)
    B = np.asarray(B)
    K, N = B.shape
    blk = _checked_blocking(blocking, a, a.m, N, K, "KN")
    _, V, _ = a.as_float(np.float64)
    return quantize_blocks(_combined(V, B, a.k, a.n, blk.Kb, blk.Nb), fmt.b_block, fmt)


def _check_accumulate(accumulate: str) -> None:
    if accumulate not in ("float32", "float64"):
        raise ValueError(f"accumulate must be 'float32' (the kernels) or 'float64' (the exact "
                         f"product of the dequantised operands), got {accumulate!r}")


def fp8_gemm_reference(a: BlockQuantized, b: BlockQuantized, accumulate: str = "float32") -> np.ndarray:
    """H = Ã·B̃ from quantised operands ([..., M, K] and [..., K, N]), K block by K block:
    the exact product of the block's E4M3 values, then (``accumulate="float32"``, the
    kernels) rounded to float32, times sa·sb (a float32 product) rounded, added into a
    float32 sum; ``"float64"``: all of it in float64 (the product of the dequantised
    operands).  Returned as float64."""
    _check_accumulate(accumulate)
    kb = a.block[1]
    if b.block[0] != kb:
        raise ValueError(f"A's blocks span {kb} of K, B's {b.block[0]}: they must agree")
    M, K = a.values.shape[-2:]
    if b.values.shape[-2] != K:
        raise ValueError(f"inner dimensions differ: A has K = {K}, B has {b.values.shape[-2]}")
    N = b.values.shape[-1]
    sa = expand_scales(a.scales, (a.block[0], 1), (M, a.scales.shape[-1]))     # [.., M, nkb]
    sb = expand_scales(b.scales, (1, b.block[1]), (b.scales.shape[-2], N))     # [.., nkb, N]
    wide = accumulate == "float64"
    acc = np.zeros(np.broadcast_shapes(a.values.shape[:-2], b.values.shape[:-2]) + (M, N),
                   np.float64 if wide else np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        for j in range(ceil_div(K, kb)):
            ks = slice(j * kb, min((j + 1) * kb, K))
            part = np.matmul(a.values[..., ks].astype(np.float64), b.values[..., ks, :].astype(np.float64))
            if wide:
                acc += part * (sa[..., :, j, None].astype(np.float64) * sb[..., None, j, :])
            else:
                scale = sa[..., :, j, None] * sb[..., None, j, :]                # float32
                acc = acc + part.astype(np.float32) * scale
    return acc.astype(np.float64)


def combine_h_reference(H: np.ndarray, alg, blocking: Blocking, accumulate: str = "float32") -> np.ndarray:
    """C [M, N] from H [R, Mb, Nb]: C_ij = Σ_r W[r,i,j]·H_r, summed in r order in float32
    (or float64), before the output dtype's rounding."""
    _check_accumulate(accumulate)
    a = _algorithm(alg)
    _, _, W = a.as_float(np.float64)
    dt = np.float64 if accumulate == "float64" else np.float32
    H = np.asarray(H).astype(dt)
    Cb = np.zeros((a.m, a.n, blocking.Mb, blocking.Nb), dt)
    with np.errstate(invalid="ignore", over="ignore"):
        for r in range(a.R):
            for i, j in zip(*np.nonzero(W[r])):
                Cb[i, j] = Cb[i, j] + dt(W[r, i, j]) * H[r]
    C = Cb.transpose(0, 2, 1, 3).reshape(a.m * blocking.Mb, a.n * blocking.Nb)
    return C[:blocking.M, :blocking.N].astype(np.float64)


def fp8_lcma_reference(A, B, alg=None, fmt: Fp8BlockFormat = CONTRACT,
                       accumulate: str = "float32") -> np.ndarray:
    """C = A·B through ``alg`` (None: the plain GEMM) in block-scaled FP8: Combine A fused
    into the quantisation, B̃ prepared, the GEMM stage, Combine H (module doc); float64 [M, N]
    before the output dtype's rounding.  ``accumulate="float64"``: the float64 product of the
    dequantised operands, Σ_r W·(deq Ã_r)(deq B̃_r)."""
    A, B = np.asarray(A), np.asarray(B)
    if A.ndim != 2 or B.ndim != 2 or A.shape[1] != B.shape[0]:
        raise ValueError(f"fp8_lcma_reference multiplies M×K by K×N, got {A.shape} and {B.shape}")
    a = _algorithm(alg)
    blk = lcma_blocking(A.shape[0], B.shape[1], A.shape[1], a)
    at = combine_then_quantize(A, a, fmt, blk)
    bt = prepare_b_fp8(B, a, fmt, blk)
    return combine_h_reference(fp8_gemm_reference(at, bt, accumulate), a, blk, accumulate)
