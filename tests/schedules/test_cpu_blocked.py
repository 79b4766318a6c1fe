"""Packing A and B per cache block inside the tasks (``CpuConfig.bands``,
lcmac.schedules.cpu_gemm_blocked), for the plain GEMM and for LCMAs (their blocks summed as
they are packed): results against float64, the prepared-B entry bit for bit against the
plain one, row tails (A read up to its last byte, C's padded rows never written), bands that
do not divide the row blocks, float64, fused and stored H, the fallback for shapes that need
zero padding, and the knob's errors.  Runs on any x86-64 host with AVX2."""
from __future__ import annotations

import re

import numpy as np
import pytest

from lcmac.artifact.build import build, build_many
from lcmac.artifact.manifest import Manifest
from lcmac.ir import catalogue
from lcmac.spec.cpu.config import CpuConfig, default_config, resolve_config
from lcmac.spec.targets import get_target
from lcmac.spec.cpu.x86 import host_supports

from .test_cpu_backend import _get, _guarded

AVX2 = "x86_64-avx2"
pytestmark = pytest.mark.skipif(not host_supports(AVX2), reason="needs an AVX2 x86-64 host")

# several bands, row blocks, column blocks and kc chunks on small shapes
SMALL = {"mr": 6, "nr": 16, "mc": 18, "nc": 32, "kc": 16, "ku": 4}
JOBS = {  # key: (shape (M, N, K), dtype, config)
    "rowtail": ((130, 64, 48), "float32", {**SMALL, "bands": 2}),
    "bands-uneven": ((130, 64, 48), "float32", {**SMALL, "bands": 3}),    # 8 row blocks, 3 bands
    "one-band": ((36, 32, 32), "float32", {**SMALL, "bands": 1}),
    # one row block: the column blocks are shared out instead (3 groups of 1; 2 groups of 2, one short)
    "more-bands-than-blocks": ((12, 96, 16), "float32", {**SMALL, "bands": 4}),
    "column-groups-uneven": ((12, 96, 16), "float32", {**SMALL, "bands": 2}),
    "float64": ((40, 24, 32), "float64", {"mr": 6, "nr": 8, "mc": 12, "nc": 8, "kc": 8, "ku": 4, "bands": 2}),
    "padded-k": ((50, 32, 45), "float32", {**SMALL, "bands": 2}),         # K=45: zero padding
    "default": ((96, 64, 64), "float32", None),
    "sse-default": ((50, 64, 48), "float32", None),                       # target x86_64 (SSE)
    # LCMAs: a row tail in every block row (38 rows), H fused into C
    "strassen-rowtail": ((76, 64, 64), "float32", {**SMALL, "bands": 2}),
    # 49 products, H stored; 3 row blocks in 2 bands (the second band's extra block skipped)
    "strassen2-stored-h": ((152, 64, 64), "float32", {**SMALL, "bands": 2, "fused": False}),
    # B̃_r's chunks packed by 3 bands together (8 kc rows each), 2 kc chunks, 2 column blocks
    "strassen-shared-b-3bands": ((76, 64, 96), "float32", {**SMALL, "kc": 24, "nc": 16, "bands": 3}),
    # kc 16 does not split over 3 bands: one chunk per band
    "strassen-b-per-band": ((76, 64, 96), "float32", {**SMALL, "bands": 3}),
    # register tiles walked row by row (knob tiles_by_row): a row tail, 2 kc chunks, 2 column blocks
    "rows-first": ((130, 64, 48), "float32", {**SMALL, "bands": 2, "tiles_by_row": True}),
    "strassen-rows-first": ((76, 64, 96), "float32", {**SMALL, "kc": 24, "nc": 16, "bands": 3,
                                                       "tiles_by_row": True}),
    # packed ahead (the combine passes) with the tiles walked row by row
    "ahead-rows-first": ((130, 64, 48), "float32", {**SMALL, "bands": 0, "tiles_by_row": True}),
    "ahead-strassen2-rows-first": ((152, 64, 64), "float32", {**SMALL, "bands": 0, "fused": False,
                                                              "tiles_by_row": True}),
    # row tiles inside chunks of 32 columns (knob chunk_cols): 4 column tiles a task, 2 a chunk
    "ahead-chunked": ((130, 128, 48), "float32", {**SMALL, "nc": 64, "bands": 0, "tiles_by_row": True,
                                                  "chunk_cols": 32}),
    "ahead-strassen-chunked": ((76, 128, 96), "float32", {**SMALL, "nc": 64, "bands": 0, "tiles_by_row": True,
                                                          "chunk_cols": 32}),
    # a 3×3×3 grid, float64
    "laderman-float64": ((54, 48, 48), "float64", {"mr": 6, "nr": 8, "mc": 12, "nc": 8, "kc": 8, "ku": 4,
                                                   "bands": 2}),
}
TARGET = {"sse-default": "x86_64"}
ALGO = {"strassen-rowtail": "strassen", "ahead-strassen-chunked": "strassen", "strassen-rows-first": "strassen", "ahead-strassen2-rows-first": "strassen^2", "strassen-shared-b-3bands": "strassen", "strassen-b-per-band": "strassen", "strassen2-stored-h": "strassen^2", "laderman-float64": "laderman"}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("cpu_blocked")
    keys = list(JOBS)
    res = build_many([dict(algo=ALGO.get(k, "gemm"), target=TARGET.get(k, AVX2), shape=JOBS[k][0], dtype=JOBS[k][1],
                           config=JOBS[k][2], name=f"blocked-{k}", out_dir=out) for k in keys])
    return dict(zip(keys, res))


@pytest.mark.parametrize("key", [k for k in JOBS if k != "padded-k"])
def test_blocked_gemm_matches_float64_and_prepared(built, key):
    import lcmac
    p = _get(built, key)
    f = lcmac.load(p)
    m = f.manifest
    assert m.extra["packing"] == ("ahead" if key.startswith("ahead-") else "blocked")
    dt = np.dtype(m.dtype)
    rng = np.random.default_rng(5)
    A = _guarded(rng.standard_normal((m.M, m.K)).astype(dt))     # a read past A's end faults
    B = rng.standard_normal((m.K, m.N)).astype(dt)
    C = np.full((m.M + 2, m.N), np.nan, dt)                       # rows past M stay NaN
    f(A, B, out=C[:m.M])
    ref = A.astype(np.float64) @ B.astype(np.float64)
    err = np.linalg.norm(C[:m.M] - ref) / np.linalg.norm(ref)
    assert err < (1e-5 if dt == np.float32 else 1e-13), f"{key}: relative error {err:.3g}"
    assert np.isnan(C[m.M:]).all()
    prepared = f(A, f.prepare_b(B))
    assert np.array_equal(prepared, C[:m.M])


def test_shapes_needing_zero_padding_pack_ahead(built):
    """K = 45 is not whole kc chunks: the knob is kept, the packing passes run, and the
    result is still right."""
    import lcmac
    p = _get(built, "padded-k")
    f = lcmac.load(p)
    assert f.manifest.extra["packing"] == "ahead" and f.manifest.config["bands"] == 2
    assert "k needs zero padding" in f.manifest.extra["packing_note"]        # lcmac build says it
    assert "packing_note" not in Manifest.read(_get(built, "rowtail")).extra
    rng = np.random.default_rng(6)
    A = rng.standard_normal((50, 45)).astype(np.float32)
    B = rng.standard_normal((45, 32)).astype(np.float32)
    ref = A.astype(np.float64) @ B.astype(np.float64)
    assert np.linalg.norm(f(A, B) - ref) / np.linalg.norm(ref) < 1e-5


def test_source_packs_inside_the_tasks(built):
    """The blocked stage has no whole-matrix packed buffers, packs the band's A once per kc
    chunk (before the loop over column blocks, not inside it) and B row by row, and the
    prepared entry packs only A (B̃ comes from the caller)."""
    p = _get(built, "rowtail")
    src = (p.parent / Manifest.read(p).extra["source"]).read_text()
    plain, prepared = src.split("def lcmac_matmul_prepare_b")[0], src.split("def lcmac_matmul_prepared(")[1]
    assert "Bc = T.decl_buffer" in plain and "Ab = T.decl_buffer" in plain
    assert "Ap = T.alloc_buffer" not in plain and "Bp = T.alloc_buffer" not in plain
    assert plain.index("] = A[") < plain.index("for tn in range(") < plain.index("] = B[")
    # B is packed row by row (each row's nc columns one run), panels inside
    pack_b = plain[plain.index("for tn in range("):plain.index("] = B[")]
    assert re.search(r"for k in range\(\d+\):\s+for jr in range\(\d+\):\s+for u in T\.vectorized", pack_b)
    assert "Bc" not in prepared and "Ab = T.decl_buffer" in prepared


def test_tiles_by_row_walks_a_row_of_tiles_innermost(built):
    """Knob tiles_by_row puts the loop over a block's column tiles (jr) inside the loop over
    its row tiles (ir), packed per block or ahead, plain or LCMA; by default the reverse."""
    for key, by_row in (("rows-first", True), ("strassen-rows-first", True), ("ahead-rows-first", True),
                        ("ahead-strassen2-rows-first", True), ("rowtail", False), ("strassen-rowtail", False)):
        p = _get(built, key)
        m = Manifest.read(p)
        plain = (p.parent / m.extra["source"]).read_text().split("def lcmac_matmul_prepare_b")[0]
        nests = re.findall(r"for (ir|jr) in range\(\d+\):\n\s+for (ir|jr) in range\(\d+\):", plain)
        assert nests and all(n == (("ir", "jr") if by_row else ("jr", "ir")) for n in nests), (key, nests)
        assert m.config["tiles_by_row"] == by_row


def test_chunk_cols_walks_row_tiles_inside_column_chunks(built):
    """Knob chunk_cols (with tiles_by_row): a task's column tiles in chunks, each walked row
    tile by row tile; its errors name the knob."""
    for key in ("ahead-chunked", "ahead-strassen-chunked"):
        p = _get(built, key)
        plain = (p.parent / Manifest.read(p).extra["source"]).read_text().split("def lcmac_matmul_prepare_b")[0]
        assert re.search(r"for jo in range\(2\):\s+for ir in range\(\d+\):\s+for ji in range\(2\):\s+"
                         r"jr = jo \* 2 \+ ji", plain), key
    t = get_target(AVX2)
    with pytest.raises(ValueError, match="needs tiles_by_row"):
        resolve_config(t, "float32", {"chunk_cols": 32}, None, shape=(64, 64, 64))
    with pytest.raises(ValueError, match="multiple of nr=16"):
        resolve_config(t, "float32", {"chunk_cols": 24, "tiles_by_row": True}, None, shape=(64, 64, 64))
    with pytest.raises(ValueError, match="whole number"):
        resolve_config(t, "float32", {"chunk_cols": -16, "tiles_by_row": True}, None, shape=(64, 64, 64))


def test_lcma_sums_its_blocks_as_it_packs(built):
    """An LCMA packing per block has no combine passes for A or B and no whole-matrix packed
    buffers in ``lcmac_matmul``: each product's chunk of A is staged and summed into the band
    buffer, its chunk of B summed row by row; H is stored and combined (Strassen²) or added
    into C in the epilogue (Strassen); the manifest says so."""
    for key, stored in (("strassen2-stored-h", True), ("strassen-rowtail", False)):
        p = _get(built, key)
        m = Manifest.read(p)
        src = (p.parent / m.extra["source"]).read_text()
        plain = src.split("def lcmac_matmul_prepare_b")[0]
        assert m.extra["packing"] == "blocked"
        assert "Combine A" not in plain and "Combine B" not in plain
        assert "Ap = T.alloc_buffer" not in plain and "Bp = T.alloc_buffer" not in plain
        assert "At = T.decl_buffer" in plain and "] = At[0, v, u]" not in plain
        assert re.search(r"Ab\[.*\] = At\[0, v, ki\] [+-] At\[1, v, ki\]", plain)
        assert re.search(r"Bc\[.*\] = B\[.*\] [+-] B\[", plain)
        assert ("H = T.alloc_buffer" in plain) == stored and ("# Combine H (unfused" in plain) == stored
        # the prepared-B entry's whole B̃p is streamed out (read back from memory anyway)
        assert "# Combine B (group-parallel, packs B̃p, streamed)" in src.split("def lcmac_matmul_prepare_b")[1]


def test_lcma_bands_share_b_chunks_where_kc_splits(built):
    """Where kc rows split evenly over the bands, one B̃_r chunk is packed by all of them (a
    slice of rows each, in a parallel region before the tiles'); otherwise each band packs its
    own, inside its task.  The manifest says which."""
    for key, shared in (("strassen-shared-b-3bands", True), ("strassen-rowtail", True),
                        ("strassen-b-per-band", False)):
        p = _get(built, key)
        m = Manifest.read(p)
        plain = (p.parent / m.extra["source"]).read_text().split("def lcmac_matmul_prepare_b")[0]
        assert m.extra["b_chunks"] == ("shared by the bands" if shared else "one per band")
        assert ("Bc = T.alloc_buffer" in plain) == shared and ("Bc = T.decl_buffer" in plain) != shared
        if shared:
            assert plain.count("T.parallel(") == 2 + int("# Combine H (unfused" in plain)
            assert re.search(r"for k in range\(tm \* \d+, tm \* \d+ \+ \d+\):", plain)


def test_bands_mc_splits_block_rows_evenly():
    """Asking for bands without mc cuts mc for them: Strassen at 4096³ has 2048-row blocks,
    which mc 192 splits into 11 row blocks (one band idle for one block); 174 gives 12."""
    from lcmac.schedules.cpu_gemm import geometry
    s = catalogue.get("strassen")
    cfg = resolve_config(get_target(AVX2), "float32", {"bands": 2}, s, shape=(4096,) * 3)
    g = geometry(s.grid, 4096, 4096, 4096, cfg)
    assert g.nmc % 2 == 0 and g.BMP - g.BM <= 48
    assert resolve_config(get_target(AVX2), "float32", {"bands": 2, "mc": 192}, s, shape=(4096,) * 3).mc == 192


def test_default_config_per_target():
    """AVX2 (and plain x86-64) plain GEMMs pack per block, one band per thread, its LCMAs
    ahead; on AVX-512 float32 GEMMs and one-level LCMAs pack per block, LCMAs whose products
    sum more than two blocks of B (Strassen², Winograd²) ahead, streamed, other dtypes ahead
    (measured per target: docs/cpu.md)."""
    avx2, avx512 = get_target(AVX2), get_target("x86_64-avx512")
    s2 = catalogue.get("strassen^2")
    assert default_config(avx2, "float32", None, shape=(4096, 4096, 4096), threads=3).bands == 3
    assert default_config(avx2, "float32", catalogue.get("strassen"), shape=(4096,) * 3).bands == 0
    gemm = default_config(avx512, "float32", None, shape=(4096,) * 3, threads=2)
    strassen = catalogue.get("strassen")          # H stored from 2048² blocks on, fused below
    one = default_config(avx512, "float32", strassen, shape=(4096,) * 3, threads=2)
    assert (gemm.bands, gemm.kc, gemm.ku, one.bands, one.kc, one.fused) == (2, 512, 8, 2, 1024, False)
    # the plain GEMM's tiles row by row past a 512 × 512 chunk of B (1 MiB: half the 2 MiB L2);
    # LCMAs column by column, and AVX2, whose B micro-panel fits in L1
    assert (gemm.tiles_by_row, gemm.nc, one.tiles_by_row) == (True, 512, False)
    assert not default_config(avx2, "float32", None, shape=(4096,) * 3).tiles_by_row
    for N, nc in ((7168, 512), (1536, 512), (11008, 256)):      # B's columns tiled exactly
        assert default_config(avx512, "float32", None, shape=(2048, N, 2048)).nc == nc
    assert one.mc == 342        # the 2048 rows of a block in two equal bands of 3 blocks (4 padded)
    assert default_config(avx512, "float32", strassen, shape=(2048,) * 3).fused
    for name in ("strassen^2", "winograd^2"):
        two = default_config(avx512, "float32", catalogue.get(name), shape=(4096,) * 3, threads=2)
        assert (two.bands, two.stream, two.kc, two.fused, two.mc) == (0, True, 1024, False, 516)
    assert default_config(avx512, "float32", catalogue.get("winograd"), shape=(4096,) * 3).bands == 2
    # beyond AHEAD_MAX_BYTES of packed operands (8192³: 1.57 GB) two levels pack per block again
    big = default_config(avx512, "float32", s2, shape=(8192,) * 3, threads=2)
    assert (big.bands, big.stream) == (2, False)
    # knobs named over the default: per block again, without the streaming it replaces
    named = resolve_config(avx512, "float32", {"bands": 2}, s2, shape=(4096,) * 3)
    assert (named.bands, named.stream) == (2, False)
    assert default_config(avx512, "bfloat16", None, shape=(4096,) * 3).bands == 0
    # a knob that packs otherwise turns the default bands off (vendor_base with bands is moot)
    assert resolve_config(avx512, "float32", {"vendor_base": True}, s2, shape=(4096,) * 3).bands == 0
    assert resolve_config(avx512, "float32", {"bands": 0}, s2, shape=(4096,) * 3).bands == 0


@pytest.mark.parametrize("M, bands", [(4096, 2), (4096, 1), (2048, 2), (1000, 2), (96, 2), (130, 3)])
def test_default_row_blocks_split_evenly_with_little_padding(M, bands):
    """The default mc gives every band the same number of row blocks and pads few rows (mc =
    192 at 4096 rows padded 128, 3 % of the flops)."""
    from lcmac.schedules.cpu_gemm import geometry
    cfg = default_config(get_target(AVX2), "float32", None, shape=(M, 64, 64), threads=bands)
    g = geometry((1, 1, 1), M, 64, 64, cfg)
    assert g.nmc % bands == 0 and g.MC == cfg.mc
    assert g.BMP - M <= max(6 * bands, M // 50)
    if M == 4096:
        assert g.BMP - M <= 8


def test_stream_default_and_errors():
    """Streamed packing is the AVX2 LCMAs' default where their packed operands outgrow the
    profile's last-level cache (32 MiB), and the AVX-512 float32 default of LCMAs that pack
    ahead; knobs that pack otherwise turn the default off and refuse it when asked for."""
    avx2 = get_target(AVX2)
    s2 = catalogue.get("strassen^2")
    assert default_config(avx2, "float32", s2, shape=(4096,) * 3).stream
    assert not default_config(avx2, "float32", s2, shape=(1024,) * 3).stream     # 12.8 MB
    assert not default_config(avx2, "float32", None, shape=(4096,) * 3).stream
    avx512 = get_target("x86_64-avx512")     # there: two levels stream, one level packs per block
    assert default_config(avx512, "float32", s2, shape=(4096,) * 3).stream
    assert not default_config(avx512, "float32", catalogue.get("strassen"), shape=(4096,) * 3).stream
    assert not resolve_config(avx2, "float32", {"vendor_base": True}, s2, shape=(4096,) * 3).stream
    for bad in ({"stream": True, "vendor_base": True}, {"stream": True, "bands": 2}):
        with pytest.raises(ValueError, match="stream"):
            resolve_config(avx2, "float32", bad, s2, shape=(4096,) * 3)
    with pytest.raises(ValueError, match="stream"):
        CpuConfig(stream=1).validate(8)


def test_bands_errors(tmp_path, caplog):
    for bad in (-1, True, 1.5):
        with pytest.raises(ValueError, match="bands"):
            CpuConfig(bands=bad).validate(8)
    # an LCMA whose blocks need zero padding (K = 30: 15-wide blocks): the knob is kept, the
    # packing (combine) passes run, and the result is right
    import lcmac
    caplog.set_level("INFO", logger="lcmac")                    # the note is logged, not printed
    p = build("strassen", AVX2, "float32", (36, 32, 30), config={**SMALL, "bands": 2}, out_dir=tmp_path)
    f = lcmac.load(p)
    assert f.manifest.extra["packing"] == "ahead" and f.manifest.config["bands"] == 2
    assert "bands=2 not taken: k needs zero padding" in f.manifest.extra["packing_note"]
    assert "bands=2 not taken" in caplog.text                     # said when bands was asked for
    rng = np.random.default_rng(7)
    A, B = rng.standard_normal((36, 30)), rng.standard_normal((30, 32))
    ref = A @ B
    assert np.linalg.norm(f(A.astype(np.float32), B.astype(np.float32)) - ref) / np.linalg.norm(ref) < 1e-5


def test_a_tuned_record_from_before_bands_says_the_build_differs(monkeypatch):
    """A plain-GEMM record logged before ``bands`` existed measured packing ahead; the build
    fills the knob with today's default (blocked) and says its time is not this build's.  An
    LCMA's record gets the knob's old value (0), and a note for ``stream`` only (at 4096³ its
    default, streamed, is not what such a record measured)."""
    from lcmac.artifact import build as build_mod
    old = {"mr": 6, "nr": 16, "mc": 192, "nc": 1024, "kc": 256, "ku": 4, "fused": True,
           "bf16_dot": False, "amx": False, "vendor_base": False}
    record = {"shape": [4096] * 3, "time_s": 0.9, "device": "test"}
    monkeypatch.setattr(build_mod.db, "best_config", lambda *a, **k: (dict(old), record, True))
    t = get_target(AVX2)
    notes = []
    cfg = build_mod.build_config(t, "float32", None, None, True, (4096,) * 3, notes=notes)
    assert cfg["bands"] > 0 and cfg["mc"] == 192
    assert any("predates knob(s) bands" in n for n in notes), notes
    notes = []
    cfg = build_mod.build_config(t, "float32", None, catalogue.get("strassen"), False, (4096,) * 3, notes=notes)
    assert cfg["bands"] == 0 and cfg["stream"], cfg
    assert [n for n in notes if "predates" in n and "knob(s) stream;" in n], notes


def test_a_tuned_record_from_before_tiles_by_row_keeps_its_tile_order(monkeypatch):
    """A plain-GEMM record logged before ``tiles_by_row`` chose its nc for tiles walked column
    by column: on AVX-512 it is built so (today's default walks rows past an L2-sized chunk,
    which a 1536-wide chunk overflows); a record that names the knob keeps its value."""
    from lcmac.artifact import build as build_mod
    old = {"mr": 6, "nr": 64, "mc": 342, "nc": 1536, "kc": 512, "ku": 8, "fused": True, "bf16_dot": False,
           "amx": False, "vendor_base": False, "bands": 2, "stream": False}
    record = {"shape": [2048, 1536, 7168], "time_s": 0.1, "device": "test"}
    t = get_target("x86_64-avx512")
    assert default_config(t, "float32", None, shape=(2048, 1536, 7168)).tiles_by_row
    for logged, by_row in ((old, False), ({**old, "nc": 512, "tiles_by_row": True}, True)):
        monkeypatch.setattr(build_mod.db, "best_config", lambda *a, **k: (dict(logged), record, True))
        notes = []
        cfg = build_mod.build_config(t, "float32", None, None, True, (2048, 1536, 7168), notes=notes)
        assert (cfg["tiles_by_row"], cfg["nc"]) == (by_row, logged["nc"])
        assert not [n for n in notes if "predates" in n], notes
