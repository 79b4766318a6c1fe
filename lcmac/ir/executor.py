"""Reference executors in numpy: the oracle every backend is checked against.

``run_unfused`` is FalconGEMM's Algorithm 1 (Combine A, Combine B, R block GEMMs, Combine H,
each stage materialised).  ``run_fused`` is Algorithm 2's order: one task per output tile
position (x, z) computes the group of R products H_r[x, z] and accumulates each straight into
the C blocks it feeds, so H is never stored.

Shapes the grid does not divide are **padded** with zeros to the next multiple of (m, k, n)
and the result cropped: padding is exact (zero rows/columns add nothing) and keeps the oracle
one code path.  Native backends may peel instead; the oracle does not care how.
"""
from __future__ import annotations

import numpy as np

from lcmac.core.errors import DTypeError
from lcmac.core.operands import check_matrices
from lcmac.ir.algorithm import Algorithm


def _acc_dtype(dtype: np.dtype) -> np.dtype:
    dtype = np.dtype(dtype)
    if dtype == np.float64:
        return np.dtype(np.float64)
    if dtype.kind == "f" or dtype.name in ("bfloat16",) or "float8" in dtype.name:
        return np.dtype(np.float32)   # low precision in, fp32 accumulate (as the kernels do)
    if dtype.kind in "iu":
        return np.dtype(np.int64)
    if dtype.kind == "c":
        return np.dtype(np.complex128)
    raise DTypeError(f"dtype {dtype} is not supported by the reference executor")


def _pad_to(X: np.ndarray, r: int, c: int) -> np.ndarray:
    pr, pc = (-X.shape[0]) % r, (-X.shape[1]) % c
    return np.pad(X, ((0, pr), (0, pc))) if (pr or pc) else X


def _blocks(X: np.ndarray, p: int, q: int) -> np.ndarray:
    """X (P·bp x Q·bq) → view [p][q][bp][bq]."""
    bp, bq = X.shape[0] // p, X.shape[1] // q
    return X.reshape(p, bp, q, bq).transpose(0, 2, 1, 3)


def _prepare(alg: Algorithm, A, B):
    A = np.asarray(A)
    B = np.asarray(B)
    check_matrices(A, B)
    acc = _acc_dtype(np.result_type(A.dtype, B.dtype))
    M, K = A.shape
    N = B.shape[1]
    Ap = _pad_to(A.astype(acc, copy=False), alg.m, alg.k)
    Bp = _pad_to(B.astype(acc, copy=False), alg.k, alg.n)
    U, V, W = (t.astype(acc) for t in alg.as_float(np.float64))
    return A, B, M, N, K, acc, Ap, Bp, U, V, W


def run_unfused(alg: Algorithm, A, B) -> np.ndarray:
    """Algorithm 1: four materialised stages. Returns C = A·B in the accumulation dtype."""
    A, B, M, N, K, acc, Ap, Bp, U, V, W = _prepare(alg, A, B)
    Ab, Bb = _blocks(Ap, alg.m, alg.k), _blocks(Bp, alg.k, alg.n)
    At = np.einsum("ril,ilxy->rxy", U, Ab)            # Combine A
    Bt = np.einsum("rlj,ljyz->ryz", V, Bb)            # Combine B
    H = np.matmul(At, Bt)                              # GEMM stage (R products)
    Cb = np.einsum("rij,rxz->ijxz", W, H)             # Combine H
    C = Cb.transpose(0, 2, 1, 3).reshape(Ap.shape[0], Bp.shape[1])
    return np.ascontiguousarray(C[:M, :N])


def run_fused(alg: Algorithm, A, B, tile: tuple[int, int] = (64, 64)) -> np.ndarray:
    """Algorithm 2 order: per output tile position, the group of R products, fused Combine H."""
    A, B, M, N, K, acc, Ap, Bp, U, V, W = _prepare(alg, A, B)
    Ab, Bb = _blocks(Ap, alg.m, alg.k), _blocks(Bp, alg.k, alg.n)
    bm, bn = Ab.shape[2], Bb.shape[3]
    Cb = np.zeros((alg.m, alg.n, bm, bn), dtype=acc)
    At = np.einsum("ril,ilxy->rxy", U, Ab)            # group-parallel Combine A
    Bt = np.einsum("rlj,ljyz->ryz", V, Bb)            # group-parallel Combine B
    tx, tz = tile
    for x in range(0, bm, tx):
        for z in range(0, bn, tz):
            for r in range(alg.R):                     # the group of tile position (x, z)
                h = At[r, x:x + tx] @ Bt[r, :, z:z + tz]   # stays "on chip"
                for i, j in zip(*np.nonzero(W[r])):
                    Cb[i, j, x:x + tx, z:z + tz] += W[r, i, j] * h
    C = Cb.transpose(0, 2, 1, 3).reshape(Ap.shape[0], Bp.shape[1])
    return np.ascontiguousarray(C[:M, :N])


def reference_matmul(A, B) -> np.ndarray:
    """The float64 ground truth every kernel is compared with."""
    A = np.asarray(A)
    B = np.asarray(B)
    check_matrices(A, B)
    return A.astype(np.float64) @ B.astype(np.float64)
