"""The device at hand, identified: what a tuning record was measured on, and which records a
decision may read.

A ``DeviceIdentity`` is a name, the one tuning records have always carried as ``device``
(a GPU's name; a CPU's model name with its count of logical CPUs), and details that tell
apart devices of one name whose speed differs: for an NVIDIA GPU its SM count, SM and memory
clocks, memory bus width and size, compute capability and, where NVML answers, its enforced
power limit (an H100 runs long GEMMs at its power cap); for a CPU its core count, machine
and the instruction-set flags kernels use.  Reading takes no nvidia-smi: torch's device
properties and the NVML library the driver installs.

A record was measured on a device when the names agree and so do the details both have
(``measured_on``): a record of an older lcmac, with the name alone, counts for every device
of that name, and a detail one side could not read is not held against the other.

``LCMAC_DEVICE`` overrides what is at hand: ``any`` reads every device's records, with no
identity (the decisions of lcmac before device identities); any other value is a device
name to decide for, as if it were here.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import json
import os
import platform
import re
import sys
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

from lcmac.core.errors import TargetError
from lcmac.spec.cpu import aarch64, x86
from lcmac.spec.targets import get_target

__all__ = ["DeviceIdentity", "cpu_identity", "cuda_identity", "device_at_hand", "device_here",
           "measuring_device", "ENV", "ANY"]

#: the environment variable that overrides the device at hand
ENV = "LCMAC_DEVICE"
#: its value for "every device's records, no identity"
ANY = "any"

#: AArch64 feature flags (/proc/cpuinfo) that change what the kernels can use
_ARM_FLAGS = ("asimd", "asimddp", "asimdhp", "bf16", "i8mm", "sve", "sve2", "svebf16",
              "svei8mm", "sme", "fphp")
_UUID = re.compile(r"^(GPU-)?[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}$")


@dataclass(frozen=True)
class DeviceIdentity:
    """One device: ``name`` (as records carry it in ``device``), ``kind`` ("cpu" or "cuda")
    and ``details`` (JSON scalars; empty where only the name is known)."""
    name: str
    kind: str
    details: Mapping[str, object] = field(default_factory=dict, hash=False)

    def __post_init__(self):
        if not str(self.name).strip():
            raise ValueError("a device identity needs a name")
        object.__setattr__(self, "details", MappingProxyType(
            {str(k): v for k, v in dict(self.details).items() if v is not None}))

    @property
    def fingerprint(self) -> str:
        """16 hex digits of the name, kind and details: equal for one device, and the key
        of what is kept per device (its fitted cost-model profile)."""
        blob = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def to_dict(self) -> dict:
        """What a tuning record keeps as ``device_id``."""
        return {"name": self.name, "kind": self.kind, **self.details}

    @classmethod
    def from_dict(cls, d: Mapping) -> "DeviceIdentity":
        d = dict(d)
        return cls(str(d.pop("name", "")), str(d.pop("kind", "")), d)

    def measured_on(self, record: Mapping) -> bool:
        """Whether ``record`` (a tuning-log record) was measured on this device: the same
        name, and no detail that both sides know differs (module doc)."""
        if record.get("device") != self.name:
            return False
        theirs = record.get("device_id")
        if not isinstance(theirs, Mapping):
            return True                              # an older record: the name alone
        return all(theirs[k] == v for k, v in self.details.items() if k in theirs)

    def describe(self) -> str:
        """The name and details in words."""
        if not self.details:
            return self.name
        return f"{self.name} ({', '.join(f'{k} {v}' for k, v in sorted(self.details.items()))})"


# ---- CPUs -----------------------------------------------------------------------------------
def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


@functools.lru_cache(maxsize=1)
def cpu_identity() -> DeviceIdentity:
    """This machine's CPU: its model name and logical CPU count (the name records carry),
    the machine and the kernel-relevant instruction-set flags."""
    model = _cpu_model()
    cpus = os.cpu_count() or 1
    name = f"{model} ({cpus} cpus)" if model else (platform.processor() or platform.machine())
    machine = platform.machine()
    if machine in ("aarch64", "arm64"):
        flags = sorted(set(_ARM_FLAGS) & aarch64.host_features())
        extra = {"sve_bits": aarch64.host_sve_bits()}
    else:
        flags = sorted(set(x86.LLVM_FEATURE_FLAGS.values()) & x86.host_flags())
        extra = {}
    return DeviceIdentity(name, "cpu", {"cores": cpus, "machine": machine,
                                        "isa": " ".join(flags), **extra})


# ---- NVIDIA GPUs ----------------------------------------------------------------------------
def _gpu_possible() -> bool:
    """Whether a GPU can be present, without importing torch where nothing suggests one."""
    return "torch" in sys.modules or any(os.path.exists(p) for p in ("/dev/nvidiactl", "/dev/dxg"))


def _cuda_available() -> bool:
    if not _gpu_possible():
        return False
    try:
        import torch
        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001 - no torch, or a broken CUDA setup: no GPU here
        return False


def _nvml_power_limit_w(uuid: str) -> int | None:
    """The enforced power limit of the GPU with this UUID, in watts, from the driver's NVML
    library; None where it cannot be read."""
    if not _UUID.match(uuid):
        return None
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return None
    try:
        if nvml.nvmlInit_v2() != 0:
            return None
    except AttributeError:
        return None
    try:
        handle = ctypes.c_void_p()
        key = uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"
        if nvml.nvmlDeviceGetHandleByUUID(key.encode(), ctypes.byref(handle)) != 0:
            return None
        mw = ctypes.c_uint()
        if nvml.nvmlDeviceGetEnforcedPowerLimit(handle, ctypes.byref(mw)) != 0:
            return None
        return round(mw.value / 1000)
    except AttributeError:
        return None
    finally:
        nvml.nvmlShutdown()


def _mhz(khz) -> int | None:
    return round(khz / 1000) if isinstance(khz, (int, float)) and khz > 0 else None


@functools.lru_cache(maxsize=16)
def _cuda_identity(index: int) -> DeviceIdentity:
    import torch
    p = torch.cuda.get_device_properties(index)
    uuid = str(getattr(p, "uuid", "") or "")
    return DeviceIdentity(str(p.name), "cuda", {
        "sms": int(p.multi_processor_count), "capability": f"{p.major}.{p.minor}",
        "memory_gib": round(p.total_memory / 2 ** 30),
        "sm_clock_mhz": _mhz(getattr(p, "clock_rate", None)),
        "memory_clock_mhz": _mhz(getattr(p, "memory_clock_rate", None)),
        "memory_bus_bits": getattr(p, "memory_bus_width", None) or None,
        "power_limit_w": _nvml_power_limit_w(uuid)})


def cuda_identity(index: int | None = None) -> DeviceIdentity | None:
    """The GPU ``index`` (default: torch's current device), None without a GPU."""
    if not _cuda_available():
        return None
    import torch
    return _cuda_identity(torch.cuda.current_device() if index is None else int(index))


def _runs_here(target) -> bool:
    """Whether the GPU present runs code for this CUDA target: the same major compute
    capability and at least its minor (exactly it for an arch-specific ``sm_90a``)."""
    m = re.match(r"sm_(\d)(\d)(a?)$", target.arch or "")
    gpu = cuda_identity()
    if m is None or gpu is None:
        return False
    major, minor = (int(x) for x in str(gpu.details.get("capability", "0.0")).split("."))
    want_major, want_minor, specific = int(m.group(1)), int(m.group(2)), bool(m.group(3))
    return major == want_major and (minor == want_minor if specific else minor >= want_minor)


# ---- the device at hand ---------------------------------------------------------------------
def measuring_device(target) -> DeviceIdentity | None:
    """The device that measurements for ``target`` run on here: the current GPU for a CUDA
    target (None without one), this CPU otherwise."""
    if str(target).startswith("cuda"):
        return cuda_identity()
    return cpu_identity()


def device_here(target) -> DeviceIdentity | None:
    """The device here that runs ``target``'s code: the GPU present (a CUDA target of its
    compute capability) or this CPU (a target whose instructions it has); None where none
    does, or ``target`` is no target (a cost-model profile name)."""
    try:
        t = get_target(str(target))
    except TargetError:
        return None
    if t.family == "cuda":
        return cuda_identity() if _runs_here(t) else None
    return cpu_identity() if _cpu_runs(t.name) else None


@functools.lru_cache(maxsize=None)
def _cpu_runs(name: str) -> bool:
    """Whether this CPU runs code for the CPU target ``name`` (/proc/cpuinfo, read once)."""
    t = get_target(name)
    if t.family == "x86":
        return x86.host_supports(t.name)
    if not aarch64.native_host():
        return False
    try:
        aarch64.check_runnable(t)
    except TargetError:
        return False
    return True


def device_at_hand(target) -> DeviceIdentity | None:
    """The device a decision for ``target`` is made for: as ``LCMAC_DEVICE`` says when set
    (module doc), else ``device_here``; None for every device's records."""
    pinned = os.environ.get(ENV, "").strip()
    if not pinned:
        return device_here(target)
    if pinned.lower() == ANY:
        return None
    return DeviceIdentity(pinned, "cuda" if str(target).startswith("cuda") else "cpu")
