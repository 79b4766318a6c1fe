"""The test session never reads or writes the user's lcmac caches: LCMAC_CACHE_DIR (CSE
results, compiled kernels) points into pytest's base temporary directory unless the caller
set it; a test that needs another value sets its own.  ``lcmac_cache`` is that directory."""
import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session", autouse=True)
def lcmac_cache(tmp_path_factory) -> Path:
    if "LCMAC_CACHE_DIR" in os.environ:
        yield Path(os.environ["LCMAC_CACHE_DIR"])
        return
    root = tmp_path_factory.getbasetemp() / "lcmac-cache"
    os.environ["LCMAC_CACHE_DIR"] = str(root)
    try:
        yield root
    finally:
        os.environ.pop("LCMAC_CACHE_DIR", None)
