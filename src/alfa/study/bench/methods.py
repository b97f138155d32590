"""The benchmark's vocabulary: its domains, pairs and the rows of Table 1 and the sanity table, shared by every
bench module (it imports only the library's method registry, and :func:`~alfa.study.bench.markdown.spans` to
say its seeds)."""

import re
from typing import Any

from alfa.adapters import METHODS
from alfa.gaze.calibrate import DEFAULT_METHOD as DEFAULT_CALIBRATION

from .markdown import spans

SOURCES = {"E": "eth", "G": "gaze360", "S": "eth-studio"}
TARGETS = {"M": "mpii", "D": "eyediap", "W": "mpii-window", "C": "eyediap-offcam", "R": "eth-studio-mirrored"}
NEGATIVE_CONTROLS = ("E→M", "E→D", "G→M", "G→D")
"""Pairs of mirror-symmetric worlds: a flip can see little of a source model's error there."""
POSITIVE_CONTROLS = ("S→W", "S→C")
"""Pairs built on the asymmetric worlds (docs/flip-premise.md §2), where the flip premise can hold."""
PAIRS = NEGATIVE_CONTROLS + POSITIVE_CONTROLS
CONSTRUCTED_CONTROLS = ("S→R",)
"""Pairs built so that a flip sees the shift by construction (docs/flip-premise.md §7.4, declared before their
runs, when S→W and S→C had failed their criterion on the second worlds): the studio model on the same rig set up
mirrored. A check of the instrument, on the second worlds only: only :data:`CONSTRUCTED_CONTROL_ROWS` run there,
and no page pools them with :data:`PAIRS` or puts them in its family."""
CONSTRUCTED_CONTROL_ROWS = ("source-only", "flip-tta", "oracle")
"""The rows a constructed control runs: its flip ceiling and its oracle headroom."""
CONSTRUCTED_CONTROL_SEEDS = (0, 1, 2)
"""The seeds a constructed control runs on (§7.4): never the family's later seeds, whatever a command asks."""
SOURCE_TRAINING = {"S": {"symmetry_weight": 0.0}}
"""Changes to the source-training recipe per source: the studio control is trained without the left-right
symmetry term (docs/flip-premise.md §2: a studio model trained to be flip-symmetric would have no studio
asymmetry left to show)."""
STAND_INS = {
    "v1": {"E": "gaze360", "G": "eth", "S": "gaze360"},
    "v2": {"E": "gaze360-v2", "G": "eth-v2", "S": "gaze360-window-v2"},
}
"""Per version of the worlds and per source, the registered world whose held-out (``val``) persons stand in
for a target when a recipe is selected; never a target world and never the source's. ``v1`` (the first
protocol, docs/flip-premise.md §4): another symmetric source world for every source. ``v2`` (the second, §7):
a stand-in of the source's own kind, the other symmetric source world for the symmetric sources, and for the
one-sided studio source a one-sided world (gaze360-v2's persons, each lit by a window on one side)."""


def world_name(base: str, version: str) -> str:
    """The registered name of world ``base`` (a v1 name, e.g. ``"mpii"``) in ``version``."""
    return base if version == "v1" else f"{base}-{version}"


SELECTION_RULE = {"v1": "lowest-cautious", "v2": "helps-under-bound"}
"""Per version of the worlds, the rule that selects a recipe on the stand-in
(``alfa.gaze.recipes.SELECTION_RULES``): the worlds' version names the protocol, and each protocol declared
its rule before its runs (docs/flip-premise.md §4 for v1, §7 for v2)."""
MAIN_METHODS = (
    "source-only",
    "flip-tta",
    "tpgaze",
    "full",
    "bitfit",
    "lora",
    "pissa",
    "milora",
    "moslora",
    "spectral",
    "dora",
    "flora",
    "alfa",
)
"""Table 1's built-in methods, in its row order (:func:`table_methods` adds every other registered one)."""
ALFA_VARIANTS = ("dictionary_mix", "diag_gate", "linear_mix")
"""Registered adapter methods that are Alfa's simpler mixes: rows of its ablations, never of Table 1."""
USER_CALIBRATION_FORMS = ("correction",)
"""Registered adapter methods that store a user calibration from labelled images (``alfa calibrate``): no
label-free personalization, so never a row of Table 1 (docs/user-calibration.md has their protocol)."""


def table_methods() -> tuple[str, ...]:
    """Table 1's methods: :data:`MAIN_METHODS` in its order, then every other registered adapter method (in
    registration order) that is not one of :data:`ALFA_VARIANTS` or :data:`USER_CALIBRATION_FORMS`. Registering
    a method (``@register_method``) is all it takes to give it a row, in every preset but the standard one, a
    declared protocol whose rows are written out (:data:`alfa.study.bench.config.STANDARD_METHODS`)."""
    return MAIN_METHODS + tuple(
        m for m in METHODS if m not in MAIN_METHODS and m not in ALFA_VARIANTS and m not in USER_CALIBRATION_FORMS
    )


SANITY_METHODS = ("in-domain", "target-trained", "oracle")
TTA_ROWS: dict[str, str] = {"roll-tta": "roll", "group-tta": "flip+roll"}
"""Issue 26's label-free test-time augmentation rows, by label, each with the kind of
:data:`alfa.gaze.tta.TTA_KINDS` it wraps the base in: ``roll-tta`` (the crop rolled by 0 and ± the declared
angle) and ``group-tta`` (flip × roll: both crops at each of those rolls). No training: scored like ``flip-tta``
(same persons, same scored images, latency measured the same way), each record storing its forward passes per
image. Of the claimed presets only the standard one on the v2 worlds plans them
(:meth:`~alfa.study.bench.config.BenchConfig.standard`): the first records' preset and the quick check keep their
plans; the smoke check (no claims), which runs every row kind once, has them on the v2 worlds too."""
TTA_OF_ROW: dict[str, str] = {"flip-tta": "flip", **TTA_ROWS}
"""Every test-time augmentation row (``flip-tta`` and :data:`TTA_ROWS`) -> its kind of
:data:`alfa.gaze.tta.TTA_KINDS`."""
TTA_ROW_OF_KIND: dict[str, str] = {kind: row for row, kind in TTA_OF_ROW.items()}
"""The row that scores the base under each TTA kind: a distilled row's teacher (``distill["teacher"]``) by its row."""


def with_tta_rows(labels: tuple[str, ...]) -> tuple[str, ...]:
    """``labels`` with :data:`TTA_ROWS` right after ``flip-tta`` (at the end without it), each once: the row order
    of the tables and of the standard preset's methods."""
    rest = tuple(m for m in labels if m not in TTA_ROWS)
    at = rest.index("flip-tta") + 1 if "flip-tta" in rest else len(rest)
    return rest[:at] + tuple(TTA_ROWS) + rest[at:]


EXTRA_METHODS = ("ruda",)
"""Rows a run may ask for by name (``--methods ruda``) that are in no default list: the domain-adaptation
baselines of issue 26 (``ruda``: RUDA, :mod:`alfa.gaze.ruda`), run when declared, so the default runs and their
records stay as they were."""
OPT_IN_METHODS = ("pnpga", "tta-distill")
"""Rows no claimed preset plans: they run when named (``alfa bench --methods pnpga``) and in the smoke check (no
claims), so adding one changes no claimed preset's plan or hashes. PnP-GA (:mod:`alfa.study.bench.pnpga`) trains
its own ensemble per source and seed. ``tta-distill``: Alfa personalized with the TTA-distillation objective
(:mod:`alfa.gaze.distill`), the group TTA of the base distilled into one forward pass; its record's ``distill``
holds the cost ratio and the teacher's error."""

CALIBRATION_KS = (1, 3, 5, 9, 16)
"""The numbers of labelled images a user-calibration row is scored at (docs/user-calibration.md §4; ``k`` = 0 is
the label-free rows)."""
SHRUNK_AFFINE = "affine-shrunk"
ADAPTER_CALIBRATIONS = {
    "adapter-alfa": "alfa",
    "adapter-lora": "lora",
    "adapter-dora": "dora",
    "adapter-alfa-semi": "alfa",
    "adapter-lora-semi": "lora",
    "adapter-lora-matched": "lora",
}
"""User-calibration rows of ``alfa calibrate --method adapter`` -> the adapter method, at the benchmark's settings
(docs/user-calibration.md §5.2: fewer ``k`` and draws than the head corrections, the declared recipe); the
``-semi`` rows add the flip loss on the pool's images (§5.4); ``-matched``: LoRA at the rank whose trainable
count is nearest Alfa's (§5.6), with :data:`ADAPTER_OPTION_CHANGES`."""
MATCHED_LORA_RANK = 19
"""LoRA's rank with about as many trainable numbers as Alfa at the benchmark's settings on the truncated
ResNet-18 (626,240 against 630,784; tests/test_bench_user_calibration.py checks it is the nearest)."""
ADAPTER_OPTION_CHANGES: dict[str, dict[str, Any]] = {
    "adapter-lora-matched": {"rank": MATCHED_LORA_RANK, "alpha": 2.0 * MATCHED_LORA_RANK}
}
"""Per adapter row, what changes from its method's benchmark settings (docs/user-calibration.md §5.6): the matched
LoRA keeps alpha / rank = 2, as at rank 8, so that only its capacity changes, not the scale of its update."""
SEMI_SUPERVISED = ("adapter-alfa-semi", "adapter-lora-semi")
SEMI_FLIP_WEIGHT = 1.0
"""The flip loss's weight in the semi-supervised rows (docs/user-calibration.md §3)."""
ADAPTER_KS = (3, 9)
ADAPTER_DRAWS = 3
FAZE_CALIBRATIONS = {"faze": "meta", "faze-plain": "plain"}
"""User-calibration rows of ``alfa calibrate --method faze`` -> which FAZE model's gaze MLP PS-GEN adapts: the
meta-learned one (AdaGEN), or for FAZE's own claim the one ``alfa faze train`` left (docs/user-calibration.md §5.3)."""
CALIBRATION_ROW_METHODS = (
    DEFAULT_CALIBRATION,
    SHRUNK_AFFINE,
    "offset",
    "ridge",
    "last-layer",
    *ADAPTER_CALIBRATIONS,
    *FAZE_CALIBRATIONS,
)
"""The ``alfa calibrate`` methods the benchmark has rows of, the default (``affine``) first: the corrections of
the model's linear head (docs/user-calibration.md §1). ``affine-shrunk`` is ``affine`` with its offset shrunk by
the prior the stand-in's persons imply (``offset_prior`` from :func:`alfa.gaze.calibrate.estimate_offset_prior`;
docs/user-calibration.md §5). ``adapter-<method>``: :data:`ADAPTER_CALIBRATIONS`; ``faze`` and ``faze-plain``:
:data:`FAZE_CALIBRATIONS`."""
CALIBRATION_DRAWS = ("random", "spread")
_CALIBRATION_LABEL = re.compile(r"calibrate-(?P<method>.+?)(?P<spread>-spread)?\[k=(?P<k>[0-9]+)\]")


def calibration_label(method: str, k: int, draw: str = "random") -> str:
    """The row of user calibration ``method`` at ``k`` labelled images drawn by ``draw``:
    ``calibrate-affine[k=9]``, ``calibrate-affine-spread[k=9]`` (no comma: ``--methods`` splits on commas)."""
    return f"calibrate-{method}{'' if draw == 'random' else '-' + draw}[k={k}]"


def calibration_ks(method: str) -> tuple[int, ...]:
    """The ``k`` a user-calibration method has rows at."""
    return ADAPTER_KS if method in ADAPTER_CALIBRATIONS else CALIBRATION_KS


def calibration_draws(method: str) -> tuple[str, ...]:
    """The kinds of draw a user-calibration method has rows of (the adapters: random draws only)."""
    return ("random",) if method in ADAPTER_CALIBRATIONS else CALIBRATION_DRAWS


def parse_calibration_label(label: str) -> tuple[str, int, str] | None:
    """``(method, k, draw)`` of a user-calibration row's label, ``None`` for any other label."""
    match = _CALIBRATION_LABEL.fullmatch(label)
    if match is None or match["method"] not in CALIBRATION_ROW_METHODS:
        return None
    method, k, draw = match["method"], int(match["k"]), "spread" if match["spread"] else "random"
    return (method, k, draw) if k in calibration_ks(method) and draw in calibration_draws(method) else None


def calibration_label_problem(label: str) -> str | None:
    """What is wrong with ``label`` where it names a user-calibration method the benchmark has rows of but at a
    ``k`` or a draw it has none at (``calibrate-affine[k=0]``): the ``k`` (and draws) it takes; ``None`` for a
    valid row or any other name."""
    match = _CALIBRATION_LABEL.fullmatch(label)
    if match is None or match["method"] not in CALIBRATION_ROW_METHODS:
        return None
    method, k = match["method"], int(match["k"])
    if match["spread"] and "spread" not in calibration_draws(method):
        return f"{label}: calibrate-{method} has rows of random draws only, not -spread (calibrate-{method}[k=K])"
    if k not in calibration_ks(method):
        ks = ", ".join(map(str, calibration_ks(method)))
        return f"{label}: calibrate-{method} has rows at k = {ks} only, not k = {k} (calibrate-{method} runs them all)"
    return None


def calibration_rows(methods: tuple[str, ...] = CALIBRATION_ROW_METHODS) -> tuple[str, ...]:
    """Every user-calibration row of ``methods``: each of its ``k`` (:func:`calibration_ks`), random draws then
    spread (:func:`calibration_draws`)."""
    return tuple(calibration_label(m, k, d) for m in methods for d in calibration_draws(m) for k in calibration_ks(m))


def expand_calibration_names(names: tuple[str, ...]) -> tuple[str, ...]:
    """``names`` with each ``calibrate-<method>`` (a method of :data:`CALIBRATION_ROW_METHODS`, no ``[k=…]``)
    replaced by all of that method's rows, so that a command line can ask for them in one word."""
    out: list[str] = []
    for name in names:
        method = name.removeprefix("calibrate-")
        out += calibration_rows((method,)) if name != method and method in CALIBRATION_ROW_METHODS else [name]
    return tuple(dict.fromkeys(out))


_ERROR = "angular error"  # the name of alfa.study.bench.stats.angular, the measure of every declared comparison
DECLARED_FAMILY: dict[str, frozenset[tuple[str, str, tuple[str, ...], str]] | None] = {
    "v1": None,
    "v2": frozenset(
        # on the positive controls, pooled: Alfa's attention against LoRA and its two simpler mixes (selected
        # recipes), and what we ship for Alfa against what we ship for LoRA
        [
            (f"alfa{r}", f"{other}{r}", POSITIVE_CONTROLS, _ERROR)
            for r, other in (
                ("[selected]", "lora"),
                ("[selected]", "diag_gate"),
                ("[selected]", "linear_mix"),
                ("[default]", "lora"),
            )
        ]
        # the controls themselves: how much flip-TTA removes on each positive control
        + [("flip-tta", "source-only", (pair,), _ERROR) for pair in POSITIVE_CONTROLS]
        # harm or gain over every pair: the selected recipes of the four methods, and Alfa's shipped default
        + [
            (row, "source-only", PAIRS, _ERROR)
            for row in (
                "alfa[selected]",
                "lora[selected]",
                "diag_gate[selected]",
                "linear_mix[selected]",
                "alfa[default]",
            )
        ]
    ),
}
"""Per version of the worlds, the comparisons a flip-premise page judges as its family (Holm over them); every
other comparison it makes is descriptive, quoted with its 95 % interval and no verdict. ``None`` (the first
protocol): every comparison the page makes. ``v2``: the eleven declared in docs/flip-premise.md §7.1 before its
runs, chosen so that eight seeds detect about a degree (``alfa power``)."""
DECLARED_FAMILY_ROWS = ("source-only", "flip-tta", "alfa", "lora", "diag_gate", "linear_mix")
"""The methods whose rows the declared v2 family needs (with their selected recipes, and Alfa's and LoRA's
shipped defaults): what every seed beyond the first three runs (docs/flip-premise.md §7.1; seeds 3–5 run the
other rows too, :data:`REPLICATE_SEEDS`)."""
FAMILY_SEEDS = (3, 4, 5, 6, 7)
"""The seeds beyond the first three, declared for :data:`DECLARED_FAMILY_ROWS` (docs/flip-premise.md §7.1); the
first three of them also replicate every other row (:data:`REPLICATE_SEEDS`, §7.2's amendment of 2026-12-04)."""
FAMILY_DEFAULTS = ("alfa", "lora")
"""The methods whose shipped-default rows the declared v2 family needs (docs/flip-premise.md §7.1)."""
PNPGA_FAMILY_SEEDS = (4, 5, 6)
"""The family's seeds on which PnP-GA's rows also run, each unit's source pre-training keeping the ensemble's
snapshots (docs/flip-premise.md §7.2, amended 2026-12-03 at 18:30 UTC: seeds 0–2's machines were not lent)."""
FIRST_SEEDS = (0, 1, 2)
"""The seeds every row of the v2 run was first declared on, and the ones its declared criteria read (the
positive controls' share of the headroom, issue 25's pass criteria): :data:`REPLICATE_SEEDS` came later and
are read beside them, on lines of their own (docs/flip-premise.md §7.2, amended 2026-12-04)."""
REPLICATE_SEEDS = (3, 4, 5)
"""The family's seeds on which every other row declared for seeds 0–2 is also declared (PnP-GA keeps
:data:`PNPGA_FAMILY_SEEDS`), so that the whole standard preset has three seeds made on the kind of machine that
made the family's seeds, whichever kind a session is lent (docs/flip-premise.md §7.2, amended 2026-12-04)."""


def declared_run_seeds() -> dict[str, str]:
    """The seeds of each part of the declared v2 run as a page says them (``{"first_seeds": "0–2", ...}``): the
    format arguments of :func:`~alfa.study.bench.report_prose.declared_run`, so that its words follow
    :data:`FIRST_SEEDS`, :data:`FAMILY_SEEDS` and :data:`REPLICATE_SEEDS`."""
    return {
        "first_seeds": spans(FIRST_SEEDS),
        "family_seeds": spans(FAMILY_SEEDS),
        "replicate_seeds": spans(REPLICATE_SEEDS),
    }
