"""The artifact manifest: ``DIR/<name>.json`` next to ``DIR/<name>.so`` (shared by every backend).

Written atomically (temp file + rename); validated on read.  Fields:

    format          "lcmac-artifact/1"
    lcmac_version   version that built it
    name            artifact name (the file stem)
    backend         "tvm" | "tilelang"
    algorithm       {name, hash, grid [m,k,n], rank, levels}  (plain GEMM: name "gemm", hash null)
    target          {name, family, backend, dict}   (dict: the compiler's target dict)
    dtype           element type of A, B and C
    shape           {M, N, K}: the one shape the library accepts
    config          the schedule knobs used
    entry_points    [{name, kind, arguments}], arguments: [{name, role, shape, dtype, layout}]
    library         {file, sha256, bytes}
    build           {date, seconds, host, compiler, ...}
    extra           backend-specific details (geometry, workspace bytes, ...)
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from lcmac.core.errors import ArtifactError

FORMAT = "lcmac-artifact/1"
REQUIRED = ("format", "name", "backend", "algorithm", "target", "dtype", "shape", "entry_points",
            "library")


@dataclass
class Manifest:
    name: str
    backend: str
    algorithm: dict
    target: dict
    dtype: str
    shape: dict
    config: dict
    entry_points: list
    library: dict
    lcmac_version: str = ""
    build: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)
    format: str = FORMAT

    # ---- convenience -------------------------------------------------------------------
    @property
    def M(self) -> int:
        return int(self.shape["M"])

    @property
    def N(self) -> int:
        return int(self.shape["N"])

    @property
    def K(self) -> int:
        return int(self.shape["K"])

    @property
    def entry(self) -> str:
        return self.entry_points[0]["name"]

    def library_path(self, manifest_path: str | Path) -> Path:
        return Path(manifest_path).resolve().parent / self.library["file"]

    def to_dict(self) -> dict:
        d = asdict(self)
        return {"format": d.pop("format"), **d}

    @classmethod
    def from_dict(cls, d: dict, where: str = "manifest") -> "Manifest":
        if not isinstance(d, dict):
            raise ArtifactError(f"{where} is not a JSON object")
        missing = [k for k in REQUIRED if k not in d]
        if missing:
            raise ArtifactError(f"{where} lacks the field(s) {', '.join(missing)}")
        if d["format"] != FORMAT:
            raise ArtifactError(f"{where} has format {d['format']!r}; this lcmac reads {FORMAT}")
        try:
            # bit-matrix artifacts serve any shape (lcmac.bits.artifact): no M, N, K
            for k in (() if d["shape"].get("rule") == "any" else ("M", "N", "K")):
                if int(d["shape"][k]) < 1:
                    raise ValueError
            if not d["entry_points"] or "name" not in d["entry_points"][0]:
                raise ValueError
            if not isinstance(d["library"].get("file"), str) or len(d["library"].get("sha256", "")) != 64:
                raise ValueError
        except (KeyError, TypeError, ValueError, AttributeError):
            raise ArtifactError(f"{where} is malformed (shape, entry_points or library)") from None
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in d.items() if k in known})

    def write(self, path: str | Path) -> Path:
        path = Path(path)
        atomic_write_bytes(path, (json.dumps(self.to_dict(), indent=2, default=str) + "\n").encode())
        return path

    @classmethod
    def read(cls, path: str | Path) -> "Manifest":
        path = Path(path)
        if not path.is_file():
            raise ArtifactError(f"artifact manifest {path} does not exist (an artifact is "
                                f"<name>.so plus <name>.json, written by `lcmac build`)")
        try:
            d = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise ArtifactError(f"artifact manifest {path} cannot be read: {e}") from None
        return cls.from_dict(d, where=str(path))


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write to a temp file in the same directory, then rename: readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)    # mkstemp makes 0600; artifacts are meant to be shared
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def verify_library(manifest: Manifest, manifest_path: str | Path) -> Path:
    """The library path, after checking it exists and matches the recorded sha256 (before
    anything dlopens it: a truncated or tampered library is refused, not run)."""
    lib = manifest.library_path(manifest_path)
    if not lib.is_file():
        raise ArtifactError(f"artifact library {lib} is missing (manifest {manifest_path})")
    size = lib.stat().st_size
    want = manifest.library.get("bytes")
    if want is not None and size != int(want):
        raise ArtifactError(f"artifact library {lib} has {size} bytes, the manifest records "
                            f"{want}: truncated or replaced; rebuild it")
    got = sha256_file(lib)
    if got != manifest.library["sha256"]:
        raise ArtifactError(f"artifact library {lib} does not match its manifest's sha256 "
                            f"(tampered or rebuilt without its manifest); rebuild it")
    return lib


def find_manifest(path) -> Path:
    """The manifest of an artifact given by its .json, its .so, its directory (one manifest
    in it) or its path without suffix."""
    p = Path(path)
    if p.suffix == ".json":
        return p
    if p.suffix == ".so":
        return p.with_suffix(".json")
    if p.is_dir():
        found = sorted(p.glob("*.json"))
        if len(found) == 1:
            return found[0]
        raise ArtifactError(f"{p} holds {len(found)} manifests; name one")
    return p.with_name(p.name + ".json")
