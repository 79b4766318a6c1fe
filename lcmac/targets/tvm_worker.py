"""Compiler worker for the apache-tvm backend: ``python -m lcmac.targets.tvm_worker``.

Reads one JSON request on stdin, writes one JSON response on stdout (the contract is in
``lcmac.artifact.build``'s docstring).  This process imports apache-tvm and never TileLang
(the two cannot share a process).  Target specifics come from the family's plug-ins in
``lcmac.targets.tvm_plugins``: ``tvm_target(request)``, ``lower(request) -> (TVMScript
source, info)``, ``export_library(rt_module, path)``.

A request with ``"kernel": "bits"`` asks for the packed bit-matrix product of
``lcmac.schedules.cpu_bits`` instead of an LCMA matmul (sent by ``lcmac.bits.native_build``)::

    {"version": 1, "kernel": "bits", "semiring": "gf2" | "boolean",
     "config": BitsConfig.to_dict(), "entry": "lcmac_bits_m4rm",
     "target": {"name": "host", "family": "x86"},   # resolved by the plug-in to this CPU's
     "mcpu": "native", "library": "/abs/kernel.so"}  # best target
    → the response of that contract; info: {"kernel": "bits-m4rm", "target": name, ...}

Its function takes (A, B, C, AT, Tab) of any shape (the template's docstring).
"""
from __future__ import annotations

import json
import sys
import time
import traceback

import tvm
from tvm.script import ir as I
from tvm.script import tirx as T

from lcmac.core.errors import TargetError
from lcmac.targets.tvm_plugins import PLUGINS


def handle(request: dict) -> dict:
    fam = request["target"]["family"]
    if fam not in PLUGINS:
        raise TargetError(f"the apache-tvm backend has no plug-ins for the {fam} family: "
                          f"building for {request['target']['name']} is not supported")
    tvm_target, lower, export_library = PLUGINS[fam]
    t0 = time.perf_counter()
    source, info = lower(request)
    if request.get("source"):
        with open(request["source"], "w") as f:
            f.write(source)
    t1 = time.perf_counter()
    parsed = tvm.script.from_source(source, extra_vars={"T": T, "I": I})
    # a template gives one prim_func, or a module (the CPU LCMA: entry points over subroutines)
    mod = parsed if isinstance(parsed, tvm.IRModule) else tvm.IRModule({request.get("entry", "lcmac_matmul"): parsed})
    entries = [request.get("entry", "lcmac_matmul")]
    pb = info.get("prepared_b") or {}
    entries += [pb[k] for k in ("prepare", "run") if k in pb]
    tdict = tvm_target(request)          # resolves mcpu "native" once
    target = tvm.target.Target(tdict)
    lib = tvm.compile(mod, target=target)
    t2 = time.perf_counter()
    export_library(lib, request["library"])
    t3 = time.perf_counter()
    if request.get("asm"):
        try:
            with open(request["asm"], "w") as f:
                f.write(lib.mod.inspect_source("asm") if hasattr(lib, "mod") else lib.inspect_source("asm"))
        except Exception:  # noqa: BLE001 - assembly listing is a debugging aid only
            pass
    return {"ok": True, "library": request["library"], "entry_points": entries,
            "target_dict": tdict,
            "compiler": {"name": "apache-tvm", "version": getattr(tvm, "__version__", "?")},
            "seconds": {"lower": t1 - t0, "compile": t2 - t1, "link": t3 - t2},
            "info": info}


def main() -> int:
    try:
        request = json.load(sys.stdin)
        if "batch" in request:      # several builds, one compiler import
            out = []
            for r in request["batch"]:
                try:
                    out.append(handle(r))
                except Exception as e:  # noqa: BLE001
                    out.append({"ok": False, "error": {"type": type(e).__name__, "message": str(e),
                                                       "traceback": traceback.format_exc()[-4000:]}})
            resp = {"ok": True, "batch": out}
        else:
            resp = handle(request)
    except Exception as e:  # noqa: BLE001 - every failure goes back as JSON
        resp = {"ok": False, "error": {"type": type(e).__name__, "message": str(e),
                                       "traceback": traceback.format_exc()[-4000:]}}
    sys.stdout.write("\n" + json.dumps(resp, default=str) + "\n")
    sys.stdout.flush()
    return 0 if resp.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
