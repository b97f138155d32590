"""alfa on Hugging Face transformers models: GPT-2's Conv1D layers, the attributes model code reads off a layer
(ViT reads its patch embedding's ``weight.dtype``), tied parameters, and transformers' own
``save_pretrained``/``from_pretrained``. Every model is built from a tiny config with random weights; nothing is
downloaded."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

import alfa
from alfa.adapters import METHODS, AdaptedLayer, MergeError, TPGazeConfig, adapted_layers
from alfa.layers import FactorizedConv2d, FactorizedLinear, is_conv1d, is_factorized
from alfa.surgery import LayerWrapper, UnsupportedSaveError, replace_module, shared_parameters

transformers = pytest.importorskip("transformers")
from transformers.pytorch_utils import Conv1D  # noqa: E402

RANK = 8
LAYER_METHODS = [m for m, cls in METHODS.items() if cls.scope == "layer" and cls is not TPGazeConfig]
SMALL = {"alfa": {"heads": 2, "rank": 2}, "linear_mix": {"rank": 2}, "spectral": {"rank": 2}, "flora": {"rank": 2}}
for _m in ("lora", "pissa", "milora", "moslora", "dora"):
    SMALL[_m] = {"rank": 2, "alpha": 4.0}


def _gpt2() -> nn.Module:
    config = transformers.GPT2Config(
        n_embd=32, n_layer=2, n_head=2, vocab_size=100, n_positions=32, bos_token_id=0, eos_token_id=0
    )
    return transformers.GPT2LMHeadModel(config).eval()


def _vit() -> nn.Module:
    config = transformers.ViTConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        image_size=16,
        patch_size=4,
        num_labels=3,
    )
    return transformers.ViTForImageClassification(config).eval()


def _llama() -> nn.Module:
    config = transformers.LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        vocab_size=100,
        max_position_embeddings=32,
    )
    return transformers.LlamaForCausalLM(config).eval()


def _bert() -> nn.Module:
    config = transformers.BertConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, vocab_size=100,
        max_position_embeddings=32,
    )  # fmt: skip
    return transformers.BertModel(config).eval()


MODELS = {"gpt2": _gpt2, "vit": _vit, "llama": _llama, "bert": _bert}


def _inputs(kind: str) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    if kind == "vit":
        return {"pixel_values": torch.randn(2, 3, 16, 16, generator=g)}
    return {"input_ids": torch.randint(0, 100, (2, 7), generator=g)}


def _out(model: nn.Module, kind: str) -> torch.Tensor:
    with torch.no_grad():
        return model(**_inputs(kind))[0]


def _count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # each tied tensor once


def _randomized(model: nn.Module) -> nn.Module:
    with torch.no_grad():
        for p in alfa.adapter_parameters(model).values():
            p.add_(torch.randn_like(p) * 0.05)
    return model


def _conv1d_names(model: nn.Module) -> list[str]:
    return [n for n, m in model.named_modules() if isinstance(m, Conv1D)]


# ---------------------------------------------------------------------------------------------------------------
# Conv1D: truncation, every method, merge, adapter files


@pytest.mark.slow
def test_alfa_never_imports_transformers():
    # With transformers unimportable, alfa imports and runs on plain torch layers.
    code = (
        "import sys; sys.modules['transformers'] = None\n"
        "import torch, alfa\n"
        "m = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Linear(16, 16))\n"
        "alfa.truncate(m, 2); alfa.attach(m, alfa.LoraConfig(rank=1)); alfa.merge(m, densify=True)\n"
        "assert sys.modules['transformers'] is None\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(alfa.__file__).parents[1])}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=120)
    assert not is_conv1d(nn.Linear(3, 4)) and is_conv1d(Conv1D(4, 3))


def test_gpt2_conv1d_layers_are_truncated_with_their_own_layout():
    model = _gpt2().double()
    dense = copy.deepcopy(model)
    report = alfa.truncate(model, RANK)
    conv1d = _conv1d_names(dense)
    assert len(conv1d) == 8 and sorted(report.factorized) == sorted(conv1d)  # every Conv1D, none skipped
    for name in conv1d:
        layer = model.get_submodule(name)
        assert isinstance(layer, FactorizedLinear) and layer.spec.transposed
        assert (layer.nx, layer.nf) == (dense.get_submodule(name).nx, dense.get_submodule(name).nf)
        assert layer.weight.shape == dense.get_submodule(name).weight.shape  # (in, out), as Conv1D stores it
        with torch.no_grad():  # the dense model holding the truncated weights computes what the factors do
            dense.get_submodule(name).weight.copy_(layer.weight)
    assert torch.allclose(_out(model, "gpt2"), _out(dense, "gpt2"), atol=1e-10)
    assert "Conv1D (dense)" in alfa.parameter_summary(dense).by_kind


def test_conv1d_at_full_rank_equals_the_dense_layer():
    layer = Conv1D(12, 20).double()
    x = torch.randn(3, 5, 20, dtype=torch.float64)
    full = FactorizedLinear.from_dense(layer, 12)
    assert full.rank == 12 and torch.allclose(full(x), layer(x), atol=1e-12)
    assert torch.allclose(full.weight, layer.weight, atol=1e-12)


@pytest.mark.parametrize("base", ["truncated", "dense"])
@pytest.mark.parametrize("method", LAYER_METHODS)
def test_every_method_on_gpt2_conv1d(method, base, tmp_path):
    model = _gpt2().double()
    dense_count = _count(model)
    if base == "truncated":
        alfa.truncate(model, RANK)
    reference, before = _out(model, "gpt2"), _count(model)
    config = METHODS[method](layers="auto", **SMALL.get(method, {}))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the dense base's tied lm_head is left out (tested below)
        names = alfa.attach(model, config)
    assert sorted(names) == sorted(_conv1d_names(_gpt2()))  # the Conv1D layers, not skipped
    at_init = _out(model, "gpt2")
    assert torch.allclose(at_init, reference, atol=1e-10)  # PiSSA/MiLoRA/DoRA re-split the weight: round-off
    _randomized(model)
    adapted = _out(model, "gpt2")
    assert not torch.allclose(adapted, reference, atol=1e-6)

    for name in names:  # what model code reads: Conv1D's names and layout, and the effective weight
        layer = model.get_submodule(name)
        assert (layer.nx, layer.nf) == (layer.in_features, layer.out_features)
        probe = Conv1D(layer.nf, layer.nx).double()
        with torch.no_grad():
            probe.weight.copy_(layer.weight)
            probe.bias.copy_(layer.bias)
        x = torch.randn(2, 3, layer.nx, dtype=torch.float64)
        assert torch.allclose(probe(x), layer(x), atol=1e-10)

    path = alfa.save_adapter(model, tmp_path / "user.safetensors")
    fresh = copy.deepcopy(model)
    alfa.detach(fresh)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        alfa.load_adapter(fresh, path)
    assert torch.equal(_out(fresh, "gpt2"), adapted)

    form = alfa.merge_form(model)
    alfa.merge(model, densify=form == "densified")
    assert torch.allclose(_out(model, "gpt2"), adapted, atol=1e-10)
    assert model.lm_head.weight is model.transformer.wte.weight  # the tie survives
    for name in names:
        merged = model.get_submodule(name)
        assert isinstance(merged, Conv1D) or (isinstance(merged, FactorizedLinear) and merged.spec.transposed)
    if form == "factorized (rank d)":
        assert _count(model) == before
    else:  # densified (truncated base) or dense: back to GPT-2's own Conv1D layers and size
        assert form in ("densified", "dense") and _count(model) == dense_count
        assert all(isinstance(model.get_submodule(n), Conv1D) for n in names)


def test_gpt2_extend_merge_keeps_the_conv1d_layout():
    model = _gpt2().double()
    alfa.truncate(model, RANK)
    alfa.attach(model, alfa.LoraConfig(rank=2, alpha=4.0))
    out = _out(_randomized(model), "gpt2")
    alfa.merge(model, extend=True)
    layer = model.transformer.h[0].attn.c_attn
    assert isinstance(layer, FactorizedLinear) and layer.spec.transposed and layer.rank == RANK + 2
    assert torch.allclose(_out(model, "gpt2"), out, atol=1e-10)


# ---------------------------------------------------------------------------------------------------------------
# What model code reads: ViT's patch embedding


def test_vit_truncated_at_full_rank_equals_dense():
    model = _vit().double()
    dense = copy.deepcopy(model)
    for name, mod in list(model.named_modules()):  # every layer at its full rank (alfa.truncate would skip them)
        if isinstance(mod, nn.Conv2d):
            replace_module(model, name, FactorizedConv2d.from_dense(mod, min(mod.weight.shape[0], 48)))
        elif isinstance(mod, nn.Linear):
            replace_module(model, name, FactorizedLinear.from_dense(mod, min(mod.weight.shape)))
    projection = model.vit.embeddings.patch_embeddings.projection
    assert isinstance(projection, FactorizedConv2d) and projection.weight.dtype == torch.float64
    assert torch.allclose(_out(model, "vit"), _out(dense, "vit"), atol=1e-10)


def test_vit_truncated_equals_the_dense_model_holding_its_weights():
    model = _vit().double()
    dense = copy.deepcopy(model)
    report = alfa.truncate(model, RANK)
    assert "vit.embeddings.patch_embeddings.projection" in report.factorized
    with torch.no_grad():  # the dense ViT with each truncated layer's `weight` computes what the factors do
        for name in report.factorized:
            layer, twin = model.get_submodule(name), dense.get_submodule(name)
            assert layer.weight.shape == twin.weight.shape and layer.weight.dtype == torch.float64
            twin.weight.copy_(layer.weight)
    assert torch.allclose(_out(model, "vit"), _out(dense, "vit"), atol=1e-10)


@pytest.mark.parametrize("method", ["alfa", "lora", "dora", "flora"])
@pytest.mark.parametrize("base", ["truncated", "dense"])
def test_vit_adapted_at_init_equals_base_and_merged_equals_unmerged(method, base):
    model = _vit()
    if base == "truncated":
        alfa.truncate(model, RANK)
    reference = _out(model, "vit")
    names = alfa.attach(model, METHODS[method](layers="all", **SMALL.get(method, {})))
    assert "vit.embeddings.patch_embeddings.projection" in names
    assert torch.allclose(_out(model, "vit"), reference, atol=1e-6)
    projection = model.vit.embeddings.patch_embeddings.projection
    assert isinstance(projection, AdaptedLayer)
    assert projection.weight.dtype == torch.float32 and projection.weight.shape == (32, 3, 4, 4)
    geometry = (projection.in_channels, projection.out_channels, projection.kernel_size, projection.stride)
    assert geometry == (3, 32, (4, 4), (4, 4)) and projection.padding == (0, 0) and projection.groups == 1
    assert projection.bias is projection.base.bias
    assert not hasattr(projection, "in_features") and not hasattr(projection, "nf")  # a conv has none
    with pytest.raises(AttributeError):
        projection.weight = torch.zeros(32, 3, 4, 4)  # read-only
    out = _out(_randomized(model), "vit")
    alfa.merge(model, densify=True)
    assert torch.allclose(_out(model, "vit"), out, atol=1e-5)


def test_adapted_weight_is_the_effective_weight():
    layer = nn.Conv2d(3, 8, 3, padding=1).double()
    holder = nn.Sequential(layer)
    alfa.attach(holder, alfa.LoraConfig(rank=2, alpha=4.0))
    _randomized(holder)
    adapted = holder[0]
    x = torch.randn(2, 3, 9, 9, dtype=torch.float64)
    with torch.no_grad():
        assert torch.allclose(nn.functional.conv2d(x, adapted.weight, adapted.bias, padding=1), adapted(x), atol=1e-12)
        assert not torch.equal(adapted.weight, adapted.base.weight)  # base.weight is the frozen base
    prompted = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1))
    alfa.attach(prompted, TPGazeConfig.for_model(prompted, 9, target="^0$"))
    assert torch.equal(prompted[0].weight, prompted[0].base.weight)  # prompts leave the weight as it is


# ---------------------------------------------------------------------------------------------------------------
# Tied parameters


def test_tied_lm_head_is_skipped_by_truncate_and_refused_when_targeted():
    model = _gpt2()
    count = _count(model)
    report = alfa.truncate(copy.deepcopy(model), RANK)
    assert "lm_head" in report.left_dense and "tied to transformer.wte.weight" in report.left_dense["lm_head"]
    with pytest.raises(ValueError, match=r"lm_head shares its parameters with transformer\.wte\.weight.*untie"):
        alfa.truncate(model, RANK, target="lm_head")
    assert _count(model) == count and isinstance(model.lm_head, nn.Linear)  # nothing changed


def test_tied_lm_head_is_left_out_by_attach_and_refused_when_targeted():
    model = _gpt2()
    count = _count(model)
    with pytest.warns(UserWarning, match=r"leaves out 1 layer.*lm_head \(tied to transformer\.wte\.weight\)"):
        names = alfa.attach(model, alfa.LoraConfig(rank=2, layers="dense"))
    assert "lm_head" not in names and len(names) == 8
    _randomized(model)
    alfa.merge(model, densify=True)
    assert _count(model) == count and model.lm_head.weight is model.transformer.wte.weight
    with pytest.raises(ValueError, match=r"lora: lm_head shares its parameters .*tied weights"):
        alfa.attach(model, alfa.LoraConfig(rank=2, layers="dense", target="lm_head"))
    assert alfa.adapter_state(model) is None


def test_load_adapter_does_not_repeat_the_note_of_the_tied_layer_left_out(tmp_path):
    """attach said it when the adapter was made; load_adapter said it twice more (once choosing the layers for the
    file's dense_rank, once attaching): a server loading each user's file would repeat it for every user."""
    import warnings

    base = _gpt2()
    model = copy.deepcopy(base)
    with pytest.warns(UserWarning, match="leaves out 1 layer"):
        alfa.attach(model, alfa.AlfaConfig(heads=2, rank=2, layers="dense", dense_rank=4))
    alfa.save_adapter(model, tmp_path / "u.safetensors")
    fresh = copy.deepcopy(base)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        alfa.load_adapter(fresh, tmp_path / "u.safetensors")
    assert [str(w.message) for w in said if "tied" in str(w.message)] == []
    assert torch.equal(_out(fresh, "gpt2"), _out(model, "gpt2"))


class _Shared(nn.Module):
    """One Linear under two names (a layer shared across depth) and a Linear of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(16, 16)
        self.second = self.first
        self.own = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.own(self.second(torch.relu(self.first(x))))


def test_ties_are_found_by_identity_not_by_name():
    model = _Shared()
    ties = shared_parameters(model)
    assert ties["first"] == ["second.weight", "second.bias"] and "own" not in ties
    report = alfa.truncate(model, 2)
    assert list(report.factorized) == ["own"] and "tied to second.weight" in report.left_dense["first"]
    with pytest.raises(ValueError, match="first shares its parameters with second.weight"):
        alfa.truncate(_Shared(), 2, target="first")


def test_merge_refuses_a_tie_made_after_attach():
    model = nn.Sequential(nn.Linear(16, 16), nn.Linear(16, 16))
    alfa.attach(model, alfa.LoraConfig(rank=2, target="^0$"))
    model[1].weight = model[0].base.weight  # tied afterwards (as transformers' tie_weights would)
    with pytest.raises(MergeError, match=r"0 shares its parameters with 1\.weight"):
        alfa.merge(model, densify=True)
    assert alfa.adapter_state(model) is not None


# ---------------------------------------------------------------------------------------------------------------
# transformers' save_pretrained / from_pretrained


@pytest.mark.parametrize("kind", list(MODELS))
def test_save_pretrained_of_a_truncated_model_refuses_and_alfa_save_pretrained_round_trips(kind, tmp_path):
    model = MODELS[kind]()
    alfa.truncate(model, RANK)
    out = _out(model, kind)
    with pytest.raises(UnsupportedSaveError, match=r"alfa\.save_pretrained\(model, directory\).*alfa\.load_pretrained"):
        model.save_pretrained(tmp_path / "hf")
    assert not (tmp_path / "hf" / "model.safetensors").exists()
    alfa.save_pretrained(model, tmp_path / "alfa")
    back = alfa.load_pretrained(type(model), tmp_path / "alfa")
    assert torch.equal(_out(back, kind), out) and _count(back) == _count(model)
    ranks = {n: m.rank for n, m in model.named_modules() if is_factorized(m)}
    assert ranks and {n: m.rank for n, m in back.named_modules() if is_factorized(m)} == ranks
    if kind == "gpt2":
        assert back.lm_head.weight is back.transformer.wte.weight
    with pytest.raises(UnsupportedSaveError):  # the reloaded model is guarded too
        back.save_pretrained(tmp_path / "hf2")


@pytest.mark.parametrize("kind", list(MODELS))
def test_save_pretrained_of_an_adapted_model_refuses_and_detach_then_save_round_trips(kind, tmp_path):
    model = MODELS[kind]()
    base_out = _out(model, kind)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # GPT-2's tied lm_head is left out
        alfa.attach(model, alfa.LoraConfig(rank=2, alpha=4.0, layers="dense"))
    out = _out(_randomized(model), kind)
    with pytest.raises(UnsupportedSaveError, match=r"lose the lora adapter \(alfa\).*alfa\.save_adapter"):
        model.save_pretrained(tmp_path / "hf")
    with pytest.raises(alfa.checkpoint.CheckpointError, match="alfa.save_adapter"):
        alfa.save_pretrained(model, tmp_path / "alfa")
    adapter = alfa.save_adapter(model, tmp_path / "user.safetensors")

    copied = copy.deepcopy(model)  # the guard of a copy checks the copy
    alfa.detach(copied)
    copied.save_pretrained(tmp_path / "base")
    back = type(model).from_pretrained(tmp_path / "base").eval()
    assert torch.equal(_out(back, kind), base_out)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        alfa.load_adapter(back, adapter)
    assert torch.equal(_out(back, kind), out)

    alfa.merge(model, densify=True)  # merged into dense layers of the model's own classes: saves exactly
    merged_out = _out(model, kind)
    model.save_pretrained(tmp_path / "merged")
    again = type(model).from_pretrained(tmp_path / "merged").eval()
    assert torch.equal(_out(again, kind), merged_out) and _count(again) == _count(model)


def test_bitfit_trains_in_place_and_saves_with_save_pretrained(tmp_path):
    model = _gpt2()
    alfa.attach(model, alfa.BitfitConfig())
    with torch.no_grad():
        for p in alfa.adapter_parameters(model).values():
            p.add_(0.1)
    out = _out(model, "gpt2")
    model.save_pretrained(tmp_path)
    assert torch.equal(_out(transformers.GPT2LMHeadModel.from_pretrained(tmp_path).eval(), "gpt2"), out)


def test_bitfit_trains_llamas_own_rms_norms():
    """LlamaRMSNorm is no subclass of torch's RMSNorm: BitFit found nothing to train in a Llama (no biases either)
    and refused it. A leaf module named ...Norm is a normalization layer; the weights it trains are those norms'."""
    from alfa.adapters.bitfit import is_norm_layer

    model = _llama()
    alfa.attach(model, alfa.BitfitConfig())
    trained = alfa.adapter_parameters(model)
    norms = [n for n, m in model.named_modules() if type(m).__name__ == "LlamaRMSNorm"]
    assert norms and sorted(trained) == sorted(f"{n}.weight" for n in norms)
    assert not is_norm_layer(nn.Sequential(nn.Linear(2, 2)))  # a container named otherwise is none
    PreNorm = type("PreNorm", (nn.Module,), {})  # a wrapper named ...Norm holding layers is none either
    wrapper = PreNorm()
    wrapper.add_module("inner", nn.Linear(2, 2))
    assert not is_norm_layer(wrapper)


def test_guard_marks_agree():
    # alfa.surgery recognizes adapted layers by this base class (it sits below the adapters and cannot import them).
    assert issubclass(AdaptedLayer, LayerWrapper)
    model = _vit()
    alfa.attach(model, alfa.LoraConfig(rank=2, layers="dense"))
    assert adapted_layers(model)
    with pytest.raises(UnsupportedSaveError):  # the inner ViTModel refuses too
        model.vit.save_pretrained("unused")


def test_load_pretrained_takes_an_auto_class_and_refuses_another_model(tmp_path):
    model = _gpt2()
    alfa.truncate(model, RANK)
    alfa.save_pretrained(model, tmp_path)
    back = alfa.load_pretrained(transformers.AutoModelForCausalLM, tmp_path)
    assert type(back) is type(model) and torch.equal(_out(back, "gpt2"), _out(model, "gpt2"))
    with pytest.raises(alfa.checkpoint.CheckpointError, match="a checkpoint of 'GPT2LMHeadModel'"):
        alfa.load_pretrained(transformers.GPT2Model, tmp_path)
    with pytest.raises(FileNotFoundError, match="alfa.save_pretrained"):
        alfa.load_pretrained(transformers.GPT2LMHeadModel, tmp_path / "missing")


def test_save_pretrained_refuses_another_models_folder_unless_told(tmp_path):
    model = _gpt2()
    model.save_pretrained(tmp_path / "hf")  # transformers' own folder: config.json and its weights
    before = (tmp_path / "hf" / "config.json").read_bytes()
    alfa.truncate(model, RANK)
    with pytest.raises(alfa.checkpoint.CheckpointError, match=r"hf holds another model's config\.json"):
        alfa.save_pretrained(model, tmp_path / "hf")
    assert (tmp_path / "hf" / "config.json").read_bytes() == before and not (
        tmp_path / "hf" / "alfa-model.safetensors"
    ).exists()
    alfa.save_pretrained(model, tmp_path / "hf", overwrite=True)
    assert not (tmp_path / "hf" / "model.safetensors").exists()  # its weights went with its config
    alfa.save_pretrained(model, tmp_path / "hf")  # its own earlier save is replaced, as transformers does
    assert torch.equal(
        _out(alfa.load_pretrained(transformers.GPT2LMHeadModel, tmp_path / "hf"), "gpt2"), _out(model, "gpt2")
    )
