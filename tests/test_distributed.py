"""lcmac.distributed on CPU processes with the gloo backend (what CI can run): every case
against the single-process product, exactly for integer-valued inputs."""
import os
import socket
import tempfile

import numpy as np
import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

from lcmac.artifact.build import resolve_algorithm  # noqa: E402
from lcmac.costmodel.distributed import plan_products  # noqa: E402
from lcmac.spec.profiles import get_profile  # noqa: E402

# (algo, M, N, K, src, dst, strategy): odd shapes pad; src/dst None = every rank
CASES = [
    ("strassen", 64, 48, 32, None, None, "auto"),
    ("strassen", 37, 29, 41, None, 1, "products"),
    ("winograd", 64, 64, 64, 0, None, "products"),
    ("winograd", 50, 30, 70, 1, 0, "slices"),
    ("strassen^2", 64, 64, 64, None, None, "products"),
    ("gemm", 33, 17, 9, 0, None, "auto"),
    ("laderman", 45, 33, 27, None, None, "products"),
]


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _int_inputs(M, N, K, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(-4, 5, (M, K), generator=g).double(),
            torch.randint(-4, 5, (K, N), generator=g).double())


def _worker(rank, size, port, outdir):
    import lcmac.parallel.distributed as ld
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=size)
    results = {}
    try:
        for n, (algo, M, N, K, src, dst, strategy) in enumerate(CASES):
            A, B = _int_inputs(M, N, K, seed=n)
            holds = src is None or rank == src
            C, plan = ld.matmul(A if holds else None, B if holds else None, algo=algo, src=src,
                                dst=dst, strategy=strategy, return_plan=True)
            results[f"case{n}"] = None if C is None else C.numpy()
            results[f"case{n}_strategy"] = plan.strategy
        # float32 random: within a few units of float32 rounding of the product's size
        g = torch.Generator().manual_seed(7)
        A, B = torch.randn(96, 80, generator=g), torch.randn(80, 64, generator=g)
        results["f32"] = ld.matmul(A, B, algo="strassen^2", strategy="products").numpy()
        # each rank's products by lcmac.matmul's own choice (this small shape: the vendor GEMM)
        A, B = _int_inputs(40, 24, 56, seed=21)
        results["local_auto"] = ld.matmul(A, B, algo="strassen", local="auto").numpy()
        # host operands, C's tiles dealt to the ranks, written into one shared out
        A, B = _int_inputs(300, 260, 200, seed=11)
        out = torch.from_file(os.path.join(outdir, "C.bin"), shared=True, size=300 * 260,
                              dtype=torch.float64).view(300, 260)
        _, tplan = ld.host_matmul(A, B, out, tile=128, chunk=64, return_plan=True)
        results["host"] = out.clone().numpy()
        # each rank's own out (not shared): the tiles are exchanged, every rank gets all of C
        mine = torch.full((300, 260), float("nan"), dtype=torch.float64)
        ld.host_matmul(A, B, mine, tile=128, chunk=64)
        results["host_private"] = mine.numpy()
        results["host_tiles"] = np.array(len(tplan.tiles[rank]))
        # operands that want a gradient: refused on every rank (no silent loss of grad_fn)
        try:
            ld.matmul(torch.ones(4, 4, requires_grad=True), torch.ones(4, 4))
            results["grad"] = "no error"
        except Exception as e:          # noqa: BLE001 - the message is what is tested
            results["grad"] = str(e)
        # the ranks disagree: every rank gets the error, none hangs
        try:
            ld.matmul(torch.ones(8, 8 + rank), torch.ones(8 + rank, 8), algo="strassen")
            results["disagree"] = "no error"
        except Exception as e:          # noqa: BLE001 - the message is what is tested
            results["disagree"] = str(e)
    finally:
        dist.destroy_process_group()
    np.savez(os.path.join(outdir, f"rank{rank}.npz"),
             **{k: (v if v is not None else np.array([])) for k, v in results.items()
                if not isinstance(v, str)},
             **{k: np.array(v) for k, v in results.items() if isinstance(v, str)})


def _spawn(size):
    out = tempfile.mkdtemp()
    torch.multiprocessing.spawn(_worker, args=(size, _free_port(), out), nprocs=size, join=True)
    return [dict(np.load(os.path.join(out, f"rank{r}.npz"))) for r in range(size)]


@pytest.fixture(scope="module", params=[2, 3])
def ranks(request):
    return request.param, _spawn(request.param)


def test_distributed_matches_the_exact_product(ranks):
    size, res = ranks
    for n, (algo, M, N, K, src, dst, strategy) in enumerate(CASES):
        A, B = _int_inputs(M, N, K, seed=n)
        ref = (A @ B).numpy()
        for r in range(size):
            got = res[r][f"case{n}"]
            if dst is not None and r != dst:
                assert got.size == 0, f"{algo}: rank {r} is not dst={dst} and got C"
                continue
            assert got.shape == (M, N), (algo, r, got.shape)
            np.testing.assert_array_equal(got, ref, err_msg=f"{algo} {M}x{N}x{K} rank {r}")
        if strategy != "auto":
            assert str(res[0][f"case{n}_strategy"]) == strategy


def test_distributed_float32_within_the_error_model(ranks):
    """Random float32: within 1.5× the error model's ratio for Strassen² times the plain
    product's error (both against float64)."""
    from lcmac.costmodel.accuracy import error_ratio
    size, res = ranks
    g = torch.Generator().manual_seed(7)
    A, B = torch.randn(96, 80, generator=g), torch.randn(80, 64, generator=g)
    ref = (A.double() @ B.double()).numpy()
    rel = lambda C: np.linalg.norm(C - ref) / np.linalg.norm(ref)
    base = rel((A @ B).double().numpy())
    bound = 1.5 * error_ratio("strassen^2", "float32").ratio * base
    for r in range(size):
        assert rel(res[r]["f32"].astype(np.float64)) < bound, (rel(res[r]["f32"]), bound)


def test_host_matmul_fills_one_shared_out_or_each_rank_s_own(ranks):
    size, res = ranks
    A, B = _int_inputs(300, 260, 200, seed=11)
    ref = (A @ B).numpy()
    for r in range(size):
        np.testing.assert_array_equal(res[r]["host"], ref)
        np.testing.assert_array_equal(res[r]["host_private"], ref)
    assert sum(int(res[r]["host_tiles"]) for r in range(size)) == 3 * 3
    assert min(int(res[r]["host_tiles"]) for r in range(size)) >= 9 // size


def test_host_matmul_one_process_and_its_errors():
    import lcmac.parallel.distributed as ld
    if dist.is_initialized():
        pytest.skip("a process group is initialised in this process")
    A, B = torch.randn(70, 50, dtype=torch.float64), torch.randn(50, 90, dtype=torch.float64)
    out = torch.empty(70, 90, dtype=torch.float64)
    ld.host_matmul(A, B, out, tile=32, chunk=16)
    np.testing.assert_allclose(out.numpy(), (A @ B).numpy(), rtol=1e-12, atol=1e-12)
    with pytest.raises(Exception, match="do not make C"):
        ld.host_matmul(A, B, torch.empty(70, 91, dtype=torch.float64))
    with pytest.raises(Exception, match="one dtype"):
        ld.host_matmul(A, B.float(), out)
    with pytest.raises(Exception, match="takes bfloat16"):
        ld.host_matmul(A.int(), B.int(), out.int())
    with pytest.raises(Exception, match="records no gradient"):
        ld.host_matmul(A.requires_grad_(), B, out)


def test_local_auto_gives_the_exact_product(ranks):
    size, res = ranks
    A, B = _int_inputs(40, 24, 56, seed=21)
    for r in range(size):
        np.testing.assert_array_equal(res[r]["local_auto"], (A @ B).numpy())


def test_bad_calls_get_an_error_on_every_rank(ranks):
    size, res = ranks
    for r in range(size):
        assert "records no gradient" in str(res[r]["grad"]), res[r]["grad"]
    for r in range(size):
        assert "differently" in str(res[r]["disagree"]), res[r]["disagree"]


# ---- the plan (no processes) ------------------------------------------------------------------
H100 = get_profile("h100")


@pytest.mark.parametrize("algo", ["strassen", "winograd", "strassen^2", "laderman"])
@pytest.mark.parametrize("P", [2, 3, 4, 8])
def test_plan_covers_every_unit_once_and_balances_predicted_time(algo, P, monkeypatch):
    from lcmac.costmodel import distributed as cd
    alg = resolve_algorithm(algo)[0]
    plan = plan_products(alg, 8192, 8192, 8192, P, "bfloat16", H100, strategy="products", slices=2)
    units = [u for us in plan.units for u in us]
    assert sorted(units) == [(r, s) for r in range(alg.R) for s in range(plan.slices)]
    assert set(plan.owner) == {(i, j, s) for i in range(alg.m) for j in range(alg.n)
                               for s in range(plan.slices)}
    # moving units off the slowest rank never leaves it slower than equal counts did
    monkeypatch.setattr(cd, "_rebalance", lambda ranks, priced, price: (ranks, priced))
    equal = plan_products(alg, 8192, 8192, 8192, P, "bfloat16", H100, strategy="products", slices=2)
    assert max(len(u) for u in equal.units) - min(len(u) for u in equal.units) <= 1
    assert plan.predicted_s <= equal.predicted_s


def test_the_rank_that_sends_the_operands_gets_fewer_units():
    alg = resolve_algorithm("strassen^2")[0]
    plan = plan_products(alg, 32768, 32768, 32768, 4, "bfloat16", H100, src=0, strategy="products",
                         slices=1)
    counts = [len(u) for u in plan.units]
    assert counts[0] < min(counts[1:]), counts


def test_slices_plan_moves_no_partial_sums_and_swaps_lower_traffic():
    alg = resolve_algorithm("strassen^2")[0]
    sl = plan_products(alg, 16384, 16384, 16384, 4, "bfloat16", H100, strategy="slices")
    assert sl.partial_pieces == 0 and sl.slices == 4
    from lcmac.costmodel import distributed as cd
    dealt = cd._deal(alg.R, 1, 4, "products")
    pieces_of = {(r, 0): [(i, j, 0) for i, j in cd._support(alg.W, r)] for r in range(alg.R)}

    def traffic(ranks):
        touch = {}
        for p, us in enumerate(ranks):
            for u in us:
                for pc in pieces_of[u]:
                    touch.setdefault(pc, set()).add(p)
        return sum(len(t) - 1 for t in touch.values())
    swapped = cd._reduce_traffic([list(u) for u in dealt], pieces_of, 0.0, 1.0)
    assert traffic(swapped) < traffic(dealt)


def test_src_plan_sends_the_smaller_of_combined_and_raw():
    alg = resolve_algorithm("strassen")[0]
    plan = plan_products(alg, 4096, 4096, 4096, 7, "float32", H100, src=0, strategy="products",
                         slices=1)
    # one product per rank: a product's one combined block beats its two raw ones where it
    # combines two; a single-term product (Strassen's M3 = A11·(B12 − B22)) sends A11 raw
    for p, us in enumerate(plan.units):
        (r, _), = us
        a_terms = sum(alg.U[r, i, l] != 0 for i in range(2) for l in range(2))
        assert plan.send_combined[p][0] == (a_terms > 1)


def test_without_a_process_group_the_error_says_what_to_do():
    import lcmac.parallel.distributed as ld
    if dist.is_initialized():
        pytest.skip("a process group is initialised in this process")
    with pytest.raises(Exception, match="init_process_group"):
        ld.matmul(torch.ones(4, 4), torch.ones(4, 4))


def test_the_torchrun_example_runs_on_cpu_processes():
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                          "--master-port", str(_free_port()),
                          os.path.join(root, "examples", "distributed", "matmul_torchrun.py"),
                          "--size", "200", "--algo", "winograd", "--backend", "gloo"],
                         capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "winograd on 2 ranks" in run.stdout and "relative error" in run.stdout
