"""CUDA artifacts whose M, N and K are run-time values (``CudaConfig.dynamic_shape``,
``lcmac.schedules.cuda.rows``): what refuses, the blocking and workspace facts, the entry
point (compiled against stub kernels), the generated sources and their compilation without a
GPU, and results against float64 on one (``-m gpu``).
"""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from lcmac import ir
from lcmac.schedules.cuda.entry_point import shape_entry
from lcmac.schedules.cuda.rows import row_blocks, shape_info, shape_units, shape_why
from lcmac.spec.cuda.config import CudaConfig
from tests.schedules.cuda.test_cuda_codegen import kernel_body, needs_nvcc, needs_tilelang, worker
from tests.schedules.cuda.test_cuda_dynamic_rows import build_and_load, rel_error

MAX = (8192, 4096, 4096)          # the largest M, N, K a launch of the built kernels takes


# ---- without a compiler ---------------------------------------------------------------------
@pytest.mark.parametrize("cfg, algo, dtype, why", [
    ({"operands": "fp16"}, "strassen", "bfloat16", "operands='fp16'"),
    ({"cluster": 2}, None, "bfloat16", "cluster=2"),
    ({"fused": True, "split_group": True}, "strassen", "bfloat16", "persistent fused forms"),
    ({"direct_views": "ab"}, "strassen", "bfloat16", "direct_views='ab'"),
    ({"batched": True}, None, "bfloat16", "batched"),
    ({}, "strassen", "float64", "cp.async"),
])
def test_configs_without_a_run_time_shape_form_say_why(cfg, algo, dtype, why):
    alg = ir.get(algo) if algo else None
    got = shape_why(alg, MAX, dtype, CudaConfig(**cfg), "sm_90a")
    assert got is not None and why in got


def test_default_configs_have_a_run_time_shape_form_up_to_the_grid_limits():
    strassen = ir.get("strassen")
    for alg in (None, strassen, ir.get("winograd^2")):
        for cfg in (CudaConfig(), CudaConfig(persistent=True), CudaConfig(fused=True)):
            assert shape_why(alg, MAX, "bfloat16", cfg, "sm_90a") is None
    # Combine B's grid has ceil(Kb / 4) rows: a K past 2·4·65535 is refused, naming the limit
    got = shape_why(strassen, (1024, 1024, 2 * 4 * 65536), "bfloat16", CudaConfig(), "sm_90a")
    assert "65535" in got and "K = " in got
    assert "M = " in shape_why(strassen, (2 * 4 * 65536, 1024, 1024), "bfloat16", CudaConfig(), "sm_90a")


def test_block_sizes_are_whole_tiles_of_rows_and_16_byte_columns():
    strassen = ir.get("strassen")
    assert shape_units(strassen, "bfloat16", CudaConfig()) == {"row_tile": 128, "col_tile": 8,
                                                              "depth_tile": 8, "vec": 8}
    assert shape_units(strassen, "float32", CudaConfig())["vec"] == 4
    # the fused epilogue writes C from whole tiles: Nb a multiple of block_n
    assert shape_units(strassen, "bfloat16", CudaConfig(fused=True))["col_tile"] == 256
    assert shape_units(None, "bfloat16", CudaConfig())["row_tile"] == 0
    ws = [("At", 0), ("Bt", 1 << 20), ("H", 2 << 20), ("__end__", 3 << 20)]
    info = shape_info(strassen, MAX, "bfloat16", CudaConfig(), ws)
    assert (info["max"], info["item"], info["m"], info["k"], info["n"]) == (list(MAX), 2, 2, 2, 2)
    assert info["workspace"] == [["At", 14, ["Mb", "Kb"]], ["Bt", 14, ["Kb", "Nb"]], ["H", 14, ["Mb", "Nb"]]]
    assert shape_info(None, MAX, "bfloat16", CudaConfig(), [])["workspace"] == []


def _strassen_entry():
    """The kernels and facts of a run-time-shape Strassen composition, as the build makes them."""
    kernels = [{"name": "x_combine_a", "args": ["A", "At", "M", "K", "Mb", "Kb"]},
               {"name": "x_combine_b", "args": ["B", "Bt", "K", "N", "Kb", "Nb"]},
               {"name": "x_batched_gemm", "args": ["At", "Bt", "H", "Mb", "Kb", "Nb"]},
               {"name": "x_combine_h", "args": ["H", "C", "Mb", "Nb", "M", "N"]}]
    ws = [("At", 0), ("Bt", 1 << 20), ("H", 2 << 20), ("__end__", 3 << 20)]
    return kernels, ws, shape_info(ir.get("strassen"), MAX, "bfloat16", CudaConfig(), ws)


@needs_nvcc
def test_entry_point_checks_the_shape_and_sizes_the_workspace_from_it(tmp_path):
    """The entry file compiles; each kernel gets M, N, K and the blocks Mb = ceil(M/2) rounded
    up to 128 rows, Nb, Kb = ceil(N/2), ceil(K/2) rounded up to 8 (16 bytes); the workspace
    of a shape is Ã, B̃ and H of those blocks, each slice 256-byte aligned.  Shapes past the
    largest, negative, with N or K not a multiple of 8, or misaligned operands are refused
    with a message naming the shape and the rule; M = 0 launches nothing."""
    from lcmac.targets.cuda import find_nvcc
    kernels, ws, info = _strassen_entry()
    src = shape_entry(kernels, ws, info)
    assert "lcmac_run_shape(const void* A, const void* B, void* C, long long M, long long N" in src
    assert "call lcmac_run_shape" in src
    # the stubs print the sizes each kernel is given
    stubs = ""
    for k in kernels:
        ints = [a for a in k["args"] if a in ("M", "N", "K", "Mb", "Nb", "Kb")]
        params = ", ".join(f"int {a}" if a in ints else f"void* p{i}" for i, a in enumerate(k["args"]))
        fmt = " ".join(f"{a}=%d" for a in ints)
        stubs += (f'extern "C" int {k["name"]}_init() {{ return 0; }}\n'
                  f'extern "C" const char* {k["name"]}_get_last_error() {{ return ""; }}\n'
                  f'extern "C" int {k["name"]}_call({params}, cudaStream_t) {{ '
                  f'printf("{k["name"]} {fmt}\\n", {", ".join(ints)}); return 0; }}\n')
    shapes = [(1, 8, 8), (100, 776, 1232), (4097, 4096, 4096), (8192, 8, 4096)]
    refused = [(8193, 8, 8), (8, 4104, 8), (8, 8, 4104), (8, 12, 8), (8, 8, 7), (-1, 8, 8)]
    main = ('#include <cstdio>\nextern "C" long long lcmac_workspace_bytes_shape(long long, long long, long long);\n'
            'extern "C" int lcmac_run_shape(const void*, const void*, void*, long long, long long, long long, '
            'void*, void*);\nextern "C" const char* lcmac_last_error();\n'
            'int main() {\n  static char buf[64] __attribute__((aligned(16))); void* p = buf;\n'
            + "".join(f'  printf("ws %lld\\n", lcmac_workspace_bytes_shape({M}, {N}, {K}));\n'
                      f'  printf("rc %d\\n", lcmac_run_shape(p, p, p, {M}, {N}, {K}, p, 0));\n'
                      for M, N, K in shapes)
            + "".join(f'  printf("ws %lld\\n", lcmac_workspace_bytes_shape({M}, {N}, {K}));\n'
                      f'  printf("rc %d %s\\n", lcmac_run_shape(p, p, p, {M}, {N}, {K}, p, 0), lcmac_last_error());\n'
                      for M, N, K in refused)
            + '  printf("rc %d\\n", lcmac_run_shape(p, p, p, 0, 8, 8, p, 0));\n'
            '  printf("rc %d %s\\n", lcmac_run_shape(buf + 2, p, p, 8, 8, 8, p, 0), lcmac_last_error());\n'
            '  return 0;\n}\n')
    # no GPU here: the launches' error checks see a clean runtime
    fake = "#include <cuda_runtime.h>\n#define cudaGetLastError() cudaSuccess\n"
    (tmp_path / "entry.cu").write_text(fake + src + "\n" + stubs + main)
    exe = tmp_path / "entry"
    subprocess.run([find_nvcc(), "-w", str(tmp_path / "entry.cu"), "-o", str(exe)], check=True,
                   capture_output=True)
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.splitlines()
    align = lambda n: -(-n // 256) * 256  # noqa: E731
    r8 = lambda n: -(-n // 8) * 8  # noqa: E731
    for M, N, K in shapes:
        Mb, Nb, Kb = row_blocks(M, 2, 128), r8(-(-N // 2)), r8(-(-K // 2))
        assert out.pop(0) == f"ws {align(14 * Mb * Kb) + align(14 * Kb * Nb) + align(14 * Mb * Nb)}"
        assert out[:4] == [f"x_combine_a M={M} K={K} Mb={Mb} Kb={Kb}", f"x_combine_b K={K} N={N} Kb={Kb} Nb={Nb}",
                           f"x_batched_gemm Mb={Mb} Kb={Kb} Nb={Nb}", f"x_combine_h Mb={Mb} Nb={Nb} M={M} N={N}"]
        assert out[4] == "rc 0"
        del out[:5]
    for M, N, K in refused:
        assert out.pop(0) == "ws -1"
        line = out.pop(0)
        assert line.startswith(f"rc -4 {M}x{N}x{K}: "), line
        rule = ("must not be negative" if M < 0 else "multiples of 8" if N % 8 or K % 8 else
                "up to 8192x4096x4096")
        assert rule in line, line
    assert out.pop(0) == "rc 0"                       # M = 0: nothing launched
    assert out.pop(0).startswith("rc -4 8x8x8: A, B, C and the workspace must be 16-byte aligned")
    assert out == []


# ---- generated sources and their compilation (TileLang and nvcc, no GPU) -------------------
def _request(algo, config, shape=MAX, compile_=False, out_dir="."):
    return {"algorithm": algo, "target": "cuda-sm90a", "dtype": "bf16", "shape": list(shape),
            "config": config, "out_dir": str(out_dir), "compile": compile_}


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    """The plain GEMM and Strassen's Algorithm 1 (its default config: the persistent batched
    GEMM) with run-time M, N and K, generated and, where nvcc is installed, compiled and linked
    (about a minute on two cores); Strassen's fused grid form generated only (another)."""
    from lcmac.targets.cuda import find_nvcc
    try:
        find_nvcc()
        link = True
    except Exception:
        link = False
    out = {}
    for name, algo, cfg, comp in (("gemm", None, {}, link), ("strassen", "strassen", {}, link),
                                  ("strassen_fused", "strassen", {"fused": True}, False)):
        r = worker(_request(algo, {"dynamic_shape": True, **cfg}, MAX, comp, tmp_path_factory.mktemp(name)))
        assert r["ok"], (name, r.get("error"))
        r["src"] = {os.path.basename(p): Path(p).read_text() for p in r["sources"]}
        out[name] = r
    return out


@needs_tilelang
@pytest.mark.slow
def test_plain_gemm_takes_m_n_k_at_launch(builds):
    r = builds["gemm"]
    [k] = r["kernels"]
    assert k["args"] == ["A", "B", "C", "M", "K", "N"]
    assert k["grid"][:2] == ["(N + 255) / 256", "(M + 127) / 128"]
    src = r["src"]["lcmac_cuda_gemm.cu"]
    # every descriptor is built from the launch's sizes: loads past M, N, K read zeros and
    # stores are clipped, so the kernel has no masks; the K loop runs ceil(K / 64) slabs
    assert re.search(r"int lcmac_cuda_gemm_call\([^)]*int M, int K, int N, cudaStream_t", src)
    for desc, dims in (("A", "{K,M}"), ("B", "{N,K}"), ("C", "{N,M}")):
        assert f"{desc}_desc_globalDim[2]= {dims}" in src
    body = kernel_body(src)
    assert "((K + 63) >> 6)" in body and "< M" not in body and "< N" not in body
    assert r["extra"]["dynamic_shape"]["max"] == list(MAX)
    assert r["extra"]["prepared_b"] == {"unsupported": "the size of B~ depends on the run-time N and K"}
    entry = r["src"]["lcmac_cuda_entry.cu"]
    assert "lcmac_cuda_gemm_call(bufs_A, bufs_B, bufs_C, bufs_M, bufs_K, bufs_N, s)" in entry
    if r["library"]:
        assert os.path.getsize(r["library"]) > 0


@needs_tilelang
@pytest.mark.slow
def test_lcma_kernels_take_the_shape_and_mask_by_it(builds):
    r = builds["strassen"]
    args = {k["name"]: k["args"] for k in r["kernels"]}
    assert args == {"combine_a": ["A", "At", "M", "K", "Mb", "Kb"], "combine_b": ["B", "Bt", "K", "N", "Kb", "Nb"],
                    "batched_gemm": ["At", "Bt", "H", "Mb", "Kb", "Nb"],
                    "combine_h": ["H", "C", "Mb", "Nb", "M", "N"]}
    assert r["config"]["persistent"] and r["config"]["dynamic_shape"]
    info = r["extra"]["dynamic_shape"]
    assert (info["m"], info["row_tile"], info["col_tile"], info["depth_tile"]) == (2, 128, 8, 8)
    src = r["src"]
    ca, cb, ch = (kernel_body(src[f"lcmac_cuda_combine_{s}.cu"]) for s in "abh")
    # Combine A reads A masked by row < M and col < K, Combine B by K and N, Combine H writes
    # C masked by M and N; each keeps its 4-wide vectors (the kernels state that N, K and the
    # blocks are multiples of 8: T.assume)
    assert "< M)" in ca and "< K)" in ca and "< K)" in cb and "< N)" in cb
    assert "< M)" in ch and "< N)" in ch
    for body in (ca, cb, ch):
        assert "*(uint2*)(" in body
    gemm = src["lcmac_cuda_batched_gemm.cu"]
    for desc, dims in (("At", "{Kb,Mb,7}"), ("Bt", "{Nb,Kb,7}"), ("H", "{Nb,Mb,7}")):
        assert f"{desc}_desc_globalDim[3]= {dims}" in gemm
    # the persistent walk's run-time divisions are C's, not floor division's selects
    assert "(Kb + 63) >> 6" in gemm and "/ -" not in kernel_body(gemm)
    # ... and walked tile by tile, k by k: no step divides by the run-time slab count
    assert kernel_body(gemm).count("for (int lcmac_k_") == 2
    assert "/ ((Kb + 63) >> 6)" not in kernel_body(gemm) and "% ((Kb + 63) >> 6)" not in kernel_body(gemm)
    entry = src["lcmac_cuda_entry.cu"]
    assert "lcmac_workspace_bytes_shape(" in entry and "lcmac_run_rows" not in entry
    if r["library"]:
        assert os.path.getsize(r["library"]) > 0


@needs_tilelang
@pytest.mark.slow
def test_fused_kernel_masks_c_by_m_and_n_on_whole_tiles(builds):
    r = builds["strassen_fused"]
    args = {k["name"]: k["args"] for k in r["kernels"]}
    assert args["fused_gemm_h"] == ["At", "Bt", "C", "Mb", "Kb", "Nb", "M", "N"]
    assert r["extra"]["dynamic_shape"]["col_tile"] == 256
    assert [w[0] for w in r["extra"]["dynamic_shape"]["workspace"]] == ["At", "Bt"]
    body = kernel_body(r["src"]["lcmac_cuda_fused_gemm_h.cu"])
    # C masked by M and N (TVM moves the consumer warpgroups' thread offset to the right:
    # "< (M + 64)"), none by Mb or Nb: the tiles are whole
    assert re.search(r"< \(?M\b", body) and "< N)" in body
    assert "< Mb" not in body and "< Nb" not in body and "(Kb + 63) >> 6" in body


@needs_tilelang
def test_unsupported_run_time_shape_builds_are_refused_by_name(tmp_path):
    for cfg in ({"fused": True, "split_group": True}, {"operands": "fp16"}):
        r = worker(_request("strassen", {"dynamic_shape": True, **cfg}, out_dir=tmp_path))
        assert not r["ok"] and r["error_type"] == "NotSupportedYet" and "dynamic_shape" in r["error"], r


# ---- on a GPU ---------------------------------------------------------------------------------
GPU_MAX = (4096, 4096, 4096)
GPU_CASES = ("gemm", "strassen", "strassen-fused", "winograd^2")
ALIGNED = [(8, 8, 8), (1000, 776, 1232), (1200, 1000, 904), (4096, 4096, 4096), (5000, 2048, 1024)]
RAGGED = [(3, 5, 7), (1000, 777, 1234), (1201, 1001, 903)]


@pytest.fixture(scope="module")
def gpu_kernels(tmp_path_factory):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    out = tmp_path_factory.mktemp("shape")
    return build_and_load({name: dict(algo=name.split("-")[0], target="cuda", dtype="bfloat16", shape=GPU_MAX,
                                      config={"dynamic_shape": True, "fused": name.endswith("fused")},
                                      out_dir=str(out / name.replace("^", "sq"))) for name in GPU_CASES})


@pytest.mark.gpu
@pytest.mark.parametrize("name", GPU_CASES)
def test_any_shape_matches_float64_and_leaves_rows_past_m_alone(gpu_kernels, name):
    import torch
    f = gpu_kernels[name]
    assert type(f).__name__ == "CudaShapeMatmul"
    g = torch.Generator(device="cuda").manual_seed(11)
    bound = 1e-2 if name == "gemm" else 4e-2
    for M, N, K in ALIGNED:           # 5000 rows: two launches of up to 4096
        A = torch.randn(M, K, device="cuda", generator=g).to(torch.bfloat16)
        B = torch.randn(K, N, device="cuda", generator=g).to(torch.bfloat16)
        # C is the first M rows of a larger buffer: rows past M must keep their poison
        big = torch.full((M + 64, N), float("nan"), device="cuda", dtype=torch.bfloat16)
        f(A, B, out=big[:M])
        torch.cuda.synchronize()
        assert torch.isfinite(big[:M]).all() and torch.isnan(big[M:]).all(), (name, M, N, K)
        assert rel_error(big[:M], A.double() @ B.double()) < bound, (name, M, N, K)
    A, B = torch.ones(8, 0, device="cuda", dtype=torch.bfloat16), torch.ones(0, 16, device="cuda", dtype=torch.bfloat16)
    assert torch.equal(f(A, B), torch.zeros(8, 16, device="cuda", dtype=torch.bfloat16))


@pytest.mark.gpu
@pytest.mark.parametrize("name", GPU_CASES)
def test_ragged_shapes_run_padded_and_columns_past_n_stay_alone(gpu_kernels, name):
    import torch
    from lcmac.core.errors import ShapeError
    from lcmac.runtime.bundle import run_shape
    f = gpu_kernels[name]
    g = torch.Generator(device="cuda").manual_seed(5)
    bound = 1e-2 if name == "gemm" else 4e-2
    for M, N, K in RAGGED:
        A = torch.randn(M, K, device="cuda", generator=g).to(torch.bfloat16)
        B = torch.randn(K, N, device="cuda", generator=g).to(torch.bfloat16)
        with pytest.raises(ShapeError, match=rf"{M}x{N}x{K} \(MxNxK\): N and K must be multiples of 8"):
            f(A, B)
        wide = torch.full((M, N + 8), float("nan"), device="cuda", dtype=torch.bfloat16)
        run_shape(f, A, B, out=wide[:, :N])
        assert torch.isnan(wide[:, N:]).all(), (name, M, N, K, "columns past N were written")
        assert rel_error(wide[:, :N], A.double() @ B.double()) < bound, (name, M, N, K)
    too_big = torch.zeros(8, GPU_MAX[2] + 8, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ShapeError, match="K up to 4096"):
        run_shape(f, too_big, torch.zeros(GPU_MAX[2] + 8, 8, device="cuda", dtype=torch.bfloat16))
