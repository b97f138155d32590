"""The adapter contract, over every registered method: the merge kind each adapted layer declares,
``merge_form`` against what ``merge`` really builds, validation when a config is written, and the
compact (``d×d`` mix) storage that only dictionary adapters have."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from adapter_settings import IMAGE, small_config
from torch import nn

import alfa
from alfa.adapters import (
    MERGE_FORMS,
    MERGE_KINDS,
    METHODS,
    AdaptedLayer,
    DictionaryAdapter,
    MergeError,
    adapted_layers,
    config_from_dict,
    has_compact_form,
    merge_form,
)
from alfa.adapters.state import adapter_tensors
from alfa.layers import is_factorized


def _randomized(model: nn.Module) -> nn.Module:
    with torch.no_grad():
        for p in alfa.adapter_parameters(model).values():
            p.add_(torch.randn_like(p) * 0.1)
    return model


@pytest.fixture
def x() -> torch.Tensor:
    return torch.randn(2, 3, IMAGE, IMAGE)


# ----------------------------------------------------------------------------------------------------------------
# Merge kinds and merge_form


@pytest.mark.parametrize("kind", ["truncated", "dense"])
@pytest.mark.parametrize("method", list(METHODS))
def test_merge_form_says_what_merge_builds(method, kind, small_net, x):
    if kind == "truncated":
        alfa.truncate(small_net, rank=6)
    model = copy.deepcopy(small_net)
    alfa.attach(model, small_config(method, model))
    _randomized(model)
    layers = adapted_layers(model)
    if METHODS[method].scope == "layer":
        kinds = {type(layer).merge_kind for layer in layers.values()}
        assert len(kinds) == 1 and kinds <= set(MERGE_KINDS)  # declared on the class, one per method
    else:
        assert not layers
    form = merge_form(model)
    assert form in MERGE_FORMS
    out = model(x).detach()
    bases = {name: type(layer.base) for name, layer in layers.items()}

    if form == "not mergeable (kept attached)":
        for options in ({}, {"densify": True}, {"extend": True}):
            with pytest.raises(MergeError):
                alfa.merge(model, **options)
        assert alfa.adapter_state(model) is not None
        return
    if form == "densified":
        with pytest.raises(MergeError, match="densify=True"):
            alfa.merge(model)
    alfa.merge(model, densify=form == "densified")
    assert alfa.adapter_state(model) is None
    assert torch.allclose(model(x), out, rtol=1e-4, atol=1e-5)
    merged = {name: model.get_submodule(name) for name in bases}
    if form == "in place":
        assert not bases
    elif form == "densified":
        assert any(is_factorized(small_net.get_submodule(n)) for n in merged)
        assert not any(is_factorized(m) for m in merged.values())
    elif form == "factorized (rank d)":
        for name, m in merged.items():  # every layer keeps its structure and rank
            base = small_net.get_submodule(name)
            assert type(m) is bases[name]
            if is_factorized(base):
                assert m.rank == base.rank
    else:
        assert form == "dense" and not any(is_factorized(m) for m in merged.values())


def test_merge_refuses_densify_and_extend_together_and_changes_nothing(small_net):
    alfa.attach(small_net, alfa.LoraConfig(rank=2))
    before = {k: v.clone() for k, v in small_net.state_dict().items()}
    with pytest.raises(ValueError, match="not both"):
        alfa.merge(small_net, densify=True, extend=True)
    assert alfa.adapter_state(small_net) is not None
    assert all(torch.equal(before[k], v) for k, v in small_net.state_dict().items())


def test_merge_form_needs_an_adapter(small_net):
    with pytest.raises(RuntimeError, match="no adapter attached"):
        merge_form(small_net)


def test_a_layer_class_must_declare_a_known_merge_kind(small_net):
    with pytest.raises(TypeError, match="merge_kind must be one of"):

        class Wrong(AdaptedLayer):
            merge_kind = "sometimes"  # type: ignore[assignment]

    class Undeclared(AdaptedLayer):
        pass

    with pytest.raises(TypeError, match="must declare merge_kind"):
        Undeclared(small_net.fc1, alfa.AlfaConfig())


# ----------------------------------------------------------------------------------------------------------------
# Validation when a config is written

INVALID = [
    ("alfa", {"heads": 0}, "heads and rank must be positive"),
    ("alfa", {"rank": -1}, "heads and rank must be positive"),
    ("alfa", {"init_std": -0.1}, "init_std must be non-negative"),
    ("alfa", {"dense_rank": 0}, "dense_rank must be a positive integer or None"),
    ("alfa", {"heads": 2.5}, "must be an integer"),
    ("diag_gate", {"dense_rank": 0}, "dense_rank must be a positive integer"),
    ("linear_mix", {"rank": 0}, "rank must be positive"),
    ("linear_mix", {"init_std": -1.0}, "init_std must be non-negative"),
    ("linear_mix", {"dense_rank": -3}, "dense_rank must be a positive integer"),
    ("spectral", {"rank": 0}, "rank must be positive"),
    ("lora", {"rank": 0}, "rank must be positive"),
    ("lora", {"alpha": 0.0}, "alpha must be positive"),
    ("pissa", {"rank": 0}, "rank must be positive"),
    ("milora", {"alpha": -1.0}, "alpha must be positive"),
    ("moslora", {"rank": 0}, "rank must be positive"),
    ("dora", {"alpha": 0.0}, "alpha must be positive"),
    ("flora", {"rank": 0}, "rank must be positive"),
    ("flora", {"kernel_rank": 0}, "kernel_rank must be a positive integer"),
    ("flora", {"scale": 0.0}, "scale must be positive"),
    ("tpgaze", {"image_size": 0}, "image_size must be positive"),
    ("tpgaze", {"init_std": -1.0}, "init_std must be non-negative"),
    ("tpgaze", {"input_sizes": {"3->4 k3x3 s1x1 p1x1 d1x1": [10]}}, r"must be \[height, width\]"),
]


@pytest.mark.parametrize(("method", "options", "message"), INVALID)
def test_an_invalid_option_fails_at_construction(method, options, message):
    cls = METHODS[method]
    with pytest.raises(ValueError, match=message):
        cls(**options)
    with pytest.raises(ValueError, match=message):  # replace and from_dict go through __init__
        dataclasses.replace(cls(), **options)
    with pytest.raises(ValueError, match=message):
        config_from_dict(method, {**cls().to_dict(), **options})


@pytest.mark.parametrize("method", list(METHODS))
@pytest.mark.parametrize(
    ("options", "message"),
    [({"layers": "sideways"}, "layers must be one of"), ({"target": "["}, "not a valid regular expression")],
)
def test_every_method_checks_the_shared_options_at_construction(method, options, message):
    with pytest.raises(ValueError, match=message):
        METHODS[method](**options)


@pytest.mark.parametrize("method", ["lora", "alfa"])
def test_an_unknown_option_is_a_config_error_however_the_config_is_made(method):
    """The constructor raised alfa.ConfigError (a ValueError and a TypeError), from_dict a plain ValueError."""
    from alfa.adapters import ConfigError

    cls = METHODS[method]
    for make in (lambda: cls(dropout=0.1), lambda: cls.from_dict({"dropout": 0.1})):
        with pytest.raises(ConfigError, match="dropout") as refused:
            make()
        assert isinstance(refused.value, TypeError)


def test_attach_still_validates_a_config_changed_after_construction(small_net):
    config = alfa.AlfaConfig()
    config.heads = 0
    with pytest.raises(ValueError, match="heads and rank must be positive"):
        alfa.attach(small_net, config)
    assert alfa.adapter_state(small_net) is None


def test_every_default_config_is_valid():
    for cls in METHODS.values():
        cls().validate()


# ----------------------------------------------------------------------------------------------------------------
# Compact storage: the dictionary adapters' d×d mix


@pytest.mark.parametrize("method", list(METHODS))
def test_compact_files_exactly_for_the_dictionary_adapters(method, small_net, x, tmp_path):
    alfa.truncate(small_net, rank=6)
    model = copy.deepcopy(small_net)
    alfa.attach(model, small_config(method, model))
    _randomized(model)
    dictionary = METHODS[method].family == "dictionary"
    layers = adapted_layers(model).values()
    assert (
        has_compact_form(model)
        == dictionary
        == (bool(layers) and all(isinstance(m, DictionaryAdapter) for m in layers))
    )
    path = tmp_path / "compact.safetensors"
    if not dictionary:
        with pytest.raises(ValueError, match="have no compact form"):
            alfa.save_adapter(model, path, compact=True)
        assert not path.exists()
        return
    alfa.save_adapter(model, path, compact=True)
    assert alfa.read_adapter_metadata(path)["method"] == "dictionary_mix"
    fresh = copy.deepcopy(small_net)
    alfa.load_adapter(fresh, path)
    assert torch.allclose(fresh(x), model(x), rtol=1e-5, atol=1e-6)
    alfa.merge(fresh)
    alfa.merge(model)
    for (name, a), b in zip(fresh.named_parameters(), model.parameters()):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6), name


# ----------------------------------------------------------------------------------------------------------------
# Registries


def test_every_registered_config_is_exported_by_its_class_name():
    import alfa.adapters

    for cls in METHODS.values():
        for package in (alfa, alfa.adapters):
            assert getattr(package, cls.__name__) is cls
            assert cls.__name__ in package.__all__
        assert {"method", "display_name", "family", "scope"}.isdisjoint(f.name for f in dataclasses.fields(cls))


def test_every_registered_config_class_is_exported_by_name():
    # The packages list their exports explicitly: a new method's config must be added to both lists.
    import alfa.adapters as adapters

    assert set(adapters.CONFIG_CLASSES) == {cls.__name__ for cls in METHODS.values()}
    for name, cls in adapters.CONFIG_CLASSES.items():
        assert name in adapters.__all__ and getattr(adapters, name) is cls
        assert name in alfa.__all__ and getattr(alfa, name) is cls
    assert "unmerge" in adapters.__all__ and alfa.unmerge is adapters.unmerge


@pytest.mark.parametrize("kind", ["truncated", "dense"])
@pytest.mark.parametrize("method", list(METHODS))
def test_a_state_loaded_into_an_attached_model_gives_that_models_outputs_active_or_parked(method, kind, x):
    """Values a layer derives from its base (PiSSA's residual, Spectral's SVD, a dense base's dictionary) follow
    a ``load_state_dict`` that changes the base: they once stayed the old base's, and a strict load of a trained
    model's state gave other outputs without a word."""
    from conftest import SmallNet

    trained, other = SmallNet().eval(), SmallNet().eval()  # two bases of the same shapes, other values
    for net in (trained, other):
        if kind == "truncated":
            alfa.truncate(net, rank=6)
        alfa.attach(net, small_config(method, net))
    _randomized(trained)
    want = trained(x).detach()
    loaded = copy.deepcopy(other)
    loaded.load_state_dict(trained.state_dict())
    assert torch.equal(loaded(x), want)
    if METHODS[method].scope != "layer":
        return  # a model-scope adapter trains the model's own tensors: nothing derived, nothing parked apart
    # parked while the base changed: made active again, it computes with the new base
    parked = copy.deepcopy(other)
    alfa.attach(parked, small_config(method, parked), name="second")  # the same layers: the same state keys
    parked.load_state_dict(trained.state_dict())
    alfa.set_adapter(parked, "default")
    with torch.no_grad():
        for name, t in adapter_tensors(parked).items():
            t.copy_(adapter_tensors(trained)[name])
    assert torch.equal(parked(x), want)


@pytest.mark.parametrize("method", ["pissa", "spectral", "alfa"])
def test_a_layer_that_derives_from_its_base_attaches_to_a_base_without_values(method):
    """A model on the meta device (built to count costs) has no values to take signatures of: attach still works."""
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 2))
    config = METHODS[method](rank=2, **({"heads": 2} if method == "alfa" else {}))
    assert alfa.attach(model, config) == ["0", "1"]
    assert model(torch.empty(3, 8, device="meta")).shape == (3, 2)


def test_a_second_merge_says_the_adapter_is_merged_already(small_net):
    """Not "the model has no adapter attached (use alfa.attach first)", which sends the user the wrong way."""
    alfa.truncate(small_net, 4)
    alfa.attach(small_net, alfa.AlfaConfig(heads=1, rank=2))
    alfa.merge(small_net)
    with pytest.raises(RuntimeError, match=r"cannot merge: the model's adapter is merged already \(alfa.unmerge"):
        alfa.merge(small_net)
    alfa.unmerge(small_net)
    alfa.merge(small_net)  # the one merge to undo is the first's, as before


def test_a_layer_that_cannot_be_adapted_is_named_with_its_article():
    """ "it names 0, a Embedding" read as a slip; the article follows the class name."""
    with pytest.raises(ValueError, match=r"it names 0, an Embedding, which cannot be adapted"):
        alfa.attach(nn.Sequential(nn.Embedding(10, 4)), alfa.LoraConfig(rank=2, target=["0"]))


def test_a_layer_too_small_for_the_rank_says_target_can_leave_it_out(tmp_path):
    """PiSSA at rank 8 on a 3-output head fails the whole attach: the message names the layer and the way out."""
    model = nn.Sequential(nn.Linear(32, 32), nn.Linear(32, 3))
    with pytest.raises(ValueError, match=r"^1: pissa rank 8 is too large .* \(target= can leave it out"):
        alfa.attach(model, alfa.PissaConfig(rank=8))
    with pytest.raises(ValueError, match=r"method 'qlora' is no adapter method; the methods: alfa, "):
        alfa.load_adapter(model, tmp_path / "any.safetensors", method="qlora")


def test_a_rank_no_layer_can_hold_says_so_once_without_a_way_out_that_fails_too():
    """PiSSA at d on a model truncated at d everywhere said "target= can leave it out" of the first layer, though
    every other layer fails alike, and chained a second traceback."""
    model = nn.Sequential(nn.Linear(32, 32), nn.Linear(32, 32))
    alfa.truncate(model, 8)
    with pytest.raises(ValueError, match=r"^every layer it adapts \(the first, 0\): pissa rank 8 is too large") as e:
        alfa.attach(model, alfa.PissaConfig(rank=8))
    assert "target=" not in str(e.value) and e.value.__cause__ is None and e.value.__suppress_context__


@pytest.mark.parametrize(
    "layer, config",
    [(nn.Linear(16, 16), alfa.LoraConfig(rank=2)), (nn.Conv2d(3, 8, 3), alfa.AlfaConfig(rank=2, heads=1))],
)
def test_a_model_that_is_one_bare_layer_is_refused_and_left_as_it_was(layer, config):
    """alfa.truncate(nn.Linear) said "truncated 1 layers" and added an unused child named ""; attach made the
    layer its own child (printing it then recursed without end) and froze its parameters."""
    before = {k: v.clone() for k, v in layer.state_dict().items()}
    for act in (lambda: alfa.truncate(layer, 2), lambda: alfa.attach(layer, config)):
        with pytest.raises(ValueError, match=r"^the model is itself the layer to replace \(a bare .*nn.Sequential"):
            act()
        assert list(layer.children()) == [] and all(p.requires_grad for p in layer.parameters())
        assert layer.state_dict().keys() == before.keys()
        assert all(torch.equal(v, before[k]) for k, v in layer.state_dict().items())
    alfa.attach(nn.Sequential(layer), config)  # held in a module, it is adapted
