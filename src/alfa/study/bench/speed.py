"""Speed and memory of Alfa on ResNet-18 (truncated at 64), measured on this machine.

* One personalization step: forward of a batch of 10 images plus their 10 horizontal flips (one
  forward of 20, as personalization runs it), flip-symmetry L1 loss, backward, AdamW step. Alfa on
  every factorized layer, against the truncated base with only the head trainable, and against
  full fine-tuning of the truncated model.
* Inference latency of the merged model against the truncated base and the dense ResNet-18.
* Peak memory (resident set size) of a process doing each kind of step, its model loaded from a checkpoint as a
  deployment loads it (a process that builds and truncates the model itself keeps more resident after it).

Every timing is a median over repeats after a warm-up; the configurations are interleaved so that
slow drifts of the machine hit all of them alike, and each ratio is paired over those rounds with its 95 %
interval (:mod:`alfa.study.timing`): every round's timing is kept in the record.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn
from tqdm import tqdm

from alfa import attach, merge, param_groups, parameter_summary, truncate
from alfa.adapters import AlfaConfig, adapted_layers
from alfa.checkpoint import load_model, save_model
from alfa.fileio import write_text
from alfa.gaze.losses import flip_symmetry_loss
from alfa.gaze.personalize import LAYER34_PATTERN, recipe_lr_scale
from alfa.gaze.train import TruncateConfig
from alfa.models import resnet18_gaze
from alfa.study.bench.measure import interleaved_seconds
from alfa.study.timing import (
    goal_verdict,
    interval_note,
    load_average,
    load_text,
    machine,
    median_cell,
    no_rounds_note,
    ratio_cell,
)

STEP_SETUPS = ("head only", "alfa", "full fine-tune")
# The measured setting: the defaults (truncation rank d, Alfa's heads and rank), named in the page too.
RANK = TruncateConfig().rank
ADAPTER_MATH = "adapter math"  # the name Alfa's own computation is timed under beside the steps
ALFA = AlfaConfig()
LATENCY_TARGET = 1.02  # merged / truncated latency: the merged model has the truncated structure exactly


def _flip_loss(model: nn.Module, images: torch.Tensor) -> torch.Tensor:
    return flip_symmetry_loss(*model(torch.cat([images, images.flip(-1)])).chunk(2))


def _step_model(setup: str, base: nn.Module) -> tuple[nn.Module, torch.optim.Optimizer]:
    model = copy.deepcopy(base).eval()
    if setup == "alfa":
        attach(model, AlfaConfig())
    elif setup == "head only":
        for name, p in model.named_parameters():
            p.requires_grad_(name.startswith("fc."))
    elif setup != "full fine-tune":
        raise ValueError(f"unknown setup {setup!r}")
    # the recipe's ×10 on layer3/layer4, which the head-only setup has nothing in (param_groups refuses a pattern
    # that selects nothing; recipe_lr_scale leaves this one out there)
    scales = recipe_lr_scale(model, {LAYER34_PATTERN: 10.0})
    return model, torch.optim.AdamW(param_groups(model, lr=1e-4, lr_scale=scales))


def _one_step(model: nn.Module, opt: torch.optim.Optimizer, images: torch.Tensor) -> None:
    opt.zero_grad(set_to_none=True)
    _flip_loss(model, images).backward()
    opt.step()


def _upper_median(xs: list[float]) -> float:
    """The upper middle value (what the page's records call their median)."""
    return sorted(xs)[len(xs) // 2]


def _adapter_math_once(layers: list[nn.Module]) -> None:
    """One forward + backward of ``adapted_V`` for every Alfa layer, without any image."""
    sum(layer.adapted_V().sum() for layer in layers).backward()


def _rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise OSError(f"{field} not in /proc/self/status")


def _memory_mb(setup: str, image_size: int, checkpoint: Path) -> dict[str, float]:
    """Resident memory of a fresh process: after loading the model from ``checkpoint``, and at its peak while it
    runs 3 steps (Linux: the peak is reset through /proc/self/clear_refs before the steps), with this process's
    torch threads (each thread keeps buffers of its own)."""
    code = (
        f"import torch; torch.set_num_threads({torch.get_num_threads()}); from alfa.study.bench.speed import "
        f"_child_steps; print(_child_steps({setup!r}, {image_size}, {str(checkpoint)!r}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _child_steps(setup: str, image_size: int, checkpoint: str) -> str:
    torch.manual_seed(0)
    base = load_model(checkpoint, expect_model="resnet18_gaze")[0].eval()
    images = torch.rand(10, 3, image_size, image_size)
    loaded = _rss_kib("VmRSS")
    model, opt = _step_model(setup, base) if setup in STEP_SETUPS else (base, None)
    ready = _rss_kib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # reset the peak (VmHWM)
    for _ in range(3):
        if opt is not None:
            _one_step(model, opt, images)
        else:
            with torch.no_grad():
                model(torch.cat([images, images.flip(-1)]))
    peak = _rss_kib("VmHWM")
    return json.dumps({"loaded": loaded / 1024, "model ready": ready / 1024, "peak": peak / 1024})


def measure(repeats: int = 20, image_size: int = 224, seed: int = 0, memory: bool = True) -> dict:
    """Run every measurement; returns a JSON-ready dict."""
    load_start = load_average()
    torch.manual_seed(seed)
    dense = resnet18_gaze().eval()
    truncated = copy.deepcopy(dense)
    truncate(truncated, rank=RANK)
    images = torch.rand(10, 3, image_size, image_size)

    steps = {s: _step_model(s, truncated) for s in STEP_SETUPS}
    alfa_model = steps["alfa"][0]
    calls = {s: functools.partial(_one_step, *steps[s], images) for s in STEP_SETUPS}
    # Alfa's own computation, timed in the same rounds as the steps (its share pairs); the gradients it leaves are
    # cleared by the next Alfa step
    calls[ADAPTER_MATH] = functools.partial(_adapter_math_once, list(adapted_layers(alfa_model).values()))
    step_times = interleaved_seconds(calls, repeats, desc="personalization steps", seed=seed)
    math_times = step_times.pop(ADAPTER_MATH)

    merged = copy.deepcopy(alfa_model)
    merge(merged)
    infer = {"dense": dense, "truncated": truncated, "merged alfa": merged}
    latency: dict[str, dict[str, float]] = {}
    latency_rounds: dict[str, dict[str, list[float]]] = {}
    with torch.no_grad():
        for batch in (1, 10):
            forwards = {k: functools.partial(m, images[:batch]) for k, m in infer.items()}
            times = interleaved_seconds(forwards, repeats * 2, desc=f"inference, batch {batch}", seed=seed)
            latency[f"batch {batch}"] = {k: _upper_median(v) for k, v in times.items()}
            latency_rounds[f"batch {batch}"] = times

    result = {
        "machine": machine(),
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "cpus": os.cpu_count(),
        "image_size": image_size,
        "repeats": repeats,
        "params": {
            "dense": parameter_summary(dense).total,
            "truncated": parameter_summary(truncated).total,
            "merged alfa": parameter_summary(merged).total,
            **{f"trainable ({s})": parameter_summary(m).trainable for s, (m, _) in steps.items()},
        },
        "step_seconds": {s: _upper_median(v) for s, v in step_times.items()},
        "adapter_math_seconds": _upper_median(math_times),
        "latency_seconds": latency,
        # every round's timing (the i-th of each list from the same round): the pairs the ratios' intervals need
        "step_round_seconds": step_times,
        "adapter_math_round_seconds": math_times,
        "latency_round_seconds": latency_rounds,
    }
    if memory:
        result["memory_mb"] = _memory_rows(dense, truncated, image_size)
        result["memory_of"] = "loaded checkpoints"
    result["load_average"] = [load_start, load_average()]  # a busy machine's timings are slower and spread
    return result


def _memory_rows(dense: nn.Module, truncated: nn.Module, image_size: int) -> dict[str, dict[str, float]]:
    """Each setup's :func:`_memory_mb`, its model saved first for the process to load."""
    setups = (*STEP_SETUPS, "truncated inference", "dense inference")  # a fresh process each: minutes in all
    with tempfile.TemporaryDirectory(prefix="alfa-speed-") as folder:
        files = {name: Path(folder) / f"{name}.safetensors" for name in ("dense", "truncated")}
        for name, model in (("dense", dense), ("truncated", truncated)):
            save_model(files[name], model, "resnet18_gaze", input_size=(image_size, image_size))
        return {
            s: _memory_mb(s, image_size, files["dense" if s == "dense inference" else "truncated"])
            for s in tqdm(setups, desc="peak memory", leave=False)
        }


def _rounds_of(r: dict, key: str, *inner: str) -> dict | list | None:
    """The per-round timings at ``r[key][inner…]``; ``None`` in a record made before they were kept."""
    node = r.get(key)
    for k in inner:
        node = None if node is None else node.get(k)
    return node


def _ms(rounds: list[float] | None, median: float) -> str:
    """A time in milliseconds: its recorded median (the upper middle round) with the distribution-free 95 %
    interval over its rounds (the median alone in a record made before they were kept)."""
    return median_cell(None if rounds is None else [x * 1e3 for x in rounds], median * 1e3, 1, recorded=True)


def _step_section(r: dict) -> list[str]:
    s = r["step_seconds"]
    rounds = _rounds_of(r, "step_round_seconds") or {}
    lines = [
        "## One personalization step",
        "",
        "A step is one forward of the 10-image batch and its 10 flips (20 images), the flip-symmetry "
        "L1 loss, backward and an AdamW step.",
        "",
        "| setup | trainable params | seconds / step | × head only |",
        "|---|---:|---:|---:|",
    ]
    for k in STEP_SETUPS:
        vs = ratio_cell(rounds.get(k), rounds.get("head only"), s[k] / s["head only"])[0]
        vs = "1.00" if k == "head only" else vs
        step = median_cell(rounds.get(k), s[k], 3, recorded=True)
        lines.append(f"| {k} | {r['params'][f'trainable ({k})']:,} | {step} | {vs} |")
    math = r["adapter_math_seconds"]
    share = ratio_cell(_rounds_of(r, "adapter_math_round_seconds"), rounds.get("alfa"), math / s["alfa"], 1, 100)[0]
    return lines + [
        "",
        f"Alfa's own computation (all 14 `adapted_V()`, forward and backward, once per step whatever the "
        f"batch): {_ms(_rounds_of(r, 'adapter_math_round_seconds'), math)} ms, {share} % of its step. The rest of "
        "the gap to *head only* is the backward pass through layers 2–4, which any method that adapts those layers "
        "pays: with only the head trainable, autograd never enters the convolutions at all.",
    ]


def _latency_section(r: dict) -> list[str]:
    lat = r["latency_seconds"]
    lines = [
        "## Inference latency",
        "",
        "| model | parameters | batch 1 (ms) | batch 10 (ms) |",
        "|---|---:|---:|---:|",
    ]
    for k in ("dense", "truncated", "merged alfa"):
        cells = [
            _ms(_rounds_of(r, "latency_round_seconds", batch, k), lat[batch][k]) for batch in ("batch 1", "batch 10")
        ]
        lines.append(f"| {k} | {r['params'][k]:,} | {cells[0]} | {cells[1]} |")
    cells, verdicts = [], {}
    for batch in ("batch 1", "batch 10"):
        rounds = _rounds_of(r, "latency_round_seconds", batch) or {}
        of_medians = lat[batch]["merged alfa"] / lat[batch]["truncated"]
        cell, paired = ratio_cell(rounds.get("merged alfa"), rounds.get("truncated"), of_medians, 3)
        cells.append(f"{cell} ({batch})")
        verdicts[batch] = goal_verdict(paired, LATENCY_TARGET, at_least=False)
    verdict = (
        next(iter(verdicts.values()))
        if len(set(verdicts.values())) == 1
        else "; ".join(f"{v} at {batch}" for batch, v in verdicts.items())
    )
    return lines + [
        "",
        f"Merged / truncated latency: {', '.join(cells)} — the merged model has exactly the truncated structure, "
        f"so any difference is timing noise (target ≤ {LATENCY_TARGET}: {verdict}).",
    ]


def to_markdown(r: dict, command: str) -> str:
    paired = _rounds_of(r, "step_round_seconds") is not None and r["repeats"] >= 2
    lines = [
        "# Speed and memory (generated)",
        "",
        f"Produced by `{command}` on {r['machine']['cpu']}, torch {r['machine']['torch']}, "
        f"{r['machine']['threads']} threads{_when_and_load(r)}; {r['image_size']}×{r['image_size']} images, median of "
        f"{r['repeats']} interleaved rounds after a warm-up ({2 * r['repeats']} for inference). ResNet-18 gaze "
        f"regressor truncated at rank {RANK}; Alfa with {ALFA.heads} heads, rank {ALFA.rank} on all 14 factorized "
        "layers. Do not edit by hand: re-run the command.",
        "",
        interval_note() if paired else no_rounds_note(command),
        "",
        *_step_section(r),
        "",
        *_latency_section(r),
    ]
    if "memory_mb" in r:
        lines += [
            "",
            "## Memory",
            "",
            "| process doing | resident, checkpoint loaded (MB) | added by setting up training (MB) | resident, "
            "model ready (MB) | peak while running (MB) | added by running (MB) |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for k, v in r["memory_mb"].items():
            loaded = f"{v['loaded']:.0f}" if "loaded" in v else "—"  # an earlier record kept no such reading
            setting_up = f"{v['model ready'] - v['loaded']:.0f}" if "loaded" in v and k in STEP_SETUPS else "—"
            lines.append(
                f"| {k} | {loaded} | {setting_up} | {v['model ready']:.0f} | {v['peak']:.0f} | "
                f"{v['peak'] - v['model ready']:.0f} |"
            )
        built = (
            "loads the model from its checkpoint, as a deployment does (the dense or the truncated ResNet-18), "
            if r.get("memory_of") == "loaded checkpoints"  # an earlier record's processes truncated it themselves
            else "builds the model (truncating it itself: the truncated rows include what building and truncating "
            "left resident, which a process loading a truncated checkpoint does not hold), "
        )
        lines += [
            "",
            f"Each row is a fresh process (Python and PyTorch included) that {built}then runs 3 personalization "
            "steps (or 3 inference passes over the 20-image batch). *Setting up training*: the step's copy of the "
            "model and its optimizer (a process's first torch optimizer also loads much of torch's own code, its "
            "compiler's included, which the inference rows' processes do not load); the optimizer's state is made by "
            "the first step, so it is in the peak.",
        ]
    return "\n".join(lines) + "\n"


def _when_and_load(r: dict) -> str:
    """``, on <date> (1-minute load average x as it started, y at its end with its own work, n CPUs)``, of what the
    record keeps (an earlier one kept neither)."""
    if "date" not in r:
        return " (a record that keeps no date or load average)"
    start, end = r["load_average"]
    return (
        f", on {r['date']} (1-minute load average {load_text(start)} as it started and {load_text(end)} at its end, "
        "its own work "
        f"included, {r['cpus']} CPUs)"
    )


def speed_command(out: str | None, repeats: int, image_size: int, threads: int | None = None) -> str:
    """The command line that measures ``result`` with these options (quoted in the page it writes); ``threads``: the
    ``--threads`` given, if any (the page names the count the run had either way)."""
    command = "alfa speed" + (f" --out {out}" if out else "") + (f" --repeats {repeats}" if repeats != 20 else "")
    if image_size != 224:
        command += f" --image-size {image_size}"
    return command + (f" --threads {threads}" if threads is not None else "")


def transformers_path(page: str | Path) -> Path:
    """Where the transformer section's measurement is kept, beside the page's own data."""
    path = Path(page)
    return path.with_name(path.stem + "-transformers.json")


def transformers_command(out: str | None, threads: int | None = None) -> str:
    command = "alfa speed --transformers" + (f" --out {out}" if out else "")
    return command + (f" --threads {threads}" if threads is not None else "")


def read_measurement(path: Path, what: str) -> dict:
    """A measurement this command wrote (the gaze part's, or the transformer section's), read back in one line
    where it is not one: a run found out only after minutes of measuring, in the JSON parser's words."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: not {what} alfa speed writes ({e}); move it away, or name another --out") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not {what} alfa speed writes (a JSON {type(data).__name__}, not an object)")
    return data


def page_text(result: dict, command: str, transformers: dict | None, out: str | None) -> str:
    """The whole page: the gaze sections and, when measured, the transformer section."""
    from .transformer_cost import transformer_markdown

    text = to_markdown(result, command)
    if transformers is not None:
        text += "\n" + transformer_markdown(transformers, transformers_command(out, transformers.get("threads_given")))
    return text


GAZE_PART, TRANSFORMER_PART = "the gaze sections' measurement", "the transformer section's measurement"


def main(
    out: str | None = None,
    repeats: int = 20,
    image_size: int = 224,
    transformers: bool = False,
    threads: int | None = None,
) -> dict:
    """Measure the gaze sections (or, with ``transformers``, only the transformer section) and write the page;
    the other part is read back from its data beside the page, so each is re-measured on its own. ``threads``: the
    ``--threads`` given, kept in the measurement so that the page's command line repeats it. The part read back is
    read before measuring: a file there that is not one is said at once."""
    path = Path(out) if out else None
    given = {} if threads is None else {"threads_given": threads}
    if transformers:
        from .transformer_cost import measure_transformer_cost, transformer_markdown

        if path is not None and not path.with_suffix(".json").is_file():  # said before minutes of measuring
            raise FileNotFoundError(f"{path.with_suffix('.json')}: run `alfa speed --out {out}` first")
        result = read_measurement(path.with_suffix(".json"), GAZE_PART) if path is not None else None
        section = {**measure_transformer_cost(), **given}
        print(transformer_markdown(section, transformers_command(out, threads)))
        if path is None or result is None:
            return section
        write_text(transformers_path(path), json.dumps(section, indent=2))
        command = speed_command(out, result["repeats"], result["image_size"], result.get("threads_given"))
        write_text(path, page_text(result, command, section, out))
        return section
    extra = transformers_path(path) if path is not None else None
    section = read_measurement(extra, TRANSFORMER_PART) if extra is not None and extra.is_file() else None
    result = {**measure(repeats=repeats, image_size=image_size), **given}
    text = page_text(result, speed_command(out, repeats, image_size, threads), section, out)
    print(text)
    if path is not None:
        write_text(path, text)
        write_text(path.with_suffix(".json"), json.dumps(result, indent=2))
    return result
