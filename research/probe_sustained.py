#!/usr/bin/env python
"""Probe: is a long GEMM slower per flop than the same work in short launches?

Times, on the GPU present, in one process (CUDA events, median of 10 after warm-up):
cuBLAS and lcmac's plain TileLang GEMM at 8192³ once, the same GEMM 7 times back to back
(on 7 input pairs: the work of one-level Strassen's products at 16384³), and cuBLAS at
16384³.  If 7 short launches take 7x one launch while a single long kernel runs slower per
flop, the loss is sustained-load (clock/power) behaviour, not the batching.

    python research/probe_sustained.py --out bench/results/h100-sustained.json
"""
import argparse, json, os, sys, tempfile, time

# bench_cuda.py (scripts/) holds the timers and the record head these probes share
SCRIPTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    import torch
    import lcmac
    sys.path.insert(0, SCRIPTS)
    from bench_cuda import bench_fn, probe_record      # the benchmark's CUDA-event timer
    n = args.n
    d = tempfile.mkdtemp()
    p = lcmac.build("gemm", "cuda", "bfloat16", (n, n, n), out_dir=d,
                    config={"stages": 4, "policy": "fullrow"})
    f = lcmac.load(p)
    g = torch.Generator(device="cuda").manual_seed(0)
    A = [torch.randn(n, n, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(7)]
    B = [torch.randn(n, n, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(7)]
    C = [torch.empty(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(7)]
    A2 = torch.randn(2 * n, 2 * n, device="cuda", dtype=torch.bfloat16, generator=g)
    B2 = torch.randn(2 * n, 2 * n, device="cuda", dtype=torch.bfloat16, generator=g)

    def timed(fn):
        return bench_fn(fn, [()], warmup=3, reps=args.reps)[0]

    fl = 2.0 * n ** 3
    rows = {
        "cublas_1x": timed(lambda: torch.matmul(A[0], B[0], out=C[0])),
        "lcmac_1x": timed(lambda: f(A[0], B[0], out=C[0])),
        "cublas_7x": timed(lambda: [torch.matmul(a, b, out=c) for a, b, c in zip(A, B, C)]),
        "lcmac_7x": timed(lambda: [f(a, b, out=c) for a, b, c in zip(A, B, C)]),
        "cublas_2n": timed(lambda: torch.matmul(A2, B2)),
    }
    out = probe_record("sustained GEMM", n=n, seconds=rows,
                       tflops={k: (8 if k.endswith("2n") else 7 if k.endswith("7x") else 1) * fl / v / 1e12
                               for k, v in rows.items()})
    for k, v in out["tflops"].items():
        print(f"{k:10s} {rows[k] * 1e3:8.3f} ms {v:7.1f} TFLOP/s")
    if args.out:
        open(args.out, "w").write(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
