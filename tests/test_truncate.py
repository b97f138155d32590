import pytest
import torch
from torch import nn

import alfa
from alfa.layers import FactorizedConv2d, FactorizedLinear, canonicalize_factors, dense_matrix
from alfa.truncate import factorized_ranks, restore_structure

CONV_CASES = [
    dict(in_channels=5, out_channels=7, kernel_size=3, stride=1, padding=1, dilation=1, bias=True),
    dict(in_channels=4, out_channels=6, kernel_size=(3, 2), stride=(2, 1), padding=(1, 2), dilation=(2, 1), bias=True),
    dict(in_channels=6, out_channels=3, kernel_size=1, stride=2, padding=0, dilation=1, bias=False),
    dict(in_channels=3, out_channels=8, kernel_size=5, stride=3, padding=2, dilation=2, bias=False),
]


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).detach().norm() / b.detach().norm())


@pytest.mark.parametrize("case", CONV_CASES)
def test_full_rank_conv_reproduces_dense(case):
    conv = nn.Conv2d(**case)
    full = min(case["out_channels"], conv.weight[0].numel())
    fact = FactorizedConv2d.from_dense(conv, rank=full)
    x = torch.randn(2, case["in_channels"], 13, 11)
    assert fact(x).shape == conv(x).shape
    assert _rel_err(fact(x), conv(x)) < 1e-5


@pytest.mark.parametrize("bias", [True, False])
def test_full_rank_linear_reproduces_dense(bias):
    lin = nn.Linear(9, 5, bias=bias)
    fact = FactorizedLinear.from_dense(lin, rank=5)
    x = torch.randn(4, 3, 9)
    assert _rel_err(fact(x), lin(x)) < 1e-5


def test_rank_is_clamped_to_matrix_size():
    assert FactorizedLinear.from_dense(nn.Linear(9, 5), rank=64).rank == 5


@pytest.mark.parametrize("d", [1, 3, 6])
def test_truncation_equals_dense_top_d_svd(d):
    conv = nn.Conv2d(4, 10, 3, padding=1)
    W = conv.weight.detach().reshape(10, -1).double()
    U, S, Vh = torch.linalg.svd(W, full_matrices=False)
    W_d = (U[:, :d] * S[:d]) @ Vh[:d]
    fact = FactorizedConv2d.from_dense(conv, rank=d)
    assert fact.U.shape == (10, d) and fact.V.shape == (d, 36)
    assert torch.allclose(fact.weight_matrix().double(), W_d, atol=1e-6)
    # U orthonormal, V = S_d V_dᵀ: rows orthogonal with norms equal to the singular values.
    assert torch.allclose(fact.U.T @ fact.U, torch.eye(d), atol=1e-5)
    assert torch.allclose(fact.V.double().norm(dim=1), S[:d], atol=1e-5)
    # And the truncated conv computes the conv with weight W_d.
    x = torch.randn(2, 4, 9, 9)
    dense = nn.functional.conv2d(x.double(), W_d.reshape(10, 4, 3, 3), conv.bias.double(), padding=1)
    assert _rel_err(fact(x).double(), dense) < 1e-5


def test_truncate_model_in_place(small_net):
    x = torch.randn(2, 3, 16, 16)
    report = alfa.truncate(small_net, rank=8)
    assert set(report.factorized) == {"conv1", "conv2", "conv3", "fc1"}
    assert "fc2" in report.left_dense and "no saving" in report.left_dense["fc2"]
    # the rank asked is above fc2's own (2 outputs): the sum is said at the d it was taken with, not at 8
    assert report.left_dense["fc2"].endswith("(d = min(m, n) = 2: the rank asked is above the layer's)")
    at_its_rank = alfa.truncate(nn.Sequential(nn.Linear(64, 64), nn.Linear(4, 3)), rank=2, weights=False)
    assert at_its_rank.left_dense["1"] == "no saving: d·(m+n) = 14 ≥ m·n = 12"
    assert isinstance(small_net.conv2, FactorizedConv2d) and isinstance(small_net.fc1, FactorizedLinear)
    assert isinstance(small_net.fc2, nn.Linear)
    assert small_net(x).shape == (2, 2)
    assert factorized_ranks(small_net) == {"conv1": 8, "conv2": 8, "conv3": 8, "fc1": 8}


def test_truncate_target_filter(small_net):
    report = alfa.truncate(small_net, rank=8, target=r"^conv[23]$")
    assert set(report.factorized) == {"conv2", "conv3"}
    assert isinstance(small_net.conv1, nn.Conv2d)


def test_grouped_conv_left_dense_and_reported():
    net = nn.Sequential(nn.Conv2d(16, 32, 3, groups=4), nn.Conv2d(32, 64, 3))
    report = alfa.truncate(net, rank=4)
    assert "0" in report.left_dense and "grouped" in report.left_dense["0"]
    assert list(report.factorized) == ["1"]
    assert "left dense: 0 (grouped conv" in str(report)


@pytest.mark.parametrize("rank", [0, -3, 2.5, True])
def test_truncate_rejects_bad_rank(small_net, rank):
    with pytest.raises(ValueError, match="rank must be a positive integer"):
        alfa.truncate(small_net, rank=rank)


def test_truncate_without_eligible_layers_is_a_clear_error():
    with pytest.raises(ValueError, match="no layer can be truncated at rank 4"):
        alfa.truncate(nn.Sequential(nn.ReLU(), nn.BatchNorm1d(3)), rank=4)
    with pytest.raises(ValueError, match="no saving"):
        alfa.truncate(nn.Sequential(nn.Linear(4, 3)), rank=4)
    # a target that matches nothing: said so, not that the model has no Linear/Conv2d layers (it has)
    with pytest.raises(ValueError, match=r"matching '\^nope' .*\(no Linear/Conv2d layer matches it\)"):
        alfa.truncate(nn.Sequential(nn.Linear(64, 64)), rank=4, target=r"^nope")


def test_canonicalize_restores_svd_form_without_changing_outputs(small_net):
    alfa.truncate(small_net, rank=6)
    with torch.no_grad():
        for p in small_net.parameters():
            p.add_(0.05 * torch.randn_like(p))  # what recovery fine-tuning does to the factors
    x = torch.randn(2, 3, 16, 16)
    before = small_net(x)
    assert alfa.canonicalize(small_net) == 4
    assert _rel_err(small_net(x), before) < 1e-5
    U, V = small_net.conv3.U, small_net.conv3.V
    assert torch.allclose(U.T @ U, torch.eye(6), atol=1e-5)
    gram = V @ V.T
    assert torch.allclose(gram, torch.diag(torch.diagonal(gram)), atol=1e-4)
    assert torch.all(torch.diagonal(gram)[:-1] >= torch.diagonal(gram)[1:])  # sorted by energy


def test_canonicalize_factors_is_exact():
    U, V = torch.randn(7, 3, dtype=torch.float64), torch.randn(3, 11, dtype=torch.float64)
    U2, V2 = canonicalize_factors(U, V)
    assert torch.allclose(U2 @ V2, U @ V, atol=1e-12)


def test_restore_structure_rebuilds_a_loadable_model(small_net):
    alfa.truncate(small_net, rank=5)
    fresh = type(small_net)().eval()
    restore_structure(fresh, factorized_ranks(small_net))
    fresh.load_state_dict(small_net.state_dict())
    x = torch.randn(1, 3, 16, 16)
    assert torch.equal(fresh(x), small_net(x))


def test_resnet18_parameter_counts():
    model = alfa.models.resnet18_gaze()
    assert alfa.parameter_summary(model).total == 11_177_538
    # the structure alone: the counts are the truncation's (the test above), without fourteen float64 SVDs
    report = alfa.truncate(model, rank=64, weights=False)
    summary = alfa.parameter_summary(model)
    # 14 layers factorized (layer2-4 convs and the layer3/layer4 downsamples) hold 2.109 M parameters;
    # the stem, layer1, layer2's downsample, BN and the head stay dense: 2.285 M in all (the paper's
    # "about 2 M", five times smaller than dense).
    assert len(report.factorized) == 14
    assert summary.by_kind["FactorizedConv2d"].params == 2_109_440
    assert summary.total == 2_285_122
    text = str(summary)
    assert "FactorizedConv2d" in text and "2.109 M" in text and "2.285 M" in text and "Conv2d (dense)" in text


def test_resnet18_uses_torchvision_parameter_names():
    keys = set(alfa.models.resnet18_gaze().state_dict())
    expected = {
        "conv1.weight", "bn1.running_mean", "bn1.num_batches_tracked", "layer1.0.conv1.weight",
        "layer2.0.downsample.0.weight", "layer2.0.downsample.1.bias", "layer4.1.bn2.running_var",
        "fc.weight", "fc.bias",
    }  # fmt: skip
    assert expected <= keys
    assert len(keys) == 122  # torchvision's resnet18 state dict has 122 entries
    assert not any("layer1.0.downsample" in k for k in keys)


def test_dense_matrix_of_factorized_and_dense_agree():
    conv = nn.Conv2d(3, 9, 3)
    fact = FactorizedConv2d.from_dense(conv, rank=9)
    assert torch.allclose(dense_matrix(fact), dense_matrix(conv), atol=1e-5)


def test_the_structure_alone_is_the_truncation_without_its_svds(small_net, monkeypatch):
    """``truncate(weights=False)``: the same layers, ranks, report and train/eval flags as a real truncation,
    with no SVD computed; the real truncation's weights then load into it and give the same outputs."""
    import copy

    import alfa.layers

    real = copy.deepcopy(small_net).train()
    real_report = alfa.truncate(real, rank=4)
    real.eval()

    def no_svd(*args, **kwargs):
        raise AssertionError("an SVD was computed")

    monkeypatch.setattr(alfa.layers, "svd_factors", no_svd)
    shaped = copy.deepcopy(small_net).train()
    report = alfa.truncate(shaped, rank=4, weights=False)
    assert (report.factorized, report.left_dense) == (real_report.factorized, real_report.left_dense)
    assert report.factorized and all(m.training for m in shaped.modules())
    assert {k: v.shape for k, v in shaped.state_dict().items()} == {k: v.shape for k, v in real.state_dict().items()}
    assert alfa.parameter_summary(shaped).total == alfa.parameter_summary(real).total
    shaped.load_state_dict(real.state_dict())
    shaped.eval()
    x = torch.randn(2, 3, 16, 16)
    assert torch.equal(shaped(x), real(x))
    with pytest.raises(AssertionError, match="an SVD was computed"):  # the check can fail: weights=True needs one
        alfa.truncate(copy.deepcopy(small_net), rank=4)


def test_truncating_again_at_another_rank_is_refused_before_anything_changes():
    """A second alfa.truncate at rank 4 gave rank 4 to the one layer left dense at 8 and kept the others at 8,
    reporting only the one."""
    model = nn.Sequential(nn.Linear(32, 32), nn.Linear(32, 32), nn.Linear(32, 3))
    assert str(alfa.truncate(model, 8)).startswith("truncated 2 layers at rank 8")
    ranks = factorized_ranks(model)
    with pytest.raises(ValueError, match=r"^the model is already truncated \(0 at rank 8, 2 layers at another rank"):
        alfa.truncate(model, 4)
    assert factorized_ranks(model) == ranks and isinstance(model[2], nn.Linear)
    other = nn.Sequential(nn.Linear(32, 32), nn.Linear(32, 32))
    alfa.truncate(other, 12, target=["0"])  # other layers by target, each at a rank of its own: as asked
    assert str(alfa.truncate(other, 8, target=["1"])).startswith("truncated 1 layer at rank 8")
    assert factorized_ranks(other) == {"0": 12, "1": 8}
