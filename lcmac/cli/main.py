"""lcmac: compile fast matrix-multiplication algorithms (LCMAs) into native kernels.

Commands print tables for people; ``--json`` prints a stable schema for tools
(see README.md, "JSON output").

Shapes are MxNxK (C = A·B with A M×K, B K×N, C M×N); algorithm grids are <m,k,n> and are
written MxKxN.
"""
from __future__ import annotations

import argparse
import hashlib
import math
import os
import sys
import tempfile
import time

from lcmac.bits.artifact import BIT_DTYPES, build_bits, is_bit_dtype
from lcmac.artifact.build import build, resolve_target
from lcmac.artifact.bundle import build_bundle, read_bundle
from lcmac.artifact.manifest import Manifest
from lcmac.artifact.tuning_log import TuningDB
from lcmac.api.export import cases_from_json, export
from lcmac.costmodel import gemm_estimate, model_dtype, resolve_profile, select
from lcmac.costmodel.accuracy import cuda_model_args, error_ratio
from lcmac.costmodel.decision import with_errors
from lcmac.core.dtypes import CANONICAL
from lcmac.core.errors import LcmacError, ShapeError
from lcmac.ir import catalogue
from lcmac.ir.basis_search import addition_report
from lcmac.ir.cse import optimized_programs
from lcmac.ir.gf2 import GF2Algorithm, gf2_failures
from lcmac.ir.importers import load_file
from lcmac.ir.program import stage_names
from lcmac.ir.summary import summarize
from lcmac.ir.verify import brent_failures
from lcmac.runtime import c_cmake_dir, c_include_dir, c_source
from lcmac.spec.cuda.operands import OPERAND_MODES
from lcmac.spec.shape_rules import check_ladder, parse_rule
from lcmac.core.shapes import SHAPE_HELP, parse_shape
from lcmac.spec.target_table import TARGETS
from lcmac.spec.targets import schedule_family
from lcmac.tune import tuner
from lcmac.policy import REGIMES, EveryKernel, plan
from lcmac.tune.plot import plot_predicted_vs_measured
from lcmac.tune.llm_shapes import llm_cpu_shapes, llm_shapes
from lcmac.cli.cache import add_cache_parser
from lcmac.cli.distribute import add_distribute_parser
from lcmac.cli.output import dump_json, table
from lcmac.core.version import __version__

GRID_HELP = ("MxKxN: an algorithm's grid <m,k,n>, an m×k block of A times a k×n block of B "
             "(e.g. 2x2x3)")


def shape_arg(text: str) -> tuple[int, int, int]:
    """``--shape``: ``lcmac.core.shapes.parse_shape``, its error reported as argparse's."""
    try:
        return parse_shape(text)
    except ShapeError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def grid_arg(text: str) -> tuple[int, int, int]:
    """``--grid``: three positive integers written as a shape is, meaning <m,k,n>."""
    try:
        return parse_shape(text)
    except ShapeError:
        raise argparse.ArgumentTypeError(f"grid {text!r} must be {GRID_HELP}") from None


# ---- list / show / verify ---------------------------------------------------------------
def cmd_list(args) -> int:
    # GF(2)-only schemes are listed too (ring "gf2"); `catalogue.get` refuses them
    algs = catalogue.all_algorithms(include_naive=args.naive) + catalogue.gf2_algorithms()
    if args.grid:
        want = sorted(args.grid)
        algs = [a for a in algs if sorted(a.grid) == want]
    rows = [{**summarize(a), "ring": getattr(a, "ring", "rational")} for a in algs]
    ab = {}
    if args.alternative_basis:          # a quick search per scheme (heuristic beyond 4x4)
        for a, r in zip(algs, rows):
            try:
                ab[r["name"]] = addition_report(a, ring=args.alternative_basis, effort=0,
                                                polish=30, evaluations=5000)
            except LcmacError:          # e.g. a scheme with halves has no GF(2) image
                ab[r["name"]] = None
            r["alternative_basis"] = ab[r["name"]]
    if args.json:
        dump_json("list", {"algorithms": rows})
        return 0

    def ab_cols(name):
        rep = ab.get(name)
        return ["–", "–"] if rep is None else [rep["additions"]["core"], rep["additions"]["basis_changes"]]
    extra = ["AB core", "AB basis"] if args.alternative_basis else []
    print(table([[r["name"], "x".join(map(str, r["grid"])), r["rank"],
                   f"{100 * r['saving']:.1f}%",
                   f"{r['nnz']['U']}/{r['nnz']['V']}/{r['nnz']['W']}",
                   r["additions"]["naive"]["total"], r["additions"]["reduced"]["total"],
                   *(ab_cols(r["name"]) if args.alternative_basis else []),
                   r["source"][:48]] for r in rows],
                 ["name", "grid", "R", "saved", "nnz U/V/W", "adds", "adds(CSE)", *extra, "source"]))
    print(f"\n{len(rows)} algorithms; composed ones are written a*b, a^L, a@MxKxN (see `lcmac show`).")
    return 0


def cmd_show(args) -> int:
    alg = catalogue.get(args.name)
    s = summarize(alg)
    progs = optimized_programs(alg)
    names = stage_names(alg)
    # the error this scheme adds, by dtype (Algorithm 1's roundings; lcmac.costmodel.accuracy)
    native = {dt: round(error_ratio(alg, dt).ratio, 2) for dt in ("bfloat16", "float16", "tfloat32")}
    # the scaled operand modes, against the plain GEMM on the same operands (fp16x2's ratio
    # moves with K: shown at K = 8192)
    scaled = {"fp8": round(error_ratio(alg, "bfloat16", operands="fp8").ratio, 2),
              "fp16x2": round(error_ratio(alg, "float32", operands="fp16x2", K=8192).ratio, 2)}
    errors = {**native, **scaled}
    if args.json:
        dump_json("show", {"algorithm": {**s, **{k: v for k, v in alg.to_dict().items()
                                               if k in ("U", "V", "W")}},
                       "programs": {st: p.to_dict() for st, p in progs.items()},
                       "predicted_error_ratio": errors})
        return 0
    print(f"{alg.name}  <{alg.m},{alg.k},{alg.n};{alg.R}>  (naive {alg.naive_rank}, "
          f"{100 * alg.saving:.1f}% fewer block products)")
    print(f"source: {alg.source}\nhash:   {alg.hash}\nnnz:    U {s['nnz']['U']}, V {s['nnz']['V']}, W {s['nnz']['W']}")
    a = s["additions"]
    print(f"additions: naive {a['naive']['total']} (A {a['naive']['A']}, B {a['naive']['B']}, H {a['naive']['H']}), "
          f"after CSE {a['reduced']['total']} (A {a['reduced']['A']}, B {a['reduced']['B']}, H {a['reduced']['H']})")
    print("error:  " + ", ".join(f"{dt} {e:.2f}x" for dt, e in native.items())
          + " the plain GEMM's (predicted, Algorithm 1; TF32 = the CUDA float32)")
    print(f"        fp8 operands {scaled['fp8']:.2f}x, fp16x2 {scaled['fp16x2']:.2f}x (K = 8192) the "
          f"plain GEMM's on the same operands")
    if alg.R > args.max_rank and not args.full:
        print(f"\n(R = {alg.R}: combine programs omitted; pass --full to print them)")
        return 0
    for st, title in (("A", "Combine A"), ("B", "Combine B"), ("H", "Combine H")):
        print(f"\n# {title}: {progs[st].additions} additions")
        print(progs[st].pretty(*names[st]))
    return 0


def cmd_verify(args) -> int:
    if os.path.exists(args.target):
        algs = load_file(args.target, check=False)
        algs = algs if isinstance(algs, list) else [algs]
    elif args.target.split("@")[0] in catalogue.gf2_names():
        algs = [catalogue.get_gf2(args.target)]        # valid only mod 2: verified there
    else:
        algs = [catalogue.get(args.target)]
    results = []
    for a in algs:
        ring = "gf2" if isinstance(a, GF2Algorithm) else "rationals"
        fails = gf2_failures(a) if ring == "gf2" else brent_failures(a)
        results.append({"name": a.name, "grid": [a.m, a.k, a.n], "rank": a.R, "exact": not fails,
                        "ring": ring, "failures": [str(f) for f in fails[:10]],
                        "n_failures": len(fails)})
    ok = all(r["exact"] for r in results)
    if args.json:
        dump_json("verify", {"ok": ok, "results": results})
    else:
        for r in results:
            g = "x".join(map(str, r["grid"]))
            if r["exact"]:
                how = "modulo 2 (a GF(2)-only scheme)" if r["ring"] == "gf2" else "exactly"
                print(f"OK    {r['name']} <{g};{r['rank']}>: all {r['grid'][0]*r['grid'][1]}·"
                      f"{r['grid'][1]*r['grid'][2]}·{r['grid'][0]*r['grid'][2]} Brent equations hold {how}")
            else:
                print(f"FAIL  {r['name']} <{g};{r['rank']}>: {r['n_failures']} Brent equation(s) fail")
                for f in r["failures"][:3]:
                    print(f"      {f}")
    return 0 if ok else 1


# ---- select -----------------------------------------------------------------------------
def cmd_select(args) -> int:
    M, N, K = args.shape
    source = "model"
    dt = args.dtype
    mdt = model_dtype(args.target, args.dtype, args.operands)
    if args.measured:               # the decision itself, whatever kernels would run it
        p = plan(M, N, K, args.dtype, args.target, logs=args.logs, static_b=args.static_b,
                 max_error=args.max_error, regime=args.regime, kernels=EveryKernel())
        cands, source = list(p.candidates), p.source
    else:
        cands = select(M, N, K, mdt, args.target, static_b=args.static_b, operands=args.operands,
                       max_error=args.max_error)
        if args.operands == "native":
            dt = mdt                        # shown as the GEMM stage's (CUDA float32: TF32)
    errors = args.error or args.max_error is not None
    if errors:                              # rows within the budget (if any), errors filled in
        shown = with_errors(cands, mdt, args.operands, K, args.max_error, args.top)
    else:
        shown = cands[: args.top]
    best = shown[0] if shown else cands[0]
    if args.json:
        dump_json("select", {"shape": {"M": M, "N": N, "K": K}, "dtype": args.dtype,
                         "operands": args.operands, "max_error": args.max_error,
                         "target": args.target, "static_b": args.static_b, "source": source,
                         "decision": best.to_dict(), "candidates": [c.to_dict() for c in shown]})
        return 0
    _print_selection(args, shown, best, source, dt, errors)
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
        raise LcmacError("--dtype gf2|bool builds kernels that take any shape: drop --shape, "
                         "--rows, --tile and --config")
    t0 = time.perf_counter()
    path = build_bits(args.algo, t, args.dtype, levels=args.levels, out_dir=args.output,
                      name=args.name)
    m = Manifest.read(path)
    levels = m.algorithm["levels"]
    print(f"built {m.algorithm['name']} over {BIT_DTYPES[m.dtype]} (levels "
          f"{'auto' if levels is None else levels}) for {m.target['name']}, any shape, in "
          f"{time.perf_counter() - t0:.1f} s")
    print(f"  library  {m.library_path(path)}  ({m.library['bytes']} bytes, sha256 {m.library['sha256'][:12]})")
    print(f"  manifest {path}")
    return 0


def cmd_build(args) -> int:
    t = resolve_target(args.target)
    if is_bit_dtype(args.dtype):
        return _build_bits(args, t)
    if args.levels is None:
        args.levels = 1
    if args.shape.kind != "exact" or args.rows or args.tile:
        return _build_bundle(args, t)
    args.shape = (args.shape.M, args.shape.N, args.shape.K)
    t0 = time.perf_counter()
    path = build(args.algo, t, args.dtype, args.shape, levels=args.levels, config=args.config,
                 out_dir=args.output, name=args.name, mcpu=args.mcpu)
    dt = time.perf_counter() - t0
    m = Manifest.read(path)
    print(f"built {m.algorithm['name']} (<{','.join(map(str, m.algorithm['grid']))};"
          f"{m.algorithm['rank']}>, levels {m.algorithm['levels']}) for {m.target['name']} "
          f"{m.dtype} {m.M}x{m.N}x{m.K} in {dt:.1f} s")
    print(f"  library  {m.library_path(path)}  ({m.library['bytes']} bytes, sha256 {m.library['sha256'][:12]})")
    print(f"  manifest {path}")
    precision = (m.extra or {}).get("gemm_precision")
    if precision:                      # CUDA: what the GEMM stage multiplies in
        print(f"  GEMM stage {precision}")
        if precision == "tf32":
            print("  (float32 at fp32-level error on the tensor cores: --config "
                  "'{\"operands\": \"fp16x2\"}'; README, precision of the CUDA GEMM stage)")
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
        raise LcmacError("--name names one artifact; a shape rule builds a bundle (bundle.json "
                         "plus one artifact per bucket kernel): leave --name out")
    t0 = time.perf_counter()
    path = build_bundle(args.algo, t, args.dtype, [args.shape], out_dir=args.output,
                        rows=args.rows, tile=args.tile, levels=args.levels, config=args.config,
                        mcpu=args.mcpu, progress=lambda text: print(f"compiling {text}", flush=True))
    b = read_bundle(path)
    r = b.rules[0]
    print(f"built {r.algorithm} for {b.target['name']} {b.dtype}, shape rule {r.rule}, "
          f"{len(b.kernels)} kernels in {time.perf_counter() - t0:.1f} s")
    print(f"  row buckets {', '.join(map(str, r.rows))}"
          + (f"; N×K tile {r.tile[0]}x{r.tile[1]} (tiles copied, the last padded)" if r.tile else
             "; rows under the smallest bucket are padded into it"))
    print(f"  bundle   {path}  (lcmac.load('{b.path}') serves every shape the rule admits)")
    return 0


def cmd_export(args) -> int:
    t = resolve_target(args.target)
    cases = list(args.shapes or [])
    if args.from_json:
        cases += cases_from_json(args.from_json)
    if not cases:
        raise LcmacError("lcmac export needs shapes: MxNxK or ?xNxK on the command line, or "
                         "--from FILE.json")
    t0 = time.perf_counter()
    path = export(cases, t, args.dtype, args.output, rows=args.rows, algo=args.algo,
                  max_error=args.max_error, regime=args.regime,
                  progress=lambda text: print(text, flush=True))
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


def rule_arg(text: str):
    """``--shape``: a shape or a shape rule (``lcmac.spec.shape_rules``), errors as argparse's."""
    try:
        return parse_rule(text)
    except ShapeError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def ladder_arg(text: str) -> tuple:
    try:
        return check_ladder(p for p in text.replace("x", ",").split(",") if p.strip())
    except ShapeError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def tile_arg(text: str) -> tuple:
    try:
        tile = tuple(int(p) for p in text.replace("x", ",").split(","))
    except ValueError:
        tile = ()
    if len(tile) != 2 or min(tile) < 1:
        raise argparse.ArgumentTypeError(f"tile {text!r} must be NxK, two positive integers")
    return tile


def _predicted_error(m) -> str:
    """The accuracy model's word on a built LCMA ('' for the plain GEMM or an unmodelled
    operand mode): its error as a multiple of the plain GEMM's, on normal inputs."""
    if m.algorithm["rank"] <= 1:
        return ""
    cfg = m.config or {}
    if m.target.get("family") == "cuda":
        dtype, variant, operands = cuda_model_args(m.dtype, cfg)
    else:
        dtype, variant, operands = m.dtype, ("fused" if cfg.get("fused") else "unfused"), "native"
    try:
        e = error_ratio(m.algorithm["name"], dtype, variant=variant, operands=operands, K=m.K)
    except (ValueError, TypeError):
        return ""                      # a dtype / operand pair the model does not cover
    # float32/float64 errors come from the order K is summed in, which the model does not follow
    rough = ", indicative only" if dtype in ("float32", "float64") else ""
    return (f"{e.ratio:.2f}x the plain GEMM's, predicted on normal inputs ({e.precision}, "
            f"{variant} Combine H{rough}; lcmac.costmodel.accuracy)")


# ---- tune ----------------------------------------------------------------------------------
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
    if args.operands != "native" and not gpu:
        return "--operands is a CUDA option (scaled fp16 operands)"
    if args.dry_run and (args.build_only or args.prebuilt):
        return "--dry-run does not combine with --build-only/--prebuilt"
    return ""


def _tune_options(args, gpu: bool, store) -> dict:
    """``tuner.tune``'s keyword options from the command line."""
    kw = dict(budget=args.budget, patience=args.patience, db=store, top_lcmas=args.top_lcmas,
              repeats=args.repeats or (15 if gpu else 5), progress=not args.quiet,
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


def cmd_tune(args) -> int:
    cases = _tune_cases(args)
    gpu = schedule_family(args.target) == "cuda"
    why = "give --shape MxNxK or --shapes llm|llm-cpu" if not cases else _tune_refusal(args, gpu)
    if why:
        print(f"lcmac tune: error: {why}", file=sys.stderr)
        return 2
    algo = args.algo if "," not in args.algo else [a.strip() for a in args.algo.split(",")]
    logs = args.logs
    if args.dry_run and logs is None:
        logs = tempfile.mkdtemp(prefix="lcmac-dry-run-")
    store = TuningDB(logs)
    kw = _tune_options(args, gpu, store)
    results, rows = [], []

    def add_rows(label, r):
        results.append(r)
        rows.extend(_result_rows(r, 1e3 if gpu else 1.0))   # GFLOP/s on CPUs, TFLOP/s on GPUs

    if args.build_only or args.prebuilt or (gpu and not args.dry_run and args.jobs > 1 and len(cases) > 1):
        for i, (label, shape) in enumerate(cases, 1):
            print(f"[{i}/{len(cases)}] {label + ' ' if label else ''}{'x'.join(map(str, shape))} "
                  f"{args.dtype} on {args.target}", file=sys.stderr)
        tuner.tune_many(cases, algo, args.target, args.dtype, jobs=args.jobs,
                        prebuilt=args.prebuilt, build_dir=args.build_only or args.build_dir,
                        build_only=bool(args.build_only), on_result=add_rows, **kw)
        if args.build_only:
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
    print(table(rows, ["shape", "algorithm", "trials", "best ms", "TFLOP/s" if gpu else "GFLOP/s",
                        "model ms", "spearman", "vs default", "vs vendor", "best"]))
    print(f"\nlogged to {store.root}" + ("  (dry run: model × noise, nothing built)" if args.dry_run
                                          else "  (`lcmac build` uses the best logged config for a shape)"))
    if args.plot:
        try:
            trials = [t for r in results for t in r.trials]
            print(f"plot: {plot_predicted_vs_measured(trials, args.plot, f'{args.target} {args.dtype}')}")
        except RuntimeError as e:
            print(f"lcmac tune: {e}", file=sys.stderr)
    return 0 if results and all(r.best is not None for r in results) else 1


# ---- the command line ----------------------------------------------------------------------
TARGET_NAMES = ", ".join(TARGETS)
DTYPE_HELP = (f"element type: {', '.join(CANONICAL)}, or an alias (bf16, fp16, fp32, fp64, "
              f"fp8); default float32; build also takes gf2 and bool (bit matrices: "
              f"docs/bits.md)")


def _add_list(sub) -> None:
    s = sub.add_parser("list", help="list the algorithm catalogue",
                       description="The catalogue: each algorithm's grid <m,k,n>, rank R, "
                                   "saving over the naive m·k·n products, nonzeros of U/V/W and "
                                   "additions before and after common-subexpression elimination.")
    s.add_argument("--json", action="store_true", help="machine-readable output (schema lcmac-list/1)")
    s.add_argument("--naive", action="store_true", help="include the naive <m,k,n;mkn> schemes")
    s.add_argument("--alternative-basis", nargs="?", const="rational", choices=["rational", "gf2"],
                   help="also search an alternative basis per scheme (Karstadt-Schwartz; over GF(2) "
                        "with 'gf2'): the core's additions and the basis changes' "
                        "(docs/alternative-basis.md; slow on the whole catalogue, use --grid)")
    s.add_argument("--grid", type=grid_arg, metavar="MxKxN",
                   help="only algorithms of this grid <m,k,n>, written MxKxN, in any order of "
                        "m, k, n (e.g. 2x2x3: a grid, not a shape)")
    s.set_defaults(func=cmd_list)


def _add_show(sub) -> None:
    s = sub.add_parser("show", help="one algorithm in full, with its combine programs",
                       description="One algorithm: its source, hash, nonzeros, additions, the "
                                   "error it is predicted to add per dtype, and the straight-line "
                                   "programs of Combine A, B and H.")
    s.add_argument("name", help="catalogue name or expression: strassen, strassen^2, a*b, a@MxKxN")
    s.add_argument("--json", action="store_true", help="machine-readable output (schema lcmac-show/1)")
    s.add_argument("--full", action="store_true", help="print combine programs even for large R")
    s.add_argument("--max-rank", type=int, default=64, help=argparse.SUPPRESS)
    s.set_defaults(func=cmd_show)


def _add_verify(sub) -> None:
    s = sub.add_parser("verify", help="check an algorithm exactly against the Brent equations",
                       description="Exact (rational) check of every Brent equation; exit status "
                                   "1 when one fails.")
    s.add_argument("target", metavar="FILE_OR_NAME",
                   help="a catalogue name, or a file: AlphaTensor .npz, FastMatrixMultiplication "
                        "JSON, lcmac JSON")
    s.add_argument("--json", action="store_true", help="machine-readable output (schema lcmac-verify/1)")
    s.set_defaults(func=cmd_verify)


def _add_select(sub) -> None:
    s = sub.add_parser("select", help="rank GEMM and every applicable LCMA for a shape",
                       description="The cost model's ranking of the plain GEMM and every "
                                   "applicable LCMA for one shape, with each one's predicted "
                                   "error, and its decision (--measured: the tuning log's "
                                   "measurements first, as lcmac.auto decides at run time).")
    s.add_argument("--shape", required=True, type=shape_arg, metavar="MxNxK", help=SHAPE_HELP)
    s.add_argument("--target", required=True, help=f"one of {TARGET_NAMES}")
    s.add_argument("--dtype", default="float32", help=DTYPE_HELP)
    s.add_argument("--top", type=int, default=10, help="rows to print (default 10)")
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
    s.add_argument("--operands", default="native", choices=OPERAND_MODES,
                   help="CUDA operand precision to price (CudaConfig.operands; default native: "
                        "the dtype itself, float32 as TF32)")
    s.add_argument("--max-error", type=float, default=None, metavar="X",
                   help="error budget: leave out LCMAs whose predicted error exceeds X times the "
                        "plain GEMM's in this dtype (e.g. 4 admits bf16 Strassen at ~3.5x)")
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
    s.add_argument("--levels", type=int, default=None,
                   help="recursion levels of the algorithm (default 1; gf2: as many as keep the "
                        "kernel's threshold)")
    s.add_argument("--config", default=None, metavar="JSON",
                   help="schedule knobs as JSON, e.g. '{\"mc\": 128}'; CUDA operand precision: "
                        "'{\"operands\": \"fp16x2\"}' (float32 at fp32-level error on fp16 tensor "
                        "cores), '{\"operands\": \"fp16\"}' (scaled fp16 Ã/B̃: bf16 LCMAs at "
                        "cuBLAS-level error; float32 at TF32-class error)")
    s.add_argument("--mcpu", default=None, help="LLVM CPU name for CPU targets ('native' = this host)")
    s.add_argument("--name", default=None, help="artifact name (default: derived)")
    s.add_argument("-o", "--output", default=".", metavar="DIR", help="output directory (default .)")
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
    s.add_argument("--from", dest="from_json", metavar="FILE.json",
                   help="shapes from JSON: a list, {\"shapes\": [...]}, or lcmac.optimize's "
                        "report (report.to_dict()), whose layers become ?xNxK")
    s.add_argument("--target", default=None, help=f"one of {TARGET_NAMES}; default this CPU")
    s.add_argument("--dtype", default="float32", help=DTYPE_HELP)
    s.add_argument("--algo", default=None, help="one algorithm for every shape (default: decided per shape)")
    s.add_argument("--max-error", type=float, default=None, help="error budget (× the plain GEMM's)")
    s.add_argument("--regime", default="burst", choices=REGIMES, help="which tuning-log records decide")
    s.add_argument("--rows", type=ladder_arg, default=None, metavar="P,P,...",
                   help="row buckets of the ?xNxK rules (default as lcmac build)")
    s.add_argument("-o", "--output", required=True, metavar="DIR", help="the bundle's directory")
    s.set_defaults(func=cmd_export)


def _add_tune(sub) -> None:
    s = sub.add_parser("tune", help="measure configs (model-ranked) and log the best per shape",
                       description="Measure configs in the cost model's order and log every "
                                   "measurement (tuning_logs/<target>-<dtype>.jsonl); prints a "
                                   "progress bar, a summary table and optionally a "
                                   "predicted-vs-measured plot.")
    s.add_argument("--algo", default="auto",
                   help="gemm, a catalogue expression (strassen, strassen^2), a comma list, or auto "
                        "(GEMM + the cost model's best LCMAs; the default)")
    s.add_argument("--target", required=True, help=f"one of {TARGET_NAMES}")
    s.add_argument("--dtype", default="float32", help=DTYPE_HELP)
    g = s.add_mutually_exclusive_group(required=True)
    g.add_argument("--shape", type=shape_arg, metavar="MxNxK", help=f"one shape, {SHAPE_HELP}")
    g.add_argument("--shapes", choices=["llm", "llm-cpu"],
                   help="a shape list: llm = the LLM linear layers (every distinct N,K) at each "
                        "--m; llm-cpu = those a 2-core CPU tunes in minutes (M=512, ≤ 80 GFLOP)")
    s.add_argument("--m", type=int, nargs="+", default=None, metavar="M",
                   help="token counts for --shapes (default: llm 8192 16384, llm-cpu 512)")
    s.add_argument("--limit", type=int, default=None, help="at most this many shapes of --shapes")
    s.add_argument("--budget", type=int, default=8, help="configs measured per algorithm (default 8)")
    s.add_argument("--exhaustive", action="store_true",
                   help="measure every fitting config (for the search metrics; slow)")
    s.add_argument("--operands", default="native", choices=OPERAND_MODES,
                   help="CUDA: search the configs of this operand precision (CudaConfig.operands, "
                        "logged with it; `lcmac build --config '{\"operands\": \"fp16x2\"}'` "
                        "then takes the best logged config of that mode)")
    s.add_argument("--patience", type=int, default=4,
                   help="stop after this many measurements without improvement (default 4)")
    s.add_argument("--jobs", type=int, default=2, help="parallel compile processes (default 2)")
    s.add_argument("--top-lcmas", type=int, default=2, help="LCMAs tuned by --algo auto (default 2)")
    s.add_argument("--max-error", type=float, default=None, metavar="X",
                   help="with --algo auto: only LCMAs predicted within X times the plain GEMM's "
                        "error (lcmac select --max-error)")
    s.add_argument("--sustained", type=float, default=None, metavar="S",
                   help="GPU: warm each kernel up for S seconds before timing it, so it is timed "
                        "at the power cap (the default warm-up is 0.15 s: burst timings)")
    s.add_argument("--repeats", type=int, default=None,
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
    s.set_defaults(func=cmd_tune)


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
    p = argparse.ArgumentParser(prog="lcmac", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"lcmac {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for add in (_add_list, _add_show, _add_verify, _add_select, _add_build, _add_export, _add_tune,
                add_cache_parser, _add_capi):
        add(sub)
    add_distribute_parser(sub, shape_arg, SHAPE_HELP, DTYPE_HELP)
    return p


def main(argv=None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    if not getattr(args, "func", None):
        p.print_help()
        return 2
    try:
        return args.func(args)
    except LcmacError as e:
        print(f"lcmac {args.command}: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `lcmac list | head`
        return 0


if __name__ == "__main__":
    sys.exit(main())
