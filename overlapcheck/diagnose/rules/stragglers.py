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

from overlapcheck.diagnose.facts.job import JobFacts
from overlapcheck.diagnose.finding import finding
from overlapcheck.diagnose.rule import Rule
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


def straggler(facts: JobFacts) -> list[Finding]:
    """The rank the others wait for, found per collective kind by waiting time (docs/rules.md, Stragglers).

    For each collective, a rank's wait is its kernel duration minus the shortest duration of that collective
    across ranks. A kind tells a straggler when one rank waits least (at most half the median other rank), the
    others' median exposed waiting for it is at least 1 % of the step, and it arrives last (shortest kernel) at
    the collectives that carry most of the kind's spread, so that jitter-only collectives cannot outvote the few
    that tell. Across kinds, the rank the others wait for longest. Its cost is the compute it needs per step
    beyond the median rank when that is what makes it late (its GPU is slow), else the median over the other
    ranks of the exposed time per step they wait for it (its host is late, or the cause is not in its trace)."""
    results = facts.results
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
    if _late_group(kinds, steps) is not None:
        return []  # several ranks arrive late together: a group (slow-node, when their traces show why), not one
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
    first = sigs[ranks[0]].keys
    own = {key: i for i, key in enumerate(first)}
    # ranks that issued the same collectives in the same order (nearly always all of them) share one index: a
    # dict per rank would be 5 KB a rank at 120 collectives, for 50,000 ranks at once
    index = {r: own if sigs[r].keys == first else {key: i for i, key in enumerate(sigs[r].keys)} for r in ranks}
    by_kind: dict[str, list[str]] = {}
    for key in first:
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


SPLIT_RATIO = 2.0  # two clusters are clear when the gap between them is over twice the widest one's own range


@dataclass(frozen=True)
class _Group:
    """A set of ranks that arrive late together (slow_node): columns into `ranks`, and why they are late."""

    ranks: list[int]
    cols: list[int]
    late_on: str  # "gpu" | "host"
    cost: float  # per step: its extra compute (gpu), else the other ranks' median exposed waiting for it
    evidence: dict[str, Any]
    covers: dict[int, float]


def _two_clusters(values: np.ndarray) -> np.ndarray | None:
    """Mask of the upper of two clear clusters of `values` (cut at the widest gap between sorted values, the gap
    over SPLIT_RATIO times the larger cluster's range); None when the values do not split that way."""
    if len(values) < 3:
        return None
    order = np.argsort(values, kind="stable")
    v = values[order]
    gaps = np.diff(v)
    cut = int(np.argmax(gaps)) + 1
    spread = max(v[cut - 1] - v[0], v[-1] - v[cut])
    if gaps[cut - 1] <= SPLIT_RATIO * spread or gaps[cut - 1] <= 0:
        return None
    upper = np.zeros(len(values), dtype=bool)
    upper[order[cut:]] = True
    return upper


def _late_group(kinds: dict[str, _Kind], steps: np.ndarray) -> np.ndarray | None:
    """Mask of the ranks that arrive late together: each rank's own wait per step (every kind, against the
    shortest kernel of each collective) splits into two clear clusters, and the lower one (they wait less: the
    others wait for them) has at least 2 ranks and at most half of them. None otherwise."""
    own = np.sum([_waits(k, steps) for k in kinds.values()], axis=0)
    upper = _two_clusters(own)
    if upper is None or not 2 <= int((~upper).sum()) <= len(own) // 2:
        return None
    return ~upper


def _apart(group: np.ndarray, values: np.ndarray) -> float | None:
    """How much more the group's values are than the others' (median against median), when every group rank's
    value is above every other rank's; else None."""
    if not group.any() or group.all() or values[group].min() <= values[~group].max():
        return None
    return float(np.median(values[group]) - np.median(values[~group]))


def _slow_group(results: Sequence[RankResult]) -> _Group | None:
    """The ranks the others wait for together (docs/rules.md, Slow node): per rank its own wait per step (every
    kind, against the shortest kernel of each collective) splits into two clear clusters, the lower one of at
    least 2 ranks and at most half of them; and what makes them late is in their traces: every one of them
    computes longer per step than every other rank (the GPU), or starts its steps later (the host's lead-in),
    by more than 1 % of the step. Their cost, as for one straggler: slow GPUs, the compute the group needs per
    step beyond the other ranks (medians); a late host, the median over the other ranks of the exposed time per
    step they wait for the group (their kernel beyond the group's shortest one at each collective). Either way
    the other ranks' exposed waiting is what the group explains there (`covers`)."""
    sigs = {r.metrics.rank: r.signature for r in results if r.signature is not None and r.metrics.rank is not None}
    if len(sigs) < 4 or _partial(results):
        return None
    ranks = sorted(sigs)
    kinds = _matched(sigs, ranks)
    if not kinds:
        return None
    steps = np.array([max(1, sigs[r].steps) for r in ranks], dtype=np.float64)
    group = _late_group(kinds, steps)
    if group is None:
        return None
    upper = ~group
    own = np.sum([_waits(k, steps) for k in kinds.values()], axis=0)
    metrics = {r.metrics.rank: r.metrics for r in results if r.metrics.rank is not None}
    step_times = [m.step_time_us / max(1, len(m.steps)) for m in metrics.values() if m.step_time_us]
    floor = MIN_STEP_SHARE * statistics.median(step_times) if step_times else 0.0
    cols = np.flatnonzero(group).tolist()
    exposed_for = np.sum([_waiting_for_group(k, steps, cols, exposed=True) for k in kinds.values()], axis=0)
    waiting_for = np.sum([_waiting_for_group(k, steps, cols, exposed=False) for k in kinds.values()], axis=0)
    others = np.flatnonzero(upper)
    cost = float(np.median(exposed_for[others]))
    if cost < floor or cost <= 0:
        return None
    compute_map = _compute_per_step(list(metrics.values()))
    compute = np.array([compute_map.get(r, np.nan) for r in ranks])
    gaps = np.array([sigs[r].host_gap_us if sigs[r].host_gap_us is not None else np.nan for r in ranks])
    gpu_extra = _apart(group, compute) if not np.isnan(compute).any() else None
    host_extra = _apart(group, gaps) if not np.isnan(gaps).any() else None
    gpu_extra = gpu_extra if gpu_extra is not None and gpu_extra > floor else None
    others_waiting = float(np.median(waiting_for[others]))
    if host_extra is not None and not (host_extra > floor and host_extra >= HOST_SHARE * others_waiting):
        host_extra = None
    if gpu_extra is not None and (host_extra is None or gpu_extra >= host_extra):
        late_on = "gpu"
    elif host_extra is not None:
        late_on = "host"
    else:
        return None  # they arrive late, but their traces do not show why: a network path, not a slow node
    members = [ranks[c] for c in cols]
    # as for one straggler: a slow GPU costs the compute it needs beyond the others (everyone waits that long),
    # a late host the others' exposed waiting
    cost = gpu_extra if late_on == "gpu" and gpu_extra is not None else cost

    def median_of(values: np.ndarray, sel: np.ndarray) -> float | None:
        return None if np.isnan(values[sel]).any() else round(float(np.median(values[sel])), 3)

    evidence: dict[str, Any] = {
        "ranks": members,
        "late_on": late_on,
        "own_wait_us_per_step": {
            "group_max": round(float(own[group].max()), 3),
            "others_min": round(float(own[upper].min()), 3),
        },
        "others_wait_us_per_step": {
            "min": round(float(exposed_for[others].min()), 3),
            "median": round(float(np.median(exposed_for[others])), 3),
            "max": round(float(exposed_for[others].max()), 3),
        },
        "extra_compute_us_per_step": round(gpu_extra, 3) if gpu_extra is not None else None,
        "compute_us_per_step": {"group_median": median_of(compute, group), "others_median": median_of(compute, upper)},
        "host_gap_us_per_step": {"group_median": median_of(gaps, group), "others_median": median_of(gaps, upper)},
        "method": "per rank: kernel duration minus the shortest duration of the same collective across ranks, every "
        "kind (matched by process group, kind and order; durations only); two clusters split at the widest gap, "
        f"over {SPLIT_RATIO:g}x the wider cluster's range; every rank of the group computes longer (or starts its "
        "steps later) than every other rank",
    }
    covers = {ranks[r]: round(float(exposed_for[r]), 3) for r in others.tolist()}
    return _Group(members, cols, late_on, cost, evidence, covers)


def _waiting_for_group(k: _Kind, steps: np.ndarray, cols: list[int], exposed: bool) -> np.ndarray:
    """Per rank: how long per step it waits in this kind's collectives for the last of the group `cols` to
    arrive (its duration beyond the group's shortest), all of it or only the part no compute covered."""
    wait = np.clip(k.dur - k.dur[:, cols].min(axis=1, keepdims=True), 0.0, None) * k.inside
    return np.asarray((wait * k.exposed if exposed else wait).sum(axis=0) / steps)


def slow_node(facts: JobFacts) -> list[Finding]:
    """Several ranks arrive late together, e.g. every GPU of a throttled node: the last arrival rotates among
    them, so no single rank carries the collectives' spread (`straggler` needs one), while the other ranks wait
    for the group inside their NCCL kernels. Found by `_slow_group`; named by host (the run manifest's `ranks`,
    else the traces' `host_name`) or by rank range and GPUs per node. A group that arrives late without computing
    longer or starting later (a slow network path: its transfers are slow, its compute is not) is not a slow
    node. Its cost is what healing it saves (see `_slow_group`); the other ranks' waiting for it is its, not
    peer-wait's or a stream wait's."""
    results, job = facts.results, facts.job
    group = _slow_group(results)
    if group is None:
        return []
    known = job.hosts
    metrics = {r.metrics.rank: r.metrics for r in results if r.metrics.rank is not None}
    hosts = sorted({known.get(r) or metrics[r].host or "" for r in group.ranks} - {""})
    all_named = all(known.get(r) or metrics[r].host for r in group.ranks)
    lo, hi = group.ranks[0], group.ranks[-1]
    contiguous = group.ranks == list(range(lo, hi + 1))
    span = f"ranks {lo}-{hi}" if contiguous else "ranks " + ", ".join(map(str, group.ranks))
    per_node = job.gpus_per_node
    node = lo // per_node if per_node and contiguous and lo % per_node == 0 and len(group.ranks) == per_node else None
    if all_named and len(hosts) == 1:
        name = f"Node {hosts[0]} ({span})"
    elif node is not None:
        name = f"Node {node} ({span}, {per_node} GPUs per node)"
    else:
        name = f"{len(group.ranks)} ranks ({span}{', on ' + ', '.join(hosts) if all_named and hosts else ''})"
    evidence = {**group.evidence, "hosts": hosts if all_named else None, "gpus_per_node": per_node, "node": node}
    ev = group.evidence
    if group.late_on == "gpu":
        c = ev["compute_us_per_step"]
        cause = (
            f"each of them computes longer per step than any other rank ({c['group_median']:.0f} µs vs "
            f"{c['others_median']:.0f} µs, medians): their GPUs are slow. Check that node's GPU clocks, thermals, "
            "power capping and host load (nvidia-smi -q -d PERFORMANCE shows throttle reasons)"
        )
        suffix = " (slow on the GPU)"
    else:
        h = ev["host_gap_us_per_step"]
        cause = (
            f"their GPU compute is typical, but each of their hosts starts its steps later than any other rank's "
            f"({h['group_median']:.0f} µs vs {h['others_median']:.0f} µs from the start of ProfilerStep to the "
            "first GPU launch, medians): check that node's CPU load, affinity and input pipeline"
        )
        suffix = " (late on the host)"
    w = ev["own_wait_us_per_step"]
    why = (
        f"{len(group.ranks)} ranks wait at most {w['group_max']:.0f} µs per step inside their collectives, the "
        f"others at least {w['others_min']:.0f} µs: the others wait for this group (the last to arrive rotates "
        f"among its ranks, so no single one is a straggler), {ev['others_wait_us_per_step']['median']:.0f} µs per step "
        "exposed (median rank); " + cause
    )
    steps = sorted({s.step for r in results for s in r.metrics.steps})
    return [
        finding(
            SLOW_NODE.id,
            f"{name} is slow{suffix}",
            why,
            group.cost,
            group.ranks,
            steps,
            evidence,
            covers=group.covers,
        )
    ]


# the other ranks' waits inside collectives for the straggler stall their compute: those stalls are its, and
# so is the reduce throttle's block on their reductions that wait for it
STRAGGLER = Rule(
    "straggler",
    cross=straggler,
    explains=("cross-stream-wait", "allgather-transfer-bound", "peer-wait", "reduce-event-throttle"),
    paces=True,
)

# as for the straggler: the other ranks' waits for the group are its, the job runs at its pace
SLOW_NODE = Rule(
    "slow-node",
    cross=slow_node,
    explains=("cross-stream-wait", "allgather-transfer-bound", "peer-wait", "reduce-event-throttle"),
    paces=True,
)
