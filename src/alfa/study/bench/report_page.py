"""``results.json`` → ``docs/results.md`` and its figures (``alfa report``). Never edit the output by hand.

The page is assembled here: which sections it has, in which order, under which headings, and which table,
verdicts and figures each one shows. Every number and every sentence comes from the records of a benchmark
run (:mod:`alfa.study.bench.runner`): the tables from :mod:`~alfa.study.bench.report_tables` (the mean over seeds
of each record's mean over persons, with its 95 % interval), the verdicts from
:mod:`~alfa.study.bench.report_verdicts` (who wins where, each difference with its interval and whether it is
clear), the protocol from the configuration stored in ``results.json``, the figures from
:mod:`~alfa.study.bench.report_figures`, and the fixed words from :mod:`~alfa.study.bench.report_prose`.
Re-running the command regenerates the same file.

The page is one family of comparisons (:class:`~alfa.study.bench.stats.Comparisons`): it is rendered twice,
the first time to make every comparison it quotes, the second to quote them judged together (Holm's
correction over all of them), and its Summary states that family.
"""

from __future__ import annotations

import os
import re
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from alfa.fileio import write_text
from alfa.gaze.views import ROLL_DEGREES

from . import figures as F
from . import report_prose as prose
from .ablations import REGISTRY, table_layout
from .calibration import calibration_statement, declared_run_paragraph
from .flip_report import constructed_control_section, flip_sections, flip_summary
from .markdown import byte_size, degrees_detected, seeds_words, span
from .methods import (
    CONSTRUCTED_CONTROLS,
    DECLARED_FAMILY,
    POSITIVE_CONTROLS,
    SOURCE_TRAINING,
    SOURCES,
    STAND_INS,
    TARGETS,
    TTA_ROW_OF_KIND,
    parse_calibration_label,
    table_methods,
    with_tta_rows,
    world_name,
)
from .names import display_name
from .record import Record, as_records
from .report_figures import ablation_curves, default_figure_dir, render_figures, update_rank_lines
from .report_tables import (
    ablation_table,
    cost_rows,
    cost_table,
    parts_table,
    person_table,
    pnpga_domain_table,
    records_of,
    runs_table,
    sanity_table,
    source_table,
    table1,
    table1_rows,
    table2,
    tpgaze_table,
)
from .report_verdicts import ablation_verdicts, main_verdicts, parts_verdicts, sanity_verdicts
from .results import FIGURE_DIR, UPDATES_FILE, load_results
from .stats import Comparisons, Index, described, design_of, index_records, pairs_of, seeds_of

if TYPE_CHECKING:  # the caller computes the progress: a page module never imports the runner's plan
    from .plan import DeclaredRunProgress

__all__ = ["render_report", "build_report"]


@dataclass
class _Report:
    """What every section of the report is written from: the records (indexed), the stored layout, the
    figures, and the verdicts that more than one section quotes."""

    results: dict[str, Any]
    figures: dict[str, Path]
    figure_data: Any
    md_dir: Path | None
    command: str
    source: str
    records: list[Record]
    idx: Index  # the records indexed, with the page's family of comparisons
    progress: DeclaredRunProgress | None = None  # how much of a declared run the records hold, where one is
    drawn: bool = True  # figures were drawn for this page (render_report without them draws none and says nothing)

    def __post_init__(self) -> None:
        self.family = self.idx.family
        self.layout: dict[str, list[dict[str, Any]]] = self.results.get("layout", {}).get("ablations", {})
        self.seeds = seeds_of(self.idx)
        self.present = {m for (m, _, _) in self.idx}  # the rows with records
        self.main = main_verdicts(self.idx)
        self.sanity = sanity_verdicts(self.idx)
        parts_rows = with_tta_rows(("source-only", *table_methods()[1:], "oracle"))
        self.parts_methods = [m for m in parts_rows if records_of(self.idx, m)]
        self.parts = parts_verdicts(self.idx, self.parts_methods)

    def figure(self, name: str, caption: str) -> list[str]:
        """The lines that show figure ``name`` (none if it was not drawn)."""
        if name not in self.figures:
            return []
        path = self.figures[name]
        rel = os.path.relpath(path, self.md_dir) if self.md_dir is not None else str(path)
        return [f"![{caption}]({rel})", "", f"*{caption}*", ""]


def _bullets(sentences: Iterable[str]) -> list[str]:
    return [f"- {s}" for s in sentences]


def _ablation_title(name: str) -> tuple[str, str]:
    """An ablation's section title and what it changes (a name this alfa does not know: the name)."""
    ablation = REGISTRY.get(name)
    return (ablation.title, ablation.what) if ablation is not None else (name, "")


# ----------------------------------------------------------------------------- the protocol's words


def _scale_words(scale: dict[str, float] | None) -> str:
    if not scale:
        return prose.SAME_RATE
    return prose.SCALED_RATE.format(
        scales=", ".join(prose.SCALED_PARAMETER.format(factor=v, name=k) for k, v in scale.items())
    )


def _worlds(results: dict[str, Any]) -> str:
    """The version of the worlds the results ran on (files made before there were versions: ``v1``)."""
    return results.get("config", {}).get("worlds", "v1")


def _positive_control_words(results: dict[str, Any], idx: Index) -> list[str]:
    """The asymmetric worlds' part of the Data bullet (nothing for results without positive controls)."""
    if not any(p in POSITIVE_CONTROLS for p in pairs_of(idx)):
        return []
    changes = ", ".join(f"{k} = {v:g}" for k, v in SOURCE_TRAINING.get("S", {}).items())
    version = _worlds(results)
    worlds = {k: world_name(v, version) for k, v in {"source": SOURCES["S"], "target_w": TARGETS["W"]}.items()}
    facts = {**worlds, "changes": changes, "target_c": world_name(TARGETS["C"], version)}
    return [fragment.format(**facts) for fragment in prose.POSITIVE_CONTROL_WORDS]


def _selection_words(results: dict[str, Any], records: Sequence[Record]) -> list[str]:
    """The selected and the shipped-default rows' part of the recipe bullet (each only where the results have
    such records), naming the stand-ins of the results' own version of the worlds."""
    words = []
    if any(r.kind == "selection" for r in records):
        version = _worlds(results)
        stand_ins = ", ".join(f"{world} for {s}" for s, world in STAND_INS[version].items())
        fragments = prose.SELECTION_WORDS if version == "v1" else prose.SELECTION_WORDS_V2
        words += [fragment.format(stand_ins=stand_ins) for fragment in fragments]
    if any(r.default_recipe for r in records):
        words += list(prose.DEFAULT_WORDS)
    return words


def _protocol_facts(results: dict[str, Any], idx: Index) -> dict[str, Any]:
    """The values the protocol's bullets quote, from the configuration stored with the results."""
    c = results.get("config", {})
    design = idx.family.persons
    rec = c.get("personalize", {})
    pre, recov = c.get("pretrain", {}), c.get("recovery", {})
    meta, oracle = c.get("meta", {}), c.get("oracle", {})
    n_adapt = rec.get("n_adapt") or 0
    tp = c.get("target_persons")
    version = _worlds(results)
    worlds = {f"world_{k.lower()}": world_name(v, version) for k, v in {**SOURCES, **TARGETS}.items()}
    per_seed = c.get("target_draw", "fixed") == "per_seed"
    return {
        **worlds,
        "seed_data": prose.DRAWN_PER_SEED if per_seed else prose.SAME_DATA,
        "preset": results.get("preset"),
        "seeds": ", ".join(map(str, seeds_of(idx))) or "—",
        **{k: c.get(k) for k in ("image_size", "source_persons", "source_images", "val_persons", "val_images")},
        **{k: c.get(k) for k in ("target_images", "model", "rank", "alfa_heads", "alfa_rank", "tpgaze_init_std")},
        "latency_batch": c.get("latency_batch"),
        "targets": prose.ALL_TARGET_PERSONS if tp is None else prose.TARGET_PERSONS.format(persons=tp),
        "n_adapt": n_adapt,
        "scored": (c.get("target_images") or 0) - n_adapt,
        "pretrain_epochs": pre.get("epochs"),
        "pretrain_lr": pre.get("lr"),
        "pretrain_batch_size": pre.get("batch_size"),
        "symmetry_weight": pre.get("symmetry_weight"),
        "recovery_epochs": recov.get("epochs"),
        "recovery_lr": recov.get("lr"),
        "loss": rec.get("loss"),
        "detached": "detached" if rec.get("detach_flipped") else "not detached",
        **{k: rec.get(k) for k in ("lr", "weight_decay", "steps")},
        **{f"meta_{k}": meta.get(k) for k in ("epochs", "steps_per_epoch", "batch_size", "inner_lr", "outer_lr")},
        **{f"oracle_{k}": oracle.get(k) for k in ("extra_images", "lr", "weight_decay", "steps", "batch_size")},
        "oracle_lr_scale": _scale_words(oracle.get("lr_scale")),
        "draws": idx.family.draws,
        "how": prose.DESIGN_WORDS[design],
        "persons": prose.PERSON_COUNT_WORDS[design],
    }


def _config_lines(results: dict[str, Any], records: Sequence[Record], idx: Index) -> list[str]:
    """The protocol's bullets, one line each."""
    facts = _protocol_facts(results, idx)
    extra = {"data": _positive_control_words(results, idx), "recipe": _selection_words(results, records)}
    lines = [
        "- " + " ".join([*(fragment.format(**facts) for fragment in fragments), *extra.get(name, [])])
        for name, fragments in prose.PROTOCOL_BULLETS.items()
    ]
    ruda = next((r for r in records if r.kind == "ruda" and r.recipe), None)
    if ruda is not None:  # a bullet only where RUDA ran (EXTRA_METHODS: no default run has it)
        words = " ".join(prose.RUDA_WORDS)
        recipe = ruda.recipe or {}
        lines.append("- " + words.format(degrees=ROLL_DEGREES, **{k: recipe.get(k) for k in ("loss", "lr", "steps")}))
    distilled = next((r for r in records if r.distill), None)
    # a bullet only where a TTA-distillation row ran (an opt-in row: no claimed preset runs it)
    if distilled is not None:
        d = distilled.distill or {}
        words = " ".join(prose.DISTILL_WORDS).format(
            label=distilled.method,
            teacher=d["teacher"],
            passes=d["passes"],
            teacher_passes=d["teacher_passes"],
            ratio=d["cost_ratio"],
        )
        row = TTA_ROW_OF_KIND.get(d["teacher"], d["teacher"])
        found = described(idx, distilled.method, row, pairs_of(idx))
        how_close = (
            prose.DISTILL_AGAINST.format(row=row, diff=found.describe())
            if found is not None
            else prose.DISTILL_NO_TEACHER.format(row=row)
        )
        lines.append(f"- {words} {how_close}")
    lines += _pnpga_lines(records)
    return lines


def _pnpga_lines(records: Sequence[Record]) -> list[str]:
    """PnP-GA's protocol bullet where it ran (an opt-in row: no claimed preset runs it), read from its first record."""
    first = next((r for r in records if r.pnpga), None)
    if first is None:
        return []
    info, config = first.pnpga or {}, first.method_config or {}
    epochs, cost = info["member_epochs"], info["cost"]
    words = " ".join(prose.PNPGA_WORDS).format(
        members=info["members"],
        adaptation_images=info["adaptation_images"],
        source_images=cost["source_images"],
        epochs=config.get("epochs"),
        lr=config.get("lr"),
        epochs_span=span(epochs),
        predict_with=info["predict_with"],
        predict_epoch=epochs[info["predict_with"]],
        model_bytes=byte_size(cost["shipped_model_bytes"]),
        source_bytes=byte_size(cost["shipped_source_bytes"]),
        training_bytes=byte_size(cost["training_param_bytes"]),
    )
    return ["- " + words]


def _runs_lines(results: dict[str, Any], records: Sequence[Record]) -> list[str]:
    """What the results file cost, and the runs that wrote it."""
    runs = results.get("runs", [])
    if not runs:
        return [prose.NO_RUNS]
    record_min = sum(r.wall_s or 0.0 for r in records) / 60
    sources = results.get("sources", {})
    model_min = sum(s.get("recorded_train_seconds") or 0.0 for s in sources.values()) / 60
    unknown = sorted(k for k, s in sources.items() if not s.get("recorded_train_seconds"))
    total = record_min + model_min
    cost = prose.FILE_COST.format(
        total=total,
        wall=total / 2,
        cpus=runs[0].get("cpus"),
        record_minutes=record_min,
        records=len(records),
        model_minutes=model_min,
        unrecorded=prose.UNRECORDED_TIME.format(sources=", ".join(unknown)) if unknown else "",
    )
    summary = prose.RUNS_TOTAL.format(
        runs=len(runs),
        wall_minutes=sum(r.get("wall_s", 0.0) for r in runs) / 60,
        cpu_minutes=sum(r.get("cpu_s", 0.0) for r in runs) / 60,
        torch=runs[0].get("torch"),
    )
    # the first records' commands say --standard, which names the second protocol's preset since it came
    commands = [r.get("command") or "" for r in runs]  # a library call's run has no command
    renamed = _worlds(results) == "v1" and any(re.search(r"(^|\s)--standard(\s|$)", c) for c in commands)
    return [cost, "", summary + (" " + prose.FIRST_STANDARD_RENAMED if renamed else ""), "", runs_table(runs)]


# ----------------------------------------------------------------------------- the sections, in page order


def _record_kinds(records: Sequence[Record]) -> str:
    """What the file's records are, where some are no table row: the header counts every record of the file
    (as the declared run and the costs do), so it says how many of them the tables read and what the others are."""
    selections = [x for x in records if x.kind == "selection"]
    scored = [x for x in records if x.kind != "selection"]
    controls = [x for x in scored if x.pair in CONSTRUCTED_CONTROLS]
    no_error = [x for x in scored if x.pair not in CONSTRUCTED_CONTROLS and x.error_deg is None]
    # user calibration's rows have a page of their own (docs/results-user-calibration.md), no table here
    calibrated = [
        x
        for x in scored
        if x.error_deg is not None
        and x.pair not in CONSTRUCTED_CONTROLS
        and parse_calibration_label(x.method) is not None
    ]
    others = []
    if selections:
        others.append(prose.SELECTION_KIND.format(count=prose.counted(len(selections), "recipe selections")))
    if controls:
        pairs = ", ".join(p for p in CONSTRUCTED_CONTROLS if any(x.pair == p for x in controls))
        others.append(prose.CONTROL_KIND.format(count=len(controls), pairs=pairs))
    if calibrated:
        others.append(prose.CALIBRATION_KIND.format(count=len(calibrated)))
    if no_error:
        others.append(prose.NO_ERROR_KIND.format(count=len(no_error)))
    if not others:
        return ""
    rows = prose.TABLE_ROW_RECORDS.format(count=len(scored) - len(controls) - len(no_error) - len(calibrated))
    return prose.RECORD_KINDS.format(parts=prose.listed([rows, *others]))


def _header_section(r: _Report) -> list[str]:
    worlds = _worlds(r.results)
    lines = [
        "# Benchmark results" + ("" if worlds == "v1" else f" on the worlds `{worlds}`"),
        "",
        prose.GENERATED_COMMENT.format(command=r.command, source=r.source),
        "",
        prose.PAGE_INTRO.format(
            command=r.command,
            source=r.source,
            preset=r.results.get("preset"),
            records=len(r.records),
            kinds=_record_kinds(r.records),
            seeds=", ".join(map(str, r.seeds)) or "—",
        ),
        "",
    ]
    if r.results.get("preset") in prose.NO_CLAIM_PRESETS:
        record = "results-v2.md" if worlds == "v2" else "results.md"  # the page of record of these worlds
        lines += [prose.NO_CLAIMS.format(preset=r.results["preset"], page=record), ""]
    elif worlds == "v1" and r.results.get("preset") == "standard":  # the first records' pages, beside results-v2.md
        lines += [prose.FIRST_RECORD_NOTE.format(v2="results-v2.md"), ""]
    if r.progress is not None:  # a run still being made: what it lacks, before any number is read
        lines += [declared_run_paragraph(r.progress), ""]
    selection = [rec for rec in r.records if rec.kind == "selection"]
    if selection:
        present = {m for (m, _, _) in r.idx}
        missing = [display_name(m) for m in table_methods() if m not in present]
        text = prose.SELECTION_RECORDS
        if missing:
            text += prose.NOT_RUN_YET.format(methods=", ".join(missing))
        lines += [text, ""]
    if len(r.seeds) < 3:
        lines += [prose.FEW_SEEDS.format(seeds=prose.counted(len(r.seeds), "seeds")), ""]
    return lines


def _family_statement(family: Comparisons) -> str:
    """What the page's family of comparisons is, the rule that judges them, and what the design can detect."""
    judged = family.judged()
    descriptive = len(family.descriptive())
    unjudged = sum(d is not None and d.declared and not d.judged for d in family.made.values())
    declared = _declared_statement(family, descriptive)
    if not judged:
        why = prose.ONE_SEED_ONLY.format(count=unjudged) if unjudged else "it makes no judged comparison"
        why = prose.ONE_SEED_ONLY_ONE if unjudged == 1 else why
        return prose.NO_FAMILY.format(why=why) + declared
    mde = family.detectable()
    size = family.size
    over = (
        prose.OVER_ALL.format(count=size)
        if size == len(judged)
        else prose.OVER_DECLARED.format(size=size, unmade=size - len(judged))
    )
    text = prose.FAMILY_STATEMENT.format(
        how=prose.DESIGN_WORDS[family.persons],
        count=len(judged),
        over=over,
        size=size,
        kinds=family.kinds(),
        clear=len(family.clear()),
        mde=degrees_detected(statistics.median(mde)),
        mde_low=degrees_detected(min(mde)),
        mde_high=degrees_detected(max(mde)),
    )
    return text + (prose.UNJUDGED.format(count=unjudged) if unjudged else "") + declared


def _declared_statement(family: Comparisons, descriptive: int) -> str:
    """Where a protocol declared the family before its runs: that it did, how many other comparisons the page
    shows as descriptive, and which declared ones it could not make (nothing for the first records' pages)."""
    if family.declared is None:
        return ""
    text = prose.DECLARED_FAMILY.format(declared=len(family.declared), descriptive=descriptive)
    missing = family.missing()
    if missing:
        names = "; ".join(f"{display_name(a)} − {display_name(b)} on {', '.join(p)}" for a, b, p, _ in missing)
        text += prose.DECLARED_MISSING.format(count=len(missing), names=names)
    return text


def _summary_section(r: _Report) -> list[str]:
    """The family statement, the first sentences of every verdict, then the first two of each ablation shown in
    the summary."""
    flip = flip_summary(r.results, r.idx, table_methods(), table1_rows(r.idx))
    lines = ["## Summary", "", _family_statement(r.family), ""]
    lines += [*_bullets(flip + r.main[:1] + r.sanity[:2] + r.main[1:] + r.parts), ""]
    for name, rows in r.layout.items():
        if name in REGISTRY and REGISTRY[name].in_summary:
            _, pairs = ablation_table(r.idx, table_layout(name, rows, r.present))
            if pairs:
                title = _ablation_title(name)[0]
                lines += [f"- ({title}) {s}" for s in ablation_verdicts(r.idx, name, rows, pairs)[:2]]
    return lines + [""]


def _protocol_section(r: _Report) -> list[str]:
    lines = ["## Protocol", "", *_config_lines(r.results, r.records, r.idx), "", "### Runs", ""]
    lines += [*_runs_lines(r.results, r.records), ""]
    sources = r.results.get("sources", {})
    if sources:
        lines += ["### Source models", "", prose.SOURCE_MODELS_INTRO, "", source_table(sources), ""]
    return lines


def _sanity_section(r: _Report) -> list[str]:
    # the second worlds were calibrated against the real regime: their pages say how far they meet it
    calibration = [calibration_statement(r.records, design_of(r.results)), ""] if _worlds(r.results) != "v1" else []
    return [
        "## Sanity: domain gap and headroom",
        "",
        prose.SANITY_INTRO,
        "",
        *calibration,
        sanity_table(r.idx),
        "",
        *_bullets(r.sanity),
        "",
    ]


def _table1_section(r: _Report) -> list[str]:
    lines = [
        "## Table 1: cross-domain personalization error (deg)",
        "",
        prose.TABLE1_INTRO,
        "",
        table1(r.idx),
        "",
        *_bullets(r.main),
        "",
        prose.PER_PERSON_INTRO,
        "",
        person_table(r.idx),
        "",
    ]
    tpgaze = tpgaze_table(r.idx)
    if tpgaze is not None:
        lines += [prose.TPGAZE_INTRO, "", tpgaze, ""]
    pnpga = pnpga_domain_table(r.idx)
    if pnpga is not None:
        lines += [prose.PNPGA_DOMAIN_INTRO, "", pnpga, ""]
    return lines


def _flip_section(r: _Report) -> list[str]:
    """What a flip can see, the recipes selected on the stand-in, the replayed reference protocol (none of it
    for records without those measures)."""
    return flip_sections(r.results, r.idx, table_methods())


def _constructed_control_section(r: _Report) -> list[str]:
    """docs/flip-premise.md §7.4's control, indexed apart from the page's pairs and family."""
    constructed = [x for x in r.records if x.pair in CONSTRUCTED_CONTROLS]
    if not constructed:
        return []
    family = Comparisons(persons=design_of(r.results), declared=frozenset())
    return constructed_control_section(index_records(constructed, family))


def _table2_section(r: _Report) -> list[str]:
    return [
        "## Table 2: the LoRA family against Alfa, with merged sizes",
        "",
        prose.TABLE2_INTRO,
        "",
        table2(r.idx),
        "",
    ]


def _parts_section(r: _Report) -> list[str]:
    ptable = parts_table(r.idx, r.parts_methods)
    if not ptable:  # records scored without the parts
        return []
    return [
        "## Where the error goes: yaw and pitch",
        "",
        prose.PARTS_INTRO,
        "",
        ptable,
        "",
        *_bullets(r.parts),
        "",
    ]


def _ablations_section(r: _Report) -> list[str]:
    """One subsection per ablation of the stored layout that ran on some pair, in the layout's order."""
    lines = ["## Ablations", "", prose.ABLATIONS_INTRO, ""]
    for name, rows in r.layout.items():
        extra = name in REGISTRY and REGISTRY[name].extra_params
        table, pairs = ablation_table(r.idx, table_layout(name, rows, r.present), extra_params=extra)
        if not pairs:
            continue
        title, what = _ablation_title(name)
        lines += [f"### {title}", "", what, "", table, ""]
        lines += _bullets(ablation_verdicts(r.idx, name, rows, pairs))
        lines += [""]
        lines += r.figure(name, _ablation_caption(r, name, rows, title))
        if r.drawn and name in REGISTRY and REGISTRY[name].figure is not None and name not in r.figures:
            lines += [prose.ABLATION_FIGURE_NOT_DRAWN, ""]
    return lines


def _ablation_caption(r: _Report, name: str, rows: list[dict[str, Any]], title: str) -> str:
    """The caption of an ablation's figure, naming the seeds its lines are on (they can be fewer than its table's
    rows have: a line is read on the seeds every setting on it has)."""
    curves = ablation_curves(r.idx, name, rows)
    on = {label.rpartition(" ")[2]: seeds for label, (_, seeds) in curves.items()}
    if len(set(on.values())) == 1:
        seeds = next(iter(on.values()))
        words = f"{seeds_words(seeds) or 'no seed'}{'; no bar on one seed' if len(seeds) == 1 else ''}"
    else:
        words = "; ".join(f"{pair}: {seeds_words(seeds)}" for pair, seeds in on.items())
    in_table = {seed for (m, _, seed) in r.idx if m in {row["label"] for row in rows}}
    fewer = prose.ABLATION_FIGURE_FEWER if any(set(s) < in_table for s in on.values()) else ""
    return prose.ABLATION_FIGURE_CAPTION.format(title=title, seeds=words, fewer=fewer)


def _costs_section(r: _Report) -> list[str]:
    return [
        "## Costs",
        "",
        prose.COSTS_INTRO,
        "",
        cost_table(r.idx, [m for m in cost_rows() if records_of(r.idx, m)]),
        "",
    ]


def _figures_section(r: _Report) -> list[str]:
    lines = ["## Figures", ""]
    lines += r.figure("rank_slices", prose.RANK_SLICES_CAPTION)
    lines += r.figure("updates", _updates_caption(r.figure_data))
    if r.drawn and not {"rank_slices", "updates"} & set(r.figures):  # the section was left empty, unexplained
        lines += [prose.NO_FIGURE_DATA.format(folder=FIGURE_DIR), ""]
    return lines + update_rank_lines(r.figure_data)


def _updates_caption(figure_data: Any) -> str:
    """The update maps' caption, counting the persons and naming the methods the figure's data holds."""
    meta = figure_data[1] if figure_data else {}
    persons = max((len(info["persons"]) for info in meta.get("methods", {}).values()), default=0)
    names = [display_name(m) for m in F.update_map_methods(meta)]  # in the figure's row order
    return prose.UPDATES_CAPTION.format(persons=prose.counted(persons, "target persons"), methods=prose.listed(names))


def _records_section(r: _Report) -> list[str]:
    failed = [(rec.id, rec.failed) for rec in r.records if rec.failed]
    lines = ["## Records", "", prose.RECORDS_COUNT.format(records=len(r.records), source=r.source)]
    if not failed:
        return lines + [prose.NO_FAILURES]
    lines += ["", prose.FAILURES_INTRO, ""]
    return lines + [f"- `{rid}`: {fails}" for rid, fails in failed]


_SECTIONS: tuple[Callable[[_Report], list[str]], ...] = (
    _header_section,
    _summary_section,
    _protocol_section,
    _sanity_section,
    _table1_section,
    _flip_section,
    _constructed_control_section,
    _table2_section,
    _parts_section,
    _ablations_section,
    _costs_section,
    _figures_section,
    _records_section,
)


# ----------------------------------------------------------------------------- the page


def render_report(
    results: dict[str, Any],
    *,
    figures: dict[str, Path] | None = None,
    figure_data: Any = None,
    md_dir: Path | None = None,
    command: str | None = None,
    source: str | None = None,
    progress: DeclaredRunProgress | None = None,
) -> str:
    """The markdown text of the report (figures, if given, are linked relative to ``md_dir``), rendered twice:
    the first rendering makes the page's comparisons, the second quotes them judged as one family. ``progress``
    (:func:`alfa.study.bench.plan.declared_run_progress`, computed by the caller): what of a declared run the
    records hold, said at the top of the page."""
    records = as_records(results.get("records", []))
    family = Comparisons(persons=design_of(results), declared=DECLARED_FAMILY.get(_worlds(results)))
    # a constructed control is never pooled with the pairs or judged in the family (its own section indexes it)
    idx = index_records([r for r in records if r.pair not in CONSTRUCTED_CONTROLS], family)

    # the sections read the records parsed once (a page reads them in several places)
    parsed = {**results, "records": records}

    def text() -> str:
        report = _Report(
            parsed,
            figures or {},
            figure_data,
            md_dir,
            command or "alfa report",
            source or "results.json",
            records,
            idx,
            progress,
            figures is not None,
        )
        lines = [line for section in _SECTIONS for line in section(report)]
        return "\n".join(lines).rstrip() + "\n"

    text()
    idx.family.close()
    return text()


def build_report(
    results_path: str | os.PathLike,
    out_md: str | os.PathLike = "docs/results.md",
    figure_dir: str | os.PathLike | None = None,
    command: str | None = None,
    source: str | None = None,
    progress_of: Callable[[str, Iterable[str]], DeclaredRunProgress | None] | None = None,
    loaded: dict[str, Any] | None = None,
) -> Path:
    """Read ``results.json`` (or its folder), render the figures and write the markdown report. ``source`` is
    how the page names the results it was made from (default: ``results_path`` as given); ``progress_of``
    (:func:`alfa.study.bench.plan.declared_run_progress`, passed by the caller) is asked, with the results'
    worlds and record ids, what of a declared run they hold (see :func:`render_report`); ``loaded``: the results
    file as :func:`load_results` read it already (a caller making two pages of it reads its megabytes once)."""
    results_path = Path(results_path)
    results = load_results(results_path) if loaded is None else loaded
    # the records parsed once: the figures and the page read them (thousands of records in a committed file)
    parsed = {**results, "records": as_records(results["records"])}
    results_dir = results_path if results_path.is_dir() else results_path.parent
    out_md = Path(out_md)
    figure_dir = Path(figure_dir) if figure_dir is not None else default_figure_dir(out_md)
    figures = render_figures(parsed, results_dir, figure_dir)
    updates = results_dir / FIGURE_DIR / UPDATES_FILE
    figure_data = F.load_figure_data(updates) if updates.is_file() else None
    text = render_report(
        parsed,
        figures=figures,
        figure_data=figure_data,
        md_dir=out_md.parent,
        command=command,
        source=str(results_path) if source is None else source,
        # a smoke or quick run's records are not the declared run's, whatever their names
        progress=None
        if progress_of is None or results.get("preset") != "standard"
        else progress_of(_worlds(results), (r["id"] for r in results["records"])),
    )
    write_text(out_md, text)
    return out_md
