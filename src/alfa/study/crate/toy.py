"""The plane toy of spec crate.md §4: what one CRATE step does to two clusters of tokens in ``R²``.

Forty tokens: twenty near ``u₁`` (30°), twenty near ``u₂`` (120°), each its direction's unit vector
plus Gaussian noise (σ = 0.35 per coordinate), drawn exactly as the spec says so that seed 0 is the
chapter's first panel. Six layers; each first rescales every token to the panel's token length,
then applies one step:

* (a) the ``u₁`` cluster alone, length 1, coding-rate gradient step, ``κ = 1``;
* (b) both clusters, length 1, the same gradient step on all forty, ``κ = 1``;
* (c) both clusters, length 3, softmax step with one head ``U = I₂``, ``κ = 5``
  (variant ``c-len1``: the same with length 1);
* (d) as (c), each layer followed by an ISTA step with the axis dictionary ``D = I₂``.

Measurement convention: every layer's tokens — layer 0 is the input — are measured after rescaling
to the panel's token length, i.e. as the next layer sees them. ``R`` and the thickness depend on
token lengths, so this keeps the layers comparable (the softmax step's convex combinations, for
instance, shorten tokens; the next layer undoes that).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from alfa import fileio
from alfa.gaze.tdist import t_quantile

from ..plotted import save_figure
from ..timing import torch_threads
from .coding_rate import clustered_coding_rate, coding_rate, coding_rate_step

__all__ = [
    "PANELS",
    "DEFAULT_PANELS",
    "EPS_RANGE",
    "MAX_LAYERS",
    "ToyPanel",
    "ToyConfig",
    "ToyRun",
    "draw_tokens",
    "run_panel",
    "run_toy",
    "LEVEL",
    "METRICS",
    "interval",
    "format_interval",
    "format_run",
    "seed_values",
    "aggregate",
    "panel_cells",
    "panel_header",
    "panel_heading",
    "format_aggregate",
    "read_panel",
    "write_json",
    "plot_toy",
]

U1 = np.array([math.cos(math.radians(30)), math.sin(math.radians(30))])
U2 = np.array([math.cos(math.radians(120)), math.sin(math.radians(120))])


@dataclass(frozen=True)
class ToyPanel:
    """One configuration of the toy: which clusters, which step, token length and ``κ``."""

    key: str  # the name on the command line
    panel: str  # the spec's panel letter (the variant of (c) is panel "c" with length 1)
    title: str
    length: float
    kappa: float
    step: str  # "gradient" or "softmax"
    both_clusters: bool = True
    ista: bool = False


PANELS: dict[str, ToyPanel] = {
    p.key: p
    for p in (
        ToyPanel("a", "a", "(a) u₁ cluster alone, gradient step", 1, 1.0, "gradient", both_clusters=False),
        ToyPanel("b", "b", "(b) both clusters, gradient step on all", 1, 1.0, "gradient"),
        ToyPanel("c", "c", "(c) softmax step, token length 3", 3, 5.0, "softmax"),
        ToyPanel("c-len1", "c", "(c') softmax step, token length 1", 1, 5.0, "softmax"),
        ToyPanel("d", "d", "(d) softmax step + ISTA (D = I₂)", 3, 5.0, "softmax", ista=True),
    )
}
DEFAULT_PANELS = tuple(PANELS)


EPS_RANGE = (1e-6, 1e6)
"""The ``ε`` the toy takes. Its tokens have length 1 or 3: within this range ``c = p/(n ε²)`` and the rates stay well
inside float64 (at ``ε = 1e6`` the rates are about 1e-12 bits, still several digits above float64's rounding), while
far outside it ``ε²`` overflows or underflows, the softmax step's weight ``κ p/(n ε²)`` overflows the tokens (they
come out as zeros: ``ε = 1e-100``), or every rate rounds to 0 (``ε = 1e12``)."""

EPS_WHY = "the tokens have length 1 or 3: far outside, the rates over- or underflow float64"
"""Why :data:`EPS_RANGE`, in a message's words."""

MAX_LAYERS = 1000
"""The most layers the toy runs: each layer is a row of every table, and its tokens long stop moving after a few
(the spec runs 6); a mistyped count would otherwise run for hours and hold every layer's tokens in memory."""


@dataclass
class ToyConfig:
    """Constants of the toy; the defaults are the spec's (ISTA's ``η``, ``λ`` as in CRATE)."""

    eps: float = 0.5
    eta: float = 0.1
    lam: float = 0.1
    layers: int = 6
    noise: float = 0.35
    tokens_per_cluster: int = 20

    def validate(self) -> None:
        low, high = EPS_RANGE
        if not low <= self.eps <= high:  # NaN fails too
            raise ValueError(f"eps must be from {low:g} to {high:g} ({EPS_WHY}), got {self.eps}")
        # With D = I, ISTA is ReLU(Z - ηλ): any finite threshold is a step (one above the token length zeroes them all)
        if not (math.isfinite(self.eta) and math.isfinite(self.lam) and self.eta >= 0 and self.lam >= 0):
            raise ValueError(f"eta and lam must be finite and non-negative, got eta={self.eta}, lam={self.lam}")
        if not 1 <= self.layers <= MAX_LAYERS or self.tokens_per_cluster < 2:
            raise ValueError(
                f"need 1 to {MAX_LAYERS} layers and at least 2 tokens per cluster, got {self.layers}, "
                f"{self.tokens_per_cluster}"
            )


@dataclass
class ToyRun:
    """One panel on one seed: per-layer statistics (layer 0 is the input) and the measured tokens."""

    key: str
    panel: str
    length: float
    kappa: float
    seed: int
    eps: float
    eta: float | None
    lam: float | None
    layers: list[dict] = field(default_factory=list)
    tokens: list[np.ndarray] = field(default_factory=list)  # (2, n) per layer, for the figure
    labels: np.ndarray | None = None

    def to_dict(self) -> dict:
        out = {
            "key": self.key,
            "panel": self.panel,
            "length": self.length,
            "kappa": self.kappa,
            "seed": self.seed,
            "eps": self.eps,
        }
        if self.eta is not None:
            out.update(eta=self.eta, lam=self.lam)
        out["layers"] = self.layers
        return out


def draw_tokens(seed: int, noise: float = 0.35, per_cluster: int = 20) -> tuple[np.ndarray, np.ndarray]:
    """``Z = [Z₁ Z₂]`` (2 × 2·per_cluster, tokens as columns) and the cluster label of each token."""
    rng = np.random.default_rng(seed)
    Z1 = U1[:, None] + noise * rng.standard_normal((2, per_cluster))
    Z2 = U2[:, None] + noise * rng.standard_normal((2, per_cluster))
    labels = np.repeat([0, 1], per_cluster)
    return np.concatenate([Z1, Z2], axis=1), labels


def _rescale(Z: torch.Tensor, length: float) -> torch.Tensor:
    norms = Z.norm(dim=0, keepdim=True)
    # a token the ReLU zeroed entirely stays zero rather than becoming NaN
    return torch.where(norms > 0, Z * (length / norms.clamp_min(1e-300)), Z)


def _softmax_step(Z: torch.Tensor, eps: float, kappa: float) -> torch.Tensor:
    p, n = Z.shape
    kc = kappa * p / (n * eps**2)
    attention = torch.softmax(Z.T @ Z, dim=0)  # softmax over each column
    return (1 - kc) * Z + kc * Z @ attention


def _ista_step(Z: torch.Tensor, eta: float, lam: float) -> torch.Tensor:
    D = torch.eye(Z.shape[0], dtype=Z.dtype)
    return torch.relu(Z + eta * D.T @ (Z - D @ Z) - eta * lam)


def _stats(Z: torch.Tensor, labels: np.ndarray, both_clusters: bool, eps: float) -> dict:
    thickness: list[float | None] = []
    for j in (0, 1):
        if not both_clusters and j == 1:
            thickness.append(None)
            continue
        s = torch.linalg.svdvals(Z[:, torch.from_numpy(labels == j)])
        thickness.append(float(s[1] / s[0]) if s[0] > 0 else 0.0)
    label_t = torch.from_numpy(labels)
    R = float(coding_rate(Z, eps))
    Rc = float(clustered_coding_rate(Z, label_t, eps))
    # Nearer to the other direction's line than to its own (|cos| compares lines through 0). In (a) the
    # "other" direction is u₂ although its cluster is not drawn.
    dirs = torch.from_numpy(np.stack([U1, U2]))  # (2 directions, 2 coords)
    cos = (dirs @ Z).abs()  # (2, n)
    own = cos[label_t, torch.arange(Z.shape[1])]
    other = cos[1 - label_t, torch.arange(Z.shape[1])]
    nonzero = (Z != 0).sum(0)
    return {
        "thickness": thickness,
        "R": R,
        "Rc": Rc,
        "dR": R - Rc,
        "misassigned": int((other > own).sum()),
        "one_axis_share": float((nonzero == 1).double().mean()),
    }


def run_panel(key: str, seed: int, config: ToyConfig | None = None) -> ToyRun:
    """Run one panel (``"a"``, ``"b"``, ``"c"``, ``"c-len1"`` or ``"d"``) on one seed."""
    with torch_threads(1):  # 2×2 and 40×40 matrices: thread hand-offs would cost 10-50× the arithmetic
        return _run_panel(key, seed, config)


def _run_panel(key: str, seed: int, config: ToyConfig | None) -> ToyRun:
    config = config or ToyConfig()
    config.validate()
    if key not in PANELS:
        raise ValueError(f"unknown toy panel {key!r}; known: {', '.join(PANELS)}")
    panel = PANELS[key]
    Z_np, labels = draw_tokens(seed, config.noise, config.tokens_per_cluster)
    if not panel.both_clusters:
        Z_np, labels = Z_np[:, labels == 0], labels[labels == 0]
    run = ToyRun(
        key=key,
        panel=panel.panel,
        length=panel.length,
        kappa=panel.kappa,
        seed=seed,
        eps=config.eps,
        eta=config.eta if panel.ista else None,
        lam=config.lam if panel.ista else None,
        labels=labels,
    )
    Z = torch.from_numpy(Z_np)  # float64
    for layer in range(config.layers + 1):
        if layer > 0:
            Z = _rescale(Z, panel.length)
            if panel.step == "gradient":
                Z = coding_rate_step(Z, config.eps, panel.kappa)
            else:
                Z = _softmax_step(Z, config.eps, panel.kappa)
            if panel.ista:
                Z = _ista_step(Z, config.eta, config.lam)
        measured = _rescale(Z, panel.length)
        run.layers.append(_stats(measured, labels, panel.both_clusters, config.eps))
        run.tokens.append(measured.numpy().copy())
    return run


def run_toy(
    panels: tuple[str, ...] | list[str], seeds: list[int], config: ToyConfig | None = None, *, progress: bool = False
) -> list[ToyRun]:
    """Every panel on every seed, panels outermost; ``progress``: a progress bar over the runs on stderr (for more
    than one run)."""
    unknown = [p for p in panels if p not in PANELS]
    if unknown:
        raise ValueError(f"unknown toy panel(s) {', '.join(map(repr, unknown))}; known: {', '.join(PANELS)}")
    (config or ToyConfig()).validate()  # before a bar is drawn
    jobs = [(key, seed) for key in panels for seed in seeds]
    if progress and len(jobs) > 1:  # one run is over in a second; tqdm imported only here, where a bar is drawn
        from tqdm.auto import tqdm

        jobs = tqdm(jobs, desc="crate toy", unit="run", leave=False)
    with torch_threads(1):  # as run_panel
        return [_run_panel(key, seed, config) for key, seed in jobs]


def _describe(key: str, config_eta: float | None = None, config_lam: float | None = None) -> str:
    p = PANELS[key]
    text = f"{p.title}; length {p.length:g}, κ = {p.kappa:g}"
    if p.ista and config_eta is not None:
        text += f", η = {config_eta:g}, λ = {config_lam:g}"
    return text


def _num(x: float, fmt: str) -> str:
    text = f"{x:{fmt}}"
    return text.lstrip("-") if float(text) == 0 else text  # no "-0.000" from rounding noise


LEVEL = 0.95
"""The confidence level of every interval over seeds the toy prints, draws and renders."""

METRICS = ("thickness1", "thickness2", "R", "Rc", "dR", "misassigned", "one_axis_share")
"""The per-layer measures, as :func:`seed_values` and :func:`aggregate` name them."""

FORMATS = {"misassigned": ".1f", "one_axis_share": ".2f"}
"""How a measure's numbers are printed, where not with three decimals."""


def interval(values: np.ndarray | list) -> np.ndarray:
    """The mean over the first axis (the seeds) and its 95 % Student-t interval: an array of ``mean``, ``low``,
    ``high`` stacked on a new first axis; ``low`` and ``high`` are NaN for fewer than two seeds."""
    x = np.asarray(values, dtype=np.float64)
    n = x.shape[0]
    mean = x.mean(0)
    if n < 2:
        return np.stack([mean, np.full_like(mean, np.nan), np.full_like(mean, np.nan)])
    half = float(t_quantile(1 - LEVEL, n - 1)) * x.std(0, ddof=1) / math.sqrt(n)
    return np.stack([mean, mean - half, mean + half])


def format_interval(mean: float, low: float, high: float, fmt: str = ".3f") -> str:
    """``mean [low, high]``; ``mean`` alone without an interval, ``-`` for no value (NaN)."""
    if np.isnan(mean):
        return "-"
    if np.isnan(low) or np.isnan(high):
        return _num(mean, fmt)
    return f"{_num(mean, fmt)} [{_num(low, fmt)}, {_num(high, fmt)}]"


_HEADER = f"{'layer':>5} {'thick1':>8} {'thick2':>8} {'R':>8} {'R_c':>8} {'ΔR':>8} {'misassigned':>12} {'one-axis':>9}"


def format_run(run: ToyRun) -> str:
    """A table of one run, one row per layer."""
    n = len(run.labels) if run.labels is not None else 0
    lines = [f"{_describe(run.key, run.eta, run.lam)}; seed {run.seed}", _HEADER]
    for layer, s in enumerate(run.layers):
        t1, t2 = s["thickness"]
        t2_text = f"{t2:8.3f}" if t2 is not None else f"{'-':>8}"
        lines.append(
            f"{layer:5d} {t1:8.3f} {t2_text} {s['R']:8.3f} {s['Rc']:8.3f} {_num(s['dR'], '.3f'):>8} "
            f"{s['misassigned']:>9d}/{n:<2d} {s['one_axis_share']:9.2f}"
        )
    return "\n".join(lines)


def seed_values(runs: list[ToyRun]) -> dict[str, dict[str, np.ndarray]]:
    """Per panel key (in the order of ``runs``): each of :data:`METRICS` as a ``(seeds, layers)`` array, one
    row per run of that key in the order of ``runs``; ``thickness2`` is NaN in (a)."""
    by_key: dict[str, list[ToyRun]] = {}
    for run in runs:
        by_key.setdefault(run.key, []).append(run)
    out: dict[str, dict[str, np.ndarray]] = {}
    for key, group in by_key.items():
        table = {
            "thickness1": [[s["thickness"][0] for s in r.layers] for r in group],
            "thickness2": [
                [np.nan if s["thickness"][1] is None else s["thickness"][1] for s in r.layers] for r in group
            ],
            **{m: [[s[m] for s in r.layers] for r in group] for m in METRICS[2:]},
        }
        out[key] = {name: np.asarray(rows, dtype=np.float64) for name, rows in table.items()}
    return out


def aggregate(runs: list[ToyRun]) -> dict[str, dict[str, np.ndarray]]:
    """Per panel key: ``metric -> (3, layers)`` array of the mean over the seeds and its 95 % interval
    (:func:`interval`). Metrics: :data:`METRICS`; ``thickness2`` is NaN in (a)."""
    return {key: {m: interval(v) for m, v in values.items()} for key, values in seed_values(runs).items()}


def panel_cells(values: dict[str, np.ndarray]) -> list[list[str]]:
    """One panel's table as text: per layer, the layer and each metric's ``mean [low, high]``."""
    stats = {name: interval(v) for name, v in values.items()}
    return [
        [str(layer)] + [format_interval(*stats[m][:, layer], FORMATS.get(m, ".3f")) for m in METRICS]
        for layer in range(values["R"].shape[1])
    ]


def panel_header(n: int) -> list[str]:
    """The column names of :func:`panel_cells`; ``n`` tokens in the panel."""
    return ["layer", "thickness 1", "thickness 2", "R", "R_c", "ΔR", f"misassigned/{n}", "one-axis"]


def over_seeds(seeds: int) -> str:
    """What a table, a cell or a figure shows: ``"the mean and its 95 % interval over 3 seeds"``; one seed has
    no interval."""
    if seeds == 1:
        return "one seed (no interval)"
    return f"the mean and its {LEVEL * 100:.0f} % interval over {seeds} seeds"


def panel_heading(run: ToyRun, seeds: int) -> str:
    """What a panel's table is of: the panel, its constants, and over how many seeds."""
    over = f"mean [{LEVEL * 100:.0f} % interval] over {seeds} seeds" if seeds > 1 else over_seeds(seeds)
    return f"{_describe(run.key, run.eta, run.lam)}; {over}"


def format_aggregate(runs: list[ToyRun]) -> str:
    """Per panel, a table of the mean over the seeds and its 95 % interval per layer, and its reading."""
    blocks = []
    for key, values in seed_values(runs).items():
        first = next(r for r in runs if r.key == key)
        n = len(first.labels) if first.labels is not None else 0
        rows = [panel_header(n), *panel_cells(values)]
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        lines = [panel_heading(first, values["R"].shape[0])]
        lines += [" ".join(cell.rjust(w) for cell, w in zip(row, widths)) for row in rows]
        lines.append(read_panel(values, n))
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def _from_layer(holds: np.ndarray) -> int | None:
    """The first layer from which on ``holds`` (``(seeds, layers)``) is true in every seed; ``None`` if it is
    not at the last layer."""
    every = holds.all(0)
    if not every[-1]:
        return None
    layer = len(every) - 1
    while layer > 0 and every[layer - 1]:
        layer -= 1
    return layer


ZERO = 1e-9
"""Below this a thickness or ΔR counts as exactly zero (they are computed in float64)."""


def read_panel(values: dict[str, np.ndarray], n: int) -> str:
    """Sentences that read one panel's table (``values`` as :func:`seed_values` gives them; ``n`` tokens): what
    the layers did from the input to the last layer, each mean with its 95 % interval, how far the seeds
    spread at the last layer, and what holds in every seed."""
    stats = {name: interval(v) for name, v in values.items()}
    last = values["R"].shape[1] - 1

    def at(name: str, layer: int) -> str:
        return format_interval(*stats[name][:, layer], FORMATS.get(name, ".3f"))

    def move(name: str) -> str:
        return f"{at(name, 0)} → {at(name, last)}"

    names = ["thickness1"] if np.isnan(values["thickness2"]).all() else ["thickness1", "thickness2"]
    one = len(names) == 1
    subject, shrunk, each = _thickness_phrase([stats[name][0] for name in names], last)
    words = [f"Reading: over the layers {subject}"]
    # a phrase of each cluster's own ends in a comma: what follows is said of both ("…, and they are merged")
    words.append("(thickness " + " and ".join(move(name) for name in names) + ")" + ("," if each else ""))
    if one:
        r0, r1 = (round(float(stats["R"][0, layer]), 3) for layer in (0, last))  # as the table prints them
        rate = "falls" if r1 < r0 else "rises" if r1 > r0 else "stays"
        words.append(f"and its coding rate {rate} (R {move('R')} bits)")
    else:
        d0, d1 = stats["dR"][0, 0], stats["dR"][0, last]
        # "are compressed and merged", "thin somewhat and are merged", "cluster 1 …, and they are merged"
        also = "and they are" if each else "and" if shrunk else "and are"
        if d1 > 1.2 * d0:
            words.append(f"{also} pulled apart relative to their size (ΔR {move('dR')})")
        elif d1 < 0.8 * d0 and abs(d1) < 0.0005:  # zero as the table prints it
            words.append(f"{also} merged (ΔR {move('dR')}: nothing tells them apart any more)")
        elif d1 < 0.8 * d0:
            words.append(f"{also} drawn together (ΔR {move('dR')})")
        else:
            words.append(f"while ΔR stays {at('dR', last)}")
    sentences = [" ".join(words) + "."]
    if not one:
        sentences.append(f"R_c {move('Rc')} bits; misassigned tokens {move('misassigned')} of {n}.")
    spread = [_spread(values[name][:, last]) for name in names]
    seeds = values["R"].shape[0]
    if seeds == 1:
        pass  # no spread over seeds: the table gives the one seed's values
    elif one:
        sentences.append(f"At layer {last} the thickness over the {seeds} seeds {spread[0]}.")
    else:
        sentences.append(f"At layer {last} over the {seeds} seeds thickness 1 {spread[0]}, thickness 2 {spread[1]}.")
    sentences += _every_seed(values, names, n)
    sentences += _one_axis(values, at)
    return " ".join(sentences)


THICKNESS_VERBS = {
    "compressed": ("is compressed", "are compressed"),
    "kept": ("barely changes in thickness", "barely change in thickness"),
    "thinner": ("thins somewhat", "thin somewhat"),
    "thicker": ("thickens", "thicken"),
}
"""What a cluster's thickness did from the input to the last layer (:func:`_thickness_change`), said of one cluster
and of both."""


def _thickness_change(first: float, last: float) -> str:
    """Which of :data:`THICKNESS_VERBS` a cluster's mean thickness from ``first`` to ``last`` is: halved or more,
    within 5 % of its start, or else thinner or thicker."""
    if last < 0.5 * first:
        return "compressed"
    if abs(last - first) <= 0.05 * max(first, 1e-12):
        return "kept"
    return "thinner" if last < first else "thicker"


def _thickness_phrase(means: list[np.ndarray], last: int) -> tuple[str, bool, bool]:
    """The subject and verb of a reading's first sentence (``means``: each cluster's mean thickness per layer),
    whether every cluster was compressed, and whether the clusters got a verb each (they moved apart in direction:
    "cluster 1 thins somewhat and cluster 2 thickens"). Every verb follows the direction of its numbers."""
    kinds = [_thickness_change(t[0], t[last]) for t in means]
    if len(means) == 1:
        return f"the cluster {THICKNESS_VERBS[kinds[0]][0]}", kinds[0] == "compressed", False
    if len(set(kinds)) == 1:
        shared = kinds[0]
    elif all(t[last] < t[0] for t in means):  # e.g. one halved, the other thinner: both thinner
        shared = "thinner"
    elif all(t[last] > t[0] for t in means):
        shared = "thicker"
    else:
        each = " and ".join(f"cluster {j} {THICKNESS_VERBS[kind][0]}" for j, kind in enumerate(kinds, 1))
        return each, False, True
    return f"the clusters {THICKNESS_VERBS[shared][1]}", shared == "compressed", False


def _spread(values: np.ndarray) -> str:
    """How far one measure spreads over the seeds (the seeds' own spread, not the mean's uncertainty)."""
    low, high = _num(values.min(), ".3f"), _num(values.max(), ".3f")
    return f"is {low} in every seed" if low == high else f"ranges from {low} to {high}"


def _every_seed(values: dict[str, np.ndarray], names: list[str], n: int) -> list[str]:
    """What holds exactly in every seed from some layer on: a cluster flat (thickness 0; with both flat, ΔR 0
    too), and one same number of misassigned tokens."""
    flat = [_from_layer(values[name] <= ZERO) for name in names]
    one_seed = values["misassigned"].shape[0] == 1
    every = "" if one_seed else ", in every seed,"
    sentences = []
    if len(names) == 2 and None not in flat:
        layer = max(flat)
        zero_dr = (_from_layer(np.abs(values["dR"]) <= ZERO) or 0) <= layer
        sentences.append(
            f"From layer {layer} on{every} both clusters are flat (thickness 0{', ΔR 0' if zero_dr else ''})."
        )
    else:
        cluster = ["the cluster"] if len(names) == 1 else ["cluster 1", "cluster 2"]
        sentences += [
            f"From layer {layer} on{every} {cluster[j]} is flat (thickness 0)."
            for j, layer in enumerate(flat)
            if layer is not None
        ]
    wrong = values["misassigned"]
    same = _from_layer(wrong == wrong[0, -1])
    if len(names) == 2 and same is not None and same > 0:
        count = f"{wrong[0, -1]:.0f} of {n} tokens"
        said = f"exactly {count} are misassigned" if one_seed else f"every seed has exactly {count} misassigned"
        sentences.append(f"From layer {same} on, {said}.")
    return sentences


def _one_axis(values: dict[str, np.ndarray], at: Callable[[str, int], str]) -> list[str]:
    """The share of tokens with a single non-zero coordinate, where the ISTA step gives some."""
    share = interval(values["one_axis_share"])[0]
    if share.max() <= 0.05:
        return []
    last, top = len(share) - 1, int(np.argmax(share))
    if share[last] >= share[top]:
        text = f"The one-axis share ends at {at('one_axis_share', last)}"
    else:
        text = f"The one-axis share is highest at layer {top} ({at('one_axis_share', top)}) and ends at "
        text += at("one_axis_share", last)
    full = _from_layer(values["one_axis_share"] >= 1.0)
    if full is not None:
        text += f"; from layer {full} on, every token of every seed has a single non-zero coordinate"
    return [text + "."]


def write_json(runs: list[ToyRun], path: str | os.PathLike) -> None:
    """A list of runs: ``panel``, ``length``, ``kappa``, ``seed``, ``eps`` (and ``eta``, ``lam`` for (d)),
    ``layers`` (layer 0 is the input) of ``{thickness: [t1, t2], R, Rc, dR, misassigned, one_axis_share}``."""
    # Its own layout (indent 1, NaN kept as JSON's NaN), so not alfa.fileio.write_json; the same atomic writer.
    fileio.write_text(path, json.dumps([run.to_dict() for run in runs], indent=1) + "\n")


def plot_toy(runs: list[ToyRun], path: str | os.PathLike) -> None:
    """The four panels (a)–(d): top row, the first seed's tokens at the input (faint) and after the last
    layer; bottom row, per-layer thickness, misassigned share and (d) one-axis share, the mean over the seeds
    and its 95 % interval, with the token-length-1 variant of (c) drawn into (c). Saved with
    :func:`alfa.study.plotted.save_figure` (its plotted data beside it). Only the first run of each panel
    needs its tokens."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    agg = aggregate(runs)
    first = {}
    for run in runs:
        first.setdefault(run.key, run)
    letters = [k for k in ("a", "b", "c", "d") if k in first]
    if not letters:
        raise ValueError("plot_toy needs runs of at least one of the panels a, b, c, d")
    fig, axes = plt.subplots(2, len(letters), figsize=(3.6 * len(letters), 7.0), squeeze=False)
    colors = ("tab:blue", "tab:orange")
    for col, key in enumerate(letters):
        run = first[key]
        ax = axes[0, col]
        last = len(run.tokens) - 1
        for j in (0, 1):
            sel = run.labels == j
            if not sel.any():
                continue
            ax.scatter(*run.tokens[0][:, sel], s=10, color=colors[j], alpha=0.25, label="input" if j == 0 else None)
            ax.scatter(*run.tokens[last][:, sel], s=28, color=colors[j], edgecolor="k", linewidth=0.5, zorder=3)
        if key == "c" and "c-len1" in first:
            variant = first["c-len1"]
            scaled = variant.tokens[-1] * (run.length / variant.length)
            ax.scatter(*scaled, s=22, marker="x", color="k", lw=0.8, label=f"length 1, layer {last} (×{run.length:g})")
            ax.legend(fontsize=7, loc="lower left")
        r = run.length * 1.25
        for u in (U1, U2):
            ax.plot([-r * u[0], r * u[0]], [-r * u[1], r * u[1]], color="0.6", lw=0.8, ls="--", zorder=0)
        ax.set(xlim=(-r, r), ylim=(-r, r), aspect="equal", xlabel="token, first coordinate")
        if col == 0:
            ax.set_ylabel("token, second coordinate")
        ista = f", η = {run.eta:g}, λ = {run.lam:g}" if run.eta is not None else ""
        ax.set_title(f"{PANELS[key].title}\nseed {run.seed}: input (faint), layer {last}{ista}", fontsize=9)
        ax.axhline(0, color="0.85", lw=0.6, zorder=0)
        ax.axvline(0, color="0.85", lw=0.6, zorder=0)

        ax = axes[1, col]
        variants = [key] + (["c-len1"] if key == "c" and "c-len1" in agg else [])
        for variant in variants:
            m = agg[variant]
            layers = np.arange(m["R"].shape[1])
            n = len(first[variant].labels)
            tag = "" if variant == key else " (length 1)"
            style = "-" if variant == key else ":"
            curves = [("thickness1", 1.0, "thickness 1", colors[0]), ("thickness2", 1.0, "thickness 2", colors[1])]
            curves.append(("misassigned", 1.0 / n, "misassigned share", "tab:red"))
            if PANELS[variant].ista:
                curves.append(("one_axis_share", 1.0, "one-axis share", "tab:green"))
            for name, scale, label, color in curves:
                mean, low, high = m[name] * scale
                if np.isnan(mean).all():
                    continue
                ax.plot(layers, mean, style, marker="o", ms=3, color=color, label=label + tag)
                if not np.isnan(low).all():
                    ax.fill_between(layers, low, high, color=color, alpha=0.15)
        seeds = len([r for r in runs if r.key == key])
        ax.set(xlabel="layer", ylim=(-0.02, 1.02), title=over_seeds(seeds).removeprefix("the ").replace(" its ", " "))
        if col == 0:  # every curve is a ratio or a share: one axis, 0 to 1
            ax.set_ylabel("thickness σ₂/σ₁, or share of the tokens")
        ax.title.set_fontsize(9)
        ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    save_figure(fig, path, dpi=120)
