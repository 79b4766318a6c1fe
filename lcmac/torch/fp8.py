"""Block-scaled FP8 for PyTorch layers.  The quantisation of ``lcmac.spec.fp8`` in torch, bit
for bit, and cuBLAS's FP8 GEMM on it (scale layouts per recipe) are ``lcmac.runtime.fp8_gemm``'s,
re-exported here (the tuner, below this package, times cuBLAS's FP8 GEMM with them).

``lcmac.nn.Linear(..., operands="fp8")`` rests on what follows: ``fp8_target`` (where a
layer may run in fp8, else the refusal by name), ``check_features`` and ``Fp8Weights``, the
torch FP8 GEMM a layer runs where lcmac's kernels do not (``Fp8Linear`` on the weight, kept
while no write reaches it).
"""
from __future__ import annotations

from lcmac.api.tensor_watch import snapshot
from lcmac.core.errors import DTypeError, LcmacError, ShapeError, TargetError
from lcmac.runtime.fp8_gemm import (  # noqa: F401 - this module's API
    BLOCKWISE, LINEAR_RECIPES, ROWWISE, Fp8Linear, dequantize, quantize, recipe, recipe_blocks,
    scaled_mm, scaled_mm_args)

#: ``lcmac.nn.Linear(operands=…)``: its products in the weight's dtype, or in block-scaled E4M3
NATIVE, FP8 = "native", "fp8"
LAYER_OPERANDS = (NATIVE, FP8)
#: in and out features must be multiples of this: 16 bytes of E4M3 (the fp8 kernels' TMA rows),
#: and torch's FP8 GEMM wants both of W's extents divisible by 16
FEATURE_MULTIPLE = 16
#: FP8 tensor cores and lcmac's fp8 kernels (wgmma, sm_90a)
MIN_CAPABILITY = (9, 0)
#: the element type lcmac's targets list for fp8 products
TARGET_FP8 = "float8_e4m3"
#: what a layer below its crossover, or where no fp8 kernel runs, computes with
BASELINE = ("torch's FP8 GEMM (torch.nn.functional.scaled_mm, A per 1x128 and W per 128x128 "
            "as lcmac's fp8 kernels; torch._scaled_mm with rowwise scales where this torch or "
            "GPU has no blockwise one)")


def check_layer_operands(operands) -> str:
    """``operands`` itself where ``lcmac.nn.Linear`` takes it; LcmacError otherwise."""
    if operands not in LAYER_OPERANDS:
        raise LcmacError(f"lcmac.nn.Linear takes operands={' or '.join(map(repr, LAYER_OPERANDS))} "
                         f"(fp8: bfloat16/float16 layers quantised to block-scaled E4M3), not "
                         f"{operands!r}")
    return operands


def check_features(in_features: int, out_features: int) -> None:
    """ShapeError unless both are multiples of ``FEATURE_MULTIPLE``."""
    bad = [f"{n} = {v}" for n, v in (("in_features", in_features), ("out_features", out_features))
           if v % FEATURE_MULTIPLE]
    if bad:
        raise ShapeError(f"operands='fp8' needs in and out features that are multiples of "
                         f"{FEATURE_MULTIPLE} (16 bytes of E4M3 per row, as the fp8 kernels and "
                         f"torch's FP8 GEMM read them); this layer has {', '.join(bad)}: use "
                         f"operands='native' for it")


def _capability(device) -> tuple:
    import torch
    return tuple(torch.cuda.get_device_capability(device))


def fp8_target(weight) -> str:
    """The lcmac target on which the layer of ``weight`` runs in fp8; otherwise the refusal,
    by name: a weight not on a CUDA GPU (TargetError), not bfloat16/float16 (DTypeError), a
    GPU without FP8 tensor cores or lcmac's fp8 kernels (below sm_90: TargetError)."""
    import torch
    if weight.dtype not in (torch.bfloat16, torch.float16):
        raise DTypeError(f"operands='fp8' quantises bfloat16 or float16 layers to E4M3; this "
                         f"weight is {str(weight.dtype).replace('torch.', '')}: convert the model "
                         f"first (model.to(torch.bfloat16)) or use operands='native'")
    return device_target(weight.device)


def device_target(device) -> str:
    """``fp8_target``'s part about the device: its lcmac target, or the refusal by name."""
    from lcmac.api.call_args import target_for
    from lcmac.spec.targets import get_target
    if device.type != "cuda":
        raise TargetError(f"operands='fp8' runs on CUDA GPUs with FP8 tensor cores (sm_90: "
                          f"H100, H200); this weight is on {device}: move the model to "
                          f"the GPU or use operands='native'")
    cap = _capability(device)
    if cap < MIN_CAPABILITY:
        raise TargetError(f"operands='fp8' needs sm_90 (FP8 wgmma, which lcmac's fp8 kernels "
                          f"use); this GPU is sm_{cap[0]}{cap[1]}"
                          + (" (sm_89 has FP8 tensor cores, but no lcmac fp8 kernels: call "
                             "lcmac.torch.fp8.Fp8Linear for torch's own)" if cap >= (8, 9) else
                             " (no FP8 tensor cores)") + ": use operands='native'")
    target = target_for("cuda")
    if TARGET_FP8 not in get_target(target).dtypes:
        raise TargetError(f"lcmac's {target} target has no fp8 kernels; operands='fp8' runs on "
                          f"cuda-sm90a")
    return target


class Fp8Weights:
    """The torch FP8 GEMM (``Fp8Linear``) of one layer's weight, made on first use and again
    once a write has reached the weight's memory (``lcmac.api.tensor_watch``, as lcmac's own
    kept Wᵀ and prepared B̃); a weight whose writes cannot be seen is quantised on each call."""

    def __init__(self):
        self._kept = None              # (snapshot of the weight, its Fp8Linear)

    def of(self, weight) -> Fp8Linear:
        kept = self._kept
        if kept is not None and kept[0].unchanged(weight):
            return kept[1]
        snap = snapshot(weight)
        gemm = Fp8Linear(weight.detach())
        self._kept = None if snap is None else (snap, gemm)
        return gemm

    @property
    def recipe(self) -> str | None:
        """The recipe the kept GEMM runs (None before its first call)."""
        return None if self._kept is None else self._kept[1].recipe
