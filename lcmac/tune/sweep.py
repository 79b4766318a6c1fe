"""The calibration sweep (``lcmac calibrate``): a compact tuning run on the device at hand,
into the user's tuning log, after which the decisions on this device read its own records
(``lcmac.policy.devices``; a plan kept in memory is made again once the log has grown).

``calibrate_device(target, dtype)`` tunes each shape of ``calibration_shapes`` in turn with
``lcmac.tune.tuner``: the plain GEMM and the cost model's best LCMAs (``top_lcmas``), each
its default config and ``budget`` more, beside the vendor GEMM; every record carries the
device's identity.  It starts no shape once ``budget_s`` seconds are spent, or when the last
shape's time, scaled by the next one's FLOPs, would overrun them.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from lcmac.artifact import tuning_log as _db
from lcmac.core.dtypes import normalize_model_dtype
from lcmac.core.errors import LcmacError
from lcmac.spec.device import DeviceIdentity, device_here
from lcmac.tune import tuner

__all__ = ["SIZES", "Calibrated", "calibration_shapes", "calibrate_device"]

#: the square sides measured by default, per device kind: the decisions' usual range there
SIZES = {"cpu": (1024, 2048), "cuda": (4096, 8192, 16384)}


@dataclass
class Calibrated:
    """What a sweep did: the ``device``, the log written (``logs``), each shape's
    ``TuneResult`` in ``results``, the shapes ``skipped`` for the time budget, seconds
    spent."""
    device: DeviceIdentity
    target: str
    dtype: str
    logs: str
    results: list = field(default_factory=list)
    skipped: list = field(default_factory=list)
    seconds: float = 0.0


def calibration_shapes(target: str, sizes=None) -> list[tuple[int, int, int]]:
    """The squares of ``sizes`` (default ``SIZES`` of the target's kind), smallest first."""
    kind = "cuda" if str(target).startswith("cuda") else "cpu"
    sides = sorted({int(n) for n in (sizes or SIZES[kind])})
    if not sides or sides[0] < 1:
        raise ValueError(f"calibration sizes must be positive, got {sizes!r}")
    return [(n, n, n) for n in sides]


def calibrate_device(target: str, dtype: str = "float32", shapes=None, *, budget: int = 1,
                     top_lcmas: int = 2, budget_s: float = 600.0, db=None, progress=False,
                     measure_for: Callable | None = None, on_shape: Callable | None = None,
                     **tune_options) -> Calibrated:
    """Measure a compact sweep on the device at hand (module doc).  ``shapes``: (M, N, K)
    tuples (default ``calibration_shapes``); ``db``: the log (default the user's);
    ``measure_for(shape)``: a ``measure_fn`` for the tuner at that shape instead of building
    and timing kernels (dry runs, tests); ``on_shape(i, n, shape)`` is called before each
    shape.  LcmacError where no device here runs ``target``'s code (and no ``measure_for``)."""
    d = normalize_model_dtype(dtype)
    here = device_here(target)
    if here is None and measure_for is None:
        raise LcmacError(f"lcmac calibrate measures the device at hand, and no device here runs "
                         f"{target} code; run it on that device")
    if not (isinstance(budget_s, (int, float)) and budget_s > 0):
        raise ValueError(f"budget_s must be a positive number of seconds, got {budget_s!r}")
    shapes = [tuple(int(x) for x in s) for s in (shapes or calibration_shapes(target))]
    store = db if isinstance(db, _db.TuningDB) else _db.TuningDB(db)
    kind = "cuda" if str(target).startswith("cuda") else "cpu"
    out = Calibrated(here or DeviceIdentity(_db.device_name(target), kind), str(target), d,
                     str(store.root))
    t0, last = time.perf_counter(), None
    for i, shape in enumerate(shapes):
        spent = time.perf_counter() - t0
        foreseen = 0.0 if last is None else _foreseen(kind, last, shape)
        if spent >= budget_s or spent + foreseen > budget_s:
            out.skipped = shapes[i:]
            break
        if on_shape is not None:
            on_shape(i, len(shapes), shape)
        start = time.perf_counter()
        fake = measure_for(shape) if measure_for is not None else None
        out.results.append(tuner.tune("auto", target, d, shape, budget=budget,
                                      top_lcmas=top_lcmas, vendor=True, db=store,
                                      progress=progress, measure_fn=fake, **tune_options))
        last = (shape, time.perf_counter() - start)
    out.seconds = time.perf_counter() - t0
    return out


def _foreseen(kind: str, last, shape) -> float:
    """Seconds the next shape's sweep will take, from the last one's (shape, seconds): on a
    CPU its timed calls dominate (seconds each), so it scales with the work; on a GPU its
    compiles do (tens of seconds each, the same for every shape) while the timing runs for a
    fixed time per kernel, so it takes as long again."""
    return last[1] * (_flops(shape) / _flops(last[0]) if kind == "cpu" else 1.0)


def _flops(shape) -> float:
    M, N, K = shape
    return 2.0 * M * N * K
