"""An output directory checked before anything is compiled into it: a path that cannot hold
the results should fail in one line naming it, not minutes later inside the compiler.  A
command that fails leaves no directory behind that only the check created."""
from __future__ import annotations

import os
import tempfile
from contextvars import ContextVar
from pathlib import Path

from lcmac.core.errors import LcmacError


def _file_in_the_way(path: Path) -> Path | None:
    """``path`` or the first of its parents that exists and is not a directory."""
    try:
        for p in (path, *path.parents):
            if p.exists():
                return None if p.is_dir() else p
    except OSError:             # a parent that cannot be searched: mkdir says why
        pass
    return None


def writable_output_dir(path, option: str = "-o") -> Path:
    """``path`` as a directory that exists and takes new files (created with its parents when
    missing); ``LcmacError`` naming the path and the fix otherwise.  Writing is tried, not
    inferred from permission bits: root ignores those, and an immutable directory or a
    read-only mount refuses writes whatever they say."""
    p = Path(path)
    blocker = _file_in_the_way(p)
    if blocker == p:
        raise LcmacError(f"{option} {path}: is a file, not a directory; name a directory "
                         f"(it is created if missing)")
    if blocker is not None:
        raise LcmacError(f"{option} {path}: {blocker} is a file, so no directory can be made "
                         f"below it; name a directory elsewhere")
    created = _CREATED.get()
    if created is not None:              # before mkdir: it may make parents and then fail
        created.extend(_missing_dirs(p))
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise LcmacError(f"{option} {path}: the directory cannot be created ({e.strerror}); "
                         f"name a directory you can create or write") from None
    try:
        fd, probe = tempfile.mkstemp(prefix=".lcmac-write-check-", dir=p)
    except OSError as e:
        raise LcmacError(f"{option} {path}: the directory is not writable ({e.strerror}); make "
                         f"it writable (chmod u+w; chattr -i if immutable) or name another "
                         f"with {option}") from None
    os.close(fd)
    os.unlink(probe)
    return p


#: the directories ``writable_output_dir`` made during ``run_cleaning_created_dirs``
_CREATED: ContextVar[list[Path] | None] = ContextVar("lcmac_created_dirs", default=None)


def _missing_dirs(path: Path) -> list[Path]:
    """``path`` and those of its parents that do not exist yet, deepest first."""
    missing = []
    for p in (path, *path.parents):
        if os.path.lexists(p):
            break
        missing.append(p)
    return missing


def run_cleaning_created_dirs(command, args) -> int:
    """``command(args)``; where it fails (raises, or returns a nonzero status), the
    directories ``writable_output_dir`` created for it are removed again while still empty."""
    created: list[Path] = []
    token = _CREATED.set(created)
    status = None
    try:
        status = command(args)
        return status
    finally:
        _CREATED.reset(token)
        if status != 0:
            _remove_empty(created)


def _remove_empty(dirs: list[Path]) -> None:
    """Remove ``dirs`` (deepest first) until one holds a file.  Each was made for the command,
    so the directories below it are the command's too: the empty ones go first (a failed
    build leaves its artifact's directory)."""
    for d in dirs:
        for below, _, _ in os.walk(d, topdown=False):
            if Path(below) != d:
                try:
                    os.rmdir(below)
                except OSError:      # holds a file
                    pass
        try:
            d.rmdir()
        except FileNotFoundError:
            continue
        except OSError:          # not empty (the command wrote into it): keep it and its parents
            return
