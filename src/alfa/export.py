"""Export a (merged, personalized) model for inference outside PyTorch: ONNX, checked against onnxruntime, and
``torch.export``.

A merged Alfa model has exactly the truncated base's structure (two plain convolutions per factorized layer), so
it exports like any CNN; an unmerged adapter is merged first (LoRA-family adapters need a choice of form:
``extend`` keeps an exact factorization of rank ``d + r``, ``densify`` a dense layer). The ONNX file is written
atomically and, when onnxruntime is installed, compared with the PyTorch model on random images of the batch
sizes given; a difference above ``tolerance`` (relative, in norm) is an error and nothing is left behind.

:func:`export_onnx` and :func:`export_program` export an image model: one input, an N×3×H×W batch of images (the
gaze models, CNNs, the registry's ViT and CRATE); a model that does not take such a batch (an MLP, a language model)
is refused before the export starts. Any other module of tensor inputs exports with :func:`export_onnx_with_inputs`.

``torch.jit.script`` does not support alfa's layers (factorized or adapted: their layer geometry is a Python
dataclass TorchScript cannot type) and refuses them in one line; ``torch.jit.trace``, ``torch.export`` (here
:func:`export_program`), ONNX (here :func:`export_onnx`) and ``torch.compile`` all take them. A model merged with
``densify=True`` holds plain layers again, which script like any.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import importlib.util
import inspect
import operator
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .adapters import adapter_state, merge, merge_form
from .fileio import atomic_path

__all__ = ["ExportCheck", "export_onnx", "export_onnx_with_inputs", "export_program", "merged_copy"]


@dataclass
class ExportCheck:
    """What an export wrote and how far onnxruntime's outputs are from PyTorch's (``None``: not checked)."""

    path: Path
    relative_difference: float | None
    batch_sizes: tuple[int, ...]

    def describe(self) -> str:
        if self.relative_difference is None:
            return f"wrote {self.path} (not checked: onnxruntime is not installed)"
        sizes = ", ".join(map(str, self.batch_sizes))
        return (
            f"wrote {self.path}; onnxruntime vs PyTorch on batches of {sizes}: relative difference "
            f"{self.relative_difference:.1e}"
        )


def merged_copy(model: nn.Module, form: str | None = None) -> nn.Module:
    """A copy of ``model`` with its adapter merged (``form``: ``"extend"`` or ``"densify"`` for methods that
    cannot keep the factorized rank), in eval mode; the model itself is not changed."""
    out = copy.deepcopy(model).eval()
    if adapter_state(out) is None:
        return out
    if form not in (None, "extend", "densify"):
        raise ValueError(f"merge form {form!r}: expected 'extend' or 'densify'")
    how = merge_form(out)
    if how == "not mergeable (kept attached)":
        raise ValueError(f"{adapter_state(out).config.method} adapters cannot be merged, so not exported this way")
    if form is None and how == "densified":
        raise ValueError(
            "this adapter cannot keep the factorized rank when merged: choose a form, 'extend' (exact, rank d + r) "
            "or 'densify' (dense layers); alfa export --merge extend|densify"
        )
    merge(out, extend=form == "extend", densify=form == "densify")
    return out


def _image_size(image_size: Sequence[int]) -> tuple[int, int]:
    """``(height, width)``, two positive whole numbers (a single number is refused: it does not say which)."""
    size = tuple(image_size) if isinstance(image_size, (tuple, list)) else None
    if size is None or len(size) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) for v in size):
        raise ValueError(f"image_size must be (height, width), two whole numbers, got {image_size!r}")
    if min(size) < 1:
        raise ValueError(f"image size must be positive, got {size[0]}×{size[1]}")
    return size[0], size[1]


@functools.cache
def _batch() -> Any:
    """The dynamic batch dimension, one for every input: any batch size, so the exported files take as many images
    as memory holds. Made on first use: ``torch.export.Dim`` imports sympy, a fraction of a second that every
    ``alfa`` command would pay when the parser names the exporter's defaults."""
    return torch.export.Dim("batch", min=1)


def _batch_sizes(batch_sizes: Sequence[int]) -> tuple[int, ...]:
    """The batch sizes the check runs, one or more positive whole numbers (none would check nothing)."""
    try:  # any sequence of integers (a range, numpy's): what operator.index takes
        sizes = tuple(operator.index(n) for n in batch_sizes if not isinstance(n, bool))
        whole = len(sizes) == len(batch_sizes)
    except TypeError:
        sizes, whole = (), False
    if not sizes or not whole or min(sizes) < 1:
        raise ValueError(f"batch_sizes must be one or more positive whole numbers, got {batch_sizes!r}")
    return sizes


def _output_name(name: str) -> str:
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"output_name must be a non-empty str (the ONNX graph's output), got {name!r}")
    return name


@torch.no_grad()
def _refuse_non_image_model(model: nn.Module, sample: torch.Tensor, function: str) -> None:
    """A ``ValueError`` in one line where ``model`` does not take ``sample`` (N×3×H×W images) and give back one
    tensor with the batch first: what the export's dynamic batch axis, its one named output and the onnxruntime
    check assume. Said before the exporter runs, whose own failure is a long traceback of its internals."""
    shape = "×".join(map(str, sample.shape))
    other = "for another input, use alfa.export.export_onnx_with_inputs(model, path, inputs, names)"
    try:
        out = model(sample)
    except (MemoryError, torch.OutOfMemoryError):
        raise  # the machine's limit, not the model's input: said as it is
    except Exception as e:  # noqa: BLE001 — any other failure on an image batch says it takes something else
        reason = (str(e).strip().splitlines() or [""])[0]
        raise ValueError(
            f"alfa.export.{function} exports a model of images (input N×3×H×W); this model fails on a {shape} "
            f"batch ({type(e).__name__}: {reason}): {other}"
        ) from None
    if not isinstance(out, torch.Tensor) or out.ndim == 0 or out.shape[0] != sample.shape[0]:
        got = f"a tensor of shape {tuple(out.shape)}" if isinstance(out, torch.Tensor) else f"a {type(out).__name__}"
        raise ValueError(
            f"alfa.export.{function} exports a model that returns one tensor with the batch first; on a {shape} "
            f"batch this model returns {got}: {other}"
        )


def _needs(module: str, what: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise RuntimeError(f"{what} needs the {module!r} package: pip install onnx onnxscript onnxruntime")


def export_onnx(
    model: nn.Module,
    path: str | os.PathLike,
    image_size: tuple[int, int],
    *,
    batch_sizes: Sequence[int] = (1, 7),
    tolerance: float = 1e-5,
    seed: int = 0,
    form: str | None = None,
    wrap: Callable[[nn.Module], nn.Module] | None = None,
    output_name: str = "gaze",
) -> ExportCheck:
    """Write ``model`` (merged first if it carries an adapter that keeps its rank) as ONNX with a dynamic batch
    axis and check it. The model takes images: input ``images``, N×3×H×W (in [0, 1] for the gaze models); its one
    output, batch first, is named ``output_name`` (``gaze``, N×2 yaw and pitch in radians, for the gaze models:
    name another model's own, e.g. ``"logits"``). A model that does not take such a batch, or returns anything but
    one tensor with the batch first, is refused in one line before the export (:func:`export_onnx_with_inputs`
    takes other inputs).

    ``wrap`` puts a module around the merged model before export (the gaze application's test-time augmentation,
    ``alfa export --tta``): the graph is the wrapped model's, and so is what onnxruntime is checked against."""
    output_name = _output_name(output_name)
    _needs("onnxscript", "ONNX export")
    kinds = {(t.dtype, t.device.type) for t in (*model.parameters(), *model.buffers()) if t.is_floating_point()}
    if kinds - {(torch.float32, "cpu")}:  # the sample and the onnxruntime check are float32 images on the CPU
        found = ", ".join(sorted(f"{str(dtype).removeprefix('torch.')} on {device}" for dtype, device in kinds))
        raise ValueError(f"export_onnx takes a float32 model on the CPU; this one is {found} (model.float().cpu())")
    model = merged_copy(model, form)
    if wrap is not None:
        model = wrap(model).eval()
    h, w = _image_size(image_size)
    sample = torch.rand(2, 3, h, w, generator=torch.Generator().manual_seed(seed))
    sizes = _batch_sizes(batch_sizes)
    _refuse_non_image_model(model, sample, "export_onnx")
    path = Path(path)
    with atomic_path(path) as tmp:
        program = torch.onnx.export(
            model,
            (sample,),
            dynamo=True,
            input_names=["images"],
            output_names=[output_name],
            dynamic_shapes=({0: _batch()},),
            verbose=False,
        )
        program.save(str(tmp))
        difference = _check(model, tmp, (h, w), sizes, seed)
        if difference is not None and not difference <= tolerance:
            raise RuntimeError(
                f"the exported model differs from PyTorch's by {difference:.1e} (relative) > {tolerance:g}; "
                f"{path} was not written"
            )
    return ExportCheck(path, difference, sizes)


def export_onnx_with_inputs(
    module: nn.Module,
    path: str | os.PathLike,
    inputs: tuple[torch.Tensor, ...],
    names: Sequence[str],
    *,
    output_name: str = "gaze",
) -> Path:
    """Write any module of tensor inputs (each with a leading batch axis, exported as dynamic) as ONNX, e.g.
    :class:`alfa.serve.MixedBatchModel` with every layer's per-sample mix as an input; its output is named
    ``output_name``. Not checked here: compare with onnxruntime on your own inputs (the tests do)."""
    output_name = _output_name(output_name)
    _needs("onnxscript", "ONNX export")
    batch = _batch()
    shapes = _dynamic_shapes(module, len(inputs), batch)
    path = Path(path)
    with atomic_path(path) as tmp, _restoring_mode(module):
        program = torch.onnx.export(
            module.eval(),
            inputs,
            dynamo=True,
            input_names=list(names),
            output_names=[output_name],
            dynamic_shapes=shapes,
            verbose=False,
        )
        program.save(str(tmp))
    return path


def _dynamic_shapes(module: nn.Module, count: int, batch: Any) -> tuple[Any, ...]:
    """Each of ``count`` inputs with a dynamic batch axis, shaped as ``module.forward`` takes them: one entry per
    named parameter, and those a ``*args`` parameter gathers as one tuple (``MixedBatchModel(images, *mixes)``)."""
    params = list(inspect.signature(module.forward).parameters.values())
    gathered = next((i for i, p in enumerate(params) if p.kind is inspect.Parameter.VAR_POSITIONAL), None)
    if gathered is None or gathered >= count:
        return tuple({0: batch} for _ in range(count))
    return (*({0: batch} for _ in range(gathered)), tuple({0: batch} for _ in range(count - gathered)))


@contextlib.contextmanager
def _restoring_mode(module: nn.Module) -> Iterator[None]:
    """The caller's module back in the modes it was given in, each submodule's (exported in eval mode): a train-mode
    wrapper around an eval-mode model must not come back with the model in train mode (its dropout on)."""
    modes = [(m, m.training) for m in module.modules()]
    try:
        yield
    finally:
        for m, training in modes:
            m.training = training


@torch.no_grad()
def _check(model: nn.Module, path: Path, image_size: tuple[int, int], batch_sizes: Sequence[int], seed: int):
    if importlib.util.find_spec("onnxruntime") is None:
        return None
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    worst = 0.0
    g = torch.Generator().manual_seed(seed + 1)
    for n in batch_sizes:
        x = torch.rand(n, 3, *image_size, generator=g)
        ours = model(x)
        theirs = torch.from_numpy(session.run(None, {"images": x.numpy()})[0])
        worst = max(worst, float((theirs - ours).norm() / ours.norm().clamp_min(1e-12)))
    return worst


def export_program(
    model: nn.Module,
    image_size: tuple[int, int],
    form: str | None = None,
    wrap: Callable[[nn.Module], nn.Module] | None = None,
    seed: int = 0,
) -> torch.export.ExportedProgram:
    """``torch.export`` of the merged model (inside ``wrap``'s module, as for :func:`export_onnx`) with a dynamic
    batch axis (for ExecuTorch, AOTInductor, ...); an image model, refused in one line otherwise, as there. The
    example input it traces (and the saved program keeps) is drawn from ``seed``: the same model exports to the
    same program."""
    model = merged_copy(model, form)
    if wrap is not None:
        model = wrap(model).eval()
    sample = torch.rand(2, 3, *_image_size(image_size), generator=torch.Generator().manual_seed(seed))
    _refuse_non_image_model(model, sample, "export_program")
    return torch.export.export(model, (sample,), dynamic_shapes=({0: _batch()},))
