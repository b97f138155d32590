"""A closed stdout (``alfa … | head``) ends a command quietly with exit 141, as SIGPIPE ends a tool; any other
broken pipe a command meets (a socket, a child process's pipe) is its error, in one line with exit 2, not hidden
as a quiet 141."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest
import tiny_models  # noqa: F401  (registers tiny_gaze_net)

import alfa
from alfa.cli import main

SUMMARY = ["summary", "--model", "tiny_gaze_net", "--rank", "0"]


def _socket_closed_by_its_peer(model):
    ours, theirs = socket.socketpair()
    theirs.close()
    with ours:
        ours.sendall(b"x" * 65536)  # the peer is gone: EPIPE


def _child_gone(model):
    child = subprocess.Popen([sys.executable, "-c", "pass"], stdin=subprocess.PIPE)
    child.wait()
    try:
        child.stdin.write(b"x" * 65536)
        child.stdin.flush()  # the child has exited: EPIPE
    finally:
        child.stdin = None  # (its pipe is not closed again, which would raise the same error)


def test_a_closed_stdout_ends_quietly_with_141(stdout_pipe, capsys):
    stdout_pipe.use()
    stdout_pipe.close_reader()
    assert main(SUMMARY) == 141
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("stdout", ["a pipe still read", "no descriptor (captured)"])
@pytest.mark.parametrize("broken", [_socket_closed_by_its_peer, _child_gone], ids=["socket", "child"])
def test_another_broken_pipe_is_the_commands_error_in_one_line(stdout, broken, request, monkeypatch, capsys):
    if stdout == "a pipe still read":
        request.getfixturevalue("stdout_pipe").use()  # its reader left open
    monkeypatch.setattr(alfa, "parameter_summary", broken)
    assert main(SUMMARY) == 2
    assert capsys.readouterr().err == (
        "alfa summary: error: Broken pipe: the program or connection it wrote to closed its end first\n"
    )
