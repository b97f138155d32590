"""The baselines (LoRA family, Spectral, DoRA, FLoRA, BitFit, full fine-tuning) and Alfa's ablations
(diagonal gate, linear mix, Alfa on dense layers), on the same truncated weights as Alfa."""

import copy

import pytest
import torch
from tiny_models import truncated_structure
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import alfa
from alfa.adapters.bitfit import BitfitConfig, FullFinetuneConfig
from alfa.adapters.config import MergeError, config_from_dict
from alfa.adapters.dora import DoraConfig
from alfa.adapters.flora import FloraConfig, FloraLayer
from alfa.adapters.gate import DiagGateConfig, LinearMixConfig
from alfa.adapters.lora import LoraConfig, MiloraConfig, PissaConfig
from alfa.adapters.moslora import MosloraConfig
from alfa.adapters.spectral import SpectralConfig
from alfa.adapters.state import adapted_layers, adapter_parameters
from alfa.layers import FactorizedConv2d, FactorizedLinear, dense_matrix, is_factorized
from alfa.truncate import factorized_ranks

# PiSSA, MiLoRA and Spectral take QRs of ResNet-18's factors (4608×64, float64): on a busy 2-core machine two
# threads made them 2-4× slower than one
pytestmark = pytest.mark.usefixtures("one_thread")

# Small settings for the small test net (truncated at rank 6; fc2 (2×36) stays dense).
CONFIGS = {
    "lora": lambda **kw: LoraConfig(rank=2, alpha=4.0, **kw),
    "pissa": lambda **kw: PissaConfig(rank=2, **kw),
    "milora": lambda **kw: MiloraConfig(rank=2, **kw),
    "moslora": lambda **kw: MosloraConfig(rank=2, alpha=4.0, **kw),
    "spectral": lambda **kw: SpectralConfig(rank=2, **kw),
    "dora": lambda **kw: DoraConfig(rank=2, alpha=4.0, **kw),
    "flora": lambda **kw: FloraConfig(rank=2, **kw),
    "diag_gate": lambda **kw: DiagGateConfig(**kw),
    "linear_mix": lambda **kw: LinearMixConfig(rank=2, **kw),
    "alfa": lambda **kw: alfa.AlfaConfig(heads=2, rank=2, **kw),
    "bitfit": lambda **kw: BitfitConfig(),
    "full": lambda **kw: FullFinetuneConfig(),
}
MODEL_SCOPE = {"bitfit", "full"}
LAYER_METHODS = [m for m in CONFIGS if m not in MODEL_SCOPE]
DENSE_UPDATE = {"lora", "pissa", "milora", "moslora", "dora", "flora"}  # merge into factors only by densifying
FACTORIZED_MERGE = {"spectral", "diag_gate", "linear_mix", "alfa"}
# Zero-initialized branches add exact zeros; PiSSA/MiLoRA re-split W into residual + B A (round-off).
EXACT_AT_INIT = set(CONFIGS) - {"pissa", "milora", "dora"}
OWN_PARAMS = {  # the trainable tensors of one adapted conv layer
    "lora": {"A", "B"},
    "pissa": {"A", "B"},
    "milora": {"A", "B"},
    "moslora": {"A", "B", "M"},
    "spectral": {"dU", "dV"},
    "dora": {"A", "B", "magnitude"},
    "flora": {"G", "P_out", "P_in", "P_kh", "P_kw"},
    "diag_gate": {"gamma"},
    "linear_mix": {"A", "B"},
    "alfa": {"A_q", "B_q", "A_p", "B_p"},
}


def _attach(model, method, **kw):
    alfa.attach(model, CONFIGS[method](**kw))
    return model


def _randomize(model, std=0.3):
    """Every adapter tensor random (the zero init hides most mistakes)."""
    with torch.no_grad():
        for name, p in adapter_parameters(model).items():
            if name.endswith("magnitude"):
                p.uniform_(0.5, 1.5)
            else:
                p.add_(torch.randn_like(p) * std)


def _rel(a, b):
    a, b = a.detach(), b.detach()
    return float((a - b).norm() / b.norm()) if b.norm() > 0 else float((a - b).norm())


@pytest.fixture
def truncated(small_net):
    alfa.truncate(small_net, rank=6)
    return small_net


@pytest.fixture
def x():
    return torch.randn(3, 3, 16, 16)


# ----------------------------------------------------------------------------------------------------------------
# Life cycle, for every method


@pytest.mark.parametrize("method", list(CONFIGS))
@pytest.mark.parametrize("kind", ["truncated", "dense"])
def test_real_init_equals_the_base(method, kind, small_net, x):
    model = small_net
    if kind == "truncated":
        alfa.truncate(model, rank=6)
    base_out = model(x)
    _attach(model, method, layers="all")
    out = model(x)
    if method in EXACT_AT_INIT:
        assert torch.equal(out, base_out)
    else:
        assert _rel(out, base_out) < 1e-6


@pytest.mark.parametrize("method", list(CONFIGS))
def test_merged_equals_unmerged_from_a_random_init(method, truncated, x):
    base_total = alfa.parameter_summary(truncated).total
    model = _attach(copy.deepcopy(truncated), method, layers="all")
    _randomize(model)
    out = model(x).detach()
    assert _rel(out, truncated(x)) > 1e-2  # the random adapter does change the model

    if method in DENSE_UPDATE:
        before = copy.deepcopy(model)
        with pytest.raises(MergeError, match=r"densify=True"):
            alfa.merge(model)
        assert alfa.adapter_state(model) is not None and torch.equal(model(x), before(x))  # nothing changed
        alfa.merge(model, densify=True)
        assert isinstance(model.conv2, nn.Conv2d) and isinstance(model.fc1, nn.Linear)
        dense_total = alfa.parameter_summary(model).total
        assert dense_total > base_total
        factorized = [m for m in truncated.modules() if is_factorized(m)]
        grown = sum(m.spec.m * m.spec.n - m.U.numel() - m.V.numel() for m in factorized)
        assert dense_total == base_total + grown  # every factorized layer is stored densely now
    else:
        alfa.merge(model)
        assert alfa.parameter_summary(model).total == base_total  # the truncated model's exact size
        if method not in MODEL_SCOPE:
            assert isinstance(model.conv2, FactorizedConv2d) and isinstance(model.fc1, FactorizedLinear)
            assert model.conv2.rank == truncated.conv2.rank
    assert not adapted_layers(model) and alfa.adapter_state(model) is None
    assert _rel(model(x), out) < 1e-5
    assert all(p.requires_grad for p in model.parameters())  # flags as before attach


@pytest.mark.parametrize("method", sorted(DENSE_UPDATE))
def test_extended_merge_is_exact_and_keeps_factors(method, truncated, x):
    """A rank-r dense update on a rank-d factorized layer is exactly a rank-(d+r) factorization
    (PiSSA/MiLoRA: rank d), so the model-size argument against these baselines is weaker than
    "they must densify"."""
    model = _attach(copy.deepcopy(truncated), method, layers="all")
    _randomize(model)
    out = model(x).detach()
    extra = {"pissa": 0, "milora": 0}.get(method, 2)
    with pytest.raises(MergeError, match=r"extend=True"):
        alfa.merge(model)
    alfa.merge(model, extend=True)
    assert not adapted_layers(model) and alfa.adapter_state(model) is None
    assert all(p.requires_grad for p in model.parameters())
    assert _rel(model(x), out) < 1e-5
    for name in ["conv1", "conv2", "conv3", "fc1"]:
        assert model.get_submodule(name).rank == truncated.get_submodule(name).rank + extra
    assert isinstance(model.fc2, nn.Linear)  # the dense layer merges densely


@pytest.mark.parametrize("method", list(CONFIGS))
def test_gradients_reach_exactly_the_method_parameters(method, truncated, x):
    model = _attach(copy.deepcopy(truncated), method, layers="all")
    _randomize(model)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == set(adapter_parameters(model))
    model(x).square().sum().backward()
    for name, p in model.named_parameters():
        if name in trainable:
            assert p.grad is not None and p.grad.abs().sum() > 0, name
        else:
            assert p.grad is None, name
    if method in OWN_PARAMS:
        assert {n.split(".", 1)[1] for n in trainable if n.startswith("conv2.")} == OWN_PARAMS[method]


@pytest.mark.parametrize("method", list(CONFIGS))
def test_save_load_round_trip(method, truncated, x, tmp_path):
    shared = copy.deepcopy(truncated)
    user = _attach(copy.deepcopy(truncated), method, layers="all")
    _randomize(user)
    path = alfa.save_adapter(user, tmp_path / f"{method}.safetensors")
    assert alfa.read_adapter_metadata(path)["method"] == CONFIGS[method]().method
    alfa.load_adapter(shared, path)
    assert torch.equal(shared(x), user(x))
    saved, loaded = adapter_parameters(user), adapter_parameters(shared)
    assert saved.keys() == loaded.keys() and all(torch.equal(saved[k], loaded[k]) for k in saved)
    alfa.detach(shared)
    assert torch.equal(shared(x), truncated(x))


@pytest.mark.parametrize("method", ["diag_gate", "linear_mix"])
def test_ablations_save_compactly_as_a_dictionary_mix(method, truncated, x, tmp_path):
    user = _attach(copy.deepcopy(truncated), method, layers="all")
    _randomize(user)
    path = alfa.save_adapter(user, tmp_path / "compact.safetensors", compact=True)
    shared = copy.deepcopy(truncated)
    alfa.load_adapter(shared, path)
    assert alfa.adapter_state(shared).config.method == "dictionary_mix"
    assert torch.allclose(shared(x), user(x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("method", sorted(DENSE_UPDATE | {"spectral"}))
def test_low_rank_methods_have_no_compact_file(method, truncated, tmp_path):
    model = _attach(copy.deepcopy(truncated), method)
    with pytest.raises(ValueError, match="no compact form"):
        alfa.save_adapter(model, tmp_path / "x.safetensors", compact=True)


@pytest.mark.parametrize("method", list(CONFIGS))
def test_config_round_trips_through_the_registry(method):
    cfg = CONFIGS[method](target=r"conv") if method not in MODEL_SCOPE else CONFIGS[method]()
    assert config_from_dict(cfg.method, cfg.to_dict()) == cfg


class _Shapes(TorchDispatchMode):
    """Records the shape of every tensor an op produces."""

    def __init__(self) -> None:
        super().__init__()
        self.shapes: set[tuple[int, ...]] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor):
                self.shapes.add(tuple(t.shape))
        return out


@pytest.mark.parametrize("method", LAYER_METHODS)
def test_training_step_never_builds_the_dense_conv_weight(method):
    model = nn.Sequential(FactorizedConv2d.from_dense(nn.Conv2d(32, 48, 3, padding=1), rank=5))
    _attach(model, method)
    _randomize(model)
    x = torch.randn(2, 32, 6, 6)
    with _Shapes() as rec:
        model(x).sum().backward()
    m, n = 48, 32 * 9
    assert not {(m, n), (m, 32, 3, 3), (n, m)} & rec.shapes, f"{method} materialized the dense conv weight"


# ----------------------------------------------------------------------------------------------------------------
# Each method's formula


def _conv(layer, x, W, bias):
    return nn.functional.conv2d(x, W.reshape(layer.spec.m, layer.spec.in_features, *layer.spec.kernel_size), bias,
                                layer.spec.stride, layer.spec.padding, layer.spec.dilation)  # fmt: skip


def test_lora_on_a_dilated_factorized_conv_is_W_d_plus_scaled_BA(truncated):
    alfa.attach(truncated, LoraConfig(rank=3, alpha=12.0))
    _randomize(truncated)
    layer = truncated.conv2  # stride (1, 2), padding (2, 1), dilation (2, 1), kernel (3, 2)
    W = layer.base.U @ layer.base.V + 4.0 * layer.B @ layer.A
    h = torch.randn(2, 24, 9, 10)
    assert torch.allclose(layer(h), _conv(layer, h, W, None), rtol=1e-4, atol=1e-5)
    assert torch.allclose(layer.effective_weight()[0], W)
    assert layer.A.shape == (3, 24 * 3 * 2) and layer.B.shape == (40, 3)


def test_pissa_and_milora_split_W_d_on_a_non_canonical_factorized_layer():
    torch.manual_seed(1)
    layer = FactorizedConv2d(5, 12, 3, rank=6, padding=1)  # random U, V: not in SVD form
    W = (layer.U @ layer.V).detach().double()
    S = torch.linalg.svdvals(W)[:6]
    for cfg, which in [(PissaConfig(rank=2, alpha=5.0), S[:2]), (MiloraConfig(rank=2), S[4:])]:
        model = nn.Sequential(copy.deepcopy(layer))
        alfa.attach(model, cfg)
        ad = model[0]
        s = cfg.alpha / cfg.rank
        BA = s * ad.B.double() @ ad.A.double()
        assert torch.allclose(ad.frozen_dense().double() + BA, W, atol=1e-5)  # residual + B A = W_d
        assert torch.allclose(torch.linalg.svdvals(BA)[:2], which, rtol=1e-4)  # the chosen triplets
        assert ad.U_res.shape == (12, 4) and ad.V_res.shape == (4, 45)  # residual: factorized, rank d − r
        assert torch.allclose(ad.B.double().T @ ad.B.double(), ad.A.double() @ ad.A.double().T, atol=1e-5)


def test_pissa_on_a_dense_layer_and_rank_errors():
    lin = nn.Linear(10, 7)
    model = nn.Sequential(copy.deepcopy(lin))
    alfa.attach(model, PissaConfig(rank=3))
    ad = model[0]
    top = torch.linalg.svdvals(lin.weight.detach())[:3]
    s = 8.0 / 3  # default alpha = 8 over rank 3; PiSSA divides S_r by the scale, as PEFT does
    assert torch.allclose(torch.linalg.svdvals(s * ad.B @ ad.A)[:3], top, rtol=1e-5)
    assert torch.allclose(ad.W_res + s * ad.B @ ad.A, lin.weight, atol=1e-6)
    with pytest.raises(ValueError, match=r"pissa: rank 8 is larger than every layer it adapts .*: at most 7"):
        alfa.attach(nn.Sequential(nn.Linear(10, 7)), PissaConfig(rank=8))
    fac = nn.Sequential(FactorizedLinear(10, 7, rank=3))
    with pytest.raises(ValueError, match=r"milora rank 3 is too large for this factorized layer's rank 3"):
        alfa.attach(fac, MiloraConfig(rank=3))


def test_moslora_is_W_plus_scaled_B_M_A(truncated):
    alfa.attach(truncated, MosloraConfig(rank=3, alpha=6.0))
    layer = truncated.conv3
    assert layer.M.shape == (3, 3) and torch.count_nonzero(layer.B) == 0 and torch.count_nonzero(layer.M) > 0
    _randomize(truncated)
    W = layer.base.U @ layer.base.V + 2.0 * layer.B @ layer.M @ layer.A
    assert torch.allclose(layer.effective_weight()[0], W, atol=1e-6)


def test_spectral_corrects_the_top_singular_vectors_and_stays_rank_d():
    torch.manual_seed(2)
    model = nn.Sequential(FactorizedConv2d(6, 16, 3, rank=8, stride=2, padding=1))  # not in SVD form
    W = (model[0].U @ model[0].V).detach().double()
    alfa.attach(model, SpectralConfig(rank=3))
    _randomize(model)
    ad = model[0]
    U, S, Vh = torch.linalg.svd(W, full_matrices=False)
    # Fix the sign convention of alfa.layers (largest |U| entry positive) to compare vectors.
    sign = torch.sign(U[U.abs().argmax(0), torch.arange(U.shape[1])])
    U, Vh = U * sign, Vh * sign[:, None]
    r, d = 3, 8
    Ur = U[:, :r] + ad.dU.double()
    Vr = Vh[:r].T + ad.dV.double()
    expected = Ur @ torch.diag(S[:r]) @ Vr.T + U[:, r:d] @ torch.diag(S[r:d]) @ Vh[r:d]
    assert torch.allclose(ad.effective_weight()[0].double(), expected, atol=1e-4)
    U2, V2, _ = ad.effective_factors()
    assert U2.shape == (16, d) and V2.shape == (d, 54)
    assert torch.allclose((U2 @ V2).double(), expected, atol=1e-4)
    h = torch.randn(2, 6, 8, 8)
    assert torch.allclose(ad(h), _conv(ad, h, expected.float(), ad.bias), rtol=1e-4, atol=1e-4)


def test_dora_scales_each_output_filter_by_magnitude_over_norm(truncated):
    alfa.attach(truncated, DoraConfig(rank=2, alpha=2.0))
    layer = truncated.conv2
    W0 = layer.base.U @ layer.base.V
    assert torch.allclose(layer.magnitude, W0.norm(dim=1), rtol=1e-5)  # init: the row norms of W_d
    _randomize(truncated)
    V = W0 + layer.B @ layer.A
    expected = layer.magnitude[:, None] * V / V.norm(dim=1, keepdim=True)
    assert torch.allclose(layer.effective_weight()[0], expected, rtol=1e-4, atol=1e-6)
    assert torch.allclose(layer.weight_norm(), V.norm(dim=1), rtol=1e-5)  # Gram-matrix norm, no m×n
    h = torch.randn(2, 24, 9, 10)
    assert torch.allclose(layer(h), _conv(layer, h, expected, None), rtol=1e-4, atol=1e-5)
    # The norm is a constant in the backward pass (PEFT, DoRA §4.3): ∂/∂mag is the unit direction's output.
    out = layer(h)
    assert not layer.weight_norm().requires_grad
    out.sum().backward()
    unit = _conv(layer, h, (V / V.norm(dim=1, keepdim=True)).detach(), None)
    assert torch.allclose(layer.magnitude.grad, unit.sum(dim=(0, 2, 3)), rtol=1e-4)


def _mode_product(T, M, mode):
    """Tucker's n-mode product ``T ×_mode M`` (M: size_new × size_old), written as plainly as possible."""
    T = torch.movedim(T, mode, 0)
    shape = T.shape
    out = (M @ T.reshape(shape[0], -1)).reshape(M.shape[0], *shape[1:])
    return torch.movedim(out, 0, mode)


def test_flora_is_a_tucker_update_of_the_conv_tensor(truncated):
    alfa.attach(truncated, FloraConfig(rank=3, scale=0.5, layers="all"))
    layer = truncated.conv2
    assert isinstance(layer, FloraLayer) and layer.G.shape == (3, 3, 3, 2)  # kernel modes at full size
    assert torch.count_nonzero(layer.G) == 0
    assert 0.2 < float(layer.P_out.detach().std()) < 0.6  # Kaiming-normal, a=√3: std √(1/(2·3)) ≈ 0.41
    _randomize(truncated)
    core = layer.G
    for mode, P in enumerate([layer.P_out, layer.P_in, layer.P_kh, layer.P_kw]):
        core = _mode_product(core, P, mode)
    assert core.shape == (40, 24, 3, 2)
    assert torch.allclose(layer.tucker_delta(), 0.5 * core, atol=1e-5)
    assert torch.allclose(layer.delta_weight(), 0.5 * core.reshape(40, -1), atol=1e-5)
    lin = truncated.fc2  # dense Linear: the two-mode version
    assert lin.G.shape == (3, 3)
    assert torch.allclose(lin.delta_weight(), 0.5 * lin.P_out @ lin.G @ lin.P_in.T, atol=1e-6)
    with pytest.raises(ValueError, match="kernel_rank"):
        FloraConfig(kernel_rank=0).validate()


def test_diag_gate_and_linear_mix_formulas(truncated):
    gate = copy.deepcopy(truncated)
    alfa.attach(gate, DiagGateConfig())
    _randomize(gate)
    g = gate.conv3
    assert g.gamma.shape == (6,)
    assert torch.allclose(g.adapted_V(), (1 + g.gamma)[:, None] * g.base.V)
    mix = copy.deepcopy(truncated)
    alfa.attach(mix, LinearMixConfig(rank=3, init_std=0.05))
    m = mix.conv3
    assert m.A.shape == (3, 6) and m.B.shape == (6, 3) and torch.count_nonzero(m.B) == 0
    assert 0.02 < float(m.A.detach().std()) < 0.1
    _randomize(mix)
    assert torch.allclose(m.adapted_V(), m.base.V + m.B @ m.A @ m.base.V, atol=1e-6)


def test_bitfit_trains_biases_and_norm_affines_only(resnet_truncated):
    model = copy.deepcopy(resnet_truncated)
    names = alfa.attach(model, BitfitConfig())
    bn = [n for n, m in model.named_modules() if isinstance(m, nn.BatchNorm2d)]
    assert set(names) == {f"{b}.{w}" for b in bn for w in ("weight", "bias")} | {"fc.bias"}
    assert alfa.parameter_summary(model).trainable == sum(2 * model.get_submodule(b).num_features for b in bn) + 2
    alfa.detach(model)
    assert alfa.attach(model, BitfitConfig(target=r"^layer4\.")) == [n for n in names if n.startswith("layer4.")]


def test_full_finetune_trains_everything(truncated, x):
    names = alfa.attach(truncated, FullFinetuneConfig())
    assert names == [n for n, _ in truncated.named_parameters()]
    before = copy.deepcopy(truncated)
    _randomize(truncated)
    alfa.detach(truncated)
    assert torch.equal(truncated(x), before(x))


# ----------------------------------------------------------------------------------------------------------------
# Alfa and its ablations on dense layers (no truncation)


@pytest.mark.parametrize("layer", [nn.Linear(30, 20), nn.Conv2d(8, 12, 3, stride=2, padding=1, dilation=1)])
@pytest.mark.parametrize("method", ["alfa", "diag_gate", "linear_mix"])
def test_dictionary_methods_on_dense_layers(layer, method):
    model = nn.Sequential(layer)
    x = torch.randn(4, 30) if isinstance(layer, nn.Linear) else torch.randn(2, 8, 9, 9)
    base_out = model(x)
    _attach(model, method)
    ad = model[0]
    assert torch.equal(model(x), base_out)  # the base exactly, not its SVD round-off
    d = min(dense_matrix(layer).shape)
    assert ad.V_base.shape[0] == d and torch.allclose(ad.U_d @ ad.V_base, dense_matrix(layer), atol=1e-5)
    _randomize(model)
    out = model(x).detach()
    assert _rel(out, base_out) > 1e-2
    alfa.merge(model)
    assert type(model[0]) is type(layer)  # merge writes the dense weight back
    assert _rel(model(x), out) < 1e-5


def test_dense_alfa_with_a_lower_dense_rank():
    lin = nn.Linear(30, 20)
    model = nn.Sequential(copy.deepcopy(lin))
    alfa.attach(model, alfa.AlfaConfig(heads=2, rank=2, dense_rank=5))
    assert model[0].V_base.shape == (5, 30)
    assert model[0].A_p.shape == (4, 10)


# ----------------------------------------------------------------------------------------------------------------
# Every method on the real model

DENSE_RESNET18_PARAMS = 11_177_538  # resnet18_gaze() with 2 outputs


@pytest.fixture(scope="module")
def resnet_truncated():
    torch.manual_seed(0)
    return truncated_structure(alfa.models.resnet18_gaze().eval(), 64)


def test_truncated_structure_matches_truncate(small_net):
    stand_in = truncated_structure(copy.deepcopy(small_net), 6)
    alfa.truncate(small_net, rank=6)
    assert factorized_ranks(stand_in) == factorized_ranks(small_net)


@pytest.mark.slow
@pytest.mark.parametrize("method", list(CONFIGS))
def test_every_method_on_resnet18_truncated_at_64(method, resnet_truncated):
    torch.manual_seed(0)
    model = copy.deepcopy(resnet_truncated)
    defaults = {  # each method at its default settings
        "lora": LoraConfig(), "pissa": PissaConfig(), "milora": MiloraConfig(), "moslora": MosloraConfig(),
        "spectral": SpectralConfig(), "dora": DoraConfig(), "flora": FloraConfig(), "diag_gate": DiagGateConfig(),
        "linear_mix": LinearMixConfig(), "alfa": alfa.AlfaConfig(), "bitfit": BitfitConfig(),
        "full": FullFinetuneConfig(),
    }  # fmt: skip
    base_total = alfa.parameter_summary(model).total
    alfa.attach(model, defaults[method])
    x = torch.randn(2, 3, 32, 32)
    opt = torch.optim.AdamW(alfa.param_groups(model, lr=1e-3, lr_scale={r"^layer[34]\.": 10.0}))
    pred = model(torch.cat([x, x.flip(-1)]))  # a flip-symmetry step, as in personalization
    flipped = pred[2:].detach() * torch.tensor([-1.0, 1.0])
    (pred[:2] - flipped).abs().mean().backward()
    opt.step()
    before = pred[:2].detach()
    after = model(x).detach()
    assert _rel(after, before) > 1e-6  # one step moves the model
    alfa.merge(model, densify=method in DENSE_UPDATE)
    assert _rel(model(x), after) < 1e-4
    total = alfa.parameter_summary(model).total
    if method in DENSE_UPDATE:
        assert total == DENSE_RESNET18_PARAMS  # every adapted conv is dense again
    else:
        assert total == base_total


def test_a_dense_rank_larger_than_every_layer_is_refused_not_cut_down():
    """dense_rank 128 on 64-wide layers silently became 64 (the full SVD)."""
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8))
    with pytest.raises(ValueError, match=r"alfa: dense_rank 128 is larger than every layer it adapts .*: at most 64"):
        alfa.attach(copy.deepcopy(model), alfa.AlfaConfig(layers="dense", dense_rank=128, heads=2, rank=2))
    with pytest.warns(UserWarning, match=r"dense_rank 32 is above the rank of 1 dense layer\(s\), .*: 2 \(d = 8\)"):
        alfa.attach(model, alfa.AlfaConfig(layers="dense", dense_rank=32, heads=2, rank=2))  # 32: the last layer's 8
    assert [layer.dictionary_size for layer in (model[0], model[2])] == [32, 8]


def _warnings_of(call, *args, **kwargs) -> list[str]:
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call(*args, **kwargs)
    return [str(w.message) for w in caught if issubclass(w.category, UserWarning)]


def test_a_dense_rank_a_layer_cannot_hold_is_clipped_to_its_rank_and_said_once(tmp_path):
    """README's example on a small Llama: dense_rank 128 gave v_proj (192 -> 96) a dictionary of 96 without a word."""
    model = nn.Sequential(nn.Linear(192, 192), nn.Linear(192, 96), nn.Linear(192, 96), nn.Linear(96, 8))
    said = _warnings_of(alfa.attach, model, alfa.AlfaConfig(heads=2, rank=2, dense_rank=128, target=["1", "2", "0"]))
    assert said == [
        "alfa.attach (alfa): dense_rank 128 is above the rank of 2 dense layer(s), whose dictionary is their full SVD "
        "instead: 1 (d = 96), 2 (d = 96)"
    ]
    assert [model[i].dictionary_size for i in range(3)] == [128, 96, 96]
    path = alfa.save_adapter(model, tmp_path / "ann.safetensors")
    alfa.detach(model)
    assert _warnings_of(alfa.load_adapter, model, path) == []  # said when it was attached, not again per load
    assert [model[i].dictionary_size for i in range(3)] == [128, 96, 96]
    quiet = nn.Sequential(nn.Linear(192, 192))
    assert _warnings_of(alfa.attach, quiet, alfa.AlfaConfig(heads=2, rank=2, dense_rank=128)) == []


@pytest.mark.parametrize("config", [alfa.AlfaConfig(heads=2, rank=64), LinearMixConfig(rank=64)])
def test_a_dictionary_rank_above_every_layers_d_is_refused(config):
    """AlfaConfig(rank=64) on layers truncated at d = 16 was accepted with 4x the parameters; Spectral, PiSSA and
    MiLoRA refuse a rank above the layer's d. A rank-r term on a d-dimensional dictionary has rank at most d."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64))
    alfa.truncate(model, 16)
    kept = copy.deepcopy(model.state_dict())
    with pytest.raises(ValueError, match=rf"{config.method}: rank 64 is larger than the dictionary of every layer it "):
        alfa.attach(model, config)
    assert alfa.adapter_state(model) is None and list(model.state_dict()) == list(kept)
    for rank in (16, 4):  # d itself, and below it: no word
        assert _warnings_of(alfa.attach, copy.deepcopy(model), alfa.AlfaConfig(heads=2, rank=rank)) == []


def test_a_dictionary_rank_above_some_layers_d_is_said_once_and_kept():
    """The default Alfa on a dense model meets a 2-output head (d = 2): refusing would refuse the default setup, and
    cutting the rank there would change the shapes its saved files have, so the head keeps rank 8 and is named."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 2))
    said = _warnings_of(alfa.attach, model, alfa.AlfaConfig(heads=2, rank=8))
    assert said == [
        "alfa.attach (alfa): rank 8 is above the dictionary size d of 1 layer(s), where its low-rank terms are full "
        "rank (rank d would express the same updates with fewer parameters): 4 (d = 2)"
    ]
    assert model[4].A_q.shape == (2, 8, 2) and model[2].A_q.shape == (2, 8, 64)


def test_an_adapter_saved_with_a_dense_rank_above_every_layer_still_loads(tmp_path):
    """Such a file (written before the refusal) meant each layer's full SVD; it loads as it did."""
    import json

    from safetensors import safe_open
    from safetensors.torch import save_file

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8))
    user = copy.deepcopy(model)
    alfa.attach(user, alfa.AlfaConfig(layers="dense", dense_rank=64, heads=2, rank=2))
    with torch.no_grad():
        for p in alfa.adapter_parameters(user).values():
            p.normal_(0, 0.02)
    path = alfa.save_adapter(user, tmp_path / "old.safetensors")
    with safe_open(str(path), framework="pt") as f:
        meta, tensors = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
    config = json.loads(meta["config"])
    save_file(tensors, str(path), metadata={**meta, "config": json.dumps({**config, "dense_rank": 128})})
    alfa.load_adapter(model, path)
    x = torch.rand(3, 64)
    assert torch.equal(model(x), user(x))


def test_a_file_with_a_dictionary_rank_above_d_still_loads(tmp_path):
    """alfa accepted a dictionary rank above d until 2026-12-06 (tiny bench configs made such files): the refusal is
    for a new attach; a file's adapter loads as it was made, with the same outputs."""
    from alfa.adapters.select import sizes_said_before

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64))
    alfa.truncate(model, 4)
    base = copy.deepcopy(model)
    with sizes_said_before():  # as the code before the refusal attached it
        alfa.attach(model, alfa.AlfaConfig(heads=2, rank=8))
    with torch.no_grad():
        for p in alfa.adapter_parameters(model).values():
            p.normal_(0, 0.1)
    path = alfa.save_adapter(model, tmp_path / "old.safetensors")
    x = torch.randn(3, 16)
    alfa.load_adapter(base, path)
    assert torch.equal(base(x), model(x))
