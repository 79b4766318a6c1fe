"""The kernel store: compiled kernels kept on disk, one directory per key, shared safely by
the processes that use it.

An entry is keyed by a digest of its *spec*, the fields that decide what the kernel is
(``spec_key``): for an LCMA kernel the algorithm, target, dtype, shape, config and versions
(``lcmac.artifact.cache``); for a bit kernel its semiring or GPU architecture, template and
versions (``lcmac.bits.cache``).  A store is a directory::

    <root>/<key>/entry.json          the key, its fields, the date, what the kind records
    <root>/<key>/...                 the kernel's files (a manifest and library, a library)
    <root>/.locks/<key>.lock         flock'ed while an entry is built or repaired
    <root>/.tmp-<key>-<pid>-<rand>/  an entry being built (renamed to <key>/ when complete)
    <root>/.trash-<key>-<pid>-<rand>/  an entry moved aside, being deleted

A key is 64 hex digits, after an optional lower-case prefix naming a kind (``cuda-``).

Concurrency: an entry appears by ``os.rename`` of a complete directory (atomic on one
filesystem), so a reader sees all of it or none.  A miss takes the key's lock (``flock``):
the first process builds, the others wait on the lock and then find the entry, so N
processes asking for one new kernel compile it once.  A hit is validated before it is
returned (``entry.json`` names this key, and the kind's check passes: a library's sha256,
say); a damaged entry is moved aside and rebuilt under the lock, with a ``CacheWarning``.
Directories left by a killed build are removed by a later build once nobody holds their
key's lock.  The lock needs a filesystem with working ``flock`` (local disks do).
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import re
import secrets
import shutil
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Iterable

from lcmac.core.errors import ArtifactError
from lcmac.core.user_warning import warn_user

#: says when this process waits for another one building the same entry (silent unless the
#: application shows lcmac's log, as the ``lcmac`` command does)
log = logging.getLogger(__name__)

ENTRY_FILE = "entry.json"
LOCKS = ".locks"
#: an entry's directory name: a key
KEY = re.compile(r"^(?:[a-z0-9]+-)?[0-9a-f]{64}$")
_SCRATCH = re.compile(r"^\.(?:tmp|trash)-((?:[a-z0-9]+-)?[0-9a-f]{64})-")
#: what reading a damaged entry may raise, besides ArtifactError
_UNREADABLE = (OSError, ValueError, KeyError, TypeError, AttributeError)


class CacheWarning(UserWarning):
    """A damaged cache entry that was moved aside and rebuilt."""


def spec_key(fields: dict, prefix: str = "") -> str:
    """``prefix`` + the sha256 of ``fields`` as canonical JSON (sorted keys, no spaces): the
    same fields give the same key in any process, whatever their dict order."""
    blob = json.dumps(fields, sort_keys=True, separators=(",", ":"), default=str)
    return prefix + hashlib.sha256(blob.encode()).hexdigest()


@dataclass(frozen=True)
class Spec:
    """What one entry is built from: the fields its key digests, a key prefix, and how
    messages name it (``what``)."""
    fields: dict
    prefix: str = ""
    what: str = ""
    key: str = field(init=False)

    def __post_init__(self):
        object.__setattr__(self, "key", spec_key(self.fields, self.prefix))

    @property
    def label(self) -> str:
        return self.what or self.key[:12]


@dataclass(frozen=True)
class Got:
    """An entry ``obtain`` returns: what the kind's check made of it (``product``: a manifest
    path, a library path), whether this call built it and whether that replaced a damaged
    entry."""
    spec: Spec
    entry: Path
    product: object
    built: bool
    repaired: bool = False


@dataclass(frozen=True)
class Stored:
    """One entry as ``entries`` reads it: ``meta`` is its entry.json (empty when unreadable),
    ``ok`` False with ``problem`` when it is damaged (the next ``obtain`` rebuilds it)."""
    key: str
    path: Path
    meta: dict
    bytes: int
    ok: bool
    problem: str | None = None


#: check(spec, entry directory, entry.json) → the product; raises when the entry is damaged
Check = Callable[[Spec, Path, dict], object]
#: build([(spec, scratch directory)]) → per spec, what its entry.json records beside the key
Build = Callable[[list], list]


def _rmtree(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            p.unlink()


def dir_bytes(p: Path) -> int:
    """Bytes of the files under ``p`` (0 for what cannot be read)."""
    total = 0
    for dirpath, _, files in os.walk(p):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, f)).st_size
    return total


class Store:
    """The entries under ``root`` (not created until something is built).  ``what`` names the
    store in messages; ``fix`` says how to give it a writable directory."""

    def __init__(self, root, what: str = "kernel cache",
                 fix: str = "set LCMAC_CACHE_DIR to a writable directory"):
        self.root = Path(root)
        self.what = what
        self.fix = fix

    def __repr__(self):
        return f"<lcmac {self.what} at {self.root}>"

    # ---- the directory ----------------------------------------------------------------------
    def not_writable(self, e: OSError) -> ArtifactError:
        why = e.strerror or str(e)
        return ArtifactError(f"the {self.what} directory {self.root} is not writable ({why}); "
                             f"{self.fix}")

    def ensure(self) -> None:
        """Create the root and its lock directory; ArtifactError if it cannot be written."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            (self.root / LOCKS).mkdir(exist_ok=True)
        except OSError as e:
            raise self.not_writable(e) from None
        if not os.access(self.root, os.W_OK | os.X_OK):
            raise self.not_writable(PermissionError(errno.EACCES, "permission denied"))

    @contextlib.contextmanager
    def lock(self, key: str, blocking: bool = True, what: str = ""):
        """Hold ``<root>/.locks/<key>.lock`` (flock).  Yields True when held; with
        ``blocking=False`` yields False when another process holds it.  A lock file unlinked
        by ``clear`` while this waited is not a lock: reopen and lock again."""
        path = self.root / LOCKS / f"{key}.lock"
        while True:
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as e:
                raise self.not_writable(e) from None
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    if not blocking:
                        yield False
                        return
                    log.info("lcmac cache: waiting for another process building %s",
                             what or key[:12])
                    fcntl.flock(fd, fcntl.LOCK_EX)
                try:
                    same = os.stat(path).st_ino == os.fstat(fd).st_ino
                except FileNotFoundError:
                    same = False
                if same:
                    yield True
                    return
            finally:
                os.close(fd)          # closing the descriptor releases the lock

    # ---- reading ----------------------------------------------------------------------------
    def read(self, spec: Spec, check: Check):
        """The product of ``spec``'s valid entry; ArtifactError saying what is damaged."""
        return self.read_key(spec.key, lambda entry, meta: check(spec, entry, meta))

    def read_key(self, key: str, check: Callable[[Path, dict], object]):
        """``check(entry directory, entry.json)`` of the entry of ``key``, once its entry.json
        reads and names that key; ArtifactError saying what is damaged."""
        entry = self.root / key
        try:
            meta = json.loads((entry / ENTRY_FILE).read_text())
        except (OSError, ValueError) as e:
            raise ArtifactError(f"its {ENTRY_FILE} cannot be read ({e})") from None
        if not isinstance(meta, dict) or meta.get("key") != key:
            raise ArtifactError(f"its {ENTRY_FILE} is not this key's")
        try:
            return check(entry, meta)
        except ArtifactError:
            raise
        except _UNREADABLE as e:
            raise ArtifactError(f"it cannot be read ({type(e).__name__}: {e})") from None

    def lookup(self, spec: Spec, check: Check):
        """The product of ``spec``'s entry if it is there and valid, else None (no lock, no
        write: a read-only store serves)."""
        if not (self.root / spec.key).is_dir():
            return None
        with contextlib.suppress(ArtifactError):
            return self.read(spec, check)
        return None

    # ---- building ---------------------------------------------------------------------------
    def obtain(self, specs: Iterable[Spec], check: Check, build: Build) -> list[Got]:
        """The entries of ``specs``, in order: valid ones as they are, the others built now
        by one call of ``build`` (which fills each spec's scratch directory and returns what
        its entry.json records), under the keys' locks (module docstring)."""
        specs = list(specs)
        found: dict[str, Got] = {}
        for s in specs:
            product = self.lookup(s, check)
            if product is not None:
                found[s.key] = Got(s, self.root / s.key, product, False)
        todo = list({s.key: s for s in specs if s.key not in found}.values())
        if todo:
            self.ensure()
            with contextlib.ExitStack() as held:
                for s in sorted(todo, key=lambda s: s.key):        # one order: no deadlock
                    held.enter_context(self.lock(s.key, what=s.what))
                build_now, repaired = [], set()
                for s in todo:
                    entry = self.root / s.key
                    if os.path.lexists(entry):
                        try:
                            found[s.key] = Got(s, entry, self.read(s, check), False)  # built meanwhile
                            continue
                        except ArtifactError as e:
                            warn_user(f"lcmac {self.what}: the entry {entry} for {s.label} is "
                                      f"damaged ({e}); rebuilding it", CacheWarning)
                            self._move_aside(entry, s.key)
                            repaired.add(s.key)
                    build_now.append(s)
                if build_now:
                    self.sweep({s.key for s in build_now})
                    for s, product in zip(build_now, self._build(build_now, check, build)):
                        found[s.key] = Got(s, self.root / s.key, product, True, s.key in repaired)
        return [found[s.key] for s in specs]

    def _build(self, specs: list[Spec], check: Check, build: Build) -> list:
        """Build ``specs`` into scratch directories inside the root, then rename each into
        place; their products."""
        scratch: dict[str, Path] = {}
        try:
            for s in specs:
                tmp = self.root / f".tmp-{s.key}-{os.getpid()}-{secrets.token_hex(4)}"
                try:
                    tmp.mkdir()
                except OSError as e:
                    raise self.not_writable(e) from None
                scratch[s.key] = tmp
            records = build([(s, scratch[s.key]) for s in specs])
            return [self._publish(s, scratch[s.key], record, check) for s, record in zip(specs, records)]
        finally:
            for tmp in scratch.values():
                _rmtree(tmp)             # those published are gone already

    def _publish(self, spec: Spec, tmp: Path, record: dict, check: Check):
        meta = {"format": spec.fields.get("format"), "key": spec.key, "fields": spec.fields,
                **(record or {}), "created": datetime.now(timezone.utc).isoformat(timespec="seconds")}
        (tmp / ENTRY_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True, default=str) + "\n")
        os.chmod(tmp, 0o755)
        try:
            os.rename(tmp, self.root / spec.key)
        except OSError as e:
            # another writer got there first (a lock file replaced under it): keep a valid one
            if e.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
        return self.read(spec, check)

    # ---- removing ---------------------------------------------------------------------------
    def _move_aside(self, entry: Path, key: str) -> None:
        """Rename ``entry`` out of the way (readers see it gone at once), then delete it."""
        trash = self.root / f".trash-{key}-{os.getpid()}-{secrets.token_hex(4)}"
        try:
            os.rename(entry, trash)
        except FileNotFoundError:
            return
        except OSError as e:
            raise self.not_writable(e) from None
        _rmtree(trash)

    def sweep(self, own: Iterable[str] = ()) -> None:
        """Remove the build directories of killed builds and leftovers of moved-aside entries:
        those whose key's lock nobody holds (a build holds its key's lock while its directory
        exists); ``own``: keys whose locks this process holds."""
        own = set(own)
        try:
            names = os.listdir(self.root)
        except OSError:
            return
        for n in names:
            m = _SCRATCH.match(n)
            if not m:
                continue
            if m.group(1) in own:
                _rmtree(self.root / n)
                continue
            try:
                with self.lock(m.group(1), blocking=False) as held:
                    if held:
                        _rmtree(self.root / n)
            except ArtifactError:
                return

    # ---- listing and clearing ---------------------------------------------------------------
    def entries(self, check: Callable[[Path, dict], object] | None = None) -> list[Stored]:
        """The entries, oldest first; ``check(entry directory, entry.json)`` raising marks one
        damaged (default: only an unreadable entry.json does)."""
        if not self.root.is_dir():
            return []
        out = []
        for n in os.listdir(self.root):
            p = self.root / n
            if not KEY.match(n) or not p.is_dir():
                continue
            meta, problem = {}, None
            try:
                meta = json.loads((p / ENTRY_FILE).read_text())
                if not isinstance(meta, dict):
                    meta, problem = {}, f"its {ENTRY_FILE} is not a JSON object"
                elif check is not None:
                    check(p, meta)
            except (ArtifactError, *_UNREADABLE) as e:
                problem = str(e) or type(e).__name__
            out.append(Stored(n, p, meta, dir_bytes(p), problem is None, problem))
        return sorted(out, key=lambda e: (str(e.meta.get("created", "?")), e.key))

    def clear(self) -> dict:
        """Remove every entry not being built or repaired right now (its lock free) and what
        killed builds left; a build in progress keeps its scratch directory and completes.
        Returns {entries, bytes} removed."""
        if not self.root.is_dir():
            return {"entries": 0, "bytes": 0}
        before = dir_bytes(self.root)
        try:
            (self.root / LOCKS).mkdir(exist_ok=True)
        except OSError as e:
            raise self.not_writable(e) from None
        n = 0
        for name in os.listdir(self.root):
            if KEY.match(name) and (self.root / name).is_dir():
                with self.lock(name, blocking=False) as held:
                    if held:
                        self._move_aside(self.root / name, name)
                        n += 1
        self.sweep()
        for lk in (self.root / LOCKS).glob("*.lock"):
            with contextlib.suppress(ArtifactError):
                with self.lock(lk.stem, blocking=False) as held:
                    if held:            # nobody builds it: a waiter re-checks the inode
                        with contextlib.suppress(OSError):
                            lk.unlink()
        return {"entries": n, "bytes": max(before - dir_bytes(self.root), 0)}
