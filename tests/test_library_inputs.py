"""Bad input to the library's public calls is refused at once, with one error that names the problem."""

from __future__ import annotations

import copy
import dataclasses
import re

import pytest
import torch
from adapter_settings import small_config
from tiny_models import TinyGazeNet, truncated_tiny_gaze_net

import alfa
from alfa.adapters import adapter_state, param_groups
from alfa.adapters.config import METHODS
from alfa.adapters.gate import LinearMixConfig
from alfa.serve import MixedBatchModel

INF = float("inf")


def _float_fields() -> list[tuple[str, str]]:
    out = []
    for method, cls in sorted(METHODS.items()):
        for f in dataclasses.fields(cls):
            kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", "")
            if kind.removesuffix(" | None") == "float":
                out.append((method, f.name))
    return out


@pytest.mark.parametrize(("method", "field"), _float_fields())
@pytest.mark.parametrize("value", [INF, -INF, float("nan")])
def test_every_float_option_of_every_config_must_be_finite(method, field, value):
    with pytest.raises(ValueError, match=rf"{field} must be (a finite number|positive|non-negative)"):
        METHODS[method](**{field: value})


def test_the_reported_infinite_options_are_refused_naming_the_field():
    for make, field in (
        (lambda: alfa.LoraConfig(alpha=INF), "LoraConfig.alpha"),
        (lambda: alfa.AlfaConfig(init_std=INF), "AlfaConfig.init_std"),
        (lambda: LinearMixConfig(init_std=INF), "LinearMixConfig.init_std"),
        (lambda: alfa.FloraConfig(scale=INF), "FloraConfig.scale"),
    ):
        with pytest.raises(ValueError, match=rf"^{re.escape(field)} must be a finite number, got inf$"):
            make()
    assert _float_fields(), "no config has a float option: the test above checks nothing"


def test_a_config_set_to_inf_after_construction_is_refused_at_attach(small_net):
    config = alfa.LoraConfig(rank=2)
    config.alpha = INF
    with pytest.raises(ValueError, match="alpha must be a finite number"):
        alfa.attach(small_net, config)
    assert alfa.adapter_state(small_net) is None


# ---------------------------------------------------------------------------------------------------------------
# save_adapter onto a folder


def test_save_adapter_onto_a_folder_names_the_folder_and_writes_nothing(small_net, tmp_path):
    alfa.attach(small_net, alfa.LoraConfig(rank=2, layers="dense"))
    folder = tmp_path / "m2"
    folder.mkdir()
    with pytest.raises(alfa.AdapterFileError) as refused:
        alfa.save_adapter(small_net, folder)
    message = str(refused.value)
    assert message.startswith(f"{folder} is a folder: an adapter is saved to one file")
    assert ".tmp" not in message and "\n" not in message
    assert sorted(tmp_path.iterdir()) == [folder] and not any(folder.iterdir())
    # a file in that folder is still written, and reads back
    path = alfa.save_adapter(small_net, folder / "user.safetensors")
    assert alfa.read_adapter_metadata(path)["method"] == "lora"


# ---------------------------------------------------------------------------------------------------------------
# param_groups


def test_param_groups_refuses_a_bad_pattern_naming_it(small_net):
    alfa.attach(small_net, alfa.LoraConfig(rank=2, layers="dense"))
    with pytest.raises(ValueError, match=r"lr_scale pattern '\(' is not a valid regular expression") as refused:
        alfa.param_groups(small_net, lr=1e-3, lr_scale={"(": 2.0})
    assert not isinstance(refused.value, re.error)


@pytest.mark.parametrize("scale", [0.0, -1.0, INF, float("nan"), "2"])
def test_param_groups_refuses_a_scale_that_is_not_a_positive_finite_factor(small_net, scale):
    alfa.attach(small_net, alfa.LoraConfig(rank=2, layers="dense"))
    with pytest.raises(ValueError, match=r"lr_scale\['\^0\\\\\.'\] must be a positive finite factor of lr"):
        alfa.param_groups(small_net, lr=1e-3, lr_scale={r"^0\.": scale})


def test_param_groups_keeps_a_good_scale_and_refuses_an_infinite_lr(small_net):
    alfa.attach(small_net, alfa.LoraConfig(rank=2, layers="dense"))
    groups = alfa.param_groups(small_net, lr=1e-3, lr_scale={r"fc": 10.0})
    assert {g["name"]: g["lr"] for g in groups} == {"default": 1e-3, "fc": 1e-2}
    with pytest.raises(ValueError, match="lr must be a positive, finite number, got inf"):
        alfa.param_groups(small_net, lr=INF)


def test_param_groups_refuses_a_pattern_that_matches_no_trainable_parameter():
    """Such a pattern (a typo: "^layr4") was dropped without a word, every parameter left at the base rate, where a
    ``target`` that matches nothing is refused."""
    model = _truncated_base()
    alfa.attach(model, alfa.AlfaConfig(heads=2, rank=2))
    first = next(n for n, p in model.named_parameters() if p.requires_grad)
    typo = r"^layr4\."
    words = f"lr_scale pattern {typo!r} matches no trainable parameter"
    with pytest.raises(ValueError, match=re.escape(words)) as refused:
        alfa.param_groups(model, lr=1e-3, lr_scale={r"^layer4\.": 10.0, typo: 10.0})
    assert first in str(refused.value) and "more" in str(refused.value)  # a few of the names it was matched against
    frozen = next(n for n, p in model.named_parameters() if not p.requires_grad)  # a frozen one does not count
    with pytest.raises(ValueError, match="matches no trainable parameter"):
        alfa.param_groups(model, lr=1e-3, lr_scale={f"^{re.escape(frozen)}$": 2.0})
    groups = alfa.param_groups(model, lr=1e-3, lr_scale={r"^layer4\.": 10.0})
    assert {g["name"]: g["lr"] for g in groups} == {"default": 1e-3, r"^layer4\.": 1e-2}


# ---------------------------------------------------------------------------------------------------------------
# MultiUserModel and MixedBatchModel: user ids


@pytest.fixture
def served(small_net):
    alfa.truncate(small_net, rank=6)
    base = small_net.eval()
    user = copy.deepcopy(base)
    torch.manual_seed(1)
    alfa.attach(user, alfa.AlfaConfig(heads=2, rank=2))
    with torch.no_grad():
        for p in alfa.adapter_parameters(user).values():
            p.normal_(0, 0.2)
    served = alfa.MultiUserModel(base)
    served.add_user("ann", user)
    return served


def test_an_unknown_user_is_one_clear_error_naming_them(served):
    x = torch.randn(2, 3, 16, 16)
    for call in (lambda: served.user_bytes("zzz"), lambda: served.remove_user("zzz")):
        with pytest.raises(alfa.UnknownUserError) as refused:
            call()
        assert str(refused.value) == "unknown user 'zzz'"  # not KeyError's quoted repr
        assert isinstance(refused.value, KeyError) and isinstance(refused.value, ValueError)
    with pytest.raises(alfa.UnknownUserError, match=r"^unknown user\(s\): \['zzz', 5\]$"):
        served(x, ["zzz", 5])  # ids of mixed types: no TypeError from sorting them
    assert served.users == ["ann"] and served.user_bytes("ann") > 0


def test_a_bare_str_is_refused_where_a_list_of_user_ids_is_expected(served):
    x = torch.randn(3, 3, 16, 16)
    with pytest.raises(ValueError, match=r"users must be a list of user ids, one per sample, not the str 'ann'"):
        served(x, "ann")
    assert served(x[:1], ["ann"]).shape[0] == 1
    mixed = MixedBatchModel(served._scratch)
    with pytest.raises(ValueError, match="one per sample"):
        mixed.mixes(served, "ann")


def test_add_user_refuses_a_user_id_that_is_not_a_str(served, tmp_path):
    with pytest.raises(ValueError, match=r"a user id must be a str, got 5 \(int\)"):
        served.add_user(5, tmp_path / "never read.safetensors")
    assert served.users == ["ann"]


def test_mixes_refuses_an_unknown_user_instead_of_serving_the_base(served):
    mixed = MixedBatchModel(served._scratch)
    with pytest.raises(alfa.UnknownUserError, match=r"unknown user\(s\): \['zzz'\]"):
        mixed.mixes(served, ["ann", "zzz"])
    with pytest.raises(ValueError, match="users is empty: a batch has one user id"):
        mixed.mixes(served, [])
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():  # known users and None still agree with the served model
        assert torch.allclose(mixed(x, *mixed.mixes(served, ["ann", None])), served(x, ["ann", None]), atol=1e-6)


def test_the_bases_zero_mix_is_built_with_the_models_dtype_and_device(small_net):
    alfa.truncate(small_net, rank=6)
    for base in (copy.deepcopy(small_net).double(), copy.deepcopy(small_net).to("meta")):
        served, mixed = alfa.MultiUserModel(base), MixedBatchModel(base)
        mixes = mixed.mixes(served, [None, None])
        U = next(m.U for m in base.modules() if alfa.layers.is_factorized(m))
        assert mixes and all(m.dtype == U.dtype and m.device == U.device for m in mixes)
        assert all(m.shape[0] == 2 for m in mixes)


def test_an_adapter_trained_in_train_mode_is_not_saved_without_its_statistics_and_detach_restores_them(tmp_path):
    """A forward pass in train mode moves the base's BatchNorm statistics, which no adapter file holds: saving is
    refused (the file would not reproduce the model), detach puts them back, and modules_to_save keeps them."""
    model = truncated_tiny_gaze_net()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    alfa.attach(model, alfa.AlfaConfig(heads=2, rank=2))
    model.train()
    model(torch.rand(4, 3, 16, 16))
    with pytest.raises(ValueError, match=r"statistics moved .*\(bn1, layer1\.1, layer2\.1 and more: a forward pass"):
        alfa.save_adapter(model, tmp_path / "a.safetensors")
    assert not (tmp_path / "a.safetensors").exists()
    alfa.detach(model)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    norms = [n for n, m in model.named_modules() if isinstance(m, torch.nn.BatchNorm2d)]
    alfa.attach(model, alfa.AlfaConfig(heads=2, rank=2, modules_to_save=norms))
    model.train()
    model(torch.rand(4, 3, 16, 16))
    alfa.save_adapter(model, tmp_path / "b.safetensors")  # the norms' trained copies carry their statistics
    alfa.detach(model)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_an_adapter_loaded_onto_its_base_cast_to_another_dtype_says_so(tmp_path):
    model = truncated_tiny_gaze_net()
    base = copy.deepcopy(model)
    alfa.attach(model, alfa.AlfaConfig(heads=2, rank=2))
    alfa.save_adapter(model, tmp_path / "a.safetensors")
    with pytest.raises(alfa.AdapterFileError, match="this base is bfloat16, the adapter's was float32: cast it back"):
        alfa.load_adapter(base.bfloat16(), tmp_path / "a.safetensors")


def test_statistics_are_those_of_the_base_the_adapter_was_attached_to_after_a_merge_or_a_cast(tmp_path):
    """A merge makes its statistics the base's: the next adapter compares with them, and detach keeps them; a model
    cast after the attach compares in its new dtype (nothing moved)."""
    model = truncated_tiny_gaze_net()
    alfa.attach(model, alfa.AlfaConfig(heads=2, rank=2))
    model.train()
    model(torch.rand(4, 3, 16, 16))
    model.eval()
    alfa.merge(model)
    merged = {k: v.clone() for k, v in model.state_dict().items()}
    alfa.attach(model, alfa.AlfaConfig(heads=2, rank=2), name="second")
    alfa.save_adapter(model, tmp_path / "second.safetensors")  # nothing moved since this attach
    alfa.detach(model)
    assert all(torch.equal(merged[k], v) for k, v in model.state_dict().items())
    alfa.attach(model, alfa.AlfaConfig(heads=2, rank=2))
    model.to(torch.bfloat16)
    alfa.save_adapter(model, tmp_path / "cast.safetensors")


@pytest.mark.parametrize("method", sorted(METHODS))
def test_an_adapter_on_a_base_truncated_otherwise_says_how(method, tmp_path):
    """Every method, both ways and rank to rank (a full fine-tune's file named only a tensor's shape)."""
    torch.manual_seed(0)
    dense = TinyGazeNet().eval()
    at_4, at_3 = copy.deepcopy(dense), copy.deepcopy(dense)
    alfa.truncate(at_4, 4)
    alfa.truncate(at_3, 3)
    cases = [
        (at_4, dense, "made on a base truncated at rank 4; this model is not truncated"),
        (at_4, at_3, "made on a base truncated at rank 4, this model at rank 3"),
        (dense, at_4, "made on a base that was not truncated; this model is truncated at rank 4"),
    ]
    for made_on, other, words in cases:
        base = copy.deepcopy(made_on)
        alfa.attach(base, small_config(method, base))
        path = alfa.save_adapter(base, tmp_path / "a.safetensors")
        with pytest.raises(alfa.AdapterFileError, match=re.escape(words)):
            alfa.load_adapter(copy.deepcopy(other), path)
        assert alfa.load_adapter(copy.deepcopy(made_on), path)  # its own base takes it


@pytest.mark.parametrize("method", sorted(METHODS))
def test_a_config_takes_its_fields_by_name_only(method):
    """LoraConfig(8) set ``target`` (the first field), not the rank: every field is given by name."""
    with pytest.raises(TypeError, match="positional argument"):
        METHODS[method](8)


# ----------------------------------------------------------------------------- an audit of the API (2026-12-05)
# Nothing the caller changes later alters an attached adapter; each mistake is named before anything changes.


def _truncated_base() -> torch.nn.Module:
    torch.manual_seed(0)
    model = TinyGazeNet().eval()
    alfa.truncate(model, 6)
    return model


def _same_state(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


IMAGES = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))


def test_attach_keeps_its_own_copy_of_the_config(tmp_path):
    """Reusing a config object for another model after changing it changes neither the first model nor its file."""
    model, other = _truncated_base(), _truncated_base()
    config = alfa.LoraConfig(rank=2)
    alfa.attach(model, config)
    with torch.no_grad():  # a non-zero update, so that LoRA's scale alpha / rank shows in the output
        for p in alfa.adapter_parameters(model).values():
            p.normal_(0, 0.1, generator=torch.Generator().manual_seed(2))
        before = model(IMAGES)
    config.rank = 4
    alfa.attach(other, config)
    assert adapter_state(model).config.rank == 2 and adapter_state(other).config.rank == 4
    with torch.no_grad():
        assert torch.equal(model(IMAGES), before)
    alfa.save_adapter(model, tmp_path / "u.safetensors")
    loaded = _truncated_base()
    alfa.load_adapter(loaded, tmp_path / "u.safetensors")
    with torch.no_grad():
        assert torch.equal(loaded(IMAGES), before)


def test_canonicalize_is_refused_while_an_adapter_is_attached():
    model = _truncated_base()
    alfa.attach(model, alfa.AlfaConfig(heads=2, rank=2))
    kept = copy.deepcopy(model)
    with pytest.raises(RuntimeError, match=r"canonicalize the base model before attaching an adapter"):
        alfa.canonicalize(model)
    assert _same_state(model, kept)
    alfa.detach(model)
    assert alfa.canonicalize(model) > 0  # and without one it runs


@pytest.mark.parametrize("config", [alfa.DictionaryMixConfig, alfa.AlfaConfig])
@pytest.mark.parametrize(
    ("dense_rank", "words"),
    [(-1, "must be a positive integer or None, got -1"), (0, "must be a positive integer or None, got 0"),
     (1.5, "must be an integer, got 1.5")],
)  # fmt: skip
def test_a_dictionary_methods_dense_rank_is_a_positive_integer(config, dense_rank, words):
    with pytest.raises(ValueError, match=re.escape(f"dense_rank {words}")):
        config(dense_rank=dense_rank)


def test_save_adapter_refuses_an_about_it_could_not_read_back(tmp_path):
    model = _truncated_base()
    alfa.attach(model, alfa.AlfaConfig(heads=2, rank=2))
    for about in ("user 17", ["a"], 3):
        with pytest.raises(TypeError, match="about must be a dict"):
            alfa.save_adapter(model, tmp_path / "u.safetensors", about=about)
    assert not list(tmp_path.iterdir())
    alfa.save_adapter(model, tmp_path / "u.safetensors", about={"user": 17})
    assert alfa.read_adapter_metadata(tmp_path / "u.safetensors")["about"] == {"user": 17}


@pytest.mark.parametrize(
    ("target", "words"),
    [
        ("[(", "alfa.truncate: target '[(' is not a valid regular expression"),
        (5, "alfa.truncate: target must be a regular expression (str) or a list of module names, got 5"),
        ([], "alfa.truncate: target is an empty list"),
        (["layer1", ""], "alfa.truncate: target entries must be non-empty module names"),
        (["conv1", "cnv2"], "alfa.truncate: target 'cnv2': the model has no module named 'cnv2'"),
        (["layer1"], r"target 'layer1' selects no layer to truncate: layer1 is a Sequential: a name selects the "),
        (["bn1"], "target 'bn1' selects no layer to truncate: bn1 is a BatchNorm2d: truncate factorizes Linear"),
    ],
)
def test_truncate_names_a_bad_target_and_changes_nothing(target, words):
    torch.manual_seed(0)
    model = TinyGazeNet().eval()
    kept = copy.deepcopy(model)
    with pytest.raises(ValueError, match=re.escape(words)):
        alfa.truncate(model, 6, target=target)
    assert _same_state(model, kept)


def test_truncate_takes_a_list_of_module_names_as_attach_does():
    """truncate(model, 6, target=["conv1"]) was refused ("target must be a regular expression") while attach took
    the list: the same names now select the same modules for both (alfa.surgery.target_matches)."""
    torch.manual_seed(0)
    model = TinyGazeNet().eval()
    names = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Conv2d)]
    suffix = names[-1].split(".")[-1]  # "0": every stage's first conv ends in ".0"
    chosen = ["conv1", suffix]
    report = alfa.truncate(model, 6, target=chosen)
    expected = [n for n in names if alfa.adapters.target_matches(chosen, n)]
    assert sorted(report.factorized) == sorted(expected) and "conv1" in expected and len(expected) > 2
    assert report.rank == 6 and all(r == 6 for r in report.factorized.values())
    for entry in ["conv1", ["conv1"], ("conv1",)]:
        again = TinyGazeNet().eval()
        assert list(alfa.truncate(again, 6, target=entry).factorized) == ["conv1"]
    alfa.attach(model, alfa.AlfaConfig(heads=2, rank=2, target=chosen))  # the same list selects the same layers
    assert sorted(alfa.adapters.adapted_layers(model)) == sorted(expected)


def test_tpgaze_input_sizes_must_be_a_mapping():
    with pytest.raises(ValueError, match=r"input_sizes must map each prompted conv's name .* got list \[8, 8\]"):
        alfa.TPGazeConfig(image_size=32, input_sizes=[8, 8])


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"lr": "1e-3"}, "lr must be a positive, finite number, got '1e-3'"),
        ({"lr": 1e-3, "weight_decay": "0.1"}, "weight_decay must be a non-negative, finite number or None"),
        ({"lr": 1e-3, "weight_decay": float("inf")}, "weight_decay must be a non-negative, finite number or None"),
    ],
)
def test_param_groups_names_a_rate_or_decay_that_is_no_number(options, words):
    model = _truncated_base()
    alfa.attach(model, alfa.AlfaConfig(heads=2, rank=2))
    with pytest.raises(ValueError, match=re.escape(words)):
        param_groups(model, **options)


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda m: alfa.attach(m, alfa.AlfaConfig()), "attach"),
        (lambda m: alfa.truncate(m, 4), "truncate"),
        (lambda m: alfa.canonicalize(m), "canonicalize"),
        (lambda m: alfa.parameter_summary(m), "parameter_summary"),
    ],
)
@pytest.mark.parametrize(("given", "said"), [("model.safetensors", "a str"), (TinyGazeNet, "the class TinyGazeNet")])
def test_a_function_given_no_model_says_so(call, name, given, said):
    with pytest.raises(
        TypeError, match=re.escape(f"alfa.{name} takes a torch.nn.Module (a model instance), got {said}")
    ):
        call(given)


def test_load_pretrained_given_a_model_instance_asks_for_its_class(tmp_path):
    transformers = pytest.importorskip("transformers")
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=16))
    with pytest.raises(TypeError, match="takes a model class .* got an instance of GPT2LMHeadModel"):
        alfa.load_pretrained(model, tmp_path)


@pytest.mark.parametrize("size", [8, (8,), (8, 8.0), (0, 0)])
def test_export_program_checks_the_image_size_first(size):
    from alfa.export import export_program

    with pytest.raises(ValueError, match=r"image_size must be \(height, width\)|image size must be positive"):
        export_program(_truncated_base(), size)


def test_a_bad_adapter_name_is_the_callers_mistake_not_the_files(tmp_path):
    model = _truncated_base()
    alfa.attach(model, alfa.AlfaConfig(heads=2, rank=2))
    alfa.save_adapter(model, tmp_path / "u.safetensors")
    fresh = _truncated_base()
    with pytest.raises(ValueError, match="an adapter name must be a non-empty string, got ''") as e:
        alfa.load_adapter(fresh, tmp_path / "u.safetensors", name="")
    assert not isinstance(e.value, alfa.AdapterFileError) and adapter_state(fresh) is None


def test_a_served_users_model_on_another_base_is_named_without_a_temporary_file():
    served = alfa.MultiUserModel(_truncated_base())
    torch.manual_seed(5)
    elsewhere = TinyGazeNet().eval()  # another base of the same shapes
    alfa.truncate(elsewhere, 6)
    alfa.attach(elsewhere, alfa.AlfaConfig(heads=2, rank=2))
    with pytest.raises(ValueError) as e:
        served.add_user("ann", elsewhere)
    message = str(e.value)
    assert message.startswith("user 'ann': ") and "the given model's adapter" in message and "tmp" not in message


def test_a_model_on_the_meta_device_is_said_to_hold_no_values(tmp_path):
    base = truncated_tiny_gaze_net()
    model = copy.deepcopy(base)
    alfa.attach(model, alfa.LoraConfig(rank=2))
    path = alfa.save_adapter(model, tmp_path / "a.safetensors")
    with pytest.raises(ValueError, match=r"on the meta device \(shapes, no values\): cannot load an adapter onto it"):
        alfa.load_adapter(copy.deepcopy(base).to("meta"), path)
    with pytest.raises(ValueError, match=r"on the meta device \(shapes, no values\): cannot save an adapter"):
        alfa.save_adapter(copy.deepcopy(model).to("meta"), tmp_path / "b.safetensors")
    assert not (tmp_path / "b.safetensors").exists()
