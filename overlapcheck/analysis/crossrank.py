"""Across ranks: min, median, max of each metric, and the worst rank."""

from __future__ import annotations

import statistics
from typing import Any

from overlapcheck.analysis.metrics import COLLECTIVE_KEYS

# rank-level metrics and whether a higher value is worse
RANK_METRICS = {"exposed_share": True, "idle_us": True, "compute_us": False, "span_us": True}
COLLECTIVE_METRICS = {"overlap": False, "exposed_us": True, "time_us": True}


def summarize(ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """The SUMMARY document (docs/report-schema.md)."""
    metrics: dict[str, Any] = {}
    for kind in COLLECTIVE_KEYS:
        for metric, higher_is_worse in COLLECTIVE_METRICS.items():
            values = [(r["rank"], r["collectives"][kind][metric]) for r in ranks if r["collectives"][kind]["count"]]
            _add(metrics, f"{kind}.{metric}", values, higher_is_worse)
    for metric, higher_is_worse in RANK_METRICS.items():
        _add(metrics, metric, [(r["rank"], r.get(metric)) for r in ranks], higher_is_worse)
    return {"ranks": len(ranks), "metrics": metrics}


def _add(out: dict[str, Any], key: str, values: list[tuple[int, Any]], higher_is_worse: bool) -> None:
    values = [(rank, v) for rank, v in values if v is not None]
    if not values:
        return
    nums = [v for _, v in values]
    sign = -1 if higher_is_worse else 1
    worst = min(values, key=lambda rv: (sign * rv[1], rv[0] if rv[0] is not None else 0))
    out[key] = {"min": min(nums), "median": statistics.median(nums), "max": max(nums), "worst_rank": worst[0]}
