"""lcmac.matmul and lcmac.auto take operands of any layout, as numpy and torch do: transposed,
Fortran-ordered, sliced and reversed views give numpy's / torch's product, and a strided
``out`` receives it.  A stand-in kernel that refuses what a compiled one refuses (memory that
is not row-major) shows that a kernel only ever sees row-major copies; the test marked slow
runs a real kernel (strassen float64 256x5x4, which tests/test_ops.py builds too)."""
import numpy as np
import pytest

import lcmac
from lcmac.api import matmul as ops
from lcmac.core.errors import DTypeError, ShapeError
from lcmac.core.operands import check_contiguous
from lcmac.policy import Plan
from lcmac.runtime.vendor import vendor_matmul
from lcmac.spec.shape_rules import JIT_ROWS

torch = pytest.importorskip("torch")

P = JIT_ROWS["cpu"][-1]          # one bucket's rows: the kernel gets slices, not padded copies
N, K = 5, 7


def _kernel(calls):
    """A kernel as the loader checks its operands: row-major A, B and out, else ShapeError."""
    def run(a, b, out=None):
        for name, x in (("A", a), ("B", b), ("out", out)):
            if x is not None:
                check_contiguous(x, name, output=name == "out")
        calls.append(tuple(a.shape))
        return vendor_matmul(a, b, out=out)
    return run


@pytest.fixture
def stand_in(monkeypatch):
    """Every lcmac.matmul runs a forced strassen plan on the stand-in kernel; its calls."""
    calls = []
    target = ops.target_for("cpu")

    def plan(m, n, k, dtype="float32", **kw):
        return Plan((m, n, k), dtype, target, "strassen", "strassen", "strassen", 1.1, 2.0, "test")
    monkeypatch.setattr(ops, "plan", plan)
    monkeypatch.setattr(ops, "kernel", lambda *key: _kernel(calls))
    return calls


def _numpy_layouts(rng):
    """(name, A, B): A of P×K and B of K×N in several layouts."""
    a = rng.standard_normal((P, K))
    b = rng.standard_normal((K, N))
    wide_a = rng.standard_normal((2 * P, K + 3))
    return [
        ("transposed", np.ascontiguousarray(a.T).T, np.ascontiguousarray(b.T).T),
        ("fortran", np.asfortranarray(a), np.asfortranarray(b)),
        ("sliced", wide_a[::2, 1:K + 1], rng.standard_normal((K, 3 * N))[:, ::3]),
        ("reversed", a[::-1], b[::-1, ::-1]),
    ]


def test_numpy_views_match_numpy(stand_in):
    rng = np.random.default_rng(0)
    for name, A, B in _numpy_layouts(rng):
        assert not (A.flags.c_contiguous or B.flags.c_contiguous), name
        C = lcmac.matmul(A, B)
        assert C.shape == (P, N) and np.allclose(C, A @ B, rtol=1e-12, atol=1e-12), name
    assert stand_in == [(P, K)] * 4                 # each ran on the kernel


def test_a_strided_out_receives_the_product(stand_in):
    rng = np.random.default_rng(1)
    A, B = rng.standard_normal((P, K)), rng.standard_normal((K, N))
    out = np.zeros((N, P)).T                         # a transposed view of other memory
    assert lcmac.matmul(A, B, out=out) is out
    assert np.allclose(out, A @ B, rtol=1e-12, atol=1e-12) and stand_in == [(P, K)]
    At, Bt = torch.from_numpy(A), torch.from_numpy(B)
    tout = torch.zeros(N, P, dtype=torch.float64).t()
    assert lcmac.matmul(At, Bt, out=tout) is tout
    assert torch.allclose(tout, At @ Bt)


def test_torch_views_match_torch(stand_in):
    torch.manual_seed(0)
    cases = [
        ("transposed", torch.randn(K, P, dtype=torch.float64).t(), torch.randn(N, K, dtype=torch.float64).t()),
        ("sliced", torch.randn(P, 2 * K, dtype=torch.float64)[:, ::2], torch.randn(K + 2, N, dtype=torch.float64)[1:-1]),
    ]
    for name, A, B in cases:
        assert not A.is_contiguous(), name
        assert torch.allclose(lcmac.matmul(A, B), A @ B, rtol=1e-12, atol=1e-12), name
    # with gradients, through torch.ops.lcmac.matmul: the same product and torch's gradients
    A = torch.randn(K, P, dtype=torch.float64).t().requires_grad_()
    B = torch.randn(N, K, dtype=torch.float64).t().requires_grad_()
    g = torch.randn(P, N, dtype=torch.float64)
    C = lcmac.matmul(A, B)
    assert torch.allclose(C, A @ B)
    got = torch.autograd.grad(C, (A, B), g)
    want = torch.autograd.grad(A @ B, (A, B), g)
    assert all(torch.allclose(x, y) for x, y in zip(got, want))


def test_the_vendor_path_takes_views_as_they_are():
    rng = np.random.default_rng(2)
    for name, A, B in _numpy_layouts(rng):
        for algo in ("vendor", "auto"):
            assert np.array_equal(lcmac.matmul(A, B, algo=algo), np.matmul(A, B)), (name, algo)
    out = np.zeros((N, P)).T
    A, B = _numpy_layouts(rng)[0][1:]
    lcmac.matmul(A, B, algo="vendor", out=out)
    assert np.array_equal(out, np.matmul(A, B))


def test_bad_input_in_any_layout_is_still_named():
    rng = np.random.default_rng(3)
    A, B = rng.standard_normal((K, 4)).T, rng.standard_normal((N, K)).T      # 4×K, K×N views
    cases = [
        ((A, B), {"out": np.zeros((4, N + 1)).T}, ShapeError, "out has shape"),
        ((A, B), {"out": np.zeros((N, 4), np.float32).T}, DTypeError, "out has dtype"),
        ((A, B.T), {}, ShapeError, "inner dimensions"),
        ((A.astype(np.int64), B.astype(np.int64)), {}, DTypeError, "int64"),
        ((A, B.astype(np.float32)), {}, DTypeError, "one dtype"),
        ((A[0], B), {}, ShapeError, "…×M×K"),
    ]
    for args, kw, exc, words in cases:
        with pytest.raises(exc, match=words):
            lcmac.matmul(*args, **kw)


def test_auto_runs_an_artifact_on_row_major_copies(monkeypatch):
    """lcmac.auto: a strided operand or out reaches the artifact as a row-major copy."""
    calls = []
    mm = lcmac.auto()
    monkeypatch.setattr(mm, "plan", lambda m, n, k, dtype, target=None: Plan(
        (m, n, k), dtype, target, "auto", "strassen", "strassen", 1.1, 2.0, "test"))
    monkeypatch.setattr(mm, "_kernel", lambda p: _kernel(calls))
    rng = np.random.default_rng(4)
    A, B = rng.standard_normal((K, 6)).T, np.asfortranarray(rng.standard_normal((K, N)))
    assert np.allclose(mm(A, B), A @ B)
    out = np.zeros((N, 6)).T
    assert mm(A, B, out=out) is out and np.allclose(out, A @ B)
    with pytest.raises(ShapeError, match="out has shape"):
        mm(A, B, out=np.zeros((N, 7)).T)
    assert calls == [(6, K), (6, K)]


def test_a_real_kernel_on_transposed_and_fortran_operands(lcmac_cache):
    rng = np.random.default_rng(5)
    A = np.ascontiguousarray(rng.standard_normal((4, 6))).T         # 6×4, transposed
    B = np.asfortranarray(rng.standard_normal((4, 5)))
    C = lcmac.matmul(A, B, algo="strassen")
    assert np.allclose(C, A @ B, rtol=1e-12, atol=1e-12)
    out = np.zeros((5, 6)).T
    lcmac.matmul(A[::-1], B, algo="strassen", out=out)
    assert np.allclose(out, A[::-1] @ B, rtol=1e-12, atol=1e-12)
    f = ops.kernel("strassen", ops.target_for("cpu"), "float64", (P, 5, 4))
    assert lcmac_cache in f.path.parents
