"""CUDA back end without a GPU: generated source, launch configuration, nvcc compilation.

The TileLang worker runs in a subprocess (TileLang and apache-tvm cannot share a process).
Skipped with a reason when TileLang or nvcc is missing.  Kept to a few compiles (< 2 min).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from fractions import Fraction

import numpy as np
import pytest

from lcmac.schedules.cuda_config import Blocking, CudaConfig, ceil_div

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _have_tilelang() -> bool:
    p = subprocess.run([sys.executable, "-c", "import tilelang"], capture_output=True, cwd=ROOT)
    return p.returncode == 0


def _nvcc():
    from lcmac.targets.cuda import find_nvcc
    try:
        return find_nvcc()
    except Exception:
        return None


needs_tilelang = pytest.mark.skipif(not _have_tilelang(), reason="tilelang is not installed")
needs_nvcc = pytest.mark.skipif(_nvcc() is None, reason="nvcc (CUDA toolkit) is not installed")


def worker(req: dict) -> dict:
    p = subprocess.run([sys.executable, "-m", "lcmac.targets.tilelang_worker"],
                       input=json.dumps(req), capture_output=True, text=True, cwd=ROOT,
                       timeout=600)
    lines = [x for x in p.stdout.splitlines() if x.startswith("{")]
    assert lines, p.stderr[-3000:]
    return json.loads(lines[-1])


def kernel_body(src: str) -> str:
    m = re.search(r"__global__ void __launch_bounds__[^{]*\{", src)
    assert m, "no kernel definition in the generated source"
    depth, i = 1, m.end()
    while depth:
        depth += {"{": 1, "}": -1}.get(src[i], 0)
        i += 1
    return src[m.start():i]


def scaled_strassen():
    """Strassen with Ã_1 scaled by 2 and H_1's W coefficients by 1/2: non-unit constants."""
    from lcmac import ir
    from lcmac.ir.algorithm import Algorithm
    s = ir.get("strassen")
    U = np.array(s.U, dtype=object)
    W = np.array(s.W, dtype=object)
    U[0] = U[0] * 2
    W[0] = W[0] * Fraction(1, 2)
    return Algorithm(s.m, s.k, s.n, U, s.V, W, name="strassen-scaled")


@needs_tilelang
def test_strassen_sources_literals_and_launch(tmp_path):
    alg = scaled_strassen()
    M, N, K = 1000, 1064, 1032            # none divides the 2x2 grid times the tile
    cfg = CudaConfig(fused=True, overlap_epilogue=True)
    r = worker({"algorithm": alg.to_dict(), "target": "cuda-sm90a", "dtype": "bf16",
                "shape": [M, N, K], "config": {"fused": True, "overlap_epilogue": True},
                "out_dir": str(tmp_path), "compile": False})
    assert r["ok"], r.get("error")
    names = [k["name"] for k in r["kernels"]]
    assert names == ["combine_a", "combine_b", "fused_gemm_h"]
    blk = Blocking(M, N, K, 2, 2, 2, 7)
    ks = {k["name"]: k for k in r["kernels"]}
    # launch configuration follows the template
    assert ks["fused_gemm_h"]["grid"] == [ceil_div(blk.Nb, cfg.block_n), ceil_div(blk.Mb, cfg.block_m), 1]
    assert ks["fused_gemm_h"]["block"] == [cfg.threads + 128, 1, 1]  # + TMA producer warpgroup
    assert ks["combine_a"]["grid"] == [ceil_div(blk.Kb, cfg.combine_cols), ceil_div(blk.Mb, cfg.combine_rows), 1]
    assert ks["combine_b"]["grid"] == [ceil_div(blk.Nb, cfg.combine_cols), ceil_div(blk.Kb, cfg.combine_rows), 1]
    assert ks["combine_a"]["block"] == [cfg.combine_threads, 1, 1]
    srcs = {os.path.basename(p): open(p).read() for p in r["sources"]}
    ca = kernel_body(srcs["lcmac_cuda_combine_a.cu"])
    fu = kernel_body(srcs["lcmac_cuda_fused_gemm_h.cu"])
    # coefficients are literals: no tables in memory, no extra kernel parameters
    for body in (ca, fu):
        assert "__constant__" not in body
    assert re.search(r"void __launch_bounds__\(\d+, 1\) \w+\(const bfloat16_t\* __restrict__ X, "
                     r"bfloat16_t\* __restrict__ Xt\)", ca)
    assert "0x1p+1f" in ca            # the 2 of Ã_1 = 2·(A11 + A22)
    assert "0x1p-1f" in fu            # the 1/2 of H_1's contributions
    assert "-0x1p+0f" in fu           # a −1 of Combine H
    # group-parallel combine: each of the m·k inputs read once, all R outputs written
    assert len(re.findall(r"\(X \+ ", ca)) == 4
    assert len(re.findall(r"\(Xt \+ ", ca)) == 7
    # tensor cores on sm_90a: wgmma from TMA-loaded shared memory
    assert "wgmma" in fu and "tma_load" in fu
    # one software pipeline over all (r, k) steps: no block-wide barrier between products
    assert fu.count("__syncthreads") == 1


@needs_tilelang
def test_unfused_and_plain_kernel_counts(tmp_path):
    r = worker({"algorithm": "winograd", "target": "cuda-sm90a", "dtype": "fp16",
                "shape": [512, 512, 512], "config": {"fused": False},
                "out_dir": str(tmp_path / "u"), "compile": False})
    assert r["ok"], r.get("error")
    assert [k["name"] for k in r["kernels"]] == ["combine_a", "combine_b", "batched_gemm", "combine_h"]
    assert r["kernels"][2]["grid"][2] == 7          # one grid slice per product
    g = worker({"algorithm": None, "target": "cuda-sm90a", "dtype": "bf16",
                "shape": [512, 768, 256], "out_dir": str(tmp_path / "g"), "compile": False})
    assert g["ok"], g.get("error")
    assert [k["name"] for k in g["kernels"]] == ["gemm"]
    assert g["kernels"][0]["grid"] == [ceil_div(768, 256), ceil_div(512, 128), 1]


@needs_tilelang
def test_unsupported_features_raise_clearly(tmp_path):
    for req, word in (({"config": {"split_group": True}}, "split_group"),
                      ({"dtype": "fp8"}, "float8"),
                      ({"shape": [64, 100, 64]}, "multiples of 8")):
        base = {"algorithm": "strassen", "target": "cuda-sm90a", "dtype": "bf16",
                "shape": [256, 256, 256], "out_dir": str(tmp_path), "compile": False}
        base.update(req)
        r = worker(base)
        assert not r["ok"] and word in r["error"], r


def _sass(lib):
    tool = shutil.which("cuobjdump") or "/usr/local/cuda/bin/cuobjdump"
    if not os.path.exists(tool) and not shutil.which("cuobjdump"):
        return None
    p = subprocess.run([tool, "-sass", lib], capture_output=True, text=True)
    return p.stdout if p.returncode == 0 else None


@needs_tilelang
@needs_nvcc
@pytest.mark.parametrize("target,mma", [("cuda-sm90a", "HGMMA"), ("cuda-sm80", "HMMA")])
def test_compiles_with_nvcc(tmp_path, target, mma):
    r = worker({"algorithm": "strassen", "target": target, "dtype": "bf16",
                "shape": [512, 512, 512], "config": {"fused": True, "overlap_epilogue": True},
                "out_dir": str(tmp_path), "jobs": 2})
    assert r["ok"], r.get("error")
    lib = r["library"]
    assert os.path.getsize(lib) > 10_000
    syms = subprocess.run(["nm", "-D", lib], capture_output=True, text=True).stdout
    for s in ("lcmac_init", "lcmac_run", "lcmac_last_error", "lcmac_workspace_bytes"):
        assert re.search(rf" T {s}$", syms, re.M), s
    for k, v in r["ptxas"].items():
        assert all(x == 0 for x in v["spill_stores"]), (k, v)
    sass = _sass(lib)
    if sass is not None:
        assert mma in sass
