"""Hardware profiles: the numbers the analytic cost model needs about one machine.

A ``HardwareProfile`` holds peaks (matrix-unit multiply FLOP/s and vector add FLOP/s per
dtype, memory bandwidth), the parallel units (SMs or cores), the on-chip sizes (shared
memory / L1, registers, L2, L3) and *efficiency factors*: the achievable fraction of the
matrix peak for a large GEMM and of the bandwidth for a streaming combine kernel.  The
efficiencies start as datasheet-plus-judgement defaults (the ``source`` string says which
numbers came from where) and a calibration step (``lcmac.tune``) overwrites them with
measured ones through :meth:`HardwareProfile.with_calibration`.

Conventions
-----------
* ``mul_flops[dtype]``: dense matrix-unit FLOP/s (an FMA counts 2), tensor cores on GPUs,
  FMA vector units (or AMX/BFMMLA where noted) on CPUs.
* ``add_flops[dtype]``: element additions per second on the vector units (one add = 1 FLOP);
  the combine stages run there.
* ``mem_bw``: DRAM bytes per second, reads plus writes.
* dtypes use lcmac's canonical names (``lcmac.core.dtypes``) plus ``tfloat32``: float32 storage
  multiplied on TF32 tensor cores (GPU only).  Plain ``float32`` on a GPU means IEEE FP32 on
  the CUDA cores ("fp32 without TF32").
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

from lcmac.core.dtypes import normalize_model_dtype
from lcmac.core.errors import DTypeError, TargetError
from lcmac.spec.targets import get_target

KiB = 1024
MiB = 1024 * KiB
T = 1e12
G = 1e9

def _freeze(d: Mapping) -> Mapping:
    return MappingProxyType(dict(d))


@dataclass(frozen=True)
class HardwareProfile:
    name: str
    kind: str                               # "gpu" | "cpu"
    description: str
    mul_flops: Mapping[str, float]          # dtype -> matrix-unit FLOP/s
    add_flops: Mapping[str, float]          # dtype -> vector adds/s
    mem_bw: float                           # DRAM bytes/s
    units: int                              # SMs (GPU) or cores (CPU)
    onchip_per_unit: int                    # shared memory per SM (GPU) / L1d per core (CPU), bytes
    regs_per_unit: int                      # register file per SM / vector register file per core, bytes
    l2_bytes: int                           # L2 (GPU: whole chip; CPU: per core)
    l3_bytes: int = 0                       # CPU last-level cache (whole socket share), bytes
    l2_bw: float = 0.0                      # bytes/s into L2 (GPU) / from L2 (CPU, all cores)
    vector_bits: int = 0                    # CPU SIMD width
    source: str = ""
    # ---- efficiency factors (calibratable) ----------------------------------------------
    gemm_efficiency: Mapping[str, float] = field(default_factory=lambda: _freeze({"default": 0.75}))
    bandwidth_efficiency: float = 0.85      # streaming combine kernels vs mem_bw
    add_efficiency: float = 0.5             # vector adds vs add_flops
    epilogue_overlap: float = 0.5           # fraction of a fused epilogue hidden under the main loop
    launch_overhead_s: float = 3e-6         # per kernel launch / parallel region
    shape_half: float = 16.0                # size-dependent GEMM efficiency: 1/(1+h/M+h/N+h/K)
    #: GPU output tiles the model considers, with their efficiency relative to the best
    tile_efficiency: Mapping[tuple, float] = field(default_factory=lambda: _freeze(
        {(128, 256): 1.0, (128, 128): 0.97, (128, 64): 0.92, (64, 64): 0.75}))
    calibrated: Mapping[str, object] = field(default_factory=lambda: _freeze({}))

    def __post_init__(self):
        if self.kind not in ("gpu", "cpu"):
            raise ValueError(f"profile kind must be 'gpu' or 'cpu', got {self.kind!r}")
        for nm in ("mul_flops", "add_flops", "gemm_efficiency", "tile_efficiency", "calibrated"):
            object.__setattr__(self, nm, _freeze(getattr(self, nm)))

    # ---- queries ----------------------------------------------------------------------
    @property
    def dtypes(self) -> tuple[str, ...]:
        return tuple(self.mul_flops)

    def check_dtype(self, dtype) -> str:
        d = normalize_model_dtype(dtype)
        if d not in self.mul_flops:
            raise DTypeError(f"profile {self.name!r} has no {d} matrix unit; it supports "
                             f"{', '.join(self.mul_flops)}")
        return d

    def peak_mul(self, dtype) -> float:
        return self.mul_flops[self.check_dtype(dtype)]

    def peak_add(self, dtype) -> float:
        d = self.check_dtype(dtype)
        if d in self.add_flops:
            return self.add_flops[d]
        return self.add_flops.get("float32", min(self.add_flops.values()))

    def gemm_eff(self, dtype) -> float:
        d = normalize_model_dtype(dtype)
        return float(self.gemm_efficiency.get(d, self.gemm_efficiency.get("default", 0.75)))

    def achievable_mul(self, dtype) -> float:
        """Large-GEMM FLOP/s: peak × calibrated efficiency."""
        return self.peak_mul(dtype) * self.gemm_eff(dtype)

    def achievable_bw(self) -> float:
        return self.mem_bw * self.bandwidth_efficiency

    def achievable_add(self, dtype) -> float:
        return self.peak_add(dtype) * self.add_efficiency

    def ridge(self, dtype) -> float:
        """FLOP per byte where the achievable roofline turns from memory- to compute-bound."""
        return self.achievable_mul(dtype) / self.achievable_bw()

    # ---- calibration ------------------------------------------------------------------
    _CALIBRATABLE = ("bandwidth_efficiency", "add_efficiency", "epilogue_overlap",
                     "launch_overhead_s", "shape_half", "mem_bw", "l2_bw")

    def with_calibration(self, values: Mapping[str, object] | None = None, **kw) -> "HardwareProfile":
        """A copy with measured factors. Keys: ``gemm_efficiency`` (a float for every dtype or
        a {dtype: float} mapping), ``gemm_efficiency.<dtype>``, ``tile_efficiency``
        ({(bm, bn): float}), and any of ``_CALIBRATABLE`` (bandwidth_efficiency,
        add_efficiency, epilogue_overlap, launch_overhead_s, shape_half, mem_bw, l2_bw).
        The values given are also recorded in ``calibrated``."""
        vals = dict(values or {})
        vals.update(kw)
        changes: dict[str, object] = {}
        geff = dict(self.gemm_efficiency)
        for key, v in vals.items():
            if key == "gemm_efficiency":
                if isinstance(v, Mapping):
                    geff.update({("default" if k == "default" else normalize_model_dtype(k)): float(x)
                                 for k, x in v.items()})
                else:
                    geff = {"default": float(v)}
            elif key.startswith("gemm_efficiency."):
                geff[normalize_model_dtype(key.split(".", 1)[1])] = float(v)
            elif key == "tile_efficiency":
                te = dict(self.tile_efficiency)
                te.update({tuple(k): float(x) for k, x in dict(v).items()})
                changes["tile_efficiency"] = te
            elif key in self._CALIBRATABLE:
                changes[key] = float(v)
            else:
                raise ValueError(f"unknown calibration key {key!r}; known: gemm_efficiency, "
                                 f"gemm_efficiency.<dtype>, tile_efficiency, "
                                 f"{', '.join(self._CALIBRATABLE)}")
        for nm in ("gemm_efficiency", "bandwidth_efficiency", "add_efficiency", "epilogue_overlap"):
            x = geff if nm == "gemm_efficiency" else changes.get(nm)
            for f in ((x.values() if isinstance(x, Mapping) else [x]) if x is not None else []):
                if not 0.0 < f <= 1.0 and not (nm == "epilogue_overlap" and f == 0.0):
                    raise ValueError(f"{nm} must be in (0, 1], got {f}")
        changes["gemm_efficiency"] = geff
        cal = dict(self.calibrated)
        cal.update(vals)
        changes["calibrated"] = cal
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        for k in ("mul_flops", "add_flops", "gemm_efficiency", "calibrated"):
            d[k] = dict(d[k])
        d["tile_efficiency"] = {f"{a}x{b}": v for (a, b), v in self.tile_efficiency.items()}
        return d


# ---- the profiles ----------------------------------------------------------------------
def _hopper(name, desc, bw, units, l2, src, *, bf16=989.4 * T, fp32=66.9 * T, fp64=66.9 * T,
            fp64_vec=33.5 * T, fp8=True, l2_bw=None):
    mul = {"bfloat16": bf16, "float16": bf16, "tfloat32": bf16 / 2, "float32": fp32,
           "float64": fp64}
    if fp8:
        mul["float8_e4m3"] = 2 * bf16
    # vector units: FP32 FMA rate/2 adds; packed bf16/fp16 (HADD2) twice that; fp8 combines
    # are done after conversion at the fp16 rate.
    add = {"float32": fp32 / 2, "tfloat32": fp32 / 2, "bfloat16": fp32, "float16": fp32,
           "float64": fp64_vec / 2, "float8_e4m3": fp32}
    return HardwareProfile(
        name=name, kind="gpu", description=desc, mul_flops=mul, add_flops=add, mem_bw=bw,
        units=units, onchip_per_unit=228 * KiB, regs_per_unit=256 * KiB, l2_bytes=l2,
        l2_bw=l2_bw or 2.5 * bw, source=src,
        gemm_efficiency={"default": 0.75, "bfloat16": 0.78, "float16": 0.78, "float32": 0.78,
                         "tfloat32": 0.72, "float8_e4m3": 0.65, "float64": 0.85},
        launch_overhead_s=3e-6, shape_half=16.0)


_H100_SRC = ("NVIDIA H100 SXM5 datasheet: 989 TFLOP/s dense BF16/FP16, 495 TF32, 1979 FP8, "
             "67 FP64 tensor, 67 FP32 / 33.5 FP64 CUDA-core; 3.35 TB/s HBM3; 132 SMs, 228 KiB "
             "smem+L1 per SM, 256 KiB registers per SM, 50 MiB L2. gemm_efficiency from "
             "measurements on an H100 SXM (docs/cuda.md): cuBLAS bf16 721/771/689 TFLOP/s at "
             "4096³/8192³/16384³, fp32 (no TF32) 50–52 TFLOP/s. L2 bandwidth ~2.5× HBM is a "
             "judgement, not measured.")


def _cpu(name, desc, *, cores, ghz, fma_ports, vector_bits, mem_bw, l1, l2, l3, src,
         gemm_efficiency, bandwidth_efficiency, fp16=False):
    """A CPU profile from its datasheet numbers: fp32 peak = cores × FMA ports × fp32 lanes ×
    2 × clock; adds at half the FMA rate; bf16 (dot products) at 2× fp32; 32 vector
    registers; L2 read at 64 B/cycle/core at half the clock."""
    fp32 = cores * fma_ports * (vector_bits // 32) * 2 * ghz
    mul = {"float32": fp32, "float64": fp32 / 2, "bfloat16": 2 * fp32}
    add = {"float32": fp32 / 2, "float64": fp32 / 4, "bfloat16": fp32 / 2}
    if fp16:                                 # AVX512-FP16: dot products and packed adds
        mul["float16"], add["float16"] = 2 * fp32, fp32
    return HardwareProfile(
        name=name, kind="cpu", description=desc, mul_flops=mul, add_flops=add, mem_bw=mem_bw,
        units=cores, onchip_per_unit=l1, regs_per_unit=32 * (vector_bits // 8), l2_bytes=l2,
        l3_bytes=l3, l2_bw=cores * 64 * ghz * 0.5, vector_bits=vector_bits, source=src,
        gemm_efficiency=gemm_efficiency, bandwidth_efficiency=bandwidth_efficiency,
        add_efficiency=0.5, launch_overhead_s=5e-6, shape_half=40.0, epilogue_overlap=0.0)


def _build() -> dict[str, HardwareProfile]:
    P: dict[str, HardwareProfile] = {}
    P["h100"] = _hopper("h100", "NVIDIA H100 SXM5 80 GB (Hopper, sm_90a)", 3.35 * T, 132,
                        50 * MiB, _H100_SRC)
    P["h200"] = _hopper("h200", "NVIDIA H200 SXM 141 GB (Hopper, sm_90a)", 4.8 * T, 132, 50 * MiB,
                        "NVIDIA H200 datasheet: compute as H100 SXM, 4.8 TB/s HBM3e; efficiencies "
                        "copied from the H100 measurements (not measured on an H200).")
    P["h20"] = _hopper("h20", "NVIDIA H20 96 GB (Hopper, sm_90, export part)", 4.0 * T, 78,
                       60 * MiB,
                       "NVIDIA H20 public specs: 148 TFLOP/s dense BF16/FP16, 74 TF32, 296 FP8, "
                       "44 FP32, 1 FP64; 4.0 TB/s; 78 SMs (the FalconGEMM paper's GPU); 60 MiB L2. "
                       "Efficiencies are judgement (Hopper-like).",
                       bf16=148 * T, fp32=44 * T, fp64=1 * T, fp64_vec=1 * T)
    a100_mul = {"bfloat16": 312 * T, "float16": 312 * T, "tfloat32": 156 * T, "float32": 19.5 * T,
                "float64": 19.5 * T}
    a100_add = {"float32": 9.75 * T, "tfloat32": 9.75 * T, "bfloat16": 39 * T, "float16": 39 * T,
                "float64": 4.85 * T}
    P["a100"] = HardwareProfile(
        name="a100", kind="gpu", description="NVIDIA A100 SXM4 80 GB (Ampere, sm_80)",
        mul_flops=a100_mul, add_flops=a100_add, mem_bw=2.039 * T, units=108,
        onchip_per_unit=164 * KiB, regs_per_unit=256 * KiB, l2_bytes=40 * MiB, l2_bw=5.0 * T,
        source="NVIDIA A100 datasheet: 312 TFLOP/s BF16/FP16, 156 TF32, 19.5 FP64 tensor, 19.5 FP32 "
               "CUDA-core; 2.04 TB/s HBM2e; 108 SMs, 164 KiB smem per SM, 40 MiB L2; no FP8. "
               "Efficiencies are judgement (cuBLAS typically reaches ~80% at large sizes).",
        gemm_efficiency={"default": 0.78, "float32": 0.85, "float64": 0.85},
        tile_efficiency={(128, 256): 1.0, (128, 128): 0.98, (128, 64): 0.93, (64, 64): 0.8},
        launch_overhead_s=3e-6)

    # A 2-core Sapphire Rapids-class VM (AVX-512, AMX): the x86_64-avx512 target's host.
    P["spr-2core"] = _cpu(
        "spr-2core", "a 2-core Intel Xeon VM, AVX-512 (+BF16, FP16, AMX): Sapphire Rapids class",
        cores=2, ghz=3.85e9, fma_ports=2, vector_bits=512, mem_bw=21 * G, l1=48 * KiB,
        l2=2 * MiB, l3=8 * MiB, fp16=True,
        src="measured on a 2-core Xeon VM (docs/cpu.md): a loop of independent AVX-512 FMAs ran "
            "247 GFLOP/s a core on both cores at once (2 FMA ports × 16 fp32 lanes at 3.85 GHz: "
            "493 GFLOP/s), numpy's OpenBLAS 406 GFLOP/s at 4096³, a copy 25-30 GB/s a core "
            "(bytes moved). bf16/fp16 at 2× fp32 (AVX512-BF16 / AVX512-FP16 dot products; AMX "
            "not modelled). lscpu: 48 KiB L1d, 2 MiB L2 a core; the L3 share of a 2-core VM is a "
            "guess (8 MiB). Efficiencies fitted by lcmac.tune.calibrate to the records of "
            "2026-11-28 in lcmac/data/tuning_logs/x86_64-avx512-float32.jsonl (19 measurements): log-RMS "
            "error 0.11, mean |error| 8.5 %, where the profile before (2.5 GHz assumed, "
            "efficiencies 0.85 and 1.0) was off by 0.30 and 30 % and put smirnov-3x3x6-r40 ahead "
            "of the GEMM at four LLM layers where it ran 0.64-0.85x numpy.",
        gemm_efficiency={"default": 0.87, "float32": 0.87}, bandwidth_efficiency=0.31)
    # A 2-core AMD EPYC VM with AVX2 only (16 vector registers): the x86_64-avx2 target's host.
    P["epyc-2core"] = dataclasses.replace(_cpu(
        "epyc-2core", "a 2-core AMD EPYC VM, AVX2 and FMA (no AVX-512)",
        cores=2, ghz=3.0e9, fma_ports=2, vector_bits=256, mem_bw=21 * G, l1=32 * KiB,
        l2=512 * KiB, l3=32 * MiB,
        src="lscpu of a 2-core AMD EPYC VM (AVX2, FMA; 32 KiB L1d and 512 KiB L2 a core, 32 MiB "
            "L3); peak assumes 2 FMA ports × 8 fp32 lanes at ~3 GHz (192 GFLOP/s); numpy's "
            "OpenBLAS measured 159 GFLOP/s at 4096³ and a numpy add ~21 GB/s (docs/cpu.md). "
            "Efficiencies fitted by lcmac.tune.calibrate to lcmac/data/tuning_logs/x86_64-avx2-float32.jsonl "
            "(16 measurements, 2026-11-27): log-RMS error 0.18, mean |error| 10 %; the generic "
            "32-core profile this target used before was off by 3.1 (log-RMS: ~20x too fast).",
        gemm_efficiency={"default": 0.81, "float32": 0.81}, bandwidth_efficiency=0.23),
        regs_per_unit=16 * 32)
    # Neoverse V1 (Graviton3): 64 cores, 2.6 GHz, 2×256-bit SVE FMA pipes.
    P["neoverse-v1"] = _cpu(
        "neoverse-v1", "AWS Graviton3 (Neoverse V1), 64 cores, SVE 256-bit",
        cores=64, ghz=2.6e9, fma_ports=2, vector_bits=256, mem_bw=307 * G, l1=64 * KiB,
        l2=1 * MiB, l3=32 * MiB,
        src="Arm/AWS public specs: 64 Neoverse-V1 cores at 2.6 GHz, 2×256-bit SVE FMA "
            "(5.3 TFLOP/s fp32 peak), BFMMLA bf16 counted at 2× fp32 (conservative), "
            "DDR5-4800 ×8 = 307 GB/s, 64 KiB L1d, 1 MiB L2, 32 MiB LLC. Efficiencies are "
            "judgement (not measured).",
        gemm_efficiency={"default": 0.8}, bandwidth_efficiency=0.75)
    # Neoverse V2 (NVIDIA Grace, one CPU): 72 cores, 3.1 GHz, 4×128-bit SVE2 FMA pipes.
    P["neoverse-v2"] = _cpu(
        "neoverse-v2", "NVIDIA Grace (Neoverse V2), 72 cores, SVE2 128-bit",
        cores=72, ghz=3.1e9, fma_ports=4, vector_bits=128, mem_bw=500 * G, l1=64 * KiB,
        l2=1 * MiB, l3=114 * MiB,
        src="NVIDIA Grace datasheet: 72 Neoverse-V2 cores at 3.1 GHz, 4×128-bit FMA pipes "
            "(7.1 TFLOP/s fp32, 3.6 fp64), LPDDR5X ~500 GB/s, 64 KiB L1d, 1 MiB L2, 114 MiB "
            "L3. Efficiencies are judgement.",
        gemm_efficiency={"default": 0.8}, bandwidth_efficiency=0.8)
    P["generic-avx512"] = _cpu(
        "generic-avx512",
        "a generic AVX-512 server socket: 32 cores at 2.0 GHz AVX-512 clock, 2 FMA ports",
        cores=32, ghz=2.0e9, fma_ports=2, vector_bits=512, mem_bw=300 * G, l1=48 * KiB,
        l2=2 * MiB, l3=60 * MiB,
        src="a made-up but typical Xeon socket (Ice Lake/Sapphire Rapids class): 4.1 TFLOP/s "
            "fp32, 8 DDR channels ~300 GB/s. For ranking only, not any particular machine.",
        gemm_efficiency={"default": 0.8}, bandwidth_efficiency=0.75)
    return P


PROFILES: dict[str, HardwareProfile] = _build()

_PROFILE_ALIASES = {"h100-sxm": "h100", "h200-sxm": "h200", "a100-sxm": "a100",
                    "graviton3": "neoverse-v1", "grace": "neoverse-v2", "spr": "spr-2core",
                    "host": "spr-2core"}

#: lcmac target name → default profile (used when lcmac.spec.targets cannot say)
TARGET_PROFILES = {"cuda-sm90a": "h100", "cuda-sm90": "h100", "cuda-sm80": "a100",
                   "x86_64-avx512": "spr-2core", "x86_64-avx2": "epyc-2core",
                   "x86_64": "generic-avx512", "aarch64-neon": "neoverse-v1",
                   "aarch64-sve": "neoverse-v1"}


def profile_names() -> list[str]:
    return list(PROFILES)


def get_profile(name) -> HardwareProfile:
    """A profile by name (``h100``, ``h200``, ``a100``, ``h20``, ``spr-2core``, ``neoverse-v1``,
    ``neoverse-v2``, ``generic-avx512``); a ``HardwareProfile`` is passed through."""
    if isinstance(name, HardwareProfile):
        return name
    key = str(name).strip().lower()
    key = _PROFILE_ALIASES.get(key, key)
    if key in PROFILES:
        return PROFILES[key]
    raise TargetError(f"unknown hardware profile {name!r}; choose one of {', '.join(PROFILES)}")


def profile_for_target(target) -> HardwareProfile:
    """The default profile for an lcmac target name (``cuda-sm90a`` → h100, ``cuda-sm80`` →
    a100, ``x86_64-avx512`` → spr-2core, ``aarch64-*`` → neoverse-v1, …).  A profile name or a
    ``HardwareProfile`` is accepted too, so callers can aim the model at e.g. ``h20``."""
    if isinstance(target, HardwareProfile):
        return target
    name = getattr(target, "profile", None)          # an lcmac.spec.target_table.Target
    if name:
        return get_profile(name)
    t = str(target).strip()
    if t in TARGET_PROFILES:
        return get_profile(TARGET_PROFILES[t])
    if t.lower() in PROFILES or t.lower() in _PROFILE_ALIASES:
        return get_profile(t)
    try:
        return get_profile(get_target(t).profile)   # 'cuda' (present GPU), 'host'
    except TargetError as e:
        raise TargetError(f"{e}; or a hardware profile name: {', '.join(PROFILES)}") from None
