"""Host-blocking synchronizations and what they cost.

A host sync (cudaStreamSynchronize, cudaDeviceSynchronize, cudaEventSynchronize, a synchronous or pageable
memcpy, `.item()`) stops the launching thread until the GPU catches up. It costs something only when the compute
stream then runs dry: a starvation window is a gap on the compute stream before an activity that started as soon
as the host launched it. The calls that returned inside such a window delayed that launch; see `chain_costs` for
how the window's idle time is shared among them. Each sync is owned by the first rule below whose call stack
matches.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from overlapcheck.analysis import intervals as iv
from overlapcheck.diagnose.callsite import functions
from overlapcheck.diagnose.context import RankView
from overlapcheck.diagnose.finding import config_value, finding, make_fix, round_size
from overlapcheck.diagnose.registry import INHERENT, INHERENT_MIN_US, SEVERITY_CAP, rank_rule
from overlapcheck.diagnose.sizing import DEFAULT_PREFETCH_BUCKET, parameter_count, reduce_bucket_size
from overlapcheck.trace import classify as C

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


def host_syncs(view: RankView) -> list[Sync]:
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


def _blocking_copies(view: RankView) -> list[int]:
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


def _orphan_sync_events(view: RankView) -> list[Sync]:
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
SEVERITY_CAP["epilogue-sync"] = "info"  # the last bucket is always exposed; reduce-scatter-deferred owns big ones


@dataclass
class Window:
    """A stretch in which the compute stream had nothing to run because the host had not launched its next
    activity yet: [queue end, start of that activity); `launch` is when the host launched it."""

    start: float
    end: float
    launch: float
    boundary: int = -1  # the step before whose first compute kernel it ends (a step boundary), else -1


def starvation_windows(view: RankView) -> list[Window]:
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


def held_windows(view: RankView, windows: list[Window]) -> list[Window]:
    """`windows` plus the compute stalls on an inherent first all-gather that started as soon as the host
    launched it: compute then waited for the host's launch of that gather, which is starvation too (launch: the
    gather's). Such a stall joins the run of windows just before it that only short activities separate (the
    step's input copy and memset), so the calls that delayed all of them count once."""
    from overlapcheck.diagnose.waits import stalls

    st = stalls(view)
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
WAITED_FOR = ("epilogue-sync|",)


def chain_costs(view: RankView, syncs: list[Sync], owners: list[str]) -> tuple[np.ndarray, np.ndarray]:
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
            bound = gpu_idle[n] if owner.startswith(WAITED_FOR) else idle[n] - waited
            saved = min(bound, max(0.0, blocked[mine].sum() - blocked[later].sum()))
            cost[mine] += saved * blocked[mine] / max(blocked[mine].sum(), 1e-9)
            boundary[mine] = windows[n].boundary
    return cost, boundary


def _mark_boundaries(view: RankView, windows: list[Window]) -> None:
    """Set `boundary` on the windows that end between a step's GPU start and its first compute-stream kernel
    (the later step wins where two steps' stretches overlap)."""
    on_stream = np.flatnonzero(view.is_compute & (view.gpu.stream == view.compute_stream))
    first_compute = {step: float(view.gpu.start[rows].min()) for step, rows in view.group_by_step(on_stream).items()}
    order = np.argsort(np.array([w.end for w in windows]), kind="stable")
    ends = np.array([windows[k].end for k in order.tolist()])
    for step in view.rank.get("steps") or []:
        a = int(np.searchsorted(ends, float(step["start_us"]), side="left"))
        b = int(np.searchsorted(ends, first_compute.get(int(step["step"]), -np.inf), side="right"))
        for k in order[a:b].tolist():
            windows[k].boundary = int(step["step"])


def _inside(view: RankView, a: iv.Intervals, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """|A ∩ [lo, hi)| for each window."""
    return view.covered(hi, a) - view.covered(lo, a)


PINNED_OVER_PAGEABLE = 22.0 / 6.0  # PCIe Gen4 device-to-host: ~22 GB/s pinned, ~6 GB/s pageable (staged)


def pinned_copy_tail(view: RankView) -> float:
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


def _per_step(view: RankView, cost: np.ndarray, boundary: np.ndarray, times: np.ndarray) -> tuple[float, list[int]]:
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


@rank_rule
def sync_findings(view: RankView) -> list[dict[str, Any]]:
    """One finding per sync rule (per call site for generic host syncs)."""
    syncs = host_syncs(view)
    rules = [owner_of(s) for s in syncs]
    keys = [f"{s.call} @ {s.site.get('frame')}" if r == "host-sync" else "" for s, r in zip(syncs, rules, strict=True)]
    owners = [f"{r}|{k}" for r, k in zip(rules, keys, strict=True)]
    cost, boundary = chain_costs(view, syncs, owners)
    out = []
    for owner in dict.fromkeys(owners):
        idx = np.array([i for i, o in enumerate(owners) if o == owner])
        per_step, steps = _per_step(view, cost[idx], boundary[idx], np.array([syncs[i].start for i in idx]))
        rule, key = owner.split("|", 1)
        if rule == "offload-blocking-copy":
            per_step = max(0.0, per_step - pinned_copy_tail(view))
        if rule in INHERENT and per_step < INHERENT_MIN_US:
            continue  # DeepSpeed always has these syncs; report them only when they cost something
        out.append(_describe(view, rule, key, [syncs[i] for i in idx], per_step, steps))
    return out


def _describe(view: RankView, rule: str, key: str, syncs: list[Sync], cost: float, steps: list[int]) -> dict[str, Any]:
    calls = sorted({s.call for s in syncs})
    blocked = sum(s.end - s.start for s in syncs)
    evidence = {
        "calls": calls,
        "count": len(syncs),
        "per_step": round(len(syncs) / view.n_steps, 2),
        "host_blocked_us": round(blocked / view.n_steps, 3),
        "first_at_us": round(syncs[0].start, 3),
        "call_site": syncs[0].site.get("frame"),
        "stack": syncs[0].site.get("stack", [])[:8],
    }
    text = TEXT[rule](view, syncs)
    return finding(rule, text[0], text[1], cost, [view.rank_id], steps, evidence, text[2], key=key)


# -- titles, reasons and fixes ------------------------------------------------------------------------------

Text = tuple[str, str, dict[str, Any]]


def _comms_logger(view: RankView, syncs: list[Sync]) -> Text:
    return (
        "The comms logger synchronizes the device after every collective",
        "deepspeed/comm/comm.py timed_op calls get_accelerator().synchronize() after each logged op while "
        "comms_logger is enabled, so no collective can overlap compute",
        make_fix(view.config, {"comms_logger.enabled": False}),
    )


def _throughput_timer(view: RankView, syncs: list[Sync]) -> Text:
    fix = make_fix(view.config, {"timers.throughput.synchronized": False})
    if config_value(view.config, "timers.throughput") is None:
        fix["upgrade"] = "deepspeed>=0.14.3"  # timers.throughput is configurable from v0.14.3 (#5363)
    return (
        "The throughput timer synchronizes the device at the start and end of every step",
        "deepspeed/utils/timer.py ThroughputTimer.start/stop call get_accelerator().synchronize() when "
        "timers.throughput.synchronized is true (always before v0.14.3)",
        fix,
    )


def _offload_copy(view: RankView, syncs: list[Sync]) -> Text:
    return (
        "Gradient offload copies block the host during backward",
        "before DeepSpeed 0.19.5 (#8207) partition_grads copies each gradient partition to CPU with a blocking "
        "copy_, so backward stops launching compute until the copy is done",
        make_fix(view.config, {"zero_optimization.offload_optimizer.pin_memory": True}, upgrade="deepspeed>=0.19.5"),
    )


def _reduce_throttle(view: RankView, syncs: list[Sync]) -> Text:
    bucket, _ = reduce_bucket_size(view)
    params, _ = parameter_count(view)
    target = bucket * 5 if params is None else min(bucket * 5, max(bucket, params // 2))
    return (
        "Backward stalls on the reduce-scatter throttle",
        "stage3.py __reduce_and_partition_ipg_grads blocks on cudaEventSynchronize when more than 2 bucket "
        "reductions are in flight (max_param_reduce_events, not configurable), so the autograd thread stops "
        "launching compute; fewer, larger buckets keep fewer reductions in flight",
        make_fix(view.config, {"zero_optimization.reduce_bucket_size": round_size(target)}),
    )


def _fetch_throttle(view: RankView, syncs: list[Sync]) -> Text:
    current = config_value(view.config, "zero_optimization.stage3_prefetch_bucket_size") or DEFAULT_PREFETCH_BUCKET
    return (
        "Parameter fetches stall on the all-gather throttle",
        "partitioned_param_coordinator.py fetch_sub_module blocks on event.synchronize() when more than 2 "
        "all-gathers are in flight (__max_ongoing_fetch_events); fewer, larger gathers avoid it",
        make_fix(view.config, {"zero_optimization.stage3_prefetch_bucket_size": round_size(int(current) * 2)}),
    )


def _epilogue(view: RankView, syncs: list[Sync]) -> Text:
    return (
        "The backward epilogue waits for the last gradient bucket",
        "stage3.py independent_gradient_partition_epilogue flushes the last bucket and calls "
        "reduce_and_partition_stream.synchronize(): the last reduce-scatter is always exposed; this is the "
        "host overhead of that sync once the GPU is idle",
        {},
    )


GRAD_NORM_SYNC = {"get_grad_norm_direct", "get_global_norm", "_get_norm_groups"}


def _host_sync(view: RankView, syncs: list[Sync]) -> Text:
    site = syncs[0].site.get("frame") or "top-level code (no enclosing op)"
    call = syncs[0].call
    why = (
        f"{call} stops the launching thread until the GPU drains its queue, so compute idles until the next "
        "launch; use events and stream waits instead, or move the sync out of the step"
    )
    fix: dict[str, Any] = {}
    if syncs[0].funcs & GRAD_NORM_SYNC:
        # stage3.py before v0.14.3 reads the global gradient norm on the host (math.sqrt on a tensor, `clip > 1`)
        why = (
            "the ZeRO-3 gradient-norm code reads the norm on the host every step (a device-to-host copy and "
            "stream sync); DeepSpeed 0.14.3 (#5493) and 0.14.5 (#5504, torch.clamp) keep it on the GPU"
        )
        fix = {"upgrade": "deepspeed>=0.14.5"}
    return f"Host-blocking {call} in {site}", why, fix


TEXT: dict[str, Callable[[RankView, list[Sync]], Text]] = {
    "comms-logger-sync": _comms_logger,
    "throughput-timer-sync": _throughput_timer,
    "offload-blocking-copy": _offload_copy,
    "reduce-event-throttle": _reduce_throttle,
    "fetch-throttle": _fetch_throttle,
    "epilogue-sync": _epilogue,
    "host-sync": _host_sync,
}
