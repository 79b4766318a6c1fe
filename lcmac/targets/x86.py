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

#: LLVM features that select a kernel variant → the /proc/cpuinfo flag it then needs
KERNEL_FEATURES = {"avx512bf16": "avx512_bf16"}


def _host_flags() -> set:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def tvm_target(request: dict) -> dict:
    """The TVM target dict: the registry's, with ``mcpu`` from the request; ``native``
    (or ``host``) asks LLVM for this machine's CPU (only inside the worker)."""
    d = dict(request["target"]["dict"])
    mcpu = request.get("mcpu")
    native = mcpu in ("native", "host")
    if native:
        from tvm.target import codegen   # worker-only import
        mcpu = codegen.llvm_get_system_cpu()
    if mcpu:
        d["mcpu"] = mcpu
    if native and request["target"]["name"] == "x86_64-avx512":
        # LLVM names a CPU by its model number and may name an older core than the features
        # say (this Sapphire Rapids VM reads as "rocketlake", which has no AVX512-BF16): add
        # the features a kernel selects on from what the host reports
        flags = _host_flags()
        attrs = list(d.get("mattr", []))
        for feat, flag in KERNEL_FEATURES.items():
            if flag in flags and f"+{feat}" not in attrs:
                attrs.append(f"+{feat}")
        if attrs:
            d["mattr"] = attrs
    if request["target"]["name"] == "x86_64-avx512":
        # LLVM prefers 256-bit vectors on Intel cores; the micro-kernel is written for zmm
        attrs = list(d.get("mattr", []))
        if "-prefer-256-bit" not in attrs:
            attrs.append("-prefer-256-bit")
        d["mattr"] = attrs
    return d


def kernel_features(tdict: dict) -> list[str]:
    """The features in ``KERNEL_FEATURES`` that LLVM enables for the target dict (its
    mcpu plus mattr); asks LLVM (worker only)."""
    import tvm
    from tvm.target import codegen
    t = tvm.target.Target(tdict)
    return [f for f in KERNEL_FEATURES if codegen.llvm_cpu_has_features(f, t)]


def lower(request: dict) -> tuple[str, dict]:
    """TVMScript source of the kernel for this request.  Nothing in it is x86-specific beyond
    the config (vector width comes in through mr/nr) and the kernel features of the target
    (``avx512bf16``: the bf16 GEMM stage on vdpbf16ps), which need LLVM to resolve, so this
    runs in the worker; an AArch64 module can use ``lower_request`` as is."""
    from ..schedules.cpu_lcma import lower_request
    feats = kernel_features(tvm_target(request)) if request.get("dtype") == "bfloat16" else []
    src, info = lower_request(request, features=feats)
    # what the artifact needs from the CPU beyond its target's flags
    info["cpu_flags"] = sorted(set(REQUIRED_FLAGS.get(request["target"]["name"], ()))
                               | {KERNEL_FEATURES[f] for f in feats
                                  if info.get("gemm_kernel") == "vdpbf16ps"})
    return src, info


def export_library(rt_module, path: str) -> str:
    import shutil
    if not (os.environ.get("CXX") or shutil.which("g++") or shutil.which("gcc")):
        raise ToolchainError("linking a CPU artifact needs a C compiler (gcc/g++); "
                             "install it with: apt-get install g++")
    rt_module.export_library(path)
    return path


def host_supports(target_name: str, flags=()) -> bool:
    """Whether this machine can run code for ``target_name`` that also uses the cpuinfo
    ``flags`` (an artifact's ``extra["cpu_flags"]``; reads /proc/cpuinfo)."""
    import platform
    if platform.machine() not in ("x86_64", "AMD64"):
        return False
    have = _host_flags()
    if not have:
        return True     # no /proc/cpuinfo: cannot tell
    return all(f in have for f in (*REQUIRED_FLAGS.get(target_name, ()), *flags))


def check_runnable(target_name: str, flags=()) -> None:
    if not host_supports(target_name, flags):
        need = sorted(set(REQUIRED_FLAGS.get(target_name, ())) | set(flags))
        raise TargetError(f"this machine cannot run code built for {target_name} "
                          f"(needs CPU features {', '.join(need) or 'x86-64'}); "
                          "rebuild with --target host")
