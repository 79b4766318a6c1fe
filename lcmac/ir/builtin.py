"""The classical schemes, written the way papers print them.

Each product is "(A-combination) * (B-combination)" and each C block a combination of the
products, with 1-based block names (A11, B21, M3 …).  The parser below turns that into
U, V, W; the catalogue verifies the result exactly before anyone can use it.
"""
from __future__ import annotations

import re

import numpy as np

from lcmac.ir.algorithm import Algorithm

_TERM = re.compile(r"\s*([+-]?)\s*(\d+\s*\*\s*)?([ABM])(\d+)")


def _parse(expr: str, letter: str, rows: int, cols: int | None) -> dict:
    out: dict = {}
    pos = 0
    expr = expr.strip()
    while pos < len(expr):
        mt = _TERM.match(expr, pos)
        if not mt or mt.group(3) != letter:
            raise ValueError(f"cannot parse {expr!r} at {expr[pos:]!r}")
        sign = -1 if mt.group(1) == "-" else 1
        coef = sign * (int(mt.group(2).rstrip(" *")) if mt.group(2) else 1)
        digits = mt.group(4)
        key = int(digits) - 1 if cols is None else (int(digits[0]) - 1, int(digits[1]) - 1)
        out[key] = out.get(key, 0) + coef
        pos = mt.end()
    return out


def from_formulas(name: str, grid: tuple[int, int, int], products: list[str],
                  outputs: dict[str, str], source: str) -> Algorithm:
    m, k, n = grid
    R = len(products)
    U = np.zeros((R, m, k), dtype=object)
    V = np.zeros((R, k, n), dtype=object)
    W = np.zeros((R, m, n), dtype=object)
    U[...] = 0
    V[...] = 0
    W[...] = 0
    for r, p in enumerate(products):
        a, b = p.split("*") if p.count("*") == 1 else re.split(r"\)\s*\*\s*\(", p)
        for (i, l), c in _parse(a.strip("() "), "A", m, k).items():
            U[r, i, l] += c
        for (l, j), c in _parse(b.strip("() "), "B", k, n).items():
            V[r, l, j] += c
    for cname, expr in outputs.items():
        i, j = int(cname[1]) - 1, int(cname[2]) - 1
        for r, c in _parse(expr, "M", R, None).items():
            W[r, i, j] += c
    return Algorithm(m, k, n, U, V, W, name=name, source=source)


def naive(m: int, k: int, n: int) -> Algorithm:
    """The definition: one product per (i, l, j)."""
    R = m * k * n
    U = np.zeros((R, m, k), dtype=object)
    V = np.zeros((R, k, n), dtype=object)
    W = np.zeros((R, m, n), dtype=object)
    U[...] = 0
    V[...] = 0
    W[...] = 0
    r = 0
    for i in range(m):
        for l in range(k):
            for j in range(n):
                U[r, i, l] = V[r, l, j] = W[r, i, j] = 1
                r += 1
    return Algorithm(m, k, n, U, V, W, name=f"naive-{m}x{k}x{n}",
                     source="definition of the matrix product")


def strassen() -> Algorithm:
    return from_formulas("strassen", (2, 2, 2), [
        "(A11 + A22) * (B11 + B22)",
        "(A21 + A22) * (B11)",
        "(A11) * (B12 - B22)",
        "(A22) * (B21 - B11)",
        "(A11 + A12) * (B22)",
        "(A21 - A11) * (B11 + B12)",
        "(A12 - A22) * (B21 + B22)",
    ], {"C11": "M1 + M4 - M5 + M7", "C12": "M3 + M5", "C21": "M2 + M4",
        "C22": "M1 - M2 + M3 + M6"},
        "V. Strassen, Gaussian elimination is not optimal, Numer. Math. 13 (1969)")


def winograd() -> Algorithm:
    # S1=A21+A22, S2=S1-A11, S3=A11-A21, S4=A12-S2; T1=B12-B11, T2=B22-T1, T3=B22-B12,
    # T4=T2-B21; written here expanded, the program module recovers the 15-addition form.
    return from_formulas("winograd", (2, 2, 2), [
        "(A11) * (B11)",
        "(A12) * (B21)",
        "(A11 + A12 - A21 - A22) * (B22)",
        "(A22) * (B11 - B12 + B22 - B21)",
        "(A21 + A22) * (B12 - B11)",
        "(A21 + A22 - A11) * (B22 - B12 + B11)",
        "(A11 - A21) * (B22 - B12)",
    ], {"C11": "M1 + M2", "C12": "M1 + M6 + M5 + M3", "C21": "M1 + M6 + M7 - M4",
        "C22": "M1 + M6 + M7 + M5"},
        "S. Winograd's variant of Strassen (7 multiplications, 15 additions), as in "
        "Boyer, Dumas, Pernet, Zhou, Memory efficient scheduling of Strassen-Winograd's algorithm (2009)")


def hopcroft_kerr_rank11() -> Algorithm:
    """<2,2,3;11> as Strassen on columns 1-2 of B plus the naive <2,2,1;4> on column 3.

    This reaches Hopcroft and Kerr's rank 11 (1971) by the direct-sum construction; it is not
    their printed coefficient set.
    """
    s = strassen()
    nv = naive(2, 2, 1)
    R = s.R + nv.R
    U = np.zeros((R, 2, 2), dtype=object)
    V = np.zeros((R, 2, 3), dtype=object)
    W = np.zeros((R, 2, 3), dtype=object)
    U[...] = 0
    V[...] = 0
    W[...] = 0
    U[:7] = s.U
    V[:7, :, :2] = s.V
    W[:7, :, :2] = s.W
    U[7:] = nv.U
    V[7:, :, 2:] = nv.V
    W[7:, :, 2:] = nv.W
    return Algorithm(2, 2, 3, U, V, W, name="hopcroft-kerr",
                     source="rank 11 of Hopcroft & Kerr (SIAM J. Appl. Math. 20, 1971) by "
                            "Strassen <2,2,2;7> ⊕ naive <2,2,1;4> along n")
