"""TileLang compile worker for the CUDA targets.

Runs in its own process (TileLang bundles a TVM that cannot share a process with apache-tvm):

    python -m lcmac.targets.tilelang_worker  < request.json  > response.json
    python -m lcmac.targets.tilelang_worker --serve     (one request per line; ``serve``)

Request (JSON object):
    algorithm   catalogue name (e.g. "strassen", "strassen^2") or Algorithm.to_dict();
                null / "gemm" for the plain TileLang GEMM
    target      "cuda-sm90a" | "cuda-sm80"
    dtype       "bfloat16" | "float16" | "float32"  (float32: the GEMM stage runs TF32 on
                the tensor cores, fp32 accumulation; combines are fp32); "float64" (fp64
                tensor cores, float64 combines and accumulation)
    shape       [M, N, K]
    config      CudaConfig fields (optional)
    out_dir     directory for the library and the generated sources
    name        library base name (default "lcmac_cuda")
    jobs        parallel nvcc processes (default 2)
    compile     false: stop after code generation (sources only; for tests)

Response: {"ok": true, "library": path | null, "sources": [...], "kernels": [{"name", "grid",
"block", "smem_bytes", "args"}], "workspace_bytes": n, "entry_points": {...},
"config": {...}, "arch": "sm_90a", "dtype": ..., "shape": [...], "algorithm": {...} | null,
"ptxas": {...}} or {"ok": false, "error": message, "error_type": class name}.

A build parses the request (``Request``), asks the schedule which kernels the artifact needs
(``lcmac.schedules.cuda.compose``: TileLang templates, the workspace layout, the manifest's
facts), lowers each to CUDA (``lower_to_cuda``) and writes it as the schedule rewrites it for
linking (``host_source``) beside the entry file (``entry_point``), then compiles them with
nvcc (``lcmac.targets.cuda.compile_so``).
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass

from lcmac import ir
from lcmac.core.dtypes import ITEMSIZE, normalize_dtype
from lcmac.core.errors import DTypeError
from lcmac.ir.algorithm import Algorithm
from lcmac.schedules.cuda import entry_point, host_source
from lcmac.schedules.cuda.batched_tiles import small_tile_defaults
from lcmac.schedules.cuda.compose import Composition, compose, gemm_precision
from lcmac.spec.cuda import (
    BATCHED_DTYPES, SUPPORTED_DTYPES, CudaConfig, NotSupportedYet, batched_only_why,
    bsr_tile_defaults, check_batched_shape, check_shape, check_smem, cluster_kernels, is_lcma)
from lcmac.targets import cuda as host
from lcmac.spec.targets import get_target

# TileLang is imported inside the functions that lower or compile kernels (and the templates
# inside the schedule's functions that build them): parsing a request needs no compiler.


@dataclass(frozen=True)
class Request:
    """A build request (the module docstring's JSON object), validated and resolved."""
    target: object            # lcmac.targets.Target
    dtype: str
    shape: tuple[int, int, int]
    algorithm: Algorithm | None
    config: CudaConfig
    programs: dict | None
    out_dir: str
    name: str
    jobs: int
    compile: bool

    @classmethod
    def parse(cls, req: dict) -> "Request":
        target = get_target(req.get("target", "cuda-sm90a"))
        if target.family != "cuda":
            raise ValueError(f"the TileLang worker builds CUDA targets, not {target.name}")
        dtype = normalize_dtype(req.get("dtype", "bfloat16"))
        given = dict(req.get("config") or {})
        if why := batched_only_why(dtype, given):
            raise DTypeError(why)
        if dtype not in BATCHED_DTYPES:
            if dtype == "float8_e4m3":
                raise NotSupportedYet("float8_e4m3 is not supported yet by the CUDA backend")
            raise DTypeError(f"the CUDA backend supports {SUPPORTED_DTYPES}, not {dtype}")
        M, N, K = (int(x) for x in req["shape"])
        alg = _resolve_algorithm(req.get("algorithm"))
        if given.get("batched"):
            check_batched_shape(M, N, K)
            tile = small_tile_defaults(M, N, K, dtype, given.get("policy"), given.get("batched_template"),
                                       given.get("persistent"), target.arch)
            if tile.get("batched_template") == "gemm":
                del tile["stages"]      # from_dict fits them to the tile asked for (as the defaults')
            given = {**tile, **given}
        elif given.get("bsr"):
            # the shape only names the artifact: M, K, N are the kernel's arguments
            check_batched_shape(M, N, K)
            given = {**bsr_tile_defaults(int(given["bsr"]), dtype), **given}
        else:
            check_shape(M, N, K, dtype)
        cfg = CudaConfig.from_dict(given, dtype=dtype, arch=target.arch, lcma=is_lcma(alg))
        cfg.check()
        return cls(target, dtype, (M, N, K), alg, cfg, req.get("programs"),
                   os.path.abspath(req.get("out_dir", ".")), req.get("name", "lcmac_cuda"),
                   int(req.get("jobs", 2)), bool(req.get("compile", True)))


def _resolve_algorithm(spec):
    if spec is None or spec in ("gemm", "plain"):
        return None
    if isinstance(spec, dict):
        return Algorithm.from_dict(spec)
    return ir.get(spec)


# ---- emit: CUDA sources ----------------------------------------------------------------------
def lower_to_cuda(func, arch: str, pass_configs: dict | None = None) -> str:
    """TileLang prim_func → CUDA source holding the kernel and TileLang's host launcher."""
    from tilelang import tvm
    from tilelang.engine import lower
    from tilelang.jit.adapter.wrapper import TLWrapper
    from tvm.target import Target
    tgt = Target({"kind": "cuda", "arch": arch})
    pass_configs = pass_configs or {}
    with tvm.transform.PassContext(opt_level=3, config=pass_configs), tgt:
        art = lower(func, target=tgt)
    w = TLWrapper(tgt)
    w.assign_optimized_module(tvm.IRModule({"main": func}))
    w.assign_pass_configs(pass_configs)
    w.assign_host_module(art.host_mod)
    w.assign_device_module(art.device_mod)
    return w.wrap(art.kernel_source)


def _write(path: str, text: str) -> str:
    with open(path, "w") as f:
        f.write(text)
    return path


def emit_sources(p: Composition, rq: Request, clustered: tuple) -> tuple[list[str], list[dict], dict]:
    """Lower every kernel of ``p`` and write its CUDA source, then the entry file chaining
    them: (source paths, launch facts per kernel, the manifest's ``extra`` with the
    prepared-B plan)."""
    arch, name = rq.target.arch, rq.name
    sources, infos = [], []
    for k in p.kernels:
        symbol = f"{name}_{k.name}"
        code = host_source.kernel_source(lower_to_cuda(k.func, arch), k, symbol, rq.config,
                                         clustered, p.info)
        sources.append(_write(os.path.join(rq.out_dir, f"{symbol}.cu"), code))
        infos.append(dict(host_source.launch_info(code, k.name), args=k.args))
    check_smem(infos, arch)
    M, N, K = rq.shape
    entry, prepared = entry_point.artifact_entry(p, name, b_bytes=K * N * ITEMSIZE[rq.dtype])
    sources.append(_write(os.path.join(rq.out_dir, f"{name}_entry.cu"), entry))
    return sources, infos, dict(p.info or {}, prepared_b=prepared)


# ---- build: compose, emit, compile -----------------------------------------------------------
def build(req: dict) -> dict:
    import tilelang     # the compiler: this process only
    t0 = time.time()
    rq = Request.parse(req)
    os.makedirs(rq.out_dir, exist_ok=True)
    alg, cfg, arch = rq.algorithm, rq.config, rq.target.arch
    clustered = cluster_kernels(cfg, rq.dtype, arch)
    p = compose(alg, rq.shape, rq.dtype, cfg, rq.programs, arch)
    sources, infos, extra = emit_sources(p, rq, clustered)
    t_gen = time.time() - t0
    lib, ptxas = None, {}
    if rq.compile:
        lib = os.path.join(rq.out_dir, f"{rq.name}.so")
        includes = host.tilelang_include_dirs(os.path.dirname(tilelang.__file__))
        ptxas = host.compile_so(sources, lib, arch, includes, jobs=rq.jobs)
    resp = {"ok": True, "library": lib, "sources": sources, "kernels": infos,
            "workspace_bytes": p.workspace[-1][1], "workspace": p.workspace[:-1],
            "entry_points": {"init": "lcmac_init", "run": "lcmac_run",
                             "last_error": "lcmac_last_error",
                             "workspace_bytes": "lcmac_workspace_bytes"},
            "name": rq.name, "config": cfg.to_dict(), "arch": arch, "target": rq.target.name,
            "dtype": rq.dtype, "shape": list(rq.shape),
            "gemm_precision": gemm_precision(rq.dtype, cfg),
            "algorithm": alg.to_dict() if alg is not None else None,
            "algorithm_name": alg.name if alg is not None else "gemm",
            "algorithm_hash": alg.hash if alg is not None else None,
            "extra": extra, "ptxas": ptxas,
            "seconds": {"codegen": round(t_gen, 2), "total": round(time.time() - t0, 2)}}
    side = dict(resp, library=os.path.basename(lib) if lib else None,
                sources=[os.path.basename(s) for s in sources])
    with open(os.path.join(rq.out_dir, f"{rq.name}.json"), "w") as f:
        json.dump(side, f, indent=1)
    return resp


def build_contract(req: dict) -> dict:
    """``lcmac.build``'s worker contract (version 1; see lcmac/artifact/build.py's docstring)."""
    import tilelang     # the compiler: this process only
    tgt = req["target"]
    shape = req["shape"]
    alg = None if req.get("plain_gemm") else Algorithm.from_dict(req["algorithm"])
    lib_out = req["library"]
    work = tempfile.mkdtemp(prefix="lcmac-cuda-", dir=os.path.dirname(os.path.abspath(lib_out)))
    try:
        inner = {"algorithm": alg.to_dict() if alg is not None else None,
                 "target": tgt["name"], "dtype": req["dtype"],
                 "shape": [shape["M"], shape["N"], shape["K"]],
                 "config": req.get("config") or {}, "out_dir": work, "name": "lcmac",
                 "jobs": int(os.environ.get("LCMAC_NVCC_JOBS", "2"))}
        if req.get("programs"):
            inner["programs"] = req["programs"]
        r = build(inner)
        shutil.move(r["library"], lib_out)
        if req.get("source"):
            with open(req["source"], "w") as f:
                for path in r["sources"]:
                    f.write(f"// ===== {os.path.basename(path)} =====\n")
                    f.write(open(path).read())
                    f.write("\n")
        info = {k: r[k] for k in ("kernels", "workspace_bytes", "workspace", "arch", "name",
                                  "gemm_precision", "extra", "ptxas")}
        info["entry"] = {"init": "lcmac_init", "run": "lcmac_run(A, B, C, workspace, stream)",
                         "last_error": "lcmac_last_error",
                         "workspace_bytes": "lcmac_workspace_bytes"}
        return {"ok": True, "library": lib_out, "entry_points": ["lcmac_run"],
                "target_dict": {"kind": "cuda", "arch": r["arch"]},
                "compiler": {"name": "tilelang+nvcc", "version": getattr(tilelang, "__version__", "?")},
                "config": r["config"], "seconds": r["seconds"], "info": info}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _contract_error(e) -> dict:
    return {"ok": False, "error": {"type": type(e).__name__, "message": str(e),
                                   "traceback": traceback.format_exc()[-6000:]}}


#: ``--serve`` marks each response line with this prefix (TileLang's own output may come between)
SERVE_MARK = "@lcmac-worker@ "


def _failure(e) -> dict:
    """A raw request's failure; the parent turns it into an exception of the same class."""
    return {"ok": False, "error": str(e), "error_type": type(e).__name__,
            "traceback": traceback.format_exc()[-6000:]}


def serve() -> int:
    """``python -m lcmac.targets.tilelang_worker --serve``: one raw request (the module
    docstring's JSON object) per line on stdin, each answered by one line on stdout that
    starts with ``SERVE_MARK``, until stdin closes: many builds for one TileLang import (the
    tests run their code generation through one such process)."""
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            resp = build(json.loads(line))
        except Exception as e:
            resp = _failure(e)
        sys.stdout.write("\n" + SERVE_MARK + json.dumps(resp) + "\n")
        sys.stdout.flush()
    return 0


def main() -> int:
    if "--serve" in sys.argv[1:]:
        return serve()
    try:
        req = json.loads(sys.stdin.read() or "{}")
        if "batch" in req:
            out = []
            for r in req["batch"]:
                try:
                    out.append(build_contract(r))
                except Exception as e:
                    out.append(_contract_error(e))
            resp = {"ok": True, "batch": out}
        elif "version" in req:
            try:
                resp = build_contract(req)
            except Exception as e:
                resp = _contract_error(e)
        else:
            resp = build(req)
    except Exception as e:
        resp = _failure(e)
    # TileLang logs to stdout/stderr; the response is the last line of stdout
    sys.stdout.write("\n" + json.dumps(resp) + "\n")
    sys.stdout.flush()
    return 0 if resp.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
