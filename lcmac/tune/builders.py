"""Compiling the points the tuner measures: in worker processes while it measures on a CPU
(``Builder``: never while timing, so a compiler does not share the cores with a
measurement), or ahead of measuring on a GPU (``Prebuilder``: every planned artifact, in
threads, with an ``index.jsonl`` that ``load_prebuilt`` reads on another machine)."""
from __future__ import annotations

import concurrent.futures as cf
import hashlib
import json
import multiprocessing as mp
import os
import threading
import time
from pathlib import Path

from lcmac.artifact import tuning_log as _db
from lcmac.artifact.build import build, build_many


def build_point(algorithm: str, target: str, dtype: str, shape, config, out_dir: str) -> str:
    """Build one artifact (in a worker process or thread); its manifest path."""
    algo = algorithm if algorithm != _db.GEMM else "gemm"
    config = _db.config_to_dict(config) if config is not None else None  # build takes dicts
    return str(build(algo, target, dtype, tuple(shape), 1, config, out_dir))


def _build_group(items) -> list:
    """Runs in a worker process: several builds through one compiler worker (one compiler
    import for the group: ``artifact.build.build_many``); a path or an error string each."""
    jobs = [{"algo": a if a != _db.GEMM else "gemm", "target": t, "dtype": d, "shape": tuple(s),
             "config": _db.config_to_dict(c) if c is not None else None, "out_dir": o}
            for a, t, d, s, c, o in items]
    out = []
    for r in build_many(jobs):
        if isinstance(r, BaseException):
            msg = str(r).strip().splitlines()
            out.append(f"build failed: {type(r).__name__}: {msg[-1] if msg else ''}")
        else:
            out.append(str(r))
    return out


class Builder:
    """Compiles a batch of points in ``jobs`` worker processes; a batch larger than ``jobs``
    is split into ``jobs`` groups, each built by one compiler worker (``build_many``), which
    saves the compiler's import per artifact (~2.5 s for apache-tvm)."""

    def __init__(self, jobs: int):
        self.jobs = max(1, jobs)
        self.pool = None

    def build(self, points, target, dtype, shape, root: Path) -> list[tuple[str | None, str]]:
        if self.pool is None:
            self.pool = cf.ProcessPoolExecutor(max_workers=self.jobs, mp_context=mp.get_context("spawn"))
        items = []
        for pt in points:
            d = root / f"{pt.algorithm.replace('^', 'p').replace('*', 'x').replace('@', 'at')}-{abs(hash(pt.key)) % 10**10}"
            items.append((pt.algorithm, target, dtype, tuple(shape), pt.config, str(d)))
        if len(items) <= self.jobs:
            groups = [[it] for it in items]
        else:
            k = -(-len(items) // self.jobs)
            groups = [items[i:i + k] for i in range(0, len(items), k)]
        futs = [self.pool.submit(build_point, *g[0]) if len(g) == 1 else self.pool.submit(_build_group, g)
                for g in groups]
        out = []
        for g, f in zip(groups, futs):
            try:
                r = f.result()
                rs = [r] if len(g) == 1 else r
                out += [(None, x) if x.startswith("build failed:") else (x, "") for x in rs]
            except cf.process.BrokenProcessPool as e:
                self.close()
                out += [(None, f"build worker crashed: {e}")] * len(g)
            except Exception as e:  # noqa: BLE001 - reported as a failed trial
                msg = str(e).strip().splitlines()
                out += [(None, f"build failed: {type(e).__name__}: {msg[-1] if msg else ''}")] * len(g)
        return out

    def close(self):
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
            self.pool = None


def _artifact_dir(root: Path, pt, shape) -> Path:
    slug = pt.algorithm.replace("^", "p").replace("*", "x").replace("@", "at")
    h = hashlib.sha1(f"{pt.algorithm_hash}|{tuple(shape)}|{pt.key}".encode()).hexdigest()[:12]
    return root / f"{slug}-{'x'.join(map(str, shape))}-{h}"


class Prebuilder:
    """Compile points ahead of measuring, ``jobs`` at a time, in threads (each build runs the
    backend's compiler worker as a subprocess).  ``get(point, target, dtype, shape)`` waits for
    that point's artifact; every finished build is appended to ``root/index.jsonl``, which
    ``load_prebuilt`` reads on another machine."""

    def __init__(self, jobs: int, root: str | os.PathLike, nice: int = 0):
        self.nice = nice       # lower the compilers' priority (measuring at the same time)
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.pool = cf.ThreadPoolExecutor(max_workers=max(1, jobs), thread_name_prefix="lcmac-build")
        self.futs: dict = {}
        self.lock = threading.Lock()
        self.t0 = time.time()
        self.built = self.failed = 0

    @staticmethod
    def key(pt, target, dtype, shape) -> tuple:
        return (str(target), dtype, pt.algorithm_hash, tuple(int(x) for x in shape), pt.key)

    def _run(self, pt, target, dtype, shape):
        d = _artifact_dir(self.root, pt, shape)
        if self.nice:
            try:  # Linux: nice is per thread, and the compiler subprocesses inherit it
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), self.nice)
            except (AttributeError, OSError):
                pass
        t = time.time()
        try:
            path = build_point(pt.algorithm, target, dtype, tuple(shape), pt.config, str(d))
        except Exception:
            with self.lock:
                self.failed += 1
            raise
        rec = {"target": str(target), "dtype": dtype, "algorithm": pt.algorithm,
               "algorithm_hash": pt.algorithm_hash, "shape": list(shape), "config": pt.config_dict(),
               "manifest": os.path.relpath(path, self.root), "build_s": round(time.time() - t, 1)}
        with self.lock:
            self.built += 1
            with open(self.root / "index.jsonl", "a") as f:
                f.write(json.dumps(rec, sort_keys=True) + "\n")
        return path

    def submit(self, pt, target, dtype, shape):
        k = self.key(pt, target, dtype, shape)
        if k not in self.futs:
            self.futs[k] = self.pool.submit(self._run, pt, target, dtype, tuple(shape))
        return self.futs[k]

    def get(self, pt, target, dtype, shape) -> str | None:
        """The artifact of a submitted point (waits; raises its build error), else None."""
        fut = self.futs.get(self.key(pt, target, dtype, shape))
        return None if fut is None else fut.result()

    def lookup(self, target, dtype, shape):
        return lambda pt: self.get(pt, target, dtype, shape)

    def wait(self):
        cf.wait(list(self.futs.values()))

    def close(self, cancel: bool = False):
        self.pool.shutdown(wait=not cancel, cancel_futures=cancel)


def load_prebuilt(root: str | os.PathLike):
    """A lookup ``(point, target, dtype, shape) -> manifest path | None`` over the artifacts a
    ``Prebuilder`` (``lcmac tune --build-only DIR``) left in ``root``.  A point matches an
    entry of the same target, dtype, algorithm and shape whose config agrees on every knob
    both name (a backend config class that gained a field since the build still matches)."""
    root = Path(root)
    entries: dict[tuple, list] = {}
    idx = root / "index.jsonl"
    if idx.is_file():
        for line in idx.read_text().splitlines():
            try:
                e = json.loads(line)
            except ValueError:
                continue
            k = (e["target"], e["dtype"], e["algorithm_hash"], tuple(e["shape"]))
            entries.setdefault(k, []).append(e)

    def find(pt, target, dtype, shape):
        cand = entries.get((str(target), dtype, pt.algorithm_hash, tuple(int(x) for x in shape)), [])
        want = pt.config_dict()
        for e in cand:
            have = e["config"]
            if all(want[k] == have[k] for k in set(want) & set(have)):
                path = root / e["manifest"]
                if path.is_file():
                    return str(path)
        return None
    find.n_entries = sum(len(v) for v in entries.values())  # type: ignore[attr-defined]
    return find
