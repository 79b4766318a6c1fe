"""CUDA artifacts and bundles from C (lcmac_cuda.c): a bf16 rows bundle exported for sm_90a,
examples/cuda/matmul_cuda.c built with nvcc for sm_90a, the CMake package.

Without a GPU (CI) everything up to loading is exercised: a truncated, byte-flipped or foreign
library, a bundle for the CPU, an any-shape CUDA rule, each refused with a status and a message
and never a signal; and the good bundle refused cleanly for want of a driver.  With one (the
device run) the example runs the bundle and its C is judged against torch.matmul's (cuBLAS)
error from a float64 reference; the prepared-B path gives the same C bit for bit; a missing
device, a foreign arch and bad pointers are refused before launch; a bundle call with padded
rows replays from a CUDA graph."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests.runtime.test_c_integrity import GCC, HOST, ROOT, SIGNALLED, _compile, _refused, _run
from tests.schedules.cuda.test_cuda_codegen import needs_tilelang

NVCC = shutil.which("nvcc")
N = K = 256                   # the bundle's weight: ?x256x256, one row bucket of 256
STRASSEN_BOUND = 6.0          # Strassen's bf16 error is ~3.5x the plain GEMM's (docs/accuracy.md)

pytestmark = [
    pytest.mark.skipif(NVCC is None, reason="nvcc (CUDA toolkit) is not installed"),
    pytest.mark.skipif(HOST != "x86", reason="CUDA artifacts are built for x86-64 hosts"),
    needs_tilelang,     # asked in a subprocess: TileLang and apache-tvm share no process
]


def _gpu() -> bool:
    try:
        import torch
        return torch.cuda.is_available()
    except ImportError:
        return False


GPU = _gpu()
needs_gpu = pytest.mark.skipif(not GPU, reason="needs a CUDA GPU")


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    """`lcmac export ?x256x256 --target cuda-sm90a --dtype bfloat16 --algo strassen --rows 256`."""
    from lcmac.api.export import export
    out = tmp_path_factory.mktemp("cuda_bundle")
    return export(["?x256x256"], "cuda-sm90a", "bfloat16", out, rows=(256,), algo="strassen").parent


@pytest.fixture(scope="module")
def example(tmp_path_factory) -> Path:
    """examples/cuda built by its Makefile with nvcc for sm_90a."""
    d = tmp_path_factory.mktemp("cuda_example")
    shutil.copy(ROOT / "examples" / "cuda" / "matmul_cuda.c", d)
    shutil.copy(ROOT / "examples" / "cuda" / "Makefile", d)
    r = subprocess.run(["make", "-C", str(d), f"LCMAC_INC={ROOT / 'lcmac' / 'runtime' / 'include'}"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "-arch=sm_90a" in r.stdout
    return d / "matmul_cuda"


def _kernel_manifest(bundle: Path) -> Path:
    return bundle / json.loads((bundle / "bundle.json").read_text())["kernels"][0]["manifest"]


def _copy(bundle: Path, dst: Path, edit_index=None) -> Path:
    out = dst / "bundle"
    shutil.copytree(bundle, out)
    if edit_index:
        idx = json.loads((out / "bundle.json").read_text())
        edit_index(idx)
        (out / "bundle.json").write_text(json.dumps(idx))
    return out


# ---- without a GPU as well -------------------------------------------------------------------

def test_good_bundle_runs_or_is_refused_for_want_of_a_gpu(bundle, example):
    r = _run([example, bundle, 300, N, K, "--repeat", 0])
    if GPU:
        assert r.returncode == 0, r.stdout + r.stderr
        assert "rule rows:?x256x256" in r.stdout and "300x256x256 bfloat16" in r.stdout
    else:   # CI: every file check passed, then the driver is missing
        _refused(r, "LCMAC_ETARGET", "lcmac_open_cuda_bundle", "CUDA")


def test_damaged_libraries_are_refused_before_loading(bundle, example, tmp_path):
    lib = next(bundle.glob("*.so")).name
    for name, damage in (("truncated", lambda b: b[: len(b) // 2]),
                         ("flipped", lambda b: b[:4096] + bytes([b[4096] ^ 0xFF]) + b[4097:])):
        d = _copy(bundle, tmp_path / name)
        (d / lib).write_bytes(damage((bundle / lib).read_bytes()))
        _refused(_run([example, d, 300, N, K]), "LCMAC_ECORRUPT", lib)


def test_foreign_bundles_and_artifacts_are_refused(bundle, example, tmp_path):
    def cpu_index(idx):
        idx["target"] = {"name": "x86_64-avx512", "family": "x86", "backend": "tvm"}
    _refused(_run([example, _copy(bundle, tmp_path / "cpu", cpu_index), 300, N, K]),
             "LCMAC_ETARGET", "x86-64 code, not CUDA code", "lcmac_open_bundle")

    def any_rule(idx):
        idx["rules"][0].update(rule="any:?x?x?", tile=[N, K])
    _refused(_run([example, _copy(bundle, tmp_path / "any", any_rule), 300, 500, 700]),
             "LCMAC_ETARGET", "any:?x?x?", "lcmac export")

    # a CPU artifact's manifest over the CUDA library: the target says so before anything loads
    man = json.loads(_kernel_manifest(bundle).read_text())
    man["target"] = {"name": "x86_64-avx512", "family": "x86", "backend": "tvm",
                     "dict": {"kind": "llvm"}}
    man["backend"] = "tvm"
    shutil.copy(_kernel_manifest(bundle).with_suffix(".so"), tmp_path)
    (tmp_path / "cpu.json").write_text(json.dumps(man))
    _refused(_run([example, tmp_path / "cpu.json"]), "LCMAC_ETARGET", "not CUDA code")


@pytest.mark.skipif(GCC is None, reason="gcc not installed")
def test_cpu_api_points_cuda_files_to_the_cuda_functions(bundle, tmp_path):
    cpu_example = _compile(tmp_path / "matmul", ROOT / "examples" / "c" / "matmul.c")
    _refused(_run([cpu_example, bundle, 300, N, K]), "LCMAC_ETARGET", "lcmac_open_cuda_bundle")
    _refused(_run([cpu_example, _kernel_manifest(bundle)]), "LCMAC_ETARGET",
             "lcmac_open_cuda_artifact")


@pytest.mark.skipif(shutil.which("cmake") is None or GCC is None, reason="cmake or gcc missing")
def test_cmake_package_builds_a_cpp_program(tmp_path):
    """find_package(lcmac) from `lcmac capi --cmake-dir` in a C++-only project."""
    from lcmac.runtime import c_cmake_dir
    (tmp_path / "app.cpp").write_text(
        '#include "lcmac.h"\n#include <cstdio>\n'
        "int main() { char err[256]; int st = 0;\n"
        '  lcmac_bundle* b = lcmac_open_bundle("no-such-dir", 1, &st, err, sizeof err);\n'
        '  std::printf("api %d %s %s\\n", LCMAC_API_VERSION, lcmac_status_name(st), err);\n'
        "  return b ? 1 : 0; }\n")
    (tmp_path / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.16)\nproject(app CXX)\n"
        f'find_package(lcmac CONFIG REQUIRED PATHS "{c_cmake_dir()}" NO_DEFAULT_PATH)\n'
        'message(STATUS "lcmac C API version ${LCMAC_API_VERSION}")\n'
        "add_executable(app app.cpp)\ntarget_link_libraries(app PRIVATE lcmac::runtime)\n")
    build = tmp_path / "build"
    for cmd in (["cmake", "-S", tmp_path, "-B", build], ["cmake", "--build", build]):
        r = subprocess.run(list(map(str, cmd)), capture_output=True, text=True)
        assert r.returncode == 0, r.stdout + r.stderr
    r = _run([build / "app"])
    api = re.search(r"#define LCMAC_API_VERSION (\d+)",
                    (ROOT / "lcmac" / "runtime" / "include" / "lcmac.h").read_text()).group(1)
    assert r.returncode == 0 and f"api {api} LCMAC_EIO" in r.stdout, r.stdout + r.stderr


# ---- on the GPU ------------------------------------------------------------------------------

def _bf16(path: Path, rows: int, cols: int):
    import torch
    raw = np.fromfile(path, dtype=np.uint16).astype(np.int32)
    return torch.from_numpy(raw.reshape(rows, cols)).to(torch.int16).view(torch.bfloat16).cuda()


@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("M", [256, 300, 1000])
def test_bundle_matches_cublas_within_the_error_model(bundle, example, tmp_path, M):
    import torch
    r = _run([example, bundle, M, N, K, "--repeat", 5, "--save", tmp_path / "run"])
    assert r.returncode == 0, r.stdout + r.stderr
    A, B, C = (_bf16(tmp_path / f"run.{x}", *s) for x, s in (("A", (M, K)), ("B", (K, N)),
                                                             ("C", (M, N))))
    ref = A.double() @ B.double()
    err = ((C.double() - ref).norm() / ref.norm()).item()
    base = (((A @ B).double() - ref).norm() / ref.norm()).item()     # cuBLAS
    assert err < STRASSEN_BOUND * base, (err, base, r.stdout)


@needs_gpu
@pytest.mark.gpu
def test_artifact_prepared_b_gives_the_same_c(bundle, example):
    r = _run([example, _kernel_manifest(bundle), "--prepared", "--repeat", 0])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "identical to the unprepared call" in r.stdout


@needs_gpu
@pytest.mark.gpu
def test_missing_device_and_foreign_arch_are_refused(bundle, example, tmp_path):
    _refused(_run([example, bundle, 300, N, K, "--device", 64]), "LCMAC_ETARGET",
             "no CUDA device 64")
    _refused(_run([example, bundle, 300, N, K, "--device", -1]), "LCMAC_EINVAL", "device -1")
    man = json.loads(_kernel_manifest(bundle).read_text())
    man["target"]["dict"]["arch"] = "sm_80"           # the library unchanged: its hash holds
    shutil.copy(_kernel_manifest(bundle).with_suffix(".so"), tmp_path)
    (tmp_path / "sm80.json").write_text(json.dumps(man))
    _refused(_run([example, tmp_path / "sm80.json"]), "LCMAC_ETARGET", "sm_80",
             "compute capability")


@needs_gpu
@pytest.mark.gpu
def test_bad_pointers_are_refused_and_graph_capture_replays(bundle, tmp_path):
    prog = tmp_path / "cuda_misuse"
    inc = ROOT / "lcmac" / "runtime" / "include"
    cmd = [NVCC, "-O2", "-arch=sm_90a", "-I", str(inc), "-o", str(prog),
           str(ROOT / "tests" / "runtime" / "cuda_misuse.c"),
           str(ROOT / "lcmac" / "runtime" / "harness" / "lcmac_c.c"), "-ldl", "-lpthread"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    r = _run([prog, _kernel_manifest(bundle), bundle, 300])
    assert r.returncode == 0 and r.returncode not in SIGNALLED, r.stdout + r.stderr
    cases = dict(re.findall(r"case=(\w+) (status=\w+ msg=.*)", r.stdout))
    expect = {"host_A": ("LCMAC_EINVAL", "not CUDA memory"),
              "short_C": ("LCMAC_EINVAL", "C needs"),
              "misaligned_A": ("LCMAC_EINVAL", "16-byte aligned"),
              "wrong_shape": ("LCMAC_EINVAL", "is not the artifact's"),
              "wrong_dtype": ("LCMAC_EINVAL", "float32 is not the artifact's bfloat16"),
              "cpu_call": ("LCMAC_EINVAL", "lcmac_cuda_matmul"),
              "small_workspace": ("LCMAC_EINVAL", "workspace has 256 bytes"),
              "overlap": ("LCMAC_EINVAL", "overlaps"),
              "bundle_no_rule": ("LCMAC_EINVAL", "no rule"),
              "bundle_cpu_call": ("LCMAC_EINVAL", "lcmac_bundle_cuda_matmul"),
              "default_stream": ("LCMAC_OK", ""),
              "own_workspace": ("LCMAC_OK", "identical"),
              "graph": ("LCMAC_OK", "identical")}
    for name, (status, words) in expect.items():
        assert name in cases, r.stdout
        assert cases[name].startswith(f"status={status} ") and words in cases[name], (name, cases[name])
