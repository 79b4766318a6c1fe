"""Alternative-basis LCMAs on lcmac's real-valued kernels: φ on A's blocks, ψ on B's, the
pair's core compiled as an ordinary lcmac kernel (through the kernel cache), υ⁻¹ on C's
blocks.

    C = ab_matmul(A, B, "winograd-ab")                  # numpy (this CPU) or CUDA tensors
    A1 = to_basis(A, "winograd-ab", "A"); B1 = to_basis(B, "winograd-ab", "B")
    C1 = ab_matmul(A1, B1, "winograd-ab", inputs_in_basis=True, output_in_basis=True)
    C = from_basis(C1, "winograd-ab")                   # the same C

``"<name>-ab"`` is the catalogue scheme ``<name>`` in the basis ``lcmac.ir.basis_search``
finds (Winograd: 12 core additions instead of 15, plus 1 + 1 + 1 in the basis changes); an
``AlternativeBasisAlgorithm`` over the rationals may be passed instead.  The pair is verified
exactly before use (its core alone does not compute A·B, and is never used alone).

Whether it pays is the cost model's question (``lcmac.costmodel.alternative_basis``): each
basis change is a pass over its operand, and lcmac's combines are memory-bound, so fewer
additions save little; the model has it slower for a single product and ahead only when the
operands arrive, and the result may stay, in the basis (``inputs_in_basis`` /
``output_in_basis``), by under 1 %.  docs/alternative-basis.md has the figures and a GPU
measurement.  One level only (the core at ``levels=1``).
"""
from __future__ import annotations

import functools

import numpy as np

from lcmac.api.call_args import LOADED
from lcmac.costmodel.alternative_basis import core_algorithm
from lcmac.core.errors import AlgorithmError, DTypeError, ShapeError
from lcmac.core.operands import check_matrices, check_one_dtype, dtype_name, operand_kind
from lcmac.ir.alternative_basis import AlternativeBasisAlgorithm
from lcmac.ir.basis_search import search_basis
from lcmac.ir.catalogue import get

__all__ = ["pair_for", "to_basis", "from_basis", "change_basis", "ab_matmul"]

SUFFIX = "-ab"


@functools.lru_cache(maxsize=32)
def _pair_by_name(name: str) -> AlternativeBasisAlgorithm:
    if not name.endswith(SUFFIX):
        raise AlgorithmError(f"{name!r} is not an alternative-basis scheme: append {SUFFIX!r} to "
                             f"a catalogue name (e.g. 'winograd-ab')")
    return search_basis(get(name[:-len(SUFFIX)]), ring="rational").algorithm.verify()


def pair_for(algo) -> AlternativeBasisAlgorithm:
    """The verified rational pair for a ``"<name>-ab"`` string or an ``AlternativeBasisAlgorithm``."""
    if isinstance(algo, AlternativeBasisAlgorithm):
        return algo.require_rational().verify()
    if isinstance(algo, str):
        return _pair_by_name(algo)
    raise AlgorithmError(f"{algo!r}: pass 'winograd-ab' (a catalogue name with '-ab') or an "
                         f"AlternativeBasisAlgorithm")


def _add_scaled(dst, c: float, x, first: bool) -> None:
    if first:
        dst[...] = x if c == 1 else x * c
    elif c == 1:
        dst += x
    elif c == -1:
        dst -= x
    else:
        dst += x * c


def change_basis(X, T, p: int, q: int):
    """Y with Y's block o (of p×q, row-major) = Σ_s T[o, s]·X's block s: numpy or torch."""
    rows, cols = X.shape[-2:]
    if rows % p or cols % q:
        raise ShapeError(f"a {rows}×{cols} operand does not split into {p}×{q} blocks")
    rb, cb = rows // p, cols // q

    def block(Z, o):
        i, j = divmod(o, q)
        return Z[..., i * rb:(i + 1) * rb, j * cb:(j + 1) * cb]
    Y = np.empty_like(X) if operand_kind(X) == "numpy" else X.new_empty(X.shape)
    for o in range(p * q):                 # every block of Y is written below
        dst, first = block(Y, o), True
        for s in range(p * q):
            c = T[o, s]
            if c:
                _add_scaled(dst, float(c), block(X, s), first)
                first = False
        if first:
            dst[...] = 0
    return Y


def to_basis(X, algo, side: str):
    """X (A or B) in the pair's basis: φ for ``side="A"``, ψ for ``"B"``."""
    pair = pair_for(algo)
    if side not in ("A", "B"):
        raise ValueError(f"side must be 'A' or 'B', not {side!r}")
    p, q = (pair.m, pair.k) if side == "A" else (pair.k, pair.n)
    return change_basis(X, pair.basis_matrices()[side], p, q)


def from_basis(C, algo):
    """C back from the pair's basis (υ⁻¹)."""
    pair = pair_for(algo)
    return change_basis(C, pair.basis_matrices()["C"], pair.m, pair.n)


def _core_kernel(pair, A, M: int, N: int, K: int, config=None):
    kind = operand_kind(A)
    if kind == "numpy":
        target = None
    elif kind == "torch" and A.is_cuda:
        target = "cuda"
    else:
        raise DTypeError("ab_matmul takes numpy arrays (this CPU) or torch CUDA tensors")
    dtype = dtype_name(A)
    core = core_algorithm(pair)
    return LOADED.get((core.hash, target, dtype, (M, N, K), repr(sorted((config or {}).items()))),
                      (core, target, dtype, (M, N, K)), {"config": config})


def ab_matmul(A, B, algo="winograd-ab", *, inputs_in_basis: bool = False,
              output_in_basis: bool = False, config=None):
    """C = A·B by the alternative-basis pair ``algo`` (module docstring).  With
    ``inputs_in_basis`` A and B are taken as ``to_basis`` gave them; with ``output_in_basis``
    C is returned in the basis (``from_basis`` finishes it).  ``config``: the core kernel's
    schedule knobs, as ``lcmac build --config`` takes them (default: the backend's)."""
    pair = pair_for(algo)
    M, N, K = check_matrices(A, B, who="ab_matmul")
    m, k, n = pair.grid
    if M % m or K % k or N % n:
        raise ShapeError(f"{M}x{N}x{K} does not split into the pair's {m}x{k}x{n} grid: "
                         f"M, K, N must be multiples of {m}, {k}, {n}")
    check_one_dtype(A, B)
    basis = pair.basis_matrices()
    if not inputs_in_basis:
        A = change_basis(A, basis["A"], m, k)
        B = change_basis(B, basis["B"], k, n)
    C = _core_kernel(pair, A, M, N, K, config)(A, B)
    return C if output_in_basis else change_basis(C, basis["C"], m, n)
