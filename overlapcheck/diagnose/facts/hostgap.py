"""The host's lead-in to each step: the CPU time from the start of `ProfilerStep#N` to the first GPU launch of
that step (the runtime call of the earliest-launched GPU activity the step issued), less the time the host spent
blocked there in a sync (then it waited for its own GPU and was not late), and the Python frames that spend it.

A rank whose host starts its steps late (a slow data loader, a busy CPU) launches its first collective late and
every other rank waits for it inside that collective, while its GPU compute per step is typical: this lead-in is
what tells it apart from a rank whose GPU is slow. It is a time difference on one rank's clock, so clock offsets
between nodes do not change it.

The frames named are, for each Python frame that starts inside the lead-in (the training loop's own frames, which
enclose the step, are left out, and so are the profiler's), the innermost one that still covers most of it,
descending through application and DeepSpeed code and stopping at the first library frame it calls: the library
call the application waits in, e.g. `torch/utils/data/dataloader.py(628): __next__`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from overlapcheck.analysis import intervals as iv
from overlapcheck.diagnose.facts.callsite import is_deepspeed, is_user, short_frame
from overlapcheck.trace.model import ANNOTATION, PYTHON

if TYPE_CHECKING:
    from overlapcheck.diagnose.facts.view import RankFacts

SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")
TOP_FRAMES = 3
DOMINANT = 0.5  # a child frame that covers at least this share of its parent's lead-in time is descended into
_PROFILER = re.compile(r"(^|/)torch/(profiler/|autograd/profiler)")
_STEP = re.compile(r"^ProfilerStep#(\d{1,18})$")  # longer numbers are no step (trace/model.py)


@dataclass(frozen=True)
class HostGap:
    """Mean lead-in per step (None without steps with GPU work) and its frames with their µs per step."""

    us_per_step: float | None
    frames: list[tuple[str, float]] = field(default_factory=list)


def host_gap(view: RankFacts) -> HostGap:
    """The host's lead-in per step on one rank (module docstring)."""
    model = view.model
    steps = model.steps
    if not len(steps) or not len(view.gpu):
        return HostGap(None)
    rows = view.step_rows
    threads = _step_threads(view)
    syncs = view.runtime_named(*SYNC_CALLS)
    rt = model.runtime
    frames = _python_frames(view)
    gaps: list[float] = []
    spent: dict[str, float] = {}
    for number, start, end in zip(steps.number.tolist(), steps.start.tolist(), steps.end.tolist(), strict=True):
        r = rows.get(int(number))
        if r is None or not len(r):
            continue  # no GPU work: not a measured step
        first = min(max(float(view.launch[r].min()), start), end)
        thread = threads.get(int(number))
        sel = syncs[(rt.start[syncs] < first) & (rt.end[syncs] > start)]
        if thread is not None:
            sel = sel[rt.thread[sel] == thread]
        blocked = iv.length(iv.union(np.clip(rt.start[sel], start, first), np.clip(rt.end[sel], start, first)))
        gaps.append(max(0.0, first - start - blocked))
        if thread is not None and first > start:
            for name, us in _frames(view, frames.get(thread), start, first):
                spent[name] = spent.get(name, 0.0) + us
    if not gaps:
        return HostGap(None)
    n = len(gaps)
    ranked = sorted(spent.items(), key=lambda p: (-p[1], p[0]))[:TOP_FRAMES]
    top = [(name, round(us / n, 3)) for name, us in ranked if us > 0]
    return HostGap(round(sum(gaps) / n, 3), top)


def _step_threads(view: RankFacts) -> dict[int, int]:
    """The thread of each `ProfilerStep#N` annotation (the training loop's thread)."""
    o = view.model.ops
    sel = np.flatnonzero((o.kind == ANNOTATION) & view.name_mask(o.name, lambda n: bool(_STEP.match(n))))
    out: dict[int, int] = {}
    for i in sel.tolist():
        m = _STEP.match(str(view.names[o.name[i]]))
        if m:
            out.setdefault(int(m.group(1)), int(o.thread[i]))
    return out


def _python_frames(view: RankFacts) -> dict[int, np.ndarray]:
    """The `python_function` rows of each thread, by start (outer first on ties)."""
    o = view.model.ops
    idx = np.flatnonzero(o.kind == PYTHON)
    idx = idx[np.lexsort((-o.end[idx], o.start[idx]))]
    threads = o.thread[idx]
    return {int(t): idx[threads == t] for t in np.unique(threads).tolist()}


def _frames(view: RankFacts, rows: np.ndarray | None, a: float, b: float) -> list[tuple[str, float]]:
    """The frames that spend the lead-in `[a, b)` (`rows`: the thread's Python frames), each with its time in it."""
    if rows is None or not len(rows):
        return []
    o = view.model.ops
    starts_all = o.start[rows]
    idx = rows[np.searchsorted(starts_all, a, side="left") : np.searchsorted(starts_all, b, side="left")]
    if not len(idx):
        return []
    names = [str(view.names[n]) for n in o.name[idx].tolist()]
    starts, ends = o.start[idx].tolist(), o.end[idx].tolist()
    clip = [min(e, b) - s for s, e in zip(starts, ends, strict=True)]
    children: list[list[int]] = [[] for _ in idx]
    roots: list[int] = []
    stack: list[int] = []
    for k, s in enumerate(starts):  # the frames of one thread nest
        while stack and ends[stack[-1]] <= s:
            stack.pop()
        (children[stack[-1]] if stack else roots).append(k)
        stack.append(k)
    out = []
    for k in roots:
        if _PROFILER.search(names[k]):
            continue  # the profiler's own work (and everything under it)
        while not _library(names[k]):
            kids = [c for c in children[k] if not _PROFILER.search(names[c])]
            best = max(kids, key=clip.__getitem__) if kids else None
            if best is None or clip[best] < DOMINANT * clip[k]:
                break
            k = best
        out.append((short_frame(names[k]), clip[k]))
    return out


def _library(name: str) -> bool:
    """A frame outside the application and DeepSpeed (a library, a built-in): where the descent stops."""
    return not (is_user(name) or is_deepspeed(name))
