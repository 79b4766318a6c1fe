"""The native bit kernel (lcmac.bits.native): compiled once for the test run (one apache-tvm
worker for both semirings, into the run's cache directory), then checked exactly against the
integer product on random and odd shapes, on its own and under the LCMA recursion; the
choice between it and the numpy kernel; its cache entry."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from lcmac.artifact import worker
from lcmac.bits import cache as bit_cache
from lcmac.bits import gf2_matmul, boolean_matmul, native, native_build, pack, unpack
from lcmac.core.errors import ShapeError, ToolchainError
from lcmac.schedules import cpu_bits

# (M, K, N): C is M×N.  300×129×448: 7 words of C, the 4-, 2- and 1-word tail panels;
# 17×200×64: 17 rows, a partial group of 8 in the transposition of A
SHAPES = [(63, 65, 127), (1000, 777, 1234), (1, 1, 1), (64, 64, 64), (65, 1, 130),
          (300, 129, 448), (17, 200, 64)]


def _case(M: int, K: int, N: int, seed: int = 0):
    """Random 0/1 operands and their exact integer product: in int64 where that is quick;
    the BLAS product in float64 for the largest shape, exact too (every sum is an integer of
    at most K < 2^53)."""
    rng = np.random.default_rng([M, K, N, seed])
    A = rng.integers(0, 2, (M, K), dtype=np.uint8)
    B = rng.integers(0, 2, (K, N), dtype=np.uint8)
    if M * K * N <= 1 << 24:
        P = A.astype(np.int64) @ B.astype(np.int64)
    else:
        P = (A.astype(np.float64) @ B.astype(np.float64)).astype(np.int64)
    return A, B, P


@pytest.fixture(scope="module")
def kernels():
    why = native_build.missing_toolchain()
    if why:
        pytest.skip(why)
    return native.prepare(("gf2", "boolean"))


@pytest.fixture
def fresh_choice(monkeypatch):
    """The module's record of loaded and failed kernels emptied for one test."""
    monkeypatch.setattr(native, "_loaded", {})
    monkeypatch.setattr(native, "_failed", {})
    monkeypatch.setattr(native, "_absent", set())


# ---- no compiler needed ---------------------------------------------------------------------

def test_template_and_key_agree_on_the_generation():
    assert native_build.TEMPLATE_VERSION == cpu_bits.TEMPLATE_VERSION
    assert native.CONFIG == cpu_bits.BitsConfig.from_dict(native.CONFIG).to_dict()
    assert native.TABLE_WORDS == cpu_bits.BitsConfig.from_dict(native.CONFIG).table_words()


def test_template_text_and_knobs():
    gf2, info = cpu_bits.generate("gf2", cpu_bits.BitsConfig())
    boolean, _ = cpu_bits.generate("boolean", cpu_bits.BitsConfig())
    assert " ^ " in gf2 and " | " not in gf2 and " | " in boolean
    assert info["kernel"] == "bits-m4rm" and "T.parallel" not in gf2
    with pytest.raises(ValueError, match="unknown bit-kernel knob"):
        cpu_bits.BitsConfig.from_dict({"mr": 4})
    with pytest.raises(ValueError, match="power of two"):
        cpu_bits.BitsConfig.from_dict({"panel_words": 12})
    with pytest.raises(ValueError, match="unknown semiring"):
        cpu_bits.generate("tropical", cpu_bits.BitsConfig())


def test_kernel_choice_is_checked(monkeypatch):
    assert native.kernel_choice("numpy") == "numpy"
    monkeypatch.setenv("LCMAC_BITS_KERNEL", "numpy")
    assert native.kernel_choice() == "numpy"
    with pytest.raises(ValueError, match="choose one of auto, native, numpy"):
        native.kernel_choice("fast")
    A, B, P = _case(63, 65, 127)
    _, report = gf2_matmul(A, B, algo="m4r", return_report=True)
    assert report.kernel.kernel == "numpy"


def test_no_compiler_means_numpy_or_an_error(monkeypatch, tmp_path, fresh_choice):
    monkeypatch.setenv("LCMAC_CACHE_DIR", str(tmp_path))          # nothing compiled there
    monkeypatch.setattr(native_build, "missing_toolchain", lambda: "no C compiler here")
    assert native.choose_kernel("gf2", "auto", 1 << 40) is None
    if native_build.missing_loader() is None:
        with pytest.raises(ToolchainError, match="no C compiler here"):
            native.choose_kernel("gf2", "native")


def test_a_failed_compile_warns_and_falls_back(monkeypatch, tmp_path, fresh_choice):
    if native_build.missing_loader():
        pytest.skip(native_build.missing_loader())
    monkeypatch.setenv("LCMAC_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(native_build, "missing_toolchain", lambda: None)
    monkeypatch.setitem(worker.WORKERS, native_build.BACKEND, "lcmac.no_such_worker")
    with pytest.warns(RuntimeWarning, match="using the numpy kernel"):
        assert native.choose_kernel("gf2", "auto", 1 << 40) is None
    with pytest.raises(ToolchainError, match="worker failed"):    # not retried: the reason
        native.choose_kernel("gf2", "native")


# ---- the compiled kernel --------------------------------------------------------------------

@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_native_products_equal_the_integer_product(kernels, shape):
    A, B, P = _case(*shape)
    a, b = pack(A), pack(B)
    C = kernels["gf2"](a.data, b.data)
    assert np.array_equal(unpack(C, shape[2]), P % 2)
    D = kernels["boolean"](a.data, b.data)
    assert np.array_equal(unpack(D, shape[2]), (P > 0).astype(np.uint8))


def test_row_blocks_and_stacks(kernels, monkeypatch):
    """Blocks of 5 rows (a workspace that narrow: many blocks, each a partial group of 8 in
    the transposition), a stack of products, and ``out``."""
    rng = np.random.default_rng(7)
    a = pack(rng.integers(0, 2, (3 * 37, 130), dtype=np.uint8)).data.reshape(3, 37, 3)
    b = pack(rng.integers(0, 2, (3 * 130, 200), dtype=np.uint8)).data.reshape(3, 130, 4)
    whole = kernels["gf2"](a, b)
    monkeypatch.setattr(native, "BLOCK_ROWS", 5)
    out = native.aligned_words((3, 37, 4))
    assert kernels["gf2"](a, b, out=out) is out and np.array_equal(out, whole)
    for p in range(3):
        want = (unpack(a[p], 130).astype(np.int64) @ unpack(b[p], 200)) % 2
        assert np.array_equal(unpack(whole[p], 200), want)
        assert np.array_equal(kernels["gf2"](a[p], b[p]), whole[p])


def test_kernel_refuses_what_does_not_fit(kernels):
    k = kernels["gf2"]
    a, b = np.zeros((4, 1), np.uint64), np.zeros((65, 2), np.uint64)
    with pytest.raises(ShapeError, match="B has 65 rows but A's rows hold only 64 bits"):
        k(a, b)
    with pytest.raises(ShapeError, match="matching stacks"):
        k(a[None], b[None].repeat(2, axis=0)[:, :64])
    with pytest.raises(ShapeError, match="out must be C-contiguous"):
        k(a, b[:64], out=np.zeros((4, 3), np.uint64))
    assert not k(a, np.zeros((0, 2), np.uint64)).any()        # K = 0: C is zero


@pytest.mark.parametrize("algo", ["winograd", "winograd-ab", "strassen"])
def test_lcma_above_the_native_kernel(kernels, algo):
    A, B, P = _case(1000, 777, 1234)
    for levels in (1, 2):
        C, report = gf2_matmul(A, B, algo=algo, levels=levels, kernel="native",
                               return_report=True)
        assert np.array_equal(C, P % 2) and report.kernel.kernel == "native"
        assert report.to_dict()["kernel"] == "native"


def test_auto_uses_the_compiled_kernel_at_any_size(kernels):
    A, B, P = _case(63, 65, 127)
    C, report = gf2_matmul(A, B, algo="m4r", return_report=True)
    assert np.array_equal(C, P % 2) and report.kernel.kernel == "native"
    count = report.kernel
    want = native.word_operations(1, 63, 2, 2)
    assert (count.tables, count.accumulate) == (want.tables, want.accumulate)
    assert np.array_equal(boolean_matmul(A, B), (P > 0).astype(np.uint8))


def test_the_cache_entry(kernels, tmp_path):
    lib = native_build.library_paths(["gf2"], native.CONFIG, build=False)["gf2"]
    key, fields = native_build.kernel_key("gf2", native.CONFIG)
    meta = json.loads((lib.parent / "entry.json").read_text())
    assert lib.parent.name == key and meta["key"] == key and meta["fields"] == fields
    assert meta["target"].startswith("x86_64")
    # a library that does not match its entry is not used
    copy = tmp_path / key
    shutil.copytree(lib.parent, copy)
    (copy / "kernel.so").write_bytes(b"not a library")
    assert bit_cache.valid_library(copy, key) is None
    assert bit_cache.valid_library(lib.parent, key) == lib
