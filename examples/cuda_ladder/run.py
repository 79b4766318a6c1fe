"""Build the seven steps of the GEMM optimisation ladder (``ladder.py``) with TileLang for
sm_90a and, where a GPU is present, check each against a float64 product and time it beside
``torch.matmul`` (cuBLAS).

    python examples/cuda_ladder/run.py                          # bfloat16 4096³, every step
    python examples/cuda_ladder/run.py --dtype float32 --steps 5 6 7
    python examples/cuda_ladder/run.py --sources DIR            # the generated CUDA only (no GPU)
    python examples/cuda_ladder/run.py --json FILE              # also the results as JSON

Each step is compiled by ``tilelang.compile`` and called on torch tensors.  Every result is
compared in full with a float64 product on the GPU (relative Frobenius error).  Timing: CUDA
events around back-to-back calls, the median of ``--rounds`` rounds of about ``--round-s``
seconds each, the steps and cuBLAS taking turns within a round.  TFLOP/s = 2·M·N·K / time.
For float32, steps 1–5 (CUDA-core FP32) are compared with cuBLAS FP32 and steps 6–7 (TF32
tensor cores) with cuBLAS TF32.

``generate`` writes one step's CUDA (the kernel and TileLang's host launcher) without a GPU
or nvcc and reports its launch: the tests read the generated code through it.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ladder  # noqa: E402  (beside this script; imports TileLang)

ARCH = "sm_90a"
TARGET = {"kind": "cuda", "arch": ARCH}
#: relative error above which a result is wrong: 2-byte outputs round at 2^-8; float32 on the
#: CUDA cores is exact to about 1e-6, on the TF32 tensor cores (steps 6–7) to about 1e-3
TOLERANCE = {"bfloat16": 2e-2, "float16": 2e-2, "float32": 1e-4, "tf32": 1e-2}


def kernel(step: int, shape, dtype: str, name: str = "ladder", **tile):
    """Step ``step``'s prim_func for ``shape`` (M, N, K), its kernel named ``<name>_gemm_kernel``
    (``tile``: ``block_m``, ``block_n``, ``block_k`` as ``ladder.ladder_tile`` takes them)."""
    M, N, K = shape
    func = ladder.ladder_gemm(step, M, N, K, dtype, arch=ARCH, **tile)
    return func.with_attr("global_symbol", f"{name}_gemm")


def lower(func) -> str:
    """The CUDA source of ``func`` for sm_90a: the kernel, then TileLang's host launcher."""
    from tilelang import tvm
    from tilelang.engine import lower as tl_lower
    from tilelang.jit.adapter.wrapper import TLWrapper
    from tvm.target import Target
    tgt = Target(TARGET)
    with tvm.transform.PassContext(opt_level=3), tgt:
        art = tl_lower(func, target=tgt)
    w = TLWrapper(tgt)
    w.assign_optimized_module(tvm.IRModule({"main": func}))
    w.assign_pass_configs({})
    w.assign_host_module(art.host_mod)
    w.assign_device_module(art.device_mod)
    return w.wrap(art.kernel_source)


def launch(code: str) -> dict:
    """Grid, block and dynamic shared memory of the launch in a generated host launcher."""
    dims = lambda key: [int(x) for x in re.search(key + r" = dim3\(([^)]*)\)", code).group(1).split(",")]  # noqa: E731
    smem = re.search(r"config\.dynamicSmemBytes = (\d+)", code)
    return {"grid": dims(r"config\.gridDim"), "block": dims(r"config\.blockDim"),
            "smem_bytes": int(smem.group(1)) if smem else 0}


def generate(step: int, shape, dtype: str, out_dir, name: str = "ladder", **tile) -> dict:
    """Write step ``step``'s CUDA for ``shape`` to ``<out_dir>/<name>_gemm.cu``; its path, the
    kernel's name and its launch (``launch``)."""
    code = lower(kernel(step, shape, dtype, name, **tile))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}_gemm.cu"
    path.write_text(code)
    return {"step": step, "source": str(path), "kernel": f"{name}_gemm_kernel", **launch(code)}


# ---- on the GPU ------------------------------------------------------------------------------
def tolerance(dtype: str, step: int) -> float:
    return TOLERANCE["tf32" if (dtype == "float32" and step >= 6) else dtype]


def timed_rounds(variants: dict, rounds: int, round_s: float) -> dict:
    """{name: median seconds per call} of {name: fn}: each round runs every variant back to
    back for about ``round_s`` seconds (CUDA events), the variants taking turns."""
    import torch
    reps = {}
    for name, fn in variants.items():                 # one call each: how many fill a round
        fn()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        reps[name] = max(1, min(1000, round(round_s / max(start.elapsed_time(end) / 1e3, 1e-7))))
    times = {name: [] for name in variants}
    for _ in range(rounds):
        for name, fn in variants.items():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(reps[name]):
                fn()
            end.record()
            end.synchronize()
            times[name].append(start.elapsed_time(end) / 1e3 / reps[name])
    return {name: statistics.median(ts) for name, ts in times.items()}


def run(args) -> int:
    import tilelang
    import torch
    if not torch.cuda.is_available():
        print("run.py: no CUDA GPU here (torch.cuda.is_available() is False); --sources DIR "
              "writes the generated CUDA without one", file=sys.stderr)
        return 2
    M, N, K = args.shape
    steps = sorted(set(args.steps))
    print(f"# {torch.cuda.get_device_name()}, {args.dtype} {M}x{N}x{K}, steps {steps}", flush=True)
    dt = getattr(torch, args.dtype)
    g = torch.Generator(device="cuda").manual_seed(0)
    A = torch.randn(M, K, device="cuda", dtype=dt, generator=g)
    B = torch.randn(K, N, device="cuda", dtype=dt, generator=g) / K ** 0.5
    C = torch.empty(M, N, device="cuda", dtype=dt)
    ref = A.double() @ B.double()
    variants = {}
    for k in steps:
        fn = tilelang.compile(kernel(k, (M, N, K), args.dtype), target=TARGET)
        variants[f"step {k}"] = lambda fn=fn: fn(A, B, C)
        print(f"  step {k} {ladder.STEP_NAMES[k]} compiled", flush=True)

    def cublas(tf32: bool):
        def call():
            torch.backends.cuda.matmul.allow_tf32 = tf32
            torch.matmul(A, B, out=C)
        return call
    variants["cuBLAS"] = cublas(False)
    if args.dtype == "float32" and any(k >= 6 for k in steps):
        variants["cuBLAS TF32"] = cublas(True)
    errors = {}
    with torch.no_grad():
        for name, fn in variants.items():
            C.fill_(float("nan"))                       # every element must be written
            fn()
            errors[name] = ((C.double() - ref).norm() / ref.norm()).item()
        times = timed_rounds(variants, args.rounds, args.round_s)
    torch.backends.cuda.matmul.allow_tf32 = False
    tflops = {name: 2.0 * M * N * K / t / 1e12 for name, t in times.items()}
    rows, wrong = [], []
    print(f"\n  {'step':32s} {'TFLOP/s':>8s} {'x cuBLAS':>9s} {'rel. error':>11s}")
    for k in steps:
        base = "cuBLAS TF32" if (args.dtype == "float32" and k >= 6) else "cuBLAS"
        name = f"step {k}"
        ok = errors[name] <= tolerance(args.dtype, k)
        wrong += [] if ok else [k]
        rows.append({"step": k, "name": ladder.STEP_NAMES[k], "tflops": tflops[name],
                     "vs_cublas": tflops[name] / tflops[base], "compared_with": base,
                     "rel_error_vs_float64": errors[name]})
        print(f"  {k} {ladder.STEP_NAMES[k]:30s} {tflops[name]:8.2f} {tflops[name] / tflops[base]:8.3f}x "
              f"{errors[name]:11.2e}{'' if ok else '  WRONG'}")
    for name in ("cuBLAS", "cuBLAS TF32"):
        if name in tflops:
            print(f"  - {name:30s} {tflops[name]:8.2f} {1:8.3f}x {errors[name]:11.2e}")
    if args.json:
        doc = {"device": torch.cuda.get_device_name(), "dtype": args.dtype, "shape": [M, N, K],
               "torch": torch.__version__, "tilelang": getattr(tilelang, "__version__", "?"),
               "rounds": args.rounds, "round_s": args.round_s, "steps": rows,
               "cublas": {n: tflops[n] for n in ("cuBLAS", "cuBLAS TF32") if n in tflops}}
        Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
        print(f"\nwrote {args.json}")
    if wrong:
        print(f"run.py: steps {wrong} are wrong (relative error above tolerance)", file=sys.stderr)
        return 1
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--shape", type=lambda s: tuple(int(x) for x in s.lower().split("x")),
                    default=(4096, 4096, 4096), help="MxNxK (default 4096x4096x4096)")
    ap.add_argument("--dtype", default="bfloat16", choices=sorted(ladder.ITEMSIZE))
    ap.add_argument("--steps", type=int, nargs="+", default=list(ladder.STEP_NAMES),
                    choices=list(ladder.STEP_NAMES), help="steps to run (default: all)")
    ap.add_argument("--rounds", type=int, default=5, help="timed rounds (default %(default)s)")
    ap.add_argument("--round-s", type=float, default=0.1,
                    help="seconds each variant runs per round, one call at least (default %(default)s)")
    ap.add_argument("--sources", metavar="DIR", help="write each step's generated CUDA to DIR and stop")
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = ap.parse_args(argv)
    if len(args.shape) != 3:
        ap.error("--shape takes MxNxK")
    if args.sources:
        for k in sorted(set(args.steps)):
            r = generate(k, args.shape, args.dtype, args.sources, f"ladder{k}")
            print(f"  step {k} {ladder.STEP_NAMES[k]:20s} grid {r['grid']} block {r['block']} "
                  f"smem {r['smem_bytes']} B  {r['source']}")
        return 0
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
