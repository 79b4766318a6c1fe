"""How the command line's values are read: shapes and shape rules, grids, row ladders,
tiles, target names.  A bad value is reported as argparse's error (exit status 2), naming
what is wrong with it."""
from __future__ import annotations

import argparse
import json
import re

from lcmac.artifact.build import resolve_target
from lcmac.core.dtypes import CANONICAL
from lcmac.core.errors import ShapeError
from lcmac.core.shapes import SHAPE_HELP, parse_shape
from lcmac.spec.shape_rules import check_ladder, parse_rule
from lcmac.spec.target_table import TARGETS

TARGET_NAMES = ", ".join(TARGETS)
DTYPE_HELP = (f"element type: {', '.join(CANONICAL)}, or an alias (bf16, fp16, fp32, fp64, "
              f"fp8); default float32; build also takes gf2 and bool (bit matrices: "
              f"docs/bits.md)")
GRID_HELP = ("MxKxN: an algorithm's grid <m,k,n>, an m×k block of A times a k×n block of B "
             "(e.g. 2x2x3)")

_DIMENSION_SEPARATOR = re.compile(r"\s*[xX×,]\s*")


def _dimension_error(text: str, rule: bool = False) -> str:
    """The message for three dimensions of which one is not a positive integer (0, -5, 1.5),
    naming it; '' when the text is not three dimensions (the parser's own message fits)."""
    dims = _DIMENSION_SEPARATOR.split(text.strip().removeprefix("exact:"))
    bad = [d for d in dims if not (d.isdigit() and int(d) > 0) and not (rule and d == "?")]
    if len(dims) != 3 or not bad:
        return ""
    return (f"shape {text!r}: dimensions must be positive integers, not {bad[0]!r}; a shape "
            f"is {SHAPE_HELP}")


def shape_arg(text: str) -> tuple[int, int, int]:
    """``--shape``: ``lcmac.core.shapes.parse_shape``, its error reported as argparse's."""
    try:
        return parse_shape(text)
    except ShapeError as e:
        raise argparse.ArgumentTypeError(_dimension_error(text) or str(e)) from None


def grid_arg(text: str) -> tuple[int, int, int]:
    """``--grid``: three positive integers written as a shape is, meaning <m,k,n>."""
    try:
        return parse_shape(text)
    except ShapeError:
        raise argparse.ArgumentTypeError(f"grid {text!r} must be {GRID_HELP}") from None


def rule_arg(text: str):
    """``--shape``: a shape or a shape rule (``lcmac.spec.shape_rules``), errors as argparse's."""
    try:
        return parse_rule(text)
    except ShapeError as e:
        raise argparse.ArgumentTypeError(_dimension_error(text, rule=True) or str(e)) from None


def ladder_arg(text: str) -> tuple:
    """``--rows``: row buckets, comma-separated positive integers."""
    try:
        return check_ladder([p for p in text.replace("x", ",").split(",") if p.strip()])
    except ShapeError:
        raise argparse.ArgumentTypeError(f"row buckets {text!r} must be positive integers, "
                                         f"e.g. 4096,1024,256") from None


def tile_arg(text: str) -> tuple:
    """``--tile``: NxK, two positive integers."""
    try:
        tile = tuple(int(p) for p in text.replace("x", ",").split(","))
    except ValueError:
        tile = ()
    if len(tile) != 2 or min(tile) < 1:
        raise argparse.ArgumentTypeError(f"tile {text!r} must be NxK, two positive integers")
    return tile


def config_arg(text: str) -> dict:
    """``--config``: schedule knobs, a JSON object (read here, so that a typo is a usage error
    before any compiling, whatever the target)."""
    try:
        config = json.loads(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{text!r} is not JSON ({e}); give the knobs as a JSON "
                                         f"object, e.g. '{{\"mc\": 128}}'") from None
    if not isinstance(config, dict):
        raise argparse.ArgumentTypeError(f"{text!r} is JSON but not an object; give the knobs "
                                         f"as one, e.g. '{{\"mc\": 128}}'")
    return config


def positive_int(text: str) -> int:
    """A count that must be at least 1 (--top, --jobs, --budget, ...)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive integer")
    return value


def non_negative_int(text: str) -> int:
    """A count that may be 0 (--top-lcmas: none tuned)."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be an integer of 0 or more")
    return value


def target_name(name: str | None) -> str:
    """``--target`` as a name the model looks up: none (this CPU), 'host' and 'cuda' become
    the target ``lcmac build`` would pick; other names (profiles included) pass as given."""
    return resolve_target(name).name if name in (None, "host", "native", "cuda") else name


_OPTIONS_WITH_DASHED_VALUES = ("--shape", "--rows", "--tile")
_DASHED_VALUE = re.compile(r"-\d")
# -5x3x3, -5x?x3: three dimensions, the first negative (a negative number alone is a value)
_DASHED_SHAPE = re.compile(r"-\d+\s*[xX×,]\s*(\d+|\?)\s*[xX×,]")


def dashed_shape_error(argv: list[str]) -> str:
    """The message for a shape that begins with '-' standing alone (``lcmac export -5x3x3``),
    which argparse would take for an unknown option; '' when there is none.  Options'
    values are attached first (``attach_dashed_values``)."""
    for word in argv:
        if word == "--":                 # what follows is positional: the type checks it
            return ""
        if _DASHED_SHAPE.match(word):
            what = _dimension_error(word, rule=True) or f"shape {word!r} is not {SHAPE_HELP}"
            return (f"{what}; beginning with '-', it is read as an option (pass it as "
                    f"--shape={word}, or after '--' where a SHAPE word goes)")
    return ""


def attach_dashed_values(argv: list[str]) -> list[str]:
    """``--shape -5x3x3`` as ``--shape=-5x3x3``: argparse takes a word that starts with '-'
    for an option and would only say "expected one argument"; attached, the value reaches
    the check that says what is wrong with it."""
    out: list[str] = []
    for word in argv:
        if out and out[-1] in _OPTIONS_WITH_DASHED_VALUES and _DASHED_VALUE.match(word):
            out[-1] = f"{out[-1]}={word}"
        else:
            out.append(word)
    return out
