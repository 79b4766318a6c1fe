"""CPU+GPU co-execution (lcmac.api.coexec) without a GPU: the split models, the row split, the
split log, and the concurrent run and assembly with two host "devices" standing in for the
pair (a bundle through the C API with pools of 2 threads and 1; torch's and numpy's GEMM),
exact on integer-valued inputs."""
from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

from lcmac.artifact.split_log import append_split, make_split_record, measured_split
from lcmac.costmodel.coexec import host_cpu_rate, predict_split, side_times, split_rows

torch = pytest.importorskip("torch")


def test_worked_example_of_the_model():
    """The module doc's H100 example: bf16 8192³, inputs on the host, 2 TFLOP/s CPU, 25 GB/s."""
    p = predict_split(8192, 8192, 8192, 2, gpu_rate=700e12, cpu_rate=2e12, link_bw=25e9,
                      inputs="host")
    assert p.t_gpu_only == pytest.approx(3 * 8192 ** 2 * 2 / 25e9)
    assert p.cpu_fraction == pytest.approx(0.0287, abs=5e-4)
    assert p.t_split == pytest.approx(0.0158, abs=1e-4)
    tg, tc = side_times(p.cpu_fraction, 8192, 8192, 8192, 2, 700e12, 2e12, 25e9, "host")
    assert tg == pytest.approx(tc, rel=1e-6)                # the sides meet at the split
    # the same product with its inputs on the GPU: the CPU cannot even receive B in time
    assert predict_split(8192, 8192, 8192, 2, gpu_rate=700e12, cpu_rate=2e12, link_bw=25e9,
                         inputs="device").cpu_fraction == 0.0


def test_split_follows_the_rates_and_never_predicts_a_loss():
    # no link cost to speak of: the CPU's share is its share of the combined rate
    p = predict_split(4096, 4096, 4096, 4, gpu_rate=3e12, cpu_rate=1e12, link_bw=1e18,
                      inputs="device")
    assert p.cpu_fraction == pytest.approx(0.25, abs=1e-3) and p.speedup == pytest.approx(4 / 3, rel=1e-3)
    for f_rate in (1e9, 1e11, 1e12, 1e13):
        q = predict_split(4096, 4096, 4096, 4, gpu_rate=50e12, cpu_rate=f_rate, link_bw=25e9,
                          inputs="host")
        assert q.t_split <= q.t_gpu_only
        assert q.cpu_fraction == 0.0 or q.speedup >= 1.01
    with pytest.raises(ValueError, match="cpu_rate"):
        predict_split(64, 64, 64, 4, gpu_rate=1.0, cpu_rate=0.0, link_bw=1.0)


def test_split_from_measured_sides():
    from lcmac.costmodel.coexec import predict_split_measured
    # GPU alone 10 ms, all of it divisible; the CPU 30 ms for the whole: a quarter each way
    p = predict_split_measured(4096, 10e-3, 0.0, 0.0, 30e-3 / 4096)
    assert p.cpu_fraction == pytest.approx(0.25) and p.t_split == pytest.approx(7.5e-3)
    # a fixed cost on the CPU side moves the split down; one above T0 leaves the GPU alone
    assert 0 < predict_split_measured(4096, 10e-3, 0.0, 2e-3, 30e-3 / 4096).cpu_fraction < 0.25
    assert predict_split_measured(4096, 10e-3, 0.0, 11e-3, 1e-9).cpu_fraction == 0.0
    # B's copy (g) cannot be split away: the gain shrinks with it
    q = predict_split_measured(4096, 10e-3, 6e-3, 0.0, 30e-3 / 4096)
    assert q.t_split > p.t_split and q.t_split < 10e-3


def test_split_rows_and_the_host_prior():
    assert split_rows(1000, 0.0) == 1000 and split_rows(1000, 1.0) == 0
    assert split_rows(4096, 0.25) == 3072 and split_rows(4096, 0.005) == 4096   # 20 rows: none
    assert (4096 - split_rows(4096, 0.1)) % 64 == 0
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        split_rows(64, 1.5)
    base = host_cpu_rate("float32", 16, {"avx512f"})
    assert host_cpu_rate("float64", 16, {"avx512f"}) == base / 2
    assert host_cpu_rate("bfloat16", 16, {"avx512f", "amx_bf16"}) == 8 * base
    assert host_cpu_rate("float32", 16, {"avx2"}) == base / 2


def _int_inputs(M, N, K, seed=0):
    rng = np.random.default_rng(seed)
    A = torch.from_numpy(rng.integers(-8, 8, (M, K)).astype(np.float64))
    B = torch.from_numpy(rng.integers(-8, 8, (K, N)).astype(np.float64))
    return A, B


def _torch_side(a, b, out=None):
    return torch.matmul(a, b, out=out)


def _numpy_side(a, b, out=None):
    c = torch.from_numpy(np.matmul(a.numpy(), b.numpy()))
    if out is None:
        return c
    out.copy_(c)
    return out


@pytest.mark.parametrize("gpu_rows", [0, 64, 100, 333])
def test_two_host_devices_assemble_the_exact_product(gpu_rows):
    from lcmac.api.coexec import run_split
    A, B = _int_inputs(333, 70, 45)
    want = A @ B                                           # integers: every order is exact
    C = run_split(A, B, gpu_rows, torch.device("cpu"), gpu_matmul=_torch_side,
                  cpu_matmul=_numpy_side)
    assert torch.equal(C, want)
    out = torch.full_like(want, float("nan"))
    assert run_split(A, B, gpu_rows, torch.device("cpu"), gpu_matmul=_numpy_side,
                     cpu_matmul=_torch_side, out=out) is out
    assert torch.equal(out, want)


def test_a_failing_side_raises_and_bad_output_is_refused():
    from lcmac.api.coexec import run_split
    from lcmac.core.errors import ShapeError
    A, B = _int_inputs(128, 16, 8)

    def broken(a, b, out=None):
        raise RuntimeError("the CPU side failed")
    with pytest.raises(RuntimeError, match="CPU side failed"):
        run_split(A, B, 64, torch.device("cpu"), gpu_matmul=_torch_side, cpu_matmul=broken)
    with pytest.raises(ShapeError, match="contiguous 128x16"):
        run_split(A, B, 64, torch.device("cpu"), gpu_matmul=_torch_side, cpu_matmul=_torch_side,
                  out=torch.empty(16, 128, dtype=A.dtype))
    with pytest.raises(ShapeError, match=r"\[0, 128\]"):
        run_split(A, B, 200, torch.device("cpu"), gpu_matmul=_torch_side, cpu_matmul=_torch_side)


def test_split_log_round_trip_and_a_bad_line(tmp_path):
    rec = make_split_record(target="cuda-sm90a", dtype="bfloat16", shape=(8192, 8192, 8192),
                            inputs="host", gpu_mode="bf16", cpu_fraction=0.03, time_s=0.0158,
                            gpu_only_s=0.0161, device="test")
    path = append_split(rec, tmp_path)
    with open(path, "a") as f:
        f.write("{not json\n")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        got = measured_split("cuda-sm90a", "bfloat16", (8192, 8192, 8192), "host", "bf16", tmp_path)
    assert got["cpu_fraction"] == 0.03 and any("not an lcmac-split/1" in str(x.message) for x in w)
    assert measured_split("cuda-sm90a", "bfloat16", (8192, 8192, 8192), "device", "bf16",
                          tmp_path) is None
    assert json.loads(path.read_text().splitlines()[0])["schema"] == "lcmac-split/1"
    with pytest.raises(ValueError, match="cpu_fraction"):
        make_split_record(target="t", dtype="d", shape=(1, 1, 1), inputs="host", gpu_mode="bf16",
                          cpu_fraction=2.0, time_s=1.0)


def test_choose_split_runs_the_gpu_alone_until_a_split_is_measured(tmp_path, monkeypatch):
    from lcmac.artifact.build import resolve_target
    from lcmac.policy.split import choose_split
    from lcmac.core.errors import LcmacError
    monkeypatch.setenv("LCMAC_TUNING_LOGS", str(tmp_path))
    t = resolve_target("cuda-sm90a")
    c = choose_split(4096, 4096, 4096, "float64", "fp64", "host", t)
    assert c.source == "unmeasured" and c.cpu_fraction == 0.0 and "profile" in c.why
    append_split(make_split_record(target=t.name, dtype="float64", shape=(4096, 4096, 4096),
                                   inputs="host", gpu_mode="fp64", cpu_fraction=0.125,
                                   time_s=0.01, gpu_only_s=0.012))
    c = choose_split(4096, 4096, 4096, "float64", "fp64", "host", t)
    assert c.source == "measured" and c.cpu_fraction == 0.125
    assert choose_split(64, 64, 64, "float64", "fp64", "host", t, split=0.5).source == "asked"
    with pytest.raises(LcmacError, match="share of rows"):
        choose_split(64, 64, 64, "float64", "fp64", "host", t, split=1.5)


def test_matmul_devices_errors_name_the_problem():
    import lcmac
    from lcmac.core.errors import LcmacError, TargetError
    A, B = _int_inputs(64, 32, 16)
    with pytest.raises(LcmacError, match="torch tensors"):
        lcmac.matmul(A.numpy(), B.numpy(), devices=("cuda", "cpu"))
    with pytest.raises(TargetError, match="one GPU and the CPU"):
        lcmac.matmul(A, B, devices=("cpu",))
    if not torch.cuda.is_available():
        with pytest.raises(TargetError, match="no CUDA device"):
            lcmac.matmul(A, B, devices=("cuda", "cpu"))


def test_two_thread_pools_stand_in_for_the_pair(tmp_path):
    """The split run on two host "devices" of different thread counts: one rows bundle opened
    twice through the C API, with a pool of 2 threads and of 1; integer-valued float32, so
    every cut gives the exact product."""
    import ctypes
    import shutil
    import subprocess

    from lcmac.artifact.bundle import build_bundle
    from lcmac.api.coexec import run_split
    from lcmac.runtime import c_include_dir, c_source
    if shutil.which("gcc") is None:
        pytest.skip("gcc not installed")
    bundle = build_bundle("strassen", None, "float32", ["?x48x40"], out_dir=tmp_path / "b",
                          rows=(64, 16)).parent
    so = tmp_path / "liblcmac_capi.so"
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-I", c_include_dir(), "-o", str(so),
                    c_source(), "-ldl", "-lpthread"], check=True)
    lib = ctypes.CDLL(str(so), mode=ctypes.RTLD_GLOBAL)   # artifacts resolve its error hook
    vp, i64 = ctypes.c_void_p, ctypes.c_int64
    lib.lcmac_open_bundle.restype = vp
    lib.lcmac_open_bundle.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.POINTER(ctypes.c_int),
                                      ctypes.c_char_p, ctypes.c_size_t]
    lib.lcmac_bundle_matmul.argtypes = [vp, vp, vp, vp, i64, i64, i64, ctypes.c_int]
    lib.lcmac_bundle_num_threads.argtypes = [vp]
    lib.lcmac_bundle_last_error.restype = ctypes.c_char_p
    lib.lcmac_bundle_last_error.argtypes = [vp]
    lib.lcmac_bundle_close.argtypes = [vp]

    def device(threads):
        err, st = ctypes.create_string_buffer(1024), ctypes.c_int()
        h = lib.lcmac_open_bundle(str(bundle).encode(), threads, ctypes.byref(st), err, len(err))
        assert h, err.value
        assert lib.lcmac_bundle_num_threads(h) == threads

        def mm(a, b, out=None):
            c = torch.empty(a.shape[0], b.shape[1]) if out is None else out
            rc = lib.lcmac_bundle_matmul(h, a.data_ptr(), b.data_ptr(), c.data_ptr(), a.shape[0],
                                         b.shape[1], a.shape[1], 0)
            assert rc == 0, lib.lcmac_bundle_last_error(h)
            return c
        return h, mm

    (h2, two), (h1, one) = device(2), device(1)
    try:
        rng = np.random.default_rng(3)
        A = torch.from_numpy(rng.integers(-4, 5, (300, 40)).astype(np.float32))
        B = torch.from_numpy(rng.integers(-4, 5, (40, 48)).astype(np.float32))
        want = (A.double() @ B.double()).float()
        for gpu_rows in (0, 64, 150, 236, 300):
            C = run_split(A, B, gpu_rows, torch.device("cpu"), gpu_matmul=two, cpu_matmul=one)
            assert torch.equal(C, want), gpu_rows
    finally:
        lib.lcmac_bundle_close(h2)
        lib.lcmac_bundle_close(h1)
