"""float32 precision never changes behind the user's back: torch's class for torch tensors,
``precision=`` (default "highest") for numpy arrays, the vendor GEMM run in torch's own class,
CUDA plans under "highest" with no TF32 kernel and no TF32 vendor record, the tuner's vendor
baseline recording the class it ran.  Nothing is compiled and no GPU is needed: CUDA targets
are planned, never run."""
import json
import math

import numpy as np
import pytest
import torch

from lcmac.api import call_args, matmul as ops
from lcmac.artifact import tuning_log
from lcmac.cli import precision as cli_precision
from lcmac.cli.main import build_parser
from lcmac.core.errors import LcmacError
from lcmac.policy import planner
from lcmac.policy.measured import same_precision
from lcmac.runtime import vendor
from lcmac.spec.precision import (
    PRECISIONS, allows_tf32, operand_modes, torch_precision, torch_precision_set)
from lcmac.spec.targets import get_target
from lcmac.tune import measure

CUDA = "cuda-sm90a"
NO_BUDGET = math.inf          # these plans are about precision: no error simulations


@pytest.fixture
def torch_class():
    """Sets torch's float32 matmul precision for a test and restores it after."""
    before = torch.get_float32_matmul_precision()
    yield torch.set_float32_matmul_precision
    torch.set_float32_matmul_precision(before)


@pytest.mark.parametrize("cls", PRECISIONS)
def test_torch_setting_is_the_class_of_torch_tensors(torch_class, cls):
    torch_class(cls)
    assert torch_precision("cuda") == torch_precision("cpu") == cls
    x = torch.zeros(2, 2)
    assert call_args.float32_precision(x, "float32") == cls
    assert call_args.float32_precision(x, "float32", cls) == cls       # a pin that matches
    other = next(p for p in PRECISIONS if p != cls)
    with pytest.raises(LcmacError, match="set_float32_matmul_precision"):
        call_args.float32_precision(x, "float32", other)                # never run another
    modes = operand_modes(CUDA, "float32", cls)
    assert ("native" in modes) == allows_tf32(cls) == (cls != "highest")
    assert "fp16x2" in modes                                            # FP32-accurate: always
    assert operand_modes("x86_64-avx512", "float32", cls) == ("native",)   # CPUs: float32


def test_torch_per_backend_setting_is_read_too(torch_class):
    torch_class("highest")
    torch.backends.cuda.matmul.fp32_precision = "tf32"      # the per-backend API
    with pytest.raises(RuntimeError):
        torch.get_float32_matmul_precision()                # torch no longer sums it up
    assert torch_precision("cuda") == "high" and torch_precision("cpu") == "highest"


def test_numpy_float32_means_float32_unless_asked():
    a = np.zeros((2, 2), np.float32)
    assert call_args.float32_precision(a, "float32") == "highest"
    assert call_args.float32_precision(a, "float32", "high") == "high"
    assert call_args.float32_precision(a, "bfloat16", "high") is None    # float32 only
    with pytest.raises(ValueError, match="precision must be one of"):
        call_args.float32_precision(a, "float32", "tf32")


class _CudaFloat32:
    """Stands in for a CUDA float32 tensor where the vendor GEMM looks at one."""
    __module__ = "torch.stand_in"
    is_cuda = True
    dtype = torch.float32


def test_vendor_matmul_never_touches_torch_precision(torch_class, monkeypatch):
    torch_class("highest")
    seen = []
    monkeypatch.setattr(torch, "matmul", lambda a, b, out=None: seen.append(
        (torch.backends.cuda.matmul.allow_tf32, torch_precision("cuda"))) or "C")
    A = _CudaFloat32()
    assert vendor.vendor_matmul(A, A) == "C"
    assert seen == [(False, "highest")]        # SGEMM, as the user's setting says
    torch_class("high")
    vendor.vendor_matmul(A, A)
    assert seen[-1] == (True, "high") and torch_precision("cuda") == "high"


@pytest.mark.parametrize("operands, tf32", [("native", True), ("fp16x2", False)])
def test_tuner_vendor_baseline_records_the_class_it_ran(torch_class, monkeypatch, operands, tf32):
    torch_class("medium")
    ran = []
    monkeypatch.setattr(measure, "_measure_gpu", lambda *a, **k: ran.append(
        torch.backends.cuda.matmul.allow_tf32) or {"status": "ok"})
    out = measure.measure_vendor(CUDA, "float32", (64, 64, 64), operands=operands)
    assert ran == [tf32] and out["config"]["tf32"] is tf32
    assert torch.get_float32_matmul_precision() == "medium"             # restored


def test_precision_set_restores_on_error(torch_class):
    torch_class("high")
    with pytest.raises(KeyError), torch_precision_set("highest"):
        assert torch_precision() == "highest"
        raise KeyError("inside")
    assert torch_precision() == "high"


def _cuda_float32_records():
    return list(tuning_log.TuningDB().records(CUDA, "float32"))


def test_highest_plans_never_pick_tf32_kernels_nor_tf32_vendor_records(monkeypatch):
    monkeypatch.setattr(planner, "_plans", {})
    vendor = [r for r in _cuda_float32_records() if r["algorithm"] == "vendor"]
    tf32 = {r["time_s"] for r in vendor if r["config"].get("tf32")}
    sgemm = {r["time_s"] for r in vendor if r["config"].get("tf32") is False}
    assert tf32 and sgemm                        # the shipped log holds both kinds
    at_sgemm = {tuple(r["shape"]) for r in vendor if r["config"].get("tf32") is False}
    tf32_only = {tuple(r["shape"]) for r in vendor} - at_sgemm
    exact = 0
    for shape in sorted(at_sgemm) + sorted(tf32_only)[:1]:
        best = planner.plan(*shape, "float32", CUDA, precision="highest", max_error=NO_BUDGET,
                            kernels=planner.EveryKernel())
        assert best.operands == "fp16x2" and best.precision == "highest" and "no TF32" in best.why
        assert best.measurements.get("vendor") not in tf32
        if shape in at_sgemm and best.source == "exact":     # compared with SGEMM measured here
            exact += 1
            assert best.measurements["vendor"] in sgemm
        high = planner.plan(*shape, "float32", CUDA, precision="high", max_error=NO_BUDGET,
                            kernels=planner.EveryKernel())
        assert high.operands == "native" and high.measurements.get("vendor") not in sgemm
        if high.source == "exact":
            assert high.measurements["vendor"] in tf32
    # with a GPU at hand only its own device's records decide, which may be none of these
    assert exact or torch.cuda.is_available()
    forced = planner.plan(16384, 16384, 16384, "float32", CUDA, algo="strassen",
                          precision="highest", max_error=NO_BUDGET)
    assert forced.runs == "strassen" and forced.operands == "fp16x2"


def test_a_tf32_vendor_record_is_not_sgemm():
    tf32 = {"algorithm": "vendor", "config": {"library": "cublas", "tf32": True}}
    sgemm = {"algorithm": "vendor", "config": {"library": "cublas", "tf32": False,
                                               "operands": "fp16x2"}}
    assert same_precision(tf32, "native", "high")
    assert not same_precision(tf32, "native", "highest")
    assert same_precision(sgemm, "fp16x2", "highest")
    assert not same_precision(sgemm, "native", "high")
    assert not same_precision(sgemm, "fp16x2", "high")      # SGEMM is not what "high" runs
    kernel = {"algorithm": "strassen", "config": {"operands": "fp16x2"}}
    assert same_precision(kernel, "fp16x2", "highest")
    assert not same_precision(kernel, "native", "high")


def test_matmul_plans_cuda_float32_in_torchs_class(torch_class, monkeypatch):
    monkeypatch.setattr(planner, "_plans", {})
    shape = (16384, 16384, 16384)
    torch_class("highest")
    keys = ops.kernel_keys(*shape, algo="strassen", target=CUDA, max_error=NO_BUDGET)
    assert keys and all(k[-1] == "fp16x2" for k in keys)
    torch_class("high")                                   # the same call, another class
    assert ops.plan(*shape, algo="strassen", target=CUDA, max_error=NO_BUDGET).operands == "native"
    assert ops.kernel_keys(*shape, algo="strassen", target=CUDA, max_error=NO_BUDGET)[0] == \
        ("strassen", CUDA, "float32", keys[0][3])
    asked = []

    class Loaded:
        def get(self, key, build_args, build_kwargs=None):
            asked.append((key, build_kwargs))
    monkeypatch.setattr(ops, "_kernels", Loaded())
    ops.kernel(*keys[0])
    ops.kernel(*keys[0][:4])
    (fp16x2, kw), (native, kw_native) = asked
    assert fp16x2 != native and kw == {"config": {"operands": "fp16x2"}} and kw_native is None


def test_cli_precision_chooses_the_cuda_operands():
    parse = build_parser().parse_args
    cuda = get_target(CUDA)
    args = parse(["build", "--algo", "strassen", "--target", CUDA, "--shape", "4096x4096x4096"])
    assert cli_precision.build_config(cuda, args) == {"operands": "fp16x2"}
    args = parse(["build", "--algo", "strassen", "--target", CUDA, "--precision", "high"])
    assert cli_precision.build_config(cuda, args) == {"operands": "native"}
    args = parse(["build", "--algo", "strassen", "--target", CUDA, "--config",
                  json.dumps({"operands": "native"})])
    with pytest.raises(LcmacError, match="TF32.*precision 'high' or 'medium'"):
        cli_precision.build_config(cuda, args)
    args = parse(["build", "--algo", "gemm", "--target", CUDA, "--config", '{"tf32_wgmma": true}'])
    with pytest.raises(LcmacError, match="TF32"):
        cli_precision.build_config(cuda, args)
    args = parse(["build", "--algo", "strassen", "--target", CUDA, "--dtype", "bf16"])
    assert cli_precision.build_config(cuda, args) is None                 # float32 only
    args = parse(["build", "--algo", "strassen", "--target", "x86_64-avx512"])
    assert cli_precision.build_config(get_target("x86_64-avx512"), args) is None


def test_cli_select_prices_cuda_float32_in_its_class(capsys):
    from lcmac.cli.main import main
    base = ["select", "--shape", "4096x4096x4096", "--target", CUDA, "--json", "--top", "1",
            "--no-error", "--max-error", "inf"]
    for extra, operands in (([], "fp16x2"), (["--precision", "high"], "native")):
        assert main(base + extra) == 0
        doc = json.loads(capsys.readouterr().out)
        assert doc["operands"] == operands and doc["precision"] == (extra[1:] or ["highest"])[0]
        assert doc["max_error"] is None
