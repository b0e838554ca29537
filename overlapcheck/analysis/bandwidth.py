"""Bytes and bandwidth of the collectives, and how much of the exposed communication a schedule could hide at
the measured bandwidth. Definitions: docs/metrics.md (Bandwidth, Hideability), after nccl-tests
(PERFORMANCE.md) and ../shared/knowledge/bandwidth.md.

Per rank (`rank_bandwidth`, where the TraceModel is held): each collective's bytes from its kernel's
`In msg nelems` / `Out msg nelems` / `dtype`, its group size, and per kind the bytes per step and the busbw of
its kernels. Across ranks (`job_bandwidth`, where every rank's result meets): the transfer time of each
collective (its shortest duration across ranks), the wait (the rest), busbw at the transfer time, and the
hideability per phase.
"""

from __future__ import annotations

import re
import statistics
from array import array
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from overlapcheck.analysis.activities import PHASES, Activities
from overlapcheck.job import JobContext, Network
from overlapcheck.model import (
    JobBandwidth,
    JobKindBandwidth,
    KindBandwidth,
    PhaseHideability,
    RankMetrics,
    RankResult,
)
from overlapcheck.trace import classify as C
from overlapcheck.trace.model import TraceModel
from overlapcheck.trace.reader import world_of

GB = 1e9  # GB/s = 1e9 bytes per second, as nccl-tests prints it
DTYPE_BYTES = {
    "BFloat16": 2,
    "Half": 2,
    "Float": 4,
    "Double": 8,
    "Long": 8,
    "Int": 4,
    "Char": 1,
    "Byte": 1,
    "Bool": 1,
    "Short": 2,
    "Float8_e4m3fn": 1,
    "Float8_e5m2": 1,
}
# NVLink peak per GPU and per direction (GB/s), by GPU model named in deviceProperties (bandwidth.md)
NVLINK_PEAKS = (
    (re.compile(r"\bH(100|200|800)\b"), "NVLink 4", 450.0),
    (re.compile(r"\bA(100|800)\b"), "NVLink 3", 300.0),
)
INTRA, INTER = "intra-node", "inter-node"


def bus_factor(kind: str, n: int) -> float:
    """busbw / algbw (nccl-tests): 2(n-1)/n for all-reduce, (n-1)/n for reduce-scatter and all-gather (and
    all-to-all), 1 for broadcast, send/recv and the rest."""
    if n < 1:
        return 1.0
    if kind == "all_reduce":
        return 2.0 * (n - 1) / n
    if kind in ("reduce_scatter", "all_gather", "all_to_all"):
        return (n - 1) / n
    return 1.0


def message_bytes(model: TraceModel) -> np.ndarray:
    """Per GPU activity, the collective's size in bytes (max(in, out) x element size), -1 when unknown. An
    all-gather known only by its input (the `Input Dims` of its nccl:* op in traces without record_param_comms
    sizes, torch < 2.1) is its shard: the output is the shard x the group size."""
    g = model.gpu
    if not len(g):
        return np.zeros(0, dtype=np.int64)
    sizes = np.array([DTYPE_BYTES.get(model.name(d), -1) if d >= 0 else -1 for d in range(-1, len(model.names))])
    elem = sizes[g.dtype + 1]
    n = np.maximum(g.nelems, g.out_nelems)
    shard = (g.coll == C.COLLECTIVES.index("all_gather")) & (g.out_nelems < 0) & (g.nelems > 0)
    if shard.any():
        groups = group_sizes(model)
        n = np.where(shard & (groups > 0), g.nelems * np.maximum(groups, 1), n)
    ok = (g.cls == C.COMM) & (n > 0) & (n < 1 << 52) & (elem > 0)  # a larger count is not a real message
    return np.where(ok, np.where(ok, n, 0) * elem, -1).astype(np.int64)


def group_sizes(model: TraceModel) -> np.ndarray:
    """Per GPU activity, the size of its process group: the kernel's `Group size`, else the group's `pg_size` in
    distributedInfo.pg_config, else the world size; -1 when none is known. A `Group size` above the world size is
    taken as absent (`oversized_groups_note`)."""
    g = model.gpu
    info = model.distributed
    by_pg: dict[int, int] = {}
    for entry in info.get("pg_config") or []:
        if isinstance(entry, dict) and _count(entry.get("pg_size")) > 0:
            i = model.name_index(str(entry.get("pg_name")))
            if i >= 0:
                by_pg[i] = entry["pg_size"]
    world = world_of(model) or -1
    out = g.group.astype(np.int64).copy()
    missing = (out <= 0) | ((world > 0) & (out > world))  # a group larger than the world is no group size
    if missing.any():
        out[missing] = [by_pg.get(int(p), world) for p in g.pg[missing].tolist()]
    return out


def _count(value: object) -> int:
    """A group or world size as the trace states it, -1 when it is not a plausible one (not an int, < 1, huge)."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 < value < 1 << 31:
        return value
    return -1


def gpu_model(model: TraceModel) -> str | None:
    props = model.metadata.get("deviceProperties")
    if isinstance(props, list) and props and isinstance(props[0], dict) and isinstance(props[0].get("name"), str):
        return str(props[0]["name"])
    return None


def nvlink_peak(device: str | None) -> tuple[float, str] | None:
    for pattern, generation, gbps in NVLINK_PEAKS:
        if device and pattern.search(device):
            return gbps, f"{generation} ({device}), per GPU and direction"
    return None


def _peak(
    scope: str | None, device: str | None, network: Network | None, per_node: int | None
) -> tuple[float, str] | None:
    if scope == INTRA:
        return nvlink_peak(device)
    if scope == INTER and network is not None and per_node:
        return network.per_gpu_gbps(per_node), f"--network {network.spec}: the node's links / {per_node} GPUs"
    return None


def group_scope(model: TraceModel, pg: int, hosts: dict[int, str]) -> str | None:
    """Intra- or inter-node for the process group `pg` (a name index): its ranks from distributedInfo.pg_config
    (`ranks`), each one's host from `hosts`; None when the group's ranks or any of their hosts are unknown."""
    if pg < 0:
        return None
    name = model.name(pg)
    for entry in model.distributed.get("pg_config") or []:
        if isinstance(entry, dict) and str(entry.get("pg_name")) == name:
            ranks = entry.get("ranks")
            if not isinstance(ranks, list) or not ranks:
                return None
            if not all(isinstance(r, int) and r in hosts for r in ranks):
                return None
            return INTRA if len({hosts[r] for r in ranks}) == 1 else INTER
    return None


def own_hosts(model: TraceModel, job: JobContext | None = None) -> dict[int, str]:
    """Rank -> host as one rank knows it: the run manifest's hosts, and its own host from the trace."""
    hosts = dict(job.hosts) if job is not None else {}
    rank, host = model.distributed.get("rank"), model.metadata.get("host_name")
    if isinstance(rank, int) and not isinstance(rank, bool) and isinstance(host, str) and host:
        hosts[rank] = host
    return hosts


def rank_bandwidth(
    model: TraceModel, acts: Activities, hosts: dict[int, str] | None = None
) -> dict[str, KindBandwidth]:
    """Per collective kind with at least one kernel of known size: KindBandwidth (docs/metrics.md). Its scope:
    intra-node for a group of one rank; for a group whose ranks distributedInfo.pg_config lists, from `hosts`
    (rank -> host) when every one of them has a host. The rest of the scope and the peak need the other ranks'
    placement: `with_topology` sets them where the ranks meet."""
    if acts.lanes != "gpu" or not len(model.gpu):
        return {}
    g = model.gpu
    nbytes, groups = message_bytes(model), group_sizes(model)
    dur = g.end - g.start
    sized = (nbytes > 0) & (dur > 0)
    n_steps = len(model.steps)
    in_step = acts.step >= 0
    device = gpu_model(model)
    out = {}
    for k, kind in enumerate(C.COLLECTIVES):
        sel = sized & (g.coll == k)
        if not sel.any():
            continue
        b, d, n = nbytes[sel], dur[sel], groups[sel]
        algbw = b / d * 1e6 / GB
        factors = np.array([bus_factor(kind, int(x)) if x > 0 else np.nan for x in n.tolist()])
        busbw = algbw * factors
        known = busbw[np.isfinite(busbw)]
        size_values, counts = np.unique(n, return_counts=True)
        size = int(size_values[np.argmax(counts)])
        pg_values, pg_counts = np.unique(g.pg[sel], return_counts=True)
        scope = INTRA if size == 1 else group_scope(model, int(pg_values[np.argmax(pg_counts)]), hosts or {})
        total = float(nbytes[sel & in_step].sum()) / n_steps if n_steps else float(b.sum())
        out[kind] = KindBandwidth(
            count=int(sel.sum()),
            group_size=size if size > 0 else None,
            bytes_per_step=total,
            algbw_gbps=float(np.median(algbw)),
            busbw_gbps=float(np.median(known)) if len(known) else None,
            busbw_min_gbps=float(known.min()) if len(known) else None,
            busbw_max_gbps=float(known.max()) if len(known) else None,
            scope=scope,
            gpu=device,
        )
    return out


def with_topology(results: Sequence[RankResult], job: JobContext | None = None) -> list[RankResult]:
    """Every rank's KindBandwidth with its scope and peak (docs/metrics.md, Topology), from where the ranks are:
    their hosts (distributedInfo / metadata, else the run manifest's `ranks[].host`) when every rank of the world
    has one, else rank // GPUs per node when the job states GPUs per node. A kind whose group is one rank is
    intra-node; one whose group is the whole world spans the nodes the world does; any other group keeps the
    scope its rank found from the group's ranks (pg_config) and their hosts (`rank_bandwidth`), else unknown.
    Peaks: NVLink of the rank's GPU model (intra-node), `--network`'s per-GPU share (inter-node)."""
    job = job or JobContext()
    worlds = [r.metrics.world_size for r in results if r.metrics.world_size]
    world = max(worlds) if worlds else len(results)
    hosts = {r.metrics.rank: r.metrics.host for r in results if r.metrics.rank is not None and r.metrics.host}
    hosts = {**{rank: host for rank, host in job.hosts.items() if rank < world}, **hosts}
    nodes: int | None = None
    per_node = job.gpus_per_node
    if world and len(hosts) == world and set(hosts) == set(range(world)):
        nodes = len(set(hosts.values()))
        per_node = per_node or (world // nodes if world % nodes == 0 else None)
    elif per_node:
        nodes = -(-world // per_node)
    out = []
    for r in results:
        if not r.metrics.bandwidth:
            out.append(r)
            continue
        kinds = {}
        for kind, b in r.metrics.bandwidth.items():
            scope = INTRA if b.group_size == 1 else None
            if scope is None and nodes is not None and b.group_size == world:
                scope = INTRA if nodes == 1 else INTER
            scope = scope or b.scope
            peak = _peak(scope, b.gpu, job.network, per_node)
            kinds[kind] = replace(b, scope=scope, peak_gbps=peak[0] if peak else None, peak=peak[1] if peak else None)
        out.append(replace(r, metrics=replace(r.metrics, bandwidth=kinds)))
    return out


# -- across ranks -----------------------------------------------------------------------------------------------


def transfer_times(results: Sequence[RankResult]) -> dict[str, float]:
    """Collective key -> its transfer time: the shortest duration of that collective over the ranks, for the
    collectives that every rank with a signature ran."""
    sigs = [r.signature for r in results if r.signature is not None]
    if len(sigs) < 2:
        return {}
    shortest: dict[str, float] = {}  # a running minimum and count per key, not every rank's durations at once
    seen: dict[str, int] = {}
    for sig in sigs:
        for key, d in zip(sig.keys, sig.dur, strict=True):
            shortest[key] = min(shortest.get(key, d), d)
            seen[key] = seen.get(key, 0) + 1
    return {key: d for key, d in shortest.items() if seen[key] == len(sigs)}


def _transfer_fraction(result: RankResult, transfer: dict[str, float]) -> float:
    """The share of one rank's collective kernel time that is transfer (1 without other ranks to compare)."""
    sig = result.signature
    if sig is None or not transfer:
        return 1.0
    own = sum(d for k, d, inside in zip(sig.keys, sig.dur, sig.in_step, strict=True) if k in transfer and inside)
    moved = sum(transfer[k] for k, inside in zip(sig.keys, sig.in_step, strict=True) if k in transfer and inside)
    return moved / own if own > 0 else 1.0


def hideability(metrics: RankMetrics, fraction: float = 1.0) -> dict[str, PhaseHideability]:
    """Per phase, per step (mean over steps), for each class of collectives (a collective kind): its transfer
    time (its communication time x `fraction`, the rank's transfer share) against the compute beside it. The
    floor of the phase = min(exposed, max over classes of max(0, transfer − compute)): classes on separate
    communicators can run beside each other, so only the most demanding one is a floor no schedule removes (a
    lower bound: classes that share the links add up in reality). `transfer_us` is that class's. The optimizer
    phase's collectives (the end-of-backward epilogue) count with the backward phase: the gradients they reduce
    come from backward compute, and only the schedule puts them after it."""
    steps = [s for s in metrics.steps if s.phases]
    if not steps:
        return {}
    out = {}
    for phase in ("forward", "backward"):
        sources = ("backward", "optimizer") if phase == "backward" else (phase,)
        compute = statistics.fmean(s.phases[phase].compute_us for s in steps if phase in s.phases)
        exposed = statistics.fmean(
            sum(s.phases[p].collectives["all"].exposed_us for p in sources if p in s.phases) for s in steps
        )
        transfer = max(
            statistics.fmean(
                sum(s.phases[p].collectives[kind].time_us for p in sources if p in s.phases) for s in steps
            )
            * fraction
            for kind in C.COLLECTIVES
        )
        floor = min(exposed, max(0.0, transfer - compute))
        out[phase] = PhaseHideability(compute, transfer, exposed, floor, exposed - floor)
    return out


def _kind_of(key: str) -> str:
    """The collective kind of a signature key (`<process group>|<kind>|<n-th>`), "" when it names none."""
    parts = key.split("|")
    return parts[1] if len(parts) > 1 else ""


def job_bandwidth(results: Sequence[RankResult], job: JobContext | None = None) -> JobBandwidth | None:
    """The BANDWIDTH object of the report (docs/report-schema.md); None when no rank has communication."""
    job = job or JobContext()
    ranks = [r for r in results if r.metrics.collectives["all"].count]
    if not ranks:
        return None
    transfer = transfer_times(ranks)
    kinds: dict[str, JobKindBandwidth] = {}
    n_ranks = max(1, len([r for r in ranks if r.signature is not None]))
    # one pass over the signatures: per kind, each collective key (in the order the ranks first show it) -> its
    # bytes and group size as the first rank states them, and every rank's duration of it inside a step
    # (the durations as arrays: 8 bytes a number, not a float object, with every rank's at once)
    by_kind: dict[str, dict[str, tuple[int, int, array[float]]]] = {kind: {} for kind in C.COLLECTIVES}
    matched_of = {key: by_kind.get(_kind_of(key)) for key in transfer}  # each key split once per job
    steps = 0
    for r in ranks:
        sig = r.signature
        if sig is None or not sig.bytes:
            continue
        steps = max(steps, sig.steps)
        for key, d, b, n, inside in zip(sig.keys, sig.dur, sig.bytes, sig.group, sig.in_step, strict=True):
            if inside and (into := matched_of.get(key)) is not None:
                into.setdefault(key, (b, n, array("d")))[2].append(d)
    per_step = max(1, steps)
    for kind in C.COLLECTIVES:
        per_rank = [r.metrics.bandwidth[kind] for r in ranks if kind in r.metrics.bandwidth]
        matched = by_kind[kind]
        if not matched and not per_rank:
            continue
        busbw = [
            b / transfer[key] * 1e6 / GB * bus_factor(kind, n)
            for key, (b, n, _) in matched.items()
            if b > 0 and n > 0 and transfer[key] > 0
        ]
        moved = sum(transfer[key] for key in matched)
        waited = sum(sum(d - transfer[key] for d in ds) for key, (_, _, ds) in matched.items()) / n_ranks
        scope = next((k.scope for k in per_rank if k.scope), None)
        peak = next(((k.peak_gbps, k.peak) for k in per_rank if k.peak_gbps is not None), (None, None))
        kinds[kind] = JobKindBandwidth(
            collectives=len(matched),
            bytes_per_step=statistics.median(k.bytes_per_step for k in per_rank) if per_rank else 0.0,
            transfer_us_per_step=moved / per_step if matched else None,
            wait_us_per_step=waited / per_step if matched else None,
            busbw_gbps=statistics.median(busbw) if busbw else None,
            busbw_min_gbps=min(busbw) if busbw else None,
            busbw_max_gbps=max(busbw) if busbw else None,
            scope=scope,
            peak_gbps=peak[0],
            peak=peak[1],
        )
    per_phase = [hideability(r.metrics, _transfer_fraction(r, transfer)) for r in ranks]
    phases: dict[str, PhaseHideability] = {}
    for phase in PHASES:
        values = [h[phase] for h in per_phase if phase in h]
        if values:
            exposed = statistics.median(v.exposed_us for v in values)
            floor = min(exposed, statistics.median(v.floor_us for v in values))
            phases[phase] = PhaseHideability(
                compute_us=statistics.median(v.compute_us for v in values),
                transfer_us=statistics.median(v.transfer_us for v in values),
                exposed_us=exposed,
                floor_us=floor,
                schedulable_us=exposed - floor,
            )
    return JobBandwidth(
        kinds=kinds,
        hideability=phases,
        floor_us=sum(p.floor_us for p in phases.values()),
        schedulable_us=sum(p.schedulable_us for p in phases.values()),
        network=job.network.to_dict(job.gpus_per_node) if job.network is not None else None,
    )


def with_bandwidth(model: TraceModel, metrics: RankMetrics, job: JobContext | None = None) -> RankMetrics:
    """`metrics` with its `bandwidth` (per collective kind) filled in; `job`'s run manifest gives the hosts of
    the other ranks."""
    from overlapcheck.analysis.activities import activities_of

    if not metrics.collectives["all"].count or metrics.lanes != "gpu":
        return metrics
    note = oversized_groups_note(model)
    notes = [*metrics.notes, note] if note else metrics.notes
    return replace(metrics, bandwidth=rank_bandwidth(model, activities_of(model), own_hosts(model, job)), notes=notes)


def oversized_groups_note(model: TraceModel) -> str | None:
    """A note when communication kernels state a `Group size` larger than the trace's world size (a 1e6-rank
    group in a 2-rank job made the bus bandwidth nonsense): their group is taken from pg_config or the world."""
    g = model.gpu
    world = world_of(model)
    if not world or not len(g):
        return None
    bad = (g.cls == C.COMM) & (g.group > world)
    if not bad.any():
        return None
    return (
        f"{int(bad.sum())} communication kernels state a Group size of up to {int(g.group[bad].max())}, more than "
        f"the world size {world}: their bus bandwidth takes the group's size from pg_config or the world size"
    )
