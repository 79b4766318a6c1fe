"""The autotuner: the model's ranking is the prior, measurement the judge.

``tune(algo, target, dtype, shape, budget=N)``

1. ranked space (``space.ranked_space``: enumerate → prune on-chip misfits → rank by the
   analytic estimate); configs already in the log for this exact case are not re-run (their
   records count as trials);
2. in model order, batches of ``jobs`` configs are compiled in parallel worker processes
   (``build_fn``; default ``lcmac.build.build`` in a spawned process pool), then measured one
   at a time in an isolated measuring process (``measure.MeasureWorker``) — never while
   compiling, so timing does not share the cores with a compiler;
3. stops after ``budget`` measurements per algorithm, or earlier when ``patience``
   measurements in a row did not improve the best by more than ``min_improvement``;
4. every measurement (failures too) is appended to the tuning log (``db.TuningDB``);
5. returns a ``TuneResult`` (best algorithm + config + time, every trial, model-vs-measured
   Spearman over the trials).

``algo="auto"`` tunes the plain GEMM and the cost model's ``top_lcmas`` best LCMAs for the
shape (``lcmac.costmodel.select``), each with the same budget, and picks the fastest.

Tests and dry runs pass ``measure_fn(point) -> seconds | (seconds, spread) | dict`` instead
of building anything.
"""
from __future__ import annotations

import concurrent.futures as cf
import math
import multiprocessing as mp
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from . import db as _db
from . import space as _space
from .metrics import spearman


@dataclass
class Trial:
    point: _space.Point
    time_s: float | None          # None: failed
    spread: float | None = None
    status: str = "ok"
    error: str = ""
    from_log: bool = False
    record: dict | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok" and self.time_s is not None


@dataclass
class TuneResult:
    target: str
    dtype: str
    shape: tuple[int, int, int]
    trials: list[Trial] = field(default_factory=list)
    space_sizes: dict = field(default_factory=dict)   # algorithm → (ranked, pruned)
    stopped: dict = field(default_factory=dict)       # algorithm → why tuning stopped
    default_times: dict = field(default_factory=dict)  # algorithm → time of the default config

    def ok_trials(self, algorithm: str | None = None) -> list[Trial]:
        return [t for t in self.trials if t.ok and (algorithm is None or t.point.algorithm == algorithm)]

    @property
    def best(self) -> Trial | None:
        ok = self.ok_trials()
        return min(ok, key=lambda t: t.time_s) if ok else None

    def best_per_algorithm(self) -> dict[str, Trial]:
        out: dict[str, Trial] = {}
        for t in self.ok_trials():
            a = t.point.algorithm
            if a not in out or t.time_s < out[a].time_s:
                out[a] = t
        return out

    def spearman(self, algorithm: str | None = None) -> float:
        ok = self.ok_trials(algorithm)
        return spearman([t.point.predicted_s for t in ok], [t.time_s for t in ok])

    def summary_rows(self) -> list[dict]:
        rows = []
        M, N, K = self.shape
        for a, t in sorted(self.best_per_algorithm().items(), key=lambda kv: kv[1].time_s):
            n = len([x for x in self.trials if x.point.algorithm == a])
            rows.append({"algorithm": a, "trials": n, "best_ms": t.time_s * 1e3,
                         "gflops": 2 * M * N * K / t.time_s / 1e9,
                         "predicted_ms": t.point.predicted_s * 1e3,
                         "spearman": self.spearman(a), "config": t.point.config_dict(),
                         "default_ms": (self.default_times.get(a) or math.nan) * 1e3,
                         "stopped": self.stopped.get(a, "")})
        return rows


# ---- building (parallel worker processes) -------------------------------------------------
def _build_worker(algorithm: str, target: str, dtype: str, shape, config, out_dir: str) -> str:
    """Runs in a worker process: build one artifact, return its path."""
    from .. import build as _build
    fn = getattr(_build, "build")
    levels = 1  # recursion is part of the expression ("strassen^2")
    algo = None if algorithm == _db.GEMM else algorithm
    config = _db.config_to_dict(config) if config is not None else None  # build takes dicts
    try:
        art = fn(algo if algo is not None else "gemm", target, dtype, tuple(shape), levels, config, out_dir)
    except TypeError:
        art = fn(algo if algo is not None else "gemm", target=target, dtype=dtype, shape=tuple(shape),
                 config=config, out_dir=out_dir)
    for attr in ("path", "library", "lib_path", "manifest_path", "directory"):
        v = getattr(art, attr, None)
        if v:
            return str(v)
    return str(art if art is not None else out_dir)


class _Builder:
    def __init__(self, jobs: int):
        self.jobs = max(1, jobs)
        self.pool = None

    def build(self, points, target, dtype, shape, root: Path) -> list[tuple[str | None, str]]:
        if self.pool is None:
            self.pool = cf.ProcessPoolExecutor(max_workers=self.jobs, mp_context=mp.get_context("spawn"))
        futs = []
        for i, pt in enumerate(points):
            d = root / f"{pt.algorithm.replace('^', 'p').replace('*', 'x').replace('@', 'at')}-{abs(hash(pt.key)) % 10**10}"
            futs.append(self.pool.submit(_build_worker, pt.algorithm, target, dtype, tuple(shape),
                                         pt.config, str(d)))
        out = []
        for f in futs:
            try:
                out.append((f.result(), ""))
            except cf.process.BrokenProcessPool as e:
                self.close()
                out.append((None, f"build worker crashed: {e}"))
            except Exception as e:  # noqa: BLE001 - reported as a failed trial
                msg = str(e).strip().splitlines()
                out.append((None, f"build failed: {type(e).__name__}: {msg[-1] if msg else ''}"))
        return out

    def close(self):
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
            self.pool = None


# ---- progress ------------------------------------------------------------------------------
class Progress:
    """A plain-text progress bar on stderr (no dependency); silent when ``enabled`` is False."""

    def __init__(self, total: int, enabled: bool = True, width: int = 24, stream=None):
        self.total, self.n, self.enabled, self.width = max(total, 1), 0, enabled, width
        self.stream = stream or sys.stderr
        self.t0 = time.time()
        self.tty = getattr(self.stream, "isatty", lambda: False)()

    def update(self, msg: str = "", n: int = 1):
        self.n += n
        if not self.enabled:
            return
        frac = min(1.0, self.n / self.total)
        bar = "#" * int(frac * self.width) + "." * (self.width - int(frac * self.width))
        line = f"[{bar}] {self.n}/{self.total} {time.time() - self.t0:5.0f}s {msg}"
        if self.tty:
            self.stream.write("\r\033[K" + line[:160])
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self):
        if self.enabled and self.tty:
            self.stream.write("\n")
            self.stream.flush()


# ---- the tuner -----------------------------------------------------------------------------
def _normalize_measurement(m) -> dict:
    if isinstance(m, dict):
        return m
    if isinstance(m, (tuple, list)):
        return {"status": "ok", "time_s": float(m[0]), "spread": float(m[1]) if len(m) > 1 else None}
    if m is None:
        return {"status": "error", "error": "no measurement"}
    return {"status": "ok", "time_s": float(m)}


def auto_algorithms(target, dtype, shape, top_lcmas: int = 2, profile=None,
                    algorithms=None) -> list[str]:
    """``"gemm"`` plus the cost model's best ``top_lcmas`` LCMAs for the shape (a backend
    that cannot build an algorithm reports the failure as a trial; it is not guessed here)."""
    from ..costmodel import select
    M, N, K = shape
    kw = {"profile": profile} if profile is not None else {}
    if algorithms is not None:
        kw["algorithms"] = algorithms
    cands = select(M, N, K, dtype, target, **kw)
    lcmas = [c.algorithm for c in cands if not c.is_gemm][:top_lcmas]
    return [_db.GEMM] + lcmas


def tune(algo, target: str, dtype: str, shape, budget: int = 8, *, patience: int = 4,
         min_improvement: float = 0.01, jobs: int = 2, db: _db.TuningDB | str | None = None,
         measure_fn: Callable | None = None, build_fn: Callable | None = None,
         top_lcmas: int = 2, repeats: int = 5, warmup: int = 2, min_run_s: float = 0.02,
         reuse_log: bool = True, log: bool = True, progress: bool | Progress = False,
         profile=None, configs=None, measure_default: bool = False,
         work_dir: str | None = None) -> TuneResult:
    """Tune one shape (see the module doc).  ``algo``: ``"gemm"``, a catalogue expression
    (``"strassen"``, ``"strassen^2"``), a list of them, or ``"auto"``.  ``budget``: configs
    measured per algorithm (at most).  ``jobs``: parallel compile processes.  ``db``: a
    ``TuningDB`` or its directory (default ``db.default_dir()``).  ``measure_fn(point)``:
    replaces build+measure (tests).  ``build_fn(point, out_dir) -> artifact path``: replaces
    the default ``lcmac.build.build`` (then measured in the measuring process).
    ``measure_default``: also measure the backend's default config (config None) for the
    tuned-vs-default speed-up."""
    shape = tuple(int(x) for x in shape)
    from ..costmodel.profiles import normalize_dtype
    dtype = normalize_dtype(dtype)
    store = db if isinstance(db, _db.TuningDB) else _db.TuningDB(db)
    if isinstance(algo, str) and algo == "auto":
        algos = auto_algorithms(target, dtype, shape, top_lcmas, profile)
    elif isinstance(algo, (list, tuple)):
        algos = [_db.algo_identity(a)[0] for a in algo]
    else:
        algos = [_db.algo_identity(algo)[0]]
    res = TuneResult(target, dtype, shape)
    spaces = {}
    for a in algos:
        sp = _space.ranked_space(target, dtype, a, shape, profile=profile, configs=configs)
        spaces[a] = sp
        res.space_sizes[a] = (len(sp.ranked), len(sp.pruned))
    total = sum(min(budget, len(sp.ranked)) for sp in spaces.values()) + (len(algos) if measure_default else 0)
    bar = progress if isinstance(progress, Progress) else Progress(total, enabled=bool(progress))
    device = _db.device_name(target)
    worker = None
    builder = _Builder(jobs) if (measure_fn is None and build_fn is None) else None
    tmp = tempfile.TemporaryDirectory(prefix="lcmac-tune-", dir=work_dir) if measure_fn is None else None

    def record(pt, m, **extra):
        rec = _db.make_record(target=target, dtype=dtype, algorithm=pt.algorithm,
                              algorithm_hash=pt.algorithm_hash, shape=shape, config=pt.config,
                              time_s=m.get("time_s") if m.get("status", "ok") == "ok" else None,
                              spread=m.get("spread"), repeats=m.get("repeats", repeats),
                              predicted_s=pt.predicted_s, status=m.get("status", "ok"),
                              error=m.get("error"), device=device, **extra)
        if log:
            store.append(rec)
        return rec

    def measure_batch(points) -> list[dict]:
        nonlocal worker
        if measure_fn is not None:
            out = []
            for pt in points:
                try:
                    out.append(_normalize_measurement(measure_fn(pt)))
                except Exception as e:  # noqa: BLE001
                    out.append({"status": "error", "error": f"{type(e).__name__}: {e}"})
            return out
        root = Path(tmp.name)
        if build_fn is not None:
            built = []
            for pt in points:
                try:
                    built.append((str(build_fn(pt, str(root / f"a{abs(hash(pt.key)) % 10**10}"))), ""))
                except Exception as e:  # noqa: BLE001
                    built.append((None, f"build failed: {type(e).__name__}: {e}"))
        else:
            built = builder.build(points, target, dtype, shape, root)
        if worker is None:
            from .measure import MeasureWorker
            worker = MeasureWorker()
        out = []
        for pt, (path, err) in zip(points, built):
            if path is None:
                out.append({"status": "error", "error": err})
                continue
            out.append(worker.measure(path, target, dtype, shape, warmup=warmup, repeats=repeats,
                                      min_run_s=min_run_s))
        return out

    try:
        for a in algos:
            sp = spaces[a]
            if not sp.ranked:
                res.stopped[a] = "no config fits on chip"
                continue
            if measure_default:
                dcfg = _space.default_config(target, dtype)
                dpt = _space.Point(a, sp.ranked[0].algorithm_hash, dcfg,
                                   _space.estimate(target, dtype, shape, a, dcfg, profile)["time_s"]
                                   if dcfg is not None else math.nan, {})
                m = measure_batch([dpt])[0] if measure_fn is None else _normalize_measurement(measure_fn(dpt))
                bar.update(f"{a} default config")
                if m.get("status", "ok") == "ok":
                    res.default_times[a] = m["time_s"]
                    if dcfg is not None and math.isfinite(dpt.predicted_s):
                        record(dpt, m, default=True)
            done = store.measured_configs(target, dtype, sp.ranked[0].algorithm_hash, shape) \
                if reuse_log else set()
            logged = {}
            if done:
                for r in store.query(target, dtype, algorithm_hash=sp.ranked[0].algorithm_hash, shape=shape):
                    k = _db.config_key(r["config"])
                    if k not in logged or r["time_s"] < logged[k]["time_s"]:
                        logged[k] = r
            best, since, n = math.inf, 0, 0
            queue = list(sp.ranked)
            reason = "space exhausted"
            while queue and n < budget:
                batch = []
                while queue and len(batch) < max(1, jobs) and n + len(batch) < budget:
                    pt = queue.pop(0)
                    if pt.key in done:
                        if pt.key in logged:  # already measured: counts as a trial, not re-run
                            r = logged[pt.key]
                            res.trials.append(Trial(pt, r["time_s"], r.get("spread"), from_log=True, record=r))
                            n += 1
                            bar.update(f"{a} (from log) {r['time_s'] * 1e3:.3f} ms")
                            if r["time_s"] < best * (1 - min_improvement):
                                best, since = r["time_s"], 0
                            else:
                                since += 1
                        continue
                    batch.append(pt)
                for pt, m in zip(batch, measure_batch(batch) if batch else []):
                    rec = record(pt, m)
                    n += 1
                    if m.get("status", "ok") == "ok":
                        t = float(m["time_s"])
                        res.trials.append(Trial(pt, t, m.get("spread"), record=rec))
                        bar.update(f"{a} {t * 1e3:.3f} ms (model {pt.predicted_s * 1e3:.3f})")
                        if t < best * (1 - min_improvement):
                            best, since = t, 0
                        else:
                            since += 1
                    else:
                        res.trials.append(Trial(pt, None, status="error", error=m.get("error", ""), record=rec))
                        bar.update(f"{a} failed: {m.get('error', '')[:60]}")
                        since += 1
                if n >= budget:
                    reason = f"budget of {budget} measurements"
                elif since >= patience and math.isfinite(best):
                    reason = f"no improvement in {since} measurements (patience {patience})"
                    break
            res.stopped[a] = reason
    finally:
        bar.close()
        if worker is not None:
            worker.close()
        if builder is not None:
            builder.close()
        if tmp is not None:
            tmp.cleanup()
    return res


def exhaustive(algo, target, dtype, shape, measure_fn, *, profile=None, configs=None) -> list[tuple[float, float]]:
    """(predicted, measured) for every fitting config of one algorithm (metrics over a
    whole space; with a real ``measure_fn`` this is slow, meant for small spaces)."""
    sp = _space.ranked_space(target, dtype, algo, shape, profile=profile, configs=configs)
    out = []
    for pt in sp.ranked:
        m = _normalize_measurement(measure_fn(pt))
        if m.get("status", "ok") == "ok":
            out.append((pt.predicted_s, float(m["time_s"])))
    return out
