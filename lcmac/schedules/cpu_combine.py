"""CPU combine templates (FalconGEMM Algorithm 2's group-parallel Combine A / Combine B, and
Algorithm 1's Combine H): every input block element is read once per pass and all outputs
of its group are written in the same pass, from the CSE'd straight-line program with its
coefficients as literals.  Combine A / B write the GEMM's packed layouts, so they are the
packing passes too (the plain GEMM is the 1×1×1 case: packing only)."""
from __future__ import annotations

from contextlib import nullcontext

from lcmac.core.dtypes import ITEMSIZE
from lcmac.schedules.cpu_gemm import (
    CACHE_LINE, Geometry, Writer, linear_expr, packed_offset, packed_stride, whole_chunk)

#: Streaming the packed operands out (config knob ``stream``): a line of 64 bytes copied from
#: a local staging buffer with non-temporal stores, and the fence that makes a task's
#: streamed lines visible to the other threads before it reports done (x86 orders
#: non-temporal stores only by a fence: ``fence seq_cst`` is ``mfence``).  Written stores
#: of packed lines that are evicted before the GEMM stage reads them cost a read for
#: ownership each (a third of a combine's traffic); streamed ones do not.  Linked into the
#: module through TVM's ``pragma_import_llvm`` like cpu_gemm's ``DPBF16_LL``.
STREAM_FN, FENCE_FN = "lcmac_stream_line", "lcmac_stream_fence"
STREAM_LL = (
    f"define void @{STREAM_FN}(ptr %dst, ptr %src) alwaysinline {{\n"
    "  %s1 = getelementptr inbounds i8, ptr %src, i64 32\n"
    "  %a = load <8 x i32>, ptr %src, align 4\n"
    "  %b = load <8 x i32>, ptr %s1, align 4\n"
    "  %d1 = getelementptr inbounds i8, ptr %dst, i64 32\n"
    "  store <8 x i32> %a, ptr %dst, align 32, !nontemporal !0\n"
    "  store <8 x i32> %b, ptr %d1, align 32, !nontemporal !0\n"
    "  ret void\n}\n"
    f"define void @{FENCE_FN}() alwaysinline {{\n  fence seq_cst\n  ret void\n}}\n"
    "!0 = !{i32 1}\n")


def streams(chunk_elems: int, dtype: str) -> bool:
    """Whether chunks of this many elements, at offsets that are multiples of it in a packed
    buffer (64-byte aligned, r-stride a whole number of lines), are whole aligned lines."""
    return chunk_elems * ITEMSIZE[dtype] % CACHE_LINE == 0


def _stream_out(w: Writer, n_out: int, elems: int, dtype: str, buf: str, stride: int, offset) -> None:
    """Each output o's staged ``ys[o, 0:elems]`` to ``buf[o, offset(line)]`` (``stride``
    elements per o), a line at a time.  The pointers are ``tvm_access_ptr`` with the line's
    extent: from ``address_of`` an element, TVM takes the element for all the call touches
    and may shrink the buffer to what it sees touched (a packed buffer read whole by no
    later stage, timed alone, then crashed)."""
    per = CACHE_LINE // ITEMSIZE[dtype]
    ptr = f"T.tvm_access_ptr(T.type_annotation(\"{dtype}\"), {{}}.data, {{}}, {per}, {{}})"
    w(f"for o in range({n_out}):")
    with w.indent():
        w(f"for ln in range({elems // per}):")
        with w.indent():
            dst = ptr.format(buf, f"o * {stride} + " + offset(f"ln * {per}"), 2)
            src = ptr.format("ys", f"o * {elems} + ln * {per}", 1)
            w(f"T.evaluate(T.call_extern(\"void\", \"{STREAM_FN}\", {dst}, {src}))")


def _stream_module(w: Writer, on: bool):
    """Statements written inside are wrapped in the link of STREAM_LL (when on)."""
    return w.block(f"with T.attr(0, \"pragma_import_llvm\", {STREAM_LL!r}):") if on else nullcontext()


def _fence(w: Writer) -> None:
    w(f"T.evaluate(T.call_extern(\"void\", \"{FENCE_FN}\"))")


def _used_inputs(prog) -> list[int]:
    used = set()
    for e in prog.temps + prog.outputs:
        for _, s in e:
            if s < prog.n_inputs:
                used.add(s)
    return sorted(used)


def bf16_bits(x: str) -> str:
    """TVMScript: the bf16 bit pattern of the float32 ``x`` in the low half of a uint32,
    rounded to nearest even, NaN kept quiet.  Written out (not a cast to bfloat16) because the
    packed operands of the dot-product kernel are int32 pairs: TVM 0.25's bf16 legalisation
    rejects int32 views of, or pointers into, a bf16 buffer."""
    bits = f"T.reinterpret(\"uint32\", {x})"
    rne = f"({bits} + T.uint32(32767) + (({bits} >> T.uint32(16)) & T.uint32(1))) >> T.uint32(16)"
    return f"T.Select(T.isnan({x}), T.uint32(32704), {rne})"


def _emit_program(w: Writer, prog, dtype: str, vl: int, var: str, load, store,
                  pairs: bool = False, bits16: bool = False) -> None:
    """Loads of the used inputs into xin, temporaries into tmp, outputs stored: each a
    vectorised statement over ``var`` (no let-bindings: see cpu_gemm's note).

    ``pairs``: the program runs twice, for the two k values of a pair (``load(s, e)``,
    e = 0, 1, into xin[e] / tmp[e]); each output is stored as one int32 holding both values
    rounded once to bf16 (k even in the low half: the order vdpbf16ps pairs them in).
    ``bits16``: each output is stored as its bf16 bit pattern (uint16), rounded once."""
    used = _used_inputs(prog)
    slot = {s: i for i, s in enumerate(used)}
    nt = len(prog.temps)
    halves = (0, 1) if pairs else (None,)

    def namer(e):
        pre = "" if e is None else f"{e}, "

        def name(s):
            if s < prog.n_inputs:
                return f"xin[{pre}{slot[s]}, {var}]"
            return f"tmp[{pre}{s - prog.n_inputs}, {var}]"
        return name

    for e in halves:
        pre = "" if e is None else f"{e}, "
        for s in used:
            w(f"for {var} in T.vectorized({vl}):")
            with w.indent():
                w(f"xin[{pre}{slot[s]}, {var}] = {load(s) if e is None else load(s, e)}")
        for t, ex in enumerate(prog.temps):
            w(f"for {var} in T.vectorized({vl}):")
            with w.indent():
                w(f"tmp[{pre}{t}, {var}] = {linear_expr(ex, namer(e), dtype)}")
    for o, ex in enumerate(prog.outputs):
        w(f"for {var} in T.vectorized({vl}):")
        with w.indent():
            if pairs:
                for e in halves:
                    w(f"yo[{e}, {var}] = {linear_expr(ex, namer(e), dtype)}")
                w(f"{store(o)} = T.reinterpret(\"int32\", {bf16_bits(f'yo[0, {var}]')} | "
                  f"({bf16_bits(f'yo[1, {var}]')} << T.uint32(16)))")
            elif bits16:
                w(f"yo[0, {var}] = {linear_expr(ex, namer(None), dtype)}")
                w(f"{store(o)} = T.Cast(\"uint16\", {bf16_bits(f'yo[0, {var}]')})")
            else:
                w(f"{store(o)} = {linear_expr(ex, namer(None), dtype)}")
    return len(used), nt


def _decl_locals(w: Writer, prog, dtype: str, vl: int, pairs: bool = False,
                 bits16: bool = False) -> None:
    pre = "2, " if pairs else ""
    w(f"xin = T.decl_buffer(({pre}{max(1, len(_used_inputs(prog)))}, {vl}), \"{dtype}\", scope=\"local\")")
    if prog.temps:
        w(f"tmp = T.decl_buffer(({pre}{len(prog.temps)}, {vl}), \"{dtype}\", scope=\"local\")")
    if pairs or bits16:
        w(f"yo = T.decl_buffer((2, {vl}), \"{dtype}\", scope=\"local\")")


def needs_pad(g: Geometry, side: str) -> bool:
    """Whether an operand's blocks are not whole padded tiles (then it is copied into a
    zero-padded buffer first)."""
    if side == "A":
        rows = any(g.rows(i) != g.BMP for i in range(g.m)) and not g.row_tail
        return rows or any(g.cols_k(l) != g.BKP for l in range(g.k))
    return any(g.cols_k(l) != g.BKP for l in range(g.k)) or any(g.cols(j) != g.BNP for j in range(g.n))


def emit_pad(w: Writer, src: str, dst: str, nbr: int, nbc: int, rows, cols, BR: int, BC: int,
             PR: int, PC: int, zero: str) -> None:
    """dst[bi·PR + x, bj·PC + y] = src[bi·BR + x, bj·BC + y] on the valid part of each block,
    zero elsewhere, with static loop bounds only.  (Masked loads in the combine were tried:
    TVM simplifies an index clamp inside ``T.Select`` using the select's condition although
    both arms are evaluated, so the clamp vanished and padded lanes read out of bounds.)"""
    w(f"# zero-pad {src} into {dst} (shape not a whole number of tiles)")
    for bi in range(nbr):
        for bj in range(nbc):
            r, c = max(0, rows(bi)), max(0, cols(bj))
            if c == 0:
                r = 0       # a block with no valid column (N < n, K < k) is zeros, all rows
            if r > 0 and c > 0:
                w(f"for x in T.parallel({r}):")
                with w.indent():
                    w(f"for y in range({c}):")
                    with w.indent():
                        w(f"{dst}[{bi * PR} + x, {bj * PC} + y] = {src}[{bi * BR} + x, {bj * BC} + y]")
                    if c < PC:
                        w(f"for y in range({PC - c}):")
                        with w.indent():
                            w(f"{dst}[{bi * PR} + x, {bj * PC + c} + y] = {zero}")
            if r < PR:
                w(f"for x in T.parallel({PR - r}):")
                with w.indent():
                    w(f"for y in range({PC}):")
                    with w.indent():
                        w(f"{dst}[{bi * PR + r} + x, {bj * PC} + y] = {zero}")


def _load(src: str, row: str, col: str, dtype: str, src_dtype: str | None) -> str:
    x = f"{src}[{row}, {col}]"
    return x if src_dtype in (None, dtype) else f"T.Cast(\"{dtype}\", {x})"


def emit_combine_a(w: Writer, g: Geometry, prog, mr: int, dtype: str, src_dtype: str | None = None,
                   padded: bool = False, pair: bool = False, amx: bool = False,
                   stream: bool = False) -> None:
    """Ãp[r, p, kk, 0:mr] for all r from one read of the m·k blocks' rows p·mr.. at column kk
    (from ``Apad`` when the shape needed padding).  A narrower ``src_dtype`` (bf16) is
    widened on load: the combine is computed in ``dtype``.  ``pair``: the bf16 dot-product
    layout (int32 ``Ap32[r, p, kk/2, 0:mr]``, a bf16 k pair per element), rounded once.
    ``amx``: the AMX layout (uint16 ``Ap16[r, p, kk/32, 0:mr, 0:32]``, bf16 bits), rounded once.
    ``stream``: Ãp written with non-temporal stores (``STREAM_LL``) where its chunks are
    whole lines, else as usual."""
    if amx:
        _combine_a_amx(w, g, prog, mr, dtype, src_dtype, padded)
        return
    if pair:
        _combine_a_pairs(w, g, prog, mr, dtype, src_dtype, padded)
        return
    # The program reads one column of mr rows of every input block at a time: m·k·mr rows,
    # at square power-of-two sizes a multiple of 4 KB apart, so read column by column they
    # share one L1 set (and few L2 sets) and every element missed both.  Each row's next kt
    # columns (a cache line at kt = 16 fp32) are first copied into the local At, and the
    # program reads At.
    kt = whole_chunk(g.BKP)
    stream = stream and streams(kt * mr, dtype)
    slot = {s: n for n, s in enumerate(_used_inputs(prog))}
    n_out = len(prog.outputs)

    def store(o):
        # streamed: the kt·mr elements an output gets per ko are staged, then go out as lines
        if stream:
            return f"ys[{o}, ki * {mr} + v]"
        return f"Ap[{o}, " + packed_offset("p", f"ko * {kt} + ki", "v", g.BKP, mr) + "]"

    w("# Combine A (group-parallel, packs Ãp" + (", streamed)" if stream else ")"))
    with _stream_module(w, stream):
        for loop, clamp in _panel_loops(g, mr, padded):
            w(loop)
            with w.indent():
                _decl_locals(w, prog, dtype, mr)
                w(f"At = T.decl_buffer(({len(slot)}, {mr}, {kt}), \"{dtype}\", scope=\"local\")")
                if stream:
                    w(f"ys = T.decl_buffer(({n_out}, {kt * mr}), \"{dtype}\", scope=\"local\")")
                w(f"for ko in range({g.BKP // kt}):")
                with w.indent():
                    for s, n in slot.items():
                        src = _a_element(g, s, mr, f"ko * {kt} + u", dtype, src_dtype, padded, clamp)
                        w(f"for v in range({mr}):")
                        with w.indent():
                            w(f"for u in T.vectorized({kt}):")
                            with w.indent():
                                w(f"At[{n}, v, u] = {src}")
                    w(f"for ki in range({kt}):")
                    with w.indent():
                        _emit_program(w, prog, dtype, mr, "v", lambda s: f"At[{slot[s]}, v, ki]", store)
                    if stream:
                        _stream_out(w, n_out, kt * mr, dtype, "Ap",
                                    packed_stride(g.BMP // mr, g.BKP, mr, ITEMSIZE[dtype]),
                                    lambda e: packed_offset("p", f"ko * {kt}", e, g.BKP, mr))
                if stream:
                    _fence(w)


def _panel_loops(g: Geometry, mr: int, padded: bool) -> list[tuple[str, bool]]:
    """Combine A's loops over the mr-row panels of Ãp, (loop header, clamp rows).  A row
    tail (``Geometry.row_tail``) splits off its last panels, whose padded rows read a
    clamped row of A: their values only reach rows of C that are never stored."""
    full = g.BMP // mr
    if padded or not g.row_tail:
        return [(f"for p in T.parallel({full}):", False)]
    whole = g.BM // mr
    return [(f"for p in T.parallel({whole}):", False),
            (f"for p in range({whole}, {full}):", True)]


def _a_row(g: Geometry, i: int, mr: int, clamp: bool) -> str:
    row = f"{i * g.BM} + p * {mr} + v"
    return f"T.min({row}, {i * g.BM + g.BM - 1})" if clamp else row


def _a_element(g: Geometry, s: int, mr: int, col: str, dtype: str, src_dtype: str | None,
               padded: bool, clamp: bool) -> str:
    """Row v of panel p, column ``col`` (within the block) of A's block s, widened to
    ``dtype``: from ``Apad`` when the shape needed padding, else from A (rows clamped in a
    row tail's panels)."""
    i, l = divmod(s, g.k)
    if padded:
        return _load("Apad", f"{i * g.BMP} + p * {mr} + v", f"{l * g.BKP} + {col}", dtype, src_dtype)
    return _load("A", _a_row(g, i, mr, clamp), f"{l * g.BK} + {col}", dtype, src_dtype)


def _combine_a_pairs(w: Writer, g: Geometry, prog, mr: int, dtype: str, src_dtype: str,
                     padded: bool) -> None:
    w("# Combine A (group-parallel, packs Ãp as bf16 k pairs for vdpbf16ps, rounded once)")
    for loop, clamp in _panel_loops(g, mr, padded):
        w(loop)
        with w.indent():
            _decl_locals(w, prog, dtype, mr, pairs=True)
            w(f"for kp in range({g.BKP // 2}):")
            with w.indent():
                def load(s, e, clamp=clamp):
                    return _a_element(g, s, mr, f"kp * 2 + {e}", dtype, src_dtype, padded, clamp)
                _emit_program(w, prog, dtype, mr, "v", load,
                              lambda o: f"Ap32[{o}, " + packed_offset("p", "kp", "v", g.BKP // 2, mr) + "]",
                              pairs=True)


def _combine_a_amx(w: Writer, g: Geometry, prog, mr: int, dtype: str, src_dtype: str,
                   padded: bool) -> None:
    # a row's 32 consecutive k values are one contiguous load and one contiguous 64-byte
    # store (one AMX tile row); in memory, bf16 k pairs sit in the order tdpbf16ps pairs them
    kt = 32
    w("# Combine A (group-parallel, packs Ãp as bf16 rows of 32 k for AMX, rounded once)")
    for loop, clamp in _panel_loops(g, mr, padded):
        w(loop)
        with w.indent():
            _decl_locals(w, prog, dtype, kt, bits16=True)
            w(f"for v in range({mr}):")
            with w.indent():
                w(f"for kq in range({g.BKP // kt}):")
                with w.indent():
                    def load(s, clamp=clamp):
                        return _a_element(g, s, mr, f"kq * {kt} + u", dtype, src_dtype, padded, clamp)
                    _emit_program(w, prog, dtype, kt, "u", load,
                                  lambda o: f"Ap16[{o}, ((p * {g.BKP // kt} + kq) * {mr} + v) * {kt} + u]",
                                  bits16=True)


def _combine_b_pairs(w: Writer, g: Geometry, prog, nr: int, dtype: str, src_dtype: str,
                     padded: bool, qb: int) -> None:
    # rows 2·qp and 2·qp + 1 are read as two contiguous vectors; the pair goes out as one
    # contiguous int32 vector
    w("# Combine B (group-parallel, packs B̃p as bf16 k pairs for vdpbf16ps, rounded once)")
    w(f"for qo in T.parallel({g.BKP // qb}):")
    with w.indent():
        _decl_locals(w, prog, dtype, nr, pairs=True)
        w(f"for jr in range({g.BNP // nr}):")
        with w.indent():
            w(f"for qi in range({qb // 2}):")
            with w.indent():
                def load(s, e):
                    l, j = divmod(s, g.n)
                    q = f"qo * {qb} + qi * 2 + {e}"
                    if padded:
                        return _load("Bpad", f"{l * g.BKP} + {q}", f"{j * g.BNP} + jr * {nr} + u",
                                     dtype, src_dtype)
                    return _load("B", f"{l * g.BK} + {q}", f"{j * g.BN} + jr * {nr} + u", dtype, src_dtype)
                _emit_program(w, prog, dtype, nr, "u", load,
                              lambda o: f"Bp32[{o}, " + packed_offset("jr", f"qo * {qb // 2} + qi", "u",
                                                                     g.BKP // 2, nr) + "]",
                              pairs=True)


def emit_combine_b(w: Writer, g: Geometry, prog, nr: int, dtype: str, src_dtype: str | None = None,
                   padded: bool = False, pair: bool = False, stream: bool = False) -> None:
    """B̃p[r, jr, q, 0:nr] for all r from one read of the k·n blocks' row q.  Rows are taken
    in blocks of qb, panel by panel: each panel then receives qb·nr contiguous elements
    at a time (row by row, the stores of one row hit BNP/nr panels whose addresses differ
    by a large power of two: the same cache set, evicted before the lines fill).
    ``stream``: B̃p written with non-temporal stores where a row's nr elements are whole
    lines, else as usual."""
    qb = whole_chunk(g.BKP)
    if pair:    # BKP is even on this path (kc is a multiple of an even ku), so qb is too
        _combine_b_pairs(w, g, prog, nr, dtype, src_dtype, padded, qb)
        return
    stream = stream and streams(nr, dtype)
    n_out = len(prog.outputs)
    w("# Combine B (group-parallel, packs B̃p" + (", streamed)" if stream else ")"))
    with _stream_module(w, stream):
        w(f"for qo in T.parallel({g.BKP // qb}):")
        with w.indent():
            _decl_locals(w, prog, dtype, nr)
            if stream:
                w(f"ys = T.decl_buffer(({n_out}, {nr}), \"{dtype}\", scope=\"local\")")
            w(f"for jr in range({g.BNP // nr}):")
            with w.indent():
                w(f"for qi in range({qb}):")
                with w.indent():
                    q = f"qo * {qb} + qi"

                    def load(s):
                        l, j = divmod(s, g.n)
                        if padded:
                            return _load("Bpad", f"{l * g.BKP} + {q}", f"{j * g.BNP} + jr * {nr} + u", dtype, src_dtype)
                        return _load("B", f"{l * g.BK} + {q}", f"{j * g.BN} + jr * {nr} + u", dtype, src_dtype)

                    # streamed: a row's nr elements of each output are staged, then go out as lines
                    _emit_program(w, prog, dtype, nr, "u", load,
                                  lambda o: f"ys[{o}, u]" if stream else
                                  f"Bp[{o}, " + packed_offset("jr", q, "u", g.BKP, nr) + "]")
                    if stream:
                        _stream_out(w, n_out, nr, dtype, "Bp",
                                    packed_stride(g.BNP // nr, g.BKP, nr, ITEMSIZE[dtype]),
                                    lambda e: packed_offset("jr", q, e, g.BKP, nr))
            if stream:
                _fence(w)


def emit_combine_h(w: Writer, g: Geometry, prog, vl: int, dtype: str, cbuf: str,
                   crow: int, ccol: int) -> None:
    """Algorithm 1's Combine H: C_ij rows x from every stored H_r row x (the ``crow`` rows
    of a block of ``cbuf``: C's valid rows, or the workspace's padded ones)."""
    w("# Combine H (unfused path)")
    w(f"for x in T.parallel({crow}):")
    with w.indent():
        _decl_locals(w, prog, dtype, vl)
        w(f"for zb in range({g.BNP // vl}):")
        with w.indent():
            def store(o):
                i, j = divmod(o, g.n)
                return f"{cbuf}[{i * crow} + x, {j * ccol} + zb * {vl} + u]"
            _emit_program(w, prog, dtype, vl, "u", lambda s: f"H[{s}, x, zb * {vl} + u]", store)


def emit_crop(w: Writer, g: Geometry, out_dtype: str | None = None) -> None:
    """Copy the valid part of the padded C workspace into C (non-whole-tile shapes, and
    bf16 output: accumulated in the fp32 workspace, rounded once here)."""
    w("# crop the padded C workspace into C")
    for i in range(g.m):
        for j in range(g.n):
            rows, cols = g.rows(i), g.cols(j)
            if rows <= 0 or cols <= 0:
                continue
            w(f"for x in T.parallel({rows}):")
            with w.indent():
                w(f"for z in range({cols}):")
                with w.indent():
                    val = f"Cw[{i * g.BMP} + x, {j * g.BNP} + z]"
                    if out_dtype:
                        val = f"T.Cast(\"{out_dtype}\", {val})"
                    w(f"C[{i * g.BM} + x, {j * g.BN} + z] = {val}")
