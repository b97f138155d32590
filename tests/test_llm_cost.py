"""Alfa at LLM scale: the cheap association of the attention logits, and dense layers adapted without
building the m×n update when running it per position is cheaper (a Linear of a transformer)."""

import math

import pytest
import torch
from torch import nn

import alfa
from alfa.adapters import AlfaConfig, adapter_parameters
from alfa.adapters.alfa import alfa_mixing


def _randomize(model: nn.Module, std: float = 0.05) -> None:
    torch.manual_seed(1)
    with torch.no_grad():
        for p in adapter_parameters(model).values():
            p.normal_(0, std)


def test_the_cheap_association_computes_the_papers_attention():
    torch.manual_seed(0)
    H, r, d, n = 4, 3, 16, 40
    A_q, B_q = torch.randn(H, r, d, dtype=torch.float64), torch.randn(H, d, r, dtype=torch.float64)
    A_p, B_p = torch.randn(r * H, H * d, dtype=torch.float64), torch.randn(d, r * H, dtype=torch.float64)
    V = torch.randn(d, n, dtype=torch.float64)
    # the paper's reading, term by term: Q_h = B_q A_q V, Attn_h = softmax(Q_h Vᵀ / sqrt(n)), Z_hᵀ = Attn_h V
    Z = torch.cat([torch.softmax((B_q[h] @ A_q[h] @ V) @ V.T / math.sqrt(n), dim=-1) @ V for h in range(H)])
    torch.testing.assert_close(alfa_mixing(A_q, B_q, A_p, B_p, V) @ V, B_p @ A_p @ Z, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("tokens", [3, 4000])  # few positions: the low-rank path; many: the update built once
def test_a_dense_linear_with_a_top_k_dictionary_gives_the_same_outputs_either_way(tokens):
    torch.manual_seed(0)
    layer = nn.Linear(64, 48).double()
    model = nn.Sequential(layer)
    x = torch.randn(tokens, 64, dtype=torch.float64)
    base_out = layer(x)
    alfa.attach(model, AlfaConfig(heads=2, rank=2, dense_rank=8))
    adapted = model[0]
    assert adapted._low_rank_is_cheaper(x) == (tokens == 3)
    assert torch.equal(model(x), base_out)  # zero-init: the base, bit for bit, on both paths
    _randomize(model)
    built = adapted.spec.dense_op(x, adapted.effective_weight()[0], adapted.base.bias)
    torch.testing.assert_close(model(x), built, rtol=1e-10, atol=1e-10)
    assert not torch.allclose(model(x), base_out)


def test_a_dense_conv_builds_its_update_once_and_the_low_rank_path_agrees():
    torch.manual_seed(0)
    conv = nn.Conv2d(8, 12, 3, stride=2, padding=1).double()
    model = nn.Sequential(conv)
    alfa.attach(model, AlfaConfig(heads=2, rank=2))
    _randomize(model)
    adapted, x = model[0], torch.randn(2, 8, 16, 16, dtype=torch.float64)
    assert not adapted._low_rank_is_cheaper(x)  # 2·8·8 positions, full-rank dictionary: building wins
    low_rank = adapted.base(x) + adapted.spec.output_op(adapted.spec.input_op(x, adapted.delta_V()), adapted.U_d)
    torch.testing.assert_close(model(x), low_rank, rtol=1e-10, atol=1e-10)


def test_counting_under_fake_tensors_gives_the_real_tensors_count():
    from alfa.study.bench.transformer_cost import _counted_step, _one_layer_counts

    config = AlfaConfig(heads=2, rank=2, dense_rank=8)
    fake = _one_layer_counts(32, config)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 32, bias=False))
    alfa.attach(model, config)
    flops, saved = _counted_step(model, torch.randn(512, 32))
    assert (fake["flops"], fake["saved_bytes"]) == (flops, saved) and flops > 0
    assert fake["trainable"] == sum(p.numel() for p in adapter_parameters(model).values())


def test_the_section_judges_alfa_against_loras_step_time_on_the_interval():
    from alfa.study.bench.transformer_cost import ALFA, METHODS, transformer_markdown

    jitter = [1.0, 1.02, 0.99, 1.01, 0.98, 1.0, 1.01, 0.99, 1.0]

    def result(alfa_seconds: float, rounds: bool = True) -> dict:
        layer = {"flops": 2 * 10**9, "saved_bytes": 2**20, "trainable": 1000}
        llama = {name: {**layer, "step_seconds": 1.0, "step_quartiles": [0.9, 1.1]} for name in METHODS[:3]}
        llama[ALFA]["step_seconds"] = alfa_seconds
        timed = {f"1024|{m}": {**layer, "step_seconds": 0.5 if m == METHODS[0] else 0.75} for m in METHODS[:3]}
        if rounds:  # LoRA steady, the others jittering from round to round
            for v in [*llama.values(), *timed.values()]:
                v["round_seconds"] = [v["step_seconds"] * j for j in jitter]
            for v in (llama[METHODS[0]], timed[f"1024|{METHODS[0]}"]):
                v["round_seconds"] = [v["step_seconds"]] * len(jitter)
        return {
            "tokens": 512, "rounds": 9, "threads": 2, "date": "2026-12-01", "torch": "2",
            "layers": {**timed, f"4096|{METHODS[0]}": layer},
            "llama": {"tokens": 256, "layers": 2, "width": 1024, "methods": llama},
        }  # fmt: skip

    text = transformer_markdown(result(1.2), "alfa speed --transformers")
    assert "| 1024×1024 | LoRA r=128 | 1,000 | 2.0 | 1.0 | 0.5000 | 1.00 |" in text and "| not timed | — |" in text
    assert "| 1024×1024 | DoRA r=128 | 1,000 | 2.0 | 1.0 | 0.7500 | 1.50 [1.49, 1.51] |" in text
    assert "takes 1.20 [1.19, 1.21]× LoRA r=128's step time" in text and "(goal ≤ 1.5×: met)" in text
    assert "(goal ≤ 1.5×: NOT met)" in transformer_markdown(result(1.6), "x")
    assert "(goal ≤ 1.5×: not shown (the interval straddles it))" in transformer_markdown(result(1.5), "x")
    old = transformer_markdown(result(1.2, rounds=False), "alfa speed --transformers --out docs/speed.md")
    (line,) = [x for x in old.splitlines() if "no per-round timings" in x]
    assert "re-run `alfa speed --transformers --out docs/speed.md` with two rounds or more for the intervals" in line
    assert "takes 1.20× LoRA r=128's step time on this 1024-wide model (goal ≤ 1.5×: not judged" in old
    assert "| 0.7500 | 1.50 |" in old


@pytest.mark.parametrize("d", [8, 64])  # r·H = 8: T V_base for d = 8, B_p (mix V_base) for d = 64
def test_both_associations_of_the_dictionary_update_agree(d):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(80, 72).double())
    alfa.attach(model, AlfaConfig(heads=2, rank=4, dense_rank=d))
    _randomize(model)
    layer = model[0]
    torch.testing.assert_close(layer.delta_V(), layer.mixing() @ layer.V_base, rtol=1e-10, atol=1e-12)
