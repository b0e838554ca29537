"""Cross-stream waits and all-gathers that were not prefetched: the compute stream's stalls (facts/stalls.py)
shared out by the collective they waited for."""

from __future__ import annotations

import numpy as np

from overlapcheck.diagnose.facts.sizing import AG, DEFAULT_PREFETCH_BUCKET
from overlapcheck.diagnose.facts.stalls import not_prefetched, on_demand, rest
from overlapcheck.diagnose.facts.view import RankFacts
from overlapcheck.diagnose.finding import config_value, finding, make_fix
from overlapcheck.model import Finding
from overlapcheck.trace import classify as C


def allgather_not_prefetched(view: RankFacts) -> list[Finding]:
    """partitioned_param_coordinator.py (v0.6 .. 0.19.x) fetch_sub_module prefetches the next modules'
    parameters only when the parameter trace is complete (is_complete_trace) and stage3_prefetch_bucket_size > 0;
    otherwise each all-gather is issued when its module runs and `current_stream().wait_stream(__allgather_stream)`
    makes compute wait for the whole transfer."""
    if view.no_concurrency:
        return []
    st = view.stalls
    mask = not_prefetched(view, st)
    if not mask.any():
        return []
    costs = rest(view, st, view.claimed_by_communicator)[mask]
    per_step = mask.sum() / view.n_steps
    cost, steps = view.per_step(costs, view.launch[st.kernel[mask]])
    prefetch = config_value(view.config, "zero_optimization.stage3_prefetch_bucket_size")
    if prefetch is not None and prefetch <= 0:
        why = "stage3_prefetch_bucket_size is 0, so no all-gather is issued before its module needs it"
        fix = make_fix(view.config, {"zero_optimization.stage3_prefetch_bucket_size": DEFAULT_PREFETCH_BUCKET})
    else:
        why = (
            "all-gathers are issued only when their module runs: the parameter trace is being invalidated "
            "(dynamic control flow); set log_trace_cache_warnings to see which module changes the order"
        )
        fix = make_fix(view.config, {"zero_optimization.log_trace_cache_warnings": True})
    evidence = {"on_demand_fetches_per_step": round(float(per_step), 2), "prefetch_bucket_size": prefetch}
    return [
        finding(
            "allgather-not-prefetched",
            "Compute waits for all-gathers that were not prefetched",
            why,
            cost,
            [view.rank_id],
            steps,
            evidence,
            fix,
        )
    ]


def cross_stream_waits(view: RankFacts) -> list[Finding]:
    """torch `Stream.wait_stream` / `Work.wait()` record an event on one stream and make another wait for it
    (cudaStreamWaitEvent). DeepSpeed ZeRO-3 makes the compute stream wait for __allgather_stream in
    fetch_sub_module (partitioned_param_coordinator.py), and since v0.14.3 (#5606) ZeRO-1/2 average_tensor makes it
    wait for the reduction stream (DS #8364). Stalls not owned by a more specific rule are reported here, by the
    collective they waited for."""
    if view.no_concurrency:
        return []
    st = view.stalls
    left = rest(view, st, view.claimed_by_communicator)
    left[on_demand(view, st)] = 0.0  # not prefetched: a pattern, or the first fetch of a pass (inherent)
    left[np.isin(st.comm, view.first_gathers)] = 0.0  # the step's first gather is waited for in any case
    g = view.gpu
    out: list[Finding] = []
    kinds = np.where(st.comm >= 0, g.coll[np.maximum(st.comm, 0)], -1)
    for kind in np.unique(kinds).tolist():
        sel = (kinds == kind) & (left > 0)
        if not sel.any():
            continue
        cost, steps = view.per_step(left[sel], view.launch[st.kernel[sel]])
        name = C.COLLECTIVES[kind] if kind >= 0 else "non-communication work"
        awaited = st.comm[sel][st.comm[sel] >= 0]
        evidence = {
            "waited_for": name,
            "stalls_per_step": round(float(sel.sum()) / view.n_steps, 2),
            "stream_wait_events_per_step": _stream_waits_per_step(view),
            "compute_stream": view.compute_stream,
            "waited_on_streams": sorted({int(s) for s in g.stream[awaited].tolist()}),
        }
        why = (
            f"the compute stream is held by a stream wait until {name} finishes, and no other compute is ready "
            "to run meanwhile"
        )
        if kind == AG:
            why += (
                "; these all-gathers were prefetched but take longer than the compute before them: a larger "
                "stage3_prefetch_bucket_size starts them earlier, zero_quantized_weights or hpZ make them smaller"
            )
        out.append(
            finding(
                "cross-stream-wait",
                f"Compute stream waits for {name} on another stream",
                why,
                cost,
                [view.rank_id],
                steps,
                evidence,
            )
        )
    return out


def _stream_waits_per_step(view: RankFacts) -> float | None:
    """`Stream Wait Event` records (enable_cuda_sync_events) that make the compute stream wait, per step; None
    when the trace has no cuda_sync events."""
    s = view.model.syncs
    if not len(s):
        return None
    waits = view.name_mask(s.name, lambda n: n == "Stream Wait Event") & (s.stream == view.compute_stream)
    return round(float(waits.sum()) / view.n_steps, 2)
