"""The bench layer's structure: an ablation is one registered object, and runner and report stand apart."""

import ast
from pathlib import Path

import pytest
from bench_records import row

import alfa.study.bench
from alfa.study.bench.ablations import REGISTRY, Ablation, register, unregister
from alfa.study.bench.config import SELECTION_FIELDS, BenchConfig
from alfa.study.bench.plan import plan_records
from alfa.study.bench.report_page import render_report
from alfa.study.bench.report_tables import ablation_table
from alfa.study.bench.results import FORMAT, VERSION, layout
from alfa.study.bench.stats import index_records
from alfa.study.bench.variants import alfa_config


def _dummy_rows(r):
    rows = []
    for k in r.values:
        rows.append(r.swept("alfa", k, r.config.personalize.steps, f"alfa[dummy={k}]", adapter=alfa_config(r.config)))
    return rows


DUMMY = Ablation(
    "dummy",
    "A dummy ablation",
    "Registered by a test.",
    _dummy_rows,
    lambda e: e.compare("alfa[dummy=3]", "alfa", "Three against the default"),
    default_values=(3, 10),
    in_summary=True,
    extra_params=True,
)


@pytest.fixture
def dummy():
    register(DUMMY)
    try:
        yield DUMMY
    finally:
        unregister("dummy")


def test_a_registered_ablation_reaches_the_plan_the_layout_and_the_report(dummy):
    config = BenchConfig.standard(
        methods=(), selected_methods=(), default_methods=(), ablations=("dummy",), pairs=("E→M",), seeds=(0,)
    )  # 10 steps
    config.validate()
    assert [p.id for p in plan_records(config)] == ["alfa[dummy=3]|E→M|seed0", "alfa|E→M|seed0"]
    assert layout(config)["ablations"]["dummy"] == [
        {"label": "alfa[dummy=3]", "value": 3},
        {"label": "alfa", "value": 10},
    ]
    # The stored configuration is the same with or without it (its values are no BenchConfig field).
    assert "dummy" not in str(SELECTION_FIELDS)
    results = {
        "format": FORMAT,
        "version": VERSION,
        "preset": "test",
        # row() gives every seed the same persons; on the first protocol's worlds every comparison is judged (a
        # v2 page judges only its declared family, docs/flip-premise.md §7.1)
        "config": {**config.protocol_dict(), "target_draw": "fixed", "worlds": "v1"},
        "records": [row(m, s, mean + s) for s in (0, 1, 2) for m, mean in (("alfa", 5.0), ("alfa[dummy=3]", 7.0))],
        "layout": layout(config),
    }
    text = render_report(results)
    assert "### A dummy ablation\n\nRegistered by a test.\n" in text
    # with the trainable column
    assert "| alfa[dummy=3] | 3 | 0–2 | 8.00 [5.52, 10.48] | 8.00 [5.52, 10.48] | 1.2 k |" in text
    sentence = (
        "Three against the default: alfa[dummy=3] − Alfa = +2.00° [2.00, 2.00] (95 %, persons and seeds drawn); "
        "clear after Holm over"
    )
    assert f"- {sentence}" in text
    assert f"- (A dummy ablation) {sentence}" in text  # in the summary too


def test_the_registry_is_back_to_the_built_in_ablations_after_a_test(dummy):
    assert "dummy" in REGISTRY
    assert BenchConfig.quick().ablations == tuple(a for a in REGISTRY if a != "dummy")


def _runtime_nodes(node: ast.AST):
    """Every node below ``node`` except what sits under ``if TYPE_CHECKING:`` (imports for type hints only)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and isinstance(child.test, ast.Name) and child.test.id == "TYPE_CHECKING":
            continue
        yield child
        yield from _runtime_nodes(child)


def _bench_imports() -> dict[str, set[str]]:
    """``module -> bench modules it imports when run`` (relative imports, also inside functions), from the source."""
    folder = Path(alfa.study.bench.__file__).parent
    graph = {}
    for path in folder.glob("*.py"):
        names = set()
        for node in _runtime_nodes(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                names |= {node.module} if node.module else {a.name for a in node.names}
        graph[path.stem] = names & {p.stem for p in folder.glob("*.py")}
    return graph


def test_runner_and_report_do_not_import_each_other():
    graph = _bench_imports()

    def reaches(a, b, seen=()):
        return any(d == b or (d not in seen and reaches(d, b, (*seen, d))) for d in graph[a])

    report = {m for m in graph if m.startswith("report_")} | {"flip_report"}
    assert {"report_page", "report_tables", "report_verdicts", "report_prose"} <= report
    running = ("plan", "session", "produce", "runner")
    assert not any(reaches(r, m) or reaches(m, r) for r in running for m in report)
    # the page sits on the tables and the verdicts, never the other way round
    assert not any(reaches(m, "report_page") for m in report)
    cyclic = [m for m in graph if reaches(m, m)]
    assert cyclic == [], f"bench modules in an import cycle: {cyclic}"


def test_a_variant_named_by_what_it_is_does_not_repeat_its_name_as_its_setting():
    idx = index_records([row(m, s, 5.0 + s) for s in (0, 1, 2) for m in ("alfa", "diag_gate")])
    layout_rows = [{"label": "alfa", "value": "attention"}, {"label": "diag_gate", "value": "diagonal gate"}]
    text, pairs = ablation_table(idx, layout_rows)
    assert pairs == ["E→M"]
    assert "| Alfa | attention |" in text
    assert "| diagonal gate | — |" in text and "diagonal gate | diagonal gate" not in text


def _recording_evidence(by_value):
    from alfa.study.bench.ablations import Evidence

    e = Evidence.__new__(Evidence)  # only what the verdicts read: which rows, and whose sentences in what order
    e.by_value, e.present, e.lines, e.said = by_value, set(), [], []
    e.compare = lambda a, b, what: e.said.append(what)
    e.sweep = lambda *args: None
    return e


def test_an_ablations_sentences_go_by_the_value_as_a_number_not_as_text():
    # docs/results.md read "at d=128, d=16, d=32, d=64": the values were sorted as text
    d = {(f, v): f"{f}[d={v}]" for v in (128, 16, 64, 32) for f in ("alfa", "source-only")}
    e = _recording_evidence(d)
    REGISTRY["svd_rank"].verdicts(e)
    assert e.said == [f"Alfa's gain over its own base at d={v}" for v in (16, 32, 64, 128)]
    anchor = {(f, w): f"{f}[anchor={w:g}]" for w in (10.0, 0.5, 2.0) for f in ("alfa", "lora")}
    e = _recording_evidence({("source-only", "none"): "source-only", **anchor})
    REGISTRY["anchor"].verdicts(e)
    weights = [s.split("(weight ")[1].split(")")[0] for s in e.said]
    assert weights == ["0.5"] * 2 + ["2"] * 2 + ["10"] * 2 + ["0.5"] * 2 + ["2"] * 2 + ["10"] * 2 + ["0.5", "2", "10"]
    mixed = {("alfa", v): str(v) for v in ("none", 128, 2.5, "auto", 16)}
    assert [lab for _, lab in _recording_evidence(mixed).in_order()] == ["2.5", "16", "128", "auto", "none"]
