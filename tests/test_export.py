"""lcmac export: shapes and weights decided and compiled ahead of time into one bundle with the
C header; lcmac.load runs it; cases from the command line and from JSON (an optimize report
included)."""
import json

import numpy as np
import pytest

import lcmac
from lcmac.artifact.bundle import read_bundle
from lcmac.cli.main import main
from lcmac.core.errors import LcmacError, ShapeError
from lcmac.api.export import cases_from_json, export


def _check(f, M, N, K, seed=0):
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((M, K)).astype(np.float32)
    B = rng.standard_normal((K, N)).astype(np.float32)
    R = A.astype(np.float64) @ B
    assert np.abs(f(A, B) - R).max() / np.abs(R).max() < 1e-5


def test_export_two_shapes_and_a_weight(tmp_path, capsys):
    out = tmp_path / "bundle"
    assert main(["export", "96x80x64", "?x48x40", "--rows", "64,16", "-o", str(out)]) == 0
    assert "exported 2 shape(s)" in capsys.readouterr().out
    b = read_bundle(out)
    assert {str(r.rule) for r in b.rules} == {"exact:96x80x64", "rows:?x48x40"}
    assert (out / "lcmac.h").is_file() and len(b.kernels) == 3
    idx = json.loads((out / "bundle.json").read_text())
    assert [d["rule"] for d in idx["decisions"]] == ["exact:96x80x64", "rows:?x48x40"]
    assert all(d["why"] for d in idx["decisions"])
    f = lcmac.load(out)
    _check(f, 96, 80, 64)
    for M in (1, 16, 100):
        _check(f, M, 48, 40, seed=M)
    with pytest.raises(ShapeError, match="admits"):
        _check(f, 95, 80, 64)


def test_export_forced_algorithm(tmp_path):
    path = export(["?x48x40"], None, "float32", tmp_path, rows=(32,), algo="strassen")
    b = read_bundle(path)
    assert b.rules[0].algorithm == "strassen"
    _check(lcmac.load(path), 50, 48, 40)


def test_cases_from_json(tmp_path):
    (tmp_path / "list.json").write_text('["64x64x64", "?x32x16"]')
    assert cases_from_json(tmp_path / "list.json") == ["64x64x64", "?x32x16"]
    (tmp_path / "obj.json").write_text('{"shapes": ["8x8x8"]}')
    assert cases_from_json(tmp_path / "obj.json") == ["8x8x8"]
    report = {"rows": 4096, "swapped": [{"name": "fc", "shape": [1024, 4096]}], "skipped": []}
    (tmp_path / "report.json").write_text(json.dumps(report))
    assert cases_from_json(tmp_path / "report.json") == ["?x4096x1024"]     # (in, out) → ?xNxK
    (tmp_path / "bad.json").write_text('{"nothing": 1}')
    with pytest.raises(ShapeError, match="list of shapes"):
        cases_from_json(tmp_path / "bad.json")
    with pytest.raises(LcmacError, match="cannot read"):
        cases_from_json(tmp_path / "missing.json")


def test_export_refuses_what_it_cannot_serve(tmp_path, capsys):
    with pytest.raises(ShapeError, match="any shape"):
        export(["?x?x?"], None, "float32", tmp_path)
    assert main(["export", "-o", str(tmp_path)]) != 0
    assert "needs shapes" in capsys.readouterr().err
