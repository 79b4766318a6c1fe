"""An output directory checked before anything is compiled into it: a path that cannot hold
the results should fail in one line naming it, not minutes later inside the compiler."""
from __future__ import annotations

import os
import tempfile
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
