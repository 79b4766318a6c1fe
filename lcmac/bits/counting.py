"""The Boolean product through exact integer counts: C_ij = OR_l (A_il AND B_lj) is
``(A·B)_ij > 0`` with A·B over the integers, and an LCMA computes that integer product exactly
where its arithmetic does.  The Boolean semiring itself has no subtraction, so an LCMA cannot
run over it; over the integers it can.

The counts run in float64 through the reference executor (``lcmac.ir.executor.run_unfused``:
the combines, R block products by BLAS, Combine H).  They are exact when every value the
scheme forms is an integer multiple of the coefficients' common denominator below 2⁵³:

    |values| ≤ (K/k)·su·sv·sw,   su = max_r Σ|U_r|, sv = max_r Σ|V_r|, sw = max_ij Σ_r |W_rij|

and the denominators are powers of two (binary fractions are exact in float64).  A scheme or
a size outside that bound is refused by name.
"""
from __future__ import annotations

from fractions import Fraction

import numpy as np

from lcmac.core.errors import AlgorithmError, ShapeError
from lcmac.ir.algorithm import Algorithm
from lcmac.ir.catalogue import get
from lcmac.ir.executor import run_unfused

#: float64 integers are exact below this
EXACT_LIMIT = 2 ** 53


def _denominator(t) -> int:
    d = 1
    for x in np.asarray(t, dtype=object).flat:
        q = Fraction(x).denominator
        d = d * q // np.gcd(d, q)
    return d


def exactness_bound(alg: Algorithm, K: int) -> int:
    """The largest integer (scaled by the common denominator) the counts can form for an
    inner dimension K; AlgorithmError if the coefficients are not binary fractions."""
    den = 1
    for t in (alg.U, alg.V, alg.W):
        d = _denominator(t)
        if d & (d - 1):
            raise AlgorithmError(f"{alg.name}: coefficients with denominator {d} are not exact in "
                                 f"binary floating point; the Boolean product through counts "
                                 f"needs integer or binary-fraction coefficients")
        den *= d
    absf = lambda t: np.abs(np.asarray(t, dtype=object))          # noqa: E731
    su = max(sum(absf(alg.U)[r].flat) for r in range(alg.R))
    sv = max(sum(absf(alg.V)[r].flat) for r in range(alg.R))
    sw = max(sum(absf(alg.W)[:, i, j]) for i in range(alg.m) for j in range(alg.n))
    blocks = -(-K // alg.k)
    return int(Fraction(blocks) * Fraction(su) * Fraction(sv) * Fraction(sw) * den) + 1


def boolean_by_counts(A: np.ndarray, B: np.ndarray, algo) -> np.ndarray:
    """``(A·B > 0)`` as uint8 for 0/1 matrices A and B, the integer product by ``algo`` (a
    catalogue name or an ``Algorithm`` over the rationals)."""
    alg = get(algo) if isinstance(algo, str) else algo
    if not isinstance(alg, Algorithm):
        raise AlgorithmError(f"{algo!r} is not a scheme over the integers or rationals (a "
                             f"GF(2)-only scheme cannot count)")
    K = A.shape[1]
    bound = exactness_bound(alg, K)
    if bound >= EXACT_LIMIT:
        raise ShapeError(f"{alg.name} at K={K} can form values up to {bound}, beyond float64's "
                         f"exact integers (2^53): use the Four Russians kernel (algo='m4r')")
    C = run_unfused(alg, A.astype(np.float64), B.astype(np.float64))
    return (C > 0.5).astype(np.uint8)
