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


def job_notes(ranks: Sequence[RankMetrics]) -> list[str]:
    """What is true of the job and of no single rank: ranks that captured fewer (or other) profiled steps than the
    rest, so their per-step means cover other steps."""
    steps = {r.rank: tuple(s.step for s in r.steps) for r in ranks if r.rank is not None}
    if len({len(s) for s in steps.values()}) < 2 and len(set(steps.values())) < 2:
        return []
    common = statistics.mode(steps.values())
    odd = sorted((rank, s) for rank, s in steps.items() if s != common)
    shown = "; ".join(f"rank {rank}: {_steps(s)}" for rank, s in odd[:8])
    more = f"; and {len(odd) - 8} more ranks" if len(odd) > 8 else ""
    return [
        f"uneven capture: {len(steps) - len(odd)} ranks profiled {_steps(common)}, but {shown}{more}; each rank's "
        "per-step numbers are the mean over its own steps, and steps missing on a rank are not compared across ranks"
    ]


def _steps(numbers: tuple[int, ...]) -> str:
    if not numbers:
        return "no steps"
    word = "step" if len(numbers) == 1 else "steps"
    return f"{len(numbers)} {word} ({', '.join(str(n) for n in numbers[:6])}{', ...' if len(numbers) > 6 else ''})"


def _add(out: dict[str, Stat], key: str, values: list[tuple[int | None, float | None]], higher_is_worse: bool) -> None:
    present = [(rank, v) for rank, v in values if v is not None]
    if not present:
        return
    nums = [v for _, v in present]
    sign = -1 if higher_is_worse else 1
    worst = min(present, key=lambda rv: (sign * rv[1], rv[0] if rv[0] is not None else 0))
    out[key] = Stat(min(nums), statistics.median(nums), max(nums), worst[0])
