"""Where compiled bit kernels are kept: a kernel store (``lcmac.artifact.store``) under
``<lcmac cache root>/bits/`` (``lcmac.core.cachedir``; with ``LCMAC_CACHE_DIR=off``, a
temporary directory that lives as long as the process)::

    <dir>/<key>/kernel.so, entry.json        the native CPU kernel (``lcmac.bits.native_build``)
    <dir>/cuda-<key>/kernel.so, entry.json   the GPU library of one architecture (``lcmac.bits.cuda``)

Each entry.json records the library's sha256; a library that does not match is rebuilt, not
loaded.  ``lcmac cache`` lists and clears these entries beside the LCMA kernels'.
"""
from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

from lcmac.artifact.manifest import sha256_file
from lcmac.artifact.store import Spec, Store
from lcmac.core.cachedir import cache_root
from lcmac.core.errors import ArtifactError

__all__ = ["LIBRARY", "CUDA_PREFIX", "cache_dir", "store", "library_check", "valid_library",
           "obtain", "lookup", "cached_kernels", "clear_kernels"]

#: the library file of every entry
LIBRARY = "kernel.so"
#: the key prefix of the GPU libraries' entries
CUDA_PREFIX = "cuda-"
_scratch_dir: Path | None = None


def cache_dir() -> Path:
    """Where compiled bit kernels are kept (see the module's docstring)."""
    global _scratch_dir
    root = cache_root()
    if root is not None:
        return root / "bits"
    if _scratch_dir is None:               # the disk caches are off: this process's own
        _scratch_dir = Path(tempfile.mkdtemp(prefix="lcmac-bits-"))
        atexit.register(shutil.rmtree, _scratch_dir, True)
    return _scratch_dir


def store() -> Store:
    return Store(cache_dir(), "bit-kernel cache", "set LCMAC_CACHE_DIR to a writable directory")


def _library(entry: Path, meta: dict) -> Path:
    """The entry's library, if it matches the sha256 its entry.json records."""
    lib = entry / LIBRARY
    if meta.get("sha256") != sha256_file(lib):
        raise ArtifactError(f"its {LIBRARY} does not match the sha256 its entry records")
    return lib


def library_check(spec: Spec, entry: Path, meta: dict) -> Path:
    """The store's check of a bit-kernel entry: its library, sha256 verified."""
    return _library(entry, meta)


def valid_library(entry: Path, key: str) -> Path | None:
    """The library of the entry at ``entry`` if it is complete and ``key``'s, else None."""
    try:
        return Store(entry.parent).read_key(key, _library)
    except ArtifactError:
        return None


def obtain(specs, build) -> list[Path]:
    """The libraries of ``specs`` (``lcmac.artifact.store.Spec``), the missing ones built by
    one call of ``build([(spec, scratch directory)])``, which writes each ``kernel.so`` and
    returns what each entry records beside its sha256."""
    def recorded(jobs):
        records = build(jobs)
        return [{**(r or {}), "sha256": sha256_file(tmp / LIBRARY)} for (_, tmp), r in zip(jobs, records)]
    return [got.product for got in store().obtain(specs, library_check, recorded)]


def lookup(spec: Spec) -> Path | None:
    """The library of ``spec`` if it is on disk and whole (no lock, no write)."""
    return store().lookup(spec, library_check)


# ---- what ``lcmac cache`` shows and clears --------------------------------------------------
def cached_kernels() -> list[dict]:
    """The bit kernels on disk (native CPU kernels and the GPU library of each architecture):
    key, kind, what it is for, bytes, and whether the entry is whole."""
    out = []
    for e in store().entries(_library):
        fields = e.meta.get("fields", {})
        fields = fields if isinstance(fields, dict) else {}
        cuda = e.key.startswith(CUDA_PREFIX)
        out.append({"key": e.key, "kind": "cuda" if cuda else "native",
                    "for": fields.get("arch") if cuda else fields.get("semiring"),
                    "bytes": e.bytes, "ok": e.ok})
    return out


def clear_kernels() -> dict:
    """Remove every bit-kernel entry not being built right now (its lock free); returns
    {entries, bytes} removed.  A process that has a library loaded keeps its mapping."""
    return store().clear()
