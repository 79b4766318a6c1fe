#!/usr/bin/env python
"""Structured products on the GPU (lcmac.api.structured) against cuSPARSE and dense cuBLAS, in one
run.

Block-sparse A (BSR, bs×bs blocks at random positions, ``--density`` of the blocks nonzero),
M×K times a dense K×N B:

    lcmac bsr         lcmac.api.structured.bsr_matmul(algo="vendor"): one batched product
                      (torch.bmm) + index_add
    lcmac bsr gemm    the same with lcmac's own batched kernel (algo="gemm")
    lcmac bsr fused   bsr_matmul(..., algo="fused"): lcmac's fused kernel (schedules.cuda.bsr,
                      float32 as TF32), the whole call (checks, CSR of the blocks, one copy
                      of it to the GPU); the bsr rows' ratios are against it
    lcmac bsr fused prepared  bsr_matmul(prepare_bsr(...), B, algo="fused"): the same kernel,
                      A prepared once before the timing (no index work, no wait per call)
    fused kernel <c>  (``--fused-variants``) that kernel alone with tile config <c> on CSR
                      arrays made beforehand ({} the default tile)
    cusparse bsr      torch.sparse_bsr_tensor(...) @ B (torch.sparse.mm: cuSPARSE bsrmm)
    dense             A formed dense beforehand, torch.matmul (cuBLAS)

Block-sparse A and B (``--kinds spgemm``; both M×K / K×N in bs-blocks at ``--density``):

    lcmac spgemm      lcmac.api.structured.bsr_spgemm: host symbolic phase (the block pairs), one
                      batched product (torch.bmm) + index_add into C's blocks (a BSR)
    lcmac spgemm gemm the same with lcmac's own batched kernel
    cusparse csr      A_csr @ B_csr (torch sparse CSR × CSR: cuSPARSE SpGEMM), float32 only
    dense             A and B formed dense beforehand, torch.matmul

Low-rank A = U·Vᵀ (rank r):

    lcmac lowrank     lcmac.api.structured.lowrank_matmul(U, V, B)
    torch U(VtB)      U @ (V.T @ B): the same order in plain torch
    lcmac.bmm x2 auto / vendor   the two products as lcmac.bmm calls on batch-1 views (what
                      lowrank_matmul ran for 2-D operands before it called the matmul itself)
    torch.bmm x2      the same two products as torch.bmm calls on batch-1 views
    dense             A = U·Vᵀ formed beforehand, torch.matmul

Each result's relative error against a float64 product of the same operands is recorded
(float32 runs with TF32 off: FP32 against FP32, but for lcmac's own kernels, which multiply
float32 as TF32).  Timing: ``--rounds`` interleaved rounds of CUDA-event timed calls, median and
spread; ratios are baseline time / lcmac time (the row's ``ratios_against``).  Each variant's
``host_s``: the host seconds per call of ``--calls`` back-to-back calls, timed without waiting
for the GPU (launch, checks and Python; a call that waits for the GPU counts the wait).
lcmac's kernels are compiled (in parallel, into the kernel cache) before the first case.

    python scripts/bench_structured.py --out bench/results/x.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def rel_error(C, ref) -> float:
    import torch
    if hasattr(C, "to_dense"):            # a BSR (lcmac) or a torch sparse tensor
        C = C.to_dense()
    return float(torch.linalg.norm(C.double() - ref) / torch.linalg.norm(ref).clamp_min(1e-30))


def fused_variants(blocks, rows, cols, B, M, bs, configs):
    """{name: call} of the fused kernel alone with each tile config, on CSR arrays made here
    (the blocks come sorted by block row)."""
    import torch

    from lcmac.api.call_args import target_for
    from lcmac.api.structured import bsr_csr, bsr_kernel
    order, row_ptr, col_idx = bsr_csr(rows.cpu().numpy(), cols.cpu().numpy(), M // bs)
    assert order is None
    rp, ci = (torch.from_numpy(x).cuda() for x in (row_ptr, col_idx))
    dt = str(B.dtype).replace("torch.", "")
    out = {}
    for cfg in configs:
        fn = bsr_kernel(target_for("cuda"), dt, bs, cfg)
        out[f"fused kernel {json.dumps(cfg, sort_keys=True)}"] = (lambda f: lambda: f(blocks, B, rp, ci, M))(fn)
    return out


def bsr_case(M, K, N, bs, density, dtype, g, configs=()):
    import torch

    from lcmac.api.structured import bsr_matmul, prepare_bsr
    nb_r, nb_c = M // bs, K // bs
    nnzb = max(1, int(round(density * nb_r * nb_c)))
    pos = torch.randperm(nb_r * nb_c, device="cuda", generator=g)[:nnzb].sort().values
    rows, cols = pos // nb_c, pos % nb_c
    blocks = torch.randn(nnzb, bs, bs, device="cuda", generator=g).to(dtype)
    B = torch.randn(K, N, device="cuda", generator=g).to(dtype)
    crow = torch.zeros(nb_r + 1, dtype=torch.int64, device="cuda")
    crow[1:] = torch.bincount(rows, minlength=nb_r).cumsum(0)
    A_bsr = torch.sparse_bsr_tensor(crow, cols, blocks, (M, K))
    A = A_bsr.to_dense()
    ref = A.double() @ B.double()
    v = {"lcmac bsr": lambda: bsr_matmul(blocks, rows, cols, B, (M, K), algo="vendor"),
         "lcmac bsr gemm": lambda: bsr_matmul(blocks, rows, cols, B, (M, K), algo="gemm"),
         "lcmac bsr fused": lambda: bsr_matmul(blocks, rows, cols, B, (M, K), algo="fused"),
         "lcmac bsr fused prepared": lambda: bsr_matmul(prepared, B, algo="fused"),
         "dense": lambda: A @ B}
    prepared = prepare_bsr(blocks, rows, cols, (M, K))
    try:
        v.update(fused_variants(blocks, rows, cols, B, M, bs, configs))
    except Exception as e:  # noqa: BLE001 - recorded, the others still run
        print(f"  fused variants: {str(e).splitlines()[0][:160]}")
    for name in [k for k in v if k.startswith(("lcmac bsr ", "fused kernel"))]:
        try:
            v[name]()                        # lcmac's own kernels (compiled here if not before)
        except Exception as e:  # noqa: BLE001 - recorded, the others still run
            v.pop(name)
            print(f"  {name}: {str(e).splitlines()[0][:160]}")
    try:
        v["cusparse bsr"] = lambda: A_bsr @ B
        v["cusparse bsr"]()
    except (RuntimeError, NotImplementedError) as e:
        v.pop("cusparse bsr")
        print(f"  cusparse bsr: {str(e).splitlines()[0][:120]}")
    return v, ref, {"nnz_blocks": nnzb}


def _random_bsr(M, K, bs, density, dtype, g):
    import torch

    from lcmac.api.structured import BSR
    nb_r, nb_c = M // bs, K // bs
    nnzb = max(1, int(round(density * nb_r * nb_c)))
    pos = torch.randperm(nb_r * nb_c, device="cuda", generator=g)[:nnzb].sort().values
    blocks = torch.randn(nnzb, bs, bs, device="cuda", generator=g).to(dtype)
    return BSR(blocks, pos // nb_c, pos % nb_c, (M, K))


def spgemm_case(M, K, N, bs, density, dtype, g):
    import torch

    from lcmac.api.structured import bsr_spgemm
    a, b = _random_bsr(M, K, bs, density, dtype, g), _random_bsr(K, N, bs, density, dtype, g)
    A, B = a.to_dense(), b.to_dense()
    ref = A.double() @ B.double()
    v = {"lcmac spgemm": lambda: bsr_spgemm(a, b),
         "lcmac spgemm gemm": lambda: bsr_spgemm(a, b, algo="gemm"),
         "dense": lambda: A @ B}
    for name, fn in list(v.items()):
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - recorded, the others still run
            v.pop(name)
            print(f"  {name}: {str(e).splitlines()[0][:160]}")
    if dtype == torch.float32:
        try:
            A_csr, B_csr = A.to_sparse_csr(), B.to_sparse_csr()
            v["cusparse csr"] = lambda: A_csr @ B_csr
            v["cusparse csr"]()
        except (RuntimeError, NotImplementedError) as e:
            v.pop("cusparse csr", None)
            print(f"  cusparse csr: {str(e).splitlines()[0][:120]}")
    return v, ref, {"nnz_blocks": [int(a.blocks.shape[0]), int(b.blocks.shape[0])]}


def lowrank_case(M, K, N, r, dtype, g):
    import torch

    from lcmac.api.bmm import bmm
    from lcmac.api.structured import lowrank_matmul
    U = torch.randn(M, r, device="cuda", generator=g).to(dtype)
    V = torch.randn(K, r, device="cuda", generator=g).to(dtype)
    B = torch.randn(K, N, device="cuda", generator=g).to(dtype)
    A = U @ V.T
    ref = U.double() @ (V.double().T @ B.double())
    u, vt, b = U[None], V.T[None], B[None]
    return ({"lcmac lowrank": lambda: lowrank_matmul(U, V, B),
             "torch U(VtB)": lambda: U @ (V.T @ B),
             "lcmac.bmm x2 auto": lambda: bmm(u, bmm(vt, b))[0],
             "lcmac.bmm x2 vendor": lambda: bmm(u, bmm(vt, b, algo="vendor"), algo="vendor")[0],
             "torch.bmm x2": lambda: torch.bmm(u, torch.bmm(vt, b))[0],
             "dense": lambda: A @ B}, ref, {"rank": r})


def host_seconds(fn, calls: int) -> float:
    """Host seconds per call of ``calls`` back-to-back calls, the GPU not waited for (it is
    after the timing, so the next variant starts on an idle GPU)."""
    import time

    import torch
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t = time.perf_counter() - t0
    torch.cuda.synchronize()
    return t / calls


def run_case(name, variants, ref, extra, args, flops):
    import torch

    from lcmac.tune.measure import gpu_rounds
    errors = {k: rel_error(fn(), ref) for k, fn in variants.items()}
    torch.cuda.synchronize()
    times, _ = gpu_rounds(list(variants.items()), args.rounds, args.calls)
    host = {k: host_seconds(fn, args.calls) for k, fn in variants.items()}
    lcmac_key = next((k for k in variants if k == "lcmac bsr fused"),
                     next(k for k in variants if k.startswith("lcmac")))
    row = {"case": name, **extra, "ratios_against": lcmac_key, "variants": {}}
    for k, ts in times.items():
        med = statistics.median(ts)
        row["variants"][k] = {"median_s": med, "rounds_s": ts, "spread": (max(ts) - min(ts)) / med,
                              "rel_error": errors[k], "dense_equivalent_tflops": flops / med / 1e12,
                              "host_s": host[k]}
    t_l = row["variants"][lcmac_key]["median_s"]
    for k, v in row["variants"].items():
        v["baseline_over_lcmac"] = v["median_s"] / t_l
        print(f"  {name:32s} {k:26s} {v['median_s'] * 1e3:9.3f} ms  spread {v['spread'] * 100:4.1f}%  "
              f"x{v['baseline_over_lcmac']:5.2f} of lcmac  host {v['host_s'] * 1e6:6.1f} us  "
              f"err {v['rel_error']:.1e}", flush=True)
    return row


def prebuild(args, N: int, configs) -> None:
    """lcmac's kernels of the run compiled in parallel, into the kernel cache: the fused
    kernel (and its ``configs``) and the batched kernel of the bs×bs by bs×N products."""
    from concurrent.futures import ThreadPoolExecutor

    from lcmac.api.bmm import batched_kernel
    from lcmac.api.call_args import target_for
    from lcmac.api.structured import bsr_kernel
    t = target_for("cuda")
    jobs = [(lambda dt=dt, bs=bs, c=c: bsr_kernel(t, dt, bs, c)) for dt in args.dtypes
            for bs in args.blocks for c in [None, *configs]]
    jobs += [(lambda dt=dt, bs=bs: batched_kernel(t, dt, (bs, N, bs))) for dt in args.dtypes for bs in args.blocks]

    def run(job):
        try:
            job()
        except Exception as e:  # noqa: BLE001 - the case that needs it says so again
            print(f"  prebuild: {str(e).splitlines()[0][:160]}")
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(run, jobs))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--shape", default="8192x8192x4096", help="MxKxN of A (M×K) times B (K×N)")
    ap.add_argument("--blocks", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--density", type=float, nargs="+", default=[0.01, 0.05, 0.2])
    ap.add_argument("--ranks", type=int, nargs="+", default=[64, 512])
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument("--kinds", nargs="+", default=["bsr", "lowrank"],
                    choices=["bsr", "lowrank", "spgemm"])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--fused-variants", default="[]",
                    help="JSON list of tile configs of the fused kernel, each timed alone ({}: default)")
    ap.add_argument("--out", help="write the results as JSON here")
    args = ap.parse_args(argv)
    import torch
    if not torch.cuda.is_available():
        print("bench_structured: no CUDA GPU", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False
    M, K, N = (int(x) for x in args.shape.split("x"))
    name = torch.cuda.get_device_name(0)
    print(f"# {name}, torch {torch.__version__}; A {M}x{K}, B {K}x{N}")
    configs = json.loads(args.fused_variants)
    if "bsr" in args.kinds:
        prebuild(args, N, configs)
    g = torch.Generator(device="cuda").manual_seed(0)
    results = []
    for dt in args.dtypes:
        dtype = getattr(torch, dt)
        for bs in args.blocks:
            for d in args.density:
                if "spgemm" in args.kinds:
                    v, ref, extra = spgemm_case(M, K, N, bs, d, dtype, g)
                    results.append({"kind": "spgemm", "dtype": dt, "block": bs, "density": d,
                                    **run_case(f"{dt} spgemm bs={bs} density={d}", v, ref, extra,
                                               args, 2 * M * K * N)})
                if "bsr" not in args.kinds:
                    continue
                v, ref, extra = bsr_case(M, K, N, bs, d, dtype, g, configs)
                results.append({"kind": "bsr", "dtype": dt, "block": bs, "density": d,
                                **run_case(f"{dt} bsr bs={bs} density={d}", v, ref, extra, args,
                                           2 * M * K * N)})
        for r in (args.ranks if "lowrank" in args.kinds else ()):
            v, ref, extra = lowrank_case(M, K, N, r, dtype, g)
            results.append({"kind": "lowrank", "dtype": dt,
                            **run_case(f"{dt} lowrank r={r}", v, ref, extra, args, 2 * M * K * N)})
    if args.out:
        from lcmac.tune.measure import run_header
        doc = {**run_header("structured products: lcmac.api.structured vs cuSPARSE and dense cuBLAS",
                            name, __file__, argv), "torch": torch.__version__,
               "shape": {"M": M, "K": K, "N": N}, "tf32": False,
               "tf32_note": "lcmac's own kernels (bsr gemm, bsr fused, bsr fused prepared, fused kernel) "
                             "multiply float32 as TF32",
               "results": results}
        Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
