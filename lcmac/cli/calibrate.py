"""``lcmac calibrate``: a compact tuning sweep on the device at hand into the user's tuning log
(lcmac.tune.sweep), after which every decision on this device reads its own records; prints
what was measured and what is decided now at each shape (docs/tuning.md)."""
from __future__ import annotations

import argparse
import sys
import tempfile

from lcmac.artifact.tuning_log import TuningDB
from lcmac.policy import EveryKernel, plan
from lcmac.spec.targets import schedule_family
from lcmac.tune.calibrate import calibrate_from_db
from lcmac.tune.sweep import SIZES, calibrate_device, calibration_shapes
from lcmac.cli.arguments import (
    DTYPE_HELP, TARGET_NAMES, non_negative_int, positive_int, shape_arg, target_name)
from lcmac.cli.exit_codes import FAILURE, UsageError
from lcmac.cli.output import add_json_argument, dump_json, table
from lcmac.cli.tune import _dry_measure, _result_rows, _tune_doc


def sizes_arg(text: str) -> tuple[int, ...]:
    """``--sizes``: square sides, comma-separated positive integers."""
    try:
        sides = tuple(int(p) for p in text.split(",") if p.strip())
    except ValueError:
        sides = ()
    if not sides or min(sides) < 1:
        raise argparse.ArgumentTypeError(f"sizes {text!r} must be positive integers, "
                                         "e.g. 1024,2048")
    return sides


def _model_fit(args, db, device) -> dict | None:
    """How the cost model fits this device's records, before and after fitting its
    efficiencies (lcmac.tune.calibrate); None where they hold no lcmac kernel."""
    try:
        c = calibrate_from_db(args.target, args.dtype, db=db, device=device)
    except ValueError:
        return None
    return {"points": c.n, "log_rms_before": c.before["log_rms"],
            "log_rms_after": c.after["log_rms"], "values": c.values}


def cmd_calibrate(args) -> int:
    args.target = target_name(args.target)
    if args.budget_s <= 0:
        raise UsageError(f"--budget-s must be a positive number of seconds, got {args.budget_s:g}")
    if args.shape and args.sizes:
        raise UsageError("give --shape or --sizes, not both")
    gpu = schedule_family(args.target) == "cuda"
    shapes = args.shape or calibration_shapes(args.target, args.sizes)
    logs = args.logs
    if args.dry_run and logs is None:
        logs = tempfile.mkdtemp(prefix="lcmac-dry-run-")
    store = TuningDB(logs)

    def on_shape(i, n, shape):
        print(f"[{i + 1}/{n}] calibrating {'x'.join(map(str, shape))} {args.dtype} on "
              f"{args.target}", file=sys.stderr)
    timing = dict(repeats=15, min_run_s=0.01, warmup=3) if gpu else dict(repeats=5)
    measure_for = (lambda s: _dry_measure(args.target, args.dtype, s)) if args.dry_run else None
    res = calibrate_device(args.target, args.dtype, shapes, budget=args.budget,
                           top_lcmas=args.top_lcmas, budget_s=args.budget_s, db=store,
                           progress=False if args.quiet else sys.stderr,
                           measure_for=measure_for, on_shape=on_shape,
                           jobs=args.jobs, **timing)
    decided = [plan(*r.shape, res.dtype, args.target, logs=logs, kernels=EveryKernel())
               for r in res.results]
    fit = _model_fit(args, logs, res.device)
    ok = bool(res.results) and all(r.best is not None for r in res.results)
    if args.json:
        dump_json("calibrate", {
            "device": res.device.to_dict(), "fingerprint": res.device.fingerprint,
            "target": res.target, "dtype": res.dtype, "dry_run": args.dry_run, "logs": res.logs,
            "seconds": res.seconds, "skipped": [list(s) for s in res.skipped],
            "results": [_tune_doc("", r) for r in res.results],
            "decisions": [{"shape": list(p.shape), "decision": p.decision, "source": p.source,
                           "why": p.why} for p in decided],
            "model_fit": fit, "ok": ok})
        return 0 if ok else FAILURE
    rows = [row for r in res.results for row in _result_rows(r, 1e3 if gpu else 1.0)]
    print(f"device: {res.device.describe()}\n")
    print(table(rows, ["shape", "algorithm", "trials", "best ms", "TFLOP/s" if gpu else "GFLOP/s",
                       "model ms", "spearman", "vs default", "vs vendor", "best"]))
    print("\n" + table([["x".join(map(str, p.shape)), p.decision, p.source] for p in decided],
                       ["shape", "decided now", "from"]))
    if res.skipped:
        print(f"\nnot measured within --budget-s {args.budget_s:g}: "
              + ", ".join("x".join(map(str, s)) for s in res.skipped))
    if fit is not None:
        print(f"\ncost model on this device's records: log-RMS error {fit['log_rms_before']:.3f}, "
              f"{fit['log_rms_after']:.3f} with its efficiencies fitted ({fit['points']} points)")
    print(f"\nlogged to {res.logs}" + ("  (dry run: model × noise, nothing built)" if args.dry_run
                                        else "; decisions on this device now read these records"))
    return 0 if ok else FAILURE


def add_calibrate_parser(sub) -> None:
    s = sub.add_parser("calibrate", help="measure the device at hand for the decisions made on it",
                       description="A compact tuning sweep on the device at hand: the vendor GEMM, "
                                   "lcmac's plain GEMM and the cost model's best LCMAs at a few "
                                   "square shapes, logged to the user's tuning log with the "
                                   "device's identity. Decisions on this device then read these "
                                   "records, and no other device's (docs/tuning.md).")
    s.add_argument("--target", default=None,
                   help=f"one of {TARGET_NAMES}; 'cuda' (the GPU present) or 'host' (default: "
                        "this CPU)")
    s.add_argument("--dtype", default="float32", help=DTYPE_HELP)
    s.add_argument("--sizes", type=sizes_arg, default=None, metavar="N,N,...",
                   help=f"square sides to measure (default {','.join(map(str, SIZES['cpu']))} on "
                        f"a CPU, {','.join(map(str, SIZES['cuda']))} on a GPU)")
    s.add_argument("--shape", type=shape_arg, action="append", default=None, metavar="MxNxK",
                   help="a shape to measure instead of the squares (repeatable)")
    s.add_argument("--budget-s", type=float, default=600.0, metavar="S",
                   help="start no shape after S seconds, nor one the last shape's time says "
                        "would end after them (default 600)")
    s.add_argument("--budget", type=positive_int, default=1,
                   help="configs measured per algorithm beside its default one (default 1)")
    s.add_argument("--top-lcmas", type=non_negative_int, default=2, help="LCMAs measured per shape (default 2)")
    s.add_argument("--jobs", type=positive_int, default=2, help="parallel compile processes (default 2)")
    s.add_argument("--logs", default=None, metavar="DIR",
                   help="tuning-log directory to write and decide from (default: the user's, "
                        "as lcmac tune)")
    s.add_argument("--dry-run", action="store_true",
                   help="build and run nothing: 'measure' the model's estimate with ±15%% noise "
                        "(logs to a temporary directory unless --logs), to try the flow")
    s.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    add_json_argument(s, "calibrate")
    s.set_defaults(func=cmd_calibrate)
