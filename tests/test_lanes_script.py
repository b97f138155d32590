"""scripts/lanes.py: which lane lines still have records to make and whether this machine may make them (the seed's
machine is the CPU its source models' entries name), where to start each lane, and the declared records no lane
holds; every refusal one line and status 2."""

from __future__ import annotations

import functools
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "lanes.py"
HOME, OTHER = "Home CPU (family 1, model 1)", "Other CPU (family 2, model 2)"
NARROW = "--ablations none --selected-methods none --default-methods none"


def _script(monkeypatch, here: str = HOME):
    spec = importlib.util.spec_from_file_location("lanes", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "lanes", module)  # where its dataclass looks its annotations up
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "cpu_name", lambda: here)
    return module


@functools.cache
def _kept() -> tuple[dict, dict]:
    """The committed results' entries but their records, and the record of source-only E→M seed 0: read once (48 MB
    of JSON, a second or two each time on a busy machine)."""
    kept = json.loads((ROOT / "docs/data/bench-v2/results.json").read_text(encoding="utf-8"))
    record = next(r for r in kept.pop("records") if r["id"] == "source-only|E→M|seed0")
    return kept, record


def _results(tmp_path: Path) -> Path:
    """Seed 0 made here (source-only E→M recorded), seed 1 elsewhere, seed 2 by no machine yet; a within-target
    model of seed 1 added here does not make seed 1 this machine's."""
    kept, record = _kept()
    sources = {"E|seed0": {"cpu": HOME}, "G|seed0": {}, "E|seed1": {"cpu": OTHER}, "M|seed1": {"cpu": HOME}}
    data = {**kept, "records": [record], "sources": sources, "runs": []}
    path = tmp_path / "results.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def _lane(tmp_path: Path, *lines: str) -> Path:
    path = tmp_path / "lane.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _refused(script, argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exit_:
        script.main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_each_line_with_records_left_says_who_may_make_it_and_where_to_start(tmp_path, monkeypatch, capsys):
    lane = _lane(
        tmp_path,
        "# a comment, then a line whose record is made: not listed",
        f"--methods source-only --pairs E→M --seeds 0 {NARROW}",
        f"--methods source-only --pairs E→M --seeds 1 {NARROW}",
        f"--methods source-only --pairs E→M --seeds 1 {NARROW} --new-models-elsewhere\r",  # a Windows line end
        f"--methods source-only,flip-tta --pairs E→M,E→D --seeds 0,2 {NARROW}",
    )
    script = _script(monkeypatch)
    script.main(["--results", str(_results(tmp_path)), str(lane)])
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"this machine: {HOME}" and out[1].endswith("results.json (1 records)")
    assert out[5:8] == [
        f"| lane.txt | 3 | 1 of 1 | 1 | {OTHER} | no | E seed 1 |",
        f"| lane.txt | 4 | 1 of 1 | 1 | {OTHER} | declared (--new-models-elsewhere) | E seed 1 |",
        f"| lane.txt | 5 | 7 of 8 | 0,2 | {HOME} | yes | E seed 0; E seed 2 |",
    ]
    assert out[8:] == ["", "to start here:", "  bash scripts/queue.sh scripts/queues/lane.txt 4"]
    # on the other machine, line 3 is the start; and nothing of seed 0 may run there
    _script(monkeypatch, OTHER).main(["--results", str(_results(tmp_path)), str(lane)])
    elsewhere = capsys.readouterr().out.splitlines()
    assert elsewhere[5].endswith("| yes | E seed 1 |") and elsewhere[7].endswith("| no | E seed 0; E seed 2 |")
    assert elsewhere[-1] == "  bash scripts/queue.sh scripts/queues/lane.txt 3"


def test_the_declared_records_no_lane_holds_are_counted_by_method(tmp_path, monkeypatch, capsys):
    from alfa.study.bench.plan import declared_run_parts

    queues = tmp_path / "queues"
    queues.mkdir()
    (queues / "only.txt").write_text(f"--methods source-only --pairs E→M --seeds 0,1,2 {NARROW}\n", encoding="utf-8")
    script = _script(monkeypatch)
    monkeypatch.setattr(script, "QUEUES", queues)
    script.main(["--results", str(_results(tmp_path))])
    last = capsys.readouterr().out.splitlines()[-1]
    declared = [p for part in declared_run_parts("v2").values() for p in part]
    source_only = sum(p.variant.label.split("[")[0] == "source-only" for p in declared)  # its k and draw rows too
    assert last.startswith(f"declared records in no lane and not made: {len(declared) - 3} (")
    assert f", source-only {source_only - 3}, " in last  # made: seed 0's; laned: seeds 1 and 2's


def test_bad_input_is_one_line_and_status_2(tmp_path, monkeypatch, capsys):
    script = _script(monkeypatch)
    results = str(_results(tmp_path))
    assert _refused(script, ["--results", results, str(tmp_path / "none.txt")], capsys) == (
        f"lanes: {tmp_path / 'none.txt'}: no such lane file\n"
    )
    bad = _lane(tmp_path, f"--methods source-only --pairs E→M --seeds 0 {NARROW}", "--methods bogus --seeds 0")
    assert _refused(script, ["--results", results, str(bad)], capsys).startswith("lanes: lane.txt line 2: ")
    unknown = _lane(tmp_path, "--methods source-only --seeds 0 --no-such-option")
    err = _refused(script, ["--results", results, str(unknown)], capsys)
    assert err.startswith("lanes: lane.txt line 1: ") and "--no-such-option" in err
    err = _refused(script, ["--results", str(tmp_path / "missing.json"), str(unknown)], capsys)
    assert err == f"lanes: --results: no benchmark results at {tmp_path / 'missing.json'}\n"
    assert "unrecognized arguments: --resul" in _refused(script, ["--resul", results], capsys)  # written whole
    smoke = tmp_path / "smoke.json"  # a smoke run's records bear the declared run's names: planned from before
    smoke.write_text(json.dumps({**json.loads(Path(results).read_text(encoding="utf-8")), "preset": "smoke"}))
    assert _refused(script, ["--results", str(smoke)], capsys) == (
        f"lanes: --results {smoke}: preset smoke on the worlds v2, not the declared run's (preset standard on the "
        "worlds v2)\n"
    )


def test_help_and_the_wrong_python_from_the_command_line(monkeypatch, capsys):
    with pytest.raises(SystemExit) as exit_:
        _script(monkeypatch).main(["--help"])
    assert exit_.value.code == 0 and capsys.readouterr().out.startswith("usage: python scripts/lanes.py")
    # -I -S: a Python without the project's packages (no site-packages, no PYTHONPATH)
    bare = subprocess.run([sys.executable, "-I", "-S", str(SCRIPT)], capture_output=True, text=True, timeout=60)
    assert bare.returncode == 2 and bare.stderr.count("\n") == 1, bare.stderr
    assert bare.stderr.startswith("lanes: ") and "run it with .venv/bin/python" in bare.stderr


def test_a_lane_this_machine_runs_now_is_said_to_run_not_to_be_started(tmp_path, monkeypatch, capsys):
    """Started twice, a lane runs each piece twice over: the processes' command lines say which lanes run."""
    proc = tmp_path / "proc"
    for pid, argv in (
        (41, ["bash", "scripts/queue.sh", "scripts/queues/lane.txt", "4"]),
        (42, ["bash", "/repo/scripts/queue.sh", "/repo/scripts/queues/other.txt"]),  # from line 1
        (43, ["python", "queue.sh"]),  # no lane file: not a lane
        (44, ["vim", "scripts/queues/lane.txt"]),  # the lane file, but no queue.sh
    ):
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "cmdline").write_bytes("\0".join(argv).encode() + b"\0")
    script = _script(monkeypatch)
    assert script.running_lanes(proc) == {"lane.txt": (41, "4"), "other.txt": (42, "1")}
    assert script.running_lanes(tmp_path / "no-proc") == {}
    lane = _lane(tmp_path, f"--methods source-only --pairs E→M --seeds 1 {NARROW} --new-models-elsewhere")
    monkeypatch.setattr(script, "running_lanes", lambda: {"lane.txt": (41, "4")})
    script.main(["--results", str(_results(tmp_path)), str(lane)])
    assert capsys.readouterr().out.splitlines()[-2:] == [
        "to start here:",
        "  lane.txt: running now (queue.sh, process 41, started from line 4)",
    ]


def test_a_line_names_the_source_models_this_machine_must_train_before_its_first_record(tmp_path, monkeypatch):
    """A session on the right machine started lanes whose every line had to pre-train two source models first (hours
    each): none of its records could come before the session ended. Each line says which it needs, and how long
    each took where it was made; a model this machine's cache holds finished is not named."""
    script = _script(monkeypatch)
    done = tmp_path / "runs/bench-v2/cache/source-e0"
    (done / "recovered").mkdir(parents=True)
    (done / "recovered" / "model.safetensors").write_bytes(b"")
    half = tmp_path / "runs/bench-v2/cache/source-g0"  # pre-trained, its truncation not yet recovered: not finished
    (half / "pretrain").mkdir(parents=True)
    (half / "pretrain" / "model.safetensors").write_bytes(b"")
    sources = {
        "E|seed0": {"cache": "runs/bench-v2/cache/source-e0", "recorded_train_seconds": 6120.0},
        "G|seed0": {"cache": "runs/bench-v2/cache/source-g0", "recorded_train_seconds": 9720.0},
        "E|seed1": {"cache": "runs/bench-v2/cache/source-e1"},
    }

    def needs(line: str) -> str:
        return script.to_train(script.plan_records(script.line_config("lane.txt", 1, line)), sources, tmp_path)

    assert needs(f"--methods source-only --pairs E→M,E→D,G→M --seeds 0,1 {NARROW}") == (
        "G seed 0 (2.7 h where made); E seed 1; G seed 1"  # (in the order of the records that need them)
    )
    assert needs(f"--methods source-only --pairs E→M --seeds 0 {NARROW}") == "none"
    # the within-target yardstick trains the target's model, not the source's
    assert needs(f"--methods target-trained --pairs E→M,G→M --seeds 7 {NARROW}") == "M seed 7"
