"""A CUDA bundle through the C API against cuBLAS, in one run: what a C++ server calling
``lcmac_bundle_cuda_matmul`` gets, beside ``torch.matmul`` (cuBLAS) and ``lcmac.load`` (the
same bundle from Python).

    python scripts/bench_c_cuda.py --rule '?x8192x8192' --algo strassen --rows 8192 \\
        --M 8192 16384 12000 --sustained 2 --out bench/results/h100-c-cuda-bf16.json

The bundle is exported (``lcmac export``; or ``--bundle DIR``), the harness (lcmac_c.c) is
compiled with gcc into a shared library and called through ctypes with the tensors' device
pointers and torch's current stream: the C API's own checks and launches are what is timed.
Per M: interleaved rounds of ``--calls`` back-to-back calls (CUDA events; median and spread
over the rounds) — the burst figure; with ``--sustained S`` each variant also runs for S seconds
back to back — the sustained figure.  Effective TFLOP/s = 2·M·N·K / time.  Each result is
compared with a float64 product on a band of rows (relative Frobenius error printed).
"""
from __future__ import annotations

import argparse
import ctypes
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

CHECK_ROWS = 512


def capi_library(workdir: Path) -> ctypes.CDLL:
    """lcmac_c.c built as a shared library, with the CUDA bundle functions typed."""
    from lcmac.runtime import c_include_dir, c_source
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        raise SystemExit("bench_c_cuda: needs gcc to build the C API")
    out = workdir / "liblcmac_capi.so"
    subprocess.run([cc, "-O2", "-shared", "-fPIC", "-I", c_include_dir(), "-o", str(out),
                    c_source(), "-ldl", "-lpthread"], check=True)
    lib = ctypes.CDLL(str(out))
    vp, i64 = ctypes.c_void_p, ctypes.c_int64
    lib.lcmac_open_cuda_bundle.restype = vp
    lib.lcmac_open_cuda_bundle.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.POINTER(ctypes.c_int),
                                           ctypes.c_char_p, ctypes.c_size_t]
    lib.lcmac_bundle_cuda_matmul.restype = ctypes.c_int
    lib.lcmac_bundle_cuda_matmul.argtypes = [vp, vp, vp, vp, i64, i64, i64, ctypes.c_int, vp,
                                             ctypes.c_size_t, vp]
    lib.lcmac_bundle_last_error.restype = ctypes.c_char_p
    lib.lcmac_bundle_last_error.argtypes = [vp]
    lib.lcmac_bundle_close.argtypes = [vp]
    return lib


def open_bundle(lib, path: Path, device: int):
    err = ctypes.create_string_buffer(2048)
    st = ctypes.c_int(0)
    b = lib.lcmac_open_cuda_bundle(str(path).encode(), device, ctypes.byref(st), err, len(err))
    if not b:
        raise SystemExit(f"bench_c_cuda: lcmac_open_cuda_bundle: {err.value.decode()}")
    return b


def bench_m(M, N, K, args, lib, handle, py_fn, dtype_code) -> dict:
    import torch

    from lcmac.tune.measure import gpu_rounds
    dtype = getattr(torch, args.dtype)
    g = torch.Generator(device="cuda").manual_seed(M)
    A = torch.randn(M, K, device="cuda", dtype=dtype, generator=g)
    B = torch.randn(K, N, device="cuda", dtype=dtype, generator=g) / K ** 0.5
    C = torch.empty(M, N, device="cuda", dtype=dtype)

    def c_api():
        rc = lib.lcmac_bundle_cuda_matmul(handle, A.data_ptr(), B.data_ptr(), C.data_ptr(), M, N, K,
                                          dtype_code, None, 0, torch.cuda.current_stream().cuda_stream)
        if rc:
            raise SystemExit(f"bench_c_cuda: {lib.lcmac_bundle_last_error(handle).decode()}")
        return C

    variants = [("torch.matmul", lambda: A @ B), ("lcmac C API", c_api), ("lcmac.load (Python)",
                                                                         lambda: py_fn(A, B))]
    band = slice(0, min(M, CHECK_ROWS))
    ref = A[band].double() @ B.double()
    err = {}
    for name, fn in variants:
        out = fn()[band].double()
        err[name] = ((out - ref).norm() / ref.norm()).item()
    torch.cuda.synchronize()
    rounds, sustained = gpu_rounds(variants, args.rounds, args.calls, args.sustained)
    flops = 2.0 * M * N * K
    base = statistics.median(rounds["torch.matmul"])
    print(f"\n{M}x{N}x{K} {args.dtype}  (burst: median of {args.rounds} rounds x {args.calls} calls"
          + (f"; sustained: {args.sustained:g} s each)" if args.sustained else ")"))
    print(f"  {'variant':22s} {'ms':>8s} {'spread':>7s} {'TFLOP/s':>8s} {'vs cuBLAS':>9s}"
          + (f" {'sust. ms':>9s} {'vs cuBLAS':>9s}" if args.sustained else "") + f" {'rel.err':>9s}")
    rows = {}
    for name, ts in rounds.items():
        med = statistics.median(ts)
        r = {"median_s": med, "seconds": ts, "spread": (max(ts) - min(ts)) / med,
             "tflops": flops / med / 1e12, "vs_cublas": base / med, "rel_error_vs_float64": err[name]}
        line = f"  {name:22s} {med * 1e3:8.3f} {r['spread'] * 100:6.1f}% {r['tflops']:8.1f} {r['vs_cublas']:8.3f}x"
        if args.sustained:
            r["sustained_s"] = sustained[name]
            r["sustained_vs_cublas"] = sustained["torch.matmul"] / sustained[name]
            line += f" {sustained[name] * 1e3:9.3f} {r['sustained_vs_cublas']:8.3f}x"
        rows[name] = r
        print(line + f" {err[name]:9.2e}")
    return {"M": M, "N": N, "K": K, "variants": rows}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--rule", default="?x8192x8192", help="the ?xNxK rule to export (default %(default)s)")
    ap.add_argument("--bundle", type=Path, help="an exported CUDA bundle instead of exporting one")
    ap.add_argument("--algo", default=None, help="force one algorithm (default: lcmac export decides)")
    ap.add_argument("--rows", type=int, nargs="+", default=None, help="the rule's row buckets")
    ap.add_argument("--M", type=int, nargs="+", default=[8192, 16384], help="rows of A to time")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--rounds", type=int, default=7, help="interleaved rounds (burst figure)")
    ap.add_argument("--calls", type=int, default=10, help="calls per timed round")
    ap.add_argument("--sustained", type=float, default=0.0, metavar="S",
                    help="also time each variant back to back for S seconds (>= 2 for the power cap)")
    ap.add_argument("--out", help="write the results as JSON here")
    args = ap.parse_args(argv)
    import torch

    import lcmac
    from lcmac.artifact.bundle import read_bundle
    from lcmac.api.export import export
    if not torch.cuda.is_available():
        print("bench_c_cuda: needs a CUDA GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        path = args.bundle or export([args.rule], "cuda", args.dtype, tmp / "bundle", algo=args.algo,
                                     rows=tuple(args.rows) if args.rows else None,
                                     progress=lambda t: print(t, flush=True)).parent
        b = read_bundle(path)
        rule = b.rules[0].rule
        if rule.kind != "rows":
            raise SystemExit(f"bench_c_cuda: the bundle's first rule is {rule.text}; give a ?xNxK one")
        lib = capi_library(tmp)
        handle = open_bundle(lib, path, torch.cuda.current_device())
        py_fn = lcmac.load(path)
        code = {"float32": 0, "bfloat16": 2, "float16": 3}[args.dtype]     # lcmac_dtype
        props = torch.cuda.get_device_properties(0)
        print(f"# {props.name}, torch {torch.__version__}, bundle {path}")
        with torch.no_grad():
            results = [bench_m(M, rule.N, rule.K, args, lib, handle, py_fn, code) for M in args.M]
        lib.lcmac_bundle_close(handle)
        decisions = json.loads((path / "bundle.json").read_text()).get("decisions")
    if args.out:
        from lcmac.tune.measure import run_header
        doc = {**run_header("CUDA bundle via the C API vs torch.matmul (cuBLAS) and lcmac.load",
                            props.name, __file__, argv),
               "dtype": args.dtype, "torch": torch.__version__, "rule": args.rule,
               "decisions": decisions, "results": results}
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)
        print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
