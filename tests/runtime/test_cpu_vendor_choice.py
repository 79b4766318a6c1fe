"""The CPU's vendor GEMM (lcmac.runtime.cpu_vendor): numpy.matmul or torch.matmul, chosen by a
paired measurement kept per device, dtype and size class; the tuner's vendor records name the
one timed; numpy arrays multiplied through torch.from_numpy views; without torch, numpy.
Fast: tiny products, a fake measurer where the choice itself is not what is tested."""
import io
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from lcmac.artifact import tuning_log as tdb
from lcmac.policy.measured import decide_by_measurement
from lcmac.runtime import cpu_vendor
from lcmac.runtime.vendor import vendor_matmul
from lcmac.spec.device import DeviceIdentity
from lcmac.tune import measure, tuner

torch = pytest.importorskip("torch")

CPU = "x86_64-avx512"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    """A cache directory of the test's own (a kept choice of torch must not reach other
    tests' numpy calls), no pin, nothing remembered."""
    monkeypatch.setenv("LCMAC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(cpu_vendor.ENV, raising=False)
    cpu_vendor.forget()
    yield tmp_path / "cache"
    cpu_vendor.forget()


def faking(chosen_api, calls=None, torch_threads=None):
    """A measurer that chooses ``chosen_api`` without timing anything (``calls`` counts it);
    ``torch_threads``: the count torch is said to have been measured with."""
    def measurer(dtype, side):
        if calls is not None:
            calls.append((dtype, side))
        gemms = {g.api: g.config() for g in cpu_vendor.gemms(dtype)}
        if torch_threads is not None:
            gemms[cpu_vendor.TORCH]["threads"] = torch_threads
        return {"chosen": chosen_api, "gemms": gemms, "why": "fake"}
    return measurer


def counting_torch_matmul(monkeypatch):
    seen = []
    real = torch.matmul

    def mm(*a, **kw):
        seen.append(a[0].shape)
        return real(*a, **kw)
    monkeypatch.setattr(torch, "matmul", mm)
    return seen


def test_size_classes():
    assert cpu_vendor.size_class(3, 4, 5) is None                 # under SMALL_SIDE³: numpy
    assert cpu_vendor.size_class(100, 100, 100) == 128
    assert cpu_vendor.size_class(4096, 4096, 4096) == 2048        # the largest class
    assert cpu_vendor.size_class(8192, 64, 512) == 512            # by the work, not a side


def test_the_choice_is_measured_once_kept_on_disk_and_per_device(own_cache, monkeypatch):
    calls = []
    g = cpu_vendor.chosen("float32", 256, 256, 256, measurer=faking(cpu_vendor.TORCH, calls))
    assert g.api == cpu_vendor.TORCH and calls == [("float32", 256)]
    # the same class again, and after forgetting (a new process): read, not measured
    assert cpu_vendor.chosen("float32", 300, 200, 250, measurer=faking(cpu_vendor.NUMPY, calls)).api \
        == cpu_vendor.TORCH
    cpu_vendor.forget()
    assert cpu_vendor.chosen("float32", 256, 256, 256).api == cpu_vendor.TORCH and len(calls) == 1
    assert list((own_cache / "cpu_vendor").glob("choice-*/choice.json"))
    # another class, another dtype: not measured yet, so numpy (no measurer: nothing measured)
    assert cpu_vendor.chosen("float32", 1024, 1024, 1024).api == cpu_vendor.NUMPY
    assert cpu_vendor.chosen("float64", 256, 256, 256).api == cpu_vendor.NUMPY
    # another device: its own choice
    cpu_vendor.forget()
    other = DeviceIdentity("Other CPU (2 cpus)", "cpu", {"cores": 2})
    monkeypatch.setattr(cpu_vendor, "cpu_identity", lambda: other)
    assert cpu_vendor.chosen("float32", 256, 256, 256).api == cpu_vendor.NUMPY
    assert len(calls) == 1


def test_a_choice_measured_with_other_thread_counts_does_not_hold():
    now = torch.get_num_threads()
    g = cpu_vendor.chosen("float32", 256, 256, 256,
                          measurer=faking(cpu_vendor.TORCH, torch_threads=now + 1))
    assert g.api == cpu_vendor.NUMPY


def test_a_real_measurement_names_both_libraries_and_is_paired():
    doc = measure.measure_cpu_vendors("float32", 64, rounds=3, min_run_s=0.0, pause=0.0)
    assert set(doc["gemms"]) == {cpu_vendor.NUMPY, cpu_vendor.TORCH}
    assert doc["chosen"] in doc["gemms"] and doc["gemms"][cpu_vendor.TORCH]["library"] != "?"
    m = doc["measured"]
    assert len(m[cpu_vendor.NUMPY]["times"]) == len(m[cpu_vendor.TORCH]["times"]) == 3
    r = m["paired_ratio"]
    assert r["min"] <= r["median"] <= r["max"]
    assert (doc["chosen"] == cpu_vendor.TORCH) == (r["median"] > 1 + measure.CHOICE_MARGIN)


@pytest.mark.parametrize("api", [cpu_vendor.NUMPY, cpu_vendor.TORCH])
def test_the_tuners_vendor_record_names_the_chosen_api(api):
    cpu_vendor.chosen("float32", 96, 64, 80, measurer=faking(api))
    out = measure.measure_vendor(CPU, "float32", (96, 64, 80), repeats=2, warmup=1, min_run_s=0.0)
    assert out["status"] == "ok"
    want = next(g for g in cpu_vendor.gemms("float32") if g.api == api)
    assert out["config"] == want.config()
    assert out["config"]["library"] == want.library


def test_the_bfloat16_vendor_is_torch():
    out = measure.measure_vendor(CPU, "bfloat16", (64, 64, 64), repeats=2, warmup=1, min_run_s=0.0)
    assert out["status"] == "ok", out
    assert out["config"]["api"] == cpu_vendor.TORCH


def test_paired_kernels_record_the_vendor_api_and_old_apis_are_reported(tmp_path):
    store = tdb.TuningDB(tmp_path)
    shape = (512, 512, 512)
    old = tdb.make_record(target=CPU, dtype="float32", algorithm="vendor", algorithm_hash="vendor",
                          shape=shape, config={"library": "scipy-openblas", "api": cpu_vendor.NUMPY},
                          time_s=2e-3, repeats=5)
    store.append(old)

    class Worker:                       # the measuring process, stubbed
        def measure(self, path, target, dtype, shape, **kw):
            return {"status": "ok", "time_s": 1e-3, "spread": 0.01, "vendor_paired_s": 1.1e-3,
                    "vendor_api": cpu_vendor.TORCH}

        def measure_vendor(self, target, dtype, shape, **kw):
            return {"status": "ok", "time_s": 1.5e-3, "spread": 0.01,
                    "config": {"library": "mkl", "api": cpu_vendor.TORCH}}

        def close(self, kill=False):
            pass
    bar = io.StringIO()
    tuner.tune("gemm", CPU, "float32", shape, budget=1, db=tmp_path, worker=Worker(), vendor=True,
               build_fn=lambda pt, out_dir: str(tmp_path / "a.json"),
               configs=[{"mr": 8, "nr": 32, "kc": 128, "mc": 64, "nc": 256}], progress=bar)
    recs = store.records(CPU, "float32")
    assert {r["config"]["api"] for r in recs if r["algorithm"] == "vendor"} == {cpu_vendor.NUMPY,
                                                                                cpu_vendor.TORCH}
    assert all(r["vendor_api"] == cpu_vendor.TORCH for r in recs if r["algorithm"] == "gemm")
    assert "vendor torch.matmul (mkl)" in bar.getvalue()
    assert "also holds numpy.matmul records" in bar.getvalue()



def test_old_records_of_the_other_api_still_read_the_faster_known_decides(tmp_path):
    store = tdb.TuningDB(tmp_path)
    shape = (512, 512, 512)

    def rec(algo, t, cfg):
        return tdb.make_record(target=CPU, dtype="float32", algorithm=algo, algorithm_hash=algo,
                               shape=shape, config=cfg, time_s=t, repeats=5)
    store.append([rec("vendor", 2e-3, {"library": "scipy-openblas", "api": cpu_vendor.NUMPY}),
                  rec("vendor", 1.5e-3, {"library": "mkl", "api": cpu_vendor.TORCH}),
                  rec("gemm", 3e-3, {"mr": 8, "nr": 32})])
    d = decide_by_measurement(*shape, "float32", CPU, db=tmp_path)
    assert d.is_vendor and d.measurements["vendor"] == pytest.approx(1.5e-3)


def test_numpy_arrays_through_torch_match_numpy_and_honour_out(monkeypatch):
    monkeypatch.setenv(cpu_vendor.ENV, "torch")
    seen = counting_torch_matmul(monkeypatch)
    rng = np.random.default_rng(0)
    for dtype, tol in ((np.float32, 1e-5), (np.float64, 1e-12)):
        A = rng.standard_normal((130, 70)).astype(dtype)
        B = rng.standard_normal((70, 90)).astype(dtype)
        ref = A @ B
        C = vendor_matmul(A, B)
        assert type(C) is np.ndarray and C.dtype == dtype
        assert np.linalg.norm(C - ref) <= tol * np.linalg.norm(ref)
        out = np.full((130, 90), np.nan, dtype)
        assert vendor_matmul(A, B, out=out) is out
        assert np.linalg.norm(out - ref) <= tol * np.linalg.norm(ref)
        A3 = rng.standard_normal((2, 65, 70)).astype(dtype)      # leading dimensions
        assert np.allclose(vendor_matmul(A3, B), A3 @ B, rtol=tol, atol=tol * 70)
    assert len(seen) == 6
    # operands torch cannot view as they are run on numpy, right all the same
    A = rng.standard_normal((130, 70)).astype(np.float32)
    B = rng.standard_normal((70, 90)).astype(np.float32)
    ro = B.copy()
    ro.flags.writeable = False
    seen.clear()
    for a, b in ((A[::-1], B), (A, ro), (A.astype(">f4"), B.astype(">f4"))):
        assert np.allclose(vendor_matmul(a, b), np.asarray(a) @ np.asarray(b), rtol=1e-5, atol=1e-4)
    out_strided = np.zeros((130, 180), np.float32)[:, ::2]
    vendor_matmul(A, B, out=out_strided)
    assert np.allclose(out_strided, A @ B, rtol=1e-5, atol=1e-4)
    assert seen == []


def test_lcmac_matmul_runs_the_kept_choice_when_the_plan_is_the_vendor(monkeypatch):
    import lcmac
    cpu_vendor.chosen("float32", 200, 150, 100, measurer=faking(cpu_vendor.TORCH))
    seen = counting_torch_matmul(monkeypatch)
    rng = np.random.default_rng(1)
    A = rng.standard_normal((200, 100)).astype(np.float32)
    B = rng.standard_normal((100, 150)).astype(np.float32)
    out = np.empty((200, 150), np.float32)
    assert lcmac.matmul(A, B, algo="vendor", out=out) is out
    assert np.allclose(out, A @ B, rtol=1e-5, atol=1e-4) and len(seen) == 1
    cpu_vendor.forget()
    monkeypatch.setenv(cpu_vendor.ENV, "numpy")                    # the pin wins
    lcmac.matmul(A, B, algo="vendor", out=out)
    assert len(seen) == 1


def test_without_torch_numpy_runs(own_cache):
    """torch kept as the choice on disk, then a process where torch does not import."""
    cpu_vendor.chosen("float32", 256, 256, 256, measurer=faking(cpu_vendor.TORCH))
    code = """
import sys
sys.modules["torch"] = None
import json, numpy as np
import lcmac
from lcmac.runtime import cpu_vendor
from lcmac.tune import measure
A = np.ones((256, 256), np.float32)
C = lcmac.matmul(A, A, algo="vendor")
doc = measure.measure_cpu_vendors("float32", 64)
print(json.dumps({"api": cpu_vendor.chosen("float32", 256, 256, 256).api,
                  "gemms": [g.api for g in cpu_vendor.gemms("float32")], "ok": bool((C == 256).all()),
                  "chosen": doc["chosen"], "bf16": cpu_vendor.chosen("bfloat16", 64, 64, 64)}))
"""
    env = {**os.environ, "LCMAC_CACHE_DIR": str(own_cache), "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got == {"api": cpu_vendor.NUMPY, "gemms": [cpu_vendor.NUMPY], "ok": True,
                   "chosen": cpu_vendor.NUMPY, "bf16": None}


def _bench_cpu():
    import importlib.util
    spec = importlib.util.spec_from_file_location("bench_cpu", ROOT / "scripts" / "bench_cpu.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_bench_cpu_times_both_baselines_and_rotates_the_first(monkeypatch):
    bench = _bench_cpu()
    runs, errs = bench.time_against_numpy((64, 48, 32), "float32", [], rounds=2, pause=0.0)
    assert set(runs) == set(errs) == {"numpy", "torch.matmul"}
    assert max(errs.values()) < 1e-5
    best = bench.fastest_baseline(runs)
    assert best == min(runs, key=lambda n: statistics.median(runs[n]))
    rows = bench.baseline_rows(runs, "float32")
    assert rows["torch.matmul"]["api"] == cpu_vendor.TORCH and rows["numpy"]["library"]
    assert rows[best]["ratio_vs_fastest"] == 1.0
    order = []
    monkeypatch.setattr(bench.time, "sleep", lambda s: None)
    calls = [(n, (lambda n=n: order.append(n))) for n in ("a", "b", "c")]
    bench.interleaved(calls, rounds=3, pause=0.0, rotate=True)
    firsts = [order[i] for i in range(0, len(order), 6)]          # 2 calls per variant a round
    assert firsts == ["a", "b", "c"]


def _records_where_torch_leads(store, shape, confirm_api=None):
    """numpy.matmul 2 ms, torch.matmul 1.5 ms, lcmac's GEMM 1.8 ms at ``shape``: lcmac's GEMM
    beats the numpy record only; with ``confirm_api``, a confirmation of the GEMM timed beside
    that vendor (vendor 0.9x the GEMM's time)."""
    def rec(algo, t, cfg, **extra):
        return tdb.make_record(target=CPU, dtype="float32", algorithm=algo, algorithm_hash=algo,
                               shape=shape, config=cfg, time_s=t, repeats=5, **extra)
    recs = [rec("vendor", 2e-3, {"library": "scipy-openblas", "api": cpu_vendor.NUMPY}),
            rec("vendor", 1.5e-3, {"library": "mkl", "api": cpu_vendor.TORCH}),
            rec("gemm", 1.8e-3, {"mr": 8, "nr": 32})]
    if confirm_api:
        recs.append(rec("gemm", 1.8e-3, {"mr": 8, "nr": 32}, confirm=True, vendor_paired_s=1.62e-3,
                        vendor_api=confirm_api))
    store.append(recs)


@pytest.mark.parametrize("confirm_api", [None, cpu_vendor.TORCH, cpu_vendor.NUMPY])
def test_a_vendor_decision_names_the_vendor_gemm_its_records_timed(tmp_path, confirm_api):
    shape = (320, 448, 192)
    _records_where_torch_leads(tdb.TuningDB(tmp_path / "logs"), shape, confirm_api)
    d = decide_by_measurement(*shape, "float32", CPU, db=tmp_path / "logs")
    assert d.is_vendor and d.vendor_api == (confirm_api or cpu_vendor.TORCH)
    assert d.to_dict()["vendor_api"] == d.vendor_api
    # a decision for lcmac's kernels names the vendor it was measured against (pieces the
    # planner gives to the vendor run that one); one with no vendor record names none
    store = tdb.TuningDB(tmp_path / "other")
    store.append([tdb.make_record(target=CPU, dtype="float32", algorithm=a, algorithm_hash=a, shape=shape,
                                  config=c, time_s=t, repeats=5)
                  for a, t, c in (("vendor", 2e-3, {"api": cpu_vendor.NUMPY}), ("gemm", 1e-3, {"mr": 8}))])
    d = decide_by_measurement(*shape, "float32", CPU, db=tmp_path / "other")
    assert d.runs == "gemm" and d.vendor_api == cpu_vendor.NUMPY
    assert decide_by_measurement(*shape, "float32", CPU, db=tmp_path / "none").vendor_api is None


def test_lcmac_matmul_runs_the_vendor_gemm_the_records_name_where_nothing_is_kept(own_cache, monkeypatch):
    import lcmac
    from lcmac.spec.targets import get_target
    if get_target("host").name != CPU:
        pytest.skip("the records are this target's")
    shape = (320, 448, 192)                          # M, N, K
    _records_where_torch_leads(tdb.TuningDB(own_cache / "tuning_logs"), shape)
    seen = counting_torch_matmul(monkeypatch)
    rng = np.random.default_rng(2)
    A = rng.standard_normal((320, 192)).astype(np.float32)
    B = rng.standard_normal((192, 448)).astype(np.float32)
    p = lcmac.ops.plan(*shape, "float32")
    assert p.runs == "vendor" and p.vendor_api == cpu_vendor.TORCH, p.why
    C = lcmac.matmul(A, B)
    assert np.allclose(C, A @ B, rtol=1e-4, atol=1e-3) and len(seen) == 1
    lcmac.matmul(A, B)                               # the kept call: the same vendor
    assert len(seen) == 2
    out = np.empty((320, 448), np.float32)
    lcmac.matmul(A, B, out=out)
    assert len(seen) == 3 and np.allclose(out, C)
    # a choice measured in this cache wins over the records' word
    cpu_vendor.chosen("float32", *shape, measurer=faking(cpu_vendor.NUMPY))
    cpu_vendor.forget()
    lcmac.matmul(A, B)
    assert len(seen) == 3
