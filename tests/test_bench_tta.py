"""Issue 26's label-free TTA rows in the benchmark (roll-TTA and flip × roll TTA, scored like flip-TTA), the orbit
decomposition of the source-only records (what a flip, a roll, both and neither see of the source model's error),
the report's rows and tables for them, and the presets that plan them (the standard preset on the v2 worlds only)."""

import hashlib

import pytest
from test_bench import tiny
from test_report import fixture_results, shifted
from tiny_models import TinyGazeNet  # noqa: F401  (registers tiny_gaze_net)

from alfa.gaze.evaluate import person_errors
from alfa.gaze.orbit import ORBIT_STEPS, person_orbit_parts
from alfa.gaze.tta import tta_kind
from alfa.study.bench.config import BenchConfig
from alfa.study.bench.methods import PAIRS, TTA_ROWS
from alfa.study.bench.plan import plan_records
from alfa.study.bench.report_page import render_report
from alfa.study.bench.results import load_results
from alfa.study.bench.runner import run_bench
from alfa.study.bench.session import Session
from alfa.study.bench.stats import Stat, diff, index_records
from alfa.study.bench.tta_report import orbit_table, tta_table

ROWS = ("source-only", "flip-tta", "roll-tta", "group-tta")
PARTS = ("neither", "flip_only", "roll_only", "both", "cross")


def test_only_the_standard_preset_on_the_v2_worlds_plans_the_tta_rows():
    labels = set(TTA_ROWS)
    assert labels == {"roll-tta", "group-tta"}
    for preset in (
        BenchConfig.first_standard(),
        BenchConfig.quick(),
        BenchConfig.smoke(),
        BenchConfig.full(),
        BenchConfig.standard(worlds="v1"),
    ):
        assert not {p.variant.label for p in plan_records(preset)} & labels, preset.preset
    # the plan the first records ran, as it was before these rows existed (ids in run order)
    first = [p.id for p in plan_records(BenchConfig.first_standard())]
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
        assert record["trainable_params"] == 0 and "orbit" not in record
    # a flip-symmetric prediction leaves nothing for a flip to see; roll-TTA is no such prediction
    assert records["group-tta|E→M|seed0"]["flip"]["visible_share"] == pytest.approx(0.0, abs=1e-6)
    assert records["roll-tta|E→M|seed0"]["per_person"] != source_only["per_person"]


@pytest.mark.slow
def test_a_source_only_record_splits_its_error_under_the_flip_and_the_roll(tta_bench):
    out, config, _, records = tta_bench
    record = records["source-only|E→M|seed0"]
    per_person = record["per_person_orbit"]
    assert set(per_person) == set(record["per_person"])
    for person, parts in per_person.items():
        assert sum(parts[k] for k in PARTS) == pytest.approx(1.0, abs=1e-9)
        assert parts["error"] == pytest.approx(record["per_person"][person], rel=1e-5)  # the same images
        assert parts["roll_steps"] == ORBIT_STEPS
    for key in (*PARTS, "flip_seen", "roll_seen", "mse"):
        assert record["orbit"][key] == pytest.approx(sum(p[key] for p in per_person.values()) / len(per_person))
    assert sum(record["orbit"][k] for k in PARTS) == pytest.approx(1.0, abs=1e-9)
    # the library's decomposition of the record's base on the record's persons and scored images
    session = Session(config, out, out / "cache", progress=False)
    base = session.base(session.build("E", 0), "truncated")
    data = session.target("M", 0).data
    direct = person_orbit_parts(base, data, data.persons(), config.personalize.n_adapt)
    assert per_person == {p: pytest.approx(parts.to_dict(), rel=1e-5) for p, parts in direct.items()}


@pytest.mark.slow
def test_the_report_of_a_run_shows_the_tta_rows_and_the_orbit_table(tta_bench):
    _, _, results, _ = tta_bench
    text = render_report(results)
    assert "Label-free test-time augmentation: the flip, the roll and both" in text
    for name, passes in (("flip-TTA", 2), ("roll-TTA", 3), ("flip×roll TTA", 6)):
        assert f"| {name} (no training) | {passes} | " in text  # the TTA table, with the passes
    table1 = text.split("## Table 1")[1].split("\n## ")[0]
    assert "| roll-TTA (no training) |" in table1 and "| flip×roll TTA (no training) |" in table1
    costs = text.split("## Costs")[1].split("\n## ")[0]
    assert "| roll-TTA (no training) |" in costs
    assert "| a flip sees (%) | a roll sees (%) | both see (%) |" in text and "| E→M | 1 of 1 |" in text


def _orbit(flip_seen: float) -> dict[str, float]:
    parts = {"neither": 0.1, "flip_only": 0.2, "roll_only": 0.3, "both": 0.35, "cross": 0.05}
    return {"error": 9.0, "mse": 100.0, "flip_seen": flip_seen, "roll_seen": 0.7, **parts, "roll_steps": 45}


def test_the_report_tables_from_hand_written_records():
    results = fixture_results()
    records = results["records"]
    for seed, record in enumerate(r for r in records if r["method"] == "source-only" and r["pair"] == "E→M"):
        if seed < 2:  # the third seed's record was made before the measure: shown as missing, not recomputed
            record["orbit"] = _orbit(0.5 + 0.1 * seed)
    for seed in range(3):
        for pair, shift in (("E→M", 0.0), ("E→D", 0.5)):
            records.append(shifted("flip-tta", pair, seed, 8.5 + shift + seed, kind="flip-tta"))  # stored no passes
            tta = {"kind": "flip+roll", "passes": 6}
            records.append(shifted("group-tta", pair, seed, 8.0 + shift + seed, kind="group-tta", tta=tta))
    idx = index_records(records)
    orbit = orbit_table(idx)
    assert "| E→M | 2 of 3 | 100.00 | " + Stat({0: 50.0, 1: 60.0}).format_interval() + " | " in orbit
    assert "| E→D | 0 of 3 | — | — | — |" in orbit
    tta = tta_table(idx)
    assert "| flip-TTA (no training) | 2 | — | " in tta  # a flip-TTA record without passes: its kind's 2
    d = diff(idx, "group-tta", "source-only", ["E→M"])
    assert d is not None and f"; {d.compact()} |" in tta and "| flip×roll TTA (no training) | 6 | " in tta
    assert "roll-TTA" not in tta  # a row without records has no line
    # without the new rows and the new measure: neither table, and the page is the page without them
    plain = fixture_results()
    assert tta_table(index_records(plain["records"])) is None and orbit_table(index_records(plain["records"])) is None
    assert "Label-free test-time augmentation" not in render_report(plain)
    assert "Label-free test-time augmentation" in render_report(results)
