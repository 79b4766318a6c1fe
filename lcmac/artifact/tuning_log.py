"""The tuning-log database: one JSON object per line, one file per (target, dtype).

Layout (human-readable and diffable)::

    <logs>/<target>-<dtype>.jsonl     e.g. lcmac/data/tuning_logs/x86_64-avx512-float32.jsonl

Every line is a record of one measurement, written with sorted keys::

    {"algorithm": "strassen^2", "algorithm_hash": "…", "config": {...}, "date": "2025-…Z",
     "device": "Intel(R) Xeon(R) …", "device_id": {"name": "Intel(R) Xeon(R) …", "cores": 2,
     …}, "dtype": "float32", "lcmac_version": "0.1.0",
     "predicted_s": 0.0123, "repeats": 5, "schema": "lcmac-tune/1", "shape": [M, N, K],
     "spread": 0.02, "status": "ok", "target": "x86_64-avx512", "time_s": 0.0119}

``time_s`` is the median of ``repeats`` timed runs after warm-up; ``spread`` is
(max − min) / median of those runs.  ``status`` is ``"ok"`` or ``"error"`` (a config that
failed to build or to run is logged too, with ``time_s`` null and an ``error`` line, so a
later tuning run does not retry it).  Plain GEMM is logged under algorithm ``"gemm"`` with
hash ``"gemm"``; the vendor GEMM measured as the baseline in the same run (torch.matmul =
cuBLAS on a GPU, numpy.matmul on a CPU; ``config`` says which library and how it was called)
under algorithm and hash ``"vendor"``.  The tuner adds ``rank`` (the config's position in
the model's ranking, 0 = predicted best), ``space_size`` (fitting configs of that space),
``inner`` (calls per timed run) and, when asked, ``tag`` (e.g. ``"exhaustive"``) and
``default: true`` (the backend's default config).  ``schedule_version`` is the generation of
the backend's templates the record was measured on (``SCHEDULE_VERSION`` in
``lcmac/schedules/<backend>_config.py``; absent = 1).  Reading skips lcmac records of an
older generation than the installed one — their timings describe code that no longer
exists — so builds, the tuner and ``scripts/eval_tuner.py`` never act on them
(``include_stale=True`` reads them); vendor records are timings of the vendor library and
never go stale this way.

``device`` names the device measured on; ``device_id`` (records since device identities,
``lcmac.spec.device``) adds what tells devices of one name apart (SM count, clocks, power
limit; a CPU's cores and instruction-set flags).  ``records(..., device=identity)`` reads only
the records measured on one device; a record without ``device_id`` counts by its name.

Reading never crashes a build: a line that is not JSON, or not an lcmac-tune record, or a
record for another target/dtype, is skipped with ``warnings.warn``.

Where the logs live: ``$LCMAC_TUNING_LOGS`` if set, the one directory read and written.
Else reading takes the logs lcmac ships (package data ``lcmac/data/tuning_logs``) and then
the user's own, ``tuning_logs/`` in lcmac's cache root (``lcmac.core.cachedir``; by default
``~/.cache/lcmac/tuning_logs``), where new records go: an installed package's directory
may be read-only.
"""
from __future__ import annotations

import datetime as _dt
import json
import math
import os
import re
import warnings
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Iterable, Iterator

from lcmac.core.cachedir import cache_root
from lcmac.core.errors import ArtifactError
from lcmac.ir import catalogue
from lcmac.spec.device import DeviceIdentity, cpu_identity, measuring_device
from lcmac.spec.registry import FAMILIES
from lcmac.spec.targets import schedule_family
from lcmac.core.version import __version__

SCHEMA = "lcmac-tune/1"
GEMM = "gemm"
VENDOR = "vendor"   # the vendor library's GEMM (cuBLAS / numpy's BLAS), the baseline
#: records appended by this process (any log): decisions kept elsewhere compare it, so a
#: record this process writes is seen by its next call at once, not after a file check
appended = 0
_REQUIRED = {"schema", "target", "dtype", "algorithm", "algorithm_hash", "shape", "config", "status"}


class TuningLogWarning(UserWarning):
    """A line of a tuning log that was skipped (corrupt, foreign, or misfiled)."""


# ---- where -------------------------------------------------------------------------------
def shipped_dir() -> Path:
    """The logs that ship with lcmac (package data): the measurements a decision starts from."""
    return Path(str(resources.files("lcmac") / "data" / "tuning_logs"))


def default_dir() -> Path:
    """Where records go when no directory is given: ``$LCMAC_TUNING_LOGS`` if set, else
    ``tuning_logs/`` in lcmac's cache root."""
    env = os.environ.get("LCMAC_TUNING_LOGS")
    if env:
        return Path(env)
    user = _user_dir()
    if user is None:
        raise ArtifactError("no directory for new tuning-log records: LCMAC_CACHE_DIR=off turns "
                            "lcmac's own off; set LCMAC_TUNING_LOGS to a writable directory (or "
                            "pass one: lcmac tune --logs DIR)")
    return user


def default_dirs() -> list[Path]:
    """Where records are read from when no directory is given, in this order: the one
    ``$LCMAC_TUNING_LOGS`` if set (a log of its own, nothing shipped mixed in); else the
    shipped logs, then the user's records, as if appended to them."""
    env = os.environ.get("LCMAC_TUNING_LOGS")
    if env:
        return [Path(env)]
    user = _user_dir()
    return [shipped_dir()] + ([user] if user is not None else [])


def _user_dir() -> Path | None:
    root = cache_root()
    return None if root is None else root / "tuning_logs"


def log_path(root: str | os.PathLike, target: str, dtype: str) -> Path:
    safe = lambda s: re.sub(r"[^A-Za-z0-9_.+-]", "_", str(s))  # noqa: E731
    return Path(root) / f"{safe(target)}-{safe(dtype)}.jsonl"


# ---- what --------------------------------------------------------------------------------
def device_name(target: str = "") -> str:
    """A human-readable name of the device measurements run on (CPU model or GPU name)."""
    return (measuring_device(target) or cpu_identity()).name


def _device_fields(target: str, device: str | None) -> dict:
    """``device`` and, where the device is the one measuring here, ``device_id`` of a new
    record (a caller naming another device gets the name alone)."""
    here = measuring_device(target)
    if not device:
        device = here.name if here is not None else cpu_identity().name
    return {"device": device, **({"device_id": here.to_dict()}
                                 if here is not None and here.name == device else {})}


def algo_identity(algo) -> tuple[str, str]:
    """(name, hash) of an algorithm given as a name, an ``ir.Algorithm`` or ``"gemm"``."""
    if algo is None or (isinstance(algo, str) and algo.lower() in ("gemm", "naive", "none")):
        return GEMM, GEMM
    if isinstance(algo, str) and algo.lower() == VENDOR:
        return VENDOR, VENDOR
    if isinstance(algo, str):
        algo = catalogue.get(algo)
    return algo.name, algo.hash


def config_to_dict(config) -> dict:
    """A config as a plain JSON-able dict (dataclasses, objects with ``to_dict``, dicts)."""
    if config is None:
        return {}
    if isinstance(config, dict):
        return {str(k): _plain(v) for k, v in config.items()}
    if hasattr(config, "to_dict"):
        return _plain(config.to_dict())
    import dataclasses
    if dataclasses.is_dataclass(config):
        return _plain(dataclasses.asdict(config))
    raise TypeError(f"cannot log a config of type {type(config).__name__}; give a dict or a dataclass")


def _plain(v):
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if hasattr(v, "item") and not isinstance(v, (str, bytes)):  # numpy scalars
        return v.item()
    return v


def make_record(*, target: str, dtype: str, algorithm: str, algorithm_hash: str, shape,
                config, time_s: float | None, spread: float | None = None, repeats: int = 0,
                predicted_s: float | None = None, status: str = "ok", error: str | None = None,
                device: str | None = None, **extra) -> dict:
    rec = {"schema": SCHEMA, "target": target, "dtype": dtype, "algorithm": algorithm,
           "algorithm_hash": algorithm_hash, "shape": [int(x) for x in shape],
           "config": config_to_dict(config), "time_s": None if time_s is None else float(time_s),
           "spread": None if spread is None else round(float(spread), 4), "repeats": int(repeats),
           "predicted_s": None if predicted_s is None else float(predicted_s),
           "status": status, **_device_fields(target, device),
           "lcmac_version": __version__, "schedule_version": current_schedule(target),
           "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}
    if error:
        lines = [ln.strip() for ln in str(error).splitlines() if ln.strip()]
        # the first line says what failed, the last often where (tracebacks, CUDA hints)
        msg = lines[0] if len(lines) < 2 else f"{lines[0]} … {lines[-1]}"
        rec["error"] = msg[:300] if lines else "error"
    rec.update({k: _plain(v) for k, v in extra.items()})
    return rec


def current_schedule(target: str) -> int:
    """The installed templates' generation for ``target``'s backend."""
    return FAMILIES[schedule_family(target)].schedule_version


def is_stale(rec, current: int) -> bool:
    """An lcmac record measured on an older generation of the templates than ``current``."""
    return rec["algorithm_hash"] != VENDOR and int(rec.get("schedule_version", 1)) < current


def _valid(rec) -> str | None:
    """Why ``rec`` is not a usable record (None when it is)."""
    if not isinstance(rec, dict):
        return "not a JSON object"
    if rec.get("schema") != SCHEMA:
        return f"schema {rec.get('schema')!r} is not {SCHEMA!r}"
    missing = _REQUIRED - set(rec)
    if missing:
        return f"missing {', '.join(sorted(missing))}"
    s = rec["shape"]
    if not (isinstance(s, list) and len(s) == 3 and all(isinstance(x, int) and x > 0 for x in s)):
        return f"bad shape {s!r}"
    if rec["status"] == "ok":
        t = rec.get("time_s")
        if not isinstance(t, (int, float)) or not (t > 0) or math.isinf(t):
            return f"status ok but time_s {t!r}"
    if not isinstance(rec["config"], dict):
        return "config is not an object"
    return None


# ---- the database ------------------------------------------------------------------------
@dataclass
class Match:
    """The answer of a query: the record, and whether its shape is the one asked for."""
    record: dict
    exact: bool
    distance: float  # log-space distance between the asked and the logged shape

    @property
    def config(self) -> dict:
        return self.record["config"]

    def describe(self) -> str:
        r = self.record
        shp = "x".join(map(str, r["shape"]))
        kind = "exact shape" if self.exact else f"nearest logged shape {shp} (log-distance {self.distance:.2f})"
        return (f"tuned config from {kind}: {r['algorithm']} {json.dumps(r['config'], sort_keys=True)} "
                f"measured {r['time_s'] * 1e3:.3f} ms on {r.get('device', '?')}")


class TuningDB:
    """Append-only JSON Lines logs: ``root``, the one directory read and written, or by
    default the shipped logs and the user's (``default_dirs``), new records in the user's."""

    def __init__(self, root: str | os.PathLike | None = None):
        self._root = Path(root) if root is not None else None
        self.roots = [self._root] if root is not None else default_dirs()

    @property
    def root(self) -> Path:
        """Where new records go: the directory given, else ``default_dir()``."""
        return self._root if self._root is not None else default_dir()

    # writing
    def append(self, records: dict | Iterable[dict]) -> int:
        if isinstance(records, dict):
            records = [records]
        by_file: dict[Path, list[str]] = {}
        for r in records:
            why = _valid(r)
            if why:
                raise ValueError(f"refusing to log an invalid record ({why}): {r!r}")
            by_file.setdefault(log_path(self.root, r["target"], r["dtype"]), []).append(
                json.dumps(r, sort_keys=True, separators=(", ", ": "), allow_nan=False))
        n = 0
        for path, lines in by_file.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "a", encoding="utf-8") as f:  # one write per batch: whole lines
                f.write("".join(line + "\n" for line in lines))
            n += len(lines)
        global appended
        appended += n
        return n

    # reading
    def files(self) -> list[Path]:
        return [f for d in self.roots if d.is_dir() for f in sorted(d.glob("*.jsonl"))]

    def records(self, target: str | None = None, dtype: str | None = None, *,
                include_errors: bool = False, include_stale: bool = False,
                device: DeviceIdentity | None = None) -> Iterator[dict]:
        """Every valid record (of one target/dtype when given); bad lines warn and are skipped,
        records of older templates (``is_stale``) are skipped unless ``include_stale``;
        ``device``: only the records measured on it (``DeviceIdentity.measured_on``)."""
        current = {}
        if target is not None and dtype is not None:
            paths = [log_path(d, target, dtype) for d in self.roots]
        else:
            paths = self.files()
        for path in paths:
            if not path.is_file():
                continue
            with open(path, encoding="utf-8", errors="replace") as f:
                for no, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        rec = json.loads(line)
                    except json.JSONDecodeError as e:
                        warnings.warn(f"{path}:{no}: skipped a corrupt tuning-log line ({e.msg})",
                                      TuningLogWarning, stacklevel=2)
                        continue
                    why = _valid(rec)
                    if why:
                        warnings.warn(f"{path}:{no}: skipped a foreign tuning-log line ({why})",
                                      TuningLogWarning, stacklevel=2)
                        continue
                    if (target is not None and rec["target"] != target) or \
                            (dtype is not None and rec["dtype"] != dtype):
                        if target is not None and dtype is not None:
                            warnings.warn(f"{path}:{no}: skipped a record for {rec['target']}/"
                                          f"{rec['dtype']} filed under {target}/{dtype}",
                                          TuningLogWarning, stacklevel=2)
                        continue
                    if rec["status"] != "ok" and not include_errors:
                        continue
                    if device is not None and not device.measured_on(rec):
                        continue
                    if not include_stale:
                        if rec["target"] not in current:
                            current[rec["target"]] = current_schedule(rec["target"])
                        if is_stale(rec, current[rec["target"]]):
                            continue
                    yield rec

    def stale_count(self, target: str, dtype: str) -> int:
        """Records of this target/dtype that reading skips as measured on older templates."""
        cur = current_schedule(target)
        return sum(is_stale(r, cur) for r in self.records(target, dtype, include_errors=True,
                                                             include_stale=True))

    def query(self, target: str, dtype: str, *, algorithm_hash: str | None = None,
              shape=None, config_filter=None) -> list[dict]:
        out = []
        for r in self.records(target, dtype):
            if algorithm_hash is not None and r["algorithm_hash"] != algorithm_hash:
                continue
            if shape is not None and tuple(r["shape"]) != tuple(shape):
                continue
            if config_filter is not None and not config_filter(r["config"]):
                continue
            out.append(r)
        return out

    def best(self, target: str, dtype: str, algorithm_hash: str | None, shape, *,
             nearest: bool = True, operands: str = "native") -> Match | None:
        """The fastest record for the exact shape (``_fastest``: relative to the vendor GEMM in
        the same rounds where records have it); else (``nearest``) the fastest record of the
        logged shape nearest in log space (distance = ‖log M,N,K − log M',N',K'‖₂).  Only
        records of one CUDA operand mode (``operands``; CPU records have none = native):
        a faster config of another precision is not a better config of this one."""
        recs = self.query(target, dtype, algorithm_hash=algorithm_hash,
                          config_filter=lambda c: operands_of(c) == operands)
        if not recs:
            return None
        shape = tuple(int(x) for x in shape)
        by_shape: dict[tuple, list[dict]] = {}
        for r in recs:
            by_shape.setdefault(tuple(r["shape"]), []).append(r)
        if shape in by_shape:
            return Match(_fastest(by_shape[shape]), True, 0.0)
        if not nearest:
            return None
        d, s = min((shape_distance(shape, s), s) for s in by_shape)
        return Match(_fastest(by_shape[s]), False, d)

    def measured_configs(self, target: str, dtype: str, algorithm_hash: str, shape) -> set[str]:
        """Keys of configs already measured (or failed) for this exact case: not re-run."""
        return {config_key(r["config"]) for r in self.records(target, dtype, include_errors=True)
                if r["algorithm_hash"] == algorithm_hash and tuple(r["shape"]) == tuple(shape)}


def _fastest(records: list[dict]) -> dict:
    """The best of one shape's records: where some were timed in rounds beside the vendor GEMM
    (``vendor_paired_s``, CPU), the one with the best time relative to it, among those, since
    that ratio does not move with the machine's speed between runs (by raw time an older
    record from a fast spell of a shared machine outruns a newer, better config); else the
    fastest."""
    paired = [r for r in records if r.get("vendor_paired_s")]
    if paired:
        return min(paired, key=lambda r: r["time_s"] / r["vendor_paired_s"])
    return min(records, key=lambda r: r["time_s"])


def operands_of(config) -> str:
    """The CUDA operand mode of a logged config (CudaConfig.operands; absent = native)."""
    return (config or {}).get("operands") or "native"


def config_key(config) -> str:
    return json.dumps(config_to_dict(config), sort_keys=True)


def shape_distance(a, b) -> float:
    return math.sqrt(sum((math.log(x) - math.log(y)) ** 2 for x, y in zip(a, b)))


def best_config(target: str, dtype: str, algo_hash: str, shape, *, root=None,
                operands: str = "native"):
    """The best logged config for ``shape`` (exact, else the nearest logged shape).

    Returns ``(config: dict, record: dict, exact: bool)`` or None when nothing is logged for
    this target, dtype and algorithm.  ``lcmac.build`` calls this when no config is given.
    """
    m = TuningDB(root).best(target, dtype, algo_hash, shape, operands=operands)
    if m is None:
        return None
    return _known_knobs(target, m.config), m.record, m.exact


def _known_knobs(target: str, config: dict) -> dict:
    """The logged config without knobs the backend's config class no longer has (a log
    outlives code changes; an unknown key would make the build refuse the config)."""
    try:
        import dataclasses
        cls = FAMILIES[schedule_family(target)].config_class
        if cls is None or not dataclasses.is_dataclass(cls):
            return dict(config)
        names = {f.name for f in dataclasses.fields(cls)}
    except Exception:  # noqa: BLE001
        return dict(config)
    gone = sorted(set(config) - names)
    if gone:
        warnings.warn(f"tuned config for {target}: ignoring knobs the backend no longer has: "
                      f"{', '.join(gone)}", TuningLogWarning, stacklevel=3)
    return {k: v for k, v in config.items() if k in names}
