"""Bundles from C (lcmac_open_bundle / lcmac_bundle_matmul in lcmac/runtime/harness): a rows
bundle and an any-shape bundle run through examples/c/matmul.c (checked there against a
triple loop in double) and give Python's results bit for bit; a damaged library, an index of
another format and a shape no rule admits are an exit status and a message, never a
signal."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.runtime.test_c_integrity import (C_PRELUDE, GCC, HOST, ROOT, SIGNALLED, _compile,
                                            _flip_middle, _program, _refused, _run)

pytestmark = [
    pytest.mark.skipif(GCC is None, reason="gcc not installed"),
    pytest.mark.skipif(HOST is None, reason="the C API runs artifacts on x86-64 and AArch64 hosts"),
]

N, K = 48, 40


@pytest.fixture(scope="module")
def rows_bundle(tmp_path_factory) -> Path:
    """?x48x40 over row buckets 64 and 16 (float32)."""
    from lcmac.artifact.bundle import build_bundle
    return build_bundle("strassen", None, "float32", [f"?x{N}x{K}"],
                        out_dir=tmp_path_factory.mktemp("rows_bundle"), rows=(64, 16)).parent


@pytest.fixture(scope="module")
def any_bundle(tmp_path_factory) -> Path:
    """?x?x? over 32x32 tiles, row bucket 32 (float32)."""
    from lcmac.artifact.bundle import build_bundle
    return build_bundle("strassen", None, "float32", [None],
                        out_dir=tmp_path_factory.mktemp("any_bundle"), rows=(32,), tile=(32, 32)).parent


@pytest.fixture(scope="module")
def example(tmp_path_factory) -> Path:
    return _compile(tmp_path_factory.mktemp("c_bin") / "matmul", ROOT / "examples" / "c" / "matmul.c")


def _copy(bundle: Path, dst: Path) -> Path:
    out = dst / "bundle"
    shutil.copytree(bundle, out)
    return out


def _ok(r, rule: str, shape: str) -> float:
    """A clean run of the example: the rule and shape named, the error printed and small."""
    assert r.returncode >= 0 and r.returncode not in SIGNALLED, f"killed: {r.returncode}\n{r.stderr}"
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"rule {rule}" in r.stdout and f"{shape} float32" in r.stdout, r.stdout
    rel = float(re.search(r"max_rel_error=(\S+)", r.stdout).group(1))
    assert rel < 1e-5, r.stdout
    return rel


# ---- good bundles -----------------------------------------------------------------------

@pytest.mark.parametrize("M", [64, 100, 5, 16])
def test_rows_bundle_runs(rows_bundle, example, M):
    # 64: one bucket; 100: 64 + 2x16 + 4 padded; 5: padded only; 16: the small bucket
    r = _run([example, rows_bundle, M, N, K, "--threads", 2, "--repeat", 2])
    _ok(r, f"rows:?x{N}x{K}", f"{M}x{N}x{K}")
    assert "2 kernels checked" in r.stdout


@pytest.mark.parametrize("shape", [(70, 50, 45), (32, 32, 32), (1, 1, 1), (33, 64, 97)])
def test_any_bundle_runs(any_bundle, example, shape):
    r = _run([example, any_bundle, *shape, "--threads", 2, "--repeat", 2])
    _ok(r, "any:?x?x?", "x".join(map(str, shape)))


def test_any_bundle_bfloat16_accumulates_in_float32(tmp_path, example):
    """K over several tiles: the bf16 products summed in float32, rounded once."""
    from lcmac.artifact.bundle import build_bundle
    from lcmac.spec.targets import host_target
    if "bfloat16" not in host_target().dtypes:
        pytest.skip(f"this CPU's target ({host_target().name}) has no bfloat16 kernels")
    d = build_bundle("strassen", None, "bfloat16", [None], out_dir=tmp_path, rows=(32,),
                     tile=(32, 32)).parent
    r = _run([example, d, 20, 50, 100, "--threads", 2, "--repeat", 1])
    assert r.returncode == 0, r.stdout + r.stderr             # 3: above the example's bf16 bound
    assert "rule any:?x?x?" in r.stdout and "20x50x100 bfloat16" in r.stdout
    assert float(re.search(r"max_rel_error=(\S+)", r.stdout).group(1)) < 1e-2


BRUN_SRC = C_PRELUDE + r"""
/* brun DIR M N K A B C: C = A·B (raw float32 files) through lcmac_bundle_matmul */
int main(int argc, char** argv) {
  if (argc != 8) return 1;
  char err[2048];
  int status = -1;
  lcmac_bundle* b = lcmac_open_bundle(argv[1], 2, &status, err, sizeof err);
  if (!b) { fprintf(stderr, "%s: %s\n", lcmac_status_name(status), err); return 2; }
  long long M = atoll(argv[2]), N = atoll(argv[3]), K = atoll(argv[4]);
  for (int i = 0; i < lcmac_bundle_num_rules(b); ++i) printf("rule %s\n", lcmac_bundle_rule(b, i));
  printf("serves %d dtype %d\n", lcmac_bundle_rule_for(b, M, N, K), lcmac_bundle_dtype(b));
  float* A = slurp(argv[5], sizeof(float) * M * K);
  float* B = slurp(argv[6], sizeof(float) * K * N);
  float* C = malloc(sizeof(float) * M * N);
  for (int rep = 0; rep < 2; ++rep) {   /* twice: the scratch buffers are reused */
    int rc = lcmac_bundle_matmul(b, A, B, C, M, N, K, LCMAC_FLOAT32);
    if (rc) { fprintf(stderr, "%s: %s\n", lcmac_status_name(rc), lcmac_bundle_last_error(b)); return 2; }
  }
  FILE* f = fopen(argv[7], "wb");
  fwrite(C, sizeof(float), (size_t)(M * N), f);
  fclose(f);
  lcmac_bundle_close(b);
  return 0;
}
"""


@pytest.mark.parametrize("which,shape", [("rows", (100, N, K)), ("rows", (5, N, K)),
                                         ("any", (70, 50, 45))])
def test_c_matches_python(rows_bundle, any_bundle, tmp_path, which, shape):
    """The same cut as lcmac.runtime.tiled: C's result is Python's, bit for bit."""
    import lcmac
    bundle = rows_bundle if which == "rows" else any_bundle
    M, n, k = shape
    rng = np.random.default_rng(5)
    A = rng.standard_normal((M, k)).astype(np.float32)
    B = rng.standard_normal((k, n)).astype(np.float32)
    A.tofile(tmp_path / "a")
    B.tofile(tmp_path / "b")
    exe = _program(tmp_path, "brun", BRUN_SRC)
    r = _run([exe, bundle, M, n, k, tmp_path / "a", tmp_path / "b", tmp_path / "c"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "serves 0 dtype 0" in r.stdout
    C = np.fromfile(tmp_path / "c", np.float32).reshape(M, n)
    expect = np.asarray(lcmac.load(bundle)(A, B))
    assert np.array_equal(C, expect), np.abs(C - expect).max()


# ---- refused: an exit status and a message, never a signal --------------------------------

def test_damaged_library_is_refused_at_open(rows_bundle, example, tmp_path):
    d = _copy(rows_bundle, tmp_path)
    index = json.loads((d / "bundle.json").read_text())
    victim = index["kernels"][-1]
    lib = d / victim["library"]
    lib.write_bytes(_flip_middle(lib.read_bytes()))
    r = _run([example, d, 64, N, K])
    _refused(r, "LCMAC_ECORRUPT", victim["name"], "SHA-256")


def test_missing_library_is_refused_at_open(rows_bundle, example, tmp_path):
    d = _copy(rows_bundle, tmp_path)
    victim = json.loads((d / "bundle.json").read_text())["kernels"][0]
    (d / victim["library"]).unlink()
    _refused(_run([example, d, 64, N, K]), "LCMAC_EIO", victim["name"])


def _edit_index(bundle: Path, tmp_path: Path, edit=None, text=None) -> Path:
    d = _copy(bundle, tmp_path)
    p = d / "bundle.json"
    if edit:
        index = json.loads(p.read_text())
        edit(index)
        p.write_text(json.dumps(index, indent=2))
    if text:
        p.write_text(text(p.read_text()))
    return d


def test_index_naming_another_library_is_refused(rows_bundle, example, tmp_path):
    """The index's record of a library must be the manifest's (each file is hashed once, against
    its manifest)."""
    def edit(index):
        index["kernels"][0]["sha256"] = "0" * 64
    d = _edit_index(rows_bundle, tmp_path, edit=edit)
    name = json.loads((d / "bundle.json").read_text())["kernels"][0]["name"]
    _refused(_run([example, d, 64, N, K]), "LCMAC_ECORRUPT", name, "bundle index")


def test_other_format_is_refused(rows_bundle, example, tmp_path):
    d = _edit_index(rows_bundle, tmp_path, edit=lambda i: i.update(format="lcmac-bundle/9"))
    _refused(_run([example, d, 64, N, K]), "LCMAC_EFORMAT", "lcmac-bundle/9", "lcmac-bundle/1")


@pytest.mark.parametrize("case,words", [
    ("trailing_comma", ["malformed JSON"]),
    ("unlisted_kernel", ["not in the bundle", "nosuch"]),
    ("missing_bucket", ["lists no 16x48x40 kernel"]),
    ("no_dtype", ['"dtype" is missing']),
    ("path_in_name", ["is not a file name"]),
    ("bad_rule", ["is none of"]),
])
def test_malformed_index_is_refused(rows_bundle, example, tmp_path, case, words):
    def unlisted(i):
        i["rules"][0]["kernels"].append("nosuch")

    def missing_bucket(i):
        i["rules"][0]["kernels"] = i["rules"][0]["kernels"][:1]

    def path_in_name(i):
        i["kernels"][0]["library"] = "../x.so"

    def bad_rule(i):
        i["rules"][0]["rule"] = "rows:?x48"
    edits = {"unlisted_kernel": unlisted, "missing_bucket": missing_bucket,
             "no_dtype": lambda i: i.pop("dtype"), "path_in_name": path_in_name, "bad_rule": bad_rule}
    if case == "trailing_comma":
        d = _edit_index(rows_bundle, tmp_path, text=lambda t: t.rstrip().rstrip("}") + ",}")
    else:
        d = _edit_index(rows_bundle, tmp_path, edit=edits[case])
    _refused(_run([example, d, 64, N, K]), "LCMAC_EFORMAT", *words)


def test_missing_index_is_refused(example, tmp_path):
    _refused(_run([example, tmp_path, 64, N, K]), "LCMAC_EIO", "bundle.json")


def test_shape_outside_the_rules_is_refused(rows_bundle, example):
    r = _run([example, rows_bundle, 5, N + 1, K])
    _refused(r, "LCMAC_EINVAL", f"5x{N + 1}x{K}", f"rows:?x{N}x{K}")


def test_wrong_dtype_is_refused(rows_bundle, example):
    _refused(_run([example, rows_bundle, 5, N, K, "--dtype", "f64"]), "LCMAC_EINVAL",
             "float64", "float32")


# ---- an exported bundle (lcmac export) ---------------------------------------------------

def test_exported_bundle_from_c(example, tmp_path):
    """`lcmac export` of two shapes, both run from C; a truncated library, a byte-flipped one
    and a kernel of another target are each an exit status and a message."""
    from lcmac.api.export import export
    src = export(["64x48x40", "40x24x56"], None, "float32", tmp_path / "exported").parent
    assert (src / "lcmac.h").is_file()
    _ok(_run([example, src, 64, 48, 40]), "exact:64x48x40", "64x48x40")
    _ok(_run([example, src, 40, 24, 56]), "exact:40x24x56", "40x24x56")
    kernels = json.loads((src / "bundle.json").read_text())["kernels"]
    for case, damage, status in [
            ("truncated", lambda lib, man: lib.write_bytes(lib.read_bytes()[:4096]), "LCMAC_ECORRUPT"),
            ("flipped", lambda lib, man: lib.write_bytes(_flip_middle(lib.read_bytes())), "LCMAC_ECORRUPT"),
            ("foreign", lambda lib, man: man.write_text(man.read_text().replace(
                '"family": "x86"', '"family": "aarch64"')), "LCMAC_ETARGET")]:
        d = tmp_path / case
        shutil.copytree(src, d)
        damage(d / kernels[0]["library"], d / kernels[0]["manifest"])
        r = _run([example, d, 64, 48, 40])
        assert r.returncode not in SIGNALLED and r.returncode != 0, (case, r.returncode)
        assert status in r.stdout + r.stderr, (case, r.stdout + r.stderr)
