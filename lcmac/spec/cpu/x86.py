"""x86-64 targets (AVX-512, AVX2, SSE2): the CPU features an artifact needs and whether
this machine has them (read from /proc/cpuinfo; no compiler)."""
from __future__ import annotations

import platform

from lcmac.core.errors import TargetError

#: CPU feature flags (/proc/cpuinfo) an artifact of each target needs to run
REQUIRED_FLAGS = {"x86_64-avx512": ("avx512f",), "x86_64-avx2": ("avx2", "fma"), "x86_64": ()}

#: LLVM features that select a kernel variant → the /proc/cpuinfo flag it then needs
KERNEL_FEATURES = {"avx512bf16": "avx512_bf16", "amx-tile": "amx_tile", "amx-bf16": "amx_bf16"}

#: the kernel an artifact's GEMM stage runs (manifest ``extra.gemm_kernel``) → the LLVM
#: features of KERNEL_FEATURES it uses
KERNEL_USES = {"vdpbf16ps": ("avx512bf16",), "amx": ("amx-tile", "amx-bf16")}

#: LLVM features that code for an ``mcpu`` may use → the /proc/cpuinfo flag a CPU needs to run
#: it.  An artifact built for e.g. ``--mcpu sapphirerapids`` may hold AVX512-FP16 moves
#: (``vmovw``) that other AVX-512 CPUs lack: its manifest lists every flag here that LLVM
#: enables for its target, and the loader checks them before running it.
LLVM_FEATURE_FLAGS = {
    "avx2": "avx2", "fma": "fma", "f16c": "f16c", "bmi": "bmi1", "bmi2": "bmi2",
    "avx512f": "avx512f", "avx512dq": "avx512dq", "avx512cd": "avx512cd", "avx512bw": "avx512bw",
    "avx512vl": "avx512vl", "avx512ifma": "avx512ifma", "avx512vbmi": "avx512vbmi",
    "avx512vbmi2": "avx512_vbmi2", "avx512vnni": "avx512_vnni", "avx512bitalg": "avx512_bitalg",
    "avx512vpopcntdq": "avx512_vpopcntdq", "avx512bf16": "avx512_bf16", "avx512fp16": "avx512_fp16",
    "avx512vp2intersect": "avx512_vp2intersect", "avxvnni": "avx_vnni", "gfni": "gfni",
    "vaes": "vaes", "vpclmulqdq": "vpclmulqdq", "amx-tile": "amx_tile", "amx-bf16": "amx_bf16",
    "amx-int8": "amx_int8", "amx-fp16": "amx_fp16",
}


def host_flags() -> set:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def host_supports(target_name: str, flags=()) -> bool:
    """Whether this machine can run code for ``target_name`` that also uses the cpuinfo
    ``flags`` (an artifact's ``extra["cpu_flags"]``; reads /proc/cpuinfo)."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return False
    have = host_flags()
    if not have:
        return True     # no /proc/cpuinfo: cannot tell
    return all(f in have for f in (*REQUIRED_FLAGS.get(target_name, ()), *flags))


def check_runnable(target_name: str, flags=()) -> None:
    if not host_supports(target_name, flags):
        need = sorted(set(REQUIRED_FLAGS.get(target_name, ())) | set(flags))
        raise TargetError(f"this machine cannot run code built for {target_name} "
                          f"(needs CPU features {', '.join(need) or 'x86-64'}); "
                          "rebuild with --target host")


#: LLVM CPU names whose cores have AMX-BF16 and AMX-TILE (Sapphire Rapids and later Xeons)
AMX_MCPUS = ("sapphirerapids", "emeraldrapids", "graniterapids", "graniterapids-d", "diamondrapids")


def mcpu_has_amx(mcpu: str | None) -> bool:
    """Whether code for the LLVM CPU ``mcpu`` may use AMX bf16 tiles: a named CPU that has
    them, or "native"/"host" on a machine whose /proc/cpuinfo lists them."""
    if mcpu in ("native", "host"):
        return {"amx_tile", "amx_bf16"} <= host_flags()
    return (mcpu or "").lower() in AMX_MCPUS
