"""CUDA artifacts on a GPU: correctness against a float64 reference (run on the lent H100).

    pytest -m gpu tests/test_cuda_gpu.py

Builds every (algorithm, shape) artifact once per session, in parallel TileLang worker
processes (LCMAC_TEST_JOBS, default 16), under .cuda-art/tests/, then loads each through
``lcmac.runtime.cuda_loader`` (no TileLang in the loading path) and compares with float64.
Skipped without a CUDA GPU.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = str(Path(__file__).resolve().parents[3])     # the repository

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _catalogue_pick(grid_pred):
    try:
        from lcmac.ir import catalogue
        for a in catalogue.all_algorithms():
            if grid_pred(a.grid):
                return a.name
    except Exception:
        return None
    return None


ALGOS = ["gemm", "strassen", "strassen^2", "winograd"]
_three = _catalogue_pick(lambda g: g[0] == 3)                  # e.g. laderman <3,3,3;23>
_445 = _catalogue_pick(lambda g: sorted(g) == [4, 4, 5])        # e.g. <4,4,5;61>
ALGOS += [a for a in (_three, _445) if a]

# shapes (M, N, K): K, N multiples of 8 (16-byte rows); many do not divide the block grid
SHAPES = {
    "gemm": [(256, 256, 256), (1000, 1064, 1032), (129, 136, 72)],
    "strassen": [(512, 512, 512), (1000, 1064, 1032), (257, 264, 200), (2048, 1024, 4096),
                 (33, 40, 48), (4096, 4096, 4096)],
    "strassen^2": [(1024, 1024, 1024), (999, 1000, 1000), (520, 264, 1032)],
    "winograd": [(512, 512, 512), (777, 520, 1048), (2048, 2048, 2048)],
    _three: [(768, 768, 768), (1000, 1000, 1000)],
    _445: [(1024, 1024, 1280), (900, 1000, 1000)],
}
def _default_cfg(algo):
    """R <= 7: the fused GEMM + Combine-H kernel (overlapped epilogue); larger ranks: the
    unfused path (their fused kernel has one epilogue branch per product: slow to compile and
    slow to run, see docs/cuda.md)."""
    if algo in ("gemm", "strassen", "winograd"):
        return {"fused": True, "overlap_epilogue": True} if algo != "gemm" else {}
    return {"fused": False}


CASES = [(a, s, _default_cfg(a)) for a in ALGOS for s in SHAPES[a]]
CASES += [("strassen", (1000, 1064, 1032), {"fused": False}),
          ("strassen", (1000, 1064, 1032), {}),
          ("strassen", (1024, 1024, 1024), {"fused": True, "r_order": "greedy", "policy": "square", "stages": 3}),
          ("strassen", (1000, 1064, 1032), {"cache_aware": False}),
          ("winograd", (640, 648, 656), {"fused": False})]
# persistent split-group kernel (+ fixup): 12 groups on 132 CTAs (each cut into 7
# one-product pieces), whole rounds + split tail at 6144x6144, another grid size, Winograd's
# W (the fused cache-aware ablation, rotated walks, hangs and is refused)
SG = {"fused": True, "split_group": True}
CASES += [("strassen", (1000, 1064, 1032), SG),
          ("strassen", (1000, 1064, 1032), {**SG, "overlap_epilogue": True}),
          ("strassen", (1000, 1064, 1032), {**SG, "persistent_ctas": 40}),
          ("strassen", (6144, 6144, 1024), {**SG, "overlap_epilogue": True}),
          ("strassen", (6144, 6144, 1024), {"fused": True, "persistent": True}),
          ("winograd", (2048, 2048, 2048), {**SG, "overlap_epilogue": True})]
# the fused kernel with its Combine-H epilogue on the TMA engine (tma_reduce: stores and
# cp.reduce.async.bulk adds into C): one group per CTA, several groups per CTA with a tail
# (24 tile positions on 5 CTAs), Winograd's W, rank 49 with mixed-sign products, Laderman's
# <3,3,3;23>
TR = {"fused": True, "tma_reduce": True, "stages": 3}
TR_CASES = [("strassen", (1024, 1024, 1024), TR),
            ("strassen", (2048, 1536, 1024), {**TR, "persistent_ctas": 5}),
            ("winograd", (2048, 2048, 2048), TR),
            ("strassen^2", (2048, 2048, 1024), TR)]
TR_CASES += [("laderman", (768, 768, 768), TR)]
CASES += TR_CASES
# a scheme with rational coefficients (W in ±1/2, ±1/4, ±1/8; Ã_r sums of up to 16 blocks):
# <4,4,4;48>, on a shape the grid divides and one it does not
CASES += [("dps-4x4x4-r48", (1024, 1024, 1024), {"fused": False}),
          ("dps-4x4x4-r48", (1000, 1000, 1000), {"fused": False})]
# the accuracy model (lcmac.costmodel.accuracy) against the kernels: artifacts of CASES whose
# measured error ÷ cuBLAS's is compared with the predicted ratio (Algorithm 1, the register
# epilogue, the TMA-engine epilogue; several schemes)
MODEL_CASES = [("strassen", (1000, 1064, 1032), {"fused": False}),
               ("strassen", (512, 512, 512), _default_cfg("strassen")),
               ("winograd", (640, 648, 656), {"fused": False}),
               ("strassen^2", (1024, 1024, 1024), {"fused": False}),
               ("dps-4x4x4-r48", (1024, 1024, 1024), {"fused": False})] + TR_CASES[:1] + TR_CASES[2:]
MODEL_CASES += [(a, SHAPES[a][0], {"fused": False}) for a in (_three, _445) if a]
# buffers of more than 2³¹ elements (the LLM vocabulary projections; 64-bit index arithmetic,
# common.extents): H and C of Strassen, B̃ and H of Strassen² (these faulted or returned
# garbage with int32 extents: lcmac/data/tuning_logs/cuda-sm90a-bfloat16.jsonl)
LARGE = [("strassen", (16384, 151936, 4096), {"fused": False}),
         ("strassen^2", (8192, 129280, 7168), {"fused": False})]
DTYPE_CASES = [("strassen", (1000, 1064, 1032), "fp16"), ("gemm", (1000, 1064, 1032), "fp16"),
               ("strassen", (1024, 1024, 1024), "fp32"), ("gemm", (1024, 1024, 1024), "fp32")]
DTYPE_CFG = {"gemm": {}, "strassen": {"fused": False}}
# scaled fp16 operands (CudaConfig.operands): (algo, shape, dtype, cfg, bound on the error as a
# multiple of cuBLAS's on the same inputs — SGEMM's for float32, without TF32).
# fp16x2 keeps ~22 of float32's 24 bits (plus fp32 accumulation) for the GEMM stage: the
# plain GEMM lands at SGEMM's error, an LCMA adds its own fp32 error growth; bf16 with one
# scaled fp16 operand: the bound, 1.5x cuBLAS for one level
X2 = {"operands": "fp16x2", "fused": False, "block_n": 128, "stages": 3}
F16 = {"operands": "fp16", "fused": False}
SCALED_CASES = [("gemm", (1000, 1064, 1032), "fp32", X2, 2.0),
                ("gemm", (129, 136, 72), "fp32", X2, 2.0),
                ("strassen", (1000, 1064, 1032), "fp32", X2, 4.0),
                ("strassen", (257, 264, 200), "fp32", X2, 4.0),
                ("winograd", (777, 520, 1048), "fp32", X2, 6.0),
                ("strassen^2", (999, 1000, 1000), "fp32", X2, 8.0),
                ("gemm", (1000, 1064, 1032), "fp32", F16, 2000.0),
                ("strassen", (1000, 1064, 1032), "fp32", F16, 2000.0),
                ("strassen", (1000, 1064, 1032), "bf16", F16, 1.5),
                ("strassen", (2048, 2048, 2048), "bf16", F16, 1.5),
                ("winograd", (777, 520, 1048), "bf16", F16, 1.5),
                ("strassen^2", (520, 264, 1032), "bf16", F16, 2.0),
                ("gemm", (1000, 1064, 1032), "bf16", F16, 1.5)]
# E4M3 operands, block-scaled (operands="fp8", the contract of lcmac.spec.fp8): (algo, shape, dtype, bound on the
# error as a multiple of the error of quantizing A and B the same way and multiplying
# exactly — the plain GEMM's own floor; an LCMA quantizes combined operands and adds
# products, so it lands above it)
FP8 = {"operands": "fp8", "fused": False}
FP8_CASES = [("gemm", (1000, 1064, 1032), "bf16", 1.1),
             ("gemm", (129, 136, 72), "bf16", 1.1),
             ("gemm", (1000, 1064, 1032), "fp16", 1.1),
             ("strassen", (1000, 1064, 1032), "bf16", 2.5),
             ("strassen", (2048, 2048, 2048), "bf16", 2.5),
             ("winograd", (777, 520, 1048), "bf16", 3.0),
             ("laderman", (999, 600, 776), "bf16", 4.0)]
# GEMM-stage layouts that must not change a bit, each beside the default (output tile stored
# through shared memory, grid kernel): 2-CTA clusters sharing B slabs by TMA multicast (cluster=2), the
# tile stored from registers (store_via_smem=False), both; non-dividing shapes, several
# waves, rank 49; the persistent GEMM stage (persistent=True: P CTAs walking the grid's
# tile order in one pipeline), with several tiles per CTA, r fastest, a 10-CTA grid
C2, DIRECT, PERSIST = {"cluster": 2}, {"store_via_smem": False}, {"persistent": True}
VIEWS = {"direct_views": "ab"}
NO_VIEWS = {"direct_views": "none"}
GRID = {"persistent": False}      # the one-tile-per-CTA grid kernel (the default on sm_90a is
                                  # the persistent one where it applies)
SAME_BITS_CASES = [("gemm", (1000, 1064, 1032), GRID, C2),
                   ("gemm", (1000, 1064, 1032), GRID, DIRECT),
                   ("gemm", (4096, 4096, 4096), GRID, C2),
                   ("strassen", (1000, 1064, 1032), {"fused": False, **GRID}, C2),
                   ("strassen", (1000, 1064, 1032), {"fused": False, **GRID}, DIRECT),
                   ("strassen", (4096, 4096, 4096), {"fused": False, "stages": 3, **GRID}, {**C2, **DIRECT}),
                   ("strassen^2", (999, 1000, 1000), {"fused": False, **GRID}, C2),
                   ("winograd", (2048, 2048, 2048), {"fused": False, **GRID}, DIRECT),
                   ("gemm", (1000, 1064, 1032), GRID, PERSIST),
                   ("gemm", (4096, 4096, 4096), GRID, PERSIST),
                   ("strassen", (1000, 1064, 1032), {"fused": False, **GRID}, PERSIST),
                   ("strassen", (1000, 1064, 1032), {"fused": False, **GRID}, {**PERSIST, "persistent_ctas": 10}),
                   ("strassen", (1000, 1064, 1032), {"fused": False, "cache_aware": False, **GRID}, PERSIST),
                   ("strassen", (4096, 4096, 4096), {"fused": False, **GRID}, PERSIST),
                   ("strassen^2", (999, 1000, 1000), {"fused": False, **GRID}, PERSIST),
                   ("winograd", (2048, 2048, 2048), {"fused": False, **GRID}, {**PERSIST, **DIRECT}),
                   # single-block operands read from A / B in place (direct_views) against every
                   # operand written ("none"; the default "auto" reads in place): persistent
                   # (several waves, a 10-CTA grid, r fastest), the grid kernel, one side only,
                   # Winograd (3 per side, one product with both), Strassen², Laderman <3,3,3>,
                   # and two schemes with −1 single blocks (read un-negated, the sign moved into
                   # Combine H: fg-3x3x3-r23-b 8 of 23 A operands, at-4x4x4-r49 8 of 49 per side)
                   ("strassen", (4096, 4096, 4096), {"fused": False, **NO_VIEWS}, VIEWS),
                   ("strassen", (2048, 4096, 1024), {"fused": False, **NO_VIEWS}, {**VIEWS, "persistent_ctas": 10}),
                   ("strassen", (2048, 4096, 1024), {"fused": False, **GRID, **NO_VIEWS}, VIEWS),
                   ("strassen", (2048, 2048, 2048), {"fused": False, "cache_aware": False, **NO_VIEWS},
                    {"direct_views": "a"}),
                   ("strassen", (2048, 2048, 2048), {"fused": False, **NO_VIEWS}, {"direct_views": "b"}),
                   ("winograd", (2048, 2048, 2048), {"fused": False, **NO_VIEWS}, VIEWS),
                   ("strassen^2", (2048, 2048, 2048), {"fused": False, **NO_VIEWS}, VIEWS),
                   ("laderman", (1536, 1536, 1536), {"fused": False, **NO_VIEWS}, VIEWS),
                   ("fg-3x3x3-r23-b", (1536, 1536, 1536), {"fused": False, **NO_VIEWS}, VIEWS),
                   ("at-4x4x4-r49", (2048, 2048, 2048), {"fused": False, **NO_VIEWS}, VIEWS)]
#: the scaled-operand artifact the magnitude and inf tests reuse (one of SCALED_CASES)
EDGE_CASE = ("strassen", (1000, 1064, 1032))

_BUILT: dict = {}


def _dir(algo, shape, cfg, dtype):
    tag = "-".join([algo.replace("^", "sq"), dtype, "x".join(map(str, shape))]
                   + [f"{k}{v}" for k, v in sorted(cfg.items())])
    return os.path.join(ROOT, ".cuda-art", "tests", tag)


def _build(algo, shape, cfg, dtype):
    d = _dir(algo, shape, cfg, dtype)
    side = os.path.join(d, "lcmac.json")
    if os.path.exists(side):
        return side, None
    req = {"algorithm": None if algo == "gemm" else algo, "target": "cuda", "dtype": dtype,
           "shape": list(shape), "config": cfg, "out_dir": d, "name": "lcmac", "jobs": 1}
    p = subprocess.run([sys.executable, "-m", "lcmac.targets.tilelang_worker"],
                       input=json.dumps(req), capture_output=True, text=True, cwd=ROOT)
    lines = [x for x in p.stdout.splitlines() if x.startswith("{")]
    resp = json.loads(lines[-1]) if lines else {"ok": False, "error": p.stderr[-3000:]}
    return (side if resp.get("ok") else None), resp.get("error")


def build_all(only=None):
    """Build every artifact the tests use (also callable outside pytest, to prebuild), or
    the (algo, shape, cfg, dtype) keys in ``only``."""
    todo = ([(a, s, c, "bf16") for a, s, c in CASES + LARGE]
            + [(a, s, DTYPE_CFG[a], d) for a, s, d in DTYPE_CASES]
            + [(a, s, c, d) for a, s, d, c, _ in SCALED_CASES]
            + [(a, s, FP8, d) for a, s, d, _ in FP8_CASES]
            + [(a, s, c, "bf16") for a, s, c0, d in SAME_BITS_CASES for c in (c0, {**c0, **d})]
            + [(a, s, c, d) for a, s, c, d in PREP_CASES])
    key = (lambda t: (t[0], t[1], json.dumps(t[2], sort_keys=True), t[3]))
    todo = list({key(t): t for t in todo}.values())     # one build per directory
    if only is not None:
        want = {key(t) for t in only}
        todo = [t for t in todo if key(t) in want]
    jobs = int(os.environ.get("LCMAC_TEST_JOBS", "16"))
    with ThreadPoolExecutor(max_workers=jobs) as ex:
        res = list(ex.map(lambda t: _build(*t), todo))
    for t, r in zip(todo, res):
        _BUILT[key(t)] = r
    return _BUILT


def _needed(item):
    """The artifacts one collected test uses, for the tests that say so cheaply; None: any."""
    p = item.callspec.params if hasattr(item, "callspec") else {}
    if item.originalname == "test_scaled_operands_error_vs_cublas":
        return [(p["algo"], p["shape"], p["cfg"], p["dtype"])]
    if item.originalname == "test_fp8_operands_error":
        return [(p["algo"], p["shape"], FP8, p["dtype"])]
    if item.originalname == "test_gemm_stage_layouts_give_the_same_bits":
        return [(p["algo"], p["shape"], c, "bf16") for c in (p["cfg"], {**p["cfg"], **p["delta"]})]
    if item.originalname == "test_prepared_b_gives_the_same_bits":
        return [(p["algo"], p["shape"], p["cfg"], p["dtype"])]
    if item.originalname in ("test_bf16_correct", "test_error_is_the_accuracy_models",
                             "test_error_on_given_inputs_is_the_accuracy_models"):
        return [(p["algo"], p["shape"], p["cfg"], "bf16")]
    if item.originalname in ("test_scaled_operands_any_magnitude",
                             "test_scaled_operands_keep_finite_outputs_beside_an_inf"):
        return [(*EDGE_CASE, p["cfg"], p["dtype"])]
    return None


@pytest.fixture(scope="session")
def artifacts(request):
    # build only what the selected tests need (``-k scaled`` should not build them all)
    needs = [_needed(i) for i in request.session.items]
    if any(n is None for n in needs):
        return build_all()
    return build_all([k for n in needs for k in n])


def _loaded(artifacts, algo, shape, cfg, dtype):
    """One case's artifact, loaded through lcmac's CUDA loader (fails with the build error
    when it was not built)."""
    from lcmac.runtime.cuda_loader import load_cuda
    side, err = artifacts[(algo, shape, json.dumps(cfg, sort_keys=True), dtype)]
    assert side, f"build failed: {err}"
    return load_cuda(side)


def _written(f, A, B):
    """f(A, B) into an output poisoned with NaN first; every element must have been written."""
    C = torch.full((A.shape[0], B.shape[1]), float("nan"), device="cuda", dtype=A.dtype)
    f(A, B, out=C)
    torch.cuda.synchronize()
    assert torch.isfinite(C).all(), "some outputs were not written (NaN poison left)"
    return C


def _check(artifacts, algo, shape, cfg, dtype, bound):
    f = _loaded(artifacts, algo, shape, cfg, dtype)
    M, N, K = shape
    tdt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
    errs = []
    for seed in (1, 2):       # fresh inputs each time
        g = torch.Generator(device="cuda").manual_seed(seed * 1000 + M)
        A = torch.randn(M, K, device="cuda", generator=g).to(tdt)
        B = torch.randn(K, N, device="cuda", generator=g).to(tdt)
        C = _written(f, A, B)
        ref = A.double() @ B.double()
        errs.append(float(torch.linalg.norm(C.double() - ref) / torch.linalg.norm(ref)))
    assert max(errs) < bound, (algo, shape, errs)
    return errs


@pytest.mark.parametrize("algo,shape,cfg", CASES,
                         ids=[f"{a}-{'x'.join(map(str, s))}{'-' + str(c) if c else ''}" for a, s, c in CASES])
def test_bf16_correct(artifacts, algo, shape, cfg):
    # bf16 operands: cuBLAS lands near 1.7e-3; one LCMA level about 3x that (Ã, B̃ rounded
    # to bf16), two levels or rank-23+ schemes more
    _check(artifacts, algo, shape, cfg, "bf16", 4e-2)


@pytest.mark.parametrize("algo,shape,cfg", MODEL_CASES,
                         ids=[f"{a}-{'x'.join(map(str, s))}-{c}" for a, s, c in MODEL_CASES])
def test_error_is_the_accuracy_models(artifacts, algo, shape, cfg):
    """The kernel's error ÷ cuBLAS's on the same inputs, against the model's prediction."""
    from lcmac.costmodel.accuracy import cuda_model_args, error_ratio
    f = _loaded(artifacts, algo, shape, cfg, "bf16")
    M, N, K = shape
    ratios = []
    for seed in (5, 6):
        A, B = _inputs(M, N, K, "bf16", seed * 100 + M)
        ref = A.double() @ B.double()
        ratios.append(_rel(_written(f, A, B), ref) / _rel(A @ B, ref))
    md, variant, operands = cuda_model_args("bf16", {**_default_cfg(algo), **cfg})
    want = error_ratio(algo, md, variant=variant, operands=operands, K=K).ratio
    got = sum(ratios) / len(ratios)
    assert abs(want / got - 1) < 0.08, (algo, shape, variant, got, want)


DATA_CASES = [MODEL_CASES[0], MODEL_CASES[3]] + TR_CASES[2:3] + MODEL_CASES[-2:-1]


@pytest.mark.parametrize("algo,shape,cfg", DATA_CASES,
                         ids=[f"{a}-{'x'.join(map(str, s))}-{c}" for a, s, c in DATA_CASES])
def test_error_on_given_inputs_is_the_accuracy_models(artifacts, algo, shape, cfg):
    """Nonnegative inputs (uniform [0, 1)) cancel less than normal ones and give much smaller
    ratios; ``error_ratio(inputs=...)`` predicts them from a thin sample of the operands."""
    from lcmac.costmodel.accuracy import cuda_model_args, error_ratio
    f = _loaded(artifacts, algo, shape, cfg, "bf16")
    M, N, K = shape
    g = torch.Generator(device="cuda").manual_seed(7 * M)
    A = torch.rand(M, K, device="cuda", generator=g).to(torch.bfloat16)
    B = torch.rand(K, N, device="cuda", generator=g).to(torch.bfloat16)
    ref = A.double() @ B.double()
    got = _rel(_written(f, A, B), ref) / _rel(A @ B, ref)
    md, variant, operands = cuda_model_args("bf16", {**_default_cfg(algo), **cfg})
    want = error_ratio(algo, md, variant=variant, operands=operands,
                       inputs=(A.float().cpu(), B.float().cpu())).ratio
    assert abs(want / got - 1) < 0.10, (algo, shape, variant, got, want)


@pytest.mark.parametrize("algo,shape,dtype", DTYPE_CASES)
def test_other_dtypes_correct(artifacts, algo, shape, dtype):
    # fp32: the GEMM stage runs TF32 on the tensor cores (about 3e-4 relative)
    _check(artifacts, algo, shape, DTYPE_CFG[algo], dtype, 2e-2 if dtype == "fp16" else 5e-3)


def test_loader_rejects_bad_arguments(artifacts):
    from lcmac.core.errors import DTypeError, ShapeError, TargetError
    f = _loaded(artifacts, "gemm", (256, 256, 256), {}, "bf16")
    A = torch.randn(256, 256, device="cuda").bfloat16()
    with pytest.raises(ShapeError):
        f(A[:, :128], torch.randn(128, 256, device="cuda").bfloat16())
    with pytest.raises(DTypeError):
        f(A.half(), A.half())
    with pytest.raises(TargetError):
        f(A.cpu(), A.cpu())
    with pytest.raises(ShapeError):
        f(A.t(), A)


# B combined once and reused (CudaMatmul.prepare_b): Algorithm 1, the persistent split-group
# kernel, fp8 operands (B̃ and its block scales), Winograd
@pytest.mark.parametrize("algo,shape,cfg,delta", SAME_BITS_CASES,
                         ids=[f"{a}-{'x'.join(map(str, s))}-{c}-{d}" for a, s, c, d in SAME_BITS_CASES])
def test_gemm_stage_layouts_give_the_same_bits(artifacts, algo, shape, cfg, delta):
    # the same tiles and k order either way, so the same bits; repeated calls catch a
    # pipeline that lets rank 0 overwrite a stage its peer is still reading
    plain = _loaded(artifacts, algo, shape, cfg, "bf16")
    other = _loaded(artifacts, algo, shape, {**cfg, **delta}, "bf16")
    M, N, K = shape
    g = torch.Generator(device="cuda").manual_seed(M + N)
    A = torch.randn(M, K, device="cuda", generator=g).to(torch.bfloat16)
    B = torch.randn(K, N, device="cuda", generator=g).to(torch.bfloat16)
    want = _written(plain, A, B)
    ref = A.double() @ B.double()
    assert float(torch.linalg.norm(want.double() - ref) / torch.linalg.norm(ref)) < 4e-2
    for _ in range(5):
        assert torch.equal(_written(other, A, B), want)


PREP_CASES = [("strassen", (1000, 1064, 1032), {"fused": False}, "bf16"),
              ("strassen", (1000, 1064, 1032), SG, "bf16"),
              ("winograd", (640, 648, 656), {"fused": False}, "bf16"),
              ("strassen", (1000, 1064, 1032), FP8, "bf16"),
              # B's blocks read in place: the prepared buffer holds a copy of B beside B̃
              ("strassen", (2048, 2048, 2048), {"fused": False, **VIEWS}, "bf16")]


@pytest.mark.parametrize("algo,shape,cfg,dtype", PREP_CASES,
                         ids=[f"{a}-{'x'.join(map(str, s))}-{c}" for a, s, c, _ in PREP_CASES])
def test_prepared_b_gives_the_same_bits(artifacts, algo, shape, cfg, dtype):
    f = _loaded(artifacts, algo, shape, cfg, dtype)
    M, N, K = shape
    g = torch.Generator(device="cuda").manual_seed(11)
    B = torch.randn(K, N, device="cuda", generator=g).to(torch.bfloat16)
    Bp = f.prepare_b(B)
    for _ in range(2):                      # one B, several A
        A = torch.randn(M, K, device="cuda", generator=g).to(torch.bfloat16)
        C = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
        f(A, Bp, out=C)
        torch.cuda.synchronize()
        assert torch.equal(C, _written(f, A, B))


def test_prepared_b_errors(artifacts):
    from lcmac.core.errors import ArtifactError, LcmacError, ShapeError
    f = _loaded(artifacts, "strassen", (1000, 1064, 1032), {"fused": False}, "bf16")
    other = _loaded(artifacts, "strassen", (1000, 1064, 1032), SG, "bf16")
    B = torch.randn(1032, 1064, device="cuda").bfloat16()
    with pytest.raises(ShapeError):
        f.prepare_b(B[:1000])
    with pytest.raises(ArtifactError, match="another artifact"):
        f(torch.randn(1000, 1032, device="cuda").bfloat16(), other.prepare_b(B))
    g = _loaded(artifacts, "gemm", (1000, 1064, 1032), {}, "bf16")
    with pytest.raises(LcmacError, match="nothing to prepare"):
        g.prepare_b(B)
    s = _loaded(artifacts, "strassen", (1000, 1064, 1032), F16, "bf16")
    with pytest.raises(LcmacError, match="shared with the A side"):
        s.prepare_b(B)


@pytest.mark.parametrize("algo,shape,cfg", LARGE,
                         ids=[f"{a}-{'x'.join(map(str, s))}" for a, s, c in LARGE])
def test_large_buffers_correct(artifacts, algo, shape, cfg):
    """More than 2³¹ elements in H, B̃ or C: every output written, error within the usual
    LCMA factor of cuBLAS's on the same inputs (reference: their float32 product, errors
    summed in float64 by row chunks: a float64 reference would not fit)."""
    M, N, K = shape
    if torch.cuda.get_device_properties(0).total_memory < 60e9:
        pytest.skip("needs about 40 GB of GPU memory")
    f = _loaded(artifacts, algo, shape, cfg, "bf16")
    assert f.meta["extra"]["int64_index"], f.meta["extra"]
    g = torch.Generator(device="cuda").manual_seed(M + N)
    A = torch.randn(M, K, device="cuda", generator=g).bfloat16()
    B = torch.randn(K, N, device="cuda", generator=g).bfloat16()
    ref = _cublas_highest(A.float(), B.float())

    def rel(C):
        num = den = 0.0
        for r0 in range(0, M, 2048):
            rf = ref[r0:r0 + 2048].double()
            num += float(((C[r0:r0 + 2048].double() - rf) ** 2).sum())
            den += float((rf ** 2).sum())
        return (num / den) ** 0.5

    C = torch.matmul(A, B)
    e_cub = rel(C)
    C.fill_(float("nan"))
    f(A, B, out=C)
    torch.cuda.synchronize()
    assert torch.isfinite(C).all(), "some outputs were not written (NaN poison left)"
    e = rel(C)
    # one Strassen level 3.5x cuBLAS's error with bf16 operands, two levels 7.0x (measured)
    assert e < 8 * e_cub, (algo, shape, e, e_cub)


def test_split_group_deterministic(artifacts):
    """No atomics: the same inputs give the same bits, run after run."""
    f = _loaded(artifacts, "strassen", (6144, 6144, 1024), {**SG, "overlap_epilogue": True}, "bf16")
    g = torch.Generator(device="cuda").manual_seed(7)
    A = torch.randn(6144, 1024, device="cuda", generator=g).bfloat16()
    B = torch.randn(1024, 6144, device="cuda", generator=g).bfloat16()
    outs = [f(A, B).clone() for _ in range(3)]
    torch.cuda.synchronize()
    assert all(torch.equal(outs[0], o) for o in outs[1:])


def test_tma_reduce_deterministic(artifacts):
    """The TMA adds into a C tile come from one CTA, in a fixed order, each bulk group done
    before the next: the same inputs give the same bits, run after run."""
    f = _loaded(artifacts, "strassen", (2048, 1536, 1024), {**TR, "persistent_ctas": 5}, "bf16")
    g = torch.Generator(device="cuda").manual_seed(5)
    A = torch.randn(2048, 1024, device="cuda", generator=g).bfloat16()
    B = torch.randn(1024, 1536, device="cuda", generator=g).bfloat16()
    want = _written(f, A, B)
    for _ in range(5):
        assert torch.equal(_written(f, A, B), want)


def _inputs(M, N, K, dtype, seed, scale_a=1.0, scale_b=1.0):
    tdt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
    g = torch.Generator(device="cuda").manual_seed(seed)
    A = (torch.randn(M, K, device="cuda", generator=g) * scale_a).to(tdt)
    B = (torch.randn(K, N, device="cuda", generator=g) * scale_b).to(tdt)
    return A, B


def _cublas_highest(A, B):
    """cuBLAS in the precision of the operands' dtype (float32: SGEMM, no TF32)."""
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        return A @ B
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32


def _rel(C, ref):
    return float(torch.linalg.norm(C.double() - ref) / torch.linalg.norm(ref))


@pytest.mark.parametrize("algo,shape,dtype,cfg,factor", SCALED_CASES,
                         ids=[f"{a}-{'x'.join(map(str, s))}-{d}-{c['operands']}"
                              for a, s, d, c, _ in SCALED_CASES])
def test_scaled_operands_error_vs_cublas(artifacts, algo, shape, dtype, cfg, factor):
    """Scaled fp16 operands: every output written, error within ``factor`` x cuBLAS's."""
    f = _loaded(artifacts, algo, shape, cfg, dtype)
    M, N, K = shape
    for seed in (3, 4):
        A, B = _inputs(M, N, K, dtype, seed * 100 + M)
        ref = A.double() @ B.double()
        e_cub = _rel(_cublas_highest(A, B), ref)
        e = _rel(_written(f, A, B), ref)
        assert e <= factor * e_cub, (algo, shape, dtype, e, e_cub, e / e_cub)


@pytest.mark.parametrize("dtype,cfg", [("bf16", F16), ("fp32", X2), ("bf16", FP8)],
                         ids=["bf16-fp16", "fp32-fp16x2", "bf16-fp8"])
def test_scaled_operands_any_magnitude(artifacts, dtype, cfg):
    """The power-of-two scales follow the inputs: magnitudes far outside fp16's range (1e±8
    here, and A and B of different sizes) stay finite and accurate, zeros give zeros."""
    f = _loaded(artifacts, *EDGE_CASE, cfg, dtype)
    M, N, K = EDGE_CASE[1]
    A1, B1 = _inputs(M, N, K, dtype, 7)
    e1 = _rel(f(A1, B1), A1.double() @ B1.double())
    for sa, sb in ((1e8, 1e8), (1e-8, 1e-8), (1e8, 1e-12)):
        if dtype == "bf16" or (sa * sb * K < 1e37 and sa * sb > 1e-37):
            A, B = _inputs(M, N, K, dtype, 7, sa, sb)
            ref = A.double() @ B.double()
            C = f(A, B)
            torch.cuda.synchronize()
            assert torch.isfinite(C).all(), (sa, sb)
            assert _rel(C, ref) < 1.5 * e1 + 1e-7, (sa, sb, _rel(C, ref), e1)
    Z = torch.zeros_like(A1)
    assert int(torch.count_nonzero(f(Z, B1))) == 0


def test_auto_builds_a_cuda_artifact_on_demand(tmp_path):
    """lcmac.auto with CUDA tensors and build=True: the chosen lcmac kernel (the vendor GEMM
    left out) is built into the artifact directory at the first call, loaded, and right."""
    import lcmac
    mm = lcmac.auto(tmp_path / "art", build=True, vendor=False, logs=tmp_path / "no-logs")
    A, B = _inputs(1024, 1024, 1024, "bf16", 11)
    C = mm(A, B)
    torch.cuda.synchronize()
    p = mm.plan(1024, 1024, 1024, "bfloat16", target=mm._target_for(True))
    art = mm.artifact(p)
    assert art is not None and art.exists() and p.runs != "vendor", p.why
    ref = A.double() @ B.double()
    assert _rel(C, ref) < 4 * _rel(A @ B, ref)


@pytest.mark.parametrize("dtype,cfg", [("bf16", F16), ("fp32", X2), ("bf16", FP8)],
                         ids=["bf16-fp16", "fp32-fp16x2", "bf16-fp8"])
def test_scaled_operands_keep_finite_outputs_beside_an_inf(artifacts, dtype, cfg):
    """One inf in A: the outputs it cannot reach stay finite and accurate (the amax leaves
    non-finite values out; with the inf in it, the scale flushed every finite operand to
    zero); those it reaches are inf/NaN — for Strassen two rows of C (row i of C11/C12 and
    of C22), where a GEMM would have one."""
    f = _loaded(artifacts, *EDGE_CASE, cfg, dtype)
    M, N, K = EDGE_CASE[1]
    A, B = _inputs(M, N, K, dtype, 9)
    e1 = _rel(f(A, B), A.double() @ B.double())
    A[10, 20] = float("inf")
    ref = A.double() @ B.double()
    C = f(A, B)
    torch.cuda.synchronize()
    fin = torch.isfinite(C)
    assert int((~fin).sum()) <= 2 * N, int((~fin).sum())
    both = fin & torch.isfinite(ref)
    assert int(both.sum()) >= M * N - 2 * N
    d = (C.double() - ref)[both]
    assert float(torch.linalg.norm(d) / torch.linalg.norm(ref[both])) < 1.5 * e1


def _fp8_quantized(X, block):
    """X as E4M3 with a float32 scale per ``block`` (the contract, lcmac.spec.fp8: A per
    1x128, B per 128x128), back in float64: what lcmac's fp8 combines do to a plain GEMM's
    operands."""
    from lcmac.torch.fp8 import dequantize, quantize
    q, s = quantize(X, block)
    return dequantize(q, s, block)


@pytest.mark.parametrize("algo,shape,dtype,factor", FP8_CASES,
                         ids=[f"{a}-{'x'.join(map(str, s))}-{d}" for a, s, d, _ in FP8_CASES])
def test_fp8_operands_error(artifacts, algo, shape, dtype, factor):
    """E4M3 operands, A per 1x128 and B per 128x128: every output written; the error within ``factor`` x the
    error of the same quantization of A and B multiplied exactly (a wrong scale, block or
    layout lands far above: one 128-block off gives O(1) errors)."""
    f = _loaded(artifacts, algo, shape, FP8, dtype)
    assert f.gemm_precision.startswith("fp8 e4m3")
    M, N, K = shape
    for seed in (5, 6):
        A, B = _inputs(M, N, K, dtype, seed * 100 + M)
        ref = A.double() @ B.double()
        e_q = _rel(_fp8_quantized(A, (1, 128)) @ _fp8_quantized(B, (128, 128)), ref)
        e = _rel(_written(f, A, B), ref)
        assert e <= factor * e_q, (algo, shape, dtype, e, e_q, e / e_q)
