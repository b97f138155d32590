"""The shell helpers a newcomer runs first (scripts/setup.sh, which the README's two commands go through;
scripts/keep_records.sh; scripts/time_fresh_clone.sh): bad input is one line on stderr and a non-zero status, before
anything is made, installed, copied or cloned; --help says what the script does and does nothing else.

Each test runs a copy of the script in a scratch folder, with a stand-in Python whose ``-m venv`` makes a venv
without pip: a script that went past its checks fails at once on pip's absence, never installing anything."""

from __future__ import annotations

import datetime
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def _executable(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def _fake_python(folder: Path, prelude: str = "") -> Path:
    """A Python that is this one, except that ``-m venv`` makes no pip and ``-c`` code runs after ``prelude``."""
    return _executable(
        folder / "fake-python",
        f"""#!/usr/bin/env bash
if [[ $1 == -m && $2 == venv ]]; then shift 2; exec "{sys.executable}" -m venv --without-pip "$@"; fi
if [[ $1 == -c ]]; then exec "{sys.executable}" -c "import sys; {prelude}
$2" "${{@:3}}"; fi
exec "{sys.executable}" "$@"
""",
    )


def _repo(tmp_path: Path, *scripts: str) -> Path:
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    for name in scripts:
        shutil.copy(ROOT / "scripts" / name, repo / "scripts" / name)
    shutil.copy(ROOT / "pyproject.toml", repo / "pyproject.toml")
    return repo


def _run(repo: Path, script: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", f"scripts/{script}", *args],
        cwd=repo,
        capture_output=True,
        text=True,
        env={**os.environ, "LC_ALL": "C.UTF-8", "TMPDIR": str(repo.parent), **env},  # time_fresh_clone's clones
        timeout=60,
    )


def _refused(done: subprocess.CompletedProcess[str], prefix: str) -> str:
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert done.stderr.count("\n") == 1 and done.stderr.startswith(prefix), done.stderr
    return done.stderr


# --- scripts/setup.sh -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prelude", "why"),
    [
        ("sys.version_info = (3, 8, 18, 'final', 0)", "is Python 3.8; alfa needs 3.10 or later"),
        ("sys.modules['ensurepip'] = None", "has no venv module with ensurepip (on Debian and Ubuntu: apt install"),
    ],
)
def test_setup_refuses_a_python_that_cannot_make_the_venv_before_making_it(tmp_path, prelude, why):
    """A Python 3.8 made a .venv that pip could install nothing into ('conflicting dependencies' for torch), and a
    Debian Python without python3-venv left a .venv without pip: every later run, with a good Python too, took
    that .venv as made and failed on it ('No module named pip') until the person found and removed it."""
    repo = _repo(tmp_path, "setup.sh")
    python = _fake_python(tmp_path, prelude)
    err = _refused(_run(repo, "setup.sh", "gaze", PYTHON=str(python)), f"setup.sh: {python} {why}")
    assert "(set PYTHON to another)" in err
    assert not (repo / ".venv").exists()


def test_setup_says_which_python_is_missing(tmp_path):
    repo = _repo(tmp_path, "setup.sh")
    err = _refused(_run(repo, "setup.sh", PYTHON="no-such-python3"), "setup.sh: no no-such-python3 here;")
    assert "set PYTHON" in err and not (repo / ".venv").exists()


def test_setup_refuses_an_existing_venv_without_pip_and_leaves_it_as_it_is(tmp_path):
    repo = _repo(tmp_path, "setup.sh")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(repo / ".venv")], check=True, timeout=60)
    before = sorted(p.name for p in (repo / ".venv").iterdir())
    err = _refused(_run(repo, "setup.sh", PYTHON=str(_fake_python(tmp_path))), "setup.sh: .venv/bin/python has no pip")
    assert err.endswith("; remove .venv and run this again\n")
    assert sorted(p.name for p in (repo / ".venv").iterdir()) == before


def test_setup_removes_the_half_made_venv_of_a_failed_start_and_only_that(tmp_path):
    repo = _repo(tmp_path, "setup.sh")
    failing = _executable(
        tmp_path / "failing-python",
        f"""#!/usr/bin/env bash
if [[ $1 == -m && $2 == venv ]]; then "{sys.executable}" -m venv --without-pip "$3"; echo "no ensurepip" >&2; exit 1; fi
exec "{sys.executable}" "$@"
""",
    )
    done = _run(repo, "setup.sh", "dev", PYTHON=str(failing))
    assert done.returncode == 2 and done.stderr.endswith("-m venv .venv failed (its message above); nothing kept\n")
    assert not (repo / ".venv").exists()
    (repo / ".venv").mkdir()  # a folder that was there before is someone's: left
    (repo / ".venv" / "notes.txt").write_text("mine")
    refused = _run(repo, "setup.sh", "dev", PYTHON=str(failing))  # refused before venv writes into it
    assert refused.returncode == 2 and refused.stderr == (
        "setup.sh: .venv is here but holds no bin/python; remove it (or move it away) and run this again\n"
    )
    assert sorted(p.name for p in (repo / ".venv").iterdir()) == ["notes.txt"]
    assert (repo / ".venv" / "notes.txt").read_text() == "mine"


def test_setup_arguments(tmp_path):
    repo = _repo(tmp_path, "setup.sh")
    python = str(_fake_python(tmp_path))
    shown = _run(repo, "setup.sh", "--help", PYTHON=python)
    assert (
        shown.returncode == 0
        and shown.stdout.startswith("usage: bash scripts/setup.sh [gaze|dev]")
        and not shown.stderr
    )
    _refused(
        _run(repo, "setup.sh", "gaze", "dev", PYTHON=python), "setup.sh: one argument at most (gaze or dev), got 2"
    )
    _refused(_run(repo, "setup.sh", "gaz", PYTHON=python), "setup.sh: unknown extras 'gaz' (gaze or dev)")
    assert not (repo / ".venv").exists()


def test_setup_installs_nothing_when_the_venv_is_set_up(tmp_path):
    """The checks leave the ordinary rerun as it was: a .venv whose stamp matches pyproject.toml is used as it is."""
    repo = _repo(tmp_path, "setup.sh")
    _executable(repo / ".venv" / "bin" / "python", f'#!/usr/bin/env bash\nexec "{sys.executable}" "$@"\n')
    digest = subprocess.run(["sha256sum", "pyproject.toml"], cwd=repo, capture_output=True, text=True, check=True)
    (repo / ".venv" / ".alfa-installed").write_text(digest.stdout.split()[0] + " dev\n")
    for extras in ("gaze", "dev"):
        done = _run(repo, "setup.sh", extras)
        assert done.returncode == 0 and done.stdout == done.stderr == "", done.stderr


# --- scripts/keep_records.sh ------------------------------------------------------------------------------------


def _records_repo(tmp_path: Path) -> Path:
    repo = _repo(tmp_path, "keep_records.sh")
    for name in ("python", "alfa"):  # stand-ins that say they ran
        _executable(repo / ".venv" / "bin" / name, f'#!/usr/bin/env bash\necho "{name} $*" >> calls.txt\n')
    (repo / "runs" / "bench-v2").mkdir(parents=True)
    (repo / "runs" / "bench-v2" / "results.json").write_text("{}\n")
    return repo


def test_keep_records_help_and_stray_arguments_copy_nothing(tmp_path):
    """Any argument was ignored: `keep_records.sh --help` replaced docs/data/bench-v2 and rewrote every page."""
    repo = _records_repo(tmp_path)
    shown = _run(repo, "keep_records.sh", "--help")
    assert shown.returncode == 0 and shown.stdout.startswith("usage: bash scripts/keep_records.sh") and not shown.stderr
    _refused(_run(repo, "keep_records.sh", "runs/bench-v3"), "keep_records: takes no arguments, got: runs/bench-v3")
    assert not (repo / "calls.txt").exists()
    assert _run(repo, "keep_records.sh").returncode == 0  # and without any, it does its work
    assert (repo / "calls.txt").read_text() == "python -\nalfa pages --write\n"


def test_keep_records_without_a_venv_is_one_line(tmp_path):
    repo = _records_repo(tmp_path)
    shutil.rmtree(repo / ".venv")
    _refused(_run(repo, "keep_records.sh"), "keep_records: no .venv here (make it first: bash scripts/setup.sh)")


# --- scripts/time_fresh_clone.sh --------------------------------------------------------------------------------


def _clone_repo(tmp_path: Path, demo: str = "") -> Path:
    if shutil.which("git") is None:
        pytest.skip("needs git")
    repo = _repo(tmp_path, "time_fresh_clone.sh")
    _executable(
        repo / "scripts" / "test.sh", f'#!/usr/bin/env bash\necho ran >> "{tmp_path}/ran.txt"\necho "3 passed"\n'
    )
    _executable(repo / "scripts" / "demo.sh", f"#!/usr/bin/env bash\n{demo}\necho 'total wall time 1 s'\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.org", "-c", "commit.gpgsign=false"]
    subprocess.run([*git, "init", "-q"], cwd=repo, check=True, timeout=60)
    subprocess.run([*git, "add", "-A"], cwd=repo, check=True, timeout=60)
    subprocess.run([*git, "commit", "-q", "-m", "scratch"], cwd=repo, check=True, timeout=60)
    return repo


def test_time_fresh_clone_help_and_stray_arguments_clone_nothing(tmp_path):
    """Any argument was ignored: `time_fresh_clone.sh --help` started seven minutes of clones and installs."""
    repo = _clone_repo(tmp_path)
    shown = _run(repo, "time_fresh_clone.sh", "--help")
    assert shown.returncode == 0 and shown.stdout.startswith("usage: bash scripts/time_fresh_clone.sh")
    _refused(_run(repo, "time_fresh_clone.sh", "demo"), "time_fresh_clone: takes no arguments, got: demo")
    assert not (tmp_path / "ran.txt").exists() and not (repo / "docs").exists()


def test_time_fresh_clone_keeps_its_record_and_never_replaces_one_made_meanwhile(tmp_path):
    repo = _clone_repo(tmp_path)
    done = _run(repo, "time_fresh_clone.sh")
    assert done.returncode == 0, done.stderr
    (record,) = (repo / "docs/data/fresh-clone").iterdir()
    lines = record.read_text().splitlines()
    assert lines[3:7] == [lines[3], "  3 passed", lines[5], "  total wall time 1 s"]
    assert lines[3].startswith("./scripts/test.sh: exit status 0") and stat.S_IMODE(record.stat().st_mode) == 0o644
    # what the README says of the run comes from the record: the CPU, the others' processes, the load, pip's cache
    assert re.fullmatch(r"machine .*, \d+ CPUs \(family \S+, model \S+\)", lines[1]), lines[1]
    assert re.fullmatch(
        r"other alfa processes at the start: \d+ stopped, \d+ running; load average .+; pip's .+", lines[7]
    )
    assert re.fullmatch(r"other alfa processes at the end: \d+ stopped, \d+ running; load average .+", lines[8])
    assert len(lines) == 9

    # a record of this minute made while the commands ran (another run) is kept, and this run's lines are shown
    folder = tmp_path / "again" / "repo" / "docs/data/fresh-clone"
    now = datetime.datetime.now(datetime.timezone.utc)
    stamps = {f"{t:%Y-%m-%dT%H%M}Z" for t in (now, now + datetime.timedelta(seconds=30))}
    make = " ".join(f'"{folder}/{s}.txt"' for s in stamps)
    repo = _clone_repo(tmp_path / "again", demo=f'mkdir -p "{folder}"; for f in {make}; do echo theirs > "$f"; done')
    done = _run(repo, "time_fresh_clone.sh")
    assert done.returncode == 2 and "appeared meanwhile; kept it, this run's lines above only" in done.stderr
    assert "  total wall time 1 s" in done.stdout.splitlines()
    assert {p.read_text() for p in folder.iterdir()} == {"theirs\n"}  # kept, and no temporary file left


# --- scripts/test.sh --------------------------------------------------------------------------------------------


def test_the_suites_lint_covers_every_folder_of_python_files():
    """scripts/test.sh (what CI runs) linted src and tests only: scripts/*.py, which write committed data, were never
    checked. The folders of Python files are the repository's own (not .venv, runs/ or docs/data)."""
    folders = {d.name for d in ROOT.iterdir() if d.name in ("src", "tests", "scripts", "docs") and any(d.rglob("*.py"))}
    lint = [line.split() for line in (ROOT / "scripts/test.sh").read_text().splitlines() if "bin/ruff" in line]
    assert [words[1] for words in lint] == ["check", "format"]
    for words in lint:
        assert folders <= set(words), f"{' '.join(words)} leaves out {sorted(folders - set(words))}"


# --- scripts/device_check.sh ------------------------------------------------------------------------------------


def test_device_check_help_and_stray_arguments_run_nothing(tmp_path):
    """Its arguments were ignored: `device_check.sh --help`, or settings given as arguments (`SIZE=64`), started the
    check at its default sizes, a long pre-training on a machine without a GPU."""
    repo = _repo(tmp_path, "device_check.sh")
    for name in ("python", "alfa"):  # stand-ins that say they ran
        _executable(repo / ".venv" / "bin" / name, f'#!/usr/bin/env bash\necho "{name} $*" >> calls.txt\n')
    shown = _run(repo, "device_check.sh", "--help")
    assert shown.returncode == 0 and shown.stdout.startswith("usage: [SIZE=224]") and not shown.stderr
    err = _refused(_run(repo, "device_check.sh", "SIZE=64"), "device_check.sh: takes no arguments (settings go in the")
    assert err.endswith("got: SIZE=64\n")
    assert not (repo / "calls.txt").exists() and not (repo / "runs").exists()


def test_device_check_says_which_stages_an_earlier_run_finished_instead_of_quoting_their_speeds(tmp_path):
    """Run again into the same folder, the stages resume: a finished pre-training is loaded, not trained, and the
    speeds the script printed for it were the first run's (perhaps another machine's), as if timed again."""
    from tiny_models import TinyGazeNet

    import alfa

    repo = _repo(tmp_path, "device_check.sh")
    _executable(repo / ".venv" / "bin" / "alfa", '#!/usr/bin/env bash\necho "alfa $1" >> calls.txt\n')
    out = repo / "runs" / "device-check"
    for stage, seconds in (("pretrain", 2.0), ("recovered", 4.0)):
        history = {"history": [{"seconds": seconds}]} if stage == "pretrain" else {"result": {}}
        if stage == "recovered":
            history["result"]["recovery_history"] = [{"seconds": seconds}]
        extra = {**history, "data": {"images": 100}}
        model = TinyGazeNet()  # a registered model: save_model refuses a name load_model could not rebuild
        alfa.checkpoint.save_model(out / stage / "model.safetensors", model, "tiny_gaze_net", extra=extra)
    hour_ago = datetime.datetime.now().timestamp() - 3600
    os.utime(out / "pretrain" / "model.safetensors", (hour_ago, hour_ago))  # before this run: an earlier run's
    later = datetime.datetime.now().timestamp() + 3600
    os.utime(out / "recovered" / "model.safetensors", (later, later))  # written by this run's stand-in truncate
    env = {"PYTHON": sys.executable, "PYTHONPATH": str(ROOT / "src")}
    done = _run(repo, "device_check.sh", DEVICE="cpu", **env)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "pretrain: finished by an earlier run into runs/device-check, not timed by this one" in "\n".join(lines)
    assert not [line for line in lines if line.startswith("pretrain: epoch")]
    assert [line for line in lines if line.startswith("recovered: epoch")] == [
        "recovered: epoch of 100 images in 4.0 s = 25 images/s (source images incl. held-out ones; validation included)"
    ]
    assert (repo / "calls.txt").read_text().split() == [
        "alfa",
        "pretrain",
        "alfa",
        "truncate",
        "alfa",
        "personalize",
        "alfa",
        "throughput",
    ]
