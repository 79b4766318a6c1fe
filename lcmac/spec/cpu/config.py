"""Knobs of the CPU templates (x86 now, AArch64 later): register tile, cache blocks, path.

Pure Python (no compiler import): build.py, the manifest and the tuner use it.

    mr × nr   register tile of the micro-kernel: mr rows of Ã broadcast, nr columns of B̃
              (nr a multiple of the vector lanes); mr·nr/lanes accumulator registers
    mc, nc    a parallel task owns an mc × nc tile of every C block (FalconGEMM's (x, z))
    kc        k is walked in kc chunks (the B̃ micro-panel kc × nr stays in L1)
    ku        unroll of the k loop
    fused     True: Combine H fused into the GEMM epilogue (Algorithm 2); False: H_r stored,
              then a separate Combine H pass (Algorithm 1)
    bf16_dot  bfloat16 only, where the LLVM target has AVX512-BF16: True packs Ã/B̃ as bf16
              k pairs and multiplies with vdpbf16ps; False widens them to fp32 and uses FMAs.
              (On Sapphire Rapids one vdpbf16ps, 32 MACs, costs more than two fp32 FMAs of
              16 MACs each, so the bf16 GEMM runs slower on it (docs/cpu.md).  So the default
              is False and the tuner measures both for bfloat16.)
    amx       bfloat16 only, where the LLVM target has AMX-BF16 and AMX-TILE: the GEMM stage
              on Intel AMX tiles (``tdpbf16ps``), Ã/B̃ rounded to bf16 once when packed, fp32
              accumulation; needs mr = nr = 32 (four 16 × 16 fp32 C tiles) and walks k in
              steps of 32 (kc is rounded to a multiple of 32).  The default for bf16 builds
              whose mcpu has AMX (lcmac.artifact.build.build_config; docs/cpu.md).
    bands     0 packs A and B whole before the GEMM stage (the combine passes); b > 0 packs
              them cache block by cache block inside the parallel tasks, which are b row bands
              × the nc-wide column blocks (lcmac.schedules.cpu_gemm_blocked); an LCMA then
              sums its blocks as it packs (BLIS-Strassen's fused packing), one product after
              another.  The plain GEMM's default on AVX2; LCMAs take it only when asked (it
              measured slower there: docs/cpu.md)
    stream    Combine A / B write the packed Ã/B̃ with non-temporal stores (cpu_combine.STREAM_LL):
              no read for ownership of lines that leave the caches before the GEMM stage reads
              them; only worth it where the packed operands exceed the last-level cache (the
              default: on, for the AVX2 LCMAs whose packed operands do; docs/cpu.md)
    tiles_by_row
              True walks a block's register tiles row by row (``for ir: for jr``): the A
              micro-panel (mr × kc) stays in L1 while the kc × nc chunk of B, sized to half
              of L2, streams past it (BLIS's order for this kernel's shape).  False: column
              by column (``for jr: for ir``), reusing B's micro-panel (kc × nr), which only
              pays where it fits in L1 (the AVX2 kernel's 256 × 16; AVX-512's 512 × 64 is
              128 KB).  The default for the plain GEMM on AVX-512 float32 (docs/cpu.md)
    chunk_cols
              with tiles_by_row, c > 0 walks a task's columns c at a time (a multiple of nr),
              each chunk row tile by row tile (``for jo: for ir: for ji``), so that a task
              whose nc × kc of B outgrows L2 (an LCMA packed ahead: nc 1024 × kc 1024) still
              streams an L2-sized chunk past each A micro-panel; 0: all nc at once
    vendor_base
              float32/float64 LCMAs: the products run on the vendor BLAS bound at load time
              (cblas_sgemm/dgemm), lcmac's combines around them (lcmac.schedules.cpu_vendor);
              the other knobs are then unused.  Shapes must split evenly over the grid.
"""
from __future__ import annotations

import itertools
import os
from dataclasses import asdict, dataclass, fields

from lcmac.core.errors import DTypeError, TargetError
from lcmac.ir import catalogue
from lcmac.spec.profiles import profile_for_target

#: Generation of the CPU templates a tuned config was measured on (tuning logs stamp it; the
#: tuner and ``lcmac build`` ignore records of an older generation, whose timings describe
#: other code).  2: row tails write C directly, 6x4-vector AVX-512 default micro-tile;
#: 1: earlier.
SCHEDULE_VERSION = 2

#: knobs under which Ã/B̃ are not packed ahead in the compute type, so knob ``stream`` has
#: nothing to stream: off by default with them, refused beside them
PACKED_OTHERWISE = ("vendor_base", "bands", "amx", "bf16_dot")

#: knobs that a tuned record logged before they existed keeps at their field default (what
#: it measured), where others take today's default: its nc was cut for the other tile order
#: (a 1024-wide chunk of B walked row by row overflows L2 and runs slower)
AS_MEASURED = ("tiles_by_row",)

# bits of the *compute* type per lane: bf16 inputs are computed in fp32
_ITEM_BITS = {"float32": 32, "float64": 64, "bfloat16": 32}


@dataclass(frozen=True)
class CpuConfig:
    mr: int = 8
    nr: int = 32
    mc: int = 256
    nc: int = 512
    kc: int = 512
    ku: int = 4
    fused: bool = True
    bf16_dot: bool = False       # opt-in; measured slower on Sapphire Rapids (above)
    amx: bool = False            # opt-in; Intel AMX (above)
    vendor_base: bool = False    # the vendor BLAS as the base case (above)
    bands: int = 0               # 0 packs ahead; b > 0 packs per block in b row bands
    stream: bool = False         # packed operands written with non-temporal stores (above)
    tiles_by_row: bool = False   # register tiles walked row by row, A's micro-panel in L1 (above)
    chunk_cols: int = 0          # with tiles_by_row: columns walked this many at a time (above)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict | None) -> "CpuConfig":
        d = dict(d or {})
        known = {f.name for f in fields(cls)}
        extra = sorted(set(d) - known)
        if extra:
            raise ValueError(f"unknown CPU config knob(s) {', '.join(extra)}; known: {', '.join(sorted(known))}")
        return cls(**d)

    def validate(self, lanes: int) -> "CpuConfig":
        for nm in ("mr", "nr", "mc", "nc", "kc", "ku"):
            v = getattr(self, nm)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"config knob {nm}={v!r} must be a positive integer")
        if self.nr % lanes:
            raise ValueError(f"nr={self.nr} must be a multiple of the vector lanes ({lanes})")
        nv = self.nr // lanes
        if nv & (nv - 1):
            # measured: nr = 3 vectors compiles to lane-by-lane shuffles (20x slower), see
            # lcmac/data/tuning_logs/x86_64-avx512-float32.jsonl; refuse rather than build a slow kernel
            ok = ", ".join(str(lanes * 2 ** i) for i in range(4))
            raise ValueError(f"nr={self.nr} is {nv} vectors of {lanes} lanes; use a power-of-two "
                             f"number of vectors (nr in {ok}): other widths compile to "
                             f"lane-by-lane code, measured 20x slower")
        if not isinstance(self.bands, int) or isinstance(self.bands, bool) or self.bands < 0:
            raise ValueError(f"config knob bands={self.bands!r} must be a whole number ≥ 0 "
                             f"(0: operands packed ahead; b: b row bands packing per block)")
        flags = ("fused", "bf16_dot", "amx", "vendor_base", "stream", "tiles_by_row")
        if not all(isinstance(getattr(self, nm), bool) for nm in flags):
            raise ValueError(f"config knobs {', '.join(flags)} must be true or false")
        if not isinstance(self.chunk_cols, int) or isinstance(self.chunk_cols, bool) or self.chunk_cols < 0:
            raise ValueError(f"config knob chunk_cols={self.chunk_cols!r} must be a whole number ≥ 0")
        if self.chunk_cols and (not self.tiles_by_row or self.chunk_cols % self.nr):
            raise ValueError(f"config knob chunk_cols={self.chunk_cols} walks row tiles inside chunks of "
                             f"columns: it needs tiles_by_row true and a multiple of nr={self.nr}")
        if self.stream and any(getattr(self, k) for k in PACKED_OTHERWISE):
            raise ValueError("config knob stream is for the combine passes that pack Ã and B̃ "
                             "ahead in the compute type; vendor_base and bands pack otherwise, "
                             "amx and bf16_dot as bf16: drop stream")
        if self.vendor_base and (self.amx or self.bf16_dot):
            raise ValueError("config knob vendor_base runs the products on the vendor BLAS; "
                             "amx and bf16_dot select lcmac's own GEMM stage: set one")
        if self.amx:
            if self.bf16_dot:
                raise ValueError("config knobs amx and bf16_dot select two GEMM kernels; set one")
            if (self.mr, self.nr) != (32, 32):
                raise ValueError(f"the AMX kernel computes 32 x 32 tiles (four 16 x 16 AMX C "
                                 f"tiles): amx needs mr=32 and nr=32 (config mr={self.mr}, "
                                 f"nr={self.nr})")
            if self.kc % 32:
                raise ValueError(f"the AMX kernel walks k in steps of 32: amx needs kc a "
                                 f"multiple of 32 (config kc={self.kc})")
        if self.mc < self.mr or self.nc < self.nr:
            raise ValueError(f"mc ≥ mr and nc ≥ nr required (mc={self.mc}, mr={self.mr}, "
                             f"nc={self.nc}, nr={self.nr})")
        return self


def lanes_for(target, dtype: str) -> int:
    bits = getattr(target, "vector_bits", None) or 128
    if dtype not in _ITEM_BITS:
        raise DTypeError(f"the CPU templates do not handle dtype {dtype}")
    return max(1, bits // _ITEM_BITS[dtype])


def _registers(target) -> int:
    # AVX-512 and AArch64 have 32 vector registers, AVX2/SSE 16
    if getattr(target, "family", "x86") == "aarch64" or (getattr(target, "vector_bits", 0) or 0) >= 512:
        return 32
    return 16


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def tile_for_count(extent: int, unit: int, count: int) -> int:
    """The tile (a multiple of ``unit``) that cuts ``extent`` into ``count`` tiles with the
    least padding: how the templates cut a block (cpu_gemm.geometry)."""
    return _ceil(_ceil(max(extent, 1), count), unit) * unit


def default_threads() -> int:
    """Worker threads the runtime will use (TVM's pool reads ``TVM_NUM_THREADS``, else one
    per core): the default blocking balances its tasks over this many."""
    try:
        n = int(os.environ.get("TVM_NUM_THREADS") or 0)
    except ValueError:
        n = 0
    return n if n > 0 else (os.cpu_count() or 1)


def _balanced_tiles(BM: int, BN: int, mr: int, nr: int, mc: int, nc: int,
                    threads: int) -> tuple[int, int]:
    """(mc, nc) near the wanted sizes whose task count (tiles of a C block) keeps every thread
    busy: a multiple of ``threads``, or at least 8 per thread (then the last round wastes at
    most 1/8): on two cores an odd task count leaves one core idle for the last round
    (bench/experiments/cpu.md).  Among the balanced
    choices: least padding (in 2% steps), then fewest tasks."""
    best = None
    cm0, cn0 = _ceil(BM, mc), _ceil(BN, nc)
    for cm in range(cm0, cm0 + 8 * threads + 1):
        tm = tile_for_count(BM, mr, cm)
        for cn in range(cn0, cn0 + 8 * threads + 1):
            tn = tile_for_count(BN, nr, cn)
            tasks = cm * cn
            if tasks % threads and tasks < 8 * threads:
                continue
            waste = (tm * cm) * (tn * cn) / (BM * BN) - 1
            key = (int(waste / 0.02), tasks)        # padding in 2% steps, then fewer tasks
            if best is None or key < best[0]:
                best = (key, tm, tn)
            break           # more column tiles only add tasks
    if best is None:
        return mc, nc
    return best[1], best[2]


def _band_tile(M: int, mr: int, bands: int, want: int) -> int:
    """mc for a plain GEMM packing per block in ``bands`` row bands: the block count a multiple
    of ``bands`` (equal bands), the least padded rows (computed, never stored: at 4096 rows
    mc = 192 pads 128 rows, 3 % of the flops; mc = 228 pads 8), then the mc nearest ``want``;
    within ±25 % of ``want``, where the A chunk (mc × kc) stays in L2."""
    best = None
    for mc in range(max(mr, want * 3 // 4 // mr * mr), want * 5 // 4 + 1, mr):
        count = -(-M // mc)
        count += -count % max(1, bands)
        tile = tile_for_count(M, mr, count)
        key = (tile * count - M, abs(tile - want))
        if best is None or key < best[0]:
            best = (key, tile)
    return best[1] if best else want


def default_config(target, dtype: str = "float32", algorithm=None, shape=None,
                   threads: int | None = None) -> CpuConfig:
    """Defaults per target.  An accumulator tile that fills most of the register file; cache
    blocks chosen by measurement on a 2-core Sapphire Rapids VM (bench/experiments/cpu.md).

    AVX-512: 6 × 4 vectors (24 accumulators, 4 B̃ loads and 6 broadcasts per 24 FMAs) with
    large blocks (mc ≈ 1000, nc ≈ 2048, kc = 512), faster than 8 × 2 vectors with 256 × 512
    blocks.  Given ``shape`` = (M, N, K), mc and nc are
    cut so the parallel tasks divide over ``threads`` (default: ``default_threads()``), and
    float32 packs per block (``bands``, below) except for LCMAs that sum many blocks.

    For an LCMA a long kc matters most, since the fused epilogue updates every C block a
    product feeds once per kc chunk."""
    lanes = lanes_for(target, dtype)
    lcma = algorithm is not None and getattr(algorithm, "R", 1) > 1
    # Fused Combine H keeps a task's tile of every C block cache-resident only while there
    # are few C blocks; with many (strassen^2: 16) the fused epilogue's C traffic costs more
    # than storing H once (docs/cpu.md).
    fused = not lcma or algorithm.m * algorithm.n <= 4
    if _registers(target) >= 32 and getattr(target, "family", "x86") == "x86":
        mr, nr, mc, nc = 6, 4 * lanes, 1008, 2048
        if shape is None:
            return CpuConfig(mr=mr, nr=nr, mc=mc, nc=nc, kc=512, ku=4, fused=fused)
        M, N, _ = shape
        m, n = (algorithm.m, algorithm.n) if lcma else (1, 1)
        BM, BN = -(-M // m), -(-N // n)          # a block of C
        threads = threads or default_threads()
        mc, nc = _balanced_tiles(BM, BN, mr, nr, mc, nc, threads)
        if dtype != "float32":
            return CpuConfig(mr=mr, nr=nr, mc=mc, nc=nc, kc=512, ku=4, fused=fused)
        # float32 packs per block in one row band per thread, one-level LCMAs too (their sums
        # fused into the packing), with the k loop unrolled 8 deep and, for an LCMA, whole
        # 1024-deep k chunks: faster than packing ahead without streaming for the GEMM and
        # Strassen (bench/experiments/cpu.md). LCMAs whose products sum more
        # than two blocks (Strassen², Winograd²) pack ahead again, streamed
        # (``_sums_many_blocks``). kc 1024 for the plain GEMM was no faster and its
        # error larger (a longer sum in registers). Packed per block, one level stores H
        # and combines it after where its C blocks are large (2048² and more: storing H once
        # beats the fused epilogue's C traffic; Winograd's Combine H has its shared sums);
        # below, fused stays ahead.
        knobs = banded(algorithm, shape, mr, mc, threads)
        if lcma and _sums_many_blocks(algorithm) and _packed_bytes(dtype, algorithm, shape) <= AHEAD_MAX_BYTES:
            knobs.update(bands=0, stream=True)
        if not lcma:
            # the plain GEMM walks its tiles row by row over an L2-sized B chunk
            # (``_l2_chunk_cols``), faster at every benchmark shape; the LCMAs measured no
            # faster so (docs/cpu.md)
            knobs.update(tiles_by_row=True, nc=_l2_chunk_cols(target, BN, nr, 512, dtype))
        return CpuConfig(**{"mr": mr, "nr": nr, "nc": nc, "kc": 1024 if lcma else 512, "ku": 8,
                            "fused": fused and BM * BN < 2048 * 2048, **knobs})
    if _registers(target) >= 32:
        return CpuConfig(mr=8, nr=2 * lanes, mc=256, nc=512, kc=1024 if lcma else 512, ku=4,
                         fused=fused)
    # 16 registers: 6 × 2 vectors = 12 accumulators + 2 B + 1 broadcast (the classic AVX2 kernel).
    # Blocks from a short sweep of configs on a 2-core AMD EPYC (AVX2) VM, where kc=512 did
    # not help LCMAs (unlike AVX-512; bench/experiments/cpu.md).
    # The plain GEMM packs per cache block in one row band per thread (cpu_gemm_blocked):
    # faster than packing ahead on that VM (docs/cpu.md)
    bands = 0 if lcma or getattr(target, "family", "x86") != "x86" else (threads or default_threads())
    mc = _band_tile(shape[0], 6, bands, 192) if bands and shape is not None else 192
    stream = lcma and shape is not None and _packed_exceeds_llc(target, dtype, algorithm, shape)
    return CpuConfig(mr=6, nr=2 * lanes, mc=mc, nc=1024, kc=256, ku=4, fused=fused, bands=bands,
                     stream=stream)


def _l2_chunk_cols(target, BN: int, nr: int, kc: int, dtype: str) -> int:
    """nc for tiles walked row by row (knob ``tiles_by_row``): the kc × nc chunk of B that
    every A micro-panel streams past takes at most half of the target's L2 (the other half
    for the A micro-panels and C's tiles passing through); among the tile counts from the
    fewest that fit up to twice as many, the least padded (so the chunk tiles B's columns
    exactly where it can: 512 at 4096 columns, 7168, 3072, 1536 and 2048)."""
    l2 = _cache_bytes(target, "l2_bytes") or 2 ** 20
    want = max(nr, l2 // 2 // (kc * _ITEM_BITS[dtype] // 8) // nr * nr)
    fewest = _ceil(BN, want)
    best = min(range(fewest, 2 * fewest + 1), key=lambda c: (tile_for_count(BN, nr, c) * c - BN, c))
    return tile_for_count(BN, nr, best)


def _sums_many_blocks(alg) -> bool:
    """Whether an LCMA's products sum more than two blocks of B on average (Strassen²: 2.9,
    Winograd²: 4; Strassen: 1.7, Winograd: 2).  Packed per block, each such sum reads every
    block of B that many times, and of A alike; combined ahead, the group-parallel combines
    read A and B once and stream Ã and B̃ out.  On AVX-512 two levels packed ahead, streamed,
    beat packing per block at every shape measured, while one level gained nothing, so it
    stays per block (bench/experiments/cpu.md)."""
    nnz = getattr(alg, "nnz", None)
    return nnz is not None and nnz()["V"] > 2 * alg.R


#: the most packed Ã + B̃ (bytes) an AVX-512 float32 LCMA that sums many blocks packs ahead;
#: beyond, per block.  Strassen² packs ahead faster at 4096³ (392 MB) and per block faster at
#: 8192³ (1.57 GB), which also needs less workspace (bench/experiments/cpu.md); the bound
#: lies between the two, untested in between
AHEAD_MAX_BYTES = 512 * 2 ** 20


def _packed_bytes(dtype: str, alg, shape) -> int:
    """What an LCMA's packed Ã and B̃ take: R products' blocks of each."""
    M, N, K = shape
    bm, bk, bn = -(-M // alg.m), -(-K // alg.k), -(-N // alg.n)
    return alg.R * (bm * bk + bk * bn) * _ITEM_BITS[dtype] // 8


def _packed_exceeds_llc(target, dtype: str, alg, shape) -> bool:
    """Whether an LCMA's packed Ã and B̃ (R products' blocks) outgrow the target's last-level
    cache, where streaming them out (knob ``stream``) saves the reads for ownership without
    pushing out lines the GEMM stage would have found (Strassen²'s combines on the AVX2 VM,
    docs/cpu.md)."""
    llc = _cache_bytes(target, "l3_bytes")
    return bool(llc) and _packed_bytes(dtype, alg, shape) > llc


def _cache_bytes(target, level: str) -> int:
    """The target profile's cache size ``level`` ("l2_bytes": per core, "l3_bytes"); 0 for a
    target without a profile (no cache size to weigh against)."""
    try:
        return getattr(profile_for_target(target), level) or 0
    except TargetError:
        return 0


def config_space(target, dtype: str, shape, algorithm=None) -> list[CpuConfig]:
    """Candidate configs a tuner may measure for ``shape`` = (M, N, K): the default first, then
    its one-knob variants (``ConfigSpace.named`` in all), then a grid of tiles and blocks."""
    lanes = lanes_for(target, dtype)
    regs = _registers(target)
    if isinstance(algorithm, str) and algorithm != "gemm":
        algorithm = catalogue.get(algorithm)
    alg = algorithm if not isinstance(algorithm, str) else None
    base = default_config(target, dtype, alg, shape=shape)
    out = [base]
    tiles = []
    # nr = 3 vectors (48 fp32 columns) measured 8-15x slower than nr = 32 at every LLM shape
    # tried (lcmac/data/tuning_logs/x86_64-avx512-float32.jsonl, M=512): left out of the space
    for mr, nv in itertools.product((4, 6, 8, 12, 14), (1, 2, 4)):
        acc = mr * nv
        if acc + nv + 1 <= regs and acc >= regs // 3:
            tiles.append((mr, nv * lanes))
    if dtype == "bfloat16":        # only targets with AVX512-BF16 compile it differently
        # (the bf16 pairs vdpbf16ps reads are not streamed)
        out.append(CpuConfig(**{**base.to_dict(), "bf16_dot": not base.bf16_dot, "stream": False}))
    if alg is not None and getattr(alg, "R", 1) > 1 and not base.amx:
        out.append(CpuConfig(**{**base.to_dict(), "stream": not base.stream}))
    if shape is not None and lanes * _ITEM_BITS[dtype] >= 512 and not base.amx:
        # the other tile order (knob tiles_by_row), with the chunk of B each order wants
        BN = _ceil(shape[1], alg.n if alg is not None else 1)
        nc = tile_for_count(BN, base.nr, _ceil(BN, 2048)) if base.tiles_by_row else \
            _l2_chunk_cols(target, BN, base.nr, base.kc, dtype)
        out.append(CpuConfig(**{**base.to_dict(), "tiles_by_row": not base.tiles_by_row, "nc": nc,
                                "chunk_cols": 0}))
        chunk = None if base.bands or base.tiles_by_row else _l2_chunk_cols(target, base.nc, base.nr, base.kc, dtype)
        if chunk is not None and chunk < base.nc:
            # packed ahead with a task's B wider than L2: its columns in L2-sized chunks, row by
            # row (it helped Winograd² but not Strassen² or dps-4x4x4-r48,
            # bench/experiments/cpu.md), so the tuner's to try, not a default
            out.append(CpuConfig(**{**base.to_dict(), "tiles_by_row": True, "chunk_cols": chunk}))
    # packing ahead or per block (an LCMA's combination fused into the packing)
    if base.bands:
        out.append(CpuConfig(**{**base.to_dict(), "bands": 0}))
    elif dtype != "bfloat16" and not base.vendor_base:    # bf16 keeps packing ahead
        out.append(CpuConfig(**{**base.to_dict(), **banded(alg, shape, base.mr, base.mc, default_threads()),
                                "stream": False}))
    if (alg is not None and dtype in ("float32", "float64") and shape is not None
            and getattr(target, "family", "x86") == "x86"):
        M, N, K = shape           # the vendor-BLAS base case, where the shape splits evenly
        m, k, n = alg.grid
        if not (M % m or K % k or N % n or (K // k) % lanes or (N // n) % lanes):
            out.append(CpuConfig(**{**base.to_dict(), "vendor_base": True, "stream": False, "bands": 0}))
    named = len(out)
    fused_opts = (True,) if alg is None else (True, False)
    # kc up to 1024: an LCMA's fused epilogue runs once per kc chunk (default_config's note)
    for (mr, nr), mc, nc, kc, ku, fu in itertools.product(
            tiles, (32, 64, 128, 256, 512, 1024), (256, 512, 1024, 2048), (64, 128, 256, 512, 1024), (2, 4, 8),
            fused_opts):
        if mc < mr or nc < nr:
            continue
        c = CpuConfig(mr=mr, nr=nr, mc=mc - mc % mr or mr, nc=nc - nc % nr, kc=kc, ku=ku, fused=fu)
        if c not in out:
            out.append(c)
    return ConfigSpace(out, named)


class ConfigSpace(list):
    """``config_space``'s configs: the default and its one-knob variants first (``named`` of
    them, which the tuner measures before the grid: lcmac.tune.space), then the grid."""

    def __init__(self, configs, named: int):
        super().__init__(configs)
        self.named = named


def banded(alg, shape, mr: int, mc: int, bands: int) -> dict:
    """Knobs for packing per block in ``bands`` row bands: ``bands`` and an mc that splits a
    block's rows evenly over them (``_band_tile``; ``mc`` where the shape is not known)."""
    if shape is None:
        return {"bands": bands}
    block_rows = -(-shape[0] // (alg.m if alg is not None else 1))
    return {"bands": bands, "mc": _band_tile(block_rows, mr, bands, mc)}


def amx_defaults(algorithm=None) -> dict:
    """The AMX kernel's knobs where a config asks for ``amx`` but names none of them (and a bf16
    build for a CPU with AMX asks for it by default, ``artifact.build``): the blocks that
    measured best in a coarse sweep on a 16-core Xeon at 4096³ (docs/cpu.md): mc 256, nc 256,
    kc 1024; mc 128 for an LCMA of more than 4 C blocks (Strassen², whose H is stored)."""
    many = algorithm is not None and getattr(algorithm, "m", 1) * getattr(algorithm, "n", 1) > 4
    return {"amx": True, "mr": 32, "nr": 32, "mc": 128 if many else 256, "nc": 256, "kc": 1024}


def resolve_config(target, dtype: str, config, algorithm=None, shape=None) -> CpuConfig:
    """A validated CpuConfig: ``config`` (dict: knobs over the defaults, or CpuConfig) or
    the defaults for ``algorithm`` and ``shape``."""
    if config is None:
        cfg = default_config(target, dtype, algorithm, shape=shape)
    elif isinstance(config, CpuConfig):
        cfg = config
    elif isinstance(config, dict):
        base = default_config(target, dtype, algorithm, shape=shape).to_dict()
        if config.get("amx"):
            # the AMX kernel's tile and blocks, unless given (the FMA kernel's blocks ran it
            # slower: bench/experiments/cpu.md)
            base.update({k: v for k, v in amx_defaults(algorithm).items() if k != "amx"})
        packed_otherwise = {k for k in PACKED_OTHERWISE if config.get(k)}
        if packed_otherwise:
            base["stream"] = False          # a default for the packing ahead those replace
        if packed_otherwise - {"bands"}:
            base["bands"] = 0               # a default for the fp32 packing those replace
        if config.get("bands") and "mc" not in config:
            # equal bands, few padded rows (the default mc was cut for the default bands)
            base.update(banded(algorithm, shape, config.get("mr", base["mr"]), base["mc"], config["bands"]))
        base.update(config)
        cfg = CpuConfig.from_dict(base)
    else:
        raise TargetError(f"config must be a dict or CpuConfig, got {type(config).__name__}")
    if cfg.amx and dtype != "bfloat16":
        raise DTypeError(f"config knob amx (Intel AMX tdpbf16ps) is for bfloat16; this build is {dtype}")
    return cfg.validate(lanes_for(target, dtype))
