"""The public calls' options are keyword-only, their flags are True or False and their paths are paths.

A third positional argument was read as the next parameter in the signature: ``load_adapter(model, path,
"carol")`` (the name, as the docs once wrote it) was ``replace="carol"`` and silently replaced the adapter
'default'; ``save_adapter(model, path, "ann")`` saved the active adapter compact; ``merge(model, "yes")`` merged
densely. A path of the wrong type met pathlib's own message, which names neither the call nor the argument.
"""

from __future__ import annotations

import re

import pytest
import torch
from tiny_models import truncated_tiny_gaze_net

import alfa


def _two_adapters() -> torch.nn.Module:
    model = truncated_tiny_gaze_net()
    alfa.attach(model, alfa.AlfaConfig(heads=2, rank=2))  # "default"
    alfa.attach(model, alfa.LoraConfig(rank=2), name="ann")
    return model


def test_load_adapters_name_is_keyword_only_and_never_taken_for_replace(tmp_path):
    model = _two_adapters()
    path = alfa.save_adapter(model, tmp_path / "ann.safetensors")
    alfa.set_adapter(model, "default")
    before = {n: t.clone() for n, t in alfa.adapter_parameters(model).items()}
    with pytest.raises(TypeError, match="positional"):
        alfa.load_adapter(model, path, "carol")
    assert alfa.adapter_names(model) == ["default", "ann"] and alfa.active_adapter(model) == "default"
    assert all(torch.equal(t, alfa.adapter_parameters(model)[n]) for n, t in before.items())
    alfa.load_adapter(model, path, name="carol")
    assert alfa.adapter_names(model) == ["default", "ann", "carol"]


def test_save_adapter_takes_no_positional_option(tmp_path):
    model = _two_adapters()
    with pytest.raises(TypeError, match="positional"):
        alfa.save_adapter(model, tmp_path / "a.safetensors", "default")
    assert not list(tmp_path.iterdir())
    alfa.save_adapter(model, tmp_path / "a.safetensors", name="default")
    assert alfa.read_adapter_metadata(tmp_path / "a.safetensors")["method"] == "alfa"


def test_merge_takes_no_positional_flag():
    model = truncated_tiny_gaze_net()
    alfa.attach(model, alfa.LoraConfig(rank=2))
    with pytest.raises(TypeError, match="positional"):
        alfa.merge(model, "yes")
    assert alfa.active_adapter(model) == "default"  # nothing merged


@pytest.mark.parametrize("value", ["yes", 1, None])
@pytest.mark.parametrize("flag", ["densify", "extend"])
def test_merge_flags_must_be_true_or_false(flag, value):
    model = truncated_tiny_gaze_net()
    alfa.attach(model, alfa.LoraConfig(rank=2))
    with pytest.raises(TypeError, match=re.escape(f"alfa.merge: {flag} must be True or False, got {value!r}")):
        alfa.merge(model, **{flag: value})
    assert alfa.active_adapter(model) == "default"


def test_save_and_load_flags_must_be_true_or_false(tmp_path):
    model = _two_adapters()
    with pytest.raises(TypeError, match=r"alfa\.save_adapter: compact must be True or False, got 'no'"):
        alfa.save_adapter(model, tmp_path / "a.safetensors", compact="no")
    assert not list(tmp_path.iterdir())
    path = alfa.save_adapter(model, tmp_path / "a.safetensors")
    with pytest.raises(TypeError, match=r"alfa\.load_adapter: replace must be True or False, got 'ann'"):
        alfa.load_adapter(model, path, name="ann", replace="ann")
    assert alfa.adapter_names(model) == ["default", "ann"]


def test_save_pretrained_options_are_keyword_only_and_overwrite_a_flag(tmp_path):
    import inspect

    parameters = inspect.signature(alfa.save_pretrained).parameters
    assert parameters["extra"].kind is parameters["overwrite"].kind is inspect.Parameter.KEYWORD_ONLY
    model = truncated_tiny_gaze_net()
    with pytest.raises(TypeError, match=r"alfa\.save_pretrained: overwrite must be True or False, got 'yes'"):
        alfa.save_pretrained(model, tmp_path / "m", overwrite="yes")
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize("path", [5, None, b"a.safetensors"])
def test_a_path_of_the_wrong_type_is_named(tmp_path, path):
    model = _two_adapters()
    what = re.escape(f"must be a str or os.PathLike (a file path), got {path!r}")
    with pytest.raises(TypeError, match=rf"alfa\.save_adapter: path {what}"):
        alfa.save_adapter(model, path)
    with pytest.raises(TypeError, match=rf"alfa\.load_adapter: path {what}"):
        alfa.load_adapter(model, path, name="other")
    with pytest.raises(TypeError, match=rf"alfa\.read_adapter_metadata: path {what}"):
        alfa.read_adapter_metadata(path)
    with pytest.raises(TypeError, match=rf"alfa\.save_pretrained: directory {what}"):
        alfa.save_pretrained(truncated_tiny_gaze_net(), path)
    with pytest.raises(TypeError, match=rf"alfa\.load_pretrained: directory {what}"):
        alfa.load_pretrained(torch.nn.Linear, path)
    assert alfa.adapter_names(model) == ["default", "ann"]


def test_every_bool_flag_of_the_public_functions_is_keyword_only():
    """The rule, checked over ``alfa.__all__``: a parameter with a True/False default is keyword-only."""
    import inspect

    positional = []
    for name in alfa.__all__:
        value = getattr(alfa, name)
        if not inspect.isfunction(value):
            continue
        for p in inspect.signature(value).parameters.values():
            if isinstance(p.default, bool) and p.kind is not inspect.Parameter.KEYWORD_ONLY:
                positional.append(f"{name}({p.name})")
    assert positional == []


@pytest.mark.parametrize(
    ("value", "what"), [(int, "the class int"), (alfa.AlfaConfig(), "a AlfaConfig"), ("x", "a str")]
)
def test_register_method_names_what_a_method_class_must_be(value, what):
    """``register_method(int)`` met ``AttributeError: type object 'int' has no attribute 'method'``."""
    known = dict(alfa.METHODS)
    with pytest.raises(TypeError, match=r"alfa\.register_method takes a subclass of alfa\.AdapterConfig") as refused:
        alfa.register_method(value)
    assert what in str(refused.value) and "method, display_name and family" in str(refused.value)
    assert alfa.METHODS == known
