"""The commands agree with each other: the same default target, --json on every command that
produces a result, output directories checked before compiling, shapes and exit statuses
reported the same way, and `lcmac verify` honest about GF(2) schemes."""
import importlib
import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from lcmac.artifact.build import resolve_target
from lcmac.cli.exit_codes import EPILOG
from lcmac.ir import catalogue
from lcmac.tune import tuner
from tests.ir.test_importers import at_factors, save_npz

ROOT = Path(__file__).resolve().parents[2]
cli = importlib.import_module("lcmac.cli.main")   # the module: lcmac.cli.main is also the function


def run(capsys, *argv):
    """Exit status, stdout and stderr of one command; argparse's exits included."""
    try:
        code = cli.main(list(argv))
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def strict_json(text: str) -> dict:
    """One JSON object, refusing NaN and Infinity as strict readers (jq, browsers) do."""
    def refuse(name):
        raise ValueError(f"{name} is not JSON")
    return json.loads(text, parse_constant=refuse)


# ---- one default target ------------------------------------------------------------------

def test_select_defaults_to_the_target_build_picks(capsys):
    here = resolve_target(None).name
    code, out, _ = run(capsys, "select", "--shape", "64x64x64", "--top", "1", "--no-error", "--json")
    assert code == 0 and strict_json(out)["target"] == here
    code, out, _ = run(capsys, "select", "--shape", "64x64x64", "--top", "1", "--no-error",
                       "--json", "--target", "host")
    assert code == 0 and strict_json(out)["target"] == here


# ---- shapes --------------------------------------------------------------------------------

COMMANDS_WITH_SHAPES = [["select"], ["build", "--algo", "gemm"], ["tune"],
                        ["distribute", "--ranks", "2"]]


@pytest.mark.parametrize("command, shape, bad", [
    *[(c, s, b) for c in COMMANDS_WITH_SHAPES
      for s, b in (("0x1024x1024", "'0'"), ("-5x3x3", "'-5'"), ("1.5x2x2", "'1.5'"))],
    (["build", "--algo", "gemm"], "?x0x64", "'0'")])            # a shape rule's N
def test_a_bad_dimension_is_named(capsys, command, shape, bad):
    code, _, err = run(capsys, *command, "--shape", shape)
    assert code == 2
    assert "dimensions must be positive integers" in err and f"not {bad}" in err


def test_export_names_a_bad_dimension_too(capsys):
    code, _, err = run(capsys, "export", "0x1024x1024", "-o", "unused")
    assert code == 2 and "dimensions must be positive integers, not '0'" in err


# ---- output directories ----------------------------------------------------------------------

@pytest.fixture
def no_compiling(monkeypatch):
    """Every way the commands compile, replaced by a failure: a test using this shows that
    the command stopped before compiling."""
    def compiled(*a, **kw):
        raise AssertionError("compiled although the output directory is unusable")
    for name in ("build", "build_bundle", "build_bits", "export"):
        monkeypatch.setattr(cli, name, compiled)


def _bad_output_commands(out: str) -> list[list[str]]:
    return [["build", "--algo", "gemm", "--shape", "16x16x16", "-o", out],
            ["build", "--algo", "strassen", "-o", out],                       # a bundle
            ["build", "--algo", "winograd", "--dtype", "gf2", "-o", out],     # bit kernels
            ["export", "16x16x16", "-o", out]]


def _one_line_naming(err: str, path) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0], err
    assert "Traceback" not in err and "compiler failed" not in err


@pytest.mark.parametrize("where", ["a file", "below a file"])
def test_an_impossible_output_directory_fails_before_compiling(capsys, tmp_path, no_compiling, where):
    (tmp_path / "f").write_text("")
    out = tmp_path / "f" if where == "a file" else tmp_path / "f" / "sub"
    for argv in _bad_output_commands(str(out)):
        code, stdout, err = run(capsys, *argv)
        assert code == 1 and not stdout, argv
        _one_line_naming(err, out)
        assert "is a file" in err
    code, _, err = run(capsys, "tune", "--shape", "16x16x16", "--build-only", str(out))
    assert code == 1
    _one_line_naming(err, out)


def _make_unwritable(d: Path) -> bool:
    """``d`` made to refuse new files: immutable for root (who ignores permission bits),
    read-only otherwise; False where this system allows neither."""
    if os.geteuid() == 0:
        try:
            subprocess.run(["chattr", "+i", str(d)], check=True, capture_output=True)
        except (OSError, subprocess.CalledProcessError):
            return False
    else:
        d.chmod(0o500)
    try:
        (d / "probe").write_text("")
    except OSError:
        return True
    (d / "probe").unlink()
    return False


def _make_writable(d: Path) -> None:
    if os.geteuid() == 0:
        subprocess.run(["chattr", "-i", str(d)], capture_output=True)
    d.chmod(0o700)


def test_an_unwritable_output_directory_fails_before_compiling(capsys, tmp_path, no_compiling):
    ro = tmp_path / "ro"
    ro.mkdir()
    if not _make_unwritable(ro):
        pytest.skip("this system cannot make a directory refuse writes (no chattr, or no rights)")
    try:
        for argv in _bad_output_commands(str(ro)) + _bad_output_commands(str(ro / "new")):
            code, stdout, err = run(capsys, *argv)
            assert code == 1 and not stdout, argv
            _one_line_naming(err, argv[-1])
            assert "not writable" in err or "cannot be created" in err
    finally:
        _make_writable(ro)


# ---- exit statuses ---------------------------------------------------------------------------

def test_usage_errors_exit_2_and_failures_exit_1(capsys, tmp_path):
    assert run(capsys, "build", "--no-such-option")[0] == 2
    assert run(capsys, "select", "--shape", "64x64x64", "--target", "tpu")[0] == 2
    assert run(capsys, "show", "nope")[0] == 2
    assert run(capsys, "distribute", "--shape", "64x64x64", "--ranks", "0")[0] == 2
    garbage = tmp_path / "garbage.json"
    garbage.write_text("{not json")
    code, _, err = run(capsys, "verify", str(garbage))
    assert code == 1 and "garbage.json" in err
    code, out, _ = run(capsys, "--help")
    assert code == 0 and "exit status:" in out
    assert all(line in out for line in EPILOG.splitlines())


def test_the_exit_statuses_are_documented(capsys):
    page = (ROOT / "docs" / "cli.md").read_text()
    section = page.split("## Exit status", 1)[1].split("\n## ", 1)[0]
    for code in ("0", "1", "2"):
        assert f"`{code}`" in section


# ---- --json on build and tune ----------------------------------------------------------------

class _Point:
    """The part of a tuning point that the tune command reports."""

    def __init__(self, algorithm: str, predicted_s: float):
        self.algorithm, self.predicted_s, self.key = algorithm, predicted_s, algorithm

    def config_dict(self) -> dict:
        return {"mc": 64}


def test_tune_json_is_one_strict_object_and_progress_is_on_stderr(capsys, tmp_path, monkeypatch):
    def fake_tune(algo, target, dtype, shape, **kw):
        r = tuner.TuneResult(target, dtype, shape)
        r.trials = [tuner.Trial(_Point("gemm", 1e-3), 1.2e-3),
                    tuner.Trial(_Point("strassen", 9e-4), None, status="error", error="boom")]
        return r
    monkeypatch.setattr(tuner, "tune", fake_tune)
    code, out, err = run(capsys, "tune", "--algo", "gemm,strassen", "--shape", "256x256x256",
                         "--logs", str(tmp_path), "-q", "--json")
    doc = strict_json(out)
    assert code == 0 and doc["schema"] == "lcmac-tune/1" and doc["ok"]
    assert doc["target"] == resolve_target(None).name          # the default, as build's
    (res,) = doc["results"]
    assert res["shape"] == {"M": 256, "N": 256, "K": 256}
    assert res["best"]["algorithm"] == "gemm" and res["best"]["time_s"] == 1.2e-3
    assert res["failures"] == ["boom"]
    assert res["algorithms"][0]["spearman"] is None                # NaN: one trial only
    assert "[1/1] tuning 256x256x256" in err


def test_build_json_is_one_object(capsys, tmp_path, monkeypatch):
    """The plain GEMM's smallest build, from the session's kernel cache."""
    from lcmac.artifact.cache import cached_build
    from lcmac.artifact.manifest import Manifest

    def from_cache(algo, target, dtype, shape, **kw):
        return cached_build(algo, target, dtype, shape).manifest
    monkeypatch.setattr(cli, "build", from_cache)
    code, out, _ = run(capsys, "build", "--algo", "gemm", "--shape", "16x16x16",
                       "-o", str(tmp_path), "--json")
    doc = strict_json(out)
    m = Manifest.read(doc["manifest"])
    assert code == 0 and doc["schema"] == "lcmac-build/1" and doc["kind"] == "artifact"
    assert doc["sha256"] == m.library["sha256"] and Path(doc["library"]).is_file()
    assert doc["shape"] == {"M": 16, "N": 16, "K": 16} and doc["rank"] == 1
    assert doc["predicted_error"] is None                           # the plain GEMM adds none


# ---- verify over GF(2) ---------------------------------------------------------------------

def _strassen_npz(tmp_path, name: str, edit) -> Path:
    """Strassen in AlphaTensor's .npz layout, ``edit`` applied to its factor u."""
    u, v, w = at_factors(catalogue.get("strassen"))
    u = u.copy()
    edit(u)
    path = tmp_path / name
    save_npz(path, {"2,2,2": (u, v, w)})
    return path


def _flip_a_minus(u):                 # over GF(2) -1 == 1: still correct there, not over Z
    r, c = np.argwhere(u == -1)[0]
    u[r, c] = 1


def _drop_a_term(u):                  # wrong in every ring
    r, c = np.argwhere(u != 0)[0]
    u[r, c] = 0


def test_verify_recognises_a_scheme_that_holds_only_modulo_2(capsys, tmp_path):
    p = _strassen_npz(tmp_path, "factorizations_f2.npz", _flip_a_minus)
    code, out, _ = run(capsys, "verify", str(p), "--json")
    (auto,) = strict_json(out)["results"]
    assert code == 0 and auto["exact"] and auto["ring"] == "gf2"
    assert auto["n_rational_failures"] > 0
    code, out, _ = run(capsys, "verify", str(p))
    assert code == 0 and "modulo 2 only" in out and "fail over the rationals" in out
    code, out, _ = run(capsys, "verify", str(p), "--field", "gf2", "--json")
    assert code == 0 and strict_json(out)["results"][0]["ring"] == "gf2"
    code, out, _ = run(capsys, "verify", str(p), "--field", "rational", "--json")
    (r,) = strict_json(out)["results"]
    assert code == 1 and r["ring"] == "rationals"
    assert r["n_failures"] == auto["n_rational_failures"]


def test_verify_fails_a_wrong_scheme_in_both_rings(capsys, tmp_path):
    p = _strassen_npz(tmp_path, "wrong.npz", _drop_a_term)
    code, out, _ = run(capsys, "verify", str(p), "--json")
    (r,) = strict_json(out)["results"]
    assert code == 1 and r["ring"] == "rationals" and r["n_rational_failures"] is None
    code, out, _ = run(capsys, "verify", str(p), "--field", "gf2")
    assert code == 1 and "fail modulo 2" in out and "(mod 2)" in out


def test_verify_keeps_rational_schemes_rational(capsys, tmp_path):
    p = _strassen_npz(tmp_path, "strassen.npz", lambda u: None)
    code, out, _ = run(capsys, "verify", str(p), "--json")
    (r,) = strict_json(out)["results"]
    assert code == 0 and r["ring"] == "rationals" and r["n_rational_failures"] is None
    code, _, err = run(capsys, "verify", "dps-4x4x4-r48", "--field", "gf2")   # halves: no image mod 2
    assert code == 1 and "even denominator" in err and len(err.strip().splitlines()) == 1
