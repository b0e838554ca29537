"""The stream rules on hand-built traces: serialization explained by explicit waits (cross-stream-wait, with the
call site of the wait) versus the hardware queue's (no-stream-concurrency), and where each wait was issued."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from builders import frame, kernel, launch, step, write_trace

from overlapcheck.analysis import intervals as iv
from overlapcheck.analysis.metrics import analyze_model
from overlapcheck.diagnose.facts.concurrency import serialization
from overlapcheck.diagnose.facts.view import RankFacts
from overlapcheck.diagnose.rules import streams, waits
from overlapcheck.job import JobContext
from overlapcheck.model import Finding, Fix, Report
from overlapcheck.pipeline import analyze
from overlapcheck.trace import classify as C
from overlapcheck.trace.reader import load_trace

GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n"
AR = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
RS = "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
AG = "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
COMPUTE, COMM = 7, 21
STREAM_RULES = {"no-stream-concurrency", "cross-stream-wait", "same-communicator", "allgather-not-prefetched"}


def coll(name: str) -> dict[str, Any]:
    return {"Collective name": name, "Process Group Name": "0", "In msg nelems": 1 << 20, "dtype": "BFloat16"}


def wait_event(ts: float, corr: int, stream: int, wait_on: int, record: bool = True) -> list[dict[str, Any]]:
    """cudaStreamWaitEvent at `ts` making `stream` wait for `wait_on`, with its `Stream Wait Event` record."""
    call = {
        "ph": "X",
        "cat": "cuda_runtime",
        "name": "cudaStreamWaitEvent",
        "pid": 100,
        "tid": 100,
        "ts": ts,
        "dur": 0.5,
        "args": {"correlation": corr},
    }
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
    return [call, rec] if record else [call]


def write(folder: Path, events: list[dict[str, Any]]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    write_trace(folder, "rank0.trace.json.gz", events, rank=0, world_size=2)
    return folder


def diagnose(folder: Path, config: dict[str, Any] | None = None) -> Report:
    return analyze(folder, ds_config=config, jobs=1)


def rules(report: Report) -> dict[str, list[Finding]]:
    out: dict[str, list[Finding]] = {}
    for f in report.findings:
        out.setdefault(f.rule, []).append(f)
    return out


def facts(folder: Path, config: dict[str, Any] | None = None) -> RankFacts:
    model = load_trace(str(folder / "rank0.trace.json.gz"))
    return RankFacts(model, analyze_model(model), JobContext(ds_config=config))


def windows(covers: iv.Intervals) -> list[tuple[float, float]]:
    return list(zip(covers.starts.tolist(), covers.ends.tolist(), strict=True))


def allreduce_trace(tmp_path: Path, explicit: bool) -> Path:
    """Four rounds, 1000 µs apart, on one host thread: a GEMM launched at t runs [t+5, t+205); an all-reduce
    launched at t+2 runs [t+205, t+505) on stream 21, right after it; the next GEMM, launched at t+4, runs
    [t+505, t+705), right after the all-reduce. No two streams ever run at once. `explicit`: as torch does it,
    the NCCL stream is made to wait for the compute stream before the all-reduce (t+1) and the compute stream
    for the NCCL stream after it (t+3, inside `train.py(44): allreduce_grads`); else nothing makes either wait:
    the streams run in launch order by themselves (one hardware queue)."""
    events: list[dict[str, Any]] = [step(1, 0, 4000), frame("train.py(30): train_step", 0, 3900)]
    corr = 1
    for i in range(4):
        t = 1000.0 * i
        events += [launch(t, corr), kernel(GEMM, t + 5, 200, corr=corr)]
        events += [launch(t + 2, corr + 1), kernel(AR, t + 205, 300, stream=COMM, corr=corr + 1, **coll("allreduce"))]
        events += [launch(t + 4, corr + 2), kernel(GEMM, t + 505, 200, corr=corr + 2)]
        if explicit:
            events += [frame("train.py(44): allreduce_grads", t + 0.5, 3.3)]
            events += wait_event(t + 1, corr + 3, COMM, COMPUTE) + wait_event(t + 3, corr + 4, COMPUTE, COMM)
        corr += 5
    return write(tmp_path, events)


@pytest.mark.symptom_without_cause("no-stream-concurrency")
def test_serialization_explained_by_waits_is_a_cross_stream_wait_at_the_wait(tmp_path: Path) -> None:
    folder = allreduce_trace(tmp_path, explicit=True)
    view = facts(folder)
    assert view.no_concurrency  # the symptom
    ser = serialization(view)
    assert (ser.explained_stalls, ser.unexplained_stalls) == (4, 0)
    assert (ser.explained_held, ser.unexplained_held) == (4, 0)  # the NCCL stream waited for the GEMMs
    assert not ser.hardware_queue and streams.no_stream_concurrency(view) == []
    found = rules(diagnose(folder))
    assert not found.keys() & {"no-stream-concurrency", "same-communicator", "allgather-not-prefetched"}
    [f] = found["cross-stream-wait"]
    assert f.evidence["waited_for"] == "all_reduce"
    assert f.evidence["call_site"] == "train.py(44): allreduce_grads"
    assert f.evidence["stack"] == ["train.py(44): allreduce_grads", "train.py(30): train_step"]
    assert f.evidence["wait_calls_per_step"] == 4.0  # the compute stream's waits only (not the NCCL stream's)
    assert f.evidence["stalls_after_wait"] == 4 and f.evidence["stalls_per_step"] == 4.0
    assert f.cost_us == 1200.0  # 4 stalls of [t+205, t+505)
    assert f.title == "Compute stream waits for all_reduce (train.py(44): allreduce_grads)"
    assert "wait only where the result is consumed" in f.why  # user code
    [w] = waits.cross_stream_waits(view)
    assert windows(w.covers) == [(1000.0 * i + 205, 1000.0 * i + 505) for i in range(4)]


@pytest.mark.symptom_without_cause("cross-stream-wait")
def test_serialization_without_waits_is_the_hardware_queue(tmp_path: Path) -> None:
    folder = allreduce_trace(tmp_path, explicit=False)
    view = facts(folder)
    ser = serialization(view)
    # every GEMM after an all-reduce stalls behind it, every all-reduce waits for the GEMM launched before it
    assert (ser.explained_stalls, ser.unexplained_stalls, ser.explained_held, ser.unexplained_held) == (0, 4, 0, 4)
    assert ser.unexplained_cost_us == 1200.0 and ser.hardware_queue
    found = rules(diagnose(folder))
    [f] = found["no-stream-concurrency"]
    assert f.cost_us == 1200.0
    assert f.fix == Fix(env={"CUDA_DEVICE_MAX_CONNECTIONS": None})
    ev = f.evidence
    assert (ev["stalls_without_wait"], ev["stalls_after_wait"]) == (4, 0)
    assert (ev["collectives_held_without_wait"], ev["collectives_held_after_wait"]) == (4, 0)
    assert ev["wait_evidence"] == [] and ev["env"] is None  # the trace has no explicit-wait event at all
    assert "4 compute stalls" in f.why and "cudaStreamWaitEvent" in f.why
    assert not found.keys() & {"cross-stream-wait", "allgather-not-prefetched", "same-communicator"}
    [n] = streams.no_stream_concurrency(view)
    assert windows(n.covers) == [(1000.0 * i + 205, 1000.0 * i + 505) for i in range(4)]


def test_serializing_variable_in_the_job_env_founds_the_hardware_queue_anyway(tmp_path: Path) -> None:
    folder = allreduce_trace(tmp_path, explicit=True)  # the waits explain every stall...
    config = {"_overlapcheck_job": {"env": {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}}}
    found = rules(diagnose(folder, config))  # ...but the job runs with one hardware queue
    [f] = found["no-stream-concurrency"]
    assert f.cost_us == 1200.0 and f.evidence["env"] == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    assert f.fix == Fix(env={"CUDA_DEVICE_MAX_CONNECTIONS": None})
    assert "cross-stream-wait" not in found


def test_user_wait_stream_in_a_gradient_hook_is_named(tmp_path: Path) -> None:
    # backward: each GEMM [t+5, t+205) launches a reduce-scatter at t+2 that runs beside it [t+7, t+507) on
    # stream 17; the script's gradient hook then makes the compute stream wait for it (t+3), so the next GEMM
    # (launched at t+4) idles from t+205 until the reduce-scatter ends at t+507
    events: list[dict[str, Any]] = [step(1, 0, 4000), frame("train.py(120): main", 0, 3900)]
    corr = 1
    for i in range(4):
        t = 1000.0 * i
        events += [launch(t, corr), kernel(GEMM, t + 5, 200, corr=corr)]
        events += [
            launch(t + 2, corr + 1),
            kernel(RS, t + 7, 500, stream=17, corr=corr + 1, **coll("_reduce_scatter_base")),
        ]
        events += [
            frame("train.py(57): grad_hook", t + 2.5, 1.3),
            frame("torch/cuda/streams.py(83): wait_stream", t + 2.8, 0.9),
        ]
        events += wait_event(t + 3, corr + 2, COMPUTE, 17)
        events += [launch(t + 4, corr + 3), kernel(GEMM, t + 507, 200, corr=corr + 3)]
        corr += 4
    folder = write(tmp_path, events)
    assert not facts(folder).no_concurrency
    found = rules(diagnose(folder))
    [f] = found["cross-stream-wait"]
    assert f.evidence["waited_for"] == "reduce_scatter" and f.evidence["waited_on_streams"] == [17]
    assert f.evidence["call_site"] == "train.py(57): grad_hook"
    assert f.evidence["stack"] == ["train.py(57): grad_hook", "train.py(120): main"]  # torch's frame skipped
    assert f.evidence["wait_calls_per_step"] == 4.0
    assert f.cost_us == 1208.0  # 4 x [t+205, t+507)
    assert f.title == "Compute stream waits for reduce_scatter (train.py(57): grad_hook)"
    assert "the script makes the compute stream wait for reduce_scatter at train.py(57): grad_hook" in f.why
    assert "wait_stream" in f.why and f.fix == Fix()
    assert "no-stream-concurrency" not in found


FETCH = "deepspeed/runtime/zero/partitioned_param_coordinator.py(385): fetch_sub_module"


def fetch_wait(ts: float, corr: int) -> list[dict[str, Any]]:
    """fetch_sub_module making the compute stream wait for the all-gather stream."""
    frames = [frame(FETCH, ts - 0.5, 1.3), frame("torch/cuda/streams.py(83): wait_stream", ts - 0.2, 0.9)]
    return frames + wait_event(ts, corr, COMPUTE, COMM)


def test_prefetched_gather_longer_than_the_compute_before_it_sizes_the_prefetch_bucket(tmp_path: Path) -> None:
    # the step's first all-gather G0 [5, 305) (inherent: nothing before it); module 0's GEMMs K0 [305, 505) and
    # K0b [505, 600); the host prefetches G1 at 400 (after K0, before K0b's launch at 401), which starts as
    # soon as it is issued and runs [405, 905): compute covers only [405, 600) of it, 195 of its 500 µs, and
    # K1 (launched at 403, after fetch_sub_module's wait at 402) idles over [600, 905)
    ag = coll("_allgather_base")
    events = [
        step(1, 0, 2000),
        launch(0, 1),
        kernel(AG, 5, 300, stream=COMM, corr=1, **ag),
        *fetch_wait(6, 2),
        launch(7, 3),
        kernel(GEMM, 305, 200, corr=3),
        launch(400, 4),
        kernel(AG, 405, 500, stream=COMM, corr=4, **ag),
        launch(401, 5),
        kernel(GEMM, 505, 95, corr=5),
        *fetch_wait(402, 6),
        launch(403, 7),
        kernel(GEMM, 905, 200, corr=7),
    ]
    folder = write(tmp_path, events)
    config = {"zero_optimization": {"stage": 3, "stage3_prefetch_bucket_size": 20_000_000}}
    found = rules(diagnose(folder, config))
    [f] = found["cross-stream-wait"]
    ev = f.evidence
    assert ev["waited_for"] == "all_gather" and ev["call_site"] == FETCH
    assert f.cost_us == 305.0  # [600, 905)
    assert ev["wait_calls_per_step"] == 2.0  # module 0's and module 1's
    assert ev["issued_late_per_step"] == 1.0
    assert ev["late_gather_us_per_step"] == 500.0 and ev["late_gather_covered_by_compute_us_per_step"] == 195.0
    assert ev["prefetch_bucket_size"] == 20_000_000  # the config's
    # 2e7 x 500 / 195 = 51.28e6, to two significant digits
    assert f.fix == Fix(config={"zero_optimization.stage3_prefetch_bucket_size": 51_000_000})
    assert "allgather-not-prefetched" not in found and "no-stream-concurrency" not in found
    # without a config: from DeepSpeed's default 5e7 (x 2.56 = 128.2e6)
    [f] = rules(diagnose(folder))["cross-stream-wait"]
    assert f.evidence["prefetch_bucket_size"] == 50_000_000
    assert f.fix == Fix(config={"zero_optimization.stage3_prefetch_bucket_size": 130_000_000})


def test_streams_serialized_by_a_slow_host_are_no_finding(tmp_path: Path) -> None:
    # each kernel is launched after the previous one ended: one kernel at a time by chance, nothing waits
    events: list[dict[str, Any]] = [step(1, 0, 4000)]
    corr = 1
    for i in range(4):
        t = 1000.0 * i
        events += [launch(t, corr), kernel(GEMM, t + 5, 200, corr=corr)]
        events += [launch(t + 300, corr + 1), kernel(AR, t + 305, 200, stream=COMM, corr=corr + 1, **coll("allreduce"))]
        events += [launch(t + 600, corr + 2), kernel(GEMM, t + 605, 200, corr=corr + 2)]
        corr += 3
    folder = write(tmp_path, events)
    view = facts(folder)
    assert view.no_concurrency and not len(view.stalls.kernel)
    ser = serialization(view)
    assert (ser.explained, ser.unexplained) == (0, 0) and not ser.hardware_queue
    assert not rules(diagnose(folder)).keys() & STREAM_RULES


def test_wait_sites_follow_the_latest_wait_of_the_launching_thread(tmp_path: Path) -> None:
    # two waits before the stalled GEMM: one for stream 17 (a side stream), then one for the collective's
    # stream 21 from another site; the stall is released by the all-reduce on 21, so that wait is blamed
    events: list[dict[str, Any]] = [
        step(1, 0, 2000),
        launch(0, 1),
        kernel(GEMM, 5, 200, corr=1),
        launch(1, 2),
        kernel(AR, 10, 500, stream=COMM, corr=2, **coll("allreduce")),
        frame("train.py(70): side_wait", 1.5, 1.0),
        *wait_event(2, 3, COMPUTE, 17),
        frame("train.py(80): comm_wait", 2.5, 1.0),
        *wait_event(3, 4, COMPUTE, COMM),
        frame("train.py(90): later_wait", 4.5, 1.0),  # after the launch: not the one that held it
        launch(4, 5),
        kernel(GEMM, 510, 100, corr=5),
        *wait_event(5, 6, COMPUTE, COMM),
    ]
    folder = write(tmp_path, events)
    [f] = rules(diagnose(folder))["cross-stream-wait"]
    assert f.evidence["call_site"] == "train.py(80): comm_wait" and f.cost_us == 305.0
    assert f.evidence["wait_calls_per_step"] == 1.0
    view = facts(folder)
    assert np.array_equal(view.stalls.end, [510.0])


GATHER_STREAM = 25  # DeepSpeed's __allgather_stream: ProcessGroupNCCL makes the NCCL stream wait for it
FETCH = "deepspeed/runtime/zero/partitioned_param_coordinator.py(321): fetch_sub_module"


def serialized_gathers(tmp_path: Path, records: bool = True, one_queue: bool = True, reduce: bool = False) -> Path:
    """A ZeRO-3 forward of 8 modules, the host far ahead (module i at host time 10 i + 10); all-gathers take
    300 µs, GEMMs 400. `one_queue`: as DeepSpeed issues it, fetch_sub_module makes the compute stream wait for
    all-gather i (cudaStreamWaitEvent at +1), then prefetches all-gather i+1 (ProcessGroupNCCL makes the NCCL
    stream wait for the gather stream at +1.5, launch at +2), then the module's GEMM is launched (+3); the GPU
    runs everything in launch order (CUDA_DEVICE_MAX_CONNECTIONS=1, in no config): all-gather i+1 waits for GEMM
    i-1 and GEMM i for all-gather i+1, a gather no wait made it wait for. Else the program orders the streams
    itself: all-gather i is issued with the NCCL stream made to wait for the compute stream (+1.5), the compute
    stream then waits for it (+3), and so each runs after the other. `records`: the waits have their `Stream Wait
    Event` records. `reduce`: a 500 µs reduce-scatter on stream 23 after the last GEMM."""
    events: list[dict[str, Any]] = [step(1, 0, 9000), frame("train.py(30): train_step", 0, 8900)]
    corr = 1
    gpu = 0.0  # the GPU runs one thing at a time in both: where it is

    def gather(host: float, wait_on: int) -> None:
        nonlocal corr, gpu
        events.extend(wait_event(host - 0.5, corr, COMM, wait_on, record=records))
        events.extend([launch(host, corr + 1), kernel(AG, gpu, 300, stream=COMM, corr=corr + 1, **coll("all_gather"))])
        gpu += 300
        corr += 2

    if one_queue:
        gather(2.0, GATHER_STREAM)
    for i in range(8):
        host = 10.0 * i + 10
        events.append(frame(FETCH, host, 3.5))
        if one_queue:
            events.extend(wait_event(host + 1, corr, COMPUTE, COMM, record=records))
            corr += 1
            if i < 7:
                gather(host + 2, GATHER_STREAM)
        else:
            gather(host + 2, COMPUTE)
            events.extend(wait_event(host + 2.5, corr, COMPUTE, COMM, record=records))
            corr += 1
        events.extend([launch(host + 3, corr), kernel(GEMM, gpu, 400, corr=corr)])
        gpu += 400
        corr += 1
    if reduce:
        events.extend([launch(100, corr), kernel(RS, gpu, 500, stream=23, corr=corr, **coll("_reduce_scatter_base"))])
    return write(tmp_path, events)


@pytest.mark.parametrize("records", [True, False], ids=["records", "calls-only"])
def test_one_hardware_queue_is_found_from_launch_order_despite_deepspeeds_waits(tmp_path: Path, records: bool) -> None:
    folder = serialized_gathers(tmp_path, records=records)
    view = facts(folder)
    assert view.no_concurrency
    ser = serialization(view)
    # GEMMs 1..6 stall behind the gather prefetched after their fetch wait: the wait (for the previous gather)
    # was issued before that gather was launched, so it cannot be what held them (GEMM 7 has no gather after it)
    assert (ser.explained_stalls, ser.unexplained_stalls) == (0, 6)
    assert ser.hardware_queue
    found = rules(diagnose(folder))
    assert not found.keys() & {"allgather-not-prefetched", "cross-stream-wait", "allgather-transfer-bound"}
    [f] = found["no-stream-concurrency"]
    assert f.fix == Fix(env={"CUDA_DEVICE_MAX_CONNECTIONS": None}) and f.evidence["env"] is None
    assert f.cost_us == 6 * 300.0


@pytest.mark.symptom_without_cause("no-stream-concurrency")
def test_streams_ordered_by_recorded_waits_are_no_hardware_queue(tmp_path: Path) -> None:
    folder = serialized_gathers(tmp_path, one_queue=False)
    view = facts(folder)
    assert view.no_concurrency  # the symptom: no two streams ever run at once
    ser = serialization(view)
    assert (ser.explained_stalls, ser.unexplained_stalls) == (7, 0)  # each GEMM waited for its own gather
    assert ser.explained_held == 7 and ser.unexplained_held == 0  # each gather for the GEMM before it
    assert not ser.hardware_queue and streams.no_stream_concurrency(view) == []
    assert "no-stream-concurrency" not in rules(diagnose(folder))


@pytest.mark.symptom_without_cause("no-stream-concurrency")
def test_a_stream_that_only_has_work_when_compute_is_done_is_no_hardware_queue(tmp_path: Path) -> None:
    # compute runs back to back; one all-reduce per step, launched after the last GEMM ended, starts at once
    events: list[dict[str, Any]] = [step(1, 0, 4000), frame("train.py(30): train_step", 0, 3900)]
    corr = 1
    for i in range(8):
        events += [launch(10.0 * i, corr), kernel(GEMM, 20 + 400.0 * i, 400, corr=corr)]
        corr += 1
    events += [launch(3230, corr), kernel(AR, 3235, 500, stream=COMM, corr=corr, **coll("allreduce"))]
    folder = write(tmp_path, events)
    view = facts(folder)
    assert view.no_concurrency
    assert not serialization(view).hardware_queue
    assert "no-stream-concurrency" not in rules(diagnose(folder))


NO_OVERLAP_COMM = {"zero_optimization": {"stage": 3, "overlap_comm": False}}


def test_gathers_held_by_a_recorded_wait_on_the_default_stream_are_overlap_comm_disabled(tmp_path: Path) -> None:
    # overlap_comm false: each all-gather is issued from the default stream, so ProcessGroupNCCL's recorded wait
    # makes the NCCL stream wait for the GEMM launched before it; the host issued it long before (launch at
    # 10 i + 12, start at 700 i), the wait alone made it late, and each next GEMM stalls 300 µs for it
    folder = serialized_gathers(tmp_path, one_queue=False, reduce=True)
    view = facts(folder, NO_OVERLAP_COMM)
    g = view.gpu
    gathers = np.flatnonzero(view.is_comm & (g.coll == C.COLLECTIVES.index("all_gather")))
    assert (g.start[gathers] - view.launch[gathers] > 100).sum() == 7  # all but the first: issued early, started late
    found = rules(diagnose(folder, NO_OVERLAP_COMM))
    assert "allgather-not-prefetched" not in found and "allgather-transfer-bound" not in found
    assert "cross-stream-wait" not in found
    [f] = found["overlap-comm-disabled"]
    assert f.evidence["all_gathers_held_by_default_stream_wait_per_step"] == 7.0
    assert f.evidence["default_stream_wait_stall_us_per_step"] == 7 * 300.0  # GEMMs 1..7 (0 waits for the first)
    assert f.cost_us >= 7 * 300.0


@pytest.mark.symptom_without_cause("overlap-comm-disabled")
def test_on_demand_gathers_with_no_recorded_wait_on_the_default_stream_stay_not_prefetched(tmp_path: Path) -> None:
    # the same trace with the calls alone: nothing says the NCCL stream waited for the compute stream, and
    # overlap_comm is on: the gathers issued after the GEMM before each stall are on-demand fetches
    folder = serialized_gathers(tmp_path, one_queue=False, records=False)
    found = rules(diagnose(folder))
    assert "overlap-comm-disabled" not in found
    assert "allgather-not-prefetched" in found
