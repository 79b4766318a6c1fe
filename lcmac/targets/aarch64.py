"""The AArch64 toolchain: the cross compiler, objdump, qemu-user and its sysroot.

Cross-compilation happens on any host: apache-tvm's LLVM emits AArch64 object code and
``aarch64-linux-gnu-gcc`` links it into a shared library.  Running an artifact on a non-ARM
host goes through qemu-user (``lcmac.runtime.qemu_runner``).  What the targets are and what
this CPU runs is ``lcmac.spec.cpu.aarch64``.

This module imports no compiler (the apache-tvm plug-ins are in ``tvm_plugins``).
"""
from __future__ import annotations

import os
import shutil

from lcmac.core.errors import ArtifactError, ToolchainError
from lcmac.spec.cpu.aarch64 import native_host

#: Debian packages that provide the tools (the error messages name them)
CROSS_GCC_PACKAGE = "gcc-aarch64-linux-gnu"
CROSS_LIBC_PACKAGE = "libc6-dev-arm64-cross"
QEMU_PACKAGE = "qemu-user"

CROSS_GCC = "aarch64-linux-gnu-gcc"
CROSS_OBJDUMP = "aarch64-linux-gnu-objdump"
QEMU = "qemu-aarch64"
#: sysroot of the Debian cross libc (qemu's -L)
SYSROOT = "/usr/aarch64-linux-gnu"


def cross_gcc() -> str:
    """Path of the AArch64 (cross) compiler, or ToolchainError naming the Debian package.
    On an AArch64 host the native ``cc``/``gcc`` links AArch64 code too (RHEL-like systems
    such as Amazon Linux have no ``aarch64-linux-gnu-`` prefixed driver)."""
    cc = os.environ.get("LCMAC_AARCH64_CC") or shutil.which(CROSS_GCC)
    if not cc and native_host():
        cc = shutil.which("cc") or shutil.which("gcc")
        if not cc:
            raise ToolchainError("building for AArch64 on this AArch64 host needs a C compiler "
                                 "(cc/gcc) to link the library; install gcc")
    if not cc:
        raise ToolchainError(
            f"building for AArch64 needs the cross compiler {CROSS_GCC}, which is not on PATH; "
            f"install it with: apt-get install {CROSS_GCC_PACKAGE} {CROSS_LIBC_PACKAGE} "
            f"(or set LCMAC_AARCH64_CC to an AArch64 gcc/clang driver)")
    return cc


def objdump() -> str:
    tool = shutil.which(CROSS_OBJDUMP)
    if not tool:
        raise ToolchainError(f"{CROSS_OBJDUMP} is not on PATH; install it with: "
                             f"apt-get install binutils-aarch64-linux-gnu (comes with "
                             f"{CROSS_GCC_PACKAGE})")
    return tool


def qemu() -> str:
    """Path of qemu-aarch64, or ToolchainError naming the Debian package."""
    q = os.environ.get("LCMAC_QEMU_AARCH64") or shutil.which(QEMU)
    if not q:
        raise ToolchainError(
            f"running an AArch64 artifact on this machine needs the emulator {QEMU}, which is "
            f"not on PATH; install it with: apt-get install {QEMU_PACKAGE}")
    return q


def sysroot() -> str:
    """The AArch64 libc root qemu needs (``-L``); the native one on an AArch64 host."""
    if native_host() and "LCMAC_AARCH64_SYSROOT" not in os.environ:
        return "/"
    root = os.environ.get("LCMAC_AARCH64_SYSROOT", SYSROOT)
    if not os.path.isdir(os.path.join(root, "lib")):
        raise ToolchainError(
            f"the AArch64 C library is not installed under {root}; install it with: "
            f"apt-get install {CROSS_LIBC_PACKAGE}")
    return root


def check_library(path: str) -> None:
    """Raise ArtifactError unless ``path`` is an AArch64 ELF shared object."""
    with open(path, "rb") as f:
        head = f.read(20)
    if head[:4] != b"\x7fELF" or int.from_bytes(head[18:20], "little") != 183:  # EM_AARCH64
        raise ArtifactError(f"{path} is not an AArch64 shared library")


def disassemble(path: str) -> str:
    import subprocess
    return subprocess.run([objdump(), "-d", "--no-show-raw-insn", path], capture_output=True,
                          text=True, check=True).stdout


# Building an artifact: lcmac.artifact.build → python -m lcmac.targets.tvm_worker, which
# calls the AArch64 plug-ins in lcmac.targets.tvm_plugins.

def check_toolchain() -> None:
    """Raise ToolchainError, naming the Debian packages, unless the cross compiler and its
    sysroot are here (a build checks this before it starts its compiler worker)."""
    cross_gcc()
    sysroot()
