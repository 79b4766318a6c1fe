"""Opening an artifact from C by its manifest (lcmac_open_artifact in lcmac/runtime/harness):
what is checked before the library is loaded — the manifest's format, the target and CPU
features, the library's size, SHA-256 and ELF headers — turns a damaged or foreign artifact
into an exit status and a message, never a signal.  Also the pieces those checks rest on:
SHA-256 against known answers and hashlib, the strict JSON reader on malformed input (under
AddressSanitizer where gcc has it), and lcmac_matmul refusing another shape than the
manifest's before the library is called."""
from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
HARNESS = ROOT / "lcmac" / "runtime" / "harness"
GCC = shutil.which("gcc")
HOST = {"x86_64": "x86", "AMD64": "x86", "aarch64": "aarch64", "arm64": "aarch64"}.get(platform.machine())
SHAPE = (64, 48, 40)                     # M, N, K
SIGNALLED = (134, 135, 139)              # a shell's 128 + SIGABRT, SIGBUS, SIGSEGV

pytestmark = [
    pytest.mark.skipif(GCC is None, reason="gcc not installed"),
    pytest.mark.skipif(HOST is None, reason="the C API runs artifacts on x86-64 and AArch64 hosts"),
]


def _compile(out: Path, source: Path, extra=("-rdynamic",), whitebox=False, cc=None) -> Path:
    """A program on the C API; a white-box one #includes lcmac_c.c itself (as lcmac_run.c)."""
    inc = ROOT / "lcmac" / "runtime" / "include"
    impl = [] if whitebox else [str(HARNESS / "lcmac_c.c")]
    cmd = [cc or GCC, "-O2", "-std=gnu99", "-Wall", "-Werror", *extra, "-I", str(inc),
           "-I", str(HARNESS), "-o", str(out), str(source), *impl, "-ldl", "-lpthread", "-lm"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, f"{' '.join(cmd)}\n{r.stderr}"
    return out


def _program(tmp: Path, name: str, text: str, **kw) -> Path:
    src = tmp / f"{name}.c"
    src.write_text(text)
    return _compile(tmp / name, src, **kw)


def _run(cmd, prefix=(), **kw):
    env = {k: v for k, v in os.environ.items() if k not in ("LCMAC_NUM_THREADS", "TVM_NUM_THREADS")}
    return subprocess.run([*prefix, *map(str, cmd)], capture_output=True, text=True, timeout=300,
                          env=env, **kw)


def _refused(r, status: str, *words: str) -> None:
    """An error exit with a message: not a signal, the status named, the problem named."""
    assert r.returncode >= 0 and r.returncode not in SIGNALLED, f"killed: {r.returncode}\n{r.stderr}"
    assert r.returncode == 2, r.stdout + r.stderr
    assert status in r.stderr, r.stderr
    for w in words:
        assert w in r.stderr, r.stderr


@pytest.fixture(scope="module")
def artifact(tmp_path_factory) -> Path:
    """One small float32 artifact for this machine: its manifest."""
    import lcmac
    return lcmac.build("strassen", None, "float32", SHAPE, out_dir=tmp_path_factory.mktemp("integrity"))


@pytest.fixture(scope="module")
def example(tmp_path_factory) -> Path:
    return _compile(tmp_path_factory.mktemp("c_bin") / "matmul", ROOT / "examples" / "c" / "matmul.c")


def _variant(manifest: Path, dst: Path, name: str, so=None, edit=None, text=None) -> Path:
    """A copy of the artifact as dst/<name>.json + .so: the library's bytes replaced by so, the
    manifest edited (a function of its dict) or replaced by text."""
    man = json.loads(manifest.read_text())
    lib = manifest.with_name(man["library"]["file"]).read_bytes()
    man["library"]["file"] = f"{name}.so"
    (dst / f"{name}.so").write_bytes(lib if so is None else so(lib))
    if edit:
        edit(man)
    out = dst / f"{name}.json"
    out.write_text(text(json.dumps(man, indent=2)) if text else json.dumps(man, indent=2))
    return out


# ---- the good artifact -------------------------------------------------------------------

#: what the small C test programs start with: the header and a whole-file reader
C_PRELUDE = r"""
#include <stdio.h>
#include <stdlib.h>
#include "lcmac.h"
static void* slurp(const char* path, size_t n) {
  void* p = malloc(n);
  FILE* f = fopen(path, "rb");
  if (!p || !f || fread(p, 1, n, f) != n) { fprintf(stderr, "cannot read %s\n", path); exit(1); }
  fclose(f);
  return p;
}
"""

RUN_SRC = C_PRELUDE + r"""
/* run ARTIFACT.json A B C: C = A·B (raw float32 files) through a manifest-checked handle */
int main(int argc, char** argv) {
  if (argc != 5) return 1;
  char err[1024];
  int status = -1;
  lcmac_handle* h = lcmac_open_artifact(argv[1], 2, &status, err, sizeof err);
  if (!h) { fprintf(stderr, "%s: %s\n", lcmac_status_name(status), err); return 2; }
  int64_t M, N, K;
  if (status != LCMAC_OK || lcmac_shape(h, &M, &N, &K) != LCMAC_OK) return 3;
  printf("shape %lldx%lldx%lld dtype %d\n", (long long)M, (long long)N, (long long)K, lcmac_dtype_of(h));
  float* A = slurp(argv[2], sizeof(float) * M * K);
  float* B = slurp(argv[3], sizeof(float) * K * N);
  float* C = malloc(sizeof(float) * M * N);
  int rc = lcmac_matmul(h, A, B, C, M, N, K, LCMAC_FLOAT32);
  if (rc) { fprintf(stderr, "%s: %s\n", lcmac_status_name(rc), lcmac_last_error(h)); return 2; }
  FILE* f = fopen(argv[4], "wb");
  fwrite(C, sizeof(float), (size_t)(M * N), f);
  fclose(f);
  lcmac_close(h);
  return 0;
}
"""


def test_good_artifact_matches_numpy(artifact, example, tmp_path):
    M, N, K = SHAPE
    rng = np.random.default_rng(11)
    A = rng.standard_normal((M, K)).astype(np.float32)
    B = rng.standard_normal((K, N)).astype(np.float32)
    A.tofile(tmp_path / "a")
    B.tofile(tmp_path / "b")
    exe = _program(tmp_path, "run", RUN_SRC)
    r = _run([exe, artifact, tmp_path / "a", tmp_path / "b", tmp_path / "c"])
    assert r.returncode == 0, r.stderr
    assert f"shape {M}x{N}x{K} dtype 0" in r.stdout          # LCMAC_FLOAT32
    C = np.fromfile(tmp_path / "c", np.float32).reshape(M, N)
    ref = A.astype(np.float64) @ B.astype(np.float64)
    assert np.abs(C - ref).max() / np.abs(ref).max() < 1e-5
    # the example on the manifest alone: shape and dtype come from it
    r = _run([example, artifact, "--repeat", 2])
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"{M}x{N}x{K} float32" in r.stdout and "checked against its manifest" in r.stdout


# ---- damaged and foreign artifacts: an exit status and a message, never a signal ---------

OTHER = {"x86": ("aarch64", "aarch64-neon", "AArch64"), "aarch64": ("x86", "x86_64-avx512", "x86-64")}


def _flip_middle(b: bytes) -> bytes:
    x = bytearray(b)
    x[len(x) // 2] ^= 0xFF
    return bytes(x)


def _other_target(m):
    fam, name, _ = OTHER[HOST]
    m["target"].update(family=fam, name=name)


DAMAGED = {  # name: (variant keywords, status, words the message must hold)
    "truncated": (dict(so=lambda b: b[: len(b) // 2]), "LCMAC_ECORRUPT", ["truncated"]),
    "byte-flipped": (dict(so=_flip_middle), "LCMAC_ECORRUPT", ["SHA-256"]),
    "format-99": (dict(edit=lambda m: m.update(format="lcmac-artifact/99")), "LCMAC_EFORMAT",
                  ["lcmac-artifact/99", "another lcmac version"]),
    "other-target": (dict(edit=_other_target), "LCMAC_ETARGET", [OTHER[HOST][2], OTHER[HOST][1]]),
    "missing-cpu-flag": (dict(edit=lambda m: m["extra"].setdefault("cpu_flags", []).append("lcmac_no_such_flag")),
                         "LCMAC_ETARGET", ["lcmac_no_such_flag"]),
    "bad-cpu-flags": (dict(edit=lambda m: m["extra"].update(cpu_flags=["avx2", 7])), "LCMAC_EFORMAT",
                      ["extra.cpu_flags"]),
    "control-character": (dict(edit=lambda m: m["entry_points"][0].update(name="lcmac\x1bmatmul")),
                          "LCMAC_EFORMAT", ["entry_points[0].name", "control character"]),
    "not-lcmac": (dict(edit=lambda m: m.update(format="something/1")), "LCMAC_EFORMAT",
                  ["something/1", "not an lcmac artifact"]),
    "malformed-json": (dict(text=lambda t: t[: len(t) // 2]), "LCMAC_EFORMAT", ["malformed JSON at byte"]),
    "duplicate-key": (dict(text=lambda t: t.replace('"dtype": "float32"', '"dtype": "float32", "dtype": "float64"')),
                      "LCMAC_EFORMAT", ['"dtype" occurs twice']),
    "zero-shape": (dict(edit=lambda m: m["shape"].update(M=0)), "LCMAC_EFORMAT", ["shape.M"]),
    "bad-sha256-field": (dict(edit=lambda m: m["library"].update(sha256=m["library"]["sha256"].upper())),
                         "LCMAC_EFORMAT", ["library.sha256"]),
    "gpu-artifact": (dict(edit=lambda m: m.update(backend="tilelang") or m["target"].update(family="cuda")),
                     "LCMAC_ETARGET", ["CUDA"]),
}


@pytest.mark.parametrize("case", list(DAMAGED))
def test_damaged_artifact_is_refused(artifact, example, tmp_path, case):
    kw, status, words = DAMAGED[case]
    if case in ("missing-cpu-flag", "bad-cpu-flags") and HOST != "x86":
        pytest.skip("extra.cpu_flags are x86 flags")
    r = _run([example, _variant(artifact, tmp_path, case, **kw)])
    _refused(r, status, *words)


def test_missing_files_are_refused(artifact, example, tmp_path):
    man = _variant(artifact, tmp_path, "nolib")
    (tmp_path / "nolib.so").unlink()
    _refused(_run([example, man]), "LCMAC_EIO", "nolib.so", "No such file", "library.file")
    _refused(_run([example, tmp_path / "absent.json"]), "LCMAC_EIO", "absent.json")
    shutil.copy(artifact.with_suffix(".so"), tmp_path / "lib-as-manifest.json")
    _refused(_run([example, tmp_path / "lib-as-manifest.json"]), "LCMAC_EFORMAT", "shared library")


def test_bare_library_gets_the_elf_check(artifact, example, tmp_path):
    """lcmac_open on a bare .so: a truncated library or a file that is no ELF is an error,
    not SIGBUS (a damaged library with intact headers needs the manifest's SHA-256)."""
    M, N, K = SHAPE
    lib = artifact.with_suffix(".so").read_bytes()
    for name, data, word in [("half.so", lib[: len(lib) // 2], "truncated"),
                             ("headers-only.so", lib[:200], "truncated"),
                             ("tiny.so", lib[:10], "too short"),
                             ("text.so", b"not a library\n" * 10, "not an ELF file")]:
        (tmp_path / name).write_bytes(data)
        r = _run([example, tmp_path / name, M, N, K])
        assert r.returncode == 2 and word in r.stderr, (name, r.returncode, r.stderr)


# ---- lcmac_matmul against the manifest's shape ------------------------------------------

SHAPE_SRC = r"""
#include "lcmac_c.c"
#define CHECK(c) do { if (!(c)) { printf("FAILED line %d: %s\n", __LINE__, #c); return 1; } } while (0)
static int calls;
static int stub(void* self, const TVMFFIAny* args, int32_t n, TVMFFIAny* res) {
  (void)self; (void)args; (void)n; (void)res;
  calls++;
  return 0;
}
int main(int argc, char** argv) {
  (void)argc;
  char err[1024];
  int st = -1;
  int64_t M, N, K;
  lcmac_handle* h = lcmac_open_artifact(argv[1], 1, &st, err, sizeof err);
  CHECK(h != NULL && st == LCMAC_OK && err[0] == 0);
  CHECK(lcmac_shape(h, &M, &N, &K) == LCMAC_OK && M == 64 && N == 48 && K == 40);
  CHECK(lcmac_dtype_of(h) == LCMAC_FLOAT32);
  h->fn = stub;   /* counts the calls that reach the library */
  size_t room = 4 * 64 * 64;   /* fits every shape tried: no overlap refuses them */
  float *A = calloc(room, 4), *B = calloc(room, 4), *C = calloc(room, 4);
  CHECK(lcmac_matmul(h, A, B, C, M, N, K + 1, LCMAC_FLOAT32) == LCMAC_EINVAL && calls == 0);
  CHECK(strstr(lcmac_last_error(h), "K=41") && strstr(lcmac_last_error(h), "K=40"));
  CHECK(lcmac_matmul(h, A, B, C, N, M, K, LCMAC_FLOAT32) == LCMAC_EINVAL && calls == 0);
  CHECK(strstr(lcmac_last_error(h), "M=48 N=64") && strstr(lcmac_last_error(h), "M=64 N=48"));
  CHECK(lcmac_matmul(h, A, B, C, M, N, K, LCMAC_FLOAT64) == LCMAC_EINVAL && calls == 0);
  CHECK(strstr(lcmac_last_error(h), "float64") && strstr(lcmac_last_error(h), "float32"));
  CHECK(lcmac_matmul(h, A, B, C, M, N, K, LCMAC_FLOAT32) == LCMAC_OK && calls == 1);
  lcmac_close(h);
  h = lcmac_open(argv[2], "lcmac_matmul", 1, err, sizeof err);   /* no manifest: shape unknown */
  CHECK(h != NULL && lcmac_shape(h, &M, &N, &K) == LCMAC_EINVAL && M == 0 && K == 0);
  CHECK(lcmac_dtype_of(h) == -1);
  lcmac_close(h);
  CHECK(lcmac_shape(NULL, NULL, NULL, NULL) == LCMAC_EINVAL && lcmac_dtype_of(NULL) == -1);
  CHECK(lcmac_open_artifact(NULL, 1, &st, err, sizeof err) == NULL && st == LCMAC_EINVAL);
  CHECK(lcmac_open_artifact("/nonexistent/x.json", 1, NULL, NULL, 0) == NULL);
  CHECK(lcmac_open_artifact("/nonexistent/x.json", 1, &st, err, 8) == NULL && st == LCMAC_EIO
        && strlen(err) == 7);
  const int codes[] = {LCMAC_EFORMAT, LCMAC_ETARGET, LCMAC_ECORRUPT, LCMAC_EIO, LCMAC_ELOAD};
  for (int i = 0; i < 5; ++i)
    CHECK(!strncmp(lcmac_status_name(codes[i]), "LCMAC_E", 7) && codes[i] == 3 + i);
  CHECK(LCMAC_OK == 0 && LCMAC_EINVAL == 1 && LCMAC_EKERNEL == 2);
  free(A); free(B); free(C);
  printf("ALL OK\n");
  return 0;
}
"""


def test_wrong_shape_is_refused_before_the_library(artifact, tmp_path):
    """On a manifest-opened handle another shape or dtype is LCMAC_EINVAL naming both, and
    the library's function (replaced by a counting stub) is never reached."""
    exe = _program(tmp_path, "shape", SHAPE_SRC, whitebox=True)
    r = _run([exe, artifact, artifact.with_suffix(".so")])
    assert r.returncode == 0 and "ALL OK" in r.stdout, r.stdout + r.stderr


# ---- SHA-256 ----------------------------------------------------------------------------

SHA_SRC = r"""
#include "lcmac_c.c"
static unsigned char buf[1000000];
int main(int argc, char** argv) {
  char hex[65];
  if (argc == 3) {   /* file PATH: the digest the open check computes */
    int fd = open(argv[2], O_RDONLY);
    if (fd < 0 || sha256_fd(fd, hex)) return 1;
    printf("%s\n", hex);
    return 0;
  }
  lcmac_sha256_hex("", 0, hex); printf("empty %s\n", hex);
  lcmac_sha256_hex("abc", 3, hex); printf("abc %s\n", hex);
  const char* s448 = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  lcmac_sha256_hex(s448, strlen(s448), hex); printf("448 %s\n", hex);
  memset(buf, 'a', sizeof buf);
  lcmac_sha256_hex(buf, sizeof buf, hex); printf("million %s\n", hex);
  for (int i = 0; i < 1000; ++i) buf[i] = (unsigned char)(7 * i + 3);
  for (int n = 0; n <= 200; ++n) { lcmac_sha256_hex(buf, (size_t)n, hex); printf("pattern%d %s\n", n, hex); }
  Sha256 s;   /* in uneven pieces */
  sha256_init(&s);
  for (size_t off = 0, k = 1; off < 1000; off += k, k = k % 70 + 1)
    sha256_update(&s, buf + off, off + k > 1000 ? 1000 - off : k);
  sha256_final_hex(&s, hex); printf("pieces %s\n", hex);
  printf("null %d %d\n", lcmac_sha256_hex(NULL, 1, hex), lcmac_sha256_hex("", 0, NULL));
  return 0;
}
"""


def test_sha256_known_answers(tmp_path):
    exe = _program(tmp_path, "sha", SHA_SRC, whitebox=True)
    r = _run([exe])
    assert r.returncode == 0, r.stderr
    got = dict(line.split(" ", 1) for line in r.stdout.splitlines())
    # FIPS 180-4 examples (and the long message of its test vectors)
    assert got["empty"] == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    assert got["abc"] == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    assert got["448"] == "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"
    assert got["million"] == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"
    pattern = bytes((7 * i + 3) % 256 for i in range(1000))
    for n in range(201):    # every padding case: lengths around 55, 56, 64, 119, 120, 128
        assert got[f"pattern{n}"] == hashlib.sha256(pattern[:n]).hexdigest(), n
    assert got["pieces"] == hashlib.sha256(pattern).hexdigest()
    assert got["null"] == "1 1"     # LCMAC_EINVAL
    data = np.random.default_rng(3).integers(0, 256, 700_001, dtype=np.uint8).tobytes()
    (tmp_path / "blob").write_bytes(data)           # several of the file reader's chunks
    r = _run([exe, "file", tmp_path / "blob"])
    assert r.returncode == 0 and r.stdout.strip() == hashlib.sha256(data).hexdigest()


# ---- the JSON reader ----------------------------------------------------------------------

JSON_SRC = r"""
#include "lcmac_c.c"
/* parse FILE...: per file "ok" (a string root: and its decoded bytes in hex) or "error MSG".
 * sweep MANIFEST: every proper prefix, then seeded mutations, each parsed from a buffer of
 * exactly its size (AddressSanitizer sees any read past it); what parses goes through the
 * manifest checks too.  bsweep INDEX: the same for a bundle index and the index checks. */
static char* copy_of(const char* s, size_t n) {
  char* c = (char*)malloc(n ? n : 1);
  if (n) memcpy(c, s, n);
  return c;
}
int main(int argc, char** argv) {
  if (argc >= 2 && !strcmp(argv[1], "parse")) {
    for (int i = 2; i < argc; ++i) {
      char *text, out[4096];
      size_t n;
      if (read_file(argv[i], 1 << 20, &text, &n)) return 1;
      char* c = copy_of(text, n);
      lj_doc d;
      if (lj_parse(&d, c, n)) {
        printf("error %s\n", d.err);
      } else {
        printf("ok");
        if (lj_kind(&d, 0) == LJ_STRING && lj_str(&d, 0, out, sizeof out) == 0) {
          printf(" ");
          for (const char* p = out; *p; ++p) printf("%02x", (unsigned char)*p);
        }
        printf("\n");
      }
      lj_free(&d);
      free(c);
      free(text);
    }
    return 0;
  }
  char* text;
  size_t n;
  if (argc != 3 || read_file(argv[2], 1 << 20, &text, &n)) return 1;
  int prefixes_ok = 0, parsed = 0, index = !strcmp(argv[1], "bsweep"), index_ok = 0;
  for (size_t k = 0; k < n; ++k) {
    char* c = copy_of(text, k);
    lj_doc d;
    prefixes_ok += lj_parse(&d, c, k) == 0;
    lj_free(&d);
    free(c);
  }
  static const char pool[] = "{}[],:\"\\0123456789eE.+-tfnu \t\n\x01\x7f\x80\xbf\xc3\xed\xf4\xff";
  uint64_t x = 0x2545F4914F6CDD1Dull;
  for (int it = 0; it < 20000; ++it) {
    char* c = copy_of(text, n);
    size_t len = n;
    for (int m = 0; m < 1 + it % 4; ++m) {
      x ^= x << 13; x ^= x >> 7; x ^= x << 17;
      c[x % n] = (x >> 32) % 3 ? pool[(x >> 40) % (sizeof pool - 1)] : (char)(x >> 48);
    }
    if (it % 5 == 0) len = (size_t)((x >> 20) % n);
    char* e = copy_of(c, len);
    lj_doc d;
    if (lj_parse(&d, e, len) == 0) {
      char err[512];
      if (index) {
        lcmac_bundle* b = (lcmac_bundle*)calloc(1, sizeof *b);
        BFiles* files = (BFiles*)calloc(LCMAC_BUNDLE_MAX_KERNELS, sizeof *files);
        b->device = -1;
        Bctx ctx = {&d, "bsweep", argv[2], err, sizeof err};
        index_ok += read_index(b, &ctx, files) == LCMAC_OK;
        free(files);
        free(b);
      } else {
        ArtifactInfo* a = (ArtifactInfo*)calloc(1, sizeof *a);
        Mctx ctx = {&d, "sweep", argv[2], err, sizeof err};
        manifest_fields(&ctx, a);
        free(a);
      }
      parsed++;
    }
    lj_free(&d);
    free(e);
    free(c);
  }
  printf("prefixes_ok %d mutations_parsed %d index_ok %d\n", prefixes_ok, parsed, index_ok);
  free(text);
  return 0;
}
"""

JSON_CASES = [  # (text, accepted)
    ("{}", True), ("[]", True), ("0", True), ("-0", True), ("-1.5e+10", True), ("1E-3", True),
    ('"a"', True), (' {"a": [1, 2, {"b": null}], "c": true, "d": false} \n', True),
    ("1" * 400, True), ("[" * 64 + "]" * 64, True),
    ("", False), (" ", False), ("{", False), ("[1,]", False), ('{"a":1,}', False),
    ('{"a" 1}', False), ("{a:1}", False), ("{'a':1}", False), ("01", False), ("1.", False),
    (".5", False), ("-", False), ("1e", False), ("+1", False), ("NaN", False),
    ("Infinity", False), ("nul", False), ("tru", False), ('"abc', False), ('"\\x"', False),
    ('"\\u12"', False), ('"\\u12g4"', False), ('"\\ud800"', False), ('"\\udc00"', False),
    ('"\\ud800\\u0041"', False), ('"a\tb"', False), ('"a\x00b"', False), ("[1] x", False),
    ("{}{}", False), ("/* c */ {}", False), ("[" * 65 + "]" * 65, False), ("\ufeff{}", False),
    ('"\\', False), ('{"a":', False), ("[1 2]", False), ("[,1]", False), ('{"a":1 "b":2}', False),
]
JSON_BYTES = [  # invalid UTF-8: a stray continuation, an overlong '/', a surrogate, > U+10FFFF
    (b'"\x80"', False), (b'"\xc0\xaf"', False), (b'"\xed\xa0\x80"', False),
    (b'"\xf4\x90\x80\x80"', False), (b'"\xc3"', False), (b'"\xe2\x82\xac"', True),
]
DECODED = {'"\\u00e9\\ud83d\\ude00\\n\\/\\"\\\\\\t"': "é😀\n/\"\\\t".encode(), '"é"': "é".encode()}


def _asan_flags(tmp_path) -> tuple:
    probe = tmp_path / "probe.c"
    probe.write_text("int main(void) { return 0; }\n")
    flags = ("-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-g")
    r = subprocess.run([GCC, *flags, "-o", str(tmp_path / "probe"), str(probe)], capture_output=True)
    ok = r.returncode == 0 and subprocess.run([str(tmp_path / "probe")]).returncode == 0
    return flags if ok else ()


def test_json_reader_is_strict(tmp_path):
    exe = _program(tmp_path, "json", JSON_SRC, whitebox=True, extra=_asan_flags(tmp_path))
    cases = [(t.encode(), ok) for t, ok in JSON_CASES] + JSON_BYTES + [(t.encode(), True) for t in DECODED]
    files = []
    for i, (data, _) in enumerate(cases):
        files.append(tmp_path / f"case{i}.json")
        files[-1].write_bytes(data)
    r = _run([exe, "parse", *files])
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == len(cases), r.stdout + r.stderr
    for (data, ok), line in zip(cases, lines):
        assert line.startswith("ok") == ok, (data, line)
        if not ok:
            assert line.startswith("error malformed JSON at byte "), line
    for (text, want), line in zip(DECODED.items(), lines[-len(DECODED):]):
        assert line == "ok " + want.hex(), (text, line)


def test_json_reader_survives_damaged_manifests(artifact, tmp_path):
    """Every proper prefix of a real manifest is refused and 20000 mutated copies parse or
    fail, each from a buffer of exactly its size, under AddressSanitizer where available."""
    exe = _program(tmp_path, "json", JSON_SRC, whitebox=True, extra=_asan_flags(tmp_path))
    r = _run([exe, "sweep", artifact])
    assert r.returncode == 0, r.stdout + r.stderr
    text = artifact.read_bytes()
    complete = len(text) - (text.rindex(b"}") + 1)   # prefixes that already hold the whole object
    assert f"prefixes_ok {complete} " in r.stdout, r.stdout


# ---- the other architecture, and this API on AArch64 under qemu -------------------------

CROSS = shutil.which("aarch64-linux-gnu-gcc")
QEMU = shutil.which("qemu-aarch64")


@pytest.mark.skipif(HOST != "x86" or not (CROSS and QEMU and Path("/usr/aarch64-linux-gnu").is_dir()),
                    reason="needs an x86-64 host with the AArch64 cross compiler and qemu-user")
def test_aarch64_artifacts(artifact, example, tmp_path):
    """A real AArch64 artifact is refused here (by its manifest, and by its ELF header when the
    manifest claims x86); the example cross-built for AArch64 runs it under qemu, refuses the
    x86 artifact there, and refuses SVE-512 code on 256-bit SVE."""
    from lcmac.artifact.build import build_many
    M, N, K = SHAPE
    res = build_many([dict(algo="strassen", target=t, dtype="float32", shape=SHAPE, out_dir=tmp_path)
                      for t in ("aarch64-neon", "aarch64-sve512")])
    for r in res:
        if isinstance(r, Exception):
            raise r
    neon, sve512 = res
    _refused(_run([example, neon]), "LCMAC_ETARGET", "AArch64", "x86-64")
    x86_target = json.loads(artifact.read_text())["target"]
    lying = _variant(neon, tmp_path, "claims-x86", edit=lambda m: m.update(target=x86_target))
    _refused(_run([example, lying]), "LCMAC_ETARGET", "is AArch64 code")
    arm = _compile(tmp_path / "matmul-arm", ROOT / "examples" / "c" / "matmul.c", cc=CROSS)
    qemu = [QEMU, "-L", "/usr/aarch64-linux-gnu"]
    r = _run([arm, neon, "--repeat", 1], prefix=qemu)
    assert r.returncode == 0 and f"{M}x{N}x{K} float32" in r.stdout, r.stdout + r.stderr
    _refused(_run([arm, artifact], prefix=qemu), "LCMAC_ETARGET", "x86-64", "AArch64")
    r = _run([arm, sve512, "--repeat", 1], prefix=[QEMU, "-cpu", "max,sve-max-vq=4", *qemu[1:]])
    assert r.returncode == 0, r.stdout + r.stderr
    _refused(_run([arm, sve512], prefix=[QEMU, "-cpu", "max,sve-max-vq=2", *qemu[1:]]),
             "LCMAC_ETARGET", "at least 512 bits")
