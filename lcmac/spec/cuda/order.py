"""The order in which a CTA computes its R products, and the Combine-H epilogue's steps over
that order (which C tiles each product adds into, and which add comes first)."""
from __future__ import annotations

import numpy as np


def r_order(W, order: str) -> list[int]:
    """The order in which a CTA computes its R products.

    "greedy": repeatedly take the product that completes the most C tiles soonest (fewest
    remaining contributions), so partial C tiles live for the shortest time."""
    R = W.shape[0]
    if order == "natural":
        return list(range(R))
    nz = [(np.asarray(W[r]) != 0) for r in range(R)]
    remaining = sum(x.astype(int) for x in nz)
    left = set(range(R))
    out = []
    while left:
        best = min(left, key=lambda r: (int((remaining[nz[r]]).min()) if nz[r].any() else 0, r))
        out.append(best)
        left.remove(best)
        remaining = remaining - nz[best].astype(int)
    return out


def combine_h_steps(W, order: list[int]):
    """The Combine-H epilogue of the fused kernels, step by step.

    Returns (steps, nxt): steps[s] = [(i, j, w, first, prev)] for the product order[s]:
    its non-zero W[r,i,j], ``first`` = C_ij's first contribution when the walk starts at
    step 0, ``prev`` = the previous step (cyclically) that contributes to C_ij;
    nxt[(i, j)][s] = steps from s (cyclically) to the next one contributing to C_ij."""
    R = len(order)
    W = np.asarray(W, dtype=object)
    m, n = W.shape[1], W.shape[2]
    at = {}
    for s, r in enumerate(order):
        for i in range(m):
            for j in range(n):
                if W[r, i, j] != 0:
                    at.setdefault((i, j), []).append(s)
    seen, steps = set(), []
    for s, r in enumerate(order):
        items = []
        for i in range(m):
            for j in range(n):
                if W[r, i, j] != 0:
                    st = at[(i, j)]
                    items.append((i, j, W[r, i, j], (i, j) not in seen, st[st.index(s) - 1]))
                    seen.add((i, j))
        steps.append(items)
    nxt = {ij: [min((t - s) % R for t in st) for s in range(R)] for ij, st in at.items()}
    return steps, nxt


def reduce_groups(W, order: list[int]):
    """The TMA epilogue of ``tma_reduce`` step by step: groups[s] = [(w, [(i, j, first)])],
    product order[s]'s non-zero W[r,i,j] grouped by coefficient (w = 1 first), ``first`` =
    C_ij's first contribution in a walk over the whole group (a store; the rest add)."""
    steps, _ = combine_h_steps(W, order)
    groups = []
    for items in steps:
        by_w = {}
        for (i, j, w, first, _prev) in items:
            by_w.setdefault(w, []).append((i, j, first))
        groups.append(sorted(by_w.items(), key=lambda kv: kv[0] != 1))
    return groups


def first_in_piece(s0: int, prev: int, st: int, R: int) -> bool:
    """Is step s0 the first, in a walk starting at step st (st, st+1, … mod R), to add into
    a C tile whose previous contributing step (cyclically) is ``prev``?  (prev == s0: the
    only one.)  The fused templates emit the same test when st is a run-time value."""
    return (s0 - st) % R <= (prev - st) % R
