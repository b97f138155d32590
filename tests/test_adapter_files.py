import copy
import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from tiny_models import TinyGazeNet, truncated_structure
from torch import nn

import alfa
from alfa.adapters import AdapterFileError, adapter_parameters
from alfa.checkpoint import CheckpointError, load_model, save_model


@pytest.fixture
def base(small_net):
    alfa.truncate(small_net, rank=6)
    return small_net


def _personalized(base, seed=1, **cfg):
    model = copy.deepcopy(base)
    torch.manual_seed(seed)
    alfa.attach(model, alfa.AlfaConfig(heads=2, rank=2, **cfg))
    with torch.no_grad():
        for p in adapter_parameters(model).values():
            p.normal_(0, 0.2)
    return model


def test_round_trip_onto_a_fresh_copy_of_the_base(base, tmp_path):
    shared = copy.deepcopy(base)
    user = _personalized(base)
    path = alfa.save_adapter(user, tmp_path / "user-17.safetensors")
    x = torch.randn(3, 3, 16, 16)
    names = alfa.load_adapter(shared, path)
    assert names == ["conv1", "conv2", "conv3", "fc1"]
    assert torch.equal(shared(x), user(x))
    # The file holds only the adapter tensors, and says what it is.
    with safe_open(str(path), framework="pt") as f:
        assert set(f.keys()) == set(adapter_parameters(user))
        meta = f.metadata()
    assert meta["method"] == "alfa" and json.loads(meta["config"])["heads"] == 2
    assert json.loads(meta["targets"]) == names
    # Swapping users on the shared base.
    other = _personalized(base, seed=2)
    alfa.load_adapter(shared, alfa.save_adapter(other, tmp_path / "user-18.safetensors"), replace=True)
    assert torch.equal(shared(x), other(x))


def test_loading_onto_a_different_base_names_the_mismatch(base, small_net, tmp_path):
    path = alfa.save_adapter(_personalized(base), tmp_path / "a.safetensors")
    other_base = copy.deepcopy(base)
    with torch.no_grad():
        other_base.conv3.V.mul_(1.5)  # e.g. another recovery run
    with pytest.raises(AdapterFileError, match=r"different base model \(conv3\.V: different values"):
        alfa.load_adapter(other_base, path)
    assert alfa.adapter_state(other_base) is None  # left as it was


@pytest.mark.parametrize(
    ("tensor", "change"),
    [
        ("fc2.bias", lambda t: t.add_(0.1)),
        ("bn1.running_mean", lambda t: t.mul_(2)),
        ("bn1.weight", lambda t: t.neg_()),
    ],
)
def test_a_change_outside_the_adapted_layers_is_another_base(base, tmp_path, tensor, change):
    # fc2 and bn1 are not adapted: the layers' fingerprint does not see them; the rest's does.
    path = alfa.save_adapter(_personalized(base), tmp_path / "a.safetensors")
    other_base = copy.deepcopy(base)
    with torch.no_grad():
        change(other_base.state_dict(keep_vars=True)[tensor])
    module = tensor.rpartition(".")[0]  # the rest is fingerprinted per module
    with pytest.raises(AdapterFileError, match=rf"different base model \({module}: different values"):
        alfa.load_adapter(other_base, path)
    assert alfa.adapter_state(other_base) is None
    assert alfa.load_adapter(copy.deepcopy(base), path)  # the base itself still fits


def test_a_rest_module_cast_to_another_dtype_says_so_and_an_older_file_still_names_it(base, tmp_path):
    """Only the head cast (fc2 is not adapted): the rest's check names the cast, as a layer's does; a file from
    before the rest's dtypes were kept names the module without the hint."""
    path = alfa.save_adapter(_personalized(base), tmp_path / "a.safetensors")
    cast = copy.deepcopy(base)
    cast.fc2.to(torch.bfloat16)
    with pytest.raises(
        AdapterFileError,
        match=r"fc2: different values \(.*this base is bfloat16, the adapter's was float32: cast it back",
    ):
        alfa.load_adapter(cast, path)
    with safe_open(str(path), framework="pt") as f:
        meta, tensors = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
    del meta["rest_dtypes"]
    older = tmp_path / "older.safetensors"
    save_file(tensors, str(older), metadata=meta)
    with pytest.raises(AdapterFileError) as refused:
        alfa.load_adapter(copy.deepcopy(cast), older)
    said = str(refused.value)
    assert "the adapter was made for a different base model (" in said and "fc2: different values" in said


def test_a_file_from_before_the_rest_fingerprint_is_checked_on_its_layers_only(base, tmp_path):
    path = alfa.save_adapter(_personalized(base), tmp_path / "a.safetensors")
    with safe_open(str(path), framework="pt") as f:
        meta, tensors = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
    rest = json.loads(meta["rest_fingerprint"])
    assert set(rest) == {"bn1", "fc2"}  # the modules outside the adapted layers
    assert [len(rest["bn1"]), len(rest["fc2"])] == [4, 2]  # each float tensor; not bn1's step counter
    del meta["rest_fingerprint"]
    save_file(tensors, str(path), metadata=meta)
    head_changed = copy.deepcopy(base)
    with torch.no_grad():
        head_changed.fc2.bias.add_(0.1)
    assert alfa.read_adapter_metadata(path)["rest_fingerprint"] is None
    assert alfa.load_adapter(head_changed, path) == ["conv1", "conv2", "conv3", "fc1"]


def test_modules_to_save_are_the_adapters_own_not_the_base(base, tmp_path):
    model = copy.deepcopy(base)
    alfa.attach(model, alfa.LoraConfig(target="conv", rank=2, modules_to_save=["fc2"]))
    with torch.no_grad():
        model.fc2.weight.add_(0.5)  # the adapter's copy, trained
    path = alfa.save_adapter(model, tmp_path / "a.safetensors")
    assert set(alfa.read_adapter_metadata(path)["rest_fingerprint"]) == {"bn1", "fc1"}  # fc2: the adapter's own copy
    shared = copy.deepcopy(base)
    alfa.load_adapter(shared, path)
    x = torch.randn(2, 3, 16, 16)
    assert torch.equal(shared(x), model(x))


def test_a_large_tensor_outside_the_adapted_layers_is_read_by_sample():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(400, 256), nn.Linear(256, 8)).eval()  # 102,400 elements > the sample
    alfa.attach(model, alfa.LoraConfig(target="1", rank=2))
    rest = alfa.adapters.base_rest_fingerprint(model)
    assert set(rest) == {"0"}
    with torch.no_grad():
        model[0].weight[0, 2] += 5.0  # between two sampled elements (positions 1 and 3): unseen, as documented
    assert alfa.adapters.io._compare_rest(rest, alfa.adapters.base_rest_fingerprint(model)) == []
    for change in (lambda w: w[-1, -1].add_(5.0), lambda w: w.mul_(1.01)):  # the last element is read; a re-training
        with torch.no_grad():
            change(model[0].weight)
        problems = alfa.adapters.io._compare_rest(rest, alfa.adapters.base_rest_fingerprint(model))
        assert problems == ["0: different values"]


def test_loading_onto_a_model_missing_a_layer(base, tmp_path):
    path = alfa.save_adapter(_personalized(base), tmp_path / "a.safetensors")
    partial = type(base)().eval()
    alfa.truncate(partial, rank=6, target="conv")  # fc1 stays dense
    with pytest.raises(AdapterFileError, match=r"layers in the adapter but not adaptable in this model: \['fc1'\]"):
        alfa.load_adapter(partial, path)
    assert alfa.adapter_state(partial) is None


def test_loading_a_different_method_or_onto_an_adapted_model(base, tmp_path):
    path = alfa.save_adapter(_personalized(base), tmp_path / "a.safetensors")
    with pytest.raises(AdapterFileError, match="holds an adapter of method 'alfa', expected 'lora'"):
        alfa.load_adapter(copy.deepcopy(base), path, method="lora")
    busy = _personalized(base)
    with pytest.raises(RuntimeError, match="already has an adapter named 'default' \\(method 'alfa'\\)"):
        alfa.load_adapter(busy, path)
    # An unknown method in the header.
    tensors = {k: v.detach() for k, v in adapter_parameters(busy).items()}
    meta = {"format": "alfa-adapter", "version": "1", "method": "telepathy", "config": "{}", "targets": "[]",
            "fingerprint": "{}"}  # fmt: skip
    save_file(tensors, str(tmp_path / "odd.safetensors"), metadata=meta)
    with pytest.raises(AdapterFileError, match="unknown adapter method 'telepathy'"):
        alfa.load_adapter(copy.deepcopy(base), tmp_path / "odd.safetensors")


def test_replace_keeps_the_current_adapter_when_the_new_file_is_bad(base, tmp_path):
    user = _personalized(base)
    x = torch.randn(2, 3, 16, 16)
    out = user(x).detach()
    bad_base = copy.deepcopy(base)
    with torch.no_grad():
        bad_base.conv1.U.neg_()
    bad = alfa.save_adapter(_personalized(bad_base), tmp_path / "bad.safetensors")
    with pytest.raises(AdapterFileError, match="different base"):
        alfa.load_adapter(user, bad, replace=True)
    assert torch.equal(user(x), out)


def test_corrupt_and_foreign_files(base, tmp_path):
    path = alfa.save_adapter(_personalized(base), tmp_path / "a.safetensors")
    data = path.read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(data[: len(data) // 2])
    (tmp_path / "junk.safetensors").write_bytes(b"\x00garbage" * 10)
    save_file({"w": torch.zeros(2)}, str(tmp_path / "plain.safetensors"))
    for name, match in [
        ("cut", "corrupt|not a readable"),
        ("junk", "not a readable"),
        ("plain", "not an alfa adapter"),
    ]:
        with pytest.raises(AdapterFileError, match=match):
            alfa.load_adapter(copy.deepcopy(base), tmp_path / f"{name}.safetensors")
    with pytest.raises(FileNotFoundError):
        alfa.load_adapter(copy.deepcopy(base), tmp_path / "missing.safetensors")


def test_flipped_bits_in_the_tensor_data_are_refused(base, tmp_path):
    """A bit flipped inside the tensor bytes still parses (and once moved a person from 14° to 78°): the
    checksum the file carries refuses it, naming the file; the model is left as it was."""
    import struct

    user = _personalized(base)
    path = alfa.save_adapter(user, tmp_path / "a.safetensors", about={"person": "p07"})
    data = bytearray(path.read_bytes())
    header = struct.unpack("<Q", data[:8])[0]
    data[8 + header + 5] ^= 0x10  # inside the first tensor's bytes
    (tmp_path / "flipped.safetensors").write_bytes(bytes(data))
    target = copy.deepcopy(base)
    with pytest.raises(AdapterFileError, match="flipped.safetensors: damaged tensor data"):
        alfa.load_adapter(target, tmp_path / "flipped.safetensors")
    assert alfa.adapter_state(target) is None
    meta = alfa.read_adapter_metadata(path)
    assert meta["about"] == {"person": "p07"} and len(meta["checksum"]) == 64
    assert meta["checksum"] == alfa.adapters.tensor_checksum(dict(adapter_parameters(user)))


def test_nan_tensors_are_refused_at_save_and_at_load(base, tmp_path, monkeypatch):
    user = _personalized(base)
    with torch.no_grad():
        user.conv2.B_p[0, 0] = float("nan")
    with pytest.raises(
        FloatingPointError, match=r"not written: 1 of \d+ tensors hold NaN or infinite values \(conv2.B_p\)"
    ):
        alfa.save_adapter(user, tmp_path / "nan.safetensors")
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setattr(alfa.adapters.io, "refuse_non_finite", lambda tensors, path: None)  # a file from elsewhere
    path = alfa.save_adapter(user, tmp_path / "nan.safetensors")
    with pytest.raises(AdapterFileError, match="conv2.B_p contains NaN"):
        alfa.load_adapter(copy.deepcopy(base), path)


def test_save_without_adapter_is_an_error(base, tmp_path):
    with pytest.raises(RuntimeError, match="no adapter attached"):
        alfa.save_adapter(base, tmp_path / "x.safetensors")
    assert not (tmp_path / "x.safetensors").exists()


def test_a_checkpoint_with_flipped_bits_is_refused(tmp_path):
    import struct

    model = TinyGazeNet().eval()  # any model: the checksum is of the tensor data, whatever the architecture
    path = save_model(tmp_path / "m.safetensors", model, "tiny_gaze_net")
    data = bytearray(path.read_bytes())
    header = struct.unpack("<Q", data[:8])[0]
    data[8 + header + 1000] ^= 0x01
    (tmp_path / "flipped.safetensors").write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="flipped.safetensors: damaged tensor data"):
        load_model(tmp_path / "flipped.safetensors")
    load_model(path)  # the intact file loads


@pytest.mark.slow
def test_checkpoint_round_trip_and_wrong_model(tmp_path):
    # ResNet-18 truncated at 16, its factors random (no SVDs): a round trip does not depend on their values
    model = truncated_structure(alfa.models.resnet18_gaze().eval(), 16)
    path = save_model(tmp_path / "m.safetensors", model, "resnet18_gaze", extra={"note": "test"})
    loaded, config = load_model(path, expect_model="resnet18_gaze")
    x = torch.randn(1, 3, 32, 32)
    assert torch.equal(loaded.eval()(x), model(x))
    assert config["extra"] == {"note": "test"} and config["factorized"]["layer4.1.conv2"] == 16
    with pytest.raises(CheckpointError, match="a checkpoint of 'resnet18_gaze', expected 'crate_tiny'"):
        load_model(path, expect_model="crate_tiny")
    # Weights of another architecture under our header: every mismatch named.
    tensors = {k: v for k, v in model.state_dict().items() if not k.startswith("fc.")}
    tensors["fc.weight"] = torch.zeros(3, 512)
    tensors["fc.bias"] = torch.zeros(3)
    from safetensors.torch import save_file as sf

    tensors = {k: v.contiguous() for k, v in tensors.items()}
    sf(tensors, str(tmp_path / "w.safetensors"), metadata={"format": "alfa-checkpoint", "config": json.dumps(config)})
    with pytest.raises(CheckpointError, match="damaged tensor data"):  # the header's checksum is of other tensors
        load_model(tmp_path / "w.safetensors")
    unchecked = {k: v for k, v in config.items() if k != "checksum"}  # as a file from before checksums
    sf(
        tensors,
        str(tmp_path / "w.safetensors"),
        metadata={"format": "alfa-checkpoint", "config": json.dumps(unchecked)},
    )
    with pytest.raises(CheckpointError, match=r"shape mismatches \['fc.weight: \[3, 512\] vs \[2, 512\]'"):
        load_model(tmp_path / "w.safetensors")
    # an attached adapter would make a file no model rebuilds (its adapted layers are no model's): refused
    alfa.attach(model, alfa.AlfaConfig(rank=2, heads=2, target=["layer4.1.conv2"]))
    with pytest.raises(CheckpointError, match=r"^alfa.checkpoint.save_model saves a model, not an adapter \(1 "):
        save_model(tmp_path / "adapted.safetensors", model, "resnet18_gaze")
    assert not (tmp_path / "adapted.safetensors").exists()


def test_compact_file_is_smaller_and_reproduces_the_outputs(base, tmp_path):
    user = _personalized(base)
    full = alfa.save_adapter(user, tmp_path / "full.safetensors")
    small = alfa.save_adapter(user, tmp_path / "small.safetensors", compact=True)
    assert small.stat().st_size < full.stat().st_size
    shared = copy.deepcopy(base)
    names = alfa.load_adapter(shared, small)
    assert names == ["conv1", "conv2", "conv3", "fc1"]
    assert alfa.adapter_state(shared).config.method == "dictionary_mix"
    assert alfa.read_adapter_metadata(small)["method"] == "dictionary_mix"
    x = torch.randn(2, 3, 16, 16)
    assert torch.allclose(shared(x), user(x), rtol=1e-5, atol=1e-6)
    alfa.merge(shared)
    assert torch.allclose(shared(x), user(x), rtol=1e-5, atol=1e-6)


def test_compact_needs_a_dictionary_method(base, tmp_path):
    from alfa.adapters.config import AdapterConfig

    model = copy.deepcopy(base)
    alfa.attach(model, alfa.adapters.alfa.DictionaryMixConfig())
    alfa.save_adapter(model, tmp_path / "ok.safetensors", compact=True)  # already compact: fine
    alfa.detach(model)

    class HeadOnly(AdapterConfig):
        method = "head_only_test"
        scope = "model"

        def select_parameters(self, m):
            return ["fc2.weight"]

    alfa.attach(model, HeadOnly())
    with pytest.raises(ValueError, match="no compact form"):
        alfa.save_adapter(model, tmp_path / "x.safetensors", compact=True)


def test_messages_say_what_is_wrong_in_the_users_terms(tmp_path):
    # the messages are about the structure, not the weights: ResNet-18 truncated at 64 and 16 without their SVDs
    model = truncated_structure(alfa.models.resnet18_gaze().eval(), 64)  # a rank that leaves conv1 dense
    with pytest.raises(ValueError, match=r"matches only layers left dense \(conv1\): pass layers='dense'"):
        alfa.attach(copy.deepcopy(model), alfa.AlfaConfig(target=r"^conv1$"))
    with pytest.raises(ValueError, match="already truncated \\(14 factorized layers at rank 64\\)"):
        alfa.truncate(model, 64)
    other = truncated_structure(alfa.models.resnet18_gaze().eval(), 16)
    alfa.attach(other, alfa.AlfaConfig(heads=2, rank=2))
    path = alfa.save_adapter(other, tmp_path / "a.safetensors")
    with pytest.raises(AdapterFileError, match="made on a base truncated at rank 16, this model at rank 64"):
        alfa.load_adapter(copy.deepcopy(model), path)
    with pytest.raises(AdapterFileError, match="is a folder: an adapter is one file"):
        alfa.load_adapter(copy.deepcopy(model), tmp_path)


def test_a_trained_bases_batchnorm_statistics_are_seen_past_its_counter_and_its_variance(tmp_path):
    # a trained BatchNorm: a step counter of 20,000 and variances of 10^4 beside a bias of about 0.1; one signature
    # per module would read the counter or the variance alone
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(4 * 6 * 6, 2)).eval()
    with torch.no_grad():
        net[1].num_batches_tracked.fill_(20_000)
        net[1].running_var.fill_(1e4)
        net[1].bias.normal_(0, 0.1)
    model = copy.deepcopy(net)
    alfa.attach(model, alfa.LoraConfig(target="3", rank=1))
    path = alfa.save_adapter(model, tmp_path / "a.safetensors")
    for change in (lambda bn: bn.running_mean.add_(0.5), lambda bn: bn.bias.add_(0.5), lambda bn: bn.weight.neg_()):
        moved = copy.deepcopy(net)
        with torch.no_grad():
            change(moved[1])
        with pytest.raises(AdapterFileError, match=r"\(1: different values"):
            alfa.load_adapter(moved, path)
    counted = copy.deepcopy(net)
    counted[1].num_batches_tracked.fill_(0)  # no eval-mode output reads the counter
    assert alfa.load_adapter(counted, path) == ["3"]


def test_a_full_fine_tune_of_a_tied_model_loads_back_onto_its_base(tmp_path):
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_embd=16, n_layer=1, n_head=2, vocab_size=50, n_positions=16)
    torch.manual_seed(0)
    base = transformers.GPT2LMHeadModel(config).eval()  # lm_head.weight is transformer.wte.weight
    model = copy.deepcopy(base)
    alfa.attach(model, alfa.FullFinetuneConfig())
    with torch.no_grad():
        for p in adapter_parameters(model).values():
            p.add_(0.01)
    path = alfa.save_adapter(model, tmp_path / "a.safetensors")
    assert "lm_head" not in alfa.read_adapter_metadata(path)["rest_fingerprint"]  # the trained wte, tied
    assert alfa.load_adapter(copy.deepcopy(base), path)


def test_a_file_that_does_not_fit_a_merged_model_leaves_its_merge_undoable(tmp_path):
    """load_adapter attaches to check the file, and an attach ends the undo of the last merge: a file refused must
    leave the model as it was ("on any error the model is left as it was"), its merge still undoable."""
    torch.manual_seed(0)

    def truncated() -> nn.Module:
        model = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 2))
        alfa.truncate(model, 4)
        return model

    model, other = truncated(), truncated()  # other: another base (other random weights)
    for m in (model, other):
        alfa.attach(m, alfa.AlfaConfig(heads=1, rank=2))
        with torch.no_grad():
            for p in alfa.adapter_parameters(m).values():
                p.normal_()
    alfa.save_adapter(other, tmp_path / "other.safetensors")
    x = torch.rand(3, 16)
    with torch.no_grad():
        before = model(x)
    alfa.merge(model)
    with pytest.raises(alfa.AdapterFileError, match="made for a different base model"):
        alfa.load_adapter(model, tmp_path / "other.safetensors")
    alfa.unmerge(model)  # was: "cannot unmerge: the model holds no merge to undo"
    with torch.no_grad():
        torch.testing.assert_close(model(x), before)


def test_a_model_no_constructor_is_registered_for_is_not_saved_as_one_load_could_not_rebuild(tmp_path):
    """save_model wrote it without a word, and load_model then said "unknown model 'tiny'"."""
    from alfa.checkpoint import save_model

    with pytest.raises(ValueError, match=r"no model is registered as .tiny., so load_model could not rebuild its file"):
        save_model(tmp_path / "tiny.safetensors", nn.Sequential(nn.Linear(4, 2)), "tiny")
    assert list(tmp_path.iterdir()) == []
    # nor trained under such a name: the first checkpoint, an epoch in, would be refused
    from alfa.gaze.train import TrainConfig, train_source

    with pytest.raises(ValueError, match=r"^train_source: no model is registered as 'my_net'"):
        train_source(TinyGazeNet(), None, TrainConfig(), tmp_path / "run", model_name="my_net")  # (data unread)
    assert list(tmp_path.iterdir()) == []


def test_a_whole_model_given_as_an_adapter_says_where_it_goes(tmp_path):
    # alfa predict --adapter with a model (alfa pnpga adapt writes one per person) said only "no header"
    from alfa.checkpoint import save_model

    path = save_model(tmp_path / "p00.safetensors", TinyGazeNet(), "tiny_gaze_net")
    with pytest.raises(AdapterFileError, match=r"a whole model \(an alfa checkpoint\), not an adapter: give it as the"):
        alfa.read_adapter_metadata(path)
