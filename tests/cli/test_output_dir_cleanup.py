"""An output directory that the check before compiling created is removed again when the
command fails, as long as nothing was written into it; one that existed, or that holds what
the command wrote, stays."""
import importlib

import pytest

from lcmac.cli.output_dir import run_cleaning_created_dirs, writable_output_dir
from lcmac.core.errors import LcmacError
from tests.cli.test_consistent_commands import run

cli = importlib.import_module("lcmac.cli.main")


def _writing(path, status=None, files=(), dirs=()):
    """A command that checks ``path`` as -o does, makes ``dirs`` and ``files`` below it, then
    returns ``status`` (None: raises)."""
    def command(args):
        out = writable_output_dir(path)
        for d in dirs:
            (out / d).mkdir(parents=True)
        for f in files:
            (out / f).write_text("kernel")
        if status is None:
            raise LcmacError("the compile failed")
        return status
    return command


def test_a_failed_command_removes_the_directories_it_created(tmp_path):
    out = tmp_path / "a" / "b" / "c"
    with pytest.raises(LcmacError):
        run_cleaning_created_dirs(_writing(out, dirs=["artifact/src"]), None)
    assert list(tmp_path.iterdir()) == []             # a, b and c were all made for it
    assert run_cleaning_created_dirs(_writing(out, status=1), None) == 1
    assert list(tmp_path.iterdir()) == []


def test_what_the_command_wrote_and_what_existed_stay(tmp_path):
    out = tmp_path / "new"
    with pytest.raises(LcmacError):
        run_cleaning_created_dirs(_writing(out, files=["k.so"], dirs=["empty"]), None)
    assert sorted(p.name for p in out.iterdir()) == ["k.so"]      # the empty one went
    existing = tmp_path / "existing"
    existing.mkdir()
    with pytest.raises(LcmacError):
        run_cleaning_created_dirs(_writing(existing / "sub"), None)
    assert existing.is_dir() and list(existing.iterdir()) == []


def test_a_command_that_succeeds_keeps_its_directory(tmp_path):
    out = tmp_path / "done"
    assert run_cleaning_created_dirs(_writing(out, status=0), None) == 0
    assert out.is_dir()


def test_lcmac_build_and_export_leave_no_empty_directory_when_they_fail(capsys, tmp_path,
                                                                          monkeypatch):
    def failing(*a, **kw):
        raise LcmacError("the compiler failed")
    for name in ("build", "build_bundle", "export"):
        monkeypatch.setattr(cli, name, failing)
    for argv in (["build", "--algo", "gemm", "--shape", "16x16x16"], ["build", "--algo", "gemm"],
                 ["export", "16x16x16"]):
        out = tmp_path / "new" / "out"
        code, _, err = run(capsys, *argv, "-o", str(out))
        assert code == 1 and "the compiler failed" in err, argv
        assert list(tmp_path.iterdir()) == [], argv
