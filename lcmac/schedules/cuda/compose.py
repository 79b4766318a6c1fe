"""Which kernels a CUDA artifact needs, in launch order, and their workspace: the templates of
this package put together for one algorithm, shape, dtype and config (``compose``).

    compose(alg, shape, dtype, cfg, programs, arch) → Composition(kernels, workspace, info)

``kernels`` are ``Kernel(name, TileLang PrimFunc, buffers in call order)``; ``workspace`` is
the layout [(buffer name, byte offset)] ending in ("__end__", total bytes); ``info`` the
facts the manifest records under ``extra``.  The forms, by config:

    batched     one kernel over a batch of products (``small`` or ``gemm.batched_products``)
    rows        M a run-time value (``_rows_kernels``: the plain GEMM or an LCMA)
    shape       M, N and K run-time values (``_shape_kernels``: the plain GEMM or Algorithm 1)
    bsr         the block-sparse product (``bsr``)
    plain GEMM  one kernel (``gemm.plain_gemm``), unless float32 on sm_90a takes TF32 wgmma
    LCMA        Combine A, Combine B, then the fused kernel (grid, persistent with its fixup,
                or the TMA-engine epilogue) or Algorithm 1's batched GEMM and Combine H
    operands    fp16 / fp16x2 (amax, scaled combines, the scaled GEMM stage) or fp8 (block-
                scaled E4M3 combines and GEMM stage), each before Combine H

The templates import TileLang, so each is imported inside the function that builds its
kernels: ``compose`` runs in the TileLang worker (``lcmac.targets.tilelang_worker``), while
this module itself (``view_plan``, ``gemm_precision``) imports without a compiler.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import NamedTuple

from lcmac import ir
from lcmac.core.dtypes import ITEMSIZE
from lcmac.ir.cse import optimized_programs
from lcmac.ir.program import (
    LinearProgram, combine_matrices, direct_outputs, keep_outputs, naive_program, scale_inputs)
from lcmac.schedules.cuda import rows
from lcmac.schedules.cuda.batched_tiles import batched_template, persistent_why
from lcmac.spec.cuda import (
    FP8_MAX_COMBINE, SMEM_PER_CTA, Blocking, CudaConfig, NotSupportedYet, PersistentPlan, arch_why,
    bound_exponent, check_operands, direct_views_why, dmma_why, fp64_why, fp8_combine_size,
    int64_buffers, needs_int64, operand_sources, persistent_gemm, persistent_plan,
    side_read_in_place, stage_bytes, tma_reduce_why, view_sides)
from lcmac.spec.profiles import get_profile

__all__ = ["Kernel", "Composition", "compose", "view_plan", "gemm_precision"]


class Kernel(NamedTuple):
    """One kernel of an artifact: its name (``<library name>_<name>`` in the library), the
    TileLang PrimFunc, and the buffers it takes, in call order."""
    name: str
    func: object
    args: list[str]


class Composition(NamedTuple):
    """The kernels of one artifact in launch order, the workspace layout [(buffer name, byte
    offset)] whose last entry is ("__end__", total bytes), and the facts the manifest records
    under ``extra`` (JSON; None: none)."""
    kernels: list[Kernel]
    workspace: list[tuple[str, int]]
    info: dict | None


def _programs(alg):
    try:
        return optimized_programs(alg), "cse"
    except Exception:          # a scheme CSE cannot handle: the naive programs
        cm = combine_matrices(alg)
        return {s: naive_program(cm[s]) for s in ("A", "B", "H")}, "naive"


def _workspace(sizes: dict) -> list:
    """Workspace layout [(buffer name, byte offset)] of {name: bytes}, each buffer 256-byte
    aligned; the last entry ("__end__", total bytes)."""
    ws, off = [], 0
    for name, nbytes in sizes.items():
        ws.append((name, off))
        off += -(-nbytes // 256) * 256
    return ws + [("__end__", off)]


def _sized_workspace(shape, shapes: dict):
    """Workspace layout of ``shapes`` {name: (dims, bytes per element)} and the names of the
    buffers (A, B, C and those) declared with int64 extents (more than 2³¹−1 elements)."""
    M, N, K = shape
    ws = _workspace({name: math.prod(dims) * item for name, (dims, item) in shapes.items()})
    dims = dict(A=(M, K), B=(K, N), C=(M, N), **{k: v[0] for k, v in shapes.items()})
    return ws, [n for n, d in dims.items() if needs_int64(d)]


def _alg_programs(alg, programs):
    """(combine programs, how they were obtained): supplied by the caller, else CSE'd here."""
    if programs:
        return {k: LinearProgram.from_dict(v) for k, v in programs.items()}, "supplied"
    return _programs(alg)


def _profile_units(arch: str, units=None) -> int:
    """SMs a persistent kernel is sized for: ``units`` if given, else the arch's profile."""
    if units is not None:
        return units
    return get_profile("a100" if arch == "sm_80" else "h100").units


def _blocking_info(blk: Blocking) -> dict:
    return {"Mb": blk.Mb, "Nb": blk.Nb, "Kb": blk.Kb}


# ---- the kernels of one artifact ------------------------------------------------------------
def compose(alg, shape, dtype, cfg, programs=None, arch="sm_90a", units=None) -> Composition:
    """The kernels of one artifact (``Composition``: kernels, workspace layout, manifest facts).
    ``units``: SMs of the GPU the persistent kernel is sized for (default: the arch's
    profile)."""
    if why := fp64_why(dtype, cfg.to_dict()):
        raise NotSupportedYet(why)
    if why := dmma_why(cfg, dtype, arch):
        raise NotSupportedYet(f"dmma={cfg.dmma!r}: {why} (use dmma='m8n8k4')")
    # the unfused GEMM stage as a persistent kernel of P CTAs (0: the grid kernel)
    ctas = 0
    if persistent_gemm(cfg, dtype, arch):
        ctas = cfg.persistent_ctas or _profile_units(arch, units)
    if cfg.dynamic_shape:
        return _shape_kernels(alg, shape, dtype, cfg, programs, arch, ctas)
    if cfg.dynamic_rows:
        return _rows_kernels(alg, shape, dtype, cfg, programs, arch, ctas)
    if alg is not None and cfg.direct_views not in ("none", "auto"):
        why = direct_views_why(cfg, Blocking(*shape, alg.m, alg.k, alg.n, alg.R), dtype, arch)
        if why:
            raise NotSupportedYet(f"direct_views={cfg.direct_views!r}: {why} (use direct_views='none')")
    if cfg.batched:
        if alg is not None or cfg.operands != "native":
            raise NotSupportedYet("a batched small product (config batched) is a plain GEMM with "
                                  "native operands: build it without an algorithm or operands")
        if batched_template(cfg.batched_template, shape[0], shape[1], dtype) == "gemm":
            if ctas and (why := persistent_why(shape[1], shape[2], dtype)):
                raise NotSupportedYet(f"persistent=True for a batched product: {why} (use persistent=False)")
            from lcmac.schedules.cuda import gemm  # TileLang: the worker process only
            return Composition([Kernel("bmm", gemm.batched_products(*shape, dtype, cfg, arch, ctas),
                                ["A", "B", "C", "batch"])], [("__end__", 0)], {"batched": True})
        if cfg.persistent:
            raise NotSupportedYet("persistent=True: the small batched template has no persistent "
                                  "grid (batched_template='gemm' has)")
        from lcmac.schedules.cuda import small  # TileLang: the worker process only
        return Composition([Kernel("bmm", small.batched_small_gemm(*shape, dtype, cfg, arch), ["A", "B", "C", "batch"])],
                    [("__end__", 0)], {"batched": True})
    if cfg.bsr:
        if alg is not None or cfg.operands != "native":
            raise NotSupportedYet("the block-sparse product (config bsr) is a plain GEMM with "
                                  "native operands: build it without an algorithm or operands")
        from lcmac.schedules.cuda import bsr  # TileLang: the worker process only
        return Composition([Kernel("bsr", bsr.bsr_spmm(dtype, cfg, arch), bsr.BSR_ARGS)],
                    [("__end__", 0)], {"bsr": cfg.bsr})
    if cfg.operands == "fp8":
        return _fp8_kernels(alg, shape, dtype, cfg, programs, arch)
    if cfg.operands != "native":
        return _scaled_kernels(alg, shape, dtype, cfg, programs, arch)
    # TF32 wgmma (sm_90a) needs B K-major: B̃ is written transposed by its combine kernel, and
    # the plain GEMM goes through the same path as the 1x1x1 algorithm
    kmajor = dtype == "float32" and arch == "sm_90a" and cfg.tf32_wgmma
    if alg is None and not kmajor:
        from lcmac.schedules.cuda import gemm  # TileLang: the worker process only
        ws, wide = _sized_workspace(shape, {})
        return Composition([Kernel("gemm", gemm.plain_gemm(*shape, dtype, cfg, arch, ctas=ctas), ["A", "B", "C"])],
                    ws, {"int64_index": wide} if wide else None)
    if alg is None:
        alg = ir.get("naive-1x1x1")
        cfg = replace(cfg, fused=False)
    return _lcma_kernels(alg, shape, dtype, cfg, programs, arch, units, ctas, kmajor)


def _rows_kernels(alg, shape, dtype: str, cfg: CudaConfig, programs, arch: str, ctas: int) -> Composition:
    """Kernels of an artifact whose row count M is a run-time value (``rows``): the plain GEMM,
    or an LCMA's Combine A and B, then its fused GEMM + Combine H (grid form) or Algorithm 1's
    batched GEMM (``ctas`` > 0: persistent) and Combine H.  Each kernel takes its buffers,
    then the sizes M / Mb it reads (``rows.scalar_args``).  The workspace layout is that of
    ``shape``'s M, the most rows a launch takes; the entry point lays it out from the
    run-time M (``info["rows"]``)."""
    import tilelang.language as T  # TileLang: the worker process only
    from lcmac.schedules.cuda import combines, fused, gemm

    def kernel(name, func, buffers):
        return Kernel(name, func, buffers + rows.scalar_args(func))

    if why := rows.rows_why(alg, shape, dtype, cfg, arch):
        raise NotSupportedYet(f"dynamic_rows=True: {why}")
    M_max, N, K = (int(d) for d in shape)
    M = T.dynamic("M")
    if alg is None:
        info = {"rows": rows.rows_info(None, M_max, None, dtype, cfg, [])}
        return Composition([kernel("gemm", gemm.plain_gemm(M, N, K, dtype, cfg, arch, ctas=ctas), ["A", "B", "C"])],
                           [("__end__", 0)], info)
    progs, how = _alg_programs(alg, programs)
    # the layout of the most rows a launch takes: Mb rounded up to the tile, as at run time
    Mb_max = rows.row_blocks(M_max, alg.m, cfg.block_m)
    widest = Blocking(alg.m * Mb_max, N, K, alg.m, alg.k, alg.n, alg.R)
    static = Blocking(M_max, N, K, alg.m, alg.k, alg.n, alg.R)
    blk = rows.RowBlocking(static, M, T.dynamic("Mb"), cfg.block_m)
    ks = [kernel("combine_a", combines.combine_ab("A", progs["A"], blk, dtype, cfg, arch), ["A", "At"]),
          kernel("combine_b", combines.combine_ab("B", progs["B"], static, dtype, cfg, arch), ["B", "Bt"])]
    if cfg.fused:
        ks.append(kernel("fused_gemm_h", fused.fused_gemm_h(alg, blk, dtype, cfg, arch=arch), ["At", "Bt", "C"]))
    else:
        ks.append(kernel("batched_gemm", gemm.batched_gemm(blk, dtype, cfg, arch=arch, ctas=ctas, views={}),
                         ["At", "Bt", "H"]))
        ks.append(kernel("combine_h", combines.combine_h(progs["H"], alg, blk, dtype, cfg, arch), ["H", "C"]))
    ws = _native_workspace(alg, widest, dtype, cfg, {}, None)
    info = {"blocking": {"Mb": "run time", "Nb": static.Nb, "Kb": static.Kb}, "programs": how,
            "rows": rows.rows_info(alg, M_max, widest, dtype, cfg, ws)}
    return Composition(ks, ws, info)


def _shape_kernels(alg, shape, dtype: str, cfg: CudaConfig, programs, arch: str, ctas: int) -> Composition:
    """Kernels of an artifact whose M, N and K are run-time values (``rows``, run-time
    shapes): the plain GEMM, or an LCMA's Combine A and B, then its fused GEMM + Combine H
    (grid form) or Algorithm 1's batched GEMM (``ctas`` > 0: persistent) and Combine H, each
    taking its buffers, then the sizes it reads (``rows.scalar_args``).  The workspace
    layout is that of ``shape``, the largest a launch takes; the entry point lays it out from
    the run-time sizes (``info["dynamic_shape"]``)."""
    import tilelang.language as T  # TileLang: the worker process only
    from lcmac.schedules.cuda import combines, fused, gemm

    def kernel(name, func, buffers):
        return Kernel(name, func, buffers + rows.scalar_args(func))

    if why := rows.shape_why(alg, shape, dtype, cfg, arch):
        raise NotSupportedYet(f"dynamic_shape=True: {why}")
    M, N, K = (T.dynamic(d) for d in "MNK")
    if alg is None:
        info = {"dynamic_shape": rows.shape_info(None, shape, dtype, cfg, []), "persistent_ctas": ctas}
        return Composition([kernel("gemm", gemm.plain_gemm(M, N, K, dtype, cfg, arch, ctas=ctas), ["A", "B", "C"])],
                           [("__end__", 0)], info)
    progs, how = _alg_programs(alg, programs)
    units = rows.shape_units(alg, dtype, cfg)
    blk = rows.ShapeBlocking(M, N, K, alg.m, alg.k, alg.n, alg.R, T.dynamic("Mb"), T.dynamic("Nb"),
                             T.dynamic("Kb"), units["row_tile"], units["col_tile"], units["depth_tile"],
                             units["vec"])
    ks = [kernel("combine_a", combines.combine_ab("A", progs["A"], blk, dtype, cfg, arch), ["A", "At"]),
          kernel("combine_b", combines.combine_ab("B", progs["B"], blk, dtype, cfg, arch), ["B", "Bt"])]
    if cfg.fused:
        ks.append(kernel("fused_gemm_h", fused.fused_gemm_h(alg, blk, dtype, cfg, arch=arch), ["At", "Bt", "C"]))
    else:
        ks += [kernel("batched_gemm", gemm.batched_gemm(blk, dtype, cfg, arch=arch, ctas=ctas, views={}),
                      ["At", "Bt", "H"]),
               kernel("combine_h", combines.combine_h(progs["H"], alg, blk, dtype, cfg, arch), ["H", "C"])]
    # the layout of the largest launch
    Mb, Nb, Kb = rows.shape_blocks(alg, shape, units)
    item = ITEMSIZE[dtype] * alg.R
    ws = _workspace({"At": item * Mb * Kb, "Bt": item * Kb * Nb, **({} if cfg.fused else {"H": item * Mb * Nb})})
    info = {"blocking": {"Mb": "run time", "Nb": "run time", "Kb": "run time"}, "programs": how,
            "dynamic_shape": rows.shape_info(alg, shape, dtype, cfg, ws),
            "persistent_ctas": ctas if not cfg.fused else 0}
    return Composition(ks, ws, info)


def _fused_form(blk: Blocking, dtype: str, cfg: CudaConfig, arch: str, units, kmajor: bool):
    """(whether the fused kernel's epilogue runs on the TMA engine, the persistent plan of the
    fused kernel or None); refuses the fused forms this config cannot build, by name."""
    if cfg.fused and cfg.tma_reduce and not kmajor:
        why = tma_reduce_why(cfg, blk, dtype, arch)
        if why:
            raise NotSupportedYet(f"tma_reduce=True: {why} (use tma_reduce=False)")
    tma_reduce = cfg.fused and cfg.tma_reduce and not kmajor
    if cfg.fused and not cfg.cache_aware:
        # an open bug (docs/cuda-templates.md)
        raise NotSupportedYet("the fused kernel's rotated walk (cache_aware=False) hangs on an "
                              "H100 (split-group and persistent forms within 7-191 calls, the "
                              "grid form once; an open bug, docs/cuda.md): use "
                              "cache_aware=True, or fused=False for the unfused ablation")
    pplan = None
    if cfg.fused and (cfg.split_group or cfg.persistent) and not tma_reduce:
        # TileLang 0.1.15's cp.async pipeline needs a constant trip count: a run-time one
        # (each CTA's share of the tail) fails in its CUDA codegen (Downcast Sub→IntImm)
        why = arch_why(cfg, dtype, arch)
        if why:
            raise NotSupportedYet(why)
        pplan = persistent_plan(blk, cfg, dtype, _profile_units(arch, units))
    return tma_reduce, pplan


def _native_workspace(alg, blk: Blocking, dtype: str, cfg: CudaConfig, views: dict,
                      pplan: PersistentPlan | None) -> list:
    """Workspace layout of a native-operand LCMA: Ã, B̃ (less the operands read in place),
    H (unfused), the split groups' partial C tiles (persistent fused)."""
    sizes = {n: e * ITEMSIZE[dtype] for n, e in blk.workspace_elems(cfg.fused).items()}
    for side, d in views.items():
        sizes[side + "t"] = sizes[side + "t"] // blk.R * (blk.R - len(d))
    if pplan is not None:
        # fp32 partial C tiles of the split groups' non-lead pieces: one slot per tail CTA
        sizes["Ps"] = max(pplan.slots, 1) * alg.m * alg.n * cfg.block_m * cfg.block_n * 4
    return _workspace(sizes)


def _lcma_kernels(alg, shape, dtype, cfg, programs, arch, units, ctas: int, kmajor: bool) -> Composition:
    """Kernels of an LCMA with native operands: the combines, then the fused kernel (grid,
    persistent with its fixup, or TMA-engine epilogue) or Algorithm 1's batched GEMM and
    Combine H; the float32 TF32-wgmma path (``kmajor``) in ``_tf32_wgmma_kernels``."""
    from lcmac.schedules.cuda import combines, fused, gemm  # TileLang: the worker process only
    progs, how = _alg_programs(alg, programs)
    blk = Blocking(*shape, alg.m, alg.k, alg.n, alg.R)
    # buffers of more than 2³¹−1 elements: declared with int64 extents (common.extents)
    info = {"blocking": _blocking_info(blk), "programs": how,
            "int64_index": int64_buffers(blk, cfg.fused and not kmajor, kmajor)}
    tma_reduce, pplan = _fused_form(blk, dtype, cfg, arch, units, kmajor)
    progs, views, negated = view_plan(progs, blk, view_sides(cfg, blk, dtype, arch))
    ws = _native_workspace(alg, blk, dtype, cfg, views, pplan)
    if kmajor:
        return _tf32_wgmma_kernels(alg, progs, blk, dtype, cfg, arch, ws, info)
    ks = [Kernel("combine_a", combines.combine_ab("A", progs["A"], blk, dtype, cfg, arch), ["A", "At"]),
          Kernel("combine_b", combines.combine_ab("B", progs["B"], blk, dtype, cfg, arch), ["B", "Bt"])]
    if tma_reduce:
        P = cfg.persistent_ctas or _profile_units(arch, units)
        ks.append(Kernel("reduce_gemm_h", fused.reduce_gemm_h(alg, blk, dtype, cfg, P, arch), ["At", "Bt", "C"]))
        return Composition(ks, ws, info)
    if pplan is not None:
        ks.append(Kernel("fused_gemm_h", fused.fused_gemm_h(alg, blk, dtype, cfg, pplan, arch),
                         ["At", "Bt", "C", "Ps"]))
        if pplan.split:
            ks.append(Kernel("split_fixup", fused.split_fixup(alg, blk, dtype, cfg, pplan, arch), ["Ps", "C"]))
        return Composition(ks, ws, dict(info, persistent=pplan.to_dict()))
    if cfg.fused:
        ks.append(Kernel("fused_gemm_h", fused.fused_gemm_h(alg, blk, dtype, cfg, arch=arch), ["At", "Bt", "C"]))
    else:
        ks.append(Kernel("batched_gemm", gemm.batched_gemm(blk, dtype, cfg, arch=arch, ctas=ctas, views=views),
                         ["At", "Bt", "H"] + sorted(views)))
        ks.append(Kernel("combine_h", combines.combine_h(progs["H"], alg, blk, dtype, cfg, arch), ["H", "C"]))
    out = dict(info)
    if views:
        out["direct_views"] = {side: {str(r): slot for r, slot in d.items()} for side, d in views.items()}
        out["view_loads"] = _view_load_sides(blk, views, ITEMSIZE[dtype])
        if negated:
            out["direct_views_negated"] = negated        # their sign is in Combine H's program
    return Composition(ks, ws, out)


def _tf32_wgmma_kernels(alg, progs, blk: Blocking, dtype: str, cfg: CudaConfig, arch: str, ws: list,
                     info: dict) -> Composition:
    """float32 on sm_90a with ``tf32_wgmma``: B̃ written K-major by its combine, then the
    batched GEMM and Combine H; the plain GEMM (the 1x1x1 algorithm) transposes B only."""
    from lcmac.schedules.cuda import combines, gemm  # TileLang: the worker process only
    layout = "K-major (transposed) for TF32 wgmma"
    if alg.m * alg.k == 1:
        ws = _workspace({"Bt": blk.Kb * blk.Nb * ITEMSIZE[dtype]})
        transpose = combines.combine_b_kmajor(progs["B"], blk, dtype, cfg, arch=arch)
        ks = [Kernel("transpose_b", transpose, ["B", "Bt"]),
              Kernel("gemm", gemm.plain_gemm(blk.M, blk.N, blk.K, dtype, cfg, arch, bt_shape=(blk.Nb, blk.Kb)),
                     ["A", "Bt", "C"])]
        wide = [n for n in ("A", "Bt", "C") if n in info["int64_index"]]
        return Composition(ks, ws, dict(info, int64_index=wide, b_layout=layout))
    if cfg.fused:
        raise NotSupportedYet("the fused kernel for float32 on sm_90a is not supported yet "
                              "(use fused=False: TF32 wgmma path)")
    ks = [Kernel("combine_a", combines.combine_ab("A", progs["A"], blk, dtype, cfg, arch), ["A", "At"]),
          Kernel("combine_b", combines.combine_b_kmajor(progs["B"], blk, dtype, cfg, arch=arch), ["B", "Bt"]),
          Kernel("batched_gemm", gemm.batched_gemm(blk, dtype, cfg, kmajor_b=True, arch=arch), ["At", "Bt", "H"]),
          Kernel("combine_h", combines.combine_h(progs["H"], alg, blk, dtype, cfg, arch), ["H", "C"])]
    return Composition(ks, ws, dict(info, b_layout=layout))


def view_plan(progs: dict, blk, sides: str) -> tuple[dict, dict, list[int]]:
    """(programs, views, negated) for the operands the batched GEMM reads in place
    (``CudaConfig.direct_views``, resolved to ``sides``): those that are one input block with
    coefficient ±1, on the sides ``config.side_read_in_place`` accepts.  ``views``:
    {"A"/"B": {product r: input slot}}; the combines' programs then write only the other
    operands.  A product whose operands carry an odd number of −1s is computed un-negated,
    H_r' = −H_r, and Combine H's program takes the sign (``negated``: those r)."""
    views, sign = {}, [1] * blk.R
    for side in ("A", "B"):
        d = direct_outputs(progs[side]) if side.lower() in sides else {}
        if not side_read_in_place(len(d), blk.R):
            continue
        views[side] = d
        for r in d:
            sign[r] *= progs[side].outputs[r][0][0]
        progs = dict(progs, **{side: keep_outputs(progs[side], [r for r in range(blk.R) if r not in d])})
    negated = [r for r in range(blk.R) if sign[r] < 0]
    if negated:
        progs = dict(progs, H=scale_inputs(progs["H"], {r: -1 for r in negated}))
    return progs, views, negated


def _view_load_sides(blk, views: dict, item: int) -> list[dict]:
    """``host_source.view_loads``'s description of each view side: each product's source
    (``lcmac.spec.cuda.operand_sources``), and dims and byte strides, innermost first in the order
    TileLang 0.1.15 gives 4-D descriptors (columns, rows, block column, product), of the
    [R, rows, Q, cols] tensor the kernel was written against, of the input's own
    [P, rows, Q, cols] block view and of the workspace's Rw operands."""
    sides = []
    for side, d in sorted(views.items()):
        P, Q, Rb, Cb = (blk.m, blk.k, blk.Mb, blk.Kb) if side == "A" else (blk.k, blk.n, blk.Kb, blk.Nb)
        rw = blk.R - len(d)
        row = Q * Cb * item
        sides.append({"tensor": side + "t", "input": side, "blocks_per_row": Q,
                      "sources": operand_sources(blk.R, d),
                      "virtual_dims": [Cb, Rb, Q, blk.R], "virtual_strides": [item, row, Cb * item, Rb * row],
                      "view_dims": [Cb, Rb, Q, P],
                      "ws_dims": [Cb, Rb, 1, rw], "ws_strides": [item, Cb * item, Rb * Cb * item, Rb * Cb * item]})
    return sides


def _scaled_kernels(alg, shape, dtype, cfg, programs, arch) -> Composition:
    """Kernels of an artifact with scaled fp16 operands (CudaConfig.operands): amax of A and
    of B into S (zeroed by the entry point), combines writing scaled fp16 Ã/B̃ (hi and lo
    halves for fp16x2), the scaled GEMM stage writing fp32 H (or C directly for the plain
    GEMM: the 1x1x1 algorithm, whose combines only scale and split), Combine H."""
    from lcmac.schedules.cuda import combines, low_precision as lp  # TileLang: the worker process only
    check_operands(cfg, dtype)
    split = cfg.operands == "fp16x2"
    bk = cfg.bk(lp.OPERAND_DTYPE)
    stage = stage_bytes(cfg, dtype)
    limit = SMEM_PER_CTA[arch]
    if cfg.stages * stage > limit:
        raise NotSupportedYet(
            f"operands={cfg.operands!r}: {cfg.stages} stages of {stage // 1024} KB "
            f"({'four' if split else 'two'} fp16 tiles of {cfg.block_m}x{bk} and {bk}x{cfg.block_n}) "
            f"exceed {arch}'s {limit // 1024} KB of shared memory: use fewer stages or a smaller tile")
    M, N, K = shape
    direct = alg is None
    if direct:
        alg = ir.get("naive-1x1x1")
    progs, how = _alg_programs(alg, programs)
    blk = Blocking(M, N, K, alg.m, alg.k, alg.n, alg.R)
    bound_a, bound_b = bound_exponent(alg.U), bound_exponent(alg.V)
    shapes = {"S": ((2,), 4), "At": ((blk.R, blk.Mb, blk.Kb), 2), "Bt": ((blk.R, blk.Kb, blk.Nb), 2)}
    if split:
        shapes["Al"], shapes["Bl"] = shapes["At"], shapes["Bt"]
    if not direct:
        shapes["H"] = ((blk.R, blk.Mb, blk.Nb), 4)
    ws, wide = _sized_workspace(shape, shapes)
    a_out = ["At", "Al"] if split else ["At"]
    b_out = ["Bt", "Bl"] if split else ["Bt"]
    ks = [Kernel("amax_a", lp.operand_amax(M, K, dtype, 0, arch), ["A", "S"]),
          Kernel("amax_b", lp.operand_amax(K, N, dtype, 1, arch), ["B", "S"]),
          Kernel("combine_a", combines.combine_ab("A", progs["A"], blk, dtype, cfg, arch, bound=bound_a),
                 ["A", "S", *a_out]),
          Kernel("combine_b", combines.combine_ab("B", progs["B"], blk, dtype, cfg, arch, bound=bound_b),
                 ["B", "S", *b_out])]
    gemm_args = (["At", "Al", "Bt", "Bl"] if split else ["At", "Bt"]) + ["S", "C" if direct else "H"]
    ks.append(Kernel("gemm" if direct else "batched_gemm",
                     lp.scaled_gemm(blk, dtype, cfg, (bound_a, bound_b), direct, arch), gemm_args))
    if not direct:
        ks.append(Kernel("combine_h", combines.combine_h(progs["H"], alg, blk, dtype, cfg, arch), ["H", "C"]))
    return Composition(ks, ws, {"blocking": _blocking_info(blk), "programs": how, "int64_index": wide,
                         "operands": cfg.operands, "zero": ["S"], "scale_bounds": [bound_a, bound_b]})


def _fp8_kernels(alg, shape, dtype, cfg, programs, arch) -> Composition:
    """Kernels of an artifact with E4M3 operands (CudaConfig.operands="fp8", the contract of
    lcmac.spec.fp8): Combine A quantizes Ã per 1×128, Combine B quantizes B̃ per 128×128
    (K-major; the B-side kernel ``prepare_b`` runs once), the fp8 GEMM stage writes fp32 H
    (or C for the plain GEMM: the 1x1x1 algorithm, whose combines only quantize), Combine H."""
    from lcmac.schedules.cuda import combines, low_precision as lp  # TileLang: the worker process only
    if arch != "sm_90a":
        raise NotSupportedYet(f"operands='fp8' needs FP8 tensor cores (sm_90a); {arch} has none")
    check_operands(cfg, dtype)
    M, N, K = shape
    direct = alg is None
    if direct:
        alg = ir.get("naive-1x1x1")
    # the larger schemes are refused rather than hanging a build in TileLang's lowering
    size = fp8_combine_size(alg.m, alg.k, alg.n, alg.R)
    if size > FP8_MAX_COMBINE:
        raise NotSupportedYet(f"operands='fp8' supports schemes with R·(inputs per combine) ≤ "
                              f"{FP8_MAX_COMBINE} for now; {alg.name} has {size} (TileLang's lowering "
                              f"of its per-product block scales takes too long): use one recursion "
                              f"level, or operands='fp16'")
    progs, how = _alg_programs(alg, programs)
    blk = Blocking(M, N, K, alg.m, alg.k, alg.n, alg.R, k_align=16)
    scales = lp.fp8_scale_shapes(blk, cfg)
    shapes = {"At": ((blk.R, blk.Mb, blk.Kb), 1), "Bt": ((blk.R, blk.Nb, blk.Kb), 1),
              "SA": (scales["SA"], 4), "SB": (scales["SB"], 4)}
    if not direct:
        shapes["H"] = ((blk.R, blk.Mb, blk.Nb), 4)
    ws, wide = _sized_workspace(shape, shapes)
    ks = [Kernel("combine_a", lp.fp8_combine_a(progs["A"], blk, dtype, cfg, arch), ["A", "At", "SA"]),
          Kernel("combine_b", lp.fp8_combine_b(progs["B"], blk, dtype, cfg, arch), ["B", "Bt", "SB"]),
          Kernel("gemm" if direct else "batched_gemm", lp.fp8_gemm(blk, dtype, cfg, direct, arch),
                 ["At", "Bt", "SA", "SB", "C" if direct else "H"])]
    if not direct:
        ks.append(Kernel("combine_h", combines.combine_h(progs["H"], alg, blk, dtype, cfg, arch), ["H", "C"]))
    return Composition(ks, ws, {"blocking": _blocking_info(blk), "programs": how, "int64_index": wide,
                         "operands": "fp8", "b_layout": "K-major (transposed) E4M3 for fp8 wgmma",
                         "scales": "float32 amax/448 per 1x128 block of A, per 128x128 block of B"})


def gemm_precision(dtype: str, cfg) -> str:
    """What the GEMM stage computes in (recorded in the manifest)."""
    if cfg.operands == "fp8":
        return f"fp8 e4m3 (A 1x128, B 128x128 block-scaled from {dtype}, fp32 accumulate)"
    if cfg.operands == "fp16x2":
        return "fp16x2 (float32 split into hi + lo fp16 halves, 3 fp16 tensor-core products, fp32 accumulate)"
    if cfg.operands == "fp16":
        return f"fp16 (power-of-two scaled from {dtype}, fp32 accumulate)"
    return "tf32" if dtype == "float32" else dtype
