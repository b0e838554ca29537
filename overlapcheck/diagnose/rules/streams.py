"""Stream-level serialization: no concurrency at all across streams, and all-gather and reduce-scatter sharing
one NCCL communicator."""

from __future__ import annotations

import numpy as np

from overlapcheck.analysis import intervals as iv
from overlapcheck.diagnose.facts.concurrency import (
    concurrency,
    hardware_serialized,
    reduce_scatter_tail_delay,
    reduce_scatter_tail_windows,
    serialization,
)
from overlapcheck.diagnose.facts.view import RankFacts
from overlapcheck.diagnose.facts.waitsites import WAIT_CALL, WAIT_RECORD
from overlapcheck.diagnose.finding import config_value, finding, make_fix
from overlapcheck.diagnose.locators import exposed_blames
from overlapcheck.diagnose.rule import Rule
from overlapcheck.model import Finding


def same_communicator(view: RankFacts) -> list[Finding]:
    """NCCL serializes all kernels of one communicator through comm->sharedRes->deviceStream (NVIDIA/nccl
    src/enqueue.cc), whatever user streams they are launched on. ZeRO-3 normally all-gathers on the world group
    (partition_parameters.py zero.Init) and reduce-scatters on groups._clone_world_group(); with a Megatron mpu
    both use mpu.get_data_parallel_group(), one communicator, so an all-gather queues behind a reduce-scatter.
    Cost: compute stalls on all-gathers that queued behind a reduce-scatter, plus how much later the step's last
    reduce-scatter (which the backward epilogue waits for) ends because reduce-scatters queued behind
    all-gathers."""
    pg = view.shared_communicator
    if pg is None or hardware_serialized(view):
        return []
    st = view.stalls
    delays = view.claimed_by_communicator
    stall_cost, steps = view.per_step(delays, view.launch[st.kernel]) if len(delays) else (0.0, [])
    charged = delays > 0
    tail = reduce_scatter_tail_delay(view, pg)
    cost = stall_cost + tail
    per_node = view.job.gpus_per_node
    settings = {"zero_optimization.zero_hpz_partition_size": int(per_node)} if per_node and per_node > 1 else {}
    evidence = {
        "process_group": pg,
        "delayed_all_gathers_per_step": round(float((delays > 0).sum()) / view.n_steps, 2),
        "compute_stall_us_per_step": round(stall_cost, 3),
        "reduce_scatter_tail_delay_us_per_step": round(tail, 3),
        "hpz_partition_size": config_value(view.config, "zero_optimization.zero_hpz_partition_size"),
    }
    return [
        finding(
            SAME_COMMUNICATOR.id,
            f"All-gather and reduce-scatter share communicator {pg!r}",
            "NCCL runs one communicator's kernels one at a time, so all-gathers wait behind "
            "reduce-scatters; hpZ (zero_hpz_partition_size = GPUs per node) gathers on a separate "
            "intra-node group",
            cost,
            [view.rank_id],
            steps or view.step_numbers,
            evidence,
            make_fix(view.config, settings),
            # the stalls it charges, and how much later the last reduce-scatters end
            covers=iv.combine(iv.union(st.start[charged], st.end[charged]), reduce_scatter_tail_windows(view, pg)),
        )
    ]


def no_stream_concurrency(view: RankFacts) -> list[Finding]:
    """With CUDA_DEVICE_MAX_CONNECTIONS=1 the GPU has one hardware queue, so kernels of all streams execute in
    launch order (Megatron-LM #1468, verl #6976); CUDA_LAUNCH_BLOCKING=1 makes every launch synchronous. Either
    way no collective overlaps compute: the compute stream stalls behind communication launched before it.

    No concurrency alone is a symptom: explicit dependencies (every collective waited for with
    `cudaStreamWaitEvent` before the next compute launch) or a host that launches each kernel after the previous
    one ended serialize streams too. The finding needs the queue's own signature (facts/concurrency.py
    `Serialization`): the serializations no wait explains (compute stalls behind earlier-launched work,
    collectives held behind earlier-launched compute) outnumber the stalls the waits explain and cost compute
    time; or the job's environment sets a serializing variable. Serialization that the waits explain is the
    waits' (cross-stream-wait).
    Cost: the compute-stream stalls, except the part of each step's first all-gather that compute waits for in
    any configuration (all of it when the host issued it after the earlier compute ended)."""
    if not hardware_serialized(view):
        return []
    st = view.stalls
    inherent = view.first_gather_waits
    costs = np.maximum(
        0.0,
        st.cost
        - np.array(
            [iv.length(iv.clip(inherent, a, b)) for a, b in zip(st.start.tolist(), st.end.tolist(), strict=True)]
        ),
    )
    cost, steps = view.per_step(costs, view.launch[st.kernel])
    both, total, n = concurrency(view)
    ser = serialization(view)
    evidence = {
        "streams": n,
        "concurrent_us": round(both, 3),
        "busy_us_all_streams": round(total, 3),
        "stalls_per_step": round(len(st.kernel) / view.n_steps, 2),
        "stalls_without_wait": ser.unexplained_stalls,
        "stalls_after_wait": ser.explained_stalls,
        "collectives_held_without_wait": ser.unexplained_held,
        "collectives_held_after_wait": ser.explained_held,
        "unexplained_stall_us_per_step": ser.unexplained_cost_us,
        # kernels that started only after every kernel launched before them (any stream) had ended
        "in_launch_order_share": ser.launch_order,
        # the explicit-wait events the trace has (what was looked for: cudaStreamWaitEvent, Stream Wait Event)
        "wait_evidence": [n for n in (WAIT_CALL, WAIT_RECORD) if view.model.name_index(n) >= 0],
        "env": dict(ser.env) or None,
    }
    if ser.env:
        why = (
            "the job sets " + ", ".join(f"{k}={v}" for k, v in ser.env.items()) + ": kernels execute in launch "
            "order across streams, so communication blocks the compute launched after it"
        )
    else:
        why = (
            f"kernels execute in launch order across streams, the signature of CUDA_DEVICE_MAX_CONNECTIONS=1 (or "
            f"CUDA_LAUNCH_BLOCKING=1): {_share(ser.launch_order)}{ser.unexplained_stalls} compute stalls behind "
            "earlier-launched work (no wait issued after the work that released them) and "
            f"{ser.unexplained_held} collectives held behind earlier-launched compute had no {WAIT_CALL} "
            f"({WAIT_RECORD}) behind them, against {ser.explained} stalls that the program's waits explain"
        )
    charged = costs > 0
    return [
        finding(
            NO_STREAM_CONCURRENCY.id,
            f"No two of the {n} GPU streams ever run at the same time",
            why,
            cost,
            [view.rank_id],
            steps,
            evidence,
            make_fix(view.config, env=_serializing_env(view)),
            covers=iv.subtract(iv.union(st.start[charged], st.end[charged]), inherent),
        )
    ]


def _share(share: float | None) -> str:
    if share is None:
        return ""
    return f"{share:.0%} of the kernels started only after every kernel launched before them on any stream had ended; "


def _serializing_env(view: RankFacts) -> dict[str, str | None]:
    """The variables to unset: those of the job's environment (when the job context records it) that
    serialize streams, else CUDA_DEVICE_MAX_CONNECTIONS, the usual one (Megatron-style launch scripts set it)."""
    found: dict[str, str | None] = dict.fromkeys(serialization(view).env, None)
    return found or {"CUDA_DEVICE_MAX_CONNECTIONS": None}


SAME_COMMUNICATOR = Rule("same-communicator", same_communicator, explains=("epilogue-sync",), blame=exposed_blames)
NO_STREAM_CONCURRENCY = Rule(
    "no-stream-concurrency", no_stream_concurrency, explains=("epilogue-sync",), blame=exposed_blames
)
