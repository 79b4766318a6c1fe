"""Decisions on the device at hand: records carry a device identity, a decision reads only the
records of the device it decides for, a device without records is priced by a profile fitted
to it (measured once, kept per identity), and ``lcmac calibrate`` measures the device so that
its own records decide.  CPU only and fast: fake measurements stand in for kernels and the
profile's microbenchmarks (one tiny real measurement)."""
import json
import math

import pytest

from lcmac.artifact import tuning_log as tdb
from lcmac.cli import calibrate as cli_calibrate
from lcmac.cli.main import main
from lcmac.costmodel import gemm_estimate
from lcmac.policy import plan
from lcmac.policy import planner
from lcmac.policy.measured import decide_by_measurement
from lcmac.spec import device as spec_device
from lcmac.spec.device import DeviceIdentity
from lcmac.tune import device_profile, sweep

TARGET = "x86_64-avx512"
SHAPE = (2048, 2048, 2048)
ME = DeviceIdentity("Test CPU (2 cpus)", "cpu",
                    {"cores": 2, "machine": "x86_64", "isa": "avx512f fma"})
OTHER = "Other CPU (64 cpus)"
#: a small config list for the tuner (its own space takes seconds to enumerate and rank)
CONFIGS = [{"mr": 8, "nr": 32, "kc": 128, "mc": 64, "nc": 256}]


def rec(algo, t, device=OTHER, shape=SHAPE, **kw):
    name, h = tdb.algo_identity(algo)
    cfg = {"library": "openblas"} if algo == "vendor" else {"mr": 8, "nr": 32}
    return tdb.make_record(target=TARGET, dtype="float32", algorithm=name, algorithm_hash=h,
                           shape=shape, config=cfg, time_s=t, spread=0.01, repeats=5,
                           device=device, **kw)


@pytest.fixture
def here(monkeypatch, tmp_path):
    """ME is this machine's CPU and the device at hand; the only tuning log is tmp_path/logs
    (nothing shipped); profiles are fitted and plans made afresh."""
    monkeypatch.delenv("LCMAC_DEVICE", raising=False)
    monkeypatch.setattr(spec_device, "cpu_identity", lambda: ME)
    monkeypatch.setattr(spec_device, "device_here", lambda target: ME)
    monkeypatch.setattr(sweep, "device_here", lambda target: ME)
    monkeypatch.setenv("LCMAC_TUNING_LOGS", str(tmp_path / "logs"))
    monkeypatch.setenv("LCMAC_CACHE_DIR", str(tmp_path / "cache"))     # its fitted profiles
    monkeypatch.setattr(planner, "_plans", {})
    monkeypatch.setattr(device_profile, "_memo", {})
    monkeypatch.setattr(device_profile, "_failed", {})
    return tmp_path / "logs"


def fast_gemm_slow_memory(calls):
    """A device measurement whose fit makes combines (memory) costly and GEMMs fast: no LCMA
    can win there."""
    def measure(target, dtype, sizes):
        calls.append(sizes)
        return {"gemm_s": {"512": 2 * 512 ** 3 / 2e11, "2048": 2 * 2048 ** 3 / 4e11},
                "copy_bytes_per_s": 2e9, "add_bytes_per_s": 1e9}
    return measure


# ---- identities -----------------------------------------------------------------------------
def test_a_record_counts_for_the_device_it_names_by_the_details_both_know(here):
    new = rec("gemm", 0.01, device=ME.name)
    assert new["device_id"] == ME.to_dict()            # measured here: the identity is kept
    assert "device_id" not in rec("gemm", 0.01)        # another device named: the name alone
    old = {k: v for k, v in new.items() if k != "device_id"}
    other_isa = DeviceIdentity(ME.name, "cpu", {**ME.details, "isa": "avx2 fma"})
    no_isa = DeviceIdentity(ME.name, "cpu", {"cores": 2})
    assert ME.measured_on(new) and ME.measured_on(old)          # an older record: its name
    assert not other_isa.measured_on(new) and other_isa.measured_on(old)
    assert no_isa.measured_on(new)                     # a detail one side lacks is not compared
    assert not ME.measured_on(rec("gemm", 0.01))
    assert ME.fingerprint != other_isa.fingerprint and ME.fingerprint == DeviceIdentity.from_dict(
        ME.to_dict()).fingerprint


def test_lcmac_device_pins_the_device_or_reads_every_device(monkeypatch):
    monkeypatch.setenv("LCMAC_DEVICE", "any")
    assert spec_device.device_at_hand(TARGET) is None
    monkeypatch.setenv("LCMAC_DEVICE", "NVIDIA H200")
    pinned = spec_device.device_at_hand("cuda-sm90a")
    assert pinned.name == "NVIDIA H200" and pinned.kind == "cuda" and not pinned.details
    assert spec_device.device_at_hand("no-such-profile") is not None   # pinned: as named
    monkeypatch.delenv("LCMAC_DEVICE")
    assert spec_device.device_at_hand("h100") is None    # a profile name is no device


def test_a_gpu_is_identified_from_torchs_properties_and_runs_its_own_arch(monkeypatch):
    torch = pytest.importorskip("torch")

    class H200:
        name, major, minor, multi_processor_count = "NVIDIA H200", 9, 0, 132
        total_memory, memory_bus_width = 141 * 2 ** 30, 6144
        clock_rate, memory_clock_rate = 1980000, 3201000          # kHz
        uuid = "not-a-uuid"                       # NVML is not asked without one
    monkeypatch.setattr(spec_device, "_cuda_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: H200)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    spec_device._cuda_identity.cache_clear()
    try:
        gpu = spec_device.cuda_identity()
        assert gpu.name == "NVIDIA H200" and gpu.kind == "cuda"
        assert dict(gpu.details) == {"sms": 132, "capability": "9.0", "memory_gib": 141,
                                     "sm_clock_mhz": 1980, "memory_clock_mhz": 3201,
                                     "memory_bus_bits": 6144}
        assert spec_device.device_here("cuda-sm90a") == gpu
        assert spec_device.device_here("cuda-sm80") is None      # another major: not this GPU
    finally:
        spec_device._cuda_identity.cache_clear()


# ---- the decision ---------------------------------------------------------------------------
def test_another_devices_records_do_not_decide_and_a_fitted_profile_prices(here, monkeypatch):
    tdb.TuningDB(here).append([rec("winograd^2", 0.02), rec("gemm", 0.06), rec("vendor", 0.05)])
    assert decide_by_measurement(*SHAPE, "float32", TARGET, device=None).decision == "winograd^2"
    calls = []
    monkeypatch.setattr(device_profile, "measure_device", fast_gemm_slow_memory(calls))
    p = plan(*SHAPE, "float32", TARGET)
    assert p.decision == "vendor" and p.source == "model" and len(calls) == 1
    assert "a fitted profile prices" in p.why and OTHER in p.why and "not used" in p.why
    vendor = p.candidates[0]
    assert not vendor.measured and "priced" in vendor.reason
    fit = device_profile.fitted_profile(ME, TARGET, "float32", measure=False)
    assert vendor.predicted_time_s == pytest.approx(
        gemm_estimate(*SHAPE, "float32", fit.profile).time_s)
    # kept on disk for this identity: another process (a fresh memo) measures nothing
    monkeypatch.setattr(device_profile, "_memo", {})
    monkeypatch.setattr(planner, "_plans", {})
    assert "a fitted profile prices" in plan(*SHAPE, "float32", TARGET).why and len(calls) == 1


def test_calibrating_the_device_makes_its_own_records_decide(here, monkeypatch):
    tdb.TuningDB(here).append([rec("winograd^2", 0.02), rec("gemm", 0.06), rec("vendor", 0.05)])
    monkeypatch.setattr(device_profile, "measure_device", fast_gemm_slow_memory([]))
    before = plan(*SHAPE, "float32", TARGET)
    assert before.decision == "vendor" and "fitted profile" in before.why
    times = {"vendor": 0.05, "gemm": 0.06}                  # any LCMA: 0.03, the fastest here

    def measure_for(shape):
        return lambda pt: times.get(pt.algorithm, 0.03)
    done = sweep.calibrate_device(TARGET, "float32", [SHAPE], top_lcmas=1, db=None,
                                  measure_for=measure_for, configs=CONFIGS)
    recs = list(tdb.TuningDB(here).records(TARGET, "float32", device=ME))
    assert done.device == ME and recs and all(r["device_id"] == ME.to_dict() for r in recs)
    lcma = next(r["algorithm"] for r in recs if r["algorithm"] not in ("gemm", "vendor"))
    after = plan(*SHAPE, "float32", TARGET)        # no reset: the grown log is read again
    assert after.decision == lcma != "winograd^2" and after.source == "exact"
    assert "records of this device only" in after.why and "fitted" not in after.why


def test_the_time_budget_stops_starting_shapes(here):
    shapes = [(256, 256, 256), (512, 512, 512)]
    done = sweep.calibrate_device(TARGET, "float32", shapes, budget_s=1e-6, top_lcmas=0,
                                  measure_for=lambda s: (lambda pt: 0.01), configs=CONFIGS)
    assert len(done.results) <= 1 and done.skipped[-1] == shapes[-1]
    assert len(done.results) + len(done.skipped) == 2
    with pytest.raises(ValueError, match="budget_s"):
        sweep.calibrate_device(TARGET, "float32", shapes, budget_s=0, measure_for=lambda s: None)


def test_the_next_shape_is_foreseen_by_its_work_on_a_cpu_and_its_compiles_on_a_gpu():
    # 80 s at 4096³ (compiles, mostly, on a GPU): 8192³ has 8x the work
    last = ((4096, 4096, 4096), 80.0)
    assert sweep._foreseen("cpu", last, (8192, 8192, 8192)) == pytest.approx(640.0)
    assert sweep._foreseen("cuda", last, (8192, 8192, 8192)) == pytest.approx(80.0)


def test_no_device_here_cannot_be_calibrated(monkeypatch):
    monkeypatch.setattr(sweep, "device_here", lambda target: None)
    with pytest.raises(Exception, match="no device here runs cuda-sm90a"):
        sweep.calibrate_device("cuda-sm90a", "bfloat16")


# ---- the fitted profile ---------------------------------------------------------------------
def test_a_tiny_real_measurement_fits_a_profile_kept_per_identity(here, monkeypatch):
    measured = []
    real = device_profile.measure_device
    monkeypatch.setattr(device_profile, "measure_device",
                        lambda *a: measured.append(a) or real(*a))
    fit = device_profile.fitted_profile(ME, TARGET, "float32", sizes=device_profile.TINY)
    assert set(fit.measured["gemm_s"]) == {str(n) for n in device_profile.TINY.gemm}
    assert fit.profile.mem_bw == pytest.approx(fit.measured["copy_bytes_per_s"])
    assert 0 < fit.profile.bandwidth_efficiency <= 1 and math.isfinite(fit.profile.shape_half)
    monkeypatch.setattr(device_profile, "_memo", {})
    again = device_profile.fitted_profile(ME, TARGET, "float32", sizes=device_profile.TINY)
    assert again.values == fit.values and len(measured) == 1      # read back, not measured
    other = DeviceIdentity(ME.name, "cpu", {**ME.details, "cores": 64})
    assert device_profile.fitted_profile(other, TARGET, "float32", measure=False,
                                         sizes=device_profile.TINY) is None
    monkeypatch.setenv("LCMAC_CACHE_DIR", "off")
    assert device_profile.fitted_profile(other, TARGET, "float32",
                                         sizes=device_profile.TINY) is None


def test_the_fit_takes_the_measured_gemm_times_and_scales_with_the_device():
    def fit(rate_small, rate_big, cores=2, bw=20e9):
        measured = {"gemm_s": {"512": 2 * 512 ** 3 / rate_small, "2048": 2 * 2048 ** 3 / rate_big},
                    "copy_bytes_per_s": bw, "add_bytes_per_s": 0.4 * bw}
        me = DeviceIdentity(ME.name, "cpu", {**ME.details, "cores": cores})
        return device_profile.fit_profile(TARGET, "float32", me, measured), measured
    f, m = fit(60e9, 90e9)
    for n in (512, 2048):                                  # both GEMMs as measured
        assert gemm_estimate(n, n, n, "float32", f.profile).time_s == pytest.approx(
            m["gemm_s"][str(n)], rel=1e-4)
    assert f.profile.bandwidth_efficiency == pytest.approx(0.4)
    big, _ = fit(60e9 * 30, 90e9 * 30, cores=64, bw=300e9)   # a bigger machine, same ISA
    assert big.profile.units == 64
    assert big.profile.peak_mul("float32") == pytest.approx(30 * f.profile.peak_mul("float32"),
                                                            rel=0.05)


def test_a_failed_measurement_leaves_the_datasheet_profile_and_says_why(here, monkeypatch):
    tries = []

    def broken(target, dtype, sizes):
        tries.append(sizes)
        raise RuntimeError("no BLAS today")
    monkeypatch.setattr(device_profile, "measure_device", broken)
    for shape in (SHAPE, (1024, 1024, 1024)):
        p = decide_by_measurement(*shape, "float32", TARGET)
        assert p.source == "model" and "no BLAS today" in p.why and "datasheet profile" in p.why
    assert len(tries) == 1                     # not tried again by every decision


# ---- lcmac calibrate ------------------------------------------------------------------------
def test_cli_calibrate_dry_run_reports_the_device_and_the_decisions(here, monkeypatch, capsys):
    real = cli_calibrate.calibrate_device
    monkeypatch.setattr(cli_calibrate, "calibrate_device",
                        lambda *a, **kw: real(*a, configs=CONFIGS, **kw))
    logs = here.parent / "dry"
    code = main(["calibrate", "--target", TARGET, "--dry-run", "--shape", "512x512x512",
                 "--top-lcmas", "1", "--logs", str(logs), "--json", "-q"])
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert code == 0 and doc["schema"] == "lcmac-calibrate/1" and doc["ok"]
    assert doc["device"] == ME.to_dict() and doc["fingerprint"] == ME.fingerprint
    assert [d["shape"] for d in doc["decisions"]] == [[512, 512, 512]]
    assert doc["decisions"][0]["source"] == "exact" and "calibrating 512x512x512" in err
    assert main(["calibrate", "--budget-s", "0", "--dry-run"]) == 2
