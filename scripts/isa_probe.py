"""Which of torch's vector-instruction settings change the numbers on this machine (docs/gaze.md § Determinism).

    python scripts/isa_probe.py [--out FILE]

For each setting below, a fresh Python process on one thread renders a small piece of two synthetic worlds
(8-bit images, as the benchmark trains on them) and trains the benchmark's ResNet-18 gaze model for six AdamW steps
on fixed random 64×64 images from seed 0. It prints, per setting, the instructions torch then uses and the
SHA-256 of the images and of the trained weights; equal digests are equal bits. A setting can only lower what
the CPU has: ``ATEN_CPU_CAPABILITY`` (torch's own kernels: ``default``, ``avx2``, ``avx512``) and
``ONEDNN_MAX_CPU_ISA`` (oneDNN's convolutions: ``SSE41``, ``AVX2``, ...); ``MKL_CBWR`` fixes the code path of MKL,
torch's BLAS here (its matrix products: ``AVX2``, or ``COMPATIBLE``, the one every x86 CPU runs), which MKL otherwise
picks by CPU.

Writes the table to ``--out`` (default ``docs/data/isa-probe/<UTC stamp>.txt`` in the repository, wherever it is run
from) once every setting is probed; an existing file, or a place that cannot be written, is refused before the first
child starts. A refusal is one line on stderr and status 2. Run it with the project's Python (``.venv/bin/python``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # run as python scripts/isa_probe.py it is there; loaded by a test, not
    sys.path.insert(0, str(HERE))
from script_cli import Parser, refuse, run_child, stamped_output  # noqa: E402

NAME = "isa_probe"

ROOT = HERE.parent

SETTINGS: list[dict[str, str]] = [
    {},
    {"ATEN_CPU_CAPABILITY": "avx2"},
    {"ATEN_CPU_CAPABILITY": "default"},
    {"ONEDNN_MAX_CPU_ISA": "AVX2"},
    {"ONEDNN_MAX_CPU_ISA": "SSE41"},
    {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
    {"MKL_CBWR": "AVX2"},
    {"MKL_CBWR": "COMPATIBLE"},
    {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_CBWR": "AVX2"},
]
"""The settings probed (the environment of each child process, beside the parent's); ``{}``: torch's own choice."""
PROBED = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS")
"""The variables a child's setting alone decides: dropped from the parent's environment before each child starts."""

WORLDS = ("eth-v2", "gaze360-v2")
STEPS = 6


def _child() -> dict[str, str]:
    """Run in the child process: the digests under the environment it was started with."""
    import hashlib

    import torch

    from alfa.cli.options import deterministic_kernels
    from alfa.gaze.data.synthetic.domains import make_domain
    from alfa.models import create_model

    deterministic_kernels()  # as alfa bench and the gaze commands run
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


def _said(setting: dict[str, str]) -> str:
    """A setting as the table writes it: ``K=V K=V``, or torch's own choice."""
    return " ".join(f"{k}={v}" for k, v in setting.items()) or "(torch's own choice)"


def _probe(setting: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in PROBED}  # the parent's own choice would be in every row
    return run_child(NAME, __file__, {**env, **setting}, f"for {_said(setting)}")


def main(argv: list[str] | None = None) -> None:
    parser = Parser(name=NAME, prog="python scripts/isa_probe.py", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out", type=Path, help="the file to write (default docs/data/isa-probe/<UTC stamp>.txt in the repository)"
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(_child()))
        return
    try:
        import torch

        from alfa.fileio import check_writable, write_text
        from alfa.study.timing import cpu_name
    except ImportError as e:  # another Python than the project's
        refuse(NAME, f"{sys.executable} cannot import {e.name or e}; run it with .venv/bin/python")

    out, stamp = stamped_output(NAME, args.out, ROOT / "docs/data/isa-probe", check_writable)
    lines = [
        f"machine {cpu_name()}, torch {torch.__version__}, started {stamp}",
        f"{len(WORLDS)} worlds ({', '.join(WORLDS)}) × 2 persons × 8 images at 64×64; resnet18_gaze, {STEPS} AdamW "
        "steps, seed 0, 1 thread",
        "| setting | torch uses | images | weights |",
        "|---|---|---|---|",
    ]
    for setting in SETTINGS:
        got = _probe(setting)
        lines.append(f"| {_said(setting)} | {got['capability']} | {got['images']} | {got['weights']} |")
        print(lines[-1], flush=True)
    if out.exists():  # made while the probes ran: kept
        refuse(NAME, f"{out} appeared while the probes ran; nothing written (give another --out)")
    write_text(out, "\n".join(lines) + "\n")  # atomic, its folder made
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
