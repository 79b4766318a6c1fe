"""The bit-packed layout of 0/1 matrices, and conversions to and from numpy arrays.

An M×N matrix of bits is held as an M×W array of 64-bit words (``np.uint64``),
W = ceil(N / 64), C order:

    bit j of word w of row i  =  entry (i, 64·w + j)        (little-endian bit order)

so entry (i, c) is ``(data[i, c // 64] >> (c % 64)) & 1``.  This is M4RI's ``mzd_t`` row
layout, so a row can be copied word for word into M4RI and back.  Each row is padded with
zero bits to a whole number of words; the padding bits are always zero (``PackedBits``
checks it), which the products rely on: a padding bit of A selects a row of B that does not
exist, a padding bit of B would leak into C's padding.

Viewed as bytes (``data.view(np.uint8)``), byte g of a row holds entries 8g … 8g+7 in its
bits 0 … 7 on a little-endian machine; the Four Russians kernel indexes its tables with these
bytes directly.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np

from lcmac.core.errors import DTypeError, ShapeError

__all__ = ["WORD_BITS", "PackedBits", "pack", "unpack", "words_for", "check_bit_form",
           "check_bit_values"]

WORD_BITS = 64

# np.packbits(bitorder="little") then a uint64 view puts entry 64w + j at bit j of word w only
# if the words are little-endian in memory
if sys.byteorder != "little":   # pragma: no cover - every platform lcmac supports is little-endian
    raise ImportError("lcmac.bits assumes a little-endian machine (x86-64, AArch64)")


def words_for(ncols: int) -> int:
    """The number of 64-bit words that hold ``ncols`` bits."""
    return -(-int(ncols) // WORD_BITS)


def _padding_mask(ncols: int) -> np.uint64:
    """The bits of a row's last word that lie beyond column ``ncols`` (0 if none)."""
    used = ncols % WORD_BITS
    if used == 0:
        return np.uint64(0)
    return np.uint64(~((1 << used) - 1) & 0xFFFF_FFFF_FFFF_FFFF)


@dataclass(frozen=True, eq=False)
class PackedBits:
    """An ``nrows`` × ``ncols`` matrix of bits: ``data`` is nrows × ceil(ncols/64) ``np.uint64``,
    C-contiguous, with zero padding bits (see the module's docstring for the layout).

    The constructor checks all of that; code that writes into ``data`` must keep the padding
    bits zero."""

    data: np.ndarray
    nrows: int
    ncols: int

    def __post_init__(self):
        d = self.data
        if not isinstance(d, np.ndarray):
            raise DTypeError(f"PackedBits.data must be a numpy array, got {type(d).__name__}")
        if d.dtype != np.uint64:
            raise DTypeError(f"PackedBits.data must have dtype uint64, got {d.dtype}")
        for nm in ("nrows", "ncols"):
            v = getattr(self, nm)
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 0:
                raise ShapeError(f"PackedBits.{nm} must be a nonnegative integer, got {v!r}")
            object.__setattr__(self, nm, int(v))
        want = (self.nrows, words_for(self.ncols))
        if d.shape != want:
            raise ShapeError(f"PackedBits.data has shape {d.shape}; {self.nrows} rows of "
                             f"{self.ncols} bits need {want[0]}×{want[1]} words")
        if not d.flags.c_contiguous:
            raise ShapeError("PackedBits.data must be C-contiguous (np.ascontiguousarray)")
        mask = _padding_mask(self.ncols)
        if mask and self.nrows and np.any(d[:, -1] & mask):
            row = int(np.flatnonzero(d[:, -1] & mask)[0])
            raise ShapeError(f"row {row} has nonzero padding bits beyond column {self.ncols}; "
                             f"the padding bits of every row must be zero")

    @property
    def shape(self) -> tuple[int, int]:
        return (self.nrows, self.ncols)

    @property
    def nwords(self) -> int:
        """Words per row."""
        return self.data.shape[1]

    @classmethod
    def from_array(cls, a: np.ndarray, what: str = "array") -> "PackedBits":
        return pack(a, what)

    def to_array(self) -> np.ndarray:
        """The matrix as an nrows × ncols ``np.uint8`` array of 0 and 1."""
        return unpack(self)

    def __eq__(self, other):
        return (isinstance(other, PackedBits) and self.shape == other.shape
                and np.array_equal(self.data, other.data))

    __hash__ = None   # mutable payload

    def __repr__(self):
        return f"PackedBits({self.nrows}×{self.ncols}, {self.nwords} words per row)"


_INTEGER_KINDS = "biu"   # bool, signed and unsigned integers


def check_bit_form(a, what: str = "array") -> np.ndarray:
    """``a`` if it is a 2-D numpy array of bool or an integer dtype (values not looked at);
    ``DTypeError`` or ``ShapeError`` naming the problem otherwise."""
    if not isinstance(a, np.ndarray):
        raise DTypeError(f"{what} must be a numpy array of 0 and 1 (or PackedBits), got "
                         f"{type(a).__name__}")
    if a.ndim != 2:
        raise ShapeError(f"{what} must be 2-D (a matrix), got {a.ndim}-D with shape {a.shape}")
    if a.dtype.kind not in _INTEGER_KINDS:
        raise DTypeError(f"{what} has dtype {a.dtype}; bit matrices take bool or an integer "
                         f"dtype holding 0 and 1 (convert with a.astype(np.uint8) after "
                         f"checking the values)")
    return a


def check_bit_values(a: np.ndarray, what: str = "array") -> np.ndarray:
    """``a`` (already through ``check_bit_form``) if every entry is 0 or 1; else
    ``ValueError`` naming the first entry that is not."""
    if a.dtype.kind != "b" and a.size and (a.min() < 0 or a.max() > 1):
        i, j = np.argwhere((a != 0) & (a != 1))[0]
        raise ValueError(f"{what}[{i}, {j}] = {a[i, j]} is not 0 or 1; bit matrices hold only "
                         f"0 and 1")
    return a


def pack(a, what: str = "array") -> PackedBits:
    """Pack a 2-D array of 0 and 1 (bool, uint8 or any integer dtype) into ``PackedBits``."""
    a = check_bit_values(check_bit_form(a, what), what)
    nrows, ncols = a.shape
    nw = words_for(ncols)
    data = np.zeros((nrows, nw * 8), dtype=np.uint8)
    if a.size:
        packed = np.packbits(a.astype(np.bool_, copy=False), axis=1, bitorder="little")
        data[:, :packed.shape[1]] = packed     # the packed bytes, then zero bytes to a word
    return PackedBits(data.view(np.uint64), nrows, ncols)


def unpack(p, ncols: int | None = None) -> np.ndarray:
    """The nrows × ncols ``np.uint8`` array of 0 and 1 held by ``p``: a ``PackedBits`` or a
    raw nrows × W ``np.uint64`` array in the layout above (then ``ncols`` is required)."""
    if isinstance(p, PackedBits):
        if ncols is not None and ncols != p.ncols:
            raise ShapeError(f"ncols={ncols} differs from the PackedBits' {p.ncols} columns")
        data, ncols = p.data, p.ncols
    else:
        if ncols is None:
            raise ShapeError("unpack of a raw word array needs ncols (its number of columns)")
        arr = np.asarray(p)
        if arr.ndim != 2:
            raise ShapeError(f"packed words must be a 2-D array (rows × words), got "
                             f"{arr.ndim}-D")
        data = PackedBits(np.ascontiguousarray(arr), arr.shape[0], ncols).data
    return np.unpackbits(data.view(np.uint8), axis=1, count=ncols, bitorder="little")
