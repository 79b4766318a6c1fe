"""On a CUDA GPU (skipped elsewhere): float32 follows torch's matmul precision, and a weight
written behind lcmac's back is never served stale.

- "highest" (torch's default): ``lcmac.matmul`` on float32 CUDA tensors, auto and with lcmac's
  own GEMM and Strassen forced, is within SGEMM's error class (≤ 2× cuBLAS SGEMM's error
  against float64), and lcmac leaves torch's TF32 switches as it found them.
- "high": TF32 products are allowed; the error is within the TF32 class (≤ 4× cuBLAS TF32's).
- ``lcmac.nn.Linear`` with Strassen forced on bf16 CUDA weights: after ``.data.mul_``,
  ``.data.copy_``, ``load_state_dict`` and an optimizer step the output is ``F.linear``'s.

Shapes are 2048³ (one kernel per mode and algorithm; bf16 Strassen at 2048 is the kernel
tests/test_torch_cuda.py builds)."""
import pytest

torch = pytest.importorskip("torch")
from torch.nn import functional as F  # noqa: E402

import lcmac  # noqa: E402
from lcmac.torch.nn import Linear  # noqa: E402

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

S = 2048
#: Strassen's bf16 error is ~3.5x the plain GEMM's on normal inputs (docs/accuracy.md)
STRASSEN_BOUND = 6.0


def _randn(*shape, seed, dtype=torch.float32):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(*shape, device="cuda", dtype=dtype, generator=g)


def _rel(C, ref) -> float:
    return ((C.double() - ref).norm() / ref.norm()).item()


@pytest.fixture
def precision():
    """Sets torch's float32 matmul precision for one test and restores it after."""
    before = torch.get_float32_matmul_precision()
    yield torch.set_float32_matmul_precision
    torch.set_float32_matmul_precision(before)


def _tf32_switches():
    return (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
            torch.get_float32_matmul_precision())


@pytest.mark.parametrize("algo", ["auto", "gemm", "strassen"])
def test_highest_is_within_sgemm_error(precision, algo):
    precision("highest")
    A, B = _randn(S, S, seed=0), _randn(S, S, seed=1)
    ref = A.double() @ B.double()
    sgemm = _rel(A @ B, ref)
    before = _tf32_switches()
    C = lcmac.matmul(A, B, algo=algo)
    assert _tf32_switches() == before                 # lcmac changed none of torch's switches
    assert C.dtype == torch.float32 and _rel(C, ref) <= 2.0 * sgemm, (algo, _rel(C, ref), sgemm)


def test_high_may_use_tf32_and_stays_in_its_class(precision):
    precision("high")
    A, B = _randn(S, S, seed=2), _randn(S, S, seed=3)
    ref = A.double() @ B.double()
    tf32 = _rel(A @ B, ref)                           # cuBLAS under "high": TF32
    C = lcmac.matmul(A, B, algo="gemm")
    assert _rel(C, ref) <= 4.0 * tf32, (_rel(C, ref), tf32)
    assert torch.get_float32_matmul_precision() == "high"


def _check(layer, ref_layer, x):
    with torch.no_grad():
        want = F.linear(x, ref_layer.weight, ref_layer.bias)
        got = layer(x)
    ref = F.linear(x.double(), ref_layer.weight.double(), ref_layer.bias.double())
    assert _rel(got, ref) < STRASSEN_BOUND * _rel(want, ref) + 1e-3


def test_linear_sees_every_write_to_its_weight():
    torch.manual_seed(0)
    base = torch.nn.Linear(S, S, device="cuda", dtype=torch.bfloat16)
    layer = Linear.from_linear(base, algo="strassen")
    x = _randn(S, S, seed=4, dtype=torch.bfloat16)
    _check(layer, layer, x)                                    # the kept weight is prepared
    layer.weight.data.mul_(-0.5)                              # no version bump
    _check(layer, layer, x)
    layer.weight.data.copy_(_randn(S, S, seed=5, dtype=torch.bfloat16) * 0.02)
    _check(layer, layer, x)
    other = torch.nn.Linear(S, S, device="cuda", dtype=torch.bfloat16)
    layer.load_state_dict(other.state_dict())
    _check(layer, other, x)
    opt = torch.optim.SGD(layer.parameters(), lr=0.1)
    layer(x).float().square().mean().backward()
    opt.step()
    _check(layer, layer, x)
