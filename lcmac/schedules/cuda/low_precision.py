"""The GEMM stage on narrower operands than the input (``CudaConfig.operands``).

Scaled fp16 ("fp16", "fp16x2"): an amax pass over A and over B, combines writing Ã/B̃ scaled
by a power of two (``combines.combine_ab``; fp16x2 also writes the lo halves), and

    operand_amax      S[side] = max |X| over the finite elements (as float bits)
    operand_scale     the power of two an operand is scaled by, built from S's exponent bits
    scaled_gemm       H_r (or C) = Ã_r·B̃_r from scaled fp16 operands, the scales undone in
                      the epilogue (fp16x2: hi·hi + 2⁻¹¹(hi·lo + lo·hi) per K step)

FP8 ("fp8"): E4M3 with float32 scales amax/448, Ã per 1×128, B̃ per 128×128
(lcmac.spec.fp8.CONTRACT).

    fp8_combine_a     Combine A fused into the quantisation of Ã (per row and 128 K)
    fp8_combine_b     Combine B quantizing B̃ per 128×128, written K-major (prepare_b)
    fp8_gemm          H_r (or C) = Σ_kb sa·sb·(Ã_r·B̃_r over the kb-th 128 K), fp8 wgmma
"""
# (no `from __future__ import annotations`: TileLang evaluates the Tensor annotations)

import tilelang.language as T
from tilelang.cuda.language import pdl_sync

from lcmac.schedules.cuda.common import (
    ACCUM, GemmTile, emit_names, evaluate, extents, keep_params, unrolled, uses_pdl)
from lcmac.spec.cuda.blocking import Blocking
from lcmac.spec.cuda.config import CudaConfig
from lcmac.spec.cuda.operands import (
    FP8_BLOCK, FP8_MAX, FP8_TINY, SCALED_TOP, SPLIT_SHIFT, fp8_scale_shapes as scale_shapes,
    fp8_tile_scale_blocks as tile_scale_blocks)
from lcmac.schedules.cuda.gemm import k_loop, store_tile

#: storage type of scaled operands
OPERAND_DTYPE = "float16"
#: storage type of fp8 operands
FP8 = "float8_e4m3"


# ---- scaled fp16 operands --------------------------------------------------------------------
def operand_scale(S, side: int, bound: int, inverse: bool):
    """2**e (or 2**-e) for operand ``side`` (0: A side, 1: B side) as an exact float32 built
    from bits: E = biased exponent of amax (S[side] holds its float bits, amax < 2**(E-126)),
    e = SCALED_TOP + 126 − E − bound, clamped to [−126, 126] — config.scale_exponent."""
    E = T.shift_right(S[side], 23)
    e = T.max(T.min(SCALED_TOP + 126 - bound - E, 126), -126)
    if inverse:
        e = -e
    return T.reinterpret(T.shift_left(e + 127, 23), "float32")


def operand_amax(rows: int, cols: int, dtype: str, side: int, arch: str = "sm_90a",
                 tile_rows: int = 16, tile_cols: int = 256, chunk: int = 8):
    """S[side] = max(S[side], bits of max |X| over the finite elements) (S zeroed by the
    entry point before).  Each CTA reduces a (chunk·tile_rows) × tile_cols strip: element-wise
    maxima in registers, one block reduction, one atomic; |x| ≥ 0, so comparing float bits as
    int32 orders them.  ±inf and NaN are left out: one inf would set a scale of 2⁻¹¹⁰ or so
    and flush every finite operand to zero (silently wrong outputs); left out, they stay
    inf/NaN in Ã/B̃ and reach only the outputs they reach in the native path."""
    pdl = uses_pdl(arch)

    @T.prim_func
    def lcmac_amax(X: T.Tensor(extents(rows, cols), dtype), S: T.Tensor((2,), "int32")):
        with T.Kernel(T.ceildiv(cols, tile_cols), T.ceildiv(rows, tile_rows * chunk),
                      threads=256) as (bx, by):
            if pdl:
                pdl_sync()
            tile_max = T.alloc_fragment((tile_rows, tile_cols), ACCUM)
            row_max = T.alloc_fragment((tile_rows,), ACCUM)
            amax = T.alloc_fragment((1,), ACCUM)
            emit_names(F=tile_max, mx=row_max, m1=amax)
            T.fill(tile_max, 0)
            for c in T.serial(chunk):
                for x, y in T.Parallel(tile_rows, tile_cols):
                    r = (by * chunk + c) * tile_rows + x
                    cc = bx * tile_cols + y
                    v = T.abs(T.cast(X[r, cc], ACCUM))
                    tile_max[x, y] = T.max(tile_max[x, y], T.if_then_else(
                        T.And(T.And(r < rows, cc < cols), v < T.infinity(ACCUM)), v, T.float32(0)))
            T.reduce_max(tile_max, row_max, dim=1)
            T.reduce_max(row_max, amax, dim=0)
            if T.get_thread_binding(0) == 0:
                T.atomic_max(S[side], T.reinterpret(amax[0], "int32"))

    return lcmac_amax


def scaled_gemm(blk: Blocking, dtype: str, cfg: CudaConfig, bounds: tuple[int, int],
                direct: bool, arch: str = "sm_90a"):
    """The GEMM stage on scaled fp16 operands: for every r, H_r = 2**-(eA+eB) · Ã_r·B̃_r in
    fp32 ([R, Mb, Nb]), or C itself (``direct``: the plain GEMM, R = 1, C [M, N] in dtype).
    fp16x2: every K step's products land in a fresh fragment (hi·lo + lo·hi, then hi·hi)
    and are added into the fp32 accumulator by ordinary (round-to-nearest) adds: the tensor
    cores' own fp32 accumulation over the whole K loses bits (docs/cuda-templates.md), so it
    only ever sums one block_k-long slice.  r is the slowest grid index (cache-aware order)."""
    tile = GemmTile.of(cfg, OPERAND_DTYPE)
    block_m, block_n, block_k = tile.block_m, tile.block_n, tile.block_k
    R, Mb, Nb, Kb = blk.R, blk.Mb, blk.Nb, blk.Kb
    gx, gy = -(-Nb // block_n), -(-Mb // block_m)
    split = cfg.operands == "fp16x2"
    op_dtype = OPERAND_DTYPE
    out_shape = (blk.M, blk.N) if direct else (R, Mb, Nb)
    out_dtype = dtype if direct else ACCUM
    pdl = uses_pdl(arch)
    bound_a, bound_b = bounds

    @T.macro
    def h_tile(At, Al, Bt, Bl, S, out, bx, by, bz):
        A_shared = T.alloc_shared((block_m, block_k), op_dtype)
        B_shared = T.alloc_shared((block_k, block_n), op_dtype)
        C_local = T.alloc_fragment((block_m, block_n), ACCUM)
        emit_names(A_s=A_shared, B_s=B_shared, C_h=C_local)
        if split:
            A_lo_shared = T.alloc_shared((block_m, block_k), op_dtype)
            B_lo_shared = T.alloc_shared((block_k, block_n), op_dtype)
            C_step = T.alloc_fragment((block_m, block_n), ACCUM)
            emit_names(Al_s=A_lo_shared, Bl_s=B_lo_shared, C_t=C_step)
        T.use_swizzle(panel_size=max(tile.swizzle, 1), enable=tile.swizzle > 0)
        a_slab = lambda X, ko: X[bz, by * block_m:(by + 1) * block_m,  # noqa: E731
                                 ko * block_k:(ko + 1) * block_k]
        b_slab = lambda X, ko: X[bz, ko * block_k:(ko + 1) * block_k,  # noqa: E731
                                 bx * block_n:(bx + 1) * block_n]
        if split:
            T.clear(C_local)
            for ko in T.Pipelined(T.ceildiv(Kb, block_k), num_stages=tile.num_stages):
                T.copy(a_slab(At, ko), A_shared)
                T.copy(b_slab(Bt, ko), B_shared)
                T.copy(a_slab(Al, ko), A_lo_shared)
                T.copy(b_slab(Bl, ko), B_lo_shared)
                T.gemm(A_shared, B_lo_shared, C_step, policy=tile.policy, clear_accum=True)
                T.gemm(A_lo_shared, B_shared, C_step, policy=tile.policy)
                for x, y in T.Parallel(block_m, block_n):
                    C_local[x, y] = C_local[x, y] + C_step[x, y] * T.float32(2.0 ** -SPLIT_SHIFT)
                T.gemm(A_shared, B_shared, C_step, policy=tile.policy, clear_accum=True)
                for x, y in T.Parallel(block_m, block_n):
                    C_local[x, y] = C_local[x, y] + C_step[x, y]
        else:
            k_loop(lambda ko: a_slab(At, ko), lambda ko: b_slab(Bt, ko), A_shared, B_shared, C_local,
                   T.ceildiv(Kb, block_k), tile.num_stages, tile.policy, False)
        inv = operand_scale(S, 0, bound_a, True) * operand_scale(S, 1, bound_b, True)
        for x, y in T.Parallel(block_m, block_n):
            C_local[x, y] = C_local[x, y] * inv
        if direct:
            store_tile(C_local, out[by * block_m, bx * block_n], out_dtype, tile)
        else:
            store_tile(C_local, out[bz, by * block_m:(by + 1) * block_m, bx * block_n:(bx + 1) * block_n],
                       out_dtype, tile)

    ops = extents(R, Mb, Kb), extents(R, Kb, Nb), extents(*out_shape)

    @T.prim_func
    def lcmac_sgemm(At: T.Tensor(ops[0], op_dtype), Al: T.Tensor(ops[0], op_dtype),
                    Bt: T.Tensor(ops[1], op_dtype), Bl: T.Tensor(ops[1], op_dtype),
                    S: T.Tensor((2,), "int32"), Out: T.Tensor(ops[2], out_dtype)):
        with T.Kernel(gx, gy, R, threads=cfg.threads) as (bx, by, bz):
            if pdl:
                pdl_sync()
            h_tile(At, Al, Bt, Bl, S, Out, bx, by, bz)

    # the lo halves Al / Bl only for fp16x2
    return keep_params(lcmac_sgemm, [0, 1, 2, 3, 4, 5] if split else [0, 2, 4, 5])


# ---- FP8 operands: block-scaled E4M3 (lcmac.spec.fp8.CONTRACT) --------------------------------
def fp8_scale_shapes(blk: Blocking, cfg: CudaConfig) -> dict:
    """Scale buffers SA [R, nkb, Mb'] and SB [R, Nb', L4] (``spec.cuda.operands.fp8_scale_shapes``)."""
    return scale_shapes(blk.R, blk.Mb, blk.Nb, blk.Kb, cfg.block_m, cfg.block_n)


@T.macro
def _quantize_rows(F_local, amax_local, Xt, Sc, r, rows0, cols0, kb, nrows, ncols, rlim, clim):
    """Quantize the fp32 tile F_local (nrows × 128 along K) row by row: Sc[r, kb, row] =
    block amax / 448, Xt[r, row, col] = E4M3(F · (448 / amax)) for the rows < rlim, cols < clim
    (true divisions, as the contract's)."""
    T.reduce_absmax(F_local, amax_local, dim=1)
    for x in T.Parallel(nrows):
        amax_local[x] = T.max(amax_local[x], T.float32(FP8_TINY))
    for x, y in T.Parallel(nrows, ncols):
        if rows0 + x < rlim and cols0 + y < clim:
            Xt[r, rows0 + x, cols0 + y] = T.cast(F_local[x, y] * (T.float32(FP8_MAX) / amax_local[x]), FP8)
    for x in T.Parallel(nrows):
        if rows0 + x < rlim:
            Sc[r, kb, rows0 + x] = amax_local[x] / T.float32(FP8_MAX)


def fp8_combine_a(prog, blk: Blocking, dtype: str, cfg: CudaConfig, arch: str = "sm_90a"):
    """Combine A fused into the quantisation: every Ã_r [R, Mb, Kb] formed in fp32 from A's
    blocks and written as E4M3 with SA, one scale per row and 128 K (``fp8_scale_shapes``).
    A CTA stages 16 rows × one 128-wide K block of every input block A_pq in shared memory,
    then quantizes that block of all R outputs, each row by its amax."""
    P, Q, rows, cols, Rb, Cb = blk.m, blk.k, blk.M, blk.K, blk.Mb, blk.Kb
    R, k_block, per_cta = blk.R, FP8_BLOCK, 16
    sc_shape = fp8_scale_shapes(blk, cfg)["SA"]
    pdl = uses_pdl(arch)

    @T.prim_func
    def lcmac_combine_fp8(X: T.Tensor(extents(rows, cols), dtype), Xt: T.Tensor(extents(R, Rb, Cb), FP8),
                          SA: T.Tensor(extents(*sc_shape), ACCUM)):
        with T.Kernel(T.ceildiv(Cb, k_block), T.ceildiv(Rb, per_cta), threads=128) as (bx, by):
            if pdl:
                pdl_sync()
            X_shared = T.alloc_shared((P * Q, per_cta, k_block), dtype)
            F_local = T.alloc_fragment((per_cta, k_block), ACCUM)
            amax_local = T.alloc_fragment((per_cta,), ACCUM)
            emit_names(S=X_shared, F=F_local, amax=amax_local)
            for p in unrolled(P):
                for q in unrolled(Q):
                    for x, y in T.Parallel(per_cta, k_block):
                        rr, cc = by * per_cta + x, bx * k_block + y
                        X_shared[p * Q + q, x, y] = T.if_then_else(
                            T.And(T.And(p * Rb + rr < rows, rr < Rb), T.And(q * Cb + cc < cols, cc < Cb)),
                            X[p * Rb + rr, q * Cb + cc], T.cast(0, dtype))
            for r in unrolled(R):
                for o, k in T.Parallel(per_cta, k_block):
                    ins = [T.cast(X_shared[i, o, k], ACCUM) for i in unrolled(P * Q)]
                    F_local[o, k] = evaluate(prog, ins)[r]
                _quantize_rows(F_local, amax_local, Xt, SA, r, by * per_cta, bx * k_block, bx,
                               per_cta, k_block, Rb, Cb)

    return lcmac_combine_fp8


def fp8_combine_b(prog, blk: Blocking, dtype: str, cfg: CudaConfig, arch: str = "sm_90a"):
    """Combine B quantizing per 128×128 block (``prepare_b``: once per weight): every B̃_r
    formed in fp32 from B's blocks, written K-major [R, Nb, Kb] (fp8 wgmma reads both operands
    K-major) as E4M3 with SB [R, Nb', L4], one scale per 128 K × 128 N.  A CTA owns one such
    block of all R outputs and walks it in four 32-column strips twice: the first pass takes
    each B̃_r's block amax, the second recomputes the strips and quantizes them by it (the
    strips staged [column, K] in shared memory, B transposed on the way, its reads coalesced
    along N), so the shared memory is k·n strips whatever the scheme."""
    P, Q, rows, cols, Rb, Cb = blk.k, blk.n, blk.K, blk.N, blk.Kb, blk.Nb
    R, k_block, strip, pad = blk.R, FP8_BLOCK, 32, 2          # +2: fewer bank conflicts
    strips = FP8_BLOCK // strip
    sc_shape = fp8_scale_shapes(blk, cfg)["SB"]
    pdl = uses_pdl(arch)

    @T.macro
    def stage(X, X_shared, bx, by, s):
        # strip s of the CTA's 128 columns: K rows bx·128.., columns by·128 + s·32..
        for p in unrolled(P):
            for q in unrolled(Q):
                for x, y in T.Parallel(k_block, strip):
                    kk, nn = bx * k_block + x, by * FP8_BLOCK + s * strip + y
                    X_shared[p * Q + q, y, x] = T.if_then_else(
                        T.And(T.And(p * Rb + kk < rows, kk < Rb), T.And(q * Cb + nn < cols, nn < Cb)),
                        X[p * Rb + kk, q * Cb + nn], T.cast(0, dtype))

    @T.prim_func
    def lcmac_combine_fp8(X: T.Tensor(extents(rows, cols), dtype), Xt: T.Tensor(extents(R, Cb, Rb), FP8),
                          SB: T.Tensor(extents(*sc_shape), ACCUM)):
        with T.Kernel(T.ceildiv(Rb, k_block), T.ceildiv(Cb, FP8_BLOCK), threads=128) as (bx, by):
            if pdl:
                pdl_sync()
            X_shared = T.alloc_shared((P * Q, strip, k_block + pad), dtype)
            F_local = T.alloc_fragment((strip, k_block), ACCUM)
            row_max = T.alloc_fragment((strip,), ACCUM)
            strip_max = T.alloc_fragment((1,), ACCUM)
            block_max = T.alloc_local((R,), ACCUM)
            emit_names(S=X_shared, F=F_local, mx=row_max, m1=strip_max, amax=block_max)
            for r in unrolled(R):
                block_max[r] = T.float32(FP8_TINY)
            for s in T.serial(strips):        # a loop: each unrolled copy costs lowering time
                stage(X, X_shared, bx, by, s)
                for r in unrolled(R):
                    for o, k in T.Parallel(strip, k_block):
                        ins = [T.cast(X_shared[i, o, k], ACCUM) for i in unrolled(P * Q)]
                        F_local[o, k] = evaluate(prog, ins)[r]
                    T.reduce_absmax(F_local, row_max, dim=1)
                    T.reduce_max(row_max, strip_max, dim=0)
                    block_max[r] = T.max(block_max[r], strip_max[0])
            for s in T.serial(strips):
                stage(X, X_shared, bx, by, s)
                for r in unrolled(R):
                    for o, k in T.Parallel(strip, k_block):
                        ins = [T.cast(X_shared[i, o, k], ACCUM) for i in unrolled(P * Q)]
                        nn, kk = by * FP8_BLOCK + s * strip + o, bx * k_block + k
                        if nn < Cb and kk < Rb:
                            Xt[r, nn, kk] = T.cast(evaluate(prog, ins)[r] * (T.float32(FP8_MAX) / block_max[r]), FP8)
            if T.get_thread_binding(0) == 0:
                for r in unrolled(R):
                    SB[r, by, bx] = block_max[r] / T.float32(FP8_MAX)

    return lcmac_combine_fp8


def col_scale(SB_shared, col, ko, nbs: int, aligned: bool):
    """B̃'s scale of tile column ``col`` (counted from the tile's first scale block): an index
    where tiles are aligned to the blocks, else a chain of selects (the block is a run-time
    fact there; selects, not a shared-memory load per element)."""
    if nbs == 1:
        return SB_shared[0, ko]
    if aligned:
        return SB_shared[col // FP8_BLOCK, ko]
    out = SB_shared[nbs - 1, ko]
    for j in range(nbs - 2, -1, -1):
        out = T.if_then_else(col < (j + 1) * FP8_BLOCK, SB_shared[j, ko], out)
    return out


def fp8_gemm(blk: Blocking, dtype: str, cfg: CudaConfig, direct: bool, arch: str = "sm_90a"):
    """The GEMM stage on block-scaled E4M3 operands, as DeepGEMM's: per 128-wide K block the
    wgmma product lands in a fresh fp32 fragment, and C += that · (SA[row] · SB), SB being one
    scalar per 128 columns (the CTA's B̃ scales for the whole K, read into shared memory once
    before the K loop; SA's block comes with A's slab through the pipeline).  TMA loads, a
    warp-specialised pipeline (TileLang's on sm_90a).  Writes fp32 H [R, Mb, Nb], or C [M, N]
    in dtype (``direct``: the plain GEMM, R = 1)."""
    tile = GemmTile.of(cfg, FP8)
    block_m, block_n, block_k = tile.block_m, tile.block_n, tile.block_k
    R, Mb, Nb, Kb = blk.R, blk.Mb, blk.Nb, blk.Kb
    gx, gy = -(-Nb // block_n), -(-Mb // block_m)
    scales = fp8_scale_shapes(blk, cfg)
    l4 = scales["SB"][2]
    # the 128-column scale blocks a tile meets: one (block_n divides 128), block_n / 128
    # (a multiple of 128), else a tile straddles blocks at a run-time column
    nbs = tile_scale_blocks(block_n)
    aligned = FP8_BLOCK % block_n == 0 or block_n % FP8_BLOCK == 0
    out_shape = (blk.M, blk.N) if direct else (R, Mb, Nb)
    out_dtype = dtype if direct else ACCUM
    pdl = uses_pdl(arch)
    num_k = -(-Kb // block_k)

    @T.prim_func
    def lcmac_fp8_gemm(At: T.Tensor(extents(R, Mb, Kb), FP8), Bt: T.Tensor(extents(R, Nb, Kb), FP8),
                       SA: T.Tensor(extents(*scales["SA"]), ACCUM),
                       SB: T.Tensor(extents(*scales["SB"]), ACCUM),
                       Out: T.Tensor(extents(*out_shape), out_dtype)):
        with T.Kernel(gx, gy, R, threads=cfg.threads) as (bx, by, bz):
            if pdl:
                pdl_sync()
            A_shared = T.alloc_shared((block_m, block_k), FP8)
            B_shared = T.alloc_shared((block_n, block_k), FP8)
            SA_shared = T.alloc_shared((block_m,), ACCUM)
            SB_shared = T.alloc_shared((nbs, l4), ACCUM)
            C_step = T.alloc_fragment((block_m, block_n), ACCUM)
            C_local = T.alloc_fragment((block_m, block_n), ACCUM)
            emit_names(A_s=A_shared, B_s=B_shared, sa=SA_shared, sb=SB_shared, C_t=C_step, C_h=C_local)
            T.use_swizzle(panel_size=max(tile.swizzle, 1), enable=tile.swizzle > 0)
            nb0 = bx * block_n // FP8_BLOCK
            for j, kb in T.Parallel(nbs, l4):
                SB_shared[j, kb] = SB[bz, nb0 + j, kb]
            # the tile's first column within its first scale block (0 where tiles are aligned)
            offset = 0 if aligned else bx * block_n - nb0 * FP8_BLOCK
            T.clear(C_local)
            for ko in T.Pipelined(num_k, num_stages=tile.num_stages):
                T.copy(At[bz, by * block_m:(by + 1) * block_m, ko * block_k:(ko + 1) * block_k], A_shared)
                T.copy(Bt[bz, bx * block_n:(bx + 1) * block_n, ko * block_k:(ko + 1) * block_k], B_shared)
                T.copy(SA[bz, ko, by * block_m:(by + 1) * block_m], SA_shared)
                T.gemm(A_shared, B_shared, C_step, transpose_B=True, policy=tile.policy, clear_accum=True)
                for x, y in T.Parallel(block_m, block_n):
                    C_local[x, y] = C_local[x, y] + C_step[x, y] * (SA_shared[x] * col_scale(SB_shared, offset + y, ko, nbs, aligned))
            if direct:
                store_tile(C_local, Out[by * block_m, bx * block_n], out_dtype, tile)
            else:
                store_tile(C_local, Out[bz, by * block_m:(by + 1) * block_m, bx * block_n:(bx + 1) * block_n],
                           out_dtype, tile)

    return lcmac_fp8_gemm
