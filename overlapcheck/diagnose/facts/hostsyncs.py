"""Host-blocking synchronizations and what each one cost.

A host sync (cudaStreamSynchronize, cudaDeviceSynchronize, cudaEventSynchronize, a synchronous or pageable
memcpy, `.item()`) stops the launching thread until the GPU catches up. It costs something only when the compute
stream then runs dry: a starvation window is a gap on the compute stream before an activity that started as soon
as the host launched it. The calls that returned inside such a window delayed that launch; see `chain_costs` for
how the window's idle time is shared among them. Each sync is owned by the first rule in OWNERS whose call
stack matches (the sync rules in rules/syncs.py report them).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from overlapcheck.analysis import intervals as iv
from overlapcheck.diagnose.facts.callsite import functions
from overlapcheck.trace import classify as C

if TYPE_CHECKING:
    from overlapcheck.diagnose.facts.view import RankFacts

SYNC_CALLS = {
    "cudaStreamSynchronize",
    "cudaDeviceSynchronize",
    "cudaEventSynchronize",
    "cudaMemcpy",
    "cudaMemcpy2D",
    "cuStreamSynchronize",
    "cuCtxSynchronize",
    "cuEventSynchronize",
    "cudaThreadSynchronize",
}
MEMCPY_CALLS = {"cudaMemcpyAsync", "cuMemcpyAsync", "cuMemcpyDtoHAsync_v2"}
BLOCKING_SYNC_KINDS = {"Stream Sync", "Context Sync", "Event Sync"}
MIN_BLOCKING_COPY_US = 20.0  # an async copy call that lasts as long as its transfer blocked the host
STARVED_LAUNCH_US = 30.0  # an activity that starts this soon after its launch call was waiting for the host


@dataclass
class Sync:
    """One host-blocking call."""

    start: float
    end: float
    thread: int
    call: str
    site: dict[str, Any]
    funcs: set[str]


def host_syncs(view: RankFacts) -> list[Sync]:
    """Every host-blocking call of the rank, with its call site."""
    rt = view.model.runtime
    starts = rt.start.tolist()
    idx = np.array(
        sorted({*view.runtime_named(*SYNC_CALLS).tolist(), *_blocking_copies(view)}, key=starts.__getitem__),
        dtype=np.int64,
    )
    sites = view.callsites
    out = []
    for i, start, end, thread, name in zip(
        idx.tolist(),
        rt.start[idx].tolist(),
        rt.end[idx].tolist(),
        rt.thread[idx].tolist(),
        rt.name[idx].tolist(),
        strict=True,
    ):
        mid = 0.5 * (rt.start[i] + rt.end[i])
        stack = sites.stack(thread, mid) if sites.has_stacks else []
        out.append(Sync(start, end, thread, view.names[name], sites.site(thread, mid), functions(stack)))
    out += _orphan_sync_events(view)
    return out


def _blocking_copies(view: RankFacts) -> list[int]:
    """Async memcpy calls that did not return before their copy was (nearly) done: pageable host memory."""
    rt, g = view.model.runtime, view.gpu
    idx = view.runtime_named(*MEMCPY_CALLS)
    copies = np.flatnonzero(g.cls == C.MEMCPY)
    if not len(idx) or not len(copies):
        return []
    order = copies[np.argsort(g.correlation[copies])]
    pos = np.clip(np.searchsorted(g.correlation[order], rt.correlation[idx]), 0, len(order) - 1)
    hit = g.correlation[order[pos]] == rt.correlation[idx]
    copy = order[pos]
    dur = g.end[copy] - g.start[copy]
    blocking = hit & (dur >= MIN_BLOCKING_COPY_US) & ((rt.end[idx] - rt.start[idx]) >= 0.5 * dur)
    return idx[blocking].tolist()


def _orphan_sync_events(view: RankFacts) -> list[Sync]:
    """cuda_sync events whose runtime call is not in the trace (an Event Sync from cudaEventQuery is not one)."""
    s = view.model.syncs
    if not len(s):
        return []
    orphan = view.name_mask(s.name, lambda n: n in BLOCKING_SYNC_KINDS)
    orphan &= ~np.isin(s.correlation, view.model.runtime.correlation)
    rows = np.flatnonzero(orphan)
    return [
        Sync(start, end, -1, view.names[name], {"frame": None, "stack": []}, set())
        for start, end, name in zip(s.start[rows].tolist(), s.end[rows].tolist(), s.name[rows].tolist(), strict=True)
    ]


# -- which rule owns a sync ----------------------------------------------------------------------------------


def _in(*names: str) -> Callable[[Sync], bool]:
    return lambda s: any(n in s.funcs for n in names)


def _is_comms_logger(s: Sync) -> bool:
    return "comm.py:log_wrapper" in s.funcs or "comm.py:timed_op" in s.funcs


def _is_throughput_timer(s: Sync) -> bool:
    return "timer.py:start" in s.funcs or "timer.py:stop" in s.funcs


def _is_offload_copy(s: Sync) -> bool:
    return "partition_grads" in s.funcs and ("Memcpy" in s.call or s.call == "cudaStreamSynchronize")


def _is_reduce_throttle(s: Sync) -> bool:
    return s.call == "cudaEventSynchronize" and "__reduce_and_partition_ipg_grads" in s.funcs


def _is_fetch_throttle(s: Sync) -> bool:
    return s.call == "cudaEventSynchronize" and ("fetch_sub_module" in s.funcs or "_fetch_sub_module_impl" in s.funcs)


OWNERS: list[tuple[str, Callable[[Sync], bool]]] = [
    ("comms-logger-sync", _is_comms_logger),
    ("throughput-timer-sync", _is_throughput_timer),
    ("offload-blocking-copy", _is_offload_copy),
    ("reduce-event-throttle", _is_reduce_throttle),
    ("fetch-throttle", _is_fetch_throttle),
    ("epilogue-sync", _in("independent_gradient_partition_epilogue")),
    ("host-sync", lambda s: True),
]


@dataclass
class Window:
    """A stretch in which the compute stream had nothing to run because the host had not launched its next
    activity yet: [queue end, start of that activity); `launch` is when the host launched it."""

    start: float
    end: float
    launch: float
    boundary: int = -1  # the step before whose first compute kernel it ends (a step boundary), else -1


def starvation_windows(view: RankFacts) -> list[Window]:
    """Every gap on the compute stream before an activity that started as soon as it was launched."""
    g = view.gpu
    on_s = np.flatnonzero(g.stream == view.compute_stream)
    if len(on_s) < 2:
        return []
    on_s = on_s[np.argsort(view.launch[on_s], kind="stable")]
    launch, start = view.launch[on_s], g.start[on_s]
    queued_end = np.maximum.accumulate(g.end[on_s])[:-1]  # end of the work launched before each activity
    gap = start[1:] - queued_end
    starved = (gap > 0) & (start[1:] - launch[1:] <= STARVED_LAUNCH_US)
    rows = np.flatnonzero(starved)
    return [Window(float(queued_end[r]), float(start[r + 1]), float(launch[r + 1])) for r in rows.tolist()]


def held_windows(view: RankFacts, windows: list[Window]) -> list[Window]:
    """`windows` plus the compute stalls on an inherent first all-gather that started as soon as the host
    launched it: compute then waited for the host's launch of that gather, which is starvation too (launch: the
    gather's). Such a stall joins the run of windows just before it that only short activities separate (the
    step's input copy and memset), so the calls that delayed all of them count once."""
    st = view.stalls
    first = set(view.first_gathers.tolist())
    g = view.gpu
    on_s = np.flatnonzero(g.stream == view.compute_stream)
    on_s = on_s[np.argsort(g.start[on_s], kind="stable")]
    queued_end = np.maximum.accumulate(g.end[on_s])
    out = sorted(windows, key=lambda w: w.start)
    for kernel, hi, comm in zip(st.kernel.tolist(), st.end.tolist(), st.comm.tolist(), strict=True):
        if comm not in first or g.start[comm] - view.launch[comm] > STARVED_LAUNCH_US:
            continue
        i = int(np.searchsorted(g.start[on_s], g.start[kernel], side="left"))
        lo = float(queued_end[i - 1]) if i > 0 else float(g.start[comm])  # the stream's queue ran dry here
        start = lo
        keep = []
        for w in sorted(out, key=lambda w: -w.start):  # join the run of windows just before it
            if w.end <= start and start - w.end <= STARVED_LAUNCH_US:
                start = w.start
            else:
                keep.append(w)
        out = [*keep, Window(start, hi, float(view.launch[comm]))]
    return sorted(out, key=lambda w: w.start)


# syncs whose awaited work the next compute needs anyway: only GPU-idle time in their windows is theirs
WAITED_FOR = ("epilogue-sync",)

Owner = tuple[str, str]  # (rule id, call site for generic host syncs else "")


def chain_costs(view: RankFacts, syncs: list[Sync], owners: list[Owner]) -> tuple[np.ndarray, np.ndarray]:
    """Cost of each sync. A window's blocking calls are those that returned after the queue ran dry and before
    the launch that ended it. Removing one owner's calls lets the host launch earlier by their blocked time,
    minus what the other owners' later calls would then wait longer (they wait for the same GPU work); the
    window's compute idle bounds the gain. Each owner's share goes to its calls in proportion to blocked time.
    Also returns, per call, the step whose boundary window it delayed (-1: inside a step)."""
    cost = np.zeros(len(syncs))
    boundary = np.full(len(syncs), -1)
    if not syncs:
        return cost, boundary
    ends = np.array([s.end for s in syncs])
    blocked = np.array([s.end - s.start for s in syncs])
    windows = held_windows(view, starvation_windows(view))
    if not windows:
        return cost, boundary
    _mark_boundaries(view, windows)
    lo = np.array([w.start for w in windows])
    hi = np.array([w.end for w in windows])
    launch = np.array([w.launch for w in windows])
    first = view.first_gathers
    inherent = iv.union(view.gpu.start[first], view.gpu.end[first])
    later_gathers = iv.subtract(view.all_gathers, inherent)
    # compute idle, less the part of later gathers longer than the compute that could hide them (compute
    # needs its parameters); compute that ran since the previous window is what a prefetch could hide behind
    idle = view.idle(lo, hi, view.compute_stream_busy)
    before = view.covered(lo, view.compute) - view.covered(np.concatenate([[-np.inf], hi[:-1]]), view.compute)
    idle -= np.maximum(0.0, _inside(view, later_gathers, lo, hi) - before)
    first_launch = view.launch[first]
    gpu_idle = view.idle(lo, hi, iv.union(view.gpu.start, view.gpu.end))
    order = np.argsort(ends, kind="stable")
    first_member = np.searchsorted(ends[order], lo - STARVED_LAUNCH_US, side="right")
    last_member = np.searchsorted(ends[order], launch, side="right")
    for n in np.flatnonzero(first_member < last_member).tolist():
        members = order[first_member[n] : last_member[n]]
        for owner in sorted({owners[m] for m in members.tolist()}):
            mine = members[[owners[m] == owner for m in members.tolist()]]
            later = members[(ends[members] > ends[mine[0]]) & np.array([owners[m] != owner for m in members])]
            # the step's first all-gather is waited for anyway, unless the host issued it after this owner's
            # first call returned: then it moves earlier with the host and hides behind the queued compute
            fixed = first[first_launch <= ends[mine].min()]
            waited = (
                _inside(view, iv.union(view.gpu.start[fixed], view.gpu.end[fixed]), lo[n : n + 1], hi[n : n + 1])[0]
                if len(fixed)
                else 0.0
            )
            # the optimizer needs the reduced gradients: only the epilogue's own overhead, once the GPU is idle
            bound = gpu_idle[n] if owner[0] in WAITED_FOR else idle[n] - waited
            saved = min(bound, max(0.0, blocked[mine].sum() - blocked[later].sum()))
            cost[mine] += saved * blocked[mine] / max(blocked[mine].sum(), 1e-9)
            boundary[mine] = windows[n].boundary
    return cost, boundary


def _mark_boundaries(view: RankFacts, windows: list[Window]) -> None:
    """Set `boundary` on the windows that end between a step's GPU start and its first compute-stream kernel
    (the later step wins where two steps' stretches overlap)."""
    on_stream = np.flatnonzero(view.is_compute & (view.gpu.stream == view.compute_stream))
    first_compute = {step: float(view.gpu.start[rows].min()) for step, rows in view.group_by_step(on_stream).items()}
    order = np.argsort(np.array([w.end for w in windows]), kind="stable")
    ends = np.array([windows[k].end for k in order.tolist()])
    for step in view.metrics.steps:
        a = int(np.searchsorted(ends, float(step.start_us), side="left"))
        b = int(np.searchsorted(ends, first_compute.get(step.step, -np.inf), side="right"))
        for k in order[a:b].tolist():
            windows[k].boundary = step.step


def _inside(view: RankFacts, a: iv.Intervals, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """|A ∩ [lo, hi)| for each window."""
    return view.covered(hi, a) - view.covered(lo, a)


PINNED_OVER_PAGEABLE = 22.0 / 6.0  # PCIe Gen4 device-to-host: ~22 GB/s pinned, ~6 GB/s pageable (staged)


def pinned_copy_tail(view: RankFacts) -> float:
    """Per step: the offload copies that stay exposed once they are asynchronous from pinned memory. They then
    run on the reduce stream beside backward at the pinned bandwidth (measured on this trace's pinned copies
    when it has any), and the epilogue waits for what backward compute cannot cover, at least the last copy."""
    g = view.gpu
    is_copy = g.cls == C.MEMCPY
    pageable = np.flatnonzero(is_copy & view.name_mask(g.name, lambda n: "DtoH" in n and "Pageable" in n))
    pinned = np.flatnonzero(is_copy & view.name_mask(g.name, lambda n: "Pinned" in n) & (g.nbytes > 0))
    if not len(pageable):
        return 0.0
    dur = g.end - g.start
    ratio = PINNED_OVER_PAGEABLE
    if len(pinned) and (g.nbytes[pageable] > 0).all():
        pinned_bw = g.nbytes[pinned].sum() / dur[pinned].sum()
        ratio = pinned_bw / (g.nbytes[pageable].sum() / dur[pageable].sum())
    tails = []
    for rows in view.group_by_step(pageable).values():
        rows = rows[np.argsort(g.start[rows])]
        beside = iv.length(iv.clip(view.compute, float(g.start[rows[0]]), float(g.end[rows[-1]])))
        tails.append(max(dur[rows[-1]] / ratio, dur[rows].sum() / ratio - beside))
    return float(sum(tails)) / view.n_steps


def owner_of(s: Sync) -> str:
    return next(rule for rule, match in OWNERS if match(s))


def per_step_cost(
    view: RankFacts, cost: np.ndarray, boundary: np.ndarray, times: np.ndarray
) -> tuple[float, list[int]]:
    """Mean cost per step: inside steps over the profiled steps; at step boundaries over the boundaries the trace
    shows whole (not the first profiled step's: the calls and compute before it ran before the profiler
    started, so what delayed that window and what could have hidden its gathers are not in the trace)."""
    inside = boundary < 0
    per_step, steps = view.per_step(cost[inside], times[inside])
    first = min(view.step_numbers, default=None)
    seen = ~inside & (boundary != first)
    if seen.any() and view.n_steps > 1:
        more, more_steps = view.per_step(cost[seen], times[seen])
        per_step += more * view.n_steps / (view.n_steps - 1)
        steps = sorted(set(steps) | set(more_steps))
    return per_step, steps


@dataclass(frozen=True)
class SyncCosts:
    """Every host-blocking call of a rank, its owner, and what it cost (see `chain_costs`)."""

    syncs: list[Sync]
    owners: list[Owner]
    cost: np.ndarray
    boundary: np.ndarray  # the step whose boundary window each call delayed, -1 inside a step

    def owned_by(self, rule: str) -> list[tuple[Owner, np.ndarray]]:
        """The owners of one rule in order of their first call, each with the indices of its calls."""
        out = []
        for owner in dict.fromkeys(o for o in self.owners if o[0] == rule):
            out.append((owner, np.array([i for i, o in enumerate(self.owners) if o == owner])))
        return out


def sync_costs(view: RankFacts) -> SyncCosts:
    """The host syncs of the rank with their owners and costs (computed once per rank)."""
    syncs = host_syncs(view)
    rules = [owner_of(s) for s in syncs]
    owners = [
        (r, f"{s.call} @ {s.site.get('frame')}" if r == "host-sync" else "") for s, r in zip(syncs, rules, strict=True)
    ]
    cost, boundary = chain_costs(view, syncs, owners)
    return SyncCosts(syncs, owners, cost, boundary)
