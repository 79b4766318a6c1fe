"""Environment variables read on a hot path: ``os.environ.get`` encodes its key on every call,
which a per-call check of several names cannot pay."""
from __future__ import annotations

import os

#: the most names one reader takes (its gets are unrolled)
MAX_NAMES = 6
_NEVER = b"\0"            # no environment name holds a NUL: its get is always None


def reader(*names: str):
    """A function returning a tuple that changes whenever one of ``names`` is set, changed or
    unset in ``os.environ`` (its values, encoded as ``os.environ`` holds them; compare
    snapshots, do not read them as strings)."""
    if len(names) > MAX_NAMES:
        raise ValueError(f"reader takes at most {MAX_NAMES} names, got {len(names)}")
    env = os.environ
    data, encode = getattr(env, "_data", None), getattr(env, "encodekey", None)
    if not isinstance(data, dict) or encode is None:   # not CPython's mapping: the plain way
        return lambda: tuple(os.environ.get(n) for n in names)
    k0, k1, k2, k3, k4, k5 = (*map(encode, names), *[_NEVER] * (MAX_NAMES - len(names)))
    get = data.get

    def snapshot():
        if os.environ is not env:                     # os.environ itself replaced
            return tuple(os.environ.get(n) for n in names)
        return (get(k0), get(k1), get(k2), get(k3), get(k4), get(k5))
    return snapshot
