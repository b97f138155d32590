"""Issue 26's label-free TTA rows in the benchmark (roll-TTA and flip × roll TTA, scored like flip-TTA), the split of
a source-only record's error into one constant offset per person and scatter (what a roll sees that a flip cannot),
the report's rows and tables for them, and the presets that plan them (the standard preset on the v2 worlds only)."""

import hashlib
import math

import pytest
from test_bench import tiny
from test_report import fixture_results, shifted
from tiny_models import TinyGazeNet  # noqa: F401  (registers tiny_gaze_net)

from alfa.gaze.evaluate import person_errors, person_gaze_errors
from alfa.gaze.tta import tta_kind
from alfa.study.bench.config import BenchConfig
from alfa.study.bench.methods import PAIRS, TTA_ROWS
from alfa.study.bench.plan import plan_records
from alfa.study.bench.record import Record
from alfa.study.bench.report_page import render_report
from alfa.study.bench.results import load_results
from alfa.study.bench.runner import run_bench
from alfa.study.bench.session import Session
from alfa.study.bench.stats import Stat, diff, index_records
from alfa.study.bench.tta_report import label_free_verdicts, offset_shares, offset_table, tta_table

ROWS = ("source-only", "flip-tta", "roll-tta", "group-tta")


def test_of_the_claimed_presets_only_the_standard_one_on_the_v2_worlds_plans_the_tta_rows():
    labels = set(TTA_ROWS)
    assert labels == {"roll-tta", "group-tta"}
    # the plan the first records ran, as it was before these rows existed (ids in run order)
    first_plans = plan_records(BenchConfig.first_standard())
    assert not {p.variant.label for p in first_plans} & labels
    for preset in (BenchConfig.quick(), BenchConfig.full(), BenchConfig.standard(worlds="v1")):
        assert not {p.variant.label for p in plan_records(preset)} & labels, preset.preset
    # the smoke check (no claims) runs every row kind once: these too
    assert {p.variant.label for p in plan_records(BenchConfig.smoke())} >= labels
    first = [p.id for p in first_plans]
    assert len(first) == 1404
    assert hashlib.sha256("\n".join(first).encode()).hexdigest()[:16] == "ecd92453bf95a344"
    standard = BenchConfig.standard()
    assert standard.methods[:4] == ROWS  # right after flip-TTA
    plans = plan_records(standard)
    ids = {p.id: p for p in plans}
    for label in labels:
        for pair in PAIRS:
            for seed in standard.seeds:
                assert ids[f"{label}|{pair}|seed{seed}"].variant.kind == label
    # everything else the standard preset plans is what it planned without them
    without = BenchConfig.standard(methods=tuple(m for m in standard.methods if m not in labels))
    assert [p.id for p in plans if p.variant.label not in labels] == [p.id for p in plan_records(without)]


@pytest.fixture(scope="module")
def tta_bench(tmp_path_factory):
    out = tmp_path_factory.mktemp("ttabench")
    config = tiny(methods=ROWS)
    summary = run_bench(config, out, progress=False)
    assert not summary.errors, summary.errors
    results = load_results(out)
    return out, config, results, {r["id"]: r for r in results["records"]}


@pytest.mark.slow
def test_the_tta_rows_are_the_kinds_of_alfa_gaze_tta_scored_like_flip_tta(tta_bench):
    out, config, _, records = tta_bench
    session = Session(config, out, out / "cache", progress=False)
    base = session.base(session.build("E", 0), "truncated")
    data = session.target("M", 0).data
    n_adapt = config.personalize.n_adapt
    source_only = records["source-only|E→M|seed0"]
    for label, kind, passes in (("flip-tta", "flip", 2), ("roll-tta", "roll", 3), ("group-tta", "flip+roll", 6)):
        record = records[f"{label}|E→M|seed0"]
        assert record["kind"] == label and record["tta"] == {"kind": kind, "passes": passes}
        assert passes == tta_kind(kind).passes
        # the same persons as source-only, each the error of the base wrapped in the kind, scored directly
        assert set(record["per_person"]) == set(source_only["per_person"])
        direct = person_errors(tta_kind(kind).wrap(base), data, data.persons(), n_adapt)
        assert record["per_person"] == pytest.approx(direct, abs=1e-6)
        assert record["latency_ms"] is not None and record["base_latency_ms"] is not None
        assert record["trainable_params"] == 0
    # a flip-symmetric prediction leaves nothing for a flip to see; roll-TTA is no such prediction
    assert records["group-tta|E→M|seed0"]["flip"]["visible_share"] == pytest.approx(0.0, abs=1e-6)
    assert records["roll-tta|E→M|seed0"]["per_person"] != source_only["per_person"]


@pytest.mark.slow
def test_a_source_only_record_splits_its_error_into_offsets_and_scatter(tta_bench):
    out, config, _, records = tta_bench
    record = records["source-only|E→M|seed0"]
    # the parts are the library's, of the record's base on the record's persons and scored images
    session = Session(config, out, out / "cache", progress=False)
    base = session.base(session.build("E", 0), "truncated")
    data = session.target("M", 0).data
    direct = person_gaze_errors(base, data, data.persons(), config.personalize.n_adapt)
    assert record["per_person_parts"] == {p: pytest.approx(e.parts(), rel=1e-5) for p, e in direct.items()}
    shares = offset_shares(Record.from_dict(record))
    assert shares is not None and shares["yaw_offset"] + shares["pitch_offset"] + shares["scatter"] == pytest.approx(1)
    expected = sum(e.pitch_bias**2 / (e.yaw_ms + e.pitch_ms) for e in direct.values()) / len(direct)
    assert shares["pitch_offset"] == pytest.approx(expected, rel=1e-5)
    assert 0 < shares["scatter"] <= 1  # a mean square is never below its bias squared


def test_offset_shares_read_a_pure_offset_and_pure_scatter():
    def source_only(parts):
        return Record.from_dict({**shifted("source-only", "E→M", 0, 9.0, spread=(0.0,)), "per_person_parts": parts})

    pitch = {"p00": {"yaw": 0.0, "pitch": 3.0, "yaw_bias": 0.0, "pitch_bias": -3.0, "yaw_ms": 0.0, "pitch_ms": 9.0}}
    assert offset_shares(source_only(pitch)) == {"ms": 9.0, "yaw_offset": 0.0, "pitch_offset": 1.0, "scatter": 0.0}
    scatter = {"p00": {"yaw": 2.0, "pitch": 1.0, "yaw_bias": 0.0, "pitch_bias": 0.0, "yaw_ms": 4.0, "pitch_ms": 1.0}}
    assert offset_shares(source_only(scatter))["scatter"] == 1.0
    before = {"p00": {"yaw": 2.0, "pitch": 1.0, "yaw_bias": 0.0, "pitch_bias": 0.0}}  # made before the mean squares
    assert offset_shares(source_only(before)) is None
    assert offset_shares(source_only({**pitch, **{"p01": before["p00"]}})) is None  # one person without them
    # a person without error has no shares: the others' are the record's, and the mean square counts it
    exact = {"p01": {"yaw": 0.0, "pitch": 0.0, "yaw_bias": 0.0, "pitch_bias": 0.0, "yaw_ms": 0.0, "pitch_ms": 0.0}}
    assert offset_shares(source_only({**pitch, **exact})) == {
        "ms": 4.5,
        "yaw_offset": 0.0,
        "pitch_offset": 1.0,
        "scatter": 0.0,
    }
    nothing = offset_shares(source_only(exact))
    assert nothing is not None and nothing["ms"] == 0.0 and math.isnan(nothing["pitch_offset"])


@pytest.mark.slow
def test_the_report_of_a_run_shows_the_tta_rows_and_the_offset_table(tta_bench):
    _, _, results, _ = tta_bench
    text = render_report(results)
    assert "Label-free test-time augmentation: the flip, the roll and both" in text
    for name, passes in (("flip-TTA", 2), ("roll-TTA", 3), ("flip×roll TTA", 6)):
        assert f"| {name} (no training) | {passes} | " in text  # the TTA table, with the passes
    table1 = text.split("## Table 1")[1].split("\n## ")[0]
    assert "| roll-TTA (no training) |" in table1 and "| flip×roll TTA (no training) |" in table1
    costs = text.split("## Costs")[1].split("\n## ")[0]
    assert "| roll-TTA (no training) |" in costs
    assert "| a flip sees (%) | one yaw offset per person: a flip and a roll see it (%) |" in text
    assert "| E→M | 1 of 1 |" in text


def _offset_parts(pitch_bias: float) -> dict[str, dict[str, float]]:
    """Two persons with (yaw, pitch) mean square 10 + 90 deg², a yaw bias of 5° (25 %) and the given pitch bias."""
    part = {"yaw": 3.0, "pitch": 9.0, "yaw_bias": 5.0, "pitch_bias": pitch_bias, "yaw_ms": 10.0, "pitch_ms": 90.0}
    return {p: dict(part) for p in ("p00", "p01", "p02")}


def test_the_report_tables_from_hand_written_records():
    results = fixture_results()
    records = results["records"]
    for seed, record in enumerate(r for r in records if r["method"] == "source-only" and r["pair"] == "E→M"):
        if seed < 2:  # the third seed's record was made before the measure: shown as missing, not recomputed
            record["per_person_parts"] = _offset_parts(5.0 + 1.0 * seed)  # pitch offset 25 %, 36 %
            record["flip"] = {"visible_share": 0.1 + 0.1 * seed}
    for seed in range(3):
        for pair, shift in (("E→M", 0.0), ("E→D", 0.5)):
            records.append(shifted("flip-tta", pair, seed, 8.5 + shift + seed, kind="flip-tta"))  # stored no passes
            tta = {"kind": "flip+roll", "passes": 6}
            records.append(shifted("group-tta", pair, seed, 8.0 + shift + seed, kind="group-tta", tta=tta))
    idx = index_records(records)
    offsets = offset_table(idx)
    pct = [Stat({0: 10.0, 1: 20.0}), Stat({0: 25.0, 1: 25.0}), Stat({0: 25.0, 1: 36.0}), Stat({0: 50.0, 1: 39.0})]
    assert "| E→M | 2 of 3 | 100.00 [100.00, 100.00] | " + " | ".join(s.format() for s in pct) + " |" in offsets
    assert "| E→D | 0 of 3 | — | — | — | — | — |" in offsets
    tta = tta_table(idx)
    assert "| flip-TTA (no training) | 2 | — | " in tta  # a flip-TTA record without passes: its kind's 2
    d = diff(idx, "group-tta", "source-only", ["E→M"])
    assert d is not None and f"; {d.compact()} |" in tta and "| flip×roll TTA (no training) | 6 | " in tta
    assert "roll-TTA" not in tta  # a row without records has no line
    # without the new rows and the new measure: neither table, and the page is the page without them
    plain = fixture_results()
    assert tta_table(index_records(plain["records"])) is None and offset_table(index_records(plain["records"])) is None
    assert "Label-free test-time augmentation" not in render_report(plain)
    assert "Label-free test-time augmentation" in render_report(results)


def test_the_label_free_sentences_rank_rows_of_every_seed_and_name_the_rest():
    """Issue 26's sentences: the best label-free row per pair among those with every seed (a row of fewer seeds
    is named, never ranked: its mean is over other seeds), whether a roll sees what a flip cannot, PnP-GA."""
    results = fixture_results()
    records = results["records"]
    for seed in range(3):
        for pair, shift in (("E→M", 0.0), ("E→D", 0.5)):
            records.append(shifted("flip-tta", pair, seed, 8.5 + shift + seed, kind="flip-tta"))
            tta = {"kind": "flip+roll", "passes": 6}
            records.append(shifted("group-tta", pair, seed, 8.0 + shift + seed, kind="group-tta", tta=tta))
        records.append(shifted("roll-tta", "E→M", seed, 8.2 + seed, kind="roll-tta", tta={"passes": 3}))
        records.append(shifted("pnpga", "E→D", seed, 7.0 + seed))
    records.append(shifted("ruda", "E→M", 0, 1.0))  # far the lowest, on one seed only
    idx = index_records(records)
    lines = label_free_verdicts(idx)
    em, ed = lines[0], lines[1]
    assert em.startswith(
        "On E→M, of the 3 label-free rows with all 3 seeds, flip×roll TTA (no training) has the lowest mean error "
        "(9.00° [6.52, 11.48], 6 forward passes per image); flip×roll TTA (no training) − source-only = −1.00° ["
    )
    assert "flip×roll TTA (no training) − roll-TTA (no training) (the next) = −0.20° [" in em
    assert em.endswith("Not yet on every seed, so not ranked: RUDA (rotation consistency, whole network).")
    assert (
        ed.startswith("On E→D, of the 3 label-free rows with all 3 seeds, PnP-GA (")
        and "(8.00° [5.52, 10.48], 1 forward pass " in ed
    )
    assert lines[2].startswith(
        "Does a roll see error a flip cannot? Roll-TTA's mean error is below flip-TTA's on 1 of 1"
    )
    assert "lies below zero on E→M (E→M −0.30 [−0.30, −0.30]" in lines[2]
    assert (
        lines[-1].startswith("PnP-GA − flip-TTA (no training), on the same persons and images")
        and "E→D −2.00° [" in lines[-1]
    )
    assert not any(line.startswith("PnP-GA − Alfa") for line in lines)  # no selected Alfa row to compare with
    assert label_free_verdicts(index_records(fixture_results()["records"])) == []  # a page without TTA rows: none
    # Alfa's selected and default recipes are label-free rows too; PnP-GA is compared with the selected one
    for seed in range(3):
        records.append(shifted("alfa[selected]", "E→D", seed, 7.5 + seed))
        records.append(shifted("alfa[default]", "E→D", seed, 6.0 + seed))
    records.append(shifted("group-tta", "G→M", 0, 5.0, kind="group-tta", tta={"passes": 6}))  # no source-only
    lines = label_free_verdicts(index_records(records))
    assert lines[1].startswith("On E→D, of the 5 label-free rows with all 3 seeds, Alfa (shipped default recipe) has")
    assert "(7.00° [4.52, 9.48], 1 forward pass per image)" in lines[1]  # 6, 7, 8 over the seeds
    assert "On G→M no label-free row is ranked (no source-only record): flip×roll TTA (no training)." in lines
    alfa = next(line for line in lines if line.startswith("PnP-GA − Alfa (selected recipe)"))
    assert "E→D −0.50° [−0.50, −0.50]" in alfa
    without = [r for r in records if r["method"] != "pnpga"]
    assert label_free_verdicts(index_records(without))[-1] == (
        "This page has no PnP-GA records: no comparison with Alfa or flip-TTA."
    )
