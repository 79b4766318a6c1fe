"""The compiler workers: each compiler runs in a process of its own, started here.

apache-tvm and TileLang cannot share a process, and neither is imported by the process that
asks for a kernel, so every compile goes through the backend's worker module::

    "tvm"      → python -m lcmac.targets.tvm_worker       (x86, AArch64, the native bit kernel)
    "tilelang" → python -m lcmac.targets.tilelang_worker  (CUDA)

One request goes as JSON on stdin; the response is the last line of stdout that is a JSON
object (the compilers log to stdout too).  ``{"batch": [request, ...]}`` builds several with
one compiler import and answers ``{"ok": true, "batch": [response, ...]}``.  The request and
response of one build are described in ``lcmac.artifact.build``.  A response
``{"ok": false, "error": {"type", "message", "traceback"}}`` whose type names an lcmac
exception class is raised here as that class; any other failure (a crash, no response, a
worker over ``LCMAC_BUILD_TIMEOUT`` seconds) is a ``ToolchainError``.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

from lcmac.core import errors
from lcmac.core.errors import TargetError, ToolchainError

WORKERS = {"tvm": "lcmac.targets.tvm_worker", "tilelang": "lcmac.targets.tilelang_worker"}
WORKER_TIMEOUT_S = float(os.environ.get("LCMAC_BUILD_TIMEOUT", "900"))
#: the directory lcmac is imported from: the worker imports this very lcmac
_PACKAGE_PARENT = str(Path(__file__).resolve().parents[2])


def _environment() -> dict:
    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [_PACKAGE_PARENT, env.get("PYTHONPATH")]))
    return env


def _doing(what: str | None) -> str:
    return f" compiling {what}" if what else ""


def run_worker(backend: str, request: dict, what: str | None = None) -> dict:
    """Run the backend's compiler worker on ``request``; its response, or the lcmac error it
    reports raised.  ``what`` names the kernel in the messages ("the native bit kernel")."""
    mod = WORKERS.get(backend)
    if mod is None:
        raise TargetError(f"no compiler worker for backend {backend!r}")
    if backend == "tilelang" and importlib.util.find_spec("tilelang") is None:
        raise ToolchainError("building CUDA kernels needs TileLang, which is not installed: "
                             "pip install 'lcmac[cuda]'")
    try:
        proc = subprocess.run([sys.executable, "-m", mod], input=json.dumps(request),
                              capture_output=True, text=True, timeout=WORKER_TIMEOUT_S,
                              env=_environment())
    except subprocess.TimeoutExpired:
        raise ToolchainError(f"the {backend} compiler worker ran over {WORKER_TIMEOUT_S:.0f} s"
                             f"{_doing(what)} (LCMAC_BUILD_TIMEOUT sets the limit)") from None
    lines = [ln for ln in proc.stdout.strip().splitlines() if ln.startswith("{")]
    try:
        resp = json.loads(lines[-1]) if lines else None
    except ValueError:
        resp = None
    if not isinstance(resp, dict):
        tail = (proc.stderr or proc.stdout or "")[-2000:]
        if "No module named" in tail and mod.rsplit(".", 1)[-1] in tail:
            raise ToolchainError(f"the {backend} compiler worker failed{_doing(what)}: its module "
                                 f"{mod} is not available: {tail.strip()}")
        raise ToolchainError(f"the {backend} compiler worker failed{_doing(what)} (exit "
                             f"{proc.returncode}): {tail}")
    if not resp.get("ok"):
        raise_error(backend, resp.get("error", {}), what)
    return resp


def run_batch(backend: str, requests: list[dict], what: str | None = None) -> list[dict]:
    """Several requests through one worker (one compiler import): their responses, in
    order, each to be checked by the caller (``raise_error``)."""
    resp = run_worker(backend, {"batch": list(requests)}, what)
    batch = resp.get("batch")
    if not isinstance(batch, list) or len(batch) != len(requests):
        raise ToolchainError(f"the {backend} compiler worker answered a batch of {len(requests)} "
                             f"requests{_doing(what)} without one response each")
    return batch


def raise_error(backend: str, err: dict, what: str | None = None):
    """Raise the error a worker reported: as the lcmac exception class it names, else as a
    ``ToolchainError`` with the worker's traceback."""
    cls = getattr(errors, str(err.get("type")), None)
    msg = err.get("message", "unknown error")
    if isinstance(cls, type) and issubclass(cls, errors.LcmacError):
        raise cls(msg)
    raise ToolchainError(f"the {backend} compiler failed{_doing(what)}: {err.get('type')}: {msg}\n"
                         f"{err.get('traceback', '')[-1500:]}")
