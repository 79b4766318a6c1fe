"""New algorithms from old ones: the tensor (Kronecker) product and the grid symmetries.

Symmetries use the trace form of the matrix-product tensor, Σ a_il · b_lj · c_ji, which is
invariant under cycling its three factors and under transposition.  Every result is exact
by construction; tests re-verify them with the Brent equations anyway.
"""
from __future__ import annotations

import numpy as np

from lcmac.ir.algorithm import Algorithm


def _per_rank_T(t: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(np.transpose(t, (0, 2, 1)))


def transpose(alg: Algorithm) -> Algorithm:
    """<m,k,n> → <n,k,m>, from Cᵀ = Bᵀ Aᵀ."""
    return Algorithm(alg.n, alg.k, alg.m, _per_rank_T(alg.V), _per_rank_T(alg.U),
                     _per_rank_T(alg.W), name=f"{alg.name}.T",
                     source=f"transpose of {alg.name}")


def rotate(alg: Algorithm) -> Algorithm:
    """<m,k,n> → <k,n,m>, by cycling the trace form (A, B, Cᵀ) → (B, Cᵀ, A)."""
    return Algorithm(alg.k, alg.n, alg.m, alg.V, _per_rank_T(alg.W), _per_rank_T(alg.U),
                     name=f"{alg.name}.rot", source=f"cyclic rotation of {alg.name}")


def orbit(alg: Algorithm) -> dict[tuple[int, int, int], Algorithm]:
    """One algorithm for each distinct grid among the six permutations reachable from ``alg``."""
    out: dict[tuple[int, int, int], Algorithm] = {}
    a = alg
    for _ in range(3):
        for b in (a, transpose(a)):
            out.setdefault(b.grid, b)
        a = rotate(a)
    return out


def for_grid(alg: Algorithm, grid: tuple[int, int, int]) -> Algorithm:
    """The symmetric image of ``alg`` whose grid is ``grid`` (e.g. <3,4,5> from <4,5,3>)."""
    o = orbit(alg)
    if tuple(grid) not in o:
        raise ValueError(f"grid {grid} is not a permutation of {alg.grid}")
    b = o[tuple(grid)]
    if b.grid == alg.grid:
        return alg
    m, k, n = grid
    return b.renamed(f"{alg.name}@{m}x{k}x{n}")


def _kron(t1: np.ndarray, t2: np.ndarray) -> np.ndarray:
    R1, a1, b1 = t1.shape
    R2, a2, b2 = t2.shape
    o = np.multiply.outer(t1, t2)            # R1 a1 b1 R2 a2 b2
    o = np.transpose(o, (0, 3, 1, 4, 2, 5))  # R1 R2 a1 a2 b1 b2
    return o.reshape(R1 * R2, a1 * a2, b1 * b2)


def compose(outer: Algorithm, inner: Algorithm) -> Algorithm:
    """The two-level algorithm: ``outer`` on blocks, ``inner`` inside each block product.

    Block index i = i_outer·m_inner + i_inner, so applying it to a matrix is exactly a
    recursion of ``outer`` whose block products use ``inner``.
    """
    return Algorithm(outer.m * inner.m, outer.k * inner.k, outer.n * inner.n,
                     _kron(outer.U, inner.U), _kron(outer.V, inner.V), _kron(outer.W, inner.W),
                     name=f"{outer.name}*{inner.name}",
                     source=f"tensor product of {outer.name} and {inner.name}")


def power(alg: Algorithm, levels: int) -> Algorithm:
    """``alg`` applied recursively ``levels`` times (levels=1 returns ``alg``)."""
    if levels < 1:
        raise ValueError(f"levels must be at least 1, got {levels}")
    out = alg
    for _ in range(levels - 1):
        out = compose(out, alg)
    return out
