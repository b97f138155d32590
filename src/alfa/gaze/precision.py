"""The floating-point precision of a run's model forwards: fp32, or bf16 / fp16 under ``torch.autocast``.

Source training records its precision in its :class:`~alfa.gaze.train.TrainConfig`: a model trained in
another precision is another model, so the precision is part of its recipe (and of the cache keys hashed
from it). Evaluation and personalization take the precision of the run instead, which the caller sets around
them with :func:`forward_precision`; every model forward of :mod:`alfa.gaze.evaluate`,
:mod:`alfa.gaze.personalize` and TPGaze's meta-training runs under :func:`autocast` of it, while their
losses, optimizer steps and scores stay in fp32. A context rather than an argument, so that one setting
reaches every forward of a long chain (the demo, the benchmark) without threading it through each call;
fp32, the default, runs exactly as if this module did not exist.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

import torch

__all__ = [
    "PRECISIONS",
    "AUTOCAST_DTYPES",
    "check_precision",
    "default_precision",
    "forward_precision",
    "run_precision",
    "autocast",
    "grad_scaler",
]

PRECISIONS = ("fp32", "bf16", "fp16")
"""fp32, or bf16 / fp16 autocast of the forwards (on CUDA and on the CPU). Training in fp16 also scales the
loss (``torch.amp.GradScaler``), since its gradients underflow otherwise."""
AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}

_RUN_PRECISION: ContextVar[str] = ContextVar("alfa_run_precision", default="fp32")


def check_precision(precision: str) -> str:
    """``precision`` itself if it is one of :data:`PRECISIONS`, else a ``ValueError`` naming them."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    return precision


def default_precision(device: torch.device) -> str:
    """bf16 on CUDA (fp32's range at half the memory traffic), fp32 on the CPU (reproducible to the bit)."""
    return "bf16" if device.type == "cuda" else "fp32"


@contextlib.contextmanager
def forward_precision(precision: str) -> Iterator[None]:
    """Run the evaluation and personalization forwards inside the block in ``precision``."""
    token = _RUN_PRECISION.set(check_precision(precision))
    try:
        yield
    finally:
        _RUN_PRECISION.reset(token)


def run_precision() -> str:
    """The precision :func:`forward_precision` set for the current block (fp32 outside any)."""
    return _RUN_PRECISION.get()


def autocast(device: torch.device, precision: str | None = None) -> torch.autocast:
    """``torch.autocast`` on ``device``'s type for bf16 / fp16; for fp32, autocast switched off (so an
    enclosing autocast cannot lower an fp32 run either). ``precision`` defaults to :func:`run_precision`."""
    dtype = AUTOCAST_DTYPES.get(run_precision() if precision is None else precision)
    return torch.autocast(device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None)


def grad_scaler(device: torch.device, precision: str | None = None) -> torch.amp.GradScaler:
    """fp16's gradient scaler for training on ``device``; for fp32 and bf16 one that is switched off, whose
    ``scale``, ``step`` and ``update`` are plain ``loss``, ``optimizer.step()`` and nothing."""
    precision = run_precision() if precision is None else precision
    return torch.amp.GradScaler(device.type, enabled=precision == "fp16")
