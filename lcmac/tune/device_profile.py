"""A cost-model profile fitted to the device at hand, for a device the tuning logs hold no
records of (``lcmac.policy.measured`` asks for one then).

``measure_device(target, dtype)`` times on the device itself, in well under a minute: the
vendor GEMM at two square sizes (numpy.matmul on a CPU, torch.matmul for the dtypes numpy
lacks; torch.matmul = cuBLAS on a GPU, TF32 for float32 as lcmac's CUDA float32 runs), a
copy (the memory's read + write bandwidth) and one combine-like kernel: the elementwise sum
of two blocks of a matrix into a third, what an LCMA's combine stages do.  ``fit_profile``
turns them into the target's profile with measured numbers: the unit count the device's,
``mem_bw`` the copy's, ``bandwidth_efficiency`` the block sum's share of it, the compute
peaks scaled so that the model's plain GEMM takes the larger GEMM's time and ``shape_half``
(within ``lcmac.tune.calibrate``'s bounds) so that it takes the smaller's: the model's plain
GEMM then runs at the vendor's measured rate.

``fitted_profile(device, target, dtype)`` keeps each fit in lcmac's cache directory
(``device_profiles/``, a store like the kernel cache's: one entry per device fingerprint,
target, dtype, measurement sizes, lcmac version and this module's ``SCHEMA``, so no entry
outlives the code or the device that made it).  It measures once: processes that ask at the
same time wait for the first one's measurement.  With the disk caches off
(``LCMAC_CACHE_DIR=off``) it measures nothing and returns None.
"""
from __future__ import annotations

import dataclasses
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from lcmac.artifact.store import Spec, Store
from lcmac.core.cachedir import cache_root
from lcmac.core.dtypes import normalize_model_dtype
from lcmac.core.errors import ArtifactError, LcmacError
from lcmac.core.version import __version__
from lcmac.costmodel import gemm_estimate, model_dtype, resolve_profile
from lcmac.spec.device import DeviceIdentity
from lcmac.spec.precision import torch_precision_set
from lcmac.tune.calibrate import BOUNDS
from lcmac.tune.measure import gpu_timer, make_inputs, time_callable

__all__ = ["SCHEMA", "Sizes", "DEFAULT", "TINY", "FittedProfile", "measure_device",
           "fit_profile", "fitted_profile"]

SCHEMA = "lcmac-device-profile/1"
PROFILE_FILE = "profile.json"


@dataclass(frozen=True)
class Sizes:
    """What ``measure_device`` times: GEMMs of these square sides (two), a copy of
    ``copy_mib`` MiB, and the sum of two blocks of an ``add_side`` × ``add_side`` matrix."""
    gemm: tuple[int, int]
    copy_mib: int
    add_side: int


#: the measurement a decision takes, per device kind (seconds on a 2-core VM, less on a GPU)
DEFAULT = {"cpu": Sizes((512, 2048), 64, 4096), "cuda": Sizes((2048, 8192), 1024, 16384)}
#: a measurement of a few milliseconds, for tests (its fit means little)
TINY = Sizes((32, 64), 1, 256)

_TIMING = {"warmup": 1, "repeats": 3, "min_run_s": 0.02}


@dataclass(frozen=True)
class FittedProfile:
    """A fit: the ``profile``, the ``device`` it was fitted to, what was ``measured``
    (GEMM seconds per size, copy and block-sum bytes/s) and the ``values`` set."""
    profile: object
    device: DeviceIdentity
    measured: dict
    values: dict
    date: str = ""

    def describe(self) -> str:
        g = ", ".join(f"{n}³ {2 * n ** 3 / t / 1e9:.4g} GFLOP/s" for n, t in
                      sorted((int(n), t) for n, t in self.measured["gemm_s"].items()))
        return (f"profile {self.profile.name} fitted to {self.device.name} from a measurement "
                f"({self.date or 'now'}): vendor GEMM {g}, copy "
                f"{self.measured['copy_bytes_per_s'] / 1e9:.3g} GB/s, block sum "
                f"{self.measured['add_bytes_per_s'] / 1e9:.3g} GB/s")


# ---- measuring ------------------------------------------------------------------------------
def _timed(run, gpu: bool) -> float:
    if not gpu:
        return time_callable(run, **_TIMING)["time_s"]
    import torch
    return time_callable(run, sync=torch.cuda.synchronize, timer=gpu_timer(), **_TIMING)["time_s"]


def _gemm_s(target: str, dtype: str, n: int) -> float:
    """Seconds of the vendor GEMM of n×n×n operands on the device."""
    A, B, gpu = make_inputs(target, dtype, (n, n, n))
    if hasattr(A, "numpy"):                      # torch: cuBLAS, or the CPU for bf16 / fp16
        import torch
        with torch_precision_set("high" if dtype == "float32" else "highest"):
            C = torch.matmul(A, B)
            return _timed(lambda: torch.matmul(A, B, out=C), gpu)
    import numpy as np
    C = np.matmul(A, B)
    return _timed(lambda: np.matmul(A, B, out=C), False)


def _memory_rates(target: str, dtype: str, sizes: Sizes) -> tuple[float, float]:
    """(copy bytes/s, block-sum bytes/s): read + write bytes of a copy of ``copy_mib`` MiB,
    and of C = X₁₁ + X₂₂ over two blocks of an ``add_side``² matrix (numpy on a CPU)."""
    h = sizes.add_side // 2
    gpu = str(target).startswith("cuda")
    if gpu:
        import torch
        td = getattr(torch, dtype)
        src = torch.ones(sizes.copy_mib * 2 ** 20 // td.itemsize, dtype=td, device="cuda")
        X = torch.ones(2 * h, 2 * h, dtype=td, device="cuda")
        Y = torch.empty(h, h, dtype=td, device="cuda")
        dst, item = torch.empty_like(src), td.itemsize

        def copy():
            dst.copy_(src)

        def add():
            torch.add(X[:h, :h], X[h:, h:], out=Y)
    else:
        import numpy as np
        nd = np.dtype(np.float64 if dtype == "float64" else np.float32)  # numpy lacks bf16
        src = np.ones(sizes.copy_mib * 2 ** 20 // nd.itemsize, dtype=nd)
        X = np.ones((2 * h, 2 * h), dtype=nd)
        Y = np.empty((h, h), dtype=nd)
        dst, item = np.empty_like(src), nd.itemsize

        def copy():
            np.copyto(dst, src)

        def add():
            np.add(X[:h, :h], X[h:, h:], out=Y)
    return 2 * len(src) * item / _timed(copy, gpu), 3 * h * h * item / _timed(add, gpu)


#: the dtypes whose GEMMs the measurement times (a CUDA float32 one runs TF32)
MEASURED_DTYPES = ("float32", "float64", "bfloat16", "float16")


def measure_device(target: str, dtype: str, sizes: Sizes | None = None) -> dict:
    """What ``fit_profile`` needs, timed on the device at hand (module doc): ``gemm_s``
    {side: seconds}, ``copy_bytes_per_s``, ``add_bytes_per_s``."""
    d = normalize_model_dtype(dtype)
    if d not in MEASURED_DTYPES:
        raise ValueError(f"a device measurement times {', '.join(MEASURED_DTYPES)} GEMMs, not {d}")
    sizes = sizes or DEFAULT["cuda" if str(target).startswith("cuda") else "cpu"]
    if len(set(sizes.gemm)) != 2 or min(sizes.gemm) < 1:
        raise ValueError(f"a device measurement needs two different GEMM sizes, got {sizes.gemm}")
    gemm = {str(n): _gemm_s(target, d, n) for n in sizes.gemm}
    copy_bw, add_bw = _memory_rates(target, d, sizes)
    return {"gemm_s": gemm, "copy_bytes_per_s": copy_bw, "add_bytes_per_s": add_bw,
            "sizes": dataclasses.asdict(sizes)}


# ---- fitting --------------------------------------------------------------------------------
#: the bounds of the fitted shape_half (calibrate's)
_HALF = BOUNDS["shape_half"]


def _device_base(target: str, dtype: str, device: DeviceIdentity):
    """(the target's profile with the device's unit count, the model dtype)."""
    p, md = resolve_profile(target, model_dtype(target, normalize_model_dtype(dtype)))
    units = device.details.get("sms" if p.kind == "gpu" else "cores")
    if isinstance(units, int) and units > 0:
        p = dataclasses.replace(p, units=units)
    return p, md


def _scaled(p, scale: float):
    """``p`` with every compute peak × ``scale``: a target's profile describes one machine,
    and a bigger or smaller one of the same ISA moves its peaks together (more cores, other
    clocks), the matrix rate by as much as the vector adds."""
    return dataclasses.replace(p, mul_flops={k: v * scale for k, v in p.mul_flops.items()},
                               add_flops={k: v * scale for k, v in p.add_flops.items()})


def _scale_to(p, md: str, n: int, t: float) -> float:
    """The peak scale at which the model's n³ GEMM takes ``t`` seconds: only its compute
    time scales (not the launch overhead, nor a memory-bound part), hence fixed-point steps,
    one where the GEMM is compute-bound."""
    scale = 1.0
    for _ in range(40):
        ratio = gemm_estimate(n, n, n, md, _scaled(p, scale)).time_s / t
        scale = min(1e6, max(1e-6, scale * ratio))
        if abs(ratio - 1.0) < 1e-9:
            break
    return scale


def _fitted_gemm(p, md: str, gemm_s: dict) -> tuple[float, float]:
    """(peak scale, shape_half) with which the model's plain GEMM takes the measured times:
    the larger GEMM's exactly (the scale), the smaller's as nearly as ``shape_half`` within
    its bounds allows (a larger one slows small GEMMs more than large ones: bisection)."""
    (small, t_small), (big, t_big) = sorted((int(n), float(t)) for n, t in gemm_s.items())

    def at(log_h):
        ph = p.with_calibration(shape_half=math.exp(log_h))
        scale = _scale_to(ph, md, big, t_big)
        miss = math.log(gemm_estimate(small, small, small, md, _scaled(ph, scale)).time_s / t_small)
        return scale, miss
    lo, hi = math.log(_HALF[0]), math.log(_HALF[1])
    if at(lo)[1] < 0 < at(hi)[1]:
        for _ in range(40):
            mid = 0.5 * (lo + hi)
            lo, hi = (mid, hi) if at(mid)[1] < 0 else (lo, mid)
        log_h = 0.5 * (lo + hi)
    else:                             # out of the bounds' reach: the nearer bound
        log_h = lo if at(lo)[1] >= 0 else hi
    return at(log_h)[0], math.exp(log_h)


def _profile(target: str, dtype: str, device: DeviceIdentity, scale: float, values: dict,
             date: str):
    p, _ = _device_base(target, dtype, device)
    p = _scaled(p, scale).with_calibration(values)
    return dataclasses.replace(p, description=f"{p.description}; fitted to {device.name} "
                               f"(lcmac.tune.device_profile, {date or 'now'})")


def fit_profile(target: str, dtype: str, device: DeviceIdentity, measured: dict,
                date: str = "") -> FittedProfile:
    """The target's profile fitted to ``measured`` (``measure_device``'s result)."""
    base, md = _device_base(target, dtype, device)
    copy_bw = float(measured["copy_bytes_per_s"])
    share = float(measured["add_bytes_per_s"]) / copy_bw
    share = min(1.0, max(BOUNDS["bandwidth_efficiency"][0], share))
    values = {"mem_bw": copy_bw, "bandwidth_efficiency": share}
    scale, half = _fitted_gemm(base.with_calibration(values), md, measured["gemm_s"])
    values["shape_half"] = half
    return FittedProfile(_profile(target, dtype, device, scale, values, date), device,
                         {**measured, "peak_scale": scale}, values, date)


# ---- keeping one per device -----------------------------------------------------------------
def _store() -> Store | None:
    root = cache_root()
    return None if root is None else Store(root / "device_profiles", "device-profile cache")


def _spec(device: DeviceIdentity, target: str, dtype: str, sizes: Sizes) -> Spec:
    return Spec({"format": SCHEMA, "device": device.fingerprint, "identity": device.to_dict(),
                 "target": str(target), "dtype": normalize_model_dtype(dtype),
                 "sizes": dataclasses.asdict(sizes), "lcmac_version": __version__},
                prefix="profile", what=f"the fitted profile of {device.name}")


def _read(spec: Spec, entry: Path, meta: dict) -> FittedProfile:
    doc = json.loads((entry / PROFILE_FILE).read_text())
    if doc.get("schema") != SCHEMA:
        raise ArtifactError(f"its {PROFILE_FILE} is not {SCHEMA}")
    f = spec.fields
    device = DeviceIdentity.from_dict(f["identity"])
    profile = _profile(f["target"], f["dtype"], device, float(doc["measured"]["peak_scale"]),
                       doc["values"], doc["date"])
    return FittedProfile(profile, device, doc["measured"], doc["values"], doc["date"])


_memo: dict[tuple, FittedProfile] = {}
#: why a measurement failed in this process, by the same key
_failed: dict[tuple, str] = {}


def fitted_profile(device: DeviceIdentity, target: str, dtype: str, *, measure: bool = True,
                   sizes: Sizes | None = None,
                   measurer: Callable[[str, str, Sizes], dict] | None = None
                   ) -> FittedProfile | None:
    """The profile fitted to ``device`` for ``target`` and ``dtype``: kept from an earlier
    fit, else (``measure``) measured now by ``measurer`` (default ``measure_device``; the
    device must be the one at hand) and kept.  None where none is kept and ``measure`` is
    False, or the disk caches are off.  LcmacError when the measurement fails."""
    sizes = sizes or DEFAULT[device.kind if device.kind in DEFAULT else "cpu"]
    spec, store = _spec(device, target, dtype, sizes), _store()
    if store is None:
        return None
    memo_key = (str(store.root), spec.key)
    if memo_key in _memo:
        return _memo[memo_key]
    if memo_key in _failed and measure:       # once per process: a decision does not retry
        raise LcmacError(_failed[memo_key])
    got = store.lookup(spec, _read)
    if got is None and measure:
        measure_fn = measurer or measure_device

        def build(jobs):
            for _, tmp in jobs:
                date = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
                try:
                    measured = measure_fn(target, dtype, sizes)
                    fit = fit_profile(target, dtype, device, measured, date)
                except (RuntimeError, ValueError, TypeError, KeyError, ImportError) as e:
                    _failed[memo_key] = (f"could not measure {device.name} for a fitted "
                                         f"profile ({type(e).__name__}: {e})")
                    raise LcmacError(_failed[memo_key]) from None
                doc = {"schema": SCHEMA, "date": date, "measured": fit.measured,
                       "values": fit.values}
                (tmp / PROFILE_FILE).write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
            return [{"device": device.name} for _ in jobs]
        got = store.obtain([spec], _read, build)[0].product
    if got is not None:
        _memo[memo_key] = got
    return got
