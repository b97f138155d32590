"""Many users of a language model in one padded batch: keyword arguments of a served call (the ``attention_mask``,
``position_ids``) reach the base, and every row gets its own user's adapter. Tiny GPT-2 and Llama built from their
configs with random weights; nothing is downloaded."""

from __future__ import annotations

import copy

import pytest
import torch

import alfa
from alfa.adapters import adapter_parameters
from alfa.serve import MixedBatchModel, MultiUserModel

transformers = pytest.importorskip("transformers")

VOCAB, PAD = 100, 0


def _gpt2():
    config = transformers.GPT2Config(
        vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=2, n_positions=32, bos_token_id=PAD, eos_token_id=PAD
    )
    return transformers.GPT2LMHeadModel(config)


def _llama():
    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=32,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(config)


def _users(build, configs):
    torch.manual_seed(0)
    base = build().eval()
    alfa.truncate(base, 8)
    users = {}
    for seed, (name, config) in enumerate(configs.items()):
        model = copy.deepcopy(base)
        torch.manual_seed(seed + 1)
        alfa.attach(model, config)
        with torch.no_grad():
            for p in adapter_parameters(model).values():
                p.normal_(0, 0.2)  # far from the base: a row served with another user's adapter fails the check
        users[name] = model
    return base, users


def _left_padded(lengths, total):
    """Token ids padded on the left to ``total``, their attention mask and the positions of their real tokens."""
    g = torch.Generator().manual_seed(7)
    ids = torch.full((len(lengths), total), PAD)
    mask = torch.zeros(len(lengths), total, dtype=torch.long)
    for i, n in enumerate(lengths):
        ids[i, total - n :] = torch.randint(1, VOCAB, (n,), generator=g)
        mask[i, total - n :] = 1
    positions = (mask.cumsum(-1) - 1).clamp_min(0)
    return ids, mask, positions


def _close(a, b):
    return float((a - b).norm() / b.norm()) < 1e-5


@pytest.mark.parametrize("build", [_gpt2, _llama], ids=["gpt2", "llama"])
def test_a_padded_batch_of_users_gets_each_users_own_outputs_on_their_tokens(build):
    configs = {"ann": alfa.AlfaConfig(heads=2, rank=2), "bob": alfa.LoraConfig(rank=2, alpha=4.0)}
    base, users = _users(build, configs)
    served = MultiUserModel(base)
    for name, model in users.items():
        served.add_user(name, model)
    lengths, rows = (5, 8, 3), ["ann", "bob", None]
    ids, mask, positions = _left_padded(lengths, 8)
    out = served(ids, rows, attention_mask=mask, position_ids=positions).logits
    with torch.no_grad():
        for i, (n, user) in enumerate(zip(lengths, rows)):
            own = (users[user] if user else base)(ids[i : i + 1, 8 - n :]).logits[0]  # that row alone, unpadded
            assert _close(out[i, 8 - n :], own), (i, user)
        unmasked = served(ids, rows).logits  # the mask reaches the base: without it, padding changes the rows
    assert not _close(unmasked[0, 8 - lengths[0] :], out[0, 8 - lengths[0] :])


@pytest.mark.parametrize("build", [_gpt2, _llama], ids=["gpt2", "llama"])
def test_the_mixed_batch_model_takes_the_same_keyword_arguments(build):
    configs = {"ann": alfa.AlfaConfig(heads=2, rank=2), "cy": alfa.AlfaConfig(heads=2, rank=2)}
    base, users = _users(build, configs)
    served = MultiUserModel(base)
    for name, model in users.items():
        served.add_user(name, model)
    mixed = MixedBatchModel(base)
    rows = ["cy", None, "ann"]
    ids, mask, positions = _left_padded((6, 8, 4), 8)
    expected = served(ids, rows, attention_mask=mask, position_ids=positions).logits
    with torch.no_grad():
        got = mixed(ids, *mixed.mixes(served, rows), attention_mask=mask, position_ids=positions).logits
    for i, n in enumerate((6, 8, 4)):
        assert _close(got[i, 8 - n :], expected[i, 8 - n :])
