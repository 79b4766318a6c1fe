"""Bundles: kernels for a shape rule (a row ladder, an N×K tile) and one index; lcmac.load
runs every shape the rule admits, checked against float64; damaged bundles are refused."""
import json
import shutil

import numpy as np
import pytest

import lcmac
from lcmac.artifact.bundle import INDEX, build_bundle, read_bundle
from lcmac.cli.main import main
from lcmac.core.errors import ArtifactError, ShapeError

torch = pytest.importorskip("torch")


def _rel(C, A, B) -> float:
    C, A, B = (np.asarray(x.float() if hasattr(x, "float") else x, dtype=np.float64) for x in (C, A, B))
    R = A @ B
    return float(np.abs(C - R).max() / max(np.abs(R).max(), 1e-30))


def _operands(M, N, K, seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((M, K)).astype(dtype), rng.standard_normal((K, N)).astype(dtype)


@pytest.fixture(scope="module")
def any_bundle(tmp_path_factory):
    """`lcmac build --algo strassen --dtype float32 --rows 1024,256 --tile 1024x1024 -o DIR`:
    no shape, served by copied tiles (the default, piece kernels: tests/test_bundle_pieces.py)."""
    d = tmp_path_factory.mktemp("any")
    assert main(["build", "--algo", "strassen", "--dtype", "float32", "--rows", "1024,256",
                 "--tile", "1024x1024", "-o", str(d)]) == 0
    return d


def test_build_without_shape_serves_any_shape(any_bundle, capsys):
    f = lcmac.load(any_bundle)
    b = read_bundle(any_bundle)
    assert [str(r.rule) for r in b.rules] == ["any:?x?x?"] and len(b.kernels) == 2
    for shape in [(1000, 777, 1234), (3, 5, 7), (1300, 2100, 300)]:
        M, N, K = shape
        A, B = _operands(M, N, K, seed=M)
        C = f(A, B)
        assert C.shape == (M, N) and _rel(C, A, B) < 1e-5, shape
    A, B = _operands(70, 40, 30)                           # torch CPU tensors, and out=
    out = torch.empty(70, 40)
    assert f(torch.from_numpy(A), torch.from_numpy(B), out=out) is out
    assert _rel(out, A, B) < 1e-5


def test_rows_bundle_any_m(tmp_path):
    path = build_bundle("strassen", None, "float32", ["?x48x40"], out_dir=tmp_path, rows=(128, 32))
    f = lcmac.load(path)
    assert "rows:?x48x40" in repr(f)
    for M in (1, 31, 32, 128, 300, 1000):
        A, B = _operands(M, 48, 40, seed=M)
        assert _rel(f(A, B), A, B) < 1e-5, M
    with pytest.raises(ShapeError, match=r"no rule .* admits 5x40x48; it serves rows:\?x48x40"):
        f(*_operands(5, 40, 48))
    with pytest.raises(ShapeError, match="inner dimensions"):
        f(np.zeros((5, 40), np.float32), np.zeros((41, 48), np.float32))
    # B prepared once per bucket kernel gives the same bits; a kernel that cannot prepare
    # (built before prepared B) runs on B itself
    A, B = _operands(300, 48, 40, seed=7)
    C = f(A, B)
    assert np.array_equal(f(A, f.prepare_b(B)), C)
    from lcmac.runtime import loader

    def cannot(self, B):
        raise ArtifactError("built by an older lcmac")
    loader.LcmacFunction.prepare_b, real = cannot, loader.LcmacFunction.prepare_b
    try:
        assert np.array_equal(f(A, f.prepare_b(B)), C)
    finally:
        loader.LcmacFunction.prepare_b = real


def test_bf16_any_rule_accumulates_k_tiles_in_float32(tmp_path):
    if "bfloat16" not in lcmac.ops.supported_dtypes(lcmac.ops.target_for("cpu")):
        pytest.skip("this CPU target takes no bfloat16")
    path = build_bundle("strassen", None, "bfloat16", [None], out_dir=tmp_path, rows=(64,), tile=(64, 64))
    A, B = (torch.from_numpy(x) for x in _operands(100, 70, 150))
    A, B = A.bfloat16(), B.bfloat16()
    C = lcmac.load(path)(A, B)
    ref = torch.matmul(A.double(), B.double())
    one_rounding = float((ref.bfloat16().double() - ref).abs().max() / ref.abs().max())
    # three K tiles summed in float32, rounded once: within a few bf16 roundings, not three
    assert C.dtype == torch.bfloat16 and _rel(C, A, B) < 4 * one_rounding + 2e-2


def test_damaged_bundles_are_refused(tmp_path):
    src = build_bundle("strassen", None, "float32", ["?x24x16"], out_dir=tmp_path / "b", rows=(32,))
    A, B = _operands(40, 24, 16)
    # a flipped byte in a kernel library: refused when that kernel is loaded, before dlopen
    bad = tmp_path / "flipped"
    shutil.copytree(src.parent, bad)
    lib = next(bad.glob("*.so"))
    data = bytearray(lib.read_bytes())
    data[len(data) // 2] ^= 0xFF
    lib.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="sha256"):
        lcmac.load(bad)(A, B)
    # an index of an unknown format, a malformed one, one naming a missing kernel
    for name, edit, msg in [("format", lambda d: d.update(format="lcmac-bundle/9"), "format"),
                            ("rules", lambda d: d.pop("rules"), "malformed"),
                            ("kernel", lambda d: d["rules"][0]["kernels"].append("nope"), "nope")]:
        d = tmp_path / name
        shutil.copytree(src.parent, d)
        idx = json.loads((d / INDEX).read_text())
        edit(idx)
        (d / INDEX).write_text(json.dumps(idx))
        with pytest.raises(ArtifactError, match=msg):
            lcmac.load(d)
    (tmp_path / "torn").mkdir()
    (tmp_path / "torn" / INDEX).write_text('{"format": "lcmac-bun')
    with pytest.raises(ArtifactError, match="cannot be read"):
        lcmac.load(tmp_path / "torn")


def test_cli_rejects_bad_rules(capsys):
    for rule in ("4096x?x4096", "?x?x4096"):
        with pytest.raises(SystemExit):
            main(["build", "--algo", "strassen", "--shape", rule])
        assert "shape rule" in capsys.readouterr().err
