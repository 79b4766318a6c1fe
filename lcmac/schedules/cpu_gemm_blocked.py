"""The GEMM stage with its operands packed block by block inside the parallel tasks (the
GotoBLAS / BLIS loop order), for ``CpuConfig.bands`` > 0: the plain GEMM, and LCMAs with
their combination fused into the packing (BLIS-Strassen).

The default CPU path packs all of A and all of B in two passes before the GEMM stage (the
combine passes, which an LCMA needs anyway).  For a plain GEMM that order leaves the packed
panels in DRAM by the time the micro-kernel reads them.  Here a task owns a row band of C;
for each kc chunk it packs its band's rows of A once (``Ab``: the band's mc blocks one after
another, in L3), then for every column block a kc × nc chunk of B (``Bc``), and walks the
band's mc blocks, each of which the micro-kernel pulls into L2 and reuses for every nr
columns of the block.  Both are packed once per band (A: once in all; B: ``bands`` times):
with an mc × kc chunk of A packed per column block, A would be packed N / nc times, a
noticeable part of the run (docs/cpu.md).  The packed layouts are those of
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

An LCMA runs the same loops once per product r (a run-time loop; the packing and the
epilogue, whose coefficients differ, branched to per r): its band buffer holds Ã_r's rows
(Σ U_r·A blocks, each block's rows staged a cache line at a time), its chunk B̃_r's
(Σ V_r·B blocks), and its tiles go to the LCMA's epilogue (H fused into C, or H_r stored for
the Combine H pass).  A and B are then read once per product using a block instead of
combined once into whole Ã/B̃ that are written and read back.  Where the bands can share
B̃_r's chunks (``shares_b``), the products, kc chunks and column blocks run in turn outside
the parallel region, each chunk packed by all bands together (a slice of its kc rows each)
and then multiplied, so B is read once per product in all, not once per band:

    for r, kc, tn:
      for tm in parallel(bands): (tn == 0: pack Ã_r[band tm, kc chunk] → Ab[tm]); pack rows
                                 tm·kc/bands.. of B̃_r[kc chunk, tn block] → Bc
      for tm in parallel(bands): for ic: for jr: for ir: acc = Ab[tm][ic, ir] · Bc[jr]; epilogue

Only the shapes the fast path handles take it (``why_not``): whole tiles of columns and of
k (no zero padding of A or B); a row tail is allowed (A's rows are clamped when packed, C's
stores row-tested).  Others keep the packing passes.
"""
from __future__ import annotations

from contextlib import ExitStack, nullcontext

from lcmac.core.dtypes import ITEMSIZE
from lcmac.spec.cpu.config import CpuConfig
from lcmac.schedules.cpu_memory import emit_workspace
from lcmac.schedules.cpu_gemm import (
    Geometry, Writer, dispatch_per_product, emit_chunk_store, emit_fma_loop, emit_zero_acc,
    linear_expr, tile_loops, whole_chunk)


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


def workspace_bytes(g: Geometry, cfg: CpuConfig, dtype: str, R: int = 1, share_b: bool = True) -> int:
    """What the packed chunks of ``lcmac_matmul`` take: each task holds its band's rows of A ×
    kc and a kc × nc chunk of B, and with one task per thread all hold theirs at once (B's
    chunk once where the bands share it)."""
    band_rows = _band_blocks(g, cfg) * g.MC
    tasks = _bands(g, cfg) * _groups(g, cfg)
    b_chunks = 1 if share_b and shares_b(g, cfg, R, False) else tasks
    return ITEMSIZE[dtype] * g.KC * (tasks * band_rows + b_chunks * g.NC)


def why_not(g: Geometry, R: int, acc: str, dtype: str, special_kernel: bool) -> str | None:
    """Why this build keeps the packing passes instead (None: it packs per block): it needs
    fp32 FMAs on the operands' own type, C written directly, and no zero padding of A's or
    B's k or of B's columns (cpu_combine.needs_pad's cases other than a row tail)."""
    if acc != dtype or special_kernel:
        return f"{dtype} is packed in its own layout (fp32 or bf16 pairs), by the packing passes"
    if not g.direct_c:
        return "C goes through a workspace (its columns are not whole nr tiles, or its rows do not split evenly over the grid)"
    if g.BKP != g.BK or g.K != g.k * g.BK:
        return "k needs zero padding (the blocks' k is not whole ku steps, or does not split evenly over the grid)"
    if g.BNP != g.BN:
        return "B's columns need zero padding"
    return None


def row_block(g: Geometry, cfg: CpuConfig) -> str:
    """The index of the mc block of C rows the tile being computed lies in (inside the band's
    ``ic`` loop)."""
    return f"(tm * {_band_blocks(g, cfg)} + ic)"


# --- run-time extents (a piece kernel's: A's and C's rows ``rows``, A's columns and B's rows
# ``depth``, TIR variables) --------------------------------------------------------------
#
# The kernel is built for M × K (cache blocks, band buffers, loop extents) and runs any
# m ≤ M rows, a multiple of the grid's m: each block has m / grid rows, the bands split them
# evenly (whole mr tiles) at run time, and the mc blocks, mr tiles and rows past a band's end
# are skipped; and any depth ≤ K whose blocks are whole ``DEPTH_STEP`` steps: the k loops of
# the packing and of the micro-kernel run to it.

def block_rows(g: Geometry, rows: str | None) -> str:
    """A block's rows: BM, or the run-time count's share of them."""
    return str(g.BM) if rows is None else f"{rows} // {g.m}"


def _band_rows(g: Geometry, cfg: CpuConfig, rows: str) -> str:
    """Rows a band owns with ``rows`` rows at run time: the block's, split evenly in mr tiles."""
    step = _bands(g, cfg) * cfg.mr
    return f"(({block_rows(g, rows)} + {step - 1}) // {step} * {cfg.mr})"


def row_origin(g: Geometry, cfg: CpuConfig, rows: str | None) -> str:
    """The first row (in its block) of the band's mc block ``ic``."""
    if rows is None:
        return f"{row_block(g, cfg)} * {g.MC}"
    return f"tm * {_band_rows(g, cfg, rows)} + ic * {g.MC}"


def chunk_depth(g: Geometry, depth: str | None) -> int | str:
    """The k of the current kc chunk: KC, or with a run-time depth (K, a TIR variable; each
    block's share a multiple of KC's chunk of staging and of ku) what is left of it."""
    return g.KC if depth is None else f"T.min({g.KC}, {depth} // {g.k} - kc * {g.KC})"


def _k_offset(g: Geometry, block: int, k: str, depth: str | None) -> str:
    """A's column (or B's row) ``k`` of block column ``block``."""
    if depth is None:
        return _offset(block * g.BK, k)
    return f"{block} * ({depth} // {g.k}) + {k}" if block else k


#: with a run-time depth, the k a chunk holds is a multiple of this (and of ku): what the
#: staged packing copies at a time
DEPTH_STEP = 8


def staged_chunk(g: Geometry, depth: str | None) -> int:
    """The k the staged packing of A copies at a time (``_emit_pack_a_staged``)."""
    return whole_chunk(g.KC) if depth is None else min(whole_chunk(g.KC), DEPTH_STEP)


def _count(extent: int | str, step: int) -> int | str:
    return extent // step if isinstance(extent, int) else f"({extent}) // {step}"


def rows_guard(g: Geometry, cfg: CpuConfig, rows: str, offset: str) -> str:
    """The condition that the row ``offset`` past the band's mc block ``ic`` is the band's
    and the block's, with ``rows`` rows at run time."""
    return (f"ic * {g.MC} + {offset} < {_band_rows(g, cfg, rows)} and "
            f"{row_origin(g, cfg, rows)} + {offset} < {block_rows(g, rows)}")


def emit_blocked_gemm(w: Writer, g: Geometry, cfg: CpuConfig, dtype: str, prepared: bool,
                      programs=None, epilogue=None, prefetch=None, overwrite: str | None = None,
                      share_b: bool = True, rows: str | None = None, depth: str | None = None) -> None:
    """The GEMM stage of ``lcmac_matmul`` (``prepared`` False: B packed chunk by chunk here)
    or of ``lcmac_matmul_prepared`` (True: B̃ read from the caller's ``Bp``, packed whole by
    Combine B).  A plain GEMM writes C itself; an LCMA (``programs``: its naive Combine A and
    B programs, each output a sum of blocks) packs Ã_r = Σ U_r·A blocks and B̃_r = Σ V_r·B
    blocks chunk by chunk (the combination fused into the packing, as in BLIS-Strassen), its
    products in turn, each tile through ``epilogue(w, r)`` (with ``prefetch`` as
    ``emit_zero_acc`` takes it).  The sums are the programs' terms in their order, so a B̃
    that Combine B packs with the same program has the same bits.  ``overwrite``: the plain
    GEMM's run-time condition for writing C rather than adding into it (``emit_chunk_store``).
    ``share_b`` False: one chunk of B per band even where the bands could share it
    (``shares_b``), so the stage is one parallel region (a piece kernel: many short calls, where
    each region's start and barrier cost more than packing B twice).  ``rows``: the run-time
    row count's variable (``row_origin``), ``depth`` the run-time K's (``chunk_depth``); both
    only without ``share_b``."""
    mr, nr = cfg.mr, cfg.nr
    R = programs["A"].n_outputs if programs is not None else 1
    bands, groups = _bands(g, cfg), _groups(g, cfg)
    if share_b and shares_b(g, cfg, R, prepared):
        assert rows is None and depth is None, "run-time extents are for the one-region stage"
        _emit_shared_b_stage(w, g, cfg, dtype, programs, epilogue, prefetch, R)
        return
    nic = _band_blocks(g, cfg)
    per = -(-g.nnc // groups)       # column blocks per group
    jrs, irs = g.NC // nr, g.MC // mr
    w(f"# GEMM stage, A and B packed per cache block in each task ({bands} row bands"
      + (f" × {groups} column groups)" if groups > 1 else ")")
      + (f", combined as packed: {R} products in turn, H " + ("fused" if cfg.fused else "stored")
         if R > 1 else ""))
    w(f"for t in T.parallel({bands * groups}):")
    with w.indent():
        w(f"acc = T.decl_buffer(({mr}, {nr}), \"{dtype}\", scope=\"local\")")
        emit_workspace(w, "Ab", (nic * g.MC * g.KC,), dtype, align=64, per_task=True)
        if not prepared:
            emit_workspace(w, "Bc", (g.NC * g.KC,), dtype, align=64, per_task=True)
        if R > 1:
            most = max(len(t) for t in programs["A"].outputs)
            w(f"At = T.decl_buffer(({most}, {mr}, {staged_chunk(g, depth)}), \"{dtype}\", scope=\"local\")")
        w(f"tm = t % {bands}")
        if groups > 1:
            w(f"cg = t // {bands}")
        block_guard = nic * bands > g.nmc
        # which mc blocks (and with run-time rows which mr tiles) the band computes
        ic_cond = f"tm * {nic} + ic < {g.nmc}" if rows is None else rows_guard(g, cfg, rows, "0")
        ic_guarded = block_guard or rows is not None
        with ExitStack() as r_loop:
            if R > 1:
                # one copy of the micro-kernel for all products (a run-time r loop); the
                # packing and the epilogue, whose coefficients differ, per r
                r_loop.enter_context(w.block(f"for r in range({R}):"))
            per_r = (lambda emit: dispatch_per_product(w, 0, R, emit)) if R > 1 else (lambda emit: emit(w, 0))
            with w.block(f"for kc in range({g.nkc}):"), \
                    _guard(w, depth is not None and g.nkc > 1, f"kc * {g.KC} < {depth} // {g.k}"):
                def pack_a(w, r):
                    with w.block(f"for ic in range({nic}):"), _guard(w, ic_guarded, ic_cond):
                        (_emit_pack_a_staged if R > 1 else _emit_pack_a)(
                            w, g, cfg, row_origin(g, cfg, rows), _terms(programs, "A", r, g.k), dtype,
                            rows=rows, depth=depth)
                per_r(pack_a)
                with ExitStack() as tn_loop:
                    if groups > 1:
                        tn_loop.enter_context(w.block(f"for tl in range({per}):"))
                        w(f"tn = cg * {per} + tl")
                        tn_loop.enter_context(_guard(w, per * groups > g.nnc, f"tn < {g.nnc}"))
                    else:
                        tn_loop.enter_context(w.block(f"for tn in range({g.nnc}):"))
                    if not prepared:
                        per_r(lambda w, r: _emit_pack_b(w, g, cfg, _terms(programs, "B", r, g.n), dtype,
                                                        depth=depth))
                    with w.block(f"for ic in range({nic}):"), _guard(w, ic_guarded, ic_cond), \
                            tile_loops(w, cfg, jrs, irs), \
                            _guard(w, rows is not None, rows_guard(g, cfg, rows, f"ir * {mr}")):
                        if R > 1:
                            _emit_products_tile(w, g, cfg, dtype, prepared, epilogue, prefetch, R, depth=depth)
                        else:
                            _emit_tile(w, g, cfg, dtype, row_origin(g, cfg, rows), prepared, overwrite, rows, depth)


def shares_b(g: Geometry, cfg: CpuConfig, R: int, prepared: bool) -> bool:
    """Whether the bands pack each chunk of B̃_r together (``_emit_shared_b_stage``): an LCMA
    with B packed here, one column group and several bands whose kc rows split evenly.  Each
    band packing all of B̃_r is bound by what one core can fetch, so sharing the packing is
    faster for the LCMAs (docs/cpu.md).  The plain GEMM keeps a B chunk per band: its packing
    is a small part of its run."""
    return R > 1 and not prepared and _groups(g, cfg) == 1 and _bands(g, cfg) > 1 and g.KC % _bands(g, cfg) == 0


def _emit_shared_b_stage(w: Writer, g: Geometry, cfg: CpuConfig, dtype: str, programs, epilogue, prefetch,
                         R: int) -> None:
    """The LCMA's GEMM stage with each chunk of B̃_r packed once by all bands together (a kc/bands
    slice of its rows each) into one buffer, instead of once per band: the products, kc chunks
    and column blocks run in turn, each as two parallel regions (pack, then the tiles), so the
    tiles start only once the whole chunk is packed.  Each band's rows of Ã_r are packed in the
    first region of a chunk's first column block into that band's part of ``Ab``."""
    mr = cfg.mr
    bands, nic = _bands(g, cfg), _band_blocks(g, cfg)
    band_elems = nic * g.MC * g.KC
    ab0 = f"tm * {band_elems} + "       # band tm's part of Ab
    jrs, irs = g.NC // cfg.nr, g.MC // mr
    block_guard = nic * bands > g.nmc
    slice_rows = g.KC // bands
    w(f"# GEMM stage, {R} products in turn, each chunk of B̃_r packed by the {bands} bands together, "
      f"Ã_r per band, H " + ("fused" if cfg.fused else "stored"))
    emit_workspace(w, "Ab", (bands * band_elems,), dtype, align=64)
    emit_workspace(w, "Bc", (g.NC * g.KC,), dtype, align=64)
    most = max(len(t) for t in programs["A"].outputs)
    with w.block(f"for r in range({R}):"), w.block(f"for kc in range({g.nkc}):"), \
            w.block(f"for tn in range({g.nnc}):"):
        with w.block(f"for tm in T.parallel({bands}):"):
            w(f"At = T.decl_buffer(({most}, {mr}, {whole_chunk(g.KC)}), \"{dtype}\", scope=\"local\")")
            def pack_a(w, r):
                with w.block(f"for ic in range({nic}):"), _guard(w, block_guard, f"tm * {nic} + ic < {g.nmc}"):
                    _emit_pack_a_staged(w, g, cfg, f"(tm * {nic} + ic) * {g.MC}", _terms(programs, "A", r, g.k),
                                        dtype, ab0)
            with w.block("if tn == 0:"):
                dispatch_per_product(w, 0, R, pack_a)
            dispatch_per_product(w, 0, R, lambda w, r: _emit_pack_b(
                w, g, cfg, _terms(programs, "B", r, g.n), dtype, (f"tm * {slice_rows}", slice_rows)))
        with w.block(f"for tm in T.parallel({bands}):"):
            w(f"acc = T.decl_buffer(({mr}, {cfg.nr}), \"{dtype}\", scope=\"local\")")
            with w.block(f"for ic in range({nic}):"), _guard(w, block_guard, f"tm * {nic} + ic < {g.nmc}"), \
                    tile_loops(w, cfg, jrs, irs):
                _emit_products_tile(w, g, cfg, dtype, False, epilogue, prefetch, R, ab0)


def _terms(programs, side: str, r: int, width: int) -> list:
    """(coefficient, (block row, block col)) of product r's sum of A (``side`` "A", blocks
    m × k) or B ("B", k × n) blocks, from the naive program's output r (inputs numbered row by
    row, ``width`` blocks a row); the plain GEMM's one block."""
    if programs is None:
        return [(1, (0, 0))]
    return [(c, divmod(s, width)) for c, s in programs[side].outputs[r]]


def _offset(base: int, index: str) -> str:
    return f"{base} + {index}" if base else index


def _guard(w: Writer, needed: bool, cond: str):
    return w.block(f"if {cond}:") if needed else nullcontext()


def _emit_pack_a(w: Writer, g: Geometry, cfg: CpuConfig, row0: str, terms, dtype: str,
                 rows: str | None = None, depth: str | None = None) -> None:
    """Ab[ic][ir][k][v] = Σ c · A[block rows + row0 + ir·mr + v, block cols + kc·KC + k] for
    block ic (``terms``: ``_terms``); rows past a block's are clamped (their products are
    computed and never stored: a row tail, ``Geometry.row_tail``)."""
    mr = cfg.mr
    row = _packed_row(g, cfg, row0, rows)
    col = f"kc * {g.KC} + k"
    value = linear_expr(terms, lambda blk: f"A[{_row_offset(g, blk[0], row, rows)}, {_k_offset(g, blk[1], col, depth)}]",
                        dtype)
    with w.block(f"for ir in range({g.MC // mr}):"), \
            _guard(w, rows is not None, rows_guard(g, cfg, rows, f"ir * {mr}")), \
            w.block(f"for k in range({chunk_depth(g, depth)}):"), \
            w.block(f"for v in T.vectorized({mr}):"):
        w(f"Ab[((ic * {g.MC // mr} + ir) * {g.KC} + k) * {mr} + v] = {value}")


def _emit_pack_a_staged(w: Writer, g: Geometry, cfg: CpuConfig, row0: str, terms, dtype: str,
                        ab0: str = "", rows: str | None = None, depth: str | None = None) -> None:
    """``_emit_pack_a`` for a sum of blocks: read column by column, the mr rows of every
    block summed (at square power-of-two sizes 4 KB-aliased) share one L1 set, so each row's
    next kt columns (a cache line) are first copied into the local ``At``, and the sum is
    taken from there (as cpu_combine's Combine A does)."""
    mr = cfg.mr
    kt = staged_chunk(g, depth)
    row = _packed_row(g, cfg, row0, rows)
    col = f"kc * {g.KC} + ko * {kt} + u"
    with w.block(f"for ir in range({g.MC // mr}):"), \
            _guard(w, rows is not None, rows_guard(g, cfg, rows, f"ir * {mr}")), \
            w.block(f"for ko in range({_count(chunk_depth(g, depth), kt)}):"):
        for n, (_, blk) in enumerate(terms):
            with w.block(f"for v in range({mr}):"), w.block(f"for u in T.vectorized({kt}):"):
                w(f"At[{n}, v, u] = A[{_row_offset(g, blk[0], row, rows)}, {_k_offset(g, blk[1], col, depth)}]")
        value = linear_expr([(c, n) for n, (c, _) in enumerate(terms)], lambda n: f"At[{n}, v, ki]", dtype)
        with w.block(f"for ki in range({kt}):"), w.block(f"for v in T.vectorized({mr}):"):
            w(f"Ab[{ab0}((ic * {g.MC // mr} + ir) * {g.KC} + ko * {kt} + ki) * {mr} + v] = {value}")


def _packed_row(g: Geometry, cfg: CpuConfig, row0: str, rows: str | None = None) -> str:
    """Row v of micro-panel ir from ``row0`` within a block, clamped to the block's last row
    in a row tail (those rows' products are computed and never stored)."""
    row = f"{row0} + ir * {cfg.mr} + v"
    if rows is not None:
        return f"T.min({row}, {block_rows(g, rows)} - 1)"
    return f"T.min({row}, {g.BM - 1})" if g.BMP > g.BM else row


def _row_offset(g: Geometry, block: int, row: str, rows: str | None) -> str:
    """A's (or C's) row ``row`` of block row ``block``."""
    if rows is None:
        return _offset(block * g.BM, row)
    return f"{block} * ({block_rows(g, rows)}) + {row}" if block else row


def _emit_pack_b(w: Writer, g: Geometry, cfg: CpuConfig, terms, dtype: str, rows=None,
                 depth: str | None = None) -> None:
    """Bc[jr][k][u] = Σ c · B[block rows + kc·KC + k, block cols + tn·NC + jr·nr + u]: row by
    row, each of B's kc rows read as one nc-long run (a stream the prefetcher follows), one
    vector load and store per nr columns.  Panel by panel instead, the kc rows, 4 KB-aliased
    at square sizes, were fetched a line at a time (docs/cpu.md)."""
    nr = cfg.nr
    row, col = f"kc * {g.KC} + k", f"tn * {g.NC} + jr * {nr} + u"
    value = linear_expr(terms, lambda blk: f"B[{_k_offset(g, blk[0], row, depth)}, {_offset(blk[1] * g.BN, col)}]",
                        dtype)
    k_loop = f"for k in range({chunk_depth(g, depth)}):" if rows is None else \
        f"for k in range({rows[0]}, {rows[0]} + {rows[1]}):"
    with w.block(k_loop), w.block(f"for jr in range({g.NC // nr}):"), \
            w.block(f"for u in T.vectorized({nr}):"):
        w(f"Bc[(jr * {g.KC} + k) * {nr} + u] = {value}")


def _emit_products_tile(w: Writer, g: Geometry, cfg: CpuConfig, dtype: str, prepared: bool,
                        epilogue, prefetch, R: int, ab0: str = "", depth: str | None = None) -> None:
    """One register tile of product r over the kc chunk, then its epilogue (per r)."""
    mr, nr = cfg.mr, cfg.nr
    emit_zero_acc(w, mr, nr, dtype, prefetch)
    w(f"# product r's tile: Ab (band of Ã_r) x {'B̃p_r' if prepared else 'Bc (chunk of B̃_r)'}")
    _emit_fmas(w, g, cfg, prepared, "r", ab0, depth)
    dispatch_per_product(w, 0, R, epilogue)


def _emit_fmas(w: Writer, g: Geometry, cfg: CpuConfig, prepared: bool, product: str, ab0: str = "",
               depth: str | None = None) -> None:
    """acc += the band buffer's tile rows · the B chunk's (or prepared B̃p's) tile columns."""
    mr, nr = cfg.mr, cfg.nr
    k = f"ko * {cfg.ku} + ki"
    a = f"Ab[{ab0}((ic * {g.MC // mr} + ir) * {g.KC} + {k}) * {mr} + v]"
    if prepared:
        b = f"Bp[{product}, ((tn * {g.NC // nr} + jr) * {g.BKP} + kc * {g.KC} + {k}) * {nr} + u]"
    else:
        b = f"Bc[(jr * {g.KC} + {k}) * {nr} + u]"
    emit_fma_loop(w, cfg, chunk_depth(g, depth), a, b)


def _emit_tile(w: Writer, g: Geometry, cfg: CpuConfig, dtype: str, row0: str, prepared: bool,
               overwrite: str | None = None, rows: str | None = None, depth: str | None = None) -> None:
    """One register tile: acc over the kc chunk, then C's tile written (first chunk) or
    accumulated (the others)."""
    mr, nr = cfg.mr, cfg.nr
    crow = f"{row0} + ir * {mr} + v"
    ccol = f"tn * {g.NC} + jr * {nr}"
    # rows clamped: a row tail's padded rows have no C row to fetch
    last = g.M - 1 if rows is None else f"{rows} - 1"
    emit_zero_acc(w, mr, nr, dtype, f"C[T.min({crow}, {last}), {ccol} + {{}}]")
    _emit_fmas(w, g, cfg, prepared, "0", depth=depth)
    guard = rows_guard(g, cfg, rows, f"ir * {mr} + v") if rows is not None else \
        f"{crow} < {g.M}" if g.BMP > g.M else None
    emit_chunk_store(w, cfg, g.nkc, f"C[{crow}, {ccol} + u]", 1, dtype, True, row_guard=guard,
                     overwrite=overwrite)
