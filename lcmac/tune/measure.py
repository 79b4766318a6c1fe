"""Timing one built artifact: median of repeats after warm-up, in an isolated process.

``measure_artifact(path, target, dtype, shape)`` loads an artifact with ``lcmac.load``,
checks a few rows of its result against a float64 reference (a fast wrong kernel must never
win), then times it: ``warmup`` untimed calls, then ``repeats`` timed runs, each run
``inner`` back-to-back calls sized so that a run lasts at least ``min_run_s`` (CUDA: timed
with CUDA events and synchronised; CPU: ``time.perf_counter``).  It returns
``{"time_s": median per call, "spread": (max − min)/median, "repeats": n, "inner": k}``.

The tuner runs it in a separate worker process (``MeasureWorker``), one measurement at a
time and never while compiling, so a crashing kernel cannot take the tuner down and the
two shared cores are not shared with a compiler while timing.  After the correctness check
(which calls BLAS) it pauses briefly: OpenBLAS's spinning threads slow TVM's for ~0.1 s
(docs/design.md).

**Paired with the vendor on the CPU** (``paired=True``, which the tuner asks for when it times
the vendor GEMM as the baseline): the artifact and the CPU's vendor GEMM on the same operands
are timed in alternating rounds (``time_paired``; the order flips every round, a pause before
each run), and the vendor's median of those same rounds is returned as ``vendor_paired_s``
(with ``vendor_api``, which vendor GEMM it was).
A shared VM's speed moves by ±10 % and more between minutes, so a kernel timed alone, minutes
after the vendor, can look ahead or behind by more than the margins the decision uses; the
ratio of two times taken in the same rounds cannot (the decision puts such a kernel's time
on the vendor's logged scale, ``measured_decision.gather``).

On a GPU the operands are drawn on the device (random normal, never zeros), rotated among
several input sets when they would fit in L2 (a kernel must not be timed on cache-resident
operands), the output is poisoned with NaN before the correctness run (every element must be
written), and the reference rows are computed on the device in float64.  The measuring
process keeps the last shape's operands, so the configs of one shape (and the vendor
baseline, ``measure_vendor``: torch.matmul = cuBLAS on a GPU) are timed on the same inputs.

**The CPU's vendor GEMM** is the faster of numpy.matmul and torch.matmul (MKL / oneDNN) where
torch is installed (``lcmac.runtime.cpu_vendor``): ``choose_cpu_vendor`` measures the two in
paired rounds at the product's size class, once per device, and keeps the choice;
``measure_vendor`` then times that one, and its record's config names it (``library``,
``api``).  Where numpy has no such dtype (bfloat16) it is torch.matmul (oneDNN).

The callable protocol it relies on: ``lcmac.load(path)`` returns ``f`` with ``f(A, B) → C``
(numpy arrays on CPU; torch tensors on CUDA, on the GPU); if ``f(A, B)`` raises TypeError or
returns None, ``f(A, B, C)`` with a preallocated C is tried.
"""
from __future__ import annotations

import concurrent.futures as cf
import datetime as dt
import multiprocessing as mp
import os
import statistics
import sys
import time

from lcmac.runtime import cpu_vendor
from lcmac.runtime.loader import load
from lcmac.spec.precision import torch_precision_set

CHECK_ROWS = 32


def _torch_dtype(torch, dtype):
    return {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16,
            "float16": torch.float16, "float8_e4m3": getattr(torch, "float8_e4m3fn", None)}[dtype]


def make_inputs(target: str, dtype: str, shape, seed: int = 0):
    """(A, B, on_gpu) random operands of the right kind for the target."""
    M, N, K = (int(x) for x in shape)
    gpu = str(target).startswith("cuda")
    if not gpu and dtype in ("float32", "float64"):
        import numpy as np
        rng = np.random.default_rng(seed)
        A = rng.standard_normal((M, K), dtype=np.float32).astype(dtype)
        B = rng.standard_normal((K, N), dtype=np.float32).astype(dtype)
        return A, B, False
    import torch
    g = torch.Generator().manual_seed(seed)
    A = torch.randn(M, K, generator=g)
    B = torch.randn(K, N, generator=g)
    dev = "cuda" if gpu else "cpu"
    td = _torch_dtype(torch, dtype)
    return A.to(dev).to(td), B.to(dev).to(td), gpu


def _call(f, A, B):
    try:
        C = f(A, B)
        if C is not None:
            try:  # time without allocating C on every call when out= is offered
                f(A, B, out=C)
                return C, lambda: f(A, B, out=C)
            except TypeError:
                return C, lambda: f(A, B)
    except TypeError:
        pass
    M, N = A.shape[0], B.shape[1]
    if hasattr(A, "new_empty"):
        C = A.new_empty((M, N))
    else:
        import numpy as np
        C = np.empty((M, N), dtype=A.dtype)
    f(A, B, C)
    return C, lambda: f(A, B, C)


def _as64(x):
    import numpy as np
    if hasattr(x, "detach"):
        return x.detach().float().cpu().numpy().astype(np.float64)
    return np.asarray(x, dtype=np.float64)


#: relative-error bound of the correctness check (a guard against wrong kernels, whose error
#: is O(1), not a precision test): CUDA float32 multiplies in TF32 (10-bit mantissa) and an
#: LCMA's combines grow the error a few times, hence 2e-2 there
TOLERANCE = {"float64": 1e-9, "float32": 1e-3, "float32-gpu": 2e-2}


def check_result(A, B, C, dtype: str, *, gpu: bool = False) -> str | None:
    """Why C is not A·B on a few rows (None when it is, within the dtype's tolerance)."""
    import numpy as np
    rows = min(CHECK_ROWS, A.shape[0])
    a, b, c = _as64(A[:rows]), _as64(B), _as64(C[:rows])
    ref = a @ b
    tol = TOLERANCE.get(f"{dtype}-gpu" if gpu else dtype, TOLERANCE.get(dtype, 5e-2))
    err = float(np.linalg.norm(c - ref) / max(np.linalg.norm(ref), 1e-30))
    if not np.isfinite(err) or err > tol:
        return f"wrong result: relative error {err:.3g} > {tol:g} on the first {rows} rows"
    return None


def _inner_calls(run, sync, min_run_s: float, max_inner: int) -> tuple[int, float]:
    """(back-to-back calls per timed run, so that a run lasts at least ``min_run_s``; the
    seconds of the one call that sized it)."""
    t0 = time.perf_counter()
    run()
    sync()
    one = max(time.perf_counter() - t0, 1e-9)
    return max(1, min(max_inner, int(min_run_s / one + 0.999))), one


#: paired rounds warm a side (one untimed call after the pause) whose call is shorter: its
#: threads' wake-up is a negligible share of a longer call, which a warm call would make twice
#: as long to time (docs/tuning.md)
WARM_BELOW_S = 0.25


def time_paired(run, vendor, *, warmup: int = 2, repeats: int = 5, min_run_s: float = 0.02,
                max_inner: int = 1000, pause: float = 0.15) -> dict:
    """``time_callable``'s result for ``run()``, timed in rounds alternating with
    ``vendor()`` (the order flips every round; ``pause`` seconds of quiet before each side:
    OpenBLAS's threads spin for ~0.1 s after a call, then, for calls under ``WARM_BELOW_S``,
    one untimed call, since threads parked by the pause take time to wake, and numpy's calls
    pay for it more than lcmac's (docs/cpu.md, "Benchmarking")), plus
    ``vendor_paired_s``, the vendor's median over the same rounds, and ``paired_ratio``, the
    median of vendor / run per round."""
    def nothing():
        return None
    for _ in range(warmup):
        run()
        vendor()
    sides = [[fn, *_inner_calls(fn, nothing, min_run_s, max_inner), []] for fn in (run, vendor)]
    for i in range(repeats):
        for fn, inner, one, times in (sides if i % 2 == 0 else sides[::-1]):
            time.sleep(pause)
            if one < WARM_BELOW_S:
                fn()                                # wakes its threads, untimed
            t0 = time.perf_counter()
            for _ in range(inner):
                fn()
            times.append((time.perf_counter() - t0) / inner)
    tr, tv = sides[0][3], sides[1][3]
    med, vmed = statistics.median(tr), statistics.median(tv)
    return {"time_s": med, "spread": (max(tr) - min(tr)) / med, "repeats": repeats,
            "inner": sides[0][1], "times": tr, "vendor_paired_s": vmed,
            "vendor_spread": (max(tv) - min(tv)) / vmed, "vendor_times": tv,
            "paired_ratio": statistics.median(v / r for v, r in zip(tv, tr))}


def time_callable(run, *, sync=None, warmup: int = 2, repeats: int = 5,
                  min_run_s: float = 0.02, max_inner: int = 1000, timer=None) -> dict:
    """Median time per call of ``run()`` (see the module doc)."""
    sync = sync or (lambda: None)
    for _ in range(warmup):
        run()
    sync()
    inner, _ = _inner_calls(run, sync, min_run_s, max_inner)
    times = []
    for _ in range(repeats):
        if timer is not None:
            times.append(timer(run, inner) / inner)
            continue
        sync()
        t0 = time.perf_counter()
        for _ in range(inner):
            run()
        sync()
        times.append((time.perf_counter() - t0) / inner)
    med = statistics.median(times)
    return {"time_s": med, "spread": (max(times) - min(times)) / med, "repeats": repeats,
            "inner": inner, "times": times}


# ---- GPU: operands on the device, shared by every measurement of one shape ------------------
_GPU_CACHE: dict = {}


def gpu_inputs(dtype: str, shape, seed: int = 0, *, l2_bytes: int | None = None):
    """(input sets [(A, B), …], reference rows of A₀·B₀ in float64, rows) on the current GPU;
    the last shape's are kept (one shape's configs are measured one after another)."""
    import math
    import torch
    key = (dtype, tuple(int(x) for x in shape), seed)
    if key in _GPU_CACHE:
        return _GPU_CACHE[key]
    _GPU_CACHE.clear()
    torch.cuda.empty_cache()
    M, N, K = key[1]
    td = _torch_dtype(torch, dtype)
    item = torch.empty((), dtype=td).element_size()
    if l2_bytes is None:
        props = torch.cuda.get_device_properties(0)
        l2_bytes = int(getattr(props, "L2_cache_size", 0) or getattr(props, "l2_cache_size", 0)
                       or 50 * 2 ** 20)
    nbytes = (M * K + K * N) * item
    sets = 1 if nbytes >= 4 * l2_bytes else min(8, math.ceil(4 * l2_bytes / nbytes))
    g = torch.Generator(device="cuda").manual_seed(seed)
    ins = [(torch.randn(M, K, device="cuda", generator=g).to(td),
            torch.randn(K, N, device="cuda", generator=g).to(td)) for _ in range(sets)]
    rows = min(CHECK_ROWS, M)
    A0, B0 = ins[0]
    ref = A0[:rows].double() @ B0.double()
    torch.cuda.synchronize()
    _GPU_CACHE[key] = (ins, ref, rows)
    return _GPU_CACHE[key]


def _gpu_check(C, ref, rows, dtype) -> str | None:
    import torch
    if not bool(torch.isfinite(C).all()):
        return "wrong result: not every element of C was written (NaN poison survived) or non-finite"
    err = float(torch.linalg.norm(C[:rows].double() - ref) / torch.linalg.norm(ref).clamp_min(1e-30))
    tol = TOLERANCE.get(f"{dtype}-gpu", TOLERANCE.get(dtype, 5e-2))
    if not err <= tol:
        return f"wrong result: relative error {err:.3g} > {tol:g} on the first {rows} rows"
    return None


def gpu_timer():
    """``timer(fn, n)``: seconds for n back-to-back calls of ``fn`` on the GPU (CUDA events)."""
    import torch

    def timer(fn, n):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(n):
            fn()
        e.record()
        e.synchronize()
        return s.elapsed_time(e) / 1e3
    return timer


def gpu_sustained(fn, seconds: float) -> float:
    """Mean seconds per call of ``fn`` run back to back for ``seconds`` on the GPU (the clocks
    at the power cap: the sustained figure beside ``gpu_timer``'s burst one)."""
    import torch
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(8):
            fn()
        n += 8
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n


def gpu_kernel_times(fn, calls: int = 10) -> dict:
    """{kernel name: mean µs per call of ``fn``} over ``calls`` calls, from torch's profiler
    (CUDA activity): which stage of a product the time goes to.  The profiler adds a little
    to each launch, so the sum is no substitute for ``gpu_timer``'s figure."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    out: dict = {}
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:      # kernels, copies, memsets
            out[ev.name] = out.get(ev.name, 0.0) + ev.time_range.elapsed_us() / calls
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def run_header(benchmark: str, device: str, script: str, argv=None) -> dict:
    """The fields every benchmark's results JSON starts with: what it measured, on which
    device, the date (UTC) and the command as run (``script`` its ``__file__``, ``argv`` its
    arguments; None: this process's)."""
    args = argv if argv is not None else sys.argv[1:]
    return {"benchmark": benchmark, "device": device,
            "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d"),
            "command": f"python scripts/{os.path.basename(script)} " + " ".join(args)}


def gpu_rounds(variants, rounds: int, calls: int, sustained_s: float = 0.0):
    """Interleaved timing of ``variants`` ((name, fn) pairs) on the GPU: per name, the seconds
    per call of each of ``rounds`` rounds of ``calls`` back-to-back calls (``gpu_timer``; the
    variants take turns within a round), and, with ``sustained_s``, the ``gpu_sustained``
    figure (empty otherwise).  Round r starts at variant r (mod n): the variant timed first
    after whatever ran before measured slow (1-16 % on an H200, duplicates of one kernel in
    one run), so no variant keeps that place."""
    variants = list(variants)
    timer = gpu_timer()
    times = {name: [] for name, _ in variants}
    for r in range(rounds):
        k = r % max(len(variants), 1)
        for name, fn in variants[k:] + variants[:k]:
            times[name].append(timer(fn, calls) / calls)
    sustained = {name: gpu_sustained(fn, sustained_s) for name, fn in variants} if sustained_s else {}
    return times, sustained


#: seconds of back-to-back calls before timing on a GPU: the clocks drop while the GPU waits
#: (for a compile, between shapes) and the first runs after an idle gap would be timed slow
#: (seen in the first tuning run: cuBLAS, measured first at each shape, had 10–26 % spread)
GPU_WARM_S = 0.15


def _measure_gpu(call, dtype: str, shape, *, warmup, repeats, min_run_s, check,
                 warm_s: float = GPU_WARM_S) -> dict:
    """``call(A, B, C)`` computes C = A·B on the GPU: poison, check, warm up for ``warm_s``
    seconds, then time rotating among the input sets."""
    import torch
    ins, ref, rows = gpu_inputs(dtype, shape)
    M, N, _ = (int(x) for x in shape)
    C = torch.full((M, N), float("nan"), dtype=ins[0][0].dtype, device="cuda")
    call(ins[0][0], ins[0][1], C)
    torch.cuda.synchronize()
    if check:
        why = _gpu_check(C, ref, rows, dtype)
        if why:
            return {"status": "error", "error": why}
    i = [0]

    def run():
        A, B = ins[i[0] % len(ins)]
        i[0] += 1
        call(A, B, C)
    t_end = time.perf_counter() + warm_s
    while time.perf_counter() < t_end:
        for _ in range(4):
            run()
        torch.cuda.synchronize()
    out = time_callable(run, sync=torch.cuda.synchronize, warmup=warmup, repeats=repeats,
                        min_run_s=min_run_s, timer=gpu_timer())
    out.update(status="ok", input_sets=len(ins), warm_s=warm_s)
    return out


def _vendor_tf32(dtype: str, operands: str) -> bool:
    """cuBLAS in the precision lcmac's kernels of this operand mode compare with: TF32 for
    float32 native (TF32 GEMM stage) and fp16 (TF32-class), true fp32 SGEMM for fp16x2.  The
    record's ``"tf32"`` says which ran (``lcmac.policy.measured.same_precision``)."""
    return dtype == "float32" and operands != "fp16x2"


def vendor_config(target: str, dtype: str, operands: str = "native", shape=None) -> dict:
    """How the vendor baseline is called (the ``config`` of its log records; a scaled
    operand mode is recorded, so decisions among native kernels never read it); on a CPU the
    vendor GEMM chosen for ``shape`` (``choose_cpu_vendor``; numpy's without a shape)."""
    if str(target).startswith("cuda"):
        import torch
        out = {"library": "cublas", "api": "torch.matmul", "torch": torch.__version__,
               "tf32": _vendor_tf32(dtype, operands)}
        if operands != "native":
            out["operands"] = operands
        return out
    gemm = choose_cpu_vendor(dtype, *(shape or (0, 0, 0)))
    return gemm.config() if gemm is not None else {"library": "none", "api": "none"}


def measure_vendor(target: str, dtype: str, shape, *, warmup: int = 2, repeats: int = 5,
                   min_run_s: float = 0.02, check: bool = True, operands: str = "native",
                   warm_s: float = 2 * GPU_WARM_S) -> dict:
    """Time the vendor GEMM on the same operands the artifacts get: torch.matmul (cuBLAS;
    for float32 TF32 allowed, as lcmac's native CUDA float32 GEMM runs TF32, or true SGEMM
    against the fp16x2 operand mode) on a GPU, the faster of numpy.matmul and torch.matmul
    on a CPU (``choose_cpu_vendor``, measured first where no choice is kept).  ``warm_s``:
    as for ``measure_artifact``; by default twice an artifact's, since the vendor GEMM is
    timed first at each shape, after an idle gap."""
    if str(target).startswith("cuda"):
        import torch
        # torch's class set for the measurement only: the record says which one ran
        with torch_precision_set("high" if _vendor_tf32(dtype, operands) else "highest"):
            out = _measure_gpu(lambda A, B, C: torch.matmul(A, B, out=C), dtype, shape,
                               warmup=warmup, repeats=repeats, min_run_s=min_run_s, check=check,
                               warm_s=warm_s)
    else:
        gemm = choose_cpu_vendor(dtype, *shape)
        if gemm is None:
            return {"status": "error", "error": f"no vendor GEMM multiplies {dtype} on this CPU "
                                                "(numpy has no such dtype and torch does not import)"}
        A, B, _ = make_inputs(target, dtype, shape)     # torch tensors where numpy lacks the dtype
        C = gemm(A, B)
        if check:
            why = check_result(A, B, C, dtype)
            if why:
                return {"status": "error", "error": why}
        out = time_callable(lambda: gemm(A, B, out=C), warmup=warmup, repeats=repeats,
                            min_run_s=min_run_s)
        out["status"] = "ok"
    out["config"] = vendor_config(target, dtype, operands, shape)
    return out


#: paired rounds of the CPU vendor choice
CHOICE_ROUNDS = 7
#: how much faster, by the median of the paired ratios, torch.matmul must run to be chosen
#: over numpy.matmul: a tie goes to numpy (numpy callers then never import torch)
CHOICE_MARGIN = 0.02


def measure_cpu_vendors(dtype: str, side: int, *, rounds: int = CHOICE_ROUNDS,
                        min_run_s: float = 0.02, pause: float = 0.15) -> dict:
    """numpy.matmul against torch.matmul on random side³ operands of ``dtype``, each checked,
    then timed in ``rounds`` paired rounds (``time_paired``: the order flips every round, so
    neither is always first after the pause); the faster by the median paired ratio, with
    ``CHOICE_MARGIN`` for torch.  ``lcmac.runtime.cpu_vendor.kept_choice``'s document:
    ``chosen`` (the api), ``gemms`` (api → config), ``measured`` and ``why``."""
    found = {g.api: g for g in cpu_vendor.gemms(dtype)}
    if not found:
        raise ValueError(f"no vendor GEMM multiplies {dtype} on this CPU")
    doc = {"gemms": {api: g.config() for api, g in found.items()}, "rounds": rounds}
    if len(found) == 1:
        api = next(iter(found))
        return {**doc, "chosen": api, "why": f"the only vendor GEMM of {dtype} here: {api}"}
    shape = (side, side, side)
    A, B, _ = make_inputs("cpu", dtype, shape)
    C = found[cpu_vendor.NUMPY](A, B)
    for g in found.values():
        why = check_result(A, B, g(A, B, out=C), dtype)
        if why:
            raise ValueError(f"{g.describe()}: {why}")
    torch_mm, numpy_mm = found[cpu_vendor.TORCH], found[cpu_vendor.NUMPY]
    t = time_paired(lambda: torch_mm(A, B, out=C), lambda: numpy_mm(A, B, out=C), warmup=2,
                    repeats=rounds, min_run_s=min_run_s, pause=pause)
    ratios = [n / x for n, x in zip(t["vendor_times"], t["times"])]
    chosen = cpu_vendor.TORCH if t["paired_ratio"] > 1.0 + CHOICE_MARGIN else cpu_vendor.NUMPY
    measured = {cpu_vendor.TORCH: {"median_s": t["time_s"], "spread": t["spread"],
                                   "times": t["times"]},
                cpu_vendor.NUMPY: {"median_s": t["vendor_paired_s"], "spread": t["vendor_spread"],
                                   "times": t["vendor_times"]},
                "paired_ratio": {"median": t["paired_ratio"], "min": min(ratios), "max": max(ratios)},
                "inner": t["inner"]}
    why = (f"torch.matmul ran at {t['paired_ratio']:.3f}x numpy.matmul's speed at {side}³ "
           f"(median of {rounds} paired rounds, {min(ratios):.3f}..{max(ratios):.3f})"
           + ("" if chosen == cpu_vendor.TORCH else f"; under {1 + CHOICE_MARGIN:g}x: numpy.matmul"))
    return {**doc, "chosen": chosen, "measured": measured, "why": why}


def choose_cpu_vendor(dtype: str, M: int, N: int, K: int, *, rounds: int = CHOICE_ROUNDS):
    """The CPU's vendor GEMM for M×K·K×N of ``dtype`` (``lcmac.runtime.cpu_vendor.CpuGemm``;
    None where no library has the dtype): the choice kept for the product's size class,
    measured now (``measure_cpu_vendors``, seconds) and kept where none is."""
    return cpu_vendor.chosen(dtype, M, N, K, measurer=lambda d, side: measure_cpu_vendors(
        d, side, rounds=rounds))


def measure_artifact(path: str, target: str, dtype: str, shape, *, warmup: int = 2,
                     repeats: int = 5, min_run_s: float = 0.02, check: bool = True,
                     warm_s: float = GPU_WARM_S, paired: bool = False) -> dict:
    """Load, check and time one artifact (runs in the measuring process).  ``warm_s``: on a
    GPU, seconds of back-to-back calls before timing (seconds put the GPU at its power cap,
    the sustained state).  ``paired``: on the CPU, timed in rounds alternating with
    the CPU's vendor GEMM on the same operands (module doc); ignored on a GPU."""
    f = load(path)
    if str(target).startswith("cuda"):
        return _measure_gpu(lambda A, B, C: f(A, B, out=C), dtype, shape, warmup=warmup,
                            repeats=repeats, min_run_s=min_run_s, check=check, warm_s=warm_s)
    A, B, gpu = make_inputs(target, dtype, shape)
    C, run = _call(f, A, B)
    sync, timer = None, None
    if gpu:
        import torch
        sync = torch.cuda.synchronize
        sync()
        timer = gpu_timer()
    if check:
        why = check_result(A, B, C, dtype)
        if why:
            return {"status": "error", "error": why}
        if not gpu:
            time.sleep(0.2)  # let BLAS's spinning threads go quiet
    vendor, api = _cpu_vendor(A, B, dtype) if paired and not gpu else (None, None)
    if vendor is not None:
        out = time_paired(run, vendor, warmup=warmup, repeats=repeats, min_run_s=min_run_s)
        out["vendor_api"] = api
    else:
        out = time_callable(run, sync=sync, warmup=warmup, repeats=repeats, min_run_s=min_run_s,
                            timer=timer)
    out["status"] = "ok"
    return out


def _cpu_vendor(A, B, dtype: str):
    """(the CPU's vendor GEMM on the operands an artifact gets: the one ``measure_vendor``
    timed, kept by ``choose_cpu_vendor``; its api), or (None, None) where there is none."""
    gemm = cpu_vendor.chosen(dtype, A.shape[0], B.shape[1], A.shape[1])
    if gemm is None:
        return None, None
    C = gemm(A, B)
    return (lambda: gemm(A, B, out=C)), gemm.api


def _safe_measure(*args, vendor: bool = False, **kw) -> dict:
    try:
        if vendor:
            return measure_vendor(*args[1:], **kw)
        return measure_artifact(*args, **kw)
    except Exception as e:  # noqa: BLE001 - reported as a failed trial
        return {"status": "error", "error": f"{type(e).__name__}: {e}"}


#: errors after which a CUDA context is unusable (sticky errors)
_CUDA_FAULTS = ("illegal memory access", "AcceleratorError", "misaligned address",
                "unspecified launch failure", "illegal instruction", "CUDA error")


class MeasureWorker:
    """One long-lived measuring process (spawned: no inherited compiler state); restarted
    after a crash, which is reported as an error result for that artifact."""

    def __init__(self, timeout_s: float = 300.0):
        self.timeout_s = timeout_s
        self._pool = None

    def _ensure(self):
        if self._pool is None:
            self._pool = cf.ProcessPoolExecutor(max_workers=1, mp_context=mp.get_context("spawn"))
        return self._pool

    def measure_vendor(self, target, dtype, shape, **kw) -> dict:
        """The vendor GEMM (``measure_vendor``) in the measuring process."""
        return self.measure("", target, dtype, shape, vendor=True, **kw)

    #: what runs in the measuring process for one artifact (or the vendor GEMM); a subclass
    #: for another operand mode names its own (a module-level function: it is pickled)
    measuring = staticmethod(_safe_measure)

    def measure(self, path, target, dtype, shape, **kw) -> dict:
        pool = self._ensure()
        fut = pool.submit(self.measuring, str(path), target, dtype, tuple(shape), **kw)
        try:
            out = fut.result(timeout=self.timeout_s)
            if out.get("status") != "ok" and any(s in str(out.get("error", "")) for s in _CUDA_FAULTS):
                # a kernel fault poisons the process's CUDA context: every later launch in it
                # would fail too, so the next measurement gets a fresh process
                self.close(kill=True)
                out["error"] = "device fault (measuring process restarted): " + str(out["error"])
            return out
        except cf.TimeoutError:
            self.close(kill=True)
            return {"status": "error", "error": f"measurement timed out after {self.timeout_s:.0f} s"}
        except cf.process.BrokenProcessPool:
            self.close(kill=True)
            return {"status": "error", "error": "the measuring process crashed (signal)"}

    def close(self, kill: bool = False):
        if self._pool is not None:
            if kill:
                for p in list(getattr(self._pool, "_processes", {}).values()):
                    try:
                        p.kill()
                    except Exception:  # noqa: BLE001
                        pass
            self._pool.shutdown(wait=not kill, cancel_futures=True)
            self._pool = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
