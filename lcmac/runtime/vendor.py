"""The vendor GEMM: the product a plan that runs ``"vendor"`` makes.

``vendor_matmul(A, B, out=None)`` is ``torch.matmul`` for torch tensors (cuBLAS on CUDA
tensors) and ``numpy.matmul`` (its BLAS) otherwise: the calls ``lcmac tune`` times as the
vendor baseline.  (``lcmac.runtime.vendor_blas`` is another thing: it binds a CBLAS to the
artifacts whose own products call one.)
"""
from __future__ import annotations

import numpy as np


def vendor_matmul(A, B, out=None):
    """A·B by the vendor library: ``torch.matmul`` for torch tensors, in torch's own float32
    precision class (cuBLAS runs TF32 only where ``torch.set_float32_matmul_precision``
    allows it; lcmac never changes that setting), ``numpy.matmul`` otherwise (float32 in
    float32)."""
    if type(A).__module__.startswith("torch"):
        import torch        # only for torch operands: numpy callers never load it
        return torch.matmul(A, B, out=out)
    return np.matmul(A, B, out=out)
