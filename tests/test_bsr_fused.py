"""The fused block-sparse product without a GPU: the CSR of the blocks, the "auto" rule, the
tile defaults and their checks, the refusals, the CUDA code the kernel generates for sm_90a
(TileLang, no GPU needed), the prepared A (``prepare_bsr``) on the CPU paths, and the
low-rank product's direct path.  tests/test_bsr_cuda.py runs the kernel."""
import re

import numpy as np
import pytest

import lcmac.api.structured as structured
from lcmac.policy.batched import choose_batched
from lcmac.core.errors import DTypeError, LcmacError, ShapeError, TargetError
from lcmac.spec.cuda.bsr import BSR_BLOCKS, bsr_shape_why, bsr_tile_defaults
from lcmac.spec.cuda.config import CudaConfig
from lcmac.spec.cuda.smem import SMEM_PER_CTA
from lcmac.api.structured import (
    BSR, PreparedBSR, bsr_csr, bsr_matmul, fused_wins, lowrank_matmul, prepare_bsr)
from lcmac.schedules.cuda.entry_point import entry_source
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
    from lcmac.api.structured import _no_grad_why
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


def test_the_kernels_size_limits_say_which_is_broken():
    assert bsr_shape_why(128, 256, 64, 64, "bfloat16") is None
    assert "multiples of 64" in bsr_shape_why(100, 256, 64, 64, "bfloat16")
    assert "K=200" in bsr_shape_why(128, 200, 64, 64, "bfloat16")
    assert "multiple of 8 for bfloat16" in bsr_shape_why(128, 256, 12, 64, "bfloat16")
    assert bsr_shape_why(128, 256, 12, 64, "float32") is None          # 4 floats: 16 bytes
    assert "2^31" in bsr_shape_why(2**16, 64, 2**15, 64, "bfloat16")


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


# ---- a prepared A (prepare_bsr) on the CPU paths ----------------------------------------------
def _operands(sort: bool, seed=3):
    """4x3 blocks of 4 (block row 2 empty), one block named twice, in block-row order or not."""
    rng = np.random.default_rng(seed)
    rows, cols = np.array([3, 0, 1, 0, 3, 1]), np.array([2, 1, 0, 1, 0, 2])   # (0, 1) twice
    if sort:
        rows, cols = rows[np.argsort(rows, kind="stable")], cols[np.argsort(rows, kind="stable")]
    return rng.standard_normal((6, 4, 4)), rows, cols, rng.standard_normal((12, 5)), (16, 12)


def _dense(blocks, rows, cols, shape):
    A = np.zeros(shape)
    for blk, r, c in zip(blocks, rows, cols):
        A[r * 4:(r + 1) * 4, c * 4:(c + 1) * 4] += blk
    return A


@pytest.mark.parametrize("kind", ["numpy", "torch"])
@pytest.mark.parametrize("sort", [True, False])
def test_prepared_equals_the_unprepared_call(kind, sort):
    blocks, rows, cols, B, shape = _operands(sort)
    ref = _dense(blocks, rows, cols, shape) @ B
    if kind == "torch":
        torch = pytest.importorskip("torch")
        blocks, rows, cols, B = (torch.from_numpy(x) for x in (blocks, rows, cols, B))
    a = prepare_bsr(blocks, rows, cols, shape)
    assert isinstance(a, PreparedBSR) and a.shape == shape and a.bs == 4
    assert (a.order is None) == sort and a.blocks is blocks            # a reference, no copy
    assert np.asarray(a.row_ptr).tolist() == [0, 2, 4, 4, 6]           # block row 2 empty
    for algo in ["auto", "vendor", "gemm"] + (["strassen"] if kind == "numpy" else []):
        C = bsr_matmul(a, B, algo=algo)
        assert np.allclose(np.asarray(C), ref, rtol=1e-12, atol=1e-12)
        assert np.array_equal(np.asarray(C), np.asarray(bsr_matmul(blocks, rows, cols, B, shape, algo=algo)))
    # the blocks in block-row order, whichever order they came in
    srt = np.asarray(a.sorted_blocks())
    assert np.array_equal(srt, np.asarray(blocks)[np.argsort(np.asarray(rows), kind="stable")])
    assert np.array_equal(np.asarray(BSR(blocks, rows, cols, shape).prepare().col_idx), np.asarray(a.col_idx))


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_prepared_call_does_no_index_work(kind, monkeypatch):
    blocks, rows, cols, B, shape = _operands(sort=False)
    if kind == "torch":
        torch = pytest.importorskip("torch")
        blocks, rows, cols, B = (torch.from_numpy(x) for x in (blocks, rows, cols, B))
    a = prepare_bsr(blocks, rows, cols, shape)
    want = np.asarray(bsr_matmul(a, B))

    def refuse(*args, **kwargs):
        raise AssertionError("index work in a prepared call")
    monkeypatch.setattr(structured, "_host_indices", refuse)
    monkeypatch.setattr(structured, "bsr_csr", refuse)
    assert np.array_equal(np.asarray(bsr_matmul(a, B)), want)
    with pytest.raises(AssertionError, match="index work"):
        bsr_matmul(blocks, rows, cols, B, shape)                        # the unprepared call does it


@pytest.mark.parametrize("kind", ["numpy", "torch"])
@pytest.mark.parametrize("sort", [True, False])
def test_values_updated_in_place_are_seen(kind, sort):
    blocks, rows, cols, B, shape = _operands(sort)
    if kind == "torch":
        torch = pytest.importorskip("torch")
        blocks, rows, cols, B = (torch.from_numpy(x) for x in (blocks, rows, cols, B))
    a = prepare_bsr(blocks, rows, cols, shape)
    bsr_matmul(a, B)
    blocks[1] *= 3.0                                                    # in place, after preparing
    ref = _dense(np.asarray(blocks), np.asarray(rows), np.asarray(cols), shape) @ np.asarray(B)
    assert np.allclose(np.asarray(bsr_matmul(a, B)), ref, rtol=1e-12, atol=1e-12)


def test_prepared_misuse_is_named():
    torch = pytest.importorskip("torch")
    blocks, rows, cols, B, shape = _operands(sort=True)
    # the operand's checks, once, at prepare time
    with pytest.raises(ShapeError, match="outside"):
        prepare_bsr(blocks, rows + 3, cols, shape)
    with pytest.raises(ShapeError, match="multiple of the block size"):
        prepare_bsr(blocks, rows, cols, (14, 12))
    with pytest.raises(ShapeError, match="one block row and column per block"):
        prepare_bsr(blocks, rows[:-1], cols, shape)
    with pytest.raises(ShapeError, match=r"\[nnzb, bs, bs\]"):
        prepare_bsr(blocks[:, :, :3], rows, cols, shape)
    with pytest.raises(DTypeError, match="integers"):
        prepare_bsr(blocks, rows.astype(float), cols, shape)
    with pytest.raises(DTypeError, match="integers"):
        prepare_bsr(torch.from_numpy(blocks), torch.from_numpy(rows).double(), torch.from_numpy(cols), shape)
    # B at each call, without a copy
    a = prepare_bsr(blocks, rows, cols, shape)
    with pytest.raises(ShapeError, match=r"B must be \[K=12, N\]"):
        bsr_matmul(a, B[:-1])
    with pytest.raises(DTypeError, match="one dtype"):
        bsr_matmul(a, B.astype(np.float32))
    with pytest.raises(DTypeError, match="be both numpy arrays or both torch tensors"):
        bsr_matmul(a, torch.from_numpy(B))
    with pytest.raises(TypeError, match="prepared A and B alone"):
        bsr_matmul(a, B, cols, B, shape)
    with pytest.raises(TypeError, match="prepare_bsr"):
        bsr_matmul(blocks, rows, cols)
    with pytest.raises(TargetError, match="CUDA tensors"):
        bsr_matmul(a, B, algo="fused")
    t = prepare_bsr(*(torch.from_numpy(x) for x in (blocks, rows, cols)), shape)
    with pytest.raises(TargetError, match="the blocks are on cpu, B on meta"):
        bsr_matmul(t, torch.empty(12, 5, dtype=torch.float64, device="meta"))
    assert "PreparedBSR 16x12, 6 blocks of 4x4" in repr(t)


# ---- the low-rank product: one product goes to the vendor's matmul directly ------------------
def test_lowrank_without_a_batch_calls_the_vendor_matmul(monkeypatch):
    rng = np.random.default_rng(8)
    U, V, B = rng.standard_normal((20, 4)), rng.standard_normal((30, 4)), rng.standard_normal((30, 7))
    ref = (U @ V.T) @ B
    via_bmm = lowrank_matmul(U, V, B, algo="gemm")

    def refuse(*args, **kwargs):
        raise AssertionError("lcmac.bmm called")
    monkeypatch.setattr(structured, "bmm", refuse)
    for algo in ("auto", "vendor"):
        assert np.allclose(lowrank_matmul(U, V, B, algo=algo), ref, rtol=1e-12, atol=1e-12)
    assert np.allclose(via_bmm, ref, rtol=1e-12, atol=1e-12)
    with pytest.raises(AssertionError, match="lcmac.bmm"):
        lowrank_matmul(U[None], V[None], B[None])                    # a batch: lcmac.bmm's rule
    # the shortcut stands on "auto"'s rule taking lcmac's kernel only for large batches
    assert structured._AUTO_LEAST_BATCH > 1
    for dt in ("bfloat16", "float16", "float32"):
        for M, N, K in ((8, 8, 8), (16, 16, 256), (32, 32, 512)):
            assert choose_batched("cuda", dt, M, N, K, 1, tf32=True) is None
