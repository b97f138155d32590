"""A file output where no file can be made is refused before the work, also where ``os.access`` says yes (root, in
``/sys`` or on a read-only mount); and a write that fails names the user's path, never the hidden temporary file
beside it."""

import errno
import functools
import os
import tempfile
from pathlib import Path

import pytest

import alfa.fileio as fileio
from alfa.cli import main


def _refusing_new_files(monkeypatch, folder: Path) -> None:
    """The file system of ``folder`` refuses every new file (as sysfs does, whatever ``os.access`` says)."""
    real = tempfile.mkstemp

    def mkstemp(*args, dir=None, **kwargs):  # noqa: A002 - tempfile's own name
        if dir is not None and Path(dir) == folder:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))
        return real(*args, dir=dir, **kwargs)

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)


@pytest.mark.parametrize(
    ("argv", "module", "work"),
    [
        (("costs", "--json", "{out}/c.json", "--repeats", "1"), "alfa.study.bench.costs", "report_costs"),
        (("serving", "--out", "{out}/s.md", "--rounds", "2"), "alfa.study.bench.serving", "main"),
        (("crate", "toy", "--seeds", "1", "--figure", "{out}/f.png"), "alfa.study.crate.toy", "run_toy"),
    ],
)
def test_a_file_output_nothing_can_be_written_beside_is_refused_before_the_work(
    tmp_path, capsys, monkeypatch, argv, module, work
):
    import importlib

    target = importlib.import_module(module)

    @functools.wraps(getattr(target, work))  # its defaults stay readable: the parser shows them
    def refuse(*args, **kwargs):
        pytest.fail("worked before checking the output")

    monkeypatch.setattr(target, work, refuse)
    locked = tmp_path / "locked"
    locked.mkdir()
    _refusing_new_files(monkeypatch, locked)
    assert main([part.format(out=locked) for part in argv]) == 2
    err = capsys.readouterr().err
    assert "cannot be written" in err and str(locked) in err and ".tmp." not in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert list(locked.iterdir()) == []


def test_the_check_leaves_nothing_behind(tmp_path):
    assert fileio.check_writable(tmp_path / "a.json") == tmp_path / "a.json"
    assert fileio.check_writable(tmp_path / "new" / "deeper" / "a.json") == tmp_path / "new" / "deeper" / "a.json"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(
    not (os.path.isdir("/sys") and os.access("/sys", os.W_OK)), reason="needs root, whom os.access lets into /sys"
)
def test_root_is_refused_in_sys_up_front():
    with pytest.raises(ValueError, match=r"--json /sys/c.json cannot be written: /sys refuses a new file \("):
        fileio.check_writable("/sys/c.json", what="--json")


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc")
def test_a_folder_that_takes_no_new_files_is_not_said_to_be_missing():
    """/proc says "No such file or directory" of a new file in it: the message read "/proc: No such file or
    directory", of a folder that is there."""
    with pytest.raises(ValueError, match=r"^--out /proc/x.onnx cannot be written: /proc takes no new files \("):
        fileio.check_writable("/proc/x.onnx", what="--out")


def test_a_failed_write_names_the_users_path_not_the_temporary_file(tmp_path):
    target = tmp_path / "out.json"
    with pytest.raises(PermissionError) as e:
        with fileio.atomic_path(target) as tmp:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(tmp))
    assert e.value.filename == str(target)
    assert list(tmp_path.iterdir()) == []


def test_a_link_is_checked_where_its_target_will_be_written(tmp_path, monkeypatch):
    """atomic_path writes beside what a link points to; the check must probe that folder, not the link's own."""
    locked, mine = tmp_path / "locked", tmp_path / "mine"
    locked.mkdir()
    mine.mkdir()
    (mine / "out.json").symlink_to(locked / "out.json")
    _refusing_new_files(monkeypatch, locked)
    with pytest.raises(ValueError, match=rf"cannot be written: {locked}"):
        fileio.check_writable(mine / "out.json")
    assert fileio.check_writable(locked.parent / "plain.json") == tmp_path / "plain.json"
