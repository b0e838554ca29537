"""The timeline of one rank over its selected steps, for the HTML report and the Perfetto file (never written to
JSON): its GPU (or gloo CPU) activities lane by lane, the exposed communication, the step windows and phases,
the host events the diagnosis blames, and the first collectives for aligning the clocks of ranks."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np

from overlapcheck.analysis import intervals as iv
from overlapcheck.analysis.activities import PHASES, Activities, activities_of
from overlapcheck.analysis.modules import label_of, served_by
from overlapcheck.model import Blame, RankMetrics, Timeline, TimelineLane, TimelineStep
from overlapcheck.trace import classify as C
from overlapcheck.trace.model import TraceModel

MAX_EVENTS_RANK = 60_000  # activities kept per rank: communication first, then the longest
MAX_ANCHORS = 64  # first collectives kept for clock alignment


def timeline_of(model: TraceModel, rank: RankMetrics, host: Sequence[Blame] = ()) -> Timeline | None:
    """Every activity of the (already step-restricted) trace, capped at MAX_EVENTS_RANK; `host` are the blamed
    host events of the rank. None when the trace has no activity."""
    acts = activities_of(model)
    if not len(acts):
        return None
    t0 = float(acts.start.min())
    end = float(acts.end.max())
    worst = max(rank.steps, key=lambda s: (s.collectives["all"].exposed_us, s.step)) if rank.steps else None

    dur = acts.end - acts.start
    idx = np.arange(len(acts))
    omitted = 0
    if len(idx) > MAX_EVENTS_RANK:
        order = np.lexsort((-dur, acts.cls != C.COMM))  # communication first, then the longest
        idx = np.sort(order[:MAX_EVENTS_RANK])
        omitted = len(acts) - MAX_EVENTS_RANK
    lane_ids = {int(lane): n for n, lane in enumerate(np.unique(acts.lane).tolist())}
    lanes = [_lane(model, acts, lane, n) for lane, n in lane_ids.items()]
    gpu = acts.lanes == "gpu"
    nelems = model.gpu.nelems if gpu else None
    nbytes = model.gpu.nbytes if gpu else None
    comm_idx, served, _, _, _ = served_by(model, acts)
    module_of = {int(i): label_of(m) for i, m in zip(comm_idx.tolist(), served, strict=True)}
    names: list[str] = []
    name_index: dict[str, int] = {}
    events: list[list[object]] = []
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
                lane_ids[int(acts.lane[i])],
                float(acts.start[i]) - t0,
                float(dur[i]),
                cls,
                name_index[name],
                int(acts.step[i]),
                int(nelems[i]) if nelems is not None else -1,
                int(nbytes[i]) if nbytes is not None else -1,
                module_of.get(i),
            ]
        )
    comm, compute = acts.cls == C.COMM, acts.cls == C.COMPUTE
    exposed = iv.subtract(iv.union(acts.start[comm], acts.end[comm]), iv.union(acts.start[compute], acts.end[compute]))
    return Timeline(
        step=worst.step if worst is not None else None,
        t0=t0,
        duration=end - t0,
        lanes=lanes,
        events=events,
        names=names,
        exposed=[[float(a) - t0, float(b) - t0] for a, b in zip(exposed.starts, exposed.ends, strict=True)],
        steps=_steps(model, rank, acts, t0),
        host=list(host),
        anchors=_anchors(model, acts),
        omitted=omitted,
    )


def _lane(model: TraceModel, acts: Activities, lane: int, number: int) -> TimelineLane:
    sel = acts.lane == lane
    counts = np.bincount(acts.cls[sel].astype(np.int64), minlength=4)
    kinds = [C.CLASS_NAMES[c] for c in np.flatnonzero(counts)]
    kind = kinds[0] if len(kinds) == 1 else "mixed"
    if acts.lanes == "cpu":
        label = "CPU compute" if lane < 0 else f"gloo thread {model.threads[int(lane)][1]}"
        return TimelineLane(number, label, "cpu" if lane < 0 else "comm")
    return TimelineLane(number, f"stream {int(lane)}", kind, int(lane))


def _steps(model: TraceModel, rank: RankMetrics, acts: Activities, t0: float) -> list[TimelineStep]:
    """Each step's GPU window, period and CPU span, and the GPU span of the activities each phase issued."""
    cpu = {
        int(n): (float(a), float(b))
        for n, a, b in zip(model.steps.number, model.steps.start, model.steps.end, strict=True)
    }
    out = []
    for s in rank.steps:
        mine = acts.step == s.step
        phases: dict[str, list[float]] = {}
        if acts.phase is not None:
            for p, phase in enumerate(PHASES):
                sel = mine & (acts.phase == p)
                if sel.any():
                    phases[phase] = [float(acts.start[sel].min()) - t0, float(acts.end[sel].max()) - t0]
        a, b = cpu.get(s.step, (s.start_us, s.start_us + s.cpu_duration_us))
        period: tuple[float | None, float | None] = (None, None)
        if s.period_start_us is not None and s.period_us is not None:
            period = (s.period_start_us - t0, s.period_start_us + s.period_us - t0)
        out.append(
            TimelineStep(s.step, s.start_us - t0, s.start_us + s.duration_us - t0, a - t0, b - t0, phases, *period)
        )
    return out


def _anchors(model: TraceModel, acts: Activities) -> list[tuple[str, float]]:
    """The first collectives in start order, keyed `<process group>|<kind>|<n-th of that kind on that group>` (the
    key the straggler rule matches collectives across ranks by), with their absolute end."""
    comm = np.flatnonzero(acts.cls == C.COMM)
    comm = comm[np.argsort(acts.start[comm], kind="stable")][: MAX_ANCHORS * 4]
    pg = model.gpu.pg if acts.lanes == "gpu" else np.full(len(acts), -1)
    seen: Counter[tuple[int, int]] = Counter()
    out = []
    for i in comm.tolist():
        key = (int(pg[i]), int(acts.coll[i]))
        seen[key] += 1
        group = model.name(key[0]) if key[0] >= 0 else ""
        out.append((f"{group}|{C.COLLECTIVES[key[1]]}|{seen[key]}", float(acts.end[i])))
        if len(out) >= MAX_ANCHORS:
            break
    return out


def _name(model: TraceModel, acts: Activities, i: int) -> str:
    if acts.lanes == "gpu":
        return model.name(int(model.gpu.name[i]))
    return "compute" if acts.cls[i] == C.COMPUTE else C.COLLECTIVES[acts.coll[i]]
