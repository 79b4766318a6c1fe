"""Running a product of any shape a rule admits as calls of bucket kernels
(``lcmac.spec.shape_rules`` says how the shape is cut and what each cut costs).

``run_rows`` serves the rows rule (N and K those of the kernels): row panels of A and C are
slices, no copy; ``run_row_ranges`` the same rule with one kernel whose row count is a
run-time value (no padding); ``run_any`` serves the any-shape rule through N×K tiles copied into
buffers.  Both take ``kernel_for(bucket_shape)`` (the loaded kernel, or None where a vendor
GEMM should run that piece) and work on numpy arrays and torch tensors (CPU or CUDA)
alike, with no host synchronisation (CUDA-graph safe once the kernels are loaded).
"""
from __future__ import annotations

from lcmac.core.errors import ShapeError
from lcmac.core.operands import check_matrices, check_shape_is, dtype_name, operand_kind, shape_text
from lcmac.spec.shape_rules import RowPiece, row_pieces, tiles


def _is_torch(x) -> bool:
    return operand_kind(x) == "torch"


def zeros(like, shape, dtype=None):
    """A zeroed buffer on ``like``'s device (dtype: like's, or "float32")."""
    if _is_torch(like):
        import torch
        return torch.zeros(shape, dtype=torch.float32 if dtype else like.dtype, device=like.device)
    import numpy as np
    return np.zeros(shape, dtype=np.float32 if dtype else like.dtype)


def empty(like, shape):
    if _is_torch(like):
        import torch
        return torch.empty(shape, dtype=like.dtype, device=like.device)
    import numpy as np
    return np.empty(shape, dtype=like.dtype)


def assign(dst, src) -> None:
    """dst[...] = src (converting the dtype where they differ)."""
    if _is_torch(dst):
        dst.copy_(src)
    else:
        dst[...] = src


def _check(A, B, out, N: int | None, K: int | None):
    M, Nb, Ka = (int(d) for d in check_matrices(A, B, who="a kernel family"))
    if (N is not None and Nb != N) or (K is not None and Ka != K):
        raise ShapeError(f"this kernel family serves ?x{N}x{K} (any M, N={N}, K={K}); got "
                         f"{M}x{Nb}x{Ka}")
    if out is not None:
        check_shape_is(out, "out", (M, Nb), f"the product is {shape_text((M, Nb))}")
    return M, Nb, Ka


def run_rows(A, B, out, ladder, kernel_for, *, N: int, K: int, vendor=None, b_for=None):
    """C = A·B for A M×K (any M) with kernels of (P, N, K) for P in ``ladder``.  ``vendor(a,
    b, out=c)``: runs a piece whose ``kernel_for`` is None, and the rows under the smallest
    bucket (else they are padded).  ``b_for(fn, B)``: the B argument for kernel fn (a
    prepared form)."""
    M, _, _ = _check(A, B, out, N, K)
    C = out if out is not None else empty(A, (M, N))
    # adjacent pieces the vendor takes run as one call: one large GEMM is faster than its
    # pieces (docs/pytorch.md)
    vendor_from = None
    for p in row_pieces(M, ladder):
        # the vendor takes padded rows where there is one: their kernel is not even looked up
        fn = None if (p.padded and vendor is not None) else kernel_for((p.bucket, N, K))
        if fn is None:
            if vendor is None:
                raise ShapeError(f"no kernel for {p.bucket}x{N}x{K} and no vendor GEMM to run it")
            vendor_from = p.start if vendor_from is None else vendor_from
            continue
        if vendor_from is not None:
            vendor(A[vendor_from:p.start], B, out=C[vendor_from:p.start])
            vendor_from = None
        b = b_for(fn, B) if b_for is not None else B
        _run_piece(fn, A[p.start:p.start + p.rows], b, C[p.start:p.start + p.rows], p)
    if vendor_from is not None:
        vendor(A[vendor_from:M], B, out=C[vendor_from:M])
    return C


def run_row_ranges(A, B, out, fn, ranges, *, N: int, K: int, vendor=None, b_for=None):
    """C = A·B with ``fn`` a kernel whose row count is a run-time value (it takes any rows of
    A, ``lcmac.schedules.cuda.rows``): ``ranges`` [(rows, on_kernel)] cut A's rows in order,
    each run of adjacent ranges on the kernel as one call of ``fn`` on slices of A and C (no
    padding, no copy), the others by ``vendor(a, b, out=c)``, likewise one call per run.
    ``b_for(fn, B)``: the B argument for fn (a prepared form)."""
    M, _, _ = _check(A, B, out, N, K)
    C = out if out is not None else empty(A, (M, N))
    runs, start = [], 0
    for rows, on_kernel in ranges:
        if runs and runs[-1][2] == on_kernel:
            runs[-1][1] += rows
        else:
            runs.append([start, rows, on_kernel])
        start += rows
    if start != M:
        raise ShapeError(f"the row ranges cover {start} rows of A's {M}")
    for first, rows, on_kernel in runs:
        a, c = A[first:first + rows], C[first:first + rows]
        if on_kernel:
            fn(a, b_for(fn, B) if b_for is not None else B, out=c)
        elif vendor is None:
            raise ShapeError(f"rows {first}..{first + rows} go to the vendor GEMM, and there is none")
        else:
            vendor(a, B, out=c)
    return C


def _run_piece(fn, a, b, c, p: RowPiece) -> None:
    """One row piece; a padded one through zeroed buffers of the bucket's rows."""
    if not p.padded:
        fn(a, b, out=c)
        return
    a_pad = zeros(a, (p.bucket, a.shape[1]))
    a_pad[:p.rows] = a
    c_pad = fn(a_pad, b)
    c[...] = c_pad[:p.rows]


def run_any(A, B, out, ladder, tile, kernel_for):
    """C = A·B for any shape with kernels of (P, T_N, T_K), P in ``ladder``, ``tile`` =
    (T_N, T_K): tiles copied into buffers, the last of each dimension zero-padded, products
    added into C (in float32 for 16-bit dtypes, rounded once)."""
    M, N, K = _check(A, B, out, None, None)
    tn, tk = (int(t) for t in tile)
    C = out if out is not None else empty(A, (M, N))
    k_tiles = tiles(K, tk)
    wide = len(k_tiles) > 1 and dtype_name(A) in ("bfloat16", "float16")
    acc = zeros(A, (M, N), dtype="float32") if wide else C
    pieces = row_pieces(M, ladder)
    b_buf = zeros(B, (tk, tn))
    a_bufs = {}
    for n0, nw in tiles(N, tn):
        for ki, (k0, kw) in enumerate(k_tiles):
            if (kw, nw) != (tk, tn):
                b_buf[...] = 0
            b_buf[:kw, :nw] = B[k0:k0 + kw, n0:n0 + nw]
            for p in pieces:
                a_buf = a_bufs.get(p.bucket)
                if a_buf is None:
                    a_buf = a_bufs[p.bucket] = zeros(A, (p.bucket, tk))
                if p.padded or kw < tk:
                    a_buf[...] = 0
                a_buf[:p.rows, :kw] = A[p.start:p.start + p.rows, k0:k0 + kw]
                part = kernel_for((p.bucket, tn, tk))(a_buf, b_buf)[:p.rows, :nw]
                dst = acc[p.start:p.start + p.rows, n0:n0 + nw]
                if ki == 0:
                    assign(dst, part)
                else:
                    dst += part
    if wide:
        assign(C, acc)
    return C
