"""The shipped catalogue (lcmac/ir/data/*.json): the exactness test layer.

Every entry is loaded and verified with the Brent equations in exact integer arithmetic, its
straight-line programs (if any) are expanded and compared with its coefficients, and names,
counts and provenance are pinned so that a regenerated catalogue cannot silently change them.
"""
import copy
import json
from pathlib import Path

import pytest

from lcmac.core.errors import CatalogueError, VerificationError
from lcmac.ir import catalogue
from lcmac.ir.algorithm import Algorithm
from lcmac.ir.importers import check_programs, load_file
from lcmac.ir.program import LinearProgram, combine_matrices
from lcmac.ir.verify import brent_failures, verify

DATA = Path(catalogue.__file__).parent / "data"
ROOT = Path(__file__).resolve().parents[2]

AT_NAMES = ["at-2x2x2-r7", "at-2x2x3-r11", "at-2x2x4-r14", "at-2x2x5-r18", "at-2x3x3-r15",
            "at-2x3x4-r20", "at-2x3x5-r25", "at-2x4x4-r26", "at-2x5x5-r40", "at-3x5x5-r58",
            "at-4x4x4-r49", "at-4x5x5-r76"]
FG_NAMES = ["fg-2x3x5-r25", "fg-2x4x4-r26", "fg-2x4x5-r33", "fg-2x5x5-r40", "fg-3x3x3-r23",
            "fg-3x3x3-r23-b", "fg-3x3x5-r36", "fg-3x4x5-r47", "fg-3x5x5-r58", "fg-4x4x4-r49",
            "fg-4x4x5-r61", "fg-4x5x5-r76", "fg-4x5x5-r76-b", "fg-5x5x5-r93"]
FGR_ADDITIONS = {
    "fgr-2x2x2-r7": 15, "fgr-2x2x3-r11": 20, "fgr-2x2x4-r14": 31, "fgr-2x2x5-r18": 33,
    "fgr-2x3x3-r15": 46, "fgr-2x3x4-r20": 58, "fgr-2x3x5-r25": 71, "fgr-2x4x4-r26": 92,
    "fgr-2x4x5-r33": 112, "fgr-2x5x5-r40": 153, "fgr-3x3x3-r23": 58, "fgr-3x3x3-r23-b": 58,
    "fgr-3x3x3-r23-c": 58, "fgr-3x3x3-r23-d": 60, "fgr-3x3x4-r29": 92, "fgr-3x3x5-r36": 123,
    "fgr-3x4x4-r38": 133, "fgr-3x4x5-r47": 161, "fgr-3x5x5-r58": 221, "fgr-4x4x4-r49": 159,
    "fgr-4x4x5-r61": 233, "fgr-4x5x5-r76": 299, "fgr-5x5x5-r93": 383}
FILES = {"alphatensor.json": AT_NAMES, "flipgraph.json": FG_NAMES,
         "flipgraph_reduced.json": list(FGR_ADDITIONS), "classic.json": ["laderman"]}


def _doc(fname):
    return json.loads((DATA / fname).read_text())


def _data_names():
    return [d["name"] for f in sorted(FILES) for d in _doc(f)["algorithms"]]


# ---- every entry, exactly ------------------------------------------------------------------

@pytest.mark.parametrize("name", _data_names())
def test_entry_verifies_exactly(name):
    alg = catalogue.get(name)
    assert brent_failures(alg) == []
    assert alg.is_integral and alg.is_ternary
    assert all(d in (2, 3, 4, 5) for d in alg.grid)
    assert alg.R < alg.naive_rank
    assert alg.source
    # the name carries the grid and the rank
    if name != "laderman":
        body = name.split("-")
        assert body[1] == f"{alg.m}x{alg.k}x{alg.n}" and body[2] == f"r{alg.R}"


@pytest.mark.parametrize("name", list(FGR_ADDITIONS))
def test_reduced_programs_compute_the_coefficients(name):
    alg = catalogue.get(name)
    want = combine_matrices(alg)
    total = 0
    for stage in "ABH":
        lp = LinearProgram.from_dict(alg.programs[stage])
        got = lp.matrix()
        assert got.shape == want[stage].shape
        assert (got == want[stage]).all(), f"{name}: stage {stage}"
        assert lp.scalings == 0
        total += lp.additions
    assert total == FGR_ADDITIONS[name] == alg.programs["published_additions"]
    assert check_programs(alg) is alg


def test_published_addition_counts_of_the_paper():
    for name, want in {"fgr-2x2x2-r7": 15, "fgr-3x3x3-r23": 58, "fgr-3x4x5-r47": 161,
                       "fgr-4x4x4-r49": 159}.items():
        d = next(x for x in _doc("flipgraph_reduced.json")["algorithms"] if x["name"] == name)
        assert d["published_additions"] == want


def test_data_files_load_through_the_importer():
    for fname, names in FILES.items():
        algs = load_file(DATA / fname)
        assert [a.name for a in algs] == names
        for a in algs:
            assert a == catalogue.get(a.name)


# ---- names, counts, provenance -------------------------------------------------------------

def test_names_are_stable():
    for fname, names in FILES.items():
        assert [d["name"] for d in _doc(fname)["algorithms"]] == names, fname
    base = catalogue.base_names()
    for names in FILES.values():
        assert set(names) <= set(base)
    assert len(set(_data_names())) == len(_data_names())


def test_counts_per_source():
    counts = {f: len(_doc(f)["algorithms"]) for f in FILES}
    assert all(c > 0 for c in counts.values())
    assert counts == {"alphatensor.json": 12, "flipgraph.json": 14,
                      "flipgraph_reduced.json": 23, "classic.json": 1}


def test_file_headers_and_provenance():
    for fname in FILES:
        doc = _doc(fname)
        assert doc["format"] == "lcmac-catalogue/1"
        assert doc["source"] and doc["license"]
    assert "CC BY 4.0" in _doc("alphatensor.json")["license"]
    for f in ("flipgraph.json", "flipgraph_reduced.json", "classic.json"):
        assert "MIT" in _doc(f)["license"]
    for d in _doc("alphatensor.json")["algorithms"]:
        assert "factorizations_r.npz" in d["source"] and "CC BY 4.0" in d["source"]
    for f in ("flipgraph.json", "flipgraph_reduced.json"):
        for d in _doc(f)["algorithms"]:
            assert "FastMatrixMultiplication" in d["source"] and "MIT" in d["source"]
    assert "Laderman" in catalogue.get("laderman").source
    assert "Bull. AMS 82 (1976)" in catalogue.get("laderman").source


def test_skipped_alphatensor_keys_are_documented():
    skipped = {s["key"]: s["reason"] for s in _doc("alphatensor.json")["skipped"]}
    for key in ("2,4,5", "3,3,3", "3,3,4", "3,3,5", "3,4,4", "3,4,5", "4,4,5", "5,5,5"):
        assert "not all in" in skipped[key]
    assert skipped["2,2,6"] == "grid outside 2..5"


def test_notice_attributes_the_data():
    notice = (ROOT / "NOTICE").read_text()
    assert "CC BY 4.0" in notice and "DeepMind" in notice and "Nature 610" in notice
    assert "Copyright (c) 2025 Andrew Perminov" in notice
    assert "Permission is hereby granted, free of charge" in notice  # the MIT licence text


def test_data_files_stay_small():
    assert sum(f.stat().st_size for f in DATA.glob("*.json")) < 3 * 2 ** 20


def test_rational_scheme_verifies_exactly_and_is_attributed():
    """rational.json holds schemes outside the {-1, 0, 1} rule: exact verification admits them."""
    doc = _doc("rational.json")
    assert doc["format"] == "lcmac-catalogue/1" and doc["license"]
    assert [d["name"] for d in doc["algorithms"]] == ["dps-4x4x4-r48"]
    alg = catalogue.get("dps-4x4x4-r48")
    assert (alg.grid, alg.R) == ((4, 4, 4), 48)
    assert brent_failures(alg) == []
    assert alg.is_ternary is False                      # W holds ±1/2, ±1/4, ±1/8
    dens = {x.denominator for x in alg.W.flat if x != 0 and not isinstance(x, int)}
    assert dens == {2, 4, 8}                            # exact in binary floating point
    assert alg.naive_additions()["total"] == 960        # the catalogue's a960
    assert "Dumas" in alg.source and "Sedoglavic" in alg.source
    assert "Dumas, Pernet and Sedoglavic" in (ROOT / "NOTICE").read_text()


def test_laderman_is_the_classical_scheme():
    lad = catalogue.get("laderman")
    assert (lad.grid, lad.R) == ((3, 3, 3), 23)
    assert lad.naive_additions()["total"] == 98  # the file name's count: Laderman-333-23-98


def test_known_ranks():
    assert catalogue.get("at-4x4x4-r49").R == 49
    assert catalogue.get("fg-4x4x5-r61").R == 61        # flip-graph beats AlphaTensor's 63
    assert catalogue.get("fgr-5x5x5-r93").R == 93
    # schemes compose and change grid like any other catalogue entry
    assert catalogue.get("fg-3x4x5-r47@5x3x4").grid == (5, 3, 4)
    assert verify(catalogue.get("fgr-2x2x2-r7*at-2x2x3-r11")).R == 77


# ---- tampering -----------------------------------------------------------------------------

def _entry(fname, name):
    return copy.deepcopy(next(d for d in _doc(fname)["algorithms"] if d["name"] == name))


def test_tampered_coefficient_fails_with_the_equation_named(tmp_path):
    d = _entry("flipgraph.json", "fg-3x4x5-r47")
    r, i, j = next((r, i, j) for r in range(47) for i in range(3) for j in range(5)
                   if d["W"][r][i][j] != 0)
    d["W"][r][i][j] = 0
    with pytest.raises(VerificationError, match=rf"Brent equation for .* in C\[{i}\]\[{j}\]"):
        verify(Algorithm.from_dict(d))
    doc = {"format": "lcmac-catalogue/1", "source": "test", "license": "test", "algorithms": [d]}
    p = tmp_path / "tampered.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(VerificationError) as ei:
        load_file(p)
    msg = str(ei.value)
    assert str(p) in msg and "fg-3x4x5-r47" in msg and "Brent equation" in msg


def test_tampered_program_is_caught(tmp_path):
    d = _entry("flipgraph_reduced.json", "fgr-2x2x2-r7")
    d["programs"]["H"]["outputs"][0][0][0] *= -1
    d["format"] = "lcmac-algorithm/1"
    p = tmp_path / "prog.json"
    p.write_text(json.dumps(d))
    with pytest.raises(VerificationError, match="program for stage H disagrees"):
        load_file(p)


def test_corrupt_catalogue_entry_is_reported(monkeypatch):
    d = _entry("alphatensor.json", "at-2x2x2-r7")
    d["U"][0][0][0] = "x"
    d["name"] = "at-broken"
    entries = dict(catalogue._data_entries())
    entries["at-broken"] = (d, "alphatensor.json")
    monkeypatch.setattr(catalogue, "_data_entries", lambda: entries)
    catalogue._base.cache_clear()
    try:
        with pytest.raises(CatalogueError, match="at-broken.*corrupt.*not a number"):
            catalogue.get.__wrapped__("at-broken")
    finally:
        catalogue._base.cache_clear()


def test_to_dict_does_not_share_the_programs():
    """Editing an algorithm's dict form leaves the algorithm (a value) unchanged."""
    alg = catalogue.get("fgr-2x2x2-r7")
    d = alg.to_dict()
    d["programs"]["A"] = {"n_inputs": 4}
    assert "temps" in catalogue.get("fgr-2x2x2-r7").programs["A"]
