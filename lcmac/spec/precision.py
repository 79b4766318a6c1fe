"""float32 precision classes: what a float32 product may multiply in.

The classes are torch's (``torch.set_float32_matmul_precision``), taken as torch defines them:

- ``"highest"``: float32 products throughout, no TF32 anywhere.  The vendor GEMM is true
  SGEMM; lcmac's CUDA kernels multiply through the fp16x2 split (hi + 2⁻¹¹·lo fp16 halves,
  float32-level error: ``CudaConfig.operands``), never TF32.
- ``"high"``: TF32 products (the CUDA backend's native float32) or the fp16x2 split.
- ``"medium"``: bfloat16-class products too: lcmac's scaled fp16 operands, whose 11 bits
  cover a narrower range than float32's (29 binades below an operand's largest element).

Which class a product runs under: torch's own setting for torch tensors (``torch_precision``;
lcmac never changes it), ``precision=`` for numpy arrays, default ``DEFAULT_PRECISION``
(numpy's float32 means float32).  The classes concern float32 only, and on CPUs lcmac's
float32 kernels multiply in float32 under every class (no CPU kernel narrows a float32
operand; the bfloat16 paths, AMX and ``bf16_dot``, take bfloat16 inputs only).
"""
from __future__ import annotations

from contextlib import contextmanager

from lcmac.core.errors import LcmacError
from lcmac.spec.targets import schedule_family

PRECISIONS = ("highest", "high", "medium")
#: the class of a product whose operands carry none (numpy arrays, planning on its own)
DEFAULT_PRECISION = "highest"
#: the CUDA float32 operand modes each class lets lcmac's kernels run, the one the decision
#: prices first ("native" float32 is TF32 on the tensor cores)
CUDA_FLOAT32_OPERANDS = {
    "highest": ("fp16x2",),
    "high": ("native", "fp16x2"),
    "medium": ("native", "fp16x2", "fp16"),
}
#: torch's per-backend names (``torch.backends.cuda.matmul.fp32_precision``) as classes
_FROM_BACKEND = {"ieee": "highest", "tf32": "high", "bf16": "medium"}


def check_precision(precision) -> str:
    """``precision`` itself; ValueError unless it is one of ``PRECISIONS``."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(map(repr, PRECISIONS))} (torch's "
                         f"float32 matmul precision classes), got {precision!r}")
    return precision


def allows_tf32(precision: str) -> bool:
    """Whether float32 products may run as TF32 under ``precision``."""
    return check_precision(precision) != "highest"


def operand_modes(target, dtype: str, precision: str | None) -> tuple:
    """The CUDA operand modes lcmac's kernels may run ``dtype`` products in on ``target``
    under ``precision`` (the first is the one the decision prices).  Every dtype but CUDA
    float32, and CUDA float32 with no class (None), keeps its native operands."""
    if precision is None or dtype != "float32" or schedule_family(target) != "cuda":
        return ("native",)
    return CUDA_FLOAT32_OPERANDS[check_precision(precision)]


def check_operands_allowed(operands: str, target, dtype: str, precision: str | None) -> str:
    """``operands`` itself where ``precision`` lets ``dtype`` run in it on ``target``; an
    LcmacError naming the classes that do otherwise."""
    allowed = operand_modes(target, dtype, precision)
    if operands in allowed:
        return operands
    if dtype != "float32" or schedule_family(target) != "cuda":
        return operands        # the classes concern CUDA float32 only
    fits = [p for p in PRECISIONS if operands in CUDA_FLOAT32_OPERANDS[p]]
    what = "runs float32 products as TF32" if operands == "native" else \
        f"multiplies float32 through {operands} operands"
    raise LcmacError(f"operands={operands!r} {what}, which float32 precision {precision!r} does "
                     f"not allow (it allows {', '.join(allowed)}); ask for precision "
                     f"{' or '.join(map(repr, fits))} to run it")


def torch_precision(device_type: str = "cuda") -> str:
    """torch's float32 matmul precision class for ``device_type`` ("cuda" or "cpu"): what
    ``torch.matmul`` itself multiplies float32 in there."""
    import torch        # only asked about torch tensors: torch is loaded already
    try:
        return torch.get_float32_matmul_precision()
    except RuntimeError:
        # set through the per-backend API, which torch no longer sums up in one class
        backend = (torch.backends.cuda.matmul if device_type == "cuda" else
                   torch.backends.mkldnn.matmul)
        name = backend.fp32_precision
        if name == "none":
            name = torch.backends.fp32_precision
        return _FROM_BACKEND.get(name, DEFAULT_PRECISION)


@contextmanager
def torch_precision_set(precision: str):
    """torch's float32 matmul precision set to ``precision`` inside the block and restored
    after: for a measurement that must run a given class (the tuner's vendor baseline), never
    around a user's call."""
    import torch
    check_precision(precision)
    try:
        before = torch.get_float32_matmul_precision()
    except RuntimeError:
        before = None
    if before is None:                 # the per-backend API is in use: keep to it
        backend = torch.backends.cuda.matmul
        was = backend.fp32_precision
        backend.fp32_precision = "ieee" if precision == "highest" else "tf32"
        try:
            yield
        finally:
            backend.fp32_precision = was
        return
    torch.set_float32_matmul_precision(precision)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)
