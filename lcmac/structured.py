"""Products whose A has structure, run as batches of small dense products (``lcmac.bmm``):

    C = lowrank_matmul(U, V, B)          # A = U·Vᵀ never formed: C = U·(Vᵀ·B)
    C = bsr_matmul(blocks, rows, cols, B, shape)   # A block-sparse (BSR), C = A·B

**Low rank.**  U [..., M, r], V [..., K, r], B [..., K, N] (a leading batch dimension on all
three, or none): C = U·(Vᵀ·B) costs 2r(K + M)N flops against 2MKN for A·B, and
(U·Vᵀ)·B 2MKr + 2MKN; the cheaper order is taken (``lowrank_order``).

**Block-sparse A** (BSR: the nonzero bs×bs blocks ``blocks`` [nnzb, bs, bs], block row
``rows[i]`` and block column ``cols[i]`` of each, A of ``shape`` = (M, K), both multiples
of bs) times a dense B [K, N]: every nonzero block meets its row panel of B,
``H[i] = blocks[i]·B[cols[i]]`` — one batched product of nnzb bs×bs by bs×N — and the
products are summed into C's block rows (``index_add``; ``np.add.at`` on numpy).  The
gathered B panels take nnzb·bs·N elements of memory.

Both take numpy arrays or torch tensors and ``algo`` as ``lcmac.bmm`` does (CUDA:
"gemm" for lcmac's batched kernel); the sums stay in the dtype of the operands.
"""
from __future__ import annotations

import numpy as np

from .batched import bmm
from .call_args import operand_kind
from .errors import DTypeError, ShapeError

__all__ = ["lowrank_matmul", "lowrank_order", "bsr_matmul"]


def lowrank_order(M: int, K: int, N: int, r: int) -> str:
    """"U(VtB)" or "(UVt)B": the order with fewer flops for A = U·Vᵀ of rank r."""
    return "U(VtB)" if r * (K + M) * N <= M * K * r + M * K * N else "(UVt)B"


def _is_torch(x) -> bool:
    return operand_kind(x) == "torch"


def _t(x):
    """The last two dimensions swapped, as a view: the vendor's batched GEMM reads a transposed
    operand in place, and lcmac's own kernel path makes its operands contiguous itself."""
    if _is_torch(x):
        return x.transpose(-1, -2)
    return np.swapaxes(x, -1, -2)


def lowrank_matmul(U, V, B, *, algo: str = "auto"):
    """C = (U·Vᵀ)·B without forming U·Vᵀ where that is cheaper (module doc)."""
    if not (U.ndim == V.ndim == B.ndim and U.ndim in (2, 3)):
        raise ShapeError(f"U, V and B must all be 2-D or all 3-D (a batch), got {U.ndim}-D, "
                         f"{V.ndim}-D and {B.ndim}-D")
    if U.shape[-1] != V.shape[-1] or V.shape[-2] != B.shape[-2] or U.shape[:-2] != V.shape[:-2] \
            or U.shape[:-2] != B.shape[:-2]:
        raise ShapeError(f"U [.., M, r], V [.., K, r] and B [.., K, N] do not fit: {tuple(U.shape)}, "
                         f"{tuple(V.shape)}, {tuple(B.shape)}")
    batched = U.ndim == 3
    u, v, b = (x if batched else x[None] for x in (U, V, B))
    M, r = u.shape[-2:]
    K, N = b.shape[-2:]
    if lowrank_order(M, K, N, r) == "U(VtB)":
        C = bmm(u, bmm(_t(v), b, algo=algo), algo=algo)
    else:
        C = bmm(bmm(u, _t(v), algo=algo), b, algo=algo)
    return C if batched else C[0]


def bsr_matmul(blocks, rows, cols, B, shape, *, algo: str = "auto"):
    """C = A·B for a block-sparse A given by its nonzero blocks (module doc)."""
    M, K = (int(x) for x in shape)
    if blocks.ndim != 3 or blocks.shape[1] != blocks.shape[2]:
        raise ShapeError(f"blocks must be [nnzb, bs, bs], got {tuple(blocks.shape)}")
    nnzb, bs = blocks.shape[0], blocks.shape[1]
    if M % bs or K % bs:
        raise ShapeError(f"A's shape {M}x{K} must be a multiple of the block size {bs}")
    if B.ndim != 2 or B.shape[0] != K:
        raise ShapeError(f"B must be [K={K}, N], got {tuple(B.shape)}")
    if len(rows) != nnzb or len(cols) != nnzb:
        raise ShapeError(f"rows and cols must give one block row and column per block ({nnzb}); "
                         f"got {len(rows)} and {len(cols)}")
    if blocks.dtype != B.dtype:
        raise DTypeError(f"blocks and B must have one dtype; they are {blocks.dtype} and {B.dtype}")
    N = B.shape[1]
    host = [np.asarray(x.cpu() if _is_torch(x) else x, dtype=np.int64) for x in (rows, cols)]
    for idx, what, limit in ((host[0], "row", M // bs), (host[1], "column", K // bs)):
        if nnzb and (idx.min() < 0 or idx.max() >= limit):
            raise ShapeError(f"a block {what} index is outside A's {limit} block {what}s")
    if _is_torch(B):
        import torch
        r, c = (torch.as_tensor(x, device=B.device) for x in host)
        C = torch.zeros(M // bs, bs, N, dtype=B.dtype, device=B.device)
        if nnzb:
            H = bmm(blocks.contiguous(), B.reshape(K // bs, bs, N)[c].contiguous(), algo=algo)
            C.index_add_(0, r, H)
        return C.reshape(M, N)
    C = np.zeros((M // bs, bs, N), dtype=B.dtype)
    if nnzb:
        H = bmm(np.ascontiguousarray(blocks), np.ascontiguousarray(B.reshape(K // bs, bs, N)[host[1]]),
                algo=algo)
        np.add.at(C, host[0], H)
    return C.reshape(M, N)
