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
   measurements in a row did not improve the best by more than ``min_improvement``
   (``exhaustive=True``: every fitting config, no early stop — for the search metrics);
4. every measurement (failures too) is appended to the tuning log (``db.TuningDB``), and
   with ``vendor=True`` the vendor GEMM of the same shape (cuBLAS / numpy) as the baseline;
5. returns a ``TuneResult`` (best algorithm + config + time, every trial, model-vs-measured
   Spearman over the trials).

``algo="auto"`` tunes the plain GEMM and the cost model's ``top_lcmas`` best LCMAs for the
shape (``lcmac.costmodel.select``), each with the same budget, and picks the fastest.

Many shapes on a GPU (``tune_many``): compiling and measuring overlap there (GPU timing does
not share the CPU cores' work), so every shape's planned configs (``plan_points``) go to one
pool of ``jobs`` compile threads (``Prebuilder``) up front, and each shape is measured as soon
as its artifacts exist.  ``Prebuilder`` also writes ``index.jsonl`` beside the artifacts, so
a build on one machine (``lcmac tune --build-only DIR``) can be measured on another
(``--prebuilt DIR``).

Tests and dry runs pass ``measure_fn(point) -> seconds | (seconds, spread) | dict`` instead
of building anything.
"""
from __future__ import annotations

import concurrent.futures as cf
import json
import math
import multiprocessing as mp
import os
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..artifact import tuning_log as _db
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
    vendor_time: float | None = None                   # the vendor GEMM, same run
    vendor_config: dict = field(default_factory=dict)

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
                         "vs_vendor": (self.vendor_time / t.time_s) if self.vendor_time else math.nan,
                         "stopped": self.stopped.get(a, "")})
        return rows


# ---- building (parallel worker processes) -------------------------------------------------
def _build_worker(algorithm: str, target: str, dtype: str, shape, config, out_dir: str) -> str:
    """Runs in a worker process: build one artifact, return its path."""
    from ..artifact import build as _build
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


def _build_group(items) -> list:
    """Runs in a worker process: several builds through one compiler worker (one compiler
    import for the group: ``lcmac.build.build_many``); a path or an error string each."""
    from ..artifact.build import build_many
    jobs = [{"algo": a if a != _db.GEMM else "gemm", "target": t, "dtype": d, "shape": tuple(s),
             "config": _db.config_to_dict(c) if c is not None else None, "out_dir": o}
            for a, t, d, s, c, o in items]
    out = []
    for r in build_many(jobs):
        if isinstance(r, BaseException):
            msg = str(r).strip().splitlines()
            out.append(f"build failed: {type(r).__name__}: {msg[-1] if msg else ''}")
        else:
            out.append(str(r))
    return out


class _Builder:
    """Compiles a batch of points in ``jobs`` worker processes; a batch larger than ``jobs``
    is split into ``jobs`` groups, each built by one compiler worker (``build_many``), which
    saves the compiler's import per artifact (~2.5 s for apache-tvm)."""

    def __init__(self, jobs: int):
        self.jobs = max(1, jobs)
        self.pool = None

    def build(self, points, target, dtype, shape, root: Path) -> list[tuple[str | None, str]]:
        if self.pool is None:
            self.pool = cf.ProcessPoolExecutor(max_workers=self.jobs, mp_context=mp.get_context("spawn"))
        items = []
        for pt in points:
            d = root / f"{pt.algorithm.replace('^', 'p').replace('*', 'x').replace('@', 'at')}-{abs(hash(pt.key)) % 10**10}"
            items.append((pt.algorithm, target, dtype, tuple(shape), pt.config, str(d)))
        if len(items) <= self.jobs:
            groups = [[it] for it in items]
        else:
            k = -(-len(items) // self.jobs)
            groups = [items[i:i + k] for i in range(0, len(items), k)]
        futs = [self.pool.submit(_build_worker, *g[0]) if len(g) == 1 else self.pool.submit(_build_group, g)
                for g in groups]
        out = []
        for g, f in zip(groups, futs):
            try:
                r = f.result()
                rs = [r] if len(g) == 1 else r
                out += [(None, x) if x.startswith("build failed:") else (x, "") for x in rs]
            except cf.process.BrokenProcessPool as e:
                self.close()
                out += [(None, f"build worker crashed: {e}")] * len(g)
            except Exception as e:  # noqa: BLE001 - reported as a failed trial
                msg = str(e).strip().splitlines()
                out += [(None, f"build failed: {type(e).__name__}: {msg[-1] if msg else ''}")] * len(g)
        return out

    def close(self):
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
            self.pool = None


def _artifact_dir(root: Path, pt, shape) -> Path:
    slug = pt.algorithm.replace("^", "p").replace("*", "x").replace("@", "at")
    import hashlib
    h = hashlib.sha1(f"{pt.algorithm_hash}|{tuple(shape)}|{pt.key}".encode()).hexdigest()[:12]
    return root / f"{slug}-{'x'.join(map(str, shape))}-{h}"


class Prebuilder:
    """Compile points ahead of measuring, ``jobs`` at a time, in threads (each build runs the
    backend's compiler worker as a subprocess).  ``get(point, target, dtype, shape)`` waits for
    that point's artifact; every finished build is appended to ``root/index.jsonl``, which
    ``load_prebuilt`` reads on another machine."""

    def __init__(self, jobs: int, root: str | os.PathLike, nice: int = 0):
        self.nice = nice       # lower the compilers' priority (measuring at the same time)
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.pool = cf.ThreadPoolExecutor(max_workers=max(1, jobs), thread_name_prefix="lcmac-build")
        self.futs: dict = {}
        self.lock = threading.Lock()
        self.t0 = time.time()
        self.built = self.failed = 0

    @staticmethod
    def key(pt, target, dtype, shape) -> tuple:
        return (str(target), dtype, pt.algorithm_hash, tuple(int(x) for x in shape), pt.key)

    def _run(self, pt, target, dtype, shape):
        d = _artifact_dir(self.root, pt, shape)
        if self.nice:
            try:  # Linux: nice is per thread, and the compiler subprocesses inherit it
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), self.nice)
            except (AttributeError, OSError):
                pass
        t = time.time()
        try:
            path = _build_worker(pt.algorithm, target, dtype, tuple(shape), pt.config, str(d))
        except Exception:
            with self.lock:
                self.failed += 1
            raise
        rec = {"target": str(target), "dtype": dtype, "algorithm": pt.algorithm,
               "algorithm_hash": pt.algorithm_hash, "shape": list(shape), "config": pt.config_dict(),
               "manifest": os.path.relpath(path, self.root), "build_s": round(time.time() - t, 1)}
        with self.lock:
            self.built += 1
            with open(self.root / "index.jsonl", "a") as f:
                f.write(json.dumps(rec, sort_keys=True) + "\n")
        return path

    def submit(self, pt, target, dtype, shape):
        k = self.key(pt, target, dtype, shape)
        if k not in self.futs:
            self.futs[k] = self.pool.submit(self._run, pt, target, dtype, tuple(shape))
        return self.futs[k]

    def get(self, pt, target, dtype, shape) -> str | None:
        """The artifact of a submitted point (waits; raises its build error), else None."""
        fut = self.futs.get(self.key(pt, target, dtype, shape))
        return None if fut is None else fut.result()

    def lookup(self, target, dtype, shape):
        return lambda pt: self.get(pt, target, dtype, shape)

    def wait(self):
        cf.wait(list(self.futs.values()))

    def close(self, cancel: bool = False):
        self.pool.shutdown(wait=not cancel, cancel_futures=cancel)


def load_prebuilt(root: str | os.PathLike):
    """A lookup ``(point, target, dtype, shape) -> manifest path | None`` over the artifacts a
    ``Prebuilder`` (``lcmac tune --build-only DIR``) left in ``root``.  A point matches an
    entry of the same target, dtype, algorithm and shape whose config agrees on every knob
    both name (a backend config class that gained a field since the build still matches)."""
    root = Path(root)
    entries: dict[tuple, list] = {}
    idx = root / "index.jsonl"
    if idx.is_file():
        for line in idx.read_text().splitlines():
            try:
                e = json.loads(line)
            except ValueError:
                continue
            k = (e["target"], e["dtype"], e["algorithm_hash"], tuple(e["shape"]))
            entries.setdefault(k, []).append(e)

    def find(pt, target, dtype, shape):
        cand = entries.get((str(target), dtype, pt.algorithm_hash, tuple(int(x) for x in shape)), [])
        want = pt.config_dict()
        for e in cand:
            have = e["config"]
            if all(want[k] == have[k] for k in set(want) & set(have)):
                path = root / e["manifest"]
                if path.is_file():
                    return str(path)
        return None
    find.n_entries = sum(len(v) for v in entries.values())  # type: ignore[attr-defined]
    return find


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
                    algorithms=None, max_error: float | None = None,
                    operands: str = "native") -> list[str]:
    """``"gemm"`` plus the cost model's best ``top_lcmas`` LCMAs for the shape (a backend
    that cannot build an algorithm reports the failure as a trial; it is not guessed here),
    of those predicted within ``max_error`` × the plain GEMM's error when given, both for the
    CUDA ``operands`` mode tuned."""
    from ..costmodel import select
    from ..costmodel.decision import with_errors
    M, N, K = shape
    kw = {"profile": profile} if profile is not None else {}
    if algorithms is not None:
        kw["algorithms"] = algorithms
    mdt = _space.model_dtype(target, dtype, operands)
    if operands != "native":
        kw["operands"] = operands
    cands = [c for c in select(M, N, K, mdt, target, max_error=max_error, **kw) if not c.is_gemm]
    if max_error is not None:
        cands = with_errors(cands, mdt, operands, K, max_error, top_lcmas)
    return [_db.GEMM] + [c.algorithm for c in cands][:top_lcmas]


def _algorithms(algo, target, dtype, shape, top_lcmas, profile, max_error=None,
                operands="native") -> list[str]:
    if isinstance(algo, str) and algo == "auto":
        return auto_algorithms(target, dtype, shape, top_lcmas, profile, max_error=max_error,
                               operands=operands)
    if isinstance(algo, (list, tuple)):
        return [_db.algo_identity(a)[0] for a in algo]
    return [_db.algo_identity(algo)[0]]


def _resolved(config, dtype) -> dict:
    """A config dict with the backend's "0 = the dtype's default" k slab spelled out."""
    d = _db.config_to_dict(config)
    if d.get("block_k") == 0:
        d["block_k"] = _space.default_block_k(d, dtype)
    return d


def _default_point(a, sp, target, dtype, shape, profile, operands="native"):
    """The backend's default config as a point; the ranked space's own point when one of
    them is the same kernel (so it is built and measured once)."""
    dcfg = _space.default_config(target, dtype, a, shape=shape, operands=operands)
    if dcfg is not None:
        want = _resolved(dcfg, dtype)
        for pt in sp.ranked:
            if _resolved(pt.config, dtype) == want:
                return pt
    pred = (_space.estimate(target, dtype, shape, a, dcfg, profile)["time_s"]
            if dcfg is not None else math.nan)
    return _space.Point(a, sp.ranked[0].algorithm_hash, dcfg, pred, {})


def plan_points(algo, target: str, dtype: str, shape, budget: int = 8, *, db=None,
                reuse_log: bool = True, top_lcmas: int = 2, profile=None, configs=None,
                exhaustive: bool = False, measure_default: bool = False,
                operands: str = "native", max_error: float | None = None) -> list:
    """The points ``tune`` with the same arguments would build, in its order: per algorithm
    the first ``budget`` configs of the ranked space that are not logged yet for this case
    (all of them with ``exhaustive``), after the default config when ``measure_default``.
    Early stopping can only measure fewer of them."""
    from ..dtypes import normalize_model_dtype
    dtype = normalize_model_dtype(dtype)
    shape = tuple(int(x) for x in shape)
    store = db if isinstance(db, _db.TuningDB) else _db.TuningDB(db)
    out = []
    for a in _algorithms(algo, target, dtype, shape, top_lcmas, profile, max_error, operands):
        sp = _space.ranked_space(target, dtype, a, shape, profile=profile, configs=configs,
                                 operands=operands)
        if not sp.ranked:
            continue
        done = store.measured_configs(target, dtype, sp.ranked[0].algorithm_hash, shape) \
            if reuse_log else set()
        if measure_default:
            dpt = _default_point(a, sp, target, dtype, shape, profile, operands)
            if dpt.config is not None and dpt.key not in done:
                out.append(dpt)
        n = len(sp.ranked) if exhaustive else budget
        out += [pt for pt in sp.ranked[:n] if pt.key not in done]
    return out


def tune(algo, target: str, dtype: str, shape, budget: int = 8, *, patience: int = 4,
         min_improvement: float = 0.01, jobs: int = 2, db: _db.TuningDB | str | None = None,
         measure_fn: Callable | None = None, build_fn: Callable | None = None,
         top_lcmas: int = 2, repeats: int = 5, warmup: int = 2, min_run_s: float = 0.02,
         reuse_log: bool = True, log: bool = True, progress: bool | Progress = False,
         profile=None, configs=None, measure_default: bool = False,
         work_dir: str | None = None, vendor: bool = False, exhaustive: bool = False,
         tag: str | None = None, worker=None, prebuilt: Callable | None = None,
         operands: str = "native", max_error: float | None = None,
         sustained_s: float | None = None) -> TuneResult:
    """Tune one shape (see the module doc).  ``algo``: ``"gemm"``, a catalogue expression
    (``"strassen"``, ``"strassen^2"``), a list of them, or ``"auto"``.  ``budget``: configs
    measured per algorithm (at most).  ``jobs``: parallel compile processes.  ``db``: a
    ``TuningDB`` or its directory (default ``db.default_dir()``).  ``measure_fn(point)``:
    replaces build+measure (tests).  ``build_fn(point, out_dir) -> artifact path``: replaces
    the default ``lcmac.build.build`` (then measured in the measuring process).
    ``prebuilt(point) -> artifact path | None``: artifacts built ahead (``Prebuilder``,
    ``load_prebuilt``); the others are built here.  ``measure_default``: also measure the
    backend's default config (logged with ``default: true``) for the tuned-vs-default
    speed-up.  ``vendor``: also time the vendor GEMM (cuBLAS / numpy) on the same operands and
    log it as algorithm ``"vendor"``.  ``exhaustive``: measure every fitting config (no budget,
    no early stop).  ``tag``: stored in every record.  ``worker``: a ``MeasureWorker`` shared
    between calls (kept open).  ``operands``: the CUDA operand mode searched
    (CudaConfig.operands; one precision per search).  ``max_error``: with ``"auto"``, only
    LCMAs predicted within that multiple of the plain GEMM's error (costmodel.accuracy).
    ``sustained_s`` (GPUs): warm each kernel up for that many seconds of back-to-back calls
    before timing it, so that it is measured at the GPU's power cap, as long runs see it
    (an H100 settles within ~0.2 s at 700 W; the default warm-up is 0.15 s)."""
    shape = tuple(int(x) for x in shape)
    from ..dtypes import normalize_model_dtype
    dtype = normalize_model_dtype(dtype)
    warm = {}
    if sustained_s is not None:
        if _space.family(target) != "cuda":
            raise ValueError("sustained_s is a GPU measurement (a power-capped steady state); "
                             f"target {target} is not a CUDA target")
        if not (isinstance(sustained_s, (int, float)) and 0 < sustained_s <= 60):
            raise ValueError(f"sustained_s must be seconds in (0, 60], got {sustained_s!r}")
        warm = {"warm_s": float(sustained_s)}
    if operands == "fp8":
        from ..schedules.cuda.config import NotSupportedYet
        # the vendor baseline would have to be cuBLAS's FP8 GEMM and the correctness check an
        # FP8-sized tolerance (scripts/bench_cuda.py measures both)
        raise NotSupportedYet("tuning operands='fp8' is not supported yet; build with "
                              "--config '{\"operands\": \"fp8\"}' (its measured tile "
                              "defaults) and compare with scripts/bench_cuda.py")
    store = db if isinstance(db, _db.TuningDB) else _db.TuningDB(db)
    algos = _algorithms(algo, target, dtype, shape, top_lcmas, profile, max_error, operands)
    res = TuneResult(target, dtype, shape)
    spaces = {}
    for a in algos:
        sp = _space.ranked_space(target, dtype, a, shape, profile=profile, configs=configs,
                                 operands=operands)
        spaces[a] = sp
        res.space_sizes[a] = (len(sp.ranked), len(sp.pruned))
    if exhaustive:
        budget = max([len(sp.ranked) for sp in spaces.values()] + [1])
        patience = budget + 1
    total = (sum(min(budget, len(sp.ranked)) for sp in spaces.values())
             + (len(algos) if measure_default else 0) + (1 if vendor else 0))
    bar = progress if isinstance(progress, Progress) else Progress(total, enabled=bool(progress))
    device = _db.device_name(target)
    own_worker = worker is None
    builder = _Builder(jobs) if (measure_fn is None and build_fn is None) else None
    tmp = tempfile.TemporaryDirectory(prefix="lcmac-tune-", dir=work_dir) if measure_fn is None else None
    rank_of = {a: {pt.key: i for i, pt in enumerate(sp.ranked)} for a, sp in spaces.items()}
    # points compiled before a batch is measured: `jobs` (early stopping decides after each
    # batch); an exhaustive search has no early stop, so larger batches, each job's share
    # built by one compiler worker (one compiler import per share)
    batch_n = max(1, jobs) * (8 if exhaustive else 1)

    def record(pt, m, **extra):
        extra = dict(extra)
        if tag:
            extra["tag"] = tag
        if pt.algorithm in spaces:
            extra.setdefault("space_size", len(spaces[pt.algorithm].ranked))
            r = rank_of[pt.algorithm].get(pt.key)
            if r is not None:
                extra.setdefault("rank", r)
        for k in ("inner", "input_sets", "warm_s"):
            if m.get(k) is not None:
                extra.setdefault(k, m[k])
        pred = pt.predicted_s if (pt.predicted_s is not None and math.isfinite(pt.predicted_s)) else None
        rec = _db.make_record(target=target, dtype=dtype, algorithm=pt.algorithm,
                              algorithm_hash=pt.algorithm_hash, shape=shape, config=pt.config,
                              time_s=m.get("time_s") if m.get("status", "ok") == "ok" else None,
                              spread=m.get("spread"), repeats=m.get("repeats", repeats),
                              predicted_s=pred, status=m.get("status", "ok"),
                              error=m.get("error"), device=device, **extra)
        if log:
            store.append(rec)
        return rec

    def get_worker():
        nonlocal worker
        if worker is None:
            from .measure import MeasureWorker
            worker = MeasureWorker()
        return worker

    def build_points(points) -> list[tuple[str | None, str]]:
        root = Path(tmp.name)
        built: list = [None] * len(points)
        for i, pt in enumerate(points):
            try:
                if build_fn is not None:
                    built[i] = (str(build_fn(pt, str(root / f"a{abs(hash(pt.key)) % 10**10}"))), "")
                elif prebuilt is not None:
                    path = prebuilt(pt)
                    if path:
                        built[i] = (str(path), "")
            except Exception as e:  # noqa: BLE001
                msg = str(e).strip().splitlines()
                built[i] = (None, f"build failed: {type(e).__name__}: {msg[-1] if msg else ''}")
        rest = [i for i, b in enumerate(built) if b is None]
        if rest:
            nonlocal builder
            if builder is None:
                builder = _Builder(jobs)
            for i, b in zip(rest, builder.build([points[i] for i in rest], target, dtype, shape, root)):
                built[i] = b
        return built

    def measure_batch(points) -> list[dict]:
        if measure_fn is not None:
            out = []
            for pt in points:
                try:
                    out.append(_normalize_measurement(measure_fn(pt)))
                except Exception as e:  # noqa: BLE001
                    out.append({"status": "error", "error": f"{type(e).__name__}: {e}"})
            return out
        out = []
        for pt, (path, err) in zip(points, build_points(points)):
            if path is None:
                out.append({"status": "error", "error": err})
                continue
            out.append(get_worker().measure(path, target, dtype, shape, warmup=warmup,
                                            repeats=repeats, min_run_s=min_run_s, **warm))
        return out

    try:
        if vendor:
            vcfg = {"library": "vendor"}
            if operands != "native":
                vcfg["operands"] = operands
            if measure_fn is not None:
                vpt = _space.Point(_db.VENDOR, _db.VENDOR, vcfg, math.nan, {})
                try:
                    m = _normalize_measurement(measure_fn(vpt))
                except Exception as e:  # noqa: BLE001
                    m = {"status": "error", "error": f"{type(e).__name__}: {e}"}
            else:
                m = get_worker().measure_vendor(target, dtype, shape, warmup=warmup,
                                                repeats=repeats, min_run_s=min_run_s,
                                                operands=operands, **warm)
            vcfg = m.pop("config", None) or vcfg
            if m.get("status", "ok") == "ok":
                res.vendor_time, res.vendor_config = float(m["time_s"]), vcfg
                record(_space.Point(_db.VENDOR, _db.VENDOR, vcfg, math.nan, {}), m)
                bar.update(f"vendor {vcfg.get('library', '')} {res.vendor_time * 1e3:.3f} ms")
            else:
                bar.update(f"vendor failed: {m.get('error', '')[:60]}")
        for a in algos:
            sp = spaces[a]
            if not sp.ranked:
                res.stopped[a] = "no config fits on chip"
                continue
            if measure_default:
                dpt = _default_point(a, sp, target, dtype, shape, profile, operands)
                prev = [r for r in store.query(target, dtype, algorithm_hash=dpt.algorithm_hash,
                                               shape=shape)
                        if _db.config_key(r["config"]) == dpt.key] if reuse_log else []
                if prev:  # measured before: not re-run
                    res.default_times[a] = min(r["time_s"] for r in prev)
                    bar.update(f"{a} default config (from log)")
                else:
                    m = measure_batch([dpt])[0]
                    bar.update(f"{a} default config")
                    if m.get("status", "ok") == "ok":
                        res.default_times[a] = m["time_s"]
                        if dpt.config is not None:
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
                while queue and len(batch) < batch_n and n + len(batch) < budget:
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
                if n >= budget and not exhaustive:
                    reason = f"budget of {budget} measurements"
                elif since >= patience and math.isfinite(best):
                    reason = f"no improvement in {since} measurements (patience {patience})"
                    break
            res.stopped[a] = reason
    finally:
        bar.close()
        if worker is not None and own_worker:
            worker.close()
        if builder is not None:
            builder.close()
        if tmp is not None:
            tmp.cleanup()
    return res


def tune_many(cases, algo, target: str, dtype: str, budget: int = 8, *, jobs: int = 2,
              db=None, prebuilt: str | None = None, build_dir: str | None = None,
              build_only: bool = False, exhaustive: bool = False, measure_default: bool = False,
              top_lcmas: int = 2, profile=None, configs=None, reuse_log: bool = True,
              on_result: Callable | None = None, operands: str = "native",
              **kw) -> list[TuneResult]:
    """Tune several shapes (``cases``: [(label, (M, N, K))]) with one shared measuring
    process.  Compiling overlaps measuring (see the module doc): every planned point goes to
    one ``Prebuilder`` of ``jobs`` threads at once, in case order, and each case is measured
    when its artifacts are done.  ``prebuilt``: a directory of artifacts built earlier
    (``index.jsonl``), used first.  ``build_dir``: keep the artifacts there (default: a
    temporary directory).  ``build_only``: compile and index, measure nothing (returns [])."""
    from ..dtypes import normalize_model_dtype
    dtype = normalize_model_dtype(dtype)
    store = db if isinstance(db, _db.TuningDB) else _db.TuningDB(db)
    old = load_prebuilt(prebuilt) if prebuilt else None
    tmp = None
    if build_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="lcmac-prebuild-")
        build_dir = tmp.name
    pre = Prebuilder(jobs, build_dir, nice=0 if build_only else 10)
    results: list[TuneResult] = []
    worker = None
    try:
        for _, shape in cases:
            for pt in plan_points(algo, target, dtype, shape, budget, db=store, reuse_log=reuse_log,
                                  top_lcmas=top_lcmas, profile=profile, configs=configs,
                                  exhaustive=exhaustive, measure_default=measure_default,
                                  operands=operands, max_error=kw.get("max_error")):
                if old is None or old(pt, target, dtype, shape) is None:
                    pre.submit(pt, target, dtype, shape)
        if build_only:
            n = len(pre.futs)
            bar = Progress(n, enabled=kw.get("progress", False) is not False)
            for _ in cf.as_completed(list(pre.futs.values())):
                bar.update(f"built ({pre.failed} failed)")
            bar.close()
            return []
        from .measure import MeasureWorker
        worker = MeasureWorker()
        for label, shape in cases:
            shape = tuple(int(x) for x in shape)

            def lookup(pt, shape=shape):
                p = old(pt, target, dtype, shape) if old is not None else None
                return p or pre.get(pt, target, dtype, shape)
            r = tune(algo, target, dtype, shape, budget, jobs=1, db=store, worker=worker,
                     prebuilt=lookup, exhaustive=exhaustive, measure_default=measure_default,
                     top_lcmas=top_lcmas, profile=profile, configs=configs, reuse_log=reuse_log,
                     operands=operands, **kw)
            results.append(r)
            if on_result is not None:
                on_result(label, r)
    finally:
        if worker is not None:
            worker.close()
        pre.close(cancel=True)
        if tmp is not None:
            tmp.cleanup()
    return results


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
