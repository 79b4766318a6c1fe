"""A ``Plan`` crosses processes (a pool deciding shapes, scripts/bench_sweep.py): it pickles
although its candidates hold read-only mappings, and comes back equal, still read-only."""
import pickle
from types import MappingProxyType

import pytest

import lcmac
from lcmac.policy.plans import Plan


def test_a_ranked_plan_round_trips_through_pickle():
    p = lcmac.plan(2048, 2048, 2048, dtype="float32", target="x86_64-avx512")
    assert isinstance(p, Plan) and p.candidates
    assert isinstance(p.candidates[0].stages, MappingProxyType)     # what pickle refuses alone
    q = pickle.loads(pickle.dumps(p))
    assert q == p and q is not p and type(q) is Plan
    assert q.candidates == p.candidates and q.measurements == p.measurements
    c = q.candidates[0]
    assert isinstance(c.stages, MappingProxyType) and dict(c.stages) == dict(p.candidates[0].stages)
    with pytest.raises(TypeError):
        c.stages["x"] = 1
    with pytest.raises(AttributeError):        # still frozen
        c.rank = 0
    assert q.describe() == p.describe() and q.to_dict() == p.to_dict()


def test_a_plain_plan_round_trips():
    p = Plan((3, 5, 7), "float32", "x86_64-avx512", "vendor", "vendor", "vendor", None, None,
             "asked", measurements={"gemm": 1e-3})
    assert pickle.loads(pickle.dumps(p)) == p
