"""CUDA back end without a GPU: generated source, launch configuration, nvcc compilation.

The TileLang worker runs in a subprocess (TileLang and apache-tvm cannot share a process).
Skipped with a reason when TileLang or nvcc is missing.  Kept to a few compiles (< 3 min).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from lcmac.spec.cuda.blocking import Blocking, ceil_div
from lcmac.spec.cuda.config import CudaConfig
from lcmac.targets.tilelang_worker import SERVE_MARK

ROOT = str(Path(__file__).resolve().parents[3])     # the repository


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


_server: dict = {}


def worker(req: dict) -> dict:
    """The TileLang worker's answer to one raw request, from one ``--serve`` process kept for
    the session (one TileLang import instead of one per request; restarted if it dies)."""
    p = _server.get("proc")
    if p is None or p.poll() is not None:
        err = tempfile.TemporaryFile("w+")
        p = subprocess.Popen([sys.executable, "-m", "lcmac.targets.tilelang_worker", "--serve"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True,
                             cwd=ROOT)
        _server.update(proc=p, err=err)
    p.stdin.write(json.dumps(req) + "\n")
    p.stdin.flush()
    for line in p.stdout:
        if line.startswith(SERVE_MARK):
            return json.loads(line[len(SERVE_MARK):])
    err = _server.pop("err")
    _server.clear()
    err.seek(0)
    raise AssertionError(f"the TileLang worker died: {err.read()[-3000:]}")


def kernel_body(src: str) -> str:
    m = re.search(r"__global__ void __launch_bounds__[^{]*\{", src)
    assert m, "no kernel definition in the generated source"
    depth, i = 1, m.end()
    while depth:
        depth += {"{": 1, "}": -1}.get(src[i], 0)
        i += 1
    return src[m.start():i]


def assert_restrict_pointers(src: str, kname: str, pointers: int) -> None:
    """Both the declaration and the definition of kernel ``kname`` take ``pointers`` pointer
    parameters, every one ``__restrict__`` (schedules.cuda.host_source.restrict_pointers)."""
    heads = re.findall(r'__global__ void.*?_%s_kernel\(([^)]*)\)' % kname, src)
    assert len(heads) == 2 and all(h.count("__restrict__") == h.count("*") == pointers for h in heads), heads


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
    # (TileLang drops __restrict__ from kernels that begin with the PDL wait)
    assert re.search(r"void __launch_bounds__\(\d+, 1\) \w+\(const bfloat16_t\*( __restrict__)? X, "
                     r"bfloat16_t\*( __restrict__)? Xt\)", ca)
    # the combines' pointers are __restrict__ again (TileLang drops it from kernels that begin
    # with the PDL wait): their loads may then move above earlier stores
    for k in ("combine_a", "combine_b"):
        assert_restrict_pointers(srcs[f"lcmac_cuda_{k}.cu"], k, 2)
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
    # a static B can be combined once: prepare_b runs combine_b into the caller's buffer,
    # run_prepared the rest, with B̃ read from that buffer and B never touched
    assert r["extra"]["prepared_b"]["kernels"] == ["combine_b"]
    assert r["extra"]["prepared_b"]["buffers"] == [["Bt", 0, dict(r["workspace"]).get("__end__", r["workspace_bytes"]) - dict(r["workspace"])["Bt"]]]
    entry = srcs["lcmac_cuda_entry.cu"]
    prep = entry[entry.index("int lcmac_prepare_b("):entry.index("int lcmac_run_prepared(")]
    run_p = entry[entry.index("int lcmac_run_prepared("):]
    assert re.findall(r"(\w+)_call\(", prep) == ["lcmac_cuda_combine_b"]
    assert re.findall(r"(\w+)_call\(", run_p) == ["lcmac_cuda_combine_a", "lcmac_cuda_fused_gemm_h"]
    assert "void* bufs_Bt = (void*)(p + 0LL);" in run_p and "bufs_B " not in run_p


@needs_tilelang
def test_rational_scheme_folds_its_fractions(tmp_path):
    """dps-4x4x4-r48 (W in ±1/2, ±1/4, ±1/8): the fractions are exact float literals, and the
    group-parallel combines read the 16 blocks once and write all 48 products."""
    r = worker({"algorithm": "dps-4x4x4-r48", "target": "cuda-sm90a", "dtype": "bf16",
                "shape": [1024, 1024, 1024], "config": {"fused": False}, "out_dir": str(tmp_path),
                "compile": False})
    assert r["ok"], r.get("error")
    assert [k["name"] for k in r["kernels"]] == ["combine_a", "combine_b", "batched_gemm", "combine_h"]
    srcs = {os.path.basename(p): open(p).read() for p in r["sources"]}
    ca = kernel_body(srcs["lcmac_cuda_combine_a.cu"])
    ch = kernel_body(srcs["lcmac_cuda_combine_h.cu"])
    assert len(re.findall(r"\(X \+ ", ca)) == 16 and len(re.findall(r"\(Xt \+ ", ca)) == 48
    for lit in ("0x1p-1f", "0x1p-2f", "0x1p-3f"):
        assert lit in ch, lit
    assert "__constant__" not in ch


@pytest.fixture(scope="module")
def split_group_build(tmp_path_factory):
    """One code generation (no nvcc) of the persistent split-group kernel, shared by the
    tests below: Strassen with non-unit constants on a shape that divides nothing."""
    if not _have_tilelang():
        pytest.skip("tilelang is not installed")
    alg = scaled_strassen()
    out = tmp_path_factory.mktemp("sg")
    cfg = {"fused": True, "split_group": True, "overlap_epilogue": True}
    r = worker({"algorithm": alg.to_dict(), "target": "cuda-sm90a", "dtype": "bf16",
                "shape": [1000, 1064, 1032], "config": cfg, "out_dir": str(out), "compile": False})
    assert r["ok"], r.get("error")
    return alg, CudaConfig.from_dict(cfg), r


def test_split_group_launch_matches_plan(split_group_build):
    from lcmac.spec.profiles import get_profile
    from lcmac.spec.cuda.persistent import persistent_plan
    alg, cfg, r = split_group_build
    M, N, K = r["shape"]
    blk = Blocking(M, N, K, 2, 2, 2, 7)
    pl = persistent_plan(blk, cfg, "bfloat16", get_profile("h100").units)
    assert r["extra"]["persistent"] == pl.to_dict()
    # 12 tile positions on 132 CTAs: no whole round; each group cut into 7 one-product pieces
    assert (pl.P, pl.T, pl.rounds, pl.rem, pl.Lt, pl.split) == (132, 12, 0, 12, 1, True)
    ks = {k["name"]: k for k in r["kernels"]}
    assert [k["name"] for k in r["kernels"]] == ["combine_a", "combine_b", "fused_gemm_h", "split_fixup"]
    assert ks["fused_gemm_h"]["grid"] == [pl.P, 1, 1]                 # persistent: P CTAs
    assert ks["fused_gemm_h"]["block"] == [cfg.threads + 128, 1, 1]   # + TMA producer warpgroup
    assert ks["fused_gemm_h"]["args"] == ["At", "Bt", "C", "Ps"]
    assert ks["split_fixup"]["grid"] == [cfg.block_n // cfg.combine_cols,
                                         cfg.block_m // cfg.combine_rows, pl.rem]
    assert ks["split_fixup"]["args"] == ["Ps", "C"]                   # after the GEMM, same stream
    assert_restrict_pointers(open([p for p in r["sources"] if p.endswith("_split_fixup.cu")][0]).read(),
                             "split_fixup", 2)
    ws = dict(r["workspace"])
    slots_bytes = pl.slots * 4 * cfg.block_m * cfg.block_n * 4        # fp32 partial C tiles
    assert r["workspace_bytes"] - ws["Ps"] >= slots_bytes


def test_split_group_sources(split_group_build):
    alg, cfg, r = split_group_build
    srcs = {os.path.basename(p): open(p).read() for p in r["sources"]}
    fu = kernel_body(srcs["lcmac_cuda_fused_gemm_h.cu"])
    fx = kernel_body(srcs["lcmac_cuda_split_fixup.cu"])
    for body in (fu, fx):
        assert "__constant__" not in body and "atomic" not in body.lower()   # no atomics
    assert "0x1p-1f" in fu and "-0x1p+0f" in fu      # W's 1/2 and −1 are literals
    assert "wgmma" in fu and "tma_load" in fu
    assert re.search(r"\(Ps \+ ", fu)                # non-lead pieces write their own slot
    assert "blockIdx.y" not in fu                     # one-dimensional persistent grid
    # the fixup only reads the slots (const) and waits for the persistent kernel first
    # (TileLang launches with programmatic dependent launch allowed)
    assert re.search(r"[(,] ?const float\*( __restrict__)? Ps\)", fx)
    assert re.search(r"[(,] ?float\*( __restrict__)? Ps\)", fu)
    for body in (fu, fx):
        assert "cudaGridDependencySynchronize()" in body


@needs_tilelang
@pytest.mark.parametrize("algo,config", [("gemm", {}), ("strassen", {"fused": False}),
                                         ("winograd", {"fused": True})])
def test_every_sm90_kernel_waits_for_the_previous_one(tmp_path, algo, config):
    """TileLang launches every kernel with programmatic dependent launch allowed, so each of
    ours must wait (griddepcontrol.wait) before reading what the kernel before it (ours, or
    the caller's that wrote A and B) produced; sm_80 has no PDL and no wait."""
    for tgt, want in (("cuda-sm90a", True), ("cuda-sm80", False)):
        r = worker({"algorithm": algo, "target": tgt, "dtype": "bf16", "shape": [256, 256, 256],
                    "config": config, "out_dir": str(tmp_path / tgt), "compile": False})
        assert r["ok"], r.get("error")
        srcs = [t for t in (open(p).read() for p in r["sources"]) if "__global__" in t]
        assert len(srcs) == len(r["kernels"]) >= 1
        for src in srcs:
            assert ("cudaGridDependencySynchronize()" in kernel_body(src)) == want, (tgt, src[:200])


@needs_tilelang
def test_unfused_and_plain_kernel_counts(tmp_path):
    # the grid kernel: one CTA per tile of every product; an LCMA's default on sm_90a, persistent:
    # one CTA per tile up to the profile's 132 SMs (here 1 x 2 tiles x 7 products)
    for cfg, grid in (({"fused": False, "persistent": False}, [1, 2, 7]), ({"fused": False}, [14, 1, 1])):
        r = worker({"algorithm": "winograd", "target": "cuda-sm90a", "dtype": "fp16",
                    "shape": [512, 512, 512], "config": cfg,
                    "out_dir": str(tmp_path / f"u{grid[0]}"), "compile": False})
        assert r["ok"], r.get("error")
        assert [k["name"] for k in r["kernels"]] == ["combine_a", "combine_b", "batched_gemm", "combine_h"]
        assert r["kernels"][2]["grid"] == grid
    # the plain GEMM keeps the grid kernel unless asked
    for cfg, grid in (({}, [ceil_div(768, 256), ceil_div(512, 128), 1]),
                      ({"persistent": True}, [ceil_div(768, 256) * ceil_div(512, 128), 1, 1])):
        g = worker({"algorithm": None, "target": "cuda-sm90a", "dtype": "bf16", "config": cfg,
                    "shape": [512, 768, 256], "out_dir": str(tmp_path / f"g{grid[1]}"), "compile": False})
        assert g["ok"], g.get("error")
        assert [k["name"] for k in g["kernels"]] == ["gemm"]
        assert g["kernels"][0]["grid"] == grid


@needs_tilelang
def test_unsupported_features_raise_clearly(tmp_path):
    for req, word in (({"config": {"fused": True, "split_group": True, "overlap_epilogue": True},
                        "target": "cuda-sm80"}, "overlap_epilogue=False"),
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
@pytest.mark.parametrize("target,mma,cfg", [
    ("cuda-sm90a", "HGMMA", {"fused": True, "split_group": True, "overlap_epilogue": True}),
    pytest.param("cuda-sm80", "HMMA", {"fused": True, "split_group": True}, marks=pytest.mark.slow)])
def test_compiles_with_nvcc(tmp_path, target, mma, cfg):
    # the persistent split-group artifact: combines, persistent GEMM + Combine-H, fixup
    r = worker({"algorithm": "strassen", "target": target, "dtype": "bf16",
                "shape": [512, 512, 512], "config": cfg, "out_dir": str(tmp_path), "jobs": 2})
    assert r["ok"], r.get("error")
    lib = r["library"]
    assert os.path.getsize(lib) > 10_000
    assert [k["name"] for k in r["kernels"]][-2:] == ["fused_gemm_h", "split_fixup"]
    syms = subprocess.run(["nm", "-D", lib], capture_output=True, text=True).stdout
    for s in ("lcmac_init", "lcmac_run", "lcmac_last_error", "lcmac_workspace_bytes",
              "lcmac_prepared_b_bytes", "lcmac_prepare_b", "lcmac_run_prepared"):
        assert re.search(rf" T {s}$", syms, re.M), s
    for k, v in r["ptxas"].items():
        assert all(x == 0 for x in v["spill_stores"]), (k, v)
    sass = _sass(lib)
    if sass is not None:
        assert mma in sass


# ---- buffers of more than 2³¹ elements: 64-bit index arithmetic ----------------------------
def _index_exprs(body: str, name: str) -> list[str]:
    """The offset expression of every `name + (...)` access in a kernel body."""
    out = []
    for m in re.finditer(rf"\b{name} \+ \(", body):
        depth, i = 1, m.end()
        while depth:
            depth += {"(": 1, ")": -1}.get(body[i], 0)
            i += 1
        out.append(body[m.end():i - 1])
    return out


@needs_tilelang
@pytest.mark.parametrize("cfg,wide,kernels", [
    ({"fused": False, "store_via_smem": False}, ["C", "H"], {"combine_h": ("H", "C"), "batched_gemm": ("H",)}),
    ({"fused": False}, ["C", "H"], {"combine_h": ("H", "C")}),
    ({"fused": True, "overlap_epilogue": True}, ["C"], {"fused_gemm_h": ("C",)})])
def test_large_buffers_index_in_64_bits(tmp_path, cfg, wide, kernels):
    """Strassen at 16384×151936×4096 bf16 (a vocabulary projection; code generation only):
    H [7, 8192, 75968] and C [16384, 151936] have more than 2³¹ elements.  With int32 extents
    TVM folded Combine-H's offset of H_r, r·Mb·Nb, into a wrapped int32 literal for r ≥ 4
    (`- 1805647872` for r = 4: the H100 read garbage or faulted there) and the fused kernel
    addressed C in int arithmetic.  Now every access to those buffers is 64-bit."""
    M, N, K = 16384, 151936, 4096
    r = worker({"algorithm": "strassen", "target": "cuda-sm90a", "dtype": "bf16",
                "shape": [M, N, K], "config": cfg, "out_dir": str(tmp_path), "compile": False})
    assert r["ok"], r.get("error")
    assert r["extra"]["int64_index"] == wide
    blk = Blocking(M, N, K, 2, 2, 2, 7)
    srcs = {os.path.basename(p): open(p).read() for p in r["sources"]}
    for kname, bufs in kernels.items():
        body = kernel_body(srcs[f"lcmac_cuda_{kname}.cu"])
        for b in bufs:
            exprs = _index_exprs(body, b)
            assert exprs, (kname, b)
            for e in exprs:                 # every offset computed in int64, none in int
                assert "(int64_t)" in e and not re.search(r"(?<!int64_t\))\(\(int\)\w+\.\w\) \*", e), (kname, b, e[:300])
        # no wrapped literal: a 64-bit constant above 2³¹ where the int32 code had a negative one
        if kname == "combine_h":
            for rr in (4, 5, 6):
                off = rr * blk.Mb * blk.Nb
                assert off > 2**31 and f"(int64_t){off}" in body and f"- {2**32 - off}" not in body
    if cfg == {"fused": False}:
        # the default batched GEMM stores H by TMA: 64-bit strides in the descriptor
        src = srcs["lcmac_cuda_batched_gemm.cu"]
        assert "tl::tma_store(H_desc" in kernel_body(src)
        assert f"H_desc_globalDim[3]= {{{blk.Nb},{blk.Mb},7}}" in src
        assert f"H_desc_globalStride[3]= {{2,{blk.Nb * 2},{blk.Mb * blk.Nb * 2}}}" in src
    # the buffers that stay small keep 32-bit arithmetic
    ca = kernel_body(srcs["lcmac_cuda_combine_a.cu"])
    assert "int64_t" not in ca


# ---- scaled fp16 operands (CudaConfig.operands) ---------------------------------------------
@needs_tilelang
def test_scaled_operand_kernels_and_entry(tmp_path):
    """fp16x2 Strassen: amax passes, combines writing hi and lo fp16 halves with the scale
    built from amax's exponent bits, the GEMM stage over four fp16 operands into fp32 H,
    Combine H; the entry clears the amax slots first.  The plain GEMM writes C directly."""
    r = worker({"algorithm": "strassen", "target": "cuda-sm90a", "dtype": "fp32",
                "shape": [1000, 1064, 1032], "config": {"operands": "fp16x2", "fused": False},
                "out_dir": str(tmp_path / "s"), "name": "lcmac", "compile": False})
    assert r["ok"], r.get("error")
    assert [(k["name"], k["args"]) for k in r["kernels"]] == [
        ("amax_a", ["A", "S"]), ("amax_b", ["B", "S"]),
        ("combine_a", ["A", "S", "At", "Al"]), ("combine_b", ["B", "S", "Bt", "Bl"]),
        ("batched_gemm", ["At", "Al", "Bt", "Bl", "S", "H"]), ("combine_h", ["H", "C"])]
    assert r["config"]["block_n"] == 128 and r["config"]["stages"] == 3   # fp16x2 defaults
    gemm = r["kernels"][4]
    assert gemm["grid"] == [ceil_div(532, 128), ceil_div(500, 128), 7]
    assert gemm["smem_bytes"] >= 3 * 4 * 128 * 64 * 2                      # 4 fp16 tiles/stage
    assert r["extra"]["scale_bounds"] == [2, 2]          # Strassen's rows sum to at most 2
    src = {os.path.basename(p): open(p).read() for p in r["sources"]}
    ca = kernel_body(src["lcmac_combine_a.cu"])
    assert "half_t* __restrict__ Xl" in ca and ">> 23" in ca and "<< 23" in ca        # exponent-bit scale
    assert re.search(r"0x1p\+11f|2048", ca)                               # lo half × 2¹¹
    bg = kernel_body(src["lcmac_batched_gemm.cu"])
    assert "kFloat16" in bg and re.search(r"0x1p-11f", bg)
    # H leaves in fp32 through shared memory: a TMA store of CU_TENSOR_MAP_DATA_TYPE_FLOAT32 (7)
    assert "tl::tma_store(Out_desc" in bg
    assert "Out_desc_type= (CUtensorMapDataType)7;" in src["lcmac_batched_gemm.cu"]
    entry = src["lcmac_entry.cu"]
    assert entry.index("cudaMemsetAsync(bufs_S, 0, 256, s)") < entry.index("if (lcmac_amax_a_call(")
    # the amax passes are streaming kernels too: distinct buffers, pointers __restrict__
    assert_restrict_pointers(src["lcmac_amax_a.cu"], "amax_a", 2)

    g = worker({"algorithm": None, "target": "cuda-sm90a", "dtype": "bf16",
                "shape": [1000, 1064, 1032], "config": {"operands": "fp16"},
                "out_dir": str(tmp_path / "g"), "compile": False})
    assert g["ok"], g.get("error")
    assert [(k["name"], k["args"]) for k in g["kernels"]][-1] == ("gemm", ["At", "Bt", "S", "C"])
    assert g["gemm_precision"].startswith("fp16 (power-of-two scaled from bfloat16")
    assert "Al" not in dict(g["workspace"])
    h = worker({"algorithm": "strassen", "target": "cuda-sm90a", "dtype": "bf16",
                "shape": [512, 512, 512], "config": {"operands": "fp16", "fused": False},
                "out_dir": str(tmp_path / "h"), "name": "lcmac", "compile": False})
    assert h["ok"], h.get("error")
    ch = kernel_body(open(h["sources"][-2]).read())             # combine_h: H kept in fp32
    assert "lcmac_combine_h_kernel(bfloat16_t* __restrict__ C, const float* __restrict__ H)" in ch


@needs_tilelang
def test_scaled_operand_errors(tmp_path):
    base = {"algorithm": "strassen", "target": "cuda-sm90a", "dtype": "bf16",
            "shape": [256, 256, 256], "out_dir": str(tmp_path), "compile": False}
    for req, word in (({"config": {"operands": "fp16x2"}}, "operands='fp16'"),
                      ({"config": {"operands": "fp16", "fused": True}}, "fused=False"),
                      ({"config": {"operands": "int8"}}, "operands must be one of"),
                      ({"config": {"operands": "fp16x2", "stages": 4}, "dtype": "fp32"},
                       "shared memory"),
                      ({"config": {"operands": "fp16x2", "block_n": 128, "stages": 3}, "dtype": "fp32",
                        "target": "cuda-sm80"}, "fewer stages")):
        r = worker({**base, **req})
        assert not r["ok"] and word in r["error"], (req, r.get("error"))


@needs_tilelang
@needs_nvcc
@pytest.mark.slow
def test_scaled_gemm_compiles_with_nvcc(tmp_path):
    """lcmac.build of an fp16x2 float32 GEMM: no spills, fp16 HGMMA in the cubin, and the
    loaded artifact (no GPU needed to load) says what its GEMM stage computes in."""
    import lcmac
    path = lcmac.build("gemm", "cuda-sm90a", "float32", (512, 512, 512),
                       config={"operands": "fp16x2"}, out_dir=str(tmp_path))
    f = lcmac.load(path)
    assert f.gemm_precision.startswith("fp16x2") and "fp16x2" in repr(f)
    # the manifest holds the config the worker resolved, every knob (asked: the operand mode)
    from lcmac.spec.cuda.config import CudaConfig
    assert set(f.manifest.config) == set(CudaConfig().to_dict())
    assert (f.manifest.config["operands"], f.manifest.config["block_n"]) == ("fp16x2", 128)
    for k, v in f.manifest.extra["ptxas"].items():
        assert all(x == 0 for x in v["spill_stores"]), (k, v)
    sass = _sass(f.lib_path)
    if sass is not None:
        assert "HGMMA" in sass and "F16" in sass


@needs_tilelang
@needs_nvcc
@pytest.mark.slow
def test_sm80_fp16x2_default_compiles_without_spills(tmp_path):
    # the sm_90a default (128x128, 3 stages) fits only 2 stages on sm_80 and spills there, as
    # do 128x64 and 64x128 at 3 stages on shapes with partial tiles
    for shape in ([512, 512, 512], [1000, 1064, 1032]):
        r = worker({"algorithm": None, "target": "cuda-sm80", "dtype": "fp32", "shape": shape,
                    "config": {"operands": "fp16x2"}, "out_dir": str(tmp_path / str(shape[0])), "jobs": 2})
        assert r["ok"], r.get("error")
        assert (r["config"]["block_m"], r["config"]["block_n"], r["config"]["stages"]) == (128, 64, 2)
        for k, v in r["ptxas"].items():
            assert all(x == 0 for x in v["spill_stores"]), (shape, k, v)


@needs_tilelang
def test_sm80_build_fits_shared_memory(tmp_path):
    base = {"algorithm": "strassen", "target": "cuda-sm80", "dtype": "bf16",
            "shape": [1024, 1024, 1024], "out_dir": str(tmp_path), "compile": False}
    r = worker(base)
    assert r["ok"], r.get("error")
    assert r["config"]["stages"] == 3
    gemm = [k for k in r["kernels"] if k["name"] == "batched_gemm"][0]
    assert 0 < gemm["smem_bytes"] <= 163 * 1024
    r = worker({**base, "config": {"stages": 4}})
    assert not r["ok"]
    assert "'batched_gemm' needs 192 KB" in r["error"] and "163 KB" in r["error"], r["error"]


@needs_tilelang
@needs_nvcc
@pytest.mark.slow
def test_fp8_artifact_layout_and_compile(tmp_path):
    """operands="fp8": the combines write E4M3 Ã [R,Mb,Kb] and K-major B̃ [R,Nb,Kb] with
    float32 scales per 1x128 of Ã and 128x128 of B̃ (Kb rounded to 16 bytes for TMA), the
    GEMM stage is an E4M3 wgmma writing fp32 H, Combine H reads fp32; it compiles without
    spills."""
    M, N, K = 1000, 1064, 1032
    r = worker({"algorithm": "strassen", "target": "cuda-sm90a", "dtype": "bf16", "shape": [M, N, K],
                "config": {"operands": "fp8"}, "out_dir": str(tmp_path), "jobs": 2})
    assert r["ok"], r.get("error")
    assert [k["name"] for k in r["kernels"]] == ["combine_a", "combine_b", "batched_gemm", "combine_h"]
    assert r["gemm_precision"].startswith("fp8 e4m3 (A 1x128, B 128x128")
    blk = Blocking(M, N, K, 2, 2, 2, 7, k_align=16)
    assert blk.Kb == 528 and blk.Kb % 16 == 0
    nkb = ceil_div(blk.Kb, 128)
    ws = dict(r["workspace"])
    sizes = {"At": 7 * blk.Mb * blk.Kb, "Bt": 7 * blk.Nb * blk.Kb,
             "SA": 7 * nkb * ceil_div(blk.Mb, 128) * 128 * 4, "SB": 7 * ceil_div(blk.Nb, 128) * ceil_div(nkb, 4) * 4 * 4}
    names = ["At", "Bt", "SA", "SB", "H"]
    for a, b in zip(names, names[1:]):
        assert ws[b] - ws[a] == -(-sizes[a] // 256) * 256, (a, ws)
    src = {os.path.basename(p): open(p).read() for p in r["sources"]}
    gemm = kernel_body(src["lcmac_cuda_batched_gemm.cu"])
    assert "kFloat8_e4m3" in gemm and "wgmma" in gemm
    assert "fp8_e4_t* __restrict__ Xt, float* __restrict__ SB" in src["lcmac_cuda_combine_b.cu"]
    assert "const float* __restrict__ H" in kernel_body(src["lcmac_cuda_combine_h.cu"])
    for k, v in r["ptxas"].items():
        assert all(x == 0 for x in v["spill_stores"]), (k, v)


@needs_tilelang
def test_fp8_operand_errors(tmp_path):
    base = {"algorithm": "strassen", "target": "cuda-sm90a", "dtype": "bf16",
            "shape": [256, 256, 256], "out_dir": str(tmp_path), "compile": False,
            "config": {"operands": "fp8"}}
    for req, word in (({"target": "cuda-sm80"}, "FP8 tensor cores (sm_90a)"),
                      ({"dtype": "fp32"}, "bfloat16/float16"),
                      ({"config": {"operands": "fp8", "block_k": 64}}, "block_k=128"),
                      ({"config": {"operands": "fp8", "fused": True}}, "fused=False"),
                      ({"algorithm": "strassen^2"}, "use one recursion level")):
        r = worker({**base, **req})
        assert not r["ok"] and word in r["error"], (req, r.get("error"))


# ---- 2-CTA clusters sharing B slabs (CudaConfig.cluster=2) -----------------------------------
@needs_tilelang
@needs_nvcc
def test_cluster_pairs_share_b_by_multicast(tmp_path):
    r = worker({"algorithm": "strassen", "target": "cuda-sm90a", "dtype": "bf16",
                "shape": [1000, 1064, 1032], "config": {"fused": False, "cluster": 2, "stages": 3},
                "out_dir": str(tmp_path), "jobs": 2})
    assert r["ok"], r.get("error")
    srcs = {k["name"]: open(p).read() for k, p in zip(r["kernels"], r["sources"])}
    gemm = srcs["batched_gemm"]
    body = kernel_body(gemm)
    # rank 0 multicasts B, A stays per CTA; barriers: cluster-wide init, rank 1's consumer
    # warpgroups (2) also release rank 0's stages (3), both CTAs meet before exiting
    assert "tma_load_multicast(Bt_desc" in body and "tma_load_multicast(At_desc" not in body
    assert body.count("tl::cluster_sync();") == 2 and "__syncthreads();" not in body.split("cluster_sync")[0]
    assert body.count("(tl::block_rank_in_cluster() == 0 ? 2 : 0)") == 3
    assert len(re.findall(r"if \(tl::block_rank_in_cluster\(\) == 1 && \(\(\(int\)threadIdx\.x\) & 127\) == 0\) "
                          r"mbarrier\[[^\]]+\]\.arrive\(0u\);", body)) == 1
    assert "clusterDim = {2, 1, 1}" in gemm
    # one CTA per tile of every product, grid x over the 4 (= 504 / 128) tile rows so that
    # clusters pair rows; 3 (= 532 / 256) columns; 7 products; clusters rasterised whole
    info = {k["name"]: k for k in r["kernels"]}["batched_gemm"]
    assert info["grid"] == [4, 3, 7]
    assert "tl::rasterization2DRowWithCluster<4, 2>()" in body
    for name in ("combine_a", "combine_b", "combine_h"):
        assert "cluster" not in kernel_body(srcs[name])
    for k, v in r["ptxas"].items():
        assert all(x == 0 for x in v["spill_stores"]), (k, v)


@needs_tilelang
def test_cluster_refusals_name_the_reason(tmp_path):
    base = {"algorithm": "strassen", "target": "cuda-sm90a", "dtype": "bf16",
            "shape": [1024, 1024, 1024], "out_dir": str(tmp_path), "compile": False}
    for req, words in (({"target": "cuda-sm80", "config": {"fused": False, "cluster": 2}}, "sm_80"),
                       ({"dtype": "fp32", "config": {"fused": False, "cluster": 2}}, "float32"),
                       ({"config": {"fused": True, "cluster": 2}}, "fused"),
                       ({"config": {"fused": False, "cache_aware": False, "cluster": 2}}, "cache-aware"),
                       ({"config": {"fused": False, "operands": "fp16", "cluster": 2}}, "operands"),
                       ({"config": {"fused": False, "cluster": 3}}, "cluster must be 1 or 2"),
                       ({"algorithm": None, "shape": [384, 512, 256], "config": {"cluster": 2}},
                        "even number of tile rows, not 3")):
        r = worker({**base, **req})
        assert not r["ok"] and words in r["error"], (req, r.get("error"))


@needs_tilelang
def test_store_via_smem_writes_the_tile_with_tma_stores(tmp_path):
    # sm_90a: stmatrix into shared memory that aliases the drained pipeline (no more than
    # the 4-stage pipeline's 192 KB), then TMA stores; store_via_smem=False stores from
    # registers; sm_80 builds too (vector stores)
    r = worker({"algorithm": None, "target": "cuda-sm90a", "dtype": "bf16", "shape": [1024, 1024, 1024],
                "config": {"store_via_smem": True, "persistent": False}, "out_dir": str(tmp_path / "h"),
                "compile": False})
    assert r["ok"], r.get("error")
    body = kernel_body(open(r["sources"][0]).read())
    assert "tl::ptx_stmatrix" in body and "tl::tma_store(C_desc" in body
    assert r["kernels"][0]["smem_bytes"] == 4 * (128 * 64 + 64 * 256) * 2
    direct = worker({"algorithm": None, "target": "cuda-sm90a", "dtype": "bf16", "shape": [1024, 1024, 1024],
                     "config": {"store_via_smem": False}, "out_dir": str(tmp_path / "d"), "compile": False})
    assert "tma_store" not in kernel_body(open(direct["sources"][0]).read())
    a = worker({"algorithm": "strassen", "target": "cuda-sm80", "dtype": "bf16", "shape": [1024, 1024, 1024],
                "config": {"fused": False, "store_via_smem": True}, "out_dir": str(tmp_path / "a"),
                "compile": False})
    assert a["ok"], a.get("error")


# ---- persistent unfused GEMM stage (CudaConfig.persistent, fused=False) ------------------------
@needs_tilelang
@needs_nvcc
def test_persistent_gemm_stage_walks_tiles_in_one_pipeline(tmp_path):
    # Strassen on a shape no tile divides: 4 (= ceil(504 / 128)) x 3 (= ceil(532 / 256))
    # tiles of 7 products = 84 tiles, fewer than the profile's 132 SMs: one CTA per tile;
    # persistent_ctas=10: ceil((84 - pid) / 10) tiles each
    for ctas, grid in ((0, 84), (10, 10)):
        r = worker({"algorithm": "strassen", "target": "cuda-sm90a", "dtype": "bf16",
                    "shape": [1000, 1064, 1032], "out_dir": str(tmp_path / str(ctas)), "jobs": 2,
                    "config": {"fused": False, "persistent": True, "persistent_ctas": ctas}})
        assert r["ok"], r.get("error")
        srcs = {k["name"]: open(p).read() for k, p in zip(r["kernels"], r["sources"])}
        info = {k["name"]: k for k in r["kernels"]}["batched_gemm"]
        assert info["grid"] == [grid, 1, 1]
        body = kernel_body(srcs["batched_gemm"])
        # one pipelined loop per warpgroup role (producer, consumers) over the CTA's (tile, k)
        # steps, nk = ceil(516 / 64) = 9: one tile per CTA (folded to 9), or ceil((84 - pid) / 10)
        loops = re.findall(r"for \(int it(?:_1)? = 0; it(?:_1)? < ([^;]*);", body)
        assert len(loops) == 2 and len(set(loops)) == 1, loops
        assert loops[0] == ("9" if grid == 84 else "(((93 - ((int)blockIdx.x)) / 10) * 9)"), loops
        # the output tile leaves through its own shared memory: 3 stages (the 4th does not
        # fit beside it) of 48 KB + 64 KB
        assert "tl::tma_store(H_desc" in body and "tl::ptx_stmatrix" in body
        assert info["smem_bytes"] == 3 * (128 * 64 + 64 * 256) * 2 + 128 * 256 * 2
        for name in ("combine_a", "combine_b", "combine_h"):
            assert "blockIdx.x) / " not in kernel_body(srcs[name])
        for k, v in r["ptxas"].items():
            assert all(x == 0 for x in v["spill_stores"]), (k, v)
    # the plain GEMM: 8 x 8 tiles of 1024² on 64 CTAs... or the profile's 132 (all 64 tiles)
    g = worker({"algorithm": None, "target": "cuda-sm90a", "dtype": "fp16", "shape": [1024, 1024, 2048],
                "config": {"persistent": True}, "out_dir": str(tmp_path / "g"), "compile": False})
    assert g["ok"], g.get("error")
    assert g["kernels"][0]["grid"] == [32, 1, 1]   # 8 x 4 tiles of 128 x 256
    assert "tl::tma_store(C_desc" in kernel_body(open(g["sources"][0]).read())


@needs_tilelang
def test_persistent_gemm_refusals_name_the_reason(tmp_path):
    base = {"algorithm": "strassen", "target": "cuda-sm90a", "dtype": "bf16",
            "shape": [1024, 1024, 1024], "out_dir": str(tmp_path), "compile": False}
    for req, words in (({"target": "cuda-sm80", "config": {"persistent": True}}, "sm_80"),
                       ({"dtype": "fp32", "config": {"persistent": True}}, "float32"),
                       ({"config": {"operands": "fp16", "persistent": True}}, "operands"),
                       ({"config": {"cluster": 2, "persistent": True}}, "cluster=2")):
        r = worker({**base, **req})
        assert not r["ok"] and words in r["error"] and "persistent=False" in r["error"], (req, r.get("error"))


# ---- tma_reduce: the fused kernel's Combine-H epilogue on the TMA engine ------------------
TR = {"fused": True, "tma_reduce": True, "stages": 3}


@needs_tilelang
def test_tma_reduce_kernels_and_epilogue(tmp_path):
    # Strassen on 2x2 tile positions per C block: the combines and one persistent kernel of
    # 4 CTAs (no H, no Combine H); each product's tile is stored into its C blocks' first
    # contributions (4) and added into the other 8 by TMA reductions that nobody waits for
    # where they are issued; every product's epilogue first waits for all earlier bulk groups
    # to complete, and the two mixed-sign products (M2, M5) wait for the reads of their first
    # group before writing -H
    r = worker({"algorithm": "strassen", "target": "cuda-sm90a", "dtype": "bf16",
                "shape": [512, 1024, 512], "config": TR, "out_dir": str(tmp_path), "compile": False})
    assert r["ok"], r.get("error")
    assert [k["name"] for k in r["kernels"]] == ["combine_a", "combine_b", "reduce_gemm_h"]
    k = r["kernels"][2]
    assert (k["grid"], k["block"], k["args"]) == ([4, 1, 1], [384, 1, 1], ["At", "Bt", "C"])
    assert "H" not in dict(r["workspace"])
    body = kernel_body(open([p for p in r["sources"] if p.endswith("reduce_gemm_h.cu")][0]).read())
    assert body.count("tl::tma_store_add(C_desc") == 8 and body.count("tl::tma_store(C_desc") == 4
    assert not re.search(r"tma_store_add\([^;]*\);\s*\}?\s*tl::tma_store_arrive\(\);\s*tl::tma_store_wait", body)
    assert body.count("tl::tma_store_wait<0, false>();") == 7 + 1     # per product, at exit
    assert body.count("tl::tma_store_wait<0, true>();") == 2
    assert "-0x1p+0f" in body and "wgmma" in body and "atomic" not in body.lower()


@needs_tilelang
def test_fused_rotated_walk_is_refused(tmp_path):
    # the fused kernel without the cache-aware order hangs on an H100 (docs/cuda-templates.md):
    # refused by name in every form, and the tuner does not offer it
    from lcmac.tune import space
    for extra in ({"split_group": True, "overlap_epilogue": True}, {"split_group": True},
                  {"persistent": True, "overlap_epilogue": True}, {}):
        r = worker({"algorithm": "strassen", "target": "cuda-sm90a", "dtype": "bf16",
                    "shape": [1024, 1024, 1024], "out_dir": str(tmp_path), "compile": False,
                    "config": {"fused": True, "cache_aware": False, **extra}})
        assert not r["ok"] and "hangs" in r["error"] and "cache_aware=True" in r["error"], r.get("error")
    cfgs, _ = space.enumerate_configs("cuda-sm90a", "bf16", (4096, 4096, 4096), "strassen")
    assert not [c for c in cfgs if c.fused and not c.cache_aware]
    assert [c for c in cfgs if c.fused and c.split_group] and [c for c in cfgs if not c.fused and not c.cache_aware]


# ---- direct_views: single-block operands read from A / B in place ---------------------------
@needs_tilelang
@needs_nvcc
def test_direct_views_kernels_and_descriptors(tmp_path):
    # Strassen at 2048³ (blocks of whole tiles) with the default config: the batched GEMM
    # reads Ã_3 = A11, Ã_4 = A22, B̃_2 = B11, B̃_5 = B22 from A and B through their own block
    # descriptors, the combines write the other 5 per side, the workspace shrinks by 4 blocks
    # through the CLI, which says what it read in place
    p = subprocess.run([sys.executable, "-m", "lcmac", "build", "--algo", "strassen", "--target", "cuda-sm90a",
                        "--dtype", "bf16", "--shape", "2048x2048x2048", "-o", str(tmp_path)],
                       capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "read in place  2 of 7 A operands, 2 of 7 B operands" in p.stdout
    # and the accuracy model's word on it (bf16 Algorithm 1 Strassen: 3.47x measured)
    assert re.search(r"error    3\.[45]\dx the plain GEMM's", p.stdout), p.stdout
    man = json.load(open(tmp_path / "strassen-cuda-sm90a-bfloat16-2048x2048x2048.json"))
    r = man["extra"]
    assert r["extra"]["direct_views"] == {"A": {"2": 0, "3": 3}, "B": {"1": 0, "4": 3}}
    blk = 1024 * 1024 * 2
    ws = dict(r["workspace"])
    assert ws["Bt"] - ws["At"] == 5 * blk and ws["H"] - ws["Bt"] == 5 * blk
    bundle = open(tmp_path / man["extra"]["source"]).read()
    srcs = {m.group(1): m.group(2) for m in
            re.finditer(r"// ===== (\S+) =====\n(.*?)(?=// ===== |\Z)", bundle, re.S)}
    assert len(re.findall(r"\(Xt \+ ", srcs["lcmac_combine_a.cu"])) == 5
    g = srcs["lcmac_batched_gemm.cu"]
    body = kernel_body(g)
    assert "tl::tma_load(At_desc" not in body and "tl::tma_load(Bt_desc" not in body
    assert "lcmac_view_load_At(A_desc, At_desc, " in body and "lcmac_view_load_Bt(B_desc, Bt_desc, " in body
    assert "__constant__ int lcmac_At_src[7] = {0, 1, -1, -4, 2, 3, 4};" in g
    assert "__constant__ int lcmac_Bt_src[7] = {0, -1, 1, 2, -4, 3, 4};" in g
    assert "cuuint64_t A_desc_globalDim[4]= {1024,1024,2,2};" in g and "void *A_desc_globalAddress= A;" in g
    assert "cuuint64_t A_desc_globalStride[4]= {2,4096,2048,4194304};" in g
    assert "cuuint64_t At_desc_globalDim[4]= {1024,1024,1,5};" in g
    assert "cuuint64_t At_desc_globalStride[4]= {2,2048,2097152,2097152};" in g
    assert re.search(r"cudaLaunchKernelEx\(&config, \w+, At_desc, A_desc, Bt_desc, B_desc, H_desc\)", g)
    assert g.count("__grid_constant__ const CUtensorMap A_desc,") == 2
    entry = srcs["lcmac_entry.cu"]
    assert "lcmac_batched_gemm_call(bufs_At, bufs_Bt, bufs_H, bufs_A, bufs_B, s)" in entry
    # a prepared B holds B̃'s 5 blocks and a copy of B, which the GEMM reads in place
    pb = r["extra"]["prepared_b"]
    assert pb["buffers"] == [["Bt", 0, 5 * blk], ["B", 5 * blk, 4 * blk]]
    prep = entry[entry.index("int lcmac_prepare_b("):entry.index("int lcmac_run_prepared(")]
    assert f"cudaMemcpyAsync(p + {5 * blk}LL, B, {4 * blk}LL, cudaMemcpyDeviceToDevice, s)" in prep
    assert f"void* bufs_B = (void*)(p + {5 * blk}LL);" in entry[entry.index("int lcmac_run_prepared("):]
    # where the tiles do not split the blocks, "auto" builds without views; "ab" refuses
    r = worker({"algorithm": "strassen", "target": "cuda-sm90a", "dtype": "bf16",
                "shape": [1000, 1064, 1032], "out_dir": str(tmp_path / "b"), "compile": False})
    assert r["ok"] and "direct_views" not in r["extra"], r.get("error")
    r = worker({"algorithm": "strassen", "target": "cuda-sm90a", "dtype": "bf16", "config": {"direct_views": "ab"},
                "shape": [1000, 1064, 1032], "out_dir": str(tmp_path / "c"), "compile": False})
    assert not r["ok"] and "direct_views='ab'" in r["error"] and "exactly" in r["error"], r
