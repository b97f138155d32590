import math

import pytest
import torch
import torch.nn.functional as F

import alfa
from alfa.study.crate import (
    LayerProbe,
    clustered_coding_rate,
    coding_rate,
    coding_rate_step,
    head_coding_rates,
    plot_probes,
    probe_model,
    rate_reduction,
)

SMALL = dict(image_size=16, patch_size=4, num_classes=2, dim=16, depth=3, heads=2)  # 17 tokens, q = 8


pytestmark = pytest.mark.usefixtures("one_thread")


def _reference_rate(Z: torch.Tensor, eps: float) -> float:
    p, n = Z.shape
    Z = Z.double()
    return 0.5 * torch.logdet(torch.eye(p, dtype=torch.float64) + p / (n * eps**2) * Z @ Z.T).item() / math.log(2)


# --- coding rates -------------------------------------------------------------------------------


def test_coding_rate_of_orthogonal_tokens_is_the_closed_form():
    eps = 0.5
    a = 2.0
    Z = a * torch.eye(3)  # three orthogonal tokens of length a: Z Zᵀ = a² I
    expected = 3 / 2 * math.log2(1 + 3 * a**2 / (3 * eps**2))
    assert coding_rate(Z, eps).item() == pytest.approx(expected, rel=1e-12)
    # each direction twice (n = 6): Z Zᵀ = 2 a² I
    Z2 = torch.cat([Z, Z], dim=1)
    assert coding_rate(Z2, eps).item() == pytest.approx(3 / 2 * math.log2(1 + 3 * 2 * a**2 / (6 * eps**2)), rel=1e-12)
    # n identical tokens v: Z Zᵀ = n v vᵀ, one eigenvalue p‖v‖²/ε²
    v = torch.tensor([[1.0], [2.0], [2.0]])
    assert coding_rate(v.repeat(1, 5), eps).item() == pytest.approx(0.5 * math.log2(1 + 3 * 9 / eps**2), rel=1e-12)


@pytest.mark.parametrize("shape", [(3, 10), (10, 3)])  # both Gram-matrix branches
def test_coding_rate_matches_log_det_and_is_invariant_to_token_order(shape):
    torch.manual_seed(0)
    Z = torch.randn(*shape, dtype=torch.float64)
    assert coding_rate(Z, 0.3).item() == pytest.approx(_reference_rate(Z, 0.3), rel=1e-10)
    perm = torch.randperm(shape[1])
    torch.testing.assert_close(coding_rate(Z[:, perm], 0.3), coding_rate(Z, 0.3))
    labels = torch.arange(shape[1]) % 2
    torch.testing.assert_close(
        clustered_coding_rate(Z[:, perm], labels[perm], 0.3), clustered_coding_rate(Z, labels, 0.3)
    )
    batch = torch.stack([Z, 2 * Z])
    torch.testing.assert_close(coding_rate(batch, 0.3)[1], coding_rate(2 * Z, 0.3))


def test_clustered_rate_and_rate_reduction_closed_form():
    eps = 0.5
    e1, e2 = torch.eye(2)
    Z = torch.stack([e1, e1, e1, e2, e2, e2], dim=1)  # two clusters on the axes, 3 tokens each
    labels = [0, 0, 0, 1, 1, 1]
    # one cluster: Z_j Z_jᵀ = 3 e eᵀ, c_j = 2/(3 ε²) → ½ log2(1 + 2/ε²); weights ½ + ½
    per_cluster = 0.5 * math.log2(1 + 2 / eps**2)
    assert clustered_coding_rate(Z, labels, eps).item() == pytest.approx(per_cluster, rel=1e-12)
    # whole: Z Zᵀ = 3 I, c = 2/(6 ε²) → log2(1 + 1/ε²)
    whole = math.log2(1 + 1 / eps**2)
    assert coding_rate(Z, eps).item() == pytest.approx(whole, rel=1e-12)
    assert rate_reduction(Z, labels, eps).item() == pytest.approx(whole - per_cluster, rel=1e-12)
    # a single cluster has no reduction
    assert rate_reduction(Z, [7] * 6, eps).item() == pytest.approx(0.0, abs=1e-12)


def test_coding_rate_gradient_step_scales_each_eigen_direction():
    torch.manual_seed(1)
    p, n, eps, kappa = 3, 12, 0.5, 0.7
    Z = torch.randn(p, n, dtype=torch.float64)
    c = p / (n * eps**2)
    lam, V = torch.linalg.eigh(c * Z @ Z.T)
    stepped = coding_rate_step(Z, eps, kappa)
    factors = 1 - kappa * c / (1 + lam)
    torch.testing.assert_close(V.T @ stepped, factors[:, None] * (V.T @ Z))
    # thin directions (small λ) shrink more than wide ones
    assert factors[0] < factors[-1]


def test_coding_rate_errors_are_clear():
    with pytest.raises(ValueError, match="eps must be positive"):
        coding_rate(torch.ones(2, 3), 0.0)
    with pytest.raises(ValueError, match=r"shape \(\.\.\., p, n\)"):
        coding_rate(torch.ones(3), 0.5)
    with pytest.raises(ValueError, match="labels must be a 1-d sequence of length n = 3"):
        clustered_coding_rate(torch.ones(2, 3), [0, 1], 0.5)


def test_head_coding_rates_normalize_tokens():
    torch.manual_seed(2)
    W = torch.randn(2, 3, 5, 4)  # (batch, heads, n, q)
    rates = head_coding_rates(W, 0.1)
    assert rates.shape == (2, 3)
    scaled = W * torch.rand(2, 3, 5, 1).add(0.5)  # per-token lengths do not matter
    torch.testing.assert_close(head_coding_rates(scaled, 0.1), rates)
    unit = F.normalize(W[1, 2].double(), dim=-1)
    assert rates[1, 2].item() == pytest.approx(_reference_rate(unit.T, 0.1), rel=1e-10)


# --- probes -------------------------------------------------------------------------------------


def _manual_crate_probe(model, images, eps):
    """Run the blocks by hand and compute what the probe should have recorded."""
    z = model.front(images)
    rates, nonzero = [], []
    for block in model.blocks:
        x = block.norm1(z)
        w = block.attn.split_heads(block.attn.subspaces(x))
        rates.append(head_coding_rates(w, eps))
        z = z + block.attn(x)
        z = block.ista(block.norm2(z))
        nonzero.append((z != 0).double().mean(dim=(1, 2)))
    return torch.stack(rates, 1), torch.stack(nonzero, 1)


def test_crate_probe_records_the_per_head_rate_and_sparsity_of_every_layer():
    torch.manual_seed(3)
    model = alfa.models.create_model("crate_tiny", **SMALL).eval()
    images = torch.randn(5, 3, 16, 16)
    result = probe_model(model, images, eps=0.2, batch_size=2)  # three batches: 2 + 2 + 1
    with torch.no_grad():
        rates, nonzero = _manual_crate_probe(model, images, 0.2)
    assert result.coding_rate.shape == (5, 3, 2) and result.sparsity.shape == (5, 3)
    torch.testing.assert_close(result.coding_rate, rates)
    torch.testing.assert_close(result.sparsity, nonzero)
    torch.testing.assert_close(result.layer_rate(), rates.sum(-1))
    assert 0 < result.sparsity.min() and result.sparsity.max() < 1  # the ReLU zeroes some, not all
    summary = result.to_dict()
    assert summary["images"] == 5 and len(summary["coding_rate"]) == 3 and len(summary["nonzero_fraction"]) == 3
    assert len(result.table().splitlines()) == 2 + 3


def test_probe_context_manager_collects_batches_and_removes_its_hooks():
    torch.manual_seed(4)
    model = alfa.models.create_model("crate_tiny", **SMALL).eval()
    images = torch.randn(4, 3, 16, 16)
    with torch.no_grad(), LayerProbe(model, eps=0.1) as probe:
        model(images[:1])
        model(images[1:])
    whole = probe_model(model, images, eps=0.1)
    torch.testing.assert_close(probe.result().coding_rate, whole.coding_rate)
    model(images)  # hooks are gone: nothing more is recorded
    assert probe.result().num_images == 4
    probe.reset()
    with pytest.raises(RuntimeError, match="recorded nothing"):
        probe.result()


def test_vit_probe_reads_the_chosen_projection_and_has_no_sparsity():
    torch.manual_seed(5)
    model = alfa.models.create_model("vit_tiny", **SMALL).eval()
    images = torch.randn(3, 3, 16, 16)
    with torch.no_grad():
        block = model.blocks[0]
        q, k, v = block.attn.split_heads(block.attn.qkv(block.norm1(model.front(images))))
    for name, tokens in (("value", v), ("query", q)):
        result = probe_model(model, images, eps=0.1, vit_projection=name)
        assert result.sparsity is None and result.coding_rate.shape == (3, 3, 2)
        torch.testing.assert_close(result.coding_rate[:, 0], head_coding_rates(tokens, 0.1))
    with pytest.raises(ValueError, match="vit_projection must be one of"):
        LayerProbe(model, vit_projection="keys")


def test_probe_after_truncate_and_attach_sees_the_adapted_layers():
    torch.manual_seed(6)
    model = alfa.models.create_model("crate_tiny", **{**SMALL, "dim": 32, "heads": 4})
    images = torch.randn(2, 3, 16, 16)
    alfa.truncate(model, rank=4)
    before = probe_model(model, images)
    alfa.attach(model, alfa.AlfaConfig(heads=2, rank=2))
    after = probe_model(model, images)
    torch.testing.assert_close(after.coding_rate, before.coding_rate)  # the adapter starts at the identity
    for p in alfa.adapter_parameters(model).values():
        torch.nn.init.normal_(p, std=0.5)
    moved = probe_model(model, images)
    assert not torch.allclose(moved.coding_rate, before.coding_rate)


def test_probe_rejects_other_models():
    with pytest.raises(TypeError, match="probes need a CRATE or VisionTransformer"):
        LayerProbe(alfa.models.create_model("resnet18_gaze"))


def test_plot_probes_writes_a_png(tmp_path):
    torch.manual_seed(7)
    images = torch.randn(3, 3, 16, 16)
    crate = probe_model(alfa.models.create_model("crate_tiny", **SMALL), images)
    vit = probe_model(alfa.models.create_model("vit_tiny", **SMALL), images)
    path = tmp_path / "probes.png"
    plot_probes({"CRATE": crate, "ViT": vit}, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
