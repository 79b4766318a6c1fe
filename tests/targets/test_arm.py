"""AArch64 targets: cross-compiled artifacts run under qemu-user against a float64 reference,
lcmac.load's emulated and native paths, host detection, and the benchmark's target choice.

The tests that build or run AArch64 code are skipped (with the reason) where
aarch64-linux-gnu-gcc, the cross libc, qemu-aarch64 or apache-tvm are missing.  Small
shapes, one compile per artifact (about 1.5 minutes on 2 cores).
"""
from __future__ import annotations

import importlib.util
import json
import os
import platform
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import lcmac
from lcmac.artifact.build import build
from lcmac.core.errors import ArtifactError, DTypeError, ShapeError, TargetError, ToolchainError
from lcmac.spec.cpu import aarch64 as arm
from lcmac.spec.target_table import TARGETS
from lcmac.targets import aarch64 as toolchain


def _missing() -> str | None:
    for tool, pkg in ((toolchain.CROSS_GCC, toolchain.CROSS_GCC_PACKAGE),
                      (toolchain.QEMU, toolchain.QEMU_PACKAGE)):
        if not shutil.which(tool):
            return f"{tool} not installed (Debian package {pkg})"
    if not os.path.isdir(os.path.join(toolchain.SYSROOT, "lib")):
        return f"AArch64 libc missing (Debian package {toolchain.CROSS_LIBC_PACKAGE})"
    try:
        import importlib.util
        if importlib.util.find_spec("tvm") is None:
            return "apache-tvm not installed"
    except (ImportError, ValueError):
        return "apache-tvm not importable"
    return None


MISSING = _missing()
needs_toolchain = pytest.mark.skipif(MISSING is not None, reason=MISSING or "")

# key: (algorithm, target, dtype, M, N, K, SVE vector lengths in 128-bit units to run the same
# binary at).  Odd shapes (primes, and 3x5x7: smaller than one register tile, and with empty
# blocks for strassen^2's 4x4 grid) go through the padded paths of both kernels.
CASES = {
    "gemm-neon": ("gemm", "aarch64-neon", "float32", 37, 41, 29, [None]),
    "strassen-sve256": ("strassen", "aarch64-sve256", "float32", 50, 66, 44, [2, 4]),
    "strassen2-neon": ("strassen^2", "aarch64-neon", "float32", 35, 37, 33, [None]),
    "laderman-sve256": ("laderman", "aarch64-sve256", "float32", 31, 28, 34, [2, 4]),  # <3,3,3;23>
    "strassen-sve-vla": ("strassen", "aarch64-sve", "float32", 26, 22, 30, [1, 2, 4]),
    "strassen-neon-odd": ("strassen", "aarch64-neon", "float32", 67, 45, 53, [None]),
    "strassen2-neon-tiny": ("strassen^2", "aarch64-neon", "float32", 3, 5, 7, [None]),
    "strassen-sve256-tiny": ("strassen", "aarch64-sve256", "float32", 3, 5, 7, [2, 4]),
    "strassen-sve-vla-odd": ("strassen", "aarch64-sve", "float32", 67, 45, 53, [1, 4]),
    "strassen-sve-vla-tiny": ("strassen", "aarch64-sve", "float32", 3, 5, 7, [1, 2]),
    "strassen2-sve256": ("strassen^2", "aarch64-sve256", "float32", 35, 37, 33, [2, 4]),
    "strassen-neon-f64": ("strassen", "aarch64-neon", "float64", 29, 31, 23, [None]),
    "strassen2-sve512-f64": ("strassen^2", "aarch64-sve512", "float64", 35, 37, 33, [4]),
    "strassen-sve-vla-f64": ("strassen", "aarch64-sve", "float64", 31, 28, 34, [1, 2]),
}
TOL = {"float32": 1e-5, "float64": 1e-12}


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    root = tmp_path_factory.mktemp("arm")
    built = {}

    def get(key):
        if key not in built:
            alg, tgt, dtype, M, N, K, _ = CASES[key]
            built[key] = str(build(alg, tgt, dtype, (M, N, K), out_dir=root / key))
        return built[key]
    return get


def _operands(key):
    _, _, dtype, M, N, K, _ = CASES[key]
    rng = np.random.default_rng(7)
    A = rng.standard_normal((M, K)).astype(dtype)
    B = rng.standard_normal((K, N)).astype(dtype)
    return A, B, A.astype(np.float64) @ B.astype(np.float64)


@needs_toolchain
@pytest.mark.parametrize("key", list(CASES))
def test_correct_under_qemu(artifacts, key):
    """Every binary at every vector length, with each tensor and workspace against a guard
    page after it (and, at the first length, before it): a read or write outside any buffer
    crashes instead of passing because the stray lanes were masked or multiplied by zero."""
    from lcmac.runtime import qemu_runner
    alg, tgt, dtype, M, N, K, vqs = CASES[key]
    manifest = artifacts(key)
    A, B, ref = _operands(key)
    for vq in vqs:
        for guard in ("after", "before") if vq == vqs[0] else ("after",):
            C = qemu_runner.run_artifact(manifest, A, B, sve_vq=vq, threads=2, guard=guard)
            assert C.dtype == np.dtype(dtype)
            err = np.abs(C - ref).max() / np.abs(ref).max()
            assert err < TOL[dtype], f"{alg} on {tgt} ({dtype}) at sve-max-vq={vq}: relative error {err}"


def _lib(manifest):
    import json
    m = json.load(open(manifest))
    return os.path.join(os.path.dirname(manifest), m["library"]["file"])


def _asm(manifest):
    return toolchain.disassemble(_lib(manifest))


@needs_toolchain
def test_neon_inner_loop_uses_fmla_on_v_registers(artifacts):
    asm = _asm(artifacts("gemm-neon"))
    assert len(re.findall(r"\bfmla\s+v\d+\.4s", asm)) >= 8
    assert not re.search(r"\bz\d+\.s\b", asm)        # no SVE in a NEON artifact


@needs_toolchain
def test_sve256_uses_z_registers_with_fixed_predicate(artifacts):
    asm = _asm(artifacts("strassen-sve256"))
    assert len(re.findall(r"\bfmla\s+z\d+\.s", asm)) >= 8
    assert re.search(r"\bptrue\s+p\d+\.[bs],\s*vl(8|32)\b", asm)   # 256-bit fixed length


@needs_toolchain
@pytest.mark.parametrize("key, suffix", [("strassen-sve-vla", "s"), ("strassen-sve-vla-f64", "d")])
def test_vla_sve_uses_vscale_code(artifacts, key, suffix):
    asm = _asm(artifacts(key))
    assert len(re.findall(rf"\bf(mla|mad)\s+z\d+\.{suffix}", asm)) >= 4
    assert re.search(r"\b(cntw|cntd|rdvl|cnth|cntb|incw|incd)\b", asm)   # reads the vector length


@needs_toolchain
def test_float64_neon_and_sve512_use_double_vectors(artifacts):
    assert len(re.findall(r"\bfmla\s+v\d+\.2d", _asm(artifacts("strassen-neon-f64")))) >= 8
    asm = _asm(artifacts("strassen2-sve512-f64"))
    assert len(re.findall(r"\bfmla\s+z\d+\.d", asm)) >= 8
    assert re.search(r"\bptrue\s+p\d+\.[bd],\s*vl(8|64)\b", asm)   # 512-bit fixed length


@needs_toolchain
def test_manifest_describes_the_artifact(artifacts):
    import json
    m = json.load(open(artifacts("strassen-sve-vla")))
    assert m["target"]["name"] == "aarch64-sve" and m["dtype"] == "float32"
    assert m["entry_points"][0]["name"] == "lcmac_matmul"
    assert m["extra"]["kernel"] == "te_vla"
    toolchain.check_library(_lib(artifacts("gemm-neon")))


@needs_toolchain
def test_wrong_shape_is_reported(artifacts):
    from lcmac.runtime import qemu_runner
    m = artifacts("gemm-neon")
    A = np.ones((37, 30), np.float32)
    B = np.ones((30, 41), np.float32)
    with pytest.raises(qemu_runner.RunError, match="shape"):
        qemu_runner.run_artifact(m, A, B)


def test_no_cross_compiler_names_the_package(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("LCMAC_AARCH64_CC", raising=False)
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    with pytest.raises(ToolchainError, match="gcc-aarch64-linux-gnu libc6-dev-arm64-cross"):
        build("strassen", "aarch64-sve", "float32", (8, 8, 8), out_dir=tmp_path / "out")
    with pytest.raises(ToolchainError, match="gcc-aarch64-linux-gnu libc6-dev-arm64-cross"):
        build("strassen", "aarch64-neon", "float32", (8, 8, 8), out_dir=tmp_path / "out")


def test_no_qemu_names_the_package(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("LCMAC_QEMU_AARCH64", raising=False)
    with pytest.raises(ToolchainError, match="qemu-user"):
        toolchain.qemu()


def test_targets_registered():
    for name, bits in (("aarch64-neon", 128), ("aarch64-sve", None), ("aarch64-sve256", 256),
                       ("aarch64-sve512", 512)):
        t = TARGETS[name]
        assert t.family == "aarch64" and t.vector_bits == bits
    assert arm.sve_vq(TARGETS["aarch64-sve512"]) == 4
    assert arm.sve_vq(TARGETS["aarch64-neon"]) is None
    p = arm.schedule_params(TARGETS["aarch64-sve256"], "float32")
    assert p.lanes == 8 and p.accumulators <= 24
    assert arm.kernel_kind(TARGETS["aarch64-sve"]) == "te_vla"


# ---- the harness's guard pages ------------------------------------------------------------

SPAN_C = r"""
#include <stdint.h>
typedef struct { void* data; int32_t dev[2]; int32_t ndim; uint8_t code, bits; uint16_t lanes;
                 int64_t* shape; int64_t* strides; uint64_t offset; } DLTensor;
typedef struct { int32_t type_index; uint32_t pad; union { int64_t i; void* p; } v; } Any;
/* span(x, out, lo, hi): out[0] = sum of x[lo:hi], bounds unchecked on purpose */
int __tvm_ffi_span(void* self, const Any* a, int32_t n, Any* ret) {
  const float* x = (const float*)((DLTensor*)a[0].v.p)->data;
  float* out = (float*)((DLTensor*)a[1].v.p)->data;
  float s = 0;
  for (int64_t i = a[2].v.i; i < a[3].v.i; ++i) s += x[i];
  out[0] = s;
  return 0;
}
"""


@needs_toolchain
def test_guard_pages_catch_reads_outside_a_buffer(tmp_path):
    """What makes test_correct_under_qemu able to see a stray read: one element past the end
    (or before the start) of a tensor crashes under the guard, and passes unnoticed without."""
    from lcmac.runtime import qemu_runner
    src, lib = tmp_path / "span.c", tmp_path / "span.so"
    src.write_text(SPAN_C)
    subprocess.run([toolchain.cross_gcc(), "-O1", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    x = np.arange(1, 101, dtype=np.float32)

    def span(lo, hi, guard):
        return qemu_runner.run_function(lib, "span", [x, qemu_runner.Output((1,)), lo, hi],
                                        guard=guard)[0][0]
    assert span(0, 100, "after") == span(0, 100, "before") == x.sum()
    span(0, 101, None)                                   # reads heap slack: no error
    with pytest.raises(qemu_runner.RunError, match="signal"):
        span(0, 101, "after")
    with pytest.raises(qemu_runner.RunError, match="signal"):
        span(-1, 100, "before")
    with pytest.raises(ValueError):
        span(0, 1, "both")


# ---- lcmac.load on an AArch64 artifact ------------------------------------------------------

def _private_copy(manifest, tmp_path) -> Path:
    """The artifact's manifest and library copied to tmp_path (tests may damage them)."""
    m = Path(manifest)
    lib = json.loads(m.read_text())["library"]["file"]
    for f in (m, m.parent / lib):
        shutil.copy(f, tmp_path / f.name)
    return tmp_path / m.name


@needs_toolchain
def test_load_emulated_runs_numpy_and_torch(artifacts):
    from lcmac.runtime.loader import EmulatedFunction, LcmacFunction
    f = lcmac.load(artifacts("strassen-neon-odd"))
    assert isinstance(f, EmulatedFunction) and isinstance(f, LcmacFunction)
    assert "EMULATED" in repr(f) and "not timing" in repr(f)
    A, B, ref = _operands("strassen-neon-odd")
    C = f(A, B)
    assert isinstance(C, np.ndarray) and C.dtype == np.float32
    assert np.abs(C - ref).max() < 1e-5 * np.abs(ref).max()
    out = np.full(C.shape, np.nan, np.float32)
    assert f(A, B, out=out) is out and np.array_equal(out, C)
    torch = pytest.importorskip("torch")
    Ct = f(torch.from_numpy(A), torch.from_numpy(B))
    assert isinstance(Ct, torch.Tensor) and np.array_equal(Ct.numpy(), C)
    outt = torch.empty(C.shape, dtype=torch.float32)
    assert f(torch.from_numpy(A), torch.from_numpy(B), out=outt) is outt
    assert np.array_equal(outt.numpy(), C)


@needs_toolchain
def test_load_emulated_checks_arguments_before_running(artifacts, monkeypatch):
    from lcmac.runtime import qemu_runner
    f = lcmac.load(artifacts("strassen-neon-odd"))
    A, B, _ = _operands("strassen-neon-odd")

    def no_run(*a, **k):
        raise AssertionError("the emulator ran on arguments that should have been refused")
    monkeypatch.setattr(qemu_runner, "run_function", no_run)
    with pytest.raises(ShapeError, match="67x53"):
        f(A[:, :-1].copy(), B)
    with pytest.raises(DTypeError, match="float32"):
        f(A.astype(np.float64), B.astype(np.float64))
    with pytest.raises(ShapeError, match="contiguous"):
        f(np.asfortranarray(A), B)
    with pytest.raises(ShapeError, match="overlaps A"):
        f(A, B, out=A.reshape(-1)[: 67 * 45].reshape(67, 45))
    torch = pytest.importorskip("torch")
    with pytest.raises(TargetError, match="meta"):
        f(torch.empty(A.shape, device="meta"), torch.from_numpy(B))


@needs_toolchain
def test_load_emulated_verifies_the_library_before_each_call(artifacts, tmp_path):
    m = _private_copy(artifacts("gemm-neon"), tmp_path)
    f = lcmac.load(m)
    A, B, ref = _operands("gemm-neon")
    assert np.abs(f(A, B) - ref).max() < 1e-4
    so = m.with_suffix(".so")
    data = bytearray(so.read_bytes())
    data[len(data) // 2] ^= 0xFF
    so.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="sha256"):
        f(A, B)
    with pytest.raises(ArtifactError, match="sha256"):
        lcmac.load(m)


@needs_toolchain
def test_load_emulated_sve_vector_length(artifacts, monkeypatch):
    monkeypatch.delenv("LCMAC_SVE_VQ", raising=False)
    m256 = artifacts("strassen-sve256-tiny")
    assert lcmac.load(m256).sve_vq == 2                      # the target's fixed length
    assert lcmac.load(artifacts("strassen-sve-vla-tiny")).sve_vq == 2   # VLA: 256 bits
    assert lcmac.load(artifacts("gemm-neon")).sve_vq is None
    f = lcmac.load(m256, sve_vq=4)
    assert f.sve_vq == 4 and "SVE 512-bit" in repr(f)
    A, B, ref = _operands("strassen-sve256-tiny")
    assert np.abs(f(A, B) - ref).max() < 1e-5 * np.abs(ref).max()
    monkeypatch.setenv("LCMAC_SVE_VQ", "4")
    assert lcmac.load(m256).sve_vq == 4
    assert lcmac.load(m256, sve_vq=2).sve_vq == 2            # the argument wins
    with pytest.raises(TargetError, match="at least 256"):
        lcmac.load(m256, sve_vq=1)                           # 256-bit code on 128-bit vectors
    with pytest.raises(TargetError, match="power"):
        lcmac.load(m256, sve_vq=3)


@needs_toolchain
def test_load_emulated_without_qemu_names_the_package(artifacts, monkeypatch, tmp_path):
    m = artifacts("gemm-neon")
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("LCMAC_QEMU_AARCH64", raising=False)
    with pytest.raises(ToolchainError, match="qemu-user"):
        lcmac.load(m)


def _fake_arm_artifact(tmp_path, target: str) -> Path:
    """A manifest for ``target`` over a stand-in library (only the host checks read it)."""
    from lcmac.artifact.manifest import Manifest, sha256_file
    tmp_path.mkdir(parents=True, exist_ok=True)
    lib = tmp_path / "a.so"
    lib.write_bytes(b"\x7fELF" + b"\0" * 60)
    t = TARGETS[target]
    man = Manifest(name="a", backend="tvm", algorithm={"name": "gemm", "hash": None},
                   target={"name": t.name, "family": t.family, "backend": "tvm", "dict": t.llvm},
                   dtype="float32", shape={"M": 4, "N": 4, "K": 4}, config={},
                   entry_points=[{"name": "lcmac_matmul"}],
                   library={"file": "a.so", "sha256": sha256_file(lib), "bytes": lib.stat().st_size})
    return man.write(tmp_path / "a.json")


def _pretend_aarch64(monkeypatch, features=("fp", "asimd"), sve_bits=None):
    monkeypatch.setattr(platform, "machine", lambda: "aarch64")
    monkeypatch.setattr(arm, "host_features", lambda: set(features))
    monkeypatch.setattr(arm, "host_sve_bits", lambda: sve_bits)


def test_load_on_an_aarch64_host_is_native(monkeypatch, tmp_path):
    """On AArch64, lcmac.load takes the native TVM path (no qemu), after the CPU checks."""
    from lcmac.runtime import loader
    calls = []
    monkeypatch.setattr(loader, "_load_tvm", lambda man, path: calls.append(man.target["name"]) or man)
    _pretend_aarch64(monkeypatch, ("asimd", "sve"), 256)
    for t in ("aarch64-neon", "aarch64-sve", "aarch64-sve256", "aarch64-sve512"):
        lcmac.load(_fake_arm_artifact(tmp_path / t, t))
    assert calls == ["aarch64-neon", "aarch64-sve", "aarch64-sve256", "aarch64-sve512"]


def test_aarch64_host_checks(monkeypatch, tmp_path):
    from lcmac.runtime.loader import _check_host
    from lcmac.artifact.manifest import Manifest

    def check(target):
        _check_host(Manifest.read(_fake_arm_artifact(tmp_path / target, target)))
    _pretend_aarch64(monkeypatch, ("asimd", "sve"), 256)
    check("aarch64-neon")
    check("aarch64-sve")
    check("aarch64-sve256")
    with pytest.raises(TargetError, match="at least 512 bits"):
        check("aarch64-sve512")                  # would compute garbage on 256-bit vectors
    _pretend_aarch64(monkeypatch, ("asimd",), None)
    check("aarch64-neon")
    with pytest.raises(TargetError, match="no SVE"):
        check("aarch64-sve")
    _pretend_aarch64(monkeypatch, ("asimd", "sve"), 384)
    with pytest.raises(TargetError, match="power of two"):
        check("aarch64-sve")                     # the VLA kernel pads for powers of two
    check("aarch64-sve256")


@pytest.mark.parametrize("features, bits, want", [
    (("asimd",), None, "aarch64-neon"),
    (("asimd", "sve", "sve2"), 128, "aarch64-neon"),      # Neoverse V2 / Grace
    (("asimd", "sve"), 256, "aarch64-sve256"),            # Neoverse V1 / Graviton3
    (("asimd", "sve"), 512, "aarch64-sve512"),            # A64FX
])
def test_host_target_on_aarch64(monkeypatch, features, bits, want):
    _pretend_aarch64(monkeypatch, features, bits)
    assert arm.host_target().name == want
    from lcmac.spec.targets import host_target
    assert host_target().name == want   # the registry delegates to the AArch64 detection


def _bench_cpu():
    path = Path(__file__).resolve().parents[2] / "scripts" / "bench_cpu.py"
    spec = importlib.util.spec_from_file_location("bench_cpu", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_bench_cpu_picks_the_host_target(monkeypatch, capsys):
    bench = _bench_cpu()
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "TVM_NUM_THREADS"):
        monkeypatch.setenv(var, os.environ.get(var, "1"))   # main() sets them; restored after
    args = ["--dry-run", "--no-llm", "--sizes", "64,128", "--variants", "gemm,strassen"]
    assert bench.main(args) == 0
    x86 = capsys.readouterr().out
    if platform.machine() == "x86_64":
        assert "target x86_64" in x86
    assert "square 64 64x64x64; square 128 128x128x128" in x86
    _pretend_aarch64(monkeypatch, ("asimd", "sve"), 256)
    assert bench.select_target().name == "aarch64-sve256"
    assert bench.main(args) == 0
    assert "target aarch64-sve256; variants gemm, strassen" in capsys.readouterr().out
    _pretend_aarch64(monkeypatch, ("asimd", "sve2"), 128)
    assert bench.select_target().name == "aarch64-neon"
    assert bench.select_target("aarch64-sve").name == "aarch64-sve"
