"""Source training's one-file state: a run killed at any moment resumes to the weights of a run never killed, bit
for bit; an earlier version's pair (``state.pt`` + ``model.safetensors``) is never unpickled: finished, it is read
from its model file alone, else refused; damaged or foreign states are named in one message."""

import os
import re
from dataclasses import replace

import pytest
import torch
from kill_points import Killed, kill_at
from tiny_models import TinyGazeNet  # noqa: F401  (registers tiny_gaze_net)

import alfa
from alfa.checkpoint import CheckpointError, load_model, load_optimizer_tensors, read_checkpoint, read_tagged
from alfa.gaze import train, train_state
from alfa.gaze.data.base import InMemoryGazeDataset
from alfa.gaze.train import TrainConfig, train_source
from alfa.gaze.train_state import LEGACY_STATE_FILE, MODEL_FILE, STATE_FILE, STATE_FORMAT

CONFIG = TrainConfig(epochs=3, batch_size=8, lr=1e-3, val_fraction=0.25)


def _data() -> InMemoryGazeDataset:
    g = torch.Generator().manual_seed(0)
    persons, images = 4, 8
    pixels = torch.randint(0, 256, (persons * images, 3, 16, 16), dtype=torch.uint8, generator=g)
    gaze = (torch.rand(persons * images, 2, generator=g) - 0.5) * 0.5
    ids = torch.arange(persons).repeat_interleave(images)
    return InMemoryGazeDataset(pixels, gaze, ids, [f"p{i}" for i in range(persons)], name="toy")


def _run(out, config=CONFIG, seed=0, inside_every_s=train_state.INSIDE_EPOCH_EVERY_S):
    torch.manual_seed(seed)  # the initial weights; a resumed run must take every weight from its files instead
    model = alfa.models.create_model("tiny_gaze_net")
    result = train_source(
        model, _data(), config, out, model_name="tiny_gaze_net", progress=False, inside_epoch_every_s=inside_every_s
    )
    return model, result


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """An uninterrupted run of CONFIG: its model, result and model file's header. One thread for the module's runs
    while it is in use (the same bits in every run compared with it), the thread count put back after."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("straight")
    model, result = _run(out)
    yield model, result, read_checkpoint(out / MODEL_FILE)[1]
    torch.set_num_threads(threads)


def _same_run(straight, model, result, out) -> None:
    """Same weights (in memory and in the model file), same history but for the seconds, same header."""
    first, first_result, first_header = straight
    for (name, a), b in zip(first.state_dict().items(), model.state_dict().values()):
        assert torch.equal(a, b), name
    saved, header = load_model(out / MODEL_FILE)
    for (name, a), b in zip(first.state_dict().items(), saved.state_dict().values()):
        assert torch.equal(a, b), name

    def timeless(history):
        return [{k: v for k, v in e.items() if k != "seconds"} for e in history]

    assert timeless(result.history) == timeless(first_result.history)
    assert timeless(header["extra"].pop("history")) == timeless(first_header["extra"]["history"])
    assert {k: v for k, v in first_header["extra"].items() if k != "history"} == header["extra"]
    assert not (out / LEGACY_STATE_FILE).exists()
    assert not [p.name for p in out.iterdir() if ".tmp" in p.name]  # no half-written file left


# (where the kill comes, the how-manieth call it comes at) with 3 epochs of 3 steps
KILLS = {
    "in an epoch, after the last state": (train, "_train_step", 5),
    "in writing the second state": (train_state, "write_tagged", 2),
    "between the second state and its model file": (train_state, "save_model", 2),
    "between the last state and its model file": (train_state, "save_model", 3),
}


@pytest.mark.parametrize("kill", list(KILLS))
def test_a_run_killed_anywhere_resumes_to_the_weights_of_a_run_never_killed(tmp_path, monkeypatch, straight, kill):
    module, name, call = KILLS[kill]
    with monkeypatch.context() as m:
        kill_at(m, module, name, call)
        with pytest.raises(Killed):
            _run(tmp_path)
    done = read_tagged(tmp_path / STATE_FILE, STATE_FORMAT, "a state")[1]["epoch"]
    assert done == {"_train_step": 1, "write_tagged": 1, "save_model": call}[name]
    model, result = _run(tmp_path, seed=1)
    assert result.resumed_from_epoch == done
    _same_run(straight, model, result, tmp_path)


# with a state after every step but an epoch's last: (where the kill comes, the how-manieth call, the state then
# kept: whole epochs and steps of the next one). Each step's state is write_tagged's call: two per epoch, then the
# epoch's own.
KILLS_INSIDE = {
    "in the first epoch, before any model file": (train, "_train_step", 3, (0, 2)),
    "in writing a state inside the first epoch": (train_state, "write_tagged", 2, (0, 1)),
    "in the second epoch, after a state inside it": (train, "_train_step", 5, (1, 1)),
    "in the last epoch, after its last state inside": (train, "_train_step", 9, (2, 2)),
}


@pytest.mark.parametrize("kill", list(KILLS_INSIDE))
def test_a_run_killed_inside_an_epoch_resumes_from_the_step_its_state_holds(tmp_path, monkeypatch, straight, kill):
    """A state written inside an epoch (every step here) keeps what a kill there would lose: the resumed run skips
    the steps it holds and ends with the weights, history (loss sums included) and model file of a run never
    killed. The model file stays the last whole epoch's meanwhile: none before the first epoch ends."""
    module, name, call, (epochs, steps) = KILLS_INSIDE[kill]
    with monkeypatch.context() as m:
        kill_at(m, module, name, call)
        with pytest.raises(Killed):
            _run(tmp_path, inside_every_s=0.0)
    meta = read_tagged(tmp_path / STATE_FILE, STATE_FORMAT, "a state")[1]
    assert (meta["epoch"], meta["epoch_steps"], meta["complete"]) == (epochs, steps, False)
    assert len(meta["epoch_sums"]) == 3 and meta["epoch_sums"][0] > 0
    if epochs == 0:
        assert not (tmp_path / MODEL_FILE).exists()
        with monkeypatch.context() as m:  # resumed, then killed again at once: still no model file of those weights
            kill_at(m, train, "_train_step", 1)
            with pytest.raises(Killed):
                _run(tmp_path, inside_every_s=0.0)
        assert not (tmp_path / MODEL_FILE).exists()
    else:
        assert read_checkpoint(tmp_path / MODEL_FILE, header_only=True)[1]["extra"]["epoch"] == epochs
    model, result = _run(tmp_path, seed=1, inside_every_s=0.0)
    assert result.resumed_from_epoch == epochs
    _same_run(straight, model, result, tmp_path)
    assert "epoch_steps" not in read_tagged(tmp_path / STATE_FILE, STATE_FORMAT, "a state")[1]


def test_a_cosine_run_killed_inside_an_epoch_resumes_with_each_steps_own_rate(tmp_path, monkeypatch):
    """Each step's rate comes from its place in the run: the steps after the kill must get the rates an
    uninterrupted run gives them (under the constant schedule of the other tests, any place gives the same)."""
    cosine = replace(CONFIG, schedule="cosine")
    first, straight_result = _run(tmp_path / "straight", cosine)
    with monkeypatch.context() as m:
        kill_at(m, train, "_train_step", 5)
        with pytest.raises(Killed):
            _run(tmp_path / "killed", cosine, inside_every_s=0.0)
    model, result = _run(tmp_path / "killed", cosine, seed=1, inside_every_s=0.0)
    assert result.resumed_from_epoch == 1
    for (name, a), b in zip(first.state_dict().items(), model.state_dict().values()):
        assert torch.equal(a, b), name


def test_a_state_inside_an_epoch_continues_only_in_one_process_and_within_the_epoch(tmp_path):
    """Its loss sums and steps are one process's: under torchrun every rank would add the sums again (and its batches
    drop a short last one), so it is refused in one line; a step count past the epoch's end is a damaged state."""
    refuse = train._refuse_steps_that_do_not_fit
    refuse(tmp_path, 0, 3, 3, 2)  # a state after a whole epoch: any number of processes
    refuse(tmp_path, 2, 0, 3, 1)
    with pytest.raises(CheckpointError, match="inside epoch 1 by a run of one process: finish that epoch with one"):
        refuse(tmp_path, 2, 0, 3, 2)
    with pytest.raises(CheckpointError, match="says 3 steps of epoch 1 are done, of the 3 it has"):
        refuse(tmp_path, 3, 0, 3, 1)


def test_no_state_is_written_inside_an_epoch_before_it_is_due(tmp_path, monkeypatch):
    """States inside an epoch come every ``inside_epoch_every_s`` seconds, not every step: with the default, a run
    this short writes one state per epoch, as before."""
    written = []
    real = train_state.write_tagged
    monkeypatch.setattr(
        train_state, "write_tagged", lambda path, t, f, meta: written.append(meta) or real(path, t, f, meta)
    )
    _run(tmp_path)
    assert [(m["epoch"], "epoch_steps" in m) for m in written] == [(1, False), (2, False), (3, False)]


def test_a_state_inside_the_last_epoch_gives_the_whole_epochs_model_when_no_more_are_asked(tmp_path, monkeypatch):
    """Killed inside epoch 2, then asked for 1 epoch: the model returned is epoch 1's (its model file), not the
    half-trained weights of the state."""
    with monkeypatch.context() as m:
        kill_at(m, train, "_train_step", 5)
        with pytest.raises(Killed):
            _run(tmp_path, inside_every_s=0.0)
    saved, _ = load_model(tmp_path / MODEL_FILE)
    model, result = _run(tmp_path, replace(CONFIG, epochs=1), seed=1)
    assert result.resumed_from_epoch == 1
    for (name, a), b in zip(saved.state_dict().items(), model.state_dict().values()):
        assert torch.equal(a, b), name


@pytest.mark.parametrize(
    "entries", [{"epoch_steps": -1}, {"epoch_steps": 1.5}, {"epoch_sums": [1.0]}, {"epoch_seconds": "soon"}]
)
def test_a_state_whose_steps_inside_an_epoch_are_not_a_runs_is_named(tmp_path, monkeypatch, entries):
    """A header whose steps, sums or seconds inside an epoch no run writes is refused in one message, not trusted."""
    from alfa.checkpoint import write_tagged

    with monkeypatch.context() as m:
        kill_at(m, train, "_train_step", 5)
        with pytest.raises(Killed):
            _run(tmp_path, inside_every_s=0.0)
    tensors, meta = read_tagged(tmp_path / STATE_FILE, STATE_FORMAT, "a state")
    write_tagged(tmp_path / STATE_FILE, tensors, STATE_FORMAT, {**meta, **entries})
    with pytest.raises(CheckpointError, match="epoch_steps, epoch_sums or epoch_seconds is not what a training run"):
        _run(tmp_path)


def test_an_epoch_is_saved_before_its_line_says_it_is_done(tmp_path, monkeypatch, straight):
    """The line "pretrain epoch k/N: loss …" was printed before epoch k's state was written: a Ctrl-C right after
    it lost the epoch (the first one: the whole --out folder) though the line said it was done. The line, unchanged,
    now follows the save, and a run stopped right after it resumes from that epoch to the same weights."""
    said = []

    class Saying(train.tqdm):
        @classmethod
        def write(cls, s, *args, **kwargs):
            said.append(s)
            if s.startswith("pretrain epoch 2/"):
                raise Killed  # a Ctrl-C as the line appears

    monkeypatch.setattr(train, "tqdm", Saying)
    torch.manual_seed(0)
    model = alfa.models.create_model("tiny_gaze_net")
    with pytest.raises(Killed):
        train_source(model, _data(), CONFIG, tmp_path, model_name="tiny_gaze_net", progress=True)
    assert [s.split(":")[0] for s in said] == ["pretrain epoch 1/3", "pretrain epoch 2/3"]
    assert re.fullmatch(r"pretrain epoch 1/3: loss \d+\.\d{4}, val error \d+\.\d{2} deg \(\d+ s\)", said[0])
    assert read_tagged(tmp_path / STATE_FILE, STATE_FORMAT, "a state")[1]["epoch"] == 2
    monkeypatch.undo()
    model, result = _run(tmp_path, seed=1)
    assert result.resumed_from_epoch == 2
    _same_run(straight, model, result, tmp_path)


def _legacy_pair(out, epoch_claimed=None) -> None:
    """Turn the new state of ``out`` into what an earlier version left: ``state.pt`` (``torch.save`` of the epoch
    and the optimizer's state dict) beside the model file, no ``state.safetensors``."""
    tensors, meta = read_tagged(out / STATE_FILE, STATE_FORMAT, "a state")
    model = alfa.models.create_model("tiny_gaze_net")
    optimizer = torch.optim.Adam(model.parameters(), lr=CONFIG.lr)
    load_optimizer_tensors(optimizer, tensors, "optimizer")
    epoch = meta["epoch"] if epoch_claimed is None else epoch_claimed
    torch.save({"epoch": epoch, "optimizer": optimizer.state_dict()}, out / LEGACY_STATE_FILE)
    (out / STATE_FILE).unlink()


def _no_unpickling(monkeypatch) -> None:
    def refused(*args, **kwargs):
        raise AssertionError("torch.load was called: this alfa never unpickles")

    monkeypatch.setattr(torch, "load", refused)


def test_a_legacy_pair_that_would_train_on_is_refused_unread_and_left_as_it_was(tmp_path, monkeypatch):
    """An earlier version's unfinished pair: only its optimizer state, a pickle, continues it exactly, and this alfa
    never unpickles (it read it with torch.load(weights_only=True)): one line, nothing read, nothing changed."""
    _run(tmp_path, replace(CONFIG, epochs=1))
    _legacy_pair(tmp_path)
    files = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    _no_unpickling(monkeypatch)
    with pytest.raises(CheckpointError, match=r"a run of an earlier version at epoch 1 of the 3 asked for.*pickle"):
        _run(tmp_path)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == files


def test_a_finished_legacy_pair_is_read_from_its_model_file_alone(tmp_path, monkeypatch):
    """A finished run of an earlier version (a benchmark's cached source) is found complete without its pickle;
    its files are left byte for byte."""
    config = replace(CONFIG, epochs=1)
    first, _ = _run(tmp_path, config)
    _legacy_pair(tmp_path)
    files = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    _no_unpickling(monkeypatch)
    model, result = _run(tmp_path, config, seed=1)
    assert result.resumed_from_epoch == 1 and {p.name: p.read_bytes() for p in tmp_path.iterdir()} == files
    assert all(torch.equal(a, b) for a, b in zip(first.state_dict().values(), model.state_dict().values()))


def test_a_damaged_or_foreign_state_is_named_in_one_message(tmp_path):
    """A cut-short new state and an earlier version's state.pt that is cut short, foreign (torch's error would
    suggest weights_only=False) or holds no optimizer state: each is a CheckpointError naming the file; a state
    of another run is refused as such, and its files stay."""
    one = replace(CONFIG, epochs=1)
    _run(tmp_path, one)
    state = tmp_path / STATE_FILE
    good = state.read_bytes()
    state.write_bytes(good[: len(good) // 2])
    with pytest.raises(CheckpointError, match=f"{STATE_FILE}: not a readable safetensors file"):
        _run(tmp_path)
    state.write_bytes(good)
    said = f"{STATE_FILE} is a checkpoint of another run \\(training config \\(the checkpoint's vs this run's\\): "
    with pytest.raises(CheckpointError, match=said + "lr 0.001 vs 0.5\\);"):
        _run(tmp_path, replace(CONFIG, lr=0.5))
    # a later field at its default is left out of the saved config: said as such, not as '(none)'
    with pytest.raises(CheckpointError, match=said + "precision its default vs 'bf16'\\);"):
        _run(tmp_path, replace(CONFIG, precision="bf16"))
    assert state.read_bytes() == good
    _legacy_pair(tmp_path)
    (tmp_path / LEGACY_STATE_FILE).unlink()  # a model file with no state at all: no run can continue it
    with pytest.raises(CheckpointError, match=f"{MODEL_FILE} is there without the training state"):
        _run(tmp_path)


def test_run_files_follow_the_umask(tmp_path):
    """safetensors writes its files 0o600; the atomic writer gives them a new file's mode, 0o666 less the umask."""
    old = os.umask(0o027)
    try:
        _run(tmp_path, replace(CONFIG, epochs=1))
    finally:
        os.umask(old)
    modes = {p.name: p.stat().st_mode & 0o777 for p in tmp_path.iterdir()}
    assert modes == {STATE_FILE: 0o640, MODEL_FILE: 0o640}


def test_fp16_s_gradient_scaler_comes_back_from_the_state(tmp_path, monkeypatch):
    """The scale (and its growth tracker) a resumed fp16 run continues with is the one saved, not a new scaler's."""
    from alfa.checkpoint import write_tagged

    config = replace(CONFIG, epochs=1, precision="fp16")
    _run(tmp_path, config)
    tensors, meta = read_tagged(tmp_path / STATE_FILE, STATE_FORMAT, "a state")
    meta["grad_scaler"].update(scale=1024.0, _growth_tracker=7)  # as after overflows, many steps in
    write_tagged(tmp_path / STATE_FILE, tensors, STATE_FORMAT, meta)
    real, made = train.grad_scaler, []
    monkeypatch.setattr(train, "grad_scaler", lambda *args: made.append(real(*args)) or made[-1])
    _run(tmp_path, config)
    assert made[0].get_scale() == 1024.0 and made[0].state_dict()["_growth_tracker"] == 7
