#!/usr/bin/env python
"""CPU benchmark: the vendor GEMMs (numpy's BLAS, and torch.matmul's MKL / oneDNN where torch
is installed) vs lcmac's plain GEMM vs lcmac LCMAs, float32.

One process, every variant measured interleaved (round-robin, round r starting at the r-th
variant so that none is always first), with a pause before each timed call: OpenBLAS's worker
threads spin for ~0.1 s after a call and halve the speed of whatever runs next.  Reports the
median of the rounds as effective GFLOP/s (2·M·N·K / t, the classical flop count, so an LCMA's
gain shows as more GFLOP/s), the ratio to the faster baseline of the case (numpy or
torch.matmul, by median; of the medians) and the paired ratio (the median over the rounds of
that baseline's time / the variant's in the same round, which a drift of the machine's speed
during the run does not move).  The JSON keeps the ratios to numpy too, and names each
baseline's library, version and threads, the CPU model, its flags and the thread counts.
Builds for this machine's target (``select_target``: x86-64 by its AVX level; on AArch64
the fixed-length SVE target for the CPU's vector length, else NEON), so it runs unchanged on
an AArch64 host; ``--target`` overrides, ``--dry-run`` prints the plan without building.

    python scripts/bench_cpu.py                        # squares 1024/2048/4096 + LLM shapes
    python scripts/bench_cpu.py --sizes 2048 --no-llm --rounds 5
    python scripts/bench_cpu.py --sizes 4096 --no-llm --variants gemm,strassen^2 --products
    python scripts/bench_cpu.py --artifacts out/*.json # artifacts you built, against the baselines
    python scripts/bench_cpu.py --sizes 2048,4096 --no-llm --variants none   # the baselines alone

With ``--artifacts`` nothing is built: every CPU artifact given (its manifest, or the ``.so``
beside it) is timed against the baselines at its own shape and dtype, interleaved in the same rounds;
files that are not artifact manifests are skipped with a note.  Each lcmac callable runs on a
thread of its own (``OwnThread``), as it would in a program that uses one: apache-tvm's
workspace pool belongs to the calling thread, so artifacts called from one thread would share
their workspaces' pages (and so whether those are huge pages).
Writes out/bench-cpu/<host>-<dtype>-<UTC time>.json (``out/`` is not tracked; ``--out`` picks
another path).  Results that the documentation cites are copied into bench/results/ by hand
and listed in bench/results/index.json.
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
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: where results go unless --out says otherwise: untracked (.gitignore has /out/)
DEFAULT_OUT_DIR = ROOT / "out" / "bench-cpu"

# (label, model, layer, M): moderate sizes from bench/llm_shapes.json (N, K read from the file)
LLM_PICKS = [("DeepSeek-R1", "q_a_proj", 2048), ("DeepSeek-R1", "expert_down", 2048),
             ("Qwen3-235B-A22B", "expert_gate_or_up", 4096), ("HunyuanVideo", "attn_proj", 2048)]

# (label, algo, config overrides): the default config per algorithm (CpuConfig defaults:
# fused Combine H up to 4 C blocks, unfused beyond), plus strassen^2 fused for comparison
VARIANTS = [("gemm", "gemm", {}),
            ("strassen", "strassen", {}),
            ("winograd", "winograd", {}),
            ("strassen^2", "strassen^2", {}),                    # default: unfused (16 C blocks)
            ("strassen^2-fused", "strassen^2", {"fused": True}),
            ("winograd^2", "winograd^2", {}),                    # 15 additions a level (CSE)
            # 48 products, one fewer than Strassen² (Dumas-Pernet-Sedoglavic, rational coefficients)
            ("dps-4x4x4-r48", "dps-4x4x4-r48", {}),
            ("hopcroft-kerr", "hopcroft-kerr", {}),
            ("fgr-3x3x3-r23", "fgr-3x3x3-r23", {}),
            # the products on the vendor BLAS (numpy's OpenBLAS), lcmac's combines around them
            ("strassen-vendor", "strassen", {"vendor_base": True}),
            ("winograd-vendor", "winograd", {"vendor_base": True}),
            ("winograd^2-vendor", "winograd^2", {"vendor_base": True}),
            # lcmac.matmul's own choice per shape (tuning log, else the model; may be numpy)
            ("auto", "auto", {})]


def cpu_description() -> str:
    model = platform.processor() or platform.machine()
    try:
        for line in open("/proc/cpuinfo"):
            if line.lower().startswith(("model name", "cpu model")):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} CPUs, {platform.machine()}, {platform.system()} {platform.release()}"


#: the vendor GEMMs every case is timed with (torch.matmul where torch imports); the ratios
#: are against the faster of them
BASELINES = ("numpy", "torch.matmul")


def vendor_gemms(dtype: str) -> dict:
    """baseline name → ``lcmac.runtime.cpu_vendor.CpuGemm`` of this process for ``dtype``."""
    from lcmac.runtime import cpu_vendor
    return {("numpy" if g.api == cpu_vendor.NUMPY else g.api): g for g in cpu_vendor.gemms(dtype)}


def describe_baselines(dtype: str) -> str:
    return "; ".join(f"{name} {g.version} ({g.library}, {g.threads} threads)"
                     for name, g in vendor_gemms(dtype).items())


def fastest_baseline(runs: dict) -> str:
    """The baseline of ``runs`` with the smallest median."""
    return min((n for n in BASELINES if n in runs), key=lambda n: statistics.median(runs[n]))


def baseline_rows(runs: dict, dtype: str) -> dict:
    """name → the baseline's library, api, version, threads, median, spread and paired ratio
    to the faster baseline."""
    out, best = {}, fastest_baseline(runs)
    for name, g in vendor_gemms(dtype).items():
        ts = runs.get(name)
        if ts:
            med = statistics.median(ts)
            out[name] = {**g.config(), "median_s": med, "spread": (max(ts) - min(ts)) / med,
                         "ratio_vs_fastest": statistics.median(runs[best]) / med,
                         "ratio_paired_vs_fastest": paired(runs[best], ts), "seconds": ts}
    return out


def machine_fields(threads: int) -> dict:
    """The CPU (model, logical CPUs, instruction-set flags) and the threads each library ran."""
    from lcmac.runtime import cpu_vendor
    from lcmac.spec.device import cpu_identity
    cpu = cpu_identity()
    gemms = vendor_gemms("float32")
    return {"cpu": {"model": cpu.name, **dict(cpu.details)},
            "threads_by_library": {"asked": threads, "numpy": cpu_vendor.numpy_threads(),
                                   **({"torch": gemms["torch.matmul"].threads}
                                      if "torch.matmul" in gemms else {})},
            "vendors": {name: g.config() for name, g in gemms.items()}}


def select_target(name: str = "host"):
    """The lcmac target to build for: ``host`` is this machine's, or a target name."""
    from lcmac.spec.cpu import aarch64
    from lcmac.spec.targets import get_target, host_target
    if name in ("host", "native"):
        return aarch64.host_target() if aarch64.native_host() else host_target()
    return get_target(name)


def llm_shapes(path: Path) -> list[tuple[str, int, int, int]]:
    d = json.loads(path.read_text())
    out = []
    for model, layer, M in LLM_PICKS:
        try:
            N, K = d["models"][model]["NK"][layer]
        except KeyError:
            continue
        out.append((f"{model}/{layer}", M, N, K))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1024,2048,4096", help="square sizes, comma separated")
    ap.add_argument("--no-llm", action="store_true", help="skip the LLM shapes")
    ap.add_argument("--llm-shapes", default=str(ROOT / "bench" / "llm_shapes.json"
                                                if (ROOT / "bench" / "llm_shapes.json").is_file()
                                                else ROOT / "lcmac" / "tune" / "llm_shapes.json"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--pause", type=float, default=0.3, help="seconds of quiet before each timed call")
    ap.add_argument("--variants", default=",".join(v[0] for v in VARIANTS),
                    help="comma separated; 'none': the baselines alone")
    ap.add_argument("--artifacts", nargs="+", metavar="FILE", default=None,
                    help="benchmark these artifacts (manifests .json, or their .so) against the "
                         "vendor GEMMs instead of building the variants; non-manifest files are skipped")
    ap.add_argument("--build-dir", default=str(Path(tempfile.gettempdir()) / "lcmac-bench-cpu"),
                    help="where the variants' artifacts are built (default: a temporary directory)")
    ap.add_argument("--out", default=None,
                    help="the JSON written (default: out/bench-cpu/<host>-<dtype>-<UTC time>.json)")
    ap.add_argument("--target", default="host", help="lcmac target (default: this machine's)")
    ap.add_argument("--dry-run", action="store_true", help="print the target and cases, build nothing")
    ap.add_argument("--prepared-b", action="store_true",
                    help="also time each variant with B combined once (f.prepare_b(B), as for a "
                         "weight): rows '<variant>+prepB'")
    ap.add_argument("--products", action="store_true",
                    help="also time numpy on each LCMA's R products alone (R stacked block "
                         "products, random data): what its GEMM stage would take at the BLAS's "
                         "speed, with the combines free. Rows 'numpy-<R>x<M/m>x<N/n>x<K/k>'")
    ap.add_argument("--tuned", action="store_true",
                    help="use the tuning log's configs (default: the templates' default configs, "
                         "so the numbers are reproducible)")
    args = ap.parse_args(argv)

    # thread counts before numpy / the TVM runtime start their pools
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "TVM_NUM_THREADS"):
        os.environ[var] = str(args.threads)
    import numpy as np
    try:
        import torch
        torch.set_num_threads(args.threads)      # its intra-op pool = numpy's BLAS threads
    except ImportError:
        pass
    import lcmac
    if args.artifacts is not None:
        return bench_artifacts(args)
    from lcmac.artifact.build import build_many
    from lcmac.ir import get as get_algorithm
    from lcmac.spec.cpu.config import default_config

    target = select_target(args.target)
    want = [v for v in VARIANTS if v[0] in args.variants.split(",")]
    cases = [(f"square {s}", s, s, s) for s in (int(x) for x in args.sizes.split(",") if x)]
    if not args.no_llm:
        cases += llm_shapes(Path(args.llm_shapes))
    if args.dry_run:
        print(f"target {target.name}; variants {', '.join(v[0] for v in want)}; cases "
              + "; ".join(f"{lb} {M}x{N}x{K}" for lb, M, N, K in cases))
        return 0
    art = Path(args.build_dir)
    print(f"# lcmac CPU benchmark, float32, {args.threads} threads, target {target.name}")
    print(f"# {cpu_description()}")
    print(f"# baselines: {describe_baselines('float32')}")
    print(f"# median of {args.rounds} interleaved rounds, {args.pause}s pause")
    results = []
    for label, M, N, K in cases:
        t0 = time.perf_counter()
        def config_for(algo, cfg):
            if args.tuned and not cfg:
                return None                     # build() then takes the tuning log's config
            alg = None if algo == "gemm" else get_algorithm(algo)
            return {**default_config(target, "float32", alg, shape=(M, N, K),
                                     threads=args.threads).to_dict(), **cfg}
        built_want = [v for v in want if v[1] != "auto"]
        jobs = [dict(algo=algo, target=target, dtype="float32", shape=(M, N, K),
                     config=config_for(algo, cfg),
                     out_dir=art, name=f"{name.replace('^', 'p')}-{M}x{N}x{K}")
                for name, algo, cfg in built_want]
        built = build_many(jobs)
        fns = []
        for (name, algo, cfg), p in zip(built_want, built):
            if isinstance(p, Exception):
                print(f"  {name}: build failed: {p}")
                continue
            fns.append((name, OwnThread(lcmac.load(p))))
        if any(v[1] == "auto" for v in want):
            fns.append(("auto", OwnThread(auto_matmul(lcmac, (M, N, K)))))
        if args.products:
            fns += products_calls([algo for _, algo, _ in built_want], (M, N, K))
        tb = time.perf_counter() - t0
        cfgs = {n: f.manifest.config for n, f in fns if hasattr(f, "manifest")}
        runs, errs = time_against_numpy((M, N, K), "float32", fns, args.rounds, args.pause,
                                        prepared_b=args.prepared_b)
        flops = 2.0 * M * N * K
        best = fastest_baseline(runs)
        base, base_np = float(np.median(runs[best])), float(np.median(runs["numpy"]))
        print(f"\n{label}: M={M} N={N} K={K}  (builds {tb:.1f} s; baseline {best}, the faster "
              "by median)")
        print(f"  {'variant':22s} {'GFLOP/s':>8s} {'ratio':>7s} {'paired':>7s} {'spread':>7s} {'min..max GFLOP/s':>18s} {'rel.err':>9s}")
        row = {"case": label, "M": M, "N": N, "K": K, "numpy_seconds": runs["numpy"],
               "fastest_baseline": best, "baselines": baseline_rows(runs, "float32"),
               "variants": {}}
        for name, ts in runs.items():
            med = float(np.median(ts))
            g = flops / med / 1e9
            r = base / med
            lo, hi = flops / max(ts) / 1e9, flops / min(ts) / 1e9
            spread = (max(ts) - min(ts)) / med           # of the rounds, relative to the median
            pr = paired(runs[best], ts)
            err = errs.get(name, 0.0)
            print(f"  {name:22s} {g:8.1f} {r:7.3f} {pr['median']:7.3f} {spread * 100:6.1f}% {lo:8.1f}..{hi:<8.1f} "
                  + ("      n/a" if err is None else f"{err:9.2e}"))
            if name in BASELINES[1:]:
                continue                                  # in row["baselines"]
            row["variants"][name] = {"gflops": g, "ratio_vs_fastest": r,
                                     "ratio_paired_vs_fastest": pr,
                                     "ratio_vs_numpy": base_np / med,
                                     "ratio_paired": paired(runs["numpy"], ts),
                                     "seconds": ts, "spread": spread,
                                     "config": cfgs.get(name.removesuffix("+prepB")),
                                     "runs": getattr(dict(fns).get(name), "plan", None),
                                     "gflops_min": lo, "gflops_max": hi,
                                     "rel_error": errs.get(name)}
        results.append(row)
        del fns
    print("\n# ratio = the faster baseline's median / this median; paired = median over the rounds "
          "of that baseline's time / this time in the same round")
    if args.products:
        print("# numpy-RxBMxBNxBK: numpy on an LCMA's R block products alone (GFLOP/s counted on "
              "the whole product, as for the LCMA): its GEMM stage at the BLAS's speed, combines free")
    write_results(args, "float32", {
        "benchmark": "lcmac CPU float32", "target": target.name, **machine_fields(args.threads),
        "configs": ("tuning log" if args.tuned else
                    "templates' defaults for each shape (see each variant's config)"),
        "results": results})
    return 0


def products_calls(algos, shape) -> list:
    """(name, call) per distinct (R, block shape) among the LCMAs ``algos``: numpy multiplying
    R random pairs of blocks (M/m × K/k by K/k × N/n, stacked: one BLAS call per product), so
    an LCMA's time reads against what its products alone take on the BLAS."""
    import numpy as np
    from lcmac.ir import get as get_algorithm
    M, N, K = shape
    out, seen = [], set()
    for algo in algos:
        if algo == "gemm":          # not in the catalogue: no products to time
            continue
        alg = get_algorithm(algo)
        bm, bn, bk = -(-M // alg.m), -(-N // alg.n), -(-K // alg.k)
        if alg.R == 1 or (alg.R, bm, bn, bk) in seen:
            continue
        seen.add((alg.R, bm, bn, bk))
        rng = np.random.default_rng(1)
        Ab = rng.standard_normal((alg.R, bm, bk)).astype(np.float32)
        Bb = rng.standard_normal((alg.R, bk, bn)).astype(np.float32)
        Cb = np.empty((alg.R, bm, bn), np.float32)

        def run(A, B, out=None, Ab=Ab, Bb=Bb, Cb=Cb):
            np.matmul(Ab, Bb, out=Cb)
        run.products = True             # no C of the whole product: time_against_numpy skips its error
        out.append((f"numpy-{alg.R}x{bm}x{bn}x{bk}", run))
    return out


def auto_matmul(lcmac, shape):
    """``lcmac.matmul`` with its own choice, warmed (its kernels compiled into the kernel
    cache) and with what it runs for ``shape`` printed."""
    import numpy as np
    M, N, K = shape
    from lcmac.api.matmul import plan
    p = plan(M, N, K, "float32")
    print(f"  auto at {M}x{N}x{K} runs {p.runs}: {p.why}")
    lcmac.matmul(np.ones((M, K), np.float32), np.ones((K, N), np.float32))   # compiles, if any
    def run(A, B, out=None):
        return lcmac.matmul(A, B, out=out)
    run.plan = f"{p.runs}: {p.why}"
    return run


class OwnThread:
    """``f`` (an lcmac callable) run on a thread of its own, and timed there.

    apache-tvm's workspace pool (and thread pool) belongs to the thread that calls: artifacts
    called from one thread share the pool's pages, so the first to run decides them for all
    (2 MiB pages or 4 KiB ones: lcmac.schedules.cpu_memory), where a program that uses one
    artifact has them to itself.  Timed inside the thread, so the hand-over is not counted."""

    def __init__(self, f):
        self.f = f
        self._thread = ThreadPoolExecutor(max_workers=1)

    def __getattr__(self, name):        # manifest, plan, products; prepare_b on the thread
        attr = getattr(self.f, name)
        if name == "prepare_b":
            return lambda B: self._thread.submit(attr, B).result()
        return attr

    def __call__(self, *args, **kw):
        return self._thread.submit(self.f, *args, **kw).result()

    def timed(self, *args, **kw) -> float:
        def run():
            t = time.perf_counter()
            self.f(*args, **kw)
            return time.perf_counter() - t
        return self._thread.submit(run).result()


def time_against_numpy(shape, dtype: str, fns, rounds: int, pause: float, prepared_b: bool = False):
    """Random normal A, B of ``shape`` = (M, N, K); each (name, f) in ``fns`` and the baselines
    (numpy, and torch.matmul on views of the same arrays where torch imports) timed in
    interleaved rounds; with ``prepared_b`` each f also as ``f(A, f.prepare_b(B))`` (B
    prepared once, untimed), named ``name+prepB``.  Returns (seconds per round by name,
    relative error against float64 by name, the baselines' included)."""
    import numpy as np              # after main() set the thread count OpenBLAS reads at import
    M, N, K = shape
    rng = np.random.default_rng(0)
    A = rng.standard_normal((M, K)).astype(dtype)
    B = rng.standard_normal((K, N)).astype(dtype)
    C = np.empty((M, N), dtype)
    ref = A.astype(np.float64) @ B.astype(np.float64)
    nref = float(np.linalg.norm(ref))
    errs = {"numpy": float(np.linalg.norm(A @ B - ref) / nref)}
    # (name, f, the B operand it takes): B itself, and with prepared_b B prepared by f
    cases = [(name, f, B) for name, f in fns]
    if prepared_b:
        cases = [x for name, f, _ in cases
                 for x in ((name, f, B),) + (((name + "+prepB", f, f.prepare_b(B)),)
                                             if hasattr(f, "prepare_b") else ())]
    for name, f, b in cases:
        f(A, b, out=C)
        errs[name] = None if getattr(f, "products", False) else float(np.linalg.norm(C - ref) / nref)

    def np_call():
        np.matmul(A, B, out=C)
    baselines = [("numpy", np_call)]
    if "torch.matmul" in vendor_gemms(dtype):
        import torch
        tA, tB, tC = torch.from_numpy(A), torch.from_numpy(B), torch.from_numpy(C)   # no copies
        torch.matmul(tA, tB, out=tC)
        errs["torch.matmul"] = float(np.linalg.norm(C - ref) / nref)
        baselines.append(("torch.matmul", lambda: torch.matmul(tA, tB, out=tC)))
    del ref

    def call_of(f, b):
        if isinstance(f, OwnThread):
            return lambda: f.timed(A, b, out=C)
        return lambda: f(A, b, out=C)
    calls = baselines + [(n, call_of(f, b)) for n, f, b in cases]
    return interleaved(calls, rounds, pause, rotate=True), errs


def interleaved(calls, rounds: int, pause: float, rotate: bool = False) -> dict[str, list[float]]:
    """Time every (name, call) once per round, round-robin, ``pause`` seconds of quiet before
    each (OpenBLAS's spinning workers slow whatever runs next).  Each timed call follows an
    untimed one right away (caches, workspace pool, and the threads the pause parked: on the
    2-core VM a 768³ numpy call took 6.1 ms after 0.3 s of quiet, 5.5 ms right after another).
    ``rotate``: round r starts at call r (mod n), so that no call always runs first in a
    round, right after the last one's threads (numpy's and torch's pools are not the same)."""
    runs: dict[str, list[float]] = {name: [] for name, _ in calls}
    for r in range(rounds):
        k = r % max(len(calls), 1) if rotate else 0
        for name, call in calls[k:] + calls[:k]:
            time.sleep(pause)
            call()                                      # warm, untimed
            t = time.perf_counter()
            took = call()               # a call timed on its own thread returns its seconds
            runs[name].append(took if isinstance(took, float) else time.perf_counter() - t)
    return runs


def paired(base_ts, ts) -> dict:
    """The baseline's time / this variant's time in each round: median, min, max.  The two
    calls of a round run seconds apart, so a drift of the VM's speed over the run (numpy's
    rounds have moved by 30 % within one) cancels in each ratio; the median ratio of the
    medians does not pair them."""
    r = [b / t for b, t in zip(base_ts, ts)]
    return {"median": statistics.median(r), "min": min(r), "max": max(r)}


def default_out(dtype: str) -> Path:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return DEFAULT_OUT_DIR / f"{platform.node() or 'host'}-{dtype}-{stamp}.json"


def write_results(args, dtype: str, fields: dict) -> Path:
    import numpy as np
    import lcmac
    out = Path(args.out) if args.out else default_out(dtype)
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
           "command": " ".join([Path(sys.executable).name] + sys.argv), "host": platform.node(),
           "device": cpu_description(), "threads": args.threads,
           "rounds": args.rounds, "pause_s": args.pause, "numpy": np.__version__,
           "lcmac": lcmac.__version__, "flops": "2*M*N*K (classical count)",
           "load_average": os.getloadavg(), **fields}
    tmp = out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, out)
    print(f"\nwrote {out}")
    return out


def _manifest_path(p: Path) -> Path | None:
    """The artifact manifest named by ``p`` (a manifest, or the library beside one), or None."""
    cand = p.with_suffix(".json") if p.suffix == ".so" else p
    try:
        d = json.loads(cand.read_text())
    except (OSError, ValueError):
        return None
    return cand if isinstance(d, dict) and str(d.get("format", "")).startswith("lcmac-artifact/") else None


def _labels(manifests: list[Path]) -> list[str]:
    """A name per artifact: its stem, with as many parent folders as it takes to tell apart
    artifacts of the same name (the same build made two ways: ``a/x.json``, ``b/x.json``)."""
    for depth in range(1, 1 + max((len(m.resolve().parts) for m in manifests), default=0)):
        names = ["/".join(m.resolve().with_suffix("").parts[-depth:]) for m in manifests]
        if len(set(names)) == len(names):
            return names
    return [str(m) for m in manifests]


def artifact_manifests(names) -> list[Path]:
    """The artifact manifests among ``names`` (each a manifest, or the ``.so`` beside one),
    each once; the other names are reported as skipped."""
    found, seen = [], set()
    for name in names:
        m = _manifest_path(Path(name))
        if m is None:
            print(f"# skipped {name}: not an lcmac artifact manifest")
        elif m.resolve() not in seen:
            seen.add(m.resolve())
            found.append(m)
    return found


def bench_artifacts(args) -> int:
    """``--artifacts``: each given CPU artifact against the baselines at its own shape, interleaved."""
    import numpy as np
    import lcmac

    found = artifact_manifests(args.artifacts)
    if not found:
        print("no artifacts to benchmark (give their manifests: out/*.json)", file=sys.stderr)
        return 2
    groups: dict[tuple, list] = {}
    for m in found:
        f = lcmac.load(m)
        man = f.manifest
        if man.backend != "tvm" or type(f).__name__ == "EmulatedFunction":
            print(f"# skipped {m}: {man.target.get('name')} does not run natively on this CPU")
            continue
        if man.dtype not in ("float32", "float64"):
            print(f"# skipped {m}: numpy has no {man.dtype} GEMM to compare with")
            continue
        groups.setdefault((man.M, man.N, man.K, man.dtype), []).append((m, OwnThread(f)))
    if not groups:
        return 2
    print(f"# lcmac CPU artifacts vs the vendor GEMMs, {args.threads} threads")
    print(f"# {cpu_description()}")
    print(f"# baselines: {describe_baselines('float32')}")
    print(f"# median of {args.rounds} interleaved rounds, {args.pause}s pause")
    results = []
    for (M, N, K, dtype), fns in groups.items():
        runs, errs = time_against_numpy((M, N, K), dtype, list(zip(_labels([m for m, _ in fns]),
                                                                       (f for _, f in fns))),
                                        args.rounds, args.pause, prepared_b=args.prepared_b)
        flops = 2.0 * M * N * K
        best = fastest_baseline(runs)
        base, base_np = float(np.median(runs[best])), float(np.median(runs["numpy"]))
        print(f"\n{dtype} M={M} N={N} K={K}  (baseline {best}, the faster by median)")
        print(f"  {'':44s} {'median ms':>9s} {'spread':>7s} {'GFLOP/s':>8s} {'vs best':>8s} {'paired':>7s} {'rel.err':>9s}")
        row = {"M": M, "N": N, "K": K, "dtype": dtype, "fastest_baseline": best,
               "baselines": baseline_rows(runs, dtype), "variants": {}}
        for name, ts in runs.items():
            med = float(np.median(ts))
            spread = (max(ts) - min(ts)) / med
            g, r = flops / med / 1e9, base / med
            pr = paired(runs[best], ts)
            print(f"  {name:44s} {med * 1e3:9.2f} {spread * 100:6.1f}% {g:8.1f} {r:7.3f}x {pr['median']:6.3f}x "
                  f"{errs[name]:9.2e}")
            if name in BASELINES[1:]:
                continue                                  # in row["baselines"]
            row["variants"][name] = {"median_s": med, "spread": spread, "gflops": g,
                                     "ratio_vs_fastest": r, "ratio_paired_vs_fastest": pr,
                                     "ratio_vs_numpy": base_np / med,
                                     "ratio_paired": paired(runs["numpy"], ts), "seconds": ts,
                                     "rel_error": errs[name]}
        results.append(row)
    print("\n# spread = (max - min) / median of the rounds; vs best = the faster baseline's median / "
          "this median; paired = median over the rounds of that baseline's time / this time in the "
          "same round")
    dtypes = sorted({k[3] for k in groups})
    write_results(args, "-".join(dtypes), {"benchmark": "lcmac CPU artifacts vs the vendor GEMMs",
                                            **machine_fields(args.threads),
                                            "artifacts": [str(m) for m in found], "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
