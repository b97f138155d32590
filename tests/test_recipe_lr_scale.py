"""The personalization recipe's x10 on ResNet-18's layer3/layer4 and param_groups' refusal of a pattern that selects
nothing: the rule is every recipe's default, so it is left out where it has nothing to scale, and only it."""

from __future__ import annotations

import copy

import pytest
import torch
from tiny_models import TinyGazeNet  # noqa: F401  (registers tiny_gaze_net)

import alfa
from alfa.gaze.personalize import LAYER34_PATTERN, PersonalizeConfig, personalize, recipe_lr_scale


def _base() -> torch.nn.Module:
    torch.manual_seed(0)
    model = alfa.models.create_model("tiny_gaze_net").eval()
    alfa.truncate(model, 6)
    return model


def test_the_layer34_rule_is_left_out_where_no_trained_parameter_is_in_those_stages():
    model, early = _base(), alfa.AlfaConfig(heads=2, rank=2, target=r"^layer[12]\.")
    images = torch.rand(4, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    result = personalize(copy.deepcopy(model), images, early, PersonalizeConfig(steps=1))
    assert len(result.losses) == 1 and result.trained_parameters > 0
    with pytest.raises(ValueError, match=r"lr_scale pattern '\^layr2' matches no trainable parameter"):
        personalize(copy.deepcopy(model), images, early, PersonalizeConfig(steps=1, lr_scale={"^layr2": 2.0}))


def test_recipe_lr_scale_keeps_the_rule_where_it_scales_something_and_every_other_pattern():
    everywhere, early = _base(), _base()
    alfa.attach(everywhere, alfa.AlfaConfig(heads=2, rank=2))
    alfa.attach(early, alfa.AlfaConfig(heads=2, rank=2, target=r"^layer1\."))
    scales = {LAYER34_PATTERN: 10.0, "^layr2": 2.0}
    assert recipe_lr_scale(everywhere, scales) == scales
    assert recipe_lr_scale(early, scales) == {"^layr2": 2.0}  # left for param_groups to refuse
    assert scales == {LAYER34_PATTERN: 10.0, "^layr2": 2.0}  # the caller's dict is not changed
