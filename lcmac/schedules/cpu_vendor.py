"""The CPU LCMA with the vendor BLAS as its base case (config knob ``vendor_base``), as
Benson and Ballard's fast-matmul calls the vendor's dgemm: lcmac's combines (TensorIR, the
coefficients folded in) around R calls of ``cblas_sgemm`` / ``cblas_dgemm``.

    Ã_r = Σ U[r]·A blocks   (row-major BM × BK; a product whose Ã_r is one block of A with
                             coefficient 1 reads A in place: no copy, lda = K)
    B̃_r = Σ V[r]·B blocks   (likewise, ldb = N)
    H_r = Ã_r · B̃_r         (the vendor GEMM, its own threads)
    C blocks = Σ W·H        (one pass)

**The BLAS is bound at load time, not link time**, so the artifact loads without a compiler
or a BLAS import library: the library defines two exported pointer slots per dtype (LLVM IR
linked through ``pragma_import_llvm``, like cpu_gemm's ``vdpbf16ps`` wrapper) that whoever
loads it fills, as it fills TVM's backend pointers: ``__lcmac_cblas_<s|d>gemm_ilp64`` (a
CBLAS with 64-bit integers, e.g. numpy's bundled OpenBLAS ``scipy_cblas_sgemm64_``) or
``__lcmac_cblas_<s|d>gemm_lp64`` (``cblas_sgemm`` of OpenBLAS, MKL, BLIS).  A call with
neither filled fails with an error, never a wrong C.

Shapes: M, N, K must split evenly over the grid, and BK, BN be whole vectors (the combines'
loops have no tails); other shapes are refused here with the rule (the tuner and the decision
then keep lcmac's own GEMM stage for them).
"""
from __future__ import annotations

import dataclasses

from lcmac.core.errors import DTypeError, ShapeError
from lcmac.schedules.cpu_combine import _decl_locals, _emit_program
from lcmac.schedules.cpu_gemm import Writer
from lcmac.schedules.cpu_memory import emit_workspace

#: (BLAS routine letter, LLVM element type) per dtype
_BLAS = {"float32": ("s", "float"), "float64": ("d", "double")}


def slots(dtype: str) -> tuple[str, str]:
    """The exported pointer slots (ILP64, LP64) a loader fills for ``dtype``."""
    s = _BLAS[dtype][0]
    return f"__lcmac_cblas_{s}gemm_ilp64", f"__lcmac_cblas_{s}gemm_lp64"


def call_fn(dtype: str) -> str:
    return f"lcmac_vendor_{_BLAS[dtype][0]}gemm"


def vendor_ll(dtype: str, define: bool = True) -> str:
    """``call_fn(dtype)(m, n, k, a, lda, b, ldb, c, ldc) -> i32``: C = A·B (row-major, no
    transposes, alpha 1, beta 0) through whichever slot is filled; -1 when none is.  A module
    defines it once: the other functions that call it import only its declaration."""
    ilp, lp = slots(dtype)
    t = _BLAS[dtype][1]
    if not define:
        return (f"declare i32 @{call_fn(dtype)}(i64, i64, i64, ptr, i64, ptr, i64, ptr, i64)\n")
    one, zero = "1.0", "0.0"
    args = "i64 %m, i64 %n, i64 %k, ptr %a, i64 %lda, ptr %b, i64 %ldb, ptr %c, i64 %ldc"
    return (
        f"@{ilp} = global ptr null\n"
        f"@{lp} = global ptr null\n"
        f"define i32 @{call_fn(dtype)}({args}) {{\n"
        f"  %f64 = load ptr, ptr @{ilp}\n"
        "  %no64 = icmp eq ptr %f64, null\n"
        "  br i1 %no64, label %try32, label %call64\n"
        "call64:\n"
        # CblasRowMajor = 101, CblasNoTrans = 111
        f"  call void %f64(i32 101, i32 111, i32 111, i64 %m, i64 %n, i64 %k, {t} {one}, ptr %a, "
        f"i64 %lda, ptr %b, i64 %ldb, {t} {zero}, ptr %c, i64 %ldc)\n"
        "  ret i32 0\n"
        "try32:\n"
        f"  %f32 = load ptr, ptr @{lp}\n"
        "  %no32 = icmp eq ptr %f32, null\n"
        "  br i1 %no32, label %none, label %call32\n"
        "call32:\n"
        + "".join(f"  %{v}32 = trunc i64 %{v} to i32\n" for v in ("m", "n", "k", "lda", "ldb", "ldc"))
        + f"  call void %f32(i32 101, i32 111, i32 111, i32 %m32, i32 %n32, i32 %k32, {t} {one}, "
        f"ptr %a, i32 %lda32, ptr %b, i32 %ldb32, {t} {zero}, ptr %c, i32 %ldc32)\n"
        "  ret i32 0\n"
        "none:\n"
        "  ret i32 -1\n"
        "}\n")


def unit_inputs(prog) -> dict[int, int]:
    """Output → input for the outputs that are one input with coefficient 1 (the GEMM reads
    that block in place)."""
    return {o: e[0][1] for o, e in enumerate(prog.outputs)
            if len(e) == 1 and e[0][0] == 1 and e[0][1] < prog.n_inputs}


def _subset(prog, keep: list[int]):
    """The program computing only the outputs ``keep`` (in that order)."""
    return dataclasses.replace(prog, outputs=tuple(prog.outputs[o] for o in keep))


def check_shape(alg, dtype: str, M: int, N: int, K: int, lanes: int) -> tuple[int, int, int]:
    """(BM, BK, BN), or ShapeError naming the rule."""
    if dtype not in _BLAS:
        raise DTypeError(f"the vendor-BLAS base case is for float32 and float64 (cblas_sgemm, "
                         f"cblas_dgemm), not {dtype}")
    m, k, n = alg.grid
    if M % m or K % k or N % n:
        raise ShapeError(f"the vendor-BLAS base case needs M, N, K divisible by {alg.name}'s grid "
                         f"({m}x{k}x{n} for M×K×N); {M}x{N}x{K} is not (use lcmac's own GEMM stage)")
    BM, BK, BN = M // m, K // k, N // n
    biggest = max(M * K, K * N, M * N, alg.R * BM * BN, alg.R * BK * BN, alg.R * BM * BK)
    if biggest >= 2 ** 31:      # TIR indices here are 32-bit: refuse rather than miscompute
        raise ShapeError(f"{M}x{N}x{K} with {alg.name} needs a buffer of {biggest} elements; the "
                         "CPU backend's 32-bit indexing is not supported past 2^31 yet")
    if BK % lanes or BN % lanes:
        raise ShapeError(f"the vendor-BLAS base case needs K/{k} and N/{n} multiples of {lanes} "
                         f"(whole vectors); {M}x{N}x{K} gives {BK} and {BN}")
    return BM, BK, BN


@dataclasses.dataclass(frozen=True)
class _Plan:
    """What the emitters share: the blocks, the programs, and which products read A or B
    in place."""
    dtype: str
    M: int
    N: int
    K: int
    BM: int
    BK: int
    BN: int
    k: int
    n: int
    R: int
    lanes: int
    progs: dict
    unit_a: dict
    unit_b: dict

    @property
    def made_a(self) -> list[int]:          # the Ã_r Combine A writes
        return [r for r in range(self.R) if r not in self.unit_a]

    @property
    def made_b(self) -> list[int]:
        return [r for r in range(self.R) if r not in self.unit_b]


def _row_pass(w: Writer, p: _Plan, prog, what: str, rows: int, cols: int, load, store) -> None:
    """One combine pass over row-major blocks of ``rows`` × ``cols``: rows in parallel, each
    row in whole vectors; ``load(s, row, col)`` / ``store(o, row, col)`` name the program's
    input s and output o at (row, col) of their blocks (col a vector expression)."""
    w(f"# {what}")
    w(f"for i in T.parallel({rows}):")
    with w.indent():
        _decl_locals(w, prog, p.dtype, p.lanes)
        w(f"for jo in range({cols // p.lanes}):")
        with w.indent():
            col = f"jo * {p.lanes} + u"
            _emit_program(w, prog, p.dtype, p.lanes, "u", lambda s: load(s, "i", col),
                          lambda o: store(o, "i", col))


def _combine_a(w: Writer, p: _Plan) -> None:
    if not p.made_a:
        return

    def load(s, row, col):
        bi, bl = divmod(s, p.k)
        return f"A[{bi * p.BM} + {row}, {bl * p.BK} + {col}]"
    _row_pass(w, p, _subset(p.progs["A"], p.made_a), "Combine A: the Ã_r that are not one block "
              "of A, row-major", p.BM, p.BK, load, lambda o, row, col: f"At[{o}, {row}, {col}]")


def _combine_b(w: Writer, p: _Plan, made: list[int]) -> None:
    if not made:
        return

    def load(s, row, col):
        bl, bj = divmod(s, p.n)
        return f"B[{bl * p.BK} + {row}, {bj * p.BN} + {col}]"
    _row_pass(w, p, _subset(p.progs["B"], made), "Combine B: B̃_r row-major", p.BK, p.BN, load,
              lambda o, row, col: f"Bt[{o}, {row}, {col}]")


def _products(w: Writer, p: _Plan, b_slot: dict[int, int]) -> None:
    w(f"# the R = {p.R} products on the vendor BLAS")
    slot_a = {r: i for i, r in enumerate(p.made_a)}
    for r in range(p.R):
        if r in p.unit_a:
            bi, bl = divmod(p.unit_a[r], p.k)
            a, lda = f"A[{bi * p.BM}, {bl * p.BK}]", p.K
        else:
            a, lda = f"At[{slot_a[r]}, 0, 0]", p.BK
        if r in b_slot:
            b, ldb = f"Bt[{b_slot[r]}, 0, 0]", p.BN
        else:
            bl, bj = divmod(p.unit_b[r], p.n)
            b, ldb = f"B[{bl * p.BK}, {bj * p.BN}]", p.N
        w(f"assert T.call_extern(\"int32\", \"{call_fn(p.dtype)}\", T.int64({p.BM}), T.int64({p.BN}), "
          f"T.int64({p.BK}), T.address_of({a}), T.int64({lda}), T.address_of({b}), T.int64({ldb}), "
          f"T.address_of(H[{r}, 0, 0]), T.int64({p.BN})) == 0, "
          f"\"no BLAS bound to this lcmac artifact (its loader sets {slots(p.dtype)[0]} or "
          f"{slots(p.dtype)[1]})\"")


def _combine_h(w: Writer, p: _Plan) -> None:
    def store(o, row, col):
        bi, bj = divmod(o, p.n)
        return f"C[{bi * p.BM} + {row}, {bj * p.BN} + {col}]"
    _row_pass(w, p, p.progs["H"], "Combine H: C blocks from the products, one pass", p.BM, p.BN,
              lambda s, row, col: f"H[{s}, {row}, {col}]", store)


def generate(alg, dtype: str, M: int, N: int, K: int, progs: dict, lanes: int,
             entry: str, prepare_suffix: str, prepared_suffix: str) -> tuple[str, dict]:
    """TVMScript of ``entry(A, B, C)``, ``entry<prepare_suffix>(B, Bp)`` (every B̃_r, copied:
    a prepared B must not point into B) and ``entry<prepared_suffix>(A, Bp, C)``, and the
    info dict."""
    BM, BK, BN = check_shape(alg, dtype, M, N, K, lanes)
    R = alg.R
    m, k, n = alg.grid
    p = _Plan(dtype, M, N, K, BM, BK, BN, k, n, R, lanes, progs,
              unit_inputs(progs["A"]), unit_inputs(progs["B"]))
    # the prepared B̃ crosses the ABI flat per product (R × BK·BN), read as R × BK × BN
    decl = {"A": f"({M}, {K}), \"{dtype}\"", "B": f"({K}, {N}), \"{dtype}\"",
            "C": f"({M}, {N}), \"{dtype}\"", "Bp": f"({R}, {BK * BN}), \"{dtype}\""}
    isz = {"float32": 4, "float64": 8}[dtype]
    w = Writer()
    w("@I.ir_module")
    w("class Module:")
    with w.indent():
        for name, params in ((entry, ("A", "B", "C")), (entry + prepare_suffix, ("B", "Bp")),
                             (entry + prepared_suffix, ("A", "Bp", "C"))):
            w("@T.prim_func")
            w(f"def {name}(" + ", ".join(f"{q}: T.Buffer({decl[q]}, align={isz})" for q in params) + "):")
            with w.indent():
                w(f"T.func_attr({{\"global_symbol\": \"{name}\", \"tirx.noalias\": True}})")
                if "Bp" in params:
                    w(f"Bt = T.decl_buffer(({R}, {BK}, {BN}), \"{dtype}\", data=Bp.data)")
                if name == entry + prepare_suffix:
                    _combine_b(w, p, list(range(R)))      # all of them: P must not point into B
                    continue
                w(f"with T.attr(0, \"pragma_import_llvm\", {vendor_ll(dtype, name == entry)!r}):")
                with w.indent():
                    emit_workspace(w, "At", (max(1, len(p.made_a)), BM, BK), dtype)
                    emit_workspace(w, "H", (R, BM, BN), dtype)
                    if name == entry:
                        emit_workspace(w, "Bt", (max(1, len(p.made_b)), BK, BN), dtype)
                        _combine_b(w, p, p.made_b)
                        b_slot = {r: i for i, r in enumerate(p.made_b)}
                    else:
                        b_slot = {r: r for r in range(R)}
                    _combine_a(w, p)
                    _products(w, p, b_slot)
                    _combine_h(w, p)
    info = {"geometry": {"BM": BM, "BK": BK, "BN": BN, "grid": [m, k, n]}, "direct_c": True,
            "entry": entry, "gemm_kernel": "vendor-blas", "accumulate": dtype, "packed_dtype": dtype,
            "vendor_blas": {"ilp64_slot": slots(dtype)[0], "lp64_slot": slots(dtype)[1],
                            "routine": f"cblas_{_BLAS[dtype][0]}gemm"},
            "in_place": {"A": len(p.unit_a), "B": len(p.unit_b)},
            "workspace_bytes": isz * (len(p.made_a) * BM * BK + len(p.made_b) * BK * BN + R * BM * BN),
            "additions": {s: q.additions for s, q in progs.items()},
            "prepared_b": {"prepare": entry + prepare_suffix, "run": entry + prepared_suffix,
                           "shape": [R, BK * BN], "dtype": dtype}}
    return w.text(), info
