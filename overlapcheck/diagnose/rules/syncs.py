"""The sync rules: one finding per owner of host-blocking calls (facts/hostsyncs.py), with its text and fix."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np

from overlapcheck.analysis import intervals as iv
from overlapcheck.diagnose.facts import hostsyncs as H
from overlapcheck.diagnose.facts.coverage import reduction_load
from overlapcheck.diagnose.facts.delays import host_delayed
from overlapcheck.diagnose.facts.hostsyncs import Sync, per_step_cost, pinned_copy_tail, pinned_gather_copies
from overlapcheck.diagnose.facts.sizing import DEFAULT_PREFETCH_BUCKET, parameter_count, reduce_bucket_size
from overlapcheck.diagnose.facts.view import RankFacts
from overlapcheck.diagnose.finding import config_value, finding, make_fix, round_size
from overlapcheck.diagnose.locators import sync_blames
from overlapcheck.diagnose.rule import Rule
from overlapcheck.model import Finding, Fix
from overlapcheck.trace import classify as C


def _owned_by(rule: str, origin: H.Origin, text: TextOf) -> Callable[[RankFacts], list[Finding]]:
    """The function of one sync rule: a finding per owner of its origin (per call site for syncs of no known
    origin) with at least one call that waited for GPU work (facts/hostsyncs.py `awaited_work`)."""

    def find(view: RankFacts) -> list[Finding]:
        sc = view.host_syncs
        out = []
        for _, idx in sc.owned_by(origin):
            times = np.array([sc.syncs[i].start for i in idx])
            stall = sc.stall_cost[idx]
            per_step, steps = per_step_cost(view, sc.cost[idx] - stall, sc.boundary[idx], times)
            if origin is H.OFFLOAD_COPY:
                per_step = max(0.0, per_step - pinned_copy_tail(view))
            elif origin is H.PARAM_OFFLOAD:
                per_step = max(0.0, per_step - pinned_gather_copies(view, [sc.syncs[i] for i in idx.tolist()]))
            stall_per_step, stall_steps = view.per_step(stall, times)
            per_step += stall_per_step
            steps = sorted(set(steps) | set(stall_steps))
            extra: dict[str, Any] = {}
            if origin is H.REDUCE_THROTTLE and (bound := _throttle_bound(view, per_step)) is not None:
                per_step, extra = bound
            out.append(_describe(view, rule, text, idx, per_step, steps, extra))
        return out

    find.__name__ = find.__qualname__ = rule.replace("-", "_")
    return find


def _throttle_bound(view: RankFacts, cost: float) -> tuple[float, dict[str, Any]] | None:
    """When the gradient reductions' transfer outlasts backward compute (`reduction_load` ratio above 1), what
    lifting the reduce throttle can save: backward, run unblocked, still ends no earlier than the reductions'
    transfer lets the step end, so at most backward + `cost` - transfer. The bucket size does not shorten the
    transfer; the bandwidth, the bytes (fp32-communication, bandwidth-bound) do. None below a ratio of 1."""
    load = reduction_load(view)
    if load is None or load.ratio <= 1:
        return None
    bound = round(min(cost, max(0.0, load.backward_us + cost - load.transfer_us)), 3)
    return bound, {
        "reduction_transfer_us_per_step": load.transfer_us,
        "backward_compute_us_per_step": load.backward_us,
        "cost_before_transfer_bound_us": round(cost, 3),
    }


def _describe(
    view: RankFacts,
    rule: str,
    text_of: TextOf,
    idx: np.ndarray,
    cost: float,
    steps: list[int],
    extra: dict[str, Any] | None = None,
) -> Finding:
    sc = view.host_syncs
    syncs = [sc.syncs[i] for i in idx.tolist()]
    waited = [s for s in syncs if s.waited]
    calls = sorted({s.call for s in syncs})
    evidence = {
        "calls": calls,
        "count": len(syncs),
        "per_step": round(len(syncs) / view.n_steps, 2),
        "waited_calls": len(waited),
        "host_blocked_us": round(sum(s.blocked for s in waited) / view.n_steps, 3),
        "awaited": _awaited(view, waited),
        "first_at_us": round(syncs[0].start, 3),
        "call_site": syncs[0].site.get("frame"),
        "stack": _longest(waited or syncs).site.get("stack", [])[:8],
    }
    if waited:
        # where the host blocked longest: the stack to fix first, with how many calls there are at that stack
        longest = _longest(waited)
        stack = longest.site.get("stack", [])
        evidence["longest_call"] = {
            "blocked_us": round(longest.blocked, 3),
            "calls_at_its_stack_per_step": round(
                sum(s.site.get("stack", []) == stack for s in waited) / view.n_steps, 2
            ),
            "blocked_us_at_its_stack_per_step": round(
                sum(s.blocked for s in waited if s.site.get("stack", []) == stack) / view.n_steps, 3
            ),
        }
    delayed = _delayed(view, idx)
    if delayed:
        evidence["delayed_collectives"] = delayed
    d = host_delayed(view)
    later = d.window_cost[np.isin(d.window_sync, idx)]
    if len(later):
        # the compute stream ran dry later on, waiting for launches the block had pushed back
        evidence["later_starvation"] = {
            "windows_per_step": round(len(later) / view.n_steps, 2),
            "idle_us_per_step": round(float(later.sum()) / view.n_steps, 3),
        }
    covers = iv.union(
        np.array([w[0] for i in idx.tolist() for w in sc.windows[i]], dtype=np.float64),
        np.array([w[1] for i in idx.tolist() for w in sc.windows[i]], dtype=np.float64),
    )
    evidence.update(extra or {})
    text = text_of(view, syncs)
    return finding(rule, text[0], text[1], cost, [view.rank_id], steps, evidence, text[2], covers=covers)


def _longest(syncs: list[Sync]) -> Sync:
    """The call that blocked the host longest (the first of equals)."""
    return max(syncs, key=lambda s: s.blocked)


def _kind(view: RankFacts, row: int) -> str:
    g = view.gpu
    if g.cls[row] == C.COMM:
        return str(C.COLLECTIVES[g.coll[row]])
    return {C.COMPUTE: "compute", C.MEMCPY: "memcpy", C.MEMSET: "memset"}.get(int(g.cls[row]), "other")


def _awaited(view: RankFacts, syncs: list[Sync]) -> dict[str, int]:
    """What each call waited for, by kind: of the GPU work that ended inside it (facts/hostsyncs.py
    `awaited_work`), the collective that ended last, else the activity that ended last; e.g.
    {"reduce_scatter": 12} for a throttle that waits for its buckets' reductions."""
    end, comm = view.gpu.end, view.is_comm
    kinds = Counter(
        _kind(view, max([r for r in s.awaited if comm[r]] or s.awaited, key=lambda r: end[r]))
        for s in syncs
        if s.awaited
    )
    return dict(sorted(kinds.items(), key=lambda kv: (-kv[1], kv[0])))


def _delayed(view: RankFacts, idx: np.ndarray) -> dict[str, dict[str, float]]:
    """The collectives these calls issued late, compute then stalling on them (facts/delays.py), by kind: how
    many per step and the stall time per step they explain."""
    d = host_delayed(view)
    st = view.stalls
    mine = np.flatnonzero(np.isin(d.sync, idx) & (d.sync >= 0))
    out: dict[str, dict[str, float]] = {}
    for kind in sorted({_kind(view, int(c)) for c in st.comm[mine].tolist()}):
        sel = mine[[_kind(view, int(c)) == kind for c in st.comm[mine].tolist()]]
        out[kind] = {
            "per_step": round(len(sel) / view.n_steps, 2),
            "stall_us_per_step": round(float(d.explained[sel].sum()) / view.n_steps, 3),
        }
    return out


# -- titles, reasons and fixes ------------------------------------------------------------------------------

Text = tuple[str, str, Fix]
TextOf = Callable[[RankFacts, list[Sync]], Text]


def _comms_logger(view: RankFacts, syncs: list[Sync]) -> Text:
    return (
        "The comms logger synchronizes the device after every collective",
        "deepspeed/comm/comm.py timed_op calls get_accelerator().synchronize() after each logged op while "
        "comms_logger is enabled, so no collective can overlap compute",
        make_fix(view.config, {"comms_logger.enabled": False}),
    )


def _throughput_timer(view: RankFacts, syncs: list[Sync]) -> Text:
    # timers.throughput is configurable from v0.14.3 (#5363)
    upgrade = "deepspeed>=0.14.3" if config_value(view.config, "timers.throughput") is None else None
    fix = make_fix(view.config, {"timers.throughput.synchronized": False}, upgrade=upgrade)
    return (
        "The throughput timer synchronizes the device at the start and end of every step",
        "deepspeed/utils/timer.py ThroughputTimer.start/stop call get_accelerator().synchronize() when "
        "timers.throughput.synchronized is true (always before v0.14.3)",
        fix,
    )


def _offload_copy(view: RankFacts, syncs: list[Sync]) -> Text:
    return (
        "Gradient offload copies block the host during backward",
        "before DeepSpeed 0.19.5 (#8207) partition_grads copies each gradient partition to CPU with a blocking "
        "copy_, so backward stops launching compute until the copy is done",
        make_fix(view.config, {"zero_optimization.offload_optimizer.pin_memory": True}, upgrade="deepspeed>=0.19.5"),
    )


def _param_offload(view: RankFacts, syncs: list[Sync]) -> Text:
    """zero_optimization.offload_param keeps each rank's parameter shards on the host (stage3.py, Init's
    `remote_device`); partition_parameters.py all_gather_coalesced (_all_gather_dtype) copies every shard to the
    GPU with `p.ds_tensor.to(device)` before the gather, a non_blocking=False copy_: from pageable memory (no
    `pin_memory`) the call returns only once its stream's queue and the staged copy are done, so the fetching
    thread stops launching compute at every gather. Pinned shards copy ~3.7x faster (PCIe, pinned vs staged);
    fewer offloaded parameters, or none, remove the copies."""
    zero = "zero_optimization"
    settings: dict[str, object] = {}
    pageable = [s for s in syncs if "Pageable" in s.copy]
    pinned_in_config = config_value(view.config, f"{zero}.offload_param.pin_memory") is True
    if pageable or not pinned_in_config:
        settings[f"{zero}.offload_param.pin_memory"] = True
    device = config_value(view.config, f"{zero}.offload_param.device")
    why = (
        "partition_parameters.py all_gather_coalesced copies each offloaded parameter shard to the GPU "
        f"(`ds_tensor.to(device)`){' from pageable host memory' if pageable else ''} before its all-gather, and "
        "the copy blocks the fetching thread until it is done, so compute waits for the launches behind it; "
        "pin_memory makes the copies faster, fewer offloaded parameters (a larger "
        "stage3_param_persistence_threshold keeps small ones on the GPU, a smaller stage3_max_live_parameters "
        "fewer gathered at once) or no offload_param where GPU memory allows removes them"
    )
    if isinstance(device, str):
        why += f" (offload_param.device {device})"
    return (
        "Offloaded parameters are copied to the GPU with a blocking copy before each all-gather",
        why,
        make_fix(view.config, settings),
    )


def _reduce_throttle(view: RankFacts, syncs: list[Sync]) -> Text:
    load = reduction_load(view)
    if load is not None and load.ratio > 1:
        return (
            "Backward stalls on the reduce-scatter throttle: the reductions cannot keep up at this bandwidth",
            "stage3.py __reduce_and_partition_ipg_grads blocks on cudaEventSynchronize when more than 2 bucket "
            f"reductions are in flight; here their transfer ({load.transfer_us / 1000:.1f} ms per step at the best "
            f"rate measured) outlasts backward's compute ({load.backward_us / 1000:.1f} ms), so the step ends when "
            "they do, throttled or not: larger buckets do not shorten them, fewer bytes or more bandwidth do "
            "(communication_data_type in the training dtype, zero_quantized_gradients)",
            Fix(),
        )
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


def _fetch_throttle(view: RankFacts, syncs: list[Sync]) -> Text:
    current = config_value(view.config, "zero_optimization.stage3_prefetch_bucket_size") or DEFAULT_PREFETCH_BUCKET
    return (
        "Parameter fetches stall on the all-gather throttle",
        "partitioned_param_coordinator.py fetch_sub_module blocks on event.synchronize() when more than 2 "
        "all-gathers are in flight (__max_ongoing_fetch_events); fewer, larger gathers avoid it",
        make_fix(view.config, {"zero_optimization.stage3_prefetch_bucket_size": round_size(int(current) * 2)}),
    )


def _epilogue(view: RankFacts, syncs: list[Sync]) -> Text:
    return (
        "The backward epilogue waits for the last gradient bucket",
        "stage3.py independent_gradient_partition_epilogue flushes the last bucket and calls "
        "reduce_and_partition_stream.synchronize(): the last reduce-scatter is always exposed; this is the "
        "host overhead of that sync once the GPU is idle",
        Fix(),
    )


GRAD_NORM_SYNC = {"get_grad_norm_direct", "get_global_norm", "_get_norm_groups"}


def _host_sync(view: RankFacts, syncs: list[Sync]) -> Text:
    site = syncs[0].site.get("frame") or "top-level code (no enclosing op)"
    call = syncs[0].call
    why = (
        f"{call} stops the launching thread until the GPU drains its queue, so compute idles until the next "
        "launch; use events and stream waits instead, or move the sync out of the step"
    )
    fix = Fix()
    if syncs[0].funcs & GRAD_NORM_SYNC:
        # stage3.py before v0.14.3 reads the global gradient norm on the host (math.sqrt on a tensor, `clip > 1`)
        why = (
            "the ZeRO-3 gradient-norm code reads the norm on the host every step (a device-to-host copy and "
            "stream sync); DeepSpeed 0.14.3 (#5493) and 0.14.5 (#5504, torch.clamp) keep it on the GPU"
        )
        fix = Fix(upgrade="deepspeed>=0.14.5")
    return f"Host-blocking {call} in {site}", why, fix


def sync_rule(
    rule: str,
    origin: H.Origin,
    text: TextOf,
    *,
    inherent: bool = False,
    severity_cap: str | None = None,
    distinct_by: tuple[str, ...] = (),
) -> Rule:
    """The rule that reports the host syncs of one origin, with its text and fix (`text`)."""
    return Rule(
        rule,
        _owned_by(rule, origin, text),
        owns=origin,
        blame=sync_blames,
        inherent=inherent,
        severity_cap=severity_cap,
        distinct_by=distinct_by,
    )


COMMS_LOGGER = sync_rule("comms-logger-sync", H.COMMS_LOGGER, _comms_logger)
THROUGHPUT_TIMER = sync_rule("throughput-timer-sync", H.THROUGHPUT_TIMER, _throughput_timer)
OFFLOAD_COPY = sync_rule("offload-blocking-copy", H.OFFLOAD_COPY, _offload_copy)
PARAM_OFFLOAD = sync_rule("offload-param-copy", H.PARAM_OFFLOAD, _param_offload)
REDUCE_THROTTLE = sync_rule("reduce-event-throttle", H.REDUCE_THROTTLE, _reduce_throttle, inherent=True)
FETCH_THROTTLE = sync_rule("fetch-throttle", H.FETCH_THROTTLE, _fetch_throttle, inherent=True)
# the last bucket is always exposed; reduce-scatter-deferred owns big ones
EPILOGUE = sync_rule("epilogue-sync", H.EPILOGUE, _epilogue, severity_cap="info", inherent=True)
HOST_SYNC = sync_rule("host-sync", H.OTHER, _host_sync, distinct_by=("calls", "call_site"))
