"""lcmac.matmul, torch.ops.lcmac.matmul and lcmac.nn on CUDA tensors (needs a GPU, TileLang and
nvcc; skipped elsewhere).  bf16 at 2048³ with Strassen forced: the forward and both backward
products are that one shape, so one kernel serves the file (plus the two an optimized MLP
needs); errors are judged against float64 as a multiple of torch.matmul's own.  CUDA graphs:
the op, its backward and ``Linear`` captured with ``torch.cuda.graph`` and replayed on new
inputs, and ``Linear`` under ``torch.compile(mode="reduce-overhead")``."""
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

import lcmac  # noqa: E402
from lcmac.api import matmul as ops  # noqa: E402
from lcmac.torch.nn import Linear, optimize  # noqa: E402

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


def test_linear_under_autocast_computes_in_bf16_with_fp32_weights():
    torch.manual_seed(2)
    ref = nn.Linear(S, S, device="cuda")                             # fp32 parameters
    lin = Linear.from_linear(ref, algo="strassen")
    x = torch.randn(S, S, device="cuda", requires_grad=True)
    with torch.autocast("cuda", dtype=BF16):
        y, r = lin(x), ref(x)
    assert y.dtype == r.dtype == BF16
    y64 = x.detach().double() @ ref.weight.double().t() + ref.bias.double()
    assert _rel(y, y64) < STRASSEN_BOUND * _rel(r, y64)
    y.float().sum().backward()
    assert ref.weight.grad is not None and ref.weight.grad.dtype == torch.float32
    with torch.no_grad(), torch.autocast("cuda", dtype=BF16):       # the bf16 weight is kept
        y1 = lin(x)
        kept = lin._autocast_weight[1]
        assert torch.equal(lin(x), y1) and lin._autocast_weight[1] is kept


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


# ---- CUDA graphs ------------------------------------------------------------------------------
def _capture(fn, *args):
    """``fn(*args)`` captured in a CUDA graph after a warm-up on a side stream (as torch's docs
    do it), so the kernel is compiled and loaded, and lcmac's kept buffers (workspace, Wᵀ,
    prepared B) made, before the capture; (graph, the output its replays write)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn(*args)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn(*args)
    return g, out


@pytest.mark.parametrize("algo", ["strassen", "auto"])
def test_op_replays_in_a_cuda_graph_on_new_inputs(algo):
    p = ops.plan(S, S, S, "bfloat16", algo=algo, target=ops.target_for("cuda"))
    A, B = _randn(S, S, seed=10), _randn(S, S, seed=11)
    g, C = _capture(lambda a, b: torch.ops.lcmac.matmul(a, b, algo, None), A, B)
    for seed in (12, 14):                    # the inputs changed in place, then replayed
        A.copy_(_randn(S, S, seed=seed))
        B.copy_(_randn(S, S, seed=seed + 1))
        g.replay()
        torch.cuda.synchronize()
        ref = A.double() @ B.double()
        assert _rel(C, ref) < STRASSEN_BOUND * _rel(A @ B, ref), f"{algo}: {p.runs} ran"
        if p.runs != "vendor":               # an lcmac kernel: the same bits as called eagerly
            assert torch.equal(C, torch.ops.lcmac.matmul(A, B, algo, None))


def test_op_forward_and_backward_replay_in_a_cuda_graph():
    A = _randn(S, S, seed=20).requires_grad_()
    B = _randn(S, S, seed=21).requires_grad_()
    G = _randn(S, S, seed=22)

    def step():
        torch.ops.lcmac.matmul(A, B, "strassen", None).backward(G)

    def fresh_step():                        # gradients made, not accumulated
        A.grad = B.grad = None
        step()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fresh_step()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    A.grad = B.grad = None                   # the capture allocates them in the graph's pool
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        step()
    dA, dB = A.grad, B.grad
    with torch.no_grad():
        A.copy_(_randn(S, S, seed=23))
        B.copy_(_randn(S, S, seed=24))
        G.copy_(_randn(S, S, seed=25))
    g.replay()
    torch.cuda.synchronize()
    dA_ref = G.double() @ B.detach().double().t()
    dB_ref = A.detach().double().t() @ G.double()
    assert _rel(dA, dA_ref) < STRASSEN_BOUND * _rel(G @ B.detach().t(), dA_ref)
    assert _rel(dB, dB_ref) < STRASSEN_BOUND * _rel(A.detach().t() @ G, dB_ref)


def test_linear_replays_in_a_cuda_graph_on_new_inputs():
    torch.manual_seed(2)
    lin = Linear(S, S, device="cuda", dtype=BF16, algo="strassen")
    x = _randn(S, S, seed=30)
    with torch.no_grad():
        g, y = _capture(lin, x)
        for seed in (31, 32):
            x.copy_(_randn(S, S, seed=seed))
            g.replay()
            torch.cuda.synchronize()
            y64 = x.double() @ lin.weight.double().t() + lin.bias.double()
            assert _rel(y, y64) < STRASSEN_BOUND * _rel(F.linear(x, lin.weight, lin.bias), y64)
            assert torch.equal(y, lin(x))    # the prepared weight, as eagerly


def _reduce_overhead_replays(lin, *, warm_eagerly: bool):
    """``2 * lin(x)`` under ``torch.compile(fullgraph=True, mode="reduce-overhead")`` for four
    inputs (cudagraph trees: a warm-up run, the recording, then replays), each against float64;
    that CUDA graphs ran: no skip counted, and the last two outputs at one address although the
    earlier is still referenced (an eager run could not reuse it; a replay writes in place)."""
    from torch._dynamo.utils import counters

    def f(x):
        return 2 * lin(x)
    cf = torch.compile(f, fullgraph=True, mode="reduce-overhead")
    skips = counters["inductor"]["cudagraph_skips"]
    ptrs, prev = [], None
    with torch.no_grad():
        if warm_eagerly:
            f(_randn(S, S, seed=40))
        for seed in range(41, 45):
            x = _randn(S, S, seed=seed)
            y = cf(x)
            ptrs.append(y.data_ptr())
            got, prev = y.clone(), y         # prev: not read again (a replay overwrites it)
            y64 = 2 * (x.double() @ lin.weight.double().t() + lin.bias.double())
            assert _rel(got, y64) < STRASSEN_BOUND * _rel(2 * F.linear(x, lin.weight, lin.bias), y64)
    del prev
    assert counters["inductor"]["cudagraph_skips"] == skips, \
        "inductor skipped CUDA graphs (TORCH_LOGS=cudagraphs says why)"
    assert ptrs[-1] == ptrs[-2], "the compiled function's outputs do not come from CUDA graph replays"


def test_linear_under_compile_reduce_overhead_after_an_eager_call():
    torch.manual_seed(3)
    lin = Linear(S, S, device="cuda", dtype=BF16, algo="strassen")
    _reduce_overhead_replays(lin, warm_eagerly=True)


# last in the file: a failed cudagraph-trees warm-up would leave that machinery's state behind
def test_linear_under_compile_reduce_overhead_first_call_compiled():
    torch.manual_seed(4)
    lin = Linear(S, S, device="cuda", dtype=BF16, algo="strassen")
    _reduce_overhead_replays(lin, warm_eagerly=False)
