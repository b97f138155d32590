"""What the benchmark's commands take and refuse: the results file named is the one reported and kept, a folder's
records are not replaced by a run in another precision, a results file without its settings, seeds beyond what the
worlds take, and a committed figure that is no PNG."""

from pathlib import Path

import pytest
from test_report import fixture_results

from alfa.cli import main
from alfa.fileio import write_json
from alfa.study.bench.results import RESULTS_FILE, export_results, load_results

ROOT = Path(__file__).resolve().parent.parent


def _results(folder: Path, name: str, records: int) -> Path:
    data = fixture_results()
    data["records"] = data["records"][:records]
    folder.mkdir(parents=True, exist_ok=True)
    return write_json(folder / name, data)


def test_the_results_file_named_is_the_one_kept_not_its_folders(tmp_path):
    _results(tmp_path / "run", RESULTS_FILE, 4)
    mine = _results(tmp_path / "run", "mine.json", 7)
    export_results(mine, tmp_path / "kept")
    assert len(load_results(tmp_path / "kept")["records"]) == 7  # it copied the folder's results.json, of 4
    # kept into its own folder, it would replace that folder's results.json
    with pytest.raises(ValueError, match="its copy would replace .*results.json; copy it elsewhere"):
        export_results(mine, tmp_path / "run")
    assert len(load_results(tmp_path / "run")["records"]) == 4


def test_report_refuses_results_without_their_settings_and_says_when_figure_data_is_missing(tmp_path, capsys):
    data = fixture_results()
    del data["config"]
    write_json(tmp_path / "f.json", data)
    assert main(["report", "--results", str(tmp_path / "f.json"), "--out", str(tmp_path / "f.md")]) == 2
    err = capsys.readouterr().err
    assert "no 'config', the benchmark's settings its page is written from" in err and err.count("\n") == 1
    assert not (tmp_path / "f.md").exists()
    # a results file away from its figure_data/: the Figures section says why it is empty
    _results(tmp_path / "alone", "r.json", 5)
    assert main(["report", "--results", str(tmp_path / "alone" / "r.json"), "--out", str(tmp_path / "p.md")]) == 0
    page = (tmp_path / "p.md").read_text()
    figures = page.split("## Figures", 1)[1].split("\n## ", 1)[0]
    assert "No figure data lies beside these results (`figure_data/`" in figures


def test_a_run_in_another_precision_does_not_replace_a_folders_records(tmp_path, capsys):
    from alfa.cli import build_parser
    from alfa.cli.bench import bench_config
    from alfa.study.bench.results import _empty_results

    out = tmp_path / "b"
    argv = ["bench", "--smoke", "--out", str(out), "--methods", "source-only", "--pairs", "E→M", "--ablations", "none"]
    argv += ["--selected-methods", "none", "--default-methods", "none"]
    made = _empty_results(bench_config(build_parser().parse_args(argv)))  # as an fp32 run on the CPU made it
    fixture = fixture_results()
    made.update(records=fixture["records"][:3], runs=fixture["runs"])  # its runs say no precision: fp32
    out.mkdir()
    before = write_json(out / RESULTS_FILE, made).read_text()
    assert main([*argv, "--precision", "bf16", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "holds records made in fp32 on cpu; this run (bf16 on cpu) would replace them" in err
    assert err.count("\n") == 1 and (out / RESULTS_FILE).read_text() == before


def test_bench_seeds_beyond_what_the_worlds_take_are_refused(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "--smoke", "--dry-run", "--seeds", "0,99999999999999999999"])
    assert "must be at most 2147483647" in capsys.readouterr().err


@pytest.mark.parametrize(
    "damage, words",
    [
        (lambda b: b"", "an empty file"),
        (lambda b: b"garbage\n", "no PNG signature"),
        (lambda b: b[:-20], "cut short"),
        (lambda b: b[: len(b) // 2] + bytes([b[len(b) // 2] ^ 1]) + b[len(b) // 2 + 1 :], "fails its checksum"),
    ],
)
def test_a_damaged_png_is_told_from_a_whole_one(tmp_path, damage, words):
    from alfa.study.pages import png_damage

    figure = ROOT / "docs" / "figures" / "camera.png"
    assert png_damage(figure) is None
    (tmp_path / "f.png").write_bytes(damage(figure.read_bytes()))
    assert words in png_damage(tmp_path / "f.png")


def test_pages_check_finds_a_committed_figure_that_is_no_png(tmp_path):
    import shutil

    from alfa.study.pages import PAGES, check_pages

    page = next(p for p in PAGES if p.path == "docs/camera.md")  # one figure, and quick to render
    for rel in (page.path, page.data, *page.owned_figures, "docs/figures/camera.plotted.json"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        copy = shutil.copytree if (ROOT / rel).is_dir() else shutil.copy
        copy(ROOT / rel, tmp_path / rel)
    assert check_pages(tmp_path, (page,)) == []
    (tmp_path / page.owned_figures[0]).write_text("garbage\n")  # its plotted data beside it unchanged: it passed
    assert check_pages(tmp_path, (page,)) == [
        f"{page.owned_figures[0]}: not a whole PNG image (no PNG signature; run: alfa pages --write)"
    ]
