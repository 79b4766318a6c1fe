"""lcmac.load: argument checks, artifact integrity, and the compiler-free loading path."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import lcmac
from lcmac.artifact.build import build_many
from lcmac.core.errors import ArtifactError, DTypeError, ShapeError, TargetError
from lcmac.artifact.manifest import Manifest
from lcmac.spec.cpu.x86 import host_supports

pytestmark = pytest.mark.skipif(not host_supports("x86_64-avx512"),
                                reason="needs an AVX-512 x86-64 host to run the artifacts")

M, N, K = 48, 40, 56


@pytest.fixture(scope="session")
def arts(tmp_path_factory):
    d = tmp_path_factory.mktemp("rt_artifacts")
    res = build_many([
        dict(algo="strassen", target="x86_64-avx512", shape=(M, N, K), out_dir=d, name="s",
             config={"mc": 16, "nc": 32, "nr": 32, "kc": 16}),
        dict(algo="gemm", target="x86_64-avx512", shape=(M, N, K), out_dir=d, name="g"),
    ])
    for r in res:
        if isinstance(r, Exception):
            raise r
    return d


@pytest.fixture()
def art(arts, tmp_path):
    """A private copy of the Strassen artifact (tests may damage it)."""
    for suf in (".so", ".json"):
        shutil.copy(arts / f"s{suf}", tmp_path / f"s{suf}")
    return tmp_path / "s.json"


def _ab(dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((M, K)).astype(dtype), rng.standard_normal((K, N)).astype(dtype)


def test_manifest_contents(arts):
    m = Manifest.read(arts / "s.json")
    assert m.algorithm["name"] == "strassen" and m.algorithm["rank"] == 7 and len(m.algorithm["hash"]) == 16
    assert m.algorithm["grid"] == [2, 2, 2] and m.algorithm["levels"] == 1
    assert m.target["name"] == "x86_64-avx512" and m.target["dict"]["kind"] == "llvm"
    assert m.shape == {"M": M, "N": N, "K": K} and m.dtype == "float32"
    assert m.library["file"] == "s.so" and len(m.library["sha256"]) == 64
    assert m.entry_points[0]["name"] == "lcmac_matmul"
    assert [a["name"] for a in m.entry_points[0]["arguments"]] == ["A", "B", "C"]
    assert m.config["mc"] == 16 and m.lcmac_version == lcmac.__version__ and m.build["date"]
    g = Manifest.read(arts / "g.json")
    assert g.algorithm["name"] == "gemm" and g.algorithm["hash"] is None


@pytest.mark.parametrize("which", ["s", "g"])
def test_numpy_and_torch(arts, which):
    f = lcmac.load(arts / f"{which}.json")
    A, B = _ab()
    ref = A.astype(np.float64) @ B
    C = f(A, B)
    assert isinstance(C, np.ndarray) and C.shape == (M, N)
    assert np.allclose(C, ref, rtol=1e-4, atol=1e-4)
    out = np.full((M, N), np.nan, np.float32)
    assert f(A, B, out=out) is out and np.allclose(out, ref, rtol=1e-4, atol=1e-4)
    torch = pytest.importorskip("torch")
    Ct = f(torch.from_numpy(A), torch.from_numpy(B))
    assert isinstance(Ct, torch.Tensor) and np.allclose(Ct.numpy(), ref, rtol=1e-4, atol=1e-4)
    # the .so path works too
    assert np.allclose(lcmac.load(arts / f"{which}.so")(A, B), C)


def test_argument_errors(arts):
    f = lcmac.load(arts / "s.json")
    A, B = _ab()
    with pytest.raises(ShapeError, match="48x56"):
        f(A[:, :-1].copy(), B)
    with pytest.raises(ShapeError):
        f(B, A)
    with pytest.raises(DTypeError, match="float32"):
        f(A.astype(np.float64), B.astype(np.float64))
    with pytest.raises(ShapeError, match="contiguous"):
        f(np.asfortranarray(A), B)
    with pytest.raises(ShapeError, match="contiguous"):
        f(A, np.repeat(B, 2, axis=1)[:, ::2])
    with pytest.raises(ShapeError, match="overlaps A"):
        f(A, B, out=A.reshape(-1)[: M * N].reshape(M, N))
    with pytest.raises(ShapeError, match="out"):
        f(A, B, out=np.empty((M, N + 1), np.float32))
    with pytest.raises(DTypeError):
        f([[1.0]], B)
    torch = pytest.importorskip("torch")
    with pytest.raises(TargetError, match="meta"):
        f(torch.empty((M, K), device="meta"), torch.from_numpy(B))


def test_truncated_library(art):
    so = art.with_suffix(".so")
    data = so.read_bytes()
    so.write_bytes(data[: len(data) // 2])
    with pytest.raises(ArtifactError, match="s.so"):
        lcmac.load(art)


def test_tampered_library(art):
    so = art.with_suffix(".so")
    data = bytearray(so.read_bytes())
    data[len(data) // 2] ^= 0xFF
    so.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="sha256"):
        lcmac.load(art)


def test_missing_pieces(art):
    art.with_suffix(".so").unlink()
    with pytest.raises(ArtifactError, match="missing"):
        lcmac.load(art)
    art.unlink()
    with pytest.raises(ArtifactError, match="does not exist"):
        lcmac.load(art)


def test_malformed_manifest(art):
    d = json.loads(art.read_text())
    del d["library"]
    art.write_text(json.dumps(d))
    with pytest.raises(ArtifactError, match="library"):
        lcmac.load(art)
    art.write_text("{not json")
    with pytest.raises(ArtifactError):
        lcmac.load(art)
    d["format"] = "something-else/9"
    art.write_text(json.dumps(d))
    with pytest.raises(ArtifactError):
        lcmac.load(art)


def test_foreign_target_refused(art):
    d = json.loads(art.read_text())
    d["target"]["family"] = "aarch64"
    d["target"]["name"] = "aarch64-neon"
    art.write_text(json.dumps(d))
    with pytest.raises(TargetError, match="AArch64"):
        lcmac.load(art)


def test_missing_cpu_feature_refused(art):
    """A kernel that needs a CPU feature this host lacks (e.g. vdpbf16ps: avx512_bf16) is
    refused at load, before any dlopen, instead of dying on an illegal instruction."""
    d = json.loads(art.read_text())
    d.setdefault("extra", {})["cpu_flags"] = ["avx512f", "lcmac_no_such_flag"]
    art.write_text(json.dumps(d))
    with pytest.raises(TargetError, match="lcmac_no_such_flag"):
        lcmac.load(art)


def test_loads_without_compiler(arts):
    """A fresh process loads and runs both artifacts with neither compiler imported."""
    code = textwrap.dedent(f"""
        import sys, numpy as np, lcmac
        for name in ("s", "g"):
            f = lcmac.load({str(arts)!r} + "/" + name + ".json")
            rng = np.random.default_rng(1)
            A = rng.standard_normal(({M}, {K})).astype(np.float32)
            B = rng.standard_normal(({K}, {N})).astype(np.float32)
            assert np.allclose(f(A, B), A.astype(np.float64) @ B, rtol=1e-4, atol=1e-4)
        assert "tvm" not in sys.modules, "apache-tvm was imported"
        assert "tilelang" not in sys.modules
        print("OK", len([m for m in sys.modules if m.startswith("tvm")]))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith("OK")


def test_import_lcmac_is_light():
    out = subprocess.run([sys.executable, "-c", "import sys, lcmac; lcmac.build; lcmac.load; "
                          "print(any(m == 'tvm' or m.startswith('tvm.') or m == 'tilelang' for m in sys.modules))"],
                         capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr
