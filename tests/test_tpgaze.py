"""TPGaze: prompted convs (dense and truncated), the first-order meta-step, meta-training with resume,
and per-person personalization on synthetic data."""

import copy
import json

import pytest
import torch

import alfa
import alfa.gaze.evaluate
import alfa.gaze.train
import alfa.layers
from alfa.adapters.prompt import TPGAZE_TARGET, PromptedConv, TPGazeConfig, input_sizes_by_geometry, prompt_count
from alfa.checkpoint import CheckpointError, read_tagged
from alfa.gaze.data.synthetic import make_domain
from alfa.gaze.evaluate import adapter_filename, evaluate
from alfa.gaze.losses import supervised_l1_loss
from alfa.gaze.personalize import PersonalizeConfig
from alfa.gaze.tpgaze import (
    MetaTrainConfig,
    meta_step,
    meta_train_prompts,
    personalize_tpgaze_dataset,
    start_from,
    symmetry_loss,
    tpgaze_recipe,
)
from alfa.models.resnet import resnet18_conv_inputs

SIZE = 32
NINE = [
    "conv1",
    *(f"layer1.{b}.conv{c}" for b in (0, 1) for c in (1, 2)),
    *(f"layer2.{b}.conv{c}" for b in (0, 1) for c in (1, 2)),
]


@pytest.fixture(scope="module")
def bases():
    """ResNet-18 dense, and with layer2 truncated at rank 64 (as a full truncation leaves the 9 targets:
    stem and layer1 dense, layer2's 3×3 convs factorized)."""
    torch.manual_seed(0)
    dense = alfa.models.resnet18_gaze().eval()
    with torch.no_grad():  # non-trivial BatchNorm statistics, so eval-mode outputs depend on them
        for m in dense.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.normal_(0, 0.1)
                m.running_var.uniform_(0.5, 1.5)
    truncated = copy.deepcopy(dense)
    alfa.truncate(truncated, 64, target=r"^layer2\.")
    return {"dense": dense, "truncated": truncated}


def images(n: int, seed: int = 0) -> torch.Tensor:
    return torch.rand(n, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(seed))


# ----------------------------------------------------------------------------- the prompted model


@pytest.mark.parametrize("kind", ["dense", "truncated"])
def test_zero_prompts_equal_the_plain_model_exactly(bases, kind):
    model = copy.deepcopy(bases[kind])
    x = images(4)
    plain = model(x)
    assert alfa.attach(model, TPGazeConfig(image_size=SIZE, init_std=0.0)) == NINE
    assert torch.equal(model(x), plain)
    # Non-zero prompts change the output (they are wired in), and detach restores the plain model.
    with torch.no_grad():
        model.get_submodule("layer2.1.conv2").prompt_lr.fill_(0.5)
    assert not torch.allclose(model(x), plain)
    alfa.detach(model)
    assert torch.equal(model(x), plain)


def test_prompted_conv_is_the_conv_of_the_prompt_padded_input(bases):
    model = copy.deepcopy(bases["truncated"])
    alfa.attach(model, TPGazeConfig(image_size=SIZE))
    for name in ("conv1", "layer2.0.conv1"):  # dense stride-2 7×7, factorized stride-2 3×3
        layer = model.get_submodule(name)
        x = torch.randn(2, layer.spec.in_features, *layer.input_size)
        ph, pw = layer.spec.padding
        padded = layer.frame().expand(2, -1, -1, -1).clone()
        padded[:, :, ph : ph + x.shape[2], pw : pw + x.shape[3]] = x
        expected = layer.frame_spec.dense_op(padded, alfa.layers.dense_matrix(layer.base), layer.base.bias)
        torch.testing.assert_close(layer(x), expected, atol=1e-4, rtol=1e-4)


def resnet18_input_sizes(image_size: int) -> dict[str, list[int]]:
    """ResNet-18's conv input sizes by geometry, read off its layout (no forward of a real model)."""
    return input_sizes_by_geometry(resnet18_conv_inputs(image_size))


def test_prompt_geometry_follows_the_reference(bases):
    # The reference pads each of the 9 convs with C·((S+2p)² − S²) values at 224×224: 125,676 in all.
    sizes = resnet18_input_sizes(224)
    expected = prompt_count(3, sizes["3->64 k7x7 s2x2 p3x3 d1x1"], (3, 3))
    expected += 5 * prompt_count(64, [56, 56], (1, 1)) + 3 * prompt_count(128, [28, 28], (1, 1))
    assert expected == 125_676
    model = copy.deepcopy(bases["dense"])
    alfa.attach(model, TPGazeConfig())
    assert alfa.parameter_summary(model).trainable == expected
    assert model.get_submodule("conv1").prompt_tb.shape == (3, 6, 230)
    assert model.get_submodule("layer2.0.conv2").prompt_lr.shape == (128, 28, 2)
    with pytest.raises(ValueError, match="sized for a 224×224 input, got 32×32"):
        model(images(1))


def test_only_prompts_receive_gradients(bases):
    model = copy.deepcopy(bases["truncated"])
    alfa.attach(model, TPGazeConfig(image_size=SIZE))
    prompts = alfa.adapter_parameters(model)
    assert sorted(prompts) == sorted(f"{n}.prompt_{s}" for n in NINE for s in ("tb", "lr"))
    assert alfa.parameter_summary(model).trainable == sum(p.numel() for p in prompts.values())
    symmetry_loss(model, images(3)).backward()
    for name, p in model.named_parameters():
        if name in prompts:
            assert p.grad is not None and p.grad.abs().sum() > 0, name
        else:
            assert not p.requires_grad and p.grad is None, name


def test_merge_refuses_and_files_round_trip(bases, tmp_path):
    model = copy.deepcopy(bases["truncated"])
    alfa.attach(model, TPGazeConfig(image_size=SIZE))
    x = images(2)
    out = model(x)
    with pytest.raises(alfa.MergeError, match="cannot be merged"):
        alfa.merge(model)
    assert torch.equal(model(x), out)  # nothing changed
    path = alfa.save_adapter(model, tmp_path / "p.safetensors")
    # The prompts and a header (config, the fingerprints of conv1 and of every other module): not the network.
    assert path.stat().st_size < 4 * alfa.parameter_summary(model).trainable + 8192
    fresh = copy.deepcopy(bases["truncated"])
    alfa.load_adapter(fresh, path)
    assert torch.equal(fresh(x), out)


@pytest.mark.parametrize("image_size", [SIZE, 224])
@pytest.mark.parametrize("kind", ["dense", "truncated"])
def test_sizes_measured_on_the_model_are_resnet18s_layout(bases, kind, image_size):
    # Without input_sizes the prompts are sized on the model attach is given; on ResNet-18 that is its layout:
    # the same prompts (shapes and, from one seed, values) as sizes read off resnet18_conv_inputs.
    config = TPGazeConfig(image_size=image_size)
    measured, laid_out = copy.deepcopy(bases[kind]), copy.deepcopy(bases[kind])
    torch.manual_seed(3)
    alfa.attach(measured, config)
    torch.manual_seed(3)
    alfa.attach(laid_out, TPGazeConfig.for_network(resnet18_conv_inputs, image_size))
    a, b = alfa.adapter_parameters(measured), alfa.adapter_parameters(laid_out)
    assert list(a) == list(b) and all(torch.equal(a[n], b[n]) for n in a)
    # What is recorded (and saved) is the config as given: no measured sizes in it.
    assert alfa.adapter_state(measured).config is not config and config.input_sizes is None  # a copy is kept
    assert alfa.adapter_state(measured).config.to_dict() == TPGazeConfig(image_size=image_size).to_dict()


def test_prompt_sizes_need_the_model_or_explicit_sizes(bases):
    conv = copy.deepcopy(bases["dense"]).conv1
    with pytest.raises(alfa.ConfigError, match="sizes its prompts on the model it is attached to"):
        TPGazeConfig(image_size=SIZE).build(conv)  # a layer alone does not know its input size
    sized = TPGazeConfig.for_network(resnet18_conv_inputs, SIZE)
    assert isinstance(sized.build(conv), PromptedConv)
    # A model that does not take images cannot be measured: the error says how to give the sizes.
    not_images = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Conv2d(3, 4, 3, padding=1))
    with pytest.raises(alfa.ConfigError, match=r"TPGazeConfig.for_network\(conv_inputs, image_size\)"):
        alfa.attach(not_images, TPGazeConfig(image_size=SIZE, target=None))
    assert alfa.adapter_state(not_images) is None


def test_measuring_keeps_each_modules_mode(bases):
    # The probe runs in eval mode and puts back every module's own mode (BatchNorm held in eval while training).
    model = copy.deepcopy(bases["dense"]).train()
    model.bn1.eval()
    alfa.attach(model, TPGazeConfig(image_size=SIZE))
    assert model.training and not model.bn1.training and model.layer1[0].bn1.training


# ----------------------------------------------------------------------------- the meta-step


def _attached(bases, seed=0):
    model = copy.deepcopy(bases["dense"])
    torch.manual_seed(seed)
    alfa.attach(model, TPGazeConfig(image_size=SIZE, init_std=0.1))
    return model, alfa.adapter_parameters(model)


def test_one_meta_step_changes_the_prompts_and_nothing_else(bases):
    model, prompts = _attached(bases)
    frozen = {k: v.clone() for k, v in model.state_dict().items() if "prompt_" not in k}
    before = {n: p.detach().clone() for n, p in prompts.items()}
    config = MetaTrainConfig(batch_size=4)
    outer = torch.optim.Adam(prompts.values(), lr=config.outer_lr)
    inner = torch.optim.Adam(prompts.values(), lr=config.inner_lr)
    gaze = torch.rand(4, 2) - 0.5
    meta_step(model, prompts, images(4, 1), images(4, 2), gaze, outer, config, inner)
    for name, p in prompts.items():
        assert not torch.equal(p, before[name]), name
    for k, v in model.state_dict().items():
        if k in frozen:
            assert torch.equal(v, frozen[k]), k


def test_the_inner_step_is_unsupervised(bases):
    config = MetaTrainConfig(batch_size=4, inner_optimizer="sgd", inner_lr=0.5, query="same")
    x = images(4, 3)
    results = []
    for gaze in (torch.zeros(4, 2), torch.rand(4, 2) - 0.5):  # two label sets for the same images
        model, prompts = _attached(bases)
        start = {n: p.detach().clone() for n, p in prompts.items()}
        outer = torch.optim.SGD(prompts.values(), lr=1.0)
        step = meta_step(model, prompts, x, x, gaze, outer, config)
        results.append((start, step, {n: p.detach().clone() for n, p in prompts.items()}))
    (start, first, after_a), (_, second, after_b) = results
    # The adapted prompts p' do not depend on the labels; the outer update does.
    for name in start:
        assert torch.equal(first.adapted[name], second.adapted[name]), name
    assert any(not torch.equal(after_a[n], after_b[n]) for n in start)

    # p' = p − α ∇ L_sym(p), with the gradient of the symmetry loss alone.
    model, prompts = _attached(bases)
    grads = torch.autograd.grad(symmetry_loss(model, x), list(prompts.values()))
    for (name, p), g in zip(prompts.items(), grads):
        torch.testing.assert_close(first.adapted[name], p.detach() - 0.5 * g)
    # The outer step applies the query loss's gradient taken at p' to p (first order).
    adapted_model, adapted_prompts = _attached(bases)
    with torch.no_grad():
        for n, p in adapted_prompts.items():
            p.copy_(first.adapted[n])
    outer_grads = torch.autograd.grad(
        supervised_l1_loss(adapted_model(x), torch.zeros(4, 2)), list(adapted_prompts.values())
    )
    for (name, s), g in zip(start.items(), outer_grads):
        torch.testing.assert_close(after_a[name], s - g)


# ----------------------------------------------------------------------------- meta-training and personalization


@pytest.fixture(scope="module")
def synthetic():
    source = make_domain("eth", persons=4, images_per_person=12, size=SIZE)
    target = make_domain("mpii", persons=2, images_per_person=8, size=SIZE)
    return source, target


FAST = MetaTrainConfig(epochs=2, steps_per_epoch=2, batch_size=6, val_fraction=0.25)


@pytest.mark.slow
def test_meta_training_resumes_to_the_same_numbers(bases, synthetic, tmp_path):
    source, _ = synthetic
    straight = copy.deepcopy(bases["dense"])
    full = meta_train_prompts(straight, source, FAST, tmp_path / "straight", progress=False)
    assert full.val_persons and set(full.val_persons).isdisjoint(full.train_persons)
    assert full.initial_val_error["base"] == pytest.approx(
        alfa.gaze.train.mean_error(
            alfa.gaze.evaluate.person_errors(bases["dense"], source, full.val_persons, n_adapt=0)
        )
    )
    part = copy.deepcopy(bases["dense"])
    meta_train_prompts(
        part, source, MetaTrainConfig(**{**FAST.to_dict(), "epochs": 1}), tmp_path / "split", progress=False
    )
    resumed = copy.deepcopy(bases["dense"])
    torch.manual_seed(123)  # another init: everything must come from the files
    with pytest.warns(UserWarning, match="holds a finished meta-training of 1 epoch: this run goes on to 2"):
        again = meta_train_prompts(resumed, source, FAST, tmp_path / "split", progress=False)
    assert again.resumed_from_epoch == 1 and len(again.history) == 2
    for (name, a), b in zip(alfa.adapter_parameters(straight).items(), alfa.adapter_parameters(resumed).values()):
        assert torch.equal(a, b), name
    with pytest.raises(CheckpointError, match="another meta-training run"):
        other = MetaTrainConfig(**{**FAST.to_dict(), "outer_lr": 1e-3})
        meta_train_prompts(copy.deepcopy(bases["dense"]), source, other, tmp_path / "split", progress=False)


@pytest.mark.slow
def test_a_meta_epoch_is_saved_before_its_line_says_it_is_done(bases, synthetic, tmp_path, monkeypatch):
    """The line "tpgaze meta epoch k/N: …" was printed before epoch k's state, prompts and record were written: a Ctrl-C
    right after the line lost the epoch it said was done."""
    import alfa.gaze.tpgaze as tpgaze

    said = []

    class Saying(tpgaze.tqdm):
        @classmethod
        def write(cls, s, *args, **kwargs):
            said.append(s)
            raise KeyboardInterrupt  # a Ctrl-C as the line appears

    monkeypatch.setattr(tpgaze, "tqdm", Saying)
    with pytest.raises(KeyboardInterrupt):
        meta_train_prompts(copy.deepcopy(bases["dense"]), synthetic[0], FAST, tmp_path, progress=True)
    assert len(said) == 1 and said[0].startswith("tpgaze meta epoch 1/2: outer L1 ")
    state = read_tagged(tmp_path / tpgaze.STATE_FILE, tpgaze.STATE_FORMAT, "a state")[1]
    assert state["epoch"] == 1 and (tmp_path / tpgaze.PROMPTS_FILE).is_file()
    assert json.loads((tmp_path / tpgaze.RECORD_FILE).read_text())["epoch"] == 1


@pytest.mark.slow
def test_tiny_personalization_end_to_end(bases, synthetic, tmp_path):
    source, target = synthetic
    base = copy.deepcopy(bases["truncated"])
    meta = meta_train_prompts(base, source, FAST, tmp_path / "meta", progress=False)
    meta_values = {n: p.detach().clone() for n, p in alfa.adapter_parameters(base).items()}
    alfa.detach(base)
    x = images(2)
    plain = base(x)

    # Every person starts from the meta-trained prompts, with TPGaze's recipe.
    started = start_from(base, meta.prompts)
    alfa.attach(base, started)
    for n, p in alfa.adapter_parameters(base).items():
        assert torch.equal(p, meta_values[n]), n
    alfa.detach(base)
    recipe = tpgaze_recipe(PersonalizeConfig(steps=3, seed=1))
    assert (recipe.lr, recipe.weight_decay, recipe.lr_scale, recipe.steps, recipe.n_adapt) == (0.01, 0.0, {}, 3, 5)

    run = personalize_tpgaze_dataset(base, target, meta.prompts, tmp_path / "ad", recipe, progress=False)
    assert [o.status for o in run.persons.values()] == ["ok", "ok"]
    assert all(len(o.losses) == 3 and all(map(torch.isfinite, torch.tensor(o.losses))) for o in run.persons.values())
    assert torch.equal(base(x), plain)  # the shared base is untouched

    report = evaluate(base, target, adapters=tmp_path / "ad", progress=False)
    assert report.n_eval == {"p00": 3, "p01": 3}  # the 5 adaptation images are excluded
    assert set(report.columns["personalized"]) == {"p00", "p01"}
    assert all(torch.isfinite(torch.tensor(v)) for v in report.columns["personalized"].values())

    # Per-user artifact: the prompts alone; it records where they started.
    meta_file = alfa.read_adapter_metadata(tmp_path / "ad" / adapter_filename("p00"))
    assert meta_file["method"] == "tpgaze" and meta_file["targets"] == NINE
    assert meta_file["config"]["init_from"] == started.init_from
    assert meta.trainable_parameters == sum(v.numel() for v in meta_values.values())

    # Resuming the personalization skips persons already done; another model instance is refused.
    again = personalize_tpgaze_dataset(base, target, meta.prompts, tmp_path / "ad", recipe, progress=False)
    assert [o.status for o in again.persons.values()] == ["skipped", "skipped"]
    with pytest.raises(ValueError, match="another model instance"):
        alfa.attach(copy.deepcopy(base), started)


def test_config_checks():
    with pytest.raises(ValueError, match="image_size"):
        TPGazeConfig(image_size=0).validate()
    with pytest.raises(ValueError, match="inner_optimizer"):
        MetaTrainConfig(inner_optimizer="rmsprop").validate()
    small = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.Conv2d(4, 4, 1))
    config = TPGazeConfig.for_model(small, 10, target=r"^0$")
    assert config.input_sizes == {"3->4 k3x3 s1x1 p1x1 d1x1": [10, 10]}
    with pytest.raises(ValueError, match="nothing to prompt"):
        alfa.attach(small, TPGazeConfig.for_model(small, 10, target=r"^1$"))
    assert TPGAZE_TARGET.startswith("^")


def test_cli_meta_train_then_personalize(tmp_path, capsys):
    from tiny_models import truncated_tiny_gaze_net

    from alfa.checkpoint import save_model
    from alfa.cli import build_parser

    # the commands' options, files and refusals do not depend on the base: the tiny one (its conv1 prompted)
    base = truncated_tiny_gaze_net()
    save_model(tmp_path / "base.safetensors", base, "tiny_gaze_net")
    parser = build_parser()
    source = f"synthetic:eth?size={SIZE}&persons=3&images_per_person=8"
    target = f"synthetic:mpii?size={SIZE}&persons=1&images_per_person=7"
    common = ["--checkpoint", str(tmp_path / "base.safetensors"), "--quiet"]
    argv = ["tpgaze", "meta-train", *common, "--data", source, "--out", str(tmp_path / "meta")]
    args = parser.parse_args([*argv, "--epochs", "1", "--steps-per-epoch", "1", "--batch-size", "4"])
    args.func(args)
    assert "meta-trained prompts" in capsys.readouterr().out
    args = parser.parse_args(["tpgaze", "personalize", *common, "--data", target, "--out", str(tmp_path / "ad")])
    with pytest.raises(ValueError, match="--meta"):
        args.func(args)
    args = parser.parse_args(
        ["tpgaze", "personalize", *common, "--data", target, "--out", str(tmp_path / "ad"), "--steps", "2"]
        + ["--meta", str(tmp_path / "meta" / "prompts.safetensors")]
    )
    args.func(args)
    out = capsys.readouterr().out
    assert "(Adam lr 0.01, 2 steps, 5 images): 1 done" in out
    assert (tmp_path / "ad" / "p00.safetensors").is_file()
    # another recipe over those prompt files, or TPGaze over another method's adapters: refused, nothing lost
    first = (tmp_path / "ad" / "p00.safetensors").read_bytes()
    again = ["tpgaze", "personalize", *common, "--data", target, "--out", str(tmp_path / "ad"), "--no-meta"]
    for argv in (again, [*again[:-1], "--meta", str(tmp_path / "meta" / "prompts.safetensors"), "--steps", "3"]):
        args = parser.parse_args(argv)
        with pytest.raises(ValueError, match="--replace to redo them there"):
            args.func(args)
        assert (tmp_path / "ad" / "p00.safetensors").read_bytes() == first
    args = parser.parse_args([*again, "--steps", "1", "--replace"])
    args.func(args)
    assert "1 done, 0 already there" in capsys.readouterr().out
    assert (tmp_path / "ad" / "p00.safetensors").read_bytes() != first
    for persons, words in ((",", "name at least one person id"), ("p9", "has no person 'p9'")):
        args = parser.parse_args([*again, "--steps", "2", "--replace", "--persons", persons])
        with pytest.raises(ValueError, match=words):
            args.func(args)
        assert (tmp_path / "ad" / "p00.safetensors").is_file()  # refused before --replace removed anything
    # a base trained on another size: one line up front, for both commands, not a failure per person
    save_model(tmp_path / "sized.safetensors", base, "tiny_gaze_net", input_size=(SIZE + 16, SIZE + 16))
    sized = ["--checkpoint", str(tmp_path / "sized.safetensors"), "--quiet"]
    for argv in (
        ["tpgaze", "personalize", *sized, "--data", target, "--out", str(tmp_path / "ad2"), "--no-meta"],
        ["tpgaze", "meta-train", *sized, "--data", source, "--out", str(tmp_path / "meta2")],
    ):
        args = parser.parse_args(argv)
        with pytest.raises(ValueError, match=f"was trained on {SIZE + 16}×{SIZE + 16} images, .* has {SIZE}×{SIZE}"):
            args.func(args)
        assert not (tmp_path / argv[-3 if argv[-1] == "--no-meta" else -1]).exists()


def test_prompt_sizes_are_measured_through_another_adapters_layers():
    """for_model on a model whose target conv another adapter wraps finds it under the layer's own name."""
    from tiny_models import truncated_tiny_gaze_net

    import alfa

    model = truncated_tiny_gaze_net()
    alfa.attach(model, alfa.LoraConfig(rank=2), name="lora")
    config = alfa.TPGazeConfig.for_model(model, 16, target="^conv1$")
    assert config.input_sizes == {"3->16 k3x3 s2x2 p1x1 d1x1": [16, 16]}
    alfa.attach(model, config, name="prompts")
    assert alfa.active_adapter(model) == "prompts"


def test_the_meta_training_summary_counts_in_the_singular_where_there_is_one():
    """A newcomer's 1-epoch run said "1 epochs of 2 meta-steps" and "1 held-out source persons"."""
    from alfa.cli.tpgaze import _counted

    assert _counted(1, "epochs") == "1 epoch" and _counted(2, "meta-steps") == "2 meta-steps"
    assert _counted(1, "held-out source persons") == "1 held-out source person"
    assert _counted(0, "held-out source persons") == "0 held-out source persons"
