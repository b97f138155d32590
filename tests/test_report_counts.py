"""What the report's header counts and how its tables and sentences say which seeds each row has: every count on a
page agrees with the others, a part of the declared run with nothing missing is not listed as missing, and a
difference between rows of different seeds is made, and named, on the seeds both have (in the ablations, in
Table 1, the per-person table and the summary's pooled sentences, whose seeds read as ranges)."""

from __future__ import annotations

import dataclasses

from bench_records import complete, row
from test_report import MEANS, fixture_results, shifted

from alfa.study.bench import methods
from alfa.study.bench.calibration import calibration_page
from alfa.study.bench.flip_report import _after_lines
from alfa.study.bench.markdown import clear_count, spans
from alfa.study.bench.methods import declared_run_seeds
from alfa.study.bench.plan import DeclaredRunProgress
from alfa.study.bench.report_page import render_report
from alfa.study.bench.report_prose import declared_run
from alfa.study.bench.report_tables import ablation_table, person_table, table1
from alfa.study.bench.report_verdicts import main_verdicts
from alfa.study.bench.stats import index_records

# the committed page's counts when this was written: nothing of the family's seeds missing
UNDER_WAY = DeclaredRunProgress(
    held=3121, total=6525, selections=84, ablations=792, rows=999, family_missing=0, replicate_missing=1529
)


def _header(text: str) -> str:
    return text.split("## Summary")[0]


def test_the_header_counts_every_record_of_the_file_and_says_what_the_others_are():
    results = fixture_results()
    rows = len(results["records"])
    results["records"] += [
        complete({"method": "alfa[grid]", "pair": "E→stand-in", "seed": s, "per_person": {"p00": 5.0}}) for s in (0, 1)
    ] + [shifted("source-only", "S→R", s, 14.0) for s in (0, 1, 2)]
    results["records"].append(complete({"method": "alfa", "pair": "E→D", "seed": 5, "error_deg": None}))
    text = render_report(results)
    total = len(results["records"])
    assert (
        f"(preset `fixture`; {total} records: {rows} on the benchmark's pairs (the tables' rows), 2 recipe selections "
        "on the stand-in, 3 on the constructed positive control S→R and 1 without an error (not read); seeds 0, 1, 2)"
    ) in _header(text)
    assert f"for its {total} records" in text  # the costs paragraph counts the same records
    # a file of table rows only says its count alone, as before
    plain = fixture_results()
    assert f"(preset `fixture`; {len(plain['records'])} records; seeds 0, 1, 2)" in render_report(plain)


def test_the_declared_run_leaves_out_a_part_with_nothing_missing():
    header = _header(render_report(fixture_results(), progress=UNDER_WAY))
    assert "0 records" not in header and "the family's seeds" not in header
    assert (
        "the results file holds 3121 of its 6525 records. Not yet recorded: on seeds 0–2, 84 recipe selections, 792 "
        "ablation rows and 999 other rows; of the other rows of seeds 0–2 repeated on seeds 3–5 (§7.2, amended "
        "2026-12-04), 1529. A row without a record is shown as missing"
    ) in header
    # within the first part too, and a count of one is singular
    some = dataclasses.replace(UNDER_WAY, selections=0, rows=0, family_missing=1, replicate_missing=0)
    assert declared_run(**dataclasses.asdict(some), **declared_run_seeds()).endswith(
        "Not yet recorded: on seeds 0–2, 792 ablation rows; on the family's seeds 3–7, 1 record. A row without a "
        "record is shown as missing, and nothing is read from its absence."
    )


def test_the_declared_runs_words_follow_the_seeds_that_declare_it(monkeypatch):
    # the parts' seeds come from the constants that declare them: other constants, other words
    monkeypatch.setattr(methods, "FIRST_SEEDS", (0, 1, 2, 3))
    monkeypatch.setattr(methods, "FAMILY_SEEDS", (4, 5, 6, 7, 8, 9))
    monkeypatch.setattr(methods, "REPLICATE_SEEDS", (4, 6))
    progress = dataclasses.replace(UNDER_WAY, family_missing=2)
    header = _header(render_report(fixture_results(), progress=progress))
    assert (
        "Not yet recorded: on seeds 0–3, 84 recipe selections, 792 ablation rows and 999 other rows; on the "
        "family's seeds 4–9, 2 records; of the other rows of seeds 0–3 repeated on seeds 4, 6 (§7.2, amended "
        "2026-12-04), 1529."
    ) in header
    assert "0–2" not in header and "3–7" not in header and "3–5" not in header
    # the calibration page says the same paragraph with the same words
    page = calibration_page(
        [], {"records": fixture_results()["records"], "config": {}}, data="d", command="c", progress=progress
    )
    assert declared_run(**dataclasses.asdict(progress), **declared_run_seeds()) in page and "seeds 0–3, 84" in page


def test_a_declared_run_with_nothing_missing_says_it_is_fully_recorded_on_both_pages():
    done = DeclaredRunProgress(6525, 6525, 0, 0, 0, 0, 0)
    expected = (
        "**The declared run** (docs/flip-premise.md §7–7.4): the results file holds all 6525 of its records; the "
        "declared run is fully recorded."
    )
    header = _header(render_report(fixture_results(), progress=done))
    assert expected in header and "Not yet recorded" not in header
    page = calibration_page(
        [], {"records": fixture_results()["records"], "config": {}}, data="d", command="c", progress=done
    )
    assert expected in page and "Not yet recorded" not in page


def test_spans_writes_seeds_as_their_runs():
    assert spans([0, 1, 2, 3, 4, 5, 6, 7]) == "0–7"
    assert spans([7, 3, 4, 0]) == "0, 3–4, 7"
    assert spans([3]) == "3" and spans([]) == "—"


def _loss_section(text: str) -> str:
    start = text.index("### Self-supervised loss")
    return text[start : text.index("\n#", start + 1)]


def test_each_ablation_row_says_its_seeds_and_a_difference_is_made_and_named_on_the_shared_ones():
    # source-only on seeds 0–3, Alfa on 0–2, the augmentation loss on 0–1 only: the table's means are each over
    # their own seeds, while Alfa − augment is +1° on seeds 0–1 and the table's means differ by 1.5°
    means = {**MEANS, ("source-only", "E→M"): (9.0, 10.0, 11.0, 12.0), ("alfa[loss=augment]", "E→M"): (4.0, 5.0)}
    section = _loss_section(render_report(fixture_results(means)))
    rows = [line.split(" | ")[:4] for line in section.splitlines() if line.startswith("| ") and "---" not in line]
    assert rows[0][2] == "seeds"
    assert rows[1:] == [
        ["| source-only (truncated base)", "none", "0–3", "10.50 [8.45, 12.55]"],
        ["| Alfa", "flip", "0–2", "6.00 [3.52, 8.48]"],
        ["| alfa[loss=augment]", "augment", "0–1", "4.50 [−1.85, 10.85]"],
    ]
    assert (
        "- Flip-symmetry loss against augmentation consistency, on seeds 0–1 (those both rows have): Alfa − "
        "alfa[loss=augment] = +1.00°"
    ) in section
    assert (
        "- Flip-symmetry loss against no adaptation, on seeds 0–2 (those both rows have): Alfa − source-only" in section
    )
    assert "With the flip loss against no adaptation, on seeds 0–2 (those both rows have), per pair:" in section
    # rows of the same seeds name none
    same = _loss_section(render_report(fixture_results()))
    assert "those both rows have" not in same and "| Alfa | flip | 0–2 |" in same


def test_a_pair_with_other_seeds_than_the_rest_of_its_row_is_named():
    records = [row("alfa", s, 5.0, pair) for pair in ("E→M", "E→D") for s in (0, 1, 2)]
    records += [row("diag_gate", s, 6.0, "E→M") for s in (0, 1, 2)] + [row("diag_gate", 0, 6.0, "E→D")]
    layout = [{"label": "alfa", "value": "attention"}, {"label": "diag_gate", "value": "diagonal gate"}]
    text, pairs = ablation_table(index_records(records), layout)
    assert pairs == ["E→M", "E→D"]
    assert "| Alfa | attention | 0–2 |" in text and "| diagonal gate | — | 0–2 (E→D: 0) |" in text


def test_a_sweep_compares_its_means_on_the_seeds_every_value_has():
    # H=8 (Alfa's default) on seeds 0–2, H=1 on seeds 0–1: on their shared seeds H=1 is 6.5 and H=8 5.5 (over its
    # own three seeds H=8 would read 6.0)
    text = render_report(fixture_results({**MEANS, ("alfa[H=1]", "E→M"): (6.0, 7.0)}))
    # each mean with its interval over its two seeds (± t(0.975, 1) · 0.5 = ± 6.35)
    assert (
        "Alfa error (mean over E→M, on seeds 0–1 (those every value has)) by H: H=1: 6.50 [0.15, 12.85], "
        "H=8: 5.50 [−0.85, 11.85] deg" in text
    )
    assert "Alfa error (mean over E→M) by H: H=1: 7.00 [4.52, 9.48], H=8: 6.00 [3.52, 8.48] deg" in render_report(
        fixture_results()
    )


def _summary(text: str) -> str:
    return text.split("## Summary")[1].split("\n## ")[0]


def test_the_summarys_pooled_differences_name_their_seeds_where_they_are_not_the_pages():
    # source-only on seeds 0–3, Alfa and LoRA on 0–2: every difference with them is on 0–2, not the page's 0–3
    means = {**MEANS, ("source-only", "E→M"): (9.0, 10.0, 11.0, 12.0), ("source-only", "E→D"): (8.0, 8.5, 9.0, 9.5)}
    summary = _summary(render_report(fixture_results(means)))
    pooled = "- Pooled over the 2 pairs, Table 1's 2 other rows against source-only — clearly below it: LoRA −4.10 ["
    assert pooled in summary
    assert "clear (seeds 0–2), Alfa −3.70 [−4.20, −3.20] clear (seeds 0–2)." in summary
    assert "- Against its own starting point (source-only, on seeds 0–2), the mean error of Alfa is lower" in summary
    assert "- Against LoRA (same recipe, same steps), pooled over pairs, on seeds 0–2: Alfa − LoRA = " in summary
    assert "; Alfa −3.70 [−4.20, −3.20] clear (seeds 0–2)." in summary
    # a row with the page's seeds on one pair and fewer on the other: each per-pair difference names its own
    means[("alfa[selected]", "E→M")], means[("alfa[selected]", "E→D")] = (5.0, 6.0, 7.0, 8.0), (5.0, 5.1, 5.2)
    summary = _summary(render_report(fixture_results(means)))
    own = next(
        line for line in summary.splitlines() if line.startswith("- Against its own starting point (source-only)")
    )
    assert (
        "(E→M −4.00 [−4.00, −4.00] clear; E→D −3.40 [" in own and "] clear (seeds 0–2)). Pooled over pairs, on " in own
    )
    # with every row on the page's seeds, no sentence names any
    plain = _summary(render_report(fixture_results()))
    assert "(seeds " not in plain and ", on seeds" not in plain


# source-only on seeds 0–2; LoRA on 0–3 on both pairs; Alfa (selected recipe) on 0–3 on E→M, 0–2 on E→D
UNEVEN_SEEDS = {
    **MEANS,
    ("lora", "E→M"): (5.5, 5.9, 7.2, 8.0),
    ("lora", "E→D"): (4.0, 4.1, 4.2, 4.3),
    ("alfa[selected]", "E→M"): (5.0, 6.0, 7.0, 8.0),
    ("alfa[selected]", "E→D"): (5.0, 5.1, 5.2),
}


def test_table1_names_each_rows_seeds_and_a_pooled_number_on_others():
    rows = {
        line.split(" | ")[0].strip("| "): line
        for line in table1(index_records(fixture_results(UNEVEN_SEEDS)["records"])).splitlines()
    }
    assert rows["method"].startswith("| method | seeds | E→M | E→D | mean over pairs |")
    assert rows["source-only (truncated base)"].startswith("| source-only (truncated base) | 0–2 | ")
    assert rows["Alfa"].startswith("| Alfa | 0–2 | ") and "(seeds" not in rows["Alfa"]
    # LoRA's mean over pairs is over its 0–3; its Δ to source-only on the 0–2 both have
    assert rows["LoRA"].startswith("| LoRA | 0–3 | ") and rows["LoRA"].endswith(" clear (seeds 0–2) |")
    # the selected row's mean over pairs is on the seeds that have both pairs, 0–2, and says so
    selected = rows["Alfa (selected recipe)"]
    assert selected.startswith("| Alfa (selected recipe) | 0–3 (E→D: 0–2) | ")
    assert " | 5.55 [4.18, 6.92] (seeds 0–2) | " in selected and not selected.endswith("(seeds 0–2) |")


def test_flip_tta_on_top_is_read_against_flip_tta_alone_on_the_seeds_both_have():
    # on S→W source-only with flip-TTA on top is 13° on seeds 0–2 and 20° on seed 3; Alfa's model with it 12.5° on
    # 0–2: flip-TTA alone on Alfa's seeds is 13°, not 14.75° over all four, and the sentence says on which seeds
    def tta(method, seed, value):
        record = row(method, seed, 15.0, "S→W")
        flip = {p: {"tta_error": value} for p in record["per_person"]}
        return {**record, "flip_tta_error_deg": value, "per_person_flip": flip}

    records = [tta("source-only", s, 20.0 if s == 3 else 13.0) for s in range(4)]
    records += [tta("alfa", s, 12.5) for s in range(3)]
    (line,) = _after_lines(index_records(records), ["source-only", "alfa"], ["S→W"])[:1]
    assert line.startswith(
        "On S→W, of the 1 personalized models with flip-TTA on top, the lowest mean error is Alfa's (12.50° "
        "[12.50, 12.50], flip-TTA alone 13.00° [13.00, 13.00], on seeds 0–2): Alfa + flip-TTA − flip-TTA = −0.50°"
    )


def test_a_pair_ranked_on_a_rows_own_seeds_says_them_as_a_range():
    # Alfa (selected recipe) on seeds 0–1 of E→M, the others on 0–2: it is ranked on its two, said as the page
    # says seeds everywhere else ("0–1"), not as a list
    means = {**MEANS, ("alfa[selected]", "E→M"): (4.9, 5.0)}
    lines = main_verdicts(index_records(fixture_results(means)["records"]))
    assert any(line.startswith("On E→M (on seeds 0–1, the ones it has) Alfa (selected recipe)") for line in lines)
    assert not any("seeds 0, 1" in line for line in lines)


def test_the_per_person_table_names_each_rows_seeds_as_table1_does():
    table = person_table(index_records(fixture_results(UNEVEN_SEEDS)["records"]))
    rows = {line.split(" | ")[0].strip("| "): line for line in table.splitlines()}
    assert rows["method"].startswith(
        "| method | seeds | std over persons (per seed the mean over its records; mean over seeds, 95 % interval) |"
    )
    # every record's persons are its mean −1, +0, +1: a population std of √(2/3) in every seed, so no spread
    assert rows["source-only (truncated base)"].startswith("| source-only (truncated base) | 0–2 | 0.82 [0.82, 0.82] |")
    assert rows["Alfa"].startswith("| Alfa | 0–2 | ") and "(seeds" not in rows["Alfa"]
    # LoRA's records are on 0–3; the persons it helps are counted on the 0–2 it shares with source-only, named:
    # the fixture's same 3 persons in every seed, on 2 pairs, every one of them better
    assert rows["LoRA"].startswith("| LoRA | 0–3 | ") and "| 6 / 6 (seeds 0–2) |" in rows["LoRA"]
    assert rows["Alfa (selected recipe)"].startswith("| Alfa (selected recipe) | 0–3 (E→D: 0–2) | ")


def test_the_header_says_user_calibration_records_are_read_on_their_own_page():
    # they are scored records on the benchmark's pairs, but no table of this page reads them
    results = fixture_results()
    rows = len(results["records"])
    results["records"] += [shifted("calibrate-affine[k=9]", "E→M", s, 7.0) for s in (0, 1, 2)]
    header = _header(render_report(results))
    assert f"{rows} on the benchmark's pairs (the tables' rows)" in header
    assert (
        "3 of user calibration from labelled images (on a page of their own: `alfa report --user-calibration PAGE`; "
        "the declared run's is docs/results-user-calibration.md)" in header
    )


def test_a_first_protocol_page_says_its_runs_standard_is_todays_first_standard_only_for_that_flag():
    results = fixture_results()  # the first worlds (v1), with one run
    run = results["runs"][0]
    for command, renamed in (("alfa bench --standard --seeds 0", True), ("alfa bench --first-standard", False)):
        results["runs"] = [dict(run, command=command)]
        assert ("`alfa bench --first-standard` runs today" in render_report(results)) is renamed


def test_the_source_models_table_gives_each_source_its_mean_over_seeds_with_an_interval():
    from alfa.study.bench.report_tables import source_table

    def model(dense, tpgaze=None):
        out = {"truncation": {"errors": {"before_truncation": dense, "after_truncation": dense + 2.0}}}
        return {**out, "tpgaze_meta": {"final_val_error": tpgaze}} if tpgaze else out

    sources = {"E|seed0": model(5.0, 9.0), "E|seed1": model(6.0), "E|seed2": model(7.0), "G|seed0": model(4.0)}
    table = source_table(sources)
    assert "| E, seed 1 | 6.00 | 8.00 | — | — | — |" in table
    # 6 ± t(0.975, 2) · 1 / √3; TPGaze's prompts on one seed only, and G's single model: no mean row
    assert "| E, mean over seeds 0–2 | 6.00 [3.52, 8.48] | 8.00 [5.52, 10.48] | — | — | — |" in table
    assert "G, mean over" not in table


def test_a_cost_is_a_median_over_records_with_a_distribution_free_interval_from_six_records():
    from alfa.study.timing import median_text

    # six records: the smallest and the largest bound the median with 96.9 % coverage; five cover only 93.75 %
    assert median_text([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], 1) == "3.5 [1.0, 6.0]"
    assert median_text([1.0, 2.0, 3.0, 4.0, None, 5.0], 1) == "3.0"
    assert median_text([None], 1) == "—"
    # a page that quotes a record's own median (speed.md: the upper middle round) keeps it, inside the interval
    from alfa.study.timing import median_cell

    assert median_cell([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], 4.0, 1, recorded=True) == "4.0 [1.0, 6.0]"


def test_a_count_of_clear_comparisons_says_why_none_can_be_where_none_was_judged():
    from alfa.study.bench.stats import Diff

    def d(mean: float, seeds: int = 3, declared: bool = True, adjusted: float | None = 0.001) -> Diff:
        per_seed = {s: mean for s in range(seeds)}
        return Diff(
            "a", "b", ("E→M",), "error", per_seed, 0.1, seeds - 1, "seeds drawn", 0, 0, 5, adjusted, 11, declared
        )

    assert clear_count([d(-1.0), d(-1.0, adjusted=0.5)]) == "1 called clear"
    assert clear_count([d(-1.0), d(-1.0, declared=False)]) == "1 called clear of the 1 judged"
    assert clear_count([d(-1.0, declared=False), d(1.0, declared=False)]) == "descriptive: not in the declared family"
    assert clear_count([d(-1.0, seeds=1), d(1.0, seeds=1, declared=False)]) == "not judged: one seed"
    assert clear_count([]) == "0 called clear"


def test_a_best_of_choice_says_it_was_made_among_the_rows_with_the_most_seeds_and_names_a_larger_gain_left_out():
    """The best of many rows is chosen among those with the most seeds (a row of fewer cannot be clearly worse);
    the sentence says so, and a larger gain among the rows left out is named with its own seeds, not hidden."""
    from alfa.study.bench.flip_report import _harmless_best

    def tta(method, seed, value, tta_value):
        record = row(method, seed, value, "S→W")
        flip = {p: {"tta_error": tta_value} for p in record["per_person"]}
        return {**record, "flip_tta_error_deg": tta_value, "per_person_flip": flip}

    records = [tta("source-only", s, 15.0 + s, 14.0 + s) for s in range(4)]
    records += [tta("lora", s, 14.5 + s, 13.8 + s) for s in range(4)]  # −0.5 on all four seeds
    records += [tta("alfa", s, 12.0 + s, 13.0 + s) for s in range(2)]  # −3.0, on two seeds only
    idx = index_records(records)
    (chosen, left_out) = _harmless_best(idx, ["source-only", "lora", "alfa"], ["S→W"], {"S→W": {"ceiling": 0.0}})
    assert chosen.startswith(
        "On S→W, of the 2 rows compared with source-only (2 not clearly worse; chosen among the 1 with the most "
        "seeds, all 4 seeds), the largest gain is LoRA's: LoRA − source-only = −0.50°"
    )
    assert left_out.startswith(
        "On S→W, of the 1 rows with fewer seeds, the largest gain is Alfa's, on seeds 0–1 (fewer seeds, so a wider "
        "interval): Alfa − source-only = −3.00°"
    )
    (chosen, left_out) = _after_lines(idx, ["source-only", "lora", "alfa"], ["S→W"])[:2]
    assert "with flip-TTA on top (chosen among the 1 with the most seeds, all 4 seeds), the lowest" in chosen
    assert left_out.startswith("On S→W, of the 1 rows with fewer seeds, the lowest mean error is Alfa's, on seeds 0–1")
    assert "Alfa + flip-TTA − flip-TTA = −1.00°" in left_out


def test_a_row_left_out_for_fewer_seeds_is_named_only_for_a_gain():
    """Where no row gains (the least harm is named), a fewer-seed row that also harms is no "largest gain"."""
    from alfa.study.bench.flip_report import _harmless_best

    records = [row("source-only", s, 15.0 + s, "S→W") for s in range(4)]
    records += [row("lora", s, 15.0 + s + d, "S→W") for s, d in enumerate((0.5, -0.1, 0.6, -0.1))]  # +0.225
    records += [row("alfa", s, 15.0 + s + d, "S→W") for s, d in enumerate((0.1, 0.0))]  # +0.05 on two: no gain
    lines = _harmless_best(index_records(records), ["source-only", "lora", "alfa"], ["S→W"], {"S→W": {"ceiling": 0}})
    assert len(lines) == 1 and "none lowers the mean error below source-only; the least harm: LoRA" in lines[0]
