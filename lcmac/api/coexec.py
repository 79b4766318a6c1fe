"""One product on the GPU and the host's CPU at once: ``lcmac.matmul(A, B, devices=("cuda",
"cpu"))``.

C's rows are divided: the GPU computes rows ``[0, M_g)``, the CPU rows ``[M_g, M)``, both
through ``lcmac.matmul`` (the GPU's "auto" decision; the CPU's ``cpu_algo``, the vendor GEMM
unless asked otherwise), at the same time, each writing its rows of C in place.

- Inputs on the host (C returned there): B goes to the GPU once; the GPU's rows of A go in
  ``chunks`` pieces on a copy stream, each piece's product starting as soon as it has arrived
  and its rows of C copied back on a third stream while the next piece computes.  Pinned
  (page-locked) A, B and ``out`` make every copy asynchronous; pageable ones work, with copies
  that hold the issuing thread.  The CPU computes its rows from host memory meanwhile.
- Inputs on the GPU (C left there): the GPU computes its rows; the CPU side copies its rows of
  A and all of B down, computes, and copies its rows of C back, on a stream of its own.

The split is ``lcmac.policy.split.choose_split``'s: ``split="auto"`` takes the measured best
split for this case from the split log (``lcmac.tune.coexec_search`` measures it), else the
GPU alone; a number is the CPU's share of rows; a share that rounds to no rows is the GPU
alone.

While both sides run, the CPU side's thread pool is one thread short of the host's cores: the
thread that drives the GPU needs one, and an oversubscribed pool stalls at its barriers.
"""
from __future__ import annotations

import threading
import time

from lcmac.costmodel.coexec import split_rows
from lcmac.core.errors import LcmacError, ShapeError, TargetError
from lcmac.core.operands import (
    check_matrices, check_one_dtype, check_out, check_same_device, check_tensor)
from lcmac.policy.split import choose_split
from lcmac.runtime.loader import host_cpus
from lcmac.spec.precision import allows_tf32, torch_precision

GPU_MODES = {"bfloat16": "bf16", "float16": "fp16", "float64": "fp64"}
PIECE_BYTES = 32 << 20          # the least of A's bytes a pipelined piece carries


def gpu_mode(dtype) -> str:
    """The GPU's number format for a torch dtype: float32 is "tf32" where torch's float32
    precision class lets matmuls use TF32 (``lcmac.spec.precision``), else "fp32"."""
    name = str(dtype).replace("torch.", "")
    if name == "float32":
        return "tf32" if allows_tf32(torch_precision("cuda")) else "fp32"
    if name not in GPU_MODES:
        raise LcmacError(f"CPU+GPU products take bfloat16, float16, float32 or float64, not {name}")
    return GPU_MODES[name]


def gpu_side(dtype, lcmac_matmul):
    """The GPU side's GEMM: ``lcmac_matmul`` where lcmac has CUDA kernels for the format
    (bf16, fp16, float32 in TF32 or, where TF32 is not allowed, fp16x2 operands: lcmac.matmul
    keeps to torch's class), else ``torch.matmul`` (float64)."""
    import torch
    if gpu_mode(dtype) == "fp64":
        return lambda a, b, out=None: torch.matmul(a, b, out=out)
    return lcmac_matmul


class _cpu_threads:
    """torch's CPU pool at ``n`` threads for a block (restored after)."""

    def __init__(self, n: int):
        self.n = max(1, n)

    def __enter__(self):
        import torch
        self.prev = torch.get_num_threads()
        torch.set_num_threads(min(self.n, self.prev))

    def __exit__(self, *exc):
        import torch
        torch.set_num_threads(self.prev)


# ---- running a split ---------------------------------------------------------------------------
def _check(A, B, devices):
    import torch
    check_tensor(A, "A", who="devices=", error=LcmacError)
    check_tensor(B, "B", who="devices=", error=LcmacError)
    check_matrices(A, B, who="devices=")
    check_one_dtype(A, B, error=LcmacError)
    check_same_device(A, B, fix="give both on the host or both on the GPU")
    kinds = tuple(torch.device(d).type for d in devices)
    if sorted(kinds) != ["cpu", "cuda"]:
        raise TargetError(f"devices= names one GPU and the CPU, e.g. (\"cuda\", \"cpu\"); got {devices!r}")
    if not torch.cuda.is_available():
        raise TargetError("devices= with a GPU, and torch sees no CUDA device")
    gpu = torch.device(next(d for d in devices if torch.device(d).type == "cuda"))
    if A.device.type == "cuda" and gpu.index is not None and A.device != gpu:
        raise TargetError(f"A and B are on {A.device}, not on {gpu}")
    return A.device if A.device.type == "cuda" else (gpu if gpu.index is not None else
                                                      torch.device("cuda", torch.cuda.current_device()))


def run_split(A, B, gpu_rows: int, gpu, *, gpu_matmul, cpu_matmul, out=None, chunks: int = 8,
              timings: dict | None = None):
    """C = A·B with rows ``[0, gpu_rows)`` on the torch device ``gpu`` and the rest on the CPU,
    concurrently, into ``out`` (new where None, on A's device).  ``gpu_matmul(A, B)`` and
    ``cpu_matmul(A, B, out=None)`` compute a block of rows on their device (into ``out``
    where given).  ``gpu`` may be the CPU
    itself, which runs both sides as host threads (how the split is tested without a GPU).
    ``timings``, where given, receives each side's seconds from the start ("gpu_s", "cpu_s";
    the GPU side's including its copies, complete on the device)."""
    import torch
    M, N = A.shape[0], B.shape[1]
    if out is None:
        out = torch.empty((M, N), dtype=A.dtype, device=A.device)
    else:
        check_out(out, A, (M, N), summary=True)
    if not 0 <= gpu_rows <= M:
        raise ShapeError(f"the GPU's rows must lie in [0, {M}], got {gpu_rows}")
    on_gpu = gpu.type == "cuda"
    producer = torch.cuda.current_stream(A.device) if A.device.type == "cuda" else None
    errors = []

    t0 = time.perf_counter()

    def cpu_side():
        try:
            if A.device.type == "cpu":
                cpu_matmul(A[gpu_rows:], B, out=out[gpu_rows:])
                return
            side = torch.cuda.Stream(A.device)           # inputs on the GPU: down, compute, up
            with torch.cuda.stream(side):
                side.wait_stream(producer)               # the caller's stream made A and B
                a, b = A[gpu_rows:].to("cpu"), B.to("cpu")
                out[gpu_rows:].copy_(cpu_matmul(a, b))
                side.synchronize()
        except BaseException as e:                        # reraised on the calling thread
            errors.append(e)
        finally:
            if timings is not None:
                timings["cpu_s"] = time.perf_counter() - t0

    if gpu_rows == M:                    # the GPU alone: no thread, no pool change
        if not on_gpu or A.device.type == "cuda":
            gpu_matmul(A, B, out=out)
        else:
            _gpu_from_host(A, B, M, gpu, gpu_matmul, out, chunks)
        if timings is not None:
            if on_gpu:
                torch.cuda.synchronize(gpu)
            timings["gpu_s"], timings["cpu_s"] = time.perf_counter() - t0, 0.0
        return out
    with _cpu_threads(host_cpus() - 1 if on_gpu else host_cpus()):
        worker = threading.Thread(target=cpu_side, name="lcmac-coexec-cpu")
        worker.start()
        try:
            if gpu_rows and (not on_gpu or A.device.type == "cuda"):
                gpu_matmul(A[:gpu_rows], B, out=out[:gpu_rows])   # on its own device: no copies
            elif gpu_rows:
                _gpu_from_host(A, B, gpu_rows, gpu, gpu_matmul, out, chunks)
            if timings is not None:
                if on_gpu:
                    torch.cuda.synchronize(gpu)
                timings["gpu_s"] = time.perf_counter() - t0
        finally:
            worker.join()
    if errors:
        raise errors[0]
    return out


def _gpu_from_host(A, B, gpu_rows, gpu, gpu_matmul, out, chunks):
    """The GPU's rows from host inputs: B once, A's rows in pieces on a copy stream, each piece
    computed on arrival, its C rows copied back on a third stream (module doc)."""
    import torch
    compute = torch.cuda.current_stream(gpu)
    copy_in, copy_out = torch.cuda.Stream(gpu), torch.cuda.Stream(gpu)
    # pieces of at least PIECE_BYTES of A: below that a piece's launches and events cost more
    # than the overlap saves (measured: 4096² bf16 in 8 pieces took twice torch's plain copies)
    pieces = max(1, min(chunks, gpu_rows * A.shape[1] * A.element_size() // PIECE_BYTES))
    step = max(64, -(-gpu_rows // pieces) // 64 * 64)
    with torch.cuda.stream(copy_in):
        Bd = B.to(gpu, non_blocking=True)
    b_ready = copy_in.record_event()
    for r0 in range(0, gpu_rows, step):
        r1 = min(gpu_rows, r0 + step)
        with torch.cuda.stream(copy_in):
            Ad = A[r0:r1].to(gpu, non_blocking=True)
        compute.wait_event(copy_in.record_event())
        compute.wait_event(b_ready)
        with torch.cuda.stream(compute):
            Cd = gpu_matmul(Ad, Bd)
        Ad.record_stream(compute)
        copy_out.wait_event(compute.record_event())
        with torch.cuda.stream(copy_out):
            out[r0:r1].copy_(Cd, non_blocking=True)
        Cd.record_stream(copy_out)
    Bd.record_stream(compute)
    copy_out.synchronize()          # C is on the host: complete before it is returned


def split_product(A, B, devices, split="auto", *, gpu_matmul, cpu_matmul, out=None,
                  chunks: int = 8):
    """C = A·B for 2-D torch tensors, both on the host or both on one GPU, split between the
    GPU and the CPU (module doc) by ``choose_split``; ``gpu_matmul``/``cpu_matmul`` as in
    ``run_split`` (lcmac.matmul passes itself with the GPU's algo and the CPU's; ``gpu_side``
    replaces the GPU's by torch.matmul for the formats lcmac has no CUDA kernel for)."""
    import torch

    from lcmac.artifact.build import resolve_target
    gpu = _check(A, B, devices)
    M, K = A.shape
    N = B.shape[1]
    dtype = str(A.dtype).replace("torch.", "")
    inputs = "device" if A.device.type == "cuda" else "host"
    choice = choose_split(M, N, K, dtype, gpu_mode(A.dtype), inputs, resolve_target("cuda"), split)
    with torch.no_grad():
        return run_split(A, B, split_rows(M, choice.cpu_fraction), gpu,
                         gpu_matmul=gpu_side(A.dtype, gpu_matmul),
                         cpu_matmul=cpu_matmul, out=out, chunks=chunks)
