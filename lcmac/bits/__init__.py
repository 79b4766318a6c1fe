"""Bit matrices: products over GF(2) and over the Boolean semiring, on the CPU and on an
NVIDIA GPU.

    C = gf2_matmul(A, B)                  # A·B modulo 2
    C = gf2_matmul(A, B, algo="winograd", levels=1)    # an LCMA over GF(2) above the kernel
    C = boolean_matmul(A, B)              # C_ij = OR_l (A_il AND B_lj)

Operands are 2-D numpy arrays of 0 and 1 (bool or an integer dtype; the result is a
``np.uint8`` array of 0 and 1) or ``PackedBits`` (the result is ``PackedBits``): the packed
layout is described in ``lcmac.bits.packing``.  The kernel is the Method of Four Russians:
compiled for this CPU where apache-tvm is installed (``lcmac.bits.native``), else in numpy
(``lcmac.bits.products``); the LCMA recursion over GF(2) is ``lcmac.bits.lcma``.  Torch CUDA tensors (or ``CudaBits``)
run on their GPU: ``lcmac.bits.cuda``, with ``kernel`` one of ``"auto"``, ``"mma"`` (the 1-bit
tensor-core MMA) or ``"bitwise"`` (the CUDA cores).

The compiled kernels are kept in the bit-kernel cache (``lcmac.bits.cache``).  A bit-matrix
artifact (``lcmac build --dtype gf2|bool``: ``lcmac.bits.artifact``) holds one target's kernel
and is served by ``lcmac.load`` (``lcmac.bits.loader``).
"""
from __future__ import annotations

from lcmac.core.errors import DTypeError, ShapeError
from lcmac.bits.counting import boolean_by_counts
from lcmac.bits.cuda import KERNELS as GPU_KERNELS
from lcmac.bits.cuda import CudaBits, boolean_product, gf2_product, is_cuda_tensor
from lcmac.bits.lcma import AUTO_SCHEME, XorReport, gf2_scheme, lcma_product
from lcmac.bits.native import base_product, choose_kernel
from lcmac.bits.packing import PackedBits, check_bit_form, pack, unpack
from lcmac.bits.products import KernelCount

__all__ = ["gf2_matmul", "boolean_matmul", "PackedBits", "pack", "unpack", "XorReport",
           "AUTO_SCHEME"]


def _operands(A, B) -> tuple[PackedBits, PackedBits, bool]:
    """Both operands packed, and whether the caller passed PackedBits."""
    if isinstance(A, PackedBits) and isinstance(B, PackedBits):
        packed = True
    elif isinstance(A, PackedBits) or isinstance(B, PackedBits):
        raise DTypeError("pass A and B both as numpy arrays or both as PackedBits, not one "
                         "of each")
    else:
        check_bit_form(A, "A")
        check_bit_form(B, "B")
        packed = False
    if A.shape[1] != B.shape[0]:
        raise ShapeError(f"inner dimensions differ: A is {A.shape[0]}×{A.shape[1]}, B is "
                         f"{B.shape[0]}×{B.shape[1]}")
    if packed:
        return A, B, True
    return pack(A, "A"), pack(B, "B"), False


def _result(C: PackedBits, packed: bool):
    return C if packed else unpack(C)


def _kernel_product(A: PackedBits, B: PackedBits, semiring: str, kernel,
                    count: KernelCount | None = None) -> PackedBits:
    native = choose_kernel(semiring, kernel, A.nrows * A.ncols * B.ncols)
    return PackedBits(base_product(A.data, B.data, native, semiring=semiring, count=count),
                      A.nrows, B.ncols)


def _on_gpu(A, B) -> bool:
    """Whether the operands are for the GPU path (``lcmac.bits.cuda``): a torch CUDA tensor or
    ``CudaBits`` on either side (the other is then checked to be one too)."""
    if any(isinstance(x, CudaBits) or is_cuda_tensor(x) for x in (A, B)):
        return True
    for x, what in ((A, "A"), (B, "B")):
        if type(x).__module__.startswith("torch"):
            raise DTypeError(f"{what} is a torch tensor on {x.device}: bit products run on "
                             f"numpy arrays or PackedBits (CPU) or on CUDA tensors (GPU); pass "
                             f"{what}.numpy() for the CPU")
    return False


def _gpu_kernel(kernel: str | None) -> str:
    kernel = "auto" if kernel is None else kernel
    if kernel not in GPU_KERNELS:
        raise ValueError(f"kernel={kernel!r} is not a GPU bit kernel: choose one of "
                         f"{', '.join(GPU_KERNELS)} for CUDA tensors")
    return kernel


def gf2_matmul(A, B, *, algo="auto", levels: int | None = None, return_report: bool = False,
               kernel: str | None = None):
    """C = A·B over GF(2) (AND for products, XOR for sums).

    ``algo``: ``"m4r"``, the Four Russians kernel alone; a scheme (a catalogue name such as
    ``"strassen"`` or ``"winograd"`` reduced modulo 2, ``"winograd-ab"`` for its alternative
    basis over GF(2), or a scheme object: see ``lcmac.bits.lcma.gf2_scheme``) run for
    ``levels`` levels above the kernel (None: as many as keep the base case at least the
    kernel's threshold on each side, ``lcmac.bits.lcma.NATIVE_BASE_BITS`` or ``BASE_BITS``);
    ``"auto"``: ``AUTO_SCHEME`` with those levels, which is the kernel alone below twice the
    threshold.  ``kernel``: ``"auto"`` (default, or ``$LCMAC_BITS_KERNEL``), ``"native"`` or
    ``"numpy"``: see ``lcmac.bits.native``.  With ``return_report`` the result comes with an
    ``XorReport`` of the XORs done.  CUDA tensors and ``CudaBits`` run on their GPU, where
    ``kernel`` is ``"auto"``, ``"mma"`` or ``"bitwise"`` (``lcmac.bits.cuda``)."""
    if _on_gpu(A, B):
        return gf2_product(A, B, algo=algo, levels=levels, kernel=_gpu_kernel(kernel),
                           return_report=return_report)
    A, B, packed = _operands(A, B)
    if isinstance(algo, str) and algo == "m4r":
        if levels not in (None, 0):
            raise ValueError(f"algo='m4r' runs no recursion; levels={levels!r} needs a scheme "
                             f"(algo='winograd', 'strassen', ...)")
        count = KernelCount()
        C = _kernel_product(A, B, "gf2", kernel, count)
        shape = (A.nrows, A.ncols, B.ncols)
        report = XorReport("m4r", 0, shape, shape, 1, kernel=count)
    else:
        scheme = gf2_scheme(AUTO_SCHEME if isinstance(algo, str) and algo == "auto" else algo)
        C, report = lcma_product(A, B, scheme, levels, kernel=kernel)
    out = _result(C, packed)
    return (out, report) if return_report else out


def boolean_matmul(A, B, *, algo: str = "m4r", kernel: str | None = None):
    """C = A·B over the Boolean semiring: C_ij = OR_l (A_il AND B_lj).  ``algo="m4r"``: the
    Four Russians kernel with OR tables (``kernel`` as for ``gf2_matmul``); a catalogue name
    (``"strassen"``) or an ``Algorithm``: the integer product by that LCMA, exact, compared
    with zero (``lcmac.bits.counting``; the Boolean semiring has no subtraction, so no LCMA
    runs over it directly).  CUDA tensors and ``CudaBits`` run on their GPU with the kernel
    alone (``algo="m4r"``; ``kernel``: ``"auto"``, ``"mma"`` or ``"bitwise"``)."""
    if _on_gpu(A, B):
        if algo != "m4r":
            raise ValueError(f"boolean_matmul on a GPU runs the kernel alone (algo='m4r'), "
                             f"not {algo!r}: the counting path runs on the CPU")
        return boolean_product(A, B, kernel=_gpu_kernel(kernel))
    A, B, packed = _operands(A, B)
    if isinstance(algo, str) and algo == "m4r":
        return _result(_kernel_product(A, B, "boolean", kernel), packed)
    C = boolean_by_counts(unpack(A), unpack(B), algo)
    return pack(C, "C") if packed else C
