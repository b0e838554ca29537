"""Cross-stream waits and all-gathers that were not prefetched: the compute stream's stalls (facts/stalls.py)
shared out by the collective they waited for."""

from __future__ import annotations

from typing import Any

import numpy as np

from overlapcheck.analysis import intervals as iv
from overlapcheck.diagnose.facts.callsite import functions, is_user
from overlapcheck.diagnose.facts.concurrency import (
    comm_wait_blockers,
    comm_wait_claims,
    default_stream_claims,
    hardware_serialized,
)
from overlapcheck.diagnose.facts.delays import host_delayed
from overlapcheck.diagnose.facts.hoststarved import host_starved
from overlapcheck.diagnose.facts.hostsyncs import STARVED_LAUNCH_US, host_sync_list
from overlapcheck.diagnose.facts.sizing import AG, DEFAULT_PREFETCH_BUCKET
from overlapcheck.diagnose.facts.stalls import (
    STALL_MIN_US,
    Stalls,
    job_first_step,
    not_prefetched,
    on_demand,
    per_step_pattern,
    rest,
)
from overlapcheck.diagnose.facts.view import RankFacts
from overlapcheck.diagnose.facts.waitsites import calls_per_site, stall_waits, stalls_at
from overlapcheck.diagnose.finding import config_value, finding, make_fix, round_size, sci
from overlapcheck.diagnose.locators import Located, exposed_blames
from overlapcheck.diagnose.rule import Rule
from overlapcheck.model import Blame, Finding, Fix
from overlapcheck.trace import classify as C

DEFAULT_MAX_LIVE = 1_000_000_000  # stage3_max_live_parameters default (v0.6 .. 0.19.x)
MAX_PREFETCH_GROWTH = 8.0  # the most a computed stage3_prefetch_bucket_size multiplies the current one by


def allgather_not_prefetched(view: RankFacts) -> list[Finding]:
    """partitioned_param_coordinator.py (v0.6 .. 0.19.x) fetch_sub_module prefetches the next modules'
    parameters only when the parameter trace is complete (is_complete_trace) and stage3_prefetch_bucket_size > 0;
    otherwise each all-gather is issued when its module runs and `current_stream().wait_stream(__allgather_stream)`
    makes compute wait for the whole transfer."""
    if hardware_serialized(view):
        return []
    st = view.stalls
    mask, all_costs = not_prefetched_costs(view)
    if not mask.any():
        return []
    saved = np.maximum(0.0, all_costs - on_demand_remainder(view))
    costs = within_host_lead(view, np.where(mask, saved, 0.0))[mask]
    per_step = mask.sum() / view.n_steps
    cost, steps = view.per_step(costs, view.launch[st.kernel[mask]])
    if round(cost, 3) <= 0:  # as the finding reports it
        return []  # prefetched, the gathers would be waited for as long: allgather-transfer-bound's
    prefetch = config_value(view.config, "zero_optimization.stage3_prefetch_bucket_size")
    live = config_value(view.config, "zero_optimization.stage3_max_live_parameters")
    if prefetch is not None and prefetch <= 0:
        why = "stage3_prefetch_bucket_size is 0, so no all-gather is issued before its module needs it"
        fix = make_fix(view.config, {"zero_optimization.stage3_prefetch_bucket_size": DEFAULT_PREFETCH_BUCKET})
    elif live is not None and live < (prefetch if prefetch is not None else DEFAULT_PREFETCH_BUCKET):
        # fetch_sub_module prefetches min(max_live_parameters - available, prefetch_bucket_size) elements
        bucket = prefetch if prefetch is not None else DEFAULT_PREFETCH_BUCKET
        why = (
            f"stage3_max_live_parameters ({sci(live)}) is below stage3_prefetch_bucket_size ({sci(bucket)}): "
            "DeepSpeed prefetches only as many parameters as fit under max_live_parameters beside those already "
            "gathered, so with the current module's parameters live there is no room to fetch the next one early "
            "(raising it costs GPU memory: up to that many parameters gathered at once)"
        )
        fix = make_fix(view.config, {"zero_optimization.stage3_max_live_parameters": DEFAULT_MAX_LIVE})
    else:
        why = (
            "all-gathers are issued only when their module runs: the parameter trace is being invalidated "
            "(dynamic control flow); set log_trace_cache_warnings to see which module changes the order"
        )
        fix = make_fix(view.config, {"zero_optimization.log_trace_cache_warnings": True})
    evidence = {
        "on_demand_fetches_per_step": round(float(per_step), 2),
        "prefetch_bucket_size": prefetch,
        "max_live_parameters": live,
    }
    return [
        finding(
            NOT_PREFETCHED.id,
            "Compute waits for all-gathers that were not prefetched",
            why,
            cost,
            [view.rank_id],
            steps,
            evidence,
            fix,
            covers=_windows(st, mask & (rest(view, st, view.claimed_by_communicator) > 0)),
        )
    ]


def _windows(st: Stalls, sel: np.ndarray) -> iv.Intervals:
    """The stall windows of the selected stalls."""
    return iv.union(st.start[sel], st.end[sel])


def host_slack(view: RankFacts) -> np.ndarray:
    """Per stall: how far ahead of the GPU the host was after it, the most the work after it can run earlier: the
    least (start - launch) of the compute-stream activities after the stalled one up to the next stall, and of
    the next stall's gap (which starts at its activity's launch, lead 0, when the host launched it after the work
    before it had ended); inf when nothing bounds it. Such a late launch counts where its gap is a host-starved
    window (facts/hoststarved.py: no sync the host waited in, no GPU work ending at the launch) or launch latency
    (under STALL_MIN_US). A launch after the host waited for the GPU (a sync that returned after the stall ended)
    comes earlier with it: no bound from there on. A host that launches each kernel, or each module's first
    kernel, just in time (host-bound-launch's) leaves a prefetch nothing to save. Once per rank."""
    return view.memo("host_slack", _host_slack)


def within_host_lead(view: RankFacts, saved: np.ndarray) -> np.ndarray:
    """Per stall: the part of `saved` that the work after it keeps. The savings add up along the trace (the
    stalls in time order), and the total is at most the host's lead after each stall (`host_slack`): a host
    3.4 ms ahead lets eight 2.8 ms stalls in a row save 3.4 ms, not 22.4 (after the first, the GPU catches up
    with the host and waits for its launches). What a lead takes back is taken from the latest savings first.
    Where the host waited for the GPU, its later launches come earlier by the shift the GPU had then: the leads
    after it count from there."""
    st = view.stalls
    lead = host_slack(view)
    out = np.zeros(len(st.kernel))
    waits = sorted(s.end for s in host_sync_list(view) if s.waited)
    shift = 0.0  # how much earlier than measured the work after the current stall runs
    host_shift = 0.0  # how much earlier than measured the host launches, from its last wait for the GPU
    granted: list[int] = []  # the stalls with a saving that still holds, in time order
    w = 0
    for k in np.argsort(st.start, kind="stable").tolist():
        while w < len(waits) and waits[w] <= st.start[k]:
            host_shift, w = shift, w + 1
        if saved[k] > 0:
            out[k] = float(saved[k])
            granted.append(k)
            shift += float(saved[k])
        excess = shift - float(lead[k]) - host_shift
        while excess > 0 and granted:
            j = granted[-1]
            take = min(excess, out[j])
            out[j] -= take
            shift -= take
            excess -= take
            if out[j] <= 0:
                granted.pop()
    return out


def _host_slack(view: RankFacts) -> np.ndarray:
    st = view.stalls
    g = view.gpu
    out = np.full(len(st.kernel), np.inf)
    on_s = np.flatnonzero(g.stream == view.compute_stream)
    if not len(st.kernel) or not len(on_s):
        return out
    on_s = on_s[np.argsort(g.start[on_s], kind="stable")]
    launch = view.launch[on_s]
    slack = np.where(np.isfinite(launch), g.start[on_s] - launch, np.inf)
    starts = g.start[on_s]
    queue_end = np.r_[-np.inf, np.maximum.accumulate(g.end[on_s])[:-1]]  # the end of the work before each one
    order = np.argsort(g.start[st.kernel], kind="stable")
    kernel_start = g.start[st.kernel[order]]
    at = np.searchsorted(starts, kernel_start, side="left")  # each stalled activity's place on the stream
    lo = at + 1  # the activities after the stalled one
    hi = np.r_[at[1:], len(starts)]  # up to the next stalled one
    # the next stalled activity starts no earlier than its launch: its gap's lead (start - launch) bounds what
    # comes into it; a late launch (after the work before it ended) only where the host itself was slow
    nxt = at[1:]
    late = launch[nxt] > queue_end[nxt]
    own = np.isin(st.kernel[order[1:]], host_starved(view).rows) | (launch[nxt] - queue_end[nxt] < STALL_MIN_US)
    gap_lead = np.where(np.isfinite(launch[nxt]), st.start[order[1:]] - launch[nxt], np.inf)
    next_bound = np.r_[np.where(~late | own, gap_lead, np.inf), np.inf]
    next_launch = np.r_[launch[nxt], np.inf]
    # launches after the host waited for the GPU come earlier with it: from the first such wait on, none is a bound
    waits = np.sort(np.array([s.end for s in host_sync_list(view) if s.waited], dtype=np.float64))
    moved = np.r_[waits, np.inf][np.searchsorted(waits, st.end[order], side="left")]
    for i, (k, a, b) in enumerate(zip(order.tolist(), lo.tolist(), hi.tolist(), strict=True)):
        fixed = launch[a:b] < moved[i]
        least = float(slack[a:b][fixed].min()) if fixed.any() else np.inf
        if next_launch[i] < moved[i]:
            least = min(least, float(next_bound[i]))
        out[k] = max(0.0, least)
    return out


def remaining_if_prefetched(view: RankFacts, mask: np.ndarray) -> np.ndarray:
    """Per stall of `mask` (on-demand all-gathers): the part of it that would remain with the gathers prefetched.
    Replays each step: every gather of the step issued as early as the gather side allows (back to back from the
    step's first gather, in their order, at their measured durations), and compute running its measured
    stretches between the stalls, waiting only where a replayed gather ends later. At this bandwidth a gather
    longer than the compute before it stays waited for (allgather-transfer-bound's, not a missing prefetch)."""
    st = view.stalls
    g = view.gpu
    out = np.zeros(len(st.kernel))
    gathers = np.flatnonzero(view.is_comm & (g.coll == AG))
    for rows in view.group_by_step(gathers).values():
        rows = rows[np.argsort(g.start[rows], kind="stable")]
        dur = g.end[rows] - g.start[rows]
        new_end = dict(zip(rows.tolist(), (g.start[rows[0]] + np.cumsum(dur)).tolist(), strict=True))
        stalls = np.flatnonzero(mask & np.isin(st.comm, rows))
        stalls = stalls[np.argsort(st.start[stalls], kind="stable")]
        shift = 0.0  # how much earlier replayed compute runs than measured
        for k in stalls.tolist():
            ready = float(st.start[k]) - shift
            resume = max(ready, min(new_end[int(st.comm[k])], float(st.end[k])))
            out[k] = resume - ready
            shift = float(st.end[k]) - resume
    return out


def not_prefetched_costs(view: RankFacts) -> tuple[np.ndarray, np.ndarray]:
    """Per stall: whether allgather-not-prefetched owns it, and what no more specific rule claimed of it (its
    cost there). An on-demand gather whose late issue a host sync's block explains is that sync's
    (facts/delays.py); without those, still a pattern? Once per rank: both gather rules and locate.py read it."""
    return view.memo("not_prefetched_costs", _not_prefetched_costs)


def on_demand_remainder(view: RankFacts) -> np.ndarray:
    """`remaining_if_prefetched` for the not-prefetched stalls, once per rank (both gather rules read it)."""
    return view.memo("on_demand_remainder", lambda v: remaining_if_prefetched(v, not_prefetched_costs(v)[0]))


def _not_prefetched_costs(view: RankFacts) -> tuple[np.ndarray, np.ndarray]:
    st = view.stalls
    # what a recorded wait on the default stream added to a gather's lateness is that wait's (overlap-comm-disabled)
    costs = rest(view, st, _gather_claims(view)) - host_delayed(view).explained
    mask = per_step_pattern(view, st, not_prefetched(view, st) & (costs > 0))
    return mask & ~warm_up_stalls(view, mask), np.maximum(costs, 0.0)


def _gather_claims(view: RankFacts) -> np.ndarray:
    """Per stall: what more specific rules than the gather rules claimed of it: the shared communicator's
    queueing, what a recorded wait on the default stream (overlap-comm-disabled) or for another communication
    stream (cross-stream-wait) added to its gather's lateness."""
    return view.claimed_by_communicator + default_stream_claims(view) + comm_wait_claims(view)


def warm_up_stalls(view: RankFacts, mask: np.ndarray) -> np.ndarray:
    """Of the on-demand pattern `mask`, the stalls of a warm-up: DeepSpeed prefetches only once its parameter
    trace is complete (partitioned_param_coordinator.py `is_complete_trace`), and it records that trace during
    the first step it runs, fetching every module on demand. So a pattern confined to the job's first step
    (`job_first_step`), with later profiled steps that do not repeat it, is that recording, not a prefetch
    setting; all of `mask` is then returned, else none. A trace invalidated later (a module-order change) is
    re-recorded in a later step, which the step number tells apart; and invalidated every step (dynamic control
    flow), the pattern holds in the later steps too."""
    first = job_first_step(view)
    steps = set(view.gpu_step[view.stalls.kernel[mask]].tolist())
    if first is None or steps != {first} or view.n_steps < 2:
        return np.zeros_like(mask)
    return mask.copy()


def warm_up_costs(view: RankFacts) -> tuple[np.ndarray, np.ndarray]:
    """Per stall: whether it is a first-step warm-up fetch (`warm_up_stalls`), and its cost (what no more
    specific rule claimed). Once per rank."""
    return view.memo("warm_up_costs", _warm_up_costs)


def _warm_up_costs(view: RankFacts) -> tuple[np.ndarray, np.ndarray]:
    st = view.stalls
    costs = np.maximum(rest(view, st, _gather_claims(view)) - host_delayed(view).explained, 0.0)
    mask = per_step_pattern(view, st, not_prefetched(view, st) & (costs > 0))
    return warm_up_stalls(view, mask), costs


def first_step_warm_up(view: RankFacts) -> list[Finding]:
    """The job's first step fetches every module on demand while DeepSpeed records its parameter trace
    (`warm_up_stalls`): compute waits for those all-gathers in that step only. Reported as info, without a fix:
    nothing in the config changes it, and the later steps prefetch."""
    if hardware_serialized(view):
        return []
    mask, costs = warm_up_costs(view)
    if not mask.any():
        return []
    st = view.stalls
    cost, steps = view.per_step(costs[mask], view.launch[st.kernel[mask]])
    if round(cost, 3) <= 0:
        return []
    evidence = {
        "on_demand_fetches_in_step": int(mask.sum()),
        "step": steps[0] if steps else None,
        "later_steps": [s for s in view.step_numbers if s not in steps],
    }
    return [
        finding(
            WARM_UP.id,
            "The first step fetches its parameters on demand (warm-up)",
            "DeepSpeed prefetches only once its parameter trace is complete, and it records that trace in the "
            "first step it runs: that step's all-gathers are issued when their module runs and compute waits for "
            "them; the later profiled steps prefetch. A warm-up, not a setting: profile from a later step",
            cost,
            [view.rank_id],
            steps,
            evidence,
            covers=_windows(st, mask),
        )
    ]


def wait_costs(view: RankFacts) -> np.ndarray:
    """Per stall: the cost cross-stream-wait owns, what no more specific rule claimed: not the communicator's
    queueing, not an on-demand gather (a pattern, or the first fetch of a pass: inherent), not the step's first
    gather (waited for in any case), not a gather queued on its stream (allgather-transfer-bound's), not what a
    host sync's block explains (facts/delays.py). Of any gather, what a recorded wait of its stream for another
    communication stream added to its lateness (`comm_wait_claims`) is this rule's."""
    st = view.stalls
    base = np.maximum(rest(view, st, view.claimed_by_communicator + default_stream_claims(view))
                      - host_delayed(view).explained, 0.0)  # fmt: skip
    held = np.minimum(comm_wait_claims(view), base)  # its own on any gather, on-demand, first or queued
    left = base - held
    left[on_demand(view, st)] = 0.0
    left[np.isin(st.comm, view.first_gathers)] = 0.0
    left[queued_gathers(view)] = 0.0  # allgather-transfer-bound's
    return left + held


def cross_stream_waits(view: RankFacts) -> list[Finding]:
    """torch `Stream.wait_stream` / `Work.wait()` record an event on one stream and make another wait for it
    (cudaStreamWaitEvent). DeepSpeed ZeRO-3 makes the compute stream wait for __allgather_stream in
    fetch_sub_module (partitioned_param_coordinator.py), and since v0.14.3 (#5606) ZeRO-1/2 average_tensor makes it
    wait for the reduction stream (DS #8364). Stalls not owned by a more specific rule are reported here, one
    finding per collective waited for and call site of the wait that held the compute stream
    (facts/waitsites.py). When no two streams ever run at once because of these waits (not the hardware queue,
    streams.no_stream_concurrency), the stalls are theirs too."""
    if hardware_serialized(view):
        return []
    st = view.stalls
    left = wait_costs(view)
    g = view.gpu
    out: list[Finding] = []
    kinds = np.where(st.comm >= 0, g.coll[np.maximum(st.comm, 0)], -1)
    sites = stall_waits(view)
    site_of = np.array([s if s is not None else "" for s in sites.site], dtype=object)
    for kind in np.unique(kinds).tolist():
        of_kind = (kinds == kind) & (left > 0)
        for where in sorted(set(site_of[of_kind].tolist())):
            sel = of_kind & (site_of == where)
            out.append(_wait_finding(view, st, left, sel, kind, where or None))
    return out


def queued_gathers(view: RankFacts) -> np.ndarray:
    """Per stall: it waits for a prefetched all-gather that the host issued early (it started more than
    STARVED_LAUNCH_US after its launch): the GPU, not the host, decided when it ran, behind the gathers and
    unflatten kernels before it on the gather side (a communicator's queueing behind reduce-scatters is
    same-communicator's, claimed before), so no earlier issue would have started it sooner."""
    st = view.stalls
    g = view.gpu
    c = np.maximum(st.comm, 0)
    issued_early = g.start[c] - view.launch[c] > STARVED_LAUNCH_US
    first = np.isin(st.comm, view.step_first_gathers)
    return (st.comm >= 0) & (g.coll[c] == AG) & issued_early & ~first


def allgather_transfer_bound(view: RankFacts) -> list[Finding]:
    """All-gathers that take longer than the compute they hide behind: prefetched ones the GPU ran back to back on
    the gather side (`queued_gathers`), and of on-demand ones the wait that would remain prefetched
    (`remaining_if_prefetched`): compute waits for the transfer itself, not for a late issue or a wait someone
    could move. At this bandwidth no bucket size or prefetch hides it; the part no schedule hides is the bandwidth floor
    (bandwidth-bound, which owns it when it dominates). Fewer bytes do: ZeRO++ quantized weights, hpZ."""
    if hardware_serialized(view):
        return []
    st = view.stalls
    on_demand_mask, unclaimed = not_prefetched_costs(view)
    queued = queued_gathers(view) & ~on_demand_mask
    # a queued gather's whole wait (what no more specific rule claimed); of the on-demand pattern's, what would
    # remain with the gathers prefetched (neither what a wait of the gather's stream added: `_gather_claims`)
    left = np.where(queued, unclaimed, np.minimum(unclaimed, on_demand_remainder(view)) * on_demand_mask)
    sel = (queued | on_demand_mask) & (left > 0)
    if not sel.any():
        return []
    cost, steps = view.per_step(left[sel], view.launch[st.kernel[sel]])
    g = view.gpu
    gathers = np.unique(st.comm[sel])
    busy = float((g.end[gathers] - g.start[gathers]).sum()) / view.n_steps
    evidence = {
        "stalls_per_step": round(float(sel.sum()) / view.n_steps, 2),
        "awaited_gathers_per_step": round(len(gathers) / view.n_steps, 2),
        "awaited_gather_us_per_step": round(busy, 3),
        "issued_early_per_step": round(float((sel & queued).sum()) / view.n_steps, 2),
        "on_demand_per_step": round(float((sel & on_demand_mask).sum()) / view.n_steps, 2),
        "waited_on_streams": sorted({int(s) for s in g.stream[gathers].tolist()}),
    }
    return [
        finding(
            TRANSFER_BOUND.id,
            "Prefetched all-gathers take longer than the compute they hide behind",
            "the all-gathers were issued early but ran back to back on their stream: at the measured bandwidth "
            "they need more time than the compute beside them, so compute waits for the transfer; a larger "
            "prefetch bucket would not start them sooner, fewer bytes would (zero_quantized_weights, hpZ)",
            cost,
            [view.rank_id],
            steps,
            evidence,
            covers=_windows(st, sel),
        )
    ]


def _wait_finding(
    view: RankFacts, st: Stalls, left: np.ndarray, sel: np.ndarray, kind: int, site: str | None
) -> Finding:
    """One cross-stream-wait finding: the stalls `sel` on collectives of `kind` held by waits from `site`."""
    g = view.gpu
    cost, steps = view.per_step(left[sel], view.launch[st.kernel[sel]])
    name = C.COLLECTIVES[kind] if kind >= 0 else "non-communication work"
    awaited = st.comm[sel][st.comm[sel] >= 0]
    sw = stall_waits(view)
    rows = np.flatnonzero(sel)
    stack = next((sw.stack[r] for r in rows.tolist() if sw.stack[r]), [])
    evidence: dict[str, Any] = {
        "waited_for": name,
        "call_site": site,
        "stack": stack,
        "wait_calls_per_step": calls_per_site(view).get(site) if site is not None else None,
        "stalls_per_step": round(float(sel.sum()) / view.n_steps, 2),
        "stalls_after_wait": int((sw.wait[sel] >= 0).sum()),
        "stream_wait_events_per_step": _stream_waits_per_step(view),
        "compute_stream": view.compute_stream,
        "waited_on_streams": sorted({int(s) for s in g.stream[awaited].tolist()}),
    }
    fix: Fix | None = None
    names = functions(stack)
    where = f" ({site})" if site else " on another stream"
    title = f"Compute stream waits for {name}{where}"
    held = _held_by(view, left, sel)
    if held:
        evidence["gather_stream_waited_for"] = held
    if held and kind == AG:
        what = " and ".join(f"{k} on stream {', '.join(map(str, s))}" for k, s in held.items())
        why = (
            f"the all-gathers' stream is made to wait for {what} (a recorded cudaStreamWaitEvent before each "
            "gather): however early they are issued, they start only when that ends, and compute waits for them. "
            "Make the gather stream wait only for what the gathered parameters need, or issue that collective "
            "where the gathers do not wait for it"
        )
    elif site and kind == AG and ("fetch_sub_module" in names or "partitioned_param_coordinator" in site):
        why, fix = _prefetch_fix(view, st, sel, evidence)
    elif site and "average_tensor" in names:
        why = (
            f"DeepSpeed ZeRO-1/2 average_tensor ({site}) makes the compute stream wait for the reduction stream "
            f"(since v0.14.3, #5606; DS #8364): compute stalls until the {name} finishes"
        )
    elif site and is_user(site):
        why = (
            f"the script makes the compute stream wait for {name} at {site} (e.g. "
            "`torch.cuda.current_stream().wait_stream(...)` in a gradient hook), and no other compute is ready "
            "to run meanwhile: wait only where the result is consumed, or record an event and wait on it later"
        )
    else:
        why = (
            f"the compute stream is held by a stream wait until {name} finishes, and no other compute is ready "
            "to run meanwhile"
        )
        if site:
            why += f"; the wait is issued at {site}"
        if kind == AG:
            why += (
                "; these all-gathers were prefetched but take longer than the compute before them: a larger "
                "stage3_prefetch_bucket_size starts them earlier, zero_quantized_weights or hpZ make them smaller"
            )
    return finding(
        CROSS_STREAM_WAIT.id,
        title,
        why,
        cost,
        [view.rank_id],
        steps,
        evidence,
        fix,
        covers=_windows(st, sel),
    )


def _prefetch_fix(view: RankFacts, st: Stalls, sel: np.ndarray, evidence: dict[str, Any]) -> tuple[str, Fix | None]:
    """fetch_sub_module waits for prefetched all-gathers that the compute before them did not cover. Those that
    started as soon as the host issued them (within STARVED_LAUNCH_US) were issued too late: a prefetch bucket
    large enough to issue them that much earlier, from their time against the part of it compute covered (at
    most MAX_PREFETCH_GROWTH times the current bucket). Those that queued behind earlier work on their stream
    (gathers back to back on a saturated stream) would not start earlier. Adds the numbers to `evidence`."""
    g = view.gpu
    n = view.n_steps
    gathers = np.unique(st.comm[sel][st.comm[sel] >= 0])
    late = gathers[g.start[gathers] - view.launch[gathers] <= STARVED_LAUNCH_US]
    duration = float((g.end[late] - g.start[late]).sum())
    hidden = duration - float(view.idle(g.start[late], g.end[late]).sum())
    configured = config_value(view.config, "zero_optimization.stage3_prefetch_bucket_size")
    current = int(configured) if isinstance(configured, int | float) and configured > 0 else DEFAULT_PREFETCH_BUCKET
    growth = min(MAX_PREFETCH_GROWTH, duration / hidden) if hidden > 0 else MAX_PREFETCH_GROWTH
    target = round_size(current * growth)
    evidence.update(
        {
            "awaited_gathers_per_step": round(len(gathers) / n, 2),
            "awaited_gather_us_per_step": round(float((g.end[gathers] - g.start[gathers]).sum()) / n, 3),
            "issued_late_per_step": round(len(late) / n, 2),
            "late_gather_us_per_step": round(duration / n, 3),
            "late_gather_covered_by_compute_us_per_step": round(hidden / n, 3),
            "prefetch_bucket_size": current,
        }
    )
    if not len(late):
        why = (
            "fetch_sub_module makes the compute stream wait for prefetched all-gathers that were issued early "
            "but queued behind each other on their stream: the gathers take longer than the compute they hide "
            "behind, and a larger prefetch bucket would not start them earlier; zero_quantized_weights or hpZ "
            "make them smaller"
        )
        return why, None
    why = (
        f"fetch_sub_module makes the compute stream wait for prefetched all-gathers issued too late: compute "
        f"covered {hidden / n:.0f} of their {duration / n:.0f} µs per step; a stage3_prefetch_bucket_size of "
        f"{sci(target)} (from {sci(current)}) issues them early enough, zero_quantized_weights or hpZ make them "
        "smaller"
    )
    if target <= current:
        return why, None
    return why, make_fix(view.config, {"zero_optimization.stage3_prefetch_bucket_size": target})


def _held_by(view: RankFacts, left: np.ndarray, sel: np.ndarray) -> dict[str, list[int]]:
    """The collectives, by kind and stream, that a recorded wait made the stalls' all-gathers wait for, when that
    wait (`comm_wait_claims`) is most of what the stalls `sel` cost here; else {}."""
    claims = comm_wait_claims(view)
    if not sel.any() or float(np.minimum(claims[sel], left[sel]).sum()) * 2 <= float(left[sel].sum()):
        return {}
    rows = comm_wait_blockers(view)[sel]
    rows = rows[rows >= 0]
    g = view.gpu
    out: dict[str, set[int]] = {}
    for r in rows.tolist():
        out.setdefault(C.COLLECTIVES[int(g.coll[r])] if g.coll[r] >= 0 else "communication", set()).add(
            int(g.stream[r])
        )
    return {k: sorted(v) for k, v in sorted(out.items())}


def _stream_waits_per_step(view: RankFacts) -> float | None:
    """`Stream Wait Event` records (enable_cuda_sync_events) that make the compute stream wait, per step; None
    when the trace has no cuda_sync events."""
    s = view.model.syncs
    if not len(s):
        return None
    waits = view.name_mask(s.name, lambda n: n == "Stream Wait Event") & (s.stream == view.compute_stream)
    return round(float(waits.sum()) / view.n_steps, 2)


# -- where the findings happen (the timelines) ---------------------------------------------------------------


def _stall_blames(
    view: RankFacts, rule: Rule, f: Finding, sel: np.ndarray, costs: np.ndarray, name: str
) -> list[Blame]:
    st = view.stalls
    steps = view.gpu_step[st.kernel]
    key = rule.key(f)
    out = []
    for r in sel.tolist():
        step = int(steps[r])
        out.append(
            Blame(
                rule.id,
                key,
                "wait",
                float(st.start[r]),
                float(st.end[r]),
                view.compute_stream,
                f"compute stream waits for {name}",
                step if step >= 0 else None,
                float(costs[r]),
            )
        )
    return out


def cross_stream_blames(view: RankFacts, located: Located) -> list[Blame]:
    """The compute-stream waits at each finding's call site for its collective, with their cost."""
    st = view.stalls
    if not len(st.kernel):
        return []
    g = view.gpu
    kinds = np.where(st.comm >= 0, g.coll[np.maximum(st.comm, 0)], -1)
    costs = wait_costs(view)
    out: list[Blame] = []
    for rule, f in located:
        name = f.evidence.get("waited_for")
        kind = C.COLLECTIVES.index(name) if name in C.COLLECTIVES else -1
        at_site = stalls_at(view, f.evidence.get("call_site"))
        sel = np.flatnonzero((kinds == kind) & at_site & (costs > 0))
        out += _stall_blames(view, rule, f, sel, costs, str(name))
    return out


def not_prefetched_blames(view: RankFacts, located: Located) -> list[Blame]:
    """The compute-stream waits for all-gathers a prefetch would have started earlier, with what it saves."""
    if not len(view.stalls.kernel):
        return []
    mask, costs = not_prefetched_costs(view)
    sel = np.flatnonzero(mask)
    return [b for rule, f in located for b in _stall_blames(view, rule, f, sel, costs, "all_gather (not prefetched)")]


def warm_up_blames(view: RankFacts, located: Located) -> list[Blame]:
    """The compute-stream waits for the first step's on-demand all-gathers."""
    if not len(view.stalls.kernel):
        return []
    mask, costs = warm_up_costs(view)
    sel = np.flatnonzero(mask)
    return [b for rule, f in located for b in _stall_blames(view, rule, f, sel, costs, "all_gather (first step)")]


NOT_PREFETCHED = Rule("allgather-not-prefetched", allgather_not_prefetched, blame=not_prefetched_blames)
# the trace-recording first step: no fix, info only
WARM_UP = Rule("first-step-warm-up", first_step_warm_up, severity_cap="info", blame=warm_up_blames)
# the transfer itself outruns the compute beside it: no schedule fix; bandwidth-bound owns it when it dominates
TRANSFER_BOUND = Rule(
    "allgather-transfer-bound", allgather_transfer_bound, severity_cap="info", limit=True, blame=exposed_blames
)
CROSS_STREAM_WAIT = Rule(
    "cross-stream-wait",
    cross_stream_waits,
    shares=(0.15, 0.05),
    distinct_by=("waited_for", "call_site"),
    blame=cross_stream_blames,
)
