import json

import numpy as np
import pytest
import torch

from alfa.study.crate import coding_rate_step
from alfa.study.crate.toy import (
    DEFAULT_PANELS,
    U1,
    U2,
    ToyConfig,
    aggregate,
    draw_tokens,
    format_aggregate,
    format_run,
    run_panel,
    run_toy,
    write_json,
)

SEEDS = list(range(10))


@pytest.fixture(scope="module")
def runs():
    return run_toy(DEFAULT_PANELS, SEEDS)


def _parser():
    from alfa.cli import build_parser

    return build_parser()


def test_tokens_are_drawn_exactly_as_the_spec_says():
    Z, labels = draw_tokens(0)
    rng = np.random.default_rng(0)
    Z1 = U1[:, None] + 0.35 * rng.standard_normal((2, 20))
    Z2 = U2[:, None] + 0.35 * rng.standard_normal((2, 20))
    np.testing.assert_array_equal(Z, np.concatenate([Z1, Z2], axis=1))
    np.testing.assert_array_equal(labels, [0] * 20 + [1] * 20)
    assert np.degrees(np.arctan2(U1[1], U1[0])) == pytest.approx(30)
    assert np.degrees(np.arctan2(U2[1], U2[0])) == pytest.approx(120)


def test_same_seed_same_numbers_other_seed_other_numbers():
    for key in DEFAULT_PANELS:
        a, b = run_panel(key, 3), run_panel(key, 3)
        assert json.dumps(a.to_dict()) == json.dumps(b.to_dict())
        assert all(np.array_equal(x, y) for x, y in zip(a.tokens, b.tokens))
        assert a.to_dict()["layers"] != run_panel(key, 4).to_dict()["layers"]


def test_layer_one_of_panel_a_is_one_gradient_step_on_unit_tokens():
    run = run_panel("a", 0)
    Z, labels = draw_tokens(0)
    Z = torch.from_numpy(Z[:, labels == 0])
    Z = Z / Z.norm(dim=0)
    stepped = coding_rate_step(Z, 0.5, 1.0)
    np.testing.assert_allclose(run.tokens[1], (stepped / stepped.norm(dim=0)).numpy(), rtol=1e-12)
    first = run.layers[0]
    s = np.linalg.svd(run.tokens[0], compute_uv=False)
    assert first["thickness"] == [pytest.approx(s[1] / s[0]), None]
    assert first["Rc"] == pytest.approx(first["R"]) and first["dR"] == pytest.approx(0.0, abs=1e-12)


def test_json_has_the_promised_structure(runs, tmp_path):
    path = tmp_path / "toy.json"
    write_json(runs, path)
    data = json.loads(path.read_text())
    assert len(data) == len(DEFAULT_PANELS) * len(SEEDS)
    assert {(r["panel"], r["length"], r["kappa"]) for r in data} == {
        ("a", 1, 1.0),
        ("b", 1, 1.0),
        ("c", 3, 5.0),
        ("c", 1, 5.0),
        ("d", 3, 5.0),
    }
    for run in data:
        assert len(run["layers"]) == 7
        for layer in run["layers"]:
            assert set(layer) == {"thickness", "R", "Rc", "dR", "misassigned", "one_axis_share"}
            assert len(layer["thickness"]) == 2
            assert layer["dR"] == pytest.approx(layer["R"] - layer["Rc"])
        assert (run["layers"][0]["thickness"][1] is None) == (run["panel"] == "a")
        assert ("eta" in run) == (run["panel"] == "d")


def test_the_story_each_panel_tells(runs):
    agg = aggregate(runs)
    # (a) the gradient step thins the lone cluster, layer after layer
    thick = agg["a"]["thickness1"][0]
    assert np.all(np.diff(thick) < 0) and thick[-1] < 0.5 * thick[0]
    # (b) on the union of two orthogonal clusters it does almost nothing
    assert np.all(np.abs(agg["b"]["thickness1"][0] - agg["b"]["thickness1"][0][0]) < 0.02)
    # (c) at length 3 the softmax step thins clusters and keeps them apart ...
    assert agg["c"]["dR"][0][-1] > 2 * agg["c"]["dR"][0][0]
    assert agg["c"]["misassigned"][0][-1] <= agg["c"]["misassigned"][0][0]
    # ... at length 1 it merges everything onto one line: half the tokens end on the wrong side
    assert agg["c-len1"]["thickness1"][0][-1] < 1e-3 and agg["c-len1"]["misassigned"][0][-1] >= 15
    # (d) ISTA puts tokens onto the axes (with CRATE's η = λ = 0.1 only right after the first layer)
    assert agg["d"]["one_axis_share"][0][1] >= 0.4
    assert all(agg[k]["one_axis_share"][0].max() == 0 for k in ("a", "b", "c", "c-len1"))
    strong = aggregate(run_toy(["d"], SEEDS, ToyConfig(eta=1.0, lam=1.0)))["d"]
    assert strong["one_axis_share"][0][-1] >= 0.9


def test_tables_print_every_layer(runs):
    table = format_run(runs[0])
    assert table.splitlines()[0].startswith("(a)") and len(table.splitlines()) == 2 + 7
    agg = format_aggregate(runs)
    assert agg.count("mean [95 % interval] over 10 seeds") == len(DEFAULT_PANELS)


def test_cli_writes_json_record_and_figure(tmp_path, capsys):
    json_path, record_path, fig_path = tmp_path / "toy.json", tmp_path / "record.json", tmp_path / "toy.png"
    command = ["crate", "toy", "--seeds", "2", "--first-seed", "5", "--json", str(json_path)]
    command += ["--data-to", str(record_path), "--figure", str(fig_path)]
    args = _parser().parse_args(command)
    args.func(args)
    out = capsys.readouterr().out
    assert "mean [95 % interval] over 2 seeds" in out and "wrote 10 runs" in out
    assert [r["seed"] for r in json.loads(json_path.read_text())][:2] == [5, 6]
    assert fig_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "toy.plotted.json").is_file()  # the figure's plotted data, as the page check compares it
    record = json.loads(record_path.read_text())
    assert record["command"] == "alfa " + " ".join(command)
    assert record["seeds"] == [5, 6] and record["panels"] == list(DEFAULT_PANELS)
    assert [r["seed"] for r in record["runs"]] == [5, 6] * len(DEFAULT_PANELS)
    # the first seed of each panel carries the tokens the figure draws, the others do not
    assert [("tokens" in r) for r in record["runs"]] == [True, False] * len(DEFAULT_PANELS)


def test_cli_rejects_bad_input():
    parser = _parser()
    args = parser.parse_args(["crate", "toy", "--panels", "a,e"])
    with pytest.raises(ValueError, match="unknown panel"):
        args.func(args)
    with pytest.raises(ValueError, match=r"eps must be from 1e-06 to 1e\+06 \(the tokens have length 1 or 3"):
        ToyConfig(eps=0).validate()


def test_each_panel_table_ends_with_a_reading_of_it():
    from alfa.study.crate.toy import format_aggregate, run_toy

    blocks = format_aggregate(run_toy(["a", "b", "c-len1"], [0, 1])).split("\n\n")
    readings = [b.splitlines()[-1] for b in blocks]
    assert readings[0].startswith("Reading: over the layers the cluster is compressed")
    assert "barely change in thickness" in readings[1]  # (b): the gradient step on both clusters does ~nothing
    assert "merged (ΔR" in readings[2] and "misassigned tokens" in readings[2]


def test_cli_refuses_to_replace_the_plotted_data_beside_a_new_figure(tmp_path, capsys):
    from alfa.cli import main

    beside = tmp_path / "toy.plotted.json"
    beside.write_text("someone's", encoding="utf-8")
    assert main(["crate", "toy", "--seeds", "1", "--panels", "a", "--figure", str(tmp_path / "toy.png")]) == 2
    assert "the plotted data goes to" in capsys.readouterr().err and beside.read_text(encoding="utf-8") == "someone's"
    assert not (tmp_path / "toy.png").exists()
    assert (
        main(["crate", "toy", "--seeds", "1", "--panels", "a", "--figure", str(tmp_path / "toy.png"), "--replace"]) == 0
    )
    assert beside.read_text(encoding="utf-8") != "someone's"
    # a figure of a format the plot cannot write is refused before the runs, not after them
    capsys.readouterr()
    text = tmp_path / "other.txt"
    assert main(["crate", "toy", "--seeds", "1", "--json", str(tmp_path / "a.json"), "--figure", str(text)]) == 2
    assert capsys.readouterr().err.strip().endswith(f"--figure must name a .png file, got {text}")
    assert not text.exists() and not (tmp_path / "a.json").exists()


@pytest.mark.parametrize(
    "outputs, words",
    [
        (["--data-to", "toy.plotted.json", "--figure", "toy.png"], "which is also this command's --data-to"),
        (["--figure", "toy.png", "--json", "toy.plotted.json"], "which is also this command's --json"),
        (["--figure", "toy.png", "--data-to", "toy.plotted.json"], "which is also this command's --data-to"),
        (["--json", "toy.json", "--data-to", "toy.json"], "is also this command's --json"),
    ],
)
def test_cli_refuses_two_outputs_on_one_path_even_with_replace(tmp_path, capsys, outputs, words):
    """A figure's plotted data is written beside it: with --replace too, no other output may be that file (the
    second write would replace the first)."""
    from alfa.cli import main

    args = [a if a.startswith("--") else str(tmp_path / a) for a in outputs]
    assert main(["crate", "toy", "--seeds", "1", "--panels", "a", *args, "--replace"]) == 2
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


def test_one_seed_is_read_as_one_seed_with_no_interval():
    """One seed printed "mean [95 % interval] over 1 seeds" and "the thickness over the 1 seeds is … in every
    seed"."""
    text = format_aggregate(run_toy(["a", "c-len1"], [0], ToyConfig(layers=6)))
    assert text.splitlines()[0].endswith("; one seed (no interval)")
    assert "From layer 4 on both clusters are flat" in text and "From layer 3 on, exactly 20 of 40 tokens" in text
    assert "1 seeds" not in text and "every seed" not in text


def _exit_code(argv: list[str]) -> int:
    """``alfa ARGV``'s exit status, also where argparse refuses an option (it exits)."""
    from alfa.cli import main

    try:
        return main(argv)
    except SystemExit as stop:
        return stop.code


@pytest.mark.parametrize("eps", ["1e200", "1e308", "1e-200", "1e-320", "inf", "nan", "0", "-1"])
def test_cli_refuses_an_eps_outside_its_range_in_one_line(eps, capsys):
    """1e200 ended in an OverflowError traceback, 1e-200 in a ZeroDivisionError, inf printed zeros."""
    assert _exit_code(["crate", "toy", "--seeds", "1", "--panels", "a", "--eps", eps]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and len(captured.err.strip().splitlines()) == 1
    assert "argument --eps: must be from 1e-06 to 1e+06 (the tokens have length 1 or 3: far outside" in captured.err
    assert captured.err.strip().endswith(f"got {eps} (see alfa crate toy --help)")


def test_the_ends_of_the_eps_range_compute_finite_numbers():
    for eps in (1e-6, 1e6):
        for run in run_toy(["a", "c", "d"], [0], ToyConfig(eps=eps)):
            assert all(np.isfinite([s["R"], s["Rc"], s["thickness"][0]]).all() for s in run.layers)
    with pytest.raises(ValueError, match="eps must be from"):
        run_toy(["a"], [0], ToyConfig(eps=1e200))  # the library's own check, before any step overflows


def test_eta_is_computed_in_float64_and_any_finite_step_runs(capsys):
    """--eta 1e308 was refused as "(the weights are float32)": the toy has no float32 weights."""
    from alfa.cli import main

    assert main(["crate", "toy", "--seeds", "1", "--panels", "d", "--eta", "1e308", "--quiet"]) == 0
    captured = capsys.readouterr()
    assert captured.err == "" and "η = 1e+308" in captured.out and "nan" not in captured.out
    assert "every token of every seed" not in captured.out  # a threshold of 1e307 zeroes every token: no axis left
    assert _exit_code(["crate", "toy", "--seeds", "1", "--panels", "d", "--eta", "0"]) == 2
    assert "argument --eta: must be above 0, got 0" in capsys.readouterr().err


def test_layers_are_bounded_and_a_run_shows_its_progress_unless_quiet(capsys):
    """--layers 100000000 ran silently for hours; --seeds 400 ran 21 s with nothing on stderr."""
    from alfa.cli import main
    from alfa.study.crate.toy import MAX_LAYERS

    assert _exit_code(["crate", "toy", "--layers", "100000000"]) == 2
    assert f"argument --layers: must be at most {MAX_LAYERS}" in capsys.readouterr().err
    with pytest.raises(ValueError, match=f"need 1 to {MAX_LAYERS} layers"):
        ToyConfig(layers=MAX_LAYERS + 1).validate()
    assert main(["crate", "toy", "--seeds", "2", "--panels", "a,b"]) == 0
    assert "crate toy:" in capsys.readouterr().err  # the bar over the 4 runs
    assert main(["crate", "toy", "--seeds", "2", "--panels", "a,b", "--quiet"]) == 0
    assert capsys.readouterr().err == ""


def test_cli_refuses_a_seed_count_beyond_its_bound_in_one_line(capsys):
    # --seeds had no bound: a mistyped count ran for hours, holding every run for the tables
    assert _exit_code(["crate", "toy", "--seeds", "100000", "--panels", "a"]) == 2
    err = capsys.readouterr().err
    assert "--seeds: must be at most 10000" in err and err.count("\n") == 1
