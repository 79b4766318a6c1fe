"""Products whose A has structure, run as batches of small dense products (``lcmac.bmm``):

    C = lowrank_matmul(U, V, B)          # A = U·Vᵀ never formed: C = U·(Vᵀ·B)
    C = bsr_matmul(blocks, rows, cols, B, shape)   # A block-sparse (BSR), C = A·B
    c = bsr_spgemm(a, b)                 # A and B block-sparse: C block-sparse (SpGEMM)

**Low rank.**  U [..., M, r], V [..., K, r], B [..., K, N] (a leading batch dimension on all
three, or none): C = U·(Vᵀ·B) costs 2r(K + M)N flops against 2MKN for A·B, and
(U·Vᵀ)·B 2MKr + 2MKN; the cheaper order is taken (``lowrank_order``).

**Block-sparse A** (BSR: the nonzero bs×bs blocks ``blocks`` [nnzb, bs, bs], block row
``rows[i]`` and block column ``cols[i]`` of each, A of ``shape`` = (M, K), both multiples
of bs) times a dense B [K, N]: every nonzero block meets its row panel of B,
``H[i] = blocks[i]·B[cols[i]]`` — one batched product of nnzb bs×bs by bs×N — and the
products are summed into C's block rows (``index_add``; ``np.add.at`` on numpy).  The
gathered B panels take nnzb·bs·N elements of memory.

**Block-sparse A and B** (SpGEMM): each operand a ``BSR`` (blocks, block rows, block
columns, shape).  The symbolic phase, on the host, joins A's block columns with B's block
rows: every pair (A block (i, k), B block (k, j)) is one bs×bs product, all of them one
batched product; the pairs that meet in C block (i, j) are summed (``index_add``), and C
comes back as a BSR with its blocks in row-major order (only the blocks some pair reaches;
a block may hold zeros by cancellation).  The pairs take npairs·bs² elements of memory.

**Block-sparse A, fused** (``bsr_matmul(..., algo="fused")``, CUDA on Hopper): one kernel
(``schedules.cuda.bsr``) with a CTA per (block row, column tile of C) that walks the row's
blocks (a CSR of the blocks, ``bsr_csr``), sums their products in fp32 registers and writes
its C tile once: no gathered panels, no products in memory.  bf16 and fp16; float32 as TF32.
"auto" takes it where ``fused_wins`` says it was measured to win.

All take numpy arrays or torch tensors and ``algo`` as ``lcmac.bmm`` does (CUDA:
"gemm" for lcmac's batched kernel); the sums stay in the dtype of the operands.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .batched import bmm
from .call_args import LOADED, operand_kind, target_for
from .dtypes import ITEMSIZE
from .errors import DTypeError, ShapeError, TargetError
from .schedules.cuda.config import BSR_BLOCKS, SUPPORTED_DTYPES

__all__ = ["lowrank_matmul", "lowrank_order", "bsr_matmul", "BSR", "bsr_spgemm", "bsr_csr",
           "bsr_kernel", "fused_wins"]

#: ``bsr_matmul``'s algo for the fused CUDA kernel
FUSED = "fused"


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
    """C = A·B for a block-sparse A given by its nonzero blocks (module doc); ``algo``
    "fused": the fused CUDA kernel, else as ``lcmac.bmm`` takes it for the batched path."""
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
    host = _host_indices(rows, cols)
    for idx, what, limit in ((host[0], "row", M // bs), (host[1], "column", K // bs)):
        if nnzb and (idx.min() < 0 or idx.max() >= limit):
            raise ShapeError(f"a block {what} index is outside A's {limit} block {what}s")
    if _takes_fused(blocks, B, M, N, bs, algo):
        return _fused_bsr(blocks, host, B, M, bs)
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


def _host_indices(rows, cols) -> list:
    """``rows`` and ``cols`` as int64 numpy arrays, in one copy (one wait for the GPU) where both
    are tensors on one device."""
    if _is_torch(rows) and _is_torch(cols) and rows.device == cols.device and rows.shape == cols.shape:
        import torch
        return list(torch.stack((rows.long(), cols.long())).cpu().numpy())
    return [np.asarray(x.cpu() if _is_torch(x) else x, dtype=np.int64) for x in (rows, cols)]


def bsr_csr(rows, cols, block_rows: int):
    """The CSR of a BSR's blocks: (order, row_ptr, col_idx), ``order`` the blocks' stable
    order by block row (None where they are in it already), ``row_ptr`` [block_rows + 1]
    (block row i's blocks are positions row_ptr[i]:row_ptr[i+1] of that order) and
    ``col_idx`` their block columns, both int32; ``rows``, ``cols`` integer arrays."""
    rows, cols = np.asarray(rows, dtype=np.int64), np.asarray(cols, dtype=np.int64)
    order = None if np.all(rows[1:] >= rows[:-1]) else np.argsort(rows, kind="stable")
    if order is not None:
        rows, cols = rows[order], cols[order]
    row_ptr = np.zeros(block_rows + 1, dtype=np.int32)
    row_ptr[1:] = np.cumsum(np.bincount(rows, minlength=block_rows))
    return order, row_ptr, cols.astype(np.int32)


def fused_wins(dtype: str, tf32: bool = False) -> bool:
    """``bsr_matmul(algo="auto")``'s rule on a Hopper GPU, for a product the fused kernel
    takes: bf16 and fp16 always, float32 where the caller lets it run as TF32 (torch's
    ``allow_tf32``; the batched path keeps float32 products in float32 otherwise).  Measured
    on the H100 (docs/batched.md: A 8192×8192 at 1–20 % in 64- and 128-blocks, B 8192×4096),
    the whole call against the batched path: bf16 1.6–14×, float32 (TF32 both) 1.8–6.7×;
    fp16 takes bf16's rule untimed (the same kernel on the same tensor cores)."""
    return dtype in ("bfloat16", "float16") or (dtype == "float32" and tf32)


def _fused_why(B, M: int, N: int, bs: int) -> str | None:
    """Why the fused kernel cannot run this product (None: it can)."""
    if not _is_torch(B) or B.device.type != "cuda":
        return "it runs on CUDA tensors (the CPU path is the reference)"
    if target_for("cuda") != "cuda-sm90a":
        return f"it is built for Hopper (sm_90a), not {target_for('cuda')}"
    dt = str(B.dtype).replace("torch.", "")
    if dt not in SUPPORTED_DTYPES:
        return f"it takes {SUPPORTED_DTYPES}, not {dt}"
    if bs not in BSR_BLOCKS:
        return f"it takes blocks of {BSR_BLOCKS}, not {bs}"
    vec = 16 // ITEMSIZE[dt]
    if N % vec:
        return f"N must be a multiple of {vec} for {dt} (B's rows in 16 bytes), not {N}"
    if M * N >= 2**31:
        return f"C's {M}x{N} elements must be fewer than 2^31 (32-bit indices)"
    return None


def _no_grad_why(blocks, B) -> str | None:
    """The fused kernel records no gradient: why it may not run (None: nothing asks for one)."""
    import torch
    if torch.is_grad_enabled() and (getattr(blocks, "requires_grad", False) or B.requires_grad):
        return "it records no gradient and the blocks or B require grad (the batched path does)"
    return None


def _takes_fused(blocks, B, M: int, N: int, bs: int, algo: str) -> bool:
    """Whether ``bsr_matmul`` runs the fused kernel: ``algo`` "fused" (refused, with the
    reason, where it cannot run) or "auto" where ``fused_wins``."""
    if algo not in ("auto", FUSED):
        return False
    why = _fused_why(B, M, N, bs) or _no_grad_why(blocks, B)
    if why is not None:
        if algo == FUSED:
            raise TargetError(f"bsr_matmul(algo='fused'): {why}; algo='auto' or 'gemm' runs the "
                              "batched path")
        return False
    if algo == FUSED:
        return True
    import torch
    tf32 = B.dtype == torch.float32 and bool(torch.backends.cuda.matmul.allow_tf32)
    return fused_wins(str(B.dtype).replace("torch.", ""), tf32)


def bsr_kernel(target: str, dtype: str, bs: int, config: dict | None = None):
    """lcmac's fused block-sparse kernel for bs×bs blocks (any M, K, N, block count), from the
    kernel cache; ``config``: template options over the defaults (``bsr_tile_defaults``).
    The artifact's shape names its block (bs³)."""
    cfg = {"bsr": int(bs), **(config or {})}
    return LOADED.get(("bsr", target, dtype, int(bs), tuple(sorted(cfg.items()))),
                      ("gemm", target, dtype, (bs, bs, bs)), {"config": cfg})


def _fused_bsr(blocks, host, B, M: int, bs: int):
    """C = A·B by the fused kernel: the blocks put in block-row order where they are not,
    the CSR arrays sent to the GPU in one copy."""
    import torch
    order, row_ptr, col_idx = bsr_csr(host[0], host[1], M // bs)
    dev = B.device
    if blocks.device != dev:
        raise TargetError(f"the blocks are on {blocks.device}, B on {dev}")
    idx = np.concatenate([row_ptr, col_idx] + ([order.astype(np.int32)] if order is not None else []))
    idx = torch.from_numpy(idx).to(dev)
    nr, nb = len(row_ptr), len(col_idx)
    if order is not None:
        blocks = blocks[idx[nr + nb:]]
    dt = str(B.dtype).replace("torch.", "")
    fn = bsr_kernel(target_for("cuda"), dt, bs)
    return fn(blocks.contiguous(), B.contiguous(), idx[:nr], idx[nr:nr + nb], M)


class BSR(NamedTuple):
    """A block-sparse matrix: ``blocks`` [nnzb, bs, bs], block row and column of each
    (``rows``, ``cols``, integer arrays of nnzb), and the matrix's ``shape`` (multiples of bs)."""
    blocks: object
    rows: object
    cols: object
    shape: tuple

    def to_dense(self):
        """The dense matrix (for checks)."""
        M, N = (int(x) for x in self.shape)
        nb, bs = self.blocks.shape[0], self.blocks.shape[1]
        r, c = (_host_index(x) for x in (self.rows, self.cols))
        if _is_torch(self.blocks):
            import torch
            D = torch.zeros(M // bs, N // bs, bs, bs, dtype=self.blocks.dtype, device=self.blocks.device)
            if nb:
                D[torch.as_tensor(r, device=D.device), torch.as_tensor(c, device=D.device)] = self.blocks
            return D.permute(0, 2, 1, 3).reshape(M, N)
        D = np.zeros((M // bs, N // bs, bs, bs), dtype=self.blocks.dtype)
        if nb:
            D[r, c] = self.blocks
        return D.transpose(0, 2, 1, 3).reshape(M, N)


def _host_index(x) -> np.ndarray:
    a = np.asarray(x.cpu() if _is_torch(x) else x)
    if a.size and a.dtype.kind not in "iu":
        raise DTypeError(f"block indices must be integers, not {a.dtype}")
    return a.astype(np.int64).reshape(-1)


def _checked_bsr(x: BSR, what: str) -> tuple[int, int, int, np.ndarray, np.ndarray]:
    blocks = x.blocks
    if blocks.ndim != 3 or blocks.shape[1] != blocks.shape[2]:
        raise ShapeError(f"{what}.blocks must be [nnzb, bs, bs], got {tuple(blocks.shape)}")
    nnzb, bs = blocks.shape[0], blocks.shape[1]
    M, N = (int(d) for d in x.shape)
    if M % bs or N % bs:
        raise ShapeError(f"{what}'s shape {M}x{N} must be a multiple of its block size {bs}")
    r, c = _host_index(x.rows), _host_index(x.cols)
    if len(r) != nnzb or len(c) != nnzb:
        raise ShapeError(f"{what}.rows and .cols must give one block row and column per block "
                         f"({nnzb}); got {len(r)} and {len(c)}")
    for idx, kind, limit in ((r, "row", M // bs), (c, "column", N // bs)):
        if nnzb and (idx.min() < 0 or idx.max() >= limit):
            raise ShapeError(f"a block {kind} index of {what} is outside its {limit} block {kind}s")
    if nnzb and len(np.unique(r * (N // bs) + c)) != nnzb:
        raise ShapeError(f"{what} names a block twice (one entry per nonzero block)")
    return M, N, bs, r, c


def spgemm_pairs(a_rows, a_cols, b_rows, b_cols, n_block_cols: int):
    """The symbolic phase: (A block index, B block index, C block index) of every product,
    and C's (block row, block column) in row-major order."""
    order = np.argsort(b_rows, kind="stable")             # B's blocks grouped by block row
    k_max = int(max(a_cols.max(initial=-1), b_rows.max(initial=-1))) + 1
    count = np.bincount(b_rows, minlength=k_max)
    start = np.concatenate(([0], np.cumsum(count)[:-1]))
    per_a = count[a_cols]                                 # B blocks each A block meets
    pa = np.repeat(np.arange(len(a_cols)), per_a)
    within = np.arange(len(pa)) - np.repeat(np.cumsum(per_a) - per_a, per_a)
    pb = order[start[a_cols[pa]] + within]
    key = a_rows[pa] * n_block_cols + b_cols[pb]
    c_keys, pc = np.unique(key, return_inverse=True)      # sorted: row-major C blocks
    return pa, pb, pc.reshape(-1), c_keys // n_block_cols, c_keys % n_block_cols


def bsr_spgemm(a: BSR, b: BSR, *, algo: str = "auto") -> BSR:
    """C = A·B for block-sparse A and B (module doc), as a BSR."""
    a, b = BSR(*a), BSR(*b)
    M, K, bs, ar, ac = _checked_bsr(a, "A")
    K2, N, bs2, br, bc = _checked_bsr(b, "B")
    if K != K2 or bs != bs2:
        raise ShapeError(f"A is {M}x{K} in {bs}-blocks and B {K2}x{N} in {bs2}-blocks: the inner "
                         "dimensions and the block sizes must agree")
    if _is_torch(a.blocks) != _is_torch(b.blocks):
        raise DTypeError("A and B must both be numpy arrays or both torch tensors")
    if a.blocks.dtype != b.blocks.dtype:
        raise DTypeError(f"A and B must have one dtype; they are {a.blocks.dtype} and {b.blocks.dtype}")
    pa, pb, pc, cr, cc = spgemm_pairs(ar, ac, br, bc, N // bs)
    if _is_torch(a.blocks):
        import torch
        dev = a.blocks.device
        if b.blocks.device != dev:
            raise DTypeError(f"A's blocks are on {dev}, B's on {b.blocks.device}")
        C = torch.zeros(len(cr), bs, bs, dtype=a.blocks.dtype, device=dev)
        if len(pa):
            t = lambda x: torch.as_tensor(x, device=dev)  # noqa: E731
            H = bmm(a.blocks[t(pa)].contiguous(), b.blocks[t(pb)].contiguous(), algo=algo)
            C.index_add_(0, t(pc), H)
        return BSR(C, torch.as_tensor(cr, device=dev), torch.as_tensor(cc, device=dev), (M, N))
    C = np.zeros((len(cr), bs, bs), dtype=a.blocks.dtype)
    if len(pa):
        H = bmm(np.ascontiguousarray(a.blocks[pa]), np.ascontiguousarray(b.blocks[pb]), algo=algo)
        np.add.at(C, pc, H)
    return BSR(C, cr, cc, (M, N))
