"""One product over the ranks of a ``torch.distributed`` process group: an LCMA's products
spread by ``lcmac.costmodel.distributed`` (NCCL between GPUs, gloo between CPU processes).

Every rank of the group calls ``matmul`` with the same arguments (the collective contract of
torch.distributed).  The phases on each rank:

1. agree: the ranks' shapes, dtypes and arguments are compared (one small all-gather), so a
   rank with other inputs is an error on every rank, not a hang.
2. operands: with ``src=None`` every rank holds A and B and reads the blocks it needs; with
   ``src=r`` rank r sends each rank, point to point, the combined operands of its units or
   the raw blocks they combine from, whichever is smaller (the plan says which).
3. products: for each unit (r, s), Ã_r's rows s and B̃_r are combined (one pass, accumulated in
   float32 for 16-bit types) and ``H = Ã·B̃`` runs locally (``local``: torch.matmul, or
   ``lcmac.matmul`` with an algorithm: an LCMA inside the distributed one).
4. partial sums: for each piece of C a rank touches, Σ W·H over its units; sent to the piece's
   owner in the accumulation dtype, and summed there.
5. assembly: the owners' pieces gathered on ``dst`` (None: every rank), C cut back from the
   padding.

The plain GEMM is the same code with the 1×1×1 scheme: rows of A split over the ranks, no
partial sums (the baseline, ``algo="gemm"``).

``host_matmul`` is the other case: A and B in host memory, larger than a GPU's, C's tiles
dealt to the ranks and each tile's operands streamed in from pinned buffers while the
previous chunk computes (``lcmac.parallel.stream``).
"""
from __future__ import annotations

from dataclasses import dataclass

from lcmac.artifact.build import resolve_algorithm
from lcmac.costmodel.distributed import GLOO_BW, NVLINK_BW, ProductPlan, plan_products
from lcmac.spec.profiles import get_profile
from lcmac.parallel.stream import DTYPES, acc_dtype, local_matmul, refuse_gradients
from lcmac.parallel.stream import host_matmul  # noqa: F401  (lcmac.parallel.distributed.host_matmul)
from lcmac.core.errors import LcmacError, TargetError
from lcmac.core.operands import (
    check_device_type, check_dims, check_dtype_in, check_inner, check_one_dtype, check_same_device,
    check_tensor)


def _torch():
    import torch
    import torch.distributed as dist
    return torch, dist


@dataclass(frozen=True)
class _Call:
    """What every rank must agree on."""
    M: int
    N: int
    K: int
    dtype: str
    algo: str
    src: int | None
    dst: int | None
    local: str
    strategy: str


def _group_info(group):
    torch, dist = _torch()
    if not dist.is_available() or not dist.is_initialized():
        raise LcmacError("lcmac.distributed needs an initialised process group: call "
                         "torch.distributed.init_process_group first (torchrun sets the "
                         "environment it reads)")
    size, rank = dist.get_world_size(group), dist.get_rank(group)
    if rank < 0:
        raise LcmacError("this process is not a member of the group it passed")
    backend = dist.get_backend(group)
    return size, rank, backend


def _device(backend: str, A):
    torch, _ = _torch()
    if A is not None:
        return A.device
    if backend == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _check_operands(A, B, rank, src, backend):
    holds = src is None or rank == src
    if not holds:
        if A is not None or B is not None:
            raise LcmacError(f"with src={src}, rank {rank} passes A=None and B=None")
        return
    for nm, X, dims in (("A", A, "M×K"), ("B", B, "K×N")):
        check_tensor(X, f"{nm} on rank {rank}", error=LcmacError)
        check_dims(X, nm, dims)
    check_inner(A, B)
    dtype = check_one_dtype(A, B)
    check_dtype_in(dtype, DTYPES, "lcmac.distributed")
    check_same_device(A, B)
    refuse_gradients("lcmac.distributed.matmul", A, B)
    want = "cuda" if backend == "nccl" else "cpu"
    check_device_type(A, "A", want, f"the group's backend is {backend}, which moves {want} tensors "
                                    "(host operands on GPUs: lcmac.distributed.host_matmul)")


def _agree(call: _Call, group, device):
    """Every rank's call, compared through one small all-gather (a tensor, not pickles: it
    runs on every call): the same on all, or an error naming the ranks that differ."""
    import hashlib
    torch, dist = _torch()
    args = repr((call.algo, call.src, call.dst, call.local, call.strategy)).encode()
    digest = int.from_bytes(hashlib.sha256(args).digest()[:7], "little")
    dt = DTYPES.index(call.dtype) if call.dtype else -1
    mine = torch.tensor([call.M, call.N, call.K, dt, digest], dtype=torch.int64, device=device)
    every = torch.empty((dist.get_world_size(group), 5), dtype=torch.int64, device=device)
    dist.all_gather_into_tensor(every, mine, group=group) if device.type == "cuda" else \
        dist.all_gather(list(every.unbind(0)), mine, group=group)
    rows = every.tolist()
    holders = [r for r in rows if r[0] >= 0]
    if not holders:
        raise LcmacError("no rank passed A and B")
    ref = holders[0]
    for r, row in enumerate(rows):
        what = [nm for nm, a, b in zip(("M", "N", "K", "dtype"), row[:4], ref[:4]) if a != b and row[0] >= 0]
        if row[4] != ref[4]:
            what.append("algo/src/dst/local/strategy")
        if what:
            raise LcmacError(f"the ranks called lcmac.distributed.matmul differently: rank {r} "
                             f"differs in {', '.join(what)} (shapes M×N×K {row[:3]} against "
                             f"{ref[:3]})")
    return _Call(ref[0], ref[1], ref[2], DTYPES[ref[3]], call.algo, call.src, call.dst,
                 call.local, call.strategy)


_PLANS: dict = {}


def _plan(call: _Call, size: int, backend: str, device) -> ProductPlan:
    """The plan of this call, kept per call, group size and backend (pricing a plan takes
    up to a second for a 49-product scheme)."""
    key = (call, size, backend, device.type)
    if key not in _PLANS:
        from lcmac.artifact.build import resolve_target
        alg = resolve_algorithm(call.algo)[0]
        profile = get_profile(resolve_target("cuda" if device.type == "cuda" else None).profile)
        _PLANS[key] = plan_products(alg, call.M, call.N, call.K, size, call.dtype, profile,
                                    link_bw=NVLINK_BW if backend == "nccl" else GLOO_BW,
                                    src=call.src, dst=call.dst, strategy=call.strategy)
    return _PLANS[key]


def combine(terms, acc_dtype, out_dtype, out=None):
    """Σ c·X over ``terms`` ((c, X) pairs), accumulated in ``acc_dtype`` and rounded once to
    ``out_dtype`` (into ``out`` where given); a single term with c = 1 is X itself (no copy).
    Two terms with a first coefficient of 1 are one ``torch.add``, which computes in float32
    and rounds once: the same result in one pass."""
    import torch
    c0, X0 = terms[0]
    if len(terms) == 1 and c0 == 1 and X0.dtype == out_dtype and out is None:
        return X0
    if len(terms) == 2 and c0 == 1 and X0.dtype == terms[1][1].dtype == out_dtype:
        return torch.add(X0, terms[1][1], alpha=float(terms[1][0]), out=out)
    acc = torch.mul(X0, float(c0)) if X0.dtype == acc_dtype else X0.to(acc_dtype).mul_(float(c0))
    for c, X in terms[1:]:
        acc.add_(X, alpha=float(c))          # a 16-bit X is read as it is, summed in acc_dtype
    if out is not None:
        return out.copy_(acc)
    return acc if acc.dtype == out_dtype else acc.to(out_dtype)


class _Operands:
    """The blocks of A and B one rank reads: its own (views of the padded operands) or what
    src sent it (combined operands or raw blocks)."""

    def __init__(self, alg, plan: ProductPlan, A=None, B=None):
        self.alg, self.plan = alg, plan
        m, k, n = alg.grid
        Mp, Np, Kp = plan.padded
        self.h, self.kb, self.nb = Mp // (m * plan.slices), Kp // k, Np // n
        self.A, self.B = A, B
        self.a_comb, self.b_comb, self.a_raw, self.b_raw = {}, {}, {}, {}

    def a_block(self, i, l, s):
        if (i, l, s) in self.a_raw:
            return self.a_raw[(i, l, s)]
        h, kb, S = self.h, self.kb, self.plan.slices
        r0 = (i * S + s) * h
        return self.A[r0:r0 + h, l * kb:(l + 1) * kb]

    def b_block(self, l, j):
        if (l, j) in self.b_raw:
            return self.b_raw[(l, j)]
        kb, nb = self.kb, self.nb
        return self.B[l * kb:(l + 1) * kb, j * nb:(j + 1) * nb]

    def a_tilde(self, r, s, dtype):
        if (r, s) in self.a_comb:
            return self.a_comb[(r, s)]
        U = self.alg.U
        terms = [(U[r, i, l], self.a_block(i, l, s)) for i in range(U.shape[1])
                 for l in range(U.shape[2]) if U[r, i, l] != 0]
        return combine(terms, acc_dtype(dtype), dtype)

    def b_tilde(self, r, dtype):
        if r in self.b_comb:
            return self.b_comb[r]
        V = self.alg.V
        terms = [(V[r, l, j], self.b_block(l, j)) for l in range(V.shape[1])
                 for j in range(V.shape[2]) if V[r, l, j] != 0]
        return combine(terms, acc_dtype(dtype), dtype)


def _needs(alg, plan: ProductPlan, rank: int):
    """What ``rank`` is sent by src: (A keys, B keys) in a fixed order; combined keys are
    ("c", r, s) / ("c", r), raw ones ("r", i, l, s) / ("r", l, j)."""
    units = plan.units[rank]
    comb_a, comb_b = plan.send_combined[rank]
    if comb_a:
        akeys = [("c", r, s) for r, s in units]
    else:
        akeys = sorted({("r", i, l, s) for r, s in units for i in range(alg.m) for l in range(alg.k)
                        if alg.U[r, i, l] != 0})
    prods = plan.products_of(rank)
    if comb_b:
        bkeys = [("c", r) for r in prods]
    else:
        bkeys = sorted({("r", l, j) for r in prods for l in range(alg.k) for j in range(alg.n)
                        if alg.V[r, l, j] != 0})
    return akeys, bkeys


def _p2p(ops):
    _, dist = _torch()
    if ops:
        for w in dist.batch_isend_irecv(ops):
            w.wait()


def _scatter_operands(alg, plan, ops_src: _Operands, rank, src, group, dtype, device):
    """Phase 2 with ``src``: src sends, every other rank receives into ``ops_src``."""
    torch, dist = _torch()
    h, kb, nb = ops_src.h, ops_src.kb, ops_src.nb
    g = lambda r: dist.get_global_rank(group, r)
    sends, recvs = [], []
    for p in range(plan.ranks):
        if p == src or (rank != src and rank != p):
            continue
        akeys, bkeys = _needs(alg, plan, p)
        for key in akeys + bkeys:
            is_a = key in akeys
            if rank == src:
                if is_a:
                    t = ops_src.a_tilde(key[1], key[2], dtype) if key[0] == "c" else ops_src.a_block(*key[1:])
                else:
                    t = ops_src.b_tilde(key[1], dtype) if key[0] == "c" else ops_src.b_block(*key[1:])
                sends.append(dist.P2POp(dist.isend, t.contiguous(), g(p), group))
                continue
            buf = torch.empty((h, kb) if is_a else (kb, nb), dtype=dtype, device=device)
            if is_a:
                (ops_src.a_comb if key[0] == "c" else ops_src.a_raw)[key[1:]] = buf
            elif key[0] == "c":
                ops_src.b_comb[key[1]] = buf
            else:
                ops_src.b_raw[key[1:]] = buf
            recvs.append(dist.P2POp(dist.irecv, buf, g(src), group))
    _p2p(sends + recvs)


def _row_split(alg, plan) -> bool:
    """The plain GEMM's plan: rank p computes C's rows p, whole (no sums, no copies)."""
    return alg.grid == (1, 1, 1) and plan.slices == plan.ranks and \
        all(plan.owner[(0, 0, s)] == s for s in range(plan.slices))


def _products(alg, plan, ops: _Operands, rank, dtype, local, C):
    """Phase 3: H of each of this rank's units, B̃_r combined once per product; the plain
    GEMM's rows go straight into C where this rank receives C."""
    mm = local_matmul(local)
    H, bt = {}, {}
    for r, s in plan.units[rank]:
        if r not in bt:
            bt = {r: ops.b_tilde(r, dtype)}          # units are ordered by r: keep one B̃
        out = C[s * ops.h:(s + 1) * ops.h] if C is not None and _row_split(alg, plan) else None
        H[(r, s)] = mm(ops.a_tilde(r, s, dtype), bt[r], out=out)
    return H


def _piece_view(C, pc, h, nb, S):
    """Piece (i, j, s) of the padded C: rows s of block (i, j)."""
    i, j, s = pc
    r0 = (i * S + s) * h
    return C[r0:r0 + h, j * nb:(j + 1) * nb]


def _partials(alg, plan, H, rank, dtype, group, device, shape, C):
    """Phase 4: this rank's sums per piece, sent to their owners; the owned pieces summed
    (into C's piece where this rank receives C)."""
    torch, dist = _torch()
    acc = acc_dtype(dtype)
    W = alg.W
    mine: dict = {}
    for (r, s), Hr in H.items():
        for i in range(alg.m):
            for j in range(alg.n):
                if W[r, i, j] != 0:
                    mine.setdefault((i, j, s), []).append((W[r, i, j], Hr))
    touchers: dict = {}
    for p, pcs in enumerate(plan.touched):
        for pc in pcs:
            touchers.setdefault(pc, set()).add(p)
    g = lambda r: dist.get_global_rank(group, r)
    pieces, ops, received = {}, [], {}

    def total(pc, terms):
        single = len(terms) == 1 and terms[0][0] == 1         # H itself: no copy here
        out = None if C is None or single else _piece_view(C, pc, *shape, plan.slices)
        return combine(terms, acc, dtype, out=out)
    for pc in sorted(touchers):
        owner, who = plan.owner[pc], touchers[pc]
        if owner == rank:
            remote = sorted(who - {rank})
            bufs = [torch.empty(shape, dtype=acc, device=device) for _ in remote]
            received[pc] = bufs
            ops += [dist.P2POp(dist.irecv, b, g(p), group) for p, b in zip(remote, bufs)]
            if not remote:
                pieces[pc] = total(pc, mine[pc])
        elif rank in who:
            ops.append(dist.P2POp(dist.isend, combine(mine[pc], acc, acc).contiguous(), g(owner), group))
    _p2p(ops)
    for pc, bufs in received.items():
        terms = mine.get(pc, []) + [(1, b) for b in bufs]
        pieces[pc] = total(pc, terms) if bufs else pieces[pc]
    return pieces


def _assemble(alg, plan, pieces, rank, dst, group, dtype, device, C):
    """Phase 5: C (padded; None on ranks other than ``dst``) completed from the owners'
    pieces; a piece computed in place is not copied."""
    torch, dist = _torch()
    Mp, Np, _ = plan.padded
    m, n, S = alg.m, alg.n, plan.slices
    h, nb = Mp // (m * S), Np // n
    order = sorted(plan.owner)
    owned = [[pc for pc in order if plan.owner[pc] == p] for p in range(plan.ranks)]

    def put(pc, X):
        v = _piece_view(C, pc, h, nb, S)
        if v.data_ptr() != X.data_ptr():             # not computed in place
            v.copy_(X)

    def piece(pc):
        return pieces[pc] if pc in pieces else torch.zeros((h, nb), dtype=dtype, device=device)

    if plan.ranks == 1:
        for pc in order:
            put(pc, piece(pc))
        return C
    if dst is None and _row_split(alg, plan) and device.type == "cuda":
        dist.all_gather_into_tensor(C, C[rank * h:(rank + 1) * h], group=group)
        return C
    if dst is None:
        most = max(len(o) for o in owned)
        mine = torch.zeros((most, h, nb), dtype=dtype, device=device)
        for t, pc in enumerate(owned[rank]):
            mine[t].copy_(piece(pc))
        bufs = [torch.empty_like(mine) for _ in range(plan.ranks)]
        dist.all_gather(bufs, mine, group=group)
        for p in range(plan.ranks):
            for t, pc in enumerate(owned[p]):
                put(pc, bufs[p][t])
        return C
    g = lambda r: dist.get_global_rank(group, r)
    ops = []
    if rank == dst:
        for pc in order:
            if plan.owner[pc] == rank:
                put(pc, piece(pc))
            else:
                buf = torch.empty((h, nb), dtype=dtype, device=device)
                ops.append((pc, buf, dist.P2POp(dist.irecv, buf, g(plan.owner[pc]), group)))
    else:
        ops = [(pc, None, dist.P2POp(dist.isend, piece(pc).contiguous(), g(dst), group))
               for pc in owned[rank]]
    _p2p([o for _, _, o in ops])
    for pc, buf, _ in ops:
        if buf is not None:
            put(pc, buf)
    return C


def _padded(X, rows, cols):
    torch, _ = _torch()
    if X.shape == (rows, cols):
        return X
    out = torch.zeros((rows, cols), dtype=X.dtype, device=X.device)
    out[:X.shape[0], :X.shape[1]].copy_(X)
    return out


def matmul(A, B, *, algo: str = "gemm", group=None, src: int | None = None,
           dst: int | None = None, local: str = "vendor", strategy: str = "auto",
           return_plan: bool = False):
    """C = A·B with ``algo``'s products spread over the ranks of ``group`` (module doc).

    Every rank calls it.  ``src=None``: every rank passes the same A and B; ``src=r``: rank r
    (of the group) passes them and the others pass ``A=None, B=None``.  Tensors are on the
    rank's GPU for NCCL, on the CPU for gloo.  ``dst``: the rank that receives C (the others
    get None); None: every rank.  ``local``: each product's GEMM ("vendor": torch.matmul, or
    an lcmac algorithm for ``lcmac.matmul``; "auto": lcmac.matmul's choice per GPU shape, from
    the tuning logs and the model).  ``strategy``: "auto", "slices" or "products"
    (``lcmac.costmodel.distributed``).  ``algo="gemm"`` is the plain GEMM's row split.
    With ``return_plan``, (C, plan)."""
    torch, dist = _torch()
    size, rank, backend = _group_info(group)
    group = group if group is not None else dist.group.WORLD
    for nm, v in (("src", src), ("dst", dst)):
        if v is not None and not (isinstance(v, int) and 0 <= v < size):
            raise LcmacError(f"{nm} must be a rank of the group (0..{size - 1}) or None, got {v!r}")
    resolve_algorithm(algo)
    if local not in ("vendor", "auto"):
        resolve_algorithm(local)
    _check_operands(A, B, rank, src, backend)
    device = _device(backend, A)
    if backend == "nccl" and device.index != torch.cuda.current_device():
        raise TargetError(f"rank {rank}'s operands are on {device} but its current device is "
                          f"cuda:{torch.cuda.current_device()}: call torch.cuda.set_device first")
    holds = A is not None
    mine = _Call(A.shape[0] if holds else -1, B.shape[1] if holds else -1,
                 A.shape[1] if holds else -1, str(A.dtype).replace("torch.", "") if holds else "",
                 algo, src, dst, local, strategy)
    call = _agree(mine, group, device)
    dtype = getattr(torch, call.dtype)
    alg = resolve_algorithm(algo)[0]
    plan = _plan(call, size, backend, device)
    Mp, Np, Kp = plan.padded
    with torch.no_grad():
        ops = _Operands(alg, plan, _padded(A, Mp, Kp) if holds else None,
                        _padded(B, Kp, Np) if holds else None)
        if src is not None and size > 1:
            _scatter_operands(alg, plan, ops, rank, src, group, dtype, device)
        C = torch.empty((Mp, Np), dtype=dtype, device=device) if dst is None or rank == dst else None
        H = _products(alg, plan, ops, rank, dtype, local, C)
        pieces = _partials(alg, plan, H, rank, dtype, group, device, (ops.h, ops.nb), C)
        del H
        C = _assemble(alg, plan, pieces, rank, dst, group, dtype, device, C)
    if C is not None and (Mp, Np) != (call.M, call.N):
        C = C[:call.M, :call.N].contiguous()
    return (C, plan) if return_plan else C
