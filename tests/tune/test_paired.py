"""CPU kernels timed in rounds alternating with the vendor GEMM (``measure.time_paired``), the
ratio logged and reported.  Fast: fake clocks and callables, a stubbed measuring process."""
import pytest

from lcmac.artifact import tuning_log as tdb
from lcmac.tune import tuner
from tests.tune.test_tune import CPU, _configs, rec


def test_time_paired_alternates_and_reports_the_vendor_of_the_same_rounds(monkeypatch):
    from lcmac.tune import measure
    order, clock = [], [0.0]
    monkeypatch.setattr(measure.time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(measure.time, "sleep", lambda s: None)

    def call(name, cost):
        def f():
            order.append(name)
            clock[0] += cost
        return f
    out = measure.time_paired(call("k", 2e-3), call("v", 3e-3), warmup=1, repeats=4, min_run_s=0)
    assert out["time_s"] == pytest.approx(2e-3) and out["vendor_paired_s"] == pytest.approx(3e-3)
    assert out["paired_ratio"] == pytest.approx(1.5) and out["inner"] == 1
    timed = order[4:]                   # after the warm-up pair and the two sizing calls
    assert timed == ["k", "v", "v", "k", "k", "v", "v", "k"]     # the order flips every round


def test_tuner_times_cpu_kernels_paired_with_the_vendor_and_logs_it(tmp_path):
    seen = []

    class Worker:                       # the measuring process, stubbed: records its arguments
        def measure(self, path, target, dtype, shape, **kw):
            seen.append(kw)
            return {"status": "ok", "time_s": 1e-3, "spread": 0.01, "vendor_paired_s": 1.1e-3}

        def measure_vendor(self, target, dtype, shape, **kw):
            assert "paired" not in kw
            return {"status": "ok", "time_s": 1e-3, "spread": 0.01, "config": {"library": "numpy"}}

        def close(self, kill=False):
            pass
    res = tuner.tune("gemm", CPU, "float32", (512, 512, 512), budget=2, db=tmp_path, worker=Worker(),
                     build_fn=lambda pt, out_dir: str(tmp_path / "a.json"), vendor=True,
                     configs=_configs(2))
    assert seen and all(kw.get("paired") is True for kw in seen)
    recs = [r for r in tdb.TuningDB(tmp_path).records(CPU, "float32") if r["algorithm"] == "gemm"]
    assert recs and all(r["vendor_paired_s"] == 1.1e-3 for r in recs)
    assert res.summary_rows()[0]["vs_vendor"] == pytest.approx(1.1)   # of its own rounds
    seen.clear()                        # without the vendor baseline: timed alone
    tuner.tune("gemm", CPU, "float32", (256, 256, 256), budget=1, db=tmp_path, worker=Worker(),
               build_fn=lambda pt, out_dir: str(tmp_path / "a.json"), configs=_configs(1))
    assert seen and not any("paired" in kw for kw in seen)
