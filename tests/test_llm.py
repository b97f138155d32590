"""The small-language-model study (alfa.study.llm, docs/llm.md): the task checkers, the masking schedule, the
bidirectional model, the adapters' trainable parameters, DoRA against PEFT on this model, and a tiny bench."""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest
import torch

pytest.importorskip("transformers")

import alfa  # noqa: E402
from alfa.study.llm.adapt import AdaptConfig, adapt_and_score, method_config, scaled_rank  # noqa: E402
from alfa.study.llm.bench import BenchConfig, run_bench, select_rate, split_problems  # noqa: E402
from alfa.study.llm.model import ModelConfig, build_model, diffusion_loss, encode_batch, logits, mask_answers  # noqa: E402
from alfa.study.llm.pretrain import PretrainConfig, cache_folder  # noqa: E402
from alfa.study.llm.report import interval, llm_page  # noqa: E402
from alfa.study.llm.tasks import TASKS, CharTokenizer, Example, check_answer, evaluate_expression, make_examples  # noqa: E402

TINY = ModelConfig(hidden=16, layers=1, heads=2, intermediate=32)


def _example(task: str, form: str = "heldout", seed: int = 3) -> Example:
    return make_examples([task], form, 1, seed)[0]


@pytest.mark.parametrize("form", ["pretrain", "heldout"])
def test_every_reference_answer_passes_its_checker_and_fits_the_layout(form):
    problems = make_examples(TASKS, form, 150, seed=5)
    assert all(check_answer(p, p.answer) for p in problems)
    encode_batch(problems, ModelConfig())  # raises if a prompt or answer is longer than the layout


def test_arithmetic_checker_rejects_wrong_numbers():
    p = _example("arithmetic")
    value = int(p.answer)
    assert not check_answer(p, str(value + 1))
    assert not check_answer(p, f"{value}.")
    assert not check_answer(p, "")


def test_countdown_checker_accepts_any_right_expression_and_rejects_the_rest():
    p = Example("countdown", "pretrain", "cd 3 5 7 to 22", "3*5+7", (22, 3, 5, 7))
    assert check_answer(p, "7+3*5")  # another right expression
    assert not check_answer(p, "3*5+8")  # a number not given
    assert not check_answer(p, "3*7+1")  # the right value from the wrong numbers
    assert not check_answer(p, "3+5+7")  # the numbers, the wrong value
    assert not check_answer(p, "3*5+7+0")  # an extra number
    assert not check_answer(p, "(3*5)+7")  # outside the grammar
    assert evaluate_expression("2+3*4-1") == (13, [2, 3, 4, 1])  # * before + and -


def test_sudoku_checker_rejects_broken_grids_and_changed_givens():
    p = _example("sudoku", "pretrain")
    rows = p.answer.split("|")
    assert not check_answer(p, "|".join([rows[1], rows[0], *rows[2:]]))  # a valid-looking swap breaks a given
    swapped = [r.translate(str.maketrans("12", "21")) for r in rows]
    assert not check_answer(p, "|".join(swapped))  # still a Latin square, but not the givens
    assert not check_answer(p, p.answer.replace("|", " "))  # the other format's separator
    bad = list(p.answer)
    bad[0] = bad[1]
    assert not check_answer(p, "".join(bad))  # a repeated digit in a row
    held = _example("sudoku", "heldout")
    assert check_answer(held, held.answer) and not check_answer(held, held.answer.replace(" ", "|"))


def test_the_tokenizer_refuses_unknown_characters_and_decodes_up_to_the_end_token():
    tok = CharTokenizer()
    with pytest.raises(ValueError, match="alphabet"):
        tok.encode("CAPS")
    assert tok.decode_answer(tok.encode("12+3") + [tok.eos] + tok.encode("9")) == "12+3"


def test_masking_schedule_masks_only_answers_at_rate_t():
    config = ModelConfig()
    ids, answer = encode_batch(make_examples(TASKS, "pretrain", 600, seed=1), config)
    noisy, masked, t = mask_answers(ids, answer, torch.Generator().manual_seed(0))
    assert not (masked & ~answer).any() and masked.any(dim=1).all()  # answers only, at least one per row
    assert torch.equal(noisy[masked], torch.full_like(noisy[masked], CharTokenizer().mask))
    assert torch.equal(noisy[~masked], ids[~masked])
    assert torch.equal(masked.sum(dim=1).float() / answer.sum(dim=1), t)  # exactly t of the answer is masked
    assert t.min() == 1 / 20 and t.max() == 1  # k runs over 1 … A
    assert abs(t.mean().item() - 10.5 / 20) < 0.05  # and is uniform there
    first = masked[:, -20:].float().mean(dim=0)
    assert first.max() - first.min() < 0.15  # every answer position is masked about as often


def test_diffusion_loss_is_the_masked_cross_entropy_weighted_by_one_over_t():
    model = build_model(TINY, seed=0)
    ids, answer = encode_batch(make_examples(TASKS, "pretrain", 6, seed=2), TINY)
    loss = diffusion_loss(model, ids, answer, torch.Generator().manual_seed(4))
    noisy, masked, t = mask_answers(ids, answer, torch.Generator().manual_seed(4))
    logp = logits(model, noisy).log_softmax(-1).gather(-1, ids[..., None])[..., 0]
    by_hand = torch.stack([-(logp[i][masked[i]]).sum() / t[i] / answer[i].sum() for i in range(6)]).mean()
    assert torch.allclose(loss, by_hand, rtol=1e-5)


def test_the_diffusion_model_attends_both_ways_and_the_causal_one_does_not():
    ids, _ = encode_batch(make_examples(TASKS, "pretrain", 1, seed=2), TINY)
    changed = ids.clone()
    changed[0, -1] = (changed[0, -1] + 5) % CharTokenizer().vocab_size
    for objective, sees_ahead in (("diffusion", True), ("causal", False)):
        model = build_model(dataclasses.replace(TINY, objective=objective), seed=0).eval()
        first = logits(model, ids)[0, 0], logits(model, changed)[0, 0]
        assert (not torch.allclose(*first)) == sees_ahead


def test_ranks_are_the_papers_scaled_by_width():
    assert (scaled_rank(128, 128), scaled_rank(64, 128), scaled_rank(128, 4096)) == (4, 2, 128)
    assert method_config("alfa", 128).dense_rank == 4 and method_config("lora", 128).rank == 4


@pytest.mark.parametrize("method", ["lora", "dora", "alfa", "full", "base"])
def test_the_reported_trainable_parameters_are_exactly_the_ones_that_train(method):
    base = build_model(TINY, seed=0)
    data = make_examples(TASKS, "heldout", 8, seed=6)
    before = copy.deepcopy(base.state_dict())
    record = adapt_and_score(base, method, 1e-2, 0, data, {}, TINY, AdaptConfig(batch=4, epochs=1, warmup=1))
    assert all(torch.equal(v, base.state_dict()[k]) for k, v in before.items())  # the base itself is untouched
    # the same attach on a copy: what the optimizer got is what alfa reports as the adapter
    model = copy.deepcopy(base)
    if method == "base":
        assert record["trainable"] == 0 and record["adapter_bytes"] == 0
        return
    alfa.attach(model, method_config(method, TINY.hidden))
    reported = sum(p.numel() for p in alfa.adapter_parameters(model).values())
    trainable = {id(p): p.numel() for p in model.parameters() if p.requires_grad}
    assert record["trainable"] == reported == sum(trainable.values()) > 0
    if method != "full":
        adapted = [n for n, _ in model.named_modules() if n.endswith("_proj")]
        assert len(adapted) == 7 * TINY.layers and record["trainable"] < sum(p.numel() for p in base.parameters())


def test_dora_on_this_model_equals_peft():
    peft = pytest.importorskip("peft")
    base = build_model(TINY, seed=0).eval()
    rank = 2
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    theirs = peft.get_peft_model(
        copy.deepcopy(base),
        peft.LoraConfig(r=rank, lora_alpha=4, target_modules=targets, init_lora_weights=False, use_dora=True),
    )
    ours = copy.deepcopy(base)
    alfa.attach(ours, dataclasses.replace(method_config("dora", TINY.hidden), rank=rank, alpha=4.0))
    mine = dict(ours.named_modules())
    copied = 0
    for name, module in theirs.named_modules():
        if hasattr(module, "lora_magnitude_vector") and "default" in module.lora_A:
            layer = mine[name.removeprefix("base_model.model.")]
            with torch.no_grad():
                layer.A.copy_(module.lora_A["default"].weight)
                layer.B.copy_(module.lora_B["default"].weight)
                layer.magnitude.copy_(module.lora_magnitude_vector["default"].weight * 1.1)
                module.lora_magnitude_vector["default"].weight.mul_(1.1)
            copied += 1
    assert copied == 7 * TINY.layers
    ids, _ = encode_batch(make_examples(TASKS, "heldout", 3, seed=1), TINY)
    mask = torch.ones(3, 1, ids.shape[1], ids.shape[1], dtype=torch.bool)
    with torch.no_grad():
        expected = theirs(input_ids=ids, attention_mask=mask).logits
        assert not torch.allclose(expected, logits(base, ids), atol=1e-4)  # the adapters change the output
        assert torch.allclose(logits(ours, ids), expected, atol=1e-5)


def test_splits_are_disjoint_and_the_rate_rule_prefers_validation_then_the_smaller_rate():
    config = BenchConfig(examples=60, val_per_task=5, test_per_task=5)
    train, val, test = split_problems(config)
    prompts = [p.prompt for p in train + val + test]
    assert len(set(prompts)) == len(prompts) == 90 and all(p.format == "heldout" for p in train + val + test)
    assert [p.task for p in test] == [t for t in TASKS for _ in range(5)]

    def run(lr: float, hits: int) -> dict:
        return {"lr": lr, "scores": {"val": {t: [1] * hits + [0] * (4 - hits) for t in TASKS}}}

    assert select_rate([run(1e-3, 1), run(3e-3, 3), run(1e-2, 2)]) == 3e-3
    assert select_rate([run(1e-2, 2), run(1e-3, 2)]) == 1e-3


def test_interval_is_a_student_t_interval():
    iv = interval([0.2, 0.4, 0.6])
    assert iv.mean == pytest.approx(0.4) and iv.high - iv.mean == pytest.approx(4.302653 * 0.2 / 3**0.5, rel=1e-4)


def test_a_tiny_bench_runs_end_to_end_resumes_and_makes_its_page(tmp_path):
    config = BenchConfig(
        pretrain=PretrainConfig(model=TINY, steps=2, batch=4, warmup=1, checkpoint_every=1, probe_problems=1),
        adapt=AdaptConfig(batch=8, epochs=1, warmup=1, decode_steps=4),
        examples=12,
        val_per_task=1,
        test_per_task=2,
        seeds=(0, 1),
        grids={"lora": (1e-3, 1e-2), "alfa": (1e-2,)},
        name="tiny",
    )
    result = run_bench(config, tmp_path / "out", tmp_path / "cache", progress=False, command="test")
    assert {(r["method"], r["seed"]) for r in result["runs"]} == {
        ("base", 0), ("lora", 0), ("lora", 1), ("alfa", 0), ("alfa", 1)
    } and sum(r["method"] == "lora" for r in result["runs"]) == 3  # fmt: skip
    runs = result["runs"]
    assert all(len(r["scores"]["test"][t]) == 2 and len(r["answer_loss"][t]) == 2 for r in runs for t in TASKS)
    lora = [r for r in result["runs"] if r["method"] == "lora" and r["lr"] == result["selected_rates"]["lora"]]
    assert lora[0]["answer_loss"] != lora[1]["answer_loss"]  # seeds differ; the loss is graded, not 0/1
    assert (cache_folder(config.pretrain, tmp_path / "cache") / "model.safetensors").is_file()
    stale = dataclasses.replace(config.pretrain, lr=1e-3)
    assert cache_folder(stale, tmp_path / "cache") != cache_folder(config.pretrain, tmp_path / "cache")
    records = sorted((tmp_path / "out" / "records").iterdir())
    stamps = [p.stat().st_mtime_ns for p in records]
    again = run_bench(config, tmp_path / "out", tmp_path / "cache", progress=False, command="test")
    assert [p.stat().st_mtime_ns for p in records] == stamps and again["runs"] == result["runs"]
    written = json.loads((tmp_path / "out" / "bench.json").read_text())
    assert written["complete"] and written["runs"] == json.loads(json.dumps(result["runs"]))
    assert set(written["step_seconds"]) == {"lora", "alfa"} and all(v > 0 for v in written["step_seconds"].values())
    rounds = written["step_round_seconds"]  # every round kept, the pretrained base timed
    assert set(rounds) == {"lora", "alfa"} and all(len(v) == 15 for v in rounds.values())
    assert written["step_timing"]["weights"] == {"kind": "pretrained", "digest": config.pretrain.digest()}
    page = llm_page(written, "data.json")
    assert "## The answer" in page and "## Answer loss" in page and "## Protocol" in page and "unfinished" not in page
    partial = dict(written, complete=False, runs=written["runs"][:3])
    assert "An unfinished run: 3 of its 6 adaptation runs" in llm_page(partial, "data.json")
    # a bench that is not the standard one says so: a smoke page had the standard run's protocol as its own
    assert written["name"] != "standard" and "the numbers below were produced by it" not in page
    assert f"**This is not the standard run:** bench `{written['name']}`" in page
    standard = llm_page(dict(written, name="standard"), "data.json")
    assert "the numbers below were produced by it" in standard and "This is not the standard run" not in standard
    other = dataclasses.replace(config, seeds=(0, 2), name="other")  # its records have this one's names
    with pytest.raises(
        ValueError,
        match=r"another configuration \(the folder's vs this run's: name 'tiny' vs 'other', seeds \[0, 1\] vs "
        r"\[0, 2\]\)",
    ):
        run_bench(other, tmp_path / "out", tmp_path / "cache", progress=False, command="test")
    assert json.loads((tmp_path / "out" / "bench.json").read_text()) == written  # nothing taken, nothing written
    (tmp_path / "out" / "bench.json").unlink()
    with pytest.raises(ValueError, match="holds bench records but no bench.json"):
        run_bench(config, tmp_path / "out", tmp_path / "cache", progress=False, command="test")


def test_the_command_refuses_a_page_that_is_not_markdown_before_any_work(tmp_path):
    import argparse

    from alfa.cli.llm import _bench

    args = argparse.Namespace(
        out=tmp_path / "out", cache=tmp_path / "c", smoke=True, quiet=True, data_to=None, markdown=tmp_path / "p.txt"
    )
    with pytest.raises(ValueError, match="--markdown must name a .md file"):  # main makes it one line, exit 2
        _bench(args)
    assert not (tmp_path / "out").exists() and not (tmp_path / "c").exists()


def test_a_page_of_another_run_is_refused_before_any_work_and_this_runs_is_not(tmp_path):
    """A smoke run with another --out rewrote the page of the standard run (the general rule lets a command rewrite
    any page it generated)."""
    import argparse

    from alfa.cli.llm import _bench

    page = tmp_path / "p.md"
    page.write_text("# x\n\n<!-- generated by `alfa llm bench --markdown` from runs/a/bench.json (docs/llm.md …)")
    args = argparse.Namespace(
        out=tmp_path / "out", cache=tmp_path / "c", smoke=True, quiet=True, data_to=None, markdown=page, replace=False
    )
    with pytest.raises(ValueError, match=r"the page of another run \(made from runs/a/bench.json, this one's are"):
        _bench(args)
    assert not (tmp_path / "out").exists() and "runs/a/bench.json" in page.read_text()
    from alfa.cli.llm import _refuse_another_page

    _refuse_another_page(page, "runs/a/bench.json")  # its own run's page: rewritten as the general rule allows
    _refuse_another_page(tmp_path / "none.md", "runs/a/bench.json")


def test_the_declared_protocol_is_the_standard_config():
    """docs/llm.md's protocol is prose written before the run; this keeps it and the code that ran the same."""
    from alfa.study.llm.bench import standard_config
    from alfa.study.llm.report import PROTOCOL_TEXT

    text = " ".join(PROTOCOL_TEXT.split())
    config = standard_config()
    pre, model, adapt = config.pretrain, config.pretrain.model, config.adapt

    def rate(x: float) -> str:
        return f"{x:.0e}".replace("e-0", "e-")

    grids = config.grids
    assert grids["alfa"] == grids["lora"] == grids["dora"]
    steps = -(-config.examples // adapt.batch) * adapt.epochs
    for phrase in (
        f"hidden {model.hidden}, {model.layers} layers, {model.heads} heads, MLP {model.intermediate}",
        f"{pre.steps:,} steps of {pre.batch} problems",
        f"rate {rate(pre.lr)}, {pre.warmup} warm-up steps",
        f"Exactly {config.examples:,} held-out-format problems",
        f"same {steps} steps of batch {adapt.batch}",
        f"{adapt.warmup} warm-up steps and a cosine decay",
        f"(LoRA, DoRA, Alfa: {' and '.join(map(rate, grids['lora']))}; "
        f"full fine-tuning: {' and '.join(map(rate, grids['full']))})",
        f"({config.val_per_task} problems a task",
        f"{config.test_per_task} test problems a task, {len(config.seeds)} seeds",
        f"answer of {model.answer_length} tokens and unmasks the {model.answer_length // adapt.decode_steps} most "
        f"confident a round ({adapt.decode_steps} rounds)",
    ):
        assert phrase in text, phrase


def test_an_exact_match_share_gets_wilsons_interval_which_does_not_collapse_at_zero():
    from alfa.study.llm.report import _share_of

    # 0 of 60: the upper end z² / (n + z²) = 3.84 / 63.84; 2 of 60 (the pretraining probe's 3.3 %)
    assert _share_of(0.0, 60) == "0.0 [0.0, 6.0] %"
    assert _share_of(2 / 60, 60) == "3.3 [0.9, 11.4] %"
    assert _share_of(1.0, 60) == "100.0 [94.0, 100.0] %"


def test_an_exact_match_share_gets_wilsons_interval_over_problems_and_one_cut_to_its_range_over_seeds():
    """A t-interval over problems collapsed to [0, 0] where no problem was solved and ran below 0 % where a few
    were, beside Wilson's interval for other rows of the same sentence; over three seeds it reached −2.6 %."""
    from alfa.study.llm.report import _match_interval, _share_over_seeds

    none = _match_interval([0.0] * 60)
    assert (none.mean, none.low) == (0.0, 0.0) and none.high == pytest.approx(3.8415 / 63.8415, abs=1e-4)
    some = _match_interval([0.0] * 58 + [1.0, 1.0])
    assert some.text() == "3.3 [0.9, 11.4]"  # the same interval as the share 2 of 60 (test above)
    thirds = _match_interval([0.0] * 57 + [1 / 3, 2 / 3, 1.0])  # seeds disagree on three problems
    assert thirds.mean == pytest.approx(1 / 30) and 0.0 < thirds.low < thirds.mean < thirds.high < 1.0
    seeds = _share_over_seeds([0.0, 0.0, 1 / 15])
    assert seeds.low == 0.0 < seeds.mean < seeds.high < 1.0
    assert seeds.high == pytest.approx(0.0222 + 4.303 * 0.0385 / 3**0.5, abs=1e-3)  # the t-interval's upper end


def test_pretraining_killed_while_saving_resumes_to_the_uninterrupted_weights(tmp_path, monkeypatch):
    """A kill in the middle of a checkpoint's writing leaves the previous checkpoint whole: the rerun ends with
    the same weights, bit for bit, and the same recorded losses as a run never killed."""
    import safetensors.torch

    from alfa.study.llm.pretrain import pretrained_model

    config = PretrainConfig(model=TINY, steps=4, batch=4, warmup=1, checkpoint_every=1, probe_problems=1)
    whole, whole_state = pretrained_model(config, tmp_path / "whole", progress=False)
    real_save, calls = safetensors.torch.save_file, []

    def killed_on_the_fourth_write(*args, **kwargs):
        calls.append(args[1])
        if len(calls) == 4:
            # step 4's checkpoint: the rerun trains step 4 again from step 3's weights and moments (three files a
            # checkpoint, as before, would have left step 1's weights beside step 2's moments here)
            raise KeyboardInterrupt
        return real_save(*args, **kwargs)

    monkeypatch.setattr(safetensors.torch, "save_file", killed_on_the_fourth_write)
    with pytest.raises(KeyboardInterrupt):
        pretrained_model(config, tmp_path / "killed", progress=False)
    monkeypatch.setattr(safetensors.torch, "save_file", real_save)
    resumed, resumed_state = pretrained_model(config, tmp_path / "killed", progress=False)
    assert resumed_state["losses"] == whole_state["losses"] and resumed_state["done"]
    assert all(torch.equal(v, resumed.state_dict()[k]) for k, v in whole.state_dict().items())
    folder = cache_folder(config, tmp_path / "killed")
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors", "state.json"]


def test_runs_sharing_a_cache_make_its_base_model_once_under_a_lock(tmp_path, capsys):
    """Two benches into other --out folders share one cache: the second waits for the base the first is making
    (on its lock, beside the base's folder) instead of training it into the same files, then finds it finished."""
    import threading

    from alfa.locks import locked
    from alfa.study.llm.pretrain import pretrained_model

    config = PretrainConfig(model=TINY, steps=2, batch=4, warmup=1, checkpoint_every=1, probe_problems=1)
    folder = cache_folder(config, tmp_path)
    made: list = []
    second = threading.Thread(target=lambda: made.append(pretrained_model(config, tmp_path, progress=False)))
    said = ""
    with locked(folder):  # the first run, making the base
        second.start()
        while second.is_alive() and not said:  # until it says it waits (or, without a lock, has trained beside us)
            second.join(timeout=0.1)
            said = capsys.readouterr().err
        assert said == f"waiting for another process pretraining {folder}\n"
        assert second.is_alive() and not folder.exists()  # waiting, nothing written beside the first run
    second.join()
    assert made[0][1]["done"] and (folder / "model.safetensors").is_file()


def test_a_run_waiting_for_a_base_model_names_the_process_making_it(tmp_path, capsys):
    """A run stuck behind another that makes the base it needs says which one (its command line and process), not
    only that it waits: a stuck holder can be found and stopped."""
    import threading

    from test_source_lock import hold_in_another_process

    from alfa.study.llm.pretrain import pretrained_model

    config = PretrainConfig(model=TINY, steps=2, batch=4, warmup=1, checkpoint_every=1, probe_problems=1)
    folder = cache_folder(config, tmp_path)
    holder, command = hold_in_another_process(folder)
    second = threading.Thread(target=lambda: pretrained_model(config, tmp_path, progress=False))
    said = ""
    try:
        second.start()
        while second.is_alive() and not said:
            second.join(timeout=0.1)
            said = capsys.readouterr().err
    finally:
        holder.kill()
        holder.wait()
    second.join()
    assert said.startswith(f"waiting for {command!r} (process {holder.pid}, started "), said
    assert said.endswith(f") pretraining {folder}\n") and (folder / "model.safetensors").is_file()
