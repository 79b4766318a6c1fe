"""The CPU LCMA kernel: Combine A, Combine B, GEMM stage with fused Combine H (Algorithm 2)
or stored H + Combine H pass (Algorithm 1), as a TensorIR module in TVMScript text: Combine B
and the rest are two subroutines, so B can be combined once (a weight) and reused.

``generate`` is pure Python; the compiler worker parses and compiles its output.  A plain
GEMM is the 1×1×1 algorithm through the same template (packing + micro-kernel).
"""
from __future__ import annotations

from lcmac.core.dtypes import ITEMSIZE
from lcmac.core.errors import DTypeError, ShapeError, TargetError
from lcmac.ir.algorithm import Algorithm
from lcmac.ir.cse import optimized_programs
from lcmac.ir.program import LinearProgram, combine_matrices, naive_program
from lcmac.schedules.cpu_gemm_blocked import (
    block_rows, emit_blocked_gemm, row_origin, rows_guard, shares_b, why_not as blocked_why_not,
    workspace_bytes as blocked_workspace)
from lcmac.schedules.cpu_combine import (
    emit_combine_a, emit_combine_b, emit_combine_h, emit_crop, emit_pad, needs_pad)
from lcmac.schedules import cpu_vendor
from lcmac.spec.cpu.config import CpuConfig
from lcmac.spec.shape_rules import PIECE_UNITS
from lcmac.schedules.cpu_memory import emit_workspace
from lcmac.schedules.cpu_gemm import (
    DOT_LANES, DPBF16_LL, Writer, amx_kernel, amx_ll, emit_chunk_store, emit_gemm_stage, geometry,
    packed_stride)

ENTRY = "lcmac_matmul"
#: suffixes of the prepared-B entry points (``generate``)
PREPARE_B, PREPARED = "_prepare_b", "_prepared"
#: a piece kernel's last argument (``generate``): 0 writes C, 1 adds the product into it
PIECE_FLAG = "accumulate"
#: a piece kernel's run-time row count (A's and C's rows) and depth (A's columns, B's rows),
#: bound from their shapes
PIECE_ROWS, PIECE_DEPTH = "m_rows", "k_depth"


def programs_for(alg) -> dict:
    """The CSE'd straight-line programs (falls back to the naive ones)."""
    try:
        return optimized_programs(alg)
    except ImportError:
        mats = combine_matrices(alg)
        return {s: naive_program(mats[s]) for s in ("A", "B", "H")}


def generate(alg, dtype: str, M: int, N: int, K: int, cfg: CpuConfig, programs=None,
             entry: str = ENTRY, features=(), piece: bool = False) -> tuple[str, dict]:
    """(TVMScript source of a module with ``entry(A, B, C)`` and the prepared-B pair
    ``entry_prepare_b(B, Bp)`` / ``entry_prepared(A, Bp, C)``, info dict with the geometry and
    the prepared buffer's shape and dtype).  ``features``:
    the LLVM target's CPU features that select a kernel (``avx512bf16``: bf16 GEMM stage on
    ``vdpbf16ps``).

    ``piece``: instead, one entry ``entry(A, B, C, accumulate)`` for a piece of a larger
    product (the any-shape bundle, ``lcmac.runtime.bundle_pieces``): A, B and C may be views
    with a row stride (their rows need not be contiguous with each other), and
    ``accumulate`` = 1 adds A·B into C.  A and C have any number of rows up to M that is a
    multiple of the grid's m (``PIECE_ROWS``, a run-time value: the outer loops skip the
    rest), A's columns and B's rows any depth up to K that is k whole ``PIECE_UNITS`` steps
    (``PIECE_DEPTH``: the k loops run that far).  It needs C written only by the tile stores (fused Combine H, no workspace, no
    zero padding) and A and B packed per block (``CpuConfig.bands``): ShapeError says which
    is missing."""
    if dtype not in ("float32", "float64", "bfloat16"):
        raise DTypeError(f"the CPU backend does not support {dtype} yet (float32, float64, bfloat16 do)")
    # bf16 contract: A, B, C bf16; combines computed in fp32; C accumulated in fp32 (a
    # workspace) and rounded to bf16 once.  GEMM stage: with AVX512-BF16, Ã_r and B̃_r are
    # rounded to bf16 once when packed (so an LCMA adds one bf16 rounding of each combined
    # operand over a plain GEMM) and multiplied by vdpbf16ps into fp32; without it they stay
    # fp32 (exact for the GEMM, one fp32 rounding for an LCMA) and plain FMAs multiply them.
    acc = "float32" if dtype == "bfloat16" else dtype
    src_dtype = dtype
    bf16_dot = dtype == "bfloat16" and "avx512bf16" in set(features) and cfg.bf16_dot
    amx = amx_kernel(dtype, cfg, features)     # the GEMM stage on Intel AMX tiles
    if bf16_dot and (cfg.ku % 2 or cfg.nr % DOT_LANES):
        raise TargetError(f"the bf16 dot-product kernel needs an even ku and nr a multiple of "
                         f"{DOT_LANES} (config ku={cfg.ku}, nr={cfg.nr})")
    pack = dtype if bf16_dot or amx else acc        # element type of the packed Ãp / B̃p
    progs = programs or programs_for(alg)
    R = alg.R
    g = geometry(alg.grid, M, N, K, cfg)
    isz = ITEMSIZE[dtype]
    # TIR indices here are 32-bit: refuse what would overflow rather than miscompute
    sa = packed_stride(g.BMP // cfg.mr, g.BKP, cfg.mr, ITEMSIZE[pack])
    sb = packed_stride(g.BNP // cfg.nr, g.BKP, cfg.nr, ITEMSIZE[pack])
    biggest = max(M * K, K * N, M * N, R * sa, R * sb, g.m * g.BMP * g.n * g.BNP,
                  0 if cfg.fused else R * g.BMP * g.BNP)
    if biggest >= 2 ** 31:
        raise ShapeError(f"{M}x{N}x{K} with {alg.name} needs a buffer of {biggest} elements; "
                         "the CPU backend's 32-bit indexing is not supported past 2^31 yet")
    # B̃p as the entry points see it: with bf16_dot, int32 elements = k pairs of bf16
    bp_name, bp_shape, bp_dtype = (("Bp32", (R, sb // 2), "int32") if bf16_dot or amx
                                   else ("Bp", (R, sb), pack))
    pad_a, pad_b = needs_pad(g, "A"), needs_pad(g, "B")
    zero = f"T.{dtype}(0.0)" if dtype != "bfloat16" else "T.Cast(\"bfloat16\", T.float32(0.0))"
    decl = {"A": f"({M}, {K}), \"{dtype}\"", "B": f"({K}, {N}), \"{dtype}\"",
            "C": f"({M}, {N}), \"{dtype}\"", bp_name: f"{bp_shape}, \"{bp_dtype}\""}
    align = {"A": isz, "B": isz, "C": isz, bp_name: 64}
    direct = g.direct_c and acc == dtype
    # A and B packed block by block in the tasks, an LCMA's combination fused into that
    # packing (cpu_gemm_blocked), where the shape needs no zero padding; else the packing
    # (combine) passes below
    not_blocked = cfg.bands and blocked_why_not(g, R, acc, dtype, bf16_dot or amx)
    blocked = bool(cfg.bands) and not not_blocked
    if piece:
        missing = [what for what, ok in (
            ("C written directly (float32 or float64; N whole nr tiles per block)", direct),
            ("fused Combine H", cfg.fused or R == 1),
            ("no zero padding (M, N and K whole blocks of the grid; k whole ku steps)", not (pad_a or pad_b)),
            (f"ku dividing {PIECE_UNITS['K']} (its depth is a run-time multiple of that)", PIECE_UNITS["K"] % cfg.ku == 0))
            if not ok]
        if not missing and not blocked:
            missing = [f"A and B packed per block (config knob bands: {not_blocked or 'bands=0'})"]
        if missing:
            raise ShapeError(f"a piece kernel of {alg.name} at {M}x{N}x{K} needs {'; '.join(missing)}")
    overwrite = f"{PIECE_FLAG} == 0" if piece else None
    rows, depth = (PIECE_ROWS, PIECE_DEPTH) if piece else (None, None)
    if blocked and R > 1:
        # the packing sums each product's blocks directly (no shared partial sums), by these
        # programs; Combine B of the prepared-B pair runs the same one: the same bits
        mats = combine_matrices(alg)
        progs = {**progs, "A": naive_program(mats["A"]), "B": naive_program(mats["B"])}

    def emit_combine_b_side(w):
        """Combine B (after zero-padding B where needed) into the buffer named bp_name."""
        if pad_b:
            emit_workspace(w, "Bpad", (g.k * g.BKP, g.n * g.BNP), dtype)
            emit_pad(w, "B", "Bpad", g.k, g.n, g.cols_k, g.cols, g.BK, g.BN, g.BKP, g.BNP, zero)
        # a blocked LCMA's B̃p (its prepared entry's, a weight's) is read back from memory
        # anyway: streamed, without the reads for ownership
        emit_combine_b(w, g, progs["B"], cfg.nr, acc, src_dtype, padded=pad_b, pair=bf16_dot or amx,
                       stream=cfg.stream or (blocked and R > 1))

    def emit_rest(w, prepared=False):
        """Combine A, the GEMM stage, Combine H and the crop: everything after Combine B."""
        if blocked and R == 1:
            emit_blocked_gemm(w, g, cfg, dtype, prepared, overwrite=overwrite, rows=rows, depth=depth)
            return
        # packed combined operands: Ãp[r][BMP/mr][BKP][mr], B̃p[r][BNP/nr][BKP][nr], flattened
        # per r with a padded r-stride (packed_stride)
        if blocked:
            pass        # Ã_r packed chunk by chunk in the GEMM stage's tasks
        elif amx:
            # Ã as bf16 bits (uint16), rows of 32 k (cpu_gemm.amx_ll); B̃ as bf16_dot's pairs
            emit_workspace(w, "Ap16", (R, sa), "uint16")
        elif bf16_dot:
            # int32 elements = k pairs of bf16 (sa, sb are even: BKP is); no bf16-typed
            # buffer, see cpu_combine.bf16_bits
            emit_workspace(w, "Ap32", (R, sa // 2), "int32")
        else:
            emit_workspace(w, "Ap", (R, sa), pack)
        if direct:
            cbuf, crow, ccol = "C", g.BM, g.BN
        else:
            cbuf, crow, ccol = "Cw", g.BMP, g.BNP
            emit_workspace(w, "Cw", (g.m * g.BMP, g.n * g.BNP), acc)
        if not cfg.fused:
            emit_workspace(w, "H", (R, g.BMP, g.BNP), acc)
        if pad_a:
            emit_workspace(w, "Apad", (g.m * g.BMP, g.k * g.BKP), dtype)
            emit_pad(w, "A", "Apad", g.m, g.k, g.rows, g.cols_k, g.BM, g.BK, g.BMP, g.BKP, zero)
        if not blocked:
            emit_combine_a(w, g, progs["A"], cfg.mr, acc, src_dtype, padded=pad_a, pair=bf16_dot, amx=amx,
                           stream=cfg.stream)

        # the tile's mc block of rows: the task's (packing ahead) or the band's current one
        origin = row_origin(g, cfg, rows) if blocked else f"tm * {g.MC}"
        tile = "{base} + %s + ir * %d + v, {cbase} + tn * %d + jr * %d + u" % (
            origin, cfg.mr, g.NC, cfg.nr)
        crow_of = (lambda i: i * crow) if rows is None else (lambda i: f"{i} * ({block_rows(g, rows)})")
        # Combine H coefficients, per product r: the C blocks it feeds (W's nonzeros)
        feeds = [[(i, j, alg.W[r, i, j]) for i in range(alg.m) for j in range(alg.n)
                  if alg.W[r, i, j] != 0] for r in range(R)]
        first = {}
        for r in range(R):
            for i, j, _ in feeds[r]:
                first.setdefault((i, j), r)

        def epilogue(w, r):
            if cfg.fused:
                w(f"# fused Combine H: H_{r + 1} into its C blocks, never stored")
                for i, j, c in feeds[r]:
                    dst = f"{cbuf}[" + tile.format(base=crow_of(i), cbase=j * ccol) + "]"
                    emit_chunk_store(w, cfg, g.nkc, dst, c, acc, first[(i, j)] == r, row_guard=guard,
                                     overwrite=overwrite)
            else:
                dst = f"H[{r}, " + tile.format(base=0, cbase=0) + "]"
                emit_chunk_store(w, cfg, g.nkc, dst, 1, acc, True, row_guard=guard)

        # a row tail written straight into C: the padded rows' stores are skipped
        guard = (rows_guard(g, cfg, rows, f"ir * {cfg.mr} + v") if rows is not None else
                 f"{origin} + ir * {cfg.mr} + v < {g.BM}" if direct and g.BMP > g.BM else None)

        if not blocked:        # (the blocked stage names itself)
            w("# GEMM stage" + (" with fused Combine H" if cfg.fused else " (H stored)"))
        # blocks of C that no product feeds are zero (cannot happen for a correct algorithm
        # with full rank, but keep the kernel total)
        # the tile the epilogue will read-modify-write, fetched while the FMAs run: C's for
        # the plain GEMM packed ahead, H_r's when H is stored (an LCMA's fused epilogue
        # writes several C blocks)
        prefetch = None
        prow, pcol = f"{origin} + ir * {cfg.mr} + v", f"tn * {g.NC} + jr * {cfg.nr}"
        if R == 1 and cfg.fused:
            prefetch = f"{cbuf}[{prow}, {pcol} + {{}}]"
        elif not cfg.fused:
            prefetch = f"H[r, {prow}, {pcol} + {{}}]"
        if blocked:
            emit_blocked_gemm(w, g, cfg, dtype, prepared, progs, epilogue, prefetch, share_b=not piece, rows=rows, depth=depth)
        elif amx:
            # links the AMX micro-kernel into the LLVM module (see cpu_gemm.amx_ll)
            with w.block(f"with T.attr(0, \"pragma_import_llvm\", {amx_ll(g.KC)!r}):"):
                emit_gemm_stage(w, g, cfg, R, acc, epilogue, prefetch=prefetch, amx=True)
        elif bf16_dot:
            # links the vdpbf16ps wrapper into the LLVM module (see cpu_gemm.DPBF16_LL)
            with w.block(f"with T.attr(0, \"pragma_import_llvm\", {DPBF16_LL!r}):"):
                emit_gemm_stage(w, g, cfg, R, acc, epilogue, prefetch=prefetch, bf16_dot=True)
        else:
            emit_gemm_stage(w, g, cfg, R, acc, epilogue, prefetch=prefetch)
        if not cfg.fused:
            emit_combine_h(w, g, progs["H"], cfg.nr, acc, cbuf, crow, ccol)
        if not direct:
            emit_crop(w, g, None if acc == dtype else dtype)

    w = Writer()
    # Three entry points: ``entry(A, B, C)``; ``entry_prepare_b(B, Bp)``: Combine B alone
    # into a caller-owned B̃p (a weight combined once); ``entry_prepared(A, Bp, C)``: the rest.
    # (The GEMM stage is emitted twice: TVM 0.25 does not lower a subroutine's hoisted local
    # buffers, so the entry points cannot share one.)
    w("@I.ir_module")
    w("class Module:")
    with w.indent():
        if piece:
            # operands as views: each row stride a run-time value bound from the tensor
            w("@T.prim_func")
            w(f"def {entry}(a: T.handle, b: T.handle, c: T.handle, {PIECE_FLAG}: T.int32):")
            with w.indent():
                w(f"T.func_attr({{\"global_symbol\": \"{entry}\", \"tirx.noalias\": True}})")
                w(f"{PIECE_ROWS} = T.int32()")
                w(f"{PIECE_DEPTH} = T.int32()")
                decl["A"] = f"({PIECE_ROWS}, {PIECE_DEPTH}), \"{dtype}\""
                decl["B"] = f"({PIECE_DEPTH}, {N}), \"{dtype}\""
                decl["C"] = f"({PIECE_ROWS}, {N}), \"{dtype}\""
                for p in ("A", "B", "C"):
                    w(f"ld{p.lower()} = T.int32()")
                    w(f"{p} = T.match_buffer({p.lower()}, {decl[p]}, strides=(ld{p.lower()}, 1), "
                      f"align={align[p]})")
                if not blocked:
                    emit_workspace(w, bp_name, bp_shape, bp_dtype)
                    emit_combine_b_side(w)
                emit_rest(w)
        entries = () if piece else ((entry, ("A", "B", "C")), (entry + PREPARE_B, ("B", bp_name)),
                                    (entry + PREPARED, ("A", bp_name, "C")))
        for name, params in entries:
            w("@T.prim_func")
            w(f"def {name}(" + ", ".join(f"{p}: T.Buffer({decl[p]}, align={align[p]})" for p in params)
              + "):")
            with w.indent():
                w(f"T.func_attr({{\"global_symbol\": \"{name}\", \"tirx.noalias\": True}})")
                if name == entry and not blocked:
                    emit_workspace(w, bp_name, bp_shape, bp_dtype)
                if "B" in params and not (blocked and "A" in params):
                    emit_combine_b_side(w)
                if "A" in params:
                    emit_rest(w, prepared=bp_name in params)
    info = {"geometry": g.to_dict(), "direct_c": direct, "entry": entry,
            "padded": {"A": needs_pad(g, "A"), "B": needs_pad(g, "B"), "C": not direct},
            "accumulate": acc,
            "gemm_kernel": "amx" if amx else "vdpbf16ps" if bf16_dot else "fma",
            "packing": "blocked" if blocked else "ahead",
            # per block: whether the bands pack each chunk of B̃_r together or one each
            **({"b_chunks": "shared by the bands" if shares_b(g, cfg, R, False) and not piece else "one per band"}
               if blocked else {}),
            # knob bands asked for and not taken: why (lcmac build says it)
            **({"packing_note": f"bands={cfg.bands} not taken: {not_blocked}; packed ahead"}
               if not_blocked else {}),
            "packed_dtype": pack,
            "workspace_bytes": (blocked_workspace(g, cfg, dtype, R, share_b=not piece) if blocked else ITEMSIZE[pack] * R * (sa + sb))
            + ITEMSIZE[acc] * ((0 if direct else g.m * g.n * g.BMP * g.BNP)
                               + (0 if cfg.fused or (blocked and R == 1) else R * g.BMP * g.BNP))
            + ITEMSIZE[dtype] * ((g.m * g.BMP * g.k * g.BKP if pad_a else 0)
                                 + (g.k * g.BKP * g.n * g.BNP if pad_b else 0)),
            "additions": {s: p.additions for s, p in progs.items()}}
    if piece:
        # rows (A's and C's) and depth (A's columns, B's rows): any multiple of these up to M, K
        info["piece"] = {"arguments": ["A", "B", "C", PIECE_FLAG], "row_strides": True,
                         "rows": {"max": M, "multiple_of": alg.m},
                         "depth": {"max": K, "multiple_of": alg.k * PIECE_UNITS["K"]}}
    else:
        # B combined once: entry + PREPARE_B fills a caller-owned buffer of this shape
        info["prepared_b"] = {"prepare": entry + PREPARE_B, "run": entry + PREPARED,
                              "shape": list(bp_shape), "dtype": bp_dtype}
    return w.text(), info


def lower_request(request: dict, features=()) -> tuple[str, dict]:
    """A compiler-worker request (see ``lcmac.build``) → (TVMScript source, info);
    ``features`` as in ``generate`` (the target module resolves them)."""
    alg = Algorithm.from_dict(request["algorithm"])
    progs = request.get("programs")
    progs = {s: LinearProgram.from_dict(p) for s, p in progs.items()} if progs else None
    shp = request["shape"]
    cfg = CpuConfig.from_dict(request["config"])
    if cfg.vendor_base:
        if request.get("piece"):
            raise TargetError("a piece kernel runs lcmac's own products: config knob vendor_base "
                              "is not for it")
        dtype = request["dtype"]
        lanes = max(1, int(request["target"].get("vector_bits") or 128) // (8 * ITEMSIZE.get(dtype, 4)))
        return cpu_vendor.generate(alg, dtype, shp["M"], shp["N"], shp["K"], progs or programs_for(alg),
                                   lanes, request.get("entry", ENTRY), PREPARE_B, PREPARED)
    return generate(alg, request["dtype"], shp["M"], shp["N"], shp["K"], cfg, programs=progs,
                    entry=request.get("entry", ENTRY), features=features,
                    piece=bool(request.get("piece")))
