"""Accuracy: how much larger an LCMA's rounding error is than the plain GEMM's.

An LCMA is exact in exact arithmetic, but its kernels round where the plain GEMM does not:
the combined operands Ã_r, B̃_r are stored in the operand dtype, H_r in the output dtype
(Algorithm 1), and C's partial sums in C's dtype (the fused epilogues).  How much that costs
depends on the algorithm's coefficients (Winograd's chained sums grow its operands more than
Strassen's) and on the dtype, and it is large next to the GEMM's own error in 2-byte dtypes,
and larger with each level (docs/accuracy.md has the H100's ratios).

``error_ratio`` predicts that factor by *simulating the kernels' rounding points* in numpy on
a thin slice of the product — every block of A and B, with ``block`` rows/columns per
block and the real K (capped at ``K_CAP[dtype]``) — against a float64 reference, for the
LCMA and for the plain GEMM on the same inputs (standard normal entries, as the benchmarks
use):

  ``unfused`` (Algorithm 1)  Ã_r = rnd(Σ u·A_il), B̃_r = rnd(Σ v·B_lj), H_r = rnd(Ã_r·B̃_r),
                             C_ij = rnd(Σ_r w·H_r), sums and products accumulated in fp32;
  ``fused``                  the same operands; C_ij = rnd(C_ij + w·H_r) in product order
                             (the register epilogue keeps partial sums in C's dtype);
  ``tma_reduce``             C_ij = rnd(C_ij + rnd(w·H_r)) (w·H_r staged in C's dtype, added
                             in L2 in C's dtype);
  plain GEMM                 C = rnd(A·B).

``rnd`` is the dtype's rounding: round-to-nearest-even for bfloat16/float16 storage; for
``tfloat32`` (the CUDA backend's float32, TF32 tensor cores) the GEMM operands keep 10
mantissa bits by truncation, as lcmac's kernels do (more error than cuBLAS-TF32's own);
float32 is plain float32 arithmetic; float64 is simulated in float32 — to first order every
term of both errors scales with the unit roundoff, so the ratio carries over.  With
``operands="fp16"`` (the CUDA backend's scaled fp16 operands) Ã/B̃ are rounded to fp16
(the power-of-two scale is exact), H stays fp32, and C is rounded to the dtype.  With
``operands="fp8"`` Ã and B̃ are E4M3 as lcmac.spec.fp8.CONTRACT (a float32 scale per 1×128
block of Ã, per 128×128 block of B̃), H stays fp32, and the ratio is against the plain GEMM on the same fp8 operands (itself ~22× the
native bf16 GEMM's error: a budget then bounds what the LCMA adds to fp8's own error).
float32 through scaled operands is judged against the plain GEMM on the same operands too:
``operands="fp16"`` rounds Ã/B̃ to fp16; ``"fp16x2"`` splits them into fp16 hi + 2⁻¹¹·lo
halves whose products are summed per 64-wide K slab and added into fp32
(``_f16x2_matmul``).  fp16x2's error is accumulation-bound, so it is simulated at the real
K (up to ``K_CAP_FP16X2``); it tracks the GPUs less closely than the storage-bound modes
(bench/experiments/accuracy.md).

Checked against the H100's measurements (tests/costmodel/test_accuracy.py): close for
bf16/fp16 and TF32, whose errors are set by the storage roundings.  float32/float64 on CPUs
are accumulation-bound, and the CPU kernels sum K in another order than numpy's sgemm: there
the prediction is indicative, as the measured ratio itself moves with the kernels' K
blocking (bench/experiments/accuracy.md).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from lcmac.core.dtypes import normalize_model_dtype
from lcmac.core.errors import DTypeError, ShapeError
from lcmac.core.result_cache import ResultCache, source_digest
from lcmac.ir import algorithm as _algorithm, catalogue
from lcmac.spec.cuda import operands as _operands
from lcmac.spec.cuda.operands import SPLIT_SHIFT, bound_exponent, scale_exponent
from lcmac.spec.fp8 import CONTRACT, dequantize as fp8_dequantize, quantize_blocks, round_e4m3

#: K simulated at most, per model dtype: storage-bound errors (2-byte, TF32) do not move with
#: K (bf16 Strassen²'s ratio is flat from K = 512 to 4096), accumulation-bound ones grow slowly
K_CAP = {"bfloat16": 1024, "float16": 1024, "tfloat32": 1024, "float32": 4096, "float64": 4096}
#: fp16x2's error is set by its fp32 accumulation over the whole K (its ratio moves with K):
#: simulated at the real K, up to this
K_CAP_FP16X2 = 32768


def _k_cap(d: str, operands: str) -> int:
    return K_CAP_FP16X2 if operands == "fp16x2" else K_CAP[d]


VARIANTS = ("unfused", "fused", "tma_reduce")
#: what each model dtype simulates (an ErrorEstimate's ``precision``)
PRECISIONS = {
    "bfloat16": "bfloat16 storage, fp32 accumulation",
    "float16": "float16 storage, fp32 accumulation",
    "tfloat32": "TF32 GEMM operands (truncated), fp32 storage and accumulation",
    "float32": "float32 arithmetic",
    "float64": "float32 arithmetic (first-order proxy for float64)",
}


def _bf16(x: np.ndarray) -> np.ndarray:
    """Round float32 to the nearest bfloat16 (ties to even), returned as float32.  In uint32:
    finite values cannot carry out of 32 bits (the simulation has no NaN or inf)."""
    u = np.array(x, dtype=np.float32, copy=True).view(np.uint32)
    lsb = (u >> 16) & 1
    u += np.uint32(0x7FFF)
    u += lsb
    u &= np.uint32(0xFFFF0000)
    return u.view(np.float32)


def _f16(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, dtype=np.float32).astype(np.float16).astype(np.float32)


def _tf32_trunc(x: np.ndarray) -> np.ndarray:
    return (np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
            & np.uint32(0xFFFFE000)).view(np.float32)


def _f32(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, dtype=np.float32)


#: float32 → the nearest E4M3 value, saturating at ±448 (the contract's rounding)
_e4m3 = round_e4m3


def _fp8_blocks(X: np.ndarray, block) -> np.ndarray:
    """The CUDA backend's fp8 operands (lcmac.spec.fp8.CONTRACT: Ã per 1×128, B̃ per 128×128
    ``block`` over the last two dimensions), dequantized and rounded to float32 (the GEMM
    applies the scales to each 128-wide slab's fp32 product; the order of those fp32
    multiplies is below E4M3's rounding)."""
    return fp8_dequantize(quantize_blocks(X, block)).astype(np.float32)


def _f16x2_matmul(At: np.ndarray, Bt: np.ndarray, ea: int, eb: int) -> np.ndarray:
    """The CUDA backend's fp16x2 GEMM stage (schedules.cuda.low_precision.scaled_gemm), batched: operands
    scaled by 2**ea / 2**eb (exact) and split into fp16 hi + 2**-11·lo halves; per 64-wide K
    slab the tensor cores sum hi·lo + lo·hi (modelled as exact, rounded to fp32 once per
    wgmma), it is added ×2**-11 into the fp32 accumulator, then hi·hi likewise; lo·lo is
    dropped.  Returns float32."""

    def split(X, e):
        v = X.astype(np.float32) * np.float32(2.0 ** e)             # exact: a power of two
        hi = v.astype(np.float16).astype(np.float32)
        lo = ((v - hi) * np.float32(2.0 ** SPLIT_SHIFT)).astype(np.float16)
        return hi.astype(np.float64), lo.astype(np.float64)
    k = At.shape[-1]
    pad = -k % 64
    At = np.concatenate([At, np.zeros(At.shape[:-1] + (pad,), At.dtype)], -1) if pad else At
    Bt = np.concatenate([Bt, np.zeros(Bt.shape[:-2] + (pad,) + Bt.shape[-1:], Bt.dtype)], -2) if pad else Bt
    ns = At.shape[-1] // 64
    ah, al = (np.moveaxis(x.reshape(x.shape[:-1] + (ns, 64)), -2, -3) for x in split(At, ea))
    bh, bl = (x.reshape(x.shape[:-2] + (ns, 64) + x.shape[-1:]) for x in split(Bt, eb))
    # every slab's products at once ([.., slab, rows, cols]), summed exactly (float64: 64
    # products of 11-bit halves) and rounded once per wgmma, then the fp32 adds in order;
    # summing the slabs in float32 instead overstates the ratio by ~9 % (Strassen, K = 8192)
    f32 = lambda x: x.astype(np.float32)                # noqa: E731
    cross = f32(f32(ah @ bl) + (al @ bh)) * np.float32(2.0 ** -SPLIT_SHIFT)
    main = f32(ah @ bh)
    C = np.zeros(main.shape[:-3] + main.shape[-2:], np.float32)
    for j in range(ns):
        C = C + cross[..., j, :, :]
        C = C + main[..., j, :, :]
    return C * np.float32(2.0 ** -(ea + eb))


def _fp16x2_scales(A: np.ndarray, B: np.ndarray, la: int, lb: int) -> tuple[int, int]:
    """The power-of-two exponents the kernels scale Ã and B̃ by (schedules.cuda.config.scale_exponent
    of each input's amax and its combine bound)."""
    return (scale_exponent(float(np.abs(A).max()), la), scale_exponent(float(np.abs(B).max()), lb))


@dataclass(frozen=True)
class _Roundings:
    """Where the kernels round: the combined operands Ã (``op``, applied to [.., rows, K])
    and B̃ (``op_b``, to [.., K, cols]; default ``op``), H (``h``, Algorithm 1), C and its
    partial sums (``c``), and the GEMM's own view of its operands (``feed``).  ``own_gemm``:
    the ratio's baseline is the plain GEMM in this operand mode, not the native one."""
    op: object
    h: object
    c: object
    feed: object
    op_b: object = None
    own_gemm: bool = False
    #: the GEMM stage on the rounded operands when it is not one fp32 product (fp16x2):
    #: f(Ã, B̃, A, B, U, V) with the inputs and combine matrices its scales derive from
    gemm: object = None

    @property
    def b(self):
        return self.op_b or self.op


def _roundings(d: str, operands: str) -> _Roundings:
    if operands == "native":
        store, feed = {"bfloat16": (_bf16, _f32), "float16": (_f16, _f32),
                       "tfloat32": (_f32, _tf32_trunc)}.get(d, (_f32, _f32))
        return _Roundings(store, store, store, feed)
    if operands == "fp16" and d in ("bfloat16", "float16"):
        # Ã/B̃ stored as power-of-two-scaled fp16 (the scale is exact), H kept in fp32
        return _Roundings(_f16, _f32, _bf16 if d == "bfloat16" else _f16, _f32)
    if operands == "fp8" and d in ("bfloat16", "float16"):
        # E4M3, Ã per 1x128 and B̃ per 128x128 block, H in fp32; against the fp8 plain GEMM,
        # itself ~22x the native GEMM's error
        return _Roundings(lambda X: _fp8_blocks(X, CONTRACT.a_block), _f32, _bf16 if d == "bfloat16" else _f16,
                          _f32, op_b=lambda X: _fp8_blocks(X, CONTRACT.b_block), own_gemm=True)
    if operands == "fp16" and d == "float32":
        # float32 through scaled fp16 operands: against the plain GEMM on the same operands
        # (its error is fp16's, far above SGEMM's)
        return _Roundings(_f16, _f32, _f32, _f32, own_gemm=True)
    if operands == "fp16x2" and d == "float32":
        # Ã/B̃ and H in fp32, the GEMM stage split into fp16 halves; against the fp16x2
        # plain GEMM (itself more accurate than SGEMM)
        return _Roundings(_f32, _f32, _f32, _f32, own_gemm=True, gemm=_f16x2_stage)
    raise ValueError(f"the accuracy model covers operands='native', 'fp16' and 'fp8' for "
                     f"bfloat16 and float16, and 'fp16' and 'fp16x2' for float32; not "
                     f"operands={operands!r} with {d}")


def _f16x2_stage(At, Bt, A, B, U, V):
    ea, eb = _fp16x2_scales(A, B, bound_exponent(U), bound_exponent(V))
    return _f16x2_matmul(At, Bt, ea, eb)


@dataclass(frozen=True)
class ErrorEstimate:
    """``ratio``: the LCMA's normwise relative error ÷ the plain GEMM's (mean of the samples);
    ``spread``: (max − min) / mean of the per-sample ratios; ``lcma_error``, ``gemm_error``:
    mean ‖Ĉ − C‖_F / ‖C‖_F; ``shape``: the simulated (M, N, K)."""
    algorithm: str
    dtype: str
    variant: str
    precision: str
    ratio: float
    spread: float
    lcma_error: float
    gemm_error: float
    samples: int
    shape: tuple[int, int, int]

    def to_dict(self) -> dict:
        return {"algorithm": self.algorithm, "dtype": self.dtype, "variant": self.variant,
                "precision": self.precision, "ratio": self.ratio, "spread": self.spread,
                "lcma_error": self.lcma_error, "gemm_error": self.gemm_error,
                "samples": self.samples, "shape": list(self.shape)}


def _lcma(alg, A, B, rd: _Roundings, variant) -> np.ndarray:
    """C = A·B through ``alg`` as the kernels round it (module doc), in float32."""
    m, k, n = alg.grid
    R = alg.R
    bm, kb, bn = A.shape[0] // m, A.shape[1] // k, B.shape[1] // n
    U, V, W = (t.astype(np.float32).reshape(R, -1) for t in alg.as_float(np.float64))
    Ab = A.reshape(m, bm, k, kb).transpose(0, 2, 1, 3).reshape(m * k, bm * kb)
    Bb = B.reshape(k, kb, n, bn).transpose(0, 2, 1, 3).reshape(k * n, kb * bn)
    # the combines sum in fp32 and store once (single blocks with coefficient 1 are exact);
    # as one matrix product each, so that numpy hands them to BLAS
    At = rd.feed(rd.op((U @ Ab).reshape(R, bm, kb)))
    Bt = rd.feed(rd.b((V @ Bb).reshape(R, kb, bn)))
    H = np.matmul(At, Bt) if rd.gemm is None else rd.gemm(At, Bt, A, B, U, V)  # fp32 accumulation
    if variant == "unfused":
        Cb = rd.c(W.T @ rd.h(H).reshape(R, bm * bn)).reshape(m, n, bm, bn)
    else:
        W3 = W.reshape(R, m, n)
        Cb = np.zeros((m, n, bm, bn), dtype=np.float32)
        seen = np.zeros((m, n), dtype=bool)
        for r in range(R):
            for i, j in zip(*np.nonzero(W3[r])):
                term = W3[r, i, j] * H[r]
                if variant == "tma_reduce":
                    term = rd.c(term)
                Cb[i, j] = rd.c(term if not seen[i, j] else Cb[i, j] + term)
                seen[i, j] = True
    return Cb.transpose(0, 2, 1, 3).reshape(m * bm, n * bn)


def _model_dtype(dtype) -> str:
    if str(dtype) == "tfloat32":
        return "tfloat32"
    d = normalize_model_dtype(dtype)
    if d not in PRECISIONS:
        raise DTypeError(f"the accuracy model does not cover {d}; it covers "
                         f"{', '.join(PRECISIONS)}")
    return d


def check_covered(dtype, operands: str = "native") -> str:
    """The model dtype for ``dtype``; DTypeError / ValueError where the model has no answer."""
    d = _model_dtype(dtype)
    _roundings(d, operands)
    return d


def error_ratio(algorithm, dtype="bfloat16", *, variant: str = "unfused", operands: str = "native",
                K: int | None = None, samples: int = 3, block: int | None = None, seed: int = 0,
                inputs=None) -> ErrorEstimate:
    """Predicted error of ``algorithm`` (a catalogue expression or an ``Algorithm``) as a
    multiple of the plain GEMM's, in ``dtype`` ("bfloat16", "float16", "tfloat32" for the
    CUDA backend's float32, "float32", "float64"), for the ``variant`` of Combine H
    (module doc).  ``operands="fp16"`` (bfloat16/float16 only): the CUDA backend's scaled
    fp16 Ã/B̃ with H in fp32, still against the native GEMM's error; ``operands="fp8"``
    (bfloat16/float16): E4M3 Ã/B̃ with 1×128 block scales; ``"fp16"`` and ``"fp16x2"`` with
    ``dtype="float32"``: the scaled operand modes of the CUDA float32 path — these three
    against the plain GEMM on the same operands.  ``K``: the product's inner dimension
    (simulated up to ``K_CAP[dtype]``; fp16x2: ``K_CAP_FP16X2``; None: ``K_CAP[dtype]``).

    The ratio depends on the data: the default inputs are standard normal (zero mean, like
    normalised activations and weights; heavy-tailed ones give about the same), while
    nonnegative data cancels less and gives much smaller ratios (docs/accuracy.md).  ``inputs=(A, B)`` (numpy arrays
    or CPU tensors, A M×K and B K×N) simulates on a thin sample of those matrices instead:
    ``block`` random rows of each block row of A and columns of each block column of B, and
    the same random offsets within every K block.  ``block`` defaults to 32, and to 16 for
    fp16x2, which simulates the real K (as close as 32, in a third of the time).

    Results on the default inputs are kept for the process and on disk, for the next ones
    (``<lcmac cache root>/accuracy/``, keyed by everything they depend on: ``_disk_key``);
    ``LCMAC_CACHE_DIR=off`` keeps them in the process only.  ``inputs=`` are never kept."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {', '.join(VARIANTS)}, got {variant!r}")
    if block is None:
        block = 16 if operands == "fp16x2" else 32
    if samples < 1 or block < 1:
        raise ValueError(f"samples and block must be positive, got {samples} and {block}")
    if K is not None and K < 1:
        raise ValueError(f"K must be positive, got {K}")
    d = check_covered(dtype, operands)
    if isinstance(algorithm, str):
        alg = catalogue.get(algorithm)
        name = algorithm
    else:
        alg, name = algorithm, algorithm.name
    if inputs is not None:
        return _estimate(name, alg, d, variant, operands, samples,
                         _sampler(alg, inputs, block, _k_cap(d, operands), seed))
    ks = min(K, _k_cap(d, operands)) if K else K_CAP[d]
    ks = max(alg.k, ks - ks % alg.k)
    return _cached(name, alg.hash, alg if not isinstance(algorithm, str) else None, d, variant,
                   operands, ks, samples, block, seed)


#: the screen's K for fp16x2: its ratios fall as K grows, so a screen at a shorter K only overstates, by less than the decision's margin
SCREEN_K_FP16X2 = 4096


def screen_ratio(algorithm, dtype, *, variant: str = "unfused", operands: str = "native",
                 K: int | None = None) -> float:
    """A cheap ``error_ratio`` for screening candidates against a budget (one sample of 16
    rows/columns per block; fp16x2 at K ≤ SCREEN_K_FP16X2): a few % of noise, and for fp16x2
    an overstatement of up to ~17 %, both below ``decision.SCREEN_MARGIN``."""
    if operands == "fp16x2" and K is not None:
        K = min(K, SCREEN_K_FP16X2)
    return error_ratio(algorithm, dtype, variant=variant, operands=operands, K=K, samples=1,
                       block=16).ratio


#: the default simulations' results on disk, between processes (``lcmac.core.result_cache``:
#: ``<lcmac cache root>/accuracy/``; ``LCMAC_CACHE_DIR=off`` keeps them in this process only)
_DISK = ResultCache("accuracy")
#: the sources a simulated result depends on besides its inputs: this module (the roundings,
#: the simulation), the CUDA operand modes' constants and scales, and the coefficients' floats
_SOURCES = (__file__, _operands.__file__, _algorithm.__file__)


@functools.lru_cache(maxsize=1024)
def _cached(name, _hash, alg, d, variant, operands, ks, samples, block, seed) -> ErrorEstimate:
    if alg is None:
        alg = catalogue.get(name)
    m, k, n = alg.grid
    key = _disk_key(_hash, d, variant, operands, ks, samples, block, seed)
    shape = (m * block, n * block, ks)
    hit = _from_disk(_DISK.get(key), name, d, variant, operands, samples, shape) if key else None
    if hit is not None:
        return hit
    rng = np.random.default_rng(seed)

    def normal():
        return (rng.standard_normal((m * block, ks), dtype=np.float32),
                rng.standard_normal((ks, n * block), dtype=np.float32))
    e = _estimate(name, alg, d, variant, operands, samples, normal)
    if key:
        _DISK.put(key, e.to_dict())
    return e


def _disk_key(alg_hash, d, variant, operands, ks, samples, block, seed) -> dict | None:
    """Everything a default simulation's result depends on: the algorithm's coefficients
    (``Algorithm.hash``), the roundings (dtype, variant, operand mode), the simulated slice
    (K, samples, block), the inputs (numpy's generator seeded with ``seed``), the code that
    computes it (``_SOURCES``) and numpy's version (its generator and roundings); None for
    a call whose result cannot be keyed (a seed that is not an integer draws new inputs)."""
    ints = (ks, samples, block, seed)
    if not all(isinstance(x, (int, np.integer)) and not isinstance(x, bool) for x in ints):
        return None
    digest = source_digest(_SOURCES)
    if digest is None:
        return None
    return {"kind": "lcmac-error-estimate/1", "algorithm": str(alg_hash), "dtype": d,
            "variant": variant, "operands": operands, "K": int(ks), "samples": int(samples),
            "block": int(block), "seed": int(seed), "sources": digest, "numpy": np.__version__}


def _from_disk(v: dict | None, name, d, variant, operands, samples, shape) -> ErrorEstimate | None:
    """The ``ErrorEstimate`` a disk entry holds, if it is a whole one of this case."""
    if v is None:
        return None

    def num(x):
        if isinstance(x, bool) or not isinstance(x, (int, float)):
            raise TypeError(f"{x!r} is not a number")
        return float(x)
    try:
        got = tuple(v["shape"])
        prec = _precision(d, operands)
        if (v["dtype"], v["variant"], v["precision"], v["samples"], got) != \
                (d, variant, prec, samples, shape):
            return None
        return ErrorEstimate(name, d, variant, prec, num(v["ratio"]), num(v["spread"]),
                             num(v["lcma_error"]), num(v["gemm_error"]), samples, shape)
    except (KeyError, TypeError, ValueError):
        return None


def _sampler(alg, inputs, block: int, k_cap: int, seed: int):
    """A function drawing the thin slice of the user's (A, B) that ``error_ratio`` simulates
    (the blocks as the kernels cut them: padded with zeros to a multiple of the grid)."""
    try:
        A, B = (np.asarray(x.detach().cpu().float() if hasattr(x, "detach") else x, dtype=np.float32)
                for x in inputs)
    except (TypeError, ValueError) as e:
        raise ValueError(f"inputs must be a pair (A, B) of 2-D arrays: {e}") from None
    if A.ndim != 2 or B.ndim != 2 or A.shape[1] != B.shape[0]:
        raise ShapeError(f"inputs must be A (M x K) and B (K x N), got {A.shape} and {B.shape}")
    if not (np.isfinite(A).all() and np.isfinite(B).all()):
        raise ValueError("inputs hold inf or NaN: a relative error is not defined for them")
    m, k, n = alg.grid
    (M, K), N = A.shape, B.shape[1]
    Mb, Kb, Nb = -(-M // m), -(-K // k), -(-N // n)
    kb = min(Kb, max(1, k_cap // k))
    rng = np.random.default_rng(seed)

    def pick(size, parts, per):          # indices (or -1: a zero row of the padding)
        out = []
        for i in range(parts):
            real = np.arange(i * per, min((i + 1) * per, size))
            out.append(rng.choice(real, block) if len(real) else np.full(block, -1))
        return np.concatenate(out)

    def take(X, rows, cols):
        Y = np.zeros((len(rows), len(cols)), dtype=np.float32)
        r_ok, c_ok = rows >= 0, cols >= 0
        Y[np.ix_(r_ok, c_ok)] = X[np.ix_(rows[r_ok], cols[c_ok])]
        return Y

    def draw():
        off = rng.choice(Kb, kb, replace=False)
        ks = np.concatenate([l * Kb + off for l in range(k)])
        ks = np.where(ks < K, ks, -1)
        return take(A, pick(M, m, Mb), ks), take(B.T, pick(N, n, Nb), ks).T
    return draw


def _precision(d: str, operands: str) -> str:
    return PRECISIONS[d] if operands == "native" else f"{operands} operands, {PRECISIONS[d]}"


def _estimate(name, alg, d, variant, operands, samples, draw) -> ErrorEstimate:
    rd = _roundings(d, operands)
    native = _roundings(d, "native")
    base = rd if rd.own_gemm else native
    ratios, el, eg = [], [], []
    for _ in range(samples):
        A, B = draw()
        # inputs exactly representable in the dtype, as a user's tensors are
        A, B = native.c(A), native.c(B)
        ref = A.astype(np.float64) @ B.astype(np.float64)
        nrm = np.linalg.norm(ref)
        if nrm == 0:
            raise ValueError("the sampled product A·B is zero: a relative error is not defined "
                             "(inputs of zeros, or too sparse for the sample)")
        # the plain GEMM (native: its operand rounding is the identity on the rounded inputs)
        if base.gemm is None:
            g = base.c(base.feed(base.op(A)) @ base.feed(base.b(B)))
        else:
            one = np.ones((1, 1), np.float32)
            g = base.c(base.gemm(A[None], B[None], A, B, one, one)[0])
        e_g = np.linalg.norm(g - ref) / nrm
        e_l = np.linalg.norm(_lcma(alg, A, B, rd, variant) - ref) / nrm
        ratios.append(e_l / e_g)
        el.append(e_l)
        eg.append(e_g)
    mean = float(np.mean(ratios))
    return ErrorEstimate(name, d, variant, _precision(d, operands), mean,
                         float((max(ratios) - min(ratios)) / mean), float(np.mean(el)),
                         float(np.mean(eg)), samples, tuple(int(x) for x in (A.shape[0], B.shape[1], A.shape[1])))


# ---- checking the model against measured runs -----------------------------------------------
def cuda_model_args(dtype, config: dict) -> tuple[str, str, str]:
    """(model dtype, variant, operands) for an artifact of the CUDA backend built with
    ``config`` (a ``CudaConfig.to_dict()``); keys missing from older records take the
    defaults of their time (not fused into the TMA engine, native operands)."""
    d = normalize_model_dtype(dtype)
    operands = config.get("operands", "native")
    variant = ("tma_reduce" if config.get("tma_reduce") else
               "fused" if config.get("fused") else "unfused")
    return ("tfloat32" if d == "float32" and operands == "native" else d), variant, operands


def compare_with_run(dtype, rows: list[dict]) -> list[dict]:
    """The model next to a ``scripts/bench_cuda.py`` run (its ``dtype`` and ``results``):
    for every LCMA row the model covers, the measured ratio — error ÷ cuBLAS's for 2-byte
    dtypes (cuBLAS rounds as the model's plain GEMM does), ÷ lcmac's own GEMM (same operand
    mode, same shape) for TF32, whose operands lcmac truncates and cuBLAS rounds, and for fp8,
    whose baseline is the fp8 plain GEMM — and the predicted one.  Rows the model does not
    cover (fp16x2) are skipped."""
    gemm_err = {(tuple(r["shape"]), (r.get("config") or {}).get("operands", "native")): r["rel_err"]
                for r in rows if r.get("algorithm") == "gemm" and r.get("rel_err")}
    out = []
    for r in rows:
        alg, cfg = r.get("algorithm"), r.get("config") or {}
        if alg in (None, "gemm") or not r.get("rel_err"):
            continue
        try:
            md, variant, operands = cuda_model_args(dtype, cfg)
            check_covered(md, operands)
        except (ValueError, DTypeError):
            continue
        if md == "tfloat32" or _roundings(md, operands).own_gemm:
            base = gemm_err.get((tuple(r["shape"]), operands))
            if not base:
                continue
            measured = r["rel_err"] / base
        elif r.get("err_vs_cublas"):
            measured = r["err_vs_cublas"]
        else:
            continue
        e = error_ratio(alg, md, variant=variant, operands=operands, K=r["shape"][2])
        out.append({"variant": r.get("variant"), "algorithm": alg, "shape": list(r["shape"]),
                    "model_dtype": md, "model_variant": variant, "operands": operands,
                    "measured": measured, "predicted": e.ratio,
                    "deviation": e.ratio / measured - 1.0})
    return out
