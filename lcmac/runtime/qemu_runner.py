"""Run AArch64 artifacts on a non-ARM host under qemu-user.

There is no AArch64 Python here, so an AArch64 host program does the loading: ``lcmac_run``
(``lcmac/runtime/harness/lcmac_run.c``), cross-compiled with ``aarch64-linux-gnu-gcc`` on
first use into a cache directory.  It dlopens the artifact, provides what an apache-tvm CPU
library needs from its loader (``TVMFFIErrorSetRaisedFromCStrParts``; a pthread
``TVMBackendParallelLaunch``/barrier and a malloc workspace, written into the library's
``__TVMBackend*`` pointers), calls ``__tvm_ffi_<entry>`` with the tvm-ffi packed ABI (each
tensor a ``TVMFFIAny`` of type DLTensor*), and moves tensors through raw files.

    from lcmac.runtime import qemu_runner
    C = qemu_runner.run_artifact("out/<name>.json", A, B, sve_vq=2)       # an lcmac artifact
    (C,) = qemu_runner.run_function("k.so", "mm", [A, B, qemu_runner.Output((m, n), "float32")])

``sve_vq`` is qemu's ``-cpu max,sve-max-vq=N``: the SVE vector length in 128-bit units
(2 → 256 bits, 4 → 512 bits).  The same harness runs unchanged on a real AArch64 Linux host
(where qemu is skipped).  ``guard="after"`` / ``"before"`` puts every tensor and workspace
against a PROT_NONE page (the harness's ``LCMAC_GUARD_PAGES``), so a kernel that reads past
the end or before the start of a buffer crashes (RunError) instead of passing by luck.

``lcmac.load`` uses this module for AArch64 artifacts on other hosts (an emulated callable).
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lcmac.artifact.manifest import Manifest, find_manifest, verify_library
from lcmac.core.cachedir import cache_root
from lcmac.core.errors import ArtifactError, LcmacError, ShapeError, TargetError
from lcmac.spec.cpu import aarch64
from lcmac.spec.targets import get_target
from lcmac.targets import aarch64 as _arm

HARNESS_SOURCE = Path(__file__).with_name("harness") / "lcmac_run.c"

_DT = {"float32": "f32", "float64": "f64", "float16": "f16", "bfloat16": "bf16",
       "int32": "i32", "int64": "i64"}


class RunError(LcmacError, RuntimeError):
    """The artifact ran and reported an error, or crashed under the emulator."""


@dataclass(frozen=True)
class Output:
    """An output tensor argument: its shape and dtype (filled by the call)."""
    shape: tuple
    dtype: str = "float32"


def cache_dir() -> Path:
    """Where the harness binary is kept: lcmac's cache directory, or the temporary directory
    when the disk caches are off (the harness must be built somewhere)."""
    return cache_root() or Path(tempfile.gettempdir()) / "lcmac"


def native() -> bool:
    return aarch64.native_host()


def harness_path() -> Path:
    """The AArch64 ``lcmac_run`` binary, built from its source on first use (keyed by the
    hash of every file it may include, so an edited harness or C API is rebuilt)."""
    h = hashlib.sha256()
    for d in (HARNESS_SOURCE.parent, HARNESS_SOURCE.parent.with_name("include")):
        for f in sorted(d.glob("*.[ch]")) if d.is_dir() else ():
            h.update(f.name.encode() + b"\0" + f.read_bytes())
    tag = h.hexdigest()[:12]
    out = cache_dir() / "harness" / f"aarch64-{tag}" / "lcmac_run"
    if out.exists():
        return out
    cc = _arm.cross_gcc() if not native() else (os.environ.get("CC") or "cc")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f"lcmac_run.{os.getpid()}.tmp")
    cmd = [cc, "-O2", "-std=gnu99", "-rdynamic", "-o", str(tmp), str(HARNESS_SOURCE),
           "-ldl", "-lpthread"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise _arm.ToolchainError(f"building the AArch64 harness failed ({' '.join(cmd)}):\n"
                                  f"{r.stderr.strip()}")
    os.replace(tmp, out)
    return out


def _command(sve_vq: int | None) -> list[str]:
    if native():
        return []
    cmd = [_arm.qemu(), "-L", _arm.sysroot()]
    if sve_vq:
        cmd += ["-cpu", f"max,sve-max-vq={int(sve_vq)}"]
    return cmd


def run_function(lib: str | os.PathLike, func: str, args: list, *, sve_vq: int | None = None,
                 threads: int = 1, repeat: int = 0, timeout: float = 300,
                 guard: str | None = None) -> list[np.ndarray]:
    """Call ``func`` of the AArch64 library ``lib`` with ``args`` (numpy arrays as inputs,
    :class:`Output` for outputs, Python ints as int64 scalars); returns the outputs in order.
    With ``repeat`` > 0 the time per call is in ``run_function.last_seconds`` (meaningless
    under emulation).  ``guard``: None, ``"after"`` or ``"before"`` (see the module doc)."""
    if guard not in (None, "after", "before"):
        raise ValueError(f"guard must be None, 'after' or 'before', not {guard!r}")
    lib = os.path.abspath(lib)
    if not os.path.exists(lib):
        raise ArtifactError(f"no library at {lib}")
    _arm.check_library(lib)
    harness = harness_path()
    with tempfile.TemporaryDirectory(prefix="lcmac-qemu-") as tmp:
        specs, outs = [], []
        for i, a in enumerate(args):
            if isinstance(a, Output):
                dt = np.dtype(a.dtype).name if a.dtype != "bfloat16" else "bfloat16"
                path = os.path.join(tmp, f"out{i}")
                specs.append(f"out:{_DT[dt]}:{'x'.join(str(int(d)) for d in a.shape)}:{path}")
                outs.append((path, a))
            elif isinstance(a, (int, np.integer)) and not isinstance(a, bool):
                specs.append(f"i64:{int(a)}")
            else:
                arr = np.ascontiguousarray(a)
                if arr.dtype.name not in _DT:
                    raise ShapeError(f"argument {i}: dtype {arr.dtype} is not supported")
                path = os.path.join(tmp, f"in{i}")
                arr.tofile(path)
                shape = "x".join(str(d) for d in arr.shape) or "1"
                specs.append(f"in:{_DT[arr.dtype.name]}:{shape}:{path}")
        cmd = _command(sve_vq) + [str(harness), lib, func]
        if repeat:
            cmd += ["--repeat", str(int(repeat))]
        env = dict(os.environ, LCMAC_NUM_THREADS=str(max(1, int(threads))),
                   LCMAC_GUARD_PAGES=guard or "0")
        # cwd: a crashing guest (guard pages) may leave a qemu core file; it goes with tmp
        r = subprocess.run(cmd + specs, capture_output=True, text=True, env=env, timeout=timeout,
                           cwd=tmp)
        if r.returncode != 0:
            how = (f"signal {-r.returncode}" if r.returncode < 0 else f"exit status {r.returncode}")
            raise RunError(f"{func} in {lib} failed under "
                           f"{'qemu-aarch64' if not native() else 'the harness'} ({how}): "
                           f"{(r.stderr or r.stdout).strip()}")
        run_function.last_seconds = None
        for line in r.stdout.splitlines():
            if line.startswith("seconds_per_call="):
                run_function.last_seconds = float(line.split("=", 1)[1])
        return [np.fromfile(p, dtype=o.dtype).reshape(o.shape) for p, o in outs]


run_function.last_seconds = None


def default_sve_vq(target) -> int | None:
    """The SVE length (128-bit units) to emulate ``target`` at when none is given: the fixed
    length of ``aarch64-sve256``/``-sve512``; 2 (256 bits, Neoverse V1's width) for the
    vector-length-agnostic ``aarch64-sve``, so that its code runs wider than the 128-bit
    minimum; None (qemu's default CPU) for NEON."""
    if not aarch64.is_sve(target):
        return None
    return aarch64.sve_vq(target) if target.vector_bits else 2


def check_sve_vq(target, sve_vq) -> int | None:
    """``sve_vq`` validated for ``target``: a power of two from 1 to 16, not below a
    fixed-length target's width (where the code would compute wrong results, not fail)."""
    if sve_vq is None:
        return None
    try:
        vq = int(sve_vq)
    except (TypeError, ValueError):
        raise TargetError(f"sve_vq must be an integer (128-bit units), not {sve_vq!r}") from None
    if vq not in (1, 2, 4, 8, 16):
        # the Arm architecture allows only power-of-two SVE lengths, and the VLA kernel
        # relies on it (lcmac.schedules.te_lcma)
        raise TargetError(f"sve_vq={vq} is not one of 1, 2, 4, 8, 16 (SVE vector lengths of "
                          f"128 to 2048 bits, powers of two)")
    need = aarch64.sve_vq(target)
    if need and target.vector_bits and vq < need:
        raise TargetError(f"{target.name} code needs SVE vectors of at least {target.vector_bits} "
                          f"bits: sve_vq ≥ {need}, not {vq}")
    return vq


def run_artifact(manifest, A: np.ndarray, B: np.ndarray, *, sve_vq: int | None = None,
                 threads: int = 1, entry: str | None = None,
                 guard: str | None = None) -> np.ndarray:
    """C = A·B with the AArch64 lcmac artifact ``manifest`` (its JSON file, the ``.so``
    beside it, or a directory holding one manifest), after checking the library against
    the manifest's sha256.  ``sve_vq`` defaults to :func:`default_sve_vq`."""
    man_path = find_manifest(manifest).resolve()
    man = Manifest.read(man_path)
    target = get_target(man.target["name"])
    if target.family != "aarch64":
        raise ArtifactError(f"{manifest} is a {target.name} artifact, not an AArch64 one")
    lib = verify_library(man, man_path)
    dtype = np.dtype(man.dtype)
    A = np.ascontiguousarray(A, dtype=dtype)
    B = np.ascontiguousarray(B, dtype=dtype)
    if A.ndim != 2 or B.ndim != 2 or A.shape[1] != B.shape[0]:
        raise ShapeError(f"cannot multiply {A.shape} by {B.shape}")
    vq = check_sve_vq(target, sve_vq if sve_vq is not None else default_sve_vq(target))
    (C,) = run_function(lib, entry or man.entry, [A, B, Output((A.shape[0], B.shape[1]), dtype.name)],
                        sve_vq=vq, threads=threads, guard=guard)
    return C
