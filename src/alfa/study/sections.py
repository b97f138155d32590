"""A generated section inside a hand-written page: what lies between ``<!-- NAME:begin -->`` and
``<!-- NAME:end -->`` is rendered from committed data (``alfa pages`` checks it), the rest of the page is written by
hand and kept byte for byte. docs/adapters.md's cost table and docs/crate.md's plane toy are such sections."""

from __future__ import annotations

__all__ = ["section_marks", "with_section"]


def section_marks(name: str) -> tuple[str, str]:
    """The begin and end markers of the section ``name``."""
    return f"<!-- {name}:begin -->", f"<!-- {name}:end -->"


def with_section(text: str, name: str, block: str, where: str = "the page") -> str:
    """``text`` with what lies between the markers of ``name`` replaced by ``block`` (the rest kept byte for
    byte); ``where`` names the page in the error when it lacks one begin marker followed by one end marker."""
    begin, end = section_marks(name)
    if text.count(begin) != 1 or text.count(end) != 1 or text.index(begin) > text.index(end):
        raise ValueError(f"{where} needs exactly one {begin} followed by one {end}")
    head, rest = text.split(begin)
    return f"{head}{begin}\n{block.strip()}\n{end}{rest.split(end)[1]}"
