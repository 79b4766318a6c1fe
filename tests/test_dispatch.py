"""lcmac.auto: the runtime's automatic choice (vendor GEMM, lcmac GEMM or an LCMA per shape)
from the tuning log, with artifacts from a directory; a chosen kernel without an artifact
falls back to the vendor GEMM and says so."""
import numpy as np
import pytest

import lcmac
from lcmac.spec.targets import host_target
from lcmac.core.errors import DTypeError, ShapeError
from lcmac.artifact import tuning_log as tdb

CPU = host_target().name       # its kernels run here
SHAPE = (96, 80, 64)          # M, N, K


def rec(shape, t, algo):
    name, h = tdb.algo_identity(algo)
    return tdb.make_record(target=CPU, dtype="float32", algorithm=name, algorithm_hash=h,
                           shape=shape, config={} if algo == "vendor" else {"mc": 16, "nc": 32, "nr": 32, "kc": 16},
                           time_s=t, spread=0.01, repeats=5, device="test")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("auto")
    logs, arts = root / "logs", root / "arts"
    db = tdb.TuningDB(logs)
    # SHAPE: Strassen measured fastest; (64,64,64): the vendor GEMM; (48,40,32): GEMM fastest
    db.append([rec(SHAPE, 3e-4, "gemm"), rec(SHAPE, 1e-4, "strassen"), rec(SHAPE, 2e-4, "vendor"),
               rec((64, 64, 64), 3e-4, "gemm"), rec((64, 64, 64), 4e-4, "strassen"),
               rec((64, 64, 64), 1e-4, "vendor"),
               rec((48, 40, 32), 1e-4, "gemm"), rec((48, 40, 32), 4e-4, "strassen"),
               rec((48, 40, 32), 3e-4, "vendor")])
    lcmac.build("strassen", CPU, "float32", SHAPE, config={"mc": 16, "nc": 32, "nr": 32, "kc": 16},
                out_dir=str(arts))
    return logs, arts


def _ab(M, N, K, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((M, K)).astype(np.float32),
            rng.standard_normal((K, N)).astype(np.float32))


def test_measured_lcma_runs_from_its_artifact(setup):
    logs, arts = setup
    mm = lcmac.auto(arts, target=CPU, logs=logs)
    p = mm.plan(*SHAPE)
    art = mm.artifact(p)
    assert p.runs == "strassen" and art is not None and art.parent == arts
    A, B = _ab(*SHAPE)
    C = mm(A, B)
    ref = A.astype(np.float64) @ B.astype(np.float64)
    assert np.abs(C - ref).max() < 1e-3 * np.abs(ref).max()
    out = np.empty_like(C)
    assert mm(A, B, out=out) is out and np.array_equal(out, C)


def test_vendor_when_measured_faster(setup):
    logs, arts = setup
    mm = lcmac.auto(arts, target=CPU, logs=logs)
    p = mm.plan(64, 64, 64)
    assert p.runs == "vendor" and mm.artifact(p) is None and "vendor" in p.why
    A, B = _ab(64, 64, 64)
    assert np.allclose(mm(A, B), A @ B)


def test_chosen_kernel_without_artifact_falls_back_and_says_why(setup):
    logs, arts = setup
    mm = lcmac.auto(arts, target=CPU, logs=logs)
    p = mm.plan(48, 40, 32)
    assert p.decision == "gemm"                    # the log's choice ...
    assert p.runs == "vendor" and "no artifact for gemm" in p.why   # ... not built: vendor
    A, B = _ab(48, 40, 32)
    assert np.allclose(mm(A, B), A @ B, atol=1e-5)
    # without the vendor option the decision stays with lcmac's kernels
    p2 = lcmac.auto(arts, target=CPU, logs=logs, vendor=False).plan(64, 64, 64)
    assert p2.decision != "vendor"


def test_bad_operands(setup):
    logs, arts = setup
    mm = lcmac.auto(arts, target=CPU, logs=logs)
    A, B = _ab(*SHAPE)
    with pytest.raises(ShapeError, match="inner dimensions"):
        mm(A, B[:-1])
    with pytest.raises(ShapeError, match="2-D"):
        mm(A[0], B)
    with pytest.raises(DTypeError, match="one dtype"):
        mm(A, B.astype(np.float64))


def test_build_without_a_directory_compiles_into_the_kernel_cache_once(setup, tmp_path,
                                                                       monkeypatch):
    from lcmac.artifact import build as build_mod
    logs, _ = setup
    monkeypatch.setenv("LCMAC_CACHE_DIR", str(tmp_path))
    first = lcmac.auto(target=CPU, logs=logs, build=True)
    p = first.plan(*SHAPE)
    art = first.artifact(p)                 # planned, then compiled: a step of its own
    assert p.runs == "strassen" and art.parent.parent == tmp_path / "kernels"

    def refuse(backend, request):
        raise AssertionError("compiled again: the kernel cache was not used")
    monkeypatch.setattr(build_mod, "run_worker", refuse)
    mm = lcmac.auto(target=CPU, logs=logs, build=True)      # another process, in effect
    assert mm.artifact(mm.plan(*SHAPE)) == art
    A, B = _ab(*SHAPE)
    ref = A.astype(np.float64) @ B.astype(np.float64)
    assert np.abs(mm(A, B) - ref).max() < 1e-3 * np.abs(ref).max()
    # no directory and no build: the vendor GEMM, saying why
    p2 = lcmac.auto(target=CPU, logs=logs).plan(*SHAPE)
    assert p2.runs == "vendor" and "no artifacts directory" in p2.why
