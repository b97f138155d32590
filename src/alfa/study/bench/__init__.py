"""Benchmarks: speed and memory, the cross-domain benchmark runner, and the generated report."""
