"""Across ranks: min, median, max of each metric, and the worst rank."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from overlapcheck.model import COLLECTIVE_KEYS, RankMetrics, Stat, Summary

# rank-level metrics and whether a higher value is worse
RANK_METRICS = {"exposed_share": True, "idle_us": True, "compute_us": False, "span_us": True}
COLLECTIVE_METRICS = {"overlap": False, "exposed_us": True, "time_us": True}


def summarize(ranks: Sequence[RankMetrics]) -> Summary:
    """The SUMMARY object (docs/report-schema.md)."""
    metrics: dict[str, Stat] = {}
    for kind in COLLECTIVE_KEYS:
        for metric, higher_is_worse in COLLECTIVE_METRICS.items():
            values = [(r.rank, getattr(r.collectives[kind], metric)) for r in ranks if r.collectives[kind].count]
            _add(metrics, f"{kind}.{metric}", values, higher_is_worse)
    for metric, higher_is_worse in RANK_METRICS.items():
        _add(metrics, metric, [(r.rank, getattr(r, metric)) for r in ranks], higher_is_worse)
    return Summary(len(ranks), metrics)


def _add(out: dict[str, Stat], key: str, values: list[tuple[int | None, float | None]], higher_is_worse: bool) -> None:
    present = [(rank, v) for rank, v in values if v is not None]
    if not present:
        return
    nums = [v for _, v in present]
    sign = -1 if higher_is_worse else 1
    worst = min(present, key=lambda rv: (sign * rv[1], rv[0] if rv[0] is not None else 0))
    out[key] = Stat(min(nums), statistics.median(nums), max(nums), worst[0])
