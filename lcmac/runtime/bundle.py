"""``lcmac.load(DIR)`` of a bundle (``lcmac.artifact.bundle``): one callable that runs every
shape the bundle's rules admit, with no compiler installed.

    f = lcmac.load("out/")          # out/bundle.json
    C = f(A, B)                     # any shape a rule admits: exact, ?xNxK, ?x?x?
    f.rule_for(M, N, K)             # which rule serves a shape (None: none)

The rules are tried in the index's order, exact ones first.  A ``?xNxK`` rule built with
``dynamic_rows`` runs its one kernel of run-time M on all the rows (no pieces, no padding).  A kernel is loaded (and its
library checked against the manifest's sha256) the first time a piece needs it.  A shape
no rule admits raises ShapeError naming the rules.  ``prepare_b(B)`` (the
``?xNxK`` rule) combines B once per bucket kernel, lazily, for B's that stay the same.  An
any-shape rule of piece kernels (a CPU bundle, format ``lcmac-bundle/3``) runs through
``lcmac.runtime.bundle_pieces``: views of A, B and C, no copied tiles.  An any-shape rule
of a CUDA bundle (format ``lcmac-bundle/4``, the rule's ``dynamic_shape``) runs its one kernel
of run-time M, N and K on the operands themselves (``run_shape``): more rows than a launch
takes go as launches along M, and a shape whose N or K is not a multiple of 16 bytes (or
whose operands are not contiguous and 16-byte aligned) runs on zero-padded copies; an N or K
past the kernel's largest is refused by name.
"""
from __future__ import annotations

import threading

from lcmac.artifact.bundle import Bundle, RuleSpec, read_bundle
from lcmac.core.errors import LcmacError, ShapeError
from lcmac.core.operands import check_matrices
from lcmac.runtime import bundle_pieces, tiled


class PreparedBundleB:
    """B for a bundle's rows rule, prepared per bucket kernel on first use."""

    def __init__(self, B):
        self.B = B
        self.forms: dict = {}


class BundleFunction:
    """``C = f(A, B, out=None)`` for a 2-D A and B of any shape the bundle admits."""

    def __init__(self, bundle: Bundle, loader):
        self.bundle = bundle
        self._load = loader
        self._fns: dict = {}
        self._by_shape: dict = {}
        self._pieces: dict = {}         # (M, N, K) → name of the piece kernel
        self._lock = threading.Lock()
        for name, k in bundle.kernels.items():
            shp = k["shape"]
            if k.get("piece"):
                self._pieces[(int(shp["M"]), int(shp["N"]), int(shp["K"]))] = name
                continue
            config = k.get("config") or {}
            dynamic = "shape" if config.get("dynamic_shape") else "rows" if config.get("dynamic_rows") else ""
            self._by_shape[(int(shp["M"]), int(shp["N"]), int(shp["K"]), dynamic)] = name
        order = sorted(bundle.rules, key=lambda r: {"exact": 0, "rows": 1, "any": 2}[r.rule.kind])
        self.rules: list[RuleSpec] = order

    def __repr__(self):
        rules = ", ".join(f"{r.rule} ({r.algorithm})" for r in self.rules)
        return (f"<lcmac bundle {self.bundle.target.get('name')} {self.bundle.dtype}: {rules}; "
                f"{len(self.bundle.kernels)} kernels from {self.bundle.path}>")

    @property
    def dtype(self) -> str:
        return self.bundle.dtype

    def kernel(self, shape, dynamic_rows: bool = False, dynamic_shape: bool = False):
        """The loaded kernel of a bucket shape (M, N, K); ``dynamic_rows``: the kernel of
        run-time M taking up to M rows a launch; ``dynamic_shape``: the kernel of run-time
        M, N and K taking up to that shape."""
        form = "shape" if dynamic_shape else "rows" if dynamic_rows else ""
        name = self._by_shape.get((*(int(d) for d in shape), form))
        if name is None:
            what = {"shape": " run-time-shape", "rows": " run-time-M", "": ""}[form]
            raise ShapeError(f"the bundle has no {'x'.join(map(str, shape))}{what} kernel")
        return self._loaded(name)

    def piece_kernel(self, shape):
        """The loaded piece kernel of (P_M, P_N, P_K) (``lcmac.runtime.bundle_pieces``)."""
        name = self._pieces.get(tuple(int(d) for d in shape))
        if name is None:
            raise ShapeError(f"the bundle has no {'x'.join(map(str, shape))} piece kernel")
        return self._loaded(name)

    def _loaded(self, name: str):
        """Kernel ``name``, loaded (its library checked) the first time it is asked for."""
        fn = self._fns.get(name)
        if fn is None:
            with self._lock:
                fn = self._fns.get(name)
                if fn is None:
                    fn = self._fns[name] = self._load(self.bundle.manifest_path(name))
        return fn

    def rule_for(self, M: int, N: int, K: int) -> RuleSpec | None:
        return next((r for r in self.rules if r.rule.admits(M, N, K)), None)

    def prepare_b(self, B) -> PreparedBundleB:
        """B kept for prepared forms (made per bucket kernel when first used)."""
        return PreparedBundleB(B)

    def _b_for(self, prepared: PreparedBundleB | None):
        if prepared is None:
            return None

        def b_for(fn, B):
            prep = getattr(fn, "prepare_b", None)
            if prep is None:
                return B
            if fn not in prepared.forms:
                try:
                    prepared.forms[fn] = prep(B)
                except LcmacError:      # a kernel that cannot prepare (built before it): B itself
                    prepared.forms[fn] = B
            return prepared.forms[fn]
        return b_for

    def __call__(self, A, B, out=None):
        prepared = B if isinstance(B, PreparedBundleB) else None
        if prepared is not None:
            B = prepared.B
        M, N, K = (int(d) for d in check_matrices(A, B))
        r = self.rule_for(M, N, K)
        if r is None:
            raise ShapeError(f"no rule of the bundle {self.bundle.path} admits {M}x{N}x{K}; it "
                             f"serves {', '.join(str(s.rule) for s in self.rules)}")
        if r.rule.kind == "exact":
            fn = self.kernel((M, N, K))
            b = self._b_for(prepared)(fn, B) if prepared is not None else B
            return fn(A, b, out=out)
        if r.rule.kind == "rows" and r.dynamic_rows:
            fn = self.kernel((r.rows[0], N, K), dynamic_rows=True)
            return tiled.run_row_ranges(A, B, out, fn, [(M, True)], N=N, K=K, b_for=self._b_for(prepared))
        if r.rule.kind == "rows":
            return tiled.run_rows(A, B, out, r.rows, self.kernel, N=N, K=K, b_for=self._b_for(prepared))
        if r.dynamic_shape:
            return run_shape(self.kernel(r.dynamic_shape, dynamic_shape=True), A, B, out,
                             who=f"the bundle {self.bundle.path}")
        if r.pieces:
            return bundle_pieces.run_pieces(A, B, out, r.pieces, self.piece_kernel, dtype=self.dtype,
                                            who=f"the bundle {self.bundle.path}")
        return tiled.run_any(A, B, out, r.rows, r.tile, self.kernel)


def _whole(t) -> bool:
    """Whether a tensor can go to a TMA kernel as it is: contiguous, 16-byte aligned."""
    return t.is_contiguous() and t.data_ptr() % 16 == 0


def run_shape(fn, A, B, out=None, who: str = "this kernel"):
    """C = A·B on ``fn``, a kernel of run-time M, N and K (``CudaShapeMatmul``): on the
    operands themselves where it takes them, else on zero-padded copies (N and K rounded up
    to ``fn.vec``; the padding adds nothing to the sums) with C copied out of the padded
    product.  An N or K past the kernel's largest raises ShapeError naming ``who``'s limit."""
    import torch
    M, K = A.shape
    N = B.shape[1]
    if N > fn.max_cols or K > fn.max_depth:
        raise ShapeError(f"{M}x{N}x{K} (MxNxK): {who} takes N up to {fn.max_cols} and K up to "
                         f"{fn.max_depth} (a larger product: build a bundle or a kernel for its shape)")
    ok_out = out is None or _whole(out)
    if fn.shape_why(M, N, K) is None and _whole(A) and _whole(B) and ok_out:
        return fn(A, B, out=out)
    v = fn.vec
    Kp, Np = -(-K // v) * v, -(-N // v) * v
    a = A if Kp == K and _whole(A) else torch.zeros((M, Kp), dtype=A.dtype, device=A.device)
    if a is not A:
        a[:, :K] = A
    b = B if (Kp, Np) == (K, N) and _whole(B) else torch.zeros((Kp, Np), dtype=B.dtype, device=B.device)
    if b is not B:
        b[:K, :N] = B
    if Np == N and ok_out:
        return fn(a, b, out=out)
    c = fn(a, b)
    if out is None:
        return c[:, :N].contiguous()
    out.copy_(c[:, :N])
    return out


def load_bundle(path, loader) -> BundleFunction:
    """The bundle at ``path`` (directory or bundle.json); ``loader(manifest_path)`` loads one
    kernel (``lcmac.load``)."""
    return BundleFunction(read_bundle(path), loader)
