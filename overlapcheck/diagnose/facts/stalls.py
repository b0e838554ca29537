"""Compute-stream stalls on other streams, and the collective each one waited for.

A stall is a gap on the compute stream before an activity that was already launched and whose stream
predecessor had finished, ending when an activity on another stream ends: the compute stream was held by a
cross-stream dependency (`cudaStreamWaitEvent` from `wait_stream` / `Work.wait()`, or NCCL / hardware
ordering). Its cost is the compute idle inside the gap. Each stall is traced back to the communication kernel
it waited for; the wait and stream rules share them out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from overlapcheck.diagnose.facts.sizing import AG
from overlapcheck.trace import classify as C

if TYPE_CHECKING:
    from overlapcheck.diagnose.facts.view import RankFacts

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


def find_stalls(view: RankFacts) -> Stalls:
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


def _collectives_behind(view: RankFacts, rows: np.ndarray, other: np.ndarray) -> np.ndarray:
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


def on_demand(view: RankFacts, st: Stalls) -> np.ndarray:
    """Stalls on an all-gather launched after the compute before the stall: fetched when needed, not earlier."""
    g = view.gpu
    has = st.comm >= 0
    out = np.zeros(len(st.kernel), dtype=bool)
    c = st.comm[has]
    out[has] = (g.coll[c] == AG) & (view.launch[c] > st.prev_launch[has])
    return out


def not_prefetched(view: RankFacts, st: Stalls) -> np.ndarray:
    """On-demand all-gather stalls in the steps that have enough of them to be a pattern (`per_step_pattern`):
    the first fetch of forward and of backward has nothing before it to hide behind."""
    return per_step_pattern(view, st, on_demand(view, st))


def per_step_pattern(view: RankFacts, st: Stalls, mask: np.ndarray) -> np.ndarray:
    """The stalls of `mask` in the steps (of the stalled activity, by its launch) that hold at least
    MIN_ON_DEMAND_PER_STEP of them: a pattern is counted in each step where it holds, not averaged over steps
    (18 in one step of three are not 6 per step). Stalls outside every step count as one more group."""
    steps = view.gpu_step[st.kernel]
    keep = mask.copy()
    values, counts = np.unique(steps[mask], return_counts=True)
    for step, n in zip(values.tolist(), counts.tolist(), strict=True):
        if n < MIN_ON_DEMAND_PER_STEP:
            keep[mask & (steps == step)] = False
    return keep


def job_first_step(view: RankFacts) -> int | None:
    """The trace's first profiled step when it is plausibly the job's first training step, else None.

    torch.profiler numbers `ProfilerStep#N` by its own count of `step()` calls since it was created, so the first
    step of a schedule with wait or warm-up steps (`ProfilerStep#2` for wait 1, warm-up 1) is not the job's first,
    and `ProfilerStep#0` is the first step of a profiler that started recording with the training loop. Taken as
    the job's first: the trace's first step is numbered 0. (A profiler created later in the job would number
    its first step 0 too; the trace cannot tell, and the reading is then a first profiled step that differs.)"""
    if not len(view.model.steps):
        return None
    first = int(view.model.steps.number.min())
    return first if first == 0 else None


def rest(view: RankFacts, st: Stalls, claimed: np.ndarray) -> np.ndarray:
    """Each stall's cost minus what more specific rules claimed."""
    return np.maximum(st.cost - claimed, 0.0)
