"""Small computed results kept on disk between processes: one JSON file per key under
``<lcmac cache root>/<name>/`` (``lcmac.core.cachedir``; ``LCMAC_CACHE_DIR=off``: none).

A key is a mapping of everything the result depends on (plain JSON values); its file is
named by the sha256 of the key's canonical JSON and holds the key itself beside the value,
so a read checks that the entry is this key's.  Writes go to a temporary file renamed into
place, so a concurrent reader sees a whole entry or none; an entry that cannot be read or
does not check is treated as missing (the caller computes and writes it again), and a
directory that cannot be written only costs the caller its speed.

``source_digest(files)`` is the part of a key that makes an entry of older code a miss: the
sha256 of the source files that compute the result.  ``result_caches()`` are every kind
(``NAMES``), which ``lcmac cache`` reports and clears.
"""
from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Mapping

from lcmac.core.cachedir import cache_root
from lcmac.core.errors import LcmacError

log = logging.getLogger(__name__)

#: the layout of an entry file; part of every key
ENTRY_FORMAT = "lcmac-result/1"
#: every kind of result kept (its subdirectory's name → what it holds), so that ``lcmac cache
#: clear`` finds them all: a new one is added here
NAMES = {"accuracy": "accuracy simulations (lcmac.costmodel.accuracy)"}


def _canonical(fields: Mapping) -> str:
    return json.dumps({"entry": ENTRY_FORMAT, "key": fields}, sort_keys=True,
                      separators=(",", ":"), allow_nan=False)


class ResultCache:
    """The entries of one kind of result, in the ``name`` subdirectory of the cache root."""

    def __init__(self, name: str):
        if name not in NAMES:
            raise LcmacError(f"result cache {name!r} is not in lcmac.core.result_cache.NAMES; "
                             f"add it there, so that `lcmac cache clear` removes it")
        self.name = name

    def directory(self) -> Path | None:
        """Where the entries are (read from the environment on every call); None when the
        disk caches are off."""
        root = cache_root()
        return None if root is None else root / self.name

    def _path(self, key: str) -> Path | None:
        d = self.directory()
        return None if d is None else d / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.json"

    def get(self, fields: Mapping) -> dict | None:
        """The value stored for ``fields``, or None (no entry, a damaged one, caches off)."""
        key = _canonical(fields)
        path = self._path(key)
        if path is None:
            return None
        try:
            doc = json.loads(path.read_text())
            if _canonical(doc["key"]) == key and isinstance(doc["value"], dict):
                return doc["value"]
            log.debug("%s: entry %s is another key's; ignored", self.name, path)
        except FileNotFoundError:
            pass
        except Exception as e:  # noqa: BLE001 - any damage means recompute
            log.debug("%s: entry %s unreadable (%s); ignored", self.name, path, e)
        return None

    def put(self, fields: Mapping, value: Mapping) -> None:
        """Store ``value`` (a JSON object) for ``fields``, replacing any entry there."""
        key = _canonical(fields)
        path = self._path(key)
        if path is None:
            return
        tmp = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=path.stem, suffix=".tmp", dir=path.parent)
            with os.fdopen(fd, "w") as f:
                json.dump({"key": json.loads(key)["key"], "value": dict(value)}, f)
            os.replace(tmp, path)          # atomic: a reader never sees half a file
            tmp = None
        except (OSError, TypeError, ValueError) as e:
            log.debug("%s: could not write %s (%s)", self.name, path, e)
        finally:
            if tmp is not None:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass


    def entries(self) -> list[Path]:
        """The entry files (none when the caches are off or nothing was stored)."""
        d = self.directory()
        return sorted(d.glob("*.json")) if d is not None and d.is_dir() else []

    def info(self) -> dict:
        """{"name", "what", "dir" (None: caches off), "entries", "bytes"}."""
        d, files = self.directory(), self.entries()
        return {"name": self.name, "what": NAMES[self.name], "dir": None if d is None else str(d),
                "entries": len(files), "bytes": sum(_size(f) for f in files)}

    def clear(self) -> dict:
        """Remove every entry (and the directory, where nothing else is left in it); returns
        {"entries", "bytes"} removed.  A concurrent ``put`` writes its entry again or fails
        quietly."""
        removed = {"entries": 0, "bytes": 0}
        for f in self.entries():
            n = _size(f)
            try:
                f.unlink()
            except OSError as e:
                log.debug("%s: could not remove %s (%s)", self.name, f, e)
                continue
            removed["entries"] += 1
            removed["bytes"] += n
        d = self.directory()
        if d is not None:
            try:
                d.rmdir()
            except OSError:
                pass                        # absent, or holding another writer's file
        return removed


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def result_caches() -> list[ResultCache]:
    """Every kind of result kept on disk (``NAMES``)."""
    return [ResultCache(n) for n in NAMES]


@functools.lru_cache(maxsize=None)
def source_digest(files: tuple[str, ...]) -> str | None:
    """sha256 of the contents of ``files`` (modules' ``__file__``), in order; None where one
    cannot be read (then nothing computed by it can be keyed)."""
    h = hashlib.sha256()
    for f in files:
        try:
            h.update(Path(f).read_bytes() + b"\0")
        except (OSError, TypeError):
            return None
    return h.hexdigest()
