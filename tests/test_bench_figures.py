"""The benchmark's figures (alfa.study.bench.figures): what each draws, read back from the matplotlib figure."""

from __future__ import annotations

import pytest


def test_an_ablation_curve_keeps_its_pairs_colour_and_its_methods_style(tmp_path, monkeypatch):
    """Colours followed the order of the lines, so E→M was blue for Alfa and purple for LoRA, and changed between
    figures; bars of one setting hid each other; the axis ran below zero."""
    import alfa.study.bench.figures as figures

    drawn = []
    monkeypatch.setattr(figures, "save_figure", lambda fig, path, dpi: drawn.append(fig) or path)
    line = [(1.0, 10.0, 12.0), (4.0, 8.0, 1.0)]
    figures.plot_curves({"alfa E→M": line, "lora E→M": line}, tmp_path / "a.png", xlabel="H", title="t")
    figures.plot_curves({"alfa G→D": line, "alfa E→M": line}, tmp_path / "b.png", xlabel="H", title="t")
    (a,), (b,) = drawn[0].axes, drawn[1].axes
    lines = [{c.get_label(): c.lines[0] for c in ax.containers} for ax in (a, b)]
    colour = [{k: line.get_color() for k, line in of.items()} for of in lines]
    assert colour[0]["alfa E→M"] == colour[0]["lora E→M"] == colour[1]["alfa E→M"] != colour[1]["alfa G→D"]
    assert lines[0]["alfa E→M"].get_linestyle() != lines[0]["lora E→M"].get_linestyle()
    assert len({line.get_xdata()[0] for line in lines[0].values()}) == 2 and a.get_ylim()[0] == 0.0


def test_the_update_maps_name_their_colour_scale_and_draw_the_rank_threshold(tmp_path, monkeypatch):
    """The colour bar had no label, one scale for a row's persons painted all but the largest update black, and
    the threshold the page counts the numerical rank against was not drawn beside the singular values."""
    import torch

    import alfa.study.bench.figures as figures

    drawn = []
    monkeypatch.setattr(figures, "save_figure", lambda fig, path, dpi: drawn.append(fig) or path)
    delta = torch.outer(torch.arange(1.0, 5.0), torch.ones(3 * 9)) + 1e-6 * torch.eye(4, 27)
    meta = {"layer": "layer1.0.conv1", "m": 4, "n": 27, "in_features": 3, "kernel": [3, 3]}
    meta["methods"] = {"alfa": {"persons": ["p00", "p01"]}}
    figures.plot_update_maps({"alfa/p00": delta, "alfa/p01": 2 * delta}, meta, tmp_path / "u.png")
    (fig,) = drawn
    maps, spectrum, bars = fig.axes[:2], fig.axes[2], fig.axes[3:]
    assert [bar.get_ylabel() for bar in bars] == ["‖ΔW‖ over the kernel"] * 2
    largest = [ax.images[0].get_clim()[1] for ax in maps]
    assert largest[1] == pytest.approx(2 * largest[0])  # each person on its own scale
    assert [list(line.get_ydata()) for line in spectrum.lines if line.get_linestyle() == ":"] == [[1e-3, 1e-3]]
    assert figures.numerical_rank(delta) == 1 == figures.numerical_rank(delta, rtol=figures.RANK_RTOL)


def test_the_update_maps_caption_counts_the_persons_and_names_the_methods_its_data_holds():
    """The caption said "three target persons, Alfa and LoRA" whatever the figure showed: a run with two adapters
    of one method drew two persons of that method alone."""
    from alfa.study.bench.report_page import _updates_caption

    two = (None, {"methods": {"alfa": {"persons": ["p00", "p01"]}}})
    assert "for 2 target persons, Alfa;" in _updates_caption(two)
    both = (None, {"methods": {"lora": {"persons": ["p00"]}, "alfa": {"persons": ["p00"]}}})
    assert "for 1 target person, Alfa and LoRA;" in _updates_caption(both)
