#!/usr/bin/env python
"""Probe: can the GEMM stage's producer warpgroup sum Ã_r = A_p ± A_q itself (a fused
two-term Combine A), so that Combine A's pass over memory goes away?

Builds, without a GPU, four artifacts of Strassen's Algorithm 1 (grid batched GEMM, 3
stages, no operands read in place) at N³ and patches their batched-GEMM source:

* ``base``    as generated;
* ``regs``    only the register split changed to 40 / 232 (what the sums need; TileLang's
              24 / 240 leaves the producer too few registers);
* ``sum``     the producer TMA-loads each A tile twice (into the stage and a staging buffer),
              waits, and its 128 threads add the staging tile into the stage (bf16x2 adds),
              fence the async proxy, then release the stage to the consumers;
* ``sum-pf``  the same with the next k step's loads issued before this step's sum.

The probe loads the *same* tile twice, so its H is 2·Ã·B̃ and its C wrong (rel_err ≈ 1):
it times the cost of the sum only.  Run the artifacts with
``bench_cuda.py --artifacts OUT --stages --sustained 2`` and compare the batched_gemm stage.

    python research/probe_producer_sum.py --n 16384 --out /tmp/probe-sum
"""
import argparse, json, os, re, shutil, subprocess, sys, tempfile

SUM = """      mbarrier[((ko % 3) + 6)].wait(((ko % 6) / 3));
      {
        uint4* a = (uint4*)((char*)A_s + (ko % 3) * 16384);
        const uint4* x = (const uint4*)((char*)X_s + (ko % 3) * 16384);
        #pragma unroll 2
        for (int j = ((int)threadIdx.x); j < 1024; j += 128) {
          uint4 va = a[j]; uint4 vx = x[j];
          __nv_bfloat162* pa = (__nv_bfloat162*)&va; const __nv_bfloat162* px = (const __nv_bfloat162*)&vx;
          #pragma unroll
          for (int q = 0; q < 4; ++q) pa[q] = __hadd2(pa[q], px[q]);
          a[j] = va;
        }
      }
      tl::fence_proxy_async();
      asm volatile("bar.sync 5, 128;" ::: "memory");
      if (tl::tl_shuffle_elect<128>()) { mbarrier[(ko % 3)].arrive(); }
"""

PRODUCER = re.compile(
    r"    for \(int ko = 0; ko < (\d+); \+\+ko\) \{\n"
    r"      mbarrier\[\(\(ko % 3\) \+ 3\)\]\.wait\(\(\(\(ko % 6\) / 3\) \^ 1\)\);\n"
    r"      if \(tl::tl_shuffle_elect<128>\(\)\) \{\n"
    r"        mbarrier\[\(ko % 3\)\]\.expect_transaction\(16384\);\n"
    r"        tl::tma_load\(At_desc, mbarrier\[\(ko % 3\)\], \(&\(\(\(bfloat16_t\*\)A_s\)\[\(\(ko % 3\) \* 8192\)\]\)\), ([^;]*)\);\n"
    r"        mbarrier\[\(ko % 3\)\]\.arrive_and_expect_tx\(32768\);\n"
    r"        #pragma unroll\n"
    r"        for \(int i = 0; i < 4; \+\+i\) \{\n"
    r"          (tl::tma_load\(Bt_desc[^\n]*)\n"
    r"        \}\n      \}\n    \}\n")


def _replace(s: str, old: str, new: str, count: int = 1) -> str:
    if s.count(old) != count:
        raise SystemExit(f"unexpected generated source: {old!r} occurs {s.count(old)} times")
    return s.replace(old, new)


def patch(s: str, mode: str) -> str:
    s = _replace(s, "tl::warpgroup_reg_dealloc<24>();", "tl::warpgroup_reg_dealloc<40>();")
    s = _replace(s, "tl::warpgroup_reg_alloc<240>();", "tl::warpgroup_reg_alloc<232>();")
    if mode == "regs":
        return s
    s = _replace(s, "#include <cuda.h>", "#include <cuda.h>\n#include <cuda_bf16.h>")
    s = _replace(s, "147456", "196608", 3)          # + 3 staging tiles of 16 KB
    s = _replace(s, "uint64_t mbarrier_mem[6];", "uint64_t mbarrier_mem[9];")
    s = _replace(s, "    mbarrier[5].init(256);\n",
                 "    mbarrier[5].init(256);\n" + "".join(f"    mbarrier[{i}].init(1);\n" for i in (6, 7, 8)))
    s = _replace(s, "  void* A_s = ((void*)((char*)buf_dyn_shmem + 98304));",
                 "  void* A_s = ((void*)((char*)buf_dyn_shmem + 98304));\n"
                 "  void* X_s = ((void*)((char*)buf_dyn_shmem + 147456));")
    m = PRODUCER.search(s)
    if not m:
        raise SystemExit("unexpected producer loop in the generated source")
    n, coords, bload = m.group(1), m.group(2).replace("ko", "k"), m.group(3).replace("ko", "k")
    issue = ("    auto issue = [&](int k) {\n"
             "      mbarrier[((k % 3) + 3)].wait((((k % 6) / 3) ^ 1));\n"
             "      if (tl::tl_shuffle_elect<128>()) {\n"
             "        mbarrier[((k % 3) + 6)].arrive_and_expect_tx(32768);\n"
             f"        tl::tma_load(At_desc, mbarrier[((k % 3) + 6)], (&(((bfloat16_t*)A_s)[((k % 3) * 8192)])), {coords});\n"
             f"        tl::tma_load(At_desc, mbarrier[((k % 3) + 6)], (&(((bfloat16_t*)X_s)[((k % 3) * 8192)])), {coords});\n"
             "        mbarrier[(k % 3)].expect_transaction(32768);\n"
             "        #pragma unroll\n"
             f"        for (int i = 0; i < 4; ++i) {{\n          {bload}\n        }}\n"
             "      }\n    };\n")
    if mode == "sum":
        loop = f"    for (int ko = 0; ko < {n}; ++ko) {{\n      issue(ko);\n{SUM}    }}\n"
    else:
        loop = (f"    issue(0);\n    for (int ko = 0; ko < {n}; ++ko) {{\n"
                f"      if (ko + 1 < {n}) issue(ko + 1);\n{SUM}    }}\n")
    return s[:m.start()] + issue + loop + s[m.end():]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=16384)
    ap.add_argument("--out", required=True)
    ap.add_argument("--modes", nargs="+", default=["base", "regs", "sum", "sum-pf"])
    args = ap.parse_args()
    import tilelang
    from lcmac.ir import catalogue
    from lcmac.targets import cuda as host
    src = tempfile.mkdtemp(prefix="probe-sum-")
    req = {"algorithm": catalogue.get("strassen").to_dict(), "target": "cuda-sm90a", "dtype": "bf16",
           "shape": [args.n] * 3, "config": {"fused": False, "persistent": False, "stages": 3,
                                              "direct_views": "none"},
           "out_dir": src, "name": "lcmac", "compile": False}
    p = subprocess.run([sys.executable, "-m", "lcmac.targets.tilelang_worker"], input=json.dumps(req),
                       capture_output=True, text=True)
    side_path = os.path.join(src, "lcmac.json")
    if not os.path.exists(side_path):
        raise SystemExit(f"generation failed: {p.stdout[-2000:]}{p.stderr[-2000:]}")
    side = json.load(open(side_path))
    gemm = open(os.path.join(src, "lcmac_batched_gemm.cu")).read()
    inc = host.tilelang_include_dirs(os.path.dirname(tilelang.__file__))
    for mode in args.modes:
        out = os.path.join(args.out, f"{mode}-strassen-{args.n}")
        os.makedirs(out, exist_ok=True)
        srcs = [shutil.copy(os.path.join(src, f), os.path.join(out, f)) for f in side["sources"]]
        if mode != "base":
            with open(os.path.join(out, "lcmac_batched_gemm.cu"), "w") as f:
                f.write(patch(gemm, mode))
        rep = host.compile_so(srcs, os.path.join(out, "lcmac.so"), "sm_90a", inc, jobs=2)
        with open(os.path.join(out, "lcmac.json"), "w") as f:
            json.dump(dict(side, library="lcmac.so", ptxas=rep, probe=mode), f, indent=1)
        print(mode, out, rep.get("lcmac_batched_gemm.cu"), flush=True)


if __name__ == "__main__":
    main()
