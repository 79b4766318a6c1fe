"""``lcmac.build``: one algorithm + target + dtype + shape → an artifact (library + manifest).

Compilation runs in a worker process that imports one compiler only (apache-tvm and
TileLang cannot share a process; ``lcmac.artifact.worker`` starts it): ``target.backend``
picks it,

    "tvm"      → python -m lcmac.targets.tvm_worker       (x86, AArch64)
    "tilelang" → python -m lcmac.targets.tilelang_worker  (CUDA)

Worker contract (JSON on stdin, JSON as the last line of stdout; exit 0 on success)
--------------------------------------------------------------------------------------
Request::

    {"version": 1,
     "algorithm": Algorithm.to_dict()        # the plain GEMM is the 1x1x1 algorithm, rank 1
     "plain_gemm": bool,                     # true for algo="gemm"
     "programs": {"A"|"B"|"H": LinearProgram.to_dict()},   # CSE'd combine programs
     "levels": int,                          # recursion levels already folded into algorithm
     "target": {"name", "family", "backend", "vector_bits", "arch", "dict"},
     "mcpu": str | null,                     # LLVM CPU override ("native" = the build host)
     "dtype": "float32" | "float64" | "bfloat16" | ...,
     "shape": {"M", "N", "K"},               # C[M,N] = A[M,K] @ B[K,N], row-major
     "config": {...},                        # backend's config dataclass as a dict
     "entry": "lcmac_matmul",                # symbol of the exported function
     "library": "/abs/dir/.name.so.tmp",     # where to write the library (build renames it)
     "source": "/abs/dir/.name.src.tmp" | null}   # where to write generated source (optional)

Response::

    {"ok": true, "library": path, "entry_points": ["lcmac_matmul"],
     "target_dict": {...},                   # the target the compiler used
     "compiler": {"name", "version"}, "seconds": {...}, "info": {...},
     "config": {...}}                        # optional: the config with every knob resolved
                                             # (the manifest's config; default the request's)
    {"ok": false, "error": {"type": "DTypeError", "message": "...", "traceback": "..."}}

``error.type`` naming an lcmac exception class re-raises that class here.  The exported
function takes (A, B, C) as DLTensors of the manifest's dtype and shapes, C-contiguous,
C written in full.  Workspaces are the library's business.
"""
from __future__ import annotations

import json
import logging
import os
import platform
import time
from datetime import datetime, timezone
from pathlib import Path

from lcmac.core import errors
from lcmac.core.dtypes import normalize_dtype
from lcmac.core.errors import ArtifactError, DTypeError, ShapeError, TargetError
from lcmac.ir import get
from lcmac.ir.algorithm import Algorithm
from lcmac.ir.transforms import power
from lcmac.spec.cpu.config import AS_MEASURED, CpuConfig, resolve_config
from lcmac.schedules.cpu_lcma import programs_for
from lcmac.spec.cuda.dtypes import BATCHED_ONLY_DTYPES, batched_only_why
from lcmac.core.shapes import parse_shape
from lcmac.spec.cpu import x86
from lcmac.spec.target_table import Target
from lcmac.spec.targets import get_target, host_target
from lcmac.targets import aarch64
from lcmac.core.version import __version__
from lcmac.artifact import tuning_log as db
from lcmac.artifact.manifest import Manifest, sha256_file
from lcmac.artifact.worker import raise_error, run_worker

#: what the tuning log says of a build's config (silent unless the application shows lcmac's
#: log, as the ``lcmac`` command does)
log = logging.getLogger(__name__)


def resolve_algorithm(algo, levels: int = 1):
    """(Algorithm, plain_gemm, display name)."""
    if not isinstance(levels, int) or levels < 1:
        raise ShapeError(f"levels must be a positive integer, got {levels!r}")
    if isinstance(algo, str) and algo.strip().lower() in ("gemm", "naive"):
        if levels != 1:
            raise TargetError("the plain GEMM has no recursion levels (use levels=1)")
        return get("naive-1x1x1").renamed("gemm"), True, "gemm"
    alg = algo if isinstance(algo, Algorithm) else get(str(algo))
    name = alg.name
    if levels > 1:
        alg = power(alg, levels).renamed(f"{name}^{levels}" if "^" not in name else f"({name})^{levels}")
        name = alg.name
    return alg, False, name


def resolve_target(target):
    if target is None:
        return host_target()
    if isinstance(target, Target):
        return target
    return get_target(str(target))


def build_config(t, dtype: str, config, alg, plain: bool, shape, notes: list | None = None,
                 mcpu: str | None = None):
    """The config a build of this case uses: ``config`` (a dict or JSON text) completed as the
    backend does, else the tuning log's record.  What the log says about it goes to ``notes``
    (a list) when one is given, else to this module's logger (INFO).  bfloat16 for an ``mcpu`` with AMX runs the
    GEMM stage on AMX unless the config picks a kernel (``amx`` or ``bf16_dot``)."""
    if isinstance(config, str):
        try:
            config = json.loads(config)
        except ValueError as e:
            raise TargetError(f"--config must be JSON: {e}") from None
    if t.family in ("x86", "aarch64"):
        amx = (dtype == "bfloat16" and t.name == "x86_64-avx512" and x86.mcpu_has_amx(mcpu)
               and not {"amx", "bf16_dot", "mr", "nr"} & set(config or {}))
        tuned = None
        was = CpuConfig().to_dict()     # the knobs' field defaults: what the templates did before each
        if config is None:
            # CPU blocks are cut from the shape (tasks balanced over the threads): a config
            # logged at another shape is not better than the shape-aware default
            config = _tuned_config(t, dtype, alg, plain, shape, exact_only=True, notes=notes)
            if amx and config is not None and not config.get("amx"):
                config = None       # a logged FMA-kernel record: the AMX kernel runs faster
            if config is not None:
                config = {**{k: was[k] for k in AS_MEASURED}, **config}
            tuned = config
        if amx and not (config or {}).get("amx"):
            # the AMX kernel (resolve_config gives it its tile and blocks) unless the config
            # picks a kernel or a micro-tile it cannot run
            config = {"amx": True, **(config or {})}
        try:
            out = resolve_config(t, dtype, config, None if plain else alg, shape=shape).to_dict()
        except ValueError as e:
            raise TargetError(f"bad CPU config: {e}") from None
        # a record logged before a knob existed was measured with the knob's field default
        # (what the template did then); where the current default differs, say so
        filled = {k: out[k] for k in sorted(set(out) - set(tuned or out)) if out[k] != was[k]}
        if filled:
            _note(f"lcmac build: the record predates knob(s) {', '.join(filled)}; they take the "
                  f"defaults {json.dumps(filled, sort_keys=True)}, so its time is not this "
                  f"build's (`lcmac tune` at this shape measures them)", notes)
        return out
    # CUDA: the TileLang worker owns its knobs.  No config, or only an operand mode: the
    # tuning log's best config of that mode (logged configs of other modes are another
    # precision, never taken for this one)
    if config is None or set(config) <= {"operands"}:
        ops = (config or {}).get("operands") or "native"
        tuned = _tuned_config(t, dtype, alg, plain, shape, operands=ops, notes=notes)
        config = {**(tuned or {}), **(config or {})}
    return dict(config or {})


def _note(msg: str, notes: list | None) -> None:
    if notes is None:
        log.info(msg)
    else:
        notes.append(msg)


def _tuned_config(t, dtype, alg, plain, shape, exact_only: bool = False,
                  operands: str = "native", notes: list | None = None):
    """The tuning log's best config for this case, if any (never fatal).  ``exact_only``:
    only a config logged at this very shape (else None: the backend's default).
    ``operands``: CUDA configs of this operand mode only."""
    try:
        hit = db.best_config(t.name, dtype, "gemm" if plain else alg.hash, shape,
                             operands=operands)
        if hit and exact_only and not hit[2]:
            _note(f"lcmac build: the tuning log has this case only at other shapes (nearest "
                  f"{'x'.join(map(str, hit[1]['shape']))}); using the shape's default config "
                  f"(`lcmac tune` at this shape to log one)", notes)
            return None
        if hit:  # say which logged config is used (exact shape or the nearest one)
            r = hit[1]
            _note(f"lcmac build: using the tuned config from "
                  f"{'this shape' if hit[2] else 'the nearest logged shape ' + 'x'.join(map(str, r['shape']))}"
                  f" ({r['time_s'] * 1e3:.3f} ms on {r.get('device', '?')}): "
                  f"{json.dumps(hit[0], sort_keys=True)}", notes)
        if not hit:
            stale = db.TuningDB().stale_count(t.name, dtype)
            if stale:
                what = "GEMM" if plain else alg.name or "this algorithm"
                _note(f"lcmac build: no current tuning-log record of {what} for {t.name}/{dtype} "
                      f"({stale} records of older templates are ignored); using the default "
                      f"config (`lcmac tune` logs configs for the current ones)", notes)
        return dict(hit[0]) if hit else None
    except Exception:  # noqa: BLE001 - no tuning log, or one from an older schema
        return None


def _slug(s: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in s.replace("^", "p").replace("*", "x"))


def check_dtype(t, dtype: str, config: dict | None = None) -> None:
    """``dtype`` is one ``t`` builds (with ``config``: a CUDA batched product also takes the
    dtypes only the batched small template builds, ``BATCHED_ONLY_DTYPES``: float64)."""
    if t.family == "cuda" and dtype in BATCHED_ONLY_DTYPES:
        if isinstance(config, str):
            try:
                config = json.loads(config)
            except ValueError:
                config = None       # build_config names the bad JSON
        why = batched_only_why(dtype, config if isinstance(config, dict) else None)
        if why:
            raise DTypeError(f"target {t.name}: {why}")
        return
    if dtype not in t.dtypes:
        raise DTypeError(f"target {t.name} does not support {dtype}; choose one of {', '.join(t.dtypes)}")
    if t.backend == "tvm" and dtype not in ("float32", "float64", "bfloat16"):
        raise DTypeError(f"{dtype} on the CPU backend ({t.name}) is not supported yet; "
                         "float32, float64 (and bfloat16 on x86_64-avx512) are")


def _prepare(algo, target=None, dtype="float32", shape=None, levels: int = 1, config=None,
             out_dir=".", name: str | None = None, mcpu: str | None = None,
             keep_source: bool = True, piece: bool = False) -> dict:
    t0 = time.perf_counter()
    t = resolve_target(target)
    dtype = normalize_dtype(dtype)
    check_dtype(t, dtype, config)
    if t.family == "aarch64":
        aarch64.check_toolchain()        # fail here, naming the packages, not in the worker
    M, N, K = parse_shape(shape)
    alg, plain, alg_name = resolve_algorithm(algo, levels)
    cfg = build_config(t, dtype, config, alg, plain, (M, N, K), mcpu=mcpu)
    # the knobs the caller named (build_config has checked JSON text)
    named = json.loads(config) if isinstance(config, str) else config if isinstance(config, dict) else {}
    if plain:
        progs = None
    else:
        progs = {s: p.to_dict() for s, p in programs_for(alg).items()}
    if name is None:        # a piece kernel's beside an ordinary kernel of its shape
        name = _slug(f"{alg_name}-{t.name}-{dtype}-{M}x{N}x{K}" + ("-piece" if piece else ""))
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    tmp_lib = out / f".{name}.{os.getpid()}.so.tmp"
    tmp_src = out / f".{name}.{os.getpid()}.src.tmp"
    request = {"version": 1, "algorithm": alg.to_dict(), "plain_gemm": plain, "programs": progs,
               "levels": levels, "target": {"name": t.name, "family": t.family, "backend": t.backend,
                                            "vector_bits": t.vector_bits, "arch": t.arch,
                                            "dict": t.tvm_target(mcpu) if t.backend == "tvm" else dict(t.llvm)},
               "mcpu": mcpu, "dtype": dtype, "shape": {"M": M, "N": N, "K": K}, "config": cfg,
               "entry": "lcmac_matmul", "library": str(tmp_lib),
               "source": str(tmp_src) if keep_source else None}
    if piece:       # a CPU piece kernel: strided views and an accumulate flag (cpu_lcma.generate)
        request["piece"] = True
    return {"t0": t0, "t": t, "alg": alg, "plain": plain, "alg_name": alg_name, "name": name,
            "out": out, "tmp_lib": tmp_lib, "tmp_src": tmp_src, "request": request,
            "keep_source": keep_source, "named_knobs": set(named)}


def _cleanup(job: dict) -> None:
    for p in (job["tmp_lib"], job["tmp_src"]):
        try:
            p.unlink()
        except OSError:
            pass


def _prepared_entry_points(resp: dict, args: list) -> list:
    """Manifest entries of the prepared-B pair where the library has one (CPU LCMA
    kernels): ``prepare(B, P)`` combines B once into P; ``run(A, P, C)`` does the rest."""
    pb = (resp.get("info") or {}).get("prepared_b")
    if not pb or pb.get("prepare") not in resp.get("entry_points", ()):
        return []
    A, B, C = args
    P = {"name": "P", "shape": pb["shape"], "dtype": pb["dtype"], "layout": "packed B (opaque)"}
    return [{"name": pb["prepare"], "kind": "prepare_b", "signature": "P = combine(B)",
             "arguments": [B, {**P, "role": "output"}]},
            {"name": pb["run"], "kind": "matmul_prepared", "signature": "C = A @ B, B given by P",
             "arguments": [A, {**P, "role": "input"}, C]}]


def _piece_entry_points(entry: str, args: list) -> list:
    """A piece kernel's one entry: A, B, C as row-strided views, C written or added into."""
    flag = {"name": "accumulate", "role": "input", "dtype": "int32", "layout": "scalar: 0 C = A @ B, 1 C += A @ B"}
    return [{"name": entry, "kind": "matmul_piece", "signature": "C (+)= A @ B on row-strided views",
             "arguments": [{**a, "layout": "row-strided"} for a in args] + [flag]}]


def _finish(job: dict, resp: dict) -> Path:
    t, req, name, out = job["t"], job["request"], job["name"], job["out"]
    tmp_lib, tmp_src = job["tmp_lib"], job["tmp_src"]
    alg, plain = job["alg"], job["plain"]
    M, N, K = req["shape"]["M"], req["shape"]["N"], req["shape"]["K"]
    dtype = req["dtype"]
    try:
        if not resp.get("ok"):
            raise_error(t.backend, resp.get("error", {}))
        if not tmp_lib.is_file():
            raise ArtifactError(f"the {t.backend} worker reported success but wrote no library at {tmp_lib}")
        lib_path, man_path = out / f"{name}.so", out / f"{name}.json"
        entry = resp.get("entry_points", ["lcmac_matmul"])[0]
        args = [{"name": "A", "role": "input", "shape": [M, K], "dtype": dtype, "layout": "row-major"},
                {"name": "B", "role": "input", "shape": [K, N], "dtype": dtype, "layout": "row-major"},
                {"name": "C", "role": "output", "shape": [M, N], "dtype": dtype, "layout": "row-major"}]
        src_name = None
        if job["keep_source"] and tmp_src.is_file():
            src_name = f"{name}.tir.py" if t.backend == "tvm" else f"{name}.src"
        man = Manifest(
            name=name, backend=t.backend,
            algorithm={"name": job["alg_name"], "hash": None if plain else alg.hash,
                       "grid": list(alg.grid), "rank": alg.R, "levels": req["levels"]},
            target={"name": t.name, "family": t.family, "backend": t.backend,
                    "dict": resp.get("target_dict", req["target"]["dict"])},
            # the backend's config with every knob it used (a request or a tuned record may
            # name only some); backends that do not report one resolved it here (CPU)
            dtype=dtype, shape={"M": M, "N": N, "K": K}, config=resp.get("config", req["config"]),
            entry_points=[{"name": entry, "kind": "matmul", "signature": "C = A @ B",
                           "arguments": args}] + _prepared_entry_points(resp, args)
            if not (resp.get("info") or {}).get("piece") else _piece_entry_points(entry, args),
            library={"file": lib_path.name, "sha256": sha256_file(tmp_lib),
                     "bytes": tmp_lib.stat().st_size},
            lcmac_version=__version__,
            build={"date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                   "seconds": None, "host": platform.node(), "machine": platform.machine(),
                   "compiler": resp.get("compiler"), "stages": resp.get("seconds")},
            extra={**resp.get("info", {}), "source": src_name})
        if man.extra.get("packing_note") and "bands" in job["named_knobs"]:
            _note(f"lcmac build: {name}: {man.extra['packing_note']}", None)
        if src_name:
            os.replace(tmp_src, out / src_name)
        os.replace(tmp_lib, lib_path)
        man.build["seconds"] = round(time.perf_counter() - job["t0"], 3)
        man.write(man_path)      # last: a manifest exists only for a complete artifact
        return man_path
    finally:
        _cleanup(job)


def build(algo, target=None, dtype="float32", shape=None, levels: int = 1, config=None,
          out_dir=".", name: str | None = None, mcpu: str | None = None,
          keep_source: bool = True) -> Path:
    """Compile ``algo`` ("gemm" for the plain GEMM, a catalogue name/expression, or an
    ``Algorithm``) for ``target`` (name, Target, or None for this host), ``dtype`` and
    ``shape`` = (M, N, K) or "MxNxK"; ``levels`` applies the algorithm recursively.
    Returns the manifest path ``out_dir/<name>.json`` (library ``<name>.so`` beside it)."""
    job = _prepare(algo, target, dtype, shape, levels, config, out_dir, name, mcpu, keep_source)
    try:
        resp = run_worker(job["t"].backend, job["request"])
    except BaseException:
        _cleanup(job)
        raise
    return _finish(job, resp)


def build_many(jobs: list[dict]) -> list:
    """Several builds (each a dict of ``build``'s keyword arguments) with one worker per
    backend (one compiler import).  Returns, in order, a manifest path or the exception
    that build raised (not raised: the caller decides)."""
    prepared, results = [], [None] * len(jobs)
    for i, kw in enumerate(jobs):
        try:
            prepared.append((i, _prepare(**kw)))
        except errors.LcmacError as e:
            results[i] = e
    by_backend: dict[str, list] = {}
    for i, job in prepared:
        by_backend.setdefault(job["t"].backend, []).append((i, job))
    for backend, items in by_backend.items():
        try:
            resp = run_worker(backend, {"batch": [job["request"] for _, job in items]})
            resps = resp["batch"]
        except errors.LcmacError as e:
            resps = [None] * len(items)
            for i, job in items:
                results[i] = e
                _cleanup(job)
            continue
        for (i, job), r in zip(items, resps):
            try:
                results[i] = _finish(job, r)
            except errors.LcmacError as e:
                results[i] = e
    return results
