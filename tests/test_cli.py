"""The lcmac command end to end: people's tables, tools' JSON, errors that say what to fix."""
import json
import subprocess
import sys

import pytest

from lcmac.cli.main import main
from lcmac.ir import get


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_list_table_and_json(capsys):
    code, out, _ = run(capsys, "list")
    assert code == 0 and "strassen" in out and "winograd" in out
    code, out, _ = run(capsys, "list", "--json")
    doc = json.loads(out)
    assert doc["schema"] == "lcmac-list/1"
    rows = {r["name"]: r for r in doc["algorithms"]}
    w = rows["winograd"]
    assert w["grid"] == [2, 2, 2] and w["rank"] == 7
    assert w["additions"]["naive"]["total"] == 24
    assert w["additions"]["reduced"]["total"] == 15
    assert set(w) >= {"name", "grid", "rank", "naive_rank", "saving", "nnz", "additions",
                      "hash", "source"}


def test_list_grid_filter(capsys):
    code, out, _ = run(capsys, "list", "--json", "--grid", "2x2x3")
    names = [r["name"] for r in json.loads(out)["algorithms"]]
    assert "hopcroft-kerr" in names and "strassen" not in names


def test_show_prints_programs(capsys):
    code, out, _ = run(capsys, "show", "winograd")
    assert code == 0 and "# Combine H: 7 additions" in out and "C22 =" in out
    code, out, _ = run(capsys, "show", "strassen^2", "--json")
    doc = json.loads(out)
    assert doc["algorithm"]["rank"] == 49 and set(doc["programs"]) == {"A", "B", "H"}
    # the accuracy model's prediction for Algorithm 1 (H100, measured: 7.04x cuBLAS's in bf16)
    assert set(doc["predicted_error_ratio"]) == {"bfloat16", "float16", "tfloat32", "fp8", "fp16x2"}
    assert 3.5 < doc["predicted_error_ratio"]["fp8"] < 4.5          # against the fp8 GEMM
    assert 6.5 < doc["predicted_error_ratio"]["bfloat16"] < 7.5
    assert "error:  bfloat16" in run(capsys, "show", "winograd")[1]


def test_verify_name_and_files(capsys, tmp_path):
    code, out, _ = run(capsys, "verify", "strassen")
    assert code == 0 and out.startswith("OK")
    good = tmp_path / "good.json"
    good.write_text(json.dumps(get("winograd").to_dict()))
    code, out, _ = run(capsys, "verify", str(good))
    assert code == 0 and "OK" in out
    d = get("strassen").to_dict()
    d["W"][3][1][0] = 0                 # M4 no longer feeds C21
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(d))
    code, out, _ = run(capsys, "verify", str(bad), "--json")
    doc = json.loads(out)
    assert code == 1 and not doc["ok"]
    assert "in C[1][0]" in doc["results"][0]["failures"][0]
    assert doc["results"][0]["ring"] == "rationals"
    code, out, _ = run(capsys, "verify", "at-4x4x4-r47-gf2", "--json")    # valid only mod 2
    doc = json.loads(out)
    assert code == 0 and doc["ok"] and doc["results"][0]["ring"] == "gf2"


def test_errors_are_one_clear_line(capsys, tmp_path):
    code, _, err = run(capsys, "show", "nope")
    assert code == 2 and "unknown algorithm 'nope'" in err
    garbage = tmp_path / "garbage.json"
    garbage.write_text("{not json")
    code, _, err = run(capsys, "verify", str(garbage))      # a file that fails: 1, not usage's 2
    assert code == 1 and "garbage.json" in err
    with pytest.raises(SystemExit):
        main(["select", "--shape", "12x0x3", "--target", "x86_64-avx512"])
    assert "MxNxK" in capsys.readouterr().err


def test_select_table_and_json(capsys):
    code, out, _ = run(capsys, "select", "--shape", "16384x16384x16384", "--target",
                       "cuda-sm90a", "--dtype", "bf16", "--json", "--top", "5", "--max-error", "inf")
    doc = json.loads(out)
    assert code == 0 and doc["schema"] == "lcmac-select/1"
    assert len(doc["candidates"]) == 5
    times = [c["predicted_time_s"] for c in doc["candidates"]]
    assert times == sorted(times)
    assert doc["decision"] == doc["candidates"][0]
    code, out, _ = run(capsys, "select", "--shape", "64x64x64", "--target", "x86_64-avx512")
    assert code == 0 and "decision: gemm" in out
    code, _, err = run(capsys, "select", "--shape", "64x64x64", "--target", "tpu")
    assert code == 2 and "unknown target 'tpu'" in err


def test_select_shows_the_predicted_error_by_default(capsys):
    # a user sees each LCMA's error beside its speed-up (dps-4x4x4-r48: ~7x bf16 GEMM's),
    # over the default budget too where it is lifted
    code, out, _ = run(capsys, "select", "--shape", "16384x16384x16384", "--target",
                       "cuda-sm90a", "--dtype", "bf16", "--top", "3", "--max-error", "inf")
    assert code == 0 and "error×" in out.splitlines()[2]
    rows = {ln.split()[0]: ln.split() for ln in out.splitlines()[4:7]}
    assert 6.5 < float(rows["dps-4x4x4-r48"][-1]) < 7.5
    code, out, _ = run(capsys, "select", "--shape", "16384x16384x16384", "--target",
                       "cuda-sm90a", "--dtype", "bf16", "--top", "3", "--no-error")
    assert code == 0 and "error×" not in out
    code, out, _ = run(capsys, "select", "--shape", "2048x2048x2048", "--target",
                       "x86_64-avx512", "--json", "--top", "2")
    assert [c["error_ratio"] for c in json.loads(out)["candidates"]][0] == 1.0


def test_grid_is_not_a_shape(capsys):
    with pytest.raises(SystemExit):
        main(["list", "--grid", "2x0x3"])
    assert "<m,k,n>" in capsys.readouterr().err


def test_console_script_runs():
    out = subprocess.run([sys.executable, "-m", "lcmac.cli.main", "--version"], capture_output=True,
                         text=True, check=True)
    assert out.stdout.startswith("lcmac ")


def test_cache_commands_on_an_empty_cache(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("LCMAC_CACHE_DIR", str(tmp_path))
    code, out, _ = run(capsys, "cache", "info")
    assert code == 0 and str(tmp_path / "kernels") in out and "entries       0" in out
    code, out, _ = run(capsys, "cache", "info", "--json")
    doc = json.loads(out)
    assert doc["schema"] == "lcmac-cache-info/1" and doc["entries"] == 0
    assert doc["dir"] == str(tmp_path / "kernels")
    code, out, _ = run(capsys, "cache", "list", "--json")
    assert json.loads(out) == {"schema": "lcmac-cache-list/1", "dir": str(tmp_path / "kernels"),
                               "entries": [], "bit_kernels_dir": str(tmp_path / "bits"),
                               "bit_kernels": [], "result_caches": []}
    assert run(capsys, "cache", "clear")[0] == 0
    code, out, _ = run(capsys, "cache")                     # no action: the help, exit 2
    assert code == 2 and "info" in out and "clear" in out


def test_cache_clear_asks_first(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("LCMAC_CACHE_DIR", str(tmp_path))
    entry = tmp_path / "kernels" / ("a" * 64)                 # an entry (damaged: no files)
    entry.mkdir(parents=True)
    (entry / "lib.so").write_bytes(b"\0" * 100)
    monkeypatch.setattr(sys.stdin, "isatty", lambda: False)
    code, _, err = run(capsys, "cache", "clear")
    assert code == 2 and "--yes" in err and entry.is_dir()
    code, out, _ = run(capsys, "cache", "list")
    assert "damaged" in out
    code, out, _ = run(capsys, "cache", "clear", "--yes")
    assert code == 0 and "removed 1 kernels" in out and not entry.exists()


def test_list_alternative_basis_columns(capsys):
    """`lcmac list --alternative-basis`: the 12-addition Karstadt–Schwartz core for every 2×2 scheme."""
    assert main(["list", "--grid", "2x2x2", "--alternative-basis", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)["algorithms"]}
    assert rows["strassen"]["alternative_basis"]["additions"]["core"] == 12
    assert rows["winograd"]["alternative_basis"]["additions"]["basis_changes"] == 3


def test_distribute_prints_the_plan_and_the_row_split(capsys):
    code, out, _ = run(capsys, "distribute", "--shape", "8192x8192x8192", "--ranks", "4",
                       "--algo", "strassen", "--src", "0", "--dst", "0")
    assert code == 0 and "row split" in out and "sent A/B" in out
    code, out, _ = run(capsys, "distribute", "--shape", "4096x4096x4096", "--ranks", "3",
                       "--algo", "winograd", "--target", "x86_64-avx2", "--dtype", "float32",
                       "--strategy", "products", "--json")
    doc = json.loads(out)
    assert doc["schema"] == "lcmac-distribute/1" and doc["strategy"] == "products"
    assert doc["link_bytes_per_s"] == 2e9 and len(doc["per_rank"]) == 3
    assert sum(r["units"] for r in doc["per_rank"]) == 7 * doc["slices"]
    assert doc["predicted_s"] == max(r["predicted_s"] for r in doc["per_rank"])
    code, _, err = run(capsys, "distribute", "--shape", "64x64x64", "--ranks", "2", "--dst", "2")
    assert code == 2 and "--dst must be a rank in 0..1" in err
