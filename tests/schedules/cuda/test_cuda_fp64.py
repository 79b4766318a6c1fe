"""float64 on CUDA beyond batched products: the plain GEMM and Algorithm 1 on the fp64 tensor
cores (mma.sync m8n8k4, or m16n8k4 pairs on sm_90a: ``CudaConfig.dmma``), what they refuse,
the generated CUDA (float64 accumulators and combines, cp.async copies, 8-byte workspaces),
one nvcc compile, and on a GPU (``-m gpu``) the exact product of inputs every GEMM computes
exactly, and errors against a double-double reference (``lcmac.tune.reference``)."""
from __future__ import annotations

import math
import os
import re

import pytest

from lcmac.core.errors import DTypeError, LcmacError
from lcmac.schedules.cuda import host_source
from lcmac.schedules.cuda.rows import rows_why
from lcmac.spec.cuda import (
    Blocking, CudaConfig, NotSupportedYet, arch_why, check_operands, cluster_kernels, fp64_why,
    persistent_gemm, stage_bytes)
from lcmac.spec.cuda.smem import SMEM_PER_CTA
from tests.schedules.cuda.test_cuda_codegen import kernel_body, needs_nvcc, needs_tilelang, worker

MMA_8x8x4 = ("mma_sync<tl::DataType::kFloat64, tl::DataType::kFloat64, tl::DataType::kFloat64, "
             "8, 8, 4, false, true>")


def test_float64_configs_are_a_128_square_tile_on_the_grid_kernel():
    for arch in ("sm_90a", "sm_80"):
        for lcma in (False, True):
            cfg = CudaConfig.from_dict({}, "float64", arch, lcma)
            assert (cfg.block_m, cfg.block_n, cfg.bk("float64"), cfg.policy) == (128, 128, 16, "square")
            assert not cfg.persistent and not cfg.store_via_smem and cfg.dmma == "m8n8k4"
            assert cfg.stages * stage_bytes(cfg, "float64") <= SMEM_PER_CTA[arch]
    assert stage_bytes(CudaConfig.from_dict({}, "float64", "sm_90a"), "float64") == 256 * 16 * 8
    explicit = CudaConfig.from_dict({"block_n": 64, "stages": 2}, "float64", "sm_90a")
    assert (explicit.block_m, explicit.block_n, explicit.stages) == (128, 64, 2)
    # the other dtypes keep their defaults
    assert CudaConfig.from_dict({}, "bfloat16", "sm_90a", False).block_n == 256


def test_float64_forms_without_a_kernel_are_refused_by_name():
    base = CudaConfig.from_dict({}, "float64", "sm_90a")
    assert fp64_why("float64", {}) is None and fp64_why("float64", {"batched": True}) is None
    assert fp64_why("bfloat16", {"fused": True}) is None
    assert "fused kernel" in fp64_why("float64", {"fused": True})
    assert "block-sparse" in fp64_why("float64", {"bsr": 64})
    with pytest.raises(NotSupportedYet, match="cp.async"):
        persistent_gemm(CudaConfig(persistent=True), "float64", "sm_90a")
    with pytest.raises(NotSupportedYet, match="cp.async, and multicast is TMA's"):
        cluster_kernels(CudaConfig(cluster=2), "float64", "sm_90a")
    for mode in ("fp16", "fp16x2", "fp8"):
        with pytest.raises(LcmacError, match="fp64 tensor cores"):
            check_operands(CudaConfig(operands=mode), "float64")
    assert "TMA descriptors" in rows_why(None, (1024, 1024, 1024), "float64", base, "sm_90a")
    assert rows_why(None, (1024, 1024, 1024), "bfloat16", CudaConfig(), "sm_90a") is None
    pair = CudaConfig(dmma="m16n8k4")
    assert arch_why(pair, "float64", "sm_90a") is None
    assert "m8n8k4 only" in arch_why(pair, "float64", "sm_80")
    assert "does not run on" in arch_why(pair, "bfloat16", "sm_90a")
    assert "batched products keep m8n8k4" in arch_why(CudaConfig(dmma="m16n8k4", batched=True), "float64", "sm_90a")
    assert "m16n8k16 fp64 mma is sm_90's" in arch_why(CudaConfig(dmma="m16n8k16"), "float64", "sm_80")
    with pytest.raises(LcmacError, match="dmma must be one of"):
        CudaConfig(dmma="m8n8k16").check()


def test_the_worker_refuses_before_lowering():
    from lcmac.targets.tilelang_worker import Request  # parses without TileLang
    rq = Request.parse({"target": "cuda-sm90a", "dtype": "float64", "shape": [512, 512, 512],
                        "algorithm": "strassen", "compile": False})
    assert (rq.config.block_n, rq.config.persistent, rq.config.direct_views) == (128, False, "auto")
    with pytest.raises(DTypeError, match="has no float64"):
        Request.parse({"target": "cuda-sm90a", "dtype": "float64", "shape": [512, 512, 512],
                       "algorithm": "strassen", "config": {"fused": True}})


def test_lcmac_matmul_takes_float64_on_cuda_for_a_named_algorithm():
    from lcmac.api import matmul as ops
    for target in ("cuda-sm90a", "cuda-sm80"):
        assert "float64" in ops.supported_dtypes(target)
        p = ops.plan(8192, 8192, 8192, "float64", algo="strassen", target=target)
        assert (p.runs, p.dtype, p.operands) == ("strassen", "float64", "native")
        # "auto" plans what lcmac.matmul runs: the vendor's DGEMM, and says why
        a = ops.plan(8192, 8192, 8192, "float64", target=target)
        assert (a.algo, a.runs) == ("auto", "vendor") and "does not price float64" in a.why, a.why
    with pytest.raises(DTypeError, match="float32, float64 on cuda-sm90a"):
        ops.plan(64, 64, 64, "int32", algo="gemm", target="cuda-sm90a")


# ---- the m16n8k4 pairing, on a source of the form TileLang 0.1.15 emits ------------------------
_LOOP = """      for (int i_10 = 0; i_10 < {e}; ++i_10) {{
        for (int j_1 = 0; j_1 < 4; ++j_1) {{
          tl::{mma}(reinterpret_cast<double*>(C_l + ((i_10 * 8) + (j_1 * 2))), reinterpret_cast<const double*>(A_local + i_10), reinterpret_cast<const double*>(B_local + j_1));
        }}
      }}
"""


def _source(*loops: str) -> str:
    return '#include <x>\nextern "C" __global__ void k(const double* A) {\n' + "".join(loops) + "}\n"


def test_dmma_pairs_rewrites_every_fp64_mma_and_nothing_else():
    code = _source(_LOOP.format(e=8, mma=MMA_8x8x4), _LOOP.format(e=8, mma=MMA_8x8x4))
    out = host_source.dmma_pairs(code, "lcmac_gemm")
    assert MMA_8x8x4 not in out and out.count("lcmac_dmma_m16n8k4(C_l") == 2
    assert out.count("i_10 += 2") == 2
    assert "lcmac_dmma_m16n8k4(C_l + ((i_10 * 8) + (j_1 * 2)), C_l + (((i_10 + 1) * 8) + (j_1 * 2)), " \
           "A_local + i_10, B_local + j_1);" in out
    assert "mma.sync.aligned.m16n8k4.row.col.f64.f64.f64.f64" in out
    assert out.index("__device__ __forceinline__ void lcmac_dmma") < out.index('extern "C" __global__')
    with pytest.raises(LcmacError, match="odd number"):
        host_source.dmma_pairs(_source(_LOOP.format(e=3, mma=MMA_8x8x4)), "lcmac_gemm")
    unpaired = _source(_LOOP.format(e=8, mma=MMA_8x8x4), "  tl::" + MMA_8x8x4 + "(C_l, A_local, B_local);\n")
    with pytest.raises(LcmacError, match="2 fp64 mma.sync calls, 1 of them"):
        host_source.dmma_pairs(unpaired, "lcmac_gemm")
    with pytest.raises(LcmacError, match="0 fp64 mma.sync"):
        host_source.dmma_pairs(_source(), "lcmac_gemm")


_KI = """      for (int ki = 0; ki < {n}; ++ki) {{
        for (int i_9 = 0; i_9 < 8; ++i_9) {{
          A_local[i_9] = ((double*)A_s)[((i_9 * 128) + (ki * 4))];
        }}
        for (int j = 0; j < 4; ++j) {{
          B_local[j] = ((double*)B_s)[((j * 8) + (ki * 64))];
        }}
{loop}      }}
"""
#: the product loops as they sit in a K-chunk loop (one level deeper)
_INNER = lambda e: "".join("  " + line + "\n" for line in _LOOP.format(e=e, mma=MMA_8x8x4).splitlines())


@pytest.mark.parametrize("g", [2, 4])
def test_dmma_k_groups_loads_g_chunks_and_issues_one_mma_for_them(g):
    decl = "      double A_local[8];\n      double B_local[4];\n"
    paired = host_source.dmma_pairs(_source(decl, _KI.format(n=4, loop=_INNER(8))), "k")
    out = host_source.dmma_k_groups(paired, "k", g)
    assert f"for (int ki = 0; ki < 4; ki += {g})" in out and "lcmac_dmma_m16n8k4(C_l" not in out
    # chunk c's fragments are loaded at K offset ki + c into their own arrays
    for c in range(1, g):
        assert f"double A_local_k{c}[8];" in out and f"double B_local_k{c}[4];" in out
        assert f"A_local_k{c}[i_9] = ((double*)A_s)[((i_9 * 128) + ((ki + {c}) * 4))];" in out
        assert f"B_local_k{c}[j] = ((double*)B_s)[((j * 8) + ((ki + {c}) * 64))];" in out
    a = ", ".join(["A_local + i_10"] + [f"A_local_k{c} + i_10" for c in range(1, g)])
    b = ", ".join(["B_local + j_1"] + [f"B_local_k{c} + j_1" for c in range(1, g)])
    assert out.count(f"lcmac_dmma_m16n8k{4 * g}(C_l + ((i_10 * 8) + (j_1 * 2)), "
                     f"C_l + (((i_10 + 1) * 8) + (j_1 * 2)), {a}, {b});") == 1
    # A: 2G registers (rows g, g + 8 of each chunk), B: G, in chunk order
    assert f"mma.sync.aligned.m16n8k{4 * g}.row.col.f64.f64.f64.f64" in out
    assert '"d"(a1[0]), "d"(a1[1])' in out and f'"d"(b{g - 1}[0])' in out
    assert out.count("{") == out.count("}")
    with pytest.raises(LcmacError, match="chunks of 4, not a multiple"):
        host_source.dmma_k_groups(host_source.dmma_pairs(
            _source(decl, _KI.format(n=6, loop=_INNER(8))), "k"), "k", 4)
    loads_after = _KI.format(n=4, loop="").replace("      for (int ki = 0; ki < 4; ++ki) {\n",
                                                    "      for (int ki = 0; ki < 4; ++ki) {\n" + _INNER(8))
    with pytest.raises(LcmacError, match="does not load its fragments before"):
        host_source.dmma_k_groups(host_source.dmma_pairs(_source(decl, loads_after), "k"), "k", g)
    with pytest.raises(LcmacError, match="not all in loops over K chunks"):
        host_source.dmma_k_groups(host_source.dmma_pairs(_source(_LOOP.format(e=8, mma=MMA_8x8x4)), "k"), "k", g)


# ---- generated CUDA (the TileLang worker, no compile) -------------------------------------------
SHAPE = (1000, 1064, 1032)        # no dimension divides the 2x2 grid times the 128² tile


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    """{case: (response, {source name: text})} of the float64 builds the tests read."""
    base = tmp_path_factory.mktemp("fp64")
    cases = {"gemm": (None, "cuda-sm90a", {}), "gemm-m16": (None, "cuda-sm90a", {"dmma": "m16n8k4"}),
             "gemm-k16": (None, "cuda-sm90a", {"dmma": "m16n8k16"}),
             "gemm-sm80": (None, "cuda-sm80", {}), "strassen": ("strassen", "cuda-sm90a", {}),
             "dps": ("dps-4x4x4-r48", "cuda-sm90a", {"dmma": "m16n8k4"})}
    out = {}
    for key, (alg, target, cfg) in cases.items():
        r = worker({"algorithm": alg, "target": target, "dtype": "float64", "shape": list(SHAPE),
                    "config": cfg, "out_dir": str(base / key), "compile": False})
        assert r["ok"], (key, r.get("error"))
        out[key] = (r, {os.path.basename(p): open(p).read() for p in r["sources"]})
    return out


def _kernel(srcs: dict, name: str) -> str:
    return kernel_body(next(v for k, v in srcs.items() if k.endswith(f"_{name}.cu")))


@needs_tilelang
def test_plain_gemm_runs_on_the_fp64_tensor_cores(generated):
    for key, pdl in (("gemm", True), ("gemm-sm80", False)):
        r, srcs = generated[key]
        body = _kernel(srcs, "gemm")
        assert r["gemm_precision"] == "float64" and r["config"]["block_n"] == 128
        assert MMA_8x8x4 in body and "wgmma" not in body and "tma_load" not in body, key
        assert "cp_async_gs" in body and "double C_l[64]" in body, key       # 128² over 8 warps
        assert not re.search(r"\bfloat\b", body), key                      # nothing rounded to fp32
        assert ("cudaGridDependencySynchronize" in body) is pdl, key
        assert r["kernels"][0]["grid"] == [math.ceil(SHAPE[1] / 128), math.ceil(SHAPE[0] / 128), 1]
    body = _kernel(generated["gemm-m16"][1], "gemm")
    assert MMA_8x8x4 not in body and "lcmac_dmma_m16n8k4(" in body
    body = _kernel(generated["gemm-k16"][1], "gemm")
    assert MMA_8x8x4 not in body and "lcmac_dmma_m16n8k4(C" not in body and "lcmac_dmma_m16n8k16(C_l" in body


@needs_tilelang
def test_algorithm_1_in_float64_combines_and_workspace(generated):
    r, srcs = generated["strassen"]
    assert [k["name"] for k in r["kernels"]] == ["combine_a", "combine_b", "batched_gemm", "combine_h"]
    blk = Blocking(*SHAPE, 2, 2, 2, 7)
    at, bt, h = 7 * blk.Mb * blk.Kb * 8, 7 * blk.Kb * blk.Nb * 8, 7 * blk.Mb * blk.Nb * 8
    up = lambda b: -(-b // 256) * 256  # noqa: E731
    assert r["workspace"] == [["At", 0], ["Bt", up(at)], ["H", up(at) + up(bt)]]      # 8-byte elements
    assert r["workspace_bytes"] == up(at) + up(bt) + up(h)
    for k in ("combine_a", "combine_b", "combine_h"):
        body = _kernel(srcs, k)
        assert "double" in body and not re.search(r"\bfloat\b", body), k    # float64 sums
    gemm = _kernel(srcs, "batched_gemm")
    assert MMA_8x8x4 in gemm and "cp_async_gs" in gemm and "tma_load" not in gemm
    assert "extra" not in r or "direct_views" not in (r["extra"] or {})     # views are TMA's
    # rational coefficients (dps-4x4x4-r48: halves, quarters, eighths) as float64 literals
    _, dps = generated["dps"]
    h = _kernel(dps, "combine_h")
    assert "0x1p-1/*5.000000e-01*/" in h and not re.search(r"0x[0-9a-f.p+-]+f\b", h)
    assert "lcmac_dmma_m16n8k4(" in _kernel(dps, "batched_gemm")


@needs_tilelang
@needs_nvcc
def test_float64_strassen_with_m16n8k4_compiles_without_spills(tmp_path):
    r = worker({"algorithm": "strassen", "target": "cuda-sm90a", "dtype": "float64",
                "shape": [1024, 1024, 1024], "config": {"dmma": "m16n8k4"}, "out_dir": str(tmp_path),
                "jobs": 2})
    assert r["ok"], r.get("error")
    assert os.path.getsize(r["library"]) > 10_000
    for k, v in r["ptxas"].items():
        assert all(x == 0 for x in v["spill_stores"]), (k, v)


# ---- on a GPU ---------------------------------------------------------------------------------
GPU_CASES = [("gemm", (1024, 1024, 1024), {}), ("gemm", SHAPE, {}),
             ("gemm", (1024, 1024, 1024), {"dmma": "m16n8k4"}),
             ("strassen", (1024, 1024, 1024), {}), ("strassen", SHAPE, {"dmma": "m16n8k4"}),
             ("strassen^2", (2048, 2048, 2048), {}), ("winograd^2", (2048, 2048, 2048), {}),
             ("dps-4x4x4-r48", (2048, 2048, 2048), {}),
             ("gemm", SHAPE, {"dmma": "m16n8k8"}), ("gemm", (1024, 1024, 1024), {"dmma": "m16n8k16"}),
             ("strassen", SHAPE, {"dmma": "m16n8k16"})]


def _gpu():
    try:
        import torch
        return torch.cuda.is_available()
    except ImportError:
        return False


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    """(algorithm, shape, config) → the loaded artifact, built in parallel."""
    from concurrent.futures import ThreadPoolExecutor

    import lcmac
    base = tmp_path_factory.mktemp("fp64-gpu")

    def one(i_case):
        i, (algo, shape, cfg) = i_case
        return lcmac.load(lcmac.build(algo, "cuda", "float64", shape, config=cfg or None,
                                      out_dir=str(base / str(i))))
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as ex:
        fns = list(ex.map(one, enumerate(GPU_CASES)))
    return {(a, s, tuple(sorted(c.items()))): f for (a, s, c), f in zip(GPU_CASES, fns)}


def _ids(cases):
    return [f"{a}-{'x'.join(map(str, s))}" + "".join(f"-{v}" for v in c.values()) for a, s, c in cases]


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("algo, shape, cfg", GPU_CASES, ids=_ids(GPU_CASES))
def test_float64_kernels_are_exact_where_the_product_is(artifacts, algo, shape, cfg):
    import torch

    from lcmac.tune.reference import exact_operands, exact_product
    fn = artifacts[(algo, shape, tuple(sorted(cfg.items())))]
    M, N, K = shape
    A, B = exact_operands(M, N, K, device="cuda", seed=M + K)
    C = torch.full((M, N), float("nan"), device="cuda", dtype=torch.float64)
    fn(A, B, out=C)
    assert torch.equal(C.cpu(), exact_product(A, B)), (algo, shape, cfg)


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("algo, shape, cfg", GPU_CASES, ids=_ids(GPU_CASES))
def test_float64_errors_against_double_double(artifacts, algo, shape, cfg):
    """Normal data: the plain GEMM within 2× DGEMM's error against the double-double product,
    an LCMA within 64× (a float32 step anywhere would be some 10⁸×)."""
    import torch

    from lcmac.tune.reference import dd_error, dd_matmul
    fn = artifacts[(algo, shape, tuple(sorted(cfg.items())))]
    M, N, K = shape
    g = torch.Generator(device="cuda").manual_seed(1)
    A = torch.randn(M, K, device="cuda", dtype=torch.float64, generator=g)
    B = torch.randn(K, N, device="cuda", dtype=torch.float64, generator=g)
    hi, lo = dd_matmul(A, B)
    err, ref = dd_error(fn(A, B), hi, lo), dd_error(torch.matmul(A, B), hi, lo)
    print(f"{algo} {shape} {cfg}: error {err:.3e}, DGEMM {ref:.3e} ({err / ref:.2f}x)")
    assert err <= (2 if algo == "gemm" else 64) * ref, (err, ref)


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu(), reason="needs a CUDA GPU")
def test_lcmac_matmul_float64_on_cuda():
    import torch

    import lcmac
    from lcmac.tune.reference import exact_operands, exact_product
    A, B = exact_operands(1024, 512, 768, device="cuda", seed=3)
    for algo in ("gemm", "strassen"):
        assert torch.equal(lcmac.matmul(A, B, algo=algo).cpu(), exact_product(A, B)), algo
    g = torch.Generator(device="cuda").manual_seed(0)
    X = torch.randn(512, 256, device="cuda", dtype=torch.float64, generator=g)
    Y = torch.randn(256, 384, device="cuda", dtype=torch.float64, generator=g)
    assert torch.equal(lcmac.matmul(X, Y), torch.matmul(X, Y))      # "auto": the vendor's DGEMM
