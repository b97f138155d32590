"""The benchmark report: numbers and verdict sentences from a hand-written results.json."""

import json
import statistics

import pytest
from bench_records import complete

from alfa.study.bench.config import BenchConfig
from alfa.study.bench.measures import sanity_summary
from alfa.study.bench.report_page import build_report, render_report
from alfa.study.bench.report_tables import runs_table, table1
from alfa.study.bench.report_verdicts import main_verdicts, sanity_verdicts
from alfa.study.bench.results import FORMAT, VERSION, layout, load_results
from alfa.study.bench.stats import cell, diff, index_records
from alfa.study.plotted import plotted_data_only


def record(method, pair, seed, errors, **extra):
    """A record as the runner writes it; ``errors`` are per-person degrees."""
    per_person = {f"p{i:02d}": float(e) for i, e in enumerate(errors)}
    return complete(
        {
            "id": f"{method}|{pair}|seed{seed}",
            "config_hash": "fixture",
            "method": method,
            "group": extra.pop("group", "main"),
            "pair": pair,
            "seed": seed,
            "error_deg": statistics.fmean(per_person.values()),
            "per_person": per_person,
            "persons": len(per_person),
            "std_over_persons": statistics.pstdev(per_person.values()),
            "trainable_params": extra.pop("trainable_params", 0),
            "inference_params": extra.pop("inference_params", 2_285_122),
            "merge": extra.pop("merge", "none"),
            "adapter_bytes": None,
            "seconds_per_user": 1.0,
            "failed": {},
            **extra,
        }
    )


def shifted(method, pair, seed, mean, spread=(-1.0, 0.0, 1.0), **extra):
    """A record whose persons' errors are ``mean + spread`` (so the record's mean is ``mean``)."""
    return record(method, pair, seed, [mean + s for s in spread], **extra)


# Per seed 0, 1, 2. On E→M Alfa wins, not clearly; on E→D LoRA wins by 1° in every seed and person (clear).
MEANS = {
    ("source-only", "E→M"): (9.0, 10.0, 11.0),
    ("lora", "E→M"): (5.5, 5.9, 7.2),
    ("alfa", "E→M"): (5.0, 6.0, 7.0),
    ("source-only", "E→D"): (8.0, 8.5, 9.0),
    ("lora", "E→D"): (4.0, 4.1, 4.2),
    ("alfa", "E→D"): (5.0, 5.1, 5.2),
    ("in-domain", "E→M"): (3.0, 3.0, 3.0),
    ("in-domain", "E→D"): (3.0, 3.0, 3.0),
    ("oracle", "E→M"): (2.0, 2.5, 3.0),
    ("oracle", "E→D"): (2.0, 2.0, 2.0),
    # ablations on E→M only
    ("alfa[H=1]", "E→M"): (6.0, 7.0, 8.0),
    ("alfa[loss=augment]", "E→M"): (4.0, 5.0, 6.0),
}


def fixture_results(means=MEANS):
    records = []
    for (method, pair), values in means.items():
        for seed, m in enumerate(values):
            extra = {}
            if method == "alfa":
                extra = {"trainable_params": 630_784, "merge": "factorized (rank d)", "adapter_bytes": 2_500_000}
            if method == "lora":
                extra = {"trainable_params": 263_680, "inference_params": 11_177_538, "merge": "densified"}
            if method in ("in-domain", "source-only"):
                extra = {"constant_prediction_deg": 12.0 if method == "in-domain" else 10.0}
            records.append(shifted(method, pair, seed, m, **extra))
    # the same persons in every seed; the first protocol's worlds, whose pages judge every comparison they make
    config = BenchConfig.quick(seeds=(0, 1, 2), target_draw="fixed", worlds="v1")
    return {
        "format": FORMAT,
        "version": VERSION,
        "preset": "fixture",
        "config": config.protocol_dict(),
        "records": records,
        "sources": {},
        "runs": [
            {
                "id": "r1",
                "command": "alfa bench --full --out fixture",
                "started": "2026-01-01T00:00:00",
                "wall_s": 3600.0,
                "cpu_s": 3000.0,
                "records_run": len(records),
                "selection": {"threads": 1},
                "load_average_start": 1.0,
                "load_average_end": 2.0,
                "cpus": 2,
                "torch": "x",
                "finished": True,
            }
        ],
        "sanity": {},
        "figures": {},
        "layout": layout(config),
    }


@pytest.fixture
def idx():
    return index_records(fixture_results()["records"])


def test_mean_and_sample_std_over_seeds(idx):
    s = cell(idx, "alfa", "E→M")
    assert s.values == {0: 5.0, 1: 6.0, 2: 7.0}
    assert s.mean == pytest.approx(6.0)
    assert s.std == pytest.approx(1.0)  # sample std (n − 1)
    # cells show the mean with its 95 % interval, 6 ± t(0.975, 2) · 1 / √3 (t = 4.303)
    assert s.format() == "6.00 [3.52, 8.48]" and s.format("°") == "6.00° [3.52, 8.48]"
    assert cell(idx, "lora", "E→D").format() == "4.10 [3.85, 4.35]"


def test_paired_difference_and_clearness(idx):
    d = diff(idx, "alfa", "lora", ["E→M"])  # −0.5, +0.1, −0.2
    assert d.per_seed == pytest.approx({0: -0.5, 1: 0.1, 2: -0.2})
    assert d.mean == pytest.approx(-0.2)
    # every person moves with its seed here, so only the seeds vary: the standard error of their mean
    assert d.se == pytest.approx(statistics.stdev([-0.5, 0.1, -0.2]) / 3**0.5, rel=0.03)
    assert d.df == 2 and not d.clear and d.p > 0.05
    assert "not clear at 5 % judged alone" in d.describe()
    d = diff(idx, "alfa", "lora", ["E→D"])  # +1.0 in every seed and for every person
    assert d.mean == pytest.approx(1.0) and d.clear
    assert d.persons_better == 0 and d.persons_worse == 3 and d.persons == 3  # three distinct persons
    assert d.describe().startswith("+1.00° [1.00, 1.00] (95 %, persons and seeds drawn); clear at 5 % judged alone")


def test_table1_numbers_and_bold_best(idx):
    text = table1(idx)
    rows = {line.split(" | ")[0].strip("| "): line for line in text.splitlines()[2:]}
    assert "**6.00 [3.52, 8.48]**" in rows["Alfa"]  # best on E→M
    assert "5.10 [4.85, 5.35]" in rows["Alfa"] and "**5.10" not in rows["Alfa"]
    assert "**4.10 [3.85, 4.35]**" in rows["LoRA"]  # best on E→D
    # mean over pairs per seed: alfa (5+5)/2, (6+5.1)/2, (7+5.2)/2 -> 5.0, 5.55, 6.1
    assert "5.55 [4.18, 6.92]" in rows["Alfa"]  # 5.55 ± t(0.975, 2) · 0.55 / √3 (their sample std is 0.55)
    assert "11.178 M (densified)" in rows["LoRA"]
    assert "2.285 M" in rows["Alfa"]


def test_verdicts_say_where_alfa_wins_and_loses(idx):
    lines = main_verdicts(idx)
    assert lines[0] == "Of Table 1's 3 rows, Alfa has the lowest mean error on 1 of 2 pairs (E→M)."
    em = next(line for line in lines if line.startswith("On E→M"))
    assert (
        "leads the runner-up of the 3 rows, LoRA" in em
        and f"Alfa − LoRA = {diff(idx, 'alfa', 'lora', ['E→M']).describe()}" in em
    )
    assert "not clear at 5 % judged alone" in em
    ed = next(line for line in lines if line.startswith("On E→D"))
    assert ed.startswith("On E→D Alfa does not win: LoRA is best (4.10° [3.85, 4.35]), Alfa is 2nd of 3")
    assert "+1.00° [1.00, 1.00] (95 %, persons and seeds drawn); clear at 5 % judged alone" in ed


def test_verdict_when_alfa_loses_everywhere():
    means = dict(MEANS)
    means[("alfa", "E→M")] = (12.0, 12.5, 13.0)  # now worse than source-only on E→M
    idx = index_records(fixture_results(means)["records"])
    lines = main_verdicts(idx)
    assert lines[0] == "Of Table 1's 3 rows, Alfa has the lowest mean error on 0 of 2 pairs."
    assert any(line.startswith("On E→M Alfa does not win: LoRA is best") and "3rd of 3" in line for line in lines)
    text = next(line for line in lines if line.startswith("Against its own starting point"))
    assert (
        "the mean error of Alfa is lower on 1 of 2 pairs, with its 95 % interval below zero on 1 (1 called clear "
        "after Holm's correction); it does not on E→M (E→M +2.50 ["
    ) in text
    report = render_report(fixture_results(means))
    assert "in the means the error is not below on 1 of 1 pairs (E→M), with the 95 % interval below zero on 0" in report


def test_verdicts_speak_of_alfas_selected_row_beside_the_papers():
    means = dict(MEANS)
    means[("alfa[selected]", "E→M")] = (4.0, 4.5, 5.0)  # best on E→M, clearly below Alfa (paper recipe)
    means[("alfa[selected]", "E→D")] = (7.0, 7.5, 8.0)  # below source-only, above both LoRA and Alfa
    means[("lora[selected]", "E→M")] = (6.0, 6.0, 6.0)
    means[("lora[selected]", "E→D")] = (6.0, 6.0, 6.0)
    idx = index_records(fixture_results(means)["records"])
    lines = main_verdicts(idx)
    assert lines[0] == "Of Table 1's 5 rows, Alfa has the lowest mean error on 0 of 2 pairs."
    assert any(line.startswith("On E→M Alfa does not win: Alfa (selected recipe) is best") for line in lines)
    k = lines.index("Of Table 1's 5 rows, Alfa (selected recipe) has the lowest mean error on 1 of 2 pairs (E→M).")
    assert k > 0 and lines[k + 1].startswith("On E→M Alfa (selected recipe) (4.50° [3.26, 5.74]) leads the runner-up")
    assert lines[k + 2].startswith("On E→D Alfa (selected recipe) does not win: LoRA is best")
    own = lines[k + 3]
    assert own.startswith("Against its own starting point (source-only), the mean error of Alfa (selected recipe)")
    assert (
        "is lower on 2 of 2 pairs, with its 95 % interval below zero on 2 (2 called clear after Holm's correction) "
        "(E→M −5.50 ["
        in own
        and "). Pooled over pairs: Alfa (selected recipe) − " in own
    )
    # per seed: (4 + 7)/2 − 6, (4.5 + 7.5)/2 − 6, (5 + 8)/2 − 6 = -0.5, 0, 0.5; lower on E→M, higher on E→D
    d = diff(idx, "alfa[selected]", "lora[selected]", ["E→M", "E→D"])
    assert d.mean == pytest.approx(0.0, abs=1e-12) and not d.clear and (d.persons_better, d.persons) == (3, 6)
    assert lines[k + 4] == (
        "Against LoRA (selected recipe) (its recipe selected by the same rule), pooled over pairs: "
        f"Alfa (selected recipe) − LoRA (selected recipe) = {d.describe()}."
    )
    assert d.describe().startswith("+0.00° [") and d.describe().endswith("; lower for 3 of 6 persons")


def test_without_the_paper_recipe_alfas_selected_row_still_gets_its_verdicts_and_missing_pairs_are_named():
    """The second protocol runs Alfa's selected and default rows before its paper recipe: the page must not say
    "Alfa was not run" beside them, and a pair the row has no record on is named, not counted."""
    means = {k: v for k, v in MEANS.items() if k[0] != "alfa"}
    means[("alfa[selected]", "E→M")] = (4.0, 4.5, 5.0)
    means[("lora[selected]", "E→M")] = (6.0, 6.0, 6.0)
    lines = main_verdicts(index_records(fixture_results(means)["records"]))
    assert "Alfa was not run; no verdict." not in lines
    assert lines[0] == (
        "Of Table 1's 4 rows, Alfa (selected recipe) has the lowest mean error on 1 of 1 pairs (E→M) "
        "(it has no records on E→D)."
    )
    # pooled over both pairs only LoRA (paper recipe) has records on each: the selected rows are not pooled
    assert lines[-1].startswith(
        "Of Table 1's 1 other rows, each compared with source-only pooled over pairs, 1 have a lower mean"
    )
    own = next(line for line in lines if line.startswith("Against its own starting point"))
    assert "Pooled" not in own  # over its one pair a pooled difference would repeat that pair's
    means[("alfa[selected]", "E→D")] = (7.0, 7.5, 8.0)
    means[("source-only", "G→M")] = (9.0, 9.0, 9.0)  # a third pair without the selected rows
    idx = index_records(fixture_results(means)["records"])
    lines = main_verdicts(idx)
    own = next(line for line in lines if line.startswith("Against its own starting point"))
    pooled = diff(idx, "alfa[selected]", "source-only", ["E→M", "E→D"]).describe()
    assert own.endswith(
        f". Pooled over E→M, E→D (the pairs with both rows): Alfa (selected recipe) − source-only = {pooled}."
    )
    assert not any(line.startswith("Against LoRA (selected recipe)") for line in lines)  # LoRA's has one pair
    without = {k: v for k, v in means.items() if not k[0].startswith("alfa")}
    assert main_verdicts(index_records(fixture_results(without)["records"])) == ["Alfa was not run; no verdict."]


def test_a_row_of_fewer_seeds_is_ranked_on_its_seeds_and_never_bold_beside_rows_of_more():
    means = dict(MEANS)
    means[("alfa[selected]", "E→M")] = (4.9,)  # one seed: below Alfa's 3-seed mean (6.0), above its seed 0 (5.0)
    idx = index_records(fixture_results(means)["records"])
    rows = {line.split(" | ")[0].strip("| "): line for line in table1(idx).splitlines()[2:]}
    # one seed: the interval over its three persons (4.9 ± 1), marked
    assert (
        "| 4.90 [2.42, 7.38] (one seed) |" in rows["Alfa (selected recipe)"] and "**6.00 [3.52, 8.48]**" in rows["Alfa"]
    )
    lines = main_verdicts(idx)
    em = next(line for line in lines if line.startswith("On E→M (on seed 0, the ones it has) Alfa (selected"))
    # on seed 0 Alfa (paper recipe) has 5.0 and LoRA 5.5: the selected row is best, 0.10° ahead of Alfa's 5.00
    assert em.startswith(
        "On E→M (on seed 0, the ones it has) Alfa (selected recipe) (4.90° [2.42, 7.38] (one seed)) leads the runner-up"
    )
    assert "Alfa (5.00° [2.52, 7.48] (one seed)), by 0.10° in the means" in em
    # neither summary line may say "of the 4 rows" where a ranking left a row out or narrowed the seeds
    ranked_lines = [line for line in lines if "has the lowest mean error on" in line]
    assert len(ranked_lines) == 2 and all(
        line.startswith("Ranked on its own seeds against the rows") for line in ranked_lines
    )
    assert lines[-1].endswith("Not pooled, for want of records on every pair: Alfa (selected recipe).")


def test_sanity_summary_and_sentences(idx):
    s = sanity_summary(idx.values())
    assert s["E→M"]["in_domain"]["mean"] == pytest.approx(3.0)
    assert s["E→M"]["source_only"]["mean"] == pytest.approx(10.0)
    assert s["E→M"]["domain_gap_deg"] == pytest.approx(7.0)
    assert s["E→M"]["headroom_deg"] == pytest.approx(7.5)
    assert s["E→D"]["headroom_deg"] == pytest.approx(6.5)
    lines = sanity_verdicts(idx)
    assert lines[0].startswith("In-domain error (the base on held-out source persons) is below the cross-domain")
    # the smallest and the largest gap, each with its interval (the bootstrap's, as in the sanity table)
    assert "on 2 of 2 pairs (2 called clear), by 5.50° [4.26, 6.74] (E→D) to 7.00° [4.48, 9.52] (E→M)" in lines[0]
    assert "(2 called clear): headroom 6.50° [5.26, 7.74] (E→D) to 7.50° [6.27, 8.73] (E→M)" in lines[2]
    # relative to the labels' spread: in-domain 3/12 = 25 % in every seed; cross-domain per seed 9, 10, 11 of 10 and
    # 8, 8.5, 9 of 10: 100 % ± t(0.975, 2) · 10 / √3 = [75, 125] and 85 % ± 4.303 · 5 / √3 = [73, 97]
    assert (
        "in-domain error is 25 % [25, 25], 25 % [25, 25] of a constant prediction's and the cross-domain error "
        "100 % [75, 125], 85 % [73, 97] (E→M, E→D; 95 % intervals)"
    ) in lines[1]
    assert (
        "relatively worse across domains on 2 of 2 pairs in the means, beyond the interval of the difference on 2"
        in (lines[1])
    )


def test_report_file_regenerates_identically(tmp_path):
    (tmp_path / "bench").mkdir()
    path = tmp_path / "bench" / "results.json"
    path.write_text(json.dumps(fixture_results()))
    assert load_results(path)["preset"] == "fixture"
    md = build_report(path, tmp_path / "docs" / "results.md")
    text = md.read_text()
    assert "| Alfa | 0–2 | **6.00 [3.52, 8.48]** | 5.10 [4.85, 5.35] |" in text
    assert "60.0 min wall time, 50.0 min CPU time" in text
    assert "`alfa bench --full --out fixture`" in text
    assert "| alfa[H=1] | 1 | 0–2 | 7.00 [4.52, 9.48] |" in text
    assert (
        "Flip-symmetry loss against augmentation consistency: Alfa − alfa[loss=augment] = +1.00° [1.00, 1.00]" in text
    )
    # the page is one family: its statement, and the verdicts judged over it
    assert "The page makes **" in text and "after Holm over" in text and "judged alone" not in text
    assert (tmp_path / "docs" / "figures" / "results" / "error_vs_heads.png").is_file()
    assert "figures/results/error_vs_heads.png" in text and "No figure yet" not in text
    with plotted_data_only():  # the page again (the figure was drawn above; the page names it the same way)
        build_report(path, tmp_path / "docs" / "results.md")
    assert md.read_text() == text


def test_bad_results_file_is_refused(tmp_path):
    bad = tmp_path / "results.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="results.json: not valid JSON"):
        load_results(bad)
    bad.write_text(json.dumps({"format": "something else"}))
    with pytest.raises(ValueError, match="not an alfa benchmark results file"):
        load_results(bad)
    with pytest.raises(FileNotFoundError):
        load_results(tmp_path / "missing")


def test_the_cost_of_the_file_counts_records_and_recorded_training(tmp_path):
    results = fixture_results()
    results["sources"] = {
        "E|seed0": {"from_cache": True, "recorded_train_seconds": 600.0},
        "E|seed1": {"from_cache": False, "recorded_train_seconds": 540.0},
        "G|seed0": {"from_cache": True},
    }
    for r in results["records"]:
        r["wall_s"] = 60.0
    (tmp_path / "bench").mkdir()
    path = tmp_path / "bench" / "results.json"
    path.write_text(json.dumps(results))
    with plotted_data_only():  # its words, not its figure's drawing
        text = build_report(path, tmp_path / "results.md").read_text()
    n = len(results["records"])
    total = n + 19  # one minute per record, 10 + 9 minutes of recorded training
    assert f"**What this file cost: {total} process-minutes**" in text
    assert f"{n:.1f} min for its {n} records" in text and "19.0 min of model training" in text
    assert "no recorded time for G|seed0" in text
    assert "| E, seed 0 |" in text and "| 10.0 |" in text and "| 9.0 |" in text


def _parts(yaw, pitch, yaw_bias, pitch_bias, persons=("p00", "p01")):
    return {p: {"yaw": yaw, "pitch": pitch, "yaw_bias": yaw_bias, "pitch_bias": pitch_bias} for p in persons}


def test_yaw_and_pitch_parts_table_and_verdicts():
    from alfa.study.bench.report_tables import parts_table
    from alfa.study.bench.report_verdicts import parts_verdicts

    records = []
    for pair in ("E→M", "E→D"):
        for seed in (0, 1, 2):
            records.append(record("source-only", pair, seed, [4, 4], per_person_parts=_parts(3, 2, 1, -0.5)))
            # Alfa: pitch error +4 and |pitch bias| +4.5 in every seed; yaw error +0, +0.1, +0.2
            records.append(record("alfa", pair, seed, [7, 7], per_person_parts=_parts(3 + 0.1 * seed, 6, 1, 5)))
    idx = index_records(records)
    table = parts_table(idx, ["source-only", "alfa"])
    assert (
        "| source-only (truncated base) | 4.00 [4.00, 4.00] | 3.00 [3.00, 3.00] | 2.00 [2.00, 2.00] | "
        "1.00 [1.00, 1.00] | 0.50 [0.50, 0.50] |" in table
    )
    assert (
        "| Alfa | 7.00 [7.00, 7.00] | 3.10 [2.85, 3.35] | 6.00 [6.00, 6.00] | 1.00 [1.00, 1.00] | 5.00 [5.00, 5.00] |"
        in table
    )
    lines = parts_verdicts(idx, ["source-only", "alfa"])
    assert lines[0].startswith("Alfa − source-only, pooled over pairs: yaw error +0.10° [")
    assert "not clear at 5 % judged alone" in lines[0]
    assert (
        "pitch error +4.00° [4.00, 4.00] (95 %, persons and seeds drawn); clear at 5 % judged alone (p = 0); "
        "lower for 0 of 4 persons"  # 2 pairs × 2 persons, each counted once over the seeds
    ) in lines[1]
    assert "absolute pitch bias +4.50° [4.50, 4.50]" in lines[2]
    # pitch +4 against yaw +0.1 on average: the pitch error grew 3.9° more, in every seed and person
    assert lines[3] == (
        "Of the yaw-and-pitch table's 1 rows compared with source-only, 1 end above it (1 called clear); for 1 of "
        "those the pitch error grew more than the yaw error (1 called clear); change of pitch error − change of yaw "
        "error: Alfa +3.90 [3.65, 4.15] clear."
    )


def test_records_without_parts_leave_the_parts_section_out():
    idx = index_records(fixture_results()["records"])
    from alfa.study.bench.report_tables import parts_table

    assert parts_table(idx, ["source-only", "alfa"]) == ""
    assert "## Where the error goes" not in render_report(fixture_results())


def test_the_pooled_sentence_sorts_every_row_against_source_only():
    from alfa.study.bench.flip_report import flip_summary
    from alfa.study.bench.methods import MAIN_METHODS

    means = dict(MEANS)
    means[("diag_gate", "E→M")] = (9.0, 10.5, 10.0)  # −0, +0.5, −1 against source-only: within the spread
    means[("diag_gate", "E→D")] = (8.0, 8.5, 9.0)
    results = fixture_results(means)
    idx = index_records(results["records"])
    lines = flip_summary(results, idx, MAIN_METHODS)
    # per seed, mean over the pairs: LoRA −3.75, −4.25, −4.30; Alfa −3.50, −3.70, −3.90; the gate 0, +0.25, −0.5
    lora, alfa, gate = (diff(idx, m, "source-only", ["E→M", "E→D"]) for m in ("lora", "alfa", "diag_gate"))
    assert (lora.mean, alfa.mean, gate.mean) == pytest.approx((-4.1, -3.7, -1 / 12))
    assert lora.clear and alfa.clear and not gate.clear
    assert (
        "Pooled over the 2 pairs, Table 1's 2 other rows and diagonal gate against source-only — clearly below it: "
        f"LoRA {lora.compact()}, Alfa {alfa.compact()}; intervals containing zero: diagonal gate {gate.compact()}."
    ) in lines
    # the count names only the rows it holds: one of Table 1's is singular; none of Table 1's is not "0 other rows"
    from alfa.study.bench.flip_report import _pooled_lines

    (one,) = _pooled_lines(idx, ["lora", "diag_gate"], ["source-only", "lora"])
    assert one.startswith("Pooled over the 2 pairs, Table 1's 1 other row and diagonal gate against source-only — ")
    (mix,) = _pooled_lines(idx, ["diag_gate"], ["source-only"])
    assert mix.startswith("Pooled over the 2 pairs, diagonal gate against source-only — ")
    # a row not called clear (descriptive, or not clear after Holm) whose own interval is far from zero says so
    from dataclasses import replace

    from alfa.study.bench.flip_report import _side

    harm = replace(gate, per_seed={0: 39.1, 1: 39.1}, se=4.0, declared=False)  # far above zero, descriptive
    assert harm.above_zero and not harm.clear and _side(harm) == "above, not clear"
    assert _side(replace(harm, per_seed={0: -1.0, 1: -1.0}, se=1.0)) == "within"
    assert _side(replace(harm, per_seed={0: -39.1, 1: -39.1})) == "below, not clear"
    assert lora.compact().startswith("−4.10 [") and lora.compact().endswith("] clear")


@pytest.mark.parametrize("preset, says_so", [("smoke", True), ("quick", True), ("standard", False)])
def test_the_check_presets_say_first_that_they_make_no_claims(preset, says_so):
    results = fixture_results()
    results["preset"] = preset
    head = render_report(results).split("## ")[0]
    assert (f"**Preset `{preset}` makes no claims.**" in head) == says_so
    if says_so:  # the page of record of the results' own worlds (a v2 smoke page named the v1 one)
        assert "The page of record is `docs/results.md`." in head
        results["config"]["worlds"] = "v2"
        assert "The page of record is `docs/results-v2.md`." in render_report(results).split("## ")[0]


def test_a_page_is_one_family_and_says_so():
    """Every verdict on the page is judged over the same family, whose size the summary states; and every
    difference the page quotes carries its interval (here, and on the committed pages)."""
    import re
    from pathlib import Path

    text = render_report(fixture_results())
    count = int(re.search(r"The page makes \*\*(\d+) comparisons\*\*", text).group(1))
    sizes = {int(n) for n in re.findall(r"after Holm over (\d+) comparisons", text)}
    assert count > 10 and sizes == {count}
    assert f"Holm-adjusted over all {count}" in text and "judged alone" not in text
    docs = Path(__file__).resolve().parent.parent / "docs"
    for page in (text, (docs / "results.md").read_text("utf-8"), (docs / "results-flip.md").read_text("utf-8")):
        assert not re.findall(r"= [+−]\d+\.\d\d°(?! \[)", page)  # a quoted difference without its interval
        assert "within the spread" not in page and "a clear difference" not in page


def test_a_second_protocol_page_judges_only_its_declared_family():
    """On the v2 worlds the family is the one declared before the runs (docs/flip-premise.md §7.1): the page
    says so, names the declared comparisons these records cannot make, and judges nothing outside it."""
    import re

    results = fixture_results()
    results["config"]["worlds"] = "v2"
    text = render_report(results)
    assert "**The family was declared before the runs**" in text and "11 comparisons" in text
    assert "11 declared comparison(s) could not be made" in text  # the fixture has no positive control
    assert not re.search(r"after Holm over \d+ comparisons", text) and "descriptive: not in the declared family" in text
    assert not re.search(r"\d called clear", text)  # nothing was judged, so no count of verdicts reads as one
    assert re.search(r"page's (\d+) other comparisons are \*descriptive\*", text)
    # its sanity section says how far its own records meet the calibration (no target-trained rows: failing)
    sanity = text.split("## Sanity: domain gap and headroom")[1].split("\n## ")[0]
    assert "**Calibration** (`docs/calibration.md`): " in sanity
    assert "E→M: within-target measured — no target-trained rows" in sanity
    assert "**Calibration**" not in render_report(fixture_results())  # the first worlds were never calibrated


def test_persons_drawn_afresh_per_seed_are_judged_as_a_nested_design():
    results = fixture_results()
    results["config"]["target_draw"] = "per_seed"
    text = render_report(results)
    assert "the seeds drawn with replacement, each with the persons the benchmark drew for it (not redrawn" in text
    assert "every (pair, seed, person) is a person of its own" in text
    assert "(95 %, seeds drawn, each with its own persons)" in text and "persons and seeds drawn" not in text
    # three persons on two pairs in three seeds: 18 distinct persons where the crossed design has 6
    assert "lower for 18 of 18 persons" in text and "lower for 6 of 6 persons" in render_report(fixture_results())


T_975_2DF = 4.302652729749466  # Student's t, 97.5 % quantile, 2 degrees of freedom (three seeds)


def test_a_cell_with_its_interval_is_the_t_interval_over_seeds_and_one_seed_says_so():
    from alfa.study.bench.stats import Stat

    s = Stat({0: 5.0, 1: 6.0, 2: 7.0})  # mean 6, sample std 1
    half = T_975_2DF / 3**0.5
    assert s.interval == pytest.approx((6.0 - half, 6.0 + half))
    assert s.format() == "6.00 [3.52, 8.48]"
    assert Stat({0: -0.5, 1: 0.5}).format() == "0.00 [−6.35, 6.35]"  # t(0.975, 1) = 12.71, SE = 0.5
    assert Stat({3: 9.5}).interval is None and Stat({3: 9.5}).format() == "9.50 (one seed)"
    # a share in percent: 30 % ± 4.303 · 1 % / √3; a small negative bound is not printed as "−0"
    assert Stat({0: 0.29, 1: 0.30, 2: 0.31}).format_percent() == "30 % [28, 32]"
    assert Stat({0: 0.005, 1: 0.01, 2: 0.015}).format_percent() == "1 % [0, 2]"  # [−0.24, 2.24] %
    assert Stat({0: 0.30}, persons=(0.2, 0.3, 0.4)).format_percent() == "30 % [5, 55] (one seed)"


def test_a_level_of_any_measure_has_its_interval_and_a_described_difference_stays_out_of_the_family():
    from alfa.study.bench.measures import constant_prediction, label_spread
    from alfa.study.bench.stats import described, level

    idx = index_records(fixture_results()["records"])
    # source-only on E→M: 9, 10, 11 per seed over a constant prediction of 10: 90 %, 100 %, 110 %
    spread = level(idx, "source-only", "E→M", label_spread)
    assert spread.values == pytest.approx({0: 0.9, 1: 1.0, 2: 1.1}) and spread.format_percent() == "100 % [75, 125]"
    assert level(idx, "source-only", "E→M", constant_prediction).format() == "10.00 [10.00, 10.00]"
    assert level(idx, "source-only", "E→M", seeds=[1]).format() == "10.00 [7.52, 12.48] (one seed)"  # 9, 10, 11
    assert level(idx, "lora", "E→M", label_spread) is None  # a row without the constant
    d = described(idx, "source-only", "in-domain", ["E→M"], label_spread)
    assert d.mean == pytest.approx(0.75) and not d.judged and not d.clear
    assert d.verdict() == "descriptive (not in the declared family)" and idx.family.made == {}
    # made once per page, either way round: the other order is the same difference, reversed
    assert len(idx.family.outside) == 1 and described(idx, "source-only", "in-domain", ["E→M"], label_spread).se == d.se
    other = described(idx, "in-domain", "source-only", ["E→M"], label_spread)
    assert other.mean == pytest.approx(-0.75) and other.se == d.se and len(idx.family.outside) == 1


def test_the_sanity_table_shows_each_error_with_its_interval_not_its_std():
    text = render_report(fixture_results())
    # E→M: in-domain 3, 3, 3 (no spread); target-trained none; source-only 9, 10, 11 (half-width t · 1 / √3 =
    # 2.48); oracle 2, 2.5, 3 (half-width 1.24)
    row = next(line for line in text.splitlines() if line.startswith("| E→M | 3.00"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1:5] == ["3.00 [3.00, 3.00]", "—", "10.00 [7.52, 12.48]", "2.50 [1.26, 3.74]"]
    assert "Each error: the mean over the row's own seeds (named in the cell where they are not the page's)" in text
    # a row on fewer seeds names them, and so does each gap made on the seeds both rows have
    fewer = dict(MEANS)
    fewer[("in-domain", "E→M")] = (3.0, 4.0)
    row = next(line for line in render_report(fixture_results(fewer)).splitlines() if line.startswith("| E→M | 3.50"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] == "3.50 [−2.85, 9.85] (seeds 0–1)" and cells[5].endswith("(seeds 0–1)")
    one = fixture_results({k: v[:1] for k, v in MEANS.items()})
    # one seed: the interval over that record's persons (three, at the mean and ∓ 1°: 4.30 · 1 / √3 = 2.48)
    assert (
        "| E→M | 3.00 [0.52, 5.48] (one seed) | — | 9.00 [6.52, 11.48] (one seed) | 2.00 [−0.48, 4.48] (one seed) |"
        in (render_report(one))
    )


def test_pnpga_domain_protocol_shows_the_mean_with_its_interval_over_seeds():
    from alfa.study.bench.report_tables import pnpga_domain_table

    def pnpga(seed, after, before):
        domain = {"error_deg": after, "unadapted_deg": before, "per_person": {}}
        return shifted("pnpga", "E→M", seed, after, domain_protocol=domain)

    three = index_records([pnpga(0, 7.0, 9.0), pnpga(1, 8.0, 9.0), pnpga(2, 9.0, 9.0)])
    table = pnpga_domain_table(three)
    assert "| E→M | 3 | 9.00 [9.00, 9.00] | 8.00 [5.52, 10.48] |" in table and "±" not in table
    one = pnpga_domain_table(index_records([pnpga(0, 7.25, 9.5)]))
    assert "| E→M | 1 | 9.50 (one seed) | 7.25 (one seed) |" in one


def _loss_section(text):
    start = text.index("### Self-supervised loss")
    return text[start : text.index("\n#", start + 1)]  # up to the next heading


def test_roll_and_flip_roll_selected_rows_are_rows_of_the_loss_ablation():
    means = {
        **MEANS,
        ("alfa[selected]", "E→M"): (5.5, 6.5, 7.5),
        ("alfa[loss=roll][selected]", "E→M"): (4.5, 5.5, 6.5),
        ("alfa[loss=flip+roll][selected]", "E→M"): (4.0, 4.5, 5.0),
    }
    section = _loss_section(render_report(fixture_results(means)))
    rows = [line.split(" | ")[:4] for line in section.splitlines() if line.startswith("| ") and "---" not in line]
    assert rows[1:] == [
        ["| source-only (truncated base)", "none", "0–2", "10.00 [7.52, 12.48]"],
        ["| Alfa", "flip", "0–2", "6.00 [3.52, 8.48]"],
        ["| Alfa (selected recipe)", "flip", "0–2", "6.50 [4.02, 8.98]"],
        ["| alfa[loss=augment]", "augment", "0–2", "5.00 [2.52, 7.48]"],
        ["| alfa[loss=roll] (selected recipe)", "roll", "0–2", "5.50 [3.02, 7.98]"],
        ["| alfa[loss=flip+roll] (selected recipe)", "flip+roll", "0–2", "4.50 [3.26, 5.74]"],
    ]
    assert "flip symmetry against the other objectives" in section and "roll consistency, flip + roll" in section


def test_a_roll_selected_row_alone_still_gets_the_loss_table_and_alfa_selected_alone_does_not():
    base = {k: v for k, v in MEANS.items() if k[0] != "alfa[loss=augment]"}
    alone = {**base, ("alfa[loss=roll][selected]", "E→M"): (4.5, 5.5, 6.5)}
    section = _loss_section(render_report(fixture_results(alone)))
    assert (
        "| alfa[loss=roll] (selected recipe) | roll | 0–2 | 5.50 [3.02, 7.98] | — | 5.50 [3.02, 7.98] |" not in section
    )
    assert (
        "| alfa[loss=roll] (selected recipe) | roll | 0–2 | 5.50 [3.02, 7.98] | 5.50 [3.02, 7.98] |" in section
    )  # E→M only
    # Alfa's own selected row is a Table 1 row: alone it makes no loss ablation
    only_main = render_report(fixture_results({**base, ("alfa[selected]", "E→M"): (5.5, 6.5, 7.5)}))
    assert "### Self-supervised loss" not in only_main


def test_the_flip_ceiling_reads_its_means_on_the_seeds_every_row_of_it_has():
    """While a run is under way flip-TTA may have fewer seeds than source-only: the ceiling table and its
    sentence then read source-only, flip-TTA and the oracle on their shared seeds and say so (a ratio of
    means over different seeds compares different source models)."""
    from alfa.study.bench.flip_report import ceilings

    means = {
        ("source-only", "E→M"): (9.0, 10.0, 20.0),
        ("flip-tta", "E→M"): (8.0, 9.0),
        ("oracle", "E→M"): (4.0, 5.0, 6.0),
    }
    results = fixture_results(means)
    c = ceilings(index_records(results["records"]))["E→M"]
    assert (c["seeds"], c["source_only"].mean, c["flip_tta"].mean) == (2, 9.5, 8.5)
    assert c["ceiling"] == pytest.approx(1.0) and c["headroom"] == pytest.approx(5.0) and c["ratio"] == 0.2
    text = render_report(results)
    # each with its interval over the two seeds: 9.5 ± t(0.975, 1) · 0.5 = 9.5 ± 6.35
    assert "| E→M | negative | 9.50 [3.15, 15.85] (2 of 3 seeds) | 8.50 [2.15, 14.85] (2 of 3 seeds) |" in text
    # the oracle on fewer seeds (as on the family's later seeds): the ceiling keeps its seeds, the ratio reads the
    # oracle's: (9 − 8) / (9 − 4)
    c = ceilings(index_records(fixture_results({**means, ("oracle", "E→M"): (4.0,)})["records"]))["E→M"]
    assert (c["seeds"], c["ratio_seeds"], c["ceiling"], c["headroom"], c["ratio"]) == (2, 1, 1.0, 5.0, 0.2)
    text = render_report(fixture_results({**means, ("oracle", "E→M"): (4.0,)}))
    assert "| 20 % [20, 20] (one seed) (on the oracle's 1 seed of 0–2) |" in text
    # an oracle on the replicate seeds 3–4 too (docs/flip-premise.md §7.2, amended 2026-12-04): the criterion's
    # ratio still reads seeds 0–2, where it was declared: (9 − 8) / (9 − 4) over seeds 0–1, not over 0–4
    later = {
        ("source-only", "E→M"): (9.0, 9.0, 30.0, 9.0, 9.0),
        ("flip-tta", "E→M"): (8.0, 8.0, 29.0, 5.0, 5.0),
        ("oracle", "E→M"): (4.0, 4.0, 4.0, 8.0, 8.0),
    }
    c = ceilings(index_records(fixture_results(later)["records"]))["E→M"]
    assert (c["seeds"], c["ratio_seeds"]) == (5, 3) and c["ceiling"] == pytest.approx(2.2)
    assert c["ratio"] == pytest.approx((16 - 15) / (16 - 4))
    # with every seed the cells carry no note (the first protocol's pages are unchanged)
    full = {**means, ("flip-tta", "E→M"): (8.0, 9.0, 19.0)}
    assert "| E→M | negative | 13.00 [−2.11, 28.11] | 12.00 [−3.11, 27.11] |" in render_report(fixture_results(full))


def test_a_page_of_a_declared_run_under_way_says_what_it_holds_first():
    from alfa.study.bench.plan import declared_run_progress

    results = fixture_results()
    results["config"]["worlds"] = "v2"
    progress = declared_run_progress("v2", [r["id"] for r in results["records"]])
    text = render_report(results, progress=progress)
    assert text.startswith("# Benchmark results on the worlds `v2`\n")
    header = text.split("## Summary")[0]
    assert f"the results file holds {progress.held} of its {progress.total} records" in header
    assert "**The declared run**" not in render_report(results) and render_report(fixture_results()).startswith(
        "# Benchmark results\n"
    )


def test_a_missing_domain_gap_from_the_gaze360_like_source_says_the_real_data_have_none_either():
    means = {
        ("source-only", "E→M"): (9.0, 10.0, 11.0),
        ("in-domain", "E→M"): (12.0, 12.0, 12.0),  # no gap from E: no such excuse (a calibration condition)
        ("source-only", "G→M"): (7.0, 7.0, 7.0),
        ("in-domain", "G→M"): (8.0, 8.0, 8.0),
    }
    text = " ".join(sanity_verdicts(index_records(fixture_results(means)["records"])))
    # each pair without a gap in the means says its difference with its interval
    assert "NO domain gap in the means on E→M (−2.00 [−4.52, 0.52]), G→M (−1.00 [−1.00, −1.00] clear)." in text
    assert "On G→M the real data have none either: a model trained on Gaze360 (what G stands for)" in text
    assert "On E→M the real data" not in text


def test_the_runs_table_names_each_runs_cpu_and_says_where_it_was_not_recorded():
    runs = [
        {"command": "alfa bench --seeds 0", "started": "t0", "finished": True},  # made before the CPU was kept
        {"command": "alfa bench --seeds 4", "started": "t1", "finished": False, "cpu": "Intel(R) Xeon(R) (family 6)"},
        {
            "command": "alfa bench --seeds 1",
            "started": "t2",
            "cpu": "AMD EPYC (family 25, model 1)",
            "cpu_capability": "AVX2",
        },
    ]
    header, _, old, new, newest = runs_table(runs).splitlines()
    assert header.split("|")[-2].strip() == "CPU"
    assert old.split("|")[-2].strip() == "not recorded"
    assert new.split("|")[-2:] == [" Intel(R) Xeon(R) (family 6) ", ""]
    assert "no (interrupted)" in new
    assert newest.split("|")[-2].strip() == "AMD EPYC (family 25, model 1), AVX2"  # with its instructions, once kept


def test_a_row_of_fewer_seeds_is_set_against_source_only_on_those_seeds():
    # the within-target yardstick on seed 0 only; source-only far higher on seeds 1 and 2: the gap is seed 0's
    means = {("source-only", "E→M"): (9.0, 15.0, 21.0), ("in-domain", "E→M"): (5.0, 5.0, 5.0)}
    records = fixture_results(means)["records"]
    records.append(shifted("target-trained", "E→M", 0, 6.0))
    text = " ".join(sanity_verdicts(index_records(records)))
    assert "is below the source model on the target's scored persons on 1 of 1 pairs" in text
    assert (
        "on 1 of 1 pairs (not judged: one seed), by 3.00° [3.00, 3.00] (one seed) (33 % [26, 46] (one seed) of the "
        "source-only error)" in text
    )  # 9 − 6 over 9; against 15 (all seeds) it read 9.00°


def test_the_share_of_the_headroom_reads_all_three_rows_on_the_same_seeds():
    means = {("source-only", "E→M"): (10.0, 20.0, 30.0), ("oracle", "E→M"): (5.0, 5.0, 5.0)}
    records = fixture_results(means)["records"]
    records.append(shifted("alfa", "E→M", 0, 8.0))  # Alfa on seed 0 only: (10 − 8) / (10 − 5)
    text = " ".join(sanity_verdicts(index_records(records)))
    assert (
        "not clear of zero): E→M 40 % [40, 40] (one seed: 0)." in text
    )  # not (20 − 8) / (20 − 5) = 80 % over mixed seeds


def test_a_pair_whose_source_only_lacks_the_rows_seeds_is_named_not_dropped():
    means = {("source-only", "E→M"): (9.0, 15.0), ("source-only", "E→D"): (9.0, 9.0, 9.0)}
    records = fixture_results(means)["records"]
    records += [shifted("target-trained", pair, 2, 6.0) for pair in ("E→M", "E→D")]  # E→M's source-only: no seed 2
    text = " ".join(sanity_verdicts(index_records(records)))
    assert "on 1 of 1 pairs" in text and "; not compared on E→M, where source-only lacks some of its seeds." in text


def test_the_replayed_reference_protocol_gives_what_its_selection_adds_with_an_interval_over_seeds():
    from alfa.study.bench.replay import replay

    records = []
    for seed, (last, best) in enumerate([(9.0, 7.0), (10.0, 7.5), (11.0, 8.0)]):  # adds 2.0, 2.5, 3.0
        steps = {f"p{i:02d}": [12.0, best, last] for i in range(3)}  # step 0, the best step, the last step
        records.append(record("alfa", "E→M", seed, [last] * 3, per_person_steps=steps, reference_protocol_deg=best))
    table, lines = replay(index_records(records), ["alfa"])
    # 2.5 ± t(0.975, 2) · 0.5 / √3 = 2.5 ± 1.24
    assert "| Alfa | 10.00 [7.52, 12.48] | 10.00 [7.52, 12.48] | 7.50 [6.26, 8.74] | 2.50 [1.26, 3.74] |" in table
    assert (
        "reports 2.50° [1.26, 3.74] (Alfa) less error than the last step on the same images over the 1 rows" in lines[0]
    )
    assert lines[0].endswith(
        "; for Alfa 2.50° [1.26, 3.74]. That gain is made by test-label selection, not by any method."
    )
    assert lines[1].startswith(
        "On the same images the base before personalization (step 0) scores 12.00° [12.00, 12.00]"
    )


def test_an_ablation_curve_is_drawn_on_the_seeds_every_setting_has():
    """The default setting's row is run by every seed, the others by one: the line would otherwise move by the seeds
    a point has, not by its setting."""
    from alfa.study.bench.report_figures import _curve
    from alfa.study.bench.stats import index_records

    records = [record("alfa", "E→M", s, [10.0 + 5 * s, 11.0 + 5 * s]) for s in (0, 1, 2)]
    records += [record("alfa[H=1]", "E→M", 0, [20.0, 21.0]), record("alfa[H=1]", "E→M", 1, [22.0, 23.0])]
    layout = [{"label": "alfa[H=1]", "value": 1}, {"label": "alfa", "value": 8}]
    points, seeds = _curve(index_records(records), layout, "alfa", ["E→M"])
    assert [(x, mean) for x, mean, _ in points] == [(1.0, 21.5), (8.0, 13.0)]  # seeds 0 and 1 both, not seed 2
    assert seeds == (0, 1)


def test_an_ablation_figures_caption_names_the_seeds_its_lines_are_on(tmp_path):
    """The figure's point of the default setting differed from its table cell, with no word of why: the line is on
    the seeds every setting has, fewer than the default row's."""
    results = fixture_results()
    (tmp_path / "bench").mkdir()
    path = tmp_path / "bench" / "results.json"
    for drop_seed_2 in (False, True):
        if drop_seed_2:
            results["records"] = [
                r for r in results["records"] if not (r["method"].startswith("alfa[H=") and r["seed"] == 2)
            ]
        path.write_text(json.dumps(results))
        with plotted_data_only():  # the caption, not the drawing
            text = build_report(path, tmp_path / "docs" / "results.md").read_text()
        heads = text[text.index("### Heads H") :]
        caption = next(line for line in heads.splitlines() if line.startswith("*Error against the setting"))
        seeds = "seeds 0–1" if drop_seed_2 else "seeds 0–2"
        assert f"every setting on the line has ({seeds}), with its 95 % interval over them" in caption
        assert ("so its point can differ from the table's cell" in caption) == drop_seed_2


def test_an_ablation_whose_settings_share_no_seed_says_its_figure_is_not_drawn(tmp_path):
    results = fixture_results()
    for r in results["records"]:  # the other head counts, run only on a seed the default setting was not
        if r["method"].startswith("alfa[H="):
            r["seed"], r["id"] = 7, r["id"].replace(f"seed{r['seed']}", "seed7")
    (tmp_path / "bench").mkdir()
    path = tmp_path / "bench" / "results.json"
    path.write_text(json.dumps(results))
    text = build_report(path, tmp_path / "docs" / "results.md").read_text()
    heads = text[text.index("### Heads H") :]
    heads = heads[: heads.index("\n### ")]
    assert "No figure yet: on no pair do two or more of its settings share a seed" in heads
    assert not (tmp_path / "docs" / "figures" / "results" / "error_vs_heads.png").exists()
