"""Bit-matrix products on an NVIDIA GPU (compute capability 8.0 or newer): operands are torch
CUDA tensors, packed on the GPU in the CPU's layout (``lcmac.bits.packing``; words held as
``torch.int64``, the same 64 bits), multiplied by lcmac's CUDA kernels
(``lcmac.schedules.cuda_bits``) with an LCMA over GF(2) above them (``lcmac.bits.lcma``'s
recursion, its XORs done by torch on the GPU).

    C = gf2_matmul(A, B)          # A, B: CUDA tensors of 0/1 (bool or an integer dtype)
    P = pack(A); Q = pack(B)      # CudaBits: the packed words and the shape
    R = gf2_matmul(P, Q)          # CudaBits in, CudaBits out

Kernels (``kernel=``): ``"mma"``, the 1-bit tensor-core MMA (AND, then the count); ``"bitwise"``,
the CUDA cores (one LOP3, ``acc ^= a & b``, per 32 bit products); ``"auto"``: ``AUTO_KERNEL``.

The library is compiled once per machine with nvcc (``lcmac.targets.cuda``) for the GPU's
architecture and kept in the bit-kernel cache (``lcmac.bits.cache``: a lock per key, built in
a scratch directory and renamed into place, checked by sha256 on load), so processes that ask
for it at once compile it once.
"""
from __future__ import annotations

import ctypes
import hashlib
import threading
from dataclasses import dataclass
from pathlib import Path

from lcmac.artifact.store import Spec
from lcmac.core import version as _version
from lcmac.core.errors import DTypeError, LcmacError, ShapeError, TargetError
from lcmac.schedules import cuda_bits
from lcmac.targets import cuda as cuda_target
from lcmac.bits import cache as bit_cache
from lcmac.bits.lcma import (
    AUTO_SCHEME, WORD_BITS, XorReport, check_levels, gf2_scheme, padded, plan, recurse)
from lcmac.bits.lcma import auto_levels as lcma_auto_levels

__all__ = ["CudaBits", "pack", "unpack", "is_cuda_tensor", "gf2_product", "boolean_product",
           "base_product", "transpose", "KERNELS", "AUTO_KERNEL", "BASE_BITS", "library",
           "open_library", "library_path"]

KERNELS = ("auto",) + cuda_bits.KERNELS
#: the kernel "auto" runs: the 1-bit tensor-core MMA, several times the CUDA-core kernel's
#: rate (docs/bits.md)
AUTO_KERNEL = "mma"
#: ``algo="auto"`` recurses only on products whose every side is at least MIN_BITS, and then
#: while every side of the base products stays at least BASE_BITS: below that the XORs (by
#: torch) cost more than the 1/8 of the kernel's time a level saves (docs/bits.md)
MIN_BITS = 32768
BASE_BITS = 8192
#: peak GPU memory of a recursion ≈ this many times its largest base-case stack (the stacks of
#: A, B, Bᵀ and C, and the one being formed); "auto" takes fewer levels where that exceeds the
#: free memory
STACK_FACTOR = 5
#: products per kernel launch (the grid's z extent)
MAX_BATCH = 65535
KEY_FORMAT = "lcmac-bits-cuda/1"

_lock = threading.Lock()
_libraries: dict[str, ctypes.CDLL] = {}


class CudaBitsError(LcmacError, RuntimeError):
    """A bit kernel returned an error (the message is the kernel's)."""


@dataclass(frozen=True, eq=False)
class CudaBits:
    """An ``nrows`` × ``ncols`` bit matrix on a GPU: ``words`` is nrows × ⌈ncols/64⌉
    ``torch.int64``, contiguous, in the layout of ``PackedBits``.  Padding bits are not
    checked (that would read the GPU on every construction): the products ignore them in
    their operands and write them zero in their results."""

    words: object
    nrows: int
    ncols: int

    def __post_init__(self):
        w = self.words
        if not is_cuda_tensor(w):
            raise DTypeError(f"CudaBits.words must be a torch CUDA tensor, got {type(w).__name__}")
        import torch
        if w.dtype != torch.int64 or w.dim() != 2 or not w.is_contiguous():
            raise DTypeError(f"CudaBits.words must be a contiguous 2-D torch.int64 tensor, got "
                             f"{w.dtype}, {w.dim()}-D")
        if tuple(w.shape) != (self.nrows, -(-self.ncols // WORD_BITS)):
            raise ShapeError(f"CudaBits.words has shape {tuple(w.shape)}; {self.nrows} rows of "
                             f"{self.ncols} bits need {self.nrows}×{-(-self.ncols // WORD_BITS)}")

    @property
    def shape(self) -> tuple[int, int]:
        return (self.nrows, self.ncols)

    @property
    def nwords(self) -> int:
        return self.words.shape[1]

    def to_tensor(self):
        return unpack(self)

    def __repr__(self):
        return f"CudaBits({self.nrows}×{self.ncols} on {self.words.device})"


def is_cuda_tensor(x) -> bool:
    return type(x).__module__.startswith("torch") and getattr(x, "is_cuda", False)


def _check_tensor(t, what: str):
    import torch
    if t.dim() != 2:
        raise ShapeError(f"{what} must be 2-D (a matrix), got shape {tuple(t.shape)}")
    if t.dtype.is_floating_point or t.dtype.is_complex:
        raise DTypeError(f"{what} has dtype {t.dtype}; bit matrices take bool or an integer "
                         f"dtype holding 0 and 1")
    if t.dtype != torch.bool and t.numel() and bool(((t != 0) & (t != 1)).any()):
        i, j = (((t != 0) & (t != 1)).nonzero()[0]).tolist()
        raise ValueError(f"{what}[{i}, {j}] = {t[i, j].item()} is not 0 or 1; bit matrices "
                         f"hold only 0 and 1")


def pack(t, what: str = "array") -> CudaBits:
    """A CUDA tensor of 0 and 1 packed into ``CudaBits`` (8 bits a byte, little-endian, the
    bytes read as 64-bit words)."""
    import torch
    _check_tensor(t, what)
    rows, cols = t.shape
    nw = -(-cols // WORD_BITS)
    bits = torch.zeros((rows, nw * WORD_BITS), dtype=torch.uint8, device=t.device)
    bits[:, :cols] = t
    weights = (1 << torch.arange(8, device=t.device, dtype=torch.int32)).to(torch.uint8)
    packed = (bits.view(rows, nw * 8, 8) * weights).sum(dim=2, dtype=torch.uint8)
    return CudaBits(packed.view(torch.int64).reshape(rows, nw).contiguous(), rows, cols)


def unpack(p: CudaBits):
    """The ``torch.uint8`` tensor of 0 and 1 held by ``p``."""
    import torch
    rows = p.nrows
    shifts = torch.arange(8, device=p.words.device, dtype=torch.uint8)
    bytes_ = p.words.view(torch.uint8).reshape(rows, -1, 1)
    return ((bytes_ >> shifts) & 1).reshape(rows, -1)[:, :p.ncols].contiguous()


# -- the compiled library --------------------------------------------------------------------
def _arch(device) -> str:
    import torch
    major, minor = torch.cuda.get_device_capability(device)
    if major < 8:
        raise TargetError(f"the GPU bit kernels need compute capability 8.0 or newer "
                          f"(cp.async, the 1-bit MMA); {torch.cuda.get_device_name(device)} "
                          f"is {major}.{minor}")
    return f"sm_{major}{minor}" + ("a" if major == 9 else "")


def _spec(arch: str) -> Spec:
    fields = {"format": KEY_FORMAT, "arch": arch, "template_version": cuda_bits.TEMPLATE_VERSION,
              "source_sha256": hashlib.sha256(cuda_bits.source().encode()).hexdigest(),
              "lcmac_version": _version.__version__, "nvcc": cuda_target.nvcc_version()}
    return Spec(fields, prefix=bit_cache.CUDA_PREFIX, what=f"the GPU bit kernels for {arch}")


def _compile(jobs: list) -> list[dict]:
    """The library of each job [(spec, scratch directory)], compiled by nvcc into its
    directory's ``kernel.so``."""
    for spec, tmp in jobs:
        src = tmp / "bits.cu"
        src.write_text(cuda_bits.source())
        cuda_target.compile_so([str(src)], str(tmp / bit_cache.LIBRARY), spec.fields["arch"], [])
        src.unlink()
    return [{} for _ in jobs]


def library_path(arch: str) -> Path:
    """The compiled library for ``arch``: from the cache, else compiled now."""
    [lib] = bit_cache.obtain([_spec(arch)], _compile)
    return lib


def open_library(path) -> ctypes.CDLL:
    """The compiled library at ``path`` (``source()``'s entry points), opened with ctypes."""
    lib = ctypes.CDLL(str(path))
    lib.lcmac_bits_mm.restype = ctypes.c_int
    lib.lcmac_bits_mm.argtypes = ([ctypes.c_int] * 2 + [ctypes.c_void_p] * 3
                                  + [ctypes.c_int] * 4 + [ctypes.c_longlong] * 3
                                  + [ctypes.c_int, ctypes.c_void_p])
    lib.lcmac_bits_transpose.restype = ctypes.c_int
    lib.lcmac_bits_transpose.argtypes = ([ctypes.c_void_p] * 2 + [ctypes.c_int] * 5
                                         + [ctypes.c_longlong] * 2 + [ctypes.c_void_p])
    lib.lcmac_bits_last_error.restype = ctypes.c_char_p
    return lib


def library(device) -> ctypes.CDLL:
    """The bit kernels' library for ``device``'s architecture (compiled into the cache if
    needed), opened once per process."""
    arch = _arch(device)
    with _lock:
        if arch not in _libraries:
            _libraries[arch] = open_library(library_path(arch))
        return _libraries[arch]


def _checked(lib, status: int, what: str) -> None:
    if status != 0:
        raise CudaBitsError(f"{what} failed ({status}): {lib.lcmac_bits_last_error().decode()}")


def _stream(t) -> int:
    import torch
    return torch.cuda.current_stream(t.device).cuda_stream


# -- kernels on stacks of packed words -----------------------------------------------------------
def transpose(b, K: int, kw: int, lib=None):
    """Bᵀ of a stack of packed matrices: b is P × rows × NW words (K ≤ rows bits used), the
    result P × 64·NW × kw words (kw ≥ ⌈K/64⌉; bits past K zero)."""
    import torch
    P, _, NW = b.shape
    N = NW * WORD_BITS
    bt = torch.empty((P, N, kw), dtype=torch.int64, device=b.device)
    lib = lib or library(b.device)
    for p0 in range(0, P, MAX_BATCH):
        n = min(MAX_BATCH, P - p0)
        _checked(lib, lib.lcmac_bits_transpose(b[p0].data_ptr(), bt[p0].data_ptr(), n, K, N, NW,
                                               kw, b.stride(0), bt.stride(0), _stream(b)),
                 "the bit transpose")
    return bt


def base_product(a, b, *, semiring: str = "gf2", kernel: str = "auto", K: int | None = None,
                 lib=None):
    """C = A·B over ``semiring`` on stacks of packed words on a GPU: a P × M × KW, b P × K' ×
    NW (its first ``K`` rows used, default 64·KW), C P × M × NW (int64).  ``lib``: an opened
    library (``open_library``; default: ``library``'s)."""
    import torch
    kernel = AUTO_KERNEL if kernel == "auto" else kernel
    if kernel not in cuda_bits.KERNELS:
        raise ValueError(f"kernel={kernel!r}: choose one of {', '.join(KERNELS)}")
    a, b = a.contiguous(), b.contiguous()
    P, M, KW = a.shape
    NW = b.shape[2]
    K = min(b.shape[1], KW * WORD_BITS) if K is None else K
    kw = KW + (KW & 1)                       # whole 128-bit loads
    if kw != KW:
        a = torch.nn.functional.pad(a, (0, 1))
    lib = lib or library(a.device)
    bt = transpose(b, K, kw, lib)
    c = torch.empty((P, M, NW), dtype=torch.int64, device=a.device)
    for p0 in range(0, P, MAX_BATCH):
        n = min(MAX_BATCH, P - p0)
        _checked(lib, lib.lcmac_bits_mm(cuda_bits.KERNELS.index(kernel),
                                        cuda_bits.SEMIRINGS.index(semiring), a[p0].data_ptr(),
                                        bt[p0].data_ptr(), c[p0].data_ptr(), n, M, NW * WORD_BITS,
                                        kw, a.stride(0), bt.stride(0), c.stride(0), NW,
                                        _stream(a)),
                 f"the {kernel} bit product")
    return c


def _result(words, nrows: int, ncols: int) -> CudaBits:
    """C as CudaBits with its padding bits zero: a B whose padding bits were not zero gives
    bits past column N (the columns before N never depend on them)."""
    used = ncols % WORD_BITS
    if used and nrows:
        words[:, -1] &= (1 << used) - 1
    return CudaBits(words, nrows, ncols)


def _operands(A, B) -> tuple[CudaBits, CudaBits, bool]:
    packed = isinstance(A, CudaBits)
    if packed != isinstance(B, CudaBits):
        raise DTypeError("pass A and B both as CUDA tensors or both as CudaBits, not one of each")
    dev_a = A.words.device if packed else A.device
    dev_b = B.words.device if packed else B.device
    if dev_a != dev_b:
        raise TargetError(f"A is on {dev_a} and B on {dev_b}: both must be on one GPU")
    if not packed:
        A, B = pack(A, "A"), pack(B, "B")
    if A.ncols != B.nrows:
        raise ShapeError(f"inner dimensions differ: A is {A.nrows}×{A.ncols}, B is "
                         f"{B.nrows}×{B.ncols}")
    return A, B, packed


def auto_levels(scheme, shape, free_bytes: int | None = None) -> int:
    """The levels ``algo="auto"`` (or ``levels=None``) runs on the GPU: see ``MIN_BITS``;
    with ``free_bytes``, no more than fit in that much memory (``STACK_FACTOR``)."""
    if min(shape) < MIN_BITS:
        return 0
    levels = lcma_auto_levels(scheme, shape, BASE_BITS)
    M, K, N = shape
    m, k, n = scheme.grid

    def peak(L):
        R = scheme.R ** L
        return STACK_FACTOR * R * max(M * K // (m * k) ** L, K * N // (k * n) ** L,
                                      M * N // (m * n) ** L) / 8
    while free_bytes is not None and levels > 0 and peak(levels) > free_bytes:
        levels -= 1
    return levels


def gf2_product(A, B, *, algo="auto", levels: int | None = None, kernel: str = "auto",
                return_report: bool = False, lib=None):
    """C = A·B over GF(2) on a GPU (see the module's docstring); ``algo`` and ``levels`` as
    for ``lcmac.bits.gf2_matmul`` (``"m4r"`` there is the kernel alone here too); ``lib`` as
    for ``base_product``."""
    A, B, packed = _operands(A, B)
    M, K, N = A.nrows, A.ncols, B.ncols
    if isinstance(algo, str) and algo == "m4r":
        if levels not in (None, 0):
            raise ValueError(f"algo='m4r' runs no recursion; levels={levels!r} needs a scheme")
        algo, levels = AUTO_SCHEME, 0
    scheme = gf2_scheme(AUTO_SCHEME if isinstance(algo, str) and algo == "auto" else algo)
    if levels is None:
        import torch
        levels = auto_levels(scheme, (M, K, N), torch.cuda.mem_get_info(A.words.device)[0])
    levels = check_levels(levels)
    Mp, KWp, NWp, base = plan(scheme, M, A.nwords, B.nwords, levels)
    report = XorReport(scheme.name, levels, (Mp, KWp * WORD_BITS, NWp * WORD_BITS), base,
                       scheme.R ** levels)
    kernel = AUTO_KERNEL if kernel == "auto" else kernel
    report.kernel.kernel = f"cuda-{kernel}"
    a = padded(A.words, Mp, KWp)
    b = padded(B.words, KWp * WORD_BITS if levels else K, NWp)
    c = recurse(a, b, scheme, levels, report,
                lambda x, y: base_product(x, y, semiring="gf2", kernel=kernel,
                                          K=K if levels == 0 else None, lib=lib))
    C = _result(c[:M, :B.nwords].contiguous(), M, N)
    out = C if packed else unpack(C)
    return (out, report) if return_report else out


def boolean_product(A, B, *, kernel: str = "auto", lib=None):
    """C = A·B over the Boolean semiring on a GPU: the kernel alone (no LCMA runs over it)."""
    A, B, packed = _operands(A, B)
    c = base_product(A.words[None], B.words[None], semiring="boolean", kernel=kernel, K=A.ncols,
                     lib=lib)
    C = _result(c[0], A.nrows, B.ncols)
    return C if packed else unpack(C)
