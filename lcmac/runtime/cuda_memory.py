"""Memory for what lcmac keeps across calls on a GPU (a kernel's workspace, a prepared B, a
transposed weight): never taken from a CUDA graph's private pool.

``torch.compile(mode="reduce-overhead")`` runs a function's first calls (the CUDA-graph trees'
warm-up) with every allocation of the calling thread routed into the graph's pool, and then
checks that each tensor left alive in that pool is one of the graph's outputs.  A cache
filled during the warm-up fails the check ("tensor(s) in the cudagraph pool not tracked as
outputs"), so a model whose first call is compiled could not run.  ``kept_empty`` allocates
on another thread, whose allocations are not routed, and records the caller's stream on the
tensor, so that when the cache drops it the allocator waits for that stream's work on it
before handing the memory out again.

During a capture (``torch.cuda.graph``) it allocates in place: another thread may not call
cudaMalloc while a stream captures, and the callers keep nothing made there (they document
that the first call, which fills the caches, comes before the capture)."""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

_pool: ThreadPoolExecutor | None = None
_lock = threading.Lock()


def _allocator() -> ThreadPoolExecutor:
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lcmac-kept-memory")
        return _pool


def kept_empty(shape, dtype, device):
    """``torch.empty(shape, dtype=dtype, device=device)`` for a tensor that outlives the call
    (module doc)."""
    import torch
    device = torch.device(device)
    if device.type != "cuda" or torch.cuda.is_current_stream_capturing():
        return torch.empty(shape, dtype=dtype, device=device)

    def allocate():
        with torch.cuda.device(device):
            return torch.empty(shape, dtype=dtype, device=device)
    t = _allocator().submit(allocate).result()
    t.record_stream(torch.cuda.current_stream(device))
    return t
