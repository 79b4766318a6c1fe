"""Loading artifacts (no compiler imports): ``load(path)`` and the shared ``Manifest``."""
from .manifest import Manifest


def load(path):
    from .loader import load as _load
    return _load(path)


__all__ = ["Manifest", "load"]
