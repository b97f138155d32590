"""The commands on the library alone (torch, numpy, safetensors): ``summary`` and ``export`` (whose ``--tta`` takes
the gaze application's test-time augmentation, :mod:`alfa.gaze.tta`, which needs torch alone too)."""

from __future__ import annotations

import argparse

from .options import default_of, image_side, non_negative_number, tta_of, tta_option
from .registry import Command

__all__ = ["SUMMARY", "EXPORT"]


def _summary_arguments(p: argparse.ArgumentParser) -> None:
    from alfa.truncate import DEFAULT_RANK

    p.add_argument("--model", default="resnet18_gaze", help="a registered model (default %(default)s)")
    p.add_argument("--rank", type=int, default=DEFAULT_RANK, help="SVD rank (0: dense only; default %(default)s)")


def _summary(args: argparse.Namespace) -> None:
    import alfa

    model = alfa.models.create_model(args.model)
    print(f"{args.model} (dense):\n{alfa.parameter_summary(model)}\n")
    if args.rank:
        print(alfa.truncate(model, rank=args.rank), "\n")
        print(f"{args.model} truncated at rank {args.rank}:\n{alfa.parameter_summary(model)}")


def _export_arguments(p: argparse.ArgumentParser) -> None:
    from alfa.export import export_onnx

    p.add_argument("--checkpoint", required=True, help="the truncated base (model.safetensors)")
    p.add_argument("--adapter", help="a user's adapter file, merged in before export (default: the base)")
    p.add_argument(
        "--merge",
        choices=("extend", "densify"),
        help="for LoRA-family adapters: keep an exact factorization of rank d + r (extend) or dense layers",
    )
    p.add_argument("--image-size", type=image_side, nargs=2, metavar=("H", "W"), help="default: the checkpoint's")
    p.add_argument("--out", required=True, help="the ONNX file to write")
    p.add_argument("--program", help="also write the torch.export program here (.pt2)")
    tta_option(p, "export the model")
    p.add_argument(
        "--tolerance",
        type=non_negative_number,
        default=default_of(export_onnx, "tolerance"),
        help="largest relative difference accepted (default %(default)g)",
    )


def _export(args: argparse.Namespace) -> None:
    import torch

    from alfa.adapters import load_adapter
    from alfa.checkpoint import load_model
    from alfa.export import export_onnx, export_program

    tta = tta_of(args.tta)  # a bad name is one line before anything loads
    model, saved = load_model(args.checkpoint)
    model.eval()
    if args.adapter:
        load_adapter(model, args.adapter)
    size = tuple(args.image_size) if args.image_size else tuple(saved.get("input_size") or ())
    if len(size) != 2:
        raise ValueError(f"{args.checkpoint} does not record its input size: pass --image-size H W")
    wrap = None if tta is None else (lambda merged: tta.exportable(merged, size))
    if tta is not None:
        tta.check_size(size)
    check = export_onnx(model, args.out, size, form=args.merge, tolerance=args.tolerance, wrap=wrap)
    print(check.describe() + ("" if tta is None else f" ({tta.name} test-time augmentation in the graph: "
                                                     f"{tta.passes} forward passes an image)"))  # fmt: skip
    if args.program:
        from alfa.fileio import atomic_path

        with atomic_path(args.program) as tmp:
            torch.export.save(export_program(model, size, form=args.merge, wrap=wrap), str(tmp))
        print(f"wrote {args.program} (torch.export; dynamic batch)")


SUMMARY = Command(
    "summary",
    help="parameter summary of a registered model, dense and truncated",
    add_arguments=_summary_arguments,
    run=_summary,
)
EXPORT = Command(
    "export",
    help="write a (personalized, merged) model as ONNX, checked against onnxruntime; optionally torch.export",
    add_arguments=_export_arguments,
    run=_export,
    outputs={"out": False, "program": False},
    extra="export",
)
