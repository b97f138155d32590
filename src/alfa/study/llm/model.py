"""The small language model of the paper's kind: a masked-diffusion model in the LLaDA style.

A Llama-shaped transformer (``transformers.LlamaForCausalLM`` built from a config, random weights) whose
attention is made **bidirectional**: every layer's ``is_causal`` is off and the model is given a full 4-D
attention mask, so each position sees the whole sequence (LLaDA's "Llama without the causal mask").

A sequence is laid out as ``<pad>… · prompt · <sep> · answer · <eos>…``: a prompt region of at most
``prompt_length`` characters (padded on the left) and an answer region of ``answer_length`` tokens, the
answer padded with end tokens (LLaDA pads its answers with EOS the same way, so the model also learns
where an answer stops).

* **training** (LLaDA's supervised form): a ratio ``t = k/A`` per sequence (``k`` uniform in ``1 … A``, the
  answer's ``A`` tokens), that many answer tokens replaced by ``<mask>``, cross-entropy on the masked
  tokens, weighted by ``1/t`` and divided by the answer length (:func:`diffusion_loss`);
* **inference** (:func:`generate`): the answer region starts all masked; each of ``steps`` rounds predicts
  every masked token and keeps the most confident ones (LLaDA's low-confidence remasking), so that after
  the last round nothing is masked.

``objective="causal"`` is the same network with the causal mask kept, next-token loss on the answer region
and greedy decoding: the fallback the issue allows, kept to compare against (not the default).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .tasks import CharTokenizer, Example

__all__ = [
    "ModelConfig",
    "build_model",
    "encode_batch",
    "per_problem_loss",
    "diffusion_loss",
    "causal_loss",
    "sequence_loss",
    "generate",
]

OBJECTIVES = ("diffusion", "causal")


@dataclass(frozen=True)
class ModelConfig:
    """The network and its sequence layout. ``hidden`` 128 is 1/32 of LLaDA-8B's 4096 (the factor by which
    the adapters' ranks are scaled, see :mod:`alfa.study.llm.adapt`)."""

    hidden: int = 128
    layers: int = 4
    heads: int = 4
    intermediate: int = 344
    prompt_length: int = 44
    answer_length: int = 20
    objective: str = "diffusion"

    def validate(self) -> None:
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {OBJECTIVES}, got {self.objective!r}")
        for name in ("hidden", "layers", "heads", "intermediate", "prompt_length", "answer_length"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.hidden % self.heads:
            raise ValueError(f"hidden ({self.hidden}) must be a multiple of heads ({self.heads})")

    @property
    def length(self) -> int:
        return self.prompt_length + 1 + self.answer_length

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(dataclasses.asdict(self), sort_keys=True).encode()).hexdigest()[:12]


def build_model(config: ModelConfig, seed: int) -> nn.Module:
    """The network of ``config`` with random weights drawn from ``seed`` (nothing is downloaded)."""
    import transformers

    config.validate()
    tokenizer = CharTokenizer()
    hf = transformers.LlamaConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=config.hidden,
        intermediate_size=config.intermediate,
        num_hidden_layers=config.layers,
        num_attention_heads=config.heads,
        num_key_value_heads=config.heads,
        max_position_embeddings=config.length,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad,
        bos_token_id=None,
        eos_token_id=tokenizer.eos,
        attn_implementation="sdpa",
    )
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(hf)
    if config.objective == "diffusion":
        for layer in model.model.layers:
            layer.self_attn.is_causal = False
    model.llm_objective = config.objective  # read by :func:`logits`
    return model


def encode_batch(examples: Sequence[Example], config: ModelConfig) -> tuple[Tensor, Tensor]:
    """``(ids, answer)``: the token ids ``(B, P + 1 + answer_length)`` and the boolean mask of the answer region.

    The prompts are padded on the **left** to ``P``, the longest prompt of the batch (at most
    ``config.prompt_length``): every prompt then ends right before the separator, so the distance from an
    answer token to the prompt character it depends on (a Sudoku given, say) is the same in every batch, and
    a batch of short prompts costs no padding."""
    tokenizer = CharTokenizer()
    prompts, answers = [], []
    for example in examples:
        prompt, answer = tokenizer.encode(example.prompt), tokenizer.encode(example.answer)
        if len(prompt) > config.prompt_length or len(answer) > config.answer_length:
            raise ValueError(
                f"a {example.task} problem does not fit the layout ({len(prompt)} > {config.prompt_length} prompt "
                f"or {len(answer)} > {config.answer_length} answer characters): {example.prompt!r}"
            )
        prompts.append(prompt)
        answers.append(answer + [tokenizer.eos] * (config.answer_length - len(answer)))
    width = max(len(p) for p in prompts)
    rows = [[tokenizer.pad] * (width - len(p)) + p + [tokenizer.sep] + a for p, a in zip(prompts, answers, strict=True)]
    ids = torch.tensor(rows, dtype=torch.long)
    answer_region = torch.zeros_like(ids, dtype=torch.bool)
    answer_region[:, width + 1 :] = True
    return ids, answer_region


def logits(model: nn.Module, ids: Tensor) -> Tensor:
    """The model's logits ``(B, L, V)``; bidirectional for a diffusion model (a full 4-D mask)."""
    if getattr(model, "llm_objective", "diffusion") == "diffusion":
        full = torch.ones(ids.shape[0], 1, ids.shape[1], ids.shape[1], dtype=torch.bool)
        return model(input_ids=ids, attention_mask=full).logits
    return model(input_ids=ids).logits


def mask_answers(ids: Tensor, answer: Tensor, generator: torch.Generator) -> tuple[Tensor, Tensor, Tensor]:
    """LLaDA's forward process on the answer region: ``(noisy ids, masked, t)``. Per row a count ``k`` is drawn
    uniformly from ``1 … A`` (``A`` answer tokens) and ``k`` answer tokens chosen at random are masked, so the
    ratio is ``t = k / A``: the discrete form of ``t ~ U(0, 1]`` that LLaDA uses to estimate its loss with low
    variance. (Masking each token with probability ``t`` instead leaves rows with no mask at small ``t``, and
    ``1/t`` then weights a single forced mask by up to a thousand: on 20-token answers that noise drowned the
    signal.)"""
    batch = ids.shape[0]
    length = answer.sum(dim=1)
    k = (torch.rand(batch, generator=generator) * length).long().clamp(max=length - 1) + 1
    scores = torch.rand(ids.shape, generator=generator).masked_fill(~answer, 2.0)  # answer positions first
    rank = scores.argsort(dim=1).argsort(dim=1)  # each position's place in its row's random order
    masked = (rank < k[:, None]) & answer
    noisy = ids.masked_fill(masked, CharTokenizer().mask)
    return noisy, masked, k.float() / length


def per_problem_loss(model: nn.Module, ids: Tensor, answer: Tensor, generator: torch.Generator) -> Tensor:
    """``(1/t) Σ_masked −log p(token) / answer length`` of each row (one mask draw): LLaDA's SFT loss per row."""
    if getattr(model, "llm_objective", "diffusion") != "diffusion":
        out = logits(model, ids)[:, :-1].float()
        nll = nn.functional.cross_entropy(out.transpose(1, 2), ids[:, 1:], reduction="none")
        return (nll * answer[:, 1:]).sum(dim=1) / answer[:, 1:].sum(dim=1)
    noisy, masked, t = mask_answers(ids, answer, generator)
    out = logits(model, noisy).float()
    nll = nn.functional.cross_entropy(out.transpose(1, 2), ids, reduction="none")
    return (nll * masked).sum(dim=1) / t / answer.sum(dim=1)


def diffusion_loss(model: nn.Module, ids: Tensor, answer: Tensor, generator: torch.Generator) -> Tensor:
    """``E[ (1/t) Σ_masked −log p(token) ] / answer length``, averaged over the batch (LLaDA's SFT loss)."""
    return per_problem_loss(model, ids, answer, generator).mean()


def causal_loss(model: nn.Module, ids: Tensor, answer: Tensor) -> Tensor:
    """Next-token cross-entropy on the answer region."""
    out = logits(model, ids)[:, :-1].float()
    nll = nn.functional.cross_entropy(out.transpose(1, 2), ids[:, 1:], reduction="none")
    target = answer[:, 1:]
    return ((nll * target).sum(dim=1) / target.sum(dim=1)).mean()


def sequence_loss(model: nn.Module, ids: Tensor, answer: Tensor, generator: torch.Generator) -> Tensor:
    """The training loss of the model's objective."""
    if getattr(model, "llm_objective", "diffusion") == "diffusion":
        return diffusion_loss(model, ids, answer, generator)
    return causal_loss(model, ids, answer)


@torch.no_grad()
def generate(model: nn.Module, examples: Sequence[Example], config: ModelConfig, steps: int) -> list[str]:
    """The model's answers to ``examples`` (text up to the first end token)."""
    tokenizer = CharTokenizer()
    ids, _ = encode_batch(examples, config)
    start = ids.shape[1] - config.answer_length
    ids[:, start:] = tokenizer.mask
    if config.objective == "causal":
        for position in range(start, ids.shape[1]):
            ids[:, position] = logits(model, ids[:, :position])[:, -1].argmax(dim=-1)
    else:
        per_round = math.ceil(config.answer_length / steps)
        while (ids == tokenizer.mask).any():
            masked = ids == tokenizer.mask
            out = logits(model, ids).float()
            out[..., tokenizer.mask] = -math.inf  # never predict the mask token itself
            confidence, choice = out.softmax(dim=-1).max(dim=-1)
            confidence = confidence.masked_fill(~masked, -1.0)
            take = min(per_round, int(masked.sum(dim=1).max()))
            keep = confidence.topk(take, dim=1).indices
            chosen = torch.zeros_like(masked).scatter_(1, keep, True) & masked
            ids = torch.where(chosen, choice, ids)
    return [tokenizer.decode_answer(row[start:].tolist()) for row in ids]
