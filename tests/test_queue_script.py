"""scripts/queue.sh: the lane runner of long benchmark sessions runs each piece of its lane file in order, skips
comments and blank lines, refuses a line that selects no seeds or pairs, logs each piece apart, and stops at the
first piece that fails, saying which."""

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


def _run(repo: Path, lane: str, *more: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "LC_ALL": "C.UTF-8"}
    script = os.path.relpath(repo / "scripts" / "queue.sh", cwd or repo)
    argv = ["bash", script, lane, *more]
    return subprocess.run(argv, cwd=cwd or repo, capture_output=True, text=True, env=env, timeout=60)


pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def test_a_lane_runs_its_pieces_in_order_and_stops_at_the_first_failure(tmp_path):
    repo = _repo(tmp_path)
    lane = repo / "lane.txt"
    pieces = ["--methods source-only --pairs E→M --seeds 0", "--pairs E→D --seeds 9", "--pairs E→D --seeds 1"]
    lane.write_text(f"# a comment\n{pieces[0]}\n\t\n   # indented\n{pieces[1]}\n{pieces[2]}\n")
    done = _run(repo, "lane.txt")
    assert done.returncode == 1
    calls = (repo / "calls.txt").read_text().splitlines()
    # the comments and the blank lines skipped; nothing after the failed piece
    assert calls == [f"bench --standard --out runs/bench-v2 {p}" for p in pieces[:2]]
    assert "lane line 5 failed; see runs/logs/lane-5.log" in done.stderr
    assert (repo / "runs/logs/lane-2.log").read_text() == f"piece output {calls[0]}\n"

    lane.write_text(f"{pieces[2]}\n")
    assert _run(repo, "lane.txt").returncode == 0
    # from another folder, with a path relative to it
    (repo / "elsewhere").mkdir()
    assert _run(repo, "../lane.txt", cwd=repo / "elsewhere").returncode == 0
    assert (repo / "calls.txt").read_text().splitlines()[-2:] == [
        f"bench --standard --out runs/bench-v2 {pieces[2]}"
    ] * 2


def test_a_lane_restarts_from_a_given_line_and_refuses_a_bad_one(tmp_path):
    repo = _repo(tmp_path)
    pieces = [f"--pairs E→M --seeds {s}" for s in (0, 1, 2)]
    (repo / "lane.txt").write_text("# a comment\n" + "\n".join(pieces) + "\n")
    done = _run(repo, "lane.txt", "3")
    assert done.returncode == 0, done.stderr
    # lines 3 and 4 of the file (the comment is line 1): the first piece is not run
    assert (repo / "calls.txt").read_text().splitlines() == [
        f"bench --standard --out runs/bench-v2 {p}" for p in pieces[1:]
    ]
    assert "lane line 3:" in done.stdout and "line 2:" not in done.stdout
    for bad in ("0", "x", "-1"):
        refused = _run(repo, "lane.txt", bad)
        assert (
            refused.returncode == 2
            and refused.stderr == f"queue: FROM_LINE must be a line number (1 or more), got '{bad}'\n"
        )
    past = _run(repo, "lane.txt", "5")
    assert past.returncode == 2 and past.stderr == "queue: lane.txt has 4 lines; nothing from line 5 on\n"
    assert len((repo / "calls.txt").read_text().splitlines()) == 2


def test_a_line_that_selects_no_seeds_or_pairs_is_refused(tmp_path):
    repo = _repo(tmp_path)
    (repo / "lane.txt").write_text("--methods source-only --seeds 0\n")
    done = _run(repo, "lane.txt")
    assert done.returncode == 2 and not (repo / "calls.txt").exists()
    assert done.stderr.startswith("queue: lane line 1 names no --seeds or no --pairs; refusing to run the lane:")


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        ("--methods lora --pairs E→M", "names no --seeds or no --pairs"),
        ("--out elsewhere --pairs E→M --seeds 0", "names --out, which the lane sets itself"),
        ("--quick --pairs E→M --seeds 0", "names --quick, which the lane sets itself"),
        ("--cache-dir=c --pairs E→M --seeds 0", "names --cache-dir, which the lane sets itself"),
    ],
)
def test_a_bad_later_line_stops_the_lane_before_any_piece_runs(tmp_path, bad, why):
    """Checked when its turn came, a bad third line stopped the lane after hours of the first two; and a line's own
    --out sent its records elsewhere (argparse keeps the last)."""
    repo = _repo(tmp_path)
    (repo / "lane.txt").write_text(f"--pairs E→M --seeds 0\n--pairs E→M --seeds 1\n{bad}\n")
    done = _run(repo, "lane.txt")
    assert done.returncode == 2 and done.stderr.startswith(f"queue: lane line 3 {why}; refusing to run the lane:")
    assert not (repo / "calls.txt").exists() and not (repo / "runs").exists()  # nothing run, nothing copied
    (repo / "lane.txt").write_text(f"{bad}\n--pairs E→M --seeds 1\n")  # a line before FROM_LINE is not checked
    assert _run(repo, "lane.txt", "2").returncode == 0
    assert (repo / "calls.txt").read_text() == "bench --standard --out runs/bench-v2 --pairs E→M --seeds 1\n"


def test_a_lane_of_windows_lines_and_option_equals_forms_runs_as_written(tmp_path):
    """A lane file saved with Windows line ends passed each line's last argument on with a '\\r' glued to it
    ('0\\r' as the seed), and '--seeds=0 --pairs=E→M' (argparse's other form) was refused as naming neither."""
    repo = _repo(tmp_path)
    (repo / "lane.txt").write_bytes("--pairs=E→M --seeds=0\r\n--pairs E→D --seeds 1\r\n".encode())
    done = _run(repo, "lane.txt")
    assert done.returncode == 0, done.stderr
    assert (repo / "calls.txt").read_text().splitlines() == [
        "bench --standard --out runs/bench-v2 --pairs=E→M --seeds=0",
        "bench --standard --out runs/bench-v2 --pairs E→D --seeds 1",
    ]


def test_a_lane_with_nothing_to_run_says_so_and_makes_nothing(tmp_path):
    """A lane of comments (or whose pieces all lie before FROM_LINE) made runs/ and said 'every piece done'."""
    repo = _repo(tmp_path)
    (repo / "comments.txt").write_text("# nothing here yet\n   \n")
    done = _run(repo, "comments.txt")
    assert done.returncode == 2 and done.stderr.startswith("queue: comments.txt has no piece to run from line 1 on")
    (repo / "lane.txt").write_text("--pairs E→M --seeds 0\n# done up to here\n")
    done = _run(repo, "lane.txt", "2")
    assert done.returncode == 2 and done.stderr == (
        "queue: lane.txt has no piece to run from line 2 on (only blank lines and comments)\n"
    )
    assert not (repo / "runs").exists() and not (repo / "calls.txt").exists()


def test_a_missing_lane_file_is_one_line_and_a_non_zero_status(tmp_path):
    done = _run(_repo(tmp_path), "nowhere.txt")
    assert done.returncode == 2 and done.stderr == "queue: no lane file nowhere.txt\n"


def _lane_lines() -> list[tuple[str, int, str]]:
    out = []
    for lane in sorted((ROOT / "scripts" / "queues").glob("*.txt")):
        for n, line in enumerate(lane.read_text(encoding="utf-8").splitlines(), 1):
            if line.strip() and not line.lstrip().startswith("#"):
                out.append((lane.name, n, line))
    return out


@pytest.mark.parametrize("lane,n,line", _lane_lines(), ids=lambda v: str(v) if not isinstance(v, str) else v[:20])
def test_every_committed_lane_line_is_a_valid_narrow_selection(lane, n, line):
    """A typo in a lane (an unknown method or pair) would otherwise stop the lane hours into a session."""
    from alfa.cli import build_parser
    from alfa.cli.bench import bench_config

    args = build_parser().parse_args(["bench", "--standard", "--out", "runs/bench-v2", *line.split()])
    config = bench_config(args)  # validates
    assert args.seeds is not None and args.pairs is not None, f"{lane}:{n}"
    assert set(config.seeds) <= set(range(8)), f"{lane}:{n}: the declared run has seeds 0–7"


def test_the_lane_check_sees_an_unknown_method():
    from alfa.cli import build_parser
    from alfa.cli.bench import bench_config

    line = "--methods calibrate-afine --pairs E→M --seeds 0"
    with pytest.raises(ValueError, match="unknown method"):
        bench_config(build_parser().parse_args(["bench", "--standard", *line.split()]))


def test_a_new_machine_starts_the_run_from_the_kept_records_and_never_replaces_a_started_run(tmp_path):
    repo = _repo(tmp_path)
    kept = repo / "docs/data/bench-v2"
    (kept / "figure_data").mkdir(parents=True)
    (kept / "results.json").write_text('{"kept": true}\n')
    (kept / "figure_data" / "f.safetensors").write_text("figure")
    (repo / "lane.txt").write_text("--pairs E→M --seeds 0\n")
    done = _run(repo, "lane.txt")
    assert done.returncode == 0 and "started from the records kept in docs/data/bench-v2" in done.stdout
    run = repo / "runs/bench-v2"
    assert (run / "results.json").read_text() == '{"kept": true}\n'
    assert stat.S_IMODE((run / "results.json").stat().st_mode) == 0o644  # as readable as the kept copy
    assert (run / "figure_data" / "f.safetensors").read_text() == "figure"
    assert sorted(p.name for p in run.iterdir()) == ["figure_data", "results.json"]  # no temporary file left
    (run / "results.json").write_text('{"running": true}\n')  # the run has gone on since
    again = _run(repo, "lane.txt")
    assert again.returncode == 0 and "started from" not in again.stdout
    assert (run / "results.json").read_text() == '{"running": true}\n'


def test_stage_7s_lanes_run_exactly_the_rows_seeds_3_to_5_replicate_each_once_e_and_g_of_a_seed_on_one_lane():
    """docs/flip-premise.md §7.2 (amended 2026-12-04): the two lanes together plan every record the amendment
    adds (the declared run's replicate part) and nothing but those and the family's records of their seeds; no
    record is planned by both lanes (two processes would train the same models); E's and G's lines of one seed are
    on one lane (their within-target models are the same target worlds')."""
    from alfa.cli import build_parser
    from alfa.cli.bench import bench_config
    from alfa.study.bench.config import split_pair
    from alfa.study.bench.methods import REPLICATE_SEEDS
    from alfa.study.bench.plan import declared_run_parts, plan_records

    parts = declared_run_parts("v2")
    replicate = {p.id for p in parts["replicate"]}
    # a line may plan the family's records of its seed (finished, then skipped), nothing else
    allowed = replicate | {p.id for p in parts["family"] if p.seed in REPLICATE_SEEDS}
    planned: dict[str, str] = {}
    units: dict[tuple[str, int], str] = {}
    for lane in ("stage7-a.txt", "stage7-b.txt"):
        for _, n, line in (t for t in _lane_lines() if t[0] == lane):
            config = bench_config(build_parser().parse_args(["bench", "--standard", *line.split()]))
            ids = [p.id for p in plan_records(config)]
            assert set(ids) <= allowed, f"{lane}:{n} plans records that are not seeds 3–5's"
            for i in set(ids) & replicate:
                assert planned.setdefault(i, lane) == lane, f"{i} is on both lanes"
            for pair in config.pairs:
                for seed in config.seeds:
                    units.setdefault((split_pair(pair)[0], seed), lane)
                    assert units[(split_pair(pair)[0], seed)] == lane, f"{pair} seed {seed} is on both lanes"
    assert set(planned) == replicate
    assert all(units[("E", s)] == units[("G", s)] for s in REPLICATE_SEEDS)
