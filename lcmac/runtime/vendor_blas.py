"""Binding the vendor BLAS to an artifact whose products run on it (config ``vendor_base``,
``lcmac.schedules.cpu_vendor``): the library exports pointer slots that its loader fills with
a CBLAS ``?gemm`` found at load time (no compiler, no link step).

Where the BLAS comes from, first found wins:

1. ``LCMAC_BLAS``: a shared library path (OpenBLAS, MKL's ``libmkl_rt``, BLIS, ...);
2. the OpenBLAS numpy ships (``numpy.libs/libscipy_openblas64_*.so``, 64-bit integers) —
   the BLAS ``numpy.matmul`` itself runs, so lcmac and numpy multiply the same way;
3. a system CBLAS by name (``openblas``, ``mkl_rt``, ``blis``, ``cblas``).

Symbols tried in a library: ``cblas_<s|d>gemm`` (32-bit integers), ``scipy_cblas_<s|d>gemm64_``
and ``cblas_<s|d>gemm64_`` (64-bit integers).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import glob
import importlib.util
import os
import threading

from lcmac.core.errors import ArtifactError

_lock = threading.Lock()
_found: dict[str, tuple] = {}


def _symbols(letter: str) -> list[tuple[str, str]]:
    """(symbol, "lp64" | "ilp64") in the order tried."""
    return [(f"cblas_{letter}gemm", "lp64"), (f"scipy_cblas_{letter}gemm64_", "ilp64"),
            (f"cblas_{letter}gemm64_", "ilp64")]


def _numpy_openblas() -> list[str]:
    spec = importlib.util.find_spec("numpy")
    if spec is None or not spec.submodule_search_locations:
        return []
    root = os.path.dirname(list(spec.submodule_search_locations)[0])
    return sorted(glob.glob(os.path.join(root, "numpy.libs", "lib*openblas*.so*")))


def _candidates() -> list[str]:
    env = os.environ.get("LCMAC_BLAS")
    if env:
        return [env]           # asked for: that one or an error, never another silently
    names = [ctypes.util.find_library(n) for n in ("openblas", "mkl_rt", "blis", "cblas")]
    return _numpy_openblas() + [n for n in names if n]


def find(letter: str) -> tuple[int, str, str, str]:
    """(function address, ABI "lp64"/"ilp64", symbol, library path) of a CBLAS
    ``cblas_<letter>gemm``; ArtifactError naming what was tried when there is none."""
    with _lock:
        hit = _found.get(letter)
        if hit is not None:
            return hit
        tried = []
        for path in _candidates():
            try:
                lib = ctypes.CDLL(path, mode=ctypes.RTLD_LOCAL)
            except OSError as e:
                tried.append(f"{path} (cannot load: {e})")
                continue
            for sym, abi in _symbols(letter):
                fn = getattr(lib, sym, None)
                if fn is not None:
                    _found[letter] = (ctypes.cast(fn, ctypes.c_void_p).value, abi, sym, path)
                    _found[letter + "lib"] = lib        # keeps it mapped
                    return _found[letter]
            tried.append(f"{path} (no cblas_{letter}gemm)")
        raise ArtifactError(
            f"this artifact runs its products on a vendor BLAS and none was found "
            f"(tried: {'; '.join(tried) or 'nothing: no numpy OpenBLAS, no system CBLAS'}); set "
            f"LCMAC_BLAS to a CBLAS shared library (e.g. libopenblas.so)")


def bind(so: ctypes.CDLL, slots: dict) -> str:
    """Fill the library's slots (the manifest's ``extra.vendor_blas``) with a CBLAS; returns
    what was bound, in words."""
    routine = slots.get("routine", "cblas_sgemm")
    letter = routine[len("cblas_")] if routine.startswith("cblas_") else "s"
    addr, abi, sym, path = find(letter)
    try:
        slot = ctypes.c_void_p.in_dll(so, slots[f"{abi}_slot"])
    except (KeyError, ValueError):
        raise ArtifactError(f"the library lacks the vendor-BLAS slot {slots.get(f'{abi}_slot')!r} "
                            "its manifest names: rebuild it") from None
    slot.value = addr
    return f"{sym} ({abi}) from {path}"
