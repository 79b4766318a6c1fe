#!/usr/bin/env python
"""The shape-less CUDA bundle (``lcmac build --algo ALGO --target cuda --dtype bf16
--dynamic-shape`` without ``--shape``: one kernel of run-time M, N and K per algorithm, ``CudaConfig.dynamic_shape``)
against the exact-shape kernel of the same algorithm and against torch.matmul (cuBLAS), at
shapes the bundle was not built for.

    python scripts/bench_bundle_cuda.py --list                       # the builds and cases, nothing run
    python scripts/bench_bundle_cuda.py --build-only --jobs 8        # compile (no GPU needed), kept
    python scripts/bench_bundle_cuda.py                              # check and time (a GPU)
    python scripts/bench_bundle_cuda.py --sustained 5 --out bench/results/h200-bf16-bundle-cuda.json

Builds ``--jobs`` at a time (each TileLang worker with ``LCMAC_NVCC_JOBS`` nvcc processes):
per algorithm the bundle, as that command builds it, and one exact kernel per shape with
the config the bundle's kernel resolves to but ``dynamic_shape`` off (so the exact kernel may
read operands in place, ``direct_views``, which the run-time form does not).  They are kept
in ``--artifacts`` (default out/bench-bundle-cuda/<target>-<dtype>) and not built again while
their manifest is there, so ``--build-only`` on a machine with many cores can come first.
Then per case: the error of each variant against float64 on C's first and last rows (C
poisoned with NaN first), and interleaved rounds of ``--calls`` back-to-back calls (the
variants take turns, each round starting at another: ``lcmac.tune.measure.gpu_rounds``):
median and spread per variant (burst), with ``--sustained S`` also S seconds of each back to
back (the clocks at the power cap), and the ratios exact/bundle (≥ 0.97: within 3 %, the
goal) and torch/variant.  Writes JSON with device, date and command (``--out``, default
bench/results/<gpu>-<dtype>-bundle-cuda.json).  Timing needs a CUDA GPU; nothing is measured
without one.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
# the run-time-M bench's helpers: inputs, the error against float64
from bench_dynamic_rows import bench_case  # noqa: E402

DEFAULT_SHAPES = "8192x8192x8192,12000x10000x9000,20480x16384x16384"
DEFAULT_ALGOS = "strassen,winograd^2,gemm"


def _shape(text: str) -> tuple:
    M, N, K = (int(x) for x in text.lower().split("x"))
    return M, N, K


def plan(algos, shapes, dtype: str, target: str, art: Path, config: dict | None = None,
         also: dict | None = None) -> list[dict]:
    """The builds: per algorithm its bundle (``bundle: True``) and an exact kernel per shape,
    both with ``config`` (knobs over the defaults) where given; with ``also``, a second
    bundle with those knobs over ``config`` (timed beside the first, variant "bundle+")."""
    from lcmac.spec.cuda.config import CudaConfig
    from lcmac.spec.shape_rules import ANY_MAX_SHAPE
    from lcmac.spec.targets import get_target
    arch = get_target(target).arch
    todo = []
    for algo in algos:
        tag = algo.replace("^", "sq")
        cfg = CudaConfig.from_dict({**(config or {}), "dynamic_shape": True}, dtype=dtype, arch=arch,
                                   lcma=algo != "gemm").to_dict()
        todo.append({"key": (algo, "bundle"), "algo": algo, "dtype": dtype, "bundle": True, "config": config,
                     "shape": ANY_MAX_SHAPE["cuda"], "dir": str(art / f"{tag}-bundle")})
        if also:
            todo.append({"key": (algo, "bundle+"), "algo": algo, "dtype": dtype, "bundle": True,
                         "shape": ANY_MAX_SHAPE["cuda"], "config": {**(config or {}), **also},
                         "dir": str(art / f"{tag}-bundle-also")})
        for M, N, K in shapes:
            todo.append({"key": (algo, (M, N, K)), "algo": algo, "dtype": dtype, "shape": (M, N, K),
                         "config": dict(cfg, dynamic_shape=False), "dir": str(art / f"{tag}-{M}x{N}x{K}")})
    return todo


def _kept(item) -> str | None:
    """The manifest (bundle index) of a build kept from an earlier run, or None."""
    d = Path(item["dir"])
    if item.get("bundle"):
        return str(d / "bundle.json") if (d / "bundle.json").is_file() else None
    found = sorted(p for p in d.glob("*.json") if p.with_suffix(".so").is_file()) if d.is_dir() else []
    return str(found[0]) if found else None


def build(todo: list[dict], jobs: int, budget_s: float, target: str) -> dict:
    """{key: manifest path or error text}: kept builds reused, the others built ``jobs`` at
    a time (a bundle by the command line's function); a build not started within
    ``budget_s`` seconds is skipped."""
    import lcmac
    from lcmac.artifact.bundle import build_bundle
    done = {it["key"]: _kept(it) for it in todo}
    left = [it for it in todo if done[it["key"]] is None]
    print(f"{len(todo) - len(left)} builds kept, {len(left)} to build, {jobs} at a time", flush=True)
    t0 = time.perf_counter()

    def one(it):
        if time.perf_counter() - t0 > budget_s:
            return it["key"], "skipped: --build-s budget spent before this build started"
        t = time.perf_counter()
        try:
            if it.get("bundle"):
                path = build_bundle(it["algo"], target, it["dtype"], [None], out_dir=it["dir"],
                                    config=it.get("config"), dynamic_shape=True)
            else:
                path = lcmac.build(it["algo"], target, it["dtype"], it["shape"], config=it["config"],
                                   out_dir=it["dir"])
        except Exception as e:          # one failed build must not stop the others
            return it["key"], f"build failed: {type(e).__name__}: {e}"
        print(f"  built {os.path.basename(it['dir'])} in {time.perf_counter() - t:.0f} s", flush=True)
        return it["key"], str(path)
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        done.update(pool.map(one, left))
    return done


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--algos", default=DEFAULT_ALGOS, help="comma-separated (default %(default)s; gemm: the plain GEMM)")
    ap.add_argument("--shapes", default=DEFAULT_SHAPES, help="comma-separated MxNxK (default %(default)s)")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    ap.add_argument("--target", default="cuda", help="cuda (the GPU present) or a CUDA target to cross-compile "
                                                     "for with --build-only (default %(default)s)")
    ap.add_argument("--rounds", type=int, default=7, help="interleaved rounds (default %(default)s)")
    ap.add_argument("--calls", type=int, default=10, help="calls per timed round (default %(default)s)")
    ap.add_argument("--sustained", type=float, default=0.0, metavar="S",
                    help="also S seconds of each variant back to back (default: burst only)")
    ap.add_argument("--kernels", action="store_true",
                    help="also each variant's time by kernel (torch's profiler), printed and in the JSON")
    ap.add_argument("--config", type=json.loads, default=None, metavar="JSON",
                    help="knobs for the bundle's kernel and the exact ones alike, e.g. '{\"persistent\": false}' "
                         "(keep a separate --artifacts per config)")
    ap.add_argument("--also", type=json.loads, default=None, metavar="JSON",
                    help="a second bundle with these knobs over --config, timed beside the first in the "
                         "same rounds (variant 'bundle+'), e.g. '{\"persistent\": false}'")
    ap.add_argument("--jobs", type=int, default=4, help="builds in parallel (default %(default)s)")
    ap.add_argument("--build-s", type=float, default=3600.0,
                    help="no exact build starts after this many seconds (default %(default)s)")
    ap.add_argument("--artifacts", type=Path, help="where builds are kept (default out/bench-bundle-cuda/<target>-<dtype>)")
    ap.add_argument("--build-only", action="store_true", help="build (or find kept builds) and stop")
    ap.add_argument("--list", action="store_true", help="print the builds and cases, run nothing")
    ap.add_argument("--out", help="results JSON (default bench/results/<gpu>-<dtype>-bundle-cuda.json)")
    args = ap.parse_args(argv)
    algos = [a.strip() for a in args.algos.split(",") if a.strip()]
    shapes = [_shape(s) for s in args.shapes.split(",") if s.strip()]
    if args.target == "cuda" and (args.list or args.build_only):
        import torch
        if not torch.cuda.is_available():
            args.target = "cuda-sm90a"          # no GPU here: cross-compile for the H100/H200
    from lcmac.spec.targets import get_target
    art = args.artifacts or ROOT / "out" / "bench-bundle-cuda" / f"{get_target(args.target).name}-{args.dtype}"
    todo = plan(algos, shapes, args.dtype, args.target, art, args.config, args.also)
    if args.list:
        for it in todo:
            what = ("exact kernel" if not it.get("bundle") else "bundle (one run-time-shape kernel)"
                    + (f" {json.dumps(it['config'])}" if it.get("config") else ""))
            kept = _kept(it)
            print(f"{it['algo']:12s} {what:36s} {'x'.join(map(str, it['shape'])):20s} "
                  f"{'kept: ' + kept if kept else 'to build: ' + it['dir']}")
        print(f"cases: {len(algos)} algorithms x {', '.join('x'.join(map(str, s)) for s in shapes)}; "
              f"variants bundle, exact, torch.matmul")
        return 0
    os.environ.setdefault("LCMAC_NVCC_JOBS", "2")
    t0 = time.perf_counter()
    built = build(todo, args.jobs, args.build_s, args.target)
    print(f"builds done in {time.perf_counter() - t0:.0f} s", flush=True)
    failed = {k: v for k, v in built.items() if not os.path.isfile(v)}
    for k, v in failed.items():
        print(f"  {k}: {v}")
    if args.build_only:
        return 1 if failed else 0
    import torch
    if not torch.cuda.is_available():
        print("bench_bundle_cuda: timing needs a CUDA GPU (torch.cuda.is_available() is False); "
              "--build-only compiles without one", file=sys.stderr)
        return 2
    import lcmac
    from lcmac.tune.measure import run_header
    results, missing = [], []
    device = torch.cuda.get_device_name(0)
    out = args.out or str(ROOT / "bench" / "results" / (
        f"{device.lower().replace('nvidia ', '').replace(' ', '-')}-{args.dtype}-bundle-cuda.json"))

    def write() -> tuple[dict, list]:
        """(summary, exact/bundle ratios) of the results so far, written after every case (a run
        cut short keeps what it measured)."""
        ratios = [r["exact_over_bundle"] for r in results if "exact_over_bundle" in r]
        summary = {"cases": len(results), "exact_over_bundle_min": min(ratios) if ratios else None,
                   "exact_over_bundle_median": statistics.median(ratios) if ratios else None,
                   "within_3_percent": all(x >= 0.97 for x in ratios) if ratios else None}
        doc = {**run_header("bundle-cuda", device, __file__, argv), "dtype": args.dtype,
               "config": args.config, "also": args.also, "rounds": args.rounds, "calls": args.calls,
               "sustained_s": args.sustained,
               "summary": summary, "results": results, "not_run": missing}
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        with open(out, "w") as f:
            json.dump(doc, f, indent=1)
        return summary, ratios
    for algo in algos:
        bundle = built[(algo, "bundle")]
        for M, N, K in shapes:
            fns = {}
            for name, got in (("exact", built[(algo, (M, N, K))]), ("bundle", bundle),
                              *((("bundle+", built[(algo, "bundle+")]),) if args.also else ())):
                if os.path.isfile(got):
                    fns[name] = lcmac.load(os.path.dirname(got) if name.startswith("bundle") else got)
                else:
                    missing.append({"algorithm": algo, "M": M, "N": N, "K": K, "variant": name, "why": got})
            if fns:
                row = bench_case(M, N, K, algo, fns, args, other="bundle")
                v = row["variants"]
                if "exact" in v and "bundle+" in v:
                    row["exact_over_bundle+"] = v["exact"]["median_s"] / v["bundle+"]["median_s"]
                    print(f"  exact/bundle+  {row['exact_over_bundle+']:.3f}")
                results.append(row)
                write()
            torch.cuda.empty_cache()
    summary, ratios = write()
    print(f"\nexact/bundle over {len(ratios)} cases: min {summary['exact_over_bundle_min']}, "
          f"median {summary['exact_over_bundle_median']}; within 3 %: {summary['within_3_percent']}")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
