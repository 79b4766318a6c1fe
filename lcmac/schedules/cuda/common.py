"""Pieces shared by the CUDA kernel templates (imports TileLang: the worker process only).

    GemmTile        the GEMM-stage knobs of one template, resolved for its operand dtype
    emit_names      the names buffers keep in the generated CUDA
    extents         a global buffer's shape (int64 extents where 32-bit indices would wrap)
    known           a static fact about sizes, False where a size is a run-time value
    evaluate        a linear program over Python-unrolled inputs, coefficients as literals
    raster          TileLang's rasterised tile order, for kernels that walk tiles themselves
"""
# (no `from __future__ import annotations`: TileLang evaluates the Tensor annotations)

from dataclasses import dataclass
from fractions import Fraction

import tilelang.language as T
from tilelang import tvm
from tvm.script.ir_builder import IRBuilder

from lcmac.spec.cuda.blocking import needs_int64
from lcmac.spec.cuda.config import CudaConfig

#: accumulator dtype of the templates but float64's (the tensor cores' fp32 accumulation,
#: fp32 combines; float64 accumulates in float64: ``spec.cuda.dtypes.accum_dtype``)
ACCUM = "float32"


@dataclass(frozen=True)
class GemmTile:
    """The GEMM-stage knobs a template reads from ``CudaConfig``, resolved for the dtype its
    tensor cores read (block_k and the warpgroup policy depend on it)."""
    block_m: int
    block_n: int
    block_k: int
    num_stages: int
    threads: int
    policy: object            # T.GemmWarpPolicy
    swizzle: int              # rasterisation panel, 0 = off
    store_via_smem: bool

    @classmethod
    def of(cls, cfg: CudaConfig, dtype: str) -> "GemmTile":
        return cls(cfg.block_m, cfg.block_n, cfg.bk(dtype), cfg.stages, cfg.threads,
                   warp_policy(cfg.policy, dtype), cfg.swizzle, cfg.store_via_smem)


def warp_policy(policy: str, dtype: str):
    """``CudaConfig.policy`` as TileLang's warpgroup split ("auto": FullRow for 2-byte
    operands, Square for float32, as measured)."""
    if policy == "auto":
        return T.GemmWarpPolicy.Square if dtype == "float32" else T.GemmWarpPolicy.FullRow
    return {"square": T.GemmWarpPolicy.Square, "fullrow": T.GemmWarpPolicy.FullRow,
            "fullcol": T.GemmWarpPolicy.FullCol}[policy]


def emit_names(**buffers) -> None:
    """Name each buffer in the generated CUDA after its keyword (``emit_names(A_s=A_shared)``).
    TileLang names a buffer after the Python variable it is assigned to; the templates'
    variables say role and memory, while the generated sources, which tests and tools read,
    keep their short names.  Call it after the assignments (an assignment renames)."""
    for name, buf in buffers.items():
        IRBuilder.name(name, buf)


def uses_pdl(arch: str) -> bool:
    """Whether kernels for ``arch`` must begin with ``pdl_sync()`` (griddepcontrol.wait).
    TileLang launches each kernel with programmatic dependent launch allowed
    (cudaLaunchKernelEx + programmaticStreamSerialization), so on sm_90 a kernel may start
    before the previous kernel in the stream (ours, or the caller's that produced A and B)
    has finished; only griddepcontrol.wait guarantees that kernel's writes are visible.
    sm_80 has no PDL (and TileLang refuses the instruction there)."""
    return arch == "sm_90a"


def all_of(conds: list):
    """The conjunction of a kernel's bound checks (a non-empty list of conditions)."""
    cond = conds[0]
    for c in conds[1:]:
        cond = T.And(cond, c)
    return cond


def unrolled(n: int) -> list[int]:
    """A Python list: TileLang's builder unrolls loops over lists at trace time (a `range`
    would become a TIR serial loop)."""
    return list(range(n))


def keep_params(func, keep: list[int]):
    """``func`` (a PrimFunc) with only the parameters at ``keep`` (the others unused by its
    body): one template for kernels whose signatures differ only in optional inputs."""
    params = [func.params[i] for i in keep]
    return tvm.tirx.PrimFunc(params, func.body, func.ret_type,
                             {p: func.buffer_map[p] for p in params}, func.attrs)


def extents(*dims):
    """A global buffer's shape: int64 extents when it has more than 2³¹−1 elements, so that
    its flattened index, and the constant part TVM folds out of it (r·Mb·Nb for an unrolled
    product r, i·Mb·N for a C block row), are computed in 64 bits; int32 extents otherwise
    (the generated code of smaller shapes is unchanged).  See config.INDEX_INT32_MAX.
    A run-time dimension (``schedules.cuda.rows``) stays as it is: TileLang computes the
    indices of a buffer it cannot bound in 64 bits."""
    if not all(isinstance(d, int) for d in dims):
        return tuple(dims)
    if needs_int64(dims):
        return tuple(T.int64(d) for d in dims)
    return tuple(dims)


def known(fact) -> bool:
    """A static fact about sizes (``(p + 1) * Mb <= M``): the Python bool where the sizes are
    compile-time constants, False where one is a run-time value, so that the template emits
    the run-time check instead."""
    return fact if isinstance(fact, bool) else False


def run_time(*sizes) -> bool:
    """Whether any of ``sizes`` is a run-time value (a TileLang dynamic dimension), not an int."""
    return not all(isinstance(v, int) for v in sizes)


def tile_count(extent, block: int):
    """ceil(extent / block) tiles; for a run-time extent (never negative) in C's division,
    which floor division's sign handling would cost a page of selects."""
    return -(-extent // block) if isinstance(extent, int) else T.truncdiv(extent + block - 1, block)


def grid_ctas(ctas: int, tiles) -> int:
    """A persistent grid's CTAs: ``ctas``, fewer where the compile-time tile count is smaller;
    with a run-time tile count the surplus CTAs find no step to run."""
    return min(ctas, tiles) if isinstance(tiles, int) else ctas


def literal(value, like):
    """``value`` as a literal of the dtype of the expression ``like`` (float32 or float64)."""
    return T.float64(value) if str(like.dtype) == "float64" else T.float32(value)


def scaled(c, x):
    """c·x with c an exact constant, emitted as a literal in x's dtype (±1 become add/sub)."""
    if c == 1:
        return x
    if c == -1:
        return -x
    return literal(float(Fraction(c)), x) * x


def _linear(expr, slots):
    acc = None
    for c, s in expr:
        if acc is None:
            acc = scaled(c, slots[s])
        elif c == -1:
            acc = acc - slots[s]
        elif c == 1:
            acc = acc + slots[s]
        else:
            acc = acc + scaled(c, slots[s])
    return acc if acc is not None else literal(0, slots[0])


def evaluate(prog, inputs):
    """The outputs of the straight-line linear program ``prog`` (``ir.program``) on
    ``inputs``: its temporaries, then its outputs, each a sum of literal multiples in the
    inputs' dtype."""
    slots = list(inputs)
    for t in prog.temps:
        slots.append(_linear(t, slots))
    return [_linear(o, slots) for o in prog.outputs]


def raster(g, gx: int, gy: int, panel: int):
    """Tile position (row, col) of linear group index g >= 0: TileLang's rasterization2DRow
    (the order ``T.use_swizzle`` gives the non-persistent grid), written out for a
    persistent CTA that walks group indices itself (``spec.cuda.persistent.raster`` computes the same in
    Python).  Truncating division: g is never negative, and floor division of a
    maybe-negative value emits a page of selects."""
    div, mod = T.truncdiv, T.truncmod
    if panel <= 0:
        return div(g, gx), mod(g, gx)
    T_ = gx * gy
    psize = panel * gx
    off = mod(g, psize)
    idx = div(g, psize)
    # (a run-time gy: C's division, as for g; floor division would emit its sign handling)
    fdiv = (lambda a, b: a // b) if isinstance(T_, int) else div
    last = fdiv(T_ - 1, psize)                    # index of the (maybe short) last panel
    stride = T.if_then_else(idx < last, panel, fdiv(T_, gx) - last * panel)
    col = T.if_then_else(mod(idx, 2) == 1, gx - 1 - div(off, stride), div(off, stride))
    row = mod(off, stride) + idx * panel
    return row, col
