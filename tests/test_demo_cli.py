"""What ``alfa demo`` and ``alfa example`` say and refuse, found by a newcomer: --seed seeds every draw, a wrong spec
is refused before a source renders, each part's verdict is said once and as the part ends, the sentences' numbers
add up, the figure keeps a far-off column from squashing the rest, the scored images are described whole, and the
tour's options are bounded at the option."""

from __future__ import annotations

import dataclasses
import re

import matplotlib.pyplot as plt
import pytest

import alfa.gaze.pipeline as pipeline
from alfa.cli import main
from alfa.gaze.evaluate import EvaluationReport


def _report(name: str, columns: dict[str, dict[str, float]], pool: int = 0) -> EvaluationReport:
    persons = list(next(iter(columns.values())))
    report = EvaluationReport(dataset=name, n_adapt=5, persons=persons, n_eval=dict.fromkeys(persons, 10))
    report.columns, report.pool = columns, pool
    return report


def test_the_demo_seed_seeds_every_draw_and_seed_0_is_the_default_chain():
    for config in pipeline.demo_configs():
        assert pipeline.seeded(config, 0) == config  # the default demo, and its cached source models, unchanged
        other = pipeline.seeded(config, 7)
        seeds = (other.seed, other.pretrain.seed, other.truncation.recovery.seed)
        assert seeds + (other.personalize.seed, other.calibrate.seed) == (7,) * 5
        assert other.source_model_spec() != config.source_model_spec()  # another source model: another cache entry


@pytest.mark.parametrize(
    "target, said",
    [
        ("bogus", "dataset spec 'bogus'"),
        ("synthetic:nope?size=48", "unknown synthetic domain 'nope'"),
        ("synthetic:mpii", "synthetic:mpii: 64×64 images, the demo's source model trains on 48×48"),
    ],
)
def test_a_wrong_target_is_refused_before_any_data_is_opened(target, said, monkeypatch, capsys, tmp_path):
    def never(spec):
        raise AssertionError(f"{spec} was opened before the targets were checked")

    monkeypatch.setattr(pipeline, "open_data", never)
    assert main(["demo", "--targets", target, "--out", str(tmp_path / "d"), "--cache-dir", str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err
    assert said in err and err.count("\n") == 1, err


def _result(name: str, tmp_path) -> pipeline.DemoResult:
    report = _report(
        f"{name}/test", {"source-only": {"a": 10.6549, "b": 10.6549}, "flip-TTA": {"a": 10.375, "b": 10.375}}
    )
    truncation = {"rank": 64, "errors": {"before_truncation": 9.0, "after_truncation": 9.5, "after_recovery": 9.1}}
    reports = {report.dataset: report}
    return pipeline.DemoResult(
        reports, truncation, {"total": 1.0}, pipeline.verdict(reports), tmp_path / name / "results.json", None, True
    )


@pytest.mark.parametrize("quiet", [True, False])
def test_each_part_says_its_verdict_once_as_it_ends_even_if_a_later_part_fails(quiet, monkeypatch, capsys, tmp_path):
    calls = []

    def fake_run(config, **_):
        calls.append(config.source)
        if len(calls) == 2:
            raise RuntimeError("the second part failed")
        return _result("eth", tmp_path)

    monkeypatch.setattr(pipeline, "run_demo", fake_run)
    monkeypatch.setattr(pipeline, "check_demo_specs", lambda config: None)
    argv = ["demo", "--out", str(tmp_path / "d"), "--cache-dir", str(tmp_path / "c")] + ["--quiet"] * quiet
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert "alfa demo: error: the second part failed" in captured.err
    out = captured.out
    assert out.count("source validation error") == 1 and out.count("eth/test: source-only 10.65 deg") == 1, out
    # the part's table, once: --quiet prints it at the part's end; with progress run_demo (here a fake) prints it
    assert out.count("angular error (deg) per person") == quiet


def test_a_sentence_gives_the_difference_of_the_means_it_prints():
    reports = {"t": _report("t", {"source-only": {"a": 10.6549}, "flip-TTA": {"a": 10.375}, "same": {"a": 10.6501}})}
    line = pipeline.verdict(reports)[0]
    assert "source-only 10.65 deg" in line and "flip-TTA lowered it (10.38 deg, -0.27;" in line, line
    assert "same left it unchanged (10.65 deg, +0.00;" in line, line  # 10.6501 against 10.6549: both 10.65


def test_the_figure_keeps_a_far_off_column_from_squashing_the_others(monkeypatch, tmp_path):
    figures = []
    monkeypatch.setattr(plt, "close", figures.append)
    errors = {"source-only": {"a": 8.0, "b": 10.0, "c": 12.0}, "flip-TTA": {"a": 7.5, "b": 9.8, "c": 11.0}}
    errors["Alfa (paper recipe)"] = {"a": 9.0, "b": 98.0, "c": 60.0}
    pipeline.plot_per_person({"t": _report("t", errors)}, tmp_path / "f.png")
    ax = figures[0].axes[0]
    assert ax.get_ylim()[1] < 20  # as far again above the source-only errors (12 + 4), not up to 98
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "Alfa (paper recipe): 2 above the frame, up to 98.0 deg" in legend, legend
    assert not any("flip-TTA:" in t and "above" in t for t in legend)


def test_the_scored_images_are_described_without_the_calibrations_pool_where_it_was_set_aside():
    errors = {"source-only": {"a": 8.0}, "flip-TTA": {"a": 7.0}}
    plain, pooled = _report("t", errors), _report("t", errors, pool=32)
    assert "5 adaptation images excluded" in plain.format_table()
    assert "5 adaptation images and the calibration's pool of 32 excluded" in pooled.format_table()
    assert "pool" not in plain.to_dict() and pooled.to_dict()["pool"] == 32
    assert "except the first n_adapt (used for adaptation) and the last 32" in pooled.to_dict()["protocol"]


@pytest.mark.parametrize(
    "option, said",
    [
        (["--image-size", "1000000"], "argument --image-size: must be at most 512"),
        (["--image-size", "16"], "argument --image-size: must be at least 32"),
        (["--steps", "100000"], "argument --steps: must be at most 1000"),
        (["--steps", "0"], "argument --steps: must be at least 1, got 0"),
        (["--rank", "0"], "argument --rank: must be at least 1, got 0"),
        (["--rank", "x"], "argument --rank: expected a whole number, got 'x'"),
    ],
)
def test_the_tours_options_are_bounded_at_the_option(option, said, capsys):
    with pytest.raises(SystemExit) as done:
        main(["example", *option])
    err = capsys.readouterr().err
    assert done.value.code == 2 and said in err and err.count("\n") == 1, err
    assert re.search(r"\(see alfa example --help\)", err)


def test_the_demos_specs_are_those_the_demo_checks():
    """The default parts pass their own check (a check that refused the demo's own specs would stop every demo)."""
    for config in pipeline.demo_configs():
        pipeline.check_demo_specs(config)
        pipeline.check_demo_specs(dataclasses.replace(config, val_source=None))
