"""An LCMA as torch operations (lcmac.torch.graph_stages): exact in float64 eagerly and under
torch.compile(fullgraph=True), for 2×2, 3×3 and composed grids."""
import pytest

torch = pytest.importorskip("torch")

from lcmac.torch import graph_stages as gs  # noqa: E402
from lcmac.artifact.build import resolve_algorithm  # noqa: E402


@pytest.mark.parametrize("name", ["strassen", "winograd", "strassen^2", "laderman"])
def test_graph_stages_compute_the_product(name):
    alg = resolve_algorithm(name)[0]
    c = gs.coefficients(alg)
    m, k, n = alg.grid
    A = torch.randn(m * 6, k * 5, dtype=torch.float64)
    B = torch.randn(k * 5, n * 7, dtype=torch.float64)
    Bt = gs.combine_b(B, c)
    assert Bt.shape == (alg.R, 5, 7)
    ref = A @ B
    assert torch.allclose(gs.lcma_matmul(A, Bt, c), ref, atol=1e-12, rtol=0)
    torch._dynamo.reset()
    f = torch.compile(lambda a, bt: gs.lcma_matmul(a, bt, c), fullgraph=True, backend="aot_eager")
    assert torch.allclose(f(A, Bt), ref, atol=1e-12, rtol=0)
    assert gs.fits(alg, m * 6, n * 7, k * 5) and not gs.fits(alg, m * 6 + 1, n * 7, k * 5)
