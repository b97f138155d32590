"""scripts/scout_worlds.py: a second scout of one name waits for the first one's turn on its run folder instead of
training into it beside it, then re-scores what the first one finished."""

import importlib.util
import json
import threading
from pathlib import Path

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
