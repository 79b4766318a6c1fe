"""The runtime's automatic choice: ``mm = lcmac.auto(artifacts="DIR")``; ``C = mm(A, B)``.

Per call shape (M, N, K) and dtype, ``lcmac.policy.plan`` picks the vendor GEMM (numpy's
BLAS / torch.matmul = cuBLAS), lcmac's plain GEMM or an LCMA, preferring logged measurements
over the model: the same decision, with the same defaults, as ``lcmac.matmul``'s.  What
differs is where the kernels come from: here an artifact of the exact shape in ``artifacts``
(indexed by its manifest: algorithm, shape, dtype, target); with ``build=True`` a missing one
is compiled there (or, without a directory, into the kernel cache) on first use (needs the
compilers: apache-tvm for CPU targets, TileLang and nvcc for CUDA).  When the chosen kernel
has no artifact and may not be built, the call goes to the vendor GEMM and the plan says
why: a missing artifact never raises, never returns garbage.  ``lcmac.matmul`` instead
compiles kernels per row bucket into the kernel cache itself; each ``Plan`` names its
kernels (``Plan.kernels``).

``plan(M, N, K, dtype)`` decides (cached per shape and dtype) without compiling or running
anything; ``artifact(plan)`` finds, or builds, the artifact a plan runs; a call does both.
Operands are checked by the loaded artifact as for ``lcmac.load``, but may have any layout
(a strided one is copied row-major for the artifact, as ``lcmac.matmul`` does).
"""
from __future__ import annotations

import threading
from pathlib import Path

from lcmac import policy
from lcmac.artifact.build import build as build_artifact
from lcmac.artifact.cache import cached_build
from lcmac.artifact.manifest import Manifest
from lcmac.costmodel.error_budget import check_budget_arg
from lcmac.core.dtypes import normalize_dtype
from lcmac.core.errors import ArtifactError
from lcmac.core.operands import (
    check_alike, check_matrices, check_out, check_same_device, is_contiguous, is_cuda, row_major)
from lcmac.runtime.loader import load
from lcmac.runtime.tiled import assign
from lcmac.spec.targets import get_target
from lcmac.policy import VENDOR, Plan, check_regime
from lcmac.runtime.vendor import vendor_matmul


class AutoMatmul:
    """``C = mm(A, B[, out=C])`` for any 2-D shape: vendor GEMM, lcmac GEMM or an LCMA per
    shape (module doc).  ``artifacts``: a directory of artifacts (None: none; with
    ``build=True`` the kernel cache serves them).  ``target``: an lcmac target name for the
    kernels (default: this CPU's for numpy/CPU tensors, ``cuda`` for CUDA tensors).
    ``logs``: a tuning-log directory (default the project's / ``LCMAC_TUNING_LOGS``).
    ``max_error``: an error budget as a multiple of the plain GEMM's error; LCMAs predicted
    over it are never chosen (``lcmac.costmodel.accuracy``; docs/accuracy.md has the ratios
    of bf16 Strassen and Strassen²).  ``regime``: "sustained" decides on the tuning log's sustained records (a GPU at
    its power cap in a long job; ``lcmac tune --sustained``), "burst" (default) on the
    ordinary ones."""

    def __init__(self, artifacts=None, *, target: str | None = None, logs=None,
                 build: bool = False, vendor: bool = True, max_error: float | None = None,
                 regime: str = "burst"):
        self.artifacts = Path(artifacts) if artifacts is not None else None
        self.target = target
        self.logs = logs
        self.build = build
        self.vendor = vendor
        self.max_error = check_budget_arg(max_error)     # None: the default budget; inf: none
        self.regime = check_regime(regime)
        self._plans: dict[tuple, Plan] = {}
        self._fns: dict[tuple, object] = {}      # kernel key → the loaded artifact
        self._index: dict[tuple, Path] | None = None
        self._lock = threading.Lock()

    # ---- artifacts ------------------------------------------------------------------------
    def _scan(self) -> dict[tuple, Path]:
        idx: dict[tuple, Path] = {}
        if self.artifacts is None or not self.artifacts.is_dir():
            return idx
        for p in sorted(self.artifacts.rglob("*.json")):
            try:
                m = Manifest.read(p)
            except Exception:  # noqa: BLE001 - not a manifest (or damaged): not indexed
                continue
            idx[(m.algorithm["name"], m.M, m.N, m.K, m.dtype, m.target["name"])] = p
        return idx

    def _artifact(self, algo: str, shape, dtype: str, target: str) -> Path | None:
        if self._index is None:
            self._index = self._scan()
        return self._index.get((algo, *shape, dtype, target))

    def _target_for(self, cuda: bool) -> str:
        if self.target:
            return self.target
        return get_target("cuda" if cuda else "host").name

    # ---- the decision ---------------------------------------------------------------------
    def plan(self, M: int, N: int, K: int, dtype="float32", *, target: str | None = None) -> Plan:
        """What one shape runs and why (cached): ``lcmac.policy.plan`` for this object's
        artifacts.  Compiles nothing (``artifact`` does, where ``build=True``)."""
        d = normalize_dtype(dtype)
        tgt = target or self._target_for(cuda=False)
        key = (int(M), int(N), int(K), d, tgt)
        with self._lock:
            hit = self._plans.get(key)
        if hit is not None:
            return hit
        p = policy.plan(*key[:3], d, tgt, max_error=self.max_error, regime=self.regime,
                        logs=self.logs, vendor=self.vendor, kernels=self)
        with self._lock:
            self._plans[key] = p
        return p

    @property
    def kernel_source(self) -> str:
        """Where this object's kernels come from, in words (``Plan.kernels``)."""
        if self.artifacts is not None:
            return f"artifacts in {self.artifacts}" + (", built there when missing" if self.build else "")
        if self.build:
            return "the kernel cache, one kernel per shape, compiled on first use"
        return "none (no artifacts directory, build=False)"

    def missing_kernel(self, algorithm: str, target: str, dtype: str, shape) -> str | None:
        """Why the artifact of ``algorithm`` at ``shape`` cannot run, or None where it is in
        the directory or will be built on first use (``Plan``'s ``KernelSource``)."""
        if self.build or self._artifact(algorithm, shape, dtype, target) is not None:
            return None
        where = (f"in {self.artifacts}" if self.artifacts is not None else
                 "given (no artifacts directory)")
        M, N, K = shape
        return (f"no artifact for {algorithm} {target} {dtype} {M}x{N}x{K} is {where} (build it "
                f"with `lcmac build`, or pass build=True; lcmac.matmul instead compiles its own "
                f"kernels into the kernel cache)")

    def artifact(self, p: Plan) -> Path | None:
        """The manifest of the artifact plan ``p`` runs, None where it runs the vendor GEMM:
        from the directory, else (``build=True``) compiled now into it or, without one, into
        the kernel cache (compiled once, then loaded)."""
        if p.runs == VENDOR:
            return None
        shape = tuple(p.shape)
        art = self._artifact(p.runs, shape, p.dtype, p.target)
        if art is None and self.build:
            if self.artifacts is None:
                art = cached_build(p.runs, p.target, p.dtype, shape).manifest
            else:
                art = Path(build_artifact(p.runs, p.target, p.dtype, shape, out_dir=str(self.artifacts)))
                self._index = None          # rescan: the new manifest
        if art is None:
            raise ArtifactError(f"no artifact for {p.runs} {p.target} {p.dtype} "
                                f"{'x'.join(map(str, shape))} in {self.artifacts}: it was there "
                                f"when the shape was planned; build it again (`lcmac build`)")
        return art

    def _kernel(self, p: Plan):
        """The loaded kernel plan ``p`` runs (loaded, or built, once)."""
        key = (p.runs, p.target, p.dtype, tuple(p.shape))
        fn = self._fns.get(key)
        if fn is None:
            fn = self._fns.setdefault(key, load(self.artifact(p)))
        return fn

    # ---- the call -------------------------------------------------------------------------
    def __call__(self, A, B, out=None):
        M, N, K = check_matrices(A, B)
        dtype = check_alike(A, B)
        check_same_device(A, B, by=is_cuda)     # the target follows CUDA or not
        p = self.plan(M, N, K, dtype, target=self._target_for(is_cuda(A)))
        if p.runs == VENDOR:
            return vendor_matmul(A, B, out=out)
        # the artifact reads and writes row-major memory: strided operands are copied
        fn, A, B = self._kernel(p), row_major(A), row_major(B)
        if out is None or is_contiguous(out):
            return fn(A, B, out=out)
        check_out(out, A, (M, N), any_layout=True)
        assign(out, fn(A, B))
        return out

    def __repr__(self):
        budget = "" if self.max_error is None else f" max_error={self.max_error:g}"
        return (f"<lcmac.auto artifacts={self.artifacts} target={self.target or 'by operand'} "
                f"build={self.build}{budget} {len(self._plans)} shapes planned>")


def auto(artifacts=None, **kw) -> AutoMatmul:
    """``lcmac.auto(artifacts="DIR", target=None, logs=None, build=False, vendor=True,
    max_error=None, regime="burst")``."""
    return AutoMatmul(artifacts, **kw)
