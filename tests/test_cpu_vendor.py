"""The vendor BLAS as an LCMA's base case (config ``vendor_base``, lcmac.schedules.cpu_vendor):
the text calls the BLAS once per product and reads single blocks in place; shapes it cannot
split are refused; artifacts against float64 in float32 and float64 with B prepared or not;
the BLAS bound at load time from Python and from C, and a clear error where there is none."""
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import lcmac
from lcmac.core.errors import ArtifactError, DTypeError, ShapeError
from lcmac.ir import get
from lcmac.runtime import vendor_blas
from lcmac.schedules import cpu_vendor
from lcmac.spec.cpu.config import CpuConfig
from lcmac.schedules.cpu_lcma import programs_for
from lcmac.spec.cpu.x86 import host_supports

ROOT = Path(__file__).resolve().parents[1]
HOST = next((t for t in ("x86_64-avx512", "x86_64-avx2") if host_supports(t)), None)
needs_host = pytest.mark.skipif(HOST is None, reason="needs an AVX2 or AVX-512 x86-64 host")


def test_text_calls_the_blas_once_per_product_and_reads_blocks_in_place():
    alg = get("winograd")
    src, info = cpu_vendor.generate(alg, "float32", 64, 32, 48, programs_for(alg), 8,
                                    "lcmac_matmul", "_prepare_b", "_prepared")
    main = src.split("def lcmac_matmul_prepare_b")[0]
    assert main.count("lcmac_vendor_sgemm\", T.int64(32)") == 7          # R products, BM = 32
    # Winograd's A side: 3 products read one block of A as it is (lda = K = 48)
    assert info["in_place"] == {"A": 3, "B": 3} and main.count("T.int64(48), T.address_of(B") >= 1
    assert "@__lcmac_cblas_sgemm_ilp64 = global ptr null" in src
    assert src.count("global ptr null") == 2                    # defined once, declared elsewhere
    assert info["gemm_kernel"] == "vendor-blas" and info["prepared_b"]["shape"] == [7, 24 * 16]


def test_shapes_and_dtypes_it_cannot_take_are_refused():
    alg = get("strassen")
    gen = lambda dt, M, N, K: cpu_vendor.generate(alg, dt, M, N, K, programs_for(alg), 8, "f", "_p", "_q")  # noqa: E731
    with pytest.raises(ShapeError, match="divisible by strassen's grid"):
        gen("float32", 63, 64, 64)
    with pytest.raises(ShapeError, match="multiples of 8"):
        gen("float32", 64, 64, 36)
    with pytest.raises(DTypeError, match="float32 and float64"):
        gen("bfloat16", 64, 64, 64)
    with pytest.raises(ValueError, match="vendor_base"):
        CpuConfig(mr=32, nr=32, kc=64, amx=True, vendor_base=True).validate(16)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    if HOST is None:
        pytest.skip("needs an AVX2 or AVX-512 x86-64 host")
    out = tmp_path_factory.mktemp("vendor")
    cases = [("strassen", "float32", (64, 96, 160)), ("winograd", "float32", (256, 128, 192)),
             ("strassen^2", "float64", (128, 64, 96))]
    return {c: lcmac.build(c[0], target=HOST, dtype=c[1], shape=c[2], config={"vendor_base": True},
                           out_dir=out) for c in cases}


@needs_host
def test_artifacts_match_float64_with_and_without_prepared_b(built):
    for (alg, dtype, (M, N, K)), path in built.items():
        f = lcmac.load(path)
        assert "gemm" in f.vendor_blas
        rng = np.random.default_rng(3)
        A = rng.standard_normal((M, K)).astype(dtype)
        B = rng.standard_normal((K, N)).astype(dtype)
        C = f(A, B)
        ref = A.astype(np.float64) @ B.astype(np.float64)
        tol = 1e-5 if dtype == "float32" else 1e-13
        assert np.abs(C - ref).max() <= tol * np.abs(ref).max(), alg
        assert np.array_equal(f(A, f.prepare_b(B)), C)


@needs_host
def test_no_blas_is_a_clear_error(built, monkeypatch):
    monkeypatch.setattr(vendor_blas, "_found", {})
    monkeypatch.setenv("LCMAC_BLAS", "/nonexistent/libnope.so")
    with pytest.raises(ArtifactError, match="LCMAC_BLAS"):
        lcmac.load(next(iter(built.values())))


GCC = shutil.which("gcc")


@needs_host
@pytest.mark.skipif(GCC is None, reason="gcc not installed")
def test_c_api_binds_the_blas_it_is_given(built, tmp_path):
    from lcmac.runtime import c_include_dir
    inc = c_include_dir()
    exe = tmp_path / "matmul"
    r = subprocess.run([GCC, "-O2", "-std=gnu99", "-rdynamic", "-I", inc, "-o", str(exe),
                        str(ROOT / "examples" / "c" / "matmul.c"),
                        os.path.join(inc, "..", "harness", "lcmac_c.c"), "-ldl", "-lpthread", "-lm"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    man = built[("winograd", "float32", (256, 128, 192))]
    env = {k: v for k, v in os.environ.items() if k != "LCMAC_BLAS"}
    r = subprocess.run([str(exe), str(man)], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 2 and "no cblas_sgemm" in r.stderr, r.stderr     # none linked in
    blas = vendor_blas._numpy_openblas()
    if not blas:
        pytest.skip("numpy ships no OpenBLAS here")
    r = subprocess.run([str(exe), str(man), "--prepared", "--repeat", "2"], capture_output=True,
                       text=True, env={**env, "LCMAC_BLAS": blas[0]}, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "C identical to lcmac_matmul's" in r.stdout and "max_rel_error=" in r.stdout
