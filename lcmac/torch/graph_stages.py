"""An LCMA written as torch operations, so that ``torch.compile`` (Inductor) sees its stages:
Combine A can fuse into the kernel that produces A (a norm, an activation), Combine H into
the one that consumes C (a residual add), and the GEMM stage is one batched matmul
(cuBLAS) of the R products.

    c = coefficients(alg)             # the algorithm as plain tuples (what dynamo traces)
    Bt = combine_b(W_t, c)            # R × K/k × N/n, once per weight
    C = lcma_matmul(x, Bt, c)         # combine A → bmm → combine H, all torch ops

The combines are the algorithm's coefficients folded into sums of block views (exact ints
and fractions become Python floats; ±1 are adds).  In 16-bit dtypes Inductor computes each
sum in float32 and rounds once when it stores Ã_r; H_r comes out of the batched matmul
rounded to the dtype, so Combine H adds one rounding of H over lcmac's own kernels (which
keep H in float32).  Shapes must divide by the algorithm's grid (``fits``).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Coefficients:
    """An algorithm's grid and U, V, W as nested tuples of Python numbers (dynamo traces
    Python constants, not numpy object arrays)."""
    grid: tuple
    R: int
    U: tuple
    V: tuple
    W: tuple


def coefficients(alg) -> Coefficients:
    def plain(t):
        return tuple(tuple(tuple(_coef(c) for c in row) for row in mat) for mat in t)
    return Coefficients(tuple(alg.grid), int(alg.R), plain(alg.U), plain(alg.V), plain(alg.W))


def fits(alg, M: int, N: int, K: int) -> bool:
    """Whether M×N×K splits into the algorithm's m×k and k×n blocks evenly."""
    m, k, n = alg.grid
    return M % m == 0 and K % k == 0 and N % n == 0


def _coef(c):
    """An exact coefficient as a Python int where it is one (so ±1 stay adds), else float."""
    return int(c) if c == int(c) else float(c)


def _combine(blocks, coefs):
    """Σ coefs[i][j]·blocks[i][j] over the nonzero coefficients (±1 as adds)."""
    out = None
    for i, row in enumerate(coefs):
        for j, c in enumerate(row):
            b = blocks[i][j]
            if c == 0:
                continue
            if out is None:
                out = b if c == 1 else -b if c == -1 else b * c
            elif c in (1, -1):
                out = out + b if c == 1 else out - b
            else:
                out = out + b * c
    return out


def _blocks(X, p: int, q: int):
    """X (rows × cols) as p×q block views."""
    r, c = X.shape[-2] // p, X.shape[-1] // q
    return [[X[..., i * r:(i + 1) * r, j * c:(j + 1) * c] for j in range(q)] for i in range(p)]


def combine_a(A, alg):
    """Ã: R × M/m × K/k."""
    import torch
    m, k, _ = alg.grid
    blocks = _blocks(A, m, k)
    return torch.stack([_combine(blocks, alg.U[r]) for r in range(alg.R)])


def combine_b(B, alg):
    """B̃: R × K/k × N/n (B is K×N)."""
    import torch
    _, k, n = alg.grid
    blocks = _blocks(B, k, n)
    return torch.stack([_combine(blocks, alg.V[r]) for r in range(alg.R)])


def combine_h(H, alg):
    """C (M×N) from H (R × M/m × N/n): C_ij = Σ_r W[r,i,j]·H_r."""
    import torch
    m, _, n = alg.grid
    rows = []
    for i in range(m):
        row = []
        for j in range(n):
            coefs = [[alg.W[r][i][j]] for r in range(alg.R)]
            row.append(_combine([[H[r]] for r in range(alg.R)], coefs))
        rows.append(torch.cat(row, dim=-1))
    return torch.cat(rows, dim=-2)


def lcma_matmul(A, Bt, alg):
    """C = A·B for A M×K (2-D) with B̃ = ``combine_b(B, alg)`` given."""
    import torch
    return combine_h(torch.bmm(combine_a(A, alg), Bt), alg)
