"""lcmac.matmul's repeated calls: a call whose decision is the vendor GEMM is kept, and a repeat
goes straight to the vendor's own call (torch.matmul(A, B); numpy's chosen GEMM), with results
bit-identical to it; what the decision rests on moving (torch's float32 class, records reaching
the tuning logs, the environment, forgotten plans or vendor choices) decides again; bad
operands still raise.  CPU only, nothing compiled (a stand-in kernel where an LCMA is chosen)."""
import json
import types

import numpy as np
import pytest

import lcmac
from lcmac import policy
from lcmac.api import matmul as ops
from lcmac.api.call_args import target_for
from lcmac.artifact import tuning_log as tdb
from lcmac.core.errors import CatalogueError, DTypeError, LcmacError, ShapeError
from lcmac.policy import planner
from lcmac.runtime import cpu_vendor

torch = pytest.importorskip("torch")
ops.register()

SHAPES = [(1, 1, 1), (8, 32, 64), (33, 17, 65), (128, 96, 80)]      # M, N, K: all vendor
LCMA_SHAPE = (256, 64, 64)       # one CPU bucket: an LCMA measured fastest there runs


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """An empty tuning log of its own, no kept plans, a clock the test moves, and a count of
    the calls that decided (``decided``: the precision each plan was asked under)."""
    monkeypatch.setenv("LCMAC_TUNING_LOGS", str(tmp_path / "logs"))
    monkeypatch.setenv("LCMAC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(cpu_vendor.ENV, raising=False)
    monkeypatch.setattr(planner, "_plans", {})
    clock = types.SimpleNamespace(now=1e6)
    monkeypatch.setattr(planner, "time", types.SimpleNamespace(monotonic=lambda: clock.now))
    decided = []
    real = policy.plan

    def plan(*a, **kw):
        decided.append(kw.get("precision"))
        return real(*a, **kw)
    monkeypatch.setattr(policy, "plan", plan)
    checked = []
    real_check = ops.check_operands

    def check_operands(*a, **kw):
        checked.append(a[0].shape)
        return real_check(*a, **kw)
    monkeypatch.setattr(ops, "check_operands", check_operands)
    return types.SimpleNamespace(clock=clock, decided=decided, checked=checked,
                                 logs=tmp_path / "logs")


@pytest.fixture
def torch_class():
    before = torch.get_float32_matmul_precision()
    yield torch.set_float32_matmul_precision
    torch.set_float32_matmul_precision(before)


def _torch_ab(M, N, K, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(M, K, generator=g).to(dtype), torch.randn(K, N, generator=g).to(dtype)


def _record(algo, t, shape=LCMA_SHAPE):
    name, h = tdb.algo_identity(algo)
    return tdb.make_record(target=target_for("cpu"), dtype="float32", algorithm=name,
                           algorithm_hash=h, shape=shape,
                           config={"library": "openblas"} if algo == "vendor" else {},
                           time_s=t, spread=0.01, repeats=5, device="test")


@pytest.mark.parametrize("M, N, K", SHAPES)
def test_a_repeat_is_torch_matmul_bit_for_bit_without_deciding(fresh, M, N, K):
    A, B = _torch_ab(M, N, K)
    with torch.no_grad():
        first = lcmac.matmul(A, B)
    n = len(fresh.checked)
    assert n >= 1
    for grad in (False, True):               # nothing requires grad: the same with grad on
        with torch.set_grad_enabled(grad):
            again = lcmac.matmul(A, B)
        assert torch.equal(again, torch.matmul(A, B)) and torch.equal(again, first)
    assert len(fresh.checked) == n            # neither checked nor decided again
    # any layout: the vendor GEMM takes it as it is
    At, Bt = A.t().contiguous().t(), B.t().contiguous().t()
    assert torch.equal(lcmac.matmul(At, Bt), torch.matmul(At, Bt))
    assert torch.equal(lcmac.matmul(At, Bt), torch.matmul(At, Bt))


def test_batched_and_bfloat16_repeats_are_torch_matmul(fresh):
    A, B = _torch_ab(12, 16, 24, torch.bfloat16)
    A3 = torch.randn(3, 4, 24).to(torch.bfloat16)
    for _ in range(2):
        assert torch.equal(lcmac.matmul(A, B), torch.matmul(A, B))
        assert torch.equal(lcmac.matmul(A3, B), torch.matmul(A3, B))


@pytest.mark.parametrize("M, N, K", SHAPES + [(200, 300, 400)])
def test_numpy_repeats_are_the_cpu_vendor_gemm_bit_for_bit(fresh, M, N, K):
    rng = np.random.default_rng(1)
    A = rng.standard_normal((M, K)).astype(np.float32)
    B = rng.standard_normal((K, N)).astype(np.float32)
    first = lcmac.matmul(A, B)
    n = len(fresh.checked)
    again = lcmac.matmul(A, B)
    assert np.array_equal(again, cpu_vendor.matmul(A, B)) and np.array_equal(again, first)
    assert len(fresh.checked) == n


def test_torchs_float32_class_decides_again(fresh, torch_class):
    torch_class("highest")
    A, B = _torch_ab(8, 32, 64)
    lcmac.matmul(A, B)
    lcmac.matmul(A, B)
    assert fresh.decided == ["highest"]
    torch_class("high")
    assert torch.equal(lcmac.matmul(A, B), torch.matmul(A, B))
    assert fresh.decided == ["highest", "high"]
    lcmac.matmul(A, B)
    assert fresh.decided == ["highest", "high"]
    # a precision= pin that is not torch's class is refused on a repeat too
    with pytest.raises(LcmacError, match="precision"):
        lcmac.matmul(A, B, precision="highest")


def _stand_in_kernels(monkeypatch):
    """(the algorithms lcmac's kernels ran, in order; A, B at LCMA_SHAPE): every kernel a
    numpy product that records its algorithm."""
    ran = []

    def kernel(algo, target, dtype, shape, *mode):
        def run(a, b, out=None):
            ran.append(algo)
            np.matmul(a, b, out=out)
            return out
        return run
    monkeypatch.setattr(ops, "kernel", kernel)
    rng = np.random.default_rng(2)
    M, N, K = LCMA_SHAPE
    return (ran, rng.standard_normal((M, K)).astype(np.float32),
            rng.standard_normal((K, N)).astype(np.float32))


def test_a_new_record_in_the_log_decides_again(fresh, monkeypatch):
    ran, A, B = _stand_in_kernels(monkeypatch)
    lcmac.matmul(A, B)
    lcmac.matmul(A, B)
    assert ran == [] and len(fresh.decided) == 1          # the vendor GEMM, decided once
    tdb.TuningDB(fresh.logs).append([_record("vendor", 1e-3), _record("gemm", 1e-3),
                                     _record("strassen", 1e-5)])
    # this process wrote them: seen at once, the clock not moved
    C = lcmac.matmul(A, B)
    assert ran == ["strassen"] and np.allclose(C, A @ B, atol=1e-4)
    lcmac.matmul(A, B)
    assert ran == ["strassen", "strassen"]


def test_another_processs_record_is_seen_when_the_logs_are_looked_at_again(fresh, monkeypatch):
    ran, A, B = _stand_in_kernels(monkeypatch)
    lcmac.matmul(A, B)
    log = tdb.log_path(fresh.logs, target_for("cpu"), "float32")
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a", encoding="utf-8") as f:        # as another process appends
        for r in (_record("vendor", 1e-3), _record("gemm", 1e-3), _record("strassen", 1e-5)):
            f.write(json.dumps(r) + "\n")
    fresh.clock.now += planner.RECHECK_S               # the logs are looked at again
    lcmac.matmul(A, B)
    assert ran == ["strassen"]


def test_a_plan_that_sees_a_new_record_drops_the_kept_calls_at_once(fresh):
    A, B = _torch_ab(*LCMA_SHAPE)
    lcmac.matmul(A, B)
    lcmac.matmul(A, B)
    assert len(fresh.decided) == 1
    tdb.TuningDB(fresh.logs).append([_record("vendor", 1e-3, (64, 64, 64))])
    lcmac.plan(64, 64, 64)             # reads the logs' new state (the clock has not moved)
    lcmac.matmul(A, B)
    assert len(fresh.decided) == 3


def test_forgetting_and_new_plan_tables_decide_again(fresh, monkeypatch):
    A, B = _torch_ab(8, 32, 64)
    lcmac.matmul(A, B)
    lcmac.matmul(A, B)
    assert len(fresh.decided) == 1
    planner.forget()
    lcmac.matmul(A, B)
    assert len(fresh.decided) == 2
    monkeypatch.setattr(planner, "_plans", {})
    lcmac.matmul(A, B)
    assert len(fresh.decided) == 3
    cpu_vendor.forget()
    lcmac.matmul(A, B)
    assert len(fresh.decided) == 4


@pytest.mark.parametrize("name, value", [("LCMAC_DEVICE", "Some Other CPU"),
                                         ("LCMAC_TUNING_LOGS", None), ("LCMAC_CACHE_DIR", None),
                                         (cpu_vendor.ENV, "numpy")])
def test_an_environment_override_decides_again(fresh, monkeypatch, tmp_path, name, value):
    A, B = _torch_ab(8, 32, 64)
    lcmac.matmul(A, B)
    lcmac.matmul(A, B)
    assert len(fresh.decided) == 1
    monkeypatch.setenv(name, value or str(tmp_path / "elsewhere"))
    assert torch.equal(lcmac.matmul(A, B), torch.matmul(A, B))
    assert len(fresh.decided) == 2
    monkeypatch.delenv(name)
    lcmac.matmul(A, B)
    assert len(fresh.decided) == 3


def test_the_cpu_vendor_pin_changes_what_numpy_repeats_run(fresh, monkeypatch):
    calls = []
    real = cpu_vendor.CpuGemm.__call__

    def spy(self, A, B, out=None):
        calls.append(self.api)
        return real(self, A, B, out)
    monkeypatch.setattr(cpu_vendor.CpuGemm, "__call__", spy)
    rng = np.random.default_rng(3)
    A = rng.standard_normal((200, 300)).astype(np.float32)    # over SMALL_SIDE³: a size class
    B = rng.standard_normal((300, 100)).astype(np.float32)
    lcmac.matmul(A, B)
    lcmac.matmul(A, B)
    assert calls == []                                        # no kept choice: numpy.matmul
    monkeypatch.setenv(cpu_vendor.ENV, "torch")
    C = lcmac.matmul(A, B)
    lcmac.matmul(A, B)
    assert calls == [cpu_vendor.TORCH] * 2
    assert np.array_equal(C, torch.matmul(torch.from_numpy(A), torch.from_numpy(B)).numpy())


def test_autograd_still_runs_through_the_op(fresh):
    A, B = _torch_ab(8, 32, 64)
    lcmac.matmul(A, B)
    lcmac.matmul(A, B)                                        # kept without grad
    Ag, Bg = A.clone().requires_grad_(), B.clone().requires_grad_()
    C = lcmac.matmul(Ag, Bg)
    assert "lcmac_matmul" in type(C.grad_fn).__name__           # the op's autograd node
    C.square().sum().backward()
    Ar, Br = A.clone().requires_grad_(), B.clone().requires_grad_()
    torch.matmul(Ar, Br).square().sum().backward()
    assert torch.allclose(Ag.grad, Ar.grad) and torch.allclose(Bg.grad, Br.grad)
    with torch.no_grad():
        assert lcmac.matmul(Ag, Bg).grad_fn is None


def test_the_op_hands_views_on_without_copies(fresh, monkeypatch):
    seen = []
    real = ops.compute

    def compute(A, B, *a, **kw):
        seen.append((A.is_contiguous(), B.is_contiguous()))
        return real(A, B, *a, **kw)
    monkeypatch.setattr(ops, "compute", compute)
    A, B = _torch_ab(8, 32, 64)
    Bt = B.t().contiguous().t()                               # a transposed layout
    A.requires_grad_()
    C = torch.ops.lcmac.matmul(A, Bt)
    assert seen == [(True, False)] and torch.equal(C, torch.matmul(A, Bt))


def test_bad_operands_raise_after_a_kept_call(fresh):
    A, B = _torch_ab(8, 32, 64)
    a, b = A.numpy().copy(), B.numpy().copy()
    for _ in range(2):
        lcmac.matmul(A, B)
        lcmac.matmul(a, b)
    with pytest.raises(ShapeError):
        lcmac.matmul(A, B[:-1])
    with pytest.raises(ShapeError):
        lcmac.matmul(a, b[:-1])
    with pytest.raises(DTypeError, match="one dtype"):
        lcmac.matmul(A, B.double())
    with pytest.raises(DTypeError, match="one dtype"):
        lcmac.matmul(a, b.astype(np.float64))
    with pytest.raises(LcmacError):
        lcmac.matmul(A, b)
    with pytest.raises(ValueError):
        lcmac.matmul(A, B, max_error=-1.0)
    with pytest.raises(ValueError):
        lcmac.matmul(a, b, max_error=float("nan"))
    with pytest.raises(CatalogueError):
        lcmac.matmul(A, B, algo="no-such-algorithm")
    with pytest.raises(ValueError):
        lcmac.matmul(A, B, max_error=[1.0])
    with pytest.raises(LcmacError):
        lcmac.matmul(A.to("meta"), B.to("meta"))


def test_linear_on_the_vendor_path_is_f_linear_with_no_transposed_copy(fresh):
    F = torch.nn.functional
    w = torch.nn.Parameter(torch.randn(32, 64))
    x = torch.randn(2, 4, 64)
    kept = len(ops._transposed)
    with torch.no_grad():
        for _ in range(2):
            assert torch.equal(ops.linear(x, w), F.linear(x, w))
    assert len(ops._transposed) == kept and len(fresh.decided) == 1
    y = ops.linear(x, w)                                      # through the op: autograd
    y.sum().backward()
    assert torch.equal(y, F.linear(x, w))
    assert torch.allclose(w.grad, x.reshape(-1, 64).sum(0).expand(32, 64))
