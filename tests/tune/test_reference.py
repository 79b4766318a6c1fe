"""lcmac.tune.reference on the CPU: the slices are exact and bounded, their products exact in
float64, the double-double product within its bound of the exact one (Fractions), and the
exact operands' product exact."""
from __future__ import annotations

from fractions import Fraction

import pytest

torch = pytest.importorskip("torch")

from lcmac.tune.reference import (  # noqa: E402
    dd_error, dd_matmul, exact_operands, exact_product, slice_bits, slices, two_sum)


def _wide(r, c, seed):
    g = torch.Generator().manual_seed(seed)
    e = torch.randint(-30, 31, (r, c), generator=g).double()
    return torch.ldexp(torch.randn(r, c, generator=g, dtype=torch.float64), e)


def test_slices_are_bounded_integers_summing_to_the_operand():
    X = _wide(40, 300, 0)
    X[3] = 0                                               # a zero row stays zero
    bits, parts = slice_bits(300), 4
    assert bits == (53 - 9) // 2
    pieces = slices(X, 1, parts, bits)
    amax = X.abs().amax(1, keepdim=True)
    top = torch.ldexp(torch.ones_like(amax), torch.frexp(torch.where(amax > 0, amax, 1.0))[1].double())
    for s, p in enumerate(pieces):
        units = p / (top * 2.0 ** (-bits * (s + 1)))
        assert torch.equal(units, units.round()) and units.abs().max() <= 2 ** bits, s
    rest = X - sum(pieces[1:], pieces[0])
    assert (rest.abs() <= top * 2.0 ** (-bits * parts)).all()
    assert all(not p[3].any() for p in pieces)


def test_two_sum_is_exact():
    g = torch.Generator().manual_seed(1)
    a, b = _wide(1, 64, 2)[0], torch.randn(64, generator=g, dtype=torch.float64)
    s, e = two_sum(a, b)
    for i in range(64):
        assert Fraction(float(s[i])) + Fraction(float(e[i])) == Fraction(float(a[i])) + Fraction(float(b[i]))


@pytest.mark.parametrize("K", [96, 1000])
def test_dd_matmul_is_within_its_bound_of_the_exact_product(K):
    A, B = _wide(6, K, 3), torch.randn(K, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    hi, lo = dd_matmul(A, B)
    worst = 0.0
    for i in range(6):
        for j in range(5):
            terms = [Fraction(float(A[i, k])) * Fraction(float(B[k, j])) for k in range(K)]
            exact, scale = sum(terms), sum(abs(t) for t in terms)
            worst = max(worst, float(abs(Fraction(float(hi[i, j])) + Fraction(float(lo[i, j])) - exact) / scale))
    assert worst < 2.0 ** -70
    assert dd_error(A @ B, hi, lo) > 1e3 * worst           # float64 itself is far coarser


def test_exact_operands_have_an_exact_float64_product():
    A, B = exact_operands(20, 12, 256, seed=5)
    C = exact_product(A, B)
    for i, j in ((0, 0), (7, 3), (19, 11)):
        assert Fraction(float(C[i, j])) == sum(Fraction(float(A[i, k])) * Fraction(float(B[k, j]))
                                               for k in range(256))
    assert dd_error(C, *dd_matmul(A, B)) == 0.0
    assert exact_operands(20, 12, 256, seed=5, dtype=torch.float32)[0].dtype == torch.float32
