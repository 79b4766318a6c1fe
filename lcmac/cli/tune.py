"""``lcmac tune``: measure configs in the cost model's order, log every measurement and
print (or, with ``--json``, emit) the best per shape (lcmac.tune.tuner; docs/tuning.md)."""
from __future__ import annotations

import argparse
import hashlib
import math
import sys
import tempfile

from lcmac.artifact.tuning_log import TuningDB
from lcmac.costmodel import gemm_estimate, model_dtype, resolve_profile
from lcmac.spec.cuda.operands import OPERAND_MODES
from lcmac.spec.targets import schedule_family
from lcmac.tune import tuner
from lcmac.tune.llm_shapes import llm_cpu_shapes, llm_shapes
from lcmac.tune.plot import plot_predicted_vs_measured
from lcmac.cli.arguments import (
    DTYPE_HELP, TARGET_NAMES, non_negative_int, positive_int, shape_arg, target_name)
from lcmac.cli.exit_codes import FAILURE, UsageError
from lcmac.cli.output import add_json_argument, dump_json, table
from lcmac.cli.output_dir import writable_output_dir
from lcmac.cli.precision import max_error_arg
from lcmac.core.shapes import SHAPE_HELP


#: the longest warm-up ``tuner.tune`` takes (its sustained_s)
MAX_SUSTAINED_S = 60


def _tune_cases(args) -> list | None:
    if args.shapes in ("llm", "llm-cpu"):
        fn = llm_shapes if args.shapes == "llm" else llm_cpu_shapes
        return fn(ms=args.m, limit=args.limit)
    if args.shape:
        return [("", args.shape)]
    return None


def _dry_measure(target, dtype, shape, seed: int = 0):
    """--dry-run: no compiler, no kernel — the model's estimate × a deterministic ±15 %
    'measurement' (the vendor: the cost model's plain-GEMM time × the same noise), to try the
    command's flow."""
    def fake(pt):
        h = int(hashlib.sha1(f"{seed}|{shape}|{pt.algorithm}|{pt.key}".encode()).hexdigest()[:8], 16)
        noise = 0.85 + 0.3 * (h / 0xFFFFFFFF)
        t = pt.predicted_s
        if pt.algorithm == "vendor":
            p, d = resolve_profile(target, model_dtype(target, dtype), None)
            t = gemm_estimate(*shape, d, p).time_s
        if t is None or not math.isfinite(t):
            return None
        return t * noise, 0.01
    return fake


def _tune_refusal(args, gpu: bool) -> str:
    """Why these options cannot be tuned together ('' when they can)."""
    if args.sustained is not None and not gpu:
        return ("--sustained is a GPU measurement (the power-capped steady state); CPU timings "
                "are taken as they are")
    if args.sustained is not None and not 0 < args.sustained <= MAX_SUSTAINED_S:
        return f"--sustained must be seconds in (0, {MAX_SUSTAINED_S}], got {args.sustained:g}"
    if args.operands != "native" and not gpu:
        return "--operands is a CUDA option (scaled fp16 or block-scaled fp8 operands)"
    if args.dry_run and (args.build_only or args.prebuilt):
        return "--dry-run does not combine with --build-only/--prebuilt"
    return ""


def _tune_options(args, gpu: bool, store) -> dict:
    """``tuner.tune``'s keyword options from the command line."""
    kw = dict(budget=args.budget, patience=args.patience, db=store, top_lcmas=args.top_lcmas,
              repeats=args.repeats or (15 if gpu else 5), progress=False if args.quiet else sys.stderr,
              measure_default=args.compare_default, exhaustive=args.exhaustive, tag=args.tag,
              vendor=args.vendor, max_error=args.max_error)
    if args.sustained is not None:
        kw["sustained_s"] = args.sustained
    if args.operands != "native":
        kw["operands"] = args.operands
    if gpu:
        kw.update(min_run_s=0.01, warmup=3)
    return kw


def _result_rows(r, rate: float) -> list[list]:
    """The summary table's rows of one shape's ``TuneResult`` (``rate``: 1e3 for TFLOP/s)."""
    rows = []
    best = r.best
    shape = "x".join(map(str, r.shape))
    vendor_best = bool(r.vendor_time and best is not None and r.vendor_time < best.time_s)
    for row in r.summary_rows():
        rows.append([shape, row["algorithm"], row["trials"],
                     f"{row['best_ms']:.3f}", f"{row['gflops'] / rate:.1f}", f"{row['predicted_ms']:.3f}",
                     "-" if row["spearman"] != row["spearman"] or row["trials"] < 3
                     else f"{row['spearman']:.2f}",
                     "-" if row["default_ms"] != row["default_ms"] else f"{row['default_ms'] / row['best_ms']:.2f}x",
                     "-" if row["vs_vendor"] != row["vs_vendor"] else f"{row['vs_vendor']:.3f}x",
                     "*" if best is not None and row["algorithm"] == best.point.algorithm
                     and not vendor_best else ""])
    if r.vendor_time:
        M, N, K = r.shape
        rows.append([shape, f"vendor ({r.vendor_config.get('library', '?')})", 1,
                     f"{r.vendor_time * 1e3:.3f}", f"{2 * M * N * K / r.vendor_time / 1e9 / rate:.1f}",
                     "-", "-", "-", "1.000x",
                     "*" if best is None or r.vendor_time < best.time_s else ""])
    if best is None:
        rows.append([shape, "(all failed)", len(r.trials), "-", "-", "-", "-", "-", "-", ""])
        for t in r.trials[:3]:
            print(f"  failed: {t.error}", file=sys.stderr)
    return rows


def _tune_doc(label: str, r) -> dict:
    """One shape's ``TuneResult`` in ``lcmac-tune/1``."""
    M, N, K = r.shape
    best = r.best
    vendor_best = bool(r.vendor_time and (best is None or r.vendor_time < best.time_s))
    return {"label": label, "shape": {"M": M, "N": N, "K": K},
            "best": ({"algorithm": "vendor", "time_s": r.vendor_time, "config": r.vendor_config}
                     if vendor_best else None if best is None else
                     {"algorithm": best.point.algorithm, "time_s": best.time_s,
                      "config": best.point.config_dict()}),
            "vendor_s": r.vendor_time, "algorithms": r.summary_rows(),
            "failures": [t.error for t in r.trials if not t.ok][:10]}


def cmd_tune(args) -> int:
    args.target = target_name(args.target)
    cases = _tune_cases(args)
    gpu = schedule_family(args.target) == "cuda"
    why = "give --shape MxNxK or --shapes llm|llm-cpu" if not cases else _tune_refusal(args, gpu)
    if why:
        raise UsageError(why)
    if args.build_only:
        writable_output_dir(args.build_only, "--build-only")
    algo = args.algo if "," not in args.algo else [a.strip() for a in args.algo.split(",")]
    logs = args.logs
    if args.dry_run and logs is None:
        logs = tempfile.mkdtemp(prefix="lcmac-dry-run-")
    store = TuningDB(logs)
    kw = _tune_options(args, gpu, store)
    results, rows, docs = [], [], []

    def add_rows(label, r):
        results.append(r)
        docs.append(_tune_doc(label, r))
        rows.extend(_result_rows(r, 1e3 if gpu else 1.0))   # GFLOP/s on CPUs, TFLOP/s on GPUs

    if args.build_only or args.prebuilt or (gpu and not args.dry_run and args.jobs > 1 and len(cases) > 1):
        for i, (label, shape) in enumerate(cases, 1):
            print(f"[{i}/{len(cases)}] {label + ' ' if label else ''}{'x'.join(map(str, shape))} "
                  f"{args.dtype} on {args.target}", file=sys.stderr)
        tuner.tune_many(cases, algo, args.target, args.dtype, jobs=args.jobs,
                        prebuilt=args.prebuilt, build_dir=args.build_only or args.build_dir,
                        build_only=bool(args.build_only), on_result=add_rows, **kw)
        if args.build_only:
            if args.json:
                dump_json("tune", {"target": args.target, "dtype": args.dtype,
                                   "built_into": args.build_only, "results": []})
                return 0
            print(f"built into {args.build_only} (index.jsonl); measure elsewhere with "
                  f"`lcmac tune ... --prebuilt {args.build_only}`")
            return 0
    else:
        for i, (label, shape) in enumerate(cases, 1):
            fake = _dry_measure(args.target, args.dtype, shape) if args.dry_run else None
            print(f"[{i}/{len(cases)}] tuning {label + ' ' if label else ''}{'x'.join(map(str, shape))} "
                  f"{args.dtype} on {args.target}", file=sys.stderr)
            add_rows(label, tuner.tune(algo, args.target, args.dtype, shape, jobs=args.jobs,
                                       measure_fn=fake, **kw))
    ok = bool(results) and all(r.best is not None for r in results)
    plot = None
    if args.plot:
        try:
            trials = [t for r in results for t in r.trials]
            plot = str(plot_predicted_vs_measured(trials, args.plot, f"{args.target} {args.dtype}"))
        except RuntimeError as e:
            print(f"lcmac tune: {e}", file=sys.stderr)
    if args.json:
        dump_json("tune", {"target": args.target, "dtype": args.dtype, "dry_run": args.dry_run,
                           "logs": str(store.root), "plot": plot, "ok": ok, "results": docs})
        return 0 if ok else FAILURE
    print(table(rows, ["shape", "algorithm", "trials", "best ms", "TFLOP/s" if gpu else "GFLOP/s",
                        "model ms", "spearman", "vs default", "vs vendor", "best"]))
    print(f"\nlogged to {store.root}" + ("  (dry run: model × noise, nothing built)" if args.dry_run
                                          else "  (`lcmac build` uses the best logged config for a shape)"))
    if plot:
        print(f"plot: {plot}")
    return 0 if ok else FAILURE


def add_tune_parser(sub) -> None:
    s = sub.add_parser("tune", help="measure configs (model-ranked) and log the best per shape",
                       description="Measure configs in the cost model's order and log every "
                                   "measurement (tuning_logs/<target>-<dtype>.jsonl); prints a "
                                   "progress bar, a summary table and optionally a "
                                   "predicted-vs-measured plot.")
    s.add_argument("--algo", default="auto",
                   help="gemm, a catalogue expression (strassen, strassen^2), a comma list, or auto "
                        "(GEMM + the cost model's best LCMAs; the default)")
    s.add_argument("--target", default=None,
                   help=f"one of {TARGET_NAMES}; 'cuda' (the GPU present) or 'host' (default: "
                        "this CPU, as lcmac build)")
    s.add_argument("--dtype", default="float32", help=DTYPE_HELP)
    g = s.add_mutually_exclusive_group(required=True)
    g.add_argument("--shape", type=shape_arg, metavar="MxNxK", help=f"one shape, {SHAPE_HELP}")
    g.add_argument("--shapes", choices=["llm", "llm-cpu"],
                   help="a shape list: llm = the LLM linear layers (every distinct N,K) at each "
                        "--m; llm-cpu = those a 2-core CPU tunes in minutes (M=512, ≤ 80 GFLOP)")
    s.add_argument("--m", type=int, nargs="+", default=None, metavar="M",
                   help="token counts for --shapes (default: llm 8192 16384, llm-cpu 512)")
    s.add_argument("--limit", type=positive_int, default=None, help="at most this many shapes of --shapes")
    s.add_argument("--budget", type=positive_int, default=8, help="configs measured per algorithm (default 8)")
    s.add_argument("--exhaustive", action="store_true",
                   help="measure every fitting config (for the search metrics; slow)")
    s.add_argument("--operands", default="native", choices=OPERAND_MODES,
                   help="CUDA: search the configs of this operand precision (CudaConfig.operands, "
                        "logged with it; `lcmac build --config '{\"operands\": \"fp16x2\"}'` "
                        "then takes the best logged config of that mode)")
    s.add_argument("--patience", type=positive_int, default=4,
                   help="stop after this many measurements without improvement (default 4)")
    s.add_argument("--jobs", type=positive_int, default=2, help="parallel compile processes (default 2)")
    s.add_argument("--top-lcmas", type=non_negative_int, default=2, help="LCMAs tuned by --algo auto (default 2)")
    s.add_argument("--max-error", type=max_error_arg, default=None, metavar="X",
                   help="with --algo auto: only LCMAs predicted within X times the plain GEMM's "
                        "error (lcmac select --max-error)")
    s.add_argument("--sustained", type=float, default=None, metavar="S",
                   help="GPU: warm each kernel up for S seconds before timing it, so it is timed "
                        "at the power cap (the default warm-up is 0.15 s: burst timings)")
    s.add_argument("--repeats", type=positive_int, default=None,
                   help="timed repeats per config (default 5 on CPUs, 15 on GPUs)")
    s.add_argument("--no-default", dest="compare_default", action="store_false", default=None,
                   help="do not measure the backend's default config (measured by default: the "
                        "baseline a tuned config must beat, and the tuned-vs-default column)")
    s.add_argument("--compare-default", dest="compare_default", action="store_true",
                   help=argparse.SUPPRESS)   # the default now; kept so older commands still run
    s.add_argument("--no-vendor", dest="vendor", action="store_false",
                   help="do not time the vendor GEMM (cuBLAS via torch.matmul / numpy.matmul) "
                        "as the same-run baseline")
    s.add_argument("--tag", default=None, help="a label stored in every record (e.g. exhaustive)")
    s.add_argument("--logs", default=None, metavar="DIR",
                   help="tuning-log directory to write (default $LCMAC_TUNING_LOGS, else "
                        "$LCMAC_CACHE_DIR/tuning_logs, ~/.cache/lcmac/tuning_logs by default)")
    s.add_argument("--plot", default=None, metavar="FILE", help="write predicted-vs-measured plot (PNG)")
    s.add_argument("--build-only", default=None, metavar="DIR",
                   help="compile the configs the tuner would measure into DIR (with index.jsonl) "
                        "and stop; measure them on another machine with --prebuilt DIR")
    s.add_argument("--prebuilt", default=None, metavar="DIR",
                   help="use the artifacts of an earlier --build-only DIR (others are built here)")
    s.add_argument("--build-dir", default=None, metavar="DIR", help=argparse.SUPPRESS)
    s.add_argument("--dry-run", action="store_true",
                   help="build and run nothing: 'measure' the model's estimate with ±15%% noise "
                        "(logs to a temporary directory unless --logs), to try the flow")
    s.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    add_json_argument(s, "tune")
    s.set_defaults(func=cmd_tune)
