"""scripts/queue.sh: the lane runner of long benchmark sessions runs each piece of its lane file in order, skips
comments and blank lines, logs each piece apart, and stops at the first piece that fails, saying which."""

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# A stand-in for .venv/bin/alfa: records its arguments; a piece naming seed 9 fails.
FAKE_ALFA = """#!/usr/bin/env bash
echo "$@" >> calls.txt
echo "piece output $*"
[[ "$*" != *"--seeds 9"* ]]
"""


def _repo(tmp_path: Path) -> Path:
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "queue.sh", tmp_path / "scripts" / "queue.sh")
    alfa = tmp_path / ".venv" / "bin" / "alfa"
    alfa.parent.mkdir(parents=True)
    alfa.write_text(FAKE_ALFA)
    alfa.chmod(alfa.stat().st_mode | stat.S_IEXEC)
    return tmp_path


def _run(repo: Path, lane: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "LC_ALL": "C.UTF-8"}
    return subprocess.run(
        ["bash", "scripts/queue.sh", lane], cwd=repo, capture_output=True, text=True, env=env, timeout=60
    )


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_a_lane_runs_its_pieces_in_order_and_stops_at_the_first_failure(tmp_path):
    repo = _repo(tmp_path)
    lane = repo / "lane.txt"
    lane.write_text("# a comment\n--methods source-only --pairs E→M --seeds 0\n\n--seeds 9\n--seeds 1\n")
    done = _run(repo, "lane.txt")
    assert done.returncode == 1
    calls = (repo / "calls.txt").read_text().splitlines()
    assert calls == [
        "bench --standard --out runs/bench-v2 --methods source-only --pairs E→M --seeds 0",
        "bench --standard --out runs/bench-v2 --seeds 9",
    ]  # the comment and the blank line skipped; nothing after the failed piece
    assert "lane line 4 failed; see runs/logs/lane-4.log" in done.stderr
    assert (repo / "runs/logs/lane-2.log").read_text() == f"piece output {calls[0]}\n"

    lane.write_text("--seeds 1\n")
    assert _run(repo, "lane.txt").returncode == 0


def test_a_missing_lane_file_is_one_line_and_a_non_zero_status(tmp_path):
    done = _run(_repo(tmp_path), "nowhere.txt")
    assert done.returncode == 2 and done.stderr == "queue: no lane file nowhere.txt\n"
