"""scripts/score_variants.py: every argument is checked before the model is loaded or a world rendered, a refusal is
one line and status 2 (it was a traceback: no arguments, a misspelt setting, a seed that is no number), a NAME is a
file name in the record folder, and the record is written once every variant is scored, never over one unasked."""

from __future__ import annotations

import importlib.util
import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from tiny_models import TinyGazeNet  # noqa: F401  (registers tiny_gaze_net)

from alfa.checkpoint import save_model
from alfa.models import create_model
from alfa.study.bench.config import BenchConfig

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "score_variants.py"


def _script():
    spec = importlib.util.spec_from_file_location("score_variants", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def model(tmp_path):
    path = tmp_path / "model.safetensors"
    save_model(path, create_model("tiny_gaze_net"), "tiny_gaze_net")
    return str(path)


def _refused(script, argv: list[str], root: Path, capsys) -> str:
    with pytest.raises(SystemExit) as exit_:
        script.main(argv, root)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert not (root / "docs").exists()  # nothing written
    return err


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        ([], "score_variants: the following arguments are required: name, model, target, seed, VARIANT"),
        (["a", "MODEL", "M", "x", "v:"], "argument seed: a seed is a whole number (0 or more), not 'x'"),
        (["a", "MODEL", "Q", "0", "v:"], "unknown target 'Q'; the targets are M, D, W, C, R"),
        (["a", "MODEL", "M", "0", "v"], "variant 'v': expected label:field=value;field=value, or label:"),
        (["a", "MODEL", "M", "0", "v:render_scale=half"], "render_scale=half is not a Python value (a string needs"),
        (["a", "MODEL", "M", "0", "v:render_scal=0.5"], "variant 'v:render_scal=0.5': mpii-v2 has no setting 'render_"),
        (["a", "MODEL", "M", "0", "v:render_scale='0.5'"], "render_scale is 0.8 in mpii-v2; '0.5' is not of its kind"),
        (["a", "MODEL", "M", "0", "v:blur=(0.5,0.1)"], "blur must be 0 <= low <= high <= 1, got (0.5, 0.1)"),
        (["a", "MODEL", "M", "0", "v:", "v:gamma=1.0"], "variant 'v:gamma=1.0': label 'v' is given twice"),
        (["../a", "MODEL", "M", "0", "v:"], "NAME '../a' is not a plain file name"),
        (["a", "nowhere.safetensors", "M", "0", "v:"], "MODEL nowhere.safetensors: no such file"),
        (["a", "MODEL", "M", "0", "v:", "--bogus"], "unrecognized arguments: --bogus"),
    ],
)
def test_a_bad_argument_is_one_line_before_the_model_is_loaded(tmp_path, capsys, monkeypatch, model, argv, says):
    script = _script()
    monkeypatch.setattr(script, "load_model", lambda path: pytest.fail("loaded the model"))
    argv = [model if a == "MODEL" else a for a in argv]
    assert says in _refused(script, argv, tmp_path, capsys)


def test_a_model_that_is_no_model_is_one_line(tmp_path, capsys):
    (tmp_path / "text.safetensors").write_text("not a model")
    err = _refused(_script(), ["a", str(tmp_path / "text.safetensors"), "M", "0", "v:"], tmp_path, capsys)
    assert "text.safetensors: not a readable safetensors file" in err


def test_a_record_is_written_whole_and_never_replaced_unasked(tmp_path, capsys, monkeypatch, model):
    script = _script()
    monkeypatch.setattr(script.BenchConfig, "standard", BenchConfig.smoke)  # 2 persons of 32×32 faces
    argv = ["toy", model, "M", "0", "as-is:", "dim:exposure=(0.6,0.7)"]
    script.main(argv, tmp_path)
    record = tmp_path / "docs/data/calibration-variants/toy.json"
    written = json.loads(record.read_text())
    assert written["command"] == "python scripts/score_variants.py " + shlex.join(argv)
    assert list(written["variants"]) == ["as-is", "dim"]
    assert written["variants"]["dim"]["changes"] == {"exposure": [0.6, 0.7]}
    capsys.readouterr()
    before = record.read_text()
    with pytest.raises(SystemExit) as exit_:
        script.main(argv, tmp_path)
    assert exit_.value.code == 2 and "toy.json exists (committed data)" in capsys.readouterr().err
    assert record.read_text() == before
    script.main([*argv[:-1], "--replace"], tmp_path)  # asked: replaced, and the command kept without --replace
    assert list(json.loads(record.read_text())["variants"]) == ["as-is"]
    assert json.loads(record.read_text())["command"] == "python scripts/score_variants.py " + shlex.join(argv[:-1])


def test_every_committed_command_still_reads_as_it_was_run():
    script = _script()
    config = BenchConfig.standard()
    for path in sorted((ROOT / "docs/data/calibration-variants").glob("*.json")):
        written = json.loads(path.read_text())
        args = script._arguments(shlex.split(written["command"])[2:])
        variants = script.check_variants(args.variants, config.world(args.target))
        assert [label for label, _ in variants] == list(written["variants"]), path.name


def test_help_and_the_wrong_python_from_the_command_line(tmp_path):
    shown = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0 and "NAME" in shown.stdout.upper() and "--replace" in shown.stdout
    # -I -S: a Python without the project's packages (no site-packages, no PYTHONPATH)
    bare = subprocess.run([sys.executable, "-I", "-S", str(SCRIPT)], capture_output=True, text=True, timeout=120)
    assert bare.returncode == 2 and bare.stderr.count("\n") == 1, bare.stderr
    assert "cannot import" in bare.stderr and "run it with .venv/bin/python" in bare.stderr
