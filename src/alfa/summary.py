"""A one-call summary of a model's parameters: total, trainable, and per layer kind.

It sits above :mod:`alfa.adapters` (it names an adapted layer by its method), next to the training and
benchmark code that reports sizes; nothing in ``adapters`` or below imports it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import nn

from .adapters.layer import AdaptedLayer
from .layers import is_conv1d
from .surgery import require_module

__all__ = ["ParameterSummary", "parameter_summary", "print_trainable_parameters", "trainable_parameters_line"]


@dataclass
class KindCount:
    """How many layers of one kind a model holds, their parameters, and how many of those train."""

    layers: int = 0
    params: int = 0
    trainable: int = 0


@dataclass
class ParameterSummary:
    """Parameter counts of a model. ``by_kind`` maps a layer kind (``FactorizedConv2d``,
    ``Conv2d (dense)``, ``BatchNorm2d``, ``adapter: alfa``...) to its layer and parameter counts."""

    total: int
    trainable: int
    by_kind: dict[str, KindCount] = field(default_factory=dict)

    @property
    def frozen(self) -> int:
        return self.total - self.trainable

    def __str__(self) -> str:
        rows = [("kind", "layers", "params", "trainable")]
        for kind, c in sorted(self.by_kind.items(), key=lambda kv: -kv[1].params):
            rows.append((kind, str(c.layers), _fmt(c.params), _fmt(c.trainable)))
        rows.append(("total", "", _fmt(self.total), _fmt(self.trainable)))
        widths = [max(len(r[i]) for r in rows) for i in range(4)]
        out = []
        for i, r in enumerate(rows):
            out.append("  ".join(c.ljust(w) if j == 0 else c.rjust(w) for j, (c, w) in enumerate(zip(r, widths))))
            if i == 0 or i == len(rows) - 2:
                out.append("  ".join("-" * w for w in widths))
        return "\n".join(out)

    def to_dict(self) -> dict:
        return {
            "total": self.total,
            "trainable": self.trainable,
            "by_kind": {k: vars(v).copy() for k, v in self.by_kind.items()},
        }


def _fmt(n: int) -> str:
    if n >= 1_000_000:
        return f"{n / 1e6:.3f} M"
    if n >= 1_000:
        return f"{n / 1e3:.1f} k"
    return str(n)


def _kind(module: nn.Module) -> str:
    if isinstance(module, AdaptedLayer):
        return f"adapter: {module.config.method}"
    name = type(module).__name__
    if (isinstance(module, (nn.Linear, nn.Conv2d)) or is_conv1d(module)) and not name.startswith("Factorized"):
        return f"{name} (dense)"
    return name


def parameter_summary(model: nn.Module) -> ParameterSummary:
    """Count every parameter once, attributed to the module that directly owns it.

    An adapted layer's own tensors count as ``adapter: <method>``; the frozen base layer it wraps
    keeps its own kind, so the summary shows what the base costs and what the adapter adds.
    """
    require_module(model, "parameter_summary")
    by_kind: dict[str, KindCount] = {}
    total = trainable = 0
    seen: set[int] = set()
    for module in model.modules():
        own = [p for p in module.parameters(recurse=False) if id(p) not in seen]
        if not own:
            continue
        seen.update(id(p) for p in own)
        c = by_kind.setdefault(_kind(module), KindCount())
        c.layers += 1
        for p in own:
            c.params += p.numel()
            total += p.numel()
            if p.requires_grad:
                c.trainable += p.numel()
                trainable += p.numel()
    return ParameterSummary(total=total, trainable=trainable, by_kind=by_kind)


def trainable_parameters_line(model: nn.Module) -> str:
    """One line, ``trainable params: 12,345 || all params: 11,200,000 || trainable%: 0.1102``: the parameters of
    ``model`` as it is now (each counted once; with several adapters attached, the base and the active one: the
    others are out of the model) and those an optimizer would update (``requires_grad``)."""
    s = parameter_summary(model)
    share = 100.0 * s.trainable / s.total if s.total else 0.0
    return f"trainable params: {s.trainable:,} || all params: {s.total:,} || trainable%: {share:.4f}"


def print_trainable_parameters(model: nn.Module) -> str:
    """Print :func:`trainable_parameters_line` and return it."""
    line = trainable_parameters_line(model)
    print(line)
    return line
