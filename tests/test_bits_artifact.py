"""Bit-matrix artifacts: `lcmac build --dtype gf2|bool` and lcmac.load serving any shape from
them, exactly; what is refused (an LCMA over the Boolean semiring, a damaged library, operands
for the other device)."""
import shutil

import numpy as np
import pytest

from lcmac import load
from lcmac.bits.artifact import build_bits
from lcmac.bits import PackedBits, pack
from lcmac.bits import native_build
from lcmac.cli.main import main as cli
from lcmac.core.errors import AlgorithmError, ArtifactError, DTypeError, TargetError
from lcmac.spec.targets import get_target, host_target

needs_native = pytest.mark.skipif(native_build.missing_toolchain() is not None,
                                  reason=str(native_build.missing_toolchain()))


def _operands(M, K, N, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.integers(0, 2, (M, K), dtype=np.uint8), rng.integers(0, 2, (K, N), dtype=np.uint8))


@needs_native
def test_gf2_artifact_serves_three_shapes(tmp_path, capsys):
    assert cli(["build", "--algo", "winograd", "--dtype", "gf2", "--levels", "1",
                "-o", str(tmp_path)]) == 0
    assert "any shape" in capsys.readouterr().out
    f = load(tmp_path)
    for shape in [(1000, 777, 1234), (63, 65, 127), (3, 5, 7)]:
        A, B = _operands(*shape)
        C, report = f(A, B, return_report=True)
        np.testing.assert_array_equal(C, (A.astype(np.int64) @ B) % 2)
        assert report.levels == 1 and report.kernel.kernel == "native"
    A, B = _operands(70, 130, 90, seed=1)
    P = f(pack(A), pack(B))
    assert isinstance(P, PackedBits)
    np.testing.assert_array_equal(P.to_array(), (A.astype(np.int64) @ B) % 2)


@needs_native
def test_bool_artifact_and_refusals(tmp_path):
    man = build_bits("m4r", host_target(), "bool", out_dir=tmp_path)
    f = load(man)
    A, B = _operands(63, 65, 127, seed=2)
    np.testing.assert_array_equal(f(A, B), ((A.astype(np.int64) @ B) > 0).astype(np.uint8))
    with pytest.raises(AlgorithmError, match="Boolean semiring"):
        build_bits("strassen", host_target(), "bool", out_dir=tmp_path)
    torch = pytest.importorskip("torch")
    with pytest.raises(DTypeError, match="torch tensor on cpu"):
        f(torch.zeros(2, 2, dtype=torch.uint8), B)
    # a damaged copy (the loaded library itself is mapped by this process: left alone)
    bad = tmp_path / "bad"
    bad.mkdir()
    shutil.copy(man, bad / man.name)
    data = bytearray(man.with_suffix(".so").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (bad / man.with_suffix(".so").name).write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="sha256"):
        load(bad / man.name)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_cuda_artifact_builds_without_a_gpu(tmp_path):
    man = build_bits("winograd", get_target("cuda-sm90a"), "gf2", levels=2, out_dir=tmp_path)
    f = load(man)
    assert f.manifest.backend == "bits-cuda" and f.levels == 2
    A, B = _operands(8, 8, 8)
    with pytest.raises(TargetError, match="CUDA tensors"):
        f(A, B)


def test_bad_requests_are_named(tmp_path):
    with pytest.raises(TargetError, match="x86-64 CPU|compiled for this CPU"):
        build_bits("winograd", get_target("aarch64-neon"), "gf2", out_dir=tmp_path)
    assert cli(["build", "--algo", "winograd", "--dtype", "gf2", "--shape", "64x64x64",
                "-o", str(tmp_path)]) != 0
