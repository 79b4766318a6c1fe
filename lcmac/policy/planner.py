"""``plan(M, N, K, dtype, target)``: what runs for C[M×N] = A[M×K]·B[K×N], and why.

``algo`` is what was asked:

- ``"vendor"``: the vendor GEMM (numpy.matmul / torch.matmul);
- ``"gemm"`` or a catalogue name or expression (``"strassen"``, ``"winograd^2"``): that kernel,
  priced by the model; one predicted over ``max_error`` is refused;
- ``"auto"``: the measured decision (``lcmac.policy.measured``: the tuning logs, else the
  model), settled by where the caller's kernels come from (``kernels``):

  - ``JIT`` (``lcmac.matmul``): kernels are compiled per N×K for the row buckets of
    ``lcmac.spec.shape_rules.JIT_ROWS``, so the rows are cut into pieces.  A piece runs the
    chosen kernel unless the decision at its bucket gives it to the vendor GEMM; the rows
    under the smallest bucket go to the vendor GEMM; where every piece goes there, the vendor
    GEMM runs the whole product.  lcmac's plain GEMM runs only where the tuning log measured
    it at this very shape faster than the vendor's by more than a tie (``EXACT_MARGIN``):
    compiling a plain GEMM for a new shape costs seconds, for a gain only a measurement
    there vouches for.
  - a ``KernelSource`` (``lcmac.auto``'s artifacts, ``lcmac export``'s bundle): kernels of the
    exact shape; the chosen one runs where the source has it, else the vendor GEMM.

Both ask the same decision with the same defaults (the logs lcmac ships and the user's, the
burst regime, the vendor GEMM among the options, the default error budget of
``lcmac.costmodel.error_budget``, float32 precision "highest"); the ``Plan``'s ``kernels``
says which kind of kernels its ``runs`` is about.  Planning never compiles.

**Precision** (``lcmac.spec.precision``): a float32 plan decides among kernels and tuning-log
records of its precision class only.  On CUDA, "highest" prices lcmac's kernels in the fp16x2
operand mode and compares them with SGEMM records of the vendor GEMM (``"tf32": false``);
"high" and "medium" with the native (TF32) kernels and TF32 records.  A TF32 record never
stands in for SGEMM, nor the reverse.
"""
from __future__ import annotations

import dataclasses
import threading
import time
from dataclasses import dataclass
from typing import Protocol

from lcmac.artifact.build import resolve_algorithm
from lcmac.artifact.bundle import backend_kind
from lcmac.artifact import tuning_log
from lcmac.core.dtypes import normalize_model_dtype
from lcmac.core.errors import DTypeError, LcmacError
from lcmac.costmodel import model_dtype, select
from lcmac.costmodel.decision import with_errors
from lcmac.costmodel.error_budget import ErrorBudget, check_budget_arg, error_budget
from lcmac.policy.devices import decision_state
from lcmac.policy.measured import EXACT_MARGIN, check_regime, decide_by_measurement
from lcmac.policy.plans import AUTO, GEMM, JIT, VENDOR, Piece, Plan
from lcmac.spec.cuda.dtypes import FP64_DTYPES
from lcmac.spec.cuda.operands import OPERAND_MODES
from lcmac.spec.precision import (
    DEFAULT_PRECISION, allows_tf32, check_operands_allowed, check_precision, operand_modes)
from lcmac.spec.shape_rules import JIT_ROWS, row_pieces
from lcmac.spec.targets import get_target, schedule_family

__all__ = ["plan", "KernelSource", "EveryKernel", "gemm_beats_vendor", "generation", "forget"]

#: the dtypes operands="fp8" quantises (lcmac.spec.cuda.operands.check_operands)
FP8_INPUTS = ("bfloat16", "float16")


class KernelSource(Protocol):
    """Where a caller's kernels of one exact shape come from (``lcmac.auto``'s artifacts)."""

    #: in words, for ``Plan.kernels``
    kernel_source: str
    #: (optional) the CUDA operand modes its kernels come in; without it, native only: a
    #: decision in another mode (float32 under precision "highest") then runs the vendor GEMM
    operand_modes: tuple

    def missing_kernel(self, algorithm: str, target: str, dtype: str, shape: tuple) -> str | None:
        """Why that kernel cannot run here (and how to get it), or None where it can.  Never
        compiles: a source that compiles on first use returns None."""


@dataclass(frozen=True)
class EveryKernel:
    """A source with every kernel a decision may choose: a bundle compiled for its decisions,
    or a decision read on its own (``kernel_source`` "")."""
    kernel_source: str = ""
    operand_modes = OPERAND_MODES

    def missing_kernel(self, algorithm, target, dtype, shape):
        return None


_lock = threading.Lock()
#: plans of lcmac.matmul's kernels on the default logs, by everything they depend on
_plans: dict[tuple, Plan] = {}

# ---- what kept decisions rest on ----------------------------------------------------------------
#: how long ``generation`` trusts the tuning logs' state before it looks again: a stat per log
#: file costs microseconds, which a call that goes straight to the vendor GEMM cannot pay
RECHECK_S = 0.01
_generation = 0
_plans_seen: dict = _plans
#: (target, dtype) → the logs' state (``decision_state``) its last decision read
_watched: dict[tuple, tuple] = {}
_next_check = 0.0
_appended_seen = 0


def generation() -> int:
    """A number that changes whenever a decision kept outside this module (``lcmac.matmul``'s
    per-call dispatch) may no longer be what ``plan`` decides: ``forget``, a new ``_plans``
    table, a record this process appended to a tuning log (at once), or a change of the
    tuning logs of any target and dtype decided for (another process's records: their files
    are looked at every ``RECHECK_S``, and on each ``plan`` of the target and dtype).  The
    environment the decision reads is not covered: callers compare it themselves."""
    global _next_check, _appended_seen
    now = time.monotonic()
    if now >= _next_check or _plans is not _plans_seen or tuning_log.appended != _appended_seen:
        _next_check = now + RECHECK_S
        _appended_seen = tuning_log.appended
        _recheck()
    return _generation


def _recheck() -> None:
    global _generation, _plans_seen
    with _lock:
        if _plans is not _plans_seen:
            _plans_seen = _plans
            _generation += 1
        for target, dtype in list(_watched):
            _saw(target, dtype, decision_state(target, dtype))


def _saw(target: str, dtype: str, state: tuple) -> None:
    """Note the logs' state a decision read; a change moves ``generation`` on."""
    global _generation
    if _watched.setdefault((target, dtype), state) != state:
        _watched[(target, dtype)] = state
        _generation += 1


def forget() -> None:
    """Drop every kept decision (this module's plans; ``generation`` moves on, so callers that
    keep their own drop theirs): after records reach the logs by a way their files' sizes and
    times do not show, or to see them within ``RECHECK_S``."""
    global _generation
    with _lock:
        _plans.clear()
        _generation += 1


def plan(M: int, N: int, K: int, dtype="float32", target: str | None = None, *,
         algo: str = AUTO, max_error=None, precision: str | None = None, regime: str = "burst",
         logs=None, vendor: bool = True, static_b: bool = False, kernels=JIT,
         operands: str | None = None) -> Plan:
    """What runs for C[M×N] = A[M×K]·B[K×N] (module doc), without compiling or running
    anything.  ``target``: default this CPU's.  ``max_error``: an error budget, × the plain
    GEMM's error (None: the dtype's default, ``lcmac.costmodel.error_budget``; ``inf``: no
    budget).  ``precision``: the float32 precision class (``lcmac.spec.precision``; default
    "highest"; other dtypes have none).  ``regime``: "burst" or "sustained" tuning-log
    records.  ``logs``: a tuning-log directory or ``TuningDB`` (default: the logs lcmac ships
    and the user's own).
    ``vendor=False`` leaves the vendor GEMM out of the decision.  ``static_b``: B is a weight
    combined offline.  ``kernels``: ``JIT`` (``lcmac.matmul``'s) or a ``KernelSource``.
    ``operands``: the CUDA operand mode to decide in where it is not the precision's
    (``"fp8"``: bfloat16/float16 quantised to block-scaled E4M3, only ever when asked, as it
    changes precision; its records and its vendor baseline are the fp8 ones)."""
    target = target or get_target("host").name
    dtype = normalize_model_dtype(str(dtype).replace("torch.", ""))
    max_error = check_budget_arg(max_error)
    precision = _precision_of(dtype, precision)
    operands = _operands_of(target, dtype, precision, operands)
    budget = error_budget(max_error, model_dtype(target, dtype, operands))
    check_regime(regime)
    ask = dict(max_error=max_error, precision=precision, regime=regime, logs=logs, vendor=vendor,
               static_b=static_b, operands=operands)
    key = (int(M), int(N), int(K), dtype, target, algo, budget, precision, regime, vendor,
           static_b, operands)
    jit = kernels == JIT
    cached = logs is None and jit
    if cached:
        state = decision_state(target, dtype)
        _saw(target, dtype, state)
        key += (state,)                            # records added since: decided again
        hit = _plans.get(key)
        if hit is not None:
            return hit
    shape = key[:3]
    # float64 on CUDA: lcmac's fp64 kernels run when named; the decision does not price it
    unpriced = algo == AUTO and dtype in FP64_DTYPES and schedule_family(target) == "cuda"
    if algo == VENDOR or unpriced:
        p = Plan(shape, dtype, target, algo, VENDOR, VENDOR, None, 1.0,
                 "the vendor GEMM, as asked (algo=\"vendor\")" if not unpriced else
                 f"the vendor GEMM: the decision does not price {dtype} on {target} (a named "
                 f"algorithm runs lcmac's {dtype} kernels)", regime=regime,
                 kernels="" if jit else kernels.kernel_source)
    elif algo != AUTO:
        p = _plan_forced(shape, dtype, target, algo, budget, regime, operands)
        p = _with_pieces(p, ask) if jit else \
            dataclasses.replace(p, kernels=kernels.kernel_source)
    else:
        dec = decide_by_measurement(*shape, dtype, target, db=logs, vendor=vendor,
                                    max_error=budget.max_error, regime=regime, static_b=static_b,
                                    operands=operands, precision=precision)
        dec = dataclasses.replace(dec, operands=operands)
        p = _plan_jit(dec, ask) if jit else _plan_from_source(dec, kernels)
    p = _with_terms(p, budget, precision, operands)
    if not cached:
        return p
    with _lock:
        return _plans.setdefault(key, p)


def _precision_of(dtype: str, precision) -> str | None:
    """The float32 class a plan decides under (None for other dtypes, which have none)."""
    if precision is not None:
        check_precision(precision)
    return (precision or DEFAULT_PRECISION) if dtype == "float32" else None


def _operands_of(target: str, dtype: str, precision, operands) -> str:
    """The operand mode a plan prices: ``operands`` where asked (checked), else the first of
    the precision class's (``lcmac.spec.precision.operand_modes``)."""
    if operands is None:
        return operand_modes(target, dtype, precision)[0]
    if operands not in OPERAND_MODES:
        raise LcmacError(f"operands must be one of {', '.join(OPERAND_MODES)}, not {operands!r}")
    if operands == "fp8" and (schedule_family(target) != "cuda" or dtype not in FP8_INPUTS):
        raise DTypeError(f"operands='fp8' quantises {' and '.join(FP8_INPUTS)} products on CUDA "
                         f"targets, not {dtype} on {target}")
    return check_operands_allowed(operands, target, dtype, precision)


def _with_terms(p: Plan, budget: ErrorBudget, precision, operands: str) -> Plan:
    """``p`` with the terms it was decided under: the error budget in force and the float32
    precision class, in its fields and, where they bound the choice, at the end of ``why``."""
    terms = [] if p.algo == VENDOR else [budget.describe()]
    if precision is not None and schedule_family(p.target) == "cuda":
        vendor = "TF32 allowed" if allows_tf32(precision) else "no TF32: the vendor GEMM is SGEMM"
        terms.append(f"float32 precision {precision!r} ({vendor}; lcmac's kernels in {operands} "
                     f"operands)")
    if operands == "fp8":
        terms.append("fp8 operands, as asked (E4M3, block-scaled: lcmac.spec.fp8); the vendor "
                     "GEMM is torch's FP8 GEMM on the same quantisation")
    why = "; ".join([p.why] + terms)
    return dataclasses.replace(p, max_error=budget.max_error, budget=budget.describe(),
                               precision=precision, operands=operands, why=why)


def gemm_beats_vendor(dec: Plan) -> bool:
    """Whether the tuning log measured lcmac's plain GEMM and the vendor GEMM at this very shape
    (not carried from another), the plain GEMM faster by more than a tie (``EXACT_MARGIN``)."""
    m = dec.measurements
    return (dec.source == "exact" and GEMM in m and VENDOR in m
            and m[GEMM] < m[VENDOR] * (1 - EXACT_MARGIN))


# ---- "auto" -------------------------------------------------------------------------------------
def _plan_jit(dec: Plan, ask: dict) -> Plan:
    """The decision settled for lcmac.matmul's bucket kernels (module doc)."""
    c = dec.candidate
    base = dataclasses.replace(dec, kernels=JIT)
    if c.is_gemm and gemm_beats_vendor(dec):
        return _with_pieces(dataclasses.replace(
            base, runs=GEMM, speedup=1.0, error=1.0,
            why=f"lcmac's plain GEMM, measured faster than the vendor GEMM at this shape: "
                f"{dec.describe()}"), ask)
    if dec.is_vendor or c.is_gemm:
        what = "the vendor GEMM was chosen" if dec.is_vendor else \
            ("lcmac's plain GEMM was chosen (no LCMA predicted to win), but not measured faster "
             "than the vendor's at this shape, where lcmac.matmul would compile it")
        return dataclasses.replace(base, runs=VENDOR, speedup=None, error=1.0,
                                   why=f"vendor GEMM: {what}: {dec.describe()}")
    chosen = dataclasses.replace(base, speedup=float(c.speedup_vs_gemm),
                                 error=_error_of(c, dec.target, dec.dtype, dec.shape[2],
                                                 dec.operands))
    return _vendor_if_every_piece_is(_with_pieces(chosen, ask))


def _plan_from_source(dec: Plan, source: KernelSource) -> Plan:
    """The decision settled for kernels of the exact shape from ``source``."""
    base = dataclasses.replace(dec, kernels=source.kernel_source)
    if dec.is_vendor:
        return base
    if dec.operands not in getattr(source, "operand_modes", ("native",)):
        missing = (f"its kernels there are native-operand ones, not {dec.operands} ones, which "
                   f"this float32 precision needs")
    else:
        missing = source.missing_kernel(dec.decision, dec.target, dec.dtype, dec.shape)
    if missing is None:
        return base
    return dataclasses.replace(base, runs=VENDOR, speedup=None,
                               why=f"vendor GEMM: {dec.decision} was chosen ({dec.describe()}) "
                                   f"but {missing}")


def _bucket_runs_kernel(p: Plan, shape, ask: dict) -> bool:
    """Whether the decision at bucket ``shape`` leaves its rows to ``p``'s kernel (it does not
    where it gives them to the vendor GEMM)."""
    return plan(*shape, p.dtype, p.target, algo=AUTO, **ask).runs != VENDOR


def _with_pieces(p: Plan, ask: dict) -> Plan:
    """``p`` with the row pieces lcmac.matmul cuts its rows into (``JIT_ROWS``): each runs
    ``p``'s algorithm, except, for "auto", the padded rows under the smallest bucket and any
    piece whose bucket the decision gives to the vendor GEMM."""
    M, N, K = p.shape
    pieces = []
    for piece in row_pieces(M, JIT_ROWS[backend_kind(p.target)]):
        shape = (piece.bucket, N, K)
        vendor = p.algo == AUTO and (piece.padded or (
            shape != tuple(p.shape) and not _bucket_runs_kernel(p, shape, ask)))
        pieces.append(Piece(piece.rows, piece.bucket, VENDOR if vendor else p.runs))
    return dataclasses.replace(p, kernels=JIT, pieces=tuple(pieces))


def _vendor_if_every_piece_is(p: Plan) -> Plan:
    """``p``, or the vendor GEMM where the rows are cut into buckets (M is not one) and every
    piece goes to the vendor GEMM: the plan then says what runs."""
    M = p.shape[0]
    pieces = p.pieces
    if (len(pieces) == 1 and pieces[0].bucket == M) or any(x.runs != VENDOR for x in pieces):
        return p
    cut = "+".join(str(x.rows) for x in pieces)
    return dataclasses.replace(
        p, runs=VENDOR, speedup=None, error=1.0,
        why=f"vendor GEMM: {p.runs} was chosen for the whole shape, but its {M} rows are cut "
            f"into buckets ({cut}) and the decision at each gives its rows to the vendor GEMM, "
            f"which runs them as one call: {p.why}")


# ---- a forced algorithm -------------------------------------------------------------------------
def _error_of(cand, target: str, dtype: str, K: int, operands: str) -> float | None:
    if cand.error_ratio is not None:
        return float(cand.error_ratio)
    try:
        return float(with_errors([cand], model_dtype(target, dtype, operands), operands,
                                 K)[0].error_ratio)
    except (LcmacError, ValueError, TypeError):
        return None           # a dtype or operand mode the accuracy model does not cover


def _plan_forced(shape, dtype, target, algo, budget: ErrorBudget, regime, operands: str) -> Plan:
    """The algorithm asked for, priced by the model in ``operands``; refused over the error
    budget."""
    M, N, K = shape
    _, plain, name = resolve_algorithm(algo)
    if plain:
        return Plan(shape, dtype, target, algo, GEMM, GEMM, 1.0, 1.0,
                    "lcmac's plain GEMM, as asked (algo=\"gemm\")", regime=regime)
    speedup = error = None
    note = "the model does not price it at this shape"
    try:
        cands = select(M, N, K, model_dtype(target, dtype, operands), target, algorithms=[name],
                       operands=operands)
        c = next((c for c in cands if c.algorithm == name), None)
    except (LcmacError, ValueError):
        c = None
    if c is not None:
        speedup, error = float(c.speedup_vs_gemm), _error_of(c, target, dtype, K, operands)
        note = f"model: {speedup:.3f}× the plain GEMM"
        if error is not None:
            note += f", predicted error {error:.2f}× the GEMM's"
    limit = budget.max_error
    if limit is not None and error is not None and error > limit:
        which = " (the default budget)" if budget.source == "default" else ""
        raise LcmacError(f"{name} is predicted at {error:.2f}× the plain GEMM's error at "
                         f"{M}x{N}x{K} {dtype}, over max_error={limit:g}{which}; pass "
                         f"algo=\"auto\" to choose within the budget, or max_error=float(\"inf\") "
                         f"to lift it")
    return Plan(shape, dtype, target, algo, name, name, speedup, error,
                f"{name}, as asked (algo={algo!r}); {note}", regime=regime)
