"""Each rule's symptom without its cause (docs/rules.md, "How a finding is built"): hand-built traces that show
what a rule looks at (a sync under its frames, exposed reduce-scatters, small collectives, stalls on all-gathers)
while the trace lacks its precondition, so the rule must not fire; each next to the same trace with the cause
present, which does fire, so the negative cannot pass because the trace misses the rule's frames or symptom."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from builders import cpu_op, frame, kernel, launch, runtime, step, write_trace
from builders import diagnose_events as diagnose
from builders import findings_by_rule as rules

from overlapcheck.analysis import intervals as iv
from overlapcheck.analysis.metrics import analyze_model
from overlapcheck.diagnose.facts.coverage import gradient_tails, inherent_windows, whole_model_share
from overlapcheck.diagnose.facts.hostsyncs import origin_of
from overlapcheck.diagnose.facts.view import RankFacts
from overlapcheck.model import Fix
from overlapcheck.trace.reader import load_trace

GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n"
RS = "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
AG = "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
COMPUTE = 7
DTOD = "Memcpy DtoD (Device -> Device)"
SYNC_RULES = {
    "comms-logger-sync",
    "throughput-timer-sync",
    "offload-blocking-copy",
    "reduce-event-throttle",
    "fetch-throttle",
    "epilogue-sync",
    "host-sync",
}
TIMED_OP = "deepspeed/comm/comm.py(117): timed_op"
TIMER_STOP = "deepspeed/utils/timer.py(258): stop"
SYNCHRONIZE = "deepspeed/accelerator/cuda_accelerator.py(88): synchronize"
EPILOGUE = "deepspeed/runtime/zero/stage3.py(1407): independent_gradient_partition_epilogue"
PARTITION_GRADS = "deepspeed/runtime/zero/stage3.py(1568): partition_grads"
REDUCE_THROTTLE = "deepspeed/runtime/zero/stage3.py(1667): __reduce_and_partition_ipg_grads"
FETCH = "deepspeed/runtime/zero/partitioned_param_coordinator.py(385): fetch_sub_module"


def facts_of(folder: Path, events: list[dict[str, Any]]) -> RankFacts:
    """`events` written as rank 0 in `folder`, read back as its facts."""
    folder.mkdir(parents=True, exist_ok=True)
    write_trace(folder, "rank0.trace.json.gz", events, rank=0, world_size=2)
    return facts(folder)


def facts(folder: Path) -> RankFacts:
    model = load_trace(str(folder / "rank0.trace.json.gz"))
    return RankFacts(model, analyze_model(model))


def coll(name: str, pg: str = "0", nelems: int = 1 << 20) -> dict[str, Any]:
    return {"Collective name": name, "Process Group Name": pg, "In msg nelems": nelems, "dtype": "BFloat16"}


def wait_event(ts: float, corr: int, stream: int, wait_on: int) -> list[dict[str, Any]]:
    """cudaStreamWaitEvent at `ts` making `stream` wait for `wait_on`, with its `Stream Wait Event` record."""
    call = runtime("cudaStreamWaitEvent", ts, 0.5, corr)
    rec = {
        "ph": "X",
        "cat": "cuda_sync",
        "name": "Stream Wait Event",
        "pid": 0,
        "tid": stream,
        "ts": ts + 0.1,
        "dur": 0.3,
        "args": {
            "cuda_sync_kind": "Stream Wait Event",
            "stream": stream,
            "wait_on_stream": wait_on,
            "correlation": corr,
        },
    }
    return [call, rec]


def copy(name: str, ts: float, dur: float, corr: int, stream: int = COMPUTE) -> dict[str, Any]:
    return {
        "ph": "X",
        "cat": "gpu_memcpy",
        "name": name,
        "pid": 0,
        "tid": stream,
        "ts": ts,
        "dur": dur,
        "args": {"device": 0, "stream": stream, "correlation": corr},
    }


def framed(frames: list[str], start: float, end: float) -> list[dict[str, Any]]:
    """`frames` (outermost first) nested around a call [start, end)."""
    return [frame(name, start - 5 + i, end - start + 10 - 2 * i) for i, name in enumerate(frames)]


def sync_step(
    frames: list[str], sync_at: float, sync_us: float, call: str = "cudaDeviceSynchronize", step_us: float = 400
) -> list[dict[str, Any]]:
    """ProfilerStep#1 [0, step_us); a GEMM [0, 100) launched at 0; the host blocks in `call` [sync_at, + sync_us)
    inside `frames`; the next GEMM is launched at 160 and starts at 165: the compute stream starves [100, 165)."""
    return [
        step(1, 0, step_us),
        launch(0, 1),
        kernel(GEMM, 0, 100, corr=1),
        runtime(call, sync_at, sync_us, 2),
        *framed(frames, sync_at, sync_at + sync_us),
        launch(160, 3),
        kernel(GEMM, 165, 50, corr=3),
    ]


def origins(folder: Path) -> list[tuple[str, bool]]:
    """(origin, waited) of every candidate blocking call of the rank: the call was matched to its frames."""
    return [(origin_of(s), s.waited) for s in facts(folder).host_syncs.syncs]


# -- sync rules: the call under the rule's frames did not wait, or lies outside the steps ---------------------


@pytest.mark.symptom_without_cause("comms-logger-sync")
def test_comms_logger_sync_with_nothing_pending_is_no_finding(tmp_path: Path) -> None:
    # the device sync [120, 150) under timed_op begins after the GEMM ended (100): nothing ends inside it, though
    # it returns inside the starved stretch [100, 165)
    report = diagnose(tmp_path / "idle", sync_step([TIMED_OP, SYNCHRONIZE], 120, 30))
    assert origins(tmp_path / "idle") == [("comms-logger", False)]  # its frames matched; it waited for nothing
    assert not rules(report).keys() & SYNC_RULES
    # the same sync begun at 60 waits 40 µs for the GEMM: the host could have launched 65 µs earlier
    f = rules(diagnose(tmp_path / "waits", sync_step([TIMED_OP, SYNCHRONIZE], 60, 90)))["comms-logger-sync"]
    assert f.cost_us == 65.0 and f.evidence["waited_calls"] == 1 and f.evidence["awaited"] == {"compute": 1}
    assert f.evidence["call_site"] == TIMED_OP


@pytest.mark.symptom_without_cause("throughput-timer-sync")
def test_throughput_timer_sync_outside_every_profiled_step_is_no_finding(tmp_path: Path) -> None:
    # ThroughputTimer.stop's device sync [60, 150) waits for the GEMM (ends at 100) and the stream starves until
    # 165, but ProfilerStep#1 is [0, 50): the call lies outside every profiled step
    trace = sync_step([TIMER_STOP, SYNCHRONIZE], 60, 90, step_us=50)
    report = diagnose(tmp_path / "outside", trace)
    assert facts(tmp_path / "outside").host_syncs.syncs == []  # left out before any matching
    assert not rules(report).keys() & SYNC_RULES
    # the step [0, 400) encloses it: a finding of the 65 µs starvation
    f = rules(diagnose(tmp_path / "inside", sync_step([TIMER_STOP, SYNCHRONIZE], 60, 90)))["throughput-timer-sync"]
    assert f.cost_us == 65.0 and f.evidence["call_site"] == TIMER_STOP and f.evidence["waited_calls"] == 1


@pytest.mark.symptom_without_cause("epilogue-sync")
def test_epilogue_stream_sync_with_nothing_pending_is_no_finding(tmp_path: Path) -> None:
    frames = [EPILOGUE, "torch/cuda/streams.py(100): synchronize"]
    report = diagnose(tmp_path / "idle", sync_step(frames, 120, 30, call="cudaStreamSynchronize"))
    assert origins(tmp_path / "idle") == [("epilogue", False)]
    assert not rules(report).keys() & SYNC_RULES
    # begun at 60 it waits for the GEMM; the GPU idles over [100, 165) (no other work): all of it is its
    f = rules(diagnose(tmp_path / "waits", sync_step(frames, 60, 90, call="cudaStreamSynchronize")))["epilogue-sync"]
    assert f.cost_us == 65.0 and f.severity == "info" and f.evidence["call_site"] == EPILOGUE


def offload_step(copy_name: str) -> list[dict[str, Any]]:
    """partition_grads copies a gradient with cudaMemcpyAsync [10, 125) (correlation 2) while a GEMM runs [0, 100)
    on the same stream; its copy runs [100, 120); the next GEMM is launched at 130 and starts at 135."""
    return [
        step(1, 0, 400),
        launch(0, 1),
        kernel(GEMM, 0, 100, corr=1),
        *framed([PARTITION_GRADS], 10, 125),
        runtime("cudaMemcpyAsync", 10, 115, 2),
        copy(copy_name, 100, 20, 2),
        launch(130, 3),
        kernel(GEMM, 135, 50, corr=3),
    ]


@pytest.mark.symptom_without_cause("offload-blocking-copy")
@pytest.mark.parametrize("copy_name", ["Memcpy DtoD (Device -> Device)", "Memcpy DtoH (Device -> Pinned)"])
def test_offload_copy_that_cannot_block_is_no_finding(tmp_path: Path, copy_name: str) -> None:
    # the call returns at 125, after its copy ended (120), but a device-to-device copy, or an asynchronous one
    # into pinned memory, never holds the host (CUDA's API synchronization behaviour): it did not wait
    report = diagnose(tmp_path, offload_step(copy_name))
    assert origins(tmp_path) == [("offload-copy", False)]
    assert not rules(report).keys() & SYNC_RULES


def test_offload_copy_into_pageable_memory_blocks(tmp_path: Path) -> None:
    # the same copy into pageable memory waits for the GEMM queued on its stream, then for itself: the stream
    # starves [120, 135), 15 µs, less what stays exposed once pinned: the copy's 20 µs at 22/6 the pageable
    # bandwidth, with no compute beside it (120/22 µs)
    f = rules(diagnose(tmp_path, offload_step("Memcpy DtoH (Device -> Pageable)")))["offload-blocking-copy"]
    assert f.cost_us == pytest.approx(15.0 - 20.0 * 6.0 / 22.0, abs=1e-3)
    assert f.evidence["waited_calls"] == 1 and f.evidence["awaited"] == {"memcpy": 1}


def throttle_step(frames: list[str], sync_us: float, collective: str, args: dict[str, Any]) -> list[dict[str, Any]]:
    """GEMM A [0, 200) launched at 0; a collective launched at 10 runs [20, 220) on stream 17; the host calls
    cudaEventSynchronize [25, 25 + sync_us) inside `frames`; GEMM B is launched at 230 and starts at 235: the
    compute stream starves [200, 235)."""
    return [
        step(1, 0, 1000),
        launch(0, 1),
        kernel(GEMM, 0, 200, corr=1),
        launch(10, 2),
        kernel(collective, 20, 200, stream=17, corr=2, **args),
        *framed(frames, 25, 25 + sync_us),
        runtime("cudaEventSynchronize", 25, sync_us, 3),
        launch(230, 4),
        kernel(GEMM, 235, 100, corr=4),
    ]


def throttle_case(tmp_path: Path, rule: str, origin: str, site: str, collective: str, args: dict[str, Any]) -> None:
    """A throttle's cudaEventSynchronize that returns before any GPU work ends is no finding; held until its
    collective ends, it is one."""
    # the call [25, 35) returns while GEMM A (until 200) and the collective (until 220) still run: it waited for
    # nothing; the compute stream starves [200, 235) because the host launched GEMM B late, not because of it
    report = diagnose(tmp_path / "early", throttle_step([site], 10, collective, args))
    assert origins(tmp_path / "early") == [(origin, False)]  # its frames matched; it waited for nothing
    assert not rules(report).keys() & SYNC_RULES
    # the same call held until the collective ended at 220 waited for it: GEMM B could have been launched 35 µs
    # earlier (its 195 µs block bounds nothing here: the window is 35 µs)
    f = rules(diagnose(tmp_path / "waits", throttle_step([site], 195, collective, args)))[rule]
    kind = "reduce_scatter" if collective == RS else "all_gather"
    assert f.cost_us == 35.0 and f.evidence["awaited"] == {kind: 1} and f.evidence["call_site"] == site


@pytest.mark.symptom_without_cause("reduce-event-throttle")
def test_reduce_throttle_event_sync_that_returns_before_any_gpu_work_ends_is_no_finding(tmp_path: Path) -> None:
    throttle_case(
        tmp_path, "reduce-event-throttle", "reduce-throttle", REDUCE_THROTTLE, RS, coll("_reduce_scatter_base")
    )


@pytest.mark.symptom_without_cause("fetch-throttle")
def test_fetch_throttle_event_sync_that_returns_before_any_gpu_work_ends_is_no_finding(tmp_path: Path) -> None:
    throttle_case(tmp_path, "fetch-throttle", "gather-throttle", FETCH, AG, coll("_allgather_base"))


# -- bucket rules ---------------------------------------------------------------------------------------------


def backward_then_reduce(rs_stream: int) -> list[dict[str, Any]]:
    """Five backward GEMMs [20 + 100 i, + 100) launched by the autograd thread (tid 200); a reduce-scatter of
    1000 elements launched at 600 by the step's thread runs [620, 1020) on `rs_stream`, after all of them."""
    events = [step(1, 0, 2000)]
    for i in range(5):
        events += [launch(10 + 10 * i, 10 + i, tid=200), kernel(GEMM, 20 + 100 * i, 100, corr=10 + i)]
    events += [
        launch(600, 50),
        kernel(RS, 620, 400, stream=rs_stream, corr=50, **coll("_reduce_scatter_base", "1", 1000)),
    ]
    return events


@pytest.mark.symptom_without_cause("overlap-comm-disabled")
def test_reduce_scatter_exposed_after_backward_on_its_own_stream_is_not_overlap_comm_disabled(tmp_path: Path) -> None:
    # the reduce-scatter is fully exposed (400 µs after the last backward kernel) but on stream 17, not the
    # compute stream, and the config does not turn overlap_comm off: deferred, not serialized with backward
    config = {"zero_optimization": {"stage": 3, "reduce_bucket_size": 250}, "_overlapcheck_model": {"parameters": 1000}}
    found = rules(diagnose(tmp_path / "own", backward_then_reduce(17), config))
    assert "overlap-comm-disabled" not in found
    # reduce-scatter-deferred owns it: 400 µs less the last bucket (250 of the 1000 elements: a quarter)
    assert found["reduce-scatter-deferred"].cost_us == 300.0
    # on the compute stream it is overlap_comm off: the same exposed 400 µs less the last 250-element bucket
    f = rules(diagnose(tmp_path / "compute", backward_then_reduce(COMPUTE), config))["overlap-comm-disabled"]
    assert f.cost_us == 300.0 and f.evidence["reduce_scatters_on_compute_stream"] == 1


def epilogue_flush(flushes: int, copies: int = 4, stream: int = 17, frames: bool = False) -> list[dict[str, Any]]:
    """Four backward GEMMs [20 + 100 i, + 100) launched by the autograd thread (tid 200) inside its backward op,
    after each a gradient copied into the bucket (a 1 µs device-to-device memcpy on the reduce stream 17;
    `copies` of them share 2000 bytes). With `flushes` 1 the bucket holds every gradient and the epilogue issues
    one 1000-element reduce-scatter [620, 1020) after backward; with 4, a 250-element reduce-scatter
    [125 + 100 i, + 90) follows each copy during backward and only the last one [425, 515) is after it. As
    DeepSpeed's partition_grads does, the autograd thread launches the gradient partition `copy_` on the reduce
    stream right after each reduce-scatter (it runs 5 µs after it ends). `stream`: the reduce stream (the
    compute stream with overlap_comm off); `frames`: the partition copy is launched under partition_grads."""
    events = [step(1, 0, 2000), cpu_op("autograd::engine::evaluate_function: MmBackward0", 5, 120, tid=200)]
    for i in range(4):
        events += [launch(10 + 20 * i, 10 + i, tid=200), kernel(GEMM, 20 + 100 * i, 100, corr=10 + i)]
        if i < copies:
            events += [launch(11 + 20 * i, 20 + i, tid=200), copy(DTOD, 121 + 100 * i, 1, 20 + i, 17)]
            events[-1]["args"]["bytes"] = 2000 // copies
    if flushes == 1:
        reductions = [(100.0, 620.0, 1000, 400.0)]
    else:
        reductions = [(12.0 + 20 * j, 125.0 + 100 * j, 250, 90.0) for j in range(4)]
    for j, (at, start, nelems, dur) in enumerate(reductions):
        rs = kernel(RS, start, dur, stream=stream, corr=30 + j, **coll("_reduce_scatter_base", "1", nelems))
        partition = kernel("void at::native::direct_copy_kernel_cuda", start + dur + 5, 5, stream=stream, corr=40 + j)
        events += [launch(at, 30 + j, tid=200), rs, launch(at + 1, 40 + j, tid=200), partition]
        if frames:
            events += [frame(PARTITION_GRADS, at + 0.5, 1, tid=200)]
    return events


@pytest.mark.symptom_without_cause("reduce-scatter-deferred")
def test_buckets_flushed_during_backward_are_not_deferred_though_partition_copies_follow(tmp_path: Path) -> None:
    # four buckets, each reduce-scatter launched by the autograd thread during backward; only the last bucket's
    # runs after the last compute-stream kernel: a quarter of the volume, not deferral
    config = {"zero_optimization": {"stage": 3, "reduce_bucket_size": 250}}
    assert "reduce-scatter-deferred" not in rules(diagnose(tmp_path / "buckets", epilogue_flush(4), config))


def test_one_bucket_flushed_by_the_epilogue_is_deferred_despite_its_partition_copy(tmp_path: Path) -> None:
    # one 1000-element bucket after backward, launched (with its partition copy_ on the reduce stream after it)
    # by the autograd thread: the copy is not backward's last kernel, so the whole reduce-scatter is deferred;
    # the cost is its 400 µs less the last bucket of the suggested 250 elements (a quarter)
    config = {"zero_optimization": {"stage": 3, "reduce_bucket_size": 500_000_000}}
    report = diagnose(tmp_path / "one", epilogue_flush(1), config)
    f = rules(report)["reduce-scatter-deferred"]
    assert f.evidence["deferred_share"] == 1.0 and f.cost_us == 300.0
    assert f.fix.config == {"zero_optimization.reduce_bucket_size": 250}


def test_with_overlap_comm_off_the_partition_copy_under_its_frame_is_not_backwards_last_kernel(tmp_path: Path) -> None:
    # the same epilogue flush on the compute stream (overlap_comm off): there the partition copy_ is a
    # compute-stream kernel after the reduce-scatter, and only its partition_grads frame tells it from backward
    config = {"zero_optimization": {"stage": 3, "reduce_bucket_size": 500_000_000}}
    framed_copy = rules(diagnose(tmp_path / "framed", epilogue_flush(1, stream=COMPUTE, frames=True), config))
    assert framed_copy["reduce-scatter-deferred"].evidence["deferred_share"] == 1.0


@pytest.mark.symptom_without_cause("reduce-scatter-deferred")
def test_a_single_gradient_reduced_after_backward_is_its_inherent_last_bucket(tmp_path: Path) -> None:
    # one reduce-scatter after backward that took in one gradient copy: a single tensor no bucket splits, so
    # its transfer is inherent whole (no finding could cover it)
    view = facts_of(tmp_path / "single", epilogue_flush(1, copies=1))
    tail = gradient_tails(view)[0]
    assert whole_model_share(view, tail) == 1.0
    assert iv.length(inherent_windows(view)) == 400.0


def test_the_whole_model_in_one_bucket_is_inherent_only_as_its_last_suggested_bucket(tmp_path: Path) -> None:
    # the same reduce-scatter took in four gradient copies: the whole model in one bucket, the deferral; only
    # the last of the suggested 250-element buckets (a quarter of its 400 µs transfer) is inherent
    view = facts_of(tmp_path / "whole", epilogue_flush(1))
    assert whole_model_share(view, gradient_tails(view)[0]) == 0.25
    assert iv.length(inherent_windows(view)) == 100.0


def gathers(n: int, nelems: int) -> list[dict[str, Any]]:
    """One step: `n` times a GEMM [100 i, + 50) and an all-gather of `nelems` bf16 elements [100 i + 60, + 20)
    after it, each all-gather exposed for 20 µs."""
    events = [step(1, 0, 10_000)]
    for i in range(n):
        events += [
            launch(100 * i, 2 * i + 1),
            kernel(GEMM, 100 * i, 50, corr=2 * i + 1),
            launch(100 * i + 1, 2 * i + 2),
            kernel(AG, 100 * i + 60, 20, stream=21, corr=2 * i + 2, **coll("_allgather_base", nelems=nelems)),
        ]
    return events


@pytest.mark.symptom_without_cause("tiny-collectives")
def test_many_large_or_few_small_collectives_are_not_tiny(tmp_path: Path) -> None:
    # 40 exposed all-gathers per step of 1 MiB (2 bytes x 2^19 elements: not under 1 MiB)
    assert "tiny-collectives" not in rules(diagnose(tmp_path / "large", gathers(40, 1 << 19)))
    # 31 all-gathers of 2 KB per step: one fewer than the 32 that make a pattern
    assert "tiny-collectives" not in rules(diagnose(tmp_path / "few", gathers(31, 1000)))
    # 32 of 2 KB: tiny, 32 x 20 µs exposed; and 40 of 1 MiB less one element
    f = rules(diagnose(tmp_path / "tiny", gathers(32, 1000)))["tiny-collectives"]
    assert f.cost_us == 640.0 and f.evidence["per_step"] == 32 and f.evidence["median_bytes"] == 2000
    f = rules(diagnose(tmp_path / "just-under", gathers(40, (1 << 19) - 1)))["tiny-collectives"]
    assert f.cost_us == 800.0 and f.evidence["median_bytes"] == (1 << 20) - 2


# -- stream and wait rules ------------------------------------------------------------------------------------


def gather_behind_reduce(ag_group: str) -> list[dict[str, Any]]:
    """The step's first all-gather [2, 40) (stream 29) hides behind GEMM 0 [5, 100); a reduce-scatter of group
    "1" runs [50, 300) on stream 25; the gather stream is made to wait for it (cudaStreamWaitEvent at 3), so the
    next all-gather, of `ag_group`, launched at 4, runs [300, 500); the compute stream waits for it (at 5) and
    GEMM 1, launched at 6, idles [100, 500)."""
    return [
        step(1, 0, 1000),
        launch(0, 1),
        kernel(AG, 2, 38, stream=29, corr=1, **coll("_allgather_base", ag_group)),
        launch(1, 2),
        kernel(GEMM, 5, 95, corr=2),
        launch(2, 3),
        kernel(RS, 50, 250, stream=25, corr=3, **coll("_reduce_scatter_base", "1")),
        *wait_event(3, 4, 29, 25),
        launch(4, 5),
        kernel(AG, 300, 200, stream=29, corr=5, **coll("_allgather_base", ag_group)),
        *wait_event(5, 6, COMPUTE, 29),
        launch(6, 7),
        kernel(GEMM, 500, 100, corr=7),
    ]


@pytest.mark.symptom_without_cause("same-communicator")
def test_gather_serialized_behind_a_reduce_scatter_of_another_group_is_not_same_communicator(tmp_path: Path) -> None:
    # the all-gather (group "2") starts exactly when the reduce-scatter (group "1") ends, and compute stalls on
    # it, but an explicit stream wait orders them: no communicator carries both kinds
    view_folder = tmp_path / "apart"
    found = rules(diagnose(view_folder, gather_behind_reduce("2")))
    assert facts(view_folder).shared_communicator is None
    assert "same-communicator" not in found
    # on group "1" too, NCCL's shared stream is the reason as well: ready at 40 (its stream's previous gather
    # ended), it waited until 300 behind the reduce-scatter: 260 µs of the 400 µs stall
    f = rules(diagnose(tmp_path / "shared", gather_behind_reduce("1")))["same-communicator"]
    assert f.cost_us == 260.0 and f.evidence["process_group"] == "1"
    assert f.evidence["delayed_all_gathers_per_step"] == 1.0


def on_demand_gathers(ahead_us: float | None = None) -> list[dict[str, Any]]:
    """GEMM A [0, 300) and the step's first all-gather [5, 50); then twice, at t = 400 and 700: an all-gather
    launched at t (after the compute before it) runs [t + 4, t + 204) as soon as it is launched, and the GEMM
    that needs it, launched at t + 2, waits until t + 204: stalls [402, 604) and [702, 904). The host is behind:
    the second module is launched 46 µs after the GPU ran dry (654), so a prefetch would save the second stall
    only: the first one's saving ends in that wait for the host (waits.py host_slack): 202 µs. With `ahead_us`,
    a GEMM [t + 254, t + 294) follows each stalled one, launched `ahead_us` before it starts: the GPU then runs
    dry 6 µs before the next module's launch (launch latency, not a host-starved window)."""
    events = [
        step(1, 0, 2000),
        launch(0, 1),
        kernel(GEMM, 0, 300, corr=1),
        launch(1, 2),
        kernel(AG, 5, 45, stream=21, corr=2, **coll("_allgather_base")),
    ]
    corr = 3
    for t in (400.0, 700.0):
        events += [
            launch(t, corr),
            kernel(AG, t + 4, 200, stream=21, corr=corr, **coll("_allgather_base")),
            *wait_event(t + 1, corr + 1, COMPUTE, 21),
            launch(t + 2, corr + 2),
            kernel(GEMM, t + 204, 50, corr=corr + 2),
        ]
        corr += 3
    if ahead_us is not None:
        for i, t in enumerate((400.0, 700.0)):
            events += [launch(t + 254 - ahead_us, 50 + i), kernel(GEMM, t + 254, 40, corr=50 + i)]
    return events


def steps_fetching_on_demand(numbers: list[int], on_demand_in: set[int], synced: bool = False) -> list[dict[str, Any]]:
    """`ProfilerStep#n` for each of `numbers`, 2000 µs apart; each as `on_demand_gathers(ahead_us=250)` (two
    202 µs stalls on all-gathers issued when their module ran, the host ahead within the step) if n is in
    `on_demand_in`, else the same compute with nothing fetched late. The host launches each step's first GEMM
    at its start, after the GPU ran dry: prefetched, a step's stalls would only wait longer for it, except in the
    last step. `synced`: a cudaDeviceSynchronize [960, 995) ends each step, so the host waited for the GPU and
    the next step's launches come earlier with it: each step's last stall is saved (202 µs a step)."""
    events: list[dict[str, Any]] = []
    for i, n in enumerate(numbers):
        step_events = on_demand_gathers(250.0) if n in on_demand_in else on_demand_gathers()[:5]
        base, corr = 2000.0 * i, 100 * i
        for e in step_events:
            e = {**e, "ts": e["ts"] + base, "args": dict(e.get("args", {}))}
            if "correlation" in e["args"]:
                e["args"]["correlation"] += corr
            if e["name"].startswith("ProfilerStep#"):
                e["name"] = f"ProfilerStep#{n}"
            events.append(e)
        if synced:
            events.append(runtime("cudaDeviceSynchronize", base + 960, 35, 90 + corr))
    return events


@pytest.mark.symptom_without_cause("allgather-not-prefetched")
def test_on_demand_fetches_only_in_the_jobs_first_step_are_its_warm_up(tmp_path: Path) -> None:
    # ProfilerStep#0, the job's first step, fetches on demand (DeepSpeed records its parameter trace there);
    # steps 1 and 2 do not: a warm-up, info without a fix, not a missing prefetch
    found = rules(diagnose(tmp_path / "first", steps_fetching_on_demand([0, 1, 2], {0})))
    assert "allgather-not-prefetched" not in found
    f = found["first-step-warm-up"]
    assert f.severity == "info" and f.fix == Fix() and f.steps == [0]
    assert f.cost_us == round(404.0 / 3, 3) and f.evidence["on_demand_fetches_in_step"] == 2


@pytest.mark.symptom_without_cause("first-step-warm-up")
def test_on_demand_fetches_in_a_later_first_step_or_in_every_step_are_not_prefetched(tmp_path: Path) -> None:
    # the same pattern in the first profiled step of a profiler with wait and warm-up steps (ProfilerStep#2):
    # not the job's first step, so a re-recorded (invalidated) trace; the finding names that step only and
    # counts its fetches per step where they hold (2), not averaged over the three steps (0.67, below 2)
    found = rules(diagnose(tmp_path / "later", steps_fetching_on_demand([2, 3, 4], {2}, synced=True)))
    assert "first-step-warm-up" not in found
    f = found["allgather-not-prefetched"]
    assert f.steps == [2] and f.evidence["on_demand_fetches_per_step"] == round(2 / 3, 2)
    # from step 0 on, but repeated in the later steps (dynamic control flow): no warm-up either
    found = rules(diagnose(tmp_path / "every", steps_fetching_on_demand([0, 1, 2], {0, 1, 2}, synced=True)))
    assert "first-step-warm-up" not in found and found["allgather-not-prefetched"].steps == [0, 1, 2]


def queued_gathers() -> list[dict[str, Any]]:
    """The host issues three all-gathers at once, at 0, 0.5 and 0.7, before GEMM A (launched at 1, [5, 305)): they
    run back to back on stream 21, [2, 50), [50, 650), [650, 1050); GEMM B (launched at 3) waits for the second,
    GEMM C (launched at 5) for the third: stalls [305, 650) and [700, 1050)."""
    return [
        step(1, 0, 2000),
        launch(0, 1),
        kernel(AG, 2, 48, stream=21, corr=1, **coll("_allgather_base")),
        launch(0.5, 2),
        kernel(AG, 50, 600, stream=21, corr=2, **coll("_allgather_base")),
        launch(0.7, 3),
        kernel(AG, 650, 400, stream=21, corr=3, **coll("_allgather_base")),
        launch(1, 4),
        kernel(GEMM, 5, 300, corr=4),
        *wait_event(2, 5, COMPUTE, 21),
        launch(3, 6),
        kernel(GEMM, 650, 50, corr=6),
        *wait_event(4, 7, COMPUTE, 21),
        launch(5, 8),
        kernel(GEMM, 1050, 50, corr=8),
    ]


@pytest.mark.symptom_without_cause("allgather-transfer-bound")
def test_gathers_issued_late_on_demand_are_not_transfer_bound(tmp_path: Path) -> None:
    # compute stalls 202 µs twice on all-gathers, but each started 4 µs after the host issued it, when its module
    # ran: issued late, not queued. Prefetched back to back from the first (ends 50, 250, 450) both would have
    # ended before compute reached them, so nothing would remain: allgather-not-prefetched owns both stalls (and
    # saves the second's 202 µs: the first's ends in the host's late launch of the second module)
    found = rules(diagnose(tmp_path / "late", on_demand_gathers()))
    assert "allgather-transfer-bound" not in found
    f = found["allgather-not-prefetched"]
    assert f.cost_us == 202.0 and f.evidence["on_demand_fetches_per_step"] == 2.0
    # issued early and queued back to back, the gathers outlast the compute: the transfer is the limit
    found = rules(diagnose(tmp_path / "queued", queued_gathers()))
    f = found["allgather-transfer-bound"]
    assert f.cost_us == 695.0  # 345 + 350
    assert f.evidence["issued_early_per_step"] == 2.0 and f.evidence["on_demand_per_step"] == 0.0
    assert "allgather-not-prefetched" not in found


@pytest.mark.symptom_without_cause("allgather-transfer-bound")
def test_gather_held_by_a_wait_for_another_groups_reduce_scatter_is_transfer_bound_only_for_its_transfer(
    tmp_path: Path,
) -> None:
    # the same trace as the group "2" case above: the gather started 296 µs after its launch, but 260 µs of that
    # is the cudaStreamWaitEvent for the reduce-scatter on stream 25, not gathers queued before it on the gather
    # side (docs/rules.md, waits.py queued_gathers). Issued as early as its stream allowed (40), it would run
    # [40, 240): only [100, 240), 140 µs, is the transfer outlasting the 95 µs of compute before it
    found = rules(diagnose(tmp_path, gather_behind_reduce("2")))
    assert found["allgather-transfer-bound"].cost_us == 140.0
    # the other 260 µs are the wait's: the gather stream was made to wait for the reduce-scatter on stream 25
    f = found["cross-stream-wait"]
    assert f.cost_us == 260.0 and f.evidence["gather_stream_waited_for"] == {"reduce_scatter": [25]}
    assert "made to wait for reduce_scatter on stream 25" in f.why
    # without the recorded wait (the same times), nothing says why it started late: the queue's, as before
    waits = ("cudaStreamWaitEvent", "Stream Wait Event")
    events = [e for e in gather_behind_reduce("2") if not (e.get("name") in waits and e["args"]["correlation"] == 4)]
    found = rules(diagnose(tmp_path / "no-wait", events))
    assert found["allgather-transfer-bound"].cost_us == 400.0 and "cross-stream-wait" not in found


@pytest.mark.parametrize(
    "zero, fix",
    [
        ({"stage3_max_live_parameters": 60_000_000, "stage3_prefetch_bucket_size": 150_000_000},
         {"zero_optimization.stage3_max_live_parameters": 1_000_000_000}),
        ({"stage3_max_live_parameters": 40_000_000}, {"zero_optimization.stage3_max_live_parameters": 1_000_000_000}),
        ({"stage3_max_live_parameters": 200_000_000, "stage3_prefetch_bucket_size": 150_000_000},
         {"zero_optimization.log_trace_cache_warnings": True}),
        ({}, {"zero_optimization.log_trace_cache_warnings": True}),
    ],
)  # fmt: skip
def test_gathers_on_demand_under_a_small_max_live_parameters_name_it(
    tmp_path: Path, zero: dict[str, Any], fix: dict[str, Any]
) -> None:
    # was: with stage3_max_live_parameters 6e7 below the 1.5e8 prefetch bucket (no room to prefetch beside the
    # module's own parameters), the fix was log_trace_cache_warnings (a round-6 scenario); the same stalls under a
    # max_live above the bucket still point at an invalidated trace
    config = {"zero_optimization": {"stage": 3, **zero}}
    f = rules(diagnose(tmp_path, on_demand_gathers(), config))["allgather-not-prefetched"]
    assert f.cost_us == 202.0 and f.fix.config == fix
    assert f.evidence["max_live_parameters"] == zero.get("stage3_max_live_parameters")
    if "zero_optimization.stage3_max_live_parameters" in fix:
        assert "is below stage3_prefetch_bucket_size" in f.why and "GPU memory" in f.why
    else:
        assert "parameter trace is being invalidated" in f.why


@pytest.mark.symptom_without_cause("allgather-not-prefetched")
@pytest.mark.parametrize("ahead_us, cost", [(2.0, 2.0), (150.0, 150.0), (250.0, 202.0), (None, 202.0)])
def test_a_prefetch_saves_no_more_than_the_host_is_ahead(tmp_path: Path, ahead_us: float | None, cost: float) -> None:
    # was: with the host launching every kernel after the stall just in time (host-bound), the stalls were all
    # allgather-not-prefetched's (a round-6 scenario: 28 ms critical where a prefetch saved nothing): ended
    # earlier, the stall would only leave the GPU waiting for the next launch. After each stalled GEMM
    # [t + 204, t + 254) a GEMM starts at t + 254, launched `ahead_us` before; the host launches the second module
    # at 700, after the GPU ran dry (at 694; None: at 654, a host-starved window), so the first stall's saving
    # ends there and the second's is at most the lead after it (was 4, 300, 404 and 404: the stalls' savings
    # capped one by one, and the second module's launch not counted; the prefetch-off and max-live-small
    # scenarios: a prefetch changes their step by 0.02 ms)
    found = rules(diagnose(tmp_path, on_demand_gathers(ahead_us)))
    assert found["allgather-not-prefetched"].cost_us == cost


@pytest.mark.parametrize("synced, cost", [(False, round(202.0 / 3, 3)), (True, 202.0)])
def test_a_launch_after_the_host_waited_for_the_gpu_does_not_bound_a_prefetch(
    tmp_path: Path, synced: bool, cost: float
) -> None:
    # three steps fetching on demand (two 202 µs stalls a step); the host launches each second module 8 µs after
    # the GPU ran dry (the first stall's saving ends there) and each next step's first GEMM at 2000, long after
    # the GPU ran dry at 994: on the host's own time, that launch takes the step's last stall's saving too, but in
    # the last step: 202 µs over three steps. With a cudaDeviceSynchronize [960, 995) ending each step, the host
    # waited for the GPU: the next step's launches come earlier with it, and each step's last stall is saved
    f = rules(diagnose(tmp_path, steps_fetching_on_demand([0, 1, 2], {0, 1, 2}, synced)))["allgather-not-prefetched"]
    assert f.cost_us == cost
