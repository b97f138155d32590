"""scripts/scout_worlds.py: a second scout of one name waits for the first one's turn on its run folder instead of
training into it beside it, then re-scores what the first one finished; a bad argument is one line before anything
is rendered or trained, and a record is never replaced unasked."""

import importlib.util
import json
import shlex
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from tiny_models import TinyGazeNet  # noqa: F401  (registers tiny_gaze_net)
from waiting import starts_and_waits

from alfa.locks import locked
from alfa.models import create_model

TRAIN = "synthetic:eth?size=16&persons=4&images_per_person=12"
SCORED = "synthetic:mpii?size=16&persons=2&images_per_person=8"


def _script():
    path = Path(__file__).resolve().parents[1] / "scripts" / "scout_worlds.py"
    spec = importlib.util.spec_from_file_location("scout_worlds", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_second_scout_of_one_name_waits_for_the_first(tmp_path, capsys, monkeypatch):
    scout = _script()
    monkeypatch.setattr(scout, "create_model", lambda name: create_model("tiny_gaze_net"))  # light, not ResNet-18
    folder = tmp_path / "runs" / "scout" / "toy"
    second = threading.Thread(target=scout.main, args=(["toy", TRAIN, "1", SCORED], tmp_path))
    with locked(folder):  # another scout of this name is running
        starts_and_waits(second, folder, capsys, f"waiting for another scout writing {folder}")
    second.join(120)
    assert not second.is_alive() and (folder / "model.safetensors").is_file()
    written = json.loads((tmp_path / "docs/data/calibration-scout/toy.json").read_text())
    assert written["name"] == "toy" and set(written["mean_error_deg"]) == {SCORED}
    assert json.loads(capsys.readouterr().out) == written["mean_error_deg"]


def _refused(scout, argv: list[str], root: Path, capsys) -> str:
    with pytest.raises(SystemExit) as exit_:
        scout.main(argv, root)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        ([], "scout_worlds: the following arguments are required: name, train, epochs, EVAL_SPEC"),
        (["toy", TRAIN, "x", SCORED], "argument epochs: EPOCHS is a whole number of 1 or more, not 'x'"),
        (["toy", TRAIN, "0", SCORED], "EPOCHS is a whole number of 1 or more, not '0'"),
        (["toy", TRAIN, "1", SCORED, "--schedule", "cosin"], "argument --schedule: invalid choice: 'cosin'"),
        (["toy", TRAIN, "1", SCORED, "--lr", "-1"], "need lr > 0"),
        (["toy", "synthetic:nosuch", "1", SCORED], "unknown synthetic domain 'nosuch'"),
        # a misspelt scored world was a traceback once the training had finished
        (["toy", TRAIN, "1", SCORED, "synthetic:mpiii"], "unknown synthetic domain 'mpiii'"),
        (["toy", TRAIN, "1", "synthetic:mpii?sise=16"], "bad option 'sise=16'"),
        (["../toy", TRAIN, "1", SCORED], "NAME '../toy' is not a plain file name"),
    ],
)
def test_a_bad_argument_is_one_line_before_anything_is_rendered(tmp_path, capsys, monkeypatch, argv, says):
    scout = _script()
    monkeypatch.setattr(scout, "open_dataset", lambda spec: pytest.fail(f"opened {spec}"))
    assert says in _refused(scout, argv, tmp_path, capsys)
    assert not any(tmp_path.iterdir())  # nothing made: no run folder, no lock, no record


def test_a_scout_never_replaces_a_record_unasked(tmp_path, capsys, monkeypatch):
    """A scout of a committed NAME on a machine without its run folder trained again and replaced the record."""
    scout = _script()
    monkeypatch.setattr(scout, "create_model", lambda name: create_model("tiny_gaze_net"))
    record = tmp_path / "docs/data/calibration-scout/toy.json"
    record.parent.mkdir(parents=True)
    record.write_text("kept\n")
    monkeypatch.setattr(scout, "open_dataset", lambda spec: pytest.fail(f"opened {spec}"))
    assert "toy.json exists (committed data); choose another NAME, or add --replace" in _refused(
        scout, ["toy", TRAIN, "1", SCORED], tmp_path, capsys
    )
    assert record.read_text() == "kept\n" and not (tmp_path / "runs").exists()
    monkeypatch.undo()
    monkeypatch.setattr(scout, "create_model", lambda name: create_model("tiny_gaze_net"))
    scout.main(["toy", TRAIN, "1", SCORED, "--replace"], tmp_path)
    written = json.loads(record.read_text())
    assert written["command"] == "python scripts/scout_worlds.py " + shlex.join(["toy", TRAIN, "1", SCORED])


def test_a_scout_that_waited_does_not_replace_what_the_first_wrote(tmp_path, capsys, monkeypatch):
    scout = _script()
    monkeypatch.setattr(scout, "open_dataset", lambda spec: pytest.fail(f"opened {spec}"))
    folder = tmp_path / "runs" / "scout" / "toy"
    record = tmp_path / "docs/data/calibration-scout/toy.json"
    codes: list[object] = []

    def second() -> None:
        try:
            scout.main(["toy", TRAIN, "1", SCORED], tmp_path)
        except SystemExit as e:
            codes.append(e.code)

    waiter = threading.Thread(target=second)
    with locked(folder):  # the first scout, which writes its record before it lets go
        starts_and_waits(waiter, folder, capsys, f"waiting for another scout writing {folder}")
        record.parent.mkdir(parents=True)
        record.write_text("the first's\n")
    waiter.join(60)
    assert codes == [2] and "toy.json exists (committed data)" in capsys.readouterr().err
    assert record.read_text() == "the first's\n"


def test_help_and_the_wrong_python_from_the_command_line():
    script = Path(__file__).resolve().parents[1] / "scripts" / "scout_worlds.py"
    shown = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0 and "--replace" in shown.stdout and "EVAL_SPEC" in shown.stdout
    bare = subprocess.run([sys.executable, "-I", "-S", str(script)], capture_output=True, text=True, timeout=120)
    assert bare.returncode == 2 and bare.stderr.count("\n") == 1, bare.stderr
    assert "cannot import" in bare.stderr and "run it with .venv/bin/python" in bare.stderr
