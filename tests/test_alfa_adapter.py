import copy
import math

import pytest
import torch
from tiny_models import truncated_structure
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import alfa
from alfa.adapters import AlfaLayer, adapted_layers, adapter_parameters
from alfa.layers import FactorizedConv2d


def _randomize_adapters(model: nn.Module, std: float = 0.3) -> None:
    """A non-trivial adapter state (the zero init would hide most mistakes)."""
    with torch.no_grad():
        for p in adapter_parameters(model).values():
            p.normal_(0, std)


def _reference_V_adapt(layer: AlfaLayer) -> torch.Tensor:
    """The spec's computation, literally: Q_h, K, V, Z_h, the stacked Z, and B_p A_p Z."""
    Vb = layer.V_base.double()
    d, n = Vb.shape
    K, V = Vb, Vb.T
    Zs = []
    for h in range(layer.config.heads):
        Q = layer.B_q[h].double() @ layer.A_q[h].double() @ Vb
        attn = torch.softmax(Q @ K.T / math.sqrt(n), dim=-1)
        Zs.append((V @ attn.T).T)
    Z = torch.cat(Zs, dim=0)
    assert Z.shape == (layer.config.heads * d, n)
    return Vb + layer.B_p.double() @ layer.A_p.double() @ Z


@pytest.fixture
def truncated(small_net):
    alfa.truncate(small_net, rank=6)
    return small_net


def test_parameter_names_and_shapes(truncated):
    alfa.attach(truncated, alfa.AlfaConfig(heads=3, rank=2))
    layer = truncated.conv2
    assert isinstance(layer, AlfaLayer) and isinstance(layer.base, FactorizedConv2d)
    d = 6
    assert layer.A_q.shape == (3, 2, d)
    assert layer.B_q.shape == (3, d, 2)
    assert layer.A_p.shape == (2 * 3, 3 * d)
    assert layer.B_p.shape == (d, 2 * 3)
    assert torch.count_nonzero(layer.B_q) == 0 and torch.count_nonzero(layer.B_p) == 0
    assert 0.01 < float(layer.A_q.detach().std()) < 0.04  # N(0, 0.02²)
    assert layer.adapted_V().shape == layer.base.V.shape
    names = dict(truncated.named_parameters())
    assert {"conv2.A_q", "conv2.B_q", "conv2.A_p", "conv2.B_p", "conv2.base.U", "conv2.base.V"} <= set(names)


def test_alfa_at_init_equals_truncated_base_exactly(truncated):
    x = torch.randn(3, 3, 16, 16)
    base_out = truncated(x)
    alfa.attach(truncated, alfa.AlfaConfig(rank=4))  # the default heads; a rank within the layers' d = 6
    assert torch.equal(truncated(x), base_out)


def test_adapted_V_matches_the_literal_spec_formula(truncated):
    alfa.attach(truncated, alfa.AlfaConfig(heads=4, rank=3))
    _randomize_adapters(truncated)
    for layer in adapted_layers(truncated).values():
        assert torch.allclose(layer.adapted_V().double(), _reference_V_adapt(layer), rtol=1e-5, atol=1e-5)


def test_output_equals_dense_weight_U_adapted_V(truncated):
    alfa.attach(truncated, alfa.AlfaConfig(heads=2, rank=3))
    _randomize_adapters(truncated)
    layer = truncated.conv2
    x = torch.randn(2, 24, 8, 8)
    W = (layer.base.U @ layer.adapted_V()).reshape(40, 24, 3, 2)
    dense = nn.functional.conv2d(x, W, None, (1, 2), (2, 1), (2, 1))
    assert torch.allclose(layer(x), dense, rtol=1e-4, atol=1e-5)
    lin = truncated.fc1
    z = torch.randn(5, 48)
    assert torch.allclose(lin(z), z @ (lin.base.U @ lin.adapted_V()).T + lin.base.bias, rtol=1e-4, atol=1e-5)


def test_query_key_identity(truncated):
    """Q_h Kᵀ = B_q A_q S_d² because V_d has orthonormal columns."""
    alfa.attach(truncated, alfa.AlfaConfig(heads=3, rank=2))
    _randomize_adapters(truncated)
    layer = truncated.conv3
    Vb = layer.V_base.double()
    S = Vb.norm(dim=1)  # rows of S_d V_dᵀ have norms σ_i
    for h in range(3):
        M = layer.B_q[h].double() @ layer.A_q[h].double()
        assert torch.allclose((M @ Vb) @ Vb.T, M @ torch.diag(S**2), rtol=1e-6, atol=1e-8)


class _Shapes(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.shapes = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor):
                self.shapes.append(tuple(t.shape))
        return out


def test_forward_never_builds_the_dense_conv_weight():
    conv = FactorizedConv2d.from_dense(nn.Conv2d(32, 48, 3, padding=1), rank=5)
    model = nn.Sequential(conv)
    alfa.attach(model, alfa.AlfaConfig(heads=2, rank=2))
    _randomize_adapters(model)
    x = torch.randn(2, 32, 6, 6)
    with _Shapes() as rec:
        model(x).sum().backward()
    m, n = 48, 32 * 9
    forbidden = {(m, n), (m, 32, 3, 3), (n, m)}
    assert not forbidden & set(rec.shapes), "the adapted conv materialized its dense weight"
    assert (5, n) in rec.shapes  # it does build V_adapt (d×n)


def test_attention_runs_once_per_forward_whatever_the_batch(monkeypatch, truncated):
    alfa.attach(truncated, alfa.AlfaConfig(rank=4))
    calls = []
    original = torch.softmax
    monkeypatch.setattr(torch, "softmax", lambda *a, **k: calls.append(1) or original(*a, **k))
    truncated(torch.randn(20, 3, 16, 16))
    assert len(calls) == 4  # one per adapted layer, not per sample


def test_train_merge_detach(truncated):
    x = torch.randn(4, 3, 16, 16)
    base_out = truncated(x).detach()
    base_count = alfa.parameter_summary(truncated).total
    alfa.attach(truncated, alfa.AlfaConfig(heads=2, rank=4))
    _randomize_adapters(truncated, std=0.1)
    opt = torch.optim.AdamW([p for p in truncated.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(3):
        opt.zero_grad()
        truncated(x).pow(2).mean().backward()
        opt.step()
    adapted_out = truncated(x).detach()
    assert not torch.allclose(adapted_out, base_out)

    merged = copy.deepcopy(truncated)
    alfa.merge(merged)
    assert not adapted_layers(merged)
    assert isinstance(merged.conv2, FactorizedConv2d)
    assert alfa.parameter_summary(merged).total == base_count
    rel = (merged(x) - adapted_out).norm() / adapted_out.norm()
    assert rel < 1e-5

    alfa.detach(truncated)
    assert torch.equal(truncated(x), base_out)
    assert all(p.requires_grad for p in truncated.parameters())  # flags as before attach


def test_gradients_reach_exactly_the_adapter_parameters(truncated):
    alfa.attach(truncated, alfa.AlfaConfig(heads=2, rank=2))
    _randomize_adapters(truncated)
    truncated(torch.randn(2, 3, 16, 16)).sum().backward()
    adapter = set(adapter_parameters(truncated))
    for name, p in truncated.named_parameters():
        if name in adapter:
            assert p.requires_grad and p.grad is not None and p.grad.abs().sum() > 0, name
        else:
            assert not p.requires_grad and p.grad is None, name
    assert len(adapter) == 4 * 4


@pytest.mark.slow
def test_target_filter_and_param_groups():
    model = truncated_structure(alfa.models.resnet18_gaze().eval(), 16)  # its structure is the subject: no SVDs
    names = alfa.attach(model, alfa.AlfaConfig(target=r"^layer[34]\."))
    assert names and all(n.startswith(("layer3.", "layer4.")) for n in names)
    assert isinstance(model.layer2[0].conv1, FactorizedConv2d)
    groups = alfa.param_groups(model, lr=1e-4, lr_scale={r"^layer4\.": 10.0})
    by_name = {g["name"]: g for g in groups}
    assert by_name["default"]["lr"] == 1e-4 and by_name[r"^layer4\."]["lr"] == pytest.approx(1e-3)
    n_params = sum(len(g["params"]) for g in groups)
    assert n_params == len(adapter_parameters(model))
    torch.optim.AdamW(groups)  # optimizer-ready


def test_alfa_on_dense_layers_equals_base_at_init_and_merges_dense(small_net):
    x = torch.randn(2, 3, 16, 16)
    base_out = small_net(x)
    names = alfa.attach(small_net, alfa.AlfaConfig(heads=2, rank=2))
    assert names == ["conv1", "conv2", "conv3", "fc1", "fc2"]  # no factorized layers: dense ones
    assert torch.equal(small_net(x), base_out)
    _randomize_adapters(small_net, std=0.2)
    out = small_net(x).detach()
    alfa.merge(small_net)
    assert isinstance(small_net.conv2, nn.Conv2d)
    assert torch.allclose(small_net(x), out, rtol=1e-4, atol=1e-6)


def test_bad_input_errors(small_net):
    with pytest.raises(ValueError, match="call alfa.truncate first"):
        alfa.attach(small_net, alfa.AlfaConfig(layers="factorized"))
    with pytest.raises(RuntimeError, match="no adapter attached"):
        alfa.merge(small_net)
    with pytest.raises(RuntimeError, match="no adapter attached"):
        alfa.detach(small_net)
    with pytest.raises(ValueError, match="heads and rank must be positive"):
        alfa.attach(small_net, alfa.AlfaConfig(rank=0))
    with pytest.raises(ValueError, match="matched nothing"):
        alfa.attach(small_net, alfa.AlfaConfig(target="nonexistent"))
    with pytest.raises(TypeError, match="expected an adapter config"):
        alfa.attach(small_net, {"heads": 8})
    alfa.truncate(small_net, rank=6)
    alfa.attach(small_net, alfa.AlfaConfig(rank=4))
    with pytest.raises(RuntimeError, match="already has an adapter named 'default' \\(method 'alfa'\\)"):
        alfa.attach(small_net, alfa.AlfaConfig(rank=4))
    with pytest.raises(RuntimeError, match="before attaching an adapter"):
        alfa.truncate(small_net, rank=4)


def test_failed_attach_changes_nothing(small_net):
    before = {k: v.clone() for k, v in small_net.state_dict().items()}
    with pytest.raises(ValueError):
        alfa.attach(small_net, alfa.AlfaConfig(target="["))
    assert alfa.adapter_state(small_net) is None
    assert all(p.requires_grad for p in small_net.parameters())
    assert all(torch.equal(before[k], v) for k, v in small_net.state_dict().items())


def test_same_seed_same_adapter_init(truncated):
    a, b = copy.deepcopy(truncated), copy.deepcopy(truncated)
    torch.manual_seed(3)
    alfa.attach(a, alfa.AlfaConfig(rank=4))
    torch.manual_seed(3)
    alfa.attach(b, alfa.AlfaConfig(rank=4))
    for (na, pa), (nb, pb) in zip(adapter_parameters(a).items(), adapter_parameters(b).items()):
        assert na == nb and torch.equal(pa, pb)
