"""Configs and shape bookkeeping for the CUDA (TileLang) templates.

Nothing here imports TileLang: the runtime, the tests and the tuner read these without a
compiler.  The templates themselves live in ``cuda_kernels.py`` (imported only inside the
TileLang worker process).

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

from dataclasses import asdict, dataclass, field, fields

from ..errors import LcmacError


class NotSupportedYet(LcmacError, NotImplementedError):
    """A feature of the CUDA backend that is not implemented yet (named in the message)."""


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def round_up(a: int, b: int) -> int:
    return ceil_div(a, b) * b


@dataclass(frozen=True)
class CudaConfig:
    """Template options the tuner may vary.

    fused        True: group-parallel combines + fused GEMM/Combine-H kernel (FalconGEMM);
                 False: Algorithm 1 (combines, batched GEMM writing H, Combine-H kernel).
    block_*      GEMM tile (CTA owns a block_m × block_n tile position of every C_ij).
    stages       software-pipeline depth of the K loop (TMA + mbarriers on sm_90a).
    threads      consumer threads per CTA (TileLang adds a producer warpgroup on sm_90a).
    swizzle      threadblock rasterisation panel (0 = off) for L2 reuse.
    r_order      "natural" (r = 0..R-1) or "greedy" (an order that finishes C tiles early;
                 only affects the epilogue traffic, the result is the same up to rounding).
    cache_aware  CTAs resident at the same time work on the same product r and share its
                 Ã_r/B̃_r panels in L2 (FalconGEMM's cache-aware order).  Unfused: r is the
                 slowest grid index; False makes r the fastest (the ablation).  Fused: every
                 CTA walks r in the same order; False is not supported yet.
    overlap_epilogue  one software pipeline over all (r, k) steps of a CTA, so the TMA producer
                 loads the next product's tiles while the consumers run the Combine-H epilogue
                 (instead of one pipeline per product with a barrier between them).
    split_group  persistent grid where one tile position's R products may be split over two
                 CTAs; not implemented yet (raises NotSupportedYet).
    combine_*    tile of the element-wise combine kernels.
    """
    fused: bool = False           # measured best on H200 (bench/notes-cuda.md); True = FalconGEMM fused
    block_m: int = 128
    block_n: int = 256
    block_k: int = 0             # 0: 64 for 2-byte dtypes, 32 for float32 (shared-memory fit)
    stages: int = 4
    threads: int = 256
    swizzle: int = 8
    policy: str = "auto"         # warpgroup split: "square" | "fullrow" (64x256 wgmma) | "auto"
                                 # (auto: fullrow for 2-byte types, square for float32 = measured)
    r_order: str = "natural"
    cache_aware: bool = True
    split_group: bool = False
    overlap_epilogue: bool = False
    tf32_wgmma: bool = False     # float32 on sm_90a: B̃ K-major + TF32 wgmma (cp.async loads);
                                 # measured slower than the default TF32 mma.sync + TMA path
    combine_rows: int = 16
    combine_cols: int = 256
    combine_threads: int = 256

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict | None) -> "CudaConfig":
        d = dict(d or {})
        names = {f.name for f in fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise LcmacError(f"unknown CUDA config keys {sorted(unknown)}; known: {sorted(names)}")
        return cls(**d)

    def bk(self, dtype: str) -> int:
        if self.block_k:
            return self.block_k
        return 32 if dtype == "float32" else 64

    def check(self) -> None:
        if self.policy not in ("auto", "square", "fullrow", "fullcol"):
            raise LcmacError(f"policy must be square, fullrow or fullcol, not {self.policy!r}")
        if self.split_group:
            raise NotSupportedYet("split_group persistent scheduling is not supported yet by the "
                                  "CUDA backend (set split_group=False)")
        if self.r_order not in ("natural", "greedy"):
            raise LcmacError(f"r_order must be 'natural' or 'greedy', not {self.r_order!r}")


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
    Mb: int = field(init=False)
    Kb: int = field(init=False)
    Nb: int = field(init=False)

    def __post_init__(self):
        object.__setattr__(self, "Mb", round_up(ceil_div(self.M, self.m), 8))
        object.__setattr__(self, "Kb", round_up(ceil_div(self.K, self.k), 8))
        object.__setattr__(self, "Nb", round_up(ceil_div(self.N, self.n), 8))

    def workspace_elems(self, fused: bool) -> dict[str, int]:
        ws = {"At": self.R * self.Mb * self.Kb, "Bt": self.R * self.Kb * self.Nb}
        if not fused:
            ws["H"] = self.R * self.Mb * self.Nb
        return ws


SUPPORTED_DTYPES = ("bfloat16", "float16", "float32")


def check_shape(M: int, N: int, K: int, dtype: str) -> None:
    from ..errors import ShapeError
    from ..dtypes import ITEMSIZE
    if min(M, N, K) <= 0:
        raise ShapeError(f"shape must be positive, got M={M} N={N} K={K}")
    vec = 16 // ITEMSIZE[dtype]
    if K % vec or N % vec:
        raise ShapeError(f"the CUDA backend needs K and N to be multiples of {vec} for {dtype} "
                         f"(16-byte rows for the TMA copies); got K={K}, N={N} (M may be any size)")


def r_order(W, order: str) -> list[int]:
    """The order in which a CTA computes its R products.

    "greedy": repeatedly take the product that completes the most C tiles soonest (fewest
    remaining contributions), so partial C tiles live for the shortest time."""
    import numpy as np
    R = W.shape[0]
    if order == "natural":
        return list(range(R))
    nz = [(np.asarray(W[r]) != 0) for r in range(R)]
    remaining = sum(x.astype(int) for x in nz)
    left = set(range(R))
    out = []
    while left:
        best = min(left, key=lambda r: (int((remaining[nz[r]]).min()) if nz[r].any() else 0, r))
        out.append(best)
        left.remove(best)
        remaining = remaining - nz[best].astype(int)
    return out
