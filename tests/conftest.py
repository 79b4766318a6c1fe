"""The test session never reads or writes the user's lcmac caches: LCMAC_CACHE_DIR (CSE
results, compiled kernels) points into pytest's base temporary directory unless the caller
set it; a test that needs another value sets its own.  ``lcmac_cache`` is that directory, one
for all pytest-xdist workers of a run (the store is safe for concurrent processes), so a kernel
that several test files build compiles once."""
import os
from pathlib import Path

import pytest

# decisions read every device's records (the shipped logs were measured on other machines than
# the one testing) and measure no device; tests of the device at hand set LCMAC_DEVICE
os.environ.setdefault("LCMAC_DEVICE", "any")

#: files whose tests each compile their own kernel: spread over the workers test by test
INDEPENDENT = {"tests/schedules/cuda/test_cuda_codegen.py"}
#: the files whose module fixtures compile the most, first in the run: the workers take file
#: groups in order, and a long one taken last leaves the other worker idle to the end
HEAVY_FIRST = ("tests/schedules/test_cpu_backend.py", "tests/schedules/test_cpu_blocked.py",
               "tests/schedules/test_cpu_lcma_avx2.py", "tests/runtime/test_c_cuda.py",
               "tests/runtime/test_cpu_prepared.py", "tests/schedules/cuda/test_cuda_fp64.py",
               "tests/schedules/cuda/test_cuda_fp8_blocks.py", "tests/runtime/test_c_api.py")


@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    # `-n 2` alone distributes test by test ("load"): schedule by group instead; a worker
    # parses `-n 2` itself, so it is told to name its tests' groups
    if getattr(config.option, "dist", "no") == "load":
        config.option.dist = "loadgroup"
    if hasattr(config, "workerinput"):
        config.option.loadgroup = True


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """One xdist group per test file, so the kernels a file's module fixtures build are built
    by one worker (``pytest_configure`` turns ``-n``'s test-by-test scheduling into groups);
    ``HEAVY_FIRST`` files first (a stable sort: the rest keep their order)."""
    if not config.pluginmanager.hasplugin("xdist"):          # -p no:xdist: no groups to name
        return
    root = Path(str(config.rootpath))
    rank = {f: i for i, f in enumerate(HEAVY_FIRST)}
    items.sort(key=lambda item: rank.get(Path(str(item.path)).relative_to(root).as_posix(), len(rank)))
    for item in items:
        rel = Path(str(item.path)).relative_to(root).as_posix()
        if rel not in INDEPENDENT and not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group(rel))


@pytest.fixture(scope="session", autouse=True)
def lcmac_cache(tmp_path_factory) -> Path:
    if "LCMAC_CACHE_DIR" in os.environ:
        yield Path(os.environ["LCMAC_CACHE_DIR"])
        return
    base = tmp_path_factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "lcmac-cache"
    os.environ["LCMAC_CACHE_DIR"] = str(root)
    try:
        yield root
    finally:
        os.environ.pop("LCMAC_CACHE_DIR", None)
