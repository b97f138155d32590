"""The cost table (``alfa costs``): sizes and merge kinds per method, and the doc block it rewrites."""

import json
from pathlib import Path

import pytest
import tiny_models  # noqa: F401  (registers tiny_gaze_net)

from alfa.study.bench import costs


@pytest.fixture(scope="module")
def rows() -> dict[tuple[str, str], costs.CostRow]:
    table = costs.cost_table(
        "tiny_gaze_net", rank=12, batch=2, image_size=16, warmup=0, repeats=1, threads=1, progress=False
    )
    return {(r.base, r.method): r for r in table}


def test_every_method_has_a_row_with_timings(rows):
    assert {m for b, m in rows if b == "truncated"} == set(costs.default_methods())
    assert {m for b, m in rows if b == "dense"} == {"source-only", "alfa"}
    for (_, method), r in rows.items():
        assert r.inference_ms > 0 and r.inference_gflop > 0
        if method == "source-only":
            assert r.trainable == 0 and r.step_ms is None and r.adapter_bytes is None and r.merge == "none"
        else:
            assert r.trainable > 0 and r.step_ms > 0 and r.step_gflop > 0 and r.adapter_bytes > 0


def test_rows_come_family_by_family_in_registry_order():
    assert list(costs.default_methods()) == [
        "source-only",
        *("alfa", "diag_gate", "linear_mix"),
        "spectral",
        *("lora", "pissa", "milora", "moslora", "dora", "flora"),
        *("bitfit", "full"),
    ]


def test_a_method_family_the_table_does_not_place_is_refused(monkeypatch):
    from alfa.adapters import METHODS, LoraConfig

    class NewFamilyConfig(LoraConfig):
        family = "new"

    monkeypatch.setitem(METHODS, "new_method", NewFamilyConfig)
    with pytest.raises(ValueError, match=r"method families \['new'\] are neither in FAMILY_ORDER nor in NOT_COSTED"):
        costs.default_methods()


def test_merged_sizes_follow_the_merge_kind(rows):
    truncated = rows["truncated", "source-only"].merged_params
    dense = rows["dense", "source-only"].merged_params
    assert truncated < dense
    for method in ("alfa", "diag_gate", "linear_mix", "spectral"):
        r = rows["truncated", method]
        assert (r.merge, r.merged_params, r.compact_params) == ("factorized (rank d)", truncated, truncated)
    for method in ("lora", "pissa", "milora", "moslora", "dora", "flora"):
        assert (rows["truncated", method].merge, rows["truncated", method].merged_params) == ("densified", dense)
    # PiSSA/MiLoRA re-split the base, so their exact compact merge stays at rank d; LoRA's needs d + r
    assert rows["truncated", "pissa"].compact_params == rows["truncated", "milora"].compact_params == truncated
    assert truncated < rows["truncated", "lora"].compact_params < dense
    assert rows["truncated", "full"].trainable == truncated
    assert rows["truncated", "alfa"].compact_bytes < rows["truncated", "alfa"].adapter_bytes
    assert rows["dense", "alfa"].merged_params == dense and rows["dense", "alfa"].merge == "dense"


def test_update_doc_rewrites_only_the_marked_block(tmp_path: Path):
    page = tmp_path / "page.md"
    page.write_text(f"intro\n{costs.BEGIN_MARK}\nold table\n{costs.END_MARK}\n\noutro\n", encoding="utf-8")
    costs.update_doc(page, "| new | table |\n")
    assert page.read_text(encoding="utf-8") == (
        f"intro\n{costs.BEGIN_MARK}\n| new | table |\n{costs.END_MARK}\n\noutro\n"
    )


@pytest.mark.parametrize("body", ["no markers", f"{costs.END_MARK}\n{costs.BEGIN_MARK}", f"{costs.BEGIN_MARK}" * 2])
def test_update_doc_refuses_a_page_without_one_marked_block(tmp_path: Path, body: str):
    page = tmp_path / "page.md"
    page.write_text(body, encoding="utf-8")
    with pytest.raises(ValueError, match="needs exactly one"):
        costs.update_doc(page, "table")
    assert page.read_text(encoding="utf-8") == body


def test_the_page_is_checked_before_measuring(tmp_path: Path, monkeypatch):
    page = tmp_path / "page.md"
    page.write_text("no markers", encoding="utf-8")
    monkeypatch.setattr(costs, "cost_table", lambda **_: pytest.fail("measured before checking the page"))
    sizes = {"rank": 64, "batch": 1, "image_size": 32, "warmup": 0, "repeats": 1, "threads": 1, "seed": 0}
    with pytest.raises(ValueError, match="needs exactly one"):
        costs.report_costs(model_name="resnet18_gaze", **sizes, update_doc_path=page)


def test_the_page_is_written_with_its_data_and_renders_back_from_it(tmp_path: Path, capsys):
    page = tmp_path / "page.md"
    page.write_text(f"intro\n{costs.BEGIN_MARK}\nold\n{costs.END_MARK}\noutro\n", encoding="utf-8")
    sizes = {"rank": 12, "batch": 2, "image_size": 16, "warmup": 0, "repeats": 6, "threads": 1, "seed": 0}
    rows = costs.report_costs(model_name="tiny_gaze_net", **sizes, dense_alfa=False, update_doc_path=page)
    data = json.loads(costs.data_path(page).read_text(encoding="utf-8"))
    assert data["format"] == costs.DATA_FORMAT and data["settings"]["repeats"] == 6
    assert [costs.CostRow(**r) for r in data["rows"]] == rows  # every round kept
    assert all(len(r.inference_rounds_ms) == 6 for r in rows)
    text = page.read_text(encoding="utf-8")
    assert text == costs.with_block(text, costs.costs_block(data))  # alfa pages renders the same section
    assert text.startswith("intro\n") and text.endswith(f"{costs.END_MARK}\noutro\n")
    # six rounds give each median its interval, the smallest and largest round (coverage 96.9 %)
    lora = next(r for r in rows if r.method == "lora")
    low, high = min(lora.inference_rounds_ms), max(lora.inference_rounds_ms)
    assert f"{lora.inference_ms:.0f} [{low:.0f}, {high:.0f}]" in text and "95 % interval (distribution-free" in text


def test_a_file_of_another_kind_where_the_data_goes_is_refused_before_measuring(tmp_path: Path, monkeypatch):
    page = tmp_path / "page.md"
    page.write_text(f"{costs.BEGIN_MARK}\n{costs.END_MARK}\n", encoding="utf-8")
    (tmp_path / "page.json").write_text('{"mine": 1}', encoding="utf-8")
    monkeypatch.setattr(costs, "cost_table", lambda **_: pytest.fail("measured before checking the data's place"))
    sizes = {"rank": 64, "batch": 1, "image_size": 32, "warmup": 0, "repeats": 1, "threads": 1, "seed": 0}
    with pytest.raises(ValueError, match="page.json exists and is not the costs data of this page"):
        costs.report_costs(model_name="resnet18_gaze", **sizes, update_doc_path=page)
    assert (tmp_path / "page.json").read_text(encoding="utf-8") == '{"mine": 1}'


def test_the_sizes_sentence_is_computed_from_the_rows_and_needs_alfa_and_lora():
    """The page's words about the files come from the rows (they were typed once, and went stale when the header
    grew): the range, the header beyond 4 bytes per number, Alfa against LoRA and its compact file."""

    def row(method, trainable, file, compact=None):
        fields = dict(base="truncated", config="", merged_params=0, merge="", compact_params=0, step_ms=None)
        return costs.CostRow(
            method=method,
            trainable=trainable,
            adapter_bytes=file,
            compact_bytes=compact,
            **fields,
            step_cpu_ms=None,
            inference_ms=None,
        )

    rows = [
        row("source-only", 0, None),
        row("alfa", 1000, 4000 + 2048, 1024),
        row("lora", 500, 2000 + 3072),
        row("diag_gate", 10, 40 + 1024),
    ]
    assert costs._sizes_sentence(rows) == (
        "Per-user files: from 1.0 KiB (diag_gate) to 5.9 KiB (alfa); beyond 4 bytes per trainable number each holds "
        "1.0–3.0 KiB of JSON header. Alfa trains 2.0× LoRA's numbers (5.9 KiB against 5.0 KiB), but its compact file "
        "is 1.0 KiB: 5.0× smaller than LoRA's file."
    )
    assert costs._sizes_sentence([r for r in rows if r.method != "lora"]) == ""
