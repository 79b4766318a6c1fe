"""scripts/bench_cpu.py: the per-round paired ratio, and an ``--artifacts`` run end to end on
a small artifact (the printed table and the JSON it writes)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from lcmac.spec.cpu.x86 import host_supports

from .targets.test_arm import _bench_cpu as _bench

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench_cpu.py"


def test_paired_ratio_cancels_a_drift():
    """numpy slows from 1 s to 2 s over the run while the variant stays 0.9 of numpy's time in
    every round: the paired ratio is 1/0.9 exactly; the ratio of medians is not."""
    base = [1.0, 1.0, 2.0, 2.0, 2.0]
    variant = [0.9 * b for b in reversed(base)]      # its slow rounds are numpy's fast ones
    p = _bench().paired(base, [0.9 * b for b in base])
    assert p == pytest.approx({"median": 1 / 0.9, "min": 1 / 0.9, "max": 1 / 0.9})
    skewed = _bench().paired(base, variant)
    assert skewed["min"] == pytest.approx(1 / 1.8) and skewed["max"] == pytest.approx(2 / 0.9)


@pytest.mark.skipif(not host_supports("x86_64-avx2"), reason="needs an AVX2 x86-64 host")
def test_artifacts_run_reports_the_paired_ratio(tmp_path):
    from lcmac.artifact.build import build
    p = build("gemm", "x86_64-avx2", "float32", (96, 64, 64), out_dir=tmp_path, name="g")
    out = tmp_path / "r.json"
    r = subprocess.run([sys.executable, str(SCRIPT), "--artifacts", str(p), "--rounds", "3",
                        "--pause", "0", "--prepared-b", "--out", str(out)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "paired" in r.stdout
    variants = json.loads(out.read_text())["results"][0]["variants"]
    assert set(variants) == {"numpy", "g", "g+prepB"}       # B prepared once, as for a weight
    for v in (variants["g"], variants["g+prepB"]):
        assert set(v["ratio_paired"]) == {"median", "min", "max"}
        assert v["ratio_paired"]["min"] <= v["ratio_paired"]["median"] <= v["ratio_paired"]["max"]
        assert v["rel_error"] < 1e-5


def test_artifacts_of_one_name_are_told_apart(tmp_path):
    """The same build made two ways (a/x.json, b/x.json) is reported twice, by folder, not
    collapsed into one row."""
    paths = [tmp_path / "a" / "x.json", tmp_path / "b" / "x.json", tmp_path / "b" / "y.json"]
    assert _bench()._labels(paths) == ["a/x", "b/x", "b/y"]
    assert _bench()._labels(paths[:1]) == ["x"]


def test_products_reference_is_the_lcmas_block_products():
    """--products times numpy on R stacked block products per distinct (R, block): Strassen and
    Winograd share one (7 products of 32×24×16 at 64×48×32), Strassen² has 49 of 16×12×8; the
    plain GEMM has none.  Each call really multiplies its blocks."""
    import numpy as np
    calls = dict(_bench().products_calls(["gemm", "strassen", "winograd", "strassen^2"], (64, 48, 32)))
    assert list(calls) == ["numpy-7x32x24x16", "numpy-49x16x12x8"]
    run = calls["numpy-7x32x24x16"]
    assert run.products
    run(None, None)
    Ab, Bb, Cb = (run.__defaults__[i] for i in range(1, 4))
    assert Ab.shape == (7, 32, 16) and np.allclose(Cb, Ab @ Bb)


def test_every_timed_call_follows_its_warm_call_at_once(monkeypatch):
    """Each call is timed right after an untimed one, numpy's included: a pause between them
    parks its threads again and charges their wake-up to the timed call (0.5 ms of numpy's
    5.5 ms at 768³ on the 2-core VM)."""
    bench = _bench()
    events = []
    monkeypatch.setattr(bench.time, "sleep", lambda s: events.append("sleep"))
    monkeypatch.setattr(bench.time, "perf_counter", lambda: events.append("clock") or 0.0)
    calls = [(n, (lambda n=n: events.append(n))) for n in ("numpy", "lcmac")]
    runs = bench.interleaved(calls, rounds=2, pause=0.3)
    assert {k: len(v) for k, v in runs.items()} == {"numpy": 2, "lcmac": 2}
    one = ["sleep", "numpy", "clock", "numpy", "clock", "sleep", "lcmac", "clock", "lcmac", "clock"]
    assert events == one * 2
