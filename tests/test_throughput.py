"""``alfa throughput``: the loader, the step and both, through the training loop's own code paths."""

import json

import pytest
import torch
from tiny_models import TinyGazeNet  # noqa: F401  (registers tiny_gaze_net)

from alfa.cli import main
from alfa.gaze.throughput import ThroughputResult, fixture_dataset, loading_page, measure_throughput
from alfa.gaze.train import TrainConfig


@pytest.mark.parametrize("kind", ["mpiifacegaze", "eth-xgaze-h5"])
def test_the_three_rates_are_measured_on_data_in_a_real_layout(tmp_path, kind):
    data = fixture_dataset(kind, tmp_path, size=32, images=24)
    assert data[0]["image"].shape[-2:] == (32, 32) and len(data) == 24
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 32 * 32, 2))
    before = [p.clone() for p in model.parameters()]
    result = measure_throughput(model, data, TrainConfig(batch_size=4, num_workers=0), batches=3)
    assert result.loader > 0 and result.step > 0 and result.both > 0
    assert result.image_size == (32, 32) and result.batches == 3 and result.workers == 0
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))  # the step trained
    alone = measure_throughput(model, data, TrainConfig(batch_size=4, num_workers=1), batches=3, step=False)
    assert alone.step is None and alone.both is None and alone.loader_bound is None


def test_the_verdict_compares_the_loader_with_the_step():
    fields = dict(batch_size=8, batches=3, workers=0, device="cpu", precision="fp32", image_size=(32, 32), data="d")
    slow_loader = ThroughputResult(loader=10.0, step=100.0, both=9.0, **fields)
    assert slow_loader.loader_bound and "loader-bound: the loader gives 10 images/s" in slow_loader.format()
    fast_loader = ThroughputResult(loader=100.0, step=10.0, both=9.0, **fields)
    assert not fast_loader.loader_bound and "not loader-bound" in fast_loader.format()
    page = {"command": "alfa throughput", "cpus": 2, "torch": "2", "date": "2026-12-01", "load_average_end": 0.1}
    rows = [{**slow_loader.to_dict(), "fixture": "mpiifacegaze", "model": "m"}]
    text = loading_page({**page, "runs": rows})
    assert "| mpiifacegaze | 0 | 10 | 100 | 9 | yes |" in text and "so it carries no 95 % interval" in text
    alone = {**slow_loader.to_dict(), "step": None, "both": None, "loader_bound": None, "fixture": "f", "model": "m"}
    assert "interval" not in loading_page({**page, "runs": [alone]})  # the loader alone: nothing compared


def test_the_command_writes_its_page_and_refuses_bad_options(tmp_path, capsys):
    out = tmp_path / "loading.md"
    args = ["throughput", "--fixture", "mpiifacegaze", "--image-size", "32", "--batch-size", "4", "--batches", "2"]
    assert main([*args, "--model", "tiny_gaze_net", "--workers", "0,1", "--device", "cpu", "--out", str(out)]) == 0
    data = json.loads(out.with_suffix(".json").read_text())
    assert [r["workers"] for r in data["runs"]] == [0, 1] and "alfa throughput --fixture mpiifacegaze" in data[
        "command"
    ]
    assert out.read_text() == loading_page(data)
    capsys.readouterr()
    assert main(["throughput", "--fixture", "mpiifacegaze,nope"]) == 2
    assert "expected one or more of mpiifacegaze, eth-xgaze-h5" in capsys.readouterr().err
    assert main(["throughput"]) == 2 and "pass --data SPEC" in capsys.readouterr().err
    assert main([*args, "--workers", "a"]) == 2 and "comma-separated whole numbers" in capsys.readouterr().err
