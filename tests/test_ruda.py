"""RUDA (alfa.gaze.ruda): its rotation distribution loss with the relative-rotation sub-labels, what it adapts,
and a record of the benchmark's kind "ruda" that no default run plans."""

import json
import math

import pytest
import torch
from test_bench import tiny
from tiny_models import TinyGazeNet

import alfa
from alfa.gaze.geometry import roll_gaze
from alfa.gaze.losses import rotation_distribution_loss
from alfa.gaze.objectives import OBJECTIVES, RUDA_VIEWS
from alfa.gaze.ruda import RUDA_RECIPE, personalize_ruda, ruda_method, ruda_recipe
from alfa.gaze.views import ROLL_DEGREES, roll_angle
from alfa.study.bench.config import BenchConfig
from alfa.study.bench.plan import plan_records
from alfa.study.bench.report_page import render_report
from alfa.study.bench.results import load_results
from alfa.study.bench.runner import run_bench

ANGLES = torch.tensor([roll_angle(v) for v in RUDA_VIEWS])


def test_the_views_are_the_images_rolled_by_minus_zero_and_plus_the_declared_angle():
    assert ANGLES.tolist() == pytest.approx([-math.radians(ROLL_DEGREES), 0.0, math.radians(ROLL_DEGREES)])
    assert OBJECTIVES["ruda"].views == RUDA_VIEWS


def test_the_distribution_loss_is_zero_when_the_sub_labels_hold_and_measures_their_spread():
    gaze = torch.tensor([[0.2, -0.1], [-0.3, 0.25]])
    obeying = torch.stack([roll_gaze(gaze, a) for a in ANGLES])  # view k predicts the gaze rolled by its angle
    assert rotation_distribution_loss(obeying, ANGLES).item() < 1e-5
    # a constant pitch offset breaks the sub-labels: rolled back, the views disagree by about θ·b in yaw
    offset = torch.tensor([0.0, 0.1])
    spread = rotation_distribution_loss(obeying + offset, ANGLES).item()
    assert spread == pytest.approx(0.1 * math.sin(ANGLES[-1]) * math.sqrt(2 / 3), rel=0.15)
    # a model that ignores the roll (the same prediction on every view) is penalized by as much
    same = gaze.expand(3, 2, 2)
    assert rotation_distribution_loss(same, ANGLES).item() > 0.01
    with pytest.raises(ValueError, match="K >= 2"):
        rotation_distribution_loss(gaze[None], ANGLES[:1])


def test_ruda_adapts_every_parameter_with_its_own_learning_rate_and_lowers_its_loss():
    assert ruda_recipe().loss == "ruda" and ruda_recipe().lr_scale == {} and RUDA_RECIPE["lr"] == 1e-4
    torch.manual_seed(0)
    model = TinyGazeNet().eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    result = personalize_ruda(model, torch.rand(3, 3, 32, 32), ruda_recipe(steps=4, lr=1e-3), seed=0)
    assert result.trained_parameters == sum(p.numel() for p in model.parameters())
    assert result.final_loss < result.losses[0]
    alfa.detach(model)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())  # the base is restored


def test_a_ruda_record_is_produced_when_asked_for_and_planned_by_no_default_run(tmp_path):
    for config in (BenchConfig.standard(), BenchConfig.quick(), BenchConfig.full()):
        assert not any(p.variant.kind == "ruda" for p in plan_records(config))
    assert "ruda|E→M|seed0" in {p.id for p in plan_records(BenchConfig.smoke())}  # every kind's code path
    config = tiny(methods=("source-only", "ruda"))
    assert [p.id for p in plan_records(config)] == ["source-only|E→M|seed0", "ruda|E→M|seed0"]
    summary = run_bench(config, tmp_path, progress=False)
    assert not summary.pending
    records = {r["method"]: r for r in json.loads((tmp_path / "results.json").read_text())["records"]}
    record = records["ruda"]
    assert record["kind"] == "ruda" and record["method_config"] == ruda_method().to_dict()
    assert record["recipe"]["loss"] == "ruda" and record["recipe"]["lr_scale"] == {}
    assert record["trainable_params"] == record["inference_params"]  # the whole network
    assert record["persons"] == 2 and math.isfinite(record["error_deg"]) and not record["failed"]
    # a row of Table 1, of the persons table and of the cost table once it has records
    text = render_report(load_results(tmp_path))
    assert text.count("| RUDA (rotation consistency, whole network) |") == 3
    assert "- **RUDA** (rotation-enhanced UDA" in text and "AdamW lr 0.0001 on every parameter, 2 steps" in text


def test_alfa_personalize_method_full_loss_ruda_is_ruda_with_its_own_recipe():
    """From the command line it took full fine-tuning's recipe (×10 on layer3/layer4, +54° on tiny data) and said
    "flipped branch detached" of a loss with no flipped branch; a branch option for such a loss did nothing."""
    from alfa.cli import build_parser
    from alfa.cli.gaze import _method_config, _personalize_config, _recipe_words
    from alfa.gaze.personalize import PersonalizeConfig

    def config(*flags):
        args = build_parser().parse_args(["personalize", "--checkpoint", "x", "--data", "y", *flags])
        return _personalize_config(args, _method_config(args))

    ruda = config("--method", "full", "--loss", "ruda")
    assert ruda == ruda_recipe(PersonalizeConfig()) and ruda.lr_scale == {} and ruda.lr == 1e-4
    assert _recipe_words(ruda) == f"{ruda.steps} steps, lr 0.0001 (no layer scaling), loss ruda"
    assert config("--method", "full", "--loss", "ruda", "--lr", "3e-5").lr == 3e-5  # flags still win
    assert config("--method", "lora", "--loss", "ruda").lr_scale != {}  # the loss alone on an adapter: its recipe
    assert "flipped branch detached" in _recipe_words(config())
    for flag in ("--train-both-branches", "--detach-flipped"):
        with pytest.raises(ValueError, match=rf"^{flag} reaches the flip loss's mirrored .*roll has none"):
            config("--loss", "roll", flag)
