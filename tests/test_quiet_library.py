"""lcmac as a library is quiet: nothing on stderr (its messages go to the "lcmac" logger, which
has only a NullHandler; the ``lcmac`` command shows them), no ResourceWarning under ``-W
error``, and its warnings name the user's line, not one of lcmac's.  The test marked slow
compiles one tiny kernel (strassen float32 256x5x4) into an empty cache of its own."""
import ast
import io
import logging
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest

import lcmac
from lcmac.api import call_args, matmul as ops
from lcmac.artifact import cache, store
from lcmac.cli.library_log import library_log_on_stderr
from lcmac.core.errors import ArtifactError
from lcmac.policy import Plan
from lcmac.spec.shape_rules import JIT_ROWS
from lcmac.tune.tuner import Progress

PACKAGE = Path(lcmac.__file__).parent
#: the compile workers answer their parent on stdout: that is their protocol, not a message
WORKERS = {"targets/tvm_worker.py", "targets/tilelang_worker.py"}


def _quiet_run(code: str, *options: str, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *options, "-c", textwrap.dedent(code)],
                          capture_output=True, text=True, env=env, timeout=600)


def test_no_library_module_prints_or_writes_to_stderr():
    """Outside lcmac/cli no call of print() and no sys.stderr; sys.stdout only in the workers."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.startswith("cli/"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), rel)):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "print":
                found.append(f"{rel}:{node.lineno}: print()")
            if (isinstance(node, ast.Attribute) and getattr(node.value, "id", None) == "sys"
                    and node.attr in ("stderr", "__stderr__", "stdout", "__stdout__")
                    and not (rel in WORKERS and node.attr == "stdout")):
                found.append(f"{rel}:{node.lineno}: sys.{node.attr}")
            if isinstance(node, ast.Attribute) and node.attr in ("basicConfig", "StreamHandler"):
                found.append(f"{rel}:{node.lineno}: logging.{node.attr}")
    assert found == []


def test_the_lcmac_logger_is_silent_until_an_application_shows_it(capsys):
    logger = logging.getLogger("lcmac")
    assert any(isinstance(h, logging.NullHandler) for h in logger.handlers)
    assert not [h for h in logger.handlers if not isinstance(h, logging.NullHandler)]
    level = logger.level
    with library_log_on_stderr():           # what the lcmac command does around a command
        logging.getLogger("lcmac.artifact.store").info("lcmac cache: waiting for x")
    out, err = capsys.readouterr()
    assert (out, err) == ("", "lcmac cache: waiting for x\n")
    assert logger.level == level and not [h for h in logger.handlers
                                          if not isinstance(h, logging.NullHandler)]


def test_progress_goes_to_its_stream_or_else_to_the_log(caplog):
    stream = io.StringIO()
    bar = Progress.of(stream, 2)
    bar.update("one")
    assert "1/2" in stream.getvalue() and "one" in stream.getvalue()
    with caplog.at_level(logging.INFO, logger="lcmac.tune.tuner"):
        Progress.of(True, 3).update("built")
        Progress.of(False, 3).update("hidden")
    assert [r.name for r in caplog.records] == ["lcmac.tune.tuner"]
    assert "1/3" in caplog.records[0].getMessage() and "built" in caplog.records[0].getMessage()


def _damaged_store(tmp_path):
    """A store holding one entry whose file was altered since, its spec and check."""
    kernels = store.Store(tmp_path / "kernels")
    spec = store.Spec({"format": 1, "what": "test"})

    def build(jobs):
        for _, scratch in jobs:
            (scratch / "lib").write_text("good")
        return [{} for _ in jobs]

    def check(spec, entry, meta):
        if (entry / "lib").read_text() != "good":
            raise ArtifactError("its library was altered")
        return entry / "lib"
    kernels.obtain([spec], check, build)
    (kernels.root / spec.key / "lib").write_text("bad")
    return kernels, spec, check, build


def test_a_cache_warning_names_the_callers_line(tmp_path):
    kernels, spec, check, build = _damaged_store(tmp_path)
    with pytest.warns(store.CacheWarning, match="altered") as got:
        line = sys._getframe().f_lineno + 1
        [hit] = kernels.obtain([spec], check, build)
    assert hit.repaired and (got[0].filename, got[0].lineno) == (__file__, line)


def test_lcmac_matmul_reaching_a_damaged_cache_entry_warns_at_the_users_call(
        tmp_path, monkeypatch):
    """The whole path: lcmac.matmul → the loaded-kernel table (lcmac.api.call_args) → the
    kernel cache → the store; the warning names this file's line."""
    kernels, spec, check, build = _damaged_store(tmp_path)
    monkeypatch.setattr(cache, "_request", lambda *a: cache._Request(spec, "strassen", {}, ()))
    monkeypatch.setattr(cache, "_store", lambda root: kernels)
    monkeypatch.setattr(cache, "_check_entry", check)
    monkeypatch.setattr(cache, "_compile", lambda request: build)
    monkeypatch.setattr(call_args, "load", lambda manifest: (lambda a, b, out=None: np.matmul(a, b, out=out)))
    monkeypatch.setattr(ops, "_kernels", call_args.LoadedKernels())
    target = ops.target_for("cpu")
    monkeypatch.setattr(ops, "plan", lambda m, n, k, dtype="float32", **kw: Plan(
        (m, n, k), dtype, target, "strassen", "strassen", "strassen", 1.1, 2.0, "test"))
    A, B = np.ones((JIT_ROWS["cpu"][-1], 3)), np.ones((3, 2))
    with pytest.warns(store.CacheWarning, match="altered") as got:
        line = sys._getframe().f_lineno + 1
        C = lcmac.matmul(A, B)
    assert (C == 3).all() and (got[0].filename, got[0].lineno) == (__file__, line)


def test_cpu_paths_raise_no_resource_warning():
    """Target detection, host facts, a plan and a small product under -W error: an unclosed
    /proc/cpuinfo would print "Exception ignored … ResourceWarning" on stderr."""
    r = _quiet_run("""
        import numpy as np, lcmac
        from lcmac.bits import native_build
        from lcmac.spec import device
        from lcmac.spec.cpu import x86
        from lcmac.spec.targets import host_target
        host_target(); x86.host_flags(); device.cpu_identity()
        native_build.kernel_key("gf2", {})
        lcmac.plan(64, 48, 32)
        C = lcmac.matmul(np.ones((3, 7), np.float32), np.ones((7, 5), np.float32))
        assert (C == 7).all()
    """, "-W", "error")
    assert (r.returncode, r.stderr) == (0, "")


def test_a_compiling_matmul_and_optimize_write_nothing_to_stderr(tmp_path):
    env = {**os.environ, "LCMAC_CACHE_DIR": str(tmp_path / "cache")}
    r = _quiet_run("""
        import numpy as np, torch, lcmac
        A, B = np.ones((6, 4), np.float32), np.ones((4, 5), np.float32)
        # compiles 256x5x4, whose config the tuning log has notes on (logged, not printed)
        assert (lcmac.matmul(A, B, algo="strassen") == 4).all()
        model = torch.nn.Sequential(torch.nn.Linear(4, 5))
        x = torch.ones(6, 4)
        ref = model(x)
        report = lcmac.optimize(model, algo="strassen", min_size=4)
        with torch.no_grad():
            assert torch.allclose(model(x), ref, atol=1e-5)
        print(len(report.swapped))
    """, "-W", "error::ResourceWarning", env=env)
    assert (r.returncode, r.stderr) == (0, "") and r.stdout.strip() == "1"
    assert any((tmp_path / "cache").rglob("*.so"))          # it did compile here
