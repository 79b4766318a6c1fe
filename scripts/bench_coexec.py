"""CPU+GPU co-execution against the GPU alone, in one run (``lcmac.api.coexec``).

    python scripts/bench_coexec.py --sizes 4096 8192 16384 --modes bf16 tf32 fp32 fp64 \\
        --inputs host device --out bench/results/h100-coexec.json

Per case (GPU number format, size M = N = K, inputs on the host or on the GPU) it calibrates the
split model on this machine (GPU GEMM rate, CPU GEMM rate, link bandwidth), times GPU only,
the calibrated model's split, the uncalibrated prior's (what ``lcmac.matmul(devices=...)``
takes with no log) and neighbours in interleaved rounds (median, wall clock, the product
complete on its device), and logs the best split (``lcmac.artifact.split_log``; the directory
from ``LCMAC_TUNING_LOGS``).  "torch ms" is the product as torch users write it (copy in,
torch.matmul, copy out, one stream) in the same rounds; "GPU ms" lcmac's GPU-only path (host
inputs: copies in chunks beside the GEMM).  "vs GPU" = GPU-only time / this time; "model/best" = the
calibrated model's split's time / the best's (≤ 1.05 is within 5 %); "rates" the analytic
model's with measured rates.  Both sides run the
vendor GEMM unless ``--gpu-algo`` says otherwise (the split, not the kernel, is measured
here); fp32 is IEEE fp32 (TF32 off), tf32 the fast mode, fp64 runs torch.matmul on the GPU.
"""
from __future__ import annotations

import argparse
import json
import sys

MODES = {"bf16": ("bfloat16", None), "fp16": ("float16", None), "tf32": ("float32", True),
         "fp32": ("float32", False), "fp64": ("float64", None)}


def inputs_for(M, N, K, dtype, where, gpu):
    import torch
    g = torch.Generator().manual_seed(M)
    A = torch.randn(M, K, generator=g, dtype=torch.float32).to(dtype)
    B = (torch.randn(K, N, generator=g, dtype=torch.float32) / K ** 0.5).to(dtype)
    if where == "host":
        return A.pin_memory(), B.pin_memory(), torch.empty(M, N, dtype=dtype).pin_memory()
    return A.to(gpu), B.to(gpu), torch.empty(M, N, dtype=dtype, device=gpu)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--sizes", type=int, nargs="+", default=[4096, 8192, 16384])
    ap.add_argument("--modes", nargs="+", default=["bf16", "tf32", "fp32", "fp64"], choices=list(MODES))
    ap.add_argument("--inputs", nargs="+", default=["host", "device"], choices=["host", "device"])
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds per case")
    ap.add_argument("--gpu-algo", default="vendor", help="the GPU side's lcmac.matmul algo")
    ap.add_argument("--no-log", action="store_true", help="do not log the best splits")
    ap.add_argument("--out", help="write the results as JSON here")
    args = ap.parse_args(argv)
    import torch

    import lcmac
    from lcmac.artifact.build import resolve_target
    from lcmac.api.coexec import gpu_side, run_split
    from lcmac.policy.split import model_split
    from lcmac.runtime.loader import host_cpus
    from lcmac.tune.coexec_search import search_split
    if not torch.cuda.is_available():
        print("bench_coexec: needs a CUDA GPU", file=sys.stderr)
        return 2
    gpu = torch.device("cuda", torch.cuda.current_device())
    target = resolve_target("cuda")
    name = torch.cuda.get_device_name(gpu)
    print(f"# {name}, {host_cpus()} host CPUs, torch {torch.__version__} "
          f"({torch.get_num_threads()} CPU threads)")
    print(f"{'mode':5s} {'size':>6s} {'inputs':7s} {'torch ms':>9s} {'GPU ms':>9s} {'best f':>7s} {'best ms':>9s} "
          f"{'vs GPU':>7s} {'model f':>8s} {'model/best':>10s} {'rates f':>8s} {'rates/best':>10s} "
          f"{'prior f':>8s} {'prior/best':>10s}")
    results = []
    for mode in args.modes:
        dname, tf32 = MODES[mode]
        dtype = getattr(torch, dname)
        if tf32 is not None:
            torch.backends.cuda.matmul.allow_tf32 = tf32
        for n in args.sizes:
            for where in args.inputs:
                A, B, C = inputs_for(n, n, n, dtype, where, gpu)

                gpu_mm = gpu_side(dtype, lambda a, b, out=None: lcmac.matmul(
                    a, b, algo=args.gpu_algo, out=out))

                def cpu_mm(a, b, out=None):
                    return lcmac.matmul(a, b, algo="vendor", out=out)

                prior = model_split(n, n, n, dname, mode, where, target).cpu_fraction

                def plain():             # torch as a user writes it: copy in, multiply, copy out
                    if where == "host":
                        C.copy_(torch.matmul(A.to(gpu, non_blocking=True),
                                             B.to(gpu, non_blocking=True)), non_blocking=True)
                    else:
                        torch.matmul(A, B, out=C)

                with torch.no_grad():
                    r = search_split(A, B, gpu, target=target.name, mode=mode, prior_fraction=prior,
                                     run=lambda g, timings=None: run_split(
                                         A, B, g, gpu, gpu_matmul=gpu_mm, cpu_matmul=cpu_mm, out=C,
                                         timings=timings),
                                     gpu_matmul=gpu_mm, rounds=args.rounds, baselines={"plain": plain},
                                     log=not args.no_log, device_name=name, host_cpus=host_cpus())
                r["mode"] = mode
                results.append(r)

                def vs_best(t):          # an untimed split's CPU side alone is predicted ≥ 2× GPU only
                    return f"{t / r['best_s']:9.3f}x" if t is not None else f"{'untimed':>10s}"
                print(f"{mode:5s} {n:6d} {where:7s} {r['baselines_s']['plain'] * 1e3:9.3f} "
                      f"{r['gpu_only_s'] * 1e3:9.3f} "
                      f"{r['best_fraction']:7.3f} {r['best_s'] * 1e3:9.3f} "
                      f"{r['gpu_only_s'] / r['best_s']:6.3f}x {r['calibrated_fraction']:8.3f} "
                      f"{vs_best(r['calibrated_s'])} {r['rate_model_fraction']:8.3f} "
                      f"{vs_best(r['rate_model_s'])} {prior:8.3f} {vs_best(r['prior_s'])}", flush=True)
                torch.cuda.empty_cache()
    if args.out:
        from lcmac.tune.measure import run_header
        doc = {**run_header("CPU+GPU co-execution (lcmac.api.coexec) vs GPU only", name, __file__, argv),
               "host_cpus": host_cpus(), "torch_threads": torch.get_num_threads(),
               "gpu_algo": args.gpu_algo, "torch": torch.__version__, "results": results}
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
