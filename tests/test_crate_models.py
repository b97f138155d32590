import math

import pytest
import torch
from torch import nn

import alfa
from alfa.models.crate import CRATE, CrateBlock, ISTABlock, MultiHeadSubspaceSelfAttention
from alfa.models.vit import PatchEmbedding, VisionTransformer

pytestmark = pytest.mark.usefixtures("one_thread")


def _count(name: str, **kwargs) -> int:
    with torch.device("meta"):  # no memory, no init cost: only shapes matter
        model = alfa.models.create_model(name, **kwargs)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize(
    "name, exact, millions",
    [
        ("crate_tiny", 6_090_856, "6.09"),
        ("crate_small", 13_116_328, "13.12"),
        ("crate_base", 22_796_008, "22.80"),
        ("crate_large", 77_641_192, "77.64"),
    ],
)
def test_crate_parameter_counts_match_the_paper(name, exact, millions):
    count = _count(name)
    assert count == exact
    assert f"{count / 1e6:.2f}" == millions


@pytest.mark.parametrize(
    "name, millions", [("vit_tiny", "22.05"), ("vit_small", "49.00"), ("vit_base", "86.57"), ("vit_large", "304.33")]
)
def test_vit_parameter_counts_as_documented(name, millions):
    assert f"{_count(name) / 1e6:.2f}" == millions


def test_mssa_one_head_identity_subspace_matches_the_formula():
    torch.manual_seed(0)
    p = 3  # four tokens below
    attn = MultiHeadSubspaceSelfAttention(dim=p, heads=1)
    with torch.no_grad():
        attn.subspaces.weight.copy_(torch.eye(p))
        attn.proj.weight.copy_(torch.eye(p))
        attn.proj.bias.zero_()
    Z = torch.tensor([[1.0, 0.0, -1.0, 0.5], [0.0, 2.0, 1.0, 0.5], [0.5, -0.5, 0.0, 1.0]])  # p × n, tokens as columns
    # spec: SSA = w · softmax(wᵀ w / √q), w = Uᵀ z = z, softmax over each column
    expected = Z @ torch.softmax(Z.T @ Z / math.sqrt(p), dim=0)
    out = attn(Z.T.unsqueeze(0))[0]  # the module takes tokens as rows
    torch.testing.assert_close(out, expected.T)
    # and the output projection is applied after the heads, with its bias
    with torch.no_grad():
        attn.proj.bias.copy_(torch.tensor([1.0, 2.0, 3.0]))
    torch.testing.assert_close(attn(Z.T.unsqueeze(0))[0], expected.T + torch.tensor([1.0, 2.0, 3.0]))


def test_mssa_heads_use_their_own_subspace():
    torch.manual_seed(1)
    attn = MultiHeadSubspaceSelfAttention(dim=4, heads=2)
    x = torch.randn(2, 5, 4)
    U = attn.subspaces.weight  # rows 0-1: U_1ᵀ, rows 2-3: U_2ᵀ
    heads = []
    for k in range(2):
        w = x @ U[2 * k : 2 * k + 2].T  # (b, n, q)
        heads.append(torch.softmax(w @ w.transpose(1, 2) / math.sqrt(2), dim=-1) @ w)
    expected = attn.proj(torch.cat(heads, dim=-1))
    torch.testing.assert_close(attn(x), expected)


def test_ista_block_matches_the_formula():
    torch.manual_seed(2)
    block = ISTABlock(dim=3, step=0.1, lam=0.1)
    D = torch.tensor([[1.0, 0.5, 0.0], [0.0, 1.0, -0.5], [0.25, 0.0, 2.0]])
    with torch.no_grad():
        block.dictionary.copy_(D)
    x = torch.tensor([0.3, -1.2, 0.8])
    expected = torch.relu(x + 0.1 * D.T @ (x - D @ x) - 0.1 * 0.1)
    torch.testing.assert_close(block(x[None, None])[0, 0], expected)
    # hand check of one coordinate: D x = (-0.3, -1.6, 1.675); x - Dx = (0.6, 0.4, -0.875)
    assert expected[0].item() == pytest.approx(0.3 + 0.1 * (1.0 * 0.6 + 0.25 * -0.875) - 0.01)
    assert (block(torch.randn(4, 7, 3)) >= 0).all()


def test_crate_block_wiring_residual_around_mssa_only():
    torch.manual_seed(3)
    block = CrateBlock(dim=8, heads=2)
    z = torch.randn(2, 5, 8)
    middle = z + block.attn(block.norm1(z))
    torch.testing.assert_close(block(z), block.ista(block.norm2(middle)))


def test_patchify_order_is_rows_of_patches_then_pixels_then_channels():
    embed = PatchEmbedding(image_size=(4, 6), patch_size=2, channels=3, dim=5)
    images = torch.arange(2 * 3 * 4 * 6, dtype=torch.float32).reshape(2, 3, 4, 6)
    patches = embed.patchify(images)
    assert patches.shape == (2, 6, 12)
    # patch 4 = grid row 1, column 1 → pixels rows 2-3, cols 2-3; order (p1 p2 c)
    expected = images[1, :, 2:4, 2:4].permute(1, 2, 0).reshape(-1)
    torch.testing.assert_close(patches[1, 4], expected)


@pytest.mark.parametrize("name", ["crate_tiny", "vit_tiny"])
def test_other_image_sizes_and_a_regression_head(name):
    model = alfa.models.create_model(name, image_size=(32, 48), patch_size=8, num_outputs=2, depth=2)
    assert model.front.pos_embed.shape == (1, 1 + 4 * 6, 384)
    out = model(torch.randn(3, 3, 32, 48))
    assert out.shape == (3, 2)
    assert model.features(torch.randn(1, 3, 32, 48)).shape == (1, 384)
    same = alfa.models.create_model(name, image_size=32, patch_size=8, num_classes=2, depth=1)
    assert same.head.out_features == 2


def test_bad_sizes_get_clear_errors():
    with pytest.raises(ValueError, match="not divisible by the patch size"):
        alfa.models.create_model("crate_tiny", image_size=30, patch_size=8)
    model = alfa.models.create_model("crate_tiny", image_size=32, patch_size=8, num_classes=2, depth=1)
    with pytest.raises(ValueError, match=r"expected images of shape \(batch, 3, 32, 32\)"):
        model(torch.randn(1, 3, 64, 64))
    with pytest.raises(ValueError, match="disagree"):
        alfa.models.create_model("vit_tiny", num_classes=10, num_outputs=2)
    with pytest.raises(ValueError, match="not divisible by heads"):
        MultiHeadSubspaceSelfAttention(dim=10, heads=3)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["crate_tiny", "vit_tiny"])
def test_alfa_attaches_to_the_linear_layers(name):
    torch.manual_seed(4)
    # crate_tiny exactly as a user would; the ViT two layers deep to keep the SVDs few
    small = {} if name == "crate_tiny" else {"depth": 2}
    model = alfa.models.create_model(name, image_size=32, patch_size=8, num_classes=2, **small)
    images = torch.randn(2, 3, 32, 32)
    report = alfa.truncate(model, rank=16)
    assert "blocks.0.attn.proj" in report.factorized
    assert ("blocks.0.attn.subspaces" if name == "crate_tiny" else "blocks.0.attn.qkv") in report.factorized
    before = model(images).detach()
    names = alfa.attach(model, alfa.AlfaConfig(heads=2, rank=2))
    assert set(report.factorized) <= set(names)
    # the adapter starts as the identity, then trains: only adapter tensors get gradients
    torch.testing.assert_close(model(images), before)
    model(images).square().sum().backward()
    adapter = alfa.adapter_parameters(model)
    assert adapter and all(p.grad is not None for p in adapter.values())
    frozen = [p for n, p in model.named_parameters() if n not in adapter]
    assert all(p.grad is None for p in frozen)
    if name == "crate_tiny":  # the ISTA dictionary is a raw parameter: neither truncated nor adapted
        assert isinstance(model.blocks[0].ista.dictionary, nn.Parameter)
        assert not any("ista" in n for n in names)


def test_constructors_take_size_overrides_and_are_deterministic_under_a_seed():
    small = dict(image_size=16, patch_size=8, num_classes=2, dim=32, depth=2, heads=4)
    torch.manual_seed(5)
    a = alfa.models.create_model("crate_tiny", **small)
    torch.manual_seed(5)
    b = alfa.models.create_model("crate_tiny", **small)
    assert isinstance(a, CRATE) and len(a.blocks) == 2 and a.blocks[0].attn.head_dim == 8
    assert isinstance(alfa.models.create_model("vit_base", **small), VisionTransformer)
    x = torch.randn(2, 3, 16, 16)
    assert torch.equal(a(x), b(x))
