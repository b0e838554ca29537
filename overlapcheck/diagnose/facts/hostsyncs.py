"""Host-blocking synchronizations and what each one cost.

A host sync (cudaStreamSynchronize, cudaDeviceSynchronize, cudaEventSynchronize, a synchronous or pageable
memcpy, `.item()`) stops the launching thread until the GPU catches up. A call counts only when the trace shows
it waited (`awaited_work`: GPU work it had issued before ended inside it); the profiler's own syncs and those
outside the profiled steps are left out. It costs something only when the compute stream then runs dry, or
when the collective its thread issued next came late and compute stalled on it (facts/delays.py). A starvation
window is a gap on the compute stream before an activity that started as soon as the host launched it. The
calls that returned inside such a window delayed that launch; see `chain_costs` for how the window's idle time is
shared among them. Each sync has the first origin of ORIGINS whose call
stack matches; the sync rule that owns that origin (rules/syncs.py) reports it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
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
MIN_BLOCKING_COPY_US = 20.0  # a pageable host-to-device copy call shorter than this is launch overhead
STARVED_LAUNCH_US = 30.0  # an activity that starts this soon after its launch call was waiting for the host
WAIT_TOLERANCE_US = 5.0  # CPU vs GPU clocks: GPU work ending this soon after a call returned was waited for
# torch.profiler synchronizes the device when it starts and stops (profile.__exit__ / stop_trace)
PROFILER_FRAMES = ("torch/profiler/profiler.py", "torch/autograd/profiler.py")


@dataclass
class Sync:
    """One blocking call candidate: a sync call, a copy call, or a cuda_sync event without its runtime call.
    `awaited`: the GPU rows it waited for (`awaited_work`); empty when it returned without waiting for the GPU
    (its time is host overhead: not a finding, not charged)."""

    start: float
    end: float
    thread: int
    call: str
    site: dict[str, Any]
    funcs: set[str]
    awaited: list[int] = field(default_factory=list)
    copy: str = ""  # the name of the GPU copy a copy call issued (`Memcpy HtoD (Pageable -> Device)`), else ""

    @property
    def waited(self) -> bool:
        return bool(self.awaited)

    @property
    def blocked(self) -> float:
        return self.end - self.start


def awaited_work(
    view: RankFacts,
    start: float,
    end: float,
    stream: int = -1,
    copy: int = -1,
    waits_queue: bool = True,
    asynchronous: bool = False,
) -> list[int]:
    """The GPU work a host call waited for: what makes it host-blocking. A call blocks only when it returned
    after GPU work it waited for had ended (within WAIT_TOLERANCE_US of the CPU/GPU clocks):

    - `waits_queue` (cudaStreamSynchronize, cudaDeviceSynchronize, cudaEventSynchronize, cudaMemcpy, cuda_sync
      events): GPU activities that were already issued (running or queued) when the call began and ended inside
      it, [start, end + tolerance]; on `stream` when the trace says which stream was synced (the Stream Sync
      event of the call, the stream of a synchronous copy), else on any stream. None: it returned without
      waiting (the work it waited for had finished: host overhead only).
    - `copy` (the GPU row of the call's own copy, >= 0): the copy when it started before the call returned and
      ended by the time it returned (tolerance included), and its memory can block the host at all (CUDA's "API
      synchronization behavior": a copy between device memories never synchronizes the host, nor does an
      asynchronous copy to or from pinned memory, whatever the timestamps say; a copy from or to pageable
      memory does). A cudaMemcpyAsync that returns before its copy starts or ends did not block the host. One
      exception: from pageable memory to the device the driver stages the data through pinned buffers and
      returns once the last chunk is staged, so a call that ran beside most of its copy (at least half, and at
      least MIN_BLOCKING_COPY_US) fed the DMA chunk by chunk: it waited for it, though the last chunk lands
      after it returns. A pageable copy also waits for the work queued on its stream before it (the stream
      sync the driver does first), which the caller passes as `waits_queue` on the copy's stream;
      `asynchronous`: the call is cudaMemcpyAsync (not cudaMemcpy).

    Returns the awaited GPU rows (empty: not host-blocking)."""
    g = view.gpu
    out: list[int] = []
    if copy >= 0 and _copy_can_block(view, copy, asynchronous):
        c_start, c_end = float(g.start[copy]), float(g.end[copy])
        if c_start < end and c_end <= end + WAIT_TOLERANCE_US:
            out.append(copy)
        elif c_start < end and end - start >= MIN_BLOCKING_COPY_US and _pageable_to_device(view, copy):
            inside = min(end, c_end) - max(start, c_start)
            if inside >= 0.5 * (c_end - c_start):
                out.append(copy)
    if waits_queue:
        by_end, ends = _rows_by_end(view)
        a = int(np.searchsorted(ends, start, side="left"))
        b = int(np.searchsorted(ends, end + WAIT_TOLERANCE_US, side="right"))
        rows = by_end[a:b]
        rows = rows[(view.launch[rows] < start) & (g.start[rows] < end)]
        if stream >= 0:
            rows = rows[g.stream[rows] == stream]
        out += [r for r in rows.tolist() if r != copy]
    return out


def _rows_by_end(view: RankFacts) -> tuple[np.ndarray, np.ndarray]:
    """GPU rows sorted by end, and their ends (once per rank: `awaited_work` runs once per call)."""

    def sort(v: RankFacts) -> tuple[np.ndarray, np.ndarray]:
        order = np.argsort(v.gpu.end, kind="stable")
        return order, v.gpu.end[order]

    return view.memo("rows_by_end", sort)


def _copy_can_block(view: RankFacts, row: int, asynchronous: bool) -> bool:
    """Whether a copy can hold the host at all, by the memory it moves (the GPU activity's name, e.g.
    `Memcpy DtoH (Device -> Pageable)`): never between device memories, nor asynchronously with pinned memory."""
    name = view.names[view.gpu.name[row]]
    if "DtoD" in name or "PtoP" in name or "Device -> Device" in name:
        return False
    return not (asynchronous and "Pinned" in name)


def _pageable(view: RankFacts, row: int) -> bool:
    return "Pageable" in view.names[view.gpu.name[row]]


def _pageable_to_device(view: RankFacts, row: int) -> bool:
    name = view.names[view.gpu.name[row]]
    return "HtoD" in name and "Pageable" in name


def host_sync_list(view: RankFacts) -> list[Sync]:
    """`host_syncs(view)`, computed once per rank (`RankFacts.memo`): the cost model (`sync_costs`) and the delays
    fact (facts/delays.py) index the same list."""
    return view.memo("host_sync_list", host_syncs)


def host_syncs(view: RankFacts) -> list[Sync]:
    """Every candidate blocking call of the rank inside the profiled steps (all of them when the trace has no
    steps), with its call site and the GPU work it waited for (`awaited_work`; only those with some are
    host-blocking). The profiler's own syncs are left out (`_profiler_sync`)."""
    rt, g = view.model.runtime, view.gpu
    sync_idx = view.runtime_named(*SYNC_CALLS)
    copy_idx = view.runtime_named(*MEMCPY_CALLS)
    copy_of = _copy_rows(view, np.concatenate([sync_idx, copy_idx]))
    synced = _synced_streams(view)
    idx = np.array(sorted({*sync_idx.tolist(), *copy_idx.tolist()}, key=rt.start.tolist().__getitem__), dtype=np.int64)
    if len(idx):
        idx = idx[view.in_steps(rt.start[idx])]
    is_sync = set(sync_idx.tolist())
    sites = view.callsites
    out = []
    for i, start, end, thread, name, corr in zip(
        idx.tolist(),
        rt.start[idx].tolist(),
        rt.end[idx].tolist(),
        rt.thread[idx].tolist(),
        rt.name[idx].tolist(),
        rt.correlation[idx].tolist(),
        strict=True,
    ):
        mid = 0.5 * (start + end)
        stack = sites.stack(thread, mid) if sites.has_stacks else []
        if _profiler_sync(view, thread, mid, end, stack):
            continue
        copy = copy_of.get(i, -1)
        stream = int(g.stream[copy]) if copy >= 0 else synced.get(corr, -1)
        queue = i in is_sync or (copy >= 0 and _pageable(view, copy))  # pageable copies sync their stream first
        awaited = awaited_work(view, start, end, stream, copy, queue, asynchronous=i not in is_sync)
        copied = view.names[g.name[copy]] if copy >= 0 else ""
        out.append(
            Sync(start, end, thread, view.names[name], sites.site(thread, mid), functions(stack), awaited, copied)
        )
    out += _orphan_sync_events(view)
    return out


def _copy_rows(view: RankFacts, idx: np.ndarray) -> dict[int, int]:
    """Runtime row -> the GPU copy it issued (same correlation), for the rows of `idx` that issued one."""
    rt, g = view.model.runtime, view.gpu
    copies = np.flatnonzero(g.cls == C.MEMCPY)
    if not len(idx) or not len(copies):
        return {}
    order = copies[np.argsort(g.correlation[copies], kind="stable")]
    pos = np.clip(np.searchsorted(g.correlation[order], rt.correlation[idx]), 0, len(order) - 1)
    hit = (g.correlation[order[pos]] == rt.correlation[idx]) & (rt.correlation[idx] >= 0)
    return dict(zip(idx[hit].tolist(), order[pos][hit].tolist(), strict=True))


def _synced_streams(view: RankFacts) -> dict[int, int]:
    """Correlation -> the stream a Stream Sync event (enable_cuda_sync_events) says its call synchronized."""
    s = view.model.syncs
    if not len(s):
        return {}
    rows = np.flatnonzero(view.name_mask(s.name, lambda n: n == "Stream Sync") & (s.stream >= 0))
    return dict(zip(s.correlation[rows].tolist(), s.stream[rows].tolist(), strict=True))


def _profiler_sync(view: RankFacts, thread: int, t: float, end: float, stack: list[str]) -> bool:
    """torch.profiler's own device syncs (when it starts or stops: profile.__exit__ synchronizes): a frame of
    the profiler on the call's stack, or, without stacks, no enclosing op on its thread and no GPU work issued
    after it returned (the stop sync is the trace's last call; such a sync can delay nothing in the trace)."""
    if any(p in f for f in stack for p in PROFILER_FRAMES):
        return True
    if stack or (thread >= 0 and view.callsites.stack(thread, t, python=False)):
        return False
    return not (len(view.launch) and end < float(view.launch.max()))


def _orphan_sync_events(view: RankFacts) -> list[Sync]:
    """cuda_sync events whose runtime call is not in the trace (an Event Sync from cudaEventQuery is not one)."""
    s = view.model.syncs
    if not len(s):
        return []
    orphan = view.name_mask(s.name, lambda n: n in BLOCKING_SYNC_KINDS)
    orphan &= ~np.isin(s.correlation, view.model.runtime.correlation)
    rows = np.flatnonzero(orphan)
    rows = rows[view.in_steps(s.start[rows])]
    out = []
    for start, end, name, stream in zip(
        s.start[rows].tolist(), s.end[rows].tolist(), s.name[rows].tolist(), s.stream[rows].tolist(), strict=True
    ):
        kind = view.names[name]
        if _profiler_sync(view, -1, 0.5 * (start + end), end, []):
            continue
        awaited = awaited_work(view, start, end, stream if kind == "Stream Sync" else -1)
        out.append(Sync(start, end, -1, kind, {"frame": None, "stack": []}, set(), awaited))
    return out


# -- which rule owns a sync ----------------------------------------------------------------------------------


def _in(*names: str) -> Callable[[Sync], bool]:
    return lambda s: any(n in s.funcs for n in names)


def _is_comms_logger(s: Sync) -> bool:
    return "comm.py:log_wrapper" in s.funcs or "comm.py:timed_op" in s.funcs


def _is_throughput_timer(s: Sync) -> bool:
    return "timer.py:start" in s.funcs or "timer.py:stop" in s.funcs


def _is_offload_copy(s: Sync) -> bool:
    return "partition_grads" in s.funcs and ("Memcpy" in s.call or s.call == "cudaStreamSynchronize")


# partition_parameters.py (v0.13.3 .. 0.19.x): the functions that copy an offloaded shard to the GPU before
# gathering it (`p.ds_tensor.to(device)` in _all_gather_dtype / _all_gather_sequential, `_allgather_params*`)
PARAM_GATHER_FUNCS = (
    "all_gather_coalesced",
    "_all_gather_dtype",
    "_all_gather_sequential",
    "_allgather_params",
    "_allgather_params_coalesced",
    "_allgather_params_sequential",
)


def _is_param_offload_copy(s: Sync) -> bool:
    """A host-to-device copy of an offloaded parameter shard, or torch's stream sync after it (`.to(device)` is
    `non_blocking=False`), inside DeepSpeed's all-gather of parameters; a user's `batch.to(device)` is not."""
    if not any(f in s.funcs for f in PARAM_GATHER_FUNCS):
        return False
    return "HtoD" in s.copy or s.call == "cudaStreamSynchronize"


def _is_reduce_throttle(s: Sync) -> bool:
    return s.call == "cudaEventSynchronize" and "__reduce_and_partition_ipg_grads" in s.funcs


def _is_fetch_throttle(s: Sync) -> bool:
    return s.call == "cudaEventSynchronize" and ("fetch_sub_module" in s.funcs or "_fetch_sub_module_impl" in s.funcs)


@dataclass(frozen=True)
class Origin:
    """Where a host sync comes from: the DeepSpeed (or other) code that issued it, told by its call stack. A sync
    rule owns one origin (`Rule.owns`); facts group the syncs' costs by origin."""

    name: str
    match: Callable[[Sync], bool]
    waited_for: bool = False  # the next compute needs the work it awaits anyway: only GPU-idle time is its


COMMS_LOGGER = Origin("comms-logger", _is_comms_logger)
THROUGHPUT_TIMER = Origin("throughput-timer", _is_throughput_timer)
OFFLOAD_COPY = Origin("offload-copy", _is_offload_copy)
PARAM_OFFLOAD = Origin("param-offload-copy", _is_param_offload_copy)
REDUCE_THROTTLE = Origin("reduce-throttle", _is_reduce_throttle)
FETCH_THROTTLE = Origin("gather-throttle", _is_fetch_throttle)
# the optimizer needs the reduced gradients the epilogue waits for
EPILOGUE = Origin("epilogue", _in("independent_gradient_partition_epilogue"), waited_for=True)
OTHER = Origin("other", lambda s: True)
ORIGINS: tuple[Origin, ...] = (
    COMMS_LOGGER,
    THROUGHPUT_TIMER,
    OFFLOAD_COPY,
    PARAM_OFFLOAD,
    REDUCE_THROTTLE,
    FETCH_THROTTLE,
    EPILOGUE,
    OTHER,
)


@dataclass
class Window:
    """A stretch in which the compute stream had nothing to run because the host had not launched its next
    activity yet: [queue end, start of that activity); `launch` is when the host launched it."""

    start: float
    end: float
    launch: float
    boundary: int = -1  # the step before whose first compute kernel it ends (a step boundary), else -1
    row: int = -1  # the GPU row of that activity (-1: a held first all-gather's stall)


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
    return [
        Window(float(queued_end[r]), float(start[r + 1]), float(launch[r + 1]), row=int(on_s[r + 1]))
        for r in rows.tolist()
    ]


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
    on_s_start = g.start[on_s]
    out = sorted(windows, key=lambda w: w.start)
    for kernel, hi, comm in zip(st.kernel.tolist(), st.end.tolist(), st.comm.tolist(), strict=True):
        if comm not in first or g.start[comm] - view.launch[comm] > STARVED_LAUNCH_US:
            continue
        i = int(np.searchsorted(on_s_start, g.start[kernel], side="left"))
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
WAITED_FOR = tuple(o.name for o in ORIGINS if o.waited_for)

Owner = tuple[str, str]  # (origin name, call site for syncs of no known origin else "")


def chain_costs(
    view: RankFacts, syncs: list[Sync], owners: list[Owner]
) -> tuple[np.ndarray, np.ndarray, list[list[tuple[float, float]]]]:
    """Cost of each sync. A window's blocking calls are those that returned after the queue ran dry and before
    the launch that ended it. Removing one owner's calls lets the host launch earlier by their blocked time,
    minus what the other owners' later calls would then wait longer (they wait for the same GPU work); the
    window's compute idle bounds the gain. Each owner's share goes to its calls in proportion to blocked time.
    Also returns, per call, the step whose boundary window it delayed (-1: inside a step) and where the idle
    it is charged for lies: each window it was charged on (the epilogue: the last `saved` µs of it)."""
    cost = np.zeros(len(syncs))
    boundary = np.full(len(syncs), -1)
    charged: list[list[tuple[float, float]]] = [[] for _ in syncs]
    if not syncs:
        return cost, boundary, charged
    ends = np.array([s.end for s in syncs])
    blocked = np.array([s.end - s.start for s in syncs])
    windows = held_windows(view, starvation_windows(view))
    if not windows:
        return cost, boundary, charged
    _mark_boundaries(view, windows)
    lo = np.array([w.start for w in windows])
    hi = np.array([w.end for w in windows])
    launch = np.array([w.launch for w in windows])
    first = view.first_gathers
    idle = window_idle(view, lo, hi)
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
            if saved > 0:
                # the compute idled there because these calls held the host: the whole window is what they
                # explain (what a fix recovers is `saved`); the epilogue's window is the last bucket's inherent
                # wait, of which only its own overhead, the last `saved` µs, is its
                first_us = float(hi[n]) - saved if owner[0] in WAITED_FOR else float(lo[n])
                for m in mine.tolist():
                    charged[m].append((max(float(lo[n]), first_us), float(hi[n])))
    return cost, boundary, charged


def window_idle(view: RankFacts, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """The idle a launch could win back in each window [lo, hi) (sorted): compute idle, less the part of the
    all-gathers (but each step's first) longer than the compute that could hide them (compute needs its
    parameters); compute that ran since the previous window is what a prefetch could hide behind."""
    first = view.first_gathers
    inherent = iv.union(view.gpu.start[first], view.gpu.end[first])
    later_gathers = iv.subtract(view.all_gathers, inherent)
    idle = view.idle(lo, hi, view.compute_stream_busy)
    before = view.covered(lo, view.compute) - view.covered(np.concatenate([[-np.inf], hi[:-1]]), view.compute)
    return idle - np.maximum(0.0, _inside(view, later_gathers, lo, hi) - before)


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


def pinned_gather_copies(view: RankFacts, syncs: list[Sync]) -> float:
    """Per step: what the parameter-offload copies these calls waited for (pageable host-to-device copies) would
    still take from pinned memory: their duration over the pinned/pageable bandwidth ratio, measured on this
    trace's pinned host-to-device copies of at least half their median size when it has any (small copies are
    latency, not bandwidth), else PINNED_OVER_PAGEABLE. An upper bound of what stays once pinned: asynchronous,
    the pinned copies overlap the gathers and compute before them."""
    g = view.gpu
    rows = sorted({r for s in syncs for r in s.awaited if g.cls[r] == C.MEMCPY and _pageable_to_device(view, r)})
    if not rows:
        return 0.0
    copies = np.array(rows, dtype=np.int64)
    dur = g.end - g.start
    ratio = PINNED_OVER_PAGEABLE
    if (g.nbytes[copies] > 0).all():
        floor = 0.5 * float(np.median(g.nbytes[copies]))
        pinned = np.flatnonzero(
            (g.cls == C.MEMCPY)
            & view.name_mask(g.name, lambda n: "HtoD" in n and "Pinned" in n)
            & (g.nbytes >= max(floor, 1.0))
        )
        if len(pinned) and dur[pinned].sum() > 0:
            measured = (g.nbytes[pinned].sum() / dur[pinned].sum()) / (g.nbytes[copies].sum() / dur[copies].sum())
            ratio = max(1.0, float(measured))
    return float(dur[copies].sum()) / ratio / view.n_steps


def origin_of(s: Sync) -> str:
    """The name of the first origin whose stack matches the sync (OTHER matches every sync)."""
    return next(o.name for o in ORIGINS if o.match(s))


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
class WindowCosts:
    """The starvation-window part of the sync costs (`chain_costs` over the calls that waited for GPU work),
    per call of `host_sync_list`."""

    owners: list[Owner]
    cost: np.ndarray
    boundary: np.ndarray
    windows: list[list[tuple[float, float]]]


def window_costs(view: RankFacts) -> WindowCosts:
    """`WindowCosts` of the rank, computed once (`RankFacts.memo`): the delays fact caps what it charges a call by
    its blocked time less this."""
    return view.memo("window_costs", _window_costs)


def _window_costs(view: RankFacts) -> WindowCosts:
    syncs = host_sync_list(view)
    origins = [origin_of(s) for s in syncs]
    owners = [
        (r, f"{s.call} @ {s.site.get('frame')}" if r == OTHER.name else "") for s, r in zip(syncs, origins, strict=True)
    ]
    live = [i for i, s in enumerate(syncs) if s.waited]
    cost = np.zeros(len(syncs))
    boundary = np.full(len(syncs), -1)
    windows: list[list[tuple[float, float]]] = [[] for _ in syncs]
    c, b, w = chain_costs(view, [syncs[i] for i in live], [owners[i] for i in live])
    for k, i in enumerate(live):
        cost[i], boundary[i], windows[i] = c[k], b[k], w[k]
    return WindowCosts(owners, cost, boundary, windows)
