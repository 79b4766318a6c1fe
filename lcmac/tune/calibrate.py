"""Fit the profile's efficiency factors to the tuning log so predictions move toward
measurements.

Parameters (each optional): ``gemm_efficiency`` (fraction of the matrix peak a large GEMM
reaches, per dtype), ``bandwidth_efficiency`` (fraction of the DRAM bandwidth the combine
kernels reach), ``shape_half`` (how fast GEMM efficiency falls for small blocks; CPU).
Objective: least squares on log-time, Σ_records (log t_model(θ) − log t_measured)², over the
best measured config of each (algorithm, shape) — the model predicts a tuned kernel, not a
particular config.  The model is the cost model's own (``gemm_estimate`` /
``lcma_estimate``, fused or unfused whichever is faster, as ``select`` does), evaluated on
``profile.with_calibration(θ)``, so the fit needs no knowledge of the model's formulas.
Minimised by damped Gauss–Newton on log θ with finite-difference Jacobians, θ kept inside
its bounds; with 2–3 parameters and tens of records this takes milliseconds.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from lcmac.artifact import tuning_log as _db
from lcmac.costmodel import gemm_estimate, lcma_estimate, model_dtype, resolve_profile
from lcmac.core.dtypes import normalize_model_dtype
from lcmac.ir import catalogue

BOUNDS = {"gemm_efficiency": (0.02, 1.0), "bandwidth_efficiency": (0.05, 1.0),
          "add_efficiency": (0.02, 1.0), "shape_half": (0.5, 2000.0),
          "epilogue_overlap": (0.01, 1.0)}


@dataclass
class Calibration:
    profile: object                 # the calibrated HardwareProfile
    values: dict                    # what was passed to with_calibration
    before: dict                    # error metrics of the uncalibrated model
    after: dict
    n: int                          # (algorithm, shape) points fitted

    def describe(self) -> str:
        v = ", ".join(f"{k}={x:.4g}" for k, x in self.values.items())
        return (f"calibrated on {self.n} points: {v}; log-RMS error {self.before['log_rms']:.3f} → "
                f"{self.after['log_rms']:.3f}, mean |error| {self.before['mean_abs_pct']:.1f}% → "
                f"{self.after['mean_abs_pct']:.1f}%")


def _points(records) -> list[tuple[str, tuple, float]]:
    best: dict[tuple, float] = {}
    for r in records:
        if r.get("status") != "ok":
            continue
        k = (r["algorithm"], tuple(r["shape"]))
        best[k] = min(best.get(k, math.inf), float(r["time_s"]))
    return [(a, s, t) for (a, s), t in sorted(best.items())]


def model_time(algorithm: str, shape, dtype, profile) -> float:
    """The model's time of a tuned ``algorithm`` (the faster Combine-H variant, as
    ``select`` prices it)."""
    M, N, K = shape
    if algorithm == _db.GEMM:
        return gemm_estimate(M, N, K, dtype, profile).time_s
    alg = catalogue.get(algorithm)
    return min(lcma_estimate(alg, M, N, K, dtype, profile, fused=f).time_s for f in (True, False))


def errors(points, dtype, profile) -> dict:
    lr = [math.log(model_time(a, s, dtype, profile) / t) for a, s, t in points]
    if not lr:
        return {"log_rms": math.nan, "mean_abs_pct": math.nan, "n": 0}
    return {"log_rms": math.sqrt(sum(x * x for x in lr) / len(lr)),
            "mean_abs_pct": 100 * sum(abs(math.exp(x) - 1) for x in lr) / len(lr), "n": len(lr)}


def _apply(profile, names, theta, dtype):
    vals = {}
    for nm, x in zip(names, theta):
        v = float(math.exp(x))
        vals[f"gemm_efficiency.{dtype}" if nm == "gemm_efficiency" else nm] = v
    return profile.with_calibration(vals), vals


def calibrate(records, target, dtype, *, profile=None,
              params=("gemm_efficiency", "bandwidth_efficiency"), iterations: int = 30) -> Calibration:
    """Fit ``params`` to ``records`` (tuning-log dicts for one target and dtype)."""
    d_log = normalize_model_dtype(dtype)
    p0, d = resolve_profile(target, model_dtype(target, d_log), profile)   # CUDA float32 = TF32
    pts = _points(r for r in records if (r.get("dtype") in (d_log, None))
                  and r.get("algorithm") != _db.VENDOR)
    if not pts:
        raise ValueError(f"no measurements of {target}/{d} to calibrate with")
    names = list(params)
    # drop parameters the data cannot see (e.g. bandwidth with GEMM-only records)
    if all(a == _db.GEMM for a, _, _ in pts):
        names = [n for n in names if n not in ("bandwidth_efficiency", "add_efficiency", "epilogue_overlap")]
    if len(pts) < len(names):
        names = names[: len(pts)]
    cur = {"gemm_efficiency": p0.gemm_eff(d), "bandwidth_efficiency": p0.bandwidth_efficiency,
           "add_efficiency": p0.add_efficiency, "shape_half": p0.shape_half,
           "epilogue_overlap": max(p0.epilogue_overlap, 0.01)}
    lo = np.array([math.log(BOUNDS[n][0]) for n in names])
    hi = np.array([math.log(BOUNDS[n][1]) for n in names])
    theta = np.clip(np.array([math.log(cur[n]) for n in names]), lo, hi)
    y = np.array([math.log(t) for _, _, t in pts])

    def resid(th):
        prof, _ = _apply(p0, names, th, d)
        return np.array([math.log(model_time(a, s, d, prof)) for a, s, _ in pts]) - y

    r = resid(theta)
    lam = 1e-3
    for _ in range(iterations):
        J = np.empty((len(pts), len(names)))
        for j in range(len(names)):
            h = 1e-4 if theta[j] + 1e-4 <= hi[j] else -1e-4  # stay inside the bounds
            t2 = theta.copy()
            t2[j] += h
            J[:, j] = (resid(t2) - r) / h
        A = J.T @ J
        g = J.T @ r
        improved = False
        for _ in range(8):
            step = np.linalg.solve(A + lam * np.diag(np.diag(A) + 1e-12), -g)
            cand = np.clip(theta + step, lo, hi)
            rc = resid(cand)
            if rc @ rc < r @ r - 1e-14:
                theta, r, lam, improved = cand, rc, max(lam / 3, 1e-9), True
                break
            lam *= 10
        if not improved or np.linalg.norm(step) < 1e-7:
            break
    prof, vals = _apply(p0, names, theta, d)
    return Calibration(prof, vals, errors(pts, d, p0), errors(pts, d, prof), len(pts))


def calibrate_from_db(target, dtype, *, db=None, device=None, **kw) -> Calibration:
    """``calibrate`` on the log's records of ``target`` and ``dtype``; ``device``: only those
    measured on it (a ``lcmac.spec.device.DeviceIdentity``; None: every device's)."""
    store = db if isinstance(db, _db.TuningDB) else _db.TuningDB(db)
    recs = store.records(str(target), normalize_model_dtype(dtype), device=device)
    return calibrate(list(recs), target, dtype, **kw)
