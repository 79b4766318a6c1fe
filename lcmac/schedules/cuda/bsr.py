"""Block-sparse A times dense B (SpMM) in one kernel: C = A·B with A in BSR form.

    bsr_spmm    a CTA per (block row of A, column tile of C); it walks its block row's
                nonzero blocks (CSR of blocks: ``row_ptr``, ``col_idx``, the blocks sorted by
                block row), loads each block's bs×bk slabs and the matching bk×block_n slabs
                of B's panel into shared memory, accumulates the products in fp32 registers
                and writes its C tile once.  A block row without blocks writes zeros.

The walk is one software pipeline whose trip count is the block row's block count times
bs/bk, read from ``row_ptr`` at run time: TileLang 0.1.15 pipelines such a loop on sm_90a as
it does a constant one (warp-specialised: a TMA producer warpgroup filling ``stages`` slots,
mbarriers, the consumer warpgroups' wgmma or mma.sync), so the next blocks' loads overlap
this block's products.  The blocks' count, M, K and N are kernel arguments (TileLang's
dynamic dimensions): one kernel per block size, dtype and tile serves every shape.
float32 operands are multiplied as TF32 (mma.sync, fp32 accumulation), as in the batched
kernel (``small``); bf16 and fp16 on wgmma (64- and 128-blocks) or mma.sync (16, 32).

The grid's x index is the block row, y the column tile: the CTAs resident at once share a
column tile and read the same K×block_n panel of B from L2, each its own blocks of A.  One
CTA is resident per SM (TileLang's launch bounds give every thread the consumers' 240
registers, or 168 with two consumer warpgroups), so a CTA with few blocks is mostly latency.
C's columns beyond N are never written (TMA zero-fills B's, clips C's); rows are whole
blocks.  The C tile goes through shared memory to the TMA engine (``store_via_smem``, the
default: whole lines, the faster at low density, where the kernel is mostly its stores) or
from registers.
"""
# (no `from __future__ import annotations`: TileLang evaluates the Tensor annotations)

import tilelang.language as T
from tilelang.cuda.language import pdl_sync

from lcmac.schedules.cuda.common import ACCUM, emit_names, uses_pdl, warp_policy
from lcmac.spec.cuda.config import CudaConfig

#: the kernel's arguments in the order of TileLang's launcher: the buffers, then the dynamic
#: dimensions in the order they first appear in the buffers' shapes
BSR_ARGS = ["A", "B", "C", "row_ptr", "col_idx", "nnzb", "K", "N", "M"]


def bsr_spmm(dtype: str, cfg: CudaConfig, arch: str = "sm_90a"):
    """C [M, N] = A·B for A [M, K] given by its ``nnzb`` nonzero bs×bs blocks (``cfg.bsr``)
    A [nnzb, bs, bs] sorted by block row, ``row_ptr`` [M/bs + 1] (int32: block row i's blocks
    are A[row_ptr[i]:row_ptr[i+1]]) and ``col_idx`` [nnzb] (int32 block columns), B [K, N];
    all row-major and contiguous, M and K multiples of bs, N a multiple of 16 bytes."""
    bs = cfg.bsr
    block_n, block_k = cfg.block_n, min(cfg.bk(dtype), bs)
    slabs = bs // block_k                    # K slabs per block
    policy = warp_policy(cfg.policy, dtype)
    pdl = uses_pdl(arch)
    nnzb, M, K, N = T.dynamic("nnzb"), T.dynamic("M"), T.dynamic("K"), T.dynamic("N")

    @T.prim_func
    def lcmac_bsr(A: T.Tensor((nnzb, bs, bs), dtype), B: T.Tensor((K, N), dtype),
                  C: T.Tensor((M, N), dtype), row_ptr: T.Tensor((M // bs + 1,), "int32"),
                  col_idx: T.Tensor((nnzb,), "int32")):
        with T.Kernel(T.ceildiv(M, bs), T.ceildiv(N, block_n), threads=cfg.threads) as (brow, bcol):
            if pdl:
                pdl_sync()              # the CSR arrays may come from the kernel just before
            A_shared = T.alloc_shared((bs, block_k), dtype)
            B_shared = T.alloc_shared((block_k, block_n), dtype)
            C_local = T.alloc_fragment((bs, block_n), ACCUM)
            emit_names(A_s=A_shared, B_s=B_shared, C_l=C_local)
            first = row_ptr[brow]
            steps = (row_ptr[brow + 1] - first) * slabs
            # cleared before the walk, not by its first product: an empty row writes zeros
            T.clear(C_local)
            for step in T.Pipelined(steps, num_stages=cfg.stages):
                blk = first + step // slabs
                ko = step % slabs
                T.copy(A[blk, 0, ko * block_k], A_shared)
                T.copy(B[col_idx[blk] * bs + ko * block_k, bcol * block_n], B_shared)
                T.gemm(A_shared, B_shared, C_local, policy=policy)
            if cfg.store_via_smem:
                # whole 128-byte lines by TMA (columns past N clipped by the engine) instead
                # of each thread's 4- or 8-byte stores
                C_shared = T.alloc_shared((bs, block_n), dtype)
                emit_names(C_s=C_shared)
                T.copy(C_local, C_shared)
                T.copy(C_shared, C[brow * bs, bcol * block_n])
            else:
                T.copy(C_local, C[brow * bs, bcol * block_n])

    return lcmac_bsr
