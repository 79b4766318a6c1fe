"""Loading artifacts (no compiler imports): ``load(path)`` and the shared ``Manifest``."""
from ..artifact.manifest import Manifest


def load(path, **kw):
    from .loader import load as _load
    return _load(path, **kw)


def c_include_dir() -> str:
    """Directory of ``lcmac.h``, the C API for CPU artifacts; its implementation is
    ``<that dir>/../harness/lcmac_c.c`` (README: "Using an artifact from C")."""
    import os
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "include")


__all__ = ["Manifest", "load", "c_include_dir"]
