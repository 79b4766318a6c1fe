"""Where lcmac keeps what it caches on disk (CSE results, compiled kernels, the qemu harness):
one directory, each cache in a subdirectory of its own."""
from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path | None:
    """``$LCMAC_CACHE_DIR``, else ``$XDG_CACHE_HOME/lcmac``, else ``~/.cache/lcmac``; None
    when ``LCMAC_CACHE_DIR=off`` (the disk caches are turned off)."""
    env = os.environ.get("LCMAC_CACHE_DIR")
    if env == "off":
        return None
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "lcmac"
