"""The error budget a decision keeps to: ``max_error``, a multiple of the plain GEMM's error.

Every decision that picks an LCMA on its own (``lcmac.matmul``, ``lcmac.nn.Linear``,
``lcmac.optimize``, ``lcmac select``, ``lcmac export``) has one.  Unless the caller gives
one, an LCMA may lose at most ``DEFAULT_BUDGET_BITS[dtype]`` bits against the plain GEMM of
its dtype: the predicted error at most 2**bits = ``DEFAULT_MAX_ERROR[dtype]`` times the GEMM's.
The rule: never less precise than the next cheaper format a user could pick instead.  A 16-bit
format is picked for speed, and its next step is fp8 E4M3, which loses 4 bits: so 4 bits for
bf16 and fp16.  float32 and float64 are picked for accuracy: 2 bits, far from TF32 or float32
(docs/accuracy.md gives the numbers per dtype).  ``max_error=float("inf")`` lifts the budget;
any other value must be a positive number.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from lcmac.core.dtypes import normalize_model_dtype
from lcmac.costmodel.decision import check_error_budget

#: bits of precision an LCMA may lose against the plain GEMM of its dtype, by default (module
#: doc: the 16-bit formats as many as fp8 E4M3 would lose, the wide formats 2)
#: ("tfloat32": CUDA float32 where TF32 products are allowed)
DEFAULT_BUDGET_BITS = {"bfloat16": 4, "float16": 4, "tfloat32": 2, "float32": 2, "float64": 2}
#: the default budget per dtype the models price, × the plain GEMM's error in that dtype
DEFAULT_MAX_ERROR = {d: 2.0 ** bits for d, bits in DEFAULT_BUDGET_BITS.items()}
#: a dtype the table does not name (the narrowest budget)
_FALLBACK = min(DEFAULT_MAX_ERROR.values())


@dataclass(frozen=True)
class ErrorBudget:
    """The budget in force: ``max_error`` (None: no budget), where it came from (``source``:
    "default", "asked" or "lifted", by ``max_error=inf``), for ``dtype``."""
    max_error: float | None
    source: str
    dtype: str

    def describe(self) -> str:
        """The budget in words, for a plan's ``why`` and the command line."""
        if self.max_error is None:
            return "no error budget (lifted by max_error=inf)"
        s = f"error budget {self.max_error:g}× the plain GEMM's error"
        if self.source == "default":
            bits = math.log2(self.max_error)
            s += (f" (the {self.dtype} default: at most {bits:g} bits lost; max_error=inf "
                  f"lifts it)")
        return s

    def to_dict(self) -> dict:
        return {"max_error": self.max_error, "source": self.source}


def default_max_error(dtype) -> float:
    """The budget a decision for ``dtype`` keeps to when the caller gives none."""
    return DEFAULT_MAX_ERROR.get(normalize_model_dtype(dtype), _FALLBACK)


def check_budget_arg(max_error):
    """A caller's ``max_error`` as it is kept until a decision: None (the default budget),
    ``inf`` (no budget) or a positive finite float; ValueError otherwise."""
    if max_error is None or is_lifted(max_error):
        return None if max_error is None else math.inf
    return check_error_budget(max_error)


def is_lifted(max_error) -> bool:
    """Whether ``max_error`` is ``inf``: no budget."""
    return isinstance(max_error, (int, float)) and not isinstance(max_error, bool) \
        and max_error == math.inf


def budget_words(max_error) -> str:
    """The budget a caller asked for (``max_error``: None, inf or a number) in words, where
    no one dtype is known yet (``lcmac.optimize``'s report spans layers of several)."""
    if max_error is None:
        default = "/".join(f"{v:g}" for v in sorted(set(DEFAULT_MAX_ERROR.values())))
        return f"the default error budget ({default}× the plain GEMM's error)"
    if is_lifted(max_error):
        return "no error budget (max_error=inf)"
    return f"error budget max_error={float(max_error):g}"


def error_budget(max_error, dtype) -> ErrorBudget:
    """The budget in force for a decision in ``dtype`` asked with ``max_error`` (module doc)."""
    d = normalize_model_dtype(dtype)
    if max_error is None:
        return ErrorBudget(default_max_error(d), "default", d)
    if is_lifted(max_error):
        return ErrorBudget(None, "lifted", d)
    return ErrorBudget(check_error_budget(max_error), "asked", d)
