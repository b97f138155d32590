"""A dataset spec is an object in code and a string only at the edges: the two forms round-trip exactly."""

import re

import pytest

from alfa.gaze.data.registry import DatasetSpec, open_dataset, split_spec


@pytest.mark.parametrize(
    "text",
    [
        "synthetic:eth?size=64&persons=100&images_per_person=100",
        "synthetic:mpii",
        "gazehub:gaze360:/data/Gaze360?split=val&size=224",
        "xgaze-h5:/data/xgaze/subject0000.h5",
    ],
)
def test_a_spec_string_parses_and_prints_back_the_same(text):
    assert str(DatasetSpec.parse(text)) == text


def test_options_keep_their_order_and_changes_replace_or_append():
    spec = DatasetSpec.synthetic("eth", size=64, persons=10)
    assert str(spec) == "synthetic:eth?size=64&persons=10"
    assert str(spec.with_options(persons=3, split="val")) == "synthetic:eth?size=64&persons=3&split=val"
    assert DatasetSpec.parse("Synthetic:eth?size=8").kind == "synthetic"


def test_an_object_opens_what_its_string_opens():
    spec = DatasetSpec.synthetic("mpii", size=16, persons=2, images_per_person=3)
    a, b = open_dataset(spec), open_dataset(str(spec))
    assert len(a) == len(b) == 6 and (a[0]["image"] == b[0]["image"]).all()


@pytest.mark.parametrize(
    "text, message",
    [
        ("eth", "expected one of"),
        ("synthetic:eth?size", "bad option 'size'"),
    ],
)
def test_a_malformed_spec_says_what_is_wrong(text, message):
    with pytest.raises(ValueError, match=message):
        DatasetSpec.parse(text)


def test_an_option_value_of_the_wrong_kind_says_so_in_words():
    with pytest.raises(ValueError, match=r"option 'size=3x2': expected a whole number$"):
        open_dataset("synthetic:eth?size=3x2")


@pytest.mark.parametrize("persons", ["x", "p00,p01", "3,4"])
def test_a_synthetic_world_takes_a_count_of_persons_and_says_so_for_names(persons):
    with pytest.raises(ValueError, match=r"takes how many persons to make \(a whole number\); names of persons are"):
        open_dataset(f"synthetic:mpii?persons={persons}&size=16&images_per_person=2")
    assert open_dataset("synthetic:mpii?persons=2&size=16&images_per_person=2").persons() == ["p00", "p01"]


@pytest.mark.parametrize(
    "text, parts",
    [
        ("synthetic:eth", ("synthetic", "eth", "")),
        (" Synthetic :eth?size=8&persons=2", ("synthetic", "eth", "size=8&persons=2")),
        ("gazehub:gaze360:/data/Gaze360?split=val", ("gazehub", "gaze360:/data/Gaze360", "split=val")),
        ("xgaze-h5:C:/data/x.h5", ("xgaze-h5", "C:/data/x.h5", "")),  # colons after the kind belong to the target
        ("synthetic:eth?", ("synthetic", "eth", "")),
    ],
)
def test_the_one_reading_of_a_spec_string_splits_kind_target_and_query(text, parts):
    assert split_spec(text) == parts


@pytest.mark.parametrize(
    "text, message",
    [
        ("eth", "expected one of synthetic:<domain>, gazehub:<dataset>:<root>"),
        ("synthetic:", "expected one of synthetic:<domain>"),
        ("synthetic:eth?size", "bad option 'size'; options are split, size, seed"),
        ("synthetic:eth?size=8&size=9", "option 'size' given twice"),
    ],
)
def test_parse_and_open_refuse_a_malformed_spec_in_the_same_words(text, message):
    """DatasetSpec.parse and open_dataset read a spec by the same functions: one line, naming the spec."""
    for read in (DatasetSpec.parse, open_dataset):
        with pytest.raises(ValueError) as e:
            read(text)
        assert str(e.value).startswith(f"dataset spec {text!r}: ") and message in str(e.value)
        assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "text, message",
    [
        ("video:/x.mp4", "unknown kind 'video'; expected one of synthetic:<domain>"),
        (
            "gazehub:mpii:/x?fps=3",
            "bad option 'fps=3'; options are split, size, check_files, verify_3d, stored_order, ",
        ),
        (
            "gazehub:mpii:/x?split",
            "bad option 'split'; options are split, size, check_files, verify_3d, stored_order, ",
        ),
        ("synthetic:eth?seed=1&seed=1", "option 'seed' given twice"),
        ("synthetic:eth?size=0", "option 'size=0': size must be at least 1, got 0"),
        ("synthetic:eth?seed=-1", "option 'seed=-1': seed must be at least 0, got -1"),  # numpy's words, unnamed
        ("synthetic:eth?images_per_person=0", "option 'images_per_person=0': images_per_person must be at least 1"),
        ("synthetic:eth?size=8", "size must be a whole number of at least 16 for a synthetic world (its eyes need"),
        ("synthetic:eth?persons=0", "persons must be a whole number of at least 1, got 0"),
    ],
)
def test_open_refuses_what_the_kind_does_not_take(text, message):
    """Opening also knows the kind: its options are the ones a bad option's message lists."""
    with pytest.raises(ValueError, match="^" + re.escape(f"dataset spec {text!r}: {message}")):
        open_dataset(text)


def test_the_readers_of_a_spec_elsewhere_take_its_parts_from_the_registry(tmp_path):
    """What the command line checks as an input (the file or folder a spec names) and the calibration page's
    world names come from the same reading."""
    from alfa.cli import _data_path
    from alfa.study.bench.calibration import _training_set, _world_of

    folder = tmp_path / "a:b"
    folder.mkdir()
    assert _data_path(f"gazehub:mpii:{folder}?size=8") == folder.resolve()
    assert _data_path(f"xgaze-h5:{folder}") == folder.resolve()
    assert _data_path("synthetic:eth") is None and _data_path("eth") is None and _data_path("gazehub:mpii:/no") is None
    spec = "synthetic:mpii-v2?split=train&persons=80&images_per_person=200"
    assert _training_set(spec) == "mpii-v2 (train), 80 × 200" and _world_of("synthetic:mpii-v2?size=64") == "mpii-v2"
