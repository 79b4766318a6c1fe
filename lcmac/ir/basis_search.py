"""Searching the basis changes that make an algorithm's core cheap (alternative basis).

The core's Combine A is ``Uφ⁻¹`` and depends on φ alone, Combine B (``Vψ⁻¹``) on ψ alone,
Combine H (``υWᵀ``) on υ alone; each basis change likewise costs its own additions.  So the
three bases are searched independently, each minimising, in this order, the core stage's
additions, its scalings (coefficients other than ±1), the basis change's additions and its
scalings, all as counted by lcmac's CSE (``lcmac.ir.cse``: a heuristic, so "minimal" means
minimal for that count).

**Exhaustive** where a basis is at most 4×4 (2×2 block grids, the Karstadt–Schwartz case):
every invertible matrix with entries in {−1, 0, 1} (rationals) or {0, 1} (GF(2)) is a
candidate, taken up to signed permutations of its rows, which change no count.  Candidates
are ranked by an exact lower bound on their core stage's additions and evaluated in that
order until the bound exceeds the best count found.  For a stage matrix M (n_out × n_in,
zero rows and columns dropped) any program needs (a) one addition for each output row with
two or more nonzeros that is not a multiple of another such row, and, by the transposition
principle a(M) = a(Mᵀ) + n_in − n_out, (b) as many as (a) counts for Mᵀ, plus n_in − n_out.
Where the bound equals the naive count, the naive program is optimal and CSE is skipped.

**Heuristic** for larger bases, and marked as such in the result: steepest descent by
elementary row operations (row i ± row j, keeping entries in {−1, 0, 1}) on the naive
counts, from the given basis and from random starts; the CSE then ranks the best bases
visited (and the given basis, so the result is never worse than it) and first-improvement
moves on the CSE counts polish the winner.  It is seeded and deterministic; it may miss the
best basis.
"""
from __future__ import annotations

import functools
import itertools
import random
from dataclasses import dataclass
from fractions import Fraction
from math import lcm

import numpy as np

from lcmac.core.errors import AlgorithmError
from lcmac.ir.alternative_basis import (
    AlternativeBasisAlgorithm, exact_product, from_standard, leading_coefficient, stage_program)
from lcmac.ir.cse import addition_counts
from lcmac.ir.gf2 import reduce_mod2, require_rational, ring_of
from lcmac.ir.program import naive_program

__all__ = ["BasisSearchResult", "search_basis", "addition_report", "EXHAUSTIVE_MAX_DIM"]

#: the largest basis searched exhaustively (4×4: 40 ternary rows up to sign, 91 390 row sets)
EXHAUSTIVE_MAX_DIM = 4
SIDES = ("A", "B", "C")
_SEED = 0x1C3AC
#: how many of the heuristic's best bases by naive count the CSE ranks
_CSE_POOL = 12


@dataclass(frozen=True)
class BasisSearchResult:
    """The pair found, and per side ("A": φ, "B": ψ, "C": υ) how: ``"exhaustive"`` or
    ``"heuristic"``, and how many candidate bases had their counts evaluated."""

    algorithm: AlternativeBasisAlgorithm
    method: dict
    evaluated: dict


# ---- the factor each basis acts on --------------------------------------------------------

def _factor(alg, side: str) -> np.ndarray:
    """U, V or W flattened to R × (block positions), exact."""
    R = alg.R
    t = {"A": alg.U, "B": alg.V, "C": alg.W}[side]
    return np.asarray(t, dtype=object).reshape(R, -1)


def _integer_rows(F: np.ndarray) -> np.ndarray:
    """F with each row scaled to integers: the same zero pattern and row classes."""
    out = np.zeros(F.shape, dtype=np.int64)
    for r in range(F.shape[0]):
        den = 1
        for x in F[r]:
            if isinstance(x, Fraction):
                den = lcm(den, x.denominator)
        out[r] = [int(x * den) for x in F[r]]
    return out


def _row_classes(F: np.ndarray) -> list[int]:
    """One row index per class of nonzero rows equal up to a nonzero factor."""
    seen, reps = set(), []
    for r in range(F.shape[0]):
        nz = [x for x in F[r] if x != 0]
        if not nz:
            continue
        key = tuple(Fraction(x) / nz[0] for x in F[r])
        if key not in seen:
            seen.add(key)
            reps.append(r)
    return reps


def _rank(F: np.ndarray, ring: str) -> int:
    rows = [[Fraction(x) if ring != "gf2" else int(x) % 2 for x in row] for row in F]
    rank, cols = 0, F.shape[1]
    for c in range(cols):
        p = next((r for r in range(rank, len(rows)) if rows[r][c] != 0), None)
        if p is None:
            continue
        rows[rank], rows[p] = rows[p], rows[rank]
        for r in range(len(rows)):
            if r != rank and rows[r][c] != 0:
                f = rows[r][c] / rows[rank][c] if ring != "gf2" else 1
                rows[r] = [(x - f * y) % 2 if ring == "gf2" else x - f * y
                           for x, y in zip(rows[r], rows[rank])]
        rank += 1
    return rank


# ---- exact costs of one candidate -----------------------------------------------------------

def _core_matrix(side: str, F: np.ndarray, basis: np.ndarray, inv: np.ndarray, ring: str):
    """The core's stage matrix: F·basis⁻¹ (A, B) or basis·Fᵀ (C, Combine H)."""
    if side == "C":
        return exact_product(basis.astype(object), F.T, ring)
    return exact_product(F, inv, ring)


def _runtime_basis(side: str, basis: np.ndarray, inv: np.ndarray) -> np.ndarray:
    """What runs on the data: φ or ψ themselves, υ⁻¹ on the core's output."""
    M = inv if side == "C" else basis
    return np.asarray(M, dtype=object)


def _cost(M: np.ndarray, lower_bound: int, effort: int) -> tuple[int, int]:
    """(additions, scalings) of M's program; the naive one when the bound proves it optimal."""
    p = naive_program(M)
    if p.additions > lower_bound:
        q = stage_program(M, effort)
        p = q if (q.additions, q.scalings) < (p.additions, p.scalings) else p
    return p.additions, p.scalings


# ---- exhaustive search (bases up to 4×4) ----------------------------------------------------

@functools.lru_cache(maxsize=None)
def _candidates(d: int, ring: str):
    """Invertible d×d bases, one per class under signed row permutations, with adjugates and
    determinants (``inverse = adj / det``; over GF(2) ``adj`` mod 2 is the inverse)."""
    vals = (0, 1) if ring == "gf2" else (-1, 0, 1)
    vecs = np.array([v for v in itertools.product(vals, repeat=d)
                     if any(v) and next(x for x in v if x) == 1], dtype=np.int64)
    sets = np.array(list(itertools.combinations(range(len(vecs)), d)), dtype=np.intp)
    B = vecs[sets]
    # small integer matrices: float determinant and inverse round exactly
    det = np.rint(np.linalg.det(B.astype(np.float64))).astype(np.int64)
    keep = det % 2 == 1 if ring == "gf2" else det != 0
    B, det = B[keep], det[keep]
    adj = np.rint(np.linalg.inv(B.astype(np.float64)) * det[:, None, None]).astype(np.int64)
    if ring == "gf2":
        adj %= 2
    # entries are at most 16 in magnitude (Hadamard's bound): int8 keeps the table small
    out = tuple(a.astype(np.int8) for a in (B, adj, det))
    for a in out:
        a.flags.writeable = False
    return out


def _exact_inverse(adj: np.ndarray, det: int, ring: str) -> np.ndarray:
    out = np.empty(adj.shape, dtype=object)
    for idx, x in np.ndenumerate(adj):
        v = int(x) if ring == "gf2" else Fraction(int(x), int(det))
        out[idx] = int(v) if isinstance(v, Fraction) and v.denominator == 1 else v
    return out


def _bounds(Z: np.ndarray, side: str, reps: list[int], rows_used: int, d: int,
            columns_distinct: bool) -> tuple[np.ndarray, np.ndarray]:
    """Naive additions and the lower bound of each candidate's core stage, from the zero
    pattern Z (candidates × R × d) of F·Y."""
    row, col = Z.sum(2), Z.sum(1)
    d_rows = (row[:, reps] >= 2).sum(1)
    d_cols = (col >= 2).sum(1) if columns_distinct else np.zeros(len(Z), dtype=np.int64)
    if side == "C":   # Combine H is (F·Y)ᵀ: d outputs over the R products
        return np.clip(col - 1, 0, None).sum(1), np.maximum(d_cols, d_rows + rows_used - d)
    return np.clip(row - 1, 0, None).sum(1), np.maximum(d_rows, d_cols + d - rows_used)


def _exhaustive(side: str, F: np.ndarray, ring: str, effort: int):
    d = F.shape[1]
    B, adj, det = _candidates(d, ring)
    Y = B.transpose(0, 2, 1) if side == "C" else adj
    Fi = _integer_rows(F) % 2 if ring == "gf2" else _integer_rows(F)
    G = np.einsum("rd,nde->nre", Fi, Y.astype(np.int64))
    if ring == "gf2":
        G %= 2
    reps = _row_classes(F if ring != "gf2" else Fi)
    rows_used = int((Fi != 0).any(1).sum())
    naive, lb = _bounds(G != 0, side, reps, rows_used, d, _rank(F, ring) == d)
    best, tied, evaluated = None, [], 0
    for i in np.lexsort((naive, lb)):
        if best is not None and lb[i] > best[0]:
            break
        inv = _exact_inverse(adj[i], det[i], ring)
        cost = _cost(_core_matrix(side, F, B[i], inv, ring), int(lb[i]), effort)
        evaluated += 1
        if best is None or cost < best:
            best, tied = cost, [i]
        elif cost == best:
            tied.append(i)
    # tie-break: the cheapest basis change among the cheapest cores
    choice = min(tied, key=lambda i: (_basis_cost(side, B[i], adj[i], det[i], ring, effort), i))
    return B[choice].astype(np.int64), evaluated


def _basis_cost(side, basis, adj, det, ring, effort) -> tuple[int, int]:
    M = _runtime_basis(side, basis, _exact_inverse(adj, det, ring))
    nz = M != 0
    # rows and columns of an invertible matrix are pairwise independent
    lb = max(int((nz.sum(1) >= 2).sum()), int((nz.sum(0) >= 2).sum()))
    return _cost(M, lb, effort)


# ---- heuristic search (larger bases) ---------------------------------------------------------

class _Climb:
    """Local search over one side's basis by elementary row operations B ← (I + s·e_i e_jᵀ) B,
    which keep B invertible; B and B⁻¹ stay integral, entries of B in {−1, 0, 1}."""

    def __init__(self, side: str, F: np.ndarray, ring: str, effort: int, rng: random.Random):
        self.side, self.F, self.ring, self.effort, self.rng = side, F, ring, effort, rng
        self.Fi = _integer_rows(F) % 2 if ring == "gf2" else _integer_rows(F)
        d = F.shape[1]
        signs = (1,) if ring == "gf2" else (1, -1)
        self.moves = [(i, j, s) for i in range(d) for j in range(d) if i != j for s in signs]
        self.identity = np.eye(d, dtype=np.int64)

    def step(self, Bm, Binv, move):
        i, j, s = move
        B2, I2 = Bm.copy(), Binv.copy()
        B2[i] += s * B2[j]
        I2[:, j] -= s * I2[:, i]           # (EB)⁻¹ = B⁻¹E⁻¹, E⁻¹ = I − s·e_i e_jᵀ
        if self.ring == "gf2":
            B2 %= 2
            I2 %= 2
        elif np.abs(B2[i]).max() > 1:
            return None
        return B2, I2

    def neighbours(self, Bm, Binv):
        return [nxt for mv in self.moves if (nxt := self.step(Bm, Binv, mv)) is not None]

    def naive_counts(self, Bm, Binv) -> tuple[int, int]:
        """Naive additions of the core stage and of the basis change: integer zero patterns."""
        G = self.Fi @ (Bm.T if self.side == "C" else Binv)
        nz = (G % 2 if self.ring == "gf2" else G) != 0
        core = np.clip(nz.sum(0 if self.side == "C" else 1) - 1, 0, None).sum()
        run = Binv if self.side == "C" else Bm
        return int(core), int(np.clip((run != 0).sum(1) - 1, 0, None).sum())

    def cse_key(self, Bm, Binv) -> tuple[int, int, int, int]:
        core = _core_matrix(self.side, self.F, Bm, Binv.astype(object), self.ring)
        pc = stage_program(core, self.effort)
        pb = stage_program(_runtime_basis(self.side, Bm, Binv), self.effort)
        return (pc.additions, pc.scalings, pb.additions, pb.scalings)

    def descend(self, Bm, Binv, budget: int, visited: dict) -> int:
        """Steepest descent on the naive counts, walking a plateau for at most d steps;
        every basis reached goes into ``visited``.  Returns the evaluations used."""
        cur, used, sideways = self.naive_counts(Bm, Binv), 0, 0
        while used < budget:
            nbrs = [(self.naive_counts(*nxt), nxt) for nxt in self.neighbours(Bm, Binv)]
            used += len(nbrs)
            low = min((c for c, _ in nbrs), default=None)
            if low is None or low > cur or (low == cur and sideways >= len(Bm)):
                break
            sideways = sideways + 1 if low == cur else 0
            cur, (Bm, Binv) = low, self.rng.choice([nxt for c, nxt in nbrs if c == low])
            visited.setdefault(Bm.tobytes(), (cur, Bm, Binv))
        return used

    def polish(self, Bm, Binv, budget: int):
        """First-improvement moves on the CSE counts themselves; (B, evaluations used)."""
        cur, used, improved = self.cse_key(Bm, Binv), 0, True
        while improved and used < budget:
            improved = False
            nbrs = self.neighbours(Bm, Binv)
            for nxt in self.rng.sample(nbrs, len(nbrs)):
                k2, used = self.cse_key(*nxt), used + 1
                if k2 < cur:
                    cur, (Bm, Binv), improved = k2, nxt, True
                    break
                if used >= budget:
                    break
        return Bm, used


def _heuristic(side: str, F: np.ndarray, ring: str, effort: int, evaluations: int,
               restarts: int, polish: int, rng: random.Random):
    """Descents on the naive counts from the given basis and from random ones; the CSE ranks
    the best few bases they reach (and the given basis, so the result is never worse than
    it), and first-improvement moves on the CSE counts polish the winner."""
    climb = _Climb(side, F, ring, effort, rng)
    ident = climb.identity
    visited = {ident.tobytes(): (climb.naive_counts(ident, ident), ident, ident)}
    evaluated = 1
    for start in range(max(1, restarts)):
        Bm, Binv = ident, ident
        for _ in range(len(ident) if start else 0):   # start 0 is the given basis
            Bm, Binv = climb.step(Bm, Binv, rng.choice(climb.moves)) or (Bm, Binv)
        evaluated += climb.descend(Bm, Binv, max(1, evaluations // max(1, restarts)), visited)
    pool = sorted(visited.values(), key=lambda e: e[0])[:_CSE_POOL] + [visited[ident.tobytes()]]
    scored = [(climb.cse_key(Bm, Binv), Bm.tobytes(), Bm, Binv) for _, Bm, Binv in pool]
    _, _, Bm, Binv = min(scored, key=lambda e: (e[0], e[1]))
    Bm, used = climb.polish(Bm, Binv, polish)
    return Bm, evaluated + len(scored) + used


# ---- entry points ----------------------------------------------------------------------------

def search_basis(alg, *, ring: str | None = None, effort: int = 1, evaluations: int = 20000,
                 restarts: int = 4, polish: int = 150, seed: int = _SEED) -> BasisSearchResult:
    """Basis changes φ, ψ, υ for ``alg`` that minimise its core's additions (then the basis
    changes' additions).  ``ring="gf2"`` searches over GF(2) (a rational ``alg`` is reduced
    modulo 2 first).  Bases up to 4×4 are searched exhaustively; larger ones by the heuristic,
    with ``evaluations`` CSE evaluations per side over ``restarts`` starts.  The pair returned
    has been verified exactly."""
    ring = ring or ring_of(alg)
    src = reduce_mod2(alg) if ring == "gf2" else require_rational(alg)
    rng = random.Random(seed)
    bases, method, evaluated = {}, {}, {}
    for side in SIDES:
        F = _factor(src, side)
        if F.shape[1] <= EXHAUSTIVE_MAX_DIM:
            bases[side], evaluated[side] = _exhaustive(side, F, ring, effort)
            method[side] = "exhaustive"
        else:
            bases[side], evaluated[side] = _heuristic(side, F, ring, effort, evaluations,
                                                      restarts, polish, rng)
            method[side] = "heuristic"
    how = ", ".join(f"{s} {method[s]}" for s in SIDES)
    suffix = "-gf2" if ring == "gf2" and ring_of(alg) != "gf2" else ""
    ab = from_standard(src, bases["A"], bases["B"], bases["C"], ring=ring,
                       name=f"{alg.name}-ab{suffix}",
                       source=f"{alg.name} with bases found by search ({how})")
    return BasisSearchResult(ab.verify(), method, evaluated)


def addition_report(alg, *, ring: str = "rational", **search) -> dict:
    """One scheme's addition counts per recursion step: naive, after CSE, and in the best
    alternative basis found (core after CSE, basis changes apart: see
    ``lcmac.ir.alternative_basis``), with the leading coefficient of each for square grids.

    Schema ``lcmac-alternative-basis-report/1``: name, grid, rank, ring, additions {naive,
    cse, core, basis_changes, core_stages {A,B,H}, basis_stages {A,B,C}}, leading_coefficient
    {naive, cse, core} (strings "p/q" or null), search {A,B,C: method}, bases {phi, psi,
    upsilon} (nested lists of strings)."""
    if ring not in ("rational", "gf2"):
        raise AlgorithmError(f"ring {ring!r} is not 'rational' or 'gf2'")
    src = reduce_mod2(alg) if ring == "gf2" else require_rational(alg)
    std = addition_counts(src)
    res = search_basis(src, ring=ring, **search)
    ab = res.algorithm
    counts = ab.addition_counts()
    core, basis = counts["core"]["reduced"], counts["basis_changes"]["reduced"]
    adds = {"naive": std["naive"]["total"], "cse": std["reduced"]["total"],
            "core": core["total"], "basis_changes": basis["total"],
            "core_stages": {s: core[s] for s in "ABH"},
            "basis_stages": {s: basis[s] for s in "ABC"}}

    def lead(q):
        c = leading_coefficient(q, src.grid, src.R)
        return None if c is None else str(c)

    def enc(M):
        return [[str(x) for x in row] for row in M.tolist()]

    return {"name": alg.name, "grid": list(src.grid), "rank": src.R, "ring": ring,
            "additions": adds,
            "leading_coefficient": {k: lead(adds[k]) for k in ("naive", "cse", "core")},
            "search": dict(res.method),
            "bases": {"phi": enc(ab.phi), "psi": enc(ab.psi), "upsilon": enc(ab.upsilon)}}
