"""Load a CUDA artifact (plain ``.so`` built by ``lcmac.targets.tilelang_worker``) and call
it with torch CUDA tensors on the current stream.  Needs only ctypes, torch and the driver:
neither TileLang nor TVM.

    from lcmac.runtime.cuda_loader import load_cuda
    mm = load_cuda("out/lcmac.json")          # the worker's response / the manifest
    C = mm(A, B)                              # A: (M,K), B: (K,N) torch CUDA tensors

Every argument problem raises before anything is launched: device not CUDA, wrong dtype,
shape other than the artifact's (any rows for one built with ``dynamic_rows``: ``CudaRowsMatmul``;
any shape up to the artifact's N and K, both multiples of 16 bytes, for one built with
``dynamic_shape``: ``CudaShapeMatmul``),
non-contiguous operands, or a GPU whose compute capability does not run the artifact's cubin
(sm_90a runs on 9.0 only; sm_80 on 8.x).

A B that stays the same across calls (a weight matrix) can be combined once:

    Bp = mm.prepare_b(B)                      # runs the kernels that read B alone (B -> B̃)
    C = mm(A, Bp)                             # the others; B̃ read from Bp

``Bp`` holds B̃ (not B): it is only valid for the artifact that prepared it, and must be
prepared again when B changes.
"""
from __future__ import annotations

import contextlib
import ctypes
import json
import os

from lcmac.artifact.manifest import verify_library
from lcmac.core.dtypes import ITEMSIZE
from lcmac.core.errors import ArtifactError, LcmacError, ShapeError, TargetError
from lcmac.core.operands import (
    check_aligned, check_contiguous, check_device_type, check_dims, check_dtype_is,
    check_same_device, check_shape_is, check_tensor)
from lcmac.spec.cuda.bsr import bsr_shape_why
from lcmac.spec.target_table import TARGETS
from lcmac.runtime.cuda_memory import kept_empty

_TORCH_DT = {"bfloat16": "bfloat16", "float16": "float16", "float32": "float32",
             "float64": "float64"}


def _torch_dtype(dtype: str):
    import torch
    return getattr(torch, _TORCH_DT[dtype])


def _current_stream(device: int) -> int:
    """The raw handle of the device's current stream: torch's own accessor (what Triton's
    launcher calls; ``torch.cuda.current_stream`` builds a Stream object, several µs)."""
    import torch
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return raw(device) if raw is not None else torch.cuda.current_stream(device).cuda_stream


def _on_device(device: int):
    """A guard making ``device`` current, or none where it already is (the usual case)."""
    import torch
    if torch.cuda.current_device() == device:
        return contextlib.nullcontext()
    return torch.cuda.device(device)


class CudaRunError(LcmacError, RuntimeError):
    """The library reported an error while launching (message from the CUDA runtime)."""


def _cc_ok(arch: str, cc: tuple[int, int]) -> bool:
    num = arch.replace("sm_", "")
    digits = num.rstrip("a")
    major, minor = int(digits[:-1]), int(digits[-1])
    if num.endswith("a"):           # arch-specific features: exactly this compute capability
        return cc == (major, minor)
    return cc[0] == major and cc[1] >= minor


class PreparedB:
    """B combined once by ``CudaMatmul.prepare_b`` (the B-side kernels' outputs, e.g. B̃)."""

    def __init__(self, owner: "CudaMatmul", buf, shape, device):
        self.owner, self.buffer, self.shape, self.device = owner, buf, tuple(shape), device

    def __repr__(self):
        return (f"<lcmac prepared B {self.shape[0]}x{self.shape[1]} for "
                f"{self.owner.meta.get('algorithm_name', '?')}, {self.buffer.numel()} bytes>")


class CudaMatmul:
    """Callable for one artifact: ``C = f(A, B, out=None)``."""
    #: the library's entries for a call and for a call with a prepared B
    RUN, RUN_PREPARED = "lcmac_run", "lcmac_run_prepared"

    def __init__(self, meta: dict, lib_path: str):
        self.meta = meta
        self.lib_path = lib_path
        self.arch = meta["arch"]
        self.dtype = meta["dtype"]
        self.M, self.N, self.K = (int(x) for x in meta["shape"])
        if not os.path.exists(lib_path):
            raise ArtifactError(f"CUDA artifact library missing: {lib_path}")
        self._lib = None
        self._ws = {}

    @property
    def gemm_precision(self) -> str:
        """What the GEMM stage multiplies in (e.g. "tf32" for native float32, "fp16x2 (...)")."""
        return self.meta.get("gemm_precision") or ("tf32" if self.dtype == "float32" else self.dtype)

    def __repr__(self):
        return (f"<lcmac CUDA artifact {self.meta.get('algorithm_name', '?')} {self.arch} {self.dtype} "
                f"{self.M}x{self.N}x{self.K}, GEMM stage {self.gemm_precision}>")

    # -- loading -------------------------------------------------------------------------
    def _open(self, device):
        if self._lib is not None:
            return self._lib
        import torch
        cc = torch.cuda.get_device_capability(device)
        if not _cc_ok(self.arch, cc):
            raise TargetError(f"artifact built for {self.arch} cannot run on this GPU "
                              f"(compute capability {cc[0]}.{cc[1]}, "
                              f"{torch.cuda.get_device_name(device)}); rebuild with "
                              f"--target cuda (the GPU present)")
        torch.cuda.init()
        lib = ctypes.CDLL(self.lib_path)
        lib.lcmac_init.restype = ctypes.c_int
        lib.lcmac_run.restype = ctypes.c_int
        lib.lcmac_run.argtypes = [ctypes.c_void_p] * 5
        lib.lcmac_last_error.restype = ctypes.c_char_p
        lib.lcmac_workspace_bytes.restype = ctypes.c_longlong
        with torch.cuda.device(device):
            if lib.lcmac_init() != 0:
                raise CudaRunError(f"lcmac_init failed: {lib.lcmac_last_error().decode()}")
        self._lib = lib
        return lib

    def workspace(self, device):
        return self._kept_workspace(device, int(self.meta.get("workspace_bytes", 0)))

    def _row_launches(self, A, name: str, launch) -> None:
        """``launch(start, rows, stream)`` for each slice of at most ``max_rows`` rows of A
        (artifacts of run-time rows), on A's device and current stream; a failed launch raises
        with the library's message."""
        dev = A.get_device()
        stream = _current_stream(dev)
        with _on_device(dev):
            for start in range(0, A.shape[0], self.max_rows):
                rc = launch(start, min(self.max_rows, A.shape[0] - start), stream)
                if rc != 0:
                    raise CudaRunError(f"{name} failed ({rc}): "
                                       f"{self._open(A.device).lcmac_last_error().decode()}")

    def _kept_workspace(self, device, need: int):
        """The workspace kept on ``device``, replaced by a larger one when ``need`` bytes
        exceed it (a launch of run-time size)."""
        import torch
        key = str(device)
        ws = self._ws.get(key)
        if ws is None or ws.numel() < need:
            ws = self._ws[key] = kept_empty(max(need, 256), torch.uint8, device)
        return ws

    # -- checking ------------------------------------------------------------------------
    def _check_tensor(self, name, t) -> None:
        """One operand's type, device, dtype, layout and alignment."""
        check_tensor(t, name, error=TypeError)
        check_device_type(t, name, "cuda", "this artifact runs on CUDA tensors")
        check_dtype_is(t, name, _TORCH_DT[self.dtype], "the artifact")
        check_contiguous(t, name, output=name == "out")
        check_aligned(t, name, 16, "TMA")

    def _check_operands(self, named: dict, want: dict, what: str) -> None:
        """Each given operand checked, its shape against ``want``, all on one device."""
        given = {n: t for n, t in named.items() if t is not None}
        for name, t in given.items():
            self._check_tensor(name, t)
        for name, t in given.items():
            check_shape_is(t, name, want[name], f"this artifact computes {what}")
        check_same_device(*given.values(), names=tuple(given))

    def check(self, A, B, out=None):
        self._check_operands({"A": A, "B": B, "out": out},
                             {"A": (self.M, self.K), "B": (self.K, self.N), "out": (self.M, self.N)},
                             f"{self.M}x{self.K} @ {self.K}x{self.N} (build another for other shapes)")

    def __call__(self, A, B, out=None):
        if isinstance(B, PreparedB):
            return self._run_prepared(A, B, out)
        self.check(A, B, out)
        return self._run(getattr(self._open(A.device), self.RUN), A, B.data_ptr(), out)

    def _run(self, entry, A, b_ptr, out):
        """``entry(A, b_ptr, C, workspace, stream)`` on A's device and current stream."""
        import torch
        if out is None:
            out = torch.empty((self.M, self.N), dtype=A.dtype, device=A.device)
        ws = self.workspace(A.device)
        stream = _current_stream(A.get_device())
        with _on_device(A.get_device()):
            rc = entry(A.data_ptr(), b_ptr, out.data_ptr(), ws.data_ptr(), stream)
        if rc != 0:
            raise CudaRunError(f"{entry.__name__} failed ({rc}): "
                               f"{self._open(A.device).lcmac_last_error().decode()}")
        return out

    # -- a B reused across calls ---------------------------------------------------------
    def _prepared_entry(self, device):
        lib = self._open(device)
        if not hasattr(lib, "lcmac_prepare_b"):
            raise ArtifactError("this artifact predates prepared B (no lcmac_prepare_b): rebuild it")
        lib.lcmac_prepared_b_bytes.restype = ctypes.c_longlong
        lib.lcmac_prepare_b.restype = ctypes.c_int
        lib.lcmac_prepare_b.argtypes = [ctypes.c_void_p] * 3
        lib.lcmac_run_prepared.restype = ctypes.c_int
        lib.lcmac_run_prepared.argtypes = [ctypes.c_void_p] * 5
        return lib

    def prepare_b(self, B) -> PreparedB:
        """Run the kernels that read B alone (the combines of B) once, into a buffer kept by
        the returned object; ``self(A, prepared)`` then skips them.  Raises, naming the
        reason, for artifacts whose B side cannot be split off (the plain GEMM, scaled
        fp16 operands, whose per-operand scales share one slot)."""
        import torch
        self.check(None, B, None)
        lib = self._prepared_entry(B.device)
        n = int(lib.lcmac_prepared_b_bytes())
        if n < 0:                       # the library says why (e.g. "nothing to prepare")
            lib.lcmac_prepare_b(None, None, None)
            raise LcmacError(lib.lcmac_last_error().decode())
        buf = kept_empty(max(n, 256), torch.uint8, B.device)
        stream = _current_stream(B.get_device())
        with _on_device(B.get_device()):
            rc = lib.lcmac_prepare_b(B.data_ptr(), buf.data_ptr(), stream)
        if rc != 0:
            raise CudaRunError(f"lcmac_prepare_b failed ({rc}): {lib.lcmac_last_error().decode()}")
        return PreparedB(self, buf, B.shape, B.device)

    def _run_prepared(self, A, Bp: PreparedB, out):
        if Bp.owner is not self:
            raise ArtifactError("this prepared B was made by another artifact "
                                f"({Bp.owner!r}); prepare it with this one")
        self.check(A, None, out)
        check_same_device(A, Bp.buffer, names=("A", "the prepared B"))
        return self._run(getattr(self._prepared_entry(A.device), self.RUN_PREPARED), A,
                         Bp.buffer.data_ptr(), out)


class CudaBatchedMatmul(CudaMatmul):
    """Callable for a batched artifact (``config.batched``): ``C = f(A, B, out=None)`` with
    A [batch, M, K], B [batch, K, N], C [batch, M, N], any batch count (a kernel argument)."""

    def __repr__(self):
        return (f"<lcmac CUDA batched artifact {self.arch} {self.dtype} "
                f"batch x {self.M}x{self.N}x{self.K}>")

    def _open(self, device):
        if self._lib is not None:
            return self._lib
        lib = super()._open(device)
        lib.lcmac_run_batched.restype = ctypes.c_int
        lib.lcmac_run_batched.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_longlong] + [ctypes.c_void_p] * 2
        return lib

    def _plainly_fine(self, A, B, out) -> bool:
        """The common case in a few attribute reads (a call of small products is over in
        tens of µs, so ``check``'s full walk, a few µs per operand, shows): contiguous CUDA
        tensors of the artifact's dtype and shapes on one device, 16-byte aligned.  Anything
        else goes to ``check``, which names what is wrong."""
        import torch
        dt = _torch_dtype(self.dtype)
        b = A.shape[0] if A.dim() == 3 else -1
        return all(type(t) is torch.Tensor and t.is_cuda and t.dtype is dt and t.is_contiguous()
                   and t.data_ptr() % 16 == 0 and t.get_device() == A.get_device()
                   and t.shape == want
                   for t, want in ((A, (b, self.M, self.K)), (B, (b, self.K, self.N)))) \
            and (out is None or (type(out) is torch.Tensor and out.dtype is dt and out.is_contiguous()
                                 and out.data_ptr() % 16 == 0 and out.get_device() == A.get_device()
                                 and out.shape == (b, self.M, self.N)))

    def check(self, A, B, out=None):
        for name, t in (("A", A), ("B", B), ("out", out)):
            if t is not None:
                check_dims(t, name, "batch×rows×cols")
        b = A.shape[0]
        self._check_operands({"A": A, "B": B, "out": out},
                             {"A": (b, self.M, self.K), "B": (b, self.K, self.N), "out": (b, self.M, self.N)},
                             f"[batch, {self.M}, {self.K}] @ [batch, {self.K}, {self.N}] with one "
                             f"batch count for A, B and out (here {b})")

    def prepare_b(self, B):
        raise LcmacError("a batched artifact has no prepared B (each product has its own B)")

    def __call__(self, A, B, out=None):
        import torch
        if not self._plainly_fine(A, B, out):
            self.check(A, B, out)
        if out is None:
            out = torch.empty((A.shape[0], self.M, self.N), dtype=A.dtype, device=A.device)
        lib = self._open(A.device)
        dev = A.get_device()
        with _on_device(dev):
            rc = lib.lcmac_run_batched(A.data_ptr(), B.data_ptr(), out.data_ptr(), A.shape[0],
                                       None, _current_stream(dev))
        if rc != 0:
            raise CudaRunError(f"lcmac_run_batched failed ({rc}): {lib.lcmac_last_error().decode()}")
        return out


class CudaBsrMatmul(CudaMatmul):
    """Callable for a block-sparse artifact (``config.bsr`` = bs): ``C = f(blocks, B, row_ptr,
    col_idx, M, out=None)`` with blocks [nnzb, bs, bs] sorted by block row, row_ptr [M/bs + 1]
    and col_idx [nnzb] int32 (the CSR of the blocks), B [K, N]; any M, K (multiples of bs), N
    (rows of 16 bytes) and nnzb.  The CSR arrays' values are the caller's to get right (the
    kernel reads what they say): ``lcmac.api.structured.prepare_bsr`` builds them from checked
    block indices (once per A; ``bsr_matmul`` on unprepared blocks, at each call).  A call
    checks attributes and launches on the current stream, nothing else: a CUDA graph can
    capture it once the kernel is loaded."""

    def __init__(self, meta: dict, lib_path: str):
        super().__init__(meta, lib_path)
        self.bs = int(meta["config"]["bsr"])

    def __repr__(self):
        return f"<lcmac CUDA block-sparse artifact {self.arch} {self.dtype} {self.bs}-blocks>"

    def _open(self, device):
        if self._lib is not None:
            return self._lib
        lib = super()._open(device)
        lib.lcmac_run_bsr.restype = ctypes.c_int
        lib.lcmac_run_bsr.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_longlong] * 4 + [ctypes.c_void_p] * 2
        return lib

    def check(self, blocks, B, row_ptr, col_idx, M: int, out=None):
        import torch
        bs = self.bs
        self._check_operands({"blocks": blocks, "B": B, "out": out},
                             {"blocks": (blocks.shape[0], bs, bs), "B": tuple(B.shape),
                              "out": (M, B.shape[-1])}, f"C [M, N] from {bs}x{bs} blocks and B [K, N]")
        if B.ndim != 2 or blocks.ndim != 3:
            raise ShapeError(f"blocks {tuple(blocks.shape)} and B {tuple(B.shape)}: this artifact "
                             f"takes blocks [nnzb, {bs}, {bs}] and B [K, N]")
        why = bsr_shape_why(M, B.shape[0], B.shape[1], bs, self.dtype)
        if why is not None:
            raise ShapeError(f"blocks {tuple(blocks.shape)} and B {tuple(B.shape)} for M={M}: {why}")
        for name, t, n in (("row_ptr", row_ptr, M // bs + 1), ("col_idx", col_idx, blocks.shape[0])):
            if not isinstance(t, torch.Tensor) or t.dtype != torch.int32 or tuple(t.shape) != (n,) \
                    or t.device != B.device or not t.is_contiguous():
                raise ShapeError(f"{name} must be a contiguous int32 tensor of {n} on {B.device}, not "
                                 f"{getattr(t, 'dtype', type(t).__name__)} {tuple(getattr(t, 'shape', ()))}")

    def prepare_b(self, B):
        raise LcmacError("a block-sparse artifact has no prepared B")

    def __call__(self, blocks, B, row_ptr, col_idx, M: int, out=None):
        import torch
        self.check(blocks, B, row_ptr, col_idx, M, out)
        K, N = B.shape
        if out is None:
            out = torch.empty((M, N), dtype=B.dtype, device=B.device)
        if blocks.shape[0] == 0:            # no blocks (the kernel's TMA map needs one)
            return out.zero_()
        lib = self._open(B.device)
        stream = _current_stream(B.get_device())
        with _on_device(B.get_device()):
            rc = lib.lcmac_run_bsr(blocks.data_ptr(), B.data_ptr(), out.data_ptr(), row_ptr.data_ptr(),
                                   col_idx.data_ptr(), blocks.shape[0], K, N, M, None, stream)
        if rc != 0:
            raise CudaRunError(f"lcmac_run_bsr failed ({rc}): {lib.lcmac_last_error().decode()}")
        return out


class CudaRowsMatmul(CudaMatmul):
    """Callable for an artifact whose row count is a run-time value (``config.dynamic_rows``,
    ``lcmac.schedules.cuda.rows``): ``C = f(A, B, out=None)`` for A of any M×K; a launch
    takes up to ``max_rows`` rows (the manifest shape's M), more run as launches of that many
    on row slices (no copy).  The workspace is sized for the rows of the launch
    (``lcmac_workspace_bytes_rows``) and kept, grown when a launch needs more.  ``prepare_b``
    serves every M (B̃ does not depend on it)."""
    RUN, RUN_PREPARED = "lcmac_run_rows", "lcmac_run_rows_prepared"

    def __init__(self, meta: dict, lib_path: str):
        super().__init__(meta, lib_path)
        self.max_rows = self.M

    def __repr__(self):
        return (f"<lcmac CUDA artifact {self.meta.get('algorithm_name', '?')} {self.arch} {self.dtype} "
                f"?x{self.N}x{self.K} (any M, up to {self.max_rows} rows a launch), GEMM stage "
                f"{self.gemm_precision}>")

    def _open(self, device):
        if self._lib is not None:
            return self._lib
        lib = super()._open(device)
        rows = [ctypes.c_void_p] * 3 + [ctypes.c_longlong] + [ctypes.c_void_p] * 2
        for entry in (lib.lcmac_run_rows, lib.lcmac_run_rows_prepared):
            entry.restype = ctypes.c_int
            entry.argtypes = rows
        lib.lcmac_workspace_bytes_rows.restype = ctypes.c_longlong
        lib.lcmac_workspace_bytes_rows.argtypes = [ctypes.c_longlong]
        return lib

    def workspace(self, device, rows: int | None = None):
        """The kept workspace on ``device``, at least what a launch of ``rows`` rows needs
        (default: ``max_rows``)."""
        need = int(self._open(device).lcmac_workspace_bytes_rows(self.max_rows if rows is None else rows))
        return self._kept_workspace(device, need)

    def check(self, A, B, out=None):
        for name, t in (("A", A), ("out", out)):
            if t is not None:
                check_dims(t, name, "rows×cols")
        given = A if A is not None else out
        rows = given.shape[0] if given is not None else 0
        self._check_operands({"A": A, "B": B, "out": out},
                             {"A": (rows, self.K), "B": (self.K, self.N), "out": (rows, self.N)},
                             f"?x{self.K} @ {self.K}x{self.N} (any rows; build another for other N, K)")

    def _run(self, entry, A, b_ptr, out):
        """``entry(A, b_ptr, C, rows, workspace, stream)`` over launches of at most
        ``max_rows`` rows, on A's device and current stream."""
        import torch
        if out is None:
            out = torch.empty((A.shape[0], self.N), dtype=A.dtype, device=A.device)
        self._row_launches(A, entry.__name__, lambda start, rows, stream: entry(
            A[start:].data_ptr(), b_ptr, out[start:].data_ptr(), rows,
            self.workspace(A.device, rows).data_ptr(), stream))
        return out


class CudaShapeMatmul(CudaMatmul):
    """Callable for an artifact whose M, N and K are run-time values (``config.dynamic_shape``,
    ``lcmac.schedules.cuda.rows``): ``C = f(A, B, out=None)`` for A of M×K and B of K×N with
    N up to ``max_cols`` and K up to ``max_depth`` (the manifest shape's N and K), both
    multiples of ``vec`` (16-byte rows: ``shape_why`` says why a shape is refused); any M,
    launches of up to ``max_rows`` rows on row slices (no copy).  The workspace is sized for
    each launch's shape (``lcmac_workspace_bytes_shape``) and kept, grown when a launch needs
    more.  No prepared B (B̃'s size depends on N and K)."""
    RUN = "lcmac_run_shape"

    def __init__(self, meta: dict, lib_path: str):
        super().__init__(meta, lib_path)
        self.max_rows, self.max_cols, self.max_depth = self.M, self.N, self.K
        self.vec = 16 // ITEMSIZE[self.dtype]

    def __repr__(self):
        return (f"<lcmac CUDA artifact {self.meta.get('algorithm_name', '?')} {self.arch} {self.dtype} "
                f"?x?x? (N up to {self.max_cols}, K up to {self.max_depth}, multiples of {self.vec}; "
                f"any M, up to {self.max_rows} rows a launch), GEMM stage {self.gemm_precision}>")

    def _open(self, device):
        if self._lib is not None:
            return self._lib
        lib = super()._open(device)
        lib.lcmac_run_shape.restype = ctypes.c_int
        lib.lcmac_run_shape.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_longlong] * 3 + [ctypes.c_void_p] * 2
        lib.lcmac_workspace_bytes_shape.restype = ctypes.c_longlong
        lib.lcmac_workspace_bytes_shape.argtypes = [ctypes.c_longlong] * 3
        return lib

    def shape_why(self, M: int, N: int, K: int) -> str | None:
        """Why this artifact cannot take an M×N×K product as it is (None: it can): N or K
        past its largest, or not a multiple of ``vec`` (the entry point refuses the same)."""
        if N > self.max_cols or K > self.max_depth:
            return (f"this artifact takes N up to {self.max_cols} and K up to {self.max_depth} "
                    f"(build it for a larger shape)")
        if N % self.vec or K % self.vec:
            return (f"N and K must be multiples of {self.vec} for {self.dtype} (16-byte row strides "
                    f"of A, B and C for the TMA copies); a bundle pads other shapes")
        return None

    def workspace(self, device, shape=None):
        """The kept workspace on ``device``, at least what a launch of ``shape`` (M, N, K;
        default: the largest) needs."""
        lib = self._open(device)
        M, N, K = shape or (self.max_rows, self.max_cols, self.max_depth)
        need = int(lib.lcmac_workspace_bytes_shape(M, N, K))
        if need < 0:
            raise ShapeError(lib.lcmac_last_error().decode())
        return self._kept_workspace(device, need)

    def check(self, A, B, out=None):
        for name, t in (("A", A), ("B", B), ("out", out)):
            if t is not None:
                check_dims(t, name, "rows×cols")
        M, K = A.shape
        N = B.shape[1]
        self._check_operands({"A": A, "B": B, "out": out}, {"A": (M, K), "B": (K, N), "out": (M, N)},
                             f"A [M, K] @ B [K, N] of any M, N up to {self.max_cols}, K up to {self.max_depth}")
        why = self.shape_why(M, N, K)
        if why is not None:
            raise ShapeError(f"{M}x{N}x{K} (MxNxK): {why}")

    def prepare_b(self, B):
        raise LcmacError("an artifact of run-time shape has no prepared B (the size of B~ depends on "
                         "N and K): call it with B")

    def __call__(self, A, B, out=None):
        import torch
        if isinstance(B, PreparedB):
            raise LcmacError("an artifact of run-time shape has no prepared B: call it with B")
        self.check(A, B, out)
        (M, K), N = A.shape, B.shape[1]
        if out is None:
            out = torch.empty((M, N), dtype=A.dtype, device=A.device)
        if M == 0 or N == 0:
            return out
        lib = self._open(A.device)
        self._row_launches(A, "lcmac_run_shape", lambda start, rows, stream: lib.lcmac_run_shape(
            A[start:].data_ptr(), B.data_ptr(), out[start:].data_ptr(), rows, N, K,
            self.workspace(A.device, (rows, N, K)).data_ptr(), stream))
        return out


def _callable(meta: dict, lib: str) -> CudaMatmul:
    config = meta.get("config") or {}
    if config.get("dynamic_shape"):
        return CudaShapeMatmul(meta, lib)
    if config.get("dynamic_rows"):
        return CudaRowsMatmul(meta, lib)
    if config.get("bsr"):
        return CudaBsrMatmul(meta, lib)
    return (CudaBatchedMatmul if config.get("batched") else CudaMatmul)(meta, lib)


def load_cuda(meta_or_path, lib_path: str | None = None) -> CudaMatmul:
    """From the worker response / manifest (dict or JSON path); the library path defaults to
    the manifest's ``library`` (relative to the manifest's folder)."""
    if isinstance(meta_or_path, (str, os.PathLike)):
        path = os.fspath(meta_or_path)
        with open(path) as f:
            meta = json.load(f)
        base = os.path.dirname(os.path.abspath(path))
    else:
        meta, base = dict(meta_or_path), os.getcwd()
    lib = lib_path or meta.get("library")
    if lib is None:
        raise ArtifactError("manifest names no CUDA library")
    if not os.path.isabs(lib) or not os.path.exists(lib):
        cand = os.path.join(base, os.path.basename(lib))
        if os.path.exists(cand):
            lib = cand
    return _callable(meta, lib)


def load(man, man_path) -> CudaMatmul:
    """``lcmac.load`` entry for ``backend == "tilelang"`` manifests (lcmac.runtime.manifest):
    checks the library's checksum, then returns the callable."""
    lib = verify_library(man, man_path)
    info = dict(man.extra or {})
    arch = info.get("arch") or TARGETS[man.target["name"]].arch
    meta = {"arch": arch, "dtype": man.dtype, "shape": [man.M, man.N, man.K],
            "workspace_bytes": info.get("workspace_bytes", 0),
            "workspace": info.get("workspace", []), "kernels": info.get("kernels", []),
            "name": info.get("name", "lcmac"), "algorithm_name": man.algorithm.get("name"),
            "config": man.config, "gemm_precision": info.get("gemm_precision"),
            "extra": info.get("extra")}
    f = _callable(meta, str(lib))
    f.manifest = man
    return f
