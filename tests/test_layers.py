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
    assert len(report.arrows) <= check_layers.MAX_UPWARD_ARROWS


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
