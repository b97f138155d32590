"""The plane toy's intervals over seeds, its record and the sections of docs/crate.md rendered from it."""

import numpy as np
import pytest

from alfa.study.crate.toy import ToyConfig, ToyRun, format_interval, interval, read_panel, run_toy, seed_values
from alfa.study.crate.toy_report import (
    load_record,
    runs_from_record,
    toy_record,
    toy_section,
    write_record,
)
from alfa.study.sections import section_marks, with_section

# Student's t, two-sided 95 %: t(0.975; 1) = 12.7062047, t(0.975; 2) = 4.3026527 (any printed table)
T1, T2 = 12.7062047, 4.3026527


def test_interval_is_the_student_t_interval_of_the_mean_over_seeds():
    # three seeds 1, 2, 3: mean 2, standard deviation 1, half-width 4.3026527 / √3 = 2.484138
    mean, low, high = interval([[1.0], [2.0], [3.0]])[:, 0]
    assert mean == pytest.approx(2.0)
    assert (low, high) == pytest.approx((2.0 - T2 / 3**0.5, 2.0 + T2 / 3**0.5), rel=1e-6)
    assert format_interval(mean, low, high) == "2.000 [-0.484, 4.484]"
    assert format_interval(mean, low, high, ".1f") == "2.0 [-0.5, 4.5]"
    # the same value in every seed: an interval of width 0; one seed: no interval; no value at all: "-"
    assert format_interval(*interval([[0.25], [0.25]])[:, 0], ".2f") == "0.25 [0.25, 0.25]"
    assert format_interval(*interval([[0.25]])[:, 0]) == "0.250"
    assert format_interval(float("nan"), float("nan"), float("nan")) == "-"
    assert format_interval(-1e-9, -2e-9, 1e-9) == "0.000 [0.000, 0.000]"  # no "-0.000" from rounding noise


def _layer(t1: float, t2: float, rc: float, wrong: int) -> dict:
    return {"thickness": [t1, t2], "R": 2.0, "Rc": rc, "dR": 2.0 - rc, "misassigned": wrong, "one_axis_share": 0.0}


def _hand_made() -> list[ToyRun]:
    """Panel (b) on two seeds, two layers, with numbers chosen by hand."""
    labels = np.repeat([0, 1], 20)
    tokens = [np.zeros((2, 40)), np.ones((2, 40))]
    return [
        ToyRun(
            "b", "b", 1, 1.0, 0, 0.5, None, None, [_layer(0.2, 0.3, 1.8, 2), _layer(0.1, 0.1, 1.5, 1)], tokens, labels
        ),
        ToyRun("b", "b", 1, 1.0, 1, 0.5, None, None, [_layer(0.4, 0.3, 1.6, 4), _layer(0.1, 0.2, 1.5, 1)], [], labels),
    ]


def test_a_hand_made_record_renders_each_mean_with_its_interval(tmp_path):
    record = toy_record(_hand_made(), ToyConfig(layers=1), "alfa crate toy --seeds 2 --panels b --layers 1")
    write_record(tmp_path / "toy.json", record)
    assert load_record(tmp_path / "toy.json") == record
    text = toy_section(record, data="docs/data/crate-toy/toy.json", figure="figures/toy.png", alt="the toy")
    assert "$ alfa crate toy --seeds 2 --panels b --layers 1\n$ alfa pages --write" in text
    assert "2 seeds (0–1)" in text and "95 % interval (Student's t over the seeds, 1 degree of freedom" in text
    half = T1 * 0.02**0.5 / 2**0.5  # thickness 1 at layer 0: 0.2 and 0.4, sd √0.02, n 2
    assert half == pytest.approx(1.27062, rel=1e-5)
    # layer 0: thickness 1 0.3 ± 1.271, thickness 2 the same in both seeds, R_c 1.7 ± 1.271 (sd 0.1414),
    # ΔR 0.3 ± 1.271, misassigned 3 ± 12.7 (sd 1.414)
    assert (
        "| 0 | 0.300 [-0.971, 1.571] | 0.300 [0.300, 0.300] | 2.000 [2.000, 2.000] | 1.700 [0.429, 2.971] "
        "| 0.300 [-0.971, 1.571] | 3.0 [-9.7, 15.7] | 0.00 [0.00, 0.00] |"
    ) in text
    assert "| 1 | 0.100 [0.100, 0.100] | 0.150 [-0.485, 0.785] |" in text
    assert "misassigned tokens 3.0 [-9.7, 15.7] → 1.0 [1.0, 1.0] of 40" in text
    assert (
        "At layer 1 over the 2 seeds thickness 1 is 0.100 in every seed, thickness 2 ranges from 0.100 to 0.200" in text
    )
    assert "![the toy](figures/toy.png)" in text and "the mean and its 95 % interval over 2 seeds," in text


def test_a_record_gives_back_the_runs_it_was_made_of():
    runs = run_toy(["a", "c-len1"], [3, 4])
    back = runs_from_record(toy_record(runs, ToyConfig(), "alfa crate toy"))
    assert [(r.key, r.seed) for r in back] == [(r.key, r.seed) for r in runs]
    assert all(np.array_equal(a.labels, b.labels) for a, b in zip(runs, back))
    assert all(np.array_equal(x, y) for x, y in zip(runs[0].tokens, back[0].tokens)) and back[1].tokens == []
    for key in ("a", "c-len1"):
        values, again = seed_values(runs)[key], seed_values(back)[key]
        assert read_panel(values, 40) == read_panel(again, 40)


def test_a_section_replaces_only_what_lies_between_its_markers():
    begin, end = section_marks("crate-toy")
    page = f"intro\n{begin}\nold\n{end}\n\noutro\n"
    assert with_section(page, "crate-toy", "new\n") == f"intro\n{begin}\nnew\n{end}\n\noutro\n"
    for broken in ("no markers", f"{end}\n{begin}", begin * 2 + end):
        with pytest.raises(ValueError, match="needs exactly one"):
            with_section(broken, "crate-toy", "new")
    with pytest.raises(ValueError, match="needs exactly one"):  # another section's markers are not this one's
        with_section(page, "crate-toy-d-strong", "new")


def test_another_json_file_is_not_taken_for_a_record(tmp_path):
    (tmp_path / "runs.json").write_text("[]")
    with pytest.raises(ValueError, match="not a plane-toy record"):
        load_record(tmp_path / "runs.json")


def _values(thickness1: list[float], thickness2: list[float] | None, r: list[float], dr: list[float]) -> dict:
    """One seed's per-layer measures as :func:`seed_values` gives them (``thickness2`` None: panel (a))."""
    layers = len(thickness1)
    row = lambda xs: np.asarray([xs], dtype=np.float64)  # noqa: E731
    return {
        "thickness1": row(thickness1),
        "thickness2": row(thickness2 if thickness2 is not None else [np.nan] * layers),
        "R": row(r),
        "Rc": row(np.subtract(r, dr)),
        "dR": row(dr),
        "misassigned": row([1.0] * layers),
        "one_axis_share": row([0.0] * layers),
    }


@pytest.mark.parametrize(
    ("values", "said"),
    [
        (_values([0.4, 0.65], None, [9.5, 9.9], [0, 0]), "the cluster thickens (thickness 0.400 → 0.650) and its "
         "coding rate rises (R 9.500 → 9.900 bits)"),
        (_values([0.4, 0.3], None, [2.0, 2.0001], [0, 0]), "the cluster thins somewhat (thickness 0.400 → 0.300) and "
         "its coding rate stays (R 2.000 → 2.000 bits)"),
        (_values([0.3, 0.7], [0.3, 0.6], [9, 9], [0.8, 0.0]), "the clusters thicken (thickness 0.300 → 0.700 and "
         "0.300 → 0.600) and are merged (ΔR 0.800 → 0.000: nothing tells them apart any more)"),
        (_values([0.4, 0.3], [0.3, 0.5], [9, 9], [0.8, 0.5]), "cluster 1 thins somewhat and cluster 2 thickens "
         "(thickness 0.400 → 0.300 and 0.300 → 0.500), and they are drawn together (ΔR 0.800 → 0.500)."),
        (_values([0.4, 0.1], [0.3, 0.31], [9, 9], [0.8, 0.8]), "cluster 1 is compressed and cluster 2 barely changes "
         "in thickness (thickness 0.400 → 0.100 and 0.300 → 0.310), while ΔR stays 0.800."),
    ],
)  # fmt: skip
def test_every_verb_of_a_reading_follows_the_direction_of_its_numbers(values, said):
    """A thickness that rose was read "thins somewhat", a coding rate that rose "falls", and a ΔR that fell by a
    fifth "nothing tells them apart any more"."""
    assert said in read_panel(values, 40)


def test_the_readings_the_newcomer_found_contradicting_their_tables():
    (lone,) = run_toy(["a"], [2], ToyConfig(eps=0.03))
    text = read_panel(seed_values([lone])["a"], 20)
    assert "the cluster thickens (thickness 0.398 → 0.654) and its coding rate rises (R 9.579 → 9.993 bits)" in text
    (both,) = run_toy(["c"], [0], ToyConfig(eps=1e-3))
    assert "the clusters thicken (thickness 0.307 → 0.683" in read_panel(seed_values([both])["c"], 40)
