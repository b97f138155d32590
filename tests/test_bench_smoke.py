"""The smoke preset plans every row kind once (every code path the quick preset runs, and the rows no claimed preset
runs unless named), and `alfa bench --smoke` selects it.

Planning only: nothing is trained or rendered here."""

import argparse
import types
from pathlib import Path

import pytest

import alfa.study.bench.runner as runner
from alfa.cli.bench import BENCH
from alfa.cli.registry import add_commands
from alfa.study.bench.ablations import REGISTRY
from alfa.study.bench.config import BenchConfig
from alfa.study.bench.methods import (
    CALIBRATION_ROW_METHODS,
    EXTRA_METHODS,
    MAIN_METHODS,
    NEGATIVE_CONTROLS,
    OPT_IN_METHODS,
    POSITIVE_CONTROLS,
    SANITY_METHODS,
    TTA_ROWS,
    parse_calibration_label,
)
from alfa.study.bench.plan import STAND_IN, grid_plan, plan_records
from alfa.study.bench.produce import RUN_KINDS


def _pair_kind(pair: str) -> str:
    if pair.endswith(STAND_IN):
        return "stand-in"
    return "positive control" if pair in POSITIVE_CONTROLS else "negative control"


def _code_path(plan) -> tuple:
    """What decides which code a record runs, whatever its numbers: its kind, its table, the adapter class,
    which base, which recipe options it changes, whether its recipe is selected, and the kind of pair."""
    v = plan.variant
    base = "other rank" if v.base.startswith("rank=") else v.base
    adapter = type(v.adapter).__name__ if v.adapter is not None else None
    return v.kind, v.group, adapter, base, frozenset(v.recipe), v.selected, _pair_kind(plan.pair)


def test_the_smoke_preset_plans_every_kind_method_and_ablation():
    config = BenchConfig.smoke()
    config.validate()
    plans = plan_records(config)
    assert config.preset == "smoke" and config.seeds == (0,)
    assert {p.variant.kind for p in plans} == set(RUN_KINDS)  # every kind the chain runs, the opt-in ones too
    labels = {p.variant.label for p in plans}
    assert {*MAIN_METHODS, *SANITY_METHODS, *TTA_ROWS, *EXTRA_METHODS, *OPT_IN_METHODS} <= labels
    assert {"alfa[grid]", "alfa[selected]", "alfa[default]"} <= labels
    # every user-calibration method once, at a k a smoke person's images hold, and the spread draw
    calibrations = {parse_calibration_label(label) for label in labels} - {None}
    assert {method for method, _, _ in calibrations} == set(CALIBRATION_ROW_METHODS)
    assert {k for _, k, _ in calibrations} == {3} and {draw for _, _, draw in calibrations} == {"random", "spread"}
    assert 3 < config.target_images
    # each ablation has a row besides its reference (the reference rows are the main rows, planned once)
    assert {p.variant.group for p in plans} >= set(REGISTRY)
    assert config.ablations == tuple(REGISTRY)
    # a symmetric pair and a positive control, each selected row after the selection record it reads
    assert {_pair_kind(p.pair) for p in plans} == {"negative control", "positive control", "stand-in"}
    assert set(config.pairs) & set(NEGATIVE_CONTROLS) and set(config.pairs) & set(POSITIVE_CONTROLS)
    order = [p.id for p in plans]
    for p in plans:
        if p.variant.selected:
            assert order.index(grid_plan(config, p).id) < order.index(p.id)


def test_the_smoke_preset_covers_every_code_path_of_the_quick_preset_in_fewer_records():
    smoke, quick = plan_records(BenchConfig.smoke()), plan_records(BenchConfig.quick())
    quick_paths = {_code_path(p) for p in quick}
    assert not quick_paths - {_code_path(p) for p in smoke}
    # in fewer than half the quick preset's records (the smoke's others are the rows the quick one lacks)
    assert len([p for p in smoke if _code_path(p) in quick_paths]) < len(quick) / 2


def test_the_smoke_preset_is_small_and_says_it_makes_no_claims():
    smoke, quick = BenchConfig.smoke(), BenchConfig.quick()
    assert "no claims" in BenchConfig.smoke.__doc__
    assert smoke.image_size < quick.image_size and smoke.source_persons < quick.source_persons
    assert smoke.target_persons <= 3 and smoke.personalize.steps == 2
    assert smoke.meta.epochs * smoke.meta.steps_per_epoch < quick.meta.epochs * quick.meta.steps_per_epoch
    assert smoke.oracle.steps < quick.oracle.steps
    # --quick keeps its meaning: 123 records, and the loss ablation's rows of the roll objectives (issue 26)
    assert quick.preset == "quick" and len(plan_records(quick)) == 123 + 2


def test_bench_smoke_runs_the_smoke_preset_into_runs_bench_smoke(monkeypatch):
    calls = []

    def fake_run_bench(config, out, **kwargs):
        calls.append((config, out))
        return types.SimpleNamespace(pending=[], skipped=[], results=Path(out) / "results.json")

    monkeypatch.setattr(runner, "run_bench", fake_run_bench)
    monkeypatch.setattr("alfa.cli.bench.deterministic_kernels", lambda: None)  # no global switch in the test process
    parser = argparse.ArgumentParser()
    add_commands(parser.add_subparsers(dest="command"), (BENCH,))
    args = parser.parse_args(["bench", "--smoke", "--dry-run"])
    args.func(args)
    ((config, out),) = calls
    assert config == BenchConfig.smoke() and out == Path("runs/bench-smoke")
    assert "--smoke" in parser._subparsers._group_actions[0].choices["bench"].format_help()


def test_bench_options_choose_the_rows_of_the_shipped_default_recipes(monkeypatch):
    calls = []
    monkeypatch.setattr(runner, "run_bench", lambda config, out, **kw: calls.append(config) or _nothing(out))
    monkeypatch.setattr("alfa.cli.bench.deterministic_kernels", lambda: None)  # no global switch in the test process
    parser = argparse.ArgumentParser()
    add_commands(parser.add_subparsers(dest="command"), (BENCH,))
    for argv in (
        ["--standard"],
        ["--standard", "--methods", "source-only,alfa,lora,tpgaze"],  # narrows them like the selected rows
        ["--standard", "--default-methods", "none"],
        ["--quick", "--default-methods", "alfa,diag_gate"],
        ["--quick", "--methods", "alfa"],  # the quick preset has none to narrow
    ):
        args = parser.parse_args(["bench", *argv, "--dry-run"])
        args.func(args)
    assert [c.default_methods for c in calls] == [
        BenchConfig.standard().default_methods,
        ("alfa", "lora"),
        (),
        ("alfa", "diag_gate"),
        (),
    ]


def _nothing(out):
    return types.SimpleNamespace(pending=[], skipped=[], results=Path(out) / "results.json")


def test_each_standard_preset_runs_its_own_records_into_the_folder_they_were_made_in(monkeypatch):
    # --standard is the second protocol (runs/bench-v2, docs/results-v2.md); --first-standard the preset the
    # first records (docs/results.md, results-flip.md) were made with: v1 worlds, the same persons every seed
    calls = []
    monkeypatch.setattr(runner, "run_bench", lambda config, out, **kw: calls.append((config, out)) or _nothing(out))
    monkeypatch.setattr("alfa.cli.bench.deterministic_kernels", lambda: None)  # no global switch in the test process
    parser = argparse.ArgumentParser()
    add_commands(parser.add_subparsers(dest="command"), (BENCH,))
    for argv in (["--standard"], ["--first-standard"], ["--quick"], ["--full"]):
        args = parser.parse_args(["bench", *argv, "--dry-run"])
        args.func(args)
    assert calls == [
        (BenchConfig.standard(), Path("runs/bench-v2")),
        (BenchConfig.first_standard(), Path("runs/bench-standard")),
        (BenchConfig.quick(), Path("runs/bench-quick")),
        (BenchConfig.full(), Path("runs/bench-full")),
    ]
    assert calls[0][0].worlds == "v2" and calls[1][0].worlds == "v1" and calls[1][0].target_persons == 5
    with pytest.raises(SystemExit):  # one preset at a time
        parser.parse_args(["bench", "--standard", "--first-standard"])


def test_the_readme_quotes_the_smoke_and_quick_presets_sizes_as_planned():
    """The README's benchmark commands say how many records each check makes: the plan's count, not a number
    typed once and left behind when a preset grew (the smoke's said 58 after it had come to plan 96)."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    for flag, preset in (("--smoke", BenchConfig.smoke()), ("--quick", BenchConfig.quick())):
        line = next(line for line in readme.splitlines() if line.startswith(f"alfa bench {flag} "))
        assert f"; {len(plan_records(preset))} records)" in line, line
