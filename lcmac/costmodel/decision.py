"""The model's ranking: the plain GEMM and every applicable LCMA for one shape, dtype and target.

``select(M, N, K, dtype, target)`` returns a list of ``Candidate``, best first; the first
one is the model's decision (``decide_by_model`` returns it alone; the decision lcmac acts
on, ``lcmac.policy``, feeds ``select`` the tuning log's measurements).  It is the plain
GEMM when no LCMA is predicted faster (by at least ``min_speedup``) or when the GEMM is
memory-bound (Eq. 8).

Candidates: the plain GEMM; every base catalogue algorithm with R < m·k·n in each of its
symmetric images (``name`` on its own grid, ``name@MxKxN`` on the others; transforms.orbit);
with ``2 in levels`` the squares ``X^2`` of small base algorithms (m·k·n ≤ 12, and their
images) and ``strassen*X`` for the other small base algorithms X (m·k·n ≤ 27, every image);
with ``3 in levels`` ``strassen^3`` and ``winograd^3``.  A composed algorithm is just a
larger grid to the model.  Algorithms whose blocks would be smaller than ``min_block`` are
left out.  Each LCMA is costed with the fused and the unfused Combine H (Eq. 10 and Eq. 9)
and keeps the faster.

``measurements`` ({algorithm name or "gemm": seconds}, e.g. from the tuner's log) replace
the predicted times of those candidates; the stage breakdown stays the model's.

JSON schema of ``Candidate.to_dict()`` (stable; ``lcmac select --json`` prints it):

    algorithm         str    "gemm" or a catalogue expression ("strassen", "winograd^2",
                             "hopcroft-kerr@3x2x2", "strassen*hopcroft-kerr")
    grid              [m, k, n]   ([1, 1, 1] for gemm)
    rank              int    R (1 for gemm)
    variant           str    "gemm" | "fused" | "unfused"  (Combine H fused into the GEMM);
                             a measured LCMA: its tuned config's (also "tma_reduce")
    predicted_time_s  float  model time (or the measured time when measured is true)
    effective_tflops  float  2·M·N·K / time / 1e12
    speedup_vs_gemm   float  gemm time / this time
    measured          bool   time comes from measurements
    overhead_s        float  kernel-launch overhead included in the time
    stages            {combine_a, combine_b, gemm, combine_h}: each
                          {flops, bytes, intensity (flops/byte or null), time_s,
                           bound ("compute"|"memory"|"none"), ...details}
                      gemm details on GPUs: tile, schedule, tiles, groups, waves,
                      wave_efficiency, split_groups, products, block
    reason            str    why it ranks where it does
    error_ratio       float | null   predicted error ÷ the plain GEMM's (1 for gemm), from
                             accuracy.error_ratio; null where not evaluated (only with
                             ``max_error``, and only the candidates that could be chosen)
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from math import ceil
from typing import Iterable, Mapping

from lcmac.core.dtypes import normalize_model_dtype
from lcmac.core.errors import CatalogueError, DTypeError
from lcmac.ir import catalogue
from lcmac.spec.cuda.operands import FP8_MAX_COMBINE, fp8_combine_size
from lcmac.spec.target_table import TARGETS
from lcmac.costmodel.accuracy import check_covered, error_ratio, screen_ratio
from lcmac.spec.profiles import HardwareProfile, get_profile, profile_for_target
from lcmac.costmodel.stages import (
    STAGES, AlgQuantities, Estimate, StageCost, compose_quantities, gemm_estimate, gemm_intensity,
    lcma_estimates, orbit_quantities, quantities)

SCHEMA = "lcmac-candidate/1"


@dataclass(frozen=True)
class Candidate:
    algorithm: str
    grid: tuple[int, int, int]
    rank: int
    variant: str
    predicted_time_s: float
    effective_tflops: float
    speedup_vs_gemm: float
    stages: Mapping[str, StageCost]
    overhead_s: float
    reason: str = ""
    measured: bool = False
    estimate: Estimate | None = field(default=None, repr=False, compare=False)
    #: predicted error ÷ the plain GEMM's (accuracy.error_ratio); None where not evaluated
    error_ratio: float | None = None

    @property
    def is_gemm(self) -> bool:
        return self.algorithm == "gemm"

    def to_dict(self) -> dict:
        return {"algorithm": self.algorithm, "grid": list(self.grid), "rank": self.rank,
                "variant": self.variant, "predicted_time_s": float(self.predicted_time_s),
                "effective_tflops": float(self.effective_tflops),
                "speedup_vs_gemm": float(self.speedup_vs_gemm), "measured": self.measured,
                "overhead_s": float(self.overhead_s),
                "stages": {nm: self.stages[nm].to_dict() for nm in STAGES},
                "reason": self.reason, "error_ratio": self.error_ratio}


# ---- candidate algorithms ----------------------------------------------------------------
def _images(name: str) -> list[str]:
    """``name`` plus ``name@MxKxN`` for every other grid of its orbit."""
    q = candidate_quantities(name)
    return [name] + [f"{name}@{g[0]}x{g[1]}x{g[2]}" for g in orbit_quantities(q) if g != q.grid]


@functools.lru_cache(maxsize=16)
def candidate_names(levels: tuple[int, ...] = (1, 2)) -> tuple[str, ...]:
    """Catalogue expressions ``select`` considers for the given recursion levels."""
    bases = []
    for nm in catalogue.base_names():
        a = catalogue.get(nm)
        if a.R < a.naive_rank:
            bases.append((nm, a))
    names: list[str] = []
    if 1 in levels:
        for nm, _ in bases:
            names += _images(nm)
    if 2 in levels:
        for nm, a in bases:
            if a.naive_rank <= 12:
                names += [f"{x}^2" for x in _images(nm)]
        if any(nm == "strassen" for nm, _ in bases):
            for nm, a in bases:
                if nm not in ("strassen", "winograd") and a.naive_rank <= 27:
                    names += [f"strassen*{x}" for x in _images(nm)]
    if 3 in levels:
        names += [f"{nm}^3" for nm, _ in bases if nm in ("strassen", "winograd")]
    seen, out = set(), []
    for x in names:
        if x not in seen:
            seen.add(x)
            out.append(x)
    return tuple(out)


@functools.lru_cache(maxsize=4096)
def _get(name: str):
    return catalogue.get(name)


@functools.lru_cache(maxsize=4096)
def candidate_quantities(name: str) -> AlgQuantities:
    """Model quantities of a catalogue expression; compositions (``a*b``, ``a^L``) are
    composed from their factors' quantities, never built or verified (that is the slow
    part of a first ``select``)."""
    if "*" in name:
        parts = [candidate_quantities(p) for p in name.split("*")]
        out = parts[0]
        for q in parts[1:]:
            out = compose_quantities(out, q)
        return dataclasses.replace(out, name=name)
    if "^" in name:
        base, _, lv = name.rpartition("^")
        if not lv.isdigit() or int(lv) < 1:
            raise CatalogueError(f"bad recursion level in {name!r}: write NAME^L with L ≥ 1")
        q0 = candidate_quantities(base)
        out = q0
        for _ in range(int(lv) - 1):
            out = compose_quantities(out, q0)
        return dataclasses.replace(out, name=name)
    if "@" in name:
        base, _, g = name.rpartition("@")
        parts = g.split("x")
        if len(parts) != 3 or not all(x.isdigit() for x in parts):
            raise CatalogueError(f"bad grid in {name!r}: write NAME@MxKxN")
        grid = tuple(int(x) for x in parts)
        orb = orbit_quantities(candidate_quantities(base))
        if grid not in orb:
            raise CatalogueError(f"grid {grid} is not a permutation of {name.split('@')[0]}'s grid")
        return dataclasses.replace(orb[grid], name=name)
    return quantities(_get(name))


# ---- resolving target / dtype ---------------------------------------------------------------
def resolve_profile(target, dtype, profile=None) -> tuple[HardwareProfile, str]:
    """(hardware profile, model dtype) for pricing ``dtype`` on ``target``: ``profile`` (a
    name or a profile) when given, else the target's own.  DTypeError when the target or
    its hardware does not support the dtype; TargetError for an unknown target."""
    d = normalize_model_dtype(dtype)                       # DTypeError on unknown names
    tgt = None
    if profile is not None:
        p = get_profile(profile)
    else:
        p = profile_for_target(target)               # TargetError on unknown targets
        tgt = TARGETS.get(str(target))
    if tgt is not None:
        ok = tgt.dtypes + (("tfloat32",) if tgt.family == "cuda" and "float32" in tgt.dtypes else ())
        if d not in ok:
            raise DTypeError(f"target {tgt.name} does not support {d}; it supports "
                             f"{', '.join(ok)}")
    p.check_dtype(d)                                 # DTypeError if the hardware lacks it
    return p, d


def min_block_for(profile: HardwareProfile) -> int:
    return 64 if profile.kind == "gpu" else 16


# ---- select ---------------------------------------------------------------------------------
def select(M: int, N: int, K: int, dtype="float32", target="x86_64-avx512", *,
           static_b: bool = False, levels: Iterable[int] = (1, 2), profile=None,
           measurements: Mapping[str, float] | None = None, algorithms: Iterable[str] | None = None,
           min_speedup: float = 1.0, min_block: int | None = None,
           group_parallel: bool = True, dedupe: bool = True,
           operands: str = "native", max_error: float | None = None,
           measured_variants: Mapping[str, str] | None = None) -> list[Candidate]:
    """Rank plain GEMM and the applicable LCMAs for C[M×N] = A[M×K]·B[K×N]; best first.

    ``target``: an lcmac target name (its default profile is used) or a profile name;
    ``profile``: a profile name or ``HardwareProfile`` (e.g. a calibrated one) overriding
    the target's.  ``static_b``: B is a weight combined offline.  ``algorithms``: restrict
    the LCMAs to these catalogue expressions.  ``min_speedup``: an LCMA must beat the GEMM
    by this factor to become the decision.  ``dedupe``: of candidates with the same grid,
    rank, variant and predicted time (e.g. ``winograd^2`` and a catalogue <4,4,4;49>) keep
    the first in ``candidate_names`` order and list the others in its reason.
    ``operands``: the CUDA backend's operand mode ("native", "fp16", "fp16x2", "fp8"), priced
    for the GEMM and every LCMA alike (scaled operands: Algorithm 1 only; fp8: the schemes its
    build takes, schedules.cuda.config.FP8_MAX_COMBINE).
    ``max_error``: an error budget, as a multiple of the plain GEMM's error in this dtype.
    LCMAs that could be chosen are checked in order of predicted time
    (``accuracy.error_ratio``, the variant each is costed with) until one is within it; those
    over it are left out, and the first within it (or the GEMM) is the decision.
    ``measured_variants``: the Combine-H variant of each measured LCMA's tuned config
    ("unfused", "fused", "tma_reduce"; ``accuracy.cuda_model_args``): its error is the one
    of the kernel that was measured, and that a build from the log makes.
    """
    p, d = resolve_profile(target, dtype, profile)
    if max_error is not None:
        max_error = check_error_budget(max_error)
        check_covered(d, operands)
    meas = dict(measurements or {})
    for key, v in meas.items():
        if not (isinstance(v, (int, float)) and v > 0):
            raise ValueError(f"measurement for {key!r} must be positive seconds, got {v!r}")
    g = gemm_estimate(M, N, K, d, p, operands=operands)
    g_time = float(meas.get("gemm", g.time_s))
    mb = min_block if min_block is not None else min_block_for(p)
    names = tuple(algorithms) if algorithms is not None else candidate_names(tuple(sorted(set(levels))))
    cands: list[Candidate] = []
    for nm in names:
        try:
            alg = candidate_quantities(nm)
        except CatalogueError:
            if algorithms is not None:
                raise
            continue
        if _applies(alg, M, N, K, mb, operands):
            cands.append(_lcma_candidate(nm, alg, (M, N, K), d, p, g_time, meas, static_b=static_b,
                                         group_parallel=group_parallel, operands=operands,
                                         measured_variants=measured_variants or {}))
    rejected: list[Candidate] = []
    if max_error is not None:
        cands, rejected = within_error_budget(cands, max_error, d, operands, K, g_time, min_speedup)
    if dedupe:
        cands = _deduped(cands)
    cands.sort(key=lambda c: c.predicted_time_s)
    greason = _gemm_reason(cands[0] if cands else None, gemm_intensity(M, N, K, d), p.ridge(d),
                           min_speedup, rejected, max_error, "gemm" in meas)
    gc = Candidate("gemm", (1, 1, 1), 1, "gemm", g_time, 2.0 * M * N * K / g_time / 1e12, 1.0,
                   g.stages, g.overhead_s, greason, "gemm" in meas, g,
                   error_ratio=1.0 if max_error is not None else None)
    if greason.startswith(("decision", "measured; decision")):
        out = [gc] + cands
    else:
        out = sorted(cands + [gc], key=lambda c: c.predicted_time_s)
        out[0] = _with_reason(out[0], "decision: " + out[0].reason)
    return out


def _applies(alg: AlgQuantities, M, N, K, min_block: int, operands: str) -> bool:
    """Whether ``select`` considers ``alg`` for this shape: fewer products than the naive
    scheme, blocks of at least ``min_block``, and (fp8 operands) a plan the build takes."""
    am, ak, an = alg.grid
    if alg.R >= am * ak * an:
        return False
    if min(ceil(M / am), ceil(K / ak), ceil(N / an)) < min_block:
        return False
    # the fp8 build refuses larger combines (schedules.cuda.compose)
    return not (operands == "fp8" and fp8_combine_size(am, ak, an, alg.R) > FP8_MAX_COMBINE)


def _lcma_candidate(nm: str, alg: AlgQuantities, shape, d: str, p: HardwareProfile,
                    g_time: float, meas: Mapping[str, float], *, static_b: bool,
                    group_parallel: bool, operands: str,
                    measured_variants: Mapping[str, str]) -> Candidate:
    """One LCMA priced with the faster of its Combine-H variants (native operands: fused and
    unfused; scaled ones: unfused), its measured time instead where there is one."""
    M, N, K = shape
    naive_rank = alg.grid[0] * alg.grid[1] * alg.grid[2]
    best = None
    for e in lcma_estimates(alg, M, N, K, d, p, variants=(True, False) if operands == "native"
                            else (False,), static_b=static_b, group_parallel=group_parallel,
                            operands=operands):
        if best is None or e.time_s < best.time_s:
            best = e
    t = float(meas.get(nm, best.time_s))
    saved = 1.0 - alg.R / naive_rank
    comb = sum(best.stages[s].time_s for s in ("combine_a", "combine_b", "combine_h"))
    why = (f"{alg.R}/{naive_rank} products ({saved:.1%} fewer multiplications); "
           f"{best.variant} Combine H; combines {comb / max(best.stages['gemm'].time_s, 1e-30):.1%} "
           f"of its GEMM stage")
    variant = best.variant
    if nm in meas:
        why = "measured; " + why
        tuned = measured_variants.get(nm)
        if tuned and tuned != variant:
            variant = tuned
            why += f" (model's form); the tuned config: {tuned} Combine H"
    return Candidate(nm, alg.grid, alg.R, variant, t, 2.0 * M * N * K / t / 1e12,
                     g_time / t, best.stages, best.overhead_s, why, nm in meas, best)


def _deduped(cands: list[Candidate]) -> list[Candidate]:
    """Of candidates with the same grid, rank, variant, time and error, the first, with the
    others named in its reason."""
    kept: dict = {}
    for c in cands:
        key = (c.grid, c.rank, c.variant, round(c.predicted_time_s, 15), c.measured,
               c.error_ratio)
        if key in kept:
            kept[key][1].append(c.algorithm)
        else:
            kept[key] = (c, [])
    return [c if not same else _with_reason(c, c.reason + "; same cost: " + ", ".join(same[:4])
                                             + (f" (+{len(same) - 4})" if len(same) > 4 else ""))
            for c, same in kept.values()]


def _gemm_reason(best_lcma: Candidate | None, ai: float, ridge: float, min_speedup: float,
                 rejected: list[Candidate], max_error: float | None, measured: bool) -> str:
    """The plain GEMM's reason: "decision: …" when it is the decision (memory-bound, Eq. 8;
    no LCMA within the error budget, applicable or fast enough), else "baseline; …".  Of the
    LCMAs over the budget only those predicted faster than the GEMM are named."""
    faster = [c for c in rejected if c.speedup_vs_gemm > 1.0]
    if ai < ridge:
        greason = (f"decision: plain GEMM — memory-bound (Eq. 8: intensity {ai:.1f} FLOP/B < "
                   f"ridge {ridge:.1f} FLOP/B), fewer multiplications cannot help")
    elif (best_lcma is None or best_lcma.speedup_vs_gemm < min_speedup) and faster:
        greason = f"decision: plain GEMM — {_over_budget(faster, max_error)}"
    elif best_lcma is None and rejected:
        greason = (f"decision: plain GEMM — no LCMA within the error budget ({max_error:g}× "
                   f"the GEMM's error) applies to this shape")
    elif best_lcma is None:
        greason = "decision: plain GEMM — no LCMA applies to this shape"
    elif best_lcma.speedup_vs_gemm < min_speedup:
        greason = (f"decision: plain GEMM — best LCMA {best_lcma.algorithm} predicted "
                   f"{best_lcma.speedup_vs_gemm:.3f}× (needs ≥ {min_speedup:g}×)")
    else:
        greason = f"baseline; {best_lcma.algorithm} predicted {best_lcma.speedup_vs_gemm:.3f}× faster"
    if faster and best_lcma is not None and not greason.startswith("decision"):
        greason += f"; {_over_budget(faster, max_error)}"
    return "measured; " + greason if measured else greason


# ---- the error budget ----------------------------------------------------------------------
def check_error_budget(max_error) -> float:
    """``max_error`` as a float; ValueError unless it is a positive, finite number."""
    if isinstance(max_error, bool) or not isinstance(max_error, (int, float)) \
            or not max_error > 0 or max_error == float("inf"):
        raise ValueError(f"max_error must be a positive, finite multiple of the plain GEMM's "
                         f"error, got {max_error!r}")
    return float(max_error)


#: a screened error ratio this far over the budget is rejected without the full estimate
SCREEN_MARGIN = 1.25


def within_error_budget(cands: list[Candidate], max_error: float, dtype: str, operands: str,
                        K: int, g_time: float, min_speedup: float = 0.0
                        ) -> tuple[list[Candidate], list[Candidate]]:
    """(kept, rejected) LCMAs for an error budget.  In order of predicted time, those that
    could be the decision (at least ``min_speedup`` faster than the GEMM's ``g_time``) are
    checked until the first within ``max_error``; measured ones are always checked (a
    decision may prefer a measured time).  The ones over it are rejected; the slower,
    unmeasured ones are kept unevaluated.  A candidate's known ``error_ratio`` is reused."""
    kept, rejected = [], []
    done = False
    for c in sorted(cands, key=lambda c: c.predicted_time_s):
        if not c.measured and (done or g_time / c.predicted_time_s < min_speedup):
            kept.append(c)
            continue
        e = c.error_ratio
        if e is None:
            e = _predicted_error(c, dtype, operands, K, screen_budget=max_error)
            c = dataclasses.replace(c, error_ratio=e)
            if e <= max_error:
                c = _with_reason(c, f"{c.reason}; predicted error {e:.2f}× the GEMM's "
                                    f"(budget {max_error:g}×)")
        if e <= max_error:
            kept.append(c)
            done = True
        else:
            rejected.append(c)
    return kept, rejected


def with_errors(cands: list[Candidate], dtype: str, operands: str, K: int,
                max_error: float | None = None, limit: int | None = None) -> list[Candidate]:
    """``cands`` in order with their predicted error filled in (the plain GEMM: 1; the vendor
    GEMM: left unknown), leaving out those over ``max_error``, at most ``limit`` of them."""
    out = []
    for c in cands:
        if limit is not None and len(out) == limit:
            break
        if c.error_ratio is None and c.algorithm != "vendor":
            c = dataclasses.replace(c, error_ratio=_predicted_error(c, dtype, operands, K))
        if max_error is None or c.error_ratio is None or c.error_ratio <= max_error:
            out.append(c)
    return out


def _predicted_error(c: Candidate, dtype: str, operands: str, K: int,
                     screen_budget: float | None = None) -> float:
    """``c``'s predicted error ÷ the plain GEMM's (1 for the GEMM itself), for the Combine-H
    variant it is costed with.  With ``screen_budget``, a one-sample screen first (a few %
    of noise, ~5x cheaper): a candidate it puts well over the budget skips the full estimate."""
    if c.is_gemm:
        return 1.0
    kw = dict(variant=c.variant, operands=operands, K=K)
    if screen_budget is not None:
        e = screen_ratio(c.algorithm, dtype, **kw)
        if e > SCREEN_MARGIN * screen_budget:
            return e
    return error_ratio(c.algorithm, dtype, **kw).ratio


def _over_budget(rejected: list[Candidate], max_error: float) -> str:
    r = rejected[0]
    more = f" and {len(rejected) - 1} more" if len(rejected) > 1 else ""
    return (f"the LCMAs predicted faster are over the error budget ({max_error:g}× the GEMM's "
            f"error): {r.algorithm} ({r.speedup_vs_gemm:.3f}× faster, predicted error "
            f"{r.error_ratio:.2f}×){more}")


def _with_reason(c: Candidate, reason: str) -> Candidate:
    return dataclasses.replace(c, reason=reason)


def decide_by_model(M: int, N: int, K: int, dtype="float32", target="x86_64-avx512",
                    **kw) -> Candidate:
    """The model's decision alone: ``select(...)[0]`` (``lcmac.policy.plan`` prefers the
    tuning log's measurements)."""
    return select(M, N, K, dtype, target, **kw)[0]
