"""bfloat16 on Intel AMX (config knob ``amx``): the template's text, the config's checks, a
cross-compiled artifact (``--mcpu sapphirerapids``) and how the loaders treat it.

Runs on any x86-64 host: the artifact is built by cross-compilation and its assembly
inspected; on a CPU without AMX the loaders must refuse it with an error, not SIGILL.  The
tests marked ``amx_host`` run an artifact and need a CPU with amx_tile/amx_bf16; they take
prebuilt artifacts from ``LCMAC_AMX_ARTIFACTS`` (a directory of manifests, e.g. built here
and run on an AMX machine without apache-tvm) or build them where apache-tvm is installed.
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from lcmac.core.errors import DTypeError, TargetError
from lcmac.ir import get as get_algorithm
from lcmac.spec.cpu.config import CpuConfig, resolve_config
from lcmac.schedules.cpu_gemm import AMX_FEATURES, amx_fn, amx_ll
from lcmac.schedules.cpu_lcma import generate
from lcmac.runtime import amx
from lcmac.spec.cpu import x86
from lcmac.spec.targets import get_target

ROOT = Path(__file__).resolve().parents[1]
T512 = get_target("x86_64-avx512")
FEATS = (*AMX_FEATURES, "avx512bf16")
AMX_HOST = {"amx_tile", "amx_bf16"} <= x86.host_flags()
HAVE_TVM = importlib.util.find_spec("tvm") is not None
PREBUILT = os.environ.get("LCMAC_AMX_ARTIFACTS")
amx_host = pytest.mark.skipif(not AMX_HOST, reason="needs a CPU with AMX (amx_tile, amx_bf16)")


def _cfg(**kw):
    return CpuConfig(**{"mr": 32, "nr": 32, "mc": 64, "nc": 64, "kc": 64, "amx": True, **kw})


# ---- the config ------------------------------------------------------------------------
def test_config_validates_the_amx_tile():
    _cfg().validate(16)
    with pytest.raises(ValueError, match="mr=32 and nr=32"):
        _cfg(mr=8).validate(16)
    with pytest.raises(ValueError, match="kc a multiple of 32"):
        _cfg(kc=48).validate(16)
    with pytest.raises(ValueError, match="set one"):
        _cfg(bf16_dot=True).validate(16)
    with pytest.raises(ValueError, match="true or false"):
        _cfg(amx=1).validate(16)


def test_resolve_config_amx():
    cfg = resolve_config(T512, "bfloat16", {"amx": True}, shape=(256, 256, 256))
    assert (cfg.mr, cfg.nr, cfg.amx) == (32, 32, True)        # the AMX tile by default
    # and the AMX kernel's blocks, not the FMA kernel's, where the config names none
    big = resolve_config(T512, "bfloat16", {"amx": True}, shape=(4096, 4096, 4096))
    assert (big.mc, big.nc, big.kc) == (256, 256, 1024)
    s2 = resolve_config(T512, "bfloat16", {"amx": True}, algorithm=get_algorithm("strassen^2"),
                        shape=(4096, 4096, 4096))
    assert s2.mc == 128
    assert resolve_config(T512, "bfloat16", {"amx": True, "kc": 4096},
                          shape=(4096, 4096, 4096)).kc == 4096
    with pytest.raises(DTypeError, match="bfloat16"):
        resolve_config(T512, "float32", {"amx": True})
    assert resolve_config(T512, "bfloat16", None).amx is False      # opt-in


def test_generate_refuses_amx_without_the_features_or_for_float32():
    alg = get_algorithm("strassen")
    with pytest.raises(TargetError, match="amx-tile"):
        generate(alg, "bfloat16", 64, 64, 64, _cfg(), features=("avx512bf16",))
    with pytest.raises(DTypeError, match="bfloat16"):
        generate(alg, "float32", 64, 64, 64, _cfg(), features=FEATS)


# ---- the generated text ------------------------------------------------------------------
def test_amx_ll_uses_the_internal_intrinsics():
    ll = amx_ll(64)                                  # two 32-wide k steps
    body = ll.split("\ndeclare")[0]
    assert body.count("@llvm.x86.tdpbf16ps.internal(") == 8
    assert body.count("@llvm.x86.tileloadd64.internal(") == 8
    assert body.count("@llvm.x86.tilezero.internal(") == 4
    assert body.count("@llvm.x86.tilestored64.internal(") == 4
    assert f"define void @{amx_fn(64)}(ptr %c, ptr %a, ptr %b)" in ll
    with pytest.raises(AssertionError):
        amx_ll(48)


@pytest.mark.parametrize("algo", ["gemm", "strassen", "winograd^2"])
def test_generate_calls_the_amx_kernel(algo):
    alg = get_algorithm(algo) if algo != "gemm" else get_algorithm("naive-1x1x1").renamed("gemm")
    src, info = generate(alg, "bfloat16", 100, 200, 300, _cfg(), features=FEATS)
    assert info["gemm_kernel"] == "amx" and info["packed_dtype"] == "bfloat16"
    assert info["geometry"]["KC"] % 32 == 0 and info["geometry"]["BKP"] % 32 == 0
    assert "pragma_import_llvm" in src and "llvm.x86.tdpbf16ps.internal" in src
    # a side-effecting call (it writes acc), with pointers into the packed operands
    assert re.search(r'T\.call_extern\("void", "lcmac_amx_bf16_32x32_k\d+", T\.address_of\(acc\[0, 0\]\), '
                     r'T\.address_of\(Ap16\[', src)
    assert 'Ap16 = T.alloc_buffer' in src and '"uint16"' in src and "Bp32" in src
    assert "call_pure_extern" not in src


def test_non_amx_bf16_text_is_unchanged_by_the_knob():
    alg = get_algorithm("strassen")
    cfg = CpuConfig(mr=8, nr=32, mc=64, nc=64, kc=64)
    src, info = generate(alg, "bfloat16", 64, 64, 64, cfg, features=FEATS)
    assert info["gemm_kernel"] == "fma" and "amx" not in src.lower()


# ---- a cross-compiled artifact ---------------------------------------------------------------
def _find_prebuilt(pattern: str):
    if not PREBUILT:
        return []
    return sorted(Path(PREBUILT).glob(pattern))


@pytest.fixture(scope="module")
def cross(tmp_path_factory):
    """A bf16 AMX gemm and Strassen at an odd shape, built for --mcpu sapphirerapids."""
    if not HAVE_TVM:
        pytest.skip("building needs apache-tvm")
    from lcmac.artifact.build import build_many
    out = tmp_path_factory.mktemp("amx")
    names = {"gemm": "gemm", "strassen": "strassen"}
    res = build_many([dict(algo=a, target=T512, dtype="bfloat16", shape=(40, 33, 70),
                           config={"amx": True, "mc": 32, "nc": 32, "kc": 64}, out_dir=out,
                           name=f"{n}-amx", mcpu="sapphirerapids") for n, a in names.items()])
    for r in res:
        if isinstance(r, Exception):
            raise r
    return {n: out / f"{n}-amx.json" for n in names}


def test_artifact_records_amx(cross):
    man = json.loads(cross["gemm"].read_text())
    assert man["extra"]["gemm_kernel"] == "amx"
    assert {"amx_tile", "amx_bf16"} <= set(man["extra"]["cpu_flags"])
    assert man["config"]["amx"] is True


@pytest.mark.skipif(shutil.which("objdump") is None, reason="needs objdump")
def test_artifact_assembly_has_tdpbf16ps(cross):
    asm = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(cross["strassen"].with_suffix(".so"))],
                         capture_output=True, text=True, check=True).stdout
    assert "tdpbf16ps" in asm and "tileloadd" in asm and "ldtilecfg" in asm
    # the accumulators stay in tiles: 4 tile stores per micro-tile, no spills through the stack
    assert not re.search(r"tilestored\s+%tmm\d,.*\(%rsp", asm)


def test_build_refuses_amx_for_a_cpu_without_it(tmp_path):
    if not HAVE_TVM:
        pytest.skip("building needs apache-tvm")
    from lcmac.artifact.build import build
    with pytest.raises(Exception, match="amx-tile"):
        build("gemm", target=T512, dtype="bfloat16", shape=(64, 64, 64), config={"amx": True},
              out_dir=tmp_path, mcpu="skylake-avx512")


@pytest.mark.skipif(AMX_HOST, reason="checks the refusal on a CPU without AMX")
def test_loader_refuses_amx_artifact_without_amx(cross):
    import lcmac
    with pytest.raises(TargetError, match="amx_tile"):
        lcmac.load(cross["gemm"])
    with pytest.raises(TargetError, match="amx_tile|amx_bf16"):
        amx.request_amx()


@pytest.mark.skipif(AMX_HOST, reason="checks the refusal on a CPU without AMX")
@pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc not installed")
def test_c_api_refuses_amx_artifact_without_amx(cross, tmp_path):
    from lcmac.runtime import c_include_dir
    inc = c_include_dir()
    exe = tmp_path / "matmul"
    subprocess.run(["gcc", "-O2", "-std=gnu99", "-rdynamic", "-I", inc, "-o", str(exe),
                    str(ROOT / "examples" / "c" / "matmul.c"), os.path.join(inc, "..", "harness", "lcmac_c.c"),
                    "-ldl", "-lpthread", "-lm"], check=True)
    r = subprocess.run([str(exe), str(cross["gemm"]), "--dtype", "bf16"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and "LCMAC_ETARGET" in r.stderr and "amx_tile" in r.stderr, r.stderr


# ---- on a CPU with AMX -------------------------------------------------------------------
def _amx_artifacts(cross_or_none):
    found = _find_prebuilt("*.json")
    if found:
        return found
    if cross_or_none is None:
        pytest.skip("no artifacts: set LCMAC_AMX_ARTIFACTS or install apache-tvm")
    return list(cross_or_none.values())


@pytest.fixture
def amx_artifacts(request):
    if PREBUILT:
        return _amx_artifacts(None)
    return _amx_artifacts(request.getfixturevalue("cross"))


@amx_host
def test_amx_artifacts_match_float64(amx_artifacts):
    """Each AMX artifact against the float64 product of its bf16 inputs: within a few times
    torch's (or a plain fp32 product's) error; LCMAs round their combined operands once more."""
    torch = pytest.importorskip("torch")
    import lcmac
    for p in amx_artifacts:
        f = lcmac.load(p)
        m = f.manifest
        if m.dtype != "bfloat16" or m.extra.get("gemm_kernel") != "amx":
            continue
        g = torch.Generator().manual_seed(1)
        A = torch.randn(m.M, m.K, generator=g).bfloat16()
        B = torch.randn(m.K, m.N, generator=g).bfloat16()
        ref = A.double() @ B.double()
        C = f(A, B)
        err = float((C.double() - ref).norm() / ref.norm())
        # one bf16 rounding of C (2^-9) and, for an LCMA, of its combined operands: measured
        # on the AMX Xeon at 100x200x300, gemm 1.7e-3 (= torch's), strassen 4.7e-3,
        # strassen^2 9.5e-3, winograd^2 1.65e-2; a wrong layout gives errors near 1
        bound = 2.5e-3 if m.algorithm["name"] == "gemm" else 2.5e-2
        assert err < bound, (p.name, err)


@amx_host
def test_request_amx_is_granted():
    amx.request_amx()
    amx.request_amx()          # once per process; a second call is a no-op


def test_bf16_builds_for_an_amx_cpu_take_amx_by_default():
    """A bf16 build for an mcpu with AMX runs on AMX unless its config picks a kernel; other
    mcpus, dtypes and explicit choices keep theirs."""
    from lcmac.artifact.build import build_config
    from lcmac.ir import get
    t = T512
    one, two = get("strassen"), get("strassen^2")

    def cfg(mcpu, dtype="bfloat16", config=None, alg=one):
        return build_config(t, dtype, config, alg, False, (256, 256, 256), notes=[], mcpu=mcpu)
    c = cfg("sapphirerapids")
    assert c["amx"] and (c["mr"], c["nr"], c["mc"], c["kc"]) == (32, 32, 256, 1024)
    assert cfg("graniterapids", alg=two)["mc"] == 128          # stored H: smaller row blocks
    assert not cfg("skylake-avx512")["amx"] and not cfg(None)["amx"]
    assert not cfg("sapphirerapids", "float32")["amx"]
    assert not cfg("sapphirerapids", config={"bf16_dot": True})["amx"]
    assert cfg("sapphirerapids", config={"kc": 512})["kc"] == 512   # knobs given are kept
    assert not cfg("sapphirerapids", config={"mr": 8, "nr": 32})["amx"]   # a tile AMX cannot run
    assert cfg("native")["amx"] == AMX_HOST


def test_a_logged_fma_record_does_not_turn_amx_off(monkeypatch):
    """The tuner does not search amx: a bf16 record it logged (amx false) is for the FMA
    kernel, and a build for an AMX mcpu takes the AMX defaults instead."""
    from lcmac.artifact import build as build_mod
    from lcmac.ir import get
    logged = {**CpuConfig().to_dict(), "mr": 6, "nr": 32, "mc": 1008, "nc": 2048}
    monkeypatch.setattr(build_mod, "_tuned_config", lambda *a, **k: dict(logged))
    c = build_mod.build_config(T512, "bfloat16", None, get("strassen"), False, (256, 256, 256),
                               notes=[], mcpu="sapphirerapids")
    assert c["amx"] and (c["mr"], c["nr"]) == (32, 32)
    c = build_mod.build_config(T512, "bfloat16", None, get("strassen"), False, (256, 256, 256),
                               notes=[], mcpu="skylake-avx512")
    assert not c["amx"] and c["mc"] == 1008                   # elsewhere the record is used
