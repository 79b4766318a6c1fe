"""Loading artifacts (no compiler imports): ``load(path)`` and the shared ``Manifest``."""
from lcmac.artifact.manifest import Manifest


def load(path, **kw):
    from lcmac.runtime.loader import load as _load
    return _load(path, **kw)


def c_include_dir() -> str:
    """Directory of ``lcmac.h``, the C API for CPU and CUDA artifacts and bundles; its
    implementation is ``c_source()`` (docs/c-api.md)."""
    import os
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "include")


def c_source() -> str:
    """``lcmac_c.c``, the one file a C program compiles with ``lcmac.h`` (it includes the rest
    of the harness from its own directory)."""
    import os
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "harness", "lcmac_c.c")


def c_cmake_dir() -> str:
    """Directory of ``lcmacConfig.cmake``: ``find_package(lcmac CONFIG PATHS <it>)`` gives the
    target ``lcmac::runtime`` (the header and the harness, built into the project)."""
    import os
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "cmake")


__all__ = ["Manifest", "load", "c_include_dir", "c_source", "c_cmake_dir"]
