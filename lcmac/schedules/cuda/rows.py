"""Artifacts whose row count M is a run-time value (``CudaConfig.dynamic_rows``): one artifact
per N×K (and algorithm) serves every M up to its shape's M, the most rows one launch takes.

    rows_why        why a config and shape have no run-time-M form (None: they have one)
    row_blocks      Mb of a row count (the entry point computes the same in C)
    RowBlocking     an LCMA's blocking with M and Mb run-time values
    scalar_args     the run-time sizes a lowered kernel takes, in its launcher's order
    rows_info       the manifest's facts the entry point sizes the workspace from

and with N and K run-time values too (``CudaConfig.dynamic_shape``: one artifact per
algorithm serves every shape up to its shape's M, N, K):

    shape_why       why a config and shape have no run-time-shape form
    shape_units     what Mb, Nb, Kb are rounded up to
    shape_blocks    Mb, Nb, Kb of a shape (the entry point computes the same in C)
    ShapeBlocking   an LCMA's blocking with M, N, K, Mb, Nb, Kb run-time values
    shape_info      the manifest's facts the entry point checks shapes against and sizes the
                    workspace from

``compose._rows_kernels`` puts the templates together for such an artifact.

How the rows stay exact without padding.  M (and Mb) are TileLang dynamic dimensions
(``T.dynamic``): kernel arguments, passed as ints by the entry point
(``entry_point.rows_entry``).  TileLang's host launcher builds the TMA descriptors at each
launch from them, so a load past row M of A reads zeros (the copy engine's out-of-bounds
fill) and a store past row M of C is clipped; the plain GEMM's kernel is the exact-shape
kernel's, instruction for instruction, only its grid and descriptors are sized at launch.

An LCMA cuts A into m×k blocks of Mb×Kb rows and columns with Mb = ceil(M/m) rounded up to
the GEMM tile's block_m, so the GEMM stage's tiles are always whole (no tile of Ã or H is
ragged; the exact-shape kernel rounds Mb to 8 rows and has the same number of tile rows).
Combine A reads A masked by ``row < M`` (the rows of Ã past M are zeros), Combine H and the
fused epilogue write C masked by ``row < M``.  Ã and H are sized from the run-time M by the
entry point (``lcmac_workspace_bytes_rows``); B̃ does not depend on M, so a prepared B serves
every M.

Not done: the scaled and fp8 operand modes (their amax and scale buffers), float32's TF32
wgmma path, 2-CTA clusters (they pair tile rows, an even count known at build time), the
persistent fused forms (their plan is cut from the tile count), ``direct_views`` (its
descriptors are rewritten with static sizes, ``host_source.view_loads``).  Where a config
has no run-time-M form, ``rows:?xNxK`` keeps its ladder of bucket kernels.

Run-time N and K (``dynamic_shape``).  N, K, Nb and Kb are dynamic dimensions as well, so
every TMA descriptor (A, B, C, Ã, B̃, H) is built from the launch's sizes and the K loops'
trip counts are ceil(Kb / block_k) at run time.  Nb and Kb are ceil(N/n), ceil(K/k) rounded
up to 16 bytes (the row strides and block offsets TMA needs, as in the exact-shape kernel):
Ã, B̃ and H are 3-D tensors, so a GEMM tile past Kb or Nb reads zeros and its store is
clipped per dimension, with no tile reaching into the next row.  The combines read A and B
masked by row < M, col < K (resp. K, N) and Combine H writes C masked by row < M, col < N.
N and K themselves must be multiples of 16 bytes (A's, B's and C's row strides); the
entry point refuses other shapes by name, and the runtime pads them.

The fused kernel's grid form writes C blocks from whole tiles: there Nb is rounded up to
block_n (the GEMM stage runs as many tile columns as with 16 bytes; only Combine B writes the
zero columns between), and the epilogue masks C by row < M, col < N.

Not done for run-time shapes, beyond the run-time-M exclusions (which include the persistent
fused forms): a prepared B (B̃'s size depends on N and K; ``lcmac_prepare_b`` refuses).

Imports TileLang only inside ``scalar_args`` (the worker's process).
"""
from __future__ import annotations

from dataclasses import dataclass

from lcmac.core.dtypes import ITEMSIZE
from lcmac.spec.cuda import Blocking, CudaConfig, tma_copies
from lcmac.spec.cuda.blocking import ceil_div, round_up

__all__ = ["rows_why", "row_blocks", "RowBlocking", "scalar_args", "rows_info", "MAX_GRID_Y",
           "shape_why", "shape_units", "shape_blocks", "ShapeBlocking", "shape_info"]

#: CUDA's limit on a grid's y and z extents (the tile rows of a GEMM, the row tiles of a combine)
MAX_GRID_Y = 65535


def row_blocks(M: int, m: int, row_tile: int) -> int:
    """Mb of M rows cut into ``m`` block rows: ceil(M/m) rounded up to ``row_tile``."""
    return round_up(ceil_div(M, m), row_tile)


def rows_why(alg, shape, dtype: str, cfg: CudaConfig, arch: str) -> str | None:
    """Why ``cfg`` (for ``alg``, None for the plain GEMM) has no run-time-M form at ``shape``
    (whose M is the most rows a launch takes), or None where it has one."""
    if cfg.batched or cfg.bsr:
        return "a batched or block-sparse artifact takes its sizes at run time already"
    if cfg.operands != "native":
        return f"operands={cfg.operands!r} (its amax and scale buffers) has no run-time-M form yet"
    if not tma_copies(dtype):
        return (f"{dtype}'s copies are cp.async, and the run-time row bound is the TMA "
                f"descriptors' (set at launch)")
    if cfg.cluster == 2:
        return "cluster=2 pairs tile rows, an even count known at build time"
    if dtype == "float32" and arch == "sm_90a" and cfg.tf32_wgmma:
        return "float32's TF32 wgmma path (B̃ K-major) has no run-time-M form yet"
    if alg is not None and cfg.fused and (cfg.split_group or cfg.persistent or cfg.tma_reduce):
        return ("the persistent fused forms (split_group, persistent, tma_reduce) plan their grid "
                "from the tile count; use the grid form (fused=True alone) or fused=False")
    if alg is not None and cfg.direct_views not in ("none", "auto"):
        return (f"direct_views={cfg.direct_views!r} rewrites TMA descriptors with static sizes; "
                f"use direct_views='none'")
    M = int(shape[0])
    rows = M if alg is None else row_blocks(M, alg.m, cfg.block_m)
    tiles = [ceil_div(rows, cfg.block_m)]
    if alg is not None:
        tiles.append(ceil_div(rows, cfg.combine_rows))
    if max(tiles) > MAX_GRID_Y:
        return (f"M = {M} rows take {max(tiles)} grid rows, over CUDA's {MAX_GRID_Y}: build for "
                f"fewer rows (the runtime cuts larger M into launches of that many)")
    return None


@dataclass(frozen=True)
class RowBlocking:
    """``Blocking``'s fields with M and Mb TileLang dynamic dimensions (Vars) and N, K, Kb,
    Nb those of ``static`` (a Blocking at any M); ``row_tile``: Mb is a multiple of it."""
    static: Blocking
    M: object
    Mb: object
    row_tile: int

    def __getattr__(self, name):
        # N, K, m, k, n, R, Kb, Nb, k_align: the static blocking's
        if name == "static":
            raise AttributeError(name)
        return getattr(self.static, name)


def scalar_args(func) -> list[str]:
    """The dynamic dimensions a lowered kernel's launcher takes after its buffers, in its
    order (TileLang's wrapper): each Var that is a buffer dimension, by first appearance in
    the parameters."""
    from tilelang import tvm  # TileLang: the worker process only
    names = []
    for p in func.params:
        buf = func.buffer_map.get(p)
        for d in (buf.shape if buf is not None else ()):
            if isinstance(d, tvm.tirx.Var) and d.name not in names:
                names.append(d.name)
    return names


def rows_info(alg, max_rows: int, blk: Blocking | None, dtype: str, cfg: CudaConfig,
              workspace: list) -> dict:
    """The manifest's ``rows`` facts, which the entry point sizes the workspace from
    (``entry_point.rows_entry``): ``max_rows`` (the most rows a launch takes), ``m`` and
    ``row_tile`` (Mb = ceil(M/m) rounded up to row_tile; m 0: the plain GEMM, no Mb) and
    ``workspace`` [[buffer, bytes, bytes per row of Mb]] in the order of ``workspace``
    (a layout [(buffer, offset)] of ``blk``): Ã and H grow with Mb, B̃ does not."""
    if alg is None:
        return {"max_rows": max_rows, "m": 0, "row_tile": 0, "workspace": []}
    item = ITEMSIZE[dtype]
    per_row = {"At": blk.R * blk.Kb * item, "H": blk.R * blk.Nb * item}
    fixed = {"Bt": blk.R * blk.Kb * blk.Nb * item}
    layout = [[name, fixed.get(name, 0), per_row.get(name, 0)] for name, _ in workspace[:-1]]
    return {"max_rows": max_rows, "m": alg.m, "row_tile": cfg.block_m, "workspace": layout}


# ---- run-time M, N and K (CudaConfig.dynamic_shape) -------------------------------------------
def shape_units(alg, dtype: str, cfg: CudaConfig) -> dict:
    """What the run-time block sizes are multiples of: Mb of ``row_tile`` (block_m, as for
    run-time M), Nb of ``col_tile`` and Kb of ``depth_tile`` (16 bytes: TMA's row strides and
    block offsets; Nb of block_n for the fused kernel, whose epilogue writes C from whole
    tiles); ``vec``: N and K themselves (A's, B's and C's row strides)."""
    vec = 16 // ITEMSIZE[dtype]
    if alg is None:
        return {"row_tile": 0, "col_tile": 0, "depth_tile": 0, "vec": vec}
    return {"row_tile": cfg.block_m, "col_tile": cfg.block_n if cfg.fused else vec, "depth_tile": vec, "vec": vec}


def shape_blocks(alg, shape, units: dict) -> tuple:
    """(Mb, Nb, Kb) of an M×N×K product (the entry point computes the same in C)."""
    M, N, K = (int(d) for d in shape)
    return (round_up(ceil_div(M, alg.m), units["row_tile"]), round_up(ceil_div(N, alg.n), units["col_tile"]),
            round_up(ceil_div(K, alg.k), units["depth_tile"]))


def shape_why(alg, shape, dtype: str, cfg: CudaConfig, arch: str) -> str | None:
    """Why ``cfg`` (for ``alg``, None for the plain GEMM) has no run-time-shape form up to
    ``shape`` (the largest M, N, K a launch takes), or None where it has one."""
    if why := rows_why(alg, shape, dtype, cfg, arch):
        return why
    M, N, K = (int(d) for d in shape)
    if alg is not None:
        _, _, Kb = shape_blocks(alg, shape, shape_units(alg, dtype, cfg))
        if ceil_div(Kb, cfg.combine_rows) > MAX_GRID_Y:
            return (f"K = {K} takes {ceil_div(Kb, cfg.combine_rows)} grid rows of Combine B, over "
                    f"CUDA's {MAX_GRID_Y}: build for a smaller K")
    return None


@dataclass(frozen=True)
class ShapeBlocking:
    """``Blocking``'s fields with M, N, K, Mb, Nb, Kb TileLang dynamic dimensions (Vars);
    Mb, Nb, Kb are multiples of ``row_tile``, ``col_tile``, ``depth_tile``, N and K of
    ``vec`` (``shape_units``; the entry point checks and rounds them)."""
    M: object
    N: object
    K: object
    m: int
    k: int
    n: int
    R: int
    Mb: object
    Nb: object
    Kb: object
    row_tile: int
    col_tile: int
    depth_tile: int
    vec: int

    def multiples(self) -> list:
        """[(run-time size, what it is a multiple of)]: the facts a kernel states
        (``T.assume``) so that TileLang can prove its element-wise loops' vectors whole."""
        return [(self.N, self.vec), (self.K, self.vec), (self.Mb, self.row_tile),
                (self.Nb, self.col_tile), (self.Kb, self.depth_tile)]


def shape_info(alg, shape, dtype: str, cfg: CudaConfig, workspace: list) -> dict:
    """The manifest's ``dynamic_shape`` facts, which the entry point checks a launch against
    and sizes the workspace from (``entry_point.shape_entry``): ``max`` [M, N, K] (the largest
    a launch takes), ``item`` (bytes of an element), the grid ``m``, ``k``, ``n`` (0: the
    plain GEMM, no blocks), ``shape_units``, and ``workspace`` [[buffer, bytes per element of
    the block product, [block dims]]] in the order of ``workspace`` (a layout [(buffer,
    offset)]): Ã is R·Mb·Kb, B̃ R·Kb·Nb, H R·Mb·Nb."""
    out = {"max": [int(d) for d in shape], "item": ITEMSIZE[dtype], **shape_units(alg, dtype, cfg)}
    if alg is None:
        return dict(out, m=0, k=0, n=0, workspace=[])
    item = ITEMSIZE[dtype] * alg.R
    dims = {"At": ["Mb", "Kb"], "Bt": ["Kb", "Nb"], "H": ["Mb", "Nb"]}
    return dict(out, m=alg.m, k=alg.k, n=alg.n,
                workspace=[[name, item, dims[name]] for name, _ in workspace[:-1]])
