"""LCMAs over GF(2) on packed bit matrices: a scheme ``<m,k,n;R>`` read modulo 2, applied
recursively, its block additions done as XORs of packed blocks, and the Four Russians kernel
(``lcmac.bits.products``) at the bottom.

**Schemes.**  Any catalogue scheme reduced modulo 2 (``lcmac.ir.gf2.reduce_mod2``: Strassen
has no minus signs there), a ``GF2Algorithm``, or an alternative-basis pair over GF(2)
(``lcmac.ir.alternative_basis``, Karstadt–Schwartz): its basis changes φ, ψ run once per
level on the whole operands, υ⁻¹ once per level on the result, and only the sparser core
recurs.  The combine programs are lcmac's CSE programs; a term's coefficient is taken modulo
2, which is exact because each program computes its 0/1 matrix over the integers.

**Recursion, breadth first.**  Level by level, every node's operand is cut into its m×k (or
k×n) blocks and the R combinations of all nodes are formed with one XOR per program term,
over all nodes at once: the numpy calls per level do not grow with the R^ℓ nodes.  The R^L
base-case products go to the kernel as one stack, and the products are combined back up the
same way.  A block of A is rows × 64-bit words, so A's columns (and B's rows) are cut at word
boundaries.

**The base case** is the native kernel where it can be had, else the numpy one
(``lcmac.bits.native``; ``kernel=``).  Each has its own ``auto_levels`` threshold.

**Sizes the grid does not divide** are padded with zero rows and zero words to multiples of
m^L rows, k^L words of A and n^L words of B (B's rows to 64 × A's words), and C is cropped:
zero rows and columns add nothing, so the padding is exact.

The Boolean semiring has no LCMA here: see ``lcmac.bits.products.boolean_product``.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np

from lcmac.core.errors import AlgorithmError, ShapeError
from lcmac.ir.algorithm import Algorithm
from lcmac.ir.alternative_basis import AlternativeBasisAlgorithm, stage_program
from lcmac.ir.basis_search import search_basis
from lcmac.ir.catalogue import get, get_gf2
from lcmac.ir.gf2 import GF2Algorithm, mod2, reduce_mod2
from lcmac.ir.program import LinearProgram, combine_matrices
from lcmac.bits.native import base_product, choose_kernel
from lcmac.bits.packing import WORD_BITS, PackedBits
from lcmac.bits.products import KernelCount

__all__ = ["XorProgram", "GF2Scheme", "XorReport", "gf2_scheme", "auto_levels", "lcma_product",
           "plan", "recurse", "check_levels", "padded", "AUTO_SCHEME",
           "BASE_BITS", "NATIVE_BASE_BITS", "MAX_LEVELS", "ALTERNATIVE_BASIS_SUFFIX"]

#: recurse while every dimension of the base-case products stays at least this many bits.
#: The kernel moves one table row (N/64 words) per lookup, and numpy's cost per lookup falls
#: with the row's width, so narrower base cases run slower per bit operation: a level pays
#: above base cases of 4096² and loses on narrower ones (docs/bits.md)
BASE_BITS = 4096
#: the same for the native kernel (``lcmac.bits.native``), which runs at about the same rate
#: from 4096² to 16384², so a level pays only where its XORs (numpy, memory-bound) cost less
#: than the 1/8 of the kernel's time it saves: above base cases of 8192² (docs/bits.md)
NATIVE_BASE_BITS = 8192
#: the scheme ``algo="auto"`` recurses with, where ``auto_levels`` finds room for a level
AUTO_SCHEME = "winograd"
#: levels beyond this multiply the stacks' memory by (R/(m·k))^L for little gain
MAX_LEVELS = 6
#: ``"winograd-ab"``: Winograd's scheme in the alternative basis found by ``search_basis``
ALTERNATIVE_BASIS_SUFFIX = "-ab"


@dataclass(frozen=True)
class XorProgram:
    """A straight-line program over GF(2): each temporary and output is the XOR of slots
    (inputs 0 … n_inputs−1, then temporaries), read from a ``LinearProgram`` modulo 2."""

    n_inputs: int
    temps: tuple[tuple[int, ...], ...]
    outputs: tuple[tuple[int, ...], ...]

    @classmethod
    def from_linear(cls, p: LinearProgram) -> "XorProgram":
        def odd(expr):
            return tuple(s for c, s in expr if mod2(c, "program coefficient"))
        return cls(p.n_inputs, tuple(odd(e) for e in p.temps), tuple(odd(e) for e in p.outputs))

    @property
    def n_outputs(self) -> int:
        return len(self.outputs)

    @property
    def xors(self) -> int:
        return sum(max(0, len(e) - 1) for e in self.temps + self.outputs)


@dataclass(frozen=True)
class GF2Scheme:
    """What the recursion runs: the grid, the rank, the combine programs (``"A"``, ``"B"``,
    ``"H"``) and, for an alternative-basis pair, the basis changes (``"A"``: φ, ``"B"``: ψ,
    ``"C"``: υ⁻¹; empty for a standard scheme)."""

    name: str
    m: int
    k: int
    n: int
    R: int
    combine: dict
    basis: dict = field(default_factory=dict)

    @property
    def grid(self) -> tuple[int, int, int]:
        return (self.m, self.k, self.n)


def _programs(matrices: dict) -> dict:
    return {s: XorProgram.from_linear(stage_program(M)) for s, M in matrices.items()}


def _from_object(alg) -> GF2Scheme:
    if isinstance(alg, AlternativeBasisAlgorithm):
        if alg.ring != "gf2":
            raise AlgorithmError(f"{alg.name} is an alternative-basis pair over the rationals; "
                                 f"bit matrices need one over GF(2): "
                                 f"search_basis(alg, ring='gf2') finds one")
        alg.verify()
        return GF2Scheme(alg.name, alg.m, alg.k, alg.n, alg.R, _programs(alg.core_matrices()),
                         _programs(alg.basis_matrices()))
    if isinstance(alg, Algorithm):
        alg = reduce_mod2(alg)            # refuses even denominators by name
    if not isinstance(alg, GF2Algorithm):
        raise AlgorithmError(f"{alg!r} is not a scheme: pass a name, an Algorithm, a "
                             f"GF2Algorithm or an AlternativeBasisAlgorithm over GF(2)")
    return GF2Scheme(alg.name, alg.m, alg.k, alg.n, alg.R, _programs(combine_matrices(alg)))


@functools.lru_cache(maxsize=64)
def _from_name(name: str) -> GF2Scheme:
    if name.endswith(ALTERNATIVE_BASIS_SUFFIX):
        base = get(name[:-len(ALTERNATIVE_BASIS_SUFFIX)])
        return _from_object(search_basis(base, ring="gf2").algorithm)
    return _from_object(get_gf2(name))     # catalogue schemes reduced mod 2, and GF(2)-only ones


def gf2_scheme(algo) -> GF2Scheme:
    """The scheme for ``algo``: a catalogue name or expression (``"strassen"``,
    ``"winograd"``, ``"strassen^2"``; reduced modulo 2), a name with ``"-ab"`` appended (the
    alternative basis over GF(2) that ``lcmac.ir.basis_search`` finds for it), an
    ``Algorithm``, a ``GF2Algorithm`` or an ``AlternativeBasisAlgorithm`` over GF(2)."""
    if isinstance(algo, GF2Scheme):
        return algo
    if isinstance(algo, str):
        return _from_name(algo)
    return _from_object(algo)


@dataclass
class XorReport:
    """What one LCMA product over GF(2) did.

    ``padded_shape`` and ``base_shape``: (M, K, N) in bits after padding, and of each of the
    ``base_products`` products the kernel ran.  ``block_xors``: XORs of two blocks, per
    program (``"A"``, ``"B"``, ``"H"``: the combines; ``"phi"``, ``"psi"``, ``"upsilon_inv"``:
    basis changes), summed over the levels and the nodes (or groups of blocks) of each level;
    ``xor_words``: the 64-bit word XORs they took; ``copied_words``: words of blocks copied
    unchanged (a combination of one block); ``kernel``: the Four Russians kernel's own word
    XORs, and which kernel ran (``kernel.kernel``: ``"native"`` or ``"numpy"``)."""

    scheme: str
    levels: int
    padded_shape: tuple[int, int, int]
    base_shape: tuple[int, int, int]
    base_products: int
    block_xors: dict = field(default_factory=dict)
    xor_words: int = 0
    copied_words: int = 0
    kernel: KernelCount = field(default_factory=KernelCount)

    def to_dict(self) -> dict:
        return {"scheme": self.scheme, "levels": self.levels,
                "padded_shape": list(self.padded_shape), "base_shape": list(self.base_shape),
                "base_products": self.base_products, "block_xors": dict(self.block_xors),
                "xor_words": self.xor_words, "copied_words": self.copied_words,
                "kernel_words": {"tables": self.kernel.tables,
                                 "accumulate": self.kernel.accumulate},
                "kernel": self.kernel.kernel}


def _new(shape, like):
    """An uninitialised word array of ``shape`` of the same kind as ``like``: numpy (uint64)
    on the CPU, torch (int64, the same bits) on a GPU (``lcmac.bits.cuda``)."""
    if isinstance(like, np.ndarray):
        return np.empty(shape, np.uint64)
    return like.new_empty(shape)


def _zeros(shape, like):
    out = _new(shape, like)
    out[...] = 0
    return out


def _xor(a, b, out=None):
    if isinstance(a, np.ndarray):
        return np.bitwise_xor(a, b, out=out)
    import torch                          # the arrays are torch tensors: torch is imported
    return torch.bitwise_xor(a, b, out=out) if out is not None else torch.bitwise_xor(a, b)


def _count(x) -> int:
    return int(x.size) if isinstance(x, np.ndarray) else int(x.numel())


def _xor_into(dst: np.ndarray | None, xs: list, report: XorReport) -> np.ndarray:
    """dst = XOR of xs (a new array when dst is None); the words touched go into ``report``."""
    if not xs:
        if dst is None:
            raise AlgorithmError("a combine program has a temporary with no terms")
        dst[...] = 0
        return dst
    if len(xs) == 1:
        if dst is None:
            return xs[0]                 # an alias: nothing to compute
        dst[...] = xs[0]
        report.copied_words += _count(dst)
        return dst
    dst = _xor(xs[0], xs[1], dst)
    for x in xs[2:]:
        _xor(dst, x, dst)
    report.xor_words += (len(xs) - 1) * _count(dst)
    return dst


def _run(prog: XorProgram, inputs: list, outputs: list, nodes: int, report: XorReport,
         stage: str) -> None:
    """Evaluate ``prog`` on the block arrays ``inputs`` (each holding the block of ``nodes``
    nodes), writing output o into ``outputs[o]``."""
    slots = list(inputs)
    for terms in prog.temps:
        slots.append(_xor_into(None, [slots[s] for s in terms], report))
    for dst, terms in zip(outputs, prog.outputs):
        _xor_into(dst, [slots[s] for s in terms], report)
    report.block_xors[stage] = report.block_xors.get(stage, 0) + prog.xors * nodes


def _descend(x: np.ndarray, prog: XorProgram, p: int, q: int, report: XorReport,
             stage: str) -> np.ndarray:
    """One level down: the stack x (nodes × rows × words) cut into p×q blocks per node, and
    the program's R combinations of them: (nodes·R) × rows/p × words/q."""
    nodes, rows, words = x.shape
    rb, wb = rows // p, words // q
    blocks = x.reshape(nodes, p, rb, q, wb)
    out = _new((nodes, prog.n_outputs, rb, wb), x)
    _run(prog, [blocks[:, i, :, j, :] for i in range(p) for j in range(q)],
         [out[:, r] for r in range(out.shape[1])], nodes, report, stage)
    return out.reshape(-1, rb, wb)


def _ascend(h: np.ndarray, prog: XorProgram, m: int, n: int, report: XorReport) -> np.ndarray:
    """One level up: the products of each node (nodes·R × rows × words) combined into the
    node's m×n blocks of C: nodes × m·rows × n·words."""
    R = prog.n_inputs
    nodes = h.shape[0] // R
    rows, words = h.shape[1:]
    hs = h.reshape(nodes, R, rows, words)
    out = _new((nodes, m * rows, n * words), h)
    blocks = out.reshape(nodes, m, rows, n, words)
    _run(prog, [hs[:, r] for r in range(R)],
         [blocks[:, i, :, j, :] for i in range(m) for j in range(n)], nodes, report, "H")
    return out


def _change_basis(x: np.ndarray, prog: XorProgram, p: int, q: int, levels: int,
                  report: XorReport, stage: str) -> np.ndarray:
    """The basis change applied at every level: at level ℓ, to each of the p^ℓ·q^ℓ groups of
    p×q blocks at once (x: rows × words, divisible by p^levels and q^levels)."""
    rows, words = x.shape
    for lvl in range(levels):
        P, Q = p ** lvl, q ** lvl
        rb, wb = rows // (P * p), words // (Q * q)
        src = x.reshape(P, p, rb, Q, q, wb)
        y = _new(x.shape, x)
        dst = y.reshape(P, p, rb, Q, q, wb)
        _run(prog, [src[:, i, :, :, j, :] for i in range(p) for j in range(q)],
             [dst[:, i, :, :, j, :] for i in range(p) for j in range(q)], P * Q, report, stage)
        x = y
    return x


def auto_levels(scheme: GF2Scheme, shape: tuple[int, int, int], base_bits: int = BASE_BITS) -> int:
    """The most levels (at most ``MAX_LEVELS``) after which every dimension of the base-case
    products, M rows, K and N bits, is still at least ``base_bits``."""
    M, K, N = shape
    levels = 0
    while levels < MAX_LEVELS:
        nxt = levels + 1
        if min(M // scheme.m ** nxt, K // scheme.k ** nxt, N // scheme.n ** nxt) < base_bits:
            break
        levels = nxt
    return levels


def padded(x: np.ndarray, rows: int, words: int) -> np.ndarray:
    if x.shape == (rows, words):
        return x
    out = _zeros((rows, words), x)
    out[:x.shape[0], :x.shape[1]] = x
    return out


def _round_up(x: int, d: int) -> int:
    return -(-x // d) * d


def plan(scheme: GF2Scheme, M: int, KW: int, NW: int, levels: int) -> tuple:
    """(Mp, KWp, NWp, base shape in bits): A's rows and words and B's words padded to whole
    blocks of ``levels`` levels, and the shape (rows, K bits, N bits) of each base product."""
    m, k, n = scheme.grid
    Mp = _round_up(max(M, 1), m ** levels)
    KWp = _round_up(max(KW, 1), k ** levels)
    NWp = _round_up(max(NW, 1), n ** levels)
    return Mp, KWp, NWp, (Mp // m ** levels, KWp * WORD_BITS // k ** levels,
                          NWp * WORD_BITS // n ** levels)


def recurse(a, b, scheme: GF2Scheme, levels: int, report: XorReport, base):
    """C = A·B over GF(2) on padded word arrays (``plan``'s sizes; numpy uint64 or torch
    int64 on a GPU): the basis changes, ``levels`` levels down, ``base(a_stack, b_stack)``
    on the R^levels products at once, and back up."""
    m, k, n = scheme.grid
    if scheme.basis and levels:
        a = _change_basis(a, scheme.basis["A"], m, k, levels, report, "phi")
        b = _change_basis(b, scheme.basis["B"], k, n, levels, report, "psi")
    a, b = a[None], b[None]
    for _ in range(levels):
        a = _descend(a, scheme.combine["A"], m, k, report, "A")
        b = _descend(b, scheme.combine["B"], k, n, report, "B")
    c = base(a, b)
    del a, b
    for _ in range(levels):
        c = _ascend(c, scheme.combine["H"], m, n, report)
    c = c[0]
    if scheme.basis and levels:
        c = _change_basis(c, scheme.basis["C"], m, n, levels, report, "upsilon_inv")
    return c


def check_levels(levels) -> int:
    if not isinstance(levels, (int, np.integer)) or isinstance(levels, bool) or levels < 0:
        raise ValueError(f"levels must be a nonnegative integer, got {levels!r}")
    return int(levels)


def lcma_product(A: PackedBits, B: PackedBits, algo="winograd", levels: int | None = None,
                 *, base_bits: int | None = None,
                 kernel: str | None = None) -> tuple[PackedBits, XorReport]:
    """C = A·B over GF(2) by ``levels`` levels of the scheme ``algo`` (see ``gf2_scheme``;
    None: ``auto_levels`` with ``base_bits``, by default the threshold of the kernel that
    runs) above the Four Russians kernel (``kernel``: ``"auto"``, ``"native"`` or
    ``"numpy"``, see ``lcmac.bits.native``); returns C and what was done."""
    if A.ncols != B.nrows:
        raise ShapeError(f"inner dimensions differ: A is {A.nrows}×{A.ncols}, B is "
                         f"{B.nrows}×{B.ncols}")
    scheme = gf2_scheme(algo)
    M, K, N = A.nrows, A.ncols, B.ncols
    native = choose_kernel("gf2", kernel, M * K * N)
    if base_bits is None:
        base_bits = BASE_BITS if native is None else NATIVE_BASE_BITS
    if levels is None:
        levels = auto_levels(scheme, (M, K, N), base_bits)
    levels = check_levels(levels)
    Mp, KWp, NWp, base = plan(scheme, M, A.nwords, B.nwords, levels)
    report = XorReport(scheme.name, levels, (Mp, KWp * WORD_BITS, NWp * WORD_BITS), base,
                       scheme.R ** levels)
    if M == 0 or N == 0:
        return PackedBits(np.zeros((M, B.nwords), np.uint64), M, N), report
    a = padded(A.data, Mp, KWp)
    b = padded(B.data, KWp * WORD_BITS if levels else K, NWp)
    c = recurse(a, b, scheme, levels, report,
                lambda a, b: base_product(a, b, native, semiring="gf2", count=report.kernel))
    return PackedBits(np.ascontiguousarray(c[:M, :B.nwords]), M, N), report
