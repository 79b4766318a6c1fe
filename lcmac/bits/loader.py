"""Loading a bit-matrix artifact (``lcmac.bits.artifact``): ``lcmac.load(DIR)`` gives a
``BitsFunction``, ``f(A, B)`` → A·B over the artifact's semiring with its scheme and levels,
for operands of any shape: numpy arrays of 0/1 or ``PackedBits`` with a native (CPU)
artifact, CUDA tensors or ``CudaBits`` with a CUDA one.  The library is checked against the
manifest's sha256 before it is opened; nothing is compiled.  Importing this module registers
``load_bits`` with ``lcmac.runtime.loader`` for the bit-matrix manifests (``lcmac.load`` does).
"""
from __future__ import annotations

from pathlib import Path

from lcmac.artifact.manifest import Manifest, verify_library
from lcmac.bits import boolean_matmul, gf2_matmul
from lcmac.bits import cuda as bits_cuda
from lcmac.bits import native as bits_native
from lcmac.bits import native_build
from lcmac.bits.artifact import BIT_DTYPES
from lcmac.core.errors import ArtifactError, TargetError, ToolchainError
from lcmac.runtime import loader as runtime_loader
from lcmac.runtime.cuda_loader import _cc_ok

__all__ = ["BitsFunction", "load_bits"]


class BitsFunction:
    """``f(A, B, *, return_report=False)``: the artifact's product (``gf2_matmul`` with its
    scheme and levels, or ``boolean_matmul``) on its own kernel."""

    def __init__(self, man: Manifest, lib_path: Path):
        self.manifest = man
        self.lib_path = lib_path
        self.semiring = BIT_DTYPES[man.dtype]
        self.algo = man.algorithm["name"]
        self.levels = man.algorithm.get("levels")
        self._kernel = None

    def __repr__(self):
        levels = "auto" if self.levels is None else self.levels
        return (f"<lcmac bit artifact {self.manifest.name}: {self.semiring}, {self.algo} "
                f"(levels {levels}) on {self.manifest.target['name']}>")

    def _native(self):
        if self._kernel is None:
            why = native_build.missing_loader()
            if why:
                raise ToolchainError(why)
            import tvm_ffi                   # the FFI only, as lcmac.bits.native loads it
            try:
                module = tvm_ffi.load_module(str(self.lib_path))
                fn = module[self.manifest.entry]
            except Exception as e:  # noqa: BLE001 - whatever the FFI raises, said as lcmac's
                raise ArtifactError(f"the bit kernel {self.lib_path} cannot be loaded: {e}") from None
            self._kernel = bits_native.NativeKernel(self.semiring, fn, module)
        return self._kernel

    def _cuda(self, A):
        import torch
        device = A.words.device if isinstance(A, bits_cuda.CudaBits) else A.device
        arch = self.manifest.target.get("arch") or ""
        cc = torch.cuda.get_device_capability(device)
        if not _cc_ok(arch, cc):
            raise TargetError(f"bit artifact built for {arch} cannot run on "
                              f"{torch.cuda.get_device_name(device)} (compute capability "
                              f"{cc[0]}.{cc[1]}); rebuild with --target cuda")
        if self._kernel is None:
            self._kernel = bits_cuda.open_library(self.lib_path)
        return self._kernel

    def __call__(self, A, B, *, return_report: bool = False):
        gpu = self.manifest.backend == "bits-cuda"
        given_gpu = bits_cuda.is_cuda_tensor(A) or isinstance(A, bits_cuda.CudaBits)
        if gpu != given_gpu:
            want = "CUDA tensors or CudaBits" if gpu else "numpy arrays or PackedBits"
            raise TargetError(f"{self.manifest.name} runs on {self.manifest.target['name']}: "
                              f"pass {want}")
        if self.semiring == "boolean":
            if gpu:
                return bits_cuda.boolean_product(A, B, kernel=self.manifest.config.get("kernel", "auto"),
                                                 lib=self._cuda(A))
            return boolean_matmul(A, B, kernel=self._native())
        if gpu:
            return bits_cuda.gf2_product(A, B, algo=self.algo, levels=self.levels,
                                         kernel=self.manifest.config.get("kernel", "auto"),
                                         return_report=return_report, lib=self._cuda(A))
        return gf2_matmul(A, B, algo=self.algo, levels=self.levels, kernel=self._native(),
                          return_report=return_report)


def load_bits(man: Manifest, man_path: Path) -> BitsFunction:
    return BitsFunction(man, verify_library(man, man_path))


runtime_loader.register_loader(runtime_loader.BIT_BACKENDS, load_bits)
