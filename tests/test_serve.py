"""Many users in one batch on one shared base (alfa.serve): each sample's output equals its user's own model."""

from __future__ import annotations

import copy
import re

import pytest
import torch
from torch import nn

import alfa
from alfa.adapters import adapter_parameters
from alfa.export import merged_copy


@pytest.fixture
def base(small_net):
    alfa.truncate(small_net, rank=6)
    return small_net.eval()


def _user(base, config, seed):
    model = copy.deepcopy(base)
    torch.manual_seed(seed)
    alfa.attach(model, config)
    with torch.no_grad():
        for p in adapter_parameters(model).values():
            p.normal_(0, 0.2)  # a non-trivial adapter: every term matters
    return model


def _close(a, b):
    return float((a - b).norm() / b.norm().clamp_min(1e-12)) < 1e-5


def test_a_mixed_batch_equals_each_users_own_model(base, tmp_path):
    users = {
        "ann": _user(base, alfa.AlfaConfig(heads=2, rank=2), 1),
        "bob": _user(base, alfa.AlfaConfig(heads=2, rank=2), 2),
        "cat": _user(base, alfa.LoraConfig(rank=2), 3),
        "dan": _user(base, alfa.MosloraConfig(rank=3), 4),
        "eve": _user(base, alfa.DiagGateConfig(), 5),
    }
    served = alfa.MultiUserModel(base)
    for name, model in users.items():
        if name == "bob":  # from a compact file (one d×d mix per layer)
            served.add_user(name, alfa.save_adapter(model, tmp_path / "bob.safetensors", compact=True))
        elif name == "cat":  # from a plain adapter file
            served.add_user(name, alfa.save_adapter(model, tmp_path / "cat.safetensors"))
        else:
            served.add_user(name, model)
    order = ["ann", "cat", "bob", "ann", None, "dan", "eve", "cat"]  # mixed, repeated, one base request
    x = torch.randn(len(order), 3, 16, 16, generator=torch.Generator().manual_seed(0))
    out = served(x, order)
    with torch.no_grad():
        for i, name in enumerate(order):
            own = (users[name] if name else base)(x[i : i + 1])
            assert _close(out[i : i + 1], own), name
            if name:  # ... which is also the merged model's output
                merged = copy.deepcopy(users[name])
                alfa.merge(merged, extend=True)
                assert _close(out[i : i + 1], merged(x[i : i + 1])), name
    # a user's terms are d×d per layer for a dictionary method: nothing of the base is copied
    d2 = sum(m.rank**2 for m in base.modules() if alfa.layers.is_factorized(m))
    assert served.user_bytes("ann") == 4 * d2

    # removing a user changes nobody else's outputs; an unknown user is refused
    served.remove_user("bob")
    keep = [i for i, u in enumerate(order) if u != "bob"]
    again = served(x[keep], [order[i] for i in keep])
    assert torch.allclose(again, out[keep], rtol=1e-6, atol=1e-7)
    with pytest.raises(KeyError, match="unknown user"):
        served(x[:1], ["bob"])
    with pytest.raises(ValueError, match="2 images but 1 user ids"):
        served(x[:2], ["ann"])
    with pytest.raises(ValueError, match="already served"):
        served.add_user("ann", users["ann"])


@pytest.mark.parametrize("order", [["cat"] * 3, [None, "cat", "ann", "cat"], ["cat", "dan", "cat", None]])
def test_a_batch_of_one_or_two_low_rank_users_equals_their_merged_models(base, order):
    """A batch whose low-rank samples are all one user's runs that user's two factors as plain ops (no per-sample
    gather), on all the batch or on some of it, and two users run the batched path: each output is its user's
    merged model's, and a base sample's is the base's."""
    users = {
        "ann": _user(base, alfa.AlfaConfig(heads=2, rank=2), 1),
        "cat": _user(base, alfa.LoraConfig(rank=2), 3),
        "dan": _user(base, alfa.MosloraConfig(rank=3), 4),
    }
    served = alfa.MultiUserModel(base)
    for name, model in users.items():
        served.add_user(name, model)
    x = torch.randn(len(order), 3, 16, 16, generator=torch.Generator().manual_seed(0))
    out = served(x, order)
    with torch.no_grad():
        for i, name in enumerate(order):
            own = merged_copy(users[name], "extend") if name else base
            assert _close(out[i : i + 1], own(x[i : i + 1])), (order, i)


def test_methods_that_change_the_shared_weight_are_refused(base, tmp_path):
    served = alfa.MultiUserModel(base)
    for config, match in [
        (alfa.PissaConfig(rank=2), "changes the shared weight"),
        (alfa.DoraConfig(rank=2), "changes the shared weight"),
        (alfa.FullFinetuneConfig(), "adapts the whole model"),
    ]:
        with pytest.raises(ValueError, match=match):
            served.add_user("x", _user(base, config, 0))
    assert served.users == []
    other = copy.deepcopy(base)
    with torch.no_grad():
        other.conv2.V.add_(0.1)  # another base: the file check refuses it
    path = alfa.save_adapter(_user(other, alfa.AlfaConfig(heads=2, rank=2), 0), tmp_path / "o.safetensors")
    with pytest.raises(alfa.adapters.AdapterFileError, match="different base"):
        served.add_user("x", path)
    with pytest.raises(alfa.adapters.AdapterFileError, match="different base"):  # a model is checked the same way
        served.add_user("x", _user(other, alfa.AlfaConfig(heads=2, rank=2), 0))


# test_crate_models' smallest sizes: 2×2 patches + the class token = 5 tokens of 32 channels, two blocks
TOKEN_SIZES = dict(image_size=16, patch_size=8, num_classes=2, dim=32, depth=2, heads=4)


def _users_match_their_merged_models(base, users, order, x):
    """Serve ``users`` in one batch ordered by ``order``; each sample must equal its user's merged model, and every
    user must move the output well past the tolerance (else a mix on the wrong axis could go unnoticed)."""
    served = alfa.MultiUserModel(base)
    for name, model in users.items():
        served.add_user(name, model)
    out = served(x, order)
    with torch.no_grad():
        for i, name in enumerate(order):
            merged = copy.deepcopy(users[name]) if name else base
            if name:
                alfa.merge(merged, extend=True)
                assert not _close(base(x[i : i + 1]), merged(x[i : i + 1])), f"{name} is too close to the base"
            assert _close(out[i : i + 1], merged(x[i : i + 1])), name
    return served, out


@pytest.mark.parametrize("name", ["crate_tiny", "vit_tiny"])
def test_a_token_model_serves_each_user_as_their_merged_model(name):
    """Linear layers on batch × tokens × channels: each user's mix acts on the channels, never on the tokens."""
    from alfa.serve import MixedBatchModel

    torch.manual_seed(0)
    base = alfa.models.create_model(name, **TOKEN_SIZES).eval()
    alfa.truncate(base, rank=8)
    users = {
        "ann": _user(base, alfa.AlfaConfig(heads=2, rank=2), 1),
        "bob": _user(base, alfa.AlfaConfig(heads=2, rank=2), 2),
        "cat": _user(base, alfa.LoraConfig(rank=2), 3),
        "dan": _user(base, alfa.LoraConfig(rank=2), 4),
    }
    order = ["ann", "cat", None, "bob", "dan", "ann"]
    x = torch.randn(len(order), 3, 16, 16, generator=torch.Generator().manual_seed(0))
    served, out = _users_match_their_merged_models(base, users, order, x)
    # the export form (each layer's mix an input) agrees for the dictionary users
    dictionary = [i for i, u in enumerate(order) if u not in ("cat", "dan")]
    mixed = MixedBatchModel(base)
    with torch.no_grad():
        exported = mixed(x[dictionary], *mixed.mixes(served, [order[i] for i in dictionary]))
    assert torch.allclose(exported, out[dictionary], rtol=1e-6, atol=1e-7)
    # what a shared token base cannot serve is refused as on a conv base, in one line
    for config in (alfa.PissaConfig(rank=2), alfa.DoraConfig(rank=2)):
        with pytest.raises(ValueError, match="changes the shared weight itself") as refused:
            served.add_user("x", _user(base, config, 0))
        assert "\n" not in str(refused.value)
    assert "x" not in served.users


def test_a_linear_layer_on_more_token_dimensions_mixes_the_channels():
    """Two token dimensions of size d = 4 between the batch and the channels: a mix contracted over the first
    dimension after the batch would run without error here, and give other numbers."""
    torch.manual_seed(0)
    base = nn.Sequential(nn.Linear(12, 12), nn.Flatten(1), nn.Linear(4 * 4 * 12, 2)).eval()
    alfa.truncate(base, rank=4)
    assert base[0].rank == 4
    users = {
        "ann": _user(base, alfa.AlfaConfig(heads=2, rank=2), 1),
        "cat": _user(base, alfa.LoraConfig(rank=2), 2),
        "eve": _user(base, alfa.DiagGateConfig(), 3),
    }
    order = ["eve", "ann", None, "cat", "ann"]
    x = torch.randn(len(order), 4, 4, 12, generator=torch.Generator().manual_seed(1))
    _users_match_their_merged_models(base, users, order, x)


def test_serving_refuses_what_it_would_get_silently_wrong(base, tmp_path):
    """A calibrated user whose correction is on a dense head has no mix to hand in (their prediction would be the
    base's), mixes of another batch size would be broadcast, and a served model in train mode would move the
    shared BatchNorm statistics: each is refused, by name."""
    from alfa.serve import MixedBatchModel, MultiUserModel

    served = MultiUserModel(base)
    calibrated = copy.deepcopy(base)
    head = [n for n, m in calibrated.named_modules() if isinstance(m, torch.nn.Linear)][-1]
    alfa.attach(calibrated, alfa.CorrectionConfig(target=[head], layers="dense"))
    served.add_user("cal", calibrated)
    gated = copy.deepcopy(base)
    alfa.attach(gated, alfa.DiagGateConfig())
    served.add_user("ann", gated)
    mixed = MixedBatchModel(base)
    with pytest.raises(ValueError, match=rf"user 'cal' adapts {head}, which is no factorized layer"):
        mixed.mixes(served, ["cal", "ann"])
    images = torch.randn(3, 3, 16, 16)
    with pytest.raises(ValueError, match=r"the mix is \(1, \d+, \d+\), expected \(3, \d+, \d+\)"):
        mixed(images, *mixed.mixes(served, ["ann"]))
    assert mixed(images, *mixed.mixes(served, ["ann", None, "ann"])).shape == (3, 2)
    served.train()
    with pytest.raises(RuntimeError, match=r"MultiUserModel serves in eval mode: call \.eval\(\)"):
        served(images, ["ann", None, "cal"])
    with pytest.raises(RuntimeError, match=r"MixedBatchModel serves in eval mode: call \.eval\(\)"):
        mixed.train()(images, *mixed.mixes(served, ["ann", None, "ann"]))
    mixed.eval()
    served.eval()
    assert served(images, ["ann", None, "cal"]).shape == (3, 2)


class _Attending(nn.Module):
    """Tokens through nn.MultiheadAttention, which computes with its out_proj's ``.weight`` and never calls it."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(8, 32)
        self.attention = nn.MultiheadAttention(32, 2, batch_first=True)
        self.head = nn.Linear(32, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        return self.head(self.attention(h, h, h, need_weights=False)[0].mean(1))


def test_a_layer_the_model_reads_by_its_weight_serves_the_base_and_refuses_a_users_term_there():
    """A served layer had no ``.weight``: a model that reads it (nn.MultiheadAttention, transformers' ViT) failed
    even for the base's samples; a user's term on such a layer would be silently left out, and is refused."""
    torch.manual_seed(0)
    base = _Attending().eval()
    alfa.truncate(base, rank=4, target=r"^(embed|attention\.out_proj)$")
    x = torch.randn(3, 5, 8)
    served = alfa.MultiUserModel(base)
    with torch.no_grad():
        assert torch.allclose(served(x, [None] * 3), base(x), atol=1e-6)
    ann = _user(base, alfa.LoraConfig(rank=2, target=["embed"]), 1)
    served.add_user("ann", ann)
    served.add_user("bob", _user(base, alfa.LoraConfig(rank=2, target=["attention.out_proj"]), 2))
    with torch.no_grad():
        assert _close(served(x, ["ann"] * 3), ann(x))
    with pytest.raises(
        RuntimeError, match=r"^attention\.out_proj: the model computes with its \.weight directly .*\['bob'\]"
    ):
        served(x, ["ann", "bob", None])


def test_a_served_model_cast_or_moved_serves_its_users_in_the_new_dtype_and_holds_the_base_once(base):
    users = {"ann": _user(base, alfa.AlfaConfig(heads=2, rank=2), 1), "cat": _user(base, alfa.LoraConfig(rank=2), 3)}
    served = alfa.MultiUserModel(base)
    served.add_user("ann", users["ann"])
    served.double()  # the terms are no buffers: they once stayed float32, and the next batch failed
    served.add_user("cat", users["cat"])  # added after the cast: in float64 too
    x = torch.randn(2, 3, 16, 16, dtype=torch.float64)
    out = served(x, ["ann", "cat"])
    with torch.no_grad():
        for i, name in enumerate(["ann", "cat"]):
            assert _close(out[i : i + 1], copy.deepcopy(users[name]).double()(x[i : i + 1]))
    assert len(served.state_dict()) == len(base.state_dict())  # the file-checking copy of the base is not in it


def test_a_layer_given_the_tokens_first_is_named_with_the_batch_it_expected():
    class TimeFirst(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(16, 16)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x.transpose(0, 1)).mean(0)

    base = TimeFirst().eval()
    alfa.truncate(base, rank=4)
    with pytest.raises(RuntimeError, match="^fc was given an input whose first axis is 5, not the batch of 3: Multi"):
        alfa.MultiUserModel(base)(torch.randn(3, 5, 16), [None] * 3)


def test_a_user_from_a_model_inside_disable_adapters_is_refused_in_one_line(base):
    """Inside the block the model holds its base layers: there was nothing to read, and an AttributeError came out."""
    served = alfa.MultiUserModel(base)
    model = _user(base, alfa.AlfaConfig(heads=2, rank=2), 1)
    with alfa.disable_adapters(model):
        with pytest.raises(RuntimeError, match=r"cannot add a user from a model inside alfa\.disable_adapters"):
            served.add_user("ann", model)
    assert served.users == []
    served.add_user("ann", model)  # after the block, served as usual
    assert served.users == ["ann"]


def test_what_serve_refusal_says_of_a_method_is_what_a_user_of_it_meets(base):
    """serve_refusal (what alfa calibrate and alfa personalize say before they adapt anyone) agrees, method by
    method, with what MultiUserModel does with a user of it on a truncated base."""
    from adapter_settings import SMALL

    from alfa.adapters import METHODS, TPGazeConfig
    from alfa.serve import serve_refusal

    for name, cls in METHODS.items():
        config = TPGazeConfig.for_model(base, 16) if cls is TPGazeConfig else cls(**SMALL.get(name, {}))
        refusal = serve_refusal(cls)
        served = alfa.MultiUserModel(base)
        if refusal is None:
            served.add_user("u", _user(base, config, 0))
        else:
            with pytest.raises(ValueError, match=re.escape(refusal)):
                served.add_user("u", _user(base, config, 0))


@pytest.mark.parametrize("cls", ["MultiUserModel", "MixedBatchModel"])
def test_a_base_that_is_no_module_or_a_compiled_wrapper_is_refused_up_front(base, cls):
    from alfa import serve

    make = getattr(serve, cls)
    for given, what in (("base.safetensors", "a str"), (nn.Sequential, "the class Sequential")):
        with pytest.raises(TypeError, match=rf"takes a torch.nn.Module \(a model instance\), got {what}"):
            make(given)
    with pytest.raises(TypeError) as refused:
        make(torch.compile(base, backend="eager"))
    message = str(refused.value)
    assert "torch.compile wrapper" in message and "give the uncompiled module (base._orig_mod)" in message
    assert f"torch.compile(alfa.{'serve.' * (cls != 'MultiUserModel')}{cls}(base))" in message
    assert "load_adapter" not in message  # it names what the caller did, not a function they never called


def test_the_multi_user_model_compiled_serves_each_user_as_uncompiled(base):
    """What the refusal of a compiled base advises: compiling the served model works, for any list of users."""
    served = alfa.MultiUserModel(base)
    served.add_user("ann", _user(base, alfa.AlfaConfig(heads=2, rank=2), 1))
    served.add_user("bob", _user(base, alfa.LoraConfig(rank=2), 2))
    compiled = torch.compile(served, backend="eager")
    x = torch.rand(3, 3, 16, 16)
    for users in (["ann", "bob", None], ["bob", None, "ann"], ["ann", "bob", None]):
        assert _close(compiled(x, users), served(x, users))
