"""The activities the metrics measure: GPU kernels/copies, or, for a gloo (CPU-only) run, CPU lanes.

Each activity has an interval, a class (compute / comm / memcpy / memset), a collective kind, the lane it ran
on (CUDA stream, or CPU thread) and the profiler step that issued it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from overlapcheck.analysis import intervals as iv
from overlapcheck.trace import classify as C
from overlapcheck.trace.model import CPU_OP, TraceModel


@dataclass
class Activities:
    start: np.ndarray
    end: np.ndarray
    cls: np.ndarray
    coll: np.ndarray
    lane: np.ndarray
    step: np.ndarray  # ProfilerStep number, -1 when none
    lanes: str  # "gpu" or "cpu"
    notes: list[str] = field(default_factory=list)
    phase: np.ndarray | None = None  # index into PHASES, -1 when none (set by activities_of)
    issued: np.ndarray | None = None  # CPU time the activity was issued, NaN when not in the trace (activities_of)
    # where the program issued each activity, for the module attribution (analysis/modules.py): the CPU time and
    # thread index of its launch (GPU lanes) or of the c10d op that issued it (gloo lanes); NaN / -1 when unknown
    origin: np.ndarray | None = None
    origin_thread: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.start)


PHASES = ("forward", "backward", "optimizer")
_BACKWARD_OP = "autograd::engine::evaluate_function"


def activities_of(model: TraceModel) -> Activities:
    """GPU activity when the trace has any; else the gloo CPU lanes; else nothing."""
    if len(model.gpu):
        g = model.gpu
        launch, known = issue_times(model)
        launch = np.where(known, launch, np.nan)  # a launch that is not in the trace is in no step
        acts = Activities(g.start, g.end, g.cls, g.coll, g.stream, step_of(model, launch), "gpu")
        acts.origin, acts.origin_thread = launch, launch_threads(model)
    elif gloo := gloo_threads(model):
        acts = cpu_activities(model, gloo)
        launch = acts.start
    else:
        empty = np.zeros(0)
        acts = Activities(
            empty,
            empty,
            empty.astype(np.int8),
            empty.astype(np.int8),
            empty.astype(np.int64),
            empty.astype(np.int64),
            "gpu",
        )
        launch = empty
    acts.phase = phase_of(model, launch, phase_windows(model))
    acts.issued = launch
    return acts


def phase_windows(model: TraceModel) -> np.ndarray:
    """Per profiled step, the CPU window of its backward pass: from the first to the last end of the autograd
    engine's `evaluate_function` ops that start inside the step. Rows (start, end); NaN when a step has none."""
    s = model.steps
    out = np.full((len(s), 2), np.nan)
    if not len(s) or not len(model.ops):
        return out
    backward_names = [i for i, n in enumerate(model.names) if n.startswith(_BACKWARD_OP)]
    sel = np.isin(model.ops.name, backward_names)
    starts, ends = model.ops.start[sel], model.ops.end[sel]
    for i in range(len(s)):
        inside = (starts >= s.start[i]) & (starts < s.end[i])
        if inside.any():
            out[i] = starts[inside].min(), ends[inside].max()
    return out


def phase_of(model: TraceModel, times: np.ndarray, windows: np.ndarray) -> np.ndarray:
    """forward (0) before the step's backward window, backward (1) inside it, optimizer (2) after it, by the
    time the activity was issued; -1 outside steps, in steps without a backward pass, or when the time is
    unknown (NaN)."""
    s = model.steps
    out = np.full(len(times), -1, dtype=np.int8)
    if not len(s):
        return out
    i = np.searchsorted(s.start, times, side="right") - 1
    ok = (i >= 0) & np.isfinite(times) & ~np.isnan(windows[np.maximum(i, 0), 0])
    ok[ok] &= times[ok] < s.end[i[ok]]
    lo, hi = windows[i[ok], 0], windows[i[ok], 1]
    t = times[ok]
    out[ok] = np.where(t < lo, 0, np.where(t <= hi, 1, 2))
    return out


def issue_times(model: TraceModel) -> tuple[np.ndarray, np.ndarray]:
    """(time, known) for each GPU activity: the CPU time at which it was issued, from its runtime call (same
    correlation id) or else its `ac2g` flow start, and whether the trace holds either. Where it does not
    (`known` False; the launch preceded the profiler window, as for the tail of the previous, unprofiled
    iteration), the time is the activity's own start."""
    g = model.gpu
    launch = g.start.copy()
    found = np.zeros(len(g), dtype=bool)
    for table in (model.runtime, model.flows):
        if not len(table):
            continue
        corr, first = np.unique(table.correlation, return_index=True)
        i = np.searchsorted(corr, g.correlation)
        i = np.minimum(i, len(corr) - 1)
        hit = (~found) & (g.correlation >= 0) & (corr[i] == g.correlation)
        launch[hit] = table.start[first[i[hit]]]
        found |= hit
    return launch, found


def launch_threads(model: TraceModel) -> np.ndarray:
    """The thread index (into `model.threads`) that issued each GPU activity: its runtime call's thread (same
    correlation id), else its `ac2g` flow start's; -1 when neither is in the trace."""
    g = model.gpu
    out = np.full(len(g), -1, dtype=np.int64)
    found = np.zeros(len(g), dtype=bool)
    for table in (model.runtime, model.flows):
        if not len(table):
            continue
        corr, first = np.unique(table.correlation, return_index=True)
        i = np.minimum(np.searchsorted(corr, g.correlation), len(corr) - 1)
        hit = (~found) & (g.correlation >= 0) & (corr[i] == g.correlation)
        out[hit] = table.thread[first[i[hit]]]
        found |= hit
    return out


def launch_times(model: TraceModel) -> np.ndarray:
    """CPU time at which each GPU activity was issued: its runtime call (same correlation id), else its `ac2g`
    flow start, else (no launch in the trace) its own start. A time, for the diagnosis; which step an activity
    belongs to comes from `launch_steps` (no launch: no step)."""
    return issue_times(model)[0]


def launch_steps(model: TraceModel) -> np.ndarray:
    """The ProfilerStep number of each GPU activity: the step whose CPU span holds its launch; -1 when the
    launch is in no step or not in the trace (docs/metrics.md, Per step)."""
    launch, known = issue_times(model)
    return step_of(model, np.where(known, launch, np.nan))


def step_of(model: TraceModel, times: np.ndarray) -> np.ndarray:
    """The ProfilerStep number whose CPU span [start, end) contains each time, -1 if none (or NaN)."""
    s = model.steps
    out = np.full(len(times), -1, dtype=np.int64)
    if not len(s):
        return out
    i = np.searchsorted(s.start, times, side="right") - 1
    ok = (i >= 0) & np.isfinite(times)
    ok[ok] = times[ok] < s.end[i[ok]]
    out[ok] = s.number[i[ok]]
    return out


def gloo_threads(model: TraceModel) -> set[int]:
    """Thread indices of gloo's communication threads, found by what runs on them, never by their name:
    a thread on which `gloo:*` annotations run and that issues no collective (`c10d::*`,
    `record_param_comms`; those run on the thread that calls torch.distributed). The profiler names gloo's
    worker threads `pt_gloo_runloop`, but often one of them after the process (`python3`)."""
    o = model.ops
    if not len(o):
        return set()
    carriers = np.unique(o.thread[_name_mask(model, o.name, lambda n: n.startswith("gloo:"))])
    if not len(carriers):
        return set()
    issuing = _name_mask(model, o.name, lambda n: bool(_COLLECTIVE_OP.match(n))) & (o.kind == CPU_OP)
    return {int(t) for t in np.setdiff1d(carriers, np.unique(o.thread[issuing]))}


def _name_mask(model: TraceModel, column: np.ndarray, predicate: Callable[[str], bool]) -> np.ndarray:
    """Rows whose interned name satisfies `predicate`, testing each name once (no loop over events)."""
    good = np.array([predicate(n) for n in model.names] + [False], dtype=bool)  # index -1: no name
    return good[np.where(column >= 0, column, len(model.names))]


_COLLECTIVE_OP = re.compile(r"^(?:c10d::|record_param_comms)")
_WAIT_OP = re.compile(r"wait", re.IGNORECASE)
_CAPTURE_RANGE = "overlapcheck."  # the ranges `overlapcheck run` opens around DeepSpeed's hooks (capture/modules.py)


def cpu_activities(model: TraceModel, gloo: set[int]) -> Activities:
    """A gloo run: `gloo:*` annotations on the gloo threads (`gloo_threads`) are communication; leaf `cpu_op`s on
    the other threads, minus the time inside collective or wait ops, are compute. The collective of each gloo
    annotation is that of the `c10d::` op that issued it (gloo runs a reduce-scatter as an all-reduce), matched
    in order."""
    o = model.ops
    names = np.array(model.names, dtype=object)
    op_names = names[o.name] if len(o) else np.zeros(0, dtype=object)
    on_gloo = np.isin(o.thread, list(gloo))
    is_gloo_ann = on_gloo & _name_mask(model, o.name, lambda n: n.startswith("gloo:"))
    is_coll_op = ~on_gloo & _name_mask(model, o.name, lambda n: bool(_COLLECTIVE_OP.match(n)))
    is_wait = ~on_gloo & _name_mask(model, o.name, lambda n: bool(_WAIT_OP.search(n)))

    comm_idx = np.flatnonzero(is_gloo_ann)
    comm_idx = comm_idx[np.argsort(o.start[comm_idx], kind="stable")]
    coll, issuer = _match_issuers(o, op_names, comm_idx, np.flatnonzero(is_coll_op & (o.kind == CPU_OP)))

    ours = _name_mask(model, o.name, lambda n: n.startswith(_CAPTURE_RANGE))  # module annotations: no compute
    leaves = _leaf_ops(o, ~on_gloo & (o.kind == CPU_OP) & ~is_coll_op & ~is_wait & ~ours)
    blocked = iv.union(o.start[is_coll_op | is_wait], o.end[is_coll_op | is_wait])
    compute = iv.subtract(iv.union(o.start[leaves], o.end[leaves]), blocked)

    n_comm, n_comp = len(comm_idx), len(compute)
    start = np.concatenate([o.start[comm_idx], compute.starts])
    end = np.concatenate([o.end[comm_idx], compute.ends])
    cls = np.concatenate([np.full(n_comm, C.COMM, np.int8), np.full(n_comp, C.COMPUTE, np.int8)])
    colls = np.concatenate([coll, np.full(n_comp, C.NO_COLLECTIVE, np.int8)])
    lane = np.concatenate([o.thread[comm_idx].astype(np.int64), np.full(n_comp, -1, np.int64)])
    note = (
        "CPU-only gloo run: communication = gloo:* annotations on gloo's worker threads, found by what runs on "
        f"them (threads named {_thread_names(model, gloo)}), compute = leaf cpu_ops on the other threads (lane -1)"
    )
    acts = Activities(start, end, cls, colls, lane, step_of(model, start), "cpu", [note])
    known = issuer >= 0
    origin = np.full(len(acts), np.nan)
    origin_thread = np.full(len(acts), -1, dtype=np.int64)
    origin[:n_comm][known] = o.start[issuer[known]]
    origin_thread[:n_comm][known] = o.thread[issuer[known]]
    acts.origin, acts.origin_thread = origin, origin_thread
    return acts


def _thread_names(model: TraceModel, threads: set[int]) -> str:
    """'pt_gloo_runloop, python3': the profiler's names of the threads (`thread 26426 (python3)` -> python3)."""
    labels = []
    for t in sorted(threads):
        name = str(model.threads[t][2])
        labels.append(name.split("(", 1)[1].rstrip(")") if name.endswith(")") and "(" in name else name or "?")
    return ", ".join(sorted(labels))


def _match_issuers(
    o, op_names: np.ndarray, comm_idx: np.ndarray, issuer_idx: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Collective kind of each gloo annotation: the earliest unmatched issuing c10d op that started before it;
    and that op's index in `o` (-1 when none matched)."""
    issuers = sorted(issuer_idx.tolist(), key=lambda i: o.start[i])
    out = np.empty(len(comm_idx), dtype=np.int8)
    which = np.full(len(comm_idx), -1, dtype=np.int64)
    j = 0
    for k, ci in enumerate(comm_idx.tolist()):
        kind = None
        if j < len(issuers) and o.start[issuers[j]] <= o.start[ci]:
            kind = C.collective_from_arg(op_names[issuers[j]].split("::")[-1].rstrip("_"))
            which[k] = issuers[j]
            j += 1
        kind = kind or C.collective_from_arg(op_names[ci].split(":", 1)[1]) or "other"
        out[k] = C.COLLECTIVES.index(kind)
    return out, which


def _leaf_ops(o, candidates: np.ndarray) -> np.ndarray:
    """Indices of candidate ops that contain no other candidate op on the same thread."""
    idx = np.flatnonzero(candidates)
    if not len(idx):
        return idx
    order = np.lexsort((-o.end[idx], o.start[idx], o.thread[idx]))
    idx = idx[order]
    nxt_same = np.append(o.thread[idx][1:] == o.thread[idx][:-1], False)
    nxt_start = np.append(o.start[idx][1:], np.inf)
    is_leaf = ~nxt_same | (nxt_start >= o.end[idx])
    return idx[is_leaf]
