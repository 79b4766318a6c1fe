"""TileLang compile worker for the CUDA targets.

Runs in its own process (TileLang bundles a TVM that cannot share a process with apache-tvm):

    python -m lcmac.targets.tilelang_worker  < request.json  > response.json
    python -m lcmac.targets.tilelang_worker --serve     (one request per line; ``serve``)

Request (JSON object):
    algorithm   catalogue name (e.g. "strassen", "strassen^2") or Algorithm.to_dict();
                null / "gemm" for the plain TileLang GEMM
    target      "cuda-sm90a" | "cuda-sm80"
    dtype       "bfloat16" | "float16" | "float32"  (float32: the GEMM stage runs TF32 on
                the tensor cores, fp32 accumulation; combines are fp32); "float64" for
                batched products only (fp64 tensor cores, float64 accumulation)
    shape       [M, N, K]
    config      CudaConfig fields (optional)
    out_dir     directory for the library and the generated sources
    name        library base name (default "lcmac_cuda")
    jobs        parallel nvcc processes (default 2)
    compile     false: stop after code generation (sources only; for tests)

Response: {"ok": true, "library": path | null, "sources": [...], "kernels": [{"name", "grid",
"block", "smem_bytes", "args"}], "workspace_bytes": n, "entry_points": {...},
"config": {...}, "arch": "sm_90a", "dtype": ..., "shape": [...], "algorithm": {...} | null,
"ptxas": {...}} or {"ok": false, "error": message, "error_type": class name}.

A build runs in three steps: ``plan`` (the kernels of the artifact: TileLang templates from
``lcmac.schedules.cuda``, the workspace layout, the manifest's facts), ``emit_sources``
(lowering to CUDA, the host-side rewrites of ``targets.cuda``, the entry file) and
``host.compile_so`` (nvcc).
"""
from __future__ import annotations

import json
import math
import os
import re
import shutil
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, replace
from typing import NamedTuple

from lcmac import ir
from lcmac.spec.profiles import get_profile
from lcmac.core.dtypes import ITEMSIZE, normalize_dtype
from lcmac.core.errors import DTypeError
from lcmac.ir.algorithm import Algorithm
from lcmac.ir.cse import optimized_programs
from lcmac.ir.program import (
    LinearProgram, combine_matrices, direct_outputs, keep_outputs, naive_program, scale_inputs)
from lcmac.schedules.cuda.batched_tiles import batched_template, persistent_why, small_tile_defaults
from lcmac.spec.cuda import (
    BATCHED_DTYPES, FP8_MAX_COMBINE, SMEM_PER_CTA, SUPPORTED_DTYPES, Blocking, CudaConfig,
    NotSupportedYet, PersistentPlan, arch_why, batched_only_why, bound_exponent, bsr_tile_defaults,
    check_batched_shape, check_operands, check_shape, check_smem, cluster_kernels,
    direct_views_why, fp8_combine_size, int64_buffers, is_lcma, needs_int64, operand_sources,
    persistent_gemm, persistent_plan, side_read_in_place, stage_bytes, tma_reduce_why, view_sides)
from lcmac.targets import cuda as host
from lcmac.targets import get_target

# TileLang and the kernel templates (lcmac.schedules.cuda.gemm, ...) are imported inside the
# functions that build or lower kernels: the tests import ``view_plan`` from this module in a
# process that must not load TileLang.


class Kernel(NamedTuple):
    """One kernel of an artifact: its name (``<library name>_<name>`` in the library), the
    TileLang PrimFunc, and the buffers it takes, in call order."""
    name: str
    func: object
    args: list[str]


class Plan(NamedTuple):
    """The kernels of one artifact in launch order, the workspace layout [(buffer name, byte
    offset)] whose last entry is ("__end__", total bytes), and the facts the manifest records
    under ``extra`` (JSON; None: none)."""
    kernels: list[Kernel]
    workspace: list[tuple[str, int]]
    info: dict | None


@dataclass(frozen=True)
class Request:
    """A build request (the module docstring's JSON object), validated and resolved."""
    target: object            # lcmac.targets.Target
    dtype: str
    shape: tuple[int, int, int]
    algorithm: Algorithm | None
    config: CudaConfig
    programs: dict | None
    out_dir: str
    name: str
    jobs: int
    compile: bool

    @classmethod
    def parse(cls, req: dict) -> "Request":
        target = get_target(req.get("target", "cuda-sm90a"))
        if target.family != "cuda":
            raise ValueError(f"the TileLang worker builds CUDA targets, not {target.name}")
        dtype = normalize_dtype(req.get("dtype", "bfloat16"))
        given = dict(req.get("config") or {})
        if why := batched_only_why(dtype, given):
            raise DTypeError(why)
        if dtype not in BATCHED_DTYPES:
            if dtype == "float8_e4m3":
                raise NotSupportedYet("float8_e4m3 is not supported yet by the CUDA backend")
            raise DTypeError(f"the CUDA backend supports {SUPPORTED_DTYPES}, not {dtype}")
        M, N, K = (int(x) for x in req["shape"])
        alg = _resolve_algorithm(req.get("algorithm"))
        if given.get("batched"):
            check_batched_shape(M, N, K)
            tile = small_tile_defaults(M, N, K, dtype, given.get("policy"), given.get("batched_template"),
                                       given.get("persistent"), target.arch)
            if tile.get("batched_template") == "gemm":
                del tile["stages"]      # from_dict fits them to the tile asked for (as the defaults')
            given = {**tile, **given}
        elif given.get("bsr"):
            # the shape only names the artifact: M, K, N are the kernel's arguments
            check_batched_shape(M, N, K)
            given = {**bsr_tile_defaults(int(given["bsr"]), dtype), **given}
        else:
            check_shape(M, N, K, dtype)
        cfg = CudaConfig.from_dict(given, dtype=dtype, arch=target.arch, lcma=is_lcma(alg))
        cfg.check()
        return cls(target, dtype, (M, N, K), alg, cfg, req.get("programs"),
                   os.path.abspath(req.get("out_dir", ".")), req.get("name", "lcmac_cuda"),
                   int(req.get("jobs", 2)), bool(req.get("compile", True)))


def _programs(alg):
    try:
        return optimized_programs(alg), "cse"
    except Exception:          # a scheme CSE cannot handle: the naive programs
        cm = combine_matrices(alg)
        return {s: naive_program(cm[s]) for s in ("A", "B", "H")}, "naive"


def _resolve_algorithm(spec):
    if spec is None or spec in ("gemm", "plain"):
        return None
    if isinstance(spec, dict):
        return Algorithm.from_dict(spec)
    return ir.get(spec)


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


# ---- plan: the kernels of one artifact -------------------------------------------------------
def plan(alg, shape, dtype, cfg, programs=None, arch="sm_90a", units=None) -> Plan:
    """The kernels of one artifact (``Plan``: kernels, workspace layout, manifest facts).
    ``units``: SMs of the GPU the persistent kernel is sized for (default: the arch's
    profile)."""
    # the unfused GEMM stage as a persistent kernel of P CTAs (0: the grid kernel)
    ctas = 0
    if persistent_gemm(cfg, dtype, arch):
        ctas = cfg.persistent_ctas or _profile_units(arch, units)
    if alg is not None and cfg.direct_views not in ("none", "auto"):
        why = direct_views_why(cfg, Blocking(*shape, alg.m, alg.k, alg.n, alg.R), dtype, arch)
        if why:
            raise NotSupportedYet(f"direct_views={cfg.direct_views!r}: {why} (use direct_views='none')")
    if cfg.batched:
        if alg is not None or cfg.operands != "native" or cfg.ladder:
            raise NotSupportedYet("a batched small product (config batched) is a plain GEMM with "
                                  "native operands: build it without an algorithm, operands or "
                                  "ladder step")
        if batched_template(cfg.batched_template, shape[0], shape[1], dtype) == "gemm":
            if ctas and (why := persistent_why(shape[1], shape[2], dtype)):
                raise NotSupportedYet(f"persistent=True for a batched product: {why} (use persistent=False)")
            from lcmac.schedules.cuda import gemm  # TileLang: this process only
            return Plan([Kernel("bmm", gemm.batched_products(*shape, dtype, cfg, arch, ctas),
                                ["A", "B", "C", "batch"])], [("__end__", 0)], {"batched": True})
        if cfg.persistent:
            raise NotSupportedYet("persistent=True: the small batched template has no persistent "
                                  "grid (batched_template='gemm' has)")
        from lcmac.schedules.cuda import small  # TileLang: this process only
        return Plan([Kernel("bmm", small.batched_small_gemm(*shape, dtype, cfg, arch), ["A", "B", "C", "batch"])],
                    [("__end__", 0)], {"batched": True})
    if cfg.bsr:
        if alg is not None or cfg.operands != "native":
            raise NotSupportedYet("the block-sparse product (config bsr) is a plain GEMM with "
                                  "native operands: build it without an algorithm or operands")
        from lcmac.schedules.cuda import bsr  # TileLang: this process only
        return Plan([Kernel("bsr", bsr.bsr_spmm(dtype, cfg, arch), bsr.BSR_ARGS)],
                    [("__end__", 0)], {"bsr": cfg.bsr})
    if cfg.ladder:
        if alg is not None or cfg.operands != "native":
            raise NotSupportedYet("a ladder step (config ladder > 0) is a plain GEMM with native "
                                  "operands: build it without an algorithm and with operands='native'")
        from lcmac.schedules.cuda import ladder  # TileLang: this process only
        ws, wide = _sized_workspace(shape, {})
        return Plan([Kernel("gemm", ladder.ladder_gemm(cfg.ladder, *shape, dtype, cfg, arch),
                            ["A", "B", "C"])], ws, {"ladder_step": cfg.ladder})
    if cfg.operands == "fp8":
        return _fp8_plan(alg, shape, dtype, cfg, programs, arch)
    if cfg.operands != "native":
        return _scaled_plan(alg, shape, dtype, cfg, programs, arch)
    # TF32 wgmma (sm_90a) needs B K-major: B̃ is written transposed by its combine kernel, and
    # the plain GEMM goes through the same path as the 1x1x1 algorithm
    kmajor = dtype == "float32" and arch == "sm_90a" and cfg.tf32_wgmma
    if alg is None and not kmajor:
        from lcmac.schedules.cuda import gemm  # TileLang: this process only
        ws, wide = _sized_workspace(shape, {})
        return Plan([Kernel("gemm", gemm.plain_gemm(*shape, dtype, cfg, arch, ctas=ctas), ["A", "B", "C"])],
                    ws, {"int64_index": wide} if wide else None)
    if alg is None:
        alg = ir.get("naive-1x1x1")
        cfg = replace(cfg, fused=False)
    return _lcma_plan(alg, shape, dtype, cfg, programs, arch, units, ctas, kmajor)


def _fused_form(blk: Blocking, dtype: str, cfg: CudaConfig, arch: str, units, kmajor: bool):
    """(whether the fused kernel's epilogue runs on the TMA engine, the persistent plan of the
    fused kernel or None); refuses the fused forms this config cannot build, by name."""
    if cfg.fused and cfg.tma_reduce and not kmajor:
        why = tma_reduce_why(cfg, blk, dtype, arch)
        if why:
            raise NotSupportedYet(f"tma_reduce=True: {why} (use tma_reduce=False)")
    tma_reduce = cfg.fused and cfg.tma_reduce and not kmajor
    if cfg.fused and not cfg.cache_aware:
        # an open bug: research/probe_hang.py (docs/cuda-templates.md)
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


def _lcma_plan(alg, shape, dtype, cfg, programs, arch, units, ctas: int, kmajor: bool) -> Plan:
    """Kernels of an LCMA with native operands: the combines, then the fused kernel (grid,
    persistent with its fixup, or TMA-engine epilogue) or Algorithm 1's batched GEMM and
    Combine H; the float32 TF32-wgmma path (``kmajor``) in ``_tf32_wgmma_plan``."""
    from lcmac.schedules.cuda import combines, fused, gemm  # TileLang: this process only
    progs, how = _alg_programs(alg, programs)
    blk = Blocking(*shape, alg.m, alg.k, alg.n, alg.R)
    # buffers of more than 2³¹−1 elements: declared with int64 extents (common.extents)
    info = {"blocking": _blocking_info(blk), "programs": how,
            "int64_index": int64_buffers(blk, cfg.fused and not kmajor, kmajor)}
    tma_reduce, pplan = _fused_form(blk, dtype, cfg, arch, units, kmajor)
    progs, views, negated = view_plan(progs, blk, view_sides(cfg, blk, dtype, arch))
    ws = _native_workspace(alg, blk, dtype, cfg, views, pplan)
    if kmajor:
        return _tf32_wgmma_plan(alg, progs, blk, dtype, cfg, arch, ws, info)
    ks = [Kernel("combine_a", combines.combine_ab("A", progs["A"], blk, dtype, cfg, arch), ["A", "At"]),
          Kernel("combine_b", combines.combine_ab("B", progs["B"], blk, dtype, cfg, arch), ["B", "Bt"])]
    if tma_reduce:
        P = cfg.persistent_ctas or _profile_units(arch, units)
        ks.append(Kernel("reduce_gemm_h", fused.reduce_gemm_h(alg, blk, dtype, cfg, P, arch), ["At", "Bt", "C"]))
        return Plan(ks, ws, info)
    if pplan is not None:
        ks.append(Kernel("fused_gemm_h", fused.fused_gemm_h(alg, blk, dtype, cfg, pplan, arch),
                         ["At", "Bt", "C", "Ps"]))
        if pplan.split:
            ks.append(Kernel("split_fixup", fused.split_fixup(alg, blk, dtype, cfg, pplan, arch), ["Ps", "C"]))
        return Plan(ks, ws, dict(info, persistent=pplan.to_dict()))
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
    return Plan(ks, ws, out)


def _tf32_wgmma_plan(alg, progs, blk: Blocking, dtype: str, cfg: CudaConfig, arch: str, ws: list,
                     info: dict) -> Plan:
    """float32 on sm_90a with ``tf32_wgmma``: B̃ written K-major by its combine, then the
    batched GEMM and Combine H; the plain GEMM (the 1x1x1 algorithm) transposes B only."""
    from lcmac.schedules.cuda import combines, gemm  # TileLang: this process only
    layout = "K-major (transposed) for TF32 wgmma"
    if alg.m * alg.k == 1:
        ws = _workspace({"Bt": blk.Kb * blk.Nb * ITEMSIZE[dtype]})
        transpose = combines.combine_b_kmajor(progs["B"], blk, dtype, cfg, arch=arch)
        ks = [Kernel("transpose_b", transpose, ["B", "Bt"]),
              Kernel("gemm", gemm.plain_gemm(blk.M, blk.N, blk.K, dtype, cfg, arch, bt_shape=(blk.Nb, blk.Kb)),
                     ["A", "Bt", "C"])]
        wide = [n for n in ("A", "Bt", "C") if n in info["int64_index"]]
        return Plan(ks, ws, dict(info, int64_index=wide, b_layout=layout))
    if cfg.fused:
        raise NotSupportedYet("the fused kernel for float32 on sm_90a is not supported yet "
                              "(use fused=False: TF32 wgmma path)")
    ks = [Kernel("combine_a", combines.combine_ab("A", progs["A"], blk, dtype, cfg, arch), ["A", "At"]),
          Kernel("combine_b", combines.combine_b_kmajor(progs["B"], blk, dtype, cfg, arch=arch), ["B", "Bt"]),
          Kernel("batched_gemm", gemm.batched_gemm(blk, dtype, cfg, kmajor_b=True, arch=arch), ["At", "Bt", "H"]),
          Kernel("combine_h", combines.combine_h(progs["H"], alg, blk, dtype, cfg, arch), ["H", "C"])]
    return Plan(ks, ws, dict(info, b_layout=layout))


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
    """``targets.cuda.view_loads``'s description of each view side: each product's source
    (``config.operand_sources``), and dims and byte strides, innermost first in the order
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


def _scaled_plan(alg, shape, dtype, cfg, programs, arch) -> Plan:
    """Kernels of an artifact with scaled fp16 operands (CudaConfig.operands): amax of A and
    of B into S (zeroed by the entry point), combines writing scaled fp16 Ã/B̃ (hi and lo
    halves for fp16x2), the scaled GEMM stage writing fp32 H (or C directly for the plain
    GEMM: the 1x1x1 algorithm, whose combines only scale and split), Combine H."""
    from lcmac.schedules.cuda import combines, low_precision as lp  # TileLang: this process only
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
    return Plan(ks, ws, {"blocking": _blocking_info(blk), "programs": how, "int64_index": wide,
                         "operands": cfg.operands, "zero": ["S"], "scale_bounds": [bound_a, bound_b]})


def _fp8_plan(alg, shape, dtype, cfg, programs, arch) -> Plan:
    """Kernels of an artifact with E4M3 operands (CudaConfig.operands="fp8"): the combines
    quantize Ã (per row) and B̃ (per column, K-major) with a float32 scale per 128 K, the
    fp8 GEMM stage writes fp32 H (or C for the plain GEMM: the 1x1x1 algorithm, whose
    combines only quantize), Combine H."""
    from lcmac.schedules.cuda import combines, low_precision as lp  # TileLang: this process only
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
    ks = [Kernel("combine_a", lp.fp8_combine("A", progs["A"], blk, dtype, cfg, arch), ["A", "At", "SA"]),
          Kernel("combine_b", lp.fp8_combine("B", progs["B"], blk, dtype, cfg, arch), ["B", "Bt", "SB"]),
          Kernel("gemm" if direct else "batched_gemm", lp.fp8_gemm(blk, dtype, cfg, direct, arch),
                 ["At", "Bt", "SA", "SB", "C" if direct else "H"])]
    if not direct:
        ks.append(Kernel("combine_h", combines.combine_h(progs["H"], alg, blk, dtype, cfg, arch), ["H", "C"]))
    return Plan(ks, ws, {"blocking": _blocking_info(blk), "programs": how, "int64_index": wide,
                         "operands": "fp8", "b_layout": "K-major (transposed) E4M3 for fp8 wgmma",
                         "scales": "float32 per 1x128 block along K (A rows, B columns)"})


def gemm_precision(dtype: str, cfg) -> str:
    """What the GEMM stage computes in (recorded in the manifest)."""
    if cfg.operands == "fp8":
        return f"fp8 e4m3 (1x128 block-scaled from {dtype}, fp32 accumulate)"
    if cfg.operands == "fp16x2":
        return "fp16x2 (float32 split into hi + lo fp16 halves, 3 fp16 tensor-core products, fp32 accumulate)"
    if cfg.operands == "fp16":
        return f"fp16 (power-of-two scaled from {dtype}, fp32 accumulate)"
    if 0 < cfg.ladder <= 5:
        return f"{dtype} (ladder step {cfg.ladder}: CUDA cores, fp32 FMA)"
    return "tf32" if dtype == "float32" else dtype


# ---- emit: CUDA sources ----------------------------------------------------------------------
def _launch_info(code: str, kname: str) -> dict:
    grid = re.search(r"config\.gridDim = dim3\(([^)]*)\)", code)
    block = re.search(r"config\.blockDim = dim3\(([^)]*)\)", code)
    smem = re.search(r"config\.dynamicSmemBytes = (\d+)", code)
    # a dynamic dimension (a batched kernel's batch count) stays its name
    tup = (lambda m: [int(x) if x.strip().isdigit() else x.strip() for x in m.group(1).split(",")]
           if m else None)
    return {"name": kname, "grid": tup(grid), "block": tup(block),
            "smem_bytes": int(smem.group(1)) if smem else 0}


def lower_to_cuda(func, arch: str, pass_configs: dict | None = None) -> str:
    """TileLang prim_func → CUDA source holding the kernel and TileLang's host launcher."""
    from tilelang import tvm
    from tilelang.engine import lower
    from tilelang.jit.adapter.wrapper import TLWrapper
    from tvm.target import Target
    tgt = Target({"kind": "cuda", "arch": arch})
    pass_configs = pass_configs or {}
    with tvm.transform.PassContext(opt_level=3, config=pass_configs), tgt:
        art = lower(func, target=tgt)
    w = TLWrapper(tgt)
    w.assign_optimized_module(tvm.IRModule({"main": func}))
    w.assign_pass_configs(pass_configs)
    w.assign_host_module(art.host_mod)
    w.assign_device_module(art.device_mod)
    return w.wrap(art.kernel_source)


def _host_rewrites(code: str, kernel: Kernel, symbol: str, cfg: CudaConfig, clustered: tuple,
                   info: dict | None) -> str:
    """One lowered kernel made ready to link beside the others (``symbol``: its unique
    name): its launcher renamed, then the rewrites of ``targets.cuda`` its template needs."""
    fname = kernel.func.attrs["global_symbol"] if "global_symbol" in kernel.func.attrs else "main"
    code = host.rename_launcher(code, str(fname), symbol)
    if kernel.name in clustered:
        code = host.cluster_pipeline(code, cfg.stages, cfg.threads)
    if kernel.name == "reduce_gemm_h":
        code = host.async_reduce_stores(code)
    if kernel.name.startswith(host.STREAMING_KERNELS):
        code = host.restrict_pointers(code, symbol)
    if kernel.name == "batched_gemm" and (info or {}).get("view_loads"):
        code = host.view_loads(code, symbol, info["view_loads"])
    return code


def _write(path: str, text: str) -> str:
    with open(path, "w") as f:
        f.write(text)
    return path


def emit_sources(p: Plan, rq: Request, clustered: tuple) -> tuple[list[str], list[dict], dict]:
    """Lower every kernel of ``p`` and write its CUDA source, then the entry file chaining
    them: (source paths, launch facts per kernel, the manifest's ``extra`` with the
    prepared-B plan)."""
    arch, name = rq.target.arch, rq.name
    sources, infos = [], []
    for k in p.kernels:
        symbol = f"{name}_{k.name}"
        code = _host_rewrites(lower_to_cuda(k.func, arch), k, symbol, rq.config, clustered, p.info)
        sources.append(_write(os.path.join(rq.out_dir, f"{symbol}.cu"), code))
        infos.append(dict(_launch_info(code, k.name), args=k.args))
    check_smem(infos, arch)
    klist = [{"name": f"{name}_{k.name}", "args": k.args} for k in p.kernels]
    zero = (p.info or {}).get("zero", [])
    M, N, K = rq.shape
    prepared = host.prepared_b_plan(klist, p.workspace, zero, b_bytes=K * N * ITEMSIZE[rq.dtype])
    entry = host.entry_source(klist, p.workspace, zero=zero, prepared=prepared)
    if "kernels" in prepared:
        prepared = dict(prepared, kernels=[k[len(name) + 1:] for k in prepared["kernels"]])
    sources.append(_write(os.path.join(rq.out_dir, f"{name}_entry.cu"), entry))
    return sources, infos, dict(p.info or {}, prepared_b=prepared)


# ---- build: plan, emit, compile --------------------------------------------------------------
def build(req: dict) -> dict:
    import tilelang     # the compiler: this process only
    t0 = time.time()
    rq = Request.parse(req)
    os.makedirs(rq.out_dir, exist_ok=True)
    alg, cfg, arch = rq.algorithm, rq.config, rq.target.arch
    clustered = cluster_kernels(cfg, rq.dtype, arch)
    p = plan(alg, rq.shape, rq.dtype, cfg, rq.programs, arch)
    sources, infos, extra = emit_sources(p, rq, clustered)
    t_gen = time.time() - t0
    lib, ptxas = None, {}
    if rq.compile:
        lib = os.path.join(rq.out_dir, f"{rq.name}.so")
        includes = host.tilelang_include_dirs(os.path.dirname(tilelang.__file__))
        ptxas = host.compile_so(sources, lib, arch, includes, jobs=rq.jobs)
    resp = {"ok": True, "library": lib, "sources": sources, "kernels": infos,
            "workspace_bytes": p.workspace[-1][1], "workspace": p.workspace[:-1],
            "entry_points": {"init": "lcmac_init", "run": "lcmac_run",
                             "last_error": "lcmac_last_error",
                             "workspace_bytes": "lcmac_workspace_bytes"},
            "name": rq.name, "config": cfg.to_dict(), "arch": arch, "target": rq.target.name,
            "dtype": rq.dtype, "shape": list(rq.shape),
            "gemm_precision": gemm_precision(rq.dtype, cfg),
            "algorithm": alg.to_dict() if alg is not None else None,
            "algorithm_name": alg.name if alg is not None else "gemm",
            "algorithm_hash": alg.hash if alg is not None else None,
            "extra": extra, "ptxas": ptxas,
            "seconds": {"codegen": round(t_gen, 2), "total": round(time.time() - t0, 2)}}
    side = dict(resp, library=os.path.basename(lib) if lib else None,
                sources=[os.path.basename(s) for s in sources])
    with open(os.path.join(rq.out_dir, f"{rq.name}.json"), "w") as f:
        json.dump(side, f, indent=1)
    return resp


def build_contract(req: dict) -> dict:
    """``lcmac.build``'s worker contract (version 1; see lcmac/artifact/build.py's docstring)."""
    import tilelang     # the compiler: this process only
    tgt = req["target"]
    shape = req["shape"]
    alg = None if req.get("plain_gemm") else Algorithm.from_dict(req["algorithm"])
    lib_out = req["library"]
    work = tempfile.mkdtemp(prefix="lcmac-cuda-", dir=os.path.dirname(os.path.abspath(lib_out)))
    try:
        inner = {"algorithm": alg.to_dict() if alg is not None else None,
                 "target": tgt["name"], "dtype": req["dtype"],
                 "shape": [shape["M"], shape["N"], shape["K"]],
                 "config": req.get("config") or {}, "out_dir": work, "name": "lcmac",
                 "jobs": int(os.environ.get("LCMAC_NVCC_JOBS", "2"))}
        if req.get("programs"):
            inner["programs"] = req["programs"]
        r = build(inner)
        shutil.move(r["library"], lib_out)
        if req.get("source"):
            with open(req["source"], "w") as f:
                for path in r["sources"]:
                    f.write(f"// ===== {os.path.basename(path)} =====\n")
                    f.write(open(path).read())
                    f.write("\n")
        info = {k: r[k] for k in ("kernels", "workspace_bytes", "workspace", "arch", "name",
                                  "gemm_precision", "extra", "ptxas")}
        info["entry"] = {"init": "lcmac_init", "run": "lcmac_run(A, B, C, workspace, stream)",
                         "last_error": "lcmac_last_error",
                         "workspace_bytes": "lcmac_workspace_bytes"}
        return {"ok": True, "library": lib_out, "entry_points": ["lcmac_run"],
                "target_dict": {"kind": "cuda", "arch": r["arch"]},
                "compiler": {"name": "tilelang+nvcc", "version": getattr(tilelang, "__version__", "?")},
                "config": r["config"], "seconds": r["seconds"], "info": info}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _contract_error(e) -> dict:
    return {"ok": False, "error": {"type": type(e).__name__, "message": str(e),
                                   "traceback": traceback.format_exc()[-6000:]}}


#: ``--serve`` marks each response line with this prefix (TileLang's own output may come between)
SERVE_MARK = "@lcmac-worker@ "


def _failure(e) -> dict:
    """A raw request's failure; the parent turns it into an exception of the same class."""
    return {"ok": False, "error": str(e), "error_type": type(e).__name__,
            "traceback": traceback.format_exc()[-6000:]}


def serve() -> int:
    """``python -m lcmac.targets.tilelang_worker --serve``: one raw request (the module
    docstring's JSON object) per line on stdin, each answered by one line on stdout that
    starts with ``SERVE_MARK``, until stdin closes: many builds for one TileLang import (the
    tests run their code generation through one such process)."""
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            resp = build(json.loads(line))
        except Exception as e:
            resp = _failure(e)
        sys.stdout.write("\n" + SERVE_MARK + json.dumps(resp) + "\n")
        sys.stdout.flush()
    return 0


def main() -> int:
    if "--serve" in sys.argv[1:]:
        return serve()
    try:
        req = json.loads(sys.stdin.read() or "{}")
        if "batch" in req:
            out = []
            for r in req["batch"]:
                try:
                    out.append(build_contract(r))
                except Exception as e:
                    out.append(_contract_error(e))
            resp = {"ok": True, "batch": out}
        elif "version" in req:
            try:
                resp = build_contract(req)
            except Exception as e:
                resp = _contract_error(e)
        else:
            resp = build(req)
    except Exception as e:
        resp = _failure(e)
    # TileLang logs to stdout/stderr; the response is the last line of stdout
    sys.stdout.write("\n" + json.dumps(resp) + "\n")
    sys.stdout.flush()
    return 0 if resp.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
