"""No kept weight goes stale: after every way of writing an ``lcmac.nn.Linear``'s weight, the
layer computes what ``torch.nn.functional.linear`` (``torch.nn.Linear``'s forward) computes
with the weight as it is now, eagerly and under ``torch.compile`` (backend "aot_eager"),
with and without gradients, with a stand-in kernel that computes from the B it prepared
(tests/test_nn.py's) and with the real strassen float32 kernel tests/test_nn.py and
tests/test_ops.py compile (slow).  The same for a B marked static by hand and for the weight
cast under autocast, and a weight whose writes cannot be seen is not kept."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

import lcmac  # noqa: E402
from lcmac.api import matmul as ops  # noqa: E402
from lcmac.torch.nn import Linear  # noqa: E402
from tests.test_nn import _PreparingKernel  # noqa: E402

M, N, K = 66, 45, 53


def _no_grad_mul(w):
    with torch.no_grad():
        w.mul_(0.5)


def _no_grad_copy(w):
    with torch.no_grad():
        w.copy_(torch.randn_like(w))


def _optimizer_step(lin):
    lin.zero_grad()
    lin(torch.randn(3, K)).square().sum().backward()
    torch.optim.SGD(lin.parameters(), lr=0.5).step()


#: name → a write to the layer's weight (or a new weight)
WRITES = {
    ".data.mul_": lambda lin: lin.weight.data.mul_(0.99),
    ".data.copy_": lambda lin: lin.weight.data.copy_(torch.randn(N, K)),
    ".data[i, j] =": lambda lin: lin.weight.data.__setitem__((3, 5), 7.0),   # one element
    ".data = new tensor": lambda lin: setattr(lin.weight, "data", torch.randn(N, K)),
    "in-place under no_grad": lambda lin: _no_grad_mul(lin.weight),
    "copy_ under no_grad": lambda lin: _no_grad_copy(lin.weight),
    "load_state_dict": lambda lin: lin.load_state_dict(
        {k: torch.randn_like(v) for k, v in lin.state_dict().items()}),
    "optimizer step": _optimizer_step,
    ".to(float64)": lambda lin: lin.to(torch.float64),
    "new Parameter": lambda lin: setattr(lin, "weight", nn.Parameter(torch.randn(N, K))),
    "numpy() after caching": lambda lin: lin.weight.detach().numpy().__setitem__((0, 0), 9.0),
}


def _check_follows_writes(lin, call, write, grad: bool):
    """``call(x)`` (lin, or lin compiled) against F.linear with lin's weight before and after
    ``write(lin)``; the first calls fill what is kept for the weight."""
    x = torch.randn(M, K)

    def check():
        xx = x.to(lin.weight.dtype)
        with torch.set_grad_enabled(grad):
            y = call(xx)
        with torch.no_grad():
            want = F.linear(xx, lin.weight, lin.bias)
        assert torch.allclose(y.detach(), want, rtol=1e-5, atol=1e-5)
    check()
    check()
    write(lin)
    check()


@pytest.fixture
def stand_in(monkeypatch):
    fake = _PreparingKernel()
    monkeypatch.setattr(ops, "kernel", lambda *key: fake)
    return fake


def _layer(seed=0):
    torch.manual_seed(seed)
    return Linear(K, N, algo="strassen")


@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "grad"])
@pytest.mark.parametrize("write", list(WRITES), ids=list(WRITES))
def test_eager_layer_follows_every_write(stand_in, write, grad):
    lin = _layer()
    _check_follows_writes(lin, lin, WRITES[write], grad)
    assert stand_in.prepared >= 2 and stand_in.got[1] == "_Prepared"   # kept, then made again


@pytest.mark.parametrize("write", list(WRITES), ids=list(WRITES))
def test_compiled_layer_follows_every_write(stand_in, write):
    lin = _layer(1)
    torch._dynamo.reset()
    _check_follows_writes(lin, torch.compile(lin, backend="aot_eager"), WRITES[write], False)
    assert stand_in.prepared >= 2


def test_a_weight_read_is_not_taken_for_a_write(stand_in):
    lin = _layer(2)
    x = torch.randn(M, K)
    with torch.no_grad():
        lin(x)
        wt = ops.transposed_weight(lin.weight)
        for read in (F.linear, lambda a, w: w.clone(), lambda a, w: w.t().contiguous()):
            read(x, lin.weight)                        # torch reads the weight: nothing to redo
        assert torch.allclose(lin(x), F.linear(x, lin.weight, lin.bias), atol=1e-5)
    assert ops.transposed_weight(lin.weight) is wt and stand_in.prepared == 1


def test_a_static_b_follows_writes(stand_in):
    torch.manual_seed(3)
    A, B = torch.randn(M, K), torch.randn(K, N)
    ops.mark_static(B)
    for _ in range(2):
        assert torch.allclose(lcmac.matmul(A, B, algo="strassen"), A @ B, atol=1e-5)
    assert stand_in.prepared == 1
    B.data.mul_(0.5)                                   # the version counter does not move
    assert torch.allclose(lcmac.matmul(A, B, algo="strassen"), A @ B, atol=1e-5)
    assert stand_in.got[-1] == "Tensor"                # no longer static: unprepared


def test_a_weight_whose_writes_cannot_be_seen_is_not_kept(stand_in):
    lin = _layer(4)
    arr = lin.weight.detach().numpy().copy()
    lin.weight = nn.Parameter(torch.from_numpy(arr))   # memory numpy allocated
    x = torch.randn(M, K)
    with torch.no_grad():
        lin(x)
        arr *= 2                                       # torch does not see this write
        assert torch.allclose(lin(x), F.linear(x, lin.weight, lin.bias), atol=1e-5)
    assert stand_in.prepared == 0


def test_autocast_weight_cast_follows_writes():
    lin = _layer(5)
    lin.algo = "auto"                                  # bf16 on any CPU: the vendor GEMM
    x = torch.randn(M, K)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        lin(x)
        kept = lin._autocast_weight[1]
        lin.weight.data.mul_(0.5)
        y = lin(x)
        want = F.linear(x, lin.weight, lin.bias)
    assert lin._autocast_weight[1] is not kept
    assert torch.allclose(y.float(), want.float(), atol=3e-2, rtol=2e-2)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "aot_eager"])
def test_real_kernel_follows_writes(compiled):
    lin = _layer(6)
    call = lin
    if compiled:
        torch._dynamo.reset()
        call = torch.compile(lin, backend="aot_eager")
    for write in (".data.mul_", ".data[i, j] =", ".data.copy_"):
        _check_follows_writes(lin, call, WRITES[write], False)
