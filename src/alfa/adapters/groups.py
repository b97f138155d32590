"""Optimizer parameter groups of a model's trainable parameters (the adapter's, once one is attached)."""

from __future__ import annotations

import math
import re
from typing import Any

from torch import nn

__all__ = ["param_groups"]


def param_groups(
    model: nn.Module,
    lr: float,
    lr_scale: dict[str, float] | None = None,
    weight_decay: float | None = 0.0,
) -> list[dict[str, Any]]:
    """Optimizer-ready parameter groups of the trainable parameters, split by name.

    ``lr_scale`` maps a regular expression over parameter names to a learning-rate factor; the
    first pattern that matches wins, e.g. ``{r"^layer[34]\\.": 10.0}`` gives ResNet-18's last two
    stages a 10× learning rate (the paper's recipe). Each group carries a ``name``. A pattern that matches no
    trainable parameter is refused (``ValueError`` naming it and some of the parameters), like a ``target`` that
    matches no layer.

    ``weight_decay`` is written into every group, so it **overrides the optimizer's own default**
    (``torch.optim.AdamW`` alone would decay by 0.01). The default, ``0.0``, keeps the numbers of the callers that
    do not pass it (the cost and speed benchmarks, the library tour) comparable with their committed records; the
    gaze stack passes its configs' value explicitly (``PersonalizeConfig.weight_decay``, 0.01 by default). Pass
    ``None`` to leave the key out and let the optimizer's ``weight_decay`` apply.
    """
    if not (is_number(lr) and lr > 0 and math.isfinite(lr)):
        raise ValueError(f"param_groups: lr must be a positive, finite number, got {lr!r}")
    if weight_decay is not None and not (is_number(weight_decay) and 0 <= weight_decay < math.inf):
        raise ValueError(
            f"param_groups: weight_decay must be a non-negative, finite number or None, got {weight_decay!r}"
        )
    scales = dict(lr_scale or {})
    compiled = {pat: _compiled_scale(pat, scale) for pat, scale in scales.items()}
    groups: dict[str, list[nn.Parameter]] = {"default": []}
    groups.update({pat: [] for pat in scales})
    trainable = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    for name, p in trainable:
        key = next((pat for pat, rx in compiled.items() if rx.search(name)), "default")
        groups[key].append(p)
    if not any(groups.values()):
        raise ValueError("the model has no trainable parameters (attach an adapter first)")
    _refuse_unmatched(compiled, [name for name, _ in trainable])
    out = []
    for key, ps in groups.items():
        if ps:
            group: dict[str, Any] = {"name": key, "params": ps, "lr": lr * scales.get(key, 1.0)}
            if weight_decay is not None:
                group["weight_decay"] = weight_decay
            out.append(group)
    return out


def _refuse_unmatched(compiled: dict[str, re.Pattern[str]], names: list[str]) -> None:
    """A pattern that matches no trainable parameter is refused, as a ``target`` that matches nothing is: a typo
    (``"^layr4"``) would otherwise leave every parameter at the base rate without a word."""
    for pattern, rx in compiled.items():
        if not any(rx.search(name) for name in names):
            shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
            raise ValueError(
                f"param_groups: lr_scale pattern {pattern!r} matches no trainable parameter (re.search over their "
                f"names: {shown})"
            )


def _compiled_scale(pattern: str, scale: float) -> re.Pattern[str]:
    """``pattern`` compiled, after checking it and its factor: a factor <= 0 would give its group lr <= 0, which
    the optimizer takes without a word (a frozen or reversed group), so it is refused here."""
    try:
        good = scale > 0 and math.isfinite(scale)
    except TypeError:
        good = False
    if not good:
        raise ValueError(f"param_groups: lr_scale[{pattern!r}] must be a positive finite factor of lr, got {scale!r}")
    try:
        return re.compile(pattern)
    except (re.error, TypeError) as e:
        raise ValueError(f"param_groups: lr_scale pattern {pattern!r} is not a valid regular expression: {e}") from e


def is_number(value: Any) -> bool:
    """An ``int`` or a ``float``, not a ``bool`` (which Python counts as an ``int``)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)
