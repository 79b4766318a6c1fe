"""The stage model for an alternative-basis pair (Karstadt–Schwartz; ``lcmac.ir.alternative_basis``)
run on real-valued kernels, and whether it pays against the scheme it came from.

A pair runs as: φ on A's blocks, ψ on B's, the core ``<U', V', W'>`` as an ordinary LCMA
(its combines and GEMM stage priced by ``stages.lcma_estimate``), then υ⁻¹ on C's blocks.
Each basis change is priced as the executor runs it (``lcmac.api.alternative``): a streaming pass
that reads every block of its operand once and writes the whole transformed operand (the
kernels take one matrix, so unchanged blocks are copied too), with nnz − d block additions:

    basis change of X (d blocks of b elements)   adds (‖T‖₀ − d)·b    bytes 2·d·b·s

counted **once per product**: ψ not at all when B is static (a weight: transformed once,
with its combine, ``static_b``), and φ and υ⁻¹ not at all for a **chained** product, whose A
arrives and whose C leaves in the alternative basis (``chained``).  One level only: lcmac's
kernels run ``levels`` as the Kronecker power of a scheme, and the pair's bases would have to
be powered with it.

Worked example (H100 profile, bf16, 32768³, fused, Winograd against its pair from
``search_basis``, 12 core additions against 15): Winograd's stages are Combine A and B 1.51
ms each, the GEMM stage 79.97 ms, Combine H 1.54 ms: 84.53 ms.  The core's combines read the
same 4 blocks and write one operand fewer (3 of the 7 products' A operands are sums, against
4): 1.32 ms each, and its Combine H 1.28 ms.  φ, ψ and υ⁻¹ cost a pass over A, B and C each
(read and write 2 GiB at the achievable bandwidth): 1.51 ms apiece.  So a single product by
the pair takes 88.43 ms (0.956×); chained with a static B, where only the saved writes remain,
82.58 ms against Winograd's 83.02 with its static B (1.005×).  ``compare`` gives these numbers
for any pair, shape and profile.
"""
from __future__ import annotations

from dataclasses import dataclass
from math import ceil
from types import MappingProxyType

import numpy as np

from lcmac.core.dtypes import ITEMSIZE
from lcmac.ir.algorithm import Algorithm
from lcmac.costmodel.stages import Estimate, StageCost, _none, _prep, _roof, lcma_estimate

__all__ = ["core_algorithm", "pair_estimate", "compare", "BasisComparison"]


def core_algorithm(pair) -> Algorithm:
    """The pair's core as an ``Algorithm`` (the combines a kernel runs; by itself it computes
    C in the alternative basis, not A·B, so it is never verified alone: the pair is)."""
    return Algorithm(pair.m, pair.k, pair.n, pair.U, pair.V, pair.W, name=f"{pair.name}-core",
                     source=f"the core of {pair.name} (alternative basis)")


def _basis_stage(name, T: np.ndarray, blocks: int, block_elems: int, s: int, add, bw) -> StageCost:
    identity = np.array_equal(T, np.eye(T.shape[0], dtype=T.dtype))
    if identity:
        return _none(name, "identity basis: nothing to do")
    adds = (int(np.count_nonzero(T)) - blocks) * block_elems
    return _roof(name, adds, 2.0 * blocks * block_elems * s, add, bw,
                 {"blocks": blocks, "nnz": int(np.count_nonzero(T))})


def pair_estimate(pair, M: int, N: int, K: int, dtype, profile, *, fused: bool = True,
                  static_b: bool = False, chained: bool = False, cse: bool = False) -> Estimate:
    """The modelled time of one product by ``pair`` (see the module's docstring): the core's
    Eq. 9/10 stages plus ``basis_a``, ``basis_b``, ``basis_c``."""
    p, d = _prep(M, N, K, dtype, profile)
    core = core_algorithm(pair)
    e = lcma_estimate(core, M, N, K, d, p, fused=fused, static_b=static_b, cse=cse)
    m, k, n = pair.grid
    Mb, Kb, Nb = ceil(M / m), ceil(K / k), ceil(N / n)
    s, bw, add = ITEMSIZE[d], p.achievable_bw(), p.achievable_add(d)
    basis = pair.basis_matrices()
    stages = dict(e.stages)
    stages["basis_a"] = (_none("basis_a", "chained: A arrives in the basis") if chained else
                         _basis_stage("basis_a", basis["A"], m * k, Mb * Kb, s, add, bw))
    stages["basis_b"] = (_none("basis_b", "B static or chained: transformed once") if static_b or chained
                         else _basis_stage("basis_b", basis["B"], k * n, Kb * Nb, s, add, bw))
    stages["basis_c"] = (_none("basis_c", "chained: C leaves in the basis") if chained else
                         _basis_stage("basis_c", basis["C"], m * n, Mb * Nb, s, add, bw))
    extra = sum(1 for nm in ("basis_a", "basis_b", "basis_c") if stages[nm].time_s)
    return Estimate(pair.name, pair.grid, pair.R, e.variant, MappingProxyType(stages),
                    e.overhead_s + extra * p.launch_overhead_s, e.kernels + extra)


@dataclass(frozen=True)
class BasisComparison:
    """The pair against its standard scheme, same shape, profile and options."""
    standard: Estimate
    alternative: Estimate

    @property
    def speedup(self) -> float:
        """standard time / pair time (> 1: the pair is faster)."""
        return self.standard.time_s / self.alternative.time_s

    @property
    def pays(self) -> bool:
        return self.alternative.time_s < self.standard.time_s

    def to_dict(self) -> dict:
        def stages(e):
            return {nm: round(st.time_s * 1e3, 4) for nm, st in e.stages.items()}
        return {"standard_ms": self.standard.time_s * 1e3, "alternative_ms": self.alternative.time_s * 1e3,
                "speedup": self.speedup, "pays": self.pays,
                "standard_stages_ms": stages(self.standard),
                "alternative_stages_ms": stages(self.alternative)}


def compare(standard_alg, pair, M: int, N: int, K: int, dtype, profile, *, fused: bool = True,
            static_b: bool = False, chained: bool = False) -> BasisComparison:
    """``standard_alg`` (the scheme the pair computes) and ``pair`` priced alike."""
    std = lcma_estimate(standard_alg, M, N, K, dtype, profile, fused=fused, static_b=static_b)
    alt = pair_estimate(pair, M, N, K, dtype, profile, fused=fused, static_b=static_b,
                        chained=chained)
    return BasisComparison(std, alt)
