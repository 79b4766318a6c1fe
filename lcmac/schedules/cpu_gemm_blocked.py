"""The plain GEMM with its operands packed block by block inside the parallel tasks (the
GotoBLAS / BLIS loop order), for ``CpuConfig.bands`` > 0.

The default CPU path packs all of A and all of B in two passes before the GEMM stage (the
combine passes, which an LCMA needs anyway).  For a plain GEMM that order leaves the packed
panels in DRAM by the time the micro-kernel reads them.  Here a task owns a row band of C;
for each kc chunk it packs its band's rows of A once (``Ab``: the band's mc blocks one after
another, in L3), then for every column block a kc × nc chunk of B (``Bc``), and walks the
band's mc blocks, each of which the micro-kernel pulls into L2 and reuses for every nr
columns of the block.  Both are packed once per band (A: once in all; B: ``bands`` times):
with an mc × kc chunk of A packed per column block, A was packed N / nc times, and at
4096³ single-threaded that packing cost 8 % of the run (the kernel with the packing taken
out ran 95 GFLOP/s against 87; docs/cpu.md).  The packed layouts are those of
``cpu_gemm`` (A: mr rows interleaved per k; B: nr columns contiguous per k).

Tasks: ``bands`` row bands, each a whole number ``nic`` of mc blocks (the last band's extra
blocks skipped); where there are fewer row blocks than ``bands`` asks for, the column blocks
are split into groups too, so small-M shapes still use the threads (then A is packed once
per group).

    for t in parallel(bands · groups):  (tm, cg)
      for kc:   pack A[band tm, kc chunk] → Ab
        for tn in group cg:
          pack B[kc chunk, tn block] → Bc        (row by row; skipped with B prepared: read B̃p)
          for ic: for jr: for ir: acc = Ab[ic, ir] · Bc[jr]; C tile (=|+=) acc   (row-tested row tail)

Only the shapes the fast path handles take it (``applies``): whole tiles of columns and of
k (no zero padding of A or B); a row tail is allowed (A's rows are clamped when packed, C's
stores row-tested).  Others keep the packing passes.
"""
from __future__ import annotations

from contextlib import ExitStack, nullcontext

from ..dtypes import ITEMSIZE
from .cpu_config import CpuConfig
from .cpu_gemm import Geometry, Writer, emit_chunk_store, emit_fma_loop, emit_zero_acc


def _bands(g: Geometry, cfg: CpuConfig) -> int:
    """Row bands that own at least one mc block."""
    return max(1, min(cfg.bands, g.nmc))


def _band_blocks(g: Geometry, cfg: CpuConfig) -> int:
    """mc blocks per band (the last band may own fewer; its extra blocks are skipped)."""
    return -(-g.nmc // _bands(g, cfg))


def _groups(g: Geometry, cfg: CpuConfig) -> int:
    """Column groups per band: 1, unless there are fewer row blocks than ``cfg.bands`` asks
    for (then the column blocks are shared out so that there are about ``cfg.bands`` tasks)."""
    return max(1, min(g.nnc, -(-cfg.bands // _bands(g, cfg))))


def workspace_bytes(g: Geometry, cfg: CpuConfig, dtype: str) -> int:
    """What the packed chunks take: each task holds its band's rows of A × kc and a kc × nc
    chunk of B, and with one task per thread all hold theirs at once."""
    band_rows = _band_blocks(g, cfg) * g.MC
    return _bands(g, cfg) * _groups(g, cfg) * ITEMSIZE[dtype] * g.KC * (band_rows + g.NC)


def applies(g: Geometry, R: int, acc: str, dtype: str, special_kernel: bool) -> bool:
    """Whether the blocked plain GEMM handles this build: one product on a 1×1×1 grid, fp32
    FMAs on the operands' own type, C written directly, no zero padding of A's or B's k or
    B's columns (cpu_combine.needs_pad's cases other than a row tail)."""
    return (R == 1 and (g.m, g.k, g.n) == (1, 1, 1) and acc == dtype and not special_kernel
            and g.direct_c and g.BKP == g.BK == g.K and g.BNP == g.BN == g.N)


def emit_blocked_gemm(w: Writer, g: Geometry, cfg: CpuConfig, dtype: str, prepared: bool) -> None:
    """The GEMM stage of ``lcmac_matmul`` (``prepared`` False: B packed chunk by chunk here)
    or of ``lcmac_matmul_prepared`` (True: B̃ read from the caller's ``Bp``, packed whole by
    Combine B)."""
    mr, nr = cfg.mr, cfg.nr
    bands, groups = _bands(g, cfg), _groups(g, cfg)
    nic = _band_blocks(g, cfg)
    per = -(-g.nnc // groups)       # column blocks per group
    jrs, irs = g.NC // nr, g.MC // mr
    w(f"# GEMM stage, A and B packed per cache block in each task ({bands} row bands"
      + (f" × {groups} column groups)" if groups > 1 else ")"))
    w(f"for t in T.parallel({bands * groups}):")
    with w.indent():
        w(f"acc = T.decl_buffer(({mr}, {nr}), \"{dtype}\", scope=\"local\")")
        w(f"Ab = T.decl_buffer(({nic * g.MC * g.KC},), \"{dtype}\", align=64)")
        if not prepared:
            w(f"Bc = T.decl_buffer(({g.NC * g.KC},), \"{dtype}\", align=64)")
        w(f"tm = t % {bands}")
        if groups > 1:
            w(f"cg = t // {bands}")
        block_guard = nic * bands > g.nmc
        with w.block(f"for kc in range({g.nkc}):"):
            with w.block(f"for ic in range({nic}):"), _guard(w, block_guard, f"tm * {nic} + ic < {g.nmc}"):
                _emit_pack_a(w, g, cfg, f"(tm * {nic} + ic) * {g.MC}")
            with ExitStack() as tn_loop:
                if groups > 1:
                    tn_loop.enter_context(w.block(f"for tl in range({per}):"))
                    w(f"tn = cg * {per} + tl")
                    tn_loop.enter_context(_guard(w, per * groups > g.nnc, f"tn < {g.nnc}"))
                else:
                    tn_loop.enter_context(w.block(f"for tn in range({g.nnc}):"))
                if not prepared:
                    # row by row: each of B's kc rows is read as one nc-long run (a stream
                    # the prefetcher follows), one vector load and store per nr columns.  Panel
                    # by panel instead, the kc rows, 4 KB-aliased at square sizes, were
                    # fetched a line at a time (3-5 % of the 4096³ GEMM, docs/cpu.md)
                    with w.block(f"for k in range({g.KC}):"), w.block(f"for jr in range({jrs}):"), \
                            w.block(f"for u in T.vectorized({nr}):"):
                        w(f"Bc[(jr * {g.KC} + k) * {nr} + u] = B[kc * {g.KC} + k, tn * {g.NC} + jr * {nr} + u]")
                with w.block(f"for ic in range({nic}):"), _guard(w, block_guard, f"tm * {nic} + ic < {g.nmc}"), \
                        w.block(f"for jr in range({jrs}):"), w.block(f"for ir in range({irs}):"):
                    _emit_tile(w, g, cfg, dtype, f"(tm * {nic} + ic) * {g.MC}", prepared)


def _guard(w: Writer, needed: bool, cond: str):
    return w.block(f"if {cond}:") if needed else nullcontext()


def _emit_pack_a(w: Writer, g: Geometry, cfg: CpuConfig, row0: str) -> None:
    """Ab[ic][ir][k][v] = A[row0 + ir·mr + v, kc·KC + k] for block ic; rows past M are
    clamped (their products are computed and never stored: the row tail)."""
    mr = cfg.mr
    row = f"{row0} + ir * {mr} + v"
    if g.BMP > g.M:
        row = f"T.min({row}, {g.M - 1})"
    with w.block(f"for ir in range({g.MC // mr}):"), w.block(f"for k in range({g.KC}):"), \
            w.block(f"for v in T.vectorized({mr}):"):
        w(f"Ab[((ic * {g.MC // mr} + ir) * {g.KC} + k) * {mr} + v] = A[{row}, kc * {g.KC} + k]")


def _emit_tile(w: Writer, g: Geometry, cfg: CpuConfig, dtype: str, row0: str, prepared: bool) -> None:
    """One register tile: acc over the kc chunk, then C's tile written (first chunk) or
    accumulated (the others)."""
    mr, nr = cfg.mr, cfg.nr
    crow = f"{row0} + ir * {mr} + v"
    ccol = f"tn * {g.NC} + jr * {nr}"
    # rows clamped: a row tail's padded rows have no C row to fetch
    emit_zero_acc(w, mr, nr, dtype, f"C[T.min({crow}, {g.M - 1}), {ccol} + {{}}]")
    k = f"ko * {cfg.ku} + ki"
    a = f"Ab[((ic * {g.MC // mr} + ir) * {g.KC} + {k}) * {mr} + v]"
    if prepared:
        b = f"Bp[0, ((tn * {g.NC // nr} + jr) * {g.BKP} + kc * {g.KC} + {k}) * {nr} + u]"
    else:
        b = f"Bc[(jr * {g.KC} + {k}) * {nr} + u]"
    emit_fma_loop(w, cfg, g.KC, a, b)
    emit_chunk_store(w, cfg, g.nkc, f"C[{crow}, {ccol} + u]", 1, dtype, True,
                     row_guard=f"{crow} < {g.M}" if g.BMP > g.M else None)
