"""CPU backend (apache-tvm TensorIR + LLVM): every small catalogue algorithm, one and two
levels, fused and unfused, odd shapes, float32/float64, the three x86 targets, codegen
constants, build errors.  Builds are batched through one worker per fixture and cached in a
session directory (each compile is seconds)."""
from __future__ import annotations

import subprocess
import sys
from fractions import Fraction

import numpy as np
import pytest

from lcmac.artifact.build import build, build_many
from lcmac.core.errors import CatalogueError, DTypeError, ShapeError, TargetError
from lcmac.ir import catalogue
from lcmac.ir.algorithm import Algorithm
from lcmac.spec.cpu.config import CpuConfig
from lcmac.artifact.manifest import Manifest
from lcmac.spec.cpu.x86 import host_supports

pytestmark = pytest.mark.skipif(not host_supports("x86_64-avx512"),
                                reason="needs an AVX-512 x86-64 host to run the artifacts")

SMALL = sorted(a.name for a in catalogue.all_algorithms() if max(a.grid) <= 3)
# small tiles: several parallel tasks and kc chunks, padding everywhere
TINY = {"mc": 16, "nc": 64, "kc": 16}
T512 = "x86_64-avx512"


BF16_MCPU = "sapphirerapids"
DOT = {"bf16_dot": True}   # opt-in: the FMA path measured faster on this CPU (spec/cpu/config.py)
BF16_DOT = [  # (key, algorithm, (M, N, K), config)
    ("gemm-bf16dot", "gemm", (77, 51, 93), {**TINY, **DOT}),
    ("gemm-bf16dot-default", "gemm", (128, 96, 200), DOT),
    ("strassen-bf16dot", "strassen", (45, 38, 70), {**TINY, **DOT}),
    ("strassen-bf16dot-unfused", "strassen", (66, 50, 38), {**TINY, "fused": False, **DOT}),
    ("strassen2-bf16dot", "strassen^2", (70, 45, 53), {**TINY, **DOT}),
    ("strassenxstrassen-bf16dot", "strassen*strassen", (61, 67, 59), {"mc": 16, "nc": 32, "nr": 32, "kc": 32, **DOT}),
    ("winograd-bf16dot", "winograd", (45, 33, 61), {**TINY, **DOT}),
]
HOST_BF16 = host_supports(T512, ("avx512_bf16",))


def _shape(i: int) -> tuple[int, int, int]:
    rng = np.random.default_rng(1000 + i)
    return tuple(int(x) for x in rng.integers(17, 80, size=3))    # odd sizes, grid rarely divides


def _check(path, seed=0, rtol=None):
    import lcmac
    f = lcmac.load(path)
    m = f.manifest
    dt = np.dtype(m.dtype)
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((m.M, m.K)).astype(dt)
    B = rng.standard_normal((m.K, m.N)).astype(dt)
    C = f(A, B)
    ref = A.astype(np.float64) @ B.astype(np.float64)
    err = np.linalg.norm(C - ref) / max(np.linalg.norm(ref), 1e-30)
    tol = rtol or (1e-5 if dt == np.float32 else 1e-12)
    assert err < tol, f"{m.name}: relative error {err:.3g}"
    return f


@pytest.fixture(scope="session")
def artdir(tmp_path_factory):
    return tmp_path_factory.mktemp("cpu_artifacts")


def _scaled_strassen() -> Algorithm:
    """Strassen with U·2 and W·½: still exact, with coefficients 2 and 1/2 to fold."""
    s = catalogue.get("strassen")
    U = np.array([[[x * 2 for x in row] for row in mat] for mat in s.U.tolist()], dtype=object)
    W = np.array([[[Fraction(x, 2) for x in row] for row in mat] for mat in s.W.tolist()], dtype=object)
    return Algorithm(2, 2, 2, U, s.V, W, name="strassen-scaled")


@pytest.fixture(scope="session")
def builds(artdir):
    jobs = {}
    for i, name in enumerate(SMALL):
        jobs[f"cat:{name}"] = dict(algo=name, target=T512, shape=_shape(i), config=TINY)
    jobs["strassen-2level"] = dict(algo="strassen", levels=2, target=T512, shape=(70, 45, 53), config=TINY)
    jobs["strassen^2-name"] = dict(algo="strassen^2", target=T512, shape=(64, 64, 64), config={"mc": 16, "nc": 32, "nr": 32, "kc": 16})
    jobs["strassen-unfused"] = dict(algo="strassen", target=T512, shape=(66, 50, 38), config={**TINY, "fused": False})
    jobs["laderman-unfused"] = dict(algo="laderman", target=T512, shape=(31, 40, 29), config={**TINY, "fused": False})
    # rational coefficients (W in ±1/2, ±1/4, ±1/8) and 16-term Ã sums, on a shape the 4x4 grid does not divide
    jobs["dps48"] = dict(algo="dps-4x4x4-r48", target=T512, shape=(70, 45, 53), config=TINY)
    # packed ahead, H fused (float32 on AVX-512 packs per block and stores H by default): the
    # CSE'd combine passes and the fused epilogue
    jobs["strassen-fused-even"] = dict(algo="strassen", target=T512, shape=(64, 128, 64),
                                       config={"mr": 8, "mc": 16, "nc": 32, "nr": 32, "kc": 16, "bands": 0,
                                               "fused": True})
    jobs["winograd-f64"] = dict(algo="winograd", target=T512, dtype="float64", shape=(45, 33, 61), config=TINY)
    jobs["strassen-f64-unfused"] = dict(algo="strassen", target=T512, dtype="float64", shape=(32, 48, 64),
                                        config={"fused": False, "mc": 16, "nc": 16, "nr": 16, "kc": 16})
    jobs["gemm-odd"] = dict(algo="gemm", target=T512, shape=(77, 51, 93), config=TINY)
    # row tails (BM = 50 rows in tiles of 6): C written directly, A read with clamped rows
    jobs["strassen-rowtail"] = dict(algo="strassen", target=T512, shape=(100, 128, 64),
                                    config={"mr": 6, "nr": 64, "mc": 48, "nc": 64, "kc": 16})
    jobs["strassen-rowtail-unfused"] = dict(algo="strassen", target=T512, shape=(100, 128, 64),
                                            config={"mr": 6, "nr": 64, "mc": 48, "nc": 64, "kc": 16,
                                                    "fused": False})
    jobs["gemm-rowtail"] = dict(algo="gemm", target=T512, shape=(130, 64, 48),
                                config={"mr": 6, "nr": 64, "mc": 66, "nc": 64, "kc": 16})
    jobs["gemm-even"] = dict(algo="gemm", target=T512, shape=(128, 128, 128))
    jobs["gemm-tiny"] = dict(algo="gemm", target=T512, shape=(1, 3, 2))
    jobs["gemm-f64"] = dict(algo="gemm", target=T512, dtype="float64", shape=(40, 24, 17))
    jobs["strassen-tiny"] = dict(algo="strassen", target=T512, shape=(1, 1, 3))
    # a block with no valid column (N < n or K < k): its padding must be all zeros
    for shp in ((1, 1, 3), (4, 1, 3), (3, 4, 1)):
        jobs[f"strassen-empty-block-{shp}"] = dict(algo="strassen", target=T512, shape=shp,
                                                   config={"mr": 8, "nr": 32, "mc": 256, "nc": 512})
    jobs["gemm-bf16"] = dict(algo="gemm", target=T512, dtype="bf16", shape=(64, 32, 48))
    jobs["strassen-bf16"] = dict(algo="strassen", target=T512, dtype="bf16", shape=(45, 38, 70), config=TINY)
    jobs["strassen-bf16-unfused"] = dict(algo="strassen", target=T512, dtype="bf16", shape=(32, 64, 32),
                                         config={"fused": False, "mc": 16, "nc": 32, "nr": 32, "kc": 16})
    jobs["scaled"] = dict(algo=_scaled_strassen(), target=T512, shape=(40, 36, 21), config=TINY)
    # bf16 on vdpbf16ps: an mcpu with AVX512-BF16 selects it (compiled anywhere, run where the
    # host has avx512_bf16); odd shapes, several tasks and kc chunks
    for key, algo, shape, cfg in BF16_DOT:
        jobs[key] = dict(algo=algo, target=T512, dtype="bf16", shape=shape, config=cfg, mcpu=BF16_MCPU)
    jobs["gemm-bf16-dot-off"] = dict(algo="gemm", target=T512, dtype="bf16", shape=(33, 40, 26),
                                     config={"bf16_dot": False}, mcpu=BF16_MCPU)
    jobs["gemm-bf16-native"] = dict(algo="gemm", target=T512, dtype="bf16", shape=(40, 24, 17), mcpu="native",
                                    config=DOT)
    for tgt in ("x86_64-avx2", "x86_64"):
        jobs[f"gemm-{tgt}"] = dict(algo="gemm", target=tgt, shape=(50, 70, 30))
        jobs[f"strassen-{tgt}"] = dict(algo="strassen", target=tgt, shape=(43, 29, 36), config={"mc": 12 if tgt != "x86_64" else 16, "nc": 32, "kc": 16})
        jobs[f"winograd-f64-{tgt}"] = dict(algo="winograd", target=tgt, dtype="float64", shape=(20, 21, 22))
    keys = list(jobs)
    for k, kw in jobs.items():
        kw.setdefault("name", k.replace(":", "_").replace("^", "p"))
        kw["out_dir"] = artdir
    res = build_many([jobs[k] for k in keys])
    return dict(zip(keys, res))


def _get(builds, key):
    r = builds[key]
    if isinstance(r, Exception):
        raise r
    return r


@pytest.mark.parametrize("name", SMALL)
def test_catalogue_algorithm(builds, name):
    p = _get(builds, f"cat:{name}")
    m = Manifest.read(p)
    alg = catalogue.get(name)
    assert m.algorithm["rank"] == alg.R and m.algorithm["hash"] == alg.hash
    _check(p, seed=hash(name) % 1000)


@pytest.mark.parametrize("key", ["strassen-2level", "strassen^2-name"])
def test_two_levels(builds, key):
    p = _get(builds, key)
    m = Manifest.read(p)
    assert m.algorithm["rank"] == 49 and m.algorithm["grid"] == [4, 4, 4]
    _check(p, rtol=2e-5)


def test_rational_scheme(builds):
    p = _get(builds, "dps48")
    assert Manifest.read(p).algorithm["rank"] == 48
    _check(p)


@pytest.mark.parametrize("key", ["strassen-unfused", "laderman-unfused", "strassen-fused-even",
                                 "strassen-f64-unfused"])
def test_fused_and_unfused(builds, key):
    p = _get(builds, key)
    m = Manifest.read(p)
    src = (p.parent / m.extra["source"]).read_text()
    assert ("H = T.alloc_buffer" in src) == (not m.config["fused"])
    _check(p)


@pytest.mark.parametrize("shape", [(1, 1, 3), (4, 1, 3), (3, 4, 1), (5, 2, 7)])
def test_zero_padding_writes_every_element(shape):
    """The pad passes, run as Python on NaN-filled buffers, leave no element unwritten.  They
    skipped the rows of a block with no valid column (N < n, K < k), and the GEMM then read
    leftover workspace memory: strassen at 1×1×3 was wrong in about half of the calls."""
    import types
    from lcmac.ir import get
    from lcmac.schedules.cpu_combine import emit_pad
    from lcmac.spec.cpu.config import CpuConfig
    from lcmac.schedules.cpu_gemm import Writer, geometry
    M, N, K = shape
    g = geometry(get("strassen").grid, M, N, K, CpuConfig(mr=8, nr=32, mc=256, nc=512))
    w = Writer()
    emit_pad(w, "A", "Apad", g.m, g.k, g.rows, g.cols_k, g.BM, g.BK, g.BMP, g.BKP, "0.0")
    emit_pad(w, "B", "Bpad", g.k, g.n, g.cols_k, g.cols, g.BK, g.BN, g.BKP, g.BNP, "0.0")
    env = {"T": types.SimpleNamespace(parallel=range), "A": np.ones((M, K)), "B": np.ones((K, N)),
           "Apad": np.full((g.m * g.BMP, g.k * g.BKP), np.nan),
           "Bpad": np.full((g.k * g.BKP, g.n * g.BNP), np.nan)}
    exec(w.text(), env)
    for name, src in (("Apad", "A"), ("Bpad", "B")):
        pad = env[name]
        assert not np.isnan(pad).any(), f"{name}: {np.isnan(pad).sum()} elements never written"
        assert pad.sum() == env[src].size      # every input element copied once, zeros elsewhere


@pytest.mark.parametrize("shape", [(1, 1, 3), (4, 1, 3), (3, 4, 1)])
def test_blocks_without_valid_columns(builds, shape):
    _ = [_check(_get(builds, f"strassen-empty-block-{shape}"), seed=s) for s in range(4)]


def _guarded(a: np.ndarray) -> np.ndarray:
    """A copy of ``a`` whose last byte is the last byte before a PROT_NONE page: a read past
    its end crashes instead of passing unnoticed (Combine A's clamped rows)."""
    import ctypes
    import mmap
    page = mmap.PAGESIZE
    n = a.nbytes
    total = -(-n // page) * page + page
    buf = mmap.mmap(-1, total)
    base = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    assert ctypes.CDLL(None).mprotect(ctypes.c_void_p(base + total - page), page, 0) == 0
    out = np.frombuffer(buf, a.dtype, count=a.size, offset=total - page - n).reshape(a.shape)
    out[...] = a
    return out


@pytest.mark.parametrize("key", ["strassen-rowtail", "strassen-rowtail-unfused", "gemm-rowtail"])
def test_row_tail_writes_c_directly(builds, key):
    """Blocks whose rows are not whole mr-row tiles: no A copy, no C workspace, no crop;
    Combine A clamps the padded rows (A guarded after its end), the epilogue skips them."""
    import lcmac
    p = _get(builds, key)
    f = lcmac.load(p)
    m = f.manifest
    assert m.extra["padded"] == {"A": False, "B": False, "C": False} and m.extra["direct_c"]
    src = (p.parent / m.extra["source"]).read_text()
    assert "T.min(" in src and "Apad" not in src and "Cw" not in src
    rng = np.random.default_rng(3)
    A = _guarded(rng.standard_normal((m.M, m.K)).astype(np.float32))
    B = _guarded(rng.standard_normal((m.K, m.N)).astype(np.float32))
    C = np.full((m.M, m.N), np.nan, np.float32)
    f(A, B, out=C)
    ref = A.astype(np.float64) @ B.astype(np.float64)
    assert np.linalg.norm(C - ref) / np.linalg.norm(ref) < 1e-5


@pytest.mark.parametrize("key", ["gemm-odd", "gemm-even", "gemm-tiny", "gemm-f64", "strassen-tiny",
                                 "winograd-f64"])
def test_plain_gemm_and_edges(builds, key):
    _check(_get(builds, key))


@pytest.mark.parametrize("tgt", ["x86_64-avx2", "x86_64"])
def test_other_x86_targets(builds, tgt):
    for kind in ("gemm", "strassen", "winograd-f64"):
        p = _get(builds, f"{kind}-{tgt}")
        assert Manifest.read(p).target["name"] == tgt
        if host_supports(tgt):
            _check(p)


@pytest.mark.parametrize("key", ["gemm-bf16", "strassen-bf16", "strassen-bf16-unfused"])
def test_bfloat16(builds, key):
    """bf16 in and out, fp32 combine and accumulation: error of one bf16 rounding of C."""
    torch = pytest.importorskip("torch")
    import lcmac
    f = lcmac.load(_get(builds, key))
    m = f.manifest
    assert m.dtype == "bfloat16"
    g = torch.Generator().manual_seed(0)
    A = torch.randn((m.M, m.K), generator=g).to(torch.bfloat16)
    B = torch.randn((m.K, m.N), generator=g).to(torch.bfloat16)
    C = f(A, B)
    assert C.dtype == torch.bfloat16 and tuple(C.shape) == (m.M, m.N)
    ref = A.double() @ B.double()
    err = ((C.double() - ref).norm() / ref.norm()).item()
    assert err < 8e-3, err
    with pytest.raises(DTypeError):
        f(A.float(), B.float())


def _bf16_contract_model(alg, A, B):
    """C of a bf16 LCMA under its precision contract, in float64 except for the roundings the
    contract makes: Ã_r and B̃_r rounded to bf16 once, products and sums exact, C rounded to
    bf16 once.  (The kernel differs from this only by its fp32 accumulation.)"""
    import torch

    def bf(x):
        return torch.from_numpy(np.ascontiguousarray(x)).to(torch.bfloat16).double().numpy()
    a, b = A.double().numpy(), B.double().numpy()
    m, k, n = alg.grid
    (M, K), N = a.shape, b.shape[1]
    BM, BK, BN = -(-M // m), -(-K // k), -(-N // n)
    ap = np.zeros((m * BM, k * BK))
    ap[:M, :K] = a
    bp = np.zeros((k * BK, n * BN))
    bp[:K, :N] = b
    U, V, W = alg.as_float(np.float64)
    At = bf(np.einsum("ril,ilxy->rxy", U, ap.reshape(m, BM, k, BK).transpose(0, 2, 1, 3)))
    Bt = bf(np.einsum("rlj,ljyz->ryz", V, bp.reshape(k, BK, n, BN).transpose(0, 2, 1, 3)))
    C = np.einsum("rij,rxz->ixjz", W, At @ Bt).reshape(m * BM, n * BN)[:M, :N]
    return bf(C)


def _objdump(lib) -> str:
    import shutil
    if not shutil.which("objdump"):
        pytest.skip("objdump (binutils) not installed")
    return subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(lib)], capture_output=True,
                          text=True, check=True).stdout


def _loops(asm: str):
    """(start, end, instructions) of every backward branch's range: the loops."""
    import re
    ins = []
    for line in asm.splitlines():
        mt = re.match(r"\s*([0-9a-f]+):\s+(\S+)\s*(.*)", line)
        if mt:
            ins.append((int(mt.group(1), 16), mt.group(2), mt.group(3)))
    for addr, op, arg in ins:
        mt = re.match(r"([0-9a-f]+) <", arg)
        if op.startswith("j") and mt and int(mt.group(1), 16) < addr:
            lo = int(mt.group(1), 16)
            yield lo, addr, [o for a, o, _ in ins if lo <= a <= addr]


@pytest.mark.parametrize("key", [k for k, *_ in BF16_DOT])
def test_bf16_dot_product_kernel(builds, key):
    """With AVX512-BF16 the GEMM stage runs on vdpbf16ps: in the library's innermost loop
    (mr·nr/16 per k pair, no FMAs there), and the manifest says so and asks for the flag."""
    p = _get(builds, key)
    m = Manifest.read(p)
    assert m.extra["gemm_kernel"] == "vdpbf16ps" and m.extra["packed_dtype"] == "bfloat16"
    assert "avx512_bf16" in m.extra["cpu_flags"]
    per_pair = m.config["mr"] * m.config["nr"] // 16
    best = max((ops for *_, ops in _loops(_objdump(p.with_suffix(".so")))),
               key=lambda ops: ops.count("vdpbf16ps"))
    assert best.count("vdpbf16ps") >= per_pair, best.count("vdpbf16ps")
    assert not [o for o in best if o.startswith("vfmadd")], "FMAs in the vdpbf16ps loop"


@pytest.mark.skipif(not HOST_BF16, reason="the host has no AVX512-BF16 (avx512_bf16)")
@pytest.mark.parametrize("key", [k for k, *_ in BF16_DOT])
def test_bf16_dot_product_numerics(builds, key):
    """Against float64: the plain GEMM's error is numpy fp32's on the same bf16 inputs (both
    are then one bf16 rounding of C); an LCMA's is larger by its contract (Ã, B̃ rounded to
    bf16 once: ~3x for Strassen, ~6x for Strassen²), and the kernel matches a float64 model
    of exactly that contract to a small fraction of one bf16 rounding."""
    torch = pytest.importorskip("torch")
    import lcmac
    from lcmac.artifact.build import resolve_algorithm
    _skip_unless_host_runs(_get(builds, key))
    f = lcmac.load(_get(builds, key))
    m = f.manifest
    g = torch.Generator().manual_seed(3)
    A = torch.randn((m.M, m.K), generator=g).to(torch.bfloat16)
    B = torch.randn((m.K, m.N), generator=g).to(torch.bfloat16)
    C = f(A, B).double().numpy()
    ref = A.double().numpy() @ B.double().numpy()
    nref = np.linalg.norm(ref)
    err = np.linalg.norm(C - ref) / nref
    np32 = (A.float() @ B.float()).to(torch.bfloat16).double().numpy()
    err_np = np.linalg.norm(np32 - ref) / nref            # ≈ 2^-9/√3 ≈ 1.1e-3 .. 1.7e-3
    alg = resolve_algorithm(m.algorithm["name"])[0]
    model = _bf16_contract_model(alg, A, B)
    # a few C elements may round the other way after fp32 (not float64) accumulation
    assert np.linalg.norm(C - model) / nref < 1e-4, (err, err_np)
    if m.algorithm["name"] == "gemm":
        assert err <= 1.01 * err_np, (err, err_np)
    else:
        assert err <= 8 * err_np, (err, err_np)


def test_bf16_kernel_follows_target_features(builds):
    """vdpbf16ps only where the LLVM target has AVX512-BF16 (and the config allows it): the
    registry's x86_64-avx512 (skylake-avx512) keeps the fp32-FMA kernel; mcpu=native adds the
    feature from /proc/cpuinfo (LLVM names this VM's CPU rocketlake, which lacks it)."""
    fma = Manifest.read(_get(builds, "gemm-bf16"))
    assert fma.extra["gemm_kernel"] == "fma" and "avx512_bf16" not in fma.extra["cpu_flags"]
    asm = _objdump(_get(builds, "gemm-bf16").with_suffix(".so"))
    assert "vdpbf16ps" not in asm and "vfmadd" in asm
    off = Manifest.read(_get(builds, "gemm-bf16-dot-off"))
    assert off.extra["gemm_kernel"] == "fma" and off.config["bf16_dot"] is False
    assert CpuConfig().bf16_dot is False           # the default: see spec/cpu/config.py
    nat = _get(builds, "gemm-bf16-native")
    assert Manifest.read(nat).extra["gemm_kernel"] == ("vdpbf16ps" if HOST_BF16 else "fma")
    _check_bf16(nat)                    # built for this host
    off_flags = tuple(Manifest.read(_get(builds, "gemm-bf16-dot-off")).extra["cpu_flags"])
    if host_supports(T512, off_flags):  # mcpu=sapphirerapids code: run it on such a CPU only
        _check_bf16(_get(builds, "gemm-bf16-dot-off"))


def _skip_unless_host_runs(path):
    """mcpu=sapphirerapids code may use more than AVX512-BF16 (AVX512-FP16 moves): run it
    only where the host has every CPU feature its manifest lists."""
    flags = tuple(Manifest.read(path).extra["cpu_flags"])
    if not host_supports(T512, flags):
        pytest.skip(f"the host lacks CPU features this artifact needs ({', '.join(flags)})")


def _check_bf16(path):
    torch = pytest.importorskip("torch")
    import lcmac
    f = lcmac.load(path)
    m = f.manifest
    g = torch.Generator().manual_seed(1)
    A = torch.randn((m.M, m.K), generator=g).to(torch.bfloat16)
    B = torch.randn((m.K, m.N), generator=g).to(torch.bfloat16)
    ref = A.double() @ B.double()
    err = ((f(A, B).double() - ref).norm() / ref.norm()).item()
    assert err < 3e-3, err


def test_coefficients_are_constants(builds):
    """The coefficients 2 and 1/2 of the scaled Strassen appear as literals in the generated
    TensorIR; the only buffers are the operands and the workspaces (no coefficient table)."""
    import re
    p = _get(builds, "scaled")
    m = Manifest.read(p)
    src = (p.parent / m.extra["source"]).read_text()
    assert "T.float32(2.0) *" in src and "T.float32(0.5) *" in src
    bufs = set(re.findall(r"(\w+): T\.Buffer", src)) | set(re.findall(r"(\w+) = T\.(?:alloc|decl)_buffer", src))
    assert bufs <= {"A", "B", "C", "Ap", "At", "Bp", "Apad", "Bpad", "Cw", "H", "acc", "xin", "tmp"}, bufs
    # padding is a copy with static bounds, never a select with clamped loads (TVM dropped
    # the clamp: the padded lanes read past A's end and a 4096 build segfaulted)
    assert "Apad" in src and "T.Select" not in src
    _check(p)
    # and for the catalogue's Strassen: 7 products, each output of the CSE'd programs a line
    s = (p.parent / Manifest.read(_get(builds, "strassen-fused-even")).extra["source"]).read_text()
    s = s.split("def lcmac_matmul_prepare_b")[0]        # lcmac_matmul (the prepared pair repeats it)
    assert len(re.findall(r"^\s*Ap\[\d+, .*\] = ", s, re.M)) == 7
    assert len(re.findall(r"^\s*Bp\[\d+, .*\] = ", s, re.M)) == 7
    assert s.count("# fused Combine H: H_") == 7 and "# fused Combine H: H_7 " in s


def test_no_leftover_temp_files(builds, artdir):
    assert not list(artdir.glob(".*.tmp"))


def test_config_space_and_roundtrip():
    from lcmac.spec.cpu.config import CpuConfig, config_space, default_config
    from lcmac.spec.targets import get_target
    t = get_target(T512)
    space = config_space(t, "float32", (1024, 1024, 1024))
    assert space[0] == default_config(t, "float32", shape=(1024, 1024, 1024)) and len(space) > 50
    # the default blocks divide the parallel tasks over the threads (3 tasks on 2 cores: 0.8x)
    from lcmac.ir import get
    from lcmac.schedules.cpu_gemm import geometry
    for alg, shp, threads in ((None, (4096,) * 3, 2), (get("strassen"), (4096,) * 3, 2),
                              (None, (2048, 1536, 7168), 2), (None, (4096,) * 3, 16),
                              (get("strassen^2"), (3000, 2000, 1000), 6)):
        c = default_config(t, "float32", alg, shape=shp, threads=threads)
        g = geometry(alg.grid if alg else (1, 1, 1), *shp, c)
        tasks = g.nmc * g.nnc
        assert tasks % threads == 0 or tasks >= 8 * threads, (alg, shp, threads, c)
        assert g.BMP * g.BNP <= 1.05 * g.BM * g.BN       # nr = 64 columns: 500 → 512
    assert all(isinstance(c, CpuConfig) and c.nr % 16 == 0 for c in space)
    c = CpuConfig(mr=6, nr=32, mc=60, fused=False)
    assert CpuConfig.from_dict(c.to_dict()) == c
    assert default_config(get_target("x86_64-avx2"), "float64").nr == 8
    with pytest.raises(ValueError):
        CpuConfig.from_dict({"bogus": 1})
    # 3 vectors per row of the micro-tile compile to lane-by-lane code: refused, named
    with pytest.raises(ValueError, match="nr=48 is 3 vectors"):
        CpuConfig(nr=48).validate(16)
    CpuConfig(nr=64).validate(16)
    assert all((c.nr // 16) in (1, 2, 4) for c in space)


try:
    from hypothesis import given, settings
    from hypothesis import strategies as st

    @settings(max_examples=200, deadline=None)
    @given(st.integers(1, 3000), st.integers(1, 3000), st.integers(1, 3000),
           st.sampled_from([(1, 1, 1), (2, 2, 2), (3, 3, 3), (2, 3, 4), (4, 4, 4)]),
           st.integers(1, 4), st.sampled_from([4, 6, 8]), st.sampled_from([8, 16, 32]))
    def test_geometry_whole_tiles(M, N, K, grid, scale, mr, nr):
        """Padding (not predication): tiles always divide the padded blocks, cover the
        logical blocks, and pad by less than one register tile per task."""
        from lcmac.spec.cpu.config import CpuConfig
        from lcmac.schedules.cpu_gemm import geometry
        cfg = CpuConfig(mr=mr, nr=nr, mc=16 * scale * mr // 2 or mr, nc=64 * scale, kc=32 * scale)
        g = geometry(grid, M, N, K, cfg)
        assert g.BMP == g.MC * g.nmc and g.MC % mr == 0 and g.BMP >= g.BM
        assert g.BNP == g.NC * g.nnc and g.NC % nr == 0 and g.BNP >= g.BN
        assert g.BKP == g.KC * g.nkc and g.KC % cfg.ku == 0 and g.BKP >= g.BK
        assert g.BMP - g.BM < g.nmc * mr and g.BNP - g.BN < g.nnc * nr
        assert g.m * g.BM >= M and g.n * g.BN >= N and g.k * g.BK >= K
except ImportError:  # pragma: no cover
    pass


def test_build_errors(tmp_path):
    with pytest.raises(CatalogueError):
        build("no-such-algorithm", T512, "float32", (8, 8, 8), out_dir=tmp_path)
    with pytest.raises(TargetError):
        build("gemm", "no-such-target", "float32", (8, 8, 8), out_dir=tmp_path)
    with pytest.raises(DTypeError):
        build("gemm", T512, "int7", (8, 8, 8), out_dir=tmp_path)
    with pytest.raises(DTypeError, match="x86_64-avx2 does not support bfloat16"):
        build("gemm", "x86_64-avx2", "bf16", (8, 8, 8), out_dir=tmp_path)
    with pytest.raises(DTypeError, match="float16"):
        build("gemm", T512, "fp16", (8, 8, 8), out_dir=tmp_path)
    with pytest.raises(ShapeError):
        build("gemm", T512, "float32", "8x8", out_dir=tmp_path)
    with pytest.raises(TargetError):
        build("gemm", T512, "float32", (8, 8, 8), config={"nr": 20}, out_dir=tmp_path)
    assert not list(tmp_path.iterdir())


def test_cli_build(tmp_path):
    out = subprocess.run([sys.executable, "-m", "lcmac.cli.main", "build", "--algo", "winograd",
                          "--target", T512, "--dtype", "fp32", "--shape", "24x40x16",
                          "-o", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "built winograd" in out.stdout and " s" in out.stdout
    assert "error    " in out.stdout and "float32 arithmetic" in out.stdout
    man = tmp_path / "winograd-x86_64-avx512-float32-24x40x16.json"
    assert man.is_file() and man.with_suffix(".so").is_file()
    _check(man)
    bad = subprocess.run([sys.executable, "-m", "lcmac.cli.main", "build", "--algo", "gemm", "--dtype",
                          "fp16", "--shape", "8x8x8", "-o", str(tmp_path)], capture_output=True, text=True)
    assert bad.returncode == 2 and "float16" in bad.stderr


def test_mcpu_features_are_checked_before_running(builds):
    """Code for --mcpu sapphirerapids may use AVX512-FP16 and AMX as well as AVX512-BF16
    (LLVM emits vmovw): the manifest lists every such flag, and a host without one of them
    gets an error naming it from lcmac.load, never an illegal instruction."""
    import lcmac
    p = _get(builds, "gemm-bf16-dot-off")
    flags = Manifest.read(p).extra["cpu_flags"]
    assert {"avx512f", "avx512_bf16", "avx512_fp16", "amx_tile"} <= set(flags), flags
    if not host_supports(T512, tuple(flags)):
        with pytest.raises(TargetError, match="needs CPU features"):
            lcmac.load(p)
