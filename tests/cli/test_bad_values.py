"""A malformed value on the command line is a usage error (exit status 2) in one line that
names the option and what is wrong, before anything is decided or compiled: --config JSON,
--max-error, counts, --sustained, options that do not go together, and shapes that begin
with '-' wherever a shape is given."""
import importlib

import pytest

from lcmac.core.errors import LcmacError
from lcmac.spec.shape_rules import parse_rule
from tests.cli.test_consistent_commands import run, strict_json

cli = importlib.import_module("lcmac.cli.main")
CUDA = "cuda-sm90a"          # model and argument checks only: nothing here builds for it


def _usage_error(code, err, *words) -> str:
    """The one error line of a usage error, checked to hold ``words``."""
    errors = [line for line in err.splitlines() if "error:" in line]
    assert code == 2 and len(errors) == 1 and "Traceback" not in err, err
    assert all(w in errors[0] for w in words), errors[0]
    return errors[0]


@pytest.fixture
def no_compiling(monkeypatch):
    def compiled(*a, **kw):
        raise AssertionError("compiled although the command line is wrong")
    for name in ("build", "build_bundle", "build_bits", "export"):
        monkeypatch.setattr(cli, name, compiled)


# ---- --config ------------------------------------------------------------------------------

@pytest.mark.parametrize("target", [None, CUDA])
@pytest.mark.parametrize("config, what", [("{bad", "is not JSON"), ("[1]", "not an object"),
                                          ("5", "not an object")])
def test_a_bad_config_is_a_usage_error_on_every_target(capsys, tmp_path, no_compiling,
                                                       target, config, what):
    argv = ["build", "--algo", "gemm", "--shape", "64x64x64", "--config", config,
            "-o", str(tmp_path / "out")]
    code, _, err = run(capsys, *argv, *(["--target", target] if target else []))
    _usage_error(code, err, "--config", what)
    assert not (tmp_path / "out").exists()


def test_a_config_operand_mode_the_precision_refuses_is_a_usage_error(capsys, tmp_path,
                                                                       no_compiling):
    for config, option in (('{"operands": "native"}', "--config operands=native"),
                           ('{"tf32_wgmma": true}', "--config tf32_wgmma")):
        code, _, err = run(capsys, "build", "--algo", "gemm", "--shape", "64x64x64",
                           "--target", CUDA, "--precision", "highest", "--config", config,
                           "-o", str(tmp_path / "out"))
        _usage_error(code, err, option, "--precision highest", "'high' or 'medium'")
        assert not (tmp_path / "out").exists()          # made by the check, removed again


def test_select_operands_the_precision_refuses_is_a_usage_error(capsys):
    code, _, err = run(capsys, "select", "--shape", "64x64x64", "--target", CUDA,
                       "--precision", "highest", "--operands", "native", "--no-error")
    _usage_error(code, err, "--operands native", "--precision highest")
    code, out, _ = run(capsys, "select", "--shape", "64x64x64", "--target", CUDA,
                       "--precision", "high", "--operands", "native", "--no-error", "--json")
    assert code == 0 and strict_json(out)["operands"] == "native"


# ---- numbers -------------------------------------------------------------------------------

@pytest.mark.parametrize("value", ["-1", "0", "nan", "four"])
@pytest.mark.parametrize("command", [["select", "--shape", "64x64x64", "--no-error"],
                                     ["export", "64x64x64", "-o", "unused"],
                                     ["tune", "--shape", "64x64x64", "--dry-run", "-q"]])
def test_a_bad_error_budget_is_a_usage_error(capsys, no_compiling, command, value):
    code, _, err = run(capsys, *command, f"--max-error={value}")
    _usage_error(code, err, "--max-error", "positive multiple")


def test_an_infinite_error_budget_lifts_it(capsys):
    code, out, _ = run(capsys, "select", "--shape", "64x64x64", "--no-error", "--top", "1",
                       "--max-error", "inf", "--json")
    doc = strict_json(out)
    assert code == 0 and doc["max_error"] is None and doc["candidates"]


@pytest.mark.parametrize("argv", [
    ["select", "--shape", "64x64x64", "--no-error", "--top", "0"],
    ["tune", "--shape", "64x64x64", "--dry-run", "--jobs", "0"],
    ["tune", "--shape", "64x64x64", "--dry-run", "--budget", "-1"],
    ["tune", "--shape", "64x64x64", "--dry-run", "--repeats", "0"],
    ["tune", "--shapes", "llm-cpu", "--dry-run", "--limit", "0"],
    ["calibrate", "--sizes", "64", "--dry-run", "--budget", "0"],
    ["calibrate", "--sizes", "64", "--dry-run", "--jobs", "two"],
    ["tune", "--shape", "64x64x64", "--dry-run", "--patience", "0"]])
def test_a_count_below_one_is_a_usage_error(capsys, argv):
    code, _, err = run(capsys, *argv)
    _usage_error(code, err, argv[-2], "must be a positive integer")


@pytest.mark.parametrize("argv", [
    ["tune", "--shape", "64x64x64", "--dry-run", "--top-lcmas", "-1"],
    ["calibrate", "--sizes", "64", "--dry-run", "--top-lcmas", "-2"]])
def test_a_negative_lcma_count_is_a_usage_error(capsys, argv):
    code, _, err = run(capsys, *argv)
    _usage_error(code, err, argv[-2], "must be an integer of 0 or more")


def test_a_sustained_warm_up_out_of_range_is_a_usage_error(capsys):
    code, _, err = run(capsys, "tune", "--target", CUDA, "--shape", "64x64x64", "--dry-run",
                       "-q", "--sustained", "100")
    _usage_error(code, err, "--sustained", "(0, 60]")


# ---- shapes that begin with '-' ------------------------------------------------------------

def test_an_export_shape_that_looks_like_an_option_says_how_to_pass_it(capsys, tmp_path,
                                                                       no_compiling):
    out = tmp_path / "bundle"
    code, _, err = run(capsys, "export", "-5x3x3", "-o", str(out))
    line = _usage_error(code, err, "dimensions must be positive integers, not '-5'")
    assert "--shape=-5x3x3" in line and "'--'" in line and "unrecognized" not in err
    code, _, err = run(capsys, "export", "64x64x64", "-5x?x3", "-o", str(out))
    _usage_error(code, err, "shape '-5x?x3'", "not '-5'")
    # passed the ways the message names, the shape itself is what is wrong
    for argv in (["--shape", "-5x3x3"], ["--shape=-5x3x3"], ["--", "-5x3x3"]):
        code, _, err = run(capsys, "export", "-o", str(out), *argv)
        _usage_error(code, err, "dimensions must be positive integers, not '-5'")
    assert not out.exists()


def test_export_takes_shapes_as_the_other_commands_do(capsys, tmp_path, monkeypatch):
    seen = []

    def export(cases, *a, **kw):
        seen.extend(cases)
        raise LcmacError("stopped before compiling")
    monkeypatch.setattr(cli, "export", export)
    code, _, err = run(capsys, "export", "64x64x64", "--shape", "?x128x64", "-o",
                       str(tmp_path / "b"))
    assert code == 1 and "stopped before compiling" in err
    assert seen == [parse_rule("64x64x64"), parse_rule("?x128x64")]


@pytest.mark.parametrize("argv", [["calibrate", "--dry-run"], ["build", "--algo", "gemm"],
                                  ["distribute", "--ranks", "2"]])
def test_a_dashed_shape_option_names_the_dimension(capsys, no_compiling, argv):
    code, _, err = run(capsys, *argv, "--shape", "-5x3x3")
    _usage_error(code, err, "--shape", "not '-5'")
