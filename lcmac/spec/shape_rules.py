"""Shape rules: which shapes one compiled kernel family serves, and how a product of such a
shape is cut into calls of kernels compiled for fixed sizes.

The kernel templates need static sizes (the CPU template cuts its cache blocks and packed
workspaces from M, N and K; the CUDA templates size their grids and workspaces from them).
So a rule is served by a small set of *bucket* kernels and the product is cut into pieces:

``exact:MxNxK``
    one kernel, one shape.
``rows:?xNxK`` (written ``?xNxK``; a weight: any M, N and K fixed)
    kernels for row counts P in a ladder of buckets (e.g. 4096, 1024, 256), all N×K.  The
    rows of A and C are cut greedily, largest bucket first; a row panel of A (and of C) is a
    contiguous slice, so the pieces cost no copy.  Rows left under the smallest bucket are
    **padded**: copied into a zeroed P_min×K buffer, multiplied, and P_min×N rows copied back
    (at most P_min − 1 wasted rows).  Where a vendor GEMM is at hand (lcmac.matmul) those
    rows go to it instead.  On CUDA the rule can instead be served by **one** kernel whose
    row count is a run-time value (``CudaConfig.dynamic_rows``, ``lcmac.schedules.cuda.rows``:
    the bundle rule's ``dynamic_rows``, the JIT's ``LCMAC_DYNAMIC_ROWS=1``): no pieces and
    no padding, the copy engine zero-fills the rows past M and clips the stores; a launch
    takes up to the ladder's largest bucket of rows.
``any:?x?x?`` (written ``?x?x?``: any M, N and K)
    on CUDA: **one** kernel per algorithm whose M, N and K are run-time values
    (``CudaConfig.dynamic_shape``: the bundle rule's ``dynamic_shape``), taking up to
    ``ANY_MAX_SHAPE`` a launch (more rows: launches along M; a larger N or K is refused by
    name); a shape whose N or K is not a multiple of 16 bytes runs on zero-padded copies of
    the operands.  Otherwise (a CPU; float64 on CUDA, a row ladder or tile asked for):
    the row ladder as above with N and K cut into fixed tiles T_N × T_K: each piece's A and B
    tiles are copied into contiguous buffers (the last tile of a dimension zero-padded), and
    each product is added into C (in float32 for 16-bit dtypes).  The cost over an exact
    kernel is those copies — one pass over A per column tile, one over B per row piece, one
    over C per K tile — and the padding of the last tiles.

Worked example: ``rows`` with buckets (4096, 1024, 256) and M = 5000 runs 4096 + 3 × 256
rows as four calls on slices and pads the last 136 rows into one 256-row call
(120 wasted rows, 2.4 % of the work).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from lcmac.core.errors import ShapeError
from lcmac.core.shapes import parse_shape

RULE_HELP = ("a shape rule: MxNxK (that shape), ?xNxK (any M: a weight of K×N), or ?x?x? "
             "(any shape)")
_ROWS_RE = re.compile(r"\s*(?:rows:)?\?\s*[xX×,]\s*(\d+)\s*[xX×,]\s*(\d+)\s*")
_ANY_RE = re.compile(r"\s*(?:any(?::\?\s*[xX×,]\s*\?\s*[xX×,]\s*\?)?|\?\s*[xX×,]\s*\?\s*[xX×,]\s*\?)\s*")

#: row buckets per backend kind: the ladder a kernel family is built over by default
#: (``lcmac build``), and the one the JIT (lcmac.matmul) compiles from on demand
BUILD_ROWS = {"cpu": (4096, 1024, 256), "cuda": (32768, 8192, 2048)}
JIT_ROWS = {"cpu": tuple(4096 >> i for i in range(5)), "cuda": tuple(65536 >> i for i in range(7))}
#: the N × K tile of the ``any`` rule, and its row ladder
ANY_TILE = {"cpu": (1024, 1024), "cuda": (8192, 8192)}
ANY_ROWS = {"cpu": (1024, 256), "cuda": (8192, 2048)}
#: the largest M, N, K one launch of the CUDA any-shape kernel takes (run-time sizes); the
#: runtime runs more rows as launches along M
ANY_MAX_SHAPE = {"cuda": (65536, 65536, 65536)}


@dataclass(frozen=True)
class ShapeRule:
    """``kind`` "exact" (M, N, K all set), "rows" (M None) or "any" (all None)."""
    kind: str
    M: int | None = None
    N: int | None = None
    K: int | None = None

    @property
    def text(self) -> str:
        """The canonical name (what manifests and the kernel cache record)."""
        if self.kind == "exact":
            return f"exact:{self.M}x{self.N}x{self.K}"
        if self.kind == "rows":
            return f"rows:?x{self.N}x{self.K}"
        return "any:?x?x?"

    def __str__(self) -> str:
        return self.text

    def admits(self, M: int, N: int, K: int) -> bool:
        return ((self.M is None or self.M == M) and (self.N is None or self.N == N)
                and (self.K is None or self.K == K))


def parse_rule(rule) -> ShapeRule:
    """A rule from its text ("4096x4096x4096", "?x4096x4096", "?x?x?", the canonical
    ``exact:``/``rows:``/``any:`` forms), an (M, N, K) sequence, a ShapeRule, or None
    (any shape).  ShapeError says what a rule is."""
    if isinstance(rule, ShapeRule):
        return rule
    if rule is None:
        return ShapeRule("any")
    if isinstance(rule, str):
        text = rule.strip()
        if _ANY_RE.fullmatch(text):
            return ShapeRule("any")
        mt = _ROWS_RE.fullmatch(text)
        if mt:
            N, K = (int(g) for g in mt.groups())
            if min(N, K) < 1:
                raise ShapeError(f"shape rule {rule!r}: N and K must be positive")
            return ShapeRule("rows", None, N, K)
        if "?" in text:
            raise ShapeError(f"shape rule {rule!r} is not supported; {RULE_HELP}")
        text = text.removeprefix("exact:")
        try:
            return ShapeRule("exact", *parse_shape(text))
        except ShapeError:
            raise ShapeError(f"shape rule {rule!r} must be {RULE_HELP}") from None
    return ShapeRule("exact", *parse_shape(rule))


def check_ladder(rows) -> tuple[int, ...]:
    """Row buckets as a strictly decreasing tuple of positive ints (ShapeError otherwise)."""
    try:
        vals = tuple(sorted({int(r) for r in rows}, reverse=True))
    except (TypeError, ValueError):
        raise ShapeError(f"row buckets {rows!r} must be positive integers") from None
    if not vals or vals[-1] < 1:
        raise ShapeError(f"row buckets {rows!r} must be positive integers")
    return vals


@dataclass(frozen=True)
class RowPiece:
    """Rows [start, start + rows) of A and C, run by the kernel of ``bucket`` rows; ``rows
    < bucket`` means padded (or, where a vendor GEMM is at hand, not a bucket at all)."""
    start: int
    rows: int
    bucket: int

    @property
    def padded(self) -> bool:
        return self.rows < self.bucket


def row_pieces(M: int, ladder) -> list[RowPiece]:
    """M rows cut greedily by ``ladder`` (largest bucket first); the rows left under the
    smallest bucket form one padded piece."""
    ladder = check_ladder(ladder)
    pieces, start = [], 0
    for P in ladder:
        while M - start >= P:
            pieces.append(RowPiece(start, P, P))
            start += P
    if start < M:
        pieces.append(RowPiece(start, M - start, ladder[-1]))
    return pieces


def tiles(extent: int, tile: int) -> list[tuple[int, int]]:
    """(start, size) of the tiles of ``tile`` covering ``extent`` (the last may be short)."""
    return [(s, min(tile, extent - s)) for s in range(0, extent, tile)]


def bucket_shapes(rule: ShapeRule, ladder, tile=None) -> list[tuple[int, int, int]]:
    """The (M, N, K) of the kernels a rule is built from (``tile`` = (T_N, T_K) for "any")."""
    if rule.kind == "exact":
        return [(rule.M, rule.N, rule.K)]
    ladder = check_ladder(ladder)
    if rule.kind == "rows":
        return [(P, rule.N, rule.K) for P in ladder]
    if tile is None:
        raise ShapeError("the any-shape rule needs an N×K tile")
    tn, tk = (int(t) for t in tile)
    return [(P, tn, tk) for P in ladder]


# --- the any-shape rule cut into pieces (CPU): views of A, B and C, no tiles copied ---------
#
# Each of M, N and K has its own ladder of piece sizes; a piece kernel (P_M, P_N, P_K) takes
# row-strided views of A, B and C and writes or adds into C (lcmac.schedules.cpu_lcma,
# ``piece``), so a product is cut along all three dimensions with no copy.  N is covered by
# spans of its ladder, largest first, the part left under them by one more span that
# overlaps its neighbour, computed and written twice with the same sums.  M and K need no
# ladder: a piece kernel takes any rows and any depth up to its P_M and P_K at run time (a
# multiple of a unit: the grid's m; k times whole ku steps), so each is cut into spans of
# P_M (P_K) and one shorter one (``cut_run_time``): fewer calls, each packing B once for
# all its rows and running whole kc chunks (docs/shape-rules.md: 1000x777x1234 at 0.83x the
# exact kernel with fixed pieces, M cut 512 + 512, 1.02x with one span).  A span that is
# not whole units starts earlier and overlaps its predecessor: M computes those rows again,
# K zeroes the overlapped rows of B (or columns of A) in a copy of that span, so they add
# nothing.  Bundles of ``lcmac-bundle/2`` have kernels of fixed sizes, M and K cut as N.
# The edges never go to the vendor GEMM: its worker threads keep spinning
# for a while after each call (OpenBLAS, OpenMP), and the piece kernels after it then share
# the cores with them (measured: a 1000x777x1234 product 10x slower with its 9 last columns
# on numpy).  A dimension shorter than its smallest span runs the whole product on the
# vendor GEMM (numpy.matmul, torch.matmul): a small or thin product.

#: piece sizes per dimension ("M", "N", "K") of the CPU any-shape bundle (rounded to the
#: algorithm's grid by ``piece_ladders``): M and K one size each (run-time extents up to
#: it); N 2048 down to 128, so an overlap wastes at most 127 columns of a product (1536,
#: 768, 384: a column count just over a power of two is covered by two spans, not three);
#: 8 kernels
PIECE_LADDER = {"cpu": {"M": (2048,), "N": (2048, 1536, 1024, 768, 512, 384, 256, 128), "K": (2048,)}}
#: a product with fewer rows or a shallower K runs on the vendor GEMM whole (thin: a piece
#: kernel's fixed costs, the packing of B or of A among them, spread over too little)
PIECE_MIN_EXTENT = 128
#: the dtypes piece kernels serve: C written by the tile stores (16-bit ones go through an
#: fp32 workspace, so their any-shape bundle keeps the copied tiles)
PIECE_DTYPES = ("float32", "float64")
#: what a piece's size is a multiple of per dimension, per block of the algorithm's grid:
#: rows whole blocks; columns whole register tiles (nr ≤ 64 on every CPU target); k whole
#: unrolled steps (a piece kernel's ku divides 8), so that no piece kernel zero-pads
PIECE_UNITS = {"M": 1, "N": 64, "K": 8}
#: what one more span costs, in elements of the dimension (a kernel call per piece: its
#: parallel regions, and a fresh packing of its operands)
SPAN_COST = 32
#: a product of fewer multiply-adds runs on the vendor GEMM whole: under one 256³ piece a
#: kernel call's fixed costs outweigh what an LCMA saves
VENDOR_WORK = 256 ** 3


@dataclass(frozen=True)
class Span:
    """Elements [start, start + size) of one dimension, run by the pieces of ``kernel``
    (0: of ``size``; larger: M's or K's run-time extent); the first ``overlap`` of them were covered
    by an earlier span (M, N: computed again; K: zeroed in a copy, so they add nothing)."""
    start: int
    size: int
    overlap: int = 0
    kernel: int = 0

    @property
    def piece(self) -> int:
        """The piece kernels' size in this dimension."""
        return self.kernel or self.size


def cut_run_time(extent: int, most: int, unit: int) -> tuple:
    """``extent`` (M or K) cut for piece kernels of run-time extents up to ``most``: spans of
    ``most``, then one of the rest, each a multiple of ``unit``; where the rest is not, its
    span starts earlier and overlaps its predecessor (for an extent under ``most`` not a
    multiple of ``unit``: a span of ``unit`` after the whole units).  Under
    ``PIECE_MIN_EXTENT``: no spans (()), the vendor GEMM's."""
    if extent < max(PIECE_MIN_EXTENT, unit):
        return ()
    spans, pos = [], 0
    while extent - pos > most:
        spans.append(Span(pos, most, 0, most))
        pos += most
    tail = extent - pos
    size = -(-tail // unit) * unit
    if size <= extent:
        spans.append(Span(extent - size, size, size - tail, most))
    else:           # one short span, not whole units: the whole units, then the last unit again
        size -= unit
        spans += [Span(0, size, 0, most), Span(extent - unit, unit, unit - extent + size, most)]
    return tuple(spans)


def cut_extent(extent: int, ladder) -> tuple:
    """``extent`` cut into spans of ``ladder`` at the least cost: a head of the greedy cut
    (largest spans first), then one span ending at ``extent`` that overlaps the head.  Cost:
    the elements the spans compute (overlaps twice) plus ``SPAN_COST`` per span.  An extent
    under the smallest span: no spans (()), the vendor GEMM's."""
    ladder = check_ladder(ladder)
    greedy, pos = [], 0
    for P in ladder:
        while extent - pos >= P:
            greedy.append(Span(pos, P))
            pos += P
    best = None
    for keep in range(len(greedy) + 1):
        head = greedy[:keep]
        done = head[-1].start + head[-1].size if head else 0
        tail = extent - done
        options = [head] if tail == 0 else [
            head + [Span(extent - P, P, P - tail)] for P in ladder if tail <= P <= extent]
        for spans in options:
            cost = sum(s.size for s in spans) + SPAN_COST * len(spans)
            if best is None or cost < best[0]:
                best = (cost, tuple(spans))
    return best[1] if best else ()


@dataclass(frozen=True)
class PiecePlan:
    """A product cut by ``cut_extent`` in M, N and K (each a tuple of Spans); ``vendor``: it
    runs on the vendor GEMM whole (a dimension under its smallest span, or a small product)."""
    M: tuple
    N: tuple
    K: tuple

    @property
    def vendor(self) -> bool:
        return not (self.M and self.N and self.K)

    def shapes(self) -> list:
        """The (P_M, P_N, P_K) piece kernels this plan calls."""
        return sorted({(m.piece, n.piece, k.piece) for m in self.M for n in self.N for k in self.K},
                      reverse=True)

    def computed(self) -> int:
        """Multiply-adds the pieces compute (overlaps included)."""
        return (sum(s.size for s in self.M) * sum(s.size for s in self.N)
                * sum(s.size for s in self.K))


def plan_pieces(M: int, N: int, K: int, ladders) -> PiecePlan:
    """The cut of an M×N×K product for piece ``ladders`` = {"M": (...), "N": ..., "K": ...,
    "run_time": {"M": unit, "K": unit}} (none under ``VENDOR_WORK``); with "run_time" the
    kernels take up to their P_M rows and P_K depth, multiples of those units, at run time
    (``cut_run_time``), without it (``lcmac-bundle/2``) M and K are cut like N."""
    if M * N * K < VENDOR_WORK:
        return PiecePlan((), (), ())
    units = ladders.get("run_time")

    def cut(dim, extent):
        return cut_run_time(extent, max(ladders[dim]), units[dim]) if units else cut_extent(extent, ladders[dim])
    return PiecePlan(cut("M", M), cut_extent(N, ladders["N"]), cut("K", K))


def piece_ladders(grid, ladder=None) -> dict:
    """The piece ladders {"M", "N", "K"} for an algorithm of ``grid`` (m, k, n): ``ladder``
    (a ladder for every dimension or one per dimension; default ``PIECE_LADDER["cpu"]``)
    rounded down to whole units (``PIECE_UNITS``) of the grid's blocks; "run_time": the
    units of M and K the kernels take at run time (``plan_pieces``)."""
    m, k, n = grid
    ladder = ladder or PIECE_LADDER["cpu"]
    out = {}
    for dim, blocks in (("M", m), ("N", n), ("K", k)):
        unit = blocks * PIECE_UNITS[dim]
        sizes = ladder[dim] if isinstance(ladder, dict) else ladder
        out[dim] = check_ladder(max(unit, P // unit * unit) for P in sizes)
    out["run_time"] = {"M": m * PIECE_UNITS["M"], "K": k * PIECE_UNITS["K"]}
    return out


def piece_shapes(ladders) -> list:
    """Every (P_M, P_N, P_K) a plan over ``ladders`` may call: the kernels of the bundle."""
    return [(pm, pn, pk) for pm in check_ladder(ladders["M"]) for pn in check_ladder(ladders["N"])
            for pk in check_ladder(ladders["K"])]
