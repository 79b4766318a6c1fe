"""CPU GEMM template: block geometry, the register-tiled micro-kernel and its cache blocking.

The templates emit TVMScript (``tvm.script.tirx``) text; the compiler worker parses it.  So
this module never imports apache-tvm, and the generated source can be inspected (coefficients
appear as literals).  Two facts of apache-tvm 0.25 shape the text (measured):

* a let-binding inside a vectorised loop is miscompiled (every lane gets lane 0's value), so
  intermediate values live in small ``local`` buffers, which LLVM promotes to registers;
* buffers are assumed 64-byte aligned unless declared otherwise (aligned vector loads fault
  on numpy's 16-byte-aligned data), so user buffers are declared with the element alignment.

Layouts (written by the combine passes, which are also the packing passes):

    Ãp[r][BMP/mr][BKP][mr]   mr rows of Ã_r interleaved per k (one broadcast each)
    B̃p[r][BNP/nr][BKP][nr]   nr contiguous columns of B̃_r per k (nr/lanes vector loads)

bfloat16 with AVX512-BF16 (``bf16_dot``) packs pairs along k instead (the VNNI layout that
``vdpbf16ps`` reads), rounded to bf16, in int32 buffers ``Ap32``/``Bp32`` (a pair an element):

    Ãp[r][BMP/mr][BKP/2][mr][2]   a row's two k values are one 32-bit broadcast
    B̃p[r][BNP/nr][BKP/2][nr][2]   16 columns × 2 k values = one 512-bit operand

bfloat16 on Intel AMX (``amx``, see ``amx_ll``) keeps that B̃ layout (with nr = 32 it is the
VNNI layout of an AMX B tile) and packs Ã as rows of 32 k, bf16 bits in a uint16 buffer:

    Ãp[r][BMP/32][BKP/32][32][32]  one row's 32 k values = one 64-byte AMX tile row

Shapes the grid or the tiles do not divide are **padded**, never predicated in the inner
loops (a predicate there costs ~4x): blocks are BM = ceil(M/m) (and BK, BN) rounded up to
whole cache tiles; the combine passes write zeros into the padding (their loads are masked,
which is cheap in a memory-bound pass), so the GEMM stage runs whole tiles only.  When C's
blocks are not whole tiles the GEMM writes a padded C workspace and a crop pass copies the
valid part out (one extra pass over C, only for such shapes).  Peeling would avoid that
copy but multiply the generated code by the number of edge cases, for R products each.
"""
from __future__ import annotations

from contextlib import ExitStack, nullcontext
from dataclasses import dataclass
from fractions import Fraction

from lcmac.core.dtypes import ITEMSIZE
from lcmac.core.errors import DTypeError, TargetError
from lcmac.spec.cpu.config import CpuConfig, tile_for_count


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _tile(extent: int, want: int, unit: int) -> tuple[int, int, int]:
    """(tile, count, padded extent): ``count`` tiles of ``tile`` (a multiple of ``unit``, at
    most about ``want``) covering ``extent`` with the least padding."""
    want = max(unit, want - want % unit)
    count = max(1, _ceil(extent, want))
    tile = tile_for_count(extent, unit, count)
    return tile, count, tile * count


@dataclass(frozen=True)
class Geometry:
    M: int
    N: int
    K: int
    m: int
    k: int
    n: int
    BM: int        # logical block sizes (A is padded with zeros to m·BM × k·BK)
    BK: int
    BN: int
    MC: int        # effective tiles
    NC: int
    KC: int
    nmc: int
    nnc: int
    nkc: int
    BMP: int       # padded block extents, whole tiles
    BNP: int
    BKP: int

    def rows(self, i: int) -> int:
        """Valid rows of block row i (≤ 0: the block is all padding)."""
        return min(self.BM, self.M - i * self.BM)

    def cols_k(self, l: int) -> int:
        return min(self.BK, self.K - l * self.BK)

    def cols(self, j: int) -> int:
        return min(self.BN, self.N - j * self.BN)

    @property
    def row_tail(self) -> bool:
        """Every block row has BM valid rows, but whole mr-row tiles pad it to BMP.  Row x of
        Ã_r only feeds row x of H_r and of C, so the padded rows need no zeros: Combine A
        reads a clamped row there, the GEMM computes rows nobody stores, and the epilogue
        writes C directly with a row test (no A copy, no C workspace, no crop: at 4096 with
        mr = 6 those passes cost several percent)."""
        return self.BMP > self.BM and self.M == self.m * self.BM

    @property
    def direct_c(self) -> bool:
        """The GEMM writes C itself (no workspace, no crop): C's columns are whole tiles and
        its rows are, or are a row tail (stores row-tested)."""
        return (self.BNP == self.BN and self.M == self.m * self.BM
                and self.N == self.n * self.BN)

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def geometry(grid: tuple[int, int, int], M: int, N: int, K: int, cfg: CpuConfig) -> Geometry:
    m, k, n = grid
    BM, BK, BN = _ceil(M, m), _ceil(K, k), _ceil(N, n)
    MC, nmc, BMP = _tile(BM, cfg.mc, cfg.mr)
    NC, nnc, BNP = _tile(BN, cfg.nc, cfg.nr)
    # the AMX kernel walks k in 32-wide steps (a tile row holds 32 bf16)
    KC, nkc, BKP = _tile(BK, cfg.kc, AMX_K if cfg.amx else cfg.ku)
    return Geometry(M, N, K, m, k, n, BM, BK, BN, MC, NC, KC, nmc, nnc, nkc, BMP, BNP, BKP)


#: bytes in a cache line (x86 and the AArch64 cores targeted): packed-buffer padding, tile
#: prefetches, streamed stores
CACHE_LINE = 64


def whole_chunk(extent: int) -> int:
    """The largest of 16, 8, 4, 2, 1 elements that divides ``extent``: the chunk a pass stages
    or copies at a time (16 fp32 = a cache line)."""
    return next(b for b in (16, 8, 4, 2, 1) if extent % b == 0)


def packed_stride(panels: int, BKP: int, width: int, itemsize: int) -> int:
    """Elements between consecutive r in a packed buffer [R][panels·BKP·width]: padded by one
    cache line so that the R streams a combine pass writes at once do not all map to the
    same cache set (their natural distance is a large power of two)."""
    return panels * BKP * width + CACHE_LINE // itemsize


def packed_offset(panel: str, k: str, lane: str, BKP: int, width: int) -> str:
    return f"(({panel}) * {BKP} + {k}) * {width} + {lane}"


class Writer:
    """Indented TVMScript text."""

    def __init__(self):
        self.lines: list[str] = []
        self.depth = 0

    def __call__(self, line: str) -> "Writer":
        self.lines.append("    " * self.depth + line)
        return self

    def block(self, header: str):
        """``header`` (a ``for``/``if`` line), then the body indented under it."""
        self(header)
        return self.indent()

    def indent(self):
        w = self

        class _Ctx:
            def __enter__(self):
                w.depth += 1

            def __exit__(self, *a):
                w.depth -= 1
        return _Ctx()

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def literal(c, dtype: str) -> str:
    """A coefficient as a typed constant (folded into the code; never a table lookup)."""
    v = float(Fraction(c)) if not isinstance(c, (int, float)) else float(c)
    return f"T.{dtype}({v!r})"


def linear_expr(terms, name_of, dtype: str) -> str:
    """Σ c·x as text; ±1 become adds/subtracts."""
    out = ""
    for c, s in terms:
        x = name_of(s)
        if c == 1:
            out += f" + {x}" if out else x
        elif c == -1:
            out += f" - {x}" if out else f"-{x}"
        else:
            t = f"{literal(c, dtype)} * {x}"
            out += f" + {t}" if out else t
    return out or literal(0, dtype)


#: ``vdpbf16ps`` as a tiny LLVM IR function, linked into the module through TVM's
#: ``pragma_import_llvm`` and called with ``T.call_pure_extern``; LLVM inlines it (the
#: libraries have neither a call to it nor its symbol).  Why not ``T.call_llvm_pure_intrin``: LLVM 22's intrinsic takes
#: ``<32 x bfloat>``, and TVM 0.25 has no LLVM bfloat type (bf16 is legalised to uint16 before
#: code generation; with the legalisation passes disabled its LLVM codegen segfaults), so the
#: operands travel as ``<16 x i32>`` (the broadcast k pair of Ã, 16 columns × a k pair of B̃)
#: and are bitcast here.
DPBF16_FN = "lcmac_dpbf16ps"
DPBF16_LL = (
    f"define <16 x float> @{DPBF16_FN}(<16 x float> %acc, <16 x i32> %a, <16 x i32> %b) {{\n"
    "  %x = bitcast <16 x i32> %a to <32 x bfloat>\n"
    "  %y = bitcast <16 x i32> %b to <32 x bfloat>\n"
    "  %r = call <16 x float> @llvm.x86.avx512bf16.dpbf16ps.512(<16 x float> %acc, "
    "<32 x bfloat> %x, <32 x bfloat> %y)\n"
    "  ret <16 x float> %r\n}\n"
    "declare <16 x float> @llvm.x86.avx512bf16.dpbf16ps.512(<16 x float>, <32 x bfloat>, <32 x bfloat>)\n")
DOT_LANES = 16      # fp32 accumulators per vdpbf16ps


def emit_microkernel_bf16dot(w: Writer, g: Geometry, cfg: CpuConfig, r,
                             a_buf: str = "Ap32", b_buf: str = "Bp32", prefetch=None) -> None:
    """The ``vdpbf16ps`` micro-kernel: per k *pair*, mr 32-bit broadcasts of Ã (two bf16) and
    nr/16 loads of B̃ (16 columns × 2 bf16) feed mr·nr/16 dot products into fp32 accumulators.
    ``a_buf``/``b_buf`` are the int32 (bf16-pair) packed buffers."""
    mr, nr, ku = cfg.mr, cfg.nr, cfg.ku
    nv = nr // DOT_LANES
    emit_zero_acc(w, mr, nr, "float32", prefetch)
    kp = "kc * {KC2} + ko * {KU2} + ki".format(KC2=g.KC // 2, KU2=ku // 2)
    a = f"{a_buf}[{r}, " + packed_offset(f"tm * {g.MC // mr} + ir", kp, "v", g.BKP // 2, mr) + "]"
    b = (f"{b_buf}[{r}, T.ramp(" + packed_offset(f"tn * {g.NC // nr} + jr", kp, f"c * {DOT_LANES}",
                                                 g.BKP // 2, nr) + f", 1, {DOT_LANES})]")
    accv = f"acc[v, T.ramp(c * {DOT_LANES}, 1, {DOT_LANES})]"
    w(f"for ko in range({g.KC // ku}):")
    with w.indent():
        w(f"for ki in T.unroll({ku // 2}):")
        with w.indent():
            w(f"for v in T.unroll({mr}):")
            with w.indent():
                w(f"for c in T.unroll({nv}):")
                with w.indent():
                    w(f"{accv} = T.call_pure_extern(\"float32x{DOT_LANES}\", \"{DPBF16_FN}\", {accv}, "
                      f"T.broadcast({a}, {DOT_LANES}), {b})")


#: The Intel AMX micro-kernel (bfloat16): a 32 × 32 fp32 tile of C as 4 AMX C tiles (16 × 16
#: fp32), per 32-wide k step 2 A tiles (16 rows × 32 bf16) and 2 B tiles (16 k pairs × 16
#: columns × 2 bf16, the VNNI layout of ``Bp32`` with nr = 32) feeding 4 ``tdpbf16ps``: the 8
#: tile registers exactly.  Written as LLVM IR with the x86_amx "internal" intrinsics (the X86
#: backend configures the tiles itself, ldtilecfg) and linked like ``DPBF16_LL``; the k steps
#: of a kc chunk are unrolled, so the accumulators stay in tiles without phis of x86_amx.
#: Operands: Ã as ``Ap16[r][BMP/32][BKP/32][32 rows][32 k]`` (bf16 bits; a row's 32 k values,
#: 64 bytes, are one tile row), B̃ as ``Bp32``; C stored to the fp32 ``acc`` (row stride 128 B),
#: where the epilogues read it as from the other kernels.
AMX_MR, AMX_NR, AMX_K = 32, 32, 32
#: LLVM features the AMX kernel needs (x86.KERNEL_FEATURES maps them to CPU flags)
AMX_FEATURES = ("amx-tile", "amx-bf16")


def amx_kernel(dtype: str, cfg: CpuConfig, features) -> bool:
    """Whether the GEMM stage runs on AMX: ``cfg.amx``, checked against the dtype and the
    LLVM target's ``features`` (a clear error rather than a kernel the CPU cannot run)."""
    if not cfg.amx:
        return False
    if dtype != "bfloat16":
        raise DTypeError(f"config knob amx (Intel AMX tdpbf16ps) is for bfloat16; this kernel is {dtype}")
    missing = [f for f in AMX_FEATURES if f not in set(features)]
    if missing:
        raise TargetError(f"config knob amx needs an LLVM target with {' and '.join(AMX_FEATURES)} "
                          f"(--target x86_64-avx512 --mcpu sapphirerapids, or --mcpu native on a "
                          f"CPU with AMX); this target lacks {', '.join(missing)}")
    return True


def amx_fn(kc: int) -> str:
    return f"lcmac_amx_bf16_32x32_k{kc}"


def amx_ll(kc: int) -> str:
    """The AMX micro-kernel over one kc chunk (kc a multiple of 32) as LLVM IR text."""
    assert kc % AMX_K == 0
    L = [f"define void @{amx_fn(kc)}(ptr %c, ptr %a, ptr %b) {{"]
    for i in range(2):
        for j in range(2):
            L.append(f"  %c{i}{j}_0 = call x86_amx @llvm.x86.tilezero.internal(i16 16, i16 64)")
    for s in range(kc // AMX_K):
        # Ã step: 32 rows × 64 B = 2048 B, A tile 1 at +1024; B̃ step: 16 k pairs × 128 B,
        # B tile 1 (columns 16..31) at +64
        for i in range(2):
            L.append(f"  %pa{i}_{s} = getelementptr i8, ptr %a, i64 {s * 2048 + i * 1024}")
            L.append(f"  %a{i}_{s} = call x86_amx @llvm.x86.tileloadd64.internal(i16 16, i16 64, "
                     f"ptr %pa{i}_{s}, i64 64)")
        for j in range(2):
            L.append(f"  %pb{j}_{s} = getelementptr i8, ptr %b, i64 {s * 2048 + j * 64}")
            L.append(f"  %b{j}_{s} = call x86_amx @llvm.x86.tileloadd64.internal(i16 16, i16 64, "
                     f"ptr %pb{j}_{s}, i64 128)")
        for i in range(2):
            for j in range(2):
                L.append(f"  %c{i}{j}_{s + 1} = call x86_amx @llvm.x86.tdpbf16ps.internal(i16 16, "
                         f"i16 64, i16 64, x86_amx %c{i}{j}_{s}, x86_amx %a{i}_{s}, x86_amx %b{j}_{s})")
    n = kc // AMX_K
    for i in range(2):
        for j in range(2):
            L.append(f"  %pc{i}{j} = getelementptr i8, ptr %c, i64 {i * 2048 + j * 64}")
            L.append(f"  call void @llvm.x86.tilestored64.internal(i16 16, i16 64, ptr %pc{i}{j}, "
                     f"i64 128, x86_amx %c{i}{j}_{n})")
    L += ["  ret void", "}",
          "declare x86_amx @llvm.x86.tilezero.internal(i16, i16)",
          "declare x86_amx @llvm.x86.tileloadd64.internal(i16, i16, ptr, i64)",
          "declare x86_amx @llvm.x86.tdpbf16ps.internal(i16, i16, i16, x86_amx, x86_amx, x86_amx)",
          "declare void @llvm.x86.tilestored64.internal(i16, i16, ptr, i64, x86_amx)"]
    return "\n".join(L) + "\n"


def emit_microkernel_amx(w: Writer, g: Geometry, r, a_buf: str = "Ap16", b_buf: str = "Bp32",
                         prefetch=None) -> None:
    """acc[32][32] = Ã_r[tile rows] · B̃_r[tile cols] over one kc chunk on AMX (``amx_ll``).
    A call with side effects (it writes ``acc``), not a pure one."""
    a = (f"{a_buf}[{r}, ((tm * {g.MC // AMX_MR} + ir) * {g.BKP // AMX_K} + kc * {g.KC // AMX_K})"
         f" * {AMX_MR * AMX_K}]")
    b = (f"{b_buf}[{r}, ((tn * {g.NC // AMX_NR} + jr) * {g.BKP // 2} + kc * {g.KC // 2}) * {AMX_NR}]")
    _prefetch(w, AMX_MR, AMX_NR, "float32", prefetch)
    w(f"T.evaluate(T.call_extern(\"void\", \"{amx_fn(g.KC)}\", T.address_of(acc[0, 0]), "
      f"T.address_of({a}), T.address_of({b})))")


def emit_zero_acc(w: Writer, mr: int, nr: int, acc_dtype: str, prefetch) -> None:
    """acc = 0; with ``prefetch`` (``element.format(offset)``: the TVMScript element at that
    column offset in row v of the tile the epilogue will read), that tile is fetched while
    the FMAs run (``_prefetch``)."""
    w(f"for v in T.unroll({mr}):")
    with w.indent():
        w(f"for u in T.vectorized({nr}):")
        with w.indent():
            w(f"acc[v, u] = {literal(0, acc_dtype)}")
    _prefetch(w, mr, nr, acc_dtype, prefetch)


def _prefetch(w: Writer, mr: int, nr: int, acc_dtype: str, prefetch: str | None) -> None:
    if prefetch:
        # the tile the epilogue will read-modify-write: fetched while the FMAs run
        # (its rows are a power-of-two stride apart for square sizes: cache-set conflicts)
        per_line = max(1, CACHE_LINE // ITEMSIZE[acc_dtype])
        lines = max(1, nr // per_line)
        w(f"for v in T.unroll({mr}):")
        with w.indent():
            for ln in range(lines):
                w(f"T.evaluate(T.call_intrin(\"void\", \"tirx.prefetch\", "
                  f"T.address_of({prefetch.format(ln * per_line)}), 1, 3, 1))")


def emit_microkernel(w: Writer, g: Geometry, cfg: CpuConfig, r, acc_dtype: str,
                     a_buf: str = "Ap", b_buf: str = "Bp", prefetch=None) -> None:
    """acc[mr][nr] = Ã_r[tile rows] · B̃_r[tile cols] over one kc chunk: per k, mr broadcasts
    of Ã and nr/lanes loads of B̃ feed mr·nr/lanes FMAs into register accumulators."""
    mr, nr, ku = cfg.mr, cfg.nr, cfg.ku
    emit_zero_acc(w, mr, nr, acc_dtype, prefetch)
    kidx = "kc * {KC} + ko * {KU} + ki".format(KC=g.KC, KU=ku)
    a = f"{a_buf}[{r}, " + packed_offset(f"tm * {g.MC // mr} + ir", kidx, "v", g.BKP, mr) + "]"
    b = f"{b_buf}[{r}, " + packed_offset(f"tn * {g.NC // nr} + jr", kidx, "u", g.BKP, nr) + "]"
    emit_fma_loop(w, cfg, g.KC, a, b)


def emit_fma_loop(w: Writer, cfg: CpuConfig, KC, a: str, b: str) -> None:
    """acc[v, u] += a · b over one kc chunk (``KC`` its k, or a run-time expression of it, a
    multiple of ku): ``a``, an element of the packed A at k = ``ko * ku + ki`` and row v,
    broadcast; ``b``, the packed B at the same k, a vector over u."""
    mr, nr, ku = cfg.mr, cfg.nr, cfg.ku
    w(f"for ko in range({KC // ku if isinstance(KC, int) else f'({KC}) // {ku}'}):")
    with w.indent():
        w(f"for ki in T.unroll({ku}):")
        with w.indent():
            w(f"for v in T.unroll({mr}):")
            with w.indent():
                w(f"for u in T.vectorized({nr}):")
                with w.indent():
                    w(f"acc[v, u] = acc[v, u] + {a} * {b}")


def emit_tile_store(w: Writer, cfg: CpuConfig, dst: str, coef, acc_dtype: str,
                    accumulate: bool, row_guard: str | None = None) -> None:
    """dst[v, u] (=|+=) coef · acc[v, u] over the register tile; ``row_guard`` (a condition
    on v) skips the padded rows of a row tail (``Geometry.row_tail``)."""
    val = "acc[v, u]" if coef == 1 else ("-acc[v, u]" if coef == -1 else
                                        f"{literal(coef, acc_dtype)} * acc[v, u]")
    with w.block(f"for v in T.unroll({cfg.mr}):"), \
            (w.block(f"if {row_guard}:") if row_guard else nullcontext()):
        w(f"for u in T.vectorized({cfg.nr}):")
        with w.indent():
            if accumulate:
                if coef == -1:
                    w(f"{dst} = {dst} - acc[v, u]")
                else:
                    w(f"{dst} = {dst} + {val}")
            else:
                w(f"{dst} = {val}")


def emit_chunk_store(w: Writer, cfg: CpuConfig, nkc: int, dst: str, coef, acc_dtype: str,
                     first: bool, row_guard: str | None = None, overwrite: str | None = None) -> None:
    """The tile into ``dst`` after a kc chunk (``emit_tile_store``): ``dst``'s first writer
    stores in chunk 0 and accumulates in the others; any other writer accumulates.
    ``overwrite``: a run-time condition (TVMScript) without which the first writer
    accumulates too (a piece kernel adding into C)."""
    if first and overwrite is not None:
        w(f"if {overwrite if nkc == 1 else f'kc == 0 and {overwrite}'}:")
        with w.indent():
            emit_tile_store(w, cfg, dst, coef, acc_dtype, accumulate=False, row_guard=row_guard)
        w("else:")
        with w.indent():
            emit_tile_store(w, cfg, dst, coef, acc_dtype, accumulate=True, row_guard=row_guard)
    elif first and nkc == 1:
        emit_tile_store(w, cfg, dst, coef, acc_dtype, accumulate=False, row_guard=row_guard)
    elif first:
        w("if kc == 0:")
        with w.indent():
            emit_tile_store(w, cfg, dst, coef, acc_dtype, accumulate=False, row_guard=row_guard)
        w("else:")
        with w.indent():
            emit_tile_store(w, cfg, dst, coef, acc_dtype, accumulate=True, row_guard=row_guard)
    else:
        emit_tile_store(w, cfg, dst, coef, acc_dtype, accumulate=True, row_guard=row_guard)


def emit_gemm_stage(w: Writer, g: Geometry, cfg: CpuConfig, R: int, acc_dtype: str,
                    epilogue, prefetch=None, bf16_dot: bool = False, amx: bool = False) -> None:
    """The GEMM stage: one parallel task per (tm, tn) tile position of the blocks (FalconGEMM's
    (x, z)); inside, for each product r (its Combine-H coefficients constants in its own branch),
    the kc loop and the loops over the register tiles (``tile_loops``), then ``epilogue(w, r)``
    which writes the tile.

    Task order puts tm innermost so consecutive tasks share the B̃ panel."""
    mr, nr = cfg.mr, cfg.nr
    w(f"for t in T.parallel({g.nmc * g.nnc}):")
    with w.indent():
        w(f"acc = T.decl_buffer(({mr}, {nr}), \"{acc_dtype}\", scope=\"local\")")
        w(f"tm = t % {g.nmc}")
        w(f"tn = t // {g.nmc}")
        # one copy of the micro-kernel for all products (a run-time r loop: compile time and
        # code size stay flat in R); the epilogues, whose coefficients differ, are per r
        w(f"for r in range({R}):")
        with w.indent():
            w(f"for kc in range({g.nkc}):")
            with w.indent(), tile_loops(w, cfg, g.NC // nr, g.MC // mr):
                if amx:
                    emit_microkernel_amx(w, g, "r", prefetch=prefetch)
                elif bf16_dot:
                    emit_microkernel_bf16dot(w, g, cfg, "r", prefetch=prefetch)
                else:
                    emit_microkernel(w, g, cfg, "r", acc_dtype, prefetch=prefetch)
                dispatch_per_product(w, 0, R, epilogue)


def tile_loops(w: Writer, cfg: CpuConfig, jrs: int, irs: int) -> ExitStack:
    """The loops over a block's register tiles, ``jr`` (``jrs`` column tiles of nr) and ``ir``
    (``irs`` row tiles of mr), entered in ``cfg.tiles_by_row``'s order, the columns in chunks
    of ``cfg.chunk_cols`` (the largest number of column tiles up to it that divides ``jrs``);
    the caller writes the tile's body inside."""
    stack = ExitStack()
    per = max(d for d in range(1, max(1, cfg.chunk_cols // cfg.nr) + 1) if jrs % d == 0)
    if cfg.tiles_by_row and 1 < per < jrs:
        for line in (f"for jo in range({jrs // per}):", f"for ir in range({irs}):", f"for ji in range({per}):"):
            stack.enter_context(w.block(line))
        w(f"jr = jo * {per} + ji")
        return stack
    loops = [("ir", irs), ("jr", jrs)] if cfg.tiles_by_row else [("jr", jrs), ("ir", irs)]
    for name, count in loops:
        stack.enter_context(w.block(f"for {name} in range({count}):"))
    return stack


def dispatch_per_product(w: Writer, lo: int, hi: int, emit) -> None:
    """``emit(w, r)`` for the run-time product index ``r`` (code whose coefficients differ per
    product: epilogues, combined packing), branched to by a balanced tree of comparisons
    (log2 R branches per call instead of R)."""
    if hi - lo == 1:
        emit(w, lo)
        return
    mid = (lo + hi) // 2
    w(f"if r < {mid}:")
    with w.indent():
        dispatch_per_product(w, lo, mid, emit)
    w("else:")
    with w.indent():
        dispatch_per_product(w, mid, hi, emit)
