"""Adding an adapter method or a dataset is one registration (with its module's import line): a dummy of each
reaches what a user and the benchmark see (the registry, the commands, the benchmark's plan and its report)."""

import argparse
import contextlib
import dataclasses
from typing import ClassVar

import pytest
from bench_records import results_of

from alfa.adapters import METHODS, LoraConfig, register_method
from alfa.gaze.data.registry import list_datasets, open_dataset, register_dataset, unregister_dataset
from alfa.gaze.recipes import PAPER_RECIPE
from alfa.study.bench.config import BenchConfig
from alfa.study.bench.methods import MAIN_METHODS, table_methods
from alfa.study.bench.plan import plan_records
from alfa.study.bench.report_page import render_report


@contextlib.contextmanager
def _half_lora():
    @register_method
    @dataclasses.dataclass
    class HalfLoraConfig(LoraConfig):
        """A dummy: LoRA of half the usual rank, under its own name."""

        method: ClassVar[str] = "half_lora"
        display_name: ClassVar[str] = "HalfLoRA"
        rank: int = 4

    try:
        yield HalfLoraConfig
    finally:
        del METHODS["half_lora"]


@pytest.fixture
def dummy_method():
    with _half_lora() as config:
        yield config


def test_a_registered_method_gets_a_row_in_the_plan_and_in_table_1(dummy_method):
    assert table_methods() == (*MAIN_METHODS, "half_lora")
    # the presets that are not a declared protocol take every registered method (the standard one: below)
    config = BenchConfig.full(pairs=("E→M",), seeds=(0,), ablations=())
    config.validate()
    plans = {p.id: p for p in plan_records(config)}
    assert plans["half_lora|E→M|seed0"].variant.adapter == dummy_method()
    assert "half_lora[selected]|E→M|seed0" in plans  # its recipe is selected like every shared-recipe method's
    # and its shipped default (none in the package's file yet: the paper's recipe, as alfa personalize uses)
    assert plans["half_lora[default]|E→M|seed0"].variant.shipped == PAPER_RECIPE
    rows = (("source-only", 9.0), ("half_lora", 7.0))
    results = results_of(config, rows)
    assert "half_lora" in results["layout"]["main"]
    from alfa.cli.gaze import _method_config  # what alfa personalize --method half_lora --adapter-rank 2 builds

    args = argparse.Namespace(method="half_lora", heads=None, adapter_rank=2, option=None)
    assert _method_config(args) == dummy_method(rank=2)
    table1 = render_report(results).split("## Table 1")[1].split("\n## ")[0]
    assert "| HalfLoRA |" in table1


def test_a_registered_method_leaves_the_declared_standard_run_as_declared():
    # registering a method grew the declared run of docs/results-v2.md from 6525 records to 6651
    from alfa.study.bench.plan import declared_run

    standard, declared = BenchConfig.standard(), [p.id for p in declared_run("v2")]
    assert len(declared) == 6525
    with _half_lora():
        assert "half_lora" in table_methods()
        assert BenchConfig.standard() == standard
        assert [p.id for p in declared_run("v2")] == declared


def test_without_it_the_plan_is_the_built_in_one():
    assert table_methods() == MAIN_METHODS
    assert "half_lora" not in BenchConfig.standard().methods


def test_a_registered_dataset_kind_opens_everywhere_a_spec_is_read(tmp_path):
    from alfa.gaze.data.synthetic import make_domain

    @register_dataset("mirror-of", form="mirror-of:<domain>")
    def open_mirror(rest, options, spec):
        return make_domain(rest, size=32, persons=2, images_per_person=3)

    try:
        assert "mirror-of" in list_datasets()
        data = open_dataset("mirror-of:mpii")
        assert len(data.persons()) == 2 and len(data) == 6
        from alfa.cli.gaze import open_spec  # what every command's --data reads

        assert len(open_spec("mirror-of:mpii")) == 6
        with pytest.raises(ValueError, match=r"mirror-of:<domain>"):  # the error lists its form beside the others
            open_dataset("no-such-kind:x")
    finally:
        unregister_dataset("mirror-of")
    assert "mirror-of" not in list_datasets()
    with pytest.raises(ValueError, match="unknown kind 'mirror-of'"):
        open_dataset("mirror-of:mpii")


def test_the_command_line_asks_the_methods_class_what_options_it_has():
    import argparse

    from alfa.adapters import AlfaConfig
    from alfa.cli.gaze import _method_config

    def config(method, heads=None, rank=None):
        return _method_config(argparse.Namespace(method=method, heads=heads, adapter_rank=rank, option=None))

    assert config("alfa") == AlfaConfig() and config("alfa", 2, 3) == AlfaConfig(heads=2, rank=3)
    assert config("lora", rank=4) == LoraConfig(rank=4)  # any method with a rank takes --adapter-rank
    with pytest.raises(ValueError, match="--heads: --method lora has no 'heads' option"):
        config("lora", heads=2)
    assert not METHODS["alfa"].trains_prompts and METHODS["tpgaze"].trains_prompts


def test_a_registered_dataset_kind_may_declare_a_query_option_of_its_own():
    """A kind's own option is read from a spec by the parser it registers (the parsers were a closed table: a
    registered ``fps`` was refused with "options are size"); a parser of a shared option is refused."""
    from alfa.gaze.data.synthetic import make_domain

    seen = {}

    @register_dataset("paced", form="paced:<domain>", options=("size", "fps"), option_types={"fps": int})
    def open_paced(rest, options, spec):
        seen.update(options)
        return make_domain(rest, size=options.get("size", 32), persons=2, images_per_person=3)

    try:
        assert len(open_dataset("paced:mpii?fps=30&size=32")) == 6 and seen == {"fps": 30, "size": 32}
        with pytest.raises(ValueError, match=r"option 'fps=fast': invalid literal"):
            open_dataset("paced:mpii?fps=fast")
        with pytest.raises(ValueError, match=r"bad option 'rate=1'; options are size, fps"):
            open_dataset("paced:mpii?rate=1")
        with pytest.raises(ValueError, match=r"bad option 'fps=30'; options are split, size, seed"):  # not theirs
            open_dataset("synthetic:mpii?fps=30")
    finally:
        unregister_dataset("paced")
    with pytest.raises(ValueError, match="size is read by the registry for every kind"):
        register_dataset("resized", form="resized:<x>", option_types={"size": int})(lambda *a: None)


def test_a_registered_dataset_kinds_check_is_what_check_spec_runs_without_opening():
    """``check=`` lets a new kind refuse what its spec alone shows wrong (the training commands check ``--val-data``
    this way before opening ``--data``): ``check_spec`` calls it with the opener's arguments and never opens."""
    from alfa.gaze.data.registry import check_spec

    checked = []

    def check_folder(rest, options, spec):
        checked.append((rest, options, spec))
        if rest != "here":
            raise ValueError(f"{spec}: no folder {rest!r}")

    @register_dataset("checked", form="checked:<folder>", options=("size",), check=check_folder)
    def open_checked(rest, options, spec):
        pytest.fail("check_spec opened the data")

    try:
        check_spec("checked:here?size=32")
        assert checked == [("here", {"size": 32}, "checked:here?size=32")]
        with pytest.raises(ValueError, match="no folder 'there'"):
            check_spec("checked:there")
        with pytest.raises(ValueError, match="bad option 'fps=1'"):  # the registry's own reading comes first
            check_spec("checked:here?fps=1")
    finally:
        unregister_dataset("checked")


def test_the_worked_method_of_the_architecture_page_runs_as_printed(tmp_path):
    """docs/architecture.md's recipe named the steps but not the constructor's arguments nor the build method: a
    newcomer's first method failed on both. Its worked example must run, start at the base, train only its own
    tensor, and merge, save and load exactly, on a dense and a factorized layer, a conv and a linear one."""
    import copy
    import re
    from pathlib import Path

    import torch
    from torch import nn

    import alfa

    page = (Path(__file__).resolve().parent.parent / "docs" / "architecture.md").read_text("utf-8")
    block = re.search(r"A whole method, small enough.*?```python\n(.*?)```", page, re.S).group(1)
    namespace: dict = {"__name__": "worked_method"}
    try:
        exec(compile(block, "docs/architecture.md", "exec"), namespace)
        config = namespace["OutputScaleConfig"]
        torch.manual_seed(0)
        model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 8, 3), nn.Flatten(), nn.Linear(8 * 4 * 4, 5))
        alfa.truncate(model, 4, target=["2"])  # one factorized layer beside dense ones
        x = torch.randn(2, 3, 8, 8)
        before = model(x)
        alfa.attach(model, config(layers="all"))
        assert torch.equal(model(x), before)
        trained = [n for n, p in model.named_parameters() if p.requires_grad]
        assert sorted(trained) == ["0.s", "2.s", "4.s"]
        with torch.no_grad():
            for p in model.parameters():
                if p.requires_grad:
                    p.copy_(torch.randn_like(p) * 0.3)
        adapted = model(x)
        assert not torch.allclose(adapted, before)
        alfa.save_adapter(model, tmp_path / "user.safetensors")
        merged = copy.deepcopy(model)
        alfa.merge(merged)
        assert (
            torch.allclose(merged(x), adapted, atol=1e-5) and merged[2].rank == 4 and isinstance(merged[0], nn.Conv2d)
        )
        alfa.detach(model)
        assert torch.equal(model(x), before)
        alfa.load_adapter(model, tmp_path / "user.safetensors")
        assert torch.equal(model(x), adapted)
    finally:
        METHODS.pop("output_scale", None)
