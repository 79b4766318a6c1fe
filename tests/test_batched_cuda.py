"""lcmac.bmm's batched CUDA kernel (needs a GPU, TileLang and nvcc; skipped elsewhere): every
size from 16 to 512 that the tiles do and do not divide, against float64, as a multiple of
torch.bmm's own error; any batch count from one kernel; the op's gradients and graph."""
from concurrent.futures import ThreadPoolExecutor

import pytest

torch = pytest.importorskip("torch")

import lcmac  # noqa: E402
from lcmac.api.bmm import batched_kernel  # noqa: E402
from lcmac.api.call_args import target_for  # noqa: E402
from lcmac.core.errors import DTypeError, ShapeError, TargetError  # noqa: E402

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

BF16 = [(16, 16, 16), (24, 24, 24), (33, 33, 33), (64, 64, 64), (63, 65, 127), (100, 100, 100),
        (128, 128, 128), (129, 129, 129), (200, 136, 72), (256, 256, 256), (384, 384, 384),
        (512, 512, 512)]
FP32 = [(16, 16, 16), (100, 100, 100), (256, 256, 256)]
# wider than 128: the production GEMM template (batched_template "auto" → "gemm"); 300×264×520
# has partial tiles on TMA rows, 300×257×513 rows that are not 16-byte multiples
LARGE = [(torch.bfloat16, (256, 256, 256)), (torch.bfloat16, (512, 512, 512)), (torch.bfloat16, (300, 257, 513)),
         (torch.bfloat16, (300, 264, 520)), (torch.float32, (256, 256, 256)), (torch.float32, (512, 512, 512)),
         (torch.float32, (300, 257, 513))]
# bf16's grid kernel (its default is the persistent grid) and the small template's 128×256
# kernel, by name
LARGE_VARIANTS = [(torch.bfloat16, (512, 512, 512), {"persistent": False}),
                  (torch.bfloat16, (300, 264, 520), {"persistent": False}),
                  (torch.bfloat16, (512, 512, 512), {"batched_template": "small"})]
# the 3D partition (policy "splitk"): long K, odd sizes
SPLITK = [(torch.bfloat16, (16, 16, 256)), (torch.bfloat16, (32, 32, 512)), (torch.bfloat16, (17, 19, 300)),
          (torch.float16, (16, 16, 64)), (torch.float32, (16, 16, 256)), (torch.float32, (32, 32, 512)),
          (torch.float32, (9, 12, 100))]
# float64: the small template at every size (fp64 mma.sync, float64 accumulators), tiles the
# sizes do and do not divide; and its 3D partition
FP64 = [(16, 16, 16), (33, 33, 33), (64, 64, 64), (100, 100, 100), (128, 128, 128), (129, 129, 129),
        (200, 136, 72), (256, 256, 256), (512, 512, 512)]
FP64_SPLITK = [(16, 16, 256), (17, 19, 300)]


@pytest.fixture(scope="module")
def kernels():
    """All kernels of the file compiled at once (each in its own worker process)."""
    cases = [("bfloat16", s, None) for s in BF16] + [("float32", s, None) for s in FP32]
    cases += [(str(d).replace("torch.", ""), s, {"policy": "splitk"}) for d, s in SPLITK]
    cases += [(str(d).replace("torch.", ""), s, None) for d, s in LARGE]
    cases += [(str(d).replace("torch.", ""), s, c) for d, s, c in LARGE_VARIANTS]
    cases += [("bfloat16", (136, 136, 16), None)]
    cases += [("float64", s, None) for s in FP64] + [("float64", s, {"policy": "splitk"}) for s in FP64_SPLITK]
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda c: batched_kernel(target_for("cuda"), c[0], c[1], c[2]), cases))


def _pair(batch, M, N, K, dtype, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    gdt = torch.float64 if dtype == torch.float64 else torch.float32     # float64: all 53 bits
    A = torch.randn(batch, M, K, device="cuda", generator=g, dtype=gdt).to(dtype)
    B = torch.randn(batch, K, N, device="cuda", generator=g, dtype=gdt).to(dtype)
    return A, B


def _rel(C, ref):
    return ((C.double() - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize("dtype, shape", [(torch.bfloat16, s) for s in BF16] + [(torch.float32, s) for s in FP32])
def test_every_size_matches_float64(kernels, dtype, shape):
    M, N, K = shape
    A, B = _pair(37, M, N, K, dtype)
    ref = torch.bmm(A.double(), B.double())
    C = lcmac.bmm(A, B, algo="gemm")
    assert C.shape == (37, M, N) and C.dtype == dtype
    if dtype == torch.bfloat16:
        assert _rel(C, ref) < 2.0 * _rel(torch.bmm(A, B), ref)
    else:
        # float32 is multiplied as TF32 (10-bit mantissa, unit roundoff 2⁻¹¹ ≈ 4.9e-4); cuBLAS's
        # TF32 batched product measured 2.9e-4 and lcmac's 7.7e-4 at 64³ to 512³
        assert _rel(C, ref) < 2e-3


def test_one_kernel_serves_any_batch_count_beyond_the_grid_limit():
    for batch in (1, 7, 70000):                              # 70000 > 65535: x is the product index
        A, B = _pair(batch, 16, 16, 16, torch.bfloat16, seed=batch)
        C = torch.full((batch, 16, 16), float("nan"), device="cuda", dtype=torch.bfloat16)
        lcmac.bmm(A, B, algo="gemm", out=C)
        assert torch.equal(C[-1], lcmac.bmm(A[-1:], B[-1:], algo="gemm")[0])
        assert _rel(C, torch.bmm(A.double(), B.double())) < 1e-2
    assert lcmac.bmm(A[:0], B[:0], algo="gemm").shape == (0, 16, 16)


def test_gradients_and_compile_on_cuda():
    A, B = _pair(5, 64, 64, 64, torch.bfloat16, seed=3)
    Ag, Bg = A.clone().requires_grad_(), B.clone().requires_grad_()
    C = lcmac.bmm(Ag, Bg, algo="gemm")
    G = torch.randn_like(C)
    C.backward(G)
    dA = torch.bmm(G.double(), B.double().transpose(1, 2))
    assert _rel(Ag.grad, dA) < 2 * _rel(torch.bmm(G, B.transpose(1, 2)), dA) + 1e-6
    f = torch.compile(lambda a, b: torch.ops.lcmac.bmm(a, b, "gemm") * 2, fullgraph=True, backend="aot_eager")
    assert torch.equal(f(A, B), lcmac.bmm(A, B, algo="gemm") * 2)


def test_misuse_is_named():
    fn = batched_kernel(target_for("cuda"), "bfloat16", (16, 16, 16))
    A, B = _pair(2, 16, 16, 16, torch.bfloat16)
    with pytest.raises(ShapeError, match="batch count"):
        fn(A, B[:1])
    with pytest.raises(DTypeError, match="float32"):
        fn(A.float(), B.float())
    with pytest.raises(ShapeError, match="contiguous"):
        fn(A.transpose(1, 2), B)
    with pytest.raises(Exception, match="in-block LCMA"):
        lcmac.bmm(A, B, algo="strassen")
    # what the call's quick test must hand to the full check, each named there
    flat = torch.empty(2 * 16 * 16 + 1, dtype=torch.bfloat16, device="cuda")
    misaligned = flat[1:].view(2, 16, 16).copy_(A)
    with pytest.raises(ShapeError, match="aligned"):
        fn(misaligned, B)
    with pytest.raises(TargetError, match="cpu"):
        fn(A, B.cpu())
    with pytest.raises(ShapeError, match="out"):
        fn(A, B, out=torch.empty(2, 16, 8, dtype=torch.bfloat16, device="cuda"))
    with pytest.raises(DTypeError, match="out"):
        fn(A, B, out=torch.empty(2, 16, 16, dtype=torch.float16, device="cuda"))
    assert _rel(fn(A, B), torch.bmm(A.double(), B.double())) < 1e-2


def test_structured_products_on_cuda():
    from lcmac.api.structured import bsr_matmul, lowrank_matmul
    g = torch.Generator(device="cuda").manual_seed(9)
    blocks = torch.randn(6, 64, 64, device="cuda", generator=g).bfloat16()
    rows, cols = torch.tensor([0, 1, 1, 2, 3, 3]), torch.tensor([2, 0, 3, 1, 1, 1])
    B = torch.randn(256, 64, device="cuda", generator=g).bfloat16()
    A = torch.zeros(256, 256, device="cuda", dtype=torch.float64)
    for blk, r, c in zip(blocks, rows.tolist(), cols.tolist()):
        A[r * 64:(r + 1) * 64, c * 64:(c + 1) * 64] += blk.double()
    ref = A @ B.double()
    assert _rel(bsr_matmul(blocks, rows, cols, B, (256, 256), algo="gemm"), ref) < 1e-2
    U, V, X = (torch.randn(4, 64, 64, device="cuda", generator=g).bfloat16() for _ in range(3))
    ref = (U.double() @ V.double().transpose(1, 2)) @ X.double()
    assert _rel(lowrank_matmul(U, V, X, algo="gemm"), ref) < 1e-2


def test_spgemm_on_cuda():
    from lcmac.api.structured import BSR, bsr_spgemm
    g = torch.Generator(device="cuda").manual_seed(11)
    mk = lambda r, c, n: BSR(torch.randn(len(r), 64, 64, device="cuda", generator=g).bfloat16(),  # noqa: E731
                             torch.tensor(r, device="cuda"), torch.tensor(c, device="cuda"), n)
    a = mk([0, 0, 1, 3], [1, 2, 2, 0], (256, 192))
    b = mk([0, 1, 2, 2], [1, 0, 0, 1], (192, 128))
    ref = a.to_dense().double() @ b.to_dense().double()
    for algo in ("gemm", "auto"):
        c = bsr_spgemm(a, b, algo=algo)
        assert c.blocks.device.type == "cuda" and _rel(c.to_dense(), ref) < 1e-2


@pytest.mark.parametrize("dtype, code", [(torch.bfloat16, 2), (torch.float64, 1)])   # lcmac_dtype
def test_c_api_runs_a_batched_artifact(tmp_path, dtype, code):
    """lcmac_cuda_bmm from C (the harness as a shared library, called on torch's stream):
    the same C as lcmac.bmm, any batch count; each call refuses the other's artifact."""
    import ctypes
    import shutil
    import subprocess

    from lcmac.artifact.cache import cached_build
    from lcmac.runtime import c_include_dir, c_source
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("needs gcc")
    so = tmp_path / "liblcmac_capi.so"
    subprocess.run([cc, "-O2", "-shared", "-fPIC", "-I", c_include_dir(), "-o", str(so), c_source(),
                    "-ldl", "-lpthread"], check=True)
    lib = ctypes.CDLL(str(so))
    vp, i64 = ctypes.c_void_p, ctypes.c_int64
    lib.lcmac_open_cuda_artifact.restype = vp
    lib.lcmac_open_cuda_artifact.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.POINTER(ctypes.c_int),
                                             ctypes.c_char_p, ctypes.c_size_t]
    lib.lcmac_cuda_bmm.argtypes = [vp, vp, vp, vp, i64, i64, i64, i64, ctypes.c_int, vp]
    lib.lcmac_cuda_matmul.argtypes = [vp, vp, vp, vp, i64, i64, i64, ctypes.c_int, vp, ctypes.c_size_t, vp]
    lib.lcmac_last_error.restype = ctypes.c_char_p
    lib.lcmac_last_error.argtypes = [vp]
    lib.lcmac_close.argtypes = [vp]
    dname = str(dtype).replace("torch.", "")
    man = cached_build("gemm", target_for("cuda"), dname, (16, 16, 16), config={"batched": True}).manifest
    status, err = ctypes.c_int(), ctypes.create_string_buffer(1024)
    h = lib.lcmac_open_cuda_artifact(str(man).encode(), torch.cuda.current_device(), ctypes.byref(status),
                                     err, len(err))
    assert h, err.value
    try:
        stream = torch.cuda.current_stream().cuda_stream
        for batch in (1, 37):
            A, B = _pair(batch, 16, 16, 16, dtype, seed=batch)
            C = torch.full((batch, 16, 16), float("nan"), device="cuda", dtype=dtype)
            rc = lib.lcmac_cuda_bmm(h, A.data_ptr(), B.data_ptr(), C.data_ptr(), batch, 16, 16, 16, code, stream)
            torch.cuda.synchronize()
            assert rc == 0, lib.lcmac_last_error(h)
            assert torch.equal(C, lcmac.bmm(A, B, algo="gemm"))
        assert lib.lcmac_cuda_bmm(h, A.data_ptr(), B.data_ptr(), C.data_ptr(), 37, 16, 16, 32, code, stream) == 1
        assert b"not the artifact's" in lib.lcmac_last_error(h)
        # (short buffers are refused against their cudaMalloc allocation, tests/runtime/cuda_misuse.c;
        # torch's caching allocator hands out slices of larger ones, so they are not tried here)
        assert lib.lcmac_cuda_bmm(h, A.data_ptr(), B.data_ptr(), C.data_ptr(), -1, 16, 16, 16, code, stream) == 1
        assert b"batch must be" in lib.lcmac_last_error(h)
        other = 0 if code == 1 else 1                      # float32 for float64, float64 for bf16
        assert lib.lcmac_cuda_bmm(h, A.data_ptr(), B.data_ptr(), C.data_ptr(), 37, 16, 16, 16, other, stream) == 1
        assert (b"dtype %s is not the artifact's %s" % ((b"float32", b"float64") if code == 1 else
                                                         (b"float64", b"bfloat16"))) in lib.lcmac_last_error(h)
        assert lib.lcmac_cuda_matmul(h, A.data_ptr(), B.data_ptr(), C.data_ptr(), 16, 16, 16, code, None, 0,
                                     stream) == 1
        assert b"lcmac_cuda_bmm" in lib.lcmac_last_error(h)
    finally:
        lib.lcmac_close(h)


# ---- the 3D partition (policy "splitk") and algo="auto" ------------------------------------


@pytest.mark.parametrize("dtype, shape", SPLITK)
def test_splitk_matches_float64(kernels, dtype, shape):
    M, N, K = shape
    A, B = _pair(41, M, N, K, dtype, seed=K)               # 41 = 10 groups of 4 and a partial one
    ref = torch.bmm(A.double(), B.double())
    fn = batched_kernel(target_for("cuda"), str(dtype).replace("torch.", ""), shape, {"policy": "splitk"})
    C = torch.full((41, M, N), float("nan"), device="cuda", dtype=dtype)
    fn(A, B, out=C)
    if dtype == torch.float32:
        assert _rel(C, ref) < 2e-3                         # TF32, as the 1D/2D kernel
    else:
        assert _rel(C, ref) < 2.0 * _rel(torch.bmm(A, B), ref)
    C2 = torch.empty_like(C)
    fn(A, B, out=C2)
    assert torch.equal(C, C2)                              # the partials are summed in a fixed order


@pytest.mark.parametrize("dtype, shape, batch", [(torch.bfloat16, (16, 16, 16), 100_000),
                                                 (torch.float16, (8, 8, 8), 100_000),
                                                 (torch.bfloat16, (24, 24, 24), 10_000),
                                                 (torch.float32, (16, 16, 256), 10_000),
                                                 (torch.bfloat16, (32, 32, 32), 10_000),
                                                 (torch.float32, (256, 256, 256), 20_000),
                                                 (torch.bfloat16, (256, 256, 256), 20_000)])
def test_auto_picks_run_and_match_torch_bmm(dtype, shape, batch):
    from lcmac.policy.batched import choose_batched
    M, N, K = shape
    A, B = _pair(batch, M, N, K, dtype, seed=batch)
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        pick = choose_batched("cuda", str(dtype).replace("torch.", ""), M, N, K, batch, tf32=True)
        C = lcmac.bmm(A, B)
        ref = torch.bmm(A, B)
        if pick is None:
            assert torch.equal(C, ref)                     # the vendor's own bits
        else:
            fn = batched_kernel(target_for("cuda"), str(dtype).replace("torch.", ""), shape, pick)
            assert torch.equal(C, fn(A, B))                # auto ran the kernel the rule named
            exact = torch.bmm(A[:512].double(), B[:512].double())
            assert _rel(C[:512], exact) < max(2.0 * _rel(ref[:512], exact), 2e-3)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old
    assert (pick is None) == (shape == (32, 32, 32) or shape == (256, 256, 256) and dtype == torch.bfloat16)


# ---- wider than 128: the production GEMM template ---------------------------------------------


def _check_large(C, A, B, dtype):
    ref = torch.bmm(A.double(), B.double())
    if dtype == torch.float32:
        assert _rel(C, ref) < 2e-3                         # TF32, as the small template
    else:
        assert _rel(C, ref) < 2.0 * _rel(torch.bmm(A, B), ref)


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("dtype, shape", LARGE)
def test_gemm_template_matches_float64(kernels, dtype, shape, batch):
    M, N, K = shape
    A, B = _pair(batch, M, N, K, dtype, seed=batch + K)
    # a product more in C than in the call: no tile may write past the batch
    Cx = torch.full((batch + 1, M, N), float("nan"), device="cuda", dtype=dtype)
    C = lcmac.bmm(A, B, algo="gemm", out=Cx[:batch])
    assert C.data_ptr() == Cx.data_ptr() and torch.isnan(Cx[batch]).all()
    _check_large(C, A, B, dtype)
    # the last product alone (copied: a slice of unaligned rows is not 16-byte aligned): the
    # same bits (no tile reads another product's rows; with batch 1 most persistent CTAs idle)
    assert torch.equal(C[-1], lcmac.bmm(A[-1:].clone(), B[-1:].clone(), algo="gemm")[0])


@pytest.mark.parametrize("dtype, shape, config", LARGE_VARIANTS)
def test_gemm_template_variants_match_float64(kernels, dtype, shape, config):
    M, N, K = shape
    A, B = _pair(5, M, N, K, dtype, seed=7)
    fn = batched_kernel(target_for("cuda"), str(dtype).replace("torch.", ""), shape, config)
    C = torch.full((5, M, N), float("nan"), device="cuda", dtype=dtype)
    fn(A, B, out=C)
    _check_large(C, A, B, dtype)
    if "persistent" in config:                             # the same tiles, walked otherwise
        assert torch.equal(C, lcmac.bmm(A, B, algo="gemm"))


def test_gemm_template_grid_beyond_65535_ctas(kernels):
    """40 000 products of 2 tiles each: 80 000 CTAs on the grid's x."""
    batch = 40_000
    A, B = _pair(batch, 136, 136, 16, torch.bfloat16, seed=5)
    C = lcmac.bmm(A, B, algo="gemm")
    for part in (slice(0, 256), slice(batch - 256, batch)):
        _check_large(C[part], A[part], B[part], torch.bfloat16)


# ---- float64 ------------------------------------------------------------------------------------


def _check_float64(C, A, B):
    """C against the CPU's float64 product (another implementation than cuBLAS's): within 1e-12
    and within 8× torch.bmm's own distance from it (float64 products measure 1e-16 to 1e-15;
    an fp32 accumulator or a TF32 step would give 1e-7 and more)."""
    ref = torch.bmm(A.cpu(), B.cpu())
    err = _rel(C.cpu(), ref)
    err_bmm = _rel(torch.bmm(A, B).cpu(), ref)
    assert err < 1e-12 and err <= max(8 * err_bmm, 1e-15), (err, err_bmm)
    return err, err_bmm


@pytest.mark.parametrize("shape", FP64)
def test_float64_every_size_matches_the_cpu(kernels, shape):
    M, N, K = shape
    A, B = _pair(37, M, N, K, torch.float64, seed=M + K)
    Cx = torch.full((38, M, N), float("nan"), device="cuda", dtype=torch.float64)
    C = lcmac.bmm(A, B, algo="gemm", out=Cx[:37])       # no tile writes past the batch
    assert C.dtype == torch.float64 and torch.isnan(Cx[37]).all()
    err, err_bmm = _check_float64(C, A, B)
    print(f"float64 {M}x{N}x{K}: error {err:.2e}, torch.bmm {err_bmm:.2e}")


@pytest.mark.parametrize("shape", [(16, 16, 16), (100, 100, 100)])
def test_float64_one_kernel_serves_any_batch_count(kernels, shape):
    M, N, K = shape
    for batch in (1, 7, 4099):                 # 16³: 16 products a CTA, 7 and 4099 end a group part-way
        A, B = _pair(batch, M, N, K, torch.float64, seed=batch)
        C = torch.full((batch, M, N), float("nan"), device="cuda", dtype=torch.float64)
        lcmac.bmm(A, B, algo="gemm", out=C)
        assert torch.equal(C[-1], lcmac.bmm(A[-1:], B[-1:], algo="gemm")[0])
        _check_float64(C[:512], A[:512], B[:512])
    assert lcmac.bmm(A[:0], B[:0], algo="gemm").shape == (0, M, N)


@pytest.mark.parametrize("shape", FP64_SPLITK)
def test_float64_splitk_matches_the_cpu(kernels, shape):
    M, N, K = shape
    A, B = _pair(41, M, N, K, torch.float64, seed=K)
    fn = batched_kernel(target_for("cuda"), "float64", shape, {"policy": "splitk"})
    C = torch.full((41, M, N), float("nan"), device="cuda", dtype=torch.float64)
    fn(A, B, out=C)
    _check_float64(C, A, B)
    C2 = torch.empty_like(C)
    fn(A, B, out=C2)
    assert torch.equal(C, C2)                              # the partials are summed in a fixed order


@pytest.mark.parametrize("shape, batch", [((16, 16, 16), 100_000), ((64, 64, 64), 10_000),
                                          ((256, 256, 256), 2_000)])
def test_float64_auto_is_torch_bmm(shape, batch):
    A, B = _pair(batch, *shape[:2], shape[2], torch.float64, seed=7)
    assert torch.equal(lcmac.bmm(A, B), torch.bmm(A, B))   # no measured win: the vendor's bits


def test_float64_misuse_is_named(kernels):
    fn = batched_kernel(target_for("cuda"), "float64", (16, 16, 16))
    A, B = _pair(2, 16, 16, 16, torch.float64)
    with pytest.raises(DTypeError, match="float64"):
        fn(A.float(), B.float())
    with pytest.raises(DTypeError, match="no float64"):
        batched_kernel(target_for("cuda"), "float64", (256, 256, 256), {"batched_template": "gemm"})
