"""What each adaptation method costs on the ResNet-18 gaze model truncated at rank 64.

For every method at its default settings: trainable parameters, parameters at inference after
merging (densifying where the method needs it), the parameters of the exact compact merge
(``alfa.merge(model, extend=True)``, for the methods whose update is a dense low-rank term), the bytes of the saved
per-user adapter file, the time of one personalization step and of one inference forward.

One personalization step (spec §4): a batch of ``batch`` images and their horizontal flips in one
forward of ``2·batch`` images, the flip-symmetry L1 loss (flipped branch detached), backward, one
AdamW step (lr 1e-4, ×10 on ``layer3``/``layer4``); BatchNorm in eval mode. Timings are the median
of ``repeats`` steps after ``warmup`` steps, with ``torch.set_num_threads(threads)``. Weights are
random (the costs do not depend on them), so no checkpoint is needed.

The rows are every registered method of the costed families (:data:`FAMILY_ORDER`), read from
:data:`alfa.adapters.METHODS`; the merge column is :func:`alfa.adapters.merge_form`.

Run ``alfa costs`` (``--help`` for options; :func:`report_costs` is what it calls); it prints a Markdown table,
and with ``--update-doc docs/adapters.md`` also writes it, with the conditions it was measured under, between the
page's ``<!-- costs:begin -->`` and ``<!-- costs:end -->`` markers (nothing else on the page changes).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import Tensor, nn
from torch.utils.flop_counter import FlopCounterMode
from tqdm import tqdm

from alfa.adapters import (
    METHODS,
    AdapterConfig,
    adapter_state,
    attach,
    has_compact_form,
    merge,
    merge_form,
    param_groups,
    save_adapter,
)
from alfa.adapters.alfa import AlfaConfig, DictionaryMixConfig
from alfa.fileio import write_text
from alfa.gaze.losses import flip_symmetry_loss
from alfa.gaze.personalize import PersonalizeConfig, recipe_lr_scale
from alfa.gaze.train import TruncateConfig
from alfa.models import create_model
from alfa.study.sections import section_marks, with_section
from alfa.study.timing import cpu_name, load_average, load_text, median_cell, median_interval
from alfa.summary import parameter_summary
from alfa.truncate import truncate

from .markdown import byte_size

__all__ = [
    "CostRow",
    "FAMILY_ORDER",
    "NOT_COSTED",
    "default_methods",
    "personalization_step",
    "cost_table",
    "format_table",
    "report_costs",
]

# One step's learning rates are the personalization recipe's (lr 1e-4, ×10 on layer3/layer4); weight
# decay does not change what a step costs, so the groups keep param_groups' default.
_RECIPE = PersonalizeConfig()
LR = _RECIPE.lr
LR_SCALE = dict(_RECIPE.lr_scale)

FAMILY_ORDER = ("dictionary", "spectral", "lora", "parameters")
"""The table's sections, top to bottom; within one, methods keep the registry's order."""

NOT_COSTED = {
    "prompt": "TPGaze's prompts are sized for one image resolution and one layout, and cannot be merged (the "
    "benchmark reports its costs)",
    "correction": "a user calibration's correction sits on the head only; its costs are user-calibration.md's",
}
"""The method families this table leaves out, and why: a new family must join one of the two."""


@dataclass
class CostRow:
    """The costs of one method (``None`` where a quantity does not apply)."""

    method: str
    base: str  # "truncated" or "dense"
    config: str
    trainable: int
    merged_params: int
    merge: str  # how the merged model stores the adapted layers
    compact_params: int  # merge(extend=True): exact, keeping factors; = merged_params where no choice
    adapter_bytes: int | None
    compact_bytes: int | None  # save_adapter(compact=True): one d×d mix per layer (dictionary methods only)
    step_ms: float | None  # wall clock, median
    step_cpu_ms: float | None  # process CPU time (all threads), median
    inference_ms: float | None  # wall clock of one forward of the merged model, median
    step_gflop: float | None = None  # matmul/conv work of one step (torch.utils.flop_counter)
    inference_gflop: float | None = None
    # every round's time, for the medians' intervals (rows measured before 2026-12-04 hold none)
    step_rounds_ms: list[float] | None = None
    step_cpu_rounds_ms: list[float] | None = None
    inference_rounds_ms: list[float] | None = None


def default_methods() -> dict[str, AdapterConfig | None]:
    """Every registered method of :data:`FAMILY_ORDER` at its default settings, by method name, after
    ``"source-only"`` (``None``: no adaptation).

    ``dictionary_mix`` is left out: it is the form a compact file of a dictionary method loads as,
    and its cost is those rows' compact-file column.
    """
    unplaced = sorted({cls.family for cls in METHODS.values()} - set(FAMILY_ORDER) - set(NOT_COSTED))
    if unplaced:  # a table that silently lacked a new family would read as complete
        raise ValueError(f"method families {unplaced} are neither in FAMILY_ORDER nor in NOT_COSTED")
    methods: dict[str, AdapterConfig | None] = {"source-only": None}
    for family in FAMILY_ORDER:
        for name, cls in METHODS.items():
            if cls.family == family and cls is not DictionaryMixConfig:
                methods[name] = cls()
    return methods


def personalization_step(model: nn.Module, optimizer: torch.optim.Optimizer, images: Tensor) -> float:
    """One flip-symmetry step (:func:`alfa.gaze.losses.flip_symmetry_loss`, the flipped branch detached)."""
    optimizer.zero_grad(set_to_none=True)
    out = model(torch.cat([images, images.flip(-1)]))
    loss = flip_symmetry_loss(*out.split(len(images)))
    loss.backward()
    optimizer.step()
    return float(loss.detach())


def _timed(fn) -> tuple[float, float]:
    """Wall-clock and process CPU seconds of one call."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def _gflop(fn) -> float:
    """Matmul/conv GFLOP of one call, counted by torch's FlopCounterMode (independent of machine load)."""
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops() / 1e9


def _interleaved_ms(
    calls: list, warmup: int, repeats: int, progress: bool, desc: str
) -> list[tuple[list[float], list[float]]]:
    """Wall and CPU milliseconds of each call in every round, timed in rounds (one call of each per round),
    so that a load change on a shared machine hits every method alike."""
    for fn in tqdm(calls, desc=f"{desc} (warm-up)", disable=not progress):
        for _ in range(warmup):
            fn()
    samples: list[list[tuple[float, float]]] = [[] for _ in calls]
    for _ in tqdm(range(repeats), desc=desc, disable=not progress):
        for i, fn in enumerate(calls):
            samples[i].append(_timed(fn))
    return [([1000.0 * w for w, _ in ts], [1000.0 * c for _, c in ts]) for ts in samples]


_SHARED_OPTIONS = {f.name for f in dataclasses.fields(AdapterConfig)}  # target, layers: the same for every row


def _config_str(config: AdapterConfig | None) -> str:
    if config is None:
        return ""
    d = {k: v for k, v in config.to_dict().items() if k not in _SHARED_OPTIONS and v is not None}
    return ", ".join(f"{k}={v}" for k, v in d.items())


def _compact_params(model: nn.Module) -> int:
    """Parameter count if every adapted layer is merged into its most compact exact form."""
    merged = copy.deepcopy(model)
    merge(merged, extend=True)
    return parameter_summary(merged).total


@dataclass
class _Job:
    row: CostRow
    model: nn.Module
    optimizer: torch.optim.Optimizer | None = None
    densify: bool = False


def _prepare(
    label: str, base_model: nn.Module, base_kind: str, config: AdapterConfig | None, seed: int, workdir: Path
) -> _Job:
    """Attach the method and fill in everything but the timings."""
    torch.manual_seed(seed)
    model = copy.deepcopy(base_model).eval()
    params = parameter_summary(model).total
    row = CostRow(label, base_kind, _config_str(config), 0, params, "none", params, None, None, None, None, None)
    if config is None:
        return _Job(row, model)
    attach(model, config)
    row.trainable = parameter_summary(model).trainable
    row.adapter_bytes = save_adapter(model, workdir / f"{base_kind}-{label}.safetensors").stat().st_size
    if has_compact_form(model):
        compact = save_adapter(model, workdir / f"{base_kind}-{label}-compact.safetensors", compact=True)
        row.compact_bytes = compact.stat().st_size
    row.compact_params = _compact_params(model) if config.scope == "layer" else params
    row.merge = merge_form(model)
    optimizer = torch.optim.AdamW(param_groups(model, lr=LR, lr_scale=recipe_lr_scale(model, LR_SCALE)))
    return _Job(row, model, optimizer, densify=row.merge == "densified")


def cost_table(
    model_name: str = "resnet18_gaze",
    rank: int = TruncateConfig.rank,
    batch: int = 10,
    image_size: int = 224,
    warmup: int = 1,
    repeats: int = 7,
    threads: int = 2,
    seed: int = 0,
    methods: dict[str, AdapterConfig | None] | None = None,
    dense_alfa: bool = True,
    progress: bool = True,
) -> list[CostRow]:
    """Measure every method (default: :func:`default_methods`) on ``model_name`` truncated at ``rank``.

    With ``dense_alfa`` two more rows run on the untruncated model: source-only and Alfa on the dense
    layers (ablation (c): the dictionary is each layer's full SVD). All methods are prepared first and
    then timed in interleaved rounds.
    """
    torch.set_num_threads(threads)
    methods = default_methods() if methods is None else methods
    torch.manual_seed(seed)
    dense = create_model(model_name).eval()
    truncated = copy.deepcopy(dense)
    truncate(truncated, rank)
    images = torch.randn(batch, 3, image_size, image_size, generator=torch.Generator().manual_seed(seed))
    specs = [(label, truncated, "truncated", cfg) for label, cfg in methods.items()]
    if dense_alfa:
        specs += [("source-only", dense, "dense", None), ("alfa", dense, "dense", AlfaConfig())]
    with tempfile.TemporaryDirectory() as tmp:
        jobs = [
            _prepare(label, base, kind, cfg, seed, Path(tmp))
            for label, base, kind, cfg in tqdm(specs, desc="attach", disable=not progress)
        ]
    trainers = [j for j in jobs if j.optimizer is not None]
    steps = [lambda j=j: personalization_step(j.model, j.optimizer, images) for j in trainers]
    for j, step in zip(trainers, steps):  # counting also warms up
        j.row.step_gflop = _gflop(step)
    for j, (wall, cpu) in zip(trainers, _interleaved_ms(steps, warmup, repeats, progress, "step rounds")):
        j.row.step_ms, j.row.step_cpu_ms = statistics.median(wall), statistics.median(cpu)
        j.row.step_rounds_ms, j.row.step_cpu_rounds_ms = wall, cpu
    for j in jobs:
        j.optimizer = None
        if adapter_state(j.model) is not None:
            merge(j.model, densify=j.densify)
        j.row.merged_params = parameter_summary(j.model).total
    with torch.no_grad():
        forwards = [lambda j=j: j.model(images) for j in jobs]
        for j, forward in zip(jobs, forwards):
            j.row.inference_gflop = _gflop(forward)
        for j, (wall, _) in zip(jobs, _interleaved_ms(forwards, warmup, repeats, progress, "inference rounds")):
            j.row.inference_ms, j.row.inference_rounds_ms = statistics.median(wall), wall
    return [j.row for j in jobs]


def _count(n: int) -> str:
    return f"{n / 1e6:.3f} M" if n >= 1e6 else f"{n / 1e3:.1f} k" if n >= 1e3 else str(n)


def format_table(rows: list[CostRow]) -> str:
    """A Markdown table of :func:`cost_table`'s rows."""
    head = (
        "| base | method | trainable | params after merge | merge | exact compact merge | adapter file | compact file "
        "| step GFLOP | step (ms) | step CPU (ms) | inference GFLOP | inference (ms) |"
    )
    lines = [head, "|" + "---|" * 13]
    for r in rows:
        step = "— | — | —"
        if r.step_ms is not None:
            wall, cpu = median_cell(r.step_rounds_ms, r.step_ms), median_cell(r.step_cpu_rounds_ms, r.step_cpu_ms)
            step = f"{r.step_gflop:.1f} | {wall} | {cpu}"
        inference = "— | —"
        if r.inference_ms is not None:
            inference = f"{r.inference_gflop:.1f} | {median_cell(r.inference_rounds_ms, r.inference_ms)}"
        lines.append(
            f"| {r.base} | {r.method} | {_count(r.trainable)} | {_count(r.merged_params)} | {r.merge} "
            f"| {_count(r.compact_params)} | {byte_size(r.adapter_bytes)} | {byte_size(r.compact_bytes)} "
            f"| {step} | {inference} |"
        )
    return "\n".join(lines)


SECTION = "costs"
BEGIN_MARK, END_MARK = section_marks(SECTION)


def _check_markers(path: Path) -> None:
    with_section(path.read_text(encoding="utf-8"), SECTION, "", str(path))


def with_block(text: str, block: str, where: str = "the page") -> str:
    """``text`` with what lies between :data:`BEGIN_MARK` and :data:`END_MARK` replaced by ``block``."""
    return with_section(text, SECTION, block, where)


def update_doc(path: Path, block: str) -> None:
    """Replace what lies between :data:`BEGIN_MARK` and :data:`END_MARK` in ``path`` by ``block``
    (atomically; the rest of the page is kept byte for byte)."""
    write_text(path, with_block(path.read_text(encoding="utf-8"), block, str(path)))


DATA_FORMAT = "alfa-costs"
"""What a page's costs data (``<page>.json``, beside it) says it is, so that another file of that name is never
replaced."""


def data_path(page: Path) -> Path:
    """Where ``alfa costs --update-doc PAGE`` keeps the rows the page's table is rendered from."""
    return page.with_suffix(".json")


def costs_block(data: dict) -> str:
    """The page's table and the line under it, from the data :func:`report_costs` keeps (``alfa pages`` renders
    the committed table from it)."""
    rows = [CostRow(**r) for r in data["rows"]]
    s = data["settings"]
    rounds = [t for r in rows for t in (r.step_rounds_ms, r.step_cpu_rounds_ms, r.inference_rounds_ms) if t]
    intervals = any(median_interval(t) for t in rounds)
    median = f"median of {s['repeats']} interleaved rounds after {s['warmup']} warm-up"
    if intervals:
        median += (
            " and, in square brackets, its 95 % interval (distribution-free: the rounds of the order statistics whose "
            "coverage of the median is at least 95 %; of this machine's round-to-round noise)"
        )
    conditions = (
        f"Measured {data['measured']} on {data['cpu']}: step = forward of {s['batch']} images + their flips "
        f"({2 * s['batch']}×3×{s['image_size']}²), flip-symmetry L1, backward, AdamW; inference = forward of "
        f"{s['batch']} images after merge; {median}; {s['threads']} threads, torch {data['torch']}; load average "
        f"{load_text(data['load'][0])} at the start and {load_text(data['load'][1])} at the end, on {data['cpus']} "
        f"CPUs; weights and images of seed {s['seed']}."
    )
    sizes = _sizes_sentence([r for r in rows if r.base == "truncated"])
    return f"{format_table(rows)}\n\n{conditions}" + (f"\n\n{sizes}" if sizes else "")


def _sizes_sentence(rows: list[CostRow]) -> str:
    """What the per-user files of ``rows`` (one base) amount to, in words: their range, Alfa's against LoRA's, and
    what each holds beyond its float32 numbers (its JSON header: the config, the base's fingerprints). Empty where
    the rows lack the methods it compares."""
    files = [r for r in rows if r.adapter_bytes is not None]
    by_method = {r.method: r for r in files}
    if not files or not {"alfa", "lora"} <= set(by_method):
        return ""
    small, large = min(files, key=lambda r: r.adapter_bytes), max(files, key=lambda r: r.adapter_bytes)
    alfa, lora = by_method["alfa"], by_method["lora"]
    headers = [(r.adapter_bytes - 4 * r.trainable) / 2**10 for r in files]
    sentence = (
        f"Per-user files: from {byte_size(small.adapter_bytes)} ({small.method}) to {byte_size(large.adapter_bytes)} "
        f"({large.method}); beyond 4 bytes per trainable number each holds {min(headers):.1f}–{max(headers):.1f} KiB "
        f"of JSON header. Alfa trains {alfa.trainable / lora.trainable:.1f}× LoRA's numbers "
        f"({byte_size(alfa.adapter_bytes)} against {byte_size(lora.adapter_bytes)})"
    )
    if alfa.compact_bytes:
        ratio = lora.adapter_bytes / alfa.compact_bytes
        sentence += f", but its compact file is {byte_size(alfa.compact_bytes)}: {ratio:.1f}× smaller than LoRA's file"
    return sentence + "."


def _refuse_foreign_data(path: Path) -> None:
    if not path.exists():
        return
    try:
        ours = json.loads(path.read_text(encoding="utf-8")).get("format") == DATA_FORMAT
    except (ValueError, AttributeError, OSError):
        ours = False
    if not ours:
        raise ValueError(f"{path} exists and is not the costs data of this page, which would replace it: move it")


def report_costs(
    *,
    model_name: str,
    rank: int,
    batch: int,
    image_size: int,
    warmup: int,
    repeats: int,
    threads: int,
    seed: int,
    dense_alfa: bool = True,
    json_path: Path | None = None,
    update_doc_path: Path | None = None,
) -> list[CostRow]:
    """What ``alfa costs`` does: measure the cost table (:func:`cost_table`), print it with the conditions it
    was measured under, and optionally save the rows as JSON and the table into a page (between its
    markers: :func:`update_doc`), its data beside it (:func:`data_path`, which ``alfa pages`` renders it from)."""
    if update_doc_path is not None:  # fail before ten minutes of timing, not after
        _check_markers(update_doc_path)
        _refuse_foreign_data(data_path(update_doc_path))
    load_start = load_average()
    rows = cost_table(
        model_name=model_name,
        rank=rank,
        batch=batch,
        image_size=image_size,
        warmup=warmup,
        repeats=repeats,
        threads=threads,
        seed=seed,
        dense_alfa=dense_alfa,
    )
    settings = {"model": model_name, "rank": rank, "batch": batch, "image_size": image_size, "warmup": warmup,
                "repeats": repeats, "threads": threads, "seed": seed}  # fmt: skip
    data = {
        "format": DATA_FORMAT,
        "measured": time.strftime("%Y-%m-%d"),
        "cpu": cpu_name(),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "load": [load_start, load_average()],
        "settings": settings,
        "rows": [asdict(r) for r in rows],
    }
    block = costs_block(data)
    print(block)
    print()
    print("defaults: " + "; ".join(f"{r.method}: {r.config}" for r in rows if r.config and r.base == "truncated"))
    if update_doc_path is not None:  # the page checked again first: its data is never written without it
        page = with_block(update_doc_path.read_text(encoding="utf-8"), block, str(update_doc_path))
        write_text(data_path(update_doc_path), json.dumps(data, indent=1))
        write_text(update_doc_path, page)
    if json_path is not None:
        write_text(json_path, json.dumps([asdict(r) for r in rows], indent=1))
    return rows
