"""The targets lcmac builds for, by name: family, backend, dtypes, cost-model profile,
vector width, CUDA arch and LLVM target dict.  Pure data."""
from __future__ import annotations

from dataclasses import dataclass, field


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
           ("float32", "float64"), "epyc-2core", 256,
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
