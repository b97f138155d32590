"""How the report names a row: an adapter method by its config class's ``display_name``, the rows that are
no adapter (the references and yardsticks) from the small table here, anything else (an ablated variant
such as ``alfa[H=1]``) by its label."""

from __future__ import annotations

from alfa.adapters import METHODS

__all__ = ["NAMES", "SELECTED", "DEFAULT", "display_name"]

# Only rows that are no adapter method; a method's name lives with its config class (``display_name``).
NAMES = {
    "source-only": "source-only (truncated base)",
    "flip-tta": "flip-TTA (no training)",
    "roll-tta": "roll-TTA (no training)",
    "group-tta": "flip×roll TTA (no training)",
    "in-domain": "in-domain (held-out source persons)",
    "target-trained": "target-trained (the same model trained on other persons of the target world)",
    "oracle": "oracle (supervised, per person)",
    "ruda": "RUDA (rotation consistency, whole network)",
    "tta-distill": "Alfa distilling the base's flip×roll TTA (one forward pass)",
    "pnpga": "PnP-GA (ensemble of source snapshots, mean teachers, one student predicts)",
}


SELECTED = "[selected]"
"""Suffix of a method's row with its recipe selected on the stand-in, e.g. ``alfa[selected]``."""
DEFAULT = "[default]"
"""Suffix of a method's row with the recipe ``alfa personalize`` ships for it, e.g. ``alfa[default]``."""
SUFFIX_WORDS = {SELECTED: "selected recipe", DEFAULT: "shipped default recipe"}
"""How a row's recipe suffix is said in its name."""


def display_name(label: str) -> str:
    """The name of the row ``label`` in tables and sentences (``alfa[selected]``: "Alfa (selected recipe)",
    ``alfa[default]``: "Alfa (shipped default recipe)")."""
    for suffix, words in SUFFIX_WORDS.items():
        if label.endswith(suffix):
            return f"{display_name(label.removesuffix(suffix))} ({words})"
    if label in NAMES:
        return NAMES[label]
    if label in METHODS:
        return METHODS[label].display_name
    return label
