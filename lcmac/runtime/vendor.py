"""The vendor GEMM: the product a plan that runs ``"vendor"`` makes.

``vendor_matmul(A, B, out=None)`` is ``torch.matmul`` for torch tensors (cuBLAS on CUDA
tensors) and ``numpy.matmul`` (its BLAS) otherwise: the calls ``lcmac tune`` times as the
vendor baseline.  (``lcmac.runtime.vendor_blas`` is another thing: it binds a CBLAS to the
artifacts whose own products call one.)
"""
from __future__ import annotations

import numpy as np


def vendor_matmul(A, B, out=None):
    """A·B by the vendor library: ``torch.matmul`` for torch tensors (CUDA float32 with TF32
    allowed, as the tuning logs measured it), ``numpy.matmul`` otherwise."""
    if type(A).__module__.startswith("torch"):
        import torch        # only for torch operands: numpy callers never load it
        if not (A.is_cuda and A.dtype == torch.float32):
            return torch.matmul(A, B, out=out)
        prev = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = True
        try:
            return torch.matmul(A, B, out=out)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = prev
    return np.matmul(A, B, out=out)
