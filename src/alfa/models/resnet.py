"""ResNet-18 as a gaze regressor, with torchvision's parameter names (no torchvision dependency).

Because the names match, an ImageNet checkpoint saved by torchvision loads into
:func:`resnet18_gaze` (all but the regression head, see :func:`alfa.checkpoint.load_backbone`).
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor, nn

from .registry import register_model

__all__ = ["BasicBlock", "ResNet", "resnet18_conv_inputs", "resnet18_gaze"]


def _conv3x3(cin: int, cout: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)


class BasicBlock(nn.Module):
    """Two 3×3 convs with a residual connection (projected by ``downsample`` when shapes change)."""

    expansion = 1

    def __init__(self, cin: int, cout: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = _conv3x3(cin, cout, stride)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = _conv3x3(cout, cout)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample: nn.Module | None = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: Tensor) -> Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class ResNet(nn.Module):
    """A ResNet with BasicBlocks; ``layers`` gives the number of blocks per stage."""

    def __init__(self, layers: tuple[int, int, int, int], num_outputs: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        widths = (64, 128, 256, 512)
        cin = 64
        for i, (w, blocks) in enumerate(zip(widths, layers)):
            stage = []
            for b in range(blocks):
                stage.append(BasicBlock(cin, w, stride=2 if (b == 0 and i > 0) else 1))
                cin = w
            setattr(self, f"layer{i + 1}", nn.Sequential(*stage))
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512, num_outputs)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def features(self, x: Tensor) -> Tensor:
        """The 512-d pooled feature vector."""
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.avgpool(x).flatten(1)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(self.features(x))


@register_model
def resnet18_gaze(num_outputs: int = 2) -> ResNet:
    """ResNet-18 regressing ``(yaw, pitch)`` (11.18 M parameters; about 2.1 M truncated at rank 64)."""
    return ResNet((2, 2, 2, 2), num_outputs)


@functools.lru_cache(maxsize=16)
def _resnet18_conv_inputs(image_size: int) -> tuple[tuple[str, nn.Conv2d, tuple[int, int]], ...]:
    with torch.device("meta"):  # shapes only: no memory, no arithmetic
        skeleton = resnet18_gaze()
    seen: dict[str, tuple[int, int]] = {}  # in the order the forward reaches the convs
    convs = {name: m for name, m in skeleton.named_modules() if isinstance(m, nn.Conv2d)}

    def record(name: str):
        def hook(_module: nn.Module, args: tuple) -> None:
            seen.setdefault(name, (int(args[0].shape[-2]), int(args[0].shape[-1])))

        return hook

    hooks = [m.register_forward_pre_hook(record(name)) for name, m in convs.items()]
    try:
        skeleton.eval()(torch.zeros(1, 3, image_size, image_size, device="meta"))
    finally:
        for h in hooks:
            h.remove()
    return tuple((name, convs[name], size) for name, size in seen.items())


def resnet18_conv_inputs(image_size: int) -> list[tuple[str, nn.Conv2d, tuple[int, int]]]:
    """Every conv of ResNet-18 with its module name and the ``(height, width)`` of its input, for
    square images of side ``image_size``, in the order a forward runs them.

    The convs belong to a shape-only skeleton on the ``meta`` device (their geometry is what
    matters, e.g. to size TPGaze's prompts); traced once per image size.
    """
    return list(_resnet18_conv_inputs(int(image_size)))
