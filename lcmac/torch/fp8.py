"""Block-scaled FP8 in torch (CPU or CUDA tensors): the quantisation of ``lcmac.spec.fp8``
bit for bit, and cuBLAS's FP8 GEMM (``torch.nn.functional.scaled_mm`` /
``torch._scaled_mm``) called on it with the scale layouts each recipe wants (implemented in
``lcmac.runtime.fp8_gemm``, below the tuner, which times cuBLAS's FP8 GEMM with them).

Operands are in cuBLAS's and DeepGEMM's orientation: A [M, K] and the weight W = Bᵀ [N, K]
(nn.Linear's, K-major), so W's blocks are B's transposed — (128, 128) stays (128, 128), B's
per-column (128, 1) is W's (1, 128).  Scales come as ``quantize`` returns them, one per
block, [rows / br, cols / bc]; ``scaled_mm`` lays them out:

    A 1×128     scale_a [M, K/128], strides (1, M)
    W 1×128     scale_b [N, K/128], strides (1, N)
    W 128×128   scale_b [L4, N/128], strides (1, L4): the K blocks padded to L4, a multiple of 4
    rowwise     scale_a [M, 1], scale_b [1, N];  tensorwise: one scale each

(SM90 only for the blockwise recipes, cuBLASLt ≥ 12.9; torch's checks name what is missing.)
"""
from __future__ import annotations

from lcmac.runtime.fp8_gemm import (  # noqa: F401 - this module's API
    dequantize, quantize, recipe, scaled_mm, scaled_mm_args)
