"""x86-64 targets (AVX-512, AVX2, SSE2) for the apache-tvm backend.

What the compiler worker asks a target family module for (the contract an AArch64 module
can follow): ``tvm_target(request) -> dict``, ``lower(request) -> (tvmscript source, info)``,
``export_library(rt_module, path)``.  Importing this module imports no compiler.
"""
from __future__ import annotations

import os

from ..errors import TargetError, ToolchainError

#: CPU feature flags (/proc/cpuinfo) an artifact of each target needs to run
REQUIRED_FLAGS = {"x86_64-avx512": ("avx512f",), "x86_64-avx2": ("avx2", "fma"), "x86_64": ()}


def tvm_target(request: dict) -> dict:
    """The TVM target dict: the registry's, with ``mcpu`` from the request; ``native``
    (or ``host``) asks LLVM for this machine's CPU (only inside the worker)."""
    d = dict(request["target"]["dict"])
    mcpu = request.get("mcpu")
    if mcpu in ("native", "host"):
        from tvm.target import codegen   # worker-only import
        mcpu = codegen.llvm_get_system_cpu()
    if mcpu:
        d["mcpu"] = mcpu
    if request["target"]["name"] == "x86_64-avx512":
        # LLVM prefers 256-bit vectors on Intel cores; the micro-kernel is written for zmm
        attrs = list(d.get("mattr", []))
        if "-prefer-256-bit" not in attrs:
            attrs.append("-prefer-256-bit")
        d["mattr"] = attrs
    return d


def lower(request: dict) -> tuple[str, dict]:
    """TVMScript source of the kernel for this request (no compiler import).  Nothing in it
    is x86-specific beyond the config (vector width comes in through mr/nr), so an AArch64
    module can use ``lcmac.schedules.cpu_lcma.lower_request`` as is."""
    from ..schedules.cpu_lcma import lower_request
    return lower_request(request)


def export_library(rt_module, path: str) -> str:
    import shutil
    if not (os.environ.get("CXX") or shutil.which("g++") or shutil.which("gcc")):
        raise ToolchainError("linking a CPU artifact needs a C compiler (gcc/g++); "
                             "install it with: apt-get install g++")
    rt_module.export_library(path)
    return path


def host_supports(target_name: str) -> bool:
    """Whether this machine can run code for ``target_name`` (reads /proc/cpuinfo)."""
    import platform
    if platform.machine() not in ("x86_64", "AMD64"):
        return False
    try:
        flags = set()
        for line in open("/proc/cpuinfo"):
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        return True
    return all(f in flags for f in REQUIRED_FLAGS.get(target_name, ()))


def check_runnable(target_name: str) -> None:
    if not host_supports(target_name):
        raise TargetError(f"this machine cannot run code built for {target_name} "
                          f"(needs CPU features {', '.join(REQUIRED_FLAGS.get(target_name, ())) or 'x86-64'}); "
                          "rebuild with --target host")
