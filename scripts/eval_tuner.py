#!/usr/bin/env python
"""The autotuner's metrics (issue 5), recomputed from the committed tuning logs — no GPU, no
compiler, no timing here.

    python scripts/eval_tuner.py                       # lcmac/data/tuning_logs/ → bench/results/tuner-eval.json
    python scripts/eval_tuner.py --logs DIR --out FILE --plots DIR

Per log file (target × dtype):

* **search**: on every (nearly) exhaustively measured space (``lcmac tune --exhaustive``),
  Spearman's ρ between the model's per-config prediction (as logged at tuning time) and the
  measured time, and the trials needed — in the tuner's order, i.e. the model's ranking — to
  get within 3 % of the best config of the whole space (also as a fraction of the space);
  ρ is also recomputed with the current model (``costmodel.config_estimates.estimate``),
  and over the small spaces of the shape-by-shape tuning (≥ 3 configs);
* **tuned vs default**: the best measured config over the backend's default config, per case
  (records flagged ``default``, or the space's record of the same kernel);
* **decision quality** on the logged shapes: options = the best measured time of every
  algorithm at the shape (GEMM, LCMAs, and the vendor GEMM measured in the same run);
  ``decide_by_measurement`` is asked (a) with the whole log (in-sample: what ``lcmac`` does
  at run time), (b) leave-one-shape-out (the shape's own records hidden: does the log generalise?),
  (c) with no log (the model alone), and (d) in-sample without the vendor option (is the
  vendor fallback needed?).  For each: the share of shapes whose choice is within 3 % of the
  best measured option, within 3 % of the best lcmac kernel, and how often (and by how much
  at worst) the choice is more than 2 % slower than the vendor GEMM;
* **calibration**: the profile's efficiencies fitted to the log (log-RMS error before/after);
* a predicted-vs-measured plot per log (``--plots``).
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import sys
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from lcmac.artifact import tuning_log as tdb  # noqa: E402
from lcmac.costmodel.config_estimates import estimate  # noqa: E402
from lcmac.tune import metrics, space  # noqa: E402
from lcmac.tune.calibrate import calibrate  # noqa: E402
from lcmac.policy.measured import decide_by_measurement  # noqa: E402
from lcmac.tune.tuner import resolved_config  # noqa: E402


class ListDB:
    """The part of ``TuningDB`` that ``decide_by_measurement`` reads, over a list of records."""

    def __init__(self, records):
        self._r = list(records)

    def records(self, target=None, dtype=None, include_errors=False):
        for r in self._r:
            if (target is None or r["target"] == target) and (dtype is None or r["dtype"] == dtype) \
                    and (include_errors or r["status"] == "ok"):
                yield r


def default_equivalent(records):
    """Records flagged ``default``, plus, for cases without one, the space's record of the
    same kernel as the backend's default config (e.g. CudaConfig() = 128×256×64, 4 stages)."""
    have = {metrics._case(r) for r in records if r.get("default")}
    out = []
    for r in records:
        if r.get("default") or metrics._case(r) in have or r["algorithm"] == tdb.VENDOR:
            continue
        try:
            d = space.default_config(r["target"], r["dtype"])
        except Exception:  # noqa: BLE001
            continue
        if d is not None and resolved_config(d, r["dtype"]) == resolved_config(r["config"], r["dtype"]):
            out.append({**r, "default": True})
    return out


def current_model_spearman(case_rows, records):
    """ρ of the current model's per-config estimate vs the logged times of one case."""
    out = []
    for c in case_rows:
        recs = [r for r in records if r.get("status") == "ok" and metrics._case(r) ==
                (c["target"], c["dtype"], c["algorithm"], tuple(c["shape"]))]
        try:
            pred = [estimate(c["target"], c["dtype"], c["shape"], c["algorithm"],
                             space.config_from_dict(c["target"], r["config"]))["time_s"]
                    for r in recs]
        except Exception as e:  # noqa: BLE001 - a config class that changed incompatibly
            out.append({"error": f"{type(e).__name__}: {e}"})
            continue
        out.append({"spearman_current_model": metrics.spearman(pred, [r["time_s"] for r in recs]),
                    "n": len(recs)})
    return out


def decisions(records, target, dtype):
    opts = metrics.best_options(records, target, dtype)
    # only shapes where the comparison means something: GEMM and the vendor measured
    opts = {s: o for s, o in opts.items() if tdb.GEMM in o}
    ok = [r for r in records if r["status"] == "ok"]
    ch_in, ch_out, ch_model, ch_novendor = {}, {}, {}, {}

    def choice(shape, recs, **kw):
        return decide_by_measurement(*shape, dtype, target, db=ListDB(recs), **kw).algorithm
    for shape in opts:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ch_in[shape] = choice(shape, ok)
            ch_novendor[shape] = choice(shape, ok, vendor=False)
            ch_out[shape] = choice(shape, [r for r in ok if tuple(r["shape"]) != shape])
            ch_model[shape] = choice(shape, [])
    return {"in_sample": metrics.decision_quality(opts, ch_in),
            "leave_one_shape_out": metrics.decision_quality(opts, ch_out),
            "model_only": metrics.decision_quality(opts, ch_model),
            "in_sample_without_vendor_option": metrics.decision_quality(opts, ch_novendor)}


def summarize_decision(q):
    return {k: q[k] for k in q if k != "rows"}


def evaluate(path, plots_dir=None):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        store = tdb.TuningDB(os.path.dirname(path))
        allrec = list(store.records(include_errors=True))   # what builds use: current templates
    name = os.path.basename(path)
    # one precision: the native kernels (CUDA scaled-operand searches are logged beside them)
    records = [r for r in allrec if tdb.log_path("", r["target"], r["dtype"]).name == name
               and tdb.operands_of(r["config"]) == "native"]
    if not records:
        return None
    target, dtype = records[0]["target"], records[0]["dtype"]
    ok = [r for r in records if r["status"] == "ok"]
    devices = sorted({r.get("device", "?") for r in records})
    dates = sorted(r["date"] for r in records)
    search = metrics.search_report(ok)
    for row, cur in zip(search, current_model_spearman(search, ok)):
        row.update(cur)
    tuned = metrics.tuned_spearman([r for r in ok if r.get("tag") != "exhaustive"])
    rhos = [t["spearman"] for t in tuned if t["spearman"] == t["spearman"]]
    sp = metrics.default_speedups(ok + default_equivalent(ok))
    out = {"log": os.path.relpath(path, ROOT), "target": target, "dtype": dtype,
           "devices": devices, "dates": [dates[0], dates[-1]],
           "records": len(records), "ok": len(ok), "errors": len(records) - len(ok),
           "shapes": len({tuple(r["shape"]) for r in records}),
           "algorithms": sorted({r["algorithm"] for r in records}),
           "search": search,
           "tuned_spaces_spearman": {"cases": len(tuned),
                                     "median": sorted(rhos)[len(rhos) // 2] if rhos else None,
                                     "mean": sum(rhos) / len(rhos) if rhos else None},
           "tuned_vs_default": {"cases": len(sp), "geomean": metrics.geomean(x["speedup"] for x in sp),
                                "max": max((x["speedup"] for x in sp), default=None),
                                "by_algorithm": {a: metrics.geomean(x["speedup"] for x in sp if x["algorithm"] == a)
                                                 for a in sorted({x["algorithm"] for x in sp})},
                                "rows": sp}}
    try:
        out["decision"] = decisions(records, target, dtype)
    except Exception as e:  # noqa: BLE001
        out["decision"] = {"error": f"{type(e).__name__}: {e}"}
    try:
        cal = calibrate(ok, target, dtype)
        out["calibration"] = {"values": cal.values, "before": cal.before, "after": cal.after, "points": cal.n}
    except Exception as e:  # noqa: BLE001
        out["calibration"] = {"error": f"{type(e).__name__}: {e}"}
    if plots_dir:
        try:
            from lcmac.tune.plot import plot_predicted_vs_measured
            pts = [("exhaustive " + r["algorithm"] if r.get("tag") == "exhaustive" else r["algorithm"],
                    r["predicted_s"], r["time_s"]) for r in ok if r.get("predicted_s")]
            png = os.path.join(plots_dir, f"tuner-{name[:-6]}.png")
            plot_predicted_vs_measured(pts, png, f"{target} {dtype}, {len(pts)} configs\n{', '.join(devices)}")
            out["plot"] = os.path.relpath(png, ROOT)
        except Exception as e:  # noqa: BLE001
            out["plot"] = f"failed: {e}"
    return out


def fmt(x, f="{:.3f}"):
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f.format(x)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--logs", default=os.path.join(ROOT, "lcmac", "data", "tuning_logs"))
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "tuner-eval.json"))
    ap.add_argument("--plots", default=os.path.join(ROOT, "bench", "results"))
    ap.add_argument("--no-plots", action="store_true")
    args = ap.parse_args()
    files = sorted(os.path.join(args.logs, f) for f in os.listdir(args.logs) if f.endswith(".jsonl"))
    res = [r for r in (evaluate(f, None if args.no_plots else args.plots) for f in files) if r]
    doc = {"schema": "lcmac-tuner-eval/1", "command": " ".join(["python"] + sys.argv),
           "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
           "note": "recomputed from the tuning logs; each log's devices and measurement dates "
                   "are listed with it", "logs": res}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1, default=str)
    for r in res:
        print(f"\n== {r['log']}: {r['target']} {r['dtype']} on {', '.join(r['devices'])} "
              f"({r['ok']} ok / {r['errors']} failed records, {r['shapes']} shapes, {r['dates'][0][:10]})")
        for s in r["search"]:
            print(f"  exhaustive {s['algorithm']} {'x'.join(map(str, s['shape']))}: {s['measured']}/{s['space_size']} "
                  f"configs, Spearman {fmt(s['spearman'])} (current model {fmt(s.get('spearman_current_model'))}), "
                  f"within 3% after {s['trials_to_within']} trials ({100 * s['fraction_of_space']:.1f}% of the space)")
        t = r["tuned_spaces_spearman"]
        print(f"  tuned spaces (≥3 configs): {t['cases']} cases, Spearman median {fmt(t['median'])}, mean {fmt(t['mean'])}")
        d = r["tuned_vs_default"]
        print(f"  tuned vs default: {d['cases']} cases, geomean {fmt(d['geomean'])}x, max {fmt(d['max'])}x, "
              + ", ".join(f"{a} {fmt(v)}x" for a, v in d["by_algorithm"].items()))
        for k, q in (r.get("decision") or {}).items():
            if not isinstance(q, dict) or "n" not in q:
                print(f"  decision: {q}")
                continue
            print(f"  decision {k:32s} n={q['n']:3d}  within 3% of best {100 * q['within_tol_of_best']:5.1f}%  "
                  f"of best lcmac {100 * q['within_tol_of_best_lcmac']:5.1f}%  >2% slower than vendor: "
                  f"{q['slower_than_vendor_by_more_than_tol']}/{q['compared_with_vendor']} (worst "
                  f"{fmt(q['worst_vs_vendor'])}x)  unmeasured {q['unmeasured_choices']}")
        c = r.get("calibration", {})
        if "before" in c:
            print(f"  calibration on {c['points']} points: log-RMS {c['before']['log_rms']:.3f} → {c['after']['log_rms']:.3f} "
                  f"({', '.join(f'{k}={v:.3g}' for k, v in c['values'].items())})")
    print(f"\nwrote {os.path.relpath(args.out, ROOT)}")


if __name__ == "__main__":
    main()
