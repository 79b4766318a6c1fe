#!/usr/bin/env python
"""Correctness and speed of lcmac CUDA artifacts whose buffers exceed 2³¹ elements (the LLM
vocabulary projections, N = 129280 / 151936), against cuBLAS, on the GPU present.

    python scripts/check_large_n.py --build-only --build-dir .cuda-art/large   # no GPU needed
    python scripts/check_large_n.py --build-dir .cuda-art/large --out res.json  # measure

Each case runs in a subprocess of its own (an illegal address poisons the CUDA context, so one
faulting artifact must not hide the others).  Reference: the float32 product of the same bf16
inputs (cuBLAS SGEMM, TF32 off); errors ‖C − ref‖/‖ref‖ summed in float64 over row chunks.
Timing: CUDA events, median of --reps after 3 warm-ups, one input set (these operands are far
larger than L2).  The output is poisoned with NaN before the correctness run.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

#: (algorithm, shape, config): the failing records of lcmac/data/tuning_logs/cuda-sm90a-bfloat16.jsonl
#: (their config is the default one), plus the fused kernel and the plain GEMM where C itself
#: has more than 2³¹ elements (their index arithmetic changed with the fix too)
CASES = [
    ("strassen", (16384, 151936, 4096), {}),
    ("strassen^2", (16384, 151936, 4096), {}),
    ("strassen", (16384, 129280, 7168), {}),
    ("strassen^2", (8192, 129280, 7168), {}),
    ("strassen^2", (8192, 151936, 4096), {}),
    ("strassen", (16384, 151936, 4096), {"fused": True, "overlap_epilogue": True}),
    ("gemm", (16384, 151936, 4096), {}),
]


def tag(algo, shape, cfg):
    return "-".join([algo.replace("^", "sq"), "x".join(map(str, shape))]
                    + [f"{k}{v}" for k, v in sorted(cfg.items())])


def build(algo, shape, cfg, d, jobs):
    side = os.path.join(d, "lcmac.json")
    if os.path.exists(side):
        return side, None, 0.0
    t0 = time.time()
    req = {"algorithm": None if algo == "gemm" else algo, "target": "cuda-sm90a",
           "dtype": "bf16", "shape": list(shape), "config": cfg, "out_dir": d, "name": "lcmac",
           "jobs": jobs}
    p = subprocess.run([sys.executable, "-m", "lcmac.targets.tilelang_worker"],
                       input=json.dumps(req), capture_output=True, text=True, cwd=ROOT)
    lines = [x for x in p.stdout.splitlines() if x.startswith("{")]
    resp = json.loads(lines[-1]) if lines else {"ok": False, "error": p.stderr[-2000:]}
    if resp.get("ok"):
        for src in resp["sources"]:          # keep the library and its manifest only
            os.remove(src)
    return (side if resp.get("ok") else None), resp.get("error"), time.time() - t0


def measure_one(side, reps):
    """One artifact (and cuBLAS) on fresh inputs; prints one JSON line."""
    import torch
    from bench_cuda import bench_fn      # the benchmark's CUDA-event timer
    from lcmac.runtime.cuda_loader import load_cuda
    torch.backends.cuda.matmul.allow_tf32 = False
    meta = json.load(open(side))
    M, N, K = meta["shape"]
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(M * 7 + N * 3 + K)
    A = torch.randn(M, K, device=dev, generator=g).bfloat16()
    B = torch.randn(K, N, device=dev, generator=g).bfloat16()
    ref = A.float() @ B.float()

    def rel_err(C):
        num = den = 0.0
        for r0 in range(0, M, 1024):
            rf = ref[r0:r0 + 1024].double()
            num += float(((C[r0:r0 + 1024].double() - rf) ** 2).sum())
            den += float((rf ** 2).sum())
        return (num / den) ** 0.5

    def timed(fn):
        return bench_fn(fn, [()], warmup=3, reps=reps)

    C = torch.matmul(A, B)
    err_cub = rel_err(C)
    t_cub, _ = timed(lambda: torch.matmul(A, B, out=C))
    f = load_cuda(side)
    r = {"algorithm": meta.get("algorithm_name"), "shape": [M, N, K], "config": meta.get("config"),
         "int64_index": (meta.get("extra") or {}).get("int64_index"),
         "workspace_bytes": meta.get("workspace_bytes"), "cublas_rel_err": err_cub,
         "cublas_seconds": t_cub, "cublas_tflops": 2.0 * M * N * K / t_cub / 1e12}
    C.fill_(float("nan"))
    f(A, B, out=C)
    torch.cuda.synchronize()
    r["all_written"] = bool(torch.isfinite(C).all())
    r["rel_err"] = rel_err(C)
    r["err_vs_cublas"] = r["rel_err"] / err_cub
    t, ts = timed(lambda: f(A, B, out=C))
    r.update(seconds=t, tflops=2.0 * M * N * K / t / 1e12, ratio_vs_cublas=t_cub / t,
             spread=(ts[-1] - ts[0]) / t)
    print("RESULT " + json.dumps(r), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build-dir", default=os.path.join(ROOT, ".cuda-art", "large"))
    ap.add_argument("--build-only", action="store_true")
    ap.add_argument("--jobs", type=int, default=4, help="artifacts built at once")
    ap.add_argument("--nvcc-jobs", type=int, default=2)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "h100-large-n.json"))
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        return measure_one(args.one, args.reps)

    t0 = time.time()
    with ThreadPoolExecutor(max_workers=args.jobs) as ex:
        built = list(ex.map(lambda c: build(*c, os.path.join(args.build_dir, tag(*c)), args.nvcc_jobs),
                            CASES))
    for c, (side, err, sec) in zip(CASES, built):
        print(f"build {tag(*c)}: {'ok' if side else 'FAILED ' + str(err)[:600]} ({sec:.0f} s)", flush=True)
    print(f"built in {time.time() - t0:.0f} s", flush=True)
    if args.build_only:
        return
    import torch
    rows = []
    for c, (side, err, _) in zip(CASES, built):
        row = {"algorithm": c[0], "shape": list(c[1]), "config": c[2]}
        if not side:
            row["error"] = f"build failed: {err}"[:800]
        else:
            p = subprocess.run([sys.executable, __file__, "--one", side, "--reps", str(args.reps)],
                               capture_output=True, text=True, cwd=ROOT, timeout=300)
            res = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
            if res:
                row = dict(json.loads(res[-1][7:]), config=c[2])
            else:
                row["error"] = (p.stderr or p.stdout)[-800:]
        row["case"] = tag(*c)
        rows.append(row)
        print(json.dumps(row), flush=True)
        out = {"device": torch.cuda.get_device_name(0),
               "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "torch": torch.__version__, "command": " ".join(sys.argv),
               "reference": "float32 product (cuBLAS SGEMM, TF32 off) of the same bf16 inputs",
               "timing": f"CUDA events, median of {args.reps} after 3 warm-ups",
               "results": rows}
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        json.dump(out, open(args.out, "w"), indent=1)
    print(f"{'case':>52} {'rel_err':>9} {'x cuBLAS':>8} {'ms':>8} {'cuBLAS ms':>9} {'ratio':>6}")
    for r in rows:
        name = r["case"]
        if "error" in r:
            print(f"{name:>52} ERROR {r['error'][:100]}")
        else:
            print(f"{name:>52} {r['rel_err']:9.2e} {r['err_vs_cublas']:8.2f} {r['seconds'] * 1e3:8.2f} "
                  f"{r['cublas_seconds'] * 1e3:9.2f} {r['ratio_vs_cublas']:6.3f}")


if __name__ == "__main__":
    main()
