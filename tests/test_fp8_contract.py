"""The block-scaled FP8 contract (lcmac.spec.fp8) on the CPU: E4M3 rounding, scales, round
trips, saturation, zero and non-finite blocks, ragged shapes, Combine A fused into the
quantisation, the reference LCMA against float64 products of the dequantised operands,
agreement with the accuracy model's fp8 operand mode, and the torch quantiser bit for bit."""
from __future__ import annotations

import numpy as np
import pytest

from lcmac.costmodel import accuracy
from lcmac.ir import catalogue
from lcmac.ir.algorithm import Algorithm
from lcmac.spec import fp8
from lcmac.spec.cuda.blocking import Blocking

U_E4M3 = 2.0 ** -4          # E4M3's unit roundoff (3 mantissa bits)
U_F32 = 2.0 ** -24


def _e4m3_grid() -> np.ndarray:
    """Every finite non-negative E4M3 value, decoded from its code (not from round_e4m3)."""
    codes = np.arange(127)                       # 127 = 0x7f is NaN
    e, m = codes >> 3, codes & 7
    return np.where(e == 0, m * 2.0 ** -9, (1 + m / 8) * 2.0 ** (e - 7)).astype(np.float32)


def _bf16(x) -> np.ndarray:
    return accuracy._bf16(np.asarray(x, dtype=np.float32))


def _randn(shape, seed) -> np.ndarray:
    return _bf16(np.random.default_rng(seed).standard_normal(shape))


def _alg(name):
    return catalogue.get(name or "naive-1x1x1")


def _abs_w(alg):
    """``alg`` with |W|: Combine H of nonnegative bounds gives their sum over the products."""
    return Algorithm(alg.m, alg.k, alg.n, alg.U, alg.V, np.abs(alg.W), name=f"{alg.name}-absW")


# ---- E4M3 --------------------------------------------------------------------------------------
def test_e4m3_grid_is_fixed_and_ties_go_to_even():
    grid = _e4m3_grid()
    assert grid[-1] == 448.0 and grid[1] == 2.0 ** -9 and len(np.unique(grid)) == 127
    for sign in (1, -1):
        assert np.array_equal(fp8.round_e4m3(sign * grid), sign * grid)
    mid = (grid[:-1].astype(np.float64) + grid[1:]) / 2           # exact in float32
    got = fp8.round_e4m3(mid.astype(np.float32))
    even = np.where(np.arange(126) % 2 == 0, grid[:-1], grid[1:])   # the code's last bit is the mantissa's
    assert np.array_equal(got, even)
    # a float32 step off the midpoint decides
    up, down = np.nextafter(mid.astype(np.float32), np.inf), np.nextafter(mid.astype(np.float32), -np.inf)
    assert np.array_equal(fp8.round_e4m3(up), grid[1:]) and np.array_equal(fp8.round_e4m3(down), grid[:-1])


def test_e4m3_saturates_and_keeps_nan():
    x = np.array([448.0, 460.0, 464.0, 465.0, 480.0, 1e30, np.inf, -np.inf, -1e6, np.nan], np.float32)
    got = fp8.round_e4m3(x)
    assert np.array_equal(got[:-1], [448, 448, 448, 448, 448, 448, 448, -448, -448])
    assert np.isnan(got[-1])
    assert fp8.round_e4m3(np.float32(2.0 ** -10)) == 0 and fp8.round_e4m3(np.float32(-2.0 ** -11)) == 0


def test_e4m3_matches_torchs_cast_within_range():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    x = (rng.standard_normal(100_000) * 10.0 ** rng.uniform(-5, 2.7, 100_000)).astype(np.float32)
    grid = _e4m3_grid()
    x = np.concatenate([x, (grid[:-1] + grid[1:]) / 2, -grid])
    x = x[np.abs(x) <= 448]                      # beyond 448 torch's cast need not saturate
    want = torch.from_numpy(x).to(torch.float8_e4m3fn).float().numpy()
    assert np.array_equal(fp8.round_e4m3(x), want)


# ---- scales and round trips --------------------------------------------------------------------
@pytest.mark.parametrize("block", [(1, 128), (128, 128), (128, 1), (4, 32)])
def test_scale_is_amax_over_448_and_amax_lands_on_448(block):
    x = _randn((256, 384), 2) * 3.0
    q = fp8.quantize_blocks(x, block)
    br, bc = block
    amax = np.abs(x).reshape(256 // br, br, 384 // bc, bc).max(axis=(1, 3))
    assert q.scales.dtype == np.float32 and q.scales.shape == amax.shape
    assert np.array_equal(q.scales, amax / np.float32(448))
    qmax = np.abs(q.values).reshape(amax.shape[0], br, amax.shape[1], bc).max(axis=(1, 3))
    assert np.all(qmax == 448.0)                 # each block's largest value maps to E4M3's largest
    err = np.abs(fp8.dequantize(q) - x)
    s = fp8.expand_scales(q.scales.astype(np.float64), block, x.shape)
    # half a step: relative 2^-4 in the normals, 2^-10 of the scale in the subnormals
    assert np.all(err <= np.maximum(U_E4M3 * np.abs(x), 2.0 ** -10 * s) * (1 + 1e-6))


def test_values_on_the_grid_round_trip_exactly():
    rng = np.random.default_rng(3)
    grid = _e4m3_grid()
    q = rng.choice(np.concatenate([grid, -grid]), size=(64, 512)).astype(np.float32)
    q[:, ::128] = 448.0                          # each 1x128 block holds E4M3's largest
    x = q * np.float32(2.0 ** -20)
    bq = fp8.quantize_blocks(x, (1, 128))
    assert np.array_equal(bq.values, q)
    assert np.array_equal(fp8.dequantize(bq), x.astype(np.float64))


def test_zero_blocks_stay_zero_with_a_finite_scale():
    x = _randn((8, 384), 4)
    x[:, 128:256] = 0.0
    for fmt in (fp8.CONTRACT, fp8.PER_COLUMN, fp8.DEEPGEMM):
        q = fp8.quantize_blocks(x, (1, 128), fmt)
        floor = np.float32(fmt.amax_floor)
        s = floor * np.float32(1 / 448) if fmt.scale_by_reciprocal else floor / np.float32(448)
        assert np.all(q.values[:, 128:256] == 0) and np.all(q.scales[:, 1] == s)
        assert np.all(fp8.dequantize(q)[:, 128:256] == 0)


def test_deepgemm_floor_changes_only_tiny_blocks():
    x = _randn((4, 256), 5)
    x[1, :128] *= 1e-6                           # amax ~ 3e-6 < 1e-4
    a, d = fp8.quantize_blocks(x, (1, 128)), fp8.quantize_blocks(x, (1, 128), fp8.DEEPGEMM)
    differs = np.any(a.values != d.values, axis=1)
    assert differs[1] and not differs[[0, 2, 3]].any()
    assert d.scales[1, 0] == np.float32(1e-4) / np.float32(448)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_non_finite_value_makes_its_block_nan_and_no_other(bad):
    x = _randn((256, 256), 6)
    x[3, 130] = bad
    for block in ((1, 128), (128, 128)):
        d = fp8.dequantize(fp8.quantize_blocks(x, block))
        br, bc = block
        inside = np.zeros(x.shape, bool)
        inside[3 // br * br:(3 // br + 1) * br, 128:256] = True
        assert np.all(np.isnan(d[inside])) and np.all(np.isfinite(d[~inside]))


def test_an_inf_block_reaches_only_the_products_that_read_it():
    alg = catalogue.get("strassen")
    A = _randn((64, 64), 7)
    A[0, 0] = np.inf                             # block A11
    at = fp8.combine_then_quantize(A, alg)
    d = fp8.dequantize(at)
    reads = np.array([alg.U[r, 0, 0] != 0 for r in range(alg.R)])
    assert all(np.isnan(d[r]).any() for r in np.flatnonzero(reads))
    assert all(np.isfinite(d[r]).all() for r in np.flatnonzero(~reads))


# ---- ragged shapes -----------------------------------------------------------------------------
@pytest.mark.parametrize("block", [(1, 128), (128, 128)])
def test_ragged_blocks_are_padded_with_zeros(block):
    x = _randn((200, 300), 8)
    padded = np.zeros((256, 384), np.float32)
    padded[:200, :300] = x
    a, b = fp8.quantize_blocks(x, block), fp8.quantize_blocks(padded, block)
    assert a.values.shape == (200, 300) and a.scales.shape == (-(-200 // block[0]), 3)
    assert np.array_equal(a.values, b.values[:200, :300])
    assert np.array_equal(a.scales, b.scales[:a.scales.shape[0]])
    assert np.all(b.values[200:] == 0) and np.all(b.values[:, 300:] == 0)


def test_combined_blocks_of_a_ragged_shape():
    """1000x1064x1032 through Strassen: the CUDA blocking (Kb rounded to 16), Ã's rows and K
    past A's edge zero, and every Ã_r is the sum of its blocks."""
    M, N, K = 1000, 1064, 1032
    alg = catalogue.get("strassen")
    blk = fp8.lcma_blocking(M, N, K, alg)
    assert (blk.Mb, blk.Kb, blk.Nb) == (504, 528, 536)
    A = _randn((M, K), 9)
    at = fp8.combine_then_quantize(A, alg, blocking=blk)
    assert at.values.shape == (7, 504, 528) and at.scales.shape == (7, 504, 5)
    Ap = np.zeros((2 * blk.Mb, 2 * blk.Kb), np.float32)
    Ap[:M, :K] = A
    blocks = {(i, l): Ap[i * blk.Mb:(i + 1) * blk.Mb, l * blk.Kb:(l + 1) * blk.Kb] for i in range(2) for l in range(2)}
    U, _, _ = alg.as_float()
    for r in range(alg.R):
        At_r = sum(U[r, i, l] * blocks[i, l].astype(np.float64) for i in range(2) for l in range(2))
        want = fp8.quantize_blocks(At_r.astype(np.float32), (1, 128))
        assert np.array_equal(at.values[r], want.values) and np.array_equal(at.scales[r], want.scales)
    # the products that read only A's second block row (column) see zeros past M (K)
    for r in range(alg.R):
        if not U[r, 0].any():
            assert np.all(at.values[r, M - blk.Mb:] == 0)
        if not U[r, :, 0].any():
            assert np.all(at.values[r, :, K - blk.Kb:] == 0)
    with pytest.raises(ValueError, match="blocking is for"):
        fp8.combine_then_quantize(A[:, :1000], alg, blocking=blk)


# ---- combine, then quantise --------------------------------------------------------------------
def test_plain_gemm_combine_is_the_quantisation_of_a():
    A = _randn((200, 300), 10)
    at = fp8.combine_then_quantize(A)
    blk = fp8.lcma_blocking(200, 1, 300)
    Ap = np.zeros((blk.Mb, blk.Kb), np.float32)
    Ap[:200, :300] = A
    q = fp8.quantize_blocks(Ap, (1, 128))
    assert np.array_equal(at.values[0], q.values) and np.array_equal(at.scales[0], q.scales)


@pytest.mark.parametrize("name", ["strassen", "winograd", "laderman"])
def test_combine_then_quantise_is_exact_where_the_combine_is(name):
    """Integer inputs: every fp32 combine order is exact, so Ã must be the quantisation of
    the exact combination bit for bit, whatever order a kernel sums in."""
    alg = catalogue.get(name)
    rng = np.random.default_rng(11)
    m, k, _ = alg.grid
    A = rng.integers(-200, 201, size=(m * 64, k * 128)).astype(np.float32)
    at = fp8.combine_then_quantize(A, alg)
    U, _, _ = alg.as_float(np.float32)
    Ab = A.reshape(m, 64, k, 128).transpose(0, 2, 1, 3).reshape(m * k, -1)
    any_order = (U.reshape(alg.R, -1)[:, ::-1] @ Ab[::-1]).reshape(alg.R, 64, 128)   # float32, reversed
    q = fp8.quantize_blocks(any_order, (1, 128))
    assert np.array_equal(at.values, q.values) and np.array_equal(at.scales, q.scales)


def test_combine_order_moves_at_most_one_step_rarely():
    """bf16 inputs: a kernel's float32 sums may round Ã's last bit otherwise than the
    reference's one rounding; that moves an E4M3 value only at a rounding boundary."""
    alg = catalogue.get("winograd")
    A = _randn((256, 512), 12)
    at = fp8.combine_then_quantize(A, alg)
    U, _, _ = alg.as_float(np.float32)
    Ab = A.reshape(2, 128, 2, 256).transpose(0, 2, 1, 3).reshape(4, -1)
    q = fp8.quantize_blocks((U.reshape(7, 4) @ Ab).reshape(7, 128, 256), (1, 128))
    assert np.allclose(at.scales, q.scales, rtol=2.0 ** -22, atol=0)
    diff = at.values != q.values
    assert diff.mean() < 1e-4
    step = np.abs(at.values[diff] - q.values[diff]) / np.maximum(np.abs(at.values[diff]), 2.0 ** -6)
    assert np.all(step <= 2.0 ** -3 * (1 + 1e-6))


# ---- the reference LCMA ------------------------------------------------------------------------
@pytest.mark.parametrize("name", [None, "strassen", "winograd"])
def test_float64_reference_is_the_product_of_the_dequantised_operands(name):
    M, N, K = 200, 264, 520                      # ragged: K blocks of 128 do not divide Kb
    A, B = _randn((M, K), 13), _randn((K, N), 14)
    alg = _alg(name)
    blk = fp8.lcma_blocking(M, N, K, alg)
    at, bt = fp8.combine_then_quantize(A, alg, blocking=blk), fp8.prepare_b_fp8(B, alg, blocking=blk)
    assert bt.scales.shape == (alg.R, -(-blk.Kb // 128), -(-blk.Nb // 128))
    H = fp8.dequantize(at) @ fp8.dequantize(bt)                 # one float64 product per r
    want = fp8.combine_h_reference(H, alg, blk, "float64")
    got = fp8.fp8_lcma_reference(A, B, name, accumulate="float64")
    assert got.shape == (M, N)
    assert np.max(np.abs(got - want)) <= 1e-12 * np.max(np.abs(want))


@pytest.mark.parametrize("name", [None, "strassen", "winograd"])
def test_float32_accumulation_stays_within_its_bound(name):
    """The kernels' float32 sums (per K block: a rounding of the block's product, of sa·sb, of
    the scaling and of the add; Combine H's adds) against the float64 product: elementwise
    within the first-order bound."""
    M, N, K = 256, 256, 1024
    A, B = _randn((M, K), 15), _randn((K, N), 16)
    alg = _alg(name)
    blk = fp8.lcma_blocking(M, N, K, alg)
    at, bt = fp8.combine_then_quantize(A, alg, blocking=blk), fp8.prepare_b_fp8(B, alg, blocking=blk)
    absH = np.abs(fp8.dequantize(at)) @ np.abs(fp8.dequantize(bt))
    nkb = -(-blk.Kb // 128)
    bound = fp8.combine_h_reference((nkb + 3 + alg.R) * U_F32 * absH, _abs_w(alg), blk, "float64")
    c32 = fp8.fp8_lcma_reference(A, B, alg)
    c64 = fp8.fp8_lcma_reference(A, B, alg, accumulate="float64")
    assert np.all(np.abs(c32 - c64) <= bound)
    assert np.any(c32 != c64)                    # float32 is not float64


@pytest.mark.parametrize("name", [None, "strassen"])
def test_error_against_the_exact_product_is_e4m3s(name):
    """|C − A·B| within what E4M3's rounding of Ã_r and B̃_r allows (half a step each,
    first order), elementwise: a wrong scale, block or layout lands far outside."""
    M, N, K = 128, 256, 768
    A, B = _randn((M, K), 17), _randn((K, N), 18)
    alg = _alg(name)
    blk = fp8.lcma_blocking(M, N, K, alg)
    at, bt = fp8.combine_then_quantize(A, alg, blocking=blk), fp8.prepare_b_fp8(B, alg, blocking=blk)

    def slack(bq):          # each value's error bound, from the inputs' combination and its scale
        s = fp8.expand_scales(bq.scales.astype(np.float64), bq.block, bq.values.shape)
        return 1.01 * ((U_E4M3 + U_F32) * np.abs(bq.values * s) + 2.0 ** -10 * s)
    ea, eb = slack(at), slack(bt)
    absA, absB = np.abs(fp8.dequantize(at)), np.abs(fp8.dequantize(bt))
    per_r = ea @ absB + absA @ eb + ea @ eb + 1e-6 * absA @ absB
    bound = fp8.combine_h_reference(per_r, _abs_w(alg), blk, "float64")
    err = np.abs(fp8.fp8_lcma_reference(A, B, alg) - A.astype(np.float64) @ B)
    assert np.all(err <= bound)
    rel = np.linalg.norm(err) / np.linalg.norm(A.astype(np.float64) @ B)
    assert 0.01 < rel < (0.06 if name is None else 0.12)


def test_formats_and_arguments_are_checked():
    with pytest.raises(ValueError, match="must agree"):
        fp8.Fp8BlockFormat(b_block=(64, 128))
    with pytest.raises(ValueError, match="accumulate"):
        fp8.fp8_lcma_reference(np.ones((4, 4)), np.ones((4, 4)), accumulate="bfloat16")
    with pytest.raises(ValueError, match="grid"):
        fp8.combine_then_quantize(np.ones((64, 64)), "strassen", blocking=Blocking(64, 64, 64, 3, 3, 3, 23, 16))
    with pytest.raises(ValueError, match="M×K by K×N"):
        fp8.fp8_lcma_reference(np.ones((4, 5)), np.ones((4, 4)))


# ---- against the accuracy model's fp8 operand mode ---------------------------------------------
def test_operand_mode_format_is_the_accuracy_models_quantisation():
    """operands="fp8" is the contract; accuracy._fp8_blocks (the model of it) is its
    quantisation, dequantised and rounded to float32: Ã per 1×128, B̃ per 128×128."""
    assert fp8.OPERAND_MODE == fp8.CONTRACT
    X = _randn((300, 1000), 19) * 7.0
    a = fp8.dequantize(fp8.quantize_blocks(X, (1, 128), fp8.OPERAND_MODE)).astype(np.float32)
    assert np.array_equal(a, accuracy._fp8_blocks(X, (1, 128)))
    b = fp8.dequantize(fp8.quantize_blocks(X, (128, 128), fp8.OPERAND_MODE)).astype(np.float32)
    assert np.array_equal(b, accuracy._fp8_blocks(X, (128, 128)))
    # CONTRACT divides (amax / 448), the former per-column mode multiplied (amax · fl(1/448)):
    # the same E4M3 values, and about half the scales a bit apart
    c = fp8.quantize_blocks(X, (1, 128))
    o = fp8.quantize_blocks(X, (1, 128), fp8.PER_COLUMN)
    assert np.array_equal(c.values, o.values)
    assert np.allclose(c.scales, o.scales, rtol=2.0 ** -23, atol=0) and np.any(c.scales != o.scales)


@pytest.mark.parametrize("name", ["strassen", "winograd"])
def test_reference_lcma_is_the_accuracy_models_on_the_same_inputs(name):
    """The model's fp8 LCMA (accuracy._lcma: fp32 combines, fp32 products of the dequantised
    operands, C rounded to bf16) and OPERAND_MODE's reference on the same inputs: they differ
    by the order of float32 sums and C's bf16 rounding, far below E4M3's error."""
    alg = catalogue.get(name)
    M, N, K = 128, 128, 1024
    A, B = _randn((M, K), 20), _randn((K, N), 21)
    ref = A.astype(np.float64) @ B
    model = accuracy._lcma(alg, A, B, accuracy._roundings("bfloat16", "fp8"), "unfused").astype(np.float64)
    ours = fp8.fp8_lcma_reference(A, B, alg, fp8.OPERAND_MODE)
    e_fp8 = np.linalg.norm(ours - ref)
    assert np.linalg.norm(model - ours) < 0.05 * e_fp8


def test_128x128_weights_keep_the_models_error_ratio():
    """The error ratio LCMA / plain GEMM, both in fp8: the model's prediction for
    operands="fp8" holds for the reference with 128×128 B̃ blocks and with per-column ones
    (the mode's former B side, which the measurements in bench/results were taken with)."""
    M, N, K = 256, 256, 1024
    ratios = {}
    for fmt in (fp8.PER_COLUMN, fp8.CONTRACT):
        es = {}
        for name in (None, "strassen"):
            e = []
            for seed in (22, 23):
                A, B = _randn((M, K), seed), _randn((K, N), seed + 10)
                ref = A.astype(np.float64) @ B
                e.append(np.linalg.norm(fp8.fp8_lcma_reference(A, B, name, fmt) - ref) / np.linalg.norm(ref))
            es[name] = np.mean(e)
        ratios[fmt.b_block] = es["strassen"] / es[None]
    predicted = accuracy.error_ratio("strassen", "bfloat16", operands="fp8").ratio
    for r in ratios.values():
        assert abs(r / predicted - 1) < 0.1, (ratios, predicted)


# ---- the torch quantiser -----------------------------------------------------------------------
@pytest.mark.parametrize("fmt", [fp8.CONTRACT, fp8.PER_COLUMN, fp8.DEEPGEMM], ids=["contract", "per-column", "deepgemm"])
def test_torch_quantiser_is_the_reference_bit_for_bit(fmt):
    torch = pytest.importorskip("torch")
    tf = pytest.importorskip("lcmac.torch.fp8")
    x = torch.from_numpy(_randn((333, 1000), 24) * np.logspace(-6, 3, 1000, dtype=np.float32)).bfloat16()
    x[5, :128] = 0
    for block in ((1, 128), (128, 128), (128, 1), (1, 1000)):
        q, s = tf.quantize(x, block, fmt)
        want = fp8.quantize_blocks(x.float().numpy(), block, fmt)
        assert q.dtype == torch.float8_e4m3fn and q.shape == x.shape
        assert np.array_equal(q.float().numpy(), want.values) and np.array_equal(s.numpy(), want.scales)
        d = tf.dequantize(q, s, block).numpy()
        assert np.array_equal(d, fp8.dequantize(want))


def test_scaled_mm_scale_layouts():
    torch = pytest.importorskip("torch")
    tf = pytest.importorskip("lcmac.torch.fp8")
    M, N, K = 384, 256, 640                      # K/128 = 5: padded to 8 for the 128x128 scales
    a = torch.randn(M, K)
    w = torch.randn(N, K)
    qa, sa = tf.quantize(a, (1, 128))
    qw, sw = tf.quantize(w, (128, 128))
    s_a, s_b, name = tf.scaled_mm_args(sa, (1, 128), sw, (128, 128), (M, N, K))
    assert name == "1x128,128x128"
    assert s_a.shape == (M, 5) and s_a.stride() == (1, M) and torch.equal(s_a, sa)
    assert s_b.shape == (8, 2) and s_b.stride() == (1, 8)
    assert torch.equal(s_b[:5], sw.t()) and torch.all(s_b[5:] == 0)
    _, sw1 = tf.quantize(w, (1, 128))
    _, s_b1, name = tf.scaled_mm_args(sa, (1, 128), sw1, (1, 128), (M, N, K))
    assert name == "1x128,1x128" and s_b1.shape == (N, 5) and s_b1.stride() == (1, N)
    _, sar = tf.quantize(a, (1, K))
    _, swr = tf.quantize(w, (1, K))
    s_a, s_b, name = tf.scaled_mm_args(sar, (1, K), swr, (1, K), (M, N, K))
    assert name == "rowwise" and s_a.shape == (M, 1) and s_b.shape == (1, N)
    with pytest.raises(Exception, match="no FP8 GEMM"):
        tf.recipe((1, 64), (64, 64), (M, N, K))
