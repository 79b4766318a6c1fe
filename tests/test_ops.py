"""lcmac.matmul and torch.ops.lcmac.matmul on the CPU: numpy and torch operands of odd and
batched shapes against float64, a forced LCMA kernel, torch.compile with no graph break,
gradients (gradcheck through an LCMA), and errors that name the problem.

Kernels are compiled into a kernel cache under pytest's temporary directory (shared with
tests/test_nn.py, so each shape compiles once per run): the user's cache is never written.
Compiled shapes: strassen float32 66x45x53, float64 6x5x4, 6x4x5 and 4x5x6."""
import subprocess
import sys

import numpy as np
import pytest

import lcmac
from lcmac.spec.shape_rules import JIT_ROWS
from lcmac.api import matmul as ops
from lcmac.policy import JIT, Piece, Plan, planner
from lcmac.core.errors import CatalogueError, DTypeError, LcmacError, ShapeError, TargetError

torch = pytest.importorskip("torch")
ops.register()       # torch.ops.lcmac.* exist once lcmac registers them (its first torch call does)

M, N, K = 66, 45, 53              # the forced-Strassen shape: odd N and K, M = 2·3·11


def _ref(A, B):
    a = A.detach().double().numpy() if isinstance(A, torch.Tensor) else A.astype(np.float64)
    b = B.detach().double().numpy() if isinstance(B, torch.Tensor) else B.astype(np.float64)
    return a @ b


def _close(C, ref, dtype):
    C = C.detach().double().numpy() if isinstance(C, torch.Tensor) else C.astype(np.float64)
    tol = {np.float32: 1e-5, np.float64: 1e-12}[dtype]
    assert C.shape == ref.shape
    assert np.abs(C - ref).max() <= tol * max(1.0, np.abs(ref).max()) * 8


def _ab(m, n, k, dtype=np.float32, seed=0, lead=()):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((*lead, m, k)).astype(dtype),
            rng.standard_normal((k, n)).astype(dtype))


def test_import_lcmac_imports_no_torch():
    code = ("import sys, numpy as np, lcmac; A = np.ones((3, 7), np.float32); "
            "C = lcmac.matmul(A, np.ones((7, 5), np.float32)); "
            "assert C.shape == (3, 5) and (C == 7).all(); "
            "assert 'torch' not in sys.modules, 'lcmac.matmul on numpy imported torch'")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_numpy_small_odd_shape(dtype):
    A, B = _ab(3, 5, 7, dtype)
    C = lcmac.matmul(A, B)
    assert C.dtype == dtype
    _close(C, _ref(A, B), dtype)


def test_torch_large_odd_shape_auto():
    A, B = (torch.from_numpy(x) for x in _ab(1000, 777, 1234, seed=1))
    p = ops.plan(1000, 777, 1234, "float32")
    assert p.runs in ("vendor", p.decision) and p.why
    _close(lcmac.matmul(A, B), _ref(A, B), np.float32)


def test_forced_strassen_runs_an_lcma_kernel(lcmac_cache):
    A, B = _ab(M, N, K, seed=2)
    p = ops.plan(M, N, K, "float32", algo="strassen")
    assert p.runs == "strassen" and p.speedup is not None and p.error > 1.0
    C = lcmac.matmul(A, B, algo="strassen")
    _close(C, _ref(A, B), np.float32)
    f = ops.kernel("strassen", p.target, "float32", (M, N, K))
    assert f.manifest.algorithm["name"] == "strassen" and (f.manifest.M, f.manifest.N, f.manifest.K) == (M, N, K)
    assert lcmac_cache in f.path.parents             # compiled into the test's cache
    # the same kernel on torch tensors, and with out=
    At, Bt = torch.from_numpy(A), torch.from_numpy(B)
    _close(lcmac.matmul(At, Bt, algo="strassen"), _ref(A, B), np.float32)
    out = np.empty((M, N), np.float32)
    assert lcmac.matmul(A, B, algo="strassen", out=out) is out
    _close(out, _ref(A, B), np.float32)


@pytest.mark.parametrize("algo", ["auto", "strassen"])
def test_batched_a_is_flattened(algo):
    A, B = _ab(M // 6, N, K, seed=3, lead=(2, 3))       # 2×3×11×53 @ 53×45: one 66×53 product
    C = lcmac.matmul(A, B, algo=algo)
    assert C.shape == (2, 3, M // 6, N)
    _close(C, _ref(A, B), np.float32)
    At, Bt = torch.from_numpy(A), torch.from_numpy(B)
    _close(lcmac.matmul(At, Bt, algo=algo), _ref(A, B), np.float32)
    out = np.zeros((2, 3, M // 6, N), np.float32)
    lcmac.matmul(A, B, algo=algo, out=out)
    _close(out, _ref(A, B), np.float32)


def test_torch_op_result_has_grad_fn_and_gradients_match_torch():
    A = torch.randn(2, 3, 7, 5, requires_grad=True)
    B = torch.randn(5, 4, requires_grad=True)
    C = lcmac.matmul(A, B)
    assert C.grad_fn is not None
    g = torch.randn_like(C)
    dA, dB = torch.autograd.grad(C, (A, B), g)
    rA, rB = torch.autograd.grad(torch.matmul(A, B), (A, B), g)
    assert torch.allclose(dA, rA, atol=1e-5) and torch.allclose(dB, rB, atol=1e-5)


def test_gradcheck_through_strassen():
    """float64 gradcheck with every product (forward, dA, dB) on a Strassen kernel."""
    a = torch.randn(6, 4, dtype=torch.float64, requires_grad=True)
    b = torch.randn(4, 5, dtype=torch.float64, requires_grad=True)

    def f(x, y):
        return torch.ops.lcmac.matmul(x, y, "strassen", None)
    assert torch.autograd.gradcheck(f, (a, b))
    a3 = a.detach().reshape(2, 3, 4).requires_grad_()   # a batch of A: the same three products
    assert torch.autograd.gradcheck(f, (a3, b))
    # rows under the smallest bucket are padded into it: one 256-row kernel per N×K
    P = JIT_ROWS["cpu"][-1]
    for shape in [(P, 5, 4), (P, 4, 5), (P, 5, 6)]:
        assert ("strassen", ops.target_for("cpu"), "float64", shape) in ops._kernels


def _graphs(fn, *args):
    """(result, graphs) of torch.compile(fullgraph=True) with a backend that keeps them."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward
    torch._dynamo.reset()
    out = torch.compile(fn, backend=backend, fullgraph=True)(*args)
    return out, graphs


def _op_nodes(gm):
    return [n for n in gm.graph.nodes if n.op == "call_function" and "lcmac" in str(n.target)]


def test_torch_compile_traces_the_op_in_one_graph():
    x, y = torch.randn(3, 7), torch.randn(7, 5)
    out, graphs = _graphs(lambda a, b: torch.ops.lcmac.matmul(a, b, "auto", None).relu() * 2, x, y)
    assert len(graphs) == 1 and len(_op_nodes(graphs[0])) == 1
    assert torch.allclose(out, (x @ y).relu() * 2, atol=1e-5)
    # lcmac.matmul itself traces too
    out, graphs = _graphs(lambda a, b: lcmac.matmul(a, b) + 1, x, y)
    assert len(graphs) == 1 and len(_op_nodes(graphs[0])) == 1
    assert torch.allclose(out, x @ y + 1, atol=1e-5)


def test_torch_compile_with_backward():
    x = torch.randn(4, 6, requires_grad=True)
    w = torch.randn(6, 3, requires_grad=True)
    torch._dynamo.reset()
    f = torch.compile(lambda a, b: torch.ops.lcmac.matmul(a, b).sum(), backend="aot_eager",
                      fullgraph=True)
    f(x, w).backward()
    gx, gw = x.grad.clone(), w.grad.clone()
    x.grad = w.grad = None
    (x @ w).sum().backward()
    assert torch.allclose(gx, x.grad, atol=1e-5) and torch.allclose(gw, w.grad, atol=1e-5)


def test_plan_says_what_runs_and_why():
    p = ops.plan(3, 5, 7, "float32")
    assert p.runs == "vendor" and "vendor" in p.why and p.to_dict()["shape"] == [3, 5, 7]
    assert ops.plan(3, 5, 7, algo="vendor").runs == "vendor"
    assert ops.plan(3, 5, 7, algo="gemm").runs == "gemm"
    with pytest.raises(LcmacError, match="over max_error"):
        ops.plan(M, N, K, algo="strassen", max_error=1.01)


@pytest.mark.parametrize("times, source, runs", [
    ({"gemm": 0.90, "vendor": 1.00}, "exact", "gemm"),        # measured here, 10 % faster
    ({"gemm": 0.99, "vendor": 1.00}, "exact", "vendor"),      # within the tie margin
    ({"gemm": 0.90}, "exact", "vendor"),                      # the vendor not measured
    ({"gemm": 0.90, "vendor": 1.00}, "nearest 4096x4096x4096 (d=0.1)", "vendor"),  # carried
])
def test_auto_runs_lcmacs_plain_gemm_only_where_measured_faster(monkeypatch, times, source, runs):
    """Where the decision is lcmac's plain GEMM, lcmac.matmul compiles it only if the tuning
    log timed it at this very shape faster than the vendor GEMM by more than a tie."""
    from types import SimpleNamespace
    gemm = SimpleNamespace(algorithm="gemm", is_gemm=True, reason="decision: fastest measured")
    dec = Plan((2048, 1536, 7168), "float32", "x86_64-avx512", "auto", "gemm", "gemm", 1.0, None,
               "", source=source, candidates=(gemm,), measurements=times)
    monkeypatch.setattr(planner, "decide_by_measurement", lambda *a, **k: dec)
    monkeypatch.setattr(planner, "_plans", {})
    p = planner.plan(2048, 1536, 7168, "float32", "x86_64-avx512")
    assert (p.runs, p.decision) == (runs, "gemm") and "plain GEMM" in p.why


def test_auto_falls_back_to_the_vendor_gemm_when_a_kernel_cannot_be_built(monkeypatch):
    from lcmac.core.errors import ToolchainError

    def no_compiler(*key):
        raise ToolchainError("no compiler here")
    P = JIT_ROWS["cpu"][-1]
    lcma = Plan((P + 4, 3, 5), "float32", ops.target_for("cpu"), "auto", "strassen", "strassen",
                1.1, 2.0, "test", kernels=JIT, pieces=(Piece(P, P, "strassen"), Piece(4, P, "vendor")))
    monkeypatch.setattr(ops, "plan", lambda *a, **kw: lcma)
    monkeypatch.setattr(ops, "kernel", no_compiler)
    monkeypatch.setattr(ops, "_failed", {})
    A, B = _ab(P + 4, 3, 5)      # a bucket's rows: its kernel is asked for
    with pytest.warns(RuntimeWarning, match="no compiler here"):
        _close(lcmac.matmul(A, B), _ref(A, B), np.float32)
    _close(lcmac.matmul(A, B), _ref(A, B), np.float32)        # warned once per shape
    forced = Plan((4, 3, 5), "float32", lcma.target, "strassen", "strassen",
                  "strassen", 1.1, 2.0, "test")
    monkeypatch.setattr(ops, "plan", lambda *a, **kw: forced)
    with pytest.raises(ToolchainError, match="no compiler here"):
        lcmac.matmul(A, B, algo="strassen")


def test_zero_sized_operands():
    A, B = np.zeros((0, 4), np.float32), np.zeros((4, 3), np.float32)
    assert lcmac.matmul(A, B).shape == (0, 3)
    assert (lcmac.matmul(np.ones((2, 0), np.float32), np.ones((0, 3), np.float32)) == 0).all()


def test_bad_inputs_name_the_problem():
    A, B = _ab(4, 3, 5)
    At, Bt = torch.from_numpy(A), torch.from_numpy(B)
    cases = [
        ((A.astype(np.int64), B.astype(np.int64)), {}, DTypeError, "int64"),
        ((At.to(torch.complex64), Bt.to(torch.complex64)), {}, DTypeError, "complex"),
        ((A.astype(np.complex128), B.astype(np.complex128)), {}, DTypeError, "complex"),
        ((At.half(), Bt.half()), {"algo": "strassen"}, DTypeError, "float16"),
        ((A, B.astype(np.float64)), {}, DTypeError, "one dtype"),
        ((A, Bt), {}, DTypeError, "numpy arrays or both torch tensors"),
        (([[1.0]], B), {}, DTypeError, "numpy array or a torch tensor"),
        ((A[0], B), {}, ShapeError, "…×M×K"),
        ((A, B[None]), {}, ShapeError, "2-D"),
        ((A, B[:-1]), {}, ShapeError, "inner dimensions"),
        ((At, Bt.to("meta")), {}, TargetError, "meta"),
        ((At.to("meta"), Bt.to("meta")), {}, TargetError, "meta"),
        ((A, B), {"algo": "no-such-algorithm"}, CatalogueError, "no-such-algorithm"),
        ((A, B), {"algo": 3}, CatalogueError, "algo must be a string"),
        ((A, B), {"max_error": -1}, ValueError, "max_error"),
        ((A, B), {"out": np.empty((3, 3), np.float32)}, ShapeError, "out has shape"),
        ((A, B), {"out": np.empty((4, 3), np.float64)}, DTypeError, "out has dtype"),
    ]
    for args, kw, exc, words in cases:
        with pytest.raises(exc, match=words):
            lcmac.matmul(*args, **kw)
    with pytest.raises(LcmacError, match="records no gradient"):
        lcmac.matmul(At.requires_grad_(), Bt, out=torch.empty(4, 3))


def test_auto_runs_the_vendor_gemm_for_a_dtype_the_kernels_do_not_take():
    """float16 on a CPU (no lcmac kernel takes it): "auto" and "vendor" give torch.matmul's
    product, through the op too (autograd); a forced algorithm refuses (above)."""
    A, B = _ab(6, 5, 7)
    At, Bt = torch.from_numpy(A).half(), torch.from_numpy(B).half()
    for algo in ("auto", "vendor"):
        assert torch.equal(lcmac.matmul(At, Bt, algo=algo), At @ Bt)
    Ag = At.clone().requires_grad_()
    lcmac.matmul(Ag, Bt).float().sum().backward()
    assert Ag.grad is not None and Ag.grad.dtype == torch.float16


def test_kernel_keys_name_the_bucket_kernels_a_product_runs():
    """What lcmac.matmul would compile for a shape, without compiling: the row pieces' buckets
    (a forced algorithm pads the last rows into the smallest; "auto" gives them to the vendor)."""
    tgt = ops.target_for("cpu")
    P = JIT_ROWS["cpu"]
    keys = ops.kernel_keys(1000, 45, 53, "float32", algo="strassen", target=tgt)
    assert keys == [("strassen", tgt, "float32", (512, 45, 53)), ("strassen", tgt, "float32", (256, 45, 53))]
    assert 1000 < P[0] and ops.kernel_keys(3, 5, 7, "float32", algo="vendor", target=tgt) == []
    assert ops.kernel_keys(3, 5, 7, "float32", algo="strassen", target=tgt) == [
        ("strassen", tgt, "float32", (P[-1], 5, 7))]


def test_adjacent_vendor_pieces_run_as_one_call():
    """Row pieces the vendor GEMM takes run as one call where they are adjacent (one large GEMM
    is faster than its pieces), around the pieces a kernel takes."""
    from lcmac.runtime.tiled import run_rows
    A, B = _ab(15, 3, 5)
    calls = []

    def vendor(a, b, out):
        calls.append(a.shape[0])
        np.matmul(a, b, out=out)

    def kernel_for(shape):          # a kernel for the 4-row bucket only
        return (lambda a, b, out=None: np.matmul(a, b, out=out)) if shape[0] == 4 else None
    C = run_rows(A, B, None, (8, 4, 2), kernel_for, N=3, K=5, vendor=vendor)
    # pieces 8 (vendor), 4 (kernel), 2 (vendor) and the padded 1 (vendor): two vendor calls
    assert calls == [8, 3]
    _close(C, _ref(A, B), np.float32)


def test_plan_says_vendor_where_every_bucket_gives_its_rows_to_it(monkeypatch):
    ask = dict(max_error=None, regime="burst", logs=None, vendor=True, static_b=False)
    lcma = Plan((4000, 4000, 4000), "float32", "x86_64-avx512", "auto", "winograd^2",
                "winograd^2", 1.2, 4.0, "test")
    monkeypatch.setattr(planner, "_bucket_runs_kernel", lambda p, shape, ask: False)
    p = planner._vendor_if_every_piece_is(planner._with_pieces(lcma, ask))
    assert (p.runs, p.decision) == ("vendor", "winograd^2")
    assert "2048+1024+512+256+160" in p.why
    whole = Plan((4096, 4000, 4000), *[getattr(lcma, f) for f in
                                       ("dtype", "target", "algo", "runs", "decision", "speedup",
                                        "error", "why")])
    whole = planner._with_pieces(whole, ask)
    assert planner._vendor_if_every_piece_is(whole) is whole        # one bucket: its own decision
    monkeypatch.setattr(planner, "_bucket_runs_kernel", lambda p, shape, ask: shape[0] == 1024)
    lcma = planner._with_pieces(lcma, ask)
    assert planner._vendor_if_every_piece_is(lcma) is lcma          # a bucket runs the kernel
