"""The fused block-sparse kernel (``bsr_matmul(..., algo="fused")``, schedules.cuda.bsr; needs a
Hopper GPU, TileLang and nvcc; skipped elsewhere): every block size in bf16, fp16 and float32
against float64, with an empty block row, a single block, no block, a non-square A, unsorted
and repeated blocks and N that the column tile does not divide; "auto"'s pick; misuse; a
prepared A (``prepare_bsr``): no host synchronisation, captured in a CUDA graph."""
from concurrent.futures import ThreadPoolExecutor

import pytest

torch = pytest.importorskip("torch")

from lcmac.api.call_args import target_for  # noqa: E402
from lcmac.core.errors import ShapeError, TargetError  # noqa: E402
from lcmac.api.structured import bsr_kernel, bsr_matmul, prepare_bsr  # noqa: E402

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
              pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_capability() != (9, 0),
                                 reason="the fused kernel is built for Hopper (sm_90a)")]

CASES = [(torch.bfloat16, bs) for bs in (16, 32, 64, 128)] + [(torch.float16, 32), (torch.float16, 64)] \
    + [(torch.float32, bs) for bs in (16, 64, 128)]


def _name(dtype) -> str:
    return str(dtype).replace("torch.", "")


@pytest.fixture(scope="module")
def kernels():
    """Every kernel of the file compiled at once (each in its own worker process)."""
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda c: bsr_kernel(target_for("cuda"), _name(c[0]), c[1]), CASES))


def _problem(bs, Mb, Kb, N, dtype, seed=0, empty_row=None):
    """Random blocks at unsorted positions, one position twice, block row ``empty_row``
    without blocks; the float64 dense A."""
    g = torch.Generator().manual_seed(seed)
    nnzb = max(1, (Mb * Kb) // 3)
    rows = torch.randint(0, Mb, (nnzb,), generator=g)
    cols = torch.randint(0, Kb, (nnzb,), generator=g)
    if empty_row is not None:
        rows[rows == empty_row] = (empty_row + 1) % Mb
    rows, cols = torch.cat([rows, rows[:1]]), torch.cat([cols, cols[:1]])      # a repeated block
    blocks = torch.randn(len(rows), bs, bs, generator=g).to(dtype)
    B = torch.randn(Kb * bs, N, generator=g).to(dtype)
    A = torch.zeros(Mb * bs, Kb * bs, dtype=torch.float64)
    for blk, r, c in zip(blocks, rows.tolist(), cols.tolist()):
        A[r * bs:(r + 1) * bs, c * bs:(c + 1) * bs] += blk.double()
    return blocks.cuda(), rows.cuda(), cols.cuda(), B.cuda(), A.cuda()


def _rel(C, ref) -> float:
    return ((C.double() - ref).norm() / ref.norm()).item()


def _bound(dtype, A, B, ref) -> float:
    """The error allowed: twice torch's own dense product in the dtype (fp32 accumulation) for
    bf16/fp16; TF32 for float32 (unit roundoff 2⁻¹¹; lcmac's batched kernel measured 7.7e-4)."""
    if dtype == torch.float32:
        return 2e-3
    return 2.0 * _rel(A.to(dtype) @ B, ref) + 1e-6


@pytest.mark.parametrize("dtype, bs", CASES)
def test_fused_matches_float64(kernels, dtype, bs):
    vec = 16 // torch.empty((), dtype=dtype).element_size()
    N = 3 * 128 + 5 * vec                 # not a multiple of the column tile (128 or 256)
    blocks, rows, cols, B, A = _problem(bs, 5, 3, N, dtype, seed=bs, empty_row=2)   # A 5bs x 3bs
    ref = A @ B.double()
    C = bsr_matmul(blocks, rows, cols, B, (5 * bs, 3 * bs), algo="fused")
    assert C.shape == (5 * bs, N) and C.dtype == dtype
    assert torch.count_nonzero(C[2 * bs:3 * bs]) == 0                     # the empty block row
    assert _rel(C, ref) < _bound(dtype, A, B, ref)
    assert torch.equal(C, bsr_matmul(blocks, rows, cols, B, (5 * bs, 3 * bs), algo="fused"))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_single_block_and_no_block(kernels, dtype):
    bs = 64
    g = torch.Generator(device="cuda").manual_seed(4)
    blocks = torch.randn(1, bs, bs, device="cuda", generator=g).to(dtype)
    B = torch.randn(4 * bs, 264, device="cuda", generator=g).to(dtype)
    C = bsr_matmul(blocks, torch.tensor([3]), torch.tensor([1]), B, (4 * bs, 4 * bs), algo="fused")
    ref = torch.zeros(4 * bs, 264, device="cuda", dtype=torch.float64)
    ref[3 * bs:] = blocks[0].double() @ B[bs:2 * bs].double()
    assert torch.count_nonzero(C[:3 * bs]) == 0
    bound = 2e-3 if dtype == torch.float32 else 2.0 * _rel(blocks[0] @ B[bs:2 * bs], ref[3 * bs:]) + 1e-6
    assert _rel(C[3 * bs:], ref[3 * bs:]) < bound
    none = bsr_matmul(blocks[:0], torch.tensor([], dtype=torch.int64), torch.tensor([], dtype=torch.int64), B,
                      (4 * bs, 4 * bs), algo="fused")
    assert none.shape == (4 * bs, 264) and torch.count_nonzero(none) == 0


def test_auto_takes_the_fused_kernel_where_it_wins(kernels):
    blocks, rows, cols, B, A = _problem(64, 4, 4, 256, torch.bfloat16, seed=7)
    fused = bsr_matmul(blocks, rows, cols, B, (256, 256), algo="fused")
    assert torch.equal(bsr_matmul(blocks, rows, cols, B, (256, 256)), fused)
    b32, B32 = blocks.float(), B.float()
    old = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = False     # float32 stays float32: the batched path
        # (its index_add sums with atomics, in no fixed order: compared by error, which TF32's
        # 7.7e-4 would fail)
        assert _rel(bsr_matmul(b32, rows, cols, B32, (256, 256)), A @ B32.double()) < 1e-5
        torch.backends.cuda.matmul.allow_tf32 = True
        assert torch.equal(bsr_matmul(b32, rows, cols, B32, (256, 256)),
                           bsr_matmul(b32, rows, cols, B32, (256, 256), algo="fused"))
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old
    # a B whose rows are not 16 bytes: "auto" takes the batched path, "fused" says why not
    Bo = torch.randn(256, 36, device="cuda").bfloat16()
    ref = A @ Bo.double()
    assert _rel(bsr_matmul(blocks, rows, cols, Bo, (256, 256)), ref) < 1e-2
    with pytest.raises(TargetError, match="multiple of 8"):
        bsr_matmul(blocks, rows, cols, Bo, (256, 256), algo="fused")


def test_misuse_of_the_kernel_is_named(kernels):
    fn = bsr_kernel(target_for("cuda"), "bfloat16", 64)
    blocks = torch.randn(2, 64, 64, device="cuda").bfloat16()
    B = torch.randn(128, 256, device="cuda").bfloat16()
    row_ptr = torch.tensor([0, 1, 2], dtype=torch.int32, device="cuda")
    col_idx = torch.tensor([0, 1], dtype=torch.int32, device="cuda")
    assert fn(blocks, B, row_ptr, col_idx, 128).shape == (128, 256)
    with pytest.raises(ShapeError, match="int32"):
        fn(blocks, B, row_ptr.long(), col_idx, 128)
    with pytest.raises(ShapeError, match="multiples of 64"):
        fn(blocks, B, row_ptr, col_idx, 100)
    with pytest.raises(ShapeError, match="row_ptr"):
        fn(blocks, B, row_ptr, col_idx, 192)                     # row_ptr of 3 is for 2 block rows
    with pytest.raises(Exception, match="float32|dtype"):
        fn(blocks.float(), B.float(), row_ptr, col_idx, 128)
    with pytest.raises(ShapeError, match="outside"):
        bsr_matmul(blocks, torch.tensor([0, 2]), torch.tensor([0, 1]), B, (128, 128), algo="fused")


def _sorted(blocks, rows, cols):
    order = torch.argsort(rows, stable=True)
    return blocks[order].contiguous(), rows[order], cols[order]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("sort", [True, False])
def test_prepared_call_syncs_nothing_and_is_captured(kernels, dtype, sort):
    """bsr_matmul(prepared, B) gives the unprepared call's C; neither path waits for the GPU
    (torch's sync debug mode set to raise; the unprepared call does raise); a CUDA graph
    captures both, and its replays see B and the blocks updated in place."""
    bs, shape = 64, (5 * 64, 3 * 64)
    blocks, rows, cols, B, _ = _problem(bs, 5, 3, 264, dtype, seed=21, empty_row=2)
    if sort:
        blocks, rows, cols = _sorted(blocks, rows, cols)
    a = prepare_bsr(blocks, rows, cols, shape)
    assert (a.order is None) == sort and a.row_ptr.is_cuda and a.blocks is blocks
    assert torch.equal(bsr_matmul(a, B, algo="fused"), bsr_matmul(blocks, rows, cols, B, shape, algo="fused"))
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        bsr_matmul(a, B, algo="fused")
        bsr_matmul(a, B, algo="vendor")
        with pytest.raises(RuntimeError, match="synchroniz"):
            bsr_matmul(blocks, rows, cols, B, shape, algo="fused")      # indices to the host
    finally:
        torch.cuda.set_sync_debug_mode("default")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):                                        # warm-up before capture
        for _ in range(2):
            bsr_matmul(a, B, algo="fused"), bsr_matmul(a, B, algo="vendor")
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fused, batched = bsr_matmul(a, B, algo="fused"), bsr_matmul(a, B, algo="vendor")
    B.copy_(torch.randn_like(B, dtype=torch.float32).to(dtype))
    blocks.mul_(-2)                                                      # in place, after capture
    graph.replay()
    torch.cuda.synchronize()
    A = torch.zeros(*shape, dtype=torch.float64, device="cuda")
    for blk, r, c in zip(blocks, rows.tolist(), cols.tolist()):
        A[r * bs:(r + 1) * bs, c * bs:(c + 1) * bs] += blk.double()
    ref = A @ B.double()
    assert torch.equal(fused, bsr_matmul(blocks, rows, cols, B, shape, algo="fused"))
    assert _rel(fused, ref) < _bound(dtype, A, B, ref)
    assert _rel(batched, ref) < (1e-5 if dtype == torch.float32 else 2e-2)   # sums in bf16
