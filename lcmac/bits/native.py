"""The base case of the bit-matrix products: the native kernel where it can be had, else the
numpy kernel.

The native kernel is the Method of Four Russians with eight 256-entry tables per 64 rows of B,
compiled for this CPU through apache-tvm and LLVM (AVX-512 where the CPU has it:
``lcmac.schedules.cpu_bits`` has the algorithm, ``lcmac.bits.native_build`` how it is
compiled, kept and loaded).  It takes packed operands of any shape at run time and runs on
one thread.  Its results are exact, as the numpy kernel's, so which one runs changes the
time only.

Which one runs (``kernel=``, else ``$LCMAC_BITS_KERNEL``, else ``"auto"``):

    "numpy"   the numpy kernel (``lcmac.bits.products.four_russians``)
    "native"  the native kernel, compiled now if needed; an error if it cannot be
    "auto"    the native kernel if it is compiled already (in this process or on disk), or
              if the product has at least ``COMPILE_BIT_OPS`` bit operations and it can be
              compiled here (apache-tvm, a C compiler, x86-64: a compile takes a few seconds,
              once per machine); else numpy.  A failed compile warns once and falls back to
              numpy.
"""
from __future__ import annotations

import os
import threading
import warnings

import numpy as np

from lcmac.core.errors import LcmacError, ShapeError, ToolchainError
from lcmac.bits import native_build
from lcmac.bits.products import KernelCount, four_russians

__all__ = ["KERNELS", "COMPILE_BIT_OPS", "NativeKernel", "kernel_choice", "native_kernel",
           "prepare", "choose_kernel", "base_product", "aligned_words", "word_operations"]

KERNELS = ("auto", "native", "numpy")
#: "auto" compiles the native kernel for a product of at least 2048³ bit operations (M·K·N;
#: where the numpy kernel's time outweighs a compile), and uses it for any size once it is
#: compiled
COMPILE_BIT_OPS = 2048 ** 3
#: rows of A per block (the width of the transposed block AT): a table's fill (2048 rows)
#: pays over the block's rows, while the block's panel of C (8192 × 64 bytes) and the tables
#: (128 kB) stay in a 1 MB L2 (fewer rows and more both ran slower: docs/bits.md)
BLOCK_ROWS = 8192
#: the template's knobs: 8-word (512-bit) panels, the fastest of 8, 16 and 32 with these blocks
CONFIG = {"panel_words": 8}
TABLE_WORDS = 8 * 256 * CONFIG["panel_words"]

_lock = threading.Lock()
_loaded: dict[str, "NativeKernel"] = {}
_failed: dict[str, str] = {}       # semiring → why it could not be compiled (not retried)
_absent: set[str] = set()          # not on disk when last looked (looked again to compile)


def kernel_choice(kernel: str | None = None) -> str:
    """``kernel`` if given, else ``$LCMAC_BITS_KERNEL``, else ``"auto"``; checked."""
    choice = kernel if kernel is not None else (os.environ.get("LCMAC_BITS_KERNEL") or "auto")
    if choice not in KERNELS:
        raise ValueError(f"kernel={choice!r}: choose one of {', '.join(KERNELS)} "
                         f"(or set LCMAC_BITS_KERNEL)")
    return choice


def aligned_words(shape) -> np.ndarray:
    """An uninitialised C-contiguous ``uint64`` array starting on a 64-byte cache line (the
    kernel's table rows and C's panels are then whole cache lines)."""
    n = int(np.prod(shape, dtype=np.int64))
    raw = np.empty(n + 8, np.uint64)
    start = (-raw.ctypes.data % 64) // 8
    return raw[start:start + n].reshape(shape)


class NativeKernel:
    """The compiled kernel of one semiring: ``k(a, b, out=None)`` on packed stacks, as
    ``four_russians`` takes them (a: [P×]M×KW, b: [P×]K×NW words with K ≤ 64·KW and A's bits
    past column K zero)."""

    def __init__(self, semiring: str, function, module):
        self.semiring = semiring
        self._function = function
        self._module = module               # keeps the library mapped

    def __repr__(self):
        return f"<lcmac.bits native {self.semiring} kernel, {CONFIG}>"

    def __call__(self, a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        flat = a.ndim == 2
        a3, b3 = (a[None], b[None]) if flat else (a, b)
        if a3.ndim != 3 or b3.ndim != 3 or a3.shape[0] != b3.shape[0]:
            raise ShapeError(f"operands must be matching stacks of matrices, got {a.shape} and "
                             f"{b.shape}")
        if a3.dtype != np.uint64 or b3.dtype != np.uint64:
            raise ShapeError("packed operands must be uint64 words")
        P, M, KW = a3.shape
        _, K, NW = b3.shape
        if K > 64 * KW:
            raise ShapeError(f"B has {K} rows but A's rows hold only {64 * KW} bits")
        if max(M * KW, K * NW, M * NW) >= 2 ** 31:
            raise ShapeError(f"{M}×{64 * KW}×{64 * NW} bits: the native kernel's indices are "
                             f"32-bit (fewer than 2^31 words an operand); pass kernel='numpy'")
        c = aligned_words((P, M, NW)) if out is None else (out[None] if flat else out)
        if c.shape != (P, M, NW) or c.dtype != np.uint64 or not c.flags.c_contiguous:
            raise ShapeError(f"out must be C-contiguous uint64 with shape {(P, M, NW)}, got "
                             f"{c.shape}")
        if K == 0:
            c[...] = 0                       # no rows of B: the kernel would read none
        elif M and NW:
            a3, b3 = np.ascontiguousarray(a3), np.ascontiguousarray(b3)
            at = np.empty((KW, min(BLOCK_ROWS, M)), np.uint64)
            tables = aligned_words((TABLE_WORDS,))
            for p in range(P):
                self._function(a3[p], b3[p], c[p], at, tables)
        return c[0] if flat else c


def word_operations(P: int, M: int, KW: int, NW: int) -> KernelCount:
    """The native kernel's word operations (XOR or OR of 64-bit words): per block of rows and
    word of A, 8 tables of 255 entries over NW words; per row and word of A, 8 table rows
    into C (7 for the first word, which is stored)."""
    blocks = -(-M // BLOCK_ROWS)
    return KernelCount(tables=P * blocks * KW * 8 * 255 * NW,
                       accumulate=P * M * NW * max(0, 8 * KW - 1))


def native_kernel(semiring: str, *, build: bool = True) -> NativeKernel | None:
    """This process's native kernel for ``semiring``: loaded once; from disk, else compiled
    when ``build``.  None when it is not compiled and ``build`` is False.  Raises
    ``ToolchainError`` (or another ``LcmacError``) when it cannot be had."""
    with _lock:
        k = _loaded.get(semiring)
        if k is not None:
            return k
        if semiring in _failed:
            raise ToolchainError(_failed[semiring])
        if not build and semiring in _absent:
            return None
        try:
            got = native_build.load_kernel(semiring, CONFIG, build=build)
        except LcmacError as e:
            _failed[semiring] = str(e)
            raise
        if got is None:
            _absent.add(semiring)
            return None
        _loaded[semiring] = k = NativeKernel(semiring, *got)
        return k


def prepare(semirings=("gf2", "boolean")) -> dict[str, NativeKernel]:
    """Load the native kernels of ``semirings``, compiling the missing ones first with one
    worker (one apache-tvm import for all).  Raises ``ToolchainError`` when they cannot be
    had."""
    why = native_build.missing_toolchain()
    if why:
        raise ToolchainError(why)
    todo = [s for s in semirings if s not in _loaded]
    if todo:
        native_build.library_paths(todo, CONFIG)
    return {s: native_kernel(s) for s in semirings}


def choose_kernel(semiring: str, kernel: str | None = None, bit_ops: int = 0) -> NativeKernel | None:
    """The native kernel if ``kernel`` (see the module's docstring) gives it for a product of
    ``bit_ops`` bit operations (M·K·N), else None (the numpy kernel).  A ``NativeKernel``
    given as ``kernel`` (one an artifact loaded: ``lcmac.bits.loader``) is used as it is."""
    if isinstance(kernel, NativeKernel):
        if kernel.semiring != semiring:
            raise ValueError(f"the kernel given is the {kernel.semiring} one, not {semiring}'s")
        return kernel
    choice = kernel_choice(kernel)
    if choice == "numpy":
        return None
    if choice == "native":
        return native_kernel(semiring)
    if semiring in _failed or native_build.missing_loader():
        return None
    build = bit_ops >= COMPILE_BIT_OPS and native_build.missing_toolchain() is None
    try:
        return native_kernel(semiring, build=build)
    except LcmacError as e:
        warnings.warn(f"lcmac.bits: no native kernel ({e}); using the numpy kernel",
                      RuntimeWarning, stacklevel=3)
        return None


def base_product(a: np.ndarray, b: np.ndarray, native: NativeKernel | None, *,
                 semiring: str = "gf2", count: KernelCount | None = None) -> np.ndarray:
    """C = A·B over ``semiring`` on packed stacks (as ``four_russians`` takes them), by the
    ``native`` kernel (``choose_kernel``'s) or, when it is None, the numpy one.  ``count``
    accumulates the word operations of the kernel that ran."""
    if native is None:
        return four_russians(a, b, semiring=semiring, count=count)
    if native.semiring != semiring:
        raise ValueError(f"the native kernel given is the {native.semiring} one, not {semiring}'s")
    c = native(a, b)
    if count is not None:
        done = word_operations(a.shape[0] if a.ndim == 3 else 1, a.shape[-2], a.shape[-1],
                               b.shape[-1])
        count.tables += done.tables
        count.accumulate += done.accumulate
        count.kernel = "native"
    return c
