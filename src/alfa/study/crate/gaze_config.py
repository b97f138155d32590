"""The settings of ``alfa crate gaze`` (:class:`CrateGazeConfig`, the ``--quick`` preset) and the dataset
specs and training configs derived from them. The run is :mod:`alfa.study.crate.gaze`; its tables, page and
figure are :mod:`alfa.study.crate.gaze_report`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from alfa.adapters import AlfaConfig
from alfa.gaze.augment import AugmentConfig
from alfa.gaze.data.registry import DatasetSpec
from alfa.gaze.personalize import PersonalizeConfig
from alfa.gaze.train import TrainConfig

from .probes import DEFAULT_PROBE_EPS

__all__ = ["CrateGazeConfig", "quick_config", "late_blocks_pattern", "MODELS", "MODEL_NAMES", "LABELS"]

MODELS = ("crate", "vit")
MODEL_NAMES = {"crate": "crate_tiny", "vit": "vit_tiny"}  # registered constructors; sizes are overridden
LABELS = {"crate": "CRATE", "vit": "ViT"}


def _default_recipe() -> PersonalizeConfig:
    # lr_scale is left empty here: the ×10 rule for the later blocks is added by personalize_recipe().
    return PersonalizeConfig(lr_scale={}, augment=AugmentConfig.small_faces())


def late_blocks_pattern(depth: int) -> str:
    """Parameter-name pattern of the later half of the blocks (``blocks.{depth//2}`` … ``blocks.{depth-1}``),
    the transformer counterpart of ResNet-18's ``layer3``/``layer4`` in the personalization recipe."""
    if depth < 1:
        raise ValueError(f"depth must be at least 1, got {depth}")
    return rf"(^|\.)blocks\.({'|'.join(str(i) for i in range(depth // 2, depth))})\."


@dataclass
class CrateGazeConfig:
    """Everything the run depends on. The defaults take about 6 minutes on one CPU thread.

    Models: CRATE and ViT with the same ``dim``/``depth``/``heads`` (the ViT's MLP has ratio 4, so it
    has about 3.6× the parameters), ``image_size``/``patch_size`` patches, a 2-output (yaw, pitch) head.
    Data: the synthetic worlds (``docs/synthetic.md``): ``source`` (train split) for training,
    ``val_persons`` of its ``val`` split for the in-domain error, ``targets`` (test split) for the
    cross-domain error and personalization. Training: ``epochs`` of Adam at ``lr``, batch ``batch_size``,
    L1 plus ``symmetry_weight`` × the flip-symmetry term (the gaze stack's pre-training). CRATE is then
    truncated at SVD rank ``rank`` and fine-tuned ``recovery_epochs`` on the source at ``recovery_lr``
    (0: no recovery), then personalized with ``alfa`` and the recipe ``personalize`` (its ``lr_scale``
    entries come first; ``late_blocks_lr_scale`` is added for the later half of the blocks).
    """

    image_size: int = 64
    patch_size: int = 8
    dim: int = 96
    depth: int = 6
    heads: int = 4
    source: str = "eth"
    source_persons: int = 50
    source_images_per_person: int = 100
    val_persons: int = 10
    val_images_per_person: int = 40
    targets: tuple[str, ...] = ("mpii", "eyediap")
    target_persons: int = 6
    target_images_per_person: int = 40
    data_seed: int = 0
    epochs: int = 6
    batch_size: int = 32
    lr: float = 5e-4
    symmetry_weight: float = 1.0
    rank: int = 32
    recovery_epochs: int = 1
    recovery_lr: float = 1e-4
    alfa: AlfaConfig = field(default_factory=AlfaConfig)
    personalize: PersonalizeConfig = field(default_factory=_default_recipe)
    late_blocks_lr_scale: float = 10.0
    probe_images_per_person: int = 4
    probe_eps: float = DEFAULT_PROBE_EPS
    seed: int = 0
    threads: int = 1
    preset: str = "default"  # a label only ("quick" marks the smoke-test preset in the outputs)

    def validate(self) -> None:
        """Raise a ``ValueError`` naming the first field that is out of range."""
        from alfa.gaze.data.synthetic import get_domain

        positive = (
            "image_size",
            "patch_size",
            "dim",
            "depth",
            "heads",
            "source_persons",
            "source_images_per_person",
            "val_persons",
            "val_images_per_person",
            "target_persons",
            "target_images_per_person",
            "epochs",
            "batch_size",
            "rank",
            "probe_images_per_person",
            "threads",
        )
        for name in (*positive, "recovery_epochs", "data_seed", "seed"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"CrateGazeConfig.{name} must be an integer, got {value!r}")
            if name in positive and value < 1:
                raise ValueError(f"CrateGazeConfig.{name} must be at least 1, got {value}")
        if self.recovery_epochs < 0:
            raise ValueError(f"CrateGazeConfig.recovery_epochs must be non-negative, got {self.recovery_epochs}")
        if self.image_size < 16:
            raise ValueError(
                f"CrateGazeConfig.image_size must be at least 16 (the renderer's minimum), got {self.image_size}"
            )
        if self.image_size % self.patch_size:
            raise ValueError(
                f"CrateGazeConfig.image_size {self.image_size} is not divisible by patch_size {self.patch_size}"
            )
        if self.dim % self.heads:
            raise ValueError(f"CrateGazeConfig.dim {self.dim} is not divisible by heads {self.heads}")
        if 2 * self.rank >= self.dim:
            raise ValueError(
                f"CrateGazeConfig.rank {self.rank} saves nothing on the blocks' {self.dim}×{self.dim} layers "
                f"(needs rank < dim/2 = {self.dim / 2:g})"
            )
        if self.batch_size < 2:
            raise ValueError(f"CrateGazeConfig.batch_size must be at least 2, got {self.batch_size}")
        for name in ("lr", "recovery_lr", "late_blocks_lr_scale", "probe_eps"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"CrateGazeConfig.{name} must be a positive number, got {value!r}")
        if not (math.isfinite(self.symmetry_weight) and self.symmetry_weight >= 0):
            raise ValueError(f"CrateGazeConfig.symmetry_weight must be non-negative, got {self.symmetry_weight!r}")
        if self.source not in _domains("source", get_domain):
            raise ValueError(
                f"CrateGazeConfig.source {self.source!r} is not a synthetic source domain; "
                f"choose from {_domains('source', get_domain)}"
            )
        if isinstance(self.targets, str) or not self.targets:
            raise ValueError(f"CrateGazeConfig.targets must be a non-empty tuple of domain names, got {self.targets!r}")
        known_targets = _domains("target", get_domain)
        for target in self.targets:
            if target not in known_targets:
                raise ValueError(
                    f"CrateGazeConfig.targets: {target!r} is not a synthetic target domain; choose from {known_targets}"
                )
        if len(set(self.targets)) != len(self.targets):
            raise ValueError(f"CrateGazeConfig.targets lists a domain twice: {self.targets}")
        if not isinstance(self.personalize, PersonalizeConfig):
            raise ValueError(f"CrateGazeConfig.personalize must be a PersonalizeConfig, got {type(self.personalize)}")
        if not isinstance(self.alfa, AlfaConfig):
            raise ValueError(f"CrateGazeConfig.alfa must be an AlfaConfig, got {type(self.alfa).__name__}")
        self.personalize.validate()
        self.alfa.validate()
        n_adapt = self.personalize.n_adapt
        if self.target_images_per_person <= n_adapt:
            raise ValueError(
                f"CrateGazeConfig.target_images_per_person ({self.target_images_per_person}) must exceed the "
                f"{n_adapt} adaptation images per person, or nothing is left to score"
            )
        smallest = min(self.val_images_per_person, self.target_images_per_person)
        if self.probe_images_per_person > smallest:
            raise ValueError(
                f"CrateGazeConfig.probe_images_per_person ({self.probe_images_per_person}) exceeds the "
                f"{smallest} images per person of the smallest probed dataset"
            )

    def model_kwargs(self) -> dict[str, Any]:
        """Constructor arguments of both models (``create_model("crate_tiny" / "vit_tiny", **kwargs)``)."""
        return {
            "image_size": self.image_size,
            "patch_size": self.patch_size,
            "num_outputs": 2,
            "dim": self.dim,
            "depth": self.depth,
            "heads": self.heads,
        }

    def _spec(self, domain: str, persons: int, images: int, **split: str) -> str:
        spec = DatasetSpec.synthetic(
            domain, **split, size=self.image_size, persons=persons, images_per_person=images, seed=self.data_seed
        )
        return str(spec)

    def source_spec(self) -> str:
        return self._spec(self.source, self.source_persons, self.source_images_per_person)

    def val_spec(self) -> str:
        return self._spec(self.source, self.val_persons, self.val_images_per_person, split="val")

    def target_specs(self) -> list[str]:
        return [self._spec(t, self.target_persons, self.target_images_per_person) for t in self.targets]

    def train_config(self) -> TrainConfig:
        return TrainConfig(
            epochs=self.epochs,
            batch_size=self.batch_size,
            lr=self.lr,
            symmetry_weight=self.symmetry_weight,
            seed=self.seed,
        )

    def personalize_recipe(self) -> PersonalizeConfig:
        """The recipe actually used: ``personalize`` with the later-blocks ×``late_blocks_lr_scale`` rule
        appended to its ``lr_scale`` and its seed set to ``seed``."""
        scales = {**self.personalize.lr_scale}
        scales.setdefault(late_blocks_pattern(self.depth), self.late_blocks_lr_scale)
        return dataclasses.replace(self.personalize, lr_scale=scales, seed=self.seed)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["targets"] = list(self.targets)
        d["alfa"] = self.alfa.to_dict()
        return d


def _domains(role: str, get_domain) -> list[str]:
    from alfa.gaze.data.synthetic import list_domains

    return [name for name in list_domains() if get_domain(name).role == role]


def quick_config(**overrides: Any) -> CrateGazeConfig:
    """The ``--quick`` preset (a few seconds): 32-pixel faces, a 2-layer model, a handful of images.
    Its numbers only show that the chain runs; they say nothing about the models."""
    base = CrateGazeConfig(
        image_size=32,
        patch_size=8,
        dim=32,
        depth=2,
        heads=2,
        source_persons=6,
        source_images_per_person=10,
        val_persons=2,
        val_images_per_person=6,
        target_persons=2,
        target_images_per_person=8,
        epochs=1,
        batch_size=16,
        rank=8,
        alfa=AlfaConfig(heads=2, rank=2),
        personalize=dataclasses.replace(_default_recipe(), steps=2),
        probe_images_per_person=2,
        preset="quick",
    )
    return dataclasses.replace(base, **overrides)
