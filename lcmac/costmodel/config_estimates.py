"""What one schedule config costs: the per-config time estimate and on-chip fit check that
the tuner ranks its search space with (``lcmac.tune.space`` enumerates the configs).

A config is read as its canonical dict (``knobs``): the field names of the backend's config
class (``CpuConfig``: mr, nr, mc, nc, kc, …; ``CudaConfig``: block_m/n/k, stages, threads,
fused, operands, …).  A dict may name only some knobs; the estimate's own priors stand in
for the others.

- **Fit** (``fit_check``): ``waves.onchip_fit`` (registers for the accumulators, L1/L2 on
  CPUs, shared memory on GPUs), plus a check that a CPU's packed B panel (kc×nc) fits the
  last-level cache and that a GPU's threads and registers allow one CTA per SM.
- **Time** (``estimate``), in the spirit of Triton's ``matmul_perf_model.estimate_matmul_time``
  (written anew here):

  - GPU: output tiles → waves over the SMs (``wave_analysis``; the batched GEMM's R × tiles
    grid, the fused kernel's whole groups, or split groups), the compute time of a wave at
    the profile's matrix peak scaled by the tile efficiency, software-pipelining depth,
    resident consumer warpgroups (shared memory, registers), the wgmma width of the
    full-row warp split and the k slab's row length; bytes from DRAM with L2 reuse across
    the CTAs of a wave (A re-read once per column of CTAs, at L2 speed after the first);
    time = a smooth max (3-norm) of compute and loads + the store of C.  CUDA float32 is
    priced as TF32 (``model_dtype``).  How well this ranks the configs of a space is in
    bench/experiments/tuning.md.
  - CPU (Goto/BLIS blocking): the micro-kernel's FMA throughput from its register tile
    (accumulators vs. the FMA latency × ports, loads+broadcasts per k step), parallel
    balance of the outer blocks over the cores (CPU "waves"), padding waste of blocks
    that do not divide the shape, and memory traffic at each level (A re-packed once per
    nc block, B panels re-read from the L3 once per mc block, C read/written once per
    kc block); time = max(compute, DRAM, L3) + packing.
  - An LCMA adds its combine stages (bytes / bandwidth of Combine A/B/H; with the fused
    Combine H on a GPU the read-modify-write epilogue instead, ``combine_time``) to R
    products of the (M/m)×(N/n)×(K/k) sub-GEMM estimated as above.

  The estimate is a prior for ordering measurements, not a prediction to trust: the tuner
  measures the top of its list and the measurements decide.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from lcmac.core.dtypes import ITEMSIZE, normalize_dtype, normalize_model_dtype
from lcmac.ir import catalogue
from lcmac.spec.cuda.blocking import Blocking
from lcmac.spec.cuda.config import CudaConfig
from lcmac.spec.cuda.smem import persistent_tile_bytes
from lcmac.spec.cuda.support import arch_why
from lcmac.spec.cuda.views import side_read_in_place, view_sides
from lcmac.spec.targets import get_target, schedule_family
from lcmac.spec.profiles import get_profile, profile_for_target
from lcmac.costmodel.stages import operand_terms, quantities
from lcmac.costmodel.waves import onchip_fit, wave_analysis

GEMM = "gemm"


# ---- reading a case ------------------------------------------------------------------------
def knobs(config) -> dict:
    """A config (the backend's config object, a dataclass, or a dict) as its canonical dict."""
    if config is None:
        return {}
    if isinstance(config, dict):
        return {str(k): v for k, v in config.items()}
    if hasattr(config, "to_dict"):
        return dict(config.to_dict())
    if dataclasses.is_dataclass(config):
        return dataclasses.asdict(config)
    raise TypeError(f"a config must be a dict or a config dataclass, not {type(config).__name__}")


def target_profile(target, profile=None):
    """The hardware profile to price ``target`` with: ``profile`` (a name or a profile) when
    given, else the target's own."""
    return get_profile(profile) if profile is not None else profile_for_target(target)


def target_object(target):
    """The ``lcmac.spec.target_table.Target`` for a name (its arch, vector width, family…); the name
    itself when it is no target (a bare profile name)."""
    if not isinstance(target, str):
        return target
    try:
        return get_target(target)
    except Exception:  # noqa: BLE001 - a profile name given as a target
        return target


def algorithm_of(name):
    """None for the plain GEMM, else the catalogue algorithm (an ``Algorithm`` passes)."""
    if name in (None, GEMM):
        return None
    return catalogue.get(name) if isinstance(name, str) else name


def model_dtype(target, dtype, operands: str = "native") -> str:
    """The dtype the cost model should price: the CUDA backend multiplies native float32
    operands on the TF32 tensor cores (fp32 accumulation), so its float32 is the model's
    ``tfloat32``; every other case, the scaled operand modes included (``operands``), is the
    dtype itself."""
    d = normalize_model_dtype(dtype)
    cuda = schedule_family(target) == "cuda"
    return "tfloat32" if d == "float32" and operands == "native" and cuda else d


def itemsize(dtype) -> int:
    return ITEMSIZE[normalize_model_dtype(dtype)]


def cdiv(a, b) -> int:
    return -(-int(a) // int(b))


def operand_terms_of(f: dict, dtype):
    """The cost model's terms (``stages.operand_terms``: GEMM-stage dtype, tensor-core
    products, fp16 halves, operand and H bytes) of a CUDA config's operand mode
    (CudaConfig.operands; absent = native)."""
    return operand_terms(f.get("operands") or "native", normalize_model_dtype(dtype))


def default_block_k(f: dict, dtype) -> int:
    """CudaConfig's k slab for block_k = 0: 32 for 4-byte operands, 64 for 2-byte ones —
    of the operands the GEMM stage reads (fp16 with a scaled operand mode)."""
    ops = operand_terms_of(f, dtype)
    if ops.mode == "fp8":
        return ops.slab_k                   # one scale block per k slab
    return 32 if itemsize(ops.gemm_dtype) >= 4 else 64


def cuda_config_of(f: dict) -> CudaConfig:
    """The CudaConfig the knob dict ``f`` spells (its other keys dropped)."""
    known = {x.name for x in dataclasses.fields(CudaConfig)}
    return CudaConfig(**{k: v for k, v in f.items() if k in known})


# ---- fit -----------------------------------------------------------------------------------
@dataclass
class Fit:
    fits: bool
    reason: str = ""
    detail: dict = field(default_factory=dict)


#: dynamic shared memory one CTA may use (the SM has a little more): 227 KiB on Hopper
GPU_SMEM_PER_CTA = {"h100": 227 * 1024, "h200": 227 * 1024, "h20": 227 * 1024, "a100": 163 * 1024}


def fit_check(target, dtype, config, profile=None) -> Fit:
    """Does ``config`` fit on chip?  ``waves.onchip_fit`` plus the last-level-cache, thread
    and register checks of the module doc."""
    p = target_profile(target, profile)
    f = knobs(config)
    detail: dict = {}
    if p.kind == "gpu" or schedule_family(target) == "cuda":
        reasons = _cuda_misfits(target, dtype, f, p, detail)
    else:
        reasons = _cpu_misfits(dtype, f, p, detail)
    return Fit(not reasons, "; ".join(reasons), detail)


def _cuda_misfits(target, dtype, f: dict, p, detail: dict) -> list[str]:
    reasons = []
    need = ("block_m", "block_n", "block_k")
    ops = operand_terms_of(f, dtype)
    if all(k in f for k in need):
        f = dict(f)
        if not int(f["block_k"]):  # CudaConfig's 0 = the dtype's default k slab
            f["block_k"] = default_block_k(f, dtype)
        # lcmac's TileLang templates write C from the accumulator registers (no shared-
        # memory staging of the C tile): only the pipeline's A/B slabs live in shared memory
        r = onchip_fit(p, ops.gemm_dtype, {**f, "stages": f.get("stages", 3), "epilogue_smem": False})
        detail.update(r.to_dict())
        smem = r.onchip_bytes * ops.halves          # fp16x2: hi and lo slabs
        # an output tile beside a pipeline that never drains (schedules.cuda.config decides which)
        smem += persistent_tile_bytes(cuda_config_of(f), normalize_dtype(dtype))
        limit = GPU_SMEM_PER_CTA.get(p.name, p.onchip_per_unit)
        if not r.fits:
            reasons.append(r.reason)
        elif smem > limit:
            reasons.append(f"shared memory {smem} B > {limit} B per CTA")
    arch = getattr(target_object(target), "arch", None)   # none on a bare profile name
    why = arch_why(cuda_config_of(f), normalize_dtype(dtype), arch) if arch else None
    if why:
        reasons.append(f"not built for this target: {why}")
    th = int(f.get("threads", 128))
    if th > 1024 or th % 32:
        reasons.append(f"{th} threads per CTA (must be a multiple of 32, at most 1024)")
    elif all(k in f for k in need):
        # registers: 65536 32-bit registers per SM, at most 255 per thread
        # fp32 accumulators per thread (fp16x2: the accumulator and the slice fragment)
        acc_regs = int(f["block_m"]) * int(f["block_n"]) // th * ops.accumulators
        if acc_regs > 224:
            reasons.append(f"{acc_regs} accumulator registers per thread > 224 "
                           f"({f['block_m']}x{f['block_n']} tile on {th} threads)")
    return reasons


def _cpu_misfits(dtype, f: dict, p, detail: dict) -> list[str]:
    reasons = []
    if any(k in f for k in ("mr", "nr", "kc", "mc")):
        r = onchip_fit(p, dtype, f)
        detail.update(r.to_dict())
        if not r.fits:
            reasons.append(r.reason)
    if "kc" in f and "nc" in f and p.l3_bytes:
        panel = int(f["kc"]) * int(f["nc"]) * itemsize(dtype)
        detail["l3_bytes"] = panel
        if panel > p.l3_bytes:
            reasons.append(f"B panel kc×nc {panel} B > {p.l3_bytes} B of last-level cache")
    return reasons


# ---- time ----------------------------------------------------------------------------------
def estimate_gemm_cpu(M, N, K, dtype, p, f: dict) -> dict:
    """Goto/BLIS-blocked M×N×K product on a CPU with the blocking of ``f`` (module doc)."""
    s = itemsize(dtype)
    lanes = max(1, (p.vector_bits or 512) // (8 * s))
    mr, nr = int(f.get("mr", 8)), int(f.get("nr", 32))
    mc, nc, kc = int(f.get("mc", 64)), int(f.get("nc", 1024)), int(f.get("kc", 128))
    mc, nc, kc = min(mc, M) or 1, min(nc, N) or 1, min(kc, K) or 1
    # micro-kernel: per k step, mr·nr/lanes FMAs (2 ports), nr/lanes loads + mr broadcasts
    # (2 load ports); each accumulator is a dependency chain of 4-cycle FMAs.
    n_acc = max(1.0, mr * nr / lanes)
    n_ld = nr / lanes + mr
    cycles = max(n_acc / 2, n_ld / 2, 4.0)
    if n_acc > 28:                         # spills: 32 vector registers, some for operands
        cycles *= 1.5 + (n_acc - 28) / 28
    mk_eff = (n_acc / 2) / cycles
    # padding waste: the loops run over whole micro-tiles / blocks
    pad = (cdiv(M, mr) * mr / M) * (cdiv(N, nr) * nr / N)
    # parallel balance: outer (mc × nc) blocks spread over the cores
    tasks = cdiv(M, mc) * cdiv(N, nc)
    par = tasks / (cdiv(tasks, p.units) * p.units)
    peak = p.peak_mul(dtype) * p.gemm_eff(dtype) / 0.85 if p.kind == "cpu" else p.peak_mul(dtype)
    flops = 2.0 * M * N * K
    t_compute = flops * pad / (peak * min(1.0, mk_eff) * par)
    # memory traffic
    dram = s * (M * K * cdiv(N, nc) + K * N + 2 * M * N * cdiv(K, kc))
    bw = p.achievable_bw()
    t_mem = dram / bw
    # every mc block of rows re-reads the task's kc×nc B̃ panel: from L2 when it fits there,
    # from the LLC while it fits in a core's share, else from DRAM (a panel that overflows
    # the caches slows the whole block, bench/experiments/cpu.md)
    l3 = s * K * N * cdiv(M, mc)
    panel = s * kc * nc
    fast = p.l2_bw or 4 * p.mem_bw
    if panel <= 0.5 * (p.l2_bytes or 0):
        panel_bw = fast
    elif panel <= 0.5 * (p.l3_bytes or 0) / max(1, p.units):
        panel_bw = 0.5 * fast
    else:
        panel_bw = bw
    t_l3 = l3 / panel_bw
    # packing: A once per nc block, B once — read + write at bandwidth, not overlapped
    t_pack = 2 * s * (M * K * cdiv(N, nc) + K * N) / bw / p.units * 0.5
    # loop overhead of tiny kc blocks (micro-kernel prologue/epilogue per kc)
    t_ovh = cdiv(M, mr) * cdiv(N, nr) * cdiv(K, kc) * 40 / 2.5e9 / p.units
    # a panel streamed from DRAM stalls the micro-kernel (its loads are not prefetched far
    # enough ahead to hide DRAM latency): not overlapped with the FMAs
    stall = t_l3 if panel_bw is bw else 0.0
    total = max(t_compute, t_mem, t_l3 - stall) + stall + t_pack + t_ovh + p.launch_overhead_s
    return {"time_s": total, "compute_s": t_compute, "dram_s": t_mem, "l3_s": t_l3,
            "pack_s": t_pack, "microkernel_eff": mk_eff, "parallel_eff": par, "padding": pad,
            "dram_bytes": dram}


_STAGE_EFF = {1: 0.45, 2: 0.8, 3: 0.95, 4: 1.0, 5: 1.0, 6: 0.99, 7: 0.98}
#: a one-tile CTA's pipeline fill and drain, per wave of tiles (what a persistent grid saves
#: on an H100, bench/experiments/cuda.md)
GRID_TILE_START_S = 1.7e-6


def estimate_gemm_gpu(M, N, K, dtype, p, f: dict, *, batch: int = 1, schedule="per-tile",
                      out_bytes: int | None = None) -> dict:
    """Triton-style estimate of ``batch`` independent M×N×K products on a GPU.

    Per-config efficiency factors (priors, not fitted to the tuning logs): the output tile's
    relative efficiency (profile table), the pipeline depth, CTAs per SM (occupancy), the
    number of consumer warpgroups (one warpgroup cannot overlap its wgmma issue with another's
    epilogue; a warpgroup owning fewer than 64 rows cannot issue full m64 wgmma), accumulator
    registers per thread, and the k slab's row length (< 128 B: more barriers per flop)."""
    ops = operand_terms_of(f, dtype)
    bk = int(f.get("block_k", 64)) or default_block_k(f, dtype)
    dtype = ops.gemm_dtype
    halves = ops.halves
    s = itemsize(dtype)
    bm, bn = int(f.get("block_m", 128)), int(f.get("block_n", 128))
    stages = int(f.get("stages", 3))
    threads = int(f.get("threads", 128))
    wa = wave_analysis(M, N, units=p.units, tile=(bm, bn), R=batch)
    waves = wa.waves(schedule)
    # occupancy: CTAs per SM by shared memory (pipeline slabs only: C leaves from registers)
    # and threads (a producer warpgroup is added on Hopper)
    smem = stages * (bm + bn) * bk * s * halves
    acc = bm * bn // threads * ops.accumulators
    regs = threads * (acc + 40) + 128 * 40   # consumers: accumulators + ~40; producer ~40
    ctas = max(1, min(p.onchip_per_unit // max(smem, 1), 2048 // (threads + 128), 65536 // regs))
    wgs = max(1, threads // 128)
    # latency hiding: consumer warpgroups resident per SM (one alone stalls on its own wgmma)
    occ = min(1.0, 0.85 + 0.15 * (ctas * wgs - 1))
    te = dict(p.tile_efficiency)
    tile_eff = te.get((bm, bn), te.get((bn, bm), 0.9 * min(1.0, bm * bn / (128 * 256)) ** 0.25))
    warp_eff = 1.0 if acc <= 128 else 0.9   # ≥ 128 fp32 accumulators per thread: pressure
    wg_eff = 1.0
    if s <= 2:  # 2-byte types: full-row warp split, each warpgroup issues m64·n=block_n wgmma
        if bm // wgs < 64:                  # below one m64 wgmma per warpgroup
            wg_eff *= 0.8
        wg_eff *= {256: 1.0, 128: 0.93}.get(bn, 0.85)  # m64n256 beat 2× m64n128
    k_eff = min(1.0, (bk * s) / 128)  # < 128 B per row of the k slab: more barriers per flop
    per_sm = p.peak_mul(dtype) * p.gemm_eff(dtype) / p.units
    tile_t = 2.0 * bm * bn * K / (per_sm * tile_eff * _STAGE_EFF.get(stages, 0.97) * occ
                                  * warp_eff * wg_eff * (0.7 + 0.3 * k_eff))
    # fp16x2 / fp8: each k slab ends in an fp32 epilogue after the wgmma wait (the add into
    # the accumulator; the scaling), priced against the slab's tensor-core flops
    t_compute = waves * tile_t * ops.products * ops.slab_epilogue_factor(p, bk)
    fused = bool(f.get("fused"))
    if fused and (f.get("split_group") or f.get("persistent")):
        # TileLang's persistent form of the fused kernel is slower per product-time than the
        # grid kernel with as many waves (H100, bench/experiments/cuda.md; cause not located)
        t_compute *= 1.18
    if not ((f.get("persistent") and not fused) or f.get("tma_reduce")):
        # a grid of one-tile CTAs fills each CTA's pipeline after launch and drains it before
        # the SM takes the next tile; the unfused persistent kernel overlaps both
        # (bench/experiments/cuda.md)
        t_compute += waves * GRID_TILE_START_S
    t_load = _gpu_load_s(M, N, K, s, halves, p, (bm, bn), batch, f.get("cache_aware"))
    t_store = M * N * (out_bytes or s) * batch / p.achievable_bw()
    # compute and loads overlap imperfectly: a smooth maximum (3-norm) keeps the smaller term
    # visible, so compute-side knobs still rank when the loads are the larger term
    body = (t_compute ** 3 + t_load ** 3) ** (1 / 3)
    total = body + t_store + p.launch_overhead_s
    return {"time_s": total, "compute_s": t_compute, "load_s": t_load, "store_s": t_store,
            "waves": waves, "ctas_per_sm": ctas, "tile_eff": tile_eff, "smem_bytes": smem}


def _gpu_load_s(M, N, K, s, halves, p, tile, batch, cache_aware) -> float:
    """Seconds of operand loads (after Triton's L2 model): every CTA streams its A row-band
    and B column-band through L2 (gn·|A| + gm·|B| bytes at L2 speed); DRAM sees the
    compulsory bytes plus a re-read share that grows when the operands overflow L2.
    ``s``: bytes per element, ``halves``: fp16 halves per operand (fp16x2: 2)."""
    bm, bn = tile
    gm, gn = cdiv(M, bm), cdiv(N, bn)
    a_bytes, b_bytes = M * K * s * batch * halves, K * N * s * batch * halves
    reread = 0.05 if (M * K + K * N) * s <= p.l2_bytes else 0.2
    dram = (a_bytes + b_bytes) * (1 + reread)
    l2 = a_bytes * gn + b_bytes * gm
    if batch > 1 and cache_aware is False:
        # CTAs resident together read different products' panels: L2 hardly shares them,
        # every band comes from DRAM (as the H100 shows, bench/experiments/cuda.md)
        dram = max(dram, l2)
    return max(dram / p.achievable_bw(), l2 / (p.l2_bw or 2.5 * p.mem_bw))


#: bandwidth fraction of the fused kernel's read-modify-write epilogue: at 16384³ bf16
#: Strassen its 12 partial-C RMWs are paced by this share of DRAM bandwidth on the H200
#: (bench/experiments/cuda.md)
FUSED_RMW_BW_FRACTION = 0.45
#: the same for the TMA-engine epilogue (tma_reduce: stores and cp.reduce.async.bulk adds,
#: asynchronous, partly absorbed by L2), fitted to its sustained H100 times against the
#: persistent Algorithm 1 (bench/experiments/cuda.md, which compares model and measurement).
#: No one constant fits Strassen² at 8192³ too.
TMA_RMW_BW_FRACTION = 1.5


def combine_time(alg, M, N, K, dtype, p, *, fused_h: bool = False, operands: str = "native",
                 tma_reduce: bool = False, in_place: tuple[int, int] = (0, 0)) -> float:
    """Seconds of the memory-bound combine stages of an LCMA (0 for GEMM): every output of
    Combine A/B/H written once, every input block read once (FalconGEMM's traffic count).
    With ``fused_h`` on a GPU there is no H round trip, but every product r read-modify-
    writes the nnz(W_r) C blocks it feeds (the first touch of a block is a plain write):
    (2·nnz(W) − m·n) block transfers at ``FUSED_RMW_BW_FRACTION`` of the bandwidth.
    Scaled fp16 ``operands``: an amax read of A and of B first, Ã/B̃ written as fp16 (two
    halves for fp16x2), H read as fp32; the plain GEMM then has its amax and scaling passes.
    ``in_place``: how many Ã / B̃ operands the GEMM reads from A / B in place, unwritten
    (CUDA ``direct_views``, ``view_counts``)."""
    ops = operand_terms_of({"operands": operands}, dtype)
    s = itemsize(dtype)
    so = ops.op_bytes
    reads = 2 if ops.amax else 1                            # + the amax pass
    if alg is None:
        if ops.mode == "native":
            return 0.0
        return (M * K + K * N) * (reads * s + so) / p.achievable_bw() + 2 * reads * p.launch_overhead_s
    m, k, n, R = alg.m, alg.k, alg.n, alg.R
    bm_, bk_, bn_ = M / m, K / k, N / n
    a = M * K * s * reads + (R - in_place[0]) * bm_ * bk_ * so     # read A, write the Ã blocks
    b = K * N * s * reads + (R - in_place[1]) * bk_ * bn_ * so
    t = (a + b) / p.achievable_bw() + 2 * reads * p.launch_overhead_s
    if not fused_h:
        h = R * bm_ * bn_ * ops.h_bytes + M * N * s          # read H, write C
        return t + h / p.achievable_bw() + p.launch_overhead_s
    if p.kind == "gpu":
        nnz = int(np.count_nonzero(np.asarray(alg.W)))
        rmw = (2 * nnz - m * n) * bm_ * bn_ * s
        frac = TMA_RMW_BW_FRACTION if tma_reduce else FUSED_RMW_BW_FRACTION
        t += rmw / (frac * p.achievable_bw())
    return t


def view_counts(target, dtype, shape, alg, f: dict) -> tuple[int, int]:
    """(Ã, B̃) operands the batched GEMM reads from A / B in place with config ``f`` on
    ``target`` (``schedules.cuda.config.view_sides``; none on a bare profile, which has no arch)."""
    arch = getattr(target_object(target), "arch", None)
    if arch is None or f.get("fused"):
        return (0, 0)
    blk = Blocking(*shape, alg.m, alg.k, alg.n, alg.R)
    sides = view_sides(cuda_config_of(f), blk, normalize_dtype(dtype), arch)
    written = quantities(alg).materialized          # operands that are not a bare ±block
    counts = [alg.R - written[X] if X.lower() in sides else 0 for X in ("A", "B")]
    return tuple(n if side_read_in_place(n, alg.R) else 0 for n in counts)


def cpu_fused_epilogue_s(alg, sm, sn, sk, dtype, p, f: dict) -> float:
    """The CPU fused Combine H: per product and kc chunk, a task read-modify-writes its
    mc×nc tile of each C block the product feeds (2·nnz(W) − m·n tile transfers, the first
    touch of a block being a plain write).  The tiles stay in the last-level cache while a
    task's m·n tiles fit in half of it, else they go to DRAM — why Strassen (4 C blocks)
    gains from fusing and Strassen² (16) loses on the SPR VM (cpu_config.default_config)."""
    s = itemsize(dtype)
    mc, nc, kc = (int(f.get(k, d)) for k, d in (("mc", 64), ("nc", 1024), ("kc", 128)))
    nnz = int(np.count_nonzero(np.asarray(alg.W)))
    chunks = cdiv(sk, max(1, kc))
    bytes_ = (2 * nnz - alg.m * alg.n) * sm * sn * s * chunks
    resident = alg.m * alg.n * min(mc, sm) * min(nc, sn) * s * p.units <= 0.5 * (p.l3_bytes or 0)
    bw = (p.l2_bw or 4 * p.mem_bw) if resident else p.achievable_bw()
    return bytes_ / bw


def estimate(target, dtype, shape, algorithm, config, profile=None) -> dict:
    """Per-config time estimate (seconds, with a breakdown) for ``algorithm`` (``"gemm"``,
    a catalogue expression or an ``Algorithm``) run with ``config``.  ``dtype`` is priced as
    ``model_dtype(target, dtype)`` (CUDA float32 = TF32 tensor cores)."""
    p = target_profile(target, profile)
    asked_dtype = dtype                  # the artifact's dtype; the model prices model_dtype's
    dtype = model_dtype(target, dtype) if p.kind == "gpu" else dtype
    f = knobs(config)
    M, N, K = (int(x) for x in shape)
    alg = algorithm_of(algorithm)
    gpu = p.kind == "gpu"
    operands = f.get("operands") or "native"
    if alg is None:
        if not gpu:
            g = estimate_gemm_cpu(M, N, K, dtype, p, f)
            return {**g, "combine_s": 0.0, "gemm_s": g["time_s"]}
        g = estimate_gemm_gpu(M, N, K, dtype, p, f, out_bytes=itemsize(dtype))
        comb = combine_time(None, M, N, K, dtype, p, operands=operands)
        return {**g, "time_s": g["time_s"] + comb, "combine_s": comb, "gemm_s": g["time_s"]}
    sm, sn, sk = cdiv(M, alg.m), cdiv(N, alg.n), cdiv(K, alg.k)
    fused = bool(f.get("fused", False))
    if gpu:
        # the fused kernel: one CTA per tile position walks all R products (whole group);
        # Algorithm 1's batched GEMM: R × tiles CTAs in one grid (r slowest)
        sched = "split-group" if f.get("split_group") else ("whole-group" if fused else "per-tile")
        g = estimate_gemm_gpu(sm, sn, sk, dtype, p, f, batch=alg.R, schedule=sched,
                              out_bytes=operand_terms_of(f, dtype).h_bytes)
        gemm = g["time_s"]
    else:
        g = estimate_gemm_cpu(sm, sn, sk, dtype, p, f)
        gemm = alg.R * g["time_s"]
    in_place = view_counts(target, asked_dtype, (M, N, K), alg, f) if gpu else (0, 0)
    comb = combine_time(alg, M, N, K, dtype, p, fused_h=fused, operands=operands,
                        tma_reduce=bool(f.get("tma_reduce")), in_place=in_place)
    if fused and not gpu:
        comb += cpu_fused_epilogue_s(alg, sm, sn, sk, dtype, p, f)
    return {**g, "time_s": gemm + comb, "gemm_s": gemm, "combine_s": comb}
