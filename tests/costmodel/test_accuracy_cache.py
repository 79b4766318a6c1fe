"""The accuracy simulations' results on disk (lcmac.costmodel.accuracy, lcmac.core.result_cache):
a second process reads what the first computed, every part of the key makes a miss, a damaged
entry is computed again and rewritten, LCMAC_CACHE_DIR=off keeps nothing, and simulations of the
user's own inputs are never stored.  Simulations are thin (block 4, K 64) to stay fast."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from lcmac.costmodel import accuracy
from lcmac.costmodel.accuracy import error_ratio
from lcmac.ir import catalogue

ROOT = Path(__file__).resolve().parents[2]
#: a thin simulation: its key and what it returns
BASE = dict(dtype="bfloat16", variant="unfused", operands="native", K=64, samples=1, block=4,
            seed=0)


@pytest.fixture
def disk(tmp_path, monkeypatch):
    """A fresh cache root, the in-process memo emptied before and after, and a count of the
    simulations actually run."""
    monkeypatch.setenv("LCMAC_CACHE_DIR", str(tmp_path / "cache"))
    runs = []
    real = accuracy._estimate

    def counted(*a, **kw):
        runs.append(a[0])
        return real(*a, **kw)
    monkeypatch.setattr(accuracy, "_estimate", counted)
    accuracy._cached.cache_clear()
    yield tmp_path / "cache" / "accuracy", runs
    accuracy._cached.cache_clear()


def _ratio(alg="strassen", **kw):
    accuracy._cached.cache_clear()          # as a new process would: only the disk remembers
    args = {**BASE, **kw}
    return error_ratio(alg, args.pop("dtype"), **args)


def _entries(d: Path) -> list[Path]:
    return sorted(d.glob("*.json")) if d.is_dir() else []


#: a process that prints one simulation's result (``{prelude}``: what it does first)
PROCESS = """
import json
from lcmac.costmodel import accuracy
{prelude}
print(json.dumps(accuracy.error_ratio("winograd", "bfloat16", K=64, block=4, samples=2).to_dict()))
"""
REFUSE = """
def refuse(*a, **kw):
    raise AssertionError("simulated again")
accuracy._estimate = refuse
"""


def test_a_second_process_reads_what_the_first_computed(tmp_path):
    env = dict(os.environ, LCMAC_CACHE_DIR=str(tmp_path), PYTHONPATH=str(ROOT))

    def run(prelude):
        return json.loads(subprocess.run([sys.executable, "-c", PROCESS.format(prelude=prelude)],
                                         env=env, capture_output=True, text=True,
                                         check=True).stdout)
    first = run("")
    [entry] = _entries(tmp_path / "accuracy")
    # the second process cannot simulate: what it returns comes from the disk, bit for bit
    assert run(REFUSE) == first
    assert json.loads(entry.read_text())["value"]["ratio"] == first["ratio"]


def test_a_hit_is_the_computed_value(disk):
    d, runs = disk
    computed = _ratio()
    assert len(_entries(d)) == 1 and len(runs) == 1
    assert _ratio() == computed and len(runs) == 1


@pytest.mark.parametrize("change", [
    dict(alg="winograd"), dict(dtype="float16"), dict(variant="fused"), dict(operands="fp16"),
    dict(K=128), dict(samples=2), dict(block=5), dict(seed=1)], ids=lambda c: next(iter(c)))
def test_every_part_of_the_key_makes_a_miss(disk, change):
    d, runs = disk
    _ratio()
    _ratio(**change)
    assert len(runs) == 2 and len(_entries(d)) == 2


def test_the_coefficients_are_the_key_not_the_name(disk):
    d, runs = disk
    base = _ratio()
    # another scheme under the same name is another simulation
    impostor = catalogue.get("winograd").renamed("strassen")
    assert _ratio(impostor).ratio != base.ratio and len(runs) == 2
    # the same coefficients under another name are the same one, reported under that name
    twin = _ratio(catalogue.get("strassen").renamed("twin"))
    assert len(runs) == 2 and twin.algorithm == "twin" and twin.ratio == base.ratio


def test_new_code_or_numpy_makes_a_miss(disk, monkeypatch):
    d, runs = disk
    _ratio()
    monkeypatch.setattr(accuracy, "source_digest", lambda files: "0" * 64)
    _ratio()
    monkeypatch.setattr(np, "__version__", np.__version__ + ".other")
    _ratio()
    assert len(runs) == 3 and len(_entries(d)) == 3


def test_the_sources_include_the_rounding_code():
    names = {Path(f).name for f in accuracy._SOURCES}
    assert {"accuracy.py", "operands.py", "algorithm.py"} <= names


@pytest.mark.parametrize("damage", [
    lambda doc: "{ not json",
    lambda doc: json.dumps(doc)[: len(json.dumps(doc)) // 2],
    lambda doc: json.dumps({**doc, "key": {**doc["key"], "seed": 7}}),
    lambda doc: json.dumps({**doc, "value": {**doc["value"], "ratio": "2.5"}}),
    lambda doc: json.dumps({**doc, "value": {k: v for k, v in doc["value"].items()
                                             if k != "spread"}}),
    lambda doc: json.dumps({**doc, "value": {**doc["value"], "shape": [1, 2, 3]}}),
    lambda doc: json.dumps({**doc, "value": [1, 2]}),
], ids=["garbage", "truncated", "another-key", "wrong-type", "missing-field", "wrong-shape",
        "not-an-object"])
def test_a_damaged_entry_is_computed_again_and_rewritten(disk, damage):
    d, runs = disk
    computed = _ratio()
    [entry] = _entries(d)
    entry.write_text(damage(json.loads(entry.read_text())))
    assert _ratio() == computed and len(runs) == 2
    assert _ratio() == computed and len(runs) == 2          # rewritten whole: a hit again
    assert [p.name for p in d.iterdir()] == [entry.name]    # no temporary file left


def test_off_keeps_nothing_on_disk(tmp_path, monkeypatch, disk):
    _, runs = disk
    monkeypatch.setenv("LCMAC_CACHE_DIR", "off")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    before = sorted(tmp_path.rglob("*"))
    _ratio()
    _ratio()
    assert len(runs) == 2 and sorted(tmp_path.rglob("*")) == before


def test_an_unwritable_cache_only_costs_time(tmp_path, monkeypatch, disk):
    _, runs = disk
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("LCMAC_CACHE_DIR", str(blocker))     # a file: no directory under it
    assert _ratio() == _ratio() and len(runs) == 2


def test_the_users_inputs_are_never_stored(disk):
    d, runs = disk
    rng = np.random.default_rng(0)
    A, B = rng.standard_normal((16, 64)), rng.standard_normal((64, 16))
    error_ratio("strassen", "bfloat16", block=4, inputs=(A, B))
    assert runs and not _entries(d)
