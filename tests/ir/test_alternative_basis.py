"""Alternative bases (lcmac.ir.alternative_basis, lcmac.ir.basis_search) and GF(2) schemes
(lcmac.ir.gf2): exact verification, the searched 2×2 cores, counts, refusals."""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from lcmac.core.errors import AlgorithmError, VerificationError
from lcmac.ir import get, run_unfused
from lcmac.ir.alternative_basis import (
    AlternativeBasisAlgorithm, from_standard, inverse, leading_coefficient)
from lcmac.ir.basis_search import addition_report, search_basis
from lcmac.ir.catalogue import all_algorithms, naive_names
from lcmac.ir.cse import addition_counts
from lcmac.ir.gf2 import (
    GF2Algorithm, gf2_failures, gf2_from_fmm, reduce_mod2, require_rational, verify_gf2,
    verify_over)
from lcmac.ir.verify import brent_failures

I4 = np.eye(4, dtype=int)


def _run_pair(ab: AlternativeBasisAlgorithm, A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """The pair applied literally, in exact arithmetic (modulo 2 over GF(2)): basis changes
    on the vectors of blocks, the core's products, υ⁻¹ on the result."""
    m, k, n, R = ab.m, ab.k, ab.n, ab.R
    bm, bk, bn = A.shape[0] // m, A.shape[1] // k, B.shape[1] // n
    Ab = [A[i * bm:(i + 1) * bm, l * bk:(l + 1) * bk] for i in range(m) for l in range(k)]
    Bb = [B[l * bk:(l + 1) * bk, j * bn:(j + 1) * bn] for l in range(k) for j in range(n)]

    def combine(M, blocks):
        return [sum(M[o, s] * blocks[s] for s in range(M.shape[1])) for o in range(M.shape[0])]

    core = ab.core_matrices()
    At = combine(core["A"], combine(ab.phi, Ab))
    Bt = combine(core["B"], combine(ab.psi, Bb))
    H = [At[r].dot(Bt[r]) for r in range(R)]
    Cb = combine(ab.upsilon_inverse, combine(core["H"], H))
    C = np.block([[Cb[i * n + j] for j in range(n)] for i in range(m)])
    return C % 2 if ab.ring == "gf2" else C


def _random_int(shape, seed, high=4):
    return np.random.default_rng(seed).integers(-high, high + 1, size=shape).astype(object)


# ---- the search reproduces Karstadt–Schwartz's 12-addition core --------------------------------

@pytest.mark.parametrize("ring", ["rational", "gf2"])
@pytest.mark.parametrize("name,basis_adds", [("strassen", 6), ("winograd", 3)])
def test_search_finds_the_12_addition_core(name, basis_adds, ring):
    res = search_basis(get(name), ring=ring)
    ab = res.algorithm
    assert res.method == {"A": "exhaustive", "B": "exhaustive", "C": "exhaustive"}
    assert ab.ring == ring and ab.is_exact()
    counts = ab.addition_counts()
    core = counts["core"]["reduced"]
    # 3 + 3 + 6 is also the lower bound: 7 pairwise independent rows over 4 positions leave at
    # least 3 with two nonzeros, and Combine H pays 7 - 4 more (transposition principle)
    assert (core["A"], core["B"], core["H"], core["total"]) == (3, 3, 6, 12)
    assert counts["basis_changes"]["reduced"]["total"] == basis_adds
    for basis in (ab.phi, ab.psi, ab.upsilon):
        assert set(basis.flat) <= ({0, 1} if ring == "gf2" else {-1, 0, 1})


def test_search_is_deterministic():
    a, b = search_basis(get("strassen")).algorithm, search_basis(get("strassen")).algorithm
    assert all((x == y).all() for x, y in ((a.phi, b.phi), (a.psi, b.psi), (a.upsilon, b.upsilon)))


def test_found_pair_computes_the_product_literally():
    ab = search_basis(get("strassen")).algorithm
    A, B = _random_int((4, 6), 1), _random_int((6, 2), 2)
    assert (_run_pair(ab, A, B) == A.dot(B)).all()


def test_gf2_pair_multiplies_bit_matrices():
    ab = search_basis(get("winograd"), ring="gf2").algorithm
    rng = np.random.default_rng(3)
    A, B = (rng.integers(0, 2, size=(6, 6)).astype(object) for _ in range(2))
    assert (_run_pair(ab, A, B) == A.dot(B) % 2).all()


# ---- verification of pairs --------------------------------------------------------------------

def test_pair_round_trips_to_the_standard_scheme():
    s = get("strassen")
    ab = search_basis(s).algorithm
    again = from_standard(s, ab.phi, ab.psi, ab.upsilon)
    assert again.standard() == s and again.verify() is again
    assert (again.U == ab.U).all() and (again.W == ab.W).all()


@pytest.mark.parametrize("which", ["phi", "psi", "upsilon"])
def test_broken_basis_fails_verification(which):
    ab = search_basis(get("strassen")).algorithm
    bases = {"phi": ab.phi, "psi": ab.psi, "upsilon": ab.upsilon}
    assert not (bases[which] == I4).all()
    bases[which] = I4                                   # the core, told the wrong basis
    broken = AlternativeBasisAlgorithm(2, 2, 2, ab.U, ab.V, ab.W, **bases, name="broken")
    assert not broken.is_exact() and broken.failures()
    with pytest.raises(VerificationError, match=r"broken <2,2,2;7>: the core with its basis "
                                                r"changes φ, ψ, υ does not compute"):
        broken.verify()


def test_broken_gf2_pair_fails_over_gf2():
    ab = search_basis(get("strassen"), ring="gf2").algorithm
    broken = AlternativeBasisAlgorithm(2, 2, 2, ab.U, ab.V, ab.W, I4, ab.psi, ab.upsilon,
                                       ring="gf2", name="broken")
    with pytest.raises(VerificationError, match="over GF\\(2\\)"):
        broken.verify()


def test_singular_basis_is_refused():
    singular = [[1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]]
    with pytest.raises(AlgorithmError, match="basis φ is singular"):
        from_standard(get("strassen"), singular, I4, I4)
    # invertible over the rationals (det 2), singular modulo 2
    even = [[1, 1, 0, 0], [1, -1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]]
    assert from_standard(get("strassen"), I4, even, I4).is_exact()
    with pytest.raises(AlgorithmError, match="singular over GF\\(2\\)"):
        from_standard(get("strassen"), I4, even, I4, ring="gf2")


def test_rational_basis_with_fractional_inverse():
    phi = [[1, 1, 0, 0], [1, -1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]]
    ab = from_standard(get("winograd"), phi, I4, phi).verify()
    assert Fraction(1, 2) in set(ab.U.flat) | set(ab.upsilon_inverse.flat)
    A, B = _random_int((2, 2), 4), _random_int((2, 2), 5)
    assert (_run_pair(ab, A, B) == A.dot(B)).all()


def test_inverse_is_exact():
    M = np.array([[2, 1, 0], [1, 1, 1], [0, 1, 3]], dtype=object)
    assert (M.dot(inverse(M)) == np.eye(3, dtype=int)).all()
    G = np.array([[1, 1, 0], [0, 1, 1], [0, 0, 1]], dtype=object)
    assert (G.dot(inverse(G, "gf2")) % 2 == np.eye(3, dtype=int)).all()


# ---- counts -----------------------------------------------------------------------------------

def test_published_counts_of_strassen_and_winograd():
    s, w = addition_counts(get("strassen")), addition_counts(get("winograd"))
    assert (s["naive"]["total"], s["reduced"]["total"]) == (18, 18)   # Strassen (1969): 18
    assert (w["naive"]["total"], w["reduced"]["total"]) == (24, 15)   # Winograd: 15 after sharing
    # leading coefficients: Strassen 7, Strassen–Winograd 6, Karstadt–Schwartz 5
    assert leading_coefficient(18, (2, 2, 2), 7) == 7
    assert leading_coefficient(15, (2, 2, 2), 7) == 6
    assert leading_coefficient(12, (2, 2, 2), 7) == 5
    assert leading_coefficient(20, (2, 2, 3), 11) is None


def test_identity_basis_counts_are_the_standard_ones():
    w = get("winograd")
    c = from_standard(w, I4, I4, I4).addition_counts()
    assert c["core"]["naive"]["total"] == 24 and c["core"]["reduced"]["total"] == 15
    assert c["basis_changes"]["reduced"]["total"] == 0


def test_addition_report():
    r = addition_report(get("winograd"))
    assert r["additions"]["naive"] == 24 and r["additions"]["cse"] == 15
    assert r["additions"]["core"] == 12 and r["additions"]["basis_changes"] == 3
    assert r["leading_coefficient"] == {"naive": "9", "cse": "6", "core": "5"}
    phi = np.array([[Fraction(x) for x in row] for row in r["bases"]["phi"]], dtype=object)
    psi, ups = (np.array([[Fraction(x) for x in row] for row in r["bases"][b]], dtype=object)
                for b in ("psi", "upsilon"))
    assert from_standard(get("winograd"), phi, psi, ups).is_exact()


def test_heuristic_on_a_larger_grid_is_marked_and_never_worse():
    alg = get("hopcroft-kerr")                           # <2,2,3;11>: φ 4×4, ψ and υ 6×6
    res = search_basis(alg, evaluations=1500, polish=20)
    assert res.method == {"A": "exhaustive", "B": "heuristic", "C": "heuristic"}
    ab = res.algorithm.verify()
    core = ab.addition_counts()["core"]["reduced"]
    own = from_standard(alg, I4, np.eye(6, dtype=int), np.eye(6, dtype=int))
    assert core["total"] <= own.addition_counts()["core"]["reduced"]["total"]
    assert core["total"] < 20


# ---- GF(2) ------------------------------------------------------------------------------------

def test_every_catalogue_scheme_reduces_mod2_and_verifies_over_gf2():
    refused = []
    for alg in all_algorithms() + [get(n) for n in naive_names()]:
        try:
            g = reduce_mod2(alg)
        except AlgorithmError as e:
            refused.append(alg.name)
            assert "even denominator" in str(e)
            continue
        assert set(g.U.flat) | set(g.V.flat) | set(g.W.flat) <= {0, 1}
        assert gf2_failures(g) == [], alg.name
        assert verify_over(g) is g
    # coefficients ½ (AlphaEvolve), ⅛ (Smirnov), ½, ¼, ⅛ (DPS)
    assert refused == ["ae-2x4x5-r32", "smirnov-3x3x6-r40", "smirnov-3x6x6-r80", "dps-4x4x4-r48"]


def test_a_wrong_bit_fails_over_gf2():
    g = reduce_mod2(get("strassen"))
    W = np.array(g.W)
    W[0, 0, 0] ^= 1
    bad = GF2Algorithm(2, 2, 2, g.U, g.V, W, name="bad")
    fails = gf2_failures(bad)
    assert fails and all(f.c == (0, 0) for f in fails)
    with pytest.raises(VerificationError, match=r"bad <2,2,2;7> is not a correct matrix "
                                                r"product over GF\(2\): Brent equation"):
        verify_gf2(bad)


GF2_ONLY = r"strassen-gf2 <2,2,2;7> is valid only over GF\(2\) \(ring 'gf2'.*over the integers " \
           r"Brent equation for .* = 2, expected 0"


def test_gf2_only_scheme_is_refused_over_the_integers():
    g = reduce_mod2(get("strassen"))                     # no minus signs: wrong over ℤ
    assert brent_failures(g.integer_image()) and not gf2_failures(g)
    with pytest.raises(VerificationError, match=GF2_ONLY):
        require_rational(g)
    with pytest.raises(ValueError, match=GF2_ONLY):      # a VerificationError, a ValueError
        run_unfused(g, np.ones((4, 4)), np.ones((4, 4)))
    with pytest.raises(VerificationError, match=GF2_ONLY):
        from_standard(g, I4, I4, I4, ring="rational")
    ab = from_standard(g, I4, I4, I4)
    assert ab.ring == "gf2" and ab.is_exact()
    with pytest.raises(VerificationError, match="valid only over GF\\(2\\)"):
        ab.require_rational()


def _fmm_z2(g: GF2Algorithm) -> dict:
    R, (m, k, n) = g.R, g.grid
    w = np.transpose(np.array(g.W, dtype=int), (0, 2, 1)).reshape(R, n * m)   # c_ij at j·m+i
    u, v = (np.array(t, dtype=int).reshape(R, -1).tolist() for t in (g.U, g.V))
    return {"n": [m, k, n], "m": R, "z2": True, "u": u, "v": v, "w": w.tolist()}


def test_gf2_scheme_from_a_fastmatrixmultiplication_z2_file():
    g = reduce_mod2(get("winograd"))
    got = gf2_from_fmm(_fmm_z2(g))
    assert got == g and got.ring == "gf2"
    d = _fmm_z2(g)
    d["w"][0][0] ^= 1
    with pytest.raises(VerificationError, match="over GF\\(2\\)"):
        gf2_from_fmm(d)
    with pytest.raises(AlgorithmError, match="not marked 'z2'"):
        gf2_from_fmm({**_fmm_z2(g), "z2": False})
