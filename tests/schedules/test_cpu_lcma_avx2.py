"""LCMA kernels on an AVX2 host (the AVX-512 suite, test_cpu_backend, skips without one):
four catalogue schemes beyond Strassen's family, Combine A staging each row's next kt
columns through a local buffer (kt 16, 8, 2 and 1, row tails whose padded rows read A's
last row, A guarded after its last byte), the GEMM stage prefetching H's tile where H is
stored, the packed operands streamed out with non-temporal stores (knob ``stream``),
float32 and float64, against float64, the prepared-B entry and the same build unstreamed
bit for bit."""
from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import pytest

from lcmac.artifact.build import build_many
from lcmac.artifact.manifest import Manifest
from lcmac.spec.cpu.x86 import host_supports

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
#: the same builds with the packed operands streamed: key → (Combine A streamed, Combine B
#: streamed): chunks of whole 64-byte lines only (A: kt·mr elements, B: nr)
STREAMED = {"strassen2-h-stored": (True, True),       # A: 16·6 fp32 = 6 lines; B: 16 fp32
            "strassen-kt1-float64": (False, True)}    # A: 1·6 fp64 = 48 bytes; B: 8 fp64
for _k in STREAMED:
    _a, _shape, _dt, _cfg, *_rest = JOBS[_k]
    JOBS[_k + "-stream"] = (_a, _shape, _dt, {**_cfg, "stream": True}, *_rest)


#: catalogue schemes beyond Strassen's family on this target (the full catalogue runs in
#: test_cpu_backend, on AVX-512 hosts only): rectangular grids, 3x3x3 with 23 products and
#: flip-graph coefficients, fused and unfused, one streamed; odd shapes (padding, row tails)
CATALOGUE = {"hopcroft-kerr": ((61, 45, 70), {}),
             "at-2x3x3-r15": ((50, 67, 59), {"fused": False}),
             "laderman": ((70, 45, 53), {"fused": False}),
             "fgr-3x3x3-r23-c": ((47, 64, 58), {"fused": False, "stream": True})}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("cpu_lcma_avx2")
    jobs = {k: dict(algo=a, shape=shp, dtype=dt, config=cfg) for k, (a, shp, dt, cfg, *_) in JOBS.items()}
    jobs.update({f"cat-{a}": dict(algo=a, shape=shp, dtype="float32", config={**SMALL, "kc": 16, **cfg})
                 for a, (shp, cfg) in CATALOGUE.items()})
    keys = list(jobs)
    res = build_many([dict(**jobs[k], target=AVX2, name=f"lcma-{k}", out_dir=out) for k in keys])
    return dict(zip(keys, res))


@pytest.mark.parametrize("key", list(JOBS) + [f"cat-{a}" for a in CATALOGUE])
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


@pytest.mark.parametrize("key", list(STREAMED))
def test_streamed_packing_is_bit_identical_and_non_temporal(built, key):
    """Streaming changes where Ãp/B̃p's stores go, not a value: the streamed build's C equals
    the plain build's bit for bit, whole lines are streamed and nothing else, each task
    fences its stores, and the library holds non-temporal stores exactly when streamed."""
    import lcmac
    plain, streamed = lcmac.load(_get(built, key)), lcmac.load(_get(built, key + "-stream"))
    m = plain.manifest
    rng = np.random.default_rng(11)
    A = _guarded(rng.standard_normal((m.M, m.K)).astype(m.dtype))
    B = rng.standard_normal((m.K, m.N)).astype(m.dtype)
    C = streamed(A, B)
    assert np.array_equal(C, plain(A, B))
    assert np.array_equal(streamed(A, streamed.prepare_b(B)), C)
    p = _get(built, key + "-stream")
    src = (p.parent / Manifest.read(p).extra["source"]).read_text()
    for name, on in zip(("Ãp", "B̃p"), STREAMED[key]):
        assert (f"packs {name}, streamed)" in src) == on, name
    # every streamed pass (in each entry point) ends its tasks with the fence
    sections = re.split(r"\n\s*# ", src)
    streamed_passes = [x for x in sections if x.startswith("Combine") and "streamed)" in x]
    assert len(streamed_passes) == 2 * sum(STREAMED[key])
    for x in streamed_passes:
        loops = len(re.findall(r"for (?:p|qo) in (?:T\.parallel|range)\(", x))
        assert x.count("\"lcmac_stream_fence\")") == loops
        # a streamed line is named with its extent (an element's address_of lets TVM shrink
        # the buffer to the elements it sees)
        assert "T.address_of(" not in x and re.search(r"tvm_access_ptr\([^;]*, \d+, 2\)", x)
    objdump = shutil.which("objdump")
    if objdump is None:
        pytest.skip("objdump not installed: the machine-code check needs it")

    def non_temporal(path):
        lib = Manifest.read(path).library_path(path)
        asm = subprocess.run([objdump, "-d", str(lib)], capture_output=True, text=True, check=True).stdout
        return len(re.findall(r"\tvmovnt(?:dq|ps|pd)\s", asm))
    assert non_temporal(_get(built, key)) == 0
    assert non_temporal(p) > 0
