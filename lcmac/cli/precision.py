"""The terms a command decides or builds under: ``--precision`` (the float32 class,
``lcmac.spec.precision``) and ``--max-error`` (the error budget,
``lcmac.costmodel.error_budget``), read the way ``lcmac.matmul`` reads them for numpy arrays.
"""
from __future__ import annotations

import argparse

from lcmac.core.dtypes import normalize_dtype
from lcmac.core.errors import LcmacError
from lcmac.costmodel import model_dtype
from lcmac.costmodel.error_budget import DEFAULT_MAX_ERROR, ErrorBudget, error_budget
from lcmac.spec.precision import (
    DEFAULT_PRECISION, PRECISIONS, check_operands_allowed, operand_modes)
from lcmac.cli.exit_codes import UsageError

PRECISION_HELP = (f"float32 precision class: {', '.join(PRECISIONS)} (torch's names; default "
                  f"{DEFAULT_PRECISION}: no TF32, CUDA kernels multiply through fp16x2 operands; "
                  f"high: TF32 allowed; medium: also scaled fp16 operands). Other dtypes have none")
BUDGET_HELP = (f"error budget: leave out LCMAs whose predicted error exceeds X times the plain "
               f"GEMM's in this dtype (default {DEFAULT_MAX_ERROR['bfloat16']:g} for bf16 and fp16, "
               f"{DEFAULT_MAX_ERROR['float32']:g} for float32 and float64: docs/accuracy.md; inf "
               f"lifts it)")


def add_precision_argument(parser) -> None:
    parser.add_argument("--precision", default=None, choices=PRECISIONS, help=PRECISION_HELP)


def max_error_arg(text: str) -> float:
    """``--max-error``: a positive multiple of the plain GEMM's error, or inf (no budget)."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0:                   # nan fails too
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive multiple of the plain "
                                         f"GEMM's error (e.g. 4), or inf for no budget")
    return value


def precision_of(args) -> str | None:
    """The command's float32 class (None for other dtypes)."""
    if normalize_dtype(args.dtype) != "float32":
        return None
    return args.precision or DEFAULT_PRECISION


def operands_for(target, dtype, precision, asked: str | None, option: str | None = None) -> str:
    """The CUDA operand mode to price or build: ``asked`` (given as ``option``, by default
    ``--operands ASKED``) where the class allows it, a ``UsageError`` naming the option and the
    class otherwise; else the class's own."""
    dtype = normalize_dtype(dtype)
    if asked is None:
        return operand_modes(target, dtype, precision)[0]
    try:
        return check_operands_allowed(asked, target, dtype, precision)
    except LcmacError as e:              # two options that do not go together
        option = option or f"--operands {asked}"
        raise UsageError(f"{option} does not go with --precision {precision}: {e}") from None


def budget_for(args, operands: str) -> ErrorBudget:
    """The error budget in force for ``args.max_error`` (None: the dtype's default)."""
    return error_budget(args.max_error, model_dtype(args.target, args.dtype, operands))


def build_config(target, args):
    """``args.config`` with the operand mode the float32 class runs (CUDA float32): the
    config's own ``operands`` where the class allows it."""
    precision = precision_of(args)
    config = args.config                 # a dict: ``arguments.config_arg`` has read the JSON
    if precision is None or target.family != "cuda":
        return config
    config = dict(config or {})
    # tf32_wgmma multiplies native float32 operands as TF32: it asks for them
    asked = config.get("operands") or ("native" if config.get("tf32_wgmma") else None)
    option = f"--config operands={asked}" if config.get("operands") else "--config tf32_wgmma"
    config["operands"] = operands_for(target.name, args.dtype, precision, asked, option)
    return config
