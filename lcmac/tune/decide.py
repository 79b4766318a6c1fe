"""The decision that learns: measurements from the tuning log override the model.

``decide(M, N, K, dtype, target)`` gathers, per algorithm, the best logged time for this
shape and hands them to ``lcmac.costmodel.select`` through its ``measurements=`` hook:

- exact shape logged → those times are used as they are;
- otherwise the nearest logged shape (log-space distance ≤ ``max_distance``) at which the
  plain GEMM was measured too → each algorithm's *measured speed-up over GEMM* there is
  applied to the model's GEMM time for the asked shape (absolute times do not transfer
  between shapes, ratios roughly do);
- nothing logged → the model alone.

Then the rule "measurement is the judge": when the GEMM and at least one LCMA are measured,
the fastest *measured* one is the decision (an unmeasured LCMA the model likes is only
reported as worth tuning); otherwise ``select``'s own decision stands — which already falls
back to the plain GEMM when no LCMA is predicted to win or the GEMM is memory-bound.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from . import db as _db


@dataclass
class Decision:
    candidate: object                      # lcmac.costmodel.Candidate: the decision
    candidates: list                       # all, decision first
    measurements: dict                     # algorithm → seconds handed to select
    source: str                            # "exact" | "nearest MxNxK (d=…)" | "model"
    logged_shape: tuple | None = None
    worth_tuning: list = field(default_factory=list)

    @property
    def algorithm(self) -> str:
        return self.candidate.algorithm

    def describe(self) -> str:
        c = self.candidate
        src = {"model": "model only (nothing logged)", "exact": "measured at this shape"}.get(
            self.source, f"measured at the {self.source}")
        s = f"{c.algorithm} ({src}; {c.reason})"
        if self.worth_tuning:
            s += f"; not measured yet but predicted faster: {', '.join(self.worth_tuning)}"
        return s


def gather(M, N, K, dtype, target, *, db=None, max_distance: float = 0.75,
           profile=None) -> tuple[dict, str, tuple | None]:
    """(measurements for select, source, logged shape) from the tuning log."""
    from ..costmodel import gemm_estimate
    from ..costmodel.profiles import normalize_dtype
    from ..costmodel.decision import _resolve
    store = db if isinstance(db, _db.TuningDB) else _db.TuningDB(db)
    d = normalize_dtype(dtype)
    best: dict[tuple, dict[str, float]] = {}
    for r in store.records(str(target), d):
        per = best.setdefault(tuple(r["shape"]), {})
        a = r["algorithm"]
        if a not in per or r["time_s"] < per[a]:
            per[a] = r["time_s"]
    shape = (int(M), int(N), int(K))
    if shape in best:
        return dict(best[shape]), "exact", shape
    near = sorted((_db.shape_distance(shape, s), s) for s, per in best.items() if _db.GEMM in per)
    if not near or near[0][0] > max_distance:
        return {}, "model", None
    dist, s = near[0]
    p, d = _resolve(target, d, profile)
    g_model = gemm_estimate(M, N, K, d, p).time_s
    per = best[s]
    meas = {a: g_model * t / per[_db.GEMM] for a, t in per.items()}
    return meas, f"nearest logged shape {s[0]}x{s[1]}x{s[2]} (log-distance {dist:.2f})", s


def decide(M: int, N: int, K: int, dtype="float32", target="x86_64-avx512", *, db=None,
           profile=None, max_distance: float = 0.75, **select_kw) -> Decision:
    """GEMM or which LCMA for this shape, preferring logged measurements (module doc)."""
    from ..costmodel import select
    meas, source, logged = gather(M, N, K, dtype, target, db=db, max_distance=max_distance,
                                  profile=profile)
    kw = dict(select_kw)
    if profile is not None:
        kw["profile"] = profile
    if meas:
        # algorithms measured but outside select's default candidate list still take part
        try:
            from ..costmodel.decision import candidate_names
            names = set(candidate_names(tuple(sorted(set(kw.get("levels", (1, 2)))))))
            extra = [a for a in meas if a != _db.GEMM and a not in names]
            if extra and "algorithms" not in kw:
                kw["algorithms"] = list(names) + extra
        except Exception:  # noqa: BLE001
            pass
    cands = select(M, N, K, dtype, target, measurements=meas or None, **kw)
    worth = []
    measured = [c for c in cands if c.measured]
    if any(c.is_gemm for c in measured) and any(not c.is_gemm for c in measured):
        top = min(measured, key=lambda c: c.predicted_time_s)
        g = next(c for c in measured if c.is_gemm)
        # the model's unmeasured predictions, rescaled by how far it missed the measured GEMM
        scale = g.predicted_time_s / g.estimate.time_s if g.estimate is not None else 1.0
        worth = [c.algorithm for c in cands if not c.measured and not c.is_gemm
                 and c.predicted_time_s * scale < top.predicted_time_s][:3]
        why = (f"decision: fastest measured ({top.predicted_time_s * 1e3:.3f} ms; plain GEMM "
               f"{g.predicted_time_s * 1e3:.3f} ms measured)")
        prev = top.reason.replace("decision: ", "").replace("measured; ", "")
        top = dataclasses.replace(top, reason=why if top.is_gemm else f"{why}; {prev}")
        rest = [c for c in cands if c.algorithm != top.algorithm]
        rest = [dataclasses.replace(c, reason=c.reason.replace("decision: ", "", 1))
                if c.reason.startswith("decision: ") else c for c in rest]
        cands = [top] + rest
    return Decision(cands[0], cands, meas, source, logged, worth)
