"""The vendor GEMM: the product a plan that runs ``"vendor"`` makes.

``vendor_matmul(A, B, out=None)`` is ``torch.matmul`` for torch tensors (cuBLAS on CUDA
tensors) and, for numpy arrays, the faster of ``numpy.matmul`` (its BLAS) and ``torch.matmul``
(MKL / oneDNN) as measured on this CPU (``lcmac.runtime.cpu_vendor``; numpy's until measured):
the calls ``lcmac tune`` times as the vendor baseline.  (``lcmac.runtime.vendor_blas`` is
another thing: it binds a CBLAS to the artifacts whose own products call one.)
"""
from __future__ import annotations

from lcmac.runtime import cpu_vendor


def vendor_matmul(A, B, out=None, api: str | None = None):
    """A·B by the vendor library: ``torch.matmul`` for torch tensors, in torch's own float32
    precision class (cuBLAS runs TF32 only where ``torch.set_float32_matmul_precision``
    allows it; lcmac never changes that setting), otherwise the CPU's chosen vendor GEMM
    (``cpu_vendor.matmul``: numpy.matmul, or torch.matmul on views of the arrays; float32 in
    float32; ``api``: the one a decision's records name, ``Plan.vendor_api``, where no
    choice of this process's is kept)."""
    if type(A).__module__.startswith("torch"):
        import torch        # torch operands: loaded already
        return torch.matmul(A, B, out=out)
    return cpu_vendor.matmul(A, B, out=out, logged=api)
