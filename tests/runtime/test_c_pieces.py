"""The CPU any-shape bundle of piece kernels (lcmac-bundle/3, and /2) from C
(lcmac/runtime/harness/lcmac_pieces.c): the same pieces in the same order as the Python
runtime (lcmac.runtime.bundle_pieces), so the same result bit for bit, the vendor's small and
thin products too where C finds numpy's CBLAS; an index whose pieces are missing, not whole
units or not piece kernels is an exit status and a message naming the problem, never a
signal; and mutated indexes go through the index checks under AddressSanitizer."""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from tests.runtime.test_c_bundle import _copy, _edit_index, _ok
from tests.runtime.test_c_integrity import (
    C_PRELUDE, GCC, HOST, JSON_SRC, ROOT, SIGNALLED, _asan_flags, _compile, _flip_middle, _program,
    _refused, _run)

pytestmark = [
    pytest.mark.skipif(GCC is None, reason="gcc not installed"),
    pytest.mark.skipif(HOST is None, reason="the C API runs artifacts on x86-64 and AArch64 hosts"),
]

#: small ladders (strassen's grid: N in 128s, K in 16s, M in 2s): two piece kernels
LADDER = {"M": (256,), "N": (256, 128), "K": (256,)}
#: (3, 5, 7), (64, 48, 80): the vendor's (small); 129x1000x129: thin; the others cut into
#: pieces: M a last span overlapping by a row (1001), K's last span overlapping (1234, 261,
#: 201: a zeroed copy of B's rows where M > N, of A's columns where M <= N; 201 under one
#: span and not whole units: 192 + 16), N's last span overlapping (777, 300)
SHAPES = [(3, 5, 7), (64, 48, 80), (129, 1000, 129), (1000, 777, 1234), (1001, 300, 261),
          (300, 777, 201)]


def _build(out: Path, dtype: str) -> Path:
    from lcmac.artifact.bundle import build_specs, plan_rule
    from lcmac.spec.shape_rules import piece_ladders
    spec = plan_rule(None, "strassen", "cpu", pieces=piece_ladders((2, 2, 2), LADDER))
    return build_specs([spec], None, dtype, out_dir=out).parent


@pytest.fixture(scope="module")
def pieces(tmp_path_factory) -> Path:
    """The any-shape rule on piece kernels 256x256x256 and 256x128x256 (float32)."""
    return _build(tmp_path_factory.mktemp("pieces"), "float32")


BRUN_SRC = C_PRELUDE + r"""
/* brun DIR M N K A B C: C = A.B (raw files of the bundle's dtype) through lcmac_bundle_matmul */
int main(int argc, char** argv) {
  if (argc != 8) return 1;
  char err[2048];
  int status = -1;
  lcmac_bundle* b = lcmac_open_bundle(argv[1], 2, &status, err, sizeof err);
  if (!b) { fprintf(stderr, "%s: %s\n", lcmac_status_name(status), err); return 2; }
  long long M = atoll(argv[2]), N = atoll(argv[3]), K = atoll(argv[4]);
  int dt = lcmac_bundle_dtype(b);
  size_t sz = dt == LCMAC_FLOAT64 ? 8 : 4;
  for (int i = 0; i < lcmac_bundle_num_rules(b); ++i) printf("rule %s\n", lcmac_bundle_rule(b, i));
  printf("serves %d dtype %d\n", lcmac_bundle_rule_for(b, M, N, K), dt);
  void* A = slurp(argv[5], sz * M * K);
  void* B = slurp(argv[6], sz * K * N);
  void* C = malloc(sz * M * N);
  for (int rep = 0; rep < 2; ++rep) {   /* twice: the scratch buffers are reused */
    int rc = lcmac_bundle_matmul(b, A, B, C, M, N, K, dt);
    if (rc) { fprintf(stderr, "%s: %s\n", lcmac_status_name(rc), lcmac_bundle_last_error(b)); return 2; }
  }
  FILE* f = fopen(argv[7], "wb");
  fwrite(C, sz, (size_t)(M * N), f);
  fclose(f);
  lcmac_bundle_close(b);
  return 0;
}
"""


@pytest.fixture(scope="module")
def brun(tmp_path_factory) -> Path:
    return _program(tmp_path_factory.mktemp("pieces_bin"), "brun", BRUN_SRC)


@pytest.fixture(scope="module")
def example(tmp_path_factory) -> Path:
    return _compile(tmp_path_factory.mktemp("pieces_example") / "matmul", ROOT / "examples" / "c" / "matmul.c")


def _numpy_blas() -> str | None:
    """numpy's own OpenBLAS (its wheels' numpy.libs), for the vendor's products bit for bit."""
    libs = Path(np.__file__).resolve().parent.parent / "numpy.libs"
    found = sorted(libs.glob("libscipy_openblas*.so*")) if libs.is_dir() else []
    return str(found[0]) if found else None


def _c_result(brun, bundle, tmp_path, A, B, monkeypatch, blas=None):
    if blas:
        monkeypatch.setenv("LCMAC_BLAS", blas)
    else:
        monkeypatch.delenv("LCMAC_BLAS", raising=False)
    A.tofile(tmp_path / "a")
    B.tofile(tmp_path / "b")
    (M, K), N = A.shape, B.shape[1]
    r = _run([brun, bundle, M, N, K, tmp_path / "a", tmp_path / "b", tmp_path / "c"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "rule any:?x?x?" in r.stdout and "serves 0" in r.stdout, r.stdout
    return np.fromfile(tmp_path / "c", A.dtype).reshape(M, N)


def _operands(shape, dtype):
    M, N, K = shape
    rng = np.random.default_rng(M + 3 * N + 7 * K)
    return (rng.standard_normal((M, K)).astype(dtype), rng.standard_normal((K, N)).astype(dtype))


def _rel(C, A, B) -> float:
    R = A.astype(np.float64) @ B.astype(np.float64)
    return float(np.linalg.norm(C.astype(np.float64) - R) / np.linalg.norm(R))


def _python(bundle, A, B):
    import lcmac
    from lcmac.artifact.bundle import read_bundle
    from lcmac.spec.shape_rules import plan_pieces
    vendor = plan_pieces(A.shape[0], B.shape[1], A.shape[1], read_bundle(bundle).rules[0].pieces).vendor
    return np.asarray(lcmac.load(bundle)(A, B)), vendor


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_c_runs_the_python_plan(pieces, brun, tmp_path, monkeypatch, shape):
    """No CBLAS: the pieces give Python's bits, the vendor's products a plain loop's."""
    A, B = _operands(shape, np.float32)
    expect, vendor = _python(pieces, A, B)
    C = _c_result(brun, pieces, tmp_path, A, B, monkeypatch)
    assert _rel(C, A, B) < 2e-6
    if not vendor:
        assert np.array_equal(C, expect), np.abs(C - expect).max()


@pytest.mark.skipif(_numpy_blas() is None, reason="numpy's OpenBLAS (numpy.libs) not found")
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_c_on_numpys_blas_is_python_bit_for_bit(pieces, brun, tmp_path, monkeypatch, shape):
    """LCMAC_BLAS = numpy's OpenBLAS: the vendor's products are numpy.matmul's too."""
    A, B = _operands(shape, np.float32)
    expect, _ = _python(pieces, A, B)
    C = _c_result(brun, pieces, tmp_path, A, B, monkeypatch, _numpy_blas())
    assert np.array_equal(C, expect), np.abs(C - expect).max()


def test_float64_bundle(tmp_path_factory, brun, tmp_path, monkeypatch):
    bundle = _build(tmp_path_factory.mktemp("pieces64"), "float64")
    for shape in [(1000, 777, 1234), (64, 48, 80)]:
        A, B = _operands(shape, np.float64)
        C = _c_result(brun, bundle, tmp_path, A, B, monkeypatch)
        assert _rel(C, A, B) < 1e-14
        expect, vendor = _python(bundle, A, B)
        if not vendor:
            assert np.array_equal(C, expect), np.abs(C - expect).max()


def test_fixed_pieces_format_2(pieces, brun, tmp_path, monkeypatch):
    """lcmac-bundle/2 (no run_time): M and K cut like N, every piece at its kernel's full size;
    the /3 kernels take those, so this index over them is a /2 bundle for both runtimes."""
    def to_2(index):
        index["format"] = "lcmac-bundle/2"
        del index["rules"][0]["pieces"]["run_time"]
    d = _edit_index(pieces, tmp_path, edit=to_2)
    A, B = _operands((1000, 777, 1234), np.float32)
    C = _c_result(brun, d, tmp_path, A, B, monkeypatch)
    expect, vendor = _python(d, A, B)
    assert not vendor and np.array_equal(C, expect), np.abs(C - expect).max()


@pytest.mark.parametrize("shape", [(1000, 777, 1234), (3, 5, 7), (64, 48, 80)],
                         ids=lambda s: "x".join(map(str, s)))
def test_example_runs_the_piece_bundle(pieces, example, shape):
    r = _run([example, pieces, *shape, "--threads", 2, "--repeat", 2])
    _ok(r, "any:?x?x?", "x".join(map(str, shape)))
    assert "2 kernels checked" in r.stdout


PLAN_SRC = r"""
#include "lcmac_c.c"
/* plan UM UK "M ladder" "N ladder" "K ladder" M N K ...: per shape one line of the spans
 * (start:size:overlap:piece) of M | N | K, or "vendor"; UM UK 0 0: fixed sizes (/2) */
static void ladder(BPieces* p, int d, char* s) {
  for (char* t = strtok(s, ","); t; t = strtok(NULL, ",")) p->size[d][p->n[d]++] = atoll(t);
}
int main(int argc, char** argv) {
  static BPieces p;
  p.unit[0] = atoll(argv[1]);
  p.unit[1] = atoll(argv[2]);
  for (int d = 0; d < 3; ++d) ladder(&p, d, argv[3 + d]);
  for (int i = 6; i + 2 < argc; i += 3) {
    PPlan pl;
    if (plan_pieces(&p, atoll(argv[i]), atoll(argv[i + 1]), atoll(argv[i + 2]), &pl)) return 1;
    if (!pl.n[0] || !pl.n[1] || !pl.n[2]) printf("vendor");
    for (int d = 0; pl.n[0] && pl.n[1] && pl.n[2] && d < 3; ++d) {
      printf(d ? " |" : "");
      for (int64_t j = 0; j < pl.n[d]; ++j) {
        const PSpan* x = &pl.s[d][j];
        printf(" %lld:%lld:%lld:%lld", (long long)x->start, (long long)x->size,
               (long long)x->overlap, (long long)span_piece(x));
      }
    }
    printf("\n");
    free(pl.s[0]);
  }
  return 0;
}
"""


def _plan_text(plan) -> str:
    if plan.vendor:
        return "vendor"
    return " |".join("".join(f" {s.start}:{s.size}:{s.overlap}:{s.piece}" for s in spans)
                     for spans in (plan.M, plan.N, plan.K))


@pytest.mark.parametrize("run_time", [True, False], ids=["format3", "format2"])
def test_c_cuts_every_shape_as_python(tmp_path, run_time):
    """plan_pieces in C and in Python (lcmac.spec.shape_rules) on the default ladders of a 2x2x2
    and a 3x3x3 grid: the same spans for edge and random shapes."""
    from lcmac.spec.shape_rules import piece_ladders, plan_pieces
    exe = _program(tmp_path, "plan", PLAN_SRC, whitebox=True)
    rng = np.random.default_rng(7)
    edges = [1, 2, 127, 128, 129, 255, 256, 257, 383, 384, 1000, 1001, 2047, 2048, 2049, 4097, 6145]
    shapes = [(m, n, k) for m in edges[::3] for n in edges[1::2] for k in edges[::4]]
    shapes += [tuple(int(x) for x in rng.integers(1, 9000, 3)) for _ in range(150)]
    for grid in [(2, 2, 2), (3, 3, 3)]:
        lad = piece_ladders(grid)
        if not run_time:
            lad = {d: lad[d] for d in "MNK"}
        units = [lad["run_time"]["M"], lad["run_time"]["K"]] if run_time else [0, 0]
        r = _run([exe, *units, *(",".join(map(str, lad[d])) for d in "MNK"),
                  *(x for s in shapes for x in s)])
        assert r.returncode == 0, r.stderr
        lines = r.stdout.splitlines()
        assert len(lines) == len(shapes)
        for shape, line in zip(shapes, lines):
            assert line == _plan_text(plan_pieces(*shape, lad)), (grid, shape)


# ---- refused: an exit status and a message, never a signal --------------------------------

def _names(bundle: Path):
    return [k["name"] for k in json.loads((bundle / "bundle.json").read_text())["kernels"]]


def _set(path, value):
    """edit(index) setting index[path...] = value (a path of keys and indices)."""
    def edit(index):
        node = index
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
    return edit


def _del(path):
    def edit(index):
        node = index
        for key in path[:-1]:
            node = node[key]
        del node[path[-1]]
    return edit


PIECES = ("rules", 0, "pieces")
BROKEN = {  # case: (edit of the index, words the message must hold)
    "kernel_missing": (lambda i: i["rules"][0]["kernels"].pop(), ["lists no 256x128x256 piece kernel"]),
    "kernel_not_listed": (lambda i: i["rules"][0]["kernels"].append("nosuch"), ["nosuch", "not in the bundle"]),
    "kernel_not_marked_piece": (_del(("kernels", 1, "piece")), ["lists no 256x128x256 piece kernel"]),
    "run_time_not_multiples": (_set(PIECES + ("run_time", "M"), 3), ["pieces.M size 256", "run_time.M 3"]),
    "run_time_missing": (_del(PIECES + ("run_time",)), ["lack the run_time units"]),
    "run_time_not_M_K": (_set(PIECES + ("run_time",), {"M": 2}), ["pieces.run_time is not {M, K}"]),
    "run_time_in_format_2": (_set(("format",), "lcmac-bundle/2"), ["run-time extents", "lcmac-bundle/2"]),
    "pieces_in_format_1": (_set(("format",), "lcmac-bundle/1"), ["lcmac-bundle/1 has not"]),
    "ladder_ascending": (_set(PIECES + ("N",), [128, 256]), ["pieces.N is not strictly descending"]),
    "ladder_empty": (_set(PIECES + ("K",), []), ["pieces.K must list 1 to"]),
    "ladder_garbled": (_set(PIECES + ("M",), [256.5]), ["pieces.M[0] is not a positive integer"]),
    "pieces_not_object": (_set(PIECES, [256]), ['"pieces" is not an object']),
    "dtype_bfloat16": (_set(("dtype",), "bfloat16"), ["piece kernels serve float32 and float64"]),
    "format_4": (_set(("format",), "lcmac-bundle/4"), ["lcmac-bundle/4", "lcmac-bundle/3"]),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_broken_index_is_refused(pieces, example, tmp_path, case):
    edit, words = BROKEN[case]
    d = _edit_index(pieces, tmp_path, edit=edit)
    _refused(_run([example, d, 1000, 777, 1234]), "LCMAC_EFORMAT", *words)


def _edit_manifest(bundle: Path, name: str, edit) -> None:
    path = bundle / f"{name}.json"
    man = json.loads(path.read_text())
    edit(man)
    path.write_text(json.dumps(man, indent=2))


def test_kernels_that_are_not_piece_kernels_are_refused(pieces, example, tmp_path):
    name = _names(pieces)[0]
    d = _copy(pieces, tmp_path / "kind")
    _edit_manifest(d, name, lambda m: m["entry_points"][0].update(kind="matmul"))
    _refused(_run([example, d, 1000, 777, 1234]), "LCMAC_EFORMAT", name, "is not a piece kernel")
    # rows of 4s: the rule's run-time rows come in 2s
    d = _copy(pieces, tmp_path / "units")
    _edit_manifest(d, name, lambda m: m["extra"]["piece"]["rows"].update(multiple_of=4))
    _refused(_run([example, d, 1000, 777, 1234]), "LCMAC_EFORMAT", name,
             "does not take the rule's run-time rows")
    d = _copy(pieces, tmp_path / "fits")
    _edit_manifest(d, name, lambda m: m["extra"]["piece"]["depth"].update(max=300))
    _refused(_run([example, d, 1000, 777, 1234]), "LCMAC_EFORMAT", name, "extra.piece.depth")


def test_damaged_piece_library_is_refused(pieces, example, tmp_path):
    d = _copy(pieces, tmp_path)
    victim = json.loads((d / "bundle.json").read_text())["kernels"][1]
    lib = d / victim["library"]
    lib.write_bytes(_flip_middle(lib.read_bytes()))
    _refused(_run([example, d, 1000, 777, 1234]), "LCMAC_ECORRUPT", victim["name"], "SHA-256")


def test_a_cblas_that_does_not_load_is_refused(pieces, example, tmp_path, monkeypatch):
    monkeypatch.setenv("LCMAC_BLAS", str(tmp_path / "nosuch.so"))
    _refused(_run([example, pieces, 3, 5, 7]), "LCMAC_ELOAD", "LCMAC_BLAS", "nosuch.so")


def test_piece_kernel_alone_is_refused_by_name(pieces, example):
    name = _names(pieces)[0]
    r = _run([example, pieces / f"{name}.json"])
    _refused(r, "LCMAC_EINVAL", "piece kernel of a bundle", "lcmac_open_bundle")


def test_reader_survives_damaged_piece_indexes(pieces, tmp_path):
    """Every proper prefix of the /3 index and 20000 mutated copies go through the JSON reader
    and, where they parse, the index checks; the same for a piece kernel's manifest (its
    extra.piece), under AddressSanitizer where available."""
    exe = _program(tmp_path, "json", JSON_SRC, whitebox=True, extra=_asan_flags(tmp_path))
    r = _run([exe, "bsweep", pieces / "bundle.json"])
    assert r.returncode == 0 and r.returncode not in SIGNALLED, r.stdout + r.stderr
    parsed, passed = map(int, re.search(r"mutations_parsed (\d+) index_ok (\d+)", r.stdout).groups())
    assert parsed > 100 and 0 < passed < parsed, r.stdout      # the checks reached, and refusing
    r = _run([exe, "sweep", pieces / f"{_names(pieces)[0]}.json"])
    assert r.returncode == 0, r.stdout + r.stderr
