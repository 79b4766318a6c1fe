"""The GEMM stage's templates: the plain GEMM and Algorithm 1's batched GEMM, each as a grid
kernel (one CTA per output tile), a 2-CTA cluster kernel sharing B slabs by multicast, or a
persistent kernel (P CTAs walking the tiles in one software pipeline).

    plain_gemm      C = A·B (tensor cores via T.gemm: wgmma on sm_90a, mma on sm_80; float64
                    on the fp64 tensor cores, mma.sync m8n8k4, with cp.async copies)
    batched_gemm    H_r = Ã_r·B̃_r for every product r, optionally reading the single-block
                    operands from A / B in place (``CudaConfig.direct_views``)
    batched_products  C[b] = A[b]·B[b] for a batch whose count is a kernel argument
                    (``lcmac.bmm``'s products wider than 128, ``CudaConfig.batched_template``)

The macros below (``k_loop``, ``store_tile``) are the K loop and the tile store the scaled
and fp8 GEMM stages (``low_precision``) share.
"""
# (no `from __future__ import annotations`: TileLang evaluates the Tensor annotations)

import tilelang.language as T
from tilelang.cuda.language import pdl_sync

from lcmac.schedules.cuda.common import (
    ACCUM, GemmTile, emit_names, extents, grid_ctas, keep_params, raster, tile_count, uses_pdl)
from lcmac.spec.cuda.blocking import Blocking
from lcmac.spec.cuda.config import CudaConfig
from lcmac.spec.cuda.dtypes import accum_dtype, tma_copies
from lcmac.spec.cuda.support import NotSupportedYet


@T.macro
def k_loop(a_slab, b_slab, A_shared, B_shared, C_local, num_k, num_stages: int, policy,
           kmajor: bool, multicast_b: bool = False, tma: bool = True):
    """One output tile's pipelined K loop (TMA/cp.async slabs into shared memory, fp32
    accumulators, float64 for float64): ``a_slab(ko)``/``b_slab(ko)`` give the global regions
    of the ko-th A and B slabs (B K-major when ``kmajor``).  ``multicast_b``: the CTA pair of
    a 2-CTA cluster shares the B slab, rank 0 loads it into both (the generated loop is
    completed by ``host_source.cluster_pipeline``).  ``tma`` False: cp.async copies only
    (``spec.cuda.dtypes.tma_copies``)."""
    T.clear(C_local)
    for ko in T.Pipelined(num_k, num_stages=num_stages):
        T.copy(a_slab(ko), A_shared, disable_tma=not tma)
        if multicast_b:
            T.copy_cluster(b_slab(ko), B_shared, cluster_mask=0b11)
        else:
            T.copy(b_slab(ko), B_shared, disable_tma=not tma)
        if kmajor:
            T.gemm(A_shared, B_shared, C_local, transpose_B=True, policy=policy)
        else:
            T.gemm(A_shared, B_shared, C_local, policy=policy)


@T.macro
def store_tile(C_local, c_out, out_dtype, tile: GemmTile, C_shared=None):
    """The accumulator tile ``C_local`` to the global region ``c_out`` (dtype ``out_dtype``):
    through shared memory (stmatrix, then TMA stores on sm_90a; TileLang lets the tile alias
    the drained pipeline buffers) when ``tile.store_via_smem``, else every thread stores its
    fragments.  ``C_shared``: a shared tile allocated by the caller (a pipeline that never
    drains)."""
    if tile.store_via_smem:
        if C_shared is None:
            C_shared = T.alloc_shared((tile.block_m, tile.block_n), out_dtype)
            emit_names(C_s=C_shared)
        T.copy(C_local, C_shared)
        T.copy(C_shared, c_out)
    else:
        T.copy(C_local, c_out)


@T.macro
def _gemm_tile(a_slab, b_slab, c_out, out_dtype, smem_dtype, b_tile, tile: GemmTile, num_k,
               kmajor: bool, pdl: bool, swizzle: bool, multicast_b: bool = False):
    """One CTA's whole output tile of a plain or batched GEMM: wait for the previous kernel
    (PDL), the shared-memory slabs and the accumulators (fp32; float64 for float64 outputs,
    whose operands come by cp.async), the rasterisation (``swizzle``), the K loop, the store
    to the global region ``c_out`` (dtype ``out_dtype``)."""
    if pdl:
        pdl_sync()
    A_shared = T.alloc_shared((tile.block_m, tile.block_k), smem_dtype)
    B_shared = T.alloc_shared(b_tile, smem_dtype)
    C_local = T.alloc_fragment((tile.block_m, tile.block_n), accum_dtype(out_dtype))
    emit_names(A_s=A_shared, B_s=B_shared, C_l=C_local)
    if swizzle:
        T.use_swizzle(panel_size=max(tile.swizzle, 1), enable=tile.swizzle > 0)
    k_loop(a_slab, b_slab, A_shared, B_shared, C_local, num_k, tile.num_stages, tile.policy,
           kmajor, multicast_b, tma_copies(out_dtype))
    store_tile(C_local, c_out, out_dtype, tile)


@T.macro
def _persistent_tiles(a_slab, b_slab, c_out, tile_of, steps, out_dtype, smem_dtype, b_tile,
                      tile: GemmTile, num_k, pdl: bool):
    """A persistent CTA's share of a plain or batched GEMM (``cfg.persistent``, unfused):
    ``steps`` output tiles, the q-th at ``tile_of(q)`` = (r, by, bx), and one software
    pipeline over every (tile, k) step, so the TMA producer loads the next tile's first slabs
    while the consumers store this one.  ``a_slab(r, by, ko)`` / ``b_slab(r, bx, ko)`` /
    ``c_out(r, by, bx)`` give the global regions.  The pipeline never drains, so the output
    tile (``store_via_smem``) has shared memory of its own."""
    if pdl:
        pdl_sync()
    A_shared = T.alloc_shared((tile.block_m, tile.block_k), smem_dtype)
    B_shared = T.alloc_shared(b_tile, smem_dtype)
    C_local = T.alloc_fragment((tile.block_m, tile.block_n), ACCUM)
    C_shared = T.alloc_shared((tile.block_m, tile.block_n), out_dtype) if tile.store_via_smem else None
    emit_names(A_s=A_shared, B_s=B_shared, C_l=C_local)
    if tile.store_via_smem:
        emit_names(C_s=C_shared)
    for it in T.Pipelined(steps * num_k, num_stages=tile.num_stages):
        # a run-time K (it >= 0): C's division, not floor division's sign handling
        static_k = isinstance(num_k, int) or hasattr(num_k, "value")      # an int or IntImm
        ko = it % num_k if static_k else T.truncmod(it, num_k)
        r, by, bx = tile_of(it // num_k if static_k else T.truncdiv(it, num_k))
        T.copy(a_slab(r, by, ko), A_shared)
        T.copy(b_slab(r, bx, ko), B_shared)
        T.gemm(A_shared, B_shared, C_local, policy=tile.policy, clear_accum=ko == 0)
        if ko == num_k - 1:
            store_tile(C_local, c_out(r, by, bx), out_dtype, tile, C_shared)


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
        return _product_tile(t, gx, gy, panel)

    if isinstance(tiles, int):
        return T.ceildiv(tiles - pid, ctas), tile_of
    # a run-time tile count (gy): tiles - pid + ctas - 1 >= 0, so C's division is exact
    return T.truncdiv(tiles - pid + ctas - 1, ctas), tile_of


def _product_tile(t, gx: int, gy: int, panel: int):
    """(r, by, bx) of linear tile index t >= 0 with r slowest: the product t // (gx·gy), the
    tile within it in TileLang's rasterised order (``raster``).  A run-time gy: C's division
    (t >= 0), without floor division's sign handling in the producer's every step."""
    tiles = gx * gy
    if not isinstance(tiles, int):
        by, bx = raster(T.truncmod(t, tiles), gx, gy, panel)
        return T.truncdiv(t, tiles), by, bx
    by, bx = raster(t % tiles, gx, gy, panel)
    return t // tiles, by, bx


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
def plain_gemm(M: int, N: int, K: int, dtype: str, cfg: CudaConfig, arch: str = "sm_90a",
               bt_shape: tuple[int, int] | None = None, ctas: int = 0):
    """C = A·B; ``bt_shape`` (Nb, Kb): B given transposed, Bt [Nb, Kb] K-major (TF32 wgmma
    for float32 on sm_90a reads both operands K-major; TileLang picks wgmma only for tf32
    tiles).  ``ctas`` > 0: a persistent grid of that many CTAs (``_persistent_tiles``)."""
    tile = GemmTile.of(cfg, dtype)
    block_m, block_n, block_k = tile.block_m, tile.block_n, tile.block_k
    kmajor = bt_shape is not None
    smem_dtype = T.tfloat32 if (kmajor and dtype == "float32") else dtype
    b_dims = bt_shape if kmajor else (K, N)
    b_tile = (block_n, block_k) if kmajor else (block_k, block_n)
    pdl = uses_pdl(arch)

    @T.macro
    def body(A, B, C, bx, by, multicast_b: bool = False):
        _gemm_tile(lambda ko: A[by * block_m, ko * block_k],
                   (lambda ko: B[bx * block_n, ko * block_k]) if kmajor
                   else (lambda ko: B[ko * block_k, bx * block_n]),
                   C[by * block_m, bx * block_n], dtype, smem_dtype, b_tile, tile,
                   T.ceildiv(K, block_k), kmajor, pdl, True, multicast_b)

    if kmajor:
        @T.prim_func
        def lcmac_gemm_t(A: T.Tensor(extents(M, K), dtype), Bt: T.Tensor(extents(*b_dims), dtype),
                         C: T.Tensor(extents(M, N), dtype)):
            with T.Kernel(T.ceildiv(N, block_n), T.ceildiv(M, block_m), threads=cfg.threads) as (bx, by):
                body(A, Bt, C, bx, by)
        return lcmac_gemm_t

    if ctas:
        gx, gy = tile_count(N, block_n), tile_count(M, block_m)
        num_ctas = grid_ctas(ctas, gx * gy)

        @T.prim_func
        def lcmac_gemm_p(A: T.Tensor(extents(M, K), dtype), B: T.Tensor(extents(*b_dims), dtype),
                         C: T.Tensor(extents(M, N), dtype)):
            with T.Kernel(num_ctas, threads=cfg.threads) as pid:
                steps, tile_of = _persistent_walk(pid, num_ctas, 1, gx, gy, cfg.swizzle, False)
                _persistent_tiles(
                    lambda r, by, ko: A[by * block_m:(by + 1) * block_m, ko * block_k:(ko + 1) * block_k],
                    lambda r, bx, ko: B[ko * block_k:(ko + 1) * block_k, bx * block_n:(bx + 1) * block_n],
                    lambda r, by, bx: C[by * block_m:(by + 1) * block_m, bx * block_n:(bx + 1) * block_n],
                    tile_of, steps, dtype, smem_dtype, b_tile, tile, T.ceildiv(K, block_k), pdl)
        return lcmac_gemm_p

    if cfg.cluster == 2:
        _check_cluster_grid(-(-M // block_m), cfg.swizzle)

        @T.prim_func
        def lcmac_gemm_c(A: T.Tensor(extents(M, K), dtype), B: T.Tensor(extents(*b_dims), dtype),
                         C: T.Tensor(extents(M, N), dtype)):
            # grid x runs over tile rows: a cluster is two vertically adjacent tiles
            with T.ClusterKernel(T.ceildiv(M, block_m), T.ceildiv(N, block_n), threads=cfg.threads,
                                 cluster_dims=(2, 1, 1)) as (by, bx):
                body(A, B, C, bx, by, True)
        return lcmac_gemm_c

    @T.prim_func
    def lcmac_gemm(A: T.Tensor(extents(M, K), dtype), B: T.Tensor(extents(*b_dims), dtype),
                   C: T.Tensor(extents(M, N), dtype)):
        with T.Kernel(T.ceildiv(N, block_n), T.ceildiv(M, block_m), threads=cfg.threads) as (bx, by):
            body(A, B, C, bx, by)
    return lcmac_gemm


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
    the workspace's, each TMA load picking one from a table (``host_source.view_loads``; a
    select chain over r here cost the producer thread more than a k step takes, 49 products
    deep).  The kernel then also takes A and/or B (after H), for that second descriptor."""
    tile = GemmTile.of(cfg, dtype)
    block_m, block_n, block_k = tile.block_m, tile.block_n, tile.block_k
    R, Mb, Nb, Kb = blk.R, blk.Mb, blk.Nb, blk.Kb
    gx, gy = tile_count(Nb, block_n), tile_count(Mb, block_m)
    # TileLang picks wgmma only for tf32 tiles
    smem_dtype = T.tfloat32 if (kmajor_b and dtype == "float32") else dtype
    view_a, view_b = bool((views or {}).get("A")), bool((views or {}).get("B"))
    a_shape = (R, Mb, blk.k, Kb) if view_a else (R, Mb, Kb)
    b_shape = (R, Kb, blk.n, Nb) if view_b else (R, Nb, Kb) if kmajor_b else (R, Kb, Nb)
    b_tile = (block_n, block_k) if kmajor_b else (block_k, block_n)
    rfast = not kmajor_b and not cfg.cache_aware
    pdl = uses_pdl(arch)
    if cfg.cluster == 2:
        # the cache-aware order (r the slowest grid index); grid x runs over tile rows
        _check_cluster_grid(gy, cfg.swizzle)

    def a_slab(At, r, by, ko):
        if view_a:
            return At[r, by * block_m:(by + 1) * block_m, 0, ko * block_k:(ko + 1) * block_k]
        return At[r, by * block_m:(by + 1) * block_m, ko * block_k:(ko + 1) * block_k]

    def b_slab(Bt, r, bx, ko):
        if view_b:
            return Bt[r, ko * block_k:(ko + 1) * block_k, 0, bx * block_n:(bx + 1) * block_n]
        if kmajor_b:
            return Bt[r, bx * block_n:(bx + 1) * block_n, ko * block_k:(ko + 1) * block_k]
        return Bt[r, ko * block_k:(ko + 1) * block_k, bx * block_n:(bx + 1) * block_n]

    @T.macro
    def h_tile(At, Bt, H, bx, by, bz, swizzle, multicast_b: bool = False):
        _gemm_tile(lambda ko: a_slab(At, bz, by, ko), lambda ko: b_slab(Bt, bz, bx, ko),
                   H[bz, by * block_m:(by + 1) * block_m, bx * block_n:(bx + 1) * block_n], dtype,
                   smem_dtype, b_tile, tile, T.ceildiv(Kb, block_k), kmajor_b, pdl, swizzle,
                   multicast_b)

    num_ctas = grid_ctas(ctas, R * gx * gy)

    @T.macro
    def kernel(At, Bt, H):
        if ctas:
            with T.Kernel(num_ctas, threads=cfg.threads) as pid:
                steps, tile_of = _persistent_walk(pid, num_ctas, R, gx, gy, cfg.swizzle, rfast)
                _persistent_tiles(
                    lambda r, by, ko: a_slab(At, r, by, ko), lambda r, bx, ko: b_slab(Bt, r, bx, ko),
                    lambda r, by, bx: H[r, by * block_m:(by + 1) * block_m, bx * block_n:(bx + 1) * block_n],
                    tile_of, steps, dtype, smem_dtype, b_tile, tile, T.ceildiv(Kb, block_k), pdl)
        elif cfg.cluster == 2:
            with T.ClusterKernel(gy, gx, R, threads=cfg.threads, cluster_dims=(2, 1, 1)) as (by, bx, bz):
                h_tile(At, Bt, H, bx, by, bz, True, True)
        elif rfast:
            # r fastest (the ablation); no rasterisation, which would remap bxr and undo it
            with T.Kernel(gx * R, gy, threads=cfg.threads) as (bxr, by):
                h_tile(At, Bt, H, bxr // R, by, bxr % R, False)
        else:
            with T.Kernel(gx, gy, R, threads=cfg.threads) as (bx, by, bz):
                h_tile(At, Bt, H, bx, by, bz, True)

    @T.prim_func
    def lcmac_bgemm(At: T.Tensor(extents(*a_shape), dtype), Bt: T.Tensor(extents(*b_shape), dtype),
                    H: T.Tensor(extents(R, Mb, Nb), dtype), A: T.Tensor(extents(blk.M, blk.K), dtype),
                    B: T.Tensor(extents(blk.K, blk.N), dtype)):
        kernel(At, Bt, H)

    # A and B stay parameters only for the sides read in place (their second descriptor)
    return keep_params(lcmac_bgemm, [0, 1, 2] + [3] * view_a + [4] * view_b)


# ----------------------------------------------------------------------------------------------
def batched_products(M: int, N: int, K: int, dtype: str, cfg: CudaConfig, arch: str = "sm_90a",
                     ctas: int = 0):
    """C[b] = A[b]·B[b] for b < batch on this template (``lcmac.bmm``; ``small`` keeps the
    products of up to 128 per side): A [batch, M, K], B [batch, K, N], C [batch, M, N],
    row-major and contiguous, ``batch`` a dynamic dimension (the launcher's last argument),
    so one kernel per (M, N, K) and dtype serves every batch size.

    The grid is 1-D, x = b·tiles + t (up to 2³¹ − 1 CTAs, where y and z stop at 65 535): the
    product b is the slowest index, so the CTAs resident together work on a few products and
    share their A and B panels in L2; the tile t is rasterised within its product
    (``_product_tile``, panel ``cfg.swizzle``).  Each CTA is ``_gemm_tile``: the previous
    kernel awaited (PDL), the warp-specialised TMA pipeline over K, wgmma (TF32 mma.sync for
    float32), the C tile through shared memory and out by TMA.  ``ctas`` > 0: a persistent
    grid of that many CTAs walking the same order in one pipeline (``_persistent_tiles``).
    Partial tiles stay exact: TMA checks bounds per dimension (loads past M, N or K are
    zero-filled, stores clipped; no tile reaches into the next product), and where rows are
    not 16-byte multiples TileLang copies element-wise with bounds checks (cp.async; the
    persistent walk is refused there, ``batched_tiles.persistent_why``).

    Not done: float32 multiplies on TF32 mma.sync (cuBLAS's TF32 wgmma needs B K-major, a
    transpose this kernel does not make), which runs behind torch.bmm from 384³ on the H200
    (docs/batched.md); the persistent grid is sized for the target profile's SMs (132), not the device's;
    a 2-CTA cluster (multicast) is not tried.  batch·tiles must stay below 2³¹ (the memory
    of such a batch does not exist on today's GPUs)."""
    tile = GemmTile.of(cfg, dtype)
    block_m, block_n, block_k = tile.block_m, tile.block_n, tile.block_k
    gx, gy = -(-N // block_n), -(-M // block_m)
    num_k = -(-K // block_k)
    batch = T.dynamic("batch")
    pdl = uses_pdl(arch)

    def a_slab(A, b, by, ko):
        return A[b, by * block_m:(by + 1) * block_m, ko * block_k:(ko + 1) * block_k]

    def b_slab(B, b, bx, ko):
        return B[b, ko * block_k:(ko + 1) * block_k, bx * block_n:(bx + 1) * block_n]

    def c_out(C, b, by, bx):
        return C[b, by * block_m:(by + 1) * block_m, bx * block_n:(bx + 1) * block_n]

    if ctas:
        @T.prim_func
        def lcmac_bmm_p(A: T.Tensor((batch, M, K), dtype), B: T.Tensor((batch, K, N), dtype),
                        C: T.Tensor((batch, M, N), dtype)):
            with T.Kernel(ctas, threads=cfg.threads) as pid:
                steps, tile_of = _persistent_walk(pid, ctas, batch, gx, gy, cfg.swizzle, False)
                _persistent_tiles(lambda b, by, ko: a_slab(A, b, by, ko), lambda b, bx, ko: b_slab(B, b, bx, ko),
                                  lambda b, by, bx: c_out(C, b, by, bx), tile_of, steps, dtype, dtype,
                                  (block_k, block_n), tile, num_k, pdl)
        return lcmac_bmm_p

    @T.prim_func
    def lcmac_bmm(A: T.Tensor((batch, M, K), dtype), B: T.Tensor((batch, K, N), dtype),
                  C: T.Tensor((batch, M, N), dtype)):
        with T.Kernel(batch * (gx * gy), threads=cfg.threads) as pid:
            b, by, bx = _product_tile(pid, gx, gy, cfg.swizzle)
            _gemm_tile(lambda ko: a_slab(A, b, by, ko), lambda ko: b_slab(B, b, bx, ko), c_out(C, b, by, bx),
                       dtype, dtype, (block_k, block_n), tile, num_k, False, pdl, False)
    return lcmac_bmm
