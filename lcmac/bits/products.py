"""Products of packed bit matrices by the Method of Four Russians: over GF(2) (AND, XOR) and
over the Boolean semiring (AND, OR).

The method (Arlazarov, Dinic, Kronrod, Faradzev; M4RI's ``mzd_mul_m4rm``): cut B into groups
of t consecutive rows.  For each group, a table holds all 2^t sums of its rows: entry x is the
sum of the rows whose bit is set in x.  Row i of C is then the sum over groups g of one table
entry, the one selected by A's bits (i, t·g … t·g+t−1) read as a number.  So C costs one
table row per (row of A, group) instead of one row of B per set bit.

Each table entry costs one row operation: entry 2^i + y is entry y plus row i.  M4RI walks the
entries in Gray-code order, where each entry differs from the previous one in one row, which
gives the same one operation per entry; filling by doubling (entries 2^i … 2^(i+1)−1 from
entries 0 … 2^i−1 and row i) needs t array operations instead of 2^t and indexes the table by
the plain binary value of A's bits.  With t = 8 those bits are one byte of A's packed row.

The same tables with OR in place of XOR give the Boolean product, exactly: a Boolean row of C
is the OR over the rows of B that A selects, and an OR of ORs is the OR of all of them.

Everything runs on stacks of P independent products at once (P × M × words), so the numpy
calls per group do not grow with P: the LCMA recursion (``lcmac.bits.lcma``) hands its R^L
base-case products to one call.

This is the numpy kernel.  ``lcmac.bits.native`` runs a compiled one (the same method with
eight 256-entry tables at once) in its place where it can be had; ``gf2_product`` and
``boolean_product`` here always run this one.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lcmac.core.errors import ShapeError
from lcmac.bits.packing import WORD_BITS, PackedBits

__all__ = ["SEMIRINGS", "KernelCount", "four_russians", "group_size", "gf2_product",
           "boolean_product"]

#: the semiring's addition on packed words (multiplication is AND, done by the table lookup)
SEMIRINGS = {"gf2": np.bitwise_xor, "boolean": np.bitwise_or}

#: cache-sized working sets (for a 1 MB L2 a core): the tables of one chunk of groups stay
#: below TABLE_BYTES; a block of C's rows below ROW_BLOCK_BYTES is finished for the whole
#: chunk before the next (larger blocks of rows ran faster, table sizes about alike); a
#: stack's products go through STACK_BYTES of C at a time
TABLE_BYTES = 1 << 20
ROW_BLOCK_BYTES = 2 << 20
STACK_BYTES = 4 << 20


@dataclass
class KernelCount:
    """Word operations (XOR over GF(2), OR over the Boolean semiring) the kernel did: ``tables``
    to fill the tables, ``accumulate`` to add table rows into C (the first group is copied,
    not added, and is not counted); ``kernel``: which kernel did them (``"numpy"``, or
    ``"native"``: ``lcmac.bits.native``)."""

    tables: int = 0
    accumulate: int = 0
    kernel: str | None = None

    @property
    def total(self) -> int:
        return self.tables + self.accumulate


def group_size(rows: int) -> int:
    """Rows of B per table.  A table of 2^t entries pays off when A has about 2^t rows to read
    it (its fill costs 2^t row operations, its use one per row of A), so t = ⌊log2 rows⌋, at
    most 8 (one byte of A per lookup; 2^8 rows of a table fit in cache)."""
    return min(8, max(1, int(rows).bit_length() - 1))


def _as_stack(x: np.ndarray) -> np.ndarray:
    return x[None] if x.ndim == 2 else x


def _all_indices(a: np.ndarray, groups: int, t: int) -> np.ndarray:
    """P × M × groups table indices: A's bits t·g … t·g+t−1 of each row as a number."""
    if t == 8:
        return a.view(np.uint8)[:, :, :groups]          # one byte per group: no copy
    bits = np.unpackbits(a.view(np.uint8), axis=-1, bitorder="little")
    need = groups * t
    if bits.shape[-1] < need:
        bits = np.concatenate([bits, np.zeros(bits.shape[:-1] + (need - bits.shape[-1],),
                                              np.uint8)], axis=-1)
    weights = (1 << np.arange(t)).astype(np.uint16)
    return bits[:, :, :need].reshape(a.shape[0], a.shape[1], groups, t) @ weights


def _group_rows(b: np.ndarray, g0: int, g1: int, t: int) -> np.ndarray:
    """t × (gc·P·NW): row i of every group g0 … g1−1 of every product, laid out (g, p, word)
    so that a table fill step is one long contiguous operation; zero rows past B's end."""
    P, K, NW = b.shape
    lo, hi = g0 * t, g1 * t
    rows = b[:, lo:min(hi, K)]
    if hi > K:
        rows = np.concatenate([rows, np.zeros((P, hi - K, NW), np.uint64)], axis=1)
    rows = rows.reshape(P, g1 - g0, t, NW).transpose(2, 1, 0, 3)
    return np.ascontiguousarray(rows).reshape(t, -1)


def _tables(rows: np.ndarray, op) -> np.ndarray:
    """2^t × (gc·P·NW): entry x of the table of (group g, product p) is the sum of the group's
    rows whose bit is set in x; filled by doubling, one row operation per entry."""
    t, width = rows.shape
    T = np.empty((1 << t, width), np.uint64)
    T[0] = 0
    for i in range(t):
        op(T[:1 << i], rows[i], out=T[1 << i:2 << i])
    return T


def _accumulate(a: np.ndarray, b: np.ndarray, c: np.ndarray, groups: int, t: int, op) -> None:
    """c = Σ over groups of the table rows A's bits select, for a stack of products."""
    P, M, _ = a.shape
    NW = b.shape[2]
    size = 1 << t
    # group-major indices, converted once: a group's lookups are then one contiguous row
    idx = np.ascontiguousarray(_all_indices(a, groups, t).transpose(2, 0, 1))
    cflat = c.reshape(P * M, NW)
    # a chunk's tables below TABLE_BYTES, and its lookups (8 bytes a row of A) below 4× that
    chunk = max(1, min(groups, TABLE_BYTES // (P * size * NW * 8),
                       4 * TABLE_BYTES // (P * M * 8)))
    rb = max(1, ROW_BLOCK_BYTES // (NW * 8))
    tmp = np.empty((min(rb, P * M), NW), np.uint64)
    for g0 in range(0, groups, chunk):
        g1 = min(groups, g0 + chunk)
        gc = g1 - g0
        # viewed as rows of NW words, table (g, p) entry x is row x·gc·P + g·P + p
        table = _tables(_group_rows(b, g0, g1, t), op).reshape(-1, NW)
        lookups = idx[g0:g1].astype(np.intp).reshape(gc, P * M)
        lookups *= gc * P
        lookups += np.repeat(np.arange(gc * P, dtype=np.intp), M).reshape(gc, P * M)
        for r0 in range(0, P * M, rb):      # a block of C stays in cache over the chunk
            r1 = min(P * M, r0 + rb)
            for g in range(gc):
                if g0 + g == 0:              # the first group is copied into C, not added
                    np.take(table, lookups[g, r0:r1], axis=0, out=cflat[r0:r1], mode="clip")
                else:
                    np.take(table, lookups[g, r0:r1], axis=0, out=tmp[:r1 - r0], mode="clip")
                    op(cflat[r0:r1], tmp[:r1 - r0], out=cflat[r0:r1])


def four_russians(a: np.ndarray, b: np.ndarray, *, semiring: str = "gf2", t: int | None = None,
                  out: np.ndarray | None = None, count: KernelCount | None = None) -> np.ndarray:
    """C = A·B over ``semiring`` (``"gf2"`` or ``"boolean"``) on packed words.

    ``a``: M × KW or a stack P × M × KW of ``np.uint64`` (rows may be strided, words
    contiguous); ``b``: K × NW or P × K × NW with K ≤ 64·KW; A's bits past column K must be
    zero (B is read as having zero rows there).  Returns M × NW (or P × M × NW) words, written
    into ``out`` if given (C-contiguous).  ``t``: rows per table, default ``group_size(M)``.
    ``count`` accumulates the word operations done."""
    op = SEMIRINGS[semiring]
    flat_in = a.ndim == 2
    a, b = _as_stack(a), _as_stack(b)
    if a.ndim != 3 or b.ndim != 3 or a.shape[0] != b.shape[0]:
        raise ShapeError(f"operands must be matching stacks of matrices, got {a.shape} and "
                         f"{b.shape}")
    P, M, KW = a.shape
    _, K, NW = b.shape
    if K > WORD_BITS * KW:
        raise ShapeError(f"B has {K} rows but A's rows hold only {WORD_BITS * KW} bits")
    if a.dtype != np.uint64 or b.dtype != np.uint64:
        raise ShapeError("packed operands must be uint64 words")
    if a.strides[-1] != 8:
        a = np.ascontiguousarray(a)
    c = np.empty((P, M, NW), np.uint64) if out is None else _as_stack(out)
    if c.shape != (P, M, NW) or not c.flags.c_contiguous:
        raise ShapeError(f"out must be C-contiguous with shape {(P, M, NW)}, got {c.shape}")
    t = group_size(M) if t is None else int(t)
    if not 1 <= t <= 8:
        raise ValueError(f"t = {t} rows per table: must be 1 to 8 (a table has 2^t rows)")
    groups = -(-K // t)
    if groups == 0 or M == 0 or NW == 0:
        c[...] = 0
        return c[0] if flat_in else c
    size = 1 << t
    # a few products at a time, so that a chunk of tables holds many groups of each
    psub = max(1, min(P, STACK_BYTES // (M * NW * 8)))
    for p0 in range(0, P, psub):
        p1 = min(P, p0 + psub)
        _accumulate(a[p0:p1], b[p0:p1], c[p0:p1], groups, t, op)
    if count is not None:
        count.tables += groups * P * (size - 1) * NW
        count.accumulate += (groups - 1) * P * M * NW
        count.kernel = "numpy"
    return c[0] if flat_in else c


def _check_pair(A: PackedBits, B: PackedBits) -> None:
    if A.ncols != B.nrows:
        raise ShapeError(f"inner dimensions differ: A is {A.nrows}×{A.ncols}, B is "
                         f"{B.nrows}×{B.ncols}")


def gf2_product(A: PackedBits, B: PackedBits, *, t: int | None = None,
                count: KernelCount | None = None) -> PackedBits:
    """C = A·B modulo 2 by the Four Russians kernel."""
    _check_pair(A, B)
    return PackedBits(four_russians(A.data, B.data, semiring="gf2", t=t, count=count),
                      A.nrows, B.ncols)


def boolean_product(A: PackedBits, B: PackedBits, *, t: int | None = None,
                    count: KernelCount | None = None) -> PackedBits:
    """C = A·B over the Boolean semiring (C_ij = OR_l A_il AND B_lj) by the Four Russians
    kernel with OR tables: exact, no integer counts involved.

    No LCMA is used here, on purpose: an LCMA needs subtraction (Strassen's scheme, even read
    modulo 2, combines products that cancel), and the Boolean semiring has none, so a GF(2)
    scheme computes the wrong thing with OR.  The usual route, an LCMA over the integers with
    the counts compared to zero at the end, is exact but is not implemented here."""
    _check_pair(A, B)
    return PackedBits(four_russians(A.data, B.data, semiring="boolean", t=t, count=count),
                      A.nrows, B.ncols)
