"""TileLang templates for the CUDA targets (imported only inside the TileLang worker).

Each template takes an ir program (coefficients folded in as Python constants, so they end
up as literals in the generated CUDA) and a ``CudaConfig``, and returns a ``T.prim_func``.

    plain_gemm        C = A·B (tensor cores via T.gemm: wgmma on sm_90a, mma on sm_80)
    combine_ab        group-parallel Combine A / Combine B: every input element read once,
                      all R outputs of the group written in the same pass
    fused_gemm_h      GEMM + Combine H: a CTA owns one tile position (x, y); for r in a fixed
                      order it computes the H_r tile (fp32 accumulators, pipelined K loop) and
                      adds W[r,i,j]·H_r into every C_ij tile at (x, y).  C_ij tiles belong to
                      that CTA alone (no atomics); the first contribution writes, later ones
                      read-modify-write in a fixed order (deterministic).
    batched_gemm      Algorithm 1: H_r = Ã_r·B̃_r for all r (grid z = r)
    combine_h         Algorithm 1: C_ij = Σ W[r,i,j] H_r
"""
# (no `from __future__ import annotations`: TileLang evaluates the Tensor annotations)

from fractions import Fraction

import tilelang.language as T

from .cuda_config import Blocking, CudaConfig, r_order

ACCUM = "float32"


def _static(n: int) -> list[int]:
    """A Python list: TileLang's builder unrolls loops over lists at trace time (a `range`
    would become a TIR serial loop)."""
    return list(range(n))


def _policy(cfg, dtype="bfloat16"):
    if cfg.policy == "auto":
        return T.GemmWarpPolicy.Square if dtype == "float32" else T.GemmWarpPolicy.FullRow
    return {"square": T.GemmWarpPolicy.Square, "fullrow": T.GemmWarpPolicy.FullRow,
            "fullcol": T.GemmWarpPolicy.FullCol}[cfg.policy]


def _scaled(c, x):
    """c·x with c an exact constant, emitted as a literal (±1 become add/sub)."""
    if c == 1:
        return x
    if c == -1:
        return -x
    return T.float32(float(Fraction(c))) * x


def _lin(expr, slots):
    acc = None
    for c, s in expr:
        if acc is None:
            acc = _scaled(c, slots[s])
        elif c == -1:
            acc = acc - slots[s]
        elif c == 1:
            acc = acc + slots[s]
        else:
            acc = acc + _scaled(c, slots[s])
    return acc if acc is not None else T.float32(0)


def _evaluate(prog, inputs):
    slots = list(inputs)
    for t in prog.temps:
        slots.append(_lin(t, slots))
    return [_lin(o, slots) for o in prog.outputs]


# ----------------------------------------------------------------------------------------------
def plain_gemm(M: int, N: int, K: int, dtype: str, cfg: CudaConfig):
    bm, bn, bk = cfg.block_m, cfg.block_n, cfg.bk(dtype)
    pol = _policy(cfg, dtype)
    out_dtype = dtype

    @T.prim_func
    def lcmac_gemm(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype),
                   C: T.Tensor((M, N), out_dtype)):
        with T.Kernel(T.ceildiv(N, bn), T.ceildiv(M, bm), threads=cfg.threads) as (bx, by):
            A_s = T.alloc_shared((bm, bk), dtype)
            B_s = T.alloc_shared((bk, bn), dtype)
            C_l = T.alloc_fragment((bm, bn), ACCUM)
            T.use_swizzle(panel_size=max(cfg.swizzle, 1), enable=cfg.swizzle > 0)
            T.clear(C_l)
            for ko in T.Pipelined(T.ceildiv(K, bk), num_stages=cfg.stages):
                T.copy(A[by * bm, ko * bk], A_s)
                T.copy(B[ko * bk, bx * bn], B_s)
                T.gemm(A_s, B_s, C_l, policy=pol)
            T.copy(C_l, C[by * bm, bx * bn])

    return lcmac_gemm


def plain_gemm_kmajor(M: int, N: int, K: int, Nb: int, Kb: int, dtype: str, cfg: CudaConfig):
    """C = A · Bt^T with Bt [Nb, Kb] K-major (TF32 wgmma for float32 on sm_90a)."""
    bm, bn, bk = cfg.block_m, cfg.block_n, cfg.bk(dtype)
    sdt = T.tfloat32 if dtype == "float32" else dtype   # TileLang picks wgmma only for tf32 tiles
    pol = _policy(cfg, dtype)

    @T.prim_func
    def lcmac_gemm_t(A: T.Tensor((M, K), dtype), Bt: T.Tensor((Nb, Kb), dtype),
                     C: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, bn), T.ceildiv(M, bm), threads=cfg.threads) as (bx, by):
            A_s = T.alloc_shared((bm, bk), sdt)
            B_s = T.alloc_shared((bn, bk), sdt)
            C_l = T.alloc_fragment((bm, bn), ACCUM)
            T.use_swizzle(panel_size=max(cfg.swizzle, 1), enable=cfg.swizzle > 0)
            T.clear(C_l)
            for ko in T.Pipelined(T.ceildiv(K, bk), num_stages=cfg.stages):
                T.copy(A[by * bm, ko * bk], A_s)
                T.copy(Bt[bx * bn, ko * bk], B_s)
                T.gemm(A_s, B_s, C_l, transpose_B=True, policy=pol)
            T.copy(C_l, C[by * bm, bx * bn])

    return lcmac_gemm_t


# ----------------------------------------------------------------------------------------------
def combine_ab(which: str, prog, blk: Blocking, dtype: str, cfg: CudaConfig):
    """Combine A (which="A": X=A [M,K] → Ã [R,Mb,Kb]) or Combine B (X=B [K,N] → B̃ [R,Kb,Nb])."""
    if which == "A":
        P, Q, rows, cols, Rb, Cb = blk.m, blk.k, blk.M, blk.K, blk.Mb, blk.Kb
    else:
        P, Q, rows, cols, Rb, Cb = blk.k, blk.n, blk.K, blk.N, blk.Kb, blk.Nb
    R = blk.R
    tr, tc = cfg.combine_rows, cfg.combine_cols
    # columns: Cb and cols are multiples of 8, so an 8-wide vector is entirely in or out
    full_rows = [(p + 1) * Rb <= rows for p in range(P)]
    full_cols = [(q + 1) * Cb <= cols for q in range(Q)]

    @T.prim_func
    def lcmac_combine(X: T.Tensor((rows, cols), dtype), Xt: T.Tensor((R, Rb, Cb), dtype)):
        with T.Kernel(T.ceildiv(Cb, tc), T.ceildiv(Rb, tr), threads=cfg.combine_threads) as (bx, by):
            for x, y in T.Parallel(tr, tc):
                rr = by * tr + x
                cc = bx * tc + y
                ins = []
                for p in _static(P):
                    for q in _static(Q):
                        v = T.cast(X[p * Rb + rr, q * Cb + cc], ACCUM)
                        conds = []
                        if not full_rows[p]:
                            conds.append(p * Rb + rr < rows)
                        if not full_cols[q]:
                            conds.append(q * Cb + cc < cols)
                        if conds:
                            cond = conds[0] if len(conds) == 1 else T.And(conds[0], conds[1])
                            v = T.if_then_else(cond, v, T.float32(0))
                        ins.append(v)
                outs = _evaluate(prog, ins)
                if rr < Rb and cc < Cb:
                    for r in _static(R):
                        Xt[r, rr, cc] = T.cast(outs[r], dtype)

    return lcmac_combine


def combine_b_kmajor(prog, blk: Blocking, dtype: str, cfg: CudaConfig, P=None, Q=None, R=None,
                     rows=None, cols=None, Rb=None, Cb=None):
    """Combine B writing B̃ transposed, [R, Nb, Kb] (K contiguous): TF32 wgmma reads both
    operands K-major.  The m·k... input tiles are staged in shared memory once, then every
    output is written with K as the contiguous (coalesced) index."""
    P = blk.k if P is None else P
    Q = blk.n if Q is None else Q
    R = blk.R if R is None else R
    rows = blk.K if rows is None else rows
    cols = blk.N if cols is None else cols
    Rb = blk.Kb if Rb is None else Rb
    Cb = blk.Nb if Cb is None else Cb
    t = 32
    full_rows = [(p + 1) * Rb <= rows for p in range(P)]
    full_cols = [(q + 1) * Cb <= cols for q in range(Q)]

    @T.prim_func
    def lcmac_combine_t(X: T.Tensor((rows, cols), dtype), Xt: T.Tensor((R, Cb, Rb), dtype)):
        with T.Kernel(T.ceildiv(Cb, t), T.ceildiv(Rb, t), threads=256) as (bx, by):
            S = T.alloc_shared((P * Q, t, t + 1), dtype)
            for p in _static(P):
                for q in _static(Q):
                    for x, y in T.Parallel(t, t):
                        rr = by * t + x
                        cc = bx * t + y
                        conds = []
                        if not full_rows[p]:
                            conds.append(p * Rb + rr < rows)
                        if not full_cols[q]:
                            conds.append(q * Cb + cc < cols)
                        v = X[p * Rb + rr, q * Cb + cc]
                        if conds:
                            cond = conds[0] if len(conds) == 1 else T.And(conds[0], conds[1])
                            v = T.if_then_else(cond, v, T.cast(0, dtype))
                        S[p * Q + q, x, y] = v
            for y, x in T.Parallel(t, t):
                cc = bx * t + y
                rr = by * t + x
                ins = [T.cast(S[i, x, y], ACCUM) for i in _static(P * Q)]
                outs = _evaluate(prog, ins)
                if rr < Rb and cc < Cb:
                    for r in _static(R):
                        Xt[r, cc, rr] = T.cast(outs[r], dtype)

    return lcmac_combine_t


# ----------------------------------------------------------------------------------------------
def _select(values, s):
    """values[s] for a run-time s, as a chain of selects with literal values."""
    if values == list(range(len(values))):
        return s
    e = values[-1]
    for idx in range(len(values) - 2, -1, -1):
        e = T.if_then_else(s == idx, values[idx], e)
    return e


def _contributions(alg):
    """contrib[r] = [(i, j, W[r,i,j])] for the non-zero coefficients."""
    out = []
    for r in range(alg.R):
        out.append([(i, j, alg.W[r, i, j]) for i in range(alg.m) for j in range(alg.n)
                    if alg.W[r, i, j] != 0])
    return out


def fused_gemm_h(alg, blk: Blocking, dtype: str, cfg: CudaConfig):
    bm, bn, bk = cfg.block_m, cfg.block_n, cfg.bk(dtype)
    pol = _policy(cfg, dtype)
    M, N, R, Mb, Nb, Kb = blk.M, blk.N, blk.R, blk.Mb, blk.Nb, blk.Kb
    if not cfg.cache_aware:
        from .cuda_config import NotSupportedYet
        raise NotSupportedYet("cache_aware=False (staggered r order) is not supported yet; every "
                              "CTA walks the products in the same order")
    order = r_order(alg.W, cfg.r_order)
    contrib = _contributions(alg)
    seen = set()
    plan = []            # (r, [(i, j, coeff, first)])
    for r in order:
        items = []
        for (i, j, w) in contrib[r]:
            items.append((i, j, w, (i, j) not in seen))
            seen.add((i, j))
        plan.append((r, items))
    plan_s = [(si, items) for si, (_, items) in enumerate(plan)]
    out_dtype = dtype
    nk = -(-Kb // bk)
    full_m = Mb % bm == 0
    full_n = Nb % bn == 0
    rows_ok = [(i + 1) * Mb <= M for i in range(alg.m)]
    cols_ok = [(j + 1) * Nb <= N for j in range(alg.n)]

    @T.prim_func
    def lcmac_fused_flat(At: T.Tensor((R, Mb, Kb), dtype), Bt: T.Tensor((R, Kb, Nb), dtype),
                    C: T.Tensor((M, N), out_dtype)):
        with T.Kernel(T.ceildiv(Nb, bn), T.ceildiv(Mb, bm), threads=cfg.threads) as (bx, by):
            A_s = T.alloc_shared((bm, bk), dtype)
            B_s = T.alloc_shared((bk, bn), dtype)
            H = T.alloc_fragment((bm, bn), ACCUM)
            T.use_swizzle(panel_size=max(cfg.swizzle, 1), enable=cfg.swizzle > 0)
            for it in T.Pipelined(R * nk, num_stages=cfg.stages):
                s = it // nk
                ko = it % nk
                r = _select(order, s)
                T.copy(At[r, by * bm:(by + 1) * bm, ko * bk:(ko + 1) * bk], A_s)
                T.copy(Bt[r, ko * bk:(ko + 1) * bk, bx * bn:(bx + 1) * bn], B_s)
                T.gemm(A_s, B_s, H, policy=pol, clear_accum=ko == 0)
                for s0, items in plan_s:
                    if it == s0 * nk + nk - 1:
                        for (i, j, w, first) in items:
                            for x, y in T.Parallel(bm, bn):
                                row = by * bm + x
                                col = bx * bn + y
                                conds = []
                                if not full_m:
                                    conds.append(row < Mb)
                                if not full_n:
                                    conds.append(col < Nb)
                                if not rows_ok[i]:
                                    conds.append(i * Mb + row < M)
                                if not cols_ok[j]:
                                    conds.append(j * Nb + col < N)
                                if first:
                                    val = _scaled(w, H[x, y])
                                else:
                                    val = T.cast(C[i * Mb + row, j * Nb + col], ACCUM) + _scaled(w, H[x, y])
                                if conds:
                                    cond = conds[0]
                                    for c in conds[1:]:
                                        cond = T.And(cond, c)
                                    if cond:
                                        C[i * Mb + row, j * Nb + col] = T.cast(val, out_dtype)
                                else:
                                    C[i * Mb + row, j * Nb + col] = T.cast(val, out_dtype)


    @T.prim_func
    def lcmac_fused(At: T.Tensor((R, Mb, Kb), dtype), Bt: T.Tensor((R, Kb, Nb), dtype),
                    C: T.Tensor((M, N), out_dtype)):
        with T.Kernel(T.ceildiv(Nb, bn), T.ceildiv(Mb, bm), threads=cfg.threads) as (bx, by):
            A_s = T.alloc_shared((bm, bk), dtype)
            B_s = T.alloc_shared((bk, bn), dtype)
            H = T.alloc_fragment((bm, bn), ACCUM)
            T.use_swizzle(panel_size=max(cfg.swizzle, 1), enable=cfg.swizzle > 0)
            for s in T.serial(R):
                r = _select(order, s)
                T.clear(H)
                for ko in T.Pipelined(T.ceildiv(Kb, bk), num_stages=cfg.stages):
                    T.copy(At[r, by * bm:(by + 1) * bm, ko * bk:(ko + 1) * bk], A_s)
                    T.copy(Bt[r, ko * bk:(ko + 1) * bk, bx * bn:(bx + 1) * bn], B_s)
                    T.gemm(A_s, B_s, H, policy=pol)
                for s0, items in plan_s:
                    if s == s0:
                        for (i, j, w, first) in items:
                            for x, y in T.Parallel(bm, bn):
                                row = by * bm + x
                                col = bx * bn + y
                                conds = []
                                if not full_m:
                                    conds.append(row < Mb)
                                if not full_n:
                                    conds.append(col < Nb)
                                if not rows_ok[i]:
                                    conds.append(i * Mb + row < M)
                                if not cols_ok[j]:
                                    conds.append(j * Nb + col < N)
                                if first:
                                    val = _scaled(w, H[x, y])
                                else:
                                    val = T.cast(C[i * Mb + row, j * Nb + col], ACCUM) + _scaled(w, H[x, y])
                                if conds:
                                    cond = conds[0]
                                    for c in conds[1:]:
                                        cond = T.And(cond, c)
                                    if cond:
                                        C[i * Mb + row, j * Nb + col] = T.cast(val, out_dtype)
                                else:
                                    C[i * Mb + row, j * Nb + col] = T.cast(val, out_dtype)

    if cfg.overlap_epilogue:
        return lcmac_fused_flat
    return lcmac_fused


# ----------------------------------------------------------------------------------------------
def batched_gemm(blk: Blocking, dtype: str, cfg: CudaConfig, kmajor_b: bool = False):
    """H_r = Ã_r · B̃_r for every r.  cache_aware=True: r is the slowest grid index, so the CTAs
    resident together work on the same product and share its Ã_r / B̃_r panels in L2;
    False (the ablation): r varies fastest, so neighbouring CTAs read R different panels."""
    bm, bn, bk = cfg.block_m, cfg.block_n, cfg.bk(dtype)
    pol = _policy(cfg, dtype)
    R, Mb, Nb, Kb = blk.R, blk.Mb, blk.Nb, blk.Kb
    gx, gy = -(-Nb // bn), -(-Mb // bm)
    sdt = T.tfloat32 if dtype == "float32" else dtype   # TileLang picks wgmma only for tf32 tiles

    @T.prim_func
    def lcmac_bgemm(At: T.Tensor((R, Mb, Kb), dtype), Bt: T.Tensor((R, Kb, Nb), dtype),
                    H: T.Tensor((R, Mb, Nb), dtype)):
        with T.Kernel(gx, gy, R, threads=cfg.threads) as (bx, by, bz):
            A_s = T.alloc_shared((bm, bk), dtype)
            B_s = T.alloc_shared((bk, bn), dtype)
            C_l = T.alloc_fragment((bm, bn), ACCUM)
            T.use_swizzle(panel_size=max(cfg.swizzle, 1), enable=cfg.swizzle > 0)
            T.clear(C_l)
            for ko in T.Pipelined(T.ceildiv(Kb, bk), num_stages=cfg.stages):
                T.copy(At[bz, by * bm:(by + 1) * bm, ko * bk:(ko + 1) * bk], A_s)
                T.copy(Bt[bz, ko * bk:(ko + 1) * bk, bx * bn:(bx + 1) * bn], B_s)
                T.gemm(A_s, B_s, C_l, policy=pol)
            T.copy(C_l, H[bz, by * bm:(by + 1) * bm, bx * bn:(bx + 1) * bn])

    @T.prim_func
    def lcmac_bgemm_rfast(At: T.Tensor((R, Mb, Kb), dtype), Bt: T.Tensor((R, Kb, Nb), dtype),
                          H: T.Tensor((R, Mb, Nb), dtype)):
        with T.Kernel(gx * R, gy, threads=cfg.threads) as (bxr, by):
            A_s = T.alloc_shared((bm, bk), dtype)
            B_s = T.alloc_shared((bk, bn), dtype)
            C_l = T.alloc_fragment((bm, bn), ACCUM)
            bz = bxr % R
            bx = bxr // R
            T.clear(C_l)
            for ko in T.Pipelined(T.ceildiv(Kb, bk), num_stages=cfg.stages):
                T.copy(At[bz, by * bm:(by + 1) * bm, ko * bk:(ko + 1) * bk], A_s)
                T.copy(Bt[bz, ko * bk:(ko + 1) * bk, bx * bn:(bx + 1) * bn], B_s)
                T.gemm(A_s, B_s, C_l, policy=pol)
            T.copy(C_l, H[bz, by * bm:(by + 1) * bm, bx * bn:(bx + 1) * bn])

    @T.prim_func
    def lcmac_bgemm_kmajor(At: T.Tensor((R, Mb, Kb), dtype), Bt: T.Tensor((R, Nb, Kb), dtype),
                           H: T.Tensor((R, Mb, Nb), dtype)):
        with T.Kernel(gx, gy, R, threads=cfg.threads) as (bx, by, bz):
            A_s = T.alloc_shared((bm, bk), sdt)
            B_s = T.alloc_shared((bn, bk), sdt)
            C_l = T.alloc_fragment((bm, bn), ACCUM)
            T.use_swizzle(panel_size=max(cfg.swizzle, 1), enable=cfg.swizzle > 0)
            T.clear(C_l)
            for ko in T.Pipelined(T.ceildiv(Kb, bk), num_stages=cfg.stages):
                T.copy(At[bz, by * bm:(by + 1) * bm, ko * bk:(ko + 1) * bk], A_s)
                T.copy(Bt[bz, bx * bn:(bx + 1) * bn, ko * bk:(ko + 1) * bk], B_s)
                T.gemm(A_s, B_s, C_l, transpose_B=True, policy=pol)
            T.copy(C_l, H[bz, by * bm:(by + 1) * bm, bx * bn:(bx + 1) * bn])

    if kmajor_b:
        return lcmac_bgemm_kmajor
    return lcmac_bgemm if cfg.cache_aware else lcmac_bgemm_rfast


def combine_h(prog, alg, blk: Blocking, dtype: str, cfg: CudaConfig):
    R, Mb, Nb, M, N = blk.R, blk.Mb, blk.Nb, blk.M, blk.N
    tr, tc = cfg.combine_rows, cfg.combine_cols
    m, n = alg.m, alg.n
    rows_ok = [(i + 1) * Mb <= M for i in range(m)]
    cols_ok = [(j + 1) * Nb <= N for j in range(n)]

    @T.prim_func
    def lcmac_combine_h(H: T.Tensor((R, Mb, Nb), dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(Nb, tc), T.ceildiv(Mb, tr), threads=cfg.combine_threads) as (bx, by):
            for x, y in T.Parallel(tr, tc):
                rr = by * tr + x
                cc = bx * tc + y
                if rr < Mb and cc < Nb:
                    ins = [T.cast(H[r, rr, cc], ACCUM) for r in _static(R)]
                    outs = _evaluate(prog, ins)
                    for i in _static(m):
                        for j in _static(n):
                            conds = []
                            if not rows_ok[i]:
                                conds.append(i * Mb + rr < M)
                            if not cols_ok[j]:
                                conds.append(j * Nb + cc < N)
                            if conds:
                                cond = conds[0] if len(conds) == 1 else T.And(conds[0], conds[1])
                                if cond:
                                    C[i * Mb + rr, j * Nb + cc] = T.cast(outs[i * n + j], dtype)
                            else:
                                C[i * Mb + rr, j * Nb + cc] = T.cast(outs[i * n + j], dtype)

    return lcmac_combine_h
