"""The benchmark's flip-premise rows (docs/flip-premise.md): flip-TTA, what a flip sees of each record, the
replayed reference protocol, the recipe selected on the stand-in without any target label (by the second
protocol's rule, §7, on the tiny configuration's v2 worlds), the stand-ins of each protocol, and the rows of
the shipped default recipes."""

import contextlib
import dataclasses
import json
from pathlib import Path

import pytest
import torch
from test_bench import tiny
from tiny_models import TinyGazeNet  # noqa: F401  (registers tiny_gaze_net)

import alfa.study.bench.produce as produce
import alfa.study.bench.runner as runner
import alfa.study.bench.session as session_module
from alfa.gaze.recipes import (
    DEFAULT_RECIPE,
    METHOD_RECIPES,
    RECIPE_GRID,
    Recipe,
    named_recipe,
    reference_protocol_error,
    select_helping,
)
from alfa.study.bench.config import BenchConfig, selectable_methods
from alfa.study.bench.methods import PAIRS, SOURCES, STAND_INS, TARGETS
from alfa.study.bench.plan import STAND_IN, RecordPlan, plan_records
from alfa.study.bench.produce import produce_record
from alfa.study.bench.runner import run_bench
from alfa.study.bench.schema import variant_key
from alfa.study.bench.session import Session
from alfa.study.bench.variants import selection_variants
from alfa.study.plotted import plotted_data_only


@contextlib.contextmanager
def targets_out_of_reach(session: Session):
    """Every target out of reach of what runs inside: opening one, through the session or by any other way,
    raises. Yields the worlds opened meanwhile."""
    opened: list[str] = []
    target_worlds = {*TARGETS.values(), *(session.config.world(t) for t in TARGETS)}  # of either version
    real_open = session_module.open_data

    def no_target(key, *args):
        raise AssertionError(f"the recipe selection opened the target {key!r}")

    def open_no_target_world(spec):  # nor may it open a target world's data by any other way
        world = spec.removeprefix("synthetic:").split("?")[0]
        if world in target_worlds:
            raise AssertionError(f"the recipe selection opened data of the target world {world!r}: {spec}")
        opened.append(world)
        return real_open(spec)

    # a target the session opened before is out of reach as well: only the stand-ins stay in its cache
    kept = session.targets
    session.targets = {k: t for k, t in kept.items() if k.endswith(f"→{STAND_IN}")}
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(session, "target", no_target)
            patch.setattr(session_module, "open_data", open_no_target_world)
            yield opened
    finally:
        session.targets = {**kept, **session.targets}


@pytest.fixture(scope="module")
def flip_bench(tmp_path_factory):
    """The run, its configuration and its records by id; its selection record is made with every target out of
    reach (:func:`targets_out_of_reach`). Seeded here as conftest seeds each test: a module's fixture is made before
    that per-test seed, from the global state the test before it left, and which test that is differs alone, in the
    suite and in either worker of ``-n 2``. The benchmark seeds all it draws (the same records from another state and
    thread count, checked), so this only makes the fixture start the same everywhere."""
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("flipbench")
    config = tiny(methods=("source-only", "flip-tta", "alfa"), selected_methods=("alfa",), default_methods=("alfa",))
    guarded: list[str] = []

    def produce_guarded(session, plan):
        if plan.variant.kind != "selection":
            return produce_record(session, plan)
        guarded.append(plan.id)
        with targets_out_of_reach(session):
            return produce_record(session, plan)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(runner, "produce_record", produce_guarded)
        summary = run_bench(config, out, progress=False)
    assert not summary.errors, summary.errors
    assert guarded == [f"alfa[grid]|E→{STAND_IN}|seed0"]
    from alfa.study.bench.results import load_results

    return out, config, {r["id"]: r for r in load_results(out)["records"]}


@pytest.mark.slow
def test_the_selection_record_comes_first_and_the_selected_row_reads_it(flip_bench):
    _, config, records = flip_bench
    ids = [p.id for p in plan_records(config)]
    assert ids.index(f"alfa[grid]|E→{STAND_IN}|seed0") < ids.index("alfa[selected]|E→M|seed0")
    grid = records[f"alfa[grid]|E→{STAND_IN}|seed0"]
    assert grid["kind"] == "selection" and len(grid["grid"]) == len(RECIPE_GRID)
    assert grid["stand_in"].startswith("synthetic:gaze360-v2?split=val")  # E's stand-in: the other source world
    chosen = Recipe(**grid["selected"])
    # the second rule, recomputed from what the record stores: each person's errors and the unadapted model's
    base = grid["source_only_per_person"]
    assert sorted(base) == sorted(grid["per_person"]) and grid["source_only_deg"] == pytest.approx(
        sum(base.values()) / len(base)
    )
    again = select_helping({Recipe(**g["recipe"]): g["per_person"] for g in grid["grid"]}, base)
    assert chosen == again.recipe and grid["selection_case"] == again.case and grid["error_deg"] == again.error
    assert grid["selection_rule"] == "helps-under-bound" == config.selection_rule
    assert all(g["upper_deg"] == again.upper[Recipe(**g["recipe"])] for g in grid["grid"])
    selected = records["alfa[selected]|E→M|seed0"]
    assert Recipe(**{k: v for k, v in selected["selected_recipe"].items() if k != "label"}) == chosen
    assert selected["steps"] == chosen.steps and selected["recipe"]["lr"] == chosen.lr


@pytest.mark.slow
def test_flip_tta_and_what_a_flip_sees(flip_bench):
    _, _, records = flip_bench
    base, tta = records["source-only|E→M|seed0"], records["flip-tta|E→M|seed0"]
    # flip-TTA scored as a method equals the flip-TTA error measured on the base's own record
    assert tta["error_deg"] == pytest.approx(base["flip"]["tta_error"], rel=1e-5)
    for person, parts in base["per_person_flip"].items():
        assert parts["error"] == pytest.approx(base["per_person"][person], rel=1e-5)
        assert parts["visible_share"] + parts["invisible_share"] + parts["cross_share"] == pytest.approx(1.0)
    # a flip-TTA model agrees with its own mirror image: nothing left for a flip to see
    assert tta["flip"]["visible_share"] == pytest.approx(0.0, abs=1e-9)
    assert "flip_tta_error_deg" in records["alfa|E→M|seed0"]


@pytest.mark.slow
def test_the_reference_protocol_is_replayed_per_step(flip_bench):
    _, config, records = flip_bench
    alfa = records["alfa|E→M|seed0"]
    steps = alfa["per_person_steps"]
    assert all(len(v) == config.personalize.steps + 1 for v in steps.values())
    assert alfa["reference_protocol_deg"] == pytest.approx(reference_protocol_error(steps))
    assert alfa["reference_protocol_deg"] <= min(
        sum(v[k] for v in steps.values()) / len(steps) for k in range(config.personalize.steps + 1)
    )


@pytest.mark.slow
def test_the_selection_never_reads_a_target(flip_bench, monkeypatch):
    """The selection record is made with every target out of reach (in the fixture's run): opening one raises.
    Made again (the chosen recipe's run and another one), its runs give the same errors, targets still out of
    reach; the recipe follows from the errors (the first test recomputes it from them)."""
    out, config, records = flip_bench
    plan = RecordPlan(selection_variants(config, "alfa")[0], f"E→{STAND_IN}", 0)
    made = records[plan.id]

    def run_of(recipe):  # recipes differing only in their step count share one run
        return dataclasses.replace(recipe, steps=0)

    chosen = run_of(Recipe(**made["selected"]))
    runs = {chosen, next(run_of(r) for r in RECIPE_GRID if run_of(r) != chosen)}
    monkeypatch.setattr(produce, "RECIPE_GRID", tuple(r for r in RECIPE_GRID if run_of(r) in runs))
    session = Session(config, out, out / "cache", progress=False)
    threads = torch.get_num_threads()
    torch.set_num_threads(config.threads)  # as run_bench makes every record (2 threads cost tiny ops twice the time)
    try:
        with targets_out_of_reach(session) as opened:
            record = produce_record(session, plan)
    finally:
        torch.set_num_threads(threads)
    assert STAND_INS["v2"]["E"] in opened  # the stand-in world was opened through the patched function
    again = {g["label"]: g["per_person"] for g in record.grid}
    assert len(again) == len(produce.RECIPE_GRID) == 4  # the two step counts of each of the two runs
    assert again == {g["label"]: g["per_person"] for g in made["grid"] if g["label"] in again}  # deterministic
    assert record.source_only_per_person == made["source_only_per_person"]
    assert record.config_hash == made["config_hash"]


def test_a_selected_row_without_its_selection_is_refused(tmp_path):
    config = tiny(methods=(), selected_methods=("alfa",))
    session = Session(config, tmp_path, tmp_path / "cache", progress=False)
    (tmp_path / "results.json").parent.mkdir(exist_ok=True)
    from alfa.study.bench.results import ResultsStore

    ResultsStore(tmp_path, config)
    row = next(p for p in plan_records(config) if p.variant.selected)
    session.build("E", 0)
    with pytest.raises(RuntimeError, match=r"needs the recipe-selection record alfa\[grid\]"):
        session.selected_recipe(row)
    assert variant_key(dataclasses.replace(row.variant, selected=False)) == {
        k: v for k, v in variant_key(row.variant).items() if k != "selected"
    }


@pytest.mark.slow
def test_the_report_of_a_run_without_positive_controls_and_the_default_recipe_it_gives(flip_bench, tmp_path):
    """A run of the symmetric pairs only (or a first piece of a run): the flip sections render and say nothing
    of the positive controls; the selected-recipes file reads the run's own selection record."""
    from alfa.study.bench.flip_report import selected_recipes_json
    from alfa.study.bench.report_page import build_report
    from alfa.study.bench.results import load_results

    out, _, records = flip_bench
    with plotted_data_only():  # its words, not its drawings (test_bench's test_report_from_a_real_run draws them)
        text = build_report(out, tmp_path / "r.md", tmp_path / "fig").read_text(encoding="utf-8")
    assert "## What a flip can see" in text and "## Recipes selected without target labels" in text
    # the first grid's caveat belongs to the first protocol's pages only (v1 results; the committed flip page)
    committed = (Path(__file__).resolve().parent.parent / "docs/results-flip.md").read_text(encoding="utf-8")
    assert "How much to trust the grid" not in text and "How much to trust the grid" in committed
    assert "Positive controls (" not in text and "1 recipe selection on the stand-in" in text
    # the second protocol's words: its stand-ins, its rule and its cases, and the shipped default's row
    assert "the second protocol's rule (`docs/flip-premise.md` §7" in text
    assert (
        "(gaze360-v2 for E, eth-v2 for G, gaze360-window-v2 for S)" in text and "symmetric source world (" not in text
    )
    assert "the rule's case (seeds)" in text and "Rows marked *shipped default recipe*" in text
    table1 = text.split("## Table 1")[1].split("\n## ")[0]
    assert "| Alfa (shipped default recipe) |" in table1
    assert (
        "With its shipped default recipe, of the 1 (method, pair) comparisons with source-only (descriptive: outside "
        "the declared family, so none is judged" in text
    )
    # flip-TTA on top of each personalized model, and the flip loss after personalization, per pair
    after = text.split("### After personalization: flip-TTA on top, and what a flip still sees")[1].split("\n## ")[0]
    alfa_row = next(line for line in after.splitlines() if line.startswith("| Alfa |"))
    alfa = records["alfa|E→M|seed0"]
    # one seed: each level with its interval over the record's persons, marked
    assert (
        f"| Alfa | {alfa['flip_tta_error_deg']:.2f} [" in alfa_row
        and f"; {alfa['flip']['flip_loss']:.2f} [" in alfa_row
    )
    assert alfa_row.count("(one seed)") == 4  # the error, its difference, the flip loss and the visible share
    alfa_steps = alfa["per_person_steps"]
    step0 = sum(v[0] for v in alfa_steps.values()) / len(alfa_steps)
    assert f"On the same images the base before personalization (step 0) scores {step0:.2f}° (one seed) pooled" in text
    base_row = next(line for line in after.splitlines() if line.startswith("| source-only"))
    assert f"| {records['flip-tta|E→M|seed0']['error_deg']:.2f} [" in base_row  # the state before: flip-TTA alone
    document = json.loads(selected_recipes_json(load_results(out), "x"))
    assert Recipe(**document["methods"]["alfa"]["recipe"]) == Recipe(
        **records[f"alfa[grid]|E→{STAND_IN}|seed0"]["selected"]
    )


@pytest.mark.slow
def test_a_default_row_runs_the_shipped_recipe_and_names_it(flip_bench):
    _, config, records = flip_bench
    row = records["alfa[default]|E→M|seed0"]
    assert row["group"] == "default" and row["kind"] == "adapter" and row["persons"] == 2
    assert row["default_recipe"] == {"label": DEFAULT_RECIPE.label, **dataclasses.asdict(DEFAULT_RECIPE)}
    assert row["steps"] == DEFAULT_RECIPE.steps != config.personalize.steps  # the shipped recipe, not the bench's
    assert row["recipe"]["lr"] == DEFAULT_RECIPE.lr and row["recipe"]["pitch_anchor"] == DEFAULT_RECIPE.pitch_anchor
    assert row["config_hash"] != records["alfa|E→M|seed0"]["config_hash"]


def test_the_stand_ins_of_each_protocol():
    v1, v2 = BenchConfig.first_standard(), BenchConfig.standard()
    # the first protocol's, unchanged: another symmetric source world for every source
    assert {s: v1.stand_in_spec(s).split("?")[0] for s in SOURCES} == {
        "E": "synthetic:gaze360",
        "G": "synthetic:eth",
        "S": "synthetic:gaze360",
    }
    assert v1.stand_in_spec("E") == "synthetic:gaze360?split=val&size=64&persons=5&images_per_person=40"
    # the second's: of the source's own kind, the one-sided studio source's one-sided
    assert {s: v2.stand_in_spec(s).split("?")[0] for s in SOURCES} == {
        "E": "synthetic:gaze360-v2",
        "G": "synthetic:eth-v2",
        "S": "synthetic:gaze360-window-v2",
    }
    assert v2.stand_in_spec("S").endswith("split=val&size=64&persons=10&images_per_person=40")  # every val person
    for config in (v1, v2):
        for source, world in STAND_INS[config.worlds].items():
            assert world not in {config.world(t) for t in TARGETS} and world != config.world(source)
    from alfa.gaze.data.synthetic import get_domain

    window, symmetric = get_domain("gaze360-window-v2"), get_domain("gaze360-v2")
    assert window.light_side == "person" and symmetric.light_side != "person"


def test_the_plan_has_every_methods_default_row_on_every_pair_and_seed():
    config = BenchConfig.standard()
    plans = {p.id: p for p in plan_records(config)}
    methods = selectable_methods()
    assert config.default_methods == methods and {"alfa", "lora", "diag_gate", "linear_mix"} <= set(methods)
    defaults = [p for p in plans.values() if p.variant.group == "default"]
    assert len(defaults) == len(PAIRS) * len(config.seeds) * len(methods)
    for method in methods:
        for pair in PAIRS:
            for seed in config.seeds:
                v = plans[f"{method}[default]|{pair}|seed{seed}"].variant
                assert v.shipped == named_recipe("default", method) and v.recipe == v.shipped.changes()
    assert plans["alfa[default]|S→C|seed2"].variant.shipped == METHOD_RECIPES["alfa"]
    # the first records' preset and the quick check have none (--default-methods adds them); the smoke check, Alfa's
    for preset in (BenchConfig.first_standard(), BenchConfig.quick()):
        assert not [p for p in plan_records(preset) if p.variant.group == "default"]
    smoke = [p.variant.label for p in plan_records(BenchConfig.smoke()) if p.variant.group == "default"]
    assert smoke == ["alfa[default]"] * len(BenchConfig.smoke().pairs)
    with pytest.raises(ValueError, match="no default-recipe row for"):
        BenchConfig.standard(default_methods=("tpgaze",)).validate()


def test_a_changed_shipped_default_is_a_new_record(tmp_path, monkeypatch):
    import alfa.gaze.recipes as recipes

    config = tiny(methods=(), default_methods=("lora",))
    session = Session(config, tmp_path, tmp_path / "cache", progress=False)
    (plan,) = plan_records(config)
    before = session.record_hash(plan)
    other = next(r for r in RECIPE_GRID if r != recipes.METHOD_RECIPES["lora"])
    monkeypatch.setitem(recipes.METHOD_RECIPES, "lora", other)
    (changed,) = plan_records(config)
    assert changed.variant.shipped == other and session.record_hash(changed) != before
