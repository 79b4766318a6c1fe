"""``lcmac.matmul``: C = A @ B for numpy arrays and torch tensors of any shape, and the torch
op ``torch.ops.lcmac.matmul`` behind it for torch tensors.

    C = lcmac.matmul(A, B)                          # …×M×K @ K×N → …×M×N
    C = lcmac.matmul(A, B, algo="strassen")         # that kernel, whatever the model says
    C = lcmac.matmul(A, B, max_error=4.0)           # only LCMAs predicted within 4× the GEMM's error

A's leading dimensions are flattened into the rows: the product runs as one (∏…·M)×K @ K×N.

**The choice** (``algo="auto"``) is ``lcmac.policy.plan``'s per shape, from the tuning logs and
the model, once per shape in the process.  Where it picks an LCMA, that kernel runs; where it
picks the vendor GEMM, ``numpy.matmul`` / ``torch.matmul`` runs.  Where it picks lcmac's plain
GEMM, that kernel runs only if the tuning log measured it at this very shape faster than the
vendor's by more than a tie, else the vendor GEMM (``lcmac.policy.planner``).
``algo="gemm"`` forces lcmac's plain GEMM, ``algo="vendor"`` the vendor GEMM, any catalogue
name or expression (``"strassen"``, ``"winograd^2"``) that LCMA; ``plan()`` tells what runs
for a shape and why, without running it.

**Kernels per N×K, not per shape.**  Kernels are compiled for fixed sizes, so the rows are
cut by a ladder of bucket row counts (``lcmac.spec.shape_rules.JIT_ROWS``: 4096…256 on CPUs,
65536…1024 on CUDA; largest first, each piece a slice of A and C, no copy).  The first call
that needs a bucket kernel for an N×K compiles it (a few seconds on a CPU, in a worker
process) into the kernel cache (``lcmac.artifact.cache``: ``$LCMAC_CACHE_DIR/kernels``, default
``~/.cache/lcmac/kernels``); later calls, in this process or another, load it: at most one
kernel per bucket and N×K, whatever the row counts seen.  With "auto" the rows under the
smallest bucket, and any piece the decision at its bucket gives to the vendor, run on the
vendor GEMM; a forced algorithm pads them into its smallest bucket.  With
``LCMAC_CACHE_DIR=off`` nothing is compiled: "auto" runs the vendor GEMM (with a warning),
a forced algorithm raises.

**The torch op.**  ``torch.ops.lcmac.matmul(A, B, algo="auto", max_error=None)`` is a
``torch.library.custom_op`` with a fake (shape-only) implementation, so ``torch.compile``
traces it without a graph break, and an autograd formula whose two products run through the
op again (dA = dC·Bᵀ, dB = Aᵀ·dC: an LCMA may serve those shapes too).  It is registered when
this module is imported with torch already imported, on the first ``lcmac.matmul`` of a torch
tensor, or by ``register()``; ``import lcmac`` never imports torch.  The op copies
non-contiguous operands; ``lcmac.matmul`` refuses them instead, so that no copy is hidden.

**A B that does not change** (a layer's weight): ``mark_static(B)`` lets an artifact that
can combine B once (``prepare_b``: CUDA artifacts and CPU artifacts built by this lcmac) keep
the prepared form, per artifact, until B's version counter or storage changes.
"""
import sys
import threading
from collections import OrderedDict
import warnings
import weakref
from dataclasses import dataclass

from lcmac import policy
from lcmac.api.call_args import AUTO, GEMM, VENDOR, check_algo, define_op, target_for  # noqa: F401 (ops.* names)
from lcmac.api.call_args import LOADED
from lcmac.artifact.bundle import backend_kind
from lcmac.costmodel.decision import check_error_budget
from lcmac.core.dtypes import normalize_dtype
from lcmac.core.errors import DTypeError, LcmacError, ShapeError
from lcmac.core.operands import (
    check_array, check_contiguous, check_matrices, check_one_dtype, check_out, check_real,
    check_same_device, check_same_kind, device_type, operand_kind)
from lcmac.runtime.cuda_memory import kept_empty
from lcmac.runtime.tiled import empty, run_rows
from lcmac.policy import Plan
from lcmac.runtime.vendor import vendor_matmul
from lcmac.spec.shape_rules import JIT_ROWS
from lcmac.spec.targets import get_target

__all__ = ["matmul", "plan", "Plan", "register", "mark_static", "transposed_weight", "kernel",
           "kernel_keys", "release_kernels", "compute",
           "check_operands", "OP_SCHEMA"]

#: the dtypes lcmac.matmul takes (further limited by the target: CPU float32, float64 and,
#: on x86_64-avx512, bfloat16; CUDA bfloat16, float16, float32)
DTYPES = ("float32", "float64", "bfloat16", "float16")
OP_SCHEMA = '(Tensor A, Tensor B, str algo="auto", float? max_error=None) -> Tensor'
#: torch.ops.lcmac.linear: y = x·Wᵀ with W as nn.Linear holds it (out × in)
LINEAR_SCHEMA = '(Tensor x, Tensor weight, str algo="auto", float? max_error=None) -> Tensor'
#: weights whose contiguous transpose is kept (least recently used dropped first)
MAX_TRANSPOSED = 256
#: prepared forms kept per static B (one per bucket kernel)
MAX_PREPARED = 8

_lock = threading.RLock()     # re-entrant: a weakref callback (mark_static) may fire under it
_kernels = LOADED             # shared with lcmac.bmm's batched kernels
_failed: dict[tuple, str] = {}


# ---- operands ---------------------------------------------------------------------------------
_supported: dict[str, tuple] = {}      # per call on the hot path; the target table is static


def supported_dtypes(target: str) -> tuple:
    """The dtypes lcmac.matmul takes on ``target``."""
    ok = _supported.get(target)
    if ok is None:
        ok = _supported[target] = tuple(d for d in get_target(target).dtypes if d in DTYPES)
    return ok


def _check_dtype(name: str, target: str, what: str = "the operands", vendor: bool = False) -> str:
    """lcmac's name of the dtype ``name`` when ``target``'s kernels take it; with ``vendor``
    (the vendor GEMM may run the call) also any dtype lcmac names, which the caller then
    gives to the vendor GEMM."""
    ok = supported_dtypes(target)
    try:
        d = normalize_dtype(name)
    except DTypeError:
        d = None
    if d not in ok and not (vendor and d in DTYPES):
        raise DTypeError(f"lcmac.matmul takes {', '.join(ok)} on {target}; {what} have dtype {name}")
    return d


@dataclass(frozen=True)
class _Operands:
    kind: str            # "numpy" | "torch"
    dtype: str           # lcmac's name
    target: str
    rows: tuple          # A's leading dimensions and M: C is rows × N
    M: int               # the rows flattened
    N: int
    K: int
    kernels: bool = True  # False: the target's kernels do not take the dtype (the vendor GEMM runs)


def check_operands(A, B, *, contiguous: bool = True, vendor: bool = False) -> _Operands:
    """Check A (…×M×K) and B (K×N) for lcmac.matmul; errors name the problem.  ``vendor``:
    the call may run the vendor GEMM ("auto", "vendor"), so a dtype the target's kernels do not
    take (bfloat16 on a CPU without AVX-512 BF16, say) is accepted, marked ``kernels=False``."""
    kind = check_array(A, "A")
    check_array(B, "B")
    check_same_kind(A, B)
    check_real(A, "A")
    check_real(B, "B")
    dtype = check_one_dtype(A, B)
    M, N, K = check_matrices(A, B, batch_a=True)
    check_same_device(A, B, fix="move both to one device")
    target = target_for(device_type(A))
    dtype = _check_dtype(dtype, target, vendor=vendor)
    if contiguous:
        check_contiguous(A, "A")
        check_contiguous(B, "B")
    rows = tuple(int(d) for d in A.shape[:-1])
    return _Operands(kind, dtype, target, rows, M, N, K, dtype in supported_dtypes(target))


def check_budget(max_error):
    """``max_error`` as a float (None stays None); ValueError unless positive and finite."""
    return None if max_error is None else check_error_budget(max_error)


# ---- the decision -----------------------------------------------------------------------------
def plan(M: int, N: int, K: int, dtype="float32", *, algo: str = AUTO, max_error=None,
         target: str | None = None) -> Plan:
    """What ``lcmac.matmul`` runs for C[M×N] = A[M×K]·B[K×N] (rows flattened), and why,
    without compiling or running anything: ``lcmac.policy.plan`` for lcmac.matmul's kernels,
    for a dtype lcmac.matmul takes on ``target`` (default this CPU's)."""
    algo, max_error = check_algo(algo), check_budget(max_error)
    target = target or target_for("cpu")
    dtype = _check_dtype(str(dtype).replace("torch.", ""), target, "they")
    return policy.plan(M, N, K, dtype, target, algo=algo, max_error=max_error)


# ---- kernels ----------------------------------------------------------------------------------
def kernel(algo: str, target: str, dtype: str, shape):
    """The loaded kernel of ``algo`` for (M, N, K) = ``shape``: from this process's table,
    else from the kernel cache (``lcmac.artifact.cache.cached_build``: compiled there on a
    miss, once whatever the threads and processes asking)."""
    key = (algo, target, dtype, tuple(int(d) for d in shape))
    return _kernels.get(key, key)


def release_kernels() -> None:
    """Drop this process's loaded kernels (lcmac.bmm's too) and prepared weights (their GPU
    workspaces go with the last reference); the next call at a shape loads its kernel from the
    cache again."""
    with _lock:
        _kernels.clear()
        _transposed.clear()
        for e in _static.values():
            e.prepared.clear()


# ---- static B (weights) -----------------------------------------------------------------------
class _Static:
    __slots__ = ("ref", "version", "shape", "dtype", "device", "prepared")

    def __init__(self, ref, B):
        self.ref, self.version = ref, B._version
        self.shape, self.dtype, self.device = tuple(B.shape), B.dtype, B.device
        self.prepared: dict = {}      # kernel → prepared B, or None where it cannot prepare


_static: dict[int, _Static] = {}


def mark_static(B) -> None:
    """Declare the torch tensor ``B`` constant while its version counter stays as it is now:
    artifacts with ``prepare_b`` keep its prepared form, one per artifact (at most
    ``MAX_PREPARED``), and drop it when B changes or is freed."""
    ptr = B.data_ptr()

    def drop(ref, ptr=ptr):
        with _lock:
            e = _static.get(ptr)
            if e is not None and e.ref is ref:
                del _static[ptr]
    with _lock:
        _static[ptr] = _Static(weakref.ref(B, drop), B)


def _b_for(fn, B, kind: str):
    """B itself, or the prepared form ``fn`` keeps for a static B that has not changed."""
    prepare = getattr(fn, "prepare_b", None)
    if prepare is None or kind != "torch":
        return B
    e = _static.get(B.data_ptr())
    if e is None or e.ref() is None or B._version != e.version or e.ref()._version != e.version \
            or (tuple(B.shape), B.dtype, B.device) != (e.shape, e.dtype, e.device):
        return B
    if fn not in e.prepared:
        try:
            p = prepare(B)
        except LcmacError:            # the plain GEMM, scaled operand modes: nothing to keep
            p = None
        with _lock:
            while len(e.prepared) >= MAX_PREPARED:
                e.prepared.pop(next(iter(e.prepared)))
            e.prepared[fn] = p
    p = e.prepared.get(fn)
    return B if p is None else p


class _Transposed:
    __slots__ = ("weight", "version", "wt")

    def __init__(self, weight, version: int, wt):
        self.weight, self.version, self.wt = weight, version, wt


#: (data pointer, shape, strides, dtype, device) of a weight → its kept transpose.  The entry
#: holds the weight (detached: same storage and version counter), so no other tensor can take
#: its memory, and so its address, while the entry lives.
_transposed: "OrderedDict[tuple, _Transposed]" = OrderedDict()


def transposed_weight(weight):
    """Wᵀ (in × out, contiguous) of an ``nn.Linear`` weight W (out × in), kept while W's
    storage and version counter stay as they are (an optimizer step, ``load_state_dict`` or
    any in-place change makes it again) and marked static, so an artifact that can combine B
    once (``prepare_b``) keeps that form too.  This runs inside ``torch.ops.lcmac.linear``
    at call time, under ``torch.compile`` as in eager mode."""
    import torch
    if weight.is_cuda and torch.cuda.is_current_stream_capturing():
        # a CUDA graph replays without Python: a kept copy would go stale when the weight
        # changes, so the capture records the transpose itself (and B is combined in the kernel)
        return weight.t().contiguous()
    try:
        version = weight._version
    except RuntimeError:                # an inference-mode tensor has no version counter
        return weight.t().contiguous()
    key = (weight.data_ptr(), tuple(weight.shape), tuple(weight.stride()), weight.dtype, weight.device)
    with _lock:
        e = _transposed.get(key)
        if e is not None and e.version == version:
            _transposed.move_to_end(key)
            return e.wt
    # outside inference mode: the kept copy may meet autograd later (a frozen weight)
    with torch.inference_mode(False), torch.no_grad():
        # kept across calls: not from a CUDA graph's pool (runtime.cuda_memory)
        wt = kept_empty((weight.shape[1], weight.shape[0]), weight.dtype, weight.device)
        wt.copy_(weight.detach().t())
    mark_static(wt)
    with _lock:
        _transposed[key] = _Transposed(weight.detach(), version, wt)
        _transposed.move_to_end(key)
        while len(_transposed) > MAX_TRANSPOSED:
            _transposed.popitem(last=False)
    return wt


# ---- the product ------------------------------------------------------------------------------
def kernel_keys(M: int, N: int, K: int, dtype="float32", *, algo: str = AUTO, max_error=None,
                target: str | None = None) -> list[tuple]:
    """The kernels ``lcmac.matmul`` runs for C[M×N] = A[M×K]·B[K×N], as ``kernel``'s keys
    (algorithm, target, dtype, bucket shape), without compiling anything: its row pieces'
    buckets (``lcmac.spec.shape_rules``), less those the vendor GEMM takes under "auto"."""
    p = plan(M, N, K, dtype, algo=algo, max_error=max_error, target=target)
    return [(p.runs, p.target, p.dtype, shape) for shape in p.kernel_shapes()]


def _kernel_for(p: Plan, o: _Operands):
    """bucket shape → the plan's kernel there, or None where the vendor GEMM should run that
    piece (an automatic choice: the plan gives the bucket's piece to the vendor, or the kernel
    could not be compiled, which is warned once per shape)."""
    forced = p.algo != AUTO
    buckets = {piece.bucket for piece in p.pieces if piece.runs != VENDOR}

    def kernel_for(shape):
        key = (p.runs, o.target, o.dtype, tuple(shape))
        if not forced and (key in _failed or shape[0] not in buckets):
            return None
        try:
            return kernel(*key)
        except LcmacError as e:
            if forced:
                raise
            _failed[key] = str(e)
            warnings.warn(f"lcmac.matmul: {p.runs} was chosen for {o.M}x{o.N}x{o.K} {o.dtype} but "
                          f"its {'x'.join(map(str, shape))} kernel could not be built "
                          f"({type(e).__name__}: {e}); the vendor GEMM runs those rows instead",
                          RuntimeWarning, stacklevel=6)
            return None
    return kernel_for


def _run_lcmac(p: Plan, A, B, out, o: _Operands):
    """Run the plan's algorithm on row pieces of the JIT ladder (lcmac.spec.shape_rules): bucket
    kernels on slices of A and C; with an automatic choice the vendor GEMM takes the rows
    under the smallest bucket and any piece where the decision prefers it; a forced
    algorithm pads them into its smallest bucket instead."""
    C = out if out is not None else empty(A, (*o.rows, o.N))
    run_rows(A.reshape(o.M, o.K), B, C.reshape(o.M, o.N), JIT_ROWS[backend_kind(o.target)],
             _kernel_for(p, o),
             N=o.N, K=o.K, vendor=None if p.algo != AUTO else vendor_matmul,
             b_for=lambda fn, b: _b_for(fn, b, o.kind))
    return C


#: torch calls whose plan is the vendor GEMM, by (shapes, dtype, devices, algo, budget): a
#: repeat goes straight to it.  The checks and the plan cost microseconds of Python a call,
#: which small products on a GPU feel.
_vendor_calls: set = set()
_VENDOR_CALLS_MAX = 4096


def _call_key(A, B, algo, max_error):
    """The key of a torch call with contiguous operands, else None."""
    torch = sys.modules.get("torch")
    if torch is None or type(A) is not torch.Tensor or type(B) is not torch.Tensor:
        return None
    if not (A.is_contiguous() and B.is_contiguous()):
        return None
    return (A.shape, B.shape, A.dtype, B.dtype, A.device, B.device, algo, max_error)


def compute(A, B, algo: str = AUTO, max_error=None, out=None):
    """The product with no autograd: what the op runs, and ``lcmac.matmul`` on numpy."""
    key = _call_key(A, B, algo, max_error) if out is None else None
    if key is not None and key in _vendor_calls:
        return vendor_matmul(A, B)
    o = check_operands(A, B, vendor=algo in (AUTO, VENDOR))
    if out is not None:
        check_out(out, A, (*o.rows, o.N))
    if algo != VENDOR and o.kernels and 0 not in (o.M, o.N, o.K):
        p = plan(o.M, o.N, o.K, o.dtype, algo=algo, max_error=max_error, target=o.target)
        if p.runs != VENDOR:
            return _run_lcmac(p, A, B, out, o)
    if key is not None:
        if len(_vendor_calls) >= _VENDOR_CALLS_MAX:
            _vendor_calls.clear()
        _vendor_calls.add(key)
    return vendor_matmul(A, B, out=out)


def matmul(A, B, *, algo: str = AUTO, out=None, max_error=None, devices=None, split="auto"):
    """C = A @ B for numpy arrays or torch tensors (CPU; CUDA where present), A of …×M×K
    (leading dimensions flattened into the rows) and B of K×N; C is …×M×N, new or ``out``.
    A [batch, M, K] and B [batch, K, N]: the batch of products (``lcmac.bmm``).

    ``devices=("cuda", "cpu")``: one 2-D product split between the GPU and the host's CPU
    (``lcmac.api.coexec``; ``split``: "auto" or the CPU's share of rows); ``algo`` is then the GPU
    side's choice, the CPU side runs the vendor GEMM.

    ``algo``: "auto" (the choice per shape, module doc), "vendor", "gemm" or an algorithm
    name or expression.  ``max_error``: an error budget for "auto", as a multiple of the
    plain GEMM's error (a forced algorithm predicted over it is refused).  Torch tensors go
    through ``torch.ops.lcmac.matmul`` (autograd and torch.compile work) unless ``out`` is
    given, which records no gradient, and in eager mode when nothing needs a gradient (the
    same computation without the op's dispatch).  Operands must be contiguous and of one
    dtype and device; errors name the problem."""
    algo, max_error = check_algo(algo), check_budget(max_error)
    if getattr(B, "ndim", 2) == 3:             # a batch of products: lcmac.bmm
        if devices is not None or max_error is not None:
            raise LcmacError("a batched product (3-D B) takes neither devices= nor max_error=")
        from lcmac.api.bmm import bmm
        return bmm(A, B, algo=algo, out=out)
    if devices is not None:
        from lcmac.api.coexec import split_product
        return split_product(
            A, B, devices, split, out=out,
            gpu_matmul=lambda a, b, out=None: matmul(a, b, algo=algo, max_error=max_error, out=out),
            cpu_matmul=lambda a, b, out=None: matmul(a, b, algo=VENDOR, out=out))
    if operand_kind(A) == "torch" or operand_kind(B) == "torch":
        return _torch_matmul(A, B, algo, max_error, out)
    return compute(A, B, algo, max_error, out)


def _torch_matmul(A, B, algo, max_error, out):
    import torch
    grad = torch.is_grad_enabled() and (getattr(A, "requires_grad", False) or
                                        getattr(B, "requires_grad", False))
    if out is not None:
        if grad:
            raise LcmacError("lcmac.matmul(..., out=) records no gradient and A or B requires "
                             "grad: call it without out= (or under torch.no_grad())")
        return compute(A, B, algo, max_error, out)
    register()             # before any tracing: torch.compile must find the op registered
    if not grad and not torch.compiler.is_compiling():
        # eager, nothing to differentiate: the op's dispatch (its autograd and compiler
        # wrappers, tens of microseconds a call) would add nothing; compute checks the operands
        return compute(A, B, algo, max_error)
    check_operands(A, B, vendor=algo in (AUTO, VENDOR))
    return torch.ops.lcmac.matmul(A, B, algo, max_error)


# ---- the torch op -----------------------------------------------------------------------------
def _op_impl(A, B, algo=AUTO, max_error=None):
    return compute(A.contiguous(), B.contiguous(), algo, max_error)


def _op_fake(A, B, algo=AUTO, max_error=None):
    check_matrices(A, B, batch_a=True, who="lcmac::matmul")
    check_one_dtype(A, B)
    return A.new_empty((*A.shape[:-1], B.shape[1]))


def _setup_context(ctx, inputs, output):
    A, B, algo, max_error = inputs
    ctx.save_for_backward(A, B)
    ctx.algo, ctx.max_error = algo, max_error


def _backward(ctx, dC):
    """dA = dC·Bᵀ (…×M×N @ N×K), dB = Aᵀ·dC (K×∏…M @ ∏…M×N), both through the op."""
    import torch
    A, B = ctx.saved_tensors
    op = torch.ops.lcmac.matmul.default
    dA = dB = None
    if ctx.needs_input_grad[0]:
        dA = op(dC.contiguous(), B.t().contiguous(), ctx.algo, ctx.max_error)
    if ctx.needs_input_grad[1]:
        K, N = B.shape
        dB = op(A.reshape(-1, K).t().contiguous(), dC.reshape(-1, N).contiguous(),
                ctx.algo, ctx.max_error)
    return dA, dB, None, None


def _linear_impl(x, weight, algo=AUTO, max_error=None):
    return compute(x.contiguous(), transposed_weight(weight), algo, max_error)


def linear(x, weight, algo: str = AUTO, max_error=None):
    """y = x·Wᵀ as ``lcmac.nn.Linear`` computes it: through ``torch.ops.lcmac.linear``
    (autograd, torch.compile), or, in eager mode with nothing to differentiate (inference
    under ``torch.no_grad``), the same computation without the op's dispatch."""
    import torch
    register()
    if not torch.compiler.is_compiling() and not (
            torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)):
        return _linear_impl(x, weight, algo, max_error)
    return torch.ops.lcmac.linear(x, weight, algo, max_error)


def _linear_fake(x, weight, algo=AUTO, max_error=None):
    if x.dim() < 2 or weight.dim() != 2 or x.shape[-1] != weight.shape[1]:
        raise ShapeError(f"lcmac::linear takes x of …×in and a weight of out×in; got "
                         f"{tuple(x.shape)} and {tuple(weight.shape)}")
    check_one_dtype(x, weight, names=("x", "the weight"))
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def _linear_backward(ctx, dy):
    """dx = dy·W (…×out @ out×in), dW = dyᵀ·x (out×∏… @ ∏…×in), both through lcmac::matmul."""
    import torch
    x, weight = ctx.saved_tensors
    op = torch.ops.lcmac.matmul.default
    dx = dw = None
    if ctx.needs_input_grad[0]:
        dx = op(dy.contiguous(), weight.contiguous(), ctx.algo, ctx.max_error)
    if ctx.needs_input_grad[1]:
        out_f, in_f = weight.shape
        dw = op(dy.reshape(-1, out_f).t().contiguous(), x.reshape(-1, in_f).contiguous(),
                ctx.algo, ctx.max_error)
    return dx, dw, None, None


_registered: list = []


def register() -> None:
    """Register ``torch.ops.lcmac.matmul`` (imports torch; idempotent)."""
    if _registered:
        return
    with _lock:
        if _registered:
            return
        op = define_op("lcmac::matmul", _op_impl, OP_SCHEMA, _op_fake, _backward, _setup_context)
        lin = define_op("lcmac::linear", _linear_impl, LINEAR_SCHEMA, _linear_fake, _linear_backward,
                        _setup_context)
        _registered.extend([op, lin])


if "torch" in sys.modules:
    register()
