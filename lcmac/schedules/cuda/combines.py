"""The element-wise combine templates: an LCMA's linear combinations of blocks, with the
coefficients folded in as literals (``common.evaluate``).

    combine_ab        group-parallel Combine A / Combine B: every input element read once,
                      all R outputs of the group written in the same pass (scaled fp16
                      operands: multiplied by their power-of-two scale, fp16x2 also writing
                      the lo halves)
    combine_b_kmajor  Combine B writing B̃ K-major (TF32 wgmma reads both operands K-major)
    combine_h         Algorithm 1's C_ij = Σ_r W[r,i,j] H_r
"""
# (no `from __future__ import annotations`: TileLang evaluates the Tensor annotations)

import tilelang.language as T
from tilelang.cuda.language import pdl_sync

from lcmac.schedules.cuda.common import (
    ACCUM, all_of, emit_names, evaluate, extents, keep_params, known, literal, run_time, unrolled, uses_pdl)
from lcmac.spec.cuda.blocking import Blocking
from lcmac.spec.cuda.config import CudaConfig
from lcmac.spec.cuda.dtypes import accum_dtype
from lcmac.spec.cuda.operands import SPLIT_SHIFT
from lcmac.schedules.cuda.low_precision import OPERAND_DTYPE, operand_scale


def assume_multiples(blk) -> None:
    """State a run-time blocking's divisibility (``rows.ShapeBlocking.multiples``) inside a
    kernel, so that its element-wise loops keep their vectors (TileLang vectorizes a loop
    over a run-time extent only where it can prove the vectors whole); nothing for a static
    blocking."""
    for size, unit in getattr(blk, "multiples", lambda: [])():
        if unit > 1:
            T.evaluate(T.assume(size % unit == 0))


def combine_ab(which: str, prog, blk: Blocking, dtype: str, cfg: CudaConfig, arch: str = "sm_90a",
               bound: int = 1):
    """Combine A (which="A": X=A [M,K] → Ã [R,Mb,Kb]) or Combine B (X=B [K,N] → B̃ [R,Kb,Nb]).

    Scaled operands (cfg.operands "fp16" / "fp16x2"; ``bound``: config.bound_exponent of the
    combine matrix): the outputs are fp16, multiplied by the power of two that
    ``operand_scale`` derives from S (the amax pass); "fp16x2" also writes the lo halves Xl."""
    if which == "A":
        P, Q, rows, cols, Rb, Cb = blk.m, blk.k, blk.M, blk.K, blk.Mb, blk.Kb
    else:
        P, Q, rows, cols, Rb, Cb = blk.k, blk.n, blk.K, blk.N, blk.Kb, blk.Nb
    R = prog.n_outputs        # blk.R, or fewer where the GEMM reads some operands in place
    tile_rows, tile_cols = cfg.combine_rows, cfg.combine_cols
    # columns: Cb and cols are multiples of 8, so an 8-wide vector is entirely in or out
    full_rows = [known((p + 1) * Rb <= rows) for p in range(P)]
    full_cols = [known((q + 1) * Cb <= cols) for q in range(Q)]

    pdl = uses_pdl(arch)
    operands = cfg.operands
    out_dtype = dtype if operands == "native" else OPERAND_DTYPE
    side = 0 if which == "A" else 1
    accum = accum_dtype(dtype)              # float64 combines in float64

    # a kernel of run-time sizes splits its CTAs into those inside every bound and the rest
    # (a static shape's code stays one form: its bounds fold where they are known)
    masks = run_time(rows, cols, Rb, Cb)

    @T.macro
    def store(Xt, Xl, S, outs, rr, cc):
        for r in unrolled(R):
            if operands == "native":
                Xt[r, rr, cc] = T.cast(outs[r], dtype)
            else:
                v = outs[r] * operand_scale(S, side, bound, False)
                Xt[r, rr, cc] = T.cast(v, out_dtype)
                if operands == "fp16x2":
                    Xl[r, rr, cc] = T.cast((v - T.cast(T.cast(v, out_dtype), ACCUM))
                                           * T.float32(2.0 ** SPLIT_SHIFT), out_dtype)

    @T.macro
    def tile(X, S, Xt, Xl, bx, by, masked):
        # masked: each input read checked against the operand's bounds (a CTA at its edge);
        # unmasked: straight reads (every read in bounds, every write inside Ã or B̃)
        for x, y in T.Parallel(tile_rows, tile_cols):
            rr = by * tile_rows + x
            cc = bx * tile_cols + y
            ins = []
            for p in unrolled(P):
                for q in unrolled(Q):
                    v = T.cast(X[p * Rb + rr, q * Cb + cc], accum)
                    conds = []
                    if masked and not full_rows[p]:
                        conds.append(p * Rb + rr < rows)
                    if masked and not full_cols[q]:
                        conds.append(q * Cb + cc < cols)
                    if conds:
                        v = T.if_then_else(all_of(conds), v, literal(0, v))
                    ins.append(v)
            outs = evaluate(prog, ins)
            if masked:
                if rr < Rb and cc < Cb:
                    store(Xt, Xl, S, outs, rr, cc)
            else:
                store(Xt, Xl, S, outs, rr, cc)

    @T.macro
    def body(X, S, Xt, Xl, bx, by):
        if pdl:
            pdl_sync()
        assume_multiples(blk)
        if masks:
            # run-time sizes: only the CTAs at the edges pay for the bound checks (a check
            # per input use costs Winograd²'s Combine A 2.8x, its 16 inputs feeding 49 sums)
            if ((by + 1) * tile_rows <= Rb and (bx + 1) * tile_cols <= Cb
                    and (P - 1) * Rb + (by + 1) * tile_rows <= rows
                    and (Q - 1) * Cb + (bx + 1) * tile_cols <= cols):
                tile(X, S, Xt, Xl, bx, by, False)
            else:
                tile(X, S, Xt, Xl, bx, by, True)
        else:
            tile(X, S, Xt, Xl, bx, by, True)

    @T.prim_func
    def lcmac_combine(X: T.Tensor(extents(rows, cols), dtype), S: T.Tensor((2,), "int32"),
                      Xt: T.Tensor(extents(R, Rb, Cb), out_dtype),
                      Xl: T.Tensor(extents(R, Rb, Cb), out_dtype)):
        with T.Kernel(T.ceildiv(Cb, tile_cols), T.ceildiv(Rb, tile_rows),
                      threads=cfg.combine_threads) as (bx, by):
            body(X, S, Xt, Xl, bx, by)

    # the scale word S only for scaled operands, the lo halves Xl only for fp16x2
    return keep_params(lcmac_combine, [0] + [1] * (operands != "native") + [2] + [3] * (operands == "fp16x2"))


def combine_b_kmajor(prog, blk: Blocking, dtype: str, cfg: CudaConfig, arch: str = "sm_90a"):
    """Combine B writing B̃ transposed, [R, Nb, Kb] (K contiguous): TF32 wgmma reads both
    operands K-major.  The k·n input tiles are staged in shared memory once, then every
    output is written with K as the contiguous (coalesced) index."""
    P, Q, R, rows, cols, Rb, Cb = blk.k, blk.n, blk.R, blk.K, blk.N, blk.Kb, blk.Nb
    tile_size = 32
    full_rows = [(p + 1) * Rb <= rows for p in range(P)]
    full_cols = [(q + 1) * Cb <= cols for q in range(Q)]

    pdl = uses_pdl(arch)
    @T.prim_func
    def lcmac_combine_t(X: T.Tensor(extents(rows, cols), dtype), Xt: T.Tensor(extents(R, Cb, Rb), dtype)):
        with T.Kernel(T.ceildiv(Cb, tile_size), T.ceildiv(Rb, tile_size), threads=256) as (bx, by):
            if pdl:
                pdl_sync()
            X_shared = T.alloc_shared((P * Q, tile_size, tile_size + 1), dtype)
            emit_names(S=X_shared)
            for p in unrolled(P):
                for q in unrolled(Q):
                    for x, y in T.Parallel(tile_size, tile_size):
                        rr = by * tile_size + x
                        cc = bx * tile_size + y
                        conds = []
                        if not full_rows[p]:
                            conds.append(p * Rb + rr < rows)
                        if not full_cols[q]:
                            conds.append(q * Cb + cc < cols)
                        v = X[p * Rb + rr, q * Cb + cc]
                        if conds:
                            v = T.if_then_else(all_of(conds), v, T.cast(0, dtype))
                        X_shared[p * Q + q, x, y] = v
            for y, x in T.Parallel(tile_size, tile_size):
                cc = bx * tile_size + y
                rr = by * tile_size + x
                ins = [T.cast(X_shared[i, x, y], ACCUM) for i in unrolled(P * Q)]
                outs = evaluate(prog, ins)
                if rr < Rb and cc < Cb:
                    for r in unrolled(R):
                        Xt[r, cc, rr] = T.cast(outs[r], dtype)

    return lcmac_combine_t


def combine_h(prog, alg, blk: Blocking, dtype: str, cfg: CudaConfig, arch: str = "sm_90a"):
    """C_ij = Σ_r W[r,i,j] H_r; H is fp32 with scaled operands (cfg.operands), else dtype;
    the sums in float32 (float64 for float64)."""
    R, Mb, Nb, M, N = blk.R, blk.Mb, blk.Nb, blk.M, blk.N
    h_dtype = dtype if cfg.operands == "native" else ACCUM
    accum = accum_dtype(dtype)
    tile_rows, tile_cols = cfg.combine_rows, cfg.combine_cols
    m, n = alg.m, alg.n
    rows_ok = [known((i + 1) * Mb <= M) for i in range(m)]
    cols_ok = [known((j + 1) * Nb <= N) for j in range(n)]

    pdl = uses_pdl(arch)
    @T.prim_func
    def lcmac_combine_h(H: T.Tensor(extents(R, Mb, Nb), h_dtype), C: T.Tensor(extents(M, N), dtype)):
        with T.Kernel(T.ceildiv(Nb, tile_cols), T.ceildiv(Mb, tile_rows),
                      threads=cfg.combine_threads) as (bx, by):
            if pdl:
                pdl_sync()
            assume_multiples(blk)
            # every CTA checks its writes: an unmasked copy for the interior CTAs of a run-time
            # shape made this kernel slower, unlike Combine A's and B's (bench/experiments/cuda.md)
            for x, y in T.Parallel(tile_rows, tile_cols):
                rr = by * tile_rows + x
                cc = bx * tile_cols + y
                if rr < Mb and cc < Nb:
                    ins = [T.cast(H[r, rr, cc], accum) for r in unrolled(R)]
                    outs = evaluate(prog, ins)
                    for i in unrolled(m):
                        for j in unrolled(n):
                            conds = []
                            if not rows_ok[i]:
                                conds.append(i * Mb + rr < M)
                            if not cols_ok[j]:
                                conds.append(j * Nb + cc < N)
                            if conds:
                                if all_of(conds):
                                    C[i * Mb + rr, j * Nb + cc] = T.cast(outs[i * n + j], dtype)
                            else:
                                C[i * Mb + rr, j * Nb + cc] = T.cast(outs[i * n + j], dtype)

    return lcmac_combine_h
