"""Block-scaled FP8 on the GPU against lcmac.spec.fp8's reference: the torch quantiser,
cuBLAS's FP8 GEMMs — blockwise 1x128·128x128 (DeepSeek-V3's recipe) and 1x128·1x128 through
torch.nn.functional.scaled_mm where this torch and cuBLASLt have them (skipped, saying why,
where not), rowwise and tensorwise through torch._scaled_mm always — and lcmac's
operands="fp8" kernels: the Ã, B̃ and scales they leave in the workspace, and C.

    pytest -m gpu tests/test_fp8_cuda.py

Skipped without a CUDA GPU.  The lcmac kernels are built once for the module (TileLang).
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from lcmac.ir import catalogue
from lcmac.spec import fp8
from lcmac.spec.cuda.operands import FP8_TILE_DEFAULTS

torch = pytest.importorskip("torch")
tf = pytest.importorskip("lcmac.torch.fp8")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

#: cuBLAS's recipes: (A's blocks, W's blocks) for A [M, K] and W = Bᵀ [N, K]
RECIPES = {"1x128,128x128": ((1, 128), (128, 128)), "1x128,1x128": ((1, 128), (1, 128)),
           "rowwise": None, "tensorwise": None}
#: lcmac's operand-mode artifacts: (algorithm, shape); ragged shapes (Kb = 528: 5 K blocks,
#: the last partial) and an exact one
KERNEL_CASES = [("gemm", (1000, 1064, 1032)), ("strassen", (1000, 1064, 1032)), ("winograd", (512, 512, 512))]


def _inputs(M, N, K, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    A = torch.randn(M, K, device="cuda", generator=g).bfloat16()
    B = torch.randn(K, N, device="cuda", generator=g).bfloat16()
    return A, B


def _rel(x, ref) -> float:
    return float(torch.linalg.norm(x.double() - ref) / torch.linalg.norm(ref))


def _blocks(name, M, N, K):
    if RECIPES[name] is not None:
        return RECIPES[name]
    return ((1, K), (1, K)) if name == "rowwise" else ((M, K), (N, K))


@pytest.mark.parametrize("block", [(1, 128), (128, 128), (128, 1)])
def test_gpu_quantiser_is_the_reference(block):
    """On the GPU too, bit for bit (a ragged 1000×1032: partial blocks on both edges)."""
    A, _ = _inputs(1000, 8, 1032, 1)
    A[7, :128] = 0
    q, s = tf.quantize(A, block)
    want = fp8.quantize_blocks(A.float().cpu().numpy(), block)
    assert np.array_equal(q.float().cpu().numpy(), want.values)
    assert np.array_equal(s.cpu().numpy(), want.scales)


def test_compiled_quantiser_keeps_the_contract():
    """torch.compile'd (what scripts/bench_fp8.py times for cuBLAS): Triton may divide
    approximately, so scales within two float32 steps and E4M3 values one step apart at
    rounding boundaries only."""
    A, _ = _inputs(2048, 8, 4096, 4)
    try:
        q, s = torch.compile(lambda x: tf.quantize(x, (1, 128)), dynamic=False)(A)
    except Exception as e:  # noqa: BLE001 - no inductor / Triton in this install
        pytest.skip(f"torch.compile: {type(e).__name__}: {str(e)[:200]}")
    want = fp8.quantize_blocks(A.float().cpu().numpy(), (1, 128))
    assert np.allclose(s.cpu().numpy(), want.scales, rtol=2.0 ** -22, atol=0)
    _close_e4m3(q.float().cpu().numpy(), want.values)


@pytest.mark.parametrize("out_dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("name", list(RECIPES))
def test_cublas_fp8_is_the_product_of_the_dequantised_operands(name, out_dtype):
    """cuBLAS on quantised operands against the float64 product of the same operands
    dequantised: a misread scale layout lands at O(1), far above the output's rounding."""
    M, N, K = 1024, 768, 1536
    A, B = _inputs(M, N, K, 2)
    W = B.t().contiguous()
    a_block, w_block = _blocks(name, M, N, K)
    qa, sa = tf.quantize(A, a_block)
    qw, sw = tf.quantize(W, w_block)
    dt = getattr(torch, out_dtype)
    try:
        C = tf.scaled_mm(qa, sa, a_block, qw, sw, w_block, out_dtype=dt)
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 - a recipe this torch / cuBLASLt / GPU lacks
        if name in ("rowwise", "tensorwise") and out_dtype == "bfloat16":
            raise
        pytest.skip(f"cuBLAS FP8 {name} with {out_dtype} out: {type(e).__name__}: {str(e)[:300]}")
    ref = tf.dequantize(qa, sa, a_block) @ tf.dequantize(qw, sw, w_block).t()
    exact = A.double() @ B.double()
    e = _rel(C, ref)
    assert e < (4e-3 if out_dtype == "bfloat16" else 1e-3), (name, out_dtype, e)
    assert _rel(C, exact) > 5 * e            # the fp8 error is there, the product is the operands'


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    """{(algorithm, shape): loaded artifact or the build's error} for KERNEL_CASES, built in
    parallel (each build is its own worker process)."""
    import lcmac

    def one(case):
        algo, shape = case
        d = tmp_path_factory.mktemp(f"fp8-{algo}")
        cfg = {"operands": "fp8"} if algo == "gemm" else {"operands": "fp8", "fused": False}
        try:
            return case, lcmac.load(lcmac.build(algo, "cuda", "bfloat16", shape, config=cfg, out_dir=str(d)))
        except Exception as e:  # noqa: BLE001 - reported by the test that needs it
            return case, f"{type(e).__name__}: {e}"
    with ThreadPoolExecutor(max_workers=len(KERNEL_CASES)) as pool:
        return dict(pool.map(one, KERNEL_CASES))


def _workspace(f, name, count, dtype, shape):
    """One buffer of the artifact's kept workspace as a tensor (the layout the manifest
    records: [name, byte offset] per buffer)."""
    offsets = dict(f.meta["workspace"])
    assert name in offsets, f"no {name} in the workspace {sorted(offsets)}: the fp8 layout changed"
    size = torch.empty((), dtype=dtype).element_size()
    ws = f.workspace(torch.device("cuda", torch.cuda.current_device()))
    raw = ws[int(offsets[name]):int(offsets[name]) + count * size]
    return raw.view(dtype).view(shape)


def _close_e4m3(got: np.ndarray, want: np.ndarray) -> None:
    """The same E4M3 values but at rounding boundaries, where the kernels' float32 sums (their
    own order) and division may round the last bit otherwise: then one step apart."""
    diff = got != want
    assert diff.mean() < 1e-3, diff.mean()
    step = np.abs(got[diff] - want[diff]) / np.maximum(np.abs(want[diff]), 2.0 ** -6)
    assert np.all(step <= 2.0 ** -3 * (1 + 1e-6))


@pytest.mark.slow
@pytest.mark.parametrize("algo,shape", KERNEL_CASES, ids=[f"{a}-{'x'.join(map(str, s))}" for a, s in KERNEL_CASES])
def test_operand_mode_kernels_write_the_reference(kernels, algo, shape):
    """operands="fp8" is ``fp8.OPERAND_MODE``: the combines' Ã [R, Mb, Kb] and K-major
    B̃ [R, Nb, Kb] are the reference's E4M3 values, their scales [R, K blocks, rows padded
    to the tile] the reference's, and C the reference product to the output's rounding."""
    f = kernels[algo, shape]
    assert not isinstance(f, str), f"build failed: {f}"
    M, N, K = shape
    alg = catalogue.get("naive-1x1x1" if algo == "gemm" else algo)
    blk = fp8.lcma_blocking(M, N, K, alg)
    A, B = _inputs(M, N, K, 3)
    C = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
    f(A, B, out=C)
    torch.cuda.synchronize()
    assert torch.isfinite(C).all(), "outputs left unwritten (NaN poison)"
    An, Bn = A.float().cpu().numpy(), B.float().cpu().numpy()
    at = fp8.combine_then_quantize(An, alg, fp8.OPERAND_MODE, blk)
    bt = fp8.prepare_b_fp8(Bn, alg, fp8.OPERAND_MODE, blk)
    cfg = {**FP8_TILE_DEFAULTS, **(f.meta.get("config") or {})}
    R, nkb = alg.R, -(-blk.Kb // 128)
    bm, bn = int(cfg["block_m"]), int(cfg["block_n"])
    mp, np_ = -(-blk.Mb // bm) * bm, -(-blk.Nb // bn) * bn
    At = _workspace(f, "At", R * blk.Mb * blk.Kb, torch.float8_e4m3fn, (R, blk.Mb, blk.Kb))
    Bt = _workspace(f, "Bt", R * blk.Nb * blk.Kb, torch.float8_e4m3fn, (R, blk.Nb, blk.Kb))
    SA = _workspace(f, "SA", R * nkb * mp, torch.float32, (R, nkb, mp))
    SB = _workspace(f, "SB", R * nkb * np_, torch.float32, (R, nkb, np_))
    _close_e4m3(At.float().cpu().numpy(), at.values)
    _close_e4m3(Bt.float().transpose(1, 2).cpu().numpy(), bt.values)
    assert np.allclose(SA[:, :, :blk.Mb].transpose(1, 2).cpu().numpy(), at.scales, rtol=2.0 ** -22, atol=0)
    assert np.allclose(SB[:, :, :blk.Nb].cpu().numpy(), bt.scales, rtol=2.0 ** -22, atol=0)
    ref = torch.from_numpy(fp8.fp8_lcma_reference(An, Bn, alg, fp8.OPERAND_MODE)).cuda()
    assert _rel(C, ref) < 4e-3
