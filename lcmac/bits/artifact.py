"""Bit-matrix artifacts: ``lcmac build --dtype gf2|bool`` puts the compiled bit kernel of one
target (this CPU's native Four Russians kernel, or the CUDA kernels for one GPU architecture)
beside a manifest that names the semiring, the scheme and its levels, so ``lcmac.load``
serves products of any shape from it without a compiler (``lcmac.bits.loader``).

    lcmac build --algo winograd --dtype gf2 --target host -o DIR    # GF(2), Winograd levels
    lcmac build --algo m4r --dtype bool --target cuda -o DIR        # Boolean, kernel alone

The manifest is the GEMM artifacts' format (``lcmac-artifact/1``) with ``backend``
``"bits-native"`` or ``"bits-cuda"``, ``dtype`` ``"gf2"`` or ``"bool"`` and ``shape``
``{"rule": "any"}``: the kernels read M, K and N at run time.
"""
from __future__ import annotations

import shutil
import time
from pathlib import Path

from lcmac.core import version as _version
from lcmac.bits import cuda as bits_cuda
from lcmac.bits import native as bits_native
from lcmac.bits import native_build
from lcmac.bits.lcma import AUTO_SCHEME, gf2_scheme
from lcmac.core.errors import AlgorithmError, TargetError, ToolchainError
from lcmac.schedules import cuda_bits
from lcmac.spec.target_table import Target
from lcmac.spec.targets import host_target
from lcmac.artifact.manifest import FORMAT, Manifest, sha256_file

__all__ = ["BIT_DTYPES", "build_bits", "is_bit_dtype"]

#: lcmac's dtype names for bit matrices → the semiring
BIT_DTYPES = {"gf2": "gf2", "bool": "boolean"}
#: what ``--algo`` may say for the kernel alone
KERNEL_ALONE = ("m4r", "kernel")


def is_bit_dtype(dtype) -> bool:
    return str(dtype) in BIT_DTYPES


def _algorithm(algo: str, semiring: str, levels: int | None) -> dict:
    if levels is not None and (not isinstance(levels, int) or isinstance(levels, bool) or levels < 0):
        raise ValueError(f"levels must be a nonnegative integer or None (auto), got {levels!r}")
    if algo in KERNEL_ALONE or (semiring == "boolean" and algo == "auto"):
        if levels not in (None, 0):
            raise AlgorithmError(f"--algo {algo} is the kernel alone; --levels {levels} needs a scheme")
        return {"name": "m4r", "grid": [1, 1, 1], "rank": 1, "levels": 0}
    if semiring == "boolean":
        raise AlgorithmError(f"--dtype bool runs the kernel alone (--algo m4r): no LCMA runs over "
                             f"the Boolean semiring (it has no subtraction), so {algo!r} cannot")
    scheme = gf2_scheme(AUTO_SCHEME if algo == "auto" else algo)   # verified modulo 2
    return {"name": algo if algo != "auto" else AUTO_SCHEME, "grid": list(scheme.grid),
            "rank": scheme.R, "levels": levels}


def _library(t: Target, semiring: str) -> tuple[Path, str, dict, list]:
    """(compiled library, backend, config, entry points) for the target."""
    if t.family == "cuda":
        arch = t.arch
        if not arch or int(arch[3:5]) < 80:
            raise TargetError(f"the GPU bit kernels need compute capability 8.0 or newer; "
                              f"{t.name} is {arch}")
        entries = [{"name": "lcmac_bits_mm"}, {"name": "lcmac_bits_transpose"}]
        return (bits_cuda.library_path(arch), "bits-cuda",
                {"kernel": bits_cuda.AUTO_KERNEL, "template_version": cuda_bits.TEMPLATE_VERSION},
                entries)
    if t.family == "x86":
        why = native_build.missing_toolchain()
        if why:
            raise ToolchainError(why)
        lib = native_build.library_paths([semiring], bits_native.CONFIG)[semiring]
        return lib, "bits-native", dict(bits_native.CONFIG), [{"name": native_build.ENTRY}]
    raise TargetError(f"bit kernels are built for this x86-64 CPU (--target host) or an NVIDIA "
                      f"GPU (--target cuda or cuda-sm90a), not {t.name}")


def _check_host_target(t: Target) -> None:
    """The native kernel is compiled for this CPU (``-mcpu=native``): a build names the host."""
    if t.family == "x86" and t.name != host_target().name:
        raise TargetError(f"the native bit kernel is compiled for this CPU ({host_target().name}); "
                          f"--target {t.name} would need another machine: build there, or pass "
                          f"--target host")


def build_bits(algo: str, t: Target, dtype: str, levels: int | None = None,
               out_dir: str | Path = ".", name: str | None = None) -> Path:
    """Compile (or take from the bit-kernel cache) the kernel for ``t`` and write
    ``<out_dir>/<name>.so`` and its manifest ``<name>.json``; returns the manifest's path."""
    semiring = BIT_DTYPES[dtype]
    algorithm = _algorithm(str(algo), semiring, levels)
    _check_host_target(t)
    t0 = time.perf_counter()
    lib, backend, config, entries = _library(t, semiring)
    name = name or f"{algorithm['name']}-{dtype}-{t.name}".replace("^", "p").replace("*", "x")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    dst = out / f"{name}.so"
    tmp = out / f".{name}.so.tmp"
    shutil.copyfile(lib, tmp)
    tmp.replace(dst)                         # readers see the old library or the whole new one
    man = Manifest(name=name, backend=backend, algorithm=algorithm,
                   target={"name": t.name, "family": t.family, "arch": t.arch},
                   dtype=dtype, shape={"rule": "any"}, config=config, entry_points=entries,
                   library={"file": dst.name, "sha256": sha256_file(dst),
                            "bytes": dst.stat().st_size},
                   lcmac_version=_version.__version__,
                   build={"seconds": round(time.perf_counter() - t0, 3)},
                   format=FORMAT)
    return man.write(out / f"{name}.json")
