"""The runtime's automatic choice: ``mm = lcmac.auto(artifacts="DIR")``; ``C = mm(A, B)``.

Per call shape (M, N, K) and dtype, ``lcmac.policy.measured.decide_by_measurement`` picks the vendor
GEMM (numpy's BLAS / torch.matmul = cuBLAS), lcmac's plain GEMM or an LCMA, preferring
logged measurements over the model, and falls back to the plain GEMM when no LCMA is
predicted or measured to win.  The chosen lcmac kernel comes
from an artifact in ``artifacts`` (indexed by its manifest: algorithm, shape, dtype,
target); with ``build=True`` a missing one is compiled there first (needs the compilers:
apache-tvm for CPU targets, TileLang and nvcc for CUDA; tested on an H100 with CUDA
tensors).  When the chosen kernel has no artifact and may not be built, the call goes to
the vendor GEMM and ``plan()`` says why: a missing artifact never raises, never returns
garbage.

Decisions are cached per (M, N, K, dtype); ``plan(M, N, K, dtype)`` shows one without
running anything.  Operands are checked by the loaded artifact as for ``lcmac.load``.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

from lcmac.artifact.build import build as build_artifact
from lcmac.artifact.cache import cached_build
from lcmac.artifact.manifest import Manifest
from lcmac.costmodel.decision import check_error_budget
from lcmac.core.dtypes import normalize_dtype
from lcmac.core.errors import DTypeError, ShapeError, TargetError
from lcmac.runtime.loader import load
from lcmac.targets import get_target
from lcmac.policy.measured import check_regime, decide_by_measurement, vendor_matmul


@dataclass(frozen=True)
class Plan:
    """What one shape runs: ``runs`` is ``"vendor"`` or the lcmac algorithm; ``artifact`` its
    manifest (None for vendor); ``decision`` the ``decide_by_measurement`` result; ``why``
    in words."""
    shape: tuple
    dtype: str
    runs: str
    artifact: Path | None
    decision: object
    why: str


def _dtype_name(x) -> str:
    return normalize_dtype(x.dtype)        # numpy and torch dtypes alike; unknown: DTypeError


def _is_cuda(x) -> bool:
    return bool(getattr(x, "is_cuda", False))


class AutoMatmul:
    """``C = mm(A, B[, out=C])`` for any 2-D shape: vendor GEMM, lcmac GEMM or an LCMA per
    shape (module doc).  ``artifacts``: a directory of artifacts (None: none; with
    ``build=True`` the kernel cache serves them).  ``target``: an lcmac target name for the
    kernels (default: this CPU's for numpy/CPU tensors, ``cuda`` for CUDA tensors).
    ``logs``: a tuning-log directory (default the project's / ``LCMAC_TUNING_LOGS``).
    ``max_error``: an error budget as a multiple of the plain GEMM's error; LCMAs predicted
    over it are never chosen (``lcmac.costmodel.accuracy``; bf16 Strassen ~3.5×, Strassen²
    ~7×).  ``regime``: "sustained" decides on the tuning log's sustained records (a GPU at
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
        if max_error is not None:
            max_error = check_error_budget(max_error)
        self.max_error = max_error
        self.regime = check_regime(regime)
        self._plans: dict[tuple, Plan] = {}
        self._fns: dict[Path, object] = {}
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
        """The choice for one shape (cached), without running it."""
        d = normalize_dtype(dtype)
        tgt = target or self._target_for(cuda=False)
        key = (int(M), int(N), int(K), d, tgt)
        with self._lock:
            hit = self._plans.get(key)
        if hit is not None:
            return hit
        dec = decide_by_measurement(*key[:3], d, tgt, db=self.logs, vendor=self.vendor,
                                    max_error=self.max_error, regime=self.regime)
        shape = key[:3]
        if dec.is_vendor:
            p = Plan(shape, d, "vendor", None, dec, dec.describe())
        else:
            art = self._artifact(dec.algorithm, shape, d, tgt)
            if art is None and self.build:
                if self.artifacts is None:        # the kernel cache: compiled once, then loaded
                    art = cached_build(dec.algorithm, tgt, d, shape).manifest
                else:
                    art = Path(build_artifact(dec.algorithm, tgt, d, shape, out_dir=str(self.artifacts)))
                    self._index = None          # rescan: the new manifest
            if art is None:
                where = (f"in {self.artifacts}" if self.artifacts is not None else
                         "given (no artifacts directory)")
                why = (f"vendor GEMM: {dec.algorithm} was chosen ({dec.describe()}) but no "
                       f"artifact for {dec.algorithm} {tgt} {d} {M}x{N}x{K} is {where} (build "
                       f"it with `lcmac build`, or pass build=True)")
                p = Plan(shape, d, "vendor", None, dec, why)
            else:
                p = Plan(shape, d, dec.algorithm, art, dec, dec.describe())
        with self._lock:
            self._plans[key] = p
        return p

    # ---- the call -------------------------------------------------------------------------
    def __call__(self, A, B, out=None):
        for nm, x in (("A", A), ("B", B)):
            if len(getattr(x, "shape", ())) != 2:
                raise ShapeError(f"{nm} must be a 2-D matrix, got shape {tuple(getattr(x, 'shape', ()))}")
        (M, K), (K2, N) = tuple(A.shape), tuple(B.shape)
        if K != K2:
            raise ShapeError(f"inner dimensions differ: A is {M}x{K}, B is {K2}x{N}")
        if type(A) is not type(B) or _dtype_name(A) != _dtype_name(B):
            raise DTypeError(f"A and B must be the same kind of array with one dtype; got "
                             f"{type(A).__name__} {_dtype_name(A)} and {type(B).__name__} {_dtype_name(B)}")
        if _is_cuda(A) != _is_cuda(B):
            raise TargetError("A and B are on different devices")
        p = self.plan(M, N, K, _dtype_name(A), target=self._target_for(_is_cuda(A)))
        if p.artifact is None:
            return vendor_matmul(A, B, out=out)
        fn = self._fns.get(p.artifact)
        if fn is None:
            fn = self._fns.setdefault(p.artifact, load(p.artifact))
        return fn(A, B, out=out)

    def __repr__(self):
        budget = "" if self.max_error is None else f" max_error={self.max_error:g}"
        return (f"<lcmac.auto artifacts={self.artifacts} target={self.target or 'by operand'} "
                f"build={self.build}{budget} {len(self._plans)} shapes planned>")


def auto(artifacts=None, **kw) -> AutoMatmul:
    """``lcmac.auto(artifacts="DIR", target=None, logs=None, build=False, vendor=True,
    max_error=None, regime="burst")``."""
    return AutoMatmul(artifacts, **kw)
