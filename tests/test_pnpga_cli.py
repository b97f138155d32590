"""``alfa pnpga members`` and ``alfa pnpga adapt``: PnP-GA on one's own data, from the command line: the members are
the source training's last epochs, each person's model is what the record scores, runs resume and repeat
exactly, and a folder of another run, bad members and PnP-GA's folder named as adapters are refused in one line."""

import json

import pytest
import torch
from tiny_models import TinyGazeNet, truncated_tiny_gaze_net

from alfa.checkpoint import load_model, save_model
from alfa.cli import main
from alfa.gaze.evaluate import person_errors
from alfa.gaze.pipeline import open_data

SOURCE = "synthetic:eth?persons=4&images_per_person=6&size=16"
TARGET = "synthetic:mpii?persons=2&images_per_person=7&size=16"


@pytest.fixture(scope="module")
def members(tmp_path_factory):
    out = tmp_path_factory.mktemp("pnpga") / "members"
    argv = ["pnpga", "members", "--model", "tiny_gaze_net", "--data", SOURCE, "--out", str(out), "--members", "2"]
    assert main([*argv, "--epochs", "3", "--batch-size", "8", "--preset", "demo", "--quiet", "--threads", "1"]) == 0
    return out


def _adapt(members, out, *more):
    argv = ["pnpga", "adapt", "--members", str(members), "--source-data", SOURCE, "--data", TARGET]
    return main([*argv, "--out", str(out), "--epochs", "1", "--quiet", "--threads", "1", *more])


def test_members_are_the_last_epochs_and_the_last_is_the_source_model(members, capsys):
    assert sorted(p.name for p in members.glob("epoch-*")) == ["epoch-002.safetensors", "epoch-003.safetensors"]
    last, _ = load_model(members / "epoch-003.safetensors")
    final, _ = load_model(members / "pretrain" / "model.safetensors")
    assert all(torch.equal(a, b) for a, b in zip(last.state_dict().values(), final.state_dict().values()))


def test_adapt_writes_each_persons_model_scored_as_its_record_says_and_repeats_exactly(members, tmp_path, capsys):
    assert _adapt(members, tmp_path / "a", "--json", str(tmp_path / "r.json")) == 0
    out = capsys.readouterr().out
    assert "pnpga vs source-only" in out and "2 members, the last predicting" in out
    record = json.loads((tmp_path / "a" / "pnpga.json").read_text())
    data = open_data(TARGET)
    start, _ = load_model(members / "epoch-003.safetensors")
    for person in ("p00", "p01"):
        model, header = load_model(tmp_path / "a" / f"{person}.safetensors")
        assert header["extra"]["pnpga"]["adaptation_images"] == data.person_indices(person)[:5]
        entry = record["persons"][person]
        # the file is the model the record scored, on the person's images after the first five
        assert person_errors(model.eval(), data, [person], 5)[person] == pytest.approx(entry["after"], abs=1e-9)
        assert person_errors(start.eval(), data, [person], 5)[person] == pytest.approx(entry["before"], abs=1e-9)
        assert not torch.equal(model.fc.weight, start.fc.weight)  # adapted, every weight free
    assert json.loads((tmp_path / "r.json").read_text())["persons"]["p00"]["pnpga"] == record["persons"]["p00"]["after"]
    # the same run again, into another folder: the same models, bit for bit
    assert _adapt(members, tmp_path / "b") == 0
    for person in ("p00", "p01"):
        a = load_model(tmp_path / "a" / f"{person}.safetensors")[0].state_dict()
        b = load_model(tmp_path / "b" / f"{person}.safetensors")[0].state_dict()
        assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_rerun_resumes_and_another_recipe_is_refused_unless_replaced(members, tmp_path, capsys):
    out = tmp_path / "a"
    assert _adapt(members, out, "--persons", "p00") == 0
    written = (out / "p00.safetensors").stat().st_mtime_ns
    assert _adapt(members, out) == 0  # p00 is read back, p01 adapted
    assert (out / "p00.safetensors").stat().st_mtime_ns == written
    assert set(json.loads((out / "pnpga.json").read_text())["persons"]) == {"p00", "p01"}
    capsys.readouterr()
    assert _adapt(members, out, "--lr", "0.001") == 2
    err = capsys.readouterr().err
    assert "holds a PnP-GA run of another config" in err and "--replace" in err and "Traceback" not in err
    assert (out / "p00.safetensors").stat().st_mtime_ns == written
    assert _adapt(members, out, "--lr", "0.001", "--replace") == 0
    assert (out / "p00.safetensors").stat().st_mtime_ns != written


def test_bad_members_are_refused_in_one_line(members, tmp_path, capsys):
    one = members / "epoch-003.safetensors"
    other = tmp_path / "other.safetensors"
    save_model(other, truncated_tiny_gaze_net(), "tiny_gaze_net")
    dense = tmp_path / "dense.safetensors"
    save_model(dense, TinyGazeNet(), "tiny_gaze_net")
    cases = {
        (str(one),): "PnP-GA needs at least 2 ensemble members",
        (str(one), str(one)): "more than once",
        (str(dense), str(other)): "the files differ in their factorized",
        (str(tmp_path / "nothing"),): "no such file or folder",
        (str(tmp_path),): "no epoch-NNN.safetensors snapshots in it",
    }
    for paths, words in cases.items():
        argv = ["pnpga", "adapt", "--members", *paths, "--source-data", SOURCE, "--data", TARGET]
        assert main([*argv, "--out", str(tmp_path / "out"), "--quiet"]) == 2
        err = capsys.readouterr().err
        assert words in err and err.count("\n") == 1, err
        assert not (tmp_path / "out").exists()
    # the members are inputs: no person's model may land among them
    assert _adapt(members, members) == 2
    assert f"--out {members} is this command's --members" in capsys.readouterr().err


def test_a_members_folder_is_one_runs_and_adapt_reads_its_k_snapshots(members, tmp_path, capsys):
    argv = ["pnpga", "members", "--model", "tiny_gaze_net", "--data", SOURCE, "--out", str(members), "--quiet"]
    recipe = ["--epochs", "3", "--batch-size", "8", "--preset", "demo", "--members", "2"]
    before = {p.name: p.stat().st_mtime_ns for p in members.glob("epoch-*")}
    assert main([*argv, *recipe]) == 0  # the same run: read back
    capsys.readouterr()
    for other in (["--seed", "1"], ["--lr", "0.5"], ["--members", "3"]):  # each was handed the seed-0 snapshots
        assert main([*argv, *recipe, *other]) == 2
        assert "holds the members of another run" in capsys.readouterr().err
    assert {p.name: p.stat().st_mtime_ns for p in members.glob("epoch-*")} == before
    # an adapt folder is no members folder, and the other way round
    assert _adapt(members, tmp_path / "a", "--persons", "p00") == 0
    assert main([*argv[:-2], str(tmp_path / "a"), "--quiet", *recipe]) == 2
    assert "holds alfa pnpga adapt's models (pnpga.json)" in capsys.readouterr().err
    other = tmp_path / "m2"
    other.mkdir()
    (other / "members.json").write_text("{}")
    assert _adapt(members, other) == 2
    assert "holds an ensemble's snapshots (alfa pnpga members)" in capsys.readouterr().err
    # a snapshot left by a longer training than its record's is no member
    (members / "epoch-001.safetensors").write_bytes((members / "epoch-002.safetensors").read_bytes())
    try:
        assert _adapt(members, tmp_path / "b", "--persons", "p00") == 0
        assert "2 members, the last predicting" in capsys.readouterr().out
    finally:
        (members / "epoch-001.safetensors").unlink()


def test_another_worlds_persons_of_the_same_names_are_refused_unless_replaced(members, tmp_path, capsys):
    assert _adapt(members, tmp_path / "a") == 0
    before = json.loads((tmp_path / "a" / "pnpga.json").read_text())["persons"]["p00"]["after"]
    argv = ["pnpga", "adapt", "--members", str(members), "--source-data", SOURCE, "--data", TARGET + "&seed=7"]
    argv += ["--out", str(tmp_path / "a"), "--epochs", "1", "--quiet"]
    capsys.readouterr()
    assert main(argv) == 2  # it printed the first world's table as this one's
    assert "holds a PnP-GA run on other images of 'p00'" in capsys.readouterr().err
    assert main([*argv, "--replace"]) == 0
    assert json.loads((tmp_path / "a" / "pnpga.json").read_text())["persons"]["p00"]["after"] != before


def test_more_members_than_epochs_is_said(tmp_path, capsys):
    argv = ["pnpga", "members", "--model", "tiny_gaze_net", "--data", SOURCE, "--out", str(tmp_path / "m")]
    assert main([*argv, "--epochs", "1", "--batch-size", "8", "--preset", "demo", "--members", "3", "--quiet"]) == 0
    assert "--members 3 asks for more than the 1 epochs this training runs: 1 members" in capsys.readouterr().err


def test_a_person_file_no_pnpga_run_wrote_is_not_replaced(members, tmp_path, capsys):
    out = tmp_path / "a"
    out.mkdir()
    (out / "p01.safetensors").write_bytes(b"someone's adapter")
    assert _adapt(members, out) == 2
    assert "holds p01.safetensors, which no PnP-GA run there wrote" in capsys.readouterr().err
    assert (out / "p01.safetensors").read_bytes() == b"someone's adapter" and not (out / "p00.safetensors").exists()


def test_an_unfinished_members_training_is_refused(members, tmp_path, capsys):
    folder = tmp_path / "m"
    (folder / "pretrain").mkdir(parents=True)
    model = TinyGazeNet()
    for name in ("epoch-001.safetensors", "epoch-002.safetensors"):
        save_model(folder / name, model, "tiny_gaze_net")
    save_model(folder / "pretrain" / "model.safetensors", model, "tiny_gaze_net", extra={"complete": False})
    assert _adapt(folder, tmp_path / "out") == 2
    assert "its training stopped before its last epoch; rerun the same alfa pnpga members" in capsys.readouterr().err


def test_evaluate_refuses_pnpgas_folder_as_adapters(members, tmp_path, capsys):
    assert _adapt(members, tmp_path / "a", "--persons", "p00") == 0
    capsys.readouterr()
    base = str(members / "pretrain" / "model.safetensors")
    assert main(["evaluate", "--checkpoint", base, "--data", TARGET, "--adapters", str(tmp_path / "a")]) == 2
    assert "holds PnP-GA's whole models, one per person (pnpga.json), not adapters" in capsys.readouterr().err
