"""scripts/isa_probe.py: where its table cannot be written is said before the first child process starts (it was a
traceback once every setting had been probed), a refusal or a failed child is one line, and the table goes to the
repository's docs/data/isa-probe wherever the script is run from."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "isa_probe.py"


def _script():
    spec = importlib.util.spec_from_file_location("isa_probe", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _main(script, argv: list[str], monkeypatch) -> None:
    monkeypatch.setattr(sys, "argv", ["isa_probe.py", *argv])  # as run from the command line
    script.main()


def _refused(script, argv: list[str], capsys, monkeypatch) -> str:
    with pytest.raises(SystemExit) as exit_:
        _main(script, argv, monkeypatch)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_an_output_that_cannot_be_written_is_refused_before_any_probe(tmp_path, capsys, monkeypatch):
    script = _script()
    monkeypatch.setattr(script, "_probe", lambda setting: pytest.fail("a child process started"))
    (tmp_path / "a-file").write_text("mine\n")
    err = _refused(script, ["--out", str(tmp_path / "a-file" / "table.txt")], capsys, monkeypatch)
    assert err.startswith("isa_probe: --out ") and "cannot be written" in err and "a-file is a file" in err
    assert f"{tmp_path / 'a-file'} exists; give another --out" in _refused(
        script, ["--out", str(tmp_path / "a-file")], capsys, monkeypatch
    )
    assert (tmp_path / "a-file").read_text() == "mine\n"
    assert "is a folder, not a file" in _refused(script, ["--out", str(tmp_path)], capsys, monkeypatch)
    assert "unrecognized arguments: --outt" in _refused(script, ["--outt", "x.txt"], capsys, monkeypatch)


def test_the_table_goes_to_the_repository_wherever_it_is_run_from(tmp_path, capsys, monkeypatch):
    script = _script()
    monkeypatch.setattr(script, "ROOT", tmp_path / "repo", raising=False)
    monkeypatch.setattr(script, "_probe", lambda setting: {"capability": "X", "images": "i" * 16, "weights": "w" * 16})
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    _main(script, [], monkeypatch)
    (table,) = (tmp_path / "repo/docs/data/isa-probe").iterdir()
    assert table.read_text().count("| X | iiiiiiiiiiiiiiii | wwwwwwwwwwwwwwww |") == len(script.SETTINGS)
    assert not any((tmp_path / "elsewhere").iterdir())
    assert f"wrote {table}" in capsys.readouterr().out


def test_a_failed_child_is_one_line_its_own_error(tmp_path, capsys, monkeypatch):
    script = _script()
    failed = subprocess.CompletedProcess(
        [], 1, stdout="", stderr='Traceback (most recent call last):\n  File "x"\nValueError: boom\n'
    )
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: failed)
    err = _refused(script, ["--out", str(tmp_path / "t.txt")], capsys, monkeypatch)
    assert err == "isa_probe: the child process for (torch's own choice) failed: ValueError: boom\n"
    assert not (tmp_path / "t.txt").exists()


def test_each_child_runs_its_own_setting_alone_whatever_the_parent_was_given(tmp_path, monkeypatch, capsys):
    """A variable the parent was started with (MKL_CBWR=AVX2 for another experiment) would be in every child's
    environment, the rows then all probing it; each row's child gets exactly its own setting's variables."""
    script = _script()
    seen = []

    def run(argv, env, **kwargs):
        seen.append({k: env[k] for k in script.PROBED if k in env})
        return subprocess.CompletedProcess(argv, 0, stdout='{"capability": "X", "images": "i", "weights": "w"}\n')

    for variable in script.PROBED:
        monkeypatch.setenv(variable, "AVX2")
    monkeypatch.setattr(subprocess, "run", run)
    _main(script, ["--out", str(tmp_path / "t.txt")], monkeypatch)
    assert seen == script.SETTINGS and {} in seen and {"MKL_CBWR": "COMPATIBLE"} in seen
