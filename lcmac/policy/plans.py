"""``Plan``: what runs for one product C[M×N] = A[M×K]·B[K×N], and why.

Every decision lcmac makes for a product is a ``Plan``: ``lcmac.matmul`` and ``lcmac.ops.plan``,
``lcmac.auto(...).plan``, ``lcmac.optimize``'s layers, ``lcmac select --measured`` and
``lcmac export`` all read one.  Two of its fields name algorithms:

- ``decision``: what the decision chose ("vendor", "gemm", an LCMA, or the algorithm asked for);
- ``runs``: what the caller then runs.  They differ where the chosen kernel cannot run there
  (``lcmac.auto`` without its artifact), where lcmac's plain GEMM was not measured faster than
  the vendor's at the shape, or where every row bucket of the shape gives its rows to the
  vendor GEMM; ``why`` says which.

``kernels`` says where the lcmac kernels that run come from, because ``lcmac.matmul`` and
``lcmac.auto`` take them from different places (``JIT``: kernels per row bucket, compiled into
the kernel cache on first use; ``lcmac.auto``: artifacts of the exact shape).
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, is_dataclass
from types import MappingProxyType
from typing import Mapping

from lcmac.artifact.tuning_log import GEMM, VENDOR

__all__ = ["AUTO", "GEMM", "VENDOR", "JIT", "Piece", "Plan"]

#: ``algo`` for the decision per shape (the tuning logs, else the model)
AUTO = "auto"
#: ``Plan.kernels`` of ``lcmac.matmul``: one kernel per row bucket and N×K, compiled on first use
JIT = "kernels per row bucket, compiled into the kernel cache on first use (lcmac.matmul)"


@dataclass(frozen=True)
class Piece:
    """``rows`` consecutive rows of A and C, run as one product of ``bucket`` rows (padded
    where ``rows < bucket``) by ``runs``: the plan's algorithm or "vendor"."""
    rows: int
    bucket: int
    runs: str

    def to_dict(self) -> dict:
        return {"rows": self.rows, "bucket": self.bucket, "runs": self.runs}


@dataclass(frozen=True)
class Plan:
    """What runs for C[M×N] = A[M×K]·B[K×N] (``shape`` = (M, N, K)) of ``dtype`` on ``target``,
    asked as ``algo`` ("auto", "vendor", "gemm" or an algorithm) within ``max_error`` (the
    error budget in force, × the plain GEMM's error; None: none, lifted by ``max_error=inf``;
    ``budget``: the same in words) on the tuning logs' ``regime`` records, under the float32
    precision class ``precision`` ("highest", "high", "medium"; None for other dtypes), its
    lcmac kernels multiplying in ``operands`` (the CUDA operand mode, ``CudaConfig.operands``).

    ``runs``: "vendor" (numpy.matmul / torch.matmul), "gemm" (lcmac's plain GEMM) or an LCMA;
    ``decision``: the decision's algorithm (module doc); ``speedup``: the predicted speed-up of
    what runs over lcmac's plain GEMM (the model, rescaled by the logs' measurements; None for
    the vendor GEMM or where the model does not price it); ``error``: its predicted error ÷ the
    plain GEMM's (None where not evaluated); ``source``: where the decision's times come from
    ("exact": measured at this shape; "nearest logged shape …": ratios carried from there;
    "model…": the model alone; "asked": no decision was made); ``kernels``: where the lcmac
    kernels come from ("" for a decision alone); ``pieces``: the row pieces, where the rows are
    cut into buckets (``lcmac.matmul``); ``why``: all of it in words.

    A decision made from the logs and the model also keeps its ranking: ``candidates``
    (``lcmac.costmodel.Candidate``, the decision first), the ``measurements`` (algorithm →
    seconds) it used, the ``logged_shape`` they were measured at and the LCMAs ``worth_tuning``
    (predicted faster than the decision, not measured yet).  ``vendor_api``: on a CPU, the
    vendor GEMM ("numpy.matmul" or "torch.matmul") whose records gave the decision its vendor
    time, which a vendor plan runs on numpy arrays where no measured choice of this process's
    is kept (``lcmac.runtime.cpu_vendor``); None: the CPU's chosen one."""
    shape: tuple
    dtype: str
    target: str
    algo: str
    runs: str
    decision: str
    speedup: float | None
    error: float | None
    why: str
    max_error: float | None = None
    regime: str = "burst"
    source: str = "asked"
    kernels: str = ""
    pieces: tuple = ()
    candidates: tuple = field(default=(), hash=False)
    measurements: Mapping[str, float] = field(default_factory=dict, hash=False)
    logged_shape: tuple | None = None
    worth_tuning: tuple = ()
    precision: str | None = None
    operands: str = "native"
    budget: str = ""
    vendor_api: str | None = None

    @property
    def candidate(self):
        """The decision's priced ``Candidate`` (None where no ranking was made)."""
        return self.candidates[0] if self.candidates else None

    @property
    def algorithm(self) -> str:
        """The decision's algorithm (``decision``), named as a ranked ``Candidate`` names it."""
        return self.decision

    @property
    def is_vendor(self) -> bool:
        """The decision is the vendor library's GEMM."""
        return self.decision == VENDOR

    def describe(self) -> str:
        """The decision in words: what was chosen, where its times came from, its reason, and
        what is worth tuning (``why`` adds what runs)."""
        c = self.candidate
        if c is None:
            return self.why
        src = {"model": "model only (nothing logged)", "exact": "measured at this shape"}.get(
            self.source, f"measured at the {self.source}")
        if self.regime == "sustained" and self.source != "model":
            src += ", sustained records"
        s = f"{c.algorithm} ({src}; {c.reason})"
        if self.worth_tuning:
            s += f"; not measured yet but predicted faster: {', '.join(self.worth_tuning)}"
        return s

    def kernel_shapes(self) -> list[tuple]:
        """The (bucket rows, N, K) of the kernels of ``runs`` the pieces run, each once, in
        order (the whole shape where the rows are not cut); none where the vendor GEMM runs."""
        if self.runs == VENDOR:
            return []
        if not self.pieces:             # JIT kernels come in row pieces; none for no rows
            return [] if self.kernels == JIT else [tuple(self.shape)]
        _, N, K = self.shape
        shapes = []
        for piece in self.pieces:
            s = (piece.bucket, N, K)
            if piece.runs != VENDOR and s not in shapes:
                shapes.append(s)
        return shapes

    def __reduce__(self):
        # the candidates' read-only mappings (MappingProxyType) cannot be pickled: a plan
        # travels between processes (a pool deciding shapes) with them as plain dicts
        return _plan_from, (type(self), {f.name: _portable(getattr(self, f.name)) for f in fields(self)})

    def to_dict(self) -> dict:
        return {"shape": list(self.shape), "dtype": self.dtype, "target": self.target,
                "algo": self.algo, "max_error": self.max_error, "budget": self.budget,
                "precision": self.precision, "operands": self.operands, "regime": self.regime,
                "runs": self.runs, "decision": self.decision, "speedup": self.speedup,
                "error": self.error, "source": self.source, "kernels": self.kernels,
                "pieces": [p.to_dict() for p in self.pieces], "why": self.why,
                **({"vendor_api": self.vendor_api} if self.vendor_api else {})}


# ---- pickling (Plan.__reduce__) -------------------------------------------------------------

class _ReadOnly(dict):
    """A MappingProxyType's contents in a pickle."""


@dataclass(frozen=True)
class _Rebuilt:
    """A dataclass instance holding read-only mappings, in a pickle: its class and attributes."""
    cls: type
    state: dict


def _portable(v):
    """``v`` with each MappingProxyType inside it (through tuples, lists, dicts and dataclass
    instances) a ``_ReadOnly``; ``v`` itself where it holds none."""
    if isinstance(v, MappingProxyType):
        return _ReadOnly({k: _portable(x) for k, x in v.items()})
    if type(v) in (tuple, list):
        out = type(v)(_portable(x) for x in v)
        return v if all(a is b for a, b in zip(out, v)) else out
    if type(v) is dict:
        out = {k: _portable(x) for k, x in v.items()}
        return v if all(out[k] is x for k, x in v.items()) else out
    if is_dataclass(v) and not isinstance(v, type) and hasattr(v, "__dict__"):
        state = {k: _portable(x) for k, x in vars(v).items()}
        return v if all(state[k] is x for k, x in vars(v).items()) else _Rebuilt(type(v), state)
    return v


def _restored(v):
    """``_portable`` undone: read-only mappings and the (frozen) instances holding them again."""
    if isinstance(v, _ReadOnly):
        return MappingProxyType({k: _restored(x) for k, x in v.items()})
    if isinstance(v, _Rebuilt):
        obj = v.cls.__new__(v.cls)
        obj.__dict__.update({k: _restored(x) for k, x in v.state.items()})   # past a frozen __setattr__
        return obj
    if type(v) in (tuple, list):
        return type(v)(_restored(x) for x in v)
    if type(v) is dict:
        return {k: _restored(x) for k, x in v.items()}
    return v


def _plan_from(cls, state: dict):
    return cls(**{k: _restored(v) for k, v in state.items()})
