"""``--threads`` on the gaze commands that train or score: torch's thread count while the command runs (the study
commands had it, these had only OMP_NUM_THREADS), checked like every other --threads, and given back afterwards."""

from pathlib import Path

import pytest
import torch

import alfa.cli.gaze as gaze_cli
import alfa.cli.options as options
from alfa.cli import main

COMMANDS = [
    ["pretrain"],
    ["truncate"],
    ["personalize"],
    ["evaluate"],
    ["demo"],
    ["calibrate"],
    ["faze", "train"],
    ["faze", "meta-train"],
    ["tpgaze", "meta-train"],
    ["tpgaze", "personalize"],
    ["example"],  # these two had none: they ran on every core of a shared machine
    ["speed"],
    ["predict"],  # these three had none either
    ["pnpga", "members"],
    ["pnpga", "adapt"],
]


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_each_long_gaze_command_has_threads_and_says_what_it_changes(command, capsys):
    with pytest.raises(SystemExit):
        main([*command, "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "--threads N torch's threads on the CPU while the command runs" in help_text
    assert "the same seed gives the same numbers at the same count only" in help_text


@pytest.fixture
def threads_seen(monkeypatch):
    """The thread count torch has when pretrain opens its data, where the run is then stopped."""
    seen = []

    def stop(spec):
        seen.append(torch.get_num_threads())
        raise ValueError("stopped here")

    monkeypatch.setattr(gaze_cli, "open_spec", stop)
    return seen


def _pretrain(tmp_path, *extra):
    return main(["pretrain", "--data", "synthetic:eth", "--out", str(tmp_path / "run"), "--quiet", *extra])


def test_threads_is_torchs_count_while_the_command_runs_and_not_after(tmp_path, capsys, threads_seen, monkeypatch):
    monkeypatch.setattr(options, "usable_cpus", lambda: 2)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert _pretrain(tmp_path, "--threads", "1") == 2
        assert threads_seen == [1]
        assert torch.get_num_threads() == 2  # given back, error or not
        assert _pretrain(tmp_path) == 2  # without the option: torch's own count
        assert threads_seen == [1, 2]
    finally:
        torch.set_num_threads(before)
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["alfa pretrain: error: stopped here"] * 2


def test_threads_are_given_back_after_a_ctrl_c_too(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(options, "usable_cpus", lambda: 2)
    seen = []

    def interrupted(spec):
        seen.append(torch.get_num_threads())
        raise KeyboardInterrupt

    monkeypatch.setattr(gaze_cli, "open_spec", interrupted)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert _pretrain(tmp_path, "--threads", "1") == 130
        assert seen == [1]  # it ran at the option's count
        assert torch.get_num_threads() == 2  # and gave torch's back when interrupted
    finally:
        torch.set_num_threads(before)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "interrupted" in err[0], err


def test_more_threads_than_cpus_is_run_with_a_note(tmp_path, capsys, threads_seen, monkeypatch):
    monkeypatch.setattr(options, "usable_cpus", lambda: 1)
    before = torch.get_num_threads()
    try:
        assert _pretrain(tmp_path, "--threads", "2") == 2
    finally:
        torch.set_num_threads(before)
    assert threads_seen == [2]
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0] == (
        "alfa pretrain: note: --threads 2 is more than the 1 CPUs this process may use: the threads will contend "
        "for them"
    )


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("0", "must be at least 1, got 0"),
        ("two", "expected a whole number, got 'two'"),
        ("5", "at most twice the 2 CPUs this process may use, got 5"),
    ],
)
def test_a_bad_thread_count_is_one_line_before_anything_runs(tmp_path, capsys, threads_seen, monkeypatch, value, said):
    monkeypatch.setattr(options, "usable_cpus", lambda: 2)
    with pytest.raises(SystemExit) as refused:  # argparse's refusal, in alfa's one line
        _pretrain(tmp_path, "--threads", value)
    assert refused.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"argument --threads: {said}" in err[0], err
    assert threads_seen == []


def test_speeds_memory_children_run_with_the_commands_threads(monkeypatch):
    """Each memory row is a fresh process: it ran with torch's own count whatever ``--threads`` said."""
    import subprocess

    import alfa.study.bench.speed as speed

    codes = []

    def child(argv, **kwargs):
        codes.append(argv[-1])
        return subprocess.CompletedProcess(argv, 0, stdout='{"resident": 1.0}\n')

    monkeypatch.setattr(speed.subprocess, "run", child)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        speed._memory_mb("alfa", 32, Path("m.safetensors"))
    finally:
        torch.set_num_threads(before)
    assert codes[0].startswith("import torch; torch.set_num_threads(1); ")
