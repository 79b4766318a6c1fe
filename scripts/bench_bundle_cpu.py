#!/usr/bin/env python
"""The shape-less CPU bundle (``lcmac build --algo ALGO`` without ``--shape``) against the
exact-shape kernels of the same algorithm (``lcmac build --algo ALGO --shape MxNxK``),
numpy's matmul and torch.matmul, float32, at shapes the bundle was not built for.

Builds the bundle and one exact kernel per shape with the same calls the command line makes
(``--bundle DIR`` takes a bundle built before), checks every result against the float64
product, then times the four in interleaved rounds: each round runs every variant once after
an untimed warm-up call and a pause (OpenBLAS's spinning workers slow whatever runs next), in
the opposite order every other round, so a drift of the machine's speed and the position in
the round cancel in the paired ratios.  Per shape it prints the median and spread of each,
the paired ratios of the bundle to the exact kernel (the exact kernel's time / the bundle's in
the same round: ≥ 1 is the bundle as fast) and of the bundle and the exact kernel to the
faster of numpy and torch (by median), and how the bundle cut the shape.

    python3 scripts/bench_bundle_cpu.py                          # 512³, 1000x777x1234, 3000x2500x2000
    python3 scripts/bench_bundle_cpu.py --bundle out --rounds 11 --shapes 2048x2048x2048
    python3 scripts/bench_bundle_cpu.py --record cpu-epyc-avx512-float32-bundle-any.json

Writes out/bench-bundle-cpu/<host>-<UTC time>.json (``--out`` picks another path); with
``--record NAME`` writes that file in bench/results/ instead and adds (or replaces) its entry in
bench/results/index.json (the page citing it is for you to write).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
# the CPU bench's helpers (it imports neither numpy nor apache-tvm at module level)
from bench_cpu import OwnThread, cpu_description, select_target  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT_DIR = ROOT / "out" / "bench-bundle-cpu"
RESULTS = ROOT / "bench" / "results"
SHAPES = "512x512x512,1000x777x1234,3000x2500x2000"
#: the CPU flags that select kernels (the JSON records which of them this CPU has)
SIMD_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_bf16", "amx_tile", "amx_bf16",
              "asimd", "sve", "sve2")


def cpu_flags() -> list[str]:
    try:
        for line in open("/proc/cpuinfo"):
            if line.lower().startswith(("flags", "features")):
                have = set(line.split(":", 1)[1].split())
                return [f for f in SIMD_FLAGS if f in have]
    except OSError:
        pass
    return []


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    from lcmac.core.shapes import parse_shape
    return [tuple(parse_shape(s)) for s in text.split(",") if s.strip()]


def build(args, target, shapes) -> tuple[Path, dict, float]:
    """(the bundle's directory, exact kernel manifest per shape, seconds the bundle took)."""
    from lcmac.artifact.build import build_many
    from lcmac.artifact.bundle import build_bundle
    root = Path(args.build_dir)
    t0 = time.perf_counter()
    if args.bundle:
        bundle, seconds = Path(args.bundle), None
    else:
        bundle = build_bundle(args.algo, target, "float32", [None], out_dir=root / "any").parent
        seconds = time.perf_counter() - t0
    paths = build_many([dict(algo=args.algo, target=target, dtype="float32", shape=s,
                             out_dir=str(root / "exact")) for s in shapes])
    for s, p in zip(shapes, paths):
        if isinstance(p, BaseException):
            raise SystemExit(f"building the exact {args.algo} kernel at {'x'.join(map(str, s))}: {p}")
    return bundle, dict(zip(shapes, paths)), seconds


def paired(num, den) -> dict:
    """num[i] / den[i] over the rounds: median, min, max."""
    r = [a / b for a, b in zip(num, den)]
    return {"median": statistics.median(r), "min": min(r), "max": max(r)}


def spread(ts) -> float:
    """(max - min) / median of the rounds."""
    return (max(ts) - min(ts)) / statistics.median(ts)


def time_shape(shape, calls, rounds: int, pause: float) -> dict[str, list[float]]:
    """Seconds per round of each (name, call), interleaved, the order reversed every other
    round; each timed call follows a pause and an untimed call."""
    runs = {name: [] for name, _ in calls}
    for i in range(rounds):
        for name, call in (calls if i % 2 == 0 else calls[::-1]):
            time.sleep(pause)
            call()
            t = time.perf_counter()
            took = call()                # OwnThread.timed returns the seconds on its thread
            runs[name].append(took if isinstance(took, float) else time.perf_counter() - t)
    return runs


def plan_text(plan, shape) -> dict:
    """How the bundle cut a shape: per dimension its spans [start, size, overlap, the piece
    kernels' size (M: larger where the rows are a run-time count)], whether the vendor GEMM
    ran it, and the multiply-adds computed over the product's."""
    M, N, K = shape
    return {**{dim: [[s.start, s.size, s.overlap, s.piece] for s in getattr(plan, dim)] for dim in "MNK"},
            "vendor": plan.vendor, "computed": plan.computed() / (M * N * K)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--algo", default="strassen")
    ap.add_argument("--shapes", default=SHAPES, help=f"MxNxK,... (default {SHAPES})")
    ap.add_argument("--bundle", default=None, help="a shape-less bundle built before (its directory)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--pause", type=float, default=0.3, help="seconds of quiet before each timed call")
    ap.add_argument("--target", default="host", help="lcmac target (default: this machine's)")
    ap.add_argument("--build-dir", default=str(Path(tempfile.gettempdir()) / "lcmac-bench-bundle-cpu"))
    ap.add_argument("--out", default=None, help="the JSON written (default: out/bench-bundle-cpu/...)")
    ap.add_argument("--record", default=None, metavar="NAME",
                    help="write this file in bench/results/ and its entry in bench/results/index.json instead")
    args = ap.parse_args(argv)
    if args.rounds < 2:
        ap.error("--rounds must be at least 2 (the order alternates between rounds)")

    # thread counts before numpy, torch and the TVM runtime start their pools
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "TVM_NUM_THREADS"):
        os.environ[var] = str(args.threads)
    import numpy as np
    import torch
    import lcmac
    from lcmac.artifact.bundle import read_bundle
    from lcmac.spec.shape_rules import plan_pieces
    torch.set_num_threads(args.threads)

    target = select_target(args.target)
    shapes = parse_shapes(args.shapes)
    load_before = os.getloadavg()
    bundle_dir, exact, build_s = build(args, target, shapes)
    rule = read_bundle(bundle_dir).rules[0]
    f_bundle = OwnThread(lcmac.load(bundle_dir))
    print(f"# {args.algo}: shape-less bundle {bundle_dir} ({rule.rule}, "
          + (f"pieces {rule.pieces}" if rule.pieces else f"rows {rule.rows}, tile {rule.tile}") + ")")
    print(f"# {cpu_description()}; {args.threads} threads; target {target.name}")
    print(f"# numpy {np.__version__}, torch {torch.__version__}; {args.rounds} interleaved rounds "
          f"(order alternating), {args.pause}s pause; load average {load_before[0]:.1f}")
    results = []
    for shape in shapes:
        M, N, K = shape
        rng = np.random.default_rng(0)
        A = rng.standard_normal((M, K)).astype(np.float32)
        B = rng.standard_normal((K, N)).astype(np.float32)
        ref = A.astype(np.float64) @ B.astype(np.float64)
        nref = float(np.linalg.norm(ref))
        f_exact = OwnThread(lcmac.load(exact[shape]))
        At, Bt = torch.from_numpy(A), torch.from_numpy(B)
        outs = {"bundle": np.empty((M, N), np.float32), "exact": np.empty((M, N), np.float32),
                "numpy": np.empty((M, N), np.float32), "torch": torch.empty((M, N))}
        calls = [("bundle", lambda: f_bundle.timed(A, B, out=outs["bundle"])),
                 ("exact", lambda: f_exact.timed(A, B, out=outs["exact"])),
                 ("numpy", lambda: np.matmul(A, B, out=outs["numpy"])),
                 ("torch", lambda: torch.matmul(At, Bt, out=outs["torch"]))]
        for _, call in calls:
            call()
        errs = {name: float(np.linalg.norm(np.asarray(c) - ref) / nref) for name, c in outs.items()}
        del ref
        runs = time_shape(shape, calls, args.rounds, args.pause)
        med = {name: statistics.median(ts) for name, ts in runs.items()}
        base = min(("numpy", "torch"), key=lambda n: med[n])
        vs_exact = paired(runs["exact"], runs["bundle"])
        row = {"M": M, "N": N, "K": K, "baseline": base,
               "bundle_vs_exact": vs_exact,
               "bundle_vs_baseline": paired(runs[base], runs["bundle"]),
               "exact_vs_baseline": paired(runs[base], runs["exact"]),
               "plan": plan_text(plan_pieces(M, N, K, rule.pieces), shape) if rule.pieces else None,
               "variants": {name: {"median_s": med[name], "min_s": min(ts), "max_s": max(ts),
                                   "spread": spread(ts), "gflops": 2.0 * M * N * K / med[name] / 1e9,
                                   "rel_error": errs[name], "seconds": ts}
                            for name, ts in runs.items()}}
        results.append(row)
        print(f"\n{M}x{N}x{K}  (baseline: {base}, the faster of numpy and torch)")
        print(f"  {'':8s} {'median ms':>10s} {'spread':>7s} {'GFLOP/s':>8s} {'rel.err':>9s}")
        for name, v in row["variants"].items():
            print(f"  {name:8s} {v['median_s'] * 1e3:10.2f} {v['spread'] * 100:6.1f}% {v['gflops']:8.1f} "
                  f"{v['rel_error']:9.2e}")
        for what, key in (("bundle / exact kernel", "bundle_vs_exact"),
                          (f"bundle / {base}", "bundle_vs_baseline"), (f"exact / {base}", "exact_vs_baseline")):
            r = row[key]
            print(f"  {what:22s} {r['median']:.3f}x paired (rounds {r['min']:.3f}..{r['max']:.3f})")
    print("\n# a ratio is the other's time / this one's in the same round (> 1: this one faster); "
          "spread = (max - min) / median")
    doc = {"benchmark": "shape-less CPU bundle vs exact-shape kernels, numpy, torch.matmul",
           "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
           "command": " ".join([Path(sys.executable).name] + sys.argv), "host": platform.node(),
           "device": cpu_description(), "cpu_flags": cpu_flags(), "target": target.name,
           "threads": args.threads, "rounds": args.rounds, "pause_s": args.pause,
           "numpy": np.__version__, "torch": torch.__version__, "lcmac": lcmac.__version__,
           "algorithm": args.algo, "dtype": "float32", "bundle": str(bundle_dir),
           "bundle_rule": rule.to_dict(), "bundle_build_s": build_s,
           "exact": {"x".join(map(str, s)): str(p) for s, p in exact.items()},
           "flops": "2*M*N*K (classical count)",
           "load_average": {"before": load_before, "after": os.getloadavg()}, "results": results}
    write(args, doc)
    return 0


def write(args, doc: dict) -> None:
    if args.record:
        out = RESULTS / args.record
    elif args.out:
        out = Path(args.out)
    else:
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        out = DEFAULT_OUT_DIR / f"{platform.node() or 'host'}-{stamp}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, out)
    print(f"\nwrote {out}")
    if args.record:
        index_path = RESULTS / "index.json"
        index = json.loads(index_path.read_text())
        ratios = ", ".join(f"{r['M']}x{r['N']}x{r['K']} {r['bundle_vs_exact']['median']:.2f}x"
                           for r in doc["results"])
        entry = {"file": out.name,
                 "what": f"float32 {doc['algorithm']}: the shape-less bundle (lcmac build without "
                         f"--shape) against the exact-shape kernels, numpy and torch.matmul, "
                         f"{doc['rounds']} interleaved rounds; bundle / exact kernel (paired "
                         f"median): {ratios}",
                 "device": f"{doc['device']}, {doc['threads']} threads",
                 "date": doc["date"][:10], "command": doc["command"]}
        index["entries"] = [e for e in index["entries"] if e["file"] != out.name] + [entry]
        index_path.write_text(json.dumps(index, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        print(f"indexed in {index_path}")


if __name__ == "__main__":
    sys.exit(main())
