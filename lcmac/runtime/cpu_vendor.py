"""The CPU's vendor GEMMs, and which of them is "the vendor GEMM" for numpy arrays.

A Python process on a CPU has up to two: ``numpy.matmul`` (the BLAS numpy links, OpenBLAS in
numpy's wheels) and, where torch is installed, ``torch.matmul`` (MKL for float32 / float64 in
torch's x86 wheels, oneDNN for bfloat16 / float16).  Which is faster depends on the CPU, the
dtype and the size: MKL is Intel's own, while on the AMD EPYC VM of bench/experiments/cpu.md
numpy's OpenBLAS led (torch.matmul 0.75-0.79x at 2048³-4096³).  So the choice is measured
(``lcmac.tune.measure.choose_cpu_vendor``: paired rounds, alternating order) per device
(``lcmac.spec.device.cpu_identity``), dtype and size class, once, and kept in lcmac's cache
directory (``cpu_vendor/``, one entry per device fingerprint, dtype, class, the two libraries'
versions and what sets their thread counts: a new numpy or torch measures again).

- ``gemms(dtype)``: the vendor GEMMs this process has for a dtype (``CpuGemm``: its api,
  library, version and thread count);
- ``chosen(dtype, M, N, K, logged=None)``: the kept choice for the product's class; where
  none is kept, the api the tuning records of a decision name (``logged``: a decision for
  "vendor" carries it, ``Plan.vendor_api``), else numpy's (torch is then not imported);
- ``matmul(A, B, out=None)``: A·B of numpy arrays by the kept choice; torch runs on
  ``torch.from_numpy`` views (no copy) and writes into ``out`` itself.

**Size classes** (``SIDES``): a product's class is the side nearest (in log scale) to the cube
root of M·N·K, measured on that cube.  Products under ``SMALL_SIDE``³ always run on numpy:
there the call overhead decides (torch's dispatch costs microseconds more than numpy's).

**Never measured inside a call the user did not ask to measure.**  A measurement that tells
two libraries apart takes seconds at the larger classes (rounds of calls of 0.1-1 s each on a
2-core VM), far over the 50 ms a call could hide; a cheaper one (a few small calls) would time
thread wake-ups, not the GEMMs.  So ``lcmac.matmul`` only reads the kept choice; ``lcmac tune``
on a CPU measures the class of the shape it tunes (its vendor baseline is that choice), and
``lcmac.tune.measure.choose_cpu_vendor`` measures any class when called.  The first call of a
class whose kept choice is torch imports torch (about a second, once per process).

**Threads.**  Each library runs its own pool: numpy's OpenBLAS its count (OPENBLAS_NUM_THREADS,
else one per CPU), torch its intra-op count (``torch.set_num_threads``, OMP_NUM_THREADS, else
one per physical core).  lcmac changes neither.  A choice is kept per numpy thread count and
thread variables (another setting is another choice, measured anew), records both counts, and
holds only while both are as measured: after a ``torch.set_num_threads`` to another count numpy
runs (said once in lcmac's log).

``LCMAC_CPU_VENDOR=numpy`` (or ``torch``) pins the choice for every class, measured or not.
"""
from __future__ import annotations

import ctypes
import functools
import importlib.metadata
import importlib.util
import json
import logging
import math
import os
import re
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from lcmac.artifact.store import Spec, Store
from lcmac.core.cachedir import cache_root
from lcmac.core.errors import ArtifactError, LcmacError
from lcmac.runtime.vendor_blas import _numpy_openblas
from lcmac.spec.device import cpu_identity

__all__ = ["NUMPY", "TORCH", "SIDES", "SMALL_SIDE", "ENV", "SCHEMA", "CpuGemm", "gemms",
           "numpy_gemm", "torch_gemm", "size_class", "chosen", "kept_choice", "matmul", "forget",
           "vendor_call"]

NUMPY, TORCH = "numpy.matmul", "torch.matmul"
#: the size classes, by the side of the cube each is measured on
SIDES = (128, 256, 512, 1024, 2048)
#: products of fewer than SMALL_SIDE³ multiply-adds run on numpy, unmeasured (module doc)
SMALL_SIDE = 64
#: the environment switch that pins the choice
ENV = "LCMAC_CPU_VENDOR"
SCHEMA = "lcmac-cpu-vendor/1"
CHOICE_FILE = "choice.json"
#: the dtypes each library multiplies on a CPU
NUMPY_DTYPES = ("float32", "float64")
TORCH_DTYPES = ("float32", "float64", "bfloat16", "float16")

log = logging.getLogger(__name__)
_lock = threading.Lock()


@dataclass(frozen=True)
class CpuGemm:
    """One vendor GEMM: ``api`` (``NUMPY`` or ``TORCH``), the ``library`` behind it for the
    dtype ("scipy-openblas", "mkl", "onednn", …), the package's ``version`` and the thread
    count it runs with (None: unknown)."""
    api: str
    library: str
    version: str
    threads: int | None

    def config(self) -> dict:
        """The ``config`` of a tuning record of this vendor GEMM."""
        package = "numpy" if self.api == NUMPY else "torch"
        return {"library": self.library, "api": self.api, package: self.version,
                "threads": self.threads}

    @classmethod
    def from_config(cls, cfg: dict) -> "CpuGemm":
        api = cfg["api"]
        return cls(api, str(cfg.get("library", "?")),
                   str(cfg.get("numpy" if api == NUMPY else "torch", "")), cfg.get("threads"))

    def describe(self) -> str:
        threads = "? threads" if self.threads is None else f"{self.threads} threads"
        return f"{self.api} ({self.library}, {self.version}, {threads})"

    def __call__(self, A, B, out=None):
        """A·B, numpy arrays (or, for torch, torch tensors) in, the same kind out."""
        if self.api == NUMPY:
            return np.matmul(A, B, out=out)
        torch = _torch()
        if torch is None:
            raise LcmacError("torch.matmul was chosen as the CPU's vendor GEMM but torch does "
                             "not import in this process")
        if isinstance(A, np.ndarray):
            C = torch.matmul(torch.from_numpy(A), torch.from_numpy(B),
                             out=None if out is None else torch.from_numpy(out))
            return out if out is not None else C.numpy()
        return torch.matmul(A, B, out=out)


# ---- the libraries ----------------------------------------------------------------------------
def _torch():
    """torch, imported now if need be; None where it does not import."""
    mod = sys.modules.get("torch")
    if mod is not None:
        return mod
    if "torch" in sys.modules or importlib.util.find_spec("torch") is None:
        return None
    try:
        import torch
    except Exception:  # noqa: BLE001 - a broken install is no vendor GEMM
        return None
    return torch


def _torch_installed() -> bool:
    """Whether torch may import, asked without importing it."""
    if "torch" in sys.modules:
        return sys.modules["torch"] is not None
    return _torch_findable()


@functools.lru_cache(maxsize=1)
def _torch_findable() -> bool:
    return importlib.util.find_spec("torch") is not None


def _torch_version() -> str | None:
    """torch's version from its package metadata (no import), None where it is absent."""
    if not _torch_installed():
        return None
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        mod = sys.modules.get("torch")
        return getattr(mod, "__version__", None)


@functools.lru_cache(maxsize=1)
def _numpy_blas() -> str:
    try:
        cfg = np.show_config(mode="dicts")
        return str(cfg.get("Build Dependencies", {}).get("blas", {}).get("name", "?"))
    except Exception:  # noqa: BLE001 - older numpy
        return "?"


@functools.lru_cache(maxsize=1)
def _openblas_threads_fn():
    """numpy's OpenBLAS ``get_num_threads`` (the library numpy loaded: dlopen of its path
    gives that one), or None."""
    for path in _numpy_openblas():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for sym in ("scipy_openblas_get_num_threads64_", "openblas_get_num_threads64_",
                    "openblas_get_num_threads"):
            fn = getattr(lib, sym, None)
            if fn is not None:
                fn.restype = ctypes.c_int
                return fn
    return None


def numpy_threads() -> int | None:
    """The threads numpy's BLAS runs with now (None: a BLAS this cannot ask)."""
    fn = _openblas_threads_fn()
    return int(fn()) if fn is not None else None


def numpy_gemm(dtype: str) -> CpuGemm | None:
    """numpy.matmul for ``dtype`` (None: numpy has no such dtype)."""
    if dtype not in NUMPY_DTYPES:
        return None
    return CpuGemm(NUMPY, _numpy_blas(), np.__version__, numpy_threads())


@functools.lru_cache(maxsize=None)
def _torch_library(dtype: str) -> str:
    torch = _torch()
    m = re.search(r"BLAS_INFO=(\w+)", torch.__config__.show())
    blas = {"mkl": "mkl", "open": "openblas"}.get(m.group(1), m.group(1)) if m else "aten"
    if dtype in ("bfloat16", "float16") and torch.backends.mkldnn.is_available():
        return "onednn"
    return blas


def torch_gemm(dtype: str) -> CpuGemm | None:
    """torch.matmul for ``dtype`` on CPU tensors (None: torch does not import here, or has
    no such dtype).  Imports torch."""
    if dtype not in TORCH_DTYPES:
        return None
    torch = _torch()
    if torch is None:
        return None
    return CpuGemm(TORCH, _torch_library(dtype), str(torch.__version__), int(torch.get_num_threads()))


def gemms(dtype: str) -> list[CpuGemm]:
    """The vendor GEMMs this process has for ``dtype``, numpy's first (imports torch)."""
    return [g for g in (numpy_gemm(dtype), torch_gemm(dtype)) if g is not None]


# ---- size classes -----------------------------------------------------------------------------
#: (the least work of each class, its side): classes meet at the geometric means of their sides
_CLASS_FLOORS = tuple(zip([float(SMALL_SIDE) ** 3] + [(a * b) ** 1.5 for a, b in zip(SIDES, SIDES[1:])],
                          SIDES))


def size_class(M: int, N: int, K: int) -> int | None:
    """The side of ``SIDES`` nearest (log scale) to (M·N·K)^⅓; None under ``SMALL_SIDE``³."""
    work = float(M) * float(N) * float(K)
    side = None
    for floor, s in _CLASS_FLOORS:      # a comparison per class: this runs on every call
        if work < floor:
            break
        side = s
    return side


# ---- the kept choice --------------------------------------------------------------------------
def _store() -> Store | None:
    root = cache_root()
    return None if root is None else Store(root / "cpu_vendor", "CPU vendor-GEMM choice")


#: the environment variables torch's and numpy's BLAS take their thread counts from
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def _spec(dtype: str, side: int) -> Spec:
    """The kept choice's key: the device, dtype, class, both libraries' versions and what sets
    their thread counts, all read without importing torch (a count torch.set_num_threads
    changed in the process is caught when the choice is used, ``_as_measured``)."""
    device = cpu_identity()
    return Spec({"format": SCHEMA, "device": device.fingerprint, "identity": device.to_dict(),
                 "dtype": dtype, "side": int(side), "numpy": np.__version__,
                 "torch": _torch_version(), "numpy_threads": numpy_threads(),
                 "thread_env": {v: os.environ.get(v) for v in THREAD_ENV}},
                prefix="choice-", what=f"the CPU vendor GEMM for {dtype} at {side}³")


def _read(spec: Spec, entry: Path, meta: dict) -> dict:
    doc = json.loads((entry / CHOICE_FILE).read_text())
    if doc.get("schema") != SCHEMA or doc.get("chosen") not in doc.get("gemms", {}):
        raise ArtifactError(f"its {CHOICE_FILE} is not {SCHEMA}")
    return doc


#: (LCMAC_CACHE_DIR, dtype, class) → (the CpuGemm that runs it in this process, whether a
#: choice is kept: a call that may measure looks again where none was)
_memo: dict[tuple, tuple[CpuGemm, bool]] = {}
#: moves on whenever a choice in ``_memo`` is replaced or dropped: a caller that keeps what
#: ``vendor_call`` returned keeps it while this stays (and ``ENV`` and LCMAC_CACHE_DIR stay)
generation = 0


def forget() -> None:
    """Drop this process's memory of the kept choices (the next call reads them again)."""
    global generation
    with _lock:
        _memo.clear()
        generation += 1


def kept_choice(dtype: str, side: int, *, measurer: Callable[[str, int], dict] | None = None
                ) -> dict | None:
    """The kept choice for ``dtype`` at the class ``side``: its document (``chosen``: the api;
    ``gemms``: api → config as measured; the measurement), measured now by ``measurer(dtype,
    side)`` where none is kept and one is given (then kept), else None.  None too with the disk
    caches off."""
    store = _store()
    if store is None:
        return None
    spec = _spec(dtype, side)
    got = store.lookup(spec, _read)
    if got is not None or measurer is None:
        return got

    def build(jobs):
        for _, tmp in jobs:
            doc = {"schema": SCHEMA, "dtype": dtype, "side": int(side), **measurer(dtype, side)}
            (tmp / CHOICE_FILE).write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
        return [{"device": cpu_identity().name} for _ in jobs]
    return store.obtain([spec], _read, build)[0].product


def _as_measured(doc: dict) -> CpuGemm:
    """The kept choice's GEMM where it still runs as measured (the same thread counts, torch
    importable), else numpy's (said in the log)."""
    dtype = doc["dtype"]
    want = CpuGemm.from_config(doc["gemms"][doc["chosen"]])
    fallback = numpy_gemm(dtype)
    if want.api == NUMPY or fallback is None:
        return fallback or want
    now = {g.api: g for g in gemms(dtype)}
    if TORCH not in now:
        log.info("lcmac: %s was measured faster for %s at %d³ but torch does not import here; "
                 "numpy.matmul runs", want.describe(), dtype, doc["side"])
        return fallback
    then = {api: CpuGemm.from_config(c).threads for api, c in doc["gemms"].items()}
    moved = [api for api, g in now.items() if api in then and g.threads != then[api]]
    if moved:
        log.info("lcmac: the CPU vendor GEMM for %s at %d³ was measured with %s threads; now %s "
                 "(torch.set_num_threads?): numpy.matmul runs", dtype, doc["side"],
                 ", ".join(f"{a} {then[a]}" for a in moved),
                 ", ".join(f"{a} {now[a].threads}" for a in moved))
        return fallback
    return now[TORCH]


def _pinned(dtype: str) -> CpuGemm | None:
    want = os.environ.get(ENV, "").strip().lower()
    if not want:
        return None
    if want not in ("numpy", "torch"):
        raise LcmacError(f"{ENV} must be 'numpy' or 'torch' (or unset), got {want!r}")
    g = numpy_gemm(dtype) if want == "numpy" else torch_gemm(dtype)
    return g or numpy_gemm(dtype) or torch_gemm(dtype)


def chosen(dtype: str, M: int, N: int, K: int, *,
           measurer: Callable[[str, int], dict] | None = None, logged: str | None = None) -> CpuGemm | None:
    """The vendor GEMM that multiplies M×K by K×N of ``dtype`` here: ``ENV``'s pin, else the
    kept choice of the product's class (measured by ``measurer`` where none is kept and one
    is given), else ``logged`` (the api a decision's tuning records name, ``Plan.vendor_api``)
    where this process has it, else numpy's; the only one where the process has one (torch
    for bfloat16).  None where neither library has the dtype."""
    return _chosen_at(dtype, size_class(M, N, K), measurer, logged)


def _chosen_at(dtype: str, side: int | None, measurer=None, logged: str | None = None) -> CpuGemm | None:
    """``chosen`` for a product of the size class ``side``."""
    pinned = _pinned(dtype)
    if pinned is not None:
        return pinned
    if dtype not in NUMPY_DTYPES:             # numpy lacks the dtype: torch's, if any
        return torch_gemm(dtype)
    if side is None or not _torch_installed():
        return numpy_gemm(dtype)
    key = (os.environ.get("LCMAC_CACHE_DIR"), dtype, side, logged)
    hit = _memo.get(key)
    if hit is not None and (hit[1] or measurer is None):
        return hit[0]
    doc = kept_choice(dtype, side, measurer=measurer)
    if doc is not None:
        g = _as_measured(doc)
    else:       # nothing measured in this cache: the tuning records' word, else numpy's
        g = (torch_gemm(dtype) if logged == TORCH else None) or numpy_gemm(dtype)
    global generation
    with _lock:
        if _memo.get(key, (g, doc is not None)) != (g, doc is not None):
            generation += 1       # a choice replaced (a new one is no change)
        _memo[key] = (g, doc is not None)
    return g


# ---- numpy arrays -----------------------------------------------------------------------------
def _viewable(x) -> bool:
    """Whether torch.from_numpy takes ``x`` as it is: aligned, writable, native byte order,
    no negative strides."""
    f = x.flags
    return f.aligned and f.writeable and x.dtype.isnative and all(s >= 0 for s in x.strides)


def _torch_takes(A, B, out) -> bool:
    """Whether torch.matmul computes numpy.matmul(A, B, out=out) on views of the same memory:
    2-D B, A of ≥ 2 dimensions, one dtype; ``out`` contiguous, of the exact result's shape and
    dtype, sharing no memory with A or B (numpy buffers such a call; torch refuses it)."""
    if B.ndim != 2 or A.ndim < 2 or A.dtype != B.dtype or not (_viewable(A) and _viewable(B)):
        return False
    if out is None:
        return True
    return (isinstance(out, np.ndarray) and out.dtype == A.dtype and _viewable(out)
            and out.flags.c_contiguous and out.shape == (*A.shape[:-1], B.shape[1])
            and not np.may_share_memory(out, A) and not np.may_share_memory(out, B))


def vendor_call(dtype: str, M: int, N: int, K: int, logged: str | None = None) -> Callable:
    """``f(A, B)``: what ``matmul(A, B, logged=logged)`` runs for numpy arrays of ``dtype``
    whose product is M×K by K×N, resolved now (valid while ``generation``, ``ENV`` and
    LCMAC_CACHE_DIR stay): ``numpy.matmul``, or torch's on views where it is the choice and
    takes the operands."""
    side = size_class(M, N, K) if dtype in NUMPY_DTYPES else None
    g = _chosen_at(dtype, side, logged=logged) if side is not None else None
    if g is None or g.api != TORCH:
        return np.matmul

    def call(A, B):
        return g(A, B, None) if _torch_takes(A, B, None) else np.matmul(A, B)
    return call


def matmul(A, B, out=None, logged: str | None = None):
    """``numpy.matmul(A, B, out=out)`` by the CPU's chosen vendor GEMM (``chosen``, with the
    api a decision's records name, ``logged``): torch's on views of A, B and ``out`` where it
    is the choice and takes the operands as they are (``_torch_takes``), numpy's otherwise."""
    if (type(A) is np.ndarray and type(B) is np.ndarray and A.dtype.name in NUMPY_DTYPES
            and A.ndim >= 2 and B.ndim == 2 and A.shape[-1] == B.shape[0]):
        side = size_class(math.prod(A.shape[:-1]), B.shape[1], B.shape[0])
        if side is not None:
            g = _chosen_at(A.dtype.name, side, logged=logged)
            if g is not None and g.api == TORCH and _torch_takes(A, B, out):
                return g(A, B, out)
    return np.matmul(A, B, out=out)
