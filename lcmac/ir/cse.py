"""Common-subexpression elimination for the combine stages (initial stub)."""
from __future__ import annotations

import numpy as np

from .algorithm import Algorithm
from .program import LinearProgram, combine_matrices, naive_program


def optimize(M: np.ndarray, *, effort: int = 1) -> LinearProgram:
    return naive_program(M)


def optimized_programs(alg: Algorithm) -> dict[str, LinearProgram]:
    return {k: optimize(M) for k, M in combine_matrices(alg).items()}


def addition_counts(alg) -> dict:
    naive = {k: naive_program(M).additions for k, M in combine_matrices(alg).items()}
    red = {k: p.additions for k, p in optimized_programs(alg).items()}
    naive["total"] = sum(naive.values())
    red["total"] = sum(red.values())
    return {"naive": naive, "reduced": red}
