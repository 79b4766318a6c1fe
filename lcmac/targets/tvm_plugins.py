"""The apache-tvm backend's target plug-ins: what the compiler worker asks of a CPU target
family — ``tvm_target(request) -> dict``, ``lower(request) -> (TVMScript source, info)``,
``export_library(module, path)``.

x86 requests come in two kinds: the LCMA matmul (``lcmac.build``'s request) and, with
``"kernel": "bits"``, the packed bit-matrix product of ``lcmac.schedules.cpu_bits`` (the
request ``lcmac.bits`` sends: ``semiring``, ``config``, ``entry``, ``library`` and a target
named ``"host"``, which is resolved here to the best target this CPU runs, built with
``mcpu`` "native": the kernel is compiled where it runs).

This module imports apache-tvm, so only ``lcmac.targets.tvm_worker`` imports it; the host
facts these plug-ins use (CPU flags, the AArch64 toolchain) live in ``x86`` and ``aarch64``,
which import no compiler.
"""
from __future__ import annotations

import os
import shutil

import tvm
from tvm.support import cc as tvm_cc
from tvm.target import codegen

from lcmac.core.errors import ToolchainError
from lcmac.schedules import cpu_bits, te_lcma
from lcmac.schedules.cpu_lcma import lower_request
from lcmac.spec.cpu import aarch64, x86
from lcmac.spec.targets import get_target
from lcmac.targets import aarch64 as aarch64_toolchain


# ---- x86-64 -----------------------------------------------------------------------------
def _resolved(request: dict) -> dict:
    """The request, its target named ``"host"`` replaced by this CPU's best target."""
    if request["target"].get("name") != "host":
        return request
    t = get_target("host")
    return {**request, "target": {"name": t.name, "family": t.family, "backend": t.backend,
                                  "vector_bits": t.vector_bits, "arch": t.arch,
                                  "dict": t.tvm_target()}}


def x86_tvm_target(request: dict) -> dict:
    """The TVM target dict: the registry's, with ``mcpu`` from the request; ``native``
    (or ``host``) asks LLVM for this machine's CPU."""
    request = _resolved(request)
    d = dict(request["target"]["dict"])
    mcpu = request.get("mcpu")
    native = mcpu in ("native", "host")
    if native:
        mcpu = codegen.llvm_get_system_cpu()
    if mcpu:
        d["mcpu"] = mcpu
    if native and request["target"]["name"] == "x86_64-avx512":
        # LLVM names a CPU by its model number and may name an older core than the features
        # say (a Sapphire Rapids VM can read as "rocketlake", which has no AVX512-BF16): add
        # the features a kernel selects on from what the host reports
        flags = x86.host_flags()
        attrs = list(d.get("mattr", []))
        for feat, flag in x86.KERNEL_FEATURES.items():
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


def llvm_features(tdict: dict, names) -> set[str]:
    """Those of the LLVM feature ``names`` that LLVM enables for the target dict (its mcpu
    plus mattr)."""
    t = tvm.target.Target(tdict)
    return {f for f in names if codegen.llvm_cpu_has_features(f, t)}


def x86_lower(request: dict) -> tuple[str, dict]:
    """TVMScript source of the kernel for this request.  Nothing in it is x86-specific beyond
    the config (vector width comes in through mr/nr) and the kernel features of the target
    (``avx512bf16``: the bf16 GEMM stage on vdpbf16ps; ``amx-tile``/``amx-bf16``: on AMX),
    which need LLVM to resolve; the
    fixed-width AArch64 targets use it as is.  A ``"kernel": "bits"`` request gets the bit
    kernel (``lcmac.schedules.cpu_bits``), which selects on no feature."""
    request = _resolved(request)
    tdict = x86_tvm_target(request)
    # one LLVM query: the features a kernel selects on, and all the mcpu lets LLVM use
    enabled = (llvm_features(tdict, {*x86.LLVM_FEATURE_FLAGS, *x86.KERNEL_FEATURES})
               if request["target"]["family"] == "x86" else set())
    feats = [f for f in x86.KERNEL_FEATURES if f in enabled] if request.get("dtype") == "bfloat16" else []
    if request.get("kernel") == "bits":
        src, info = cpu_bits.lower_request(request)
        info["target"] = request["target"]["name"]
    else:
        src, info = lower_request(request, features=feats)
    # what the artifact needs from the CPU: its target's flags, the kernel's own (vdpbf16ps),
    # and whatever else LLVM may use for the target's mcpu (checked by the loader)
    info["cpu_flags"] = sorted(set(x86.REQUIRED_FLAGS.get(request["target"]["name"], ()))
                               | {x86.KERNEL_FEATURES[f] for f in feats
                                  if f in x86.KERNEL_USES.get(info.get("gemm_kernel"), ())}
                               | {x86.LLVM_FEATURE_FLAGS[f] for f in enabled if f in x86.LLVM_FEATURE_FLAGS})
    return src, info


def x86_export_library(rt_module, path: str) -> str:
    if not (os.environ.get("CXX") or shutil.which("g++") or shutil.which("gcc")):
        raise ToolchainError("linking a CPU artifact needs a C compiler (gcc/g++); "
                             "install it with: apt-get install g++")
    rt_module.export_library(path)
    return path


# ---- AArch64 ----------------------------------------------------------------------------
def aarch64_tvm_target(request: dict) -> dict:
    """The TVM target dict for a build request (mcpu from the request, never the host's)."""
    d = dict(request["target"]["dict"])
    if request.get("mcpu") and request["mcpu"] not in ("native", "host"):
        d["mcpu"] = request["mcpu"]
    return d


def aarch64_lower(request: dict) -> tuple[str, dict]:
    """TVMScript source of the kernel.  Fixed-width targets: the CPU backend's packed
    template (``x86_lower``, which is target-neutral: the vector width comes from the
    config's nr and the target's vector_bits).  ``aarch64-sve``: the vscale lowering
    (``lcmac.schedules.te_lcma``)."""
    aarch64_toolchain.cross_gcc()          # fail before compiling when the linker is missing
    t = get_target(request["target"]["name"])
    if aarch64.kernel_kind(t) == "cpu_lcma":
        src, info = x86_lower(request)
        return src, {**info, "kernel": "cpu_lcma"}
    return te_lcma.lower_request(request)


def aarch64_export_library(module, path: str) -> str:
    """Link a compiled TVM module into an AArch64 shared library at ``path`` with the
    cross compiler."""
    module.export_library(path, fcompile=tvm_cc.cross_compiler(aarch64_toolchain.cross_gcc(), options=["-O2"]))
    return path


#: family → (tvm_target, lower, export_library)
PLUGINS = {"x86": (x86_tvm_target, x86_lower, x86_export_library),
           "aarch64": (aarch64_tvm_target, aarch64_lower, aarch64_export_library)}
