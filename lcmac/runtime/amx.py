"""Intel AMX tile state for this process, which Linux hands out only on request.

Linux grants it through arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA); without that
grant the first AMX instruction an artifact runs is an illegal instruction."""
from __future__ import annotations

import ctypes
import os
import platform

from lcmac.core.errors import TargetError
from lcmac.spec.cpu.x86 import host_flags

_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA = 158, 0x1023, 18
_amx_granted = False


def request_amx() -> None:
    """Ask Linux for AMX tile state for this process (once; all its threads share it).
    Raises TargetError naming the reason when the CPU or the kernel does not allow it."""
    global _amx_granted
    if _amx_granted:
        return
    if platform.system() != "Linux":
        raise TargetError(f"AMX kernels run on Linux only (this is {platform.system()})")
    missing = [f for f in ("amx_tile", "amx_bf16") if f not in host_flags()]
    if missing:
        raise TargetError(f"this CPU lacks {', '.join(missing)}, which this artifact's AMX kernel "
                          "needs; rebuild without the amx config knob")
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    rc = libc.syscall(ctypes.c_long(_SYS_ARCH_PRCTL), ctypes.c_long(_ARCH_REQ_XCOMP_PERM),
                      ctypes.c_long(_XFEATURE_XTILEDATA))
    if rc != 0:
        err = ctypes.get_errno()
        raise TargetError(f"Linux refused this process AMX tile state (arch_prctl "
                          f"ARCH_REQ_XCOMP_PERM: {os.strerror(err)}); AMX needs Linux 5.16 or "
                          "newer with AMX enabled; rebuild without the amx config knob")
    _amx_granted = True
