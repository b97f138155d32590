"""User calibration (alfa.gaze.calibrate, alfa calibrate): the draws, the closed forms, the correction that carries
them (saved, merged and served per sample alike), and that evaluation never scores the labelled images."""

from __future__ import annotations

import copy
import importlib.util
import io

import numpy as np
import pytest
import torch
from kill_points import Killed, kill_at
from PIL import Image
from tiny_models import TinyGazeNet, truncated_tiny_gaze_net

import alfa
from alfa.export import merged_copy
from alfa.gaze.calibrate import (
    CalibrateConfig,
    calibrate_dataset,
    calibrate_person,
    draw_labelled,
    estimate_offset_prior,
    find_head,
    fit_affine,
    fit_feature_ridge,
)
from alfa.gaze.data import InMemoryGazeDataset
from alfa.gaze.evaluate import evaluate
from alfa.serve import MultiUserModel


@pytest.fixture
def base() -> torch.nn.Module:
    return truncated_tiny_gaze_net()


def _dataset(persons: int = 2, images: int = 14) -> InMemoryGazeDataset:
    g = torch.Generator().manual_seed(0)
    n = persons * images
    pixels = torch.randint(0, 256, (n, 3, 16, 16), generator=g, dtype=torch.uint8)
    gaze = (torch.rand(n, 2, generator=g) - 0.5) * 0.8
    ids = torch.arange(persons).repeat_interleave(images)
    return InMemoryGazeDataset(pixels, gaze, ids, [f"p{i}" for i in range(persons)], name="toy")


def test_draws_come_from_the_pool_and_spread_covers_the_gaze_range():
    data = _dataset()
    pool = data.person_indices("p1")[:10]
    for draw in ("random", "spread"):
        chosen = draw_labelled(data, "p1", 4, 10, draw, seed=3)
        assert len(set(chosen)) == 4 and set(chosen) <= set(pool)
        assert chosen == draw_labelled(data, "p1", 4, 10, draw, seed=3)  # (seed, person) fixes it
    gaze = data.gaze[pool]
    diameter = torch.cdist(gaze, gaze).max()
    for seed in range(5):  # farthest-point: the second point is at least half the pool's diameter away
        a, b = draw_labelled(data, "p1", 2, 10, "spread", seed)
        assert (data.gaze[a] - data.gaze[b]).norm() >= diameter / 2
    with pytest.raises(ValueError, match="the pool of 14 plus at least one to score"):
        draw_labelled(data, "p1", 2, 14, "random", 0)


def test_the_affine_fit_recovers_a_map_and_is_the_offset_at_k_1():
    g = torch.Generator().manual_seed(1)
    pred = torch.randn(6, 2, generator=g, dtype=torch.float64) * 0.3
    a_true, c_true = torch.tensor([[1.1, 0.2], [-0.1, 0.9]], dtype=torch.float64), torch.tensor([0.05, -0.1])
    a, c = fit_affine(pred, pred @ a_true.T + c_true.double(), ridge=0.0)
    torch.testing.assert_close(a, a_true)
    torch.testing.assert_close(c, c_true.double())
    a1, c1 = fit_affine(pred[:1], pred[:1] + 0.2, ridge=0.1)  # one image: the identity plus the offset
    torch.testing.assert_close(a1, torch.eye(2, dtype=torch.float64))
    torch.testing.assert_close(c1, torch.full((2,), 0.2, dtype=torch.float64))
    with pytest.raises(ValueError, match="needs 3 images in general position"):
        fit_affine(pred[[0, 1, 1]], pred[:3], ridge=0.0)  # three images, two of them one prediction


def test_below_three_images_the_affine_map_is_the_plain_offset_at_any_ridge():
    """Two images fixed a gain along the line through their predictions: 0.2 apart with labels 0.4 apart gave
    A = [[1.17, 0], [0, 1]] at the default ridge, so a new prediction of 0.4 became 0.55, not the offset's 0.5."""
    pred = torch.tensor([[0.0, 0.0], [0.2, 0.0]], dtype=torch.float64)
    gaze = torch.tensor([[0.0, 0.0], [0.4, 0.0]], dtype=torch.float64)
    for ridge in (0.0, 0.1):
        a, c = fit_affine(pred, gaze, ridge)
        torch.testing.assert_close(a, torch.eye(2, dtype=torch.float64))
        torch.testing.assert_close(c, (gaze - pred).mean(0))


def test_a_spread_draw_never_takes_one_image_twice_where_labels_repeat():
    """Chosen images stayed in the running at distance 0, so with fewer distinct labels than k the farthest
    point was an image already chosen: zeros gave [0, 0, 6], and the fit saw fewer than k images."""
    from alfa.gaze.calibrate import draw_positions

    assert len(set(draw_positions(torch.zeros(10, 2), 10, 3, "spread", 0, "p"))) == 3
    twins = torch.tensor([[0.0, 0.0]] * 5 + [[0.1, 0.0]] * 5)
    drawn = draw_positions(twins, 10, 4, "spread", 0, "p")
    assert len(set(drawn)) == 4 and {i >= 5 for i in drawn} == {False, True}  # both labels among them
    assert draw_positions(torch.zeros(10, 2), 10, 10, "spread", 0, "p") == list(range(10))


def test_the_offset_prior_shrinks_the_offset_by_k_over_k_plus_kappa_and_zero_leaves_it_free():
    g = torch.Generator().manual_seed(3)
    pred = torch.randn(4, 2, generator=g, dtype=torch.float64) * 0.3
    gaze = pred + torch.tensor([0.2, -0.1], dtype=torch.float64)  # a pure offset
    for kappa in (0.5, 4.0):
        a, c = fit_affine(pred, gaze, ridge=1e6, offset_prior=kappa)  # the gain held at one: the offset alone
        torch.testing.assert_close(a, torch.eye(2, dtype=torch.float64), atol=1e-5, rtol=0)
        torch.testing.assert_close(
            c, torch.tensor([0.2, -0.1], dtype=torch.float64) * 4 / (4 + kappa), atol=1e-5, rtol=0
        )
    # the gain cannot carry the offset past its prior: one image far from zero, a weak ridge on the gain
    far = torch.tensor([[0.1, -0.3]], dtype=torch.float64)
    a, c = fit_affine(far, far + 0.05, ridge=0.1, offset_prior=50.0)
    torch.testing.assert_close(far @ a.T + c - far, torch.full((1, 2), 0.05 / 51, dtype=torch.float64))
    # a tiny prior is the free offset
    a0, c0 = fit_affine(pred, gaze + 0.05 * pred, ridge=0.1)
    a1, c1 = fit_affine(pred, gaze + 0.05 * pred, ridge=0.1, offset_prior=1e-12)
    torch.testing.assert_close((a1, c1), (a0, c0))
    # the offset method and a calibrated model: the same shrinkage, through the correction of the head
    torch.manual_seed(0)
    model = TinyGazeNet().eval()
    images = torch.rand(3, 3, 16, 16)
    with torch.no_grad():
        before = model(images)
    calibrate_person(model, images, before + 0.3, CalibrateConfig(method="offset", k=3, offset_prior=1.5))
    with torch.no_grad():
        torch.testing.assert_close(model(images), before + 0.3 * 3 / 4.5)
    alfa.detach(model)
    with pytest.raises(ValueError, match="offset_prior must be a finite number >= 0"):
        CalibrateConfig(offset_prior=-1.0).validate()
    with pytest.raises(ValueError, match="not of ridge"):  # a method that has no offset to shrink refuses it
        CalibrateConfig(method="ridge", offset_prior=1.0).validate()


def test_the_estimated_offset_prior_is_scatter_over_offsets_and_can_say_no_offset():
    g = torch.Generator().manual_seed(4)
    offsets = torch.randn(400, 2, generator=g, dtype=torch.float64) * 2.0  # τ² = 2 · 4 = 8 over two components
    people = [o + torch.randn(20, 2, generator=g, dtype=torch.float64) for o in offsets]  # σ² = 2 · 1
    kappa = estimate_offset_prior(people)
    assert kappa == pytest.approx(2.0 / 8.0, rel=0.15)
    scatter_only = [torch.randn(20, 2, generator=g, dtype=torch.float64) for _ in range(50)]
    assert estimate_offset_prior(scatter_only) > 5  # offsets no larger than the noise of their means: shrink hard
    same = [torch.zeros(3, 2, dtype=torch.float64) + 0.1, torch.zeros(3, 2, dtype=torch.float64) - 0.1]
    assert estimate_offset_prior(same) == pytest.approx(0.0)  # no scatter at all: keep every offset
    assert estimate_offset_prior([torch.zeros(3, 2)] * 2) == float("inf")  # nothing to correct
    with pytest.raises(ValueError, match="at least two persons"):
        estimate_offset_prior([torch.zeros(5, 2)])


@pytest.mark.parametrize("flip_weight", [0.0, 1.0])
def test_last_layer_trains_on_features_computed_once_as_on_full_forward_passes(flip_weight):
    from alfa.adapters import CorrectionConfig, adapter_parameters, param_groups
    from alfa.gaze.calibrate import flip_yaw, l1_per_image

    torch.manual_seed(0)
    model = TinyGazeNet().eval()
    images, gaze, pool = torch.rand(3, 3, 16, 16), torch.rand(3, 2) * 0.4, torch.rand(5, 3, 16, 16)
    config = CalibrateConfig(method="last-layer", k=3, steps=7, lr=1e-2, flip_weight=flip_weight)
    calibrate_person(model, images, gaze, config, unlabelled=pool)
    fast = {n: t.detach().clone() for n, t in adapter_parameters(model).items()}
    alfa.detach(model)
    # the same steps with every forward pass through the whole model
    alfa.attach(model, CorrectionConfig(target=[find_head(model, images)[0]], layers="all"))
    optimizer = torch.optim.AdamW(
        param_groups(model, config.lr, lr_scale={}, weight_decay=0.0), lr=config.lr, weight_decay=0.0
    )
    both = torch.cat([pool, pool.flip(-1)])
    for _ in range(config.steps):
        loss = l1_per_image(model(images), gaze).mean()
        if flip_weight:
            pred, flipped = model(both).split(len(pool))
            loss = loss + flip_weight * l1_per_image(pred, flip_yaw(flipped).detach()).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    slow = adapter_parameters(model)
    assert set(fast) == set(slow) and all(fast[n].abs().sum() > 0 for n in fast)
    for name in fast:
        torch.testing.assert_close(fast[name], slow[name].detach())
    alfa.detach(model)


def test_the_feature_ridge_recovers_a_head_and_shrinks_to_the_source_one():
    g = torch.Generator().manual_seed(2)
    h = torch.randn(12, 3, generator=g, dtype=torch.float64)
    w, b = torch.randn(2, 3, generator=g, dtype=torch.float64), torch.zeros(2, dtype=torch.float64)
    w_true, b_true = w + 0.3, torch.tensor([0.1, -0.2], dtype=torch.float64)
    dw, db = fit_feature_ridge(h, h @ w_true.T + b_true, w, b, ridge=1e-9)
    torch.testing.assert_close(w + dw, w_true)
    torch.testing.assert_close(b + db, b_true)
    dw, db = fit_feature_ridge(h, h @ w_true.T + b_true, w, b, ridge=1e9)  # all shrinkage: the old head, re-centered
    assert dw.abs().max() < 1e-6


@pytest.mark.parametrize("method", ["offset", "affine", "ridge", "last-layer"])
def test_a_head_calibration_is_one_correction_saved_merged_and_served_exactly(base, method, tmp_path):
    images = torch.rand(9, 3, 16, 16)
    with torch.no_grad():
        target = base(images) @ torch.tensor([[1.2, 0.1], [0.0, 0.8]]).T + torch.tensor([0.1, -0.05])
    model = copy.deepcopy(base)
    config = CalibrateConfig(method=method, k=9, affine_ridge=0.0, steps=3)
    calibrate_person(model, images, target, config)
    assert alfa.adapter_state(model).config.method == "correction"
    with torch.no_grad():
        calibrated = model(images)
    if method == "affine":  # the model's outputs mapped exactly: the head correction is the affine map
        torch.testing.assert_close(calibrated, target, atol=1e-5, rtol=1e-5)
    if method == "offset":
        torch.testing.assert_close((calibrated - target).mean(0), torch.zeros(2), atol=1e-5, rtol=0)
    path = alfa.save_adapter(model, tmp_path / "user.safetensors")
    personalized = copy.deepcopy(base)  # a personalized user beside the calibrated one, in one batch
    alfa.attach(personalized, alfa.AlfaConfig(heads=2, rank=2))
    with torch.no_grad():
        for p in alfa.adapter_parameters(personalized).values():
            p.add_(0.1 * torch.randn_like(p))
    served = MultiUserModel(base)
    served.add_user("u", path)
    served.add_user("v", personalized)
    other = torch.rand(4, 3, 16, 16)
    with torch.no_grad():
        mixed = served(other, ["u", "v", "u", None])
        torch.testing.assert_close(mixed[0::2], model(other)[0::2])
        torch.testing.assert_close(mixed[1], personalized(other)[1])
        torch.testing.assert_close(mixed[3], base(other)[3])
        torch.testing.assert_close(merged_copy(model)(other), model(other), atol=1e-6, rtol=1e-5)
    assert served.user_bytes("u") < 1024  # a 2×n update and 2 numbers (P = I is 4 more)


def test_find_head_refuses_a_model_whose_output_is_no_linear_layer():
    class Squashed(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = TinyGazeNet()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.tanh(self.inner(x))

    with pytest.raises(ValueError, match="not the output of one linear layer.*--method adapter"):
        find_head(Squashed().eval(), torch.rand(1, 3, 16, 16))


def test_evaluation_never_scores_the_labelled_images(base, tmp_path):
    data = _dataset()
    config = CalibrateConfig(method="adapter", adapter_method="lora", adapter_options={"rank": 2}, k=3, pool=8)
    config.steps, config.flip_weight = 2, 0.5  # semi-supervised: the pool's flip loss too
    record = calibrate_dataset(base, data, config, tmp_path, progress=False)
    assert record["config"]["n_adapt"] == 8 and all(e["status"] == "ok" for e in record["persons"].values())
    about = alfa.read_adapter_metadata(tmp_path / "p0.safetensors")["about"]
    assert about["labelled"] == record["persons"]["p0"]["labelled"] and len(about["labelled"]) == 3
    scored = evaluate(base, data, adapters=tmp_path, n_adapt=8, progress=False)
    assert not scored.failed and set(scored.columns["personalized"]) == {"p0", "p1"}
    leaky = evaluate(base, data, adapters=tmp_path, n_adapt=0, progress=False)
    assert set(leaky.failed) == {"p0", "p1"} and "which would be scored" in leaky.failed["p0"]


def test_the_command_says_its_default_and_refuses_bad_input_in_one_line(base, tmp_path, capsys):
    from alfa.cli import main

    with pytest.raises(SystemExit):
        main(["calibrate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "The affine map is the default:" in text and "one default serves every k" in text
    assert text.count("is the default") == 1 and "(default affine)" in text  # said once in words, once as --method's
    assert "can cost more than it corrects" in text  # what the first rows showed at k = 1, said where it is chosen
    assert "It stayed the default under a rule declared before the adapters' rows ran" in text  # §5.5's outcome
    ckpt = alfa.checkpoint.save_model(tmp_path / "base.safetensors", base, "tiny_gaze_net")
    spec = "synthetic:mpii?persons=1&images_per_person=8&size=16"
    argv = ["calibrate", "--checkpoint", str(ckpt), "--data", spec, "--out", str(tmp_path / "c"), "--quiet"]
    assert main([*argv, "--k", "3", "--pool", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the pool (2 images) must hold the k = 3 labelled ones" in err
    # what every person would fail on is one line before any work, and leaves no record behind
    assert main([*argv, "--k", "2", "--pool", "8"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--pool 8: every person needs the pool plus one image to score" in err
    assert "use --pool 7 or less" in err and not (tmp_path / "c").exists()
    assert main([*argv, "--k", "2", "--pool", "4", "--persons", "p00,p9"]) == 2
    assert "--persons: mpii/test has no person 'p9' (it has 1)" in capsys.readouterr().err
    assert main([*argv, "--k", "2", "--pool", "4"]) == 0
    before = (tmp_path / "c" / "p00.safetensors").read_bytes()
    assert main([*argv, "--k", "2", "--pool", "4"]) == 0  # the same run again: found done, nothing rewritten
    assert "0 done, 1 already there" in capsys.readouterr().out
    assert (tmp_path / "c" / "p00.safetensors").read_bytes() == before
    assert main([*argv, "--k", "3", "--pool", "4"]) == 2  # an earlier run there: nothing overwritten unasked
    assert "holds an earlier run" in capsys.readouterr().err
    assert (tmp_path / "c" / "p00.safetensors").read_bytes() == before
    assert main([*argv, "--k", "3", "--pool", "4", "--replace"]) == 0
    assert (tmp_path / "c" / "p00.safetensors").read_bytes() != before
    # the offset prior: a negative one refused in one line; a positive one is another recipe (its own files)
    with pytest.raises(SystemExit):
        main([*argv, "--offset-prior", "-1"])
    assert "--offset-prior" in capsys.readouterr().err
    shrunk = ["calibrate", "--checkpoint", str(ckpt), "--data", spec, "--out", str(tmp_path / "s"), "--quiet"]
    assert main([*shrunk, "--k", "3", "--pool", "4", "--offset-prior", "2"]) == 0
    assert _about(tmp_path / "s" / "p00.safetensors")["user_calibration"]["offset_prior"] == 2.0
    # at its neutral value the prior is no part of a run's key: a run made before the option existed resumes
    assert "offset_prior" not in _about(tmp_path / "c" / "p00.safetensors")["user_calibration"]
    # an option another method reads is refused by name, before anything runs; --persons must name someone
    for option, words in (
        (["--adapter-method", "nope"], "--adapter-method sets the adapter method's recipe, not offset's"),
        (["--option", "rank=4"], "--option sets the adapter method's recipe, not offset's"),
        (["--steps", "3"], "--steps sets the last-layer and adapter method's recipe, not offset's"),
        (["--persons", ","], "--persons ',': name at least one person id"),
        (["--persons", "p9"], "--persons: mpii/test has no person 'p9'"),  # refused before --replace removes
    ):
        assert main([*argv, "--k", "2", "--pool", "4", "--method", "offset", *option, "--replace"]) == 2
        assert words in capsys.readouterr().err
    # an adapter option its method does not have, or a wrong value: one line before any person is tried
    for option, words in (
        (["--option", "nonsense=3"], "unknown AlfaConfig options: nonsense; the options are"),
        (["--adapter-method", "lora", "--option", "rank=0"], "must be positive"),
        # every person failed in turn on these (a newcomer's run): the base's dictionaries are 4 wide
        (["--option", "rank=8"], "rank 8 is larger than the dictionary of every layer it adapts"),
        (["--adapter-method", "correction"], "the correction adapter is what the offset, affine, ridge and last"),
    ):
        assert main([*argv, "--k", "2", "--pool", "4", "--method", "adapter", *option, "--replace"]) == 2
        err = capsys.readouterr().err
        assert words in err and len(err.strip().splitlines()) == 1, err
    assert (tmp_path / "c" / "p00.safetensors").is_file()  # nothing was removed
    # TPGaze's prompts are sized to the images (16×16), as alfa personalize sizes them, and the recipe says so
    tp = ["--method", "adapter", "--adapter-method", "tpgaze", "--steps", "1", "--out", str(tmp_path / "t")]
    assert main([*argv[:-3], "--k", "2", "--pool", "4", *tp, "--quiet"]) == 0
    assert _about(tmp_path / "t" / "p00.safetensors")["user_calibration"]["adapter_options"] == {"image_size": 16}


def test_replace_removes_what_an_earlier_run_listed_and_never_a_record_no_run_wrote(base, tmp_path, capsys):
    """--replace removed a personalization.json no alfa run wrote (a JSON object without persons), and over a
    personalize folder it left that run's per-person .json sidecars, which still named the other method."""
    from alfa.cli import main

    ckpt = alfa.checkpoint.save_model(tmp_path / "base.safetensors", base, "tiny_gaze_net")
    spec = "synthetic:mpii?persons=2&images_per_person=8&size=16"
    out = tmp_path / "c"
    out.mkdir()
    (out / "personalization.json").write_text('{"my": "notes"}', encoding="utf-8")
    argv = ["calibrate", "--checkpoint", str(ckpt), "--data", spec, "--out", str(out), "--quiet", "--k", "2"]
    argv += ["--pool", "4"]
    for extra in ([], ["--replace"]):
        assert main([*argv, *extra]) == 2
        err = capsys.readouterr().err
        assert "is not a personalization record alfa wrote" in err and "move it away" in err, err
    assert (out / "personalization.json").read_text(encoding="utf-8") == '{"my": "notes"}'
    folder = tmp_path / "p"
    personalize = ["personalize", "--checkpoint", str(ckpt), "--data", spec, "--out", str(folder), "--quiet"]
    personalize += ["--adapter-rank", "2"]  # within the tiny base's d
    assert main([*personalize, "--steps", "1"]) == 0
    assert sorted(f.name for f in folder.glob("p0*.json")) == ["p00.json", "p01.json"]
    assert main([*argv[:5], "--out", str(folder), *argv[7:], "--replace"]) == 0
    assert not list(folder.glob("p0*.json"))  # the personalize run's sidecars went with its adapters
    (folder / "p00.json").write_text('{"my": "notes on p00"}', encoding="utf-8")  # a file calibrate never wrote
    assert main([*argv[:5], "--out", str(folder), *argv[7:-1], "3", "--replace"]) == 0  # another pool: replaced
    assert (folder / "p00.json").read_text(encoding="utf-8") == '{"my": "notes on p00"}'

    assert sorted(f.name for f in folder.glob("p0*.safetensors")) == ["p00.safetensors", "p01.safetensors"]


def _about(path):
    return alfa.read_adapter_metadata(path)["about"]


def _tensors(path):
    from safetensors.torch import load_file

    return load_file(str(path))


@pytest.mark.parametrize("where", ["calibrate_person", "write_record"])
def test_a_killed_calibration_resumes_and_ends_as_an_uninterrupted_one(base, tmp_path, monkeypatch, where):
    """Killed while calibrating the second person, or after writing their file but before the record lists it: the
    rerun keeps the first person's file, redoes the rest, and every file holds what a run never killed wrote."""
    from alfa.gaze import calibrate

    data = _dataset(persons=3)
    config = CalibrateConfig(method="last-layer", k=3, pool=8, steps=2)
    calibrate_dataset(base, data, config, tmp_path / "straight", progress=False)
    with monkeypatch.context() as m:
        kill_at(m, calibrate, where, 2)
        with pytest.raises(Killed):
            calibrate_dataset(base, data, config, tmp_path / "run", progress=False)
    assert alfa.adapter_state(base) is None
    first = (tmp_path / "run" / "p0.safetensors").stat().st_mtime_ns
    done = []

    def counting(*args, **kwargs):
        done.append(1)
        return calibrate_person(*args, **kwargs)

    monkeypatch.setattr(calibrate, "calibrate_person", counting)
    record = calibrate_dataset(base, data, config, tmp_path / "run", progress=False)
    assert len(done) == 2 and (tmp_path / "run" / "p0.safetensors").stat().st_mtime_ns == first  # p0 not redone
    assert [e["status"] for e in record["persons"].values()] == ["skipped", "ok", "ok"]
    for person in ("p0", "p1", "p2"):
        for name, t in _tensors(tmp_path / "straight" / f"{person}.safetensors").items():
            assert torch.equal(t, _tensors(tmp_path / "run" / f"{person}.safetensors")[name]), (person, name)


def test_a_calibration_folder_of_another_run_or_with_foreign_files_is_refused(base, tmp_path):
    data = _dataset()
    config = CalibrateConfig(method="offset", k=2, pool=8)
    calibrate_dataset(base, data, config, tmp_path / "a", progress=False)
    before = _tensors(tmp_path / "a" / "p0.safetensors")
    with pytest.raises(
        ValueError,
        match=r"earlier calibration run: .*other settings, the folder's vs this run's: config.user_calibration.k 2 "
        r"vs 3; use",
    ):
        calibrate_dataset(base, data, CalibrateConfig(method="offset", k=3, pool=8), tmp_path / "a", progress=False)
    assert torch.equal(_tensors(tmp_path / "a" / "p0.safetensors")["fc.bias_update"], before["fc.bias_update"])
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "p1.safetensors").write_bytes(b"someone else's")
    with pytest.raises(ValueError, match="holds p1.safetensors, which no calibration run there wrote"):
        calibrate_dataset(base, data, config, tmp_path / "b", progress=False)
    assert (tmp_path / "b" / "p1.safetensors").read_bytes() == b"someone else's"


def test_a_run_that_calibrated_nobody_does_not_hold_its_folder(base, tmp_path):
    """Every person failed (a pool larger than anyone's images): nothing was made, so a corrected run there goes
    ahead, and its record lists only its own persons' outcomes."""
    data = _dataset()
    failed = calibrate_dataset(base, data, CalibrateConfig(method="offset", k=2, pool=500), tmp_path, progress=False)
    assert {e["status"] for e in failed["persons"].values()} == {"failed"}
    record = calibrate_dataset(base, data, CalibrateConfig(method="offset", k=2, pool=8), tmp_path, progress=False)
    assert {e["status"] for e in record["persons"].values()} == {"ok"} and record["config"]["n_adapt"] == 8


def test_a_dense_base_serves_its_calibrated_users_and_refuses_methods_that_need_truncation(tmp_path):
    """A correction needs no factorization: MultiUserModel takes an untruncated base, serves each calibrated user
    as their own model, and refuses, when it is added, an adapter of a dense layer that is no correction."""
    torch.manual_seed(0)
    dense = TinyGazeNet().eval()
    images = torch.rand(6, 3, 16, 16)
    users = {}
    for name, config in (("u", CalibrateConfig(method="affine", k=6)), ("v", CalibrateConfig(method="ridge", k=6))):
        model = copy.deepcopy(dense)
        with torch.no_grad():
            target = dense(images) * 1.1 + 0.05 * len(users)
        calibrate_person(model, images, target, config)
        users[name] = model
    served = MultiUserModel(dense)
    served.add_user("u", alfa.save_adapter(users["u"], tmp_path / "u.safetensors"))
    served.add_user("v", users["v"])
    other = torch.rand(4, 3, 16, 16)
    with torch.no_grad():
        mixed = served(other, ["v", "u", None, "u"])
        torch.testing.assert_close(mixed[0], users["v"](other)[0])
        torch.testing.assert_close(mixed[1::2], users["u"](other)[1::2])
        torch.testing.assert_close(mixed[2], dense(other)[2])
    lora = copy.deepcopy(dense)
    alfa.attach(lora, alfa.LoraConfig(rank=2))  # LoRA on the dense layers: not a correction
    with pytest.raises(ValueError, match="served per sample only as a correction.*truncate the base"):
        served.add_user("w", lora)
    assert served.users == ["u", "v"]


def test_an_adapter_calibration_of_a_dense_base_says_what_it_makes(tmp_path, capsys):
    """It works, but alfa serve refuses its files: a note says so once, before the work; a correction
    (or a truncated base) gets none."""
    from alfa.cli import main

    torch.manual_seed(0)
    dense = alfa.checkpoint.save_model(tmp_path / "dense.safetensors", TinyGazeNet().eval(), "tiny_gaze_net")
    spec = "synthetic:mpii?persons=1&images_per_person=8&size=16"
    argv = ["calibrate", "--checkpoint", str(dense), "--data", spec, "--k", "2", "--pool", "4", "--quiet"]
    assert main([*argv, "--method", "adapter", "--steps", "1", "--out", str(tmp_path / "a")]) == 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"note: {dense} is not truncated" in err and "alfa serve refuses" in err
    assert main([*argv, "--method", "affine", "--out", str(tmp_path / "b")]) == 0
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("method", ["offset", "affine", "ridge"])
def test_a_nan_label_is_refused_by_the_closed_forms_not_saved_into_the_correction(method):
    """The trained methods check their loss; the closed forms let a NaN label through into the head's
    correction, and saving it then blamed a diverged training."""
    torch.manual_seed(0)
    model = TinyGazeNet().eval()
    images = torch.rand(4, 3, 16, 16)
    gaze = torch.zeros(4, 2)
    gaze[2, 1] = float("nan")
    with pytest.raises(ValueError, match=f"the {method} calibration is not finite: a labelled image's gaze"):
        calibrate_person(model, images, gaze, CalibrateConfig(method=method, k=4))
    assert alfa.adapter_state(model) is None  # nothing left attached


def test_test_time_augmentation_refuses_a_labelled_calibration_whose_yaw_it_would_cancel(base, tmp_path, capsys):
    """The law behind the refusal: under the flip, a calibration's offset ``c`` goes into both views and the
    mirrored one comes back with its yaw negated, so ``½ [(f(x) + c) + FlipYaw(f(flip x) + c)]`` keeps only ``c``'s
    pitch. ``alfa evaluate --tta``, ``alfa export --tta`` and ``alfa serve --tta`` refuse such a file in one line;
    an adapter personalized without labels is scored as before."""
    from alfa.cli import main
    from alfa.gaze.service import GazeService, ServiceError
    from alfa.gaze.tta import FlipTTA, tta_kind

    model = copy.deepcopy(base).eval()
    images = torch.rand(6, 3, 16, 16)
    with torch.no_grad():
        offset = torch.tensor([0.2, -0.1])
        calibrate_person(model, images, base(images) + offset, CalibrateConfig(method="offset", k=6))
        plain = model(images) - base(images)
        flipped = FlipTTA(model)(images) - FlipTTA(base)(images)
    torch.testing.assert_close(plain, offset.expand(6, 2), atol=1e-5, rtol=0)
    torch.testing.assert_close(flipped, torch.tensor([0.0, -0.1]).expand(6, 2), atol=1e-5, rtol=0)  # the yaw gone

    ckpt = alfa.checkpoint.save_model(tmp_path / "base.safetensors", base, "tiny_gaze_net", input_size=(16, 16))
    spec = "synthetic:mpii?persons=1&images_per_person=8&size=16"
    cal = tmp_path / "c"
    assert main(["calibrate", "--checkpoint", str(ckpt), "--data", spec, "--out", str(cal), "--quiet", "--k", "2",
                 "--pool", "4", "--method", "offset"]) == 0  # fmt: skip
    capsys.readouterr()
    scored = ["evaluate", "--checkpoint", str(ckpt), "--data", spec, "--adapters", str(cal), "--n-adapt", "4"]
    assert main([*scored, "--tta", "flip"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "p00.safetensors is a calibration from labelled images" in err
    assert "test-time augmentation 'flip' averages 2 views of each crop" in err and "use it without --tta" in err
    assert main(scored) == 0
    capsys.readouterr()
    onnx = tmp_path / "m.onnx"
    if importlib.util.find_spec("onnxruntime") is not None:
        assert main(["export", "--checkpoint", str(ckpt), "--adapter", str(cal / "p00.safetensors"),
                     "--out", str(onnx), "--tta", "roll"]) == 2  # fmt: skip
        assert "averages 3 views of each crop" in capsys.readouterr().err and not onnx.exists()
    # alfa serve refuses at its start, in one line, not by an answer to each user once it serves
    assert main(["serve", "--checkpoint", str(ckpt), "--adapters", str(cal), "--tta", "flip", "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "p00.safetensors is a calibration from labelled images" in err
    notes: list[str] = []  # a calibration that appears once it serves: a 409 (the user is there), the log says why
    served = GazeService(ckpt, cal, tta="flip", note=notes.append)
    png = io.BytesIO()
    Image.fromarray((images[0].permute(1, 2, 0).numpy() * 255).astype(np.uint8)).save(png, format="PNG")
    with pytest.raises(ServiceError, match="a calibration from labelled images, which this server's --tta would undo"):
        served.predict("p00", png.getvalue())
    with pytest.raises(ServiceError) as refused:
        served.predict("p00", png.getvalue())
    assert refused.value.status == 409
    assert notes == [
        "alfa serve: the adapter of user 'p00' is a calibration from labelled images, and test-time augmentation "
        "'flip' averages 2 views of each crop, which undoes part of its correction (the yaw of an offset cancels "
        "under the flip): use it without --tta"
    ]
    assert GazeService(ckpt, cal, note=lambda _: None).predict("p00", png.getvalue())["user"] == "p00"
    personalized = {"dataset": "toy", "person": "p0", "n_adapt": 5}  # no labelled images: a flip may average it
    tta_kind("flip").refuse_calibration(personalized, "an adapter")
