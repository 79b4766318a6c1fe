"""The C API (lcmac/runtime/include/lcmac.h, lcmac/runtime/harness/lcmac_c.c): artifacts built
by `lcmac build`, called from C programs compiled here with gcc — the example
examples/c/matmul.c, a program that exercises the API's checks and concurrent handles, and
the qemu harness lcmac_run built natively from its one file.  No Python or TVM in the
processes that run the artifacts."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from lcmac.spec.cpu.x86 import host_supports

ROOT = Path(__file__).resolve().parents[2]
GCC = shutil.which("gcc")
# the best x86 target this host runs (bf16 artifacts need AVX-512)
HOST_T = next((t for t in ("x86_64-avx512", "x86_64-avx2") if host_supports(t)), None)

pytestmark = [
    pytest.mark.skipif(GCC is None, reason="gcc not installed"),
    pytest.mark.skipif(HOST_T is None, reason="needs an AVX2 or AVX-512 x86-64 host to run the artifacts"),
]

CASES = {  # key: (algorithm, dtype, (M, N, K), bound on max|C - ref| / max|ref|)
    "strassen": ("strassen", "float32", (64, 48, 80), 1e-5),
    "gemm": ("gemm", "float32", (64, 48, 80), 1e-5),
    # whole column and k tiles: on AVX2 the default packs per cache block (cpu_gemm_blocked)
    "gemm-blocked": ("gemm", "float32", (64, 64, 80), 1e-5),
    "strassen2-f64": ("strassen^2", "float64", (45, 37, 50), 1e-12),
    # bf16 C: one rounding, 2^-9 of an element relative to the largest (~4e-3 at worst)
    "gemm-bf16": ("gemm", "bfloat16", (40, 33, 29), 1e-2),
}
if HOST_T != "x86_64-avx512":
    CASES.pop("gemm-bf16")
DT_ARG = {"float32": "f32", "float64": "f64", "bfloat16": "bf16"}


def _compile(out: Path, *sources, extra=("-rdynamic",)) -> Path:
    from lcmac.runtime import c_include_dir
    inc = c_include_dir()
    impl = os.path.join(inc, "..", "harness", "lcmac_c.c")
    cmd = [GCC, "-O2", "-std=gnu99", "-Wall", "-Werror", *extra, "-I", inc, "-o", str(out),
           *map(str, sources), impl, "-ldl", "-lpthread", "-lm"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, f"{' '.join(cmd)}\n{r.stderr}"
    return out


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    from lcmac.artifact.build import build_many
    root = tmp_path_factory.mktemp("c_api")
    keys = list(CASES)
    res = build_many([dict(algo=a, target=HOST_T, dtype=dt, shape=shp, out_dir=root, name=k,
                           config={"mc": 16, "nc": 32, "nr": 32, "kc": 16})
                      for k, (a, dt, shp, _) in CASES.items()])
    out = {}
    for k, r in zip(keys, res):
        if isinstance(r, Exception):
            raise r
        out[k] = r.with_suffix(".so")
    return out


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    return _compile(tmp_path_factory.mktemp("c_bin") / "matmul", ROOT / "examples" / "c" / "matmul.c")


def _run(cmd, **kw):
    env = {k: v for k, v in os.environ.items() if k not in ("LCMAC_NUM_THREADS", "TVM_NUM_THREADS")}
    return subprocess.run(list(map(str, cmd)), capture_output=True, text=True, timeout=120, env=env, **kw)


@pytest.mark.parametrize("key", list(CASES))
@pytest.mark.parametrize("threads", [1, 2])
def test_example_matmul(artifacts, example, key, threads):
    """examples/c/matmul.c: the artifact's C against a naive triple loop in double."""
    _, dt, (M, N, K), bound = CASES[key]
    r = _run([example, artifacts[key], M, N, K, "--dtype", DT_ARG[dt], "--threads", threads,
              "--repeat", 3])
    assert r.returncode == 0, r.stdout + r.stderr
    err = float(re.search(r"max_rel_error=(\S+)", r.stdout).group(1))
    assert err < bound, r.stdout
    assert f"{threads} threads" in r.stdout
    assert float(re.search(r"GFLOP/s=(\S+)", r.stdout).group(1)) > 0


@pytest.mark.parametrize("key", ["strassen", "gemm", "gemm-blocked", "strassen2-f64"])
def test_example_prepared_b(artifacts, example, key):
    """examples/c/matmul.c --prepared: B combined once gives the same C bit for bit."""
    if key == "gemm-blocked" and HOST_T == "x86_64-avx2":
        from lcmac.artifact.manifest import Manifest
        assert Manifest.read(artifacts[key].with_suffix(".json")).extra["packing"] == "blocked"
    r = _run([example, artifacts[key].with_suffix(".json"), "--prepared", "--repeat", 2])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "C identical to lcmac_matmul's" in r.stdout, r.stdout


PREPARED_CHECKS = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "lcmac.h"
#define CHECK(c) do { if (!(c)) { printf("FAILED line %d: %s\n", __LINE__, #c); return 1; } } while (0)
int main(int argc, char** argv) {
  (void)argc;
  char err[512];
  int st;
  lcmac_handle* h = lcmac_open_artifact(argv[1], 2, &st, err, sizeof err);
  CHECK(h != NULL);
  int64_t M, N, K, pb = lcmac_prepared_b_bytes(h);
  lcmac_shape(h, &M, &N, &K);
  CHECK(pb > 0);
  float *A = calloc(M * K, 4), *B = calloc(K * N, 4), *C = calloc(M * N, 4);
  void* P = NULL;
  CHECK(posix_memalign(&P, 64, (size_t)pb + 64) == 0);
  CHECK(lcmac_prepare_b(h, B, P, (size_t)pb - 1) == LCMAC_EINVAL && strstr(lcmac_last_error(h), "needs"));
  CHECK(lcmac_prepare_b(h, B, (char*)P + 4, (size_t)pb) == LCMAC_EINVAL
        && strstr(lcmac_last_error(h), "64-byte aligned"));
  CHECK(lcmac_prepare_b(h, NULL, P, (size_t)pb) == LCMAC_EINVAL && strstr(lcmac_last_error(h), "B is NULL"));
  CHECK(lcmac_prepare_b(h, B, P, (size_t)pb) == LCMAC_OK);
  CHECK(lcmac_matmul_prepared(h, A, P, C, M, N + 1, K, LCMAC_FLOAT32) == LCMAC_EINVAL
        && strstr(lcmac_last_error(h), "shape"));
  CHECK(lcmac_matmul_prepared(h, A, P, C, M, N, K, LCMAC_FLOAT64) == LCMAC_EINVAL
        && strstr(lcmac_last_error(h), "dtype"));
  CHECK(lcmac_matmul_prepared(h, A, P, P, M, N, K, LCMAC_FLOAT32) == LCMAC_EINVAL
        && strstr(lcmac_last_error(h), "overlaps P"));
  CHECK(lcmac_matmul_prepared(h, A, P, C, M, N, K, LCMAC_FLOAT32) == LCMAC_OK);
  CHECK(lcmac_matmul_prepared(NULL, A, P, C, M, N, K, LCMAC_FLOAT32) == LCMAC_EINVAL);
  lcmac_close(h);
  /* a bare library has no manifest, so nothing to prepare with */
  lcmac_handle* bare = lcmac_open(argv[2], "lcmac_matmul", 1, err, sizeof err);
  CHECK(bare != NULL && lcmac_prepared_b_bytes(bare) == -1);
  CHECK(lcmac_prepare_b(bare, B, P, (size_t)pb) == LCMAC_EINVAL
        && strstr(lcmac_last_error(bare), "lcmac_open_artifact"));
  lcmac_close(bare);
  free(A); free(B); free(C); free(P);
  printf("ALL OK\n");
  return 0;
}
"""


def test_prepared_b_checks(artifacts, tmp_path):
    """lcmac_prepare_b / lcmac_matmul_prepared refuse a short or unaligned P, NULL, a wrong
    shape or dtype, overlap, and a handle without a manifest, each with a message."""
    src = tmp_path / "prepared.c"
    src.write_text(PREPARED_CHECKS)
    exe = _compile(tmp_path / "prepared", src)
    r = _run([exe, artifacts["strassen"].with_suffix(".json"), artifacts["strassen"]])
    assert r.returncode == 0 and "ALL OK" in r.stdout, r.stdout + r.stderr


def test_example_reports_library_errors(artifacts, example, tmp_path):
    so = artifacts["strassen"]
    r = _run([example, so, 64, 48, 81])              # K is not the artifact's
    assert r.returncode == 2 and "LCMAC_EKERNEL" in r.stderr and "shape" in r.stderr, r.stderr
    r = _run([example, so, 64, 48, 80, "--dtype", "f64"])
    assert r.returncode == 2 and "dtype" in r.stderr, r.stderr
    r = _run([example, so, 64, 48, 80, "--entry", "nope"])
    assert r.returncode == 2 and "no entry point nope" in r.stderr, r.stderr
    r = _run([example, tmp_path / "missing.so", 1, 1, 1])
    assert r.returncode == 2 and "cannot load" in r.stderr, r.stderr
    # without -rdynamic the artifact could not resolve the error callback: said, not crashed
    bare = _compile(tmp_path / "bare", ROOT / "examples" / "c" / "matmul.c", extra=())
    r = _run([bare, so, 64, 48, 80])
    assert r.returncode == 2 and "-rdynamic" in r.stderr, r.stderr


API_CHECKS = r"""
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "lcmac.h"
#define CHECK(c) do { if (!(c)) { printf("FAILED line %d: %s\n", __LINE__, #c); return 1; } } while (0)
enum { M = 64, N = 48, K = 80 };
static const char* so;
static void* worker(void* arg) {          /* its own handle, concurrently with the others */
  (void)arg;
  float *A = malloc(sizeof(float) * M * K), *B = malloc(sizeof(float) * K * N), *C = malloc(sizeof(float) * M * N);
  for (int i = 0; i < M * K; ++i) A[i] = (float)((i * 7) % 11) - 5.0f;
  for (int i = 0; i < K * N; ++i) B[i] = (float)((i * 5) % 13) - 6.0f;
  char err[256];
  lcmac_handle* h = lcmac_open(so, "lcmac_matmul", 2, err, sizeof err);
  long bad = h ? 0 : 1;
  for (int rep = 0; h && rep < 20; ++rep) {
    if (lcmac_matmul(h, A, B, C, M, N, K, LCMAC_FLOAT32) != LCMAC_OK) { bad++; break; }
    for (int i = 0; i < M; i += 13)
      for (int j = 0; j < N; j += 7) {
        double s = 0;
        for (int k = 0; k < K; ++k) s += (double)A[i * K + k] * B[k * N + j];
        if (s != C[i * N + j]) bad++;      /* small integers: exact in float32 */
      }
  }
  lcmac_close(h);
  free(A); free(B); free(C);
  return (void*)bad;
}
int main(int argc, char** argv) {
  so = argv[1];
  char err[256];
  CHECK(lcmac_open(NULL, "lcmac_matmul", 1, err, sizeof err) == NULL && strstr(err, "NULL"));
  CHECK(lcmac_open(so, "", 1, err, sizeof err) == NULL);
  lcmac_handle* h = lcmac_open(so, "lcmac_matmul", 3, err, sizeof err);
  CHECK(h != NULL && lcmac_num_threads(h) == 3);
  /* room for the wrong shape below, which only the library can refuse */
  float *A = calloc(2 * M * K, sizeof(float)), *B = calloc(2 * K * N, sizeof(float)), *C = calloc(2 * M * N, sizeof(float));
  CHECK(lcmac_matmul(h, NULL, B, C, M, N, K, LCMAC_FLOAT32) == LCMAC_EINVAL);
  CHECK(strstr(lcmac_last_error(h), "A is NULL") != NULL);
  CHECK(lcmac_matmul(h, A, B, NULL, M, N, K, LCMAC_FLOAT32) == LCMAC_EINVAL);
  CHECK(lcmac_matmul(h, A, B, C, 0, N, K, LCMAC_FLOAT32) == LCMAC_EINVAL);
  CHECK(lcmac_matmul(h, A, B, C, M, N, K, 99) == LCMAC_EINVAL && strstr(lcmac_last_error(h), "dtype"));
  CHECK(lcmac_matmul(h, A, B, A + 8, M, N, K, LCMAC_FLOAT32) == LCMAC_EINVAL
        && strstr(lcmac_last_error(h), "overlaps A"));
  CHECK(lcmac_matmul(h, A, B, C, M, N + 1, K, LCMAC_FLOAT32) == LCMAC_EKERNEL
        && strstr(lcmac_last_error(h), "shape"));
  CHECK(lcmac_matmul(h, A, B, C, M, N, K, LCMAC_FLOAT32) == LCMAC_OK && lcmac_last_error(h)[0] == 0);
  CHECK(lcmac_matmul(NULL, A, B, C, M, N, K, LCMAC_FLOAT32) == LCMAC_EINVAL
        && strstr(lcmac_last_error(NULL), "NULL"));
  CHECK(strcmp(lcmac_status_name(LCMAC_EKERNEL), "LCMAC_EKERNEL") == 0);
  lcmac_close(h);
  lcmac_close(NULL);
  free(A); free(B); free(C);
  pthread_t th[3];
  for (int i = 0; i < 3; ++i) pthread_create(&th[i], NULL, worker, NULL);
  long bad = 0;
  for (int i = 0; i < 3; ++i) { void* r; pthread_join(th[i], &r); bad += (long)r; }
  CHECK(bad == 0);
  printf("ALL OK\n");
  return 0;
}
"""


def test_api_checks_and_concurrent_handles(artifacts, tmp_path):
    """NULL pointers, sizes, dtype codes, overlap and a wrong shape are errors with messages;
    three threads with a handle each (2 pool threads apiece) on one library agree with the
    exact result."""
    src = tmp_path / "checks.c"
    src.write_text(API_CHECKS)
    exe = _compile(tmp_path / "checks", src)
    r = _run([exe, artifacts["strassen"]])
    assert r.returncode == 0 and "ALL OK" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("guard", [None, "after", "before"])
def test_qemu_harness_shares_the_implementation(artifacts, tmp_path, guard):
    """lcmac_run.c (the AArch64 harness) builds from its one file on top of lcmac_c.c and
    runs an x86 artifact natively, with guard pages too; its command line is unchanged."""
    harness = ROOT / "lcmac" / "runtime" / "harness" / "lcmac_run.c"
    exe = tmp_path / "lcmac_run"
    r = subprocess.run([GCC, "-O2", "-std=gnu99", "-rdynamic", "-o", str(exe), str(harness),
                        "-ldl", "-lpthread"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    M, N, K = CASES["strassen"][2]
    rng = np.random.default_rng(5)
    A = rng.standard_normal((M, K)).astype(np.float32)
    B = rng.standard_normal((K, N)).astype(np.float32)
    A.tofile(tmp_path / "a")
    B.tofile(tmp_path / "b")
    env = {"LCMAC_NUM_THREADS": "2", "LCMAC_GUARD_PAGES": guard or "0"}
    r = subprocess.run([str(exe), str(artifacts["strassen"]), "lcmac_matmul", "--repeat", "2",
                        f"in:f32:{M}x{K}:{tmp_path / 'a'}", f"in:f32:{K}x{N}:{tmp_path / 'b'}",
                        f"out:f32:{M}x{N}:{tmp_path / 'c'}"], capture_output=True, text=True,
                       env={**os.environ, **env}, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "seconds_per_call=" in r.stdout
    C = np.fromfile(tmp_path / "c", np.float32).reshape(M, N)
    ref = A.astype(np.float64) @ B
    assert np.abs(C - ref).max() / np.abs(ref).max() < 1e-5
    bad = subprocess.run([str(exe), str(artifacts["strassen"]), "lcmac_matmul",
                          f"in:f32:{M}x{K + 1}:{tmp_path / 'a'}", f"in:f32:{K}x{N}:{tmp_path / 'b'}",
                          f"out:f32:{M}x{N}:{tmp_path / 'c'}"], capture_output=True, text=True)
    assert bad.returncode in (1, 2)     # 1: the input file is too short to read


def test_header_is_packaged():
    """pyproject ships the header and the implementation with the package."""
    from lcmac.runtime import c_include_dir
    inc = Path(c_include_dir())
    assert (inc / "lcmac.h").is_file() and (inc / ".." / "harness" / "lcmac_c.c").is_file()
    text = (ROOT / "pyproject.toml").read_text()
    assert '"include/*.h"' in text and '"harness/*.c"' in text
