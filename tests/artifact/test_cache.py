"""The kernel cache: compiled on first use, loaded afterwards; one compile for N processes
asking at once; damaged entries rebuilt, not loaded; keys that change with what the kernel
depends on.  Tiny CPU shapes (a build takes a few seconds)."""
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import lcmac
from lcmac.spec.targets import host_target
from lcmac.core import version
from lcmac.artifact import build as build_mod
from lcmac.artifact import cache, store
from lcmac.cli.main import main
from lcmac.core.errors import ArtifactError

CPU = host_target().name       # kernels are built and run here
SHAPE = (32, 24, 40)                 # M, N, K: no dimension a multiple of the others
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module", autouse=True)
def hermetic(tmp_path_factory):
    """No test reads the committed tuning logs (keys would follow them) or writes the user's
    cache."""
    d = tmp_path_factory.mktemp("env")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LCMAC_TUNING_LOGS", str(d / "logs"))
        mp.setenv("LCMAC_CACHE_DIR", str(d / "lcmac"))
        yield


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """One entry compiled into a cache of its own (copied by tests that damage it)."""
    root = tmp_path_factory.mktemp("pristine") / "kernels"
    hit = cache.cached_build("strassen", CPU, "float32", SHAPE, cache_dir=root)
    assert hit.compiled and not hit.repaired
    return root, hit


@pytest.fixture()
def no_compile(monkeypatch):
    def refuse(backend, request):
        raise AssertionError("the compiler worker ran on what should be a cache hit")
    monkeypatch.setattr(build_mod, "run_worker", refuse)


@pytest.fixture()
def count_compiles(monkeypatch):
    calls = []
    real = build_mod.run_worker

    def counting(backend, request):
        calls.append(request)
        return real(backend, request)
    monkeypatch.setattr(build_mod, "run_worker", counting)
    return calls


def _copy(pristine, tmp_path) -> Path:
    root = tmp_path / "kernels"
    shutil.copytree(pristine[0], root)
    return root


def _check_product(manifest, seed=0):
    M, N, K = SHAPE
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((M, K)).astype(np.float32)
    B = rng.standard_normal((K, N)).astype(np.float32)
    C = lcmac.load(manifest)(A, B)
    ref = A.astype(np.float64) @ B.astype(np.float64)
    assert np.abs(C - ref).max() < 1e-4 * np.abs(ref).max()


# ---- hits ---------------------------------------------------------------------------------
def test_second_call_is_a_hit_and_does_not_compile(pristine, no_compile):
    root, first = pristine
    again = cache.cached_build("strassen", CPU, "float32", SHAPE, cache_dir=root)
    assert not again.compiled and again.manifest == first.manifest and again.key == first.key
    assert again.entry == root.resolve() / first.key
    _check_product(again)                                 # a CacheHit is a path for lcmac.load
    [e] = cache.entries(root)
    assert (e.key, e.algorithm, e.target, e.dtype, e.shape_rule, e.ok) == \
        (first.key, "strassen", CPU, "float32", "exact:32x24x40", True)
    assert e.bytes > 0 and e.manifest == first.manifest
    inf = cache.info(root)
    assert inf["entries"] == 1 and inf["bytes"] >= e.bytes


def test_default_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("LCMAC_CACHE_DIR", str(tmp_path / "c"))
    assert cache.cache_dir() == tmp_path / "c" / "kernels"
    monkeypatch.delenv("LCMAC_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert cache.cache_dir() == tmp_path / "x" / "lcmac" / "kernels"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache.cache_dir() == Path.home() / ".cache" / "lcmac" / "kernels"
    monkeypatch.setenv("LCMAC_CACHE_DIR", "off")
    with pytest.raises(ArtifactError, match="off"):
        cache.cache_dir()


# ---- keys ---------------------------------------------------------------------------------
def test_key_changes_with_what_the_kernel_depends_on(monkeypatch):
    key = lambda *a, **kw: cache.cache_key(*a, **kw)[0]  # noqa: E731
    base, fields = cache.cache_key("strassen", CPU, "float32", SHAPE)
    assert fields["shape_rule"] == "exact:32x24x40" and fields["target"] == CPU
    assert fields["algorithm"] == lcmac.ir.get("strassen").hash
    assert fields["lcmac_version"] == version.__version__ and fields["schedule_version"] >= 1
    # the config as the build resolves it: the defaults spelled out are the same kernel
    assert key("strassen", CPU, "float32", SHAPE, config=fields["config"]) == base
    assert key("strassen", CPU, "float32", SHAPE, config={"kc": 128}) != base
    assert key("strassen", CPU, "float64", SHAPE) != base
    assert key("strassen", CPU, "float32", (32, 24, 48)) != base
    assert key("winograd", CPU, "float32", SHAPE) != base
    assert key("strassen", CPU, "float32", SHAPE, levels=2) != base
    assert key("gemm", CPU, "float32", SHAPE) != base
    assert cache.cache_key("gemm", CPU, "float32", SHAPE)[1]["algorithm"] == "gemm"
    other = "x86_64-avx2" if CPU != "x86_64-avx2" else "x86_64-avx512"
    assert key("strassen", other, "float32", SHAPE) != base
    assert key("strassen", CPU, "float32", SHAPE, mcpu="sapphirerapids") != base
    monkeypatch.setattr(version, "__version__", "999.0")
    assert key("strassen", CPU, "float32", SHAPE) != base
    # the same request twice: the same key (canonical JSON, no dict-order or time in it)
    monkeypatch.undo()
    assert key("strassen", CPU, "fp32", "32x24x40") == base
    # a template source that changes makes another key (schedule_version unchanged)
    assert fields["templates"] == cache.templates_digest() and len(fields["templates"]) == 64
    monkeypatch.setattr(cache, "templates_digest", lambda: "0" * 64)
    assert key("strassen", CPU, "float32", SHAPE) != base


def test_templates_digest_reads_the_template_sources(tmp_path, monkeypatch):
    """The digest covers every template and worker source: another byte in one of them,
    another digest."""
    import shutil
    pkg = tmp_path / "lcmac"
    for sub in cache.TEMPLATE_PACKAGES:
        shutil.copytree(Path(cache.__file__).resolve().parents[1] / sub, pkg / sub)
    (pkg / "artifact").mkdir()
    monkeypatch.setattr(cache, "__file__", str(pkg / "artifact" / "cache.py"))
    cache.templates_digest.cache_clear()
    try:
        same = cache.templates_digest()
        f = pkg / "schedules" / "cuda" / "small.py"
        f.write_text(f.read_text() + "# changed\n")
        cache.templates_digest.cache_clear()
        assert cache.templates_digest() != same
    finally:
        cache.templates_digest.cache_clear()


def test_key_follows_the_tuning_log(tmp_path, monkeypatch):
    from lcmac.artifact import tuning_log as tdb
    base = cache.cache_key("strassen", CPU, "float32", SHAPE)[0]
    logs = tmp_path / "logs"
    name, h = tdb.algo_identity("strassen")
    tdb.TuningDB(logs).append(tdb.make_record(
        target=CPU, dtype="float32", algorithm=name, algorithm_hash=h, shape=SHAPE,
        config={"mc": 6, "nc": 64, "kc": 128}, time_s=1e-5, spread=0.01, repeats=5, device="test"))
    monkeypatch.setenv("LCMAC_TUNING_LOGS", str(logs))
    k, f = cache.cache_key("strassen", CPU, "float32", SHAPE)
    assert k != base and f["config"]["kc"] == 128          # the record the build would take


# ---- concurrency ------------------------------------------------------------------------------
CHILD = textwrap.dedent("""
    import json, os, sys, time
    from pathlib import Path
    import lcmac.artifact.build as b
    go, compiles, target = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    real = b.run_worker
    def counting(backend, request):          # every compile this process starts, on disk
        with open(compiles, "a") as f:
            f.write(f"{os.getpid()}\\n")
        return real(backend, request)
    b.run_worker = counting
    from lcmac.artifact.cache import cached_build
    while not go.exists():                   # all three start together
        time.sleep(0.005)
    hit = cached_build("strassen", target, "float32", (32, 24, 40))
    print(json.dumps({"pid": os.getpid(), "manifest": str(hit.manifest),
                      "compiled": hit.compiled}))
""")


def test_three_processes_compile_a_new_kernel_once(tmp_path):
    env = dict(os.environ, LCMAC_CACHE_DIR=str(tmp_path / "lcmac"),
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    go, compiles = tmp_path / "go", tmp_path / "compiles.txt"
    procs = [subprocess.Popen([sys.executable, "-c", CHILD, str(go), str(compiles), CPU], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(3)]
    time.sleep(0.5)
    go.touch()
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
    res = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    assert len({r["manifest"] for r in res}) == 1                 # one entry for all
    builders = [r["pid"] for r in res if r["compiled"]]
    assert len(builders) == 1                                     # one said it compiled ...
    assert compiles.read_text().split() == [str(builders[0])]     # ... and one compile ran
    assert Path(res[0]["manifest"]).parent.parent == tmp_path / "lcmac" / "kernels"
    _check_product(res[0]["manifest"])
    leftovers = [n for n in os.listdir(tmp_path / "lcmac" / "kernels") if n.startswith(".tmp")]
    assert not leftovers


# ---- damage ---------------------------------------------------------------------------------
def _truncate(lib: Path, man: Path):
    data = lib.read_bytes()
    lib.write_bytes(data[: len(data) // 2])


def _flip(lib: Path, man: Path):
    data = bytearray(lib.read_bytes())
    data[len(data) // 2] ^= 0xFF                          # same size: only the sha256 tells
    lib.write_bytes(bytes(data))


def _garble_manifest(lib: Path, man: Path):
    man.write_text(man.read_text()[:100])


@pytest.mark.parametrize("damage", [_truncate, _flip, _garble_manifest],
                         ids=["truncated-library", "flipped-library", "garbled-manifest"])
def test_damaged_entry_is_rebuilt_not_loaded(pristine, tmp_path, damage, count_compiles):
    root = _copy(pristine, tmp_path)
    key = pristine[1].key
    man = root / key / pristine[1].manifest.name
    lib = man.with_suffix(".so")
    damage(lib, man)
    # what a killed build left, for this key and for another nobody is building
    stale = [root / f".tmp-{key}-999999-dead", root / f".tmp-{'0' * 64}-999999-dead"]
    for d in stale:
        d.mkdir()
        (d / "half.so").write_bytes(b"\0" * 10)
    with pytest.warns(cache.CacheWarning, match="damaged"):
        hit = cache.cached_build("strassen", CPU, "float32", SHAPE, cache_dir=root)
    assert hit.compiled and hit.repaired and len(count_compiles) == 1
    assert hit.key == key and hit.manifest == man.resolve()
    assert not any(d.exists() for d in stale)
    assert not [n for n in os.listdir(root) if n.startswith((".tmp", ".trash"))]
    _check_product(hit, seed=1)
    assert not cache.cached_build("strassen", CPU, "float32", SHAPE, cache_dir=root).compiled


def test_a_build_in_progress_keeps_its_scratch_directory(tmp_path):
    root = tmp_path / "kernels"
    root.mkdir()
    (root / store.LOCKS).mkdir()
    busy, dead = "1" * 64, "2" * 64
    for k in (busy, dead):
        (root / f".tmp-{k}-1-x").mkdir()
    kernels = store.Store(root)
    with kernels.lock(busy):                       # another build holds this key
        kernels.sweep()
    assert (root / f".tmp-{busy}-1-x").is_dir() and not (root / f".tmp-{dead}-1-x").exists()


def test_unwritable_cache_dir_says_which_and_how_to_set_it(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("LCMAC_CACHE_DIR", str(blocker))
    with pytest.raises(ArtifactError, match=r"kernel cache directory .*a-file/kernels is not "
                                            r"writable.*LCMAC_CACHE_DIR"):
        cache.cached_build("gemm", CPU, "float32", (16, 16, 16))
    if os.geteuid() != 0:                          # root writes through permissions
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o555)
        with pytest.raises(ArtifactError, match=f"{ro}.*not writable.*LCMAC_CACHE_DIR"):
            cache.cached_build("gemm", CPU, "float32", (16, 16, 16), cache_dir=ro)


# ---- listing and clearing ----------------------------------------------------------------------
def test_cli_info_list_clear(pristine, tmp_path, capsys):
    root = _copy(pristine, tmp_path)
    assert main(["cache", "info", "--dir", str(root), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == "lcmac-cache-info/1" and doc["entries"] == 1 and doc["bytes"] > 0
    assert main(["cache", "list", "--dir", str(root)]) == 0
    out = capsys.readouterr().out
    assert "strassen" in out and "exact:32x24x40" in out and "KB" in out
    assert main(["cache", "list", "--dir", str(root), "--json"]) == 0
    [e] = json.loads(capsys.readouterr().out)["entries"]
    assert e["shape_rule"] == "exact:32x24x40" and e["ok"] and e["key"] == pristine[1].key
    assert main(["cache", "clear", "--dir", str(root), "--yes"]) == 0
    assert "removed 1 kernels" in capsys.readouterr().out
    assert cache.entries(root) == [] and not [n for n in os.listdir(root) if not n.startswith(".")]
    assert main(["cache", "clear", "--dir", str(root)]) == 0      # empty: nothing to ask
    assert "is empty" in capsys.readouterr().out
