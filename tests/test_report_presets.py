"""What a report page of a check preset (smoke, quick) or of few seeds says, and what alfa report refuses before it
writes: its records are never the declared run's, its counts are in the singular where there is one."""

import json
from pathlib import Path

from test_report import fixture_results

from alfa.study.bench.report_page import build_report, render_report
from alfa.study.plotted import plotted_data_only


def test_a_check_presets_records_are_never_counted_toward_the_declared_run(tmp_path):
    """A smoke page said "this file holds 96 of its 6525 records": its records bear the declared run's names."""
    from alfa.study.bench.plan import declared_run_progress

    results = fixture_results()
    results["config"]["worlds"] = "v2"
    path = tmp_path / "results.json"
    for preset, counted in (("smoke", False), ("standard", True)):
        path.write_text(json.dumps(dict(results, preset=preset)), encoding="utf-8")
        with plotted_data_only():
            page = build_report(path, tmp_path / "r.md", tmp_path / "f", progress_of=declared_run_progress)
        assert ("**The declared run**" in page.read_text(encoding="utf-8")) == counted, preset


def test_report_says_first_that_its_results_are_missing(tmp_path, capsys):
    """It said that a figure of another page would be replaced, for results that were not there."""
    from alfa.cli import main

    (tmp_path / "figures" / "results").mkdir(parents=True)
    (tmp_path / "figures" / "results" / "rank_slices.png").write_bytes(b"a figure of another page")
    assert main(["report", "--results", str(tmp_path / "none"), "--out", str(tmp_path / "x.md")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"no benchmark results at {tmp_path / 'none'}" in err


def test_a_one_seed_page_counts_in_the_singular():
    """A newcomer's one-seed page said "Only 1 seed(s)"."""
    results = fixture_results()
    results["records"] = [r for r in results["records"] if r["seed"] == 0]
    page = render_report(results)
    assert "**Only 1 seed**: this is not the full benchmark" in page and "seed(s)" not in page
    # its cells of one seed show their persons' interval: the sanity table's intro said "the mean alone"
    assert "] (one seed)" in page and "one seed: the mean alone)" not in page
    assert "a cell of one seed, marked so, has its persons' interval" in page


def test_the_wall_time_of_two_processes_at_a_time_is_said_to_be_an_estimate():
    """A smoke run made by one process said "about 15 min of wall time with two processes at a time" beside its
    own run's 30.9 minutes in the table below it."""
    page = render_report(fixture_results())
    if "What this file cost" in page:
        assert "were two processes run at a time on this" in page and "(an estimate: the runs below" in page
    committed = (Path(__file__).resolve().parent.parent / "docs" / "results-v2.md").read_text(encoding="utf-8")
    assert "min of wall time** were two processes run at a time" in committed
