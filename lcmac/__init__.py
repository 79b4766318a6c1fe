"""lcmac: a compiler for lower-complexity matrix multiplication algorithms (LCMAs)."""
import importlib
import importlib.abc
import importlib.util
import logging
import sys

from lcmac.core.errors import LcmacError
from lcmac.core.version import __version__

# lcmac's modules log under the "lcmac" logger; a library stays quiet unless the application
# configures logging (the `lcmac` command shows INFO on stderr)
logging.getLogger(__name__).addHandler(logging.NullHandler())

# lcmac.nn, lcmac.ops, lcmac.optimize and lcmac.distributed are public too, left out of
# __all__ because they import torch (``from lcmac import *`` stays free of it)
__all__ = ["__version__", "LcmacError", "auto", "build", "load", "matmul", "plan", "bmm"]

#: public name → (module, attribute); None: the module itself
_LAZY = {
    "build": ("lcmac.artifact.build", "build"),
    "load": ("lcmac.runtime.loader", "load"),
    "auto": ("lcmac.api.auto", "auto"),
    "matmul": ("lcmac.api.matmul", "matmul"),
    "plan": ("lcmac.api.matmul", "plan"),
    "bmm": ("lcmac.api.bmm", "bmm"),
    "ops": ("lcmac.api.matmul", None),
    "optimize": ("lcmac.torch.nn", "optimize"),
    "nn": ("lcmac.torch.nn", None),
    "gf2_matmul": ("lcmac.bits", "gf2_matmul"),
    "boolean_matmul": ("lcmac.bits", "boolean_matmul"),
    "distributed": ("lcmac.parallel.distributed", None),
}

#: public name → the modules that register with its module first (the loaders of artifact
#: kinds that packages above the runtime add)
_REGISTER_FIRST = {"load": ("lcmac.bits.loader",)}

#: the public module paths (``from lcmac.nn import Linear``) and the modules that hold them
MODULE_ALIASES = {"lcmac.nn": "lcmac.torch.nn", "lcmac.ops": "lcmac.api.matmul",
                  "lcmac.distributed": "lcmac.parallel.distributed"}


class _AliasFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports a public module path as the module that holds it (one module object, so a
    patch through either name is seen by both)."""

    def find_spec(self, name, path=None, target=None):
        if name in MODULE_ALIASES:
            return importlib.util.spec_from_loader(name, self)
        return None

    def create_module(self, spec):
        module = importlib.import_module(MODULE_ALIASES[spec.name])
        self._spec = module.__spec__
        return module

    def exec_module(self, module):
        module.__spec__ = self._spec            # the import system wrote the alias's spec


if not any(isinstance(f, _AliasFinder) for f in sys.meta_path):
    sys.meta_path.insert(0, _AliasFinder())


def __getattr__(name):
    # lazy: `import lcmac` stays light (no numpy-heavy, compiler or torch imports); lcmac.nn
    # and lcmac.optimize import torch, lcmac.matmul only for torch operands
    try:
        mod_name, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'lcmac' has no attribute {name!r}") from None
    for plugin in _REGISTER_FIRST.get(name, ()):
        importlib.import_module(plugin)
    mod = importlib.import_module(mod_name)
    value = mod if attr is None else getattr(mod, attr)
    globals()[name] = value
    return value
