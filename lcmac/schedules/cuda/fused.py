"""The fused GEMM + Combine-H templates (FalconGEMM's group-parallel kernel).

A CTA owns a tile position (x, y) of every C_ij; for r in a fixed order it computes the H_r
tile (fp32 accumulators, pipelined K loop) and adds W[r,i,j]·H_r into every C_ij tile at
(x, y).  C_ij tiles belong to that CTA alone (no atomics); the first contribution writes,
later ones read-modify-write in a fixed order (deterministic).

    fused_gemm_h      the grid form (one CTA per tile position) or, with a PersistentPlan,
                      the persistent form: P CTAs walk whole groups, then pieces of the last
                      partial round (split-group); non-lead pieces accumulate into fp32
                      workspace slots of their own
    split_fixup       adds those slots into C in CTA order, after the persistent kernel
    reduce_gemm_h     the epilogue on the TMA engine (``CudaConfig.tma_reduce``)
"""
# (no `from __future__ import annotations`: TileLang evaluates the Tensor annotations)

import tilelang.language as T
from tilelang.cuda.language import pdl_sync

from lcmac.schedules.cuda.common import (
    ACCUM, GemmTile, all_of, emit_names, extents, known, raster, scaled, tile_count, unrolled, uses_pdl)
from lcmac.spec.cuda.blocking import Blocking
from lcmac.spec.cuda.config import CudaConfig
from lcmac.spec.cuda.order import combine_h_steps, first_in_piece, r_order, reduce_groups
from lcmac.spec.cuda.persistent import PersistentPlan


def _select(values, s):
    """values[s] for a run-time s, as a chain of selects with literal values."""
    if isinstance(s, int):
        return values[s]
    if values == list(range(len(values))):
        return s
    e = values[-1]
    for idx in range(len(values) - 2, -1, -1):
        e = T.if_then_else(s == idx, values[idx], e)
    return e


def _column_panels(u, gx: int, gy: int, panel: int):
    """Tile position (row, col) of linear index u >= 0: panels of ``panel`` columns (panel
    divides gx), each walked row by row, so the tiles running together share few A rows and
    few B columns.  Simpler than ``common.raster`` (no serpentine, no short last panel):
    TileLang takes minutes to lower its selects where the run-time epilogue repeats them."""
    div, mod = T.truncdiv, T.truncmod
    within = mod(u, panel * gy)
    return div(within, panel), div(u, panel * gy) * panel + mod(within, panel)


def _first_in_piece(s0: int, prev: int, st, R: int):
    """config.first_in_piece; a run-time test when the walk's start st is a variable."""
    if isinstance(st, int):
        return first_in_piece(s0, prev, st, R)
    return (s0 - st + R) % R <= (prev - st + R) % R


class _FusedShape:
    """Static facts shared by the fused GEMM + Combine-H kernels and the split-group fixup."""

    def __init__(self, alg, blk: Blocking, dtype: str, cfg: CudaConfig):
        self.tile = GemmTile.of(cfg, dtype)
        self.block_m, self.block_n, self.block_k = self.tile.block_m, self.tile.block_n, self.tile.block_k
        self.M, self.N, self.R = blk.M, blk.N, blk.R
        self.Mb, self.Nb, self.Kb = blk.Mb, blk.Nb, blk.Kb
        self.m, self.n = alg.m, alg.n
        self.order = r_order(alg.W, cfg.r_order)
        # steps[s] = [(i, j, w, first from step 0, previous step into C_ij)];
        # next_step[(i, j)][s]: steps from s to the next one into C_ij (config.combine_h_steps)
        self.steps, self.next_step = combine_h_steps(alg.W, self.order)
        self.num_k = tile_count(self.Kb, self.block_k)
        # a run-time Mb (Nb) is a multiple of row_tile (col_tile): rows.py
        row_tile, col_tile = getattr(blk, "row_tile", 0), getattr(blk, "col_tile", 0)
        self.full_m = known(self.Mb % self.block_m == 0) or (row_tile > 0 and row_tile % self.block_m == 0)
        self.full_n = known(self.Nb % self.block_n == 0) or (col_tile > 0 and col_tile % self.block_n == 0)
        self.rows_ok = [known((i + 1) * self.Mb <= self.M) for i in range(alg.m)]
        self.cols_ok = [known((j + 1) * self.Nb <= self.N) for j in range(alg.n)]

    def conds(self, i, j, row, col):
        """Masks of one C_ij element (only those the shape needs)."""
        c = []
        if not self.full_m:
            c.append(row < self.Mb)
        if not self.full_n:
            c.append(col < self.Nb)
        if not self.rows_ok[i]:
            c.append(i * self.Mb + row < self.M)
        if not self.cols_ok[j]:
            c.append(j * self.Nb + col < self.N)
        return c


@T.macro
def _load_slabs(At, Bt, A_shared, B_shared, r, by, bx, ko, tile: GemmTile):
    """The ko-th K slabs of Ã_r (tile row by) and B̃_r (tile column bx) into shared memory."""
    T.copy(At[r, by * tile.block_m:(by + 1) * tile.block_m, ko * tile.block_k:(ko + 1) * tile.block_k],
           A_shared)
    T.copy(Bt[r, ko * tile.block_k:(ko + 1) * tile.block_k, bx * tile.block_n:(bx + 1) * tile.block_n],
           B_shared)


@T.macro
def _product_tile(At, Bt, A_shared, B_shared, H_local, r, by, bx, num_k, tile: GemmTile):
    """H_r's tile at (by, bx) in one pipelined K loop of its own."""
    T.clear(H_local)
    for ko in T.Pipelined(num_k, num_stages=tile.num_stages):
        _load_slabs(At, Bt, A_shared, B_shared, r, by, bx, ko, tile)
        T.gemm(A_shared, B_shared, H_local, policy=tile.policy)


def _register_epilogue(fs: _FusedShape, out_dtype):
    """The Combine-H epilogue from registers, shared by the grid and persistent forms:
    ``c_update`` adds one contribution w·H into a C_ij tile, ``c_epilogue`` all of a step's
    (a run-time step: one branch per step), ``ws_epilogue`` those of a non-lead piece into its
    workspace slot."""
    block_m, block_n, R, Mb, Nb = fs.block_m, fs.block_n, fs.R, fs.Mb, fs.Nb

    @T.macro
    def c_update(C, H_local, by, bx, item, first):
        # C_ij tile += w·H; `first` (a Python bool): the tile's first contribution in this
        # CTA's walk writes instead (C holds the partial sums, in a fixed order)
        i, j = item[0], item[1]
        for x, y in T.Parallel(block_m, block_n):
            row = by * block_m + x
            col = bx * block_n + y
            conds = fs.conds(i, j, row, col)
            if first:
                val = scaled(item[2], H_local[x, y])
            else:
                val = T.cast(C[i * Mb + row, j * Nb + col], ACCUM) + scaled(item[2], H_local[x, y])
            if conds:
                if all_of(conds):
                    C[i * Mb + row, j * Nb + col] = T.cast(val, out_dtype)
            else:
                C[i * Mb + row, j * Nb + col] = T.cast(val, out_dtype)

    @T.macro
    def c_epilogue(C, H_local, by, bx, sv, st):
        # the Combine-H contributions of step sv[0] (run time) for a walk that started at st
        # (sv: a 1-tuple, so the macro binds no new name for the loop variable)
        for s0 in unrolled(R):
            if sv[0] == s0:
                for item in fs.steps[s0]:
                    first = item[3] if isinstance(st, int) and st == 0 else \
                        _first_in_piece(s0, item[4], st, R)
                    if isinstance(first, bool):
                        c_update(C, H_local, by, bx, item, first)
                    elif first:
                        c_update(C, H_local, by, bx, item, True)
                    else:
                        c_update(C, H_local, by, bx, item, False)

    @T.macro
    def ws_epilogue(Ps, H_local, slot, sv, st):
        # a non-lead piece of a split group accumulates its own fp32 partial of C_ij (whole
        # tiles, no masks); its first contribution writes: the select's lazy load (a C
        # ternary) never reads the slot's stale value, and one loop instead of two keeps
        # the kernel's compile time down
        for s0 in unrolled(R):
            if sv[0] == s0:
                for item in fs.steps[s0]:
                    first = _first_in_piece(s0, item[4], st, R)
                    for x, y in T.Parallel(block_m, block_n):
                        Ps[slot, item[0] * fs.n + item[1], x, y] = T.if_then_else(
                            first, T.float32(0), Ps[slot, item[0] * fs.n + item[1], x, y]) \
                            + scaled(item[2], H_local[x, y])

    return c_update, c_epilogue, ws_epilogue


def fused_gemm_h(alg, blk: Blocking, dtype: str, cfg: CudaConfig, plan: PersistentPlan | None = None,
                 arch: str = "sm_90a"):
    """GEMM + Combine-H.  ``plan`` None: one CTA per tile position (grid gx × gy); a
    ``PersistentPlan``: the persistent split-group kernel (grid P; see config)."""
    fs = _FusedShape(alg, blk, dtype, cfg)
    if plan is None:
        return _fused_grid(fs, dtype, cfg, arch)
    return _fused_persistent(fs, dtype, cfg, plan, arch)


def _fused_grid(fs: _FusedShape, dtype: str, cfg: CudaConfig, arch: str):
    """The grid form of ``fused_gemm_h``: CTA (bx, by) walks the R products of its tile
    position, each in a pipeline of its own or (``overlap_epilogue``) all in one."""
    pdl = uses_pdl(arch)
    tile = fs.tile
    block_m, block_n, block_k, num_k = fs.block_m, fs.block_n, fs.block_k, fs.num_k
    M, N, R, Mb, Nb, Kb = fs.M, fs.N, fs.R, fs.Mb, fs.Nb, fs.Kb
    order, flat, cache_aware = fs.order, cfg.overlap_epilogue, cfg.cache_aware
    c_update, c_epilogue, _ = _register_epilogue(fs, dtype)

    @T.prim_func
    def lcmac_fused(At: T.Tensor(extents(R, Mb, Kb), dtype), Bt: T.Tensor(extents(R, Kb, Nb), dtype),
                    C: T.Tensor(extents(M, N), dtype)):
        with T.Kernel(T.ceildiv(Nb, block_n), T.ceildiv(Mb, block_m), threads=cfg.threads) as (bx, by):
            if pdl:
                pdl_sync()
            A_shared = T.alloc_shared((block_m, block_k), dtype)
            B_shared = T.alloc_shared((block_k, block_n), dtype)
            H_local = T.alloc_fragment((block_m, block_n), ACCUM)
            emit_names(A_s=A_shared, B_s=B_shared, H=H_local)
            T.use_swizzle(panel_size=max(cfg.swizzle, 1), enable=cfg.swizzle > 0)
            # cache-aware: every CTA walks the products from step 0; the ablation starts
            # at step (bx + by) mod R, so CTAs launched together read different Ã_r, B̃_r
            st = 0 if cache_aware else (bx + by) % R
            if flat:
                # one software pipeline over all (step, k): the TMA producer prefetches
                # the next product while the consumers run the epilogue
                for it in T.Pipelined(R * num_k, num_stages=cfg.stages):
                    # a run-time K (it >= 0): C's division, not floor division's sign handling
                    q, ko = (it // num_k, it % num_k) if isinstance(num_k, int) else \
                        (T.truncdiv(it, num_k), T.truncmod(it, num_k))
                    s = q if cache_aware else (q + st) % R
                    r = _select(order, s)
                    _load_slabs(At, Bt, A_shared, B_shared, r, by, bx, ko, tile)
                    T.gemm(A_shared, B_shared, H_local, policy=tile.policy, clear_accum=ko == 0)
                    if cache_aware:
                        for s0 in unrolled(R):
                            if it == s0 * num_k + num_k - 1:
                                for item in fs.steps[s0]:
                                    c_update(C, H_local, by, bx, item, item[3])
                    elif ko == num_k - 1:
                        c_epilogue(C, H_local, by, bx, (s,), st)
            elif cache_aware:
                for s in T.serial(R):
                    r = _select(order, s)
                    _product_tile(At, Bt, A_shared, B_shared, H_local, r, by, bx,
                                  T.ceildiv(Kb, block_k), tile)
                    c_epilogue(C, H_local, by, bx, (s,), st)
            else:
                for j in T.serial(R):
                    s = (j + st) % R
                    r = _select(order, s)
                    _product_tile(At, Bt, A_shared, B_shared, H_local, r, by, bx,
                                  T.ceildiv(Kb, block_k), tile)
                    c_epilogue(C, H_local, by, bx, (s,), st)

    return lcmac_fused


def _persistent_steps(plan: PersistentPlan, R: int):
    """(step_of, n_steps) of the persistent form: ``step_of(pid, q)`` = (group, step within
    the group's walk, position in the tail list or -1 in the whole rounds; None without a
    tail) of CTA pid's q-th step, ``n_steps(pid)`` its number of steps."""
    P, Lt, TS = plan.P, plan.Lt, plan.tail_steps
    n_main = plan.rounds * R            # whole-group steps of every CTA
    first_tail = plan.rounds * P        # first tail group

    def step_of(pid, q):
        if plan.rem == 0:
            return (q // R) * P + pid, q % R, None
        tq = pid * Lt + q - n_main
        if n_main == 0:
            return first_tail + tq // R, tq % R, tq
        in_tail = q >= n_main
        g = T.if_then_else(in_tail, first_tail + tq // R, (q // R) * P + pid)
        jw = T.if_then_else(in_tail, tq % R, q % R)
        # -1 in the rounds: pid·Lt + q − n_main is >= 0 there too once pid·Lt >= n_main − q
        return g, jw, T.if_then_else(in_tail, tq, -1)

    def n_steps(pid):
        if plan.rem == 0:
            return n_main
        return n_main + T.max(T.min(TS - pid * Lt, Lt), 0)

    return step_of, n_steps


def _fused_persistent(fs: _FusedShape, dtype: str, cfg: CudaConfig, plan: PersistentPlan, arch: str):
    """The persistent (split-group) form of ``fused_gemm_h``: P CTAs, CTA pid running the
    steps ``_persistent_steps`` gives it; a non-lead piece of a split tail group adds into
    its workspace slot Ps[pid] instead of C (``split_fixup`` adds the slots into C)."""
    pdl = uses_pdl(arch)
    tile = fs.tile
    block_m, block_n, block_k, num_k = fs.block_m, fs.block_n, fs.block_k, fs.num_k
    M, N, R, Mb, Nb, Kb = fs.M, fs.N, fs.R, fs.Mb, fs.Nb, fs.Kb
    order, flat, cache_aware = fs.order, cfg.overlap_epilogue, cfg.cache_aware
    _, c_epilogue, ws_epilogue = _register_epilogue(fs, dtype)
    P, gx, gy, Lt = plan.P, plan.gx, plan.gy, plan.Lt
    n_main = plan.rounds * R
    slots = max(plan.slots, 1)
    step_of, n_steps = _persistent_steps(plan, R)

    @T.macro
    def epilogue(C, Ps, H_local, pid, by, bx, g, tq, s):
        rot = 0 if cache_aware else g % R
        if plan.split:
            # the CTA's tail chunk starts inside group g: a non-lead piece (workspace slot pid)
            in_ws = T.And(tq >= 0, pid * Lt > (tq // R) * R) if n_main else pid * Lt > (tq // R) * R
            # (tq: -1 in the whole rounds, see step_of)
            if in_ws:
                ws_epilogue(Ps, H_local, pid, (s,), (pid * Lt - (tq // R) * R + rot) % R)
            else:
                c_epilogue(C, H_local, by, bx, (s,), rot)
        else:
            c_epilogue(C, H_local, by, bx, (s,), rot)

    @T.prim_func
    def lcmac_fused_persistent(At: T.Tensor(extents(R, Mb, Kb), dtype),
                               Bt: T.Tensor(extents(R, Kb, Nb), dtype), C: T.Tensor(extents(M, N), dtype),
                               Ps: T.Tensor(extents(slots, fs.m * fs.n, block_m, block_n), ACCUM)):
        with T.Kernel(P, threads=cfg.threads) as pid:
            A_shared = T.alloc_shared((block_m, block_k), dtype)
            B_shared = T.alloc_shared((block_k, block_n), dtype)
            H_local = T.alloc_fragment((block_m, block_n), ACCUM)
            emit_names(A_s=A_shared, B_s=B_shared, H=H_local)
            if pdl:
                pdl_sync()
            # the step's indices live in scalar registers: the same values inlined into every
            # address and epilogue mask made TileLang's passes several times slower
            gv = T.alloc_var(T.int32)
            tv = T.alloc_var(T.int32)
            sv = T.alloc_var(T.int32)
            rv = T.alloc_var(T.int32)
            yv = T.alloc_var(T.int32)
            xv = T.alloc_var(T.int32)
            if flat:
                for it in T.Pipelined(n_steps(pid) * num_k, num_stages=cfg.stages):
                    # the TMA producer's addresses stay expressions of `it`: stores to the
                    # scalar variables land in the consumer branch only (warp specialisation)
                    ko = it % num_k
                    g, jw, tq = step_of(pid, it // num_k)
                    s = jw if cache_aware else (jw + g) % R
                    r = _select(order, s)
                    by, bx = raster(g, gx, gy, cfg.swizzle)
                    _load_slabs(At, Bt, A_shared, B_shared, r, by, bx, ko, tile)
                    T.gemm(A_shared, B_shared, H_local, policy=tile.policy, clear_accum=ko == 0)
                    if ko == num_k - 1:
                        gv = g
                        tv = 0 if tq is None else tq
                        sv = s
                        yv = by
                        xv = bx
                        epilogue(C, Ps, H_local, pid, yv, xv, gv, tv, sv)
            else:
                for q in T.serial(n_steps(pid)):
                    g, jw, tq = step_of(pid, q)
                    gv = g
                    tv = 0 if tq is None else tq
                    sv = jw if cache_aware else (jw + gv) % R
                    rv = _select(order, sv)
                    yv, xv = raster(gv, gx, gy, cfg.swizzle)
                    # the slabs' addresses read the scalar variables in place (passed to a
                    # macro, each would be bound to a new name first)
                    T.clear(H_local)
                    for ko in T.Pipelined(num_k, num_stages=cfg.stages):
                        T.copy(At[rv, yv * block_m:(yv + 1) * block_m, ko * block_k:(ko + 1) * block_k],
                               A_shared)
                        T.copy(Bt[rv, ko * block_k:(ko + 1) * block_k, xv * block_n:(xv + 1) * block_n],
                               B_shared)
                        T.gemm(A_shared, B_shared, H_local, policy=tile.policy)
                    epilogue(C, Ps, H_local, pid, yv, xv, gv, tv, sv)

    return lcmac_fused_persistent


def split_fixup(alg, blk: Blocking, dtype: str, cfg: CudaConfig, plan: PersistentPlan,
                arch: str = "sm_90a"):
    """C_ij += the fp32 partials of the non-lead pieces of every split tail group, added in
    CTA order after the lead piece's partial already in C (or instead of it where the lead
    piece does not touch C_ij).  Runs after the persistent kernel on the same stream."""
    fs = _FusedShape(alg, blk, dtype, cfg)
    block_m, block_n, R, M, N, Mb, Nb = fs.block_m, fs.block_n, fs.R, fs.M, fs.N, fs.Mb, fs.Nb
    m, n = fs.m, fs.n
    tile_rows, tile_cols = min(cfg.combine_rows, block_m), min(cfg.combine_cols, block_n)
    assert block_m % tile_rows == 0 and block_n % tile_cols == 0, "combine tile must divide the GEMM tile"
    Lt, first_tail, slots = plan.Lt, plan.rounds * plan.P, plan.slots
    cache_aware = cfg.cache_aware

    def touched(ij, c, e, rot):
        """Does the piece covering walk steps [c, e) contribute to C_ij?"""
        return _select(fs.next_step[ij], c if cache_aware else (c + rot) % R) < e - c

    pdl = uses_pdl(arch)
    @T.prim_func
    def lcmac_split_fixup(Ps: T.Tensor(extents(slots, m * n, block_m, block_n), ACCUM),
                          C: T.Tensor(extents(M, N), dtype)):
        with T.Kernel(T.ceildiv(block_n, tile_cols), T.ceildiv(block_m, tile_rows), plan.rem,
                      threads=cfg.combine_threads) as (cx, cy, gt):
            # the persistent kernel has finished and its partials (C, Ps) are visible
            if pdl:
                pdl_sync()
            g = first_tail + gt
            by, bx = raster(g, plan.gx, plan.gy, cfg.swizzle)
            rot = 0 if cache_aware else g % R
            u0 = gt * R // Lt
            e0 = T.min((u0 + 1) * Lt - gt * R, R)
            for x, y in T.Parallel(tile_rows, tile_cols):
                xx = cy * tile_rows + x
                yy = cx * tile_cols + y
                row = by * block_m + xx
                col = bx * block_n + yy
                for i in unrolled(m):
                    for j in unrolled(n):
                        acc = T.if_then_else(touched((i, j), 0, e0, rot),
                                             T.cast(C[i * Mb + row, j * Nb + col], ACCUM),
                                             T.float32(0))
                        for k in unrolled(plan.max_pieces - 1):
                            u = u0 + 1 + k
                            c = u * Lt - gt * R
                            use = T.And(c < R, touched((i, j), c, T.min(c + Lt, R), rot))
                            acc = acc + T.if_then_else(
                                use, Ps[T.min(u, slots - 1), i * n + j, xx, yy], T.float32(0))
                        conds = fs.conds(i, j, row, col)
                        if conds:
                            if all_of(conds):
                                C[i * Mb + row, j * Nb + col] = T.cast(acc, dtype)
                        else:
                            C[i * Mb + row, j * Nb + col] = T.cast(acc, dtype)

    return lcmac_split_fixup


def reduce_gemm_h(alg, blk: Blocking, dtype: str, cfg: CudaConfig, ctas: int, arch: str = "sm_90a"):
    """GEMM + Combine-H with the epilogue on the TMA engine (``cfg.tma_reduce``): P persistent
    CTAs, each owns whole groups (a tile position's R products, r = 0..R-1 back to back) and
    all CTAs run the same r at the same time (the cache-aware order).  After product r's K
    loop the consumers put w·H_r (bf16/fp16) in shared memory once per distinct coefficient
    w, and the TMA engine stores it into C_ij's tile (C_ij's first contribution) or adds it
    there (cp.reduce.async.bulk .add, performed in L2) — asynchronous, so the next product's
    K loop runs meanwhile, and neither H nor a Combine-H pass exists.  Deterministic: one CTA
    adds into a C tile, in a fixed order, each bulk group complete before the next one starts.
    C holds partial sums in its own dtype (as the register epilogue of ``fused_gemm_h``)."""
    fs = _FusedShape(alg, blk, dtype, cfg)
    tile = fs.tile
    block_m, block_n, block_k, num_k = fs.block_m, fs.block_n, fs.block_k, fs.num_k
    R, Mb, Nb, Kb, M, N = fs.R, fs.Mb, fs.Nb, fs.Kb, fs.M, fs.N
    gx, gy = Nb // block_n, Mb // block_m
    num_ctas = min(ctas, gx * gy)
    pdl = uses_pdl(arch)
    # the raster's column-panel width: the largest divisor of gx up to cfg.swizzle
    panel = max([d for d in range(1, max(cfg.swizzle, 1) + 1) if gx % d == 0])
    groups = reduce_groups(alg.W, list(range(R)))

    @T.macro
    def epilogue(C, C_local, C_shared, r, by, bx):
        # The bulk stores/adds are not waited for where they are issued (host_source.
        # async_reduce_stores drops the wait TileLang puts after each add), so the next
        # product's K loop runs while the TMA engine works.  Waits instead: all of the
        # previous product's bulk groups complete before this one writes C_shared (an add
        # into a C tile then also follows the earlier store/adds into it), and a second
        # coefficient group waits until the first one's reads of C_shared are done.
        for s0 in unrolled(R):
            if r == s0:
                T.tma_store_wait(0, read=False)
                for g, (w, dests) in enumerate(groups[s0]):
                    if g:
                        T.tma_store_wait(0, read=True)
                    if w == 1:
                        T.copy(C_local, C_shared)
                    else:
                        for x, y in T.Parallel(block_m, block_n):
                            C_shared[x, y] = T.cast(scaled(w, C_local[x, y]), dtype)
                    for (i, j, first) in dests:
                        dst = C[i * Mb + by * block_m:i * Mb + (by + 1) * block_m,
                                j * Nb + bx * block_n:j * Nb + (bx + 1) * block_n]
                        if first:
                            T.tma_copy(C_shared, dst)
                        else:
                            T.atomic_add(dst, C_shared, annotations={"use_tma": 1})

    @T.prim_func
    def lcmac_reduce_gemm(At: T.Tensor(extents(R, Mb, Kb), dtype), Bt: T.Tensor(extents(R, Kb, Nb), dtype),
                          C: T.Tensor(extents(M, N), dtype)):
        with T.Kernel(num_ctas, threads=cfg.threads) as pid:
            if pdl:
                pdl_sync()
            A_shared = T.alloc_shared((block_m, block_k), dtype)
            B_shared = T.alloc_shared((block_k, block_n), dtype)
            C_local = T.alloc_fragment((block_m, block_n), ACCUM)
            C_shared = T.alloc_shared((block_m, block_n), dtype)
            emit_names(A_s=A_shared, B_s=B_shared, C_l=C_local, C_s=C_shared)
            steps = T.ceildiv(gx * gy - pid, num_ctas) * R
            for it in T.Pipelined(steps * num_k, num_stages=cfg.stages):
                ko = it % num_k
                q = it // num_k
                r = q % R
                by, bx = _column_panels(q // R * num_ctas + pid, gx, gy, panel)
                _load_slabs(At, Bt, A_shared, B_shared, r, by, bx, ko, tile)
                T.gemm(A_shared, B_shared, C_local, policy=tile.policy, clear_accum=ko == 0)
                if ko == num_k - 1:
                    epilogue(C, C_local, C_shared, r, by, bx)
            # the last bulk groups read C_shared and write C: done before the CTA exits
            T.tma_store_wait(0, read=False)

    return lcmac_reduce_gemm
