"""``alfa personalize --method tpgaze`` and ``alfa tpgaze personalize``: the same checks before anyone is adapted,
and prompts sized to the data's images unless an option chose their size."""

import pytest
from tiny_models import truncated_tiny_gaze_net

import alfa
from alfa.checkpoint import save_model
from alfa.cli import build_parser, main

SIZE = 32
TARGET = f"synthetic:mpii?size={SIZE}&persons=2&images_per_person=7"


@pytest.fixture
def base(tmp_path):
    path = tmp_path / "base.safetensors"
    save_model(path, truncated_tiny_gaze_net(), "tiny_gaze_net")
    return str(path)


def _run(argv):
    args = build_parser().parse_args(argv)
    args.func(args)


def test_alfa_personalize_method_tpgaze_sizes_the_prompts_from_the_data(tmp_path, base, capsys):
    # every person failed: "the prompts were sized for a 224×224 input, got 32×32 (set TPGazeConfig.image_size …)"
    out = tmp_path / "ad"
    argv = ["personalize", "--checkpoint", base, "--data", TARGET, "--method", "tpgaze", "--out", str(out)]
    assert main([*argv, "--steps", "1", "--quiet"]) == 0
    captured = capsys.readouterr()
    assert "2 done, 0 already there, 0 failed" in captured.out
    # without --init it starts from random prompts: said (alfa tpgaze personalize asks for --no-meta to mean it)
    assert "note: --method tpgaze without --init starts every person from random prompts" in captured.err
    config = alfa.read_adapter_metadata(out / "p00.safetensors")["config"]
    assert config["image_size"] == SIZE
    # a size the user chose is kept; one the images do not have is refused in one line naming the option
    other = ["--out", str(tmp_path / "ad2"), "--steps", "1", "--quiet"]
    assert main([*argv[:-2], *other, "--option", "image_size=48"]) == 2
    err = capsys.readouterr().err
    assert "--option image_size=48: TPGaze's prompts are sized for 48×48 images" in err
    assert f"use --option image_size={SIZE}" in err and "TPGazeConfig" not in err
    assert not (tmp_path / "ad2").exists()
    assert main([*argv[:-2], *other, "--option", f"image_size={SIZE}"]) == 0


@pytest.mark.parametrize(
    "command",
    [
        ["personalize", "--method", "tpgaze"],
        ["tpgaze", "personalize", "--no-meta"],
    ],
)
def test_both_tpgaze_commands_refuse_an_n_adapt_no_person_has_up_front(tmp_path, base, command):
    # tpgaze personalize went on and failed every person, one by one
    argv = [*command, "--checkpoint", base, "--data", TARGET, "--out", str(tmp_path / "ad"), "--quiet"]
    with pytest.raises(ValueError, match="--n-adapt 12: a person needs those first images plus at least one"):
        _run([*argv, "--n-adapt", "12", "--steps", "1"])
    assert not list((tmp_path / "ad").glob("*.safetensors"))  # no folder, or an empty one


@pytest.mark.parametrize(
    "command",
    [
        ["personalize", "--method", "tpgaze"],
        ["tpgaze", "personalize", "--no-meta"],
    ],
)
def test_both_commands_make_the_one_set_of_checks(tmp_path, base, command, monkeypatch):
    import alfa.cli.guards as guards

    seen = []
    monkeypatch.setattr(guards, "check_method_fits", lambda model, method: seen.append(method.method))
    monkeypatch.setattr(guards, "refuse_n_adapt_no_one_has", lambda *args: seen.append("n_adapt"))

    def stop(*args):
        raise RuntimeError("checked")

    monkeypatch.setattr(guards, "refuse_foreign_adapters", stop)
    with pytest.raises(RuntimeError, match="checked"):
        _run([*command, "--checkpoint", base, "--data", TARGET, "--out", str(tmp_path / "ad"), "--quiet"])
    assert seen == ["tpgaze", "n_adapt"]


def test_meta_trained_prompts_of_another_size_are_refused_naming_the_file(tmp_path, base):
    source = "synthetic:eth?size=48&persons=3&images_per_person=6"
    meta = tmp_path / "meta"
    fast = ["--epochs", "1", "--steps-per-epoch", "1", "--batch-size", "4"]
    _run(["tpgaze", "meta-train", "--checkpoint", base, "--data", source, "--out", str(meta), "--quiet", *fast])
    prompts = str(meta / "prompts.safetensors")
    for argv in (
        ["tpgaze", "personalize", "--meta", prompts],
        ["personalize", "--method", "tpgaze", "--init", prompts],
    ):
        flag = argv[-2]
        with pytest.raises(
            ValueError, match=f"{flag} {prompts}: TPGaze's prompts are sized for 48×48 images, .* 32×32"
        ):
            _run([*argv, "--checkpoint", base, "--data", TARGET, "--out", str(tmp_path / "ad"), "--quiet"])
        assert not list((tmp_path / "ad").glob("*.safetensors"))  # no folder, or an empty one


def test_init_with_a_method_that_trains_no_prompts_is_refused_before_the_checkpoint_is_read(tmp_path, capsys):
    # it came after the checkpoint was loaded: under load, minutes for one line a look at the options gives
    missing = tmp_path / "not-there.safetensors"  # never opened: the refusal comes first
    argv = ["personalize", "--checkpoint", str(missing), "--data", TARGET, "--method", "alfa"]
    assert main([*argv, "--init", str(tmp_path / "prompts.safetensors"), "--out", str(tmp_path / "ad")]) == 2
    err = capsys.readouterr().err
    assert "--init (meta-trained prompts) only applies to a method that trains prompts, not alfa" in err, err
    assert err.count("\n") == 1 and not (tmp_path / "ad").exists()
