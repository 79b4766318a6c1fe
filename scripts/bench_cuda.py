#!/usr/bin/env python
"""Benchmark and check lcmac CUDA artifacts against torch.matmul (cuBLAS) in one run.

    python scripts/bench_cuda.py --dtype bf16 --cases square llm      # builds what is missing
    python scripts/bench_cuda.py --artifacts .cuda-art                # prebuilt artifacts only

For every case (shape × variant): correctness against a float64 reference (‖C−ref‖/‖ref‖,
next to cuBLAS's own error on the same inputs; the output is poisoned with NaN first), then
the median of ≥ 20 timed runs (CUDA events, after warm-up, rotating among several input sets).
Effective TFLOP/s = 2·M·N·K / t for every variant.  Writes bench/results/<gpu>-<dtype>.json
(or --out) and a plot PNG; prints a short table last.
"""
from __future__ import annotations

import argparse
import datetime
import glob
import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

SQUARE = [4096, 8192, 16384]
#: the step table (FalconGEMM Fig. 7) and the split-group ablation, in that order
# (the fused forms without the cache-aware order, "-nca", hang: the build refuses them)
STEPS = ["strassen-alg1-rfast", "strassen-alg1", "strassen-sg-ov", "strassen-fused-ov", "strassen-pw-ov", "strassen-fused", "strassen-tr"]
V1 = {"stages": 3, "policy": "square"}          # the first measured configuration
VARIANTS = {   # name → (algorithm, config); configs spelled out (defaults change with tuning)
    "tl-gemm-v1": (None, dict(V1)),
    "tl-gemm": (None, {"stages": 4, "policy": "fullrow"}),
    # step table: Algorithm 1 → cache-aware order → fused group-parallel → overlapped epilogue
    "strassen-alg1-rfast": ("strassen", {"fused": False, "cache_aware": False, "stages": 4, "policy": "fullrow"}),
    "strassen-alg1": ("strassen", {"fused": False, "stages": 4, "policy": "fullrow"}),
    "strassen-fused": ("strassen", {"fused": True, "stages": 4, "policy": "fullrow"}),
    "strassen-fused-ov": ("strassen", {"fused": True, "overlap_epilogue": True, "stages": 4, "policy": "fullrow"}),
    # FalconGEMM Fig. 7 steps, all with the single software pipeline (overlap_epilogue):
    # fused group-parallel without the cache-aware order → + split-group persistent
    # scheduling → + cache-aware order; "-pw": persistent, groups never split
    "strassen-fused-nca-ov": ("strassen", {"fused": True, "cache_aware": False, "overlap_epilogue": True, "stages": 4, "policy": "fullrow"}),
    "strassen-sg-nca-ov": ("strassen", {"fused": True, "split_group": True, "cache_aware": False, "overlap_epilogue": True, "stages": 4, "policy": "fullrow"}),
    "strassen-sg-ov": ("strassen", {"fused": True, "split_group": True, "overlap_epilogue": True, "stages": 4, "policy": "fullrow"}),
    "strassen-pw-ov": ("strassen", {"fused": True, "persistent": True, "overlap_epilogue": True, "stages": 4, "policy": "fullrow"}),
    # one pipeline per product (no overlap): the persistent form spills (208 B at 6144³)
    "strassen-fused-nca": ("strassen", {"fused": True, "cache_aware": False, "stages": 4, "policy": "fullrow"}),
    "strassen-sg": ("strassen", {"fused": True, "split_group": True, "stages": 4, "policy": "fullrow"}),
    "winograd-sg": ("winograd", {"fused": True, "split_group": True, "stages": 4, "policy": "fullrow"}),
    "winograd-alg1": ("winograd", {"fused": False, "stages": 4, "policy": "fullrow"}),
    "strassen^2-alg1": ("strassen^2", {"fused": False, "stages": 4, "policy": "fullrow"}),
    "strassen^2-alg1-s3": ("strassen^2", {"fused": False, "stages": 3, "policy": "fullrow"}),
    "strassen-alg1-s3": ("strassen", {"fused": False, "stages": 3, "policy": "fullrow"}),
    # float32 (TF32 GEMM stage): the square warp split measured faster there (docs/cuda-templates.md)
    "strassen-alg1-sq": ("strassen", {"fused": False, "stages": 4, "policy": "square"}),
    "strassen^2-alg1-sq": ("strassen^2", {"fused": False, "stages": 4, "policy": "square"}),
    # L2 raster panel (T.use_swizzle panel_size): the default 8 vs narrower/wider panels
    "tl-gemm-sw4": (None, {"stages": 4, "policy": "fullrow", "swizzle": 4}),
    "tl-gemm-sw16": (None, {"stages": 4, "policy": "fullrow", "swizzle": 16}),
    "strassen-alg1-sw4": ("strassen", {"fused": False, "stages": 4, "policy": "fullrow", "swizzle": 4}),
    "strassen-alg1-sw16": ("strassen", {"fused": False, "stages": 4, "policy": "fullrow", "swizzle": 16}),
    "strassen^2-alg1-sw16": ("strassen^2", {"fused": False, "stages": 4, "policy": "fullrow", "swizzle": 16}),
    "laderman-alg1": ("laderman", {"fused": False, "stages": 4, "policy": "fullrow"}),
    # scaled fp16 operands (CudaConfig.operands): "f16x2" = float32 split into hi + lo fp16
    # halves, 3 fp16 products (fp32-level error; compare with SGEMM); "f16s" = one scaled
    # fp16 operand (bf16 LCMAs at cuBLAS-level error; float32 at TF32-class error)
    "tl-gemm-f16x2": (None, {"operands": "fp16x2", "block_n": 128, "stages": 3, "policy": "fullrow"}),
    "strassen-alg1-f16x2": ("strassen", {"operands": "fp16x2", "fused": False, "block_n": 128, "stages": 3, "policy": "fullrow"}),
    "winograd-alg1-f16x2": ("winograd", {"operands": "fp16x2", "fused": False, "block_n": 128, "stages": 3, "policy": "fullrow"}),
    "strassen^2-alg1-f16x2": ("strassen^2", {"operands": "fp16x2", "fused": False, "block_n": 128, "stages": 3, "policy": "fullrow"}),
    # the fp16x2 tile sweep (2026-11-22): k slab, depth, a 128x192 tile, the square split
    "tl-gemm-f16x2-k32s5": (None, {"operands": "fp16x2", "block_n": 128, "block_k": 32, "stages": 5, "policy": "fullrow"}),
    "tl-gemm-f16x2-s2": (None, {"operands": "fp16x2", "block_n": 128, "stages": 2, "policy": "fullrow"}),
    "tl-gemm-f16x2-n192k32s5": (None, {"operands": "fp16x2", "block_n": 192, "block_k": 32, "stages": 5, "policy": "fullrow"}),
    "tl-gemm-f16x2-n192s2": (None, {"operands": "fp16x2", "block_n": 192, "stages": 2, "policy": "fullrow"}),
    "tl-gemm-f16x2-sq": (None, {"operands": "fp16x2", "block_n": 128, "stages": 3, "policy": "square"}),
    # E4M3 operands with 1x128 block scales (CudaConfig.operands="fp8"; bf16/fp16 in and
    # out): compared with cuBLAS's own FP8 GEMMs (cublas-fp8-* rows, --fp8-baseline)
    "tl-gemm-fp8": (None, {"operands": "fp8"}),
    "strassen-alg1-fp8": ("strassen", {"operands": "fp8", "fused": False}),
    "winograd-alg1-fp8": ("winograd", {"operands": "fp8", "fused": False}),
    "laderman-alg1-fp8": ("laderman", {"operands": "fp8", "fused": False}),
    "tl-gemm-fp8-s6": (None, {"operands": "fp8", "stages": 6}),
    "strassen-alg1-fp8-s6": ("strassen", {"operands": "fp8", "fused": False, "stages": 6}),
    "tl-gemm-f16s": (None, {"operands": "fp16", "stages": 4, "policy": "fullrow"}),
    "strassen-alg1-f16s": ("strassen", {"operands": "fp16", "fused": False, "stages": 4, "policy": "fullrow"}),
    "winograd-alg1-f16s": ("winograd", {"operands": "fp16", "fused": False, "stages": 4, "policy": "fullrow"}),
    "strassen^2-alg1-f16s": ("strassen^2", {"operands": "fp16", "fused": False, "stages": 4, "policy": "fullrow"}),
    # fused GEMM + Combine H with the epilogue on the TMA engine (CudaConfig.tma_reduce):
    # no H, no Combine-H pass; 3 stages beside the shared-memory output tile
    "strassen-tr": ("strassen", {"fused": True, "tma_reduce": True, "stages": 3, "policy": "fullrow"}),
    "winograd-tr": ("winograd", {"fused": True, "tma_reduce": True, "stages": 3, "policy": "fullrow"}),
    "strassen^2-tr": ("strassen^2", {"fused": True, "tma_reduce": True, "stages": 3, "policy": "fullrow"}),
    "winograd^2-tr": ("winograd^2", {"fused": True, "tma_reduce": True, "stages": 3, "policy": "fullrow"}),
    # 2-CTA clusters sharing each B slab by TMA multicast (CudaConfig.cluster)
    "tl-gemm-c2": (None, {"stages": 4, "policy": "fullrow", "cluster": 2}),
    "strassen-alg1-c2": ("strassen", {"fused": False, "stages": 4, "policy": "fullrow", "cluster": 2}),
    "strassen-alg1-s3-c2": ("strassen", {"fused": False, "stages": 3, "policy": "fullrow", "cluster": 2}),
    "strassen^2-alg1-s3-c2": ("strassen^2", {"fused": False, "stages": 3, "policy": "fullrow", "cluster": 2}),
    "winograd-alg1-c2": ("winograd", {"fused": False, "stages": 4, "policy": "fullrow", "cluster": 2}),
    # the output tile stored through shared memory + TMA (CudaConfig.store_via_smem)
    "tl-gemm-smem": (None, {"stages": 4, "policy": "fullrow", "store_via_smem": True}),
    "tl-gemm-c2-smem": (None, {"stages": 4, "policy": "fullrow", "cluster": 2, "store_via_smem": True}),
    "strassen-alg1-s3-smem": ("strassen", {"fused": False, "stages": 3, "policy": "fullrow", "store_via_smem": True}),
    "strassen-alg1-smem": ("strassen", {"fused": False, "stages": 4, "policy": "fullrow", "store_via_smem": True}),
    "strassen-alg1-s3-c2-smem": ("strassen", {"fused": False, "stages": 3, "policy": "fullrow", "cluster": 2, "store_via_smem": True}),
    "strassen^2-alg1-s3-smem": ("strassen^2", {"fused": False, "stages": 3, "policy": "fullrow", "store_via_smem": True}),
    "strassen^2-alg1-s3-c2-smem": ("strassen^2", {"fused": False, "stages": 3, "policy": "fullrow", "cluster": 2, "store_via_smem": True}),
    "winograd-alg1-smem": ("winograd", {"fused": False, "stages": 4, "policy": "fullrow", "store_via_smem": True}),
    # the output tile stored from registers (store_via_smem=False, the default before v2)
    "tl-gemm-direct": (None, {"stages": 4, "policy": "fullrow", "store_via_smem": False}),
    "strassen-alg1-s3-direct": ("strassen", {"fused": False, "stages": 3, "policy": "fullrow", "store_via_smem": False}),
    "tl-gemm-v1-direct": (None, dict(V1, store_via_smem=False)),
    "strassen-alg1-sq-direct": ("strassen", {"fused": False, "stages": 4, "policy": "square", "store_via_smem": False}),
    "strassen-alg1-f16s-direct": ("strassen", {"operands": "fp16", "fused": False, "stages": 4, "policy": "fullrow", "store_via_smem": False}),
    "tl-gemm-fp8-direct": (None, {"operands": "fp8", "store_via_smem": False}),
    "strassen-alg1-fp8-direct": ("strassen", {"operands": "fp8", "fused": False, "store_via_smem": False}),
    # combine tiles (combine_rows x combine_cols, 256 threads): the default 16 x 256 vs fewer /
    # more elements per thread
    "strassen^2-alg1-s3-cr4": ("strassen^2", {"fused": False, "stages": 3, "policy": "fullrow", "combine_rows": 4}),
    "strassen^2-alg1-s3-cr8": ("strassen^2", {"fused": False, "stages": 3, "policy": "fullrow", "combine_rows": 8}),
    "strassen^2-alg1-s3-cr32": ("strassen^2", {"fused": False, "stages": 3, "policy": "fullrow", "combine_rows": 32}),
    "strassen-alg1-s3-cr4": ("strassen", {"fused": False, "stages": 3, "policy": "fullrow", "combine_rows": 4}),
    "strassen-alg1-s3-cr8": ("strassen", {"fused": False, "stages": 3, "policy": "fullrow", "combine_rows": 8}),
    "strassen-alg1-s3-cr32": ("strassen", {"fused": False, "stages": 3, "policy": "fullrow", "combine_rows": 32}),
    "tl-gemm-c2-sw16": (None, {"stages": 4, "policy": "fullrow", "cluster": 2, "swizzle": 16}),
    "strassen-alg1-s3-c2-sw16": ("strassen", {"fused": False, "stages": 3, "policy": "fullrow", "cluster": 2, "swizzle": 16}),
    # the persistent GEMM stage (persistent=True, unfused: one pipeline over every (tile, k)
    # step of P CTAs; 3 stages beside the output tile's shared memory)
    "tl-gemm-p": (None, {"stages": 3, "policy": "fullrow", "persistent": True}),
    "strassen-alg1-p": ("strassen", {"fused": False, "stages": 3, "policy": "fullrow", "persistent": True}),
    "winograd-alg1-p": ("winograd", {"fused": False, "stages": 3, "policy": "fullrow", "persistent": True}),
    "strassen^2-alg1-p": ("strassen^2", {"fused": False, "stages": 3, "policy": "fullrow", "persistent": True}),
    "fg-4x4x5-r61-alg1": ("fg-4x4x5-r61", {"fused": False, "stages": 4, "policy": "fullrow"}),
    # combine tiles one or a few rows high and 1024-4096 columns wide: every thread of a warp
    # reads one contiguous run of each input (the 16 x 256 tile, an earlier default,
    # reads 512 B runs 8 KB apart).  "-cr4": 4 x 256, the default since (the same config as
    # the variant without the suffix now; measured when the default was 16 rows)
    "strassen-alg1-p-cc1024": ("strassen", {"fused": False, "stages": 3, "policy": "fullrow", "persistent": True, "combine_rows": 4, "combine_cols": 1024}),
    "strassen-alg1-p-cc4096": ("strassen", {"fused": False, "stages": 3, "policy": "fullrow", "persistent": True, "combine_rows": 1, "combine_cols": 4096}),
    "strassen^2-alg1-p-cc1024": ("strassen^2", {"fused": False, "stages": 3, "policy": "fullrow", "persistent": True, "combine_rows": 4, "combine_cols": 1024}),
    "strassen^2-alg1-p-cc1024r2": ("strassen^2", {"fused": False, "stages": 3, "policy": "fullrow", "persistent": True, "combine_rows": 2, "combine_cols": 1024}),
    "strassen^2-alg1-p-cc4096": ("strassen^2", {"fused": False, "stages": 3, "policy": "fullrow", "persistent": True, "combine_rows": 1, "combine_cols": 4096}),
    "strassen-alg1-p-cr4": ("strassen", {"fused": False, "stages": 3, "policy": "fullrow", "persistent": True, "combine_rows": 4}),
    "winograd-alg1-p-cr4": ("winograd", {"fused": False, "stages": 3, "policy": "fullrow", "persistent": True, "combine_rows": 4}),
    "strassen^2-alg1-p-cr4": ("strassen^2", {"fused": False, "stages": 3, "policy": "fullrow", "persistent": True, "combine_rows": 4}),
    "dps48-alg1-p-cc1024r2": ("dps-4x4x4-r48", {"fused": False, "stages": 3, "policy": "fullrow", "persistent": True, "combine_rows": 2, "combine_cols": 1024}),
    # 48 products of a 4x4x4 grid (Dumas-Pernet-Sedoglavic, rational W) against Strassen²'s 49
    # and a flip-graph 49 (same grid, no Kronecker structure); "-cr4": combine tiles of 4 rows
    # (with the 16-row default of the time DPS's Combine A took 237 registers: one CTA per
    # SM; "dps48-alg1-p" without the suffix is the 4-row default now).
    # Strassen ⊗ DPS (<8,8,8;336>) is not listed: its group-parallel combines spill 14-15 KB
    # per thread (64 inputs, 336 outputs per element)
    "dps48-alg1-p": ("dps-4x4x4-r48", {"fused": False, "stages": 3, "policy": "fullrow", "persistent": True}),
    "dps48-alg1-p-cr4": ("dps-4x4x4-r48", {"fused": False, "stages": 3, "policy": "fullrow", "persistent": True, "combine_rows": 4}),
    "fg49-alg1-p": ("fgr-4x4x4-r49", {"fused": False, "stages": 3, "policy": "fullrow", "persistent": True}),
    # single-block operands read in place by the batched GEMM (CudaConfig.direct_views):
    # Strassen 2 of 7 per side, Winograd 3, Strassen² 4 of 49, Winograd² 9 of 49, Laderman 9 of 23
    "strassen-alg1-p-v": ("strassen", {"fused": False, "stages": 3, "policy": "fullrow", "persistent": True, "direct_views": "ab"}),
    "strassen-alg1-p-va": ("strassen", {"fused": False, "stages": 3, "policy": "fullrow", "persistent": True, "direct_views": "a"}),
    "winograd-alg1-p-v": ("winograd", {"fused": False, "stages": 3, "policy": "fullrow", "persistent": True, "direct_views": "ab"}),
    "strassen^2-alg1-p-v": ("strassen^2", {"fused": False, "stages": 3, "policy": "fullrow", "persistent": True, "direct_views": "ab"}),
    "winograd^2-alg1-p": ("winograd^2", {"fused": False, "stages": 3, "policy": "fullrow", "persistent": True}),
    "winograd^2-alg1-p-v": ("winograd^2", {"fused": False, "stages": 3, "policy": "fullrow", "persistent": True, "direct_views": "ab"}),
    "laderman-alg1-p": ("laderman", {"fused": False, "stages": 3, "policy": "fullrow", "persistent": True}),
    "laderman-alg1-p-v": ("laderman", {"fused": False, "stages": 3, "policy": "fullrow", "persistent": True, "direct_views": "ab"}),
    # more schemes and Combine-H forms, for checking the accuracy model
    # (lcmac.costmodel.accuracy; scripts/check_accuracy.py)
    "winograd-fused": ("winograd", {"fused": True, "stages": 4, "policy": "fullrow"}),
    "strassen^2-fused": ("strassen^2", {"fused": True, "stages": 4, "policy": "fullrow"}),
    "laderman-fused": ("laderman", {"fused": True, "stages": 4, "policy": "fullrow"}),
    "hk-alg1": ("hopcroft-kerr", {"fused": False, "stages": 4, "policy": "fullrow"}),
    "fgr333-alg1": ("fgr-3x3x3-r23", {"fused": False, "stages": 4, "policy": "fullrow"}),
    "laderman-alg1-f16s": ("laderman", {"operands": "fp16", "fused": False, "stages": 4, "policy": "fullrow"}),
    "laderman-alg1-sq": ("laderman", {"fused": False, "stages": 4, "policy": "square"}),
    "winograd-alg1-sq": ("winograd", {"fused": False, "stages": 4, "policy": "square"}),
    # AlphaTensor's <4,4,4;49>: 2 single blocks per side with +1, 6 with −1 (read in place,
    # the sign moved into Combine H)
    "at49-alg1-p": ("at-4x4x4-r49", {"fused": False, "stages": 3, "policy": "fullrow", "persistent": True, "direct_views": "none"}),
    "at49-alg1-p-v": ("at-4x4x4-r49", {"fused": False, "stages": 3, "policy": "fullrow", "persistent": True, "direct_views": "ab"}),
    # more schemes in the scaled operand modes, to check the accuracy model on
    "strassen^2-alg1-fp8": ("strassen^2", {"operands": "fp8", "fused": False}),
    "laderman-alg1-f16x2": ("laderman", {"operands": "fp16x2", "fused": False, "block_n": 128, "stages": 3, "policy": "fullrow"}),
    "hk-alg1-f16x2": ("hopcroft-kerr", {"operands": "fp16x2", "fused": False, "block_n": 128, "stages": 3, "policy": "fullrow"}),
}
LLM_NK = [(18432, 7168), (7168, 18432), (8192, 4096), (4096, 8192), (7168, 16384)]


def build_one(algo, cfg, shape, dtype, target, out_dir, jobs=1):
    os.makedirs(out_dir, exist_ok=True)
    side = os.path.join(out_dir, "lcmac.json")
    if os.path.exists(side):
        return side
    req = {"algorithm": algo, "target": target, "dtype": dtype, "shape": list(shape),
           "config": cfg, "out_dir": out_dir, "name": "lcmac", "jobs": jobs}
    p = subprocess.run([sys.executable, "-m", "lcmac.targets.tilelang_worker"],
                       input=json.dumps(req), capture_output=True, text=True, cwd=ROOT)
    line = [x for x in p.stdout.splitlines() if x.startswith("{")]
    resp = json.loads(line[-1]) if line else {"ok": False, "error": p.stderr[-2000:]}
    if not resp.get("ok"):
        print(f"BUILD FAILED {algo} {cfg} {shape}: {resp.get('error', '')[:800]}", flush=True)
        return BuildFailed(str(resp.get("error", ""))[:500])
    return side


class BuildFailed(str):
    """build_one's answer for an artifact the build refused (its error): the run records it
    as an error row, so a refused variant shows in the results instead of vanishing."""


def detect_sms():
    """SMs of the GPU present (None without one), asked in a subprocess so that the build
    step needs no CUDA context."""
    p = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.get_device_properties(0)"
                        ".multi_processor_count if torch.cuda.is_available() else '')"],
                       capture_output=True, text=True)
    out = p.stdout.strip().splitlines()
    return int(out[-1]) if p.returncode == 0 and out and out[-1].isdigit() else None


def bench_fn(fn, inputs, warmup=5, reps=20):
    import torch
    for i in range(warmup):
        fn(*inputs[i % len(inputs)])
    torch.cuda.synchronize()
    ts = []
    for i in range(reps):
        a = inputs[i % len(inputs)]
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn(*a)
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e) * 1e-3)
    ts.sort()
    return ts[len(ts) // 2], ts


def probe_record(probe: str, **fields) -> dict:
    """The head of a probe's JSON record (scripts/probe_*.py): what it measures, on which GPU,
    when (UTC) and the command that repeats it; then ``fields``."""
    import torch
    return {"probe": probe, "device": torch.cuda.get_device_name(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join([os.path.basename(sys.executable)] + sys.argv), **fields}


def sustained(fn, seconds, nvml=None):
    """Back-to-back calls for about ``seconds`` (after one call to size the run): seconds per
    call, and with an NVML handle (probe_energy.Nvml) joules per call and the mean SM clock
    (MHz) over the run, else None for both.  Long enough runs reach the board's power cap
    (an H100 SXM sits at 700 W within ~0.2 s), which the median of separated calls does not."""
    import torch
    fn()
    torch.cuda.synchronize()
    t0 = time.time()
    fn()
    torch.cuda.synchronize()
    n = max(3, int(seconds / max(time.time() - t0, 1e-4)))
    clocks, stop = [], threading.Event()

    def sample():
        while not stop.is_set():
            clocks.append(nvml.sm_clock())
            time.sleep(0.02)

    th = threading.Thread(target=sample) if nvml else None
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0 = nvml.energy_j() if nvml else None
    if th:
        th.start()
    s.record()
    for _ in range(n):
        fn()
    e.record()
    e.synchronize()
    stop.set()
    if th:
        th.join()
    t = s.elapsed_time(e) * 1e-3 / n
    if not nvml:
        return t, None, None
    return t, (nvml.energy_j() - e0) / n, sum(clocks) / max(len(clocks), 1)


def burst_and_sustained(name, fn, flops, reps, seconds, into):
    """``into[name]``: the median of ``reps`` separated calls and the mean over ``seconds`` of
    back-to-back calls (``sustained``), with TFLOP/s for ``flops`` per call; printed."""
    t = bench_fn(fn, [()], warmup=3, reps=reps)[0]
    ts = sustained(fn, seconds)[0]
    into[name] = {"burst_s": t, "sustained_s": ts, "burst_tflops": flops / t / 1e12,
                  "sustained_tflops": flops / ts / 1e12}
    print(f"{name:16s} burst {t * 1e3:8.3f} ms {flops / t / 1e12:6.1f} TFLOP/s   "
          f"sustained {ts * 1e3:8.3f} ms {flops / ts / 1e12:6.1f} TFLOP/s", flush=True)


def load_artifact(path):
    """A CUDA artifact from an ``lcmac build`` manifest or a worker response (lcmac.json)."""
    import lcmac
    from lcmac.runtime.cuda_loader import load_cuda
    with open(path) as fh:
        meta = json.load(fh)
    return lcmac.load(path) if "format" in meta else load_cuda(path)


def kernel_launchers(f, A, B, C, ws_ptr=None):
    """{kernel name: launch(stream)} for one artifact through its exported per-kernel
    launchers, on the given workspace (default: the artifact's own)."""
    import ctypes
    lib = f._open(A.device)
    meta = f.meta
    if ws_ptr is None:
        ws_ptr = f.workspace(A.device).data_ptr()
    bufs = {"A": A.data_ptr(), "B": B.data_ptr(), "C": C.data_ptr()}
    for name, off in meta.get("workspace", []):
        bufs[name] = ws_ptr + int(off)
    out = {}
    for k in meta["kernels"]:
        fn = getattr(lib, f"{meta.get('name', 'lcmac')}_{k['name']}_call")
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p] * (len(k["args"]) + 1)

        def launch(stream, fn=fn, args=[bufs[a] for a in k["args"]]):
            if fn(*args, stream) != 0:
                raise RuntimeError(f"{fn.__name__} failed")
        out[k["name"]] = launch
    return out


def stage_times(f, A, B, C, reps=10):
    """Time each kernel of an artifact alone."""
    import torch
    stream = torch.cuda.current_stream().cuda_stream
    return {name: bench_fn(lambda: launch(stream), [()], warmup=2, reps=reps)[0]
            for name, launch in kernel_launchers(f, A, B, C).items()}


def _fp8_blocks(X, dim):
    """X quantized to E4M3 with one float32 scale per 128 elements along ``dim`` (the
    scale maps each block's amax to 448): (X8, scales with dim's extent divided by 128)."""
    import torch
    Xt = X.float().movedim(dim, -1)
    blocks = Xt.reshape(*Xt.shape[:-1], -1, 128)
    amax = blocks.abs().amax(-1, keepdim=True).clamp(min=1e-30)
    q = (blocks * (448.0 / amax)).to(torch.float8_e4m3fn).reshape(Xt.shape).movedim(-1, dim)
    return q, (amax.squeeze(-1) / 448.0).movedim(-1, dim)


def cublas_fp8_modes(A, B):
    """cuBLAS's FP8 GEMMs (torch._scaled_mm, E4M3, bf16 out) on operands quantized beforehand
    (the quantization is not timed: that favours cuBLAS): [(mode, fn(), rel-err-ready C)].
    "tensor": one scale per operand; "row": per row of A and column of B; "1x128": per 128 K
    of every row of A and column of B, lcmac's own scaling, when this torch/cuBLAS has it.
    A mode the library refuses is left out (its error is printed)."""
    import torch
    out = []
    Bt = B.t().contiguous()                      # (N, K): _scaled_mm wants B column-major
    sa_t = A.float().abs().amax() / 448.0
    sb_t = B.float().abs().amax() / 448.0
    a_t = (A.float() / sa_t).to(torch.float8_e4m3fn)
    b_t = (Bt.float() / sb_t).to(torch.float8_e4m3fn)
    sa_r = A.float().abs().amax(1, keepdim=True).clamp(min=1e-30) / 448.0
    sb_r = Bt.float().abs().amax(1, keepdim=True).clamp(min=1e-30) / 448.0
    a_r = (A.float() / sa_r).to(torch.float8_e4m3fn)
    b_r = (Bt.float() / sb_r).to(torch.float8_e4m3fn)
    a_b, sa_b = _fp8_blocks(A, 1)                # sa_b (M, K/128)
    b_b, sb_b = _fp8_blocks(Bt, 1)               # sb_b (N, K/128)
    tries = [("tensor", lambda: torch._scaled_mm(a_t, b_t.t(), sa_t, sb_t, out_dtype=A.dtype)),
             ("row", lambda: torch._scaled_mm(a_r, b_r.t(), sa_r, sb_r.t(), out_dtype=A.dtype))]
    # blockwise 1x128 × 1x128: scales "outer-dim major" (M-major / N-major), the layout
    # cuBLAS's VEC128 mode reads; then the plain contiguous layout
    sa_mm = sa_b.t().contiguous().t()
    sb_nn = sb_b.t().contiguous()                # (K/128, N)
    tries += [("1x128", lambda: torch._scaled_mm(a_b, b_b.t(), sa_mm, sb_nn, out_dtype=A.dtype)),
              ("1x128", lambda: torch._scaled_mm(a_b, b_b.t(), sa_b, sb_b.t(), out_dtype=A.dtype))]
    seen = set()
    C16 = (A @ B).float()
    for mode, fn in tries:
        if mode in seen:
            continue
        try:
            C = fn()
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - a mode this torch/cuBLAS lacks
            print(f"cuBLAS fp8 {mode}: not available ({type(e).__name__}: {str(e)[:160]})", flush=True)
            continue
        dev = float(torch.linalg.norm(C.float() - C16) / torch.linalg.norm(C16))
        if dev > 0.2:      # E4M3 lands within a few % of the bf16 product: a misread scale layout
            print(f"cuBLAS fp8 {mode}: left out, {dev:.2f} relative to the bf16 product "
                  f"(scale layout misread)", flush=True)
            continue
        seen.add(mode)
        out.append((mode, fn, C))
    return out


def rel_err(C, ref):
    import torch
    d = (C.double() - ref)
    return float(torch.linalg.norm(d) / torch.linalg.norm(ref))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog="variants: " + ", ".join(VARIANTS) + "; plus 'steps' "
                                        "(the step table: " + ", ".join(STEPS) + ")")
    ap.add_argument("--dtype", default="bf16", help="bf16, fp16 or fp32 (default bf16)")
    ap.add_argument("--target", default="cuda-sm90a", help="lcmac target the artifacts are built for")
    ap.add_argument("--artifacts", default=None, help="use prebuilt artifact dirs (*/lcmac.json)")
    ap.add_argument("--build-dir", default=os.path.join(ROOT, ".cuda-art"),
                    help="where missing artifacts are built (reused when present)")
    ap.add_argument("--cases", nargs="*", default=["square"],
                    help="square (--sizes) and/or llm (bench/llm_shapes.json: --llm-m x (N, K))")
    ap.add_argument("--variants", nargs="*", default=["tl-gemm", "strassen-alg1", "strassen^2-alg1"],
                    help="lcmac kernels to measure beside cuBLAS (names below)")
    ap.add_argument("--sizes", nargs="*", type=int, default=SQUARE, help="square sizes n (n x n x n)")
    ap.add_argument("--llm-m", nargs="*", type=int, default=[2048, 8192, 16384],
                    help="M of the LLM cases (tokens)")
    ap.add_argument("--llm-max", type=int, default=6, help="how many of the (N, K) weights")
    ap.add_argument("--reps", type=int, default=20, help="timed runs per kernel (the median is kept)")
    ap.add_argument("--jobs", type=int, default=8, help="artifacts built in parallel")
    ap.add_argument("--stages", action="store_true", help="also time each kernel alone")
    ap.add_argument("--prepared-b", action="store_true",
                    help="also time calls with B combined once beforehand (f.prepare_b: static "
                         "weights; the preparation is not timed), where the artifact supports it")
    ap.add_argument("--sustained", type=float, default=0.0, metavar="S",
                    help="also time S seconds of back-to-back calls per variant and cuBLAS "
                         "(the power-capped regime of long jobs; sustained_ratio)")
    ap.add_argument("--tf32", action="store_true", help="cuBLAS float32 baseline with TF32 on")
    ap.add_argument("--fp8-baseline", action="store_true",
                    help="also time cuBLAS's FP8 GEMMs (torch._scaled_mm) on pre-quantized operands; "
                         "on by default when a variant runs operands='fp8'")
    ap.add_argument("--out", default=None,
                    help="the JSON written (default bench/results/<gpu>-<dtype>.json; a plot beside it)")
    ap.add_argument("--no-plot", action="store_true", help="skip the PNG plot")
    ap.add_argument("--build-only", action="store_true", help="build the artifacts, measure nothing")
    ap.add_argument("--resume", action="store_true",
                    help="keep the rows already in --out; measure only the (shape, variant) pairs missing")
    ap.add_argument("--watchdog", type=float, default=90.0,
                    help="seconds one variant may take; past it, record a timeout row and exit 3")
    args = ap.parse_args()

    from lcmac.core.dtypes import normalize_dtype
    dtype = normalize_dtype(args.dtype)
    shapes = []
    if "square" in args.cases:
        shapes += [(s, s, s) for s in args.sizes]
    if "llm" in args.cases:
        for (n, k) in LLM_NK[:args.llm_max]:   # from bench/llm_shapes.json (DeepSeek-R1, Qwen3)
            for m in args.llm_m:
                shapes.append((m, n, k))

    # ---- artifacts: prebuilt, or build the missing ones in parallel --------------------------
    todo, failed = [], []
    if args.artifacts:
        for side in sorted(glob.glob(os.path.join(args.artifacts, "*", "lcmac.json"))):
            meta = json.load(open(side))
            tag = os.path.basename(os.path.dirname(side))
            todo.append((tag, side, meta))
    else:
        jobs = []
        variants = [x for v in args.variants for x in (STEPS if v == "steps" else [v])]
        sms = detect_sms()
        for (M, N, K) in shapes:
            for v in variants:
                algo, cfg = VARIANTS[v]
                # a variant silent on them keeps the grid GEMM stage and the written operands
                # it was measured with (the sm_90a defaults became the persistent GEMM stage,
                # the "-p" variants, and operands read in place, the "-v" variants)
                cfg = {"persistent": False, "direct_views": "none", **cfg}
                if sms and (cfg.get("split_group") or cfg.get("persistent")):
                    cfg = dict(cfg, persistent_ctas=sms)    # the persistent grid fills this GPU
                d = os.path.join(args.build_dir, f"{v.replace('^', 'sq')}-{dtype}-{M}x{N}x{K}")
                jobs.append((v, algo, cfg, (M, N, K), d))
        t0 = time.time()
        with ThreadPoolExecutor(max_workers=args.jobs) as ex:
            sides = list(ex.map(lambda j: build_one(j[1], j[2], j[3], dtype, args.target, j[4]), jobs))
        print(f"built {len(jobs)} artifacts in {time.time() - t0:.0f}s", flush=True)
        if args.build_only:
            return
        for j, side in zip(jobs, sides):
            if isinstance(side, BuildFailed):
                failed.append({"shape": list(j[3]), "variant": j[0], "algorithm": j[1],
                               "config": j[2], "error": f"build failed: {side}"})
            elif side:
                todo.append((f"{j[0]}", side, json.load(open(side))))

    import torch
    from lcmac.runtime.cuda_loader import load_cuda
    torch.backends.cuda.matmul.allow_tf32 = bool(args.tf32)
    tdt = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[dtype]
    dev = torch.device("cuda")
    gpu = torch.cuda.get_device_name(dev)
    by_shape = {}
    for tag, side, meta in todo:
        if meta["dtype"] != dtype:
            continue
        by_shape.setdefault(tuple(meta["shape"]), []).append((tag, side, meta))

    gpu_tag = gpu.replace("NVIDIA ", "").replace(" ", "-").lower()
    out = args.out or os.path.join(ROOT, "bench", "results", f"{gpu_tag}-{dtype}.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)

    def save(rows, partial):
        res = {"device": gpu, "date": datetime.datetime.now().isoformat(timespec="seconds"),
               "command": " ".join(sys.argv), "dtype": dtype, "partial": partial,
               "torch": torch.__version__, "cublas_tf32": bool(args.tf32),
               "lcmac_gemm_precision": "per row (gemm_precision): tf32 for float32 unless the "
                                       "operands are scaled fp16" if dtype == "float32" else dtype,
               "timing": f"CUDA events, median of {args.reps} after 5 warm-ups, inputs rotated"
                         + (f"; sustained: {args.sustained:g} s of back-to-back calls (first inputs)"
                            if args.sustained else ""),
               "results": rows}
        json.dump(res, open(out, "w"), indent=1)
        return res

    rows = []
    if args.resume and os.path.exists(out):
        rows = json.load(open(out))["results"]
    done = {(tuple(r["shape"]), r["variant"]) for r in rows}
    rows += [r for r in failed if (tuple(r["shape"]), r["variant"]) not in done]
    runs = sum(1 for r in rows if r["variant"] == "cublas")
    for (M, N, K), arts in sorted(by_shape.items()):
        arts = [a for a in arts if ((M, N, K), a[0]) not in done]
        if not arts:
            continue
        g = torch.Generator(device=dev).manual_seed(M * 7 + N * 3 + K)
        nset = 3 if M * N * K <= 8192 ** 3 else 2
        inputs = [(torch.randn(M, K, device=dev, generator=g).to(tdt),
                   torch.randn(K, N, device=dev, generator=g).to(tdt)) for _ in range(nset)]
        A, B = inputs[0]
        ref = A.double() @ B.double()
        C_cub = torch.matmul(A, B)
        err_cub = rel_err(C_cub, ref)
        t_cub, _ = bench_fn(torch.matmul, inputs, reps=args.reps)
        flops = 2.0 * M * N * K
        runs += 1
        rows.append({"shape": [M, N, K], "variant": "cublas", "seconds": t_cub, "run": runs,
                     "tflops": flops / t_cub / 1e12, "rel_err": err_cub, "ratio": 1.0,
                     "mode": ("tf32" if args.tf32 else "fp32 (SGEMM)") if dtype == "float32" else dtype})
        ts_cub = None
        if args.sustained:
            C_s = torch.empty(M, N, dtype=tdt, device=dev)
            ts_cub = sustained(lambda: torch.matmul(A, B, out=C_s), args.sustained)[0]
            rows[-1].update(sustained_seconds=ts_cub, sustained_tflops=flops / ts_cub / 1e12,
                            sustained_ratio=1.0)
            del C_s
        t_other = None
        if dtype == "float32":
            # the other cuBLAS mode too, labelled: lcmac's GEMM stage is TF32, so TF32 cuBLAS
            # is the like-for-like baseline and true SGEMM the precision-equivalent one
            torch.backends.cuda.matmul.allow_tf32 = not args.tf32
            C_o = torch.matmul(A, B)
            t_other, _ = bench_fn(torch.matmul, inputs, reps=args.reps)
            torch.backends.cuda.matmul.allow_tf32 = bool(args.tf32)
            rows.append({"shape": [M, N, K], "variant": "cublas-sgemm" if args.tf32 else "cublas-tf32",
                         "seconds": t_other, "tflops": flops / t_other / 1e12,
                         "rel_err": rel_err(C_o, ref), "ratio": t_cub / t_other,
                         "mode": "fp32 (SGEMM)" if args.tf32 else "tf32"})
            del C_o
        t_fp8 = {}
        if args.fp8_baseline or any((m.get("config") or {}).get("operands") == "fp8" for _, _, m in arts):
            for mode, fn, C8 in cublas_fp8_modes(A, B):
                t8, _ = bench_fn(fn, [()], reps=args.reps)
                t_fp8[mode] = t8
                rows.append({"shape": [M, N, K], "variant": f"cublas-fp8-{mode}", "seconds": t8,
                             "tflops": flops / t8 / 1e12, "rel_err": rel_err(C8, ref),
                             "ratio": t_cub / t8, "run": runs,
                             "mode": f"fp8 e4m3, {mode} scales (quantized before timing)"})
                print(json.dumps(rows[-1]), flush=True)
                del C8
        for tag, side, meta in arts:
            r = {"shape": [M, N, K], "variant": tag, "algorithm": meta.get("algorithm_name"),
                 "config": meta.get("config"), "gemm_precision": meta.get("gemm_precision"),
                 "run": runs}

            def hung(r=r):
                # a kernel that never returns (seen once: the persistent kernel without the
                # overlapped pipeline, 4096³): keep what was measured, let the caller resume
                r["error"] = f"timeout: no result after {args.watchdog:.0f} s (kernel hang?)"
                rows.append(r)
                save(rows, partial=True)
                print(json.dumps(r), flush=True)
                os._exit(3)
            dog = threading.Timer(args.watchdog, hung)
            dog.daemon = True
            dog.start()
            try:
                f = load_cuda(side)
                C = torch.full((M, N), float("nan"), dtype=tdt, device=dev)
                f(A, B, out=C)
                torch.cuda.synchronize()
                r["all_written"] = bool(torch.isfinite(C).all())
                r["rel_err"] = rel_err(C, ref)
                r["err_vs_cublas"] = r["rel_err"] / err_cub
                outs = [torch.empty(M, N, dtype=tdt, device=dev) for _ in inputs]
                t, _ = bench_fn(lambda a, b, i=[0]: f(a, b, out=outs[0]), inputs, reps=args.reps)
                r.update(seconds=t, tflops=flops / t / 1e12, ratio=t_cub / t)
                if t_other is not None:
                    r["ratio_vs_" + ("sgemm" if args.tf32 else "tf32")] = t_other / t
                if (meta.get("config") or {}).get("operands") == "fp8":
                    for mode, t8 in t_fp8.items():
                        r[f"ratio_vs_cublas_fp8_{mode}"] = t8 / t
                if args.prepared_b and "kernels" in ((meta.get("extra") or {}).get("prepared_b") or {}):
                    preps = [f.prepare_b(b) for _, b in inputs]
                    Cp = f(A, preps[0])
                    torch.cuda.synchronize()
                    r["prepared_b_same_bits"] = bool(torch.equal(Cp, C))
                    tp, _ = bench_fn(lambda a, bp: f(a, bp, out=outs[0]),
                                     [(a, bp) for (a, _), bp in zip(inputs, preps)], reps=args.reps)
                    r.update(prepared_b_seconds=tp, prepared_b_tflops=flops / tp / 1e12,
                             prepared_b_ratio=t_cub / tp)
                    if ts_cub is not None:
                        tps = sustained(lambda: f(A, preps[0], out=outs[0]), args.sustained)[0]
                        r.update(prepared_b_sustained_tflops=flops / tps / 1e12,
                                 prepared_b_sustained_ratio=ts_cub / tps)
                    del preps, Cp
                if ts_cub is not None:
                    ts = sustained(lambda: f(A, B, out=outs[0]), args.sustained)[0]
                    r.update(sustained_seconds=ts, sustained_tflops=flops / ts / 1e12,
                             sustained_ratio=ts_cub / ts)
                if args.stages and len(meta.get("kernels", [])) > 1:
                    r["stage_seconds"] = stage_times(f, A, B, outs[0])
            except Exception as e:  # keep going: one broken variant must not hide the others
                r["error"] = f"{type(e).__name__}: {e}"[:500]
            dog.cancel()
            rows.append(r)
            print(json.dumps(r), flush=True)
            save(rows, partial=True)         # a call cut off by its time limit keeps these
        del inputs, A, B, ref, C_cub
        torch.cuda.empty_cache()

    res = save(rows, partial=False)
    if not args.no_plot:
        try:
            plot(res, out[:-5] + ".png")
        except Exception as e:
            print("plot failed:", e)
    print(f"\n{gpu}  {dtype}  (TFLOP/s = 2MNK/t, median of {args.reps}; ratio = cuBLAS time / time)")
    print(f"{'shape':>20} {'variant':>18} {'TFLOP/s':>8} {'ratio':>6} {'relerr':>9} {'err/cub':>7}"
          + (f" {'sust.':>6} {'ratio':>6}" if args.sustained else ""))
    for r in rows:
        s = "x".join(map(str, r["shape"]))
        if "error" in r:
            print(f"{s:>20} {r['variant']:>18} ERROR {r['error'][:80]}")
            continue
        st = " ".join(f"{k}={v * 1e3:.3f}ms" for k, v in r.get("stage_seconds", {}).items())
        sus = (f" {r['sustained_tflops']:6.1f} {r['sustained_ratio']:6.3f}"
               if "sustained_tflops" in r else "")
        if "prepared_b_ratio" in r:
            sus += f" prepB {r['prepared_b_ratio']:.3f}" + (
                f"/{r['prepared_b_sustained_ratio']:.3f}" if "prepared_b_sustained_ratio" in r else "")
        print(f"{s:>20} {r['variant']:>18} {r['tflops']:8.1f} {r['ratio']:6.3f} "
              f"{r['rel_err']:9.2e} {r.get('err_vs_cublas', 1.0):7.2f}{sus} {st}")
    print("wrote", out)


def plot(res, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = [r for r in res["results"] if "tflops" in r]
    shapes = sorted({tuple(r["shape"]) for r in rows})
    variants = sorted({r["variant"] for r in rows}, key=lambda v: (v != "cublas", v))
    fig, ax = plt.subplots(figsize=(max(6, len(shapes) * 1.2), 4))
    w = 0.8 / len(variants)
    for vi, v in enumerate(variants):
        ys = [next((r["tflops"] for r in rows if r["variant"] == v and tuple(r["shape"]) == s), 0)
              for s in shapes]
        ax.bar([i + vi * w for i in range(len(shapes))], ys, w, label=v)
    ax.set_xticks([i + 0.4 - w / 2 for i in range(len(shapes))])
    ax.set_xticklabels(["x".join(map(str, s)) for s in shapes], rotation=30, ha="right", fontsize=7)
    ax.set_ylabel("effective TFLOP/s (2MNK/t)")
    ax.set_title(f"{res['device']} {res['dtype']}")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
