"""Checkable reasoning tasks made by code, in two formats each, and the character tokenizer.

Three tasks, each a generator of ``(prompt, answer)`` pairs and a checker of a model's answer:

* **arithmetic**: several additions and subtractions of small numbers (``calc 7+5-3`` → ``9``); the
  held-out format is a word problem in the manner of GSM8K (``ann has 7. gets 5. gives 3. has?``);
* **countdown**: reach a target from three numbers with ``+ - *``, each number once (``cd 3 5 7 to 22`` →
  ``3*5+7``); any expression that reaches the target with exactly those numbers is right;
* **sudoku**: a 4×4 grid with blanks (``sudoku 12.4|3..1|.1..|4.2.`` → ``1234|3412|2143|4321``); any
  completed grid that keeps the givens and has 1–4 once in every row, column and 2×2 box is right.

The *pretraining* format of every task is one template; the *held-out* format (other words, other
separators) is what adaptation teaches, so the unadapted model has seen the task but never the format.
Everything is drawn from a :class:`random.Random`, so a seed gives the same problems on any machine.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = [
    "TASKS",
    "FORMATS",
    "Example",
    "CharTokenizer",
    "make_example",
    "make_examples",
    "check_answer",
    "evaluate_expression",
]

TASKS = ("arithmetic", "countdown", "sudoku")
FORMATS = ("pretrain", "heldout")
NAMES = ("ann", "bob", "cy", "dee", "eve", "max", "sue", "tom")


@dataclass(frozen=True)
class Example:
    """One problem: its task, format, the prompt, a reference answer, and what the checker needs."""

    task: str
    format: str
    prompt: str
    answer: str
    facts: tuple[int, ...]  # arithmetic: (result,); countdown: (target, *numbers); sudoku: the 16 givens (0 blank)


# ---- arithmetic -------------------------------------------------------------------------------------------


def _arithmetic(rng: random.Random, form: str) -> Example:
    start = rng.randint(2, 19)
    value, steps = start, []
    for _ in range(rng.randint(2, 3)):
        if rng.random() < 0.5 and value > 1:
            n = rng.randint(1, min(9, value))
            value -= n
            steps.append(-n)
        else:
            n = rng.randint(1, 9)
            value += n
            steps.append(n)
    if form == "pretrain":
        prompt = f"calc {start}" + "".join(f"{s:+d}" for s in steps)
    else:
        words = [f"{'gets' if s > 0 else 'gives'} {abs(s)}." for s in steps]
        prompt = f"{rng.choice(NAMES)} has {start}. " + " ".join(words) + " has?"
    return Example("arithmetic", form, prompt, str(value), (value,))


# ---- countdown --------------------------------------------------------------------------------------------


def evaluate_expression(text: str) -> tuple[int, list[int]] | None:
    """The value of an expression of whole numbers and ``+ - *`` (``*`` first), and its numbers in order;
    ``None`` if ``text`` is not such an expression."""
    if not re.fullmatch(r"\d+([+\-*]\d+)*", text):
        return None
    numbers = [int(n) for n in re.findall(r"\d+", text)]
    total = 0
    for sign, term in re.findall(r"([+\-]?)([\d*]+)", text):
        product = 1
        for factor in term.split("*"):
            product *= int(factor)
        total += -product if sign == "-" else product
    return total, numbers


def _countdown(rng: random.Random, form: str) -> Example:
    while True:
        numbers = [rng.randint(1, 9) for _ in range(3)]
        a, b, c = rng.sample(numbers, 3)
        expression = f"{a}{rng.choice('+-*')}{b}{rng.choice('+-*')}{c}"
        value = evaluate_expression(expression)
        assert value is not None
        if 1 <= value[0] <= 60:
            break
    target = value[0]
    listed = " ".join(map(str, numbers))
    prompt = f"cd {listed} to {target}" if form == "pretrain" else f"make {target} with {listed.replace(' ', ',')}:"
    return Example("countdown", form, prompt, expression, (target, *numbers))


# ---- sudoku -----------------------------------------------------------------------------------------------

_BASE = ((1, 2, 3, 4), (3, 4, 1, 2), (2, 1, 4, 3), (4, 3, 2, 1))


def _solved_grid(rng: random.Random) -> list[list[int]]:
    digits = rng.sample(range(1, 5), 4)
    bands = rng.sample((0, 1), 2)
    rows = [2 * band + r for band in bands for r in rng.sample((0, 1), 2)]
    stacks = rng.sample((0, 1), 2)
    cols = [2 * stack + c for stack in stacks for c in rng.sample((0, 1), 2)]
    grid = [[digits[_BASE[r][c] - 1] for c in cols] for r in rows]
    return [list(row) for row in zip(*grid, strict=True)] if rng.random() < 0.5 else grid


def _sudoku(rng: random.Random, form: str) -> Example:
    grid = _solved_grid(rng)
    givens = [v for row in grid for v in row]
    for cell in rng.sample(range(16), rng.randint(4, 8)):
        givens[cell] = 0
    rows = ["".join(str(v) for v in givens[4 * r : 4 * r + 4]) for r in range(4)]
    solved = ["".join(map(str, row)) for row in grid]
    if form == "pretrain":
        prompt, answer = "sudoku " + "|".join(rows).replace("0", "."), "|".join(solved)
    else:
        prompt, answer = "grid " + " ".join(rows) + " fill:", " ".join(solved)
    return Example("sudoku", form, prompt, answer, tuple(givens))


def _valid_sudoku(text: str, form: str, givens: Sequence[int]) -> bool:
    separator = "|" if form == "pretrain" else " "
    rows = text.split(separator)
    if len(rows) != 4 or any(not re.fullmatch(r"[1-4]{4}", row) for row in rows):
        return False
    cells = [int(ch) for row in rows for ch in row]
    if any(g and g != v for g, v in zip(givens, cells, strict=True)):
        return False
    groups = [[4 * r + c for c in range(4)] for r in range(4)] + [[4 * r + c for r in range(4)] for c in range(4)]
    groups += [[4 * (2 * br + r) + 2 * bc + c for r in (0, 1) for c in (0, 1)] for br in (0, 1) for bc in (0, 1)]
    return all(sorted(cells[i] for i in group) == [1, 2, 3, 4] for group in groups)


_MAKERS: dict[str, Callable[[random.Random, str], Example]] = {
    "arithmetic": _arithmetic,
    "countdown": _countdown,
    "sudoku": _sudoku,
}


def make_example(task: str, form: str, rng: random.Random) -> Example:
    """One problem of ``task`` in ``form`` (``"pretrain"`` or ``"heldout"``) drawn from ``rng``."""
    if task not in _MAKERS:
        raise ValueError(f"unknown task {task!r}; the tasks are {', '.join(TASKS)}")
    if form not in FORMATS:
        raise ValueError(f"unknown format {form!r}; the formats are {', '.join(FORMATS)}")
    return _MAKERS[task](rng, form)


def make_examples(tasks: Sequence[str], form: str, count: int, seed: int) -> list[Example]:
    """``count`` problems cycling through ``tasks`` (as even a mix as ``count`` allows), from ``seed``."""
    rng = random.Random(seed)
    return [make_example(tasks[i % len(tasks)], form, rng) for i in range(count)]


def check_answer(example: Example, answer: str) -> bool:
    """Whether ``answer`` solves ``example`` (not whether it equals the reference: any right answer counts)."""
    answer = answer.strip()
    if example.task == "arithmetic":
        return answer.isdigit() and int(answer) == example.facts[0]
    if example.task == "countdown":
        value = evaluate_expression(answer)
        target, numbers = example.facts[0], sorted(example.facts[1:])
        return value is not None and value[0] == target and sorted(value[1]) == numbers
    return _valid_sudoku(answer, example.format, example.facts)


# ---- tokenizer --------------------------------------------------------------------------------------------

SPECIALS = ("<pad>", "<mask>", "<sep>", "<eos>")
ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyz +-*.,:|?"


class CharTokenizer:
    """One token per character of :data:`ALPHABET`, after four special tokens (pad, mask, separator, end)."""

    def __init__(self) -> None:
        self.tokens = list(SPECIALS) + list(ALPHABET)
        self.index = {t: i for i, t in enumerate(self.tokens)}
        self.pad, self.mask, self.sep, self.eos = (self.index[s] for s in SPECIALS)

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    def encode(self, text: str) -> list[int]:
        unknown = sorted({ch for ch in text if ch not in self.index or len(ch) != 1})
        if unknown:
            raise ValueError(f"characters outside the tokenizer's alphabet: {unknown!r}")
        return [self.index[ch] for ch in text]

    def decode_answer(self, ids: Sequence[int]) -> str:
        """The text of an answer region: its characters up to the first end token (specials dropped)."""
        out = []
        for i in ids:
            if i == self.eos:
                break
            if i >= len(SPECIALS):
                out.append(self.tokens[i])
        return "".join(out)
