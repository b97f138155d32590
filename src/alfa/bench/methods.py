"""The benchmark's vocabulary: its domains, pairs and the rows of Table 1 and the sanity table, shared by every
bench module (it imports nothing)."""

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
