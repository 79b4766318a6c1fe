"""``torch.library.opcheck`` on ``lcmac::matmul`` and ``lcmac::linear`` (registered in
lcmac/api/matmul.py): schema (no input mutated, no output aliasing an input), autograd
registration, the fake implementation against the real one, and AOT dispatch with static
and dynamic shapes.  Forced Strassen runs on tests/test_nn.py's stand-in kernel (which
prepares B); the vendor GEMM where "auto" gives it the shape; the real strassen float32
kernel tests/test_nn.py compiles in the slow test."""
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from lcmac.api import matmul as ops  # noqa: E402
from tests.test_nn import _PreparingKernel  # noqa: E402

ops.register()

M, N, K = 66, 45, 53
TESTS = ("test_schema", "test_autograd_registration", "test_faketensor",
         "test_aot_dispatch_static", "test_aot_dispatch_dynamic")


def _r(*shape, dtype=torch.float32, grad=False):
    return torch.randn(*shape, dtype=dtype, requires_grad=grad)


MATMUL_CASES = {
    "strassen": lambda: (_r(M, K, grad=True), _r(K, N, grad=True), "strassen", None),
    "batched A, B a transposed view": lambda: (_r(2, M // 2, K, grad=True),
                                               _r(N, K).t().requires_grad_(), "strassen", 8.0),
    "float64, auto": lambda: (_r(6, 5, dtype=torch.float64, grad=True),
                              _r(5, 4, dtype=torch.float64, grad=True), "auto", None),
    "no rows": lambda: (_r(0, K), _r(K, N), "auto", None),
}
LINEAR_CASES = {
    "strassen, a parameter": lambda: (_r(2, M // 2, K, grad=True), nn.Parameter(_r(N, K)),
                                      "strassen", None),
    "non-contiguous x and weight": lambda: (_r(M // 2, 2, K).transpose(0, 1), _r(K, N).t(),
                                            "strassen", None),
    "frozen weight": lambda: (_r(M, K, grad=True), _r(N, K), "strassen", None),
    "bfloat16, auto": lambda: (_r(7, K, dtype=torch.bfloat16), _r(N, K, dtype=torch.bfloat16),
                               "auto", None),
    "float64, vendor": lambda: (_r(7, K, dtype=torch.float64, grad=True),
                                _r(N, K, dtype=torch.float64, grad=True), "vendor", None),
}


@pytest.fixture
def stand_in(monkeypatch):
    monkeypatch.setattr(ops, "kernel", lambda *key: _PreparingKernel())


@pytest.mark.parametrize("case", list(MATMUL_CASES), ids=list(MATMUL_CASES))
def test_opcheck_matmul(stand_in, case):
    torch.manual_seed(0)
    torch.library.opcheck(torch.ops.lcmac.matmul.default, MATMUL_CASES[case](), test_utils=TESTS)


@pytest.mark.parametrize("case", list(LINEAR_CASES), ids=list(LINEAR_CASES))
def test_opcheck_linear(stand_in, case):
    torch.manual_seed(1)
    torch.library.opcheck(torch.ops.lcmac.linear.default, LINEAR_CASES[case](), test_utils=TESTS)


def test_opcheck_with_the_real_kernel():
    """The forward kernel only (no operand requires grad: the backward's shapes would compile
    kernels of their own)."""
    torch.manual_seed(2)
    torch.library.opcheck(torch.ops.lcmac.matmul.default, (_r(M, K), _r(K, N), "strassen", None),
                          test_utils=TESTS)
    torch.library.opcheck(torch.ops.lcmac.linear.default, (_r(M, K), _r(N, K), "strassen", None),
                          test_utils=TESTS)
