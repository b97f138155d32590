"""The ``alfa`` command: a thin layer over the library, the gaze application and the study.

Each command is declared once, as a :class:`~alfa.cli.registry.Command` in the module of its part
(:mod:`~alfa.cli.library`, :mod:`~alfa.cli.study`, :mod:`~alfa.cli.gaze`, :mod:`~alfa.cli.tpgaze`,
:mod:`~alfa.cli.bench`, :mod:`~alfa.cli.crate`, :mod:`~alfa.cli.camera`); the options several share are in
:mod:`~alfa.cli.options`.
:data:`COMMANDS` is their order in ``alfa --help``. :func:`main` is the one place where an error a person can
fix (a bad option value, a missing or unreadable file, a package not installed, an output folder another
running command holds, a full disk, a port in use) becomes one line on stderr and exit status 2, never a
traceback; an error of the operating system names its path and says what to do (:func:`error_line`). A warning
shown while a command runs is one line too (:func:`alfa.cli.errors.one_line_warnings`).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import itertools
import os
import re
import select
import signal
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

from alfa.fileio import new_files, os_error_in

from . import bench, calibrate, camera, crate, gaze, library, llm, pnpga, serve, study, throughput, tpgaze
from .errors import OS_ERROR_ADVICE, error_line, one_line_warnings
from .interrupts import (
    AFTER_THE_WORK,
    Interrupts,
    Stamps,
    Terminated,
    close_progress_bars,
    interrupted_line,
    output_stamps,
    quiet_shutdown,
    watching,
)
from .options import page_head, torch_threads
from .registry import Command, HelpFormatter, add_commands, missing_package

__all__ = ["COMMANDS", "USER_ERRORS", "OS_ERROR_ADVICE", "build_parser", "error_line", "main", "quiet_shutdown"]

COMMANDS: tuple[Command, ...] = (
    library.SUMMARY,
    study.EXAMPLE,
    study.SPEED,
    library.EXPORT,
    study.SERVING,
    serve.SERVE,
    camera.PREDICT,
    study.PAGES,
    study.COSTS,
    gaze.PRETRAIN,
    gaze.TRUNCATE,
    gaze.PERSONALIZE,
    throughput.THROUGHPUT,
    gaze.EVALUATE,
    gaze.DEMO,
    tpgaze.TPGAZE,
    pnpga.PNPGA,
    calibrate.CALIBRATE,
    calibrate.FAZE,
    bench.BENCH,
    bench.REPORT,
    bench.POWER,
    crate.CRATE,
    llm.LLM,
)
DISTRIBUTED_COMMANDS = tuple(c.name for c in COMMANDS if c.distributed)  # the only ones torchrun runs as one job

USER_ERRORS = (ValueError, RuntimeError, FloatingPointError, OSError)
"""What the commands raise for input a person can fix: bad options, shapes or files (``ValueError``, which
``CheckpointError`` is), work that failed on that input (``RuntimeError``, ``FloatingPointError``: a diverging
loss), a file that is missing, unreadable or unwritable (``OSError``)."""


class _Parser(argparse.ArgumentParser):
    """argparse's parser, except that a refused argument is one line, as every other error of ``alfa`` is: the
    command, the error, and where the command's options are listed (argparse prints its usage block first); and
    that an option is written whole: a shortened one (``--ou`` for ``--out``) would mean another option, or none,
    once a command gains options, and a script that checks a command line for ``--out`` (``scripts/queue.sh``)
    would not see it. Every command's parser is of this class."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The ``alfa`` parser: every command of :data:`COMMANDS`, each leaf's handler set as ``func``. Given the command
    line ``argv``, only the command it names is built whole, the others listed by name and help
    (:func:`~alfa.cli.registry.add_commands`): what :func:`main` parses, in a few milliseconds."""
    from alfa import __version__

    parser = _Parser(
        prog="alfa",
        formatter_class=HelpFormatter,
        description="Alfa (Attentive Low-Rank Filter Adaptation): truncate, personalize and evaluate gaze models, "
        "and the benchmark around them. Each command says more with --help.",
        epilog="The gaze pipeline: pretrain, truncate, personalize, evaluate (docs/gaze.md). --data takes a dataset "
        "spec: synthetic:<world> for the built-in worlds (docs/synthetic.md), or a real dataset's "
        "(docs/real-data.md).",
    )
    parser.add_argument("--version", action="version", version=f"alfa {__version__}")
    wanted = None if argv is None else tuple(itertools.takewhile(lambda word: not word.startswith("-"), argv))
    add_commands(parser.add_subparsers(dest="command", required=True, metavar="command"), COMMANDS, wanted=wanted)
    return parser


INPUT_OPTIONS = (
    "checkpoint",
    "adapter",
    "adapters",
    "init",
    "meta",
    "results",
    "images",
    "camera",
    "screen",
    "screen_fit",
    "members",
)
"""The options by which every command names the files and folders it reads (never written by it); one that takes
several (``alfa predict``'s photos) names each."""

DATA_OPTIONS = ("data", "val_data", "source_data")
"""The options that name a dataset spec, whose files (``gazehub:<dataset>:<root>``, ``xgaze-h5:<file>``) are
inputs too."""


READ_WHOLE = ("adapters", *DATA_OPTIONS)
"""The input folders a command reads file by file (a person's adapter and record each, a dataset's files): a file
output inside one would be read as one of them."""


def _refuse_inputs_as_outputs(args: argparse.Namespace) -> None:
    """An output is never one of the command's inputs, and an output folder never holds one (the command would
    write its own files there, a person's adapter named like the checkpoint among them; a dataset's files are
    inputs too); two outputs are never one path, and a file output never replaces a ``.safetensors`` file (no
    command writes a model or an adapter as a single file: it is someone's model)."""
    inputs: list[tuple[str, str, Path]] = []  # (option, as given, resolved)
    for name in INPUT_OPTIONS:
        given = getattr(args, name, None)
        inputs += [(name, v, _resolved(v)) for v in ([given] if isinstance(given, str) else given or []) if v]
    for name in DATA_OPTIONS:
        if isinstance(spec := getattr(args, name, None), str) and (root := _data_path(spec)) is not None:
            inputs.append((name, spec, root))
    outputs: dict[Path, str] = {}
    folders = [
        (name, v, _resolved(v))
        for name, f in args.outputs.items()
        if f and name not in getattr(args, "mixed", ()) and (v := getattr(args, name, None))
    ]
    read_whole = [i for i in inputs if i[0] in READ_WHOLE]
    for name, folder in args.outputs.items():
        value = getattr(args, name, None)
        if value is None:
            continue
        out = _resolved(value)
        # A file among those a folder holds: a folder output's own files (a benchmark's results.json) or a folder
        # the command reads (an access log appended to a person's record).
        for source, given, path in [] if folder else [*folders, *read_whole]:
            if out.is_relative_to(path) and out != path and (source in args.outputs or path.is_dir()):
                what = "writes its own files" if source in args.outputs else "reads"
                raise ValueError(
                    f"--{_flag(name)} {value} is inside {_option(source)} {given}, where this command {what}: "
                    "write it elsewhere"
                )
        for source, given, path in inputs:
            if out == path:
                raise ValueError(f"--{_flag(name)} {value} is this command's {_option(source)}: choose another path")
            # photos may sit in a folder of crops: those are named after them and never replace one (alfa predict)
            if folder and source != "images" and path.is_relative_to(out) and path != out:
                raise ValueError(
                    f"--{_flag(name)} {value} holds this command's {_option(source)} {given}, which its output could "
                    "replace: write elsewhere"
                )
        if out in outputs:  # the second write would replace the first
            raise ValueError(f"{_named(args, name, value)} is also {outputs[out]}: name two paths")
        outputs[out] = f"this command's {_named(args, name, value)}"
        if not folder and out.suffix == ".safetensors" and out.is_file():
            raise ValueError(f"--{_flag(name)} {value} is a model or adapter file, which this command would replace")
    for name, (suffix, words) in getattr(args, "sidecars", {}).items():  # what a file output writes beside it
        if (value := getattr(args, name, None)) is not None and (
            beside := _resolved(value).with_suffix(suffix)
        ) in outputs:
            if beside == _resolved(value):  # the page named .json: its data would replace it
                raise ValueError(f"--{_flag(name)} {value}: {words} goes beside it as {suffix}; name the page .md")
            raise ValueError(f"--{_flag(name)} {value}: {words} goes to {beside}, which is also {outputs[beside]}")


def _refuse_a_folder_of_the_other_kind(args: argparse.Namespace) -> None:
    """A users' folder output (``Command.folder_kinds``) holding a model, or a folder of the command's own files
    holding users' files, in one line: alfa serve would take the model for a user, or the files for users."""
    kinds = getattr(args, "folder_kinds", {})
    if not kinds:
        return
    from alfa.gaze.folder_record import RECORD_FILE  # here: the library's commands declare no kinds
    from alfa.gaze.train_state import MODEL_FILE

    for name, kind in kinds.items():
        if (value := getattr(args, name, None)) is None:
            continue
        if kind == "users" and (Path(value) / MODEL_FILE).is_file():
            raise ValueError(
                f"--{_flag(name)} {value} holds a model ({MODEL_FILE}): users' files beside it would be read "
                "with the model among them (alfa evaluate, alfa serve); choose another folder"
            )
        if kind == "own" and (Path(value) / RECORD_FILE).is_file():
            raise ValueError(
                f"--{_flag(name)} {value} holds users' files ({RECORD_FILE}, from alfa personalize or alfa "
                "calibrate): this command's files there would be read as a user's; choose another folder"
            )


def _option(dest: str) -> str:
    """How a message names an input: ``--checkpoint``, or ``IMAGE`` for a positional argument."""
    return "IMAGE" if dest == "images" else f"--{_flag(dest)}"


def _data_path(spec: str) -> Path | None:
    """The file or folder a dataset spec reads (what follows one of its colons and exists), ``None`` for a
    synthetic world or a spec that names none (or is no spec: opening it says why)."""
    from alfa.gaze.data.registry import split_spec

    try:
        kind, target, _ = split_spec(spec)
    except ValueError:
        return None
    if kind == "synthetic":
        return None
    parts = target.split(":")
    for i in range(len(parts)):
        candidate = ":".join(parts[i:])
        if candidate and Path(candidate).exists():
            return _resolved(candidate)
    return None


def _resolved(value: str) -> Path:
    """``value`` resolved; a loop of symbolic links is the ``OSError`` it is on newer Pythons (3.11 raises
    ``RuntimeError``), which :func:`error_line` explains."""
    try:
        return Path(value).resolve()
    except RuntimeError:
        raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), value) from None


def _flag(dest: str) -> str:
    return dest.replace("_", "-")


def _named(args: argparse.Namespace, dest: str, value: str) -> str:
    """``--cache-dir runs/cache`` as a message names an output, with "(its default)" where the command line did not
    give it: a person who never typed it would not know where it came from."""
    given = getattr(args, "given_options", None)
    return f"--{_flag(dest)} {value}" + ("" if given is None or dest in given else " (its default)")


def _check_outputs(args: argparse.Namespace) -> None:
    """Every output a command was given must be writable before it starts (not after an hour of work), and none
    may be or hold one of its inputs: each command lists its outputs as ``outputs={dest: is_folder}``."""
    from alfa.fileio import check_writable

    for name, folder in args.outputs.items():
        value = getattr(args, name, None)
        if value == "":  # an unset shell variable: not the current folder
            raise ValueError(f"--{_flag(name)} is empty: name a {'folder' if folder else 'file'}")
        if value == "-":  # the Unix habit for standard output: here it would make a file named "-"
            raise ValueError(
                f"--{_flag(name)} -: name a {'folder' if folder else 'file'} (this output is not written to stdout)"
            )
        if not folder and isinstance(value, str) and value.endswith(os.sep):
            raise ValueError(f"--{_flag(name)} {value} ends in {os.sep}, as a folder does: name a file")
    _refuse_inputs_as_outputs(args)
    _refuse_a_folder_of_the_other_kind(args)
    for name, folder in args.outputs.items():
        value = getattr(args, name, None)
        if value is not None:
            appended = not folder and name not in args.replaceable  # one of `keeps`: an access log
            check_writable(value, folder=folder, what=f"--{_flag(name)}", appended=appended)
    for name in () if getattr(args, "replace", False) else args.replaceable:
        value = getattr(args, name, None)
        writers = (args.command_path, *getattr(args, "rewrites", ()))
        # a page this command generated is rewritten, and its data beside it, which is ours too
        if value is None or (name in args.pages and _generated_by(Path(value), writers)):
            continue
        if os.path.lexists(value):  # a link to nowhere too: what it names would be written
            raise ValueError(f"--{_flag(name)} {value}: exists; name another file, or add --replace to overwrite it")
        sidecars = getattr(args, "sidecars", {})
        if name in sidecars and (beside := Path(value).with_suffix(sidecars[name][0])).exists():
            raise ValueError(
                f"--{_flag(name)} {value}: {sidecars[name][1]} goes to {beside}, which exists; name another "
                "file, or add --replace to overwrite it"
            )


def _generated_by(path: Path, command_paths: tuple[str, ...]) -> bool:
    """A page one of ``command_paths`` generated: near its top it says it is not to be edited by hand and names
    ``alfa <command path>``. Rewriting it with its regenerated form loses nothing a person wrote, so its regenerate
    command runs as the page prints it. Anything else, a page another command generated among it, is not this
    command's to replace unasked."""
    head = page_head(path)
    names = re.compile(r"alfa (" + "|".join(re.escape(c) for c in command_paths) + r")( |$)")
    named = re.findall(r"`([^`]*)`", head)
    return "do not edit by hand" in head.lower() and any(names.match(c) for c in named)


@contextlib.contextmanager
def _hold_outputs(args: argparse.Namespace, name: str) -> Iterator[None]:
    """Hold every output folder of the command (``args.held``) while it runs: a second command writing into one
    of them at the same time is refused, instead of both finishing with each other's files mixed there."""
    from alfa.locks import hold, share

    with contextlib.ExitStack() as stack:
        # A benchmark's pieces fill one folder together, and no one else; runs share a cache of base models, each
        # made under its own lock (alfa llm bench's --cache).
        for dest in _shared_folders(args):
            if getattr(args, dest, None) is not None:
                stack.enter_context(share(getattr(args, dest), name))
        # The processes of one torchrun job write one folder together: its rank 0 holds it for all of them (a
        # second job's rank 0 is refused, and torchrun then stops that job's other ranks).
        shared_job = os.environ.get("RANK", "0") != "0"
        seen: set[Path] = set()
        for dest in () if shared_job else args.held:
            value = getattr(args, dest, None)
            if value is None or (folder := Path(value).resolve()) in seen:
                continue
            seen.add(folder)
            note = stack.enter_context(hold(folder, name)).stale_note()
            if note is not None:
                print(f"{name}: note: {note}", file=sys.stderr)
        yield


def _processes() -> int:
    """How many processes the launcher (torchrun) started for this job: its ``WORLD_SIZE``, 1 if none or unreadable."""
    try:
        return int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        return 1


def _shared_folders(args: argparse.Namespace) -> list[str]:
    """The command's output folders its processes share, each writing its part (``Command.shared``): held by none."""
    return [dest for dest, folder in getattr(args, "outputs", {}).items() if folder and dest not in args.held]


def _new_file_outputs(args: argparse.Namespace) -> list[Path]:
    """The files this command writes that do not exist as it starts (without --replace): one another command
    writes meanwhile is not replaced either (:func:`alfa.fileio.new_files`). Not for a command whose processes share
    all their work (a benchmark's pieces write one page in turn); one that holds its own folder and shares only a
    cache (alfa llm bench) writes its files alone."""
    if getattr(args, "replace", False) or (_shared_folders(args) and not args.held):
        return []
    paths = []
    for name in getattr(args, "replaceable", ()):
        if (value := getattr(args, name, None)) is not None:
            paths.append(Path(value))
            if name in (sidecars := getattr(args, "sidecars", {})):
                paths.append(Path(value).with_suffix(sidecars[name][0]))
    return [p for p in paths if not os.path.lexists(p)]


@contextlib.contextmanager
def _quiet_loading(args: argparse.Namespace) -> Iterator[None]:
    """``--quiet`` silences the loaders' progress bars too (:func:`~alfa.gaze.data.base.loading_progress`)."""
    if not getattr(args, "quiet", False):
        yield
        return
    try:
        from alfa.gaze.data.base import loading_progress
    except ModuleNotFoundError:  # a library-only install: no loader, nothing to silence
        yield
        return
    with loading_progress(False):
        yield


def main(argv: list[str] | None = None) -> int:
    """Run ``alfa`` on ``argv`` (default: the process's arguments); the exit status."""
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(argv)
    args, unknown = parser.parse_known_args(argv)
    if not hasattr(args, "func"):  # an option before the command's words: the whole parser says what argparse says
        parser = build_parser()
        args, unknown = parser.parse_known_args(argv)
    # the options the line gave, by their dests: an output is its --<dest> alone (registry), never abbreviated
    args.given_options = frozenset(w[2:].split("=")[0].replace("-", "_") for w in argv if w.startswith("--"))
    name = f"alfa {args.command_path}"
    if unknown and not args.stand_in:  # what parse_args says; a stand-in goes on to say what is missing
        print(f"{name}: error: unrecognized arguments: {' '.join(unknown)} (see {name} --help)", file=sys.stderr)
        return 2
    if _processes() > 1 and not args.distributed and not args.stand_in:
        # Each process would run all of it, into the same files: said once under torchrun, by its first process.
        if os.environ.get("RANK", "0") == "0" or "TORCHELASTIC_RUN_ID" not in os.environ:
            jobs = " and ".join(f"alfa {c}" for c in DISTRIBUTED_COMMANDS)
            print(f"{name}: error: only {jobs} run as one job of several processes (WORLD_SIZE={_processes()}, as "
                  f"torchrun sets it); run {name} in one process", file=sys.stderr)  # fmt: skip
        return 2
    interrupts, stamps = Interrupts(), None
    args.interrupts = interrupts  # a command that handles a Ctrl-C itself says so (Interrupts.handled)
    try:
        _check_outputs(args)
        stamps = output_stamps(args)  # which of its files it writes whole before a Ctrl-C (interrupted_line)
        with (
            watching(interrupts),
            one_line_warnings(name, keep_python_form=getattr(args, "verbose", False) is True),
            _hold_outputs(args, name),
            _quiet_loading(args),
            torch_threads(args),
        ):
            with new_files(_new_file_outputs(args)):
                args.func(args)
                interrupts.work_done()  # all written: a Ctrl-C from here on is no failure (alfa.cli.interrupts)
    except KeyboardInterrupt as stop:
        return _stopped(args, stamps, stop.signal if isinstance(stop, Terminated) else None)
    except BrokenPipeError as e:
        if not _stdout_broken():  # another pipe (a socket, a child process's): the command's error, in one line
            return _error_status(e, args, name)
        # what read the output closed it (`| head`): stop quietly, as a tool SIGPIPE ends does
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's last flush must not fail too
        return 141
    except Exception as e:
        if interrupts.early:  # a Ctrl-C a library swallowed, then failed of (torch's exporter, stopped mid-import)
            return _stopped(args, stamps, interrupts.terminated)
        return _error_status(e, args, name)
    if interrupts.late:
        print(AFTER_THE_WORK, file=sys.stderr)
    return 0


def _stopped(args: argparse.Namespace, stamps: Stamps | None, terminated: signal.Signals | None) -> int:
    """Say that a Ctrl-C (a ``terminated`` signal) stopped the command, after its progress bars; its exit status,
    a shell's for a process the signal killed."""
    close_progress_bars()
    with contextlib.suppress(OSError):  # a SIGHUP's terminal may be gone: the status still says it
        print(interrupted_line(args, stamps, terminated), file=sys.stderr)
    return 128 + (terminated or signal.SIGINT)


def _stdout_broken() -> bool:
    """Whether stdout is a pipe (or socket) whose reader has gone, as after ``| head``: the one broken pipe that
    ends a command quietly (exit 141). Asked of the descriptor itself, which reports an error once no one reads it
    (``POLLERR``, or ``POLLHUP`` for a socket). Where that cannot be asked (no ``poll``: Windows), any broken pipe
    counts, as before; where stdout has no descriptor (an embedding application's stream), none does."""
    if not hasattr(select, "poll"):
        return True
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return False
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))


def _error_status(error: Exception, args: argparse.Namespace, name: str) -> int:
    """Say ``error`` (being handled) in one line and give the exit status 2, or raise it again: a bug keeps its
    traceback."""
    if isinstance(error, ModuleNotFoundError):
        hint = missing_package(error, args.command_extra)
        if hint is None:  # a module of alfa itself, or a package nothing declares: a bug, with its traceback
            raise error
        print(f"{name}: error: {hint}", file=sys.stderr)
        return 2
    if isinstance(error, USER_ERRORS):
        print(f"{name}: error: {error_line(error)}", file=sys.stderr)
        return 2
    found = os_error_in(error)  # a library's own error around a file (safetensors' SafetensorError): still one line
    if found is None:
        raise error
    print(f"{name}: error: {error_line(found)}", file=sys.stderr)
    return 2
