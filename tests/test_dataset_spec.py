"""A dataset spec is an object in code and a string only at the edges: the two forms round-trip exactly."""

import pytest

from alfa.gaze.data.registry import DatasetSpec, open_dataset


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
