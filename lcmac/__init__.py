"""lcmac: a compiler for lower-complexity matrix multiplication algorithms (LCMAs)."""
from .errors import LcmacError
from .version import __version__

__all__ = ["__version__", "LcmacError", "auto", "build", "load"]


def __getattr__(name):
    # lazy: `import lcmac` stays light (no numpy-heavy or compiler imports)
    if name == "build":
        from .artifact.build import build
        return build
    if name == "load":
        from .runtime.loader import load
        return load
    if name == "auto":
        from .dispatch import auto
        return auto
    raise AttributeError(f"module 'lcmac' has no attribute {name!r}")
