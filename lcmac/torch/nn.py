"""lcmac inside torch models: ``lcmac.nn.Linear`` and ``lcmac.optimize(model)``.

``Linear`` is a ``torch.nn.Linear`` (same parameters, state_dict keys and initialisation)
whose product runs through ``torch.ops.lcmac.linear``: y = x·Wᵀ + b with W of
[out, in] used as B = Wᵀ of K×N = in×out.  Under ``torch.autocast`` it computes, as
``torch.nn.Linear`` does, in autocast's dtype (input, weight and bias cast to it).  ``Linear.from_linear(layer)`` shares the layer's
parameters (an optimizer holding them keeps working).

``optimize(model)`` swaps, in place, the ``nn.Linear`` layers the model predicts a win for
at a representative row count (``rows``: batch × sequence length) and returns a report of
what it swapped and why it skipped the others.  The decision at that row count
(``lcmac.policy.plan``, as ``lcmac.matmul`` makes it) is only what the report shows: every call still decides for its own shape (``lcmac.matmul``), and the first
call that needs a row bucket's kernel compiles it (seconds on a CPU; once per bucket and
weight shape, ``lcmac.spec.shape_rules``).

**The weight as B.**  The layer calls ``torch.ops.lcmac.linear(x, W)``, which runs
x·Wᵀ through ``lcmac.matmul`` with a contiguous Wᵀ kept per weight
(``lcmac.ops.transposed_weight``) and made again only when the weight changes (its storage
or version counter: ``optimizer.step()``, ``load_state_dict``, ``.to()``).  The kept Wᵀ is
marked static: an artifact that can combine B once (``prepare_b``, CUDA and CPU) keeps that
prepared form per row count.  This happens inside the op at call time, so it holds under
``torch.compile`` too.  The kept copy costs the weight's
memory once more.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from lcmac.api import matmul as ops
from lcmac.core.errors import DTypeError, TargetError
from lcmac.policy import VENDOR, plan

__all__ = ["Linear", "optimize", "OptimizeReport", "SwappedLayer", "SkippedLayer"]

#: layers with fewer input or output features are not considered (``optimize(min_size=)``)
MIN_SIZE = 256
#: the row count (batch × sequence) ``optimize`` decides at by default
ROWS = 4096


class Linear(nn.Linear):
    """``torch.nn.Linear`` computed by ``lcmac.matmul`` (module doc).  ``algo`` and
    ``max_error`` as for ``lcmac.matmul``."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None,
                 dtype=None, *, algo: str = "auto", max_error: float | None = None):
        super().__init__(in_features, out_features, bias, device, dtype)
        self.algo = ops.check_algo(algo)
        self.max_error = None if max_error is None else float(ops.check_budget(max_error))
        ops.register()

    @classmethod
    def from_linear(cls, linear: nn.Linear, *, algo: str = "auto",
                    max_error: float | None = None) -> "Linear":
        """A ``Linear`` with ``linear``'s parameters (shared, not copied) and mode."""
        w = linear.weight
        new = cls(linear.in_features, linear.out_features, bias=linear.bias is not None,
                  device="meta", dtype=w.dtype, algo=algo, max_error=max_error)
        new.weight = w
        new.bias = linear.bias
        new.train(linear.training)
        return new

    def extra_repr(self) -> str:
        budget = "" if self.max_error is None else f", max_error={self.max_error:g}"
        return f"{super().extra_repr()}, algo={self.algo!r}{budget}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.unsqueeze(0) if x.dim() == 1 else x
        weight, bias = self.weight, self.bias
        dt = _autocast_dtype(x2)
        if dt is not None:             # as torch.nn.Linear under autocast: in its precision
            x2 = x2.to(dt)
            weight = weight if weight.dtype == dt else self._weight_in(dt)
            bias = None if bias is None or bias.dtype == dt else bias.to(dt)
        y = ops.linear(x2.contiguous(), weight, self.algo, self.max_error)
        if x.dim() == 1:
            y = y.squeeze(0)
        return y if bias is None else y + bias

    def _weight_in(self, dtype) -> torch.Tensor:
        """The weight cast to autocast's dtype.  With no gradient to record (inference) the cast
        is kept while the weight is unchanged, so that the kept Wᵀ and its prepared form (module
        doc) stay valid across calls; otherwise it is cast on each call, as autocast does."""
        w = self.weight
        if torch.compiler.is_compiling() or (torch.is_grad_enabled() and w.requires_grad):
            return w.to(dtype)
        key = (w.data_ptr(), w._version, dtype)
        kept = getattr(self, "_autocast_weight", None)
        if kept is None or kept[0] != key:
            kept = (key, w.detach().to(dtype))
            self._autocast_weight = kept
        return kept[1]


def _autocast_dtype(x: torch.Tensor):
    """autocast's lower-precision dtype where autocast is on for ``x``'s device and would cast
    x (a floating tensor other than float64, as autocast's casts go), else None."""
    dev = x.device.type
    if (dev not in ("cpu", "cuda") or not x.is_floating_point() or x.dtype == torch.float64
            or not torch.is_autocast_enabled(dev)):
        return None
    return torch.get_autocast_dtype(dev)


# ---- optimize -----------------------------------------------------------------------------
@dataclass(frozen=True)
class SwappedLayer:
    """A layer ``optimize`` swapped: its shape (in, out), the decision at ``rows`` rows."""
    name: str
    shape: tuple              # (in_features, out_features) = (K, N)
    dtype: str
    target: str
    rows: int
    algorithm: str            # what runs at ``rows`` rows
    speedup: float | None     # predicted, over the plain GEMM
    error: float | None       # predicted error ÷ the plain GEMM's
    why: str                  # the decision in words

    def to_dict(self) -> dict:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype,
                "target": self.target, "rows": self.rows, "algorithm": self.algorithm,
                "speedup": self.speedup, "error": self.error, "why": self.why}


@dataclass(frozen=True)
class SkippedLayer:
    """A layer ``optimize`` left alone; ``reason``: "too small", "dtype", "device",
    "no win", "kind" (not a plain nn.Linear), "root" (the model itself)."""
    name: str
    shape: tuple
    reason: str
    why: str

    def to_dict(self) -> dict:
        return {"name": self.name, "shape": list(self.shape), "reason": self.reason, "why": self.why}


@dataclass
class OptimizeReport:
    """What ``optimize`` did: ``swapped`` and ``skipped`` layers, in the model's order."""
    rows: int
    algo: str
    max_error: float | None
    swapped: list = field(default_factory=list)
    skipped: list = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.swapped)

    @property
    def why(self) -> str:
        """One sentence: what was swapped, or why nothing was."""
        if self.swapped:
            s = f"swapped {len(self.swapped)} of {len(self.swapped) + len(self.skipped)} linear layers"
        elif not self.skipped:
            return "unchanged: the model has no nn.Linear layer"
        else:
            s = f"unchanged: none of its {len(self.skipped)} linear layers is eligible"
        if self.skipped:
            counts: dict[str, int] = {}
            for k in self.skipped:
                counts[k.reason] = counts.get(k.reason, 0) + 1
            s += " (skipped: " + ", ".join(f"{n} {r}" for r, n in counts.items()) + ")"
        return s

    def __str__(self) -> str:
        lines = [f"lcmac.optimize: {self.why}; decided at {self.rows} rows, algo={self.algo!r}"
                 + ("" if self.max_error is None else f", max_error={self.max_error:g}")]
        for s in self.swapped:
            sp = "?" if s.speedup is None else f"{s.speedup:.3f}x"
            er = "?" if s.error is None else f"{s.error:.2f}x"
            lines.append(f"  swapped {s.name} ({s.shape[0]}->{s.shape[1]}, {s.dtype}): {s.algorithm}, "
                         f"predicted speed-up {sp}, error {er} the GEMM's")
        for k in self.skipped:
            lines.append(f"  skipped {k.name or '(model)'} ({k.shape[0]}->{k.shape[1]}): "
                         f"{k.reason}: {k.why}")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {"rows": self.rows, "algo": self.algo, "max_error": self.max_error,
                "why": self.why, "swapped": [s.to_dict() for s in self.swapped],
                "skipped": [k.to_dict() for k in self.skipped]}


def _judge(name: str, layer: nn.Linear, *, rows: int, algo: str, max_error, dtype, min_size):
    """(SwappedLayer, None) or (None, SkippedLayer) for one layer."""
    shape = (layer.in_features, layer.out_features)

    def skip(reason, why):
        return None, SkippedLayer(name, shape, reason, why)
    w = layer.weight
    if isinstance(layer, Linear):
        return skip("kind", "already an lcmac.nn.Linear")
    if type(layer) is not nn.Linear:
        return skip("kind", f"a {type(layer).__module__}.{type(layer).__qualname__}, not a plain "
                            "torch.nn.Linear (its forward may differ)")
    try:
        target = ops.target_for(w.device.type)
    except TargetError as e:
        return skip("device", str(e))
    dt = str(w.dtype).replace("torch.", "")
    if dtype is not None and w.dtype != dtype:
        return skip("dtype", f"weight is {dt}; asked for {str(dtype).replace('torch.', '')}")
    if dt not in ops.supported_dtypes(target):
        return skip("dtype", f"weight is {dt}; lcmac.matmul takes "
                             f"{', '.join(ops.supported_dtypes(target))} on {target}")
    if min(shape) < min_size:
        return skip("too small", f"{min(shape)} features < min_size={min_size}")
    try:
        p = plan(rows, layer.out_features, layer.in_features, dt, target, algo=algo,
                 max_error=max_error)
    except (DTypeError, TargetError) as e:
        return skip("dtype" if isinstance(e, DTypeError) else "device", str(e))
    if p.runs == VENDOR:
        return skip("no win", f"at {rows} rows: {p.why}")
    return SwappedLayer(name, shape, dt, target, rows, p.runs, p.speedup, p.error, p.why), None


def optimize(model: nn.Module, *, max_error: float | None = None, dtype=None, algo: str = "auto",
             min_size: int = MIN_SIZE, rows: int = ROWS) -> OptimizeReport:
    """Swap ``model``'s eligible ``nn.Linear`` layers for ``lcmac.nn.Linear``, in place, and
    return an ``OptimizeReport`` (``print(report)``; ``report.why``; ``report.to_dict()``).

    Eligible: a plain ``nn.Linear`` on the CPU or a CUDA GPU, of a dtype lcmac takes there
    (and of ``dtype``, when given), with at least ``min_size`` input and output features,
    for which ``algo`` at ``rows`` rows runs an lcmac kernel: with "auto" (default), an LCMA
    the tuning logs and the model predict faster than the GEMM (within ``max_error``, an
    error budget as a multiple of the GEMM's error); with an algorithm name, that algorithm.
    A model with no eligible layer is left unchanged, and the report says why."""
    algo = ops.check_algo(algo)
    max_error = ops.check_budget(max_error)
    if dtype is not None and not isinstance(dtype, torch.dtype):
        raise DTypeError(f"dtype must be a torch.dtype (torch.float32, ...), got {dtype!r}")
    report = OptimizeReport(int(rows), algo, max_error)
    swaps = []
    for name, mod in model.named_modules():
        if not isinstance(mod, nn.Linear):
            continue
        if mod is model:
            report.skipped.append(SkippedLayer("", (mod.in_features, mod.out_features), "root",
                                               "the model itself is the layer: use "
                                               "lcmac.nn.Linear.from_linear(model)"))
            continue
        done, skipped = _judge(name, mod, rows=int(rows), algo=algo, max_error=max_error,
                               dtype=dtype, min_size=min_size)
        if skipped is not None:
            report.skipped.append(skipped)
        else:
            report.swapped.append(done)
            swaps.append(name)
    for name in swaps:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, Linear.from_linear(getattr(parent, child), algo=algo,
                                                  max_error=max_error))
    return report
