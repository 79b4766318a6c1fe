"""lcmac inside torch models: ``lcmac.nn.Linear`` and ``lcmac.optimize(model)``.

``Linear`` is a ``torch.nn.Linear`` (same parameters, state_dict keys and initialisation)
whose product runs through ``torch.ops.lcmac.linear``: y = x·Wᵀ + b with W of
[out, in] used as B = Wᵀ of K×N = in×out.  Under ``torch.autocast`` it computes, as
``torch.nn.Linear`` does, in autocast's dtype (input, weight and bias cast to it).  ``Linear.from_linear(layer)`` shares the layer's
parameters (an optimizer holding them keeps working).

``optimize(model)`` finds, for each eligible ``nn.Linear``, its crossover: the smallest row
count (batch × sequence length) of a grid up to ``max_rows`` at which the planner
(``lcmac.ops.plan``, as ``lcmac.matmul`` decides; planning never compiles) runs an lcmac
kernel (``lcmac.torch.crossover``).  It swaps, in place, every layer that has one and returns
a report of the crossovers, the predicted gains above them and why it skipped the others.
A swapped layer's ``crossover`` splits its calls: fewer rows run
``torch.nn.functional.linear`` itself, with no lcmac code on the way (a plain comparison,
which ``torch.compile`` turns into a guard), so decode and short prompts keep torch's
speed; more rows decide for their own shape (``lcmac.matmul``), and the first call that needs
a row bucket's kernel compiles it (seconds on a CPU; once per bucket and weight shape,
``lcmac.spec.shape_rules``) unless ``optimize(warmup=rows)`` or ``warm_up`` compiled it
before.  A forced algorithm has crossover 0: it runs at every row count.

**The weight as B.**  The layer calls ``torch.ops.lcmac.linear(x, W)``, which runs
x·Wᵀ through ``lcmac.matmul`` with a contiguous Wᵀ kept per weight
(``lcmac.ops.transposed_weight``) and made again only when a write reaches the weight's
memory (``lcmac.api.tensor_watch``: ``optimizer.step()``, ``load_state_dict``,
``weight.data.mul_(…)``; a new tensor, ``.to()``).  The kept Wᵀ is
marked static: an artifact that can combine B once (``prepare_b``, CUDA and CPU) keeps that
prepared form per row count.  This happens inside the op at call time, so it holds under
``torch.compile`` too.  The kept copy costs the weight's
memory once more.

**FP8** (``Linear(..., operands="fp8")``, ``optimize(model, dtype="fp8")``): a bfloat16 or
float16 layer on an sm_90 GPU multiplies in block-scaled E4M3 (docs/fp8.md): lcmac's fp8
kernels quantise x in their Combine A and keep the weight's quantised B̃ per kernel (the kept
Wᵀ above, marked static: ``prepare_b``), and return the layer's dtype.  Below its crossover,
and where the decision gives rows to the vendor or no fp8 kernel builds, it runs torch's FP8
GEMM on the same quantisation (``lcmac.torch.fp8.Fp8Weights``; not ``F.linear``).  FP8
changes precision: it runs only when asked, never by "auto", and for inference only.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from lcmac.api import matmul as ops
from lcmac.api.export import REPORT_SCHEMA
from lcmac.api.tensor_watch import snapshot
from lcmac.core.errors import DTypeError, LcmacError, ShapeError, TargetError
from lcmac.costmodel.error_budget import budget_words
from lcmac.torch import crossover as xo, fp8 as _fp8
from lcmac.torch.fast_path import attention_projections, call_swapped_layers
from lcmac.torch.warmup import compile_kernels, layer_kernels

__all__ = ["Linear", "optimize", "warm_up", "OptimizeReport", "SwappedLayer", "SkippedLayer"]

#: layers with fewer input or output features are not considered (``optimize(min_size=)``)
MIN_SIZE = 256
#: the largest row count (batch × sequence) ``optimize`` searches for a crossover by default
MAX_ROWS = 32768


class Linear(nn.Linear):
    """``torch.nn.Linear`` computed by ``lcmac.matmul`` (module doc).  ``algo`` and
    ``max_error`` as for ``lcmac.matmul``; calls of fewer rows than ``crossover`` run
    ``torch.nn.functional.linear`` instead (``optimize`` sets it).  ``operands="fp8"``: the
    products in block-scaled E4M3 (module doc), torch's FP8 GEMM under the crossover."""

    #: calls with fewer rows (the input's leading dimensions multiplied) run torch's own linear
    #: (an fp8 layer: torch's FP8 GEMM)
    crossover: int = 0
    #: "native" (the weight's dtype) or "fp8"
    operands: str = _fp8.NATIVE

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None,
                 dtype=None, *, algo: str = "auto", max_error: float | None = None,
                 operands: str = _fp8.NATIVE):
        super().__init__(in_features, out_features, bias, device, dtype)
        self.algo = ops.check_algo(algo)
        self.max_error = None if max_error is None else float(ops.check_budget(max_error))
        self.operands = _fp8.check_layer_operands(operands)
        if self.operands == _fp8.FP8:
            _fp8.check_features(in_features, out_features)
            self._fp8_weights = _fp8.Fp8Weights()
        ops.register()

    @classmethod
    def from_linear(cls, linear: nn.Linear, *, algo: str = "auto",
                    max_error: float | None = None, operands: str = _fp8.NATIVE) -> "Linear":
        """A ``Linear`` with ``linear``'s parameters (shared, not copied) and mode."""
        w = linear.weight
        new = cls(linear.in_features, linear.out_features, bias=linear.bias is not None,
                  device="meta", dtype=w.dtype, algo=algo, max_error=max_error,
                  operands=operands)
        new.weight = w
        new.bias = linear.bias
        new.train(linear.training)
        return new

    def extra_repr(self) -> str:
        budget = "" if self.max_error is None else f", max_error={self.max_error:g}"
        rows = f", crossover={self.crossover}" if self.crossover else ""
        mode = f", operands={self.operands!r}" if self.operands != _fp8.NATIVE else ""
        return f"{super().extra_repr()}, algo={self.algo!r}{budget}{mode}{rows}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.operands == _fp8.FP8:
            return self._forward_fp8(x)
        if self.crossover and _rows(x) < self.crossover:   # lcmac cannot win there: torch's own
            return F.linear(x, self.weight, self.bias)
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
        is kept while no write reaches the weight's memory, so that the kept Wᵀ and its prepared
        form (module doc) stay valid across calls; otherwise, or where its writes cannot be
        seen (``lcmac.api.tensor_watch``), it is cast on each call, as autocast does."""
        w = self.weight
        if torch.compiler.is_compiling() or (torch.is_grad_enabled() and w.requires_grad):
            return w.to(dtype)
        kept = getattr(self, "_autocast_weight", None)      # ((snapshot of w, dtype), cast)
        if kept is not None and kept[0][1] == dtype and kept[0][0].unchanged(w):
            return kept[1]
        snap = snapshot(w)
        cast = w.detach().to(dtype)
        self._autocast_weight = None if snap is None else ((snap, dtype), cast)
        return cast

    # -- fp8 (module doc) ----------------------------------------------------------------------
    @property
    def fp8_recipe(self) -> str | None:
        """The recipe of the torch FP8 GEMM this fp8 layer ran (``lcmac.torch.fp8``), None
        before it ran one."""
        return self._fp8_weights.recipe if self.operands == _fp8.FP8 else None

    @torch.compiler.disable            # kept quantised weights, kernels by address: eager
    def _forward_fp8(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        if torch.is_grad_enabled() and (x.requires_grad or w.requires_grad):
            raise LcmacError("operands='fp8' runs inference only (E4M3 products have no "
                             "backward here): call the model under torch.no_grad() or "
                             "torch.inference_mode(), or use operands='native' to train")
        target = _fp8.fp8_target(w)
        x2 = x.unsqueeze(0) if x.dim() == 1 else x
        dt = _autocast_dtype(x2)
        if dt is not None:
            x2 = x2.to(dt)
        if x2.dtype != w.dtype:
            raise DTypeError(f"this fp8 layer's weight is {str(w.dtype).replace('torch.', '')} "
                             f"and its input {str(x2.dtype).replace('torch.', '')}: give it "
                             f"inputs of the weight's dtype (the E4M3 scales are per call)")
        if x2.shape[-1] != self.in_features:
            raise ShapeError(f"this layer takes …×{self.in_features} inputs, got {tuple(x.shape)}")
        y = self._fp8_product(x2.reshape(-1, self.in_features).contiguous(), target)
        y = y.reshape(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias

    def _fp8_product(self, x2: torch.Tensor, target: str) -> torch.Tensor:
        """x2·Wᵀ [rows, out] in fp8: lcmac's kernels where the fp8 plan runs one, torch's FP8
        GEMM on the same quantisation under the crossover and for the plan's vendor rows."""
        rows = x2.shape[0]
        if rows == 0:
            return x2.new_empty((0, self.out_features))

        def baseline(a):       # its quantised weight is made on first use only
            return self._fp8_weights.of(self.weight)(a)
        if rows < self.crossover:
            return baseline(x2)
        dtype = str(self.weight.dtype).replace("torch.", "")
        p = ops.plan(rows, self.out_features, self.in_features, dtype, algo=self.algo,
                     max_error=self.max_error, target=target, operands=_fp8.FP8)
        if p.runs == ops.VENDOR:
            return baseline(x2)
        return ops.run_planned(p, x2, ops.transposed_weight(self.weight),
                               lambda a, b, out: out.copy_(baseline(a)))


def _rows(x: torch.Tensor) -> int:
    """The rows of the product a linear layer makes of ``x``: its leading dimensions."""
    rows = 1
    for d in x.shape[:-1]:
        rows *= d
    return rows


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
    """A layer ``optimize`` swapped: its shape (in, out) and, from ``crossover`` rows on (0:
    every row count, as a forced algorithm runs), lcmac.  ``algorithm``, ``speedup`` (predicted,
    over lcmac's plain GEMM), ``error`` (predicted, ÷ the plain GEMM's) and ``why`` are the
    decision at ``rows`` rows: the crossover, or with a forced algorithm the largest row count
    searched.  ``decisions``: the plan at each row count searched from the crossover up
    (``lcmac.torch.crossover.RowDecision``); ``kernels``: ``lcmac.ops.kernel``'s keys of what
    it runs at the warm-up row counts, else at the row counts searched.  ``operands``: "native"
    or "fp8" (then ``error`` is the accuracy model's fp8 mode, ÷ the plain fp8 GEMM's, and
    ``crossover`` None where no lcmac fp8 kernel wins at any row count searched); ``below``:
    what runs under the crossover (``torch.nn.functional.linear``, or an fp8 layer's torch FP8
    GEMM)."""
    name: str
    shape: tuple              # (in_features, out_features) = (K, N)
    dtype: str
    target: str
    rows: int
    algorithm: str
    speedup: float | None
    error: float | None
    why: str
    crossover: int = 0
    decisions: tuple = ()
    kernels: tuple = ()
    operands: str = _fp8.NATIVE
    below: str = "torch.nn.functional.linear"

    def to_dict(self) -> dict:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype,
                "target": self.target, "crossover": self.crossover, "rows": self.rows,
                "algorithm": self.algorithm, "speedup": self.speedup, "error": self.error,
                "why": self.why, "decisions": [d.to_dict() for d in self.decisions],
                "kernels": [_key_dict(k) for k in self.kernels], "operands": self.operands,
                "below_crossover": self.below}


def _key_dict(key: tuple) -> dict:
    algo, target, dtype, shape, *mode = key
    d = {"algorithm": algo, "target": target, "dtype": dtype, "shape": list(shape)}
    return {**d, "operands": mode[0]} if mode else d


@dataclass(frozen=True)
class SkippedLayer:
    """A layer ``optimize`` left alone; ``reason``: "too small", "dtype", "device",
    "shape" (fp8: features not multiples of 16), "no win", "kind" (not a plain nn.Linear),
    "not effective" (PyTorch multiplies its
    weight without calling it: nn.MultiheadAttention's projections), "root" (the model
    itself)."""
    name: str
    shape: tuple
    reason: str
    why: str

    def to_dict(self) -> dict:
        return {"name": self.name, "shape": list(self.shape), "reason": self.reason, "why": self.why}


@dataclass
class OptimizeReport:
    """What ``optimize`` did: the row counts it searched (``grid``), the ``swapped`` and
    ``skipped`` layers in the model's order, the encoder layers whose fused path it turned off
    (``fast_path_off``) and the kernels it loaded for the ``warmup`` row counts (``warmed``);
    ``operands``: "fp8" where ``optimize(dtype="fp8")`` asked for it, else "native"."""
    grid: tuple
    algo: str
    max_error: float | None
    swapped: list = field(default_factory=list)
    skipped: list = field(default_factory=list)
    fast_path_off: list = field(default_factory=list)
    warmup: tuple = ()
    warmed: list = field(default_factory=list)
    operands: str = _fp8.NATIVE

    @property
    def rows(self) -> int:
        """The largest row count searched."""
        return max(self.grid)

    @property
    def changed(self) -> bool:
        return bool(self.swapped)

    def kernels(self) -> list[tuple]:
        """Every swapped layer's kernels (``SwappedLayer.kernels``), each once."""
        return list(dict.fromkeys(k for s in self.swapped for k in s.kernels))

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
        fp8 = self.operands == _fp8.FP8
        mode = (", fp8 operands as asked (block-scaled E4M3: it changes precision; inference "
                "only)") if fp8 else ""
        lines = [f"lcmac.optimize: {self.why}; searched {_span(self.grid)} rows, "
                 f"algo={self.algo!r}, {budget_words(self.max_error)}{mode}"]
        if self.swapped:
            table = [["swapped", "in->out", "dtype"] + (["operands"] if fp8 else []) +
                     ["from rows", "at rows", "algorithm", "speed-up", "error",
                      "at the other end searched"]]
            for s in self.swapped:
                start = "none" if s.crossover is None else str(s.crossover) if s.crossover else "all"
                table.append([s.name, f"{s.shape[0]}->{s.shape[1]}", s.dtype] +
                             ([s.operands] if fp8 else []) +
                             [start, str(s.rows), _runs(s), _times(s.speedup), _times(s.error),
                              _other_end(s)])
            lines += _aligned(table)
            if fp8:
                lines.append("  (speed-up: predicted, over lcmac's plain fp8 GEMM; error: the "
                             "accuracy model's fp8 mode, ÷ the plain fp8 GEMM's; fewer rows than "
                             f"'from rows', and 'none': {_fp8.BASELINE})")
            else:
                lines.append("  (speed-up: predicted, over lcmac's plain GEMM; error: predicted, "
                             "÷ the plain GEMM's; fewer rows than 'from rows' run torch's linear)")
        if self.skipped:
            head = ["skipped", "in->out", "reason", "why (in full: report.skipped[i].why)"]
            lines += _aligned([head] + [[k.name or "(model)", f"{k.shape[0]}->{k.shape[1]}",
                                         k.reason, _clip(k.why)] for k in self.skipped])
        if self.fast_path_off:
            lines.append(f"  PyTorch's fused encoder path turned off in "
                         f"{', '.join(self.fast_path_off)}: it multiplies linear1 and linear2's "
                         "weights without calling them")
        if self.warmup:
            lines.append(f"  warmed up for {', '.join(map(str, self.warmup))} rows: "
                         f"{len(self.warmed)} kernels loaded")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {"schema": REPORT_SCHEMA, "rows": self.rows, "grid": list(self.grid),
                "algo": self.algo, "max_error": self.max_error, "operands": self.operands,
                "why": self.why,
                "swapped": [s.to_dict() for s in self.swapped],
                "skipped": [k.to_dict() for k in self.skipped],
                "fast_path_off": list(self.fast_path_off), "warmup": list(self.warmup)}

    def to_json(self) -> str:
        """``to_dict()`` as JSON (what ``lcmac export --from`` reads)."""
        return json.dumps(self.to_dict(), indent=2) + "\n"

    def save(self, path) -> Path:
        """Write ``to_json()`` to ``path``; returns it."""
        path = Path(path)
        path.write_text(self.to_json())
        return path


def _span(grid) -> str:
    return str(grid[0]) if len(grid) == 1 else f"{grid[0]}-{grid[-1]}"


def _times(x) -> str:
    return "?" if x is None else f"{x:.3f}x"


def _runs(s: SwappedLayer) -> str:
    """What a swapped layer runs at its stated row count, in words."""
    if s.algorithm != ops.VENDOR:
        return s.algorithm
    return "torch FP8 GEMM" if s.operands == _fp8.FP8 else "vendor GEMM"


def _other_end(s: SwappedLayer) -> str:
    """The decision at the end of the searched rows ``s`` is not stated at (its largest row
    count, or, where that is its ``rows``, its smallest)."""
    if not s.decisions:
        return ""
    d = s.decisions[-1] if s.decisions[-1].rows != s.rows else s.decisions[0]
    if d.rows == s.rows:
        return ""
    vendor = "torch FP8 GEMM" if s.operands == _fp8.FP8 else "vendor GEMM"
    return f"{d.rows}: " + (vendor if not d.wins else f"{d.runs} {_times(d.speedup)}")


#: the longest reason a printed report shows in full
WHY_WIDTH = 120


def _clip(text: str) -> str:
    return text if len(text) <= WHY_WIDTH else text[:WHY_WIDTH - 1] + "…"


def _aligned(table: list[list[str]]) -> list[str]:
    """Rows of cells, indented, each column as wide as its widest cell."""
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    return ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in table]


def _eligible(layer: nn.Linear, *, dtype, min_size, operands=_fp8.NATIVE):
    """(target, dtype name) where lcmac may take ``layer``, else (reason, why) of the skip."""
    shape = (layer.in_features, layer.out_features)
    w = layer.weight
    if isinstance(layer, Linear):
        return None, ("kind", "already an lcmac.nn.Linear")
    if type(layer) is not nn.Linear:
        return None, ("kind", f"a {type(layer).__module__}.{type(layer).__qualname__}, not a plain "
                              "torch.nn.Linear (its forward may differ)")
    if operands == _fp8.FP8:
        return _eligible_fp8(layer, min_size)
    try:
        target = ops.target_for(w.device.type)
    except TargetError as e:
        return None, ("device", str(e))
    dt = str(w.dtype).replace("torch.", "")
    if dtype is not None and w.dtype != dtype:
        return None, ("dtype", f"weight is {dt}; asked for {str(dtype).replace('torch.', '')}")
    if dt not in ops.supported_dtypes(target):
        return None, ("dtype", f"weight is {dt}; lcmac.matmul takes "
                               f"{', '.join(ops.supported_dtypes(target))} on {target}")
    if min(shape) < min_size:
        return None, ("too small", f"{min(shape)} features < min_size={min_size}")
    return (target, dt), None


def _eligible_fp8(layer: nn.Linear, min_size):
    """``_eligible`` for ``optimize(dtype="fp8")``: a bfloat16/float16 layer on an sm_90 GPU
    whose features are multiples of 16 (``lcmac.torch.fp8``)."""
    try:
        target = _fp8.fp8_target(layer.weight)
    except DTypeError as e:
        return None, ("dtype", str(e))
    except TargetError as e:
        return None, ("device", str(e))
    if min(layer.in_features, layer.out_features) < min_size:
        return None, ("too small", f"{min(layer.in_features, layer.out_features)} features < "
                                   f"min_size={min_size}")
    try:
        _fp8.check_features(layer.in_features, layer.out_features)
    except ShapeError as e:
        return None, ("shape", str(e))
    return (target, str(layer.weight.dtype).replace("torch.", "")), None


def _grid(rows, max_rows):
    """target → the row counts to search: exactly ``rows`` where given, else ``row_grid`` up
    to ``max_rows`` from the target's smallest row bucket."""
    if rows is not None:
        if max_rows is not None:
            raise LcmacError("optimize takes rows= (decide at exactly these row counts) or "
                             "max_rows= (search up to it), not both")
        fixed = tuple(sorted({xo.check_rows(r, "rows") for r in _row_list(rows)}))
        if not fixed:
            raise LcmacError("optimize(rows=) needs at least one row count")
        return lambda target: fixed
    bound = xo.check_rows(MAX_ROWS if max_rows is None else max_rows, "max_rows")
    return lambda target: xo.row_grid(bound, xo.smallest_bucket(target))


def _row_list(rows) -> list:
    return [rows] if isinstance(rows, int) else list(rows)


def _swap(name, layer, target, dt, found: xo.Search, *, algo, max_error, rows,
          operands=_fp8.NATIVE) -> tuple:
    """(the lcmac.nn.Linear for ``layer``, its SwappedLayer); ``rows``: the row counts whose
    kernels the report names.  An fp8 layer with no win (``found.crossover`` None) runs torch's
    FP8 GEMM up to the rows searched and decides per call above them."""
    new = Linear.from_linear(layer, algo=algo, max_error=max_error, operands=operands)
    none = found.crossover is None
    new.crossover = found.decisions[-1].rows + 1 if none else found.crossover
    stated = found.first_win() if algo == ops.AUTO and not none else found.decisions[-1]
    above = found.decisions if none else tuple(d for d in found.decisions
                                               if d.rows >= found.crossover)
    keys = tuple(dict.fromkeys(k for r in rows for k in layer_kernels(new, r)))
    below = _fp8.BASELINE if operands == _fp8.FP8 else SwappedLayer.below
    return new, SwappedLayer(name, (layer.in_features, layer.out_features), dt, target,
                             stated.rows, stated.runs, stated.speedup, stated.error, stated.why,
                             found.crossover, above, keys, operands, below)


def optimize(model: nn.Module, *, max_error: float | None = None, dtype=None, algo: str = "auto",
             min_size: int = MIN_SIZE, max_rows: int | None = None, rows=None, warmup=None,
             workers: int | None = None) -> OptimizeReport:
    """Swap ``model``'s eligible ``nn.Linear`` layers for ``lcmac.nn.Linear``, in place, and
    return an ``OptimizeReport`` (``print(report)``; ``report.why``; ``report.save(path)``).

    Eligible: a plain ``nn.Linear`` on the CPU or a CUDA GPU, of a dtype lcmac takes there
    (and of ``dtype``, when given), with at least ``min_size`` input and output features,
    which PyTorch calls (not nn.MultiheadAttention's projections), and with a crossover
    (module doc) among the row counts searched: powers of two and their midpoints up to
    ``max_rows`` (default ``MAX_ROWS``), or exactly ``rows`` (one row count or several).
    With ``algo="auto"`` an lcmac kernel wins where the tuning logs and the model predict it
    faster than the vendor GEMM (within ``max_error``, an error budget as a multiple of the
    GEMM's error); a forced algorithm runs at every row count.  Encoder layers whose linears
    were swapped leave PyTorch's fused path (``lcmac.torch.fast_path``).  ``warmup``: row
    counts whose kernels are compiled now, ``workers`` at a time (``warm_up``).  A model
    with no eligible layer is left unchanged, and the report says why.

    ``dtype="fp8"``: swap every bfloat16/float16 layer on an sm_90 GPU (features multiples of
    16) into ``operands="fp8"`` (module doc), lcmac's fp8 kernels from each layer's fp8
    crossover (the tuning logs' fp8 records of this device, else the model's fp8 mode) and
    torch's FP8 GEMM below it, also where no fp8 kernel wins (the report says which)."""
    algo = ops.check_algo(algo)
    max_error = ops.check_budget(max_error)
    operands = _fp8.NATIVE
    if dtype == _fp8.FP8:
        operands, dtype = _fp8.FP8, None
    elif dtype is not None and not isinstance(dtype, torch.dtype):
        raise DTypeError(f"dtype must be a torch.dtype (torch.float32, ...) or \"fp8\" (bfloat16 "
                         f"and float16 layers in block-scaled E4M3), got {dtype!r}")
    grid_for = _grid(rows, max_rows)
    warm = tuple(xo.check_rows(r, "warmup") for r in _row_list(warmup or ()))
    first = "cuda-sm90a" if operands == _fp8.FP8 else ops.target_for("cpu")
    report = OptimizeReport(grid_for(first), algo, max_error, warmup=warm, operands=operands)
    searches: dict[tuple, xo.Search] = {}
    bypassed: dict[int, str] = {}
    swaps = []
    for name, mod in model.named_modules():
        if isinstance(mod, nn.MultiheadAttention):
            for pname, shape, why, layer in attention_projections(name, mod):
                if layer is None:
                    report.skipped.append(SkippedLayer(pname, shape, "not effective", why))
                else:
                    bypassed[id(layer)] = why
        if not isinstance(mod, nn.Linear):
            continue
        shape = (mod.in_features, mod.out_features)
        if mod is model:
            report.skipped.append(SkippedLayer("", shape, "root", "the model itself is the layer: "
                                               "use lcmac.nn.Linear.from_linear(model)"))
            continue
        if id(mod) in bypassed:
            report.skipped.append(SkippedLayer(name, shape, "not effective", bypassed[id(mod)]))
            continue
        ok, skip = _eligible(mod, dtype=dtype, min_size=min_size, operands=operands)
        if skip is not None:
            report.skipped.append(SkippedLayer(name, shape, *skip))
            continue
        target, dt = ok
        grid = report.grid = grid_for(target)
        key = (mod.out_features, mod.in_features, dt, target)
        if key not in searches:
            mode = {} if operands == _fp8.NATIVE else {"operands": operands}
            searches[key] = xo.search(*key, grid, algo=algo, max_error=max_error, **mode)
        found = searches[key]
        if found.crossover is None and operands == _fp8.NATIVE:
            top = found.decisions[-1]
            report.skipped.append(SkippedLayer(
                name, shape, "no win", f"no lcmac kernel is predicted to win at {_span(grid)} "
                                       f"rows; at {top.rows}: {top.why}"))
            continue
        new, done = _swap(name, mod, target, dt, found, algo=algo, max_error=max_error,
                          rows=warm or grid, operands=operands)
        report.swapped.append(done)
        swaps.append((name, new))
    for name, new in swaps:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, new)
    report.fast_path_off = call_swapped_layers(model, lambda m: isinstance(m, Linear))
    if warm:
        report.warmed = warm_up(model, warm, workers=workers)
    return report


def warm_up(model: nn.Module, rows, *, workers: int | None = None) -> list[tuple]:
    """Compile (into the kernel cache) and load every kernel the ``lcmac.nn.Linear`` layers of
    ``model`` run at each row count of ``rows``, in the weights' dtypes, up to ``workers``
    compiles at a time (default one per CPU core), so that forwards of those row counts
    compile nothing; the kernels' keys (``lcmac.ops.kernel``)."""
    counts = [xo.check_rows(r, "warm-up rows") for r in _row_list(rows)]
    keys = [k for m in model.modules() if isinstance(m, Linear) for r in counts
            for k in layer_kernels(m, r)]
    return compile_kernels(keys, workers)
