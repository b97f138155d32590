"""The benchmark's figures: SVD rank-slice maps, personalized update maps, and error-vs-setting plots.

The two figures that need models are computed by the benchmark run, which has them, and stored as
data next to ``results.json`` (``figure_data/*.safetensors``: tensors plus a JSON header); the report
command renders every figure from those files and from ``results.json``, so it never needs a model. Each
figure is saved with what it plots beside it (:func:`alfa.study.plotted.save_figure`).

* **Rank-slice maps** (the paper's Figure 4): a truncated layer computes ``Σ_s U_d[:, s] (V_base[s] ∗ x)``
  where ``V_base[s] = S_d[s] V_d[s]`` is one filter of the dictionary. The map of slice ``s`` is that
  filter's response ``V_base[s] ∗ x`` on the layer's input (times ``‖U_d[:, s]‖``, 1 for canonical
  factors): the channel norm of the rank-one component ``U_d[:, s] S_d[s] V_d[s]``'s output. Shown for
  two persons side by side, on a shared colour scale per slice.
* **Update maps** (Figure 5): the personalized ``ΔW`` (``m × n``) of one layer for three persons, for Alfa
  and LoRA, shown as the norm over kernel positions (``m × in``) and as the singular values of ``ΔW``.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from alfa.adapters import adapted_layers, detach, load_adapter
from alfa.checkpoint import read_tagged, write_tagged
from alfa.layers import is_factorized

from ..plotted import save_figure

__all__ = [
    "numerical_rank",
    "singular_values",
    "save_figure_data",
    "load_figure_data",
    "rank_slice_data",
    "update_data",
    "plot_rank_slices",
    "plot_update_maps",
    "update_map_methods",
    "plot_curves",
]

FIGURE_FORMAT = "alfa-bench-figure"
DPI = 130


def save_figure_data(path: str | os.PathLike, tensors: Mapping[str, Tensor], meta: dict[str, Any]) -> Path:
    """Write figure tensors and a JSON header to ``path`` (safetensors), atomically."""
    data = {k: t.detach().cpu().float().contiguous() for k, t in tensors.items()}
    return write_tagged(path, data, FIGURE_FORMAT, meta)


def load_figure_data(path: str | os.PathLike) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """Read what :func:`save_figure_data` wrote; a ``ValueError`` naming the file if it is not that."""
    return read_tagged(path, FIGURE_FORMAT, "a benchmark figure data file")


# ----------------------------------------------------------------------------- data (needs the model)


@torch.no_grad()
def rank_slice_data(
    model: nn.Module, layer: str, images: Tensor, slices: Sequence[int]
) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """The response maps of dictionary slices ``slices`` of the factorized ``layer`` on ``images``.

    Returns tensors ``images`` (N, 3, H, W), ``maps`` (N, S, h, w) (signed) and ``singular_values``
    (d,), and a header with the layer, the slices kept (those below ``d``) and ``d``.
    """
    module = model.get_submodule(layer)
    if not is_factorized(module):
        raise ValueError(f"{layer} is not a factorized layer; rank-slice maps need one")
    captured: dict[str, Tensor] = {}

    def hook(_m: nn.Module, args: tuple, _out: Tensor) -> None:
        captured.setdefault("x", args[0].detach())

    was_training = model.training
    model.eval()
    handle = module.register_forward_hook(hook)
    try:
        model(images.to(module.U.device))
    finally:
        handle.remove()
        model.train(was_training)
    U, V = module.U.detach(), module.V.detach()
    d = V.shape[0]
    kept = [int(s) for s in slices if 0 <= int(s) < d]
    if not kept:
        raise ValueError(f"none of the slices {list(slices)} is below d = {d}")
    responses = module.spec.input_op(captured["x"], V)  # (N, d, h, w)
    u_norm = U.norm(dim=0)
    maps = responses[:, kept] * u_norm[kept][None, :, None, None]
    singular = V.norm(dim=1) * u_norm
    meta = {"layer": layer, "slices": kept, "d": d, "map_size": list(maps.shape[-2:])}
    tensors = {"images": images.detach(), "maps": maps, "singular_values": singular}
    return {k: v.cpu() for k, v in tensors.items()}, meta


@torch.no_grad()
def update_data(
    base: nn.Module, adapters: Mapping[str, str | os.PathLike], layer: str
) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """``ΔW`` of ``layer`` for each person's adapter file (loaded onto ``base`` one at a time, then
    detached). Returns ``{person: ΔW (m×n)}`` and a header with the layer's geometry."""
    tensors: dict[str, Tensor] = {}
    meta: dict[str, Any] = {"layer": layer}
    for person, path in adapters.items():
        load_adapter(base, path)
        try:
            layers = adapted_layers(base)
            if layer not in layers:
                raise ValueError(f"{path}: the adapter does not adapt {layer} (it adapts {sorted(layers)[:4]} ...)")
            adapted = layers[layer]
            tensors[person] = adapted.delta_weight().detach().cpu().clone()
            spec = adapted.spec
            meta.update(
                {
                    "m": spec.m,
                    "n": spec.n,
                    "in_features": spec.in_features,
                    "kernel": list(spec.kernel_size),
                    "kind": spec.kind,
                }
            )
        finally:
            detach(base)
    return tensors, meta


# ----------------------------------------------------------------------------- rendering


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_rank_slices(tensors: Mapping[str, Tensor], meta: dict[str, Any], path: str | os.PathLike) -> Path:
    """Rows: the persons; columns: the face, then the response of each dictionary slice over it."""
    plt = _plt()
    images, maps = tensors["images"], tensors["maps"].abs()
    singular = tensors["singular_values"]
    slices, persons = meta["slices"], meta.get("persons", [f"#{i}" for i in range(images.shape[0])])
    n, s = maps.shape[0], maps.shape[1]
    size = images.shape[-2:]
    up = F.interpolate(maps, size=size, mode="bilinear", align_corners=False)
    fig, axes = plt.subplots(n, s + 1, figsize=(1.9 * (s + 1), 2.0 * n + 0.5), squeeze=False)
    for i in range(n):
        face = images[i].permute(1, 2, 0).clamp(0, 1).numpy()
        axes[i][0].imshow(face)
        axes[i][0].set_title(f"person {persons[i]}", fontsize=8)
        gray = images[i].mean(0).numpy()
        for j in range(s):
            vmax = float(up[:, j].max()) or 1.0
            ax = axes[i][j + 1]
            ax.imshow(gray, cmap="gray")
            ax.imshow(up[i, j].numpy(), cmap="inferno", alpha=0.65, vmin=0.0, vmax=vmax)
            if i == 0:
                ax.set_title(f"slice {slices[j]} (s_d={float(singular[slices[j]]):.2f})", fontsize=8)
    for ax in axes.flat:
        ax.set_xticks([])
        ax.set_yticks([])
    fig.suptitle(
        f"{meta['layer']}: response |V_base[s] ∗ x| of dictionary slices s (d = {meta['d']}), "
        f"{meta.get('target', '')}; colour scale shared per slice",
        fontsize=9,
    )
    fig.tight_layout()
    return save_figure(fig, path, dpi=DPI)


RANK_RTOL = 1e-3
"""A singular value of an update counts toward its numerical rank above this fraction of the largest (the pages
quote it, and the update maps draw it)."""


def numerical_rank(delta: Tensor, rtol: float = RANK_RTOL) -> int:
    """The number of singular values of ``delta`` above ``rtol`` times the largest."""
    sv = singular_values(delta)
    return int((sv > rtol * sv[0]).sum()) if sv.numel() and sv[0] > 0 else 0


_SINGULAR_VALUES: dict[tuple[Any, ...], Tensor] = {}
_SINGULAR_VALUES_KEPT = 64
_SINGULAR_VALUES_LOCK = threading.Lock()  # pages may be drawn from threads: the eviction reads then deletes


def singular_values(delta: Tensor) -> Tensor:
    """``torch.linalg.svdvals`` of ``delta`` in float64 (on the CPU), remembered by ``delta``'s dtype, shape and
    bytes: a report draws the singular values of each update it shows and quotes its rank in both of its renderings,
    three SVDs of the same values, each of them a large share of a page's time on a busy machine."""
    data = delta.detach().cpu().contiguous()
    digest = hashlib.blake2b(data.reshape(-1).view(torch.uint8).numpy()).digest()
    key = (data.dtype, tuple(data.shape), digest)
    with _SINGULAR_VALUES_LOCK:
        known = _SINGULAR_VALUES.get(key)
    if known is None:
        known = torch.linalg.svdvals(data.double())
        with _SINGULAR_VALUES_LOCK:
            if len(_SINGULAR_VALUES) >= _SINGULAR_VALUES_KEPT:
                del _SINGULAR_VALUES[next(iter(_SINGULAR_VALUES))]
            _SINGULAR_VALUES[key] = known
    return known.clone()


def _kernel_norm_map(delta: Tensor, meta: dict[str, Any]) -> Tensor:
    """``ΔW`` (m×n) as an ``m × in`` map: the norm over each kernel's positions."""
    m, cin = meta["m"], meta["in_features"]
    kh, kw = meta.get("kernel", [1, 1])
    return delta.reshape(m, cin, kh * kw).norm(dim=-1)


def update_map_methods(meta: dict[str, Any]) -> list[str]:
    """The methods of the update-map data ``meta``, in the figure's row order: Alfa, LoRA, then the others by name."""
    order = {"alfa": 0, "lora": 1}
    return sorted(meta.get("methods", {}), key=lambda m: (order.get(m, 2), m))


def plot_update_maps(tensors: Mapping[str, Tensor], meta: dict[str, Any], path: str | os.PathLike) -> Path:
    """Rows: the methods (e.g. Alfa, LoRA); columns: ``‖ΔW‖`` per (output, input) channel for each
    person, each on its own colour scale, then the singular values of ``ΔW`` with the numerical-rank threshold the
    pages count against."""
    plt = _plt()
    methods = update_map_methods(meta)
    if not methods:
        raise ValueError("no method in the update data")
    persons = {m: meta["methods"][m]["persons"] for m in methods}
    cols = max(len(p) for p in persons.values())
    fig, axes = plt.subplots(len(methods), cols + 1, figsize=(3.0 * (cols + 1), 2.9 * len(methods)), squeeze=False)
    for r, method in enumerate(methods):
        deltas = [tensors[f"{method}/{p}"] for p in persons[method]]
        maps = [_kernel_norm_map(d, meta) for d in deltas]
        for c in range(cols):
            ax = axes[r][c]
            if c >= len(maps):
                ax.axis("off")
                continue
            # each person on a scale of its own: one person's update can be ten times another's (the titles give
            # the sizes), and a shared scale paints the smaller ones black
            im = ax.imshow(maps[c].numpy(), cmap="magma", vmin=0.0, aspect="auto", interpolation="nearest")
            ax.set_title(f"{method}, {persons[method][c]}: ‖ΔW‖_F = {float(deltas[c].norm()):.3g}", fontsize=8)
            ax.set_xlabel("input channel", fontsize=7)
            ax.set_ylabel("output channel", fontsize=7)
            ax.tick_params(labelsize=6)
            bar = fig.colorbar(im, ax=ax, fraction=0.046)
            bar.set_label("‖ΔW‖ over the kernel", fontsize=7)
            bar.ax.tick_params(labelsize=6)
        ax = axes[r][cols]
        for p, d in zip(persons[method], deltas):
            sv = singular_values(d)
            ax.semilogy(torch.arange(1, len(sv) + 1).numpy(), (sv / sv[0].clamp_min(1e-30)).numpy(), label=p)
        ax.axhline(RANK_RTOL, color="0.4", linestyle=":", linewidth=1.0, label=f"rank threshold {RANK_RTOL:g}")
        ax.set_title(f"{method}: singular values of ΔW / σ₁", fontsize=8)
        ax.set_xlabel("index", fontsize=7)
        ax.set_ylim(1e-6, 1.5)
        ax.legend(fontsize=6)
        ax.tick_params(labelsize=6)
        ax.grid(alpha=0.3)
    fig.suptitle(
        f"personalized update ΔW of {meta['layer']} ({meta['m']}×{meta['n']}), pair {meta.get('pair', '')}, "
        f"seed {meta.get('seed', '')}",
        fontsize=9,
    )
    fig.tight_layout()
    return save_figure(fig, path, dpi=DPI)


def plot_curves(
    curves: Mapping[str, Sequence[tuple[float, float, float | None]]],
    path: str | os.PathLike,
    *,
    xlabel: str,
    title: str,
    logx: bool = True,
    reference: float | None = None,
) -> Path:
    """Error (mean over seeds with its 95 % interval) against a setting: one line per ``"<method> <pair>"`` label,
    ``(x, mean, half-width of the interval)`` points. A pair has one colour in every figure and a method one line
    style; the lines are set a little apart along x, so that their bars do not hide each other."""
    from .methods import PAIRS

    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.2, 4.0))
    pairs = [*PAIRS, *sorted({lab.rpartition(" ")[2] for lab in curves} - set(PAIRS))]
    methods = list(dict.fromkeys(lab.rpartition(" ")[0] for lab in curves))
    palette = plt.get_cmap("tab10").colors
    styles = ["-", "--", "-.", ":"]
    for i, (label, points) in enumerate(curves.items()):
        method, _, pair = label.rpartition(" ")
        points = sorted(points)
        shift = 1.0 + 0.03 * (i - (len(curves) - 1) / 2)  # a few per cent along a log axis
        xs = [p[0] * shift if logx else p[0] for p in points]
        ys = [p[1] for p in points]
        errs = [p[2] or 0.0 for p in points]
        ax.errorbar(
            xs,
            ys,
            yerr=errs,
            marker="o",
            ls=styles[methods.index(method) % len(styles)],
            capsize=3,
            label=label,
            lw=1.3,
            ms=4,
            color=palette[pairs.index(pair) % len(palette)],
        )
    if reference is not None:
        ax.axhline(reference, color="0.5", ls=":", lw=1, label="source-only")
    if logx:
        ax.set_xscale("log", base=2)
        xs_all = sorted({p[0] for pts in curves.values() for p in pts})
        ax.set_xticks(xs_all)
        small = min(xs_all, default=1.0) < 0.01  # one notation for every tick, not 1e-06 beside 0.0001
        ax.set_xticklabels([f"{x:.0e}" if small else f"{x:g}" for x in xs_all])
        ax.minorticks_off()
    ax.set_ylim(bottom=0)  # an angular error is never below zero (a bar that reaches below is cut at the axis)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("mean angular error (deg)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, handlelength=3.2)
    fig.tight_layout()
    return save_figure(fig, path, dpi=DPI)
