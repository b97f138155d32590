"""How a command of ``alfa`` is declared: one :class:`Command` record each, turned into argparse subparsers by
:func:`add_commands`, the only place that builds them.

A command's module imports what needs an extra's packages inside its functions only (at module level nothing
beyond torch), so the parser builds with the library alone: a command whose options cannot be declared because
a package of an extra is missing is still listed, and running it says which package and which extra to install
(:func:`missing_package`) instead of failing for every command.
"""

from __future__ import annotations

import argparse
import dataclasses
import textwrap
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Command", "HelpFormatter", "PACKAGE_EXTRAS", "add_commands", "missing_package"]

PACKAGE_EXTRAS = {
    "kornia": "gaze",
    "tqdm": "gaze",
    "matplotlib": "gaze",
    "h5py": "gaze",
    "PIL": "gaze",
    "transformers": "hf",
    "peft": "hf",
    "onnx": "export",
    "onnxscript": "export",
    "onnxruntime": "export",
    "cv2": "camera",
    "skimage": "dev",
}
"""The optional packages (by import name) and the smallest extra of ``alfa-ttp`` that installs each
(``pyproject.toml``'s ``[project.optional-dependencies]``; ``study`` installs what ``gaze`` does, ``camera`` that and
OpenCV; scikit-image, whose packaged photos ``alfa predict skimage:NAME`` reads, comes with ``dev`` only)."""


@dataclass(frozen=True)
class Command:
    """One command (or group of subcommands) of ``alfa``.

    ``help`` is its line in the parent's listing, ``description`` the paragraph of its own ``--help``.
    ``add_arguments(parser)`` declares its options, importing what it needs first (before any option), and
    ``run(args)`` does the work; a command runs only through :func:`alfa.cli.main`, which reports its errors.
    ``outputs`` maps each output option's ``dest`` to whether it names a folder: they are checked writable
    before ``run`` starts, and each output folder is held (:func:`alfa.locks.hold`) while it runs, so that a
    second command cannot fill the same folder at once, unless it is one of ``shared``: a folder whose writers
    merge their work safely by themselves (a benchmark's pieces; a cache whose models are each made under a lock of
    their own). A file output that exists is refused before ``run`` starts unless ``--replace`` is given (added to
    every command that writes a file, where it has none),
    except one of ``pages`` (the outputs that are generated pages) that this command generated (it says "Do not
    edit by hand" and names the command: its regenerate command then runs as printed; ``rewrites`` names other
    commands whose pages this one regenerates alike) and
    those in ``keeps``: files the command adds to or checks itself (an access log it appends to, a
    record it updates under its own rule, the copy of the records of a run it resumes, which it checks itself).
    ``data_beside`` names the file outputs beside which the command writes the page's data as ``<name>.json``,
    ``plotted_beside`` those beside which it writes a figure's plotted data as ``<name>.plotted.json``
    (:func:`alfa.study.plotted.plotted_path`): those files are refused alike, and none may be another output.
    ``extra`` is the extra of ``alfa-ttp`` its packages come with (``None``: the library's own); subcommands
    inherit it. A file output is never inside a folder output, except one of ``mixed``: folders that hold other
    files beside the command's own, whose names it checks itself (alfa predict's crops). ``distributed``: the
    command runs as one job under ``torchrun`` (its processes share the work); every other command is refused
    there, since each process would run all of it into the same files. A command with ``subcommands`` is a group:
    only its leaves run. ``folder_kinds`` says what each folder output holds: ``"users"``, one file per person
    with their ``personalization.json`` (what ``alfa evaluate --adapters`` and ``alfa serve`` read as users), or
    ``"own"``, the command's own files (a model, a run's records); a folder holding the other kind is refused before
    ``run`` starts, since each would be read as the other (a model served as a user, a person named ``model``
    replacing it).
    """

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None] | None = None
    run: Callable[[argparse.Namespace], Any] | None = None
    description: str | None = None
    outputs: Mapping[str, bool] = field(default_factory=dict)
    shared: frozenset[str] = frozenset()
    keeps: frozenset[str] = frozenset()
    rewrites: tuple[str, ...] = ()
    pages: frozenset[str] = frozenset()
    data_beside: frozenset[str] = frozenset()
    plotted_beside: frozenset[str] = frozenset()
    extra: str | None = None
    mixed: frozenset[str] = frozenset()
    distributed: bool = False
    folder_kinds: Mapping[str, str] = field(default_factory=dict)
    subcommands: tuple[Command, ...] = ()


class HelpFormatter(argparse.HelpFormatter):
    """argparse's help layout, except that a line never breaks at a hyphen: a path (docs/real-data.md), an option
    (--n-adapt) or a name (eth-xgaze-h5) in a help text stays whole, so that it can be copied."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        return self._wrap(text, width, "")

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return "\n".join(self._wrap(text, width, indent))

    def _wrap(self, text: str, width: int, indent: str) -> list[str]:
        text = self._whitespace_matcher.sub(" ", text).strip()
        return textwrap.wrap(text, width, initial_indent=indent, subsequent_indent=indent, break_on_hyphens=False)


def add_commands(
    subparsers: argparse._SubParsersAction,
    commands: tuple[Command, ...],
    path: tuple[str, ...] = (),
    wanted: tuple[str, ...] | None = None,
) -> None:
    """Add ``commands`` to ``subparsers`` in their order. Each leaf's parser gets the defaults ``func`` (its
    ``run``), ``outputs``, ``held`` (the output folders to hold while it runs), ``command_path`` (``"crate
    toy"``, for messages), ``command_extra`` and ``stand_in`` (true for a command that cannot run here, see
    :func:`_stand_in`).

    ``wanted``: the words of a command line before its first option (``("crate", "toy")``). Then only the command
    they name is built whole; every other one is listed by its name and help alone, which is all a listing or an
    "invalid choice" shows, and a run declares tens of options, not the four hundred of every command. ``None``
    builds every command whole."""
    for command in commands:
        parser = subparsers.add_parser(
            command.name, help=command.help, description=command.description, formatter_class=HelpFormatter
        )
        if wanted is not None and wanted[:1] != (command.name,):
            continue
        names = (*path, command.name)
        files = _replaceable(command)
        if command.subcommands:
            inner = parser.add_subparsers(dest=f"{command.name}_command", required=True, metavar="command")
            subcommands = tuple(_inherit(c, command.extra) for c in command.subcommands)
            add_commands(inner, subcommands, names, None if wanted is None else wanted[1:])
            continue
        parser.set_defaults(
            func=command.run,
            outputs=dict(command.outputs),
            held=tuple(name for name, folder in command.outputs.items() if folder and name not in command.shared),
            replaceable=files,
            pages=tuple(name for name in files if name in command.pages),
            sidecars=_sidecars(command, files),
            command_path=" ".join(names),
            rewrites=command.rewrites,
            command_extra=command.extra,
            mixed=command.mixed,
            distributed=command.distributed,
            folder_kinds=dict(command.folder_kinds),
            stand_in=False,
        )
        try:
            if command.add_arguments is not None:
                command.add_arguments(parser)
        except ModuleNotFoundError as e:
            if missing_package(e, command.extra) is None:
                raise
            _stand_in(parser, e, command.extra)
            continue
        _check_outputs_spelled(parser, command, names)
        if files and "--replace" not in parser._option_string_actions:
            flags = " or ".join(f"--{name.replace('_', '-')}" for name in files)
            page = (
                ", except a page this command generated, which says so near its top: it is rewritten"
                if command.pages & set(files)
                else ""
            )
            parser.add_argument(
                "--replace",
                action="store_true",
                help=f"overwrite the file {flags} names if it exists (by default that is refused before anything "
                f"runs{page})",
            )


def _check_outputs_spelled(parser: argparse.ArgumentParser, command: Command, names: tuple[str, ...]) -> None:
    """Every output is the option ``--<dest>`` (``_`` as ``-``) and no other spelling: each message about an output
    names it so, and ``alfa.cli.main`` tells an output the command line gave from its default by those words."""
    for dest in command.outputs:
        flag = "--" + dest.replace("_", "-")
        action = parser._option_string_actions.get(flag)
        if action is None or action.dest != dest or action.option_strings != [flag]:
            spelled = [] if action is None else action.option_strings
            raise TypeError(
                f"alfa {' '.join(names)}: its output {dest!r} must be the option {flag} alone, declared as "
                f"{spelled or 'no option'}"
            )


def _replaceable(command: Command) -> tuple[str, ...]:
    """The command's file outputs that an existing file refuses without ``--replace``."""
    return tuple(name for name, folder in command.outputs.items() if not folder and name not in command.keeps)


SIDECARS = {"data_beside": (".json", "the page's data"), "plotted_beside": (".plotted.json", "the plotted data")}
"""What a command writes beside a file output (its :class:`Command` field -> the suffix that replaces the output's
own, and how a message names the file)."""


def _sidecars(command: Command, files: tuple[str, ...]) -> dict[str, tuple[str, str]]:
    """The file outputs beside which ``command`` writes another file: ``{dest: (suffix, words)}``."""
    return {name: kind for field_, kind in SIDECARS.items() for name in files if name in getattr(command, field_)}


def _inherit(command: Command, extra: str | None) -> Command:
    return command if command.extra is not None or extra is None else dataclasses.replace(command, extra=extra)


def _stand_in(parser: argparse.ArgumentParser, error: ModuleNotFoundError, extra: str | None) -> None:
    """Make ``parser`` a command that only says what is missing: :func:`alfa.cli.main` lets a stand-in take
    arguments it does not know, and no option it declared before the import failed is required, so that running
    it reaches that message rather than an error about its options."""
    parser.description = f"Not available here: {missing_package(error, extra)}."
    for action in parser._actions:
        action.required = False

    def run(args: argparse.Namespace) -> None:
        raise error

    parser.set_defaults(
        func=run,
        outputs={},
        held=(),
        replaceable=(),
        pages=(),
        sidecars={},
        mixed=frozenset(),
        distributed=False,
        stand_in=True,
    )


def missing_package(error: ModuleNotFoundError, extra: str | None = None) -> str | None:
    """What to tell a person for ``error``, the failed import of an optional package, in one line naming the
    package and the extra that installs it (``extra``, the command's, where it includes the package); ``None``
    if the missing module is not one of :data:`PACKAGE_EXTRAS` (then it is a bug, not a missing install)."""
    package = (error.name or "").split(".")[0]
    if package not in PACKAGE_EXTRAS:
        return None
    needed = PACKAGE_EXTRAS[package]
    if needed == "gaze" and extra in ("gaze", "study"):
        needed = extra
    setup = "gaze" if needed == "gaze" else "dev"  # setup.sh's two sets; "dev" holds the study
    return (
        f"this command needs {package}, which is not installed: install alfa's {needed} extra "
        f'(in the alfa folder: pip install -e ".[{needed}]", or ./scripts/setup.sh {setup})'
    )
