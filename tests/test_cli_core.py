import argparse
import json
import re

import pytest
from tiny_models import truncated_structure

from alfa.cli import main
from alfa.study.bench.speed import measure, to_markdown
from alfa.study.example import run_example


@pytest.mark.slow
def test_summary_command(capsys):
    assert main(["summary", "--rank", "64"]) == 0
    out = capsys.readouterr().out
    assert "11.178 M" in out and "2.285 M" in out and "left dense: conv1" in out
    assert not [line for line in out.splitlines() if line.endswith(" ")]  # print(x, "\n") left a space at the end


def _structure_only(monkeypatch, module):
    """``module``'s truncate makes the structure with random factors, no SVD: what its test asserts depends on the
    truncated structure, not on the factors' values (fourteen float64 SVDs of ResNet-18, seconds; truncate's own
    tests check them)."""
    import functools

    import alfa

    monkeypatch.setattr(f"{module}.truncate", functools.partial(alfa.truncate, weights=False))


@pytest.mark.slow
def test_example_runs_and_merges_exactly(capsys, monkeypatch):
    _structure_only(monkeypatch, "alfa.study.example")
    result = run_example(rank=16, steps=3, image_size=32, batch=2)
    assert result["merged_params"] == result["truncated_params"] < result["dense_params"]
    assert result["merge_rel_diff"] < 1e-5
    assert result["losses"][-1] < result["losses"][0]
    out = capsys.readouterr().out
    assert "reloads onto the shared base: identical" in out
    assert not [line for line in out.splitlines() if line.endswith(" ")]
    # timings a user sees come with their spread: interleaved rounds, the ratio's quartiles
    r = result["merged_over_truncated"]
    assert r["rounds"] == 15 and r["q1"] <= r["median"] <= r["q3"] and "middle half" in out


@pytest.mark.slow
def test_speed_measurement_is_consistent(monkeypatch):
    _structure_only(monkeypatch, "alfa.study.bench.speed")
    r = measure(repeats=1, image_size=32, memory=False)
    assert r["params"]["merged alfa"] == r["params"]["truncated"] < r["params"]["dense"]
    assert r["params"]["trainable (head only)"] == 512 * 2 + 2
    assert set(r["step_seconds"]) == {"head only", "alfa", "full fine-tune"}
    text = to_markdown(r, "alfa speed")
    assert "| merged alfa | 2,285,122 |" in text and "`alfa speed`" in text
    # when and how busy: a timing without them could be of any machine, any day
    start, end = r["load_average"]
    assert f" threads, on {r['date']} (1-minute load average {start:.1f} as it started and {end:.1f} at its end" in text
    earlier = {k: v for k, v in r.items() if k not in ("date", "load_average", "cpus")}
    assert " threads (a record that keeps no date or load average); " in to_markdown(earlier, "alfa speed")
    r["memory_mb"], r["memory_of"] = {"alfa": {"model ready": 250.0, "peak": 400.0}}, "loaded checkpoints"
    assert "| alfa | — | — | 250 | 400 | 150 |" in to_markdown(r, "alfa speed")  # a record of no "loaded" reading
    r["memory_mb"] = {
        "alfa": {"loaded": 200.0, "model ready": 250.0, "peak": 400.0},
        "truncated inference": {"loaded": 190.0, "model ready": 190.0, "peak": 300.0},
    }
    text = to_markdown(r, "alfa speed")
    assert (
        "| alfa | 200 | 50 | 250 | 400 | 150 |" in text
        and "| truncated inference | 190 | — | 190 | 300 | 110 |" in text
    )
    assert "that loads the model from its checkpoint, as a deployment does" in to_markdown(r, "alfa speed")
    del r["memory_of"]  # an earlier record's processes truncated the model themselves: said so
    assert "that builds the model (truncating it itself: the truncated rows include" in to_markdown(r, "alfa speed")


def test_speeds_memory_child_reads_the_loaded_model_before_it_sets_up_training(monkeypatch):
    """*Setting up training* (a step's model copy and optimizer) is the difference of two readings, one after the
    checkpoint is loaded and one after the setup: read the other way round, it would be zero or negative."""
    import torch

    import alfa.study.bench.speed as speed

    events, resident = [], iter([100 * 1024, 180 * 1024, 400 * 1024])

    def reading(field):
        events.append(field)
        return next(resident)

    def setup(name, base):
        events.append("setup")
        return base, torch.optim.SGD(base.parameters(), lr=0.0)

    monkeypatch.setattr(speed, "_rss_kib", reading)
    monkeypatch.setattr(speed, "load_model", lambda *a, **k: (torch.nn.Conv2d(3, 2, 3), {}))
    monkeypatch.setattr(speed, "_step_model", setup)
    monkeypatch.setattr(speed, "_one_step", lambda *a: events.append("step"))
    got = json.loads(speed._child_steps("alfa", 8, "m.safetensors"))
    assert events == ["VmRSS", "setup", "VmRSS", "step", "step", "step", "VmHWM"]
    assert got == {"loaded": 100.0, "model ready": 180.0, "peak": 400.0}


@pytest.mark.slow
def test_speeds_memory_rows_load_the_model_as_a_deployment_does(monkeypatch):
    """A process that built and truncated the model itself kept more resident after it: the truncated rows'
    resident memory was above the dense model's (336 MB against 276 MB). Each row's process now loads a
    checkpoint: the dense one for dense inference, the truncated one for the rest."""
    import copy

    import alfa
    import alfa.study.bench.speed as speed
    from alfa.checkpoint import load_model

    dense = alfa.models.resnet18_gaze().eval()
    truncated = copy.deepcopy(dense)
    alfa.truncate(truncated, 64, weights=False)
    loaded = {}

    def in_this_process(setup, image_size, checkpoint):
        model, _ = load_model(checkpoint)
        loaded[setup] = alfa.parameter_summary(model).total
        return {"model ready": 1.0, "peak": 2.0}

    monkeypatch.setattr(speed, "_memory_mb", in_this_process)
    rows = speed._memory_rows(dense, truncated, 32)
    assert set(rows) == {"head only", "alfa", "full fine-tune", "truncated inference", "dense inference"}
    assert loaded.pop("dense inference") == alfa.parameter_summary(dense).total == 11_177_538
    assert set(loaded.values()) == {alfa.parameter_summary(truncated).total}


def test_cli_reports_bad_input_without_traceback(capsys):
    assert main(["summary", "--model", "nope"]) == 2
    err = capsys.readouterr().err
    assert "unknown model 'nope'; known: " in err and "crate_base, crate_large," in err and "['" not in err  # words
    with pytest.raises(SystemExit) as e:
        main(["no-such-command"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "invalid choice: 'no-such-command'" in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["costs", "--rank", "0"], "--rank must be at least 1, got 0"),
        (["costs", "--rank", "-3"], "--rank must be at least 1, got -3"),
        (["costs", "--model", "nosuch"], "unknown model 'nosuch'"),
        (["costs", "--repeats", "0"], "--repeats must be at least 1"),
    ],
)
def test_bad_options_get_one_line_and_exit_2(argv, message, capsys):
    """Every command goes through the CLI's handler (``alfa costs`` included): one line naming the culprit, no
    traceback, before any work."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("shortened", [["--ou", "elsewhere"], ["--cache", "c"], ["--rep", "r.md"], ["--ou=elsewhere"]])
def test_an_option_is_written_whole(shortened, capsys):
    """argparse reads an option's beginning as the option by default (``--ou`` as ``--out``): alfa refuses it, so
    that a command gaining an option never changes what a script's line means, and scripts/queue.sh's refusal of a
    lane line naming --out, --cache-dir or --report sees every way of naming them."""
    assert main(["bench", "--dry-run", *shortened]) == 2
    err = capsys.readouterr().err
    assert f"unrecognized arguments: {' '.join(shortened)}" in err
    assert len(err.strip().splitlines()) == 1


def test_every_parser_of_alfa_takes_its_options_written_whole():
    """Not only bench's: every command's and subcommand's parser, as build_parser makes them."""
    from alfa.cli import build_parser

    def parsers(parser):
        yield parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    yield from parsers(sub)

    found = list(parsers(build_parser()))
    assert len(found) > 25 and [p.prog for p in found if p.allow_abbrev] == []


def test_main_is_the_only_place_that_reports_an_error():
    """No command module catches its own errors and exits: one boundary, in ``alfa.cli.main``."""
    import ast
    from pathlib import Path

    import alfa

    src = Path(alfa.__file__).parent
    boundary = src / "cli" / "__init__.py"
    for path in sorted(src.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        assert path == boundary or ": error: " not in text, path
        calls = {
            f"{n.func.value.id}.{n.func.attr}"
            for n in ast.walk(ast.parse(text))
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and isinstance(n.func.value, ast.Name)
        }
        assert "sys.exit" not in calls or path.name == "__main__.py", path


def _saved_base(folder, input_size=None):
    import alfa

    # no refusal depends on the weights: the truncated structure without its SVDs will do
    model = truncated_structure(alfa.models.create_model("resnet18_gaze"), 8)
    return alfa.checkpoint.save_model(folder / "base.safetensors", model, "resnet18_gaze", input_size=input_size)


@pytest.mark.slow
def test_bad_input_gets_one_line_exit_2_and_nothing_written(tmp_path, capsys):
    """A file that is not what it should be, an option value that is wrong, a port already taken (an
    ``OSError``): one line naming the problem, exit status 2, no traceback, nothing written."""
    import os
    import socket

    not_a_model = tmp_path / "notes.safetensors"
    not_a_model.write_text("not a checkpoint")
    base = _saved_base(tmp_path, input_size=(32, 32))
    (tmp_path / "adapters").mkdir()
    fifo = tmp_path / "model-pipe"
    os.mkfifo(fifo)
    out = tmp_path / "out"
    cases = {
        "not a readable safetensors file": [
            *("personalize", "--checkpoint", str(not_a_model), "--data", "synthetic:mpii"),
            *("--out", str(out)),
        ],
        "is a folder, not a checkpoint file": [
            *("evaluate", "--checkpoint", str(tmp_path / "adapters"), "--data", "synthetic:mpii"),
            *("--json", str(out / "e.json")),
        ],
        "is not a regular file (a device, pipe or socket): name a checkpoint file": [
            *("evaluate", "--checkpoint", str(fifo), "--data", "synthetic:mpii"),
            *("--json", str(out / "e.json")),
        ],
        "LoraConfig.rank must be an integer, got 'abc'": [
            *("personalize", "--checkpoint", str(base), "--data", "synthetic:mpii", "--method", "lora"),
            *("--option", "rank=abc", "--out", str(out)),
        ],
    }
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cases["Address already in use"] = [
            *("serve", "--checkpoint", str(base), "--adapters", str(tmp_path / "adapters")),
            *("--port", str(port)),
        ]
        for message, argv in cases.items():
            assert main(argv) == 2, argv
            captured = capsys.readouterr()
            assert message in captured.err and "Traceback" not in captured.err, captured.err
            assert len(captured.err.strip().splitlines()) == 1, captured.err
            assert captured.err.startswith(f"alfa {argv[0]}: error: ")
            assert not out.exists()
    with pytest.raises(SystemExit) as e:  # a value the parser refuses: argparse's usage line and its error
        main(["serve", "--checkpoint", str(base), "--adapters", str(tmp_path / "adapters"), "--port", "99999"])
    assert e.value.code == 2 and "expected a port number from 0 to 65535" in capsys.readouterr().err


def test_a_missing_optional_package_is_one_line_naming_its_extra(capsys, monkeypatch):
    """A command that needs a package of an extra says which one to install, instead of a traceback; a missing
    module that no extra provides is a bug and keeps its traceback."""
    import argparse

    from alfa.cli import registry

    def needs_kornia(args):
        raise ModuleNotFoundError("No module named 'kornia'", name="kornia")

    def needs_nothing_known(args):
        raise ModuleNotFoundError("No module named 'alfa.gone'", name="alfa.gone")

    parser = argparse.ArgumentParser(prog="alfa")
    commands = (
        registry.Command("k", help="k", run=needs_kornia, extra="study"),
        registry.Command("g", help="g", run=needs_nothing_known, extra="gaze"),
    )
    registry.add_commands(parser.add_subparsers(dest="command", required=True), commands)
    monkeypatch.setattr("alfa.cli.build_parser", lambda argv=None: parser)
    assert main(["k"]) == 2
    err = capsys.readouterr().err
    want = "alfa k: error: this command needs kornia, which is not installed: install alfa's study extra "
    assert err == want + '(in the alfa folder: pip install -e ".[study]", or ./scripts/setup.sh dev)\n'
    with pytest.raises(ModuleNotFoundError, match="alfa.gone"):
        main(["g"])


@pytest.mark.parametrize(
    "declare, said",
    [
        (lambda p: p.add_argument("-o", "--out"), "declared as ['-o', '--out']"),
        (lambda p: p.add_argument("--out-dir", dest="out"), "declared as no option"),
        (lambda p: p.add_argument("--out", dest="folder"), "declared as ['--out']"),
        (lambda p: None, "declared as no option"),
        (None, "declared as no option"),
        (lambda p: p.add_argument("--out"), None),
    ],
)
def test_an_output_must_be_the_option_of_its_name_alone(declare, said):
    """Messages name an output ``--<dest>``, and main tells the outputs a command line gave from their defaults by
    those words: an output spelled otherwise (a short flag, another name) would be misnamed, so it is refused as
    the parser is built, by the test that builds every command."""
    from alfa.cli import registry

    command = registry.Command("w", help="w", run=print, add_arguments=declare, outputs={"out": True})
    subparsers = argparse.ArgumentParser(prog="alfa").add_subparsers(dest="command")
    if said is None:
        registry.add_commands(subparsers, (command,))
        return
    with pytest.raises(TypeError, match=re.escape(f"alfa w: its output 'out' must be the option --out alone, {said}")):
        registry.add_commands(subparsers, (command,))


def test_version_and_help(capsys):
    import alfa

    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"alfa {alfa.__version__}"
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "``" not in out and "costs" in out  # plain words, every command listed
    with pytest.raises(SystemExit):
        main(["costs", "--help"])
    assert "(default 64)" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["personalize", "--help"])
    out = capsys.readouterr().out
    assert all(m in out for m in ("alfa,", "lora,", "dora,"))  # the methods, listed


def test_unwritable_outputs_are_refused_before_any_work(tmp_path, capsys, monkeypatch):
    """A path under a file, a folder where a file goes, a read-only folder: refused with one line before the
    command starts (it would otherwise fail after the work, or with a traceback)."""
    import os

    import alfa.study.bench.costs as costs
    from alfa.fileio import check_writable

    monkeypatch.setattr(costs, "report_costs", lambda **_: pytest.fail("measured before checking the outputs"))
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    cases = {
        (
            "costs",
            "--json",
            str(a_file / "rows.json"),
        ): f"--json {a_file / 'rows.json'} cannot be written: {a_file} is a file",
        ("costs", "--json", str(tmp_path)): "is a folder, not a file",
        ("personalize", "--checkpoint", "x", "--data", "y", "--out", str(a_file)): "is a file, not a folder",
        ("evaluate", "--checkpoint", "x", "--data", "y", "--json", str(tmp_path)): "is a folder, not a file",
    }
    for argv, message in cases.items():
        assert main(list(argv)) == 2, argv
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err
    if os.geteuid() != 0:  # root may write anywhere
        locked = tmp_path / "locked"
        locked.mkdir()
        locked.chmod(0o500)
        try:
            with pytest.raises(ValueError, match="no permission to write"):
                check_writable(locked / "deeper" / "out.json")
        finally:
            locked.chmod(0o700)
    assert check_writable(tmp_path / "new" / "deeper", folder=True) == tmp_path / "new" / "deeper"
    assert not (tmp_path / "new").exists()  # checking creates nothing
    # a read-only mount was said as "no permission", which sends the user to chmod
    import types

    monkeypatch.setattr(os, "access", lambda *a, **k: False)
    monkeypatch.setattr(os, "statvfs", lambda p: types.SimpleNamespace(f_flag=os.ST_RDONLY))
    with pytest.raises(ValueError, match=f"out.json cannot be written: {re.escape(str(tmp_path))} is on a read-only f"):
        check_writable(tmp_path / "out.json")


def test_every_option_of_every_command_has_help():
    import argparse

    from alfa.cli import build_parser

    def undocumented(parser, path):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield from undocumented(sub, [*path, name])
            elif action.option_strings and not action.help and action.dest != "help":
                yield f"alfa {' '.join(path)} {action.option_strings[0]}"

    assert list(undocumented(build_parser(), [])) == []


@pytest.mark.parametrize(
    "command, message",
    [
        (["export", "--checkpoint", "{ckpt}", "--out", "{ckpt}"], "--out {ckpt} is this command's --checkpoint"),
        (
            ["export", "--checkpoint", "{ckpt}", "--adapter", "{adapter}", "--out", "{adapter}"],
            "is this command's --adapter",
        ),
        (
            ["truncate", "--checkpoint", "{ckpt}", "--data", "synthetic:eth", "--out", "{folder}"],
            "holds this command's --checkpoint",
        ),
        (
            ["personalize", "--checkpoint", "{ckpt}", "--data", "synthetic:mpii", "--out", "{folder}"],
            "holds this command's --checkpoint",
        ),
    ],
)
def test_an_input_is_never_an_output_nor_inside_an_output_folder(tmp_path, capsys, command, message):
    folder = tmp_path / "run"
    folder.mkdir()
    ckpt, adapter = folder / "model.safetensors", folder / "user.safetensors"
    ckpt.write_bytes(b"the checkpoint")
    adapter.write_bytes(b"an adapter")
    names = {"ckpt": str(ckpt), "adapter": str(adapter), "folder": str(folder)}
    assert main([part.format(**names) for part in command]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message.format(**names) in err and "Traceback" not in err
    assert ckpt.read_bytes() == b"the checkpoint" and adapter.read_bytes() == b"an adapter"
    assert sorted(p.name for p in folder.iterdir()) == ["model.safetensors", "user.safetensors"]


def test_an_output_beside_its_inputs_is_allowed(tmp_path):
    import argparse

    from alfa.cli import _refuse_inputs_as_outputs

    folder = tmp_path / "adapters"
    args = argparse.Namespace(
        adapters=str(folder), checkpoint=str(tmp_path / "model.safetensors"), json=str(tmp_path / "report.json")
    )
    args.outputs = {"json": False}
    _refuse_inputs_as_outputs(args)  # nothing raised: a new file next to the inputs replaces none of them
    args.outputs, args.out = {"out": True}, str(tmp_path / "elsewhere")
    _refuse_inputs_as_outputs(args)


@pytest.mark.parametrize(
    "command, message",
    [
        (["pretrain", "--data", "x", "--lr", "inf"], "argument --lr: must be a finite number, got inf"),
        (["pretrain", "--data", "x", "--lr", "0"], "argument --lr: must be above 0, got 0"),
        (["pretrain", "--data", "x", "--batch-size", "1"], "must be at least 2 (BatchNorm trains on the batch)"),
        (["pretrain", "--data", "x", "--workers", "100000"], "argument --workers: at most the "),
        (["personalize", "--checkpoint", "c", "--data", "x", "--n-adapt", "-1"], "--n-adapt: must be at least 1"),
        (["personalize", "--checkpoint", "c", "--data", "x", "--adapter-rank", "0"], "--adapter-rank: must be at"),
        (["personalize", "--checkpoint", "c", "--data", "x", "--pitch-anchor", "-1"], "--pitch-anchor: must be at"),
        (["evaluate", "--checkpoint", "c", "--data", "x", "--n-adapt", "-1"], "--n-adapt: must be at least 0"),
        (["tpgaze", "meta-train", "--checkpoint", "c", "--data", "x", "--outer-lr", "nan"], "--outer-lr: must be a"),
        (["pretrain", "--data", "x", "--seed", str(2**70)], "argument --seed: must be at most 9223372036854775807"),
        (["pretrain", "--data", "x", "--seed", "-1"], "argument --seed: must be at least 0, got -1"),
    ],
)
def test_numeric_options_are_bounded_at_the_option(capsys, command, message):
    with pytest.raises(SystemExit) as exit_:
        main(command)
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_evaluate_leaves_out_the_images_the_adapters_were_made_from(tmp_path, capsys):
    import argparse
    import json

    from alfa.cli.guards import adaptation_count as _adaptation_count

    adapters = tmp_path / "adapters"
    adapters.mkdir()
    (adapters / "personalization.json").write_text(json.dumps({"config": {"n_adapt": 3}}))

    def count(folder, n_adapt=None):
        return _adaptation_count(argparse.Namespace(adapters=folder, n_adapt=n_adapt))

    assert count(str(adapters)) == 3 and count(str(adapters), 3) == 3  # the record's count
    assert count(None) == 5 and count(None, 0) == 0  # no adapters: the option, else the recipe's default
    with pytest.raises(ValueError, match="were made from the first 3 images of each person"):
        count(str(adapters), 5)
    (tmp_path / "model.safetensors").write_bytes(b"x")
    argv = ["evaluate", "--checkpoint", str(tmp_path / "model.safetensors"), "--data", "synthetic:mpii"]
    assert main([*argv, "--adapters", str(adapters), "--n-adapt", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--n-adapt 0: the adapters in" in err
    (adapters / "personalization.json").write_text("{not json")
    with pytest.raises(ValueError, match="not a personalization record"):
        count(str(adapters))


# What two tests check in one new interpreter (a start costs seconds of imports): the modules that declaring every
# option loads, then deterministic kernels, which must not load TorchInductor (nor must the options), then load it.
FRESH_PROCESS = """
import contextlib, io, sys
import torch
from alfa.cli import build_parser, main

for argv in (["--help"], ["serve", "--help"]):
    with contextlib.redirect_stdout(io.StringIO()) as shown, contextlib.suppress(SystemExit):
        main(argv)
    print("shown:", argv, "usage: alfa" in shown.getvalue())
build_parser()  # every command's options declared, as main declares one command's
print("loaded:", sorted(m for m in ("kornia", "matplotlib", "onnx", "onnxruntime") if m in sys.modules))

from alfa.cli.options import deterministic_kernels
print("inductor loaded:", "torch._inductor" in sys.modules)
assert not torch.are_deterministic_algorithms_enabled()
deterministic_kernels()
assert torch.are_deterministic_algorithms_enabled()
assert torch.is_deterministic_algorithms_warn_only_enabled()
print("inductor loaded:", "torch._inductor" in sys.modules)
import torch._inductor.config as inductor
torch.use_deterministic_algorithms(False)
deterministic_kernels()
print("inductor flag:", inductor.deterministic, torch.are_deterministic_algorithms_enabled())
import os
print("wait policy:", os.environ.get("OMP_WAIT_POLICY"))
"""


@pytest.fixture(scope="module")
def fresh_process() -> tuple[int, list[str], str]:
    """``FRESH_PROCESS`` run: its exit status, its lines and its stderr."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    src = Path(__file__).resolve().parent.parent / "src"
    done = subprocess.run(
        [sys.executable, "-c", FRESH_PROCESS],
        capture_output=True,
        text=True,
        timeout=300,
        # without the suite's wait policy (conftest.py): this process imports torch before alfa
        env={**{k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}, "PYTHONPATH": str(src)},
    )
    return done.returncode, done.stdout.splitlines(), done.stderr[-3000:]


@pytest.mark.slow
def test_help_imports_no_heavy_package(fresh_process):
    """``alfa --help``, ``alfa serve --help`` and the whole parser, every command's options declared: declaring
    them must not import kornia, matplotlib or onnx (kornia alone was a fifth of a second of every start); only
    running a command that needs one does."""
    _, lines, err = fresh_process
    assert lines[:3] == ["shown: ['--help'] True", "shown: ['serve', '--help'] True", "loaded: []"], err


def test_deterministic_kernels_switch_torch_on_without_loading_torchinductor(fresh_process):
    """Every training or scoring command asks for deterministic kernels (warnings where there are none); it must
    not import TorchInductor for it (seconds of every command's start), and where TorchInductor is already
    loaded its flag is set too."""
    code, lines, err = fresh_process
    assert code == 0, err
    assert lines[3:6] == ["inductor loaded: False", "inductor loaded: False", "inductor flag: True True"]


def test_alfa_asks_openmp_to_wait_passively_where_nothing_chose_before_torch_loaded(fresh_process):
    """OpenMP's spinning threads made a training step about 4× as slow on the 2-core machine when other processes ran
    beside it (docs/gaze.md § OpenMP's waits). Importing alfa before torch asks for passive waits; a process that
    imported torch first, or chose a policy, keeps its own (OpenMP has read it already, or it is the user's)."""
    import alfa

    environ: dict[str, str] = {}
    alfa._wait_passively({}, environ)
    assert environ == {"OMP_WAIT_POLICY": "PASSIVE"}
    chosen = {"OMP_WAIT_POLICY": "ACTIVE"}
    alfa._wait_passively({}, chosen)
    assert chosen == {"OMP_WAIT_POLICY": "ACTIVE"}
    alfa._wait_passively({"torch": object()}, environ := {})
    assert environ == {}
    assert fresh_process[1][6:] == ["wait policy: None"], fresh_process[2]  # torch first: left as it was


def test_the_quiet_exporter_hides_the_exporters_notices_only(capsys, monkeypatch):
    import logging
    import sys
    import warnings

    from alfa.cli.library import quiet_exporter

    def say():
        warnings.warn_explicit("deprecated", FutureWarning, "copyreg.py", 1, module="copyreg")
        warnings.warn_explicit("exporter note", UserWarning, "x.py", 1, module="torch.onnx._internal.exporter")
        warnings.warn_explicit("ours", UserWarning, "x.py", 1, module="alfa.export")
        logging.getLogger("torch.onnx._internal.exporter._registration").warning("torchvision is not installed")
        logging.getLogger("torch.onnx._internal.exporter._registration").error("a real error")
        print("printed", file=sys.stderr)

    monkeypatch.setattr(sys, "warnoptions", [])  # as when Python runs without -W
    logged = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: logged.append(record.getMessage())
    logging.getLogger("torch.onnx").addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as warned:
            warnings.simplefilter("always")
            filters, level = list(warnings.filters), logging.getLogger("torch").level
            with quiet_exporter():
                say()
            # a warning no filter names, an error logged, and what was printed are still shown
            assert [str(w.message) for w in warned] == ["ours"] and logged == ["a real error"]
            assert capsys.readouterr().err == "printed\n"
            assert warnings.filters == filters and logging.getLogger("torch").level == level
            with pytest.raises(RuntimeError, match="failed"), quiet_exporter():
                print("partial graph", file=sys.stderr)
                raise RuntimeError("failed")
            assert capsys.readouterr().err == ""  # a failure is main's one line, without the exporter's dump
            warned.clear()
            logged.clear()
            with quiet_exporter(show=True):
                say()
            assert [str(w.message) for w in warned] == ["deprecated", "exporter note", "ours"]
            assert logged == ["torchvision is not installed", "a real error"]
    finally:
        logging.getLogger("torch.onnx").removeHandler(handler)


def test_a_ctrl_c_while_the_command_imports_is_one_line(monkeypatch, capsys):
    import builtins

    import alfa_command

    real_import = builtins.__import__

    def interrupted(name, *args, **kwargs):
        if name == "alfa.cli":
            raise KeyboardInterrupt
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", interrupted)
    assert alfa_command.main() == 130
    assert capsys.readouterr().err == "interrupted\n"
    monkeypatch.setattr(builtins, "__import__", real_import)
    monkeypatch.setattr("sys.argv", ["alfa", "--help"])
    with pytest.raises(SystemExit) as done:  # otherwise it is the command itself
        alfa_command.main()
    assert done.value.code == 0 and "usage: alfa" in capsys.readouterr().out


@pytest.mark.parametrize("module", ["alfa.adapters", "alfa.cli"])  # the package's own imports, then __main__'s
def test_a_ctrl_c_while_python_m_alfa_imports_is_one_line(module, tmp_path):
    import os
    import subprocess
    import sys

    # sitecustomize runs before `-m alfa` locates the package: it makes the chosen import raise as a Ctrl-C would.
    (tmp_path / "sitecustomize.py").write_text(
        "import builtins\n"
        "real_import = builtins.__import__\n"
        "def interrupted(name, globals=None, locals=None, fromlist=(), level=0):\n"
        f"    if (name if not level else globals['__package__'] + '.' + name) == {module!r}:\n"
        "        raise KeyboardInterrupt\n"
        "    return real_import(name, globals, locals, fromlist, level)\n"
        "builtins.__import__ = interrupted\n"
    )
    paths = [str(tmp_path), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    done = subprocess.run([sys.executable, "-m", "alfa", "--help"], capture_output=True, text=True, env=env)
    assert (done.returncode, done.stderr, done.stdout) == (130, "interrupted\n", "")


def test_under_torchrun_only_the_training_commands_run(monkeypatch, capsys, tmp_path):
    """Each of torchrun's processes would run a whole personalization or export, into the same files."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    argv = ["calibrate", "--checkpoint", "x", "--data", "synthetic:mpii", "--k", "9", "--out", str(tmp_path / "c")]
    said = "only alfa pretrain and alfa truncate run as one job of several processes (WORLD_SIZE=2"
    for launcher, rank, lines in (("torchrun", "0", 1), ("torchrun", "1", 0), ("other", "1", 1)):
        if launcher == "torchrun":  # one line, from the first process; another launcher's ranks each say it
            monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job")
        else:
            monkeypatch.delenv("TORCHELASTIC_RUN_ID")
        monkeypatch.setenv("RANK", rank)
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == lines and (said in err) == (lines == 1) and not (tmp_path / "c").exists()
    monkeypatch.setenv("RANK", "0")
    assert main(["pretrain", "--data", "nowhere:x", "--out", str(tmp_path / "p")]) == 2  # past the check
    assert "torchrun" not in capsys.readouterr().err
    for world in ("1", ""):  # one process; an empty setting is none (it was a traceback)
        monkeypatch.setenv("WORLD_SIZE", world)
        assert main(["summary", "--model", "no-such-model"]) == 2
        assert "torchrun" not in capsys.readouterr().err


def test_pretrain_refuses_a_model_that_does_not_predict_gaze_before_it_trains(tmp_path, capsys):
    """vit_tiny (1,000 classes, 224-pixel patches) failed after the data loaded, in the loss."""
    data = "synthetic:mpii?size=32&persons=3&images_per_person=8"
    assert main(["pretrain", "--model", "vit_tiny", "--data", data, "--out", str(tmp_path / "p"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("alfa pretrain: error: --model vit_tiny is not a gaze model for these images (it cannot")
    assert err.count("\n") == 1 and not (tmp_path / "p").exists()


@pytest.mark.parametrize(
    "command, message",
    [
        (["bench", "--dry-run", "--pairs", ","], "--pairs ',' names no pair"),
        (["bench", "--dry-run", "--methods", ""], "--methods '' names no method"),
        (
            ["tpgaze", "personalize", "--checkpoint", "c", "--data", "x", "--meta", "p", "--no-meta"],
            "pass --meta PROMPTS (from `alfa tpgaze meta-train`) or --no-meta to start from Gaussian prompts, not both",
        ),
    ],
)
def test_options_that_would_be_ignored_or_run_nothing_are_refused(tmp_path, monkeypatch, capsys, command, message):
    """`bench --pairs ,` ran no record and exited 0 (`--methods ,` ran only the ablations); `tpgaze personalize
    --meta P --no-meta` ignored --no-meta."""
    monkeypatch.chdir(tmp_path)
    assert main(command) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith(message) and len(err.splitlines()) == 1 and list(tmp_path.iterdir()) == []


def test_pretrain_says_there_is_no_validation_rather_than_nan_on_zero_persons():
    """With one person (or a share that holds none out), pretrain printed "validation error nan deg on 0
    held-out persons"."""
    from types import SimpleNamespace

    from alfa.cli.gaze import _validation_words

    none = SimpleNamespace(history=[{"loss": 1.0, "val_error": float("nan")}], val_persons=[])
    assert _validation_words(none) == "no validation (no person held out: give --val-data, or more persons)"
    held = SimpleNamespace(history=[{"val_error": 7.125}], val_persons=["p01", "p02"])
    assert _validation_words(held) == "validation error 7.12 deg on 2 held-out persons"
    one = SimpleNamespace(history=[{"val_error": 7.125}], val_persons=["p01"])
    assert _validation_words(one) == "validation error 7.12 deg on 1 held-out person"


def test_validation_is_never_on_persons_the_model_trained_on():
    """``--val-data`` that is the training data was called "held out"; and truncate (or tpgaze meta-train) after a
    pre-training validated on other data drew its "held-out" persons from the ones pre-training trained on."""
    from alfa.gaze.pipeline import open_data
    from alfa.gaze.train import TrainConfig, held_out_persons, resolve_validation

    spec = "synthetic:eth?persons=4&images_per_person=2&size=16"
    data, again = open_data(spec), open_data(spec)
    with pytest.raises(ValueError, match=r"^the validation data is the training data \(eth"):
        resolve_validation(data, TrainConfig(), again)
    other = open_data(spec + "&split=val")
    assert resolve_validation(data, TrainConfig(), other)[2] == list(other.persons())
    header = {"data": {"name": data.name}, "train_persons": list(data.persons()), "val_data": other.name}
    with pytest.raises(
        ValueError, match=rf"m.safetensors was trained on 4 of {data.name}'s persons .* pass --val-data"
    ):
        held_out_persons({"extra": {**header, "val_persons": list(other.persons())}}, data, "m.safetensors")
    assert held_out_persons({"extra": header}, other) is None  # other data: nothing of it was trained on
    # a recovered model written before it recorded its training persons trained on all of its data's
    recovered = {"stage": "recovered", "data": {"name": data.name}, "val_data": other.name, "val_persons": ["p00"]}
    with pytest.raises(ValueError, match=rf"m.safetensors was trained on 4 of {data.name}'s persons"):
        held_out_persons({"extra": recovered}, data, "m.safetensors")


def test_a_ctrl_c_a_library_swallows_and_fails_of_is_said_as_the_interruption(monkeypatch, capsys):
    """torch's exporter, stopped by a Ctrl-C while it imported torch._dynamo, swallowed the KeyboardInterrupt and
    failed with "module 'torch._dynamo' has no attribute 'exc'": alfa export said the model could not be exported.
    A command interrupted so says "interrupted" and exits 130; without a Ctrl-C the same error is its one line."""
    import os
    import signal
    import time

    import alfa

    interrupt = []

    def swallowing(model, *args, **kwargs):
        if interrupt[-1]:
            try:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(1)  # the handler runs at once; this is not waited out
            except KeyboardInterrupt:
                pass  # as a library mid-import may
        raise ValueError("module 'torch._dynamo' has no attribute 'exc'")

    monkeypatch.setattr(alfa, "parameter_summary", swallowing)
    # Python's own handler, as in a terminal (a background job of a shell starts with SIGINT ignored)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        for interrupted, status, said in (
            (True, 130, "interrupted\n"),
            (False, 2, "alfa summary: error: module 'torch"),
        ):
            interrupt.append(interrupted)
            assert main(["summary"]) == status
            assert capsys.readouterr().err.startswith(said)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # put back
    finally:
        signal.signal(signal.SIGINT, previous)
