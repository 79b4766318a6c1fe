"""Reading algorithms from files: lcmac's own JSON and the public catalogues' formats.

``load_file(path)`` detects the format and returns a list of verified ``Algorithm`` values:

* ``.npz`` in AlphaTensor's layout (``algorithms/factorizations_r.npz`` of
  google-deepmind/alphatensor): one entry per key ``"m,k,n"``, each ``(u, v, w)`` with
  ``u`` of shape (m·k, R) indexed by ``i·k+l``, ``v`` (k·n, R) indexed by ``l·n+j`` and
  ``w`` (n·m, R) indexed by ``j·m+i``: AlphaTensor's third factor describes Cᵀ, so lcmac
  transposes it back.  ``key="m,k,n"`` picks one entry.
* FastMatrixMultiplication JSON (dronperminov/FastMatrixMultiplication): a scheme
  (``{"n": [m,k,n], "m": R, "u": R×mk, "v": R×kn, "w": R×nm}``; ``w`` is again indexed by
  ``j·m+i``) or an addition-reduced scheme (``u_fresh``/``u``, ``v_fresh``/``v``,
  ``w_fresh``/``w`` straight-line programs), which becomes an algorithm carrying its
  ``programs`` (lcmac ``LinearProgram`` dicts for the stages A, B, H).
* FastMatrixMultiplication ``.m`` text (``{{{A}, {B}, {Cᵀ}}, ...}`` per product) and
  ``.txt`` (``m k n R``, then u, v, w flattened).
* Expression files (``.exp``; jakobmoosbauer/flips, symmetric-flips ``.txt``), Maple tensor
  files (``.mpl``, ``TriadSet([Triad([Matrix(..), ..]), ..])``) and notebooks holding
  ``decomposition_… = (np.array(..), ..)`` literals (AlphaEvolve's, read without running).
* lcmac JSON: one algorithm (``format: lcmac-algorithm/1``) or a catalogue
  (``format: lcmac-catalogue/1``).

Every algorithm is verified exactly before it is returned.  A malformed or wrong file
raises ``AlgorithmError`` / ``VerificationError`` / ``CatalogueError`` whose message names
the file and the problem (for a wrong coefficient: the failing Brent equation).  A scheme
that holds only modulo 2 is refused with that reason; ``lcmac.ir.gf2.load_gf2`` reads it.
"""
from __future__ import annotations

import ast
import io
import json
import pickle
import re
import zipfile
from fractions import Fraction
from pathlib import Path

import numpy as np

from lcmac.core.errors import AlgorithmError, CatalogueError, LcmacError, VerificationError
from lcmac.ir.algorithm import Algorithm, _exact
from lcmac.ir.program import LinearProgram, combine_matrices
from lcmac.ir.verify import brent_failures, verify

ALGORITHM_FORMAT = "lcmac-algorithm/1"
CATALOGUE_FORMAT = "lcmac-catalogue/1"


# ---- small helpers ------------------------------------------------------------------------

def _grid_name(prefix: str, m: int, k: int, n: int, R: int) -> str:
    return f"{prefix}-{m}x{k}x{n}-r{R}"


def _exact_matrix(a, rows: int, cols: int, what: str) -> np.ndarray:
    """A rows × cols object array of exact coefficients, or AlgorithmError."""
    try:
        arr = np.asarray(a, dtype=object)
    except (ValueError, TypeError) as e:  # ragged nested lists
        raise AlgorithmError(f"{what} is not a rectangular table of numbers ({e})") from None
    if arr.shape != (rows, cols):
        raise AlgorithmError(f"{what} has shape {arr.shape}, expected {(rows, cols)}")
    out = np.empty((rows, cols), dtype=object)
    for idx, x in np.ndenumerate(arr):
        if isinstance(x, (list, dict, tuple)) or x is None:
            raise AlgorithmError(f"{what}[{idx[0]}][{idx[1]}] = {x!r} is not a number")
        out[idx] = _exact(x)
    return out


def _positive_int(x, what: str) -> int:
    if isinstance(x, bool) or not isinstance(x, (int, np.integer)) or x < 1:
        raise AlgorithmError(f"{what} must be a positive integer, got {x!r}")
    return int(x)


def check_programs(alg: Algorithm) -> Algorithm:
    """Check that the straight-line programs an algorithm carries compute its U, V, W."""
    if not alg.programs:
        return alg
    if not isinstance(alg.programs, dict):
        raise AlgorithmError(f"{alg.name}: 'programs' must be an object with stages A, B, H")
    want = combine_matrices(alg)
    for stage, prog in alg.programs.items():
        if stage == "published_additions":  # the catalogue's own claim (see Algorithm.from_dict)
            continue
        if stage not in want:
            raise AlgorithmError(f"{alg.name}: unknown program stage {stage!r} (expected A, B, H)")
        try:
            lp = prog if isinstance(prog, LinearProgram) else LinearProgram.from_dict(prog)
            got = lp.matrix()
        except LcmacError:
            raise
        except (KeyError, TypeError, ValueError, IndexError, ZeroDivisionError) as e:
            raise AlgorithmError(f"{alg.name}: program for stage {stage} is malformed "
                                 f"({type(e).__name__}: {e})") from None
        if got.shape != want[stage].shape:
            raise AlgorithmError(f"{alg.name}: program for stage {stage} computes a "
                                 f"{got.shape} matrix, expected {want[stage].shape}")
        bad = np.argwhere(got != want[stage])
        if len(bad):
            o, i = (int(x) for x in bad[0])
            raise VerificationError(
                f"{alg.name}: program for stage {stage} disagrees with the coefficients: "
                f"output {o}, input {i} is {got[o, i]}, coefficients say {want[stage][o, i]}")
    return alg


def _verified(alg: Algorithm) -> Algorithm:
    try:
        verify(alg)
    except VerificationError:
        fails = brent_failures(alg)
        if alg.is_integral and all((f.got - f.expected) % 2 == 0 for f in fails):
            raise VerificationError(
                f"{alg.name} <{alg.m},{alg.k},{alg.n};{alg.R}> holds only modulo 2: every Brent "
                f"equation holds over GF(2), over the integers {fails[0]}. It cannot be used over "
                f"the integers or reals; lcmac.ir.gf2.load_gf2 reads it as a GF(2) scheme") from None
        raise
    return check_programs(alg)


# ---- AlphaTensor ---------------------------------------------------------------------------

def from_alphatensor(u, v, w, grid: tuple[int, int, int], name: str = "",
                     source: str = "") -> Algorithm:
    """An algorithm from AlphaTensor's factors (u: mk×R, v: kn×R, w: nm×R describing Cᵀ)."""
    m, k, n = (_positive_int(x, "grid dimension") for x in grid)
    try:
        R = int(np.shape(u)[1])
    except (IndexError, TypeError):
        raise AlgorithmError(f"factor u has shape {np.shape(u)}, expected ({m * k}, R)") from None
    if R < 1:
        raise AlgorithmError("factor u has no columns (rank 0)")
    U = _exact_matrix(u, m * k, R, "factor u").T.reshape(R, m, k)
    V = _exact_matrix(v, k * n, R, "factor v").T.reshape(R, k, n)
    Wt = _exact_matrix(w, n * m, R, "factor w").T.reshape(R, n, m)  # [r, j, i]: Cᵀ
    W = np.ascontiguousarray(np.transpose(Wt, (0, 2, 1)))
    return Algorithm(m, k, n, U, V, W, name=name or _grid_name("at", m, k, n, R), source=source)


_KEY = re.compile(r"^\s*(\d+)\s*,\s*(\d+)\s*,\s*(\d+)\s*$")


class _NumpyOnlyUnpickler(pickle.Unpickler):
    """Object arrays in .npz files are pickled; allow only numpy's array reconstruction."""

    _ALLOWED = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
                ("numpy", "ndarray"), ("numpy", "dtype")}

    def find_class(self, module, name):
        if (module, name) not in self._ALLOWED:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a pickle")
        if name == "_reconstruct":
            try:
                from numpy._core.multiarray import _reconstruct
            except ImportError:  # pragma: no cover - numpy < 2
                from numpy.core.multiarray import _reconstruct
            return _reconstruct
        return getattr(np, name)


def _read_npy(data: bytes, member: str):
    """One .npy member; object arrays go through the numpy-only unpickler (no arbitrary code)."""
    f = io.BytesIO(data)
    try:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
        else:
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
    except (ValueError, OSError, EOFError) as e:
        raise AlgorithmError(f"member {member} is not a .npy array ({e})") from None
    if dtype.hasobject:
        try:
            arr = _NumpyOnlyUnpickler(f).load()
        except Exception as e:  # noqa: BLE001 - any unpickling failure is a corrupt file
            raise AlgorithmError(f"member {member} holds an unreadable object array "
                                 f"({type(e).__name__}: {e})") from None
        if not isinstance(arr, np.ndarray):
            raise AlgorithmError(f"member {member} does not hold an array")
        return arr
    f.seek(0)
    try:
        return np.lib.format.read_array(f, allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:
        raise AlgorithmError(f"member {member} is truncated or corrupt ({e})") from None


def read_npz(path: str | Path) -> dict[str, object]:
    """key → array (or tuple of arrays) from an .npz file, safely (no pickle code execution)."""
    path = Path(path)
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, EOFError) as e:
        raise AlgorithmError(f"{path}: not a readable .npz archive ({e})") from None
    out: dict[str, object] = {}
    with zf:
        for member in zf.namelist():
            if not member.endswith(".npy"):
                continue
            try:
                data = zf.read(member)
            except (zipfile.BadZipFile, OSError, EOFError, ValueError, RuntimeError) as e:
                raise AlgorithmError(f"{path}: member {member} is corrupt ({e})") from None
            try:
                out[member[:-4]] = _read_npy(data, member)
            except AlgorithmError as e:
                raise AlgorithmError(f"{path}: {e}") from None
    if not out:
        raise AlgorithmError(f"{path}: the .npz archive holds no arrays")
    return out


def _alphatensor_entry(key: str, value, source: str) -> Algorithm:
    mt = _KEY.match(key)
    if not mt:
        raise AlgorithmError(f"key {key!r} is not of the form 'm,k,n'")
    m, k, n = (int(x) for x in mt.groups())
    if isinstance(value, np.ndarray) and value.dtype != object and value.ndim == 3:
        if len(value) != 3:
            raise AlgorithmError(f"key {key!r}: expected 3 factors (u, v, w), got {len(value)}")
        factors = [value[0], value[1], value[2]]
    else:
        factors = list(value) if isinstance(value, (np.ndarray, list, tuple)) else None
        if factors is None or len(factors) != 3:
            raise AlgorithmError(f"key {key!r}: expected 3 factors (u, v, w)")
    u, v, w = factors
    for nm, f in (("u", u), ("v", v), ("w", w)):
        if not isinstance(f, np.ndarray) or f.ndim != 2:
            raise AlgorithmError(f"key {key!r}: factor {nm} must be a 2-D array, "
                                 f"got shape {np.shape(f)}")
    return from_alphatensor(u, v, w, (m, k, n), source=source)


def load_alphatensor(path: str | Path, key: str | None = None, *, check: bool = True) -> list[Algorithm]:
    path = Path(path)
    entries = read_npz(path)
    if key is not None:
        want = key.replace(" ", "")
        if want not in entries:
            raise AlgorithmError(f"{path}: no key {key!r} (keys: {', '.join(sorted(entries)[:12])}…)")
        entries = {want: entries[want]}
    out = []
    for k_, val in entries.items():
        src = f"AlphaTensor-style factorizations, {path.name} key {k_!r}"
        try:
            a = _alphatensor_entry(k_, val, src)
            out.append(_verified(a) if check else a)
        except VerificationError as e:
            raise VerificationError(f"{path} key {k_!r}: {e}") from None
        except AlgorithmError as e:
            raise AlgorithmError(f"{path}: {e}") from None
        except (ValueError, TypeError, IndexError) as e:
            raise AlgorithmError(f"{path}: key {k_!r} is malformed ({type(e).__name__}: {e})") from None
    return out


# ---- FastMatrixMultiplication --------------------------------------------------------------

def _fmm_grid(d: dict) -> tuple[int, int, int, int]:
    g = d.get("n")
    if not (isinstance(g, list) and len(g) == 3):
        raise AlgorithmError(f"'n' must be the grid [m, k, n], got {g!r}")
    m, k, n = (_positive_int(x, "grid dimension") for x in g)
    R = _positive_int(d.get("m"), "'m' (the rank)")
    if d.get("z2"):
        raise AlgorithmError("the scheme is valid only modulo 2 ('z2': true); lcmac needs exact schemes")
    return m, k, n, R


def from_fmm_scheme(d: dict, name: str = "", source: str = "") -> Algorithm:
    """A FastMatrixMultiplication scheme: u (R×mk, a_il at i·k+l), v (R×kn), w (R×nm, c_ij at j·m+i)."""
    if not isinstance(d, dict):
        raise AlgorithmError("a FastMatrixMultiplication scheme must be a JSON object")
    m, k, n, R = _fmm_grid(d)
    for f in ("u", "v", "w"):
        if f not in d:
            raise AlgorithmError(f"the scheme lacks the field {f!r}")
    U = _exact_matrix(d["u"], R, m * k, "u").reshape(R, m, k)
    V = _exact_matrix(d["v"], R, k * n, "v").reshape(R, k, n)
    W = np.ascontiguousarray(np.transpose(_exact_matrix(d["w"], R, n * m, "w").reshape(R, n, m),
                                          (0, 2, 1)))
    return Algorithm(m, k, n, U, V, W, name=name or _grid_name("fg", m, k, n, R), source=source)


def _fmm_terms(expr, n_slots: int, what: str) -> tuple:
    if not isinstance(expr, list):
        raise AlgorithmError(f"{what} must be a list of {{index, value}} terms, got {expr!r}")
    out = []
    for t in expr:
        if not (isinstance(t, dict) and "index" in t and "value" in t):
            raise AlgorithmError(f"{what}: term {t!r} is not {{\"index\": i, \"value\": c}}")
        idx = t["index"]
        if isinstance(idx, bool) or not isinstance(idx, int) or not 0 <= idx < n_slots:
            raise AlgorithmError(f"{what}: index {idx!r} is out of range 0..{n_slots - 1}")
        out.append((_exact(t["value"]), idx))
    return tuple(out)


def _fmm_program(d: dict, stage: str, n_inputs: int, n_outputs: int,
                 out_perm: list[int] | None = None) -> LinearProgram:
    """``{stage}_fresh`` (temps over inputs and earlier temps) and ``{stage}`` (outputs)."""
    fresh = d.get(f"{stage}_fresh", [])
    outs = d.get(stage)
    if not isinstance(fresh, list):
        raise AlgorithmError(f"'{stage}_fresh' must be a list")
    if not isinstance(outs, list) or len(outs) != n_outputs:
        got = len(outs) if isinstance(outs, list) else type(outs).__name__
        raise AlgorithmError(f"'{stage}' must list {n_outputs} outputs, got {got}")
    temps = tuple(_fmm_terms(e, n_inputs + t, f"{stage}_fresh[{t}]") for t, e in enumerate(fresh))
    total = n_inputs + len(temps)
    outputs = [_fmm_terms(e, total, f"{stage}[{o}]") for o, e in enumerate(outs)]
    if out_perm is not None:
        outputs = [outputs[p] for p in out_perm]
    return LinearProgram(n_inputs, temps, tuple(outputs))


def from_fmm_reduced(d: dict, name: str = "", source: str = "") -> Algorithm:
    """An addition-reduced FastMatrixMultiplication scheme, keeping its straight-line programs.

    FMM's inputs a_il are numbered i·k+l and b_lj l·n+j, as in lcmac; its outputs list c_ij at
    j·m+i (Cᵀ order), which is reordered to lcmac's i·n+j.  Fresh variables follow the inputs.
    """
    if not isinstance(d, dict):
        raise AlgorithmError("a FastMatrixMultiplication scheme must be a JSON object")
    m, k, n, R = _fmm_grid(d)
    pa = _fmm_program(d, "u", m * k, R)
    pb = _fmm_program(d, "v", k * n, R)
    # lcmac output slot i*n+j comes from FMM output j*m+i
    ph = _fmm_program(d, "w", R, m * n, out_perm=[j * m + i for i in range(m) for j in range(n)])
    U = pa.matrix().reshape(R, m, k)
    V = pb.matrix().reshape(R, k, n)
    W = np.ascontiguousarray(ph.matrix().T).reshape(R, m, n)
    progs = {"A": pa.to_dict(), "B": pb.to_dict(), "H": ph.to_dict()}
    published = fmm_published_additions(d)
    if published is not None:
        progs["published_additions"] = published
    return Algorithm(m, k, n, U, V, W, name=name or _grid_name("fgr", m, k, n, R),
                     source=source, programs=progs)


def fmm_published_additions(d: dict) -> int | None:
    """The addition count a reduced FMM scheme claims for itself (``complexity.reduced``)."""
    c = d.get("complexity")
    if isinstance(c, dict) and isinstance(c.get("reduced"), int):
        return c["reduced"]
    return None


_M_TOKEN = re.compile(r"^[\s{},0-9+\-/]*$")


def parse_fmm_text(text: str, name: str = "", source: str = "") -> Algorithm:
    """FastMatrixMultiplication's ``.m`` form: ``{ {{A m×k}, {B k×n}, {Cᵀ n×m}}, ... }``."""
    body = text.strip()
    if not body or not _M_TOKEN.match(body):
        raise AlgorithmError("not a FastMatrixMultiplication .m scheme (expected nested "
                             "{...} lists of integers)")
    js = body.replace("{", "[").replace("}", "]")
    js = re.sub(r"(-?\d+)\s*/\s*(\d+)", r'"\1/\2"', js)
    try:
        data = json.loads(js)
    except json.JSONDecodeError as e:
        raise AlgorithmError(f"malformed .m scheme: {e.msg} at character {e.pos}") from None
    if not isinstance(data, list) or not data or not all(isinstance(p, list) and len(p) == 3
                                                         for p in data):
        raise AlgorithmError("a .m scheme must be a list of {A, B, C} triples")
    try:
        a0, b0 = np.asarray(data[0][0], dtype=object), np.asarray(data[0][1], dtype=object)
        m, k = a0.shape
        n = b0.shape[1]
    except ValueError:
        raise AlgorithmError("the first product's A or B factor is not a matrix") from None
    R = len(data)
    U = _exact_matrix([np.asarray(p[0], dtype=object).ravel().tolist() for p in data], R, m * k,
                      "A factors").reshape(R, m, k)
    V = _exact_matrix([np.asarray(p[1], dtype=object).ravel().tolist() for p in data], R, k * n,
                      "B factors").reshape(R, k, n)
    Wt = _exact_matrix([np.asarray(p[2], dtype=object).ravel().tolist() for p in data], R, n * m,
                       "C factors").reshape(R, n, m)
    W = np.ascontiguousarray(np.transpose(Wt, (0, 2, 1)))
    return Algorithm(m, k, n, U, V, W, name=name or _grid_name("fg", m, k, n, R), source=source)


# ---- expression files (flip-graph catalogues) ----------------------------------------------

# one term of a linear form: sign, coefficient, variable (a12, a_1_12, m7), divisor
_TERM = re.compile(r"([+-]?)(\d+(?:/\d+)?)?\*?([abcm])_?(\d+)(?:_(\d+))?(?:/(\d+))?")
_SCALAR = re.compile(r"[+-]?\d+(?:/\d+)?")


def _linear_form(s: str, what: str) -> list[tuple]:
    """``-a11+2*a12+a21/2`` → [(coefficient, letter, index), ...]; index (i, j) or (r,)."""
    out, pos = [], 0
    while pos < len(s):
        mt = _TERM.match(s, pos)
        if not mt or (pos and not mt.group(1)):
            raise AlgorithmError(f"{what}: cannot read {s!r} at character {pos}")
        sign, coef, letter, i, j, div = mt.groups()
        c = Fraction(coef or 1) / int(div or 1) * (-1 if sign == "-" else 1)
        # a12: one digit per index (dimensions up to 9); a_1_12 otherwise; m7: a product
        idx = (int(i),) if letter == "m" and j is None else (
            (int(i), int(j)) if j is not None else (int(i[0]), int(i[1])) if len(i) == 2 else ())
        if len(idx) != 1 + (letter != "m") or min(idx) < 1:
            raise AlgorithmError(f"{what}: cannot read the variable {mt.group(0)!r} (write "
                                 f"a12, a_1_12 or m7; indices start at 1)")
        out.append((_exact(c), letter, idx))
        pos = mt.end()
    if not out:
        raise AlgorithmError(f"{what}: empty linear form")
    return out


def _factors(line: str, what: str) -> list[str]:
    """Split a product at '*' and where factors touch, ``(..)(..)``, ``a11(..)``, ``(..)c11``,
    outside parentheses; a '*' after a top-level sum is a coefficient's (``b1+2*b2``)."""
    parts, depth, cur, summed = [], 0, "", False
    for ch in line:
        touch = cur and ((ch == "(" and cur[-1] not in "+-*/") or (cur[-1] == ")" and ch.isalnum()))
        if depth == 0 and ((ch == "*" and not summed) or touch):
            parts.append(cur)
            cur, summed = ("" if ch == "*" else ch), False
            depth += ch == "("
            continue
        summed |= depth == 0 and ch in "+-" and cur != ""
        depth += (ch == "(") - (ch == ")")
        if depth < 0:
            raise AlgorithmError(f"{what}: unbalanced ')'")
        cur += ch
    if depth:
        raise AlgorithmError(f"{what}: unbalanced '('")
    parts.append(cur)
    if "" in parts:
        raise AlgorithmError(f"{what}: empty factor in {line!r}")
    return parts


def _wrapped(f: str) -> bool:
    """Whether one pair of parentheses encloses all of ``f``."""
    depth = 0
    for pos, ch in enumerate(f):
        depth += (ch == "(") - (ch == ")")
        if depth == 0:
            return pos == len(f) - 1 and ch == ")"
    return False


def _unwrap(f: str) -> tuple[Fraction, str]:
    """A factor's outer sign and parentheses: '-(a11+a12)' → (-1, 'a11+a12')."""
    sign = Fraction(1)
    if f[:2] in ("-(", "+(") and _wrapped(f[1:]):
        sign, f = Fraction(-1 if f[0] == "-" else 1), f[1:]
    while _wrapped(f):
        f = f[1:-1]
    return sign, f


def _product(line: str, letters: str, what: str) -> dict[str, list]:
    """One product of linear forms, each in its own letter; scalars go to the first."""
    scale, forms, todo = Fraction(1), {}, _factors(line, what)
    while todo:
        f = todo.pop(0)
        sign, body = _unwrap(f)
        if _SCALAR.fullmatch(body):
            scale *= sign * Fraction(body)
            continue
        try:
            terms = _linear_form(body, what)
        except AlgorithmError:
            if len(_factors(body, what)) < 2:
                raise
            scale *= sign                       # -(a11(b11+b12)c11): a product inside
            todo[:0] = _factors(body, what)
            continue
        got = {t[1] for t in terms}
        if len(got) != 1 or not got <= set(letters) or got & set(forms):
            raise AlgorithmError(f"{what}: factor {f!r} must be a linear form in one of "
                                 f"{', '.join(letters)} not used by another factor")
        forms[got.pop()] = [(c * sign, l, idx) for c, l, idx in terms]
    if set(forms) != set(letters):
        raise AlgorithmError(f"{what}: expected factors in {', '.join(letters)}, got "
                             f"{', '.join(sorted(forms)) or 'none'}")
    forms[letters[0]] = [(_exact(c * scale), l, idx) for c, l, idx in forms[letters[0]]]
    return forms


def _tables(products: list[dict], outputs: dict, grid, name: str, source: str) -> Algorithm:
    """U, V, W from per-product a/b forms and, per C entry (i, j), terms (coefficient, r)."""
    if grid is None:                        # a correct scheme reads every entry of A and B
        grid = [max((t[2][d] for p in products for t in p[x]), default=0)
                for x, d in (("a", 0), ("a", 1), ("b", 1))]
    m, k, n = (_positive_int(x, "grid dimension") for x in grid)
    R = len(products)
    U, V, W = (np.zeros((R, *s), dtype=object) for s in ((m, k), (k, n), (m, n)))
    for (t, shape, letter) in ((U, (m, k), "a"), (V, (k, n), "b")):
        for r, p in enumerate(products):
            for c, _, (i, j) in p[letter]:
                if i > shape[0] or j > shape[1]:
                    raise AlgorithmError(f"{letter}{i}{j} is outside the {shape[0]}x{shape[1]} "
                                         f"matrix of <{m},{k},{n}>")
                t[r, i - 1, j - 1] += c
    for (i, j), terms in outputs.items():
        if i > m or j > n:
            raise AlgorithmError(f"C entry ({i},{j}) is outside the {m}x{n} result")
        for c, r in terms:
            W[r, i - 1, j - 1] += c
    return Algorithm(m, k, n, U, V, W, name=name or _grid_name("exp", m, k, n, R), source=source)


def parse_expressions(text: str, name: str = "", source: str = "",
                      grid: tuple[int, int, int] | None = None) -> Algorithm:
    """An expression file: one product per line, ``(a11-a21)*(b12+b22)*(c21)`` (factors joined
    by ``*`` or side by side; ``cJI`` is entry (J, I) of Cᵀ, the trace form Σ a_il·b_lj·c_ji
    of jakobmoosbauer/flips), or statements ``m1 = (a11+a22)*(b11+b22)``, ``c11 = m1+m4``.
    Indices are 1-based, ``a12`` or ``a_1_12``; coefficients integers or fractions (``2*a11``,
    ``1/2*a11``, ``a11/2``).  The grid is read off the largest indices unless given."""
    lines = [ln.split("#")[0].replace(" ", "").replace("\t", "") for ln in text.splitlines()]
    lines = [(no, ln.rstrip(";,")) for no, ln in enumerate(lines, 1) if ln.strip(";,")]
    if not lines:
        raise AlgorithmError("an expression file must list at least one product")
    if any("=" in ln for _, ln in lines):
        return _parse_statements(lines, name, source, grid)
    products, outputs = [], {}
    for r, (no, ln) in enumerate(lines):
        p = _product(ln, "abc", f"line {no}")
        products.append(p)
        for c, _, (j, i) in p["c"]:                 # cJI is C[I][J]
            outputs.setdefault((i, j), []).append((c, r))
    return _tables(products, outputs, grid, name, source)


def _parse_statements(lines, name, source, grid) -> Algorithm:
    prods, outputs = {}, {}
    for no, ln in lines:
        lhs, _, rhs = ln.partition("=")
        what = f"line {no}"
        mt = re.fullmatch(r"m(\d+)|c_?(\d+)_(\d+)|c(\d)(\d)", lhs)
        if not mt:
            raise AlgorithmError(f"{what}: the left side must be a product mR or an entry cIJ "
                                 f"of C, got {lhs!r}")
        if mt.group(1):
            if int(mt.group(1)) in prods:
                raise AlgorithmError(f"{what}: product {lhs} is defined twice")
            prods[int(mt.group(1))] = _product(rhs, "ab", what)
            continue
        ij = tuple(int(x) for x in (mt.group(2, 3) if mt.group(2) else mt.group(4, 5)))
        terms = _linear_form(rhs, what)
        if any(letter != "m" for _, letter, _ in terms):
            raise AlgorithmError(f"{what}: an entry of C must be a sum of products mR, "
                                 f"got {rhs!r}")
        outputs.setdefault(ij, []).extend((c, r - 1) for c, _, (r,) in terms)
    if sorted(prods) != list(range(1, len(prods) + 1)):
        raise AlgorithmError(f"products must be numbered m1..m{len(prods)} without gaps")
    if any(not 0 <= r < len(prods) for t in outputs.values() for _, r in t):
        raise AlgorithmError("an entry of C uses a product that is not defined")
    return _tables([prods[r] for r in sorted(prods)], outputs, grid, name, source)


# ---- Maple tensor files (fmm.univ-lille.fr, FastMatrixMultiplication .tensor.mpl) ----------

_MPL_MATRIX = re.compile(r"Matrix\(\s*(\d+)\s*,\s*(\d+)\s*,\s*(\[.*?\]\s*\])\s*\)", re.S)


def parse_maple_tensor(text: str, name: str = "", source: str = "") -> Algorithm:
    """``Tensor:=TriadSet([Triad([Matrix(m,k,[[..]]), Matrix(k,n,..), Matrix(n,m,..)]), ..])``:
    product r is Trace(T1ᵀA)·Trace(T2ᵀB) added to C with T3ᵀ (T3 describes Cᵀ)."""
    body = text.partition("TriadSet(")[2]
    if not body:
        raise AlgorithmError("not a Maple tensor file (no 'TriadSet(' found)")
    mats = []
    for mt in _MPL_MATRIX.finditer(body):
        rows, cols = int(mt.group(1)), int(mt.group(2))
        js = re.sub(r"(-?\d+)\s*/\s*(\d+)", r'"\1/\2"', mt.group(3))
        try:
            mats.append(_exact_matrix(json.loads(js), rows, cols, f"Matrix #{len(mats) + 1}"))
        except json.JSONDecodeError:
            raise AlgorithmError(f"Matrix #{len(mats) + 1} holds something other than numbers: "
                                 f"{mt.group(3)[:60]!r}") from None
    if not mats or len(mats) % 3 or body.count("Triad(") != len(mats) // 3:
        raise AlgorithmError(f"expected three matrices per Triad, found {len(mats)} matrices in "
                             f"{body.count('Triad(')} triads")
    (m, k), n = mats[0].shape, mats[1].shape[1]
    for r in range(len(mats) // 3):
        if (got := tuple(x.shape for x in mats[3 * r: 3 * r + 3])) != ((m, k), (k, n), (n, m)):
            raise AlgorithmError(f"triad {r + 1} has shapes {got}, expected {((m, k), (k, n), (n, m))}")
    U, V = np.stack(mats[0::3]), np.stack(mats[1::3])
    W = np.ascontiguousarray(np.transpose(np.stack(mats[2::3]), (0, 2, 1)))
    return Algorithm(m, k, n, U, V, W, name=name or _grid_name("mpl", m, k, n, len(U)),
                     source=source)


# ---- FastMatrixMultiplication plain text ---------------------------------------------------

def parse_fmm_txt(text: str, name: str = "", source: str = "") -> Algorithm:
    """``m k n R`` on the first line, then the u, v, w tables of the JSON form flattened,
    one line each (R·mk, R·kn and R·nm numbers; w describes Cᵀ)."""
    lines = [ln.split() for ln in text.splitlines() if ln.strip()]
    if len(lines) != 4 or len(lines[0]) != 4 or not all(x.isdigit() for x in lines[0]):
        raise AlgorithmError("not a FastMatrixMultiplication text scheme (expected a line "
                             "'m k n R' and three lines of coefficients)")
    m, k, n, R = (int(x) for x in lines[0])
    d = {"n": [m, k, n], "m": R}
    for key, line, cols in (("u", lines[1], m * k), ("v", lines[2], k * n), ("w", lines[3], n * m)):
        if len(line) != R * cols:
            raise AlgorithmError(f"line {key}: {len(line)} numbers, expected R·{cols} = {R * cols}")
        d[key] = [line[r * cols:(r + 1) * cols] for r in range(R)]
    return from_fmm_scheme(d, name=name, source=source)


# ---- AlphaEvolve's notebook ----------------------------------------------------------------

def _np_array_literal(node, what: str) -> np.ndarray:
    """``np.array([[...]], dtype=...)`` as an array, reading literals only (no code runs)."""
    f = node.func if isinstance(node, ast.Call) else None
    if not (f is not None and node.args and getattr(f, "attr", getattr(f, "id", "")) == "array"):
        raise AlgorithmError(f"{what} is not an np.array(...) literal")
    try:
        arr = np.array(ast.literal_eval(node.args[0]), dtype=object)
    except (ValueError, SyntaxError, TypeError) as e:
        raise AlgorithmError(f"{what}: the array is not a literal table of numbers ({e})") from None
    for idx, x in np.ndenumerate(arr):
        if isinstance(x, complex) and x.imag:
            raise AlgorithmError(f"{what} has the complex coefficient {x}; lcmac reads "
                                 f"rational schemes only")
        arr[idx] = x.real if isinstance(x, complex) else x
    return arr


def parse_alphaevolve_notebook(doc: dict, source: str = "") -> list[Algorithm]:
    """Every ``decomposition_… = (np.array(u), np.array(v), np.array(w))`` of a Jupyter
    notebook (google-deepmind/alphaevolve_results ``mathematical_results.ipynb``): AlphaTensor's
    layout, u (nm×R), v (mp×R), w (pn×R, Cᵀ), so the grid follows from the shapes.  Those
    over the complex numbers are skipped (an error only if nothing else is left)."""
    out, complex_ = [], []
    for cell in doc.get("cells", []):
        src = cell.get("source", "")
        src = "".join(src) if isinstance(src, list) else src
        if cell.get("cell_type") != "code" or "decomposition" not in src:
            continue
        try:
            nodes = list(ast.walk(ast.parse(src)))
        except SyntaxError:                 # a cell of notebook magics, not data
            nodes = []
        for node in nodes:
            if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Tuple)
                    and isinstance(node.targets[0], ast.Name)
                    and node.targets[0].id.startswith("decomposition")):
                continue
            label = node.targets[0].id
            if len(node.value.elts) != 3:
                raise AlgorithmError(f"{label}: expected three factor matrices")
            try:
                u, v, w = (_np_array_literal(e, f"{label} factor {i + 1}")
                           for i, e in enumerate(node.value.elts))
            except AlgorithmError as e:
                if "complex" not in str(e):
                    raise
                complex_.append(str(e))
                continue
            nm, mp, pn = (x.shape[0] for x in (u, v, w))
            n = round((nm * pn / max(mp, 1)) ** 0.5)
            if n < 1 or nm % n or pn % n or (nm // n) * (pn // n) != mp:
                raise AlgorithmError(f"{label}: factor shapes {u.shape}, {v.shape}, {w.shape} "
                                     f"fit no grid <n,m,p>")
            grid = (n, nm // n, pn // n)
            out.append(from_alphatensor(u, v, w, grid, name=_grid_name("ae", *grid, u.shape[1]),
                                        source=f"{source} {label}".strip()))
    if not out:
        raise AlgorithmError(complex_[0] if complex_ else "the notebook holds no "
                             "'decomposition_… = (np.array(..), ..)' cell")
    return out


# ---- lcmac's own JSON ----------------------------------------------------------------------

def _from_json_doc(doc, path: Path) -> list[Algorithm]:
    if not isinstance(doc, dict):
        raise AlgorithmError(f"{path}: top level is a {type(doc).__name__}, expected a JSON object")
    if "cells" in doc and "nbformat" in doc:
        return parse_alphaevolve_notebook(doc, source=f"notebook {path.name}")
    fmt = doc.get("format")
    if fmt == ALGORITHM_FORMAT:
        return [Algorithm.from_dict(doc)]
    if fmt == CATALOGUE_FORMAT:
        algs = doc.get("algorithms")
        if not isinstance(algs, list):
            raise CatalogueError(f"{path}: catalogue file lacks its 'algorithms' list")
        out = []
        for i, d in enumerate(algs):
            label = d.get("name", f"#{i}") if isinstance(d, dict) else f"#{i}"
            try:
                out.append(Algorithm.from_dict(d))
            except AlgorithmError as e:
                raise type(e)(f"catalogue entry {label!r}: {e}") from None
        return out
    if fmt is not None:
        raise AlgorithmError(f"{path}: unknown format {fmt!r} (expected {ALGORITHM_FORMAT!r}, "
                             f"{CATALOGUE_FORMAT!r} or a FastMatrixMultiplication scheme)")
    if "n" in doc and "m" in doc and ("u_fresh" in doc or "w_fresh" in doc):
        src = f"FastMatrixMultiplication addition-reduced scheme {path.name}"
        return [from_fmm_reduced(doc, source=src)]
    if "n" in doc and "m" in doc and "u" in doc:
        return [from_fmm_scheme(doc, source=f"FastMatrixMultiplication scheme {path.name}")]
    raise AlgorithmError(f"{path}: unrecognised JSON (no 'format' field and not a "
                         f"FastMatrixMultiplication scheme with 'n', 'm', 'u', 'v', 'w')")


# ---- entry point ---------------------------------------------------------------------------

_TEXT_PARSERS = {"m": (parse_fmm_text, "FastMatrixMultiplication scheme"),
                 "txt": (parse_fmm_txt, "FastMatrixMultiplication text scheme"),
                 "exp": (parse_expressions, "expression file"),
                 "mpl": (parse_maple_tensor, "Maple tensor file")}


def _text_kind(path: Path, text: str) -> str:
    """The text format, by suffix and then by the first characters (JSON otherwise)."""
    if path.suffix == ".m" or (_M_TOKEN.match(text) and "{{" in text.replace(" ", "")):
        return "m"
    if path.suffix == ".mpl" or "TriadSet(" in text:
        return "mpl"
    if re.match(r"[ \t]*\d[\d \t]*\r?\n", text):     # a first line of numbers only: m k n R
        return "txt"
    if path.suffix in (".exp", ".txt") or re.match(r"[-+(]*[abcm]_?\d", text):
        return "exp"
    return "json"


def load_file(path: str | Path, key: str | None = None, *, check: bool = True) -> list[Algorithm]:
    """Every algorithm in ``path`` (format detected), each verified exactly.

    ``key`` selects one entry of an AlphaTensor ``.npz`` ("m,k,n") or one algorithm of a
    catalogue by name.  ``check=False`` parses only (for `lcmac verify`, which reports every
    failing equation itself); such algorithms must not be used before ``verify``.
    """
    path = Path(path)
    if not path.is_file():
        raise AlgorithmError(f"{path}: no such file")
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise AlgorithmError(f"{path}: cannot be read ({e.strerror})") from None
    if raw[:4] == b"PK\x03\x04" or path.suffix == ".npz":
        return load_alphatensor(path, key, check=check)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise AlgorithmError(f"{path}: not a text file and not an .npz archive") from None
    kind = _text_kind(path, text.lstrip())
    try:
        if kind in _TEXT_PARSERS:
            parse, what = _TEXT_PARSERS[kind]
            algs = [parse(text, source=f"{what} {path.name}")]
        else:
            try:
                doc = json.loads(text)
            except json.JSONDecodeError as e:
                raise AlgorithmError(f"{path}: not valid JSON ({e.msg}: line {e.lineno}, "
                                     f"column {e.colno}); truncated or not an algorithm file") from None
            except RecursionError:
                raise AlgorithmError(f"{path}: JSON nested too deeply") from None
            algs = _from_json_doc(doc, path)
        if key is not None:
            algs = [a for a in algs if a.name == key]
            if not algs:
                raise CatalogueError(f"{path}: no algorithm named {key!r}")
        out = []
        for a in algs:
            out.append(_verified(a) if check else a)
        return out
    except CatalogueError:
        raise
    except VerificationError as e:
        msg = str(e)
        raise VerificationError(msg if msg.startswith(str(path)) else f"{path}: {msg}") from None
    except AlgorithmError as e:
        msg = str(e)
        raise AlgorithmError(msg if msg.startswith(str(path)) else f"{path}: {msg}") from None
    except (ValueError, TypeError, KeyError, IndexError, AttributeError) as e:
        raise AlgorithmError(f"{path}: malformed algorithm data ({type(e).__name__}: {e})") from None


def load_algorithm(path: str | Path, key: str | None = None) -> Algorithm:
    """Exactly one algorithm from ``path`` (use ``key`` to pick one from a multi-entry file)."""
    algs = load_file(path, key)
    if len(algs) != 1:
        names = ", ".join(a.name for a in algs[:8])
        raise CatalogueError(f"{path} holds {len(algs)} algorithms ({names}…); pass a key to pick one")
    return algs[0]


__all__ = ["load_file", "load_algorithm", "from_alphatensor", "from_fmm_scheme",
           "from_fmm_reduced", "parse_fmm_text", "parse_fmm_txt", "parse_expressions",
           "parse_maple_tensor", "parse_alphaevolve_notebook", "read_npz", "check_programs",
           "fmm_published_additions"]
