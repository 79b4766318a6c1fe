"""The test session never reads or writes the user's lcmac caches: LCMAC_CACHE_DIR (CSE
results, compiled kernels) points into pytest's base temporary directory unless the caller
set it; a test that needs another value sets its own."""
import os

import pytest


@pytest.fixture(scope="session", autouse=True)
def _private_lcmac_cache(tmp_path_factory):
    if "LCMAC_CACHE_DIR" in os.environ:
        yield
        return
    os.environ["LCMAC_CACHE_DIR"] = str(tmp_path_factory.getbasetemp() / "lcmac-cache")
    try:
        yield
    finally:
        os.environ.pop("LCMAC_CACHE_DIR", None)
