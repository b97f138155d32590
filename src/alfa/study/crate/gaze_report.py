"""What ``alfa crate gaze`` shows of its results: the probe figure, the printed table with its
findings, and the generated markdown page (``docs/crate-gaze.md``). Everything here reads the results
dictionary of :func:`alfa.study.crate.gaze.run_crate_gaze`; nothing trains.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from ..plotted import save_figure
from .gaze_config import LABELS, MODELS, late_blocks_pattern
from .toy import format_interval, interval

__all__ = ["plot_gaze_probes", "format_summary", "format_markdown"]


# ----------------------------------------------------------------------------- the figure


def _probe_band(entry: dict[str, Any], key: str) -> tuple[Any, Any, Any]:
    """The figure's line and band for ``key``: the persons' mean and interval, else mean ± std over images."""
    import numpy as np

    levels = _probe_levels(entry, key)
    if levels is not None:
        return levels[0], levels[1], levels[2]
    mean, std = np.asarray(entry[key]), np.asarray(entry[f"{key}_std"])
    return mean, mean - std, mean + std


def plot_gaze_probes(
    probes: dict[str, dict[str, dict[str, Any]]], path: str | os.PathLike, source_name: str | None = None
) -> Path:
    """Two panels against depth: the tokens' coding rate ``R_c`` (sum over heads; the mean over persons with its
    95 % t-interval as a band, or the mean ± std over the probe images of a record that kept no persons) for both
    models, and CRATE's non-zero fraction after ISTA; colour = data set (source or
    target), solid = CRATE, dashed = ViT. ``probes`` is ``results["probes"]["results"]`` (model kind -> data
    set -> the probe's entry), so the page can redraw it from the committed results. Written atomically, with
    its plotted data beside it (:func:`alfa.study.plotted.save_figure`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    sets = list(dict.fromkeys(name for per in probes.values() for name in per))
    colours = {name: plt.get_cmap("tab10")(i) for i, name in enumerate(sets)}
    styles = {"crate": "-", "vit": "--"}
    fig, (ax_rate, ax_sparse) = plt.subplots(1, 2, figsize=(10.5, 4.0))
    eps = set()
    for kind, per in probes.items():
        for name, entry in per.items():
            eps.add(entry["eps"])
            role = "source" if name == source_name else "target"
            label = f"{LABELS.get(kind, kind)} · {name} ({role})"
            keys = [("coding_rate", ax_rate)] + (
                [("nonzero_fraction", ax_sparse)] if "nonzero_fraction" in entry else []
            )
            for key, ax in keys:
                mean, low, high = _probe_band(entry, key)
                layers = list(range(1, len(mean) + 1))
                ax.plot(layers, mean, styles.get(kind, ":"), marker="o", ms=3, color=colours[name], label=label)
                ax.fill_between(layers, low, high, color=colours[name], alpha=0.12)
    eps_text = ", ".join(f"{e:g}" for e in sorted(eps))
    ax_rate.set(
        xlabel="layer", ylabel="R_c (bits, sum over heads)", title=f"coding rate of the tokens (ε = {eps_text})"
    )
    ax_sparse.set(xlabel="layer", ylabel="non-zero fraction", title="CRATE: after ISTA", ylim=(0, 1.02))
    for ax in (ax_rate, ax_sparse):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    # one legend below both panels (the right one's series are some of the left one's), its handles long enough
    # to show a dash: a short handle with a marker on it draws the ViT's dashed lines as solid ones
    handles, labels = ax_rate.get_legend_handles_labels()
    rows = 0
    if handles:
        columns = 3 if len(handles) > 4 else len(handles)
        rows = -(-len(handles) // columns)
        fig.legend(handles, labels, loc="lower center", ncol=columns, fontsize=7, handlelength=4.0, frameon=False)
    fig.tight_layout(rect=(0.0, 0.05 * rows, 1.0, 1.0))
    return save_figure(fig, path, dpi=120)


# ----------------------------------------------------------------------------- text


def _pm(entry: dict[str, Any] | None) -> str:
    """A model's mean error over persons with its 95 % t-interval over them (one seed: the training run's own
    variation is not in it); the mean alone where the persons were not kept."""
    if not entry or entry.get("mean") is None or not math.isfinite(entry["mean"]):
        return "-"
    persons = list((entry.get("per_person") or {}).values())
    if len(persons) < 2:
        return f"{entry['mean']:.2f}"
    _, low, high = interval(persons)
    return format_interval(entry["mean"], low, high, ".2f")


def _rows(results: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """The summary table: one row per model, in-domain and each target's cross-domain error."""
    errors = results["errors"]
    ((val_name, in_domain),) = errors["in_domain"].items()
    targets = list(errors["cross_domain"])
    trunc = results["truncation"]
    params = {
        "constant": "0",
        "vit": f"{results['models']['vit']['parameters']:,}",
        "crate": f"{results['models']['crate']['parameters']:,}",
        "crate_truncated": f"{trunc['parameters_truncated']:,}",
        "crate_alfa": f"{trunc['parameters_truncated']:,} + {results['alfa']['adapter_parameters']:,}/person",
    }
    compact = results["alfa"].get("adapter_compact_numbers")
    if compact is not None:
        params["crate_alfa"] += f" (compact file: {compact:,})"
    names = {
        "constant": "constant (source mean gaze)",
        "vit": "ViT",
        "crate": "CRATE",
        "crate_truncated": f"CRATE truncated (rank {trunc['rank']}) + recovery",
        "crate_alfa": "CRATE truncated + Alfa (per person)",
    }
    in_domain_rows = {
        **in_domain,
        "crate_truncated": trunc["in_domain_after_recovery"],
    }
    header = ["model", "parameters", f"{val_name} (in-domain)", *(f"{t} (cross-domain)" for t in targets)]
    rows = []
    for key, label in names.items():
        rows.append(
            [
                label,
                params[key],
                _pm(in_domain_rows.get(key)),
                *(_pm(errors["cross_domain"][t].get(key)) for t in targets),
            ]
        )
    return header, rows


def format_summary(results: dict[str, Any]) -> str:
    """The plain-text table the command prints, with the truncation, personalization and merge lines."""
    header, rows = _rows(results)
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def fmt(r: list[str]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))

    lines = [
        "angular error (deg), mean over persons [95 % t-interval over them]; cross-domain: images after the first "
        f"{results['config']['personalize']['n_adapt']} of each person",
        fmt(header),
        "  ".join("-" * w for w in widths),
        *(fmt(r) for r in rows),
        "",
        *_findings(results),
    ]
    return "\n".join(lines)


def _probe_levels(entry: dict[str, Any], key: str) -> Any | None:
    """Per layer, the mean over persons of ``key`` (each person's probe images averaged first) and its 95 %
    t-interval over them: an array ``(3, layers)`` of mean, low and high; ``None`` where the record kept no
    persons (made before they were) or fewer than two."""
    per = entry.get(f"{key}_per_person") or {}
    return interval(list(per.values())) if len(per) >= 2 else None


def _probe_cell(entry: dict[str, Any], key: str, layer: int, fmt: str) -> str:
    """A probe's level at ``layer``: mean over persons [t-interval], or mean ± spread over images (an old record)."""
    levels = _probe_levels(entry, key)
    if levels is None:
        return f"{entry[key][layer]:{fmt}} ± {entry[f'{key}_std'][layer]:{fmt}}"
    return format_interval(*(float(v) for v in levels[:, layer]), fmt)


def _trend(entry: dict[str, Any], key: str) -> str:
    """First → last layer, where the curve peaks and bottoms out, and how many layer-to-layer steps go down; where
    the persons were kept, the change and every step are differences paired over persons, each with its 95 %
    t-interval (one at a time: descriptive)."""
    import numpy as np

    levels = _probe_levels(entry, key)
    values = list(entry[key]) if levels is None else [float(v) for v in levels[0]]
    downs = sum(b < a for a, b in zip(values, values[1:]))
    top = max(range(len(values)), key=values.__getitem__)
    low = min(range(len(values)), key=values.__getitem__)
    steps = f"{downs} of {len(values) - 1} layer steps down"
    change = ""
    if levels is not None:
        rows = np.asarray(list(entry[f"{key}_per_person"].values()), dtype=np.float64)
        last_first = interval(rows[:, -1] - rows[:, 0])
        clear = int((interval(rows[:, 1:] - rows[:, :-1])[2] < 0).sum())
        change = f", last − first {format_interval(*(float(v) for v in last_first), '.3g')} over {len(rows)} persons"
        steps += f" in the means, {clear} with the whole interval below zero"
    return (
        f"{values[0]:.3g} → {values[-1]:.3g}{change} (highest {values[top]:.3g} at layer {top + 1}, lowest "
        f"{values[low]:.3g} at layer {low + 1}; {steps})"
    )


def _paired(a: dict[str, Any], b: dict[str, Any]) -> tuple[float, float, float, int] | None:
    """``a − b`` over the persons both scored: the mean difference and its 95 % Student-t interval (persons are
    the unit; one seed, so the interval says nothing of training noise); ``None`` under two persons."""
    persons = sorted(set(a["per_person"]) & set(b["per_person"]))
    diffs = [a["per_person"][p] - b["per_person"][p] for p in persons]
    if len(diffs) < 2:
        return None
    mean, low, high = (float(v) for v in interval(diffs))
    return mean, low, high, len(diffs)


def _versus(a: dict[str, Any], b: dict[str, Any], names: tuple[str, str]) -> str:
    """``names[0] − names[1]`` with its interval, and whether the interval excludes zero."""
    diff = _paired(a, b)
    if diff is None:
        return f"{names[0]} − {names[1]}: too few persons for an interval"
    mean, low, high, n = diff
    # "clear" is the benchmark's word for a Holm-corrected verdict; this page makes none (one seed, one comparison
    # at a time), so it says only whether the interval excludes zero
    lower = names[0] if mean < 0 else names[1]
    verdict = "the interval contains zero" if low <= 0 <= high else f"{lower} lower, the interval clear of zero"
    return f"{names[0]} − {names[1]} {mean:+.2f} [{low:+.2f}, {high:+.2f}] deg (paired over {n} persons): {verdict}"


def _on_shared(a: dict[str, Any], b: dict[str, Any]) -> tuple[str, str]:
    """``a``'s and ``b``'s cells on the persons both scored (a person whose personalization failed has no Alfa
    error), so that they differ by the paired difference :func:`_versus` gives."""
    pa, pb = a.get("per_person") or {}, b.get("per_person") or {}
    shared = [p for p in pa if p in pb]
    if not shared:
        return _pm(a), _pm(b)
    on = [{"mean": sum(x[p] for p in shared) / len(shared), "per_person": {p: x[p] for p in shared}} for x in (pa, pb)]
    return _pm(on[0]), _pm(on[1])


def _findings(results: dict[str, Any]) -> list[str]:
    """Plain sentences computed from the numbers (no judgement is hand-written). Every difference carries a 95 %
    interval over the persons both sides scored, and says whether it excludes zero (one comparison at a time, no
    correction for the page's several: descriptive, never "clear" in the benchmark's corrected sense)."""
    errors = results["errors"]
    ((val_name, in_domain),) = errors["in_domain"].items()
    lines = []
    c, v, k = (_pm(in_domain[m]) for m in ("crate", "vit", "constant"))
    lines.append(
        f"In-domain ({val_name}): CRATE {c}, ViT {v}, constant {k} deg; "
        + _versus(in_domain["crate"], in_domain["vit"], ("CRATE", "ViT"))
        + "."
    )
    for target, cols in errors["cross_domain"].items():
        c, v, k = (_pm(cols[m]) for m in ("crate", "vit", "constant"))
        against = "; ".join(_versus(cols[m], cols["constant"], (LABELS[m], "constant")) for m in MODELS)
        lines.append(
            f"Cross-domain ({target}): CRATE {c}, ViT {v}, constant {k} deg; "
            + _versus(cols["crate"], cols["vit"], ("CRATE", "ViT"))
            + f"; {against}."
        )
    t = results["truncation"]
    kept = t.get("in_domain_after_truncation")  # a record made before it was kept has the mean alone
    truncated = _pm(kept) if kept else f"{t['in_domain_error']['after_truncation']:.2f} deg (its persons not kept)"
    lines.append(
        f"Truncation at rank {t['rank']} ({t['factorized_layers']} layers): {t['parameters_dense']:,} -> "
        f"{t['parameters_truncated']:,} parameters; in-domain {_pm(in_domain['crate'])} -> "
        f"{truncated}, {_pm(t['in_domain_after_recovery'])} after "
        f"{t['recovery_epochs']} recovery epoch(s); "
        + _versus(t["in_domain_after_recovery"], in_domain["crate"], ("recovered", "dense"))
        + "."
    )
    for target, p in results["alfa"]["personalization"].items():
        cols = errors["cross_domain"][target]
        lines.append(
            f"Alfa on {target}: {' -> '.join(_on_shared(cols['crate_truncated'], cols['crate_alfa']))} deg; "
            + _versus(cols["crate_alfa"], cols["crate_truncated"], ("Alfa", "truncated"))
            + f"; lower for {p['improved']} of {p['compared']} persons"
            + (f"; {len(p['failed'])} failed." if p["failed"] else ".")
        )
    m = results["alfa"]["merge_check"]
    if m is not None:
        lines.append(
            f"Merge check ({m['target']}, person {m['person']}): merged vs unmerged outputs differ by at most "
            f"{m['max_abs_diff']:.2e} (relative {m['max_rel_diff']:.2e}; the adapter itself moved them by up to "
            f"{m['max_abs_change_vs_base']:.2e} rad); parameters after merge "
            f"{m['parameters_merged']:,} (base {m['parameters_base']:,})."
        )
    probes = results["probes"]["results"]
    for kind in MODELS:
        for name, entry in probes[kind].items():
            text = f"Probe {LABELS[kind]} on {name}: R_c {_trend(entry, 'coding_rate')}"
            if "nonzero_fraction" in entry:
                text += f"; non-zero after ISTA {_trend(entry, 'nonzero_fraction')}"
            lines.append(text + ".")
    return lines


def format_markdown(results: dict[str, Any], figure: str | None = None) -> str:
    """A generated markdown page: how it was made, the error table, truncation, personalization per
    person, the merge check, the probe figure (``figure``: its path relative to the page) and per-layer
    probe tables, and the limits of what it shows."""
    command = results.get("command") or "(run through the Python API: alfa.study.crate.gaze.run_crate_gaze)"
    lines = [
        *_markdown_title(results, command),
        *_markdown_setup(results),
        *_markdown_errors(results),
        *_markdown_per_person(results),
        *_markdown_probes(results, figure),
        *_markdown_limits_and_rerun(results, command),
    ]
    return "\n".join(lines)


def _markdown_title(results: dict[str, Any], command: str) -> list[str]:
    """The page's title, how it was generated, and what kind of run it is."""
    cfg = results["config"]
    return [
        "# A small real use of CRATE: gaze on the synthetic worlds",
        "",
        f"<!-- Generated by `{command}`. Do not edit by hand: re-run the command. -->",
        "",
        f"Generated by `{command}` (seed {cfg['seed']}, data seed {cfg['data_seed']}, "
        f"{results['torch_threads']} torch thread(s), {results['seconds']['total'] / 60:.1f} min wall time, "
        f"torch {results['torch_version']}{', on ' + results['cpu'] if results.get('cpu') else ''}). Every number "
        "below comes from that run's `results.json`.",
        "",
        "A tiny CRATE and a tiny ViT of the same width, depth and heads are trained from scratch for a few epochs "
        "on CPU. This is a small use, not a benchmark: one seed, few images, short training, synthetic faces. The "
        "same seed gives the same numbers on the same kind of machine; another kind renders the synthetic faces a "
        "few bits apart and so trains other models, and with one seed the comparisons below can change with it "
        "([gaze.md](gaze.md#determinism)).",
        "",
        *(
            ["**Preset `quick`**: a smoke test of the chain; its numbers say nothing about the models.", ""]
            if cfg.get("preset") == "quick"
            else []
        ),
    ]


def _markdown_setup(results: dict[str, Any]) -> list[str]:
    """The Setup section: data, models, training, truncation, personalization and how errors are counted."""
    cfg = results["config"]
    data = results["data"]
    n_adapt = cfg["personalize"]["n_adapt"]
    recipe = results["alfa"]["recipe"]
    return [
        "## Setup",
        "",
        f"- **Data** (`docs/synthetic.md`): source `{data['source']['spec']}` ({data['source']['persons']} persons, "
        f"{data['source']['images']} images); in-domain error on `{data['val']['spec']}` (held-out source persons, "
        f"every image scored); targets "
        + ", ".join(
            f"`{t['spec']}` ({t['persons']} persons, {t['scored_per_person']} scored images each)"
            for t in data["targets"].values()
        )
        + f". The first {n_adapt} images of each target person are the unlabeled adaptation images, never scored.",
        f"- **Models**: `{results['models']['crate']['constructor']}` and `{results['models']['vit']['constructor']}` "
        f"with {cfg['image_size']}×{cfg['image_size']} images, patch {cfg['patch_size']}, dim {cfg['dim']}, "
        f"depth {cfg['depth']}, {cfg['heads']} heads, a 2-output (yaw, pitch) head; "
        f"{results['models']['crate']['parameters']:,} and {results['models']['vit']['parameters']:,} parameters "
        "(the ViT's MLP has ratio 4).",
        f"- **Training** (`alfa.gaze.train.train_source`, both models): {cfg['epochs']} epoch(s), "
        f"Adam lr {cfg['lr']:g}, "
        f"batch {cfg['batch_size']}, L1 loss + {cfg['symmetry_weight']:g} × flip-symmetry term, constant learning "
        "rate, the last epoch kept.",
        f"- **Truncation** (CRATE only): SVD rank {cfg['rank']} on every Linear layer where it saves parameters, then "
        f"{cfg['recovery_epochs']} recovery epoch(s) on the source at lr {cfg['recovery_lr']:g} "
        "(`truncate_and_recover`). Left dense: "
        + ", ".join(f"`{n}`" for n in results["truncation"]["left_dense"])
        + "; the ISTA dictionaries are not Linear layers and are neither truncated nor adapted.",
        f"- **Personalization** (`personalize_dataset`, per target person): Alfa with {cfg['alfa']['heads']} heads of "
        f"rank {cfg['alfa']['rank']} on all {len(results['alfa']['adapted_layers'])} factorized layers "
        f"({results['alfa']['adapter_parameters']:,} trained adapter parameters per person; a compact adapter file, "
        f"one d×d mix per layer, holds {results['alfa'].get('adapter_compact_numbers', 0):,} numbers); the "
        f"{n_adapt} images, one augmented copy each and the flips of all in one batch; flip-symmetry loss; "
        f"{recipe['steps']} AdamW steps "
        f"at lr {recipe['lr']:g}, ×{cfg['late_blocks_lr_scale']:g} on the later half of the blocks "
        f"(`{late_blocks_pattern(cfg['depth'])}`; ResNet-18's layer3/layer4 rule carried over); the last step is "
        "the result. Nothing is chosen on target labels.",
        "- **Errors**: angular error in degrees per person, then the mean over persons with its 95 % t-interval "
        "over them. The constant row always predicts the mean gaze of the source training labels.",
        "",
    ]


def _markdown_errors(results: dict[str, Any]) -> list[str]:
    """The Errors section: the summary table and the findings (all but the probes')."""
    header, rows = _rows(results)
    return [
        "## Errors",
        "",
        "| " + " | ".join(header) + " |",
        "| " + " | ".join(["---"] + ["---:"] * (len(header) - 1)) + " |",
        *("| " + " | ".join(r) + " |" for r in rows),
        "",
        *(f"- {line}" for line in _findings(results) if not line.startswith("Probe ")),
        "",
    ]


def _markdown_per_person(results: dict[str, Any]) -> list[str]:
    """Per target, one table row per person: every model's error, Alfa's change and the flip loss."""
    lines = ["### Per person (cross-domain)", ""]
    for target, p in results["alfa"]["personalization"].items():
        cols = results["errors"]["cross_domain"][target]
        lines += [
            f"**{target}** (min–max over persons: CRATE {cols['crate']['min']:.2f}–{cols['crate']['max']:.2f}, "
            f"ViT {cols['vit']['min']:.2f}–{cols['vit']['max']:.2f}, "
            f"Alfa {p['alfa']['min']:.2f}–{p['alfa']['max']:.2f})",
            "",
            "| person | constant | ViT | CRATE | CRATE truncated | + Alfa | Δ Alfa | flip loss first → last |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for person, row in p["persons"].items():
            vals = [cols[k]["per_person"].get(person) for k in ("constant", "vit", "crate")]
            b, a = row["truncated"], row["alfa"]
            cells = [f"{x:.2f}" if x is not None else "-" for x in (*vals, b, a)]
            delta = f"{a - b:+.2f}" if a is not None and b is not None else "-"
            loss = (
                f"{row['first_loss']:.4f} → {row['final_loss']:.4f}"
                if row["first_loss"] is not None and row["final_loss"] is not None
                else "failed"
            )
            lines.append(f"| {person} | " + " | ".join(cells) + f" | {delta} | {loss} |")
        lines.append("")
    return lines


def _markdown_probes(results: dict[str, Any], figure: str | None) -> list[str]:
    """The per-layer probes: what they measure, the figure, a table per layer and the probe findings."""
    probes = results["probes"]
    lines = [
        "## Per-layer probes",
        "",
        f"On a fixed batch (the first {probes['images_per_person']} images of every person of each data set; labels "
        f"unused), `alfa.study.crate.probes.probe_model` records per layer the coding rate `R_c` of the tokens "
        f"(per head on `U_kᵀ z` for CRATE and on the value projection for the ViT, tokens normalized, "
        f"ε = {probes['eps']:g}, summed over heads) and, for CRATE, the fraction of non-zero coordinates after "
        "ISTA (spec crate.md §3).",
        "",
    ]
    if figure:
        lines += [f"![probe curves]({figure})", ""]
    sets = list(probes["results"]["crate"])
    head = ["layer"] + [f"{LABELS[k]} R_c {s}" for k in MODELS for s in sets] + [f"CRATE non-zero {s}" for s in sets]
    lines += ["| " + " | ".join(head) + " |", "| " + " | ".join(["---:"] * len(head)) + " |"]
    depth = len(probes["results"]["crate"][sets[0]]["coding_rate"])
    for layer in range(depth):
        cells = [str(layer + 1)]
        cells += [_probe_cell(probes["results"][kind][s], "coding_rate", layer, ".2f") for kind in MODELS for s in sets]
        cells += [_probe_cell(probes["results"]["crate"][s], "nonzero_fraction", layer, ".3f") for s in sets]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", *(f"- {line}" for line in _findings(results) if line.startswith("Probe ")), ""]
    return lines


def _probe_limit(probes: dict[str, Any]) -> str:
    """What the probes' brackets (or, in a record that kept no persons, their ±) are."""
    if all("coding_rate_per_person" in e for per in probes["results"].values() for e in per.values()):
        return (
            f"The probes' intervals are over persons: each person's {probes['images_per_person']} probe images are "
            "averaged first, since one person's images are not independent draws. The layer-to-layer differences "
            "are paired over persons, one at a time, and descriptive."
        )
    return (
        f"The probes' ± is the spread over their images ({probes['images_per_person']} per person, not independent "
        "draws), a description of the images, not an interval: this record kept no per-person values."
    )


def _markdown_limits_and_rerun(results: dict[str, Any], command: str) -> list[str]:
    """What the run does not show, and how to re-run it."""
    cfg = results["config"]
    data = results["data"]
    return [
        "## What this does and does not show",
        "",
        f"- Both models are trained from scratch for {cfg['epochs']} epoch(s) on {data['source']['images']:,} "
        f"{cfg['image_size']}-pixel faces with a constant learning rate: a short budget. Differences between CRATE "
        "and ViT here are differences after that budget, not of the architectures at convergence.",
        "- One seed: no spread over seeds is measured; the errors' intervals are over persons only, so a training "
        "run's own variation is not in them. The differences between models are paired over persons, one at a "
        "time, with no correction for the page's several: descriptive. " + _probe_limit(results["probes"]),
        "- The data are procedural faces (`docs/synthetic.md`), not the paper's datasets.",
        "",
        "## Re-running",
        "",
        "```",
        command,
        "```",
        "",
        "Seconds per stage: "
        + ", ".join(f"{k} {v:.0f}" for k, v in results["seconds"].items())
        + "."
        + _resumed_note(results),
        "",
    ]


def _resumed_note(results: dict[str, Any]) -> str:
    """Where the run resumed stages an interrupted one had begun: their times are only the resuming run's part."""
    resumed = results.get("resumed") or []
    if not resumed:
        return ""
    return (
        f" The run resumed what an interrupted run had begun ({', '.join(resumed)}): those stages' seconds, and the "
        "wall time above, count only the resuming run's part."
    )
