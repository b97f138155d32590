"""The statistics every benchmark page judges its differences with (``alfa.study.bench.stats``): Student's t,
Holm's correction, the hierarchical bootstrap, a page's family; and the false-alarm rate of "clear" in a
simulation of the benchmark's own design under no difference (and that the old rule fails that check)."""

import dataclasses
import math
import statistics

import numpy as np
import pytest

from alfa.study.bench.power import PLANNING, Components, detectable, plan_table, standard_error
from alfa.study.bench.stats import (
    ALPHA,
    Comparisons,
    Diff,
    bootstrap_se,
    design_of,
    detectable_multiple,
    diff,
    holm,
    index_records,
    t_quantile,
    t_tail,
)

# ----------------------------------------------------------------------------- Student's t and Holm


@pytest.mark.parametrize(
    "df, quantile",
    [
        (1, math.tan(math.pi * 0.95 / 2)),  # closed forms
        (2, math.sqrt(2 * 0.95**2 / (1 - 0.95**2))),
        (3, 3.182446),  # the tables' six decimals
        (5, 2.570582),
        (30, 2.042272),
    ],
)
def test_t_matches_the_tables_and_its_quantile_inverts_it(df, quantile):
    assert t_tail(quantile, df) == pytest.approx(0.05, abs=1e-6)
    assert t_quantile(0.05, df) == pytest.approx(quantile, abs=1e-6)
    assert t_tail(t_quantile(0.001, df), df) == pytest.approx(0.001, rel=1e-9)
    assert t_tail(0.0, df) == pytest.approx(1.0)
    t = np.array([0.3, 1.0, 2.0, 7.0])
    assert (np.diff(t_tail(t, df)) < 0).all()  # a larger |t| is rarer
    assert t_tail(-t, df) == pytest.approx(t_tail(t, df))


def test_t_of_one_degree_is_cauchy_and_many_degrees_approach_the_normal():
    assert t_tail(2.0, 1) == pytest.approx(1 - 2 / math.pi * math.atan(2.0), abs=1e-15)
    normal = math.erfc(1.959963984540054 / math.sqrt(2))
    tails = [float(t_tail(1.959963984540054, df)) for df in (2, 20, 200, 20001)]
    assert tails == sorted(tails, reverse=True) and tails[-1] == pytest.approx(normal, abs=2e-5)


def test_t_refuses_a_fractional_or_missing_degree_of_freedom():
    with pytest.raises(ValueError, match="whole number of degrees of freedom"):
        t_tail(1.0, 2.5)
    with pytest.raises(ValueError, match="≥ 1"):
        t_tail(1.0, 0)


def test_holm_steps_down():
    assert holm([0.01, 0.04, 0.03, 0.2]) == pytest.approx([0.04, 0.09, 0.09, 0.2])
    assert holm([0.01, 0.02, 0.03]) == pytest.approx([0.03, 0.04, 0.04])  # made non-decreasing
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])  # capped at 1
    rng = np.random.default_rng(0)
    p = rng.random((50, 7)) ** 3
    q = holm(p)
    assert (q >= p).all() and (q <= 1).all()
    assert q.min(-1) == pytest.approx(np.minimum(7 * p.min(-1), 1))  # the smallest: Bonferroni
    order = np.argsort(p, -1)
    assert (np.diff(np.take_along_axis(q, order, -1), axis=-1) >= 0).all()  # in p's order


# ----------------------------------------------------------------------------- the bootstrap


def test_the_bootstrap_variance_is_the_unbiased_variance_of_each_margin():
    rng = np.random.default_rng(3)
    table = rng.normal(size=(3, 5)) + rng.normal(size=(3, 1)) + rng.normal(size=(1, 5))
    seed_means, person_means = table.mean(1), table.mean(0)
    draws = 200_000
    nested = bootstrap_se([(1.0, table)], "nested", np.random.default_rng(1), draws)
    assert nested == pytest.approx(statistics.stdev(seed_means) / math.sqrt(3), rel=0.01)  # seeds only
    crossed = bootstrap_se([(1.0, table)], "crossed", np.random.default_rng(1), draws)
    expected = statistics.variance(seed_means) / 3 + statistics.variance(person_means) / 5
    assert crossed**2 == pytest.approx(expected, rel=0.02)  # both margins
    # two blocks (pairs): the seeds are drawn once for both, their persons each on their own; a shift changes nothing
    two = bootstrap_se([(0.5, table), (0.5, table[:, ::-1] + 7.0)], "crossed", np.random.default_rng(1), draws)
    shared = statistics.variance(seed_means) / 3 + statistics.variance(person_means) / 5 / 2
    assert two**2 == pytest.approx(shared, rel=0.02)


def test_the_bootstrap_refuses_a_crossed_design_with_missing_persons_and_unknown_designs():
    table = np.array([[1.0, 2.0], [3.0, math.nan]])
    assert bootstrap_se([(1.0, table)], "nested", np.random.default_rng(0), 100) > 0
    with pytest.raises(ValueError, match="same persons in every seed"):
        bootstrap_se([(1.0, table)], "crossed", np.random.default_rng(0), 100)
    with pytest.raises(ValueError, match="persons must be one of"):
        bootstrap_se([(1.0, table)], "mixed", np.random.default_rng(0), 100)
    assert design_of({"config": {}}) == "crossed" and design_of({"config": {"target_draw": "per_seed"}}) == "nested"
    with pytest.raises(ValueError, match="unknown config.target_draw 'sometimes'"):
        design_of({"config": {"target_draw": "sometimes"}})


# ----------------------------------------------------------------------------- a difference and its family


def _records(errors, method, pair="E→M"):
    """Records of ``method`` on ``pair``: ``errors[seed][person]``."""
    from bench_records import complete

    return [
        complete(
            {"method": method, "pair": pair, "seed": s, "per_person": {f"p{j}": float(e) for j, e in enumerate(row)}}
        )
        for s, row in enumerate(errors)
    ]


def _index(a, b, persons="crossed", draws=4000):
    return index_records(_records(a, "alfa") + _records(b, "lora"), Comparisons(persons=persons, draws=draws))


A = [[5.0, 6.0, 9.0], [5.5, 6.0, 8.0], [4.0, 7.5, 8.5]]
B = [[6.0, 6.5, 8.0], [6.0, 7.0, 7.5], [5.0, 7.0, 8.0]]


def test_a_difference_is_the_mean_of_record_differences_and_counts_distinct_persons():
    d = diff(_index(A, B), "alfa", "lora", ["E→M"])
    per_seed = [statistics.fmean(a) - statistics.fmean(b) for a, b in zip(A, B)]
    assert d.per_seed == pytest.approx(dict(enumerate(per_seed)))
    assert d.mean == pytest.approx(statistics.fmean(per_seed)) and d.df == 2
    # crossed: a person's difference is its mean over the seeds (p0 −0.83, p1 −0.33, p2 +0.67)
    assert (d.persons_better, d.persons_worse, d.persons) == (2, 1, 3)
    assert d.interval == pytest.approx((d.mean - 4.302652729911275 * d.se, d.mean + 4.302652729911275 * d.se))
    assert d.p == pytest.approx(float(t_tail(d.mean / d.se, 2)))
    nested = diff(_index(A, B, "nested"), "alfa", "lora", ["E→M"])
    assert (nested.persons_better, nested.persons) == (5, 9)  # every (seed, person) is a person of its own
    assert nested.mean == d.mean and nested.se != d.se
    # nested, a person missing in one seed: that seed's mean is over its own persons
    short = [row[:2] if s == 1 else row for s, row in enumerate(A)]
    ragged = diff(_index(short, B, "nested"), "alfa", "lora", ["E→M"])
    assert ragged.persons == 8 and ragged.se > 0 and ragged.df == 2


def test_a_difference_regenerates_identically_and_b_minus_a_is_the_same_member():
    first = diff(_index(A, B), "alfa", "lora", ["E→M"])
    idx = _index(A, B)
    other_way = diff(idx, "lora", "alfa", ["E→M"])  # made first in this family, the other way round
    again = diff(idx, "alfa", "lora", ["E→M"])
    assert (again.se, again.mean) == (first.se, first.mean)
    assert other_way.mean == -again.mean and other_way.p == again.p and other_way.interval[0] == -again.interval[1]
    assert (other_way.persons_better, other_way.persons_worse) == (again.persons_worse, again.persons_better)
    assert len(idx.family.judged()) == 1


def test_a_family_is_judged_with_holm_and_is_closed_to_new_comparisons():
    idx = _index(A, B)
    family = idx.family
    d = diff(idx, "alfa", "lora", ["E→M"])
    assert d.adjusted is None and "judged alone" in d.describe()
    family.close()
    assert d.adjusted == pytest.approx(d.p) and d.family == 1  # a family of one
    assert f"after Holm over 1 comparisons (adjusted p = {d.adjusted:.2g})" in d.describe()
    assert diff(idx, "alfa", "lora", ["E→M"]) is d  # the second rendering quotes the same member
    with pytest.raises(RuntimeError, match="was not made before the family closed"):
        diff(idx, "alfa", "lora", ["E→D"])
    assert family.level == ALPHA
    assert family.detectable() == [detectable_multiple(ALPHA, 2) * d.se]


def test_holm_over_a_family_makes_a_borderline_difference_not_clear():
    members = [Diff("a", "b", ("E→M",), "angular error", {0: 1.0, 1: 1.2, 2: 0.8}, 0.05, 2, "seeds", 0, 0, 0)]
    members += [
        Diff("a", f"c{k}", ("E→M",), "angular error", {0: 0.1, 1: -0.1, 2: 0.05}, 0.5, 2, "seeds", 0, 0, 0)
        for k in range(30)
    ]
    family = Comparisons()
    for k, d in enumerate(members):
        family.made[("a", f"m{k}", ("E→M",), "angular error")] = d
    assert members[0].p < ALPHA and members[0].clear  # alone: clear (t = 20, p = 0.0025)
    family.close()
    assert members[0].adjusted == pytest.approx(31 * members[0].p) and not members[0].clear
    assert family.clear() == [] and "not clear after Holm over 31 comparisons" in members[0].describe()


def test_one_seed_gives_an_interval_over_persons_and_no_verdict():
    idx = _index(A[:1], B[:1])
    d = diff(idx, "alfa", "lora", ["E→M"])
    assert d.n == 1 and d.df == 2 and d.interval is not None  # 3 persons: t with 2 degrees of freedom
    assert not d.judged and not d.clear and d.p is not None
    assert (
        "(95 %, persons drawn; one seed, whose own variation is not measured)" in d.describe()
        and "not judged (one seed)" in d.describe()
    )
    idx.family.close()
    assert idx.family.judged() == [] and d.adjusted is None


# ----------------------------------------------------------------------------- false alarms in the benchmark's design

# The sizes of the random effects of a difference between two rows, in degrees, estimated once from the committed
# records (alfa.study.bench.power.PLANNING says how); the power planning uses the same values.
SHARED, SEED, PERSON, NOISE = dataclasses.astuple(PLANNING)
SEEDS, PAIRS = 3, 4
DESIGNS = [("crossed", 5), ("nested", 15)]  # today's records: 5 persons in every seed; the re-run: 15 per seed


def _simulate(n, persons, people, rng, effect=0.0):
    """``n`` comparisons of the benchmark's design under ``a − b = effect``: per pair a (seeds × persons) table of
    per-person differences (crossed: the same persons in every seed)."""
    shared = rng.normal(0, SHARED, (n, SEEDS, 1))
    tables = []
    for _ in range(PAIRS):
        seed = shared + rng.normal(0, SEED, (n, SEEDS, 1))
        person = rng.normal(0, PERSON, (n, SEEDS if persons == "nested" else 1, people))
        tables.append(effect + seed + person + rng.normal(0, NOISE, (n, SEEDS, people)))
    return tables


def _p_values(tables, persons, rng, draws=200):
    """The two-sided p-value of each simulated comparison, as a page computes it (the estimate's bootstrap
    standard error, t with seeds − 1 degrees of freedom)."""
    estimate = np.mean([t.mean((-2, -1)) for t in tables], 0)
    se = bootstrap_se([(1 / len(tables), t) for t in tables], persons, rng, draws)
    return t_tail(estimate / se, SEEDS - 1), se


def _limit(rate, n):
    """A rate's bound: the nominal rate plus three Monte Carlo standard errors of ``n`` simulations (an exact 5 %
    test passes it in all but about one simulation in 700)."""
    return rate + 3 * math.sqrt(rate * (1 - rate) / n)


@pytest.mark.parametrize("persons, people", DESIGNS)
def test_clear_false_alarms_at_most_five_percent_alone_and_over_a_holm_family(persons, people):
    """20 000 null comparisons: each alone, and in 1000 families of 20 judged with Holm as a page judges its own."""
    rng = np.random.default_rng(24)
    families, size = 1000, 20
    p, _ = _p_values(_simulate(families * size, persons, people, rng), persons, rng)
    assert (p < ALPHA).mean() <= _limit(ALPHA, families * size)
    if persons == "nested":  # the t test of the seed means: exact, so not far below 5 % either
        assert (p < ALPHA).mean() >= 2 * ALPHA - _limit(ALPHA, families * size)
    # (crossed: conservative, about 0.2 %: t with seeds − 1 degrees of freedom where the persons' share counts too)
    familywise = (holm(p.reshape(families, size)) < ALPHA).any(-1).mean()
    assert familywise <= _limit(ALPHA, families)


def _old_rule(tables):
    """The rule the pages used before: |Δ| above the std of the per-seed differences, the same sign in every seed."""
    per_seed = np.mean([t.mean(-1) for t in tables], 0)
    same_sign = (np.sign(per_seed) == np.sign(per_seed[:, :1])).all(-1)
    return (np.abs(per_seed.mean(-1)) > per_seed.std(-1, ddof=1)) & same_sign


def _naive_percentile(tables, persons, rng, draws=200):
    """A plain two-level bootstrap (seeds, then persons; no correction) and its 95 % percentile interval."""
    n, seeds, people = tables[0].shape
    replicate = 0.0
    drawn_seeds = rng.integers(0, seeds, (draws, seeds))
    for t in tables:
        drawn = rng.integers(0, people, (draws, 1 if persons == "crossed" else seeds, people))
        values = t[:, drawn_seeds[:, :, None], np.broadcast_to(drawn, (draws, seeds, people))]
        replicate = replicate + values.mean((-2, -1)) / len(tables)
    estimate = np.mean([t.mean((-2, -1)) for t in tables], 0)
    deviation = replicate - estimate[:, None]
    lo, hi = np.quantile(deviation, [0.025, 0.975], axis=-1) + estimate
    return (lo > 0) | (hi < 0)


@pytest.mark.parametrize("persons, people", DESIGNS)
def test_the_check_can_fail_the_old_rule_and_a_naive_bootstrap_fire_too_often(persons, people):
    rng = np.random.default_rng(7)
    n = 3000
    tables = _simulate(n, persons, people, rng)
    assert _old_rule(tables).mean() > 0.15  # about one in five, as the issue measured
    naive = _naive_percentile([t[:1000] for t in tables], persons, rng)
    assert naive.mean() > _limit(ALPHA, 1000)  # three seeds taken for more than they are


@pytest.mark.parametrize("df, level", [(2, 0.05), (2, 0.0025), (5, 0.05)])
def test_the_detectable_size_has_eighty_percent_power_in_a_t_test(df, level):
    """Normal values whose mean is the detectable size (in standard errors of the mean) above zero: their t test
    calls it clear in 80 % of draws; below the shifted-t shortcut's size, less."""
    rng = np.random.default_rng(df)
    n, draws = df + 1, 40_000
    size = detectable_multiple(level, df)
    x = rng.normal(size / math.sqrt(n), 1.0, (draws, n))
    t = x.mean(1) / (x.std(1, ddof=1) / math.sqrt(n))
    assert (t_tail(t, df) < level).mean() == pytest.approx(0.8, abs=0.01)
    assert size > float(t_quantile(level, df) + t_quantile(0.4, df))  # the shortcut overstates the power


@pytest.mark.parametrize("persons, people", DESIGNS)
def test_a_real_difference_well_above_the_detectable_size_is_detected(persons, people):
    rng = np.random.default_rng(11)
    _, se = _p_values(_simulate(1000, persons, people, rng), persons, rng)
    detectable = detectable_multiple(ALPHA, SEEDS - 1) * np.median(se)
    p, _ = _p_values(_simulate(1000, persons, people, rng, effect=1.5 * detectable), persons, rng)
    assert (p < ALPHA).mean() >= 0.9


# ----------------------------------------------------------------------------- planning the power, declaring the family


@pytest.mark.parametrize("persons, people", DESIGNS)
def test_the_planned_standard_error_is_the_scatter_of_the_simulated_estimates(persons, people):
    """The planning formula against the benchmark's simulated design: the standard deviation of 20 000 pooled
    estimates under no difference. A formula that forgot a component (the shared seed effect is the largest
    part pooled over four pairs) or counted one twice would miss by far more than the 3 % allowed."""
    rng = np.random.default_rng(5)
    estimates = np.mean([t.mean((-2, -1)) for t in _simulate(20_000, persons, people, rng)], 0)
    planned = standard_error(PLANNING, SEEDS, people, PAIRS, persons)
    assert float(estimates.std()) == pytest.approx(planned, rel=0.03)
    no_shared = standard_error(dataclasses.replace(PLANNING, shared=0.0), SEEDS, people, PAIRS, persons)
    assert float(estimates.std()) != pytest.approx(no_shared, rel=0.03)


def test_planned_detectable_differences_shrink_with_seeds_and_grow_with_the_family():
    one = detectable(PLANNING, 3, 15, 4, 1)
    assert detectable(PLANNING, 3, 15, 4, 24) > one > detectable(PLANNING, 8, 15, 4, 1)
    assert detectable(PLANNING, 1, 15, 4, 1) == math.inf  # one seed: no verdict
    assert one == pytest.approx(detectable_multiple(ALPHA, 2) * standard_error(PLANNING, 3, 15, 4))
    table = plan_table(seeds=(3, 8), families=(12,), pairs=(4,))
    assert table.splitlines()[2] == f"| 3 | {detectable(PLANNING, 3, 15, 4, 12):.1f} |"
    with pytest.raises(ValueError, match="design must be"):
        standard_error(Components(0, 0, 0, 1), 3, 15, 4, "paired")


def test_the_declared_planning_table_is_the_commands_output():
    """docs/flip-premise.md §7.1 quotes the planning table the second protocol's seeds were chosen from: it must be
    what ``alfa power`` prints for the arguments the page names."""
    from pathlib import Path

    page = (Path(__file__).resolve().parent.parent / "docs" / "flip-premise.md").read_text("utf-8")
    assert "alfa power --seeds 3,5,8,10 --families 11,24,100 --pairs 6,2,1" in page
    assert plan_table((3, 5, 8, 10), (11, 24, 100), (6, 2, 1)) in page


def test_alfa_power_with_no_arguments_prints_the_declared_planning_table(capsys):
    """Its defaults were the first protocol's (families 12 to 400, four pairs pooled): the table a reader of §7.1
    got by typing ``alfa power`` was not the one the page declares its seeds from."""
    from pathlib import Path

    from alfa.cli import main
    from alfa.study.bench.methods import DECLARED_FAMILY

    assert main(["power"]) == 0
    page = (Path(__file__).resolve().parent.parent / "docs" / "flip-premise.md").read_text("utf-8")
    assert capsys.readouterr().out.strip() in page and len(DECLARED_FAMILY["v2"]) == 11


@pytest.mark.parametrize(
    ("seeds", "said"),
    [("1", "from 2 (one seed has no spread"), ("3,3", "--seeds 3,3: name each number once"), ("1000000", "to 1000")],
)
def test_power_refuses_what_it_cannot_plan_in_one_line(seeds, said, capsys):
    """A newcomer got a row of inf for one seed, a row twice for 3,3 and nine silent minutes for a million."""
    from alfa.cli import main

    assert main(["power", "--seeds", seeds]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and said in err


def test_a_declared_family_judges_only_its_members_and_names_what_it_could_not_make():
    """Outside the declaration a comparison keeps its interval but gets no verdict and does not enlarge Holm's
    family; a declared comparison is found either way round; one the page never made is reported missing."""
    a = _records([[0.0, 0.0, 0.0], [3.0, 3.0, 3.0], [6.0, 6.0, 6.0]], "a")
    b = _records([[1.0, 1.1, 0.9], [4.1, 3.9, 4.0], [7.0, 7.2, 6.9]], "b")
    c = _records([[0.5, 0.4, 0.6], [3.5, 3.6, 3.4], [6.4, 6.5, 6.6]], "c")
    declared = frozenset({("b", "a", ("E→M",), "angular error"), ("a", "z", ("E→M",), "angular error")})
    idx = index_records(a + b + c, Comparisons(declared=declared, draws=500))
    judged, loose = diff(idx, "a", "b", ["E→M"]), diff(idx, "a", "c", ["E→M"])
    idx.family.close()
    # the family is the declaration's two, the unmade a − z among them; the descriptive a − c does not count
    assert judged.judged and judged.family == 2 and loose.interval is not None
    assert not loose.judged and not loose.clear and loose.adjusted is None
    assert "descriptive (not in the declared family)" in loose.describe()
    assert idx.family.descriptive() == [loose] and idx.family.missing() == [("a", "z", ("E→M",), "angular error")]
    everything = index_records(a + b + c, Comparisons(draws=500))  # no declaration: every comparison judged
    diff(everything, "a", "b", ["E→M"]), diff(everything, "a", "c", ["E→M"])
    everything.family.close()
    assert len(everything.family.judged()) == 2 and everything.family.missing() == []


def test_a_declared_family_made_in_part_is_held_to_holm_over_all_of_it():
    """A page of a run under way makes a few of its declared comparisons: Holm counts every declared one (the
    unmade ones never clear), so a difference clear at 0.02 alone is not clear in a family of three, and the
    records still to come cannot undo a verdict by growing the family."""
    from alfa.study.bench.stats import Diff

    def made(key, p_value: float) -> Diff:
        # a difference whose t statistic gives ``p_value`` on 2 degrees of freedom (three seeds)
        t = {0.02: 6.9646, 0.2: 1.8856}[p_value]
        return Diff(key[0], key[1], key[2], key[3], {0: t, 1: t, 2: t}, 1.0, 2, "seeds", 3, 0, 3)

    keys = [("alfa", "source-only", ("E→M",), "angular error"), ("lora", "source-only", ("E→M",), "angular error")]
    declared = frozenset([*keys, ("alfa", "lora", ("E→M",), "angular error")])
    for declaration, size, clear in ((declared, 3, False), (None, 2, True)):
        family = Comparisons(declared=declaration)
        for key, p_value in zip(keys, (0.02, 0.2)):
            family.lookup(key, lambda key=key, p_value=p_value: made(key, p_value))
        family.close()
        first = family.made[keys[0]]
        assert first.p == pytest.approx(0.02, abs=1e-3) and family.size == size and first.family == size
        assert first.adjusted == pytest.approx(0.02 * size, abs=3e-3) and first.clear is clear
        assert family.level == pytest.approx(0.05 / size)
