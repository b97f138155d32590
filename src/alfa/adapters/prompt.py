"""TPGaze's prompts: learnable values in place of the zero padding of chosen convolutions.

TPGaze ("Test-Time Personalization with Meta Prompt for Gaze Estimation", AAAI 2024) freezes the
whole network and learns only what the first 9 convolutions of ResNet-18 see outside the image: the
stem ``conv1``, the four 3×3 convs of ``layer1`` and the four of ``layer2`` (``layer2.0.downsample``
is a 1×1 conv without padding). As in the reference code, a layer's prompt holds one value per input
channel and per padded border position, so its size depends on the layer's input resolution:
``C · ((H + 2p)(W + 2p) − H·W)`` values, stored as ``prompt_tb`` (the top and bottom strips,
``C × 2p × (W + 2p)``) and ``prompt_lr`` (the left and right strips between them, ``C × H × 2p``).

A convolution is linear in its input, so convolving the prompt-padded input equals convolving the
zero-padded input (the base layer, untouched) plus convolving a frame that holds the prompts and zeros
inside. That second term does not depend on the image: it is one ``(1, m, H_out, W_out)`` map, computed
once per forward and broadcast over the batch. With all prompts at zero it is exactly zero, so the
prompted model equals the base model bit for bit; the base may be a dense ``Conv2d`` or a truncated
``FactorizedConv2d`` (the frame then goes through its two factors, without bias).

The map is non-zero only near the border and varies with position there, so it cannot be folded into
the convolution's weights or bias: :func:`alfa.merge` refuses, and the model keeps its prompts at
inference (base parameters + prompts).

Layer input sizes come from the image size and the network. A :class:`TPGazeConfig` without
``input_sizes`` measures them on the model it is attached to: :func:`alfa.attach` runs one
``image_size``×``image_size`` image through the base model and records what each prompted conv sees
(for ResNet-18, the sizes its layout gives). They can also be given: measured on a model
(:meth:`TPGazeConfig.for_model`) or read off a network's layout
(:meth:`TPGazeConfig.for_network`, e.g. with :func:`alfa.models.resnet.resnet18_conv_inputs`). Sizes
are keyed by the layer's geometry (channels, kernel, stride, padding, dilation), which in a ResNet
identifies the resolution a conv runs at, so that a config can build each layer from the layer alone.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..layers import LayerSpec, is_dense_eligible, is_factorized, layer_spec
from ..surgery import LayerWrapper
from .config import AdapterConfig, ConfigError, MergeError, register_method, target_matches
from .layer import AdaptedLayer, MergeKind

__all__ = [
    "TPGAZE_TARGET",
    "TPGazeConfig",
    "PromptedConv",
    "ConvInputs",
    "geometry_key",
    "probe_input_sizes",
    "input_sizes_by_geometry",
    "prompt_count",
]

# ResNet-18's first 9 convolutions (module names as in torchvision and alfa.models.resnet).
TPGAZE_TARGET = r"^(conv1|layer1\.\d+\.conv[12]|layer2\.\d+\.conv[12])$"


def geometry_key(spec: LayerSpec) -> str:
    """The key under which a conv's input size is stored, e.g. ``"64->128 k3x3 s2x2 p1x1 d1x1"``."""
    (kh, kw), (sh, sw), (dh, dw) = spec.kernel_size, spec.stride, spec.dilation
    ph, pw = spec.padding  # type: ignore[misc]
    return f"{spec.in_features}->{spec.out_features} k{kh}x{kw} s{sh}x{sw} p{ph}x{pw} d{dh}x{dw}"


def prompt_count(channels: int, size: Sequence[int], padding: Sequence[int]) -> int:
    """Values in one layer's prompt: the border cells of its padded input, per channel."""
    (h, w), (ph, pw) = size, padding
    return channels * ((h + 2 * ph) * (w + 2 * pw) - h * w)


def _is_conv(module: nn.Module) -> bool:
    return (is_factorized(module) or is_dense_eligible(module)) and layer_spec(module).kind == "conv2d"


def input_sizes_by_geometry(convs: Iterable[tuple[str, nn.Module, Sequence[int]]]) -> dict[str, list[int]]:
    """``{geometry_key: input size}`` of ``(name, conv, size)`` triples (the first of a geometry wins).

    Raises if two convs share a geometry but see different resolutions (their prompts could not be
    told apart by geometry).
    """
    found: dict[str, tuple[str, list[int]]] = {}
    problems: list[str] = []
    for name, module, size in convs:
        key, size = geometry_key(layer_spec(module)), [int(s) for s in size]
        if key in found and found[key][1] != size:
            problems.append(f"{found[key][0]} sees {found[key][1]}, {name} sees {size} (both {key})")
        found.setdefault(key, (name, size))
    if problems:
        raise ValueError(f"convs with the same geometry see different input sizes: {'; '.join(problems)}")
    return {key: size for key, (_, size) in found.items()}


@torch.no_grad()
def probe_input_sizes(
    model: nn.Module, image_size: int, target: str | Sequence[str] | None = TPGAZE_TARGET
) -> dict[str, list[int]]:
    """Run one ``image_size``×``image_size`` image through ``model`` (in eval mode, each module's mode put back
    afterwards) and record the input size of every conv whose name matches ``target``, keyed by
    :func:`geometry_key`.

    Raises if two matched convs share a geometry but see different resolutions (their prompts could
    not be told apart by geometry).
    """
    seen: list[tuple[str, nn.Module, list[int]]] = []

    def record(name: str, module: nn.Module):
        def hook(_module: nn.Module, args: tuple) -> None:
            seen.append((name, module, [int(s) for s in args[0].shape[-2:]]))

        return hook

    # A conv inside another adapter's wrapper is named by the wrapper's path, the layer's own name in the model.
    wrapped = {id(m.base): name for name, m in model.named_modules() if isinstance(m, LayerWrapper)}
    convs = [(wrapped.get(id(m), name), m) for name, m in model.named_modules() if _is_conv(m)]
    hooks = [
        module.register_forward_pre_hook(record(name, module)) for name, module in convs if target_matches(target, name)
    ]
    modes = {module: module.training for module in model.modules()}
    try:
        model.eval()
        reference = next(model.parameters(), None)
        kw = {} if reference is None else {"device": reference.device, "dtype": reference.dtype}
        model(torch.zeros(1, 3, image_size, image_size, **kw))
    finally:
        for module, training in modes.items():
            module.training = training
        for h in hooks:
            h.remove()
    return input_sizes_by_geometry(seen)


ConvInputs = Callable[[int], Iterable[tuple[str, nn.Module, Sequence[int]]]]
"""A network's layout: for an image side, its convs as ``(module name, conv, input (height, width))`` triples
(:func:`alfa.models.resnet.resnet18_conv_inputs` is ResNet-18's)."""


@register_method
@dataclass(kw_only=True)
class TPGazeConfig(AdapterConfig):
    """TPGaze's prompts on the convs matched by ``target`` (default: ResNet-18's first 9).

    ``image_size``: side of the square input images; it fixes each prompt's size. ``input_sizes``:
    the input size of each prompted conv by :func:`geometry_key`; ``None`` measures them on the model the
    config is attached to (:meth:`resolved_for`: one probe forward, which on ResNet-18 gives the sizes its
    layout gives); :meth:`for_model` and :meth:`for_network` fill them in beforehand.
    ``init_std``: σ of the Gaussian initialization (1.0, as the reference code's ``normal_``).
    ``layers="all"`` because after truncation at rank 64 the stem and ``layer1`` stay dense while
    ``layer2``'s 3×3 convs are factorized; the prompts work on both.

    ``init_from`` records where a trained adapter's prompts started (e.g. the digest of the
    meta-trained prompts, set by :func:`alfa.gaze.tpgaze.start_from`); it is provenance only and loads
    nothing by itself.
    """

    method: ClassVar[str] = "tpgaze"
    display_name: ClassVar[str] = "TPGaze"
    family: ClassVar[str] = "prompt"
    trains_prompts: ClassVar[bool] = True

    target: str | Sequence[str] | None = TPGAZE_TARGET
    layers: str = "all"
    image_size: int = 224
    init_std: float = 1.0
    input_sizes: dict[str, list[int]] | None = None
    init_from: str | None = None

    def validate(self) -> None:
        super().validate()
        if self.image_size < 1:
            raise ValueError(f"TPGazeConfig.image_size must be positive, got {self.image_size}")
        if not self.init_std >= 0:
            raise ValueError(f"TPGazeConfig.init_std must be non-negative, got {self.init_std}")
        if self.input_sizes is not None and not isinstance(self.input_sizes, dict):
            raise ValueError(
                "TPGazeConfig.input_sizes must map each prompted conv's name to its input [height, width] (or be "
                f"None: measured on the model), got {type(self.input_sizes).__name__} {self.input_sizes!r}"
            )
        for key, size in (self.input_sizes or {}).items():
            if not (
                isinstance(size, (list, tuple)) and len(size) == 2 and all(isinstance(s, int) and s > 0 for s in size)
            ):
                raise ValueError(f"TPGazeConfig.input_sizes[{key!r}] must be [height, width], got {size!r}")

    @classmethod
    def for_model(cls, model: nn.Module, image_size: int, **options: Any) -> TPGazeConfig:
        """A config whose prompt sizes are measured on ``model`` (one probe forward) and recorded in
        ``input_sizes``."""
        config = cls(image_size=image_size, **options)
        config.input_sizes = probe_input_sizes(model, image_size, config.target)
        return config

    @classmethod
    def for_network(cls, conv_inputs: ConvInputs, image_size: int, **options: Any) -> TPGazeConfig:
        """A config whose prompt sizes are read off a network's layout (:data:`ConvInputs`, e.g.
        :func:`alfa.models.resnet.resnet18_conv_inputs`) at ``image_size`` and recorded in ``input_sizes``."""
        config = cls(image_size=image_size, **options)
        config.input_sizes = input_sizes_by_geometry(conv_inputs(image_size))
        return config

    def resolved_for(self, model: nn.Module, targets: Sequence[str]) -> TPGazeConfig:
        """``self`` when ``input_sizes`` is given; otherwise a copy that knows the input size of each conv of
        ``targets``, measured on ``model`` with one probe forward (:func:`probe_input_sizes`). The copy's
        fields, its ``to_dict`` and so the saved adapter are this config's."""
        if self.input_sizes is not None:
            return self
        only_targets = "^(" + "|".join(re.escape(name) for name in targets) + ")$"
        try:
            measured = probe_input_sizes(model, self.image_size, only_targets)
        except Exception as e:
            raise ConfigError(
                f"TPGazeConfig(input_sizes=None) measures its prompts' sizes by running one 3×{self.image_size}×"
                f"{self.image_size} image through the model, which failed ({type(e).__name__}: {e}); give the "
                "sizes instead, read off the network's layout (TPGazeConfig.for_network(conv_inputs, image_size)) "
                "or measured on a model that takes images (TPGazeConfig.for_model(model, image_size))"
            ) from e
        resolved = copy.copy(self)
        resolved._measured_sizes = measured
        return resolved

    def layer_input_size(self, spec: LayerSpec) -> list[int]:
        """The input ``[height, width]`` of a prompted conv: from ``input_sizes``, or as measured on the model
        by :meth:`resolved_for`; a :class:`~alfa.adapters.config.ConfigError` when neither gives it."""
        measured = self.__dict__.get("_measured_sizes")
        sizes = self.input_sizes if self.input_sizes is not None else measured
        if sizes is None:
            raise ConfigError(
                "TPGazeConfig(input_sizes=None) sizes its prompts on the model it is attached to: build the layers "
                "with alfa.attach(model, config), or give the sizes (TPGazeConfig.for_network(conv_inputs, "
                "image_size), TPGazeConfig.for_model(model, image_size) or input_sizes=...)"
            )
        key = geometry_key(spec)
        if key not in sizes:
            where = "input_sizes" if self.input_sizes is not None else f"the model at image size {self.image_size}"
            raise ConfigError(
                f"no input size for a conv of geometry {key} in {where}; "
                "use TPGazeConfig.for_model(model, image_size) for other networks"
            )
        return list(sizes[key])

    def build(self, base: nn.Module) -> PromptedConv:
        return PromptedConv(base, self)


class PromptedConv(AdaptedLayer):
    """A conv (dense or factorized) whose zero padding is replaced by learnable values.

    ``forward(x) = base(x) + border(prompts)``, where ``border`` convolves the prompt frame (zeros
    inside) with the layer's weights and no bias; see the module docstring. Merge kind ``"none"``:
    the prompts stay attached at inference.
    """

    merge_kind: ClassVar[MergeKind] = "none"

    def __init__(self, base: nn.Module, config: TPGazeConfig) -> None:
        super().__init__(base, config)
        spec = self.spec
        if spec.kind != "conv2d":
            raise TypeError(f"TPGaze prompts pad convolutions; got a {type(base).__name__}")
        if isinstance(spec.padding, str):
            raise ValueError(f"padding={spec.padding!r} is not supported; TPGaze needs explicit padding")
        ph, pw = spec.padding
        if ph == 0 and pw == 0:
            raise ValueError("the conv has no padding, so there is nothing to prompt")
        self.input_size = config.layer_input_size(spec)
        h, w = self.input_size
        c = spec.in_features
        weight = base.V if is_factorized(base) else base.weight
        kw = {"device": weight.device, "dtype": weight.dtype}
        self.prompt_tb = nn.Parameter(torch.randn(c, 2 * ph, w + 2 * pw, **kw) * config.init_std)
        self.prompt_lr = nn.Parameter(torch.randn(c, h, 2 * pw, **kw) * config.init_std)
        # The frame is convolved without padding: the prompts are the padding.
        self.frame_spec = dataclasses.replace(spec, padding=(0, 0))

    @property
    def num_prompts(self) -> int:
        return self.prompt_tb.numel() + self.prompt_lr.numel()

    def frame(self) -> Tensor:
        """The padded input of an all-zero image: ``(1, C, H + 2p_h, W + 2p_w)``, prompts on the border."""
        ph, pw = self.spec.padding  # type: ignore[misc]
        c, (h, w) = self.spec.in_features, self.input_size
        inside = self.prompt_lr.new_zeros(c, h, w)
        middle = torch.cat([self.prompt_lr[:, :, :pw], inside, self.prompt_lr[:, :, pw:]], dim=2)
        return torch.cat([self.prompt_tb[:, :ph], middle, self.prompt_tb[:, ph:]], dim=1)[None]

    def border(self) -> Tensor:
        """What the prompts add to the layer's output: ``(1, m, H_out, W_out)``, the same for every image."""
        frame, fs = self.frame(), self.frame_spec
        if self.base_is_factorized:
            return fs.output_op(fs.input_op(frame, self.base.V), self.base.U)
        return F.conv2d(frame, self.base.weight, None, fs.stride, 0, fs.dilation)

    def forward(self, x: Tensor) -> Tensor:
        if list(x.shape[-2:]) != self.input_size:
            raise ValueError(
                f"the prompts were sized for a {self.input_size[0]}×{self.input_size[1]} input, got "
                f"{x.shape[-2]}×{x.shape[-1]} (set TPGazeConfig.image_size to the images' size)"
            )
        return self.base(x) + self.border()

    def effective_weight(self) -> tuple[Tensor, Tensor | None]:
        raise MergeError(self.merge_refusal())

    def merge_refusal(self) -> str:
        return (
            "tpgaze prompts cannot be merged into the conv: they add an input-independent map that is "
            "non-zero only near the border and varies with position, which no conv weight or "
            "per-channel bias can express. Keep the adapter attached at inference (base parameters + "
            f"{self.num_prompts} prompt values for this layer), or detach it."
        )

    def extra_repr(self) -> str:
        h, w = self.input_size
        return f"method=tpgaze, input={h}x{w}, prompts={self.num_prompts}"
