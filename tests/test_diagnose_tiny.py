"""Diagnosis rules on tiny hand-built traces: each rule fires on its signature, with the cost the trace implies."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from builders import cpu_op, frame, kernel, launch, runtime, step, write_trace
from builders import findings_by_rule as rules

from overlapcheck.diagnose import severity_of
from overlapcheck.diagnose.facts.callsite import functions, is_site, is_user, parse_frame
from overlapcheck.diagnose.finding import config_value, make_fix, round_size
from overlapcheck.diagnose.registry import BY_ID
from overlapcheck.model import Fix, Report
from overlapcheck.pipeline import analyze

GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n"
RS = "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
AG = "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)"


def diagnose(folder: Path, config: dict[str, Any] | None = None) -> Report:
    return analyze(folder, ds_config=config, jobs=1)


def sync_trace(tmp_path: Path, frames: list[str], call: str = "cudaStreamSynchronize") -> Path:
    """A kernel [0, 100) launched at 0; the host blocks in `call` over [10, 100) inside `frames`; the next
    kernel is launched at 130 and starts at 135: the compute stream starves over [100, 135)."""
    events = [
        step(1, 0, 300),
        launch(0, 1),
        kernel(GEMM, 0, 100, corr=1),
        runtime(call, 10, 90, 2),
        launch(130, 3),
        kernel(GEMM, 135, 50, corr=3),
    ]
    events += [frame(name, 5 + i, 100 - 2 * i) for i, name in enumerate(frames)]
    tmp_path.mkdir(parents=True, exist_ok=True)
    write_trace(tmp_path, "rank0.trace.json.gz", events, rank=0, world_size=1)
    return tmp_path


def test_epilogue_sync_is_attributed_to_deepspeed_frame_with_its_starvation_cost(tmp_path: Path) -> None:
    frames = [
        "train.py(10): main",
        "deepspeed/runtime/engine.py(3072): allreduce_gradients",
        "deepspeed/runtime/zero/stage3.py(1407): independent_gradient_partition_epilogue",
        "torch/cuda/streams.py(100): synchronize",
    ]
    found = rules(diagnose(sync_trace(tmp_path, frames)))
    f = found["epilogue-sync"]
    assert f.cost_us == 35.0  # [100, 135): queue empty until the next launch
    assert f.evidence["call_site"] == "deepspeed/runtime/zero/stage3.py(1407): independent_gradient_partition_epilogue"
    assert f.severity == "info"  # capped: the last bucket is always exposed
    assert "host-sync" not in found


def test_comms_logger_and_timer_syncs_are_recognised_by_their_frames(tmp_path: Path) -> None:
    logger = ["deepspeed/comm/comm.py(111): log_wrapper", "deepspeed/accelerator/cuda_accelerator.py(88): synchronize"]
    f = rules(diagnose(sync_trace(tmp_path / "a", logger, "cudaDeviceSynchronize")))["comms-logger-sync"]
    assert f.fix == Fix(config={"comms_logger.enabled": False})
    assert f.evidence["call_site"] == "deepspeed/comm/comm.py(111): log_wrapper"  # plumbing skipped
    timer = ["deepspeed/utils/timer.py(231): start", "deepspeed/accelerator/cuda_accelerator.py(88): synchronize"]
    f = rules(diagnose(sync_trace(tmp_path / "b", timer, "cudaDeviceSynchronize")))["throughput-timer-sync"]
    # no timers.throughput in the config: DeepSpeed < 0.14.3, which has no such key: the upgrade alone (docs/rules.md)
    assert f.fix == Fix(upgrade="deepspeed>=0.14.3")
    assert "then set timers.throughput.synchronized: false" in f.why
    configured = {"timers": {"throughput": {"enabled": True, "synchronized": True}}}
    f = rules(diagnose(sync_trace(tmp_path / "b", timer, "cudaDeviceSynchronize"), configured))
    assert f["throughput-timer-sync"].fix == Fix(config={"timers.throughput.synchronized": False})


def test_generic_sync_without_stacks_names_enclosing_ops(tmp_path: Path) -> None:
    folder = sync_trace(tmp_path, [])
    events = [
        step(1, 0, 300),
        launch(0, 1),
        kernel(GEMM, 0, 100, corr=1),
        cpu_op("aten::item", 8, 94),
        cpu_op("aten::_local_scalar_dense", 9, 92),
        runtime("cudaStreamSynchronize", 10, 90, 2),
        launch(130, 3),
        kernel(GEMM, 135, 50, corr=3),
    ]
    write_trace(folder, "rank0.trace.json.gz", events, rank=0, world_size=1)
    f = rules(diagnose(folder))["host-sync"]
    assert f.evidence["call_site"] == "aten::_local_scalar_dense < aten::item"
    assert f.cost_us == 35.0 and f.fix == Fix() and not f.fix


def test_sync_that_leaves_work_queued_costs_nothing(tmp_path: Path) -> None:
    # the host waits until 45 for a side-stream kernel (the event's), returns at 50 while the first kernel still
    # runs until 100; the next one is queued behind it
    events = [
        step(1, 0, 300),
        launch(0, 1),
        kernel(GEMM, 0, 100, corr=1),
        launch(4, 9),
        kernel(GEMM, 5, 40, stream=8, corr=9),
        runtime("cudaEventSynchronize", 10, 40, 2),
        launch(60, 3),
        kernel(GEMM, 100, 50, corr=3),
    ]
    write_trace(tmp_path, "rank0.trace.json.gz", events, rank=0, world_size=1)
    assert rules(diagnose(tmp_path))["host-sync"].cost_us == 0.0


def backward_trace(tmp_path: Path, rs_during_backward: bool) -> Path:
    """Backward kernels launched by the autograd thread (tid 200); reduce-scatter on stream 17 either after the
    last backward kernel (deferred) or during backward."""
    bwd = [(launch(10 + 10 * i, 10 + i, tid=200), kernel(GEMM, 20 + 100 * i, 100, corr=10 + i)) for i in range(5)]
    events = [step(1, 0, 2000)] + [e for pair in bwd for e in pair]
    rs_args = {
        "Collective name": "_reduce_scatter_base",
        "In msg nelems": 1000,
        "dtype": "BFloat16",
        "Process Group Name": "1",
    }
    if rs_during_backward:
        events += [launch(15, 50, tid=200), kernel(RS, 30, 400, stream=17, corr=50, **rs_args)]
    else:
        events += [launch(600, 50), kernel(RS, 620, 400, stream=17, corr=50, **rs_args)]
    write_trace(tmp_path, "rank0.trace.json.gz", events, rank=0, world_size=2)
    return tmp_path


def test_reduce_scatter_after_backward_is_deferred_and_fix_sized_from_parameters(tmp_path: Path) -> None:
    config = {
        "zero_optimization": {"stage": 3, "reduce_bucket_size": 500_000_000},
        "_overlapcheck_model": {"parameters": 1000},
    }
    f = rules(diagnose(backward_trace(tmp_path, False), config))["reduce-scatter-deferred"]
    assert f.evidence["deferred_share"] == 1.0
    assert f.fix == Fix(config={"zero_optimization.reduce_bucket_size": 250})  # a quarter of 1000 params
    assert 0 < f.cost_us <= 400.0
    assert "1,000 trainable parameters" in f.why


def test_sizes_read_from_the_same_reduce_scatters_do_not_make_it_deferred(tmp_path: Path) -> None:
    # no autograd thread, no config: bucket and parameter count would both come from the one reduce-scatter
    rs_args = {"Collective name": "_reduce_scatter_base", "In msg nelems": 1_048_576, "dtype": "BFloat16"}
    events = [
        step(1, 0, 2000),
        launch(0, 1),
        kernel(GEMM, 0, 400, corr=1),
        launch(10, 2),
        kernel(RS, 400, 400, corr=2, **rs_args),
        launch(20, 3),
        kernel(GEMM, 800, 400, corr=3),
    ]
    write_trace(tmp_path, "rank0.trace.json.gz", events, rank=0, world_size=2)
    assert "reduce-scatter-deferred" not in rules(diagnose(tmp_path))


@pytest.mark.symptom_without_cause("reduce-scatter-deferred")
def test_reduce_scatter_during_backward_is_not_deferred(tmp_path: Path) -> None:
    assert "reduce-scatter-deferred" not in rules(diagnose(backward_trace(tmp_path, True)))


def test_fix_never_repeats_what_the_config_sets() -> None:
    config = {"zero_optimization": {"reduce_bucket_size": 50_000_000, "stage3_prefetch_bucket_size": 0}}
    assert make_fix(config, {"zero_optimization.reduce_bucket_size": 50_000_000}) == Fix()
    assert make_fix(config, {"zero_optimization.reduce_bucket_size": 1}) == Fix(
        config={"zero_optimization.reduce_bucket_size": 1}
    )
    assert config_value(config, "zero_optimization.stage3_prefetch_bucket_size") == 0
    assert (
        config_value(
            {"zero_optimization": {"prefetch_bucket_size": 7}}, "zero_optimization.stage3_prefetch_bucket_size"
        )
        == 7
    )
    assert make_fix(None, env={"CUDA_DEVICE_MAX_CONNECTIONS": None}) == Fix(env={"CUDA_DEVICE_MAX_CONNECTIONS": None})
    assert round_size(58_571_428) == 59_000_000 and round_size(250) == 250


def test_severity_from_the_share_of_the_step_and_the_rule() -> None:
    plain = BY_ID["host-sync"]  # default shares (10 %, 3 %), no cap
    assert severity_of(20, 100, plain) == "critical"
    assert severity_of(5, 100, plain) == "warning"
    assert severity_of(1, 100, plain) == "info"
    assert severity_of(50, 0, plain) == "info"  # no step time: no share
    assert severity_of(50, 100, BY_ID["epilogue-sync"]) == "info"  # capped at info
    assert severity_of(50, 100, BY_ID["tiny-collectives"]) == "warning"  # capped at warning
    waits = BY_ID["cross-stream-wait"]  # partly inherent: needs 15 % / 5 %
    assert severity_of(12, 100, waits) == "warning" and severity_of(4, 100, waits) == "info"
    assert severity_of(15, 100, waits) == "critical"


def test_frames_classified_as_deepspeed_user_or_library() -> None:
    assert parse_frame("deepspeed/runtime/zero/stage3.py(1667): __reduce_and_partition_ipg_grads") == (
        "deepspeed/runtime/zero/stage3.py",
        1667,
        "__reduce_and_partition_ipg_grads",
    )
    assert is_user("/home/me/train.py(52): main") and not is_user("torch/nn/modules/module.py(1782): _call_impl")
    assert not is_site("deepspeed/accelerator/cuda_accelerator.py(88): synchronize")
    assert not is_user("<built-in method synchronize of ...>")
    names = functions(["/opt/venv/lib/python3.11/site-packages/deepspeed/utils/timer.py(231): start"])
    assert "timer.py:start" in names and "start" in names


def test_shared_communicator_and_serialized_all_gather(tmp_path: Path) -> None:
    # an all-gather prefetched at -1 waits on the shared communicator until the reduce-scatter ends at 300;
    # compute on stream 7 waits for the all-gather (stream wait) and idles from 100 to 500
    pg = {"Process Group Name": "2", "In msg nelems": 10, "dtype": "BFloat16"}
    events = [
        step(1, 0, 1000),
        launch(0, 1),
        kernel(GEMM, 0, 100, corr=1),
        launch(-2, 2),
        kernel(RS, 50, 250, stream=25, corr=2, **{"Collective name": "_reduce_scatter_base", **pg}),
        launch(-1, 3),
        kernel(AG, 300, 200, stream=29, corr=3, **{"Collective name": "_allgather_base", **pg}),
        launch(3, 4),
        kernel(GEMM, 500, 100, corr=4),
    ]
    write_trace(tmp_path, "rank0.trace.json.gz", events, rank=0, world_size=2)
    found = rules(diagnose(tmp_path, {"_overlapcheck_job": {"gpus_per_node": 8}}))
    f = found["same-communicator"]
    assert f.evidence["process_group"] == "2"
    assert f.cost_us == 301.0  # the all-gather was ready at -1 and waited until 300 (within the 400 µs stall)
    assert f.fix == Fix(config={"zero_optimization.zero_hpz_partition_size": 8})
    assert "cross-stream-wait" not in found  # the rest is the step's first all-gather: waited for in any case


def test_streams_that_never_overlap_point_to_max_connections(tmp_path: Path) -> None:
    ag = {"Collective name": "_allgather_base", "Process Group Name": "0", "In msg nelems": 10, "dtype": "BFloat16"}
    # kernels run strictly in launch order across streams; the step's first all-gather, issued at 1 µs while the
    # first GEMM ran until 100 µs, could have overlapped that GEMM (99 µs); the rest of it is waited for in any
    # configuration; the second one (prefetched, 300 µs) is waited for only because the streams are serialized
    events = [
        step(1, 0, 2000),
        launch(0, 1),
        kernel(GEMM, 0, 100, corr=1),
        launch(1, 2),
        kernel(AG, 100, 300, stream=21, corr=2, **ag),
        launch(2, 3),
        kernel(GEMM, 400, 100, corr=3),
        launch(3, 4),
        kernel(AG, 500, 300, stream=21, corr=4, **ag),
        launch(4, 5),
        kernel(GEMM, 800, 100, corr=5),
    ]
    write_trace(tmp_path, "rank0.trace.json.gz", events, rank=0, world_size=2)
    found = rules(diagnose(tmp_path))
    f = found["no-stream-concurrency"]
    assert f.cost_us == 399.0 and f.fix == Fix(env={"CUDA_DEVICE_MAX_CONNECTIONS": None})
    assert f.evidence["stalls_per_step"] == 2.0
    assert "cross-stream-wait" not in found and "allgather-not-prefetched" not in found


def test_straggler_found_from_durations_despite_clock_offsets(tmp_path: Path) -> None:
    # rank 1 arrives last at every all-reduce: its kernels are the shortest; rank 0's clock is 1 s ahead
    ar = {"Collective name": "allreduce", "Process Group Name": "0", "In msg nelems": 10, "dtype": "Float"}
    for rank, (offset, dur, compute) in enumerate([(1e6, 500, 100), (0, 100, 500)]):
        events = [step(1, offset, 5000)]
        for i in range(4):
            t = offset + 1000 * i
            events += [
                launch(t, 10 * i + 1),
                kernel(GEMM, t, compute, corr=10 * i + 1),
                launch(t + 1, 10 * i + 2),
                kernel("ncclKernel_AllReduce_RING_LL_Sum_float", t + compute, dur, stream=40, corr=10 * i + 2, **ar),
            ]
        write_trace(tmp_path, f"rank{rank}.trace.json.gz", events, rank=rank, world_size=2)
    f = rules(diagnose(tmp_path))["straggler"]
    assert f.ranks == [1] and f.evidence["last_to_arrive"] == "4/4 collectives"
    assert f.cost_us == 1600.0  # rank 1 computes 400 µs longer before each of the 4 all-reduces


def test_fix_drops_upgrades_and_variables_the_job_already_has(tmp_path: Path) -> None:
    timer = ["deepspeed/utils/timer.py(231): start", "deepspeed/accelerator/cuda_accelerator.py(88): synchronize"]
    folder = sync_trace(tmp_path, timer, "cudaDeviceSynchronize")
    new = {"_overlapcheck_job": {"deepspeed": "0.15.1", "env": {}}}
    assert rules(diagnose(folder, new))["throughput-timer-sync"].fix == Fix(
        config={"timers.throughput.synchronized": False}
    )
    old = {"_overlapcheck_job": {"deepspeed": "0.13.3"}}
    assert rules(diagnose(folder, old))["throughput-timer-sync"].fix.upgrade == "deepspeed>=0.14.3"


def test_many_small_all_gathers_are_latency_bound(tmp_path: Path) -> None:
    # 40 all-gathers of 1000 bf16 elements (2 KB) in one step, each exposed for 20 µs
    ag = {"Collective name": "_allgather_base", "Process Group Name": "0", "In msg nelems": 1000, "dtype": "BFloat16"}
    events = [step(1, 0, 10_000)]
    for i in range(40):
        events += [
            launch(100 * i, 2 * i + 1),
            kernel(GEMM, 100 * i, 50, corr=2 * i + 1),
            launch(100 * i + 1, 2 * i + 2),
            kernel(AG, 100 * i + 60, 20, stream=21, corr=2 * i + 2, **ag),
        ]
    write_trace(tmp_path, "rank0.trace.json.gz", events, rank=0, world_size=2)
    config = {"zero_optimization": {"stage3_param_persistence_threshold": 100_000}}
    f = rules(diagnose(tmp_path, config))["tiny-collectives"]
    assert f.cost_us == 800.0 and f.evidence["per_step"] == 40 and f.evidence["median_bytes"] == 2000
    assert f.fix == Fix(config={"zero_optimization.stage3_param_persistence_threshold": 1_000_000})
    assert f.severity == "warning"  # capped: latency-bound calls are a tuning matter
