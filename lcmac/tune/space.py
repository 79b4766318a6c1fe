"""The search space of one (target, dtype, algorithm, shape): enumerate, prune, rank.

1. **Enumerate.**  The backend's template owns its knobs: its ``config_space(target, dtype,
   shape, algorithm=)`` (``lcmac.spec.registry``; the CPU blocking of
   ``lcmac.spec.cpu``: register micro-tile mr×nr, cache blocks mc/nc/kc, …) is
   used when it has one.  Without it (CUDA, and every scaled operand mode) the built-in grid
   of the same knobs, ``default_space``: tiles, k slabs, stages, threads, and for an LCMA
   the FalconGEMM schedule switches.  Configs are the backend's config objects
   (``CpuConfig`` / ``CudaConfig``); the tuning log stores their ``to_dict()``.
2. **Prune.**  Configs that cannot fit on chip are dropped before anything is compiled
   (``lcmac.costmodel.config_estimates.fit_check``: registers, caches, shared memory,
   threads).
3. **Rank.**  By the cost model's per-config time estimate
   (``lcmac.costmodel.config_estimates.estimate``, a Triton-style model of tiles, waves and
   traffic), best first.  The estimate is a prior for ordering measurements: the tuner
   measures the top of this list and the measurements decide.  A backend's space may name
   its leading configs (``named``: the default and its one-knob variants), which then come
   first, in the model's order among themselves.
"""
from __future__ import annotations

import itertools
import warnings
from dataclasses import dataclass, field
from typing import Any

from lcmac.artifact import tuning_log as _db
from lcmac.costmodel.config_estimates import (
    algorithm_of, cuda_config_of, estimate, fit_check, target_object)
from lcmac.core.dtypes import normalize_dtype
from lcmac.spec.cuda.blocking import Blocking
from lcmac.spec.cuda.smem import SMEM_PER_CTA
from lcmac.spec.cuda.support import tma_reduce_why
from lcmac.spec.registry import FAMILIES
from lcmac.spec.targets import schedule_family as family


# ---- enumeration ---------------------------------------------------------------------------
def config_from_dict(target, d: dict):
    """A logged config dict as the backend's config object."""
    return FAMILIES[family(target)].config_class.from_dict(dict(d))


def default_config(target, dtype="float32", algorithm=None, shape=None, operands="native"):
    """The backend's default config for ``algorithm`` (what ``lcmac build`` uses with no
    config and no log: its ``default_config(target, dtype, algorithm, shape=)`` — on CPUs it
    depends on the algorithm, e.g. Strassen² unfused, and on the shape, whose blocks it
    divides over the threads), else its config class with no arguments."""
    alg = algorithm_of(algorithm) if isinstance(algorithm, str) else algorithm
    if operands != "native":            # CUDA scaled operands: the mode's own defaults
        return config_from_dict(target, {"operands": operands})
    try:
        return FAMILIES[family(target)].default_config(target_object(target), dtype, alg, shape=shape)
    except Exception:  # noqa: BLE001 - no default from the backend: its config class's own
        return FAMILIES[family(target)].config_class()


#: CUDA output tiles of the built-in space (block_m, block_n): the measured best 128×256
#: (docs/cuda.md), its transpose, the usual smaller Hopper tiles.
CUDA_TILES = ((128, 256), (256, 128), (128, 128), (64, 256), (128, 64), (64, 128), (64, 64))


#: fp8 tiles (block_m, block_n, threads): two fp32 fragments of the tile per consumer thread
#: (the K block's wgmma result and the running sum) must stay in registers, so 64 rows per
#: consumer warpgroup and at most 192 columns (224 and 256 spill); wider than 128, a tile
#: straddles B̃'s scale blocks
FP8_TILES = ((128, 128, 256), (128, 192, 256), (128, 160, 256), (128, 64, 256), (64, 128, 128),
             (64, 64, 128))


def default_space(fam: str, dtype: str, shape, algorithm=None, operands: str = "native") -> list:
    """Built-in grid of knobs (used when the backend does not offer ``config_space``), as
    the backend's config objects.

    CUDA (``CudaConfig``): output tile × k slab (32/64/128) × pipeline depth (2–5) × consumer
    threads (128 = one warpgroup, 256 = two), and for an LCMA the fused or unfused Combine H;
    the rest (warp policy, swizzle, combine tiles) stays at the backend's measured defaults.
    168 GEMM configs before pruning (about 100 fit on an H100 in bf16).  For an LCMA the
    FalconGEMM schedule switches are in the space too, on the default tile (their effect
    does not depend much on the tile): the fused kernel's split-group persistent grid, its
    persistent grid without splitting, and the cache-aware order off (fused and unfused) —
    each a config the tuner measures when the model ranks it high enough.  The persistent
    unfused GEMM stage (plain GEMM or Algorithm 1) is in the space on the default tile, and
    so is the fused kernel with its TMA-engine epilogue (``tma_reduce``) where the shape's C
    blocks are whole tiles.

    ``operands`` (CUDA, CudaConfig.operands): a scaled fp16 mode searches the same tiles, k
    slabs, depths and threads, unfused (the only path it has), each config in that mode —
    one precision per search, so the log never ranks one precision against another.  fp8
    (``FP8_TILES``) keeps its 128-wide K slab (one scale block) and tiles whose two fp32
    fragments fit the registers, and searches depth, rasterisation and the store."""
    out: list = []
    if fam == "cuda" and operands == "fp8":
        out_bytes = 2 if algorithm in (None, _db.GEMM) else 4        # C in bf16/fp16, or fp32 H
        for (bm, bn, th), st, sw, smem in itertools.product(FP8_TILES, (3, 4, 5, 6), (8, 0), (False, True)):
            # the pipeline and the output tile staged for its store within sm_90a's shared memory
            if st * (bm + bn) * (128 + 4) + smem * bm * bn * out_bytes > SMEM_PER_CTA["sm_90a"]:
                continue
            out.append({"block_m": bm, "block_n": bn, "block_k": 128, "stages": st, "threads": th,
                        "swizzle": sw, "store_via_smem": smem, "fused": False, "operands": operands})
    elif fam == "cuda" and operands != "native":
        for (bm, bn), bk, st, th in itertools.product(CUDA_TILES, (32, 64, 128), (2, 3, 4, 5),
                                                      (128, 256)):
            out.append({"block_m": bm, "block_n": bn, "block_k": bk, "stages": st,
                        "threads": th, "fused": False, "operands": operands})
    elif fam == "cuda":
        lcma = algorithm not in (None, _db.GEMM)
        for (bm, bn), bk, st, th in itertools.product(CUDA_TILES, (32, 64, 128), (2, 3, 4, 5),
                                                      (128, 256)):
            for fu in ((False, True) if lcma else (None,)):
                d = {"block_m": bm, "block_n": bn, "block_k": bk, "stages": st, "threads": th}
                if fu is not None:
                    d["fused"] = fu
                out.append(d)
        # the persistent unfused GEMM stage on the default tile (3 stages beside its output
        # tile's shared memory); the grid kernel is every config above
        out.append({"block_m": 128, "block_n": 256, "block_k": 64, "stages": 3, "threads": 256,
                    "persistent": True, **({"fused": False} if lcma else {})})
        if lcma:
            base = {"block_m": 128, "block_n": 256, "block_k": 64, "stages": 4, "threads": 256}
            # the fused kernel's persistent forms (its grid form is every fused config above);
            # without the cache-aware order it hangs, and the worker refuses it
            for sched in ({"split_group": True}, {"persistent": True}):
                out.append({**base, "fused": True, "overlap_epilogue": True, **sched})
            out.append({**base, "fused": False, "cache_aware": False})
            # the fused kernel with its Combine-H epilogue on the TMA engine, where the shape
            # allows it (its C blocks whole multiples of the tile, schedules.cuda.config.tma_reduce_why)
            tr = {**base, "stages": 3, "fused": True, "tma_reduce": True}
            if _tma_reduce_fits(tr, dtype, shape, algorithm):
                out.append(tr)
    else:
        for mr, nr, kc, mc, nc in itertools.product((4, 8, 16), (16, 32, 64), (64, 128, 256, 512),
                                                    (32, 64, 128, 256), (256, 1024, 4096)):
            out.append({"mr": mr, "nr": nr, "kc": kc, "mc": mc, "nc": nc})
    cls = FAMILIES[fam].config_class
    return [cls.from_dict(d) for d in out]


def _tma_reduce_fits(d: dict, dtype: str, shape, algorithm) -> bool:
    """Whether the worker builds ``d`` (a tma_reduce config) for this case on sm_90a."""
    if shape is None:
        return False
    alg = algorithm_of(algorithm)
    M, N, K = (int(x) for x in shape)
    blk = Blocking(M, N, K, alg.m, alg.k, alg.n, alg.R)
    return tma_reduce_why(cuda_config_of(d), blk, normalize_dtype(dtype), "sm_90a") is None


def enumerate_configs(target, dtype, shape, algorithm=None, operands="native") -> tuple[list, str]:
    """(configs, source) for this case; source says whose space it is."""
    fam = family(target)
    fn = FAMILIES[fam].config_space
    if operands == "native" and fn is not None:
        try:
            cfgs = fn(target_object(target), dtype, tuple(shape), algorithm=algorithm)
            cfgs = cfgs if isinstance(cfgs, list) else list(cfgs)      # keeps a ``named`` count
            if cfgs:
                return cfgs, f"{fn.__module__}.config_space"
        except Exception as e:  # noqa: BLE001 - the built-in space instead, said aloud
            warnings.warn(f"{fn.__module__}.config_space failed ({e}); using the built-in space")
    return default_space(fam, dtype, shape, algorithm, operands), "lcmac.tune.space.default_space"


# ---- the ranked space ----------------------------------------------------------------------
@dataclass
class Point:
    """One candidate of the search: an algorithm run with a config, and the model's view."""
    algorithm: str                 # "gemm" or a catalogue expression (e.g. "strassen^2")
    algorithm_hash: str
    config: Any                    # the backend's config object (or a dict)
    predicted_s: float
    detail: dict = field(default_factory=dict)
    _key: str | None = field(default=None, repr=False, compare=False)

    @property
    def key(self) -> str:
        if self._key is None:
            self._key = _db.config_key(self.config)
        return self._key

    def config_dict(self) -> dict:
        return _db.config_to_dict(self.config)


@dataclass
class Space:
    ranked: list[Point]            # fitting configs, best predicted first
    pruned: list[tuple[Any, str]]  # (config, why it cannot fit)
    source: str                    # where the configs came from

    def __len__(self):
        return len(self.ranked)


def ranked_space(target, dtype, algorithm, shape, *, profile=None, configs=None,
                 operands="native") -> Space:
    """Enumerate, prune (on-chip fit) and rank (analytic estimate) the configs of one case."""
    name, h = _db.algo_identity(algorithm)
    if configs is None:
        configs, source = enumerate_configs(target, dtype, shape, None if h == _db.GEMM else name,
                                            operands)
    else:
        source = "given"
    # the backend's named configs (the default and its one-knob variants) are measured before
    # the model-ranked grid, and never pruned: they differ in knobs the model does not price,
    # which it cannot order against the grid, and its fit rule (an mc × kc block of A in L2)
    # is not how they use the caches (on AVX-512 the rule would prune Winograd²'s default,
    # which beats the grid's best, docs/tuning.md)
    named = {_db.config_key(c) for c in configs[:getattr(configs, "named", 0)]}
    ranked, pruned, seen = [], [], set()
    for c in configs:
        k = _db.config_key(c)
        if k in seen:
            continue
        seen.add(k)
        fit = fit_check(target, dtype, c, profile)
        if not fit.fits and k not in named:     # the backend's own choices are measured as given
            pruned.append((c, fit.reason))
            continue
        est = estimate(target, dtype, shape, None if h == _db.GEMM else name, c, profile)
        ranked.append(Point(name, h, c, est["time_s"], est, k))
    ranked.sort(key=lambda pt: (pt.key not in named, pt.predicted_s, pt.key))
    return Space(ranked, pruned, source)
