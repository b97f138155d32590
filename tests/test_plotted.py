"""What a figure plots, read back as data (alfa.study.plotted): the values come out rounded, a changed value
changes the data, and nothing of the drawing (dpi, whether it was drawn) does."""

import contextlib
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from alfa.study.plotted import plotted_data, plotted_json, plotted_path, save_figure  # noqa: E402


def tiny_figure(y_middle: float = 2.123456789, pixel: float = 5.0):
    """Four panels: a line, a bar chart over categories, a scatter with colour-mapped values, an image."""
    fig, (line_ax, bar_ax, scatter_ax, image_ax) = plt.subplots(1, 4, figsize=(8, 2))
    line_ax.plot([0, 1, 2], [1.0, y_middle, 3.0], label="curve")
    line_ax.set(title="a line", xlabel="x", ylabel="y", ylim=(0, 4))
    line_ax.legend()
    bar_ax.bar(["left", "right"], [3.0, 4.0])
    scatter_ax.scatter([1.0, 2.0], [3.0, 4.0], s=[5.0, 6.0], c=[0.1, 0.2])
    scatter_ax.text(1.5, 3.5, "note")
    image = np.arange(12.0).reshape(3, 4)
    image[1, 1] = pixel
    image_ax.imshow(image, cmap="gray")
    fig.suptitle("four panels")
    return fig


@pytest.fixture
def figure():
    fig = tiny_figure()
    yield fig
    plt.close(fig)


def test_the_plotted_values_come_out_rounded(figure):
    line, bars, scatter, image = plotted_data(figure)["axes"]
    assert line["titles"] == {"center": "a line"} and (line["xlabel"], line["ylabel"]) == ("x", "y")
    assert line["lines"] == [{"label": "curve", "xy": [[0.0, 1.0], [1.0, 2.12346], [2.0, 3.0]]}]
    assert line["legend"] == {"texts": ["curve"]} and line["ylim"] == [0.0, 4.0]
    assert "xlim" not in line and "xticks" not in line  # automatic: the matplotlib version's choice
    assert [p["rectangle"] for p in bars["patches"]] == [[-0.4, 0.0, 0.8, 3.0], [0.6, 0.0, 0.8, 4.0]]
    assert bars["xticks"] == {"at": [0.0, 1.0], "labels": ["left", "right"]}
    (points,) = scatter["collections"]
    assert points["offsets"] == [[1.0, 3.0], [2.0, 4.0]] and points["sizes"] == [5.0, 6.0]
    assert points["values"] == [0.1, 0.2] and points["label"] is None  # matplotlib's "_child0" is no label
    assert scatter["texts"] == [{"text": "note", "at": [1.5, 3.5]}]
    (shown,) = image["images"]
    assert shown["values"]["shape"] == [3, 4] and (shown["values"]["min"], shown["values"]["max"]) == (0.0, 11.0)
    assert shown["cmap"] == "gray" and shown["clim"] == [0.0, 11.0]
    assert [a["panel"] for a in plotted_data(figure)["axes"]] == [[0, 0], [0, 1], [0, 2], [0, 3]]
    assert plotted_data(figure)["texts"] == ["four panels"]


def test_one_changed_value_changes_the_data_and_noise_below_the_rounding_does_not():
    def text(**kwargs):
        fig = tiny_figure(**kwargs)
        try:
            return plotted_json(fig)
        finally:
            plt.close(fig)

    base = text()
    assert text(y_middle=2.123456789 + 1e-12) == base  # float noise far below six significant digits
    assert text(y_middle=2.2) != base
    assert text(pixel=5.5) != base  # one pixel of the image


def test_the_data_do_not_depend_on_drawing_or_dpi(figure, tmp_path):
    before = plotted_json(figure)
    figure.savefig(tmp_path / "small.png", dpi=40)
    figure.savefig(tmp_path / "large.png", dpi=150)
    assert plotted_json(figure) == before
    assert (tmp_path / "small.png").read_bytes() != (tmp_path / "large.png").read_bytes()
    assert json.loads(before) == plotted_data(figure)  # JSON-able, and the file holds exactly that


def test_numbers_json_cannot_hold_and_labels_of_error_bars():
    fig, ax = plt.subplots()
    ax.plot([0.0, 1.0, 2.0], [float("nan"), -0.0, float("inf")], label="edge cases")
    ax.errorbar([1.0, 2.0], [3.0, 4.0], yerr=[0.5, 0.25], label="mean ± std")
    ax.fill_between([1.0, 2.0], [2.5, 3.75], [3.5, 4.25])
    data = plotted_data(fig)["axes"][0]
    plt.close(fig)
    edge = next(line for line in data["lines"] if line["label"] == "edge cases")
    assert edge["xy"] == [[0.0, None], [1.0, 0.0], [2.0, "inf"]]
    mean = [line["xy"] for line in data["lines"] if line["label"] == "mean ± std"]
    assert [[1.0, 3.0], [2.0, 4.0]] in mean  # the error bar's line takes its container's label
    bars, band = sorted(data["collections"], key=lambda c: c["label"] is None)
    assert bars["label"] == "mean ± std" and bars["paths"] == [[[1.0, 2.5], [1.0, 3.5]], [[2.0, 3.75], [2.0, 4.25]]]
    assert band["paths"] == [[[1.0, 2.5], [1.0, 3.5], [2.0, 3.75], [2.0, 4.25]]]  # distinct corners, sorted


def test_save_figure_writes_the_png_and_its_plotted_data(figure, tmp_path):
    text = plotted_json(figure)
    path = tmp_path / "out" / "panels.png"
    assert save_figure(figure, path, dpi=50) == path
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert plotted_path(path) == tmp_path / "out" / "panels.plotted.json"
    assert plotted_path(path).read_text(encoding="utf-8") == text
    assert sorted(p.name for p in path.parent.iterdir()) == ["panels.plotted.json", "panels.png"]  # no temporaries
    assert not plt.fignum_exists(figure.number)


def test_a_check_writes_the_plotted_data_and_leaves_the_png_undrawn(tmp_path, monkeypatch):
    """What alfa pages --check renders under (plotted_data_only): the same plotted data, an empty file where the
    PNG goes, and nothing drawn; outside it, the next figure is drawn again."""
    from matplotlib.figure import Figure

    from alfa.study.plotted import plotted_data_only

    drawn = []
    savefig = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda fig, *a, **k: (drawn.append(1), savefig(fig, *a, **k))[1])
    with plotted_data_only():
        fig = tiny_figure()
        text = plotted_json(fig)
        save_figure(fig, tmp_path / "checked.png", dpi=50)
    assert drawn == [] and (tmp_path / "checked.png").read_bytes() == b""
    assert plotted_path(tmp_path / "checked.png").read_text(encoding="utf-8") == text
    save_figure(tiny_figure(), tmp_path / "written.png", dpi=50)
    assert drawn == [1] and (tmp_path / "written.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_figure_that_cannot_be_drawn_fails_the_check_as_it_fails_a_save(tmp_path):
    """The check renders no pixels, but draws: a text that does not parse fails there too, not only when saved."""
    from alfa.study.plotted import plotted_data_only

    for checked in (True, False):
        fig = tiny_figure()
        fig.axes[0].set_title(r"$\frac{1}$")  # mathtext that does not parse: an error at draw time only
        with pytest.raises(ValueError), plotted_data_only() if checked else contextlib.nullcontext():
            save_figure(fig, tmp_path / f"bad-{checked}.png", dpi=50)
        assert not (tmp_path / f"bad-{checked}.png").exists()  # nothing left where the figure goes
