"""The GPU bit kernels (lcmac.bits.cuda) against numpy's exact products: GF(2) and Boolean,
both kernels, odd shapes, LCMA levels over GF(2) (standard and alternative basis), packed
operands, and the errors.  Needs a CUDA GPU of compute capability 8.0 or newer and nvcc."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

from lcmac.bits import boolean_matmul, gf2_matmul  # noqa: E402
from lcmac.bits import cuda as bits_cuda  # noqa: E402
from lcmac.core.errors import DTypeError, ShapeError  # noqa: E402

SHAPES = [(3, 5, 7), (63, 65, 127), (1000, 777, 1234), (129, 1, 64), (1, 4096, 1)]


def _operands(M, K, N, seed=0):
    rng = np.random.default_rng(seed)
    A = rng.integers(0, 2, (M, K), dtype=np.uint8)
    B = rng.integers(0, 2, (K, N), dtype=np.uint8)
    return A, B


def _gpu(x):
    return torch.from_numpy(x).cuda()


@pytest.mark.parametrize("kernel", ["mma", "bitwise"])
@pytest.mark.parametrize("shape", SHAPES)
def test_kernel_alone_is_exact(kernel, shape):
    A, B = _operands(*shape)
    C = gf2_matmul(_gpu(A), _gpu(B), algo="m4r", kernel=kernel)
    assert C.is_cuda and C.dtype == torch.uint8
    np.testing.assert_array_equal(C.cpu().numpy(), (A.astype(np.int64) @ B) % 2)
    D = boolean_matmul(_gpu(A).bool(), _gpu(B).bool(), kernel=kernel)
    np.testing.assert_array_equal(D.cpu().numpy(), ((A.astype(np.int64) @ B) > 0).astype(np.uint8))


@pytest.mark.parametrize("algo,levels", [("winograd", 1), ("strassen", 2), ("winograd-ab", 2),
                                         ("laderman", 1)])
def test_lcma_levels_are_exact(algo, levels):
    A, B = _operands(1000, 777, 1234, seed=levels)
    C, report = gf2_matmul(_gpu(A), _gpu(B), algo=algo, levels=levels, return_report=True)
    np.testing.assert_array_equal(C.cpu().numpy(), (A.astype(np.int64) @ B) % 2)
    assert report.levels == levels and report.kernel.kernel == f"cuda-{bits_cuda.AUTO_KERNEL}"


def test_packed_in_packed_out_and_large_k():
    A, B = _operands(300, 20000, 200, seed=3)         # K past one slab and odd word counts
    P, Q = bits_cuda.pack(_gpu(A)), bits_cuda.pack(_gpu(B))
    R = gf2_matmul(P, Q, algo="m4r")
    assert isinstance(R, bits_cuda.CudaBits) and R.shape == (300, 200)
    np.testing.assert_array_equal(R.to_tensor().cpu().numpy(), (A.astype(np.int64) @ B) % 2)
    np.testing.assert_array_equal(bits_cuda.unpack(P).cpu().numpy(), A)


def test_batched_base_product_matches_each_product():
    rng = np.random.default_rng(5)
    A = rng.integers(0, 2, (3, 70, 130), dtype=np.uint8)
    B = rng.integers(0, 2, (3, 130, 90), dtype=np.uint8)
    a = torch.stack([bits_cuda.pack(_gpu(x)).words for x in A])
    b = torch.stack([bits_cuda.pack(_gpu(x)).words for x in B])
    for kernel in ("mma", "bitwise"):
        c = bits_cuda.base_product(a, b, kernel=kernel, K=130)
        for p in range(3):
            got = bits_cuda.unpack(bits_cuda.CudaBits(c[p].contiguous(), 70, 90)).cpu().numpy()
            np.testing.assert_array_equal(got, (A[p].astype(np.int64) @ B[p]) % 2)


def test_bad_input_is_named():
    A, B = _operands(8, 9, 10)
    with pytest.raises(ShapeError, match="inner dimensions"):
        gf2_matmul(_gpu(A), _gpu(B[:8]))
    with pytest.raises(DTypeError, match="float"):
        gf2_matmul(_gpu(A).float(), _gpu(B))
    with pytest.raises(ValueError, match="not 0 or 1"):
        gf2_matmul(_gpu(A) * 2, _gpu(B))
    with pytest.raises(DTypeError, match="both"):
        gf2_matmul(bits_cuda.pack(_gpu(A)), _gpu(B))
    with pytest.raises(ValueError, match="GPU bit kernel"):
        gf2_matmul(_gpu(A), _gpu(B), kernel="native")
    with pytest.raises(DTypeError, match="torch tensor on cpu"):
        gf2_matmul(torch.from_numpy(A), _gpu(B).cpu())


def test_cuda_artifact_serves_shapes(tmp_path):
    from lcmac import load
    from lcmac.bits.artifact import build_bits
    from lcmac.spec.targets import get_target
    f = load(build_bits("winograd", get_target("cuda"), "gf2", levels=1, out_dir=tmp_path))
    for shape in [(1000, 777, 1234), (63, 65, 127), (3, 5, 7)]:
        A, B = _operands(*shape)
        np.testing.assert_array_equal(f(_gpu(A), _gpu(B)).cpu().numpy(), (A.astype(np.int64) @ B) % 2)
    g = load(build_bits("m4r", get_target("cuda"), "bool", out_dir=tmp_path))
    A, B = _operands(63, 65, 127)
    np.testing.assert_array_equal(g(_gpu(A), _gpu(B)).cpu().numpy(),
                                  ((A.astype(np.int64) @ B) > 0).astype(np.uint8))


def test_default_call_decides_levels_on_the_gpu():
    A, B = _operands(1000, 777, 1234, seed=9)
    C, report = gf2_matmul(_gpu(A), _gpu(B), return_report=True)     # algo="auto", levels=None
    np.testing.assert_array_equal(C.cpu().numpy(), (A.astype(np.int64) @ B) % 2)
    assert report.levels == 0                                        # below MIN_BITS


def test_padding_bits_of_operands_are_ignored_and_results_zero_padded():
    A, B = _operands(70, 100, 90, seed=4)
    P, Q = bits_cuda.pack(_gpu(A)), bits_cuda.pack(_gpu(B))
    P.words[:, -1] |= -(1 << 40)          # bits past column 100 (K) and 90 (N) set
    Q.words[:, -1] |= -(1 << 30)
    for algo in ("m4r", "winograd"):
        R = gf2_matmul(P, Q, algo=algo, levels=None if algo == "m4r" else 1)
        np.testing.assert_array_equal(R.to_tensor().cpu().numpy(), (A.astype(np.int64) @ B) % 2)
        assert int((R.words[:, -1] >> 26).abs().sum()) == 0          # bits 90..127 of the row
