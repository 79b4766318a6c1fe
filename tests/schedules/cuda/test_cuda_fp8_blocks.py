"""The CUDA backend's fp8 operand mode on the block-scaled contract (lcmac.spec.fp8), without
a GPU: the scale buffers' layout the entry point lays out is the spec's (and cuBLAS's
scale_b), the tile limits, and the generated GEMM stage — TMA + fp8 wgmma, warp-specialised,
per-K-block promotion by SA[row]·SB with SB one scalar per 128 columns read once before the
K loop.  The kernels against the reference on a GPU: tests/test_fp8_cuda.py."""
from __future__ import annotations

import os
import re

import numpy as np
import pytest

from lcmac.core.errors import LcmacError
from lcmac.spec import fp8
from lcmac.spec.cuda.blocking import ceil_div
from lcmac.spec.cuda.config import CudaConfig
from lcmac.spec.cuda.operands import check_operands, fp8_scale_shapes, fp8_tile_scale_blocks
from tests.schedules.cuda.test_cuda_codegen import kernel_body, needs_nvcc, needs_tilelang, worker

#: a ragged plain GEMM (5 K blocks, the last partial; a partial N block) and its artifact
SHAPE = (1000, 1064, 1032)


def test_scale_shapes_pad_to_the_tile_and_to_16_bytes():
    # SA [R, nkb, Mb'], SB [R, Nb', L4]: Mb' to the tile, L4 = nkb to 4, Nb' to the tile's blocks
    assert fp8_scale_shapes(7, 500, 532, 528, 128, 128) == {"SA": (7, 5, 512), "SB": (7, 5, 8)}
    assert fp8_scale_shapes(1, 1000, 1064, 1032, 128, 64) == {"SA": (1, 9, 1024), "SB": (1, 9, 12)}
    assert fp8_scale_shapes(1, 1000, 1064, 1032, 128, 256)["SB"] == (1, 10, 12)
    # 192-column tiles: the last (columns 960..1151) reads blocks 7 and 8, past 1064's nine
    assert fp8_scale_shapes(1, 1000, 1064, 1032, 128, 192)["SB"] == (1, 9, 12)
    assert fp8_scale_shapes(1, 1000, 1200, 1032, 128, 192)["SB"] == (1, 11, 12)   # tile 1152.. reads 9, 10


@pytest.mark.parametrize("block_n,blocks", [(64, 1), (128, 1), (256, 2), (192, 2), (96, 2), (160, 2), (224, 3)])
def test_a_tile_meets_the_scale_blocks_its_columns_fall_in(block_n, blocks):
    # brute force over tile starts: the most 128-column blocks one tile's columns fall in
    most = max(len({c // 128 for c in range(t * block_n, (t + 1) * block_n)}) for t in range(128))
    assert fp8_tile_scale_blocks(block_n) == most == blocks


def test_fp8_tiles_are_one_wgmma_wide():
    for bn in (64, 96, 192, 256):
        check_operands(CudaConfig.from_dict({"operands": "fp8", "block_n": bn}), "bfloat16")
    for bn in (100, 272):
        with pytest.raises(LcmacError, match="block_n a multiple of 16"):
            check_operands(CudaConfig.from_dict({"operands": "fp8", "block_n": bn}), "bfloat16")


def test_kernel_scales_are_the_reference_in_the_kernels_and_cublas_layout():
    """``kernel_scales`` (what the GPU tests compare the workspace with) puts every
    reference scale where the kernels index it, and B̃_r's SB is cuBLAS's scale_b storage
    ([L4, N/128], strides (1, L4)) as lcmac.torch.fp8 lays it out."""
    torch = pytest.importorskip("torch")
    tf = pytest.importorskip("lcmac.torch.fp8")
    rng = np.random.default_rng(3)
    M, N, K = 300, 400, 650
    A = rng.standard_normal((M, K)).astype(np.float32)
    B = rng.standard_normal((K, N)).astype(np.float32)
    blk = fp8.lcma_blocking(M, N, K, "strassen")
    at, bt = fp8.combine_then_quantize(A, "strassen", blocking=blk), fp8.prepare_b_fp8(B, "strassen", blocking=blk)
    ks = fp8.kernel_scales(at, bt)
    nkb, nbn = ceil_div(blk.Kb, 128), ceil_div(blk.Nb, 128)
    assert ks["SA"].shape == fp8_scale_shapes(7, blk.Mb, blk.Nb, blk.Kb, 128, 128)["SA"]
    for r, m, kb in ((0, 0, 0), (3, blk.Mb - 1, nkb - 1), (6, 77, 2)):
        assert ks["SA"][r, kb, m] == at.scales[r, m, kb]
    for r in range(7):
        # W = B̃_rᵀ: its [N/128, K/128] scales laid out for cuBLAS
        _, s_b, _ = tf.scaled_mm_args(torch.from_numpy(at.scales[r]), (1, 128),
                                      torch.from_numpy(bt.scales[r].T.copy()), (128, 128),
                                      (blk.Mb, blk.Nb, blk.Kb))
        flat = np.asarray(s_b.t().contiguous()).reshape(-1)          # its storage, [N/128][L4]
        assert np.array_equal(ks["SB"][r, :nbn].reshape(-1), flat)
    with pytest.raises(ValueError, match="1x128 and 128x128"):
        fp8.kernel_scales(at, fp8.prepare_b_fp8(B, "strassen", fp8.PER_COLUMN, blk))


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    """The plain fp8 GEMM at SHAPE, compiled (nvcc), and the same with 64-column tiles as
    source only."""
    d = tmp_path_factory.mktemp("fp8-plain")
    base = {"algorithm": None, "target": "cuda-sm90a", "dtype": "bf16", "shape": list(SHAPE)}
    r = worker({**base, "config": {"operands": "fp8"}, "out_dir": str(d / "a"), "jobs": 2})
    r64 = worker({**base, "config": {"operands": "fp8", "block_n": 64}, "out_dir": str(d / "b"),
                  "compile": False})
    return r, r64


def _sources(r) -> dict:
    return {os.path.basename(p): open(p).read() for p in r["sources"]}


@needs_tilelang
@needs_nvcc
def test_workspace_and_prepared_b_hold_the_specs_scale_buffers(plain):
    r, r64 = plain
    assert r["ok"], r.get("error")
    assert [k["name"] for k in r["kernels"]] == ["combine_a", "combine_b", "gemm"]
    assert r["gemm_precision"].startswith("fp8 e4m3 (A 1x128, B 128x128")
    for res, bn in ((r, 128), (r64, 64)):
        assert res["ok"], res.get("error")
        blk = fp8.lcma_blocking(*SHAPE)
        want = fp8_scale_shapes(1, blk.Mb, blk.Nb, blk.Kb, 128, bn)
        ws = dict(res["workspace"], __end__=res["workspace_bytes"])
        assert [n for n, _ in res["workspace"]] == ["At", "Bt", "SA", "SB"]
        assert ws["SB"] - ws["SA"] == -(-int(np.prod(want["SA"])) * 4 // 256) * 256
        assert ws["__end__"] - ws["SB"] == -(-int(np.prod(want["SB"])) * 4 // 256) * 256
        plan = res["extra"]["prepared_b"]
        assert plan["kernels"] == ["combine_b"]
        assert [b[0] for b in plan["buffers"]] == ["Bt", "SB"]
        assert plan["buffers"][1][2] == ws["__end__"] - ws["SB"]


@needs_tilelang
@needs_nvcc
def test_gemm_stage_promotes_each_k_block_by_the_block_scales(plain):
    r, r64 = plain
    assert r["ok"], r.get("error")
    g = kernel_body(_sources(r)["lcmac_cuda_gemm.cu"])
    assert "kFloat8_e4m3" in g and "wgmma" in g
    assert "warpgroup_reg_alloc" in g and "warpgroup_reg_dealloc" in g      # warp-specialised
    assert re.search(r"tma_load\(At_desc", g) and re.search(r"tma_load\(Bt_desc", g)
    loop = g.index("for (int ko")
    # SB: the tile's scales for the whole K read once before the K loop, never per stage
    pre = g[:loop]
    assert re.search(r"\(\(float\*\)sb\)\[[^]]*\] = SB\[", pre), pre[-600:]
    assert "SB[" not in g[loop:]
    # SA: one bulk copy per stage beside A's slab; the promotion multiplies by sa·sb[j, ko],
    # j chosen per column by a select where the default 192-column tile straddles two blocks
    assert re.search(r"tma_load\(\(&\(\(\(float\*\)sa\)", g)
    l4 = fp8_scale_shapes(1, SHAPE[0], SHAPE[1], SHAPE[2], 128, 192)["SB"][2]
    assert re.search(r"condval = \(\(float\*\)sb\)\[ko_1\];", g)
    assert re.search(rf"condval = \(\(float\*\)sb\)\[\(ko_1 \+ {l4}\)\];", g)
    assert re.search(r"\(\(float\*\)sa\)\[[^;]*\* condval\)", g)
    assert all(x == 0 for v in r["ptxas"].values() for x in v["spill_stores"]), r["ptxas"]
    # 64-column tiles: two CTAs share one 128-column scale block, read by index
    g64 = kernel_body(_sources(r64)["lcmac_cuda_gemm.cu"])
    assert re.search(r"\(\(float\*\)sa\)\[[^;]*\* \(\(float\*\)sb\)\[ko_1\]", g64)
    assert re.search(r"SB\[\(*\(\(int\)blockIdx\.x\) >> 1\)", g64), g64[:3000]
