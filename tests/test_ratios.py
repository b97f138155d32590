"""A ratio's own interval (``alfa.study.bench.ratios``): Fieller's closed form against a bootstrap of
``L(r) = N − r·D`` itself, the value on the seeds every row has, unbounded and one-seed intervals said in words,
and the interval's coverage in a simulation of the benchmark's design (where an interval from the numerator's
error alone falls short)."""

import math
import statistics

import numpy as np
import pytest

from alfa.study.bench.ratios import _blocks, _coefficients, _groups, _read, fieller, ratio, share
from alfa.study.bench.stats import ALPHA, Comparisons, angular, bootstrap_se, index_records, t_quantile


def _records(errors, method, pair="E→M", first_seed=0):
    """Records of ``method`` on ``pair``: ``errors[seed][person]``."""
    from bench_records import complete

    return [
        complete(
            {
                "method": method,
                "pair": pair,
                "seed": first_seed + s,
                "per_person": {f"p{j}": float(e) for j, e in enumerate(row)},
            }
        )
        for s, row in enumerate(errors)
    ]


SOURCE = [[9.0, 10.0, 12.0, 8.0], [9.5, 11.0, 11.0, 8.5], [10.0, 10.5, 12.5, 7.5]]
ORACLE = [[6.0, 7.5, 8.0, 6.0], [6.5, 7.0, 8.5, 5.5], [7.0, 7.5, 9.0, 6.0]]
ALFA = [[8.0, 9.5, 11.0, 7.5], [9.0, 10.0, 10.5, 8.0], [9.5, 9.0, 12.0, 7.0]]


def _index(rows, persons="crossed", draws=4000):
    records = [r for method, errors in rows.items() for r in _records(errors, method)]
    return index_records(records, Comparisons(persons=persons, draws=draws))


def test_the_closed_form_is_the_set_where_the_t_of_l_r_stays_inside():
    t = 4.302652729911275  # t₀.₉₇₅ with 2 degrees of freedom
    lo, hi = fieller(1.0, 2.0, 0.04, 0.09, 0.01, t)
    for r in (lo, hi):  # the ends: |L(r)| is exactly t standard errors
        assert (1.0 - 2.0 * r) ** 2 == pytest.approx(t * t * (0.04 - 2 * r * 0.01 + r * r * 0.09))
    assert lo < 0.5 < hi and hi - 0.5 > 0.5 - lo  # around n / d, longer on the far side
    # an exact denominator: the numerator's interval over d
    assert fieller(1.0, 2.0, 0.04, 0.0, 0.0, t) == pytest.approx(((1.0 - t * 0.2) / 2.0, (1.0 + t * 0.2) / 2.0))
    assert fieller(1.0, 0.5, 0.04, 0.09, 0.0, t) is None  # 0.5 is not clear of zero: 0.25 < t² · 0.09


@pytest.mark.parametrize("persons", ["crossed", "nested"])
def test_the_variances_give_the_bootstrap_standard_error_of_l_r_for_every_r(persons):
    """One set of replicates draws N and D: SE(L(r))² = v_N − 2 r c + r² v_D, against a bootstrap of L(r) itself
    with the same draws (so the check fails with a wrong covariance or separately drawn replicates)."""
    idx = _index({"source-only": SOURCE, "oracle": ORACLE, "alfa": ALFA}, persons)
    got = share(idx, "alfa", ["E→M"])
    coefficients = _coefficients((("source-only", 1.0), ("alfa", -1.0)), (("source-only", 1.0), ("oracle", -1.0)))
    blocks, _ = _blocks(*_read(idx, list(coefficients), ["E→M"], [0, 1, 2], angular), coefficients, persons)
    assert len(blocks) == 1 and blocks[0][1].shape == (3, 3, 4)  # one pair: its persons drawn once for all rows
    var_n, var_d, var_sum = bootstrap_se(blocks, persons, np.random.default_rng(5), 3000) ** 2
    cov = (var_sum - var_n - var_d) / 2
    for r in (-3.0, 0.0, 0.4, 2.5):
        lr = [(1.0, blocks[0][1][0] - r * blocks[0][1][1])]
        direct = bootstrap_se(lr, persons, np.random.default_rng(5), 3000)
        assert direct**2 == pytest.approx(var_n - 2 * r * cov + r * r * var_d, rel=1e-9)
    assert got.var_n is not None and got.cov is not None and got.df == 2
    assert got.drawn == (
        "persons and seeds drawn" if persons == "crossed" else "seeds drawn, each with its own persons"
    )


def test_a_share_is_the_ratio_of_the_means_on_the_seeds_every_row_has():
    rows = {"source-only": SOURCE, "oracle": ORACLE[:2], "alfa": ALFA}  # the oracle lacks seed 2
    idx = _index(rows)
    got = share(idx, "alfa", ["E→M"])
    mean = [statistics.fmean(statistics.fmean(r[s]) for s in (0, 1)) for r in (SOURCE, ORACLE, ALFA)]
    assert got.seeds == (0, 1) and got.value == pytest.approx((mean[0] - mean[2]) / (mean[0] - mean[1]))
    lo, hi = got.interval
    assert lo < got.value < hi and got.df == 1
    assert share(idx, "alfa", ["E→M"], seeds=[1]).seeds == (1,)
    assert share(idx, "alfa", ["E→M"], seeds=[2]) is None  # no seed has all three
    assert got.text().startswith(f"{100 * got.value:.0f} % [".replace("-", "−"))
    assert share(idx, "lora", ["E→M"]) is None


def test_a_headroom_not_clear_of_zero_has_no_finite_interval_and_one_seed_is_named():
    noisy = [[s + d for s, d in zip(row, (-2.0, 1.5, -1.0, 1.2))] for row in SOURCE]  # an oracle about at source-only
    idx = _index({"source-only": SOURCE, "oracle": noisy, "alfa": ALFA})
    got = share(idx, "alfa", ["E→M"])
    assert got.interval is None and got.unbounded
    assert "(no finite interval: the headroom is not clear of zero)" in got.text(
        unbounded="the headroom is not clear of zero"
    )
    one = share(_index({"source-only": SOURCE[:1], "oracle": ORACLE[:1], "alfa": ALFA[:1]}), "alfa", ["E→M"])
    assert one.df == 3 and one.drawn.startswith("persons drawn; one seed") and one.text().endswith("(one seed)")
    assert one.interval is not None


def test_a_within_target_multiple_is_a_ratio_of_rows():
    idx = _index({"source-only": SOURCE, "target-trained": ORACLE})
    got = ratio(idx, (("target-trained", 1.0),), (("source-only", 1.0),), ["E→M"])
    assert got.value == pytest.approx(
        statistics.fmean(map(statistics.fmean, ORACLE)) / statistics.fmean(map(statistics.fmean, SOURCE))
    )
    lo, hi = got.interval
    assert lo < got.value < hi and got.times_text().startswith(f"{got.value:.2f} [")


# ----------------------------------------------------------------------------- coverage in the benchmark's design

SEEDS = 3
TRUE_RATIO = -2.0  # a share below zero, as Alfa's on the symmetric pairs: where D's error matters most
HEADROOM, SEED_SD, PERSON_SD, NOISE_SD = 2.0, 0.6, 1.0, 0.5


def _simulate(n, persons, people, rng):
    """``n`` (N, D) tables of per-person values, (n, 3, seeds, persons) as :func:`ratios._blocks` makes them, with
    E[N] / E[D] = TRUE_RATIO: N and D have their own seed, person and noise effects (crossed: the same persons in
    every seed)."""
    person_seeds = SEEDS if persons == "nested" else 1
    tables = []
    for mean in (TRUE_RATIO * HEADROOM, HEADROOM):
        seed = rng.normal(0, SEED_SD, (n, SEEDS, 1))
        person = rng.normal(0, PERSON_SD, (n, person_seeds, people))
        tables.append(mean + seed + person + rng.normal(0, NOISE_SD, (n, SEEDS, people)))
    return np.stack([tables[0], tables[1], tables[0] + tables[1]], axis=1)


@pytest.mark.parametrize("persons, people", [("crossed", 5), ("nested", 15)])
def test_the_interval_covers_the_true_ratio_and_the_numerators_error_alone_does_not(persons, people):
    n = 2000
    rng = np.random.default_rng(25)
    table = _simulate(n, persons, people, rng)
    var_n, var_d, var_sum = np.moveaxis(bootstrap_se([(1.0, table)], persons, rng, 200) ** 2, -1, 0)
    cov = (var_sum - var_n - var_d) / 2
    num, den = table[:, 0].mean((-2, -1)), table[:, 1].mean((-2, -1))
    t = float(t_quantile(ALPHA, SEEDS - 1))
    covered = naive = 0
    for k in range(n):
        interval = fieller(num[k], den[k], var_n[k], var_d[k], cov[k], t)
        covered += interval is None or interval[0] <= TRUE_RATIO <= interval[1]  # unbounded: covers
        half = t * math.sqrt(var_n[k]) / abs(den[k])
        naive += abs(num[k] / den[k] - TRUE_RATIO) <= half
    bound = 3 * math.sqrt(ALPHA * (1 - ALPHA) / n)
    assert covered / n >= 1 - ALPHA - bound
    assert naive / n < 1 - ALPHA - bound  # the check can fail: the denominator's error left out


def test_rows_scored_on_other_persons_have_their_persons_drawn_on_their_own():
    """The domain gap's share, (source-only − in-domain) / source-only: in-domain is scored on held-out source
    persons, so no person pairs the rows; each row's persons are drawn on their own, as a difference's are."""
    from bench_records import complete

    held_out = [
        complete(
            {"method": "in-domain", "pair": "E→M", "seed": s, "per_person": {f"v{j}": 6.0 + j + s for j in range(3)}}
        )
        for s in range(3)
    ]
    idx = index_records(_records(SOURCE, "source-only") + held_out, Comparisons(draws=4000))
    got = ratio(idx, (("source-only", 1.0), ("in-domain", -1.0)), (("source-only", 1.0),), ["E→M"])
    means = [
        statistics.fmean(statistics.fmean(r) for r in rows)
        for rows in (SOURCE, [[6 + j + s for j in range(3)] for s in range(3)])
    ]
    assert got.value == pytest.approx((means[0] - means[1]) / means[0])
    assert got.drawn == "seeds and each row's persons drawn" and got.interval is not None
    # three rows, two on the targets' persons: those two stay paired, the held-out row is drawn apart
    idx3 = index_records(
        _records(SOURCE, "source-only") + _records(ORACLE, "oracle") + held_out, Comparisons(draws=4000)
    )
    values, _ = _read(idx3, ["source-only", "in-domain", "oracle"], ["E→M"], [0, 1, 2], angular)
    assert _groups(values["E→M"], "crossed") == [["source-only", "oracle"], ["in-domain"]]
    three = ratio(idx3, (("source-only", 1.0), ("in-domain", -1.0)), (("source-only", 1.0), ("oracle", -1.0)), ["E→M"])
    assert three.drawn == "seeds and each row's persons drawn" and three.interval is not None
    only_seeds = index_records(
        [{**r, "per_person": {}} for r in _records(SOURCE, "source-only") + held_out], Comparisons(draws=4000)
    )
    assert ratio(only_seeds, (("in-domain", 1.0),), (("source-only", 1.0),), ["E→M"]).drawn == "seeds drawn"
