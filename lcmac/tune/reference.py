"""Products more exact than float64, for measuring the error of float64 GEMMs (torch tensors,
on the operands' device).

A float64 product cannot be judged against a float64 reference: the reference errs as much.
``dd_matmul`` computes A·B to about 2⁻⁷⁰ of |A|·|B| instead, with float64 GEMMs that are exact:

- **Exact slices** (``slices``): each row of A is cut into ``parts`` slices of at most ``bits``
  significant bits below a power of two at the row's largest |element| (each slice an integer
  multiple of one power of two per row; what is left after the last slice is below
  2^-(bits·parts) of that power), each column of B likewise.  A slice product A_s·B_t is then
  a power of two per element times a sum of K integers below 2^(2·bits) each, which float64
  holds exactly when K·2^(2·bits) ≤ 2^53 (``slice_bits``), in any summation order: the GEMM
  that computes it (cuBLAS's DGEMM) rounds nothing.
- **Double-double sum**: the slice products whose magnitude is above the slices' own
  truncation (s + t < parts) are added with Knuth's TwoSum, into hi + lo.

(The slices are Ozaki's error-free splitting, 2012, with a shared exponent per row.)
``exact_operands`` makes inputs whose product every GEMM and LCMA computes exactly (small
integers times powers of two), for tests that want a bit-exact answer.
"""
from __future__ import annotations

import math

__all__ = ["slice_bits", "slices", "two_sum", "dd_matmul", "dd_error", "exact_operands",
           "exact_product"]

#: float64's significand bits
F64_BITS = 53


def slice_bits(K: int) -> int:
    """The most bits a slice may keep so that a product of two slices over K terms is exact in
    float64: K·2^(2·bits) ≤ 2^53."""
    return (F64_BITS - math.ceil(math.log2(max(K, 2)))) // 2


def slices(X, dim: int, parts: int, bits: int) -> list:
    """``parts`` tensors summing to X up to 2^-(bits·parts) of each row's (``dim`` = 1) or
    column's (``dim`` = 0) top power of two, each an integer below 2^bits times one power of
    two per row (column).  Zero rows stay zero.  X must be finite float64."""
    import torch
    amax = X.abs().amax(dim=dim, keepdim=True)
    # 2^e ≥ amax: frexp's exponent (amax = m·2^e, 0.5 ≤ m < 1); zero rows take 2^0
    _, e = torch.frexp(torch.where(amax > 0, amax, torch.ones_like(amax)))
    top = torch.ldexp(torch.ones_like(amax), e)
    rest, out = X.clone(), []
    for s in range(parts):
        unit = top * 2.0 ** (-bits * (s + 1))
        piece = torch.round(rest / unit) * unit          # exact: unit is a power of two
        rest = rest - piece                              # exact: a rounding remainder
        out.append(piece)
    return out


def two_sum(a, b):
    """(s, e) with s = fl(a + b) and a + b = s + e exactly (Knuth's TwoSum, elementwise)."""
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


def dd_matmul(A, B, parts: int = 4, matmul=None):
    """A·B (float64 tensors, 2-D) as a double-double (hi, lo): hi + lo is within about
    2^-(slice_bits(K)·parts) of |A|·|B| of the exact product (module doc).  ``matmul``: the
    exact GEMM of two slices (default torch.matmul: cuBLAS's DGEMM on a GPU)."""
    import torch
    matmul = matmul or torch.matmul
    bits = slice_bits(A.shape[1])
    a = slices(A, 1, parts, bits)
    b = slices(B, 0, parts, bits)
    hi = lo = None
    # smallest terms first, so that hi grows from them
    for total in range(parts - 1, -1, -1):
        for s in range(total + 1):
            p = matmul(a[s], b[total - s])
            if hi is None:
                hi, lo = p, torch.zeros_like(p)
                continue
            hi, e = two_sum(hi, p)
            lo += e
            del p, e
    return hi, lo


def dd_error(C, hi, lo) -> float:
    """‖C − (hi + lo)‖_F / ‖hi + lo‖_F, C rounded to float64 first (its own dtype's values)."""
    d = (C.double() - hi) - lo
    return float(d.norm() / hi.norm())


def exact_operands(M: int, N: int, K: int, *, device="cpu", seed: int = 0, magnitude: int = 8,
                   spread: int = 4, dtype=None):
    """(A, B): integers in [-magnitude, magnitude] times 2^r_i per row of A and 2^c_j per column
    of B (r, c integers in [-spread, spread]), float64 (or ``dtype``).  Every partial sum of
    their product, and of an LCMA's combinations of their blocks, is an integer times a power
    of two inside float64's 53 bits, so every correct kernel returns the exact product
    (``exact_product``).  With the defaults an element is below 2^11 units of 2^-4; two levels
    of Winograd's combines (16 terms) make 2^15, a product over K = 4096 2^42 units of 2^-8,
    Combine H's sums (under 2^8 of them at unit weight) 2^50: K ≤ 4096 is exact."""
    import torch
    g = torch.Generator(device="cpu").manual_seed(seed)
    ia = torch.randint(-magnitude, magnitude + 1, (M, K), generator=g, dtype=torch.int64)
    ib = torch.randint(-magnitude, magnitude + 1, (K, N), generator=g, dtype=torch.int64)
    r = torch.randint(-spread, spread + 1, (M, 1), generator=g, dtype=torch.int64)
    c = torch.randint(-spread, spread + 1, (1, N), generator=g, dtype=torch.int64)
    A = torch.ldexp(ia.double(), r.double())
    B = torch.ldexp(ib.double(), c.double())
    dt = dtype or torch.float64
    return A.to(device=device, dtype=dt), B.to(device=device, dtype=dt)


def exact_product(A, B):
    """The exact product of ``exact_operands``' (A, B), on the CPU in float64 (exact there:
    every partial sum is an integer times a power of two within 53 bits)."""
    return A.cpu().double() @ B.cpu().double()

