"""``alfa crate gaze``: a tiny CRATE and ViT on the synthetic gaze worlds, end to end (the --quick preset)."""

from __future__ import annotations

import dataclasses
import json
import math
import re

import pytest
import torch

import alfa
from alfa.adapters import attach, param_groups
from alfa.cli import main
from alfa.models import create_model
from alfa.study.crate.gaze import CrateGazeConfig, late_blocks_pattern, quick_config, run_crate_gaze
from alfa.study.plotted import plotted_data_only

TARGETS = ("mpii/test", "eyediap/test")
VOLATILE = {"seconds", "figure", "command", "resumed"}  # wall times, paths, what a rerun found begun


def _strip(x):
    if isinstance(x, dict):
        return {k: _strip(v) for k, v in x.items() if k not in VOLATILE}
    if isinstance(x, list):
        return [_strip(v) for v in x]
    return x


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    """One run of the command line with --quick (and --markdown), as a user would start it."""
    root = tmp_path_factory.mktemp("crate_gaze")
    out, page = root / "run", root / "docs" / "crate-gaze.md"
    rc = main(["crate", "gaze", "--out", str(out), "--quick", "--quiet", "--markdown", str(page)])
    assert rc == 0
    return out, page, json.loads((out / "results.json").read_text())


def test_errors_are_finite_per_person_for_both_models_and_targets(quick_run):
    _, _, results = quick_run
    config = quick_config()
    ((val_name, in_domain),) = results["errors"]["in_domain"].items()
    assert val_name == "eth/val"
    for model in ("crate", "vit", "constant"):
        per_person = in_domain[model]["per_person"]
        assert len(per_person) == config.val_persons
        assert all(math.isfinite(e) and e > 0 for e in per_person.values())
    assert tuple(results["errors"]["cross_domain"]) == TARGETS
    for target in TARGETS:
        cols = results["errors"]["cross_domain"][target]
        for model in ("crate", "vit", "constant", "crate_truncated", "crate_alfa"):
            per_person = cols[model]["per_person"]
            assert sorted(per_person) == ["p00", "p01"], (target, model)
            assert all(math.isfinite(e) and e > 0 for e in per_person.values()), (target, model)
            mean = sum(per_person.values()) / len(per_person)
            assert cols[model]["mean"] == pytest.approx(mean)
        scored = results["data"]["targets"][target]["scored_per_person"]
        assert scored == config.target_images_per_person - config.personalize.n_adapt
        personalized = results["alfa"]["personalization"][target]
        assert personalized["compared"] == config.target_persons and not personalized["failed"]


def test_probe_curves_have_one_entry_per_layer(quick_run):
    _, _, results = quick_run
    depth = quick_config().depth
    probes = results["probes"]["results"]
    for kind in ("crate", "vit"):
        assert set(probes[kind]) == {"eth/val", *TARGETS}
        for entry in probes[kind].values():
            assert len(entry["coding_rate"]) == len(entry["coding_rate_std"]) == depth
            assert len(entry["coding_rate_per_head"]) == depth
            assert all(math.isfinite(r) and r > 0 for r in entry["coding_rate"])
            # every person's mean over their probe images, and the persons' mean is the images' (equal counts)
            persons = entry["coding_rate_per_person"]
            assert len(persons) >= 2 and all(len(v) == depth for v in persons.values())
            means = [sum(v[layer] for v in persons.values()) / len(persons) for layer in range(depth)]
            assert means == pytest.approx(entry["coding_rate"], rel=1e-5)
            if kind == "crate":  # ISTA sparsity exists for CRATE only
                assert len(entry["nonzero_fraction"]) == depth
                assert all(0.0 <= f <= 1.0 for f in entry["nonzero_fraction"])
                assert set(entry["nonzero_fraction_per_person"]) == set(persons)
            else:
                assert "nonzero_fraction" not in entry


def test_personalized_adapter_merges_to_the_same_outputs(quick_run):
    _, _, results = quick_run
    check = results["alfa"]["merge_check"]
    assert check["target"] == "mpii/test" and check["person"] == "p00"
    assert check["max_abs_change_vs_base"] > 0  # the adapter did move the outputs
    assert check["max_rel_diff"] <= 1e-5
    # Alfa folds back into factors of the same rank: the merged model is as small as the truncated base.
    assert check["parameters_merged"] == check["parameters_base"] == results["truncation"]["parameters_truncated"]
    assert results["truncation"]["parameters_truncated"] < results["truncation"]["parameters_dense"]
    assert results["truncation"]["left_dense"] == ["head"]
    layers = results["alfa"]["adapted_layers"]
    assert layers == [
        "front.patch_embed.proj",
        *(f"blocks.{i}.attn.{n}" for i in range(2) for n in ("subspaces", "proj")),
    ]
    assert results["alfa"]["adapter_compact_numbers"] == len(layers) * quick_config().rank ** 2


def test_outputs_figure_and_markdown(quick_run):
    out, page, results = quick_run
    assert (out / "probes.png").stat().st_size > 0 and not list(out.glob("*.tmp*"))
    text = page.read_text()
    assert results["command"].startswith("alfa crate gaze --out ") and "--quick --seed 0" in results["command"]
    assert results["command"] in text
    assert "![probe curves](figures/crate_gaze_probes.png)" in text
    assert (page.parent / "figures" / "crate_gaze_probes.png").is_file()
    assert "Preset `quick`" in text


def test_same_seed_gives_identical_numbers(quick_run, tmp_path):
    _, _, first = quick_run
    threads = torch.get_num_threads()
    with plotted_data_only():  # the figure's data, not its drawing (test_outputs_figure_and_markdown draws it)
        again = run_crate_gaze(quick_config(), tmp_path / "again", progress=False)
    assert torch.get_num_threads() == threads  # restored
    second = json.loads((tmp_path / "again" / "results.json").read_text())
    assert _strip(second) == _strip(first)
    assert again["errors"]["cross_domain"]["mpii/test"]["crate"]["mean"] == pytest.approx(
        first["errors"]["cross_domain"]["mpii/test"]["crate"]["mean"], abs=0
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"dim": 30, "heads": 4}, "dim 30 is not divisible by heads 4"),
        ({"image_size": 36, "patch_size": 8}, "image_size 36 is not divisible by patch_size 8"),
        ({"rank": 16}, r"rank 16 saves nothing .* rank < dim/2 = 16"),
        ({"targets": ("gaze360",)}, "'gaze360' is not a synthetic target domain"),
        ({"targets": "mpii"}, "non-empty tuple of domain names"),
        ({"source": "mpii"}, "'mpii' is not a synthetic source domain"),
        ({"target_images_per_person": 5}, r"target_images_per_person \(5\) must exceed the 5 adaptation images"),
        ({"epochs": 0}, "epochs must be at least 1"),
        ({"lr": float("nan")}, "lr must be a positive number"),
        ({"probe_images_per_person": 7}, r"probe_images_per_person \(7\) exceeds the 6 images"),
        ({"threads": 1.5}, "threads must be an integer"),
    ],
)
def test_bad_config_is_refused_before_anything_runs(tmp_path, change, message):
    config = dataclasses.replace(quick_config(), **change)
    with pytest.raises(ValueError, match=message):
        run_crate_gaze(config, tmp_path / "never", progress=False)
    assert not (tmp_path / "never").exists()


def test_command_line_reports_bad_options(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        main(["crate", "gaze", "--out", str(tmp_path / "x"), "--quick", "--threads", "0"])
    assert stop.value.code == 2 and "argument --threads: must be at least 1, got 0" in capsys.readouterr().err
    assert (
        main(["crate", "gaze", "--out", str(tmp_path / "x"), "--quick", "--markdown", str(tmp_path / "page.txt")]) == 2
    )
    assert "--markdown must name a .md file" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_later_half_of_the_blocks_gets_the_larger_learning_rate():
    config = CrateGazeConfig(depth=4, dim=32, heads=2, rank=8, image_size=32)
    recipe = config.personalize_recipe()
    assert recipe.lr_scale == {late_blocks_pattern(4): 10.0} and recipe.seed == config.seed
    model = create_model("crate_tiny", **config.model_kwargs())
    alfa.truncate(model, config.rank)
    attach(model, config.alfa)
    names = {id(p): n for n, p in model.named_parameters()}
    groups = {g["name"]: {names[id(p)] for p in g["params"]} for g in param_groups(model, 1e-4, recipe.lr_scale)}
    fast = groups[late_blocks_pattern(4)]
    assert fast and all(re.match(r"blocks\.[23]\.", n) for n in fast)
    assert all(not re.match(r"blocks\.[23]\.", n) for n in groups["default"])
    assert any(n.startswith("front.") for n in groups["default"])
    with pytest.raises(ValueError, match="depth must be at least 1"):
        late_blocks_pattern(0)


def test_without_recovery_the_truncated_model_is_used_as_is(tmp_path):
    with plotted_data_only():
        results = run_crate_gaze(quick_config(recovery_epochs=0, targets=("mpii",)), tmp_path, progress=False)
    errors = results["truncation"]["in_domain_error"]
    assert errors["after_recovery"] == errors["after_truncation"]
    assert results["truncation"]["in_domain_after_recovery"]["mean"] == pytest.approx(errors["after_truncation"])
    assert results["truncation"]["recovery_history"] == [] and not (tmp_path / "crate-truncated").exists()
    assert list(results["errors"]["cross_domain"]) == ["mpii/test"]


def test_each_difference_on_the_page_has_a_paired_interval_over_persons():
    """``a − b`` over the persons both scored: mean, 95 % t-interval (df = persons − 1), and a verdict only when the
    interval excludes zero."""
    from alfa.study.crate.gaze_report import _paired, _versus

    a = {"per_person": {"p0": 10.0, "p1": 12.0, "p2": 11.0, "extra": 99.0}}
    b = {"per_person": {"p0": 9.0, "p1": 10.0, "p2": 11.0}}
    mean, low, high, n = _paired(a, b)
    # diffs 1, 2, 0: mean 1, sd 1, t(0.975, 2) = 4.3027
    assert n == 3 and mean == pytest.approx(1.0)
    assert (low, high) == pytest.approx((1 - 4.3027 / 3**0.5, 1 + 4.3027 / 3**0.5), abs=1e-3)
    assert _versus(a, b, ("A", "B")).endswith("the interval contains zero")
    shifted = {"per_person": {p: v + 5.0 for p, v in b["per_person"].items()}}
    # no Holm correction here, so not "clear" in the benchmark's sense: the words say what the interval does
    assert _versus(a, shifted, ("A", "B")).endswith("A lower, the interval clear of zero")
    assert _paired(a, {"per_person": {"p0": 1.0}}) is None


def test_an_error_cell_is_the_mean_over_persons_with_their_t_interval():
    from alfa.study.crate.gaze_report import _pm

    # 10 ± t(0.975, 2) · 1 / √3 over three persons; without the persons, the mean alone; no value, "-"
    assert _pm({"mean": 10.0, "per_person": {"a": 9.0, "b": 10.0, "c": 11.0}}) == "10.00 [7.52, 12.48]"
    assert _pm({"mean": 10.0, "std": 1.0}) == "10.00"
    assert _pm(None) == "-" and _pm({"mean": float("nan")}) == "-"


def test_alfas_before_and_after_are_read_on_the_persons_both_scored():
    from alfa.study.crate.gaze_report import _on_shared

    before = {"mean": 20.0 / 3, "per_person": {"a": 9.0, "b": 10.0, "c": 1.0}}
    after = {"mean": 9.0, "per_person": {"a": 8.0, "b": 10.0}}  # c's personalization failed
    # on a and b only: 9.5 and 9.0, which differ by the paired difference (−0.5), not 6.67 against 9.0
    assert _on_shared(before, after) == ("9.50 [3.15, 15.85]", "9.00 [-3.71, 21.71]")


def test_probe_levels_are_over_persons_and_their_changes_paired_over_persons():
    from alfa.study.crate.gaze_report import _probe_cell, _trend

    # three persons, three layers; each person's rate falls 2 then 1 from layer to layer, by person-specific starts
    per = {"a": [9.0, 7.0, 6.0], "b": [10.0, 8.0, 7.0], "c": [11.0, 9.0, 8.0]}
    entry = {"coding_rate": [10.0, 8.0, 7.0], "coding_rate_std": [5.0, 5.0, 5.0], "coding_rate_per_person": per}
    # layer 1: 10 ± t(0.975, 2) · 1 / √3
    assert _probe_cell(entry, "coding_rate", 0, ".2f") == "10.00 [7.52, 12.48]"
    # every person falls by exactly 3: a zero-width interval, and both steps wholly below zero
    text = _trend(entry, "coding_rate")
    assert text.startswith("10 → 7, last − first -3 [-3, -3] over 3 persons")
    assert text.endswith("2 of 2 layer steps down in the means, 2 with the whole interval below zero)")
    # persons who disagree: the mean still falls, but the interval of the second step straddles zero
    per["c"] = [11.0, 9.0, 10.0]
    assert "1 with the whole interval below zero" in _trend(entry, "coding_rate")
    # a record made before the persons were kept: mean ± the spread over images, and no interval claimed
    old = {"coding_rate": [10.0, 8.0, 7.0], "coding_rate_std": [5.0, 5.0, 5.0]}
    assert _probe_cell(old, "coding_rate", 0, ".2f") == "10.00 ± 5.00"
    assert _trend(old, "coding_rate") == "10 → 7 (highest 10 at layer 1, lowest 7 at layer 3; 2 of 2 layer steps down)"


def test_the_error_right_after_truncation_is_kept_per_person(quick_run):
    _, page, results = quick_run
    t = results["truncation"]
    kept = t["in_domain_after_truncation"]
    # the same truncation truncate_and_recover makes, scored on the same persons: its mean is that run's own
    assert kept["mean"] == pytest.approx(t["in_domain_error"]["after_truncation"], abs=1e-6)
    assert len(kept["per_person"]) >= 2 and "its persons not kept" not in page.read_text()


def test_the_page_names_the_machine_its_run_trained_on(quick_run):
    from alfa.study.crate.gaze_report import format_markdown
    from alfa.study.timing import cpu_name

    _, page, results = quick_run
    assert results["cpu"] == cpu_name() and f"on {cpu_name()})" in page.read_text()
    older = {k: v for k, v in results.items() if k != "cpu"}  # a record made before the machine was kept
    title = next(line for line in format_markdown(older).splitlines() if line.startswith("Generated by"))
    assert "torch 2" in title and ", on " not in title


@plotted_data_only()  # no run here is about its figure (test_outputs_figure_and_markdown draws one)
def test_a_rerun_resumes_another_run_is_refused_and_replace_starts_over(tmp_path, capsys):
    out = tmp_path / "run"
    first = run_crate_gaze(quick_config(targets=("mpii",)), out, progress=False)
    (out / "adapters" / "notes.txt").write_text("mine")
    again = run_crate_gaze(quick_config(targets=("mpii",)), out, progress=False)
    assert _strip(again) == _strip(first) and first["resumed"] == []
    assert again["resumed"] == ["train crate", "train vit", "truncate", "personalize"]
    assert (out / "adapters" / "notes.txt").read_text() == "mine"  # nothing it did not write is touched
    before = (out / "results.json").read_bytes()
    assert main(["crate", "gaze", "--out", str(out), "--quick", "--quiet", "--seed", "1"]) == 2
    refused = capsys.readouterr().err
    assert "results.json holds the results of another run (its settings vs this run's: seed 0 vs 1, " in refused
    assert "targets ['mpii'] vs ['mpii', 'eyediap']); use another --out, or --replace to start over" in refused
    assert (out / "results.json").read_bytes() == before
    # a run cut short after its probes: a figure, no results; another run is refused by the stages before drawing
    (out / "results.json").unlink()
    drawn = (out / "probes.plotted.json").read_bytes()
    assert main(["crate", "gaze", "--out", str(out), "--quick", "--quiet", "--seed", "1"]) == 2
    refused = capsys.readouterr().err
    assert "is a checkpoint of another run (training config (the checkpoint's vs this run's): seed 0 vs 1);" in refused
    assert refused.strip().endswith("(or add --replace: this command's folders in --out start over)")
    assert (out / "probes.plotted.json").read_bytes() == drawn and not (out / "results.json").exists()
    resumed = run_crate_gaze(quick_config(targets=("mpii",)), out, progress=False)  # ... and the same run resumes
    assert _strip(resumed) == _strip(first)
    replaced = run_crate_gaze(quick_config(targets=("mpii",), seed=1), out, progress=False, replace=True)
    assert (
        replaced["config"]["seed"] == 1 and replaced["resumed"] == [] and not (out / "adapters" / "notes.txt").exists()
    )


def test_results_or_figure_not_this_runs_are_refused_before_anything_runs(tmp_path, capsys):
    """--out's results.json and probes.png were overwritten unless they were this run's: a file of the user's, or
    another seed's results, is refused in one line, and nothing is written (a rerun of the same run is above)."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "results.json").write_text('{"precious": true}')
    (out / "probes.png").write_text("not a png")
    command = ["crate", "gaze", "--out", str(out), "--quick", "--quiet"]
    assert main(command) == 2
    err = capsys.readouterr().err
    assert "results.json is not a results file of alfa crate gaze" in err and len(err.strip().splitlines()) == 1
    (out / "results.json").unlink()
    assert main(command) == 2
    err = capsys.readouterr().err
    assert "probes.png is not this run's (no results or trained models of it beside it)" in err
    assert err.strip().endswith("use another --out, or --replace to start over")
    theirs = json.dumps({"config": quick_config(seed=1).to_dict(), "note": "another seed's"})
    (out / "results.json").write_text(theirs)
    assert main(command) == 2
    assert "(its settings vs this run's: seed 1 vs 0)" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["probes.png", "results.json"]  # no stage began
    assert (out / "results.json").read_text() == theirs and (out / "probes.png").read_text() == "not a png"
