"""The PEFT user's habits: named adapters (switch, delete, disable), modules_to_save, list targets, configs
checked when written, the one-line parameter count and explicit weight decay in ``param_groups``."""

from __future__ import annotations

import copy
import dataclasses
import pickle
import re

import pytest
import torch
from safetensors import safe_open
from tiny_models import TinyGazeNet
from torch import nn

import alfa
from alfa.adapters import ConfigError, MergeError, adapted_layers, target_matches
from alfa.layers import is_factorized

IMAGE = 16
LORA_TARGET = ["layer3.0", "layer4.0", "conv1"]


@pytest.fixture
def x() -> torch.Tensor:
    return torch.randn(2, 3, IMAGE, IMAGE, generator=torch.Generator().manual_seed(1))


@pytest.fixture
def base() -> nn.Module:
    torch.manual_seed(0)
    net = TinyGazeNet().eval()
    with torch.no_grad():  # non-trivial statistics, so eval outputs depend on them
        for m in net.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.normal_(0, 0.1)
                m.running_var.uniform_(0.5, 1.5)
    alfa.truncate(net, rank=6)
    return net


def _randomize(model: nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in alfa.adapter_parameters(model).values():
            p.add_(torch.randn(p.shape, generator=g) * 0.1)


def _alfa() -> alfa.AlfaConfig:
    return alfa.AlfaConfig(heads=2, rank=2)


def _lora(**options) -> alfa.LoraConfig:
    return alfa.LoraConfig(rank=2, alpha=4.0, layers="all", target=LORA_TARGET, **options)


def _single(base: nn.Module, multi: nn.Module, name: str, config: alfa.AdapterConfig) -> nn.Module:
    """A copy of the base with only ``config`` attached, holding the tensors of ``multi``'s adapter ``name``."""
    ref = copy.deepcopy(base)
    alfa.attach(ref, config)
    active = alfa.active_adapter(multi)
    alfa.set_adapter(multi, name)
    theirs = alfa.adapters.adapter_tensors(multi)
    with torch.no_grad():
        for k, t in alfa.adapters.adapter_tensors(ref).items():
            t.copy_(theirs[k])
    alfa.set_adapter(multi, active)
    return ref


@pytest.fixture
def two(base: nn.Module) -> nn.Module:
    """The base with an Alfa adapter "ann" and a LoRA adapter "bob" (active), both away from their init."""
    model = copy.deepcopy(base)
    alfa.attach(model, _alfa(), name="ann")
    _randomize(model, 1)
    alfa.attach(model, _lora(), name="bob")
    _randomize(model, 2)
    return model


# ----------------------------------------------------------------------------------------------------------------
# target: a regular expression or a list of module-name suffixes


def test_target_matches_names_and_dotted_suffixes():
    assert target_matches(["fc"], "fc") and target_matches(["fc"], "head.fc")
    assert not target_matches(["fc"], "xfc") and not target_matches(["fc"], "fc.base")
    assert target_matches(["0"], "layer1.0") and not target_matches(["0"], "layer1.10")
    assert target_matches(r"layer\d\.0$", "layer1.0") and target_matches(None, "anything")


@pytest.mark.parametrize(
    ("suffixes", "regex", "layers"),
    [
        (["layer3.0", "fc"], r"^(layer3\.0|fc)$", "dense"),
        (["0"], r"(^|\.)0$", "all"),
        (["conv1", "layer2.0", "layer4.0"], r"^(conv1|layer2\.0|layer4\.0)$", "all"),
    ],
)
def test_a_list_target_adapts_the_same_layers_as_the_equivalent_regex(suffixes, regex, layers):
    dense = TinyGazeNet()
    truncated = TinyGazeNet()
    alfa.truncate(truncated, rank=6)
    compared = 0
    for net in (dense, truncated):
        a, b = copy.deepcopy(net), copy.deepcopy(net)
        want = alfa.attach(b, alfa.LoraConfig(rank=2, layers=layers, target=regex))
        left_out = [s for s in suffixes if not any(target_matches([s], n) for n in want)]
        if left_out:  # a name the list gives but the layers kind leaves out is refused, not silently dropped
            with pytest.raises(ValueError, match=rf"^lora: target '{re.escape(left_out[0])}' selects no layer: "):
                alfa.attach(a, alfa.LoraConfig(rank=2, layers=layers, target=suffixes))
            assert alfa.adapter_state(a) is None
            continue
        got = alfa.attach(a, alfa.LoraConfig(rank=2, layers=layers, target=suffixes))
        assert got == want and got
        compared += 1
    assert compared


def test_a_list_target_names_what_it_cannot_adapt_where_the_others_would_be():
    """A misspelt name, a module of another kind, a dense layer under layers='factorized': refused by name, where
    the list's other names selected layers and this one was silently left out."""
    model = nn.Sequential(nn.Conv1d(8, 8, 3), nn.Flatten(), nn.Linear(48, 2))
    for target, message in [
        (["2", "0"], "lora: target '0' selects no layer: 0 is a Conv1d, which cannot be adapted: alfa adapts Linear"),
        (["2", "fc"], "lora: target 'fc': the model has no module named 'fc' (nor ending in '.fc')"),
        (["0"], "matched nothing; it names 0, a Conv1d, which cannot be adapted"),
    ]:
        with pytest.raises(ValueError, match=re.escape(message)):
            alfa.attach(model, alfa.LoraConfig(rank=2, target=target))
        assert alfa.adapter_state(model) is None
    truncated = TinyGazeNet()
    alfa.truncate(truncated, rank=6)
    dense_left = next(n for n, m in truncated.named_modules() if isinstance(m, nn.Linear))
    factorized = next(n for n, m in truncated.named_modules() if is_factorized(m))
    with pytest.raises(ValueError, match=rf"target '{dense_left}' selects no layer: {dense_left} is left dense under"):
        alfa.attach(truncated, alfa.LoraConfig(rank=2, target=[factorized, dense_left]))


def test_a_list_target_selects_parameters_for_model_scope_methods():
    a, b = TinyGazeNet(), TinyGazeNet()
    got = alfa.attach(a, alfa.BitfitConfig(target=["bias", "bn1.weight"]))
    want = alfa.attach(b, alfa.BitfitConfig(target=r"(\.bias|^bn1\.weight)$"))
    assert (
        got
        == want
        == ["bn1.weight", "bn1.bias", "layer1.1.bias", "layer2.1.bias", "layer3.1.bias"]
        + [
            "layer4.1.bias",
            "fc.bias",
        ]
    )


def test_list_options_round_trip_through_dicts_and_old_dicts_are_unchanged():
    config = alfa.LoraConfig(target=["fc", "conv1"], modules_to_save=["head"])
    assert config.target == ("fc", "conv1") and config.modules_to_save == ("head",)
    d = config.to_dict()
    assert d["target"] == ["fc", "conv1"] and d["modules_to_save"] == ["head"]
    assert alfa.adapters.config_from_dict("lora", d) == config
    # Configs without modules_to_save write the same dict as before the option existed (cache keys, file headers).
    assert alfa.LoraConfig().to_dict() == {"target": None, "layers": "auto", "rank": 8, "alpha": 16.0}


# ----------------------------------------------------------------------------------------------------------------
# Configs are checked when they are made

INVALID = [
    (alfa.LoraConfig, {"rank": 0}, "rank must be positive"),
    (alfa.LoraConfig, {"rank": "8"}, r"LoraConfig\.rank must be an integer"),
    (alfa.LoraConfig, {"alpha": "big"}, r"LoraConfig\.alpha must be a number"),
    (alfa.AlfaConfig, {"heads": -1}, "heads and rank must be positive"),
    (alfa.AlfaConfig, {"init_std": None}, r"AlfaConfig\.init_std must be a number"),
    (alfa.AlfaConfig, {"dense_rank": 2.5}, r"AlfaConfig\.dense_rank must be an integer"),
    (alfa.LoraConfig, {"dropout": 0.1}, r"unknown LoraConfig options: dropout; the options are alpha, layers,"),
    (alfa.AlfaConfig, {"head": 4}, r"unknown AlfaConfig options: head; .*did you mean 'heads'"),
    (alfa.LoraConfig, {"target": []}, "target is an empty list"),
    (alfa.LoraConfig, {"target": ["fc", ""]}, "target entries must be non-empty"),
    (alfa.LoraConfig, {"target": 3}, "target must be a regular expression"),
    (alfa.LoraConfig, {"target": "("}, "not a valid regular expression"),
    (alfa.LoraConfig, {"modules_to_save": "fc"}, "modules_to_save must be a list of module names"),
    (alfa.LoraConfig, {"modules_to_save": [".fc"]}, "modules_to_save entries"),
    (alfa.BitfitConfig, {"modules_to_save": ["fc"]}, "modules_to_save applies to methods that wrap layers"),
    (alfa.LoraConfig, {"layers": "some"}, "layers must be one of"),
]


@pytest.mark.parametrize(("cls", "options", "message"), INVALID)
def test_a_bad_option_fails_when_the_config_is_made(cls, options, message):
    with pytest.raises(ValueError, match=message):
        cls(**options)
    if not message.startswith("unknown"):
        with pytest.raises(ValueError, match=message):
            dataclasses.replace(cls(), **options)


def test_an_unknown_option_is_also_the_type_error_it_used_to_be():
    with pytest.raises(TypeError, match="unknown"):
        alfa.DoraConfig(rnak=4)
    assert issubclass(ConfigError, ValueError) and issubclass(ConfigError, TypeError)
    with pytest.raises(ValueError, match="unknown LoraConfig options"):
        alfa.adapters.config_from_dict("lora", {"rank": 2, "dropout": 0.0})


# ----------------------------------------------------------------------------------------------------------------
# The one-line parameter count


def test_print_trainable_parameters_counts_what_trains(capsys):
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    assert alfa.trainable_parameters_line(model) == "trainable params: 58 || all params: 58 || trainable%: 100.0000"
    alfa.attach(model, alfa.LoraConfig(rank=2, target=["2"]))  # A: 2×8, B: 2×2
    line = alfa.print_trainable_parameters(model)
    assert capsys.readouterr().out == line + "\n"
    assert line == "trainable params: 20 || all params: 78 || trainable%: 25.6410"
    big = nn.Sequential(nn.Linear(1000, 1000))
    alfa.attach(big, alfa.LoraConfig(rank=1, layers="dense"))
    assert alfa.trainable_parameters_line(big).startswith("trainable params: 2,000 || all params: 1,003,000 ||")


# ----------------------------------------------------------------------------------------------------------------
# param_groups: weight decay is explicit


def test_param_groups_writes_its_weight_decay_into_every_group(base):
    alfa.attach(base, _alfa())
    scale = {r"^layer[34]\.": 10.0}
    groups = alfa.param_groups(base, 1e-3, lr_scale=scale)
    assert [g["name"] for g in groups] == ["default", r"^layer[34]\."]
    assert all(g["weight_decay"] == 0.0 for g in groups)  # the documented default, as it always was
    opt = torch.optim.AdamW(groups)  # overrides AdamW's own 0.01
    assert [g["weight_decay"] for g in opt.param_groups] == [0.0, 0.0]
    assert [g["lr"] for g in opt.param_groups] == [1e-3, 1e-2]
    groups = alfa.param_groups(base, 1e-3, lr_scale=scale, weight_decay=0.05)
    assert all(g["weight_decay"] == 0.05 for g in groups)
    groups = alfa.param_groups(base, 1e-3, lr_scale=scale, weight_decay=None)  # leave it to the optimizer
    assert all("weight_decay" not in g for g in groups)
    assert [g["weight_decay"] for g in torch.optim.AdamW(groups, weight_decay=0.02).param_groups] == [0.02, 0.02]
    with pytest.raises(ValueError, match="weight_decay must be a non-negative"):
        alfa.param_groups(base, 1e-3, weight_decay=-1.0)
    with pytest.raises(ValueError, match="lr must be a positive, finite number"):
        alfa.param_groups(base, 0.0)


# ----------------------------------------------------------------------------------------------------------------
# Named adapters


def test_switching_gives_each_adapter_its_own_outputs(base, two, x):
    assert alfa.adapter_names(two) == ["ann", "bob"] and alfa.active_adapter(two) == "bob"
    ref = {"ann": _single(base, two, "ann", _alfa()), "bob": _single(base, two, "bob", _lora())}
    want = {name: m(x) for name, m in ref.items()}
    assert not torch.allclose(want["ann"], want["bob"])
    for name in ["bob", "ann", "bob", "ann"]:
        alfa.set_adapter(two, name)
        assert alfa.active_adapter(two) == name
        assert sorted(adapted_layers(two)) == sorted(adapted_layers(ref[name]))
        assert torch.allclose(two(x), want[name], rtol=0, atol=1e-6)
        assert set(alfa.adapter_parameters(two)) == set(alfa.adapter_parameters(ref[name]))
    with pytest.raises(ValueError, match=r"no adapter named 'cid'; the model has \['ann', 'bob'\]"):
        alfa.set_adapter(two, "cid")


def test_a_parked_adapter_follows_the_model_mode(two):
    two.train()
    alfa.set_adapter(two, "ann")
    two.eval()
    alfa.set_adapter(two, "bob")
    assert not any(m.training for m in two.modules())


def test_disable_adapters_runs_the_base_exactly_and_restores_them(base, two, x):
    want_base, want = base(x), two(x)
    with alfa.disable_adapters(two) as inner:
        assert inner is two
        assert torch.equal(two(x), want_base)
        assert not adapted_layers(two)
        with pytest.raises(RuntimeError, match="inside alfa.disable_adapters"):
            alfa.set_adapter(two, "ann")
        with pytest.raises(RuntimeError, match="inside alfa.disable_adapters"):
            alfa.merge(two)
        with pytest.raises(RuntimeError, match="cannot copy a model inside alfa.disable_adapters"):
            copy.deepcopy(two)  # the copy's adapter would stay parked, and every change to it refused, for good
        with pytest.raises(RuntimeError, match="cannot copy a model inside alfa.disable_adapters"):
            pickle.dumps(two)  # the same copy, made another way
    assert torch.equal(two(x), want) and torch.equal(copy.deepcopy(two)(x), want)
    with pytest.raises(KeyError):
        with alfa.disable_adapters(two):
            raise KeyError("boom")
    assert alfa.active_adapter(two) == "bob" and torch.equal(two(x), want)


def test_disable_adapters_on_a_model_scope_method(base, x):
    model = copy.deepcopy(base)
    alfa.attach(model, alfa.BitfitConfig())
    _randomize(model, 3)
    want = model(x)
    with alfa.disable_adapters(model):
        assert torch.equal(model(x), base(x))
    assert torch.equal(model(x), want)


def test_deleting_one_adapter_leaves_the_other_unchanged(base, two, x):
    alfa.set_adapter(two, "ann")
    want_ann = two(x)
    alfa.set_adapter(two, "bob")
    want_bob = two(x)
    assert alfa.delete_adapter(two, "ann") == ["bob"]  # an inactive one
    assert torch.equal(two(x), want_bob)
    alfa.attach(two, _alfa(), name="cid")
    assert alfa.delete_adapter(two, "cid") == ["bob"]  # the active one: the first left becomes active
    assert alfa.active_adapter(two) == "bob" and torch.equal(two(x), want_bob)
    with pytest.raises(ValueError, match="no adapter named 'ann'"):
        alfa.delete_adapter(two, "ann")
    assert alfa.delete_adapter(two, "bob") == []  # the last one: the base, bit for bit
    assert alfa.adapter_state(two) is None and alfa.adapter_names(two) == []
    assert torch.equal(two(x), base(x))
    assert all(torch.equal(a, b) for a, b in zip(two.state_dict().values(), base.state_dict().values()))
    assert [p.requires_grad for p in two.parameters()] == [p.requires_grad for p in base.parameters()]
    assert not torch.equal(want_ann, want_bob)


def test_detach_removes_every_adapter_and_restores_the_base(base, two, x):
    assert alfa.detach(two) == alfa.attach(copy.deepcopy(base), _lora())  # the active adapter's targets
    assert alfa.adapter_names(two) == [] and torch.equal(two(x), base(x))
    assert list(two.state_dict()) == list(base.state_dict())


def test_what_several_adapters_refuse(base, two):
    with pytest.raises(RuntimeError, match="already has an adapter named 'ann' \\(method 'alfa'\\)"):
        alfa.attach(two, _alfa(), name="ann")
    with pytest.raises(ValueError, match="bitfit trains the model's own parameters in place"):
        alfa.attach(two, alfa.BitfitConfig(), name="bits")
    full = copy.deepcopy(base)
    alfa.attach(full, alfa.FullFinetuneConfig())
    with pytest.raises(ValueError, match="full trains the model's own parameters in place"):
        alfa.attach(full, _lora(), name="other")
    with pytest.raises(MergeError, match=r"also has the adapter\(s\) \['ann'\].*delete_adapter"):
        alfa.merge(two, extend=True)
    assert alfa.adapter_names(two) == ["ann", "bob"] and alfa.active_adapter(two) == "bob"
    with pytest.raises(ValueError, match="adapter name must be a non-empty string"):
        alfa.attach(two, _alfa(), name="")


def test_a_failed_attach_keeps_the_active_adapter(two, x):
    want = two(x)
    with pytest.raises(ValueError, match="no layer to adapt"):
        alfa.attach(two, alfa.LoraConfig(target=["nothing"]), name="cid")
    assert alfa.adapter_names(two) == ["ann", "bob"] and alfa.active_adapter(two) == "bob"
    assert torch.equal(two(x), want)


def test_merge_after_deleting_the_others(base, two, x):
    want = two(x)
    alfa.delete_adapter(two, "ann")
    alfa.merge(two, extend=True)
    assert alfa.adapter_state(two) is None
    assert torch.allclose(two(x), want, rtol=1e-5, atol=1e-6)


def test_several_adapters_save_and_load_by_name(base, two, x, tmp_path):
    outs = {}
    for name in ("ann", "bob"):
        alfa.set_adapter(two, name)
        outs[name] = two(x)
    alfa.set_adapter(two, "bob")
    alfa.save_adapter(two, tmp_path / "ann.safetensors", name="ann")  # not the active one: switched back after
    assert alfa.active_adapter(two) == "bob"
    alfa.save_adapter(two, tmp_path / "bob.safetensors")  # the active one
    assert alfa.read_adapter_metadata(tmp_path / "ann.safetensors")["name"] == "ann"
    fresh = copy.deepcopy(base)
    alfa.load_adapter(fresh, tmp_path / "ann.safetensors", name="ann")
    alfa.load_adapter(fresh, tmp_path / "bob.safetensors", name="bob")
    assert alfa.adapter_names(fresh) == ["ann", "bob"] and alfa.active_adapter(fresh) == "bob"
    for name in ("ann", "bob"):
        alfa.set_adapter(fresh, name)
        assert torch.allclose(fresh(x), outs[name], rtol=0, atol=1e-6)
    with pytest.raises(RuntimeError, match="named 'ann' \\(method 'alfa'\\); pass replace=True"):
        alfa.load_adapter(fresh, tmp_path / "bob.safetensors", name="ann")
    alfa.load_adapter(fresh, tmp_path / "bob.safetensors", name="ann", replace=True)  # only "ann" is replaced
    assert alfa.adapter_names(fresh) == ["bob", "ann"]
    for name in ("ann", "bob"):
        alfa.set_adapter(fresh, name)
        assert torch.allclose(fresh(x), outs["bob"], rtol=0, atol=1e-6)
    single = copy.deepcopy(base)  # an old caller: no name, the default one
    alfa.load_adapter(single, tmp_path / "ann.safetensors")
    assert alfa.adapter_names(single) == ["default"]


def test_a_failed_load_keeps_the_adapters(base, two, x, tmp_path):
    other = TinyGazeNet()
    alfa.truncate(other, rank=6)  # another base: same layers, other weights
    alfa.attach(other, _lora())
    alfa.save_adapter(other, tmp_path / "other.safetensors")
    alfa.set_adapter(two, "ann")
    want = two(x)
    with pytest.raises(alfa.AdapterFileError, match="different base model"):
        alfa.load_adapter(two, tmp_path / "other.safetensors", name="cid")
    assert alfa.adapter_names(two) == ["ann", "bob"] and alfa.active_adapter(two) == "ann"
    assert torch.equal(two(x), want)


# ----------------------------------------------------------------------------------------------------------------
# modules_to_save


def _with_head(base: nn.Module, name: str = "default", saved=("fc",), seed: int = 5) -> nn.Module:
    model = base if alfa.adapter_state(base) is not None else copy.deepcopy(base)
    alfa.attach(model, _lora(modules_to_save=list(saved)), name=name)
    _randomize(model, seed)
    return model


def test_modules_to_save_trains_a_copy_and_gradients_reach_exactly_the_adapter(base, x):
    model = copy.deepcopy(base)
    original = model.fc
    alfa.attach(model, _lora(modules_to_save=["fc"]))
    assert "fc" not in adapted_layers(model)  # trained in full, not adapted
    state = alfa.adapter_state(model)
    assert model.fc is state.saved["fc"] is not original and state.saved_originals["fc"] is original
    trainable = alfa.adapter_parameters(model)
    assert {"fc.weight", "fc.bias"} <= set(trainable)
    model(x).square().sum().backward()
    for n, p in model.named_parameters():
        assert (p.grad is not None) == (n in trainable), n
        assert p.requires_grad == (n in trainable), n
    assert {id(p) for g in alfa.param_groups(model, 1e-3) for p in g["params"]} == {id(p) for p in trainable.values()}
    torch.optim.SGD(trainable.values(), lr=0.1).step()
    assert not torch.equal(model.fc.weight, original.weight)
    assert torch.equal(original.weight, base.fc.weight)  # the base's head is untouched
    with alfa.disable_adapters(model):
        assert torch.equal(model(x), base(x))
    with pytest.raises(ValueError, match="no module named 'head'"):
        alfa.attach(copy.deepcopy(base), _lora(modules_to_save=["head"]))


def test_each_adapter_has_its_own_copy(base, x):
    model = _with_head(base, "ann", seed=6)
    _with_head(model, "bob", seed=7)
    heads = {}
    for name in ("ann", "bob"):
        alfa.set_adapter(model, name)
        heads[name] = model.fc
    assert heads["ann"] is not heads["bob"] and not torch.equal(heads["ann"].weight, heads["bob"].weight)
    alfa.detach(model)
    assert torch.equal(model.fc.weight, base.fc.weight) and torch.equal(model(x), base(x))


def test_modules_to_save_round_trip_through_files_and_merge(base, x, tmp_path):
    model = _with_head(base, saved=("fc", "bn1"))
    model.bn1.train()  # only the copy: the base's own BatchNorms must keep their statistics
    model(x)  # the bn1 copy's running statistics move: they are part of the adapter
    model.bn1.eval()
    want = model(x)
    path = alfa.save_adapter(model, tmp_path / "head.safetensors")
    with safe_open(str(path), framework="pt") as f:
        keys = set(f.keys())
    assert {"fc.weight", "fc.bias", "bn1.weight", "bn1.running_mean", "bn1.num_batches_tracked"} <= keys
    assert alfa.read_adapter_metadata(path)["modules_to_save"] == ["bn1", "fc"]
    fresh = copy.deepcopy(base)
    alfa.load_adapter(fresh, path)
    assert torch.allclose(fresh(x), want, rtol=0, atol=1e-6)
    with alfa.disable_adapters(fresh):
        assert torch.equal(fresh(x), base(x))
    trained_fc = model.fc
    alfa.merge(model, extend=True)
    assert alfa.adapter_state(model) is None and model.fc is trained_fc
    assert torch.allclose(model(x), want, rtol=1e-5, atol=1e-6)
    assert [p.requires_grad for p in model.parameters()] == [p.requires_grad for p in base.parameters()]
    alfa.detach(fresh)
    assert fresh.fc.weight.requires_grad and torch.equal(fresh(x), base(x))  # the original head is back


def test_modules_to_save_in_a_compact_file(base, x, tmp_path):
    model = copy.deepcopy(base)
    alfa.attach(model, alfa.AlfaConfig(heads=2, rank=2, modules_to_save=["fc"]))
    _randomize(model, 8)
    path = alfa.save_adapter(model, tmp_path / "compact.safetensors", compact=True)
    fresh = copy.deepcopy(base)
    alfa.load_adapter(fresh, path)
    assert alfa.adapter_state(fresh).config.method == "dictionary_mix"
    assert torch.allclose(fresh(x), model(x), rtol=1e-5, atol=1e-6)


def test_modules_to_save_excludes_its_layers_from_the_targets(base):
    dense = TinyGazeNet()
    got = alfa.attach(copy.deepcopy(dense), alfa.LoraConfig(rank=2, layers="dense", modules_to_save=["fc", "layer1"]))
    assert "fc" not in got and not any(re.match(r"layer1\.", n) for n in got) and "conv1" in got


SMALL = {"alfa": {"heads": 2, "rank": 2}, "linear_mix": {"rank": 2}, "spectral": {"rank": 2}, "flora": {"rank": 2}}


@pytest.mark.parametrize("method", [m for m, cls in alfa.METHODS.items() if cls.scope == "layer"])
def test_every_wrapper_method_works_as_one_of_several_named_adapters(method, base, x):
    cls = alfa.METHODS[method]
    if cls is alfa.TPGazeConfig:
        config = alfa.TPGazeConfig.for_model(base, IMAGE, target=["conv1", "layer1.0"])
    elif cls.family == "lora":
        config = cls(rank=2)
    else:
        config = cls(**SMALL.get(method, {}))
    model = copy.deepcopy(base)
    alfa.attach(model, config, name="m")
    _randomize(model, 9)
    alfa.attach(model, _lora(), name="other")
    _randomize(model, 10)
    want = _single(base, model, "m", config)(x)
    alfa.set_adapter(model, "m")
    assert torch.allclose(model(x), want, rtol=0, atol=1e-6)
    with alfa.disable_adapters(model):
        assert torch.equal(model(x), base(x))


def test_the_multi_user_model_refuses_an_adapter_with_modules_to_save():
    model = TinyGazeNet().eval()
    alfa.truncate(model, 6)
    served = alfa.MultiUserModel(copy.deepcopy(model))
    alfa.attach(model, alfa.AlfaConfig(heads=2, rank=2, modules_to_save=["fc"]))
    with pytest.raises(ValueError, match=r"trains whole modules \(fc; modules_to_save\)"):
        served.add_user("ann", model)


def test_a_parked_adapter_follows_the_models_dtype_when_it_comes_back():
    model = nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3))
    alfa.attach(model, alfa.LoraConfig(rank=2), name="ann")
    alfa.attach(model, alfa.LoraConfig(rank=2), name="bob")  # ann is parked
    model.to(torch.float64)
    alfa.set_adapter(model, "ann")
    assert {p.dtype for p in model.parameters()} == {torch.float64}
    assert model(torch.randn(2, 6, dtype=torch.float64)).dtype == torch.float64
