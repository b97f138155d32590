"""The cost table (``alfa costs``): sizes and merge kinds per method, and the doc block it rewrites."""

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
