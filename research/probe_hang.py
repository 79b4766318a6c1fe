#!/usr/bin/env python
"""Probe: do the fused register-epilogue kernels hang?  (an open bug, docs/cuda-experiments.md)

For each case it builds the artifact, then calls it ``--sync`` times with a synchronize after
each call, then ``--bursts`` times ``--burst`` calls back to back.  A watchdog ends the run
(exit 3) when one step makes no progress for ``--watchdog`` seconds, and the log says which
case and phase hung.

    python research/probe_hang.py --out bench/results/h100-fused-hang.json
"""
import argparse, json, os, subprocess, sys, threading, time

# bench_cuda.py (scripts/) holds the timers and the record head these probes share
SCRIPTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts")

CASES = {   # name → (algorithm, n, config): the forms that hung in the step-table runs
    "fused-nca-ov-16384": ("strassen", 16384, {"fused": True, "cache_aware": False, "overlap_epilogue": True}),
    "sg-nca-ov-4096": ("strassen", 4096, {"fused": True, "split_group": True, "cache_aware": False,
                                          "overlap_epilogue": True}),
    "fused-nca-ov-4096": ("strassen", 4096, {"fused": True, "cache_aware": False, "overlap_epilogue": True}),
    # the other rotated-walk forms: persistent groups never split, split-group with one
    # pipeline per product
    "pw-nca-ov-4096": ("strassen", 4096, {"fused": True, "persistent": True, "cache_aware": False,
                                          "overlap_epilogue": True}),
    "sg-nca-4096": ("strassen", 4096, {"fused": True, "split_group": True, "cache_aware": False}),
    # controls: the cache-aware forms of the same kernels (no hang seen)
    "sg-ov-4096": ("strassen", 4096, {"fused": True, "split_group": True, "overlap_epilogue": True}),
    "fused-ov-4096": ("strassen", 4096, {"fused": True, "overlap_epilogue": True}),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", nargs="*", default=list(CASES))
    ap.add_argument("--sync", type=int, default=300)
    ap.add_argument("--bursts", type=int, default=10)
    ap.add_argument("--burst", type=int, default=200)
    ap.add_argument("--watchdog", type=float, default=45.0)
    ap.add_argument("--build-dir", default="/tmp/lcmac-probe-hang")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    import torch
    sys.path.insert(0, SCRIPTS)
    from bench_cuda import probe_record
    from lcmac.runtime.cuda_loader import load_cuda
    log = probe_record("fused kernel hang", events=[])

    def note(*a):
        line = " ".join(map(str, a))
        print(time.strftime("%H:%M:%S"), line, flush=True)
        log["events"].append(line)
        if args.out:
            json.dump(log, open(args.out, "w"), indent=1)

    def hung(case, phase, i):
        note(f"HANG {case} {phase} step {i}: no progress for {args.watchdog:.0f} s")
        os._exit(3)

    for name in args.cases:
        algo, n, cfg = CASES[name]
        cfg = {"stages": 4, "policy": "fullrow", **cfg}
        d = os.path.join(args.build_dir, name)
        req = {"algorithm": algo, "target": "cuda", "dtype": "bf16", "shape": [n, n, n], "config": cfg,
               "out_dir": d, "name": "lcmac", "jobs": 16}
        p = subprocess.run([sys.executable, "-m", "lcmac.targets.tilelang_worker"], input=json.dumps(req),
                           capture_output=True, text=True)
        resp = json.loads(([x for x in p.stdout.splitlines() if x.startswith("{")] or ["{}"])[-1])
        if not resp.get("ok"):
            note("case", name, "not built:", (resp.get("error") or p.stderr[-300:])[:300])
            continue
        f = load_cuda(os.path.join(d, "lcmac.json"))
        A = torch.randn(n, n, device="cuda").bfloat16()
        B = torch.randn(n, n, device="cuda").bfloat16()
        C = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
        note("case", name, algo, n, json.dumps(cfg, sort_keys=True))
        scale = 16 if n > 8192 else 1                  # fewer calls of the long shapes
        for phase, steps, calls in (("sync", args.sync // scale, 1),
                                    ("burst", args.bursts, args.burst // scale)):
            for i in range(steps):
                dog = threading.Timer(args.watchdog, hung, (name, phase, i))
                dog.start()
                for _ in range(calls):
                    f(A, B, out=C)
                torch.cuda.synchronize()
                dog.cancel()
            note(name, phase, "ok", steps * calls, "calls")
        ref = A.double() @ B.double()
        note(name, "relerr", float(torch.linalg.norm(C.double() - ref) / torch.linalg.norm(ref)))


if __name__ == "__main__":
    main()
