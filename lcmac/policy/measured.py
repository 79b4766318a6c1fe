"""The measured decision: the tuning log's measurements override the model.

``decide_by_measurement(M, N, K, dtype, target)`` gathers, per algorithm, the best logged time
for this shape and hands them to ``lcmac.costmodel.select`` (the model's ranking) through its
``measurements=`` hook, and returns the decision as a ``Plan`` whose ``candidates`` are the
ranking (``lcmac.policy.plan`` settles what then runs):

- exact shape logged → those times are used as they are;
- otherwise the nearest logged shape (log-space distance ≤ ``max_distance``) at which the
  plain GEMM was measured too → each algorithm's *measured speed-up over GEMM* there is
  applied to the model's GEMM time for the asked shape (absolute times do not transfer
  between shapes, ratios roughly do);
- nothing logged → the model alone.

Unmeasured candidates are priced by the model rescaled to what was measured at the shape
(geometric mean of measured / predicted): unmeasured LCMAs by the LCMAs measured there, the
plain GEMM by its own measurement, each falling back on the other (the model errs alike
within a kind of kernel, less so across kinds).

Times carried over from another shape decide against the vendor GEMM only with a margin
(``TRANSFER_MARGIN``): a ratio measured elsewhere is not precise enough to prefer a kernel
that looks 1 % faster over the library.  At the measured shape itself the margin is smaller
(``EXACT_MARGIN``), not zero: medians within it are a tie, which the library takes.

Then the rule "measurement is the judge": when the GEMM and at least one LCMA are measured,
the fastest *measured* one is the decision (an unmeasured LCMA the model likes is only
reported as worth tuning); otherwise ``select``'s own decision stands — which already falls
back to the plain GEMM when no LCMA is predicted to win or the GEMM is memory-bound.

**The vendor GEMM is an option too.**  lcmac's own plain GEMM is not always as fast as the
vendor library's, so "fall back to GEMM" must be able to mean the vendor's: when the log
holds a measurement of the vendor GEMM (algorithm ``"vendor"``: torch.matmul = cuBLAS on a
GPU, numpy.matmul on a CPU, timed by ``lcmac tune`` in the same run as the kernels), it is a
candidate named ``"vendor"`` and wins whenever it is faster than the otherwise chosen kernel.
``Plan.is_vendor`` says so and ``lcmac.runtime.vendor.vendor_matmul`` is the call to make
then.  No LCMA or lcmac kernel is chosen over a faster measured vendor GEMM.

On CUDA targets a float32 case is priced by the model as ``tfloat32`` (lcmac's CUDA float32
GEMM multiplies on the TF32 tensor cores; ``costmodel.model_dtype``); the log stays float32.
**One precision at a time.**  Only records of the operand mode decided in (``operands``) take
part, and with a float32 ``precision`` class (``lcmac.spec.precision``) only vendor records
measured as that class runs them: TF32 where it allows TF32, SGEMM where it does not (the
record's ``"tf32"``).

**Burst or sustained.**  A GPU under a long job runs at its power cap, where kernels rank
differently than in short bursts.  ``regime="burst"`` (default) decides on the records of
ordinary tuning runs; ``regime="sustained"`` only on those of ``lcmac tune --sustained S``
(every kernel and the vendor GEMM warmed up ≥ ``SUSTAINED_WARM_S`` before timing), falling
back to the nearest shape or the model where none is logged.  The two kinds of records
never compete.

**The device at hand.**  Only records measured on the device decided for count
(``lcmac.policy.devices``); a device with none is priced by a profile fitted to it, and its
vendor GEMM at the rate that fit measured.
"""
from __future__ import annotations

import dataclasses
import math

from lcmac.artifact import tuning_log as _db
from lcmac.costmodel import gemm_estimate, model_dtype, resolve_profile, select
from lcmac.costmodel.accuracy import cuda_model_args
from lcmac.costmodel.decision import Candidate, candidate_names, within_error_budget
from lcmac.core.dtypes import normalize_model_dtype
from lcmac.policy.devices import AT_HAND, basis_for
from lcmac.policy.plans import AUTO, Plan
from lcmac.spec.precision import allows_tf32
from lcmac.spec.targets import get_target


#: records warmed up at least this long before timing are of the sustained regime
SUSTAINED_WARM_S = 1.0
REGIMES = ("burst", "sustained")


def check_regime(regime) -> str:
    """``regime`` itself; ValueError unless it is one of ``REGIMES``."""
    if regime not in REGIMES:
        raise ValueError(f"regime must be one of {', '.join(REGIMES)}, got {regime!r}")
    return regime


def regime_of(record: dict) -> str:
    """"sustained" for a record of ``lcmac tune --sustained`` (``warm_s`` ≥ 1 s), else "burst"."""
    return "sustained" if float(record.get("warm_s") or 0.0) >= SUSTAINED_WARM_S else "burst"


def _store_of(db):
    """A tuning log: ``db`` itself where it is one (or a read-once view), else opened from
    its directory (None: the project's)."""
    return db if hasattr(db, "records") else _db.TuningDB(db)


def same_precision(record: dict, operands: str = "native", precision: str | None = None) -> bool:
    """Whether ``record`` was measured in the precision decided in: an lcmac kernel or vendor
    baseline of the operand mode ``operands``, and a vendor baseline that records whether it
    ran TF32 (CUDA float32) ran it as ``precision`` lets torch.matmul (None: either)."""
    cfg = record.get("config") or {}
    if _db.operands_of(cfg) != operands:
        return False
    if precision is None or record.get("algorithm") != _db.VENDOR or "tf32" not in cfg:
        return True
    return bool(cfg["tf32"]) == allows_tf32(precision)


def gather(M, N, K, dtype, target, *, db=None, max_distance: float = 0.75,
           profile=None, regime: str = "burst", operands: str = "native",
           precision: str | None = None) -> tuple[dict, str, tuple | None, dict, dict]:
    """(measurements for select, source, logged shape, Combine-H variant of each measured
    LCMA's best config, carried) from the tuning log's records of ``regime``.  The variants
    are those of the records the times come from (CUDA targets; a build from the log takes
    the same config).  ``carried``: {algorithm: factor} for kernels measured at the shape only
    in the other regime, whose time there is scaled by the geometric mean of this regime's /
    the other's times over the kernels measured both ways at that shape (measured data in
    place of the model's guess; without a kernel measured both ways, none is carried)."""
    store = _store_of(db)
    d = normalize_model_dtype(dtype)
    by_regime: dict[str, dict[tuple, dict[str, float]]] = {g: {} for g in REGIMES}
    cfgs: dict[tuple, dict[str, dict]] = {}
    for r in store.records(str(target), d):
        if not same_precision(r, operands, precision):
            continue        # another precision: not what is decided here
        g = regime_of(r)    # burst and sustained times never compete directly
        per = by_regime[g].setdefault(tuple(r["shape"]), {})
        a = r["algorithm"]
        if a not in per or r["time_s"] < per[a]:
            per[a] = r["time_s"]
            if g == regime:
                cfgs.setdefault(tuple(r["shape"]), {})[a] = r["config"] or {}
    best, other = by_regime[regime], by_regime[REGIMES[1 - REGIMES.index(regime)]]
    carried_at: dict[tuple, dict[str, float]] = {}
    for s, per in best.items():
        both = [a for a in per if a in other.get(s, {})]
        if not both:
            continue
        f = math.exp(sum(math.log(per[a] / other[s][a]) for a in both) / len(both))
        for a, t in other[s].items():
            if a not in per:
                per[a] = t * f
                carried_at.setdefault(s, {})[a] = f
    shape = (int(M), int(N), int(K))

    def variants(s):
        if get_target(str(target)).family != "cuda":
            return {}
        return {a: cuda_model_args(d, c)[1] for a, c in cfgs.get(s, {}).items()
                if a not in (_db.GEMM, _db.VENDOR)}
    if shape in best:
        return dict(best[shape]), "exact", shape, variants(shape), carried_at.get(shape, {})
    # the ratios carry from a shape where a baseline was measured: lcmac's plain GEMM, else
    # the vendor GEMM (put at the model's GEMM time here: their ratios are what transfers)
    near = sorted((_db.shape_distance(shape, s), s) for s, per in best.items()
                  if _db.GEMM in per or _db.VENDOR in per)
    p, md = resolve_profile(target, model_dtype(target, d), profile)
    if not near or near[0][0] > max_distance:
        # nothing logged nearby: the model decides among lcmac's kernels, but whether the
        # vendor's GEMM beats lcmac's own is a property of the backend on this target, so
        # its ratio (geometric mean over every logged shape) still stands
        ratios = [per[_db.VENDOR] / per[_db.GEMM] for per in best.values()
                  if _db.GEMM in per and _db.VENDOR in per]
        if not ratios:
            return {}, "model", None, {}, {}
        r = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
        g_model = gemm_estimate(M, N, K, md, p).time_s
        return ({_db.GEMM: g_model, _db.VENDOR: g_model * r},
                f"model; vendor/GEMM ratio {r:.3f} (geometric mean over {len(ratios)} logged shapes)",
                None, {}, {})
    dist, s = near[0]
    g_model = gemm_estimate(M, N, K, md, p).time_s
    per = best[s]
    ref = per[_db.GEMM] if _db.GEMM in per else per[_db.VENDOR]
    meas = {a: g_model * t / ref for a, t in per.items()}
    return (meas, f"nearest logged shape {s[0]}x{s[1]}x{s[2]} (log-distance {dist:.2f})", s,
            variants(s), carried_at.get(s, {}))


def _vendor_candidate(t: float, M, N, K, gemm_cand, which: str = "cuBLAS / numpy's BLAS"):
    """A ``Candidate`` for the measured vendor GEMM (stages: the model's plain GEMM's);
    ``which``: the call and library its record names."""
    g_time = gemm_cand.predicted_time_s
    return Candidate(_db.VENDOR, (1, 1, 1), 1, "vendor", t, 2.0 * M * N * K / t / 1e12,
                     g_time / t, gemm_cand.stages, gemm_cand.overhead_s,
                     f"measured; the vendor library's GEMM ({which})", True, None)


def _fastest_vendor(db, shape, dtype, target, regime: str, api: str | None = None) -> dict:
    """The config of the fastest vendor record at ``shape`` (of ``api`` where given; {} where
    there is none)."""
    recs = [r for r in _store_of(db).records(str(target), normalize_model_dtype(dtype))
            if r["algorithm"] == _db.VENDOR and shape is not None
            and tuple(r["shape"]) == tuple(shape) and regime_of(r) == regime and r.get("time_s")
            and (api is None or (r.get("config") or {}).get("api") == api)]
    return (min(recs, key=lambda r: r["time_s"]).get("config") or {}) if recs else {}


def _vendor_named(cfg: dict) -> str:
    """A vendor record's GEMM as "api, library" (torch.matmul, mkl; numpy.matmul,
    scipy-openblas; ...), or the generic name."""
    named = [str(cfg[k]) for k in ("api", "library") if cfg.get(k)]
    return ", ".join(named) or "cuBLAS / numpy's BLAS"


def failed_at(M, N, K, dtype, target, *, db=None) -> set[str]:
    """Algorithms whose every logged attempt at exactly this shape failed (build error, wrong
    result, device fault): not options here, whatever the model predicts."""
    store = _store_of(db)
    shape = [int(M), int(N), int(K)]
    ok, bad = set(), set()
    for r in store.records(str(target), normalize_model_dtype(dtype), include_errors=True):
        if r["shape"] == shape:
            (ok if r["status"] == "ok" else bad).add(r["algorithm"])
    return bad - ok


def _strip_decision(c):
    return dataclasses.replace(c, reason=c.reason.replace("decision: ", "", 1)) \
        if c.reason.startswith("decision: ") else c


#: how much faster than the vendor GEMM a kernel must look, on times carried over from the
#: nearest logged shape, to be chosen over it (the medians of one kernel move by a few per
#: cent between runs)
TRANSFER_MARGIN = 0.03
#: the same at the measured shape itself: a kernel whose median is this close to the
#: vendor's is a tie, and a tie goes to the library (a kernel tuned a hair ahead of the
#: vendor can run behind it in the next run)
EXACT_MARGIN = 0.02


class _ReadOnce:
    """One decision's view of a tuning log: its records of a target and dtype read once,
    failed attempts included, and served with or without them (``gather``,
    ``confirmed_ratio`` and ``failed_at`` each asked the log again)."""

    def __init__(self, store):
        self.store, self.memo = store, {}

    def records(self, target, dtype, *, include_errors: bool = False, include_stale: bool = False):
        if include_stale:
            return self.store.records(target, dtype, include_errors=include_errors, include_stale=True)
        if (target, dtype) not in self.memo:
            self.memo[target, dtype] = list(self.store.records(target, dtype, include_errors=True))
        recs = self.memo[target, dtype]
        return recs if include_errors else [r for r in recs if r["status"] == "ok"]


def decide_by_measurement(M: int, N: int, K: int, dtype="float32", target="x86_64-avx512", *,
                          db=None, profile=None, max_distance: float = 0.75, vendor: bool = True,
                          regime: str = "burst", precision: str | None = None,
                          device=AT_HAND, **select_kw) -> Plan:
    """GEMM, which LCMA, or the vendor GEMM for this shape, preferring logged measurements
    (module doc; ``lcmac.costmodel.decide_by_model`` is the model's word alone): a ``Plan``
    that runs its decision, with the ranking in ``candidates``.  ``db``: a
    ``TuningDB``, its directory, or any object with ``records(target, dtype)``.
    ``vendor=False`` leaves the vendor GEMM out (lcmac's own kernels only).  ``regime``:
    "burst" or "sustained" records (module doc).  ``precision``: the float32 class whose
    vendor records count (module doc; None: any).  ``select_kw`` go to ``costmodel.select``
    (``operands``: the operand mode priced, and the one whose records count).  ``device``:
    whose records decide (``lcmac.policy.devices``): the device at hand, a
    ``lcmac.spec.device.DeviceIdentity``, or None for every device's.

    With the plain GEMM measured at this shape, an LCMA that was not measured is judged by
    the model's time × (measured / predicted GEMM time here), so that a prediction is never
    compared with a measurement on different scales; algorithms that only ever failed at
    this shape are left out."""
    check_regime(regime)
    basis = basis_for(_ReadOnce(_store_of(db)), target, dtype, device, profile)
    db, profile = basis.records, basis.profile or profile
    meas, source, logged, tuned_variants, carried = gather(
        M, N, K, dtype, target, db=db, max_distance=max_distance, profile=profile, regime=regime,
        operands=select_kw.get("operands", "native"), precision=precision)
    v_time = meas.pop(_db.VENDOR, None)
    native = select_kw.get("operands", "native") == "native"
    if basis.fitted and v_time is None and not meas and native:
        # the fitted profile's plain GEMM runs at the vendor's rate measured on this device
        v_time = gemm_estimate(M, N, K, model_dtype(target, dtype), profile).time_s
    confirmed = confirmed_ratio(M, N, K, dtype, target, db=db, regime=regime) if source == "exact" else None
    beside = None               # the vendor a confirmation was timed beside
    if confirmed is not None and meas and v_time is not None:
        # the vendor on the kernels' scale: as far behind (ahead of) the best logged kernel
        # as the confirmed one was in the same rounds
        v_time = min(meas.values()) * confirmed[1]
        beside = confirmed[2]
    vendor_cfg = {} if v_time is None else (
        _fastest_vendor(db, logged, dtype, target, regime, beside) or ({"api": beside} if beside else {}))
    failed = failed_at(M, N, K, dtype, target, db=db) if source == "exact" else set()
    kw = dict(select_kw)
    if profile is not None:
        kw["profile"] = profile
    if meas and "algorithms" not in kw:
        kw.update(_with_measured_algorithms(meas, kw.get("levels", (1, 2))))
    operands = select_kw.get("operands", "native")
    mdt = model_dtype(target, dtype, operands)
    cands = select(M, N, K, mdt, target, measurements=meas or None,
                   measured_variants=tuned_variants, **kw)
    cands = [c for c in cands if c.algorithm not in failed]
    cands, scaled_by = _on_measured_scale(cands)
    if select_kw.get("max_error") is not None:
        cands = _within_budget_again(cands, float(select_kw["max_error"]), mdt, operands, K)
    cands, worth = _judged_by_measurement(cands, carried, scaled_by,
                                          vendor_measured=v_time is not None and not basis.fitted)
    if vendor and v_time is not None:
        cands = _with_vendor(cands, v_time, (M, N, K), source, priced=basis.fitted,
                             which=_vendor_named(vendor_cfg))
        if not basis.fitted:
            meas[_db.VENDOR] = v_time
    if carried:
        other = REGIMES[1 - REGIMES.index(regime)]
        cands = [c if c.algorithm not in carried else dataclasses.replace(c, reason=c.reason.replace(
            "measured; ", f"measured in {other} runs × {carried[c.algorithm]:.4f} (this regime's / "
            f"the {other} times of the kernels measured both ways here); ", 1)) for c in cands]
    if basis.note:
        top = cands[0]
        cands = [dataclasses.replace(top, reason=f"{top.reason}; {basis.note}"), *cands[1:]]
    # which vendor GEMM the decision's vendor time is (a CPU has two): the one a vendor plan runs
    api = vendor_cfg.get("api") if get_target(str(target)).family != "cuda" and v_time is not None else None
    return _decided(cands, meas, source, logged, worth, (M, N, K), dtype, target, regime,
                    select_kw.get("max_error"), api)


def _decided(cands: list, meas: dict, source: str, logged, worth: list, shape, dtype, target,
             regime: str, max_error, vendor_api: str | None = None) -> Plan:
    """The ranking as a ``Plan`` that runs its first candidate."""
    c = cands[0]
    speedup = None if c.algorithm == _db.VENDOR else float(c.speedup_vs_gemm)
    error = None if c.error_ratio is None else float(c.error_ratio)
    p = Plan(tuple(int(d) for d in shape), normalize_model_dtype(dtype), str(target), AUTO,
             c.algorithm, c.algorithm, speedup, error, "",
             max_error=None if max_error is None else float(max_error), regime=regime,
             source=source, candidates=tuple(cands),
             measurements=meas, logged_shape=logged, worth_tuning=tuple(worth), vendor_api=vendor_api)
    return dataclasses.replace(p, why=p.describe())


def confirmed_ratio(M, N, K, dtype, target, *, db=None, regime: str = "burst") -> tuple | None:
    """(algorithm, vendor time / its time, the vendor's api or None) of the newest confirmation
    at this shape: the best
    kernel of a CPU tune timed again beside the vendor, over more rounds (``confirm``
    records, ``tuner.confirm_best``), else None.  The decision then puts the vendor's time at
    that ratio to the best logged kernel instead of comparing two times taken in different
    minutes of a machine whose speed moves by more than the margins: the kernels' own times,
    also from different minutes, then only rank lcmac's kernels among themselves."""
    store = _store_of(db)
    shape = [int(M), int(N), int(K)]
    recs = [r for r in store.records(str(target), normalize_model_dtype(dtype))
            if r.get("confirm") and r["shape"] == shape and r.get("vendor_paired_s")
            and regime_of(r) == regime and _db.operands_of(r["config"]) == "native"]
    if not recs:
        return None
    r = max(recs, key=lambda r: r.get("date", ""))
    return r["algorithm"], float(r["vendor_paired_s"]) / r["time_s"], r.get("vendor_api")


def _with_measured_algorithms(meas: dict, levels) -> dict:
    """``select``'s ``algorithms`` when some measured algorithm is outside its default
    candidate list (they take part too), else nothing."""
    names = candidate_names(tuple(sorted(set(levels))))
    known = set(names)
    extra = [a for a in meas if a != _db.GEMM and a not in known]
    return {"algorithms": list(names) + extra} if extra else {}


def _on_measured_scale(cands: list) -> tuple[list, str]:
    """(candidates, whose measurements set the scale): the model's times put on the
    measurements' scale (geometric mean of measured / predicted at this shape), so that a
    prediction never competes with a measurement of another scale.  The model errs alike
    within a kind of kernel (an LCMA's combines and batched GEMM; the plain GEMM's one tile),
    less so across kinds: unmeasured LCMAs take the measured LCMAs' scale, the plain GEMM its
    own, either falling back on the other."""
    def scale(ref, label=None):
        ref = [c for c in ref if c.estimate is not None and c.estimate.time_s > 0]
        if not ref:
            return None
        return (math.exp(sum(math.log(c.predicted_time_s / c.estimate.time_s) for c in ref) / len(ref)),
                label or "/".join(c.algorithm for c in ref))
    g = next(c for c in cands if c.is_gemm)
    by_gemm = scale([g], "GEMM") if g.measured else None
    by_lcmas = scale([c for c in cands if c.measured and not c.is_gemm])
    scale_g, scale_l = by_gemm or by_lcmas, by_lcmas or by_gemm
    if not scale_l:
        return cands, ""

    def rescaled(c):
        sc = scale_g if c.is_gemm else scale_l
        if c.measured or sc is None or abs(sc[0] - 1.0) <= 1e-9:
            return c
        return dataclasses.replace(c, predicted_time_s=c.predicted_time_s * sc[0],
                                   effective_tflops=c.effective_tflops / sc[0],
                                   reason=f"{c.reason}; model time × {sc[0]:.3f} (measured / "
                                          f"predicted {sc[1]} here)")
    cands = [rescaled(c) for c in cands]
    g = next(c for c in cands if c.is_gemm)
    cands = [dataclasses.replace(c, speedup_vs_gemm=g.predicted_time_s / c.predicted_time_s)
             for c in cands]
    return cands, scale_l[1]


def _within_budget_again(cands: list, max_error: float, mdt: str, operands: str, K: int) -> list:
    """The rescaled times can put a candidate ahead that ``select`` did not check against
    the error budget: check again what could now be chosen (known errors are reused)."""
    g = next(c for c in cands if c.is_gemm)
    ok, _ = within_error_budget([c for c in cands if not c.is_gemm], max_error, mdt, operands,
                                K, g.predicted_time_s)
    ok = {c.algorithm: c for c in ok}
    return [c if c.is_gemm else ok[c.algorithm] for c in cands if c.is_gemm or c.algorithm in ok]


def _judged_by_measurement(cands: list, carried: dict, scaled_by: str,
                           vendor_measured: bool = False) -> tuple[list, list]:
    """(candidates with the decision first, LCMAs worth tuning): with a baseline (the GEMM,
    or the vendor GEMM: ``vendor_measured``) and an LCMA measured, the fastest measured one
    (an unmeasured LCMA the model likes, often of another kind — more products, unfused
    combines — is only worth tuning); with LCMAs measured but no baseline, the fastest of the
    measurements and the rescaled model; with only the GEMM measured, an LCMA only on the
    rescaled model's word; with nothing measured, ``select``'s own decision."""
    g = next(c for c in cands if c.is_gemm)
    measured = [c for c in cands if c.measured]
    worth: list = []
    judged = any(c.is_gemm for c in measured) or vendor_measured
    if judged and any(not c.is_gemm for c in measured):
        top = min(measured, key=lambda c: c.predicted_time_s)
        worth = [c.algorithm for c in cands if not c.measured and not c.is_gemm
                 and c.predicted_time_s < top.predicted_time_s][:3]
        g_how = ("predicted" if not g.measured else "measured" if _db.GEMM not in carried
                 else "carried over from the other regime")
        why = (f"decision: fastest measured ({top.predicted_time_s * 1e3:.3f} ms; plain GEMM "
               f"{g.predicted_time_s * 1e3:.3f} ms {g_how})")
        prev = top.reason.replace("decision: ", "").replace("measured; ", "")
        top = dataclasses.replace(top, reason=why if top.is_gemm else f"{why}; {prev}")
    elif measured and not g.measured:
        top = min(cands, key=lambda c: c.predicted_time_s)
        best_m = min(measured, key=lambda c: c.predicted_time_s)
        worth = [c.algorithm for c in cands if not c.measured
                 and c.predicted_time_s < best_m.predicted_time_s][:3]
        kind = "measured" if top.measured else f"predicted, model scaled to the measured {scaled_by}"
        top = dataclasses.replace(top, reason=f"decision: fastest ({kind}, {top.predicted_time_s * 1e3:.3f} "
                                  f"ms); {_strip_decision(top).reason}")
    elif g.measured:
        lc = sorted((c for c in cands if not c.is_gemm), key=lambda c: c.predicted_time_s)
        g_decides = g.reason.startswith(("decision", "measured; decision"))
        if lc and lc[0].predicted_time_s < g.predicted_time_s and not g_decides:
            top = dataclasses.replace(lc[0], reason="decision: predicted faster than the measured "
                                      f"GEMM (not measured yet); {_strip_decision(lc[0]).reason}")
            worth = [top.algorithm]
        else:
            top = g if g_decides else \
                dataclasses.replace(g, reason=f"decision: measured {g.predicted_time_s * 1e3:.3f} ms; no "
                                    "LCMA predicted faster (model scaled to the measured GEMM)")
    else:
        return cands, worth
    return [top] + [_strip_decision(c) for c in cands if c.algorithm != top.algorithm], worth


def _with_vendor(cands: list, v_time: float, shape, source: str, priced: bool = False,
                 which: str = "cuBLAS / numpy's BLAS") -> list:
    """The measured vendor GEMM among the candidates: first when it is faster than the
    decision (times carried over from another shape are ratios measured there: an lcmac
    kernel must beat the vendor GEMM by more than their noise, ``TRANSFER_MARGIN``; at the
    shape itself by ``EXACT_MARGIN``).  ``priced``: its time is a fitted profile's, whose
    rate was measured on the device (``lcmac.policy.devices``), not measured at the shape."""
    gc = next(c for c in cands if c.is_gemm)
    vc = _vendor_candidate(v_time, *shape, gc, which)
    if priced:
        vc = dataclasses.replace(vc, measured=False, reason="priced by the device's fitted "
                                 "profile; the vendor library's GEMM (cuBLAS / numpy's BLAS)")
    top = cands[0]
    margin = EXACT_MARGIN if source == "exact" else TRANSFER_MARGIN
    if v_time < top.predicted_time_s * (1.0 + margin):
        kind = "measured" if top.measured else "predicted"
        # within the margin the vendor GEMM keeps the call, though it may be the slower
        than = ("faster than" if v_time < top.predicted_time_s else
                f"within the {margin:.0%} an lcmac kernel must win by of")
        vc = dataclasses.replace(vc, reason=(
            f"decision: the vendor GEMM ({which}) — {'priced' if priced else 'measured'} "
            f"{v_time * 1e3:.3f} ms, {than} the "
            f"best lcmac kernel ({top.algorithm}, {kind} {top.predicted_time_s * 1e3:.3f} ms)"))
        return [vc] + [_strip_decision(c) for c in cands]
    return [top] + sorted(cands[1:] + [vc], key=lambda c: c.predicted_time_s)
