"""CRATE tools: coding rates, layer probes, the plane toy, and a small gaze use (spec crate.md).

The models themselves live in :mod:`alfa.models.crate` (and the plain ViT in :mod:`alfa.models.vit`).
"""

from .coding_rate import clustered_coding_rate, coding_rate, coding_rate_step, head_coding_rates, rate_reduction
from .gaze import CrateGazeConfig, run_crate_gaze
from .probes import LayerProbe, ProbeResult, plot_probes, probe_model

__all__ = [
    "CrateGazeConfig",
    "LayerProbe",
    "ProbeResult",
    "clustered_coding_rate",
    "coding_rate",
    "coding_rate_step",
    "head_coding_rates",
    "plot_probes",
    "probe_model",
    "rate_reduction",
    "run_crate_gaze",
]
