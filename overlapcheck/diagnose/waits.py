"""Compute-stream stalls on other streams: cross-stream waits and all-gathers that were not prefetched.

A stall is a gap on the compute stream before an activity that was already launched and whose stream
predecessor had finished, ending when an activity on another stream ends: the compute stream was held by a
cross-stream dependency (`cudaStreamWaitEvent` from `wait_stream` / `Work.wait()`, or NCCL / hardware
ordering). Its cost is the compute idle inside the gap. Each stall is traced back to the communication kernel
it waited for; the rules in this module and in `streams` share them out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from overlapcheck.diagnose.context import RankView
from overlapcheck.diagnose.finding import config_value, finding, make_fix
from overlapcheck.diagnose.registry import rank_rule
from overlapcheck.diagnose.sizing import AG, DEFAULT_PREFETCH_BUCKET
from overlapcheck.trace import classify as C

STALL_MIN_US = 10.0  # shorter gaps are launch latency
DEPENDENCY_TOLERANCE_US = 5.0  # how close the end of the awaited activity and the stalled start must be
_CHAIN = 16  # how many abutting activities to walk back on the awaited stream to find the collective
MIN_ON_DEMAND_PER_STEP = 2


@dataclass
class Stalls:
    """Stalls of the compute stream, one row each."""

    kernel: np.ndarray  # GPU row of the stalled activity
    start: np.ndarray  # the gap: [start, end)
    end: np.ndarray
    comm: np.ndarray  # GPU row of the collective waited for, -1 when none
    cost: np.ndarray  # compute idle in the gap
    prev_launch: np.ndarray  # launch time of the activity before the stalled one on the compute stream


def stalls(view: RankView) -> Stalls:
    """The compute stream's stalls (computed once per rank)."""
    cached = view.__dict__.get("_stalls")
    if cached is None:
        cached = view.__dict__["_stalls"] = _find_stalls(view)
    return cached


def _find_stalls(view: RankView) -> Stalls:
    g = view.gpu
    empty = np.zeros(0, dtype=np.int64)
    on_s = np.flatnonzero(g.stream == view.compute_stream)
    other = np.flatnonzero(g.stream != view.compute_stream)
    if len(on_s) < 2 or not len(other):
        return Stalls(empty, np.zeros(0), np.zeros(0), empty, np.zeros(0), np.zeros(0))
    on_s = on_s[np.argsort(g.start[on_s], kind="stable")]
    prev_end = np.maximum.accumulate(g.end[on_s])[:-1]
    k = on_s[1:]
    gap_start = np.maximum(prev_end, view.launch[k])
    stalled = g.start[k] - gap_start >= STALL_MIN_US
    other = other[np.argsort(g.end[other], kind="stable")]
    j = np.searchsorted(g.end[other], g.start[k] + DEPENDENCY_TOLERANCE_US, side="right") - 1
    ok = stalled & (j >= 0)
    ok[ok] = g.end[other[j[ok]]] >= g.start[k[ok]] - DEPENDENCY_TOLERANCE_US
    rows = np.flatnonzero(ok)
    awaited = other[j[rows]]
    comm = _collectives_behind(view, awaited, other)
    k_rows = k[rows]
    start, end = gap_start[rows], g.start[k_rows]
    return Stalls(k_rows, start, end, comm, view.idle(start, end), view.launch[on_s[:-1][rows]])


def _collectives_behind(view: RankView, rows: np.ndarray, other: np.ndarray) -> np.ndarray:
    """For each awaited activity: the collective it is, or follows closely off the compute stream (e.g. the `cat`
    that unflattens an all-gather, on the gather stream after the NCCL stream); -1 when there is none.
    `other` are the activities off the compute stream, sorted by end."""
    g = view.gpu
    ends = g.end[other]
    out = np.full(len(rows), -1, dtype=np.int64)
    current = rows.copy()
    for _ in range(_CHAIN):
        is_comm = g.cls[current] == C.COMM
        found = (out < 0) & is_comm
        out[found] = current[found]
        todo = (out < 0) & ~is_comm & (current >= 0)
        if not todo.any():
            break
        # the latest-ending activity that ended within the tolerance of this one's start, preferring a collective
        t = g.start[current[todo]]
        lo = np.searchsorted(ends, t - DEPENDENCY_TOLERANCE_US, side="left")
        hi = np.searchsorted(ends, t + DEPENDENCY_TOLERANCE_US, side="right")
        prev = np.full(int(todo.sum()), -1, dtype=np.int64)
        for n, (a, b, me) in enumerate(zip(lo.tolist(), hi.tolist(), current[todo].tolist(), strict=True)):
            cand = other[a:b]
            cand = cand[cand != me]
            if len(cand):
                comm = cand[g.cls[cand] == C.COMM]
                prev[n] = comm[-1] if len(comm) else cand[-1]
        nxt = np.full(len(rows), -1, dtype=np.int64)
        nxt[todo] = prev
        current = np.where(todo, nxt, -1)
    return out


def on_demand(view: RankView, st: Stalls) -> np.ndarray:
    """Stalls on an all-gather launched after the compute before the stall: fetched when needed, not earlier."""
    g = view.gpu
    has = st.comm >= 0
    out = np.zeros(len(st.kernel), dtype=bool)
    c = st.comm[has]
    out[has] = (g.coll[c] == AG) & (view.launch[c] > st.prev_launch[has])
    return out


def not_prefetched(view: RankView, st: Stalls) -> np.ndarray:
    """On-demand all-gather stalls, when there are enough per step to be a pattern: the first fetch of forward
    and of backward has nothing before it to hide behind."""
    mask = on_demand(view, st)
    return mask if mask.sum() / view.n_steps >= MIN_ON_DEMAND_PER_STEP else np.zeros_like(mask)


def rest(view: RankView, st: Stalls, claimed: np.ndarray) -> np.ndarray:
    """Each stall's cost minus what more specific rules claimed."""
    return np.maximum(st.cost - claimed, 0.0)


@rank_rule
def allgather_not_prefetched(view: RankView) -> list[dict[str, Any]]:
    """partitioned_param_coordinator.py (v0.6 .. 0.19.x) fetch_sub_module prefetches the next modules'
    parameters only when the parameter trace is complete (is_complete_trace) and stage3_prefetch_bucket_size > 0;
    otherwise each all-gather is issued when its module runs and `current_stream().wait_stream(__allgather_stream)`
    makes compute wait for the whole transfer."""
    from overlapcheck.diagnose.streams import claimed_by_specific, no_concurrency

    if no_concurrency(view):
        return []
    st = stalls(view)
    mask = not_prefetched(view, st)
    if not mask.any():
        return []
    costs = rest(view, st, claimed_by_specific(view, st))[mask]
    per_step = mask.sum() / view.n_steps
    cost, steps = view.per_step(costs, view.launch[st.kernel[mask]])
    prefetch = config_value(view.config, "zero_optimization.stage3_prefetch_bucket_size")
    if prefetch is not None and prefetch <= 0:
        why = "stage3_prefetch_bucket_size is 0, so no all-gather is issued before its module needs it"
        fix = make_fix(view.config, {"zero_optimization.stage3_prefetch_bucket_size": DEFAULT_PREFETCH_BUCKET})
    else:
        why = (
            "all-gathers are issued only when their module runs: the parameter trace is being invalidated "
            "(dynamic control flow); set log_trace_cache_warnings to see which module changes the order"
        )
        fix = make_fix(view.config, {"zero_optimization.log_trace_cache_warnings": True})
    evidence = {"on_demand_fetches_per_step": round(float(per_step), 2), "prefetch_bucket_size": prefetch}
    return [
        finding(
            "allgather-not-prefetched",
            "Compute waits for all-gathers that were not prefetched",
            why,
            cost,
            [view.rank_id],
            steps,
            evidence,
            fix,
        )
    ]


@rank_rule
def cross_stream_waits(view: RankView) -> list[dict[str, Any]]:
    """torch `Stream.wait_stream` / `Work.wait()` record an event on one stream and make another wait for it
    (cudaStreamWaitEvent). DeepSpeed ZeRO-3 makes the compute stream wait for __allgather_stream in
    fetch_sub_module (partitioned_param_coordinator.py), and since v0.14.3 (#5606) ZeRO-1/2 average_tensor makes it
    wait for the reduction stream (DS #8364). Stalls not owned by a more specific rule are reported here, by the
    collective they waited for."""
    from overlapcheck.diagnose.streams import claimed_by_specific, no_concurrency

    if no_concurrency(view):
        return []
    st = stalls(view)
    left = rest(view, st, claimed_by_specific(view, st))
    left[on_demand(view, st)] = 0.0  # not prefetched: a pattern, or the first fetch of a pass (inherent)
    left[np.isin(st.comm, view.first_gathers)] = 0.0  # the step's first gather is waited for in any case
    g = view.gpu
    out = []
    kinds = np.where(st.comm >= 0, g.coll[np.maximum(st.comm, 0)], -1)
    for kind in np.unique(kinds).tolist():
        sel = (kinds == kind) & (left > 0)
        if not sel.any():
            continue
        cost, steps = view.per_step(left[sel], view.launch[st.kernel[sel]])
        name = C.COLLECTIVES[kind] if kind >= 0 else "non-communication work"
        awaited = st.comm[sel][st.comm[sel] >= 0]
        evidence = {
            "waited_for": name,
            "stalls_per_step": round(float(sel.sum()) / view.n_steps, 2),
            "stream_wait_events_per_step": _stream_waits_per_step(view),
            "compute_stream": view.compute_stream,
            "waited_on_streams": sorted({int(s) for s in g.stream[awaited].tolist()}),
        }
        why = (
            f"the compute stream is held by a stream wait until {name} finishes, and no other compute is ready "
            "to run meanwhile"
        )
        if kind == AG:
            why += (
                "; these all-gathers were prefetched but take longer than the compute before them: a larger "
                "stage3_prefetch_bucket_size starts them earlier, zero_quantized_weights or hpZ make them smaller"
            )
        out.append(
            finding(
                "cross-stream-wait",
                f"Compute stream waits for {name} on another stream",
                why,
                cost,
                [view.rank_id],
                steps,
                evidence,
                {},
                key=name,
            )
        )
    return out


def _stream_waits_per_step(view: RankView) -> float | None:
    """`Stream Wait Event` records (enable_cuda_sync_events) that make the compute stream wait, per step; None
    when the trace has no cuda_sync events."""
    s = view.model.syncs
    if not len(s):
        return None
    waits = view.name_mask(s.name, lambda n: n == "Stream Wait Event") & (s.stream == view.compute_stream)
    return round(float(waits.sum()) / view.n_steps, 2)
