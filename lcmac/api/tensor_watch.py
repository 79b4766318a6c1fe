"""Whether a torch tensor's memory has been written since lcmac made something from it (a
contiguous transposed weight, a prepared B, a weight cast for autocast), checked in constant
time whatever the tensor's size.

``snapshot(t)`` returns a ``Snapshot``, or None where writes to ``t`` cannot be seen (the
caller then keeps nothing made from it); ``Snapshot.unchanged(t)`` is true only if no write
has reached t's memory since.  ``memory_key(t)`` names the memory a snapshot is of, for a
cache's dict; it is valid while that memory is alive, so a cache holds the tensor or drops
its entry when the tensor is freed.

**Why not the version counter alone.**  ``t._version`` counts writes through the tensors that
share it (views, ``detach()``, in-place ops, ``copy_``, ``load_state_dict``, optimizer steps),
but ``t.data`` is an alias with a counter of its own: ``w.data.mul_(2)`` writes w's memory and
leaves ``w._version`` as it was.  **Why not a checksum.**  One over the whole tensor reads it
again on every call (on a GPU, a sizeable part of a product of a thousand rows, and a host
synchronisation to compare it); one over sampled elements misses a write to the others.

**What is used instead: torch's copy-on-write storages.**  ``torch._lazy_clone(t)`` makes t's
storage copy-on-write; the clone is dropped at once, so t holds the only reference and no
copy is ever made.  Every write that goes through torch to that storage, from any tensor on
it (``.data``, views, in-place ops, kernels, ``data_ptr()``, ``numpy()``), first turns it back
into an ordinary storage, and ``torch._C._is_cow_tensor`` reads that state.  Each arming gets
a generation number kept with the storage (its Python object lives as long as it does), so
that a later arming, after a write, does not make older snapshots pass for unchanged.  The
version counter and the layout are checked too.

**Limits.**  Writes through a raw pointer taken before the snapshot (a numpy array or DLPack
capsule of the tensor kept from earlier, a CUDA graph replaying a write into it) are not
seen, nor a write through ``.data`` that other code follows with its own
``torch._lazy_clone`` of the tensor: after such a write, call ``lcmac.ops.release_kernels()``.
Taking a raw pointer counts as a write, so what was made from a tensor handed to a kernel by
address is made again at its next use (never stale, only slower: callers snapshot again
after their own such reads).  A tensor torch cannot make copy-on-write (over memory torch did not
allocate: ``torch.from_numpy``, ``torch.frombuffer``, a memory-mapped file), an inference
tensor, a tensor subclass, or one met while a CUDA stream captures gets no snapshot."""
from __future__ import annotations

import itertools
import threading
import weakref

__all__ = ["Snapshot", "snapshot", "memory_key"]

_lock = threading.Lock()
_generations = itertools.count(1)
#: storage (its Python object) → the generation of lcmac's last arming of it
_armed: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _layout(t) -> tuple:
    return (t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)


def memory_key(t) -> tuple:
    """What ``t`` reads: its storage (by identity) and its layout in it."""
    return (id(t.untyped_storage()), *_layout(t))


class Snapshot:
    """A tensor's memory at one moment: ``unchanged(t)`` while nothing has written it."""
    __slots__ = ("generation", "layout", "version")

    def __init__(self, generation: int, layout: tuple, version: int):
        self.generation, self.layout, self.version = generation, layout, version

    def unchanged(self, t) -> bool:
        """True when ``t`` is the tensor of this snapshot (the same storage and layout) and
        no write has reached its memory since."""
        import torch
        return (torch._C._is_cow_tensor(t) and _armed.get(t.untyped_storage()) == self.generation
                and t._version == self.version and _layout(t) == self.layout)


def _trackable(t) -> bool:
    import torch
    if not hasattr(torch, "_lazy_clone") or not hasattr(torch._C, "_is_cow_tensor"):
        return False
    if t.is_inference() or torch._C._dispatch_keys(t).has(torch._C.DispatchKey.Python):
        return False
    # a kept copy made during a capture would belong to the graph's memory
    return not (t.is_cuda and torch.cuda.is_current_stream_capturing())


def snapshot(t) -> Snapshot | None:
    """A ``Snapshot`` of ``t`` now, or None where its writes cannot be seen (module doc)."""
    import torch
    if not _trackable(t):
        return None
    storage = t.untyped_storage()
    with _lock:
        generation = _armed.get(storage)
        if generation is None or not torch._C._is_cow_tensor(t):
            try:
                with torch.no_grad():
                    # the clone is dropped: t holds the only reference, so a write copies nothing
                    torch._lazy_clone(t)
            except RuntimeError:         # memory torch did not allocate: no copy-on-write
                return None
            if not torch._C._is_cow_tensor(t):
                return None
            generation = _armed[storage] = next(_generations)
    return Snapshot(generation, _layout(t), t._version)
