"""The benchmark's vocabulary, shared by the runner and the report (which must not need torch)."""

SOURCES = {"E": "eth", "G": "gaze360"}
TARGETS = {"M": "mpii", "D": "eyediap"}
PAIRS = ("E→M", "E→D", "G→M", "G→D")
MAIN_METHODS = (
    "source-only",
    "tpgaze",
    "full",
    "bitfit",
    "lora",
    "pissa",
    "milora",
    "moslora",
    "spectral",
    "dora",
    "flora",
    "alfa",
)
"""Table 1's methods, in its row order."""
SANITY_METHODS = ("in-domain", "target-trained", "oracle")
