"""``--tta`` in the product: ``alfa evaluate`` scores the kind's column beside the others (``--flip-tta`` is ``--tta
flip``), ``alfa serve`` answers with it, ``alfa export`` puts the averaging inside the ONNX graph, which onnxruntime
runs to the Python TTA's numbers; each command's help says the cost, and a bad name is one line."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from tiny_models import MicroGazeNet, TinyGazeNet

import alfa
from alfa.checkpoint import load_model, save_model
from alfa.cli import build_parser, main
from alfa.cli.gaze import _evaluation_tta
from alfa.gaze.evaluate import eval_indices, load_examples
from alfa.gaze.geometry import angular_error
from alfa.gaze.service import GazeService
from alfa.gaze.service.selftest import png_bytes
from alfa.gaze.tta import TTA_KINDS, GroupTTA, RollTTA

DATA = "synthetic:mpii?size=32&persons=2&images_per_person=7"


def _one_line(capsys, *words: str) -> None:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    for word in words:
        assert word in err, err


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("tta") / "base.safetensors"
    return save_model(path, TinyGazeNet().eval(), "tiny_gaze_net", input_size=(32, 32))


def test_evaluate_scores_the_kinds_column_and_flip_tta_is_tta_flip(checkpoint, tmp_path, capsys):
    out = tmp_path / "roll.json"
    argv = ["evaluate", "--checkpoint", str(checkpoint), "--data", DATA, "--quiet", "--json", str(out)]
    assert main([*argv, "--tta", "roll"]) == 0
    assert "roll-TTA" in capsys.readouterr().out
    run = json.loads(out.read_text())
    assert set(run["summary"]) == {"source-only", "roll-TTA"}
    assert run["meta"]["tta"] == {"kind": "roll", "forward_passes": 3}
    # The roll column is the roll-TTA of the base on the same scored images (the first five are left out).
    model, _ = load_model(checkpoint)
    data = alfa.gaze.data.open_dataset(DATA)
    images, labels = load_examples(data, eval_indices(data, "p01", 5))
    with torch.no_grad():
        want = float(angular_error(RollTTA(model.eval())(images), labels).mean())
    scored = run["persons"]["p01"]
    assert scored["roll-TTA"] == pytest.approx(want, rel=1e-5) and scored["roll-TTA"] != scored["source-only"]
    # --flip-tta asks for the very kind --tta flip names.
    parser = build_parser()
    kinds = [_evaluation_tta(parser.parse_args([*argv, *flags])) for flags in (["--flip-tta"], ["--tta", "flip"])]
    assert kinds[0] is kinds[1] is TTA_KINDS["flip"]


@pytest.mark.parametrize(
    "argv, words",
    [
        (["evaluate", "--data", DATA, "--tta", "rol"], ["--tta rol: unknown test-time augmentation", "flip+roll"]),
        (["evaluate", "--data", DATA, "--tta", "roll", "--flip-tta"], ["--flip-tta is --tta flip"]),
        (["evaluate", "--data", DATA, "--tta", "roll", "--label", "roll-TTA"], ["the name of the roll-TTA column"]),
        (["serve", "--adapters", ".", "--tta", "flip×roll"], ["--tta flip×roll: unknown test-time augmentation"]),
        (["export", "--out", "x.onnx", "--tta", "Flip"], ["--tta Flip: unknown test-time augmentation"]),
        (["export", "--out", "x.onnx", "--tta", "roll", "--image-size", "32", "24"], ["needs square images"]),
    ],
)
def test_a_bad_tta_is_one_line(checkpoint, tmp_path, capsys, monkeypatch, argv, words):
    monkeypatch.chdir(tmp_path)
    assert main([argv[0], "--checkpoint", str(checkpoint), *argv[1:]]) == 2
    _one_line(capsys, *words)
    assert not (tmp_path / "x.onnx").exists()


@pytest.mark.parametrize("command", ["evaluate", "serve", "export"])
def test_each_commands_help_says_the_inference_cost(command, capsys):
    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert all(f"{k.name}: " in text and f"{k.passes} forward passes" in text for k in TTA_KINDS.values()), text


@torch.no_grad()
def test_the_service_answers_with_the_group_tta_of_the_users_model(service_world):
    service = GazeService(service_world / "base.safetensors", service_world / "adapters", tta="flip+roll")
    assert service.health()["tta"] == "flip+roll" and service.health()["forward_passes"] == 6
    face = np.random.default_rng(3).integers(0, 256, (16, 16, 3), dtype=np.uint8)
    answer = service.predict("ann", png_bytes(face))
    model, _ = load_model(service_world / "base.safetensors")
    alfa.load_adapter(model, service_world / "adapters" / "ann.safetensors")
    image = torch.from_numpy(face).permute(2, 0, 1)[None].float() / 255
    want, plain = GroupTTA(model.eval())(image)[0], model(image)[0]
    assert abs(answer["yaw"] - want[0].item()) < 1e-6 and abs(answer["pitch"] - want[1].item()) < 1e-6
    assert abs(answer["yaw"] - plain[0].item()) + abs(answer["pitch"] - plain[1].item()) > 1e-5


@pytest.mark.slow  # the project's mark for a test of a second or more: the default run includes it
def test_the_exported_graph_is_the_python_group_tta_under_onnxruntime(tmp_path, capsys):
    """One export (the exporter's cost is per operator, so the smallest model): the command's own check compares
    the graph with the module it exported, this one with the Python TTA of the user's model."""
    pytest.importorskip("onnxscript")
    onnxruntime = pytest.importorskip("onnxruntime")
    torch.manual_seed(1)
    checkpoint = save_model(tmp_path / "micro.safetensors", MicroGazeNet(), "micro_gaze_net", input_size=(32, 32))
    out = tmp_path / "tta.onnx"
    assert main(["export", "--checkpoint", str(checkpoint), "--out", str(out), "--tta", "flip+roll"]) == 0
    assert "flip+roll test-time augmentation in the graph: 6 forward passes" in capsys.readouterr().out
    session = onnxruntime.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    assert "GridSample" in {node.op_type for node in __import__("onnx").load(str(out)).graph.node}
    x = torch.rand(5, 3, 32, 32, generator=torch.Generator().manual_seed(9))
    model, _ = load_model(checkpoint)
    with torch.no_grad():
        ours = GroupTTA(model.eval())(x)
    theirs = torch.from_numpy(session.run(None, {"images": x.numpy()})[0])
    assert float((theirs - ours).norm() / ours.norm()) < 1e-5


def test_evaluate_tta_compares_each_column_with_the_source_and_each_tta_column_with_its_model(tmp_path, capsys):
    """With --tta and --adapters the columns are source-only, personalized, KIND-TTA, personalized + KIND-TTA; the
    comparisons were those of neighbouring columns, the middle one "flip-TTA vs personalized" (the base under TTA
    against the personalized model: nothing one would compare). Now each column against source-only, and the
    personalized model with TTA against it without; the table's lines and the JSON's keys are the same pairs."""
    from tiny_models import tiny_checkpoints

    _, truncated = tiny_checkpoints(tmp_path)
    data = "synthetic:mpii?persons=3&images_per_person=8&size=16"
    common = ["--checkpoint", truncated, "--data", data, "--quiet"]
    adapters = str(tmp_path / "adapters")
    assert main(["personalize", *common, "--steps", "2", "--adapter-rank", "4", "--out", adapters]) == 0
    capsys.readouterr()
    out = tmp_path / "e.json"
    assert main(["evaluate", *common, "--adapters", adapters, "--tta", "flip", "--json", str(out)]) == 0
    table = capsys.readouterr().out
    run = json.loads(out.read_text())
    assert list(run["summary"]) == ["source-only", "personalized", "flip-TTA", "personalized + flip-TTA"]
    pairs = [
        ("source-only", "personalized"),
        ("source-only", "flip-TTA"),
        ("source-only", "personalized + flip-TTA"),
        ("personalized", "personalized + flip-TTA"),
        ("flip-TTA", "personalized + flip-TTA"),
    ]
    persons = run["persons"]
    for before, after in pairs:  # each count is the persons whose error is lower in `after`
        lower = sum(p[after] < p[before] for p in persons.values())
        assert run["improved"][f"{after} vs {before}"] == {"improved": lower, "compared": 3}
        assert f"\n{after} vs {before}: error lower for {lower} of 3 persons" in table
    assert len(run["improved"]) == len(pairs) and table.count(" vs ") == len(pairs)
    # the Δ column: the last column minus source-only, per person and for the means
    delta = {p: v["personalized + flip-TTA"] - v["source-only"] for p, v in persons.items()}
    for person, d in delta.items():
        assert next(line for line in table.splitlines() if line.startswith(person)).endswith(f"{d:+.2f}")
    means = {c: v["mean"] for c, v in run["summary"].items()}
    mean_delta = means["personalized + flip-TTA"] - means["source-only"]
    assert next(line for line in table.splitlines() if line.startswith("mean ± std")).endswith(f"{mean_delta:+.2f}")
