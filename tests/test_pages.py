"""Every generated page of docs/ regenerates, byte for byte, from the data committed beside it, and every
figure plots the same data (its PNG's bytes are not compared: they are the drawing library's)."""

import copy
import re
import shlex
import shutil
import sys
from pathlib import Path

import pytest

from alfa.study.pages import CRATE_GAZE_FIGURE, PAGES, Page, check_pages, page_differences, repo_root, write_pages
from alfa.study.plotted import plotted_data_only, plotted_path

ROOT = repo_root()


def test_the_pages_are_found_in_this_checkout():
    assert (ROOT / "docs").is_dir() and (ROOT / "src" / "alfa" / "study" / "pages.py").is_file()
    assert {p.path for p in PAGES} >= {"docs/results.md", "docs/speed.md"}


REPORT_PAGES = ("docs/results.md", "docs/results-flip.md", "docs/results-v2.md")
"""The pages whose first lines name the ``alfa report`` command that regenerates them: checked by running it."""
RENDERED = [p for p in PAGES if p.path not in REPORT_PAGES]


@pytest.mark.slow
@pytest.mark.parametrize("page", RENDERED, ids=[p.path for p in RENDERED])
def test_every_generated_page_regenerates_from_its_committed_data(page):
    assert check_pages(ROOT, (page,)) == []


def _copy(page, dest: Path) -> None:
    figures = [f for figure in page.owned_figures for f in (figure, plotted_path(figure))]
    for rel in (page.path, page.data, page.figures, *page.more_data, *figures):
        if rel is None:
            continue
        src = ROOT / rel
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dest / rel)
        else:
            shutil.copyfile(src, dest / rel)


@pytest.mark.slow
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

    # a page with a figure folder (a made-up one: the real ones take seconds to render)
    folder = _figure_page("docs/figures/bare")
    write_pages(tmp_path, (folder,))
    assert check_pages(tmp_path, (folder,)) == []
    (tmp_path / folder.figures / "old_figure.png").write_bytes(b"stale")
    assert check_pages(tmp_path, (folder,)) == [
        "docs/figures/bare/old_figure.png: committed, but docs/bare.md's data no longer draws it"
    ]


def test_a_write_that_fails_on_one_page_leaves_every_committed_page_as_it_was(tmp_path):
    """Pages are rendered first and written after: a page whose data is missing, or whose render refuses its data,
    used to come after others already rewritten (a committed table replaced by "not measured yet")."""
    speed = next(p for p in PAGES if p.path == "docs/speed.md")
    _copy(speed, tmp_path)
    page = tmp_path / speed.path
    edited = page.read_text().replace("Speed", "Sped", 1)
    page.write_text(edited)

    def refuse(root: Path, out: Path) -> None:
        raise ValueError("no benchmark results at docs/data/x")

    refusing = Page(path="docs/refusing.md", data="docs", produce="a test", render=refuse)
    with pytest.raises(ValueError, match=r"^docs/refusing.md: no benchmark results at docs/data/x; nothing was wr"):
        write_pages(tmp_path, (speed, refusing))
    assert page.read_text() == edited and not (tmp_path / "docs/refusing.md").exists()
    assert write_pages(tmp_path, (speed,)) == [Path("docs/speed.md")] and page.read_text() != edited
    # the calibration page reads the v2 record besides its scouts: without it, the check says so and renders nothing
    calibration = next(p for p in PAGES if p.path == "docs/calibration.md")
    shutil.copytree(ROOT / calibration.data, tmp_path / calibration.data)
    assert check_pages(tmp_path, (calibration,)) == [
        f"docs/calibration.md: its data is missing: docs/data/bench-v2 (made by: {calibration.produce})"
    ]


def _figure_page(figures: str | None = None, plotted: bool = True) -> Page:
    """A page of one line and one figure, drawn in ``figures`` (a folder it owns) or as its single figure
    docs/figures/bare.png; ``plotted``: saved with its plotted data, as every page's figure must be."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from alfa.study.plotted import save_figure

    figure = f"{figures or 'docs/figures'}/bare.png"

    def render(root: Path, out: Path) -> None:
        fig, ax = plt.subplots()
        ax.plot([0, 1], [1, 0])
        (out / figure).parent.mkdir(parents=True)
        if plotted:
            save_figure(fig, out / figure, dpi=20)
        else:
            fig.savefig(out / figure)
            plt.close(fig)
        (out / "docs/bare.md").write_text(f"![bare]({figure.removeprefix('docs/')})\n")

    owned = () if figures else (figure,)
    return Page(path="docs/bare.md", data="docs", produce="a test", render=render, figures=figures, owned_figures=owned)


GAZE = next(p for p in PAGES if p.path == "docs/crate-gaze.md")
GAZE_CHANGED = (
    f"{CRATE_GAZE_FIGURE}: shows other data than {GAZE.data} draws (crate_gaze_probes.plotted.json differs; "
    "run: alfa pages --write)"
)


def test_a_figure_that_plots_one_other_value_is_reported(tmp_path, monkeypatch):
    import alfa.study.crate.gaze_report as gaze_report

    _copy(GAZE, tmp_path)  # that the copy passes is test_every_generated_page_regenerates_from_its_committed_data's
    draw = gaze_report.plot_gaze_probes

    def one_value_off(probes, path, source_name=None):
        probes = copy.deepcopy(probes)
        entry = next(iter(next(iter(probes.values())).values()))
        first_person = next(iter(entry["coding_rate_per_person"].values()))  # the figure draws the persons' mean
        first_person[0] += 0.5
        return draw(probes, path, source_name=source_name)

    monkeypatch.setattr(gaze_report, "plot_gaze_probes", one_value_off)
    assert check_pages(tmp_path, (GAZE,)) == [GAZE_CHANGED]
    monkeypatch.undo()
    # the same seen from the other side: one number of the committed plotted data edited
    sidecar = tmp_path / plotted_path(CRATE_GAZE_FIGURE)
    text = sidecar.read_text(encoding="utf-8")
    edited = re.sub(r"\d+\.\d+", lambda number: str(float(number[0]) + 1), text, count=1)
    assert edited != text
    sidecar.write_text(edited, encoding="utf-8")
    assert check_pages(tmp_path, (GAZE,)) == [GAZE_CHANGED]


def test_a_png_with_other_bytes_but_the_same_data_passes_and_no_png_does_not(tmp_path):
    import matplotlib.pyplot as plt

    page = _figure_page()
    write_pages(tmp_path, (page,))
    png = tmp_path / page.owned_figures[0]
    committed = png.read_bytes()
    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    fig.savefig(png, dpi=10)  # redrawn at another dpi, not with save_figure: another PNG, the same plotted data
    plt.close(fig)
    assert png.read_bytes() != committed and png.read_bytes()[:4] == b"\x89PNG"
    assert check_pages(tmp_path, (page,)) == []
    png.write_bytes(b"not even a PNG")  # the same plotted data beside it, but no image: that passed too
    assert check_pages(tmp_path, (page,)) == [
        f"{png.relative_to(tmp_path)}: not a whole PNG image (no PNG signature; run: alfa pages --write)"
    ]
    png.unlink()
    plotted_path(png).unlink()
    assert check_pages(tmp_path, (page,)) == [
        f"{rel}: drawn from docs but not committed"
        for rel in sorted(map(Path, (png.relative_to(tmp_path), plotted_path(png.relative_to(tmp_path)))))
    ]


def test_a_figure_saved_without_its_plotted_data_is_reported(tmp_path):
    page = _figure_page(plotted=False)
    write_pages(tmp_path, (page,))
    assert check_pages(tmp_path, (page,)) == [
        "docs/figures/bare.png: drawn without its plotted data (save it with alfa.study.plotted.save_figure)",
    ]


@pytest.mark.slow
@pytest.mark.parametrize("path", REPORT_PAGES)
def test_the_command_a_page_names_regenerates_it_and_its_figures(path, tmp_path, monkeypatch):
    # "Do not edit by hand: re-run the command": the command the page names, run on a copy of its data, must give
    # the committed page and figures (what alfa pages --check compares), not only alfa pages --write
    # (results-v2.md's declared-run paragraph once came only from the latter)
    from alfa.cli import main

    page = (ROOT / path).read_text(encoding="utf-8")
    command = re.search(r"Generated by `(alfa report [^`]+)`", page).group(1)
    args = shlex.split(command)[1:]
    data = args[args.index("--results") + 1]
    shutil.copytree(ROOT / data, tmp_path / data)
    copied = {p for p in tmp_path.rglob("*") if p.is_file()}
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["alfa", *args])
    with plotted_data_only():  # the figures' plotted data, undrawn: what is compared (as alfa pages --check does)
        assert main(args) == 0
    made = {p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file() and p not in copied}
    assert page_differences(next(p for p in PAGES if p.path == path), ROOT, tmp_path, made) == []


def test_no_page_says_a_design_detects_more_than_an_angular_error_can_differ():
    """A design with few seeds and a large family needs differences of thousands of degrees to see them; a page
    quoted "11888.14°" where it detects nothing."""
    from alfa.study.bench.markdown import degrees_detected

    assert degrees_detected(3.174) == "3.17°" and degrees_detected(180.0) == "180.00°"
    assert degrees_detected(11888.14).startswith("more than 180°")
    quoted = []
    for page in PAGES:
        text = (ROOT / page.path).read_text(encoding="utf-8")
        for word in re.finditer(r"\bdetects?\b", text):  # its sentence: from the last "." before to the next ". "
            end = re.compile(r"\.\s|$").search(text, word.end()).end()
            sentence = text[text.rfind(".", 0, word.start()) + 1 : end]
            quoted += [float(x) for x in re.findall(r"(\d+(?:\.\d+)?)°", sentence)]
    assert quoted and max(quoted) <= 180.0


def test_every_relative_link_of_the_docs_and_readme_names_a_file_that_exists():
    """The first records' pages now point to results-v2.md; no page may point to a file that is not there."""
    broken = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = page.read_text(encoding="utf-8")
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue  # a web address or an anchor of the same page
            if not (page.parent / target.split("#")[0]).exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert broken == []
    assert "[results-v2.md](results-v2.md)" in (ROOT / "docs" / "results.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("mode", [[], ["--write"]])
def test_pages_refuses_a_root_that_is_not_a_repository_in_one_line(mode, tmp_path, capsys):
    # a folder with no docs/ nor src/alfa/ printed sixteen "its data is missing" lines, then a count of them
    from alfa.cli import main

    (tmp_path / "docs").mkdir()  # only one of the two marks: still not a checkout
    assert main(["pages", *mode, "--root", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "not an alfa repository root" in lines[0]
    assert "looked for docs/ and src/alfa/" in lines[0] and "no src/alfa/" in lines[0]
