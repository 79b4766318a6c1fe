"""The Boolean product through exact integer counts by an LCMA (lcmac.bits.counting)."""
from fractions import Fraction

import numpy as np
import pytest

from lcmac.bits import boolean_matmul, pack
from lcmac.bits.counting import EXACT_LIMIT, exactness_bound
from lcmac.core.errors import AlgorithmError, VerificationError
from lcmac.ir import get
from lcmac.ir.algorithm import Algorithm


@pytest.mark.parametrize("shape", [(63, 65, 127), (1000, 777, 1234), (3, 5, 7)])
@pytest.mark.parametrize("algo", ["strassen", "winograd", "laderman", "strassen^2", "dps-4x4x4-r48"])
def test_counts_by_an_lcma_give_the_boolean_product(shape, algo):
    m, k, n = shape
    rng = np.random.default_rng(m)
    A = (rng.random((m, k)) < 0.02).astype(np.uint8)
    B = (rng.random((k, n)) < 0.02).astype(np.uint8)
    ref = ((A.astype(np.int64) @ B) > 0).astype(np.uint8)
    C = boolean_matmul(A, B, algo=algo)
    assert C.dtype == np.uint8 and np.array_equal(C, ref)
    assert np.array_equal(C, boolean_matmul(A, B))                    # the kernel agrees
    assert np.array_equal(boolean_matmul(pack(A), pack(B), algo=algo).data, pack(ref).data)


def test_inexact_schemes_and_sizes_are_refused():
    s = get("strassen")
    thirds = Algorithm(2, 2, 2, s.U * 3, s.V,
                       np.array([[[Fraction(int(x), 3) for x in row] for row in mat] for mat in s.W.tolist()],
                                dtype=object), name="strassen-thirds")
    A = np.ones((4, 4), np.uint8)
    with pytest.raises(AlgorithmError, match="denominator 3"):
        boolean_matmul(A, A, algo=thirds)
    assert exactness_bound(s, 2 ** 60) >= EXACT_LIMIT > exactness_bound(s, 2 ** 40)
    with pytest.raises(VerificationError, match="valid only over GF"):   # a GF(2)-only scheme cannot count
        boolean_matmul(A, A, algo="at-4x4x4-r47-gf2")
