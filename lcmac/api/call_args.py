"""The arguments every lcmac product call shares: the ``algo`` names, the target of a
device and the float32 precision class of the operands; the kernels loaded in this process;
and how its torch ops are defined.  (Their own
module so that ``lcmac.ops`` and ``lcmac.api.bmm`` both use them without importing
each other.)"""
from __future__ import annotations

import threading

from lcmac.artifact.build import resolve_algorithm
from lcmac.artifact.cache import cached_build
from lcmac.core.errors import CatalogueError, LcmacError, TargetError
from lcmac.core.operands import device_type, operand_kind
from lcmac.runtime.loader import load
from lcmac.spec.precision import DEFAULT_PRECISION, check_precision, torch_precision
from lcmac.spec.targets import get_target

AUTO, VENDOR, GEMM = "auto", "vendor", "gemm"
_targets: dict[str, str] = {}


def target_for(device: str) -> str:
    """The lcmac target of a device type ("cpu": this CPU's; "cuda": the GPU present)."""
    t = _targets.get(device)
    if t is None:
        if device not in ("cpu", "cuda"):
            raise TargetError(f"lcmac runs on the CPU and on CUDA GPUs; the operands are on {device}")
        t = _targets.setdefault(device, get_target("host" if device == "cpu" else "cuda").name)
    return t


def check_algo(algo) -> str:
    """``algo`` itself when it names something lcmac.matmul can run ("auto", "vendor",
    "gemm" or a catalogue name or expression); CatalogueError otherwise."""
    if not isinstance(algo, str):
        raise CatalogueError(f"algo must be a string (\"auto\", \"vendor\", \"gemm\" or an "
                             f"algorithm name), got {type(algo).__name__}")
    if algo in (AUTO, VENDOR, GEMM) or algo in _resolved:
        return algo
    resolve_algorithm(algo)           # unknown names: CatalogueError naming them
    _resolved.add(algo)               # resolving builds the scheme: tens of µs a call
    return algo


#: algorithm names that resolved once (a name the catalogue knows stays known)
_resolved: set[str] = set()


def float32_precision(A, dtype: str, precision=None) -> str | None:
    """The float32 precision class (``lcmac.spec.precision``) a product of operands like
    ``A`` of ``dtype`` runs under; None for other dtypes.  Torch tensors: torch's own
    setting, which lcmac never changes, so an explicit ``precision`` must be the same (a
    pin: lcmac refuses rather than run another class); numpy arrays: ``precision``, default
    "highest"."""
    if precision is not None:
        check_precision(precision)
    if dtype != "float32":
        return None
    if operand_kind(A) != "torch":
        return precision or DEFAULT_PRECISION
    own = torch_precision(device_type(A))
    if precision is not None and precision != own:
        raise LcmacError(f"precision={precision!r} was asked, but torch's float32 matmul "
                         f"precision is {own!r}: for torch tensors lcmac runs torch's class "
                         f"and never changes it; call torch.set_float32_matmul_precision"
                         f"({precision!r}) first, or leave precision= out")
    return own


def define_op(name: str, impl, schema: str, fake, backward, setup_context):
    """A ``torch.library.custom_op`` with its fake (shape-only) implementation and autograd
    formula: what torch.compile traces without a graph break and autograd differentiates."""
    import torch
    op = torch.library.custom_op(name, impl, mutates_args=(), schema=schema)
    op.register_fake(fake)
    op.register_autograd(backward, setup_context=setup_context)
    return op


class LoadedKernels:
    """This process's loaded kernels by key: each loaded (compiled on a cache miss) once,
    whatever the threads asking; a lock per key, so different kernels build at the same
    time."""

    def __init__(self):
        self._table: dict[tuple, object] = {}
        self._locks: dict[tuple, threading.Lock] = {}
        self._lock = threading.Lock()

    def __contains__(self, key) -> bool:
        return key in self._table

    def get(self, key: tuple, build_args: tuple, build_kwargs: dict | None = None):
        """The kernel of ``key``: from the table, else ``lcmac.load`` of
        ``cached_build(*build_args, **build_kwargs)`` (the kernel cache, compiled there on a
        miss, once whatever the processes asking)."""
        fn = self._table.get(key)
        if fn is not None:
            return fn
        with self._lock:
            klock = self._locks.setdefault(key, threading.Lock())
        with klock:
            fn = self._table.get(key)
            if fn is None:
                fn = self._table[key] = load(cached_build(*build_args, **(build_kwargs or {})).manifest)
        return fn

    def clear(self) -> None:
        with self._lock:
            self._table.clear()


#: the kernels lcmac.matmul and lcmac.bmm have loaded (``lcmac.ops.release_kernels`` drops them)
LOADED = LoadedKernels()
