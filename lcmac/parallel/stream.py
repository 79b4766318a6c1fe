"""C = A·B for operands in host memory, larger than one GPU's, on the GPUs of a process group:
``lcmac.distributed.host_matmul``.

C is cut into square tiles dealt to the ranks (``lcmac.costmodel.distributed.plan_tiles``);
each rank computes its tiles on its GPU, K in chunks:

    host thread   stage A[rows, chunk], B[chunk, cols] into pinned buffer i%2
    copy stream   pinned → GPU buffer i%2 (asynchronous: the buffers are page-locked)
    compute       P = local(A_chunk, B_chunk); acc += P      (acc float32; float64 for float64)
    last chunk    the tile rounded, copied back on a third stream, written into ``out`` by a
                  second host thread

Item i+1 is staged and copied while item i multiplies (two buffers of each kind; events say
when a buffer is free again).  A and B need not be pinned: the staging buffers are, and a
staging copy is also what cuts a tile's strided rows out of A and B.  Each chunk's product is
rounded to the operands' dtype before it is accumulated (one rounding per chunk, as a K-split
GEMM has).

Every rank passes the same A and B (their values: each rank reads only its tiles' rows and
columns) and an ``out``.  Where every rank's ``out`` is one shared memory
(``torch.from_file(..., shared=True)``, or a tensor shared before the processes started;
checked on every call by marks each rank writes and all read), each rank writes its tiles into
it and the call returns after a barrier.  Otherwise each tile is then broadcast from the rank
that computed it (through its GPU under NCCL) into every rank's ``out``: all of C crosses to
every rank, the price of separate memories.  The ranks plan with the least of their GPUs'
free memory, so that all deal the same tiles.

On a CPU group (gloo) the same tiles are computed on the CPU, one after another: the path CI
runs, to test the tiling and the dealing.
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

from lcmac.costmodel.coexec import DEFAULT_LINK_BW
from lcmac.costmodel.distributed import TilePlan, plan_tiles
from lcmac.spec.profiles import get_profile
from lcmac.core.errors import LcmacError
from lcmac.core.operands import (
    check_contiguous, check_device_type, check_dims, check_dtype_in, check_matrices,
    check_one_dtype, check_tensor)
from lcmac.runtime.loader import host_cpus

#: what lcmac.distributed's two calls take
DTYPES = ("bfloat16", "float16", "float32", "float64")
#: the share of the GPU's free memory a plan may use (the rest: the local GEMM's workspace,
#: the caching allocator's slack)
MEMORY_SHARE = 0.7


def _check(A, B, out, size):
    for nm, X, dims in (("A", A, "M×K"), ("B", B, "K×N"), ("out", out, "M×N")):
        check_tensor(X, nm, who="host_matmul", error=LcmacError)
        check_device_type(X, nm, "cpu", "host_matmul takes host tensors (operands on the GPUs: "
                                        "lcmac.distributed.matmul)")
        check_dims(X, nm, dims)
    check_matrices(A, B, out, who="host_matmul")
    dtype = check_one_dtype(A, B, out)
    check_dtype_in(dtype, DTYPES, "host_matmul")
    refuse_gradients("host_matmul", A, B)
    check_contiguous(out, "out", output=True)


def _collective_device(backend, device):
    """Where the group's collectives take their tensors: the rank's GPU for NCCL."""
    import torch
    return device if backend == "nccl" else torch.device("cpu")


def _agree_budget(budget: int, group, backend, device) -> int:
    """The least of the ranks' GPU budgets: every rank must plan the same tiles."""
    import torch
    import torch.distributed as dist
    t = torch.tensor([budget], dtype=torch.int64, device=_collective_device(backend, device))
    dist.all_reduce(t, op=dist.ReduceOp.MIN, group=group)
    return int(t.item())


def _shared_by_all(out, rank, size, group, backend, device) -> bool:
    """Whether every rank's ``out`` is the same memory: each rank writes its mark into its own
    element of out's first ``size`` elements, then all read them all (out is overwritten
    by the product afterwards)."""
    import torch
    import torch.distributed as dist
    flat = out.view(-1)
    if flat.numel() < size or size > 256:        # marks must be exact small integers
        return False
    flat[rank] = rank + 1
    _barrier(group, backend, device)
    seen = (flat[:size].to(torch.float64) == torch.arange(1, size + 1, dtype=torch.float64)).all()
    ok = torch.tensor([int(seen)], dtype=torch.int64, device=_collective_device(backend, device))
    dist.all_reduce(ok, op=dist.ReduceOp.MIN, group=group)
    return bool(ok.item())


def _barrier(group, backend, device):
    import torch.distributed as dist
    if backend == "nccl":
        dist.barrier(group=group, device_ids=[device.index])
    else:
        dist.barrier(group=group)


def _exchange_tiles(out, plan: TilePlan, group, backend, device):
    """Every rank's tiles into every rank's ``out`` (when the outs are separate memories): each
    tile broadcast from the rank that computed it (through its GPU under NCCL)."""
    import torch.distributed as dist
    cdev = _collective_device(backend, device)
    for p, tiles in enumerate(plan.tiles):
        src = dist.get_global_rank(group, p) if group is not None else p
        for r0, r1, c0, c1 in tiles:
            view = out[r0:r1, c0:c1]
            buf = view.to(cdev).contiguous() if dist.get_rank(group) == p else \
                view.new_empty(view.shape, device=cdev)
            dist.broadcast(buf, src=src, group=group)
            if dist.get_rank(group) != p:
                view.copy_(buf)


def refuse_gradients(what: str, A, B) -> None:
    """Neither call records a gradient: operands that want one are an error, not a result
    without its grad_fn."""
    import torch
    if torch.is_grad_enabled() and (A.requires_grad or B.requires_grad):
        raise LcmacError(f"{what} records no gradient and A or B requires grad: call it under "
                         "torch.no_grad() or pass detached tensors")


def acc_dtype(dtype):
    """What sums of products of ``dtype`` accumulate in: float64 for float64, else float32."""
    import torch
    return torch.float64 if dtype == torch.float64 else torch.float32


def local_matmul(local: str):
    """``mm(a, b, out=None)`` for one rank's own products: torch.matmul ("vendor"), or
    ``lcmac.matmul`` with ``local`` as its algo ("auto" or an algorithm; it takes contiguous
    operands, so views are copied)."""
    import torch
    if local == "vendor":
        return lambda a, b, out=None: torch.matmul(a, b, out=out)
    from lcmac.api.matmul import matmul as lcmac_matmul
    return lambda a, b, out=None: lcmac_matmul(a.contiguous(), b.contiguous(), algo=local, out=out)


def _flat(buf, rows, cols):
    """A contiguous rows×cols view of the front of a preallocated buffer."""
    return buf.view(-1)[:rows * cols].view(rows, cols)


def _run_cpu(A, B, out, tiles, chunk, mm):
    K = A.shape[1]
    for r0, r1, c0, c1 in tiles:
        acc = None
        for k0 in range(0, K, chunk):
            k1 = min(K, k0 + chunk)
            P = mm(A[r0:r1, k0:k1].contiguous(), B[k0:k1, c0:c1].contiguous())
            acc = P.to(acc_dtype(A.dtype)) if acc is None else acc.add_(P)
        out[r0:r1, c0:c1].copy_(acc)


def _run_gpu(A, B, out, tiles, plan: TilePlan, mm, device, threads: int):
    """The pipeline of the module doc for this rank's tiles; each host thread copies with
    ``threads`` of torch's CPU threads (torch's setting is per thread, and torchrun starts
    every rank with one)."""
    import torch
    dtype, K, T, kc = A.dtype, A.shape[1], plan.tile, plan.chunk
    items = [(t, k0) for t in range(len(tiles)) for k0 in range(0, K, kc)]
    if not items:
        return
    pin = lambda n: torch.empty(n, dtype=dtype, pin_memory=True)
    a_pin, b_pin = [pin(T * kc) for _ in range(2)], [pin(kc * T) for _ in range(2)]
    o_pin = [pin(T * T) for _ in range(2)]
    a_dev = [torch.empty(T * kc, dtype=dtype, device=device) for _ in range(2)]
    b_dev = [torch.empty(kc * T, dtype=dtype, device=device) for _ in range(2)]
    c_dev = [torch.empty(T * T, dtype=dtype, device=device) for _ in range(2)]
    acc = torch.empty(T * T, dtype=acc_dtype(dtype), device=device)
    compute = torch.cuda.current_stream(device)
    copy_in, copy_out = torch.cuda.Stream(device), torch.cuda.Stream(device)
    h2d_done, used = [None, None], [None, None]        # per slot: events of the last item
    out_done = [None, None]                            # per slot: the host write of its tile
    d2h_done = [None, None]                            # per slot: c_dev's copy back

    def shape(i):
        t, k0 = items[i]
        r0, r1, c0, c1 = tiles[t]
        return r0, r1, c0, c1, k0, min(K, k0 + kc)

    def stage(i, wait_for):
        r0, r1, c0, c1, k0, k1 = shape(i)
        if wait_for is not None:
            wait_for.synchronize()                      # buffer i%2's last copy has left it
        _flat(a_pin[i % 2], r1 - r0, k1 - k0).copy_(A[r0:r1, k0:k1])
        _flat(b_pin[i % 2], k1 - k0, c1 - c0).copy_(B[k0:k1, c0:c1])

    def write(slot, ev, r0, r1, c0, c1):
        ev.synchronize()
        out[r0:r1, c0:c1].copy_(_flat(o_pin[slot], r1 - r0, c1 - c0))

    pool = lambda: ThreadPoolExecutor(1, initializer=torch.set_num_threads, initargs=(threads,))
    with pool() as stager, pool() as writer:
        staged = [stager.submit(stage, i, None) for i in range(min(2, len(items)))]
        for i in range(len(items)):
            s = i % 2
            r0, r1, c0, c1, k0, k1 = shape(i)
            staged[i].result()
            a = _flat(a_dev[s], r1 - r0, k1 - k0)
            b = _flat(b_dev[s], k1 - k0, c1 - c0)
            with torch.cuda.stream(copy_in):
                if used[s] is not None:
                    copy_in.wait_event(used[s])        # the GPU buffers' last product is done
                a.copy_(_flat(a_pin[s], r1 - r0, k1 - k0), non_blocking=True)
                b.copy_(_flat(b_pin[s], k1 - k0, c1 - c0), non_blocking=True)
                h2d_done[s] = copy_in.record_event()
            if i + 2 < len(items):
                staged.append(stager.submit(stage, i + 2, h2d_done[s]))
            compute.wait_event(h2d_done[s])
            P = mm(a, b)
            tile_acc = _flat(acc, r1 - r0, c1 - c0)
            last = k1 == K
            if k0 == 0 and last:
                result = P
            elif k0 == 0:
                tile_acc.copy_(P)
            else:
                tile_acc.add_(P)
            used[s] = compute.record_event()
            if last:
                t = items[i][0] % 2
                if k0 > 0:
                    result = tile_acc
                c = _flat(c_dev[t], r1 - r0, c1 - c0)
                if d2h_done[t] is not None:
                    compute.wait_event(d2h_done[t])     # c_dev[t]'s last tile has left it
                c.copy_(result)
                if out_done[t] is not None:
                    out_done[t].result()                # o_pin[t]'s last tile is written out
                copy_out.wait_event(compute.record_event())
                with torch.cuda.stream(copy_out):
                    _flat(o_pin[t], r1 - r0, c1 - c0).copy_(c, non_blocking=True)
                    ev = d2h_done[t] = copy_out.record_event()
                out_done[t] = writer.submit(write, t, ev, r0, r1, c0, c1)
        for f in out_done:
            if f is not None:
                f.result()


def host_matmul(A, B, out, *, group=None, local: str = "vendor", tile: int | None = None,
                chunk: int | None = None, host_bw: float = DEFAULT_LINK_BW,
                return_plan: bool = False):
    """C = A·B into ``out`` for host tensors (module doc); every rank of ``group`` calls it
    with the same arguments.  ``local``: each chunk's product ("vendor": torch.matmul, or an
    lcmac algorithm or "auto" for ``lcmac.matmul``); ``tile``/``chunk``: fix the plan's sides."""
    import torch
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        size, rank, backend = dist.get_world_size(group), dist.get_rank(group), dist.get_backend(group)
    else:
        size, rank, backend = 1, 0, "none"
    _check(A, B, out, size)
    if local not in ("vendor", "auto"):
        from lcmac.artifact.build import resolve_algorithm
        resolve_algorithm(local)
    on_gpu = backend == "nccl" or (size == 1 and torch.cuda.is_available())
    M, K = A.shape
    N = B.shape[1]
    dtype = str(A.dtype).replace("torch.", "")
    from lcmac.artifact.build import resolve_target
    if on_gpu:
        device = torch.device("cuda", torch.cuda.current_device())
        free, _total = torch.cuda.mem_get_info(device)
        budget = int(free * MEMORY_SHARE)
        profile = get_profile(resolve_target("cuda").profile)
    else:
        device, budget = torch.device("cpu"), 1 << 62
        profile = get_profile(resolve_target(None).profile)
    if size > 1:
        budget = _agree_budget(budget, group, backend, device)
        shared = _shared_by_all(out, rank, size, group, backend, device)
    plan = plan_tiles(M, N, K, size, dtype, profile, budget, host_bw=host_bw, tile=tile, chunk=chunk)
    mm = local_matmul(local)
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    with torch.no_grad():
        if on_gpu:
            _run_gpu(A, B, out, plan.tiles[rank], plan, mm, device,
                     max(1, host_cpus() // local_ranks - 2))
            torch.cuda.synchronize(device)
        else:
            _run_cpu(A, B, out, plan.tiles[rank], plan.chunk, mm)
    if size > 1:
        _barrier(group, backend, device)
        if not shared:
            with torch.no_grad():
                _exchange_tiles(out, plan, group, backend, device)
    return (out, plan) if return_plan else out
