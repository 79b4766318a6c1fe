"""CPU kernels timed in rounds alternating with the vendor GEMM (``measure.time_paired``), the
ratio logged and reported.  Fast: fake clocks and callables, a stubbed measuring process."""
import pytest

from lcmac.artifact import tuning_log as tdb
from lcmac.tune import tuner
from lcmac.policy.measured import decide_by_measurement
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
    rounds = order[4:]                  # after the warm-up pair and the two sizing calls
    # the order flips every round; each side called once untimed after its pause (threads
    # parked by the pause wake in it), then timed
    assert rounds == ["k", "k", "v", "v", "v", "v", "k", "k"] * 2
    # calls of WARM_BELOW_S and more are timed cold: a warm call would double their rounds
    order.clear()
    slow = measure.time_paired(call("k", 0.3), call("v", 2e-3), warmup=1, repeats=2, min_run_s=0)
    assert slow["time_s"] == pytest.approx(0.3)
    assert order[4:] == ["k", "v", "v", "v", "v", "k"]


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


def test_the_best_paired_kernel_is_confirmed_over_more_rounds(tmp_path):
    seen = []
    ratio = {1: 1.02, 2: 1.10}          # by config: the second looks best in its rounds

    class Worker:
        def measure(self, path, target, dtype, shape, **kw):
            seen.append((path, kw))
            r = ratio[int(path[-6])]
            return {"status": "ok", "time_s": 1e-3, "spread": 0.01, "vendor_paired_s": r * 1e-3}

        def measure_vendor(self, target, dtype, shape, **kw):
            return {"status": "ok", "time_s": 1e-3, "spread": 0.01, "config": {"library": "numpy"}}

        def close(self, kill=False):
            pass
    paths = iter([str(tmp_path / f"a{i}.json") for i in (1, 2)] * 3)
    tuner.tune("gemm", CPU, "float32", (512, 512, 512), budget=2, patience=9, db=tmp_path,
               worker=Worker(), build_fn=lambda pt, out_dir: next(paths), vendor=True,
               configs=_configs(2), repeats=4)
    last_path, last_kw = seen[-1]
    assert last_path.endswith("a2.json") and last_kw["repeats"] == 12 and last_kw["paired"] is True
    recs = [r for r in tdb.TuningDB(tmp_path).records(CPU, "float32") if r.get("confirm")]
    assert len(recs) == 1 and recs[0]["vendor_paired_s"] == pytest.approx(1.1e-3)


def test_the_decision_compares_the_vendor_by_the_confirmed_ratio(tmp_path):
    store = tdb.TuningDB(tmp_path)
    vcfg = {"library": "openblas", "api": "numpy.matmul"}
    # Strassen's best record (95 ms) is below the lone vendor time (100 ms), but confirmed
    # beside the vendor it ran at 0.98x: a loss, so the vendor
    shape = (2048, 2048, 2048)
    store.append([rec(shape=shape, algo="vendor", t=0.100, cfg=vcfg), rec(shape=shape, t=0.105),
                  rec(shape=shape, algo="strassen", t=0.095),
                  rec(shape=shape, algo="strassen", t=0.110, vendor_paired_s=0.1078, confirm=True)])
    d = decide_by_measurement(*shape, "float32", CPU, db=tmp_path)
    assert d.is_vendor and d.measurements["vendor"] == pytest.approx(0.095 * 0.98)
    # the vendor timed alone in a fast minute (90 ms), the kernel confirmed 1.10x ahead of it
    shape2 = (4096, 4096, 4096)
    store.append([rec(shape=shape2, algo="vendor", t=0.090, cfg=vcfg), rec(shape=shape2, t=0.120),
                  rec(shape=shape2, algo="strassen^2", t=0.095),
                  rec(shape=shape2, algo="strassen^2", t=0.100, vendor_paired_s=0.110, confirm=True)])
    d2 = decide_by_measurement(*shape2, "float32", CPU, db=tmp_path)
    assert d2.algorithm == "strassen^2" and not d2.is_vendor
    # without a confirmation the lone times decide, as before
    shape3 = (1024, 1024, 1024)
    store.append([rec(shape=shape3, algo="vendor", t=0.010, cfg=vcfg), rec(shape=shape3, t=0.012),
                  rec(shape=shape3, algo="strassen", t=0.0095)])
    assert decide_by_measurement(*shape3, "float32", CPU, db=tmp_path).algorithm == "strassen"


def test_a_decision_reads_the_log_once(tmp_path):
    """gather, the confirmed ratio and the failed algorithms share one read of the log."""
    store = tdb.TuningDB(tmp_path)
    shape = (2048, 2048, 2048)
    store.append([rec(shape=shape, algo="vendor", t=0.100, cfg={"library": "openblas", "api": "numpy.matmul"}),
                  rec(shape=shape, t=0.105), rec(shape=shape, algo="strassen", t=0.095)])
    reads = []

    class Counting(tdb.TuningDB):
        def records(self, *a, **kw):
            reads.append((a, kw))
            return super().records(*a, **kw)
    d = decide_by_measurement(*shape, "float32", CPU, db=Counting(tmp_path))
    assert d.algorithm == "strassen" and len(reads) == 1, reads
