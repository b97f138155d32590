"""docs/flip-premise.md §7.4's constructed positive control S→R: planned with its three rows only, on the second
worlds only, in the declared run's seeds 0–2 and never the family's; shown in a section of its own, never pooled."""

from __future__ import annotations

import dataclasses

import pytest
from bench_records import results_of, row

from alfa.study.bench.config import BenchConfig
from alfa.study.bench.flip_report import constructed_control_section
from alfa.study.bench.methods import CONSTRUCTED_CONTROL_ROWS, FAMILY_SEEDS, PAIRS
from alfa.study.bench.plan import declared_run, plan_records
from alfa.study.bench.record import as_records
from alfa.study.bench.report_page import render_report
from alfa.study.bench.stats import Comparisons, design_of, index_records


def test_the_declared_run_has_only_its_three_rows_on_it_on_seeds_0_to_2_and_only_on_the_second_worlds():
    standard = BenchConfig.standard()
    assert "S→R" in standard.pairs and "S→R" not in standard.ablation_pairs
    # the declared run (the standard preset with every row, and the family's seeds): nothing else on S→R, and
    # none of the family's seeds
    on_r = [p for p in declared_run("v2") if p.pair == "S→R"]
    assert sorted(p.id for p in on_r) == sorted(f"{m}|S→R|seed{s}" for m in CONSTRUCTED_CONTROL_ROWS for s in (0, 1, 2))
    assert not set(FAMILY_SEEDS) & {p.seed for p in on_r}
    # §7.1's command names no pairs: the family's seeds still get nothing on S→R
    family = dataclasses.replace(standard, seeds=FAMILY_SEEDS, methods=("source-only", "flip-tta", "alfa"))
    assert {p.pair for p in plan_records(family)} - {"E→stand-in", "G→stand-in", "S→stand-in"} == set(PAIRS)
    # alone, it plans no recipe selection on the studio's stand-in (nothing on S→R reads one)
    alone = dataclasses.replace(standard, pairs=("S→R",), seeds=(0,))
    assert [p.id for p in plan_records(alone)] == [f"{m}|S→R|seed0" for m in CONSTRUCTED_CONTROL_ROWS]
    assert "S→R" not in BenchConfig.first_standard().pairs and "S→R" not in BenchConfig.standard(worlds="v1").pairs
    with pytest.raises(ValueError, match="the constructed control S→R exists on the second worlds only"):
        BenchConfig.first_standard(pairs=("S→R",)).validate()
    with pytest.raises(ValueError, match="the constructed control S→R runs only source-only, flip-tta, oracle"):
        dataclasses.replace(standard, pairs=("S→R",), methods=("alfa",)).validate()
    with pytest.raises(ValueError, match="unknown pair 'S→R' for the ablations or the figure"):
        dataclasses.replace(standard, ablation_pairs=("S→R",)).validate()


def _results(r_flip: float):
    """S→W and S→R with source-only at 14, the oracle at 6 and flip-TTA at 13.5 (S→W) and ``r_flip`` (S→R)."""
    config = dataclasses.replace(
        BenchConfig.standard(), methods=("source-only", "flip-tta", "oracle"), selected_methods=(), default_methods=()
    )
    results = results_of(config, (), seeds=())
    means = {"S→W": (14.0, 13.5, 6.0), "S→R": (14.0, r_flip, 6.0)}
    results["records"] = [
        row(m, s, mean + s, pair=pair)
        for pair, values in means.items()
        for s in (0, 1, 2)
        for m, mean in zip(("source-only", "flip-tta", "oracle"), values)
    ]
    return results


def test_the_page_shows_it_apart_with_its_verdict_and_pools_nothing_of_it():
    text = render_report(_results(r_flip=9.0))
    section = text[text.index("### The constructed positive control") :]
    section = section[: section.index("\n## ")] if "\n## " in section else section
    control = next(line for line in section.splitlines() if line.startswith("| S→R |"))
    assert "constructed positive" in control and "| holds |" in control  # a ceiling of 5° against a headroom of 8°
    assert "62 %" in control  # 5 / 8, as the page rounds it
    assert "the positive-control criterion (≥ 33% of the headroom, on the means) holds" in section
    # nowhere else: not in the sanity table, the flip table of the pairs, the pooled rows or the family (the
    # header only counts its records among the file's)
    header, body = text.split("## Summary", 1)
    assert "9 on the constructed positive control S→R" in header and header.count("S→R") == 1
    assert body.count("S→R") == section.count("S→R")
    assert "| S→W |" in text and "| S→W |" not in section
    # the check can fail: a ceiling of 1° against 8° (the section alone, as the page builds it)
    failing_results = _results(r_flip=13.0)
    records = [r for r in as_records(failing_results["records"]) if r.pair == "S→R"]
    family = Comparisons(persons=design_of(failing_results), declared=frozenset())
    failing = "\n".join(constructed_control_section(index_records(records, family)))
    assert "| **fails** |" in failing and "FAILS" in failing
    assert constructed_control_section(index_records([], family)) == []  # no record, no section
