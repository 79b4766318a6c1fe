"""Batches of small products, C[b] = A[b]·B[b]: ``lcmac.bmm`` and the torch op
``torch.ops.lcmac.bmm`` behind it for torch tensors.

    C = lcmac.bmm(A, B)                     # A [batch, M, K], B [batch, K, N] → [batch, M, N]
    C = lcmac.bmm(A, B, algo="gemm")        # lcmac's batched kernel (CUDA), whatever auto says

``lcmac.matmul`` sends a 3-D B here (a B [K, N] shared by the batch is one product with the
products' rows stacked: ``lcmac.matmul(A, W)``).  ``algo``:

- ``"gemm"``: on CUDA, lcmac's batched kernel, the batch count a kernel argument, so one
  kernel per (M, N, K) and dtype serves every batch size (compiled once into the kernel
  cache): up to 128 per side ``schedules.cuda.small`` (a CTA per output tile of a group of
  products), wider the production GEMM template (``schedules.cuda.gemm.batched_products``:
  warp-specialised TMA pipeline, C stored by TMA, tiles rasterised within each product; bf16
  and fp16 on its persistent grid).  float64 on the small template at every size (fp64 tensor
  cores, float64 accumulators).  On the CPU the numpy reference (``np.matmul`` per
  product in float64 or the dtype's accumulator).
- a catalogue name (``"strassen"``): that LCMA applied to each product.  On the CPU the
  reference executor, one product at a time (the correctness oracle for in-block LCMAs);
  on CUDA refused: in-block LCMA kernels are not built (docs/batched.md says why).
- ``"vendor"``: ``torch.bmm`` / ``np.matmul``.
- ``"auto"``: lcmac's batched kernel where ``policy.batched.choose_batched`` says it was
  measured to win (CUDA only: bf16/fp16 products of 8 to 24 per side from 10 000 products,
  float32 with TF32 allowed and a long K through the 3D partition, and at 256³ from 20 000
  products on the GEMM template), else the vendor's.

The torch op has a fake
implementation (``torch.compile`` keeps it) and autograd: dA = dC·Bᵀ and dB = Aᵀ·dC, batched,
through the op.
"""
from __future__ import annotations

import threading

import numpy as np

from lcmac.core.errors import LcmacError, ShapeError
from lcmac.core.user_warning import warn_user
from lcmac.core.operands import (
    check_array, check_batches, check_dtype_in, check_one_dtype, check_same_device,
    check_same_kind, dtype_name, operand_kind)
from lcmac.ir import get as get_algorithm
from lcmac.ir.executor import run_unfused
from lcmac.api.call_args import LOADED, check_algo, define_op, target_for
from lcmac.policy.batched import choose_batched
from lcmac.schedules.cuda.batched_tiles import batched_template
from lcmac.spec.precision import allows_tf32, torch_precision

__all__ = ["bmm", "register", "BMM_SCHEMA"]

BMM_SCHEMA = '(Tensor A, Tensor B, str algo="auto") -> Tensor'
_CUDA_DTYPES = ("bfloat16", "float16", "float32", "float64")
_lock = threading.Lock()


def _check(A, B):
    check_array(A, "A", error=TypeError)
    check_array(B, "B", error=TypeError)
    check_same_kind(A, B, error=TypeError)
    check_batches(A, B)
    check_one_dtype(A, B)
    check_same_device(A, B)


def batched_kernel(target: str, dtype: str, shape, config: dict | None = None) -> object:
    """lcmac's batched kernel for products of (M, N, K) = ``shape``, from the kernel cache;
    ``config``: template options over the defaults (``schedules.cuda.config``).  The GEMM
    template is named in the config where it runs, so that the cache key (the requested
    knobs) tells its kernels from the small template's that ran those shapes before.  float64
    runs on the small template at every size (its tensor cores are mma.sync's; the GEMM
    template's wgmma has no fp64): a config asking for the GEMM template with float64 is a
    DTypeError."""
    shape = tuple(int(d) for d in shape)
    asked = (target, dtype, shape, tuple(sorted(config.items())) if config else ())
    how = _kernel_keys.get(asked)
    if how is None:         # the template and the cache key, worked out once per request
        cfg = {"batched": True, **(config or {})}
        if batched_template(cfg.get("batched_template"), shape[0], shape[1], dtype) == "gemm":
            cfg["batched_template"] = "gemm"
        how = _kernel_keys[asked] = (("gemm", target, dtype, shape, tuple(sorted(cfg.items()))),
                                     ("gemm", target, dtype, shape), {"config": cfg})
    return LOADED.get(*how)


#: batched_kernel's requests → (LOADED key, build arguments): a call costs a dict lookup
_kernel_keys: dict[tuple, tuple] = {}


def _reference(A, B, algo: str):
    """The CPU path: each product by the float64 reference (``algo`` "gemm") or the LCMA's
    reference executor, rounded to the operands' dtype."""
    torch_in = operand_kind(A) == "torch"
    a = A.detach().cpu().double().numpy() if torch_in else np.asarray(A, dtype=np.float64)
    b = B.detach().cpu().double().numpy() if torch_in else np.asarray(B, dtype=np.float64)
    if algo == "gemm":
        c = np.matmul(a, b)
    else:
        alg = get_algorithm(algo)
        c = np.stack([run_unfused(alg, a[i], b[i]) for i in range(a.shape[0])])
    if torch_in:
        import torch
        return torch.from_numpy(c).to(device=A.device, dtype=A.dtype)
    return c.astype(A.dtype)


def compute(A, B, algo: str = "auto", out=None):
    """The batched product with no autograd: what the op runs, and ``bmm`` on numpy."""
    _check(A, B)
    batch, M, K = A.shape
    N = B.shape[2]
    cuda = operand_kind(A) == "torch" and A.device.type == "cuda"
    config = None
    picked = False
    if algo == "auto":
        config = _auto_config(A, M, N, K, batch) if cuda else None
        algo, picked = ("vendor", False) if config is None else ("gemm", True)
    if algo == "vendor" or 0 in (batch, M, N, K):
        if operand_kind(A) == "torch":
            import torch
            return torch.bmm(A, B, out=out) if out is not None else torch.bmm(A, B)
        return np.matmul(A, B, out=out)
    if not cuda:
        C = _reference(A, B, algo)
    elif algo != "gemm":
        raise LcmacError(f"algo={algo!r}: in-block LCMA kernels are not built for CUDA "
                         f"(use 'gemm' or 'vendor'; docs/batched.md)")
    else:
        dt = dtype_name(A)
        check_dtype_in(dt, _CUDA_DTYPES, "lcmac's batched CUDA kernel",
                       hint=" (algo='vendor' runs torch.bmm)")
        key = (target_for(A.device.type), dt, (M, N, K), config)
        fn = _auto_kernel(*key) if picked else batched_kernel(*key)
        if fn is None:          # "auto" chose lcmac's kernel and it cannot be had here
            import torch
            return torch.bmm(A, B, out=out) if out is not None else torch.bmm(A, B)
        return fn(A.contiguous(), B.contiguous(), out=out)
    if out is not None:
        out[...] = C
        return out
    return C


_auto_choices: dict[tuple, dict | None] = {}
#: kernels "auto" picked that could not be built here: not tried again (a failed build costs a
#: compiler process per call), torch.bmm runs them (as ``lcmac.ops`` does for lcmac.matmul)
_unbuildable: dict[tuple, str] = {}


def _auto_kernel(target: str, dtype: str, shape, config: dict | None):
    """``batched_kernel`` for a kernel "auto" picked, or None where it cannot be built (warned
    the first time, remembered for the process)."""
    key = (target, dtype, shape, tuple(sorted((config or {}).items())))
    if key in _unbuildable:
        return None
    try:
        return batched_kernel(target, dtype, shape, config)
    except LcmacError as e:
        _unbuildable[key] = str(e)
        M, N, K = shape
        warn_user(f"lcmac.bmm: the batched kernel for {M}x{N}x{K} {dtype} could not be built "
                  f"({str(e).splitlines()[0][:200]}); algo='auto' runs torch.bmm instead")
        return None


def _auto_config(A, M: int, N: int, K: int, batch: int) -> dict | None:
    """``choose_batched`` for a CUDA tensor A (TF32 counts as allowed where torch's float32
    precision class allows it, ``lcmac.spec.precision``),
    kept per case: "auto" runs on every call, where a small batch takes only microseconds."""
    if target_for("cuda") != "cuda-sm90a":
        return None         # the rule's wins were measured on Hopper (TMA); elsewhere torch.bmm
    dt = dtype_name(A)
    tf32 = False
    if dt == "float32":             # the class is read only where it matters
        tf32 = allows_tf32(torch_precision("cuda"))
    key = (dt, M, N, K, batch, tf32)
    hit = _auto_choices.get(key, key)
    if hit is key:
        hit = _auto_choices[key] = choose_batched("cuda", dt, M, N, K, batch, tf32=tf32)
        if len(_auto_choices) > 4096:       # bounded: batch counts may vary call to call
            _auto_choices.pop(next(iter(_auto_choices)), None)
    return hit


def bmm(A, B, *, algo: str = "auto", out=None):
    """C[b] = A[b]·B[b] (module doc)."""
    algo = check_algo(algo)
    if getattr(B, "ndim", None) == 2:
        raise ShapeError("B is 2-D: one B shared by the batch is one product with the batch's "
                         "rows stacked, lcmac.matmul(A, B); lcmac.bmm takes B [batch, K, N]")
    if check_array(A, "A", error=TypeError) != "torch":
        return compute(A, B, algo, out)
    import torch
    register()
    grad = torch.is_grad_enabled() and (A.requires_grad or B.requires_grad)
    if out is not None:
        if grad:
            raise LcmacError("lcmac.bmm(..., out=) records no gradient and A or B requires grad")
        return compute(A, B, algo, out)
    if not grad and not torch.compiler.is_compiling():
        return compute(A, B, algo)
    _check(A, B)
    return torch.ops.lcmac.bmm(A, B, algo)


# ---- the torch op -----------------------------------------------------------------------------
def _op_impl(A, B, algo="auto"):
    return compute(A.contiguous(), B.contiguous(), algo)


def _op_fake(A, B, algo="auto"):
    _check(A, B)
    return A.new_empty((A.shape[0], A.shape[1], B.shape[2]))


def _setup_context(ctx, inputs, output):
    A, B, algo = inputs
    ctx.save_for_backward(A, B)
    ctx.algo = algo


def _backward(ctx, dC):
    """dA[b] = dC[b]·B[b]ᵀ, dB[b] = A[b]ᵀ·dC[b], through the op."""
    import torch
    A, B = ctx.saved_tensors
    op = torch.ops.lcmac.bmm.default
    dA = dB = None
    if ctx.needs_input_grad[0]:
        dA = op(dC.contiguous(), B.transpose(1, 2).contiguous(), ctx.algo)
    if ctx.needs_input_grad[1]:
        dB = op(A.transpose(1, 2).contiguous(), dC.contiguous(), ctx.algo)
    return dA, dB, None


_registered: list = []


def register() -> None:
    """Register ``torch.ops.lcmac.bmm`` (imports torch; idempotent)."""
    if _registered:
        return
    with _lock:
        if _registered:
            return
        _registered.append(define_op("lcmac::bmm", _op_impl, BMM_SCHEMA, _op_fake, _backward,
                                     _setup_context))
