"""Products whose A has structure, run as batches of small dense products (``lcmac.bmm``):

    C = lowrank_matmul(U, V, B)          # A = U·Vᵀ never formed: C = U·(Vᵀ·B)
    C = bsr_matmul(blocks, rows, cols, B, shape)   # A block-sparse (BSR), C = A·B
    C = bsr_matmul(prepare_bsr(blocks, rows, cols, shape), B)   # the same, indices done once
    c = bsr_spgemm(a, b)                 # A and B block-sparse: C block-sparse (SpGEMM)

**Low rank.**  U [..., M, r], V [..., K, r], B [..., K, N] (a leading batch dimension on all
three, or none): C = U·(Vᵀ·B) costs 2r(K + M)N flops against 2MKN for A·B, and
(U·Vᵀ)·B 2MKr + 2MKN; the cheaper order is taken (``lowrank_order``).  Without a batch,
"auto" and "vendor" call the vendor's matmul directly (what ``lcmac.bmm`` would pick).

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

**Prepared block-sparse A** (``a = prepare_bsr(blocks, rows, cols, shape)``, then
``bsr_matmul(a, B)``): the block indices checked, the CSR of the blocks built and put on the
blocks' device once; each call then does no index work and no host synchronisation (a CUDA
graph can capture it), on either path.  ``a`` keeps a reference to ``blocks``, not a copy:
values updated in place are seen by the next call (``PreparedBSR`` says how).

All take numpy arrays or torch tensors and ``algo`` as ``lcmac.bmm`` does (CUDA:
"gemm" for lcmac's batched kernel); the sums stay in the dtype of the operands.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from lcmac.api.bmm import bmm
from lcmac.api.call_args import AUTO, LOADED, VENDOR, target_for
from lcmac.policy.batched import BATCHED_WINS
from lcmac.core.errors import DTypeError, ShapeError, TargetError
from lcmac.core.operands import (
    check_one_dtype, check_same_device, check_same_kind, dtype_name, operand_kind)
from lcmac.spec.cuda.bsr import BSR_BLOCKS, bsr_shape_why
from lcmac.spec.cuda.dtypes import SUPPORTED_DTYPES
from lcmac.spec.precision import allows_tf32, torch_precision

__all__ = ["lowrank_matmul", "lowrank_order", "bsr_matmul", "prepare_bsr", "PreparedBSR", "BSR",
           "bsr_spgemm", "bsr_csr", "bsr_kernel", "fused_wins"]

#: ``bsr_matmul``'s algo for the fused CUDA kernel
FUSED = "fused"
#: the least batch for which ``lcmac.bmm(algo="auto")``'s rule takes lcmac's kernel: one
#: product (no batch) below it always goes to the vendor's
_AUTO_LEAST_BATCH = min(w[3] for w in BATCHED_WINS)


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
    M, r = U.shape[-2:]
    K, N = B.shape[-2:]
    if not batched and (algo == VENDOR or (algo == AUTO and _AUTO_LEAST_BATCH > 1)):
        # one product each: "auto" would take the vendor's anyway, so its matmul directly
        # (two lcmac.bmm calls held the host 48-83 µs against torch's 33-52 at rank 64 in
        # bf16 on an H200, where the GPU work is ~53 µs: docs/batched.md)
        return U @ (_t(V) @ B) if lowrank_order(M, K, N, r) == "U(VtB)" else (U @ _t(V)) @ B
    u, v, b = (x if batched else x[None] for x in (U, V, B))
    if lowrank_order(M, K, N, r) == "U(VtB)":
        C = bmm(u, bmm(_t(v), b, algo=algo), algo=algo)
    else:
        C = bmm(bmm(u, _t(v), algo=algo), b, algo=algo)
    return C if batched else C[0]


def bsr_matmul(blocks, rows, cols=None, B=None, shape=None, *, algo: str = "auto"):
    """C = A·B for a block-sparse A (module doc): ``bsr_matmul(blocks, rows, cols, B, shape)``
    or, A prepared once, ``bsr_matmul(prepared, B)``; ``algo`` "fused": the fused CUDA
    kernel, else as ``lcmac.bmm`` takes it for the batched path."""
    if isinstance(blocks, PreparedBSR):
        if cols is not None or B is not None or shape is not None:
            raise TypeError("bsr_matmul(prepared, B) takes the prepared A and B alone: the "
                            "indices and the shape are the prepared object's")
        return _prepared_matmul(blocks, rows, algo)
    if B is None or shape is None:
        raise TypeError("bsr_matmul takes (blocks, rows, cols, B, shape) or (prepare_bsr(...), B)")
    return _prepared_matmul(prepare_bsr(blocks, rows, cols, shape), B, algo)


class PreparedBSR:
    """A block-sparse A ready for ``bsr_matmul(a, B)`` (``prepare_bsr``): its indices checked
    and turned, once, into arrays on the blocks' device (numpy arrays for numpy blocks).

    ``blocks``   the blocks given, kept by reference (not copied)
    ``shape``    (M, K); ``bs`` the block size
    ``row_ptr``, ``col_idx``  the CSR of the blocks in block-row order (int32, ``bsr_csr``)
    ``order``    int64 positions that put ``blocks`` in that order (None: they are in it)
    ``rows``, ``cols``  each block's block row and column (int64, the blocks' own order)

    Values: in-place updates of ``blocks`` (an optimiser step, ``copy_``) are seen by the next
    call, on every path.  Blocks not in block-row order (``order`` not None) are gathered
    into it on the device at each fused call (nnzb·bs² elements read and written, no host
    work): give them sorted by block row to save that.  Indices and shape are fixed here:
    new ``rows``/``cols``, a new blocks tensor or other shapes need ``prepare_bsr`` again."""

    __slots__ = ("blocks", "shape", "bs", "row_ptr", "col_idx", "order", "rows", "cols")

    def __init__(self, blocks, shape, row_ptr, col_idx, order, rows, cols):
        self.blocks, self.shape, self.bs = blocks, shape, int(blocks.shape[1])
        self.row_ptr, self.col_idx, self.order = row_ptr, col_idx, order
        self.rows, self.cols = rows, cols

    def sorted_blocks(self):
        """The blocks in block-row order: ``blocks`` itself where they are in it."""
        if self.order is None:
            return self.blocks
        return self.blocks.index_select(0, self.order) if _is_torch(self.blocks) else self.blocks[self.order]

    def __repr__(self):
        M, K = self.shape
        where = getattr(self.blocks, "device", "numpy")
        return (f"<lcmac PreparedBSR {M}x{K}, {len(self.rows)} blocks of {self.bs}x{self.bs}, "
                f"{self.blocks.dtype} on {where}{'' if self.order is None else ', unsorted'}>")


def prepare_bsr(blocks, rows, cols, shape) -> PreparedBSR:
    """A block-sparse A (``blocks`` [nnzb, bs, bs], block row and column of each, ``shape``
    (M, K)) checked and made ready once for ``bsr_matmul(a, B)`` (``PreparedBSR``): one copy
    of the indices to the host (a wait for the GPU), one copy of the CSR arrays back."""
    # the checks and the CSR on the host, as every unprepared call does them (a build on the
    # GPU, without the round trip, is not written: once per A it has not mattered yet)
    M, K, bs, r, c = _checked_operand(blocks, rows, cols, shape, "A")
    order, row_ptr, col_idx = bsr_csr(r, c, M // bs)
    if not _is_torch(blocks):
        return PreparedBSR(blocks, (M, K), row_ptr, col_idx, order, r, c)
    import torch
    # one copy to the device: row_ptr, col_idx, rows, cols and the order, one after another
    parts = [row_ptr, col_idx, r, c] + ([order] if order is not None else [])
    idx = torch.from_numpy(np.concatenate([x.astype(np.int64) for x in parts])).to(blocks.device)
    ends = np.cumsum([len(x) for x in parts])
    rp, ci, rr, cc, *o = torch.tensor_split(idx, ends[:-1].tolist())
    return PreparedBSR(blocks, (M, K), rp.int(), ci.int(), o[0] if o else None, rr, cc)


def _check_b(a: PreparedBSR, B) -> None:
    """B against a prepared A: host checks only (no copy, no wait)."""
    K = a.shape[1]
    check_same_kind(a.blocks, B, names=("the blocks", "B"))
    if B.ndim != 2 or B.shape[0] != K:
        raise ShapeError(f"B must be [K={K}, N], got {tuple(B.shape)}")
    check_one_dtype(a.blocks, B, names=("the blocks", "B"))
    check_same_device(a.blocks, B, names=("the blocks", "B"))


def _prepared_matmul(a: PreparedBSR, B, algo: str):
    """C = A·B for a prepared A: the fused kernel or the batched path, no index work."""
    _check_b(a, B)
    (M, K), bs, N = a.shape, a.bs, B.shape[1]
    if _takes_fused(a.blocks, B, M, N, bs, algo):
        fn = bsr_kernel(target_for("cuda"), dtype_name(B), bs)
        return fn(a.sorted_blocks().contiguous(), B.contiguous(), a.row_ptr, a.col_idx, M)
    nnzb = len(a.rows)
    if _is_torch(B):
        import torch
        C = torch.zeros(M // bs, bs, N, dtype=B.dtype, device=B.device)
        if nnzb:
            H = bmm(a.blocks.contiguous(), B.reshape(K // bs, bs, N)[a.cols].contiguous(), algo=algo)
            C.index_add_(0, a.rows, H)
        return C.reshape(M, N)
    C = np.zeros((M // bs, bs, N), dtype=B.dtype)
    if nnzb:
        H = bmm(np.ascontiguousarray(a.blocks), np.ascontiguousarray(B.reshape(K // bs, bs, N)[a.cols]),
                algo=algo)
        np.add.at(C, a.rows, H)
    return C.reshape(M, N)


def _host_indices(rows, cols) -> tuple[np.ndarray, np.ndarray]:
    """``rows`` and ``cols`` as flat int64 numpy arrays, in one copy (one wait for the GPU)
    where both are integer tensors on one device; anything but integers is refused."""
    if _is_torch(rows) and _is_torch(cols) and rows.device == cols.device and rows.shape == cols.shape \
            and not any(x.is_floating_point() or x.is_complex() or str(x.dtype) == "torch.bool"
                        for x in (rows, cols)):
        import torch
        both = torch.stack((rows.long(), cols.long())).cpu().numpy()
        return both[0].reshape(-1), both[1].reshape(-1)
    out = []
    for x in (rows, cols):
        h = np.asarray(x.cpu() if _is_torch(x) else x)
        if h.size and h.dtype.kind not in "iu":
            raise DTypeError(f"block indices must be integers, not {h.dtype}")
        out.append(h.astype(np.int64).reshape(-1))
    return out[0], out[1]


def _checked_operand(blocks, rows, cols, shape, what: str):
    """The checks of a BSR operand (every call that takes one): (M, N, bs, rows, cols), the
    indices as host int64 arrays.  A block named twice is allowed (its products are summed)."""
    if blocks.ndim != 3 or blocks.shape[1] != blocks.shape[2]:
        raise ShapeError(f"{what}'s blocks must be [nnzb, bs, bs], got {tuple(blocks.shape)}")
    nnzb, bs = blocks.shape[0], blocks.shape[1]
    M, N = (int(d) for d in shape)
    if M % bs or N % bs:
        raise ShapeError(f"{what}'s shape {M}x{N} must be a multiple of the block size {bs}")
    r, c = _host_indices(rows, cols)
    if len(r) != nnzb or len(c) != nnzb:
        raise ShapeError(f"{what}'s rows and cols must give one block row and column per block "
                         f"({nnzb}); got {len(r)} and {len(c)}")
    for idx, kind, limit in ((r, "row", M // bs), (c, "column", N // bs)):
        if nnzb and (idx.min() < 0 or idx.max() >= limit):
            raise ShapeError(f"a block {kind} index of {what} is outside its {limit} block {kind}s")
    return M, N, bs, r, c


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
    float32 precision class, ``lcmac.spec.precision``; the batched path keeps float32
    products in float32 otherwise).  Measured
    on the H100 (docs/batched.md: A 8192×8192 at 1–20 % in 64- and 128-blocks, B 8192×4096),
    the whole call against the batched path, the fused kernel won for bf16 and for float32
    (TF32 both) at every density; fp16 takes bf16's rule untimed (the same kernel on the same tensor cores)."""
    return dtype in ("bfloat16", "float16") or (dtype == "float32" and tf32)


def _fused_why(B, M: int, N: int, bs: int) -> str | None:
    """Why the fused kernel cannot run this product (None: it can)."""
    if not _is_torch(B) or B.device.type != "cuda":
        return "it runs on CUDA tensors (the CPU path is the reference)"
    if target_for("cuda") != "cuda-sm90a":
        return f"it is built for Hopper (sm_90a), not {target_for('cuda')}"
    dt = dtype_name(B)
    if dt not in SUPPORTED_DTYPES:
        return f"it takes {SUPPORTED_DTYPES}, not {dt}"
    if bs not in BSR_BLOCKS:
        return f"it takes blocks of {BSR_BLOCKS}, not {bs}"
    return bsr_shape_why(M, B.shape[0], N, bs, dt)


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
    tf32 = B.dtype == torch.float32 and allows_tf32(torch_precision("cuda"))
    return fused_wins(dtype_name(B), tf32)


def bsr_kernel(target: str, dtype: str, bs: int, config: dict | None = None):
    """lcmac's fused block-sparse kernel for bs×bs blocks (any M, K, N, block count), from the
    kernel cache; ``config``: template options over the defaults (``bsr_tile_defaults``).
    The artifact's shape names its block (bs³)."""
    cfg = {"bsr": int(bs), **(config or {})}
    return LOADED.get(("bsr", target, dtype, int(bs), tuple(sorted(cfg.items()))),
                      ("gemm", target, dtype, (bs, bs, bs)), {"config": cfg})


class BSR(NamedTuple):
    """A block-sparse matrix: ``blocks`` [nnzb, bs, bs], block row and column of each
    (``rows``, ``cols``, integer arrays of nnzb), and the matrix's ``shape`` (multiples of bs)."""
    blocks: object
    rows: object
    cols: object
    shape: tuple

    def prepare(self) -> PreparedBSR:
        """``prepare_bsr`` of this matrix, for ``bsr_matmul(prepared, B)``."""
        return prepare_bsr(*self)

    def to_dense(self):
        """The dense matrix (for checks)."""
        M, N = (int(x) for x in self.shape)
        nb, bs = self.blocks.shape[0], self.blocks.shape[1]
        r, c = _host_indices(self.rows, self.cols)
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


def _checked_bsr(x: BSR, what: str) -> tuple[int, int, int, np.ndarray, np.ndarray]:
    """A SpGEMM operand: the checks of every BSR operand, and each block named once."""
    M, N, bs, r, c = _checked_operand(x.blocks, x.rows, x.cols, x.shape, what)
    if len(r) and len(np.unique(r * (N // bs) + c)) != len(r):
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
    check_same_kind(a.blocks, b.blocks)
    check_one_dtype(a.blocks, b.blocks)
    pa, pb, pc, cr, cc = spgemm_pairs(ar, ac, br, bc, N // bs)
    if _is_torch(a.blocks):
        import torch
        dev = a.blocks.device
        check_same_device(a.blocks, b.blocks, names=("A's blocks", "B's"), error=DTypeError)
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
