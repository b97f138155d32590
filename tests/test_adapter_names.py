"""A person's adapter file is named with the characters its docstring and ``alfa serve``'s user ids share."""

import string

import pytest

from alfa.fileio import safe_filename
from alfa.gaze.evaluate import adapter_filename
from alfa.gaze.service.limits import USER_ID


@pytest.mark.parametrize(
    ("person", "name"),
    [("é1", "_1"), ("Ω", "_"), ("p٣", "p_"), ("ｐ1", "_1"), ("naïve.id", "na_ve.id")],
)
def test_a_non_ascii_id_names_a_file_of_ascii_characters(person, name):
    # str.isalnum took 'é', '٣' and the full-width 'ｐ': a file no user id alfa serve takes could ever name
    assert adapter_filename(person) == f"{name}.safetensors"
    assert set(name) <= set(string.ascii_letters + string.digits + "._-")


@pytest.mark.parametrize(
    ("person", "name"),
    [("p00", "p00"), ("a b", "a_b"), ("x/y", "x_y"), ("a=b", "a_b"), ("", "_"), ("-x", "-x"), ("..", "..")],
)
def test_an_ascii_id_keeps_the_file_name_it_always_had(person, name):
    assert adapter_filename(person) == f"{name}.safetensors"


def test_the_served_ids_and_the_file_names_are_one_character_rule():
    from alfa.fileio import PORTABLE_CHARS

    for code in range(0x3000):
        c = chr(code)
        assert bool(USER_ID.fullmatch("a" + c)) == (c in PORTABLE_CHARS), repr(c)
        assert (adapter_filename(c) == f"{c}.safetensors") == (c in PORTABLE_CHARS), repr(c)
    assert PORTABLE_CHARS == set(string.ascii_letters + string.digits + "._-")
    # every id the service takes names its own file, unchanged
    for user in ("p00", "User.2", "a-b_c", "9"):
        assert adapter_filename(user) == f"{user}.safetensors"
    # the folder names of labels and specs keep their own rule (their '=' and letters name existing folders)
    assert safe_filename("rank=4") == "rank=4" and safe_filename("données") == "données"
