#!/usr/bin/env python
"""GF(2) products of bit matrices: lcmac.bits against M4RI's ``mzd_mul``, in one process.

Variants, each on the same random n×n operands:

    m4ri             M4RI's mzd_mul(C, A, B, cutoff=0): its Strassen–Winograd above its Four
                     Russians kernel, with its own default cutoff (called through ctypes)
    m4ri-m4rm        M4RI's Four Russians kernel alone: mzd_mul_m4rm(C, A, B, k=0)
    lcmac            lcmac.gf2_matmul as a user calls it (algo="auto", kernel="auto")
    native           lcmac's native kernel alone (lcmac.bits.native: compiled by apache-tvm)
    native-wino-L1…  Strassen–Winograd over GF(2), 1, 2 … levels above the native kernel
    numpy…           with --numpy: the numpy kernel alone, Winograd 1–3 levels above it and
                     the alternative basis (12 core XORs) at 2 levels

Every variant's result is checked equal to M4RI's before timing.  Rounds are interleaved
(every variant once per round, in a random order drawn anew each round) and each size reports the median wall time, the
fastest and slowest round, the median CPU time of the calling thread (every variant runs in
that thread, so on a shared machine it is less disturbed by other processes than the wall
time) and the effective rate 2·n³/t in bit operations per second (median wall time): n³ ANDs
and n³ XORs of the classical product whatever the algorithm does, so saved work shows as a
higher rate.  Everything runs on one thread: lcmac's native kernel has no parallel loop,
numpy's bitwise operations are single-threaded, and M4RI runs in parallel only when built
with OpenMP (the script reads __M4RI_HAVE_OPENMP from m4ri/m4ri_config.h and records it;
Debian's build has none).  Packing and conversions are not timed.

M4RI comes from Debian's libm4ri-dev (``apt-get install -y libm4ri-dev``); the script reads
and writes M4RI's ``mzd_t`` rows directly through its row pointers (the struct below follows
/usr/include/m4ri/mzd.h of M4RI 20200125).  The native kernel is compiled (or found in
lcmac's cache) before the first size.

    python scripts/bench_bits.py                           # 4096, 8192, 16384
    python scripts/bench_bits.py --sizes 1024,2048 --rounds 3 --numpy
    python scripts/bench_bits.py --device cuda --sizes 16384,32768   # the GPU (bench_bits_cuda.py)

Writes out/bench-bits/<host>-<UTC time>.json (``out/`` is not tracked; ``--out`` picks another
path).
"""
from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import glob
import json
import os
import platform
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))                 # this checkout's lcmac, not another install
sys.path.insert(0, str(ROOT / "scripts"))
from bench_cpu import cpu_description  # noqa: E402 - one CPU description for the CPU benches

from lcmac.bits import PackedBits, gf2_matmul, native  # noqa: E402
from lcmac.bits.lcma import lcma_product  # noqa: E402

DEFAULT_OUT_DIR = ROOT / "out" / "bench-bits"
CONVENTION = ("effective bit operations per second = 2*n^3 / t (n^3 ANDs and n^3 XORs of the "
              "classical product, whatever the algorithm does)")


class MzdT(ctypes.Structure):
    """M4RI's ``mzd_t`` (m4ri/mzd.h, 64 bytes): rci_t and wi_t are int, word is uint64_t."""

    _fields_ = [("nrows", ctypes.c_int), ("ncols", ctypes.c_int), ("width", ctypes.c_int),
                ("rowstride", ctypes.c_int), ("offset_vector", ctypes.c_int),
                ("row_offset", ctypes.c_int), ("flags", ctypes.c_uint8),
                ("blockrows_log", ctypes.c_uint8), ("padding", ctypes.c_uint8 * 14),
                ("high_bitmask", ctypes.c_uint64), ("blocks", ctypes.c_void_p),
                ("rows", ctypes.POINTER(ctypes.c_void_p))]


assert ctypes.sizeof(MzdT) == 64, "mzd_t must be 64 bytes, as m4ri/mzd.h ensures"


def load_m4ri() -> tuple[ctypes.CDLL, str]:
    candidates = ["libm4ri.so", ctypes.util.find_library("m4ri")]
    candidates += sorted(glob.glob("/usr/lib/*/libm4ri-*.so")) + sorted(glob.glob("/usr/lib/libm4ri*.so"))
    for name in filter(None, candidates):
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        P = ctypes.POINTER(MzdT)
        lib.mzd_init.restype, lib.mzd_init.argtypes = P, [ctypes.c_int, ctypes.c_int]
        lib.mzd_free.restype, lib.mzd_free.argtypes = None, [P]
        lib.mzd_mul.restype, lib.mzd_mul.argtypes = P, [P, P, P, ctypes.c_int]
        lib.mzd_mul_m4rm.restype, lib.mzd_mul_m4rm.argtypes = P, [P, P, P, ctypes.c_int]
        return lib, name
    raise SystemExit("M4RI not found: install it with `apt-get install -y libm4ri-dev` "
                     "(Debian/Ubuntu), which provides libm4ri.so")


def _row_runs(m) -> list[np.ndarray]:
    """numpy views (rows × rowstride words) of an mzd_t's memory, one per run of rows that
    are evenly spaced (one run unless M4RI split the matrix over several memory blocks)."""
    s = m.contents
    if s.nrows == 0:
        return []
    addrs = np.ctypeslib.as_array(ctypes.cast(s.rows, ctypes.POINTER(ctypes.c_uint64)),
                                  (s.nrows,)).astype(np.int64)
    step = s.rowstride * 8
    cuts = [0] + [int(i) + 1 for i in np.flatnonzero(np.diff(addrs) != step)] + [s.nrows]
    views = []
    for lo, hi in zip(cuts[:-1], cuts[1:]):
        buf = (ctypes.c_uint64 * ((hi - lo) * s.rowstride)).from_address(int(addrs[lo]))
        views.append(np.ctypeslib.as_array(buf).reshape(hi - lo, s.rowstride))
    return views


def to_mzd(lib, p: PackedBits):
    m = lib.mzd_init(p.nrows, p.ncols)
    r0 = 0
    for v in _row_runs(m):
        v[:, :p.nwords] = p.data[r0:r0 + v.shape[0]]
        r0 += v.shape[0]
    return m


def from_mzd(m, ncols: int) -> PackedBits:
    words = -(-ncols // 64)
    rows = [v[:, :words] for v in _row_runs(m)]
    data = np.ascontiguousarray(np.concatenate(rows)) if rows else np.zeros((0, words), np.uint64)
    return PackedBits(data, m.contents.nrows, ncols)


def random_bits(rng, n: int) -> PackedBits:
    words = rng.integers(0, 2**64, (n, -(-n // 64)), dtype=np.uint64, endpoint=False)
    if n % 64:
        words[:, -1] &= np.uint64((1 << (n % 64)) - 1)
    return PackedBits(words, n, n)


def variants(levels: list[int], with_numpy: bool):
    out = [("lcmac", lambda A, B: gf2_matmul(A, B)),
           ("native", lambda A, B: gf2_matmul(A, B, algo="m4r", kernel="native"))]
    for L in levels:
        out.append((f"native-wino-L{L}",
                    lambda A, B, L=L: lcma_product(A, B, "winograd", L, kernel="native")[0]))
    if with_numpy:
        out.append(("numpy", lambda A, B: gf2_matmul(A, B, algo="m4r", kernel="numpy")))
        for L in (1, 2, 3):
            out.append((f"numpy-wino-L{L}",
                        lambda A, B, L=L: lcma_product(A, B, "winograd", L, kernel="numpy")[0]))
        out.append(("numpy-wino-ab-L2",
                    lambda A, B: lcma_product(A, B, "winograd-ab", 2, kernel="numpy")[0]))
    return out


def bench_size(lib, n: int, rounds: int, levels: list[int], with_numpy: bool, seed: int) -> dict:
    rng = np.random.default_rng([n, seed])
    A, B = random_bits(rng, n), random_bits(rng, n)
    mA, mB, mC = to_mzd(lib, A), to_mzd(lib, B), lib.mzd_init(n, n)
    try:
        assert from_mzd(mA, n) == A, "copying into M4RI and back changed A"
        lib.mzd_mul(mC, mA, mB, 0)
        want = from_mzd(mC, n)
        calls = [("m4ri", lambda: lib.mzd_mul(mC, mA, mB, 0)),
                 ("m4ri-m4rm", lambda: lib.mzd_mul_m4rm(mC, mA, mB, 0))]
        lib.mzd_mul_m4rm(mC, mA, mB, 0)
        checks = {"m4ri-m4rm": from_mzd(mC, n) == want}
        if not checks["m4ri-m4rm"]:
            raise SystemExit(f"M4RI's mzd_mul and mzd_mul_m4rm differ at n={n}")
        for name, f in variants(levels, with_numpy):
            checks[name] = bool(f(A, B) == want)       # also the warm-up
            if not checks[name]:
                raise SystemExit(f"{name} differs from M4RI at n={n}")
            calls.append((name, lambda f=f: f(A, B)))
        runs: dict[str, list[float]] = {name: [] for name, _ in calls}
        cpu: dict[str, list[float]] = {name: [] for name, _ in calls}
        order = np.random.default_rng([n, seed, 1])
        for _ in range(rounds):
            # every variant once per round, in an order drawn anew each round: what a call
            # pays depends on the call before it (after another's frees, the page faults of
            # its fresh stacks, hugepage compaction: up to 0.3 s of system time at 16384),
            # so no variant always follows the same one
            for i in order.permutation(len(calls)):
                name, call = calls[i]
                c0, t0 = time.thread_time(), time.perf_counter()
                call()
                runs[name].append(time.perf_counter() - t0)
                cpu[name].append(time.thread_time() - c0)
    finally:
        for m in (mA, mB, mC):
            lib.mzd_free(m)
    base, base_cpu = float(np.median(runs["m4ri"])), float(np.median(cpu["m4ri"]))
    rows = {}
    for name, ts in runs.items():
        med, med_cpu = float(np.median(ts)), float(np.median(cpu[name]))
        rows[name] = {"seconds": ts, "cpu_seconds": cpu[name], "median_s": med,
                      "min_s": min(ts), "max_s": max(ts), "median_cpu_s": med_cpu,
                      "gbitops": 2 * n ** 3 / med / 1e9, "time_vs_m4ri": med / base,
                      "cpu_vs_m4ri": med_cpu / base_cpu,
                      "equal_to_m4ri": True if name == "m4ri" else checks[name]}
    return rows


def m4ri_openmp() -> int | None:
    """__M4RI_HAVE_OPENMP of the installed M4RI headers (None: not found)."""
    for path in glob.glob("/usr/include/m4ri/m4ri_config.h") + glob.glob("/usr/local/include/m4ri/m4ri_config.h"):
        for line in open(path):
            parts = line.split()
            if len(parts) >= 3 and parts[:2] == ["#define", "__M4RI_HAVE_OPENMP"]:
                return int(parts[2])
    return None


def print_table(n: int, rows: dict) -> None:
    print(f"\nn = {n}: {'variant':<16} {'median':>9} {'min':>9} {'max':>9} {'cpu med':>9} "
          f"{'Gbit-op/s':>10} {'time/m4ri':>9} {'cpu/m4ri':>8}")
    for name, r in rows.items():
        print(f"{'':9}{name:<16} {r['median_s'] * 1e3:8.1f}ms {r['min_s'] * 1e3:8.1f}ms "
              f"{r['max_s'] * 1e3:8.1f}ms {r['median_cpu_s'] * 1e3:7.1f}ms {r['gbitops']:10.0f} "
              f"{r['time_vs_m4ri']:9.2f} {r['cpu_vs_m4ri']:8.2f}")


def print_summary(results: dict) -> None:
    """One line per size: lcmac.gf2_matmul as called by default against M4RI's mzd_mul."""
    print(f"\n{'n':>6} {'lcmac ms':>9} {'M4RI ms':>9} {'M4RI/lcmac':>10} {'lcmac min–max ms':>18} "
          f"{'M4RI min–max ms':>18} {'threads':>7}")
    for n, rows in results.items():
        mine, theirs = rows["lcmac"], rows["m4ri"]
        print(f"{n:>6} {mine['median_s'] * 1e3:9.1f} {theirs['median_s'] * 1e3:9.1f} "
              f"{theirs['median_s'] / mine['median_s']:10.2f} "
              f"{mine['min_s'] * 1e3:8.1f}–{mine['max_s'] * 1e3:<8.1f} "
              f"{theirs['min_s'] * 1e3:8.1f}–{theirs['max_s'] * 1e3:<8.1f} {'1 / 1':>7}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="4096,8192,16384", help="square sizes, comma separated")
    ap.add_argument("--levels", default="1,2", help="Strassen–Winograd levels above the native "
                                                    "kernel to time")
    ap.add_argument("--numpy", action="store_true", help="also time the numpy kernel and "
                                                         "Winograd above it (slow past 8192)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="JSON path (default: out/bench-bits/...)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                    help="cuda: the GPU benchmark instead (scripts/bench_bits_cuda.py: lcmac's "
                         "kernels and LCMA levels against its own cubic kernel and torch's int8 "
                         "product; M4RI is a CPU library)")
    args = ap.parse_args(argv)
    if args.device == "cuda":
        import bench_bits_cuda
        fwd = (["--sizes", *args.sizes.split(",")] + ["--levels", *args.levels.split(",")]
               + ["--rounds", str(args.rounds)] + (["--out", args.out] if args.out else []))
        return bench_bits_cuda.main([a for a in fwd if a])
    lib, libname = load_m4ri()
    openmp = m4ri_openmp()
    if openmp:
        raise SystemExit("this M4RI is built with OpenMP: set OMP_NUM_THREADS=1 for a "
                         "one-thread comparison with lcmac's one-thread kernel")
    kernels = native.prepare(["gf2"])          # compiled or found in the cache, not timed
    sizes = [int(s) for s in args.sizes.split(",") if s]
    levels = [int(s) for s in args.levels.split(",") if s]
    results = {}
    for n in sizes:
        results[str(n)] = bench_size(lib, n, args.rounds, levels, args.numpy, args.seed)
        print_table(n, results[str(n)])
    print_summary(results)
    stamp = datetime.now(timezone.utc)
    out = Path(args.out) if args.out else \
        DEFAULT_OUT_DIR / f"{platform.node() or 'host'}-{stamp.strftime('%Y%m%dT%H%M%SZ')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {"date": stamp.isoformat(timespec="seconds"),
           "command": " ".join([Path(sys.executable).name] + sys.argv), "host": platform.node(),
           "device": cpu_description(), "numpy": np.__version__, "m4ri": libname,
           "m4ri_openmp": openmp, "threads": {"lcmac": 1, "m4ri": 1},
           "native_kernel": repr(kernels["gf2"]), "rounds": args.rounds,
           "convention": CONVENTION, "load_average": os.getloadavg(), "results": results}
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
