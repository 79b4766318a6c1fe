"""A portable TensorIR lowering of an LCMA, parameterised by vector lanes and register tile.

This is the vector-length-agnostic AArch64 target's kernel generator (``lower_request``, which
the apache-tvm worker's plug-in for the family calls): unfused stages, each a TE compute,
with the coefficients folded in as literals:

    Ap, Bp        zero-padded copies of A, B (block sizes rounded up to the register tile):
                  a zero fill, then a copy of A/B over static bounds (no guarded loads)
    At_r, Bt_r    Combine A / Combine B: one compute per product r (sum of ±blocks)
    H_r           GEMM stage: At_r · Bt_r, scheduled as an MR×NR register tile with the NR
                  columns vectorised (fixed lanes, or ``lanes_per_vscale·vscale`` for
                  vector-length-agnostic SVE), k outermost inside the tile
    C             Combine H fused into the final copy out (one select per block of C)

The plain GEMM is the 1×1×1 algorithm.  Imports apache-tvm: call it only inside a compiler
process (the apache-tvm worker, ``lcmac.targets.tvm_plugins``).
"""
from __future__ import annotations

from fractions import Fraction

from lcmac.ir.algorithm import Algorithm
from lcmac.spec.cpu.aarch64 import schedule_params
from lcmac.spec.targets import get_target


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _terms(T, r, rows, cols):
    out = []
    for i in range(rows):
        for j in range(cols):
            c = T[r, i, j]
            if c != 0:
                out.append((Fraction(c), i, j))
    return out


def _gemm(te, At, Bt, kk, bm, bn, nm):
    return te.compute((bm, bn), lambda i, j: te.sum(At[i, kk] * Bt[kk, j], axis=kk), name=nm)


def lcma_prim_func(alg, M: int, K: int, N: int, dtype: str = "float32", *, lanes: int = 4,
                   mr: int = 8, nr: int | None = None, vla: bool = False,
                   name: str = "lcmac_matmul"):
    """The TensorIR function ``name(A: M×K, B: K×N, C: M×N)`` computing C = A·B with ``alg``,
    scheduled (returns a ``tvm.IRModule``)."""
    import tvm
    from tvm import te, tirx

    m, k, n, R = alg.m, alg.k, alg.n, alg.R
    nr = nr or lanes
    if vla:
        # Columns padded to a whole number of the longest SVE vector (2048 bits: 16·lanes),
        # hence of every power-of-two vector length, the only ones the Arm architecture
        # allows: the GEMM column loop then splits by lanes·vscale exactly and vectorises
        # without a predicate (with one, TVM scalarises the loop).
        nr = max(nr, 16 * lanes)
    bm = _ceil(_ceil(M, m), mr) * mr
    bn = _ceil(_ceil(N, n), nr) * nr
    bk = _ceil(K, k)
    zero = tirx.const(0, dtype)

    A = te.placeholder((M, K), dtype, name="A")
    B = te.placeholder((K, N), dtype, name="B")

    def pad(X, rows, cols, R_, C_, nm):
        # Written as the padding pattern and split by decompose_padding below into a zero
        # fill plus a copy with static bounds, so no load of X depends on a guard.  (A clamp
        # inside the guard is no protection: TVM simplifies X[min(i, rows-1), ...] to X[i, ...]
        # under the guard's condition, and a vectorised select then reads past X's end: the
        # x86 templates' bug.)
        if rows == R_ and cols == C_:
            return X
        return te.compute((R_, C_), lambda i, j: tirx.if_then_else(
            tirx.all(i < rows, j < cols), X[i, j], zero), name=nm)

    Ap = pad(A, M, K, m * bm, k * bk, "Ap")
    Bp = pad(B, K, N, k * bk, n * bn, "Bp")

    def lin(terms, X, br, bc, nm):
        def f(i, j):
            acc = None
            for c, bi, bj in terms:
                v = X[bi * br + i, bj * bc + j]
                if c == -1:
                    v = -v
                elif c != 1:
                    v = v * tirx.const(float(c), dtype)
                acc = v if acc is None else acc + v
            return acc
        return te.compute((br, bc), f, name=nm)

    naive = (m, k, n) == (1, 1, 1) and R == 1
    Hs, combines = [], []
    for r in range(R):
        ua, vb = _terms(alg.U, r, m, k), _terms(alg.V, r, k, n)
        At = Ap if naive else lin(ua, Ap, bm, bk, f"At{r}")
        Bt = Bp if naive else lin(vb, Bp, bk, bn, f"Bt{r}")
        if not naive:
            combines += [At, Bt]
        kk = te.reduce_axis((0, bk), f"k{r}")
        Hs.append(_gemm(te, At, Bt, kk, bm, bn, f"H{r}"))

    blocks = {}
    for i in range(m):
        for j in range(n):
            blocks[(i, j)] = [(Fraction(alg.W[r, i, j]), r) for r in range(R) if alg.W[r, i, j] != 0]

    def out(i, j):
        if naive:
            return Hs[0][i, j]
        bi, bj = i // bm, j // bn
        ii, jj = i % bm, j % bn
        expr = zero
        for (pi, pj), terms in reversed(list(blocks.items())):
            acc = None
            for c, r in terms:
                v = Hs[r][ii, jj]
                v = -v if c == -1 else (v if c == 1 else v * tirx.const(float(c), dtype))
                acc = v if acc is None else acc + v
            acc = zero if acc is None else acc
            expr = tirx.if_then_else(tirx.all(bi == pi, bj == pj), acc, expr)
        return expr

    C = te.compute((M, N), out, name="C")
    func = te.create_prim_func([A, B, C]).with_attr("global_symbol", name)
    sch = tvm.s_tir.Schedule(func)

    for r in range(R):
        blk = sch.get_sblock(f"H{r}")
        i, j, kr = sch.get_loops(blk)
        io, ii = sch.split(i, [None, mr])
        if vla:
            vec = lanes * tirx.vscale()
            jo, ji = sch.split(j, [None, vec], disable_predication=True)   # bn: see above
            sch.reorder(io, jo, kr, ii, ji)
            sch.unroll(ii)
            # initialise inside the tile, then accumulate in registers
            sch.vectorize(ji)
            sch.decompose_reduction(blk, kr)
        else:
            jo, jv = sch.split(j, [None, nr])
            jv_o, ji = sch.split(jv, [None, lanes])
            sch.reorder(io, jo, kr, ii, jv_o, ji)
            sch.unroll(ii)
            sch.unroll(jv_o)
            sch.vectorize(ji)
            sch.decompose_reduction(blk, kr)
    for t in combines:
        blk = sch.get_sblock(t.op.name)
        loops = sch.get_loops(blk)
        if not vla and t.shape[-1] % lanes == 0:
            _, ji = sch.split(loops[-1], [None, lanes])
            sch.vectorize(ji)
    for t in (Ap, Bp):
        if t is not A and t is not B:
            blk = sch.get_sblock(t.op.name)
            sch.decompose_padding(blk, sch.get_loops(blk)[0])
    return tvm.IRModule({name: sch.mod["main"]})


def lower_request(request: dict) -> tuple[str, dict]:
    """A compiler-worker request (``lcmac.build``'s) → (TVMScript source, info) of the
    vector-length-agnostic kernel: the target's lanes per vscale and register tile
    (``lcmac.spec.cpu.aarch64.schedule_params``; the request's config may set ``mr``)."""
    alg = Algorithm.from_dict(request["algorithm"])
    shp = request["shape"]
    p = schedule_params(get_target(request["target"]["name"]), request["dtype"])
    mr = int((request.get("config") or {}).get("mr", p.mr))
    entry = request.get("entry", "lcmac_matmul")
    mod = lcma_prim_func(alg, shp["M"], shp["K"], shp["N"], request["dtype"], lanes=p.lanes,
                         mr=mr, vla=True, name=entry)
    return mod[entry].script(), {"kernel": "te_vla", "lanes_per_vscale": p.lanes, "mr": mr}
