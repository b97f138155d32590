"""A folder one command fills is held by it: a second command writing there at the same time is refused."""

import argparse
import contextlib
import datetime
import json
import os
import socket
import subprocess
import sys

import pytest

from alfa.locks import LOCK_FILE, FolderHeldError, hold


def _write_lock(folder, pid, host=None, command="alfa personalize", started=None):
    folder.mkdir(parents=True, exist_ok=True)
    started = started or datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    record = {"pid": pid, "host": host or socket.gethostname(), "command": command, "started": started}
    (folder / LOCK_FILE).write_text(json.dumps(record))


def _dead_pid():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_the_lock_names_its_holder_and_is_removed_at_the_end(tmp_path):
    folder = tmp_path / "a" / "out"
    with hold(folder, "alfa pretrain") as held:
        record = json.loads((folder / LOCK_FILE).read_text())
        assert record["pid"] == os.getpid() and record["command"] == "alfa pretrain"
        assert record["host"] == socket.gethostname() and record["started"]
        assert held.stale is None and held.stale_note() is None
        (folder / "model.safetensors").write_bytes(b"work")
    assert sorted(p.name for p in folder.iterdir()) == ["model.safetensors"]


def test_a_folder_the_hold_created_and_left_empty_is_removed(tmp_path):
    with pytest.raises(RuntimeError), hold(tmp_path / "a" / "out", "alfa truncate"):
        raise RuntimeError("the command failed before writing anything")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_the_lock_is_removed_when_the_body_raises(tmp_path, error):
    (tmp_path / "kept").write_text("a file of an earlier run")
    with pytest.raises(error), hold(tmp_path, "alfa personalize"):
        raise error()
    assert not (tmp_path / LOCK_FILE).exists() and (tmp_path / "kept").read_text() == "a file of an earlier run"


def test_a_live_holder_is_refused_and_keeps_its_lock(tmp_path):
    _write_lock(tmp_path, os.getpid(), command="alfa personalize --method lora")
    before = (tmp_path / LOCK_FILE).read_bytes()
    with pytest.raises(FolderHeldError) as e, hold(tmp_path, "alfa personalize --method alfa"):
        pytest.fail("the body must not run")
    message = str(e.value)
    assert str(tmp_path) in message and f"process {os.getpid()}" in message and "--method lora" in message
    assert "wait for it" in message and "\n" not in message
    assert (tmp_path / LOCK_FILE).read_bytes() == before


def test_a_lock_of_another_host_is_not_judged_from_here(tmp_path):
    _write_lock(tmp_path, _dead_pid(), host="another-machine")
    with pytest.raises(FolderHeldError, match="on host another-machine, which cannot be checked from here"):
        with hold(tmp_path, "alfa pretrain"):
            pass
    assert (tmp_path / LOCK_FILE).exists()


@pytest.mark.parametrize("content", ["dead", "garbage", "", '{"pid": "x"}', "[1, 2]"])
def test_a_lock_of_a_process_that_is_gone_or_garbage_is_stale_and_replaced(tmp_path, content):
    if content == "dead":
        pid = _dead_pid()
        _write_lock(tmp_path, pid)
    else:
        (tmp_path / LOCK_FILE).write_text(content)
        os.utime(tmp_path / LOCK_FILE, (0, 0))  # old: a young empty lock is one being written (the next test)
    with hold(tmp_path, "alfa pretrain") as held:
        assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == os.getpid()
        note = held.stale_note()
        assert note is not None and (f"process {pid}" in note if content == "dead" else "unreadable" in note)
    assert not (tmp_path / LOCK_FILE).exists()


def test_two_commands_taking_a_folder_at_once_never_both_hold_it(tmp_path, monkeypatch):
    """The second command looks while the first writes its lock's record: the lock was then an empty file, judged
    unreadable, removed and taken again, and both filled the folder."""
    write, held, other = os.write, [], contextlib.ExitStack()

    def the_other_command_looks(fd, data):
        if not held:
            held.append("looking")
            with contextlib.suppress(FolderHeldError):
                other.enter_context(hold(tmp_path, "the other one"))  # and keeps it
                held.append("the other one")
        return write(fd, data)

    monkeypatch.setattr(os, "write", the_other_command_looks)
    with other, contextlib.suppress(FolderHeldError), hold(tmp_path, "the first one"):
        held.append("the first one")
    monkeypatch.setattr(os, "write", write)
    assert held == ["looking", "the other one"]  # the first one, refused, fills nothing
    # a lock being written (empty, just made) is held; a folder in the lock's place is said to be one
    (tmp_path / LOCK_FILE).write_text("")
    with pytest.raises(FolderHeldError, match="being taken by another command at this moment"):
        with hold(tmp_path, "alfa pretrain"):
            pass
    (tmp_path / LOCK_FILE).unlink()
    (tmp_path / LOCK_FILE).mkdir()
    with pytest.raises(FolderHeldError, match=r"\.alfa-lock is not a lock alfa wrote \(a folder\?\)"):
        with hold(tmp_path, "alfa pretrain"):
            pass


def test_a_symbolic_link_in_the_locks_place_is_never_followed(tmp_path):
    target = tmp_path / "precious.txt"
    target.write_text("not a lock")
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / LOCK_FILE).symlink_to(target)
    with pytest.raises(FolderHeldError, match="symbolic link"), hold(folder, "alfa pretrain"):
        pass
    assert target.read_text() == "not a lock" and (folder / LOCK_FILE).is_symlink()


def test_the_lock_of_whoever_replaced_ours_is_not_removed(tmp_path):
    with hold(tmp_path, "alfa pretrain"):
        (tmp_path / LOCK_FILE).unlink()  # judged stale by someone else, who then took the folder
        _write_lock(tmp_path, os.getpid(), command="the other one")
    assert "the other one" in (tmp_path / LOCK_FILE).read_text()


# ----------------------------------------------------------------------------- the CLI


def _personalize(folder):
    return ["personalize", "--checkpoint", str(folder.parent / "missing.safetensors"), "--data", "synthetic:mpii"]


def test_personalize_into_a_held_folder_is_one_line_and_touches_nothing(tmp_path, capsys):
    from alfa.cli import main

    out = tmp_path / "adapters"
    _write_lock(out, os.getpid(), command="alfa personalize")
    (out / "p00.safetensors").write_bytes(b"an adapter of the running command")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert main([*_personalize(out), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("alfa personalize: error: ") and err.count("\n") == 1 and "Traceback" not in err
    assert f"is held by 'alfa personalize' (process {os.getpid()}" in err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_without_the_hold_the_refusal_disappears(tmp_path, capsys, monkeypatch):
    """The check can fail: with the hold taken out, the same command goes past the held folder (and stops at its
    missing checkpoint instead)."""
    import alfa.locks
    from alfa.cli import main

    out = tmp_path / "adapters"
    _write_lock(out, os.getpid())
    monkeypatch.setattr(alfa.locks, "hold", lambda folder, what: contextlib.nullcontext(alfa.locks.Hold(folder)))
    assert main([*_personalize(out), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "is held by" not in err and "missing.safetensors" in err


def test_the_other_ranks_of_a_torchrun_job_leave_the_hold_to_rank_0(tmp_path, capsys, monkeypatch):
    """The processes of one torchrun job fill one folder: a rank other than 0 does not take (or check) the hold
    its rank 0 has, and goes on (here to its missing checkpoint); rank 0 is refused as any command is."""
    from alfa.cli import main

    out = tmp_path / "adapters"
    _write_lock(out, os.getpid())
    monkeypatch.setenv("RANK", "1")
    assert main([*_personalize(out), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "is held by" not in err and "missing.safetensors" in err
    monkeypatch.setenv("RANK", "0")
    assert main([*_personalize(out), "--out", str(out)]) == 2
    assert "is held by" in capsys.readouterr().err


def test_a_stale_lock_is_replaced_with_a_note_and_the_command_runs(tmp_path, capsys):
    from alfa.cli import _hold_outputs

    _write_lock(tmp_path, _dead_pid(), command="alfa pretrain")
    args = argparse.Namespace(held=("out", "again"), out=str(tmp_path), again=str(tmp_path / "."))
    with _hold_outputs(args, "alfa pretrain"):  # one folder named twice is held once
        assert json.loads((tmp_path / LOCK_FILE).read_text())["command"] == "alfa pretrain"
        assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == os.getpid()
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("alfa pretrain: note: replaced a stale lock in")
    assert not (tmp_path / LOCK_FILE).exists()
    # what a killed writer left (atomic_path's names), counted and named; a file of another name is not counted
    from alfa.fileio import atomic_path

    with pytest.raises(KeyboardInterrupt), atomic_path(tmp_path / "deep" / "model.safetensors") as partial:
        partial.write_bytes(b"x" * 2048)
        kept = partial.with_name(partial.name + ".kept")  # a SIGKILL would leave it: simulated by a copy
        kept.write_bytes(partial.read_bytes())
        raise KeyboardInterrupt
    kept.rename(partial)
    (tmp_path / ".notes.tmp").write_text("mine")
    _write_lock(tmp_path, _dead_pid(), command="alfa pretrain")
    with _hold_outputs(args, "alfa pretrain"):
        pass
    err = capsys.readouterr().err
    assert (
        "it left 1 temporary file(s) of unfinished writes (0.0 MiB)" in err
        and "-regextype posix-extended -regex" in err
    )
    assert partial.is_file() and (tmp_path / ".notes.tmp").is_file()  # said, not removed
    decoy = tmp_path / ".notes.zzzzzzzz.tmp"  # eight characters, not hex: no name atomic_path gives
    decoy.write_text("mine")
    subprocess.run(err.split("delete them with  ")[1].strip(), shell=True, check=True)  # as a user would
    assert not partial.exists() and decoy.is_file() and (tmp_path / ".notes.tmp").is_file()


def _leaves(parser, path=()):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _leaves(sub, (*path, name))
            return
    yield " ".join(path), parser


def test_every_output_folder_is_held_but_those_its_writers_share():
    from alfa.cli import build_parser

    held = {}
    for path, parser in _leaves(build_parser()):
        defaults = parser._defaults
        folders = {name for name, folder in defaults["outputs"].items() if folder}
        assert set(defaults["held"]) <= folders, path
        held[path] = (set(defaults["held"]), folders - set(defaults["held"]))
    for command in ("pretrain", "truncate", "personalize", "tpgaze meta-train", "tpgaze personalize", "crate gaze"):
        assert held[command] == ({"out"}, set()), command
    assert held["bench"] == (set(), {"out"})  # pieces of one benchmark fill one folder at once
    assert held["demo"] == ({"out"}, {"cache_dir"})  # one cache for every demo
    assert held["llm bench"] == ({"out"}, {"cache"})  # one cache of base models for every bench
    assert held["llm pretrain"] == (set(), {"cache"})
    assert held["report"][0] == {"figures", "data_to"}
    assert held["evaluate"] == (set(), set())  # one JSON file, written atomically


def test_a_folder_inside_one_another_command_holds_is_refused_and_not_removed(tmp_path):
    """alfa crate gaze --replace removed a stage folder a running pretrain held, and a command was let into a folder
    inside one another command holds."""
    from alfa.locks import refuse_held_inside
    from alfa.study.crate.gaze import _remove_outputs, _stage_folders

    _write_lock(tmp_path, os.getppid(), command="alfa crate gaze")  # a running process that is not this one
    with pytest.raises(FolderHeldError, match=r"is inside .*, held by 'alfa crate gaze' \(process \d+"):
        with hold(tmp_path / "crate", "alfa pretrain"):
            pass
    assert not (tmp_path / "crate").exists()
    (tmp_path / LOCK_FILE).unlink()
    stage = next(iter(_stage_folders(tmp_path).values()))
    _write_lock(stage, os.getppid(), command="alfa pretrain")
    (stage / "model.safetensors").write_bytes(b"its model")
    with pytest.raises(FolderHeldError, match="held by 'alfa pretrain'.*still running: wait for it to finish"):
        _remove_outputs(tmp_path)
    assert (stage / "model.safetensors").read_bytes() == b"its model"
    _write_lock(stage, os.getpid())  # this process's own lock (a command holding what it replaces) is no obstacle
    refuse_held_inside(tmp_path)
    _write_lock(stage, _dead_pid())
    _remove_outputs(tmp_path)
    assert not stage.exists()


def test_a_benchmark_shares_its_folder_with_its_own_pieces_only(tmp_path, capsys):
    """A benchmark takes no lock (its pieces write one folder together); it ran into a folder a pretrain held."""
    from alfa.cli import main

    _write_lock(tmp_path, os.getppid(), command="alfa pretrain")
    assert main(["bench", "--smoke", "--out", str(tmp_path), "--pairs", "E→M", "--ablations", "none"]) == 2
    err = capsys.readouterr().err
    assert "is held by 'alfa pretrain'" in err and "still running" in err and err.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == [LOCK_FILE]
    (tmp_path / LOCK_FILE).unlink()
    _write_lock(tmp_path / "x", os.getppid(), command="alfa pretrain")  # a folder inside it, held
    assert main(["bench", "--smoke", "--out", str(tmp_path), "--pairs", "E→M", "--ablations", "none"]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'x'} is held by 'alfa pretrain'" in err and err.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x"]


def _write_share(folder, pid, command="alfa bench --seeds 3"):
    from alfa.locks import SHARE_FOLDER

    (folder / SHARE_FOLDER).mkdir(parents=True, exist_ok=True)
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    record = {"pid": pid, "host": socket.gethostname(), "command": command, "started": started}
    (folder / SHARE_FOLDER / str(pid)).write_text(json.dumps(record))


def test_a_folder_a_benchmark_fills_is_shared_with_its_pieces_and_held_against_others(tmp_path):
    """A pretrain was let into a folder a running benchmark was filling (a benchmark takes no lock)."""
    from alfa.locks import SHARE_FOLDER, share

    _write_share(tmp_path, os.getppid())  # another piece, running
    with share(tmp_path, "alfa bench --seeds 4"):  # a second piece joins it
        assert sorted(p.name for p in (tmp_path / SHARE_FOLDER).iterdir()) == sorted(
            [str(os.getppid()), str(os.getpid())]
        )
    assert [p.name for p in (tmp_path / SHARE_FOLDER).iterdir()] == [str(os.getppid())]
    for folder, held in [
        (tmp_path, f"{tmp_path} is filled"),
        (tmp_path / "x", f"{tmp_path / 'x'} is inside {tmp_path}, filled"),
    ]:
        with pytest.raises(FolderHeldError) as e, hold(folder, "alfa pretrain"):
            pytest.fail("the body must not run")
        assert str(e.value).startswith(f"{held} by 'alfa bench --seeds 3' (process {os.getppid()}")
        assert "still running" in str(e.value)
    assert not (tmp_path / "x").exists() and not (tmp_path / LOCK_FILE).exists()
    with pytest.raises(FolderHeldError, match=f"{tmp_path / 'y'} is inside {tmp_path}, filled by 'alfa bench"):
        with share(tmp_path / "y", "alfa bench"):
            pass
    with pytest.raises(FolderHeldError, match=f"{tmp_path} is filled by 'alfa bench"):  # one around another's
        with share(tmp_path.parent, "alfa bench"):
            pass
    _write_share(tmp_path, _dead_pid())  # a dead piece's mark is no obstacle, and goes
    (tmp_path / SHARE_FOLDER / str(os.getppid())).unlink()
    with hold(tmp_path / "x", "alfa pretrain"):
        pass
    with share(tmp_path, "alfa bench"):
        pass
    assert not (tmp_path / SHARE_FOLDER).exists()


def test_a_benchmark_and_a_hold_starting_at_once_never_both_run(tmp_path):
    """Each looks for the other after making its own mark: of two starting together, at least one is refused."""
    from alfa.locks import SHARE_FOLDER, share

    with share(tmp_path, "alfa bench"):  # marked; a hold by another process now must see it
        _write_share(tmp_path, os.getppid())
        (tmp_path / SHARE_FOLDER / str(os.getpid())).unlink()
        with pytest.raises(FolderHeldError, match="is filled by"), hold(tmp_path, "alfa pretrain"):
            pass
        (tmp_path / SHARE_FOLDER / str(os.getppid())).unlink()
    _write_lock(tmp_path, os.getppid(), command="alfa pretrain")  # a lock taken: a share made since sees it
    with pytest.raises(FolderHeldError, match="is held by 'alfa pretrain'"), share(tmp_path, "alfa bench"):
        pass
    assert sorted(p.name for p in tmp_path.iterdir()) == [LOCK_FILE]


def test_a_lock_whose_process_number_a_later_process_took_is_stale(tmp_path):
    """A lock left by a dead command whose number a process started since now has was judged held."""
    _write_lock(tmp_path, os.getppid(), started="2001-01-01T00:00:00+00:00")  # running, but started long after
    with hold(tmp_path, "alfa pretrain") as held:
        assert "is no longer running" in held.stale_note()
    _write_lock(tmp_path, os.getppid())  # its own lock, from when it started: held
    with pytest.raises(FolderHeldError, match="still running"), hold(tmp_path, "alfa pretrain"):
        pass


def test_two_llm_benches_share_their_cache_and_never_an_out_folder(tmp_path, capsys, monkeypatch):
    """Every `alfa llm bench` held its whole --cache (runs/llm/pretrain by default) while it ran: a second one into
    another --out was refused ("is held by 'alfa llm bench'") though the two share nothing but the base models,
    each of which is made under its own lock (tests/test_llm.py)."""
    import alfa.study.llm.bench
    from alfa.cli import main
    from alfa.locks import SHARE_FOLDER

    ran = []

    def bench(config, out, cache, **kwargs):
        ran.append((out, cache))
        return {"runs": [], "selected_rates": {}}

    monkeypatch.setattr(alfa.study.llm.bench, "run_bench", bench)
    cache, first, second = tmp_path / "cache", tmp_path / "first", tmp_path / "second"
    _write_share(cache, os.getppid(), command="alfa llm bench")  # the first bench, running, into --out first
    _write_lock(first, os.getppid(), command="alfa llm bench")
    argv = ["llm", "bench", "--smoke", "--quiet", "--cache", str(cache), "--out"]
    assert main([*argv, str(second)]) == 0, capsys.readouterr().err
    assert ran == [(second, cache)] and [p.name for p in (cache / SHARE_FOLDER).iterdir()] == [str(os.getppid())]
    capsys.readouterr()
    assert main([*argv, str(first)]) == 2  # its --out stays the first one's alone
    err = capsys.readouterr().err
    assert f"{first} is held by 'alfa llm bench'" in err and err.count("\n") == 1 and len(ran) == 1
