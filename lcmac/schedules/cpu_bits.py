"""The CPU kernel for products of packed bit matrices: the Method of Four Russians with eight
256-entry tables at once ("M4RM with multiple tables"), as one TensorIR prim_func in
TVMScript text, any shape at run time.

Layout (``lcmac.bits.packing``): an M×N bit matrix is M rows of NW = ⌈N/64⌉ ``uint64``
words, C order, entry (i, 64·w + j) at bit j of word w of row i.  Byte g of a word of A
therefore holds A's bits for 8 consecutive rows of B, and is read as a table index.

    entry(A: M×KW, B: K×NW, C: M×NW, AT: KW×MB, Tab: 8·256·PW)      all uint64

The kernel writes C = A·B over GF(2) (tables and sums by XOR) or over the Boolean semiring
(by OR).  M, KW, K, NW and MB are read from the arrays at run time; 1 ≤ K ≤ 64·KW, and A's
bits past column K must be zero (so a table entry that would include a row of B past K is
never selected: those rows are read clamped to row K−1, never out of bounds).  Indices are
32-bit: every array must have fewer than 2^31 words.

The algorithm, for each block of MB rows of A (MB is the width of the workspace AT):

1. AT = the block of A transposed, so that the loop over rows reads A's words contiguously
   (reading A in place touches a cache line per row and word, and ran slower).
2. For each panel of PW columns-words of B and C (then the narrower tail panels, PW/2 … 1
   words, so any NW runs with whole vectors), for each word kw of A's rows (64 rows of B):
   fill 8 tables, table t holding the 256 XOR (OR) combinations of rows 64·kw+8t … +7 of B
   restricted to the panel, by doubling (entry 2^j + y = entry y ⊕ row j: one vector
   operation per entry); then every row i of the block takes C[i, panel] ⊕= T_0[x_0] ⊕ … ⊕
   T_7[x_7] with x_t byte t of AT[kw, i].  The first kw stores instead of accumulating.

The tables of a panel (8·256·PW words: 128 kB at PW = 8) stay in L2, the block of C's panel
(MB·PW words) too, and each C row is read and written once per 64 rows of B.  The fills of a
word's 8 tables (2048 row operations) pay for themselves over the block's 8·MB lookups: MB ≥
2048 keeps them under 1/8.  MB is the caller's choice (``lcmac.bits.native.BLOCK_ROWS``).
No parallel loop and no workspace allocation: the caller passes AT and Tab, so the library
runs without TVM's runtime, on the calling thread.

``generate`` is pure Python; the apache-tvm worker compiles its output (``lcmac.targets``).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from lcmac.schedules.cpu_gemm import Writer

ENTRY = "lcmac_bits_m4rm"
#: generation of this template: a compiled kernel of another generation is other code
TEMPLATE_VERSION = 1
#: semiring → its addition on words in TVMScript (the multiplication is the table lookup)
ADDITION = {"gf2": "^", "boolean": "|"}
TABLES = 8          # tables per word of A: one per byte
TABLE_BITS = 8      # rows of B per table: 2^8 entries, indexed by one byte
WORD_BITS = 64
#: the block's first row and its row count, written out where used: an assignment in a
#: TVMScript body (``m0 = ib * MB``, ``x = AT[kw, i]``) becomes a variable that apache-tvm
#: 0.25 allocates through its runtime's workspace, which this library must run without
#: (LLVM folds the repeated expressions)
ROW0 = "ib * MB"
ROWS = "T.min(MB, M - ib * MB)"


@dataclass(frozen=True)
class BitsConfig:
    """``panel_words``: column words of B and C per panel (a power of two; 8 = one 512-bit
    vector).  The rows per block are not a knob of the code: they are the width of the AT
    workspace the caller passes."""

    panel_words: int = 8

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict | None) -> "BitsConfig":
        d = dict(d or {})
        unknown = sorted(set(d) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(f"unknown bit-kernel knob(s) {', '.join(unknown)}; known: "
                             f"{', '.join(f.name for f in fields(cls))}")
        cfg = cls(**d)
        pw = cfg.panel_words
        if not isinstance(pw, int) or pw < 1 or pw & (pw - 1) or pw > 64:
            raise ValueError(f"panel_words={pw!r} must be a power of two from 1 to 64")
        return cfg

    def table_words(self) -> int:
        """Words of the Tab workspace."""
        return TABLES * (1 << TABLE_BITS) * self.panel_words


def _panel_widths(pw: int) -> list[int]:
    """The panel widths, widest first: whole panels of ``pw`` words, then at most one of each
    narrower power of two for the tail."""
    out = [pw]
    while out[-1] > 1:
        out.append(out[-1] // 2)
    return out


def _emit_tables(w: Writer, pw: int, op: str, c0: str) -> None:
    """Fill the 8 tables of word kw for the panel of width ``pw`` at column ``c0``."""
    with w.block(f"for t in range({TABLES}):"):
        with w.block(f"for v in T.vectorized({pw}):"):
            w(f"Tab[t * {256 * pw} + v] = T.uint64(0)")
        for j in range(TABLE_BITS):
            # row 8t+j of this word's 64 rows, clamped: rows past K are never selected
            row = f"T.min(kw * {WORD_BITS} + t * {TABLE_BITS} + {j}, K - 1)"
            with w.block(f"for y in range({1 << j}):"):
                with w.block(f"for v in T.vectorized({pw}):"):
                    w(f"Tab[(t * 256 + {1 << j} + y) * {pw} + v] = "
                      f"Tab[(t * 256 + y) * {pw} + v] {op} B[{row}, {c0} + v]")


def _emit_apply(w: Writer, pw: int, op: str, c0: str, first: bool) -> None:
    """C[i, panel] (=|⊕=) the 8 table rows selected by the bytes of AT[kw, i]."""
    with w.block(f"for i in range({ROWS}):"):
        terms = [f"Tab[(T.Cast(\"int32\", (AT[kw, i] >> T.uint64({8 * t})) & T.uint64(255)) + "
                 f"{256 * t}) * {pw} + v]" for t in range(TABLES)]
        if not first:
            terms.insert(0, f"C[{ROW0} + i, {c0} + v]")
        with w.block(f"for v in T.vectorized({pw}):"):
            w(f"C[{ROW0} + i, {c0} + v] = " + f" {op} ".join(terms))


def _emit_panel(w: Writer, pw: int, op: str, c0: str) -> None:
    """One panel of width ``pw`` at column ``c0``: all words of A."""
    with w.block("for kw in range(KW):"):
        _emit_tables(w, pw, op, c0)
        w("if kw == 0:")
        with w.indent():
            _emit_apply(w, pw, op, c0, first=True)
        w("else:")
        with w.indent():
            _emit_apply(w, pw, op, c0, first=False)


def generate(semiring: str, cfg: BitsConfig, entry: str = ENTRY) -> tuple[str, dict]:
    """(TVMScript source of ``entry(A, B, C, AT, Tab)``, info).  ``semiring``: ``"gf2"`` or
    ``"boolean"``."""
    if semiring not in ADDITION:
        raise ValueError(f"unknown semiring {semiring!r}; choose one of {', '.join(ADDITION)}")
    op = ADDITION[semiring]
    pw = cfg.panel_words
    w = Writer()
    w("@T.prim_func")
    w("def main(a: T.handle, b: T.handle, c: T.handle, at: T.handle, tab: T.handle):")
    with w.indent():
        w(f"T.func_attr({{\"global_symbol\": \"{entry}\", \"tirx.noalias\": True}})")
        for dim in ("M", "KW", "K", "NW", "MB"):
            w(f"{dim} = T.int32()")
        # numpy's arrays are 16-byte aligned: unaligned loads for A, B, C; the caller
        # allocates Tab on a cache line
        w("A = T.match_buffer(a, (M, KW), \"uint64\", align=8)")
        w("B = T.match_buffer(b, (K, NW), \"uint64\", align=8)")
        w("C = T.match_buffer(c, (M, NW), \"uint64\", align=8)")
        w("AT = T.match_buffer(at, (KW, MB), \"uint64\", align=8)")
        w(f"Tab = T.match_buffer(tab, ({cfg.table_words()},), \"uint64\", align=64)")
        with w.block("for ib in range((M + MB - 1) // MB):"):
            # AT = the block of A transposed, 8 rows at a time: a cache line of AT per
            # word, one line of each of the 8 rows of A per 8 words
            with w.block(f"for io in range({ROWS} // 8):"):
                with w.block("for kw in range(KW):"):
                    with w.block("for ii in T.unroll(8):"):
                        w(f"AT[kw, io * 8 + ii] = A[{ROW0} + io * 8 + ii, kw]")
            with w.block(f"for i in range({ROWS} // 8 * 8, {ROWS}):"):
                with w.block("for kw in range(KW):"):
                    w(f"AT[kw, i] = A[{ROW0} + i, kw]")
            with w.block(f"for jb in range(NW // {pw}):"):
                _emit_panel(w, pw, op, f"jb * {pw}")
            for tw in _panel_widths(pw)[1:]:
                # the tail: at most one panel of each narrower width
                with w.block(f"for jt in range((NW % {2 * tw}) // {tw}):"):
                    _emit_panel(w, tw, op, f"NW // {2 * tw} * {2 * tw}")
    info = {"kernel": "bits-m4rm", "semiring": semiring, "entry": entry,
            "config": cfg.to_dict(), "template_version": TEMPLATE_VERSION,
            "workspace_words": {"Tab": cfg.table_words(), "AT": "KW x rows per block"}}
    return w.text(), info


def lower_request(request: dict) -> tuple[str, dict]:
    """A compiler-worker request for a bit kernel (``request["kernel"] == "bits"``) →
    (TVMScript source, info)."""
    cfg = BitsConfig.from_dict(request.get("config"))
    return generate(request["semiring"], cfg, entry=request.get("entry", ENTRY))
