"""A compact timeline of one step of one rank, for the HTML report (never written to JSON)."""

from __future__ import annotations

import numpy as np

from overlapcheck.analysis import intervals as iv
from overlapcheck.analysis.activities import Activities, activities_of
from overlapcheck.model import RankMetrics, Timeline, TimelineLane
from overlapcheck.trace import classify as C
from overlapcheck.trace.model import TraceModel

MAX_EVENTS_PER_LANE = 3000


def timeline_of(model: TraceModel, rank: RankMetrics) -> Timeline | None:
    """The step with the most exposed communication (or the whole trace without steps), lane by lane."""
    acts = activities_of(model)
    if not len(acts):
        return None
    if rank.steps:
        step = max(rank.steps, key=lambda s: (s.collectives["all"].exposed_us, s.step))
        lo, hi, number = step.start_us, step.start_us + step.duration_us, step.step
    else:
        lo, hi, number = float(acts.start.min()), float(acts.end.max()), None
    sel = np.flatnonzero((acts.end > lo) & (acts.start < hi))
    names: list[str] = []
    name_index: dict[str, int] = {}
    lanes: list[TimelineLane] = []
    events: list[list[object]] = []
    for lane_no, lane in enumerate(np.unique(acts.lane[sel])):
        idx = sel[acts.lane[sel] == lane]
        counts = np.bincount(acts.cls[idx].astype(np.int64), minlength=4)
        kinds = [C.CLASS_NAMES[c] for c in np.flatnonzero(counts)]
        kind = kinds[0] if len(kinds) == 1 else "mixed"
        if acts.lanes == "cpu":
            label = "CPU compute" if lane < 0 else f"gloo thread {model.threads[int(lane)][1]}"
            kind = "cpu" if lane < 0 else "comm"
        else:
            label = f"stream {int(lane)}"
        lanes.append(TimelineLane(lane_no, label, kind))
        idx = idx[np.argsort(acts.end[idx] - acts.start[idx])[::-1][:MAX_EVENTS_PER_LANE]]
        for i in idx.tolist():
            name = _name(model, acts, i)
            if name not in name_index:
                name_index[name] = len(names)
                names.append(name)
            cls = C.CLASS_NAMES[acts.cls[i]]
            if acts.cls[i] == C.COMM:
                cls = f"comm:{C.COLLECTIVES[acts.coll[i]]}"
            events.append(
                [
                    lane_no,
                    round(float(acts.start[i]) - lo, 3),
                    round(float(acts.end[i] - acts.start[i]), 3),
                    cls,
                    name_index[name],
                ]
            )
    comm = acts.cls == C.COMM
    compute = acts.cls == C.COMPUTE
    exposed = iv.clip(
        iv.subtract(iv.union(acts.start[comm], acts.end[comm]), iv.union(acts.start[compute], acts.end[compute])),
        lo,
        hi,
    )
    return Timeline(
        step=number,
        t0=lo,
        duration=hi - lo,
        lanes=lanes,
        events=events,
        names=names,
        exposed=[
            [round(float(a) - lo, 3), round(float(b) - lo, 3)]
            for a, b in zip(exposed.starts, exposed.ends, strict=True)
        ],
    )


def _name(model: TraceModel, acts: Activities, i: int) -> str:
    if acts.lanes == "gpu":
        return model.name(int(model.gpu.name[i]))
    return "compute" if acts.cls[i] == C.COMPUTE else C.COLLECTIVES[acts.coll[i]]
