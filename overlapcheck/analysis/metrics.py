"""The overlap metrics of one rank, per collective and per step. Definitions: docs/metrics.md (kept in sync)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from overlapcheck.analysis import intervals as iv
from overlapcheck.analysis.activities import PHASES, Activities, activities_of
from overlapcheck.model import (
    ALL,
    Collectives,
    Copies,
    OutsideSteps,
    PhaseMetrics,
    RankMetrics,
    Split,
    StepMetrics,
    StreamStats,
)
from overlapcheck.trace import classify as C
from overlapcheck.trace.launch import FROM_OP, KIND_FROM, op_collective
from overlapcheck.trace.model import RECORD_PARAM_COMMS, TraceModel
from overlapcheck.trace.reader import rank_of, world_of

NOISE_US = 1e-6


def split(comm: iv.Intervals, compute: iv.Intervals, count: int) -> Split:
    """count, time_us = |C|, overlapped_us = |C ∩ P|, exposed_us = time − overlapped, overlap = overlapped / time."""
    time_us = iv.length(comm)
    overlapped = iv.intersection_length(comm, compute) if time_us else 0.0
    # float noise of the interval sums (4.66e-10 µs where nothing overlaps) is no overlap: snap below a picosecond
    if abs(overlapped) < NOISE_US:
        overlapped = 0.0
    elif abs(time_us - overlapped) < NOISE_US:
        overlapped = time_us
    return Split(int(count), time_us, overlapped, time_us - overlapped, overlapped / time_us if time_us > 0 else None)


def collectives(acts: Activities, mask: np.ndarray, compute: iv.Intervals) -> Collectives:
    """The split for `all` and every collective kind, over the communication activities selected by `mask`."""
    comm = mask & (acts.cls == C.COMM)
    out = {ALL: split(iv.union(acts.start[comm], acts.end[comm]), compute, int(comm.sum()))}
    for k, kind in enumerate(C.COLLECTIVES):
        sel = comm & (acts.coll == k)
        out[kind] = split(iv.union(acts.start[sel], acts.end[sel]), compute, int(sel.sum()))
    return out


def copies(acts: Activities, mask: np.ndarray, cls: int, busy_other: iv.Intervals) -> Copies:
    """count, time_us = |M|, exposed_us = |M − (compute ∪ communication)| for memcpy or memset."""
    sel = mask & (acts.cls == cls)
    m = iv.union(acts.start[sel], acts.end[sel])
    return Copies(int(sel.sum()), iv.length(m), iv.length(iv.subtract(m, busy_other)))


def analyze_model(model: TraceModel, acts: Activities | None = None) -> RankMetrics:
    """The metrics (the RANK object, docs/report-schema.md) of one trace (`acts`: its `activities_of`, when the
    caller has them already)."""
    acts = activities_of(model) if acts is None else acts
    everything = np.ones(len(acts), dtype=bool)
    is_compute, is_comm = acts.cls == C.COMPUTE, acts.cls == C.COMM
    compute = iv.union(acts.start[is_compute], acts.end[is_compute])
    comm_all = iv.union(acts.start[is_comm], acts.end[is_comm])
    compute_or_comm = iv.combine(compute, comm_all)
    busy = iv.union(acts.start, acts.end)
    span = float(acts.end.max() - acts.start.min()) if len(acts) else 0.0

    of_step = _by_step(acts)
    own = [of_step(int(number)) for number in model.steps.number]
    periods = step_periods(model, own)
    steps = [_step(model, own[i], i, periods[i], compute, compute_or_comm) for i in range(len(model.steps))]
    rank_collectives = collectives(acts, everything, compute)
    if steps:
        step_time = float(sum(p[1] for p in periods))
        step_exposed = sum(s.collectives[ALL].exposed_us for s in steps)
    else:
        step_time, step_exposed = span, rank_collectives[ALL].exposed_us
    before, outside = _outside_steps(model, acts, compute, compute_or_comm)

    info = model.distributed
    notes = list(model.notes) + acts.notes
    if not len(acts):
        notes.append("no GPU kernels and no gloo communication threads: nothing to measure, overlap is null")
    elif not is_comm.any():
        notes.append(issued_not_recorded(model) or "no communication kernels: overlap is null")
    elif not (acts.end[is_comm] > acts.start[is_comm]).any():
        notes.append(
            f"all {int(is_comm.sum())} communication activities last 0 µs: the trace holds no time for them "
            "(a profiler that dropped the GPU's timestamps?), so their overlap is not measured"
        )
    if len(model.steps) == 0 and len(acts):
        notes.append("no ProfilerStep annotations: per-step numbers are not available")
    elif acts.lanes == "gpu" and len(acts) and acts.issued is not None and np.isnan(acts.issued).all():
        notes.append(
            "no GPU activity has its launch in the trace (no runtime calls, no ac2g flows): "
            "none can be attributed to a step"
        )
    host = model.metadata.get("host_name")
    return RankMetrics(
        rank=rank_of(model),
        source=model.source,
        world_size=world_of(model),
        backend=info.get("backend") if isinstance(info.get("backend"), str) else None,
        host=host if isinstance(host, str) else None,
        lanes=acts.lanes,
        span_us=span,
        busy_us=iv.length(busy),
        compute_us=iv.length(compute),
        idle_us=span - iv.length(busy),
        step_time_us=step_time,
        exposed_share=step_exposed / step_time if step_time > 0 and is_comm.any() else None,
        collectives=rank_collectives,
        memcpy=copies(acts, everything, C.MEMCPY, compute_or_comm),
        memset=copies(acts, everything, C.MEMSET, compute_or_comm),
        streams=_streams(acts),
        steps=steps,
        notes=notes,
        before_first_step=before,
        outside_steps=outside,
        kind_from=_kind_from(model, acts),
    )


def issued_not_recorded(model: TraceModel) -> str | None:
    """The note for a trace whose program issued collectives (`record_param_comms`, `nccl:*` / `c10d::*` ops) that
    ran no communication kernel in it: the GPU side was not recorded. None when it issued none."""
    names = model.names
    ops, kinds = np.unique(model.ops.name, return_counts=True)
    records = sum(int(n) for op, n in zip(ops.tolist(), kinds.tolist(), strict=True) if names[op] == RECORD_PARAM_COMMS)
    by_kind: dict[str, int] = {}
    for prefix in ("nccl:", "c10d::"):  # one family: a c10d op and its nccl op are one collective
        for op, n in zip(ops.tolist(), kinds.tolist(), strict=True):
            kind = op_collective(names[op]) if names[op].startswith(prefix) else None
            if kind is not None:
                by_kind[kind] = by_kind.get(kind, 0) + int(n)
        if by_kind:
            break
    issued = max(records, sum(by_kind.values()))
    if not issued:
        return None
    which = ", ".join(f"{kind} {n}" for kind, n in sorted(by_kind.items(), key=lambda kv: -kv[1]))
    return (
        f"{issued} collectives were issued ({which or 'record_param_comms'}) but none of their communication kernels "
        "is in the trace, so overlap is null: profile the GPU too (torch.profiler activities=[ProfilerActivity.CPU, "
        "ProfilerActivity.CUDA] on every rank, as `overlapcheck run` does)"
    )


def _kind_from(model: TraceModel, acts: Activities) -> dict[str, int]:
    """How many communication activities got their collective kind from each source (trace/launch.py): on GPU
    lanes the kernels' `kind_from`; on gloo lanes every collective is an op (`gloo:*`, record_param_comms)."""
    comm = acts.cls == C.COMM
    if not comm.any():
        return {}
    if acts.lanes != "gpu":
        return {KIND_FROM[FROM_OP]: int(comm.sum())}
    counts = np.bincount(model.gpu.kind_from[model.gpu.cls == C.COMM], minlength=len(KIND_FROM))
    return {KIND_FROM[i]: int(n) for i, n in enumerate(counts.tolist()) if n}


def step_periods(model: TraceModel, own: list[Activities]) -> list[tuple[float, float]]:
    """(start, length) of each step's period, in step order (docs/metrics.md, Per step). The period of a step
    ends where the GPU work of it and of every earlier step has ended, and starts where the previous step's
    ended; the first step with activity starts at its first kernel. So the periods tile the rank's timeline
    from the first step's first kernel to the end of the last step's work, and never overlap. Without any
    activity in any step, the periods are the CPU annotations."""
    s = model.steps
    if not any(len(a) for a in own):
        return [(float(s.start[i]), float(s.end[i] - s.start[i])) for i in range(len(s))]
    first = next(a for a in own if len(a))
    kernels = (first.cls == C.COMPUTE) | (first.cls == C.COMM)
    begin = float(first.start[kernels].min() if kernels.any() else first.start.min())
    out = []
    end = begin
    for acts in own:
        lo = end
        if len(acts):
            end = max(end, float(acts.end.max()))
        out.append((lo, end - lo))
    return out


def _outside_steps(
    model: TraceModel, acts: Activities, compute: iv.Intervals, compute_or_comm: iv.Intervals
) -> tuple[OutsideSteps | None, OutsideSteps | None]:
    """(before_first_step, outside_steps): the activities of no step that were issued before the first
    ProfilerStep began or whose launch is not in the trace (the tail of the previous, unprofiled iteration),
    and all activities of no step; None when the trace has no steps."""
    if not len(model.steps):
        return None, None
    outside = acts.step < 0
    issued = acts.issued if acts.issued is not None else acts.start
    early = outside & (np.isnan(issued) | (issued < float(model.steps.start.min())))
    return _outside(acts, early, compute, compute_or_comm), _outside(acts, outside, compute, compute_or_comm)


def _outside(acts: Activities, mask: np.ndarray, compute: iv.Intervals, compute_or_comm: iv.Intervals) -> OutsideSteps:
    own_compute = mask & (acts.cls == C.COMPUTE)
    return OutsideSteps(
        count=int(mask.sum()),
        busy_us=iv.length(iv.union(acts.start[mask], acts.end[mask])),
        compute_us=iv.length(iv.union(acts.start[own_compute], acts.end[own_compute])),
        collectives=collectives(acts, mask, compute),
        memcpy=copies(acts, mask, C.MEMCPY, compute_or_comm),
        memset=copies(acts, mask, C.MEMSET, compute_or_comm),
    )


def _by_step(acts: Activities) -> Callable[[int], Activities]:
    """The activities of one step, from one stable sort on the step number (a mask over every activity per step
    made the per-step metrics O(steps x activities))."""
    order = np.argsort(acts.step, kind="stable")
    keys = acts.step[order]
    n = len(acts)
    arrays = [
        f.name
        for f in dataclasses.fields(acts)
        if isinstance(getattr(acts, f.name), np.ndarray) and len(getattr(acts, f.name)) == n
    ]

    def of(number: int) -> Activities:
        idx = order[np.searchsorted(keys, number, "left") : np.searchsorted(keys, number, "right")]
        return dataclasses.replace(acts, **{name: getattr(acts, name)[idx] for name in arrays})

    return of


def _step(
    model: TraceModel,
    acts: Activities,
    i: int,
    period: tuple[float, float],
    compute: iv.Intervals,
    compute_or_comm: iv.Intervals,
) -> StepMetrics:
    number = int(model.steps.number[i])
    mask = acts.step == number
    cpu_duration = float(model.steps.end[i] - model.steps.start[i])
    if mask.any():
        start = float(acts.start[mask].min())
        duration = float(acts.end[mask].max()) - start
    else:
        start, duration = float(model.steps.start[i]), cpu_duration
    own_compute = mask & (acts.cls == C.COMPUTE)
    split_ = collectives(acts, mask, compute)
    phases = {}
    if acts.phase is not None and (acts.phase[mask] >= 0).any():
        for p, phase in enumerate(PHASES):
            in_phase = mask & (acts.phase == p)
            phase_compute = in_phase & (acts.cls == C.COMPUTE)
            phases[phase] = PhaseMetrics(
                iv.length(iv.union(acts.start[phase_compute], acts.end[phase_compute])),
                collectives(acts, in_phase, compute),
            )
    everything = split_[ALL]
    return StepMetrics(
        step=number,
        start_us=start,
        duration_us=duration,
        cpu_duration_us=cpu_duration,
        compute_us=iv.length(iv.union(acts.start[own_compute], acts.end[own_compute])),
        exposed_share=everything.exposed_us / period[1] if period[1] > 0 and everything.count else None,
        collectives=split_,
        memcpy=copies(acts, mask, C.MEMCPY, compute_or_comm),
        memset=copies(acts, mask, C.MEMSET, compute_or_comm),
        phases=phases,
        period_start_us=period[0],
        period_us=period[1],
    )


def _streams(acts: Activities) -> list[StreamStats]:
    out = []
    for lane in np.unique(acts.lane):
        sel = acts.lane == lane
        counts = np.bincount(acts.cls[sel].astype(np.int64), minlength=len(C.CLASS_NAMES))
        out.append(
            StreamStats(
                stream=int(lane),
                kernels=int(sel.sum()),
                busy_us=iv.length(iv.union(acts.start[sel], acts.end[sel])),
                classes={name: int(n) for name, n in zip(C.CLASS_NAMES, counts, strict=True)},
            )
        )
    return out
