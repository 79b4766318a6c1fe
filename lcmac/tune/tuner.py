"""The autotuner: the model's ranking is the prior, measurement the judge.

``tune(algo, target, dtype, shape, budget=N, **options)`` runs four steps:

1. **plan** (``plan_search``): the algorithms (``algo="auto"``: the plain GEMM and the cost
   model's ``top_lcmas`` best LCMAs for the shape, ``costmodel.select``) and each one's
   ranked space (``space.ranked_space``: enumerate → prune on-chip misfits → rank by the
   analytic estimate); configs already in the log for this exact case are not re-run (their
   records count as trials);
2. **build**: in model order, batches of ``jobs`` configs are compiled in parallel worker
   processes (``builders.Builder``; or ``build_fn``, or artifacts built ahead: ``prebuilt``);
3. **measure**: one at a time in an isolated measuring process (``measure.MeasureWorker``) —
   never while compiling, so timing does not share the cores with a compiler — until
   ``budget`` measurements per algorithm, or earlier when ``patience`` measurements in a row
   did not improve the best by more than ``min_improvement`` (``exhaustive=True``: every
   fitting config, no early stop — for the search metrics); with ``vendor=True`` the vendor
   GEMM of the same shape as the baseline (cuBLAS; on a CPU the faster of numpy.matmul and
   torch.matmul, ``measure.choose_cpu_vendor``, its record's config naming library and api);
4. **log**: every measurement (failures too) is appended to the tuning log
   (``artifact.tuning_log.TuningDB``).

It returns a ``TuneResult`` (best algorithm + config + time, every trial, model-vs-measured
Spearman over the trials).  The keyword options are grouped into ``TuneOptions``
(``SearchOptions``, ``BuildOptions``, ``MeasureOptions``, ``LogOptions``); ``tune_with``
takes them as such.

Many shapes on a GPU (``tune_many``): compiling and measuring overlap there (GPU timing does
not share the CPU cores' work), so every shape's planned configs (``plan_points``) go to one
pool of ``jobs`` compile threads (``builders.Prebuilder``) up front, and each shape is
measured as soon as its artifacts exist.  ``Prebuilder`` also writes ``index.jsonl`` beside
the artifacts, so a build on one machine (``lcmac tune --build-only DIR``) can be measured
on another (``--prebuilt DIR``).

Tests and dry runs pass ``measure_fn(point) -> seconds | (seconds, spread) | dict`` instead
of building anything.
"""
from __future__ import annotations

import concurrent.futures as cf
import logging
import math
import tempfile
import time
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Callable

from lcmac.artifact import tuning_log as _db
from lcmac.costmodel import model_dtype, select
from lcmac.costmodel.config_estimates import default_block_k, estimate
from lcmac.costmodel.decision import with_errors
from lcmac.core.dtypes import normalize_model_dtype
from lcmac.tune import space as _space
from lcmac.tune.builders import Builder, Prebuilder, load_prebuilt
from lcmac.tune.fp8_measure import Fp8MeasureWorker
from lcmac.tune.measure import MeasureWorker
from lcmac.tune.metrics import spearman

#: the progress lines of a run asked to show them with no stream of its own
log = logging.getLogger(__name__)

__all__ = ["BuildOptions", "LogOptions", "MeasureOptions", "Progress", "SearchOptions",
           "SearchPlan", "Trial", "TuneOptions", "TuneResult", "auto_algorithms", "exhaustive",
           "plan_points", "plan_search", "resolved_config", "tune", "tune_many", "tune_with"]


# ---- options -----------------------------------------------------------------------------
@dataclass(frozen=True)
class SearchOptions:
    """What to try (the plan)."""
    budget: int = 8                     # configs measured per algorithm, at most
    patience: int = 4                   # stop after this many measurements without improving
    min_improvement: float = 0.01       # ... the best by more than this fraction
    exhaustive: bool = False            # every fitting config, no budget, no early stop
    top_lcmas: int = 2                  # algo="auto": LCMAs tuned beside the plain GEMM
    max_error: float | None = None      # algo="auto": only LCMAs predicted within this error
    operands: str = "native"            # the CUDA operand mode searched (one per search)
    profile: Any = None                 # a hardware profile to rank with (default: target's)
    configs: Any = None                 # configs to rank instead of the backend's space
    # also measure the backend's default config; None: unless ``configs`` replaces the space.
    # The default is what an untuned build runs: a tune that measured only the model's
    # favourites could log configs slower than it (docs/tuning.md), and builds and
    # the decision take the log's best
    measure_default: bool | None = None
    vendor: bool = False                # also time the vendor GEMM as the baseline
    reuse_log: bool = True              # configs logged for this case count, not re-run

    @property
    def with_default(self) -> bool:
        """Whether the backend's default config is measured (``measure_default``)."""
        return self.configs is None if self.measure_default is None else bool(self.measure_default)


@dataclass(frozen=True)
class BuildOptions:
    """How the planned points become artifacts."""
    jobs: int = 2                       # parallel compile processes
    work_dir: str | None = None         # where the temporary artifacts go
    build_fn: Callable | None = None    # (point, out_dir) -> artifact path, instead of build
    prebuilt: Callable | None = None    # point -> artifact path | None, built ahead


@dataclass(frozen=True)
class MeasureOptions:
    """How an artifact is timed."""
    repeats: int = 5
    warmup: int = 2
    min_run_s: float = 0.02
    sustained_s: float | None = None    # GPUs: seconds of warm-up at the power cap
    measure_fn: Callable | None = None  # point -> seconds | (seconds, spread) | dict (tests)
    worker: Any = None                  # a MeasureWorker shared between calls (kept open)


@dataclass(frozen=True)
class LogOptions:
    """Where the measurements go."""
    db: Any = None                      # a TuningDB or its directory (default: the project's)
    log: bool = True                    # append every measurement to the log
    tag: str | None = None              # stored in every record
    progress: Any = False               # True: lines to the log; a stream: a bar on it; a Progress


@dataclass(frozen=True)
class TuneOptions:
    """Every option of ``tune``, grouped by the step it steers."""
    search: SearchOptions = field(default_factory=SearchOptions)
    build: BuildOptions = field(default_factory=BuildOptions)
    measure: MeasureOptions = field(default_factory=MeasureOptions)
    log: LogOptions = field(default_factory=LogOptions)

    @classmethod
    def from_keywords(cls, **keywords) -> "TuneOptions":
        """The options ``tune``'s keyword arguments spell (each goes to the group with a
        field of its name); TypeError for a keyword no group has."""
        parts = {}
        for f in fields(cls):
            names = {g.name for g in fields(f.default_factory)}
            parts[f.name] = f.default_factory(**{k: keywords.pop(k) for k in list(keywords)
                                                 if k in names})
        if keywords:
            raise TypeError(f"unexpected tuning option(s): {', '.join(sorted(keywords))}")
        return cls(**parts)


@dataclass
class Trial:
    point: _space.Point
    time_s: float | None          # None: failed
    spread: float | None = None
    status: str = "ok"
    error: str = ""
    from_log: bool = False
    record: dict | None = None
    default: bool = False         # the backend's default config (a candidate like the others)

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
    vendor_time: float | None = None                   # the vendor GEMM, same run
    vendor_config: dict = field(default_factory=dict)

    @property
    def default_times(self) -> dict:
        """algorithm → time of its default config (its ``default`` trial), where measured."""
        return {t.point.algorithm: t.time_s for t in self.ok_trials() if t.default}

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

    def vs_vendor(self, t: Trial) -> float:
        """The vendor's time / the trial's: of the same rounds where the kernel was timed
        beside it (CPU, ``vendor_paired_s``), else of the vendor's own measurement."""
        paired = (t.record or {}).get("vendor_paired_s")
        if paired:
            return float(paired) / t.time_s
        return (self.vendor_time / t.time_s) if self.vendor_time else math.nan

    def summary_rows(self) -> list[dict]:
        rows, default_times = [], self.default_times
        M, N, K = self.shape
        for a, t in sorted(self.best_per_algorithm().items(), key=lambda kv: kv[1].time_s):
            n = len([x for x in self.trials if x.point.algorithm == a])
            rows.append({"algorithm": a, "trials": n, "best_ms": t.time_s * 1e3,
                         "gflops": 2 * M * N * K / t.time_s / 1e9,
                         "predicted_ms": t.point.predicted_s * 1e3,
                         "spearman": self.spearman(a), "config": t.point.config_dict(),
                         "default_ms": (default_times.get(a) or math.nan) * 1e3,
                         "vs_vendor": self.vs_vendor(t),
                         "stopped": self.stopped.get(a, "")})
        return rows


class Progress:
    """A plain-text progress bar (no dependency) on ``stream`` (redrawn in place on a
    terminal), or, with no stream, one INFO line per step to this module's logger: a library
    call shows nothing unless its application shows lcmac's log.  Silent when ``enabled`` is
    False."""

    def __init__(self, total: int, enabled: bool = True, width: int = 24, stream=None):
        self.total, self.n, self.enabled, self.width = max(total, 1), 0, enabled, width
        self.stream = stream
        self.t0 = time.time()
        self.tty = getattr(self.stream, "isatty", lambda: False)()

    @classmethod
    def of(cls, progress, total: int) -> "Progress":
        """The bar ``LogOptions.progress`` asks for: none (False, None), lines to the log
        (True), a bar on a stream, or a new bar on a given ``Progress``'s stream."""
        stream = progress if hasattr(progress, "write") else getattr(progress, "stream", None)
        return cls(total, enabled=progress is not None and progress is not False, stream=stream)

    def update(self, msg: str = "", n: int = 1):
        self.n += n
        if not self.enabled:
            return
        frac = min(1.0, self.n / self.total)
        bar = "#" * int(frac * self.width) + "." * (self.width - int(frac * self.width))
        line = f"[{bar}] {self.n}/{self.total} {time.time() - self.t0:5.0f}s {msg}"
        if self.stream is None:
            log.info(line)
            return
        if self.tty:
            self.stream.write("\r\033[K" + line[:160])
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self):
        if self.enabled and self.tty:
            self.stream.write("\n")
            self.stream.flush()


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
    M, N, K = shape
    kw = {"profile": profile} if profile is not None else {}
    if algorithms is not None:
        kw["algorithms"] = algorithms
    mdt = model_dtype(target, dtype, operands)
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


def resolved_config(config, dtype) -> dict:
    """A config dict with the backend's "0 = the dtype's default" k slab spelled out."""
    d = _db.config_to_dict(config)
    if d.get("block_k") == 0:
        d["block_k"] = default_block_k(d, dtype)
    return d


def _default_point(a, sp, target, dtype, shape, profile, operands="native"):
    """The backend's default config as a point; the ranked space's own point when one of
    them is the same kernel (so it is built and measured once)."""
    dcfg = _space.default_config(target, dtype, a, shape=shape, operands=operands)
    if dcfg is not None:
        want = resolved_config(dcfg, dtype)
        for pt in sp.ranked:
            if resolved_config(pt.config, dtype) == want:
                return pt
    pred = (estimate(target, dtype, shape, a, dcfg, profile)["time_s"]
            if dcfg is not None else math.nan)
    return _space.Point(a, sp.ranked[0].algorithm_hash, dcfg, pred, {})


# ---- plan ----------------------------------------------------------------------------------
@dataclass
class SearchPlan:
    """The algorithms of one case, each one's ranked space and the configs' ranks in it;
    ``budget`` and ``patience`` as the search runs them (an exhaustive search: the largest
    space, no early stop)."""
    algorithms: list[str]
    spaces: dict[str, _space.Space]
    ranks: dict[str, dict[str, int]]     # algorithm → config key → position in its space
    budget: int
    patience: int


def plan_search(algo, target: str, dtype: str, shape, search: SearchOptions) -> SearchPlan:
    """Step 1: the algorithms to tune and their ranked spaces."""
    algos = _algorithms(algo, target, dtype, shape, search.top_lcmas, search.profile,
                        search.max_error, search.operands)
    spaces = {a: _space.ranked_space(target, dtype, a, shape, profile=search.profile,
                                     configs=search.configs, operands=search.operands)
              for a in algos}
    budget, patience = search.budget, search.patience
    if search.exhaustive:
        budget = max([len(sp.ranked) for sp in spaces.values()] + [1])
        patience = budget + 1
    ranks = {a: {pt.key: i for i, pt in enumerate(sp.ranked)} for a, sp in spaces.items()}
    return SearchPlan(algos, spaces, ranks, budget, patience)


def plan_points(algo, target: str, dtype: str, shape, budget: int = 8, **keywords) -> list:
    """The points ``tune`` with the same arguments would build, in its order: per algorithm
    the first ``budget`` configs of the ranked space that are not logged yet for this case
    (all of them with ``exhaustive``), after the default config when it is measured
    (``SearchOptions.with_default``).
    Early stopping can only measure fewer of them."""
    opts = TuneOptions.from_keywords(budget=budget, **keywords)
    return _planned_points(algo, target, normalize_model_dtype(dtype),
                           tuple(int(x) for x in shape), opts.search, _store(opts.log.db))


def _planned_points(algo, target, dtype, shape, search: SearchOptions, store) -> list:
    plan = plan_search(algo, target, dtype, shape, search)
    out = []
    for a in plan.algorithms:
        sp = plan.spaces[a]
        if not sp.ranked:
            continue
        done = store.measured_configs(target, dtype, sp.ranked[0].algorithm_hash, shape) \
            if search.reuse_log else set()
        if search.with_default:
            dpt = _default_point(a, sp, target, dtype, shape, search.profile, search.operands)
            if dpt.config is not None and dpt.key not in done:
                out.append(dpt)
        out += [pt for pt in sp.ranked[:plan.budget] if pt.key not in done]
    return out


def _store(db) -> _db.TuningDB:
    return db if isinstance(db, _db.TuningDB) else _db.TuningDB(db)


# ---- tune: plan → build → measure → log ------------------------------------------------------
def tune(algo, target: str, dtype: str, shape, budget: int = 8, **options) -> TuneResult:
    """Tune one shape (see the module doc).  ``algo``: ``"gemm"``, a catalogue expression
    (``"strassen"``, ``"strassen^2"``), a list of them, or ``"auto"``.  ``budget``: configs
    measured per algorithm (at most).  ``options``, by the step they steer (``TuneOptions``):

    - search: ``patience``, ``min_improvement``, ``exhaustive`` (measure every fitting
      config), ``top_lcmas`` and ``max_error`` (``"auto"``: LCMAs predicted within that
      multiple of the plain GEMM's error, costmodel.accuracy), ``operands`` (the CUDA operand
      mode searched, CudaConfig.operands; one precision per search), ``profile``,
      ``configs``, ``measure_default`` (also measure the backend's default config, logged
      with ``default: true``, for the tuned-vs-default speed-up; default: unless ``configs``
      is given), ``vendor`` (also time the
      vendor GEMM, cuBLAS / the CPU's faster of numpy and torch, on the same operands, logged
      as algorithm ``"vendor"``),
      ``reuse_log``;
    - build: ``jobs`` (parallel compile processes), ``work_dir``, ``build_fn(point,
      out_dir) -> artifact path`` (instead of ``artifact.build.build``), ``prebuilt(point) ->
      artifact path | None`` (artifacts built ahead: ``Prebuilder``, ``load_prebuilt``);
    - measure: ``repeats``, ``warmup``, ``min_run_s``, ``sustained_s`` (GPUs: warm each
      kernel up for that many seconds of back-to-back calls before timing it, so that it is
      measured at the GPU's power cap, as long runs see it (docs/tuning.md); the default
      warm-up is 0.15 s), ``measure_fn(point)`` (replaces build+measure:
      tests), ``worker`` (a ``MeasureWorker`` shared between calls, kept open);
    - log: ``db`` (a ``TuningDB`` or its directory), ``log``, ``tag`` (stored in every
      record), ``progress``."""
    return tune_with(algo, target, dtype, shape, TuneOptions.from_keywords(budget=budget, **options))


def tune_with(algo, target: str, dtype: str, shape, opts: TuneOptions) -> TuneResult:
    """``tune`` with its options as ``TuneOptions``."""
    shape = tuple(int(x) for x in shape)
    dtype = normalize_model_dtype(dtype)
    _check_request(target, opts)
    store = _store(opts.log.db)
    plan = plan_search(algo, target, dtype, shape, opts.search)
    run = _TuningRun(target, dtype, shape, opts, plan, store)
    try:
        if opts.search.vendor:
            run.measure_vendor()
        for a in plan.algorithms:
            run.tune_algorithm(a)
        run.confirm_best()
    finally:
        run.close()
    return run.result


def _check_request(target, opts: TuneOptions) -> None:
    """Refuse what cannot be tuned, before anything is planned."""
    sustained = opts.measure.sustained_s
    if sustained is not None:
        if _space.family(target) != "cuda":
            raise ValueError("sustained_s is a GPU measurement (a power-capped steady state); "
                             f"target {target} is not a CUDA target")
        if not (isinstance(sustained, (int, float)) and 0 < sustained <= 60):
            raise ValueError(f"sustained_s must be seconds in (0, 60], got {sustained!r}")


@dataclass
class _EarlyStop:
    """The search's stopping state: measurements so far and since the best last improved."""
    min_improvement: float
    best: float = math.inf
    since: int = 0
    n: int = 0

    def saw(self, t: float | None) -> None:
        """One more measurement (None: it failed)."""
        self.n += 1
        if t is not None and t < self.best * (1 - self.min_improvement):
            self.best, self.since = t, 0
        else:
            self.since += 1


class _TuningRun:
    """One ``tune`` call's steps after the plan — build, measure, log — and its state: the
    result so far, the progress bar, the compilers and the measuring process."""

    def __init__(self, target, dtype, shape, opts: TuneOptions, plan: SearchPlan, store):
        self.target, self.dtype, self.shape = target, dtype, shape
        self.opts, self.plan, self.store = opts, plan, store
        s, b, m = opts.search, opts.build, opts.measure
        self.result = TuneResult(target, dtype, shape)
        for a, sp in plan.spaces.items():
            self.result.space_sizes[a] = (len(sp.ranked), len(sp.pruned))
        total = (sum(min(plan.budget, len(sp.ranked)) for sp in plan.spaces.values())
                 + (len(plan.algorithms) if s.with_default else 0) + (1 if s.vendor else 0)
                 + (1 if s.vendor and _space.family(target) != "cuda" else 0))    # the confirmation
        progress = opts.log.progress
        self.bar = progress if isinstance(progress, Progress) else Progress.of(progress, total)
        self.device = _db.device_name(target)
        # fp8: its own measuring process (cuBLAS FP8 as the vendor, B̃ prepared, fp8 checks)
        fp8 = s.operands == "fp8" and not isinstance(m.worker, Fp8MeasureWorker)
        self.worker, self.own_worker = (None, True) if fp8 else (m.worker, m.worker is None)
        self.builder = Builder(b.jobs) if (m.measure_fn is None and b.build_fn is None) else None
        self.tmp = (tempfile.TemporaryDirectory(prefix="lcmac-tune-", dir=b.work_dir)
                    if m.measure_fn is None else None)
        # points compiled before a batch is measured: `jobs` (early stopping decides after
        # each batch); an exhaustive search has no early stop, so larger batches, each job's
        # share built by one compiler worker (one compiler import per share)
        self.batch_n = max(1, b.jobs) * (8 if s.exhaustive else 1)
        self.timing = {"warmup": m.warmup, "repeats": m.repeats, "min_run_s": m.min_run_s}
        if m.sustained_s is not None:
            self.timing["warm_s"] = float(m.sustained_s)
        # on a CPU beside the vendor baseline, each kernel is timed in rounds alternating with
        # it (measure.time_paired): a shared VM's speed moves more than the decision's margins
        cpu = _space.family(target) != "cuda"
        self._paired = {"paired": True} if (s.vendor and cpu) else {}
        self._paths: dict = {}          # point key → its artifact, for the confirmation

    # ---- build ------------------------------------------------------------------------------
    def build(self, points) -> list[tuple[str | None, str]]:
        """(artifact path, "") or (None, why) per point: ``build_fn``, else ``prebuilt``,
        else the compile workers."""
        b = self.opts.build
        root = Path(self.tmp.name)
        built: list = [None] * len(points)
        for i, pt in enumerate(points):
            try:
                if b.build_fn is not None:
                    built[i] = (str(b.build_fn(pt, str(root / f"a{abs(hash(pt.key)) % 10**10}"))), "")
                elif b.prebuilt is not None:
                    path = b.prebuilt(pt)
                    if path:
                        built[i] = (str(path), "")
            except Exception as e:  # noqa: BLE001 - reported as a failed trial
                msg = str(e).strip().splitlines()
                built[i] = (None, f"build failed: {type(e).__name__}: {msg[-1] if msg else ''}")
        rest = [i for i, x in enumerate(built) if x is None]
        if rest:
            if self.builder is None:
                self.builder = Builder(b.jobs)
            for i, x in zip(rest, self.builder.build([points[i] for i in rest], self.target,
                                                     self.dtype, self.shape, root)):
                built[i] = x
        return built

    # ---- measure ----------------------------------------------------------------------------
    def _measuring_process(self):
        if self.worker is None:
            self.worker = Fp8MeasureWorker() if self.opts.search.operands == "fp8" else MeasureWorker()
        return self.worker

    def measure(self, points) -> list[dict]:
        """One measurement dict per point (``status``, ``time_s``, ``spread``, …)."""
        fn = self.opts.measure.measure_fn
        if fn is not None:
            return [_measured_by(fn, pt) for pt in points]
        out = []
        for pt, (path, err) in zip(points, self.build(points)):
            if path is None:
                out.append({"status": "error", "error": err})
                continue
            self._paths[pt.key] = path
            out.append(self._measuring_process().measure(path, self.target, self.dtype,
                                                         self.shape, **self.timing,
                                                         **self._paired))
        return out

    def confirm_best(self) -> None:
        """On a CPU beside the vendor: the kernel of this run with the best ratio to the
        vendor of its own rounds, timed again beside it over three times the rounds and
        logged with ``confirm``.  The decision compares that ratio with the vendor's: the
        best of many noisy ratios is biased upwards (measured_decision.confirmed_ratio)."""
        ran = [t for t in self.result.ok_trials() if (t.record or {}).get("vendor_paired_s")
               and t.point.key in self._paths]
        if not self._paired or not ran:
            return
        best = max(ran, key=lambda t: t.record["vendor_paired_s"] / t.time_s)
        timing = {**self.timing, "repeats": 3 * self.timing["repeats"]}
        m = self._measuring_process().measure(self._paths[best.point.key], self.target, self.dtype,
                                              self.shape, **timing, **self._paired)
        self.log(best.point, m, confirm=True)
        if m.get("status", "ok") == "ok" and m.get("vendor_paired_s"):
            self.bar.update(f"confirmed {best.point.algorithm}: {m['vendor_paired_s'] / m['time_s']:.3f}x "
                            f"the vendor over {timing['repeats']} rounds")

    def measure_vendor(self) -> None:
        """The vendor GEMM of the same shape, the same run's baseline."""
        operands = self.opts.search.operands
        vcfg = {"library": "vendor", **({"operands": operands} if operands != "native" else {})}
        fn = self.opts.measure.measure_fn
        if fn is not None:
            m = _measured_by(fn, _space.Point(_db.VENDOR, _db.VENDOR, vcfg, math.nan, {}))
        else:
            m = self._measuring_process().measure_vendor(self.target, self.dtype, self.shape,
                                                         operands=operands, **self.timing)
        vcfg = m.pop("config", None) or vcfg
        if m.get("status", "ok") == "ok":
            self.result.vendor_time, self.result.vendor_config = float(m["time_s"]), vcfg
            self.log(_space.Point(_db.VENDOR, _db.VENDOR, vcfg, math.nan, {}), m)
            others = self._other_vendor_apis(vcfg)
            beside = (f"; the log also holds {', '.join(others)} records at this shape (another "
                      "library: the decision takes the faster)") if others else ""
            self.bar.update(f"vendor {vcfg.get('api', '')} ({vcfg.get('library', '')}) "
                            f"{self.result.vendor_time * 1e3:.3f} ms{beside}")
        else:
            self.bar.update(f"vendor failed: {m.get('error', '')[:60]}")

    def _other_vendor_apis(self, vcfg: dict) -> list[str]:
        """The apis of this shape's logged vendor records other than ``vcfg``'s (numpy.matmul
        records beside a torch.matmul baseline, say)."""
        api = vcfg.get("api")
        if api is None:
            return []
        recs = self.store.query(self.target, self.dtype, algorithm_hash=_db.VENDOR, shape=self.shape)
        return sorted({r["config"].get("api", "?") for r in recs
                       if r["config"].get("api", "?") != api and r.get("device") == self.device})

    def measure_default(self, a: str, sp) -> None:
        """The backend's default config of ``a`` (from the log when measured before)."""
        s = self.opts.search
        dpt = _default_point(a, sp, self.target, self.dtype, self.shape, s.profile, s.operands)
        prev = [r for r in self.store.query(self.target, self.dtype, algorithm_hash=dpt.algorithm_hash,
                                            shape=self.shape)
                if _db.config_key(r["config"]) == dpt.key] if s.reuse_log else []
        if prev:  # measured before: not re-run
            r = min(prev, key=lambda r: r["time_s"])
            self.result.trials.append(Trial(dpt, r["time_s"], r.get("spread"), from_log=True,
                                            record=r, default=True))
            self.bar.update(f"{a} default config (from log) {r['time_s'] * 1e3:.3f} ms")
            return
        m = self.measure([dpt])[0]
        if m.get("status", "ok") != "ok":
            self.bar.update(f"{a} default config failed: {m.get('error', '')[:60]}")
            return
        t = float(m["time_s"])
        rec = self.log(dpt, m, default=True) if dpt.config is not None else None
        # a candidate like the ranked configs: the summary's best and the build (which takes
        # the log's best) may be the default
        self.result.trials.append(Trial(dpt, t, m.get("spread"), record=rec, default=True))
        self.bar.update(f"{a} default config {t * 1e3:.3f} ms")

    # ---- the search -------------------------------------------------------------------------
    def tune_algorithm(self, a: str) -> None:
        """Measure ``a``'s ranked configs in model order until the budget or the patience
        runs out; ``result.stopped[a]`` says which."""
        sp = self.plan.spaces[a]
        if not sp.ranked:
            self.result.stopped[a] = "no config fits on chip"
            return
        if self.opts.search.with_default:
            self.measure_default(a, sp)
        done, logged = self._logged(sp.ranked[0].algorithm_hash)
        budget, patience = self.plan.budget, self.plan.patience
        stop = _EarlyStop(self.opts.search.min_improvement)
        queue = list(sp.ranked)
        reason = "space exhausted"
        while queue and stop.n < budget:
            batch = []
            while queue and len(batch) < self.batch_n and stop.n + len(batch) < budget:
                pt = queue.pop(0)
                if pt.key not in done:
                    batch.append(pt)
                elif pt.key in logged:    # already measured: counts as a trial, not re-run
                    r = logged[pt.key]
                    self.result.trials.append(Trial(pt, r["time_s"], r.get("spread"), from_log=True, record=r))
                    self.bar.update(f"{a} (from log) {r['time_s'] * 1e3:.3f} ms")
                    stop.saw(r["time_s"])
            for pt, m in zip(batch, self.measure(batch) if batch else []):
                stop.saw(self._trial(a, pt, m))
            if stop.n >= budget and not self.opts.search.exhaustive:
                reason = f"budget of {budget} measurements"
            elif stop.since >= patience and math.isfinite(stop.best):
                reason = f"no improvement in {stop.since} measurements (patience {patience})"
                break
        self.result.stopped[a] = reason

    def _logged(self, algorithm_hash: str) -> tuple[set, dict]:
        """(keys of configs logged for this case, errors included; the best ok record of
        each) — empty without ``reuse_log``."""
        if not self.opts.search.reuse_log:
            return set(), {}
        done = self.store.measured_configs(self.target, self.dtype, algorithm_hash, self.shape)
        logged: dict = {}
        if done:
            for r in self.store.query(self.target, self.dtype, algorithm_hash=algorithm_hash,
                                      shape=self.shape):
                k = _db.config_key(r["config"])
                if k not in logged or r["time_s"] < logged[k]["time_s"]:
                    logged[k] = r
        return done, logged

    def _trial(self, a: str, pt, m: dict) -> float | None:
        """Log one measurement and add it to the result; its time (None: it failed)."""
        rec = self.log(pt, m)
        if m.get("status", "ok") != "ok":
            self.result.trials.append(Trial(pt, None, status="error", error=m.get("error", ""), record=rec))
            self.bar.update(f"{a} failed: {m.get('error', '')[:60]}")
            return None
        t = float(m["time_s"])
        self.result.trials.append(Trial(pt, t, m.get("spread"), record=rec))
        paired = m.get("vendor_paired_s")
        beside = f", {paired / t:.3f}x the vendor in the same rounds" if paired else ""
        self.bar.update(f"{a} {t * 1e3:.3f} ms (model {pt.predicted_s * 1e3:.3f}{beside})")
        return t

    # ---- log --------------------------------------------------------------------------------
    def log(self, pt, m: dict, **extra) -> dict:
        """The tuning-log record of one measurement (appended unless ``log=False``)."""
        lo = self.opts.log
        if lo.tag:
            extra["tag"] = lo.tag
        sp = self.plan.spaces.get(pt.algorithm)
        if sp is not None:
            extra.setdefault("space_size", len(sp.ranked))
            r = self.plan.ranks[pt.algorithm].get(pt.key)
            if r is not None:
                extra.setdefault("rank", r)
        for k in ("inner", "input_sets", "warm_s", "vendor_paired_s", "vendor_api"):
            if m.get(k) is not None:
                extra.setdefault(k, m[k])
        pred = pt.predicted_s if (pt.predicted_s is not None and math.isfinite(pt.predicted_s)) else None
        ok = m.get("status", "ok") == "ok"
        rec = _db.make_record(target=self.target, dtype=self.dtype, algorithm=pt.algorithm,
                              algorithm_hash=pt.algorithm_hash, shape=self.shape, config=pt.config,
                              time_s=m.get("time_s") if ok else None, spread=m.get("spread"),
                              repeats=m.get("repeats", self.opts.measure.repeats), predicted_s=pred,
                              status=m.get("status", "ok"), error=m.get("error"),
                              device=self.device, **extra)
        if lo.log:
            self.store.append(rec)
        return rec

    def close(self) -> None:
        self.bar.close()
        if self.worker is not None and self.own_worker:
            self.worker.close()
        if self.builder is not None:
            self.builder.close()
        if self.tmp is not None:
            self.tmp.cleanup()


def _measured_by(fn, pt) -> dict:
    try:
        return _normalize_measurement(fn(pt))
    except Exception as e:  # noqa: BLE001 - a failed trial
        return {"status": "error", "error": f"{type(e).__name__}: {e}"}


# ---- many shapes ------------------------------------------------------------------------------
def tune_many(cases, algo, target: str, dtype: str, budget: int = 8, *, prebuilt: str | None = None,
              build_dir: str | None = None, build_only: bool = False,
              on_result: Callable | None = None, **options) -> list[TuneResult]:
    """Tune several shapes (``cases``: [(label, (M, N, K))]) with one shared measuring
    process; ``options`` as ``tune``'s (``jobs``: compile threads).  Compiling overlaps
    measuring (see the module doc): every planned point goes to one ``Prebuilder`` of
    ``jobs`` threads at once, in case order, and each case is measured when its artifacts
    are done.  ``prebuilt``: a directory of artifacts built earlier (``index.jsonl``), used
    first.  ``build_dir``: keep the artifacts there (default: a temporary directory).
    ``build_only``: compile and index, measure nothing (returns [])."""
    dtype = normalize_model_dtype(dtype)
    opts = TuneOptions.from_keywords(budget=budget, **options)
    store = _store(opts.log.db)
    old = load_prebuilt(prebuilt) if prebuilt else None
    tmp = None
    if build_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="lcmac-prebuild-")
        build_dir = tmp.name
    pre = Prebuilder(opts.build.jobs, build_dir, nice=0 if build_only else 10)
    results: list[TuneResult] = []
    worker = None
    try:
        for _, shape in cases:
            for pt in _planned_points(algo, target, dtype, tuple(int(x) for x in shape),
                                      opts.search, store):
                if old is None or old(pt, target, dtype, shape) is None:
                    pre.submit(pt, target, dtype, shape)
        if build_only:
            bar = Progress.of(opts.log.progress, len(pre.futs))
            for _ in cf.as_completed(list(pre.futs.values())):
                bar.update(f"built ({pre.failed} failed)")
            bar.close()
            if pre.futs and not pre.built:      # nothing to measure later: say why (e.g. no TileLang)
                raise next(f.exception() for f in pre.futs.values() if f.exception())
            return []
        worker = (Fp8MeasureWorker if opts.search.operands == "fp8" else MeasureWorker)()
        for label, shape in cases:
            shape = tuple(int(x) for x in shape)

            def lookup(pt, shape=shape):
                p = old(pt, target, dtype, shape) if old is not None else None
                return p or pre.get(pt, target, dtype, shape)
            case = replace(opts, build=replace(opts.build, jobs=1, prebuilt=lookup),
                           measure=replace(opts.measure, worker=worker),
                           log=replace(opts.log, db=store))
            r = tune_with(algo, target, dtype, shape, case)
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
