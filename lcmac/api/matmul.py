"""``lcmac.matmul``: C = A @ B for numpy arrays and torch tensors of any shape, and the torch
op ``torch.ops.lcmac.matmul`` behind it for torch tensors.

    C = lcmac.matmul(A, B)                          # …×M×K @ K×N → …×M×N
    C = lcmac.matmul(A, B, algo="strassen")         # that kernel, whatever the model says
    C = lcmac.matmul(A, B, max_error=4.0)           # only LCMAs predicted within 4× the GEMM's error
    C = lcmac.matmul(A, B, precision="high")        # numpy float32: TF32-class products allowed

A's leading dimensions are flattened into the rows: the product runs as one (∏…·M)×K @ K×N.

**The choice** (``algo="auto"``) is ``lcmac.policy.plan``'s per shape, from the tuning logs and
the model, once per shape in the process.  Where it picks an LCMA, that kernel runs; where it
picks the vendor GEMM, ``numpy.matmul`` / ``torch.matmul`` runs.  Where it picks lcmac's plain
GEMM, that kernel runs only if the tuning log measured it at this very shape faster than the
vendor's by more than a tie, else the vendor GEMM (``lcmac.policy.planner``).
``algo="gemm"`` forces lcmac's plain GEMM, ``algo="vendor"`` the vendor GEMM, any catalogue
name or expression (``"strassen"``, ``"winograd^2"``) that LCMA; ``plan()`` tells what runs
for a shape and why, without running it.

**Repeated calls.**  A call decided for the vendor GEMM is kept by its operands' kind, shapes,
dtypes and devices, its arguments and torch's float32 class; a repeat is one lookup, then
``torch.matmul(A, B)`` (numpy arrays: the CPU's chosen vendor GEMM), the very call torch would
make.  Anything else the decision reads moving decides again: the environment it reads
(``LCMAC_DEVICE``, ``LCMAC_TUNING_LOGS``, ``LCMAC_CACHE_DIR``, ``LCMAC_CPU_VENDOR``), new
tuning-log records (seen by the next ``plan`` of that dtype, and by any call once
``lcmac.policy.planner.RECHECK_S`` has passed; ``lcmac.policy.planner.forget()`` drops every
kept decision at once), the CPU vendor choices (``lcmac.runtime.cpu_vendor.forget``).

**The terms of the choice.**  An error budget (``max_error``, × the plain GEMM's error)
bounds "auto": by default the dtype's (``lcmac.costmodel.error_budget``), ``inf`` lifts it.
float32 runs under a precision class (``lcmac.spec.precision``): torch's own setting for
torch tensors (``torch.set_float32_matmul_precision``), ``precision=`` for numpy arrays,
default "highest" (no TF32: on CUDA lcmac's kernels then multiply through fp16x2 operands
and the vendor GEMM is SGEMM).

**Kernels per N×K, not per shape.**  Kernels are compiled for fixed sizes, so the rows are
cut by a ladder of bucket row counts (``lcmac.spec.shape_rules.JIT_ROWS``: 4096…256 on CPUs,
65536…1024 on CUDA; largest first, each piece a slice of A and C, no copy).  The first call
that needs a bucket kernel for an N×K compiles it (a few seconds on a CPU, in a worker
process) into the kernel cache (``lcmac.artifact.cache``: ``$LCMAC_CACHE_DIR/kernels``, default
``~/.cache/lcmac/kernels``); later calls, in this process or another, load it: at most one
kernel per bucket and N×K, whatever the row counts seen.  With "auto" the rows under the
smallest bucket, and any piece the decision at its bucket gives to the vendor, run on the
vendor GEMM; a forced algorithm pads them into its smallest bucket.  On CUDA, where the
rows are not one whole bucket, one kernel per N×K whose row count is a run-time value
(``lcmac.schedules.cuda.rows``) runs the pieces instead, adjacent ones as one call and
nothing padded, where its template has that form (else the bucket kernels);
``LCMAC_DYNAMIC_ROWS=1`` uses it for every row count, ``0`` never.  With
``LCMAC_CACHE_DIR=off`` nothing is compiled: "auto" runs the vendor GEMM (with a warning),
a forced algorithm raises.

**The torch op.**  ``torch.ops.lcmac.matmul(A, B, algo="auto", max_error=None)`` is a
``torch.library.custom_op`` with a fake (shape-only) implementation, so ``torch.compile``
traces it without a graph break, and an autograd formula whose two products run through the
op again (dA = dC·Bᵀ, dB = Aᵀ·dC: an LCMA may serve those shapes too).  It is registered when
this module is imported with torch already imported, on the first ``lcmac.matmul`` of a torch
tensor, or by ``register()``; ``import lcmac`` never imports torch.

**Any layout**, as numpy and torch take it: a transposed, Fortran-ordered, sliced or reversed
operand runs on a row-major copy where a kernel reads it (the vendor GEMM takes it as it is),
and a strided ``out`` receives the kernel's result by a copy.

**A B that does not change** (a layer's weight): ``mark_static(B)`` lets an artifact that
can combine B once (``prepare_b``: CUDA artifacts and CPU artifacts built by this lcmac) keep
the prepared form, per artifact, until a write reaches B's memory (``lcmac.api.tensor_watch``:
writes through ``.data`` too, which the version counter misses).
"""
import logging
import os
import sys
import threading
from collections import OrderedDict
import weakref
from dataclasses import dataclass

import numpy as np

from lcmac import policy
from lcmac.api.call_args import AUTO, GEMM, VENDOR, check_algo, define_op, target_for  # noqa: F401 (ops.* names)
from lcmac.api.call_args import LOADED, float32_precision
from lcmac.api.tensor_watch import Snapshot, memory_key, snapshot
from lcmac.artifact.bundle import backend_kind
from lcmac.costmodel.error_budget import check_budget_arg
from lcmac.core.dtypes import normalize_dtype
from lcmac.core.environ import reader
from lcmac.core.errors import DTypeError, LcmacError, ShapeError
from lcmac.core.user_warning import warn_user
from lcmac.core.operands import (
    check_array, check_matrices, check_one_dtype, check_out, check_real, check_same_device,
    check_same_kind, device_type, dtype_name, is_contiguous, operand_kind, row_major)
from lcmac.runtime.cuda_memory import kept_empty
from lcmac.runtime.tiled import assign, empty, run_row_ranges, run_rows
from lcmac.policy import Plan
from lcmac.policy.planner import generation as plan_generation
from lcmac.runtime import cpu_vendor, vendor as _vendor_module
from lcmac.runtime.vendor import vendor_matmul
from lcmac.spec.cuda.dtypes import FP64_DTYPES
from lcmac.spec.precision import torch_precision
from lcmac.spec.shape_rules import JIT_ROWS
from lcmac.spec.targets import get_target

__all__ = ["matmul", "plan", "Plan", "register", "mark_static", "transposed_weight", "kernel",
           "kernel_keys", "release_kernels", "compute",
           "check_operands", "OP_SCHEMA"]

#: the dtypes lcmac.matmul takes (further limited by the target: CPU float32, float64 and,
#: on x86_64-avx512, bfloat16; CUDA bfloat16, float16, float32, and float64 for a named
#: algorithm: ``supported_dtypes``)
DTYPES = ("float32", "float64", "bfloat16", "float16")
OP_SCHEMA = '(Tensor A, Tensor B, str algo="auto", float? max_error=None) -> Tensor'
#: torch.ops.lcmac.linear: y = x·Wᵀ with W as nn.Linear holds it (out × in)
LINEAR_SCHEMA = '(Tensor x, Tensor weight, str algo="auto", float? max_error=None) -> Tensor'
#: weights whose contiguous transpose is kept (least recently used dropped first)
MAX_TRANSPOSED = 256
#: prepared forms kept per static B (one per bucket kernel)
MAX_PREPARED = 8

#: kernel()'s ``rows`` for one kernel per N×K whose row count is a run-time value
DYNAMIC_ROWS = "dynamic_rows"
#: the environment switch for them in the JIT on CUDA (docs/shape-rules.md)
DYNAMIC_ROWS_ENV = "LCMAC_DYNAMIC_ROWS"

log = logging.getLogger(__name__)
_lock = threading.RLock()     # re-entrant: a weakref callback (mark_static) may fire under it
_kernels = LOADED             # shared with lcmac.bmm's batched kernels
_failed: dict[tuple, str] = {}


# ---- operands ---------------------------------------------------------------------------------
_supported: dict[str, tuple] = {}      # per call on the hot path; the target table is static


def supported_dtypes(target: str) -> tuple:
    """The dtypes lcmac.matmul takes on ``target``: the target's, and on CUDA float64 (the
    fp64 tensor-core kernels), which only a named algorithm runs there; "auto" leaves it to
    the vendor's DGEMM, as it does every dtype the decision does not price (``check_operands``)."""
    ok = _supported.get(target)
    if ok is None:
        t = get_target(target)
        extra = FP64_DTYPES if t.family == "cuda" else ()
        ok = _supported[target] = tuple(d for d in t.dtypes + extra if d in DTYPES)
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


def check_operands(A, B, *, vendor: bool = False) -> _Operands:
    """Check A (…×M×K) and B (K×N) for lcmac.matmul; errors name the problem.  Any layout
    passes (a kernel gets row-major copies, ``lcmac.core.operands.row_major``).  ``vendor``:
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
    rows = tuple(int(d) for d in A.shape[:-1])
    # a call that may run the vendor GEMM ("auto") runs lcmac's kernels only for the dtypes the
    # decision prices on the target (its table's)
    kernels = dtype in supported_dtypes(target) and (not vendor or dtype in get_target(target).dtypes)
    return _Operands(kind, dtype, target, rows, M, N, K, kernels)


def check_budget(max_error):
    """``max_error`` as a float (None, the default budget, stays None; ``inf`` lifts the
    budget); ValueError unless positive."""
    return check_budget_arg(max_error)


def _plan_precision(target: str, dtype: str, precision):
    """The class ``plan`` decides a float32 product under: ``precision``, else on CUDA torch's
    setting (CUDA operands are torch tensors), else None (the policy's default, "highest")."""
    if precision is not None or dtype != "float32" or not target.startswith("cuda"):
        return precision
    torch = sys.modules.get("torch")
    return None if torch is None else torch_precision("cuda")


# ---- the decision -----------------------------------------------------------------------------
def plan(M: int, N: int, K: int, dtype="float32", *, algo: str = AUTO, max_error=None,
         target: str | None = None, precision: str | None = None, operands: str | None = None) -> Plan:
    """What ``lcmac.matmul`` runs for C[M×N] = A[M×K]·B[K×N] (rows flattened), and why,
    without compiling or running anything: ``lcmac.policy.plan`` for lcmac.matmul's kernels,
    for a dtype lcmac.matmul takes on ``target`` (default this CPU's).  ``precision``: the
    float32 class (module doc; default: torch's setting on a CUDA target, else "highest").
    ``operands="fp8"``: decided in the fp8 operand mode (``lcmac.nn.Linear(operands="fp8")``;
    ``lcmac.policy.plan``)."""
    algo, max_error = check_algo(algo), check_budget(max_error)
    target = target or target_for("cpu")
    dtype = _check_dtype(str(dtype).replace("torch.", ""), target, "they")
    mode = {} if operands is None else {"operands": operands}
    return policy.plan(M, N, K, dtype, target, algo=algo, max_error=max_error,
                       precision=_plan_precision(target, dtype, precision), **mode)


# ---- kernels ----------------------------------------------------------------------------------
def kernel(algo: str, target: str, dtype: str, shape, operands: str = "native", rows: str = "static"):
    """The loaded kernel of ``algo`` for (M, N, K) = ``shape`` whose products run in the CUDA
    operand mode ``operands``: from this process's table, else from the kernel cache
    (``lcmac.artifact.cache.cached_build``: compiled there on a miss, once whatever the
    threads and processes asking).  ``rows=DYNAMIC_ROWS``: the CUDA kernel whose row count is
    a run-time value (``CudaConfig.dynamic_rows``; M the most rows a launch takes)."""
    key = (algo, target, dtype, tuple(int(d) for d in shape))
    if rows == DYNAMIC_ROWS:
        config = {"dynamic_rows": True} if operands == "native" else {"operands": operands, "dynamic_rows": True}
        return _kernels.get((*key, operands, rows), key, {"config": config})
    if operands == "native":
        return _kernels.get(key, key)
    return _kernels.get((*key, operands), key, {"config": {"operands": operands}})


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
# What is kept for a weight is kept while no write has reached its memory: lcmac.api.tensor_watch
# sees writes through any tensor on it (``.data`` included), which the version counter does not.
class _Static:
    __slots__ = ("ref", "snapshot", "prepared")

    def __init__(self, ref, snap: Snapshot):
        self.ref, self.snapshot = ref, snap
        self.prepared: dict = {}      # kernel → prepared B, or None where it cannot prepare


#: memory_key of a static B → what is kept for it
_static: dict[tuple, _Static] = {}


def mark_static(B) -> None:
    """Declare the torch tensor ``B`` constant: artifacts with ``prepare_b`` keep its prepared
    form, one per artifact (at most ``MAX_PREPARED``), while no write reaches B's memory
    (``lcmac.api.tensor_watch``); after one, or once B is freed, it is dropped and B runs
    unprepared until marked again.  A B whose writes cannot be seen is not kept."""
    snap = snapshot(B)
    if snap is None:
        return
    key = memory_key(B)

    def drop(ref, key=key):
        with _lock:
            e = _static.get(key)
            if e is not None and e.ref is ref:
                del _static[key]
    with _lock:
        _static[key] = _Static(weakref.ref(B, drop), snap)


def _b_for(fn, B, kind: str):
    """B itself, or the prepared form ``fn`` keeps for a static B that has not changed."""
    prepare = getattr(fn, "prepare_b", None)
    if prepare is None or kind != "torch":
        return B
    key = memory_key(B)
    e = _static.get(key)
    if e is None:
        return B
    if not e.snapshot.unchanged(B):
        with _lock:
            if _static.get(key) is e:
                del _static[key]
        return B
    if fn not in e.prepared:
        try:
            p = prepare(B)
        except LcmacError:            # the plain GEMM, scaled operand modes: nothing to keep
            p = None
        # preparing read B through its address, which torch counts as a write: B is unchanged
        # up to here (checked above), so watch it from here on
        snap = snapshot(B)
        with _lock:
            while len(e.prepared) >= MAX_PREPARED:
                e.prepared.pop(next(iter(e.prepared)))
            e.prepared[fn] = p
            if snap is not None:
                e.snapshot = snap
            elif _static.get(key) is e:
                del _static[key]
        return B if p is None else p
    p = e.prepared.get(fn)
    return B if p is None else p


class _Transposed:
    __slots__ = ("weight", "snapshot", "wt")

    def __init__(self, weight, snap: Snapshot, wt):
        self.weight, self.snapshot, self.wt = weight, snap, wt


#: memory_key of a weight → its kept transpose.  The entry holds the weight (detached: the same
#: storage), so that its storage, whose identity the key names, lives as long as the entry.
_transposed: "OrderedDict[tuple, _Transposed]" = OrderedDict()


def transposed_weight(weight):
    """Wᵀ (in × out, contiguous) of an ``nn.Linear`` weight W (out × in), kept while no write
    reaches W's memory (``lcmac.api.tensor_watch``: an optimizer step, ``load_state_dict``,
    ``w.data.mul_(…)`` or any in-place change makes it again) and marked static, so an
    artifact that can combine B once (``prepare_b``) keeps that form too.  A weight whose
    writes cannot be seen is transposed on each call.  This runs inside
    ``torch.ops.lcmac.linear`` at call time, under ``torch.compile`` as in eager mode."""
    import torch
    if weight.is_cuda and torch.cuda.is_current_stream_capturing():
        # a CUDA graph replays without Python: a kept copy would go stale when the weight
        # changes, so the capture records the transpose itself (and B is combined in the kernel)
        return weight.t().contiguous()
    key = memory_key(weight)
    with _lock:
        e = _transposed.get(key)
        if e is not None and e.snapshot.unchanged(weight):
            _transposed.move_to_end(key)
            return e.wt
    snap = snapshot(weight)
    if snap is None:
        return weight.t().contiguous()
    # outside inference mode: the kept copy may meet autograd later (a frozen weight)
    with torch.inference_mode(False), torch.no_grad():
        # kept across calls: not from a CUDA graph's pool (runtime.cuda_memory)
        wt = kept_empty((weight.shape[1], weight.shape[0]), weight.dtype, weight.device)
        wt.copy_(weight.detach().t())
    mark_static(wt)
    with _lock:
        _transposed[key] = _Transposed(weight.detach(), snap, wt)
        _transposed.move_to_end(key)
        while len(_transposed) > MAX_TRANSPOSED:
            _transposed.popitem(last=False)
    return wt


# ---- the product ------------------------------------------------------------------------------
def kernel_keys(M: int, N: int, K: int, dtype="float32", *, algo: str = AUTO, max_error=None,
                target: str | None = None, precision: str | None = None,
                operands: str | None = None) -> list[tuple]:
    """The kernels ``lcmac.matmul`` runs for C[M×N] = A[M×K]·B[K×N], as ``kernel``'s
    arguments (algorithm, target, dtype, bucket shape, and the operand mode where it is not
    native), without compiling anything: its row pieces' buckets
    (``lcmac.spec.shape_rules``), less those the vendor GEMM takes under "auto"."""
    mode = {} if operands is None else {"operands": operands}
    p = plan(M, N, K, dtype, algo=algo, max_error=max_error, target=target, precision=precision,
             **mode)
    shapes = p.kernel_shapes()
    if shapes and _dynamic_rows(p) and _rows_key(p, p.dtype) not in _failed:
        return [_rows_key(p, p.dtype)]
    return [_kernel_key(p, p.dtype, shape) for shape in shapes]


def _dynamic_rows(p: Plan) -> bool:
    """Whether the JIT runs the plan's rows on one kernel whose row count is a run-time value
    (``lcmac.schedules.cuda.rows``) rather than on bucket kernels: on CUDA, native operands,
    where the plan's lcmac rows are not one whole bucket (a bucket's own kernel is the
    exact-shape one; other row counts would be cut into pieces or padded), or always with
    LCMAC_DYNAMIC_ROWS=1, never with 0 (docs/shape-rules.md); where that kernel cannot be
    built, the bucket kernels run."""
    if p.operands != "native" or backend_kind(p.target) != "cuda":
        return False
    switch = os.environ.get(DYNAMIC_ROWS_ENV, "")
    if switch in ("0", "1"):
        return switch == "1"
    lcma = [x for x in p.pieces if x.runs != VENDOR]
    return not (len(lcma) == 1 and lcma[0].rows == lcma[0].bucket)


def _rows_key(p: Plan, dtype: str) -> tuple:
    """``kernel``'s arguments for the plan's run-time-rows kernel: M the largest JIT bucket
    (the most rows a launch takes; more run as several launches)."""
    _, N, K = p.shape
    return (p.runs, p.target, dtype, (JIT_ROWS[backend_kind(p.target)][0], N, K), p.operands, DYNAMIC_ROWS)


def _rows_kernel(p: Plan, dtype: str):
    """The plan's run-time-rows kernel, or None where it cannot be built (remembered; the
    bucket kernels run instead)."""
    key = _rows_key(p, dtype)
    if key in _failed:
        return None
    try:
        return kernel(*key)
    except LcmacError as e:
        _failed[key] = str(e)
        log.info("lcmac.matmul: no run-time-rows kernel of %s for ?x%dx%d %s (%s: %s); bucket "
                 "kernels run instead", p.runs, key[3][1], key[3][2], dtype, type(e).__name__, e)
        return None


def _kernel_key(p: Plan, dtype: str, shape) -> tuple:
    """``kernel``'s arguments for the plan's kernel at ``shape``."""
    mode = () if p.operands == "native" else (p.operands,)
    return (p.runs, p.target, dtype, tuple(shape), *mode)


def _kernel_for(p: Plan, o: _Operands):
    """bucket shape → the plan's kernel there, or None where the vendor GEMM should run that
    piece (an automatic choice: the plan gives the bucket's piece to the vendor, or the kernel
    could not be compiled, which is warned once per shape)."""
    forced = p.algo != AUTO
    buckets = {piece.bucket for piece in p.pieces if piece.runs != VENDOR}

    def kernel_for(shape):
        key = _kernel_key(p, o.dtype, shape)
        if not forced and (key in _failed or shape[0] not in buckets):
            return None
        try:
            return kernel(*key)
        except LcmacError as e:
            if forced:
                raise
            _failed[key] = str(e)
            warn_user(f"lcmac.matmul: {p.runs} was chosen for {o.M}x{o.N}x{o.K} {o.dtype} but "
                      f"its {'x'.join(map(str, shape))} kernel could not be built "
                      f"({type(e).__name__}: {e}); the vendor GEMM runs those rows instead",
                      RuntimeWarning)
            return None
    return kernel_for


def _run_lcmac(p: Plan, A, B, out, o: _Operands):
    """Run the plan's algorithm on row pieces of the JIT ladder (lcmac.spec.shape_rules): bucket
    kernels on slices of A and C; with an automatic choice the vendor GEMM takes the rows
    under the smallest bucket and any piece where the decision prefers it; a forced
    algorithm pads them into its smallest bucket instead.  Kernels read and write row-major
    memory: a strided A or B is copied, a strided ``out`` receives the result afterwards."""
    A, B = row_major(A), row_major(B)
    C = out if out is not None and is_contiguous(out) else empty(A, (*o.rows, o.N))
    fn = _rows_kernel(p, o.dtype) if _dynamic_rows(p) else None
    if fn is not None:
        # the plan's pieces say which rows the vendor GEMM takes; the others run as one call
        ranges = [(x.rows, x.runs != VENDOR) for x in p.pieces] or [(o.M, True)]
        run_row_ranges(A.reshape(o.M, o.K), B, C.reshape(o.M, o.N), fn, ranges, N=o.N, K=o.K,
                       vendor=vendor_matmul, b_for=lambda fn, b: _b_for(fn, b, o.kind))
    else:
        run_rows(A.reshape(o.M, o.K), B, C.reshape(o.M, o.N), JIT_ROWS[backend_kind(o.target)],
                 _kernel_for(p, o),
                 N=o.N, K=o.K, vendor=None if p.algo != AUTO else vendor_matmul,
                 b_for=lambda fn, b: _b_for(fn, b, o.kind))
    if out is not None and C is not out:
        assign(out, C)
        return out
    return C


def run_planned(p: Plan, A, B, vendor):
    """C = A·B (torch tensors, A …×M×K, B K×N) by a plan made for them elsewhere
    (``lcmac.nn.Linear``'s fp8 mode: ``plan(operands="fp8")``): its bucket kernels as
    ``lcmac.matmul`` runs them, a static B's prepared form kept (``mark_static``), and
    ``vendor(a, b, out=c)`` taking the rows an automatic plan gives the vendor GEMM."""
    o = check_operands(A, B, vendor=True)
    A, B = row_major(A), row_major(B)
    C = empty(A, (*o.rows, o.N))
    run_rows(A.reshape(o.M, o.K), B, C.reshape(o.M, o.N), JIT_ROWS[backend_kind(p.target)],
             _kernel_for(p, o), N=o.N, K=o.K, vendor=None if p.algo != AUTO else vendor,
             b_for=lambda fn, b: _b_for(fn, b, o.kind))
    return C


# ---- repeated calls ---------------------------------------------------------------------------
# A call whose decision is the vendor GEMM is kept by everything the decision and the checks
# depend on; a repeat is one dict lookup, then the vendor's own call (torch.matmul(A, B), the
# CPU's chosen one for numpy arrays): the checks and the plan cost microseconds of Python,
# which small products feel.  The table is emptied when anything else a decision reads moves
# (_dispatch_table).  Layouts are not in the key: the vendor GEMM takes any layout as it is.

#: the environment a decision reads besides its arguments: the device, the logs' places, the
#: cache root (user logs, CPU vendor choices) and the CPU vendor pin
_DECISION_ENV = reader("LCMAC_DEVICE", "LCMAC_TUNING_LOGS", "LCMAC_CACHE_DIR", "XDG_CACHE_HOME",
                       "HOME", cpu_vendor.ENV)
_DISPATCH_MAX = 4096
_dispatch: dict = {}
_dispatch_token: tuple | None = None
#: torch's tensor types a repeat may skip deciding for (set once torch is imported)
_TENSORS: tuple = ()


def _dispatch_table() -> dict:
    """The kept calls, emptied first where what they rest on moved: the planner's generation
    (tuning logs, forgotten plans), the CPU vendor choices, the environment, and the functions
    that decide and run (``plan``, ``vendor_matmul``)."""
    global _dispatch, _dispatch_token
    token = (plan_generation(), cpu_vendor.generation, _DECISION_ENV(), plan, vendor_matmul)
    if token != _dispatch_token:
        _dispatch, _dispatch_token = {}, token
    return _dispatch


def _dispatch_key(A, B, algo, max_error, precision):
    """The key of a call a repeat may skip deciding for (None: not such a call): numpy arrays,
    or torch tensors with torch's float32 class, which the user may change between calls."""
    t = type(A)
    if t is np.ndarray:
        return (t, type(B), A.shape, B.shape, A.dtype, B.dtype, algo, max_error, precision)
    if t not in _TENSORS or type(B) not in _TENSORS:
        return None
    own = _torch_class(A) if A.dtype is _torch_float32 else None
    return (t, type(B), A.shape, B.shape, A.dtype, B.dtype, A.device, B.device, algo,
            max_error, precision, own)


def _torch_class(A) -> str:
    try:
        return _float32_class()
    except RuntimeError:          # the per-backend API in use: lcmac.spec.precision sums it up
        return torch_precision(A.device.type)


def _vendor_call(o: _Operands, api: str | None = None):
    """What ``vendor_matmul(A, B, api=api)`` runs for operands like ``o``'s, resolved once
    (anything put in its place is called as it is)."""
    if vendor_matmul is not _vendor_module.vendor_matmul:
        return vendor_matmul
    if o.kind == "torch":
        return _torch.matmul
    return cpu_vendor.vendor_call(o.dtype, o.M, o.N, o.K, logged=api)


def compute(A, B, algo: str = AUTO, max_error=None, out=None, precision=None):
    """The product with no autograd: what the op runs, and ``lcmac.matmul`` on numpy."""
    table = key = None
    if out is None:
        table, key = _dispatch_table(), _dispatch_key(A, B, algo, max_error, precision)
        fn = table.get(key) if key is not None else None
        if fn is not None:
            return fn(A, B)
    o = check_operands(A, B, vendor=algo in (AUTO, VENDOR))
    prec = float32_precision(A, o.dtype, precision)
    if out is not None:
        check_out(out, A, (*o.rows, o.N), any_layout=True)
    api = None
    if algo != VENDOR and o.kernels and 0 not in (o.M, o.N, o.K):
        p = plan(o.M, o.N, o.K, o.dtype, algo=algo, max_error=max_error, target=o.target,
                 precision=prec)
        if p.runs != VENDOR:
            return _run_lcmac(p, A, B, out, o)
        api = p.vendor_api
    if key is not None:
        if len(table) >= _DISPATCH_MAX:
            table.clear()
        table[key] = fn = _vendor_call(o, api)
        return fn(A, B)
    return vendor_matmul(A, B, out=out, **({"api": api} if api else {}))


def _repeat(A, B, algo, max_error, precision):
    """The kept vendor call of an earlier ``lcmac.matmul`` like this one, else None: never
    where autograd records the product or torch.compile traces it (the op runs there)."""
    if type(max_error) is not float and max_error is not None:
        return None               # checked and converted the long way, then kept
    t = type(A)
    if t is np.ndarray:
        key = (t, type(B), A.shape, B.shape, A.dtype, B.dtype, algo, max_error, precision)
    else:                         # _dispatch_key's, inline: this runs on every call
        if t not in _TENSORS or type(B) not in _TENSORS:
            return None
        if (_grad_enabled() and (A.requires_grad or B.requires_grad)) or _is_compiling():
            return None
        dtype = A.dtype
        own = None
        if dtype is _torch_float32:
            try:
                own = _float32_class()
            except RuntimeError:
                own = torch_precision(A.device.type)
        key = (t, type(B), A.shape, B.shape, dtype, B.dtype, A.device, B.device, algo,
               max_error, precision, own)
    # _dispatch_table's, inline
    token = (plan_generation(), cpu_vendor.generation, _DECISION_ENV(), plan, vendor_matmul)
    if token != _dispatch_token:
        return None
    try:
        return _dispatch.get(key)
    except TypeError:             # an unhashable argument: refused the long way
        return None


def matmul(A, B, *, algo: str = AUTO, out=None, max_error=None, precision=None, devices=None,
           split="auto"):
    """C = A @ B for numpy arrays or torch tensors (CPU; CUDA where present), A of …×M×K
    (leading dimensions flattened into the rows) and B of K×N; C is …×M×N, new or ``out``.
    A [batch, M, K] and B [batch, K, N]: the batch of products (``lcmac.bmm``).

    ``devices=("cuda", "cpu")``: one 2-D product split between the GPU and the host's CPU
    (``lcmac.api.coexec``; ``split``: "auto" or the CPU's share of rows); ``algo`` is then the GPU
    side's choice, the CPU side runs the vendor GEMM.

    ``algo``: "auto" (the choice per shape, module doc), "vendor", "gemm" or an algorithm
    name or expression.  ``max_error``: an error budget for "auto", as a multiple of the
    plain GEMM's error (a forced algorithm predicted over it is refused; default: the
    dtype's, ``lcmac.costmodel.error_budget``; ``float("inf")`` lifts it).  ``precision``:
    float32's class, "highest" (default for numpy arrays), "high" or "medium"; torch tensors
    run under torch's own setting, which an explicit ``precision`` must match (module doc).
    Torch tensors go through ``torch.ops.lcmac.matmul`` (autograd and torch.compile work)
    unless ``out`` is given, which records no gradient, and in eager mode when nothing needs
    a gradient (the same computation without the op's dispatch).  Operands may have any
    layout (module doc) and must be of one dtype and device; errors name the problem."""
    if out is None and devices is None:
        fn = _repeat(A, B, algo, max_error, precision)
        if fn is not None:
            return fn(A, B)
    algo, max_error = check_algo(algo), check_budget(max_error)
    if getattr(B, "ndim", 2) == 3:             # a batch of products: lcmac.bmm
        if devices is not None or max_error is not None:
            raise LcmacError("a batched product (3-D B) takes neither devices= nor max_error=")
        from lcmac.api.bmm import bmm
        if precision is not None:              # checked: lcmac.bmm runs torch's class
            float32_precision(A, dtype_name(A), precision)
        return bmm(A, B, algo=algo, out=out)
    if devices is not None:
        from lcmac.api.coexec import split_product
        return split_product(
            A, B, devices, split, out=out,
            gpu_matmul=lambda a, b, out=None: matmul(a, b, algo=algo, max_error=max_error,
                                                     precision=precision, out=out),
            cpu_matmul=lambda a, b, out=None: matmul(a, b, algo=VENDOR, precision=precision,
                                                     out=out))
    if operand_kind(A) == "torch" or operand_kind(B) == "torch":
        return _torch_matmul(A, B, algo, max_error, out, precision)
    return compute(A, B, algo, max_error, out, precision)


def _torch_matmul(A, B, algo, max_error, out, precision=None):
    import torch
    if precision is not None:       # a pin on torch's own class: checked here, then torch's runs
        float32_precision(A, dtype_name(A), precision)
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
    return compute(A, B, algo, max_error)       # any layout: a kernel's operands are copied


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
        dA = op(dC, B.t(), ctx.algo, ctx.max_error)      # views: the vendor GEMM takes them
    if ctx.needs_input_grad[1]:
        K, N = B.shape
        dB = op(A.reshape(-1, K).t(), dC.reshape(-1, N), ctx.algo, ctx.max_error)
    return dA, dB, None, None


def _linear_impl(x, weight, algo=AUTO, max_error=None):
    """y = x·Wᵀ: an lcmac kernel on the kept contiguous Wᵀ, or the vendor GEMM as
    torch.nn.Linear calls it (``F.linear``: no Wᵀ copy); vendor decisions kept as compute's."""
    table, key = _dispatch_table(), _dispatch_key(x, weight, algo, max_error, None)
    fn = table.get((_LINEAR, key)) if key is not None else None
    if fn is not None:
        return fn(x, weight)
    o = check_operands(x, weight.t(), vendor=algo in (AUTO, VENDOR))
    if algo != VENDOR and o.kernels and 0 not in (o.M, o.N, o.K):
        p = plan(o.M, o.N, o.K, o.dtype, algo=algo, max_error=max_error, target=o.target,
                 precision=float32_precision(x, o.dtype))
        if p.runs != VENDOR:
            return compute(x.contiguous(), transposed_weight(weight), algo, max_error)
    fn = _torch.nn.functional.linear if vendor_matmul is _vendor_module.vendor_matmul else \
        (lambda x, w: vendor_matmul(x, w.t()))
    if key is not None:
        if len(table) >= _DISPATCH_MAX:
            table.clear()
        table[(_LINEAR, key)] = fn
    return fn(x, weight)


_LINEAR = "linear"      # tags y = x·Wᵀ's kept calls (the key holds W, not Wᵀ)


def linear(x, weight, algo: str = AUTO, max_error=None, precision=None):
    """y = x·Wᵀ as ``lcmac.nn.Linear`` computes it: through ``torch.ops.lcmac.linear``
    (autograd, torch.compile), or, in eager mode with nothing to differentiate (inference
    under ``torch.no_grad``), the same computation without the op's dispatch.  It runs under
    torch's float32 precision class; ``precision``, where given, must be that class."""
    import torch
    if precision is not None:
        float32_precision(x, dtype_name(x), precision)
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
        _set_torch()


def _set_torch() -> None:
    """The torch names the repeat of a call reads (torch is imported by now)."""
    global _torch, _torch_float32, _TENSORS, _grad_enabled, _is_compiling, _float32_class
    import torch
    _torch, _torch_float32 = torch, torch.float32
    _TENSORS = (torch.Tensor, torch.nn.Parameter)
    _grad_enabled, _is_compiling = torch.is_grad_enabled, torch.compiler.is_compiling
    _float32_class = torch.get_float32_matmul_precision


_torch = _torch_float32 = _grad_enabled = _is_compiling = _float32_class = None

if sys.modules.get("torch") is not None:     # None: torch blocked from importing
    register()
