"""Batched products of small matrices, C[b] = A[b]·B[b], each output tile inside one CTA
(KAMI's setting: the operands of one product staged in shared memory, the accumulators in
registers, tensor cores as the compute units).

    batched_small_gemm   a CTA per output tile position and group of ``products_per_cta``
                         products, which it runs in one software pipeline; the batch count
                         is a kernel argument (TileLang's dynamic dimension), so one kernel
                         serves every batch size of a (M, N, K)

The grid's x index is the group of products (up to 2³¹ − 1 of them; y and z would cap it at
65535), y the tile within a product.  A product no larger than the tile is one CTA; the warp partition is the
config's ``policy`` (``fullrow``: warps split the tile's rows, 1D; ``square``: rows and
columns, 2D; ``splitk``: KAMI's 3D partition, ``batched_splitk_gemm``).  Partial tiles (M, N or K not a multiple of the tile) are copied with bounds
checks and zero fill, so any size is exact.  Sizes per product and the tile a size gets:
``batched_tiles.small_tile_defaults``.  Products wider than 128 run on the production GEMM
template instead (``gemm.batched_products``; this one's 128×256 kernel by
``batched_template="small"``).

float64 runs here at every size (``batched_tiles.float64_tile_defaults``): the fp64 tensor
cores (mma.sync m8n8k4; wgmma has no fp64), float64 accumulators (``config.accum_dtype``),
the operands copied by cp.async rather than TMA (``spec.cuda.dtypes.tma_copies``).
"""
# (no `from __future__ import annotations`: TileLang evaluates the Tensor annotations)

import tilelang.language as T
from tilelang.cuda.language import pdl_sync

from lcmac.schedules.cuda.common import emit_names, uses_pdl, warp_policy
from lcmac.spec.cuda.config import CudaConfig
from lcmac.spec.cuda.dtypes import accum_dtype, tma_copies


def batched_small_gemm(M: int, N: int, K: int, dtype: str, cfg: CudaConfig, arch: str = "sm_90a"):
    """C[b] = A[b]·B[b] for b < batch, A [batch, M, K], B [batch, K, N], C [batch, M, N],
    all row-major and contiguous; ``batch`` is the kernel's last argument."""
    if cfg.policy == "splitk":
        return batched_splitk_gemm(M, N, K, dtype, cfg, arch)
    pdl = uses_pdl(arch)
    block_m, block_n, block_k = cfg.block_m, cfg.block_n, cfg.bk(dtype)
    tiles_n = T.ceildiv(N, block_n)
    tiles = T.ceildiv(M, block_m) * tiles_n
    batch = T.dynamic("batch")
    policy = warp_policy(cfg.policy, dtype)

    per_cta = cfg.products_per_cta
    num_k = -(-K // block_k)
    accum, tma = accum_dtype(dtype), tma_copies(dtype)     # float64: float64 accumulators, cp.async

    @T.prim_func
    def lcmac_bmm(A: T.Tensor((batch, M, K), dtype), B: T.Tensor((batch, K, N), dtype),
                  C: T.Tensor((batch, M, N), dtype)):
        with T.Kernel(T.ceildiv(batch, per_cta), tiles, threads=cfg.threads) as (group, tile):
            if pdl:
                pdl_sync()      # A and B may come from the kernel just before (common.uses_pdl)
            by, bx = tile // tiles_n, tile % tiles_n
            A_shared = T.alloc_shared((block_m, block_k), dtype)
            B_shared = T.alloc_shared((block_k, block_n), dtype)
            C_local = T.alloc_fragment((block_m, block_n), accum)
            emit_names(A_s=A_shared, B_s=B_shared, C_l=C_local)
            # one pipeline over every (product, k) step of the CTA's products: the next
            # product's slabs load while this one multiplies and stores.  The last group's
            # index is clamped: it repeats the last product (same values, same CTA, in order)
            # instead of reading past the batch.
            for step in T.Pipelined(per_cta * num_k, num_stages=cfg.stages):
                b = T.min(group * per_cta + step // num_k, batch - 1)
                ko = step % num_k
                T.copy(A[b, by * block_m, ko * block_k], A_shared, disable_tma=not tma)
                T.copy(B[b, ko * block_k, bx * block_n], B_shared, disable_tma=not tma)
                T.gemm(A_shared, B_shared, C_local, policy=policy, clear_accum=ko == 0)
                if ko == num_k - 1:
                    T.copy(C_local, C[b, by * block_m, bx * block_n])

    return lcmac_bmm


def batched_splitk_gemm(M: int, N: int, K: int, dtype: str, cfg: CudaConfig, arch: str = "sm_90a"):
    """The 3D warp partition: the CTA's ``threads // 32`` warps split each K slab, warp w
    multiplying columns [w·bk/W, (w+1)·bk/W) of the A slab by those rows of the B slab into
    an accumulator of its own (the whole bm×bn tile, in its registers); at the product's end
    the W partial tiles meet in shared memory and are summed in a fixed order (deterministic)
    on their way to C.  For small M×N with a long K, where one warp would walk K alone."""
    block_m, block_n, block_k = cfg.block_m, cfg.block_n, cfg.bk(dtype)
    warps = cfg.threads // 32
    part_k = block_k // warps
    tiles_n = T.ceildiv(N, block_n)
    tiles = T.ceildiv(M, block_m) * tiles_n
    batch = T.dynamic("batch")
    per_cta = cfg.products_per_cta
    num_k = -(-K // block_k)
    ws = list(range(warps))            # a Python list: the per-warp code is unrolled at trace time
    pdl = uses_pdl(arch)
    accum, tma = accum_dtype(dtype), tma_copies(dtype)

    @T.prim_func
    def lcmac_bmm(A: T.Tensor((batch, M, K), dtype), B: T.Tensor((batch, K, N), dtype),
                  C: T.Tensor((batch, M, N), dtype)):
        with T.Kernel(T.ceildiv(batch, per_cta), tiles, threads=cfg.threads) as (group, tile):
            if pdl:
                pdl_sync()      # A and B may come from the kernel just before (common.uses_pdl)
            by, bx = tile // tiles_n, tile % tiles_n
            A_shared = T.alloc_shared((block_m, block_k), dtype)
            B_shared = T.alloc_shared((block_k, block_n), dtype)
            P_shared = T.alloc_shared((warps, block_m, block_n), accum)
            # one accumulator per warp: a gemm under ``warp == w`` lays its fragment over
            # that warp's 32 threads only (TileLang bounds the threads from the condition)
            parts = [T.alloc_fragment((block_m, block_n), accum) for _ in ws]
            emit_names(A_s=A_shared, B_s=B_shared, P_s=P_shared)
            tx = T.get_thread_binding()
            # one pipeline over every (product, k) step, as in batched_small_gemm
            for step in T.Pipelined(per_cta * num_k, num_stages=cfg.stages):
                b = T.min(group * per_cta + step // num_k, batch - 1)
                ko = step % num_k
                T.copy(A[b, by * block_m, ko * block_k], A_shared, disable_tma=not tma)
                T.copy(B[b, ko * block_k, bx * block_n], B_shared, disable_tma=not tma)
                for w in ws:
                    if tx >= w * 32 and tx < (w + 1) * 32:
                        T.gemm(A_shared[0:block_m, w * part_k:(w + 1) * part_k],
                               B_shared[w * part_k:(w + 1) * part_k, 0:block_n], parts[w],
                               clear_accum=ko == 0)
                if ko == num_k - 1:
                    for w in ws:
                        if tx >= w * 32 and tx < (w + 1) * 32:
                            T.copy(parts[w], P_shared[w, 0:block_m, 0:block_n])
                    for i, j in T.Parallel(block_m, block_n):
                        if by * block_m + i < M and bx * block_n + j < N:
                            C[b, by * block_m + i, bx * block_n + j] = _sum_parts(P_shared, ws, i, j)

    return lcmac_bmm


def _sum_parts(P, ws, i, j):
    acc = P[0, i, j]
    for w in ws[1:]:
        acc = acc + P[w, i, j]
    return acc
