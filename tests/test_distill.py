"""TTA distilled into the weights (``alfa.gaze.distill``): the targets are the frozen base's group TTA, the loss
reads the batch's layout and pulls each row towards its target."""

from __future__ import annotations

import pytest
import torch
from tiny_models import TinyGazeNet

from alfa.gaze.distill import distillation_loss, tta_targets
from alfa.gaze.geometry import angular_error, flip_yaw
from alfa.gaze.tta import GroupTTA


def test_the_loss_reads_the_batch_layout():
    t = 0.2 * torch.randn(3, 2, generator=torch.Generator().manual_seed(0))
    exact = torch.cat([t, t, flip_yaw(t), flip_yaw(t)])
    assert distillation_loss(exact, t) == 0
    unflipped = torch.cat([t, t, t, t])  # the flipped rows given the unflipped targets: wrong wherever yaw ≠ 0
    assert distillation_loss(unflipped, t) == pytest.approx(float(t[:, 0].abs().mean()), rel=1e-6)
    with pytest.raises(ValueError, match="4·3 predictions"):
        distillation_loss(exact[:6], t)


def test_the_targets_are_the_frozen_bases_group_tta_and_the_loss_pulls_towards_them():
    torch.manual_seed(0)
    model = TinyGazeNet().eval()
    images = torch.rand(3, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    targets = tta_targets(model, images)
    with torch.no_grad():
        assert (targets - GroupTTA(model)(images)).abs().max() < 1e-6 and not targets.requires_grad
        plain = model(images)
    assert angular_error(plain, targets).mean() > 0.05  # degrees: one pass is not the six-pass TTA
    # A step along the loss's gradient, taken on the predictions themselves, moves every row towards its target.
    batch = torch.cat([plain, plain, flip_yaw(plain), flip_yaw(plain)]).requires_grad_()
    distillation_loss(batch, targets).backward()
    moved = batch.detach() - 1e-3 * batch.grad.sign()
    assert distillation_loss(moved, targets) < distillation_loss(batch.detach(), targets)
