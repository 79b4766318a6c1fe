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
* FastMatrixMultiplication ``.m`` text (``{{{A}, {B}, {Cᵀ}}, ...}`` per product).
* lcmac JSON: one algorithm (``format: lcmac-algorithm/1``) or a catalogue
  (``format: lcmac-catalogue/1``).

Every algorithm is verified exactly before it is returned.  A malformed or wrong file
raises ``AlgorithmError`` / ``VerificationError`` / ``CatalogueError`` whose message names
the file and the problem (for a wrong coefficient: the failing Brent equation).
"""
from __future__ import annotations

import io
import json
import pickle
import re
import zipfile
from pathlib import Path

import numpy as np

from ..errors import AlgorithmError, CatalogueError, LcmacError, VerificationError
from .algorithm import Algorithm, _exact
from .program import LinearProgram, combine_matrices
from .verify import verify

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
    return check_programs(verify(alg))


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


# ---- lcmac's own JSON ----------------------------------------------------------------------

def _lcmac_algorithm(d: dict) -> Algorithm:
    return Algorithm.from_dict(d)


def _from_json_doc(doc, path: Path) -> list[Algorithm]:
    if not isinstance(doc, dict):
        raise AlgorithmError(f"{path}: top level is a {type(doc).__name__}, expected a JSON object")
    fmt = doc.get("format")
    if fmt == ALGORITHM_FORMAT:
        return [_lcmac_algorithm(doc)]
    if fmt == CATALOGUE_FORMAT:
        algs = doc.get("algorithms")
        if not isinstance(algs, list):
            raise CatalogueError(f"{path}: catalogue file lacks its 'algorithms' list")
        out = []
        for i, d in enumerate(algs):
            label = d.get("name", f"#{i}") if isinstance(d, dict) else f"#{i}"
            try:
                out.append(_lcmac_algorithm(d))
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
    stripped = text.lstrip()
    try:
        if path.suffix == ".m" or (_M_TOKEN.match(stripped) and "{{" in stripped.replace(" ", "")):
            algs = [parse_fmm_text(text, source=f"FastMatrixMultiplication scheme {path.name}")]
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
           "from_fmm_reduced", "parse_fmm_text", "read_npz", "check_programs",
           "fmm_published_additions"]
