"""The algorithm catalogue: built-in schemes plus public catalogues stored as data.

Names are stable: ``strassen``, ``winograd``, ``laderman``, ``hopcroft-kerr``,
``naive-MxKxN``, ``at-MxKxN-rR`` (AlphaTensor), ``fg-MxKxN-rR`` (flip-graph ZT schemes),
``fgr-MxKxN-rR`` (flip-graph addition-reduced schemes, with their straight-line programs).
Expressions compose them:

    strassen^2            strassen applied at two recursion levels  (<4,4,4;49>)
    strassen*laderman     tensor product, outer * inner             (<6,6,6;161>)
    fg-3x4x5-r47@5x3x4    the symmetric image of a scheme on another grid order

Every algorithm is verified exactly (Brent equations) the first time it is looked up.

Entries marked ``"ring": "gf2"`` hold only modulo 2 (``at-4x4x4-r47-gf2``): ``get`` refuses
them, since everything that takes its result computes over the integers or reals, and
``get_gf2`` serves them, verified over GF(2), beside any rational scheme reduced modulo 2.
"""
from __future__ import annotations

import functools
import json
import re
from pathlib import Path

from lcmac.core.errors import AlgorithmError, CatalogueError, VerificationError
from lcmac.ir import builtin
from lcmac.ir.algorithm import Algorithm
from lcmac.ir.gf2 import GF2Algorithm, reduce_mod2, require_rational, verify_gf2
from lcmac.ir.transforms import compose, for_grid, power
from lcmac.ir.verify import verify

DATA_DIR = Path(__file__).parent / "data"
CATALOGUE_FORMAT = "lcmac-catalogue/1"


def _builtins() -> dict[str, callable]:
    b = {"strassen": builtin.strassen, "winograd": builtin.winograd,
         "hopcroft-kerr": builtin.hopcroft_kerr_rank11}
    for m in range(1, 6):
        for k in range(1, 6):
            for n in range(1, 6):
                b[f"naive-{m}x{k}x{n}"] = functools.partial(builtin.naive, m, k, n)
    return b


@functools.lru_cache(maxsize=None)
def _data_entries() -> dict[str, tuple[dict, str]]:
    """name → (algorithm dict, data file) from every catalogue file shipped in the package."""
    out: dict[str, tuple[dict, str]] = {}
    for f in sorted(DATA_DIR.glob("*.json")):
        doc = json.loads(f.read_text())
        if doc.get("format") != CATALOGUE_FORMAT:
            raise CatalogueError(f"{f} is not an lcmac catalogue file (format {doc.get('format')!r})")
        for d in doc["algorithms"]:
            out[d["name"]] = (d, f.name)
    return out


def _is_gf2(name: str) -> bool:
    entry = _data_entries().get(name)
    return entry is not None and entry[0].get("ring") == "gf2"


def base_names() -> list[str]:
    """Every name of a rational scheme the catalogue holds (no composed expressions)."""
    names = [n for n in _builtins() if not n.startswith("naive-")]
    names += [n for n in _data_entries() if n not in names and not _is_gf2(n)]
    return names


def gf2_names() -> list[str]:
    """The catalogue's schemes that hold only modulo 2 (look them up with ``get_gf2``)."""
    return [n for n in _data_entries() if _is_gf2(n)]


def naive_names() -> list[str]:
    return [n for n in _builtins() if n.startswith("naive-")]


@functools.lru_cache(maxsize=None)
def _base(name: str) -> Algorithm:
    b = _builtins()
    if name in b:
        return verify(b[name]())
    entries = _data_entries()
    if _is_gf2(name):
        try:
            require_rational(get_gf2(name))     # refuses: the scheme holds only modulo 2
        except VerificationError as e:
            raise VerificationError(f"{e}; lcmac.ir.catalogue.get_gf2({name!r}) gives it for "
                                    f"GF(2)") from None
    if name in entries:
        d, fname = entries[name]
        try:
            return verify(Algorithm.from_dict(d))
        except AlgorithmError as e:
            raise CatalogueError(f"catalogue entry {name!r} in {fname} is corrupt: {e}") from e
    close = [n for n in base_names() if name.split("-")[0] in n][:5]
    hint = f"; similar: {', '.join(close)}" if close else ""
    raise CatalogueError(f"unknown algorithm {name!r} (see `lcmac list`{hint})")


_GRID = re.compile(r"^(\d+)x(\d+)x(\d+)$")


@functools.lru_cache(maxsize=None)
def get(expr: str) -> Algorithm:
    """Look up a name or an expression (``a*b``, ``a^L``, ``a@MxKxN``); verified."""
    expr = expr.strip()
    if not expr:
        raise CatalogueError("empty algorithm name")
    if expr.lower() in ("gemm", "naive"):
        raise CatalogueError(f"{expr!r} is the plain GEMM, not an LCMA; use `--algo gemm` to build it")
    if "*" in expr:
        parts = [get(p) for p in expr.split("*")]
        out = parts[0]
        for p in parts[1:]:
            out = compose(out, p)
        return out.renamed(expr)
    if "^" in expr:
        base, _, lv = expr.rpartition("^")
        if not lv.isdigit() or int(lv) < 1:
            raise CatalogueError(f"bad recursion level in {expr!r}: write NAME^L with L ≥ 1")
        return power(get(base), int(lv)).renamed(expr)
    if "@" in expr:
        base, _, g = expr.rpartition("@")
        mt = _GRID.match(g)
        if not mt:
            raise CatalogueError(f"bad grid in {expr!r}: write NAME@MxKxN")
        a = get(base)
        try:
            return for_grid(a, tuple(int(x) for x in mt.groups())).renamed(expr)
        except ValueError as e:
            raise CatalogueError(str(e)) from e
    return _base(expr)


@functools.lru_cache(maxsize=None)
def _gf2_base(name: str) -> GF2Algorithm:
    d, fname = _data_entries()[name]
    try:
        t = Algorithm.from_dict(d)
        return verify_gf2(GF2Algorithm(t.m, t.k, t.n, t.U, t.V, t.W, name=t.name,
                                       source=t.source))
    except AlgorithmError as e:
        raise CatalogueError(f"catalogue entry {name!r} in {fname} is corrupt: {e}") from e


@functools.lru_cache(maxsize=None)
def get_gf2(expr: str) -> GF2Algorithm:
    """A scheme for GF(2): a GF(2)-only entry (``at-4x4x4-r47-gf2``) or its image on another
    grid order (``…@4x5x4``), verified over GF(2), or any rational expression reduced modulo 2
    (correct there because the rational scheme is)."""
    expr = expr.strip()
    base, _, g = expr.rpartition("@") if "@" in expr else (expr, "", "")
    if not _is_gf2(base):
        return reduce_mod2(get(expr))
    alg = _gf2_base(base)
    if not g:
        return alg
    mt = _GRID.match(g)
    if not mt:
        raise CatalogueError(f"bad grid in {expr!r}: write NAME@MxKxN")
    try:                                # a symmetry of the 0/1 table holds modulo 2 as well
        t = for_grid(alg.integer_image(), tuple(int(x) for x in mt.groups()))
    except ValueError as e:
        raise CatalogueError(str(e)) from e
    return verify_gf2(GF2Algorithm(t.m, t.k, t.n, t.U, t.V, t.W, name=expr,
                                   source=f"symmetric image of {base}"))


def gf2_algorithms() -> list[GF2Algorithm]:
    """The GF(2)-only schemes, verified over GF(2)."""
    return [get_gf2(n) for n in gf2_names()]


def all_algorithms(include_naive: bool = False) -> list[Algorithm]:
    names = base_names() + (naive_names() if include_naive else [])
    return [get(n) for n in names]


def for_shape_grid(grid: tuple[int, int, int]) -> list[Algorithm]:
    """Catalogue algorithms (any symmetric image) whose grid is exactly ``grid``."""
    out = []
    for a in all_algorithms():
        if sorted(a.grid) == sorted(grid):
            out.append(a if a.grid == tuple(grid) else get(f"{a.name}@{grid[0]}x{grid[1]}x{grid[2]}"))
    return out
