"""No file is overwritten without being asked: a command's file output that exists is refused, in one line and
before anything runs, unless --replace is given; every command that writes a file offers --replace; the files a
command adds to or checks itself (an access log, a record it updates under its own rule) are not refused."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from alfa.cli import build_parser, main

THROUGHPUT = ["throughput", "--fixture", "mpiifacegaze", "--image-size", "16", "--batch-size", "4", "--batches", "1"]


def _leaves(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """Every runnable command's parser with its name."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield " ".join(path), parser
    for action in subs:
        for name, sub in action.choices.items():
            yield from _leaves(sub, (*path, name))


def test_an_existing_file_is_refused_and_kept(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    page = tmp_path / "loading.md"
    page.write_text("someone's notes\n", encoding="utf-8")
    assert main([*THROUGHPUT, "--loader-only", "--out", str(page)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"alfa throughput: error: --out {page}: exists; name another file, or add --replace to overwrite it"
    assert page.read_text(encoding="utf-8") == "someone's notes\n"
    assert not page.with_suffix(".json").exists()  # refused before anything ran


def test_replace_overwrites(tmp_path: Path) -> None:
    page = tmp_path / "loading.md"
    page.write_text("someone's notes\n", encoding="utf-8")
    assert main([*THROUGHPUT, "--loader-only", "--out", str(page), "--replace"]) == 0
    assert page.read_text(encoding="utf-8").startswith("# Data loading")


def test_every_command_that_writes_a_file_offers_replace() -> None:
    lacking, seen = [], 0
    for name, parser in _leaves(build_parser()):
        if parser._defaults.get("replaceable"):
            seen += 1
            if "--replace" not in parser._option_string_actions:
                lacking.append(name)
    assert lacking == [] and seen >= 8  # evaluate, export, throughput, speed, serving, report, costs, camera, ...


@pytest.mark.parametrize(("command", "dest"), [("serve", "access_log"), ("llm time", "record")])
def test_files_a_command_adds_to_are_not_refused(command: str, dest: str) -> None:
    parser = dict(_leaves(build_parser()))[command]
    assert dest in parser._defaults["outputs"] and dest not in parser._defaults["replaceable"]
