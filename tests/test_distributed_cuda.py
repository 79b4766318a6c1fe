"""lcmac.distributed on several GPUs with NCCL (skipped with fewer than two): the CPU cases of
test_distributed exactly in float64, bf16 within its error bound, and host_matmul from host
memory into one shared C."""
import os
import tempfile

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tests.test_distributed import CASES, _free_port, _int_inputs  # noqa: E402

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                                 reason="needs two CUDA GPUs")]


def _rel(C, ref):
    return float(np.abs(C - ref).max() / np.abs(ref).max())


def _worker(rank, size, port, outdir):
    import torch.distributed as dist

    import lcmac.parallel.distributed as ld
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=size, device_id=torch.device("cuda", rank))
    res = {}
    try:
        for n, (algo, M, N, K, src, dst, strategy) in enumerate(CASES):
            A, B = (X.cuda() for X in _int_inputs(M, N, K, seed=n))
            holds = src is None or rank == src
            C = ld.matmul(A if holds else None, B if holds else None, algo=algo, src=src,
                          dst=dst, strategy=strategy)
            res[f"case{n}"] = np.array([]) if C is None else C.cpu().numpy()
        g = torch.Generator(device="cuda").manual_seed(3)
        A = torch.randn(4096, 3072, device="cuda", generator=g).bfloat16()
        B = torch.randn(3072, 2048, device="cuda", generator=g).bfloat16()
        for algo in ("gemm", "strassen", "winograd^2"):
            for strategy in ("slices", "products"):
                C = ld.matmul(A, B, algo=algo, strategy=strategy, dst=0)
                if rank == 0:
                    res[f"bf16_{algo}_{strategy}"] = C.double().cpu().numpy()
        if rank == 0:
            res["bf16_torch"] = (A @ B).double().cpu().numpy()
            res["bf16_ref"] = (A.double() @ B.double()).cpu().numpy()
        # host operands, tiles over the GPUs, one shared C
        for dtype in (torch.float32, torch.bfloat16):
            g = torch.Generator().manual_seed(5)
            Ah = torch.randn(3000, 2500, generator=g).to(dtype)
            Bh = torch.randn(2500, 2200, generator=g).to(dtype)
            out = torch.from_file(os.path.join(outdir, f"C{dtype}.bin"), shared=True,
                                  size=3000 * 2200, dtype=dtype).view(3000, 2200)
            ld.host_matmul(Ah, Bh, out, tile=1024, chunk=1024)
            if rank == 0:
                res[f"host_{dtype}"] = _rel(out.double().numpy(), (Ah.double() @ Bh.double()).numpy())
                res[f"host_{dtype}_torch"] = _rel((Ah.cuda() @ Bh.cuda()).double().cpu().numpy(),
                                                  (Ah.double() @ Bh.double()).numpy())
    finally:
        dist.destroy_process_group()
    np.savez(os.path.join(outdir, f"rank{rank}.npz"), **res)


@pytest.fixture(scope="module")
def results():
    size = min(torch.cuda.device_count(), 4)
    out = tempfile.mkdtemp()
    torch.multiprocessing.spawn(_worker, args=(size, _free_port(), out), nprocs=size, join=True)
    return size, [dict(np.load(os.path.join(out, f"rank{r}.npz"))) for r in range(size)]


def test_float64_cases_exact_on_gpus(results):
    size, res = results
    for n, (algo, M, N, K, src, dst, _) in enumerate(CASES):
        A, B = _int_inputs(M, N, K, seed=n)
        for r in range(size):
            if dst is not None and r != dst:
                assert res[r][f"case{n}"].size == 0
                continue
            np.testing.assert_array_equal(res[r][f"case{n}"], (A @ B).numpy(),
                                          err_msg=f"{algo} rank {r}")


@pytest.mark.parametrize("algo", ["gemm", "strassen", "winograd^2"])
@pytest.mark.parametrize("strategy", ["slices", "products"])
def test_bf16_within_the_error_model(results, algo, strategy):
    """Within 1.5× the error model's ratio (the unfused Combine H that these torch combines
    are) times torch.matmul's error; the plain GEMM within 1.5× torch's."""
    from lcmac.costmodel.accuracy import error_ratio
    _, res = results
    ref = res[0]["bf16_ref"]
    base = _rel(res[0]["bf16_torch"], ref)
    ratio = 1.0 if algo == "gemm" else error_ratio(algo, "bfloat16", variant="unfused").ratio
    assert _rel(res[0][f"bf16_{algo}_{strategy}"], ref) < 1.5 * ratio * base


def test_host_matmul_on_gpus(results):
    _, res = results
    for dtype in (torch.float32, torch.bfloat16):
        err, base = float(res[0][f"host_{dtype}"]), float(res[0][f"host_{dtype}_torch"])
        assert err < 3 * base + 1e-6, (dtype, err, base)
