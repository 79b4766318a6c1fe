"""Alternative-basis algorithms: a core scheme plus invertible basis changes of A, B and C.

Karstadt and Schwartz ("Matrix multiplication, a little faster", SPAA 2017; JACM 2020) split
an algorithm ``<U,V,W>`` into three linear maps on block positions and a *core*:

    φ  (mk × mk) acts on the vector of A's blocks (slot i·k+l),
    ψ  (kn × kn) on B's blocks (slot l·n+j),
    υ  (mn × mn) on C's blocks (slot i·n+j),

and the core ``<U',V',W'>`` multiplies the transformed operands:

    Ã_r = Σ U'[r,s] φ(A)_s      B̃_r = Σ V'[r,s] ψ(B)_s      H_r = Ã_r · B̃_r
    υ(C)_s = Σ W'[r,s] H_r      C = υ⁻¹(υ(C))

so the pair computes ``<U'φ, V'ψ, W'υ⁻ᵀ>`` (U', V', W' flattened R × positions).  From a
standard algorithm and bases the core is ``U' = Uφ⁻¹, V' = Vψ⁻¹, W' = Wυᵀ``.  Verification
composes the pair back into a standard scheme and checks its Brent equations with
``lcmac.ir.verify`` (or, for ``ring="gf2"``, modulo 2 with ``lcmac.ir.gf2``).

Recursively the core runs at every node of the recursion tree, while each basis change runs
once per recursion level on a whole operand (φ applied to every 2×2 group of blocks at each
level is φ^{⊗L} in L passes): its cost is O(n² log n) against the core's O(n^ω).  Counts here
follow the papers: *core additions* are the additions of one recursion step of the core's
three combine programs (after CSE), and *basis-change additions* those of φ, ψ and υ⁻¹, paid
once per product and recursion level, in units of blocks of that level.  A product whose
operand is already held in the transformed basis (a weight transformed once, or the result
of a previous product kept in the basis the next product expects) skips that change.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np

from lcmac.core.errors import AlgorithmError, VerificationError
from lcmac.ir.algorithm import Algorithm, SchemeShape, _exact
from lcmac.ir.cse import optimize
from lcmac.ir.gf2 import (
    RINGS, GF2Algorithm, gf2_failures, mod2, reduce_mod2, require_rational, ring_of)
from lcmac.ir.program import LinearProgram, naive_program
from lcmac.ir.verify import brent_failures

__all__ = ["AlternativeBasisAlgorithm", "from_standard", "inverse", "leading_coefficient",
           "stage_program", "exact_product", "CORE_STAGES", "BASIS_STAGES"]

#: combine stages of the core (as lcmac.ir.program) and the three basis changes
CORE_STAGES = ("A", "B", "H")
BASIS_STAGES = ("A", "B", "C")     # φ on A, ψ on B, υ⁻¹ on the core's output


def _check_ring(ring: str) -> str:
    if ring not in RINGS:
        raise AlgorithmError(f"ring {ring!r} is not one of {', '.join(RINGS)}")
    return ring


def _norm(x):
    return int(x) if isinstance(x, Fraction) and x.denominator == 1 else x


def _exact_matrix(M, shape: tuple[int, int], what: str, ring: str) -> np.ndarray:
    arr = np.asarray(M, dtype=object)
    if arr.shape != shape:
        raise AlgorithmError(f"{what} has shape {arr.shape}, expected {shape}")
    out = np.empty(shape, dtype=object)
    for idx, x in np.ndenumerate(arr):
        v = _exact(x)
        out[idx] = mod2(v, f"{what}[{idx[0]},{idx[1]}]") if ring == "gf2" else v
    return out


def exact_product(X: np.ndarray, Y: np.ndarray, ring: str = "rational") -> np.ndarray:
    """Exact product of object matrices (Python ints and Fractions); modulo 2 over GF(2)."""
    P = np.dot(np.asarray(X, dtype=object), np.asarray(Y, dtype=object))
    out = np.empty(P.shape, dtype=object)
    for idx, x in np.ndenumerate(P):
        out[idx] = int(x) % 2 if ring == "gf2" else _norm(x)
    return out


def inverse(M, ring: str = "rational", what: str = "matrix") -> np.ndarray:
    """The exact inverse of a square matrix over the rationals or GF(2) (Gauss–Jordan);
    ``AlgorithmError`` if it is singular there."""
    _check_ring(ring)
    A = np.asarray(M, dtype=object)
    if A.ndim != 2 or A.shape[0] != A.shape[1]:
        raise AlgorithmError(f"{what} must be square, got shape {A.shape}")
    d = A.shape[0]
    one = 1 if ring == "gf2" else Fraction(1)
    rows = [[(mod2(x) if ring == "gf2" else Fraction(_exact(x))) for x in A[i]]
            + [one if j == i else 0 * one for j in range(d)] for i in range(d)]
    for c in range(d):
        p = next((r for r in range(c, d) if rows[r][c] != 0), None)
        if p is None:
            over = "GF(2)" if ring == "gf2" else "the rationals"
            raise AlgorithmError(f"{what} is singular over {over} (no pivot in column {c}); "
                                 f"a basis change must be invertible")
        rows[c], rows[p] = rows[p], rows[c]
        if ring != "gf2":
            piv = rows[c][c]
            rows[c] = [x / piv for x in rows[c]]
        for r in range(d):
            f = rows[r][c]
            if r != c and f != 0:
                rows[r] = [(x - f * y) % 2 if ring == "gf2" else x - f * y
                           for x, y in zip(rows[r], rows[c])]
    out = np.empty((d, d), dtype=object)
    for i in range(d):
        for j in range(d):
            out[i, j] = rows[i][d + j] if ring == "gf2" else _norm(rows[i][d + j])
    return out


@dataclass(frozen=True, eq=False)
class AlternativeBasisAlgorithm(SchemeShape):
    """A core ``<U',V',W'>`` (R×m×k, R×k×n, R×m×n, indexed by transformed block positions)
    with basis changes φ, ψ, υ; ``ring`` is ``"rational"`` or ``"gf2"``."""

    m: int
    k: int
    n: int
    U: np.ndarray
    V: np.ndarray
    W: np.ndarray
    phi: np.ndarray
    psi: np.ndarray
    upsilon: np.ndarray
    ring: str = "rational"
    name: str = ""
    source: str = ""
    upsilon_inverse: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        ring = _check_ring(self.ring)
        core = Algorithm(self.m, self.k, self.n, self.U, self.V, self.W)   # shapes, exactness
        if ring == "gf2":
            core = GF2Algorithm(self.m, self.k, self.n, core.U, core.V, core.W)
        for nm in ("m", "k", "n", "U", "V", "W"):
            object.__setattr__(self, nm, getattr(core, nm))
        m, k, n = self.m, self.k, self.n
        for nm, d, sym in (("phi", m * k, "φ"), ("psi", k * n, "ψ"), ("upsilon", m * n, "υ")):
            B = _exact_matrix(getattr(self, nm), (d, d), f"basis {sym} ({nm})", ring)
            inv = inverse(B, ring, f"basis {sym} ({nm})")
            B.flags.writeable = False
            object.__setattr__(self, nm, B)
            if nm == "upsilon":
                inv.flags.writeable = False
                object.__setattr__(self, "upsilon_inverse", inv)
        if not self.name:
            object.__setattr__(self, "name", f"ab-{m}x{k}x{n}-r{self.R}")

    def core_matrices(self) -> dict[str, np.ndarray]:
        """The core's combine stages (outputs × inputs), as ``program.combine_matrices``."""
        R = self.R
        return {"A": self.U.reshape(R, self.m * self.k), "B": self.V.reshape(R, self.k * self.n),
                "H": np.ascontiguousarray(self.W.reshape(R, self.m * self.n).T)}

    def basis_matrices(self) -> dict[str, np.ndarray]:
        """The maps that run on the operands and the result: φ, ψ and υ⁻¹."""
        return {"A": self.phi, "B": self.psi, "C": self.upsilon_inverse}

    def standard(self):
        """The composed standard scheme ``<U'φ, V'ψ, W'υ⁻ᵀ>``: an ``Algorithm`` over the
        rationals, a ``GF2Algorithm`` over GF(2).  Not verified here (see ``verify``)."""
        R, (m, k, n) = self.R, self.grid
        U = exact_product(self.U.reshape(R, m * k), self.phi, self.ring).reshape(R, m, k)
        V = exact_product(self.V.reshape(R, k * n), self.psi, self.ring).reshape(R, k, n)
        W = exact_product(self.W.reshape(R, m * n), self.upsilon_inverse.T, self.ring)
        W = W.reshape(R, m, n)
        cls = GF2Algorithm if self.ring == "gf2" else Algorithm
        return cls(m, k, n, U, V, W, name=f"{self.name} (standard basis)",
                   source=f"{self.name} composed with its basis changes")

    def failures(self, limit: int | None = None):
        """Failing Brent equations of the composed scheme, in the pair's ring."""
        std = self.standard()
        return gf2_failures(std, limit) if self.ring == "gf2" else brent_failures(std, limit)

    def is_exact(self) -> bool:
        return not self.failures(limit=1)

    def verify(self) -> "AlternativeBasisAlgorithm":
        """``self`` if core and basis changes together compute C = A·B exactly; otherwise
        ``VerificationError`` naming the first failing equation."""
        fails = self.failures(limit=1)
        if fails:
            over = "GF(2)" if self.ring == "gf2" else "the rationals"
            raise VerificationError(f"{self.name} <{self.m},{self.k},{self.n};{self.R}>: the core "
                                    f"with its basis changes φ, ψ, υ does not compute the matrix "
                                    f"product over {over}: {fails[0]}")
        return self

    def addition_counts(self, effort: int = 2) -> dict:
        """``{"core": {"naive", "reduced"}, "basis_changes": {"naive", "reduced"}}``, each a dict
        of stages and ``total``: core stages A, B, H; basis changes A (φ), B (ψ), C (υ⁻¹).
        "reduced" is after lcmac's CSE; over GF(2) its programs are cancellation-free (they
        compute the 0/1 matrix over the integers, hence modulo 2 as well)."""
        out = {}
        parts = (("core", self.core_matrices()), ("basis_changes", self.basis_matrices()))
        for part, mats in parts:
            naive = {s: naive_program(M).additions for s, M in mats.items()}
            red = {s: stage_program(M, effort).additions for s, M in mats.items()}
            naive["total"], red["total"] = sum(naive.values()), sum(red.values())
            out[part] = {"naive": naive, "reduced": red}
        return out

    def require_rational(self) -> "AlternativeBasisAlgorithm":
        """``self`` over the rationals; a GF(2) pair is refused as ``gf2.require_rational`` does."""
        if self.ring == "gf2":
            require_rational(self.standard())
        return self


_PROGRAMS: dict[tuple, LinearProgram] = {}
_PROGRAMS_MAX = 100_000


def stage_program(M: np.ndarray, effort: int = 2) -> LinearProgram:
    """``cse.optimize(M, effort)``, memoised on the matrix's entries: searches evaluate the same
    small matrices many times."""
    key = (M.shape, tuple(str(x) for x in M.flat), effort)
    p = _PROGRAMS.get(key)
    if p is None:
        if len(_PROGRAMS) >= _PROGRAMS_MAX:
            _PROGRAMS.clear()
        p = _PROGRAMS[key] = optimize(M, effort=effort)
    return p


def from_standard(alg, phi, psi, upsilon, *, ring: str | None = None, name: str | None = None,
                  source: str | None = None) -> AlternativeBasisAlgorithm:
    """The pair whose core is ``U' = Uφ⁻¹, V' = Vψ⁻¹, W' = Wυᵀ`` (so it computes what ``alg``
    computes).  ``ring="gf2"`` reduces a rational ``alg`` modulo 2 first; a GF(2) scheme cannot
    be given a rational pair."""
    ring = _check_ring(ring or ring_of(alg))
    if ring == "gf2":
        alg = reduce_mod2(alg)
    else:
        alg = require_rational(alg)
    m, k, n, R = alg.m, alg.k, alg.n, alg.R
    bases = [_exact_matrix(b, (d, d), f"basis {sym}", ring)
             for b, d, sym in ((phi, m * k, "φ"), (psi, k * n, "ψ"), (upsilon, m * n, "υ"))]
    Up = exact_product(alg.U.reshape(R, m * k), inverse(bases[0], ring, "basis φ"), ring)
    Vp = exact_product(alg.V.reshape(R, k * n), inverse(bases[1], ring, "basis ψ"), ring)
    Wp = exact_product(alg.W.reshape(R, m * n), bases[2].T, ring)
    return AlternativeBasisAlgorithm(m, k, n, Up.reshape(R, m, k), Vp.reshape(R, k, n),
                                     Wp.reshape(R, m, n), *bases, ring=ring,
                                     name=name or f"{alg.name}-ab",
                                     source=source or f"{alg.name} in an alternative basis")


def leading_coefficient(additions: int, grid: tuple[int, int, int], R: int) -> Fraction | None:
    """The leading coefficient of the arithmetic cost of the square recursion ``<n0,n0,n0;R>``
    with ``additions`` block additions per step: F(n) = R·F(n/n0) + additions·(n/n0)² gives
    F(n) ≈ (1 + additions/(R − n0²))·n^{log_n0 R}.  Strassen (18) 7, Winograd (15) 6,
    Karstadt–Schwartz (12 in the core) 5.  None for other grids or R ≤ n0²."""
    m, k, n = grid
    if not (m == k == n) or R <= m * m:
        return None
    return 1 + Fraction(additions, R - m * m)
