"""``lcmac cache`` shows and clears the results kept beside the kernels (the accuracy
simulations, ``lcmac.core.result_cache``), not only the kernels."""
import json

import pytest

from lcmac.cli.main import main
from lcmac.core.errors import LcmacError
from lcmac.core.result_cache import NAMES, ResultCache, result_caches


def test_info_list_and_clear_the_accuracy_results(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("LCMAC_CACHE_DIR", str(tmp_path))
    acc = ResultCache("accuracy")
    acc.put({"a": 1}, {"ratio": 2.0})
    acc.put({"a": 2}, {"ratio": 3.0})
    (tmp_path / "cse").mkdir()                         # another cache's: left alone
    (tmp_path / "cse" / "x.json").write_text("{}")
    assert acc.info()["entries"] == 2 and acc.get({"a": 1}) == {"ratio": 2.0}
    assert main(["cache", "info"]) == 0
    assert "results       accuracy: 2," in capsys.readouterr().out
    assert main(["cache", "info", "--json"]) == 0
    (doc,) = json.loads(capsys.readouterr().out)["result_caches"]
    assert doc["name"] == "accuracy" and doc["entries"] == 2 and doc["dir"] == str(tmp_path / "accuracy")
    assert main(["cache", "list"]) == 0
    assert "2 accuracy results" in capsys.readouterr().out
    # --dir names a kernel cache only: the results stay
    assert main(["cache", "clear", "--dir", str(tmp_path / "other"), "--yes"]) == 0
    assert acc.info()["entries"] == 2
    monkeypatch.setattr("sys.stdin.isatty", lambda: False)
    assert main(["cache", "clear"]) == 2                # asks first: nothing removed
    assert "2 accuracy results" in capsys.readouterr().err and acc.info()["entries"] == 2
    assert main(["cache", "clear", "--yes"]) == 0
    assert "removed 2 accuracy results" in capsys.readouterr().out
    assert acc.info()["entries"] == 0 and acc.get({"a": 1}) is None
    assert not (tmp_path / "accuracy").exists() and (tmp_path / "cse" / "x.json").is_file()
    assert main(["cache", "clear"]) == 0 and "is empty" in capsys.readouterr().out


def test_every_result_cache_is_known_to_the_command():
    assert [c.name for c in result_caches()] == list(NAMES)
    with pytest.raises(LcmacError, match="NAMES"):
        ResultCache("unlisted")


def test_caches_off(monkeypatch):
    monkeypatch.setenv("LCMAC_CACHE_DIR", "off")
    acc = ResultCache("accuracy")
    acc.put({"a": 1}, {"ratio": 2.0})                   # kept nowhere
    inf = acc.info()
    assert inf["dir"] is None and inf["entries"] == 0 and acc.clear() == {"entries": 0, "bytes": 0}
