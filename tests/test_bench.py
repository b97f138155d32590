"""The benchmark runner on a tiny configuration: a valid results.json, resumption, atomic writes."""

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from tiny_models import TinyGazeNet  # noqa: F401  (registers tiny_gaze_net)

import alfa
import alfa.gaze.personalize as personalization
import alfa.study.bench.produce as produce
from alfa.checkpoint import load_model
from alfa.cli import build_parser
from alfa.cli.bench import _pairs
from alfa.gaze.evaluate import load_images, person_errors
from alfa.gaze.pipeline import open_data
from alfa.gaze.tpgaze import MetaTrainConfig
from alfa.gaze.train import TrainConfig
from alfa.study.bench.ablations import ablation_variants
from alfa.study.bench.config import ABLATIONS, BenchConfig, OracleConfig
from alfa.study.bench.methods import PAIRS
from alfa.study.bench.plan import plan_records
from alfa.study.bench.record import Record
from alfa.study.bench.results import RESULTS_FILE, ResultsStore, load_results
from alfa.study.bench.runner import run_bench
from alfa.study.timing import cpu_name

REQUIRED = ("method", "pair", "seed", "error_deg", "per_person", "trainable_params", "inference_params")
REQUIRED += ("adapter_bytes", "seconds_per_user", "id", "config_hash")


def tiny(**overrides) -> BenchConfig:
    """Two target persons of 8 images at 16×16, a 4-person source, 2 personalization steps."""
    base = BenchConfig.quick()
    config = dataclasses.replace(
        base,
        preset="test",
        model="tiny_gaze_net",
        image_size=16,
        source_persons=4,
        source_images=12,
        val_persons=2,
        val_images=8,
        target_persons=2,
        target_images=8,
        rank=6,
        pretrain=TrainConfig(epochs=1, batch_size=16, lr=1e-3),
        recovery=TrainConfig(epochs=1, batch_size=16, lr=1e-4),
        personalize=dataclasses.replace(base.personalize, steps=2),
        oracle=OracleConfig(extra_images=4, steps=2, batch_size=4),
        meta=MetaTrainConfig(epochs=1, steps_per_epoch=2, batch_size=4),
        heads_values=(1, 8),
        alfa_rank=4,  # within the smallest SVD rank below (a rank above every layer's d is refused)
        rank_values=(2, 4),
        svd_ranks=(4, 6),
        step_values=(1, 2),
        slice_layer="layer3.0",
        update_layer="layer4.0",
        figure_slices=(0, 1, 3),
        latency_repeats=1,
        latency_batch=4,
        pairs=("E→M",),
        methods=("source-only", "alfa"),
        selected_methods=(),
        ablations=(),
    )
    return dataclasses.replace(config, **overrides)


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    config = tiny(methods=("source-only", "alfa", "in-domain", "oracle"))
    summary = run_bench(config, out, progress=False)
    return out, config, summary


def test_results_json_has_the_required_records(bench):
    out, config, summary = bench
    data = load_results(out)
    ids = {r["id"] for r in data["records"]}
    assert ids == {"source-only|E→M|seed0", "alfa|E→M|seed0", "in-domain|E→M|seed0", "oracle|E→M|seed0"}
    assert sorted(summary.ran) == sorted(ids) and summary.skipped == []
    for r in data["records"]:
        assert all(k in r for k in REQUIRED), r["id"]
        assert r["error_deg"] == pytest.approx(sum(r["per_person"].values()) / len(r["per_person"]))
        parts = r["per_person_parts"]
        assert parts.keys() == r["per_person"].keys()
        for q in parts.values():  # a mean |error| is never below the |mean error|
            assert q["yaw"] >= abs(q["yaw_bias"]) - 1e-9 and q["pitch"] >= abs(q["pitch_bias"]) - 1e-9
    by = {r["method"]: r for r in data["records"]}
    assert set(by["alfa"]["per_person"]) == {"p00", "p01"}
    assert set(by["in-domain"]["per_person"]) == {"v00", "v01"}
    # Alfa merges back into the truncated model: same parameter count as source-only, a per-user file.
    assert by["alfa"]["inference_params"] == by["source-only"]["inference_params"]
    assert by["alfa"]["merge"] == "factorized (rank d)"
    assert by["alfa"]["trainable_params"] > 0 and by["alfa"]["adapter_bytes"] > 0
    assert 0 < by["alfa"]["compact_bytes"] < by["alfa"]["adapter_bytes"]
    assert by["alfa"]["steps"] == 2 and by["alfa"]["seconds_per_user"] > 0
    assert by["oracle"]["labelled_images_per_person"] == 5 + 4
    assert data["sanity"]["E→M"]["source_only"]["mean"] == pytest.approx(by["source-only"]["error_deg"])
    assert data["runs"][0]["finished"] and data["runs"][0]["records_run"] == 4
    assert (out / "figure_data" / "rank_slices.safetensors").is_file()
    assert (out / "figure_data" / "updates.safetensors").is_file()


def test_record_errors_match_the_saved_adapter(bench):
    """The record's per-person error is the error of the base with that person's adapter file."""
    out, config, _ = bench
    data = load_results(out)
    base, _ = load_model(data["sources"]["E|seed0"]["cache"] + "/recovered/model.safetensors")
    full = open_data(config.target_spec("M", 0))
    target = full.subset([i for p in full.persons() for i in full.person_indices(p)[: config.target_images]])
    alfa.load_adapter(base, out / "adapters" / "E-M" / "seed0" / "alfa" / "p01.safetensors")
    error = person_errors(base.eval(), target, ["p01"], config.personalize.n_adapt)["p01"]
    record = next(r for r in data["records"] if r["method"] == "alfa")
    assert record["per_person"]["p01"] == pytest.approx(error, abs=1e-5)  # float32, other thread count


def test_sources_record_the_training_their_models_took(bench):
    out, _, _ = bench
    entry = load_results(out)["sources"]["E|seed0"]
    parts = entry["recorded_train_parts"]
    assert parts["pretrain"] > 0 and parts["recovery"] > 0
    assert entry["recorded_train_seconds"] == pytest.approx(sum(parts.values()))
    assert entry["cpu"] == cpu_name()  # trained here, by this run (a model read from its cache keeps its record's)


def test_a_source_read_from_its_cache_names_the_machine_that_trained_it(bench, tmp_path):
    """A run stopped after building its source models, before any record, wrote no source entry: its resume reads
    the models from the cache, and the cache says which machine trained them."""
    from alfa.study.bench.session import TRAINED_ON_FILE, Session

    out, config, _ = bench
    cache = Path(load_results(out)["sources"]["E|seed0"]["cache"])
    (cache / TRAINED_ON_FILE).write_text(json.dumps({"cpu": "the machine that trained it"}))
    resumed = Session(config, tmp_path, cache.parent, progress=False)
    src = resumed.build("E", 0)
    assert src.info["from_cache"] is True and src.info["cpu"] == "the machine that trained it"
    (cache / TRAINED_ON_FILE).unlink()  # a cache made before the file: not recorded, not this machine's name
    assert "cpu" not in Session(config, tmp_path, cache.parent, progress=False).build("E", 0).info
    (cache / TRAINED_ON_FILE).write_text(json.dumps({"cpu": cpu_name()}))


def test_resume_skips_finished_records(bench, monkeypatch):
    out, config, _ = bench
    before = (out / RESULTS_FILE).read_text()
    calls = []
    real = personalization.personalize_dataset
    monkeypatch.setattr(personalization, "personalize_dataset", lambda *a, **k: calls.append(1) or real(*a, **k))
    summary = run_bench(config, out, progress=False)
    assert summary.ran == [] and len(summary.skipped) == 4 and calls == []
    assert (out / RESULTS_FILE).read_text() == before  # nothing rewritten

    # A record whose configuration changed (here: its stored hash) is run again, and only that one.
    data = json.loads(before)
    next(r for r in data["records"] if r["method"] == "alfa")["config_hash"] = "stale"
    (out / RESULTS_FILE).write_text(json.dumps(data))
    summary = run_bench(config, out, progress=False)
    assert summary.ran == ["alfa|E→M|seed0"] and calls == [1]
    records = load_results(out)["records"]
    assert len(records) == 4 and next(r for r in records if r["method"] == "alfa")["config_hash"] != "stale"


def test_another_protocol_is_refused(bench):
    out, config, _ = bench
    with pytest.raises(
        ValueError, match=r"another benchmark configuration .*the folder's vs this run's: personalize.steps 2 vs 3\)"
    ):
        run_bench(dataclasses.replace(config, personalize=dataclasses.replace(config.personalize, steps=3)), out)
    # Selection options may differ between pieces of one benchmark.
    summary = run_bench(dataclasses.replace(config, methods=("alfa",)), out, progress=False, dry_run=True)
    assert summary.pending == [] and summary.skipped == ["alfa|E→M|seed0"]
    # So may ablation values: a new learning rate adds its records and keeps the finished ones.
    more = dataclasses.replace(config, methods=("alfa",), ablations=("lr",), lr_values=(1e-5, 1e-4))
    summary = run_bench(more, out, progress=False, dry_run=True)
    assert summary.skipped == ["alfa|E→M|seed0"]
    assert summary.pending == ["alfa[lr=1e-05]|E→M|seed0", "lora[lr=1e-05]|E→M|seed0", "lora|E→M|seed0"]


def test_interrupted_write_leaves_the_old_file_intact(bench, monkeypatch, tmp_path):
    out, config, _ = bench
    before = (out / RESULTS_FILE).read_text()
    store = ResultsStore(out, config)

    def crash(src, dst):
        raise KeyboardInterrupt("killed while writing")

    monkeypatch.setattr("alfa.fileio.os.replace", crash)
    with pytest.raises(KeyboardInterrupt):
        store.add_record(Record.from_dict({**load_results(out)["records"][0], "id": "x|E→M|seed0"}))
    assert (out / RESULTS_FILE).read_text() == before
    assert load_results(out)["records"]


def test_interrupted_run_keeps_finished_records_and_resumes(tmp_path, monkeypatch):
    config = tiny(methods=("source-only", "alfa"), ablations=("heads",))
    real = personalization.personalize_dataset
    calls = []

    def interrupt_second(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(personalization, "personalize_dataset", interrupt_second)
    with pytest.raises(KeyboardInterrupt):
        run_bench(config, tmp_path, progress=False)
    data = load_results(tmp_path)
    assert [r["id"] for r in data["records"]] == ["source-only|E→M|seed0", "alfa|E→M|seed0"]
    assert data["runs"][0]["finished"] is False and data["runs"][0]["records_run"] == 2
    summary = run_bench(config, tmp_path, progress=False)
    assert summary.ran == ["alfa[H=1]|E→M|seed0"]
    assert sorted(summary.skipped) == ["alfa|E→M|seed0", "source-only|E→M|seed0"]


def test_plan_deduplicates_ablation_defaults():
    config = tiny(pairs=("E→M", "G→D"), methods=("alfa",), ablations=("heads", "loss"), ablation_pairs=("E→M",))
    ids = [p.id for p in plan_records(config)]
    assert ids == [
        "alfa|E→M|seed0",
        "alfa[H=1]|E→M|seed0",
        "source-only|E→M|seed0",
        "alfa[loss=augment]|E→M|seed0",
        "alfa[loss=roll]|E→M|seed0",
        "alfa[loss=flip+roll]|E→M|seed0",
        "alfa|G→D|seed0",
    ]
    lrs = ablation_variants("lr", tiny(lr_values=(1e-5, 1e-4)))
    assert [v.label for v in lrs] == ["alfa[lr=1e-05]", "alfa", "lora[lr=1e-05]", "lora"]
    assert lrs[0].recipe == {"lr": 1e-5} and lrs[1].recipe == {}
    inits = ablation_variants("init", tiny(init_std_values=(0.007, 0.02)))
    assert [v.label for v in inits] == ["alfa[σ=0.007]", "alfa"]
    assert inits[0].adapter.init_std == 0.007 and inits[0].adapter.heads == inits[1].adapter.heads
    # a recipe option left off does not enter the stored configuration (results made before it stay valid)
    assert "pitch_anchor" not in tiny().protocol_dict()["personalize"]
    anchors = ablation_variants("anchor", tiny(anchor_values=(0.0, 1.0)))
    assert [v.label for v in anchors] == ["source-only", "alfa", "alfa[anchor=1]", "lora", "lora[anchor=1]"]
    assert anchors[2].recipe == {"pitch_anchor": 1.0} and anchors[1].recipe == {}
    heads = ablation_variants("heads", config)
    assert [v.label for v in heads] == ["alfa[H=1]", "alfa"] and [v.value for v in heads] == [1, 8]
    with pytest.raises(ValueError, match="unknown ablation"):
        ablation_variants("nope", config)
    with pytest.raises(ValueError, match="unknown pair"):
        tiny(pairs=("E→X",)).validate()


def test_command_line_options():
    assert _pairs("E-M,g->d,EM") == ["E→M", "G→D", "E→M"]
    parser = build_parser()
    args = parser.parse_args(["bench", "--full", "--seeds", "1,2", "--ablations", "none", "--dry-run"])
    assert args.full and args.seeds == (1, 2) and args.dry_run
    args = parser.parse_args(["report", "--results", "runs/bench"])
    assert args.out == "docs/results.md"
    full, quick = BenchConfig.full(), BenchConfig.quick()
    assert len(full.seeds) >= 3 and set(full.pairs) == set(PAIRS) and full.ablations == ABLATIONS
    assert quick.pairs == full.pairs and quick.methods == full.methods


def test_report_from_a_real_run(bench, tmp_path):
    """The report command turns the tiny run into markdown with its figures (models not needed)."""
    from alfa.study.bench.report_page import build_report

    out, _, _ = bench
    md = build_report(out, tmp_path / "results.md")
    text = md.read_text()
    assert "| source-only (truncated base) |" in text and "| Alfa |" in text
    assert "numerical rank" in text
    for name in ("rank_slices.png", "update_maps.png"):
        assert (tmp_path / "figures" / "results" / name).is_file()
        assert f"figures/results/{name}" in text


def test_a_failing_record_is_reported_and_the_run_goes_on(tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("cost measurement broke")

    monkeypatch.setattr(produce, "adapter_costs", broken)
    summary = run_bench(tiny(methods=("alfa", "source-only")), tmp_path, progress=False)
    assert summary.errors == {"alfa|E→M|seed0": "RuntimeError: cost measurement broke"}
    assert summary.ran == ["source-only|E→M|seed0"]
    assert [r["id"] for r in load_results(tmp_path)["records"]] == ["source-only|E→M|seed0"]


def test_same_seed_same_numbers(tmp_path):
    config = tiny(methods=("alfa", "oracle"))
    a = run_bench(config, tmp_path / "a", cache_dir=tmp_path / "cache", progress=False)
    b = run_bench(config, tmp_path / "b", cache_dir=tmp_path / "cache", progress=False)
    assert a.ran == b.ran == ["alfa|E→M|seed0", "oracle|E→M|seed0"]
    ra, rb = load_results(tmp_path / "a")["records"], load_results(tmp_path / "b")["records"]
    assert [r["per_person"] for r in ra] == [r["per_person"] for r in rb]
    assert [r["config_hash"] for r in ra] == [r["config_hash"] for r in rb]


def test_target_trained_yardstick_uses_the_target_worlds_own_persons(tmp_path):
    config = tiny(methods=("source-only", "target-trained"))
    assert "split=train" in config.source_spec("M") and "mpii" in config.source_spec("M")
    assert "split=val" in config.val_spec("M")
    summary = run_bench(config, tmp_path, progress=False)
    assert sorted(summary.ran) == ["source-only|E→M|seed0", "target-trained|E→M|seed0"]
    data = load_results(tmp_path)
    by = {r["method"]: r for r in data["records"]}
    # Scored on the same target persons as every method, with a model of its own (built from the target world).
    assert set(by["target-trained"]["per_person"]) == set(by["source-only"]["per_person"]) == {"p00", "p01"}
    assert {"E|seed0", "M|seed0"} <= set(data["sources"])
    assert data["sources"]["E|seed0"]["cache"] != data["sources"]["M|seed0"]["cache"]
    assert by["target-trained"]["per_person"] != by["source-only"]["per_person"]
    s = data["sanity"]["E→M"]
    assert s["target_gap_deg"] == pytest.approx(by["source-only"]["error_deg"] - by["target-trained"]["error_deg"])


def test_within_target_models_train_on_within_images_and_sources_do_not():
    """``within_images`` sizes only the within-target models' training data (the standard v2 preset: 400 per
    person against the sources' 200); unset, they train like a source; a file stored before the field existed
    compares as unset."""
    from alfa.study.bench.config import V2_SOURCE_IMAGES, V2_WITHIN_IMAGES
    from alfa.study.bench.schema import comparable_protocol

    standard = BenchConfig.standard()
    assert f"images_per_person={V2_WITHIN_IMAGES}" in standard.source_spec("M")
    assert f"images_per_person={V2_WITHIN_IMAGES}" in standard.source_spec("D")
    assert f"images_per_person={V2_SOURCE_IMAGES}" in standard.source_spec("E")
    assert V2_WITHIN_IMAGES != V2_SOURCE_IMAGES
    plain = tiny()
    assert plain.within_images is None
    assert f"images_per_person={plain.source_images}" in plain.source_spec("M")
    assert BenchConfig.first_standard().within_images is None
    stored = {k: v for k, v in plain.protocol_dict().items() if k != "within_images"}
    assert comparable_protocol(stored) == comparable_protocol(plain.protocol_dict())
    assert comparable_protocol(stored) != comparable_protocol(tiny(within_images=7).protocol_dict())
    with pytest.raises(ValueError, match="within_images must be at least 1"):
        tiny(within_images=0).validate()


def test_a_piece_of_within_target_records_never_builds_the_pairs_source(tmp_path, monkeypatch):
    """``--methods target-trained --pairs E→D`` next to a piece that builds E: only D's own model is built."""
    from alfa.study.bench.session import Session

    built = []
    real = Session.build
    monkeypatch.setattr(Session, "build", lambda self, key, seed: built.append((key, seed)) or real(self, key, seed))
    config = tiny(methods=("target-trained",), pairs=("E→D",))
    assert config.figure_pair not in config.pairs  # no rank-slice figure to make from E here
    summary = run_bench(config, tmp_path, progress=False)
    assert summary.ran == ["target-trained|E→D|seed0"] and not summary.errors
    assert set(built) == {("D", 0)}
    assert [p.name for p in (tmp_path / "cache").iterdir() if p.is_dir()] == [
        Path(load_results(tmp_path)["sources"]["D|seed0"]["cache"]).name
    ]


def test_a_within_target_model_is_built_once_and_freed_after_the_last_group_using_it(tmp_path, monkeypatch):
    """E→D and G→D share D's own model: trained once, kept from E's group into G's, freed when G's ends (it used
    to stay in memory for the rest of the run)."""
    import alfa.study.bench.session as session_module
    from alfa.study.bench.session import Session

    sessions, trained, released = [], [], []
    real_build, real_release, real_source = Session.build, Session.release, session_module.build_source_model

    def build(self, key, seed):
        sessions.append(self)
        return real_build(self, key, seed)

    def release(self, key, seed):
        context = self.sources.get((key, seed))
        released.append((key, seed, context is not None and context.models is not None))
        real_release(self, key, seed)

    monkeypatch.setattr(Session, "build", build)
    monkeypatch.setattr(Session, "release", release)
    monkeypatch.setattr(
        session_module,
        "build_source_model",
        lambda spec, *a, **k: trained.append(spec.source) or real_source(spec, *a, **k),
    )
    summary = run_bench(tiny(methods=("target-trained",), pairs=("E→D", "G→D")), tmp_path, progress=False)
    assert summary.ran == ["target-trained|E→D|seed0", "target-trained|G→D|seed0"] and not summary.errors
    assert len(trained) == 1 and "eyediap" in trained[0]  # D's model, trained once for both groups
    # E's group kept D's model for G's (E's own was never built), and G's freed it
    assert released == [("E", 0, False), ("D", 0, True), ("G", 0, False)]
    session = sessions[0]
    assert all(s is session for s in sessions)
    assert session.sources[("D", 0)].models is None and session.sources[("D", 0)].info["from_cache"] is False


def test_target_persons_are_drawn_afresh_per_seed_unless_fixed(tmp_path):
    """``target_draw="per_seed"``: each seed scores other persons (other images, other record hashes); with
    ``"fixed"`` every seed scores the same ones. The within-target model's training data never depends on it."""
    from alfa.study.bench.session import Session

    def images(config, seed):
        return Session(config, tmp_path, tmp_path / "cache", progress=False).target("M", seed).data

    fresh, fixed = tiny(target_draw="per_seed"), tiny(target_draw="fixed")
    a, b = images(fresh, 0), images(fresh, 1)
    assert a.persons() == b.persons() and len(a) == len(b)
    assert not torch.equal(load_images(a, range(len(a))), load_images(b, range(len(b))))
    assert torch.equal(load_images(a, range(len(a))), load_images(images(fixed, 0), range(len(a))))
    same = images(fixed, 1)
    assert torch.equal(load_images(images(fixed, 0), range(len(a))), load_images(same, range(len(same))))
    assert fresh.source_spec("M") == fixed.source_spec("M")
    with pytest.raises(ValueError, match="target_draw must be one of"):
        tiny(target_draw="sometimes").validate()
    with pytest.raises(ValueError, match="worlds must be one of"):
        tiny(worlds="v3").validate()


def test_the_declared_v2_run_is_every_row_on_seeds_0_to_5_and_the_familys_rows_beyond():
    from alfa.study.bench.methods import (
        CONSTRUCTED_CONTROLS,
        DECLARED_FAMILY_ROWS,
        FAMILY_SEEDS,
        PAIRS,
        PNPGA_FAMILY_SEEDS,
        REPLICATE_SEEDS,
    )
    from alfa.study.bench.plan import declared_run, declared_run_progress

    assert declared_run("v1") == [] and declared_run_progress("v1", []) is None
    plans = declared_run("v2")
    ids = [p.id for p in plans]
    assert len(ids) == len(set(ids))
    assert {p.seed for p in plans} == {0, 1, 2, *FAMILY_SEEDS}
    first = {p.variant.label.split("[")[0] for p in plans if p.seed == 0}
    beyond = [s for s in FAMILY_SEEDS if s not in REPLICATE_SEEDS and s not in PNPGA_FAMILY_SEEDS]
    later = {p.variant.label.split("[")[0] for p in plans if p.seed == beyond[0]}
    assert later == set(DECLARED_FAMILY_ROWS) and later < first
    # PnP-GA's rows also on seeds 4–6 of every pair (§7.2's amendment of 2026-12-03), nowhere else beyond 0–2
    pnpga = {(p.pair, p.seed) for p in plans if p.variant.label == "pnpga" and p.seed in FAMILY_SEEDS}
    assert pnpga == {(pair, s) for pair in PAIRS for s in PNPGA_FAMILY_SEEDS} and set(PNPGA_FAMILY_SEEDS) < set(
        FAMILY_SEEDS
    )
    at_6 = {p.variant.label.split("[")[0] for p in plans if p.seed == 6}
    assert 6 in PNPGA_FAMILY_SEEDS and 6 not in REPLICATE_SEEDS and at_6 == later | {"pnpga"}
    # seeds 3–5 replicate every record of seeds 0–2 but PnP-GA's (its own seeds) and the constructed control's
    # (§7.2's amendment of 2026-12-04): the same labels on the same pairs and stand-ins
    assert set(REPLICATE_SEEDS) < set(FAMILY_SEEDS) and {"pnpga", "ruda", "target-trained"} <= first
    for s in REPLICATE_SEEDS:
        rows = {(p.variant.label, p.pair) for p in plans if p.seed == s and p.variant.label != "pnpga"}
        zero = {(p.variant.label, p.pair) for p in plans if p.seed == 0 and p.variant.label != "pnpga"}
        assert rows == {r for r in zero if r[1] not in CONSTRUCTED_CONTROLS}
    on_3 = next(p.id for p in plans if p.seed == REPLICATE_SEEDS[0] and p.variant.label == "alfa[selected]")
    held = ids[:3] + [ids[-1], on_3, "not|a|record"]
    progress = declared_run_progress("v2", held)
    assert progress.held == 5 and progress.total == len(plans)
    missing = progress.selections + progress.ablations + progress.rows
    assert missing + progress.family_missing + progress.replicate_missing == len(plans) - 5
    assert progress.selections > 0 and progress.ablations > 0
    # the family's records on each of its seeds are those of a seed with nothing else (7), and PnP-GA's on its seeds
    only_family = sum(p.seed == beyond[0] for p in plans)
    family = {s: only_family + len(PAIRS) * (s in PNPGA_FAMILY_SEEDS) for s in FAMILY_SEEDS}
    assert progress.family_missing == sum(family.values()) - 1  # the family's record held on seed 3
    assert (
        progress.replicate_missing
        == sum(p.seed in REPLICATE_SEEDS for p in plans) - sum(family[s] for s in REPLICATE_SEEDS) - 1
    )
