"""The commands on the library alone (torch, numpy, safetensors): ``summary`` and ``export`` (whose ``--tta`` takes
the gaze application's test-time augmentation, :mod:`alfa.gaze.tta`, which needs torch alone too)."""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import logging
import sys
import warnings
from collections.abc import Iterator

from .options import MODEL_HELP, at_least, default_of, image_side, non_negative_number, tta_of, tta_option
from .registry import Command

__all__ = ["SUMMARY", "EXPORT", "quiet_exporter"]

EXPORTER_MODULES = r"(torch|onnx|onnxscript|onnx_ir|onnxruntime)(\..*)?$"
"""The modules whose user warnings :func:`quiet_exporter` hides (a regular expression on the warning's module)."""

EXPORTER_LOGGERS = ("torch", "onnxscript", "onnx_ir")
"""The loggers whose lines below ERROR :func:`quiet_exporter` hides (their child loggers too)."""


def _summary_arguments(p: argparse.ArgumentParser) -> None:
    from alfa.truncate import DEFAULT_RANK

    p.add_argument("--model", default="resnet18_gaze", help=MODEL_HELP)
    p.add_argument(
        "--rank",
        type=at_least(0),
        default=DEFAULT_RANK,
        help="rank d of the SVD truncation (0: dense only; default %(default)s)",
    )


def _summary(args: argparse.Namespace) -> None:
    import alfa

    model = alfa.models.create_model(args.model)
    dense = alfa.parameter_summary(model)
    if args.rank:  # truncated first: a rank that saves nothing is refused before any table is printed
        report = alfa.truncate(model, rank=args.rank, weights=False)  # counts only: no SVD to wait for
    print(f"{args.model} (dense):\n{dense}\n")
    if args.rank:
        print(f"{report}\n")
        print(f"{args.model} truncated at rank {args.rank}:\n{alfa.parameter_summary(model)}")


def _export_arguments(p: argparse.ArgumentParser) -> None:
    from alfa.export import export_onnx

    p.add_argument("--checkpoint", required=True, help="the base model (model.safetensors)")
    p.add_argument("--adapter", help="a user's adapter file, merged in before export (default: the base alone)")
    p.add_argument(
        "--merge",
        choices=("extend", "densify"),
        help="how to merge an adapter that cannot keep the base's rank d (LoRA and its family need one): extend "
        "keeps exact factors of rank d + r, densify makes the layers dense",
    )
    p.add_argument(
        "--image-size",
        type=image_side,
        nargs=2,
        metavar=("H", "W"),
        help="input height and width (default: the checkpoint's; a checkpoint that records its training size takes "
        "only that one, and one that records none takes any, with a note that it could not be checked)",
    )
    p.add_argument("--out", required=True, help="the ONNX file to write")
    p.add_argument("--program", help="also write the torch.export program here (.pt2)")
    tta_option(p, "export the model")
    p.add_argument(
        "--tolerance",
        type=non_negative_number,
        default=default_of(export_onnx, "tolerance"),
        help="largest relative difference accepted between onnxruntime's outputs and PyTorch's (default %(default)g)",
    )
    p.add_argument(
        "--verbose",
        action="store_true",
        help="also show the exporter's own warnings and log lines (PyTorch's, onnxscript's), hidden by default; "
        "so does running Python with -W or PYTHONWARNINGS",
    )


@contextlib.contextmanager
def quiet_exporter(show: bool = False) -> Iterator[None]:
    """Hide, while an export runs, what PyTorch's exporter says that a person cannot act on: deprecation notices,
    tracer and user warnings from torch and onnx's packages, their log lines below ERROR ("torchvision is not
    installed"), and, when the export fails, what they printed on stderr (torch.export's partial graph of the
    model): the failure is the one line :func:`alfa.cli.main` gives. Nothing is hidden with ``show`` or when Python
    was given warning options (``-W``, ``PYTHONWARNINGS``), whose choice wins; errors still raise, the filters are
    this block's only, and any other warning is still shown."""
    if show or sys.warnoptions:
        yield
        return
    import torch

    loggers = [logging.getLogger(name) for name in EXPORTER_LOGGERS]
    levels = [logger.level for logger in loggers]
    printed = io.StringIO()
    with warnings.catch_warnings(), contextlib.redirect_stderr(printed):
        # Deprecation notices are attributed to wherever torch's stack level points (copyreg, for one), so these two
        # go by category alone; they are never an error.
        warnings.filterwarnings("ignore", category=FutureWarning)
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
        warnings.filterwarnings("ignore", category=UserWarning, module=EXPORTER_MODULES)
        try:
            for logger in loggers:
                logger.setLevel(max(logger.getEffectiveLevel(), logging.ERROR))
            yield
        finally:
            for logger, level in zip(loggers, levels):
                logger.setLevel(level)
    # Reached when the export succeeded: what else was printed (a warning no filter above names) is shown.
    sys.stderr.write(printed.getvalue())


def _export(args: argparse.Namespace) -> None:
    import torch

    from alfa.adapters import load_adapter, merge_form, read_adapter_metadata
    from alfa.export import export_onnx, export_program

    from .guards import load_finished

    tta = tta_of(args.tta)  # a bad name is one line before anything loads
    if importlib.util.find_spec("onnxruntime") is None:  # the command keeps a file only once it is checked
        raise ModuleNotFoundError("No module named 'onnxruntime'", name="onnxruntime")
    model, saved = load_finished(args.checkpoint)
    model.eval()
    if args.adapter:
        if tta is not None:
            tta.refuse_calibration(read_adapter_metadata(args.adapter).get("about") or {}, str(args.adapter))
        load_adapter(model, args.adapter)
    how = merge_form(model) if args.adapter else "none: no --adapter"
    if args.merge and how != "densified":  # the file would not be what was asked
        raise ValueError(
            f"--merge {args.merge} is for an adapter on a truncated base whose merge cannot keep the base's rank "
            f"(LoRA and its family there); this one merges without it ({how}): leave --merge out"
        )
    size = tuple(args.image_size) if args.image_size else tuple(saved.get("input_size") or ())
    if len(size) != 2:
        raise ValueError(f"{args.checkpoint} does not record its input size: pass --image-size H W")
    wrap = None if tta is None else (lambda merged: tta.exportable(merged, size))
    if tta is not None:
        tta.check_size(size)
    _refuse_another_size(args, saved.get("input_size"))  # after the augmentation's own word on the size
    program = io.BytesIO()  # saved to a path, the archive's folder would be named after the temporary file
    if args.program:  # made first, kept in memory: the two files are written together, once both are made
        with quiet_exporter(args.verbose):
            torch.export.save(export_program(model, size, form=args.merge, wrap=wrap), program)
    try:
        with quiet_exporter(args.verbose):
            check = export_onnx(model, args.out, size, form=args.merge, tolerance=args.tolerance, wrap=wrap)
    except torch.onnx.OnnxExporterError as e:
        raise RuntimeError(f"the model could not be exported to ONNX: {_reason(e, args.verbose)}") from e
    if args.program:
        from alfa.fileio import write_bytes

        write_bytes(args.program, program.getvalue())
    print(check.describe() + ("" if tta is None else f" ({tta.name} test-time augmentation in the graph: "
                                                     f"{tta.passes} forward passes an image)"))  # fmt: skip
    if args.program:
        print(f"wrote {args.program} (torch.export; dynamic batch)")
    if not saved.get("input_size"):  # said once the files are written: a failed export stays one line
        print(
            f"alfa export: note: {args.checkpoint} does not record the image size it was trained on, so --image-size "
            f"{size[0]} {size[1]} could not be checked against it (a model predicts much worse on another size)",
            file=sys.stderr,
        )


def _refuse_another_size(args: argparse.Namespace, trained: list[int] | None) -> None:
    """An ``--image-size`` other than the one the checkpoint records it was trained on: a ResNet runs on any size
    and predicts much worse on another (``alfa evaluate`` and ``alfa personalize`` refuse data of another size for
    that reason, :func:`alfa.gaze.train.check_input_size`), so the exported model would not be the model that was
    validated. A checkpoint that records no size takes the size given, and the command says, once the export is
    written, that it could not be checked."""
    if not args.image_size or not trained or list(args.image_size) == list(trained):
        return
    (h, w), (th, tw) = args.image_size, trained
    raise ValueError(
        f"--image-size {h} {w}: {args.checkpoint} was trained on {th}×{tw} images and predicts much worse on "
        f"another size; leave --image-size out to export it at {th}×{tw}"
    )


def _reason(error: BaseException, verbose: bool) -> str:
    """Why the exporter failed, in one line: the first line of the error it caught (torch.export's, say), not its
    own advice on debugging PyTorch."""
    from .errors import error_line

    cause = error.__cause__ if error.__cause__ is not None else error
    return error_line(cause).removesuffix(" (...)") + ("" if verbose else " (--verbose shows the exporter's own log)")


SUMMARY = Command(
    "summary",
    help="parameter summary of a registered model, dense and truncated",
    description="Print a model's parameter counts, dense and after SVD truncation at --rank (counts only: no "
    "SVD is computed).",
    add_arguments=_summary_arguments,
    run=_summary,
)
EXPORT = Command(
    "export",
    help="write a (personalized, merged) model as ONNX, checked against onnxruntime; optionally torch.export",
    description="Merge a user's adapter into the base (if given) and write the model as one ONNX file, whose "
    "outputs are checked against PyTorch's under onnxruntime; --program also writes a torch.export program "
    "(docs/deploy.md, Export).",
    add_arguments=_export_arguments,
    run=_export,
    outputs={"out": False, "program": False},
    extra="export",
)
