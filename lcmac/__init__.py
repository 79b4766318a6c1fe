"""lcmac: a compiler for lower-complexity matrix multiplication algorithms (LCMAs)."""
__version__ = "0.1.0"

from .errors import LcmacError  # noqa: E402

__all__ = ["__version__", "LcmacError"]
