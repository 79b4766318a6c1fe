"""The kernel cache: LCMA artifacts compiled on first use and loaded afterwards.

``cached_build(algo, target, dtype, shape)`` returns the manifest of an artifact for that
case from the cache directory, compiling it there (``build``) only when no valid entry
exists.  Where the cache lives: ``$LCMAC_CACHE_DIR/kernels`` if ``LCMAC_CACHE_DIR`` (lcmac's
cache directory) is set, else ``$XDG_CACHE_HOME/lcmac/kernels``, else
``~/.cache/lcmac/kernels``.

The directory is a kernel store (``lcmac.artifact.store``: one directory per key, built under
the key's lock in a scratch directory and renamed into place, validated on every hit)::

    <root>/<key>/entry.json          what the key was made of, the manifest's name, the date
    <root>/<key>/<name>.json, .so    the artifact (manifest + library)

The key is the sha256 of a canonical JSON of :func:`cache_key`'s fields: the algorithm's
coefficients (``Algorithm.hash``, ``"gemm"`` for the plain GEMM), the target, the dtype, the
shape rule (``exact:MxNxK``: an artifact accepts one shape), the config as the build resolves
it (CPU: every knob, the tuning log's record for this shape included; CUDA: the requested
knobs merged over the tuning log's record, as the worker receives them), the LLVM CPU, the
lcmac version, the schedule family's ``schedule_version``, the compiler's version and the
digest of the template sources.  A hit is valid when its manifest describes this key's case
and the library's sha256 matches the manifest.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import logging
from dataclasses import dataclass, field
from pathlib import Path

from lcmac.core import version as _version
from lcmac.core.cachedir import cache_root
from lcmac.core.dtypes import normalize_dtype
from lcmac.core.errors import ArtifactError
from lcmac.spec.registry import FAMILIES
from lcmac.core.shapes import parse_shape
from lcmac.spec.targets import schedule_family
from lcmac.artifact import build as _build
from lcmac.artifact.manifest import Manifest, verify_library
from lcmac.artifact.store import ENTRY_FILE, CacheWarning, Spec, Store, dir_bytes
from lcmac.artifact.tuning_log import device_name

#: what the tuning log says of a config, when that config is compiled (silent unless the
#: application shows lcmac's log, as the ``lcmac`` command does)
log = logging.getLogger(__name__)

KEY_FORMAT = "lcmac-kernel-cache/1"
COMPILER_PACKAGES = {"tvm": "apache-tvm", "tilelang": "tilelang"}
__all__ = ["cached_build", "cache_key", "cache_dir", "entries", "info", "clear", "CacheHit",
           "CacheEntry", "CacheWarning", "templates_digest"]


@dataclass(frozen=True)
class CacheHit:
    """What ``cached_build`` returns: ``manifest`` (usable as a path: ``lcmac.load(hit)``),
    whether this call compiled it, whether it replaced a damaged entry, the key and the
    entry's directory."""
    manifest: Path
    compiled: bool
    key: str
    entry: Path
    repaired: bool = False
    fields: dict = field(default_factory=dict, compare=False, repr=False)

    def __fspath__(self) -> str:
        return str(self.manifest)


@dataclass(frozen=True)
class CacheEntry:
    """One directory of the cache, as ``entries()`` reads it (``ok`` False: its entry.json or
    manifest cannot be read; the next ``cached_build`` of that key rebuilds it)."""
    key: str
    path: Path
    manifest: Path | None
    algorithm: str
    target: str
    dtype: str
    shape_rule: str
    lcmac_version: str
    created: str
    bytes: int
    ok: bool
    config: dict = field(default_factory=dict, compare=False, repr=False)


@dataclass(frozen=True)
class _Request:
    """A build request resolved as ``build`` resolves it: the store's spec, the algorithm's
    display name, ``build``'s arguments (the resolved config included) and what the tuning
    log said of the config (shown when compiling)."""
    spec: Spec
    name: str
    build_kw: dict
    notes: tuple[str, ...]

    @property
    def key(self) -> str:
        return self.spec.key

    @property
    def fields(self) -> dict:
        return self.spec.fields


# ---- where ----------------------------------------------------------------------------------
def cache_dir(path=None) -> Path:
    """The kernel cache's root: ``path`` if given, else ``$LCMAC_CACHE_DIR/kernels``, else
    ``$XDG_CACHE_HOME/lcmac/kernels``, else ``~/.cache/lcmac/kernels`` (not created here).
    ``LCMAC_CACHE_DIR`` is lcmac's cache directory (the CSE results live beside, in ``cse/``);
    ``LCMAC_CACHE_DIR=off`` turns the disk caches off, this one included."""
    if path is not None:
        return Path(path).expanduser()
    root = cache_root()
    if root is None:
        raise ArtifactError("the kernel cache is off (LCMAC_CACHE_DIR=off): set LCMAC_CACHE_DIR "
                            "to a directory, or build artifacts with lcmac.build(out_dir=...) "
                            "and pass their directory to lcmac.auto")
    return root / "kernels"


def _store(path) -> Store:
    return Store(cache_dir(path).resolve(), "kernel cache",
                 "set LCMAC_CACHE_DIR to a writable directory (the cache is its kernels/ "
                 "subdirectory), or pass cache_dir=")


# ---- the key ---------------------------------------------------------------------------------
#: the packages whose source decides what code a build emits (templates, their configs, the
#: compiler workers); their digest is part of the key
TEMPLATE_PACKAGES = ("spec", "schedules", "targets")


@functools.lru_cache(maxsize=1)
def templates_digest() -> str:
    """sha256 of the template and worker sources (``TEMPLATE_PACKAGES``): a template fix (a
    kernel that now waits on the previous one, say) makes new kernels even where
    ``schedule_version`` was not bumped, as Triton keys its cache by its own source."""
    pkg = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for sub in TEMPLATE_PACKAGES:
        for f in sorted((pkg / sub).rglob("*.py")):
            h.update(f.relative_to(pkg).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def _compiler_version(backend: str) -> str | None:
    pkg = COMPILER_PACKAGES.get(backend)
    try:
        return f"{pkg} {importlib.metadata.version(pkg)}" if pkg else None
    except importlib.metadata.PackageNotFoundError:
        return None


def _request(algo, target, dtype, shape, config, levels: int, mcpu) -> _Request:
    """Resolve the request as ``build`` would (no compiling) and derive the key."""
    t = _build.resolve_target(target)
    dtype = normalize_dtype(dtype)
    _build.check_dtype(t, dtype, config)
    M, N, K = parse_shape(shape)
    alg, plain, name = _build.resolve_algorithm(algo, levels)
    notes: list[str] = []                      # the tuning log's notes: shown on a compile only
    cfg = _build.build_config(t, dtype, config, alg, plain, (M, N, K), notes=notes, mcpu=mcpu)
    cpu = mcpu
    if mcpu == "native":                       # "this host's CPU": name it, a cache may be shared
        cpu = f"native ({device_name()})"
    fields = {
        "format": KEY_FORMAT,
        "algorithm": "gemm" if plain else alg.hash,
        "target": t.name,
        "dtype": dtype,
        "shape_rule": f"exact:{M}x{N}x{K}",
        "config": cfg,
        "mcpu": cpu,
        "lcmac_version": _version.__version__,
        "schedule_version": FAMILIES[schedule_family(t)].schedule_version,
        "compiler": _compiler_version(t.backend),
        "templates": templates_digest(),
    }
    kw = {"algo": algo, "target": t, "dtype": dtype, "shape": (M, N, K), "levels": levels,
          "config": cfg, "mcpu": mcpu}
    what = f"{name} {t.name} {dtype} {fields['shape_rule']}"
    return _Request(Spec(fields, what=what), name, kw, tuple(notes))


def cache_key(algo, target=None, dtype="float32", shape=None, *, config=None, levels: int = 1,
              mcpu: str | None = None) -> tuple[str, dict]:
    """(key, fields): the cache key of a build request and what it is the sha256 of.  Builds
    nothing; reads the tuning log as ``build`` does to resolve the config."""
    s = _request(algo, target, dtype, shape, config, levels, mcpu)
    return s.key, s.fields


# ---- entries ---------------------------------------------------------------------------------
def _manifest_of(entry: Path, meta: dict) -> Path:
    """The manifest an entry.json names (not read)."""
    man_name = meta.get("manifest")
    if not isinstance(man_name, str) or Path(man_name).name != man_name:
        raise ArtifactError(f"its {ENTRY_FILE} names no manifest")
    return entry / man_name


def _check_entry(spec: Spec, entry: Path, meta: dict) -> Path:
    """The manifest of a valid entry of ``spec``; ArtifactError saying what is damaged."""
    if meta.get("format") != KEY_FORMAT:
        raise ArtifactError(f"its {ENTRY_FILE} is not this key's")
    man_path = _manifest_of(entry, meta)
    man = Manifest.read(man_path)
    f = spec.fields
    if ((man.algorithm.get("hash") or "gemm") != f["algorithm"]
            or man.target.get("name") != f["target"] or man.dtype != f["dtype"]
            or f"exact:{man.M}x{man.N}x{man.K}" != f["shape_rule"]
            or Path(str(man.library.get("file"))).name != man.library.get("file")):
        raise ArtifactError(f"its manifest {man_path.name} describes another artifact")
    verify_library(man, man_path)
    return man_path


def _compile(request: _Request):
    """The store's build step for one request: ``build`` into the scratch directory."""
    def build(jobs: list) -> list[dict]:
        [(_, tmp)] = jobs
        for note in request.notes:
            log.info(note)
        man_path = Path(_build.build(**request.build_kw, out_dir=str(tmp), keep_source=False))
        return [{"algorithm": request.name, "manifest": man_path.name}]
    return build


def cached_build(algo, target=None, dtype="float32", shape=None, *, config=None,
                 levels: int = 1, mcpu: str | None = None, cache_dir=None) -> CacheHit:
    """The artifact for ``build(algo, target, dtype, shape, levels=, config=, mcpu=)`` from
    the kernel cache, compiled into it on a miss (module doc).  ``cache_dir``: the cache root
    (default: ``lcmac.artifact.cache.cache_dir()``)."""
    request = _request(algo, target, dtype, shape, config, levels, mcpu)
    [got] = _store(cache_dir).obtain([request.spec], _check_entry, _compile(request))
    return CacheHit(got.product, got.built, request.key, got.entry, got.repaired, request.fields)


# ---- listing and clearing --------------------------------------------------------------------
def _readable(entry: Path, meta: dict) -> None:
    """An entry is listed as whole when its manifest reads (the library is not hashed)."""
    Manifest.read(_manifest_of(entry, meta))


def entries(cache_dir=None) -> list[CacheEntry]:
    """The cache's entries, oldest first (reads each entry.json and manifest; does not hash
    the libraries)."""
    out = []
    for e in _store(cache_dir).entries(_readable):
        f = e.meta.get("fields") or {}
        f = f if isinstance(f, dict) else {}
        g = lambda k: str(f.get(k, "?"))  # noqa: E731
        out.append(CacheEntry(key=e.key, path=e.path,
                              manifest=_manifest_of(e.path, e.meta) if e.ok else None,
                              algorithm=str(e.meta.get("algorithm", "?")), target=g("target"),
                              dtype=g("dtype"), shape_rule=g("shape_rule"),
                              lcmac_version=g("lcmac_version"), created=str(e.meta.get("created", "?")),
                              bytes=e.bytes, ok=e.ok, config=f.get("config") or {}))
    return out


def info(cache_dir=None) -> dict:
    """{dir, entries, bytes, exists}: where the cache is, how many entries, bytes on disk
    (scratch directories included)."""
    store = _store(cache_dir)
    root = store.root
    return {"dir": str(root), "exists": root.is_dir(), "entries": len(store.entries()),
            "bytes": dir_bytes(root) if root.is_dir() else 0,
            "lcmac_version": _version.__version__}


def clear(cache_dir=None) -> dict:
    """Remove every entry not being built or repaired right now (and what killed builds
    left); a build in progress keeps its scratch directory and completes.  Returns {entries,
    bytes} removed."""
    return _store(cache_dir).clear()
