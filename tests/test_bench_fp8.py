"""scripts/bench_fp8.py without a GPU: its plan (--list) and how it judges the targets."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_fp8", ROOT / "scripts" / "bench_fp8.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_list_plans_every_shape_and_scheme_in_the_fp8_mode(bench, capsys):
    assert bench.main(["--list", "--sustained", "5"]) == 0
    doc = json.loads(capsys.readouterr().out)
    shapes = {tuple(s) for s in doc["shapes"]}
    want = {(8192, 8192, 8192), (16384, 16384, 16384)}
    for M in (16384, 32768):                      # 70B-class MLP up and down projections
        want |= {(M, 28672, 8192), (M, 8192, 28672)}
    assert shapes == want
    assert {b["algorithm"] for b in doc["builds"]} == {"gemm", "strassen", "winograd"}
    assert len(doc["builds"]) == 3 * len(want)
    assert all(b["config"]["operands"] == "fp8" for b in doc["builds"])
    assert all(b["config"].get("fused") is False for b in doc["builds"] if b["algorithm"] != "gemm")
    assert doc["sustained_s"] == 5.0 and doc["target"] == "cuda-sm90a"


def test_bad_sustained_is_a_usage_error(bench):
    with pytest.raises(SystemExit):
        bench.main(["--list", "--sustained", "0"])


def test_targets_are_judged_at_their_shape_only(bench):
    res = {"lcmac-gemm-fp8": {"vs_cublas_fp8": 0.98}, "lcmac-strassen-fp8": {"vs_cublas_fp8": 1.05},
           "lcmac-winograd-fp8": {"vs_cublas_fp8": 1.09}, "cublas-fp8-1x128,128x128": {"vs_cublas_fp8": 1.0}}
    got = bench._judged((16384, 16384, 16384), res)
    assert got["lcmac-gemm-fp8"]["met"] and got["lcmac-gemm-fp8"]["vs_cublas_fp8"] == 0.98
    assert got["lcmac-lcma-fp8"] == {"variant": "lcmac-winograd-fp8", "vs_cublas_fp8": 1.09,
                                     "target": 1.08, "met": True}
    res["lcmac-winograd-fp8"]["vs_cublas_fp8"] = 1.0
    assert not bench._judged((16384, 16384, 16384), res)["lcmac-lcma-fp8"]["met"]
    assert bench._judged((8192, 8192, 8192), res) == {}


def test_a_scheme_with_knobs_is_its_own_build(bench, capsys):
    """``gemm+block_n=192+stages=5``: the plain GEMM with those CudaConfig knobs, its own
    artifact tag, judged as the plain GEMM; a knob without a value is a usage error."""
    assert bench._config("gemm+block_n=192+stages=5+store_via_smem=true") == \
        {"operands": "fp8", "block_n": 192, "stages": 5, "store_via_smem": True}
    assert bench._config("strassen+policy=fullcol") == {"operands": "fp8", "fused": False, "policy": "fullcol"}
    assert bench.main(["--list", "--algos", "gemm,gemm+block_n=192", "--shapes", "8192x8192x8192"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [(b["algorithm"], b["tag"]) for b in doc["builds"]] == [
        ("gemm", "gemm-fp8-8192x8192x8192"), ("gemm+block_n=192", "gemm_block_n_192-fp8-8192x8192x8192")]
    res = {"lcmac-gemm-fp8": {"vs_cublas_fp8": 0.9}, "lcmac-gemm+block_n=192-fp8": {"vs_cublas_fp8": 0.98},
           "lcmac-strassen+block_n=192-fp8": {"vs_cublas_fp8": 1.0}}
    got = bench._judged((16384, 16384, 16384), res)
    assert got["lcmac-gemm-fp8"]["variant"] == "lcmac-gemm+block_n=192-fp8" and got["lcmac-gemm-fp8"]["met"]
    assert got["lcmac-lcma-fp8"]["variant"] == "lcmac-strassen+block_n=192-fp8"
    with pytest.raises(SystemExit):
        bench._split("gemm+stages")
