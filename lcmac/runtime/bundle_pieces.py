"""Running a product of any shape on a bundle's piece kernels (``lcmac.spec.shape_rules``:
``plan_pieces`` says how a shape is cut, and why).

A piece kernel (P_M, P_N, P_K) takes views of A, B and C with a row stride (in
``lcmac-bundle/3`` up to P_M rows of A and C and up to P_K columns of A and rows of B, their
counts run-time values) and either writes C or adds into it (``lcmac.schedules.cpu_lcma``,
``piece``), so each piece is three slices of the caller's arrays: no tile is copied.  The
pieces of one C block run K span by K span,
the first writing and the others adding, so a block that overlaps another (an overlapping M
or N span) is written whole again with the same sums.  The one copy: a K span that overlaps
its predecessor reads the rows of B (or the columns of A, whichever is smaller) from a copy
in which the overlapped ones are zero.  A product the plan gives to the vendor GEMM (small,
or thin in a dimension) runs on ``numpy.matmul`` or ``torch.matmul``.
"""
from __future__ import annotations

from lcmac.core.operands import (
    check_array, check_device_type, check_dtype_is, check_matrices, check_no_overlap, check_out,
    operand_kind, row_major)
from lcmac.runtime.tiled import empty, zeros
from lcmac.spec.shape_rules import PiecePlan, plan_pieces


def _matmul(a, b):
    if operand_kind(a) == "torch":
        import torch
        return torch.matmul(a, b)
    import numpy as np
    return np.matmul(a, b)


def _masked_operands(A, B, plan: PiecePlan) -> dict:
    """For each K span that overlaps its predecessor: (A's columns, B's rows) of that span,
    one of them a copy whose overlapped part is zero (A's where fewer rows than B has
    columns are covered), the other a view."""
    rows, cols = A.shape[0], B.shape[1]
    out = {}
    for k in plan.K:
        if not k.overlap:
            continue
        a, b = A[:rows, k.start:k.start + k.size], B[k.start:k.start + k.size, :cols]
        if rows <= cols:
            copy = zeros(A, (rows, k.size))
            copy[:, k.overlap:] = a[:, k.overlap:]
            out[k] = (copy, b)
        else:
            copy = zeros(B, (k.size, cols))
            copy[k.overlap:] = b[k.overlap:]
            out[k] = (a, copy)
    return out


def run_pieces(A, B, out, ladders, kernel_for, *, dtype: str, who: str = "the bundle"):
    """C = A·B for any M×N×K with the piece kernels of ``ladders`` ({"M", "N", "K"}: each a
    ladder; "run_time": kernels of run-time rows and depth, ``plan_pieces``);
    ``kernel_for((P_M, P_N, P_K))``: the loaded piece kernel.  A and B: CPU arrays
    of ``dtype`` (copied row-major first where their rows are not); ``out``: a contiguous
    M×N array, or None."""
    M, N, K = (int(d) for d in check_matrices(A, B, who=who))
    for what, x in (("A", A), ("B", B)):
        check_array(x, what)
        check_device_type(x, what, "cpu", f"{who} runs on the CPU")
        check_dtype_is(x, what, dtype, who)
    if out is not None:
        check_out(out, A, (M, N))
        check_no_overlap(out, (("A", A), ("B", B)))
    A, B = row_major(A), row_major(B)
    C = empty(A, (M, N)) if out is None else out
    plan = plan_pieces(M, N, K, ladders)
    if plan.vendor:
        C[...] = _matmul(A, B)
        return C
    masked = _masked_operands(A, B, plan)
    for m in plan.M:
        rows = slice(m.start, m.start + m.size)
        for n in plan.N:
            cols = slice(n.start, n.start + n.size)
            c = C[rows, cols]
            for i, k in enumerate(plan.K):
                if k in masked:
                    a, b = masked[k]
                    a, b = a[rows], b[:, cols]
                else:
                    a, b = A[rows, k.start:k.start + k.size], B[k.start:k.start + k.size, cols]
                # the raw entry point: the operands were checked once, above
                kernel_for((m.piece, n.piece, k.piece))._f(a, b, c, 1 if i else 0)
    return C
