"""The options several commands share, each declared here once with one help text."""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import math
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from alfa.fileio import usable_cpus
from alfa.gaze.precision import PRECISIONS, default_precision

__all__ = [
    "MODEL_HELP",
    "page_head",
    "file_path",
    "folder_path",
    "deterministic_kernels",
    "at_least",
    "positive_rate",
    "positive_number",
    "number_between",
    "whole_number_between",
    "non_negative_number",
    "fraction",
    "positive_fraction",
    "comma_list",
    "comma_separated",
    "image_side",
    "worker_count",
    "thread_count",
    "threads_option",
    "torch_threads",
    "data_help",
    "device_option",
    "precision_option",
    "precision_help",
    "run_precision_of",
    "allow_partial_option",
    "seed_option",
    "quiet_option",
    "tta_option",
    "tta_of",
    "default_of",
    "key_values",
]


def page_head(path: Path) -> str:
    """The first 4096 characters of a page, where a generated page says what made it ("" where there is none or it
    cannot be read: the writability check before the command names that)."""
    try:
        with path.open(encoding="utf-8", errors="replace") as f:
            return f.read(4096)
    except OSError:
        return ""


def deterministic_kernels() -> None:
    """Ask torch for deterministic kernels (a warning where an op has none), as every command that trains or
    scores does. ``torch.use_deterministic_algorithms`` also sets TorchInductor's flag and imports TorchInductor
    for it: about 2.4 s of every command's start on a 2-core machine, for a compiler no command uses. So the
    public call is made only if TorchInductor is already loaded; otherwise torch's own switch is set directly."""
    import sys

    if "torch._inductor.config" in sys.modules:
        torch.use_deterministic_algorithms(True, warn_only=True)
    else:
        torch._C._set_deterministic_algorithms(True, warn_only=True)


DEVICE_HELP = (
    "auto (CUDA when present, else the CPU), cpu, cuda or cuda:N (default %(default)s); a checkpoint saved on one "
    "device loads on any"
)
PRECISION_DEFAULT = "bf16 on CUDA, fp32 on the CPU"
DATA_SPECS = "docs/real-data.md"
"""The page that lists the forms of a dataset spec (``synthetic:<world>``, ``gazehub:<dataset>:<root>``, ...)."""
MODEL_HELP = "the model to build (default %(default)s; an unknown name lists the registered ones)"
ALLOW_PARTIAL_HELP = "exit 0 even if some persons failed (by default any failure exits 2, after the others are done)"
QUIET_HELP = "no progress output, only the results"


def at_least(low: int, why: str = "") -> Callable[[str], int]:
    """An argparse type: a whole number of at least ``low`` (``why`` says the reason where it is not obvious)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}{why}, got {value}")
        return value

    return parse


def _finite(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
    return value


RATE_MAX = 1e30
"""The largest learning rate taken: far below float32's largest number (3.4e38, the weights' type), since the
optimizers multiply the rate before using it (a recipe's ×10 on some layers, Adam's ×10 bias correction at its
first step): a rate of 1e37 overflowed there, in torch's own words."""


def positive_rate(text: str) -> float:
    """An argparse type for learning rates: finite and above 0 (an infinite rate fills the weights with NaN), and at
    most :data:`RATE_MAX` (a larger one can overflow float32 in the optimizer's first step)."""
    value = _finite(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be above 0, got {text}")
    if value > RATE_MAX:
        raise argparse.ArgumentTypeError(
            f"must be at most {RATE_MAX:g} (the weights are float32, and the optimizer scales the rate up before "
            f"using it), got {text}"
        )
    return value


def positive_number(text: str) -> float:
    """An argparse type: a finite number above 0, for a quantity computed in float64 whatever its size (no
    float32 weights to overflow, unlike :func:`positive_rate`)."""
    value = _finite(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be above 0, got {text}")
    return value


def number_between(low: float, high: float, why: str = "") -> Callable[[str], float]:
    """An argparse type: a number from ``low`` to ``high`` (``why`` says the reason for the range); NaN and the
    infinities are outside it, and the message names the range for them too."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not low <= value <= high:  # NaN fails both comparisons
            raise argparse.ArgumentTypeError(f"must be from {low:g} to {high:g}{why}, got {text}")
        return value

    return parse


def whole_number_between(low: int, high: int, why: str = "") -> Callable[[str], int]:
    """An argparse type: a whole number from ``low`` to ``high`` (``why`` says the reason for the bound)."""

    def parse(text: str) -> int:
        value = at_least(low)(text)
        if value > high:
            raise argparse.ArgumentTypeError(f"must be at most {high}{why}, got {value}")
        return value

    return parse


def comma_list(text: str) -> list[str]:
    """The items of a comma-separated list (``a, b,c``), each stripped, empty ones dropped: ``,`` names none, and
    the caller says what that means (refused, or an empty selection)."""
    return [part.strip() for part in text.split(",") if part.strip()]


def comma_separated(item: Callable[[str], Any]) -> Callable[[str], list[Any]]:
    """An argparse type: one or more comma-separated values, each checked by ``item`` (e.g. ``at_least(1)``)."""

    def parse(text: str) -> list[Any]:
        parts = comma_list(text)
        if not parts:
            raise argparse.ArgumentTypeError(f"expected comma-separated values, got {text!r}")
        try:
            return [item(part) for part in parts]
        except argparse.ArgumentTypeError as err:
            raise argparse.ArgumentTypeError(f"{text!r}, comma-separated: {err}") from None

    return parse


def positive_fraction(text: str) -> float:
    """An argparse type for a share of something that must keep a part: above 0 and at most 1."""
    value = _finite(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be above 0 and at most 1, got {text}")
    return value


def folder_path(text: str) -> Path:
    """A folder's path (``type=``): not empty (an unset shell variable would name the current folder)."""
    if not text:
        raise argparse.ArgumentTypeError("an empty path: name a folder")
    return Path(text)


def file_path(text: str) -> Path:
    """A file's path (``type=``): not empty, and not ending in a separator as a folder's path does."""
    if not text:
        raise argparse.ArgumentTypeError("an empty path: name a file")
    if text.endswith(os.sep):
        raise argparse.ArgumentTypeError(f"{text} ends in {os.sep}, as a folder does: name a file")
    return Path(text)


def non_negative_number(text: str) -> float:
    """An argparse type for weights of loss terms: finite and at least 0."""
    value = _finite(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, got {text}")
    return value


def fraction(text: str) -> float:
    """An argparse type for shares such as the held-out persons': finite, at least 0 and below 1 (all of them held
    out would leave nothing to train on)."""
    value = _finite(text)
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 0 and below 1, got {text}")
    return value


def image_side(text: str) -> int:
    """An argparse type for an image side in pixels: 1 to :data:`MAX_IMAGE_SIDE` (a model runs on any size, and a
    mistyped 100000 would ask for tens of gigabytes before saying anything)."""
    value = at_least(1)(text)
    if value > MAX_IMAGE_SIDE:
        raise argparse.ArgumentTypeError(
            f"at most {MAX_IMAGE_SIDE} pixels (the gaze models take face crops of 32 to 448), got {value}"
        )
    return value


MAX_IMAGE_SIDE = 4096


def worker_count(text: str) -> int:
    """An argparse type for data-loading workers: 0 (load in the main process) up to the CPUs this process may use
    (each worker holds a copy of the loader's state, so more workers than cores costs memory and gains nothing)."""
    value = at_least(0)(text)
    cores = usable_cpus()
    if value > cores:
        raise argparse.ArgumentTypeError(f"at most the {cores} CPUs this process may use, got {value}")
    return value


def refuse_listed_twice(option: str, items: list[str]) -> None:
    """A comma list naming an item twice is refused (``ValueError``): each item is one unit of the run (a person,
    a panel), and twice would count it twice."""
    twice = sorted({item for item in items if items.count(item) > 1})
    if twice:
        raise ValueError(f"{option}: {', '.join(map(repr, twice))} listed twice")


def thread_count(text: str) -> int:
    """An argparse type for torch threads: 1 up to twice the CPUs this process may use (far more only contend: 9999
    made a tiny run take minutes, and the machine with it; twice leaves a documented ``--threads 2`` to a 1-CPU
    machine)."""
    value = at_least(1)(text)
    cpus = usable_cpus()
    if value > 2 * cpus:
        raise argparse.ArgumentTypeError(f"at most twice the {cpus} CPUs this process may use, got {value}")
    return value


THREADS_HELP = (
    "torch's threads on the CPU while the command runs (at most twice the CPUs this process may use; default: "
    "torch's own count, OMP_NUM_THREADS or the machine's cores). On the CPU the same seed gives the same numbers at "
    "the same count only: at another, sums are added in another order, and training grows that into another model "
    "(docs/gaze.md, Determinism)"
)


def threads_option(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """``--threads``, for the gaze commands that train or score (minutes to hours on the CPU, on a machine that may
    be shared); :func:`torch_threads` applies it around the command (:func:`alfa.cli.main`). Its ``dest`` is
    ``torch_threads``: the study commands' ``--threads`` set theirs in their configs."""
    parser.add_argument("--threads", dest="torch_threads", type=thread_count, metavar="N", help=THREADS_HELP)


@contextlib.contextmanager
def torch_threads(args: argparse.Namespace) -> Iterator[None]:
    """While the command runs, torch's thread count is ``--threads`` (:func:`threads_option`), and torch's own
    count again afterwards; more threads than this process's CPUs are run, with a note that they contend.
    A command without the option, or not given it, runs on torch's own count."""
    count = getattr(args, "torch_threads", None)
    if count is None:
        yield
        return
    cpus = usable_cpus()
    if count > cpus:
        print(
            f"alfa {args.command_path}: note: --threads {count} is more than the {cpus} CPUs this process may use: "
            "the threads will contend for them",
            file=sys.stderr,
        )
    from alfa.study.timing import torch_threads as threads_for_the_block

    with threads_for_the_block(count):
        yield


def data_help(what: str, example: str = "synthetic:mpii") -> str:
    """The help of a ``--data`` option: ``what`` it reads, named by a dataset spec, and the page of the forms."""
    return f"{what}: a dataset spec, e.g. {example} (the forms: {DATA_SPECS})"


def device_option(parser: argparse.ArgumentParser) -> None:
    """``--device``, for every command that runs a model (:func:`alfa.gaze.devices.resolve_device` reads it)."""
    parser.add_argument("--device", default="auto", help=DEVICE_HELP)


def precision_option(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    choices: Sequence[str] = PRECISIONS,
    note: str | None = None,
    default: str = PRECISION_DEFAULT,
    trains: bool = True,
) -> None:
    """``--precision``, for every command that runs a model; ``choices`` narrows it where a precision cannot
    be offered, ``note`` says what the command keeps out of it, ``default`` says what it runs without the
    option, ``trains`` whether the command trains (its losses and optimizer steps then stay fp32 too). Its
    value is ``None`` unless given: :func:`run_precision_of` resolves that for the device."""
    help_text = f"{precision_help(choices, trains)}; default: {default}" + (f"; {note}" if note else "")
    parser.add_argument("--precision", choices=tuple(choices), help=help_text)


def precision_help(choices: Sequence[str], trains: bool = True) -> str:
    """What ``--precision`` does with ``choices``, naming no precision it does not offer."""
    lower = [c for c in choices if c != "fp32"]
    if not lower:
        return "fp32 only"
    kept = "losses, optimizer steps and any SVD stay fp32" if trains else "the errors are computed in fp32"
    scaled = (
        "; fp16 training scales the loss so that its gradients do not underflow" if trains and "fp16" in lower else ""
    )
    head = "fp32, or " if "fp32" in choices else ""
    return f"{head}the model's forwards in {' / '.join(lower)} (torch.autocast; {kept}{scaled})"


def run_precision_of(args: argparse.Namespace, device: torch.device) -> str:
    """``--precision`` as given, else the default for ``device`` (:func:`alfa.gaze.precision.default_precision`)."""
    return args.precision or default_precision(device)


def allow_partial_option(parser: argparse.ArgumentParser) -> None:
    """``--allow-partial``, for the commands that work person by person (``PersonalizationRun.raise_if_failed``)."""
    parser.add_argument("--allow-partial", action="store_true", help=ALLOW_PARTIAL_HELP)


def seed_option(parser: argparse.ArgumentParser | argparse._ArgumentGroup, what: str, default: int) -> None:
    """``--seed``: ``what`` it draws (``"the initial weights and the batch order"``), ``default`` read from the
    config it sets."""
    parser.add_argument("--seed", type=_seed, default=default, help=f"seed of {what} (default %(default)s)")


SEED_LIMIT = 2**63 - 1
"""The largest seed torch's generators take (a larger one failed deep inside with "Overflow when unpacking")."""


def _seed(text: str) -> int:
    value = at_least(0)(text)
    if value > SEED_LIMIT:
        raise argparse.ArgumentTypeError(f"must be at most {SEED_LIMIT}, got {value}")
    return value


def quiet_option(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """``--quiet``: no progress bars or progress lines; what a command prints as its result stays."""
    parser.add_argument("--quiet", action="store_true", help=QUIET_HELP)


def tta_option(parser: argparse.ArgumentParser, what: str) -> None:
    """``--tta KIND``: test-time augmentation by the flip and the roll (:data:`alfa.gaze.tta.TTA_KINDS`), its help
    naming each kind with its inference cost."""
    from alfa.gaze.tta import TTA_KINDS

    kinds = "; ".join(f"{k.name}: {k.description}, {k.passes} forward passes" for k in TTA_KINDS.values())
    parser.add_argument(
        "--tta",
        metavar="KIND",
        help=f"{what} with test-time augmentation, KIND one of: {kinds}. It trains nothing; its inference cost is "
        "its number of forward passes per image, against one without",
    )


def tta_of(name: str | None) -> Any:
    """The :class:`alfa.gaze.tta.TTAKind` that ``--tta`` names (``None``: none), or one line for the user."""
    if name is None:
        return None
    from alfa.gaze.tta import tta_kind

    try:
        return tta_kind(name)
    except ValueError as e:
        raise ValueError(f"--tta {name}: {e}") from None


def default_of(function: Callable[..., Any], parameter: str) -> Any:
    """The default of ``function``'s ``parameter``, for an option that sets it (so it is written once)."""
    return inspect.signature(function).parameters[parameter].default


def key_values(items: Sequence[str] | None) -> dict[str, Any]:
    """``--option KEY=VALUE`` given any number of times, as config fields: a dash in a key is an underscore, and a
    value is read as JSON where it is JSON (``3``, ``1e-4``, ``true``, ``[1, 2]``), else kept as text."""
    options: dict[str, Any] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--option {item!r}: expected KEY=VALUE")
        field = key.replace("-", "_")
        try:
            options[field] = json.loads(value)
        except json.JSONDecodeError:
            options[field] = value
    return options
