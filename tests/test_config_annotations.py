"""A method defined outside the package is checked like the package's own, however its fields are annotated.

This module deliberately has no ``from __future__ import annotations``: its config classes hold real types
(``float``, ``float | None``) and ``Optional[float]``, not the text the package's own modules write.
"""

import dataclasses
from typing import ClassVar, Optional

import pytest

from alfa.adapters import LoraConfig, register_method
from alfa.adapters.config import METHODS


@dataclasses.dataclass(kw_only=True)
class _ScaledLora(LoraConfig):
    scale: float = 1.0
    shift: float | None = None
    bias: Optional[float] = None  # noqa: UP045 - the older spelling is the point of the test
    steps: "int" = 1  # a string annotation in a module without future annotations
    label: str = "x"


@pytest.mark.parametrize(
    ("option", "value", "words"),
    [
        ("scale", float("inf"), "_ScaledLora.scale must be a finite number, got inf"),
        ("scale", "1", "_ScaledLora.scale must be a number"),
        ("shift", float("nan"), "_ScaledLora.shift must be a finite number"),
        ("bias", float("-inf"), "_ScaledLora.bias must be a finite number"),
        ("bias", True, "_ScaledLora.bias must be a number"),
        ("steps", 1.5, "_ScaledLora.steps must be an integer"),
    ],
)
def test_an_outside_configs_number_options_are_checked_whatever_their_annotation(option, value, words):
    with pytest.raises(ValueError, match=words):
        _ScaledLora(**{option: value})


def test_none_stays_allowed_where_the_annotation_allows_it_and_only_there():
    config = _ScaledLora(shift=None, bias=None, scale=2, steps=3, label="y")
    assert (config.shift, config.bias, config.scale) == (None, None, 2)
    with pytest.raises(ValueError, match="_ScaledLora.scale must be a number, got None"):
        _ScaledLora(scale=None)


def test_a_registered_outside_method_is_refused_an_infinite_option():
    @register_method
    @dataclasses.dataclass(kw_only=True)
    class OutsideLora(LoraConfig):
        method: ClassVar[str] = "outside_lora"
        scale: Optional[float] = 1.0  # noqa: UP045

    try:
        with pytest.raises(ValueError, match="OutsideLora.scale must be a finite number"):
            OutsideLora(scale=float("inf"))
    finally:
        del METHODS["outside_lora"]


def test_a_name_only_a_type_checker_sees_leaves_the_other_fields_checked():
    @dataclasses.dataclass(kw_only=True)
    class Hinted(LoraConfig):
        hook: "NotImportedHere | None" = None  # noqa: F821 - resolves for a type checker only
        scale: Optional[float] = 1.0  # noqa: UP045

    assert Hinted(hook=object()).scale == 1.0
    with pytest.raises(ValueError, match="Hinted.scale must be a finite number"):
        Hinted(scale=float("inf"))
