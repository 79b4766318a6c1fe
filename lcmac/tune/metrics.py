"""How good is the model as a search prior?  Two numbers.

- ``spearman(predicted, measured)``: rank correlation of the model's per-config estimates
  and the measured times over one tuned space (1 = the model orders configs perfectly).
- ``trials_to_within(measured_in_model_order, tol)``: how many configs, taken in the model's
  order, must be measured before one is within ``tol`` (3%) of the best of the whole
  (exhaustively measured) space; also given as a fraction of the space.
"""
from __future__ import annotations

import json
import math
from typing import Sequence


def _ranks(xs: Sequence[float]) -> list[float]:
    """Ranks 1..n, ties get their average rank."""
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    ranks = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for t in range(i, j + 1):
            ranks[order[t]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman's ρ (Pearson correlation of the ranks; ties averaged). NaN below 2 points
    or when one side is constant."""
    if len(a) != len(b):
        raise ValueError(f"spearman: {len(a)} vs {len(b)} values")
    n = len(a)
    if n < 2:
        return math.nan
    ra, rb = _ranks(list(a)), _ranks(list(b))
    ma, mb = sum(ra) / n, sum(rb) / n
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    va = sum((x - ma) ** 2 for x in ra)
    vb = sum((y - mb) ** 2 for y in rb)
    if va == 0 or vb == 0:
        return math.nan
    return cov / math.sqrt(va * vb)


def trials_to_within(times_in_model_order: Sequence[float], tol: float = 0.03) -> tuple[int, float]:
    """(trials, fraction of the space) until a config within ``tol`` of the best is measured."""
    ts = list(times_in_model_order)
    if not ts:
        raise ValueError("trials_to_within: empty space")
    best = min(ts)
    for i, t in enumerate(ts, 1):
        if t <= best * (1 + tol):
            return i, i / len(ts)
    raise AssertionError("unreachable")


def space_report(predicted: Sequence[float], measured: Sequence[float], tol: float = 0.03) -> dict:
    """Both metrics for one exhaustively measured space (pairs in any order)."""
    pairs = sorted(zip(predicted, measured), key=lambda p: p[0])
    trials, frac = trials_to_within([m for _, m in pairs], tol)
    return {"n": len(pairs), "spearman": spearman(predicted, measured),
            "trials_to_within": trials, "fraction_of_space": frac, "tolerance": tol}


# ---- metrics over tuning-log records (scripts/eval_tuner.py) --------------------------------
def _ok(records):
    return [r for r in records if r.get("status") == "ok" and r.get("time_s")]


def _case(r) -> tuple:
    return (r["target"], r["dtype"], r["algorithm"], tuple(r["shape"]))


def search_report(records, tol: float = 0.03, min_coverage: float = 0.9) -> list[dict]:
    """Both search metrics for every case (target, dtype, algorithm, shape) whose ranked space
    was measured (nearly) exhaustively: at least ``min_coverage`` of its ``space_size``
    configs have an ok record.  Model order = the logged ``rank`` (the tuner's order), else
    ``predicted_s``.  Failed configs are left out of both metrics."""
    by: dict[tuple, dict] = {}
    for r in _ok(records):
        if r.get("predicted_s") is None or r.get("space_size") is None:
            continue
        d = by.setdefault(_case(r), {})
        k = json.dumps(r["config"], sort_keys=True)
        if k not in d or r["time_s"] < d[k]["time_s"]:
            d[k] = r
    out = []
    for case, d in sorted(by.items()):
        recs = list(d.values())
        size = max(r["space_size"] for r in recs)
        if len(recs) < max(2, min_coverage * size):
            continue
        recs.sort(key=lambda r: (r.get("rank", math.inf), r["predicted_s"]))
        times = [r["time_s"] for r in recs]
        trials, frac = trials_to_within(times, tol)
        best = min(recs, key=lambda r: r["time_s"])
        out.append({"target": case[0], "dtype": case[1], "algorithm": case[2], "shape": list(case[3]),
                    "space_size": size, "measured": len(recs),
                    "spearman": spearman([r["predicted_s"] for r in recs], times),
                    "trials_to_within": trials, "fraction_of_space": trials / size,
                    "tolerance": tol, "best_time_s": best["time_s"], "best_rank": best.get("rank"),
                    "best_config": best["config"]})
    return out


def tuned_spearman(records, min_trials: int = 3) -> list[dict]:
    """Spearman of the logged prediction vs the measured time within each tuned case with at
    least ``min_trials`` ok configs (the small spaces the tuner actually measured)."""
    by: dict[tuple, list] = {}
    for r in _ok(records):
        if r.get("predicted_s") is not None:
            by.setdefault(_case(r), []).append(r)
    out = []
    for case, recs in sorted(by.items()):
        if len(recs) >= min_trials:
            rho = spearman([r["predicted_s"] for r in recs], [r["time_s"] for r in recs])
            out.append({"target": case[0], "dtype": case[1], "algorithm": case[2],
                        "shape": list(case[3]), "n": len(recs), "spearman": rho})
    return out


def default_speedups(records) -> list[dict]:
    """Tuned vs default: for each case with a record of the backend's default config
    (``default: true``), default time / best time of that case (≥ 1 by construction when the
    default was measured in the same search)."""
    by: dict[tuple, list] = {}
    for r in _ok(records):
        by.setdefault(_case(r), []).append(r)
    out = []
    for case, recs in sorted(by.items()):
        defs = [r for r in recs if r.get("default")]
        if not defs:
            continue
        t_def = min(r["time_s"] for r in defs)
        best = min(recs, key=lambda r: r["time_s"])
        out.append({"target": case[0], "dtype": case[1], "algorithm": case[2],
                    "shape": list(case[3]), "default_s": t_def, "best_s": best["time_s"],
                    "speedup": t_def / best["time_s"], "trials": len(recs)})
    return out


def geomean(xs) -> float:
    xs = [x for x in xs if x and x > 0 and math.isfinite(x)]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else math.nan


def best_options(records, target, dtype) -> dict[tuple, dict[str, float]]:
    """{shape: {algorithm: best measured seconds}} ("vendor" included)."""
    out: dict[tuple, dict[str, float]] = {}
    for r in _ok(records):
        if r["target"] != target or r["dtype"] != dtype:
            continue
        per = out.setdefault(tuple(r["shape"]), {})
        per[r["algorithm"]] = min(per.get(r["algorithm"], math.inf), r["time_s"])
    return out


def decision_quality(options: dict, choices: dict, tol: float = 0.03,
                     vendor_tol: float = 0.02, vendor: str = "vendor") -> dict:
    """How good were the choices?  ``options``: {shape: {algorithm: measured seconds}} (the
    vendor GEMM under ``vendor``); ``choices``: {shape: chosen algorithm}.  Per shape the
    chosen option's measured time against (a) the best measured option (any lcmac kernel or
    the vendor's), (b) the best lcmac kernel (GEMM or any LCMA), (c) the vendor GEMM.  A
    choice that was not measured at its shape counts as a miss ("unmeasured")."""
    rows, hit, hit_lcmac, slower_vendor, unmeasured, n_vendor = [], 0, 0, 0, 0, 0
    worst = 1.0
    for shape, opts in sorted(options.items()):
        if shape not in choices:
            continue
        ch = choices[shape]
        best_all = min(opts.values())
        lc = {a: t for a, t in opts.items() if a != vendor}
        best_lc = min(lc.values()) if lc else math.nan
        t = opts.get(ch)
        row = {"shape": list(shape), "choice": ch, "time_s": t, "best": min(opts, key=opts.get),
               "best_s": best_all, "best_lcmac_s": best_lc, "vendor_s": opts.get(vendor)}
        if t is None:
            unmeasured += 1
            row["verdict"] = "unmeasured"
        else:
            row["vs_best"] = t / best_all
            hit += t <= best_all * (1 + tol)
            if lc:
                hit_lcmac += t <= best_lc * (1 + tol)
            if vendor in opts:
                n_vendor += 1
                row["vs_vendor"] = t / opts[vendor]
                worst = max(worst, t / opts[vendor])
                slower_vendor += t > opts[vendor] * (1 + vendor_tol)
        rows.append(row)
    n = len(rows)
    return {"n": n, "within_tol_of_best": hit / n if n else math.nan,
            "within_tol_of_best_lcmac": hit_lcmac / n if n else math.nan,
            "slower_than_vendor_by_more_than_tol": slower_vendor, "compared_with_vendor": n_vendor,
            "worst_vs_vendor": worst if n_vendor else math.nan, "unmeasured_choices": unmeasured,
            "tolerance": tol, "vendor_tolerance": vendor_tol, "rows": rows}
