"""How much OpenMP's wait policy changes torch's speed on this machine (docs/gaze.md § threads).

    python scripts/openmp_wait.py [--rounds N] [--out FILE]

Each round starts two fresh Python processes in turn, one with ``OMP_WAIT_POLICY=ACTIVE`` (OpenMP's threads spin
while they wait for work: its default) and one with ``PASSIVE`` (they sleep: what ``import alfa`` asks for where
nothing chose before torch loaded); each times, on torch's default thread count, a ResNet-18 gaze training step
(AdamW, 32 images of 64×64) and a forward pass of 8 such images, the median over several after a warm-up. The
processes alternate, so that a change in the machine's load falls on both. It prints each round, the machine, the
load average before and after, the ratio of the medians over rounds (active over passive: above 1, passive is
the faster), and whether every process trained the same weights (a digest of their bytes): the policy changes how
threads wait for work, not the work.

Writes the table to ``--out`` (default ``docs/data/openmp-wait/<UTC stamp>.txt`` in the repository, wherever it is
run from) once every round is done; an existing file, or a place that cannot be written, is refused before the first
process starts. A refusal is one line on stderr and status 2. Run it with the project's Python (``.venv/bin/python``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # run as python scripts/openmp_wait.py it is there; loaded by a test, not
    sys.path.insert(0, str(HERE))
from script_cli import Parser, refuse, run_child, stamped_output  # noqa: E402

NAME = "openmp_wait"
ROOT = HERE.parent
POLICIES = ("ACTIVE", "PASSIVE")
STEPS, FORWARDS = 5, 20


def _child() -> dict[str, float | str]:
    """Run in the child process (torch loaded under the policy it was started with): median seconds of each, and
    the digest of the weights the steps trained (the policy changes how threads wait, which must not change them)."""
    import hashlib
    import time

    import torch

    from alfa.models import create_model

    torch.manual_seed(0)
    model = create_model("resnet18_gaze")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.rand(32, 3, 64, 64), torch.rand(32, 2)
    steps = []
    for _ in range(STEPS + 1):  # the first is the warm-up
        t0 = time.perf_counter()
        loss = (model(x) - y).abs().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        steps.append(time.perf_counter() - t0)
    model.eval()
    forwards, small = [], torch.rand(8, 3, 64, 64)
    with torch.no_grad():
        for _ in range(FORWARDS + 1):
            t0 = time.perf_counter()
            model(small)
            forwards.append(time.perf_counter() - t0)
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode() + tensor.detach().contiguous().numpy().tobytes())
    return {
        "weights": digest.hexdigest()[:16],
        "step": statistics.median(steps[1:]),
        "forward": statistics.median(forwards[1:]),
        "threads": 0.0 + torch.get_num_threads(),
    }


def _time(policy: str) -> dict[str, float | str]:
    return run_child(NAME, __file__, {**os.environ, "OMP_WAIT_POLICY": policy}, f"under OMP_WAIT_POLICY={policy}")


def _load() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def main(argv: list[str] | None = None) -> None:
    parser = Parser(name=NAME, prog="python scripts/openmp_wait.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the two processes (default %(default)s)")
    parser.add_argument(
        "--out", type=Path, help="the file to write (default docs/data/openmp-wait/<UTC stamp>.txt in the repository)"
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(_child()))
        return
    if args.rounds < 1:
        refuse(NAME, f"--rounds must be at least 1, got {args.rounds}")
    try:
        import torch

        from alfa.fileio import check_writable, write_text
        from alfa.study.timing import cpu_name
    except ImportError as e:  # another Python than the project's
        refuse(NAME, f"{sys.executable} cannot import {e.name or e}; run it with .venv/bin/python")

    out, stamp = stamped_output(NAME, args.out, ROOT / "docs/data/openmp-wait", check_writable)
    lines = [
        f"machine {cpu_name()}, {os.cpu_count()} CPUs, torch {torch.__version__}, started {stamp}, load average "
        f"(1, 5, 15 min) {_load()}",
        f"resnet18_gaze: median of {STEPS} AdamW steps on 32 images of 64×64, and of {FORWARDS} forward passes of 8, "
        "each after a warm-up, on torch's default thread count",
        "| round | OMP_WAIT_POLICY | threads | step (ms) | forward of 8 (ms) |",
        "|---|---|---|---|---|",
    ]
    times: dict[str, list[dict[str, float | str]]] = {p: [] for p in POLICIES}
    for r in range(1, args.rounds + 1):
        for policy in POLICIES:
            got = _time(policy)
            times[policy].append(got)
            lines.append(
                f"| {r} | {policy} | {got['threads']:.0f} | {got['step'] * 1e3:.0f} | {got['forward'] * 1e3:.1f} |"
            )
            print(lines[-1], flush=True)
    for what in ("step", "forward"):
        medians = {p: statistics.median(t[what] for t in times[p]) for p in POLICIES}
        lines.append(
            f"{what}: median over rounds ACTIVE {medians['ACTIVE'] * 1e3:.1f} ms, PASSIVE "
            f"{medians['PASSIVE'] * 1e3:.1f} ms; ACTIVE / PASSIVE = {medians['ACTIVE'] / medians['PASSIVE']:.2f}"
        )
    weights = sorted({t["weights"] for runs in times.values() for t in runs})
    lines.append(
        f"weights after the {STEPS + 1} steps (sha256 of their bytes, first 16 hex digits): {', '.join(weights)}: "
        + ("the same in every process, under either policy" if len(weights) == 1 else "they differ")
    )
    lines.append(f"load average at the end {_load()}")
    if out.exists():  # made while the rounds ran: kept
        refuse(NAME, f"{out} appeared while the rounds ran; nothing written (give another --out)")
    write_text(out, "\n".join(lines) + "\n")  # atomic, its folder made
    print("\n".join(lines[-4:]))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
