"""lcmac.bmm's products wider than 128 on the production GEMM template
(``schedules.cuda.gemm.batched_products``, ``CudaConfig.batched_template``) without a GPU: which
template and tile a shape gets, the config's checks, and the CUDA the kernel generates for
sm_90a (TileLang, no GPU needed).  tests/test_batched_cuda.py runs it."""
import re

import pytest

from lcmac.core.errors import LcmacError
from lcmac.policy.batched import choose_batched
from lcmac.schedules.cuda.batched_tiles import (
    batched_template, gemm_batch_tile_defaults, persistent_why, small_tile_defaults)
from lcmac.spec.cuda.config import CudaConfig
from lcmac.spec.cuda.smem import SMEM_PER_CTA
from tests.schedules.cuda.test_cuda_codegen import kernel_body, needs_tilelang, worker


def test_auto_keeps_the_small_template_up_to_128_per_side():
    for M, N in ((16, 16), (128, 128), (128, 64), (1, 128)):
        assert batched_template("auto", M, N) == "small" == batched_template(None, M, N)
    for M, N in ((129, 16), (16, 129), (256, 256), (300, 257), (1024, 1024)):
        assert batched_template("auto", M, N) == "gemm"
    assert batched_template("small", 512, 512) == "small" and batched_template("gemm", 16, 16) == "gemm"
    # the small template's tiles are unchanged where it runs
    assert small_tile_defaults(128, 128, 128, "bfloat16")["threads"] == 128
    assert small_tile_defaults(16, 16, 16, "bfloat16")["products_per_cta"] == 16


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_wide_products_get_the_gemm_templates_tile(dtype):
    item = 4 if dtype == "float32" else 2
    for n in (256, 512, 1024):
        t = small_tile_defaults(n, n, n, dtype)
        assert t == gemm_batch_tile_defaults(n, n, n, dtype)
        assert (t["block_m"], t["block_n"], t["threads"], t["batched_template"]) == (128, 256, 256, "gemm")
        assert t["block_k"] == (32 if dtype == "float32" else 64) and t["store_via_smem"] and t["swizzle"] == 8
        assert t["products_per_cta"] == 1 and t["policy"] == "auto"
        # the persistent grid for 2-byte dtypes (float32's TF32 stage has none): its C tile
        # beside the pipeline; the one-tile grid's aliases the drained pipeline
        assert t["persistent"] == (item == 2)
        stage = (t["block_m"] + t["block_n"]) * t["block_k"] * item
        c_tile = t["block_m"] * t["block_n"] * item if t["persistent"] else 0
        assert t["stages"] == (3 if item == 2 else 4) and t["stages"] * stage + c_tile <= SMEM_PER_CTA["sm_90a"]
        assert small_tile_defaults(n, n, n, dtype, persistent=False)["stages"] == 4
        CudaConfig(batched=True, **t).check()
        # sm_80: no persistent grid, stages within its 163 KB
        t80 = small_tile_defaults(n, n, n, dtype, arch="sm_80")
        assert not t80["persistent"] and t80["stages"] * stage <= SMEM_PER_CTA["sm_80"] < 4 * stage
    # 128-wide columns where 256-wide tiles would pad N more (384: a third idle)
    assert small_tile_defaults(384, 384, 384, dtype)["block_n"] == 128
    assert small_tile_defaults(300, 257, 513, dtype)["block_n"] == 128
    assert small_tile_defaults(129, 129, 16, dtype)["block_n"] == 256
    assert small_tile_defaults(512, 100, 512, dtype)["block_n"] == 128
    assert small_tile_defaults(256, 256, 40, dtype)["block_k"] == (32 if item == 4 else 48)  # K in 16s
    # rows that are not 16-byte multiples: no TMA, so the grid kernel (the persistent walk's
    # run-time trip count is pipelined for TMA copies only)
    assert not small_tile_defaults(129, 129, 129, dtype)["persistent"]
    assert persistent_why(129, 128, dtype) and persistent_why(128, 129, dtype) and not persistent_why(136, 8, "bfloat16")
    # the small template's wide tile, still to be had by name
    old = small_tile_defaults(256, 256, 256, dtype, template="small")
    assert (old["block_n"], old["stages"], old["policy"]) == (256, 3, "fullrow")
    assert "batched_template" not in old


def test_the_kernel_cache_key_names_the_gemm_template(monkeypatch):
    """A kernel cached before wide products moved to the GEMM template is not served for them:
    the requested config (the CUDA cache key's) names the template."""
    import lcmac.api.bmm as batched
    seen = []

    class Loaded:
        def get(self, key, spec, kw):
            seen.append(kw["config"])
    monkeypatch.setattr(batched, "LOADED", Loaded())
    batched.batched_kernel("cuda-sm90a", "bfloat16", (256, 256, 256))
    batched.batched_kernel("cuda-sm90a", "bfloat16", (128, 128, 128))
    batched.batched_kernel("cuda-sm90a", "bfloat16", (256, 256, 256), {"batched_template": "small"})
    batched.batched_kernel("cuda-sm90a", "float32", (300, 257, 513), {"persistent": False})
    assert seen == [{"batched": True, "batched_template": "gemm"}, {"batched": True},
                    {"batched": True, "batched_template": "small"},
                    {"batched": True, "persistent": False, "batched_template": "gemm"}]


def test_the_build_fits_the_stages_to_the_tile_asked_for():
    from lcmac.targets.tilelang_worker import Request
    req = {"algorithm": None, "target": "cuda-sm90a", "dtype": "bfloat16", "shape": [384, 384, 384]}
    cfg = Request.parse({**req, "config": {"batched": True}}).config
    assert (cfg.block_n, cfg.stages, cfg.persistent, cfg.batched_template) == (128, 4, True, "gemm")
    # 256-wide: 48 KB a stage beside a 64 KB C tile in 227 KB: 3 (the defaults' 4 would not fit)
    cfg = Request.parse({**req, "config": {"batched": True, "block_n": 256}}).config
    assert (cfg.block_n, cfg.stages) == (256, 3)
    cfg = Request.parse({**req, "config": {"batched": True, "block_n": 256, "persistent": False}}).config
    assert (cfg.stages, cfg.persistent) == (4, False)
    cfg = Request.parse({**req, "config": {"batched": True, "stages": 2}}).config
    assert cfg.stages == 2
    cfg = Request.parse({**req, "target": "cuda-sm80", "config": {"batched": True}}).config
    assert not cfg.persistent and cfg.stages * (128 + 128) * 64 * 2 <= SMEM_PER_CTA["sm_80"]


def test_auto_takes_the_gemm_template_only_where_it_won():
    """float32 (TF32 allowed) at 256³ from 20 000 products; bf16 lost at every size, float32 from
    384³ up (docs/batched.md)."""
    assert choose_batched("cuda", "float32", 256, 256, 256, 20_000, tf32=True) == {}
    assert choose_batched("cuda", "float32", 256, 256, 256, 19_999, tf32=True) is None
    assert choose_batched("cuda", "float32", 256, 256, 256, 100_000, tf32=False) is None
    for n in (128, 200, 384, 512, 1024):
        assert choose_batched("cuda", "float32", n, n, n, 100_000, tf32=True) is None, n
    for dtype in ("bfloat16", "float16"):
        for n in (256, 384, 512, 1024):
            assert choose_batched("cuda", dtype, n, n, n, 100_000) is None
    assert choose_batched("cuda", "float32", 256, 256, 128, 100_000, tf32=True) is None   # K not measured
    assert choose_batched("cuda", "float32", 256, 255, 256, 100_000, tf32=True) is None   # rows not 16 bytes


def test_the_gemm_template_refuses_the_small_templates_knobs():
    with pytest.raises(LcmacError, match="batched_template must be"):
        CudaConfig(batched=True, batched_template="big").check()
    with pytest.raises(LcmacError, match="one product per CTA"):
        CudaConfig(batched=True, batched_template="gemm", products_per_cta=4).check()
    with pytest.raises(LcmacError, match="one product per CTA"):
        CudaConfig(batched=True, batched_template="gemm", policy="splitk", block_k=64, threads=128).check()
    CudaConfig(batched=True, batched_template="small", products_per_cta=4).check()


def _generate(dtype, shape, config, out_dir, target="cuda-sm90a"):
    r = worker({"algorithm": None, "target": target, "dtype": dtype, "shape": list(shape),
                "config": {"batched": True, **config}, "out_dir": str(out_dir), "name": "lcmac",
                "compile": False})
    assert r["ok"], r.get("error")
    kernel, entry = (open(p).read() for p in r["sources"])
    return kernel, entry, r


def _launcher_args(src: str) -> list[str]:
    call = re.search(r"int lcmac_bmm_call\(([^)]*)\)", src).group(1)
    return [p.split()[-1].split("=")[0] for p in call.split(",")][:-1]


@needs_tilelang
def test_the_grid_kernel_generates_for_sm90a(tmp_path):
    src, entry, r = _generate("bfloat16", (256, 256, 256), {"persistent": False}, tmp_path / "bf16")
    cfg, (k,) = r["config"], r["kernels"]
    assert cfg["batched_template"] == "gemm" and cfg["block_n"] == 256 and cfg["stages"] == 4
    # the entry passes A, B, C, batch: the launcher takes them in that order
    assert _launcher_args(src) == ["A", "B", "C", "batch"] == k["args"]
    assert "lcmac_run_batched" in entry
    # one kernel for any batch: a 1-D grid of batch × tiles CTAs (x, not y or z: no 65 535 cap)
    assert k["grid"] == ["batch * 2", 1, 1]
    assert k["block"] == [384, 1, 1]                       # 2 consumer warpgroups + the TMA producer
    body = kernel_body(src)
    assert "cudaGridDependencySynchronize" in body           # PDL: the previous kernel's writes
    assert "tma_load(A_desc" in body and "tma_load(B_desc" in body and "mbarrier" in body
    assert "wgmma" in body and "warpgroup_reg_alloc" in body  # warp-specialised consumers
    assert "stmatrix" in body and "tma_store(C_desc" in body   # C through shared memory by TMA
    # the product is the slowest index: C's TMA store takes it from blockIdx.x / 2 tiles
    store = re.search(r"tma_store\(C_desc,[^;]*\)", body).group(0)
    assert "((int)blockIdx.x) >> 1)" in store
    # the TMA descriptors are 3-D with the batch count as their outer dimension
    assert re.search(r"A_desc_globalDim\[3\]= \{256,256,batch\}", src)


@needs_tilelang
def test_partial_tiles_and_unaligned_rows(tmp_path):
    # rows of 16-byte multiples: TMA (it zero-fills and clips per dimension); 3 × 3 tiles of
    # 128×128 per product, walked by the persistent grid
    src, _, r = _generate("bfloat16", (300, 264, 520), {}, tmp_path / "bf16")
    body = kernel_body(src)
    assert r["config"]["block_n"] == 128 and r["config"]["persistent"]
    assert "tma_load(A_desc" in body and "tma_store(C_desc" in body and "batch * 9" in body
    # float32 300×257×513: rows not 16-byte multiples, so bounds-checked copies; TF32 mma
    src, _, r = _generate("float32", (300, 257, 513), {}, tmp_path / "f32")
    body = kernel_body(src)
    assert r["kernels"][0]["grid"] == ["batch * 9", 1, 1]      # 3 × 3 tiles, the grid kernel
    assert "tma_load" not in body and "kTensorFloat32" in body
    assert re.search(r"< 257\)\) \{\s*C\[", body)               # C's stores check its columns


@needs_tilelang
def test_persistent_grid_and_the_small_template_by_name(tmp_path):
    src, _, r = _generate("bfloat16", (512, 512, 512), {}, tmp_path / "p")
    (k,) = r["kernels"]
    assert k["grid"] == [132, 1, 1] and r["config"]["stages"] == 3   # a CTA per SM, C tile apart
    body = kernel_body(src)
    assert _launcher_args(src) == ["A", "B", "C", "batch"]
    assert re.search(r"for \(int it = 0; it < [^;]*batch", body)     # a walk of run-time length
    assert "tma_store(C_desc" in body and "cudaGridDependencySynchronize" in body
    # the small template's 128×256 kernel, by name: the old grid (x the product, y the tile)
    src, _, r = _generate("bfloat16", (256, 256, 256), {"batched_template": "small"}, tmp_path / "s")
    assert r["kernels"][0]["grid"] == ["batch", 2, 1] and "tma_store" not in kernel_body(src)
    for dtype, shape in (("float32", [512, 512, 512]), ("bfloat16", [64, 64, 64]), ("bfloat16", [129, 129, 129])):
        r = worker({"algorithm": None, "target": "cuda-sm90a", "dtype": dtype, "shape": shape,
                    "config": {"batched": True, "persistent": True}, "out_dir": str(tmp_path / dtype),
                    "name": "lcmac", "compile": False})
        assert not r["ok"] and "persistent" in r["error"]
    # sm_80: the grid kernel (cp.async, no TMA), stages within its shared memory
    src, _, r = _generate("bfloat16", (256, 256, 256), {}, tmp_path / "a100", "cuda-sm80")
    assert r["kernels"][0]["grid"] == ["batch * 2", 1, 1] and not r["config"]["persistent"]
    assert "tma_load" not in kernel_body(src) and r["kernels"][0]["smem_bytes"] <= SMEM_PER_CTA["sm_80"]
