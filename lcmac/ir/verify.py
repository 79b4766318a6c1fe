"""Exact verification of an algorithm against the Brent equations.

For every A-entry (i,l), B-entry (l',j) and C-entry (i',j'):

    Σ_r U[r,i,l] · V[r,l',j] · W[r,i',j']  =  δ(l,l') δ(i,i') δ(j,j')

i.e. the coefficient of a_il·b_l'j in c_i'j' must be 1 for a real product term and 0
otherwise.  Arithmetic is exact: rationals are scaled to integers by their common
denominators, and the sum is taken in Python integers (no overflow, no rounding).
"""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from math import lcm

import numpy as np

from lcmac.core.errors import VerificationError
from lcmac.ir.algorithm import Algorithm


@dataclass(frozen=True)
class BrentFailure:
    a: tuple[int, int]      # (i, l)   A block
    b: tuple[int, int]      # (l', j)  B block
    c: tuple[int, int]      # (i', j') C block
    got: Fraction
    expected: int

    def __str__(self):
        (i, l), (lp, j), (ip, jp) = self.a, self.b, self.c
        return (f"Brent equation for A[{i}][{l}]·B[{lp}][{j}] in C[{ip}][{jp}]: "
                f"Σ_r U[r,{i},{l}]·V[r,{lp},{j}]·W[r,{ip},{jp}] = {self.got}, expected {self.expected}")


def _scaled_int(t: np.ndarray) -> tuple[np.ndarray, int]:
    den = 1
    for x in t.flat:
        if isinstance(x, Fraction):
            den = lcm(den, x.denominator)
    ints = np.array([int(x * den) for x in t.flat], dtype=object).reshape(t.shape)
    return ints, den


def brent_failures(alg: Algorithm, limit: int | None = None) -> list[BrentFailure]:
    """All failing Brent equations (at most ``limit``), empty when the algorithm is exact."""
    U, du = _scaled_int(alg.U)
    V, dv = _scaled_int(alg.V)
    W, dw = _scaled_int(alg.W)
    scale = du * dv * dw
    m, k, n, R = alg.m, alg.k, alg.n, alg.R
    # int64 is exact while every partial sum stays far below 2**63; check the bound first.
    bound = (max((abs(x) for x in U.flat), default=0) * max((abs(x) for x in V.flat), default=0)
             * max((abs(x) for x in W.flat), default=0) * R)
    if bound < 2 ** 62:
        T = np.einsum("ra,rb,rc->abc", U.reshape(R, -1).astype(np.int64),
                      V.reshape(R, -1).astype(np.int64), W.reshape(R, -1).astype(np.int64))
    else:  # pragma: no cover - only for pathological coefficients
        T = np.einsum("ra,rb,rc->abc", U.reshape(R, -1), V.reshape(R, -1), W.reshape(R, -1))
    T = T.reshape(m, k, k, n, m, n)  # [i,l, l',j, i',j']
    E = np.zeros_like(T)
    for i in range(m):
        for l in range(k):
            for j in range(n):
                E[i, l, l, j, i, j] = scale
    bad = np.argwhere(T != E)
    out = []
    for idx in bad[: limit if limit is not None else len(bad)]:
        i, l, lp, j, ip, jp = (int(x) for x in idx)
        out.append(BrentFailure((i, l), (lp, j), (ip, jp), Fraction(int(T[tuple(idx)]), scale),
                                int(E[tuple(idx)] != 0)))
    return out


def is_exact(alg: Algorithm) -> bool:
    return not brent_failures(alg, limit=1)


def verify(alg: Algorithm) -> Algorithm:
    """Return ``alg`` unchanged if it computes C = A·B exactly; raise naming the failing equation."""
    fails = brent_failures(alg, limit=4)
    if fails:
        total = len(brent_failures(alg))
        more = f" (and {total - 1} more failing equation(s))" if total > 1 else ""
        raise VerificationError(f"{alg.name} <{alg.m},{alg.k},{alg.n};{alg.R}> is not a correct "
                                f"matrix product: {fails[0]}{more}")
    return alg
