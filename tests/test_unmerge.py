"""``alfa.unmerge``: undoing a merge exactly where the merge form allows it, and refusing where it does not.

Every registered method runs on the small test net, dense and truncated, from a non-trivial adapter (its
parameters perturbed, so that its update is not zero): where the merge form is one unmerge can undo
(``UNMERGE_FORMS``), merge → unmerge gives back the adapted model's outputs and a trainable adapter;
elsewhere unmerge (or merge itself) refuses with a ``MergeError`` and changes nothing.
"""

from __future__ import annotations

import copy

import pytest
import torch
from adapter_settings import IMAGE, small_config
from torch import nn

import alfa
from alfa.adapters import METHODS, UNMERGE_FORMS, MergeError, adapted_layers


def _perturbed(model: nn.Module) -> nn.Module:
    with torch.no_grad():
        for p in alfa.adapter_parameters(model).values():
            p.add_(torch.randn_like(p) * 0.1)
    return model


def _adapted(small_net: nn.Module, method: str, kind: str) -> nn.Module:
    if kind == "truncated":
        alfa.truncate(small_net, rank=6)
    model = copy.deepcopy(small_net)
    alfa.attach(model, small_config(method, model))
    return _perturbed(model)


@pytest.fixture
def x() -> torch.Tensor:
    return torch.randn(2, 3, IMAGE, IMAGE)


def _gradients_reach_exactly_the_adapter(model: nn.Module, x: torch.Tensor) -> None:
    adapter = alfa.adapter_parameters(model)
    assert adapter and {n for n, p in model.named_parameters() if p.requires_grad} == set(adapter)
    model.zero_grad(set_to_none=True)
    model(x).square().sum().backward()
    for name, p in model.named_parameters():
        assert (p.grad is not None) == (name in adapter), name


@pytest.mark.parametrize("kind", ["truncated", "dense"])
@pytest.mark.parametrize("method", list(METHODS))
def test_unmerge_undoes_merge_where_the_form_allows_it(method, kind, small_net, x):
    model = _adapted(small_net, method, kind)
    with torch.no_grad():
        base_out, out = small_net(x), model(x)
    assert not torch.allclose(out, base_out, atol=1e-4), "the perturbed adapter must change the outputs"
    form = alfa.merge_form(model)
    layers = adapted_layers(model)
    # Which forms unmerge undoes, by merge kind: all but a low-rank update of a factorized layer (and prompts).
    low_rank_on_factors = any(m.merge_kind == "low-rank" and m.base_is_factorized for m in layers.values())
    prompts = any(m.merge_kind == "none" for m in layers.values())
    assert (form in UNMERGE_FORMS) == (not low_rank_on_factors and not prompts)
    if prompts:
        with pytest.raises(MergeError):
            alfa.merge(model)
        with pytest.raises(MergeError, match="no merge to undo"):
            alfa.unmerge(model)
        return
    if form not in UNMERGE_FORMS:
        alfa.merge(model, densify=True)
        merged_out = model(x).detach()
        with pytest.raises(MergeError, match="cannot unmerge: .* of its factorized layers densely"):
            alfa.unmerge(model)
        assert alfa.adapter_state(model) is None and torch.equal(model(x), merged_out)  # nothing changed
        return

    names = list(alfa.adapters.adapter_tensors(model))
    targets = alfa.merge(model)
    assert alfa.adapter_state(model) is None
    assert torch.allclose(model(x), out, rtol=1e-4, atol=1e-5)  # the merge itself is right
    assert alfa.unmerge(model) == targets
    assert alfa.active_adapter(model) == alfa.DEFAULT_ADAPTER and alfa.merge_form(model) == form
    assert list(alfa.adapters.adapter_tensors(model)) == names
    with torch.no_grad():
        torch.testing.assert_close(model(x), out, rtol=0, atol=0)  # the adapted model, bit for bit
    _gradients_reach_exactly_the_adapter(model, x)
    # The adapter is an ordinary attached one again: it merges again, and detach gives back the base.
    again = copy.deepcopy(model)
    alfa.merge(again)
    torch.testing.assert_close(again(x), out, rtol=1e-4, atol=1e-5)
    alfa.detach(model)
    assert torch.equal(model(x), base_out) and not hasattr(model, "_alfa_adapters")


def test_a_densified_or_extended_merge_cannot_be_undone(small_net, x):
    alfa.truncate(small_net, rank=6)
    for options, how in (({"densify": True}, "densely"), ({"extend": True}, "in new factors")):
        model = copy.deepcopy(small_net)
        alfa.attach(model, alfa.LoraConfig(rank=2), name="ann")
        alfa.merge(model, **options)
        with pytest.raises(MergeError) as refused:
            alfa.unmerge(model)
        message = str(refused.value)
        assert message.startswith("cannot unmerge: merging the lora adapter 'ann' stored the low-rank update of its")
        assert f"factorized layers {how}" in message
        assert "merge keeps no copy of the base layers" in message and message.count(". ") == 0  # one sentence


def test_unmerge_needs_a_merge_to_undo(small_net):
    with pytest.raises(MergeError, match="no merge to undo"):
        alfa.unmerge(small_net)
    alfa.attach(small_net, alfa.LoraConfig(rank=2))
    with pytest.raises(MergeError, match="no merge to undo"):  # attached, not merged
        alfa.unmerge(small_net)
    alfa.merge(small_net)
    alfa.unmerge(small_net)
    with pytest.raises(MergeError, match="no merge to undo"):  # only the last merge, once
        alfa.unmerge(small_net)


def test_attaching_to_the_merged_model_makes_the_merge_final(small_net, x):
    alfa.attach(small_net, alfa.LoraConfig(rank=2))
    _perturbed(small_net)
    alfa.merge(small_net)
    alfa.attach(small_net, alfa.AlfaConfig(heads=2, rank=2), name="next")
    alfa.detach(small_net)
    with pytest.raises(MergeError, match="no merge to undo"):
        alfa.unmerge(small_net)


def test_unmerge_refuses_to_discard_changes_made_after_the_merge(small_net, x):
    alfa.attach(small_net, alfa.LoraConfig(rank=2))
    _perturbed(small_net)
    out = small_net(x).detach()
    alfa.merge(small_net)
    copied = copy.deepcopy(small_net)  # a copy of the merged model can be unmerged too
    alfa.unmerge(copied)
    assert torch.equal(copied(x), out)

    trained = copy.deepcopy(small_net)
    with torch.no_grad():
        trained.fc1.weight.add_(1.0)  # e.g. fine-tuning the merged model
    through_data = copy.deepcopy(small_net)
    through_data.fc1.weight.data.mul_(2)  # .data: no version count sees it
    assigned = copy.deepcopy(small_net)
    state = {k: v.clone() for k, v in assigned.state_dict().items()}
    state["fc1.weight"] = state["fc1.weight"] * 2
    assigned.load_state_dict(state, assign=True)  # new tensors, their counts at 0 as the merge's were
    swapped = copy.deepcopy(small_net)
    swapped.fc1.weight.data[[0, 1]] = swapped.fc1.weight.data[[1, 0]]  # both plain sums and the squares' unchanged
    neighbours = copy.deepcopy(small_net)
    neighbours.fc1.weight.data[0, [0, 1]] = neighbours.fc1.weight.data[0, [1, 0]]  # two values side by side
    for changed in (trained, copy.deepcopy(trained), through_data, assigned, swapped, neighbours):
        with pytest.raises(MergeError, match="the weights of fc1 changed after the merge"):
            alfa.unmerge(changed)
    replaced = copy.deepcopy(small_net)
    alfa.truncate(replaced, rank=6)  # allowed on a merged model; it replaces the merged layers
    with pytest.raises(MergeError, match="no longer the module the merge left there"):
        alfa.unmerge(replaced)
    merged_out = replaced(x).detach()
    assert alfa.adapter_state(replaced) is None and torch.equal(replaced(x), merged_out)


def test_unmerge_puts_back_the_modules_to_save_copy_and_the_adapter_name(small_net, x):
    original_fc2 = small_net.fc2
    base_out = small_net(x).detach()
    alfa.attach(small_net, alfa.LoraConfig(rank=2, target=["conv3"], modules_to_save=["fc2"]), name="bob")
    _perturbed(small_net)
    out = small_net(x).detach()
    alfa.merge(small_net)
    assert alfa.unmerge(small_net) == ["conv3"]
    assert alfa.adapter_names(small_net) == ["bob"] and small_net.fc2 is not original_fc2
    assert torch.equal(small_net(x), out)
    _gradients_reach_exactly_the_adapter(small_net, x)
    assert any(n.startswith("fc2.") for n in alfa.adapter_parameters(small_net))
    alfa.detach(small_net)
    assert small_net.fc2 is original_fc2 and torch.equal(small_net(x), base_out)


def test_unmerge_follows_the_merged_model_to_another_dtype(small_net, x):
    alfa.attach(small_net, alfa.AlfaConfig(heads=2, rank=2, layers="dense"))
    _perturbed(small_net)
    alfa.merge(small_net)
    small_net.double()
    alfa.unmerge(small_net)
    assert all(p.dtype == torch.float64 for p in small_net.parameters())
    assert small_net(x.double()).dtype == torch.float64


def test_the_adapter_book_keeping_is_one_object_on_the_model(small_net):
    before = set(vars(small_net))
    alfa.attach(small_net, alfa.LoraConfig(rank=2), name="ann")
    alfa.attach(small_net, alfa.LoraConfig(rank=2), name="bob")
    added = {k for k in set(vars(small_net)) - before if k != "save_pretrained"}
    assert added == {"_alfa_adapters"}
    registry = small_net._alfa_adapters
    assert isinstance(registry, alfa.adapters.ModelAdapters) and list(registry.adapters) == ["ann", "bob"]
    assert registry.active == "bob"
    with alfa.disable_adapters(small_net):
        assert registry.disabled and set(vars(small_net)) - before == added
    alfa.detach(small_net)
    assert set(vars(small_net)) == before


def test_unmerge_takes_the_same_weights_in_another_layout_or_thread_count():
    """A float64 sum of the same values moves in its last bits with the thread count and the memory layout: no
    change of the weights, and no refusal."""
    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Conv2d(3, 512, 3), torch.nn.Conv2d(512, 512, 3)).eval()
    threads = torch.get_num_threads()
    try:
        for move in ("threads", "channels_last"):
            torch.set_num_threads(2)
            model = copy.deepcopy(base)
            alfa.attach(model, alfa.LoraConfig(rank=2))
            alfa.merge(model)
            if move == "threads":
                torch.set_num_threads(1)
            else:
                model = model.to(memory_format=torch.channels_last)
            alfa.unmerge(model)
            assert alfa.adapter_state(model) is not None
    finally:
        torch.set_num_threads(threads)
