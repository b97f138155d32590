"""Two processes needing one source model: the second waits for the first's build under the cache folder's lock,
then loads what it finished, instead of training into the same folder beside it."""

import shutil
import threading
import time

import torch
from test_gaze_pipeline import FAST, RANK, toy_dataset
from tiny_models import TinyGazeNet  # noqa: F401  (registers tiny_gaze_net)

from alfa.fileio import locked
from alfa.gaze.pipeline import SourceSpec, build_source_model
from alfa.gaze.train import TruncateConfig


def test_locked_says_once_that_it_waits_and_only_when_the_lock_is_held(tmp_path):
    waits, turns = [], []

    def take_turn() -> None:
        with locked(tmp_path / "x", on_wait=lambda: waits.append(2)):
            turns.append("second")

    with locked(tmp_path / "x", on_wait=lambda: waits.append(1)):
        assert (tmp_path / "x.lock").is_file() and waits == []
        second = threading.Thread(target=take_turn)
        second.start()
        deadline = time.time() + 30
        while not waits and time.time() < deadline:
            time.sleep(0.01)
        assert waits == [2] and second.is_alive() and turns == []  # waiting for this block to end
    second.join(30)
    assert not second.is_alive() and waits == [2] and turns == ["second"]


def test_a_second_build_of_one_source_model_waits_for_the_first_and_loads_it(tmp_path, capsys):
    source = toy_dataset(6, 12, seed=1, name="src")
    spec = SourceSpec("toy:src", None, "tiny_gaze_net", 0, FAST, TruncateConfig(rank=RANK, recovery=FAST))
    first = build_source_model(spec, source, None, cache_dir=tmp_path / "first", progress=False)
    assert not first.from_cache
    folder = tmp_path / "shared" / first.cache.name  # the same key wherever the cache lies
    built = []
    second = threading.Thread(
        target=lambda: built.append(
            build_source_model(spec, source, None, cache_dir=tmp_path / "shared", progress=False)
        )
    )
    with locked(folder):  # another process is building this model
        second.start()
        err, deadline = "", time.time() + 60
        while "waiting for another process" not in err and second.is_alive() and time.time() < deadline:
            err += capsys.readouterr().err
            time.sleep(0.02)
        assert err.strip() == f"waiting for another process building {folder}"
        assert second.is_alive() and not folder.exists()  # nothing trained or written beside the holder
        shutil.copytree(first.cache, folder)  # ... which finishes it
    second.join(60)
    assert not second.is_alive() and len(built) == 1
    assert built[0].from_cache and built[0].cache == folder
    theirs, ours = first.recovered.state_dict(), built[0].recovered.state_dict()
    assert theirs.keys() == ours.keys() and all(torch.equal(theirs[k], ours[k]) for k in theirs)
    assert "waiting" not in capsys.readouterr().err  # said once
