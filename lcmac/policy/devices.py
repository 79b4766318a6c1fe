"""Which measurements a decision rests on: those of the device at hand.

Measurements do not carry between devices: an H200 has the H100's compute and half again its
memory bandwidth, so kernels rank differently there, and one H100 capped at 500 W is not one
at 700 W.  A decision (``lcmac.policy.measured``) therefore reads only the tuning records
measured on the device it decides for (``lcmac.spec.device``: the GPU present or this CPU,
where it runs the target's code; ``LCMAC_DEVICE`` to choose), and its ``why`` says so.  The
records of other devices are not used, not even as a prior: how far they are off depends on
what differs, which their records cannot tell.

A device with no records of its own is priced by a cost-model profile fitted to it
(``lcmac.tune.device_profile``), measured lazily by the first decision that needs it (seconds;
then kept in the cache directory for the device, lcmac version and schema): its vendor GEMM
is priced at the rate measured, so an LCMA is chosen only where the fitted model puts it ahead
of the vendor by the margin for times not measured at the shape.  Where no device of the
target is here (a decision for another machine), every device's records count.
"""
from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass

from lcmac.artifact import tuning_log as _db
from lcmac.core.cachedir import cache_root
from lcmac.core.dtypes import normalize_model_dtype
from lcmac.core.environ import reader
from lcmac.core.errors import LcmacError
from lcmac.spec.device import ANY, ENV, DeviceIdentity, device_at_hand, measuring_device

__all__ = ["AT_HAND", "Basis", "DeviceView", "basis_for", "decision_state"]


class _AtHand:
    def __repr__(self):
        return "AT_HAND"


#: ``device=`` of a decision: the device at hand (``lcmac.spec.device.device_at_hand``)
AT_HAND = _AtHand()


class DeviceView:
    """A tuning log's records measured on ``device`` only (None: every record)."""

    def __init__(self, store, device: DeviceIdentity | None):
        self.store, self.device = store, device

    def records(self, target, dtype, *, include_errors: bool = False, include_stale: bool = False):
        stale = {"include_stale": True} if include_stale else {}
        recs = self.store.records(target, dtype, include_errors=include_errors, **stale)
        if self.device is None:
            return recs
        return [r for r in recs if self.device.measured_on(r)]


@dataclass(frozen=True)
class Basis:
    """What one decision reads: ``records`` (a ``DeviceView``), the ``profile`` that prices
    (a fitted one, else None: the caller's or the target's), whether that profile prices the
    vendor GEMM (``fitted``: its rate was measured on this device) and ``note``, the words
    for ``why``."""
    records: DeviceView
    profile: object = None
    fitted: bool = False
    note: str = ""


def _names(counts: Counter) -> str:
    return ", ".join(f"{n} ×{c}" for n, c in counts.most_common())


def basis_for(store, target, dtype, device=AT_HAND, profile=None) -> Basis:
    """The records and profile of a decision for ``device`` (``AT_HAND``, a
    ``DeviceIdentity`` or None for every device) from ``store`` (module doc).  ``profile``:
    the caller's, which no fitted profile replaces."""
    target, d = str(target), normalize_model_dtype(dtype)
    here = device_at_hand(target) if device is AT_HAND else device
    recs = list(store.records(target, d))
    if here is None:
        pinned = device is AT_HAND and os.environ.get(ENV, "").strip().lower() == ANY
        counts = Counter(r.get("device", "?") for r in recs)
        note = "" if pinned or not counts else (
            f"no {target} device here: the records of every device decide ({_names(counts)})")
        return Basis(DeviceView(store, None), note=note)
    view = DeviceView(store, here)
    own = any(here.measured_on(r) for r in recs)
    others = Counter(r.get("device", "?") for r in recs if not here.measured_on(r))
    unused = (f"; the records of other devices are not used ({_names(others)}): measurements "
              "do not carry between devices") if others else ""
    if own:
        return Basis(view, note=f"records of this device only ({here.name}){unused}")
    if profile is not None:
        return Basis(view, note=f"no records of this device ({here.name}): the profile given "
                                f"prices{unused}")
    fit, why_not = _fitted(here, target, d)
    if fit is None:
        return Basis(view, note=f"no records of this device ({here.name}) and no fitted profile "
                                f"({why_not}): the target's datasheet profile prices{unused}")
    return Basis(view, fit.profile, True,
                 f"no records of this device: a fitted profile prices, the vendor GEMM at its "
                 f"measured rate ({fit.describe()}){unused}")


def _fitted(here: DeviceIdentity, target: str, dtype: str):
    """(the fitted profile of ``here`` or None, why there is none).  Measured now only when
    ``here`` is the device measurements run on (not a device named by ``LCMAC_DEVICE``)."""
    from lcmac.tune.device_profile import fitted_profile
    if cache_root() is None:
        return None, "the disk caches are off (LCMAC_CACHE_DIR=off)"
    actual = measuring_device(target)
    measure = actual is not None and actual.fingerprint == here.fingerprint
    try:
        fit = fitted_profile(here, target, dtype, measure=measure)
    except LcmacError as e:
        return None, str(e)
    return fit, "" if fit is not None else f"{here.name} is not here to measure"


#: what places the default logs: their directories follow these (``tuning_log.default_dirs``)
_LOGS_ENV = reader("LCMAC_TUNING_LOGS", "LCMAC_CACHE_DIR", "XDG_CACHE_HOME", "HOME")
#: (target, dtype, _LOGS_ENV()) → the paths of its default log files (building them is most
#: of decision_state's cost)
_log_files: dict[tuple, tuple] = {}


def decision_state(target, dtype) -> tuple:
    """What a decision on the default logs reads besides its arguments: ``LCMAC_DEVICE`` and
    the size and time of each log file of the target and dtype, so that a plan kept in memory
    is made again once records are added (``lcmac calibrate``, ``lcmac tune``)."""
    target, d = str(target), normalize_model_dtype(dtype)
    key = (target, d, _LOGS_ENV())
    paths = _log_files.get(key)
    if paths is None:
        paths = tuple(str(_db.log_path(root, target, d)) for root in _db.default_dirs())
        if len(_log_files) >= 256:
            _log_files.clear()
        _log_files[key] = paths
    files = []
    for path in paths:
        try:
            st = os.stat(path)
            files.append((st.st_mtime_ns, st.st_size))
        except OSError:
            files.append(None)
    return os.environ.get(ENV), tuple(files)
