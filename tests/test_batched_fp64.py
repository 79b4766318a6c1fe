"""float64 batched products without a GPU: the tiles and templates float64 gets, the requests
refused (by name, before any compiler runs), "auto" leaving float64 to torch.bmm, and the
kernel's CUDA generated for sm_90a (fp64 mma.sync, float64 accumulators, the batch an
argument)."""

import numpy as np
import pytest

from lcmac.artifact.build import check_dtype
from lcmac.api.bmm import batched_kernel, bmm
from lcmac.costmodel.small import predict_batched
from lcmac.core.errors import DTypeError
from lcmac.policy.batched import choose_batched
from lcmac.schedules.cuda.batched_tiles import batched_template, small_tile_defaults
from lcmac.spec.cuda.config import CudaConfig
from lcmac.spec.cuda.dtypes import accum_dtype, batched_only_why
from lcmac.spec.targets import get_target
from tests.schedules.cuda.test_cuda_codegen import needs_tilelang
from tests.test_batched import generated


def test_float64_tiles_stay_on_the_small_template():
    assert CudaConfig().bk("float64") == 16 and accum_dtype("float64") == "float64"
    assert accum_dtype("bfloat16") == accum_dtype("float32") == "float32"
    for side in (16, 128, 129, 512, 4096):
        assert batched_template("auto", side, side, "float64") == "small"
        assert batched_template(None, side, 16, "float64") == "small"
    assert batched_template("auto", 512, 512, "bfloat16") == "gemm"          # the others unchanged
    want = {16: (16, 32, 16, 2), 33: (64, 128, 16, 2), 64: (64, 128, 16, 2),
            100: (128, 256, 1, 3), 128: (128, 256, 1, 3), 512: (128, 256, 1, 3)}
    for n, (tile, threads, per_cta, stages) in want.items():
        t = small_tile_defaults(n, n, n, "float64")
        assert (t["block_m"], t["block_n"], t["threads"], t["products_per_cta"], t["stages"]) == \
            (tile, tile, threads, per_cta, stages), n
        assert t["block_k"] == 16 and t["policy"] == "square" and "batched_template" not in t
    assert small_tile_defaults(32, 32, 32, "float64")["threads"] == 32
    assert small_tile_defaults(128, 128, 16, "float64")["stages"] == 1          # one slab, one product
    # a 128² stage (A and B slabs) is 32 KiB; three fit beside nothing else
    t = small_tile_defaults(256, 256, 256, "float64")
    assert t["stages"] * (t["block_m"] + t["block_n"]) * t["block_k"] * 8 == 96 * 1024
    s = small_tile_defaults(17, 19, 300, "float64", "splitk")
    assert (s["block_m"], s["block_k"], s["threads"]) == (32, 64, 128)         # 16 deep a warp


def test_float64_requests_the_kernels_cannot_serve_are_refused_by_name():
    with pytest.raises(DTypeError, match="production GEMM template .* has no float64.*wgmma"):
        batched_template("gemm", 512, 512, "float64")
    with pytest.raises(DTypeError, match="no float64"):           # before any build is tried
        batched_kernel("cuda-sm90a", "float64", (256, 256, 256), {"batched_template": "gemm"})
    t = get_target("cuda-sm90a")
    check_dtype(t, "float64")                   # the plain GEMM and Algorithm 1 (test_cuda_fp64)
    with pytest.raises(DTypeError, match="fused kernel .* has no float64"):
        check_dtype(t, "float64", '{"fused": true}')
    check_dtype(t, "float64", {"batched": True})
    check_dtype(t, "float64", '{"batched": true, "policy": "splitk"}')
    assert batched_only_why("bfloat16", None) is None and batched_only_why("float64", {"batched": 1}) is None
    from lcmac.targets.tilelang_worker import Request  # parses without TileLang
    for config, text in (({"fused": True}, "fused kernel .* has no float64"),
                         ({"batched": True, "batched_template": "gemm"}, "no float64")):
        with pytest.raises(DTypeError, match=text):
            Request.parse({"target": "cuda-sm90a", "dtype": "float64", "shape": [64, 64, 64],
                           "config": config})
    rq = Request.parse({"target": "cuda-sm90a", "dtype": "float64", "shape": [512, 512, 512],
                        "config": {"batched": True}, "compile": False})
    assert (rq.config.block_m, rq.config.threads, rq.config.batched_template) == (128, 256, "auto")


def test_auto_leaves_float64_to_the_vendor():
    for shape in ((8, 8, 8), (16, 16, 16), (16, 16, 256), (32, 32, 512), (64, 64, 64), (256, 256, 256)):
        for batch in (1000, 100_000, 10 ** 6):
            assert choose_batched("cuda", "float64", *shape, batch, tf32=True) is None, shape
    # the CPU path of "gemm" is the float64 reference, float64 in and out
    rng = np.random.default_rng(0)
    A, B = rng.standard_normal((3, 9, 10)), rng.standard_normal((3, 10, 11))
    assert np.allclose(bmm(A, B, algo="gemm"), A @ B, rtol=1e-13, atol=1e-13)


def test_float64_model_counts_no_producer_warpgroup():
    tile = small_tile_defaults(16, 16, 16, "float64")
    e = predict_batched(16, 16, 16, "float64", 10000, tile)
    # 32 threads a CTA and no producer warpgroup (cp.async copies): shared memory bounds it,
    # 8 KiB a CTA; with the TMA-fed kernels' 128 producer threads it would be 2048 / 160 = 12
    assert e.ctas_per_sm == 28
    assert e.t_memory == pytest.approx(10000 * 3 * 256 * 8 / 3.35e12, rel=1e-3)


_GEN = """
import json, sys
from lcmac.targets import tilelang_worker as w
out = {}
for key, shape, cfg in (("16", [16, 16, 16], {}), ("100", [100, 100, 100], {}),
                        ("200", [200, 136, 72], {}), ("splitk", [16, 16, 256], {"policy": "splitk"})):
    r = w.build({"algorithm": None, "target": "cuda-sm90a", "dtype": "float64", "shape": shape,
                 "config": {"batched": True, **cfg}, "out_dir": sys.argv[1] + "/" + key,
                 "name": "lcmac", "compile": False})
    out[key] = {"kernel": open(r["sources"][0]).read(), "grid": r["kernels"][0]["grid"],
                "config": r["config"], "precision": r["gemm_precision"]}
for name, shape, cfg in (("fused", [64, 64, 64], {"fused": True}),
                         ("gemm", [256, 256, 256], {"batched": True, "batched_template": "gemm"})):
    try:
        w.build({"algorithm": None, "target": "cuda-sm90a", "dtype": "float64", "shape": shape,
                 "config": cfg, "out_dir": sys.argv[1] + "/" + name, "compile": False})
    except Exception as e:
        out[name] = type(e).__name__ + ": " + str(e)
print(json.dumps(out))
"""


@needs_tilelang
def test_float64_kernel_generates_for_sm90a(tmp_path):
    out = generated(_GEN, tmp_path)
    mma = "mma_sync<tl::DataType::kFloat64, tl::DataType::kFloat64, tl::DataType::kFloat64, 8, 8, 4"
    for key in ("16", "100", "200", "splitk"):
        src = out[key]["kernel"]
        assert "(const double* A, const double* B, double* C, int batch)" in src, key
        assert mma in src, key                             # fp64 tensor cores: m8n8k4 mma.sync
        assert "wgmma" not in src and "tma_load" not in src, key     # no fp64 wgmma; cp.async copies
        assert "cp_async" in src and "float" not in src.replace("float64", ""), key   # no fp32 anywhere
        assert "batch" in str(out[key]["grid"][0]) and out[key]["precision"] == "float64", key
    assert "double C_l[8]" in out["16"]["kernel"]            # a 16² tile's accumulators, one warp
    assert "double C_l[64]" in out["100"]["kernel"]          # 128² over 8 warps: 64 doubles a thread
    assert out["100"]["config"]["threads"] == 256 and out["200"]["grid"][1] == 4     # 2×2 tiles of 128²
    assert "cp_async_gs_conditional" in out["100"]["kernel"]  # partial tiles: bounds-checked, zero-filled
    assert "P_s" in out["splitk"]["kernel"] and "(double*)P_s" in out["splitk"]["kernel"]
    assert out["fused"].startswith("DTypeError") and "has no float64" in out["fused"]
    assert out["gemm"].startswith("DTypeError") and "no float64" in out["gemm"]
