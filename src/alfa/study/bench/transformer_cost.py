"""What Alfa costs on the Linear layers of a language model, against LoRA and DoRA (``alfa speed --transformers``).

Two measurements, the section "Transformer layers" of docs/speed.md:

* **one d×d Linear layer** (no bias, d = 1024 and 4096), a batch of :data:`TOKENS` tokens: the multiply-adds of
  one training step (forward and backward, counted by ``torch.utils.flop_counter`` under ``FakeTensorMode``,
  so nothing of size d×d is ever allocated), the bytes autograd saves for the backward pass, the trainable
  parameters, and, where it fits in this machine, the step's wall time (forward, backward, AdamW);
* **a small Llama** built from a ``transformers`` config with random weights (1024 wide, two layers), its
  ``q_proj`` and ``v_proj`` adapted: step time and multiply-adds.

Alfa runs on dense layers here (a language model is not truncated): its dictionary is the layer's top-k
singular directions (``AlfaConfig(dense_rank=k)``; the paper's LLaDA setting uses 128) or, as a reference,
the full SVD (``dense_rank=None``), which is what makes the dense dictionary expensive.
"""

from __future__ import annotations

import copy
import dataclasses
import statistics
import time
from typing import Any

import torch
from torch import nn

from alfa import attach
from alfa.adapters import AlfaConfig, DoraConfig, LoraConfig, adapter_parameters
from alfa.study.timing import goal_verdict, interval_note, no_rounds_note, ratio_cell

from .measure import interleaved_seconds, middle_half

__all__ = ["METHODS", "TOKENS", "measure_transformer_cost", "transformer_markdown", "GOAL"]

TOKENS = 512
WIDTHS = (1024, 4096)
TIMED_WIDTHS = (1024,)  # a 4096-wide full-SVD step takes minutes of these CPUs: counted, not timed
GOAL = 1.5  # Alfa (8 heads, rank 8, dictionary 128) within 1.5× LoRA r=128's step time on the 1024-wide model


def _methods() -> dict[str, Any]:
    return {
        "LoRA r=128": LoraConfig(rank=128, alpha=256.0),
        "DoRA r=128": DoraConfig(rank=128, alpha=256.0),
        "Alfa H=8 r=8, dictionary 128": AlfaConfig(heads=8, rank=8, dense_rank=128),
        "Alfa H=8 r=8, full-SVD dictionary": AlfaConfig(heads=8, rank=8),
    }


METHODS = tuple(_methods())
ALFA = METHODS[2]


def _randomize(model: nn.Module) -> None:
    # a trained adapter's cost, not the zero-init one (autograd does the same work either way; this keeps the
    # numbers honest against any shortcut a zero might allow)
    with torch.no_grad():
        for p in adapter_parameters(model).values():
            p.normal_(0, 0.01)


def _counted_step(model: nn.Module, x: torch.Tensor) -> tuple[int, int]:
    """(FLOPs, bytes saved for backward) of forward + backward of ``model(x).sum()``."""
    from torch.utils.flop_counter import FlopCounterMode

    saved: list[int] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t.numel() * t.element_size())
        return t

    with FlopCounterMode(display=False) as counter, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(x).float().sum().backward()
    return int(counter.get_total_flops()), sum(saved)


def _one_layer_counts(width: int, config: Any) -> dict[str, Any]:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        model = nn.Sequential(nn.Linear(width, width, bias=False))
        attach(model, config)
        flops, saved = _counted_step(model, torch.randn(TOKENS, width))
        trainable = sum(p.numel() for p in adapter_parameters(model).values())
    return {"flops": flops, "saved_bytes": saved, "trainable": trainable}


def _trainer(model: nn.Module, make_input):
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)

    def step() -> None:
        out = model(make_input())
        loss = (out.logits if hasattr(out, "logits") else out).float().pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def _small_llama() -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        hidden_size=1024,
        intermediate_size=2816,
        num_hidden_layers=2,
        num_attention_heads=16,
        num_key_value_heads=16,
        vocab_size=1000,
        max_position_embeddings=256,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


def measure_transformer_cost(rounds: int = 9, seed: int = 0, llama: bool = True) -> dict[str, Any]:
    """The measurements of the section (see the module docstring)."""
    torch.manual_seed(seed)
    layers: dict[str, dict[str, Any]] = {}
    steps = {}
    for width in WIDTHS:
        for name, config in _methods().items():
            layers[f"{width}|{name}"] = _one_layer_counts(width, config)
            if width in TIMED_WIDTHS:
                torch.manual_seed(seed)
                model = nn.Sequential(nn.Linear(width, width, bias=False))
                attach(model, config)
                _randomize(model)
                x = torch.randn(TOKENS, width)
                steps[f"{width}|{name}"] = _trainer(model, lambda x=x: x)
    for key, t in interleaved_seconds(steps, rounds, desc="layer steps: rounds").items():
        layers[key]["step_seconds"] = statistics.median(t)
        layers[key]["round_seconds"] = t  # every round's timing (the i-th of each list from the same round)
    result: dict[str, Any] = {"tokens": TOKENS, "rounds": rounds, "layers": layers, "threads": torch.get_num_threads()}
    if llama:
        base = _small_llama()
        ids = torch.randint(0, 1000, (2, 128), generator=torch.Generator().manual_seed(seed))
        runs, counts = {}, {}
        for name, config in _methods().items():
            if "full-SVD" in name:
                continue
            model = copy.deepcopy(base)
            attach(model, dataclasses.replace(config, target=r"\.(q_proj|v_proj)$"))
            _randomize(model)
            runs[name] = _trainer(model, lambda: ids)
            flops, saved = _counted_step(_LogitsOnly(model), ids)
            counts[name] = {
                "flops": flops,
                "saved_bytes": saved,
                "trainable": sum(p.numel() for p in adapter_parameters(model).values()),
            }
        times = interleaved_seconds(runs, rounds, desc="model steps: rounds")
        for name, t in times.items():
            counts[name]["step_seconds"] = statistics.median(t)
            counts[name]["step_quartiles"] = middle_half(t)
            counts[name]["round_seconds"] = t  # the pairs the ratios' intervals need
        result["llama"] = {"tokens": int(ids.numel()), "layers": 2, "width": 1024, "methods": counts}
    result["date"] = time.strftime("%Y-%m-%d")
    result["torch"] = torch.__version__
    return result


class _LogitsOnly(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model(ids).logits


def _g(flops: int) -> str:
    return f"{flops / 1e9:,.1f}"


def _llama_section(r: dict[str, Any]) -> list[str]:
    ll = r["llama"]
    methods = ll["methods"]
    lora = methods[METHODS[0]]
    lines = [
        f"A small Llama ({ll['width']} wide, {ll['layers']} layers, random weights from a `transformers` "
        f"config), `q_proj` and `v_proj` adapted, a batch of {ll['tokens']} tokens:",
        "",
        "| method | trainable params | GFLOP / step | seconds / step (middle half) | × LoRA |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for name, v in methods.items():
        lo, hi = v["step_quartiles"]
        vs = "1.00" if name == METHODS[0] else _vs_lora(v, lora)[0]
        lines.append(
            f"| {name} | {v['trainable']:,} | {_g(v['flops'])} | {v['step_seconds']:.3f} ({lo:.3f}–{hi:.3f}) | {vs} |"
        )
    cell, ratio = _vs_lora(methods[ALFA], lora)
    return lines + [
        "",
        f"Alfa (8 heads, rank 8, dictionary 128) takes {cell}× LoRA r=128's step time on this 1024-wide "
        f"model (goal ≤ {GOAL}×: {goal_verdict(ratio, GOAL, at_least=False)}).",
        "",
    ]


def _paired(r: dict[str, Any]) -> bool:
    """Whether the record keeps two or more rounds of every timing (records made before they were kept do not)."""
    timed = [v for v in r["layers"].values() if "step_seconds" in v]
    timed += list(r["llama"]["methods"].values()) if "llama" in r else []
    return r["rounds"] >= 2 and all("round_seconds" in v for v in timed)


def _vs_lora(method: dict[str, Any], lora: dict[str, Any]) -> tuple[str, Any]:
    """A method's step time in × LoRA's, paired over the rounds where the record keeps them."""
    of_medians = method["step_seconds"] / lora["step_seconds"]
    return ratio_cell(method.get("round_seconds"), lora.get("round_seconds"), of_medians)


def transformer_markdown(r: dict[str, Any], command: str) -> str:
    """The section of docs/speed.md from a measurement."""
    lines = [
        "## Transformer layers: Alfa against LoRA and DoRA",
        "",
        f"Produced by `{command}` on {r['date']} (torch {r['torch']}, {r['threads']} threads). A language model's "
        "Linear layers are adapted dense (no truncation): Alfa's dictionary is the layer's top-k singular "
        "directions (`AlfaConfig(dense_rank=128)`, the paper's LLaDA setting) or the full SVD. Multiply-adds "
        "(GFLOP, forward and backward of one step) are counted by `torch.utils.flop_counter` under "
        f"`FakeTensorMode`; *saved* is what autograd keeps for the backward pass. {r['tokens']} tokens per step; "
        f"times: median of {r['rounds']} interleaved AdamW steps; *× LoRA*: the step time against LoRA r=128's "
        "on the same layer or model.",
        "",
        interval_note() if _paired(r) else no_rounds_note(command),
        "",
        "| layer | method | trainable params | GFLOP / step | saved (MiB) | seconds / step | × LoRA |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for key, v in r["layers"].items():
        width, name = key.split("|")
        lora = r["layers"].get(f"{width}|{METHODS[0]}", {})
        t, vs = "not timed", "—"
        if "step_seconds" in v:
            t = f"{v['step_seconds']:.4f}"
            vs = "1.00" if name == METHODS[0] else _vs_lora(v, lora)[0]
        lines.append(
            f"| {width}×{width} | {name} | {v['trainable']:,} | {_g(v['flops'])} | {v['saved_bytes'] / 2**20:,.1f} | "
            f"{t} | {vs} |"
        )
    lines.append("")
    if "llama" in r:
        lines += _llama_section(r)
    return "\n".join(lines)
