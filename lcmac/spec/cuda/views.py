"""Direct views (``CudaConfig.direct_views``): which operand sides the batched GEMM reads in
place from A and B, and where each product then finds its operand."""
from __future__ import annotations

from lcmac.spec.cuda.support import direct_views_why


def view_sides(cfg: "CudaConfig", blk: "Blocking", dtype: str, arch: str) -> str:
    """The operand sides ("", "a", "b", "ab") the batched GEMM reads in place with ``cfg``:
    "auto" resolved (both where ``direct_views_why`` accepts the shape, else none); an
    explicit choice as given (the build refuses it where it cannot apply)."""
    if cfg.direct_views == "auto":
        return "" if direct_views_why(cfg, blk, dtype, arch) else "ab"
    return "" if cfg.direct_views == "none" else cfg.direct_views


def side_read_in_place(direct: int, R: int) -> bool:
    """Whether a side with ``direct`` of its ``R`` operands a bare input block is read in
    place: some but not all (with none there is nothing to skip, with all nothing to combine)."""
    return 0 < direct < R


def operand_sources(R: int, direct: dict[int, int]) -> list[int]:
    """Where each of R products reads its operand on one side when the products in
    ``direct`` ({r: input slot}, ``ir.program.direct_outputs``) read their block of A / B in
    place (``CudaConfig.direct_views``): the workspace slot (≥ 0) the combine writes it to,
    or −1 − slot for input block ``slot`` (p·Q + q: A has m × k blocks, B k × n)."""
    written = [r for r in range(R) if r not in direct]
    return [-1 - direct[r] if r in direct else written.index(r) for r in range(R)]
