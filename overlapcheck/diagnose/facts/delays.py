"""What a host sync delayed after it returned: the later launches of its thread, compute stalls on the
collectives among them, and the compute-stream starvation they caused.

A host sync (DeepSpeed's reduce throttle, `cudaEventSynchronize` in `__reduce_and_partition_ipg_grads`; the
fetch throttle; any `.item()`) stops its thread. Everything the thread does after it returns happens that much
later: its launches of compute and of the next all-gathers included. When compute then stalls on such a gather
(facts/stalls.py) the stall is the sync's doing, not a missing prefetch; when the compute stream runs dry
waiting for one of those launches later on (a starvation window, facts/hostsyncs.py, that the call did not
return inside) the host never caught up after the block, and that idle is the sync's too.

The model: removing a call that waited for GPU work (hostsyncs.awaited_work) moves every later launch of its
thread earlier by its blocked time `B` (less what its own starvation windows already charged it,
hostsyncs.chain_costs), until the next call of another owner that waits for GPU work (on any thread: it
realigns the host with the GPU) or the end of the step. The later calls of the same owner do not end it: a
rule's cost is what removing all its calls saves, and with them gone nothing realigns the host there, so the
leads of a run of calls add up (DeepSpeed's reduce throttle blocks a few times in a row at the start of
backward; when the host is the slower side from then on, every later launch of backward comes that much
later). Each call still walks with its own lead; the idle a walk takes (a window's, a stall's) is taken from
what the earlier calls left. The compute stream is replayed from the call's return with that lead: `gain`, how
much earlier it would run at each activity, grows by the idle before an activity the lead lets start earlier
and is cut back where an activity is held by something that does not move:

- an activity its thread issued after the return starts up to `B` earlier than its own launch allowed;
- a starvation window (hostsyncs.starvation_windows) adds what a launch could win back there
  (hostsyncs.window_idle) not charged yet; one the call returned in is chain_costs' and adds nothing;
- a stall on a collective (facts/stalls.py) lets compute run no more than the collective moves: issued `B`
  earlier when the thread issued it after the return and it started as soon as it was issued (within
  STARVED_LAUNCH_US), but no earlier than its stream predecessor ends (which moves earlier too when a call of the
  same rule moved it: a rule's cost is what removing all its calls saves); a stall on anything else moves nothing
  and cuts the gain to 0 (the idle won back before it is lost: compute then waits longer there).

The gain at the end of the walk (at most `B`) is the call's, shared out over the windows and stalls that
contributed to it (the earliest lose first where the gain was cut); a stall's share is the part of its cost
the call explains (the wait rules subtract it), at most its cost left once the shared communicator and the
earlier calls have claimed their parts. A stall explained by several calls of one owner is recorded on the
last of them (one call per stall: the rule's total is the same); one another owner's call explained is not
shared.

"Its thread" includes the work it hands over after the return (`_handoffs`): a thread that did nothing during
the block and begins inside a later call of the blocked thread (torch's autograd engine running backward on its
own thread inside the main thread's `loss.backward()`, so a `.item()` before backward delays backward's launches).
A thread busy during the block, or one whose work no later call of the blocked thread holds, moves nothing.

The host is taken to be busy all along between those launches: in the trace, untraced Python time and idle time
look alike, and a training thread does not idle in the middle of a step except in a sync. Stalls on a step's
first all-gather that started as soon as it was launched are starvation windows already (hostsyncs.held_windows)
and are left to them. The epilogue's sync (hostsyncs.WAITED_FOR) delays nothing: the optimizer after it needs the
reductions it waits for.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from overlapcheck.analysis import intervals as iv
from overlapcheck.diagnose.facts.hostsyncs import (
    STARVED_LAUNCH_US,
    WAITED_FOR,
    Sync,
    host_sync_list,
    starvation_windows,
    window_costs,
    window_idle,
)

if TYPE_CHECKING:
    from overlapcheck.diagnose.facts.view import RankFacts


@dataclass(frozen=True)
class Delays:
    """Per stall of `view.stalls` (same rows): `sync`, `explained`, `start`, `end`; and the later starvation
    windows the syncs delayed: `window_sync`, `window_cost`, `window_start`, `window_end` (one row each)."""

    sync: np.ndarray  # index into hostsyncs.host_sync_list(view) of the sync that delayed the stall, -1 none
    explained: np.ndarray  # the part of the stall's cost that sync explains (compute idle, µs)
    start: np.ndarray  # where that idle lies: [start, end) (start == end when none)
    end: np.ndarray
    window_sync: np.ndarray  # index of the sync that delayed a later starvation window
    window_cost: np.ndarray  # the compute idle of that window it explains
    window_start: np.ndarray  # where that idle lies
    window_end: np.ndarray


def host_delayed(view: RankFacts) -> Delays:
    """The stalls and later starvation host syncs delayed (see the module doc). Computed once per rank
    (`RankFacts.memo`), so the sync cost model and the wait rules read the same numbers."""
    return view.memo("host_delays", _delays)


def _delays(view: RankFacts) -> Delays:
    st = view.stalls
    n_stalls = len(st.kernel)
    sync = np.full(n_stalls, -1, dtype=np.int64)
    explained = np.zeros(n_stalls)
    lo, hi = st.end.astype(np.float64).copy(), st.end.astype(np.float64).copy()
    w_sync: list[int] = []
    w_cost: list[float] = []
    w_lo: list[float] = []
    w_hi: list[float] = []

    def result() -> Delays:
        return Delays(
            sync, explained, lo, hi, np.array(w_sync, dtype=np.int64), np.array(w_cost), np.array(w_lo), np.array(w_hi)
        )

    syncs = host_sync_list(view)
    wc = window_costs(view)
    waited = sorted((i for i, s in enumerate(syncs) if s.waited), key=lambda i: syncs[i].end)
    # a sync whose awaited work the program needs anyway (the epilogue's) lets nothing be issued earlier
    live = [i for i in waited if syncs[i].thread >= 0 and wc.owners[i][0] not in WAITED_FOR]
    if not live:
        return result()
    g = view.gpu
    thread_of = view.launch_thread
    prev = _previous_on_stream(view)
    first = set(view.first_gathers.tolist())
    left = np.maximum(st.cost - view.claimed_by_communicator, 0.0)

    windows = starvation_windows(view)
    charged = iv.union(
        np.array([w[0] for ws in wc.windows for w in ws], dtype=np.float64),
        np.array([w[1] for ws in wc.windows for w in ws], dtype=np.float64),
    )
    # what a launch could win back there (hostsyncs.window_idle), less what chain_costs charged already
    w_start = np.array([w.start for w in windows], dtype=np.float64)
    w_end = np.array([w.end for w in windows], dtype=np.float64)
    w_idle = window_idle(view, w_start, w_end)
    w_charged = view.covered(w_end, charged) - view.covered(w_start, charged) if len(charged) else np.zeros(len(w_end))
    w_left = np.maximum(0.0, w_idle - w_charged).tolist()

    def self_shift(c: int, j: int, owner: str, lead: float, moved: dict[int, tuple[str, float]]) -> float:
        """How much earlier collective `c` could start without call `j`: issued `lead` earlier when `j`'s thread
        issued it after `j` returned and it started as soon as it was issued, and no earlier than its stream
        predecessor ends (earlier too when a call of the same rule moved that one)."""
        issued = float(view.launch[c])
        if not follows(j, c) or c in first:
            return 0.0
        if float(g.start[c]) - issued > STARVED_LAUNCH_US:
            return 0.0  # held by its stream or a dependency, not by its launch
        p = int(prev[c])
        ready = float(g.end[p]) if p >= 0 else -np.inf
        if p in moved and moved[p][0] == owner:
            ready -= moved[p][1]
        shift = max(0.0, min(lead, float(g.start[c]) - ready))
        moved[c] = (owner, shift)
        return shift

    handed = _handoffs(view, syncs, live)

    def follows(j: int, k: int) -> bool:
        """Whether call `j`'s block delayed GPU activity `k`'s launch: its thread issued it after `j` returned, or
        a thread `j`'s thread handed work to after the return (`_handoffs`) issued it in that work."""
        t, issued = int(thread_of[k]), float(view.launch[k])
        if t == syncs[j].thread:
            return issued >= syncs[j].end
        span = handed[j].get(t)
        return span is not None and span[0] <= issued < span[1]

    step_end = _step_ends(view)
    on_s = np.flatnonzero(g.stream == view.compute_stream)
    on_s = on_s[np.argsort(g.start[on_s], kind="stable")]
    prev_end = np.concatenate([[-np.inf], np.maximum.accumulate(g.end[on_s])[:-1]])
    on_s_start = g.start[on_s]
    stall_of = {int(k): n for n, k in enumerate(st.kernel.tolist())}
    window_of = {w.row: k for k, w in enumerate(windows) if w.row >= 0}
    moved: dict[int, tuple[str, float]] = {}  # collective row -> (owner rule, how much earlier it would start)
    # the waiting calls by start, and for each the first later one of another owner (one pass, not a search per call)
    by_start = sorted(waited, key=lambda i: syncs[i].start)
    starts = [syncs[i].start for i in by_start]
    next_other = [len(by_start)] * len(by_start)
    for p in range(len(by_start) - 2, -1, -1):
        same = wc.owners[by_start[p + 1]] == wc.owners[by_start[p]]
        next_other[p] = next_other[p + 1] if same else p + 1
    for j in live:
        s = syncs[j]
        owner = wc.owners[j][0]
        lead = max(0.0, s.blocked - float(wc.cost[j]))
        # the walk ends at the next call of another owner that waits for GPU work, or at the end of the step
        p = bisect_left(starts, s.end)
        if p < len(by_start) and wc.owners[by_start[p]] == wc.owners[j]:
            p = next_other[p]
        stop = min(syncs[by_start[p]].start, step_end(s.end)) if p < len(by_start) else step_end(s.end)
        gain = 0.0  # how much earlier the compute stream runs at this point without the call
        parts: list[tuple[int, int, float]] = []  # (kind 0 stall / 1 window, index, idle removed) since a cut
        for pos in range(int(np.searchsorted(on_s_start, s.end, side="left")), len(on_s)):
            k = int(on_s[pos])
            launched = float(view.launch[k])
            if launched >= stop or lead <= 0:
                break
            shifted = lead if follows(j, k) else 0.0
            bound = float(g.start[k]) - launched + shifted  # how much earlier its launch lets it start
            idle, kind, idx = 0.0, -1, -1
            if k in stall_of:
                kind, idx = 0, stall_of[k]
                c = int(st.comm[idx])
                bound = min(bound, self_shift(c, j, owner, lead, moved) if c >= 0 else 0.0)
                # what the earlier calls of the same owner left of it (another owner's stall is not shared)
                idle = float(left[idx]) if sync[idx] < 0 or wc.owners[int(sync[idx])] == wc.owners[j] else 0.0
            elif k in window_of:
                kind, idx = 1, window_of[k]
                # a window the call returned in is chain_costs' (it weighed the later calls there)
                returned_in = windows[idx].start - STARVED_LAUNCH_US <= s.end
                idle = 0.0 if returned_in else w_left[idx]
            else:
                idle = max(0.0, float(g.start[k]) - float(prev_end[pos]))
            new = max(0.0, min(lead, gain + idle, bound))
            if new < gain:  # held by something that does not move: what the lead saved before is lost here
                loss = gain - new
                while loss > 0 and parts:
                    kd, ix, pt = parts[0]
                    take = min(pt, loss)
                    loss -= take
                    parts[0] = (kd, ix, pt - take)
                    if parts[0][2] <= 0:
                        parts.pop(0)
            elif new > gain and kind >= 0:
                parts.append((kind, idx, new - gain))
            gain = new
        for kd, ix, pt in parts:
            if pt <= 0:
                continue
            if kd == 1:
                w = windows[ix]
                w_left[ix] -= pt
                w_sync.append(j)
                w_cost.append(pt)
                w_lo.append(w.end - pt)
                w_hi.append(w.end)
            else:
                left[ix] -= pt
                sync[ix], explained[ix], lo[ix] = j, explained[ix] + pt, float(st.end[ix]) - explained[ix] - pt
    return result()


def _handoffs(view: RankFacts, syncs: list[Sync], live: list[int]) -> dict[int, dict[int, tuple[float, float]]]:
    """Per call of `live`: the other threads its thread handed work to after it returned, each with the span
    `[lo, hi)` of that work. A thread U takes over when it did nothing in the trace while the call blocked (no op
    or runtime call of it overlaps the block) and its next op begins inside an op of the call's thread that began
    after the call returned: the blocked thread started it and waits for it there (torch's autograd engine runs
    backward on its own thread, inside the main thread's `loss.backward()`). The span runs from U's first op to the
    end of the outermost such op of the call's thread. A thread busy during the block is not delayed by it."""
    m = view.model
    starts = np.concatenate([m.ops.start, m.runtime.start]).astype(np.float64)
    ends = np.concatenate([m.ops.end, m.runtime.end]).astype(np.float64)
    threads = np.concatenate([m.ops.thread, m.runtime.thread]).astype(np.int64)
    per: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    for t in np.unique(threads[threads >= 0]).tolist():
        rows = np.flatnonzero(threads == t)
        rows = rows[np.argsort(starts[rows], kind="stable")]
        per[t] = (starts[rows], ends[rows], np.maximum.accumulate(ends[rows]))
    out: dict[int, dict[int, tuple[float, float]]] = {}
    for j in live:
        s = syncs[j]
        out[j] = {}
        mine = per.get(s.thread)
        if mine is None:
            continue
        for t, (st, _end, reach) in per.items():
            if t == s.thread:
                continue
            p = int(np.searchsorted(st, s.end, side="left"))
            if p >= len(st) or (p > 0 and reach[p - 1] > s.start):
                continue  # nothing after the return, or it was busy during the block
            first = float(st[p])
            a = int(np.searchsorted(mine[0], s.end, side="left"))
            b = int(np.searchsorted(mine[0], first, side="right"))
            holding = np.flatnonzero(mine[1][a:b] > first)
            if len(holding):
                out[j][t] = (first, float(mine[1][a + int(holding[0])]))
    return out


def _step_ends(view: RankFacts) -> Callable[[float], float]:
    """A function: the end of the profiled step holding a time (inf without steps or outside them)."""
    s = view.model.steps
    starts, ends = np.asarray(s.start, dtype=np.float64), np.asarray(s.end, dtype=np.float64)

    def end_of(t: float) -> float:
        i = int(np.searchsorted(starts, t, side="right")) - 1
        return float(ends[i]) if i >= 0 and t < ends[i] else np.inf

    return end_of


def _previous_on_stream(view: RankFacts) -> np.ndarray:
    """The GPU row of the activity before each one on its own stream (-1 for the first)."""
    g = view.gpu
    order = np.lexsort((g.start, g.stream))
    prev = np.full(len(g), -1, dtype=np.int64)
    same = g.stream[order][1:] == g.stream[order][:-1]
    prev[order[1:][same]] = order[:-1][same]
    return prev
