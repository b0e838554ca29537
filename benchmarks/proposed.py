"""`overlapcheck analyze` with the two changes proposed to the analyzer's owner (docs/performance.md) applied at
run time, so that the benchmark can show what they are worth before they land:

1. intervals: `subtract` / `intersect` / `intersection_length` look only at the part of B that can meet A
   (two binary searches), instead of sorting all of B for every step: per-step metrics were O(steps x N).
2. metrics: each step's activities are taken by one sort on the step number instead of a mask over all
   activities per step and per collective (also O(steps x N)).
3. reader: one big file (and one file only) is decoded by all cores (`overlapcheck.trace.fastpath`).

Both give identical reports. Each patch is skipped once the real code has it.

    python -m benchmarks.proposed analyze TRACE ...   # same arguments as `overlapcheck analyze`
"""

from __future__ import annotations

import dataclasses
import inspect
import multiprocessing as mp
import os

import numpy as np


def _window_intervals() -> None:
    from overlapcheck.analysis import intervals as iv

    if "_window" in vars(iv):
        return

    def window(b: iv.Intervals, lo: float, hi: float) -> iv.Intervals:
        i = int(np.searchsorted(b.ends, lo, side="right"))
        j = int(np.searchsorted(b.starts, hi, side="left"))
        return iv.Intervals(b.starts[i:j], b.ends[i:j])

    sweep = iv._sweep

    def _sweep(a: iv.Intervals, b: iv.Intervals, keep):  # noqa: ANN202
        return sweep(a, window(b, a.starts[0], a.ends[-1]) if len(a) and len(b) else b, keep)

    def intersection_length(a: iv.Intervals, b: iv.Intervals) -> float:
        if not len(a) or not len(b):
            return 0.0
        b = window(b, a.starts[0], a.ends[-1])
        return iv.length(a) + iv.length(b) - iv.length(iv.combine(a, b)) if len(b) else 0.0

    iv._sweep, iv.intersection_length = _sweep, intersection_length


def _steps_by_sort() -> None:
    from overlapcheck.analysis import metrics

    if "_by_step" in vars(metrics):
        return
    step = metrics._step
    cache: list = [None, None, None]  # acts, order, sorted step numbers

    def _step(model, acts, i, compute, compute_or_comm):  # noqa: ANN001, ANN202
        if cache[0] is not acts:
            order = np.argsort(acts.step, kind="stable")
            cache[:] = [acts, order, acts.step[order]]
        _, order, keys = cache
        number = model.steps.number[i]
        idx = order[np.searchsorted(keys, number, "left") : np.searchsorted(keys, number, "right")]
        n = len(acts)
        sub = dataclasses.replace(
            acts,
            **{
                f.name: getattr(acts, f.name)[idx]
                for f in dataclasses.fields(acts)
                if isinstance(getattr(acts, f.name), np.ndarray) and len(getattr(acts, f.name)) == n
            },
        )
        return step(model, sub, i, compute, compute_or_comm)

    metrics._step = _step


def _parallel_reader() -> None:
    from overlapcheck.trace import fastpath, reader

    if "workers" in inspect.signature(reader.load_trace).parameters:
        return
    from overlapcheck import pipeline

    plain = reader.load_trace

    def load_trace(path: str, progress=None):  # noqa: ANN001, ANN202
        if mp.parent_process() is None and (os.cpu_count() or 1) > 1 and fastpath.worth_parallel(path):
            return fastpath.load_parallel(path, os.cpu_count() or 1, progress)
        return plain(path, progress)

    reader.load_trace = pipeline.load_trace = load_trace


if __name__ == "__main__":
    _window_intervals()
    _steps_by_sort()
    _parallel_reader()
    from overlapcheck.cli import main

    main()
