"""The structure checker (scripts/check_layers.py) passes on lcmac and catches what it is for."""
import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("check_layers", REPO / "scripts" / "check_layers.py")
check_layers = importlib.util.module_from_spec(_spec)
sys.modules["check_layers"] = check_layers     # dataclasses look their module up
_spec.loader.exec_module(check_layers)


def test_lcmac_layers_point_down_without_circles():
    report = check_layers.check(REPO / "lcmac", (REPO / "scripts", REPO / "tests"))
    assert report.problems == [], "\n".join(report.problems)
    assert report.arrows == {}                     # no upward import is allowed


def _write(root: Path, rel: str, text: str) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)


def test_checker_finds_circles_upward_imports_backends_and_size(tmp_path):
    pkg = tmp_path / "lcmac"
    for d in ("", "ir/", "tune/", "schedules/", "targets/"):
        _write(pkg, d + "__init__.py", "")
    # a circle through a function-level import only
    _write(pkg, "ir/a.py", "from . import b\n")
    _write(pkg, "ir/b.py", "def f():\n    from .a import x\n")
    # ir (low) importing tune (high)
    _write(pkg, "ir/c.py", "def g():\n    from ..tune import space\n")
    _write(pkg, "tune/space.py", "")
    # a compiler imported outside the workers and templates
    _write(pkg, "targets/host.py", "def h():\n    import tilelang\n")
    _write(pkg, "targets/tvm_worker.py", "import tvm\n")               # allowed
    _write(pkg, "schedules/big.py", "x = 1\n" * 801)
    body = "\n".join(f"    y{i} = {i}" for i in range(101))
    _write(pkg, "schedules/long.py", f"def long():\n{body}\n")
    report = check_layers.check(pkg)
    text = "\n".join(report.problems)
    assert "import circle: lcmac.ir.a ↔ lcmac.ir.b" in text
    assert "ir imports lcmac.tune.space (tune), a higher layer" in text
    assert "targets/host.py:2: imports the tilelang backend" in text
    assert "tvm_worker" not in text
    assert "schedules/big.py: 801 lines" in text
    assert "function long is 102 lines" in text


def test_checker_reports_every_upward_import(tmp_path):
    """No allowance: an upward import between any two layers is a problem, at the top of a
    module or inside a function."""
    pkg = tmp_path / "lcmac"
    for d in ("", "core/", "spec/", "costmodel/", "schedules/", "targets/", "cli/"):
        _write(pkg, d + "__init__.py", "")
    _write(pkg, "core/errors.py", "def f():\n    from lcmac.cli import main\n")
    _write(pkg, "cli/main.py", "")
    _write(pkg, "spec/profiles.py", "from lcmac.targets import table\n")
    _write(pkg, "targets/table.py", "")
    _write(pkg, "costmodel/decision.py", "from lcmac.schedules import config\n")
    _write(pkg, "schedules/config.py", "from lcmac.spec import profiles\nfrom lcmac.core import errors\n")
    report = check_layers.check(pkg)
    text = "\n".join(report.problems)
    assert "core/errors.py:2: core imports lcmac.cli.main (cli), a higher layer" in text
    assert "spec/profiles.py:1: spec imports lcmac.targets.table (targets), a higher layer" in text
    assert "costmodel/decision.py:1: costmodel imports lcmac.schedules.config (schedules)" in text
    assert "schedules/config.py" not in text                         # downward imports are fine
    assert set(report.arrows) == {("core", "cli"), ("spec", "targets"), ("costmodel", "schedules")}
    assert len(report.problems) == 3


def test_checker_reports_a_module_in_no_layer(tmp_path):
    pkg = tmp_path / "lcmac"
    for d in ("", "core/", "misc/"):
        _write(pkg, d + "__init__.py", "")
    _write(pkg, "__main__.py", "from lcmac.core import errors\n")     # the package's own: a layer
    _write(pkg, "core/errors.py", "")
    _write(pkg, "helpers.py", "")                                    # beside the packages
    _write(pkg, "misc/tool.py", "")                                  # a folder that is no layer
    text = "\n".join(check_layers.check(pkg).problems)
    assert "lcmac/helpers.py: module lcmac.helpers is in no layer" in text
    assert "lcmac/misc/tool.py: module lcmac.misc.tool is in no layer" in text
    assert "lcmac/misc/__init__.py: module lcmac.misc is in no layer" in text
    assert "__main__" not in text and "core/" not in text


def test_a_package_reexporting_its_modules_is_no_circle(tmp_path):
    """The edge from a package's __init__ to a module inside it is not part of a circle; a
    circle among the modules themselves still is."""
    pkg = tmp_path / "lcmac"
    for d in ("", "spec/"):
        _write(pkg, d + "__init__.py", "")
    _write(pkg, "spec/cuda/__init__.py", "from lcmac.spec.cuda.config import CudaConfig\n")
    _write(pkg, "spec/cuda/config.py", "from lcmac.spec.cuda import support\n")
    _write(pkg, "spec/cuda/support.py", "def why():\n    import lcmac.spec.cuda\n")
    _write(pkg, "spec/host.py", "from lcmac.spec import targets\n")
    _write(pkg, "spec/targets.py", "def f():\n    from lcmac.spec.host import x\n")
    text = "\n".join(check_layers.check(pkg).problems)
    assert "lcmac.spec.cuda" not in text
    assert "import circle: lcmac.spec.host ↔ lcmac.spec.targets" in text
