"""lcmac: compile fast matrix-multiplication algorithms (LCMAs) into native kernels.

Commands print tables for people; ``--json`` prints a stable schema for tools
(see README.md, "JSON output").

Shapes are MxNxK (C = A·B with A M×K, B K×N, C M×N); algorithm grids are <m,k,n> and are
written MxKxN.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from lcmac.bits.artifact import BIT_DTYPES, build_bits, is_bit_dtype
from lcmac.artifact.build import build, resolve_target
from lcmac.artifact.bundle import build_bundle, read_bundle
from lcmac.artifact.manifest import Manifest
from lcmac.api.export import cases_from_json, export, export_report, report_from_json
from lcmac.costmodel import model_dtype, select
from lcmac.costmodel.accuracy import cuda_model_args, error_ratio
from lcmac.costmodel.decision import with_errors
from lcmac.core.errors import LcmacError
from lcmac.runtime import c_cmake_dir, c_include_dir, c_source
from lcmac.spec.cuda.operands import OPERAND_MODES
from lcmac.spec.shape_rules import parse_rule
from lcmac.core.shapes import SHAPE_HELP
from lcmac.policy import REGIMES, EveryKernel, plan
from lcmac.cli.arguments import (
    DTYPE_HELP, TARGET_NAMES, attach_dashed_values, config_arg, dashed_shape_error, ladder_arg,
    positive_int, rule_arg, shape_arg, target_name, tile_arg)
from lcmac.cli.cache import add_cache_parser
from lcmac.cli.catalogue import add_catalogue_parsers
from lcmac.cli.distribute import add_distribute_parser
from lcmac.cli.exit_codes import EPILOG, FAILURE, USAGE, UsageError, exit_code
from lcmac.cli.library_log import library_log_on_stderr
from lcmac.cli.output import add_json_argument, dump_json, table
from lcmac.cli.output_dir import run_cleaning_created_dirs, writable_output_dir
from lcmac.cli.tune import add_tune_parser
from lcmac.cli.precision import (
    BUDGET_HELP, add_precision_argument, budget_for, build_config, max_error_arg, operands_for,
    precision_of)
from lcmac.core.version import __version__


# ---- select -----------------------------------------------------------------------------
def cmd_select(args) -> int:
    args.target = target_name(args.target)
    M, N, K = args.shape
    source = "model"
    dt = args.dtype
    precision = precision_of(args)
    args.operands = operands_for(args.target, args.dtype, precision, args.operands)
    budget = budget_for(args, args.operands)
    mdt = model_dtype(args.target, args.dtype, args.operands)
    if args.measured:               # the decision itself, whatever kernels would run it
        p = plan(M, N, K, args.dtype, args.target, logs=args.logs, static_b=args.static_b,
                 max_error=args.max_error, precision=precision, regime=args.regime,
                 kernels=EveryKernel())
        cands, source = list(p.candidates), p.source
    else:
        cands = select(M, N, K, mdt, args.target, static_b=args.static_b, operands=args.operands,
                       max_error=budget.max_error)
        if args.operands == "native":
            dt = mdt                        # shown as the GEMM stage's (CUDA float32: TF32)
    errors = args.error or args.max_error is not None
    if errors:                              # rows within the budget (if any), errors filled in
        shown = with_errors(cands, mdt, args.operands, K, budget.max_error, args.top)
    else:
        shown = cands[: args.top]
    best = shown[0] if shown else cands[0]
    if args.json:
        dump_json("select", {"shape": {"M": M, "N": N, "K": K}, "dtype": args.dtype,
                         "operands": args.operands, "max_error": budget.max_error,
                         "budget": budget.describe(), "precision": precision,
                         "target": args.target, "static_b": args.static_b, "source": source,
                         "decision": best.to_dict(), "candidates": [c.to_dict() for c in shown]})
        return 0
    _print_selection(args, shown, best, source, dt, errors)
    print(f"{budget.describe()}" + (f"; float32 precision {precision}" if precision else ""))
    return 0


def _print_selection(args, shown, best, source: str, dt: str, errors: bool) -> None:
    M, N, K = args.shape
    rows = []
    for c in shown:
        d = c.to_dict()
        err = [] if not errors else ["—" if d.get("error_ratio") is None else f"{d['error_ratio']:.2f}"]
        rows.append([d["algorithm"], "x".join(map(str, d["grid"])), d["rank"],
                     f"{d['predicted_time_s'] * 1e3:.3f}", f"{d['effective_tflops']:.2f}",
                     f"{d['speedup_vs_gemm']:.3f}"] + err
                    + (["yes" if d["measured"] else ""] if args.measured else []))
    how = {"model": "predicted by the analytic model", "exact": "measured at this shape (tuning log), "
           "the rest predicted"}.get(source, f"ratios measured at the {source}, the rest predicted")
    if args.measured and source == "model":
        how += "; nothing logged near this shape"
    ops = "" if args.operands == "native" else f", operands {args.operands}"
    if not args.measured and dt != args.dtype:
        ops += f" (GEMM stage {dt})"
    print(f"{M}x{N}x{K} {args.dtype}{ops} on {args.target} ({how})\n")
    print(table(rows, ["algorithm", "grid", "R", "time ms", "eff TFLOP/s", "vs GEMM"]
                 + (["error×"] if errors else []) + (["measured"] if args.measured else [])))
    if errors:
        own = " on the same fp8 operands" if args.operands == "fp8" else ""
        print(f"\nerror×: predicted error ÷ the plain GEMM's{own} (lcmac.costmodel.accuracy: "
              "the kernels' roundings simulated on normal inputs)")
    bd = best.to_dict()
    reason = (bd.get("reason") or "").removeprefix("decision: ")
    print(f"\ndecision: {bd['algorithm']}" + (f" ({reason})" if reason else ""))


# ---- build ---------------------------------------------------------------------------------
def _build_bits(args, t) -> int:
    if args.shape.kind != "any" or args.rows or args.tile or args.config:
        raise UsageError("--dtype gf2|bool builds kernels that take any shape: drop --shape, "
                         "--rows, --tile and --config")
    t0 = time.perf_counter()
    path = build_bits(args.algo, t, args.dtype, levels=args.levels, out_dir=args.output,
                      name=args.name)
    m = Manifest.read(path)
    if args.json:
        dump_json("build", _artifact_doc("bits", m, path, time.perf_counter() - t0))
        return 0
    levels = m.algorithm["levels"]
    print(f"built {m.algorithm['name']} over {BIT_DTYPES[m.dtype]} (levels "
          f"{'auto' if levels is None else levels}) for {m.target['name']}, any shape, in "
          f"{time.perf_counter() - t0:.1f} s")
    print(f"  library  {m.library_path(path)}  ({m.library['bytes']} bytes, sha256 {m.library['sha256'][:12]})")
    print(f"  manifest {path}")
    return 0


def cmd_build(args) -> int:
    t = resolve_target(args.target)
    writable_output_dir(args.output)     # before minutes of compiling, not after
    if is_bit_dtype(args.dtype):
        return _build_bits(args, t)
    if args.levels is None:
        args.levels = 1
    if getattr(args, "dynamic_shape", None) is not None and (
            args.shape.kind != "any" or args.rows or args.tile or t.family != "cuda"):
        flag = "--dynamic-shape" if args.dynamic_shape else "--copied-tiles"
        raise UsageError(f"{flag} builds the any-shape rule (no --shape, --rows or --tile) "
                         "for a CUDA target")
    if args.shape.kind != "exact" or args.rows or args.tile:
        return _build_bundle(args, t)
    args.shape = (args.shape.M, args.shape.N, args.shape.K)
    t0 = time.perf_counter()
    path = build(args.algo, t, args.dtype, args.shape, levels=args.levels,
                 config=build_config(t, args), out_dir=args.output, name=args.name, mcpu=args.mcpu)
    dt = time.perf_counter() - t0
    m = Manifest.read(path)
    if args.json:
        dump_json("build", {**_artifact_doc("artifact", m, path, dt),
                            "gemm_precision": (m.extra or {}).get("gemm_precision"),
                            "predicted_error": _error_prediction(m)})
        return 0
    print(f"built {m.algorithm['name']} (<{','.join(map(str, m.algorithm['grid']))};"
          f"{m.algorithm['rank']}>, levels {m.algorithm['levels']}) for {m.target['name']} "
          f"{m.dtype} {m.M}x{m.N}x{m.K} in {dt:.1f} s")
    print(f"  library  {m.library_path(path)}  ({m.library['bytes']} bytes, sha256 {m.library['sha256'][:12]})")
    print(f"  manifest {path}")
    precision = (m.extra or {}).get("gemm_precision")
    if precision:                      # CUDA: what the GEMM stage multiplies in
        print(f"  GEMM stage {precision}")
        if precision == "tf32":
            print("  (float32 at fp32-level error on the tensor cores: --precision highest; "
                  "docs/cuda.md, operand precision)")
    views = ((m.extra or {}).get("extra") or {}).get("direct_views")
    if views:                          # CUDA: single-block operands the GEMM reads in place
        rank = m.algorithm["rank"]
        print("  read in place  " + ", ".join(f"{len(v)} of {rank} {side} operands"
                                             for side, v in sorted(views.items())))
    err = _predicted_error(m)
    if err:
        print(f"  error    {err}")
    return 0


def _build_bundle(args, t) -> int:
    """``lcmac build`` of a shape rule (no --shape: any shape; ?xNxK: any M): a bundle."""
    if args.name:
        raise UsageError("--name names one artifact; a shape rule builds a bundle (bundle.json "
                         "plus one artifact per bucket kernel): leave --name out")
    t0 = time.perf_counter()
    path = build_bundle(args.algo, t, args.dtype, [args.shape], out_dir=args.output,
                        rows=args.rows, tile=args.tile, levels=args.levels,
                        config=build_config(t, args), dynamic_shape=args.dynamic_shape,
                        mcpu=args.mcpu, progress=lambda text: _progress(f"compiling {text}"))
    if args.json:
        doc = _bundle_doc(path, time.perf_counter() - t0)
        dump_json("build", {"kind": "bundle", "algorithm": doc["rules"][0]["algorithm"], **doc})
        return 0
    b = read_bundle(path)
    r = b.rules[0]
    print(f"built {r.algorithm} for {b.target['name']} {b.dtype}, shape rule {r.rule}, "
          f"{len(b.kernels)} kernel{'' if len(b.kernels) == 1 else 's'} in {time.perf_counter() - t0:.1f} s")
    if r.pieces:
        print("  pieces " + "; ".join(f"{dim} {', '.join(map(str, r.pieces[dim]))}" for dim in "MNK")
              + " (views of A, B and C; small or thin products on numpy/torch)")
    elif r.dynamic_shape:
        print("  one kernel of run-time M, N, K, up to " + "x".join(map(str, r.dynamic_shape))
              + " a launch (more rows: several launches)")
    else:
        print(f"  row buckets {', '.join(map(str, r.rows))}"
              + (f"; N×K tile {r.tile[0]}x{r.tile[1]} (tiles copied, the last padded)" if r.tile else
                 "; rows under the smallest bucket are padded into it"))
    print(f"  bundle   {path}  (lcmac.load('{b.path}') serves every shape the rule admits)")
    return 0


def _progress(text: str) -> None:
    """A progress line: stderr, so that stdout holds only the result (with --json, one
    JSON object)."""
    print(text, file=sys.stderr, flush=True)


def cmd_export(args) -> int:
    t = resolve_target(args.target)
    cases = list(args.shapes or []) + list(args.shape_options or [])
    report = report_from_json(args.from_json) if args.from_json else None
    if report is not None and (cases or args.algo or args.rows):
        raise UsageError("lcmac export --from an lcmac.optimize report builds the kernels it "
                         "names: give it no shapes, --algo or --rows")
    if args.from_json and report is None:
        cases += cases_from_json(args.from_json)
    if not cases and report is None:
        raise UsageError("lcmac export needs shapes: MxNxK or ?xNxK on the command line, or "
                         "--from FILE.json")
    writable_output_dir(args.output)
    t0 = time.perf_counter()
    if report is not None:
        path = export_report(report, args.output, target=args.target, dtype=args.dtype,
                             progress=_progress)
    else:
        path = export(cases, t, args.dtype or "float32", args.output, rows=args.rows,
                      algo=args.algo, max_error=args.max_error, precision=args.precision,
                      regime=args.regime, progress=_progress)
    if args.json:
        decisions = json.loads(Path(path).read_text()).get("decisions")
        dump_json("export", {**_bundle_doc(path, time.perf_counter() - t0),
                             "header": str(Path(path).parent / "lcmac.h"),
                             "decisions": decisions})
        return 0
    b = read_bundle(path)
    print(f"exported {len(b.rules)} shape(s), {len(b.kernels)} kernels for {b.target['name']} "
          f"{b.dtype} in {time.perf_counter() - t0:.1f} s")
    print(f"  bundle   {path}   header {path.parent / 'lcmac.h'}")
    opener = "lcmac_open_cuda_bundle" if b.target.get("family") == "cuda" else "lcmac_open_bundle"
    print(f"  Python: lcmac.load('{path.parent}')   C: {opener} (docs/c-api.md)")
    return 0


def cmd_capi(args) -> int:
    paths = {"include_dir": c_include_dir(), "source": c_source(), "cmake_dir": c_cmake_dir()}
    for key in ("include_dir", "source", "cmake_dir"):
        if getattr(args, key):
            print(paths[key])
            return 0
    print(f"header      {paths['include_dir']}/lcmac.h")
    print(f"source      {paths['source']}   (compile it into your program; it includes the rest)")
    print(f"CMake       find_package(lcmac CONFIG REQUIRED PATHS {paths['cmake_dir']})")
    print("            target_link_libraries(app PRIVATE lcmac::runtime)")
    print(f"by hand     cc -O2 -rdynamic -I{paths['include_dir']} app.c {paths['source']} "
          "-ldl -lpthread")
    print("CUDA        the same: the harness loads the driver (libcuda.so.1) itself; your own "
          "CUDA calls need the runtime (nvcc, or -lcudart)")
    return 0


def _error_prediction(m) -> dict | None:
    """The accuracy model's word on a built LCMA (None for the plain GEMM or an unmodelled
    operand mode): its error as a multiple of the plain GEMM's, on normal inputs."""
    if m.algorithm["rank"] <= 1:
        return None
    cfg = m.config or {}
    if m.target.get("family") == "cuda":
        dtype, variant, operands = cuda_model_args(m.dtype, cfg)
    else:
        dtype, variant, operands = m.dtype, ("fused" if cfg.get("fused") else "unfused"), "native"
    try:
        e = error_ratio(m.algorithm["name"], dtype, variant=variant, operands=operands, K=m.K)
    except (ValueError, TypeError):
        return None                    # a dtype / operand pair the model does not cover
    # float32/float64 errors come from the order K is summed in, which the model does not follow
    return {"ratio": e.ratio, "precision": e.precision, "variant": variant,
            "indicative_only": dtype in ("float32", "float64")}


def _predicted_error(m) -> str:
    """``_error_prediction`` as a line for people ('' where there is none)."""
    e = _error_prediction(m)
    if e is None:
        return ""
    rough = ", indicative only" if e["indicative_only"] else ""
    return (f"{e['ratio']:.2f}x the plain GEMM's, predicted on normal inputs ({e['precision']}, "
            f"{e['variant']} Combine H{rough}; lcmac.costmodel.accuracy)")


def _artifact_doc(kind: str, m, path, seconds: float) -> dict:
    """A built artifact's fields in ``lcmac-build/1`` (kind "artifact" or "bits")."""
    return {"kind": kind, "algorithm": m.algorithm["name"], "target": m.target["name"],
            "dtype": m.dtype, "seconds": round(seconds, 3), "manifest": str(path),
            "library": str(m.library_path(path)), "bytes": m.library["bytes"],
            "sha256": m.library["sha256"], "grid": m.algorithm.get("grid"),
            "rank": m.algorithm.get("rank"), "levels": m.algorithm.get("levels"),
            "shape": dict(m.shape) if m.shape else None}


def _bundle_doc(path, seconds: float) -> dict:
    """A bundle's fields in ``lcmac-build/1`` and ``lcmac-export/1``."""
    b = read_bundle(path)
    return {"target": b.target["name"], "dtype": b.dtype, "seconds": round(seconds, 3),
            "bundle": str(path), "rules": [r.to_dict() for r in b.rules],
            "kernels": sorted(b.kernels)}


# ---- the command line ----------------------------------------------------------------------
def _add_select(sub) -> None:
    s = sub.add_parser("select", help="rank GEMM and every applicable LCMA for a shape",
                       description="The cost model's ranking of the plain GEMM and every "
                                   "applicable LCMA for one shape, with each one's predicted "
                                   "error, and its decision (--measured: the tuning log's "
                                   "measurements first, as lcmac.auto decides at run time).")
    s.add_argument("--shape", required=True, type=shape_arg, metavar="MxNxK", help=SHAPE_HELP)
    s.add_argument("--target", default=None,
                   help=f"one of {TARGET_NAMES}, a model-only profile, 'cuda' (the GPU present) "
                        "or 'host' (default: this CPU, as lcmac build)")
    s.add_argument("--dtype", default="float32", help=DTYPE_HELP)
    s.add_argument("--top", type=positive_int, default=10, help="rows to print (default 10)")
    s.add_argument("--static-b", action="store_true",
                   help="B is a static weight: Combine B is done once, offline")
    s.add_argument("--measured", action="store_true",
                   help="use the tuning log's measurements (lcmac tune), the vendor GEMM included, "
                        "as the decision does at run time")
    s.add_argument("--logs", default=None, metavar="DIR",
                   help="tuning-log directory for --measured (default $LCMAC_TUNING_LOGS, else "
                        "the logs lcmac ships and the user's own: docs/tuning.md)")
    s.add_argument("--regime", default="burst", choices=REGIMES,
                   help="with --measured: decide on the log's burst records (default) or on its "
                        "sustained ones (lcmac tune --sustained: a GPU at its power cap)")
    s.add_argument("--operands", default=None, choices=OPERAND_MODES,
                   help="CUDA operand precision to price (CudaConfig.operands; default: the "
                        "dtype itself, float32 the mode its --precision runs)")
    add_precision_argument(s)
    s.add_argument("--max-error", type=max_error_arg, default=None, metavar="X", help=BUDGET_HELP)
    s.add_argument("--error", action=argparse.BooleanOptionalAction, default=True,
                   help="show each printed row's predicted error, x the plain GEMM's (default; "
                        "--no-error skips the accuracy model, about 0.3 s a row)")
    s.add_argument("--json", action="store_true", help="machine-readable output (schema lcmac-select/1)")
    s.set_defaults(func=cmd_select)


def _add_build(sub) -> None:
    s = sub.add_parser("build", help="compile an algorithm (or the plain GEMM) into a library + manifest",
                       description="Compile one algorithm for one target, dtype and shape into "
                                   "a shared library and its JSON manifest (lcmac.load reads "
                                   "them). Without --shape, or with --shape ?xNxK, a bundle: "
                                   "kernels for a ladder of row counts (and, for any shape, an "
                                   "N×K tile) and a bundle.json that lcmac.load runs on every "
                                   "shape the rule admits. Without --config: the tuning log's "
                                   "best config for the shape (lcmac tune; CPUs: this exact "
                                   "shape), else the backend's default.")
    s.add_argument("--algo", required=True, help="gemm, or a catalogue name/expression (strassen, strassen^2, ...)")
    s.add_argument("--target", default=None,
                   help=f"one of {TARGET_NAMES}; 'cuda' (the GPU present) or 'host' (default: this CPU)")
    s.add_argument("--dtype", default="float32", help=DTYPE_HELP)
    s.add_argument("--shape", type=rule_arg, default=parse_rule(None), metavar="MxNxK|?xNxK",
                   help=f"{SHAPE_HELP}; ?xNxK: any M (a weight); default: any shape")
    s.add_argument("--rows", type=ladder_arg, default=None, metavar="P,P,...",
                   help="row buckets of a shape rule (default: 4096,1024,256 on CPUs, "
                        "32768,8192,2048 on CUDA; any shape: 1024,256 / 8192,2048)")
    s.add_argument("--tile", type=tile_arg, default=None, metavar="NxK",
                   help="the any-shape rule's N×K tile (default 1024x1024 on CPUs, 8192x8192 on CUDA)")
    form = s.add_mutually_exclusive_group()
    form.add_argument("--dynamic-shape", action="store_true", default=None,
                      help="CUDA, no --shape: one kernel per algorithm whose M, N and K are run-time "
                           "values (the default where the config has that form)")
    form.add_argument("--copied-tiles", dest="dynamic_shape", action="store_false",
                      help="CUDA, no --shape: run every shape on N×K tiles of one kernel, copied and "
                           "padded (the form --rows and --tile imply)")
    s.add_argument("--levels", type=int, default=None,
                   help="recursion levels of the algorithm (default 1; gf2: as many as keep the "
                        "kernel's threshold)")
    s.add_argument("--config", type=config_arg, default=None, metavar="JSON",
                   help="schedule knobs as JSON, e.g. '{\"mc\": 128}'; CUDA operand precision: "
                        "'{\"operands\": \"fp16x2\"}' (float32 at fp32-level error on fp16 tensor "
                        "cores), '{\"operands\": \"fp16\"}' (scaled fp16 Ã/B̃: bf16 LCMAs at "
                        "cuBLAS-level error; float32 at TF32-class error)")
    add_precision_argument(s)
    s.add_argument("--mcpu", default=None, help="LLVM CPU name for CPU targets ('native' = this host)")
    s.add_argument("--name", default=None, help="artifact name (default: derived)")
    s.add_argument("-o", "--output", default=".", metavar="DIR",
                   help="output directory, created if missing and checked writable before "
                        "compiling (default .)")
    add_json_argument(s, "build")
    s.set_defaults(func=cmd_build)


def _add_export(sub) -> None:
    s = sub.add_parser("export", help="decide and compile the kernels a list of shapes needs into one bundle",
                       description="For each shape (MxNxK) or weight (?xNxK: any M), pick lcmac's "
                                   "best kernel (the tuning logs, else the model; the vendor GEMM "
                                   "is left out: a bundle runs without one) and compile it, ahead "
                                   "of time, into one directory: the kernels, bundle.json (what "
                                   "was decided and why) and lcmac.h. lcmac.load(DIR) runs it "
                                   "from Python with no compiler installed.")
    s.add_argument("shapes", nargs="*", type=rule_arg, metavar="SHAPE",
                   help="MxNxK or ?xNxK (a weight of K×N, any M)")
    s.add_argument("--shape", dest="shape_options", action="append", type=rule_arg,
                   default=None, metavar="SHAPE", help="a SHAPE as the other commands take it "
                                                       "(repeatable; beside the SHAPE words)")
    s.add_argument("--from", dest="from_json", metavar="FILE.json",
                   help="shapes from JSON: a list or {\"shapes\": [...]}; or an lcmac.optimize "
                        "report (report.save(path)): exactly the kernels it names")
    s.add_argument("--target", default=None, help=f"one of {TARGET_NAMES}; default this CPU")
    s.add_argument("--dtype", default=None, help=DTYPE_HELP + "; with --from a report, its own")
    s.add_argument("--algo", default=None, help="one algorithm for every shape (default: decided per shape)")
    s.add_argument("--max-error", type=max_error_arg, default=None, metavar="X", help=BUDGET_HELP)
    add_precision_argument(s)
    s.add_argument("--regime", default="burst", choices=REGIMES, help="which tuning-log records decide")
    s.add_argument("--rows", type=ladder_arg, default=None, metavar="P,P,...",
                   help="row buckets of the ?xNxK rules (default as lcmac build)")
    s.add_argument("-o", "--output", required=True, metavar="DIR",
                   help="the bundle's directory, created if missing and checked writable before "
                        "compiling")
    add_json_argument(s, "export")
    s.set_defaults(func=cmd_export)


def _add_capi(sub) -> None:
    s = sub.add_parser("capi", help="where the C API (lcmac.h and its implementation) is, for your build",
                       description="The C API: the header, the one source file to compile with it "
                                   "and a CMake package (find_package(lcmac) gives lcmac::runtime). "
                                   "With no option, all of them and a compile line; with one, "
                                   "just that path (for scripts and Makefiles).")
    g = s.add_mutually_exclusive_group()
    g.add_argument("--include-dir", action="store_true", help="the directory of lcmac.h")
    g.add_argument("--source", action="store_true", help="lcmac_c.c")
    g.add_argument("--cmake-dir", action="store_true", help="the directory of lcmacConfig.cmake")
    s.set_defaults(func=cmd_capi)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="lcmac", description=__doc__, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"lcmac {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for add in (add_catalogue_parsers, _add_select, _add_build, _add_export,
                add_tune_parser, add_cache_parser, _add_capi):
        add(sub)
    add_distribute_parser(sub, shape_arg, SHAPE_HELP, DTYPE_HELP)
    from lcmac.cli.calibrate import add_calibrate_parser   # beside tune: measures this device
    add_calibrate_parser(sub)
    return p


def main(argv=None) -> int:
    p = build_parser()
    argv = attach_dashed_values(list(sys.argv[1:] if argv is None else argv))
    dashed = dashed_shape_error(argv)
    if dashed:                  # argparse would say only "unrecognized arguments"
        command = next((w for w in argv if not w.startswith("-")), None)
        print(f"lcmac{' ' + command if command else ''}: error: {dashed}", file=sys.stderr)
        return USAGE
    args = p.parse_args(argv)
    if not getattr(args, "func", None):
        p.print_help()
        return USAGE
    try:
        with library_log_on_stderr():
            return run_cleaning_created_dirs(args.func, args)
    except LcmacError as e:
        print(f"lcmac {args.command}: error: {e}", file=sys.stderr)
        return exit_code(e)
    except BrokenPipeError:  # `lcmac list | head`
        return 0
    except OSError as e:     # the file system refused: one line naming the path, not a traceback
        where = f"{e.filename}: " if e.filename else ""
        print(f"lcmac {args.command}: error: {where}{e.strerror or e}", file=sys.stderr)
        return FAILURE


if __name__ == "__main__":
    sys.exit(main())
