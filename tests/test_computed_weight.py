"""The ``weight`` of a factorized or adapted layer is computed on each read: a write into it, or an assignment, would
change nothing the layer computes, so it is refused with one message; reading it keeps working."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from torch import nn

import alfa

# alfa.layers.ReadOnlyWeightError is both: a refused in-place write is a RuntimeError, a refused assignment an
# AttributeError. Caught as those (and its class checked by name), so these tests also run, and fail, without it.
REFUSED = (RuntimeError, AttributeError)


def _truncated():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64)).eval()
    alfa.truncate(model, 8)
    return model


def _truncated_conv():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(8, 16, 3), nn.ReLU(), nn.Conv2d(16, 16, 3)).eval()
    alfa.truncate(model, 4)
    return model


def _adapted(dense: bool = False):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64)).eval() if dense else _truncated()
    torch.manual_seed(1)
    alfa.attach(model, alfa.LoraConfig(rank=2))
    with torch.no_grad():
        for p in alfa.adapter_parameters(model).values():
            p.normal_(0, 0.1)
    return model


def _in_place_writes():
    def no_grad(f):
        def run(w):
            with torch.no_grad():
                f(w)

        return run

    def add_in_place(w):
        w += 1

    def set_data(w):
        w.data = torch.zeros_like(w)

    return {
        "nn.init.zeros_": nn.init.zeros_,
        "nn.init.normal_": nn.init.normal_,
        "nn.init.xavier_uniform_": nn.init.xavier_uniform_,
        "mul_ under no_grad": no_grad(lambda w: w.mul_(0)),
        "copy_": no_grad(lambda w: w.copy_(torch.zeros_like(w))),
        "+=": no_grad(add_in_place),
        "item assignment": no_grad(lambda w: w.__setitem__(0, 1.0)),
        ".data.normal_": lambda w: w.data.normal_(),
        "a view's fill_": no_grad(lambda w: w.T[0].fill_(0)),
        "out=": no_grad(lambda w: torch.add(torch.ones_like(w), 1, out=w.data)),
        ".data =": set_data,
    }


LAYERS = {  # name -> (model builder, layer index, input, the words naming what to write instead)
    "factorized linear": (_truncated, 2, lambda: torch.randn(3, 16), "layer.U, layer.V"),
    "factorized conv": (_truncated_conv, 2, lambda: torch.randn(2, 8, 7, 7), "layer.U, layer.V"),
    "adapted factorized": (_adapted, 2, lambda: torch.randn(3, 16), "alfa.merge(model)"),
    "adapted dense": (lambda: _adapted(dense=True), 2, lambda: torch.randn(3, 16), "alfa.merge(model)"),
}


@pytest.mark.parametrize("write", list(_in_place_writes()))
@pytest.mark.parametrize("kind", list(LAYERS))
def test_a_write_into_a_computed_weight_is_refused_and_changes_nothing(kind, write):
    build, index, make_input, instead = LAYERS[kind]
    model = build()
    layer = model[index]
    state = copy.deepcopy(model.state_dict())
    with pytest.raises(REFUSED, match="computed") as refused:
        _in_place_writes()[write](layer.weight)
    assert type(refused.value).__name__ == "ReadOnlyWeightError"
    message = str(refused.value)
    assert type(layer).__name__ in message and instead in message and "would change nothing" in message
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())
    x = make_input()  # the refusal is the whole story: the outputs are what they were
    assert torch.equal(model(x), build()(x))


@pytest.mark.parametrize("kind", list(LAYERS))
def test_assigning_a_computed_weight_is_refused_with_the_same_message(kind):
    build, index, _, instead = LAYERS[kind]
    layer = build()[index]
    shape = tuple(layer.weight.shape)
    for value in (nn.Parameter(torch.zeros(shape)), torch.zeros(shape)):
        with pytest.raises(REFUSED, match="assigning it would change nothing") as refused:
            layer.weight = value
        assert instead in str(refused.value)
        assert isinstance(refused.value, AttributeError)  # what assigning a read-only attribute raises
        assert type(refused.value).__name__ == "ReadOnlyWeightError"


@pytest.mark.parametrize("kind", list(LAYERS))
def test_reading_a_computed_weight_keeps_working(kind):
    build, index, _, _ = LAYERS[kind]
    layer = build()[index]
    w = layer.weight
    assert w.shape == w.detach().clone().shape and w.dtype == torch.float32 and w.device.type == "cpu"
    copied = w.detach().clone()
    assert type(copied) is torch.Tensor
    copied.zero_()  # a copy is the caller's own tensor
    assert not torch.equal(layer.weight, copied)
    flat = w.reshape(w.shape[0], -1)
    product = flat @ torch.ones(flat.shape[1], 2)
    assert type(product) is torch.Tensor and product.shape == (w.shape[0], 2)
    restored = pickle.loads(pickle.dumps(w.detach()))
    assert type(restored) is torch.Tensor and torch.equal(restored, w)
    dense = nn.Linear(1, 1)  # a computed weight copied into another layer's own weight is only read
    dense.weight = nn.Parameter(torch.empty(w.shape))
    with torch.no_grad():
        dense.weight.copy_(w)
    assert torch.equal(dense.weight, w)


def test_gradients_flow_through_a_computed_weight():
    model = _adapted()
    x = torch.randn(3, 16)
    h = torch.relu(model[0](x))
    loss = (h @ model[2].weight.T).square().sum()  # model code computing with the adapted layer's .weight
    grads = torch.autograd.grad(loss, list(alfa.adapter_parameters(model).values()))
    assert all(g is not None and g.abs().sum() > 0 for g in grads)


def test_compile_and_export_see_a_plain_weight():
    class ReadsWeight(nn.Module):  # as nn.MultiheadAttention does with its out_proj
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(16, 16)

        def forward(self, x):
            return nn.functional.linear(x, self.proj.weight, self.proj.bias) + self.proj(x)

    torch.manual_seed(0)
    model = ReadsWeight().eval()
    alfa.truncate(model, 4)
    alfa.attach(model, alfa.LoraConfig(rank=2))
    x = torch.randn(3, 16)
    expected = model(x)
    assert torch.allclose(torch.compile(model, backend="eager")(x), expected, atol=1e-6)
    assert torch.allclose(torch.export.export(model, (x,)).module()(x), expected, atol=1e-6)
    assert torch.allclose(torch.jit.trace(model, (x,))(x), expected, atol=1e-6)


@pytest.mark.parametrize("layer_name", list(LAYERS))
def test_detach_gives_a_tensor_of_ones_own_that_a_parameter_is_made_of(layer_name):
    """``nn.Parameter(layer.weight.detach())`` (copying a layer's values into a new one) must stay a leaf a dense
    layer takes and an optimizer trains; a read-only alias of it was neither (the review's second finding)."""
    build, index, make_input, _ = LAYERS[layer_name]
    layer = build()[index]
    made = nn.Parameter(layer.weight.detach())
    assert made.is_leaf and type(made) is nn.Parameter
    torch.optim.SGD([made], lr=0.1)  # refuses a non-leaf
    # .data stays read-only (`layer.weight.data.normal_()` is transformers' init): torch refuses a Parameter of it
    with pytest.raises(RuntimeError, match="detach"):
        nn.Parameter(layer.weight.data)
    w = layer.weight.detach()
    assert type(w) is torch.Tensor
    w.requires_grad_()
    (w * 2).sum().backward()
    assert w.grad is not None and torch.equal(w.grad, torch.full_like(w, 2.0))


def test_a_prompt_adapters_weight_is_named_the_bases_not_a_computed_one():
    """A prompt adapter leaves the weight as it is (for a dense base, the base's own storage): the refusal must not
    say it is computed, that a write would change nothing, or that a merge helps (prompts cannot be merged)."""
    from tiny_models import TinyGazeNet

    from alfa.adapters.prompt import TPGazeConfig
    from alfa.layers import ReadOnlyWeightError

    model = TinyGazeNet()
    alfa.attach(model, TPGazeConfig.for_model(model, 16, target=r"^conv1$"))
    with pytest.raises(ReadOnlyWeightError) as caught, torch.no_grad():
        model.conv1.weight.mul_(0)
    message = str(caught.value)
    assert "is the base layer's weight" in message and "cannot be merged" in message
    assert "computed" not in message and "change nothing" not in message and "alfa.merge" not in message
