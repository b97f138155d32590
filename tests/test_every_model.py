"""One test over every registered model (timm's rule): a model the registry lists builds under a seed, predicts, is
truncated (its structure: the SVDs are the truncation tests' subject, and a large model's cost seconds), adapted
with Alfa from a non-trivial init, merged to the outputs it had unmerged, and saved and loaded
back to the same bits. A new ``@register_model`` joins these tests by being registered; one this module cannot size
small fails, naming what to add to :data:`SMALL`."""

from __future__ import annotations

import copy

import distributed_worker  # noqa: F401 — so do the distributed tests': whichever test module was imported first
import pytest
import tiny_models  # noqa: F401 — registers the tests' own small gaze nets: registered models are every model
import torch

import alfa
import alfa.gaze  # noqa: F401 — registers faze_gaze, as a FAZE checkpoint loads wherever a gaze one does
from alfa.checkpoint import load_model, save_model
from alfa.models import create_model, list_models, registry

pytestmark = pytest.mark.usefixtures("one_thread")

#: Each family's quickest build that keeps what tells its named sizes apart (a transformer's width and heads; its
#: depth cut to one block, where the SVDs of a large one cost seconds), and the images it then takes.
_SIZES = ("tiny", "small", "base", "large")
_TOKEN_MODEL = dict(image_size=32, patch_size=8, num_outputs=2, depth=1)
SMALL: dict[str, tuple[dict, int]] = {
    **{f"{family}_{size}": (_TOKEN_MODEL, 32) for family in ("vit", "crate") for size in _SIZES},
    "resnet18_gaze": ({}, 32),
    "faze_gaze": (dict(image_size=32), 32),
    "micro_gaze_net": ({}, 16),
    "tiny_gaze_net": ({}, 16),
    "group_norm_net": ({}, 16),
    "batch_norm_net": ({}, 16),
}
MODELS = list_models()


def _build(name: str, seed: int = 0) -> tuple[torch.nn.Module, dict, torch.Tensor]:
    if name not in SMALL:
        pytest.fail(f"{name} is registered but tests/test_every_model.py's SMALL does not say how to build it small")
    kwargs, size = SMALL[name]
    torch.manual_seed(seed)
    model = create_model(name, **kwargs).eval()
    images = torch.rand(3, 3, size, size, generator=torch.Generator().manual_seed(seed + 1))
    return model, kwargs, images


def test_every_registered_model_is_listed_here_and_every_entry_here_is_registered():
    assert sorted(SMALL) == MODELS


@pytest.mark.parametrize("name", MODELS)
def test_a_registered_model_is_documented_deterministic_and_predicts_a_gaze(name):
    constructor_doc = registry._REGISTRY[name].__doc__  # (the function the decorator registered)
    assert constructor_doc and constructor_doc.strip(), f"{name}'s constructor has no docstring"
    model, _, images = _build(name)
    again, _, _ = _build(name)
    for (key, a), (_, b) in zip(model.state_dict().items(), again.state_dict().items(), strict=True):
        assert torch.equal(a, b), f"{name}: {key} differs between two builds under one seed"
    with torch.no_grad():
        out = model(images)
    assert out.shape == (len(images), 2) and torch.isfinite(out).all()


@pytest.mark.parametrize("name", MODELS)
def test_a_registered_model_truncates_adapts_merges_and_loads_back(name, tmp_path):
    model, kwargs, images = _build(name)
    report = alfa.truncate(model, 4, weights=False)  # the factors as built: random, seeded
    assert report.factorized, f"{name}: no layer was truncated at rank 4"
    base = copy.deepcopy(model)
    alfa.attach(model, alfa.AlfaConfig(heads=2, rank=2))
    with torch.no_grad():  # a non-trivial init: the adapter starts as the identity, which a merge trivially keeps
        for p in alfa.adapter_parameters(model).values():
            p.normal_(0, 0.2)
    model.train()
    model(images).square().sum().backward()
    trainable = alfa.adapter_parameters(model)
    reached = {key for key, p in model.named_parameters() if p.grad is not None}
    assert reached <= set(trainable), sorted(reached - set(trainable))  # no frozen weight gets a gradient
    unreached = sorted(set(trainable) - reached)  # every adapter weight is on the prediction's path but those of
    decoder = ("dted.from_code.", "dted.decoder.")  # FAZE's decoder: it rebuilds images, the gaze MLP reads the code
    assert all(key.startswith(decoder) for key in unreached) if name == "faze_gaze" else not unreached, unreached
    model.eval()
    with torch.no_grad():
        unmerged, before = model(images), base(images)
        assert (unmerged - before).norm() > 1e-4 * before.norm(), f"{name}: the adapter did not move the outputs"
        alfa.merge(model)
        merged = model(images)
    torch.testing.assert_close(merged, unmerged, rtol=1e-4, atol=1e-5)
    path = save_model(tmp_path / "m.safetensors", model, name, kwargs)
    loaded, _ = load_model(path, expect_model=name)
    with torch.no_grad():
        assert torch.equal(loaded.eval()(images), merged)
