"""AArch64 targets: cross-compiled artifacts run under qemu-user against a float64 reference.

Skipped (with the reason) where aarch64-linux-gnu-gcc, the cross libc, qemu-aarch64 or
apache-tvm are missing.  Small shapes, one compile per artifact (about 1–2 minutes on 2 cores).
"""
from __future__ import annotations

import os
import re
import shutil

import numpy as np
import pytest

from lcmac.errors import ToolchainError
from lcmac.targets import TARGETS
from lcmac.targets import aarch64 as arm


def _missing() -> str | None:
    for tool, pkg in ((arm.CROSS_GCC, arm.CROSS_GCC_PACKAGE), (arm.QEMU, arm.QEMU_PACKAGE)):
        if not shutil.which(tool):
            return f"{tool} not installed (Debian package {pkg})"
    if not os.path.isdir(os.path.join(arm.SYSROOT, "lib")):
        return f"AArch64 libc missing (Debian package {arm.CROSS_LIBC_PACKAGE})"
    try:
        import importlib.util
        if importlib.util.find_spec("tvm") is None:
            return "apache-tvm not installed"
    except (ImportError, ValueError):
        return "apache-tvm not importable"
    return None


MISSING = _missing()
needs_toolchain = pytest.mark.skipif(MISSING is not None, reason=MISSING or "")

# (algorithm, target, M, N, K, SVE vector lengths in 128-bit units to run the same binary at)
CASES = {
    "gemm-neon": ("gemm", "aarch64-neon", 37, 41, 29, [None]),
    "strassen-sve256": ("strassen", "aarch64-sve256", 50, 66, 44, [2, 4]),
    "strassen2-neon": ("strassen^2", "aarch64-neon", 35, 37, 33, [None]),
    "laderman-sve256": ("laderman", "aarch64-sve256", 31, 28, 34, [2, 4]),
    "strassen-sve-vla": ("strassen", "aarch64-sve", 26, 22, 30, [1, 2, 4]),
}


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    root = tmp_path_factory.mktemp("arm")
    built = {}

    def get(key):
        if key not in built:
            alg, tgt, M, N, K, _ = CASES[key]
            built[key] = arm.build_artifact(alg, tgt, "float32", (M, N, K), root / key)
        return built[key]
    return get


@needs_toolchain
@pytest.mark.parametrize("key", list(CASES))
def test_correct_under_qemu(artifacts, key):
    from lcmac.runtime import qemu_runner
    alg, tgt, M, N, K, vqs = CASES[key]
    manifest = artifacts(key)
    rng = np.random.default_rng(7)
    A = rng.standard_normal((M, K)).astype(np.float32)
    B = rng.standard_normal((K, N)).astype(np.float32)
    ref = A.astype(np.float64) @ B.astype(np.float64)
    for vq in vqs:
        C = qemu_runner.run_artifact(manifest, A, B, sve_vq=vq, threads=2)
        err = np.abs(C - ref).max() / np.abs(ref).max()
        assert err < 1e-5, f"{alg} on {tgt} at sve-max-vq={vq}: relative error {err}"


def _lib(manifest):
    import json
    m = json.load(open(manifest))
    return os.path.join(os.path.dirname(manifest), m["library"]["file"])


def _asm(manifest):
    return arm.disassemble(_lib(manifest))


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
def test_vla_sve_uses_vscale_code(artifacts):
    asm = _asm(artifacts("strassen-sve-vla"))
    assert len(re.findall(r"\bf(mla|mad)\s+z\d+\.s", asm)) >= 4
    assert re.search(r"\b(cntw|cntd|rdvl|cnth|cntb|incw)\b", asm)    # reads the vector length


@needs_toolchain
def test_manifest_describes_the_artifact(artifacts):
    import json
    m = json.load(open(artifacts("strassen-sve-vla")))
    assert m["target"]["name"] == "aarch64-sve" and m["dtype"] == "float32"
    assert m["entry_points"][0]["name"] == "lcmac_matmul"
    assert m["extra"]["kernel"] == "te_vla"
    arm.check_library(_lib(artifacts("gemm-neon")))


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
    with pytest.raises(ToolchainError, match="gcc-aarch64-linux-gnu"):
        arm.build_artifact("strassen", "aarch64-sve", "float32", (8, 8, 8), tmp_path / "out")


def test_no_qemu_names_the_package(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("LCMAC_QEMU_AARCH64", raising=False)
    with pytest.raises(ToolchainError, match="qemu-user"):
        arm.qemu()


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
