"""What every ``alfa <command> --help`` must say, checked on the whole parser: what the command does, no precision
it does not take, repeatable options said to be so, defaults as the code has them, words unbroken at their hyphens,
and ``alfa bench --methods`` naming what the benchmark accepts."""

import argparse
import re

import pytest

from alfa.cli import build_parser
from alfa.cli.options import precision_help
from alfa.gaze.precision import PRECISIONS


def _commands(parser=None, path=("alfa",)):
    """Every parser of ``alfa`` (the top one, each group, each command) with its command line."""
    parser = parser or build_parser()
    yield " ".join(path), parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, (*path, name))


def _option(parser, dest):
    return next((a for a in parser._actions if a.dest == dest), None)


def test_every_command_says_what_it_does():
    """A one-line help in its parent's listing and a description at the top of its own --help."""
    missing = []
    for name, parser in _commands():
        if not (parser.description or "").strip():
            missing.append(f"{name}: no description")
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                missing += [f"{name} {c.dest}: no help line" for c in action._choices_actions if not c.help]
    assert missing == []


def test_no_help_names_a_precision_its_command_does_not_take():
    wrong = []
    for name, parser in _commands():
        option = _option(parser, "precision")
        taken = set(option.choices) if option is not None else set()
        text = parser.format_help()
        wrong += [f"{name}: {p}" for p in PRECISIONS if p not in taken and re.search(rf"\b{p}\b", text)]
    assert wrong == []


@pytest.mark.parametrize("choices", [("fp32",), ("fp32", "bf16"), ("fp32", "fp16"), PRECISIONS])
@pytest.mark.parametrize("trains", [True, False])
def test_the_precision_help_describes_only_the_given_choices(choices, trains):
    text = precision_help(choices, trains)
    assert all(p in text for p in choices) and not any(p in text for p in PRECISIONS if p not in choices)
    assert ("optimizer" in text) == (trains and len(choices) > 1)  # a command that trains nothing: no optimizer


def test_a_repeatable_option_says_so():
    quiet = [
        f"{name} {a.option_strings[0]}"
        for name, parser in _commands()
        for a in parser._actions
        if isinstance(a, argparse._AppendAction) and "repeatable" not in (a.help or "")
    ]
    assert quiet == []


def test_a_default_written_into_a_help_is_the_options_default():
    """A help that states its option's default in words (not through ``%(default)s``) states the value the option
    has: a number typed by hand drifts from the code's."""
    wrong = []
    for name, parser in _commands():
        for action in parser._actions:
            text = action.help or ""
            if not action.option_strings or action.default in (None, False) or "%(default" in text:
                continue
            stated = re.search(r"(?:\(|; )default ([^\s;)]+)", text)
            value = action.default
            forms = {str(value), ",".join(map(str, value)) if isinstance(value, list) else ""}
            forms |= {f"{value:g}"} if isinstance(value, (int, float)) else set()
            if stated is not None and stated.group(1).rstrip(",") not in forms:
                wrong.append(f"{name} {action.option_strings[0]}: says {stated.group(1)!r}, is {value!r}")
    assert wrong == []


def test_bench_methods_help_names_every_method_the_benchmark_accepts():
    from alfa.cli.bench import _methods_help
    from alfa.study.bench.config import BenchConfig

    with pytest.raises(ValueError, match="unknown method") as e:
        BenchConfig.quick(methods=("no-such-method",)).validate()
    accepted = re.search(r"methods are (.*?), and the user-calibration rows", str(e.value)).group(1).split(", ")
    listed = re.search(r"out of: (.*?) \(docs/", _methods_help()).group(1).split(", ")
    assert listed == accepted


@pytest.mark.parametrize("columns", ["60", "80", "120"])
def test_no_help_line_breaks_a_word_at_its_hyphen(columns, monkeypatch):
    """A path (docs/real-data.md), an option (--n-adapt) or a name (eth-xgaze-h5) stays whole on its line."""
    monkeypatch.setenv("COLUMNS", columns)
    broken = [
        f"{name}: {line.strip()}"
        for name, parser in _commands()
        for line in parser.format_help().splitlines()
        if re.search(r"\w-$", line)
    ]
    assert broken == []


def _described(parser) -> list[tuple]:
    """What a parser parses: each action's options, destination, default, choices (a group's: its commands' names)
    and count of values."""
    return [
        (
            a.option_strings,
            a.dest,
            repr(a.default),
            list(a.choices) if isinstance(a.choices, dict) else a.choices,
            a.nargs,
        )
        for a in parser._actions
    ]


def test_the_parser_of_one_command_line_builds_that_command_as_the_whole_parser_does():
    """``main`` builds only the command its line names, the others listed by name and help: that command's parser,
    its defaults and every parser above it are the whole parser's, each of those lists what the whole one does, and
    no other command declares an option."""
    whole = {tuple(name.split()): p for name, p in _commands()}
    leaves = [n for n, p in whole.items() if not any(isinstance(a, argparse._SubParsersAction) for a in p._actions)]
    assert len(leaves) > 25
    for leaf in leaves:
        lazy = {tuple(name.split()): p for name, p in _commands(build_parser([*leaf[1:], "--an-option", "value"]))}
        on_path = {leaf[:n] for n in range(1, len(leaf) + 1)}
        assert set(lazy) == {name for name in whole if name[:-1] in on_path or name == ("alfa",)}, leaf
        for name, parser in lazy.items():
            if name in on_path:
                assert _described(parser) == _described(whole[name]), name
                assert parser._defaults.keys() == whole[name]._defaults.keys(), name
            else:
                assert [a.dest for a in parser._actions] == ["help"], f"{leaf} built {name} too"


@pytest.mark.parametrize(
    "argv, said",
    [
        (["--quiet", "demo", "--out", "x"], "alfa demo: error: unrecognized arguments: --quiet"),
        (["crate", "--bogus", "toy"], "alfa crate toy: error: unrecognized arguments: --bogus"),
        (["tpgaze", "--bogus", "personalize"], "alfa tpgaze personalize: error: the following arguments are required"),
    ],
)
def test_an_option_before_the_commands_words_is_refused_in_one_line(argv, said, tmp_path, monkeypatch, capsys):
    """Built from the words before the first option alone, the parser knew no command there and main failed with a
    traceback: such a line is parsed by the whole parser, which says what it always said."""
    from alfa.cli import main

    monkeypatch.chdir(tmp_path)
    try:
        status = main(argv)
    except SystemExit as e:  # argparse's own refusal
        status = e.code
    err = capsys.readouterr().err
    assert status == 2 and err.startswith(said) and err.count("\n") == 1, err
    assert list(tmp_path.iterdir()) == []
