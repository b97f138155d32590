"""FAZE, few-shot adaptive gaze estimation (the review, ``alfa-review.ko.txt`` §0.2): a disentangling transforming
encoder-decoder (DT-ED), a gaze MLP on its gaze code meta-learned with MAML (AdaGEN), and per person the MLP
adapted from the meta-learned start on ``k`` labelled images (PS-GEN).

DT-ED encodes an image into ``z = [zᵃ; zᵍ; zʰ]``: an appearance code, a gaze code ``zᵍ ∈ ℝ^{3×Fᵍ}`` and a head
code ``zʰ ∈ ℝ^{3×Fʰ}``. For two images ``a, b`` of one person it rotates ``a``'s gaze and head codes by the
labelled relative rotations ``R_ba = R_b R_a⁻¹`` and decodes ``x_b`` from ``[zᵃ_a; Rᵍ_ba zᵍ_a; Rʰ_ba zʰ_a]``,
so the codes must turn with the eyes and the head. Its loss is

    L = λ_recon · mean |x̂_b − x_b|  +  λ_EC · mean_i max_{j: same person} ‖R_i⁻¹ zᵍ_i − R_j⁻¹ zᵍ_j‖
        + λ_gaze · mean arccos(ĝ · g)

(reconstruction, embedding consistency of the frontalized gaze codes, angular gaze error). The rotation of a
``(yaw, pitch)`` pair is the review's ``R^(θ,φ) = R_y(φ) R_x(θ)`` (:func:`rotation_from_angles`).

One choice the review leaves open: the gaze MLP ``G`` ends in a linear layer that outputs ``(yaw, pitch)``
(the angles of ``ĝ``, the repository's label form), and the gaze loss is the angle between the unit vectors of
prediction and label, the review's ``arccos(ĝ·g / ‖ĝ‖‖g‖)``. With a linear head, every user calibration
(``alfa.gaze.calibrate``: offset, affine, ridge, last layer) applies to a FAZE model as to any gaze model.

The meta-learning (:func:`maml_gradients`) follows the review's equations: per task (a source person) ``k``
calibration and ``l`` validation samples of ``(zᵍ, g)``; ``θ' = θ − α ∇ L_c(θ)`` (``inner_steps`` times); the
outer gradient is ``∇_θ L_v(θ')`` through the inner steps (second order), or ``∇_{θ'} L_v(θ')`` (first order,
``∂θ'/∂θ ≈ I``); ``θ ← θ − η · mean over tasks``.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.func import functional_call

from alfa.adapters import CorrectionConfig, adapter_parameters, attach, detach
from alfa.models.registry import register_model

from .geometry import pitchyaw_to_vector

__all__ = [
    "DTED",
    "FazeGaze",
    "GAZE_MLP",
    "faze_gaze",
    "rotation_from_angles",
    "rotate_code",
    "angular_loss",
    "dted_losses",
    "embedding_consistency_loss",
    "maml_gradients",
    "MamlTask",
    "adapt_mlp",
    "personalize_faze",
]

GAZE_MLP = "gaze_mlp"
"""The gaze MLP's module name in :class:`FazeGaze`: what PS-GEN adapts (a ``correction`` of its linear layers)."""


def rotation_from_angles(angles: Tensor) -> Tensor:
    """``(B, 3, 3)`` rotations of ``(B, 2)`` ``(yaw, pitch)`` pairs: the review's ``R^(θ,φ) = R_y(φ) R_x(θ)`` with
    φ the yaw and θ minus the pitch (this repository's pitch is positive upward, :func:`pitchyaw_to_vector`), so
    that ``R`` turns the forward axis ``(0, 0, 1)`` into the direction of ``(yaw, pitch)``."""
    yaw, pitch = angles[:, 0], angles[:, 1]
    cy, sy, cp, sp = torch.cos(yaw), torch.sin(yaw), torch.cos(pitch), torch.sin(pitch)
    one, zero = torch.ones_like(yaw), torch.zeros_like(yaw)
    ry = torch.stack([cy, zero, sy, zero, one, zero, -sy, zero, cy], -1).view(-1, 3, 3)
    rx = torch.stack([one, zero, zero, zero, cp, sp, zero, -sp, cp], -1).view(-1, 3, 3)
    return ry @ rx


def rotate_code(rotation: Tensor, code: Tensor) -> Tensor:
    """``R z`` for a batch of ``(3, F)`` codes: every one of the ``F`` 3-vectors turned alike."""
    return rotation @ code


class DTED(nn.Module):
    """The disentangling transforming encoder-decoder on ``size×size`` RGB images.

    ``encode(x) -> (zᵃ (B, Fᵃ), zᵍ (B, 3, Fᵍ), zʰ (B, 3, Fʰ))`` and ``decode(zᵃ, zᵍ, zʰ) -> x̂ (B, 3, size, size)``
    (a sigmoid: pixels in [0, 1]). Four stride-2 convolutions down, four transposed ones up."""

    def __init__(
        self,
        image_size: int = 64,
        appearance: int = 32,
        gaze_features: int = 2,
        head_features: int = 2,
        width: int = 32,
    ) -> None:
        super().__init__()
        if image_size % 16 or image_size < 16:
            raise ValueError(f"DT-ED needs an image size that is a multiple of 16, got {image_size}")
        self.image_size, self.appearance = image_size, appearance
        self.gaze_features, self.head_features = gaze_features, head_features
        self.cells = image_size // 16
        chans = [3, width, 2 * width, 4 * width, 4 * width]
        down: list[nn.Module] = []
        for cin, cout in zip(chans[:-1], chans[1:]):
            down += [nn.Conv2d(cin, cout, 4, stride=2, padding=1), nn.BatchNorm2d(cout), nn.LeakyReLU(0.2)]
        self.encoder = nn.Sequential(*down, nn.Flatten())
        flat = chans[-1] * self.cells * self.cells
        self.to_code = nn.Linear(flat, self.code_size)
        self.from_code = nn.Linear(self.code_size, flat)
        up: list[nn.Module] = []
        rev = chans[::-1]
        for i, (cin, cout) in enumerate(zip(rev[:-1], rev[1:])):
            up.append(nn.ConvTranspose2d(cin, cout, 4, stride=2, padding=1))
            if i < len(rev) - 2:
                up += [nn.BatchNorm2d(cout), nn.LeakyReLU(0.2)]
        self.decoder = nn.Sequential(*up, nn.Sigmoid())
        self._top = chans[-1]

    @property
    def code_size(self) -> int:
        return self.appearance + 3 * self.gaze_features + 3 * self.head_features

    def encode(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        z = self.to_code(self.encoder(x))
        fa, fg = self.appearance, 3 * self.gaze_features
        za, zg, zh = z[:, :fa], z[:, fa : fa + fg], z[:, fa + fg :]
        return za, zg.reshape(-1, 3, self.gaze_features), zh.reshape(-1, 3, self.head_features)

    def decode(self, za: Tensor, zg: Tensor, zh: Tensor) -> Tensor:
        z = torch.cat([za, zg.flatten(1), zh.flatten(1)], 1)
        h = self.from_code(z).view(-1, self._top, self.cells, self.cells)
        return self.decoder(torch.nn.functional.leaky_relu(h, 0.2))

    def transformed(self, x: Tensor, gaze_rotation: Tensor, head_rotation: Tensor) -> Tensor:
        """Decode ``x`` with its gaze and head codes turned by the given ``(B, 3, 3)`` rotations."""
        za, zg, zh = self.encode(x)
        return self.decode(za, rotate_code(gaze_rotation, zg), rotate_code(head_rotation, zh))


class FazeGaze(nn.Module):
    """DT-ED plus the gaze MLP ``G: zᵍ → (yaw, pitch)``; ``forward(x)`` is the gaze estimate, so a FAZE model
    evaluates, serves and exports like any gaze model, and PS-GEN is an adapter of ``gaze_mlp``."""

    def __init__(self, dted: DTED, hidden: int = 64) -> None:
        super().__init__()
        self.dted = dted
        g = 3 * dted.gaze_features
        self.gaze_mlp = nn.Sequential(nn.Linear(g, hidden), nn.SELU(), nn.Linear(hidden, hidden), nn.SELU())
        self.gaze_mlp.append(nn.Linear(hidden, 2))

    def gaze_code(self, x: Tensor) -> Tensor:
        """The flattened gaze code ``zᵍ`` (B, 3·Fᵍ): what the MLP reads."""
        return self.dted.encode(x)[1].flatten(1)

    def forward(self, x: Tensor) -> Tensor:
        return self.gaze_mlp(self.gaze_code(x))


@register_model
def faze_gaze(
    image_size: int = 64, appearance: int = 32, gaze_features: int = 2, head_features: int = 2, width: int = 32
) -> FazeGaze:
    """A FAZE gaze model (DT-ED and the gaze MLP) for ``image_size``² images."""
    return FazeGaze(DTED(image_size, appearance, gaze_features, head_features, width))


# ----------------------------------------------------------------------------- losses


def angular_loss(pred: Tensor, target: Tensor) -> Tensor:
    """Mean angle (radians) between the unit vectors of ``(yaw, pitch)`` predictions and labels (the review's
    ``arccos(ĝ·g/‖ĝ‖‖g‖)``; the cosine is kept just inside ±1, where arccos has a finite gradient)."""
    cos = (pitchyaw_to_vector(pred) * pitchyaw_to_vector(target)).sum(-1)
    return torch.arccos(cos.clamp(-1 + 1e-6, 1 - 1e-6)).mean()


def embedding_consistency_loss(zg: Tensor, gaze: Tensor, persons: Tensor) -> Tensor:
    """``mean_i max_{j: same person as i} ‖f(zᵍ_i) − f(zᵍ_j)‖`` with ``f(z) = (Rᵍ)⁻¹ z``, the frontalized code."""
    frontal = (rotation_from_angles(gaze).transpose(1, 2) @ zg).flatten(1)
    distance = torch.cdist(frontal, frontal)
    same = persons[:, None] == persons[None, :]
    return distance.masked_fill(~same, 0.0).amax(1).mean()


@dataclass(frozen=True)
class DtedLosses:
    """One step's three terms and their weighted sum."""

    recon: Tensor
    consistency: Tensor
    gaze: Tensor
    total: Tensor


def dted_losses(
    model: FazeGaze,
    pair: Sequence[Tensor],
    weights: tuple[float, float, float] = (1.0, 2.0, 0.1),
) -> DtedLosses:
    """The DT-ED loss of a batch of pairs ``(x_a, x_b, gaze_a, gaze_b, head_a, head_b, person)``: decode ``x_b``
    from ``a``'s codes turned by ``R_b R_a⁻¹``; consistency and gaze terms over both images of every pair.
    ``weights`` are ``(λ_recon, λ_EC, λ_gaze)``."""
    x_a, x_b, g_a, g_b, h_a, h_b, person = pair
    za, zg, zh = model.dted.encode(torch.cat([x_a, x_b]))
    n = x_a.shape[0]
    rg = rotation_from_angles(g_b) @ rotation_from_angles(g_a).transpose(1, 2)
    rh = rotation_from_angles(h_b) @ rotation_from_angles(h_a).transpose(1, 2)
    x_hat = model.dted.decode(za[:n], rotate_code(rg, zg[:n]), rotate_code(rh, zh[:n]))
    recon = (x_hat - x_b).abs().mean()
    gaze = torch.cat([g_a, g_b])
    consistency = embedding_consistency_loss(zg, gaze, torch.cat([person, person]))
    angular = angular_loss(model.gaze_mlp(zg.flatten(1)), gaze)
    lr, le, lg = weights
    return DtedLosses(recon, consistency, angular, lr * recon + le * consistency + lg * angular)


# ----------------------------------------------------------------------------- MAML (AdaGEN) and PS-GEN


@dataclass(frozen=True)
class MamlTask:
    """One person's task: ``k`` calibration samples ``(z_c, g_c)`` and ``l`` validation samples ``(z_v, g_v)``."""

    z_c: Tensor
    g_c: Tensor
    z_v: Tensor
    g_v: Tensor


def _inner(
    mlp: nn.Module, params: dict[str, Tensor], z: Tensor, g: Tensor, lr: float, steps: int, first_order: bool
) -> dict[str, Tensor]:
    """``steps`` gradient steps ``θ ← θ − α ∇ L_c(θ)`` on ``(z, g)``, differentiable in the start (second order)
    unless ``first_order`` (then the steps are constants of the start: ``∂θ'/∂θ = I``)."""
    for _ in range(steps):
        loss = angular_loss(functional_call(mlp, params, (z,)), g)
        grads = torch.autograd.grad(loss, list(params.values()), create_graph=not first_order)
        params = {n: p - lr * (gr.detach() if first_order else gr) for (n, p), gr in zip(params.items(), grads)}
    return params


def maml_gradients(
    mlp: nn.Module, tasks: Sequence[MamlTask], inner_lr: float, inner_steps: int = 1, first_order: bool = False
) -> tuple[dict[str, Tensor], float]:
    """The outer gradient ``∇_θ mean_tasks L_v(θ'_task)`` of ``mlp``'s parameters, and that mean loss."""
    params = dict(mlp.named_parameters())
    total = 0.0
    grads = {n: torch.zeros_like(p) for n, p in params.items()}
    for task in tasks:
        adapted = _inner(mlp, params, task.z_c, task.g_c, inner_lr, inner_steps, first_order)
        loss = angular_loss(functional_call(mlp, adapted, (task.z_v,)), task.g_v) / len(tasks)
        for (n, _), g in zip(params.items(), torch.autograd.grad(loss, list(params.values()))):
            grads[n] += g
        total += float(loss.detach())
    return grads, total


def apply_gradients(mlp: nn.Module, grads: dict[str, Tensor], optimizer: torch.optim.Optimizer) -> None:
    """The outer step: ``optimizer`` (over ``mlp``'s parameters) steps with ``grads`` as their gradients; with
    ``torch.optim.SGD`` at rate η (no momentum) that is the review's ``θ ← θ − η g``."""
    for n, p in mlp.named_parameters():
        p.grad = grads[n]
    optimizer.step()


def adapt_mlp(mlp: nn.Module, z: Tensor, g: Tensor, lr: float, steps: int) -> float:
    """PS-GEN on a bare MLP, in place: ``steps`` SGD steps of rate ``lr`` on the angular loss of ``(z, g)``;
    the loss after them."""
    with torch.enable_grad():
        start = {n: p.detach().requires_grad_() for n, p in mlp.named_parameters()}
        params = _inner(mlp, start, z, g, lr, steps, True)
    with torch.no_grad():
        for n, p in mlp.named_parameters():
            p.copy_(params[n])
        return float(angular_loss(mlp(z), g))


def personalize_faze(model: FazeGaze, images: Tensor, gaze: Tensor, lr: float, steps: int) -> float:
    """PS-GEN for one person: the gaze MLP adapted from the meta-learned start on the ``k`` labelled ``images``
    (the inner loop's SGD, rate ``lr``, ``steps`` steps), **left attached** to ``model`` as a ``correction``
    adapter of each of its linear layers: ``ΔW = W' − W, Δb = b' − b`` (save it with :func:`alfa.save_adapter`).
    The same adapted MLP up to float round-off, in the form every user calibration takes, so a FAZE user is
    saved, merged, exported and served per sample (:class:`alfa.serve.MultiUserModel`) like any calibrated one.
    Returns the angular loss (degrees) on the ``k`` images after adapting."""
    if not isinstance(model, FazeGaze):
        raise ValueError(f"the faze method adapts a FAZE model (alfa faze train), not a {type(model).__name__}")
    if not (lr > 0 and math.isfinite(lr)) or steps < 1:
        raise ValueError(f"PS-GEN needs a positive rate and at least one step, got lr={lr}, steps={steps}")
    with torch.no_grad():
        z = model.gaze_code(images)
    adapted = copy.deepcopy(model.gaze_mlp)
    loss = adapt_mlp(adapted, z, gaze, lr, steps)
    start = {n: p.detach() for n, p in model.gaze_mlp.named_parameters()}
    attach(model, CorrectionConfig(target=rf"^{GAZE_MLP}\.", layers="all"))
    try:
        updates = adapter_parameters(model)
        with torch.no_grad():
            for name, p in adapted.named_parameters():  # "0.weight" -> "gaze_mlp.0.weight_update"
                layer, _, kind = name.rpartition(".")
                updates[f"{GAZE_MLP}.{layer}.{kind}_update"].copy_(p - start[name])
    except BaseException:
        detach(model)
        raise
    return math.degrees(loss)
