"""CUDA back end, toolchain side: nvcc found (``find_nvcc``), its flags, and the compile of an
artifact's sources into one plain ``.so`` (``compile_so``: cubin inside, CUDA runtime linked
statically).

Imports neither TileLang nor TVM.  The sources come from the TileLang worker
(``lcmac.targets.tilelang_worker``): each kernel lowered by TileLang with its host launcher
and rewritten for linking (``lcmac.schedules.cuda.host_source``), and the entry file chaining
them (``lcmac.schedules.cuda.entry_point``, which lists the library's entry points).  The bit
kernels' library (``lcmac.bits.cuda``) is compiled here too.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor

from lcmac.core.errors import ToolchainError

NVCC_CANDIDATES = ("/usr/local/bin/nvcc", "/usr/local/cuda/bin/nvcc")


def find_nvcc() -> str:
    env = os.environ.get("LCMAC_NVCC")
    if env:
        return env
    p = shutil.which("nvcc")
    if p:
        return p
    for c in NVCC_CANDIDATES:
        if os.path.exists(c):
            return c
    raise ToolchainError("nvcc not found: install the CUDA toolkit (12.x/13.x) or set LCMAC_NVCC")


def nvcc_version() -> str:
    """The last line of ``nvcc --version`` (the release and build), "?" if it says nothing."""
    try:
        out = subprocess.run([find_nvcc(), "--version"], capture_output=True, text=True,
                             timeout=60).stdout
    except OSError as e:
        raise ToolchainError(f"nvcc cannot run: {e}") from None
    return out.strip().splitlines()[-1] if out.strip() else "?"


def gencode(arch: str) -> list[str]:
    """Explicit -gencode (the -arch=sm_90a shorthand can run a plain sm_90 pass that rejects
    wgmma/setmaxnreg)."""
    num = arch.replace("sm_", "")
    return ["-gencode", f"arch=compute_{num},code=sm_{num}"]


def tilelang_include_dirs(tl_root: str) -> list[str]:
    return [os.path.join(tl_root, "src"), os.path.join(tl_root, "3rdparty", "cutlass", "include")]


def nvcc_flags(arch: str, includes: list[str]) -> list[str]:
    return (["-std=c++20", "-O3", "-w", "-Xcudafe", "--diag_suppress=177", "-lineinfo",
             "-Xcompiler", "-fPIC", "--ptxas-options=--verbose"]
            + gencode(arch) + [f"-I{d}" for d in includes])


def compile_so(sources: list[str], out_so: str, arch: str, includes: list[str],
               jobs: int = 2, timeout: float = 900) -> dict:
    """Compile each .cu to an object (in parallel), link one shared library. Returns the
    ptxas resource report per source."""
    nvcc = find_nvcc()
    flags = nvcc_flags(arch, includes)

    def one(src):
        obj = src[:-3] + ".o"
        cmd = [nvcc, *flags, "-c", src, "-o", obj]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if p.returncode != 0:
            raise ToolchainError(f"nvcc failed on {src}:\n{' '.join(cmd)}\n{p.stderr[-4000:]}")
        return obj, p.stderr

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as ex:
        results = list(ex.map(one, sources))
    objs = [o for o, _ in results]
    # TileLang's debug.h defines (identical) non-inline helpers in every source
    cmd = [nvcc, "--shared", *gencode(arch), "-Xcompiler", "-fPIC",
           "-Xlinker", "--allow-multiple-definition", *objs, "-o", out_so]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise ToolchainError(f"nvcc link failed:\n{' '.join(cmd)}\n{p.stderr[-4000:]}")
    for o in objs:
        os.remove(o)
    report = {}
    for src, (_, err) in zip(sources, results):
        regs = re.findall(r"Used (\d+) registers", err)
        spills = re.findall(r"(\d+) bytes spill stores", err)
        report[os.path.basename(src)] = {"registers": [int(x) for x in regs],
                                         "spill_stores": [int(x) for x in spills]}
    return report
