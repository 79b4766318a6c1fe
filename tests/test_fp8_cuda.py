"""Block-scaled FP8 on the GPU against lcmac.spec.fp8's reference: the torch quantiser,
cuBLAS's FP8 GEMMs — blockwise 1x128·128x128 (DeepSeek-V3's recipe) and 1x128·1x128 through
torch.nn.functional.scaled_mm where this torch and cuBLASLt have them (skipped, saying why,
where not), rowwise and tensorwise through torch._scaled_mm always — and lcmac's
operands="fp8" kernels (the contract: Ã per 1x128, B̃ per 128x128): the Ã, B̃ and scales
they leave in the workspace or the prepared B, and C, against the contract's numpy
reference — the plain GEMM, Strassen and Winograd at ragged and aligned shapes, NaN and
Inf blocks, a prepared B reused for two A's.

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
#: lcmac's operand-mode artifacts: (algorithm, shape); ragged shapes (Strassen's Kb = 528:
#: 5 K blocks, the last partial; N blocks partial too) and aligned ones
KERNEL_CASES = [("gemm", (1000, 1064, 1032)), ("gemm", (1024, 1024, 1024)),
                ("strassen", (1000, 1064, 1032)), ("strassen", (2048, 2048, 2048)),
                ("winograd", (777, 520, 1048)), ("winograd", (512, 512, 512)),
                ("gemm", (1000, 1480, 1032)), ("strassen", (2000, 1064, 1032))]
#: cases built with other tiles: 192 columns straddle B̃'s 128-column scale blocks in every
#: other tile (the scale chosen per column at run time), the last tile ragged
CASE_KNOBS = {KERNEL_CASES[6]: {"block_n": 192}, KERNEL_CASES[7]: {"block_n": 192, "stages": 3}}
CASE_IDS = [f"{a}-{'x'.join(map(str, s))}" + "".join(f"-{k}{v}" for k, v in CASE_KNOBS.get((a, s), {}).items())
            for a, s in KERNEL_CASES]


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
        cfg.update(CASE_KNOBS.get(case, {}))
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


def _graded(M, N, K, seed):
    """bf16 A and B whose magnitudes change from one scale block to the next (A's rows and K
    blocks, B's K and N blocks, by up to 2^±6): a scale read for the wrong block is an O(1)
    error, not a percent."""
    A, B = _inputs(M, N, K, seed)
    g = torch.Generator(device="cuda").manual_seed(seed + 1)
    row = 2.0 ** torch.randint(-6, 7, (M, 1), device="cuda", generator=g).float()
    ka = 2.0 ** torch.randint(-3, 4, (1, -(-K // 128)), device="cuda", generator=g).float()
    kb = 2.0 ** torch.randint(-3, 4, (-(-K // 128), 1), device="cuda", generator=g).float()
    nb = 2.0 ** torch.randint(-6, 7, (1, -(-N // 128)), device="cuda", generator=g).float()
    A = (A.float() * row * ka.repeat_interleave(128, 1)[:, :K]).bfloat16()
    B = (B.float() * kb.repeat_interleave(128, 0)[:K] * nb.repeat_interleave(128, 1)[:, :N]).bfloat16()
    return A, B


class _Want:
    """The contract's reference for one artifact and inputs: Ã, B̃, their scales as the
    kernels keep them, and C before its bf16 rounding."""

    def __init__(self, f, algo, A, B):
        M, K = A.shape
        N = B.shape[1]
        self.alg = catalogue.get("naive-1x1x1" if algo == "gemm" else algo)
        self.blk = fp8.lcma_blocking(M, N, K, self.alg)
        An, Bn = A.float().cpu().numpy(), B.float().cpu().numpy()
        self.at = fp8.combine_then_quantize(An, self.alg, fp8.OPERAND_MODE, self.blk)
        self.bt = fp8.prepare_b_fp8(Bn, self.alg, fp8.OPERAND_MODE, self.blk)
        cfg = {**FP8_TILE_DEFAULTS, **(f.meta.get("config") or {})}
        self.scales = fp8.kernel_scales(self.at, self.bt, (int(cfg["block_m"]), int(cfg["block_n"])))
        with np.errstate(invalid="ignore", over="ignore"):
            self.C = torch.from_numpy(fp8.fp8_lcma_reference(An, Bn, self.alg, fp8.OPERAND_MODE)).cuda()

    def check_a(self, At, SA):
        _close_e4m3(At.float().cpu().numpy(), self.at.values)
        _same_scales(SA, self.scales["SA"], np.s_[:, :, :self.blk.Mb])

    def check_b(self, Bt, SB):
        _close_e4m3(Bt.float().transpose(1, 2).cpu().numpy(), self.bt.values)
        nkb, nbn = self.bt.scales.shape[1:]
        _same_scales(SB, self.scales["SB"], np.s_[:, :nbn, :nkb])


def _same_scales(got, want, real):
    """The kernels' scales are the contract's (amax / 448, a true division) over the
    ``real`` region: equal but where an Ã value moved a step at a rounding boundary, and with
    it its block's amax (a few ulps).  The padding (rows to the tile, 128-column blocks to
    the tile, K blocks to L4) is never written."""
    got, want = got.cpu().numpy()[real], want[real]
    assert np.allclose(got, want, rtol=2.0 ** -20, atol=0), np.abs(got / np.where(want == 0, 1, want) - 1).max()


@pytest.mark.parametrize("algo,shape", KERNEL_CASES, ids=CASE_IDS)
def test_kernels_write_the_contract(kernels, algo, shape):
    """Ã [R, Mb, Kb] and K-major B̃ [R, Nb, Kb] are the reference's E4M3 values (one step
    apart at rounding boundaries only), SA [R, K blocks, Mb'] and SB [R, Nb', L4] the
    reference's scales, and C the reference product to bf16's rounding; every output
    written (C poisoned with NaN first)."""
    f = kernels[algo, shape]
    assert not isinstance(f, str), f"build failed: {f}"
    M, N, K = shape
    A, B = _graded(M, N, K, 3)
    want = _Want(f, algo, A, B)
    C = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
    f(A, B, out=C)
    torch.cuda.synchronize()
    assert torch.isfinite(C).all(), "outputs left unwritten (NaN poison)"
    R, blk = want.alg.R, want.blk
    sa, sb = want.scales["SA"].shape, want.scales["SB"].shape
    want.check_a(_workspace(f, "At", R * blk.Mb * blk.Kb, torch.float8_e4m3fn, (R, blk.Mb, blk.Kb)),
                 _workspace(f, "SA", int(np.prod(sa)), torch.float32, sa))
    want.check_b(_workspace(f, "Bt", R * blk.Nb * blk.Kb, torch.float8_e4m3fn, (R, blk.Nb, blk.Kb)),
                 _workspace(f, "SB", int(np.prod(sb)), torch.float32, sb))
    assert _rel(C, want.C) < 4e-3


def _prepared(Bp, f, name, count, dtype, shape):
    """One buffer of a prepared B ([name, byte offset, bytes] in the manifest's plan)."""
    plan = {n: (off, size) for n, off, size in f.meta["extra"]["prepared_b"]["buffers"]}
    off, size = plan[name]
    n = torch.empty((), dtype=dtype).element_size() * count
    assert n <= size, (name, n, size)
    return Bp.buffer[off:off + n].view(dtype).view(shape)


@pytest.mark.parametrize("algo,shape", [KERNEL_CASES[0], KERNEL_CASES[2], KERNEL_CASES[4]],
                         ids=[CASE_IDS[0], CASE_IDS[2], CASE_IDS[4]])
def test_prepared_b_serves_two_as(kernels, algo, shape):
    """B̃ and its 128x128 scales prepared once (``prepare_b``: the reference's, in the
    prepared buffer) and reused for two A's: each C the same bits as the call that combines
    B itself, and the reference product."""
    f = kernels[algo, shape]
    assert not isinstance(f, str), f"build failed: {f}"
    M, N, K = shape
    A1, B = _graded(M, N, K, 4)
    A2, _ = _graded(M, N, K, 5)
    Bp = f.prepare_b(B)
    want = _Want(f, algo, A1, B)
    R, blk, sb = want.alg.R, want.blk, want.scales["SB"].shape
    want.check_b(_prepared(Bp, f, "Bt", R * blk.Nb * blk.Kb, torch.float8_e4m3fn, (R, blk.Nb, blk.Kb)),
                 _prepared(Bp, f, "SB", int(np.prod(sb)), torch.float32, sb))
    for A in (A1, A2):
        got = f(A, Bp)
        direct = f(A, B)
        torch.cuda.synchronize()
        assert torch.equal(got, direct)
        assert _rel(got, _Want(f, algo, A, B).C) < 4e-3


@pytest.mark.parametrize("algo,shape", [KERNEL_CASES[0], KERNEL_CASES[2], KERNEL_CASES[5]],
                         ids=[CASE_IDS[0], CASE_IDS[2], CASE_IDS[5]])
def test_nan_and_inf_blocks(kernels, algo, shape):
    """A NaN and an inf in A, an inf and a NaN in B: every output the exact product makes
    non-finite is non-finite, none the reference keeps finite is (the reference spreads a
    NaN over its block, CUDA's fmaxf keeps it to the element: between the two), and the
    finite outputs are the reference's."""
    f = kernels[algo, shape]
    assert not isinstance(f, str), f"build failed: {f}"
    M, N, K = shape
    A, B = _graded(M, N, K, 6)
    A[10, 20], A[M - 3, K - 5] = float("inf"), float("nan")
    B[300, 7], B[K - 2, N - 9] = float("-inf"), float("nan")
    want = _Want(f, algo, A, B)
    C = f(A, B)
    torch.cuda.synchronize()
    bad, ref_bad = ~torch.isfinite(C), ~torch.isfinite(want.C)
    exact_bad = ~torch.isfinite(A.double() @ B.double())
    assert bool((bad | ~exact_bad).all()), "a non-finite input reached an output that is finite"
    assert bool((ref_bad | ~bad).all()), "non-finite outputs where the contract has finite ones"
    fin = ~ref_bad
    assert int(fin.sum()) > 0
    d = (C.double() - want.C)[fin]
    assert float(torch.linalg.norm(d) / torch.linalg.norm(want.C[fin])) < 4e-3


def test_tuners_fp8_vendor_is_cublas_fp8_on_the_contract():
    """``tune --operands fp8``'s baseline: cuBLAS's FP8 GEMM on the contract's operands, A's
    quantisation timed in, checked with the fp8 tolerance; the record names its recipe."""
    from lcmac.tune.fp8_measure import measure_vendor_fp8
    m = measure_vendor_fp8("cuda-sm90a", "bfloat16", (1024, 1024, 2048), repeats=2, warm_s=0.05)
    assert m["status"] == "ok", m
    cfg = m["config"]
    assert cfg["operands"] == "fp8" and cfg["library"] == "cublas"
    assert cfg["recipe"] in ("1x128,128x128", "rowwise"), cfg
    assert m["time_s"] > 0
