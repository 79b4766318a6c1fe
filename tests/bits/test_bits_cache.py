"""`lcmac cache` sees the bit kernels (lcmac.bits.cache): listed with their kind, a
damaged entry marked, and removed by `clear` unless one is being built (its lock held)."""
import fcntl
import hashlib
import json
import os

from lcmac.bits import cache as bit_cache
from lcmac.cli.main import main as cli


def _entry(root, key, fields, good=True):
    d = root / key
    d.mkdir(parents=True)
    lib = d / "kernel.so"
    lib.write_bytes(os.urandom(256))
    sha = hashlib.sha256(lib.read_bytes()).hexdigest() if good else "0" * 64
    (d / "entry.json").write_text(json.dumps({"key": key, "fields": fields, "sha256": sha}))


def test_list_and_clear_bit_kernels(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("LCMAC_CACHE_DIR", str(tmp_path))
    root = bit_cache.cache_dir()
    _entry(root, "a" * 64, {"semiring": "gf2"})
    _entry(root, "cuda-" + "b" * 64, {"arch": "sm_90a"}, good=False)
    _entry(root, "c" * 64, {"semiring": "boolean"})
    found = {k["key"][:4]: k for k in bit_cache.cached_kernels()}
    assert found["aaaa"]["kind"] == "native" and found["aaaa"]["for"] == "gf2" and found["aaaa"]["ok"]
    assert found["cuda"]["for"] == "sm_90a" and not found["cuda"]["ok"]
    assert cli(["cache", "list"]) == 0
    out = capsys.readouterr().out
    assert "bit kernels" in out and "sm_90a" in out and "damaged" in out
    (root / ".locks").mkdir()
    held = os.open(root / ".locks" / ("c" * 64 + ".lock"), os.O_RDWR | os.O_CREAT)
    fcntl.flock(held, fcntl.LOCK_EX)          # "being built" by another open file description
    try:
        assert cli(["cache", "clear", "--yes"]) == 0
    finally:
        os.close(held)
    assert [k["key"][:4] for k in bit_cache.cached_kernels()] == ["cccc"]
    assert "removed 2 bit kernels" in capsys.readouterr().out
