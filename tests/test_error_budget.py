"""One default error budget: every decision keeps to the dtype's unless asked otherwise,
``max_error=inf`` lifts it, and what is in force is said (the plan's why, ``lcmac select``'s
text and JSON).  The accuracy model is the real one; planning compiles nothing."""
import json
import math

import numpy as np
import pytest

import lcmac
from lcmac.api import matmul as ops
from lcmac.cli.main import main
from lcmac.core.errors import LcmacError
from lcmac.costmodel import decision
from lcmac.costmodel.accuracy import error_ratio
from lcmac.costmodel.error_budget import (
    DEFAULT_BUDGET_BITS, check_budget_arg, default_max_error, error_budget)
from lcmac.policy import EveryKernel, planner

CPU = "x86_64-avx512"
SMIRNOV = "smirnov-3x3x6-r40"
SHAPE = (8192, 8192, 8192)       # where the model ranks SMIRNOV first in float32 on CPU


def test_default_is_the_bits_of_each_dtype_and_inf_lifts_it():
    # the 16-bit formats may lose what fp8 E4M3 would (4 bits), the wide ones 2
    for d, bits in (("bfloat16", 4), ("float16", 4), ("float32", 2), ("float64", 2),
                    ("tfloat32", 2)):
        assert DEFAULT_BUDGET_BITS[d] == bits and default_max_error(d) == 2.0 ** bits
        assert error_budget(None, d).source == "default"
    assert "at most 4 bits lost" in error_budget(None, "bfloat16").describe()
    assert error_budget(math.inf, "float32").max_error is None
    assert error_budget(3, "float32").to_dict() == {"max_error": 3.0, "source": "asked"}
    assert check_budget_arg(None) is None and check_budget_arg(math.inf) == math.inf
    for bad in (0, -1, float("nan"), True, "4"):
        with pytest.raises(ValueError, match="max_error"):
            check_budget_arg(bad)


def test_default_budget_refuses_what_loses_more_and_inf_lifts_it(monkeypatch):
    monkeypatch.setattr(planner, "_plans", {})
    ratio = error_ratio(SMIRNOV, "float32").ratio
    assert ratio > default_max_error("float32")             # the case: ~7.6x float32's GEMM error
    with pytest.raises(LcmacError, match=r"over max_error=4 \(the default budget\).*inf"):
        planner.plan(*SHAPE, "float32", CPU, algo=SMIRNOV)
    p = planner.plan(*SHAPE, "float32", CPU, algo=SMIRNOV, max_error=math.inf)
    assert p.runs == SMIRNOV and p.error == pytest.approx(ratio, rel=0.05)
    assert p.max_error is None and "no error budget" in p.why
    # in bf16 the same scheme (~14.8x) is within the 16x default; Winograd³ (~32x) is not
    assert error_ratio(SMIRNOV, "bfloat16").ratio < default_max_error("bfloat16")
    assert planner.plan(*SHAPE, "bfloat16", CPU, algo=SMIRNOV).runs == SMIRNOV
    with pytest.raises(LcmacError, match=r"over max_error=16 \(the default budget\)"):
        planner.plan(*SHAPE, "bfloat16", CPU, algo="winograd^3")


def test_auto_plans_keep_to_the_default_budget_and_say_so(monkeypatch):
    monkeypatch.setattr(planner, "_plans", {})
    p = ops.plan(2048, 2048, 2048, target=CPU)            # an LCMA measured here
    assert p.max_error == default_max_error("float32") and p.error <= p.max_error
    assert p.budget in p.why and "float32 default" in p.why
    asked = ops.plan(2048, 2048, 2048, target=CPU, max_error=3.0)
    assert "error budget 3×" in asked.why and asked.max_error == 3.0
    assert asked.to_dict()["budget"] == asked.budget


def test_select_refuses_smirnov_in_float32_by_default_and_shows_the_budget(capsys, monkeypatch):
    # the model's ranking restricted to the scheme in question and one more, so that only
    # two predicted errors are simulated
    names = (SMIRNOV, "strassen")
    monkeypatch.setattr(decision, "candidate_names", lambda levels=(1, 2): names)
    argv = ["select", "--shape", "x".join(map(str, SHAPE)), "--target", CPU, "--dtype",
            "float32", "--top", "3"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert f"decision: {SMIRNOV}" not in out and "over the error budget (4×" in out
    assert "error budget 4× the plain GEMM's error (the float32 default" in out
    assert main(argv + ["--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["max_error"] == 4.0 and doc["decision"]["algorithm"] != SMIRNOV
    assert "default" in doc["budget"]
    assert main(argv + ["--json", "--max-error", "inf"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["decision"]["algorithm"] == SMIRNOV and doc["max_error"] is None
    assert doc["decision"]["error_ratio"] > 4.0


def test_matmul_and_linear_take_inf(monkeypatch):
    monkeypatch.setattr(planner, "_plans", {})
    A = np.ones((3, 5), np.float32)
    B = np.ascontiguousarray(A.T)
    assert np.array_equal(lcmac.matmul(A, B, max_error=math.inf), A @ B)
    layer = lcmac.nn.Linear(4, 4, max_error=math.inf)
    assert layer.max_error == math.inf
    with pytest.raises(ValueError, match="max_error"):
        lcmac.matmul(A, B, max_error=0)


def test_decision_for_a_bundle_keeps_the_budget(monkeypatch):
    monkeypatch.setattr(planner, "_plans", {})
    p = planner.plan(4096, 4096, 4096, "float32", CPU, vendor=False, kernels=EveryKernel())
    assert p.max_error == default_max_error("float32") and p.budget in p.why
