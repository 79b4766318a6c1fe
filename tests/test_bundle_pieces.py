"""The shape-less CPU bundle on piece kernels: how a shape is cut (M and K into spans of
run-time extents, N into spans of a ladder, the last overlapping), the piece entry point
(row-strided views, run-time rows and depth, C written or added into), and the default
`lcmac build --algo strassen` bundle against float64 at the shapes it is judged on."""
import json

import numpy as np
import pytest

import lcmac
from lcmac.artifact.bundle import FIXED_PIECES_FORMAT, INDEX, PIECES_FORMAT, read_bundle
from lcmac.cli.main import main
from lcmac.core.errors import ArtifactError, ShapeError
from lcmac.ir import get
from lcmac.schedules.cpu_lcma import PIECE_DEPTH, PIECE_FLAG, PIECE_ROWS, generate
from lcmac.spec.cpu.config import CpuConfig
from lcmac.spec.shape_rules import (
    PIECE_LADDER, PIECE_MIN_EXTENT, PIECE_UNITS, VENDOR_WORK, cut_extent, cut_run_time, piece_ladders,
    piece_shapes, plan_pieces)

LADDERS = piece_ladders((2, 2, 2))
JUDGED = [(3, 5, 7), (512, 512, 512), (1000, 777, 1234), (3000, 2500, 2000)]
NK_LADDER = PIECE_LADDER["cpu"]["N"]


def _covers(extent, spans, reduction):
    """Each element once (K) or at least once (M, N), every span inside the extent."""
    seen = np.zeros(extent, int)
    for s in spans:
        assert 0 <= s.start and s.start + s.size <= extent and 0 <= s.overlap < s.size
        # an overlap is what earlier spans covered; K counts only the rest
        assert seen[s.start:s.start + s.overlap].all() and not seen[s.start + s.overlap:s.start + s.size].any()
        seen[s.start + (s.overlap if reduction else 0):s.start + s.size] += 1
    assert (seen == 1).all() if reduction else (seen >= 1).all()


@pytest.mark.parametrize("extent", [128, 129, 255, 300, 777, 1000, 1234, 2000, 2500, 3000, 4097])
def test_cut_covers_the_extent_with_ladder_spans(extent):
    spans = cut_extent(extent, NK_LADDER)
    assert {s.size for s in spans} <= set(NK_LADDER)
    _covers(extent, spans, reduction=True)
    # no more computed than the extent rounded up to the smallest span, plus one overlap
    assert sum(s.size for s in spans) < extent + min(NK_LADDER)


@pytest.mark.parametrize("unit", [1, 2, 3, 16])
@pytest.mark.parametrize("extent", [128, 129, 131, 1000, 1001, 2048, 2049, 3000, 4097, 5001])
def test_run_time_extents_are_cut_into_spans(extent, unit):
    most = 2048 // unit * unit          # a kernel's extent: whole units
    spans = cut_run_time(extent, most, unit)
    _covers(extent, spans, reduction=False)
    assert all(s.piece == most and 0 < s.size <= most and s.size % unit == 0 for s in spans)
    # as few spans as the largest allows, and at most unit - 1 rows computed twice
    assert len(spans) == -(-extent // most) + (extent < most and extent % unit != 0)
    assert sum(s.size for s in spans) - extent < unit


def test_run_time_cut_examples():
    assert [(s.start, s.size, s.overlap) for s in cut_run_time(3000, 2048, 2)] == [(0, 2048, 0), (2048, 952, 0)]
    assert [(s.start, s.size, s.overlap) for s in cut_run_time(3001, 2048, 2)] == [(0, 2048, 0), (2047, 954, 1)]
    assert [(s.start, s.size, s.overlap) for s in cut_run_time(1001, 2048, 2)] == [(0, 1000, 0), (999, 2, 1)]
    assert [(s.start, s.size, s.overlap) for s in cut_run_time(1234, 2048, 16)] == [(0, 1232, 0), (1218, 16, 14)]
    assert cut_run_time(PIECE_MIN_EXTENT - 1, 2048, 1) == ()


def test_cut_prefers_few_large_spans():
    assert [(s.start, s.size, s.overlap) for s in cut_extent(3000, (1024, 512, 256, 128))] == \
        [(0, 1024, 0), (1024, 1024, 0), (1976, 1024, 72)]
    assert [(s.size, s.overlap) for s in cut_extent(1000, (1024, 512, 256, 128))] == [(512, 0), (512, 24)]
    assert cut_extent(4096, (1024, 512)) == tuple(cut_extent(4096, (1024,)))
    assert cut_extent(100, (1024, 128)) == ()


def test_small_and_thin_products_go_to_the_vendor():
    assert plan_pieces(3, 5, 7, LADDERS).vendor
    assert plan_pieces(100, 4096, 4096, LADDERS).vendor          # M under the smallest span
    assert plan_pieces(200, 200, 200, LADDERS).vendor and 200 ** 3 < VENDOR_WORK
    p = plan_pieces(1000, 777, 1234, LADDERS)
    assert not p.vendor and set(p.shapes()) <= set(piece_shapes(LADDERS))
    assert 1 < p.computed() / (1000 * 777 * 1234) < 1.25
    assert [(s.size, s.piece) for s in p.M] == [(1000, 2048)]        # one span, run-time rows
    assert [(s.size, s.piece) for s in plan_pieces(3000, 2500, 2000, LADDERS).K] == [(2000, 2048)]


def test_fixed_row_ladders_cut_m_like_n():
    """A lcmac-bundle/2 rule (no "run_time"): kernels of fixed sizes, M and K cut by their ladders."""
    fixed = {d: (1024, 512, 256, 128) for d in "MNK"}
    p = plan_pieces(1000, 777, 1234, fixed)
    assert [(s.start, s.size, s.overlap, s.piece) for s in p.M] == [(0, 512, 0, 512), (488, 512, 24, 512)]
    assert set(p.shapes()) <= set(piece_shapes(fixed))


def test_piece_ladders_are_whole_blocks_of_the_grid():
    lad = piece_ladders((3, 3, 3))
    assert all(P % 3 == 0 for P in lad["M"]) and all(P % (3 * 64) == 0 for P in lad["N"])
    assert all(P % (3 * PIECE_UNITS["K"]) == 0 for P in lad["K"])
    assert piece_ladders((1, 1, 1)) == {**PIECE_LADDER["cpu"], "run_time": {"M": 1, "K": PIECE_UNITS["K"]}}
    assert lad["run_time"] == {"M": 3, "K": 3 * PIECE_UNITS["K"]}
    assert piece_ladders((2, 2, 2), (1024, 512))["M"] == (1024, 512)


def test_piece_source_takes_strided_views_and_an_accumulate_flag():
    alg = get("strassen")
    cfg = CpuConfig(mr=6, nr=64, mc=132, nc=128, kc=1024, ku=8, bands=2)
    src, info = generate(alg, "float32", 512, 512, 512, cfg, piece=True)
    assert f"{PIECE_FLAG}: T.int32" in src and "strides=(lda, 1)" in src and "strides=(ldc, 1)" in src
    assert f"({PIECE_ROWS}, {PIECE_DEPTH})" in src and info["piece"]["rows"] == {"max": 512, "multiple_of": 2}
    assert info["piece"]["depth"] == {"max": 512, "multiple_of": 2 * PIECE_UNITS["K"]}
    assert f"{PIECE_FLAG} == 0" in src and "prepared_b" not in info and info["piece"]
    assert src.count("T.parallel") == 1                  # one parallel region a call
    with pytest.raises(ShapeError, match="piece kernel .* needs"):       # 777 columns pad
        generate(alg, "float32", 1000, 777, 1234, cfg, piece=True)
    with pytest.raises(ShapeError, match="fused Combine H"):
        generate(alg, "float32", 512, 512, 512, CpuConfig(mr=6, nr=64, fused=False), piece=True)
    with pytest.raises(ShapeError, match="packed per block"):       # run-time extents need bands
        generate(alg, "float32", 512, 512, 512, CpuConfig(mr=6, nr=64, bands=0), piece=True)
    with pytest.raises(ShapeError, match="ku dividing"):
        generate(alg, "float32", 512, 512, 512, CpuConfig(mr=6, nr=64, ku=16, bands=2), piece=True)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    """`lcmac build --algo strassen -o DIR`: no shape, the defaults (8 piece kernels)."""
    d = tmp_path_factory.mktemp("pieces")
    assert main(["build", "--algo", "strassen", "-o", str(d)]) == 0
    return d


def _rel(C, A, B) -> float:
    R = A.astype(np.float64) @ B.astype(np.float64)
    return float(np.linalg.norm(np.asarray(C, np.float64) - R) / np.linalg.norm(R))


def test_default_bundle_is_piece_kernels(bundle):
    b = read_bundle(bundle)
    (rule,) = b.rules
    assert str(rule.rule) == "any:?x?x?" and rule.pieces == LADDERS and rule.tile is None
    assert len(b.kernels) == len(piece_shapes(LADDERS)) and all(k.get("piece") for k in b.kernels.values())
    assert json.loads((bundle / INDEX).read_text())["format"] == PIECES_FORMAT


@pytest.mark.parametrize("shape", JUDGED + [(1001, 300, 261), (2100, 130, 4100)], ids=lambda s: "x".join(map(str, s)))
def test_default_bundle_matches_float64(bundle, shape):
    M, N, K = shape
    rng = np.random.default_rng(M + N + K)
    A = rng.standard_normal((M, K)).astype(np.float32)
    B = rng.standard_normal((K, N)).astype(np.float32)
    out = np.full((M, N), np.nan, np.float32)
    assert lcmac.load(bundle)(A, B, out=out) is out
    # a GEMM's float32 error is ~1e-7 here, Strassen's a few times that (docs/accuracy.md)
    assert _rel(out, A, B) < 2e-6, shape


def test_bundle_takes_views_and_torch_tensors(bundle):
    torch = pytest.importorskip("torch")
    f = lcmac.load(bundle)
    rng = np.random.default_rng(1)
    A = rng.standard_normal((700, 1300)).astype(np.float32)
    B = rng.standard_normal((1300, 900)).astype(np.float32)
    a, b = A[37:637, 11:1211], B[100:1300:1, 5:405]          # row-strided views: no copy
    assert _rel(f(a, b), a, b) < 2e-6
    assert _rel(f(np.asfortranarray(a), b), a, b) < 2e-6      # column-major: copied first
    C = f(torch.from_numpy(A), torch.from_numpy(B))
    assert isinstance(C, torch.Tensor) and _rel(C.numpy(), A, B) < 2e-6
    with pytest.raises(Exception, match="float64|dtype"):
        f(A.astype(np.float64), B.astype(np.float64))
    square = np.ascontiguousarray(B[:900])
    with pytest.raises(ShapeError, match="overlaps"):
        f(square, square, out=square)


def test_a_piece_kernel_loaded_alone_is_refused_by_name(bundle):
    b = read_bundle(bundle)
    name = next(iter(b.kernels))
    with pytest.raises(ArtifactError, match="piece kernel of a bundle.*load the bundle"):
        lcmac.load(b.manifest_path(name))(np.ones((4, 4), np.float32), np.ones((4, 4), np.float32))


def test_readers_refuse_formats_they_do_not_know(tmp_path):
    (tmp_path / INDEX).write_text(json.dumps({"format": "lcmac-bundle/5", "rules": [], "kernels": []}))
    with pytest.raises(ArtifactError, match=r"format 'lcmac-bundle/5'.*lcmac-bundle/1, lcmac-bundle/2, "
                                            r"lcmac-bundle/3 and lcmac-bundle/4"):
        read_bundle(tmp_path)


@pytest.mark.parametrize("fmt, units", [(FIXED_PIECES_FORMAT, {"M": 2, "K": 16}), (PIECES_FORMAT, None)])
def test_pieces_run_time_must_match_the_format(tmp_path, fmt, units):
    pieces = {"M": [2048], "N": [512], "K": [512], **({"run_time": units} if units else {})}
    (tmp_path / INDEX).write_text(json.dumps({"format": fmt, "target": {}, "dtype": "float32", "kernels": [
        {"name": "k", "manifest": "k.json"}], "rules": [
        {"rule": "any:?x?x?", "algorithm": "strassen", "kernels": ["k"], "pieces": pieces}]}))
    with pytest.raises(ArtifactError, match="run-time extents" if units else "lack the run_time"):
        read_bundle(tmp_path)
