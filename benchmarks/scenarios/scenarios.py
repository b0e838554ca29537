"""The scenarios: what each one plants, the rule ids (docs/rules.md) that should come out on top, and the fix key.

`expect`: rule ids acceptable as the top finding (empty: a healthy job, no finding above info).
`fix`: the ds_config dotted path or env variable the top finding's fix must name; None: the top finding must
carry no config/env fix (the cause is hardware or the call site is the answer); ANY: not scored.
`also_ok`: rules that may also be at warning or above without counting as a false alarm (a second, true
reading of the same cause, e.g. `peer-wait` beside a `straggler`).
`forbid`: symptom-without-cause scenarios: rules whose symptom is planted without their cause; any of them
at warning or above fails the scenario even when listed nowhere else.
`need`: scenarios with more than one planted cause: groups of rule ids, each of which must have one rule at
warning or above (the second cause must be named too, not only the top one).
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
    # two planted causes: each group must have one of its rules at warning or above (both causes named)
    need: tuple[tuple[str, ...], ...] = ()
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
            "gather issued on demand after the compute before it ended. Counterfactual (same seed): prefetch 2 "
            "layers 199.16 -> 199.14 ms per step, lag 0 -> 80.96: the host is the critical path, so "
            "host-bound-launch on top; allgather-not-prefetched is a true reading worth little (was expected "
            "first until the counterfactual was measured in round 7)",
            Cfg(prefetch_layers=0, lag_host_us=3400.0, seed=24),
            expect=("host-bound-launch",),
            fix=ANY,
            ds=_ds(stage3_prefetch_bucket_size=0),
            also_ok=("allgather-not-prefetched",),
        )
    )
    s.append(
        Scenario(
            "prefetch-off-4x8",
            "the same at 32 ranks (prefetch 2 layers: 199.22 -> 199.20 ms per step; lag 0: 81.32)",
            Cfg(nodes=4, gpn=8, prefetch_layers=0, lag_host_us=3400.0, seed=25),
            expect=("host-bound-launch",),
            fix=ANY,
            ds=_ds(stage3_prefetch_bucket_size=0),
            also_ok=("allgather-not-prefetched",),
        )
    )
    s.append(
        Scenario(
            "prefetch-off-slow-nic-2x4",
            "stage3_prefetch_bucket_size 0 where a prefetch matters: gathers of 3.5 ms on a 25 GB/s fabric and a "
            "host 1.8 ms per layer, ahead of the GPU but not by much. Counterfactual (same seed): prefetch 2 layers "
            "112.85 -> 109.96 ms per step; the tool said 20.35 ms critical before round 7 (each stall's saving "
            "capped alone, though the host's lead after them is one budget)",
            Cfg(prefetch_layers=0, lag_host_us=1800.0, nic_gbps=25.0, seed=24),
            expect=("allgather-not-prefetched",),
            fix="zero_optimization.stage3_prefetch_bucket_size",
            ds=_ds(stage3_prefetch_bucket_size=0),
            also_ok=("allgather-transfer-bound",),
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
    # ---- round 5: healthy but unusual ----
    s.append(
        Scenario(
            "healthy-1x8-nvlink",
            "one node of 8 GPUs, every collective on NVLink (330 GB/s busbw, alpha 19 us): gathers and "
            "reduce-scatters far shorter than the layers they hide behind. Expect nothing above info: only the "
            "inherent first gather and last bucket are exposed",
            Cfg(nodes=1, gpn=8, seed=51),
            kind="healthy",
            run_json=True,
        )
    )
    s.append(
        Scenario(
            "healthy-two-layers-2x4",
            "a very short step: 2 layers (hidden 2048, 8192 tokens), ~16 ms per step, so the inherent first "
            "gather (~1.8 ms) and last bucket are a large share of the step although nothing is wrong. Expect "
            "nothing above info: inherent exposure is not a finding (docs/rules.md, Inherent exposure)",
            Cfg(layers=2, seed=52),
            kind="healthy",
        )
    )
    s.append(
        Scenario(
            "healthy-recompute-2x4",
            "activation checkpointing: each layer's forward kernels re-run on the autograd thread "
            "(CheckpointFunctionBackward) before its backward kernels; gathers and reduce-scatters as usual, with "
            "more compute to hide them. Expect nothing above info",
            Cfg(recompute=True, seed=53),
            ds=_ds(top_activation_checkpointing={"partition_activations": False, "cpu_checkpointing": False}),
            kind="healthy",
        )
    )
    s.append(
        Scenario(
            "healthy-hpz-2x4",
            "ZeRO++ hpZ (zero_hpz_partition_size 4 = GPUs per node): forward gathers on the world group, "
            "backward gathers of the secondary partition inside each node on its own communicator (PG 2 / 3, "
            "group size 4, NVLink, own NCCL stream 28). A different communicator from the reduce-scatters (PG 1), "
            "so nothing serializes them (zero3-overlap.md: hpZ row). Expect nothing above info",
            Cfg(hpz=True, seed=54),
            ds=_ds(zero_hpz_partition_size=4),
            kind="healthy",
            run_json=True,
        )
    )
    s.append(
        Scenario(
            "healthy-slow-first-batch-2x4",
            "the DataLoader's first batch takes 60 ms (workers starting, files opening), the next ones 0.2 ms: "
            "the GPU idles 60 ms in step 0 with no communication in flight. Not a communication problem and not "
            "steady state. Expect nothing above info (never host-sync: no sync call; never a gather rule)",
            Cfg(dataloader_us={0: 60000.0}, seed=55),
            forbid=("host-sync", "allgather-not-prefetched", "unexplained-exposure"),
            kind="healthy",
        )
    )
    s.append(
        Scenario(
            "healthy-qwz-2x4",
            "ZeRO++ qwZ (zero_quantized_weights): each gather is a quantize kernel on the gather stream 22, an int8 "
            "all-gather (dtype Char, half the bf16 bytes), a small fp32 all-gather of the scales (one per 2048 "
            "elements, ~100 KB) and a dequantize kernel before compute may use the layer (zero3-overlap.md: qwZ "
            "row). Everything is prefetched 2 layers ahead. Expect nothing above info (never fp32-communication: "
            "the fp32 scales are no gradient reduction; never tiny-collectives: 16 small gathers per step, hidden)",
            Cfg(qwz=True, seed=62),
            ds=_ds(zero_quantized_weights=True),
            forbid=("fp32-communication", "tiny-collectives", "bandwidth-bound"),
            kind="healthy",
        )
    )
    s.append(
        Scenario(
            "healthy-offload-optimizer-2x4",
            "offload_optimizer to CPU with pin_memory on DeepSpeed 0.19.8: partition_grads copies each fp32 gradient "
            "partition to pinned host memory asynchronously on the reduce stream (PR #8207: no blocking copy), the "
            "epilogue's stream sync is the only wait, DeepSpeedCPUAdam then runs ~60 ms on the host while the GPU "
            "idles, and the updated bf16 partition goes back with a pinned async HtoD copy. The GPU idle is the "
            "CPU optimizer's, no communication is exposed by it. Expect nothing above info; never "
            "offload-blocking-copy (pinned, async) / host-sync / offload-param-copy",
            Cfg(offload_opt_cpu_adam_us=60000.0, seed=67),
            ds=_ds(offload_optimizer={"device": "cpu", "pin_memory": True}),
            forbid=("offload-blocking-copy", "host-sync", "offload-param-copy"),
            kind="healthy",
            run_json=True,
        )
    )
    # ---- round 5: causes ----
    s.append(
        Scenario(
            "dataloader-stall-2x4",
            "an input pipeline that cannot keep up: DataLoader.__next__ blocks the host ~25 ms at the start of "
            "every step (no CUDA sync call: the host is busy in Python). The GPU idles, but no collective is in "
            "flight and the step's first gather is issued only after it, so the exposed communication is what a "
            "healthy job has. The right reading is host / input pipeline; overlapcheck has no rule for it, so the "
            "right answer in its terms is no communication finding above info (a communication fix would be "
            "wrong)",
            Cfg(dataloader_us={0: 25000.0, 1: 25000.0, 2: 25000.0}, seed=56),
            forbid=("host-sync", "allgather-not-prefetched", "unexplained-exposure", "peer-wait"),
        )
    )
    s.append(
        Scenario(
            "bucket-huge-2x4",
            "reduce_bucket_size 5e8 (DeepSpeed's default) on a 403M-parameter model: the flush rule "
            "(elements + numel > reduce_bucket_size) never fires in backward, so the whole gradient is one "
            "806 MB reduce-scatter issued by the epilogue, exposed after backward (zero3-overlap.md: 'If trainable "
            "params <= reduce_bucket_size, all reduce-scatters happen there and overlap is 0%'; rule hint 1). "
            "Expect reduce-scatter-deferred, fix reduce_bucket_size",
            Cfg(reduce_bucket=5e8, seed=57),
            expect=("reduce-scatter-deferred",),
            fix="zero_optimization.reduce_bucket_size",
            ds=_ds(reduce_bucket_size=500000000),
        )
    )
    s.append(
        Scenario(
            "socket-transport-2x4",
            "NCCL_IB_DISABLE=1 (run.json env): cross-node traffic over TCP sockets, ~2 GB/s busbw per GPU "
            "(bandwidth.md: the slowest hop bounds a cross-node ring). Every gather (~100 MB, ~44 ms) outlasts its "
            "layer's compute by far: no schedule hides it. Expect bandwidth-bound (or a transfer-bound limit); "
            "the right fix is the environment (unset NCCL_IB_DISABLE)",
            Cfg(nic_gbps=2.0, seed=58),
            expect=("bandwidth-bound", *LIMITS),
            fix="NCCL_IB_DISABLE",
            also_ok=("bandwidth-bound", *LIMITS, "peer-wait", "cross-stream-wait"),
            forbid=("allgather-not-prefetched", "reduce-scatter-deferred", "tiny-collectives"),
            run_json=True,
            env={"NCCL_IB_DISABLE": "1", "NCCL_SOCKET_IFNAME": "eth0"},
        )
    )
    s.append(
        Scenario(
            "reduce-scatter-off-2x4",
            "zero_optimization.reduce_scatter false (contiguous_gradients true) on a 26 GB/s fabric: each bucket is "
            "all-reduced on the reduce stream (__avg_scatter_contiguous_grads -> all_reduce, AllReduce kernels, "
            "2(n-1)/n of the bucket per GPU: twice a reduce-scatter's bytes, zero3-overlap.md 'reduce_scatter' "
            "row and PR #3622), outrunning backward so the reductions queue past its end. Expect "
            "gradient-allreduce (or bandwidth-bound / reduce-transfer-bound); the fix that halves the bytes is "
            "zero_optimization.reduce_scatter: true",
            Cfg(allreduce_grads=True, nic_gbps=26.0, seed=64),
            expect=("gradient-allreduce", "bandwidth-bound", "reduce-transfer-bound"),
            fix="zero_optimization.reduce_scatter",
            ds=_ds(reduce_scatter=False),
            also_ok=("bandwidth-bound", *LIMITS, "cross-stream-wait", "peer-wait"),
        )
    )
    s.append(
        Scenario(
            "comms-logger-2x4",
            "comms_logger.enabled true: deepspeed.comm's log_wrapper (timed_op) calls get_accelerator().synchronize() "
            "after every collective (zero3-overlap.md, Other synchronizations, first row; rule hint 4), so the host "
            "waits for each all-gather and reduce-scatter to end before it issues anything else: prefetch cannot "
            "run ahead and backward's gradient hooks stall. Expect comms-logger-sync, fix comms_logger.enabled",
            Cfg(comms_logger=True, seed=65),
            expect=("comms-logger-sync",),
            fix="comms_logger.enabled",
            ds=_ds(top_comms_logger={"enabled": True, "verbose": False, "prof_all": True, "debug": False}),
            also_ok=("host-sync",),
        )
    )
    s.append(
        Scenario(
            "p2p-disabled-1x8",
            "one node of 8 GPUs with NCCL_P2P_DISABLE=1 (run.json env): NVLink unused, NCCL goes through host shared "
            "memory at ~20 GB/s busbw instead of ~330 (bandwidth.md: the slowest hop bounds the ring). Each "
            "~100 MB gather takes ~4.4 ms against ~3.3 ms of forward compute per layer: exposed in forward although "
            "prefetch works. Expect bandwidth-bound or a transfer-bound limit, never allgather-not-prefetched; the "
            "right fix is the environment (unset NCCL_P2P_DISABLE)",
            Cfg(nodes=1, gpn=8, intra_gbps=20.0, seed=66),
            expect=("bandwidth-bound", *LIMITS),
            fix="NCCL_P2P_DISABLE",
            also_ok=("bandwidth-bound", *LIMITS, "cross-stream-wait", "peer-wait"),
            forbid=("allgather-not-prefetched",),
            run_json=True,
            env={"NCCL_P2P_DISABLE": "1"},
        )
    )
    # ---- round 5: symptom without cause ----
    s.append(
        Scenario(
            "first-step-no-prefetch-2x4",
            "the profile starts at the first training step (ProfilerStep#0, no wait/warmup): DeepSpeed is still "
            "recording its trace cache (is_complete_trace() false), so step 0 fetches every layer on demand and "
            "its host is slow (8 ms per sub-module: tracing, allocator warm-up; slower than the GPU's layer); "
            "steps 1-2 prefetch 2 layers ahead with the config unchanged. Long exposed gathers in step 0 only: a "
            "warm-up, not a prefetch setting. Never allgather-not-prefetched / fetch-throttle (their fixes, a "
            "bigger prefetch bucket or trace-cache warnings, change nothing in steps 1-2); unexplained-exposure "
            "(located in step 0) is an honest reading",
            Cfg(step0_no_prefetch=True, step0_lag_us=8000.0, first_step_number=0, seed=59),
            also_ok=("unexplained-exposure", "peer-wait"),
            forbid=("allgather-not-prefetched", "fetch-throttle"),
            kind="symptom",
        )
    )
    s.append(
        Scenario(
            "clock-skew-small-4x2",
            "4 nodes x 2 GPUs, node 3's clock 700 us ahead (an NTP error the size of a collective) and drifting "
            "+80 ppm, node 1 -50 ppm; nothing slow. Start times across nodes disagree by about a kernel; "
            "durations do not (bandwidth.md: the shortest duration across ranks needs no clock). Never "
            "straggler / slow-node / peer-wait",
            Cfg(nodes=4, gpn=2, clock_offset_us={3: 700.0}, drift_ppm={3: 80.0, 1: -50.0}, seed=60),
            forbid=("straggler", "slow-node", "peer-wait"),
            kind="symptom",
            run_json=True,
        )
    )
    s.append(
        Scenario(
            "norm-sync-cheap-2x4",
            "DeepSpeed < 0.14.5 gradient clipping: step() computes the partition's gradient norm, all-reduces it "
            "(4 bytes fp32, PG 1, on the compute stream: synchronous) and calls .item() (DtoH + "
            "cudaStreamSynchronize) before Adam. A real host sync on real work, but it comes right after the "
            "epilogue's reduce-stream sync, so the host had nothing queued ahead: the GPU idles only for the "
            "sync's return and Adam's launch (~20 us per step). Never host-sync above info (its cost is that "
            "idle, not the awaited norm + all-reduce); never fp32-communication (4 bytes)",
            Cfg(norm_sync=True, seed=63),
            forbid=("host-sync", "fp32-communication"),
            kind="symptom",
        )
    )
    s.append(
        Scenario(
            "embed-last-bucket-2x4",
            "an untied 32000 x 2048 input embedding (65.5M parameters) in layer 0: its gradient is produced by "
            "the last kernel of backward and is one 131 MB parameter (stage 3 does not split a parameter across "
            "buckets), so the last bucket after backward is big and exposed (~3 ms), and the layer-0 bucket it "
            "pushes out queues just before it. The last bucket is inherent (zero3-overlap.md: 'The last bucket is "
            "always exposed'); no bucket size removes it. Never reduce-scatter-deferred / small-reductions / "
            "tiny-collectives; the queued one before it is the reduce-transfer-bound limit at most",
            Cfg(embed_numel=32000 * 2048, seed=61),
            also_ok=("reduce-transfer-bound",),
            forbid=("reduce-scatter-deferred", "small-reductions", "tiny-collectives"),
            kind="symptom",
        )
    )
    # ---- round 6 ----
    s.append(
        Scenario(
            "grad-hook-wait-stream-2x4",
            "a user gradient hook (a grad monitor registered with param.register_hook) calls "
            "torch.cuda.current_stream().wait_stream(reduce stream) for every gradient, on a 30 GB/s fabric: the "
            "compute stream waits for whatever is queued on DeepSpeed's reduce stream (the bucket's copy, the "
            "reduce-scatter just issued, ~2.9 ms for a 100 MB bucket, longer than the qkv backward it used to hide "
            "behind), so backward compute stalls behind every bucket. Counterfactual (same seed, no hook): 82.4 ms "
            "per step instead of 91.6. The cause is the user's call site (train.py(31): _grad_monitor_hook), no "
            "config fixes it. Expect cross-stream-wait. (At 48 GB/s the same hook costs only 3.3 ms, 4 %: the "
            "reduce-scatter ends inside the next segment; first version of this scenario, dropped)",
            Cfg(user_hook_wait_rs=True, nic_gbps=30.0, seed=71),
            expect=("cross-stream-wait",),
            fix=None,
            also_ok=("bandwidth-bound", *LIMITS),
            forbid=("overlap-comm-disabled", "allgather-not-prefetched"),
        )
    )
    s.append(
        Scenario(
            "max-live-small-2x4",
            "stage3_max_live_parameters 6e7 (one layer is 50.3M) with the prefetch bucket left at 1.5e8 and a "
            "host-bound Python loop (lag_host_us 3400: 3.4 ms per forward layer, per backward segment): prefetch "
            "volume is min(max_live - available, prefetch_bucket_size) <= 0 once a layer is live (reuse distance "
            "1e9 keeps them), so every layer is gathered on demand and the all-gathers are exposed. But the host "
            "is the critical path: counterfactual max_live 1e9 + prefetch 2 layers gives 197.96 ms per step "
            "instead of 197.97 (the GPU then waits for launches instead of gathers); the host lag costs ~117 ms "
            "(lag 0: ~81 ms). Expect host-bound-launch on top; allgather-not-prefetched is a true but worthless "
            "reading (if it is named, its fix should be stage3_max_live_parameters, not the prefetch bucket)",
            Cfg(prefetch_layers=0, lag_host_us=3400.0, seed=72),
            expect=("host-bound-launch",),
            fix=ANY,
            ds=_ds(stage3_max_live_parameters=60000000),
            also_ok=("allgather-not-prefetched",),
        )
    )
    s.append(
        Scenario(
            "slow-node-and-fp32-4x8",
            "two causes at once: node 2's 8 GPUs compute 1.3x slower AND communication_data_type fp32 under bf16 on "
            "a 26 GB/s fabric (reduce-scatters _f32, twice the bytes). Both must be named at warning or above: "
            "slow-node / straggler for the first, fp32-communication (or a transfer-bound reading) for the second",
            Cfg(nodes=4, gpn=8, node_speed={2: 1.3}, comm_dtype="fp32", nic_gbps=26.0, seed=73),
            expect=("slow-node", "straggler", "fp32-communication", "bandwidth-bound", "reduce-transfer-bound"),
            fix=ANY,
            also_ok=("slow-node", "straggler", "peer-wait", "fp32-communication", "bandwidth-bound", *LIMITS),
            need=(("slow-node", "straggler"), ("fp32-communication",)),
            ds=_ds(top_communication_data_type="fp32"),
            run_json=True,
        )
    )
    s.append(
        Scenario(
            "healthy-persist-large-2x4",
            "stage3_param_persistence_threshold 5e6: the attention output projection (4.2M per layer) persists, so "
            "the per-layer gathers are 46M instead of 50M; DeepSpeed's _post_step re-gathers the 8 persistent "
            "params after Adam (8 small all_gathers, ~8.4 MB each) and calls synchronize(). ~1.5 ms of exposed "
            "gather + sync per ~90 ms step, the memory/communication trade the user chose. Expect nothing above "
            "info; never allgather-not-prefetched / tiny-collectives",
            Cfg(persist_threshold=5e6, persist_post_step=True, seed=74),
            ds=_ds(stage3_param_persistence_threshold=5000000),
            forbid=("allgather-not-prefetched", "tiny-collectives"),
            kind="healthy",
        )
    )
    s.append(
        Scenario(
            "healthy-nccl-env-2x4",
            "run.json env NCCL_ALGO=Ring, NCCL_PROTO=Simple, NCCL_BUFFSIZE=8388608 on a healthy 48 GB/s fabric "
            "(kernel names ..._RING_SIMPLE): tuning variables set, communication at full speed and hidden. Expect "
            "nothing above info; never bandwidth-bound (no env fix to give)",
            Cfg(nccl_proto="SIMPLE", seed=75),
            forbid=("bandwidth-bound",),
            kind="healthy",
            run_json=True,
            env={"NCCL_ALGO": "Ring", "NCCL_PROTO": "Simple", "NCCL_BUFFSIZE": "8388608"},
        )
    )
    s.append(
        Scenario(
            "straggler-backward-only-2x4",
            "rank 6's GPU is 1.25x slower in backward only (forward at full speed): every backward gather and "
            "reduce-scatter waits for it; forward is balanced. Expect straggler (rank 6), no config fix",
            Cfg(bwd_speed={6: 1.25}, seed=76),
            expect=("straggler",),
            fix=None,
            also_ok=("peer-wait",),
            run_json=True,
        )
    )
    s.append(
        Scenario(
            "host-bound-tiny-kernels-1x8",
            "hidden 1024 x 16 layers, 2048 tokens per GPU on one NVLink node, 30 us of Python per launched op: "
            "kernels of 6-75 us, the host launches slower than the GPU runs them, so the compute stream idles "
            "between kernels; gathers are prefetched and NVLink-fast (~85 us). Expect host-bound-launch; never "
            "allgather-not-prefetched (prefetch is configured and issued ahead)",
            Cfg(nodes=1, gpn=8, hidden=1024, layers=16, tokens=2048, kernel_host_us=30.0, seed=77),
            expect=("host-bound-launch",),
            fix=ANY,
            also_ok=("unexplained-exposure",),
            forbid=("allgather-not-prefetched",),
            run_json=True,
        )
    )
    s.append(
        Scenario(
            "tiny-buckets-4x8",
            "reduce_bucket_size 1e5 at 32 ranks (hidden 1024, 16 layers, 4096 tokens, 6 small 1024-element params "
            "per layer): ~5 reduce-scatters per layer (1-4M elements each and a 6K-element one), each paying "
            "~39 us of ring latency over 4 nodes, with the 2-event throttle pinning the host to them. Expect "
            "small-reductions / tiny-collectives / reduce-event-throttle, fix reduce_bucket_size",
            Cfg(
                nodes=4,
                gpn=8,
                hidden=1024,
                layers=16,
                tokens=4096,
                reduce_bucket=1e5,
                extra_params=[1024] * 6,
                seed=78,
            ),
            expect=("small-reductions", "tiny-collectives", "reduce-event-throttle"),
            fix="zero_optimization.reduce_bucket_size",
            ds=_ds(reduce_bucket_size=100000),
            also_ok=("small-reductions", "tiny-collectives", "reduce-event-throttle", *LIMITS, "bandwidth-bound"),
        )
    )
    s.append(
        Scenario(
            "rank0-slow-host-2x4",
            "symptom without cause: rank 0's host spends 25 us per launched op instead of 9 (logging, metric "
            "hooks), yet it stays far ahead of its GPU (kernels of 0.1-2 ms): its cpu_ops and launches are later "
            "and longer, its GPU timeline is the others'. Never straggler / host-bound-launch / peer-wait",
            Cfg(kernel_host_by_rank={0: 25.0}, seed=79),
            forbid=("straggler", "host-bound-launch", "peer-wait", "slow-node"),
            kind="symptom",
            run_json=True,
        )
    )
    s.append(
        Scenario(
            "healthy-fp16-overflow-2x4",
            "fp16 training with dynamic loss scaling, communication in fp16 (kernels _f16, dtype Half, no cast): "
            "step()'s has_overflow makes the default stream wait for the reduce stream, all-reduces a 1-byte "
            "overflow flag (MAX, Byte) and reads it with .item() right after the epilogue's sync: a real sync with "
            "nothing queued behind it. Expect nothing above info; never host-sync / fp32-communication / "
            "cross-stream-wait",
            Cfg(comm_dtype="fp16", train_dtype="fp16", fp16_overflow=True, seed=80),
            ds={
                **_ds(),
                "bf16": {"enabled": False},
                "fp16": {"enabled": True, "loss_scale": 0, "initial_scale_power": 16},
            },
            forbid=("host-sync", "fp32-communication", "cross-stream-wait"),
            kind="healthy",
        )
    )
    return s
