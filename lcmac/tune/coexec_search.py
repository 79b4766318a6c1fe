"""Measuring the CPU+GPU split (``lcmac.api.coexec``): calibrate the model's three rates on this
machine, let it predict the split, time the prediction and its neighbours, log the best.

1. Calibration (``calibrate``): the GPU alone, B's copy, and the CPU side of two split runs
   (a fixed cost and a cost per row), plus the rates of the analytic model.
2. The calibrated split (``lcmac.costmodel.coexec.predict_split_measured``); beside it the
   analytic model's with the measured rates, and the uncalibrated prior's.
3. Candidates: GPU only, one 64-row block, the three predictions, the calibrated one halved,
   ×1.5 and doubled (rounded to whole 64-row blocks): each timed in ``rounds`` interleaved
   rounds, median.  A candidate whose CPU side alone is predicted (from the calibration) to take
   more than twice the GPU alone is not timed: it cannot win, and at 32768³ in fp32 or fp64 one
   such run costs a minute.  It is reported with its predicted time.
4. The fastest is logged (``lcmac.artifact.split_log``) for ``split="auto"`` to take.
"""
from __future__ import annotations

import statistics
import time

from lcmac.artifact.split_log import append_split, make_split_record
from lcmac.costmodel.coexec import predict_split, predict_split_measured, split_rows
from lcmac.core.dtypes import ITEMSIZE


def _wall(fn, sync) -> float:
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - t0


def calibrate(A, B, gpu, *, run, gpu_matmul) -> dict:
    """What the split's two sides cost on this machine, for A·B:

    - the rates of the analytic model (``predict_split``): the GPU's GEMM on device-resident
      copies, the link as the split uses it (B host → GPU from pinned memory for host inputs,
      GPU → host into pageable memory for device inputs), the CPU's from the larger probe;
    - the measured sides (``predict_split_measured``): the GPU alone (T₀), its part no split
      removes (B's copy, host inputs), and the CPU side of split runs with one 64-row block and
      with a sixteenth of the rows (fewer where that would take longer than the GPU alone: a
      split only pays while its CPU side is shorter), timed beside the GPU's — a fixed cost and
      a cost per row.
      (Timed alone, a CPU GEMM was measured to promise twice what it delivers beside the GPU,
      and small slices run well below its rate.)"""
    import torch
    sync = torch.cuda.synchronize
    M, K = A.shape
    N = B.shape[1]
    s = A.element_size()
    Ad, Bd = A.to(gpu), B.to(gpu)
    gpu_matmul(Ad, Bd)                                   # first call: compile, warm
    t_gemm = min(_wall(lambda: gpu_matmul(Ad, Bd), sync) for _ in range(3))
    if A.device.type == "cpu":
        link = lambda: B.to(gpu, non_blocking=True)      # noqa: E731
    else:
        link = lambda: Bd.to("cpu")                      # noqa: E731
    t_link = min(_wall(link, sync) for _ in range(3))
    run(M)
    t0 = min(_wall(lambda: run(M), sync) for _ in range(2))
    cpu_s = {}

    def probe(p):
        run(M - p)
        tms = []
        for _ in range(2):
            tm = {}
            run(M - p, timings=tm)
            tms.append(tm["cpu_s"])
        cpu_s[p] = min(tms)

    probe(64)
    # the 64-row block's time per row over-estimates the rate (it carries the fixed cost), so
    # the rows that fit in T0 by it are a safe upper bound for the larger probe
    fit = int(t0 / (cpu_s[64] / 64)) // 64 * 64
    hi = max(128, min(M - 64, M // 16 // 64 * 64, fit))
    if hi > 64 and hi < M:
        probe(hi)
    probes = sorted(cpu_s)
    hi, lo = probes[-1], probes[0]
    row_s = (cpu_s[hi] - cpu_s[lo]) / (hi - lo) if hi > lo else cpu_s[hi] / hi
    return {"gpu_rate": 2.0 * M * N * K / t_gemm, "link_bw": K * N * s / t_link,
            "cpu_rate": 2.0 * hi * N * K / cpu_s[hi], "gpu_only_s": t0,
            "gpu_fixed_s": t_link if A.device.type == "cpu" else 0.0,
            "cpu_fixed_s": max(0.0, cpu_s[lo] - lo * row_s), "cpu_row_s": max(row_s, 1e-12),
            "cpu_probe_s": {str(p): t for p, t in cpu_s.items()}}


def search_split(A, B, gpu, *, run, gpu_matmul, target: str, mode: str,
                 prior_fraction: float, rounds: int = 3, log: bool = True, root=None,
                 device_name: str = "", host_cpus: int = 0, baselines: dict | None = None) -> dict:
    """Steps 1–4 of the module doc for one case.  ``run(gpu_rows, timings=None)`` computes the
    whole product with that split (``lcmac.api.coexec.run_split``).  ``baselines``: name → a call
    computing the same product another way (e.g. plain torch), timed in the same rounds."""
    import torch
    M, K = A.shape
    N = B.shape[1]
    dtype = str(A.dtype).replace("torch.", "")
    inputs = "device" if A.device.type == "cuda" else "host"
    rates = calibrate(A, B, gpu, run=run, gpu_matmul=gpu_matmul)
    rate_model = predict_split(M, N, K, ITEMSIZE[dtype], inputs=inputs, gpu_rate=rates["gpu_rate"],
                               cpu_rate=rates["cpu_rate"], link_bw=rates["link_bw"])
    pred = predict_split_measured(M, rates["gpu_only_s"], rates["gpu_fixed_s"],
                                  rates["cpu_fixed_s"], rates["cpu_row_s"])
    f = pred.cpu_fraction
    fractions = {0.0, f, prior_fraction, rate_model.cpu_fraction, f / 2, f * 1.5, f * 2,
                 64 / M}
    rows = sorted({split_rows(M, min(1.0, x)) for x in fractions}, reverse=True)
    cpu_side = {g: rates["cpu_fixed_s"] + (M - g) * rates["cpu_row_s"] for g in rows if g < M}
    untimed = {g: t for g, t in cpu_side.items() if t > 2 * rates["gpu_only_s"]}
    rows = [g for g in rows if g not in untimed]
    baselines = baselines or {}
    for g in rows:                                        # first calls of every split: warm
        run(g)
    for fn in baselines.values():
        fn()
    times = {g: [] for g in rows}
    base_times = {name: [] for name in baselines}
    for _ in range(rounds):
        for g in rows:
            times[g].append(_wall(lambda g=g: run(g), torch.cuda.synchronize))
        for name, fn in baselines.items():
            base_times[name].append(_wall(fn, torch.cuda.synchronize))
    med = {g: statistics.median(ts) for g, ts in times.items()}
    best = min(med, key=med.get)
    frac = {g: (M - g) / M for g in [*rows, *untimed]}

    def timed(x):                      # a prediction's measured time; None where not timed
        return med.get(split_rows(M, min(1.0, x)))
    out = {"shape": [M, N, K], "dtype": dtype, "inputs": inputs, "gpu_mode": mode,
           "rates": rates, "calibrated_fraction": f, "calibrated_predicted_s": pred.t_split,
           "rate_model_fraction": rate_model.cpu_fraction, "prior_fraction": prior_fraction,
           "candidates": [[frac[g], med[g], (max(times[g]) - min(times[g])) / med[g]] for g in rows],
           "gpu_only_s": med[M], "best_fraction": frac[best], "best_s": med[best],
           "untimed": [[frac[g], t] for g, t in sorted(untimed.items(), reverse=True)],
           "calibrated_s": timed(f),
           "rate_model_s": timed(rate_model.cpu_fraction),
           "prior_s": timed(prior_fraction),
           "baselines_s": {name: statistics.median(ts) for name, ts in base_times.items()}}
    if log:
        append_split(make_split_record(
            target=target, dtype=dtype, shape=(M, N, K), inputs=inputs, gpu_mode=mode,
            cpu_fraction=frac[best], time_s=med[best], gpu_only_s=med[M],
            predicted_fraction=f, candidates=[[frac[g], med[g]] for g in rows], rates=rates,
            device=device_name, host_cpus=host_cpus), root)
    return out
