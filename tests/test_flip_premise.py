"""What the flip loss can see: flip test-time augmentation, the visible/invisible split of the error, and the
mechanism by which the paper's detached flipped branch lets a shared pitch offset drift."""

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch
from bench_records import complete
from tiny_models import TinyGazeNet

from alfa.gaze.flip import flip_parts, flip_tta, flip_tta_from, predict_with_flip
from alfa.gaze.geometry import angular_error, flip_yaw
from alfa.gaze.losses import flip_symmetry_loss

DEG = math.pi / 180


def _model_and_images(seed: int = 0) -> tuple[TinyGazeNet, torch.Tensor]:
    torch.manual_seed(seed)
    model = TinyGazeNet().eval()
    return model, torch.rand(6, 3, 32, 32, generator=torch.Generator().manual_seed(seed + 1))


def test_flip_tta_is_the_average_computed_by_hand():
    model, images = _model_and_images()
    with torch.no_grad():
        by_hand = 0.5 * (model(images) + flip_yaw(model(torch.flip(images, dims=[-1]))))
    torch.testing.assert_close(flip_tta(model, images), by_hand, rtol=0, atol=1e-7)
    # yaw of the flipped prediction is negated, pitch is kept
    pred, flipped = predict_with_flip(model, images)
    tta = flip_tta_from(pred, flipped)
    torch.testing.assert_close(tta[:, 0], 0.5 * (pred[:, 0] - flipped[:, 0]))
    torch.testing.assert_close(tta[:, 1], 0.5 * (pred[:, 1] + flipped[:, 1]))


def test_visible_and_invisible_parts_add_up_to_the_error():
    g = torch.Generator().manual_seed(3)
    pred, flipped, labels = (0.3 * torch.randn(50, 2, generator=g) for _ in range(3))
    parts = flip_parts(pred, flipped, labels)
    assert parts.visible_share + parts.invisible_share + parts.cross_share == pytest.approx(1.0, abs=1e-9)
    tta = flip_tta_from(pred, flipped)
    visible, invisible = (pred - tta) / DEG, (tta - labels) / DEG
    torch.testing.assert_close(visible + invisible, (pred - labels) / DEG)  # the split is exact
    assert parts.mse == pytest.approx(float(((pred - labels) / DEG).pow(2).sum(-1).mean()), rel=1e-6)
    assert parts.visible_share == pytest.approx(float(visible.pow(2).sum(-1).mean()) / parts.mse, rel=1e-6)
    assert parts.error == pytest.approx(float(angular_error(pred, labels).mean()), rel=1e-6)
    assert parts.tta_error == pytest.approx(float(angular_error(tta, labels).mean()), rel=1e-6)
    # the flip loss is twice the visible part, in L1: what personalization minimizes
    assert parts.flip_loss == pytest.approx(float(flip_symmetry_loss(pred, flipped)) / DEG, rel=1e-6)


def test_a_flip_equivariant_model_has_no_visible_error_and_tta_changes_nothing():
    g = torch.Generator().manual_seed(4)
    pred, labels = 0.3 * torch.randn(20, 2, generator=g), 0.3 * torch.randn(20, 2, generator=g)
    parts = flip_parts(pred, flip_yaw(pred), labels)
    assert parts.visible_share == 0 and parts.flip_loss == 0 and parts.invisible_share == pytest.approx(1.0)
    assert parts.tta_error == pytest.approx(parts.error)
    # and a model whose error is all visible: flip-TTA is exact, the invisible share is zero
    shift = 0.1 * torch.randn(20, 2, generator=g)
    parts = flip_parts(labels + shift, flip_yaw(labels - shift), labels)
    assert parts.invisible_share == pytest.approx(0.0, abs=1e-12) and parts.tta_error < 1e-3


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match=r"\(N, 2\)"):
        flip_parts(torch.zeros(0, 2), torch.zeros(0, 2), torch.zeros(0, 2))
    with pytest.raises(ValueError, match="labels"):
        flip_parts(torch.zeros(3, 2), torch.zeros(3, 2), torch.zeros(4, 2))
    with pytest.raises(ValueError, match="differ"):
        flip_tta_from(torch.zeros(3, 2), torch.zeros(2, 2))


@pytest.mark.parametrize("detach", [True, False])
def test_a_shared_pitch_offset_gets_the_sign_balance_gradient_only_when_the_flip_is_detached(detach):
    """The mechanism of the drift: a pitch offset ``c`` added to the predictions on an image and on its flip
    cancels in the loss's value (pitch is mirror-invariant), so the loss cannot see it. With the flipped
    branch detached its gradient is still the mean sign of ``p(I) − p(flip I)`` over the pairs, so AdamW
    moves it steadily with nothing to pull it back; with both branches trained it is exactly zero."""
    g = torch.Generator().manual_seed(5)
    base, base_of_flipped = torch.randn(40, 2, generator=g), torch.randn(40, 2, generator=g)
    offset = torch.zeros((), requires_grad=True)
    shift = torch.stack([torch.zeros(()), offset])
    loss = flip_symmetry_loss(base + shift, base_of_flipped + shift, detach_flipped=detach)
    loss.backward()
    balance = torch.sign(base[:, 1] - base_of_flipped[:, 1]).mean()
    assert balance.abs() > 0  # a non-trivial case
    expected = balance if detach else torch.zeros(())
    torch.testing.assert_close(offset.grad, expected, rtol=0, atol=1e-7)
    # the offset does not change the loss's value in either case
    moved = flip_symmetry_loss(base + 3 * torch.tensor([0.0, 1.0]), base_of_flipped + 3 * torch.tensor([0.0, 1.0]))
    torch.testing.assert_close(moved, flip_symmetry_loss(base, base_of_flipped), rtol=0, atol=1e-6)


# ----------------------------------------------------------------------------- recipes (docs/flip-premise.md §4)


def test_the_declared_grid_and_its_runs():
    from alfa.gaze.personalize import PersonalizeConfig
    from alfa.gaze.recipes import PAPER_RECIPE, RECIPE_GRID, training_runs

    assert len(RECIPE_GRID) == 48 and len(set(RECIPE_GRID)) == 48 and PAPER_RECIPE in RECIPE_GRID
    runs = training_runs()
    assert len(runs) == 24 and all(r.steps == 10 and evals == [3, 10] for r, evals in runs.items())
    # the paper's recipe applied to the default config is the default config
    assert PAPER_RECIPE.apply(PersonalizeConfig()) == PersonalizeConfig()
    cautious = RECIPE_GRID[-1].apply(PersonalizeConfig())
    assert cautious.lr_scale == {} and not cautious.detach_flipped and cautious.pitch_anchor == 1.0


def test_selection_takes_the_lowest_and_breaks_ties_towards_caution():
    from alfa.gaze.recipes import RECIPE_GRID, Recipe, select_recipe

    errors = {r: 10.0 for r in RECIPE_GRID}
    bold = Recipe(detach_flipped=True, lr=1e-4, layer34_x10=True, steps=10)
    errors[bold] = 8.0
    assert select_recipe(errors) == bold
    # within the tie margin the more conservative recipe wins: fewer steps first
    timid = Recipe(detach_flipped=True, lr=1e-4, layer34_x10=True, steps=3)
    errors[timid] = 8.04
    assert select_recipe(errors) == timid
    errors[timid] = 8.06  # outside the margin: the lowest wins again
    assert select_recipe(errors) == bold
    # all tied: the most conservative of the whole grid
    assert select_recipe({r: 5.0 for r in RECIPE_GRID}) == Recipe(True, 1e-5, False, 3, 1.0)
    with pytest.raises(ValueError, match="finite"):
        select_recipe({bold: float("nan")})


def test_pooled_selection_averages_over_seeds_and_drops_a_recipe_that_failed_on_one():
    from alfa.gaze.recipes import RECIPE_GRID, Recipe, select_pooled

    bold = Recipe(detach_flipped=True, lr=1e-4, layer34_x10=True, steps=10)
    other = Recipe(detach_flipped=False, lr=3e-5, layer34_x10=False, steps=10)
    seed0 = {r: 10.0 for r in RECIPE_GRID} | {bold: 7.0, other: 8.0}
    seed1 = {r: 10.0 for r in RECIPE_GRID} | {bold: 9.5, other: 8.0}
    # bold wins seed 0 alone, but pooled (8.25 against 8.0) the other one does
    assert select_pooled([seed0])[0] == bold
    assert select_pooled([seed0, seed1]) == (other, pytest.approx(8.0))
    seed1[other] = float("inf")  # it failed on a stand-in person of seed 1: out of the running
    assert select_pooled([seed0, seed1])[0] == bold
    with pytest.raises(ValueError, match="no seed"):
        select_pooled([])


# ------------------------------------------------------------------------- the second rule (docs/flip-premise.md §7)

PERSONS = [f"p{i}" for i in range(10)]


def _persons(values) -> dict:
    return dict(zip(PERSONS, values))


def _harmful_grid(base: dict) -> dict:
    """Every grid recipe a clear degree worse than the unadapted model on every person (none eligible)."""
    from alfa.gaze.recipes import RECIPE_GRID

    return {r: {p: e + 1.0 + 0.01 * i for i, (p, e) in enumerate(base.items())} for r in RECIPE_GRID}


def test_t_quantiles_and_the_paired_bound():
    from alfa.gaze.recipes import paired_upper_bound
    from alfa.gaze.tdist import t_quantile

    # tabulated two-sided 95 % points of Student's t
    for df, expected in ((1, 12.7062), (2, 4.3027), (4, 2.7764), (9, 2.2622), (30, 2.0423)):
        assert t_quantile(0.05, df) == pytest.approx(expected, abs=1e-4)
    assert t_quantile(0.05, 10_000) == pytest.approx(1.95996, abs=1e-3)  # the normal's
    diffs = [0.1, -0.3, 0.2, -0.1, 0.0]
    sd = (sum((d + 0.02) ** 2 for d in diffs) / 4) ** 0.5
    assert paired_upper_bound(diffs) == pytest.approx(-0.02 + 2.7764 * sd / 5**0.5, abs=1e-4)
    assert paired_upper_bound([0.5]) == math.inf  # one person: no interval, nothing shown harmless


def test_the_second_rule_takes_the_helping_recipe_where_the_first_takes_the_cautious_no_op():
    from alfa.gaze.recipes import RECIPE_GRID, Recipe, select_helping, select_recipe

    base = _persons([10.0 + 0.3 * i for i in range(10)])
    errors = _harmful_grid(base)
    no_op = min(RECIPE_GRID, key=Recipe.caution)
    helper = Recipe(detach_flipped=True, lr=1e-4, layer34_x10=True, steps=10)
    errors[no_op] = {p: e - 0.01 for p, e in base.items()}  # changes next to nothing
    errors[helper] = {p: e - 0.05 + 0.01 * (i % 2) for i, (p, e) in enumerate(base.items())}  # helps everyone
    means = {r: sum(e.values()) / 10 for r, e in errors.items()}
    assert means[helper] < means[no_op] <= means[helper] + 0.05  # tied within the margin
    assert select_recipe(means) == no_op  # the first rule: ties to caution
    chosen = select_helping(errors, base)
    assert chosen.recipe == helper and chosen.case == "eligible"  # the second: ties to the recipe that moves
    assert chosen.upper[helper] <= 0.1 and chosen.upper[no_op] <= 0.1
    assert chosen.mean_difference[helper] == pytest.approx(-0.045)
    assert chosen.error == pytest.approx(means[helper])
    # a clearly lower eligible recipe beats both, whatever it adapts
    timid = Recipe(detach_flipped=True, lr=1e-5, layer34_x10=False, steps=3)
    errors[timid] = {p: e - 0.5 for p, e in base.items()}
    assert select_helping(errors, base).recipe == timid


def test_with_no_recipe_under_the_bound_the_second_rule_takes_the_most_conservative():
    from alfa.gaze.recipes import RECIPE_GRID, Recipe, select_helping

    base = _persons([12.0] * 10)
    errors = _harmful_grid(base)
    chosen = select_helping(errors, base)
    assert chosen.case == "none eligible" and chosen.recipe == min(RECIPE_GRID, key=Recipe.caution)
    assert min(chosen.upper.values()) > 0.1
    # the bound is what decides: at +2° the same errors are all eligible, and the lowest (the least harm) wins
    loose = select_helping(errors, base, bound=2.0)
    assert loose.case == "eligible"
    # a recipe that failed on a person (inf, or missing) is out of the running, even if it looks best
    bold = Recipe(detach_flipped=False, lr=1e-4, layer34_x10=True, steps=10)
    errors[bold] = {p: e - 1.0 for p, e in base.items()} | {"p3": math.inf}
    assert select_helping(errors, base).recipe != bold and bold not in select_helping(errors, base).upper
    errors[bold] = {p: e - 1.0 for p, e in base.items() if p != "p3"}
    assert select_helping(errors, base).recipe != bold
    with pytest.raises(ValueError, match="unadapted"):
        select_helping(errors, base | {"p3": math.inf})


def test_the_interval_excludes_the_lowest_mean_that_harms_some_persons_by_a_lot():
    from alfa.gaze.recipes import Recipe, select_helping, select_recipe

    base = _persons([10.0] * 10)
    errors = _harmful_grid(base)
    gambler = Recipe(detach_flipped=False, lr=1e-4, layer34_x10=True, steps=10)
    steady = Recipe(detach_flipped=True, lr=3e-5, layer34_x10=True, steps=3)
    errors[gambler] = _persons([9.2] * 8 + [11.5, 12.0])  # helps eight by 0.8°, harms two by 1.5 and 2°
    errors[steady] = _persons([9.8, 9.75, 9.85, 9.8, 9.8, 9.75, 9.85, 9.8, 9.8, 9.8])  # helps everyone a little
    means = {r: sum(e.values()) / 10 for r, e in errors.items()}
    assert means[gambler] < means[steady] - 0.05  # the lowest mean, outside the tie margin
    assert select_recipe(means) == gambler  # which the first rule takes
    chosen = select_helping(errors, base)
    assert chosen.upper[gambler] > 0.1 >= chosen.upper[steady]
    assert chosen.recipe == steady and chosen.case == "eligible"


def test_the_pooled_second_rule_averages_each_person_over_seeds():
    from alfa.gaze.recipes import Recipe, select_helping, select_pooled_helping

    base = _persons([10.0] * 10)
    grid = _harmful_grid(base)
    a = Recipe(detach_flipped=True, lr=1e-4, layer34_x10=True, steps=10)
    b = Recipe(detach_flipped=True, lr=3e-5, layer34_x10=True, steps=10)
    seed0 = grid | {a: _persons([9.0] * 10), b: _persons([9.6] * 10)}
    seed1 = grid | {a: _persons([11.0] * 9 + [10.9]), b: _persons([9.7] * 10)}
    assert select_helping(seed0, base).recipe == a  # a wins seed 0 alone
    pooled = select_pooled_helping([(seed0, base), (seed1, base)])
    assert pooled.recipe == b and pooled.error == pytest.approx(9.65)  # pooled, a is no help (10.0 ≈ the base)
    seed1[b] = seed1[b] | {"p0": math.inf}  # b failed on a person of seed 1: out
    assert select_pooled_helping([(seed0, base), (seed1, base)]).recipe != b
    with pytest.raises(ValueError, match="no seed"):
        select_pooled_helping([])


def test_each_rule_hashes_as_declared():
    from alfa.gaze.recipes import RULE_SPECS, SELECTION_RULES
    from alfa.study.bench.config import BenchConfig
    from alfa.study.bench.methods import SELECTION_RULE

    # the first rule's entry is what the first records' selection hashes were made with, byte for byte
    assert RULE_SPECS["lowest-cautious"] == {"tie": 0.05, "order": "steps, lr, anchor on, no x10, detached"}
    assert RULE_SPECS["helps-under-bound"]["bound"] == 0.1 and set(RULE_SPECS) == set(SELECTION_RULES)
    assert set(SELECTION_RULE.values()) == set(SELECTION_RULES)
    assert BenchConfig.first_standard().selection_rule == "lowest-cautious"
    assert BenchConfig.standard().selection_rule == "helps-under-bound"


def _selection_record(seed: int, errors: dict, source: str = "E", method: str = "alfa[grid]") -> dict:
    return complete(
        {
            "id": f"{method}|{source}→stand-in|seed{seed}",
            "kind": "selection",
            "method": method,
            "source": source,
            "seed": seed,
            "source_only_deg": 10.0,
            "grid": [{"recipe": dataclasses.asdict(r), "error_deg": e} for r, e in errors.items()],
        }
    )


def test_the_selected_recipes_file_is_the_pooled_selection_of_the_e_source():
    from alfa.gaze.recipes import PAPER_RECIPE, RECIPE_GRID, Recipe, select_pooled
    from alfa.study.bench.flip_report import selected_recipes_json

    rng = torch.Generator().manual_seed(0)
    per_seed = [{r: 5.0 + float(torch.rand((), generator=rng)) for r in RECIPE_GRID} for _ in range(3)]
    decoy = {r: 1.0 if r == RECIPE_GRID[5] else 9.0 for r in RECIPE_GRID}  # other sources and methods: ignored
    records = [_selection_record(s, e) for s, e in enumerate(per_seed)]
    records += [_selection_record(0, decoy, source="G"), _selection_record(0, decoy, method="lora[grid]")]
    records += [_selection_record(0, decoy, method="alfa[H=1][grid]")]  # not an adapter method: left out
    document = json.loads(selected_recipes_json({"records": records}, "docs/data/x"))
    assert document["results"] == "docs/data/x" and document["source"] == "E"
    chosen, error = select_pooled(per_seed)
    alfa = document["methods"]["alfa"]
    assert Recipe(**alfa["recipe"]) == chosen and alfa["label"] == chosen.label
    assert alfa["seeds"] == [0, 1, 2] and alfa["stand_in_error_deg"] == round(error, 4)
    paper = sum(e[PAPER_RECIPE] for e in per_seed) / 3
    assert alfa["paper_recipe_stand_in_error_deg"] == pytest.approx(paper, abs=1e-4)
    # every adapter method with a selection of the E source gets its own recipe, by the same rule
    assert sorted(document["methods"]) == ["alfa", "lora"]
    lora = document["methods"]["lora"]
    assert Recipe(**lora["recipe"]) == RECIPE_GRID[5]
    assert lora["seeds"] == [0] and lora["stand_in_error_deg"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="no alfa"):
        selected_recipes_json({"records": records[3:]}, "docs/data/x")


def test_under_the_second_protocol_the_selected_recipes_file_follows_its_rule():
    from alfa.gaze.recipes import Recipe, select_pooled_helping
    from alfa.study.bench.flip_report import selected_recipes_json

    base = _persons([10.0] * 10)
    gambler = Recipe(detach_flipped=False, lr=1e-4, layer34_x10=True, steps=10)
    steady = Recipe(detach_flipped=True, lr=3e-5, layer34_x10=True, steps=3)
    grid = _harmful_grid(base) | {gambler: _persons([9.2] * 8 + [11.5, 12.0]), steady: _persons([9.8] * 10)}
    record = _selection_record(0, {r: sum(e.values()) / 10 for r, e in grid.items()})
    for entry in record["grid"]:
        entry["per_person"] = grid[Recipe(**entry["recipe"])]
    record["source_only_per_person"] = base
    first = json.loads(selected_recipes_json({"records": [record]}, "x"))  # no worlds stored: the first rule
    second = json.loads(selected_recipes_json({"config": {"worlds": "v2"}, "records": [record]}, "x"))
    assert Recipe(**first["methods"]["alfa"]["recipe"]) == gambler and "case" not in first["methods"]["alfa"]
    assert Recipe(**second["methods"]["alfa"]["recipe"]) == steady == select_pooled_helping([(grid, base)]).recipe
    assert second["methods"]["alfa"]["case"] == "eligible" and "§7" in second["about"] and "§4" in first["about"]


def test_the_library_default_recipes_are_read_from_the_committed_file():
    from alfa.gaze import recipes

    path = Path(recipes.__file__).with_name("selected_recipes.json")
    document = json.loads(path.read_text(encoding="utf-8"))
    assert recipes.SELECTED_RECIPES == document
    assert recipes.DEFAULT_RECIPE == recipes.Recipe(**document["methods"]["alfa"]["recipe"])
    assert recipes.METHOD_RECIPES == {m: recipes.Recipe(**e["recipe"]) for m, e in document["methods"].items()}
    assert not list(path.parent.glob("default_recipe*.py"))  # data, never generated Python


def test_named_recipes():
    from alfa.gaze.recipes import DEFAULT_RECIPE, METHOD_RECIPES, PAPER_RECIPE, RECIPE_GRID, named_recipe

    assert named_recipe("default", "lora") == METHOD_RECIPES["lora"] and named_recipe("paper", "lora") == PAPER_RECIPE
    assert named_recipe("default", "no-such-method") == PAPER_RECIPE  # no selection: the paper's
    assert all(r in RECIPE_GRID for r in METHOD_RECIPES.values())

    assert named_recipe("paper") == PAPER_RECIPE and named_recipe("default") == DEFAULT_RECIPE
    assert DEFAULT_RECIPE in RECIPE_GRID  # the default is always a point of the declared grid
    with pytest.raises(ValueError, match="unknown recipe 'best'"):
        named_recipe("best")


def test_the_reference_protocol_is_the_per_person_minimum_over_steps():
    from alfa.gaze.recipes import reference_protocol_error

    per_step = {"p00": [9.0, 7.0, 8.0, 12.0], "p01": [5.0, 6.0, 4.0, 4.5], "p02": [3.0, 3.5, 4.0, 5.0]}
    assert reference_protocol_error(per_step) == pytest.approx((7.0 + 4.0 + 3.0) / 3)
    # ...which is never above the honest last-step number
    assert reference_protocol_error(per_step) <= sum(v[-1] for v in per_step.values()) / 3
    with pytest.raises(ValueError, match="need at least one error per step for every person"):
        reference_protocol_error({"p00": []})


# ----------------------------------------------------------------------------- per-step measurements (§3)


def test_tracking_measures_every_step_and_changes_nothing(tmp_path):
    """``track`` sees the model before the first step and after each one, and the adapter it leaves is bit
    for bit the one an untracked run leaves (it draws nothing and computes no gradient)."""
    import alfa
    from alfa.gaze.data.base import InMemoryGazeDataset
    from alfa.gaze.personalize import PersonalizeConfig, personalize, personalize_dataset

    g = torch.Generator().manual_seed(0)
    images = torch.rand(5, 3, 16, 16, generator=g)
    probe = torch.rand(4, 3, 16, 16, generator=g)
    results, states = [], []
    for tracked in (False, True):
        torch.manual_seed(0)
        model = TinyGazeNet().eval()
        alfa.truncate(model, 6)
        track = (lambda m: float(m(probe)[:, 1].mean())) if tracked else None
        results.append(personalize(model, images, alfa.LoraConfig(rank=2), PersonalizeConfig(steps=4), track=track))
        states.append({k: v.clone() for k, v in alfa.adapter_parameters(model).items()})
        if tracked:
            with torch.no_grad():
                assert results[-1].tracked[-1] == pytest.approx(float(model(probe)[:, 1].mean()))
            alfa.detach(model)
            with torch.no_grad():
                assert results[-1].tracked[0] == pytest.approx(float(model(probe)[:, 1].mean()))
    assert results[0].tracked == [] and len(results[1].tracked) == 5
    assert results[0].losses == results[1].losses
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])

    # through personalize_dataset: one list per person; a resumed person without them is redone
    ds = InMemoryGazeDataset(
        (torch.rand(12, 3, 16, 16, generator=g) * 255).to(torch.uint8),
        torch.zeros(12, 2),
        torch.arange(2).repeat_interleave(6),
        ["a", "b"],
    )
    torch.manual_seed(0)
    model = TinyGazeNet().eval()
    alfa.truncate(model, 6)
    config = PersonalizeConfig(steps=3)
    personalize_dataset(model, ds, alfa.LoraConfig(rank=2), config, tmp_path, progress=False)
    run = personalize_dataset(
        model, ds, alfa.LoraConfig(rank=2), config, tmp_path, progress=False, track=lambda p: lambda m: 1.0
    )
    assert {p: (o.status, o.tracked) for p, o in run.persons.items()} == {
        "a": ("ok", [1.0] * 4),
        "b": ("ok", [1.0] * 4),
    }


def test_alfa_evaluate_scores_flip_tta_of_the_base_and_of_each_adapter(tmp_path, capsys):
    import json

    import alfa
    from alfa.checkpoint import save_model
    from alfa.cli import main
    from alfa.gaze.data.synthetic import make_domain
    from alfa.gaze.evaluate import evaluate
    from alfa.gaze.flip import FlipTTA

    torch.manual_seed(0)
    model = alfa.models.create_model("tiny_gaze_net").eval()
    alfa.truncate(model, 6)
    save_model(tmp_path / "base.safetensors", model, "tiny_gaze_net")
    spec = "synthetic:mpii?size=16&persons=2&images_per_person=8"
    common = ["--checkpoint", str(tmp_path / "base.safetensors"), "--data", spec]
    small = ["--heads", "2", "--adapter-rank", "2"]  # within the base's d = 6
    assert main(["personalize", *common, "--out", str(tmp_path / "ad"), *small, "--steps", "1", "--quiet"]) == 0
    assert main(["evaluate", *common, "--adapters", str(tmp_path / "ad"), "--flip-tta", "--quiet"]) == 0
    assert main(["evaluate", *common, "--flip-tta", "--json", str(tmp_path / "e.json"), "--quiet"]) == 0
    saved = json.loads((tmp_path / "e.json").read_text())
    assert "flip-TTA" in capsys.readouterr().out
    by_hand = evaluate(FlipTTA(model), make_domain("mpii", size=16, persons=2, images_per_person=8), progress=False)
    for person, err in by_hand.columns["source-only"].items():
        assert saved["persons"][person]["flip-TTA"] == pytest.approx(err, rel=1e-6)
