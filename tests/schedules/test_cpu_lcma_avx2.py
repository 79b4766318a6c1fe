"""LCMA kernels on an AVX2 host (the AVX-512 suite, test_cpu_backend, skips without one):
Combine A staging each row's next kt columns through a local buffer (kt 16, 8, 2 and 1, row
tails whose padded rows read A's last row, A guarded after its last byte), the GEMM stage
prefetching H's tile where H is stored, float32 and float64, against float64 and the
prepared-B entry bit for bit."""
from __future__ import annotations

import re

import numpy as np
import pytest

from lcmac.artifact.build import build_many
from lcmac.artifact.manifest import Manifest
from lcmac.targets.x86 import host_supports

from .test_cpu_backend import _get, _guarded

AVX2 = "x86_64-avx2"
pytestmark = pytest.mark.skipif(not host_supports(AVX2), reason="needs an AVX2 x86-64 host")

SMALL = {"mr": 6, "nr": 16, "mc": 12, "nc": 32}
JOBS = {  # key: (algorithm, shape (M, N, K), dtype, config, Combine A's kt, H stored)
    # 4×4 blocks of 25 rows (a row tail), 16 columns: kt 16; 16 C blocks, H stored
    "strassen2-h-stored": ("strassen^2", (100, 64, 64), "float32",
                           {**SMALL, "nc": 16, "kc": 16, "ku": 4, "fused": False}, 16, True),
    "strassen-kt8": ("strassen", (50, 64, 48), "float32", {**SMALL, "kc": 16, "ku": 4}, 8, False),
    "winograd-kt2-h-stored": ("winograd", (50, 32, 52), "float32",
                              {**SMALL, "kc": 26, "ku": 2, "fused": False}, 2, True),
    "strassen-kt1-float64": ("strassen", (50, 32, 50), "float64",
                             {"mr": 6, "nr": 8, "mc": 12, "nc": 16, "kc": 25, "ku": 1}, 1, False),
}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("cpu_lcma_avx2")
    keys = list(JOBS)
    res = build_many([dict(algo=JOBS[k][0], target=AVX2, shape=JOBS[k][1], dtype=JOBS[k][2],
                           config=JOBS[k][3], name=f"lcma-{k}", out_dir=out) for k in keys])
    return dict(zip(keys, res))


@pytest.mark.slow
@pytest.mark.parametrize("key", list(JOBS))
def test_lcma_matches_float64_and_prepared(built, key):
    import lcmac
    f = lcmac.load(_get(built, key))
    m = f.manifest
    dt = np.dtype(m.dtype)
    rng = np.random.default_rng(7)
    A = _guarded(rng.standard_normal((m.M, m.K)).astype(dt))     # a read past A's end faults
    B = rng.standard_normal((m.K, m.N)).astype(dt)
    C = f(A, B)
    ref = A.astype(np.float64) @ B.astype(np.float64)
    err = np.linalg.norm(C - ref) / np.linalg.norm(ref)
    assert err < (1e-5 if dt == np.float32 else 1e-13), f"{key}: relative error {err:.3g}"
    assert np.array_equal(f(A, f.prepare_b(B)), C)


@pytest.mark.slow
@pytest.mark.parametrize("key", list(JOBS))
def test_combine_a_stages_rows_and_h_tile_is_prefetched(built, key):
    """The staged copy reads kt contiguous columns of a row as one vector, and the program
    reads the local copy; the prefetch names H's tile exactly where H is stored."""
    *_, kt, h_stored = JOBS[key]
    p = _get(built, key)
    src = (p.parent / Manifest.read(p).extra["source"]).read_text()
    combine_a = src[src.index("# Combine A"):src.index("# GEMM stage")]
    assert re.search(rf"for u in T\.vectorized\({kt}\):\s+At\[0, v, u\] = A\[", combine_a)
    assert "xin[0, v] = At[0, v, ki]" in combine_a and not re.search(r"xin\[\d+, v\] = A\[", combine_a)
    assert ("T.address_of(H[r, " in src) == h_stored
