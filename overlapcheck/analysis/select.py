"""Cut a trace down to some profiled steps (`--steps`): the analysis of the result is that of a profiler that had
recorded only those steps.

Kept: the selected `ProfilerStep#N` annotations; the GPU activities issued in them (the step that launched
an activity, as the metrics assign it); the host events (CPU ops, runtime calls, flows, cuda_sync events) that
overlap the selected steps' windows, each window running from the step's CPU start to the later of its CPU end
and the end of the GPU work it issued. Host events that enclose a step (a Python frame around the training loop)
are kept, so call sites survive. Everything else is dropped.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection

import numpy as np

from overlapcheck.analysis import intervals as iv
from overlapcheck.analysis.activities import launch_steps
from overlapcheck.trace.model import Table, TraceModel


def restrict_to_steps(model: TraceModel, steps: Collection[int]) -> TraceModel:
    """The trace of `model` restricted to the ProfilerSteps numbered in `steps` (a trace without those steps, or
    without steps at all, comes back with no steps and no activity when none is selected)."""
    s = model.steps
    keep_step = np.isin(s.number, np.fromiter(steps, dtype=np.int64, count=len(steps)))
    if len(s) and keep_step.all():
        return model
    number = s.number[keep_step]
    g = model.gpu
    gpu_step = launch_steps(model) if len(g) else np.zeros(0, dtype=np.int64)
    keep_gpu = np.isin(gpu_step, number) if len(g) else np.zeros(0, dtype=bool)
    lo, hi = s.start[keep_step].astype(np.float64), s.end[keep_step].astype(np.float64)
    for k, n in enumerate(number.tolist()):
        mine = keep_gpu & (gpu_step == n)
        if mine.any():
            hi[k] = max(hi[k], float(g.end[mine].max()))
    windows = iv.union(lo, hi)
    out = dataclasses.replace(
        model,
        gpu=g.take(np.flatnonzero(keep_gpu)),
        runtime=_overlapping(model.runtime, windows),
        ops=_overlapping(model.ops, windows),
        syncs=_overlapping(model.syncs, windows),
        flows=_overlapping(model.flows, windows, instant=True),
        steps=s.take(np.flatnonzero(keep_step)),
        notes=list(model.notes),
    )
    return out


def _overlapping(table: Table, windows: iv.Intervals, instant: bool = False) -> Table:
    """The rows of `table` whose [start, end) meets one of `windows` (an instant: whose start lies in one)."""
    if not len(table):
        return table
    if not len(windows):
        return table.take(np.zeros(0, dtype=np.int64))
    start = table.start
    end = start if instant else table.end
    # the first window that ends after the row starts; the row meets it when it starts before the row ends
    i = np.searchsorted(windows.ends, start, side="right")
    ok = i < len(windows)
    ok[ok] = windows.starts[i[ok]] <= end[ok] if instant else windows.starts[i[ok]] < end[ok]
    if instant:
        ok[ok] &= start[ok] >= windows.starts[i[ok]]
    return table.take(np.flatnonzero(ok))
