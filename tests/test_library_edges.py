"""Models a library user brings that are not the plain case: a layer subclass that computes its own way, a
``torch.compile`` wrapper, lazy layers, a misspelt parameter target, a damaged backbone file. Each is either
handled exactly or refused with one error naming the problem; nothing is silently computed another way."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import alfa
from alfa.checkpoint import CheckpointError, load_backbone
from alfa.layers import own_forward


class ScaledLinear(nn.Linear):
    """A Linear whose output is doubled: not the plain product alfa factorizes and merges into."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) * 2.0


class ShiftedConv(nn.Conv2d):
    """A conv that changes its computation through ``_conv_forward`` only (Conv2d's forward calls it)."""

    def _conv_forward(self, x, weight, bias):
        return super()._conv_forward(x, weight, bias) + 1.0


class PlainLinearSubclass(nn.Linear):
    """A subclass that adds nothing to the computation (as PyTorch's attention out_proj): adapted as usual."""


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(ScaledLinear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), PlainLinearSubclass(64, 64))


def test_own_forward_names_subclasses_that_compute_their_own_way():
    assert own_forward(ScaledLinear(4, 4)) == "ScaledLinear"
    assert own_forward(ShiftedConv(2, 2, 3)) == "ShiftedConv"
    assert own_forward(PlainLinearSubclass(4, 4)) is None
    assert own_forward(nn.MultiheadAttention(8, 2).out_proj) is None
    assert own_forward(nn.Linear(4, 4)) is None and own_forward(nn.Conv2d(2, 2, 3)) is None


def test_truncate_leaves_a_subclass_with_its_own_forward_dense_and_says_why():
    net = _net()
    report = alfa.truncate(net, rank=8)
    assert type(net[0]) is ScaledLinear
    assert "ScaledLinear has a forward of its own" in report.left_dense["0"]
    assert set(report.factorized) == {"2", "4"}  # the plain subclass is factorized


@pytest.mark.parametrize("config", [alfa.AlfaConfig(heads=2, rank=2), alfa.LoraConfig(rank=2)])
def test_attach_leaves_such_a_layer_out_with_a_warning_and_the_outputs_stay_exact(config):
    net = _net().eval()
    x = torch.randn(2, 500, 64)  # many positions: Alfa's dense path would build the weight and run it plainly
    reference = net(x)
    model = copy.deepcopy(net)
    with pytest.warns(
        UserWarning, match=r"leaves out 1 layer\(s\) whose class has a forward of its own.*0 \(ScaledLinear\)"
    ):
        adapted = alfa.attach(model, config)
    assert adapted == ["2", "4"]
    torch.testing.assert_close(model(x), reference, rtol=0, atol=0)
    alfa.merge(model)
    assert type(model[0]) is ScaledLinear
    torch.testing.assert_close(model(x), reference, rtol=1e-6, atol=1e-6)


def test_a_target_naming_such_a_layer_is_refused_saying_why():
    with pytest.raises(
        ValueError, match=r"target '0' selects no layer: 0 is a ScaledLinear, whose class has a forward of its own"
    ):
        alfa.attach(_net(), alfa.LoraConfig(rank=2, target=["0", "2"]))
    conv = nn.Sequential(ShiftedConv(3, 8, 3), nn.Conv2d(8, 8, 3))
    with pytest.raises(ValueError, match=r"it names 0, a ShiftedConv, whose class has a forward of its own"):
        alfa.attach(conv, alfa.LoraConfig(rank=2, target=r"^0$"))


@pytest.mark.parametrize(
    ("config", "entry", "why"),
    [
        (alfa.FullFinetuneConfig(target=["2.weight", "2.wieght"]), "2.wieght", "the model has no parameter named"),
        (alfa.BitfitConfig(target=["bias", "no_such"]), "no_such", "the model has no parameter named"),
        (alfa.BitfitConfig(target=["bias", "0.weight"]), "0.weight", "names 0.weight, which bitfit does not train"),
    ],
)
def test_a_parameter_target_entry_that_selects_nothing_is_refused_by_name(config, entry, why):
    model = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8), nn.Linear(8, 2))
    with pytest.raises(ValueError, match=rf"{config.method}: target '{entry}' selects no parameter: {why}"):
        alfa.attach(model, config)
    assert alfa.adapter_names(model) == []  # nothing attached
    assert alfa.attach(model, alfa.BitfitConfig(target=["bias", "1.weight"])) == [
        "0.bias",
        "1.weight",
        "1.bias",
        "2.bias",
    ]


def test_a_torch_compile_wrapper_is_refused_naming_the_model_it_wraps(tmp_path):
    base = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 16)).eval()
    compiled = torch.compile(copy.deepcopy(base))
    path = tmp_path / "user.safetensors"
    calls = {
        "attach": lambda: alfa.attach(compiled, alfa.LoraConfig(rank=2)),
        "truncate": lambda: alfa.truncate(compiled, 4),
        "load_adapter": lambda: alfa.load_adapter(compiled, path),
        "save_adapter": lambda: alfa.save_adapter(compiled, path),
    }
    for function, call in calls.items():
        with pytest.raises(
            TypeError, match=rf"^alfa\.{function}: the model is a torch.compile wrapper.*model\._orig_mod"
        ):
            call()
    assert not path.exists()
    alfa.attach(compiled._orig_mod, alfa.LoraConfig(rank=2))  # the way the error points: the file fits the plain model
    alfa.save_adapter(compiled._orig_mod, path)
    assert alfa.load_adapter(copy.deepcopy(base), path) == ["0", "2"]


def test_lazy_layers_not_yet_initialized_are_named():
    model = nn.Sequential(nn.LazyLinear(32), nn.ReLU(), nn.Linear(32, 32), nn.Linear(32, 32))
    report = alfa.truncate(model, rank=4)
    assert report.left_dense["0"] == "a lazy layer not yet initialized: run a forward pass first"
    lazy = nn.Sequential(nn.LazyLinear(32), nn.ReLU(), nn.Linear(32, 32))
    with pytest.raises(ValueError, match=r"^alfa.attach: the model's lazy layers are not initialized yet \(0.weight\)"):
        alfa.attach(lazy, alfa.LoraConfig(rank=2))
    lazy(torch.randn(2, 5))
    assert alfa.attach(lazy, alfa.LoraConfig(rank=2)) == ["0", "2"]


def test_save_adapter_refuses_an_about_that_is_not_json_before_writing(tmp_path):
    model = nn.Sequential(nn.Linear(8, 8))
    alfa.attach(model, alfa.LoraConfig(rank=2))
    path = tmp_path / "user.safetensors"
    with pytest.raises(TypeError, match=r"^save_adapter: about must hold JSON values only .*Tensor"):
        alfa.save_adapter(model, path, about={"step": torch.tensor(3)})
    assert not path.exists()


@pytest.mark.parametrize("content", [b"\xff" * 100, None], ids=["damaged", "missing"])
def test_load_backbone_names_a_damaged_or_missing_file(tmp_path, content):
    path = tmp_path / "backbone.safetensors"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(CheckpointError, match=rf"^{path}: not a readable safetensors file"):
        load_backbone(nn.Sequential(nn.Linear(4, 4)), path)


def test_a_subclass_that_only_restates_the_product_is_adapted_as_a_plain_layer():
    """transformers' FalconLinear overrides forward with exactly ``x @ W.T + b``: every projection of a Falcon model
    is one, and a rule on the class alone left the whole model out."""
    transformers = pytest.importorskip("transformers")
    config = transformers.FalconConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, new_decoder_architecture=False
    )
    torch.manual_seed(0)
    model = transformers.FalconForCausalLM(config).eval()
    tokens = torch.randint(0, 64, (1, 8))
    reference = model(tokens).logits
    projections = ["query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"]
    assert all(own_forward(m) is None for n, m in model.named_modules() if n.split(".")[-1] in projections)
    adapted = copy.deepcopy(model)
    with pytest.warns(UserWarning, match="tied"):  # lm_head, tied to the embedding: left out, as ever
        names = alfa.attach(adapted, alfa.LoraConfig(rank=2, layers="dense"))
    assert [n.split(".")[-1] for n in names] == projections
    torch.testing.assert_close(adapted(tokens).logits, reference, rtol=0, atol=0)
    assert len(alfa.truncate(model, rank=4).factorized) == 4


def test_a_model_whose_only_layers_compute_their_own_way_is_told_so():
    model = nn.Sequential(ScaledLinear(8, 8), nn.ReLU(), ScaledLinear(8, 8))
    with pytest.raises(
        ValueError, match=r"classes have a forward of their own.*: 0 \(ScaledLinear\), 2 \(ScaledLinear\)"
    ):
        alfa.attach(model, alfa.LoraConfig(rank=2))
