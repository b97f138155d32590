"""User calibration's rows in the benchmark (issue 25, docs/user-calibration.md §4): the labels, the plan (no claimed
preset runs them, the smoke check once; the declared v2 run has them on every pair), the stand-in rule, and a run
whose records equal the library's calibration of each person through a full forward pass, on the images every other
row scores."""

import contextlib
import dataclasses
import math
import statistics

import pytest
import torch
from test_bench import tiny
from tiny_models import TinyGazeNet  # noqa: F401  (registers tiny_gaze_net)

from alfa.adapters import detach
from alfa.gaze.calibrate import CalibrateConfig, calibrate_person, draw_positions, estimate_offset_prior
from alfa.gaze.evaluate import GazeError, eval_indices, load_examples, predict_images
from alfa.gaze.faze_train import FazeTrainConfig
from alfa.gaze.faze_train import MetaTrainConfig as FazeMetaConfig
from alfa.gaze.personalize import person_seed
from alfa.study.bench import user_calibration as bench_calibration
from alfa.study.bench import user_calibration_settings as calibration_settings
from alfa.study.bench.config import BenchConfig, OracleConfig
from alfa.study.bench.methods import (
    CALIBRATION_KS,
    PAIRS,
    calibration_label,
    calibration_rows,
    expand_calibration_names,
    parse_calibration_label,
)
from alfa.study.bench.plan import declared_run, plan_records
from alfa.study.bench.results import load_results
from alfa.study.bench.runner import run_bench
from alfa.study.bench.session import Session
from alfa.study.bench.user_calibration import pick_recipe
from alfa.study.bench.user_calibration_settings import GRIDS

ROWS = (
    "source-only",
    "calibrate-affine[k=3]",
    "calibrate-affine-spread[k=3]",
    "calibrate-offset[k=1]",
    "calibrate-affine-shrunk[k=1]",
    "calibrate-adapter-alfa[k=3]",
    "calibrate-adapter-lora-semi[k=3]",
    "calibrate-faze[k=3]",
    "calibrate-faze-plain[k=3]",
)


RECOMPUTED = ("calibrate-affine-spread[k=3]", "calibrate-adapter-lora-semi[k=3]", "calibrate-faze[k=3]")
"""The rows recomputed by a full forward pass: the head scored on cached features (with spread draws), an adapter
scored by the whole network (with the flip loss), FAZE's gaze MLP scored on cached gaze codes."""


def test_the_labels_name_method_k_and_draw_and_one_word_asks_for_all_of_a_method():
    for method in ("affine", "affine-shrunk", "offset", "ridge", "last-layer"):
        for k in CALIBRATION_KS:
            for draw in ("random", "spread"):
                assert parse_calibration_label(calibration_label(method, k, draw)) == (method, k, draw)
    # the adapters: k = 3 and 9, random draws only (docs/user-calibration.md §5.2)
    assert [r for r in calibration_rows() if r.startswith("calibrate-adapter-alfa[")] == [
        "calibrate-adapter-alfa[k=3]",
        "calibrate-adapter-alfa[k=9]",
    ]
    for other in ("calibrate-adapter-alfa[k=1]", "calibrate-adapter-lora-spread[k=9]"):
        assert parse_calibration_label(other) is None
    assert calibration_label("last-layer", 9, "spread") == "calibrate-last-layer-spread[k=9]"
    for other in ("alfa", "calibrate-affine", "calibrate-pnpga[k=9]", "calibrate-affine[k=x]", "alfa[selected]"):
        assert parse_calibration_label(other) is None
    rows = expand_calibration_names(("source-only", "calibrate-affine", "calibrate-affine[k=9]"))
    assert rows[0] == "source-only" and len(rows) == 1 + 2 * len(CALIBRATION_KS)  # no row twice
    assert set(rows[1:]) == set(calibration_rows(("affine",)))
    assert expand_calibration_names(("calibrate-pnpga",)) == ("calibrate-pnpga",)  # left for validate to refuse
    with pytest.raises(ValueError, match="unknown method"):
        BenchConfig.standard(methods=("calibrate-pnpga",)).validate()


def test_no_claimed_preset_plans_the_rows_and_the_declared_run_has_them_on_every_pair_and_seed():
    for preset in (BenchConfig.quick(), BenchConfig.standard(), BenchConfig.full()):
        assert not [p for p in plan_records(preset) if p.variant.kind == "calibration"], preset.preset
    # the smoke check (no claims) runs each method once, at k = 3 (tests/test_bench_smoke.py)
    assert [p for p in plan_records(BenchConfig.smoke()) if p.variant.kind == "calibration"]
    ids = {p.id for p in declared_run("v2")}
    for label in calibration_rows():
        for pair in PAIRS:
            for seed in (0, 1, 2):
                assert f"{label}|{pair}|seed{seed}" in ids
    plans = plan_records(BenchConfig.standard(methods=("calibrate-affine[k=9]",), pairs=("E→M",), seeds=(0,)))
    settings = next(p.variant.calibration for p in plans if p.variant.kind == "calibration")
    # the standard preset's pool: the 5 adaptation images and 27 of the oracle's 40 extra ones
    assert settings["pool"] == 32 and settings["stand_in_pool"] == 16 and settings["selection_k"] == 9
    assert settings["draws"] == 10  # the run's tests draw fewer (SMALL_DRAWS): these are the benchmark's
    adapter = plan_records(BenchConfig.standard(methods=("calibrate-adapter-alfa[k=9]",), pairs=("E→M",), seeds=(0,)))
    assert next(p.variant.calibration for p in adapter if p.variant.kind == "calibration")["draws"] == 3
    assert settings["grid"] == [{"affine_ridge": 1.0}, {"affine_ridge": 0.1}, {"affine_ridge": 0.01}]
    assert "offset_prior" not in settings["defaults"]  # at its neutral value: the rows made before it hash alike


def test_the_rule_takes_the_lowest_and_gives_a_tie_to_the_stronger_regularization():
    def grid(*errors):
        return [{"changes": {"r": i}, "error_deg": e} for i, e in enumerate(errors)]

    assert pick_recipe(grid(5.0, 4.0, 4.5)) == ({"r": 1}, "lowest")
    assert pick_recipe(grid(4.04, 4.0, 3.99)) == ({"r": 0}, "tie: the stronger regularization")
    assert pick_recipe(grid(4.06, 4.0, 4.5)) == ({"r": 1}, "lowest")  # 0.06 is no tie
    assert pick_recipe(grid(math.inf, 4.0)) == ({"r": 1}, "lowest")  # a failed recipe is out
    with pytest.raises(ValueError, match="no recipe"):
        pick_recipe(grid(math.inf))
    # each grid runs from the strongest regularization to the weakest: the order ties are settled in
    ridges = [g["affine_ridge"] for g in GRIDS["affine"]]
    assert ridges == sorted(ridges, reverse=True)
    trained = [(g["steps"], g["lr"]) for g in GRIDS["last-layer"]]
    assert trained == sorted(trained)


def test_an_adapters_initial_weights_are_seeded_as_alfa_calibrate_seeds_them_and_no_generator_stays_seeded(
    monkeypatch,
):
    from contextlib import contextmanager

    before = torch.random.get_rng_state()
    with bench_calibration._init_rng(3, "p07", torch.device("cpu")):
        drawn = torch.rand(4)
    assert torch.equal(drawn, torch.rand(4, generator=torch.Generator().manual_seed(person_seed(3, "p07", "init"))))
    assert torch.equal(torch.random.get_rng_state(), before)  # the CPU's generator as it was
    forked = []

    @contextmanager
    def recording(devices=None, **kwargs):
        forked.append(list(devices))
        yield

    monkeypatch.setattr(torch.random, "fork_rng", recording)
    monkeypatch.setattr(torch, "manual_seed", lambda seed: None)  # no GPU here: only what is forked is checked
    with bench_calibration._init_rng(0, "p07", torch.device("cuda", 1)):
        pass
    assert forked == [[torch.device("cuda", 1)]]  # torch.manual_seed seeds the GPU's too: it is restored as well


def _config():
    return tiny(methods=ROWS, oracle=OracleConfig(extra_images=11, steps=2, batch_size=4))  # a pool of 16


SMALL_FAZE = (FazeTrainConfig(steps=3, batch_size=4), FazeMetaConfig(steps=2, k=3, l=3, tasks=2))
SMALL_DRAWS = (4, 2)  # per person: a row's draws, an adapter row's (the benchmark's: 10 and 3)
SMALL_STEPS = 10  # an adapter's calibration steps (the library's default: 50)


@contextlib.contextmanager
def _small_settings():
    """FAZE's training, the adapters' steps and the draws small enough for a test (the rows' hashes hold them: a
    rerun needs them too)."""
    defaults = {**calibration_settings._library_defaults(), "steps": SMALL_STEPS}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(calibration_settings, "_library_defaults", lambda: defaults)
        mp.setattr(calibration_settings, "FAZE_TRAINING", SMALL_FAZE[0])
        mp.setattr(calibration_settings, "FAZE_META_TRAINING", SMALL_FAZE[1])
        mp.setattr(calibration_settings, "DRAWS", SMALL_DRAWS[0])
        mp.setattr(calibration_settings, "ADAPTER_DRAWS", SMALL_DRAWS[1])
        yield


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    out = tmp_path_factory.mktemp("ucal")
    config = _config()
    with _small_settings():
        summary = run_bench(config, out, progress=False)
    assert not summary.errors, summary.errors
    return out, config, {r["id"]: r for r in load_results(out)["records"]}


def _faze(session: Session, which: str):
    train, meta = (dataclasses.asdict(c) for c in SMALL_FAZE)
    return session.faze_models(session.build("E", 0), train, meta)[which]


def _direct(session: Session, record: dict, config, base=None) -> dict[str, float]:
    """Each person's error recomputed with the library alone: the pool (adaptation images, then the oracle's
    extra ones), the record's draws (seeds 0, 1, ...), ``calibrate_person`` with the record's recipe, a full forward
    pass."""
    base = session.base(session.build("E", 0), "truncated") if base is None else base
    threads = torch.get_num_threads()
    torch.set_num_threads(config.threads)  # as the run made them: a trained draw's float order depends on it
    try:
        return _direct_errors(session, record, config, base)
    finally:
        torch.set_num_threads(threads)


def _direct_errors(session: Session, record: dict, config, base) -> dict[str, float]:
    tgt = session.target("M", 0)
    n_adapt = config.personalize.n_adapt
    recipe = {k: v for k, v in record["calibration"]["recipe"].items()}
    out = {}
    for person in tgt.data.persons():
        images, gaze = load_examples(tgt.data, tgt.data.person_indices(person)[:n_adapt])
        more = load_examples(tgt.extra, tgt.extra.person_indices(person)[: recipe["pool"] - n_adapt])
        images, gaze = torch.cat([images, more[0]]), torch.cat([gaze, more[1]])
        scored_images, scored_gaze = load_examples(tgt.data, eval_indices(tgt.data, person, n_adapt))
        errors = []
        for seed in range(record["calibration"]["draws"]):
            at = draw_positions(gaze, recipe["pool"], recipe["k"], recipe["draw"], seed, person)
            torch.manual_seed(person_seed(seed, person, "init"))  # an adapter's initial weights, as alfa calibrate's
            calibrate_person(base, images[at], gaze[at], CalibrateConfig(**recipe, seed=seed), unlabelled=images)
            try:
                errors.append(GazeError.of(predict_images(base, scored_images), scored_gaze).angular)
            finally:
                detach(base)
        out[person] = statistics.fmean(errors)
    return out


@pytest.mark.slow
def test_a_row_is_the_library_calibration_of_each_person_scored_where_every_row_scores(calibrated):
    out, config, records = calibrated
    session = Session(config, out, out / "cache", progress=False)
    source_only = records["source-only|E→M|seed0"]
    for label in ROWS[1:]:
        record = records[f"{label}|E→M|seed0"]
        method, k, draw = parse_calibration_label(label)
        model = _faze(session, "meta" if method == "faze" else "plain") if method.startswith("faze") else None
        assert record["kind"] == "calibration" and record["labelled_images_per_person"] == k
        recipe = record["calibration"]["recipe"]
        library = {
            "affine-shrunk": "affine",
            "adapter-alfa": "adapter",
            "adapter-lora": "adapter",
            "adapter-lora-semi": "adapter",
            "faze-plain": "faze",
        }
        library_method = library.get(method, method)
        assert (recipe["method"], recipe["k"], recipe["draw"], recipe["pool"]) == (library_method, k, draw, 16)
        assert set(record["per_person"]) == set(source_only["per_person"])  # the same persons ...
        if label in RECOMPUTED:  # ... images (one row per way of scoring a draw: the time of the suite)
            assert record["per_person"] == pytest.approx(_direct(session, record, config, model), abs=1e-5)
        draws = SMALL_DRAWS[1] if method.startswith("adapter-") else SMALL_DRAWS[0]
        assert all(len(v) == draws for v in record["calibration"]["per_person_draws"].values())
        merges = "in place" if not method.startswith("adapter-") else f"as {method[8:12]}'s own rows merge"
        assert record["adapter_bytes"] > 0 and record["merge"] == merges
    # the affine map's recipe is the stand-in rule's choice among its grid, made once for every k and draw
    affine = records["calibrate-affine[k=3]|E→M|seed0"]["calibration"]["choice"]
    assert [g["changes"] for g in affine["grid"]] == list(GRIDS["affine"])
    assert pick_recipe(affine["grid"]) == (affine["chosen"], affine["case"])
    assert records["calibrate-affine-spread[k=3]|E→M|seed0"]["calibration"]["choice"] == affine
    assert affine["stand_in"] == session.stand_in("E").spec and affine["k"] == 4  # half of 8 images
    # the shrunk affine map: the offset prior the stand-in's persons imply, in every recipe of its grid
    shrunk = records["calibrate-affine-shrunk[k=1]|E→M|seed0"]["calibration"]
    standin = session.stand_in("E").data
    base = session.base(session.build("E", 0), "truncated")
    residuals = []
    for p in standin.persons():
        images, gaze = load_examples(standin, standin.person_indices(p))
        residuals.append((gaze - predict_images(base, images)).double())
    kappa = min(estimate_offset_prior(residuals), 1e6)
    assert shrunk["choice"]["offset_prior"] == pytest.approx(kappa, rel=1e-6)
    assert shrunk["recipe"]["offset_prior"] == pytest.approx(kappa, rel=1e-6) and kappa > 0
    assert all(g["changes"]["offset_prior"] == shrunk["choice"]["offset_prior"] for g in shrunk["choice"]["grid"])
    offset = records["calibrate-offset[k=1]|E→M|seed0"]["calibration"]["choice"]
    assert offset["case"] == "nothing to choose"
    assert records["calibrate-offset[k=1]|E→M|seed0"]["steps"] is None  # a closed form trains no step
    # FAZE: its own models of the source (plain and meta-learned), each uncalibrated on the same images (k = 0),
    # PS-GEN's rate chosen on the stand-in among the grid's, its steps the meta-training's
    for method, which in (("faze", "meta"), ("faze-plain", "plain")):
        record = records[f"calibrate-{method}[k=3]|E→M|seed0"]
        model = _faze(session, which)
        tgt = session.target("M", 0)
        direct = {}
        for person in tgt.data.persons():
            images, gaze = load_examples(tgt.data, eval_indices(tgt.data, person, config.personalize.n_adapt))
            direct[person] = GazeError.of(predict_images(model, images), gaze).angular
        assert record["calibration"]["uncalibrated_per_person"] == pytest.approx(direct, abs=1e-5)
        assert record["base"].startswith("FAZE (") and record["calibration"]["recipe"]["method"] == "faze"
        assert [g["changes"]["faze_lr"] for g in record["calibration"]["choice"]["grid"]] == [0.01, 0.05, 0.2]
        assert record["calibration"]["recipe"]["faze_steps"] == FazeMetaConfig().inner_steps
    meta, plain = (_faze(session, w).gaze_mlp[0].weight for w in ("meta", "plain"))
    assert not torch.equal(meta, plain)  # meta-learning moved the MLP
    # the adapters: the declared recipe, each at the benchmark's settings, the whole network scored
    for name, method in (("alfa", "adapter-alfa"), ("lora", "adapter-lora-semi")):
        record = records[f"calibrate-{method}[k=3]|E→M|seed0"]
        assert record["calibration"]["choice"]["case"] == "the declared recipe (§5.2)"
        assert record["calibration"]["recipe"]["adapter_method"] == name and record["trainable_params"] > 0
        # supervised, or + the flip loss on the pool's images (the draws' errors equal to a direct run of it)
        assert record["calibration"]["recipe"]["flip_weight"] == (1.0 if method.endswith("-semi") else 0.0)


@pytest.mark.slow
def test_a_k_the_pool_cannot_hold_fails_with_one_line_and_a_rerun_resumes(calibrated, tmp_path):
    out, config, records = calibrated
    small = tiny(methods=("calibrate-affine[k=16]",))  # the oracle's 4 extra images: a pool of 9
    summary = run_bench(small, tmp_path, progress=False)
    assert list(summary.errors) == ["calibrate-affine[k=16]|E→M|seed0"]
    assert "cannot come from a pool of 9" in summary.errors["calibrate-affine[k=16]|E→M|seed0"]
    # the finished rows are skipped by a rerun: the same hashes
    with _small_settings():
        again = run_bench(dataclasses.replace(config), out, progress=False)
    assert not again.errors and again.ran == []


def test_the_matched_lora_row_is_the_rank_nearest_alfas_trainable_count_at_the_same_update_scale():
    """docs/user-calibration.md §5.6: LoRA at rank 19 trains about as many numbers as Alfa at the benchmark's
    settings on the truncated ResNet-18 (its neighbours are farther), with alpha / rank as at rank 8."""
    from tiny_models import truncated_structure

    import alfa
    from alfa.study.bench.methods import ADAPTER_OPTION_CHANGES, MATCHED_LORA_RANK
    from alfa.study.bench.variants import main_variants, method_config

    config = BenchConfig.standard()

    def trainable(adapter) -> int:
        model = truncated_structure(alfa.models.resnet18_gaze(), config.rank)
        alfa.attach(model, adapter)
        return sum(p.numel() for p in model.parameters() if p.requires_grad)

    lora = method_config("lora", config)
    target = trainable(method_config("alfa", config))
    gaps = {r: abs(trainable(dataclasses.replace(lora, rank=r)) - target) for r in range(16, 23)}
    assert min(gaps, key=gaps.get) == MATCHED_LORA_RANK and gaps[MATCHED_LORA_RANK] < 0.01 * target
    changes = ADAPTER_OPTION_CHANGES["adapter-lora-matched"]
    assert changes["alpha"] / changes["rank"] == lora.alpha / lora.rank
    # the row's settings carry the changed options (and so its hash); the rank-8 row's are as before
    row = main_variants(config)
    assert row["calibrate-adapter-lora-matched[k=9]"].calibration["adapter"]["options"]["rank"] == 19
    assert row["calibrate-adapter-lora[k=9]"].calibration["adapter"]["options"]["rank"] == 8


def test_alfa_report_writes_the_user_calibration_page_of_any_results(calibrated, tmp_path, capsys, monkeypatch):
    """A run of one's own (the smoke check's, these) gets its calibration rows' page from alfa report, not only the
    declared run's committed one; the main page says how; an existing page is not overwritten unasked."""
    import sys

    from alfa.cli import main

    out, _, _ = calibrated
    argv = ["report", "--results", str(out), "--out", str(tmp_path / "r.md"), "--figures", str(tmp_path / "f")]
    monkeypatch.setattr(sys, "argv", ["alfa", *argv, "--user-calibration", str(tmp_path / "u.md")])  # its header's
    assert main(sys.argv[1:]) == 0
    assert f"user calibration: {tmp_path / 'u.md'}" in capsys.readouterr().out
    page = (tmp_path / "u.md").read_text(encoding="utf-8")
    assert "## Error against k" in page and f"from `{out}`" in page and "alfa report --results" in page
    assert (tmp_path / "figures" / "u" / "error_vs_k.png").is_file() and "](figures/u/error_vs_k.png)" in page
    # no link to a protocol page that is not beside it (it led nowhere outside docs/)
    assert "The protocol is docs/user-calibration.md (§4" in page and "](user-calibration.md)" not in page
    assert "on a page of their own: `alfa report --user-calibration PAGE`" in (tmp_path / "r.md").read_text()
    assert main(sys.argv[1:]) == 0  # the pages it generated are regenerated as printed
    capsys.readouterr()
    (tmp_path / "notes.md").write_text("my notes\n")  # a file it did not generate is not overwritten unasked
    assert main([*argv, "--user-calibration", str(tmp_path / "notes.md")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--replace" in err and (tmp_path / "notes.md").read_text() == "my notes\n"
