"""Without TileLang (a CPU-only install: it is the ``cuda`` extra) every command that would
compile for CUDA stops in one line naming ``pip install 'lcmac[cuda]'``, and leaves no
directory behind; nothing reports success for kernels it could not build."""
import sys

import pytest

from tests.cli.test_consistent_commands import run

CUDA = "cuda-sm90a"
INSTALL = "pip install 'lcmac[cuda]'"


@pytest.fixture
def no_tilelang(monkeypatch):
    """``import tilelang`` fails, as where it is not installed."""
    monkeypatch.setitem(sys.modules, "tilelang", None)


@pytest.mark.parametrize("argv", [
    ["build", "--algo", "gemm", "--shape", "256x256x256", "--dtype", "bf16", "-o"],
    ["build", "--algo", "strassen", "--dtype", "bf16", "-o"],                 # a bundle
    ["export", "256x256x256", "--dtype", "bf16", "-o"],
    ["tune", "--shape", "256x256x256", "--algo", "gemm", "--budget", "1", "--no-vendor", "-q",
     "--build-only"]])
def test_cuda_commands_name_the_extra_that_brings_tilelang(capsys, tmp_path, no_tilelang, argv):
    out = tmp_path / "out"
    code, stdout, err = run(capsys, *argv, str(out), "--target", CUDA)
    errors = [line for line in err.splitlines() if "error:" in line]
    assert code == 1 and not stdout and len(errors) == 1, err
    assert INSTALL in errors[0] and "Traceback" not in err
    assert not out.exists()
