"""A Ctrl-C at the end of a command (alfa.cli.interrupts): once its work is done it is no failure, never a
traceback nor a death by the signal; an interrupted command's "interrupted" line comes after its progress bars."""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import subprocess
import sys

import pytest

from alfa.cli import main
from alfa.cli.interrupts import AFTER_THE_WORK


@pytest.fixture
def pythons_handler():
    """Python's own SIGINT handler, as in a terminal (a background job of a shell starts with SIGINT ignored)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_a_ctrl_c_after_the_work_as_the_command_lets_its_folders_go_is_no_failure(monkeypatch, capsys, pythons_handler):
    """alfa export, interrupted after both its "wrote" lines, said "interrupted" and exited 130 (and its rerun was
    refused: the files were there, whole). A Ctrl-C after the command's work is said as such and exits 0."""
    import alfa.cli

    real = alfa.cli.new_files

    @contextlib.contextmanager
    def interrupted_as_it_ends(paths):
        with real(paths):
            yield
        os.kill(os.getpid(), signal.SIGINT)  # the handler runs at once, in the main thread

    monkeypatch.setattr(alfa.cli, "new_files", interrupted_as_it_ends)
    assert main(["summary"]) == 0
    captured = capsys.readouterr()
    assert "total" in captured.out and captured.err == AFTER_THE_WORK + "\n"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # put back


def test_an_error_after_a_late_ctrl_c_is_said_as_the_error(monkeypatch, capsys, pythons_handler):
    """A Ctrl-C after the work (noted, nothing raised), then a real error as the command lets its files go: the
    error is what is said, in its one line, not "interrupted" (which would hide it)."""
    import alfa.cli

    real = alfa.cli.new_files

    @contextlib.contextmanager
    def failing_after_a_late_ctrl_c(paths):
        with real(paths):
            yield
        os.kill(os.getpid(), signal.SIGINT)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(alfa.cli, "new_files", failing_after_a_late_ctrl_c)
    assert main(["summary"]) == 2
    err = capsys.readouterr().err
    assert "No space left on device" in err and "interrupted" not in err and err.count("\n") == 1, err


@pytest.mark.parametrize("written", [True, False])
def test_a_ctrl_c_after_every_file_is_written_says_they_are(tmp_path, monkeypatch, capsys, written):
    """alfa export interrupted right after its last "wrote" line said only "interrupted", though both its files
    were whole (and a rerun was then refused: they exist). Where every file a command writes was written before
    the Ctrl-C, its line says so; a Ctrl-C before that is "interrupted", as ever."""
    import builtins

    import alfa.cli.crate

    def printing(*args, **kwargs):
        if written == str(args[0]).startswith("\nwrote"):
            builtins.print(*args, **kwargs)
            raise KeyboardInterrupt  # a Ctrl-C as the line appears
        builtins.print(*args, **kwargs)

    monkeypatch.setattr(alfa.cli.crate, "print", printing, raising=False)
    out = tmp_path / "runs.json"
    assert main(["crate", "toy", "--seeds", "1", "--panels", "a", "--json", str(out)]) == 130
    err = capsys.readouterr().err
    assert err == (f"interrupted after it had written --json {out}, whole\n" if written else "interrupted\n")
    assert out.is_file() == written


def test_the_interrupted_line_comes_after_the_progress_bars_and_none_is_drawn_again(
    monkeypatch, capsys, pythons_handler
):
    """alfa bench interrupted: "interrupted" came right after an inner bar's cursor-up escape (drawn over the outer
    bar's line), and the outer bar was drawn again after it, when Python freed the interrupted loop."""
    from tqdm.auto import tqdm

    import alfa

    def interrupted_in_two_loops(*args, **kwargs):
        bar = tqdm(total=3, desc="outer", position=0, file=sys.stderr)  # as alfa bench's: kept by its frame
        for _ in tqdm(range(3), desc="inner", leave=False, file=sys.stderr):
            raise KeyboardInterrupt
        bar.update()

    monkeypatch.setattr(alfa, "parameter_summary", interrupted_in_two_loops)
    assert main(["summary"]) == 130
    gc.collect()  # the loops are freed, and their bars with them
    err = capsys.readouterr().err
    before, said, after = err.rpartition("interrupted\n")
    assert said and after == "" and before.endswith("\n") and "outer:   0%" in before.splitlines()[-1]


# Run as a process: the command, then a Ctrl-C at one moment of Python's shutdown (the threads it waits for, its
# atexit callbacks, the freeing of the modules, when Python has put the default action of SIGINT back).
SHUTDOWN = """
import atexit, os, signal, sys, threading, time

signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal, even where the tests run in the background

def ctrl_c(kill=os.kill, pid=os.getpid(), sleep=time.sleep):
    kill(pid, signal.SIGINT)
    sleep(0.5)

class FreedLast:
    def __del__(self, ctrl_c=ctrl_c):
        ctrl_c()

moment = sys.argv.pop(1)
if moment == "freeing the modules":
    kept = FreedLast()
import alfa_command

status = alfa_command.main()
if moment == "atexit":
    atexit.register(ctrl_c)
if moment == "waiting for a thread":
    threading.Thread(target=lambda: (time.sleep(0.5), ctrl_c())).start()  # while Python waits for it
sys.exit(status)
"""


@pytest.mark.slow
@pytest.mark.parametrize("moment", ["waiting for a thread", "atexit", "freeing the modules"])
def test_a_ctrl_c_while_python_shuts_the_process_down_is_no_failure(moment):
    """A Ctrl-C after alfa export's work, while Python ended the process, gave "Exception ignored in atexit callback"
    with a KeyboardInterrupt traceback (in torch's callbacks), or killed the process by the signal without a word
    (exit -2: alfa crate gaze after its last "wrote" line). Now it is one line where Python still runs code of
    ours, or ignored, and the exit status stays the command's."""
    done = subprocess.run(
        [sys.executable, "-c", SHUTDOWN, moment, "summary"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, (done.returncode, done.stderr)
    assert "total" in done.stdout and "Traceback" not in done.stderr and "Exception ignored" not in done.stderr
    assert done.stderr == ("" if moment == "freeing the modules" else AFTER_THE_WORK + "\n")


@pytest.fixture
def sigterm_kills():
    """SIGTERM's and SIGHUP's default action in place (kill the process), as for a command a shell started."""
    previous = {signum: signal.signal(signum, signal.SIG_DFL) for signum in (signal.SIGTERM, signal.SIGHUP)}
    yield
    for signum, handler in previous.items():
        signal.signal(signum, handler)


def _signalled_in_the_work(monkeypatch, signum: int, after_the_work: bool = False, before=lambda: None) -> None:
    """The command gets ``signum`` while it works (after its folders are held; ``before`` is called first), or as
    it lets its files go."""
    import alfa.cli

    real = alfa.cli.new_files

    @contextlib.contextmanager
    def signalled(paths):
        with real(paths):
            if not after_the_work:
                before()
                os.kill(os.getpid(), signum)  # the handler runs at once, in the main thread
            yield
        os.kill(os.getpid(), signum)

    monkeypatch.setattr(alfa.cli, "new_files", signalled)


@pytest.mark.parametrize("signum, status", [(signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_a_sigterm_stops_a_command_as_a_ctrl_c_does_and_lets_its_folder_go(
    signum, status, tmp_path, monkeypatch, capsys, sigterm_kills
):
    """A SIGTERM (kill, a scheduler's time limit) ended a command at once: its folder's lock stayed (the next run
    replaced it as a dead holder's, with a note that its files may be incomplete) and nothing was said. Now it
    stops as on a Ctrl-C: the folder is let go, one line says why, and the exit status is a killed process's."""
    from alfa.locks import LOCK_FILE

    out = tmp_path / "model"
    held = []
    _signalled_in_the_work(monkeypatch, signum, before=lambda: held.append((out / LOCK_FILE).is_file()))
    assert main(["pretrain", "--data", "synthetic:eth", "--out", str(out)]) == status
    assert capsys.readouterr().err == f"terminated ({signum.name})\n"  # SIGHUP: its terminal closed
    assert held == [True] and not (out / LOCK_FILE).exists()
    assert signal.getsignal(signal.SIGTERM) == signal.getsignal(signal.SIGHUP) == signal.SIG_DFL  # put back


def test_a_sigterm_after_the_work_is_no_failure(monkeypatch, capsys, sigterm_kills):
    _signalled_in_the_work(monkeypatch, signal.SIGTERM, after_the_work=True)
    assert main(["summary"]) == 0
    captured = capsys.readouterr()
    assert "total" in captured.out and captured.err == AFTER_THE_WORK + "\n"
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def test_a_sigterm_a_library_swallows_and_fails_of_is_said_as_the_termination(monkeypatch, capsys, sigterm_kills):
    import alfa

    def swallowing(*args, **kwargs):
        try:
            os.kill(os.getpid(), signal.SIGTERM)
        except KeyboardInterrupt:  # as a library that catches a Ctrl-C may
            pass
        raise ValueError("module 'torch._dynamo' has no attribute 'exc'")

    monkeypatch.setattr(alfa, "parameter_summary", swallowing)
    assert main(["summary"]) == 143
    assert capsys.readouterr().err == "terminated (SIGTERM)\n"


def test_an_applications_own_sigterm_handler_is_kept(monkeypatch, capsys):
    """An application that runs alfa's commands and handles SIGTERM itself keeps its handler while they run."""
    got, seen = [], []

    def own(signum, frame):
        got.append(signum)

    _signalled_in_the_work(monkeypatch, signal.SIGTERM, before=lambda: seen.append(signal.getsignal(signal.SIGTERM)))
    previous = signal.signal(signal.SIGTERM, own)
    try:
        assert main(["summary"]) == 0
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert seen == [own] and got == [signal.SIGTERM, signal.SIGTERM]  # in the work, and as it let its files go


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_child_forked_while_a_command_works_is_still_killed_by_sigterm(signum, monkeypatch, capsys, sigterm_kills):
    """A DataLoader's worker is forked from the command, handler and all; torch stops one with SIGTERM, which
    must kill it as ever rather than raise in it (a traceback from a process nobody named)."""
    import time

    import alfa.cli

    real, ended = alfa.cli.new_files, []

    @contextlib.contextmanager
    def forking(paths):
        with real(paths):
            child = os.fork()
            if child == 0:
                try:
                    os.kill(os.getpid(), signum)
                    time.sleep(5)
                finally:
                    os._exit(0)  # reached only where the signal did not kill the child
            ended.append(os.waitpid(child, 0)[1])
            yield

    monkeypatch.setattr(alfa.cli, "new_files", forking)
    assert main(["summary"]) == 0 and capsys.readouterr().err == ""
    assert len(ended) == 1 and os.WIFSIGNALED(ended[0]) and os.WTERMSIG(ended[0]) == signum


def test_an_error_after_serve_stopped_on_a_sigterm_is_said_as_the_error(
    sigterm_kills, service_world, monkeypatch, capsys
):
    """alfa serve stops serving on a SIGTERM and exits 0: it handles the signal itself. An error after that (its
    socket would not close) was said as "terminated (SIGTERM)", exit 143, taken for a signal a library had
    swallowed and failed of; it is the error, in the one line every error gets."""
    import alfa.cli.serve as serve_cli

    class Server:
        server_address = ("127.0.0.1", 1)

        def serve_forever(self):
            os.kill(os.getpid(), signal.SIGTERM)  # the handler raises in this, the main, thread at once

        def in_flight(self):
            return 0

        def server_close(self):
            raise OSError("the socket could not be closed")

    monkeypatch.setattr(serve_cli, "_bind", lambda *args: Server())
    world = ["--checkpoint", str(service_world / "base.safetensors"), "--adapters", str(service_world / "adapters")]
    status = main(["serve", *world, "--quiet"])
    err = capsys.readouterr().err
    assert status == 2 and err.endswith("alfa serve: error: the socket could not be closed\n"), err
    assert "terminated" not in err and "stopping: answering the 0 connection(s) accepted" in err


def test_what_a_command_handled_itself_is_neither_early_nor_late():
    from alfa.cli.interrupts import Interrupts

    noted = Interrupts()
    noted.count = 2  # two while it works (one a library swallowed, one the command caught)
    noted.handled()
    assert (noted.early, noted.late) == (0, 0)
    noted.count += 1  # a third while it still works: early again
    assert (noted.early, noted.late) == (1, 0)
    noted.handled()
    noted.work_done()
    noted.count += 2  # two after the work: late, and not counted twice
    assert (noted.early, noted.late) == (0, 2)
    noted.handled()  # handled after the work: the late ones stay late
    assert (noted.early, noted.late) == (0, 2)
