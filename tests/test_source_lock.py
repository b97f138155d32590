"""Two processes needing one source model: the second waits for the first's build under the cache folder's lock,
then loads what it finished, instead of training into the same folder beside it; the same for the bench's other
cached builds (other-rank recoveries, TPGaze's prompts, PnP-GA's snapshots) and its update figure's data."""

import os
import shlex
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from test_gaze_pipeline import FAST, RANK, toy_dataset
from tiny_models import TinyGazeNet  # noqa: F401  (registers tiny_gaze_net)
from waiting import starts_and_waits

from alfa.gaze.pipeline import SourceSpec, build_source_model
from alfa.gaze.train import TruncateConfig
from alfa.locks import locked


def test_locked_says_once_that_it_waits_and_only_when_the_lock_is_held(tmp_path):
    waits, turns = [], []

    def take_turn() -> None:
        with locked(tmp_path / "x", on_wait=lambda holder: waits.append(2)):
            turns.append("second")

    with locked(tmp_path / "x", on_wait=lambda holder: waits.append(1)):
        assert (tmp_path / "x.lock").is_file() and waits == []
        second = threading.Thread(target=take_turn)
        second.start()
        deadline = time.time() + 30
        while not waits and time.time() < deadline:
            time.sleep(0.01)
        assert waits == [2] and second.is_alive() and turns == []  # waiting for this block to end
    second.join(30)
    assert not second.is_alive() and waits == [2] and turns == ["second"]


def hold_in_another_process(path):
    """A process holding ``path``'s :func:`locked` lock until it is killed, once it holds it; and its command line."""
    import alfa

    code = (
        "import sys, time\nfrom alfa.locks import locked\n"
        "with locked(sys.argv[1]):\n    print('held', flush=True)\n    time.sleep(120)"
    )
    argv = [sys.executable, "-c", code, str(path)]
    src = str(Path(alfa.__file__).resolve().parents[1])  # this checkout's alfa, not another one installed
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    holder = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env)
    assert holder.stdout.readline() == "held\n"
    return holder, shlex.join(argv)


def test_one_that_waits_is_told_who_holds_the_lock(tmp_path):
    """A run stuck behind a live holder can tell who it is: its command line and process, from the lock's record."""
    holder, command = hold_in_another_process(tmp_path / "x")
    told, turns = [], []

    def wait_for_it() -> None:
        with locked(tmp_path / "x", on_wait=told.append):
            turns.append("second")

    try:
        waiter = threading.Thread(target=wait_for_it)
        waiter.start()
        deadline = time.time() + 30
        while not told and time.time() < deadline:
            time.sleep(0.01)
        assert len(told) == 1 and told[0].startswith(f"{command!r} (process {holder.pid}, started "), told
        assert turns == []
    finally:
        holder.kill()
        holder.wait()
    waiter.join(30)  # the kernel gave the lock up with the process
    assert not waiter.is_alive() and turns == ["second"]


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
        starts_and_waits(second, folder, capsys, f"waiting for another process building {folder}")
        shutil.copytree(first.cache, folder)  # ... which finishes it
    second.join(60)
    assert not second.is_alive() and len(built) == 1
    assert built[0].from_cache and built[0].cache == folder
    theirs, ours = first.recovered.state_dict(), built[0].recovered.state_dict()
    assert theirs.keys() == ours.keys() and all(torch.equal(theirs[k], ours[k]) for k in theirs)
    assert "waiting" not in capsys.readouterr().err  # said once


def _other_rank(session, src):
    return lambda: session.base(src, "rank=4"), src.models.cache / "rank-4"


def _tpgaze(session, src):
    return lambda: session.tpgaze_prompts(src), session.tpgaze_setup(src)[2]


def _pnpga(session, src):
    from alfa.study.bench.pnpga import ensemble_members

    return lambda: ensemble_members(session, src, 2), src.models.cache / "pnpga-last2"


def _content(path):
    """A file's content; a safetensors file's as its metadata and tensors (the order of its header's metadata is
    not fixed from one write to the next)."""
    if path.suffix != ".safetensors":
        return path.read_bytes()
    with safe_open(str(path), "pt") as f:
        return sorted(f.metadata().items()), [(k, f.get_tensor(k).numpy().tobytes()) for k in sorted(f.keys())]


def _files(folder):
    return sorted((str(p.relative_to(folder)), _content(p)) for p in folder.rglob("*") if p.is_file())


@pytest.mark.parametrize("kind", [_other_rank, _tpgaze, _pnpga], ids=["other-rank", "tpgaze", "pnpga"])
def test_a_cached_bench_build_waits_for_another_process_building_it(tmp_path, capsys, kind):
    """The bench's other cached builds beside the source model (other-rank recoveries, TPGaze's prompts, PnP-GA's
    snapshots) take their folder's lock: a second piece of the benchmark waits for the first, writing nothing
    beside it, then builds under the lock; a later piece reads what was finished instead of training again."""
    from test_bench import tiny

    from alfa.study.bench.session import Session

    session = Session(tiny(), tmp_path, tmp_path / "cache", progress=False)
    build, folder = kind(session, session.build("E", 0))
    second = threading.Thread(target=build)
    with locked(folder):  # another process is building it
        starts_and_waits(second, folder, capsys, f"waiting for another process building {folder}")
    second.join(120)
    assert not second.is_alive() and folder.is_dir()
    written = _files(folder)
    assert written and "waiting" not in capsys.readouterr().err  # said once
    later = Session(tiny(), tmp_path, tmp_path / "cache", progress=False)
    kind(later, later.build("E", 0))[0]()
    assert _files(folder) == written  # read back, not trained again (a rerun of a training would log its times)


def test_two_pieces_adding_their_methods_to_the_update_figure_take_turns(tmp_path, monkeypatch):
    """The update figure's data file is read, added to and rewritten by each record that draws it: a piece of the
    run waits for another one's turn (writing nothing meanwhile), and both methods end up in the file."""
    from types import SimpleNamespace

    from test_bench import tiny

    import alfa.study.bench.figures as figures
    from alfa.study.bench.figures import load_figure_data
    from alfa.study.bench.results import FIGURE_DIR, UPDATES_FILE
    from alfa.study.bench.session import _FigureData

    monkeypatch.setattr(figures, "update_data", lambda base, adapters, layer: ({"p0": torch.ones(2, 2)}, {}))
    data = _FigureData(tiny(), tmp_path)
    src = SimpleNamespace(cache_key="source-key")
    tgt = SimpleNamespace(data=SimpleNamespace(persons=lambda: ["p0"]))

    def add(label: str) -> None:
        plan = SimpleNamespace(variant=SimpleNamespace(label=label), pair="E→M", seed=0)
        data.save_updates(None, src, tgt, plan, tmp_path / label, f"hash-{label}")

    path = tmp_path / FIGURE_DIR / UPDATES_FILE
    pieces = [threading.Thread(target=add, args=(label,)) for label in ("alfa", "lora")]
    with locked(path):
        for piece in pieces:
            piece.start()
        time.sleep(0.5)
        assert all(piece.is_alive() for piece in pieces) and not path.exists()  # waiting for their turns
    for piece in pieces:
        piece.join(30)
    assert not any(piece.is_alive() for piece in pieces)
    tensors, meta = load_figure_data(path)
    assert set(meta["methods"]) == {"alfa", "lora"} and set(tensors) == {"alfa/p0", "lora/p0"}


def test_a_released_lock_names_no_holder(tmp_path):
    """The holder's record is written into the lock file while it holds the lock and cleared when it lets go: a
    waiter that looks between one holder's release and the next one's record names no one, not the previous."""
    import json

    lock = tmp_path / "x.lock"
    with locked(tmp_path / "x"):
        assert json.loads(lock.read_text())["pid"] == os.getpid()
    assert lock.is_file() and lock.read_text() == ""
