"""Timing one built artifact: median of repeats after warm-up, in an isolated process.

``measure_artifact(path, target, dtype, shape)`` loads an artifact with ``lcmac.load``,
checks a few rows of its result against a float64 reference (a fast wrong kernel must never
win), then times it: ``warmup`` untimed calls, then ``repeats`` timed runs, each run
``inner`` back-to-back calls sized so that a run lasts at least ``min_run_s`` (CUDA: timed
with CUDA events and synchronised; CPU: ``time.perf_counter``).  It returns
``{"time_s": median per call, "spread": (max − min)/median, "repeats": n, "inner": k}``.

The tuner runs it in a separate worker process (``MeasureWorker``), one measurement at a
time and never while compiling, so a crashing kernel cannot take the tuner down and the
two shared cores are not shared with a compiler while timing.  After the correctness check
(which calls BLAS) it pauses briefly: OpenBLAS's spinning threads slow TVM's for ~0.1 s
(DESIGN.md).

The callable protocol it relies on: ``lcmac.load(path)`` returns ``f`` with ``f(A, B) → C``
(numpy arrays on CPU; torch tensors on CUDA, on the GPU); if ``f(A, B)`` raises TypeError or
returns None, ``f(A, B, C)`` with a preallocated C is tried.
"""
from __future__ import annotations

import concurrent.futures as cf
import multiprocessing as mp
import statistics
import time

CHECK_ROWS = 32


def _torch_dtype(torch, dtype):
    return {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16,
            "float16": torch.float16, "float8_e4m3": getattr(torch, "float8_e4m3fn", None)}[dtype]


def make_inputs(target: str, dtype: str, shape, seed: int = 0):
    """(A, B, on_gpu) random operands of the right kind for the target."""
    M, N, K = (int(x) for x in shape)
    gpu = str(target).startswith("cuda")
    if not gpu and dtype in ("float32", "float64"):
        import numpy as np
        rng = np.random.default_rng(seed)
        A = rng.standard_normal((M, K), dtype=np.float32).astype(dtype)
        B = rng.standard_normal((K, N), dtype=np.float32).astype(dtype)
        return A, B, False
    import torch
    g = torch.Generator().manual_seed(seed)
    A = torch.randn(M, K, generator=g)
    B = torch.randn(K, N, generator=g)
    dev = "cuda" if gpu else "cpu"
    td = _torch_dtype(torch, dtype)
    return A.to(dev).to(td), B.to(dev).to(td), gpu


def _call(f, A, B):
    try:
        C = f(A, B)
        if C is not None:
            try:  # time without allocating C on every call when out= is offered
                f(A, B, out=C)
                return C, lambda: f(A, B, out=C)
            except TypeError:
                return C, lambda: f(A, B)
    except TypeError:
        pass
    M, N = A.shape[0], B.shape[1]
    if hasattr(A, "new_empty"):
        C = A.new_empty((M, N))
    else:
        import numpy as np
        C = np.empty((M, N), dtype=A.dtype)
    f(A, B, C)
    return C, lambda: f(A, B, C)


def _as64(x):
    import numpy as np
    if hasattr(x, "detach"):
        return x.detach().float().cpu().numpy().astype(np.float64)
    return np.asarray(x, dtype=np.float64)


def check_result(A, B, C, dtype: str) -> str | None:
    """Why C is not A·B on a few rows (None when it is, within the dtype's tolerance)."""
    import numpy as np
    rows = min(CHECK_ROWS, A.shape[0])
    a, b, c = _as64(A[:rows]), _as64(B), _as64(C[:rows])
    ref = a @ b
    tol = {"float64": 1e-9, "float32": 1e-3}.get(dtype, 5e-2)
    err = float(np.linalg.norm(c - ref) / max(np.linalg.norm(ref), 1e-30))
    if not np.isfinite(err) or err > tol:
        return f"wrong result: relative error {err:.3g} > {tol:g} on the first {rows} rows"
    return None


def time_callable(run, *, sync=None, warmup: int = 2, repeats: int = 5,
                  min_run_s: float = 0.02, max_inner: int = 1000, timer=None) -> dict:
    """Median time per call of ``run()`` (see the module doc)."""
    sync = sync or (lambda: None)
    for _ in range(warmup):
        run()
    sync()
    t0 = time.perf_counter()
    run()
    sync()
    one = max(time.perf_counter() - t0, 1e-9)
    inner = max(1, min(max_inner, int(min_run_s / one + 0.999)))
    times = []
    for _ in range(repeats):
        if timer is not None:
            times.append(timer(run, inner) / inner)
            continue
        sync()
        t0 = time.perf_counter()
        for _ in range(inner):
            run()
        sync()
        times.append((time.perf_counter() - t0) / inner)
    med = statistics.median(times)
    return {"time_s": med, "spread": (max(times) - min(times)) / med, "repeats": repeats,
            "inner": inner, "times": times}


def measure_artifact(path: str, target: str, dtype: str, shape, *, warmup: int = 2,
                     repeats: int = 5, min_run_s: float = 0.02, check: bool = True) -> dict:
    """Load, check and time one artifact (runs in the measuring process)."""
    import lcmac
    try:
        f = lcmac.load(path)
    except (AttributeError, ImportError, lcmac.LcmacError):
        if not str(target).startswith("cuda"):
            raise
        # a TileLang artifact: the CUDA loader directly (``lcmac.load`` may not route to it yet)
        from lcmac.runtime.cuda_loader import load_cuda
        f = load_cuda(str(path))
    A, B, gpu = make_inputs(target, dtype, shape)
    C, run = _call(f, A, B)
    sync, timer = None, None
    if gpu:
        import torch
        sync = torch.cuda.synchronize
        sync()

        def timer(fn, n):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            for _ in range(n):
                fn()
            e.record()
            e.synchronize()
            return s.elapsed_time(e) / 1e3
    if check:
        why = check_result(A, B, C, dtype)
        if why:
            return {"status": "error", "error": why}
        if not gpu:
            time.sleep(0.2)  # let BLAS's spinning threads go quiet
    out = time_callable(run, sync=sync, warmup=warmup, repeats=repeats, min_run_s=min_run_s,
                        timer=timer)
    out["status"] = "ok"
    return out


def _safe_measure(*args, **kw) -> dict:
    try:
        return measure_artifact(*args, **kw)
    except Exception as e:  # noqa: BLE001 - reported as a failed trial
        return {"status": "error", "error": f"{type(e).__name__}: {e}"}


class MeasureWorker:
    """One long-lived measuring process (spawned: no inherited compiler state); restarted
    after a crash, which is reported as an error result for that artifact."""

    def __init__(self, timeout_s: float = 300.0):
        self.timeout_s = timeout_s
        self._pool = None

    def _ensure(self):
        if self._pool is None:
            self._pool = cf.ProcessPoolExecutor(max_workers=1, mp_context=mp.get_context("spawn"))
        return self._pool

    def measure(self, path, target, dtype, shape, **kw) -> dict:
        pool = self._ensure()
        fut = pool.submit(_safe_measure, str(path), target, dtype, tuple(shape), **kw)
        try:
            return fut.result(timeout=self.timeout_s)
        except cf.TimeoutError:
            self.close(kill=True)
            return {"status": "error", "error": f"measurement timed out after {self.timeout_s:.0f} s"}
        except cf.process.BrokenProcessPool:
            self.close(kill=True)
            return {"status": "error", "error": "the measuring process crashed (signal)"}

    def close(self, kill: bool = False):
        if self._pool is not None:
            if kill:
                for p in list(getattr(self._pool, "_processes", {}).values()):
                    try:
                        p.kill()
                    except Exception:  # noqa: BLE001
                        pass
            self._pool.shutdown(wait=not kill, cancel_futures=True)
            self._pool = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
