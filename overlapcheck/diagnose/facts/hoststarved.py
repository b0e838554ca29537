"""Where the GPU waited for the host's own slowness: compute-stream gaps that end when the host launched the next
activity, with no sync and no stream wait behind them.

A host-starved window is the host side of a gap on the compute stream: from the end of the work launched before
an activity (the queue ran dry) to that activity's launch call (by correlation), when the launch came later: the
GPU had nothing queued and waited for the CPU. What follows the launch, up to the activity's start, is not the
host's (a stream wait: facts/stalls.py; launch latency). Left out, as waits that are not the host being slow:

- windows that begin before the step of their activity: the host's lead-in to the step (facts/hostgap.py, the
  straggler's late host), where what runs is the step's first all-gather, inherent;
- windows whose launch came as GPU work running in them ended (within WAIT_TOLERANCE_US): the host waited for
  it in a way no blocking runtime call shows (a blocking wait on a collective, a `cudaEventQuery` loop);
- windows whose host side `[queue end, launch)` a call that waited for GPU work overlaps (a sync, a blocking
  copy: `hostsyncs.awaited_work`): the host waited for its own GPU there, and the sync rules charge it
  (hostsyncs.chain_costs, facts/delays.py);
- windows whose host side the trace did not record (its correlation ids skip over LOST_FACTOR times the trace's
  median skip, at most a complete trace's, per call it records: a sub-sampled trace): the gap may be launches
  the trace does not hold;
- within the rest, what the sync rules charge for what a block delayed after it returned (`SyncCosts.windows`:
  the host had not caught up after the block), and the compute stalls on other streams (facts/stalls.py).

What is left is the host itself: Python, hooks, the dispatcher and the launch calls taking longer than the GPU
work they issue. Windows shorter than STALL_MIN_US are launch latency (facts/stalls.py's line). Each window's
host side is attributed to the Python frames its launching thread spent it in (facts/hostgap.py's descent).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from overlapcheck.analysis import intervals as iv
from overlapcheck.diagnose.facts.hostgap import TOP_FRAMES, _frames, _python_frames
from overlapcheck.diagnose.facts.hostsyncs import WAIT_TOLERANCE_US, host_sync_list
from overlapcheck.diagnose.facts.stalls import STALL_MIN_US

if TYPE_CHECKING:
    from overlapcheck.diagnose.facts.view import RankFacts

# a window's host side that skips this many times the trace's median correlation skip per recorded call has lost
# events: an order of magnitude beyond what the trace itself hides between two calls (_lost_events)
LOST_FACTOR = 10.0
COMPLETE_SKIP = 8.0  # the median skip of a complete trace is at most this (the real complete traces here: 1 to 7)


@dataclass(frozen=True)
class HostStarved:
    """The rank's host-starved windows (`windows`, as intervals), the GPU row of the activity that ended each
    one (`rows`), how many there were, the compute idle inside them, and the frames that spent their host side
    (µs in total, largest first)."""

    windows: iv.Intervals
    rows: np.ndarray
    idle_us: float
    frames: list[tuple[str, float]] = field(default_factory=list)
    calls: list[tuple[str, float]] = field(default_factory=list)  # runtime calls of the launching threads in them
    host_us: float = 0.0  # the windows' host side, in total


def host_starved(view: RankFacts) -> HostStarved:
    """The rank's host-starved windows (module docstring), computed once per rank."""
    return view.memo("host_starved", _host_starved)


def _host_starved(view: RankFacts) -> HostStarved:
    windows = [w for w in _host_sides(view) if w[1] - w[0] >= STALL_MIN_US]
    steps = view.model.steps
    if len(steps):
        begins = dict(zip(steps.number.tolist(), steps.start.tolist(), strict=True))
        # inside a step: a window from before the step began is the host's lead-in to it (facts/hostgap.py), and
        # what runs there is the step's first all-gather, inherent (facts/coverage.py)
        windows = [
            w for w in windows if view.gpu_step[w[2]] >= 0 and w[0] >= begins.get(int(view.gpu_step[w[2]]), np.inf)
        ]
    blocked = [s for s in host_sync_list(view) if s.waited]
    if blocked:
        s_start = np.array([s.start for s in blocked])
        s_end = np.array([s.end for s in blocked])
        # a call that waited for the GPU overlaps the host side of the window: the host waited, it was not slow
        windows = [w for w in windows if not ((s_start < w[1]) & (s_end > w[0])).any()]
    windows = [w for w in windows if not _launched_on_an_end(view, w)]
    lost = _lost_events(view, windows)
    windows = [w for w, gone in zip(windows, lost.tolist(), strict=True) if not gone]
    if not windows:
        return HostStarved(iv.EMPTY, np.zeros(0, dtype=np.int64), 0.0)
    out = iv.union(np.array([w[0] for w in windows]), np.array([w[1] for w in windows]))
    charged = [w for ws in view.host_syncs.windows for w in ws]
    if charged:
        out = iv.subtract(out, iv.union(np.array([a for a, _ in charged]), np.array([b for _, b in charged])))
    st = view.stalls
    if len(st.kernel):
        out = iv.subtract(out, iv.union(st.start, st.end))
    rows = np.array([w[2] for w in windows], dtype=np.int64)
    idle = float(view.idle(out.starts, out.ends).sum()) if len(out) else 0.0
    host = float(sum(b - a for a, b, _ in windows))
    return HostStarved(out, rows, idle, _spent_in(view, windows), _calls_in(view, windows), host)


def _lost_events(view: RankFacts, windows: list[tuple[float, float, int]]) -> np.ndarray:
    """Per window, whether the trace lost the host's calls in it: CUPTI numbers every runtime call (correlation),
    Kineto leaves out a few kinds (cudaGetDevice, cudaGetLastError, ...), so between two recorded calls a
    complete trace skips a few ids (its median skip; the real complete traces here: 1 to 7). A window whose host
    side skips over LOST_FACTOR times that per call it records (from the last call recorded before the window to
    the launch that ends it) has lost events (a sub-sampled trace: HTA's sampled traces skip a median 36, and
    hundreds to thousands across their gaps): the gap may be launches the trace does not hold. The median skip
    is taken at most COMPLETE_SKIP, as a sub-sampled trace inflates its own."""
    rt = view.model.runtime
    ids = np.unique(rt.correlation[rt.correlation > 0])
    if len(ids) < 2 or not windows:
        return np.zeros(len(windows), dtype=bool)
    skip = min(float(np.median(np.diff(ids))), COMPLETE_SKIP)  # a sub-sampled trace's own median is inflated
    order = np.argsort(rt.start, kind="stable")
    starts, corr = rt.start[order], rt.correlation[order]
    out = np.zeros(len(windows), dtype=bool)
    for n, (a, b, row) in enumerate(windows):
        before = int(np.searchsorted(starts, a, side="right"))
        inside = int(np.searchsorted(starts, b, side="left")) - before
        last = corr[:before][corr[:before] > 0]
        end = int(view.gpu.correlation[row])
        if not len(last) or end <= 0:
            continue
        missing = end - int(last.max()) - 1 - max(0, inside)
        out[n] = missing > LOST_FACTOR * skip * (max(0, inside) + 1)
    return out


def _host_sides(view: RankFacts) -> list[tuple[float, float, int]]:
    """Per compute-stream activity launched after the work launched before it had ended: (that end, its launch
    or its start when earlier, its GPU row)."""
    g = view.gpu
    on_s = np.flatnonzero(g.stream == view.compute_stream)
    if len(on_s) < 2:
        return []
    on_s = on_s[np.argsort(view.launch[on_s], kind="stable")]
    queued_end = np.maximum.accumulate(g.end[on_s])[:-1]
    until = np.minimum(view.launch[on_s[1:]], g.start[on_s[1:]])
    late = np.flatnonzero(until > queued_end)
    return [(float(queued_end[i]), float(until[i]), int(on_s[i + 1])) for i in late.tolist()]


def _launched_on_an_end(view: RankFacts, w: tuple[float, float, int]) -> bool:
    """Whether the launch that ends the window came as GPU work running in it ended (within WAIT_TOLERANCE_US):
    the host waited for that work in a way no blocking runtime call shows (a blocking wait on the collective,
    a `cudaEventQuery` loop), not slow."""
    g = view.gpu
    ended = (g.end >= w[1] - WAIT_TOLERANCE_US) & (g.end <= w[1] + WAIT_TOLERANCE_US) & (g.start < w[1])
    return bool((ended & (g.end > w[0])).any())


def _calls_in(view: RankFacts, windows: list[tuple[float, float, int]]) -> list[tuple[str, float]]:
    """The CUDA runtime calls the launching threads were in during the windows' host side (µs in total, largest
    first): a long one there (not a sync: those windows are left out) is the driver, not Python."""
    rt = view.model.runtime
    spent: dict[str, float] = {}
    for a, b, row in windows:
        sel = np.flatnonzero((rt.thread == view.launch_thread[row]) & (rt.start < b) & (rt.end > a))
        for i in sel.tolist():
            name = str(view.names[rt.name[i]])
            spent[name] = spent.get(name, 0.0) + min(b, float(rt.end[i])) - max(a, float(rt.start[i]))
    ranked = sorted(spent.items(), key=lambda p: (-p[1], p[0]))[:TOP_FRAMES]
    return [(name, us) for name, us in ranked if us > 0]


def _spent_in(view: RankFacts, windows: list[tuple[float, float, int]]) -> list[tuple[str, float]]:
    """The Python frames the launching threads spent the windows' host side in."""
    frames = _python_frames(view)
    spent: dict[str, float] = {}
    for a, b, row in windows:
        thread = int(view.launch_thread[row])
        for name, us in _frames(view, frames.get(thread), a, b):
            spent[name] = spent.get(name, 0.0) + us
    ranked = sorted(spent.items(), key=lambda p: (-p[1], p[0]))[:TOP_FRAMES]
    return [(name, us) for name, us in ranked if us > 0]
