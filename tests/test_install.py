"""lcmac as a user installs it: a wheel built from this repository, installed in a fresh virtual
environment, decides with the tuning logs it ships (package data), on a CPU with no TileLang;
a CUDA build without TileLang names the extra that brings it."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

import lcmac
from lcmac.artifact.tuning_log import shipped_dir
from lcmac.core.errors import ToolchainError

ROOT = Path(__file__).resolve().parents[1]
SHAPE = (4096, 4096, 4096)           # logged in the shipped x86_64-avx512 float32 log
CPU = "x86_64-avx512"
#: the machine that log was measured on: decisions read only the records of the device they
#: decide for, so the probe names it (on any other CPU those records are not used)
LOGGED_ON = "Intel(R) Xeon(R) Processor (2 cpus)"

#: run by the virtual environment's python, isolated (-I), from a directory outside the checkout
PROBE = textwrap.dedent("""
    import json, sys
    sys.modules["tilelang"] = None            # a CPU-only install: no CUDA compiler to import
    import lcmac
    from lcmac.artifact import tuning_log
    empty, out_dir = sys.argv[1:3]
    out = {"lcmac": lcmac.__file__, "shipped": str(tuning_log.shipped_dir()),
           "logs": sorted(f.name for f in tuning_log.TuningDB().files()),
           "why": lcmac.ops.plan(*__SHAPE__, target=__CPU__).why,
           "why_without_logs": lcmac.auto(target=__CPU__, logs=empty).plan(*__SHAPE__).why}
    try:
        lcmac.build("gemm", "cuda-sm90a", "bfloat16", (256, 256, 256), out_dir=out_dir)
        out["cuda"] = "built"
    except Exception as e:
        out["cuda"] = f"{type(e).__name__}: {e}"
    print(json.dumps(out))
""").replace("__SHAPE__", repr(SHAPE)).replace("__CPU__", repr(CPU))


def _run(cmd, **kw) -> subprocess.CompletedProcess:
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kw)
    assert p.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}"
    return p


def _source_copy(dest: Path) -> Path:
    """The files a wheel is built from, copied so the build writes nothing into the checkout."""
    dest.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, dest / name)
    shutil.copytree(ROOT / "lcmac", dest / "lcmac",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.so"))
    return dest


def test_an_installed_wheel_decides_with_the_shipped_logs(tmp_path):
    wheels = tmp_path / "wheels"
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
          "-w", str(wheels), str(_source_copy(tmp_path / "src"))])
    wheel = next(wheels.glob("lcmac-*.whl"))
    # every shipped log is in the wheel
    shipped = {p.relative_to(ROOT).as_posix() for p in shipped_dir().rglob("*") if p.is_file()}
    assert shipped and shipped <= set(zipfile.ZipFile(wheel).namelist())

    # numpy and apache-tvm come from the machine; lcmac only from the wheel
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)])
    py = venv / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "LCMAC_"))}
    env["LCMAC_CACHE_DIR"] = str(tmp_path / "cache")          # the user's own logs: none yet
    env["LCMAC_DEVICE"] = LOGGED_ON
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    _run([py, "-m", "pip", "install", "--no-deps", "--no-index", "--ignore-installed", "-q",
          str(wheel)], env=env)

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "empty").mkdir()
    p = _run([py, "-I", "-c", PROBE, str(tmp_path / "empty"), str(tmp_path / "cuda-out")],
             env=env, cwd=elsewhere)
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert Path(got["lcmac"]).is_relative_to(venv), got["lcmac"]
    assert Path(got["shipped"]).is_relative_to(venv) and f"{CPU}-float32.jsonl" in got["logs"]
    assert "measured" in got["why"] and "model only" not in got["why"], got["why"]
    assert "model only" in got["why_without_logs"], got["why_without_logs"]
    assert "ToolchainError" in got["cuda"] and "lcmac[cuda]" in got["cuda"], got["cuda"]


def test_a_cuda_build_without_tilelang_names_the_extra(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "tilelang", None)       # not installed
    with pytest.raises(ToolchainError, match=r"TileLang.*pip install 'lcmac\[cuda\]'"):
        lcmac.build("gemm", "cuda-sm90a", "bfloat16", (256, 256, 256), out_dir=str(tmp_path))
