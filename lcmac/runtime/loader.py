"""``lcmac.load``: an artifact → a callable ``f(A, B, out=None) -> C``, without any compiler.

CPU (apache-tvm) artifacts: the library's parallel loops and workspaces go through three
function pointers the library exports (``__TVMBackendParallelLaunch``,
``__TVMBackendAllocWorkspace``, ``__TVMBackendFreeWorkspace``) that whoever loads it must
fill; ``tvm_ffi.load_module`` alone leaves them null (the call segfaults, measured).  So the
loader ctypes-loads apache-tvm's ``libtvm_runtime.so`` (3 MB, the thread pool and workspace
pool; found on disk via the installed wheel's location, no ``import tvm``), dlopens the
artifact, fills the pointers, then hands the same mapping to ``tvm_ffi.load_module`` for the
calling convention.  ``LCMAC_TVM_RUNTIME`` overrides the runtime library path.
The thread count is TVM's ``TVM_NUM_THREADS`` (set here to the CPUs this process may use
if unset: TVM's own default is 1 on these machines).

CUDA (TileLang) artifacts are loaded by ``lcmac.runtime.cuda_loader.load(manifest, path)``
where the CUDA backend provides one.

AArch64 artifacts load natively on an AArch64 host (the CPU path above, after checking the
CPU has the SVE width the artifact needs).  On any other host ``load`` returns an
:class:`EmulatedFunction`: the same call and checks, run under qemu-user through
``lcmac.runtime.qemu_runner`` (for correctness; emulated timings mean nothing).
"""
from __future__ import annotations

import ctypes
import importlib.util
import os
import platform
import threading
from pathlib import Path

from lcmac.artifact.bundle import is_bundle
from lcmac.artifact.manifest import Manifest, find_manifest, verify_library
from lcmac.core.errors import ArtifactError, TargetError
from lcmac.core.operands import (
    check_array, check_contiguous, check_device_type, check_dtype_is, check_no_overlap,
    check_shape_is, operand_kind)
from lcmac.spec.cpu import aarch64, x86
from lcmac.spec.targets import get_target
from lcmac.targets import aarch64 as aarch64_toolchain
from lcmac.runtime import amx, cuda_loader, qemu_runner, vendor_blas
from lcmac.runtime.bundle import load_bundle

_CONTEXT_SYMBOLS = ("TVMBackendParallelLaunch", "TVMBackendAllocWorkspace", "TVMBackendFreeWorkspace",
                    "TVMBackendParallelBarrier")
_lock = threading.Lock()
_runtime = None


def tvm_runtime_path() -> Path:
    env = os.environ.get("LCMAC_TVM_RUNTIME")
    if env:
        p = Path(env)
    else:
        spec = importlib.util.find_spec("tvm")   # locates the package; does not import it
        if spec is None or not spec.submodule_search_locations:
            raise ArtifactError("loading a CPU artifact needs apache-tvm's libtvm_runtime.so "
                                "(pip install apache-tvm==0.25.0.post1, or set LCMAC_TVM_RUNTIME)")
        p = Path(list(spec.submodule_search_locations)[0]) / "lib" / "libtvm_runtime.so"
    if not p.is_file():
        raise ArtifactError(f"TVM runtime library {p} not found (set LCMAC_TVM_RUNTIME)")
    return p


def host_cpus() -> int:
    """The CPUs this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _load_runtime():
    global _runtime
    with _lock:
        if _runtime is None:
            if "TVM_NUM_THREADS" not in os.environ:
                os.environ["TVM_NUM_THREADS"] = str(host_cpus())
            import tvm_ffi  # noqa: F401 - libtvm_ffi.so first: libtvm_runtime links against it
            _runtime = ctypes.CDLL(str(tvm_runtime_path()), mode=ctypes.RTLD_GLOBAL)
        return _runtime


class PreparedB:
    """B combined once by ``LcmacFunction.prepare_b``: the packed B̃ in a 64-byte aligned
    numpy buffer, valid for the artifact that made it."""

    def __init__(self, owner: "LcmacFunction", buffer, shape):
        self.owner, self.buffer, self.shape = owner, buffer, tuple(shape)

    def __repr__(self):
        return (f"<lcmac prepared B {self.shape[0]}x{self.shape[1]} for "
                f"{self.owner.manifest.name}, {self.buffer.nbytes} bytes>")


def _aligned_empty(shape, dtype: str, align: int = 64):
    """An uninitialised numpy array whose data starts on an ``align``-byte boundary (the
    kernel's packed loads assume it; numpy alone guarantees 16)."""
    import numpy as np
    n = 1
    for d in shape:
        n *= int(d)
    raw = np.empty(n * np.dtype(dtype).itemsize + align, dtype=np.uint8)
    off = -raw.ctypes.data % align
    return raw[off:off + n * np.dtype(dtype).itemsize].view(dtype).reshape(shape)


class LcmacFunction:
    """``f(A, B)`` → new C; ``f(A, B, out=C)`` writes C.  Shapes, dtype, layout and device
    are checked against the manifest before the library runs.  ``f.prepare_b(B)`` combines
    a B used many times (a weight) once; ``f(A, prepared)`` then skips that step."""

    def __init__(self, manifest: Manifest, path: Path, func, module):
        self.manifest = manifest
        self.path = path
        self._f = func
        self._module = module   # keeps the library mapped
        self._prepared_fns = None
        self.vendor_blas = None     # the CBLAS bound to a vendor-base artifact, in words

    def _prepared_entries(self):
        """(prepare, run, buffer spec) of the library's prepared-B pair."""
        if self._prepared_fns is None:
            spec = self.manifest.extra.get("prepared_b")
            if self._module is None:
                raise ArtifactError(f"artifact {self.manifest.name} is not run natively here "
                                    "(emulated): it has no prepared B")
            if not spec:
                raise ArtifactError(f"artifact {self.manifest.name} has no prepared-B entry points "
                                    "(built by an older lcmac): rebuild it to prepare B once")
            mod = self._module[0]
            try:
                self._prepared_fns = (mod[spec["prepare"]], mod[spec["run"]], spec)
            except Exception:  # noqa: BLE001 - the manifest names what the library lacks
                raise ArtifactError(f"{self.path} lacks the entry points {spec['prepare']} / "
                                    f"{spec['run']} its manifest names") from None
        return self._prepared_fns

    def prepare_b(self, B) -> PreparedB:
        """Run Combine B (the packing of B, for the plain GEMM) once, into a buffer kept by the
        returned object; ``self(A, prepared)`` then runs the rest.  Prepare again after B
        changes: the prepared form is a copy."""
        m = self.manifest
        prepare, _, spec = self._prepared_entries()
        self._check(B, (m.K, m.N), "B")
        buf = _aligned_empty(spec["shape"], spec["dtype"])
        prepare(B, buf)
        return PreparedB(self, buf, (m.K, m.N))

    def __repr__(self):
        m = self.manifest
        return (f"<lcmac {m.algorithm['name']} {m.target['name']} {m.dtype} "
                f"{m.M}x{m.N}x{m.K} from {self.path}>")

    def _check(self, x, shape, role: str):
        """One operand against the manifest: an array on the CPU of its dtype and shape,
        row-major."""
        m = self.manifest
        check_array(x, role)
        check_device_type(x, role, "cpu", f"this artifact ({m.target['name']}) runs on the CPU")
        check_dtype_is(x, role, m.dtype, f"the artifact {m.name}")
        check_shape_is(x, role, shape, f"the artifact {m.name} accepts {'x'.join(map(str, shape))} "
                                       f"(M={m.M}, N={m.N}, K={m.K})")
        check_contiguous(x, role, output=role == "out")

    def __call__(self, A, B, out=None):
        if self.manifest.entry_points[0].get("kind") == "matmul_piece":
            raise ArtifactError(f"{self.manifest.name} is a piece kernel of a bundle (C (+)= A @ B "
                                f"on row-strided views, called by the bundle's runtime): load the "
                                f"bundle's directory with lcmac.load instead")
        if isinstance(B, PreparedB):
            return self._run_prepared(A, B, out)
        out = self._checked(A, B, out)
        self._run(A, B, out)
        return out

    def _run_prepared(self, A, Bp: PreparedB, out):
        if Bp.owner is not self:
            raise ArtifactError(f"this prepared B was made by another artifact ({Bp.owner!r}); "
                                "prepare it with this one")
        _, run, _ = self._prepared_entries()
        out = self._checked(A, None, out)
        run(A, Bp.buffer, out)
        return out

    def _run(self, A, B, out) -> None:
        """Run the library on arguments that passed the checks (subclasses run it elsewhere)."""
        self._f(A, B, out)

    def _checked(self, A, B, out):
        """Check A, B and out (allocated here when None) against the manifest; returns out."""
        m = self.manifest
        self._check(A, (m.M, m.K), "A")
        if B is not None:                   # None: a prepared B, checked when made
            self._check(B, (m.K, m.N), "B")
        if out is None:
            if operand_kind(A) == "torch":
                import torch
                out = torch.empty((m.M, m.N), dtype=A.dtype)
            else:
                import numpy as np
                out = np.empty((m.M, m.N), dtype=A.dtype)
        self._check(out, (m.M, m.N), "out")
        check_no_overlap(out, (("A", A), ("B", B)))
        return out


class EmulatedFunction(LcmacFunction):
    """An AArch64 artifact on a host that is not AArch64, run under qemu-user: the same
    ``f(A, B, out=None)`` and argument checks as :class:`LcmacFunction`, and the library's
    sha256 is checked again before every call (qemu maps the file anew each time).  Each call
    starts an emulator and moves the tensors through files: for correctness checks only,
    never for timing (``qemu_runner`` documents the machinery)."""

    def __init__(self, manifest: Manifest, path: Path, manifest_path: Path, sve_vq: int | None,
                 threads: int):
        super().__init__(manifest, path, None, None)
        self.manifest_path = manifest_path
        self.sve_vq = sve_vq
        self.threads = threads

    def __repr__(self):
        m = self.manifest
        sve = f", SVE {128 * self.sve_vq}-bit" if self.sve_vq else ""
        return (f"<lcmac {m.algorithm['name']} {m.target['name']} {m.dtype} {m.M}x{m.N}x{m.K} "
                f"from {self.path}, EMULATED under qemu-aarch64{sve}: correctness only, not timing>")

    def _run(self, A, B, out) -> None:
        m = self.manifest
        verify_library(m, self.manifest_path)
        (C,) = qemu_runner.run_function(self.path, m.entry,
                                        [_host_view(A), _host_view(B),
                                         qemu_runner.Output((m.M, m.N), m.dtype)],
                                        sve_vq=self.sve_vq, threads=self.threads)
        _host_view(out)[...] = C


def _host_view(x):
    """A numpy view of a checked (CPU, contiguous) numpy array or torch tensor."""
    return x.detach().numpy() if operand_kind(x) == "torch" else x


def _check_host(man: Manifest) -> None:
    fam = man.target.get("family")
    mach = platform.machine()
    if fam == "x86":
        if mach not in ("x86_64", "AMD64"):
            raise TargetError(f"artifact {man.name} is x86-64 code; this machine is {mach}")
        # cpu_flags: features the kernel itself needs beyond the target's (vdpbf16ps:
        # avx512_bf16); without the check such a library dies on an illegal instruction
        x86.check_runnable(man.target["name"], tuple(man.extra.get("cpu_flags", ()) or ()))
        if man.extra.get("gemm_kernel") == "amx":
            amx.request_amx()       # else the first tile instruction is SIGILL
    elif fam == "aarch64":
        if not aarch64.native_host():
            raise TargetError(f"artifact {man.name} is AArch64 code and this machine is {mach}: "
                              "lcmac.load runs it under qemu-user instead")
        aarch64.check_runnable(man.target["name"])


def _load_tvm(man: Manifest, man_path: Path):
    _check_host(man)
    lib = verify_library(man, man_path)     # checksum before any dlopen
    rt = _load_runtime()
    so = ctypes.CDLL(str(lib), mode=ctypes.RTLD_LOCAL)
    for sym in _CONTEXT_SYMBOLS:
        try:
            slot = ctypes.c_void_p.in_dll(so, "__" + sym)
        except ValueError:
            continue    # a library without parallel loops lacks some of them
        slot.value = ctypes.cast(getattr(rt, sym), ctypes.c_void_p).value
    blas = None
    if man.extra.get("gemm_kernel") == "vendor-blas":     # products on a CBLAS bound now
        blas = vendor_blas.bind(so, man.extra.get("vendor_blas") or {})
    import tvm_ffi
    mod = tvm_ffi.load_module(str(lib))
    try:
        fn = mod[man.entry]
    except Exception as e:  # noqa: BLE001
        raise ArtifactError(f"{lib} has no entry point {man.entry!r}: {e}") from None
    f = LcmacFunction(man, lib, fn, (mod, so))
    f.vendor_blas = blas
    return f


def _load_emulated(man: Manifest, man_path: Path, sve_vq) -> EmulatedFunction:
    target = get_target(man.target["name"])
    if sve_vq is None:
        sve_vq = os.environ.get("LCMAC_SVE_VQ") or qemu_runner.default_sve_vq(target)
    vq = qemu_runner.check_sve_vq(target, sve_vq)
    lib = verify_library(man, man_path)
    try:
        aarch64_toolchain.check_library(str(lib))
    except ArtifactError:
        raise TargetError(f"artifact {man.name}'s manifest names the AArch64 target "
                          f"{target.name}, but {lib} is not AArch64 code") from None
    # fail here, naming the package, rather than on the first call
    aarch64_toolchain.qemu()
    aarch64_toolchain.sysroot()
    qemu_runner.harness_path()
    threads = int(os.environ.get("LCMAC_NUM_THREADS") or host_cpus())
    return EmulatedFunction(man, lib, man_path, vq, threads)


#: manifest backend → loader(manifest, manifest path) of the artifact kinds that packages above
#: this one add (``register_loader``): bit-matrix artifacts (``lcmac.bits.loader``)
LOADERS: dict = {}
#: the backends of bit-matrix artifacts, and the module that registers their loader
BIT_BACKENDS, BITS_LOADER = ("bits-native", "bits-cuda"), "lcmac.bits.loader"


def register_loader(backends, loader) -> None:
    """``load`` hands a manifest whose backend is one of ``backends`` to ``loader(manifest,
    manifest path)``."""
    for b in backends:
        LOADERS[b] = loader


def load(path, *, sve_vq: int | None = None) -> LcmacFunction:
    """Load ``DIR/<name>.json`` (or the ``.so`` beside it) → callable.  Imports no compiler.

    An AArch64 artifact on a host that is not AArch64 comes back as an
    :class:`EmulatedFunction` (qemu-user; correctness only, not timing).  ``sve_vq`` is the
    SVE vector length it is emulated at, in 128-bit units (default: ``LCMAC_SVE_VQ``, else
    the fixed length of ``aarch64-sve256``/``-sve512`` and 2 for ``aarch64-sve``); it is
    ignored where the artifact runs natively.

    A bundle (a directory with ``bundle.json``, ``lcmac.artifact.bundle``) comes back as a
    :class:`~lcmac.runtime.bundle.BundleFunction` serving every shape its rules admit; a
    bit-matrix artifact (``lcmac build --dtype gf2|bool``) as a
    :class:`~lcmac.bits.loader.BitsFunction` (``lcmac.load`` registers its loader)."""
    if is_bundle(path):
        return load_bundle(path, lambda p: load(p, sve_vq=sve_vq))
    man_path = find_manifest(path)
    man = Manifest.read(man_path)
    if man.backend == "tvm":
        if man.target.get("family") == "aarch64" and not aarch64.native_host():
            return _load_emulated(man, man_path.resolve(), sve_vq)
        return _load_tvm(man, man_path.resolve())
    if man.backend == "tilelang":
        return cuda_loader.load(man, man_path.resolve())
    if man.backend in LOADERS:
        return LOADERS[man.backend](man, man_path.resolve())
    if man.backend in BIT_BACKENDS:
        raise ArtifactError(f"{man_path} is a bit-matrix artifact: load it with lcmac.load, or "
                            f"import {BITS_LOADER} first (it registers their loader)")
    raise ArtifactError(f"no loader for {man.backend!r} artifacts in this lcmac ({man_path})")
