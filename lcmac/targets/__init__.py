"""Target names and their properties. Backends live in sibling modules; nothing
target-specific is decided outside ``lcmac/targets`` and ``lcmac/schedules``."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import TargetError


@dataclass(frozen=True)
class Target:
    name: str
    family: str                  # "x86" | "aarch64" | "cuda"
    backend: str                 # "tvm" (apache-tvm + LLVM) | "tilelang"
    description: str
    dtypes: tuple[str, ...]
    profile: str                 # default lcmac.costmodel profile
    vector_bits: int | None = None
    arch: str | None = None      # CUDA compute arch, e.g. "sm_90a"
    llvm: dict = field(default_factory=dict)  # TVM target dict for LLVM targets

    def tvm_target(self, mcpu: str | None = None) -> dict:
        d = dict(self.llvm)
        if mcpu:
            d["mcpu"] = mcpu
        return d


TARGETS: dict[str, Target] = {t.name: t for t in [
    Target("x86_64-avx512", "x86", "tvm", "x86-64 with AVX-512 (Skylake-SP and later; this machine)",
           ("float32", "float64", "bfloat16"), "spr-2core", 512,
           llvm={"kind": "llvm", "mcpu": "skylake-avx512"}),
    Target("x86_64-avx2", "x86", "tvm", "x86-64 with AVX2 and FMA (Haswell and later)",
           ("float32", "float64"), "generic-avx512", 256,
           llvm={"kind": "llvm", "mcpu": "haswell"}),
    Target("x86_64", "x86", "tvm", "portable x86-64 (SSE2 only)", ("float32", "float64"),
           "generic-avx512", 128, llvm={"kind": "llvm", "mcpu": "x86-64"}),
    Target("aarch64-neon", "aarch64", "tvm", "AArch64 with NEON (Graviton2/3, Grace)",
           ("float32", "float64"), "neoverse-v1", 128,
           llvm={"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon"]}),
    Target("aarch64-sve", "aarch64", "tvm", "AArch64 with SVE, vector-length agnostic (Graviton3, Grace)",
           ("float32", "float64"), "neoverse-v1", None,
           llvm={"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon", "+sve"]}),
    # fixed-length SVE (clang's -msve-vector-bits=N); correct on any machine with VL >= N
    Target("aarch64-sve256", "aarch64", "tvm", "AArch64 SVE, 256-bit vectors fixed at compile time "
           "(Graviton3 / Neoverse V1)", ("float32", "float64"), "neoverse-v1", 256,
           llvm={"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon", "+sve"],
                 "cl-opt": ["-aarch64-sve-vector-bits-min:int=256"]}),
    Target("aarch64-sve512", "aarch64", "tvm", "AArch64 SVE, 512-bit vectors fixed at compile time "
           "(A64FX)", ("float32", "float64"), "neoverse-v1", 512,
           llvm={"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon", "+sve"],
                 "cl-opt": ["-aarch64-sve-vector-bits-min:int=512"]}),
    Target("cuda-sm90a", "cuda", "tilelang", "NVIDIA Hopper (H100, H200): wgmma tensor cores",
           ("bfloat16", "float16", "float32", "float8_e4m3"), "h100", arch="sm_90a"),
    Target("cuda-sm80", "cuda", "tilelang", "NVIDIA Ampere (A100): mma tensor cores",
           ("bfloat16", "float16", "float32"), "a100", arch="sm_80"),
]}


def _present_gpu_target() -> Target:
    """`--target cuda`: the GPU that is present, found without importing a compiler."""
    import shutil
    import subprocess
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
    import platform
    if platform.machine() in ("aarch64", "arm64"):
        from .aarch64 import host_target as arm_host   # SVE width decides neon/sve256/sve512
        return arm_host()
    try:
        flags = open("/proc/cpuinfo").read()
    except OSError:
        flags = ""
    if "avx512f" in flags:
        return TARGETS["x86_64-avx512"]
    if "avx2" in flags and "fma" in flags:
        return TARGETS["x86_64-avx2"]
    return TARGETS["x86_64"]


def schedule_family(target) -> str:
    """'cpu' or 'cuda': which family of schedules (lcmac.schedules.registry) serves ``target``
    (a name or a Target; a cost-model profile name given as a target counts as 'cpu')."""
    t = str(getattr(target, "name", target))
    if t.startswith("cuda"):
        return "cuda"
    try:
        return "cuda" if get_target(t).family == "cuda" else "cpu"
    except TargetError:
        return "cpu"
