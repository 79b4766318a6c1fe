"""A B combined once on the CPU (``f.prepare_b(B)``, ``f(A, prepared)``): the same bits as the
unprepared call and the float64 reference, with padded and unpadded shapes, for the plain
GEMM (B packed once) and LCMAs; misuse refused; a real ``lcmac.nn.Linear`` keeps its weight
prepared and prepares it again when the weight changes."""
import json

import numpy as np
import pytest

import lcmac
from lcmac.core.errors import ArtifactError, ShapeError
from lcmac.runtime.loader import PreparedB


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("prepared")
    cases = {("strassen", "float32", (100, 60, 80)): None,     # padded blocks, C workspace
             ("gemm", "float32", (3, 5, 7)): None,
             ("winograd^2", "float64", (64, 64, 64)): None}     # whole tiles, C written directly
    for alg, dtype, shape in cases:
        cases[(alg, dtype, shape)] = lcmac.build(alg, dtype=dtype, shape=shape, out_dir=out)
    return cases


@pytest.mark.parametrize("case", [("strassen", "float32", (100, 60, 80)), ("gemm", "float32", (3, 5, 7)),
                                  ("winograd^2", "float64", (64, 64, 64))])
def test_prepared_b_gives_the_same_bits(built, case):
    alg, dtype, (M, N, K) = case
    f = lcmac.load(built[case])
    rng = np.random.default_rng(1)
    A = rng.standard_normal((M, K)).astype(dtype)
    B = rng.standard_normal((K, N)).astype(dtype)
    ref = A.astype(np.float64) @ B.astype(np.float64)
    P = f.prepare_b(B)
    assert isinstance(P, PreparedB) and P.buffer.ctypes.data % 64 == 0
    C = f(A, B)
    B[...] = 0                      # the prepared form is a copy: B may change after
    assert np.array_equal(f(A, P), C)
    out = np.empty((M, N), dtype)
    assert f(A, P, out=out) is out and np.array_equal(out, C)
    tol = 1e-4 if dtype == "float32" else 1e-12
    assert np.abs(C - ref).max() <= tol * np.abs(ref).max()
    man = json.loads(built[case].read_text())
    assert [e["kind"] for e in man["entry_points"]] == ["matmul", "prepare_b", "matmul_prepared"]


def test_prepared_b_with_torch_operands(built):
    torch = pytest.importorskip("torch")
    f = lcmac.load(built[("strassen", "float32", (100, 60, 80))])
    A, B = torch.randn(100, 80), torch.randn(80, 60)
    assert torch.equal(f(A, f.prepare_b(B)), f(A, B))


def test_prepared_b_misuse_is_refused(built, tmp_path):
    key = ("strassen", "float32", (100, 60, 80))
    f = lcmac.load(built[key])
    g = lcmac.load(built[("gemm", "float32", (3, 5, 7))])
    A = np.ones((100, 80), np.float32)
    with pytest.raises(ShapeError, match="80x59"):
        f.prepare_b(np.ones((80, 59), np.float32))
    with pytest.raises(ArtifactError, match="another artifact"):
        f(np.ones((3, 7), np.float32), g.prepare_b(np.ones((7, 5), np.float32)))
    with pytest.raises(ShapeError, match="A has shape"):
        f(np.ones((99, 80), np.float32), f.prepare_b(np.ones((80, 60), np.float32)))
    # an artifact whose manifest names no prepared entry points (built before them)
    man = json.loads(built[key].read_text())
    man["extra"].pop("prepared_b")
    man["entry_points"] = man["entry_points"][:1]
    (tmp_path / built[key].name).write_text(json.dumps(man))
    (tmp_path / man["library"]["file"]).write_bytes((built[key].parent / man["library"]["file"]).read_bytes())
    old = lcmac.load(tmp_path / built[key].name)
    assert np.array_equal(old(A, np.ones((80, 60), np.float32)), f(A, np.ones((80, 60), np.float32)))
    with pytest.raises(ArtifactError, match="rebuild it"):
        old.prepare_b(np.ones((80, 60), np.float32))


def test_linear_on_the_cpu_keeps_its_weight_prepared(monkeypatch):
    torch = pytest.importorskip("torch")
    from torch import nn

    from lcmac.torch.nn import Linear
    from lcmac.runtime import loader
    calls = []
    real = loader.LcmacFunction.prepare_b

    def spy(self, B):
        calls.append(tuple(B.shape))
        return real(self, B)
    monkeypatch.setattr(loader.LcmacFunction, "prepare_b", spy)
    torch.manual_seed(0)
    ref = nn.Linear(53, 45)
    lin = Linear(53, 45, algo="strassen")
    lin.load_state_dict(ref.state_dict())
    x = torch.randn(66, 53)
    with torch.no_grad():
        assert torch.allclose(lin(x), ref(x), atol=1e-5)
        assert torch.allclose(lin(x), ref(x), atol=1e-5)
        assert calls == [(53, 45)]                   # prepared once, used twice
        lin.weight.add_(1.0)
        ref.weight.add_(1.0)
        assert torch.allclose(lin(x), ref(x), atol=1e-5)
        assert len(calls) == 2                        # the weight changed: prepared again
