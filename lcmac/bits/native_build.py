"""The native bit kernel's library: compiled by the apache-tvm worker process, kept on disk,
loaded with ``tvm_ffi``.

``load_kernel(semiring, config)`` returns the compiled function for ``"gf2"`` or
``"boolean"``, compiling it on a miss (``library_paths`` compiles several with one worker).  The kernel is the template of
``lcmac.schedules.cpu_bits`` (its docstring has the algorithm and the calling convention);
this module only obtains it:

* **Compiling** goes through the compiler worker, ``python -m lcmac.targets.tvm_worker``,
  with a request of kind ``"bits"`` (JSON on stdin, JSON as the last line of stdout: the
  worker contract of ``lcmac.artifact.build`` with ``kernel``, ``semiring`` and the
  template's ``config``, for the target ``"host"`` and ``mcpu`` "native").  apache-tvm is
  never imported in this process.
* **On disk** under ``<lcmac cache root>/bits/`` (``lcmac.core.cachedir``; with
  ``LCMAC_CACHE_DIR=off``, a temporary directory that lives as long as the process)::

      <dir>/<key>/kernel.so, entry.json     the library, what its key was made of, its sha256
      <dir>/.locks/<key>.lock               flock'ed while the entry is built
      <dir>/.tmp-<key>-<pid>-<rand>/        an entry being built, renamed to <key>/ when done

  The key is the sha256 of the semiring, the config, the template's generation
  (``TEMPLATE_VERSION``), lcmac's and apache-tvm's versions and this CPU (model name and
  flags: the library is built for the CPU it runs on).  As in lcmac's kernel cache
  (``lcmac.artifact.cache``), an entry appears by renaming a complete directory, one
  process compiles a missing key while the others wait on its lock, and a library whose
  sha256 does not match its entry is rebuilt.  That cache itself is not used: its keys are an
  LCMA, a float dtype and one exact shape, and it lives in a layer above this package.
* **Loading** is ``tvm_ffi.load_module``: the kernel has no parallel loop and allocates no
  workspace, so it needs nothing of TVM's runtime library (lcmac's CPU loader fills its
  thread-pool and workspace hooks, which this library does not have).
"""
from __future__ import annotations

import atexit
import contextlib
import fcntl
import functools
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import secrets
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from lcmac.core import version as _version
from lcmac.core.cachedir import cache_root
from lcmac.core.errors import ArtifactError, ToolchainError

__all__ = ["TEMPLATE_VERSION", "ENTRY", "WORKER", "cache_dir", "kernel_key", "library_paths",
           "load_kernel", "missing_loader", "missing_toolchain", "cached_kernels", "clear_kernels",
           "scratch_dir", "publish", "not_writable"]

#: the generation of ``lcmac.schedules.cpu_bits``'s template that this module asks for (the
#: two are kept equal; a test checks it): part of the key, so a new template is recompiled
TEMPLATE_VERSION = 1
ENTRY = "lcmac_bits_m4rm"
WORKER = "lcmac.targets.tvm_worker"
KEY_FORMAT = "lcmac-bits-kernel/1"
WORKER_TIMEOUT_S = float(os.environ.get("LCMAC_BUILD_TIMEOUT", "900"))
_PACKAGE_PARENT = str(Path(__file__).resolve().parents[2])
_scratch_dir: Path | None = None


@functools.lru_cache(maxsize=1)
def missing_loader() -> str | None:
    """Why a compiled native kernel cannot run here (None: it can)."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return f"the native bit kernel is built for x86-64; this machine is {platform.machine()}"
    if importlib.util.find_spec("tvm_ffi") is None:
        return "loading the native bit kernel needs apache-tvm's tvm_ffi (pip install apache-tvm)"
    return None


@functools.lru_cache(maxsize=1)
def missing_toolchain() -> str | None:
    """Why no native kernel can be compiled here (None: nothing is missing)."""
    why = missing_loader()
    if why:
        return why
    if importlib.util.find_spec("tvm") is None:
        return "compiling the native bit kernel needs apache-tvm (pip install apache-tvm)"
    if not (os.environ.get("CXX") or shutil.which("g++") or shutil.which("gcc")):
        return "linking the native bit kernel needs a C compiler (apt-get install g++)"
    return None


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


@functools.lru_cache(maxsize=1)
def _host_cpu() -> dict:
    model, flags = platform.processor() or platform.machine(), ""
    with contextlib.suppress(OSError):
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags"):
                flags = " ".join(sorted(line.split(":", 1)[1].split()))
                break
    return {"model": model, "flags_sha256": hashlib.sha256(flags.encode()).hexdigest()}


def _compiler_version() -> str | None:
    try:
        return importlib.metadata.version("apache-tvm")
    except importlib.metadata.PackageNotFoundError:
        return None


def kernel_key(semiring: str, config: dict) -> tuple[str, dict]:
    """(key, fields): the cache key of the kernel and what it is the sha256 of."""
    fields = {"format": KEY_FORMAT, "semiring": semiring, "config": dict(config),
              "template_version": TEMPLATE_VERSION, "lcmac_version": _version.__version__,
              "compiler": _compiler_version(), "cpu": dict(_host_cpu())}
    blob = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest(), fields


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _valid_library(entry: Path, key: str) -> Path | None:
    """The entry's library if the entry is complete and this key's, else None."""
    try:
        meta = json.loads((entry / "entry.json").read_text())
        lib = entry / "kernel.so"
        if meta.get("key") == key and meta.get("sha256") == _sha256(lib):
            return lib
    except (OSError, ValueError, AttributeError):
        pass
    return None


@contextlib.contextmanager
def _locked(root: Path, key: str, blocking: bool = True):
    """Holds ``key``'s lock (waits for it); with ``blocking=False`` yields whether it got it."""
    (root / ".locks").mkdir(parents=True, exist_ok=True)
    fd = os.open(root / ".locks" / f"{key}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)                       # closing it releases the lock


def scratch_dir(root: Path, key: str) -> Path:
    """A fresh directory to build ``key``'s entry in, beside the cache's entries."""
    tmp = root / f".tmp-{key}-{os.getpid()}-{secrets.token_hex(4)}"
    tmp.mkdir(parents=True)
    return tmp


def publish(root: Path, tmp: Path, key: str, fields: dict, **extra) -> Path:
    """Complete the entry built in ``tmp`` (its ``kernel.so``): write ``entry.json`` (the key,
    what it is made of, the library's sha256, ``extra``) and rename it to ``<root>/<key>``,
    under the key's lock; returns the library's path."""
    meta = {"key": key, "fields": fields, "sha256": _sha256(tmp / "kernel.so"), **extra}
    (tmp / "entry.json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
    entry = root / key
    if entry.exists():                     # a damaged entry: out of the way, under the lock
        shutil.rmtree(entry, ignore_errors=True)
    os.rename(tmp, entry)
    return entry / "kernel.so"


def not_writable(root: Path, e: OSError) -> ArtifactError:
    return ArtifactError(f"the bit-kernel cache {root} is not writable ({e.strerror or e}); set "
                         f"LCMAC_CACHE_DIR to a writable directory")


def _run_worker(requests: list[dict]) -> list[dict]:
    """Requests through one compiler worker (one apache-tvm import); their responses."""
    env = dict(os.environ)
    # the worker imports this very lcmac, wherever the caller imported it from
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [_PACKAGE_PARENT, env.get("PYTHONPATH")]))
    try:
        proc = subprocess.run([sys.executable, "-m", WORKER], input=json.dumps({"batch": requests}),
                              capture_output=True, text=True, timeout=WORKER_TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired:
        raise ToolchainError(f"compiling the native bit kernel ran over {WORKER_TIMEOUT_S:.0f} s "
                             f"(LCMAC_BUILD_TIMEOUT)") from None
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    try:
        resp = json.loads(lines[-1])
    except (IndexError, ValueError):
        resp = {}
    if "batch" not in resp:
        why = resp.get("error", {}).get("message") or (proc.stderr or proc.stdout or "")[-2000:]
        raise ToolchainError(f"the apache-tvm worker failed (exit {proc.returncode}) compiling "
                             f"the native bit kernel: {why}")
    return resp["batch"]


def _build_entries(root: Path, keys: dict[str, tuple[str, dict]]) -> dict[str, Path]:
    """Compile the kernels ``keys`` (semiring → (key, fields)) into scratch directories with
    one worker, then rename each to ``<root>/<key>``; their libraries."""
    scratch = {}
    try:
        requests = []
        for s, (key, fields) in keys.items():
            scratch[s] = scratch_dir(root, key)
            requests.append({"version": 1, "kernel": "bits", "semiring": s,
                             "config": fields["config"], "target": {"name": "host", "family": "x86"},
                             "mcpu": "native", "entry": ENTRY,
                             "library": str(scratch[s] / "kernel.so")})
        out = {}
        for (s, (key, fields)), resp in zip(keys.items(), _run_worker(requests)):
            if not resp.get("ok"):
                err = resp.get("error", {})
                raise ToolchainError(f"the apache-tvm worker could not compile the native bit "
                                     f"kernel: {err.get('type')}: {err.get('message')}")
            out[s] = publish(root, scratch[s], key, fields,
                             target=resp.get("info", {}).get("target"),
                             target_dict=resp.get("target_dict"), seconds=resp.get("seconds"))
        return out
    finally:
        for tmp in scratch.values():
            shutil.rmtree(tmp, ignore_errors=True)


def library_paths(semirings, config: dict, *, build: bool = True) -> dict[str, Path | None]:
    """semiring → the compiled library of its kernel: from disk, else compiled now when
    ``build`` (all missing ones by one worker), else None.  Raises ``ToolchainError`` when
    they cannot be compiled."""
    keys = {s: kernel_key(s, config) for s in dict.fromkeys(semirings)}
    root = cache_dir()
    found = {s: _valid_library(root / key, key) for s, (key, _) in keys.items()}
    missing = [s for s, lib in found.items() if lib is None]
    if not missing or not build:
        return found
    why = missing_toolchain()
    if why:
        raise ToolchainError(why)
    try:
        with contextlib.ExitStack() as held:
            for s in sorted(missing, key=lambda s: keys[s][0]):   # one order: no deadlock
                held.enter_context(_locked(root, keys[s][0]))
            for s in missing:                # another process may have built it meanwhile
                found[s] = _valid_library(root / keys[s][0], keys[s][0])
            todo = {s: keys[s] for s in missing if found[s] is None}
            if todo:
                found.update(_build_entries(root, todo))
            return found
    except OSError as e:
        raise not_writable(root, e) from None


def load_kernel(semiring: str, config: dict, *, build: bool = True):
    """(function, module) of the compiled kernel, or None when it is not on disk and
    ``build`` is False.  The module must be kept referenced while the function is used."""
    why = missing_loader()
    if why:
        raise ToolchainError(why)
    lib = library_paths([semiring], config, build=build)[semiring]
    if lib is None:
        return None
    import tvm_ffi                          # the FFI only; apache-tvm stays out of this process
    try:
        module = tvm_ffi.load_module(str(lib))
        return module[ENTRY], module
    except Exception as e:  # noqa: BLE001 - whatever the FFI raises, said as lcmac's error
        raise ArtifactError(f"the native bit kernel {lib} cannot be loaded: {e}") from None


# ---- what ``lcmac cache`` shows and clears --------------------------------------------------
def _entry_dirs(root: Path) -> list[Path]:
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))


def _dir_bytes(p: Path) -> int:
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())


def cached_kernels() -> list[dict]:
    """The bit kernels on disk (native CPU kernels and the GPU library of each architecture,
    ``lcmac.bits.cuda``): key, kind, what it is for, bytes, and whether the entry is whole."""
    out = []
    for entry in _entry_dirs(cache_dir()):
        try:
            meta = json.loads((entry / "entry.json").read_text())
        except (OSError, ValueError):
            meta = {}
        fields = meta.get("fields", {}) if isinstance(meta, dict) else {}
        cuda = entry.name.startswith("cuda-")
        out.append({"key": entry.name, "kind": "cuda" if cuda else "native",
                    "for": fields.get("arch") if cuda else fields.get("semiring"),
                    "bytes": _dir_bytes(entry),
                    "ok": _valid_library(entry, entry.name) is not None})
    return out


def clear_kernels() -> dict:
    """Remove every bit-kernel entry not being built right now (its lock free); returns
    {entries, bytes} removed.  A process that has a library loaded keeps its mapping."""
    root = cache_dir()
    n = freed = 0
    for entry in _entry_dirs(root):
        with _locked(root, entry.name, blocking=False) as held:
            if not held:
                continue                         # being built: left alone
            size = _dir_bytes(entry)
            shutil.rmtree(entry, ignore_errors=True)
            if not entry.exists():
                n, freed = n + 1, freed + size
    return {"entries": n, "bytes": freed}
