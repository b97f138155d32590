"""Every generated page of docs/ regenerates, byte for byte, from the data committed beside it."""

import shutil
from pathlib import Path

import pytest

from alfa.study.pages import PAGES, check_pages, repo_root, write_pages

ROOT = repo_root()


def test_the_pages_are_found_in_this_checkout():
    assert (ROOT / "docs").is_dir() and (ROOT / "src" / "alfa" / "study" / "pages.py").is_file()
    assert {p.path for p in PAGES} >= {"docs/results.md", "docs/speed.md"}


@pytest.mark.parametrize("page", PAGES, ids=[p.path for p in PAGES])
def test_every_generated_page_regenerates_from_its_committed_data(page):
    assert check_pages(ROOT, (page,)) == []


def _copy(page, dest: Path) -> None:
    for rel in (page.path, page.data, page.figures, *page.more_data):
        if rel is None:
            continue
        src = ROOT / rel
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dest / rel)
        else:
            shutil.copyfile(src, dest / rel)


def test_the_check_sees_an_edited_page_missing_data_and_a_stale_figure(tmp_path):
    speed = next(p for p in PAGES if p.path == "docs/speed.md")
    _copy(speed, tmp_path)
    assert check_pages(tmp_path, (speed,)) == []
    page = tmp_path / speed.path
    page.write_text(page.read_text().replace("Speed", "Sped", 1))
    assert check_pages(tmp_path, (speed,)) == [
        "docs/speed.md: differs from what docs/speed.json renders to (run: alfa pages --write)"
    ]
    assert write_pages(tmp_path, (speed,)) == [Path("docs/speed.md")]
    assert check_pages(tmp_path, (speed,)) == []
    (tmp_path / speed.more_data[0]).unlink()
    assert "its data is missing: docs/speed-transformers.json (" in check_pages(tmp_path, (speed,))[0]
    (tmp_path / speed.data).unlink()
    assert "its data is missing: docs/speed.json, docs/speed-transformers.json (" in check_pages(tmp_path, (speed,))[0]

    results = next(p for p in PAGES if p.path == "docs/results.md")
    _copy(results, tmp_path)
    (tmp_path / results.figures / "old_figure.png").write_bytes(b"stale")
    assert check_pages(tmp_path, (results,)) == [
        "docs/figures/results/old_figure.png: committed, but docs/results.md's data no longer draws it"
    ]
