"""The fused block-sparse product without a GPU: the CSR of the blocks, the "auto" rule, the
tile defaults and their checks, the refusals, and the CUDA code the kernel generates for
sm_90a (TileLang, no GPU needed).  tests/test_bsr_cuda.py runs it."""
import re

import numpy as np
import pytest

from lcmac.errors import LcmacError, ShapeError, TargetError
from lcmac.schedules.cuda.config import BSR_BLOCKS, SMEM_PER_CTA, CudaConfig, bsr_tile_defaults
from lcmac.structured import bsr_csr, bsr_matmul, fused_wins
from lcmac.targets.cuda import entry_source
from tests.schedules.cuda.test_cuda_codegen import kernel_body, needs_tilelang, worker

#: the kernel's arguments (schedules.cuda.bsr.BSR_ARGS, which imports TileLang)
ARGS = ["A", "B", "C", "row_ptr", "col_idx", "nnzb", "K", "N", "M"]


def test_csr_of_sorted_blocks_keeps_their_order():
    order, row_ptr, col_idx = bsr_csr([0, 0, 2, 2, 2], [3, 1, 0, 0, 4], 4)
    assert order is None
    assert row_ptr.tolist() == [0, 2, 2, 5, 5]               # rows 1 and 3 empty
    assert col_idx.tolist() == [3, 1, 0, 0, 4] and col_idx.dtype == np.int32 == row_ptr.dtype


def test_csr_of_unsorted_blocks_sorts_them_stably():
    rows, cols = np.array([2, 0, 1, 0, 2]), np.array([5, 6, 7, 8, 9])
    order, row_ptr, col_idx = bsr_csr(rows, cols, 3)
    assert order.tolist() == [1, 3, 2, 0, 4]                 # ties keep their order
    assert row_ptr.tolist() == [0, 2, 3, 5] and col_idx.tolist() == [6, 8, 7, 5, 9]
    # every block lands in its row's range
    for i in range(3):
        assert set(rows[order][row_ptr[i]:row_ptr[i + 1]]) <= {i}
    order, row_ptr, col_idx = bsr_csr([], [], 2)
    assert order is None and row_ptr.tolist() == [0, 0, 0] and len(col_idx) == 0


def test_auto_rule():
    assert fused_wins("bfloat16") and fused_wins("float16")
    assert fused_wins("float32", tf32=True) and not fused_wins("float32", tf32=False)
    assert not fused_wins("float64", tf32=True)


def test_a_gradient_keeps_the_batched_path():
    torch = pytest.importorskip("torch")
    from lcmac.structured import _no_grad_why
    blocks, B = torch.zeros(2, 4, 4, requires_grad=True), torch.zeros(8, 3)
    assert "no gradient" in _no_grad_why(blocks, B)
    assert _no_grad_why(blocks.detach(), B) is None
    with torch.no_grad():
        assert _no_grad_why(blocks, B) is None


def test_tile_defaults_fit_and_bad_blocks_are_refused():
    for bs in BSR_BLOCKS:
        for dtype, item in (("bfloat16", 2), ("float16", 2), ("float32", 4)):
            t = bsr_tile_defaults(bs, dtype)
            assert t["block_m"] == bs and bs % t["block_k"] == 0
            stage = (bs * t["block_k"] + t["block_k"] * t["block_n"]) * item
            assert 2 <= t["stages"] and t["stages"] * stage <= SMEM_PER_CTA["sm_90a"]
            CudaConfig(bsr=bs, **t).check()
    with pytest.raises(ShapeError, match="blocks of"):
        bsr_tile_defaults(48, "bfloat16")
    with pytest.raises(LcmacError, match="bsr must be"):
        CudaConfig(bsr=48).check()
    with pytest.raises(LcmacError, match="apart from batched"):
        CudaConfig(bsr=64, batched=True).check()


def test_fused_is_refused_off_cuda_with_the_reason():
    rng = np.random.default_rng(0)
    blocks, B = rng.standard_normal((2, 4, 4)), rng.standard_normal((8, 3))
    with pytest.raises(TargetError, match="CUDA tensors"):
        bsr_matmul(blocks, [0, 1], [1, 0], B, (8, 8), algo="fused")
    torch = pytest.importorskip("torch")
    with pytest.raises(TargetError, match="CUDA tensors"):
        bsr_matmul(torch.from_numpy(blocks), [0, 1], [1, 0], torch.from_numpy(B), (8, 8), algo="fused")
    # the shared checks come first, whatever the algo
    with pytest.raises(ShapeError, match="outside"):
        bsr_matmul(blocks, [0, 2], [1, 0], B, (8, 8), algo="fused")
    # "auto" on the CPU: the reference path, as before
    A = np.zeros((8, 8))
    A[0:4, 4:8], A[4:8, 0:4] = blocks[0], blocks[1]
    assert np.allclose(bsr_matmul(blocks, [0, 1], [1, 0], B, (8, 8)), A @ B, rtol=1e-12, atol=1e-12)


def test_entry_point_passes_the_sizes_as_ints_and_refuses_the_dense_call():
    src = entry_source([{"name": "lcmac_bsr", "args": ARGS}], [("__end__", 0)])
    assert "int lcmac_bsr_call(void*, void*, void*, void*, void*, int, int, int, int, cudaStream_t)" in src
    assert "lcmac_run_bsr(const void* A, const void* B, void* C, const void* row_ptr" in src
    assert "M * N > 2147483647LL" in src                        # the kernel's C index is 32-bit
    run = src[src.index('extern "C" int lcmac_run('):]
    assert "call lcmac_run_bsr" in run.split("}")[0]


def _generate(dtype: str, bs: int, out_dir) -> dict:
    r = worker({"algorithm": None, "target": "cuda-sm90a", "dtype": dtype, "shape": [bs, bs, bs],
                "config": {"bsr": bs}, "out_dir": f"{out_dir}/{dtype}-{bs}",
                "name": "lcmac", "compile": False})
    assert r["ok"], r.get("error")
    kernel, entry = (open(p).read() for p in r["sources"])
    return {"kernel": kernel, "entry": entry, "config": r["config"]}


@needs_tilelang
@pytest.mark.parametrize("dtype, bs", [("bfloat16", 64), ("bfloat16", 128), ("float16", 16),
                                       ("float32", 64)])
def test_kernel_generates_for_sm90a(dtype, bs, tmp_path):
    out = _generate(dtype, bs, tmp_path)
    src, cfg = out["kernel"], out["config"]
    assert cfg["bsr"] == bs and cfg["block_m"] == bs
    # the launcher takes the buffers, then the dynamic sizes, in the order the entry passes them
    call = re.search(r"int lcmac_bsr_call\(([^)]*)\)", src).group(1)
    names = [p.split()[-1].split("=")[0] for p in call.split(",")][:-1]
    assert names == ARGS
    body = kernel_body(src)
    # a TMA producer pipelined over the row's blocks: its trip count read from row_ptr
    assert "tma_load(A_desc" in body and "tma_load(B_desc" in body and "col_idx[" in body
    assert re.search(r"for \(int \w+ = 0; \w+ < \w+; \+\+\w+\)", body)
    assert body.count("row_ptr[") >= 2 and "mbarrier" in body
    if dtype == "float32":
        assert "kTensorFloat32" in body                        # TF32 on the tensor cores
    elif bs >= 64:
        assert "wgmma" in body
    else:
        assert "mma_sync" in body
    assert "lcmac_run_bsr" in out["entry"]


@needs_tilelang
def test_kernel_refuses_an_algorithm(tmp_path):
    r = worker({"algorithm": "strassen", "target": "cuda-sm90a", "dtype": "bfloat16", "shape": [64, 64, 64],
                "config": {"bsr": 64}, "out_dir": str(tmp_path), "name": "lcmac", "compile": False})
    assert not r["ok"] and "plain GEMM with native operands" in r["error"]
