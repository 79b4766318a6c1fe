"""lcmac.nn.Linear and lcmac.optimize on the CPU: a drop-in torch.nn.Linear (state_dict,
outputs, gradients, torch.compile), the swap report, a model left unchanged, and the
prepared-weight tracking (with a stand-in kernel that can prepare B; tests/runtime/
test_cpu_prepared.py does it with a real CPU kernel).  Compiles at most the strassen float32 66x45x53 kernel tests/test_ops.py compiles too
(one kernel cache under pytest's temporary directory)."""
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import lcmac  # noqa: E402
from lcmac.api import matmul as ops  # noqa: E402
from lcmac.torch.nn import Linear, optimize  # noqa: E402

M, N, K = 66, 45, 53


def _pair(algo="auto", in_f=K, out_f=N, seed=0):
    torch.manual_seed(seed)
    ref = nn.Linear(in_f, out_f)
    lin = Linear(in_f, out_f, algo=algo)
    lin.load_state_dict(ref.state_dict())
    return ref, lin


def test_linear_is_a_drop_in_for_nn_linear():
    ref, lin = _pair()
    assert list(lin.state_dict()) == list(ref.state_dict()) == ["weight", "bias"]
    assert lin.weight.shape == (N, K) and isinstance(lin, nn.Linear)
    x = torch.randn(2, 3, 11, K, requires_grad=True)
    y, r = lin(x), ref(x)
    assert torch.allclose(y, r, atol=1e-5) and y.grad_fn is not None
    g = torch.randn_like(y)
    got = torch.autograd.grad(y, (x, lin.weight, lin.bias), g)
    want = torch.autograd.grad(r, (x, ref.weight, ref.bias), g)
    for a, b in zip(got, want):
        assert torch.allclose(a, b, atol=1e-4)
    v = torch.randn(K)                                  # one sample, no batch dimension
    assert torch.allclose(lin(v), ref(v), atol=1e-5)
    assert torch.allclose(lin(x.detach().transpose(0, 1)), ref(x.detach().transpose(0, 1)), atol=1e-5)
    nb = Linear(K, N, bias=False)
    assert nb.bias is None and "bias" not in nb.state_dict()


def test_linear_with_strassen_matches():
    ref, lin = _pair("strassen", seed=1)
    x = torch.randn(M, K)
    with torch.no_grad():
        assert torch.allclose(lin(x), ref(x), atol=1e-5)
    assert "algo='strassen'" in repr(lin)


def test_autocast_computes_in_its_dtype_as_nn_linear_does():
    ref, lin = _pair()
    x = torch.randn(7, K, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y_ref, y = ref(x), lin(x)
    assert y.dtype == y_ref.dtype == torch.bfloat16
    assert torch.allclose(y.float(), y_ref.float(), atol=3e-2, rtol=2e-2)
    y.float().sum().backward()                       # the fp32 parameters get their gradients
    assert lin.weight.grad is not None and lin.weight.grad.dtype == torch.float32
    # inference: the cast weight is kept while the weight is unchanged (its Wᵀ stays valid)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        lin(x)
        kept = lin._autocast_weight[1]
        lin(x)
        assert lin._autocast_weight[1] is kept and kept.dtype == torch.bfloat16
        lin.weight.mul_(2)
        y2 = lin(x)
        assert lin._autocast_weight[1] is not kept
        assert torch.allclose(y2.float(), (x @ lin.weight.t() + lin.bias).float(), atol=6e-2, rtol=2e-2)
    with torch.autocast("cpu", dtype=torch.bfloat16):     # float64 is not autocast's to cast
        assert _pair()[1].double()(x.double()).dtype == torch.float64


def test_from_linear_shares_parameters():
    ref = nn.Linear(K, N).eval()
    lin = Linear.from_linear(ref, algo="vendor")
    assert lin.weight is ref.weight and lin.bias is ref.bias and not lin.training
    x = torch.randn(5, K)
    assert torch.allclose(lin(x), ref(x), atol=1e-6)


def test_linear_compiles_to_one_graph():
    _, lin = _pair()
    x = torch.randn(7, K)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward
    torch._dynamo.reset()
    y = torch.compile(lin, backend=backend, fullgraph=True)(x)
    assert len(graphs) == 1
    assert any("lcmac" in str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function")
    assert torch.allclose(y, lin(x), atol=1e-6)


def test_kept_weight_follows_changes():
    ref, lin = _pair(seed=2)
    x = torch.randn(4, K)
    with torch.no_grad():
        lin(x)
        wt = ops.transposed_weight(lin.weight)
        lin(x)
        assert ops.transposed_weight(lin.weight) is wt   # kept while the weight is unchanged
        assert torch.equal(wt, lin.weight.t())
        lin.weight.mul_(2)
        ref.weight.mul_(2)
        assert torch.allclose(lin(x), ref(x), atol=1e-5)
        assert ops.transposed_weight(lin.weight) is not wt
    with torch.inference_mode():
        assert torch.allclose(lin(x), ref(x), atol=1e-5)
    lin.weight.requires_grad_(False)                   # frozen weight, input with grad
    xg = x.clone().requires_grad_()
    lin(xg).sum().backward()
    assert torch.allclose(xg.grad, ref.weight.detach().sum(0).expand_as(x), atol=1e-5)


class _Prepared:
    def __init__(self, B):
        self.B = B.clone()


class _PreparingKernel:
    """Stands in for an artifact: it can prepare B, and computes with what it kept."""

    def __init__(self):
        self.prepared = 0
        self.got = []

    def prepare_b(self, B):
        self.prepared += 1
        return _Prepared(B)

    def __call__(self, A, B, out=None):
        self.got.append(type(B).__name__)
        C = A @ (B.B if isinstance(B, _Prepared) else B)
        return C if out is None else out.copy_(C)


def test_prepared_weight_is_made_again_when_the_weight_changes(monkeypatch):
    fake = _PreparingKernel()
    monkeypatch.setattr(ops, "kernel", lambda *key: fake)
    ref, lin = _pair("strassen", seed=3)
    x = torch.randn(M, K)

    def check():
        assert torch.allclose(lin(x), ref(x), atol=1e-5)
    with torch.no_grad():
        check()
        check()
        assert fake.prepared == 1 and fake.got == ["_Prepared", "_Prepared"]
        lin.weight.add_(1.0)                           # in place: the version counter moves
        ref.weight.add_(1.0)
        check()
        assert fake.prepared == 2
        sd = {k: v + 0.5 for k, v in ref.state_dict().items()}
        ref.load_state_dict(sd)
        lin.load_state_dict(sd)                        # copy_ into the same storage
        check()
        assert fake.prepared == 3
        lin.weight = nn.Parameter(ref.weight.detach().clone())   # a new tensor
        check()
        assert fake.prepared == 4
    check()                          # with gradients too: the weight is unchanged, still prepared
    assert fake.prepared == 4 and fake.got[-1] == "_Prepared"


def test_compiled_layer_keeps_its_prepared_weight(monkeypatch):
    """Under torch.compile the transposed, prepared weight is kept as in eager mode (the op
    finds it at call time), and made again when the weight changes."""
    fake = _PreparingKernel()
    monkeypatch.setattr(ops, "kernel", lambda *key: fake)
    ref, lin = _pair("strassen", seed=5)
    x = torch.randn(M, K)
    torch._dynamo.reset()
    compiled = torch.compile(lin, backend="aot_eager", fullgraph=True)
    with torch.no_grad():
        assert torch.allclose(compiled(x), ref(x), atol=1e-5)
        assert torch.allclose(compiled(x), ref(x), atol=1e-5)
        assert fake.prepared == 1 and fake.got == ["_Prepared", "_Prepared"]
        lin.weight.add_(1.0)
        ref.weight.add_(1.0)
        assert torch.allclose(compiled(x), ref(x), atol=1e-5)
        assert fake.prepared == 2


def _mlp():
    torch.manual_seed(4)
    return nn.Sequential(nn.Linear(K, N), nn.ReLU(), nn.Linear(N, 8), nn.Linear(8, 8))


def test_optimize_swaps_and_reports():
    model = _mlp()
    x = torch.randn(M, K)
    with torch.no_grad():
        want = model(x)
    rep = optimize(model, algo="strassen", min_size=32, rows=M)
    assert [s.name for s in rep.swapped] == ["0"]
    s = rep.swapped[0]
    assert (s.shape, s.algorithm, s.rows) == ((K, N), "strassen", M)
    assert s.speedup is not None and s.error > 1.0 and "strassen" in s.why
    assert [(k.name, k.reason) for k in rep.skipped] == [("2", "too small"), ("3", "too small")]
    assert isinstance(model[0], Linear) and type(model[2]) is nn.Linear
    assert "swapped 1 of 3" in rep.why and "strassen" in str(rep) and rep.to_dict()["swapped"]
    with torch.no_grad():
        assert torch.allclose(model(x), want, atol=1e-5)
    again = optimize(model, algo="strassen", min_size=32, rows=M)
    assert not again.swapped and again.skipped[0].reason == "kind"


def test_optimize_auto_follows_the_decision():
    model = nn.Sequential(nn.Linear(4096, 4096), nn.Linear(512, 512))
    rep = optimize(model, rows=4096, max_error=8.0)
    for name, (k, n) in [("0", (4096, 4096)), ("1", (512, 512))]:
        p = ops.plan(4096, n, k, "float32", max_error=8.0)
        if p.runs == "vendor":
            assert any(s.name == name and s.reason == "no win" for s in rep.skipped)
        else:
            hit = [s for s in rep.swapped if s.name == name]
            assert hit and hit[0].algorithm == p.runs and hit[0].error <= 8.0


def test_model_with_no_eligible_layer_is_unchanged():
    class Sub(nn.Linear):
        pass
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(300, 300).half(), Sub(300, 300),
                          nn.Linear(300, 300, device="meta"), nn.Linear(300, 300).double())
    before = [type(m) for m in model]
    state = {k: v.clone() for k, v in model.state_dict().items() if v.device.type != "meta"}
    rep = optimize(model, dtype=torch.float32)
    assert [type(m) for m in model] == before and not rep.changed
    assert [k.reason for k in rep.skipped] == ["too small", "dtype", "kind", "device", "dtype"]
    assert "unchanged" in rep.why and "too small" in rep.why and "float16" in str(rep)
    for k, v in state.items():
        assert torch.equal(model.state_dict()[k], v)
    empty = optimize(nn.Sequential(nn.ReLU()))
    assert not empty.changed and "no nn.Linear" in empty.why
    root = optimize(nn.Linear(300, 300))
    assert root.skipped[0].reason == "root"


def test_lcmac_exports():
    assert lcmac.nn.Linear is Linear and lcmac.optimize is optimize and lcmac.ops is ops
    assert lcmac.matmul is ops.matmul
