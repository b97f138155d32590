"""The data-flow picture of ``docs/architecture.md``: what is made from what, and by which function.

The picture is drawn from :data:`FLOWS` (a Mermaid flowchart between the page's ``data-flow`` markers, which
``alfa pages --write`` fills in and ``alfa pages --check`` compares), so it is made by a command rather than
by hand, and every step names the function that makes it: ``tests/test_dataflow.py`` imports each one, so a
renamed or moved function breaks the test instead of leaving the picture wrong.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path

from alfa.fileio import write_text

__all__ = ["Node", "Flow", "NODES", "FLOWS", "PACKAGES", "resolve", "mermaid", "render_architecture"]

PAGE = "docs/architecture.md"
BEGIN, END = "<!-- data-flow:begin -->", "<!-- data-flow:end -->"

PACKAGES = {"library": "alfa (the library)", "application": "alfa.gaze (the application)", "study": "alfa.study"}
"""Where a thing lives, as the picture's boxes name it."""


@dataclass(frozen=True)
class Node:
    """One kind of thing that flows: its id in the picture, what it is, and the package whose code holds it."""

    id: str
    label: str
    package: str


@dataclass(frozen=True)
class Flow:
    """One step: ``function`` (a dotted path) makes ``target`` from ``sources``."""

    sources: tuple[str, ...]
    target: str
    function: str


NODES: tuple[Node, ...] = (
    Node("spec", "dataset spec<br/>synthetic:eth?… · gazehub:… · xgaze-h5:…", "application"),
    Node("dataset", "GazeDataset<br/>images, gaze labels, persons", "application"),
    Node("dense", "source model<br/>dense, safetensors checkpoint", "application"),
    Node("base", "truncated base<br/>W ≈ U_d · V_base, recovered", "library"),
    Node("method", "adapter method<br/>alfa.adapters.METHODS", "library"),
    Node("recipe", "recipe and objective<br/>selected_recipes.json · OBJECTIVES", "application"),
    Node("faze", "FAZE model<br/>DT-ED and gaze MLP, dense", "application"),
    Node("adagen", "meta-learned FAZE<br/>AdaGEN: the gaze MLP by MAML", "application"),
    Node("adapters", "per-user adapters<br/>one safetensors file per person", "library"),
    Node("report", "per-person errors<br/>EvaluationReport", "application"),
    Node("demo", "runs/demo/…/results.json<br/>and per_person.png", "application"),
    Node("record", "benchmark records<br/>Record → results.json", "study"),
    Node("pages", "generated pages<br/>docs/results*.md", "study"),
    Node("served", "predictions per user<br/>one batch, one base", "library"),
    Node("onnx", "merged model<br/>ONNX / torch.export", "library"),
)

FLOWS: tuple[Flow, ...] = (
    Flow(("spec",), "dataset", "alfa.gaze.data.open_dataset"),
    Flow(("dataset",), "dense", "alfa.gaze.train.train_source"),
    Flow(("dense", "dataset"), "base", "alfa.gaze.train.truncate_and_recover"),
    Flow(("base", "method", "recipe", "dataset"), "adapters", "alfa.gaze.personalize.personalize_dataset"),
    Flow(("dataset",), "faze", "alfa.gaze.faze_train.train_faze"),
    Flow(("faze", "dataset"), "adagen", "alfa.gaze.faze_train.meta_train_faze"),
    # user calibration from k labelled images, on any gaze model: dense, truncated, or FAZE's (PS-GEN)
    Flow(("dense", "base", "adagen", "dataset"), "adapters", "alfa.gaze.calibrate.calibrate_dataset"),
    Flow(("base", "adapters", "dataset"), "report", "alfa.gaze.evaluate.evaluate"),
    Flow(("report",), "demo", "alfa.gaze.pipeline.run_demo"),
    Flow(("report",), "record", "alfa.study.bench.produce.produce_record"),
    Flow(("record",), "pages", "alfa.study.bench.report_page.build_report"),
    Flow(("base", "dense", "adapters"), "served", "alfa.serve.MultiUserModel"),  # dense: calibrated users only
    Flow(("base", "adapters"), "onnx", "alfa.export.export_onnx"),
)


def resolve(dotted: str) -> object:
    """The object a dotted path names (``alfa.gaze.train.train_source``): the longest importable module prefix,
    then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(f"nothing importable in {dotted!r}")


def mermaid(nodes: tuple[Node, ...] = NODES, flows: tuple[Flow, ...] = FLOWS) -> str:
    """The Mermaid flowchart: one box per package holding its nodes; each step an arrow from every source to its
    target, labelled with the function's name (its module in the legend below the chart)."""
    lines = ["```mermaid", "flowchart TD"]
    for package, title in PACKAGES.items():
        members = [n for n in nodes if n.package == package]
        if members:
            lines.append(f'    subgraph {package}["{title}"]')
            lines += [f'        {n.id}["{n.label}"]' for n in members]
            lines.append("    end")
    for flow in flows:
        name = flow.function.rsplit(".", 1)[1]
        lines += [f"    {source} -- {name} --> {flow.target}" for source in flow.sources]
    lines.append("```")
    legend = [f"- `{flow.function}`: {' + '.join(flow.sources)} → {flow.target}" for flow in flows]
    return "\n".join(lines + ["", "Each arrow is one function:", "", *legend])


def render_architecture(root: Path, out: Path) -> None:
    """``docs/architecture.md`` as committed under ``root``, with the part between the data-flow markers drawn
    from :data:`FLOWS`, written under ``out``."""
    text = (root / PAGE).read_text(encoding="utf-8")
    if BEGIN not in text or END not in text:
        raise ValueError(f"{PAGE} has no {BEGIN} … {END} markers for the data-flow picture")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    write_text(out / PAGE, f"{head}{BEGIN}\n{mermaid()}\n{END}{tail}")
