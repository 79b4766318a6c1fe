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
burst regime, the vendor GEMM among the options, no error budget); the ``Plan``'s
``kernels`` says which kind of kernels its ``runs`` is about.  Planning never compiles.
"""
from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass
from typing import Protocol

from lcmac.artifact.build import resolve_algorithm
from lcmac.artifact.bundle import backend_kind
from lcmac.core.dtypes import normalize_model_dtype
from lcmac.core.errors import LcmacError
from lcmac.costmodel import model_dtype, select
from lcmac.costmodel.decision import check_error_budget, with_errors
from lcmac.policy.measured import EXACT_MARGIN, check_regime, decide_by_measurement
from lcmac.policy.plans import AUTO, GEMM, JIT, VENDOR, Piece, Plan
from lcmac.spec.shape_rules import JIT_ROWS, row_pieces
from lcmac.spec.targets import get_target

__all__ = ["plan", "KernelSource", "EveryKernel", "gemm_beats_vendor"]


class KernelSource(Protocol):
    """Where a caller's kernels of one exact shape come from (``lcmac.auto``'s artifacts)."""

    #: in words, for ``Plan.kernels``
    kernel_source: str

    def missing_kernel(self, algorithm: str, target: str, dtype: str, shape: tuple) -> str | None:
        """Why that kernel cannot run here (and how to get it), or None where it can.  Never
        compiles: a source that compiles on first use returns None."""


@dataclass(frozen=True)
class EveryKernel:
    """A source with every kernel a decision may choose: a bundle compiled for its decisions,
    or a decision read on its own (``kernel_source`` "")."""
    kernel_source: str = ""

    def missing_kernel(self, algorithm, target, dtype, shape):
        return None


_lock = threading.Lock()
#: plans of lcmac.matmul's kernels on the default logs, by everything they depend on
_plans: dict[tuple, Plan] = {}


def plan(M: int, N: int, K: int, dtype="float32", target: str | None = None, *,
         algo: str = AUTO, max_error=None, regime: str = "burst", logs=None, vendor: bool = True,
         static_b: bool = False, kernels=JIT) -> Plan:
    """What runs for C[M×N] = A[M×K]·B[K×N] (module doc), without compiling or running
    anything.  ``target``: default this CPU's.  ``max_error``: an error budget, × the plain
    GEMM's error.  ``regime``: "burst" or "sustained" tuning-log records.  ``logs``: a
    tuning-log directory or ``TuningDB`` (default: the logs lcmac ships and the user's own).
    ``vendor=False`` leaves the vendor GEMM out of the decision.  ``static_b``: B is a weight
    combined offline.  ``kernels``: ``JIT`` (``lcmac.matmul``'s) or a ``KernelSource``."""
    target = target or get_target("host").name
    dtype = normalize_model_dtype(str(dtype).replace("torch.", ""))
    max_error = None if max_error is None else check_error_budget(max_error)
    check_regime(regime)
    ask = dict(max_error=max_error, regime=regime, logs=logs, vendor=vendor, static_b=static_b)
    key = (int(M), int(N), int(K), dtype, target, algo, max_error, regime, vendor, static_b)
    jit = kernels == JIT
    cached = logs is None and jit
    if cached:
        hit = _plans.get(key)
        if hit is not None:
            return hit
    shape = key[:3]
    if algo == VENDOR:
        p = Plan(shape, dtype, target, algo, VENDOR, VENDOR, None, 1.0,
                 "the vendor GEMM, as asked (algo=\"vendor\")", max_error=max_error,
                 regime=regime, kernels="" if jit else kernels.kernel_source)
    elif algo != AUTO:
        p = _plan_forced(shape, dtype, target, algo, max_error, regime)
        p = _with_pieces(p, ask) if jit else \
            dataclasses.replace(p, kernels=kernels.kernel_source)
    else:
        dec = decide_by_measurement(*shape, dtype, target, db=logs, vendor=vendor,
                                    max_error=max_error, regime=regime, static_b=static_b)
        p = _plan_jit(dec, ask) if jit else _plan_from_source(dec, kernels)
    if not cached:
        return p
    with _lock:
        return _plans.setdefault(key, p)


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
                                 error=_error_of(c, dec.target, dec.dtype, dec.shape[2]))
    return _vendor_if_every_piece_is(_with_pieces(chosen, ask))


def _plan_from_source(dec: Plan, source: KernelSource) -> Plan:
    """The decision settled for kernels of the exact shape from ``source``."""
    base = dataclasses.replace(dec, kernels=source.kernel_source)
    if dec.is_vendor:
        return base
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
def _error_of(cand, target: str, dtype: str, K: int) -> float | None:
    if cand.error_ratio is not None:
        return float(cand.error_ratio)
    try:
        return float(with_errors([cand], model_dtype(target, dtype), "native", K)[0].error_ratio)
    except (LcmacError, ValueError, TypeError):
        return None           # a dtype or operand mode the accuracy model does not cover


def _plan_forced(shape, dtype, target, algo, max_error, regime) -> Plan:
    """The algorithm asked for, priced by the model; refused over the error budget."""
    M, N, K = shape
    _, plain, name = resolve_algorithm(algo)
    if plain:
        return Plan(shape, dtype, target, algo, GEMM, GEMM, 1.0, 1.0,
                    "lcmac's plain GEMM, as asked (algo=\"gemm\")", max_error=max_error,
                    regime=regime)
    speedup = error = None
    note = "the model does not price it at this shape"
    try:
        cands = select(M, N, K, model_dtype(target, dtype), target, algorithms=[name])
        c = next((c for c in cands if c.algorithm == name), None)
    except (LcmacError, ValueError):
        c = None
    if c is not None:
        speedup, error = float(c.speedup_vs_gemm), _error_of(c, target, dtype, K)
        note = f"model: {speedup:.3f}× the plain GEMM"
        if error is not None:
            note += f", predicted error {error:.2f}× the GEMM's"
    if max_error is not None and error is not None and error > max_error:
        raise LcmacError(f"{name} is predicted at {error:.2f}× the plain GEMM's error at "
                         f"{M}x{N}x{K} {dtype}, over max_error={max_error:g}; pass algo=\"auto\" "
                         f"to choose within the budget, or no max_error")
    return Plan(shape, dtype, target, algo, name, name, speedup, error,
                f"{name}, as asked (algo={algo!r}); {note}", max_error=max_error, regime=regime)
