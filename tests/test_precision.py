"""The run precision (``alfa.gaze.precision``, ``--precision``): fp32 unless asked, and then exactly as
without it; bf16 / fp16 autocast of personalization's and evaluation's forwards on the CPU gives finite
results close to fp32's, with the weights, losses and predictions in fp32."""

import json
import math

import pytest
import torch
from tiny_models import TinyGazeNet  # noqa: F401  (registers tiny_gaze_net)

import alfa
from alfa.cli import main
from alfa.gaze.evaluate import predict_images
from alfa.gaze.personalize import PersonalizeConfig, personalize
from alfa.gaze.precision import forward_precision, run_precision

TARGET = "synthetic:mpii?size=16&persons=2&images_per_person=8"


def _base() -> torch.nn.Module:
    torch.manual_seed(0)
    model = alfa.models.create_model("tiny_gaze_net").eval()
    alfa.truncate(model, 6)
    return model


def _images() -> torch.Tensor:
    return torch.rand(5, 3, 16, 16, generator=torch.Generator().manual_seed(1))


def test_the_run_precision_is_fp32_outside_any_block_and_restored_after_one():
    assert run_precision() == "fp32"
    with forward_precision("bf16"):
        assert run_precision() == "bf16"
        with forward_precision("fp32"):
            assert run_precision() == "fp32"
        assert run_precision() == "bf16"
    assert run_precision() == "fp32"
    with pytest.raises(ValueError, match="precision must be one of fp32, bf16, fp16, got 'fp8'"):
        with forward_precision("fp8"):
            pass


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_personalization_in_low_precision_on_the_cpu_is_finite_and_close_to_fp32(precision):
    images, config, method = _images(), PersonalizeConfig(steps=3), alfa.AlfaConfig(heads=2, rank=2)
    results, predictions = {}, {}
    for p in ("fp32", precision):
        model = _base()
        with forward_precision(p):
            results[p] = personalize(model, images, method, config, seed=0)
            predictions[p] = predict_images(model, images)
        assert all(t.dtype == torch.float32 for t in model.parameters())  # the weights stay fp32
        assert predictions[p].dtype == torch.float32
    low, fp32 = results[precision], results["fp32"]
    assert all(math.isfinite(v) for v in [*low.losses, low.final_loss])
    assert low.losses == pytest.approx(fp32.losses, rel=0.05, abs=2e-3)
    # close (bf16 lies about 6e-4 from fp32 here, fp16 4e-5), and not fp32 under another name
    assert torch.allclose(predictions[precision], predictions["fp32"], rtol=0, atol=5e-3)
    assert not torch.equal(predictions[precision], predictions["fp32"])
    # fp32 inside a block is fp32 outside any: the same numbers to the bit
    model = _base()
    plain = personalize(model, images, method, config, seed=0)
    assert plain.losses == fp32.losses and torch.equal(predict_images(model, images), predictions["fp32"])


def test_tpgaze_meta_training_refuses_fp16_before_any_work(tmp_path):
    from alfa.gaze.tpgaze import MetaTrainConfig, meta_train_prompts

    with forward_precision("fp16"), pytest.raises(ValueError, match="fp32 or bf16, not fp16"):
        meta_train_prompts(_base(), None, MetaTrainConfig(), tmp_path / "meta")
    assert not (tmp_path / "meta").exists()


def test_the_commands_run_personalization_and_evaluation_in_bf16(tmp_path, capsys):
    alfa.checkpoint.save_model(tmp_path / "base.safetensors", _base(), "tiny_gaze_net", input_size=(16, 16))
    base = ["--checkpoint", str(tmp_path / "base.safetensors"), "--data", TARGET, "--quiet", "--device", "cpu"]
    personalized = [*base, "--heads", "2", "--adapter-rank", "2", "--steps", "2"]
    for precision in ("fp32", "bf16"):
        out = tmp_path / precision
        assert main(["personalize", *personalized, "--out", str(out / "ad"), "--precision", precision]) == 0
        argv = [*base, "--adapters", str(out / "ad"), "--json", str(out / "e.json"), "--precision", precision]
        assert main(["evaluate", *argv]) == 0
    capsys.readouterr()
    reports = {p: json.loads((tmp_path / p / "e.json").read_text()) for p in ("fp32", "bf16")}
    assert reports["bf16"]["meta"]["precision"] == "bf16" and reports["fp32"]["meta"]["precision"] == "fp32"
    for column in ("source-only", "personalized"):
        fp32, bf16 = (reports[p]["summary"][column]["mean"] for p in ("fp32", "bf16"))
        assert math.isfinite(bf16) and bf16 == pytest.approx(fp32, abs=0.5)  # degrees
    # the recipe an adapter records is the same in both: precision is of the run, not of the recipe
    runs = {p: json.loads((tmp_path / p / "ad" / "personalization.json").read_text()) for p in ("fp32", "bf16")}
    assert runs["bf16"]["config"] == runs["fp32"]["config"]
