"""The algorithm catalogue: built-in schemes plus public catalogues stored as data.

Names are stable: ``strassen``, ``winograd``, ``laderman``, ``hopcroft-kerr``,
``naive-MxKxN``, ``at-MxKxN-rR`` (AlphaTensor), ``fg-MxKxN-rR`` (flip-graph ZT schemes),
``fgr-MxKxN-rR`` (flip-graph addition-reduced schemes, with their straight-line programs).
Expressions compose them:

    strassen^2            strassen applied at two recursion levels  (<4,4,4;49>)
    strassen*laderman     tensor product, outer * inner             (<6,6,6;161>)
    fg-3x4x5-r47@5x3x4    the symmetric image of a scheme on another grid order

Every algorithm is verified exactly (Brent equations) the first time it is looked up.
"""
from __future__ import annotations

import functools
import json
import re
from pathlib import Path

from ..errors import AlgorithmError, CatalogueError
from . import builtin
from .algorithm import Algorithm
from .transforms import compose, for_grid, power
from .verify import verify

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


def base_names() -> list[str]:
    """Every name the catalogue holds (no composed expressions)."""
    names = [n for n in _builtins() if not n.startswith("naive-")]
    names += [n for n in _data_entries() if n not in names]
    return names


def naive_names() -> list[str]:
    return [n for n in _builtins() if n.startswith("naive-")]


@functools.lru_cache(maxsize=None)
def _base(name: str) -> Algorithm:
    b = _builtins()
    if name in b:
        return verify(b[name]())
    entries = _data_entries()
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
