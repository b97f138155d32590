"""The command line's comma-separated lists (``--persons``, ``--panels``, ``--methods``, ``--seeds``…) are read by
one function, options.comma_list: items stripped, empty ones dropped; each option says what an empty list means."""

import argparse

import pytest

from alfa.cli import main
from alfa.cli.options import at_least, comma_list, comma_separated


@pytest.mark.parametrize(
    "text, items",
    [("a", ["a"]), ("a,b", ["a", "b"]), (" a , b,,c ,", ["a", "b", "c"]), (",", []), ("", []), (" , ", [])],
)
def test_a_comma_list_is_its_stripped_non_empty_items(text, items):
    assert comma_list(text) == items


def test_the_options_that_refuse_an_empty_list_say_so_in_one_line(capsys):
    with pytest.raises(argparse.ArgumentTypeError, match=r"^expected comma-separated values, got ' , '$"):
        comma_separated(at_least(0))(" , ")
    assert comma_separated(at_least(0))(" 3, 4,") == [3, 4]
    for argv, said in (
        (["crate", "toy", "--panels", " , "], "--panels ' , ' names no panel; choose from a, "),
        (["crate", "toy", "--panels", "a,e"], "--panels: unknown panel(s) 'e'; choose from a, "),
        (["bench", "--dry-run", "--pairs", ","], "--pairs ',' names no pair"),
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert said in err and err.count("\n") == 1, err
