"""Element types lcmac knows, with the aliases users type; the one place dtype names are
normalised and sized."""
from __future__ import annotations

from lcmac.core.errors import DTypeError

#: what artifacts store (a user's dtype)
CANONICAL = ("float32", "float64", "bfloat16", "float16", "float8_e4m3")
_ALIASES = {
    "fp32": "float32", "f32": "float32", "float": "float32", "single": "float32",
    "fp64": "float64", "f64": "float64", "double": "float64",
    "bf16": "bfloat16", "bfloat": "bfloat16",
    "fp16": "float16", "f16": "float16", "half": "float16",
    "fp8": "float8_e4m3", "e4m3": "float8_e4m3", "float8_e4m3fn": "float8_e4m3",
}

#: bytes per stored element; ``tfloat32`` is the models' name for float32 multiplied on TF32
#: tensor cores (stored as float32)
ITEMSIZE = {"float32": 4, "tfloat32": 4, "float64": 8, "bfloat16": 2, "float16": 2,
            "float8_e4m3": 1}


def normalize_dtype(name) -> str:
    """'bf16' → 'bfloat16'; numpy/torch dtypes accepted; unknown names raise DTypeError."""
    s = str(name).lower().replace("torch.", "")
    s = _ALIASES.get(s, s)
    if s not in CANONICAL:
        raise DTypeError(f"unknown dtype {name!r}; choose one of {', '.join(CANONICAL)} "
                         f"(aliases: fp32, fp64, bf16, fp16, fp8)")
    return s


def normalize_model_dtype(name) -> str:
    """A dtype the cost and accuracy models price: the user's dtypes plus ``tf32``/``tfloat32``."""
    s = str(name).lower().replace("torch.", "")
    if s in ("tf32", "tfloat32"):
        return "tfloat32"
    return normalize_dtype(s)
