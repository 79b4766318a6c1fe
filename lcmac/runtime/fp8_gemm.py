"""Block-scaled FP8 in torch (CPU or CUDA tensors): the quantisation of ``lcmac.spec.fp8``
bit for bit, and cuBLAS's FP8 GEMM (``torch.nn.functional.scaled_mm`` /
``torch._scaled_mm``) called on it with the scale layouts each recipe wants.  Here, below
the tuner (its fp8 vendor baseline), and re-exported by ``lcmac.torch.fp8``.

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

import torch
import torch.nn.functional as F

from lcmac.core.errors import LcmacError
from lcmac.spec.fp8 import CONTRACT, Fp8BlockFormat


def quantize(x: torch.Tensor, block=CONTRACT.a_block, fmt: Fp8BlockFormat = CONTRACT):
    """(q, scales): ``x`` [rows, cols] as float8_e4m3fn with one float32 decode scale per
    ``block``, exactly as ``lcmac.spec.fp8.quantize_blocks`` (zero padding, amax floor, true
    division, float32 product, round to nearest even, saturation to ±448)."""
    if x.dim() != 2:
        raise LcmacError(f"quantize takes a matrix, got a tensor of shape {tuple(x.shape)}")
    br, bc = (int(b) for b in block)
    rows, cols = x.shape
    xp = F.pad(x.float(), (0, -cols % bc, 0, -rows % br))
    view = xp.view(xp.shape[0] // br, br, xp.shape[1] // bc, bc)
    amax = view.abs().amax(dim=(1, 3)).clamp_min(fmt.amax_floor)      # NaN propagates
    top = torch.full_like(amax, fmt.max_value)
    if fmt.scale_by_reciprocal:
        scales = amax * torch.full_like(amax, 1.0 / fmt.max_value)
    else:
        scales = amax / top
    mult = (top / amax)[:, None, :, None]              # a true division (448.0 / t is reciprocal·448)
    q = (view * mult).clamp(-fmt.max_value, fmt.max_value).to(torch.float8_e4m3fn)
    return q.view(xp.shape)[:rows, :cols].contiguous(), scales


def dequantize(q: torch.Tensor, scales: torch.Tensor, block) -> torch.Tensor:
    """q times each element's scale, in float64."""
    br, bc = (int(b) for b in block)
    s = scales.double().repeat_interleave(br, 0).repeat_interleave(bc, 1)
    return q.double() * s[:q.shape[0], :q.shape[1]]


def recipe(a_block, w_block, shape) -> str:
    """cuBLAS's name for the scaling of A [M, K] by ``a_block`` and W [N, K] by ``w_block``:
    "1x128,128x128" (DeepSeek-V3's), "1x128,1x128", "rowwise", "tensorwise"; LcmacError for
    a pair cuBLAS has no FP8 GEMM for."""
    M, N, K = shape
    a, w = tuple(int(b) for b in a_block), tuple(int(b) for b in w_block)
    named = {((1, 128), (128, 128)): "1x128,128x128", ((1, 128), (1, 128)): "1x128,1x128",
             ((1, K), (1, K)): "rowwise", ((M, K), (N, K)): "tensorwise"}
    if (a, w) not in named:
        raise LcmacError(f"cuBLAS has no FP8 GEMM scaled per {a} of A and {w} of W at "
                         f"{M}x{N}x{K}; it takes 1x128 with 128x128 or 1x128, rowwise, tensorwise")
    return named[(a, w)]


def _outer_major(s: torch.Tensor) -> torch.Tensor:
    """The same [rows, K blocks] scales with the rows contiguous (strides (1, rows))."""
    return s.t().contiguous().t()


def _blocks_128x128(s: torch.Tensor) -> torch.Tensor:
    """W's [N/128, K/128] scales as [L4, N/128] with strides (1, L4)."""
    return F.pad(s, (0, -s.shape[1] % 4)).contiguous().t()


def scaled_mm_args(a_scales, a_block, w_scales, w_block, shape) -> tuple:
    """(scale_a, scale_b, recipe name) laid out for ``scaled_mm`` (module doc)."""
    name = recipe(a_block, w_block, shape)
    if name == "1x128,128x128":
        return _outer_major(a_scales), _blocks_128x128(w_scales), name
    if name == "1x128,1x128":
        return _outer_major(a_scales), _outer_major(w_scales), name
    if name == "rowwise":
        return a_scales.reshape(-1, 1).contiguous(), w_scales.reshape(1, -1).contiguous(), name
    return a_scales.reshape(()), w_scales.reshape(()), name


def scaled_mm(qa, a_scales, a_block, qw, w_scales, w_block, out_dtype=torch.bfloat16):
    """C = deq(qa)·deq(qw)ᵀ [M, N] by cuBLAS's FP8 GEMM: ``torch.nn.functional.scaled_mm``
    with the blockwise recipes (LcmacError where this torch has none), ``torch._scaled_mm``
    for rowwise and tensorwise scales."""
    shape = (qa.shape[0], qw.shape[0], qa.shape[1])
    sa, sb, name = scaled_mm_args(a_scales, a_block, w_scales, w_block, shape)
    if name in ("rowwise", "tensorwise"):
        return torch._scaled_mm(qa, qw.t(), sa, sb, out_dtype=out_dtype)
    kinds = getattr(F, "ScalingType", None)
    if kinds is None or not hasattr(F, "scaled_mm"):
        raise LcmacError(f"torch {torch.__version__} has no torch.nn.functional.scaled_mm, which "
                         f"the blockwise FP8 recipes ({name}) go through")
    ka = kinds.BlockWise1x128
    kb = kinds.BlockWise128x128 if name == "1x128,128x128" else kinds.BlockWise1x128
    return F.scaled_mm(qa, qw.t(), sa, ka, sb, kb, output_dtype=out_dtype)


# ---- a linear layer's FP8 GEMM (lcmac.nn.Linear's fp8 baseline) ------------------------------
#: the contract's recipe (A per 1×128, W per 128×128), and rowwise scales where this torch or
#: GPU has no blockwise FP8 GEMM: the order ``Fp8Linear`` tries them in
BLOCKWISE, ROWWISE = "1x128,128x128", "rowwise"
LINEAR_RECIPES = (BLOCKWISE, ROWWISE)


def recipe_blocks(name: str, K: int) -> tuple:
    """(A's block, W's block) of the recipe ``name`` at depth K."""
    if name == BLOCKWISE:
        return tuple(CONTRACT.a_block), tuple(CONTRACT.b_block)
    if name == ROWWISE:
        return (1, int(K)), (1, int(K))
    raise LcmacError(f"a linear layer's FP8 GEMM takes the recipes {', '.join(LINEAR_RECIPES)}, "
                     f"not {name!r}")


class Fp8Linear:
    """torch's FP8 GEMM on one weight W [N, K] (nn.Linear's): W quantised once per the first
    recipe of ``recipes`` this torch and device run (the first call tries them in order and
    keeps the one that ran; ``refused`` says why the others did not), x quantised per its A
    block on each call.  With ``BLOCKWISE`` first this is the contract's quantisation, what
    lcmac's fp8 kernels compute on; rowwise scales are not (``recipe`` says which ran)."""

    def __init__(self, W: torch.Tensor, recipes=LINEAR_RECIPES):
        if W.dim() != 2:
            raise LcmacError(f"Fp8Linear takes a weight of out × in, got shape {tuple(W.shape)}")
        self.N, self.K = (int(d) for d in W.shape)
        self._weight = W.detach()
        self._recipes = tuple(recipes)
        for name in self._recipes:
            recipe_blocks(name, self.K)
        self.recipe: str | None = None
        self.refused: dict = {}
        self._q = None

    def _quantized(self, name):
        a_block, w_block = recipe_blocks(name, self.K)
        qw, sw = quantize(self._weight, w_block)
        return a_block, w_block, qw, sw

    def _run(self, x2, q, out_dtype):
        a_block, w_block, qw, sw = q
        qa, sa = quantize(x2, a_block)
        return scaled_mm(qa, sa, a_block, qw, sw, w_block, out_dtype=out_dtype)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """y = x·Wᵀ [..., N] for x [..., K], in x's dtype."""
        if x.shape[-1] != self.K:
            raise LcmacError(f"Fp8Linear multiplies …×{self.K} inputs, got {tuple(x.shape)}")
        x2 = x.reshape(-1, self.K)
        if self._q is not None:
            y = self._run(x2, self._q, x.dtype)
        else:
            y = self._first(x2, x.dtype)
        return y.reshape(*x.shape[:-1], self.N)

    def _first(self, x2, out_dtype):
        for name in self._recipes:
            q = self._quantized(name)
            try:
                y = self._run(x2, q, out_dtype)
            except (LcmacError, RuntimeError, ValueError, NotImplementedError) as e:
                self.refused[name] = f"{type(e).__name__}: {str(e)[:200]}"
                continue
            self.recipe, self._q, self._weight = name, q, None   # W itself is no longer needed
            return y
        raise LcmacError(f"no FP8 GEMM of this torch ({torch.__version__}) runs here on "
                         f"{tuple(x2.shape)} @ {self.K}x{self.N}: {self.refused}")
