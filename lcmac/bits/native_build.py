"""The native bit kernel's library: compiled by the apache-tvm worker process, kept in the
bit-kernel cache, loaded with ``tvm_ffi``.

``load_kernel(semiring, config)`` returns the compiled function for ``"gf2"`` or
``"boolean"``, compiling it on a miss (``library_paths`` compiles several with one worker).
The kernel is the template of ``lcmac.schedules.cpu_bits`` (its docstring has the algorithm
and the calling convention); this module only obtains it:

* **Compiling** goes through the compiler worker of the ``"tvm"`` backend
  (``lcmac.artifact.worker``) with a request of kind ``"bits"``: ``kernel``, ``semiring`` and
  the template's ``config``, for the target ``"host"`` and ``mcpu`` "native" (the request is
  described in ``lcmac.targets.tvm_worker``).  apache-tvm is never imported in this process.
* **On disk** in the bit-kernel cache (``lcmac.bits.cache``), keyed by the sha256 of the
  semiring, the config, the template's generation (``TEMPLATE_VERSION``), lcmac's and
  apache-tvm's versions and this CPU (model name and flags: the library is built for the CPU
  it runs on).
* **Loading** is ``tvm_ffi.load_module``: the kernel has no parallel loop and allocates no
  workspace, so it needs nothing of TVM's runtime library (lcmac's CPU loader fills its
  thread-pool and workspace hooks, which this library does not have).
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import importlib.util
import os
import platform
import shutil
from pathlib import Path

from lcmac.artifact.store import Spec
from lcmac.artifact.worker import raise_error, run_batch
from lcmac.bits import cache
from lcmac.core import version as _version
from lcmac.core.errors import ArtifactError, ToolchainError

__all__ = ["TEMPLATE_VERSION", "ENTRY", "kernel_key", "library_paths", "load_kernel",
           "missing_loader", "missing_toolchain"]

#: the generation of ``lcmac.schedules.cpu_bits``'s template that this module asks for (the
#: two are kept equal; a test checks it): part of the key, so a new template is recompiled
TEMPLATE_VERSION = 1
ENTRY = "lcmac_bits_m4rm"
KEY_FORMAT = "lcmac-bits-kernel/1"
#: the compiler worker that builds it
BACKEND = "tvm"


@functools.lru_cache(maxsize=1)
def missing_loader() -> str | None:
    """Why a compiled native kernel cannot run here (None: it can)."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return f"the native bit kernel is built for x86-64; this machine is {platform.machine()}"
    if importlib.util.find_spec("tvm_ffi") is None:
        return "loading the native bit kernel needs apache-tvm's tvm_ffi (pip install apache-tvm)"
    return None


@functools.lru_cache(maxsize=1)
def missing_toolchain() -> str | None:
    """Why no native kernel can be compiled here (None: nothing is missing)."""
    why = missing_loader()
    if why:
        return why
    if importlib.util.find_spec("tvm") is None:
        return "compiling the native bit kernel needs apache-tvm (pip install apache-tvm)"
    if not (os.environ.get("CXX") or shutil.which("g++") or shutil.which("gcc")):
        return "linking the native bit kernel needs a C compiler (apt-get install g++)"
    return None


@functools.lru_cache(maxsize=1)
def _host_cpu() -> dict:
    model, flags = platform.processor() or platform.machine(), ""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as info:
        for line in info:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags"):
                flags = " ".join(sorted(line.split(":", 1)[1].split()))
                break
    return {"model": model, "flags_sha256": hashlib.sha256(flags.encode()).hexdigest()}


def _compiler_version() -> str | None:
    try:
        return importlib.metadata.version("apache-tvm")
    except importlib.metadata.PackageNotFoundError:
        return None


def kernel_key(semiring: str, config: dict) -> tuple[str, dict]:
    """(key, fields): the cache key of the kernel and what it is the sha256 of."""
    s = _spec(semiring, config)
    return s.key, s.fields


def _spec(semiring: str, config: dict) -> Spec:
    fields = {"format": KEY_FORMAT, "semiring": semiring, "config": dict(config),
              "template_version": TEMPLATE_VERSION, "lcmac_version": _version.__version__,
              "compiler": _compiler_version(), "cpu": dict(_host_cpu())}
    return Spec(fields, what=f"the native {semiring} bit kernel")


def _compile(jobs: list) -> list[dict]:
    """The kernels of ``jobs`` [(spec, scratch directory)] by one compiler worker (one
    apache-tvm import), each into its directory's ``kernel.so``; what each entry records."""
    requests = [{"version": 1, "kernel": "bits", "semiring": spec.fields["semiring"],
                 "config": spec.fields["config"], "target": {"name": "host", "family": "x86"},
                 "mcpu": "native", "entry": ENTRY, "library": str(tmp / cache.LIBRARY)}
                for spec, tmp in jobs]
    records = []
    for resp in run_batch(BACKEND, requests, what="the native bit kernel"):
        if not resp.get("ok"):
            raise_error(BACKEND, resp.get("error", {}), what="the native bit kernel")
        records.append({"target": resp.get("info", {}).get("target"),
                        "target_dict": resp.get("target_dict"), "seconds": resp.get("seconds")})
    return records


def library_paths(semirings, config: dict, *, build: bool = True) -> dict[str, Path | None]:
    """semiring → the compiled library of its kernel: from disk, else compiled now when
    ``build`` (all missing ones by one worker), else None.  Raises ``ToolchainError`` when
    they cannot be compiled."""
    specs = {s: _spec(s, config) for s in dict.fromkeys(semirings)}
    found = {s: cache.lookup(spec) for s, spec in specs.items()}
    missing = [s for s, lib in found.items() if lib is None]
    if not missing or not build:
        return found
    why = missing_toolchain()
    if why:
        raise ToolchainError(why)
    found.update(zip(missing, cache.obtain([specs[s] for s in missing], _compile)))
    return found


def load_kernel(semiring: str, config: dict, *, build: bool = True):
    """(function, module) of the compiled kernel, or None when it is not on disk and
    ``build`` is False.  The module must be kept referenced while the function is used."""
    why = missing_loader()
    if why:
        raise ToolchainError(why)
    lib = library_paths([semiring], config, build=build)[semiring]
    if lib is None:
        return None
    import tvm_ffi                          # the FFI only; apache-tvm stays out of this process
    try:
        module = tvm_ffi.load_module(str(lib))
        return module[ENTRY], module
    except Exception as e:  # noqa: BLE001 - whatever the FFI raises, said as lcmac's error
        raise ArtifactError(f"the native bit kernel {lib} cannot be loaded: {e}") from None
