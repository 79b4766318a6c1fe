#!/usr/bin/env python
"""bfloat16 CPU artifacts (the AMX kernel, ``--config '{"amx": true}'``) against torch's bf16
CPU matmul (oneDNN), interleaved in one process; needs torch, not numpy or apache-tvm.

Every artifact given (manifest, or the ``.so`` beside it) is grouped by shape.  Per shape:
random normal bf16 A, B; each artifact's C and torch's compared with the float64 product
(relative Frobenius error); then, for shapes of at least ``--time-min`` multiply-adds, every
variant and torch timed round-robin (``--rounds`` rounds, a pause before each timed call, each
timed call after an untimed one).  Prints the median, spread ((max - min) / median), effective
TFLOP/s (2·M·N·K / t, the classical count) and the ratio to torch, and which oneDNN kernel
torch's matmul ran (``ONEDNN_VERBOSE`` in a child process, e.g. ``brg_matmul:avx512_core_amx``);
writes JSON.

    python3 scripts/bench_cpu_amx.py --artifacts DIR/*.json --threads 16 --out res.json
    python3 scripts/bench_cpu_amx.py --artifacts DIR/*.json --time-min 0 --rounds 3

``--check BOUND``: exit 1 when an artifact's error exceeds BOUND × (1 + torch's error at that
shape) — the correctness check of a bf16 build (an LCMA's combined operands are rounded to bf16
once more than a GEMM's, so its error is a few times torch's).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
# the CPU bench's helpers (it imports neither numpy nor apache-tvm at module level)
from bench_cpu import OwnThread, _labels, artifact_manifests, cpu_description, interleaved  # noqa: E402


def onednn_kernel(M: int, N: int, K: int, threads: int) -> str:
    """The oneDNN implementation torch's bf16 CPU matmul ran at M×N×K (e.g.
    ``brg_matmul:avx512_core_amx``), read from ``ONEDNN_VERBOSE`` in a child process (the
    verbose mode is set before oneDNN starts), or why it is not known: "vs torch" is against
    that kernel, not against oneDNN's best."""
    code = ("import torch; torch.set_num_threads(%d); "
            "a = torch.ones(%d, %d, dtype=torch.bfloat16); b = torch.ones(%d, %d, dtype=torch.bfloat16); "
            "torch.matmul(a, b)" % (threads, M, K, K, N))
    env = {**os.environ, "ONEDNN_VERBOSE": "1"}
    try:
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, timeout=120).stdout
    except (OSError, subprocess.SubprocessError) as e:
        return f"unknown ({e})"
    # onednn_verbose,<...>,exec,cpu,matmul,<implementation>,... (the primitive that ran)
    kernels = [f.split(",") for f in out.splitlines() if ",exec,cpu," in f]
    names = sorted({parts[parts.index("exec") + 3] for parts in kernels if "matmul" in parts
                    or "inner_product" in parts})
    return ", ".join(names) if names else "no oneDNN primitive ran (ATen's own kernel)"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--artifacts", nargs="+", required=True, metavar="FILE")
    ap.add_argument("--threads", type=int, default=0, help="torch and TVM threads (default: all CPUs)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--pause", type=float, default=0.2)
    ap.add_argument("--time-min", type=float, default=1e9,
                    help="time shapes with at least this many multiply-adds (M·N·K); smaller "
                         "ones are only checked (default 1e9)")
    ap.add_argument("--check", type=float, default=None, metavar="BOUND")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="JSON written here")
    args = ap.parse_args(argv)

    threads = args.threads or len(os.sched_getaffinity(0))
    os.environ["TVM_NUM_THREADS"] = str(threads)       # before the TVM runtime starts its pool
    import torch
    import lcmac
    torch.set_num_threads(threads)

    groups: dict[tuple, list] = {}
    manifests = artifact_manifests(args.artifacts)
    for m, label in zip(manifests, _labels(manifests)):     # same names told apart by folder
        f = lcmac.load(m)
        man = f.manifest
        if man.dtype != "bfloat16":
            print(f"# skipped {m}: {man.dtype} (this compares bfloat16 with torch)")
            continue
        groups.setdefault((man.M, man.N, man.K), []).append((label, OwnThread(f)))   # own pool
    if not groups:
        print("no bfloat16 artifacts given", file=sys.stderr)
        return 2
    print(f"# lcmac bf16 CPU artifacts vs torch.matmul (bf16, CPU), {threads} threads "
          f"(torch.get_num_threads() = {torch.get_num_threads()}, TVM_NUM_THREADS = "
          f"{os.environ['TVM_NUM_THREADS']})")
    print(f"# {cpu_description()}")
    print(f"# torch {torch.__version__}, cpu capability {torch.backends.cpu.get_cpu_capability()}, "
          f"mkldnn {torch.backends.mkldnn.is_available()}")
    gen = torch.Generator().manual_seed(args.seed)
    results, bad = [], []
    for (M, N, K), fns in sorted(groups.items(), key=lambda kv: kv[0][0] * kv[0][1] * kv[0][2]):
        A = torch.randn(M, K, generator=gen).to(torch.bfloat16)
        B = torch.randn(K, N, generator=gen).to(torch.bfloat16)
        C = torch.empty(M, N, dtype=torch.bfloat16)
        ref = A.double() @ B.double()
        nref = float(ref.norm())
        errs = {"torch": float((torch.matmul(A, B).double() - ref).norm() / nref)}
        for name, f in fns:
            f(A, B, out=C)
            errs[name] = float((C.double() - ref).norm() / nref)
        del ref
        row = {"M": M, "N": N, "K": K, "variants": {}, "torch_kernel": onednn_kernel(M, N, K, threads)}
        timed = M * N * K >= args.time_min and args.rounds > 0
        runs = {}
        if timed:
            calls = [("torch", lambda: torch.matmul(A, B, out=C))]
            calls += [(n, (lambda f=f: f.timed(A, B, out=C))) for n, f in fns]
            runs = interleaved(calls, args.rounds, args.pause)
        flops = 2.0 * M * N * K
        print(f"\nbfloat16 M={M} N={N} K={K}" + ("" if timed else "  (checked, not timed)")
              + f"; torch.matmul ran {row['torch_kernel']}")
        print(f"  {'':52s} {'median ms':>9s} {'spread':>7s} {'TFLOP/s':>8s} {'vs torch':>8s} {'rel.err':>9s}")
        base = statistics.median(runs["torch"]) if timed else None
        for name in ["torch"] + [n for n, _ in fns]:
            v = {"rel_error": errs[name]}
            line = f"  {name:52s} "
            if timed:
                ts = runs[name]
                med = statistics.median(ts)
                v.update(median_s=med, spread=(max(ts) - min(ts)) / med, tflops=flops / med / 1e12,
                         ratio_vs_torch=base / med, seconds=ts)
                line += (f"{med * 1e3:9.2f} {v['spread'] * 100:6.1f}% {v['tflops']:8.2f} "
                         f"{v['ratio_vs_torch']:7.3f}x ")
            else:
                line += f"{'':9s} {'':7s} {'':8s} {'':8s} "
            line += f"{errs[name]:9.2e}"
            if name != "torch" and args.check is not None and errs[name] > args.check * (errs["torch"] + 1e-6):
                line += "  FAIL"
                bad.append((name, errs[name]))
            print(line)
            if name != "torch":
                v["config"] = dict(fns)[name].manifest.config
                v["gemm_kernel"] = dict(fns)[name].manifest.extra.get("gemm_kernel")
                v["algorithm"] = dict(fns)[name].manifest.algorithm.get("name")
            row["variants"][name] = v
        results.append(row)
    print("\n# spread = (max - min) / median of the rounds; vs torch = torch's median / this median")
    if args.out:
        doc = {"benchmark": "lcmac bf16 CPU artifacts vs torch.matmul (oneDNN)",
               "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
               "command": " ".join(["python3"] + sys.argv), "device": cpu_description(),
               "threads": threads, "torch_num_threads": torch.get_num_threads(),
               "TVM_NUM_THREADS": os.environ["TVM_NUM_THREADS"], "rounds": args.rounds,
               "pause_s": args.pause, "torch": torch.__version__,
               "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
               "lcmac": lcmac.__version__, "flops": "2*M*N*K (classical count)",
               "error": "||C - A·B||_F / ||A·B||_F, A·B in float64 from the same bf16 inputs",
               "load_average": os.getloadavg(), "results": results}
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {args.out}")
    if bad:
        print(f"FAILED: {', '.join(f'{n} ({e:.2e})' for n, e in bad)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
