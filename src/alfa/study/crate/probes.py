"""Layer-by-layer probes of CRATE's claims (spec crate.md §3): per-head coding rate and sparsity.

For every layer ``ℓ`` and every image, a forward hook records

* the per-head coding rate ``R(U_kᵀ z; ε)`` of the layer's tokens (each token scaled to unit length,
  ``p = q`` the head dimension, see :func:`alfa.study.crate.coding_rate.head_coding_rates`); summed over the
  heads it is the layer's ``R_c``. On CRATE the hook sits on ``blocks.ℓ.attn.subspaces``, whose output
  is ``U_kᵀ LN(z)`` for all heads at once. On the plain ViT it sits on ``blocks.ℓ.attn.qkv`` and
  reads one of the query/key/value projections per head (``vit_projection``, default the value).
* CRATE only: the fraction of non-zero coordinates of ``blocks.ℓ.ista``'s output (all tokens).

Hooks attach to whatever module sits at those paths, so probes also work on truncated models and
with an adapter attached — as long as the probe is attached *after* :func:`alfa.truncate` /
:func:`alfa.attach` (which replace the modules). Rates are computed inside the hook, so nothing
but a few numbers per image is kept.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from alfa.fileio import atomic_path
from alfa.models.crate import CrateBlock
from alfa.models.vit import ViTBlock

from .coding_rate import head_coding_rates

__all__ = ["DEFAULT_PROBE_EPS", "ProbeResult", "LayerProbe", "probe_model", "plot_probes"]

# ε² = 0.01, the constant of the CRATE authors' own coding-rate probe.
DEFAULT_PROBE_EPS = 0.1
_VIT_PROJECTIONS = {"query": 0, "key": 1, "value": 2}


@dataclass
class ProbeResult:
    """What a :class:`LayerProbe` recorded: ``coding_rate`` is ``(images, layers, heads)`` in bits,
    ``sparsity`` is ``(images, layers)`` (fraction of non-zero coordinates after ISTA), ``None`` for
    models without ISTA."""

    model: str
    eps: float
    coding_rate: Tensor
    sparsity: Tensor | None

    @property
    def num_layers(self) -> int:
        return self.coding_rate.shape[1]

    @property
    def num_images(self) -> int:
        return self.coding_rate.shape[0]

    def layer_rate(self) -> Tensor:
        """``R_c`` per image and layer ``(images, layers)``: the per-head rates summed over heads."""
        return self.coding_rate.sum(-1)

    def table(self) -> str:
        """Per layer: mean ± std over images of ``R_c`` and of the non-zero fraction."""
        rc = self.layer_rate()
        lines = [f"{self.model}: {self.num_images} images, eps = {self.eps}", "layer   R_c (bits)           non-zero"]
        for layer in range(self.num_layers):
            std = rc[:, layer].std().item() if self.num_images > 1 else 0.0
            row = f"{layer + 1:5d}  {rc[:, layer].mean().item():9.2f} ± {std:7.2f}"
            if self.sparsity is not None:
                s = self.sparsity[:, layer]
                s_std = s.std().item() if self.num_images > 1 else 0.0
                row += f"   {s.mean().item():.3f} ± {s_std:.3f}"
            lines.append(row)
        return "\n".join(lines)

    def to_dict(self) -> dict:
        rc = self.layer_rate()
        out = {
            "model": self.model,
            "eps": self.eps,
            "images": self.num_images,
            "coding_rate_per_head": self.coding_rate.mean(0).tolist(),
            "coding_rate": rc.mean(0).tolist(),
        }
        if self.sparsity is not None:
            out["nonzero_fraction"] = self.sparsity.mean(0).tolist()
        return out


def _probe_sites(model: nn.Module, vit_projection: str) -> list[tuple[str, Callable[[Tensor], Tensor], str | None]]:
    """``(coding-rate module path, output → (b, heads, n, q), ISTA module path or None)`` per layer."""
    if vit_projection not in _VIT_PROJECTIONS:
        raise ValueError(f"vit_projection must be one of {sorted(_VIT_PROJECTIONS)}, got {vit_projection!r}")
    blocks = getattr(model, "blocks", None)
    if not isinstance(blocks, nn.ModuleList) or len(blocks) == 0:
        raise TypeError(f"probes need a CRATE or VisionTransformer (a `blocks` list), got {type(model).__name__}")
    sites = []
    for i, block in enumerate(blocks):
        if isinstance(block, CrateBlock):
            sites.append((f"blocks.{i}.attn.subspaces", block.attn.split_heads, f"blocks.{i}.ista"))
        elif isinstance(block, ViTBlock):
            which = _VIT_PROJECTIONS[vit_projection]

            def split(out: Tensor, attn=block.attn, which=which) -> Tensor:
                return attn.split_heads(out)[which]

            sites.append((f"blocks.{i}.attn.qkv", split, None))
        else:
            raise TypeError(f"blocks.{i} is a {type(block).__name__}, neither a CrateBlock nor a ViTBlock")
    return sites


class LayerProbe:
    """Forward hooks recording the per-head coding rate and (CRATE) the ISTA sparsity of every layer.

    Use as a context manager; every forward pass inside adds its images::

        with LayerProbe(model, eps=0.1) as probe:
            model(images_a)
            model(images_b)
        print(probe.result().table())
    """

    def __init__(self, model: nn.Module, eps: float = DEFAULT_PROBE_EPS, vit_projection: str = "value") -> None:
        if not eps > 0:
            raise ValueError(f"eps must be positive, got {eps}")
        self.model = model
        self.eps = eps
        self.sites = _probe_sites(model, vit_projection)
        self._rates: list[list[Tensor]] = [[] for _ in self.sites]
        self._nonzero: list[list[Tensor]] = [[] for _ in self.sites]
        self._handles: list[torch.utils.hooks.RemovableHandle] = []

    def attach(self) -> LayerProbe:
        if self._handles:
            raise RuntimeError("the probe is already attached")
        for layer, (rate_path, split, ista_path) in enumerate(self.sites):
            self._handles.append(
                self.model.get_submodule(rate_path).register_forward_hook(self._rate_hook(layer, split))
            )
            if ista_path is not None:
                self._handles.append(self.model.get_submodule(ista_path).register_forward_hook(self._ista_hook(layer)))
        return self

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def __enter__(self) -> LayerProbe:
        return self.attach()

    def __exit__(self, *exc) -> None:
        self.remove()

    def reset(self) -> None:
        """Forget everything recorded so far."""
        for records in (*self._rates, *self._nonzero):
            records.clear()

    def _rate_hook(self, layer: int, split: Callable[[Tensor], Tensor]):
        def hook(module: nn.Module, inputs: tuple, output: Tensor) -> None:
            with torch.no_grad():
                self._rates[layer].append(head_coding_rates(split(output.detach()), self.eps).cpu())

        return hook

    def _ista_hook(self, layer: int):
        def hook(module: nn.Module, inputs: tuple, output: Tensor) -> None:
            with torch.no_grad():
                self._nonzero[layer].append((output.detach() != 0).flatten(1).to(torch.float64).mean(1).cpu())

        return hook

    def result(self) -> ProbeResult:
        counts = {sum(len(r) for r in records) for records in self._rates}
        if counts == {0}:
            raise RuntimeError("the probe has recorded nothing: run the model inside `with probe:` first")
        if len(counts) != 1:
            raise RuntimeError("layers recorded different numbers of images (a forward pass was interrupted?)")
        rates = torch.stack([torch.cat(records) for records in self._rates], dim=1)
        sparsity = None
        if all(ista is not None for _, _, ista in self.sites):
            sparsity = torch.stack([torch.cat(records) for records in self._nonzero], dim=1)
        return ProbeResult(model=type(self.model).__name__, eps=self.eps, coding_rate=rates, sparsity=sparsity)


@torch.no_grad()
def probe_model(
    model: nn.Module,
    images: Tensor | Iterable[Tensor],
    eps: float = DEFAULT_PROBE_EPS,
    batch_size: int = 64,
    vit_projection: str = "value",
) -> ProbeResult:
    """Run ``model`` in eval mode over ``images`` (one tensor, cut into batches, or an iterable of
    batches) with a :class:`LayerProbe` attached; the model's train/eval mode is restored after."""
    was_training = model.training
    model.eval()
    try:
        batches = images.split(batch_size) if isinstance(images, Tensor) else images
        with LayerProbe(model, eps, vit_projection) as probe:
            for batch in batches:
                model(batch)
        return probe.result()
    finally:
        model.train(was_training)


def plot_probes(results: ProbeResult | dict[str, ProbeResult], path: str | os.PathLike) -> None:
    """Two panels against depth: ``R_c`` (sum over heads; mean ± std over images) and the non-zero
    fraction after ISTA (models without ISTA are left out of the second panel). Writes a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if isinstance(results, ProbeResult):
        results = {results.model: results}
    fig, (ax_rate, ax_sparse) = plt.subplots(1, 2, figsize=(10, 3.8))
    for label, res in results.items():
        layers = range(1, res.num_layers + 1)
        rc = res.layer_rate()
        mean, std = rc.mean(0).numpy(), (rc.std(0) if res.num_images > 1 else torch.zeros_like(rc[0])).numpy()
        (line,) = ax_rate.plot(layers, mean, marker="o", ms=3, label=label)
        ax_rate.fill_between(layers, mean - std, mean + std, color=line.get_color(), alpha=0.2)
        if res.sparsity is not None:
            s = res.sparsity
            s_mean = s.mean(0).numpy()
            s_std = (s.std(0) if res.num_images > 1 else torch.zeros_like(s[0])).numpy()
            ax_sparse.plot(layers, s_mean, marker="o", ms=3, color=line.get_color(), label=label)
            ax_sparse.fill_between(layers, s_mean - s_std, s_mean + s_std, color=line.get_color(), alpha=0.2)
    eps = ", ".join(sorted({f"{res.eps:g}" for res in results.values()}))
    ax_rate.set(xlabel="layer", ylabel="R_c (bits, sum over heads)", title=f"coding rate of the tokens (ε = {eps})")
    ax_sparse.set(xlabel="layer", ylabel="non-zero fraction", title="after ISTA", ylim=(0, 1.02))
    ax_rate.legend(fontsize=8)
    if ax_sparse.lines:
        ax_sparse.legend(fontsize=8)
    fig.tight_layout()
    with atomic_path(path) as tmp:  # the temporary name keeps the suffix: matplotlib picks the format by it
        fig.savefig(tmp, dpi=120)
    plt.close(fig)
