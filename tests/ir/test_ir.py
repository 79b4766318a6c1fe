"""The algorithm IR: exact verification, composition, symmetries, reference executors."""
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lcmac.core.errors import AlgorithmError, CatalogueError, ShapeError, VerificationError
from lcmac.ir import (
    Algorithm, brent_failures, compose, get, is_exact, orbit, power, reference_matmul, rotate,
    run_fused, run_unfused, transpose, verify)
from lcmac.ir import builtin


def test_strassen_is_exact_and_counts():
    s = get("strassen")
    assert (s.m, s.k, s.n, s.R) == (2, 2, 2, 7)
    assert s.nnz() == {"U": 12, "V": 12, "W": 12}   # FalconGEMM: ‖U‖₀ = 12
    assert s.naive_additions()["total"] == 18
    assert is_exact(s)


def test_winograd_naive_additions():
    assert get("winograd").naive_additions()["total"] == 24


def test_wrong_coefficient_names_the_failing_equation():
    s = get("strassen")
    W = s.W.copy()
    W.flags.writeable = True
    W[0, 0, 0] = 0                      # drop M1 from C11
    bad = Algorithm(2, 2, 2, s.U, s.V, W, name="broken")
    fails = brent_failures(bad)
    assert fails and all(f.c == (0, 0) for f in fails)
    with pytest.raises(VerificationError, match=r"Brent equation for A\[\d\]\[\d\]·B\[\d\]\[\d\] in C\[0\]\[0\]"):
        verify(bad)


def test_rational_coefficients_are_exact():
    s = get("strassen")
    U = np.array(s.U, dtype=object) * Fraction(1, 2)
    W = np.array(s.W, dtype=object) * 2
    half = Algorithm(2, 2, 2, U, s.V, W, name="scaled")
    assert is_exact(half)
    U[0, 0, 0] = Fraction(1, 3)
    assert not is_exact(Algorithm(2, 2, 2, U, s.V, W))


def test_malformed_algorithms_rejected():
    s = get("strassen")
    with pytest.raises(AlgorithmError, match="V has shape"):
        Algorithm(2, 2, 2, s.U, s.V[:, :1, :], s.W)
    with pytest.raises(AlgorithmError, match="not a number"):
        Algorithm.from_dict({"grid": [2, 2, 2], "U": [[["x", 0], [0, 0]]],
                             "V": [[[1, 0], [0, 0]]], "W": [[[1, 0], [0, 0]]]})
    with pytest.raises(AlgorithmError, match="lacks"):
        Algorithm.from_dict({"grid": [2, 2, 2]})
    with pytest.raises(AlgorithmError, match="exact small rational"):
        Algorithm(1, 1, 1, [[[0.1234567]]], [[[1]]], [[[1]]])


def test_value_semantics_and_json_roundtrip():
    s = get("strassen")
    with pytest.raises(ValueError):
        s.U[0, 0, 0] = 5                     # read-only
    back = Algorithm.from_dict(s.to_dict())
    assert back == s and back.hash == s.hash
    assert get("winograd").hash != s.hash


def test_composition_ranks():
    ss = get("strassen^2")
    assert (ss.grid, ss.R) == ((4, 4, 4), 49)
    assert is_exact(ss)
    assert power(get("strassen"), 3).R == 343
    sh = compose(get("strassen"), get("hopcroft-kerr"))
    assert (sh.grid, sh.R) == ((4, 4, 6), 77) and is_exact(sh)


def test_strassen_times_laderman_rank_161():
    try:
        lad = get("laderman")
    except CatalogueError:
        pytest.skip("laderman not in catalogue")
    sl = compose(get("strassen"), lad)
    assert (sl.grid, sl.R) == ((6, 6, 6), 161)
    assert is_exact(sl)


@pytest.mark.parametrize("name", ["strassen", "winograd", "hopcroft-kerr", "naive-2x3x4"])
def test_symmetries_give_every_permuted_grid(name):
    a = get(name)
    o = orbit(a)
    perms = {(a.m, a.k, a.n), (a.k, a.n, a.m), (a.n, a.m, a.k),
             (a.n, a.k, a.m), (a.m, a.n, a.k), (a.k, a.m, a.n)}
    assert set(o) == perms
    for g, b in o.items():
        assert b.grid == g and b.R == a.R and is_exact(b)
    assert is_exact(rotate(a)) and is_exact(transpose(a))


def test_catalogue_expressions_and_errors():
    assert get("hopcroft-kerr@3x2x2").grid == (3, 2, 2)
    with pytest.raises(CatalogueError, match="unknown algorithm"):
        get("no-such-algo")
    with pytest.raises(CatalogueError, match="not a permutation"):
        get("strassen@2x2x3")
    with pytest.raises(CatalogueError, match="recursion level"):
        get("strassen^x")
    with pytest.raises(CatalogueError, match="plain GEMM"):
        get("gemm")


@settings(max_examples=25, deadline=None)
@given(M=st.integers(1, 40), N=st.integers(1, 40), K=st.integers(1, 40),
       name=st.sampled_from(["strassen", "winograd", "hopcroft-kerr", "strassen^2",
                             "hopcroft-kerr@3x2x2"]),
       seed=st.integers(0, 2 ** 31))
def test_executors_match_numpy_on_any_shape(M, N, K, name, seed):
    rng = np.random.default_rng(seed)
    A, B = rng.standard_normal((M, K)), rng.standard_normal((K, N))
    alg = get(name)
    ref = reference_matmul(A, B)
    tol = 1e-10 * (1 + np.abs(ref).max())
    assert np.abs(run_unfused(alg, A, B) - ref).max() <= tol
    assert np.abs(run_fused(alg, A, B, tile=(3, 5)) - ref).max() <= tol


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32])
def test_executor_dtypes(dtype):
    rng = np.random.default_rng(1)
    A = rng.integers(-3, 4, (10, 7)).astype(dtype)
    B = rng.integers(-3, 4, (7, 9)).astype(dtype)
    C = run_fused(get("strassen"), A, B)
    np.testing.assert_array_equal(C, A.astype(np.float64) @ B.astype(np.float64))


def test_executor_shape_errors():
    with pytest.raises(ShapeError, match="inner dimensions"):
        run_unfused(get("strassen"), np.ones((4, 3)), np.ones((4, 4)))
    with pytest.raises(ShapeError, match="2-D"):
        run_fused(get("strassen"), np.ones(4), np.ones((4, 4)))


def test_builtin_formula_parser_rejects_garbage():
    with pytest.raises(ValueError, match="cannot parse"):
        builtin.from_formulas("x", (2, 2, 2), ["(A11 + Q2) * (B11)"], {"C11": "M1"}, "")
