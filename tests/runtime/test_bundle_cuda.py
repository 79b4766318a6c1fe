"""Bundles and the JIT row ladder on CUDA tensors (needs a GPU, TileLang and nvcc; skipped
elsewhere): bf16 Strassen, errors judged against float64 as a multiple of torch.matmul's."""
import pytest

torch = pytest.importorskip("torch")

import lcmac  # noqa: E402
from lcmac.api import matmul as ops  # noqa: E402
from lcmac.artifact.bundle import build_bundle  # noqa: E402

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

BF16 = torch.bfloat16
STRASSEN_BOUND = 6.0          # Strassen's bf16 error is ~3.5x the plain GEMM's (docs/accuracy.md)


def _randn(*shape, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(*shape, device="cuda", dtype=BF16, generator=g)


def _check(C, A, B):
    ref = A.double() @ B.double()
    err = ((C.double() - ref).norm() / ref.norm()).item()
    base = (((A @ B).double() - ref).norm() / ref.norm()).item()
    assert C.shape == ref.shape and err < STRASSEN_BOUND * base, (err, base)


def test_rows_bundle_on_cuda_any_m_and_prepared_b(tmp_path):
    path = build_bundle("strassen", "cuda", "bfloat16", ["?x2048x2048"], out_dir=tmp_path,
                        rows=(2048, 1024))
    f = lcmac.load(path)
    B = _randn(2048, 2048, seed=1)
    Bp = f.prepare_b(B)
    for M in (2048, 3000, 100):
        A = _randn(M, 2048, seed=M)
        C = f(A, B)
        _check(C, A, B)
        assert torch.equal(f(A, Bp), C)          # B combined once per bucket kernel: same result


def test_any_bundle_on_cuda(tmp_path):
    path = build_bundle("strassen", "cuda", "bfloat16", [None], out_dir=tmp_path, rows=(1024,),
                        tile=(2048, 2048))
    A, B = _randn(1500, 2500, seed=2), _randn(2500, 3000, seed=3)
    _check(lcmac.load(path)(A, B), A, B)


def test_jit_ladder_on_cuda_pads_a_forced_algorithm():
    A, B = _randn(3000, 2048, seed=4), _randn(2048, 2048, seed=5)
    _check(lcmac.matmul(A, B, algo="strassen"), A, B)        # 2048 rows + 952 padded into 1024
    shapes = {k[3] for k in ops._kernels if k[:3] == ("strassen", "cuda-sm90a", "bfloat16")}
    assert {(2048, 2048, 2048), (1024, 2048, 2048)} <= shapes
