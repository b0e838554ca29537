"""The scenarios: what each one plants, the rule ids (docs/rules.md) that should come out on top, and the fix key.

`expect`: rule ids acceptable as the top finding (empty: a healthy job, no finding above info).
`fix`: the ds_config dotted path or env variable the top finding's fix must name; None: the top finding must
carry no config/env fix (the cause is hardware or the call site is the answer); ANY: not scored.
`also_ok`: rules that may also be at warning or above without counting as a false alarm (a second, true
reading of the same cause, e.g. `peer-wait` beside a `straggler`).
`forbid`: symptom-without-cause scenarios: rules whose symptom is planted without their cause; any of them
at warning or above fails the scenario even when listed nowhere else.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from benchmarks.scenarios.gen import Cfg

ANY = "*"

BASE_DS: dict[str, Any] = {
    "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": 1,
    "gradient_clipping": 1.0,
    "bf16": {"enabled": True},
    "zero_optimization": {
        "stage": 3,
        "overlap_comm": True,
        "contiguous_gradients": True,
        "reduce_bucket_size": 50000000,
        "stage3_prefetch_bucket_size": 150000000,
        "stage3_param_persistence_threshold": 100000,
        "stage3_max_live_parameters": 1000000000,
    },
}

LIMITS = ("allgather-transfer-bound", "reduce-transfer-bound")


@dataclass
class Scenario:
    name: str
    plants: str
    cfg: Cfg
    expect: tuple[str, ...] = ()
    fix: str | None = ANY
    also_ok: tuple[str, ...] = ()
    forbid: tuple[str, ...] = ()
    ds: dict[str, Any] = field(default_factory=lambda: copy.deepcopy(BASE_DS))
    run_json: bool = False  # write an `overlapcheck run` folder (run.json with hosts, versions, env)
    env: dict[str, str] = field(default_factory=dict)
    kind: str = "cause"  # cause | healthy | symptom


def _ds(**zero: Any) -> dict[str, Any]:
    d = copy.deepcopy(BASE_DS)
    for k, v in zero.items():
        if k.startswith("top_"):
            d[k[4:]] = v
        else:
            d["zero_optimization"][k] = v
    return d


def scenarios() -> list[Scenario]:
    s: list[Scenario] = []
    # ---- healthy: must warn about nothing ----
    s.append(
        Scenario(
            "healthy-2x4", "ZeRO-3 with prefetch 2 layers ahead, 5e7 buckets, NDR fabric", Cfg(seed=11), kind="healthy"
        )
    )
    s.append(
        Scenario("healthy-4x8", "the same at 32 ranks", Cfg(nodes=4, gpn=8, seed=12), kind="healthy", run_json=True)
    )
    s.append(
        Scenario(
            "healthy-accum-2x4",
            "gradient_accumulation_steps 2: two fwd/bwd per optimizer step, one ProfilerStep",
            Cfg(accum=2, seed=13),
            ds=_ds(top_gradient_accumulation_steps=2),
            kind="healthy",
        )
    )
    s.append(
        Scenario(
            "healthy-clock-drift-4x8",
            "per-node clock offsets (+4.1 ms, -11.7 ms, +250 ms) and drift (+-40 ppm)",
            Cfg(
                nodes=4,
                gpn=8,
                seed=14,
                clock_offset_us={1: 4100.0, 2: -11700.0, 3: 250000.0},
                drift_ppm={1: 40.0, 2: -35.0, 3: 12.0},
            ),
            kind="healthy",
            run_json=True,
        )
    )
    # ---- planted causes ----
    s.append(
        Scenario(
            "overlap-comm-off-2x4",
            "overlap_comm false: reduce stream = default stream, reduce-scatters on stream 7",
            Cfg(overlap_comm=False, seed=21),
            expect=("overlap-comm-disabled",),
            fix="zero_optimization.overlap_comm",
            ds=_ds(overlap_comm=False),
            also_ok=LIMITS,
        )
    )
    s.append(
        Scenario(
            "overlap-comm-off-4x8",
            "the same at 32 ranks",
            Cfg(nodes=4, gpn=8, overlap_comm=False, seed=22),
            expect=("overlap-comm-disabled",),
            fix="zero_optimization.overlap_comm",
            ds=_ds(overlap_comm=False),
            also_ok=LIMITS,
        )
    )
    s.append(
        Scenario(
            "item-sync-2x4",
            "loss.item() between forward and backward: the host waits for forward, so backward's "
            "first gathers are issued after the GPU drained",
            Cfg(layers=3, item_sync=True, seed=23),
            expect=("host-sync",),
            fix=None,
        )
    )
    s.append(
        Scenario(
            "prefetch-off-2x4",
            "host-bound Python (3.4 ms per layer) and stage3_prefetch_bucket_size 0: each "
            "gather issued on demand after the compute before it ended",
            Cfg(prefetch_layers=0, lag_host_us=3400.0, seed=24),
            expect=("allgather-not-prefetched",),
            fix="zero_optimization.stage3_prefetch_bucket_size",
            ds=_ds(stage3_prefetch_bucket_size=0),
            also_ok=("host-bound-launch",),  # the planted host lag is that rule's cause
        )
    )
    s.append(
        Scenario(
            "prefetch-off-4x8",
            "the same at 32 ranks",
            Cfg(nodes=4, gpn=8, prefetch_layers=0, lag_host_us=3400.0, seed=25),
            expect=("allgather-not-prefetched",),
            fix="zero_optimization.stage3_prefetch_bucket_size",
            ds=_ds(stage3_prefetch_bucket_size=0),
            also_ok=("host-bound-launch",),  # the planted host lag is that rule's cause
        )
    )
    s.append(
        Scenario(
            "straggler-gpu-2x4",
            "rank 5's GPU computes 1.18x slower (others wait for it at every collective)",
            Cfg(gpu_speed={5: 1.18}, seed=26),
            expect=("straggler",),
            fix=None,
            also_ok=("peer-wait",),
            run_json=True,
        )
    )
    s.append(
        Scenario(
            "straggler-gpu-4x8",
            "rank 13's GPU computes 1.2x slower",
            Cfg(nodes=4, gpn=8, gpu_speed={13: 1.2}, seed=27),
            expect=("straggler",),
            fix=None,
            also_ok=("peer-wait",),
            run_json=True,
        )
    )
    s.append(
        Scenario(
            "slow-node-4x8",
            "all 8 GPUs of node 2 compute 1.35x slower",
            Cfg(nodes=4, gpn=8, node_speed={2: 1.35}, seed=28),
            expect=("slow-node", "straggler", "peer-wait"),  # slow-node: the rule issue 20 added for this cause
            fix=None,
            also_ok=("slow-node", "peer-wait", "straggler"),
            run_json=True,
        )
    )
    s.append(
        Scenario(
            "slow-nic-2x4",
            "node 1's NICs give 12 GB/s per GPU instead of 48: every cross-node ring runs at it",
            Cfg(nic_by_node={1: 12.0}, seed=29),
            expect=("bandwidth-bound", *LIMITS),
            fix=ANY,
            also_ok=("bandwidth-bound", *LIMITS, "peer-wait", "cross-stream-wait"),
            run_json=True,
        )
    )
    s.append(
        Scenario(
            "fp32-comm-2x4",
            "communication_data_type fp32 under bf16 on a 26 GB/s fabric: reduce-scatters "
            "(kernels _f32, record dtype Float) twice the bytes, outrunning backward",
            Cfg(comm_dtype="fp32", nic_gbps=26.0, seed=30),
            expect=("fp32-communication", "bandwidth-bound", "reduce-transfer-bound"),  # fp32-communication: issue 20's
            fix="communication_data_type",
            ds=_ds(top_communication_data_type="fp32"),
            also_ok=("fp32-communication", "bandwidth-bound", *LIMITS, "cross-stream-wait"),
        )
    )
    s.append(
        Scenario(
            "offload-param-pageable-2x4",
            "offload_param to CPU, pin_memory false: a blocking pageable HtoD copy "
            "of the shard before each all-gather in all_gather_coalesced",
            Cfg(offload_param_pageable=True, seed=31),
            expect=("offload-param-copy", "host-sync", "offload-blocking-copy"),  # offload-param-copy: issue 20's
            fix="zero_optimization.offload_param.pin_memory",
            ds=_ds(offload_param={"device": "cpu", "pin_memory": False}),
            also_ok=("offload-param-copy", "host-sync", "allgather-transfer-bound", "cross-stream-wait"),
        )
    )
    s.append(
        Scenario(
            "max-connections-1-2x4",
            "CUDA_DEVICE_MAX_CONNECTIONS=1 (one hardware queue: launch order across "
            "streams), no run.json: the evidence is only in the trace",
            Cfg(max_conn1=True, seed=32),
            expect=("no-stream-concurrency",),
            fix="CUDA_DEVICE_MAX_CONNECTIONS",
        )
    )
    s.append(
        Scenario(
            "tiny-reduce-scatters-2x4",
            "hidden 512 x 24 layers, 2048 tokens, reduce_bucket_size 1e5: ~170 latency-bound "
            "reduce-scatters under 1 MiB per step that outlast backward, the 2-event reduce throttle blocking the host",
            Cfg(
                hidden=512,
                layers=24,
                tokens=2048,
                reduce_bucket=1e5,
                extra_params=[512, 512, 512, 512, 2048, 512],
                seed=33,
            ),
            expect=("tiny-collectives", "small-reductions", "reduce-event-throttle"),
            fix="zero_optimization.reduce_bucket_size",
            ds=_ds(reduce_bucket_size=100000),
            also_ok=("tiny-collectives", "small-reductions", "reduce-event-throttle"),
        )
    )
    s.append(
        Scenario(
            "moe-alltoall-2x4",
            "MoE on layers 1,3,5,7: dispatch and combine all-to-all (SendRecv) on the "
            "compute stream, 32 MiB each, nothing to hide them behind",
            Cfg(moe_layers=(1, 3, 5, 7), moe_tokens_bytes=8192 * 2048 * 2.0, seed=34),
            expect=("unexplained-exposure", "bandwidth-bound"),
            fix=ANY,
            also_ok=("peer-wait",),
        )
    )
    # ---- symptom without cause ----
    s.append(
        Scenario(
            "prefetch-config-harmless-2x4",
            "stage3_prefetch_bucket_size 1000 (prefetch off) but the host runs far "
            "ahead, so every gather is issued in time: tiny prefetch config, no cost",
            Cfg(prefetch_layers=0, seed=41),
            ds=_ds(stage3_prefetch_bucket_size=1000),
            forbid=("allgather-not-prefetched", "fetch-throttle"),
            kind="symptom",
        )
    )
    s.append(
        Scenario(
            "transfer-bound-gathers-2x4",
            "all-gathers exposed in forward because the fabric is slow (30 GB/s) "
            "while prefetch works: the not-prefetched symptom without its cause",
            Cfg(nic_gbps=30.0, seed=42),
            expect=("bandwidth-bound", *LIMITS),
            fix=ANY,
            also_ok=("bandwidth-bound", *LIMITS, "cross-stream-wait"),
            forbid=("allgather-not-prefetched",),
            kind="symptom",
        )
    )
    s.append(
        Scenario(
            "clock-offset-no-straggler-2x4",
            "node 1's clock 40 ms ahead, nothing slow: start times differ, durations do not",
            Cfg(clock_offset_us={1: 40000.0}, seed=43),
            forbid=("straggler", "peer-wait"),
            kind="symptom",
            run_json=True,
        )
    )
    s.append(
        Scenario(
            "idle-sync-2x4",
            "torch.cuda.synchronize() at the end of each step, after the GPU already drained: "
            "a sync that waits for nothing",
            Cfg(idle_sync=True, seed=44),
            forbid=("host-sync",),
            kind="symptom",
        )
    )
    s.append(
        Scenario(
            "random-late-rank-2x4",
            "before every collective a different rank, drawn at random, is 150-450 us late on the host: a large "
            "spread whose last rank changes at random, no straggler",
            Cfg(random_late_us=300.0, seed=45),
            forbid=("straggler",),
            also_ok=("peer-wait",),
            kind="symptom",
        )
    )
    return s
