"""The per-stage cost model of an LCMA (FalconGEMM's Table II and Eq. 8–10, re-derived).

Source note: only the FalconGEMM abstract could be retrieved here (arXiv 2605.06057), not
its Table II or equations, so the model below is derived from first principles with the
paper's vocabulary; its worked numbers (‖U‖₀ = 12 for Strassen; 1792 tiles, 256 groups,
23 vs 28 waves on 78 SMs) are reproduced by ``Algorithm.nnz`` and ``waves.wave_analysis``.

Notation: ``<m,k,n;R>``, shape M×K·K×N, blocks Mb=⌈M/m⌉, Kb=⌈K/k⌉, Nb=⌈N/n⌉ (padded),
s = bytes per input element, s_o per output element (s, or 2 for fp8 inputs, which produce
bf16), a_X = additions of combine X (``lcmac.ir.cse.addition_counts`` reduced counts when
available, else ‖X‖₀ − outputs), ``in_X`` = input blocks combine X reads (m·k for A),
``mat_X`` = outputs it has to write (rows that are not a bare copy of one input block: a row
equal to +A_il is read in place by the GEMM stage).

====================  ==========================  ==========================================
stage                 work                        DRAM bytes
====================  ==========================  ==========================================
Combine A (group-par) a_A·Mb·Kb adds              (in_A + mat_A)·Mb·Kb·s
Combine A (naive)     same                        Σ_{materialised r}(‖U_r‖₀ + 1)·Mb·Kb·s
Combine B             a_B·Kb·Nb adds              (in_B + mat_B)·Kb·Nb·s   (0 if B static)
GEMM stage, unfused   2·R·Mb·Nb·Kb                R·(Mb·Kb + Kb·Nb)·s + R·Mb·Nb·s_o (H)
GEMM stage, fused     2·R·Mb·Nb·Kb                R·(Mb·Kb + Kb·Nb)·s + m·n·Mb·Nb·s_o (C)
Combine H (unfused)   a_H·Mb·Nb adds              (R + m·n)·Mb·Nb·s_o  (naive: ‖W‖₀ + m·n)
Combine H (fused)     ‖W‖₀·Mb·Nb adds in the      L2 (GPU) / DRAM (CPU) accumulation traffic
                      GEMM epilogue               (2‖W‖₀ − m·n)·Mb·Nb·4, hidden by
                                                  ``epilogue_overlap``; H never hits DRAM
Plain GEMM            2·M·N·K                     (M·K + K·N)·s + M·N·s_o
====================  ==========================  ==========================================

Each stage's time is the roofline max(work / achievable rate, bytes / achievable bandwidth)
(a streaming combine's adds are ~0.1 FLOP/byte, so it is memory-bound on every machine here).
GEMM compute time on a GPU is quantised into waves: ``waves × t_tile`` with
t_tile = 2·bm·bn·Kb / (per-SM achievable FLOP/s · tile efficiency · Kb/(Kb+h)), over the
output tiles that fit on chip (``waves.onchip_fit``), the best one chosen; on a CPU it is
2·R·Mb·Nb·Kb / (achievable FLOP/s · 1/(1 + h/Mb + h/Nb + h/Kb)) — smaller GEMMs run at a
lower fraction of peak, which is what makes one level of Strassen gain only a few percent on
the 2-core CPU while two levels clear 10% (the CPU profile's calibration, docs/cpu.md).

Totals (Eq. 9 unfused, Eq. 10 fused; ``overhead`` = kernel launches × launch overhead):

    T_unfused = T_A + T_B + T_GEMM(R products, H written) + T_H + overhead
    T_fused   = T_A + T_B + T_GEMM+H(epilogue accumulates C)     + overhead

Eq. 8 (memory-bound GEMM → no LCMA): the plain GEMM's arithmetic intensity
2MNK / ((MK+KN)·s + MN·s_o) below the machine's ridge point (achievable FLOP/s ÷ achievable
bandwidth) means fewer multiplications cannot help; ``gemm_is_memory_bound``.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from math import ceil
from types import MappingProxyType
from typing import Mapping

from lcmac.core.dtypes import ITEMSIZE, normalize_model_dtype
from lcmac.core.errors import LcmacError, ShapeError
from lcmac.ir.cse import addition_counts
from lcmac.spec.cuda.operands import OPERAND_MODES  # a config module: no compiler imported
from lcmac.spec.profiles import HardwareProfile, get_profile
from lcmac.costmodel.waves import onchip_fit, wave_analysis

STAGES = ("combine_a", "combine_b", "gemm", "combine_h")


# ---- per-algorithm quantities (cached) ----------------------------------------------------
@dataclass(frozen=True)
class AlgQuantities:
    """What the model needs of an algorithm: per-rank row data of U and V, ‖·‖₀, used
    input/output positions and addition counts (composable without building the scheme)."""
    name: str
    grid: tuple[int, int, int]
    R: int
    rows: Mapping[str, tuple]       # "U", "V", "W": per rank (nnz_r, its coefficient if nnz_r == 1 else 0)
    nnz: Mapping[str, int]          # U, V, W
    used: Mapping[str, int]         # U, V: input blocks any rank reads; W: outputs written
    additions: Mapping[str, int]    # A, B, H
    additions_source: str = "nnz"

    @functools.cached_property
    def inputs(self) -> dict:
        return {"A": self.used["U"], "B": self.used["V"]}

    @functools.cached_property
    def materialized(self) -> dict:
        # a bare ±block is read in place (a −1 moves into W: schedules.cuda.compose.view_plan)
        return {X: sum(1 for q, c in self.rows[T] if q and not (q == 1 and abs(c) == 1))
                for X, T in (("A", "U"), ("B", "V"))}

    @functools.cached_property
    def naive_bytes_units(self) -> dict:
        return {X: sum(q + 1 for q, c in self.rows[T] if q and not (q == 1 and c == 1))
                for X, T in (("A", "U"), ("B", "V"))}


def _rows(T, R):
    out = []
    for r in range(R):
        nz = [x for x in T[r].flat if x != 0]
        out.append((len(nz), nz[0] if len(nz) == 1 else 0))
    return tuple(out)


def _used(T) -> int:
    flat = T.reshape(T.shape[0], -1)
    return int(sum(1 for c in range(flat.shape[1]) if any(x != 0 for x in flat[:, c])))


def _nnz_additions(rows_u, rows_v, nnz_w, used_w) -> dict:
    return {"A": sum(max(0, q - 1) for q, _ in rows_u), "B": sum(max(0, q - 1) for q, _ in rows_v),
            "H": max(0, nnz_w - used_w)}


_QCACHE: dict = {}


def _relabel(q: AlgQuantities, grid, perm, name) -> AlgQuantities:
    rows = {new: q.rows[old] for new, old in zip("UVW", perm)}
    nnz = {new: q.nnz[old] for new, old in zip("UVW", perm)}
    used = {new: q.used[old] for new, old in zip("UVW", perm)}
    return AlgQuantities(name, tuple(grid), q.R, MappingProxyType(rows), MappingProxyType(nnz),
                         MappingProxyType(used),
                         MappingProxyType(_nnz_additions(rows["U"], rows["V"], nnz["W"], used["W"])),
                         "nnz")


def orbit_quantities(q: AlgQuantities) -> dict:
    """{grid: quantities} of the symmetric images of an algorithm, mirroring
    ``lcmac.ir.transforms.orbit`` (transpose: U,V,W → Vᵀ,Uᵀ,Wᵀ on <n,k,m>; rotate:
    U,V,W → V,Wᵀ,Uᵀ on <k,n,m>) without building the schemes.  Per-rank transposes keep
    every count, so an image only relabels the three tensors."""
    out: dict = {}
    grid, perm = q.grid, ("U", "V", "W")
    for _ in range(3):
        m, k, n = grid
        for g, pm in ((grid, perm), ((n, k, m), (perm[1], perm[0], perm[2]))):
            if g not in out:
                out[g] = q if pm == ("U", "V", "W") and g == q.grid else _relabel(
                    q, g, pm, f"{q.name}@{g[0]}x{g[1]}x{g[2]}")
        grid, perm = (k, n, m), (perm[1], perm[2], perm[0])
    return out


def _quantities(alg, cse: bool) -> AlgQuantities:
    R = alg.R
    nnz = alg.nnz()
    rows = {"U": _rows(alg.U, R), "V": _rows(alg.V, R), "W": _rows(alg.W, R)}
    used = {"U": _used(alg.U), "V": _used(alg.V), "W": _used(alg.W)}
    src = "nnz"
    adds = None
    if cse:
        try:
            red = addition_counts(alg)["reduced"]
            adds = {"A": int(red["A"]), "B": int(red["B"]), "H": int(red["H"])}
            src = "cse"
        except ImportError:
            pass
        except Exception:  # a CSE in progress must not break the cost model
            adds = None
    if adds is None:
        adds = _nnz_additions(rows["U"], rows["V"], nnz["W"], used["W"])
    return AlgQuantities(alg.name, alg.grid, R, MappingProxyType(rows),
                         MappingProxyType(dict(nnz)), MappingProxyType(used),
                         MappingProxyType(adds), src)


def compose_quantities(outer: AlgQuantities, inner: AlgQuantities,
                       name: str | None = None) -> AlgQuantities:
    """The quantities of ``compose(outer, inner)`` (Kronecker product) without building it:
    ‖·‖₀, used positions, row lengths and single coefficients multiply (a row is a bare
    copy iff it has one term with coefficient +1).  Additions are the ‖·‖₀ counts of the
    flat scheme."""
    rows = {T: tuple((q1 * q2, c1 * c2) for q1, c1 in outer.rows[T] for q2, c2 in inner.rows[T])
            for T in ("U", "V", "W")}
    nnz = {T: outer.nnz[T] * inner.nnz[T] for T in ("U", "V", "W")}
    used = {T: outer.used[T] * inner.used[T] for T in ("U", "V", "W")}
    grid = tuple(a * b for a, b in zip(outer.grid, inner.grid))
    return AlgQuantities(name or f"{outer.name}*{inner.name}", grid, outer.R * inner.R,
                         MappingProxyType(rows), MappingProxyType(nnz), MappingProxyType(used),
                         MappingProxyType(_nnz_additions(rows["U"], rows["V"], nnz["W"], used["W"])),
                         "nnz")


def quantities(alg, cse: bool = False) -> AlgQuantities:
    """Counts of one algorithm the model needs (cached per algorithm object).

    ``cse=True`` takes the addition counts from ``lcmac.ir.cse.addition_counts`` (reduced),
    else from ‖·‖₀ (each output of q terms costs q−1).  CSE can take seconds for a large
    scheme, and the count never decides a time here: combines are memory-bound (a few adds
    per element against tens of bytes), so ``select`` uses the fast count and
    ``stage_table`` the reduced one."""
    if isinstance(alg, AlgQuantities):
        return alg
    key = (alg.name, alg.grid, alg.R, id(alg.U), bool(cse))
    hit = _QCACHE.get(key)
    if hit is None:
        if len(_QCACHE) > 4096:
            _QCACHE.clear()
        hit = _QCACHE[key] = (alg.U, _quantities(alg, bool(cse)))  # holding U keeps its id unique
    return hit[1]


# ---- results ------------------------------------------------------------------------------
@dataclass(frozen=True)
class StageCost:
    name: str
    flops: float                # multiply-add FLOPs (gemm) or element additions (combines)
    bytes: float                # DRAM bytes
    time_s: float
    bound: str                  # "compute" | "memory" | "none"
    detail: Mapping = field(default_factory=lambda: MappingProxyType({}))

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes if self.bytes else float("inf") if self.flops else 0.0

    def to_dict(self) -> dict:
        ai = self.intensity
        return {"flops": float(self.flops), "bytes": float(self.bytes),
                "intensity": None if ai == float("inf") else float(ai),
                "time_s": float(self.time_s), "bound": self.bound, **dict(self.detail)}


_NONE = StageCost("none", 0.0, 0.0, 0.0, "none")


def _none(name, note) -> StageCost:
    return StageCost(name, 0.0, 0.0, 0.0, "none", MappingProxyType({"note": note}))


@dataclass(frozen=True)
class Estimate:
    algorithm: str              # "gemm" for the plain GEMM
    grid: tuple[int, int, int]
    rank: int
    variant: str                # "gemm" | "fused" | "unfused"
    stages: Mapping[str, StageCost]
    overhead_s: float
    kernels: int

    @property
    def time_s(self) -> float:
        return sum(s.time_s for s in self.stages.values()) + self.overhead_s


def _roof(name, flops, nbytes, rate, bw, detail=None) -> StageCost:
    tc = flops / rate if flops else 0.0
    tm = nbytes / bw if nbytes else 0.0
    return StageCost(name, flops, nbytes, max(tc, tm), "compute" if tc >= tm else "memory",
                     MappingProxyType(dict(detail or {})))


def _out_bytes(dtype: str) -> int:
    return 2 if dtype == "float8_e4m3" else ITEMSIZE[dtype]


def _acc_bytes(dtype: str) -> int:
    return 8 if dtype == "float64" else 4


# ---- the GEMM stage -------------------------------------------------------------------------
#: results of pure functions of a profile, memoised for a ranking's hundreds of candidates.
#: Profiles are immutable but unhashable (mappings inside): keyed by id, every entry holding
#: its profile so that the id is not reused while the entry lives
_BY_PROFILE: dict = {}
_BY_PROFILE_MAX = 1 << 15


def _by_profile(key: tuple, p: HardwareProfile, compute):
    hit = _BY_PROFILE.get(key)
    if hit is None:
        if len(_BY_PROFILE) > _BY_PROFILE_MAX:
            _BY_PROFILE.clear()
        hit = _BY_PROFILE[key] = (p, compute())
    return hit[1]


def _gpu_tiles(p: HardwareProfile, dtype: str):
    """GPU output tiles that fit on chip (3-stage pipeline, k-block 64), best first."""
    return _by_profile(("tiles", id(p), dtype), p, lambda: tuple(_fitting_tiles(p, dtype)))


def _fitting_tiles(p: HardwareProfile, dtype: str) -> list:
    out = []
    for (bm, bn), eff in sorted(p.tile_efficiency.items(), key=lambda kv: -kv[1]):
        cfg = {"block_m": bm, "block_n": bn, "block_k": 64 if ITEMSIZE[dtype] <= 2 else 32,
               "stages": 3}
        if onchip_fit(p, dtype, cfg).fits:
            out.append(((bm, bn), eff))
    return out or [((64, 64), 0.5)]


def _gemm_compute(p: HardwareProfile, dtype: str, Mb: int, Nb: int, Kb: int, R: int,
                  m: int, n: int, schedule: str):
    """(compute seconds, detail) of R products Mb×Kb·Kb×Nb."""
    if p.kind == "cpu":                     # a few operations: cheaper than a memo's key
        return _gemm_stage_compute(p, dtype, Mb, Nb, Kb, R, m, n, schedule)
    t, det = _by_profile(("gemm", id(p), dtype, Mb, Nb, Kb, R, m, n, schedule), p,
                         lambda: _gemm_stage_compute(p, dtype, Mb, Nb, Kb, R, m, n, schedule))
    return t, {k: list(v) if isinstance(v, list) else v for k, v in det.items()}  # the caller's own


def _gemm_stage_compute(p: HardwareProfile, dtype: str, Mb: int, Nb: int, Kb: int, R: int,
                        m: int, n: int, schedule: str):
    rate = _by_profile(("rate", id(p), dtype), p, lambda: p.achievable_mul(dtype))
    if p.kind == "cpu":
        h = p.shape_half
        eff = 1.0 / (1.0 + h / Mb + h / Nb + h / Kb)
        return 2.0 * R * Mb * Nb * Kb / (rate * eff), {"shape_efficiency": round(eff, 6)}
    per_unit = rate / p.units
    bw = p.achievable_bw()
    best = None
    for (bm, bn), teff in _gpu_tiles(p, dtype):
        wa = wave_analysis(Mb * m, Nb * n, units=p.units, tile=(bm, bn), m=m, n=n, R=R)
        # split-K when the tiles cannot fill the machine: s partial tiles per tile, each
        # over Kb/s, plus writing and re-reading s fp32 partial outputs
        tiles = wa.tiles
        splits = [1] + [sk for sk in (2, 3, 4, 6, 8) if tiles < 2 * p.units and Kb // sk >= 128]
        for sk in splits:
            kb = ceil(Kb / sk)
            if schedule == "whole-group":
                waves = ceil(wa.tiles_per_product * sk / p.units) * R
            else:
                waves = ceil(wa.tiles * sk / p.units)
            kfac = kb / (kb + p.shape_half)
            t = waves * 2.0 * bm * bn * kb / (per_unit * teff * kfac)
            if sk > 1:
                t += 2.0 * sk * R * Mb * Nb * 4 / bw
            if best is None or t < best[0]:
                best = (t, {"tile": [bm, bn], "schedule": schedule, "split_k": sk,
                            "tiles": wa.tiles * sk, "groups": wa.groups, "waves": waves,
                            "wave_efficiency": round(wa.tiles * sk / (waves * p.units), 6),
                            "split_groups": wa.split_groups if schedule == "split-group" else 0})
    return best


# ---- scaled fp16 operands (the CUDA backend's CudaConfig.operands) ---------------------------
#: "native": Ã/B̃ in the storage dtype; "fp16": scaled fp16 Ã/B̃ (an amax pass over A and B
#: first), H in fp32; "fp16x2": float32 split into two fp16 halves, three fp16 products


@dataclass(frozen=True)
class OperandTerms:
    """What an operand mode changes in a price (this model's and the tuner's estimates)."""
    mode: str
    gemm_dtype: str        # whose multiply rate, tiles and slabs the GEMM stage runs at
    products: int          # tensor-core products per LCMA product (3 for the split)
    halves: int            # fp16 halves per operand element (slabs, accumulators, bytes)
    op_bytes: int          # bytes per stored Ã/B̃ element
    h_bytes: int           # bytes per element of the unfused H
    amax: bool             # one extra read of A and of B
    accumulators: int = 1  # fp32 accumulator tiles (with a per-slab epilogue: slab + running sum)
    slab_k: int = 0        # > 0: every k slab of this width ends in an fp32 epilogue on the CUDA
                           # cores after the wgmma wait (fp16x2: the add; fp8: the scaling)

    def slab_epilogue_factor(self, p, bk: int = 0) -> float:
        """GEMM-stage time multiplier of that epilogue: ~one fp32 op per output element per
        slab, serialized after the slab's products (2·bm·bn·bk tensor flops each), so
        1 + peak_mul / (products · bk · peak_add).  For fp8 on an H100 this is a little under
        what its GEMM stage costs against cuBLAS's FP8 (bench/experiments/cuda.md)."""
        if not self.slab_k:
            return 1.0
        bk = bk or self.slab_k
        return 1.0 + p.peak_mul(self.gemm_dtype) / (self.products * bk * p.peak_add("float32"))


@functools.lru_cache(maxsize=64)
def operand_terms(mode: str, d: str) -> OperandTerms:
    """The terms of operand ``mode`` for storage dtype ``d`` (a clear error for a mode that
    does not exist or does not apply to ``d``)."""
    if mode == "native":
        return OperandTerms(mode, d, 1, 1, ITEMSIZE[d], _out_bytes(d), False)
    if mode not in OPERAND_MODES:
        raise LcmacError(f"operands must be one of {OPERAND_MODES}, not {mode!r}")
    if mode == "fp16x2" and d not in ("float32", "tfloat32"):
        raise LcmacError(f"operands='fp16x2' splits float32 operands, not {d}")
    if mode == "fp8":
        if d not in ("bfloat16", "float16"):
            raise LcmacError(f"operands='fp8' quantizes bfloat16/float16 operands, not {d}")
        # E4M3 Ã/B̃ (+ a float32 scale per 128, 3% more bytes, left out); the block amax is
        # taken inside the combines (no extra pass); fp32 H
        return OperandTerms(mode, "float8_e4m3", 1, 1, 1, 4, False, accumulators=2, slab_k=128)
    if mode == "fp16x2":
        return OperandTerms(mode, "float16", 3, 2, 4, 4, True, accumulators=2, slab_k=64)
    return OperandTerms(mode, "float16", 1, 1, 2, 4, True)


def _epilogue(o: OperandTerms, p) -> float:
    """The per-slab epilogue in this model's GEMM stage: fp8's scaling.  fp16x2's adds are
    left out here: its GEMM's time against the fp16 GEMM's is closer to the bare 3 products
    than to the 3 products with the adds (bench/experiments/cuda.md; the tuner, ranking tiles
    of one mode, keeps the term)."""
    return o.slab_epilogue_factor(p) if o.mode == "fp8" else 1.0


# ---- public model -----------------------------------------------------------------------------
def _prep(M, N, K, dtype, profile):
    p = get_profile(profile) if not isinstance(profile, HardwareProfile) else profile
    d = p.check_dtype(dtype)
    for nm, v in (("M", M), ("N", N), ("K", K)):
        if not isinstance(v, int) or v < 1:
            raise ShapeError(f"{nm}={v!r} must be a positive integer")
    return p, d


def gemm_intensity(M: int, N: int, K: int, dtype: str) -> float:
    """Arithmetic intensity (FLOP/byte) of the plain GEMM's compulsory traffic."""
    d = normalize_model_dtype(dtype)
    return 2.0 * M * N * K / ((M * K + K * N) * ITEMSIZE[d] + M * N * _out_bytes(d))


def gemm_is_memory_bound(M: int, N: int, K: int, dtype, profile) -> bool:
    """Eq. 8: intensity below the ridge point → memory-bound → no LCMA can pay off."""
    p, d = _prep(M, N, K, dtype, profile)
    return gemm_intensity(M, N, K, d) < p.ridge(d)


def gemm_estimate(M: int, N: int, K: int, dtype, profile, *, operands: str = "native") -> Estimate:
    """The plain GEMM (one kernel, per-tile schedule).  ``operands`` (CUDA): with scaled fp16
    operands, an amax pass and a scaling (splitting) copy of A and of B come first, priced
    as the combine stages, and the GEMM stage runs on the fp16 rate (three products for
    "fp16x2")."""
    p, d = _prep(M, N, K, dtype, profile)
    o = operand_terms(operands, d)
    s, so = ITEMSIZE[d], _out_bytes(d)
    flops = 2.0 * M * N * K
    bw = p.achievable_bw()
    if o.mode == "native":
        nbytes = (M * K + K * N) * s + M * N * so
        ca = _none("combine_a", "plain GEMM")
        cb = _none("combine_b", "plain GEMM")
    else:
        nbytes = (M * K + K * N) * o.op_bytes + M * N * so
        # amax pass (one read, scaled fp16 only) + the scaling/quantizing pass (one read,
        # one write per half)
        reads = 2 if o.amax else 1
        ca = _roof("combine_a", 0.0, M * K * (reads * s + o.op_bytes), p.achievable_add(d), bw,
                   {"operands": o.mode, "amax_pass": o.amax})
        cb = _roof("combine_b", 0.0, K * N * (reads * s + o.op_bytes), p.achievable_add(d), bw,
                   {"operands": o.mode, "amax_pass": o.amax})
    tc, det = _gemm_compute(p, o.gemm_dtype, M, N, K, 1, 1, 1, "per-tile")
    tc *= o.products * _epilogue(o, p)
    if o.mode != "native":
        det = dict(det, operands=o.mode, tensor_core_products=o.products)
    tm = nbytes / bw
    g = StageCost("gemm", flops, nbytes, max(tc, tm), "compute" if tc >= tm else "memory",
                  MappingProxyType(det))
    stages = {"combine_a": ca, "combine_b": cb, "gemm": g,
              "combine_h": _none("combine_h", "plain GEMM")}
    kernels = 1 if o.mode == "native" else 5
    return Estimate("gemm", (1, 1, 1), 1, "gemm", MappingProxyType(stages),
                    kernels * p.launch_overhead_s, kernels)


def lcma_estimate(alg, M: int, N: int, K: int, dtype, profile, *, fused: bool = True,
                  group_parallel: bool = True, static_b: bool = False,
                  schedule: str | None = None, cse: bool = False,
                  operands: str = "native") -> Estimate:
    """Eq. 9 (``fused=False``) or Eq. 10 (``fused=True``) for one algorithm and shape.

    ``alg``: an ``Algorithm`` or its ``AlgQuantities`` (``quantities``/``compose_quantities``).

    ``group_parallel``: combines read each input block once and write all R outputs in one
    pass (else each output is its own sum, re-reading its inputs).  ``static_b``: B is a
    weight combined offline, so Combine B costs nothing at run time.  ``schedule``: the GEMM
    stage's wave schedule on GPUs (default split-group when fused, per-tile when unfused).
    ``operands`` (CUDA, unfused only): "fp16"/"fp16x2" add an amax read of A and of B, store
    Ã/B̃ as fp16 (two halves for "fp16x2", whose products cost three fp16 tensor-core
    products each) and H as fp32.
    """
    return lcma_estimates(alg, M, N, K, dtype, profile, variants=(fused,),
                          group_parallel=group_parallel, static_b=static_b, schedule=schedule,
                          cse=cse, operands=operands)[0]


def lcma_estimates(alg, M: int, N: int, K: int, dtype, profile, *,
                   variants: tuple[bool, ...] = (True, False), group_parallel: bool = True,
                   static_b: bool = False, schedule: str | None = None, cse: bool = False,
                   operands: str = "native") -> tuple[Estimate, ...]:
    """``lcma_estimate`` for each Combine-H variant in ``variants`` (``fused`` values), in
    that order: one pass, the combines of A and B (the same for every variant) priced once."""
    p, d = _prep(M, N, K, dtype, profile)
    o = operand_terms(operands, d)
    if o.mode != "native" and any(variants):
        raise LcmacError(f"operands={o.mode!r} runs on Algorithm 1 only (fused=False)")
    q = quantities(alg, cse)
    m, k, n = q.grid
    R = q.R
    s, so, sa = ITEMSIZE[d], _out_bytes(d), _acc_bytes(d)
    Mb, Kb, Nb = ceil(M / m), ceil(K / k), ceil(N / n)
    bw = p.achievable_bw()
    add = p.achievable_add(d)

    def combine(X, blk):
        if group_parallel:
            nbytes = (q.inputs[X] * s + q.materialized[X] * o.op_bytes) * blk
        else:
            nbytes = q.naive_bytes_units[X] * blk * s
        if o.amax:
            nbytes += q.inputs[X] * blk * s
        return _roof(f"combine_{X.lower()}", q.additions[X] * blk, nbytes, add, bw,
                     {"outputs_written": q.materialized[X], "inputs_read": q.inputs[X],
                      "group_parallel": group_parallel, "operands": o.mode})

    ca = combine("A", Mb * Kb)
    cb = _none("combine_b", "B static: combined offline") if static_b else combine("B", Kb * Nb)

    out = []
    for fused in variants:
        sched = schedule or ("split-group" if fused else "per-tile")
        tc, det = _gemm_compute(p, o.gemm_dtype, Mb, Nb, Kb, R, m, n, sched)
        tc *= o.products * _epilogue(o, p)
        gflops = 2.0 * R * Mb * Nb * Kb
        gbytes = (R * (Mb * Kb + Kb * Nb) * o.op_bytes
                  + (m * n * so if fused else R * o.h_bytes) * Mb * Nb)
        det = dict(det, products=R, block=[Mb, Kb, Nb])
        if o.mode != "native":
            det.update(operands=o.mode, tensor_core_products=o.products)

        if fused:
            # the epilogue accumulates each H tile into the C tiles it feeds
            acc_bytes = (2 * q.nnz["W"] - m * n) * Mb * Nb * sa
            if p.kind == "gpu":
                acc_bw = p.l2_bw
            else:
                c_bytes = m * n * Mb * Nb * sa
                acc_bw = p.l2_bw if (p.l3_bytes and c_bytes <= p.l3_bytes / 2) else bw
                # on a CPU the accumulation goes to DRAM: account it as DRAM traffic
            hidden = 1.0 - p.epilogue_overlap
            hadds = q.nnz["W"] * Mb * Nb
            th = hidden * max(acc_bytes / acc_bw, hadds / add)
            dram = acc_bytes if p.kind == "cpu" and acc_bw == bw else 0.0
            ch = StageCost("combine_h", hadds, dram, th, "memory", MappingProxyType({
                "fused": True, "accumulation_bytes": float(acc_bytes),
                "accumulated_in": "L2" if acc_bw == p.l2_bw else "DRAM",
                "hidden_fraction": p.epilogue_overlap}))
        else:
            blk = Mb * Nb
            reads = R if group_parallel else q.nnz["W"]
            ch = _roof("combine_h", q.additions["H"] * blk, (reads * o.h_bytes + m * n * so) * blk,
                       add, bw, {"fused": False, "group_parallel": group_parallel})
        tm = gbytes / bw
        g = StageCost("gemm", gflops, gbytes, max(tc, tm), "compute" if tc >= tm else "memory",
                      MappingProxyType(det))
        kernels = 1 + (0 if static_b else 1) + 1 + (0 if fused else 1) + (2 if o.amax else 0)
        stages = {"combine_a": ca, "combine_b": cb, "gemm": g, "combine_h": ch}
        out.append(Estimate(q.name, q.grid, R, "fused" if fused else "unfused",
                            MappingProxyType(stages), kernels * p.launch_overhead_s, kernels))
    return tuple(out)


def stage_table(alg, M: int, N: int, K: int, dtype, profile, **kw) -> dict:
    """Table II for one case: per stage flops, bytes, intensity, time (a plain dict).
    Additions come from CSE (``cse=True``) unless told otherwise."""
    kw.setdefault("cse", True)
    e = lcma_estimate(alg, M, N, K, dtype, profile, **kw)
    return {nm: e.stages[nm].to_dict() for nm in STAGES} | {
        "overhead_s": e.overhead_s, "total_s": e.time_s}
