"""CUDA artifacts whose row count M is a run-time value (``CudaConfig.dynamic_rows``,
``lcmac.schedules.cuda.rows``): what refuses, how the rows are cut, the generated sources and
entry point without a GPU, and results against float64 on one (``-m gpu``).
"""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from lcmac import ir
from lcmac.artifact.bundle import RuleSpec, plan_rule
from lcmac.core.errors import ArtifactError
from lcmac.runtime.tiled import run_row_ranges
from lcmac.schedules.cuda.entry_point import prepared_b_plan, rows_entry
from lcmac.schedules.cuda.rows import row_blocks, rows_why
from lcmac.spec.cuda.config import CudaConfig
from lcmac.spec.shape_rules import parse_rule
from tests.schedules.cuda.test_cuda_codegen import kernel_body, needs_nvcc, needs_tilelang, worker

N, K = 1024, 2048            # the weight of the built kernels (bf16: 16-byte rows)
MAX_ROWS = 8192              # the most rows one launch takes


# ---- without a compiler ---------------------------------------------------------------------
@pytest.mark.parametrize("cfg, algo, why", [
    ({"operands": "fp16"}, "strassen", "operands='fp16'"),
    ({"cluster": 2}, None, "cluster=2"),
    ({"fused": True, "split_group": True}, "strassen", "persistent fused forms"),
    ({"direct_views": "ab"}, "strassen", "direct_views='ab'"),
    ({"batched": True}, None, "batched"),
])
def test_configs_without_a_run_time_m_form_say_why(cfg, algo, why):
    alg = ir.get(algo) if algo else None
    got = rows_why(alg, (MAX_ROWS, N, K), "bfloat16", CudaConfig(**cfg), "sm_90a")
    assert got is not None and why in got


def test_default_configs_have_a_run_time_m_form_up_to_the_grid_limit():
    strassen = ir.get("strassen")
    for alg in (None, strassen):
        for cfg in (CudaConfig(), CudaConfig(fused=True), CudaConfig(persistent=True)):
            assert rows_why(alg, (MAX_ROWS, N, K), "bfloat16", cfg, "sm_90a") is None
    # Combine A's grid has ceil(Mb / 4) rows: Mb past 4·65535 is refused, naming the limit
    assert "65535" in rows_why(strassen, (2 * 4 * 65536, N, K), "bfloat16", CudaConfig(), "sm_90a")
    assert row_blocks(1, 2, 128) == 128 and row_blocks(4097, 2, 128) == 2176 and row_blocks(4096, 2, 128) == 2048


def test_row_ranges_run_as_one_call_per_run_and_cover_every_row():
    rng = np.random.default_rng(0)
    A, B = rng.standard_normal((7048, 16)), rng.standard_normal((16, 8))
    calls = []

    def kernel(a, b, out):
        calls.append(("kernel", a.shape[0]))
        out[...] = a @ b

    def vendor(a, b, out):
        calls.append(("vendor", a.shape[0]))
        out[...] = a @ b
    ranges = [(4096, True), (2048, True), (904, False)]
    C = run_row_ranges(A, B, None, kernel, ranges, N=8, K=16, vendor=vendor)
    assert calls == [("kernel", 6144), ("vendor", 904)]
    np.testing.assert_allclose(C, A @ B)
    with pytest.raises(Exception, match="cover"):
        run_row_ranges(A, B, None, kernel, [(100, True)], N=8, K=16)


def test_bundle_rule_of_run_time_m_is_one_kernel_on_cuda_only():
    spec = plan_rule("?x1024x2048", "strassen", "cuda", rows=(8192, 2048), dynamic_rows=True)
    assert spec.shapes() == [(8192, 1024, 2048)] and spec.to_dict()["dynamic_rows"] is True
    assert "dynamic_rows" not in plan_rule("?x1024x2048", "strassen", "cuda").to_dict()
    with pytest.raises(ArtifactError, match="CUDA"):
        plan_rule("?x1024x2048", "strassen", "cpu", dynamic_rows=True)
    assert RuleSpec(parse_rule("?x64x64"), "gemm", (256,)).shapes() == [(256, 64, 64)]


def test_jit_takes_a_bucket_kernel_for_a_bucket_and_one_run_time_m_kernel_otherwise(monkeypatch):
    from lcmac.api import matmul as ops
    target = "cuda-sm90a"
    dynamic = ("strassen", target, "bfloat16", (65536, N, K), "native", ops.DYNAMIC_ROWS)
    monkeypatch.delenv(ops.DYNAMIC_ROWS_ENV, raising=False)
    assert ops.kernel_keys(16384, N, K, "bfloat16", algo="strassen", target=target) == [
        ("strassen", target, "bfloat16", (16384, N, K))]
    for M in (20000, 20480, 1000):         # pieces, or padded into the smallest bucket
        assert ops.kernel_keys(M, N, K, "bfloat16", algo="strassen", target=target) == [dynamic]
    monkeypatch.setenv(ops.DYNAMIC_ROWS_ENV, "0")
    buckets = ops.kernel_keys(20000, N, K, "bfloat16", algo="strassen", target=target)
    assert len(buckets) > 1 and all(len(k) == 4 for k in buckets)
    monkeypatch.setenv(ops.DYNAMIC_ROWS_ENV, "1")
    for M in (1, 1000, 20000, 100000):
        assert ops.kernel_keys(M, N, K, "bfloat16", algo="strassen", target=target) == [
            ("strassen", target, "bfloat16", (65536, N, K), "native", ops.DYNAMIC_ROWS)]


def _lcma_rows():
    """An Algorithm-1 Strassen composition's kernels and rows facts, as the build makes them."""
    kernels = [{"name": "x_combine_a", "args": ["A", "At", "M", "Mb"]},
               {"name": "x_combine_b", "args": ["B", "Bt"]},
               {"name": "x_batched_gemm", "args": ["At", "Bt", "H", "Mb"]},
               {"name": "x_combine_h", "args": ["H", "C", "Mb", "M"]}]
    Kb, Nb, item = K // 2, N // 2, 2
    rows = {"max_rows": MAX_ROWS, "m": 2, "row_tile": 128,
            "workspace": [["At", 0, 7 * Kb * item], ["Bt", 7 * Kb * Nb * item, 0], ["H", 0, 7 * Nb * item]]}
    Mb = row_blocks(MAX_ROWS, 2, 128)
    at, bt, h = 7 * Mb * Kb * item, 7 * Kb * Nb * item, 7 * Mb * Nb * item
    ws = [("At", 0), ("Bt", at), ("H", at + bt), ("__end__", at + bt + h)]
    return kernels, ws, rows


@needs_nvcc
def test_entry_point_sizes_the_workspace_from_the_run_time_m(tmp_path):
    """The entry file compiles, and its workspace for M rows is Ã and H of Mb = ceil(M/2)
    rounded up to the tile, plus B̃ (each slice 256-byte aligned); more than max_rows and
    negative M are refused."""
    from lcmac.targets.cuda import find_nvcc
    kernels, ws, rows = _lcma_rows()
    src = rows_entry(kernels, ws, rows, prepared_b_plan(kernels, ws))
    assert "lcmac_run_rows(const void* A, const void* B, void* C, long long M" in src
    assert "lcmac_run_rows_prepared(" in src and "call lcmac_run_rows" in src
    stubs = "".join(f'extern "C" int {k["name"]}_init() {{ return 0; }}\n'
                    f'extern "C" const char* {k["name"]}_get_last_error() {{ return ""; }}\n'
                    f'extern "C" int {k["name"]}_call('
                    + ", ".join("int" if a in ("M", "Mb") else "void*" for a in k["args"])
                    + ', cudaStream_t) { return 0; }\n' for k in kernels)
    Ms = [1, 100, 1000, 4097, 8192]
    main = ('#include <cstdio>\nextern "C" long long lcmac_workspace_bytes_rows(long long);\n'
            'extern "C" int lcmac_run_rows(const void*, const void*, void*, long long, void*, void*);\n'
            'int main() {\n'
            + "".join(f'  printf("%lld\\n", lcmac_workspace_bytes_rows({M}));\n' for M in Ms)
            + '  printf("%d %d\\n", lcmac_run_rows(0, 0, 0, 8193, 0, 0), lcmac_run_rows(0, 0, 0, -1, 0, 0));\n'
            '  return 0;\n}\n')
    (tmp_path / "entry.cu").write_text(src + "\n" + stubs + main)
    exe = tmp_path / "entry"
    subprocess.run([find_nvcc(), "-w", str(tmp_path / "entry.cu"), "-o", str(exe)], check=True,
                   capture_output=True)
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split("\n")
    align = lambda n: -(-n // 256) * 256  # noqa: E731
    for M, got in zip(Ms, out):
        Mb = row_blocks(M, 2, 128)
        assert int(got) == align(7 * Mb * (K // 2) * 2) + align(7 * (K // 2) * (N // 2) * 2) \
            + align(7 * Mb * (N // 2) * 2), M
    assert out[len(Ms)] == "-4 -4"


# ---- generated sources (TileLang, no GPU) ---------------------------------------------------
def _request(algo, config, shape=(MAX_ROWS, N, K), compile_=False, out_dir="."):
    return {"algorithm": algo, "target": "cuda-sm90a", "dtype": "bf16", "shape": list(shape),
            "config": config, "out_dir": str(out_dir), "compile": compile_}


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    """Code generation of the plain GEMM (run-time M and exact M = 4097), Strassen's
    Algorithm 1 (its default config: persistent batched GEMM) and fused grid form, each with
    run-time M; the plain GEMM and Algorithm 1 also compiled and linked with nvcc."""
    from lcmac.targets.cuda import find_nvcc
    try:
        find_nvcc()
        link = True
    except Exception:
        link = False
    cases = {"gemm": (None, {"dynamic_rows": True}, link), "gemm_exact": (None, {}, False),
             "strassen": ("strassen", {"dynamic_rows": True}, link),
             "strassen_fused": ("strassen", {"dynamic_rows": True, "fused": True}, False)}
    out = {}
    for name, (algo, cfg, comp) in cases.items():
        shape = (4097, N, K) if name == "gemm_exact" else (MAX_ROWS, N, K)
        r = worker(_request(algo, cfg, shape, comp, tmp_path_factory.mktemp(name)))
        assert r["ok"], (name, r.get("error"))
        r["src"] = {os.path.basename(p): Path(p).read_text() for p in r["sources"]}
        out[name] = r
    return out


@needs_tilelang
@pytest.mark.slow
def test_plain_gemm_takes_m_at_launch_with_the_exact_kernels_code(builds):
    r = builds["gemm"]
    [k] = r["kernels"]
    assert k["args"] == ["A", "B", "C", "M"] and k["grid"][1] == "(M + 127) / 128"
    src = r["src"]["lcmac_cuda_gemm.cu"]
    # the launcher takes M and builds A's and C's TMA descriptors from it: loads past row M
    # are zero-filled, stores clipped, so the kernel body has no row masks
    assert re.search(r"int lcmac_cuda_gemm_call\([^)]*int M, cudaStream_t", src)
    assert f"A_desc_globalDim[2]= {{{K},M}}" in src and f"C_desc_globalDim[2]= {{{N},M}}" in src
    exact = builds["gemm_exact"]["src"]["lcmac_cuda_gemm.cu"]
    strip = lambda body: body.replace(", int M)", ")")  # noqa: E731
    assert strip(kernel_body(src)) == kernel_body(exact)
    assert r["extra"]["rows"] == {"max_rows": MAX_ROWS, "m": 0, "row_tile": 0, "workspace": []}
    entry = r["src"]["lcmac_cuda_entry.cu"]
    assert "lcmac_run_rows(" in entry and "lcmac_cuda_gemm_call(bufs_A, bufs_B, bufs_C, bufs_M, s)" in entry
    if r["library"]:
        assert os.path.getsize(r["library"]) > 0


@needs_tilelang
@pytest.mark.slow
def test_lcma_kernels_take_m_and_mb_and_size_the_workspace_from_them(builds):
    r = builds["strassen"]
    args = {k["name"]: k["args"] for k in r["kernels"]}
    assert args == {"combine_a": ["A", "At", "M", "Mb"], "combine_b": ["B", "Bt"],
                    "batched_gemm": ["At", "Bt", "H", "Mb"], "combine_h": ["H", "C", "Mb", "M"]}
    assert r["config"]["persistent"] and r["config"]["dynamic_rows"]
    rows = r["extra"]["rows"]
    assert (rows["max_rows"], rows["m"], rows["row_tile"]) == (MAX_ROWS, 2, 128)
    assert [w[0] for w in rows["workspace"]] == ["At", "Bt", "H"]
    src = r["src"]
    # Combine A reads A's rows masked by M (Ã's rows past M are zeros); Combine H writes C's
    # rows below M only; the GEMM stage's tiles are whole (Mb a multiple of block_m)
    assert kernel_body(src["lcmac_cuda_combine_a.cu"]).count("< M)") >= 2
    assert kernel_body(src["lcmac_cuda_combine_h.cu"]).count("< M)") >= 2
    gemm = src["lcmac_cuda_batched_gemm.cu"]
    assert "At_desc_globalDim[3]= {1024,Mb,7}" in gemm and "H_desc_globalDim[3]= {512,Mb,7}" in gemm
    # the persistent walk divides by the run-time tile count in C, not floor division's selects
    assert "(Mb / -128)" not in gemm and "Mb % 128" not in gemm
    assert r["extra"]["prepared_b"]["kernels"] == ["combine_b"]
    entry = src["lcmac_cuda_entry.cu"]
    assert "lcmac_run_rows_prepared(" in entry and "lcmac_workspace_bytes_rows(" in entry
    if r["library"]:
        assert os.path.getsize(r["library"]) > 0


@needs_tilelang
@pytest.mark.slow
def test_fused_kernel_masks_c_rows_by_m(builds):
    r = builds["strassen_fused"]
    args = {k["name"]: k["args"] for k in r["kernels"]}
    assert args["fused_gemm_h"] == ["At", "Bt", "C", "Mb", "M"] and "H" not in str(r["extra"]["rows"])
    body = kernel_body(r["src"]["lcmac_cuda_fused_gemm_h.cu"])
    # C's rows masked by M (TVM moves the consumer warpgroups' thread offset to the right:
    # "< (M + 64)"), none by Mb: the tiles are whole
    assert re.search(r"< \(?M\b", body) and "< Mb)" not in body


@needs_tilelang
def test_unsupported_run_time_m_builds_are_refused_by_name(tmp_path):
    r = worker(_request("strassen", {"dynamic_rows": True, "operands": "fp16"}, out_dir=tmp_path))
    assert not r["ok"] and r["error_type"] == "NotSupportedYet" and "dynamic_rows" in r["error"]


# ---- on a GPU ---------------------------------------------------------------------------------
RAGGED = (1, 100, 1000, 4097, 8191, 20000)
WHOLE = (128, 256, 4096, 8192)
GPU_CASES = {"gemm": {}, "strassen": {}, "strassen-fused": {"fused": True}, "winograd^2": {}}


@pytest.fixture(scope="module")
def gpu_kernels(tmp_path_factory):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    out = tmp_path_factory.mktemp("rows")
    return build_and_load({name: dict(algo=name.split("-")[0], target="cuda", dtype="bfloat16",
                                      shape=(MAX_ROWS, N, K), config={"dynamic_rows": True, **cfg},
                                      out_dir=str(out / name.replace("^", "sq")))
                           for name, cfg in GPU_CASES.items()})


def build_and_load(jobs: dict) -> dict:
    """name → the loaded artifact of each build job (``build_many``, compiled together; the
    first failure raises)."""
    import lcmac
    from lcmac.artifact.build import build_many
    built = build_many(list(jobs.values()))
    for r in built:
        if isinstance(r, BaseException):
            raise r
    return {name: lcmac.load(p) for name, p in zip(jobs, built)}


def rel_error(C, ref):
    """‖C − ref‖_F / ‖ref‖_F in float64."""
    return float((C.double() - ref).norm() / ref.norm())


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(GPU_CASES))
def test_any_m_matches_float64_and_leaves_rows_past_m_alone(gpu_kernels, name):
    import torch
    f = gpu_kernels[name]
    assert type(f).__name__ == "CudaRowsMatmul"
    g = torch.Generator(device="cuda").manual_seed(7)
    B = torch.randn(K, N, device="cuda", generator=g).to(torch.bfloat16)
    Bp = f.prepare_b(B) if name != "gemm" else None
    for M in RAGGED + WHOLE:
        A = torch.randn(M, K, device="cuda", generator=g).to(torch.bfloat16)
        ref = A.double() @ B.double()
        # C is the first M rows of a larger buffer: rows past M must keep their poison
        big = torch.full((M + 64, N), float("nan"), device="cuda", dtype=torch.bfloat16)
        f(A, B, out=big[:M])
        torch.cuda.synchronize()
        assert torch.isfinite(big[:M]).all(), (name, M)
        assert torch.isnan(big[M:]).all(), (name, M, "rows past M were written")
        bound = 4e-2 if name != "gemm" else 1e-2
        assert rel_error(big[:M], ref) < bound, (name, M)
        if Bp is not None:
            assert torch.equal(f(A, Bp), big[:M]), (name, M, "prepared B")
    assert f(torch.empty(0, K, device="cuda", dtype=torch.bfloat16), B).shape == (0, N)


@pytest.mark.gpu
def test_matmul_runs_one_kernel_per_weight(gpu_kernels, monkeypatch):
    import torch
    import lcmac
    from lcmac.api import matmul as ops
    monkeypatch.setenv(ops.DYNAMIC_ROWS_ENV, "1")
    B = torch.randn(K, N, device="cuda").to(torch.bfloat16)
    for M in (100, 5000):
        A = torch.randn(M, K, device="cuda").to(torch.bfloat16)
        C = lcmac.matmul(A, B, algo="strassen")
        assert rel_error(C, A.double() @ B.double()) < 4e-2
    [key] = ops.kernel_keys(5000, N, K, "bfloat16", algo="strassen", target=ops.target_for("cuda"))
    assert key[-1] == ops.DYNAMIC_ROWS
    assert type(ops.kernel(*key)).__name__ == "CudaRowsMatmul"
