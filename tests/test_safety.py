"""Issue 29, items 1, 2, 3 and 5: inputs are never outputs and only listed files are replaced, no non-finite
state is kept silently, evaluation cannot score what it should not, and one error net for the file system
(disk full, symbolic-link loops, ports in use): one line naming the path, exit 2, nothing half-written."""

import errno
import json
import subprocess
import sys

import pytest
import torch
from safetensors import SafetensorError
from tiny_models import TinyGazeNet  # noqa: F401  (registers tiny_gaze_net)

import alfa
from alfa.checkpoint import load_model, read_checkpoint, read_tagged, save_model
from alfa.cli import error_line, main
from alfa.fileio import atomic_path
from alfa.gaze.data.base import InMemoryGazeDataset
from alfa.gaze.personalize import PersonalizeConfig, listed_files, personalize_dataset
from alfa.gaze.train import TrainConfig, train_source
from alfa.gaze.train_state import STATE_FILE, STATE_FORMAT

DISK_FULL = "Error while serializing: I/O error: No space left on device (os error 28)"  # safetensors' words


def _dataset(persons=2, images=8, size=16, name="toy"):
    g = torch.Generator().manual_seed(0)
    pixels = torch.randint(0, 256, (persons * images, 3, size, size), dtype=torch.uint8, generator=g)
    gaze = (torch.rand(persons * images, 2, generator=g) - 0.5) * 0.5
    ids = torch.arange(persons).repeat_interleave(images)
    return InMemoryGazeDataset(pixels, gaze, ids, [f"p{i}" for i in range(persons)], name=name)


def _base(folder, size=32):
    """A truncated tiny checkpoint trained (nominally) on ``size``-pixel images."""
    model = alfa.models.create_model("tiny_gaze_net").eval()
    alfa.truncate(model, 4)
    return save_model(folder / "base.safetensors", model, "tiny_gaze_net", input_size=(size, size))


def _one_line(capsys, *words):
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    for word in words:
        assert word in err, err
    return err


def _leftovers(folder):
    return sorted(p.name for p in folder.rglob("*") if ".tmp" in p.name)


# ----------------------------------------------------------------------------- item 5: one error net


def test_a_writer_that_fails_on_a_full_disk_names_the_path_and_leaves_nothing(tmp_path):
    target = tmp_path / "model.safetensors"
    target.write_bytes(b"the earlier file")
    with pytest.raises(OSError) as caught, atomic_path(target) as tmp:
        tmp.write_bytes(b"half a fi")
        raise SafetensorError(DISK_FULL)
    assert caught.value.errno == errno.ENOSPC and caught.value.filename == str(target)
    assert target.read_bytes() == b"the earlier file" and _leftovers(tmp_path) == []
    with pytest.raises(ValueError, match="not a file system error"), atomic_path(target):
        raise ValueError("not a file system error")  # anything else passes through as it was


@pytest.mark.parametrize(
    "error, words",
    [
        (OSError(errno.ENOSPC, "No space left on device", "/data/out/p1.safetensors"), ("/data/out/p1", "free some")),
        (OSError(errno.ELOOP, "Too many levels of symbolic links", "/data/loop"), ("/data/loop", "points back")),
        (OSError(errno.EADDRINUSE, "Address already in use"), ("Address already in use", "another --port")),
        (OSError(errno.EFBIG, "File too large", "/data/f1/state.safetensors"), ("f1/state.safetensors", "ulimit -f")),
        (FileNotFoundError("--adapters x: no such folder"), ("--adapters x: no such folder",)),
        (RuntimeError("first line\n  second line"), ("first line (...)",)),
    ],
)
def test_an_error_is_one_line_that_names_the_path_and_what_to_do(error, words):
    line = error_line(error)
    assert "\n" not in line and all(w in line for w in words), line


@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_FSIZE as Linux sets it")
def test_a_file_over_the_file_size_limit_says_what_to_do(tmp_path):
    """Under ``ulimit -f`` a write stops with EFBIG ("File too large"; Python ignores the SIGXFSZ that would kill
    it): the line names the file and says to raise the limit, and no half-written file is left."""
    code = (
        "import resource, sys\n"
        "from alfa.cli import error_line\n"
        "from alfa.fileio import write_text\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))\n"
        "try:\n"
        "    write_text(sys.argv[1], 'x' * 100000)\n"
        "except OSError as e:\n"
        "    print(error_line(e))\n"
    )
    target = tmp_path / "state.json"
    run = subprocess.run([sys.executable, "-c", code, str(target)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    line = run.stdout.strip()
    assert str(target) in line and "File too large" in line and "ulimit -f" in line, line
    assert list(tmp_path.iterdir()) == []


def test_a_full_disk_during_personalize_stops_in_one_line_and_keeps_what_was_done(tmp_path, capsys, monkeypatch):
    import safetensors.torch

    base, out = _base(tmp_path, size=16), tmp_path / "adapters"
    data = "synthetic:mpii?size=16&persons=2&images_per_person=6"
    argv = ["personalize", "--checkpoint", str(base), "--data", data, "--out", str(out), "--steps", "1", "--quiet"]
    argv += ["--adapter-rank", "4"]  # within the base's d = 4
    real, saves = safetensors.torch.save_file, []  # what alfa.fileio.write_safetensors calls

    def fills_the_disk(tensors, path, metadata=None):  # the first adapter is written, the second finds it full
        saves.append(path)
        if len(saves) > 1:
            open(path, "wb").write(b"half")
            raise SafetensorError(DISK_FULL)
        real(tensors, path, metadata=metadata)

    monkeypatch.setattr(safetensors.torch, "save_file", fills_the_disk)
    assert main(argv) == 2
    _one_line(capsys, "p01.safetensors: No space left on device: free some space")
    assert sorted(p.name for p in out.iterdir()) == ["p00.json", "p00.safetensors", "personalization.json"]
    assert {"p00.safetensors", "p01.safetensors"} <= listed_files(out)  # p01 listed before it was begun
    monkeypatch.setattr(safetensors.torch, "save_file", real)
    assert main(argv) == 0 and "1 done, 1 already there, 0 failed" in capsys.readouterr().out


def test_a_full_disk_during_export_is_one_line_and_leaves_no_file(tmp_path, capsys, monkeypatch):
    pytest.importorskip("onnxscript")

    class OnTheFullDisk:  # the exported program, whose save finds the disk full
        def save(self, path):
            open(path, "wb").write(b"half an onnx file")
            raise RuntimeError("export failed") from OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch.onnx, "export", lambda *args, **kwargs: OnTheFullDisk())
    base, out = _base(tmp_path), tmp_path / "gaze.onnx"
    assert main(["export", "--checkpoint", str(base), "--out", str(out)]) == 2
    _one_line(capsys, f"{out}: No space left on device")
    assert not out.exists() and _leftovers(tmp_path) == []


def test_a_full_disk_during_evaluate_json_is_one_line_and_leaves_no_file(tmp_path, capsys, monkeypatch):
    import alfa.fileio

    def fills_the_disk(path, data):  # what os.write says on a full disk: no file name
        with alfa.fileio.atomic_path(path) as tmp:
            tmp.write_bytes(data[:7])
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(alfa.fileio, "write_bytes", fills_the_disk)
    base, report = _base(tmp_path, size=16), tmp_path / "reports" / "e.json"
    data = "synthetic:mpii?size=16&persons=2&images_per_person=6"
    assert main(["evaluate", "--checkpoint", str(base), "--data", data, "--json", str(report), "--quiet"]) == 2
    _one_line(capsys, f"{report}: No space left on device: free some space")
    assert not report.exists() and _leftovers(tmp_path) == []


@pytest.mark.parametrize("command", [["export", "--out", "{loop}/gaze.onnx"], ["evaluate", "--json", "{loop}/e.json"]])
def test_a_symbolic_link_loop_is_one_line(tmp_path, capsys, command):
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    base = _base(tmp_path)
    argv = [command[0], "--checkpoint", str(base), "--data", "synthetic:mpii", *command[1:]]
    if command[0] == "export":
        argv.remove("--data"), argv.remove("synthetic:mpii")
    assert main([a.format(loop=loop) for a in argv]) == 2
    _one_line(capsys, f"{loop}/", "Too many levels of symbolic links: a symbolic link there points back into itself")


# ----------------------------------------------------------------------------- item 2: no silent non-finite state


def test_saving_refuses_non_finite_weights_and_writes_nothing(tmp_path):
    model = alfa.models.create_model("tiny_gaze_net")
    with torch.no_grad():
        model.fc.weight[0, 0] = float("nan")
    with pytest.raises(FloatingPointError, match=r"1 of \d+ tensors hold NaN or infinite values \(fc.weight\)"):
        save_model(tmp_path / "model.safetensors", model, "tiny_gaze_net")
    assert list(tmp_path.iterdir()) == []


def test_training_that_goes_non_finite_stops_at_its_step_and_keeps_the_last_good_checkpoint(tmp_path, monkeypatch):
    import alfa.gaze.train as train

    data, out = _dataset(persons=3, images=8), tmp_path / "run"
    config = TrainConfig(epochs=2, batch_size=8, lr=1e-3, val_fraction=0.0)
    real, steps = train._train_step, []

    def breaks_in_the_second_epoch(model, *args, **kwargs):
        terms = real(model, *args, **kwargs)
        steps.append(1)
        if len(steps) == 5:  # 3 steps an epoch: the second step of epoch 2
            with torch.no_grad():
                model.fc.weight.fill_(float("inf"))
        return terms

    monkeypatch.setattr(train, "_train_step", breaks_in_the_second_epoch)
    model = alfa.models.create_model("tiny_gaze_net")
    with pytest.raises(FloatingPointError) as caught:
        train_source(model, data, config, out, model_name="tiny_gaze_net", progress=False)
    message = str(caught.value)
    assert "weights went NaN or infinite in 1 tensors (fc.weight), at step 5 of 6" in message
    assert f"stopped, the checkpoint of epoch 1 in {out} is kept" in message
    _, saved = read_checkpoint(out / "model.safetensors")
    state = read_tagged(out / STATE_FILE, STATE_FORMAT, "a source-training state")[1]
    assert saved["extra"]["epoch"] == 1 and state["epoch"] == 1
    load_model(out / "model.safetensors")  # finite: it loads


def test_a_training_state_no_run_of_the_folder_wrote_is_never_replaced(tmp_path):
    """A lone ``state.pt`` (no model beside it, so no run of this folder wrote it) is refused, not overwritten;
    the same folder with the run's own two files resumes."""
    from alfa.checkpoint import CheckpointError

    data, out = _dataset(persons=3, images=8), tmp_path / "run"
    out.mkdir()
    (out / "state.pt").write_bytes(b"someone else's")
    config = TrainConfig(epochs=1, batch_size=8, lr=1e-3, val_fraction=0.0)
    with pytest.raises(CheckpointError, match="state.pt is there without the model.safetensors a run writes"):
        train_source(alfa.models.create_model("tiny_gaze_net"), data, config, out, model_name="tiny_gaze_net",
                     progress=False)  # fmt: skip
    assert (out / "state.pt").read_bytes() == b"someone else's" and not (out / "model.safetensors").exists()
    (out / "state.pt").unlink()
    train_source(
        alfa.models.create_model("tiny_gaze_net"), data, config, out, model_name="tiny_gaze_net", progress=False
    )
    train_source(
        alfa.models.create_model("tiny_gaze_net"), data, config, out, model_name="tiny_gaze_net", progress=False
    )


# ----------------------------------------------------------------------------- numeric options, sizes


@pytest.mark.parametrize(
    "option, message",
    [
        (["--lr", "1e39"], "--lr: must be at most 1e+30 (the weights are float32, and the optimizer scales the"),
        (["--lr", "1e37"], "--lr: must be at most 1e+30"),  # ×10 twice in the optimizer: it overflowed float32
        (["--lr=-inf"], "--lr: must be a finite number"),
        (["--symmetry-weight", "nan"], "--symmetry-weight: must be a finite number"),
        (["--epochs", "0"], "--epochs: must be at least 1"),
        (["--val-fraction", "1"], "--val-fraction: must be at least 0 and below 1, got 1"),
        (["tpgaze", "--inner-steps", "0"], "--inner-steps: must be at least 1"),
        (["tpgaze", "--val-fraction", "nan"], "--val-fraction: must be a finite number"),
        (["export", "--image-size", "100000", "100000"], "--image-size: at most 4096 pixels"),
        (["export", "--tolerance", "-1"], "--tolerance: must be at least 0"),
    ],
)
def test_options_say_their_bound(capsys, option, message):
    command = {
        "tpgaze": ["tpgaze", "meta-train", "--checkpoint", "c", "--data", "synthetic:eth"],
        "export": ["export", "--checkpoint", "c", "--out", "x.onnx"],
    }.get(option[0], ["pretrain", "--data", "synthetic:eth", option[0]])
    with pytest.raises(SystemExit) as exit_:
        main([*command, *option[1:]])
    assert exit_.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize(
    "option, said",
    [
        # Alfa's rank acts on each layer's dictionary: its bound is the largest d, not the layer's (32), which a
        # rank of 8 would then meet as another bound
        (["--adapter-rank", "100000"], ("rank 100000 is larger than the dictionary of every layer", "at most 4")),
        (["--heads", "100000"], ("100000 is larger than every layer it adapts", "at most 32")),
    ],
)
def test_a_rank_larger_than_every_layer_is_refused_at_once(tmp_path, capsys, option, said):
    base = _base(tmp_path)
    argv = ["personalize", "--checkpoint", str(base), "--data", "no-such-spec:x", "--out", str(tmp_path / "a")]
    assert main([*argv, *option]) == 2  # before the data is opened (its spec here is not even valid)
    _one_line(capsys, *said)
    assert not (tmp_path / "a").exists()


# ----------------------------------------------------------------------------- item 1: only listed files replaced


def test_a_file_no_run_listed_is_never_replaced_even_with_replace(tmp_path, capsys):
    model, _ = load_model(_base(tmp_path, size=16))
    out = tmp_path / "adapters"
    out.mkdir()
    (out / "p1.safetensors").write_bytes(b"someone else's file, named like person p1's adapter")
    config = PersonalizeConfig(steps=1, n_adapt=3)
    with pytest.raises(ValueError, match="holds p1.safetensors, which no personalization run there wrote"):
        personalize_dataset(model, _dataset(), alfa.AlfaConfig(heads=2, rank=2), config, out, progress=False)
    assert sorted(p.name for p in out.iterdir()) == ["p1.safetensors"]  # nothing written, nothing removed
    (out / "personalization.json").write_text(json.dumps({"persons": {"p0": {}}, "written": ["p0.safetensors"]}))
    (out / "p0.safetensors").write_bytes(b"p0's adapter, listed")
    from alfa.cli.guards import remove_listed

    remove_listed(out)  # what --replace does: the listed files go, the other stays
    assert sorted(p.name for p in out.iterdir()) == ["p1.safetensors"]
    (out / "personalization.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="is not a personalization record alfa wrote"):
        listed_files(out)


@pytest.mark.parametrize(
    "outputs, message",
    [
        (["--out", "{other}"], "--out {other} is a model or adapter file, which this command would replace"),
        (["--out", "{onnx}", "--program", "{onnx}"], "--program {onnx} is also this command's --out"),
    ],
)
def test_a_file_output_never_replaces_a_model_nor_another_output(tmp_path, capsys, outputs, message):
    base, other = _base(tmp_path), tmp_path / "someone-elses.safetensors"
    other.write_bytes(b"a model that is no input of this command")
    names = {"other": str(other), "onnx": str(tmp_path / "gaze.onnx")}
    assert main(["export", "--checkpoint", str(base), *(o.format(**names) for o in outputs)]) == 2
    _one_line(capsys, message.format(**names))
    assert other.read_bytes() == b"a model that is no input of this command"
    assert not (tmp_path / "gaze.onnx").exists()


@pytest.mark.parametrize(
    "argv, said",
    [
        (["--out", "runs/cache"], "--cache-dir runs/cache (its default) is also this command's --out runs/cache"),
        (["--out", "x", "--cache-dir=x"], "--cache-dir x is also this command's --out x"),
    ],
)
def test_two_outputs_on_one_path_are_named_saying_which_came_by_default(tmp_path, monkeypatch, capsys, argv, said):
    """``alfa demo --out runs/cache`` named --cache-dir, which the person never typed: the line says it is the
    option's default."""
    monkeypatch.chdir(tmp_path)
    assert main(["demo", *argv]) == 2
    _one_line(capsys, f"alfa demo: error: {said}: name two paths")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("out", ["{root}", "{root}/.."])
def test_an_output_is_never_the_data_nor_a_folder_holding_it(tmp_path, capsys, out):
    root = tmp_path / "data" / "mpii"
    (root / "Label").mkdir(parents=True)
    base = _base(tmp_path)
    spec = f"gazehub:mpiifacegaze:{root}"
    assert main(["personalize", "--checkpoint", str(base), "--data", spec, "--out", out.format(root=root)]) == 2
    _one_line(capsys, "this command's --data")
    assert sorted(p.name for p in (tmp_path / "data").rglob("*")) == ["Label", "mpii"]


# ----------------------------------------------------------------------------- item 3: evaluation


@pytest.mark.parametrize(
    "label, flip, message",
    [
        ("source-only", [], "--label 'source-only' is the name of the source-only column"),
        ("flip-TTA", ["--flip-tta"], "--label 'flip-TTA' is the name of the flip-TTA column"),
        (" ", [], "--label: the adapted column needs a name"),
        ("", [], "--label: the adapted column needs a name"),  # not taken for no --label (the default's name)
    ],
)
def test_evaluate_column_labels_cannot_collide(tmp_path, capsys, label, flip, message):
    base = _base(tmp_path)
    assert main(["evaluate", "--checkpoint", str(base), "--data", "synthetic:mpii", "--label", label, *flip]) == 2
    _one_line(capsys, message)


def test_truncate_refuses_data_of_another_size_than_the_checkpoints(tmp_path, capsys):
    model = alfa.models.create_model("tiny_gaze_net")
    base = save_model(tmp_path / "dense.safetensors", model, "tiny_gaze_net", input_size=(32, 32))
    out = tmp_path / "truncated"
    data = "synthetic:eth?size=48&persons=2&images_per_person=2"
    assert main(["truncate", "--checkpoint", str(base), "--data", data, "--out", str(out), "--rank", "4"]) == 2
    _one_line(capsys, "was trained on 32×32 images", "has 48×48")
    assert not out.exists()


def test_a_writer_pointed_at_a_folder_names_it_and_not_a_temporary_file(tmp_path):
    from alfa.fileio import write_text

    (tmp_path / "out").mkdir()
    with pytest.raises(IsADirectoryError) as caught:
        write_text(tmp_path / "out", "x")
    assert caught.value.filename == str(tmp_path / "out") and ".tmp" not in error_line(caught.value)
    assert list((tmp_path / "out").iterdir()) == [] and sorted(p.name for p in tmp_path.iterdir()) == ["out"]


@pytest.mark.parametrize("new", [False, True], ids=["replaced", "new file"])
def test_an_atomic_write_is_on_the_disk_before_its_rename(tmp_path, monkeypatch, new):
    """The atomic writer renamed its temporary file over the target without an fsync: whole after a kill, but a
    power loss could leave the target empty or cut short. Now the file's data is synced (whole: its size is all
    of it) before the rename or link, and the folder after it; what is written is the same."""
    import os
    import stat

    from alfa.fileio import new_files, write_json, write_text

    events = []
    real_fsync, real_replace, real_link = os.fsync, os.replace, os.link

    def fsync(fd):
        status = os.fstat(fd)
        events.append(("fsync", "folder" if stat.S_ISDIR(status.st_mode) else status.st_size))
        real_fsync(fd)

    def renamed(real):
        def rename(source, target, *args, **kwargs):
            events.append(("rename", os.path.basename(target)))
            return real(source, target, *args, **kwargs)

        return rename

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", renamed(real_replace))
    monkeypatch.setattr(os, "link", renamed(real_link))
    target = tmp_path / "a.txt"
    if not new:
        target.write_text("old")
    with new_files([target] if new else []):
        write_text(target, "hello")
    assert events == [("fsync", 5), ("rename", "a.txt"), ("fsync", "folder")]
    assert target.read_text() == "hello" and sorted(p.name for p in tmp_path.iterdir()) == ["a.txt"]
    events.clear()
    write_json(tmp_path / "sub" / "b.json", {"x": 1})  # a folder it makes; the JSON as ever
    assert [e[0] for e in events] == ["fsync", "rename", "fsync"] and events[-1] == ("fsync", "folder")
    assert (tmp_path / "sub" / "b.json").read_text() == '{\n  "x": 1\n}\n'


def test_a_safetensors_file_has_the_same_bytes_in_every_process(tmp_path):
    """safetensors writes its header's metadata in an order that changes from process to process; ours sorts it,
    so the same tensors and metadata make the same file on every run (and a digest of it stays put)."""
    import subprocess
    import sys

    from safetensors import safe_open

    from alfa.fileio import write_safetensors

    write = (
        "import torch\n"
        "from alfa.fileio import write_safetensors\n"
        "meta = {f'k{i}': str(i) for i in (5, 2, 7, 0, 3, 6, 1, 4)}\n"
        "write_safetensors(path, {'w': torch.arange(6.0).reshape(2, 3)}, meta)\n"
    )
    # one file written in this process, the other in a new one (a start costs seconds of imports)
    exec(write, {"path": tmp_path / "0.safetensors"})
    script = "import sys\npath = sys.argv[1]\n" + write
    subprocess.run([sys.executable, "-c", script, str(tmp_path / "1.safetensors")], check=True)
    first = (tmp_path / "0.safetensors").read_bytes()
    assert first == (tmp_path / "1.safetensors").read_bytes()
    header = json.loads(first[8 : 8 + int.from_bytes(first[:8], "little")])
    assert list(header["__metadata__"]) == [f"k{i}" for i in range(8)]  # sorted (1 in 8! by chance)
    with safe_open(str(tmp_path / "0.safetensors"), "pt") as f:
        assert f.metadata() == {f"k{i}": str(i) for i in range(8)}
        assert torch.equal(f.get_tensor("w"), torch.arange(6.0).reshape(2, 3))
    assert write_safetensors(tmp_path / "one.safetensors", {"w": torch.ones(1)}, {"only": "1"}).is_file()


def test_a_file_of_another_kind_is_named_as_what_it_is(tmp_path):
    """A torch.save file or a JSON file given as a checkpoint or an adapter said only "header too large"."""
    import json

    from alfa.adapters import AdapterFileError, read_adapter_metadata
    from alfa.checkpoint import CheckpointError, read_checkpoint

    torch.save({"w": torch.zeros(2)}, tmp_path / "model.pt")  # written only: never loaded
    (tmp_path / "config.json").write_text(json.dumps({"rank": 8}))
    (tmp_path / "short").write_bytes(b"ab")
    cases = {
        "model.pt": "a zip archive as torch.save writes, whose pickle alfa never loads",
        "config.json": "a JSON file",
        "short": "Error while deserializing header: header too small",  # nothing to tell it by: safetensors' words
    }
    for name, words in cases.items():
        with pytest.raises(CheckpointError, match=f"{name}: not a readable safetensors file \\({words}\\)"):
            read_checkpoint(tmp_path / name)
        with pytest.raises(AdapterFileError, match=f"{name}: not a readable safetensors file \\({words}"):
            read_adapter_metadata(tmp_path / name)


def test_file_names_and_kinds_at_the_edges(tmp_path):
    """From a review: a name that is not valid UTF-8 broke every write (its temporary name was measured as text);
    a damaged safetensors file whose header length starts with byte 0x80 or 0x08 was called a pickle or ONNX; an
    access log may be a pipe or /dev/null, which a replaced output may not."""
    import os

    from alfa.fileio import check_writable, kind_of_file, write_text

    odd = tmp_path / os.fsdecode(b"r\xe9sum\xe9.txt")
    write_text(odd, "x")
    assert odd.read_text() == "x" and [p.name for p in tmp_path.iterdir()] == [odd.name]
    for first in (0x80, 0x08):
        damaged = tmp_path / f"damaged-{first}.safetensors"
        damaged.write_bytes(first.to_bytes(8, "little") + b'{"w": {"dtype": "F32", "sha')
        assert kind_of_file(damaged) is None
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    assert check_writable(pipe, appended=True) == pipe
    with pytest.raises(ValueError, match="is not a regular file"):
        check_writable(pipe)


def test_nothing_in_alfa_unpickles(tmp_path):
    """Safe loading is safetensors and JSON: no source file calls torch.load or pickle (torch.load's
    weights_only=True still unpickles, with a restricted unpickler), and a .pth backbone is refused with the
    one-line conversion its owner can run on a file they trust."""
    import re
    from pathlib import Path

    from safetensors.torch import save_file

    from alfa.checkpoint import CheckpointError, load_backbone

    src = Path(alfa.__file__).resolve().parent
    calls = [
        f"{path.relative_to(src)}:{n}"
        for path in sorted(src.rglob("*.py"))
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if re.search(r"\btorch\.load\(|^\s*(import pickle|from pickle import)", line) and 'f"' not in line
    ]
    assert calls == []
    model = alfa.models.create_model("tiny_gaze_net")
    pth = tmp_path / "backbone.pth"
    torch.save(model.state_dict(), pth)
    with pytest.raises(CheckpointError, match=r"backbone.pth: alfa reads backbones as .safetensors only.*convert"):
        load_backbone(model, pth)
    weights = {k: v + 1.0 for k, v in model.state_dict().items()}
    save_file(weights, tmp_path / "backbone.safetensors")
    loaded = load_backbone(model, tmp_path / "backbone.safetensors", skip=())
    assert loaded == sorted(weights) and all(torch.equal(model.state_dict()[k], v) for k, v in weights.items())


@pytest.mark.parametrize(
    ("fails", "code", "written"),
    [("open", errno.EACCES, True), ("fsync", errno.EINVAL, True), ("fsync", errno.EIO, False)],
)
def test_an_atomic_write_that_cannot_be_synced_goes_on_and_a_disk_error_stops_it(
    tmp_path, monkeypatch, fails, code, written
):
    """A file that cannot be opened to be synced (a umask that leaves its owner no read), or a file system that
    cannot sync, is written as before the sync existed; a disk's error (EIO) raises naming the target, which is
    left as it was, with no temporary file beside it."""
    import os

    from alfa.fileio import write_text

    real_open, real_fsync = os.open, os.fsync
    target = tmp_path / "a.txt"
    target.write_text("old")

    def failing(real):
        def call(first, *args, **kwargs):
            to_sync = fails == "open" and args == (os.O_RDONLY,)  # the sync's open of the file (a write's has flags)
            if to_sync or (fails == "fsync" and not os.path.isdir(f"/proc/self/fd/{first}")):
                raise OSError(code, os.strerror(code))
            return real(first, *args, **kwargs)

        return call

    monkeypatch.setattr(os, fails, failing(real_open if fails == "open" else real_fsync))
    if written:
        write_text(target, "new")
        assert target.read_text() == "new"
    else:
        with pytest.raises(OSError, match="a.txt") as caught:
            write_text(target, "new")
        assert caught.value.errno == code and target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt"]
