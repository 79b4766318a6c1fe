"""The LCMA value type: ``<m,k,n,R,U,V,W>`` with exact coefficients.

Convention (used everywhere in lcmac):

    A is cut into an m x k grid of blocks A[i][l], B into k x n, C into m x n, and

        Ã_r = Σ U[r,i,l] A[i][l]      B̃_r = Σ V[r,l,j] B[l][j]
        H_r = Ã_r · B̃_r               C[i][j] = Σ W[r,i,j] H_r

Coefficients are exact: Python ``int`` or ``fractions.Fraction``.  Arrays handed out are
read-only numpy object arrays so an ``Algorithm`` is a true value (hashable, comparable).
"""
from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Iterable

import numpy as np

from lcmac.core.errors import AlgorithmError


def _exact(x) -> int | Fraction:
    """One coefficient as an exact number; floats must be exactly representable small rationals."""
    if isinstance(x, (bool, np.bool_)):
        return int(x)
    if isinstance(x, (int, np.integer)):
        return int(x)
    if isinstance(x, Fraction):
        return int(x) if x.denominator == 1 else x
    if isinstance(x, str):
        try:
            f = Fraction(x.strip())
        except (ValueError, ZeroDivisionError) as e:
            raise AlgorithmError(f"coefficient {x!r} is not a number") from e
        return int(f) if f.denominator == 1 else f
    if isinstance(x, (float, np.floating)):
        if not np.isfinite(x):
            raise AlgorithmError(f"coefficient {x!r} is not finite")
        f = Fraction(float(x)).limit_denominator(1 << 12)
        if float(f) != float(x):
            raise AlgorithmError(f"coefficient {x!r} is not an exact small rational")
        return int(f) if f.denominator == 1 else f
    raise AlgorithmError(f"coefficient {x!r} of type {type(x).__name__} is not a number")


def _exact_array(a, shape: tuple[int, ...], what: str) -> np.ndarray:
    arr = np.asarray(a, dtype=object)
    if arr.shape != shape:
        raise AlgorithmError(f"{what} has shape {arr.shape}, expected {shape}")
    out = np.empty(shape, dtype=object)
    for idx, x in np.ndenumerate(arr):
        out[idx] = _exact(x)
    out.flags.writeable = False
    return out


def _frozen(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


class SchemeShape:
    """What every scheme value type (``Algorithm``, ``GF2Algorithm``,
    ``AlternativeBasisAlgorithm``) derives from its grid m, k, n and U [R, m, k]."""

    @property
    def R(self) -> int:
        return self.U.shape[0]

    @property
    def grid(self) -> tuple[int, int, int]:
        return (self.m, self.k, self.n)

    @property
    def naive_rank(self) -> int:
        return self.m * self.k * self.n

    @property
    def saving(self) -> float:
        """Fraction of block multiplications saved against the naive m·k·n."""
        return 1.0 - self.R / self.naive_rank


@dataclass(frozen=True, eq=False)
class Algorithm(SchemeShape):
    """An exact bilinear algorithm for the <m,k,n> matrix product using R multiplications."""

    m: int
    k: int
    n: int
    U: np.ndarray  # R x m x k
    V: np.ndarray  # R x k x n
    W: np.ndarray  # R x m x n
    name: str = ""
    source: str = ""
    #: an optional straight-line program supplied with the scheme (e.g. an addition-reduced
    #: catalogue entry); lcmac.ir.program uses it when it beats its own CSE.
    programs: dict | None = field(default=None, compare=False)

    def __post_init__(self):
        for d, nm in ((self.m, "m"), (self.k, "k"), (self.n, "n")):
            if not isinstance(d, (int, np.integer)) or d < 1:
                raise AlgorithmError(f"grid dimension {nm}={d!r} must be a positive integer")
        U = np.asarray(self.U, dtype=object)
        if U.ndim != 3:
            raise AlgorithmError(f"U must be R x m x k (3-D), got {U.ndim}-D")
        R = U.shape[0]
        if R < 1:
            raise AlgorithmError("rank R must be at least 1")
        object.__setattr__(self, "m", int(self.m))
        object.__setattr__(self, "k", int(self.k))
        object.__setattr__(self, "n", int(self.n))
        object.__setattr__(self, "U", _exact_array(self.U, (R, self.m, self.k), "U"))
        object.__setattr__(self, "V", _exact_array(self.V, (R, self.k, self.n), "V"))
        object.__setattr__(self, "W", _exact_array(self.W, (R, self.m, self.n), "W"))
        if not self.name:
            object.__setattr__(self, "name", f"custom-{self.m}x{self.k}x{self.n}-r{R}")

    # ---- basic properties (R, grid, naive_rank, saving: SchemeShape) -------------------
    @property
    def is_integral(self) -> bool:
        return all(isinstance(x, int) for t in (self.U, self.V, self.W) for x in t.flat)

    @property
    def is_ternary(self) -> bool:
        """All coefficients in {-1, 0, 1} (the catalogue's admission rule)."""
        return all(x in (-1, 0, 1) for t in (self.U, self.V, self.W) for x in t.flat)

    def nnz(self) -> dict[str, int]:
        """‖U‖₀, ‖V‖₀, ‖W‖₀: the paper's measure of combine work."""
        return {nm: int(sum(1 for x in t.flat if x != 0)) for nm, t in
                (("U", self.U), ("V", self.V), ("W", self.W))}

    def naive_additions(self) -> dict[str, int]:
        """Additions of the unoptimised combines: each output with q terms costs q-1."""
        u = sum(max(0, int(sum(1 for x in self.U[r].flat if x != 0)) - 1) for r in range(self.R))
        v = sum(max(0, int(sum(1 for x in self.V[r].flat if x != 0)) - 1) for r in range(self.R))
        w = 0
        for i in range(self.m):
            for j in range(self.n):
                w += max(0, int(sum(1 for r in range(self.R) if self.W[r, i, j] != 0)) - 1)
        return {"U": u, "V": v, "W": w, "total": u + v + w}

    def as_float(self, dtype=np.float64) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return tuple(np.array([float(x) for x in t.flat], dtype=dtype).reshape(t.shape)
                     for t in (self.U, self.V, self.W))

    # ---- identity ---------------------------------------------------------------------
    def canonical_json(self) -> str:
        """Coefficients only (no name): the basis of the hash."""
        def enc(t):
            return [str(x) for x in t.flat]
        return json.dumps({"grid": [self.m, self.k, self.n], "R": self.R,
                           "U": enc(self.U), "V": enc(self.V), "W": enc(self.W)},
                          separators=(",", ":"))

    @property
    def hash(self) -> str:
        return hashlib.sha256(self.canonical_json().encode()).hexdigest()[:16]

    def __eq__(self, other):
        return isinstance(other, Algorithm) and self.canonical_json() == other.canonical_json()

    def __hash__(self):
        return hash(self.canonical_json())

    def __repr__(self):
        return f"Algorithm({self.name!r}, <{self.m},{self.k},{self.n};{self.R}>)"

    def renamed(self, name: str, source: str | None = None) -> "Algorithm":
        return Algorithm(self.m, self.k, self.n, self.U, self.V, self.W, name=name,
                         source=self.source if source is None else source,
                         programs=self.programs)

    # ---- serialisation ------------------------------------------------------------------
    def to_dict(self) -> dict:
        """lcmac's own JSON form (``format: lcmac-algorithm/1``); rationals as "p/q" strings."""
        def enc(t):
            return [[[x if isinstance(x, int) else str(x) for x in row] for row in mat]
                    for mat in t.tolist()]
        d = {"format": "lcmac-algorithm/1", "name": self.name, "source": self.source,
             "grid": [self.m, self.k, self.n], "rank": self.R,
             "U": enc(self.U), "V": enc(self.V), "W": enc(self.W)}
        if self.programs:
            # a copy: the caller may edit the dict, and the algorithm is a value
            d["programs"] = copy.deepcopy(self.programs)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Algorithm":
        if not isinstance(d, dict):
            raise AlgorithmError("algorithm JSON must be an object")
        missing = [k for k in ("grid", "U", "V", "W") if k not in d]
        if missing:
            raise AlgorithmError(f"algorithm JSON lacks the field(s) {', '.join(missing)}")
        g = d["grid"]
        if not (isinstance(g, list) and len(g) == 3 and all(isinstance(x, int) for x in g)):
            raise AlgorithmError(f"'grid' must be three integers [m, k, n], got {g!r}")
        programs = d.get("programs")
        if "published_additions" in d:  # a catalogue's own claim, shown beside our count
            programs = {**(programs or {}), "published_additions": d["published_additions"]}
        alg = cls(g[0], g[1], g[2], d["U"], d["V"], d["W"], name=d.get("name", ""),
                  source=d.get("source", ""), programs=programs)
        if "rank" in d and d["rank"] != alg.R:
            raise AlgorithmError(f"'rank' says {d['rank']} but U has {alg.R} rows")
        return alg


def coefficient_array(rows: Iterable, shape) -> np.ndarray:
    """Helper for literal tables in the catalogue."""
    return _frozen(np.array(list(rows), dtype=object).reshape(shape))
