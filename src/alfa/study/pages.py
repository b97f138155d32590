"""The generated pages of ``docs/`` and the committed data each one is made from (``alfa pages``).

Every number in a generated page comes from a command; the command's results are committed under
``docs/data/`` (the records and whatever small data the figures need, never models or adapters), so anyone
can regenerate a page, or check it, without re-running hours of benchmark: ``alfa pages --check``
renders every page from its data into a temporary folder and compares it with the committed files
(``tests/test_pages.py`` does the same); ``alfa pages --write`` rewrites them.

A page (markdown or JSON) must regenerate byte for byte. A figure is compared by what it shows, not by its
PNG's bytes: those change with the matplotlib, freetype and zlib that drew it (matplotlib 3.9 and 3.11 draw
every committed figure to other bytes), so a byte check fails on machines where nothing changed. Every
figure a page owns is saved with :func:`alfa.study.plotted.save_figure`, which writes beside ``x.png`` its
plotted data ``x.plotted.json`` (lines, points, bars, bands, images as digests, titles, labels, legends,
texts; numbers rounded); that file must regenerate byte for byte, and of the PNG only that it is committed
where it is drawn, as a whole PNG file (its chunks and their checksums; a garbage or empty file passed), and not
where it no longer is.

A page is listed once, in :data:`PAGES`, with the command that produced its data and the renderer that turns
the data into the page.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from alfa.fileio import write_bytes, write_text

from .plotted import plotted_data_only, plotted_path

__all__ = ["Page", "PAGES", "render_page", "check_pages", "write_pages", "repo_root"]


@dataclass(frozen=True)
class Page:
    """One generated page: ``path`` (relative to the repository root) is made by ``render`` from ``data``
    (committed, relative to the root); ``figures`` is the folder of figures it owns (every file there must
    be one it draws), if any; ``produce`` is the command that makes the data (and the page) from scratch."""

    path: str
    data: str
    produce: str
    render: Callable[[Path, Path], None]  # (root to read the data from, root to write the page under)
    figures: str | None = None
    owned_figures: tuple[str, ...] = ()  # single figure files it draws outside ``figures``
    more_data: tuple[str, ...] = ()  # further committed data it reads (sections measured on their own)


def _render_results(root: Path, out: Path) -> None:
    from .bench.report_page import build_report

    build_report(
        root / "docs/data/bench-standard",
        out / "docs/results.md",
        command="alfa report --results docs/data/bench-standard --out docs/results.md",
        source="docs/data/bench-standard",
    )


FLIP_DATA = "docs/data/bench-flip"
SELECTED_RECIPES = "src/alfa/gaze/selected_recipes.json"
"""Package data: every adapter method's selected recipe, read by :mod:`alfa.gaze.recipes`."""
"""The flip-premise benchmark's committed results (docs/flip-premise.md): its page and Alfa's default recipe."""


def _render_flip_results(root: Path, out: Path) -> None:
    from .bench.report_page import build_report

    build_report(
        root / FLIP_DATA,
        out / "docs/results-flip.md",
        figure_dir=out / "docs/figures/results-flip",
        command=f"alfa report --results {FLIP_DATA} --out docs/results-flip.md --figures docs/figures/results-flip",
        source=FLIP_DATA,
    )


def _data(path: Path, *keys: str) -> dict:
    """A page's committed data file: a JSON object holding ``keys`` (what its renderer reads first); one that is not
    (cut short, emptied, another file) is named with what is wrong, not a parser's line or a ``KeyError``."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not UTF-8 text") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not the page's data (a JSON {type(data).__name__}, not an object)")
    missing = [k for k in keys if k not in data]
    if missing:
        raise ValueError(f"{path}: not the page's data (no {', '.join(map(repr, missing))})")
    return data


def _render_selected_recipes(root: Path, out: Path) -> None:
    from .bench.flip_report import selected_recipes_json
    from .bench.results import load_results

    text = selected_recipes_json(load_results(root / FLIP_DATA), FLIP_DATA)
    write_text(out / SELECTED_RECIPES, text)


def _render_speed(root: Path, out: Path) -> None:
    from .bench.speed import page_text, speed_command, transformers_path

    result = _data(root / "docs/speed.json", "repeats", "image_size")
    # the transformer section, measured on its own (alfa speed --transformers)
    section = _data(transformers_path(root / "docs/speed.md"))
    command = speed_command("docs/speed.md", result["repeats"], result["image_size"], result.get("threads_given"))
    write_text(out / "docs/speed.md", page_text(result, command, section, "docs/speed.md"))


def _render_serving(root: Path, out: Path) -> None:
    from .bench.serving import THREADS, serving_command, serving_markdown

    result = _data(root / "docs/serving.json", "rounds", "image_size")
    command = serving_command("docs/serving.md", result["rounds"], result["image_size"], result.get("threads", THREADS))
    text = serving_markdown(result, command)
    write_text(out / "docs/serving.md", text)


def _render_loading(root: Path, out: Path) -> None:
    from .bench.loading import loading_page

    page = _data(root / "docs/loading.json", "runs")
    write_text(out / "docs/loading.md", loading_page(page))


COSTS_PAGE = "docs/adapters.md"
"""The hand-written page whose costs section (between its markers) is generated from ``<page>.json``."""


def _render_costs(root: Path, out: Path) -> None:
    from .bench.costs import costs_block, data_path, with_block

    data = _data(data_path(root / COSTS_PAGE), "rows")
    text = with_block((root / COSTS_PAGE).read_text(encoding="utf-8"), costs_block(data), COSTS_PAGE)
    write_text(out / COSTS_PAGE, text)


CRATE_GAZE_DATA = "docs/data/crate-gaze/results.json"
CRATE_GAZE_FIGURE = "docs/figures/crate_gaze_probes.png"


def _render_crate_gaze(root: Path, out: Path) -> None:
    from .crate.gaze_report import format_markdown, plot_gaze_probes

    results = _data(root / CRATE_GAZE_DATA, "probes")
    (out / CRATE_GAZE_FIGURE).parent.mkdir(parents=True, exist_ok=True)
    plot_gaze_probes(results["probes"]["results"], out / CRATE_GAZE_FIGURE, source_name=results["probes"]["source"])
    text = format_markdown(results, figure=Path(CRATE_GAZE_FIGURE).relative_to("docs").as_posix())
    write_text(out / "docs/crate-gaze.md", text)


CRATE_PAGE = "docs/crate.md"
"""The hand-written CRATE page whose plane-toy sections (between their markers) are generated."""
CRATE_TOY_DATA = "docs/data/crate-toy"
CRATE_TOY_SECTIONS = (
    # (the markers' name, the record in CRATE_TOY_DATA, the figure, its alt text)
    ("crate-toy", "toy.json", "docs/figures/crate_toy.png", "the plane toy"),
    ("crate-toy-d-strong", "toy-d-strong.json", "docs/figures/crate_toy_d_strong.png", "panel (d) with η = λ = 1"),
)
CRATE_TOY_COMMANDS = (
    f"alfa crate toy --seeds 20 --data-to {CRATE_TOY_DATA}/toy.json --replace",
    f"alfa crate toy --seeds 20 --panels d --eta 1 --lam 1 --data-to {CRATE_TOY_DATA}/toy-d-strong.json --replace",
    "alfa pages --write",
)
"""How the plane toy's records are made (each record also names the command that made it)."""


def _render_crate_toy(root: Path, out: Path) -> None:
    from .crate.toy_report import load_record, plot_record, toy_section
    from .sections import with_section

    text = (root / CRATE_PAGE).read_text(encoding="utf-8")
    for name, record_file, figure, alt in CRATE_TOY_SECTIONS:
        data = f"{CRATE_TOY_DATA}/{record_file}"
        record = load_record(root / data)
        (out / figure).parent.mkdir(parents=True, exist_ok=True)
        plot_record(record, out / figure)
        link = Path(figure).relative_to(Path(CRATE_PAGE).parent).as_posix()
        text = with_section(text, name, toy_section(record, data=data, figure=link, alt=alt), CRATE_PAGE)
    write_text(out / CRATE_PAGE, text)


CALIBRATION_SCOUTS = "docs/data/calibration-scout"
CALIBRATION_VARIANTS = "docs/data/calibration-variants"
"""Target settings scored with a benchmark model (``scripts/score_variants.py``)."""
CALIBRATION_RECORD = "docs/data/bench-v2"
"""The v2 benchmark's results (its sanity rows are the calibration record), once committed."""


def _render_calibration(root: Path, out: Path) -> None:
    from .bench.calibration import calibration_page
    from .bench.plan import declared_run_progress
    from .bench.results import load_results

    scouts = [_data(p, "name") for p in sorted((root / CALIBRATION_SCOUTS).glob("*.json"))]
    results = load_results(root / CALIBRATION_RECORD)  # committed: a missing one is refused, not "not measured yet"
    found = sorted((root / CALIBRATION_VARIANTS).glob("*.json"))
    variants = [_data(p) for p in found]
    worlds = results["config"].get("worlds", "v1")
    progress = declared_run_progress(worlds, (str(r.get("id")) for r in results["records"]))
    text = calibration_page(
        scouts,
        results,
        data=(CALIBRATION_SCOUTS, CALIBRATION_RECORD, CALIBRATION_VARIANTS),
        command="alfa pages --write",
        variants=variants,
        progress=progress,
    )
    write_text(out / "docs/calibration.md", text)


V2_PAGE = "docs/results-v2.md"
V2_FIGURES = "docs/figures/results-v2"


def _render_v2_results(root: Path, out: Path) -> None:
    from .bench.plan import declared_run_progress
    from .bench.report_page import build_report

    build_report(
        root / CALIBRATION_RECORD,
        out / V2_PAGE,
        figure_dir=out / V2_FIGURES,
        command=f"alfa report --results {CALIBRATION_RECORD} --out {V2_PAGE} --figures {V2_FIGURES}",
        source=CALIBRATION_RECORD,
        progress_of=declared_run_progress,
    )


USER_CALIBRATION_PAGE = "docs/results-user-calibration.md"
USER_CALIBRATION_FIGURES = "docs/figures/results-user-calibration"


def _render_user_calibration(root: Path, out: Path) -> None:
    from .bench.results import load_results
    from .bench.user_calibration_report import user_calibration_page

    results = load_results(root / CALIBRATION_RECORD)
    figures = out / USER_CALIBRATION_FIGURES
    figures.mkdir(parents=True, exist_ok=True)
    link = Path(USER_CALIBRATION_FIGURES).relative_to("docs").as_posix() + "/"
    text = user_calibration_page(results, CALIBRATION_RECORD, "alfa pages --write", figures, link)
    write_text(out / USER_CALIBRATION_PAGE, text)


CAMERA_DATA = "docs/data/camera"
CAMERA_FIGURE = "docs/figures/camera.png"
CAMERA_COMMAND = (
    'alfa pretrain --data "synthetic:eth?size=48&persons=16&images_per_person=20" --val-data '
    '"synthetic:eth?split=val&size=48&persons=4&images_per_person=10" --preset demo --epochs 2 --device cpu '
    "--seed 0 --out runs/camera-model\n"
    "alfa predict skimage:astronaut --checkpoint runs/camera-model/model.safetensors --crops docs/data/camera "
    "--json docs/data/camera/predict.json --replace\n"
    "alfa pages --write"
)
"""How docs/camera.md's data is made: a small model of the synthetic world, then the command the page shows."""


def _render_camera(root: Path, out: Path) -> None:
    from .camera import camera_page, plot_camera

    record = _data(root / CAMERA_DATA / "predict.json", "photos")
    (out / CAMERA_FIGURE).parent.mkdir(parents=True, exist_ok=True)
    plot_camera(record, root / CAMERA_DATA, out / CAMERA_FIGURE)
    write_text(out / "docs/camera.md", camera_page(record, CAMERA_COMMAND, "figures/camera.png"))


SYNTHETIC_PAGE = "docs/synthetic.md"
SYNTHETIC_FIGURE = "docs/figures/synthetic_samples.png"
SYNTHETIC_SAMPLES = "docs/data/synthetic/samples.safetensors"
"""The sample grid's images and labels: committed, because another kind of CPU renders a few bits differently
(``tests/test_synthetic.py`` checks them against the worlds' code within one level of 255)."""


def _render_synthetic(root: Path, out: Path) -> None:
    """docs/synthetic.md's sample grid, from the committed samples, and its tables of the worlds' settings and
    labels, printed from the worlds' code (the rest of the page is written by hand)."""
    from alfa.gaze.data.synthetic.preview import (
        changes_table_markdown,
        domain_table_markdown,
        label_table_markdown,
        load_preview_samples,
        render_preview_grid,
    )

    from .plotted import save_figure
    from .sections import with_section

    text = (root / SYNTHETIC_PAGE).read_text(encoding="utf-8")
    v1 = f"{domain_table_markdown()}\n\n{label_table_markdown(seed=0, version='v1')}"
    v2 = f"{changes_table_markdown('v2')}\n\n{label_table_markdown(seed=0, version='v2')}"
    text = with_section(text, "synthetic-tables-v1", v1, SYNTHETIC_PAGE)
    write_text(out / SYNTHETIC_PAGE, with_section(text, "synthetic-tables-v2", v2, SYNTHETIC_PAGE))
    samples = load_preview_samples(root / SYNTHETIC_SAMPLES)
    render_preview_grid(out / SYNTHETIC_FIGURE, samples, save=lambda fig, path: save_figure(fig, path, dpi=110))


LLM_DATA = "docs/data/llm/bench.json"


def _render_llm(root: Path, out: Path) -> None:
    from .llm.report import llm_page

    result = _data(root / LLM_DATA, "selected_rates")
    write_text(out / "docs/llm.md", llm_page(result, LLM_DATA))


def _render_architecture(root: Path, out: Path) -> None:
    from .dataflow import render_architecture

    render_architecture(root, out)


PAGES: tuple[Page, ...] = (
    Page(
        path="docs/results.md",
        data="docs/data/bench-standard",
        produce="alfa bench --first-standard (in pieces), then alfa report --results runs/bench-standard "
        "--data-to docs/data/bench-standard --out docs/results.md",
        render=_render_results,
        figures="docs/figures/results",
    ),
    Page(
        path="docs/results-flip.md",
        data=FLIP_DATA,
        produce="alfa bench --first-standard --out runs/bench-flip (in pieces, docs/results-flip.md § Runs), then "
        "alfa report --results "
        f"runs/bench-flip --data-to {FLIP_DATA} --out docs/results-flip.md",
        render=_render_flip_results,
        figures="docs/figures/results-flip",
    ),
    Page(
        path=SELECTED_RECIPES,
        data=FLIP_DATA,
        produce=f"alfa pages --write (from {FLIP_DATA}: each method's recipe selected for the E source, seeds pooled)",
        render=_render_selected_recipes,
    ),
    Page(
        path="docs/speed.md",
        data="docs/speed.json",
        produce="alfa speed --out docs/speed.md, then alfa speed --transformers --out docs/speed.md",
        render=_render_speed,
        more_data=("docs/speed-transformers.json",),
    ),
    Page(
        path="docs/serving.md",
        data="docs/serving.json",
        produce="alfa serving --out docs/serving.md",
        render=_render_serving,
    ),
    Page(
        path="docs/loading.md",
        data="docs/loading.json",
        produce="alfa throughput (the command is in the page)",
        render=_render_loading,
    ),
    Page(
        path=COSTS_PAGE,
        data="docs/adapters.json",
        produce="OMP_WAIT_POLICY=passive alfa costs --threads 2 --update-doc docs/adapters.md (its costs section; the "
        "rest of the page is written by hand)",
        render=_render_costs,
    ),
    Page(
        path="docs/crate-gaze.md",
        data=CRATE_GAZE_DATA,
        produce="alfa crate gaze --out runs/crate-gaze --seed 0 --markdown docs/crate-gaze.md, then copy "
        f"runs/crate-gaze/results.json to {CRATE_GAZE_DATA}",
        render=_render_crate_gaze,
        owned_figures=(CRATE_GAZE_FIGURE,),
    ),
    Page(
        path=CRATE_PAGE,
        data=CRATE_TOY_DATA,
        produce=", then ".join(CRATE_TOY_COMMANDS) + " (the plane toy's sections; the rest of the page is written by "
        "hand)",
        render=_render_crate_toy,
        owned_figures=tuple(figure for _, _, figure, _ in CRATE_TOY_SECTIONS),
    ),
    Page(
        path="docs/calibration.md",
        data=CALIBRATION_SCOUTS,
        produce="python scripts/scout_worlds.py (the scouts; each file has its command) and the v2 benchmark's "
        f"sanity rows in {CALIBRATION_RECORD}, then alfa pages --write",
        render=_render_calibration,
        more_data=(CALIBRATION_RECORD,),
    ),
    Page(
        path=V2_PAGE,
        data=CALIBRATION_RECORD,
        produce="alfa bench --standard --out runs/bench-v2 … (the second protocol, in the pieces of "
        "docs/flip-premise.md §7.2: scripts/queues/*.txt), then bash scripts/keep_records.sh",
        render=_render_v2_results,
        figures=V2_FIGURES,
    ),
    Page(
        path=USER_CALIBRATION_PAGE,
        data=CALIBRATION_RECORD,
        produce="alfa bench --standard --methods calibrate-affine,… (in pieces: scripts/queues/user-calibration.txt), "
        "then bash scripts/keep_records.sh (the records into docs/data/bench-v2, and every page)",
        render=_render_user_calibration,
        figures=USER_CALIBRATION_FIGURES,
    ),
    Page(
        path="docs/camera.md",
        data=CAMERA_DATA,
        produce=CAMERA_COMMAND.replace("\n", ", then "),
        render=_render_camera,
        owned_figures=(CAMERA_FIGURE,),
    ),
    Page(
        path=SYNTHETIC_PAGE,
        data=SYNTHETIC_SAMPLES,
        produce=f"python -m alfa.gaze.data.synthetic --samples-to {SYNTHETIC_SAMPLES}, then alfa pages --write (the "
        "sample grid from those samples, the tables of the worlds' settings and labels from the worlds' code; the "
        "rest of the page is written by hand)",
        render=_render_synthetic,
        owned_figures=(SYNTHETIC_FIGURE,),
    ),
    Page(
        path="docs/llm.md",
        data=LLM_DATA,
        produce=f"alfa llm bench --out runs/llm/bench --data-to {LLM_DATA} --markdown docs/llm.md (its step times "
        f"again, without the pretraining: alfa llm time --record {LLM_DATA} --replace --markdown docs/llm.md)",
        render=_render_llm,
    ),
    Page(
        path="docs/architecture.md",
        data="src/alfa/study/dataflow.py",
        produce="alfa pages --write (the data-flow picture, from alfa.study.dataflow.FLOWS; the rest is written)",
        render=_render_architecture,
    ),
)


def repo_root() -> Path:
    """The repository this package is installed from (where ``docs/`` is)."""
    return Path(__file__).resolve().parents[3]


def render_page(page: Page, root: Path, out: Path) -> list[Path]:
    """Render ``page`` from the data under ``root`` into ``out``; the files it wrote, relative to ``out``."""
    page.render(root, out)
    return sorted(p.relative_to(out) for p in out.rglob("*") if p.is_file())


FIGURE_SUFFIX = ".png"
"""Files with this suffix are figures: compared by their plotted data (:func:`alfa.study.plotted.plotted_path`)."""


def _committed(page: Page, root: Path) -> set[Path]:
    """The files of ``page`` committed under ``root``: the page, its single figures with their plotted data,
    and everything in its figure folder."""
    files = {Path(page.path)}
    for figure in map(Path, page.owned_figures):
        files |= {figure, plotted_path(figure)}
    if page.figures is not None and (root / page.figures).is_dir():
        files |= {p.relative_to(root) for p in (root / page.figures).iterdir()}
    return {f for f in files if (root / f).is_file()}


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_damage(path: Path) -> str | None:
    """What makes the file at ``path`` no whole PNG image (``None`` where it is one): its signature, its chunks'
    lengths and checksums, an image header of a non-empty size first and the end chunk last. Its pixels are not
    decoded: the plotted data beside it says what it shows."""
    import struct
    import zlib

    data = path.read_bytes()
    if not data.startswith(PNG_SIGNATURE):
        return "no PNG signature" if data else "an empty file"
    at, kinds = len(PNG_SIGNATURE), []
    while at < len(data):
        if at + 12 > len(data):
            return "cut short"
        (length,) = struct.unpack(">I", data[at : at + 4])
        kind, body = data[at + 4 : at + 8], data[at + 8 : at + 8 + length]
        if at + 12 + length > len(data):  # the chunk's body or its checksum runs past the file's end
            return "cut short"
        (crc,) = struct.unpack(">I", data[at + 8 + length : at + 12 + length])
        if zlib.crc32(kind + body) != crc:
            return f"chunk {kind.decode('latin-1')!r} fails its checksum"
        if not kinds and (kind != b"IHDR" or length < 8 or 0 in struct.unpack(">II", body[:8])):
            return "no image header of a non-empty size first"
        kinds.append(kind)
        at += 12 + length
    return None if kinds and kinds[-1] == b"IEND" else "no end chunk"


def page_differences(page: Page, root: Path, out: Path, made: set[Path]) -> list[str]:
    """What differs between the committed files of ``page`` under ``root`` and those rendered into ``out``."""
    figure_of = {plotted_path(rel): rel for rel in made if rel.suffix == FIGURE_SUFFIX}
    problems = []
    for rel in sorted(made | _committed(page, root)):
        if rel not in made:
            problems.append(f"{rel}: committed, but {page.path}'s data no longer draws it")
        elif not (root / rel).is_file():
            problems.append(f"{rel}: drawn from {page.data} but not committed")
        elif rel.suffix == FIGURE_SUFFIX:
            # its bytes are the drawing library's; what it shows is compared in its plotted data
            if plotted_path(rel) not in made:
                problems.append(f"{rel}: drawn without its plotted data (save it with alfa.study.plotted.save_figure)")
            elif (damage := png_damage(root / rel)) is not None:  # its data alone passed a garbage or empty file
                problems.append(f"{rel}: not a whole PNG image ({damage}; run: alfa pages --write)")
        elif (root / rel).read_bytes() != (out / rel).read_bytes():
            if rel in figure_of:
                problems.append(
                    f"{figure_of[rel]}: shows other data than {page.data} draws ({rel.name} differs; "
                    "run: alfa pages --write)"
                )
            else:
                problems.append(f"{rel}: differs from what {page.data} renders to (run: alfa pages --write)")
    return problems


def check_pages(root: Path | None = None, pages: tuple[Page, ...] = PAGES) -> list[str]:
    """Every difference between the committed pages (and their figures) and what their data render to; an
    empty list when every page regenerates byte for byte and every figure plots the same data (its PNG is
    only required to be there; see the module docstring)."""
    root = repo_root() if root is None else root
    problems: list[str] = []
    for page in pages:
        missing = [d for d in (page.data, *page.more_data) if not (root / d).exists()]
        if missing:
            problems.append(f"{page.path}: its data is missing: {', '.join(missing)} (made by: {page.produce})")
            continue
        with tempfile.TemporaryDirectory() as tmp, plotted_data_only():  # a PNG's bytes are not compared
            out = Path(tmp)
            problems += page_differences(page, root, out, set(render_page(page, root, out)))
    return problems


def write_pages(root: Path | None = None, pages: tuple[Page, ...] = PAGES) -> list[Path]:
    """Regenerate every page and its figures (each PNG and its plotted data) from the committed data, in
    place; the files written. Every page is rendered before any is written: a page whose render fails (its data
    missing or refused) leaves every committed file as it was; a ``ValueError`` is named with the page."""
    root = repo_root() if root is None else root
    with tempfile.TemporaryDirectory() as tmp:
        rendered: list[tuple[Path, Path]] = []  # (the page's render folder, a file in it)
        for i, page in enumerate(pages):
            out = Path(tmp) / str(i)
            out.mkdir()
            try:
                rendered += [(out, rel) for rel in render_page(page, root, out)]
            except ValueError as e:
                raise ValueError(f"{page.path}: {e}; nothing was written") from e
        for out, rel in rendered:
            write_bytes(root / rel, (out / rel).read_bytes())
    return [rel for _, rel in rendered]
