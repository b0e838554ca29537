"""Stragglers: one rank arrives late at the collectives and every other rank waits for it inside its NCCL kernels.

A collective's kernels end together on every rank, so the shortest kernel of one collective across ranks is
its transfer time and the rest of each rank's kernel is waiting for peers (the method of the PyTorch profiler's
TensorBoard plugin, `profiler/loader.py`). Only durations are compared, never timestamps, so clock offsets
between nodes do not matter. Collectives are matched across ranks by process group, kind and order.

The rule weighs waiting time, per collective kind: a straggler that only some kinds feel (its slower compute
absorbed by prefetched all-gathers, felt at the reduce-scatters; its late host felt at each step's first
all-gather) shows in that kind however many jitter-only collectives of other kinds there are. Then it tells
apart a rank whose GPU computes slower (more compute per step than the median rank) from one whose host starts
its steps late (a longer lead-in from the start of `ProfilerStep#N` to its first GPU launch:
`facts/hostgap.py`, measured in the rank's worker and carried in its `CollectiveSignature`).
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from overlapcheck.diagnose.finding import finding
from overlapcheck.diagnose.rule import Rule
from overlapcheck.job import JobContext
from overlapcheck.model import CollectiveSignature, Finding, RankMetrics, RankResult

LATEST_SHARE = 0.5  # the straggler arrives last at collectives that carry at least this share of a kind's spread
MIN_SPREAD_US = 2.0  # collectives whose durations differ less than this across ranks say nothing
MIN_STEP_SHARE = 0.01  # a straggler costs at least this share of the step (and the others wait that long)
OWN_WAIT_SHARE = 0.5  # the straggler itself waits at most half as long as the median other rank
TWO_RANK_OWN_WAIT_SHARE = 0.25  # with two ranks, at most a quarter as long as the other
HOST_SHARE = 0.5  # a late host: its longer lead-in accounts for at least this share of the others' waiting


@dataclass(frozen=True)
class _Kind:
    """One collective kind's collectives matched on every rank: (collectives, ranks) arrays."""

    dur: np.ndarray
    exposed: np.ndarray
    inside: np.ndarray  # ran inside a profiled step (only those count as waiting)


def straggler(results: Sequence[RankResult], job: JobContext) -> list[Finding]:
    """The rank the others wait for, found per collective kind by waiting time (docs/rules.md, Stragglers).

    For each collective, a rank's wait is its kernel duration minus the shortest duration of that collective
    across ranks. A kind tells a straggler when one rank waits least (at most half the median other rank), the
    others' median exposed waiting for it is at least 1 % of the step, and it arrives last (shortest kernel) at
    the collectives that carry most of the kind's spread, so that jitter-only collectives cannot outvote the few
    that tell. Across kinds, the rank the others wait for longest. Its cost is the compute it needs per step
    beyond the median rank when that is what makes it late (its GPU is slow), else the median over the other
    ranks of the exposed time per step they wait for it (its host is late, or the cause is not in its trace)."""
    sigs = {r.metrics.rank: r.signature for r in results if r.signature is not None and r.metrics.rank is not None}
    if len(sigs) < 2 or _partial(results):
        return []
    ranks = sorted(sigs)
    kinds = _matched(sigs, ranks)
    if not kinds:
        return []
    steps = np.array([max(1, sigs[r].steps) for r in ranks], dtype=np.float64)
    metrics = [r.metrics for r in results]
    step_times = [r.step_time_us / max(1, len(r.steps)) for r in metrics if r.step_time_us]
    floor = MIN_STEP_SHARE * statistics.median(step_times) if step_times else 0.0
    score: Counter[int] = Counter()  # column -> the others' exposed waiting for it in the kinds that tell it
    for k in kinds.values():
        col = int(np.argmin(_waits(k, steps)))
        stats = _kind_stats(k, steps, col)
        if _tells(stats, floor, len(ranks)):
            score[col] += stats["others_exposed_wait_us_per_step"]
    if not score:
        return []
    col = max(score, key=lambda c: (score[c], -c))
    rank = ranks[col]
    by_kind = {kind: _kind_stats(k, steps, col) for kind, k in kinds.items()}
    for stats in by_kind.values():
        stats["telling"] = _tells(stats, floor, len(ranks))
    others = [r for r in range(len(ranks)) if r != col]
    exposed_for = np.sum([_waiting_for(k, steps, col, exposed=True) for k in kinds.values()], axis=0)
    waiting_for = np.sum([_waiting_for(k, steps, col, exposed=False) for k in kinds.values()], axis=0)
    others_exposed = float(np.median(exposed_for[others]))
    others_waiting = float(np.median(waiting_for[others]))
    own_wait = float(sum(_waits(k, steps)[col] for k in kinds.values()))

    compute = _compute_per_step(metrics)
    extra = None
    if rank in compute and len(compute) >= 2:
        typical = statistics.median(v for r, v in compute.items() if r != rank)
        extra = compute[rank] - typical
    sig = sigs[rank]
    other_gaps = [sigs[r].host_gap_us for r in ranks if r != rank and sigs[r].host_gap_us is not None]
    gap_median = statistics.median(g for g in other_gaps if g is not None) if other_gaps else None
    gap_excess = sig.host_gap_us - gap_median if sig.host_gap_us is not None and gap_median is not None else None
    gpu_extra = extra if extra is not None and extra > floor else None  # slower compute beyond the jitter floor
    host_extra = (
        gap_excess
        if gap_excess is not None and gap_excess > floor and gap_excess >= HOST_SHARE * others_waiting
        else None
    )
    late_on: str | None = None  # the one that accounts for more of the lateness
    if gpu_extra is not None and (host_extra is None or gpu_extra >= host_extra):
        late_on = "gpu"
    elif host_extra is not None:
        late_on = "host"
    cost = extra if late_on == "gpu" and extra is not None else others_exposed
    if cost < floor or cost <= 0:
        return []  # one rank is always last by a little: jitter, not a straggler
    host = next((r.host for r in metrics if r.rank == rank), None)
    telling = {kind: s for kind, s in by_kind.items() if s["telling"]}
    frames = [
        {"frame": name, "us_per_step": us} for name, us in zip(sig.host_gap_frames, sig.host_gap_frame_us, strict=False)
    ]
    evidence: dict[str, Any] = {
        "rank": rank,
        "host": host,
        "late_on": late_on,
        "last_to_arrive": f"{sum(s['last_to_arrive'] for s in telling.values())}/"
        f"{sum(s['informative'] for s in telling.values())} collectives",
        "by_kind": by_kind,
        "others_wait_us_per_step": {
            "min": round(float(exposed_for[others].min()), 3),
            "median": round(others_exposed, 3),
            "max": round(float(exposed_for[others].max()), 3),
        },
        "own_wait_us_per_step": round(own_wait, 3),
        "compute_us_per_step": (
            {"rank": round(compute[rank], 3), "others_median": round(compute[rank] - extra, 3)}
            if extra is not None
            else None
        ),
        "extra_compute_us_per_step": round(extra, 3) if extra is not None else None,
        "host_gap_us_per_step": (
            {"rank": sig.host_gap_us, "others_median": round(gap_median, 3)}
            if sig.host_gap_us is not None and gap_median is not None
            else None
        ),
        "host_gap_frames": frames,
        "method": "per collective kind: kernel duration minus the shortest duration of the same collective across "
        "ranks (matched by process group, kind and order; durations only, so clock offsets do not matter); "
        "host lead-in: CPU time from the start of ProfilerStep#N to the step's first GPU launch, less syncs",
    }
    covers = {ranks[r]: round(float(exposed_for[r]), 3) for r in others}
    suffix = {"gpu": " (slow on the GPU)", "host": " (late on the host)"}.get(late_on or "", "")
    return [
        finding(
            STRAGGLER.id,
            f"Rank {rank}{f' ({host})' if host else ''} is a straggler{suffix}",
            _why(rank, telling, others_exposed, late_on, evidence),
            cost,
            [rank],
            [],
            evidence,
            covers=covers,
        )
    ]


def _partial(results: Sequence[RankResult]) -> bool:
    """Only some ranks of the world are here (a sub-sample, or ranks whose capture failed): a rank that waits may
    wait for one that is not, so none of those here can be named the one the others wait for."""
    worlds = {r.metrics.world_size for r in results if r.metrics.world_size}
    return bool(worlds) and len({r.metrics.rank for r in results}) < max(w for w in worlds if w is not None)


def _matched(sigs: dict[int, CollectiveSignature], ranks: list[int]) -> dict[str, _Kind]:
    """The collectives every rank has, by kind, in the lowest rank's issue order."""
    index = {r: {key: i for i, key in enumerate(sigs[r].keys)} for r in ranks}
    by_kind: dict[str, list[str]] = {}
    for key in sigs[ranks[0]].keys:
        if all(key in index[r] for r in ranks[1:]):
            by_kind.setdefault(key.rsplit("|", 2)[-2], []).append(key)
    out = {}
    for kind, keys in by_kind.items():
        cols = [np.array([index[r][key] for key in keys]) for r in ranks]
        out[kind] = _Kind(
            dur=np.stack([np.asarray(sigs[r].dur, dtype=np.float64)[c] for r, c in zip(ranks, cols, strict=True)], 1),
            exposed=np.stack(
                [np.asarray(sigs[r].exposed, dtype=np.float64)[c] for r, c in zip(ranks, cols, strict=True)], 1
            ),
            inside=np.stack([np.asarray(sigs[r].in_step, dtype=bool)[c] for r, c in zip(ranks, cols, strict=True)], 1),
        )
    return out


def _waits(k: _Kind, steps: np.ndarray) -> np.ndarray:
    """Per rank: its wait per step in this kind's collectives (duration minus the shortest across ranks)."""
    wait = k.dur - k.dur.min(axis=1, keepdims=True)
    return np.asarray((wait * k.inside).sum(axis=0) / steps)


def _waiting_for(k: _Kind, steps: np.ndarray, col: int, exposed: bool) -> np.ndarray:
    """Per rank: how long per step it waits in this kind's collectives for rank `col` to arrive (its duration
    beyond `col`'s), all of it or only the part no compute covered."""
    wait = np.clip(k.dur - k.dur[:, [col]], 0.0, None) * k.inside
    return np.asarray((wait * k.exposed if exposed else wait).sum(axis=0) / steps)


def _kind_stats(k: _Kind, steps: np.ndarray, col: int) -> dict[str, Any]:
    low = k.dur.min(axis=1)
    spread = k.dur.max(axis=1) - low
    informative = spread >= MIN_SPREAD_US
    last = informative & (k.dur[:, col] <= low)
    weight = float(spread[informative].sum())
    others = np.arange(k.dur.shape[1]) != col
    waits = _waits(k, steps)
    return {
        "collectives": int(len(k.dur)),
        "informative": int(informative.sum()),
        "last_to_arrive": int(last.sum()),
        "last_share_of_spread": round(float(spread[last].sum()) / weight, 3) if weight else 0.0,
        "others_exposed_wait_us_per_step": round(float(np.median(_waiting_for(k, steps, col, True)[others])), 3),
        "others_wait_us_per_step": round(float(np.median(waits[others])), 3),
        "own_wait_us_per_step": round(float(waits[col]), 3),
    }


def _tells(stats: dict[str, Any], floor: float, n_ranks: int) -> bool:
    """Whether one kind's collectives show this rank as the straggler (see `straggler`). With two ranks the share
    of the spread follows from the waits alone (own <= half the other's already makes it >= 2/3) and chance
    delays split 2:1 easily, so two ranks need a clearer imbalance (TWO_RANK_OWN_WAIT_SHARE)."""
    own_share = TWO_RANK_OWN_WAIT_SHARE if n_ranks == 2 else OWN_WAIT_SHARE
    return (
        stats["informative"] > 0
        and stats["others_exposed_wait_us_per_step"] >= max(floor, 1e-9)
        and stats["own_wait_us_per_step"] <= own_share * stats["others_wait_us_per_step"]
        and stats["last_share_of_spread"] >= LATEST_SHARE
    )


def _compute_per_step(ranks: Sequence[RankMetrics]) -> dict[int, float]:
    """Compute per step of each rank with per-step numbers."""
    return {r.rank: sum(s.compute_us for s in r.steps) / len(r.steps) for r in ranks if r.steps and r.rank is not None}


def _why(rank: int, telling: dict[str, dict[str, Any]], waited: float, late_on: str | None, ev: dict[str, Any]) -> str:
    arrivals = " and ".join(
        f"{s['last_to_arrive']} of {s['informative']} {kind.replace('_', '-')}s (those with "
        f"{s['last_share_of_spread']:.0%} of their spread across ranks)"
        for kind, s in telling.items()
    )
    text = (
        f"rank {rank} arrives last at {arrivals}; the other ranks wait for it inside their NCCL kernels, "
        f"{waited:.0f} µs per step exposed (median rank)"
    )
    compute, gap, frames = ev["compute_us_per_step"], ev["host_gap_us_per_step"], ev["host_gap_frames"]
    if late_on == "gpu":
        return (
            f"{text}. It needs more compute per step than the median rank: {compute['rank']:.0f} µs vs "
            f"{compute['others_median']:.0f} µs, so its GPU is slow. Check that GPU's clocks, thermals, power and "
            "host load"
        )
    typical_compute = (
        f"its GPU compute per step is typical ({compute['rank']:.0f} µs vs {compute['others_median']:.0f} µs)"
        if compute
        else None
    )
    if late_on == "host":
        where = ", ".join(f"{f['frame']} ({f['us_per_step']:.0f} µs)" for f in frames)
        loader = any("dataloader" in f["frame"].lower() or "utils/data/" in f["frame"] for f in frames)
        advice = (
            "Check its input pipeline: the DataLoader's num_workers, pin_memory and prefetch_factor, and that "
            "host's CPU affinity and load"
            if loader
            else "Check what its host does there, and that host's CPU affinity and load"
        )
        return (
            f"{text}. {(typical_compute[0].upper() + typical_compute[1:] + ', but its') if typical_compute else 'Its'}"
            f" host starts each step late: {gap['rank']:.0f} µs per step from the start of ProfilerStep to its first "
            f"GPU launch, vs {gap['others_median']:.0f} µs on the median rank"
            f"{f', spent in {where}' if where else ''}. {advice}"
        )
    parts = [typical_compute] if typical_compute else []
    if gap:
        parts.append(
            f"its host's lead-in to each step is typical ({gap['rank']:.0f} µs vs {gap['others_median']:.0f} µs)"
        )
    known = f"{' and '.join(parts)}: " if parts else ""
    return (
        f"{text}. {known[0].upper() + known[1:] if known else ''}its trace does not show what makes it late (before "
        "its profiled steps, between its launches, or its links). Check that rank's host, GPU and network"
    )


# the other ranks' waits inside collectives for the straggler stall their compute: those stalls are its, and
# so is the reduce throttle's block on their reductions that wait for it
STRAGGLER = Rule(
    "straggler",
    cross=straggler,
    explains=("cross-stream-wait", "allgather-transfer-bound", "peer-wait", "reduce-event-throttle"),
    paces=True,
)
