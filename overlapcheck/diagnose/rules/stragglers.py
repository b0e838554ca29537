"""Stragglers: one rank arrives late at the collectives and every other rank waits for it inside its NCCL kernels.

A collective's kernels end together on every rank, so the shortest kernel of one collective across ranks is
its transfer time and the rest of each rank's kernel is waiting for peers (the method of the PyTorch profiler's
TensorBoard plugin, `profiler/loader.py`). Only durations are compared, never timestamps, so clock offsets
between nodes do not matter. Collectives are matched across ranks by process group, kind and order.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Sequence

import numpy as np

from overlapcheck.analysis.bandwidth import group_sizes, message_bytes
from overlapcheck.diagnose.facts.view import RankFacts
from overlapcheck.diagnose.finding import finding
from overlapcheck.job import JobContext
from overlapcheck.model import CollectiveSignature, Finding, RankMetrics, RankResult
from overlapcheck.trace import classify as C

LATEST_SHARE = 0.5  # the straggler arrives last at at least this share of the collectives
MIN_SPREAD_US = 2.0  # collectives whose durations differ less than this across ranks say nothing
MIN_STEP_SHARE = 0.01  # a straggler costs at least this share of the step
OWN_WAIT_SHARE = 0.5  # the straggler itself waits at most half as long as the median other rank


def collective_signature(view: RankFacts) -> CollectiveSignature | None:
    """Per-rank data for the cross-rank rule: each collective's key, duration and exposed fraction."""
    g = view.gpu
    idx = np.flatnonzero(view.is_comm)
    if not len(idx):
        return None
    idx = idx[np.argsort(g.start[idx], kind="stable")]
    dur = g.end[idx] - g.start[idx]
    exposed = np.where(dur > 0, view.idle(g.start[idx], g.end[idx]) / np.maximum(dur, 1e-9), 0.0)
    counters: Counter[tuple[int, int]] = Counter()
    keys = []
    for pg, coll in zip(g.pg[idx].tolist(), g.coll[idx].tolist(), strict=True):
        counters[(pg, coll)] += 1
        keys.append(f"{view.names[pg] if pg >= 0 else ''}|{C.COLLECTIVES[coll]}|{counters[(pg, coll)]}")
    return CollectiveSignature(
        keys=keys,
        dur=np.round(dur, 3).tolist(),
        exposed=np.round(exposed, 4).tolist(),
        in_step=(view.gpu_step[idx] >= 0).tolist(),
        steps=view.n_steps,
        bytes=message_bytes(view.model)[idx].tolist(),
        group=group_sizes(view.model)[idx].tolist(),
    )


def straggler(results: Sequence[RankResult], job: JobContext) -> list[Finding]:
    """The rank that is last to arrive at most collectives. Its cost is the compute time per step it needs beyond
    the median rank (everyone waits that long for it); without per-step compute, or when that excess is below
    the jitter floor (so its compute is not what makes it late), the median over the other ranks of the
    exposed time they spend waiting for it."""
    sigs = {r.metrics.rank: r.signature for r in results if r.signature is not None and r.metrics.rank is not None}
    if len(sigs) < 2:
        return []
    table: dict[str, dict[int, tuple[float, float, bool]]] = {}
    for rank, sig in sigs.items():
        for key, d, e, inside in zip(sig.keys, sig.dur, sig.exposed, sig.in_step, strict=True):
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
            latest[min(durs, key=durs.__getitem__)] += 1
    if not informative:
        return []
    rank, count = latest.most_common(1)[0]
    others = [wait[r] / sigs[r].steps for r in ranks if r != rank]
    own = wait[rank] / sigs[rank].steps
    if count < LATEST_SHARE * informative or own > OWN_WAIT_SHARE * statistics.median(others):
        return []
    metrics = [r.metrics for r in results]
    extra = _extra_compute(metrics, rank)
    steps = [r.step_time_us / len(r.steps) for r in metrics if r.steps]
    floor = MIN_STEP_SHARE * statistics.median(steps) if steps else 0.0
    # extra compute below the jitter floor is not what makes it late (the host or its input is): the others' wait
    cost = extra if extra is not None and extra > max(floor, 0.0) else statistics.median(others)
    if steps and cost < MIN_STEP_SHARE * statistics.median(steps):
        return []  # one rank is always last by a little: jitter, not a straggler
    host = next((r.host for r in metrics if r.rank == rank), None)
    evidence = {
        "rank": rank,
        "host": host,
        "last_to_arrive": f"{count}/{informative} collectives",
        "others_wait_us_per_step": {
            "min": round(min(others), 3),
            "median": round(cost, 3),
            "max": round(max(others), 3),
        },
        "own_wait_us_per_step": round(wait[rank] / sigs[rank].steps, 3),
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
        )
    ]


def _extra_compute(ranks: Sequence[RankMetrics], rank: int) -> float | None:
    """Compute per step of `rank` minus the median over the other ranks (None without per-step numbers)."""
    per_rank = {r.rank: sum(s.compute_us for s in r.steps) / len(r.steps) for r in ranks if r.steps}
    if rank not in per_rank or len(per_rank) < 2:
        return None
    return per_rank[rank] - statistics.median(v for r, v in per_rank.items() if r != rank)
