"""Alternative-basis pairs on real-valued kernels: the cost model's pricing (basis changes
once per product, none for a static B's ψ or a chained product's φ and υ⁻¹) and
lcmac.api.alternative.ab_matmul, the pair's core compiled as an lcmac kernel, against float64."""
import numpy as np
import pytest

from lcmac.costmodel.alternative_basis import compare, core_algorithm, pair_estimate
from lcmac.core.errors import AlgorithmError, DTypeError, ShapeError
from lcmac.ir.catalogue import get
from lcmac.ir.verify import brent_failures


@pytest.fixture(scope="module")
def pair():
    from lcmac.api.alternative import pair_for
    return pair_for("winograd-ab")


def test_basis_changes_are_priced_once_per_product(pair):
    single = pair_estimate(pair, 32768, 32768, 32768, "bfloat16", "h100")
    assert all(single.stages[s].time_s > 0 for s in ("basis_a", "basis_b", "basis_c"))
    # a pass over a 32768² bf16 operand: read and write 2 GiB each
    assert single.stages["basis_a"].bytes == 2 * 32768 ** 2 * 2
    static = pair_estimate(pair, 32768, 32768, 32768, "bfloat16", "h100", static_b=True)
    assert static.stages["basis_b"].time_s == 0 and static.stages["basis_a"].time_s > 0
    chained = pair_estimate(pair, 32768, 32768, 32768, "bfloat16", "h100", static_b=True, chained=True)
    assert all(chained.stages[s].time_s == 0 for s in ("basis_a", "basis_b", "basis_c"))
    assert chained.time_s < static.time_s < single.time_s


def test_model_verdict_on_the_h100(pair):
    w = get("winograd")
    assert not compare(w, pair, 32768, 32768, 32768, "bfloat16", "h100").pays
    chained = compare(w, pair, 32768, 32768, 32768, "bfloat16", "h100", static_b=True, chained=True)
    assert chained.pays and chained.speedup < 1.02       # fewer materialised operands only
    assert core_algorithm(pair).nnz()["U"] < w.nnz()["U"]


def test_the_core_alone_is_not_a_product(pair):
    assert brent_failures(core_algorithm(pair), limit=1)


def test_ab_matmul_matches_float64_and_round_trips(pair):
    from lcmac.api.alternative import ab_matmul, from_basis, to_basis
    rng = np.random.default_rng(0)
    A, B = rng.standard_normal((64, 96)), rng.standard_normal((96, 80))
    np.testing.assert_allclose(ab_matmul(A, B, pair), A @ B, rtol=0, atol=1e-11)
    A1, B1 = to_basis(A, pair, "A"), to_basis(B, pair, "B")
    C1 = ab_matmul(A1, B1, pair, inputs_in_basis=True, output_in_basis=True)
    assert np.abs(C1 - A @ B).max() > 1                  # C in the basis is not C
    np.testing.assert_allclose(from_basis(C1, pair), A @ B, rtol=0, atol=1e-11)


def test_bad_input_is_named():
    from lcmac.api.alternative import ab_matmul
    A = np.zeros((63, 64))
    with pytest.raises(ShapeError, match="grid"):
        ab_matmul(A, np.zeros((64, 64)))
    with pytest.raises(AlgorithmError, match="-ab"):
        ab_matmul(np.zeros((64, 64)), np.zeros((64, 64)), "winograd")
    with pytest.raises(DTypeError, match="differ"):
        ab_matmul(np.zeros((64, 64)), np.zeros((64, 64), np.float32))
    torch = pytest.importorskip("torch")
    with pytest.raises(DTypeError, match="CUDA"):
        ab_matmul(torch.zeros(64, 64), torch.zeros(64, 64))
