"""lcmac.ir.gf2.check_ring: which ring a scheme's Brent equations hold in, asked or found."""
import numpy as np
import pytest

from lcmac.core.errors import AlgorithmError
from lcmac.ir import catalogue
from lcmac.ir.algorithm import Algorithm
from lcmac.ir.gf2 import check_ring, reduce_mod2


def _with_U(alg, edit) -> Algorithm:
    U = alg.U.copy()
    edit(U)
    return Algorithm(alg.m, alg.k, alg.n, U, alg.V, alg.W, name=f"{alg.name}-edited")


def test_auto_falls_back_to_gf2_only_where_the_rationals_fail():
    s = catalogue.get("strassen")
    assert check_ring(s).ring == "rational" and not check_ring(s).failures
    flipped = _with_U(s, lambda U: U.__setitem__(tuple(np.argwhere(U == -1)[0]), 1))
    c = check_ring(flipped)
    assert c.ring == "gf2" and not c.failures
    assert c.rational_failures == len(check_ring(flipped, "rational").failures) > 0
    assert check_ring(reduce_mod2(s)).ring == "gf2"                 # declared GF(2): checked there


def test_an_even_denominator_keeps_its_rational_failures():
    d = catalogue.get("dps-4x4x4-r48")                              # W holds ±1/4
    broken = _with_U(d, lambda U: U.__setitem__(tuple(np.argwhere(U != 0)[0]), 0))
    c = check_ring(broken)
    assert c.ring == "rational" and c.failures and c.rational_failures is None
    with pytest.raises(AlgorithmError, match="even denominator"):
        check_ring(d, "gf2")
    with pytest.raises(AlgorithmError, match="not one of auto, rational, gf2"):
        check_ring(d, "integers")
