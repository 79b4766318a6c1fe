"""Common-subexpression elimination for the combine stages (lcmac.ir.cse)."""
from __future__ import annotations

import warnings
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lcmac.ir import get
from lcmac.ir.catalogue import all_algorithms
from lcmac.ir.cse import addition_counts, optimize, optimized_programs, transpose_program
from lcmac.ir.program import combine_matrices, naive_program


def _same(A, B):
    return A.shape == B.shape and all(a == b for a, b in zip(A.flat, B.flat))


def _obj(rows):
    M = np.empty((len(rows), len(rows[0])), dtype=object)
    for i, r in enumerate(rows):
        for j, x in enumerate(r):
            M[i, j] = x
    return M


def test_winograd_reaches_15():
    c = addition_counts(get("winograd"))
    assert c["naive"]["total"] == 24
    assert c["reduced"]["total"] == 15
    assert (c["reduced"]["A"], c["reduced"]["B"], c["reduced"]["H"]) == (4, 4, 7)


def test_strassen_has_nothing_to_share():
    c = addition_counts(get("strassen"))
    assert c["naive"]["total"] == 18 and c["reduced"]["total"] == 18


def test_strassen_squared_no_worse_than_recursion():
    # two-level recursion costs 4·18 (outer, on 2x2 blocks) + 7·18 (inner) = 198
    c = addition_counts(get("strassen^2"))
    assert c["reduced"]["total"] <= 198
    assert c["naive"]["total"] == 318


def test_winograd_squared_beats_recursion():
    assert addition_counts(get("winograd^2"))["reduced"]["total"] <= 4 * 15 + 7 * 15


@pytest.mark.parametrize("alg", all_algorithms() + [get("strassen^2")], ids=lambda a: a.name)
def test_programs_compute_stage_matrices(alg):
    progs = optimized_programs(alg)
    mats = combine_matrices(alg)
    for s in ("A", "B", "H"):
        assert _same(progs[s].matrix(), mats[s])
        assert progs[s].additions <= naive_program(mats[s]).additions


def test_evaluate_matches_matrix_product():
    alg = get("strassen^2")
    rng = np.random.default_rng(0)
    for s, M in combine_matrices(alg).items():
        p = optimize(M)
        x = rng.standard_normal((M.shape[1], 3))
        got = np.array(p.evaluate(list(x)))
        want = M.astype(float) @ x
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_rational_coefficients():
    h = Fraction(1, 2)
    M = _obj([[1, h, 3, 0], [2, 1, 0, 5], [h, Fraction(1, 4), 0, 0], [0, 0, 3, 5]])
    p = optimize(M)
    assert _same(p.matrix(), M)
    # (x0 + ½x1) is shared by three rows
    assert p.additions < naive_program(M).additions


def test_deterministic():
    M = combine_matrices(get("strassen^2"))["H"]
    assert optimize(M) == optimize(M)


def test_zero_rows_and_columns():
    M = _obj([[0, 0, 0], [1, 0, 1], [0, 0, 0], [1, 0, 1]])
    p = optimize(M)
    assert _same(p.matrix(), M) and p.additions == 1


def test_transpose_program():
    M = combine_matrices(get("winograd"))["H"]
    p = optimize(M)
    t = transpose_program(p)
    assert _same(t.matrix(), M.T)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 9), st.integers(1, 9), st.data())
def test_random_sparse_integer_matrices(n_out, n_in, data):
    vals = st.sampled_from([0, 0, 0, 1, -1, 1, 2, -3])
    rows = [[data.draw(vals) for _ in range(n_in)] for _ in range(n_out)]
    M = _obj(rows)
    p = optimize(M, effort=1)
    assert _same(p.matrix(), M)
    assert p.additions <= naive_program(M).additions
    x = np.random.default_rng(1).standard_normal(n_in)
    got = np.array([float(v) for v in p.evaluate(list(x))])
    np.testing.assert_allclose(got, M.astype(float) @ x, rtol=1e-12, atol=1e-12)


def _with_programs(alg, programs):
    from lcmac.ir.algorithm import Algorithm
    return Algorithm(alg.m, alg.k, alg.n, alg.U, alg.V, alg.W, name=alg.name, programs=programs)


def test_supplied_program_not_cheaper_is_not_used():
    alg = get("winograd")
    sup = {s: naive_program(M).to_dict() for s, M in combine_matrices(alg).items()}
    progs = optimized_programs(_with_programs(alg, sup))
    assert sum(p.additions for p in progs.values()) == 15


def test_supplied_cheaper_program_wins(monkeypatch):
    import lcmac.ir.cse as cse
    alg = get("winograd")
    best = {s: optimize(M).to_dict() for s, M in combine_matrices(alg).items()}
    # pretend our own CSE found nothing: the verified supplied programs must be chosen
    monkeypatch.setattr(cse, "optimize", lambda M, **kw: naive_program(M))
    progs = cse.optimized_programs(_with_programs(alg, best), effort=0)
    assert sum(p.additions for p in progs.values()) == 15


def test_supplied_program_with_wrong_coefficient_is_rejected():
    alg = get("winograd")
    good = optimize(combine_matrices(alg)["A"]).to_dict()
    bad = dict(good)
    outs = [list(map(list, o)) for o in good["outputs"]]
    outs[2][0][0] = 2 if outs[2][0][0] != 2 else 3  # corrupt one coefficient
    bad["outputs"] = outs
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        progs = optimized_programs(_with_programs(alg, {"A": bad, "B": {"junk": 1}}))
    assert len([x for x in w if "ignored" in str(x.message)]) == 2
    assert _same(progs["A"].matrix(), combine_matrices(alg)["A"])
    assert progs["A"].additions == 4 and progs["B"].additions == 4


def test_optimized_programs_cached():
    alg = get("strassen^2")
    a = optimized_programs(alg)
    b = optimized_programs(alg)
    assert a == b and a is not b


def test_default_effort_fast_enough():
    import time
    alg = get("winograd^2")  # <4,4,4;49>
    M = combine_matrices(alg)
    t = time.perf_counter()
    for s in ("A", "B", "H"):
        optimize(M[s])
    assert time.perf_counter() - t < 5.0


def test_disk_cache_round_trip_and_corrupt_entry(tmp_path, monkeypatch):
    """The on-disk CSE cache returns the same programs, and a damaged entry is recomputed
    (re-checked exactly), never trusted."""
    from lcmac.ir import catalogue, cse
    monkeypatch.setenv("LCMAC_CACHE_DIR", str(tmp_path))
    alg = catalogue.get("winograd")
    cse._CACHE.clear()
    first = cse.optimized_programs(alg)
    files = list((tmp_path / "cse").glob("*.json"))
    assert len(files) == 1
    cse._CACHE.clear()
    again = cse.optimized_programs(alg)
    assert {k: p.to_dict() for k, p in again.items()} == {k: p.to_dict() for k, p in first.items()}
    # tamper: swap the A and B programs; the exact check must reject the entry
    import json
    doc = json.loads(files[0].read_text())
    doc["A"], doc["B"] = doc["B"], doc["A"]
    files[0].write_text(json.dumps(doc))
    cse._CACHE.clear()
    assert cse._disk_read(files[0], cse.combine_matrices(alg)) is None
    fixed = cse.optimized_programs(alg)
    assert fixed["A"].to_dict() == first["A"].to_dict()
    files[0].write_text("{not json")
    cse._CACHE.clear()
    assert cse.optimized_programs(alg)["H"].additions == first["H"].additions
    cse._CACHE.clear()


def test_disk_cache_off(tmp_path, monkeypatch):
    from lcmac.ir import catalogue, cse
    monkeypatch.setenv("LCMAC_CACHE_DIR", "off")
    assert cse.cache_dir() is None
    cse._CACHE.clear()
    assert cse.optimized_programs(catalogue.get("strassen"))["A"].additions >= 0
