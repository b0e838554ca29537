"""Stream-level serialization: no concurrency at all across streams, and all-gather and reduce-scatter sharing
one NCCL communicator."""

from __future__ import annotations

from typing import Any

import numpy as np

from overlapcheck.analysis import intervals as iv
from overlapcheck.diagnose.context import RankView
from overlapcheck.diagnose.finding import config_value, finding, make_fix
from overlapcheck.diagnose.registry import rank_rule
from overlapcheck.diagnose.sizing import AG, RS
from overlapcheck.diagnose.waits import DEPENDENCY_TOLERANCE_US, Stalls, stalls

CONCURRENT_SHARE = 0.002  # below this share of busy time with two streams active, streams never overlap


def concurrency(view: RankView) -> tuple[float, float, int]:
    """(time with at least two streams busy, total per-stream busy time, streams with activity)."""
    g = view.gpu
    streams = np.unique(g.stream)
    per_stream = sum(iv.length(iv.union(g.start[g.stream == s], g.end[g.stream == s])) for s in streams.tolist())
    return per_stream - iv.length(iv.union(g.start, g.end)), per_stream, len(streams)


def no_concurrency(view: RankView) -> bool:
    """Several streams carry work, communication among it, yet no two streams ever run at once."""
    if "_no_concurrency" not in view.__dict__:
        both, total, n = concurrency(view)
        comm_elsewhere = (view.is_comm & (view.gpu.stream != view.compute_stream)).any()
        view.__dict__["_no_concurrency"] = bool(
            n >= 2 and comm_elsewhere and total > 0 and both <= CONCURRENT_SHARE * total
        )
    return view.__dict__["_no_concurrency"]


def serialized_delay(view: RankView, st: Stalls) -> np.ndarray:
    """For each stall: how long its collective waited behind a collective of another kind on the same
    communicator (it started as that one ended, later than its stream let it)."""
    g = view.gpu
    out = np.zeros(len(st.kernel))
    comm = np.flatnonzero(view.is_comm & (g.pg >= 0))
    if not len(comm):
        return out
    comm = comm[np.argsort(g.end[comm], kind="stable")]
    stream_end = _previous_end_on_stream(view)
    for n, c in enumerate(st.comm.tolist()):
        if c < 0 or g.pg[c] < 0:
            continue
        a = np.searchsorted(g.end[comm], g.start[c] - DEPENDENCY_TOLERANCE_US, side="left")
        b = np.searchsorted(g.end[comm], g.start[c] + DEPENDENCY_TOLERANCE_US, side="right")
        near = comm[a:b]
        if not ((g.pg[near] == g.pg[c]) & (g.coll[near] != g.coll[c])).any():
            continue
        ready = max(float(view.launch[c]), float(stream_end[c]))
        out[n] = max(0.0, float(g.start[c]) - ready)
    return out


def _previous_end_on_stream(view: RankView) -> np.ndarray:
    """End of the activity before each one on its own stream (-inf for the first)."""
    g = view.gpu
    order = np.lexsort((g.start, g.stream))
    prev = np.full(len(g), -np.inf)
    same = g.stream[order][1:] == g.stream[order][:-1]
    ends = g.end[order][:-1]
    prev[order[1:][same]] = ends[same]
    return prev


def claimed_by_specific(view: RankView, st: Stalls) -> np.ndarray:
    """Stall cost owned by the same-communicator rule (before the all-gather and generic wait rules)."""
    if not shared_communicator(view):
        return np.zeros(len(st.kernel))
    return np.minimum(st.cost, serialized_delay(view, st))


def shared_communicator(view: RankView) -> str | None:
    """The process group name that carries both all-gathers and reduce-scatters, if any."""
    g = view.gpu
    ag = set(g.pg[view.is_comm & (g.coll == AG) & (g.pg >= 0)].tolist())
    rs = set(g.pg[view.is_comm & (g.coll == RS) & (g.pg >= 0)].tolist())
    both = sorted(ag & rs)
    return view.names[both[0]] if both else None


def reduce_scatter_tail_delay(view: RankView, pg: str) -> float:
    """Per step: end of the last reduce-scatter minus its end when its stream is replayed without the waits
    behind all-gathers of the same communicator (other activities keep any wait that was not their stream)."""
    g = view.gpu
    pg_index = view.model.name_index(pg)
    rs = view.is_comm & (g.coll == RS) & (g.pg == pg_index)
    total = 0.0
    for stream in np.unique(g.stream[rs]).tolist():
        rows = np.flatnonzero(g.stream == stream)
        rows = rows[np.argsort(g.start[rows], kind="stable")]
        ag_ends = np.sort(g.end[view.is_comm & (g.coll == AG) & (g.pg == pg_index)])
        prev_obs, prev_new = -np.inf, -np.inf
        gain: dict[int, float] = {}
        for r in rows.tolist():
            start = float(g.start[r])
            behind_ag = rs[r] and _ends_at(ag_ends, start)
            held_elsewhere = start > prev_obs + DEPENDENCY_TOLERANCE_US and not behind_ag
            ready = start if held_elsewhere else float(view.launch[r])
            new_start = max(ready, prev_new)
            prev_obs, prev_new = float(g.end[r]), new_start + float(g.end[r] - g.start[r])
            if rs[r]:
                gain[int(view.gpu_step[r])] = float(g.end[r]) - prev_new  # the step's last one wins
        total += sum(max(0.0, v) for k, v in gain.items() if k >= 0 or not len(view.model.steps))
    return total / view.n_steps


def _ends_at(sorted_ends: np.ndarray, t: float) -> bool:
    i = np.searchsorted(sorted_ends, t)
    near = [sorted_ends[j] for j in (i - 1, i) if 0 <= j < len(sorted_ends)]
    return any(abs(e - t) <= DEPENDENCY_TOLERANCE_US for e in near)


@rank_rule
def same_communicator(view: RankView) -> list[dict[str, Any]]:
    """NCCL serializes all kernels of one communicator through comm->sharedRes->deviceStream (NVIDIA/nccl
    src/enqueue.cc), whatever user streams they are launched on. ZeRO-3 normally all-gathers on the world group
    (partition_parameters.py zero.Init) and reduce-scatters on groups._clone_world_group(); with a Megatron mpu
    both use mpu.get_data_parallel_group(), one communicator, so an all-gather queues behind a reduce-scatter.
    Cost: compute stalls on all-gathers that queued behind a reduce-scatter, plus how much later the step's last
    reduce-scatter (which the backward epilogue waits for) ends because reduce-scatters queued behind
    all-gathers."""
    pg = shared_communicator(view)
    if pg is None or no_concurrency(view):
        return []
    st = stalls(view)
    delays = claimed_by_specific(view, st)
    stall_cost, steps = view.per_step(delays, view.launch[st.kernel]) if len(delays) else (0.0, [])
    tail = reduce_scatter_tail_delay(view, pg)
    cost = stall_cost + tail
    job = (view.config or {}).get("_overlapcheck_job") or {}
    per_node = job.get("gpus_per_node") if isinstance(job, dict) else None
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
            "same-communicator",
            f"All-gather and reduce-scatter share communicator {pg!r}",
            "NCCL runs one communicator's kernels one at a time, so all-gathers wait behind "
            "reduce-scatters; hpZ (zero_hpz_partition_size = GPUs per node) gathers on a separate "
            "intra-node group",
            cost,
            [view.rank_id],
            steps or view.step_numbers,
            evidence,
            make_fix(view.config, settings),
        )
    ]


@rank_rule
def no_stream_concurrency(view: RankView) -> list[dict[str, Any]]:
    """With CUDA_DEVICE_MAX_CONNECTIONS=1 the GPU has one hardware queue, so kernels of all streams execute in
    launch order (Megatron-LM #1468, verl #6976); CUDA_LAUNCH_BLOCKING=1 makes every launch synchronous. Either
    way no collective overlaps compute: the compute stream stalls behind communication launched before it.
    Cost: those stalls, except the part of each step's first all-gather that compute waits for in any
    configuration (all of it when the host issued it after the earlier compute ended)."""
    if not no_concurrency(view):
        return []
    st = stalls(view)
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
    evidence = {
        "streams": n,
        "concurrent_us": round(both, 3),
        "busy_us_all_streams": round(total, 3),
        "stalls_per_step": round(len(st.kernel) / view.n_steps, 2),
    }
    return [
        finding(
            "no-stream-concurrency",
            f"No two of the {n} GPU streams ever run at the same time",
            "kernels execute in launch order across streams, the signature of CUDA_DEVICE_MAX_CONNECTIONS=1 "
            "(or CUDA_LAUNCH_BLOCKING=1): communication blocks the compute launched after it",
            cost,
            [view.rank_id],
            steps,
            evidence,
            make_fix(view.config, env=_serializing_env(view)),
        )
    ]


SERIALIZING_ENV = {"CUDA_DEVICE_MAX_CONNECTIONS": "1", "CUDA_LAUNCH_BLOCKING": "1"}


def _serializing_env(view: RankView) -> dict[str, None]:
    """The variables to unset: those of the job's environment (when the manifest or config lists it) that
    serialize streams, else CUDA_DEVICE_MAX_CONNECTIONS, the usual one (Megatron-style launch scripts set it)."""
    job = (view.config or {}).get("_overlapcheck_job")
    env = job.get("env") if isinstance(job, dict) else None
    if isinstance(env, dict):
        found = {k: None for k, v in SERIALIZING_ENV.items() if str(env.get(k, "")) == v}
        if found:
            return found
    return {"CUDA_DEVICE_MAX_CONNECTIONS": None}
