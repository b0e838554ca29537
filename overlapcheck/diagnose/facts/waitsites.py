"""Explicit stream waits: the `cudaStreamWaitEvent` calls (torch `Stream.wait_stream`, `Event.wait`,
`Work.wait()`) that make one stream wait for work on another, which of the compute stream's stalls each one
explains, and where in the program it was issued.

A wait is a `cudaStreamWaitEvent` runtime call, matched by correlation to its `Stream Wait Event` record
(`cuda_sync`, with enable_cuda_sync_events) when the trace has one: the record names the stream made to wait
(`stream`) and the one waited for (`wait_on_stream`); its time is the call's CPU time. A record without its
call is a wait of unknown thread; a call without its record waits for an unknown stream, and the stream made to
wait is the one of the next activity its thread launches.

A stall (facts/stalls.py) is explained by a wait when one that makes the compute stream wait (or of unknown
stream, on the thread that launched the stalled activity) was issued after the launch of the activity before it
on the compute stream and before its own launch: the stream had nothing else to run and was told to wait. The
wait must also come after the launch of the activity whose end released the stall: an event covers only the work
launched on its stream before it was recorded, so a wait issued earlier (e.g. for the previous all-gather, while
the one that held the stall was launched after it) cannot have held it. The
latest such wait is the one blamed, preferring one on the stream of the awaited activity; its call site is the
python stack (or the enclosing ops) of that call (facts/callsite.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from overlapcheck.diagnose.facts.stalls import DEPENDENCY_TOLERANCE_US, Stalls

if TYPE_CHECKING:
    from overlapcheck.diagnose.facts.view import RankFacts

WAIT_CALL = "cudaStreamWaitEvent"
WAIT_RECORD = "Stream Wait Event"
STACK_DEPTH = 8  # frames of a wait's stack kept in the evidence


@dataclass(frozen=True)
class Waits:
    """Every explicit stream wait of the rank, sorted by CPU time."""

    start: np.ndarray  # CPU time of the call (or of its record)
    thread: np.ndarray  # the calling thread, -1 for a record without its runtime call
    stream: np.ndarray  # the stream made to wait, -1 when the call has no record
    wait_on: np.ndarray  # the stream waited for, -1 when unknown

    def __len__(self) -> int:
        return len(self.start)


def waits(view: RankFacts) -> Waits:
    return view.memo("waits", _waits)


def _waits(view: RankFacts) -> Waits:
    rt, s = view.model.runtime, view.model.syncs
    calls = view.runtime_named(WAIT_CALL)
    recs = np.flatnonzero(view.name_mask(s.name, lambda n: n == WAIT_RECORD)) if len(s) else np.zeros(0, dtype=np.int64)
    start = rt.start[calls].astype(np.float64)
    thread = rt.thread[calls].astype(np.int64)
    stream = np.full(len(calls), -1, dtype=np.int64)
    wait_on = np.full(len(calls), -1, dtype=np.int64)
    orphans = recs
    if len(calls) and len(recs):
        corr = rt.correlation[calls]
        order = np.argsort(corr, kind="stable")
        i = np.clip(np.searchsorted(corr[order], s.correlation[recs]), 0, len(calls) - 1)
        hit = (s.correlation[recs] >= 0) & (corr[order][i] == s.correlation[recs])
        matched = order[i[hit]]
        stream[matched] = s.stream[recs[hit]]
        wait_on[matched] = s.wait_on_stream[recs[hit]]
        orphans = recs[~hit]
    unknown = stream < 0
    if unknown.any():
        stream[unknown] = _next_launch_stream(view, thread[unknown], start[unknown])
    start = np.concatenate([start, s.start[orphans].astype(np.float64)]) if len(orphans) else start
    thread = np.concatenate([thread, np.full(len(orphans), -1, dtype=np.int64)])
    stream = np.concatenate([stream, s.stream[orphans].astype(np.int64)]) if len(orphans) else stream
    wait_on = np.concatenate([wait_on, s.wait_on_stream[orphans].astype(np.int64)]) if len(orphans) else wait_on
    order = np.argsort(start, kind="stable")
    return Waits(start[order], thread[order], stream[order], wait_on[order])


def _next_launch_stream(view: RankFacts, thread: np.ndarray, t: np.ndarray) -> np.ndarray:
    """For waits without a record: the stream of the next GPU activity their thread launched, the stream the
    wait is for (torch launches the waiting stream's work right after `wait_stream`; ProcessGroupNCCL makes the
    NCCL stream wait for the caller's just before launching the collective); -1 when none follows."""
    out = np.full(len(t), -1, dtype=np.int64)
    rows = np.flatnonzero(view.launch_thread >= 0)
    if not len(rows):
        return out
    for th in np.unique(thread).tolist():
        mine = rows[view.launch_thread[rows] == th]
        if not len(mine):
            continue
        mine = mine[np.argsort(view.launch[mine], kind="stable")]
        sel = np.flatnonzero(thread == th)
        i = np.searchsorted(view.launch[mine], t[sel], side="right")
        ok = i < len(mine)
        out[sel[ok]] = view.gpu.stream[mine[i[ok]]]
    return out


def latest_wait(
    w: Waits, thread: int, stream: int, lo: float, hi: float, wait_on: int = -1, launched_after: float = -np.inf
) -> int:
    """Index into `w` of the latest wait issued in (lo, hi] that makes `stream` wait: its record says so, or it
    has no record and was called on `thread`; one that waits for `wait_on` first. -1 when there is none."""
    a = int(np.searchsorted(w.start, lo, side="right"))
    b = int(np.searchsorted(w.start, hi, side="right"))
    if a >= b:
        return -1
    idx = np.arange(a, b)
    ok = (w.stream[idx] == stream) | ((w.stream[idx] < 0) & (w.thread[idx] == thread) & (thread >= 0))
    idx = idx[ok]
    if not len(idx):
        return -1
    if wait_on >= 0:
        same = idx[w.wait_on[idx] == wait_on]
        if len(same):
            return int(same[-1])
    return int(idx[-1])


def awaited_activity(view: RankFacts, st: Stalls) -> np.ndarray:
    """For each stall: the GPU row off the compute stream whose end released it (as facts/stalls.py finds it)."""
    g = view.gpu
    other = np.flatnonzero(g.stream != view.compute_stream)
    if not len(st.kernel) or not len(other):
        return np.full(len(st.kernel), -1, dtype=np.int64)
    other = other[np.argsort(g.end[other], kind="stable")]
    j = np.searchsorted(g.end[other], g.start[st.kernel] + DEPENDENCY_TOLERANCE_US, side="right") - 1
    return np.where(j >= 0, other[np.maximum(j, 0)], -1)


@dataclass(frozen=True)
class StallWaits:
    """Per stall of `view.stalls`: the wait that explains it and where it was issued."""

    wait: np.ndarray  # index into `waits(view)`, -1 when no explicit wait explains the stall
    known: np.ndarray  # whether the trace shows how the stalled activity was launched (thread or records)
    awaited: np.ndarray  # GPU row that released the stall (-1 unknown)
    in_launch_order: np.ndarray  # the awaited activity was launched before the stalled one
    site: list[str | None]  # the wait's call site (innermost DeepSpeed or user frame, else enclosing ops)
    stack: list[list[str]]


def stall_waits(view: RankFacts) -> StallWaits:
    return view.memo("stall_waits", _stall_waits)


def _stall_waits(view: RankFacts) -> StallWaits:
    st = view.stalls
    w = waits(view)
    n = len(st.kernel)
    wait = np.full(n, -1, dtype=np.int64)
    awaited = awaited_activity(view, st)
    g = view.gpu
    threads = view.launch_thread[st.kernel] if n else np.zeros(0, dtype=np.int64)
    has_records = bool(len(w)) and bool((w.stream >= 0).any())
    known = (threads >= 0) | has_records
    launch = view.launch[st.kernel] if n else np.zeros(0)
    for i in range(n):
        lo = min(float(st.prev_launch[i]), float(launch[i]))
        if awaited[i] >= 0:
            # a wait covers only work launched before it (the event it waits for is recorded after that work):
            # one issued before the awaited activity was launched cannot be what held the stall
            lo = max(lo, float(view.launch[awaited[i]]))
        on = int(g.stream[awaited[i]]) if awaited[i] >= 0 else -1
        wait[i] = latest_wait(w, int(threads[i]), view.compute_stream, lo, float(launch[i]), on)
    in_order = np.zeros(n, dtype=bool)
    ok = awaited >= 0
    in_order[ok] = view.launch[awaited[ok]] <= launch[ok]
    sites: list[str | None] = []
    stacks: list[list[str]] = []
    for i in range(n):
        site, stack = wait_site(view, int(wait[i]))
        sites.append(site)
        stacks.append(stack)
    return StallWaits(wait, known, awaited, in_order, sites, stacks)


def wait_site(view: RankFacts, index: int) -> tuple[str | None, list[str]]:
    """Call site and stack (innermost first, at most STACK_DEPTH frames) of wait `index` (None, [] for -1 or a
    record whose call is not in the trace)."""
    if index < 0:
        return None, []
    w = waits(view)
    thread = int(w.thread[index])
    if thread < 0:
        return None, []
    site = view.callsites.site(thread, float(w.start[index]))
    frame, stack = site["frame"], site["stack"]
    frames = [str(f) for f in stack][:STACK_DEPTH] if isinstance(stack, list) else []
    return (str(frame) if frame is not None else None), frames


def calls_per_site(view: RankFacts) -> dict[str | None, float]:
    """Per call site: the waits issued there per profiled step that make the compute stream wait (or of unknown
    stream), counted in the profiled steps (all of them without steps)."""
    return view.memo("calls_per_site", _calls_per_site)


def _calls_per_site(view: RankFacts) -> dict[str | None, float]:
    w = waits(view)
    sel = np.flatnonzero((w.stream == view.compute_stream) | (w.stream < 0))
    sel = sel[view.in_steps(w.start[sel])]
    out: dict[str | None, float] = {}
    for i in sel.tolist():
        site, _ = wait_site(view, i)
        out[site] = out.get(site, 0.0) + 1.0
    return {k: round(v / view.n_steps, 2) for k, v in out.items()}


def stalls_at(view: RankFacts, site: str | None) -> np.ndarray:
    """Mask of `view.stalls` held by a wait issued at `site` (None: by no wait the trace names), the stalls of
    the cross-stream-wait finding with that `call_site` (for diagnose/locate.py)."""
    return np.array([s == site for s in stall_waits(view).site], dtype=bool)
