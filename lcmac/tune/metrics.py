"""How good is the model as a search prior?  Two numbers.

- ``spearman(predicted, measured)``: rank correlation of the model's per-config estimates
  and the measured times over one tuned space (1 = the model orders configs perfectly).
- ``trials_to_within(measured_in_model_order, tol)``: how many configs, taken in the model's
  order, must be measured before one is within ``tol`` (3%) of the best of the whole
  (exhaustively measured) space; also given as a fraction of the space.
"""
from __future__ import annotations

import math
from typing import Sequence


def _ranks(xs: Sequence[float]) -> list[float]:
    """Ranks 1..n, ties get their average rank."""
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    ranks = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for t in range(i, j + 1):
            ranks[order[t]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman's ρ (Pearson correlation of the ranks; ties averaged). NaN below 2 points
    or when one side is constant."""
    if len(a) != len(b):
        raise ValueError(f"spearman: {len(a)} vs {len(b)} values")
    n = len(a)
    if n < 2:
        return math.nan
    ra, rb = _ranks(list(a)), _ranks(list(b))
    ma, mb = sum(ra) / n, sum(rb) / n
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    va = sum((x - ma) ** 2 for x in ra)
    vb = sum((y - mb) ** 2 for y in rb)
    if va == 0 or vb == 0:
        return math.nan
    return cov / math.sqrt(va * vb)


def trials_to_within(times_in_model_order: Sequence[float], tol: float = 0.03) -> tuple[int, float]:
    """(trials, fraction of the space) until a config within ``tol`` of the best is measured."""
    ts = list(times_in_model_order)
    if not ts:
        raise ValueError("trials_to_within: empty space")
    best = min(ts)
    for i, t in enumerate(ts, 1):
        if t <= best * (1 + tol):
            return i, i / len(ts)
    raise AssertionError("unreachable")


def space_report(predicted: Sequence[float], measured: Sequence[float], tol: float = 0.03) -> dict:
    """Both metrics for one exhaustively measured space (pairs in any order)."""
    pairs = sorted(zip(predicted, measured), key=lambda p: p[0])
    trials, frac = trials_to_within([m for _, m in pairs], tol)
    return {"n": len(pairs), "spearman": spearman(predicted, measured),
            "trials_to_within": trials, "fraction_of_space": frac, "tolerance": tol}
