"""Every registered adapter method at a size the small test nets take (imported by the contract and unmerge tests)."""

from torch import nn

from alfa.adapters import METHODS, AdapterConfig, TPGazeConfig

# Small settings for the small test net; a method missing here runs with its defaults.
SMALL: dict[str, dict] = {
    "alfa": {"heads": 2, "rank": 2},
    "linear_mix": {"rank": 2},
    "spectral": {"rank": 2},
    "lora": {"rank": 2, "alpha": 4.0},
    "pissa": {"rank": 2},
    "milora": {"rank": 2},
    "moslora": {"rank": 2, "alpha": 4.0},
    "dora": {"rank": 2, "alpha": 4.0},
    "flora": {"rank": 2},
}
IMAGE = 16


def small_config(method: str, model: nn.Module) -> AdapterConfig:
    """``method``'s config for ``model`` at :data:`SMALL` sizes, on every layer it can adapt."""
    cls = METHODS[method]
    if cls is TPGazeConfig:  # prompts are sized on the model they pad
        return TPGazeConfig.for_model(model, IMAGE, target=r"^conv[13]$")
    if cls.scope == "model":
        return cls()
    return cls(layers="all", **SMALL.get(method, {}))
