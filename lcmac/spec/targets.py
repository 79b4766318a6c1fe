"""Target names resolved: a name of the table (``lcmac.spec.target_table``), ``cuda`` for the
GPU that is present (asked of nvidia-smi) and ``host`` for this CPU (read from /proc/cpuinfo),
and the schedule family that serves a target.  No compiler is imported."""
from __future__ import annotations

import platform
import shutil
import subprocess

from lcmac.core.errors import TargetError
from lcmac.spec.cpu import aarch64
from lcmac.spec.target_table import TARGETS, Target

__all__ = ["get_target", "host_target", "schedule_family"]


def _present_gpu_target() -> Target:
    """`--target cuda`: the GPU that is present, found without importing a compiler."""
    smi = shutil.which("nvidia-smi")
    caps = []
    if smi:
        try:
            out = subprocess.run([smi, "--query-gpu=compute_cap", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=20)
            caps = [c.strip() for c in out.stdout.splitlines() if c.strip()]
        except (OSError, subprocess.SubprocessError):
            caps = []
    choices = ", ".join(n for n, t in TARGETS.items() if t.family == "cuda")
    if not caps:
        raise TargetError(f"--target cuda means the GPU that is present, and this machine has none; "
                          f"name one explicitly to cross-compile: {choices}")
    major = caps[0].split(".")[0]
    if major == "9":
        return TARGETS["cuda-sm90a"]
    if major == "8":
        return TARGETS["cuda-sm80"]
    raise TargetError(f"the GPU present has compute capability {caps[0]}, which lcmac does not "
                      f"target; choices: {choices}")


def get_target(name: str) -> Target:
    """A target by name; ``cuda`` resolves to the GPU that is present."""
    if name == "cuda":
        return _present_gpu_target()
    if name in ("host", "native"):
        return host_target()
    try:
        return TARGETS[name]
    except KeyError:
        raise TargetError(f"unknown target {name!r}; choose one of {', '.join(TARGETS)}"
                          " (or 'cuda' for the GPU present, 'host' for this CPU)") from None


def host_target() -> Target:
    """The best target this CPU runs (read from /proc/cpuinfo; no compiler needed)."""
    if platform.machine() in ("aarch64", "arm64"):
        return aarch64.host_target()    # SVE width decides neon/sve256/sve512
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        flags = ""
    if "avx512f" in flags:
        return TARGETS["x86_64-avx512"]
    if "avx2" in flags and "fma" in flags:
        return TARGETS["x86_64-avx2"]
    return TARGETS["x86_64"]


def schedule_family(target) -> str:
    """'cpu' or 'cuda': which family of schedules (lcmac.spec.registry) serves ``target``
    (a name or a Target; a cost-model profile name given as a target counts as 'cpu')."""
    t = str(getattr(target, "name", target))
    if t.startswith("cuda"):
        return "cuda"
    try:
        return "cuda" if get_target(t).family == "cuda" else "cpu"
    except TargetError:
        return "cpu"
