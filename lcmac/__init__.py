"""lcmac: a compiler for lower-complexity matrix multiplication algorithms (LCMAs)."""
import importlib

from .errors import LcmacError
from .version import __version__

# lcmac.nn, lcmac.ops, lcmac.optimize and lcmac.distributed are public too, left out of
# __all__ because they import torch (``from lcmac import *`` stays free of it)
__all__ = ["__version__", "LcmacError", "auto", "build", "load", "matmul", "bmm"]

#: public name → (module, attribute); None: the module itself
_LAZY = {
    "build": (".artifact.build", "build"),
    "load": (".runtime.loader", "load"),
    "auto": (".dispatch", "auto"),
    "matmul": (".ops", "matmul"),
    "bmm": (".batched", "bmm"),
    "ops": (".ops", None),
    "optimize": (".nn", "optimize"),
    "nn": (".nn", None),
    "gf2_matmul": (".bits", "gf2_matmul"),
    "boolean_matmul": (".bits", "boolean_matmul"),
    "distributed": (".distributed", None),
}


def __getattr__(name):
    # lazy: `import lcmac` stays light (no numpy-heavy, compiler or torch imports); lcmac.nn
    # and lcmac.optimize import torch, lcmac.matmul only for torch operands
    try:
        mod_name, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'lcmac' has no attribute {name!r}") from None
    mod = importlib.import_module(mod_name, __name__)
    value = mod if attr is None else getattr(mod, attr)
    globals()[name] = value
    return value
