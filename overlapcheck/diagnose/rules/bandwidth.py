"""Bandwidth-bound communication: the exposed time is what the network needs to move the bytes, not a schedule.

Precondition (docs/rules.md): at the transfer time measured across ranks (the shortest duration of each
collective; analysis/bandwidth.py), the collectives of a phase take longer than the compute beside them, and
that floor (exposed time no schedule could hide at this bandwidth), less what fp32 gradient reductions under
half training explain of it (rules/dtypes.py), is at least FLOOR_SHARE of the exposed communication and at least
MIN_STEP_SHARE of the step. Fixes reduce the bytes or add
compute per byte (ZeRO++, a larger micro-batch, the communication dtype); when the user stated the network
(`--network`) and the measured inter-node busbw is far below its per-GPU share, the network checks to make.
"""

from __future__ import annotations

import statistics
from typing import Any

from overlapcheck.analysis.bandwidth import INTER, INTRA
from overlapcheck.diagnose.facts.job import JobFacts
from overlapcheck.diagnose.finding import config_value, finding, make_fix
from overlapcheck.diagnose.rule import Rule
from overlapcheck.diagnose.rules.dtypes import FP32_COMMUNICATION
from overlapcheck.diagnose.rules.reduction import GRADIENT_ALLREDUCE
from overlapcheck.job import JobContext
from overlapcheck.model import Finding, JobBandwidth

FLOOR_SHARE = 0.5  # the floor dominates: more than half of the exposed communication (the schedule the rest)
MIN_STEP_SHARE = 0.03  # and costs at least this share of the step
SLOW_NETWORK = 0.5  # measured inter-node busbw below this share of the stated peak: check the network
# the least per-GPU inter-node rate of an RDMA fabric bandwidth.md lists (half an HDR port per GPU): the link rate
# a transport variable is judged against when the user stated no network
ASSUMED_INTER_GBPS = 12.5
# NCCL variables that can turn a fast transport off (NCCL_SOCKET_IFNAME is not one: a slow NIC is not knowable)
TRANSPORT_VARIABLES = ("NCCL_IB_DISABLE", "NCCL_NET", "NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE", "NCCL_P2P_LEVEL")


def bandwidth_bound(facts: JobFacts) -> list[Finding]:
    """One job-wide finding when the bandwidth floor dominates the exposed communication."""
    results, job = facts.results, facts.job
    if len(results) < 2:
        return []  # the transfer time needs the other ranks (a per-rank summary judges one rank only)
    bw = facts.bandwidth
    if bw is None or not bw.hideability:
        return []
    exposed = bw.floor_us + bw.schedulable_us
    steps = [r.metrics.step_time_us / len(r.metrics.steps) for r in results if r.metrics.steps]
    step_us = statistics.median(steps) if steps else 0.0
    # fp32 gradient reductions under half training, and gradient all-reduces where reduce-scatters would do, move
    # twice their bytes: what the training dtype / reduce_scatter saves of the floor is those findings'
    # (rules/dtypes.py, rules/reduction.py), not the network's; the median rank's saving
    fp32 = [sum(f.cost_us for f in r.findings if f.rule == FP32_COMMUNICATION.id) for r in results]
    by_dtype = min(bw.floor_us, statistics.median(fp32)) if fp32 else 0.0
    ar = [sum(f.cost_us for f in r.findings if f.rule == GRADIENT_ALLREDUCE.id) for r in results]
    by_allreduce = min(bw.floor_us - by_dtype, statistics.median(ar)) if ar else 0.0
    floor = bw.floor_us - by_dtype - by_allreduce
    if exposed <= 0 or floor < FLOOR_SHARE * exposed or floor < MIN_STEP_SHARE * step_us:
        return []
    kinds = {
        kind: {
            "bytes_per_step": round(k.bytes_per_step),
            "busbw_gbps": _round(k.busbw_gbps),
            "busbw_spread_gbps": [_round(k.busbw_min_gbps), _round(k.busbw_max_gbps)],
            "transfer_us_per_step": _round(k.transfer_us_per_step),
            "wait_us_per_step": _round(k.wait_us_per_step),
            "scope": k.scope,
            "peak_gbps": k.peak_gbps,
        }
        for kind, k in bw.kinds.items()
        if k.bytes_per_step > 1e6 or (k.transfer_us_per_step or 0.0) > 0.01 * step_us
    }
    evidence: dict[str, Any] = {
        "floor_us_per_step": round(bw.floor_us, 3),
        **({"fp32_communication_us_per_step": round(by_dtype, 3)} if by_dtype > 0 else {}),
        **({"gradient_allreduce_us_per_step": round(by_allreduce, 3)} if by_allreduce > 0 else {}),
        "schedulable_us_per_step": round(bw.schedulable_us, 3),
        "phases": {
            p: {
                "compute_us": round(h.compute_us, 3),
                "transfer_us": round(h.transfer_us, 3),
                "exposed_us": round(h.exposed_us, 3),
                "floor_us": round(h.floor_us, 3),
            }
            for p, h in bw.hideability.items()
        },
        "collectives": kinds,
    }
    slow = [
        kind
        for kind, k in bw.kinds.items()
        if k.scope == INTER
        and k.peak_gbps
        and k.bytes_per_step > 1e6
        and k.busbw_gbps is not None
        and k.busbw_gbps < SLOW_NETWORK * k.peak_gbps
    ]
    if bw.network is not None:
        evidence["network"] = bw.network
    why = (
        f"at the measured bandwidth the collectives need {floor / 1000:.1f} ms per step more than the compute "
        "beside them: no bucket size or prefetch can hide that; move fewer bytes or add compute per byte"
    )
    if slow:
        evidence["network_checks"] = [
            "NCCL_IB_HCA: does it list every InfiniBand port of the node (NCCL_DEBUG=INFO prints the ones used)?",
            "GPUDirect RDMA: is nvidia-peermem loaded and NCCL_NET_GDR_LEVEL allowing it (NCCL_DEBUG=INFO: "
            "'GPU Direct RDMA Enabled')?",
        ]
        why += (
            f"; {', '.join(slow)} run(s) below {SLOW_NETWORK:.0%} of the stated network's per-GPU share: "
            "check the network first"
        )
    settings = zero_pp_settings(bw, job)
    micro = config_value(job.ds_config, "train_micro_batch_size_per_gpu")
    if isinstance(micro, int) and not isinstance(micro, bool) and micro > 0:
        settings["train_micro_batch_size_per_gpu"] = micro * 2
    comm_dtype = config_value(job.ds_config, "communication_data_type")
    if isinstance(comm_dtype, str) and comm_dtype.lower() in ("fp32", "float32", "float"):
        settings["communication_data_type"] = "bf16"
    transports = disabled_transports(bw, job)
    env: dict[str, str | None] = {}
    if transports:
        env = {t["variable"]: None for t in transports}
        evidence["disabled_transports"] = transports
        evidence["after_transport_fix"] = sorted(make_fix(job.ds_config, settings).config or {})
        settings = {}
        why = (
            "the job's environment sets "
            + ", ".join(f"{t['variable']}={t['value']}" for t in transports)
            + ": NCCL runs "
            + ", ".join(
                f"{t['scope']} collectives at {t['busbw_gbps']} GB/s busbw, {t['share_of_link']:.0%} of "
                f"the link ({t['link_gbps']} GB/s)"
                for t in transports
            )
            + "; unset it first (the settings in after_transport_fix only if the collectives still outrun the "
            "compute then): " + why
        )
    ranks = sorted(r.metrics.rank for r in results if r.metrics.rank is not None and r.metrics.collectives["all"].count)
    return [
        finding(
            BANDWIDTH_BOUND.id,
            "Communication is bandwidth-bound",
            why,
            floor,
            ranks,
            [],
            evidence,
            make_fix(job.ds_config, settings, env=env),
            covers=dict.fromkeys(ranks, floor),  # the floor is exposed on every rank
        )
    ]


def zero_pp_settings(bw: JobBandwidth, job: JobContext) -> dict[str, Any]:
    """ZeRO++: qwZ (int8 weight gathers) everywhere; qgZ (quantized gradient reduction) and hpZ (a copy of the
    weights per node) cut inter-node bytes only, so not where every collective of over 1 MB per step stays inside a
    node (DeepSpeed's __avg_scatter_grads quantizes only when num_nodes > 1)."""
    settings: dict[str, Any] = {"zero_optimization.zero_quantized_weights": True}
    if {k.scope for k in bw.kinds.values() if k.bytes_per_step > 1e6} == {INTRA}:
        return settings
    settings["zero_optimization.zero_quantized_gradients"] = True
    gathers = bw.kinds.get("all_gather")
    per_node = job.gpus_per_node
    if per_node and per_node > 1 and (gathers is None or gathers.scope != INTRA):
        settings["zero_optimization.zero_hpz_partition_size"] = per_node
    return settings


def _disables(variable: str, value: str) -> str | None:
    """The scope whose fast transport this NCCL variable turns off (None: it turns nothing off)."""
    v = value.strip().lower()
    if variable in ("NCCL_IB_DISABLE", "NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE"):
        return None if v in ("", "0", "false", "no") else (INTER if variable == "NCCL_IB_DISABLE" else INTRA)
    if variable == "NCCL_NET" and v == "socket":
        return INTER
    if variable == "NCCL_P2P_LEVEL" and v in ("loc", "0"):  # LOC: never peer-to-peer, not even over NVLink
        return INTRA
    return None


def disabled_transports(bw: JobBandwidth, job: JobContext) -> list[dict[str, Any]]:
    """The variables of the recorded environment that turn off a fast NCCL transport (TRANSPORT_VARIABLES), each
    with a scope whose collectives (over 1 MB per step) run below SLOW_NETWORK of that scope's link rate: the
    kind's peak (NVLink inside a node, `--network` across nodes), else, across nodes, ASSUMED_INTER_GBPS. A
    variable set while the bandwidth is near the link rate is not named (it changed nothing that shows)."""
    out: list[dict[str, Any]] = []
    for variable in TRANSPORT_VARIABLES:
        value = (job.env or {}).get(variable)
        scope = _disables(variable, str(value)) if value is not None else None
        if scope is None:
            continue
        for kind, k in bw.kinds.items():
            link = k.peak_gbps or (ASSUMED_INTER_GBPS if scope == INTER else None)
            if k.scope != scope or not link or k.busbw_gbps is None or k.bytes_per_step <= 1e6:
                continue
            if k.busbw_gbps < SLOW_NETWORK * link:
                out.append(
                    {
                        "variable": variable,
                        "value": str(value),
                        "scope": scope,
                        "collective": kind,
                        "busbw_gbps": round(k.busbw_gbps, 2),
                        "link_gbps": link,
                        "link_from": k.peak if k.peak_gbps else "assumed: half an HDR port per GPU (bandwidth.md)",
                        "share_of_link": round(k.busbw_gbps / link, 3),
                    }
                )
                break
    return out


def _round(x: float | None) -> float | None:
    return round(x, 3) if x is not None else None


# the floor no schedule could hide at the measured bandwidth (docs/rules.md); the reduce throttle's block on
# reductions that slow is part of it
BANDWIDTH_BOUND = Rule(
    "bandwidth-bound",
    cross=bandwidth_bound,
    explains=("cross-stream-wait", "allgather-transfer-bound", "reduce-transfer-bound", "reduce-event-throttle"),
    needs="the collectives' sizes and durations on every rank",
)
