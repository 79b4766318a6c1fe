#!/usr/bin/env python
"""Probe: GEMM kernels under the GPU's power cap — time and energy per call, sustained.

On an H100 SXM every long bf16 GEMM runs at the 700 W cap (nvidia-smi: throttle reason
"SW power cap", SM clock 1.2–1.45 GHz of 1.98), so a kernel's sustained speed is set by its
energy per flop, not by its speed when cool.  This runs each item back to back for
``--seconds`` (after a warm-up of the same length), in ``--rounds`` interleaved rounds, and
reads the board's energy counter (NVML) around it:

* cuBLAS (torch.matmul) at the artifacts' shape, and at each ``--cublas-n``;
* each lcmac artifact given (its own shape; any CUDA artifact, GEMM or LCMA).

Prints effective TFLOP/s (2MNK/t), watts, mean SM clock and TFLOP per joule.

    python research/probe_energy.py ART.json [ART.json ...] --seconds 2 --out bench/results/x.json
"""
import argparse, ctypes, json, os, sys

# bench_cuda.py (scripts/) holds the timers and the record head these probes share
SCRIPTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts")


class Nvml:
    """The few NVML calls needed, through ctypes (no pynvml dependency)."""

    def __init__(self, index=0):
        self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        self._ok(self.lib.nvmlInit_v2())
        self.h = ctypes.c_void_p()
        self._ok(self.lib.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(self.h)))

    @staticmethod
    def _ok(rc):
        if rc != 0:
            raise RuntimeError(f"NVML error {rc}")

    def energy_j(self) -> float:
        e = ctypes.c_ulonglong()
        self._ok(self.lib.nvmlDeviceGetTotalEnergyConsumption(self.h, ctypes.byref(e)))
        return e.value / 1e3

    def sm_clock(self) -> int:
        c = ctypes.c_uint()
        self._ok(self.lib.nvmlDeviceGetClockInfo(self.h, 1, ctypes.byref(c)))   # NVML_CLOCK_SM
        return c.value


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("artifacts", nargs="*")
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--cublas-n", type=int, nargs="*", default=[])
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    import torch
    sys.path.insert(0, SCRIPTS)
    from bench_cuda import load_artifact, probe_record, sustained  # the benchmark's timer and loader
    nvml = Nvml()
    dev = torch.device("cuda")
    g = torch.Generator(device="cuda").manual_seed(0)
    items, operands = {}, {}

    def ops(M, N, K):
        key = (M, N, K)
        if key not in operands:
            operands[key] = (torch.randn(M, K, device=dev, dtype=torch.bfloat16, generator=g),
                             torch.randn(K, N, device=dev, dtype=torch.bfloat16, generator=g),
                             torch.empty(M, N, device=dev, dtype=torch.bfloat16))
        return operands[key]

    for n in args.cublas_n:
        A, B, C = ops(n, n, n)
        items[f"cublas {n}^3"] = ((n, n, n), lambda A=A, B=B, C=C: torch.matmul(A, B, out=C))
    for path in args.artifacts:
        f = load_artifact(path)
        A, B, C = ops(f.M, f.N, f.K)
        shape = (f.M, f.N, f.K)
        if f"cublas {shape}" not in items:
            items[f"cublas {shape}"] = (shape, lambda A=A, B=B, C=C: torch.matmul(A, B, out=C))
        label = os.path.basename(os.path.dirname(os.path.abspath(path)))
        if label in items:   # same artifact name from two build dirs: keep both
            label = os.path.relpath(os.path.dirname(os.path.abspath(path)))
        items[label] = (shape, lambda f=f, A=A, B=B, C=C: f(A, B, out=C))
        ref = torch.matmul(A, B)
        f(A, B, out=C)
        err = float(((C.float() - ref.float()).norm() / ref.float().norm()))
        if err > 2e-2:
            raise SystemExit(f"{label}: relative difference {err:.2e} from cuBLAS — wrong result")
    runs = {k: [] for k in items}
    first = next(iter(items.values()))[1]
    sustained(first, args.seconds, nvml)                      # reach the power cap first
    for r in range(args.rounds):
        for k, (shape, fn) in items.items():
            t, j, clk = sustained(fn, args.seconds, nvml)
            runs[k].append({"s": t, "J": j, "W": j / t, "MHz": round(clk)})
            M, N, K = shape
            print(f"round {r} {k:28s} {t * 1e3:8.3f} ms {2 * M * N * K / t / 1e12:7.1f} TFLOP/s "
                  f"{j / t:6.0f} W {clk:6.0f} MHz {2 * M * N * K / j / 1e12:6.3f} TFLOP/J", flush=True)
    summary = {}
    for k, rs in runs.items():
        M, N, K = items[k][0]
        t = sorted(x["s"] for x in rs)[len(rs) // 2]
        j = sorted(x["J"] for x in rs)[len(rs) // 2]
        summary[k] = {"shape": [M, N, K], "seconds": t, "joules": j, "tflops": 2 * M * N * K / t / 1e12,
                      "tflop_per_joule": 2 * M * N * K / j / 1e12, "runs": rs}
    out = probe_record("sustained time and energy per call", items=summary)
    if args.out:
        open(args.out, "w").write(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
