"""Stragglers: one rank arrives late at the collectives and every other rank waits for it inside its NCCL kernels.

A collective's kernels end together on every rank, so the shortest kernel of one collective across ranks is
its transfer time and the rest of each rank's kernel is waiting for peers (the method of the PyTorch profiler's
TensorBoard plugin, `profiler/loader.py`). Only durations are compared, never timestamps, so clock offsets
between nodes do not matter. Collectives are matched across ranks by process group, kind and order.
"""

from __future__ import annotations

import statistics
from collections import Counter
from typing import Any

import numpy as np

from overlapcheck.diagnose.context import RankView
from overlapcheck.diagnose.registry import cross_rule, rank_rule
from overlapcheck.trace import classify as C

SIGNATURE = "_collectives"
LATEST_SHARE = 0.5  # the straggler arrives last at at least this share of the collectives
MIN_SPREAD_US = 2.0  # collectives whose durations differ less than this across ranks say nothing
MIN_STEP_SHARE = 0.01  # a straggler costs at least this share of the step
OWN_WAIT_SHARE = 0.5  # the straggler itself waits at most half as long as the median other rank


@rank_rule
def collective_signature(view: RankView) -> list[dict[str, Any]]:
    """Per-rank data for the cross-rank rule: each collective's key, duration and exposed fraction."""
    g = view.gpu
    idx = np.flatnonzero(view.is_comm)
    if not len(idx):
        return []
    idx = idx[np.argsort(g.start[idx], kind="stable")]
    dur = g.end[idx] - g.start[idx]
    exposed = np.where(dur > 0, view.idle(g.start[idx], g.end[idx]) / np.maximum(dur, 1e-9), 0.0)
    counters: Counter[tuple[int, int]] = Counter()
    keys = []
    for pg, coll in zip(g.pg[idx].tolist(), g.coll[idx].tolist(), strict=True):
        counters[(pg, coll)] += 1
        keys.append(f"{view.names[pg] if pg >= 0 else ''}|{C.COLLECTIVES[coll]}|{counters[(pg, coll)]}")
    return [
        {
            "rule": SIGNATURE,
            "keys": keys,
            "dur": np.round(dur, 3).tolist(),
            "exposed": np.round(exposed, 4).tolist(),
            "in_step": (view.gpu_step[idx] >= 0).tolist(),
            "steps": view.n_steps,
        }
    ]


@cross_rule
def straggler(report: dict[str, Any], config: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The rank that is last to arrive at most collectives. Its cost is the compute time per step it needs beyond
    the median rank (everyone waits that long for it); without per-step compute, the median over the other
    ranks of the exposed time they spend waiting for it."""
    from overlapcheck.diagnose.finding import finding

    sigs = {
        r["rank"]: s for r in report.get("ranks") or [] for s in r.get("_findings") or [] if s.get("rule") == SIGNATURE
    }
    if len(sigs) < 2:
        return []
    table: dict[str, dict[int, tuple[float, float, bool]]] = {}
    for rank, s in sigs.items():
        for key, d, e, inside in zip(s["keys"], s["dur"], s["exposed"], s["in_step"], strict=True):
            table.setdefault(key, {})[rank] = (d, e, inside)
    ranks = sorted(sigs)
    latest: Counter[int] = Counter()
    wait = dict.fromkeys(ranks, 0.0)
    informative = 0
    for per_rank in table.values():
        if len(per_rank) != len(ranks):
            continue
        durs = {r: v[0] for r, v in per_rank.items()}
        low, high = min(durs.values()), max(durs.values())
        for r, (d, e, inside) in per_rank.items():
            if inside:
                wait[r] += (d - low) * e
        if high - low >= MIN_SPREAD_US:
            informative += 1
            latest[min(durs, key=durs.get)] += 1
    if not informative:
        return []
    rank, count = latest.most_common(1)[0]
    others = [wait[r] / sigs[r]["steps"] for r in ranks if r != rank]
    own = wait[rank] / sigs[rank]["steps"]
    if count < LATEST_SHARE * informative or own > OWN_WAIT_SHARE * statistics.median(others):
        return []
    extra = _extra_compute(report, rank)
    cost = extra if extra is not None and extra > 0 else statistics.median(others)
    steps = [r["step_time_us"] / len(r["steps"]) for r in report["ranks"] if r.get("steps")]
    if steps and cost < MIN_STEP_SHARE * statistics.median(steps):
        return []  # one rank is always last by a little: jitter, not a straggler
    host = next((r.get("host") for r in report["ranks"] if r["rank"] == rank), None)
    evidence = {
        "rank": rank,
        "host": host,
        "last_to_arrive": f"{count}/{informative} collectives",
        "others_wait_us_per_step": {
            "min": round(min(others), 3),
            "median": round(cost, 3),
            "max": round(max(others), 3),
        },
        "own_wait_us_per_step": round(wait[rank] / sigs[rank]["steps"], 3),
        "method": "kernel duration minus the shortest duration of the same collective across ranks",
    }
    return [
        finding(
            "straggler",
            f"Rank {rank}{f' ({host})' if host else ''} is a straggler",
            f"rank {rank} arrives last at {count} of {informative} collectives; the other ranks spend the "
            "difference waiting inside their NCCL kernels. Check that GPU's clocks, thermals, power and "
            "host load",
            cost,
            [rank],
            [],
            evidence,
            {},
        )
    ]


def _extra_compute(report: dict[str, Any], rank: int) -> float | None:
    """Compute per step of `rank` minus the median over the other ranks (None without per-step numbers)."""
    per_rank = {}
    for r in report.get("ranks") or []:
        steps = r.get("steps") or []
        if steps:
            per_rank[r["rank"]] = sum(s["compute_us"] for s in steps) / len(steps)
    if rank not in per_rank or len(per_rank) < 2:
        return None
    return per_rank[rank] - statistics.median(v for r, v in per_rank.items() if r != rank)
