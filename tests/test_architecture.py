"""The package's layering, checked on the source: imports go down the layer table and never in a circle.

Every module of ``src/alfa`` is parsed with ``ast``; every import in it counts (top-level and inside
functions, relative and absolute ``alfa.`` imports), so a late import cannot hide a dependency. An import
of ``alfa.x.y`` is an edge to the module ``alfa.x.y`` only: Python runs the parent packages' ``__init__``
too, but counting that would make everything depend on the package facade.

The rules (``docs/architecture.md`` states the same table):

* no cycle between modules, whatever their packages;
* a module may import modules of its own component (``alfa.gaze.*`` from ``alfa.gaze.*``) in any
  direction, and modules of components in *lower* layers; never a higher layer, and never another
  component of its own layer (components of one layer are independent of each other);
* every component of the package is in the table (a new top-level module must be given a layer).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src"

# Bottom to top. A component is a module or subpackage of alfa named by its path below ``alfa``
# (``gaze.data`` is alfa.gaze.data and everything in it); a module belongs to the longest component that
# prefixes it, so ``gaze`` is alfa.gaze less the components inside it. "alfa" is the package's own __init__
# (the public library API, re-exporting the layers below it).
LIBRARY_LAYERS: list[tuple[str, ...]] = [
    ("fileio",),  # atomic writes, file names
    ("locks",),  # holding a folder, taking turns on a file
    ("layers",),  # factorized Conv2d / Linear and the SVD helpers
    ("surgery",),  # replacing modules of a model; tied parameters, the save_pretrained guard, generic markers
    ("truncate",),  # SVD truncation of a model
    ("models", "adapters"),  # model families; adapter methods (model-agnostic: they never import models)
    ("checkpoint", "summary", "serve", "export"),  # model files; parameter counts; many users; ONNX export
    ("alfa",),  # the package __init__: the library's public API
]
APPLICATION_LAYERS: list[tuple[str, ...]] = [
    ("gaze.geometry",),  # gaze angles and vectors, the datasets' conventions
    ("gaze.data", "gaze.camera"),  # the synthetic worlds and the dataset loaders; photos to normalized crops
    ("gaze",),  # source training, personalization, user calibration, FAZE and PnP-GA, evaluation, the demo
    ("gaze.service",),  # the HTTP gaze service
]
STUDY_LAYERS: list[tuple[str, ...]] = [
    # what a figure plots, saved beside it (the page check compares that); timings' paired ratios and their machine;
    # a generated section of a hand-written page
    ("study.plotted", "study.timing", "study.sections"),
    # CRATE's examples; the benchmark; the data-flow picture; the camera page (docs/camera.md); the small language
    # model study (docs/llm.md)
    ("study.crate", "study.bench", "study.dataflow", "study.camera", "study.llm"),
    ("study.example", "study.pages"),  # the library tour (alfa example); the generated pages of docs/
    ("study",),  # the study package's __init__
]
COMMAND_LAYERS: list[tuple[str, ...]] = [
    ("cli",),  # the `alfa` command
    ("__main__",),  # `python -m alfa` (what torchrun starts): runs the command
]
LAYERS: list[tuple[str, ...]] = LIBRARY_LAYERS + APPLICATION_LAYERS + STUDY_LAYERS + COMMAND_LAYERS
LIBRARY = {c for row in LIBRARY_LAYERS for c in row}


def layer_of(layers: list[tuple[str, ...]]) -> dict[str, int]:
    """Component -> layer index (0 is the bottom); a component listed twice is an error in the table."""
    index: dict[str, int] = {}
    for i, components in enumerate(layers):
        for c in components:
            if c in index:
                raise ValueError(f"component {c!r} is in two layers")
            index[c] = i
    return index


def component(module: str, components: set[str] | None = None) -> str:
    """The component a module belongs to: the longest of ``components`` that prefixes it, else the first
    part below the package (``alfa.gaze.train`` -> ``gaze``; ``alfa.gaze.data.base`` -> ``gaze.data``
    when ``gaze.data`` is a component; ``alfa`` -> ``alfa``)."""
    parts = module.split(".")
    if len(parts) == 1:
        return parts[0]
    below = parts[1:]
    for n in range(len(below), 0, -1):
        if components and ".".join(below[:n]) in components:
            return ".".join(below[:n])
    return below[0]


# ----------------------------------------------------------------------------- the import graph


def discover(src: Path, package: str = "alfa") -> dict[str, Path]:
    """Every module of ``package`` under ``src``: dotted name -> file (a package is its ``__init__``)."""
    modules = {}
    for path in sorted((src / package).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _resolve(module: str, is_package: bool, level: int, target: str | None) -> str:
    """The absolute module a ``from <dots><target> import …`` in ``module`` names."""
    if level == 0:
        return target or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    if level > 1:
        base = base[: -(level - 1)]
    return ".".join(base + ([target] if target else []))


def imports_of(module: str, tree: ast.AST, is_package: bool, known: set[str], package: str = "alfa") -> set[str]:
    """The modules of ``known`` that ``module`` imports anywhere in ``tree``.

    ``from X import name`` is an edge to ``X.name`` where that is a module (``from . import crate``),
    else to ``X``. An import of a module of ``package`` that does not exist is an error: it would fail at
    run time, and it would silently drop out of the graph.
    """
    edges: set[str] = set()

    # Imports under ``if TYPE_CHECKING:`` count like any other: they never run, but a module that needs
    # another's types to be read depends on it, and a circle through annotations is still a circle.
    def add(name: str, where: ast.AST) -> None:
        if name != package and not name.startswith(package + "."):
            return  # torch, numpy, the standard library
        if name not in known:
            raise ImportError(f"{module} (line {where.lineno}) imports {name}, which is not a module of {package}")
        edges.add(name)

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node)
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, is_package, node.level, node.module)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                add(sub if sub in known else base, node)
    edges.discard(module)
    return edges


def import_graph(src: Path = SRC, package: str = "alfa") -> dict[str, set[str]]:
    """Module -> the package modules it imports."""
    modules = discover(src, package)
    known = set(modules)
    return {
        name: imports_of(name, ast.parse(path.read_text(encoding="utf-8")), path.name == "__init__.py", known, package)
        for name, path in modules.items()
    }


# ----------------------------------------------------------------------------- the checks


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (``[a, b, …, a]``) per strongly connected group of modules that import each other."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def connect(v: str) -> None:  # Tarjan's algorithm; the graph is small, recursion is fine
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.add(w)
                if w == v:
                    break
            if len(group) > 1 or v in graph.get(v, ()):
                groups.append(group)

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return [_cycle_in(graph, group) for group in groups]


def _cycle_in(graph: dict[str, set[str]], group: set[str]) -> list[str]:
    """A concrete cycle through the group's first module (breadth-first, so the shortest)."""
    start = min(group)
    paths = {start: [start]}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(graph.get(v, ()) & group):
            if w == start:
                return paths[v] + [start]
            if w not in paths:
                paths[w] = paths[v] + [w]
                queue.append(w)
    raise AssertionError(f"no cycle through {start}")  # cannot happen for a strongly connected group


def layer_violations(graph: dict[str, set[str]], layers: list[tuple[str, ...]]) -> list[str]:
    """Every import that goes up the table or sideways to another component of the same layer."""
    rank = layer_of(layers)
    out = []
    for module in sorted(graph):
        for target in sorted(graph[module]):
            a, b = component(module, set(rank)), component(target, set(rank))
            if a == b or a not in rank or b not in rank:
                continue  # inside one component; unplaced components are reported by unplaced()
            if rank[b] > rank[a]:
                out.append(f"{module} imports {target}: layer {rank[a]} ({a}) may not import layer {rank[b]} ({b})")
            elif rank[b] == rank[a]:
                why = f"{a} and {b} share layer {rank[a]} and must not import each other"
                out.append(f"{module} imports {target}: {why}")
    return out


def unplaced(graph: dict[str, set[str]], layers: list[tuple[str, ...]]) -> list[str]:
    """Components of the package that the table does not place."""
    rank = layer_of(layers)
    return sorted({component(m, set(rank)) for m in graph} - set(rank))


# ----------------------------------------------------------------------------- the package


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph()


def test_the_package_is_found(graph):
    assert {"alfa", "alfa.gaze.train", "alfa.models.resnet", "alfa.gaze.data.synthetic"} <= set(graph)
    assert "alfa.checkpoint" in graph["alfa.gaze.train"]  # the walk sees imports


def test_every_component_has_a_layer(graph):
    assert unplaced(graph, LAYERS) == [], "give these a row in LAYERS and in docs/architecture.md"


def test_no_import_cycle(graph):
    cycles = find_cycles(graph)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_imports_go_down_the_layers(graph):
    problems = layer_violations(graph, LAYERS)
    assert not problems, "imports against the layer table:\n" + "\n".join(problems)


def test_the_doc_states_the_same_table():
    # The doc's table lists each layer's components in backquotes, top row first.
    doc = (SRC.parent / "docs" / "architecture.md").read_text(encoding="utf-8")
    rows = [line for line in doc.splitlines() if line.startswith("| ") and line[2:3].isdigit()]
    stated = {int(r.split("|")[1]): set(r.split("|")[2].replace("`", "").replace(",", " ").split()) for r in rows}
    assert stated == {i: set(components) for i, components in enumerate(LAYERS)}


# ----------------------------------------------------------------------------- the checker itself


def test_checker_reports_an_upward_import_a_sideways_one_and_a_cycle(tmp_path):
    files = {
        "pkg/__init__.py": "",
        "pkg/low.py": "def f():\n    from .high import g  # late, still counted\n",
        "pkg/high/__init__.py": "from .a import x\n",
        "pkg/high/a.py": "from . import b\nx = 1\n",
        "pkg/high/b.py": "import pkg.high.a\nfrom ..low import f\n",
        "pkg/side.py": "from pkg import high\n",
        "pkg/typed.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .high import a\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    g = import_graph(tmp_path, "pkg")
    assert g["pkg.low"] == {"pkg.high"}
    assert g["pkg.high.a"] == {"pkg.high.b"} and g["pkg.high.b"] == {"pkg.high.a", "pkg.low"}
    assert g["pkg.side"] == {"pkg.high"}
    assert g["pkg.typed"] == {"pkg.high.a"}  # a TYPE_CHECKING import is an edge like any other
    layers = [("low",), ("high", "side", "typed")]
    assert layer_violations(g, layers) == [
        "pkg.low imports pkg.high: layer 0 (low) may not import layer 1 (high)",
        "pkg.side imports pkg.high: side and high share layer 1 and must not import each other",
        "pkg.typed imports pkg.high.a: typed and high share layer 1 and must not import each other",
    ]
    # A nested component is apart from its parent: pkg.high.b is "high.b" once the table names it.
    nested = [("low",), ("high.b",), ("high", "side", "typed")]
    assert "pkg.high.b imports pkg.high.a: layer 1 (high.b) may not import layer 2 (high)" in layer_violations(
        g, nested
    )
    cycles = find_cycles(g)
    assert sorted(map(tuple, cycles)) == [
        ("pkg.high", "pkg.high.a", "pkg.high.b", "pkg.low", "pkg.high"),
    ]
    assert unplaced(g, [("low",)]) == ["high", "pkg", "side", "typed"]  # "pkg": the package's own __init__
    assert find_cycles({"a": {"b"}, "b": set()}) == [] and find_cycles({"a": {"a"}}) == [["a", "a"]]


def test_checker_refuses_an_import_of_a_missing_module(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "a.py").write_text("from .gone import x\n")
    with pytest.raises(ImportError, match=r"pkg.a \(line 1\) imports pkg.gone"):
        import_graph(tmp_path, "pkg")


# ----------------------------------------------------------------------------- sizes and the library's dependencies

MAX_FILE_LINES = 800
MAX_FUNCTION_LINES = 100


def oversized(src: Path = SRC, package: str = "alfa") -> list[str]:
    """Source files over MAX_FILE_LINES lines and functions over MAX_FUNCTION_LINES (``def`` line to last
    line, docstring included, decorators not)."""
    out = []
    for path in sorted((src / package).rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        name = path.relative_to(src).as_posix()
        if (n := len(text.splitlines())) > MAX_FILE_LINES:
            out.append(f"{name}: {n} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if (n := node.end_lineno - node.lineno + 1) > MAX_FUNCTION_LINES:
                    out.append(f"{name}:{node.lineno} {node.name}: {n} lines")
    return out


def test_no_file_over_800_lines_and_no_function_over_100():
    root = SRC.parent  # the tests and scripts keep the rule too
    problems = oversized() + oversized(root, "tests") + oversized(root, "scripts")
    assert not problems, "split these:\n" + "\n".join(problems)


def test_the_size_check_sees_a_long_file_and_a_long_function(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "long.py").write_text("x = 1\n" * 801)
    (tmp_path / "pkg" / "f.py").write_text("def f():\n" + "    y = 1\n" * 100 + "\n\ndef g():\n    pass\n")
    assert oversized(tmp_path, "pkg") == ["pkg/f.py:1 f: 101 lines", "pkg/long.py: 801 lines"]


# What the library (LIBRARY_LAYERS) may import beyond the standard library. onnxruntime is export's
# optional check (the [export] extra), imported only after find_spec says it is there.
LIBRARY_THIRD_PARTY = {"torch", "numpy", "safetensors", "onnxruntime"}


def third_party_imports(path: Path) -> set[str]:
    """Top-level names of the non-standard-library modules a file imports (relative imports excluded)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return {n for n in names if n not in sys.stdlib_module_names and n != "alfa"}


def test_the_library_imports_only_torch_numpy_and_safetensors(graph):
    library = [m for m in graph if component(m, LIBRARY) in LIBRARY]
    assert "alfa.adapters.lora" in library and not any(m.startswith(("alfa.gaze", "alfa.study")) for m in library)
    found = {m: third_party_imports(Path(discover(SRC)[m])) - LIBRARY_THIRD_PARTY for m in library}
    assert not {m: s for m, s in found.items() if s}, "the library must not need these packages"
    for m in library:  # and nothing of the application, the study or the command
        assert all(component(t, LIBRARY) in LIBRARY for t in graph[m]), f"{m} imports above the library: {graph[m]}"
