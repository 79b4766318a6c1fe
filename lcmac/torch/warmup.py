"""Compiling ahead of the first call the kernels that lcmac layers will run at given row counts.

A layer compiles a bucket kernel the first time a call needs it (``lcmac.matmul``), seconds on
a CPU, in the middle of a forward.  ``layer_kernels`` lists, without compiling, the kernels a
layer runs at a row count: none under its crossover (torch runs those rows), else what
``lcmac.ops.kernel_keys`` names for that product.  ``compile_kernels`` loads them all,
compiling the missing ones into the kernel cache in parallel: each compile runs in its own
compiler process (``lcmac.artifact.worker``), so threads here only wait on them, and the
cache's per-kernel lock keeps two processes from compiling one kernel twice.
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

from lcmac.api import matmul as ops
from lcmac.core.errors import LcmacError
from lcmac.torch.fp8 import FP8, fp8_target

__all__ = ["layer_kernels", "layer_target", "compile_kernels", "describe_key"]


def layer_kernels(layer, rows: int) -> list[tuple]:
    """``lcmac.ops.kernel``'s keys for ``layer`` (an ``lcmac.nn.Linear``) at ``rows`` rows,
    in the weight's dtype."""
    if rows < layer.crossover:
        return []
    w = layer.weight
    dtype = str(w.dtype).replace("torch.", "")
    operands = getattr(layer, "operands", "native")
    mode = {} if operands == "native" else {"operands": operands}
    return ops.kernel_keys(rows, layer.out_features, layer.in_features, dtype, algo=layer.algo,
                           max_error=layer.max_error, target=layer_target(layer), **mode)


def layer_target(layer) -> str:
    """The lcmac target ``layer``'s kernels are for: its weight's device's (an fp8 layer's:
    ``lcmac.torch.fp8.fp8_target``, which refuses a device without fp8 kernels by name)."""
    if getattr(layer, "operands", "native") == FP8:
        return fp8_target(layer.weight)
    return ops.target_for(layer.weight.device.type)


def describe_key(key: tuple) -> str:
    """A kernel key in words: "strassen x86_64-avx512 float32 256x45x53"."""
    algo, target, dtype, shape, *mode = key
    return " ".join([algo, target, dtype, "x".join(map(str, shape)), *mode])


def compile_kernels(keys, workers: int | None = None) -> list[tuple]:
    """Load every kernel of ``keys`` (each once), compiling those the cache lacks with up to
    ``workers`` compiles at a time (default: one per CPU core); the keys, in order."""
    todo = list(dict.fromkeys(tuple(k) for k in keys))
    if not todo:
        return []
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int)
                                or workers < 1):
        raise ValueError(f"workers must be a positive number of parallel compiles, got {workers!r}")
    n = min(len(todo), workers or os.cpu_count() or 1)

    def load(key):
        try:
            ops.kernel(*key)
        except LcmacError as e:
            raise type(e)(f"warming up the {describe_key(key)} kernel: {e}") from None
    with ThreadPoolExecutor(max_workers=n, thread_name_prefix="lcmac-warmup") as pool:
        list(pool.map(load, todo))
    return todo
