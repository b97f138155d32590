"""LoRA and DoRA on dense layers against Hugging Face PEFT (a test-only oracle) with the same weights.

PEFT's conv LoRA builds its ``A`` conv without the base layer's dilation, so the oracle convs here
are undilated; our ``A`` does use the dilation (tested against the dense formula in test_baselines).
"""

import copy

import pytest
import torch
from torch import nn

import alfa
from alfa.adapters.dora import DoraConfig
from alfa.adapters.lora import LoraConfig

RANK, ALPHA = 4, 12.0


class Holder(nn.Module):
    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)


def _layers():
    torch.manual_seed(0)
    return [
        (nn.Linear(20, 12), torch.randn(5, 20)),
        (nn.Conv2d(6, 10, 3, stride=2, padding=1), torch.randn(2, 6, 9, 9)),
        (nn.Conv2d(6, 10, (3, 1), padding=(1, 0), bias=False), torch.randn(2, 6, 7, 7)),
    ]


def _pair(layer: nn.Module, use_dora: bool):
    """Our adapter and PEFT's on copies of ``layer``, with PEFT's random (non-zero) weights copied into ours. PEFT
    is imported here, not when the module is collected: its import (seconds) is then paid only by a worker process
    that runs these tests."""
    peft = pytest.importorskip("peft")
    theirs = peft.get_peft_model(
        Holder(copy.deepcopy(layer)),
        peft.LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules=["layer"], init_lora_weights=False, use_dora=use_dora),
    )
    ours = Holder(copy.deepcopy(layer))
    alfa.attach(ours, (DoraConfig if use_dora else LoraConfig)(rank=RANK, alpha=ALPHA))
    p, o = theirs.base_model.model.layer, ours.layer
    with torch.no_grad():
        o.A.copy_(p.lora_A["default"].weight.reshape(RANK, -1))
        o.B.copy_(p.lora_B["default"].weight.reshape(-1, RANK))
        if use_dora:
            mag = p.lora_magnitude_vector["default"].weight
            mag.mul_(torch.linspace(0.5, 1.5, mag.numel()).reshape(mag.shape))  # away from its init
            o.magnitude.copy_(mag.reshape(-1))
    return ours, theirs


@pytest.mark.parametrize("use_dora", [False, True], ids=["lora", "dora"])
@pytest.mark.parametrize("index", [0, 1, 2], ids=["linear", "conv", "conv-nobias"])
def test_outputs_and_gradients_match_peft(index, use_dora):
    layer, x = _layers()[index]
    ours, theirs = _pair(layer, use_dora)
    xo, xt = x.clone().requires_grad_(), x.clone().requires_grad_()
    yo, yt = ours(xo), theirs(xt)
    assert torch.allclose(yo, yt, rtol=1e-5, atol=1e-5)
    g = torch.randn_like(yo)
    (yo * g).sum().backward()
    (yt * g).sum().backward()
    o, p = ours.layer, theirs.base_model.model.layer
    pairs = [
        (xo.grad, xt.grad),
        (o.A.grad, p.lora_A["default"].weight.grad.reshape(RANK, -1)),
        (o.B.grad, p.lora_B["default"].weight.grad.reshape(-1, RANK)),
    ]
    if use_dora:  # equal gradients here mean the weight norm is detached as in PEFT
        pairs.append((o.magnitude.grad, p.lora_magnitude_vector["default"].weight.grad.reshape(-1)))
    for mine, peft_grad in pairs:
        assert mine.abs().sum() > 0
        assert torch.allclose(mine, peft_grad, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("use_dora", [False, True], ids=["lora", "dora"])
@pytest.mark.parametrize("index", [0, 1], ids=["linear", "conv"])
def test_merged_weights_match_peft(index, use_dora):
    layer, x = _layers()[index]
    ours, theirs = _pair(layer, use_dora)
    merged_theirs = theirs.merge_and_unload()
    alfa.merge(ours)
    assert type(ours.layer) is type(layer)
    assert torch.allclose(ours.layer.weight, merged_theirs.layer.weight, rtol=1e-5, atol=1e-6)
    assert torch.allclose(ours(x), merged_theirs(x), rtol=1e-5, atol=1e-5)


def test_dora_gradients_would_differ_without_the_detached_norm():
    """The oracle comparison above can tell a detached norm from a differentiated one."""
    layer, x = _layers()[0]
    ours, _ = _pair(layer, use_dora=True)
    o = ours.layer
    W = layer.weight.detach()
    s = ALPHA / RANK
    V = W + s * o.B @ o.A
    undetached = o.magnitude[:, None] * V / V.norm(dim=1, keepdim=True)
    g_undetached = torch.autograd.grad(nn.functional.linear(x, undetached, layer.bias).sum(), o.B)[0]
    g_ours = torch.autograd.grad(ours(x).sum(), o.B)[0]
    assert not torch.allclose(g_ours, g_undetached, rtol=1e-3, atol=1e-5)
