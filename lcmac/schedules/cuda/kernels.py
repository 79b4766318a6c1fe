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
                      read-modify-write in a fixed order (deterministic).  With a
                      PersistentPlan: P persistent CTAs walk whole groups, then pieces of the
                      last partial round (split-group); non-lead pieces accumulate into fp32
                      workspace slots of their own
    split_fixup       adds those slots into C in CTA order, after the persistent kernel
    batched_gemm      Algorithm 1: H_r = Ã_r·B̃_r for all r (grid z = r)
    combine_h         Algorithm 1: C_ij = Σ W[r,i,j] H_r
    operand_amax      scaled operands (CudaConfig.operands != "native"): max |X| into S[idx]
    scaled_gemm       H_r (or C) = Ã_r·B̃_r from scaled fp16 operands (hi/lo split or not),
                      the scales undone in the epilogue
    fp8_combine       operands="fp8": Combine A / B quantizing Ã (per row) and B̃ (per
                      column, written K-major) to E4M3 with one float32 scale per 128 K
    fp8_gemm          H_r (or C) = Σ_kb sa·sb·(Ã_r·B̃_r over the kb-th 128 K), fp8 wgmma
"""
# (no `from __future__ import annotations`: TileLang evaluates the Tensor annotations)

from fractions import Fraction

import tilelang.language as T
from tilelang.cuda.language import pdl_sync

from .config import (FP8_BLOCK, FP8_MAX, FP8_TINY, SCALED_TOP, SPLIT_SHIFT, Blocking, CudaConfig,
                          NotSupportedYet, combine_h_steps, first_in_piece, needs_int64, r_order,
                          reduce_groups)

ACCUM = "float32"


def _pdl(arch: str) -> bool:
    """Whether kernels for ``arch`` must begin with ``pdl_sync()`` (griddepcontrol.wait).
    TileLang launches each kernel with programmatic dependent launch allowed
    (cudaLaunchKernelEx + programmaticStreamSerialization), so on sm_90 a kernel may start
    before the previous kernel in the stream (ours, or the caller's that produced A and B)
    has finished; only griddepcontrol.wait guarantees that kernel's writes are visible.
    sm_80 has no PDL (and TileLang refuses the instruction there)."""
    return arch == "sm_90a"


def _all_of(conds: list):
    """The conjunction of a kernel's bound checks (a non-empty list of conditions)."""
    cond = conds[0]
    for c in conds[1:]:
        cond = T.And(cond, c)
    return cond


def _static(n: int) -> list[int]:
    """A Python list: TileLang's builder unrolls loops over lists at trace time (a `range`
    would become a TIR serial loop)."""
    return list(range(n))


def _keep_params(func, keep: list[int]):
    """``func`` (a PrimFunc) with only the parameters at ``keep`` (the others unused by its
    body): one template for kernels whose signatures differ only in optional inputs."""
    from tilelang import tvm
    ps = [func.params[i] for i in keep]
    return tvm.tirx.PrimFunc(ps, func.body, func.ret_type, {p: func.buffer_map[p] for p in ps},
                             func.attrs)


def _dims(*dims):
    """A global buffer's shape: int64 extents when it has more than 2³¹−1 elements, so that
    its flattened index, and the constant part TVM folds out of it (r·Mb·Nb for an unrolled
    product r, i·Mb·N for a C block row), are computed in 64 bits; int32 extents otherwise
    (the generated code of smaller shapes is unchanged).  See cuda_config.INDEX_INT32_MAX."""
    if needs_int64(dims):
        return tuple(T.int64(d) for d in dims)
    return tuple(dims)


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


@T.macro
def _k_loop(a_slab, b_slab, A_s, B_s, C_l, nk, stages: int, pol, kmajor: bool,
            multicast_b: bool = False):
    """One output tile's pipelined K loop (TMA/cp.async slabs into shared memory, fp32
    accumulators): ``a_slab(ko)``/``b_slab(ko)`` give the global regions of the ko-th A and B
    slabs (B K-major when ``kmajor``).  ``multicast_b``: the CTA pair of a 2-CTA cluster
    shares the B slab, rank 0 loads it into both (the generated loop is completed by
    ``targets.cuda.cluster_pipeline``)."""
    T.clear(C_l)
    for ko in T.Pipelined(nk, num_stages=stages):
        T.copy(a_slab(ko), A_s)
        if multicast_b:
            T.copy_cluster(b_slab(ko), B_s, cluster_mask=0b11)
        else:
            T.copy(b_slab(ko), B_s)
        if kmajor:
            T.gemm(A_s, B_s, C_l, transpose_B=True, policy=pol)
        else:
            T.gemm(A_s, B_s, C_l, policy=pol)


@T.macro
def _store_tile(C_l, c_out, odt, bm: int, bn: int, via_smem: bool, C_s=None):
    """The accumulator tile ``C_l`` to the global region ``c_out`` (dtype ``odt``): through
    shared memory (stmatrix, then TMA stores on sm_90a; TileLang lets the tile alias the
    drained pipeline buffers) when ``via_smem``, else every thread stores its fragments.
    ``C_s``: a shared tile allocated by the caller (a pipeline that never drains)."""
    if via_smem:
        if C_s is None:
            C_s = T.alloc_shared((bm, bn), odt)
        T.copy(C_l, C_s)
        T.copy(C_s, c_out)
    else:
        T.copy(C_l, c_out)


@T.macro
def _gemm_tile(a_slab, b_slab, c_out, odt, sdt, b_tile, bm: int, bn: int, bk: int, nk,
               cfg: CudaConfig, pol, kmajor: bool, pdl: bool, swizzle: bool,
               multicast_b: bool = False):
    """One CTA's whole output tile of a plain or batched GEMM: wait for the previous kernel
    (PDL), the shared-memory slabs and fp32 accumulators, the rasterisation (``swizzle``),
    the K loop, the store to the global region ``c_out`` (dtype ``odt``)."""
    if pdl:
        pdl_sync()
    A_s = T.alloc_shared((bm, bk), sdt)
    B_s = T.alloc_shared(b_tile, sdt)
    C_l = T.alloc_fragment((bm, bn), ACCUM)
    if swizzle:
        T.use_swizzle(panel_size=max(cfg.swizzle, 1), enable=cfg.swizzle > 0)
    _k_loop(a_slab, b_slab, A_s, B_s, C_l, nk, cfg.stages, pol, kmajor, multicast_b)
    _store_tile(C_l, c_out, odt, bm, bn, cfg.store_via_smem)


@T.macro
def _persistent_tiles(a_slab, b_slab, c_out, tile_of, steps, odt, sdt, b_tile, bm: int, bn: int,
                      bk: int, nk, cfg: CudaConfig, pol, pdl: bool):
    """A persistent CTA's share of a plain or batched GEMM (``cfg.persistent``, unfused):
    ``steps`` output tiles, the q-th at ``tile_of(q)`` = (r, by, bx), and one software
    pipeline over every (tile, k) step, so the TMA producer loads the next tile's first slabs
    while the consumers store this one.  ``a_slab(r, by, ko)`` / ``b_slab(r, bx, ko)`` /
    ``c_out(r, by, bx)`` give the global regions.  The pipeline never drains, so the output
    tile (``store_via_smem``) has shared memory of its own."""
    if pdl:
        pdl_sync()
    A_s = T.alloc_shared((bm, bk), sdt)
    B_s = T.alloc_shared(b_tile, sdt)
    C_l = T.alloc_fragment((bm, bn), ACCUM)
    C_s = T.alloc_shared((bm, bn), odt) if cfg.store_via_smem else None
    for it in T.Pipelined(steps * nk, num_stages=cfg.stages):
        ko = it % nk
        r, by, bx = tile_of(it // nk)
        T.copy(a_slab(r, by, ko), A_s)
        T.copy(b_slab(r, bx, ko), B_s)
        T.gemm(A_s, B_s, C_l, policy=pol, clear_accum=ko == 0)
        if ko == nk - 1:
            _store_tile(C_l, c_out(r, by, bx), odt, bm, bn, cfg.store_via_smem, C_s)


def _persistent_walk(pid, ctas: int, R: int, gx: int, gy: int, panel: int, rfast: bool):
    """(number of tiles, tile_of) of persistent CTA ``pid`` among ``ctas``: tiles pid,
    pid + ctas, ... of the grid kernel's order (r slowest, TileLang's rasterisation within a
    product; ``rfast``: r fastest, row-major, the cache-aware ablation)."""
    tiles = R * gx * gy

    def tile_of(q):
        t = q * ctas + pid
        if rfast:
            g = t // R
            return t % R, g // gx, g % gx
        by, bx = _raster(t % (gx * gy), gx, gy, panel)
        return t // (gx * gy), by, bx

    return T.ceildiv(tiles - pid, ctas), tile_of


# ----------------------------------------------------------------------------------------------
def plain_gemm(M: int, N: int, K: int, dtype: str, cfg: CudaConfig, arch: str = "sm_90a",
               bt_shape: tuple[int, int] | None = None, ctas: int = 0):
    """C = A·B; ``bt_shape`` (Nb, Kb): B given transposed, Bt [Nb, Kb] K-major (TF32 wgmma
    for float32 on sm_90a reads both operands K-major; TileLang picks wgmma only for tf32
    tiles).  ``ctas`` > 0: a persistent grid of that many CTAs (``_persistent_tiles``)."""
    bm, bn, bk = cfg.block_m, cfg.block_n, cfg.bk(dtype)
    pol = _policy(cfg, dtype)
    kmajor = bt_shape is not None
    sdt = T.tfloat32 if (kmajor and dtype == "float32") else dtype
    b_dims = bt_shape if kmajor else (K, N)
    b_tile = (bn, bk) if kmajor else (bk, bn)

    pdl = _pdl(arch)

    @T.macro
    def body(A, B, C, bx, by, multicast_b: bool = False):
        _gemm_tile(lambda ko: A[by * bm, ko * bk],
                   (lambda ko: B[bx * bn, ko * bk]) if kmajor else (lambda ko: B[ko * bk, bx * bn]),
                   C[by * bm, bx * bn], dtype, sdt, b_tile, bm, bn, bk, T.ceildiv(K, bk), cfg, pol,
                   kmajor, pdl, True, multicast_b)

    if kmajor:
        @T.prim_func
        def lcmac_gemm_t(A: T.Tensor(_dims(M, K), dtype), Bt: T.Tensor(_dims(*b_dims), dtype),
                         C: T.Tensor(_dims(M, N), dtype)):
            with T.Kernel(T.ceildiv(N, bn), T.ceildiv(M, bm), threads=cfg.threads) as (bx, by):
                body(A, Bt, C, bx, by)
        return lcmac_gemm_t

    if ctas:
        gx, gy = -(-N // bn), -(-M // bm)
        P = min(ctas, gx * gy)

        @T.prim_func
        def lcmac_gemm_p(A: T.Tensor(_dims(M, K), dtype), B: T.Tensor(_dims(*b_dims), dtype),
                         C: T.Tensor(_dims(M, N), dtype)):
            with T.Kernel(P, threads=cfg.threads) as pid:
                steps, tile_of = _persistent_walk(pid, P, 1, gx, gy, cfg.swizzle, False)
                _persistent_tiles(lambda r, by, ko: A[by * bm:(by + 1) * bm, ko * bk:(ko + 1) * bk],
                                  lambda r, bx, ko: B[ko * bk:(ko + 1) * bk, bx * bn:(bx + 1) * bn],
                                  lambda r, by, bx: C[by * bm:(by + 1) * bm, bx * bn:(bx + 1) * bn],
                                  tile_of, steps, dtype, sdt, b_tile, bm, bn, bk, T.ceildiv(K, bk),
                                  cfg, pol, pdl)
        return lcmac_gemm_p

    if cfg.cluster == 2:
        _check_cluster_grid(-(-M // bm), cfg.swizzle)

        @T.prim_func
        def lcmac_gemm_c(A: T.Tensor(_dims(M, K), dtype), B: T.Tensor(_dims(*b_dims), dtype),
                         C: T.Tensor(_dims(M, N), dtype)):
            # grid x runs over tile rows: a cluster is two vertically adjacent tiles
            with T.ClusterKernel(T.ceildiv(M, bm), T.ceildiv(N, bn), threads=cfg.threads,
                                 cluster_dims=(2, 1, 1)) as (by, bx):
                body(A, B, C, bx, by, True)
        return lcmac_gemm_c

    @T.prim_func
    def lcmac_gemm(A: T.Tensor(_dims(M, K), dtype), B: T.Tensor(_dims(*b_dims), dtype),
                   C: T.Tensor(_dims(M, N), dtype)):
        with T.Kernel(T.ceildiv(N, bn), T.ceildiv(M, bm), threads=cfg.threads) as (bx, by):
            body(A, B, C, bx, by)
    return lcmac_gemm


def _check_cluster_grid(gy: int, panel: int) -> None:
    """A 2-CTA cluster grid runs x over the gy tile rows (clusters pair neighbours in x), and
    TileLang's cluster-aware rasterisation swizzles whole clusters: gy and ``panel`` must be
    even."""
    if gy % 2:
        raise NotSupportedYet(f"cluster=2 pairs vertically adjacent tiles and needs an even "
                              f"number of tile rows, not {gy} (use cluster=1 or another block_m)")
    if panel % 2:
        raise NotSupportedYet(f"cluster=2 rasterises whole clusters and needs an even swizzle "
                              f"panel, not {panel}")


# ----------------------------------------------------------------------------------------------
def combine_ab(which: str, prog, blk: Blocking, dtype: str, cfg: CudaConfig, arch: str = "sm_90a",
               bound: int = 1):
    """Combine A (which="A": X=A [M,K] → Ã [R,Mb,Kb]) or Combine B (X=B [K,N] → B̃ [R,Kb,Nb]).

    Scaled operands (cfg.operands "fp16" / "fp16x2"; ``bound``: cuda_config.bound_exponent
    of the combine matrix): the outputs are fp16, multiplied by the power of two that
    ``operand_scale`` derives from S (the amax pass); "fp16x2" also writes the lo halves Xl."""
    if which == "A":
        P, Q, rows, cols, Rb, Cb = blk.m, blk.k, blk.M, blk.K, blk.Mb, blk.Kb
    else:
        P, Q, rows, cols, Rb, Cb = blk.k, blk.n, blk.K, blk.N, blk.Kb, blk.Nb
    R = prog.n_outputs        # blk.R, or fewer where the GEMM reads some operands in place
    tr, tc = cfg.combine_rows, cfg.combine_cols
    # columns: Cb and cols are multiples of 8, so an 8-wide vector is entirely in or out
    full_rows = [(p + 1) * Rb <= rows for p in range(P)]
    full_cols = [(q + 1) * Cb <= cols for q in range(Q)]

    pdl = _pdl(arch)
    mode = cfg.operands
    odt = dtype if mode == "native" else OPERAND_DTYPE
    idx = 0 if which == "A" else 1

    @T.macro
    def body(X, S, Xt, Xl, bx, by):
        if pdl:
            pdl_sync()
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
                        v = T.if_then_else(_all_of(conds), v, T.float32(0))
                    ins.append(v)
            outs = _evaluate(prog, ins)
            if rr < Rb and cc < Cb:
                for r in _static(R):
                    if mode == "native":
                        Xt[r, rr, cc] = T.cast(outs[r], dtype)
                    else:
                        v = outs[r] * operand_scale(S, idx, bound, False)
                        Xt[r, rr, cc] = T.cast(v, odt)
                        if mode == "fp16x2":
                            Xl[r, rr, cc] = T.cast((v - T.cast(T.cast(v, odt), ACCUM))
                                                   * T.float32(2.0 ** SPLIT_SHIFT), odt)

    @T.prim_func
    def lcmac_combine(X: T.Tensor(_dims(rows, cols), dtype), S: T.Tensor((2,), "int32"),
                      Xt: T.Tensor(_dims(R, Rb, Cb), odt), Xl: T.Tensor(_dims(R, Rb, Cb), odt)):
        with T.Kernel(T.ceildiv(Cb, tc), T.ceildiv(Rb, tr), threads=cfg.combine_threads) as (bx, by):
            body(X, S, Xt, Xl, bx, by)

    # the scale word S only for scaled operands, the lo halves Xl only for fp16x2
    return _keep_params(lcmac_combine, [0] + [1] * (mode != "native") + [2] + [3] * (mode == "fp16x2"))


# ----------------------------------------------------------------------------------------------
# Scaled fp16 operands (CudaConfig.operands): amax pass, power-of-two scales, GEMM stage

OPERAND_DTYPE = "float16"


def operand_scale(S, idx: int, bound: int, inverse: bool):
    """2**e (or 2**-e) for operand idx (0: A side, 1: B side) as an exact float32 built from
    bits: E = biased exponent of amax (S[idx] holds its float bits, amax < 2**(E-126)),
    e = SCALED_TOP + 126 − E − bound, clamped to [−126, 126] — cuda_config.scale_exponent."""
    E = T.shift_right(S[idx], 23)
    e = T.max(T.min(SCALED_TOP + 126 - bound - E, 126), -126)
    if inverse:
        e = -e
    return T.reinterpret(T.shift_left(e + 127, 23), "float32")


def operand_amax(rows: int, cols: int, dtype: str, idx: int, arch: str = "sm_90a",
                 tr: int = 16, tc: int = 256, chunk: int = 8):
    """S[idx] = max(S[idx], bits of max |X| over the finite elements) (S zeroed by the entry
    point before).  Each CTA reduces a (chunk·tr) × tc strip: element-wise maxima in
    registers, one block reduction, one atomic; |x| ≥ 0, so comparing float bits as int32
    orders them.  ±inf and NaN are left out: one inf would set a scale of 2⁻¹¹⁰ or so and
    flush every finite operand to zero (silently wrong outputs); left out, they stay inf/NaN
    in Ã/B̃ and reach only the outputs they reach in the native path."""
    pdl = _pdl(arch)

    @T.prim_func
    def lcmac_amax(X: T.Tensor(_dims(rows, cols), dtype), S: T.Tensor((2,), "int32")):
        with T.Kernel(T.ceildiv(cols, tc), T.ceildiv(rows, tr * chunk), threads=256) as (bx, by):
            if pdl:
                pdl_sync()
            F = T.alloc_fragment((tr, tc), ACCUM)
            mx = T.alloc_fragment((tr,), ACCUM)
            m1 = T.alloc_fragment((1,), ACCUM)
            T.fill(F, 0)
            for c in T.serial(chunk):
                for x, y in T.Parallel(tr, tc):
                    r = (by * chunk + c) * tr + x
                    cc = bx * tc + y
                    v = T.abs(T.cast(X[r, cc], ACCUM))
                    F[x, y] = T.max(F[x, y], T.if_then_else(
                        T.And(T.And(r < rows, cc < cols), v < T.infinity(ACCUM)), v, T.float32(0)))
            T.reduce_max(F, mx, dim=1)
            T.reduce_max(mx, m1, dim=0)
            if T.get_thread_binding(0) == 0:
                T.atomic_max(S[idx], T.reinterpret(m1[0], "int32"))

    return lcmac_amax


def scaled_gemm(blk: Blocking, dtype: str, cfg: CudaConfig, bounds: tuple[int, int],
                direct: bool, arch: str = "sm_90a"):
    """The GEMM stage on scaled fp16 operands: for every r, H_r = 2**-(eA+eB) · Ã_r·B̃_r in
    fp32 ([R, Mb, Nb]), or C itself (``direct``: the plain GEMM, R = 1, C [M, N] in dtype).
    fp16x2: every K step's products land in a fresh fragment (hi·lo + lo·hi, then hi·hi)
    and are added into the fp32 accumulator by ordinary (round-to-nearest) adds: the tensor
    cores' own fp32 accumulation over the whole K loses bits (measured on an H100: 8.4x
    SGEMM's error at K = 16384 when it accumulated all of K; the LCMAs' shorter products
    lost less), so it only ever sums one bk-long slice.  r is the slowest grid index
    (cache-aware order)."""
    bm, bn, bk = cfg.block_m, cfg.block_n, cfg.bk(OPERAND_DTYPE)
    pol = _policy(cfg, OPERAND_DTYPE)
    R, Mb, Nb, Kb = blk.R, blk.Mb, blk.Nb, blk.Kb
    gx, gy = -(-Nb // bn), -(-Mb // bm)
    split = cfg.operands == "fp16x2"
    odt = OPERAND_DTYPE
    out_shape = (blk.M, blk.N) if direct else (R, Mb, Nb)
    out_dtype = dtype if direct else ACCUM
    pdl = _pdl(arch)
    la, lb = bounds

    @T.macro
    def tile(At, Al, Bt, Bl, S, out, bx, by, bz):
        A_s = T.alloc_shared((bm, bk), odt)
        B_s = T.alloc_shared((bk, bn), odt)
        C_h = T.alloc_fragment((bm, bn), ACCUM)
        if split:
            Al_s = T.alloc_shared((bm, bk), odt)
            Bl_s = T.alloc_shared((bk, bn), odt)
            C_t = T.alloc_fragment((bm, bn), ACCUM)
        T.use_swizzle(panel_size=max(cfg.swizzle, 1), enable=cfg.swizzle > 0)
        a_slab = lambda X, ko: X[bz, by * bm:(by + 1) * bm, ko * bk:(ko + 1) * bk]  # noqa: E731
        b_slab = lambda X, ko: X[bz, ko * bk:(ko + 1) * bk, bx * bn:(bx + 1) * bn]  # noqa: E731
        if split:
            T.clear(C_h)
            for ko in T.Pipelined(T.ceildiv(Kb, bk), num_stages=cfg.stages):
                T.copy(a_slab(At, ko), A_s)
                T.copy(b_slab(Bt, ko), B_s)
                T.copy(a_slab(Al, ko), Al_s)
                T.copy(b_slab(Bl, ko), Bl_s)
                T.gemm(A_s, Bl_s, C_t, policy=pol, clear_accum=True)
                T.gemm(Al_s, B_s, C_t, policy=pol)
                for x, y in T.Parallel(bm, bn):
                    C_h[x, y] = C_h[x, y] + C_t[x, y] * T.float32(2.0 ** -SPLIT_SHIFT)
                T.gemm(A_s, B_s, C_t, policy=pol, clear_accum=True)
                for x, y in T.Parallel(bm, bn):
                    C_h[x, y] = C_h[x, y] + C_t[x, y]
        else:
            _k_loop(lambda ko: a_slab(At, ko), lambda ko: b_slab(Bt, ko), A_s, B_s, C_h,
                    T.ceildiv(Kb, bk), cfg.stages, pol, False)
        inv = operand_scale(S, 0, la, True) * operand_scale(S, 1, lb, True)
        for x, y in T.Parallel(bm, bn):
            C_h[x, y] = C_h[x, y] * inv
        if direct:
            _store_tile(C_h, out[by * bm, bx * bn], out_dtype, bm, bn, cfg.store_via_smem)
        else:
            _store_tile(C_h, out[bz, by * bm:(by + 1) * bm, bx * bn:(bx + 1) * bn], out_dtype,
                        bm, bn, cfg.store_via_smem)

    ops = _dims(R, Mb, Kb), _dims(R, Kb, Nb), _dims(*out_shape)

    @T.prim_func
    def lcmac_sgemm(At: T.Tensor(ops[0], odt), Al: T.Tensor(ops[0], odt),
                    Bt: T.Tensor(ops[1], odt), Bl: T.Tensor(ops[1], odt),
                    S: T.Tensor((2,), "int32"), Out: T.Tensor(ops[2], out_dtype)):
        with T.Kernel(gx, gy, R, threads=cfg.threads) as (bx, by, bz):
            if pdl:
                pdl_sync()
            tile(At, Al, Bt, Bl, S, Out, bx, by, bz)

    # the lo halves Al / Bl only for fp16x2
    lcmac_sgemm = _keep_params(lcmac_sgemm, [0, 1, 2, 3, 4, 5] if split else [0, 2, 4, 5])

    return lcmac_sgemm


# ----------------------------------------------------------------------------------------------
# FP8 operands (CudaConfig.operands == "fp8"): E4M3 with 1×128 block scales along K

FP8 = "float8_e4m3"


def fp8_scale_shapes(blk: Blocking, cfg: CudaConfig) -> dict:
    """Scale buffers: SA [R, nkb, Mb'] (one per Ã row and K block), SB [R, nkb, Nb'] (one
    per B̃ column and K block), rows padded to whole GEMM tiles so the GEMM never reads past
    them (the padding's values only meet rows/columns that are never stored)."""
    nkb = -(-blk.Kb // FP8_BLOCK)
    mp = -(-blk.Mb // cfg.block_m) * cfg.block_m
    np_ = -(-blk.Nb // cfg.block_n) * cfg.block_n
    return {"SA": (blk.R, nkb, mp), "SB": (blk.R, nkb, np_)}


@T.macro
def _quantize_rows(F, amax, Xt, Sc, r, rows0, cols0, kb, nrows, ncols, rlim, clim):
    """Quantize the fp32 tile F (nrows × 128 along K) row by row: Sc[r, kb, row] = block
    amax / 448, Xt[r, row, col] = E4M3(F · 448 / amax) for the rows < rlim, cols < clim."""
    T.reduce_absmax(F, amax, dim=1)
    for x in T.Parallel(nrows):
        amax[x] = T.max(amax[x], T.float32(FP8_TINY))
    for x, y in T.Parallel(nrows, ncols):
        if rows0 + x < rlim and cols0 + y < clim:
            Xt[r, rows0 + x, cols0 + y] = T.cast(F[x, y] * (T.float32(FP8_MAX) / amax[x]), FP8)
    for x in T.Parallel(nrows):
        if rows0 + x < rlim:
            Sc[r, kb, rows0 + x] = amax[x] * T.float32(1.0 / FP8_MAX)


def fp8_combine(which: str, prog, blk: Blocking, dtype: str, cfg: CudaConfig, arch: str = "sm_90a"):
    """Combine A (which="A": Ã [R, Mb, Kb] and SA, one scale per row and 128 K) or Combine B
    ("B": B̃ written K-major, [R, Nb, Kb] — fp8 wgmma reads both operands K-major — and SB,
    one scale per column and 128 K), quantized to E4M3 (fp8_scale_shapes).  A CTA stages one
    128-wide K block × t output rows (A: 16 rows of Ã; B: 32 columns of B̃) of every input
    block X_pq in shared memory, laid out [output row, K] (B transposed on the way, its reads
    coalesced along N), then quantizes that block of all R outputs, each row by its amax."""
    if which == "A":
        P, Q, rows, cols, Rb, Cb = blk.m, blk.k, blk.M, blk.K, blk.Mb, blk.Kb
        t, pad, out_shape = 16, 0, (blk.R, blk.Mb, blk.Kb)
    else:
        P, Q, rows, cols, Rb, Cb = blk.k, blk.n, blk.K, blk.N, blk.Kb, blk.Nb
        t, pad, out_shape = 32, 2, (blk.R, blk.Nb, blk.Kb)    # +2: fewer bank conflicts
    R, kw = blk.R, FP8_BLOCK
    ir, ic = (t, kw) if which == "A" else (kw, t)       # the CTA's tile of the input X
    sc_shape = fp8_scale_shapes(blk, cfg)["SA" if which == "A" else "SB"]
    pdl = _pdl(arch)

    @T.macro
    def body(X, Xt, Sc, bx, by):
        if pdl:
            pdl_sync()
        S = T.alloc_shared((P * Q, t, kw + pad), dtype)
        F = T.alloc_fragment((t, kw), ACCUM)
        amax = T.alloc_fragment((t,), ACCUM)
        for p in _static(P):
            for q in _static(Q):
                for x, y in T.Parallel(ir, ic):
                    rr, cc = by * ir + x, bx * ic + y
                    so, sk = (x, y) if which == "A" else (y, x)
                    S[p * Q + q, so, sk] = T.if_then_else(
                        T.And(T.And(p * Rb + rr < rows, rr < Rb), T.And(q * Cb + cc < cols, cc < Cb)),
                        X[p * Rb + rr, q * Cb + cc], T.cast(0, dtype))
        for r in _static(R):
            for o, k in T.Parallel(t, kw):
                ins = [T.cast(S[i, o, k], ACCUM) for i in _static(P * Q)]
                F[o, k] = _evaluate(prog, ins)[r]
            if which == "A":
                _quantize_rows(F, amax, Xt, Sc, r, by * t, bx * kw, bx, t, kw, Rb, Cb)
            else:
                _quantize_rows(F, amax, Xt, Sc, r, bx * t, by * kw, by, t, kw, Cb, Rb)

    grid = (T.ceildiv(Cb, ic), T.ceildiv(Rb, ir))
    if which == "A":       # two signatures only for the scale buffer's name in the source
        @T.prim_func
        def lcmac_combine_fp8(X: T.Tensor(_dims(rows, cols), dtype), Xt: T.Tensor(_dims(*out_shape), FP8),
                              SA: T.Tensor(_dims(*sc_shape), ACCUM)):
            with T.Kernel(*grid, threads=128) as (bx, by):
                body(X, Xt, SA, bx, by)
    else:
        @T.prim_func
        def lcmac_combine_fp8(X: T.Tensor(_dims(rows, cols), dtype), Xt: T.Tensor(_dims(*out_shape), FP8),
                              SB: T.Tensor(_dims(*sc_shape), ACCUM)):
            with T.Kernel(*grid, threads=128) as (bx, by):
                body(X, Xt, SB, bx, by)

    return lcmac_combine_fp8


def fp8_gemm(blk: Blocking, dtype: str, cfg: CudaConfig, direct: bool, arch: str = "sm_90a"):
    """The GEMM stage on E4M3 operands with 1×128 scales: for every 128-wide K slab, the
    wgmma product lands in a fresh fp32 fragment and is added into the running sum times
    SA[row]·SB[col] (the scales of that slab), so no scale is ever folded into an fp8 value.
    Writes fp32 H [R, Mb, Nb], or C [M, N] in dtype (``direct``: the plain GEMM, R = 1)."""
    bm, bn, bk = cfg.block_m, cfg.block_n, cfg.bk(FP8)
    pol = _policy(cfg, FP8)
    R, Mb, Nb, Kb = blk.R, blk.Mb, blk.Nb, blk.Kb
    gx, gy = -(-Nb // bn), -(-Mb // bm)
    sh = fp8_scale_shapes(blk, cfg)
    out_shape = (blk.M, blk.N) if direct else (R, Mb, Nb)
    out_dtype = dtype if direct else ACCUM
    pdl = _pdl(arch)
    nk = -(-Kb // bk)

    @T.prim_func
    def lcmac_fp8_gemm(At: T.Tensor(_dims(R, Mb, Kb), FP8), Bt: T.Tensor(_dims(R, Nb, Kb), FP8),
                       SA: T.Tensor(_dims(*sh["SA"]), ACCUM), SB: T.Tensor(_dims(*sh["SB"]), ACCUM),
                       Out: T.Tensor(_dims(*out_shape), out_dtype)):
        with T.Kernel(gx, gy, R, threads=cfg.threads) as (bx, by, bz):
            if pdl:
                pdl_sync()
            A_s = T.alloc_shared((bm, bk), FP8)
            B_s = T.alloc_shared((bn, bk), FP8)
            sa = T.alloc_shared((bm,), ACCUM)
            sb = T.alloc_shared((bn,), ACCUM)
            C_t = T.alloc_fragment((bm, bn), ACCUM)
            C_h = T.alloc_fragment((bm, bn), ACCUM)
            T.use_swizzle(panel_size=max(cfg.swizzle, 1), enable=cfg.swizzle > 0)
            T.clear(C_h)
            for ko in T.Pipelined(nk, num_stages=cfg.stages):
                T.copy(At[bz, by * bm:(by + 1) * bm, ko * bk:(ko + 1) * bk], A_s)
                T.copy(Bt[bz, bx * bn:(bx + 1) * bn, ko * bk:(ko + 1) * bk], B_s)
                T.copy(SA[bz, ko, by * bm:(by + 1) * bm], sa)
                T.copy(SB[bz, ko, bx * bn:(bx + 1) * bn], sb)
                T.gemm(A_s, B_s, C_t, transpose_B=True, policy=pol, clear_accum=True)
                for x, y in T.Parallel(bm, bn):
                    C_h[x, y] = C_h[x, y] + C_t[x, y] * (sa[x] * sb[y])
            if direct:
                _store_tile(C_h, Out[by * bm, bx * bn], out_dtype, bm, bn, cfg.store_via_smem)
            else:
                _store_tile(C_h, Out[bz, by * bm:(by + 1) * bm, bx * bn:(bx + 1) * bn],
                            out_dtype, bm, bn, cfg.store_via_smem)

    return lcmac_fp8_gemm


def combine_b_kmajor(prog, blk: Blocking, dtype: str, cfg: CudaConfig, P=None, Q=None, R=None,
                     rows=None, cols=None, Rb=None, Cb=None, arch: str = "sm_90a"):
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

    pdl = _pdl(arch)
    @T.prim_func
    def lcmac_combine_t(X: T.Tensor(_dims(rows, cols), dtype), Xt: T.Tensor(_dims(R, Cb, Rb), dtype)):
        with T.Kernel(T.ceildiv(Cb, t), T.ceildiv(Rb, t), threads=256) as (bx, by):
            if pdl:
                pdl_sync()
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
                            v = T.if_then_else(_all_of(conds), v, T.cast(0, dtype))
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
    if isinstance(s, int):
        return values[s]
    if values == list(range(len(values))):
        return s
    e = values[-1]
    for idx in range(len(values) - 2, -1, -1):
        e = T.if_then_else(s == idx, values[idx], e)
    return e


def _raster(g, gx: int, gy: int, panel: int):
    """Tile position (row, col) of linear group index g >= 0: TileLang's rasterization2DRow
    (the order ``T.use_swizzle`` gives the non-persistent grid), written out for a
    persistent CTA that walks group indices itself.  Truncating division: g is never
    negative, and floor division of a maybe-negative value emits a page of selects."""
    div, mod = T.truncdiv, T.truncmod
    if panel <= 0:
        return div(g, gx), mod(g, gx)
    T_ = gx * gy
    psize = panel * gx
    off = mod(g, psize)
    idx = div(g, psize)
    last = (T_ - 1) // psize                      # index of the (maybe short) last panel
    stride = T.if_then_else(idx < last, panel, T_ // gx - last * panel)
    col = T.if_then_else(mod(idx, 2) == 1, gx - 1 - div(off, stride), div(off, stride))
    row = mod(off, stride) + idx * panel
    return row, col


def _column_panels(u, gx: int, gy: int, panel: int):
    """Tile position (row, col) of linear index u >= 0: panels of ``panel`` columns (panel
    divides gx), each walked row by row, so the tiles running together share few A rows and
    few B columns.  Simpler than ``_raster`` (no serpentine, no short last panel): TileLang
    takes minutes to lower ``_raster``'s selects where the run-time epilogue repeats them."""
    div, mod = T.truncdiv, T.truncmod
    within = mod(u, panel * gy)
    return div(within, panel), div(u, panel * gy) * panel + mod(within, panel)


def _first_in_piece(s0: int, prev: int, st, R: int):
    """cuda_config.first_in_piece; a run-time test when the walk's start st is a variable."""
    if isinstance(st, int):
        return first_in_piece(s0, prev, st, R)
    return (s0 - st + R) % R <= (prev - st + R) % R


class _Fused:
    """Static facts shared by the fused GEMM + Combine-H kernels and the split-group fixup."""

    def __init__(self, alg, blk: Blocking, dtype: str, cfg: CudaConfig):
        self.bm, self.bn, self.bk = cfg.block_m, cfg.block_n, cfg.bk(dtype)
        self.M, self.N, self.R = blk.M, blk.N, blk.R
        self.Mb, self.Nb, self.Kb = blk.Mb, blk.Nb, blk.Kb
        self.m, self.n = alg.m, alg.n
        self.order = r_order(alg.W, cfg.r_order)
        # plan[s] = [(i, j, w, first from step 0, previous step into C_ij)]; nxt: see cuda_config
        self.plan, self.nxt = combine_h_steps(alg.W, self.order)
        self.nk = -(-self.Kb // self.bk)
        self.full_m = self.Mb % self.bm == 0
        self.full_n = self.Nb % self.bn == 0
        self.rows_ok = [(i + 1) * self.Mb <= self.M for i in range(alg.m)]
        self.cols_ok = [(j + 1) * self.Nb <= self.N for j in range(alg.n)]

    def conds(self, i, j, row, col):
        """Masks of one C_ij element (only those the shape needs)."""
        c = []
        if not self.full_m:
            c.append(row < self.Mb)
        if not self.full_n:
            c.append(col < self.Nb)
        if not self.rows_ok[i]:
            c.append(i * self.Mb + row < self.M)
        if not self.cols_ok[j]:
            c.append(j * self.Nb + col < self.N)
        return c


def fused_gemm_h(alg, blk: Blocking, dtype: str, cfg: CudaConfig, plan=None, arch="sm_90a"):
    """GEMM + Combine-H.  ``plan`` None: one CTA per tile position (grid gx × gy); a
    ``PersistentPlan``: the persistent split-group kernel (grid P; see cuda_config)."""
    pdl = _pdl(arch)
    f = _Fused(alg, blk, dtype, cfg)
    bm, bn, bk, nk = f.bm, f.bn, f.bk, f.nk
    M, N, R, Mb, Nb, Kb = f.M, f.N, f.R, f.Mb, f.Nb, f.Kb
    mn = f.m * f.n
    pol = _policy(cfg, dtype)
    order = f.order
    out_dtype = dtype
    flat = cfg.overlap_epilogue
    ca = cfg.cache_aware

    @T.macro
    def c_update(C, H, by, bx, item, first):
        # C_ij tile += w·H; `first` (a Python bool): the tile's first contribution in this
        # CTA's walk writes instead (C holds the partial sums, in a fixed order)
        i, j = item[0], item[1]
        for x, y in T.Parallel(bm, bn):
            row = by * bm + x
            col = bx * bn + y
            conds = f.conds(i, j, row, col)
            if first:
                val = _scaled(item[2], H[x, y])
            else:
                val = T.cast(C[i * Mb + row, j * Nb + col], ACCUM) + _scaled(item[2], H[x, y])
            if conds:
                if _all_of(conds):
                    C[i * Mb + row, j * Nb + col] = T.cast(val, out_dtype)
            else:
                C[i * Mb + row, j * Nb + col] = T.cast(val, out_dtype)

    @T.macro
    def c_epilogue(C, H, by, bx, sv, st):
        # the Combine-H contributions of step sv[0] (run time) for a walk that started at st
        # (sv: a 1-tuple, so the macro binds no new name for the loop variable)
        for s0 in _static(R):
            if sv[0] == s0:
                for item in f.plan[s0]:
                    first = item[3] if isinstance(st, int) and st == 0 else \
                        _first_in_piece(s0, item[4], st, R)
                    if isinstance(first, bool):
                        c_update(C, H, by, bx, item, first)
                    elif first:
                        c_update(C, H, by, bx, item, True)
                    else:
                        c_update(C, H, by, bx, item, False)

    @T.macro
    def ws_epilogue(Ps, H, slot, sv, st):
        # a non-lead piece of a split group accumulates its own fp32 partial of C_ij (whole
        # tiles, no masks); its first contribution writes: the select's lazy load (a C
        # ternary) never reads the slot's stale value, and one loop instead of two keeps
        # the kernel's compile time down
        for s0 in _static(R):
            if sv[0] == s0:
                for item in f.plan[s0]:
                    first = _first_in_piece(s0, item[4], st, R)
                    for x, y in T.Parallel(bm, bn):
                        Ps[slot, item[0] * f.n + item[1], x, y] = T.if_then_else(
                            first, T.float32(0), Ps[slot, item[0] * f.n + item[1], x, y]) \
                            + _scaled(item[2], H[x, y])

    if plan is None:
        @T.prim_func
        def lcmac_fused(At: T.Tensor(_dims(R, Mb, Kb), dtype), Bt: T.Tensor(_dims(R, Kb, Nb), dtype),
                        C: T.Tensor(_dims(M, N), out_dtype)):
            with T.Kernel(T.ceildiv(Nb, bn), T.ceildiv(Mb, bm), threads=cfg.threads) as (bx, by):
                if pdl:
                    pdl_sync()
                A_s = T.alloc_shared((bm, bk), dtype)
                B_s = T.alloc_shared((bk, bn), dtype)
                H = T.alloc_fragment((bm, bn), ACCUM)
                T.use_swizzle(panel_size=max(cfg.swizzle, 1), enable=cfg.swizzle > 0)
                # cache-aware: every CTA walks the products from step 0; the ablation starts
                # at step (bx + by) mod R, so CTAs launched together read different Ã_r, B̃_r
                st = 0 if ca else (bx + by) % R
                if flat:
                    # one software pipeline over all (step, k): the TMA producer prefetches
                    # the next product while the consumers run the epilogue
                    for it in T.Pipelined(R * nk, num_stages=cfg.stages):
                        s = it // nk if ca else (it // nk + st) % R
                        ko = it % nk
                        r = _select(order, s)
                        T.copy(At[r, by * bm:(by + 1) * bm, ko * bk:(ko + 1) * bk], A_s)
                        T.copy(Bt[r, ko * bk:(ko + 1) * bk, bx * bn:(bx + 1) * bn], B_s)
                        T.gemm(A_s, B_s, H, policy=pol, clear_accum=ko == 0)
                        if ca:
                            for s0 in _static(R):
                                if it == s0 * nk + nk - 1:
                                    for item in f.plan[s0]:
                                        c_update(C, H, by, bx, item, item[3])
                        elif ko == nk - 1:
                            c_epilogue(C, H, by, bx, (s,), st)
                elif ca:
                    for s in T.serial(R):
                        r = _select(order, s)
                        T.clear(H)
                        for ko in T.Pipelined(T.ceildiv(Kb, bk), num_stages=cfg.stages):
                            T.copy(At[r, by * bm:(by + 1) * bm, ko * bk:(ko + 1) * bk], A_s)
                            T.copy(Bt[r, ko * bk:(ko + 1) * bk, bx * bn:(bx + 1) * bn], B_s)
                            T.gemm(A_s, B_s, H, policy=pol)
                        c_epilogue(C, H, by, bx, (s,), st)
                else:
                    for j in T.serial(R):
                        s = (j + st) % R
                        r = _select(order, s)
                        T.clear(H)
                        for ko in T.Pipelined(T.ceildiv(Kb, bk), num_stages=cfg.stages):
                            T.copy(At[r, by * bm:(by + 1) * bm, ko * bk:(ko + 1) * bk], A_s)
                            T.copy(Bt[r, ko * bk:(ko + 1) * bk, bx * bn:(bx + 1) * bn], B_s)
                            T.gemm(A_s, B_s, H, policy=pol)
                        c_epilogue(C, H, by, bx, (s,), st)

        return lcmac_fused

    # ---- persistent (split-group) kernel ---------------------------------------------------
    P, gx, gy = plan.P, plan.gx, plan.gy
    n_main = plan.rounds * R            # whole-group steps of every CTA
    F = plan.rounds * P                 # first tail group
    Lt, TS = plan.Lt, plan.tail_steps
    slots = max(plan.slots, 1)
    sw = cfg.swizzle

    def step_of(pid, q):
        """(group, step within the group's walk, position in the tail list or -1 in the
        whole rounds) of the CTA's q-th step."""
        if plan.rem == 0:
            return (q // R) * P + pid, q % R, None
        tq = pid * Lt + q - n_main
        if n_main == 0:
            return F + tq // R, tq % R, tq
        in_tail = q >= n_main
        g = T.if_then_else(in_tail, F + tq // R, (q // R) * P + pid)
        jw = T.if_then_else(in_tail, tq % R, q % R)
        # -1 in the rounds: pid·Lt + q − n_main is >= 0 there too once pid·Lt >= n_main − q
        return g, jw, T.if_then_else(in_tail, tq, -1)

    def n_steps(pid):
        if plan.rem == 0:
            return n_main
        return n_main + T.max(T.min(TS - pid * Lt, Lt), 0)

    @T.macro
    def epilogue(C, Ps, H, pid, by, bx, g, tq, s):
        rot = 0 if ca else g % R
        if plan.split:
            # the CTA's tail chunk starts inside group g: a non-lead piece (workspace slot pid)
            in_ws = T.And(tq >= 0, pid * Lt > (tq // R) * R) if n_main else pid * Lt > (tq // R) * R
            # (tq: -1 in the whole rounds, see step_of)
            if in_ws:
                ws_epilogue(Ps, H, pid, (s,), (pid * Lt - (tq // R) * R + rot) % R)
            else:
                c_epilogue(C, H, by, bx, (s,), rot)
        else:
            c_epilogue(C, H, by, bx, (s,), rot)

    @T.prim_func
    def lcmac_fused_persistent(At: T.Tensor(_dims(R, Mb, Kb), dtype), Bt: T.Tensor(_dims(R, Kb, Nb), dtype),
                               C: T.Tensor(_dims(M, N), out_dtype),
                               Ps: T.Tensor(_dims(slots, mn, bm, bn), ACCUM)):
        with T.Kernel(P, threads=cfg.threads) as pid:
            A_s = T.alloc_shared((bm, bk), dtype)
            B_s = T.alloc_shared((bk, bn), dtype)
            H = T.alloc_fragment((bm, bn), ACCUM)
            if pdl:
                pdl_sync()
            # the step's indices live in scalar registers: the same values inlined into every
            # address and epilogue mask made TileLang's passes 5-10x slower
            gv = T.alloc_var(T.int32)
            tv = T.alloc_var(T.int32)
            sv = T.alloc_var(T.int32)
            rv = T.alloc_var(T.int32)
            yv = T.alloc_var(T.int32)
            xv = T.alloc_var(T.int32)
            if flat:
                for it in T.Pipelined(n_steps(pid) * nk, num_stages=cfg.stages):
                    # the TMA producer's addresses stay expressions of `it`: stores to the
                    # scalar variables land in the consumer branch only (warp specialisation)
                    ko = it % nk
                    g, jw, tq = step_of(pid, it // nk)
                    s = jw if ca else (jw + g) % R
                    r = _select(order, s)
                    by, bx = _raster(g, gx, gy, sw)
                    T.copy(At[r, by * bm:(by + 1) * bm, ko * bk:(ko + 1) * bk], A_s)
                    T.copy(Bt[r, ko * bk:(ko + 1) * bk, bx * bn:(bx + 1) * bn], B_s)
                    T.gemm(A_s, B_s, H, policy=pol, clear_accum=ko == 0)
                    if ko == nk - 1:
                        gv = g
                        tv = 0 if tq is None else tq
                        sv = s
                        yv = by
                        xv = bx
                        epilogue(C, Ps, H, pid, yv, xv, gv, tv, sv)
            else:
                for q in T.serial(n_steps(pid)):
                    g, jw, tq = step_of(pid, q)
                    gv = g
                    tv = 0 if tq is None else tq
                    sv = jw if ca else (jw + gv) % R
                    rv = _select(order, sv)
                    yv, xv = _raster(gv, gx, gy, sw)
                    T.clear(H)
                    for ko in T.Pipelined(nk, num_stages=cfg.stages):
                        T.copy(At[rv, yv * bm:(yv + 1) * bm, ko * bk:(ko + 1) * bk], A_s)
                        T.copy(Bt[rv, ko * bk:(ko + 1) * bk, xv * bn:(xv + 1) * bn], B_s)
                        T.gemm(A_s, B_s, H, policy=pol)
                    epilogue(C, Ps, H, pid, yv, xv, gv, tv, sv)

    return lcmac_fused_persistent


def split_fixup(alg, blk: Blocking, dtype: str, cfg: CudaConfig, plan, arch: str = "sm_90a"):
    """C_ij += the fp32 partials of the non-lead pieces of every split tail group, added in
    CTA order after the lead piece's partial already in C (or instead of it where the lead
    piece does not touch C_ij).  Runs after the persistent kernel on the same stream."""
    f = _Fused(alg, blk, dtype, cfg)
    bm, bn, R, M, N, Mb, Nb = f.bm, f.bn, f.R, f.M, f.N, f.Mb, f.Nb
    m, n, mn = f.m, f.n, f.m * f.n
    tr, tc = min(cfg.combine_rows, bm), min(cfg.combine_cols, bn)
    assert bm % tr == 0 and bn % tc == 0, "combine tile must divide the GEMM tile"
    Lt, F, slots = plan.Lt, plan.rounds * plan.P, plan.slots
    ca = cfg.cache_aware

    def touched(ij, c, e, rot):
        """Does the piece covering walk steps [c, e) contribute to C_ij?"""
        return _select(f.nxt[ij], c if ca else (c + rot) % R) < e - c

    pdl = _pdl(arch)
    @T.prim_func
    def lcmac_split_fixup(Ps: T.Tensor(_dims(slots, mn, bm, bn), ACCUM), C: T.Tensor(_dims(M, N), dtype)):
        with T.Kernel(T.ceildiv(bn, tc), T.ceildiv(bm, tr), plan.rem,
                      threads=cfg.combine_threads) as (cx, cy, gt):
            # the persistent kernel has finished and its partials (C, Ps) are visible
            if pdl:
                pdl_sync()
            g = F + gt
            by, bx = _raster(g, plan.gx, plan.gy, cfg.swizzle)
            rot = 0 if ca else g % R
            u0 = gt * R // Lt
            e0 = T.min((u0 + 1) * Lt - gt * R, R)
            for x, y in T.Parallel(tr, tc):
                xx = cy * tr + x
                yy = cx * tc + y
                row = by * bm + xx
                col = bx * bn + yy
                for i in _static(m):
                    for j in _static(n):
                        acc = T.if_then_else(touched((i, j), 0, e0, rot),
                                             T.cast(C[i * Mb + row, j * Nb + col], ACCUM),
                                             T.float32(0))
                        for k in _static(plan.max_pieces - 1):
                            u = u0 + 1 + k
                            c = u * Lt - gt * R
                            use = T.And(c < R, touched((i, j), c, T.min(c + Lt, R), rot))
                            acc = acc + T.if_then_else(
                                use, Ps[T.min(u, slots - 1), i * n + j, xx, yy], T.float32(0))
                        conds = f.conds(i, j, row, col)
                        if conds:
                            if _all_of(conds):
                                C[i * Mb + row, j * Nb + col] = T.cast(acc, dtype)
                        else:
                            C[i * Mb + row, j * Nb + col] = T.cast(acc, dtype)

    return lcmac_split_fixup


# ----------------------------------------------------------------------------------------------
def batched_gemm(blk: Blocking, dtype: str, cfg: CudaConfig, kmajor_b: bool = False,
                 arch: str = "sm_90a", ctas: int = 0, views: dict | None = None):
    """H_r = Ã_r · B̃_r for every r.  cache_aware=True: r is the slowest grid index, so the CTAs
    resident together work on the same product and share its Ã_r / B̃_r panels in L2;
    False (the ablation): r varies fastest, so neighbouring CTAs read R different panels.
    kmajor_b: B̃ stored [R, Nb, Kb] (TF32 wgmma for float32 on sm_90a).  ``ctas`` > 0: a
    persistent grid of that many CTAs walking the same order (``_persistent_tiles``).
    ``views`` ({"A"/"B": {r: input slot}}, ``CudaConfig.direct_views``): those products read
    their operand from A / B in place.  That side is then written against one [R, rows, Q,
    cols] tensor indexed by r alone, whose descriptor the build splits into the input's and
    the workspace's, each TMA load picking one from a table (``targets.cuda.view_loads``; a
    select chain over r here cost the producer thread more than a k step takes, 49 products
    deep).  The kernel then also takes A and/or B (after H), for that second descriptor."""
    bm, bn, bk = cfg.block_m, cfg.block_n, cfg.bk(dtype)
    pol = _policy(cfg, dtype)
    R, Mb, Nb, Kb = blk.R, blk.Mb, blk.Nb, blk.Kb
    gx, gy = -(-Nb // bn), -(-Mb // bm)
    # TileLang picks wgmma only for tf32 tiles
    sdt = T.tfloat32 if (kmajor_b and dtype == "float32") else dtype
    va, vb = bool((views or {}).get("A")), bool((views or {}).get("B"))
    a_shape = (R, Mb, blk.k, Kb) if va else (R, Mb, Kb)
    b_shape = (R, Kb, blk.n, Nb) if vb else (R, Nb, Kb) if kmajor_b else (R, Kb, Nb)
    b_tile = (bn, bk) if kmajor_b else (bk, bn)
    rfast = not kmajor_b and not cfg.cache_aware
    pdl = _pdl(arch)
    if cfg.cluster == 2:
        # the cache-aware order (r the slowest grid index); grid x runs over tile rows
        _check_cluster_grid(gy, cfg.swizzle)

    def a_slab(At, r, by, ko):
        if va:
            return At[r, by * bm:(by + 1) * bm, 0, ko * bk:(ko + 1) * bk]
        return At[r, by * bm:(by + 1) * bm, ko * bk:(ko + 1) * bk]

    def b_slab(Bt, r, bx, ko):
        if vb:
            return Bt[r, ko * bk:(ko + 1) * bk, 0, bx * bn:(bx + 1) * bn]
        if kmajor_b:
            return Bt[r, bx * bn:(bx + 1) * bn, ko * bk:(ko + 1) * bk]
        return Bt[r, ko * bk:(ko + 1) * bk, bx * bn:(bx + 1) * bn]

    @T.macro
    def tile(At, Bt, H, bx, by, bz, swizzle, multicast_b: bool = False):
        # one H tile
        _gemm_tile(lambda ko: a_slab(At, bz, by, ko), lambda ko: b_slab(Bt, bz, bx, ko),
                   H[bz, by * bm:(by + 1) * bm, bx * bn:(bx + 1) * bn], dtype, sdt, b_tile, bm, bn, bk,
                   T.ceildiv(Kb, bk), cfg, pol, kmajor_b, pdl, swizzle, multicast_b)

    P = min(ctas, R * gx * gy)

    @T.macro
    def kernel(At, Bt, H):
        if ctas:
            with T.Kernel(P, threads=cfg.threads) as pid:
                steps, tile_of = _persistent_walk(pid, P, R, gx, gy, cfg.swizzle, rfast)
                _persistent_tiles(lambda r, by, ko: a_slab(At, r, by, ko),
                                  lambda r, bx, ko: b_slab(Bt, r, bx, ko),
                                  lambda r, by, bx: H[r, by * bm:(by + 1) * bm, bx * bn:(bx + 1) * bn],
                                  tile_of, steps, dtype, sdt, b_tile, bm, bn, bk, T.ceildiv(Kb, bk), cfg,
                                  pol, pdl)
        elif cfg.cluster == 2:
            with T.ClusterKernel(gy, gx, R, threads=cfg.threads, cluster_dims=(2, 1, 1)) as (by, bx, bz):
                tile(At, Bt, H, bx, by, bz, True, True)
        elif rfast:
            # r fastest (the ablation); no rasterisation, which would remap bxr and undo it
            with T.Kernel(gx * R, gy, threads=cfg.threads) as (bxr, by):
                tile(At, Bt, H, bxr // R, by, bxr % R, False)
        else:
            with T.Kernel(gx, gy, R, threads=cfg.threads) as (bx, by, bz):
                tile(At, Bt, H, bx, by, bz, True)

    @T.prim_func
    def lcmac_bgemm(At: T.Tensor(_dims(*a_shape), dtype), Bt: T.Tensor(_dims(*b_shape), dtype),
                    H: T.Tensor(_dims(R, Mb, Nb), dtype), A: T.Tensor(_dims(blk.M, blk.K), dtype),
                    B: T.Tensor(_dims(blk.K, blk.N), dtype)):
        kernel(At, Bt, H)

    # A and B stay parameters only for the sides read in place (their second descriptor)
    lcmac_bgemm = _keep_params(lcmac_bgemm, [0, 1, 2] + [3] * va + [4] * vb)
    return lcmac_bgemm


def reduce_gemm_h(alg, blk: Blocking, dtype: str, cfg: CudaConfig, ctas: int, arch: str = "sm_90a"):
    """GEMM + Combine-H with the epilogue on the TMA engine (``cfg.tma_reduce``): P persistent
    CTAs, each owns whole groups (a tile position's R products, r = 0..R-1 back to back) and
    all CTAs run the same r at the same time (the cache-aware order).  After product r's K
    loop the consumers put w·H_r (bf16/fp16) in shared memory once per distinct coefficient
    w, and the TMA engine stores it into C_ij's tile (C_ij's first contribution) or adds it
    there (cp.reduce.async.bulk .add, performed in L2) — asynchronous, so the next product's
    K loop runs meanwhile, and neither H nor a Combine-H pass exists.  Deterministic: one CTA
    adds into a C tile, in a fixed order, each bulk group complete before the next one starts.
    C holds partial sums in its own dtype (as the register epilogue of ``fused_gemm_h``)."""
    f = _Fused(alg, blk, dtype, cfg)
    bm, bn, bk, nk = f.bm, f.bn, f.bk, f.nk
    R, Mb, Nb, Kb, M, N = f.R, f.Mb, f.Nb, f.Kb, f.M, f.N
    pol = _policy(cfg, dtype)
    gx, gy = Nb // bn, Mb // bm
    P = min(ctas, gx * gy)
    pdl = _pdl(arch)
    # the raster's column-panel width: the largest divisor of gx up to cfg.swizzle
    panel = max([d for d in range(1, max(cfg.swizzle, 1) + 1) if gx % d == 0])
    groups = reduce_groups(alg.W, list(range(R)))

    @T.macro
    def epilogue(C, C_l, C_s, r, by, bx):
        # The bulk stores/adds are not waited for where they are issued (targets.cuda.
        # async_reduce_stores drops the wait TileLang puts after each add), so the next
        # product's K loop runs while the TMA engine works.  Waits instead: all of the
        # previous product's bulk groups complete before this one writes C_s (an add into a
        # C tile then also follows the earlier store/adds into it), and a second coefficient
        # group waits until the first one's reads of C_s are done.
        for s0 in _static(R):
            if r == s0:
                T.tma_store_wait(0, read=False)
                for g, (w, dests) in enumerate(groups[s0]):
                    if g:
                        T.tma_store_wait(0, read=True)
                    if w == 1:
                        T.copy(C_l, C_s)
                    else:
                        for x, y in T.Parallel(bm, bn):
                            C_s[x, y] = T.cast(_scaled(w, C_l[x, y]), dtype)
                    for (i, j, first) in dests:
                        dst = C[i * Mb + by * bm:i * Mb + (by + 1) * bm,
                                j * Nb + bx * bn:j * Nb + (bx + 1) * bn]
                        if first:
                            T.tma_copy(C_s, dst)
                        else:
                            T.atomic_add(dst, C_s, annotations={"use_tma": 1})

    @T.prim_func
    def lcmac_reduce_gemm(At: T.Tensor(_dims(R, Mb, Kb), dtype), Bt: T.Tensor(_dims(R, Kb, Nb), dtype),
                          C: T.Tensor(_dims(M, N), dtype)):
        with T.Kernel(P, threads=cfg.threads) as pid:
            if pdl:
                pdl_sync()
            A_s = T.alloc_shared((bm, bk), dtype)
            B_s = T.alloc_shared((bk, bn), dtype)
            C_l = T.alloc_fragment((bm, bn), ACCUM)
            C_s = T.alloc_shared((bm, bn), dtype)
            steps = T.ceildiv(gx * gy - pid, P) * R
            for it in T.Pipelined(steps * nk, num_stages=cfg.stages):
                ko = it % nk
                q = it // nk
                r = q % R
                by, bx = _column_panels(q // R * P + pid, gx, gy, panel)
                T.copy(At[r, by * bm:(by + 1) * bm, ko * bk:(ko + 1) * bk], A_s)
                T.copy(Bt[r, ko * bk:(ko + 1) * bk, bx * bn:(bx + 1) * bn], B_s)
                T.gemm(A_s, B_s, C_l, policy=pol, clear_accum=ko == 0)
                if ko == nk - 1:
                    epilogue(C, C_l, C_s, r, by, bx)
            # the last bulk groups read C_s and write C: done before the CTA exits
            T.tma_store_wait(0, read=False)

    return lcmac_reduce_gemm


def combine_h(prog, alg, blk: Blocking, dtype: str, cfg: CudaConfig, arch: str = "sm_90a"):
    """C_ij = Σ_r W[r,i,j] H_r; H is fp32 with scaled operands (cfg.operands), else dtype."""
    R, Mb, Nb, M, N = blk.R, blk.Mb, blk.Nb, blk.M, blk.N
    hdt = dtype if cfg.operands == "native" else ACCUM
    tr, tc = cfg.combine_rows, cfg.combine_cols
    m, n = alg.m, alg.n
    rows_ok = [(i + 1) * Mb <= M for i in range(m)]
    cols_ok = [(j + 1) * Nb <= N for j in range(n)]

    pdl = _pdl(arch)
    @T.prim_func
    def lcmac_combine_h(H: T.Tensor(_dims(R, Mb, Nb), hdt), C: T.Tensor(_dims(M, N), dtype)):
        with T.Kernel(T.ceildiv(Nb, tc), T.ceildiv(Mb, tr), threads=cfg.combine_threads) as (bx, by):
            if pdl:
                pdl_sync()
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
                                if _all_of(conds):
                                    C[i * Mb + rr, j * Nb + cc] = T.cast(outs[i * n + j], dtype)
                            else:
                                C[i * Mb + rr, j * Nb + cc] = T.cast(outs[i * n + j], dtype)

    return lcmac_combine_h
