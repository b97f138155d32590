"""The gaze chain end to end on tiny data: pre-training, truncation + recovery, personalization,
evaluation, merge; resumption, determinism, failure handling, the CLI and the demo."""

import copy
import json
import math

import pytest
import torch
from tiny_models import TinyGazeNet  # noqa: F401  (registers tiny_gaze_net)

import alfa
from alfa.checkpoint import CheckpointError, load_model, read_checkpoint
from alfa.gaze.data.base import InMemoryGazeDataset
from alfa.gaze.evaluate import adapter_filename, evaluate, person_errors
from alfa.gaze.losses import flip_symmetry_loss
from alfa.gaze.personalize import PersonalizeConfig, build_batch, personalize, personalize_dataset
from alfa.gaze.train import TrainConfig, TruncateConfig, train_source, truncate_and_recover
from alfa.layers import is_factorized

# ----------------------------------------------------------------------------- fixtures


def toy_dataset(persons: int, images: int, size: int = 16, seed: int = 0, name: str = "toy", shift: float = 0.0):
    """Blob images whose blob position encodes (yaw, pitch) (a horizontal flip negates yaw), with a
    per-person colour tint and a global brightness ``shift`` as the domain gap."""
    g = torch.Generator().manual_seed(seed)
    n = persons * images
    gaze = (torch.rand(n, 2, generator=g) - 0.5) * 0.8
    ids = torch.arange(persons).repeat_interleave(images)
    tint = torch.rand(persons, 3, generator=g)[ids] * 0.3 + shift
    coords = (torch.arange(size) - (size - 1) / 2) / (size / 2)
    cx, cy = gaze[:, 0] * 1.2, -gaze[:, 1] * 1.2
    blob = torch.exp(
        -((coords[None, None] - cx[:, None, None]) ** 2 + (coords[None, :, None] - cy[:, None, None]) ** 2) / 0.05
    )
    img = 0.2 + tint[:, :, None, None] + 0.6 * blob[:, None] + 0.02 * torch.randn(n, 3, size, size, generator=g)
    pixels = (img.clamp(0, 1) * 255).round().to(torch.uint8)
    return InMemoryGazeDataset(pixels, gaze, ids, [f"p{i:02d}" for i in range(persons)], name=name)


FAST = TrainConfig(epochs=1, batch_size=16, lr=1e-3, val_fraction=0.25)
RANK = 6


def _chain(tmp, source, target, method=None, steps=3):
    """Every stage once; returns what the tests look at."""
    torch.manual_seed(0)
    model = alfa.models.create_model("tiny_gaze_net")
    pre = train_source(model, source, FAST, tmp / "pre", model_name="tiny_gaze_net", progress=False)
    dense, _ = load_model(tmp / "pre" / "model.safetensors")
    base = copy.deepcopy(dense)
    trunc = truncate_and_recover(
        base,
        source,
        TruncateConfig(rank=RANK, recovery=FAST),
        tmp / "rec",
        val_persons=pre.val_persons,
        model_name="tiny_gaze_net",
        progress=False,
    )
    run = personalize_dataset(
        base,
        target,
        method or alfa.AlfaConfig(heads=2, rank=2),
        PersonalizeConfig(steps=steps),
        tmp / "ad",
        progress=False,
    )
    report = evaluate(base, target, adapters=tmp / "ad", progress=False)
    return pre, dense, base, trunc, run, report


@pytest.fixture(scope="module")
def data():
    source = toy_dataset(8, 12, seed=1, name="src")
    target = toy_dataset(3, 9, seed=2, name="tgt", shift=0.15)
    return source, target


# ----------------------------------------------------------------------------- the chain


@pytest.fixture(scope="module")
def chain(tmp_path_factory, data):
    tmp = tmp_path_factory.mktemp("chain")
    return tmp, _chain(tmp, *data)


def test_tiny_end_to_end_goes_through_every_stage(chain, data):
    source, target = data
    tmp_path, (pre, dense, base, trunc, run, report) = chain

    # pre-training: a checkpoint with its config, one epoch, finite validation on held-out persons
    _, saved = read_checkpoint(tmp_path / "pre" / "model.safetensors")
    assert saved["extra"]["complete"] and saved["extra"]["epoch"] == 1
    assert set(pre.val_persons).isdisjoint(pre.train_persons) and len(pre.val_persons) == 2
    assert torch.isfinite(torch.tensor(pre.final_val_error))

    # truncation + recovery: factorized, smaller, canonical again (exactly, up to round-off)
    assert any(is_factorized(m) for m in base.modules())
    assert trunc.params["truncated"] < trunc.params["dense"]
    assert all(torch.isfinite(torch.tensor(v)) for v in trunc.errors.values())
    assert trunc.canonicalize_max_change < 1e-4
    for m in base.modules():
        if is_factorized(m):
            eye = torch.eye(m.U.shape[1])
            assert torch.allclose(m.U.T @ m.U, eye, atol=1e-5)
            gram = (m.V @ m.V.T).detach()
            assert torch.allclose(gram, torch.diag(torch.diagonal(gram)), atol=1e-4 * float(gram.abs().max()))
    reloaded, recovered = load_model(tmp_path / "rec" / "model.safetensors")
    assert recovered["extra"]["train_persons"] == pre.train_persons  # held_out_persons reads them
    x = source.images[:4].float() / 255
    assert torch.equal(reloaded.eval()(x), base.eval()(x))

    # personalization: an adapter per person, loss recorded
    assert [o.status for o in run.persons.values()] == ["ok", "ok", "ok"]
    for person in target.persons():
        assert (tmp_path / "ad" / adapter_filename(person)).is_file()

    # evaluation: finite, per person, excluding the 5 adaptation images
    assert list(report.columns) == ["source-only", "personalized"]
    assert report.n_eval == {p: 4 for p in target.persons()}
    for col in report.columns.values():
        assert set(col) == set(target.persons())
        assert all(torch.isfinite(torch.tensor(v)) for v in col.values())
    manual = person_errors(base, target, ["p01"], n_adapt=5)["p01"]
    assert report.columns["source-only"]["p01"] == pytest.approx(manual)
    assert "mean ± std" in report.format_table()

    # the personalized adapter merges: same outputs, the base's structure and size
    alfa.load_adapter(base, tmp_path / "ad" / adapter_filename("p02"))
    images = target.images[target.person_indices("p02")].float() / 255
    adapted = base(images)
    merged = copy.deepcopy(base)
    alfa.merge(merged)
    assert torch.allclose(merged(images), adapted, atol=1e-5)
    assert alfa.parameter_summary(merged).total == alfa.parameter_summary(reloaded).total
    alfa.detach(base)
    assert torch.equal(base(images), reloaded(images))  # the shared base is untouched


def test_same_seed_same_numbers(tmp_path, data, chain):
    source, target = data
    first = chain[1]
    second = _chain(tmp_path, source, target)
    assert first[4].persons["p00"].losses == second[4].persons["p00"].losses
    assert first[5].columns == second[5].columns
    assert first[3].errors == second[3].errors


def test_resumed_training_equals_uninterrupted(tmp_path, data):
    source, _ = data
    config = dataclasses_replace(FAST, epochs=2)
    torch.manual_seed(0)
    straight = alfa.models.create_model("tiny_gaze_net")
    train_source(straight, source, config, tmp_path / "straight", model_name="tiny_gaze_net", progress=False)
    torch.manual_seed(0)
    part = alfa.models.create_model("tiny_gaze_net")
    train_source(part, source, FAST, tmp_path / "split", model_name="tiny_gaze_net", progress=False)
    resumed = alfa.models.create_model("tiny_gaze_net")  # other init: everything must come from the files
    result = train_source(resumed, source, config, tmp_path / "split", model_name="tiny_gaze_net", progress=False)
    assert result.resumed_from_epoch == 1 and len(result.history) == 2
    for (name, a), b in zip(straight.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), name


def test_resume_refuses_another_run(tmp_path, data):
    source, _ = data
    torch.manual_seed(0)
    model = alfa.models.create_model("tiny_gaze_net")
    train_source(model, source, FAST, tmp_path / "run", model_name="tiny_gaze_net", progress=False)
    with pytest.raises(CheckpointError, match="another run.*lr"):
        train_source(model, source, dataclasses_replace(FAST, lr=0.5), tmp_path / "run", model_name="tiny_gaze_net")


def test_personalization_loss_decreases_on_a_fixed_batch(data):
    _, target = data
    torch.manual_seed(0)
    truncated = alfa.models.create_model("tiny_gaze_net").eval()
    alfa.truncate(truncated, RANK)
    bn_before = {k: v.clone() for k, v in truncated.state_dict().items() if "running" in k}
    images = target.images[:5].float() / 255
    result = personalize(truncated, images, alfa.AlfaConfig(heads=2, rank=2), PersonalizeConfig(steps=8))
    assert len(result.losses) == 8
    assert result.final_loss < result.losses[0]
    assert result.trained_parameters == sum(p.numel() for p in alfa.adapter_parameters(truncated).values())
    for k, v in truncated.state_dict().items():  # BatchNorm stayed in eval mode
        if k in bn_before:
            assert torch.equal(v, bn_before[k]), k
    alfa.detach(truncated)


def test_pitch_anchor_holds_the_mean_pitch_and_is_off_by_default(data):
    _, target = data
    images = target.images[:5].float() / 255
    assert "pitch_anchor" not in PersonalizeConfig().to_dict()  # off: recipe hashes as before the option
    anchored = PersonalizeConfig(steps=6, lr=1e-2, pitch_anchor=1.0)
    assert PersonalizeConfig.from_dict(anchored.to_dict()) == anchored
    with pytest.raises(ValueError, match="pitch_anchor"):
        PersonalizeConfig(pitch_anchor=-1.0).validate()
    first = {}
    for weight in (0.0, 1.0):
        torch.manual_seed(0)
        model = alfa.models.create_model("tiny_gaze_net").eval()
        alfa.truncate(model, RANK)
        batch = build_batch(images, anchored, seed=1)  # personalize's batch (seed = config.seed + 1)
        with torch.no_grad():
            start = model(batch)[:, 1].mean()
        result = personalize(model, images, alfa.LoraConfig(rank=2), dataclasses_replace(anchored, pitch_anchor=weight))
        first[weight] = result.losses[0]
        with torch.no_grad():
            pred = model(batch)
        flip = flip_symmetry_loss(pred[:10], pred[10:])
        drift = (pred[:, 1].mean() - start).abs()
        assert result.final_loss == pytest.approx(float(flip + weight * drift), rel=1e-5)
        assert drift > 0  # the model did move its mean pitch (so the term was exercised)
    assert first[1.0] == first[0.0]  # the anchor term is zero before the first step


def test_layer34_learning_rate_rule(data):
    _, target = data
    model = alfa.models.create_model("tiny_gaze_net").eval()
    alfa.truncate(model, RANK)
    alfa.attach(model, alfa.AlfaConfig(heads=2, rank=2))
    groups = alfa.param_groups(model, 1e-4, lr_scale=PersonalizeConfig().lr_scale)
    names = {id(p): n for n, p in model.named_parameters()}
    stages = {g["lr"]: {names[id(p)].split(".")[0] for p in g["params"]} for g in groups}
    assert sorted(stages) == pytest.approx([1e-4, 1e-3])
    assert stages[min(stages)] == {"conv1", "layer1", "layer2"}
    assert stages[max(stages)] == {"layer3", "layer4"}


def test_bad_persons_are_reported_and_the_run_goes_on(tmp_path, data):
    _, target = data
    images = target.images.clone()
    images_f = images.float() / 255
    images_f[target.person_indices("p01")[2], 0, 3, 3] = float("nan")
    bad = InMemoryGazeDataset(images_f, target.gaze, target.person_ids, target.person_names, name="bad")
    short = toy_dataset(1, 5, seed=4, name="short")
    mixed = InMemoryGazeDataset(
        torch.cat([bad.images, short.images.float() / 255]),
        torch.cat([bad.gaze, short.gaze]),
        torch.cat([bad.person_ids, short.person_ids + 3]),
        [*bad.person_names, "few"],
        name="mixed",
    )
    model = alfa.models.create_model("tiny_gaze_net").eval()
    alfa.truncate(model, RANK)
    reference = copy.deepcopy(model.state_dict())
    # a stale adapter of the failing person from an earlier run (which listed it) must be removed
    (tmp_path / "p01.safetensors").write_bytes(b"stale")
    (tmp_path / "personalization.json").write_text(json.dumps({"persons": {"p01": {"status": "ok"}}}))
    run = personalize_dataset(model, mixed, alfa.AlfaConfig(heads=2, rank=2), PersonalizeConfig(steps=2), tmp_path)
    status = {p: o.status for p, o in run.persons.items()}
    assert status == {"p00": "ok", "p01": "failed", "p02": "ok", "few": "failed"}
    assert "image 11 (person 'p01') contains NaN" in run.failed["p01"]
    assert "5 images; personalization needs 5 plus at least one" in run.failed["few"]
    assert not (tmp_path / "p01.safetensors").exists()
    assert alfa.adapter_state(model) is None
    for k, v in model.state_dict().items():
        assert torch.equal(v, reference[k]), k
    summary = json.loads((tmp_path / "personalization.json").read_text())
    assert summary["persons"]["p01"]["status"] == "failed"

    clean = InMemoryGazeDataset(
        mixed.images.nan_to_num(0.0), mixed.gaze, mixed.person_ids, mixed.person_names, name="mixed"
    )
    report = evaluate(model, clean, adapters=tmp_path, progress=False)
    assert set(report.columns["personalized"]) == {"p00", "p02"}
    assert "NaN" in report.failed["p01"] and "few" in report.failed
    assert report.summary()["personalized"]["persons"] == 2
    assert "FAILED p01" in report.format_table()


def test_personalization_resumes_by_skipping_finished_persons(tmp_path, data):
    _, target = data
    model = alfa.models.create_model("tiny_gaze_net").eval()
    alfa.truncate(model, RANK)
    method, config = alfa.AlfaConfig(heads=2, rank=2), PersonalizeConfig(steps=2)
    first = personalize_dataset(model, target, method, config, tmp_path, progress=False)
    again = personalize_dataset(model, target, method, config, tmp_path, progress=False)
    assert {o.status for o in again.persons.values()} == {"skipped"}
    assert again.persons["p00"].losses == first.persons["p00"].losses
    other = personalize_dataset(model, target, method, dataclasses_replace(config, steps=3), tmp_path, progress=False)
    assert {o.status for o in other.persons.values()} == {"ok"}


@pytest.mark.parametrize("method", ["lora", "dora", "diag_gate", "bitfit"])
def test_any_adapter_method_works(tmp_path, data, method):
    _, target = data
    model = alfa.models.create_model("tiny_gaze_net").eval()
    alfa.truncate(model, RANK)
    config = alfa.adapters.config_from_dict(method, {})
    run = personalize_dataset(model, target, config, PersonalizeConfig(steps=2), tmp_path, progress=False)
    assert {o.status for o in run.persons.values()} == {"ok"}, run.failed


# ----------------------------------------------------------------------------- CLI and demo


def _parser():
    from alfa.cli import build_parser

    return build_parser()


def test_cli_personalize_and_evaluate(tmp_path, data, capsys, monkeypatch):
    import alfa.gaze.pipeline as pipeline

    _, target = data
    monkeypatch.setattr(pipeline, "open_data", lambda spec: {"toy:target": target}[spec])
    model = alfa.models.create_model("tiny_gaze_net").eval()
    alfa.truncate(model, RANK)
    alfa.checkpoint.save_model(tmp_path / "base.safetensors", model, "tiny_gaze_net")
    args = _parser().parse_args(
        ["personalize", "--checkpoint", str(tmp_path / "base.safetensors"), "--data", "toy:target"]
        + ["--out", str(tmp_path / "ad"), "--heads", "2", "--adapter-rank", "2", "--steps", "2", "--quiet"]
    )
    args.func(args)
    assert "3 done, 0 already there, 0 failed" in capsys.readouterr().out
    args = _parser().parse_args(
        ["evaluate", "--checkpoint", str(tmp_path / "base.safetensors"), "--data", "toy:target"]
        + ["--adapters", str(tmp_path / "ad"), "--json", str(tmp_path / "eval.json"), "--quiet"]
    )
    args.func(args)
    out = capsys.readouterr().out
    assert "personalized vs source-only: error lower for" in out
    saved = json.loads((tmp_path / "eval.json").read_text())
    assert set(saved["persons"]) == {"p00", "p01", "p02"} and saved["n_adapt"] == 5


def test_cli_failures_exit_non_zero_and_allow_partial_accepts_them(tmp_path, data, capsys, monkeypatch):
    """A run in which some person failed is an error a script can see (exit 2), the others' work is kept;
    ``--allow-partial`` accepts it; an evaluation that scored nobody, or a missing adapter folder, always fails."""
    import alfa.gaze.pipeline as pipeline
    from alfa.cli import main

    _, target = data
    short = toy_dataset(2, 9, seed=3, name="tgt")  # ...then person p01 loses all but 3 of its images
    keep = [i for i in range(len(short)) if short.person_ids[i] == 0 or i % 9 < 3]
    short = InMemoryGazeDataset(
        short.images[keep], short.gaze[keep], short.person_ids[keep], short.person_names, name="short"
    )
    monkeypatch.setattr(pipeline, "open_data", lambda spec: {"toy:target": target, "toy:short": short}[spec])
    model = alfa.models.create_model("tiny_gaze_net").eval()
    alfa.truncate(model, RANK)
    alfa.checkpoint.save_model(tmp_path / "base.safetensors", model, "tiny_gaze_net")
    base = ["--checkpoint", str(tmp_path / "base.safetensors")]
    common = [*base, "--heads", "2", "--adapter-rank", "2", "--steps", "1", "--quiet"]

    assert main(["personalize", *common, "--data", "toy:short", "--out", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err
    assert "FAILED p01" in err and "failed for 1 of 2 persons" in err and "--allow-partial" in err
    assert (tmp_path / "a" / "p00.safetensors").is_file()  # the other person's work is kept
    assert main(["personalize", *common, "--data", "toy:short", "--out", str(tmp_path / "a"), "--allow-partial"]) == 0
    capsys.readouterr()

    evaluate = ["evaluate", *base, "--quiet"]
    assert main([*evaluate, "--data", "toy:short", "--adapters", str(tmp_path / "a")]) == 2
    assert "1 of 2 persons could not be scored" in capsys.readouterr().err
    assert main([*evaluate, "--data", "toy:short", "--adapters", str(tmp_path / "a"), "--allow-partial"]) == 0
    capsys.readouterr()
    (tmp_path / "empty").mkdir()  # every adapter missing: nobody could be scored, refused up front whatever the flag
    assert main([*evaluate, "--data", "toy:target", "--adapters", str(tmp_path / "empty"), "--allow-partial"]) == 2
    assert "no adapter file of any person of tgt" in capsys.readouterr().err
    assert main([*evaluate, "--data", "toy:target", "--adapters", str(tmp_path / "nowhere")]) == 2
    out = capsys.readouterr()
    assert "--adapters" in out.err and "no such folder" in out.err and out.out == ""  # refused before any work
    one = next((tmp_path / "a").glob("*.safetensors"))  # an adapter file given for the folder: said as such
    assert main([*evaluate, "--data", "toy:target", "--adapters", str(one)]) == 2
    assert f"--adapters {one}: a file, not a folder" in capsys.readouterr().err


def test_cli_personalize_refuses_to_replace_other_adapters_unless_asked(tmp_path, data, capsys, monkeypatch):
    import alfa.gaze.pipeline as pipeline
    from alfa.cli import main

    _, target = data
    other = toy_dataset(3, 9, seed=4, name="other")
    monkeypatch.setattr(pipeline, "open_data", lambda spec: {"toy:target": target, "toy:other": other}[spec])
    model = alfa.models.create_model("tiny_gaze_net").eval()
    alfa.truncate(model, RANK)
    alfa.checkpoint.save_model(tmp_path / "base.safetensors", model, "tiny_gaze_net")
    retrained = alfa.models.create_model("tiny_gaze_net").eval()  # another base of the same shapes
    alfa.truncate(retrained, RANK)
    alfa.checkpoint.save_model(tmp_path / "base2.safetensors", retrained, "tiny_gaze_net")
    out = ["--out", str(tmp_path / "ad"), "--steps", "1", "--quiet"]
    alfa_run = [
        "personalize",
        "--checkpoint",
        str(tmp_path / "base.safetensors"),
        "--heads",
        "2",
        "--adapter-rank",
        "2",
    ]
    assert main([*alfa_run, "--data", "toy:target", *out]) == 0
    first = (tmp_path / "ad" / "p00.safetensors").read_bytes()
    capsys.readouterr()
    one_head, other_lr = [*alfa_run[:4], "1", *alfa_run[5:]], [*alfa_run, "--lr", "0.5"]
    refusals = {
        "its adapters are alfa": [*alfa_run[:3], "--method", "lora", "--data", "toy:target"],
        # the option that differs, not the whole config (a TPGaze start differs in init_from alone)
        "alfa with other options (the folder's vs this run's: heads 2 vs 1)": [*one_head, "--data", "toy:target"],
        "made on the dataset 'tgt', not 'other'": [*alfa_run, "--data", "toy:other"],
        "another recipe (the folder's vs this run's: lr 3e-05 vs 0.5)": [*other_lr, "--data", "toy:target"],
        "trained on another base": [
            *alfa_run[:2],
            str(tmp_path / "base2.safetensors"),
            *alfa_run[3:],
            "--data",
            "toy:target",
        ],
    }
    for message, argv in refusals.items():
        assert main([*argv, *out]) == 2, message
        err = capsys.readouterr().err
        assert message in err and "--replace" in err
        assert (tmp_path / "ad" / "p00.safetensors").read_bytes() == first  # nothing lost
    assert main([*refusals["its adapters are alfa"], *out, "--replace"]) == 0
    assert "3 done, 0 already there" in capsys.readouterr().out
    assert alfa.read_adapter_metadata(tmp_path / "ad" / "p00.safetensors")["method"] == "lora"
    # an adapter records its dataset and person: another dataset's person of the same name is not scored with it
    evaluate = [
        "evaluate",
        "--checkpoint",
        alfa_run[2],
        "--adapters",
        str(tmp_path / "ad"),
        "--quiet",
        "--allow-partial",
    ]
    assert main([*evaluate, "--data", "toy:other"]) == 2
    assert "made for person 'p00' of 'tgt', not 'p00' of 'other'" in capsys.readouterr().err  # stdout: the table
    assert main([*evaluate, "--data", "toy:target"]) == 0


def test_cli_personalize_after_a_run_where_everyone_failed_needs_no_replace(tmp_path, data, capsys, monkeypatch):
    """A run where every person failed leaves a record but no adapter: another recipe may go on in that folder
    without ``--replace`` (there is nothing to lose), and its record replaces the failed one."""
    import alfa.gaze.pipeline as pipeline
    from alfa.cli import main

    _, target = data
    monkeypatch.setattr(pipeline, "open_data", lambda spec: target)
    model = alfa.models.create_model("tiny_gaze_net").eval()
    alfa.truncate(model, RANK)
    alfa.checkpoint.save_model(tmp_path / "base.safetensors", model, "tiny_gaze_net")
    run = ["personalize", "--checkpoint", str(tmp_path / "base.safetensors"), "--data", "toy:target"]
    run += ["--out", str(tmp_path / "ad"), "--steps", "1", "--quiet", "--heads", "2", "--adapter-rank", "2"]
    # more images than any person has: everyone fails (the command refuses that up front; a run where every person
    # fails otherwise, their images unreadable, leaves the same record)
    monkeypatch.setattr("alfa.cli.guards.refuse_n_adapt_no_one_has", lambda *args: None)
    assert main([*run, "--n-adapt", "500"]) != 0
    assert "failed for every person" in capsys.readouterr().err
    assert not list((tmp_path / "ad").glob("*.safetensors"))
    assert main(run) == 0
    record = json.loads((tmp_path / "ad" / "personalization.json").read_text())
    assert {o["status"] for o in record["persons"].values()} == {"ok"} and record["config"]["n_adapt"] != 500
    assert main([*run, "--lr", "0.5"]) == 2  # now there are adapters to lose: refused, as before
    assert "another recipe (the folder's vs this run's: lr 3e-05 vs 0.5)" in capsys.readouterr().err


def test_cli_personalize_recipes():
    """``alfa personalize`` uses each method's selected recipe unless told otherwise (Alfa's is the default
    recipe); ``--recipe paper`` the paper's; flags override either."""
    from alfa.cli.gaze import _method_config, _personalize_config
    from alfa.gaze.recipes import DEFAULT_RECIPE, METHOD_RECIPES, PAPER_RECIPE

    def config(*flags):
        args = _parser().parse_args(["personalize", "--checkpoint", "x", "--data", "y", *flags])
        return _personalize_config(args, _method_config(args))

    assert config() == DEFAULT_RECIPE.apply(PersonalizeConfig())
    assert config("--recipe", "paper") == PAPER_RECIPE.apply(PersonalizeConfig()) == PersonalizeConfig()
    assert METHOD_RECIPES["lora"] != PAPER_RECIPE  # (else the next line could not tell them apart)
    assert config("--method", "lora") == METHOD_RECIPES["lora"].apply(PersonalizeConfig())
    assert config("--method", "lora", "--recipe", "paper") == PersonalizeConfig()
    flagged = config("--recipe", "paper", "--steps", "3", "--train-both-branches", "--pitch-anchor", "1")
    assert (flagged.steps, flagged.detach_flipped, flagged.pitch_anchor, flagged.lr) == (3, False, 1.0, 1e-4)
    assert not config("--train-both-branches").detach_flipped and config("--detach-flipped").detach_flipped
    with pytest.raises(SystemExit):
        config("--recipe", "best")


def test_cli_pretrain_then_truncate(tmp_path, data, capsys, monkeypatch):
    import alfa.gaze.pipeline as pipeline

    source, _ = data
    monkeypatch.setattr(pipeline, "open_data", lambda spec: {"toy:source": source}[spec])
    common = ["--data", "toy:source", "--epochs", "1", "--batch-size", "16", "--val-fraction", "0.25", "--quiet"]
    args = _parser().parse_args(["pretrain", "--model", "tiny_gaze_net", "--out", str(tmp_path / "pre"), *common])
    args.func(args)
    assert "pretrained tiny_gaze_net on src: 1 epoch," in capsys.readouterr().out
    pre = str(tmp_path / "pre" / "model.safetensors")
    args = _parser().parse_args(
        ["truncate", "--checkpoint", pre, "--rank", str(RANK), "--out", str(tmp_path / "rec"), *common]
    )
    args.func(args)
    captured = capsys.readouterr()
    assert "before truncation" in captured.out and "after recovery" in captured.out
    assert "note:" not in captured.err  # the data it was trained on
    _, saved = read_checkpoint(tmp_path / "rec" / "model.safetensors")
    _, pre_saved = read_checkpoint(pre)
    assert saved["extra"]["val_persons"] == pre_saved["extra"]["val_persons"]  # the same held-out persons
    args = _parser().parse_args(["truncate", "--checkpoint", str(tmp_path / "rec" / "model.safetensors"), *common])
    with pytest.raises(ValueError, match="already truncated"):
        args.func(args)
    # the checkpoints record the image size they were trained on; data of another size is refused
    assert saved["input_size"] == pre_saved["input_size"] == [16, 16]
    from alfa.gaze.evaluate import INPUT_SCALING
    from alfa.gaze.train import check_input_size

    assert saved["input_scaling"] == INPUT_SCALING
    with pytest.raises(ValueError, match="trained on pixels scaled as 'imagenet mean/std'"):
        check_input_size({**saved, "input_scaling": "imagenet mean/std"}, source, "ck")
    from alfa.cli import main

    big = toy_dataset(2, 9, size=32, seed=5, name="big")
    monkeypatch.setattr(pipeline, "open_data", lambda spec: {"toy:big": big}[spec])
    rec = str(tmp_path / "rec" / "model.safetensors")
    capsys.readouterr()
    assert main(["evaluate", "--checkpoint", rec, "--data", "toy:big", "--quiet"]) == 2
    assert "was trained on 16×16 images, big has 32×32" in capsys.readouterr().err
    small = ["--adapter-rank", "2"]  # within the rank-6 base's d (a larger rank is refused first)
    assert main(["personalize", "--checkpoint", rec, "--data", "toy:big", "--out", str(tmp_path / "a"), *small]) == 2
    assert "was trained on 16×16 images" in capsys.readouterr().err
    # truncation too: recovering on 32×32 data would then record 32×32 as the size it was trained on
    out = tmp_path / "rec-big"
    truncate_big = ["truncate", "--checkpoint", pre, "--data", "toy:big", "--rank", str(RANK), "--out", str(out)]
    assert main([*truncate_big, "--quiet"]) == 2  # a rank that saves (rank 64 saves nothing here: refused first)
    assert "was trained on 16×16 images, big has 32×32" in capsys.readouterr().err and not out.exists()
    # other data of its size: recovered on, and said (a target world given by mistake ran without a word)
    monkeypatch.setattr(pipeline, "open_data", lambda spec: toy_dataset(2, 9, size=16, seed=6, name="other"))
    argv = ["truncate", "--checkpoint", pre, "--data", "toy:other", "--rank", str(RANK), "--out", str(out), "--quiet"]
    assert main([*argv, "--epochs", "1", "--batch-size", "16"]) == 0
    assert f"note: {pre} was trained on src, not --data's other: recovery" in capsys.readouterr().err


def test_demo_tiny_on_synthetic_data_and_its_cache(tmp_path):
    from alfa.gaze.pipeline import demo_config, run_demo
    from alfa.gaze.recipes import DEFAULT_RECIPE

    config = demo_config(
        source="synthetic:eth?size=32&persons=4&images_per_person=8",
        val_source="synthetic:eth?split=val&size=32&persons=2&images_per_person=4",
        # 7 images per person for the label-free columns (5 adapt, 2 scored), then the calibration's pool of 32
        targets=("synthetic:mpii?size=32&persons=2&images_per_person=39",),
        model="tiny_gaze_net",
        pretrain=TrainConfig(epochs=1, batch_size=16),
        truncation=TruncateConfig(rank=RANK, recovery=TrainConfig(epochs=1, batch_size=16)),
        alfa=alfa.AlfaConfig(heads=2, rank=2),
        personalize=PersonalizeConfig(steps=2),
        out_dir=str(tmp_path / "demo"),
        cache_dir=str(tmp_path / "cache"),
    )
    first = run_demo(config, progress=False)
    assert not first.from_cache
    (report,) = first.reports.values()
    columns = ["source-only", "flip-TTA", "alfa (default recipe)", "alfa (paper recipe)", "calibrated (9 labels)"]
    assert list(report.columns) == columns
    assert all(len(c) == 2 for c in report.columns.values())
    assert first.figure_path.is_file() and first.json_path.is_file()
    assert first.verdict[0].startswith(f"{report.dataset}: source-only ")
    assert "alfa (paper recipe)" in first.verdict[0] and "flip-TTA" in first.verdict[0]
    assert "calibrated (9 labels)" in first.verdict[0]
    assert first.verdict[1].startswith(f"{report.dataset}: 9 labelled images per person (affine calibration) ")
    assert "beat every label-free column" in first.verdict[1] or "did NOT beat" in first.verdict[1]
    # every column scored the same images of each person: those after the 5 adapted on and before the pool,
    # none of them one of the 9 whose labels the calibration read
    images = report.meta["images"]
    for p, start in zip(report.persons, (0, 39)):  # each person's 39 images, in dataset order
        assert images["adapted"][p] == list(range(start, start + 5))
        labelled = set(images["labelled"][p])
        assert len(labelled) == 9 and labelled <= set(range(start + 7, start + 39))
        for c in columns:
            assert images["scored"][c][p] == [start + 5, start + 6], c
    # each Alfa column ran its own recipe (the recipe sets the steps, whatever the base config says)
    assert report.meta["recipes"]["alfa (paper recipe)"]["steps"] == 10
    assert report.meta["recipes"]["alfa (default recipe)"]["label"] == DEFAULT_RECIPE.label
    saved = json.loads(first.json_path.read_text())
    assert saved["verdict"] == first.verdict and "total" in saved["seconds"]
    assert list(saved["targets"][report.dataset]["summary"]) == columns

    second = run_demo(config, progress=False)  # the source model now comes from the cache
    assert second.from_cache
    (report2,) = second.reports.values()
    assert report2.columns == report.columns
    # one model, and beside it the lock its build held (left in place: the lock is the kernel's, not the file's)
    (model,) = [p.name for p in (tmp_path / "cache").iterdir() if p.is_dir()]
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [model, f"{model}.lock"]


def dataclasses_replace(obj, **changes):
    import dataclasses

    return dataclasses.replace(obj, **changes)


def test_symmetry_target_batchnorm_mode(data):
    from alfa.gaze.train import _train_step

    source, _ = data
    images, gaze = source.images[:16].float() / 255, source.gaze[:16]

    def running_mean_after(weight, mode):
        torch.manual_seed(0)
        model = alfa.models.create_model("tiny_gaze_net")
        optimizer = torch.optim.Adam(model.parameters(), 1e-3)
        terms = _train_step(model, optimizer, images, gaze, weight, mode)
        return model.bn1.running_mean.clone(), terms

    plain, terms = running_mean_after(0.0, "train")
    assert terms["symmetry"] == 0.0
    eval_mode, terms = running_mean_after(1.0, "eval")  # TPGaze: running statistics, not updated by the target
    assert torch.equal(eval_mode, plain) and terms["symmetry"] > 0
    batch_mode, _ = running_mean_after(1.0, "train")  # batch statistics: the flipped batch updates them too
    assert not torch.equal(batch_mode, plain)
    with pytest.raises(ValueError, match="symmetry_bn"):
        TrainConfig(symmetry_bn="running").validate()


def test_the_demo_has_a_symmetric_and_an_asymmetric_part_as_the_benchmark_builds_them():
    from alfa.gaze.pipeline import demo_config, demo_configs
    from alfa.study.bench.methods import SOURCE_TRAINING

    symmetric, asymmetric = demo_configs(seed=3)
    assert symmetric == demo_config(seed=3)
    assert symmetric.targets == ("synthetic:mpii?size=48&images_per_person=92",)  # 60, then the pool of 32
    # the studio part differs from the default only in its worlds: the same sizes and counts
    assert asymmetric.source == symmetric.source.replace("synthetic:eth?", "synthetic:eth-studio?")
    assert asymmetric.val_source == symmetric.val_source.replace("synthetic:eth?", "synthetic:eth-studio?")
    assert asymmetric.targets == ("synthetic:mpii-window?size=48&images_per_person=92",) and asymmetric.seed == 3
    # the studio source is trained as the benchmark trains it: without the symmetry term, in both stages
    weight = SOURCE_TRAINING["S"]["symmetry_weight"]
    assert asymmetric.pretrain.symmetry_weight == asymmetric.truncation.recovery.symmetry_weight == weight
    assert dataclasses_replace(asymmetric.pretrain, symmetry_weight=1.0) == symmetric.pretrain


@pytest.mark.slow
def test_cli_demo_runs_each_part_and_sums_them_up(tmp_path, capsys, monkeypatch):
    import alfa.gaze.pipeline as pipeline

    tiny = {
        "model": "tiny_gaze_net",
        "pretrain": TrainConfig(epochs=1, batch_size=16),
        "truncation": TruncateConfig(rank=RANK, recovery=TrainConfig(epochs=1, batch_size=16)),
        "alfa": alfa.AlfaConfig(heads=2, rank=2),
    }
    parts = [
        ("eth", "mpii"),
        ("eth-studio", "mpii-window"),
    ]
    configs = [
        pipeline.demo_config(
            source=f"synthetic:{s}?size=32&persons=4&images_per_person=8",
            val_source=f"synthetic:{s}?split=val&size=32&persons=2&images_per_person=4",
            targets=(f"synthetic:{t}?size=32&persons=2&images_per_person=39",),  # 7, then the pool
            **tiny,
        )
        for s, t in parts
    ]
    monkeypatch.setattr(
        pipeline, "demo_configs", lambda **overrides: [dataclasses_replace(c, **overrides) for c in configs]
    )
    args = _parser().parse_args(
        ["demo", "--out", str(tmp_path / "demo"), "--cache-dir", str(tmp_path / "c"), "--quiet"]
    )
    args.func(args)
    out = capsys.readouterr().out
    summary = out[out.index("mean angular error (deg) over persons ± std") :]
    assert "mpii/test" in summary and "mpii-window/test" in summary and "total wall time" in summary
    for name in ("eth", "eth-studio"):  # one folder per part
        saved = json.loads((tmp_path / "demo" / name / "results.json").read_text())
        assert list(saved["targets"].values())[0]["summary"].keys() == set(pipeline.COLUMNS)


def test_a_resumed_training_says_where_it_resumes(tmp_path, data, capsys):
    source, _ = data
    torch.manual_seed(0)
    model = alfa.models.create_model("tiny_gaze_net")
    train_source(model, source, FAST, tmp_path / "run", model_name="tiny_gaze_net", progress=False)
    capsys.readouterr()
    config = dataclasses_replace(FAST, epochs=2)
    train_source(model, source, config, tmp_path / "run", model_name="tiny_gaze_net", progress=True)
    assert "1 of 2 epochs found, resuming at epoch 2" in capsys.readouterr().out
    train_source(model, source, config, tmp_path / "run", model_name="tiny_gaze_net", progress=True)
    assert "2 of 2 epochs found, already complete" in capsys.readouterr().out


def test_device_option(tmp_path, data, capsys, monkeypatch):
    """--device cpu runs as the default does; a CUDA device where there is none, or an unknown one, is a
    one-line error before any work."""
    import alfa.gaze.pipeline as pipeline
    from alfa.cli import main
    from alfa.gaze.devices import resolve_device

    _, target = data
    monkeypatch.setattr(pipeline, "open_data", lambda spec: {"toy:target": target}[spec])
    model = alfa.models.create_model("tiny_gaze_net").eval()
    alfa.truncate(model, RANK)
    alfa.checkpoint.save_model(tmp_path / "base.safetensors", model, "tiny_gaze_net")
    base = ["--checkpoint", str(tmp_path / "base.safetensors"), "--data", "toy:target", "--quiet"]
    assert main(["evaluate", *base, "--device", "cpu", "--json", str(tmp_path / "cpu.json")]) == 0
    assert main(["evaluate", *base, "--json", str(tmp_path / "auto.json")]) == 0
    same = [json.loads((tmp_path / f).read_text())["persons"] for f in ("cpu.json", "auto.json")]
    if not torch.cuda.is_available():
        assert same[0] == same[1]  # auto is the CPU here
        assert main(["evaluate", *base, "--device", "cuda"]) == 2
        assert "no CUDA device is visible" in capsys.readouterr().err
    assert main(["personalize", *base, "--device", "tpu", "--out", str(tmp_path / "a")]) == 2
    assert "expected auto, cpu, cuda or cuda:N" in capsys.readouterr().err
    assert resolve_device("cpu") == torch.device("cpu")


def test_bf16_autocast_runs_a_training_step_on_the_cpu_and_fp32_hashes_as_before(data):
    from alfa.gaze.train import _train_step

    source, _ = data
    images, gaze = source.images[:16].float() / 255, source.gaze[:16]
    torch.manual_seed(0)
    model = alfa.models.create_model("tiny_gaze_net")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    terms = _train_step(model, torch.optim.Adam(model.parameters(), 1e-3), images, gaze, 1.0, "train", "bf16")
    assert all(math.isfinite(v) for v in terms.values())
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())  # it trained
    assert all(p.dtype == torch.float32 for p in model.parameters())  # weights stay fp32
    assert "precision" not in TrainConfig().to_dict()  # fp32, the default: every config hashes as before
    assert TrainConfig(precision="bf16").to_dict()["precision"] == "bf16"
    with pytest.raises(ValueError, match="precision must be one of fp32, bf16, fp16"):
        TrainConfig(precision="fp8").validate()


def test_fp16_autocast_trains_with_a_gradient_scaler_and_resumes_it(tmp_path, data):
    from alfa.checkpoint import read_tagged
    from alfa.gaze.train_state import STATE_FILE, STATE_FORMAT

    source, _ = data
    config = dataclasses_replace(FAST, precision="fp16")
    torch.manual_seed(0)
    model = alfa.models.create_model("tiny_gaze_net")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    result = train_source(model, source, config, tmp_path / "run", model_name="tiny_gaze_net", progress=False)
    assert math.isfinite(result.history[-1]["train_loss"])
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())  # it trained
    state = read_tagged(tmp_path / "run" / STATE_FILE, STATE_FORMAT, "a source-training state")[1]
    assert state["grad_scaler"]["scale"] > 0  # saved, so a resumed run continues with the same scale
    more = train_source(
        model, source, dataclasses_replace(config, epochs=2), tmp_path / "run", model_name="tiny_gaze_net",
        progress=False,
    )  # fmt: skip
    assert more.resumed_from_epoch == 1 and len(more.history) == 2


def test_every_command_that_runs_a_model_takes_a_device_and_a_precision(capsys):
    from alfa.cli import build_parser

    parser = build_parser()
    for command in (
        ["pretrain", "--data", "x"],
        ["truncate", "--checkpoint", "c", "--data", "x"],
        ["personalize", "--checkpoint", "c", "--data", "x"],
        ["throughput"],
        ["evaluate", "--checkpoint", "c", "--data", "x"],
        ["demo"],
        ["bench"],
        ["tpgaze", "meta-train", "--checkpoint", "c", "--data", "x"],
        ["tpgaze", "personalize", "--checkpoint", "c", "--data", "x"],
    ):
        args = parser.parse_args(command)
        assert args.device == "auto" and args.precision is None, command  # None: bf16 on CUDA, fp32 on the CPU
        assert parser.parse_args([*command, "--device", "cuda:1"]).device == "cuda:1", command
        assert parser.parse_args([*command, "--precision", "bf16"]).precision == "bf16", command
        # TPGaze's meta-gradients take no gradient scaler: no fp16 for meta-training, nor for the benchmark's rows
        refused = ["fp8"]
        if command[:2] != ["tpgaze", "meta-train"] and command != ["bench"]:
            assert parser.parse_args([*command, "--precision", "fp16"]).precision == "fp16", command
        else:
            refused.append("fp16")
        for precision in refused:
            with pytest.raises(SystemExit) as e:
                parser.parse_args([*command, "--precision", precision])
            err = capsys.readouterr().err
            assert e.value.code == 2 and f"invalid choice: '{precision}'" in err, (command, err)


def test_the_cosine_schedule_decays_to_zero_and_leaves_old_configs_as_they_were():
    """The rate of a step depends on the step alone (a resumed run stays on its curve); the constant schedule,
    the default, is no part of a stored config, so the keys hashed from old configs do not move."""
    from alfa.gaze.train import TrainConfig

    cosine = TrainConfig(lr=1e-3, schedule="cosine")
    rates = [cosine.rate(step, 10) for step in range(10)]
    assert rates[0] == 1e-3 and all(a > b for a, b in zip(rates, rates[1:])) and rates[-1] < 0.03e-3
    assert abs(cosine.rate(5, 10) - 0.5e-3) < 1e-12
    assert {TrainConfig(lr=1e-3).rate(s, 10) for s in range(10)} == {1e-3}
    assert "schedule" not in TrainConfig().to_dict() and cosine.to_dict()["schedule"] == "cosine"
    with pytest.raises(ValueError, match="schedule must be one of"):
        TrainConfig(schedule="step").validate()
