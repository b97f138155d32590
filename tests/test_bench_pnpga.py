"""PnP-GA as a benchmark row: an opt-in method no claimed preset plans (so no existing plan or hash changes; the
smoke check runs it), and one record made end to end on the tiny configuration of test_bench."""

import dataclasses
import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from bench_records import results_of
from test_bench import tiny

import alfa.study.bench.pnpga as bench_pnpga
import alfa.study.bench.session as bench_session
from alfa.checkpoint import read_checkpoint
from alfa.gaze.train import TrainConfig
from alfa.study.bench.config import BenchConfig
from alfa.study.bench.methods import OPT_IN_METHODS
from alfa.study.bench.plan import plan_records
from alfa.study.bench.produce import OPT_IN_KINDS
from alfa.study.bench.report_page import render_report
from alfa.study.bench.results import load_results
from alfa.study.bench.runner import run_bench
from alfa.study.bench.schema import variant_key
from alfa.study.bench.variants import main_variants
from alfa.study.timing import cpu_name


def test_no_claimed_preset_plans_pnpga_and_other_rows_hash_as_before():
    for preset in (BenchConfig.quick(), BenchConfig.standard(), BenchConfig.first_standard()):
        assert not {p.variant.kind for p in plan_records(preset)} & set(OPT_IN_KINDS)
        assert "pnpga" not in preset.methods
    standard = BenchConfig.standard()
    rows = main_variants(standard)
    assert all("pnpga" not in variant_key(v) for label, v in rows.items() if label not in OPT_IN_METHODS)
    row = rows["pnpga"]
    # the paper's ten members fit the standard preset's twelve epochs; the benchmark's own adaptation images
    assert (row.kind, row.base) == ("pnpga", "dense")
    assert row.pnpga.members == 10 and row.pnpga.images == standard.personalize.n_adapt
    # the student that started from the record's own source model (the last snapshot) predicts
    assert row.pnpga.predict_with == 9 and variant_key(row)["pnpga"]["members"] == 10
    # the smoke preset (no claims) runs it: its two epochs give two members
    (plan,) = [p for p in plan_records(BenchConfig.smoke()) if p.variant.kind == "pnpga" and p.pair == "E→M"]
    assert plan.variant.pnpga.members == 2 and plan.variant.pnpga.predict_with == 1


def test_a_pnpga_record_end_to_end(tmp_path, monkeypatch):
    monkeypatch.setattr(bench_pnpga, "AUTHORS_PREDICTOR", 0)  # two members: let the authors' student be another
    config = tiny(methods=("pnpga",), pretrain=TrainConfig(epochs=2, batch_size=16, lr=1e-3))
    summary = run_bench(config, tmp_path, progress=False)
    assert summary.ran == ["pnpga|E→M|seed0"] and not summary.errors
    data = load_results(tmp_path)
    (record,) = data["records"]
    assert record["kind"] == "pnpga" and record["base"] == "dense"
    persons = {"p00", "p01"}
    assert set(record["per_person"]) == persons and record["error_deg"] > 0
    detail, domain = record["pnpga"], record["domain_protocol"]
    assert detail["members"] == 2 and detail["member_epochs"] == [1, 2] and detail["predict_with"] == 1
    for part in ("adapted_mean", "unadapted", "unadapted_mean"):
        assert set(detail[part]["per_person"]) == persons
    third = detail["third_student"]  # the student the authors' script scores, where it is not the predictor
    assert set(third["adapted"]["per_person"]) == set(third["unadapted"]["per_person"]) == persons
    assert third["adapted"]["per_person"] != record["per_person"]
    # the domain protocol: each person's adapted predictor on every person's scored images
    assert set(domain["per_person"]) == persons and domain["scored_images"] == 2 * (8 - 5)
    assert domain["error_deg"] == pytest.approx(sum(domain["per_person"].values()) / 2)
    cost = detail["cost"]
    assert cost["members"] == 2 and cost["shipped_model_bytes"] == 2 * record["inference_params"] * 4
    assert cost["source_images"] == 10 and cost["shipped_source_bytes"] > 0
    assert record["trainable_params"] == 2 * record["inference_params"] and record["seconds_per_user"] > 0
    # 5 adaptation images and 10 source images in batches of 4: 2 steps per epoch, 10 epochs
    assert record["steps"] == 20
    source = data["sources"]["E|seed0"]
    assert source["pnpga_members"]["members"] == 2 and len(source["pnpga_members"]["val_error_per_epoch"]) == 2
    # the last snapshot is the record's own dense source model (here kept by its own pre-training; that a training
    # run again gives the same members is test_pnpga's)
    dense = read_checkpoint(Path(source["cache"]) / "pretrain" / "model.safetensors")[0]
    last = read_checkpoint(Path(source["pnpga_members"]["folder"]) / "epoch-002.safetensors")[0]
    assert dense.keys() == last.keys() and all(torch.equal(dense[k], last[k]) for k in dense)
    # ... kept while the source model itself pre-trained (a fresh cache): no second training, whose state the
    # ensemble's folder would hold beside the final model
    assert sorted(p.name for p in (Path(source["pnpga_members"]["folder"]) / "pretrain").iterdir()) == [
        "model.safetensors"
    ]
    assert source["pnpga_members"]["kept_by_the_source_training"] is True
    again = run_bench(config, tmp_path, progress=False)
    assert again.skipped == ["pnpga|E→M|seed0"] and again.ran == []


def test_a_source_model_built_again_differently_is_refused(tmp_path):
    """A lost cache is rebuilt; a rebuild that does not end where the recorded one did (a changed training, a
    machine whose numbers differ) must not add records beside those of the recorded model."""
    from alfa.study.bench.session import refuse_a_different_model as _refuse_a_different_source

    recorded = {"cache": "runs/x/cache/source-ab", "pretrain_final_val_error": 6.25, "truncation": {"errors": {}}}
    recorded["truncation"]["errors"]["after_recovery"] = 7.5
    same = {**recorded, "cache": "elsewhere/cache/source-ab"}  # another folder, the same key
    _refuse_a_different_source(recorded, same)
    _refuse_a_different_source({}, same)  # nothing recorded yet
    _refuse_a_different_source(recorded, {**same, "cache": "c/source-cd", "pretrain_final_val_error": 1.0})
    with pytest.raises(RuntimeError, match=r"differs .*pre-training's validation error 6\.5, recorded 6\.25"):
        _refuse_a_different_source(recorded, {**same, "pretrain_final_val_error": 6.5})
    recovered = {**same, "truncation": {"errors": {"after_recovery": 7.25}}}
    with pytest.raises(RuntimeError, match=r"error after recovery 7\.25, recorded 7\.5"):
        _refuse_a_different_source(recorded, recovered)


def test_an_ensemble_of_one_is_refused_with_one_line():
    row = main_variants(tiny(pretrain=TrainConfig(epochs=1, batch_size=16, lr=1e-3)))["pnpga"]
    with pytest.raises(ValueError, match="at least 2 ensemble members"):
        row.pnpga.validate()


def test_a_pnpga_record_renders_its_rows_its_bullet_and_the_domain_protocol_beside_the_published_numbers():
    config = BenchConfig.standard(
        methods=("source-only", "pnpga"), selected_methods=(), default_methods=(), ablations=()
    )
    config = dataclasses.replace(config, pairs=("E→M",), seeds=(0,))
    results = results_of(config, (("source-only", 9.0), ("pnpga", 8.0)), seeds=(0,))
    cost = {"source_images": 64, "shipped_model_bytes": 3 * 2**20, "shipped_source_bytes": 2**20}
    for record in results["records"]:
        if record["method"] == "pnpga":
            record["method_config"] = {"epochs": 7, "lr": 0.0001}
            record["pnpga"] = {
                "members": 3,
                "member_epochs": [4, 5, 6],
                "predict_with": 2,
                "adaptation_images": 5,
                "cost": {**cost, "training_param_bytes": 6 * 2**20},
            }
            record["domain_protocol"] = {"error_deg": 7.25, "unadapted_deg": 9.5, "per_person": {}}
    text = render_report(results)
    name = "PnP-GA (ensemble of source snapshots, mean teachers, one student predicts)"
    assert text.count(f"| {name} |") == 3  # Table 1, the persons table and the cost table
    bullet = next(line for line in text.splitlines() if line.startswith("- **PnP-GA**"))
    assert "an ensemble of 3 source models" in bullet and "first 5 unlabelled images" in bullet
    assert "epochs 4–6" in bullet and "member 2 (the epoch-6 snapshot" in bullet
    assert "the 3 source models (3.00 MiB) and the labelled source images (1.00 MiB)" in bullet
    published = " | ".join(f"{x:g}" for x in bench_pnpga.PUBLISHED["E→M"])
    assert f"| E→M | 1 | 9.50 (one seed) | 7.25 (one seed) | {published} |" in text
    without = [r for r in results["records"] if r["method"] != "pnpga"]
    bare = render_report({**results, "records": without})
    assert "PnP-GA" not in bare  # no record, no row, no bullet and no domain line


def _seed0_made_elsewhere(tmp_path):
    """E seed 0's source-only record made here, then the results' entry for its model pointed at another
    machine's: the configuration, the results file, its data (not yet written back) and the model made here."""
    config = tiny(methods=("source-only",), pretrain=TrainConfig(epochs=1, batch_size=16, lr=1e-3))
    assert run_bench(config, tmp_path, progress=False).ran == ["source-only|E→M|seed0"]
    data = load_results(tmp_path)
    here = data["sources"]["E|seed0"]["cache"]
    data["sources"]["E|seed0"]["cache"] = str(Path(here).parent / "source-0123456789ab")  # made elsewhere
    return config, tmp_path / "results.json", data, here


def _refused_before_anything_runs(config, tmp_path, match: str) -> None:
    """``config``'s run into ``tmp_path`` is refused (``ValueError`` matching ``match``), as a dry run and as a run,
    with the results file unchanged: nothing written, nothing trained."""
    before = (tmp_path / "results.json").read_bytes()
    for dry_run in (True, False):
        with pytest.raises(ValueError, match=match):
            run_bench(config, tmp_path, progress=False, dry_run=dry_run)
    assert (tmp_path / "results.json").read_bytes() == before


def _no_world_renders(monkeypatch) -> None:
    """From here on a world rendered by the benchmark's session fails the test: a refusal that needs no data
    must come before the minutes a world takes to render."""

    def render(spec):
        raise AssertionError(f"{spec} was rendered")

    monkeypatch.setattr(bench_session, "open_data", render)


def test_a_seed_made_with_another_machines_model_is_refused_before_anything_trains(tmp_path):
    """Another kind of CPU renders the worlds a few bits differently, so the same seed gets another source model
    (another cache key): a piece that would add records to a seed made elsewhere stops before training."""
    config, path, data, here = _seed0_made_elsewhere(tmp_path)
    assert data["runs"][-1]["cpu"] == cpu_name() != ""  # the log of runs names the kind of machine
    assert data["runs"][-1]["cpu_capability"] == torch.backends.cpu.get_cpu_capability()  # and torch's instructions
    data["records"] = []  # its records are to be made (again) here
    path.write_text(json.dumps(data))
    made_elsewhere = r"E seed 0's records were made with the model source-0123456789ab, and its data and recipe give "
    _refused_before_anything_runs(config, tmp_path, made_elsewhere + rf"{Path(here).name} here")
    other_seed = dataclasses.replace(config, seeds=(1,))
    assert run_bench(other_seed, tmp_path, progress=False).ran == ["source-only|E→M|seed1"]
    # the same key, but the model (built again, or here read from its cache) does not end where the recorded did
    data["sources"]["E|seed0"]["cache"] = here
    data["sources"]["E|seed0"]["pretrain_final_val_error"] += 0.5
    path.write_text(json.dumps(data))
    with pytest.raises(RuntimeError, match=r"source-\w+ was built again and differs .*validation error"):
        run_bench(config, tmp_path, progress=False)
    assert load_results(tmp_path)["records"] == []


def test_a_recorded_model_another_cpu_trained_is_not_trained_again_here_unasked(tmp_path, monkeypatch):
    """The same images train other bits on a CPU with other vector instructions, so a recorded model that another
    CPU trained, missing from this cache, is refused before its training (which its record would refuse after),
    and before its data render, unless --rebuild-elsewhere; one the cache holds is loaded and compared with its
    record as ever."""
    config = tiny(methods=("source-only",), pretrain=TrainConfig(epochs=1, batch_size=16, lr=1e-3))
    assert run_bench(config, tmp_path, progress=False).ran == ["source-only|E→M|seed0"]
    path, data = tmp_path / "results.json", load_results(tmp_path)
    cache = Path(data["sources"]["E|seed0"]["cache"])
    data["sources"]["E|seed0"]["cpu"] = "Another CPU (family 1, model 1)"
    data["records"] = []
    path.write_text(json.dumps(data))
    assert run_bench(config, tmp_path, progress=False).ran == ["source-only|E→M|seed0"]  # held here: loaded
    path.write_text(json.dumps(data))
    shutil.rmtree(cache)
    before = path.read_bytes()
    said = rf"E seed 0's records were made with the model {cache.name}, trained on Another CPU \(family 1, model 1\); "
    _no_world_renders(monkeypatch)
    _refused_before_anything_runs(config, tmp_path, said + rf"this machine is {re.escape(cpu_name())}, .* --rebuild-")
    monkeypatch.undo()
    assert not cache.exists()
    # a record made before records kept their CPU is taken as made where the seed's other models were
    unnamed = json.loads(before)
    unnamed["sources"]["E|seed0"].pop("cpu")
    unnamed["sources"]["G|seed0"] = {"cache": "cache/source-0123456789ab", "cpu": "Another CPU (family 1, model 1)"}
    path.write_text(json.dumps(unnamed))
    with pytest.raises(ValueError, match=r"trained on Another CPU \(family 1, model 1\)"):
        run_bench(config, tmp_path, progress=False, dry_run=True)
    path.write_bytes(before)
    # asked: trained again, and the comparison with its record decides (this CPU trained it: the same model)
    assert run_bench(config, tmp_path, progress=False, rebuild_elsewhere=True).ran == ["source-only|E→M|seed0"]
    assert (cache / "recovered" / "model.safetensors").is_file()


def test_a_model_new_to_a_seed_another_cpu_made_is_refused_though_the_probe_passes(tmp_path, monkeypatch):
    """A CPU that renders the worlds alike (the probe passes) can still train other bits: a model new to a seed
    whose source models another CPU trained is refused before it trains (and before its data render), unless
    --new-models-elsewhere (its entry then names this CPU) or this cache holds it finished; a seed made here trains
    it as before."""
    config = tiny(methods=("source-only",), pretrain=TrainConfig(epochs=1, batch_size=16, lr=1e-3))
    assert run_bench(config, tmp_path, progress=False).ran == ["source-only|E→M|seed0"]
    path, data = tmp_path / "results.json", load_results(tmp_path)
    data["sources"]["E|seed0"]["cpu"] = "Another CPU (family 1, model 1)"
    path.write_text(json.dumps(data))
    before = path.read_bytes()
    within = dataclasses.replace(config, methods=("target-trained",))
    said = r"seed 0's models were trained on Another CPU \(family 1, model 1\); this machine is "
    new = rf"{re.escape(cpu_name())}, .* M's model, new to the seed, .* give --new-models-elsewhere"
    _no_world_renders(monkeypatch)
    _refused_before_anything_runs(within, tmp_path, said + new)
    monkeypatch.undo()
    assert not list((tmp_path / "cache").glob("*M*"))
    # a within-target model another machine added (declared) does not make the seed's machine unknown
    data["sources"]["M|seed0"] = {"cache": "cache/source-0123456789ab", "cpu": cpu_name()}
    path.write_text(json.dumps(data))
    _refused_before_anything_runs(dataclasses.replace(within, pairs=("E→D",)), tmp_path, said)
    # nor do source models that name no CPU (made before records kept one) beside the one that does
    data["sources"]["G|seed0"] = {"cache": "cache/source-0123456789ab"}
    path.write_text(json.dumps(data))
    _refused_before_anything_runs(dataclasses.replace(within, pairs=("E→D",)), tmp_path, said)
    path.write_bytes(before)
    ran = run_bench(within, tmp_path, progress=False, new_models_elsewhere=True)
    assert ran.ran == ["target-trained|E→M|seed0"]
    assert load_results(tmp_path)["sources"]["M|seed0"]["cpu"] == cpu_name()  # the entry keeps this CPU
    # the model this cache holds finished, though no result names it: loaded, not refused
    path.write_bytes(before)
    assert run_bench(within, tmp_path, progress=False).ran == ["target-trained|E→M|seed0"]
    data["sources"]["E|seed0"]["cpu"] = cpu_name()  # the seed made here: nothing to refuse
    data["sources"].pop("M|seed0", None)
    path.write_text(json.dumps(data))
    assert run_bench(dataclasses.replace(within, pairs=("E→D",)), tmp_path, progress=False, dry_run=True).pending


def test_a_model_new_to_a_seed_made_elsewhere_is_refused_by_a_probe_of_a_recorded_one(tmp_path):
    """A piece whose models no record of the seed used yet (here the target's within-target model) cannot be
    compared with a record of its own: the seed's recorded source model is rendered here as a probe instead."""
    config, path, data, here = _seed0_made_elsewhere(tmp_path)
    path.write_text(json.dumps(data))
    within = dataclasses.replace(config, methods=("target-trained",))
    said = r"seed 0's records were made with E's model source-0123456789ab, and E's data and recipe give "
    later = r" here .* this piece's new models would join a seed made on another kind of machine"
    _refused_before_anything_runs(within, tmp_path, said + Path(here).name + later)
    seed1 = dataclasses.replace(within, seeds=(1,))  # a seed with no record: nothing to probe, this machine makes it
    assert run_bench(seed1, tmp_path, progress=False).ran == ["target-trained|E→M|seed1"]
    data["sources"]["E|seed0"]["cache"] = here  # the machine that made the seed: the probe agrees
    path.write_text(json.dumps(data))
    assert run_bench(within, tmp_path, progress=False).ran == ["target-trained|E→M|seed0"]
