"""Block sizes of one LCMA on one shape, and the global buffers they give.

Layout of an LCMA run on the GPU (one artifact, one shape M×N×K, row-major operands):

    A (M×K) ──combine_a──► Ã  [R, Mb, Kb]   (workspace)
    B (K×N) ──combine_b──► B̃  [R, Kb, Nb]   (workspace)
    fused:    C_ij tile += W[r,i,j] · (Ã_r · B̃_r) tile, r in a fixed order, per CTA
    unfused:  H [R, Mb, Nb] = batched GEMM;  C = combine_h(H)

Mb = ceil(M/m) rounded up to a multiple of 8 (16-byte rows for TMA), likewise Kb, Nb; the
padding is zero in Ã, B̃ (the combine kernels read A, B masked), and rows/columns of C beyond
M, N are never written.
"""
from __future__ import annotations

from dataclasses import dataclass, field


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def round_up(a: int, b: int) -> int:
    return ceil_div(a, b) * b


@dataclass(frozen=True)
class Blocking:
    """Block sizes of one LCMA on one problem shape (see the module docstring)."""
    M: int
    N: int
    K: int
    m: int
    k: int
    n: int
    R: int
    k_align: int = 8          # 16 for 1-byte (fp8) operands: TMA rows are multiples of 16 bytes
    Mb: int = field(init=False)
    Kb: int = field(init=False)
    Nb: int = field(init=False)

    def __post_init__(self):
        object.__setattr__(self, "Mb", round_up(ceil_div(self.M, self.m), 8))
        object.__setattr__(self, "Kb", round_up(ceil_div(self.K, self.k), self.k_align))
        object.__setattr__(self, "Nb", round_up(ceil_div(self.N, self.n), 8))

    def workspace_elems(self, fused: bool) -> dict[str, int]:
        ws = {"At": self.R * self.Mb * self.Kb, "Bt": self.R * self.Kb * self.Nb}
        if not fused:
            ws["H"] = self.R * self.Mb * self.Nb
        return ws


#: TileLang/TVM index arithmetic is int32 unless a buffer's extents are int64.  Flattening a
#: buffer access folds its compile-time-constant part (r·Mb·Nb for an unrolled product index
#: r, i·Mb·N for a C block row) in the extents' type, and an int32 fold wraps silently
#: (tile-ai/tilelang#2560): the wrapped offset is a wrong address (an illegal access, or a
#: wrong result when it lands inside another workspace buffer).  TileLang promotes an index
#: to int64 only when its run-time range exceeds int32, after that fold.  So every global
#: buffer of more than INDEX_INT32_MAX elements is declared with int64 extents.
INDEX_INT32_MAX = 2**31 - 1


def needs_int64(dims) -> bool:
    """Does a buffer of these extents need 64-bit index arithmetic?"""
    n = 1
    for d in dims:
        n *= int(d)
    return n > INDEX_INT32_MAX


def buffer_shapes(blk: "Blocking", fused: bool, kmajor_b: bool = False) -> dict[str, tuple]:
    """The global buffers of one LCMA artifact (user operands and workspaces) and their
    shapes, as the templates declare them."""
    out = {"A": (blk.M, blk.K), "B": (blk.K, blk.N), "C": (blk.M, blk.N),
           "At": (blk.R, blk.Mb, blk.Kb),
           "Bt": (blk.R, blk.Nb, blk.Kb) if kmajor_b else (blk.R, blk.Kb, blk.Nb)}
    if not fused:
        out["H"] = (blk.R, blk.Mb, blk.Nb)
    return out


def int64_buffers(blk: "Blocking", fused: bool, kmajor_b: bool = False) -> list[str]:
    """Names of the buffers indexed in 64 bits (more than 2³¹−1 elements)."""
    return [k for k, v in buffer_shapes(blk, fused, kmajor_b).items() if needs_int64(v)]
