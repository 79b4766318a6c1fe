"""lcmac.policy, the one decision: ``lcmac.ops.plan`` says what ``lcmac.matmul`` runs, and
``lcmac.auto(...).plan`` makes the same decision with the same defaults, for shapes where the
tuning logs lcmac ships pick the vendor GEMM, lcmac's plain GEMM and an LCMA on
``x86_64-avx512``.  Nothing is compiled: stand-ins for the kernels and the vendor GEMM record
what runs, and planning is checked to compile nothing."""
import json

import numpy as np
import pytest

import lcmac
from lcmac.api import auto as auto_mod
from lcmac.api import call_args, matmul as ops
from lcmac.artifact import build as build_mod
from lcmac.artifact.tuning_log import TuningDB, algo_identity, make_record
from lcmac.policy import JIT, VENDOR, Plan, decide_by_measurement, planner

TARGET = "x86_64-avx512"
#: shape → the decision the shipped logs make there
DECISIONS = {
    (2048, 4096, 4096): "vendor",        # the vendor GEMM, measured faster at a nearby shape
    (512, 576, 7168): "gemm",            # lcmac's plain GEMM, measured faster than the vendor here
    (64, 64, 64): "gemm",                # the plain GEMM, not measured here: the vendor runs it
    (512, 1536, 7168): "strassen",       # an LCMA measured fastest here
    (8192, 8192, 8192): "strassen",      # an LCMA, run per 4096-row piece
    (4000, 4000, 4000): "strassen",      # an LCMA whose every row bucket goes to the vendor
                                         # (winograd^2, measured faster, is over the default
                                         # error budget)
}
#: how a plan's ``why`` starts, by what runs
WHY_STARTS = {"vendor": "vendor GEMM", "gemm": "lcmac's plain GEMM"}


@pytest.fixture
def ran(monkeypatch):
    """What runs, as (algorithm, rows) per call: lcmac.matmul's kernels and vendor GEMM and
    lcmac.auto's artifacts and vendor GEMM are stand-ins; the CPU is x86_64-avx512."""
    calls = []

    def kernel(algo, target, dtype, shape):
        assert target == TARGET

        def run(a, b, out=None):
            calls.append((algo, a.shape[0]))
            return out
        return run

    def vendor(a, b, out=None):
        calls.append((VENDOR, a.shape[0]))
        return out
    monkeypatch.setattr(ops, "kernel", kernel)
    monkeypatch.setattr(ops, "vendor_matmul", vendor)
    monkeypatch.setattr(auto_mod, "vendor_matmul", vendor)
    monkeypatch.setitem(call_args._targets, "cpu", TARGET)
    monkeypatch.setattr(planner, "_plans", {})         # decided here, on the shipped logs
    return calls


def _calls(p: Plan) -> list:
    """The calls a plan of lcmac.matmul's makes: one per piece, adjacent vendor pieces as one."""
    if p.runs == VENDOR:
        return [(VENDOR, p.shape[0])]
    out = []
    for piece in p.pieces:
        if piece.runs == VENDOR and out and out[-1][0] == VENDOR:
            out[-1] = (VENDOR, out[-1][1] + piece.rows)
        else:
            out.append((piece.runs, piece.rows))
    return out


@pytest.mark.parametrize("shape, decision", DECISIONS.items(), ids=lambda x: str(x))
def test_plan_says_what_matmul_runs_and_auto_decides_the_same(ran, monkeypatch, shape, decision):
    M, N, K = shape
    p = ops.plan(M, N, K, "float32", target=TARGET)
    assert p.decision == decision and p.kernels == JIT
    assert p.why.startswith(WHY_STARTS.get(p.runs, p.runs))
    A, B = np.empty((M, K), np.float32), np.empty((K, N), np.float32)
    lcmac.matmul(A, B)
    assert ran == _calls(p) and {a for a, _ in ran} <= {p.runs, VENDOR}
    buckets = dict.fromkeys(x.bucket for x in p.pieces if x.runs != VENDOR)
    assert ops.kernel_keys(M, N, K, target=TARGET) == (
        [] if p.runs == VENDOR else [(p.runs, TARGET, "float32", (b, N, K)) for b in buckets])
    # lcmac.auto asks the same decision with the same defaults; its kernels are artifacts of
    # the exact shape (here compiled on first use), and its plan says so and what runs
    ran.clear()
    mm = lcmac.auto(target=TARGET, build=True)
    a = mm.plan(M, N, K)
    assert (a.decision, a.source) == (p.decision, p.source)
    assert [c.algorithm for c in a.candidates] == [c.algorithm for c in p.candidates]
    assert a.kernels != JIT and "kernel cache" in a.kernels
    assert a.runs == decision and a.why.startswith(decision)
    monkeypatch.setattr(mm, "_kernel", lambda plan: ran.append((plan.runs, M)) or (lambda *x, **k: None))
    mm(A, B)
    assert ran == [(a.runs, M)]


def test_auto_without_kernels_names_the_decision_and_where_matmul_differs(ran):
    """The README's case: lcmac.auto() with no artifacts runs the vendor GEMM where
    lcmac.matmul runs an LCMA; the plan says that the decision is the LCMA, why the vendor
    runs, and where the kernels would come from."""
    p = lcmac.auto(target=TARGET).plan(512, 1536, 7168)
    m = ops.plan(512, 1536, 7168, target=TARGET)
    assert (p.decision, m.decision, m.runs) == ("strassen", "strassen", "strassen")
    assert p.runs == VENDOR and "no artifacts directory" in p.why and "lcmac.matmul" in p.why
    assert p.kernels.startswith("none") and m.kernels == JIT


def test_planning_compiles_nothing_and_every_decision_is_a_plan(ran, monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("planning compiled a kernel")
    monkeypatch.setattr(build_mod, "run_worker", refuse)
    monkeypatch.setattr(auto_mod, "cached_build", refuse)
    monkeypatch.setattr(auto_mod, "build_artifact", refuse)
    shape = (3000, 2048, 2048)
    plans = [ops.plan(*shape, target=TARGET), ops.plan(*shape, algo="strassen", target=TARGET),
             ops.plan(*shape, algo="vendor", target=TARGET),
             lcmac.auto(target=TARGET, build=True).plan(*shape),
             decide_by_measurement(*shape, "float32", TARGET)]
    assert all(type(p) is Plan for p in plans)
    for p in plans:
        d = json.loads(json.dumps(p.to_dict()))
        assert d["shape"] == list(shape) and d["runs"] == p.runs and d["why"] == p.why
    forced = plans[1]
    assert [(x.rows, x.bucket, x.runs) for x in forced.pieces] == [
        (2048, 2048, "strassen"), (512, 512, "strassen"), (256, 256, "strassen"),
        (184, 256, "strassen")]       # a forced algorithm pads the last rows into its bucket
    assert plans[0].pieces[-1].runs == VENDOR        # "auto" gives them to the vendor GEMM


def test_the_public_names_reach_one_plan():
    import lcmac
    import lcmac.ops
    from lcmac.policy import Plan
    assert lcmac.plan is lcmac.ops.plan
    assert isinstance(lcmac.plan(64, 64, 64, target="x86_64-avx512"), Plan)

def _rec(shape, t, algo, cfg=None):
    """A tuning record of the CPU target in float32 (the vendor's config names its library)."""
    name, h = algo_identity(algo)
    return make_record(target=TARGET, dtype="float32", algorithm=name, algorithm_hash=h,
                       shape=shape, config=cfg or {"mr": 8, "nr": 32}, time_s=t, spread=0.01,
                       repeats=5, device="test")


def test_measured_lcma_beside_the_vendor_decides_and_its_ratio_carries(tmp_path):
    """The vendor GEMM and one LCMA measured (no plain GEMM): the measured LCMA is the decision,
    an unmeasured LCMA the model ranks first is only worth tuning; at a shape nearby the
    LCMA's ratio to the vendor carries over (the vendor is the baseline measured there)."""
    from lcmac.costmodel import select
    shape = (2048, 2048, 2048)
    model = {c.algorithm: c.predicted_time_s for c in select(*shape, "float32", TARGET)}
    lcmas = sorted((t, a) for a, t in model.items() if a not in ("gemm", "strassen"))
    best_unmeasured = lcmas[0][1]
    assert lcmas[0][0] < model["strassen"]          # the model puts another LCMA ahead
    store = TuningDB(tmp_path)
    store.append([_rec(shape=shape, algo="strassen", t=0.8 * model["gemm"]),
                  _rec(shape=shape, algo="vendor", t=model["gemm"],
                      cfg={"library": "openblas", "api": "numpy.matmul"})])
    d = decide_by_measurement(*shape, "float32", TARGET, db=store)
    assert d.algorithm == "strassen" and "fastest measured" in d.why
    assert best_unmeasured in d.worth_tuning
    near = decide_by_measurement(2048, 2048, 2560, "float32", TARGET, db=store)
    assert "nearest logged shape 2048x2048x2048" in near.why and near.algorithm == "strassen"
    s = next(c for c in near.candidates if c.algorithm == "strassen")
    v = next(c for c in near.candidates if c.algorithm == "vendor")
    assert s.measured and s.predicted_time_s / v.predicted_time_s == pytest.approx(0.8)


def test_the_vendor_is_named_as_its_record_measured_it(tmp_path):
    """The decision says which vendor GEMM its record timed (api and library)."""
    shape = (2048, 2048, 2048)
    store = TuningDB(tmp_path)
    store.append([_rec(shape=shape, algo="vendor", t=1e-6,
                       cfg={"library": "mkl", "api": "torch.matmul"})])
    d = decide_by_measurement(*shape, "float32", TARGET, db=store)
    assert d.algorithm == "vendor" and "vendor GEMM (torch.matmul, mkl)" in d.why
