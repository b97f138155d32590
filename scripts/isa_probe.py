"""Which of torch's vector-instruction settings change the numbers on this machine (docs/gaze.md § Determinism).

    python scripts/isa_probe.py [--out FILE]

For each setting below, a fresh Python process on one thread renders a small piece of two synthetic worlds
(8-bit images, as the benchmark trains on them) and trains the benchmark's ResNet-18 gaze model for six AdamW steps
on fixed random 64×64 images from seed 0. It prints, per setting, the instructions torch then uses and the
SHA-256 of the images and of the trained weights; equal digests are equal bits. A setting can only lower what
the CPU has: ``ATEN_CPU_CAPABILITY`` (torch's own kernels: ``default``, ``avx2``, ``avx512``) and
``ONEDNN_MAX_CPU_ISA`` (oneDNN's convolutions: ``SSE41``, ``AVX2``, ...).

Writes the table to ``--out`` (default ``docs/data/isa-probe/<UTC stamp>.txt``); an existing file is refused.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

SETTINGS: list[dict[str, str]] = [
    {},
    {"ATEN_CPU_CAPABILITY": "avx2"},
    {"ATEN_CPU_CAPABILITY": "default"},
    {"ONEDNN_MAX_CPU_ISA": "AVX2"},
    {"ONEDNN_MAX_CPU_ISA": "SSE41"},
    {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
]
"""The settings probed (the environment of each child process, beside the parent's); ``{}``: torch's own choice."""

WORLDS = ("eth-v2", "gaze360-v2")
STEPS = 6


def _child() -> dict[str, str]:
    """Run in the child process: the digests under the environment it was started with."""
    import hashlib

    import torch

    from alfa.gaze.data.synthetic.domains import make_domain
    from alfa.models import create_model

    torch.set_num_threads(1)
    images = hashlib.sha256()
    for world in WORLDS:
        data = make_domain(world, split="train", seed=0, persons=2, images_per_person=8, workers=1)
        images.update(data.images.contiguous().numpy().tobytes())
    torch.manual_seed(0)
    model = create_model("resnet18_gaze")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    draws = torch.Generator().manual_seed(0)
    for _ in range(STEPS):
        x, y = torch.rand(32, 3, 64, 64, generator=draws), torch.rand(32, 2, generator=draws)
        loss = (model(x) - y).abs().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    weights = hashlib.sha256()
    for tensor in model.state_dict().values():
        weights.update(tensor.detach().contiguous().numpy().tobytes())
    return {
        "capability": torch.backends.cpu.get_cpu_capability(),
        "images": images.hexdigest()[:16],
        "weights": weights.hexdigest()[:16],
    }


def _probe(setting: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")}
    done = subprocess.run(
        [sys.executable, __file__, "--child"], env={**env, **setting}, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"isa_probe: the child process for {setting or 'the default'} failed: {done.stderr.strip()}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="the file to write (default docs/data/isa-probe/<UTC stamp>.txt)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_child()))
        return
    import torch

    from alfa.fileio import write_text
    from alfa.study.timing import cpu_name

    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H%MZ")
    out = args.out or Path("docs/data/isa-probe") / f"{stamp}.txt"
    if out.exists():
        raise SystemExit(f"isa_probe: {out} exists; give another --out")
    lines = [
        f"machine {cpu_name()}, torch {torch.__version__}, started {stamp}",
        f"{len(WORLDS)} worlds ({', '.join(WORLDS)}) × 2 persons × 8 images at 64×64; resnet18_gaze, {STEPS} AdamW "
        "steps, seed 0, 1 thread",
        "| setting | torch uses | images | weights |",
        "|---|---|---|---|",
    ]
    for setting in SETTINGS:
        got = _probe(setting)
        said = " ".join(f"{k}={v}" for k, v in setting.items()) or "(torch's own choice)"
        lines.append(f"| {said} | {got['capability']} | {got['images']} | {got['weights']} |")
        print(lines[-1], flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_text(out, "\n".join(lines) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
