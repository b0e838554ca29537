"""Gradient buckets and collective sizes: reduce-scatter deferred to the end of backward, overlap_comm off,
many tiny latency-bound collectives."""

from __future__ import annotations

from typing import Any

import numpy as np

from overlapcheck.analysis import intervals as iv
from overlapcheck.diagnose.facts.concurrency import default_stream_claims
from overlapcheck.diagnose.facts.coverage import gradient_tails, reduction_rates, transfer_us
from overlapcheck.diagnose.facts.dtypes import exposed_tail, fp32_reductions
from overlapcheck.diagnose.facts.hostsyncs import REDUCE_THROTTLE, STARVED_LAUNCH_US
from overlapcheck.diagnose.facts.sizing import (
    AG,
    RS,
    gradient_copies,
    last_bucket_fraction,
    parameter_count,
    recommended_bucket,
    reduce_bucket_size,
)
from overlapcheck.diagnose.facts.view import RankFacts
from overlapcheck.diagnose.finding import config_value, finding, make_fix, round_size, sci
from overlapcheck.diagnose.locators import exposed_blames
from overlapcheck.diagnose.rule import Rule
from overlapcheck.model import Finding
from overlapcheck.trace import classify as C
from overlapcheck.trace.model import SHAPES_NOTE

DEFERRED_SHARE = 0.5  # share of a step's reduce-scatter elements flushed after backward
TINY_BYTES = 1 << 20
TINY_PER_STEP = 32
_DTYPE_BYTES = {"BFloat16": 2, "Half": 2, "Float": 4, "Double": 8, "Byte": 1, "Char": 1, "Int": 4, "Long": 8}


REDUCTION_FRAMES = ("__reduce_and_partition_ipg_grads", "partition_grads")  # DeepSpeed's own reduction kernels


def backward_end(view: RankFacts) -> dict[int, float]:
    """Per step: launch time of the last compute-stream compute kernel launched by a thread other than the one
    that runs the step loop (PyTorch runs CUDA backward on its autograd device thread). The same thread launches
    DeepSpeed's reduction kernels (the gradient partition `copy_` of partition_grads right after each
    reduce-scatter, the bucket's scaling): on the reduction stream they are not backward's, and with stacks those
    launched under REDUCTION_FRAMES are left out on any stream (overlap_comm off puts them on the compute stream)."""
    o = view.model.ops
    main = {int(o.thread[i]) for i in np.flatnonzero(view.name_mask(o.name, lambda n: n.startswith("ProfilerStep#")))}
    if not main:
        return {}
    rt_thread = view.launch_thread
    sel = view.is_compute & (view.gpu.stream == view.compute_stream) & (view.gpu_step >= 0) & (rt_thread >= 0)
    sel &= ~np.isin(rt_thread, list(main))
    for function in REDUCTION_FRAMES:
        sel &= ~launched_in(view, function)
    return {step: float(view.launch[rows].max()) for step, rows in view.group_by_step(np.flatnonzero(sel)).items()}


def launched_in(view: RankFacts, function: str) -> np.ndarray:
    """GPU activities launched while a python_function named `function` was running (False without stacks)."""
    o = view.model.ops
    frames = np.flatnonzero(view.name_mask(o.name, lambda n: n.endswith(f": {function}")))
    if not len(frames):
        return np.zeros(len(view.gpu), dtype=bool)
    spans = iv.union(o.start[frames], o.end[frames])
    if not len(spans):  # every frame an instant: nothing was launched inside one
        return np.zeros(len(view.gpu), dtype=bool)
    i = np.searchsorted(spans.starts, view.launch, side="right") - 1
    return (i >= 0) & (view.launch < spans.ends[np.maximum(i, 0)])


def held_first_gathers_exposed(view: RankFacts) -> float:
    """Per step: exposed time of the steps' first all-gathers that the host issued while earlier compute-stream
    work was still queued, up to that queued time (what they could have overlapped)."""
    return iv.length(_held_first_gathers(view)) / view.n_steps


def _held_first_gathers(view: RankFacts) -> iv.Intervals:
    """The windows `held_first_gathers_exposed` measures."""
    g = view.gpu
    held = np.setdiff1d(view.step_first_gathers, view.first_gathers)
    if not len(held):
        return iv.EMPTY
    return iv.subtract(iv.subtract(iv.union(g.start[held], g.end[held]), view.compute), view.first_gather_waits)


def _per_row(per_step: dict[int, float], steps: np.ndarray) -> np.ndarray:
    """`per_step[step]` for each row's step (inf where the step has none)."""
    if not per_step:
        return np.full(len(steps), np.inf)
    keys = np.array(sorted(per_step), dtype=np.int64)
    values = np.array([per_step[k] for k in keys.tolist()], dtype=np.float64)
    i = np.clip(np.searchsorted(keys, steps), 0, len(keys) - 1)
    return np.where(keys[i] == steps, values[i], np.inf)


def reduce_scatter_deferred(view: RankFacts) -> list[Finding]:
    """stage3.py (v0.13.3 .. 0.19.x) reduce_independent_p_g_buckets_and_remove_grads flushes a bucket only when
    `elements + numel > reduce_bucket_size`; independent_gradient_partition_epilogue flushes the rest after
    backward and synchronizes. With reduce_bucket_size (default 5e8) above the parameter count, every
    reduce-scatter runs after the last backward kernel and is fully exposed (DS #5201)."""
    g = view.gpu
    rs = view.is_comm & (g.coll == RS) & (view.gpu_step >= 0 if len(view.model.steps) else True)
    if not rs.any():
        return []
    ends = backward_end(view)
    bucket, bucket_src = reduce_bucket_size(view)
    params, params_src = parameter_count(view)
    elems_step = int(g.nelems[rs].clip(0).sum() / view.n_steps) or params or 0
    if ends:
        after = rs & (view.launch > _per_row(ends, view.gpu_step))
    else:
        # no backward thread to tell when backward ended: only a bucket the job's own numbers show to hold every
        # gradient (both taken from the trace's reduce-scatter sizes would agree by construction)
        known = params is not None and params_src != "trace" and bucket_src != "trace"
        after = rs if (known and params is not None and bucket >= params) else np.zeros(len(g), dtype=bool)
    weight = g.nelems if (g.nelems[rs] > 0).all() else g.end - g.start  # sizes are missing before torch 2.2
    share = weight[after].sum() / max(1e-9, weight[rs].sum())
    if not after.any() or share < DEFERRED_SHARE:
        return []
    target = recommended_bucket(params)
    costs, steps = [], []
    copies = gradient_copies(view)
    measured = _measured_volume(view, copies) if not elems_step else None
    if measured is not None:
        elems_step = int(measured["elements_per_step"])
    covers = iv.subtract(iv.union(g.start[after], g.end[after]), view.compute)
    exposures, inherent = [], 0.0
    for step in np.unique(view.gpu_step[after]).tolist():
        rows = view.step_rows[step]
        sel = rows[after[rows]]
        exposed = iv.length(iv.subtract(iv.union(g.start[sel], g.end[sel]), view.compute))
        if measured is None:
            frac = last_bucket_fraction(view, rows, target, elems_step, copies)
            costs.append(exposed * (1.0 - frac))
        else:
            exposures.append((rows, exposed))
        steps.append(int(step))
    if measured is not None:
        costs, inherent = _measured_costs(view, rs, exposures, target, elems_step, copies, measured)
    cost = sum(costs) / view.n_steps
    fits = params is not None and bucket >= params
    rs_overlap = view.metrics.overlap("reduce_scatter")
    exposed_text = f"reduce-scatter is {1 - rs_overlap:.0%} exposed: " if rs_overlap is not None else ""
    why = (
        f"{exposed_text}every gradient fits in one {sci(bucket)}-element bucket (reduce_bucket_size >= {params:,} "
        "trainable parameters), so all reduce-scatters wait for independent_gradient_partition_epilogue after "
        "the last backward kernel"
        if fits
        else f"{exposed_text}{share:.0%} of the reduce-scatter volume is flushed after the last backward kernel, so it "
        f"cannot overlap backward compute (reduce_bucket_size {sci(bucket)})"
    )
    if measured is not None and measured["source"] == "none":
        why += "; the trace has no message size, so the cost is the whole exposed time (an upper bound)"
    evidence = {
        "reduce_bucket_size": bucket,
        "reduce_bucket_size_from": bucket_src,
        "parameters": params,
        "parameters_from": params_src,
        "deferred_share": round(float(share), 4),
        "reduce_scatters_per_step": round(float(rs.sum()) / view.n_steps, 2),
        "deferred_exposed_us_per_step": round(sum(costs) / view.n_steps, 3),
    }
    if any(note.startswith(SHAPES_NOTE) for note in view.model.notes):
        evidence["sizes_from"] = "Input Dims"  # torch < 2.1: the nccl:* ops' input shapes, no record_param_comms
    if measured is not None:  # no message sizes and no parameter count: costed from what the trace measured
        evidence.update(
            {
                "volume_from": measured["source"],
                "reduce_scatter_bytes_per_step": measured["bytes_per_step"],
                "best_rate_gbps": measured["best_rate_gbps"],
                "inherent_us_per_step": round(inherent / view.n_steps, 3),
            }
        )
    fix = make_fix(view.config, {"zero_optimization.reduce_bucket_size": target})
    return [
        finding(
            DEFERRED.id,
            "Reduce-scatter runs after the last backward kernel",
            why,
            cost,
            [view.rank_id],
            steps,
            evidence,
            fix,
            covers=covers,
        )
    ]


def _gradient_element_bytes(view: RankFacts) -> int:
    """Bytes of one gradient element: 2 when the config trains in bf16 or fp16 (DeepSpeed keeps the gradients
    of the bit16 parameters in that type), else 4."""
    half = config_value(view.config, "bf16.enabled") or config_value(view.config, "fp16.enabled")
    return 2 if half else 4


def _measured_volume(view: RankFacts, copies: np.ndarray) -> dict[str, Any]:
    """The step's reduce-scatter volume when neither the trace's message sizes nor the parameter count say it:
    the bytes of the gradient copies into the bucket (`__add_grad_to_ipg_bucket` copy_, device-to-device
    memcpy activities with `bytes`), which are every trainable gradient once per step; `source` "none" with
    zero bytes when the trace has no such copies either."""
    in_steps = view.gpu_step >= 0 if len(view.model.steps) else np.ones(len(view.gpu), dtype=bool)
    copied = float(view.gpu.nbytes[copies & in_steps].sum()) / view.n_steps
    elem = _gradient_element_bytes(view)
    return {
        "source": "gradient copies" if copied > 0 else "none",
        "bytes_per_step": int(copied),
        "elements_per_step": int(copied / elem),
        "best_rate_gbps": None,
    }


def _measured_costs(
    view: RankFacts,
    rs: np.ndarray,
    exposures: list[tuple[np.ndarray, float]],
    target: int,
    elems_step: int,
    copies: np.ndarray,
    measured: dict[str, Any],
) -> tuple[list[float], float]:
    """Per step: the exposed after-backward reduce-scatter time less the inherent part, the last bucket of the
    recommended size moved at the best rate measured (the step's gradient bytes over its reduce-scatter kernel
    time, the fastest step; a kernel's time includes waiting for peers, so the fastest is the closest to the
    transfer). Without any volume the last bucket is unknown and the whole exposed time is the cost (an upper
    bound). Returns the costs and the inherent µs summed over the steps; sets `measured["best_rate_gbps"]`."""
    g = view.gpu
    volume = float(measured["bytes_per_step"])
    times = [float((g.end[rows[rs[rows]]] - g.start[rows[rs[rows]]]).sum()) for rows, _ in exposures]
    best = max((volume / t for t in times if t > 0), default=0.0)  # bytes per µs
    measured["best_rate_gbps"] = round(best * 1e6 / 1e9, 3) if best > 0 else None
    costs, inherent = [], 0.0
    for rows, exposed in exposures:
        last = 0.0
        if best > 0 and elems_step > 0:
            last = last_bucket_fraction(view, rows, target, elems_step, copies) * volume / best
        inherent += min(exposed, last)
        costs.append(max(0.0, exposed - last))
    return costs, inherent


def overlap_comm_disabled(view: RankFacts) -> list[Finding]:
    """stage3.py (v0.6 .. 0.19.x) creates reduce_and_partition_stream and parameter_offload.py the
    __allgather_stream only when overlap_comm is true, else both are the default stream: gradient copies and
    reduce-scatters then run on the compute stream and cannot overlap backward. Seen as reduce-scatter kernels and
    device-to-device gradient copies on the compute stream, or `overlap_comm: false` in the config. Cost: the
    exposed time of that reduction work on the compute stream (reduce-scatters, bucket copies, and with stacks the
    cat/divide kernels of __reduce_and_partition_ipg_grads), less the last bucket, which stays exposed anyway;
    plus the exposed time of each step's first all-gather that the host issued while the previous step's compute
    still ran: on its own stream it would overlap that compute, on the default stream it waits for it."""
    g = view.gpu
    in_steps = view.gpu_step >= 0 if len(view.model.steps) else np.ones(len(g), dtype=bool)
    rs = view.is_comm & (g.coll == RS) & in_steps
    on_compute = rs & (g.stream == view.compute_stream)
    configured_off = config_value(view.config, "zero_optimization.overlap_comm") is False
    if not rs.any() or not (on_compute.sum() >= max(1, 0.5 * rs.sum()) or configured_off):
        return []
    bucket, _ = reduce_bucket_size(view)
    elems_step = int(g.nelems[rs].clip(0).sum() / view.n_steps) or parameter_count(view)[0] or 0
    on_s = in_steps & (g.stream == view.compute_stream)
    copies = on_s & (g.cls == C.MEMCPY) & view.name_mask(g.name, lambda n: "DtoD" in n)
    reduction = on_s & view.is_compute & launched_in(view, "__reduce_and_partition_ipg_grads")
    serial = (on_compute if on_compute.any() else rs) | copies | reduction
    compute = iv.union(g.start[view.is_compute & ~reduction], g.end[view.is_compute & ~reduction])
    costs, steps = [], []
    grads = gradient_copies(view)
    covers = iv.subtract(iv.union(g.start[serial & in_steps], g.end[serial & in_steps]), compute)
    for step in np.unique(view.gpu_step[rs]).tolist():
        rows = view.step_rows[step]
        sel = rows[serial[rows]]
        exposed = iv.length(iv.subtract(iv.union(g.start[sel], g.end[sel]), compute))
        frac = last_bucket_fraction(view, rows, bucket, elems_step, grads)
        costs.append(exposed * (1.0 - frac))
        steps.append(int(step))
    held_exposed = held_first_gathers_exposed(view)
    costs.append(held_exposed * view.n_steps)
    # compute stalls on later all-gathers that a recorded wait held behind the default stream's compute: the part
    # of their lateness that wait added (on their own stream they would not wait for compute)
    st = view.stalls
    claims = np.where(view.in_steps(view.launch[st.kernel]), default_stream_claims(view), 0.0)
    on_default = claims > 0
    default_us = float(claims.sum())
    costs.append(default_us)
    evidence = {
        "first_all_gathers_held_behind_compute_us_per_step": round(held_exposed, 3),
        "all_gathers_held_by_default_stream_wait_per_step": round(float(on_default.sum()) / view.n_steps, 2),
        "default_stream_wait_stall_us_per_step": round(default_us / view.n_steps, 3),
        "reduce_scatters_on_compute_stream": int(on_compute.sum()),
        "compute_stream": view.compute_stream,
        "overlap_comm_in_config": config_value(view.config, "zero_optimization.overlap_comm"),
    }
    return [
        finding(
            OVERLAP_COMM_DISABLED.id,
            "Gradient reduction runs on the compute stream (overlap_comm off)",
            "with overlap_comm false DeepSpeed uses the default stream for reduce_and_partition_stream, so "
            "every reduce-scatter and gradient copy serializes with backward compute",
            sum(costs) / view.n_steps,
            [view.rank_id],
            steps,
            evidence,
            make_fix(view.config, {"zero_optimization.overlap_comm": True}),
            covers=iv.combine(
                iv.combine(covers, _held_first_gathers(view)),
                iv.union(st.end[on_default] - claims[on_default], st.end[on_default]),
            ),
        )
    ]


def tiny_collectives(view: RankFacts) -> list[Finding]:
    """Many collectives under 1 MiB are latency-bound: NCCL's per-call latency (tens of µs across nodes)
    dominates. ZeRO-3 issues one all-gather per fetch (partitioned_param_coordinator.py fetch_sub_module) and one
    reduce-scatter per bucket; small stage3_prefetch_bucket_size / reduce_bucket_size or many small parameters
    below stage3_param_persistence_threshold multiply them (DS #1069, #5047)."""
    g = view.gpu
    comm = view.is_comm & (g.nelems > 0) & (view.gpu_step >= 0 if len(view.model.steps) else True)
    if not comm.any():
        return []
    size, shard = _buffer_bytes(view, comm)
    idx = np.flatnonzero(comm)[size < TINY_BYTES]
    per_step = len(idx) / view.n_steps
    if per_step < TINY_PER_STEP:
        return []
    windows = iv.subtract(iv.union(g.start[idx], g.end[idx]), view.compute)
    exposed = iv.length(windows) / view.n_steps
    kinds = np.bincount(g.coll[idx].astype(np.int64), minlength=len(C.COLLECTIVES))
    main = int(np.argmax(kinds))
    settings: dict[str, Any] = {}
    if main == AG:
        cur = config_value(view.config, "zero_optimization.stage3_param_persistence_threshold") or 100_000
        settings["zero_optimization.stage3_param_persistence_threshold"] = round_size(int(cur) * 10)
    elif main == RS:
        bucket, _ = reduce_bucket_size(view)
        settings["zero_optimization.reduce_bucket_size"] = round_size(bucket * 10)
    evidence = {
        "per_step": round(per_step, 1),
        "by_collective": {C.COLLECTIVES[k]: int(n) for k, n in enumerate(kinds) if n},
        "median_bytes": int(np.median(size[size < TINY_BYTES])),
        # what a size is: the full buffer (nccl-tests' size), or an all-gather's shard where only it is known
        "sized_by": {"buffer": int((~shard[size < TINY_BYTES]).sum()), "shard": int(shard[size < TINY_BYTES].sum())},
    }
    return [
        finding(
            TINY_COLLECTIVES.id,
            f"{per_step:.0f} latency-bound collectives under 1 MiB per step",
            "each NCCL call pays a fixed launch and latency cost; fewer, larger calls move the same bytes faster",
            exposed,
            [view.rank_id],
            view.step_numbers,
            evidence,
            make_fix(view.config, settings),
            covers=windows,
        )
    ]


def _buffer_bytes(view: RankFacts, comm: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per selected collective, its size as nccl-tests and bandwidth.md count it, the full buffer: max(In, Out
    msg nelems) x element size (an all-gather's output, not its shard); and whether it is an all-gather whose
    record gives only its input (the shard, kept as it is: the record does not say the buffer). A collective of
    unknown element type counts 2 bytes an element, as the training dtype."""
    g = view.gpu
    rows = np.flatnonzero(comm)
    elem = np.array([_DTYPE_BYTES.get(view.names[d], 2) for d in g.dtype[rows].tolist()], dtype=np.int64)
    size = elem * np.maximum(g.nelems[rows], g.out_nelems[rows])
    return size, (g.coll[rows] == AG) & (g.out_nelems[rows] <= 0)


LATENCY_BOUND = 0.5  # a reduction whose rate is below this share of the large ones' is latency-bound
SMALL_PER_STEP = 16  # many of them per step


def small_reductions(view: RankFacts) -> list[Finding]:
    """Gradient buckets far below the size that fills the link: stage3.py flushes a bucket once the next gradient
    would overflow `reduce_bucket_size`, so a small bucket (or one below the gradients' size: one reduce-scatter
    per gradient) issues many reduce-scatters whose time is NCCL's per-call latency and protocol overhead, not
    the bytes (nccl-tests: busbw climbs with the message size until the link saturates). Precondition: on the
    same process group the rank has reduce-scatters of at least LARGE_BYTES (the reference: their best rate at
    their transfer time) and at least SMALL_PER_STEP per step whose rate at their transfer time (`transfer_us`,
    waiting for peers left out) is below LATENCY_BOUND of it, some of them exposed, and the configured (or seen)
    bucket is below the recommended one. Cost: per such reduction, its transfer beyond its bytes at the
    reference rate (what merging it into a large bucket saves), at most its exposed time; the windows of the
    reduce-event throttle's syncs are that finding's (facts/hostsyncs.py). Fix: the recommended bucket."""
    g = view.gpu
    rates = reduction_rates(view)
    rs, nbytes, transfer, reference, source = rates.rows, rates.nbytes, rates.transfer, rates.reference, rates.source
    if not len(rs):
        return []
    rate = nbytes[rs] / np.maximum(transfer[rs], 1e-3)  # bytes per µs at the transfer time
    small_rows: list[int] = []
    for pg, best in reference.items():
        mine = g.pg[rs] == pg
        small_rows += rs[mine & (rate < LATENCY_BOUND * best)].tolist()
    per_step = len(small_rows) / view.n_steps
    if per_step < SMALL_PER_STEP:
        return []
    bucket, bucket_src = reduce_bucket_size(view)
    params, params_src = parameter_count(view)
    target = recommended_bucket(params)
    if bucket >= target:
        return []  # the bucket is not what keeps them small (gradients flushed at the end, parameter groups)
    # the fix merges every reduction below the recommended bucket, so each one's overhead is what it saves, the
    # ones just above the latency-bound line included (the line decides that the pattern is there, not the saving)
    elements = np.maximum(g.nelems, g.out_nelems)
    small_rows = sorted(
        set(small_rows) | {int(r) for r in rs.tolist() if int(g.pg[r]) in reference and 0 < elements[r] < target}
    )
    throttle = iv.EMPTY
    sc = view.host_syncs
    for _, idx in sc.owned_by(REDUCE_THROTTLE):
        wins = [w for i in idx.tolist() for w in sc.windows[i]]
        if wins:
            throttle = iv.combine(throttle, iv.union(np.array([w[0] for w in wins]), np.array([w[1] for w in wins])))
    starts: list[float] = []
    ends: list[float] = []
    exposed_total = 0.0
    for r in small_rows:
        s, e = float(g.start[r]), float(g.end[r])
        exposed = iv.length(iv.subtract(iv.union(np.array([s]), np.array([e])), view.compute))
        exposed_total += exposed
        overhead = float(transfer[r]) - float(nbytes[r]) / reference[int(g.pg[r])]
        a, b = exposed_tail(s, e, view.compute, min(exposed, max(0.0, overhead)))
        starts += a
        ends += b
    covers = iv.subtract(iv.union(np.array(starts), np.array(ends)), throttle) if starts else iv.EMPTY
    cost = iv.length(covers) / view.n_steps
    if cost <= 0:
        return []
    small = np.array(small_rows, dtype=np.int64)
    median_bytes = int(np.median(nbytes[small]))
    median_gbps = round(float(np.median(nbytes[small] / np.maximum(transfer[small], 1e-3))) / 1e3, 3)
    large_gbps = round(max(reference.values()) / 1e3, 3)
    evidence = {
        "reduce_scatters_per_step": round(len(rs) / view.n_steps, 2),
        "latency_bound_per_step": round(per_step, 2),
        "median_bytes": median_bytes,
        "median_rate_gbps": median_gbps,
        "large_rate_gbps": large_gbps,
        "reference_from": sorted(set(source[int(pg)] for pg in reference)),
        "exposed_us_per_step": round(exposed_total / view.n_steps, 3),
        "reduce_bucket_size": bucket,
        "reduce_bucket_size_from": bucket_src,
        "parameters": params,
        "parameters_from": params_src,
    }
    why = (
        f"{per_step:.0f} reduce-scatters per step (median {median_bytes / 1e6:.2g} MB) run at "
        f"{median_gbps:.3g} GB/s against {large_gbps:.3g} GB/s for this "
        f"rank's large ones on the same group: their time is NCCL's per-call latency, not the bytes; a "
        f"{sci(target)}-element reduce_bucket_size (now {sci(bucket)}) merges them into few large calls"
    )
    return [
        finding(
            SMALL_REDUCTIONS.id,
            "Gradients are reduced in many small latency-bound reduce-scatters",
            why,
            cost,
            [view.rank_id],
            view.steps_of_rows(small),
            evidence,
            make_fix(view.config, {"zero_optimization.reduce_bucket_size": target}),
            covers=covers,
        )
    ]


def reduce_transfer_bound(view: RankFacts) -> list[Finding]:
    """Gradient reductions still queued when backward compute ended: issued in time (each started more than
    STARVED_LAUNCH_US after its launch, behind the reductions before it on its stream) but run back to back, so at
    the measured bandwidth they outlast the compute beside them. Their transfer at the best rate this rank
    measured (facts/coverage.py `transfer_us`) is a limit of the hardware; the last bucket's is inherent, and the
    rest of each kernel (waiting for peers) is neither."""
    g = view.gpu
    transfer = transfer_us(view)
    starts: list[float] = []
    ends: list[float] = []
    rows_per_step: list[int] = []
    for tail in gradient_tails(view):
        rows = tail.rows[(tail.rows != tail.last) & (g.start[tail.rows] - view.launch[tail.rows] > STARVED_LAUNCH_US)]
        rows_per_step.append(len(rows))
        starts += np.maximum(tail.after, g.end[rows] - transfer[rows]).tolist()
        ends += g.end[rows].tolist()
    if not starts:
        return []
    covers = iv.subtract(iv.union(np.array(starts), np.array(ends)), view.compute)
    fp32 = fp32_reductions(view)
    if fp32 is not None:  # the part the training dtype would save is fp32-communication's, not a limit
        covers = iv.subtract(covers, fp32.saved)
    cost = iv.length(covers) / view.n_steps
    if cost <= 0:
        return []
    evidence = {
        "queued_reductions_per_step": round(sum(rows_per_step) / view.n_steps, 2),
        "exposed_transfer_us_per_step": round(cost, 3),
    }
    return [
        finding(
            REDUCE_TRANSFER_BOUND.id,
            "Gradient reductions outlast the backward compute at this bandwidth",
            "the reductions were issued in time but ran back to back on their stream, so some were still queued "
            "when backward compute ended; their transfer at the best rate measured here is a limit of the "
            "bandwidth, not of the schedule: fewer bytes would shorten it (communication_data_type bf16 where it is "
            "fp32, zero_quantized_gradients)",
            cost,
            [view.rank_id],
            view.step_numbers,
            evidence,
            covers=covers,
        )
    ]


DEFERRED = Rule("reduce-scatter-deferred", reduce_scatter_deferred, explains=("epilogue-sync",), blame=exposed_blames)
OVERLAP_COMM_DISABLED = Rule(
    "overlap-comm-disabled", overlap_comm_disabled, explains=("epilogue-sync",), blame=exposed_blames
)
# the reductions' transfer itself outlasts backward: no schedule fix; ranked after the causes
REDUCE_TRANSFER_BOUND = Rule(
    "reduce-transfer-bound", reduce_transfer_bound, severity_cap="info", limit=True, blame=exposed_blames
)
TINY_COLLECTIVES = Rule("tiny-collectives", tiny_collectives, severity_cap="warning", blame=exposed_blames)
# latency-bound buckets: what merging them saves; tiny-collectives counts the same exposed reduce-scatters whole
SMALL_REDUCTIONS = Rule("small-reductions", small_reductions, explains=("tiny-collectives",), blame=exposed_blames)
