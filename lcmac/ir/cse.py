"""Common-subexpression elimination for the three combine stages.

``optimize(M)`` turns an exact coefficient matrix (outputs × inputs) into a
``LinearProgram`` with few additions.  The method is greedy pairwise CSE (Paar's
heuristic generalised to rational coefficients): a "pair" is two slots whose
coefficients stand in the same ratio r in several rows, so each of those rows can use
one shared temporary ``x_a + r·x_b``.  The most frequent pair is extracted until no
pair occurs twice.  Ties are broken deterministically on the first run and by a seeded
RNG on restarts; the problem is also solved transposed (transposition principle:
the transposed program costs ``n_in - n_out`` more additions) and the cheapest program
wins.  Every result is checked exactly against ``M``.

``optimized_programs(alg)`` also considers programs supplied with the algorithm
(``alg.programs``), after checking them exactly.
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import warnings
from fractions import Fraction
from pathlib import Path

import numpy as np

from lcmac.core.cachedir import cache_root
from lcmac.ir.algorithm import Algorithm, _exact
from lcmac.ir.program import LinearProgram, combine_matrices, naive_program

__all__ = ["optimize", "optimized_programs", "addition_counts", "transpose_program"]

STAGES = ("A", "B", "H")
_SEED = 0x1C3AC
_WORK_BUDGET = 20000


def _norm(x):
    """Exact coefficient, integral values as ``int`` (keeps ±1 on the fast path)."""
    if isinstance(x, Fraction) and x.denominator == 1:
        return int(x)
    return x


def _ratio(c1, c2):
    """c2 / c1 exactly."""
    if type(c1) is int and (c1 == 1 or c1 == -1):
        return c2 * c1
    return _norm(Fraction(c2) / c1)


def _exact_matrix(M) -> np.ndarray:
    M = np.asarray(M, dtype=object)
    if M.ndim != 2:
        raise ValueError(f"optimize needs a 2-D matrix, got {M.ndim}-D")
    out = np.empty(M.shape, dtype=object)
    for idx, x in np.ndenumerate(M):
        out[idx] = _exact(x)
    return out


def _same(A: np.ndarray, B: np.ndarray) -> bool:
    return A.shape == B.shape and all(a == b for a, b in zip(A.flat, B.flat))


# ---- greedy pairwise CSE -----------------------------------------------------------------

class _Greedy:
    """One greedy run; ``rng`` None means deterministic (oldest pair among the ties).

    Pair occurrences are kept in buckets by count so picking the most frequent pair
    does not scan every pair (matters for 300+-row composed schemes).
    """

    def __init__(self, rows: list[dict], n_in: int, rng: random.Random | None):
        self.rows = [dict(r) for r in rows]
        self.n_in = n_in
        self.rng = rng
        self.temps: list[tuple] = []
        self.pairs: dict[tuple, set[int]] = {}
        self.buckets: dict[int, dict[tuple, None]] = {}
        self.top = 0
        for i, row in enumerate(self.rows):
            items = sorted(row.items())
            for x in range(len(items)):
                sa, ca = items[x]
                for y in range(x + 1, len(items)):
                    sb, cb = items[y]
                    self._add((sa, sb, _ratio(ca, cb)), i)

    def _key(self, sa, ca, sb, cb):
        return (sa, sb, _ratio(ca, cb)) if sa < sb else (sb, sa, _ratio(cb, ca))

    def _move(self, key, old, new):
        if old:
            b = self.buckets[old]
            del b[key]
        if new:
            self.buckets.setdefault(new, {})[key] = None
            if new > self.top:
                self.top = new

    def _add(self, key, i):
        s = self.pairs.setdefault(key, set())
        if i not in s:
            s.add(i)
            self._move(key, len(s) - 1, len(s))

    def _drop(self, key, i):
        s = self.pairs.get(key)
        if s is not None and i in s:
            s.discard(i)
            self._move(key, len(s) + 1, len(s))
            if not s:
                del self.pairs[key]

    def _pick(self):
        while self.top >= 2 and not self.buckets.get(self.top):
            self.top -= 1
        if self.top < 2:
            return None
        ties = self.buckets[self.top]
        if self.rng is None:
            return next(iter(ties))
        return list(ties)[self.rng.randrange(len(ties))]

    def run(self):
        while True:
            key = self._pick()
            if key is None:
                break
            a, b, r = key
            t = self.n_in + len(self.temps)
            self.temps.append(((1, a), (r, b)))
            for i in sorted(self.pairs[key]):
                row = self.rows[i]
                ca = row.pop(a)
                row.pop(b)
                for s, c in row.items():
                    self._drop(self._key(a, ca, s, c), i)
                    self._drop(self._key(b, ca * r, s, c), i)
                self._drop(key, i)
                for s, c in row.items():
                    self._add((s, t, _ratio(c, ca)), i)
                row[t] = ca
        outs = tuple(tuple((c, s) for s, c in sorted(row.items())) for row in self.rows)
        return LinearProgram(self.n_in, tuple(self.temps), outs)


def _rows(M: np.ndarray) -> list[dict]:
    return [{j: _norm(M[i, j]) for j in range(M.shape[1]) if M[i, j] != 0}
            for i in range(M.shape[0])]


def _prune(p: LinearProgram) -> LinearProgram:
    """Inline temporaries used exactly once (same additions, fewer slots/stores)."""
    n = p.n_inputs
    uses = [0] * len(p.temps)
    for e in p.temps + p.outputs:
        for _, s in e:
            if s >= n:
                uses[s - n] += 1
    if all(u > 1 for u in uses):
        return p
    new_temps: list[tuple] = []
    # slot -> either ("slot", new_slot) or ("expr", terms) for inlined temps
    remap: dict[int, tuple] = {}

    def sub(expr):
        acc: dict[int, object] = {}
        order: list[int] = []
        for c, s in expr:
            kind, v = remap.get(s, ("slot", s)) if s >= n else ("slot", s)
            terms = [(1, v)] if kind == "slot" else v
            for c2, s2 in terms:
                if s2 not in acc:
                    order.append(s2)
                    acc[s2] = 0
                acc[s2] = acc[s2] + c * c2
        return tuple((_norm(acc[s]), s) for s in order if acc[s] != 0)

    for idx, t in enumerate(p.temps):
        e = sub(t)
        if uses[idx] <= 1:
            remap[n + idx] = ("expr", e)
        else:
            remap[n + idx] = ("slot", n + len(new_temps))
            new_temps.append(e)
    return LinearProgram(n, tuple(new_temps), tuple(sub(o) for o in p.outputs))


def transpose_program(p: LinearProgram) -> LinearProgram:
    """The transposed program (computes ``p.matrix().T``) by reversing the DAG's edges."""
    n_in, n_t, n_out = p.n_inputs, len(p.temps), p.n_outputs
    # out-edges of every original node: inputs and temps (outputs have none)
    outs: list[list[tuple]] = [[] for _ in range(n_in + n_t)]
    for ti, e in enumerate(p.temps):
        for c, s in e:
            outs[s].append((c, ("t", ti)))
    for oi, e in enumerate(p.outputs):
        for c, s in e:
            outs[s].append((c, ("o", oi)))
    # new slots: original outputs are the inputs 0..n_out-1; each original temp becomes a
    # linear combination of new slots (a temp if it has ≥2 terms, else an alias)
    val: dict[tuple, tuple] = {("o", oi): ((1, oi),) for oi in range(n_out)}
    temps: list[tuple] = []

    def combo(edges):
        acc: dict[int, object] = {}
        order: list[int] = []
        for c, dst in edges:
            for c2, s2 in val[dst]:
                if s2 not in acc:
                    order.append(s2)
                    acc[s2] = 0
                acc[s2] = acc[s2] + c * c2
        return tuple((_norm(acc[s]), s) for s in order if acc[s] != 0)

    for ti in reversed(range(n_t)):
        e = combo(outs[n_in + ti])
        if len(e) >= 2:
            temps.append(e)
            val[("t", ti)] = ((1, n_out + len(temps) - 1),)
        else:
            val[("t", ti)] = e
    outputs = tuple(combo(outs[i]) for i in range(n_in))
    return _prune(LinearProgram(n_out, tuple(temps), outputs))


def _cost(p: LinearProgram) -> tuple:
    return (p.additions, p.scalings, len(p.temps))


def optimize(M: np.ndarray, *, effort: int = 2, seed: int = _SEED) -> LinearProgram:
    """A straight-line program computing the exact matrix ``M`` (n_out × n_in) with few adds.

    ``effort`` scales the number of randomized greedy restarts (0: one deterministic run
    per orientation); results are deterministic for a given ``seed``.
    """
    M = _exact_matrix(M)
    n_out, n_in = M.shape
    best = naive_program(M)
    if n_out == 0 or n_in == 0:
        return best
    for transposed in (False, True):
        src = M.T if transposed else M
        rows = _rows(src)
        # restarts shrink for big matrices (pair bookkeeping grows with Σ nnz²)
        work = sum(len(r) ** 2 for r in rows)
        restarts = max(0, int(effort)) * 8
        if work > _WORK_BUDGET:
            restarts = min(restarts, max(int(effort), restarts * _WORK_BUDGET // work))
        rng = random.Random(seed * 2 + transposed)
        for run in range(1 + restarts):
            p = _Greedy(rows, src.shape[1], None if run == 0 else rng).run()
            p = transpose_program(p) if transposed else _prune(p)
            if _cost(p) < _cost(best):
                best = p
    assert _same(best.matrix(), M), "CSE produced a program that does not compute M"
    return best


# ---- per-algorithm selection -----------------------------------------------------------

_CACHE: dict[tuple, dict[str, LinearProgram]] = {}


def _supplied(alg: Algorithm, stage: str, M: np.ndarray) -> LinearProgram | None:
    d = (alg.programs or {}).get(stage)
    if d is None:
        return None
    try:
        p = LinearProgram.from_dict(d)
        ok = p.n_inputs == M.shape[1] and p.n_outputs == M.shape[0] and _same(p.matrix(), M)
    except Exception as e:  # malformed dict: treat as wrong
        ok, p = False, None
        why = f"{type(e).__name__}: {e}"
    else:
        why = "its matrix differs from the stage matrix"
    if not ok:
        warnings.warn(f"{alg.name}: supplied program for stage {stage} ignored ({why})",
                      stacklevel=3)
        return None
    return p


# Bump when optimize() changes what it returns, so stale disk entries are not reused.
_CSE_VERSION = 1


def cache_dir() -> Path | None:
    """Where CSE results persist between runs (``LCMAC_CACHE_DIR``, else the XDG cache);
    ``LCMAC_CACHE_DIR=off`` disables the disk cache."""
    root = cache_root()
    return None if root is None else root / "cse"


def _disk_path(key: tuple) -> Path | None:
    d = cache_dir()
    if d is None:
        return None
    digest = hashlib.sha256(json.dumps([_CSE_VERSION, *key]).encode()).hexdigest()[:32]
    return d / f"{digest}.json"


def _disk_read(path: Path | None, mats: dict) -> dict | None:
    """The cached programs, each re-checked exactly against its stage matrix (a corrupt or
    stale entry is ignored, never trusted)."""
    if path is None or not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text())
        out = {st: LinearProgram.from_dict(doc[st]) for st in mats}
        if all(_same(out[st].matrix(), M) for st, M in mats.items()):
            return out
    except Exception:  # noqa: BLE001 - any damage means recompute
        pass
    return None


def _disk_write(path: Path | None, progs: dict) -> None:
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({st: p.to_dict() for st, p in progs.items()}))
        os.replace(tmp, path)         # atomic: a reader never sees half a file
    except OSError:
        pass                          # a read-only home only costs speed


def optimized_programs(alg: Algorithm, *, effort: int = 2) -> dict[str, LinearProgram]:
    """Per stage ("A", "B", "H") the cheapest of our CSE and the verified supplied program.
    Results are memoised in-process and on disk (``cache_dir()``): the search takes seconds
    for the large schemes, the exact re-check on load milliseconds."""
    key = (alg.hash, json.dumps(alg.programs, sort_keys=True, default=str), effort)
    hit = _CACHE.get(key)
    if hit is not None:
        return dict(hit)
    mats = combine_matrices(alg)
    path = _disk_path(key)
    out = _disk_read(path, mats)
    if out is not None:
        for stage, M in mats.items():
            _supplied(alg, stage, M)    # a cache hit still warns about a bad supplied program
    else:
        out = {}
        for stage, M in mats.items():
            own = optimize(M, effort=effort)
            sup = _supplied(alg, stage, M)
            out[stage] = sup if sup is not None and _cost(sup) < _cost(own) else own
        _disk_write(path, out)
    _CACHE[key] = out
    return dict(out)


def addition_counts(alg: Algorithm) -> dict:
    """{"naive": {"A","B","H","total"}, "reduced": {...}} addition counts."""
    naive = {k: naive_program(M).additions for k, M in combine_matrices(alg).items()}
    red = {k: p.additions for k, p in optimized_programs(alg).items()}
    naive["total"] = sum(naive[s] for s in STAGES)
    red["total"] = sum(red[s] for s in STAGES)
    return {"naive": naive, "reduced": red}
