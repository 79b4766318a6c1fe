"""lcmac.matmul, torch.ops.lcmac.matmul and lcmac.nn on CUDA tensors (needs a GPU, TileLang and
nvcc; skipped elsewhere).  bf16 at 2048³ with Strassen forced: the forward and both backward
products are that one shape, so one kernel serves the file (plus the two an optimized MLP
needs); errors are judged against float64 as a multiple of torch.matmul's own."""
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import lcmac  # noqa: E402
from lcmac import ops  # noqa: E402
from lcmac.nn import Linear, optimize  # noqa: E402

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

S = 2048
BF16 = torch.bfloat16
#: Strassen's bf16 error is ~3.5x the plain GEMM's on normal inputs (docs/accuracy.md)
STRASSEN_BOUND = 6.0


def _randn(*shape, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(*shape, device="cuda", dtype=BF16, generator=g)


def _rel(C, ref) -> float:
    return ((C.double() - ref).norm() / ref.norm()).item()


def test_strassen_on_cuda_matches_float64_and_flattens_batches():
    A, B = _randn(S, S, seed=0), _randn(S, S, seed=1)
    ref = A.double() @ B.double()
    C = lcmac.matmul(A, B, algo="strassen")
    assert C.is_cuda and C.dtype == BF16 and C.shape == (S, S)
    assert _rel(C, ref) < STRASSEN_BOUND * _rel(A @ B, ref)
    C3 = lcmac.matmul(A.reshape(2, S // 2, S), B, algo="strassen")     # the same S×S product
    assert C3.shape == (2, S // 2, S) and torch.equal(C3.reshape(S, S), C)
    assert ops.plan(S, S, S, "bfloat16", algo="strassen", target="cuda-sm90a").runs == "strassen"


def test_op_is_one_graph_under_compile_and_differentiates():
    A, B = _randn(S, S, seed=2), _randn(S, S, seed=3)
    graphs = []

    def count(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    def f(a, b):
        return torch.ops.lcmac.matmul(a, b, "strassen", None) * 2

    got = torch.compile(f, backend=count, fullgraph=True)(A, B)
    assert len(graphs) == 1
    assert torch.equal(got, lcmac.matmul(A, B, algo="strassen") * 2)

    Ag, Bg = A.clone().requires_grad_(), B.clone().requires_grad_()
    C = lcmac.matmul(Ag, Bg, algo="strassen")
    assert C.grad_fn is not None
    G = _randn(S, S, seed=4)
    C.backward(G)
    dA_ref = G.double() @ B.double().t()
    dB_ref = A.double().t() @ G.double()
    assert _rel(Ag.grad, dA_ref) < STRASSEN_BOUND * _rel(G @ B.t(), dA_ref)
    assert _rel(Bg.grad, dB_ref) < STRASSEN_BOUND * _rel(A.t() @ G, dB_ref)


def test_linear_prepares_its_weight_once_and_again_when_it_changes(monkeypatch):
    torch.manual_seed(0)
    ref = nn.Linear(S, S, device="cuda", dtype=BF16)
    lin = Linear.from_linear(ref, algo="strassen")
    x = _randn(S, S, seed=5)
    fn = ops.kernel("strassen", "cuda-sm90a", "bfloat16", (S, S, S))
    calls = []
    real = fn.prepare_b
    monkeypatch.setattr(fn, "prepare_b", lambda B: calls.append(1) or real(B))
    with torch.no_grad():
        y, r = lin(x), ref(x)
        assert torch.equal(lin(x), y) and len(calls) == 1           # the prepared weight is kept
        want = lcmac.matmul(x, ref.weight.t().contiguous(), algo="strassen") + ref.bias
        assert torch.equal(y, want)                                  # prepared B: the same bits
        y64 = x.double() @ ref.weight.double().t() + ref.bias.double()
        assert _rel(y, y64) < STRASSEN_BOUND * _rel(r, y64)
        ref.weight.mul_(2)                                           # shared with lin: changes it
        y2 = lin(x)
        assert len(calls) == 2
        assert torch.equal(y2, lcmac.matmul(x, ref.weight.t().contiguous(), algo="strassen") + ref.bias)


def test_optimize_swaps_a_cuda_mlp_and_keeps_its_output():
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(S, 2 * S), nn.GELU(), nn.Linear(2 * S, S), nn.Linear(8, 8))
    model = model.to(device="cuda", dtype=BF16)
    x = _randn(S, S, seed=6)
    with torch.no_grad():
        before = model[:3](x)
    report = optimize(model, algo="strassen")
    assert [s.name for s in report.swapped] == ["0", "2"]
    assert [s.name for s in report.skipped] == ["3"]                 # 8 features: too small
    assert isinstance(model[0], Linear) and isinstance(model[2], Linear)
    with torch.no_grad():
        after = model[:3](x)
    assert after.shape == before.shape
    assert _rel(after, before.double()) < 0.05
