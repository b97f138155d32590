"""The Markdown tables of the benchmark report, each built from the indexed records (or, for the protocol's
runs and source models, from what ``results.json`` stores beside them). A table says nothing about its
numbers; the sentences that judge them are :mod:`alfa.study.bench.report_verdicts`'s.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from typing import Any

from alfa.adapters import METHODS
from alfa.gaze.distill import DISTILL_OBJECTIVE
from alfa.gaze.pnpga import PUBLISHED as PNPGA_PUBLISHED

from ..timing import load_text, median_text
from .flip_report import table_rows
from .markdown import byte_size, seeds_note, spans, usual_seeds
from .markdown import number as _num
from .markdown import table as _table
from .measures import PARTS, constant_prediction, part, sanity_summary
from .methods import EXTRA_METHODS, table_methods, with_tta_rows
from .names import SELECTED
from .names import display_name as _name
from .record import Record
from .stats import Index, Stat, cell, diff, level, pairs_of, pooled, seeds_of, signed, text_of
from .tta_report import latency_ratio

__all__ = [
    "pnpga_domain_table",
    "lora_family",
    "cost_rows",
    "records_of",
    "table1_rows",
    "table1",
    "person_table",
    "tpgaze_table",
    "table2",
    "parts_table",
    "sanity_table",
    "cost_table",
    "ablation_table",
    "runs_table",
    "source_table",
]


OPT_IN_ROWS = (DISTILL_OBJECTIVE, "pnpga")
"""The opt-in rows (no claimed preset plans them) the tables show where they have records, in this order."""


def lora_family() -> tuple[str, ...]:
    """Table 2's rows before Alfa: the low-rank methods (the "lora" family, then "spectral") in Table 1's order."""
    rows = table_methods()
    return tuple(m for family in ("lora", "spectral") for m in rows if m in METHODS and METHODS[m].family == family)


def cost_rows() -> tuple[str, ...]:
    """The cost table's rows: Table 1's methods (the label-free TTA rows after flip-TTA), the rows run when asked
    for, the oracle, and the ablations' other kinds of adapter."""
    rows = (*table_methods(), *EXTRA_METHODS, *OPT_IN_ROWS, "oracle", "diag_gate", "linear_mix", "alfa[dense]")
    return with_tta_rows(rows)


# ----------------------------------------------------------------------------- cells


def _count(n: int | None) -> str:
    if n is None:
        return "—"
    return f"{n / 1e6:.3f} M" if n >= 1e6 else f"{n / 1e3:.1f} k" if n >= 1e3 else str(n)


def _merge_note(merge: str | None) -> str:
    """What the parameter count after merging needs a word about (densified, or prompts left attached)."""
    if merge == "densified":
        return " (densified)"
    if merge and merge.startswith("not mergeable"):
        return " (unmerged)"
    return ""


def _or_zero(x: float | None) -> float:
    return 0.0 if x is None else x


def _median(values: Iterable[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def records_of(idx: Index, method: str) -> list[Record]:
    """Every record of the row ``method``, in (pair, seed) order."""
    return idx.records(method)


def table1_rows(idx: Index) -> list[str]:
    """Table 1's rows that have records: each method (the label-free TTA rows after flip-TTA), then its
    selected-recipe row where there is one; then the rows run only when asked for
    (:data:`~alfa.study.bench.methods.EXTRA_METHODS`, and TTA distillation's and PnP-GA's opt-in rows) that were."""
    return table_rows(idx, with_tta_rows((*table_methods(), *EXTRA_METHODS, *OPT_IN_ROWS)))


# ----------------------------------------------------------------------------- Table 1 and its companions


def table1(idx: Index) -> str:
    """Each row's seeds, its error per pair (the lowest in bold), pooled, its size at inference and its Δ to
    source-only (on the seeds both rows have, named where they are not the row's)."""
    pairs = pairs_of(idx)
    header = ["method", "seeds", *pairs, "mean over pairs", "params at inference"]
    header.append("Δ vs source-only (pooled; 95 % interval)")
    best = {}
    for p in pairs:
        stats = [(cell(idx, m, p), m) for m in table1_rows(idx) if cell(idx, m, p)]
        most = max((s.n for s, _ in stats), default=0)
        stats = [(s, m) for s, m in stats if s.n == most]  # a mean over fewer seeds is not the others' peer
        if stats:
            best[p] = min(stats, key=lambda t: t[0].mean)[1]
    rows = []
    for m in table1_rows(idx):
        cells = []
        for p in pairs:
            s = cell(idx, m, p)
            text = s.format() if s else "—"
            cells.append(f"**{text}**" if best.get(p) == m else text)
        pool = pooled(idx, m, pairs)
        recs = records_of(idx, m)
        params = _median(r.inference_params for r in recs)
        merge = recs[0].merge if recs else None
        d = (
            diff(idx, m, "source-only", pairs)
            if m != "source-only" and ("source-only", pairs[0], seeds_of(idx)[0]) in idx
            else None
        )
        dtext = "—" if d is None else d.compact() + seeds_note(d.per_seed, pool.values if pool else ())
        size = _count(int(params)) if params is not None else "—"
        size += _merge_note(merge)
        seeds, usual = _row_seeds(idx, m, pairs)
        rows.append([_name(m), seeds, *cells, _pooled_cell(pool, usual), size, dtext])
    return _table(header, rows, "ll" + "r" * (len(header) - 2))


def _person_changes(idx: Index, method: str) -> list[float]:
    """Every (pair, seed, person) change of error of ``method`` against source-only on the same base."""
    changes: list[float] = []
    for (m, p, s), r in idx.items():
        base = idx.get(("source-only", p, s))
        if m == method and base:
            changes += [r.per_person[q] - base.per_person[q] for q in r.per_person.keys() & base.per_person.keys()]
    return changes


def person_table(idx: Index) -> str:
    """Per method: the spread over persons and how many persons each method helps. Every column but the persons
    helped reads all of the row's records, on the seeds of its *seeds* column (as Table 1 says them); the persons
    helped count those of the pooled difference, on the seeds both rows have on every pair, named where they are
    not the row's."""
    pairs = pairs_of(idx)
    rows = []
    for m in table1_rows(idx):
        recs = records_of(idx, m)
        if not recs:
            continue
        by_seed: dict[int, list[float]] = {}
        for r in recs:
            by_seed.setdefault(r.seed, []).append(_or_zero(r.std_over_persons))
        spread = Stat({s: statistics.fmean(v) for s, v in sorted(by_seed.items())})  # per seed, over its records
        worst = max(max(r.per_person.values()) for r in recs if r.per_person)
        seeds, usual = _row_seeds(idx, m, pairs)
        d = diff(idx, m, "source-only", pairs) if m != "source-only" else None
        helped = "—" if d is None or not d.persons else f"{d.persons_better} / {d.persons}"
        helped += "" if d is None or not d.persons else seeds_note(d.per_seed, usual)
        changes = _person_changes(idx, m) if m != "source-only" else []
        worst_change = signed(max(changes)) if changes else "—"
        best_change = signed(min(changes)) if changes else "—"
        rows.append([_name(m), seeds, spread.format(), f"{worst:.2f}", helped, best_change, worst_change])
    header = [
        "method",
        "seeds",
        "std over persons (per seed the mean over its records; mean over seeds, 95 % interval)",
        "worst person",
        "persons better than source-only (distinct)",
        "best person change",
        "worst person change",
    ]
    return _table(header, rows, "ll" + "r" * (len(header) - 2))


def tpgaze_table(idx: Index) -> str | None:
    """TPGaze's meta-trained prompts alone against TPGaze after its personalization steps, per pair (``None``
    without TPGaze records that kept the former)."""
    if "tpgaze" not in {m for (m, _, _) in idx}:
        return None
    rows = []
    for pair in pairs_of(idx):
        meta_only = {
            s: rec.meta_only["error_deg"]
            for (m, p, s), rec in idx.items()
            if m == "tpgaze" and p == pair and rec.meta_only
        }
        full = cell(idx, "tpgaze", pair)
        if meta_only and full:
            rows.append([pair, Stat(meta_only).format(), full.format()])
    if not rows:
        return None
    return _table(["pair", "meta-trained prompts only", "TPGaze (after personalization)"], rows)


def pnpga_domain_table(idx: Index) -> str | None:
    """PnP-GA's own protocol per pair (adapted on one person, scored on every target person's scored images:
    the records' ``domain_protocol``) before and after adaptation, beside the authors' README numbers for the
    real pair of the same name (``None`` without PnP-GA records that kept it). Ours: the mean over seeds with its
    95 % interval (:meth:`Stat.format`)."""
    rows = []
    for pair in pairs_of(idx):
        domain = {s: rec.domain_protocol for (m, p, s), rec in idx.items() if m == "pnpga" and p == pair}
        domain = {s: d for s, d in domain.items() if d and d.get("error_deg") is not None}
        if not domain:
            continue
        before = Stat({s: d["unadapted_deg"] for s, d in domain.items()})
        after = Stat({s: d["error_deg"] for s, d in domain.items()})
        published = PNPGA_PUBLISHED.get(pair)
        quoted = ["—", "—"] if published is None else [f"{x:g}" for x in published]
        rows.append([pair, str(after.n), before.format(), after.format(), *quoted])
    if not rows:
        return None
    header = [
        "pair (our worlds)",
        "seeds",
        "ours: unadapted predictor",
        "ours: PnP-GA",
        "authors' README (real data): source-only",
        "authors' README (real data): PnP-GA",
    ]
    return _table(header, rows)


def table2(idx: Index) -> str:
    """The LoRA family and Alfa: pooled error, trainable parameters, merged sizes and file sizes."""
    pairs = pairs_of(idx)
    rows = []
    for m in [*lora_family(), "alfa"]:
        recs = records_of(idx, m)
        if not recs:
            continue
        pool = pooled(idx, m, pairs)
        r = recs[0]
        rows.append(
            [
                _name(m),
                pool.format() if pool else "—",
                _count(r.trainable_params),
                _count(r.inference_params) + _merge_note(r.merge),
                _count(r.compact_merge_params),
                byte_size(r.adapter_bytes),
                byte_size(r.compact_bytes),
            ]
        )
    header = [
        "method",
        "error, mean over pairs (deg)",
        "trainable",
        "params after merge",
        "exact compact merge",
        "per-user file",
        "compact file (d×d mix per layer)",
    ]
    return _table(header, rows)


def parts_table(idx: Index, methods: Sequence[str]) -> str:
    """Per method, the pooled angular error and its yaw and pitch parts (empty without parts in the records)."""
    pairs = pairs_of(idx)
    rows = []
    for m in methods:
        stats = [pooled(idx, m, pairs), *(pooled(idx, m, pairs, part(k)) for k in PARTS)]
        if all(st is not None for st in stats):
            rows.append([_name(m), *(st.format() for st in stats)])
    header = ["method", "angular error", *(title for title, _ in PARTS.values())]
    return _table(header, rows) if rows else ""


def _gap(idx: Index, pair: str, other: str) -> str:
    """``source-only − other`` on ``pair`` with its interval (``—`` where a row is missing)."""
    d = diff(idx, "source-only", other, [pair])
    return "—" if d is None else d.compact() + seeds_note(d.per_seed, seeds_of(idx))


def _level_cell(idx: Index, method: str, pair: str) -> str:
    """``method``'s error on ``pair`` with its interval, and its seeds where they are not the page's."""
    stat = cell(idx, method, pair)
    return text_of(stat) + (seeds_note(stat.values, seeds_of(idx)) if stat is not None else "")


def sanity_table(idx: Index) -> str:
    """Per pair: the in-domain, target-trained, source-only and oracle errors (each the mean over seeds with its
    95 % interval), the gaps between them and the error of a constant prediction (each with its interval)."""
    rows = []
    for pair in sanity_summary(idx.values()):
        rows.append(
            [
                pair,
                *(_level_cell(idx, m, pair) for m in ("in-domain", "target-trained", "source-only", "oracle")),
                _gap(idx, pair, "in-domain"),
                _gap(idx, pair, "target-trained"),
                _gap(idx, pair, "oracle"),
                text_of(level(idx, "in-domain", pair, constant_prediction)),
                text_of(level(idx, "source-only", pair, constant_prediction)),
            ]
        )
    header = [
        "pair",
        "in-domain (held-out source persons)",
        "target-trained (target)",
        "source-only (target)",
        "oracle (target)",
        "domain gap",
        "gap to target-trained",
        "headroom",
        "constant prediction, held-out source",
        "constant prediction, target",
    ]
    return _table(header, rows)


def cost_table(idx: Index, labels: Sequence[str]) -> str:
    """Per row of ``labels``: sizes, files, times, memory and latency (medians over its records)."""
    rows = []
    for m in labels:
        recs = records_of(idx, m)
        if not recs:
            continue
        r = recs[0]
        peak = [x.peak_rss_mib for x in recs if x.peak_rss_mib is not None]
        inc = [x.peak_rss_increase_mib for x in recs if x.peak_rss_increase_mib is not None]
        rows.append(
            [
                _name(m),
                _count(r.trainable_params),
                f"{_count(r.inference_params)}",
                str(r.merge),
                byte_size(r.adapter_bytes),
                median_text([x.seconds_per_user for x in recs], 2),
                median_text([x.cpu_seconds_per_user for x in recs], 2),
                _num(max(peak), 0) if peak else "—",
                _num(max(inc), 0) if inc else "—",
                median_text([x.latency_ms for x in recs], 1),
                median_text([x.base_latency_ms for x in recs], 1),
                latency_ratio(recs),
            ]
        )
    header = [
        "method",
        "trainable",
        "params at inference",
        "merge",
        "per-user file",
        "s / user (wall)",
        "CPU s / user",
        "peak RSS (MiB)",
        "peak increase (MiB)",
        "latency merged (ms)",
        "latency base (ms)",
        "ratio (median of each record's own)",
    ]
    return _table(header, rows)


def ablation_table(
    idx: Index, rows_layout: Sequence[dict[str, Any]], extra_params: bool = False
) -> tuple[str, list[str]]:
    """Rows of one ablation (label, value) × the pairs it ran on; returns the table and its pairs."""
    labels = [r["label"] for r in rows_layout]
    present = {(m, p) for (m, p, _) in idx if m in labels}
    # The ablation's pairs: where its own variants ran (the reference rows are main methods, run everywhere, and
    # so are their selected-recipe rows on a page that selects recipes).
    main = table_methods()
    own = [lab for lab in labels if lab.removesuffix(SELECTED) not in main]
    pairs = [p for p in pairs_of(idx) if any((lab, p) in present for lab in own)]
    rows = []
    for row in rows_layout:
        lab = row["label"]
        if not any((lab, p) in present for p in pairs):
            continue
        cells = [(cell(idx, lab, p).format() if cell(idx, lab, p) else "—") for p in pairs]
        pool = pooled(idx, lab, pairs)
        setting = str(row["value"])
        # a variant named by what it is (the diagonal gate) has no setting beyond its name: do not say it twice
        seeds, usual = _row_seeds(idx, lab, pairs)
        line = [_name(lab), "—" if setting == _name(lab) else setting, seeds, *cells, _pooled_cell(pool, usual)]
        if extra_params:
            recs = records_of(idx, lab)
            line.append(_count(recs[0].trainable_params) if recs else "—")
        rows.append(line)
    header = ["row", "setting", "seeds", *pairs, "mean over pairs"] + (["trainable"] if extra_params else [])
    return _table(header, rows, "lll" + "r" * (len(header) - 3)), pairs


def _row_seeds(idx: Index, label: str, pairs: Sequence[str]) -> tuple[str, tuple[int, ...]]:
    """The seeds of a row's cells (``3–5``), and those most of its pairs have: rows of one table may have
    different seeds, and each interval is over its own. The pairs whose cells have other seeds than the row's others
    are named with theirs (``0–7 (S→W, S→C: 3–7)``)."""
    per_pair = {p: tuple(sorted({s for s in idx.row(label, p)})) for p in pairs}
    per_pair = {p: seeds for p, seeds in per_pair.items() if seeds}
    sets = list(per_pair.values())
    usual = usual_seeds(sets)
    odd: dict[tuple[int, ...], list[str]] = {}
    for p, seeds in per_pair.items():
        if seeds != usual:
            odd.setdefault(seeds, []).append(p)
    notes = [f"{', '.join(named)}: {spans(seeds)}" for seeds, named in odd.items()]
    return spans(usual) + (f" ({'; '.join(notes)})" if notes else ""), usual


def _pooled_cell(pool: Stat | None, usual: Sequence[int]) -> str:
    """A row's mean over pairs (on the seeds that have every pair), with those seeds where they are not the row's
    usual ones (:func:`_row_seeds`)."""
    return "—" if pool is None else pool.format() + seeds_note(pool.values, usual)


# ----------------------------------------------------------------------------- the protocol's tables


def runs_table(runs: Sequence[dict[str, Any]]) -> str:
    """One row per run that wrote the results: its command, start, wall and CPU time, records, load, and the
    CPU it ran on, with the vector instructions torch's kernels used there where the run kept them (a seed's records
    are made on one kind of machine; runs before that was kept say so)."""
    rows = []
    for r in runs:
        sel = r.get("selection", {})
        rows.append(
            [
                f"`{r.get('command') or '(library call)'}`",
                str(r.get("started", "")),
                f"{r.get('wall_s', 0.0) / 60:.1f}",
                f"{r.get('cpu_s', 0.0) / 60:.1f}",
                str(r.get("records_run", 0)),
                str(sel.get("threads", "")),
                f"{load_text(r.get('load_average_start'))} / {load_text(r.get('load_average_end'))}",
                "yes" if r.get("finished") else "no (interrupted)",
                ", ".join(x for x in (r.get("cpu"), r.get("cpu_capability")) if x) or "not recorded",
            ]
        )
    return _table(
        [
            "command",
            "started",
            "wall (min)",
            "CPU (min)",
            "records",
            "threads",
            "load avg start / end",
            "finished",
            "CPU",
        ],
        rows,
        "llrrrrrll",
    )


def source_table(sources: dict[str, dict[str, Any]]) -> str:
    """Per (source, seed) model: its held-out error dense, truncated, recovered and with TPGaze's prompts, and
    the training time it recorded; per source with several seeds, the mean over them with its 95 % interval."""
    rows: dict[str, list[list[str]]] = {}  # per source, its models' rows (its mean's below them)
    by_source: dict[str, dict[int, list[float | None]]] = {}
    for key in sorted(sources):
        s = sources[key]
        e = (s.get("truncation") or {}).get("errors") or {}
        tp = s.get("tpgaze_meta") or {}
        source, _, seed = key.partition("|")
        errors = [e.get("before_truncation"), e.get("after_truncation"), e.get("after_recovery")]
        errors.append(tp.get("final_val_error"))
        if seed.removeprefix("seed").isdigit():  # the runner's "<source>|seed<n>"
            by_source.setdefault(source, {})[int(seed.removeprefix("seed"))] = errors
        rows.setdefault(source, []).append(
            [
                f"{source}, {seed.replace('seed', 'seed ')}",
                *(_num(x) for x in errors),
                f"{s['recorded_train_seconds'] / 60:.1f}" if s.get("recorded_train_seconds") else "—",
            ]
        )
    for source, seeds in by_source.items():  # each source's models as a sample of its training runs
        if len(seeds) > 1:
            columns = [{s: v[k] for s, v in seeds.items() if v[k] is not None} for k in range(4)]
            cells = [Stat(c).format() if len(c) > 1 else "—" for c in columns]
            rows[source].append([f"{source}, mean over seeds {spans(sorted(seeds))}", *cells, "—"])
    return _table(
        [
            "source, seed",
            "held-out error, dense",
            "truncated",
            "recovered",
            "with TPGaze's meta-trained prompts",
            "training (min, as recorded)",
        ],
        [row for source_rows in rows.values() for row in source_rows],
    )
