#!/usr/bin/env python
"""Probe: how fast can a group-parallel combine stream on this GPU?  (docs/cuda-experiments.md)

Times hand-written combine kernels (research/probe_combine_bw.cu: NO outputs from NI inputs,
about NI/3 signed terms each, bf16 in, fp32 sums, bf16 out) at the sizes of Strassen² at
16384³ (Combine H: 49 → 16 blocks of 4096², Combine A: 16 → 49) and Strassen (4 → 7, 7 → 4
blocks of 8192²), in several thread shapes, beside torch's copy of the same number of bytes
(the streaming ceiling).  Built twice: with ``__restrict__`` pointers and without.  These
kernels are a yardstick for lcmac's generated combines, not part of lcmac.

    python research/probe_combine_bw.py --out bench/results/h100-combine-bw.json
"""
import argparse, ctypes, json, os, statistics, subprocess, sys, tempfile

# bench_cuda.py (scripts/) holds the timers and the record head these probes share
SCRIPTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts")

HERE = os.path.dirname(os.path.abspath(__file__))
SHAPES = ((49, 16, 4096 * 4096), (16, 49, 4096 * 4096), (4, 7, 8192 * 8192), (7, 4, 8192 * 8192))
FORMS = ((4, 4, 1), (4, 1, 1), (8, 1, 1), (8, 2, 1), (4, 1, 2), (8, 1, 2), (8, 2, 2), (4, 2, 2), (8, 2, 4))


def build(restrict: bool, out_dir: str) -> str:
    so = os.path.join(out_dir, f"combine_bw{'' if restrict else '_norestrict'}.so")
    nvcc = os.environ.get("LCMAC_NVCC", "nvcc")
    subprocess.run([nvcc, "-O3", "-arch=sm_90a", "-shared", "-Xcompiler", "-fPIC",
                    f"-DRESTRICT={'__restrict__' if restrict else ''}",
                    os.path.join(HERE, "probe_combine_bw.cu"), "-o", so], check=True)
    return so


def timeit(fn, reps=20):
    import torch
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(True), torch.cuda.Event(True)
        a.record(); fn(); b.record(); b.synchronize()
        ts.append(a.elapsed_time(b) / 1e3)
    return statistics.median(ts)


def measure(so: str) -> list[dict]:
    import torch
    lib, rows = ctypes.CDLL(so), []
    for ni, no, n in SHAPES:
        X = torch.randn(ni, n, device="cuda").to(torch.bfloat16)
        Y = torch.empty(no, n, device="cuda", dtype=torch.bfloat16)
        nbytes, stream = (ni + no) * n * 2, torch.cuda.current_stream().cuda_stream
        for vec, ept, minb in FORMS:
            f = getattr(lib, f"run_{ni}_{no}_{vec}_{ept}_{minb}", None)
            if f is None:
                continue
            f.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long, ctypes.c_void_p]
            t = timeit(lambda: f(X.data_ptr(), Y.data_ptr(), n, stream))
            rows.append({"ni": ni, "no": no, "vec": vec, "ept": ept, "minb": minb,
                         "ms": t * 1e3, "TBps": nbytes / t / 1e12})
            print(rows[-1], flush=True)
        src = torch.empty(nbytes // 4, device="cuda", dtype=torch.bfloat16)
        dst = torch.empty_like(src)          # a copy reads and writes nbytes / 2 each
        t = timeit(lambda: dst.copy_(src))
        rows.append({"ni": ni, "no": no, "torch_copy_same_bytes_ms": t * 1e3, "TBps": nbytes / t / 1e12})
        print(rows[-1], flush=True)
        del X, Y, src, dst
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    sys.path.insert(0, SCRIPTS)
    from bench_cuda import probe_record
    with tempfile.TemporaryDirectory() as d:
        runs = {("restrict" if r else "no_restrict"): measure(build(r, d)) for r in (True, False)}
    rec = probe_record("probe_combine_bw", runs=runs)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rec, f, indent=1)


if __name__ == "__main__":
    main()
