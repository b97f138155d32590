"""Hand-written benchmark records for the report's tests: :func:`complete` gives one every key a record must have."""

from __future__ import annotations

import statistics
from typing import Any

UNADAPTED = ("source-only", "flip-tta", "in-domain", "target-trained", "oracle")


def complete(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` with each required key it lacks at the value of a record that measured nothing more (a recipe
    selection when its method ends in ``[grid]``, a row without adaptation when it is one, else an adapter)."""
    method = record.get("method", "alfa")
    kind = "selection" if method.endswith("[grid]") else method if method in UNADAPTED else "adapter"
    pair = record.get("pair", f"{record.get('source', 'E')}→stand-in")
    source, _, target = pair.partition("→")
    per_person = record.get("per_person", {})
    defaults = {
        "id": f"{method}|{pair}|seed{record.get('seed', 0)}",
        "config_hash": "fixture",
        "method": method,
        "group": "selection" if kind == "selection" else "main",
        "ablation": None,
        "kind": kind,
        "pair": pair,
        "source": source,
        "target": target,
        "seed": 0,
        "base": "truncated",
        "steps": None,
        "failed": {},
        "trainable_params": 0,
        "inference_params": 0,
        "compact_merge_params": record.get("inference_params", 0),
        "merge": "none",
        "adapter_bytes": None,
        "compact_bytes": None,
        "seconds_per_user": None,
        "cpu_seconds_per_user": None,
        "peak_rss_mib": None,
        "peak_rss_increase_mib": None,
        "latency_ms": None,
        "base_latency_ms": None,
        "persons": len(per_person),
        "per_person": per_person,
        "error_deg": statistics.fmean(per_person.values()) if per_person else None,
        "wall_s": 0.0,
        "cpu_s": 0.0,
        "finished": "2026-01-01T00:00:00",
    }
    return {**defaults, **record}


def row(method: str, seed: int, mean: float, pair: str = "E→M") -> dict[str, Any]:
    """A complete record of the row ``method`` on ``pair``: two persons at ``mean`` ∓ 1°."""
    per_person = {"p00": mean - 1.0, "p01": mean + 1.0}
    return complete(
        {
            "id": f"{method}|{pair}|seed{seed}",
            "method": method,
            "pair": pair,
            "seed": seed,
            "error_deg": statistics.fmean(per_person.values()),
            "per_person": per_person,
            "std_over_persons": 1.0,
            "trainable_params": 1234,
        }
    )


def results_of(config: Any, rows: tuple[tuple[str, float], ...], seeds: tuple[int, ...] = (0, 1, 2)) -> dict[str, Any]:
    """A results file of ``config``'s layout holding, per seed ``s``, :func:`row` ``(method, s, mean + s)``."""
    from alfa.study.bench.results import FORMAT, VERSION, layout

    return {
        "format": FORMAT,
        "version": VERSION,
        "preset": "test",
        "config": {**config.protocol_dict(), "target_draw": "fixed"},  # row() gives every seed the same persons
        "records": [row(m, s, mean + s) for s in seeds for m, mean in rows],
        "layout": layout(config),
    }
