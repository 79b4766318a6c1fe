"""Large CPU workspaces are advised onto huge pages (lcmac.schedules.cpu_memory): which buffers
the generated source advises, and, run in a fresh process, that the advice takes effect and
the product is still right."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from lcmac.ir import catalogue
from lcmac.spec.cpu.config import CpuConfig, default_config
from lcmac.schedules import cpu_vendor
from lcmac.schedules.cpu_lcma import generate, programs_for
from lcmac.schedules.cpu_memory import ADVISE_FN, HUGE_MIN_BYTES
from lcmac.spec.targets import get_target
from lcmac.spec.cpu.x86 import host_supports

T512 = "x86_64-avx512"


def _source(algo: str, shape, **knobs) -> str:
    alg = catalogue.get(algo)
    cfg = default_config(get_target(T512), "float32", None if alg.R == 1 else alg, shape, 2)
    cfg = CpuConfig(**{**cfg.to_dict(), **knobs})
    return generate(alg, "float32", *shape, cfg)[0]


def _advised(src: str) -> set[str]:
    """Names of the buffers the source advises."""
    lines = src.splitlines()
    return {ln.split(".data")[0].split("), ")[-1].strip() for ln in lines if f'"{ADVISE_FN}"' in ln}


def test_large_workspaces_advised_small_ones_not():
    # Strassen² at 1024³ packs ahead: Ãp, B̃p and H are 13 MB each
    assert _advised(_source("strassen^2", (1024,) * 3)) == {"Ap", "Bp", "H"}
    # at 256³ every workspace is under 4 MiB: no advice, no system call per run
    assert ADVISE_FN not in _source("strassen^2", (256,) * 3)
    # the plain GEMM's per-task band of packed A, 4.2 MB at 4096³ (mc 684, kc 512, 3 blocks)
    gemm = _source("naive-1x1x1", (4096,) * 3)
    assert _advised(gemm) == {"Ab"} and 3 * 684 * 512 * 4 >= HUGE_MIN_BYTES
    # the vendor base case's row-major Ã, B̃ and H
    alg = catalogue.get("strassen^2")
    vendor = cpu_vendor.generate(alg, "float32", 1024, 1024, 1024, programs_for(alg), 16, "f", "_p", "_q")[0]
    assert _advised(vendor) == {"At", "Bt", "H"}


_RUN = r"""
import json, sys
import numpy as np
import lcmac
def huge_kb():
    for line in open("/proc/self/smaps_rollup"):
        if line.startswith("AnonHugePages:"):
            return int(line.split()[1])
f = lcmac.load(sys.argv[1])
m = f.manifest
rng = np.random.default_rng(0)
A = rng.standard_normal((m.M, m.K)).astype(np.float32)
B = rng.standard_normal((m.K, m.N)).astype(np.float32)
before = huge_kb()
C = f(A, B)
after = huge_kb()
ref = A.astype(np.float64) @ B.astype(np.float64)
err = float(np.linalg.norm(C - ref) / np.linalg.norm(ref))
print(json.dumps({"huge_kb": after - before, "err": err}))
"""


def _thp_mode() -> str:
    p = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if not p.exists():
        return "absent"
    return p.read_text().split("[")[1].split("]")[0]


@pytest.mark.skipif(not host_supports(T512), reason="needs an AVX-512 x86-64 host to run the artifact")
@pytest.mark.skipif(_thp_mode() not in ("madvise", "always"),
                    reason="the kernel has no transparent huge pages to give")
def test_advised_workspace_gets_huge_pages(tmp_path):
    from lcmac.artifact.build import build
    path = build("strassen^2", T512, "float32", (1024, 1024, 1024), out_dir=tmp_path, name="s2-1024")
    # a fresh process: TVM's workspace pool keeps what earlier calls faulted in as 4 KiB pages
    out = subprocess.run([sys.executable, "-c", _RUN, str(path)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["err"] < 1e-5
    # the three 13 MB workspaces hold at least five whole 2 MiB pages each (C, numpy's own
    # 4 MiB array, may add one); unadvised, they would have none
    assert got["huge_kb"] >= 3 * 5 * 2048, got
