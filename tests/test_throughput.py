"""``alfa throughput``: the loader, the step and both, through the training loop's own code paths."""

import json

import pytest
import torch
from tiny_models import TinyGazeNet  # noqa: F401  (registers tiny_gaze_net)

from alfa.cli import main
from alfa.gaze.throughput import ThroughputResult, fixture_dataset, measure_throughput, of_rounds
from alfa.gaze.train import TrainConfig
from alfa.study.bench.loading import loader_bound_verdict, loading_page
from alfa.study.timing import Ratio


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


FIELDS = dict(batch_size=8, batches=3, workers=0, device="cpu", precision="fp32", image_size=(32, 32), data="d")
PAGE = {"command": "alfa throughput", "cpus": 2, "torch": "2", "date": "2026-12-01", "load_average_end": 0.1}


def _rounds(loader: list[float], step: list[float] | None) -> ThroughputResult:
    one = [
        ThroughputResult(
            loader=a,
            step=b,
            both=None if b is None else 1.0,
            **FIELDS,
            loader_rounds=[a],
            step_rounds=None if b is None else [b],
            both_rounds=None if b is None else [1.0],
        )
        for a, b in zip(loader, step or [None] * len(loader))
    ]
    return of_rounds(one)


def test_the_terminal_verdict_is_judged_on_the_rounds_paired_interval():
    one_round = ThroughputResult(loader=10.0, step=100.0, both=9.0, **FIELDS)
    assert one_round.loader_bound is None and "not judged: one round gives no interval" in one_round.format()
    slow = _rounds([10.0, 11.0, 9.0], [100.0, 101.0, 99.0])
    assert slow.loader_bound is True and slow.format().splitlines()[-1].startswith("loader-bound: the loader gives 10")
    fast = _rounds([100.0, 101.0, 99.0], [10.0, 11.0, 9.0])
    assert fast.loader_bound is False and "not loader-bound" in fast.format()
    close = _rounds([10.0, 12.0, 10.0, 12.0], [12.0, 10.0, 12.0, 10.0])
    assert close.loader_bound is None and "an interval that straddles 1" in close.format()


def test_rounds_give_medians_and_keep_every_round():
    r = _rounds([5.0, 1.0, 3.0, 9.0], [2.0, 4.0, 6.0, 8.0])
    assert (r.loader, r.step, r.both) == (4.0, 5.0, 1.0)  # medians of an even count: the middle two's mean
    assert r.loader_rounds == [5.0, 1.0, 3.0, 9.0] and r.step_rounds == [2.0, 4.0, 6.0, 8.0]
    assert _rounds([2.0, 3.0], None).step is None
    with pytest.raises(ValueError, match="same configuration"):
        of_rounds([r, ThroughputResult(**{**r.__dict__, "workers": 1})])


def test_loader_bound_is_judged_on_the_paired_interval():
    assert loader_bound_verdict(Ratio(0.5, 0.4, 0.99, 7)) == "yes"
    assert loader_bound_verdict(Ratio(2.0, 1.01, 3.0, 7)) == "no"
    assert loader_bound_verdict(Ratio(1.0, 0.9, 1.1, 7)) == "not shown"
    assert loader_bound_verdict(None) == "not judged"
    # seven rounds where the loader is about a tenth of the step: yes, with the rates' intervals (min, max at 7)
    slow = _rounds([10.0, 11.0, 9.0, 10.0, 12.0, 10.0, 8.0], [100.0, 101.0, 99.0, 100.0, 98.0, 102.0, 100.0])
    text = loading_page({**PAGE, "runs": [{**slow.to_dict(), "fixture": "mpiifacegaze", "model": "m"}]})
    assert "| mpiifacegaze | 0 | 10 [8, 12] | 100 [98, 102] | 1 [1, 1] | 0.10 [0.09, 0.11] | yes |" in text
    assert "timed in 7 rounds" in text and "Student's t" in text
    # the same two rates in rounds that cross over: the interval straddles 1, so nothing is shown
    close = _rounds([10.0, 12.0, 10.0, 12.0, 10.0, 12.0, 10.0], [12.0, 10.0, 12.0, 10.0, 12.0, 10.0, 11.0])
    text = loading_page({**PAGE, "runs": [{**close.to_dict(), "fixture": "f", "model": "m"}]})
    assert "| not shown |" in next(line for line in text.splitlines() if line.startswith("| f |"))
    # a record of one round: the rates alone, and nothing judged
    one = {**ThroughputResult(loader=10.0, step=100.0, both=9.0, **FIELDS).to_dict(), "fixture": "f", "model": "m"}
    text = loading_page({**PAGE, "runs": [one]})
    assert "| f | 0 | 10 | 100 | 9 | 0.10 | not judged |" in text and "carry no 95 % interval" in text
    alone = _rounds([10.0, 11.0, 9.0, 10.0, 12.0, 10.0, 8.0], None)
    text = loading_page({**PAGE, "runs": [{**alone.to_dict(), "fixture": "f", "model": "m"}]})
    assert "| f | 0 | 10 [8, 12] | — | — | — | — |" in text and "Student" not in text  # nothing compared
    # the title's question, in the one form the loader's rates allow (its page was titled with it and said nothing)
    faster = {**_rounds([20.0, 22.0, 18.0, 20.0, 24.0, 20.0, 16.0], None).to_dict(), "workers": 1}
    text = loading_page({**PAGE, "command": "alfa throughput --loader-only --rounds 7", "runs": [
        {**alone.to_dict(), "fixture": "f", "model": "m"}, {**faster, "fixture": "f", "model": "m"}]})  # fmt: skip
    said = "more images per second than the loader gives, at most 20 [16, 24] images/s for `f` (1 worker, the highest "
    said += "median of its 2 worker counts) (at most: a step on these CPUs takes some of them from the loader, and the "
    said += "page does not tell its worker counts apart). `alfa throughput --rounds 7` times the step beside the loader"
    assert said in " ".join(text.split()), text
    assert "Timed alone, the loader with one worker does the reading the main process does with none" in text
    assert "waits for the loader" not in loading_page(
        {**PAGE, "runs": [{**slow.to_dict(), "fixture": "f", "model": "m"}]}
    )
    # the loader alone in one round: how to get the intervals is said, not the same command again
    text = loading_page({**PAGE, "runs": [{**_rounds([10.0], None).to_dict(), "fixture": "f", "model": "m"}]})
    assert "carry no 95 % interval: re-run `" in text and "` with six rounds or more (`--rounds 6`) for them." in text
    # the crops are said to be what was read: the fixtures measured, or one's own data (the fixtures were named
    # whatever the page measured)
    assert "in the real layouts (`mpiifacegaze`: a GazeHub folder of JPEG files)," in loading_page(
        {**PAGE, "runs": [{**slow.to_dict(), "fixture": "mpiifacegaze", "model": "m"}]}
    )
    mine = loading_page({**PAGE, "runs": [{**slow.to_dict(), "data": "mpiifacegaze", "fixture": None, "model": "m"}]})
    assert "32×32 face crops of `mpiifacegaze`, read by" in mine and "real layouts" not in mine


def test_the_command_writes_its_page_and_refuses_bad_options(tmp_path, capsys):
    out = tmp_path / "loading.md"
    args = ["throughput", "--fixture", "mpiifacegaze", "--image-size", "32", "--batch-size", "4", "--batches", "2"]
    run = [*args, "--model", "tiny_gaze_net", "--workers", "0,1", "--rounds", "2", "--device", "cpu"]
    assert main([*run, "--out", str(out)]) == 0
    data = json.loads(out.with_suffix(".json").read_text())
    assert [r["workers"] for r in data["runs"]] == [0, 1] and "alfa throughput --fixture mpiifacegaze" in data[
        "command"
    ]
    assert "--rounds 2" in data["command"] and all(len(r["loader_rounds"]) == 2 for r in data["runs"])
    assert out.read_text() == loading_page(data)
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main([*args, "--rounds", "0"])
    assert "--rounds: must be at least 1, got 0" in capsys.readouterr().err
    assert main(["throughput", "--data", "synthetic:eth", "--image-size", "64"]) == 2
    assert "--image-size sizes --fixture's images" in capsys.readouterr().err
    capsys.readouterr()
    assert main(["throughput", "--fixture", "mpiifacegaze,nope"]) == 2
    assert "expected one or more of mpiifacegaze, eth-xgaze-h5" in capsys.readouterr().err
    assert main(["throughput"]) == 2 and "pass --data SPEC" in capsys.readouterr().err
    for workers, said in (("a", "expected a whole number, got 'a'"), ("0,9999", "at most the ")):
        with pytest.raises(SystemExit):
            main([*args, "--workers", workers])
        assert f"--workers: '{workers}', comma-separated: {said}" in capsys.readouterr().err
