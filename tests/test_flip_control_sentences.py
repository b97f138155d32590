"""The flip pages' controls sentences (flip_report._ceiling_sentences): the oracle headroom names its seeds where
they are not the page's, and "no finite interval: the headroom is not clear of zero" is said only of a share whose
interval is unbounded, not appended to every sentence. Small hand-made records, the exact sentences."""

from __future__ import annotations

import dataclasses

from bench_records import results_of, row

from alfa.study.bench.config import BenchConfig
from alfa.study.bench.flip_report import _ceiling_sentences, ceilings
from alfa.study.bench.record import as_records
from alfa.study.bench.stats import Comparisons, design_of, index_records

ROWS = ("source-only", "flip-tta", "oracle")


def _sentences(means: dict[str, dict[int, float]], pair: str) -> list[str]:
    """The controls sentences of records of ``pair`` at ``means`` (row → seed → mean; two persons at it ∓ 1°)."""
    config = dataclasses.replace(BenchConfig.standard(), methods=ROWS, selected_methods=(), default_methods=())
    results = results_of(config, (), seeds=())
    results["records"] = [row(m, s, v, pair=pair) for m, per_seed in means.items() for s, v in per_seed.items()]
    idx = index_records(as_records(results["records"]), Comparisons(persons=design_of(results), declared=frozenset()))
    return _ceiling_sentences(idx, ceilings(idx))


def test_a_share_with_a_finite_interval_names_the_headroom_seeds_and_no_unbounded_interval():
    # source-only and flip-TTA on seeds 0–5, the oracle on 0–2 only: the headroom and the share are of seeds 0–2;
    # the share (14.17 − 10.17) / (14.17 − 6.00) = 49 %, its interval finite (the headroom is clear of zero)
    means = {
        "source-only": {0: 14.0, 1: 15.0, 2: 13.5, 3: 14.5, 4: 14.2, 5: 13.8},
        "flip-tta": {0: 10.0, 1: 11.5, 2: 9.0, 3: 10.5, 4: 10.1, 5: 9.9},
        "oracle": {0: 6.0, 1: 6.5, 2: 5.5},
    }
    assert _sentences(means, "S→W") == [
        "On S→W (positive control) a flip sees — of the source model's mean-square error; flip-TTA − source-only = "
        "−4.00° [−4.34, −3.66] (95 %, persons and seeds drawn); descriptive (not in the declared family); lower for "
        "2 of 2 persons (14.17° [13.61, 14.72] → 10.17° [9.31, 11.03]), against an oracle headroom (source-only − "
        "oracle) of +8.17 [7.45, 8.88]° (seeds 0–2) (ratio of the means 49 % [31, 70] (on the oracle's 3 seeds of "
        "0–2)): the positive-control criterion (≥ 33% of the headroom, on the means) holds."
    ]


def test_a_share_whose_headroom_is_not_clear_of_zero_says_it_has_no_finite_interval():
    # every row on seeds 0–2 (no seeds named); the headroom 0.17° [−3.42, 3.76] straddles zero: the share
    # (10.00 − 9.73) / (10.00 − 9.83) = 160 % has no finite interval, and the sentence says why
    means = {
        "source-only": {0: 10.0, 1: 11.0, 2: 9.0},
        "flip-tta": {0: 9.5, 1: 10.8, 2: 8.9},
        "oracle": {0: 9.0, 1: 12.5, 2: 8.0},
    }
    assert _sentences(means, "E→M") == [
        "On E→M (negative control) a flip sees — of the source model's mean-square error; flip-TTA − source-only = "
        "−0.27° [−0.78, 0.24] (95 %, persons and seeds drawn); descriptive (not in the declared family); lower for "
        "2 of 2 persons (10.00° [7.52, 12.48] → 9.73° [7.32, 12.15]), against an oracle headroom (source-only − "
        "oracle) of +0.17 [−3.42, 3.76]° (ratio of the means 160 % (no finite interval: the headroom is not clear "
        "of zero))."
    ]
