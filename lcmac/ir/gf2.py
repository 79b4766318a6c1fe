"""Schemes over GF(2): reduction modulo 2, exact verification there, and a value type for
schemes that hold only modulo 2.

Bit matrices multiplied over the binary field (0, 1, XOR, AND) can use any scheme whose
Brent equations hold modulo 2.  Every correct integer scheme reduces to one (−1 becomes 1;
a rational coefficient p/q with q odd becomes p mod 2), and some schemes exist only there:
Strassen's scheme read modulo 2 has no minus signs and is wrong over the integers.

``GF2Algorithm`` carries such a scheme with ``ring = "gf2"``.  It is deliberately not an
``Algorithm``: everything in lcmac that takes an ``Algorithm`` computes over the integers or
the reals, where these coefficients are wrong.  ``require_rational`` is the gate that refuses
it with the reason, and ``as_float`` (what the numeric executors call) refuses the same way.

Verification reuses ``lcmac.ir.verify``: a Brent equation fails over GF(2) exactly when its
integer value differs from the expected one by an odd number.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import ClassVar

import numpy as np

from lcmac.core.errors import AlgorithmError, VerificationError
from lcmac.ir.algorithm import Algorithm, SchemeShape
from lcmac.ir.importers import from_fmm_scheme, load_file
from lcmac.ir.verify import BrentFailure, brent_failures, verify

RINGS = ("rational", "gf2")

__all__ = ["GF2Algorithm", "RINGS", "reduce_mod2", "mod2", "gf2_failures", "verify_gf2",
           "verify_over", "ring_of", "require_rational", "gf2_from_fmm", "load_gf2",
           "CHECK_RINGS", "RingCheck", "check_ring"]


def mod2(x, where: str = "coefficient") -> int:
    """An exact coefficient modulo 2 (0 or 1); a fraction needs an odd denominator."""
    if isinstance(x, Fraction):
        if x.denominator % 2 == 0:
            raise AlgorithmError(f"{where} = {x} has an even denominator, so it has no value "
                                 f"modulo 2")
        return x.numerator % 2          # q odd: q ≡ 1, so p/q ≡ p
    return int(x) % 2


def _mod2_array(t: np.ndarray, what: str) -> np.ndarray:
    out = np.empty(t.shape, dtype=object)
    for idx, x in np.ndenumerate(t):
        out[idx] = mod2(x, f"{what}[{','.join(map(str, idx))}]")
    out.flags.writeable = False
    return out


@dataclass(frozen=True, eq=False)
class GF2Algorithm(SchemeShape):
    """An <m,k,n;R> scheme whose Brent equations hold modulo 2: coefficients 0 or 1.

    Same layout as ``Algorithm`` (U: R×m×k, V: R×k×n, W: R×m×n).  It can be verified
    (``verify_gf2``), counted (``combine_matrices`` and the CSE work on it: a program of
    additions that computes a 0/1 matrix over the integers computes it modulo 2 too), and
    searched for an alternative basis; it cannot be run in integer or floating-point
    arithmetic.
    """

    m: int
    k: int
    n: int
    U: np.ndarray
    V: np.ndarray
    W: np.ndarray
    name: str = ""
    source: str = ""
    ring: ClassVar[str] = "gf2"
    #: no supplied straight-line programs (read by lcmac.ir.cse)
    programs: ClassVar[None] = None

    def __post_init__(self):
        shaped = Algorithm(self.m, self.k, self.n, self.U, self.V, self.W)  # shapes, exactness
        for nm in ("m", "k", "n"):
            object.__setattr__(self, nm, getattr(shaped, nm))
        for nm in ("U", "V", "W"):
            object.__setattr__(self, nm, _mod2_array(getattr(shaped, nm), nm))
        if not self.name:
            object.__setattr__(self, "name", f"gf2-{self.m}x{self.k}x{self.n}-r{shaped.R}")

    def integer_image(self) -> Algorithm:
        """The same 0/1 table as an ``Algorithm``, for counting and for the Brent check; it is
        in general *not* a correct integer scheme and must not be used as one."""
        return Algorithm(self.m, self.k, self.n, self.U, self.V, self.W,
                         name=f"{self.name} (read over the integers)", source=self.source)

    def nnz(self) -> dict[str, int]:
        return self.integer_image().nnz()

    def naive_additions(self) -> dict[str, int]:
        return self.integer_image().naive_additions()

    @property
    def hash(self) -> str:
        """Differs from the hash of the same table read as an integer scheme."""
        body = "gf2:" + self.integer_image().canonical_json()
        return hashlib.sha256(body.encode()).hexdigest()[:16]

    def __eq__(self, other):
        return isinstance(other, GF2Algorithm) and self.hash == other.hash

    def __hash__(self):
        return hash(self.hash)

    def __repr__(self):
        return f"GF2Algorithm({self.name!r}, <{self.m},{self.k},{self.n};{self.R}> over GF(2))"

    def as_float(self, dtype=np.float64):
        """Refused: floating point is not arithmetic modulo 2 (the numeric executors call this)."""
        raise _refusal(self)


def ring_of(alg) -> str:
    """``"gf2"`` for a scheme valid only modulo 2, ``"rational"`` for an ``Algorithm``."""
    return "gf2" if getattr(alg, "ring", None) == "gf2" else "rational"


def _refusal(alg: GF2Algorithm) -> VerificationError:
    fails = brent_failures(alg.integer_image(), limit=1)
    why = (f"over the integers {fails[0]}" if fails else
           "its table happens to hold over the integers too, but it is declared for GF(2) only")
    return VerificationError(
        f"{alg.name} <{alg.m},{alg.k},{alg.n};{alg.R}> is valid only over GF(2) (ring 'gf2': "
        f"its Brent equations hold modulo 2); {why}. It cannot run in integer or floating-point "
        f"arithmetic: use it only where additions are XOR (bit matrices over GF(2)), or use a "
        f"rational scheme")


def require_rational(alg) -> Algorithm:
    """``alg`` if it may be used over the integers and reals; a GF(2)-only scheme is refused
    with a ``VerificationError`` that names the ring and a Brent equation that fails."""
    if ring_of(alg) == "gf2":
        raise _refusal(alg)
    if not isinstance(alg, Algorithm):
        raise AlgorithmError(f"{alg!r} is not an lcmac Algorithm")
    return alg


def reduce_mod2(alg: Algorithm, name: str | None = None) -> GF2Algorithm:
    """The scheme read modulo 2 (−1 → 1, p/q → p mod 2 for odd q).  A correct integer or
    odd-denominator scheme always reduces to a correct GF(2) scheme; a coefficient with an
    even denominator (½, ¼) has no reduction and raises ``AlgorithmError`` naming it."""
    if ring_of(alg) == "gf2":
        return alg
    try:
        U, V, W = (_mod2_array(t, nm) for t, nm in ((alg.U, "U"), (alg.V, "V"), (alg.W, "W")))
    except AlgorithmError as e:
        raise AlgorithmError(f"{alg.name} has no reduction modulo 2: {e}") from None
    return GF2Algorithm(alg.m, alg.k, alg.n, U, V, W, name=name or f"{alg.name}-gf2",
                        source=f"{alg.name} reduced modulo 2")


def gf2_failures(alg, limit: int | None = None) -> list[BrentFailure]:
    """The Brent equations that fail modulo 2 (``got`` is the residue), at most ``limit``.
    An ``Algorithm`` is reduced modulo 2 first."""
    image = reduce_mod2(alg).integer_image()
    out = []
    for f in brent_failures(image):
        if (f.got - f.expected) % 2:
            out.append(BrentFailure(f.a, f.b, f.c, Fraction(f.got % 2), f.expected))
            if limit is not None and len(out) >= limit:
                break
    return out


def verify_gf2(alg):
    """``alg`` unchanged if it computes C = A·B over GF(2); else ``VerificationError`` naming
    the failing equation."""
    fails = gf2_failures(alg)
    if fails:
        more = f" (and {len(fails) - 1} more failing equation(s))" if len(fails) > 1 else ""
        raise VerificationError(f"{alg.name} <{alg.m},{alg.k},{alg.n};{alg.R}> is not a "
                                f"correct matrix product over GF(2): {fails[0]} (mod 2){more}")
    return alg


def verify_over(alg):
    """Verify in the ring the scheme is declared for: GF(2) or the rationals."""
    return verify_gf2(alg) if ring_of(alg) == "gf2" else verify(alg)


#: what ``check_ring`` takes: a ring, or "auto" (the ring the scheme holds in)
CHECK_RINGS = ("auto", *RINGS)


@dataclass(frozen=True)
class RingCheck:
    """The ring a scheme's Brent equations were checked in and the ones failing there;
    ``rational_failures`` counts those that failed over the rationals first, where "auto"
    went on to GF(2)."""
    ring: str
    failures: list
    rational_failures: int | None = None


def check_ring(alg, ring: str = "auto") -> RingCheck:
    """Every Brent equation of ``alg`` checked exactly in ``ring``: "rational", "gf2"
    (modulo 2), or "auto": a GF(2)-only scheme in GF(2), any other over the rationals and,
    only where that fails, modulo 2.  A scheme that holds over the rationals holds modulo 2
    too (with odd denominators), so "auto" never calls a rational scheme GF(2)-only; one with
    an even denominator has no image modulo 2 and keeps its rational failures."""
    if ring not in CHECK_RINGS:
        raise AlgorithmError(f"ring {ring!r} is not one of {', '.join(CHECK_RINGS)}")
    if ring == "gf2" or (ring == "auto" and ring_of(alg) == "gf2"):
        return RingCheck("gf2", gf2_failures(alg))
    fails = brent_failures(alg.integer_image() if ring_of(alg) == "gf2" else alg)
    if ring == "rational" or not fails:
        return RingCheck("rational", fails)
    try:
        if gf2_failures(alg, limit=1):
            return RingCheck("rational", fails)
    except AlgorithmError:          # an even denominator: nothing to read modulo 2
        return RingCheck("rational", fails)
    return RingCheck("gf2", [], rational_failures=len(fails))


def gf2_from_fmm(d: dict, name: str = "", source: str = "") -> GF2Algorithm:
    """A FastMatrixMultiplication scheme marked ``"z2": true`` (valid modulo 2), verified over
    GF(2); ``lcmac.ir.importers`` refuses these because it loads rational schemes only."""
    if not isinstance(d, dict):
        raise AlgorithmError("a FastMatrixMultiplication scheme must be a JSON object")
    if not d.get("z2"):
        raise AlgorithmError("the scheme is not marked 'z2': true; load it with "
                             "lcmac.ir.importers (it is a rational scheme)")
    table = from_fmm_scheme({**d, "z2": False})
    m, k, n = table.grid
    alg = GF2Algorithm(m, k, n, table.U, table.V, table.W,
                       name=name or f"gf2-{m}x{k}x{n}-r{table.R}",
                       source=source or "FastMatrixMultiplication scheme valid modulo 2")
    return verify_gf2(alg)


def load_gf2(path, key: str | None = None) -> list[GF2Algorithm]:
    """Every scheme in ``path`` read modulo 2 and verified over GF(2): AlphaTensor's
    ``factorizations_f2.npz``, flip-graph ``…-mod2`` expression files, FastMatrixMultiplication
    schemes marked ``"z2": true``, lcmac catalogues of ring ``gf2``, or any other file
    ``lcmac.ir.importers.load_file`` reads.  A name gets ``-gf2`` appended if it lacks it."""
    path = Path(path)
    if path.suffix == ".json":
        try:
            doc = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, ValueError):
            doc = None                          # load_file reports what is wrong
        if isinstance(doc, dict) and doc.get("z2"):
            return [gf2_from_fmm(doc, source=f"FastMatrixMultiplication scheme {path.name}")]
    out = []
    for t in load_file(path, key, check=False):
        name = t.name if t.name.endswith("-gf2") else f"{t.name}-gf2"
        try:
            out.append(verify_gf2(GF2Algorithm(t.m, t.k, t.n, t.U, t.V, t.W, name=name,
                                               source=t.source)))
        except AlgorithmError as e:
            raise type(e)(f"{path}: {e}") from None
    return out
