#!/usr/bin/env python
"""Probe: can the memory-bound combines hide behind the compute-bound GEMM stage?

Algorithm 1 runs Combine A/B, the batched GEMM and Combine H one after another; at 16384³
the combines are ~12 % of the time and the GEMM stage alone would beat cuBLAS.  This probe
takes built Algorithm 1 artifacts and, through their per-kernel launchers, times N
independent calls (inputs fixed, two workspaces) three ways in one process:

* ``serial``: ``lcmac_run`` N times on one stream (what a user gets today);
* ``pipelined``: call i's batched GEMM on the main stream while call i+1's Combine A/B and
  call i−1's Combine H run on a second stream (``--priority``: that stream's priority);
* ``gemm_only``: the N batched GEMMs alone — the floor if the combines hid completely;

next to cuBLAS (torch.matmul, N calls).  The pipelined C of the last call is compared with the
serial one bit for bit.  Optionally samples nvidia-smi (power, SM clock, throttle reasons).

    python research/probe_overlap.py ART_DIR [ART_DIR ...] --calls 6 --out bench/results/x.json
"""
import argparse, json, os, subprocess, sys, time

# bench_cuda.py (scripts/) holds the timers and the record head these probes share
SCRIPTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("artifacts", nargs="+")
    ap.add_argument("--calls", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--priority", type=int, default=-1, help="side stream priority (lower = higher)")
    ap.add_argument("--smi", default=None, help="write nvidia-smi samples (CSV) here")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    import torch
    sys.path.insert(0, SCRIPTS)
    from bench_cuda import kernel_launchers, load_artifact, probe_record
    smi = None
    if args.smi:
        smi = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,power.draw,power.limit,clocks.sm,"
                                "temperature.gpu,clocks_throttle_reasons.active",
                                "--format=csv,noheader", "-lms", "50"], stdout=open(args.smi, "w"))
    dev = torch.device("cuda")
    marks, results = [], {}

    def mark(label):
        marks.append((time.time(), label))

    for path in args.artifacts:
        f = load_artifact(path)
        M, N, K = f.M, f.N, f.K
        g = torch.Generator(device="cuda").manual_seed(0)
        A = torch.randn(M, K, device=dev, dtype=torch.bfloat16, generator=g)
        B = torch.randn(K, N, device=dev, dtype=torch.bfloat16, generator=g)
        C = torch.empty(M, N, device=dev, dtype=torch.bfloat16)
        C2 = torch.empty_like(C)
        nbytes = int(f.meta["workspace_bytes"])
        wss = [torch.empty(nbytes, dtype=torch.uint8, device=dev) for _ in range(2)]
        L = [kernel_launchers(f, A, B, C2, w.data_ptr()) for w in wss]
        names = [k["name"] for k in f.meta["kernels"]]
        gemm = [n for n in names if "gemm" in n]
        assert len(gemm) == 1, f"{path}: not an Algorithm 1 artifact ({names})"
        gemm = gemm[0]
        pre = names[:names.index(gemm)]
        post = names[names.index(gemm) + 1:]
        main_s = torch.cuda.current_stream()
        side = torch.cuda.Stream(priority=args.priority)
        n = args.calls

        def serial():
            for _ in range(n):
                f(A, B, out=C)

        def gemm_only():
            for i in range(n):
                L[i % 2][gemm](main_s.cuda_stream)

        def pipelined():
            ev_pre = [torch.cuda.Event() for _ in range(n)]
            ev_gemm = [torch.cuda.Event() for _ in range(n)]
            side.wait_stream(main_s)
            for name in pre:
                L[0][name](side.cuda_stream)
            ev_pre[0].record(side)
            for i in range(n):
                main_s.wait_event(ev_pre[i])
                L[i % 2][gemm](main_s.cuda_stream)
                ev_gemm[i].record(main_s)
                if i + 1 < n:
                    if i >= 1:
                        side.wait_event(ev_gemm[i - 1])     # workspace (i+1)%2 free
                    for name in pre:
                        L[(i + 1) % 2][name](side.cuda_stream)
                    ev_pre[i + 1].record(side)
                side.wait_event(ev_gemm[i])
                for name in post:
                    L[i % 2][name](side.cuda_stream)
            main_s.wait_stream(side)

        def cublas():
            for _ in range(n):
                torch.matmul(A, B, out=C)

        def timed(fn):
            fn()
            torch.cuda.synchronize()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            e.synchronize()
            return s.elapsed_time(e) * 1e-3 / n

        ways = {"cublas": cublas, "serial": serial, "pipelined": pipelined, "gemm_only": gemm_only}
        ts = {k: [] for k in ways}
        for r in range(args.rounds):
            for k, fn in ways.items():
                mark(f"{os.path.basename(path)} {k} round {r}")
                ts[k].append(timed(fn))
        mark("idle")
        f(A, B, out=C)
        pipelined()
        torch.cuda.synchronize()
        same = bool(torch.equal(C, C2))
        fl = 2.0 * M * N * K
        med = {k: sorted(v)[len(v) // 2] for k, v in ts.items()}
        row = {"algorithm": f.meta.get("algorithm_name"), "shape": [M, N, K], "calls": n,
               "seconds_per_call": med, "all_rounds": ts,
               "tflops": {k: fl / v / 1e12 for k, v in med.items()},
               "ratio_vs_cublas": {k: med["cublas"] / v for k, v in med.items()},
               "pipelined_equals_serial": same}
        results[os.path.basename(os.path.normpath(path))] = row
        print(f"{path}: " + "  ".join(f"{k} {med[k] * 1e3:.3f} ms ({row['ratio_vs_cublas'][k]:.3f}x)"
                                      for k in ways) + f"  same bits: {same}", flush=True)
        del wss, L
        torch.cuda.empty_cache()
    if smi:
        smi.terminate()
    out = probe_record("combine/GEMM overlap across calls", side_stream_priority=args.priority,
                       results=results, marks=[[round(t, 3), l] for t, l in marks])
    if args.out:
        open(args.out, "w").write(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
