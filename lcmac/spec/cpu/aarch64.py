"""AArch64 targets (NEON, SVE): the templates' schedule parameters and what this CPU runs.

SVE comes in two flavours:

* ``aarch64-sve`` is vector-length agnostic (VLA): the code is correct on every SVE vector
  length (every power of two, the only lengths the architecture allows) and uses all of it.
  The CPU backend's packed templates fix their panel widths when the code is generated,
  which TVM's ``vscale`` cannot express for a packed buffer, so this target uses
  ``lcmac.schedules.te_lcma`` (unfused stages; GEMM column loop split by ``lanes·vscale``
  and vectorised by TVM, columns padded to 2048 bits so that no predicate is needed).
* ``aarch64-sve256`` / ``aarch64-sve512`` fix the vector length at compile time (what
  clang's ``-msve-vector-bits=N`` does), passed to LLVM as
  ``-aarch64-sve-vector-bits-min=N``; the templates then use N-bit vectors, which LLVM
  lowers to SVE ``z`` registers under a ``ptrue vlK`` predicate.  Such a binary is correct on
  any machine whose vector length is at least N bits (it uses N of them).

The host facts are read from /proc/cpuinfo and prctl, without a compiler; the cross
toolchain and qemu are ``lcmac.targets.aarch64``.
"""
from __future__ import annotations

import platform
from dataclasses import dataclass

from lcmac.core.errors import TargetError
from lcmac.spec.target_table import TARGETS

ITEM_BITS = {"float32": 32, "float64": 64, "float16": 16, "bfloat16": 16}


@dataclass(frozen=True)
class ArmParams:
    """What the CPU templates need to know about an AArch64 target."""
    vector_bits: int            # width of one vector the generated code uses
    lanes: int                  # elements per vector for the dtype
    mr: int                     # register tile rows (rows of A per micro-kernel)
    nr: int                     # register tile columns (a multiple of lanes)
    registers: int = 32         # architectural vector registers (V0–V31 / Z0–Z31)
    sve: bool = False
    vla: bool = False           # code must run on every SVE vector length

    @property
    def accumulators(self) -> int:
        return self.mr * self.nr // self.lanes


def code_vector_bits(target) -> int:
    """The vector width the generated code uses on ``target`` (128 for NEON and VLA SVE)."""
    return int(target.vector_bits or 128)


def is_sve(target) -> bool:
    return "+sve" in tuple(target.llvm.get("mattr", ()))


def schedule_params(target, dtype: str = "float32") -> ArmParams:
    """Register tiling for a target: 32 vector registers; an MR×NR accumulator tile of
    MR·(NR/lanes) registers, plus NR/lanes for a row of B and one or two for A.

    * 128-bit (NEON, VLA SVE): 8×12 fp32 (24 accumulators, 3 B, 2 A registers holding
      eight A values used lane-indexed by ``fmla v.4s, v.4s, v.s[i]``): 29 of 32.
    * 256/512-bit SVE: 8×(3 vectors), 24 accumulators; A is broadcast by ``ld1rw``.
    """
    bits = code_vector_bits(target)
    ebits = ITEM_BITS.get(dtype)
    if ebits is None:
        raise TargetError(f"{target.name} does not support dtype {dtype}; "
                          f"choose one of {', '.join(target.dtypes)}")
    lanes = bits // ebits
    return ArmParams(vector_bits=bits, lanes=lanes, mr=8, nr=3 * lanes, sve=is_sve(target),
                     vla=is_sve(target) and target.vector_bits is None)


def sve_vq(target) -> int | None:
    """qemu's ``sve-max-vq`` (vector length in 128-bit units) that the target needs at least;
    None for NEON targets."""
    if not is_sve(target):
        return None
    return max(1, code_vector_bits(target) // 128)


def kernel_kind(target) -> str:
    """``cpu_lcma``: the CPU backend's packed templates at the target's fixed vector width
    (NEON, SVE-256, SVE-512; and 128-bit for anything else).  ``te_vla``: the
    vector-length-agnostic lowering (``lcmac.schedules.te_lcma`` with ``vscale``) for
    ``aarch64-sve``."""
    return "te_vla" if is_sve(target) and target.vector_bits is None else "cpu_lcma"


# ---------------------------------------------------------------------------------------
# The AArch64 host: what it runs (for lcmac.load's checks and the host target choice)
# ---------------------------------------------------------------------------------------

def native_host() -> bool:
    """Whether this machine is itself AArch64 (then no cross toolchain or qemu is needed)."""
    return platform.machine() in ("aarch64", "arm64")


def host_features() -> set[str]:
    """Feature flags of this AArch64 CPU (the ``Features`` line of /proc/cpuinfo: ``asimd``,
    ``sve``, ``sve2``, ...); empty where it cannot be read."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("features"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def host_sve_bits() -> int | None:
    """The SVE vector length of this process in bits (None without SVE or where it cannot
    be read).  prctl(PR_SVE_GET_VL) gives this thread's length, which a kernel default or
    an earlier prctl may have set below the hardware's; the sysctl is the fallback."""
    if "sve" not in host_features():
        return None
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        vl = libc.prctl(51, 0, 0, 0, 0)          # PR_SVE_GET_VL
        if vl > 0:
            return (vl & 0xFFFF) * 8              # PR_SVE_VL_LEN_MASK, bytes → bits
    except (OSError, AttributeError):
        pass
    try:
        with open("/proc/sys/abi/sve_default_vector_length") as f:
            return int(f.read()) * 8
    except (OSError, ValueError):
        return None


def _table_target(name: str):
    try:
        return TARGETS[name]
    except KeyError:
        raise TargetError(f"unknown target {name!r}; choose one of {', '.join(TARGETS)}") from None


def host_target():
    """The AArch64 target that suits this machine best: the fixed-length SVE target for its
    vector length when that is 256 or 512 bits (those use the packed GEMM/LCMA templates at
    the full width), otherwise ``aarch64-neon`` (128-bit SVE, e.g. Neoverse V2 / Grace, gains
    nothing over NEON with the same templates, and the VLA target's kernel is the simple
    unfused one)."""
    bits = host_sve_bits() or 0
    if bits >= 512:
        return TARGETS["aarch64-sve512"]
    if bits >= 256:
        return TARGETS["aarch64-sve256"]
    return TARGETS["aarch64-neon"]


def check_runnable(target) -> None:
    """On an AArch64 host: raise TargetError unless this CPU runs code for ``target`` (SVE
    present; at least the vector length a fixed-length SVE target was compiled for:
    sve512 code on 256-bit hardware would compute garbage, not fault)."""
    t = _table_target(target) if isinstance(target, str) else target
    if not is_sve(t):
        return
    if "sve" not in host_features():
        raise TargetError(f"this CPU has no SVE, so it cannot run code built for {t.name}; "
                          f"rebuild for aarch64-neon")
    bits = host_sve_bits()
    if t.vector_bits is None and bits is not None and bits & (bits - 1):
        # early SVE allowed e.g. 384 bits; the VLA kernel pads for powers of two only
        raise TargetError(f"this CPU's SVE vectors are {bits} bits, not a power of two, which "
                          f"{t.name} code assumes; rebuild for aarch64-neon or aarch64-sve256")
    if t.vector_bits and bits is not None and bits < t.vector_bits:
        alt = "aarch64-sve (any length)" + (", aarch64-sve256" if bits >= 256 else "")
        raise TargetError(f"{t.name} code needs SVE vectors of at least {t.vector_bits} bits and "
                          f"this CPU's are {bits}; rebuild for {alt}")
