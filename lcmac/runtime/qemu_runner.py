"""Run AArch64 artifacts on a non-ARM host under qemu-user.

There is no AArch64 Python here, so an AArch64 host program does the loading: ``lcmac_run``
(``lcmac/runtime/harness/lcmac_run.c``), cross-compiled with ``aarch64-linux-gnu-gcc`` on
first use into a cache directory.  It dlopens the artifact, provides what an apache-tvm CPU
library needs from its loader (``TVMFFIErrorSetRaisedFromCStrParts``; a pthread
``TVMBackendParallelLaunch``/barrier and a malloc workspace, written into the library's
``__TVMBackend*`` pointers), calls ``__tvm_ffi_<entry>`` with the tvm-ffi packed ABI (each
tensor a ``TVMFFIAny`` of type DLTensor*), and moves tensors through raw files.

    from lcmac.runtime import qemu_runner
    C = qemu_runner.run_artifact("out/manifest.json", A, B, sve_vq=2)      # an lcmac artifact
    (C,) = qemu_runner.run_function("k.so", "mm", [A, B, qemu_runner.Output((m, n), "float32")])

``sve_vq`` is qemu's ``-cpu max,sve-max-vq=N``: the SVE vector length in 128-bit units
(2 → 256 bits, 4 → 512 bits).  The same harness runs unchanged on a real AArch64 Linux host
(``native=True`` skips qemu).
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import ArtifactError, LcmacError, ShapeError
from ..targets import aarch64 as _arm

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
    base = os.environ.get("LCMAC_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "lcmac")
    return Path(base)


def native() -> bool:
    return platform.machine() in ("aarch64", "arm64")


def harness_path() -> Path:
    """The AArch64 ``lcmac_run`` binary, built from its source on first use (keyed by the
    source's hash, so an edited harness is rebuilt)."""
    src = HARNESS_SOURCE.read_bytes()
    tag = hashlib.sha256(src).hexdigest()[:12]
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
                 threads: int = 1, repeat: int = 0, timeout: float = 300) -> list[np.ndarray]:
    """Call ``func`` of the AArch64 library ``lib`` with ``args`` (numpy arrays as inputs,
    :class:`Output` for outputs, Python ints as int64 scalars); returns the outputs in order.
    With ``repeat`` > 0 the time per call is in ``run_function.last_seconds`` (meaningless
    under emulation)."""
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
        env = dict(os.environ, LCMAC_NUM_THREADS=str(max(1, int(threads))))
        r = subprocess.run(cmd + specs, capture_output=True, text=True, env=env, timeout=timeout)
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


def _manifest(path) -> tuple[dict, Path]:
    p = Path(path)
    if p.is_dir():
        p = p / "manifest.json"
    try:
        return json.loads(p.read_text()), p.parent
    except (OSError, ValueError) as e:
        raise ArtifactError(f"cannot read the manifest {p}: {e}") from None


def run_artifact(manifest, A: np.ndarray, B: np.ndarray, *, sve_vq: int | None = None,
                 threads: int = 1, entry: str | None = None) -> np.ndarray:
    """C = A·B with the AArch64 lcmac artifact whose manifest is ``manifest`` (a path to the
    JSON file or its directory).  For SVE targets ``sve_vq`` defaults to the smallest vector
    length the target needs."""
    from ..targets import get_target
    m, root = _manifest(manifest)
    tname = m["target"] if isinstance(m["target"], str) else m["target"]["name"]
    target = get_target(tname)
    if target.family != "aarch64":
        raise ArtifactError(f"{manifest} is a {target.name} artifact, not an AArch64 one")
    lib = root / _library_name(m)
    dtype = np.dtype(m.get("dtype", "float32"))
    A = np.ascontiguousarray(A, dtype=dtype)
    B = np.ascontiguousarray(B, dtype=dtype)
    if A.ndim != 2 or B.ndim != 2 or A.shape[1] != B.shape[0]:
        raise ShapeError(f"cannot multiply {A.shape} by {B.shape}")
    if sve_vq is None:
        sve_vq = _arm.sve_vq(target)
    name = entry or _entry_name(m)
    (C,) = run_function(lib, name, [A, B, Output((A.shape[0], B.shape[1]), dtype.name)],
                        sve_vq=sve_vq, threads=threads)
    return C


def _library_name(m: dict) -> str:
    for key in ("library", "lib", "so"):
        v = m.get(key)
        if isinstance(v, str):
            return v
        if isinstance(v, dict):
            for k in ("file", "path"):
                if k in v:
                    return v[k]
    raise ArtifactError("the manifest names no library")


def _entry_name(m: dict) -> str:
    e = m.get("entry_points") or m.get("entry") or m.get("entry_point")
    if isinstance(e, str):
        return e
    if isinstance(e, dict):
        return e.get("name") or next(iter(e))
    if isinstance(e, list) and e:
        return e[0] if isinstance(e[0], str) else e[0]["name"]
    return "main"
