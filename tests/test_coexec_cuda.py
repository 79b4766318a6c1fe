"""CPU+GPU co-execution on a GPU (skipped elsewhere): lcmac.matmul(devices=("cuda", "cpu"))
with inputs on the host and on the GPU, a forced split and the automatic one, against a
float64 product."""
import pytest

torch = pytest.importorskip("torch")

import lcmac  # noqa: E402

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _rel(C, A, B):
    ref = A.double().cpu() @ B.double().cpu()
    return ((C.double().cpu() - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize("where", ["host", "device"])
@pytest.mark.parametrize("dtype,bound", [(torch.float64, 1e-12), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("split", [0.25, "auto"])
def test_split_product_matches_float64(where, dtype, bound, split):
    g = torch.Generator().manual_seed(0)
    A = torch.randn(2000, 1536, generator=g).to(dtype)
    B = torch.randn(1536, 1024, generator=g).to(dtype)
    if where == "host":
        A, B = A.pin_memory(), B.pin_memory()
    else:
        A, B = A.cuda(), B.cuda()
    C = lcmac.matmul(A, B, devices=("cuda", "cpu"), split=split)
    assert C.device == A.device and C.shape == (2000, 1024) and C.dtype == dtype
    assert _rel(C, A, B) < bound


def test_pageable_host_inputs_and_out():
    A = torch.randn(1024, 512, dtype=torch.float64)
    B = torch.randn(512, 256, dtype=torch.float64)
    out = torch.empty(1024, 256, dtype=torch.float64)
    assert lcmac.matmul(A, B, devices=("cuda", "cpu"), split=0.5, out=out) is out
    assert _rel(out, A, B) < 1e-12


@pytest.mark.parametrize("dtype,bound", [(torch.float64, 1e-12), (torch.bfloat16, 2e-2)])
def test_pageable_inputs_in_several_pieces(dtype, bound):
    """Large enough for several pieces (PIECE_BYTES of A each): pageable A and C copied piece
    by piece; GPU only and a split."""
    from lcmac.api.coexec import PIECE_BYTES
    K = 2048
    M = 5 * PIECE_BYTES // (K * torch.empty((), dtype=dtype).element_size()) + 100
    A = torch.randn(M, K).to(dtype)
    B = torch.randn(K, 512).to(dtype)
    for split in (0.0, 0.1):
        C = lcmac.matmul(A, B, devices=("cuda", "cpu"), split=split)
        assert not A.is_pinned() and C.device.type == "cpu"
        assert _rel(C, A, B) < bound
