"""lcmac.bmm and torch.ops.lcmac.bmm on the CPU (the reference path), the clock-cycle model of
the batched kernel, its tiles, and its CUDA code (generated for sm_90a, no GPU needed)."""
import json
import subprocess
import sys
import warnings

import numpy as np
import pytest

import lcmac
from lcmac.api.bmm import bmm
from lcmac.costmodel.small import predict_batched
from lcmac.core.errors import CatalogueError, DTypeError, LcmacError, ShapeError
from lcmac.policy.batched import BATCHED_WINS, choose_batched
from lcmac.schedules.cuda.batched_tiles import small_tile_defaults
from lcmac.spec.cuda.config import CudaConfig
from tests.schedules.cuda.test_cuda_codegen import needs_tilelang

torch = pytest.importorskip("torch")


def _operands(batch, M, N, K, seed=0, dtype=np.float64):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((batch, M, K)).astype(dtype),
            rng.standard_normal((batch, K, N)).astype(dtype))


@pytest.mark.parametrize("algo", ["gemm", "strassen", "vendor", "auto"])
@pytest.mark.parametrize("shape", [(3, 5, 7), (16, 16, 16), (63, 65, 127)])
def test_numpy_batches_match_float64(algo, shape):
    M, N, K = shape
    A, B = _operands(4, M, N, K)
    ref = np.einsum("bmk,bkn->bmn", A, B)
    C = bmm(A, B, algo=algo)
    assert C.shape == (4, M, N) and C.dtype == np.float64
    assert np.allclose(C, ref, rtol=1e-10, atol=1e-10)
    assert np.allclose(lcmac.matmul(A, B, algo=algo), ref, rtol=1e-10, atol=1e-10)   # 3-D B routes here


def test_float32_and_out():
    A, B = _operands(3, 9, 10, 11, dtype=np.float32)
    out = np.empty((3, 9, 10), np.float32)
    C = bmm(A, B, algo="strassen", out=out)
    assert C is out and np.allclose(out, A.astype(np.float64) @ B.astype(np.float64), rtol=1e-5, atol=1e-5)


def test_torch_op_gradients_and_one_graph():
    A = torch.randn(3, 4, 5, dtype=torch.float64, requires_grad=True)
    B = torch.randn(3, 5, 6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: bmm(a, b, algo="strassen"), (A, B))
    C = bmm(A, B, algo="gemm")
    assert C.grad_fn is not None and torch.allclose(C, torch.bmm(A, B))
    graphs = []

    def count(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    f = torch.compile(lambda a, b: torch.ops.lcmac.bmm(a, b, "gemm") + 1, backend=count, fullgraph=True)
    got = f(A.detach(), B.detach())
    assert len(graphs) == 1 and torch.allclose(got, torch.bmm(A, B).detach() + 1)


def test_bf16_torch_on_the_cpu_rounds_the_float64_product():
    A = torch.randn(2, 8, 16).bfloat16()
    B = torch.randn(2, 16, 8).bfloat16()
    C = bmm(A, B, algo="gemm")
    assert C.dtype == torch.bfloat16
    assert torch.equal(C, (A.double() @ B.double()).bfloat16())


@pytest.mark.parametrize("args, kw, err, text", [
    ((np.ones((2, 3, 4)), np.ones((4, 5))), {}, ShapeError, "lcmac.matmul(A, B)"),
    ((np.ones((2, 3, 4)), np.ones((3, 4, 5))), {}, ShapeError, "matching A"),
    ((np.ones((3, 4)), np.ones((2, 4, 5))), {}, ShapeError, "must be 3-D"),
    ((np.ones((2, 3, 4)), np.ones((2, 4, 5), np.float32)), {}, DTypeError, "one dtype"),
    ((np.ones((2, 3, 4)), np.ones((2, 4, 5))), {"algo": "no-such"}, CatalogueError, "no-such"),
])
def test_bad_input_is_named(args, kw, err, text):
    with pytest.raises(err, match=None) as e:
        bmm(*args, **kw)
    assert text in str(e.value)


def test_matmul_refuses_batched_options():
    A, B = _operands(2, 3, 3, 3)
    with pytest.raises(LcmacError, match="devices"):
        lcmac.matmul(A, B, max_error=2.0)


def test_tiles_cover_the_product_with_the_fewest_idle_lanes():
    assert small_tile_defaults(16, 16, 16, "bfloat16") == {
        "block_m": 16, "block_n": 16, "block_k": 16, "threads": 32, "stages": 2, "policy": "square",
        "products_per_cta": 16}
    t = small_tile_defaults(100, 100, 127, "bfloat16")
    assert (t["block_m"], t["block_k"], t["threads"], t["stages"], t["products_per_cta"]) == (128, 64, 128, 2, 1)
    big = small_tile_defaults(512, 512, 512, "float32")
    assert (big["block_n"], big["block_k"], big["threads"]) == (256, 32, 256)


def test_cycle_model_worked_example():
    e = predict_batched(128, 128, 128, "bfloat16", 10000, small_tile_defaults(128, 128, 128, "bfloat16"))
    assert round(e.cta_cycles) == 8156 and e.ctas_per_sm == 3 and e.waves == 26
    assert e.t_latency == pytest.approx(121e-6, rel=0.01)
    assert e.t_memory == pytest.approx(293e-6, rel=0.01) and e.bound == "memory"
    # tiny products: latency of one short CTA, many resident per SM
    tiny = predict_batched(16, 16, 16, "bfloat16", 10000, small_tile_defaults(16, 16, 16, "bfloat16"))
    assert tiny.ctas_per_sm == 12          # 32 + 128 producer threads each: 2048 / 160


_GEN = """
import json, sys
from lcmac.targets import tilelang_worker as w
out = {}
for shape in ([16, 16, 16], [63, 65, 127]):
    r = w.build({"algorithm": None, "target": "cuda-sm90a", "dtype": "bfloat16", "shape": shape,
                 "config": {"batched": True}, "out_dir": sys.argv[1] + "/%d" % shape[0],
                 "name": "lcmac", "compile": False})
    out[str(shape[0])] = {"sources": [open(p).read() for p in r["sources"]], "grid": r["kernels"][0]["grid"]}
try:
    w.build({"algorithm": "strassen", "target": "cuda-sm90a", "dtype": "bfloat16", "shape": [64, 64, 64],
             "config": {"batched": True}, "out_dir": sys.argv[1] + "/x", "compile": False})
except Exception as e:
    out["refused"] = str(e)
print(json.dumps(out))
"""


def generated(script: str, tmp_path) -> dict:
    """The JSON a generation script (run in its own process: TileLang is imported there, not
    here) prints last, the script having written its sources under ``tmp_path``."""
    r = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@needs_tilelang
def test_batched_kernel_generates_for_sm90a(tmp_path):
    out = generated(_GEN, tmp_path)
    for size in ("16", "63"):
        kernel, entry = out[size]["sources"]
        assert "int batch" in kernel and "batch" in str(out[size]["grid"][0])   # one kernel, any batch
        assert "lcmac_run_batched" in entry and "call lcmac_run_batched" in entry
    assert "mma" in out["16"]["sources"][0]                 # one warp: mma.sync
    assert "wgmma" in out["63"]["sources"][0]                # a warpgroup: wgmma, bounds-checked copies
    assert "without an algorithm" in out["refused"]


# ---- algo="auto": the rule ------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_auto_picks_lcmac_for_tiny_2_byte_products_in_large_batches(dtype):
    for n in (8, 16, 24):
        assert choose_batched("cuda", dtype, n, n, n, 100_000) == {}
        assert choose_batched("cuda", dtype, n, n, n, 10_000) == {}
        assert choose_batched("cuda", dtype, n, n, n, 1_000) is None           # lost there
    for shape in ((32, 32, 32), (64, 64, 64), (16, 16, 64), (16, 64, 16), (64, 16, 16),
                  (16, 16, 256), (32, 32, 512), (17, 19, 300)):
        assert choose_batched("cuda", dtype, *shape, 100_000) is None, shape
    assert choose_batched("cuda", dtype, 16, 15, 16, 100_000) is None           # rows not 16 bytes


def test_auto_float32_only_with_tf32_and_through_the_3d_partition():
    for shape, least in (((16, 16, 64), 100_000), ((16, 16, 256), 10_000), ((32, 32, 512), 10_000)):
        assert choose_batched("cuda", "float32", *shape, least, tf32=True) == {"policy": "splitk"}
        assert choose_batched("cuda", "float32", *shape, least - 1, tf32=True) is None
        assert choose_batched("cuda", "float32", *shape, 100_000, tf32=False) is None   # keep float32
    for shape in ((16, 16, 16), (32, 32, 32), (17, 19, 300), (16, 64, 16), (32, 32, 256)):
        assert choose_batched("cuda", "float32", *shape, 100_000, tf32=True) is None, shape


def test_auto_stays_the_vendor_on_the_cpu_and_for_other_dtypes():
    for device in ("cpu", "mps"):
        for dtype in ("bfloat16", "float16", "float32", "float64"):
            assert choose_batched(device, dtype, 16, 16, 16, 10 ** 6, tf32=True) is None
    assert choose_batched("cuda", "float64", 16, 16, 16, 10 ** 6) is None
    assert choose_batched("cuda", "bfloat16", 16, 16, 16, 0) is None
    # every win names its measurement
    assert all(len(row) == 6 and "×" in row[5] for row in BATCHED_WINS)
    # the CPU path: auto gives the vendor's bits
    A = torch.randn(3, 16, 16)
    B = torch.randn(3, 16, 16)
    assert torch.equal(bmm(A, B), torch.bmm(A, B))


def test_splitk_tile_and_its_checks():
    t = small_tile_defaults(17, 19, 300, "bfloat16", "splitk")
    assert t == {"block_m": 32, "block_n": 32, "block_k": 256, "threads": 128, "stages": 2,
                 "policy": "splitk", "products_per_cta": 4}
    assert small_tile_defaults(16, 16, 64, "float32", "splitk")["block_k"] == 64
    assert small_tile_defaults(16, 16, 512, "float32", "splitk")["block_k"] == 128
    with pytest.raises(ShapeError, match="up to 32"):
        small_tile_defaults(64, 16, 256, "bfloat16", "splitk")
    with pytest.raises(LcmacError, match="batched"):
        CudaConfig(policy="splitk", block_k=64, threads=128).check()
    with pytest.raises(LcmacError, match="multiple of 64"):
        CudaConfig(policy="splitk", batched=True, block_k=32, threads=128).check()
    with pytest.raises(LcmacError, match="two or more"):
        CudaConfig(policy="splitk", batched=True, block_k=64, threads=32).check()


_GEN_SPLITK = """
import json, sys
from lcmac.targets import tilelang_worker as w
out = {}
for dtype, shape in (("bfloat16", [16, 16, 256]), ("bfloat16", [17, 19, 300]), ("float32", [32, 32, 512])):
    r = w.build({"algorithm": None, "target": "cuda-sm90a", "dtype": dtype, "shape": shape,
                 "config": {"batched": True, "policy": "splitk"}, "out_dir": sys.argv[1] + "/%d" % shape[2],
                 "name": "lcmac", "compile": False})
    out["%s-%d" % (dtype, shape[2])] = {"kernel": open(r["sources"][0]).read(), "config": r["config"]}
print(json.dumps(out))
"""


@needs_tilelang
def test_splitk_kernel_generates_for_sm90a(tmp_path):
    out = generated(_GEN_SPLITK, tmp_path)
    for key, got in out.items():
        src, cfg = got["kernel"], got["config"]
        assert cfg["policy"] == "splitk" and cfg["threads"] == 128, key
        assert "int batch" in src and "mma" in src and "P_s" in src, key
        # four warps, each under its own thread range, each with an accumulator of its own
        assert src.count("threadIdx.x) < 32") + src.count("threadIdx.x) < 160") >= 1, key
    # the partial tiles are summed in shared memory: four reads of P_s per output element
    assert out["bfloat16-256"]["kernel"].count("P_s) +") >= 8


# ---- structured A: low rank, block-sparse ----------------------------------------------------
from lcmac.api.structured import BSR, bsr_matmul, bsr_spgemm, lowrank_matmul, lowrank_order  # noqa: E402


@pytest.mark.parametrize("algo", ["gemm", "strassen"])
def test_lowrank_matches_the_formed_product(algo):
    rng = np.random.default_rng(1)
    U, V, B = rng.standard_normal((3, 20, 4)), rng.standard_normal((3, 30, 4)), rng.standard_normal((3, 30, 7))
    ref = (U @ np.swapaxes(V, 1, 2)) @ B
    assert np.allclose(lowrank_matmul(U, V, B, algo=algo), ref, rtol=1e-10, atol=1e-10)
    assert np.allclose(lowrank_matmul(U[0], V[0], B[0], algo=algo), ref[0], rtol=1e-10, atol=1e-10)
    assert lowrank_order(20, 30, 7, 4) == "U(VtB)" and lowrank_order(8, 8, 8, 64) == "(UVt)B"
    with pytest.raises(ShapeError, match="do not fit"):
        lowrank_matmul(U, V[:, :-1], B)


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_bsr_matches_the_dense_product(kind):
    rng = np.random.default_rng(2)
    bs, M, K, N = 4, 12, 16, 5
    rows, cols = [0, 0, 2, 1, 2], [1, 3, 0, 1, 1]            # block (2, 1) twice: summed
    blocks = rng.standard_normal((5, bs, bs))
    A = np.zeros((M, K))
    for blk, r, c in zip(blocks, rows, cols):
        A[r * bs:(r + 1) * bs, c * bs:(c + 1) * bs] += blk
    B = rng.standard_normal((K, N))
    if kind == "torch":
        C = bsr_matmul(torch.from_numpy(blocks), torch.tensor(rows), torch.tensor(cols),
                       torch.from_numpy(B), (M, K), algo="gemm").numpy()
    else:
        C = bsr_matmul(blocks, rows, cols, B, (M, K), algo="strassen")
    assert np.allclose(C, A @ B, rtol=1e-10, atol=1e-10)
    with pytest.raises(ShapeError, match="outside"):
        bsr_matmul(blocks, [0, 0, 3, 1, 2], cols, B, (M, K))
    with pytest.raises(ShapeError, match="multiple of the block size"):
        bsr_matmul(blocks, rows, cols, B, (13, K))


def _random_bsr(rng, M, N, bs, density):
    r, c = np.nonzero(rng.random((M // bs, N // bs)) < density)
    return BSR(rng.standard_normal((len(r), bs, bs)), r, c, (M, N))


@pytest.mark.parametrize("kind", ["numpy", "torch"])
@pytest.mark.parametrize("density", [0.0, 0.3, 1.0])
def test_spgemm_matches_the_dense_product(kind, density):
    rng = np.random.default_rng(int(density * 10))
    a, b = _random_bsr(rng, 24, 40, 8, density), _random_bsr(rng, 40, 16, 8, density)
    ref = a.to_dense() @ b.to_dense()
    if kind == "torch":
        a, b = (BSR(*(torch.as_tensor(x) for x in m[:3]), m.shape) for m in (a, b))
    c = bsr_spgemm(a, b, algo="gemm")
    got = c.to_dense().numpy() if kind == "torch" else c.to_dense()
    assert got.shape == (24, 16) and np.allclose(got, ref, rtol=1e-12, atol=1e-12)
    keys = np.asarray(c.rows) * 2 + np.asarray(c.cols)
    assert np.all(np.diff(keys) > 0)                       # C's blocks: row-major, each once


def test_spgemm_sums_every_pair_meeting_in_a_block():
    """A 2x2 block grid times itself, every block nonzero: C (0, 0) sums two products."""
    rng = np.random.default_rng(5)
    a = _random_bsr(rng, 8, 8, 4, 1.0)
    c = bsr_spgemm(a, a, algo="strassen")
    assert len(c.rows) == 4 and np.allclose(c.to_dense(), a.to_dense() @ a.to_dense())


def test_spgemm_misuse_is_refused():
    rng = np.random.default_rng(6)
    a, b = _random_bsr(rng, 16, 16, 4, 0.5), _random_bsr(rng, 16, 8, 4, 0.5)
    with pytest.raises(ShapeError, match="inner dimensions"):
        bsr_spgemm(a, _random_bsr(rng, 12, 8, 4, 0.5))
    with pytest.raises(ShapeError, match="block sizes"):
        bsr_spgemm(a, _random_bsr(rng, 16, 8, 8, 0.5))
    with pytest.raises(ShapeError, match="names a block twice"):
        bsr_spgemm(BSR(np.ones((2, 4, 4)), [0, 0], [1, 1], (16, 16)), b)
    with pytest.raises(ShapeError, match="outside"):
        bsr_spgemm(BSR(np.ones((1, 4, 4)), [4], [0], (16, 16)), b)
    with pytest.raises(DTypeError, match="one dtype"):
        bsr_spgemm(a, BSR(b.blocks.astype(np.float32), b.rows, b.cols, b.shape))


def test_auto_kernel_that_cannot_be_built_is_warned_once_and_not_retried(monkeypatch):
    """"auto" picked lcmac's kernel and its build fails (no TileLang, say): one warning, None
    (torch.bmm runs), and no second build attempt for the same kernel."""
    from lcmac.api import bmm as batched
    tries = []

    def failing(*a, **kw):
        tries.append(a)
        raise LcmacError("no TileLang here\nsecond line")
    monkeypatch.setattr(batched, "batched_kernel", failing)
    monkeypatch.setattr(batched, "_unbuildable", {})
    with pytest.warns(UserWarning, match="16x16x16 bfloat16 could not be built .no TileLang here.; "
                                         "algo='auto' runs torch.bmm"):
        assert batched._auto_kernel("cuda-sm90a", "bfloat16", (16, 16, 16), {"policy": "splitk"}) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert batched._auto_kernel("cuda-sm90a", "bfloat16", (16, 16, 16), {"policy": "splitk"}) is None
    assert len(tries) == 1
    with pytest.warns(UserWarning):          # another kernel is tried on its own
        assert batched._auto_kernel("cuda-sm90a", "bfloat16", (32, 32, 32), None) is None
    assert len(tries) == 2
