"""lcmac.tune.measure.gpu_kernel_times on the GPU: each kernel a call launches, by name, with
its mean time per call."""
import pytest

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_kernel_times_name_each_kernel_of_a_call_with_its_mean():
    from lcmac.tune.measure import gpu_kernel_times
    A = torch.randn(2048, 2048, device="cuda")
    B = torch.randn(2048, 2048, device="cuda")
    C = torch.empty(2048, 2048, device="cuda")

    def two_kernels():
        torch.matmul(A, B, out=C)       # a GEMM kernel
        C.mul_(2.0)                     # and an element-wise one

    one = gpu_kernel_times(two_kernels, calls=4)
    assert len(one) >= 2 and all(us > 0 for us in one.values())
    assert any("elementwise" in k.lower() or "mul" in k.lower() for k in one)
    # a mean per call: twice the calls, about the same figures (the GEMM dominates)
    gemm_us = max(one.values())
    again = gpu_kernel_times(two_kernels, calls=8)
    assert 0.5 < max(again.values()) / gemm_us < 2.0
    # sorted, the longest first
    assert list(one.values()) == sorted(one.values(), reverse=True)
