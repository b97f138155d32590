"""The README quotes numbers; each must come from a generated page (or the command that prints it).

The README is written by hand from the pages (docs/*.md, generated from committed data), so a page that moves
when records come in can leave the README quoting a number no page has any more. This test catches that: every
difference with its interval ("−0.24° [−0.41, −0.06]") must appear on some page as it is, every other decimal
number must appear somewhere in docs/, and so must every percentage ("73 %") and every count of comparisons ("72
comparisons": a page's "72 (method, pair) comparisons"). It cannot tell that a number is quoted in the right
context; it does tell that it was not typed in or left stale.
"""

from __future__ import annotations

import re
from pathlib import Path

from alfa.models import resnet18_gaze
from alfa.summary import parameter_summary
from alfa.truncate import truncate

ROOT = Path(__file__).resolve().parents[1]
INTERVAL = re.compile(r"[−-]?\d+\.\d+ \[[−-]?\d+\.\d+, [−-]?\d+\.\d+\]")
DECIMAL = re.compile(r"\d+\.\d+")
PERCENT = re.compile(r"(?<![\d.])(\d+(?:\.\d+)?) ?%")
COUNT = re.compile(r"(?<![\d.])(\d+)(?: and (\d+))? comparisons")


def _normal(text: str) -> str:
    # the README wraps lines and writes "+0.14°" where a table writes "+0.14"; the numbers are what must match
    return re.sub(r"\s+", " ", text).replace("°", "").replace("+", "")


def _holds(text: str, number: str) -> bool:
    # as a whole number: "0.06" is not found inside "10.06" or "0.061", or nearly every decimal would pass
    return re.search(rf"(?<![\d.]){re.escape(number)}(?!\d)", text) is not None


def _counted(text: str, number: str) -> bool:
    # "72 comparisons" or a page's "72 (method, pair) comparisons"
    return re.search(rf"(?<![\d.]){number} (?:\([^)]*\) )?comparisons", text) is not None


def unsourced(readme: str, pages: str, printed: str = "") -> list[str]:
    """The intervals, decimal numbers, percentages and counts of comparisons of ``readme``'s prose (code blocks
    are code, not quoted numbers) that neither ``pages`` nor ``printed`` holds."""
    readme = re.sub(r"```.*?```", "", readme, flags=re.S)
    readme, pages = _normal(readme), _normal(pages)
    missing = [m for m in INTERVAL.findall(readme) if m not in pages]
    missing += [m for m in DECIMAL.findall(readme) if not _holds(pages, m) and not _holds(printed, m)]
    percentages = set(PERCENT.findall(pages))
    missing += [f"{m} %" for m in PERCENT.findall(readme) if m not in percentages]
    counts = [n for pair in COUNT.findall(readme) for n in pair if n]
    missing += [f"{n} comparisons" for n in counts if not _counted(pages, n)]
    return missing


def _summary_text() -> str:
    # the README's parameter counts of the truncated ResNet-18 are what `alfa summary --rank 64` prints: counts,
    # which the structure alone gives (as that command makes it: no SVD)
    model = resnet18_gaze()
    truncate(model, rank=64, weights=False)
    return str(parameter_summary(model))


def test_every_number_the_readme_quotes_is_on_a_page():
    pages = "\n".join(p.read_text(encoding="utf-8") for p in sorted((ROOT / "docs").rglob("*.md")))
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert unsourced(readme, pages, _summary_text()) == []


def test_a_stale_or_typed_in_number_is_caught():
    pages = "flip-TTA − source-only = −0.24° [−0.41, −0.06]; 10.10 [9.20, 11.00]"
    assert unsourced("flip-TTA: −0.24° [−0.41, −0.06], at\n  10.10°", pages) == []
    # an interval whose ends moved, a sign lost, a number no page has
    assert unsourced("−0.24 [−0.41, −0.05]", pages) == ["−0.24 [−0.41, −0.05]", "0.05"]
    assert unsourced("0.24 [0.06, 0.41]", pages) == ["0.24 [0.06, 0.41]"]
    assert unsourced("about 4.2° below", pages) == ["4.2"]
    # a number is matched whole, never as a piece of a longer one; code blocks are not read
    assert unsourced("0.1 and 10.1 and 9.2", pages) == ["0.1", "10.1", "9.2"]
    assert unsourced("```python\nlr = 3.5\n```\n", pages) == []


def test_a_stale_percentage_or_count_of_comparisons_is_caught():
    pages = "ratio of the means 6 %; ≥ 33% of the headroom; of the 72 (method, pair) comparisons; over 11 comparisons"
    readme = "6 % and 8\n %, against the 33 % asked; 72 comparisons each; a family of 11 comparisons"
    assert unsourced(readme, pages) == ["8 %"]
    # a count the page no longer makes, as "24 and 12 comparisons" once was
    assert unsourced("on any pair (24 and\n  12 comparisons)", pages) == ["24 comparisons", "12 comparisons"]
    assert unsourced("16 % and 116 %", "116 %") == ["16 %"]


def test_the_readmes_timings_are_those_of_its_fresh_clone_record():
    # the two commands' timings are quoted from the record scripts/time_fresh_clone.sh kept, not typed in
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    link = re.search(r"\((docs/data/fresh-clone/[^)]+\.txt)\)", readme)
    assert link is not None, "the README names no fresh-clone record"
    record = (ROOT / link.group(1)).read_text(encoding="utf-8")
    paragraph = " ".join(next(p for p in readme.split("\n\n") if link.group(1) in p).split())
    quoted = re.findall(r"\d+ min \d+ s", paragraph)
    assert len(quoted) == 2 and all(f"({q})" in record for q in quoted), quoted
    tests, suite = re.search(r"(\d+) tests in two worker processes, (\d+) s", paragraph).groups()
    assert f"{tests} passed" in record
    assert round(float(re.search(rf"{tests} passed.* in (\d+\.\d+)s", record).group(1))) == int(suite)
    demo = re.search(r"the demo itself (\d+) s", paragraph).group(1)
    assert f"total wall time {demo} s" in record
    assert re.search(r"commit ([0-9a-f]{7})", paragraph).group(1) in record.splitlines()[0]
