"""How lcmac writes a product's shape, in one place.

A shape is ``MxNxK`` for C = A·B with A M×K, B K×N and C M×N (the BLAS order of the output
first, then the reduction).  Algorithm grids are written ``<m,k,n>`` instead (``naive-2x3x4``
is m=2, k=3, n=4: an m×k block of A times a k×n block of B), as in the literature."""
from __future__ import annotations

import re

from lcmac.core.errors import ShapeError

SHAPE_HELP = "MxNxK: C = A·B with A M×K, B K×N, C M×N (e.g. 4096x4096x4096)"
_SHAPE_RE = re.compile(r"\s*(\d+)\s*[xX×,]\s*(\d+)\s*[xX×,]\s*(\d+)\s*")


def parse_shape(shape) -> tuple[int, int, int]:
    """'MxNxK' (x, ×, or commas between the numbers) or a sequence (M, N, K) → (M, N, K) of
    positive ints; anything else raises ShapeError saying what a shape is."""
    vals: tuple = ()
    if isinstance(shape, str):
        mt = _SHAPE_RE.fullmatch(shape)
        vals = tuple(int(g) for g in mt.groups()) if mt else ()
    elif shape is not None:
        try:
            vals = tuple(int(p) for p in shape)
        except (TypeError, ValueError):
            vals = ()
    if len(vals) != 3 or min(vals) < 1:
        raise ShapeError(f"shape {shape!r} must be {SHAPE_HELP}, with positive integers")
    return vals
