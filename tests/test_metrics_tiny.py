"""Hand-built traces of 3 to 10 events, each number computed by hand (docs/metrics.md)."""

from __future__ import annotations

import json

import pytest
from builders import kernel, launch, memcpy, step, write_trace

from overlapcheck.model import Copies, RankMetrics, Split
from overlapcheck.pipeline import analyze, analyze_trace

RS_OLD = "ncclKernel_ReduceScatter_RING_LL_Sum___nv_bfloat16(ncclDevComm*, unsigned long, ncclWork*)"
AG_NEW = "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
GEMM = "ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_32x5_nn"


def rank_of(tmp_path, events, **kw) -> RankMetrics:
    return analyze_trace(str(write_trace(tmp_path, "rank0.json.gz", events, **kw))).metrics


def test_comm_half_hidden_by_compute_on_another_stream(tmp_path):
    r = rank_of(tmp_path, [kernel(GEMM, 0, 10, stream=7), kernel(RS_OLD, 5, 10, stream=20)])
    rs = r.collectives["reduce_scatter"]
    assert rs == Split(count=1, time_us=10.0, overlapped_us=5.0, exposed_us=5.0, overlap=0.5)
    assert r.collectives["all"] == rs
    assert r.collectives["all_gather"] == Split(count=0, time_us=0.0, overlapped_us=0.0, exposed_us=0.0, overlap=None)
    assert r.span_us == 15 and r.busy_us == 15 and r.compute_us == 10 and r.idle_us == 0


def test_nested_and_overlapping_kernels_on_one_stream_are_counted_once(tmp_path):
    events = [
        kernel(GEMM, 0, 10),
        kernel(GEMM, 2, 3),
        kernel(GEMM, 8, 4),  # compute union [0, 12)
        kernel(AG_NEW, 0, 6, stream=30),
        kernel(AG_NEW, 4, 4, stream=30),  # comm union [0, 8)
        kernel(AG_NEW, 20, 5, stream=30),
    ]
    r = rank_of(tmp_path, events)
    ag = r.collectives["all_gather"]
    assert ag.count == 3
    assert ag.time_us == 13 and ag.overlapped_us == 8 and ag.exposed_us == 5
    assert r.compute_us == 12
    assert r.span_us == 25 and r.busy_us == 17 and r.idle_us == 8


def test_communication_on_the_compute_stream_never_overlaps(tmp_path):
    # one stream runs kernels one after another: NCCL on the compute stream cannot be hidden
    r = rank_of(tmp_path, [kernel(GEMM, 0, 10), kernel(RS_OLD, 10, 10), kernel(GEMM, 20, 5)])
    assert r.collectives["all"].overlap == 0.0
    assert r.collectives["all"].exposed_us == 10


def test_comm_is_found_by_name_not_by_stream(tmp_path):
    # compute on the stream that carries NCCL elsewhere, NCCL on stream 7
    r = rank_of(tmp_path, [kernel(GEMM, 0, 4, stream=20), kernel(AG_NEW, 0, 8, stream=7)])
    assert r.collectives["all_gather"].overlapped_us == 4


def test_zero_length_events_count_but_cover_nothing(tmp_path):
    r = rank_of(tmp_path, [kernel(GEMM, 0, 0), kernel(RS_OLD, 0, 0, stream=20), kernel(RS_OLD, 1, 2, stream=20)])
    rs = r.collectives["reduce_scatter"]
    assert rs.count == 2 and rs.time_us == 2 and rs.overlap == 0.0
    assert r.compute_us == 0


def test_collective_name_arg_wins_over_kernel_name(tmp_path):
    events = [
        kernel("ncclDevKernel_Generic", 0, 5, stream=20, **{"Collective name": "_reduce_scatter_base"}),
        kernel("ncclKernel_SendRecv(ncclWorkElem)", 10, 5, stream=20, **{"Collective name": "all_to_all"}),
        kernel("ncclDevKernel_SendRecv", 20, 5, stream=20),
        kernel("ncclKernel_Broadcast_RING_LL_Sum_int8_t(ncclWorkElem)", 30, 5, stream=20),
        kernel("ncclDevKernel_Generic", 40, 5, stream=20),
    ]
    c = rank_of(tmp_path, events).collectives
    counts = {k: v.count for k, v in c.items() if v.count}
    assert counts == {"all": 5, "reduce_scatter": 1, "all_to_all": 1, "send_recv": 1, "broadcast": 1, "other": 1}


def test_kernel_belongs_to_the_step_that_launched_it(tmp_path):
    # step 1 launches an RS at t=8 that runs at t=12..20, after step 1's CPU span [0, 10) ended
    events = [
        step(1, 0, 10),
        step(2, 10, 10),
        launch(2, corr=1),
        kernel(GEMM, 3, 6, corr=1),
        launch(8, corr=2),
        kernel(RS_OLD, 12, 8, stream=20, corr=2),
        launch(11, corr=3),
        kernel(GEMM, 14, 4, corr=3),
        memcpy(21, 2, corr=4),
        launch(12, corr=4),
    ]
    r = rank_of(tmp_path, events)
    s1, s2 = r.steps
    assert s1.step == 1 and s2.step == 2
    assert s1.collectives["all"].count == 1 and s2.collectives["all"].count == 0
    # the step's comm is measured against all compute, including step 2's kernel at [14, 18)
    assert s1.collectives["all"].overlapped_us == 4 and s1.collectives["all"].exposed_us == 4
    assert s1.start_us == 3 and s1.duration_us == 17 and s1.cpu_duration_us == 10
    assert s1.compute_us == 6 and s2.compute_us == 4
    assert s2.memcpy == Copies(count=1, time_us=2.0, exposed_us=2.0)
    assert s2.duration_us == 23 - 14
    # the GPU windows [3, 20) and [14, 23) overlap; the periods tile the timeline: step 1 from its first kernel
    # to the end of its work [3, 20), step 2 from there to the end of its own [20, 23)
    assert (s1.period_start_us, s1.period_us) == (3, 17) and (s2.period_start_us, s2.period_us) == (20, 3)
    assert r.step_time_us == 17 + 3 == r.span_us
    assert r.exposed_share == pytest.approx(4 / 20)
    assert s1.exposed_share == pytest.approx(4 / 17) and s2.exposed_share is None  # step 2 has no communication
    assert r.outside_steps is not None and r.outside_steps.count == 0


def test_memcpy_is_neither_compute_nor_comm_and_its_exposed_time_is_reported(tmp_path):
    r = rank_of(tmp_path, [kernel(GEMM, 0, 10), memcpy(5, 10, stream=21), kernel(RS_OLD, 12, 2, stream=22)])
    assert r.memcpy == Copies(count=1, time_us=10.0, exposed_us=3.0)  # [5,15) - [0,10) - [12,14) = [10,12) + [14,15)
    assert r.compute_us == 10
    assert r.collectives["all"].overlap == 0.0  # memcpy does not hide communication


def test_no_communication_is_not_an_error(tmp_path):
    r = rank_of(tmp_path, [kernel(GEMM, 0, 10), kernel(GEMM, 20, 10)])
    assert r.collectives["all"].overlap is None and r.exposed_share is None
    assert any("no communication" in n for n in r.notes)


def test_no_gpu_kernels_is_not_an_error(tmp_path):
    r = rank_of(tmp_path, [step(1, 0, 10), launch(1, corr=1)])
    assert r.collectives["all"].overlap is None
    assert r.span_us == 0
    assert any("nothing to measure" in n for n in r.notes)


def test_torch_1_8_schema_bare_list_old_categories(tmp_path):
    events = [
        {"ph": "X", "cat": "Operator", "name": "ProfilerStep#5", "pid": 1, "tid": "140", "ts": 0, "dur": 50},
        {
            "ph": "X",
            "cat": "Runtime",
            "name": "cudaLaunchKernel",
            "pid": 1,
            "tid": "140",
            "ts": 1,
            "dur": 2,
            "args": {"correlation": 9, "external id": 3},
        },
        {
            "ph": "X",
            "cat": "Kernel",
            "name": "ncclKernel_AllReduce_RING_LL_Sum_float(ncclColl)",
            "pid": 0,
            "tid": "stream 13",
            "ts": 10,
            "dur": 10,
            "args": {"stream": 13, "correlation": 9, "device": 0},
        },
        {
            "ph": "X",
            "cat": "Kernel",
            "name": "volta_sgemm_128x64_nn",
            "pid": 0,
            "tid": "stream 7",
            "ts": 12,
            "dur": 4,
            "args": {"correlation": 10, "device": 0},
        },
        {
            "ph": "X",
            "cat": "Memset",
            "name": "Memset (Device)",
            "pid": 0,
            "tid": "stream 7",
            "ts": 30,
            "dur": 1,
            "args": {"stream": 7, "correlation": 11},
        },
        {"ph": "s", "id": 9, "pid": 1, "tid": 140, "ts": 1, "cat": "async", "name": "launch"},
    ]
    path = tmp_path / "worker3.pt.trace.json"
    path.write_text(json.dumps(events))
    r = analyze_trace(str(path)).metrics
    assert r.rank == 3  # from the file name
    ar = r.collectives["all_reduce"]
    assert ar.count == 1 and ar.overlapped_us == 4 and ar.exposed_us == 6
    assert r.memset.count == 1 and r.memset.exposed_us == 1
    assert [s.step for s in r.steps] == [5]
    assert r.steps[0].collectives["all"].count == 1
    assert {s.stream for s in r.streams} == {7, 13}  # the stream of a kernel without args.stream: its tid
    assert any("torch 1.8" in n for n in r.notes)


def test_plain_and_gzipped_json_give_the_same_numbers(tmp_path):
    events = [kernel(GEMM, 0, 10), kernel(RS_OLD, 5, 10, stream=20)]
    a = analyze_trace(str(write_trace(tmp_path, "rank0.json", events, gz=False))).metrics
    b = analyze_trace(str(write_trace(tmp_path, "rank0.json.gz", events))).metrics
    assert a.collectives == b.collectives
    assert a.collectives["reduce_scatter"].overlapped_us == 5


def test_cross_rank_summary_min_median_max_and_worst(tmp_path):
    for rank, hidden in enumerate([2, 8, 5]):
        write_trace(
            tmp_path,
            f"rank{rank}.json.gz",
            [kernel(GEMM, 0, hidden), kernel(RS_OLD, 0, 10, stream=20)],
            rank=rank,
            world_size=3,
        )
    report = analyze(tmp_path)
    assert [r.rank for r in report.ranks] == [0, 1, 2]
    o = report.summary.metrics["all.overlap"]
    assert (o.min, o.median, o.max, o.worst_rank) == (0.2, 0.5, 0.8, 0)
    e = report.summary.metrics["reduce_scatter.exposed_us"]
    assert (e.min, e.median, e.max, e.worst_rank) == (2, 5, 8, 0)
    assert report.ranks[0].world_size == 3
    # the JSON document says the same
    doc = report.to_dict()
    assert doc["summary"]["metrics"]["all.overlap"] == {"min": 0.2, "median": 0.5, "max": 0.8, "worst_rank": 0}


def test_metadata_after_event_array_and_escaped_strings(tmp_path):
    doc = (
        '{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "weird \\"}]{[\\\\", "pid": 0, "tid": 7, '
        '"ts": 0, "dur": 10, "args": {"stream": 7}}, {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL", '
        '"pid": 0, "tid": 9, "ts": 5, "dur": 10, "args": {"stream": 9}}], "distributedInfo": {"rank": 4, "world_size": 8}}'
    )
    path = tmp_path / "trace.json"
    path.write_text(doc)
    r = analyze_trace(str(path)).metrics
    assert r.rank == 4 and r.world_size == 8
    assert r.collectives["all_reduce"].overlapped_us == 5


def test_phases_split_a_step_at_its_backward_window(tmp_path):
    def bwd(ts, dur):
        return {
            "ph": "X",
            "cat": "cpu_op",
            "name": "autograd::engine::evaluate_function: MmBackward0",
            "pid": 100,
            "tid": 200,
            "ts": ts,
            "dur": dur,
        }

    events = [
        step(1, 0, 100),
        bwd(30, 10),
        bwd(50, 10),  # backward window [30, 60]
        launch(5, corr=1),
        kernel(AG_NEW, 6, 4, stream=20, corr=1),  # forward all-gather, exposed
        launch(35, corr=2, tid=200),
        kernel(GEMM, 36, 20, corr=2),  # backward compute
        launch(40, corr=3, tid=200),
        kernel(RS_OLD, 40, 10, stream=21, corr=3),  # hidden reduce-scatter
        launch(70, corr=4),
        kernel(RS_OLD, 70, 10, stream=21, corr=4),
    ]  # epilogue reduce-scatter, exposed
    r = rank_of(tmp_path, events)
    phases = r.steps[0].phases
    assert set(phases) == {"forward", "backward", "optimizer"}
    assert phases["forward"].collectives["all_gather"].exposed_us == 4
    assert phases["backward"].collectives["reduce_scatter"].overlap == 1.0
    assert phases["backward"].compute_us == 20
    assert phases["optimizer"].collectives["reduce_scatter"].exposed_us == 10
    assert r.steps[0].collectives["reduce_scatter"].count == 2


def test_kernels_left_running_by_the_previous_iteration_belong_to_no_step(tmp_path):
    # step 1 [0, 20), step 2 [20, 40), step 3 [41, 50) on the CPU; the trace starts inside the last unprofiled
    # iteration: a GEMM [0.5, 3) and a reduce-scatter [10, 16) run whose launches are not in the trace
    events = [
        step(1, 0, 20),
        step(2, 20, 20),
        step(3, 41, 9),
        kernel(GEMM, 0.5, 2.5, corr=90),  # no launch in the trace
        kernel(RS_OLD, 10, 6, stream=20, corr=91),  # no launch in the trace
        launch(2, corr=1),
        kernel(GEMM, 3, 10, corr=1),  # step 1's compute [3, 13)
        launch(4, corr=2),
        kernel(AG_NEW, 5, 4, stream=21, corr=2),  # step 1's all-gather [5, 9), hidden
        launch(21, corr=3),
        kernel(GEMM, 22, 8, corr=3),  # step 2 [22, 30)
        launch(23, corr=4),
        kernel(RS_OLD, 30, 6, stream=20, corr=4),  # step 2's reduce-scatter [30, 36), exposed
        launch(40.5, corr=5),
        kernel(GEMM, 41, 2, corr=5),  # launched between steps 2 and 3: in no step, not before the first
        launch(42, corr=6),
        kernel(GEMM, 44, 2, corr=6),  # step 3 [44, 46)
    ]
    r = rank_of(tmp_path, events)
    s1, s2, s3 = r.steps
    # step 1 has its own all-gather only (assigned by the kernel's own start, the tail's two kernels were in it)
    assert s1.collectives["all"].count == 1 and s1.collectives["all"].exposed_us == 0
    assert s1.compute_us == 10 and (s1.start_us, s1.duration_us) == (3, 10)
    assert (s1.period_start_us, s1.period_us) == (3, 10) and s1.exposed_share == 0
    assert s2.collectives["reduce_scatter"] == Split(
        count=1, time_us=6.0, overlapped_us=0.0, exposed_us=6.0, overlap=0.0
    )
    assert (s2.period_start_us, s2.period_us) == (13, 23) and s2.exposed_share == pytest.approx(6 / 23)
    assert (s3.period_start_us, s3.period_us) == (36, 10) and s3.exposed_share is None
    # apart: the tail (2 activities, its reduce-scatter [10, 16) is hidden by [0.5, 13) for 3 µs) ...
    before = r.before_first_step
    assert before is not None and before.count == 2 and before.compute_us == 2.5 and before.busy_us == 8.5
    assert before.collectives["reduce_scatter"] == Split(
        count=1, time_us=6.0, overlapped_us=3.0, exposed_us=3.0, overlap=0.5
    )
    # ... and everything in no step: the tail and the GEMM launched between steps
    outside = r.outside_steps
    assert outside is not None and outside.count == 3 and outside.compute_us == 4.5
    assert outside.collectives["all"].count == 1
    # the whole rank keeps them all
    assert r.collectives["all"].count == 3 and r.collectives["all"].exposed_us == 3 + 6
    assert r.compute_us == (13 - 0.5) + 8 + 2 + 2
    assert r.step_time_us == 10 + 23 + 10 and r.span_us == 46 - 0.5
    assert r.exposed_share == pytest.approx(6 / 43)


def test_an_early_copy_on_a_side_stream_does_not_stretch_the_step(tmp_path):
    # the host runs ahead: step 2 issues the next batch's host-to-device copy, which runs at once on stream 9
    # [12, 14) while step 1's GEMM [2, 20) still runs; step 2's own GEMM waits for it on stream 7
    events = [
        step(1, 0, 10),
        step(2, 10, 10),
        launch(1, corr=1),
        kernel(GEMM, 2, 18, corr=1),
        launch(11, corr=2),
        memcpy(12, 2, stream=9, corr=2),
        launch(12, corr=3),
        kernel(GEMM, 20, 10, corr=3),
        launch(13, corr=4),
        kernel(RS_OLD, 30, 5, stream=20, corr=4),  # exposed
    ]
    r = rank_of(tmp_path, events)
    s1, s2 = r.steps
    # the GPU windows overlap ([2, 20) and [12, 35), 18 + 23 = 41 µs of a 33 µs trace); the periods do not
    assert (s1.start_us, s1.duration_us) == (2, 18) and (s2.start_us, s2.duration_us) == (12, 23)
    assert (s1.period_start_us, s1.period_us) == (2, 18) and (s2.period_start_us, s2.period_us) == (20, 15)
    assert r.step_time_us == 33 == r.span_us
    assert s2.exposed_share == pytest.approx(5 / 15)  # over the period, not over the window (5 / 23)
    assert r.exposed_share == pytest.approx(5 / 33)
    assert s2.memcpy == Copies(count=1, time_us=2.0, exposed_us=0.0)  # beside step 1's GEMM
    assert r.before_first_step is not None and r.before_first_step.count == 0


def test_steps_without_gpu_activity_have_empty_periods(tmp_path):
    # step 2 launches nothing: its period is empty, at the end of step 1's work; step 3 continues from there
    events = [
        step(1, 0, 10),
        step(2, 10, 10),
        step(3, 20, 10),
        launch(1, corr=1),
        kernel(GEMM, 2, 10, corr=1),
        launch(21, corr=2),
        kernel(RS_OLD, 22, 4, stream=20, corr=2),
    ]
    r = rank_of(tmp_path, events)
    s1, s2, s3 = r.steps
    assert (s2.period_start_us, s2.period_us) == (12, 0) and s2.duration_us == 10  # the CPU annotation's
    assert (s3.period_start_us, s3.period_us) == (12, 14) and s3.exposed_share == pytest.approx(4 / 14)
    assert r.step_time_us == 10 + 0 + 14


def test_without_any_launch_in_the_trace_no_activity_is_in_a_step(tmp_path):
    r = rank_of(tmp_path, [step(1, 0, 10), kernel(GEMM, 1, 4), kernel(RS_OLD, 2, 4, stream=20)])
    (s1,) = r.steps
    assert s1.collectives["all"].count == 0 and (s1.period_start_us, s1.period_us) == (0, 10)
    assert r.before_first_step is not None and r.before_first_step.count == 2
    assert r.collectives["all"].count == 1 and r.collectives["all"].exposed_us == 1
    assert any("none can be attributed to a step" in n for n in r.notes)


def test_older_documents_without_periods_still_load():
    from builders import report_doc

    from overlapcheck.model import Report

    doc = report_doc(2)
    for rank in doc["ranks"]:  # a document written before these fields existed
        del rank["before_first_step"], rank["outside_steps"]
        for s in rank["steps"]:
            del s["period_start_us"], s["period_us"]
    report = Report.from_dict(doc)
    assert report.ranks[0].before_first_step is None and report.ranks[0].steps[0].period_us is None
    again = Report.from_dict(report.to_dict())
    assert again == report


def test_a_repeated_step_number_is_one_step_and_a_note(tmp_path):
    # the profiler restarted: ProfilerStep#5 twice, each with a 10 µs all-gather of which 4 µs are exposed
    events = []
    for base, corr in ((0, 1), (100, 3)):
        events += [step(5, base, 50), launch(base + 1, corr), launch(base + 2, corr + 1)]
        events += [kernel(GEMM, base + 10, 6, corr=corr), kernel(AG_NEW, base + 10, 10, stream=30, corr=corr + 1)]
    r = rank_of(tmp_path, events)
    [only] = r.steps
    assert only.step == 5 and only.start_us == 10  # the first step's GPU work
    assert only.collectives["all_gather"] == Split(
        count=1, time_us=10.0, overlapped_us=6.0, exposed_us=4.0, overlap=0.6
    )
    assert r.outside_steps.collectives["all_gather"].count == 1  # the second #5's, not counted twice
    assert any("ProfilerStep numbers repeat (#5 x2" in n for n in r.notes)
    # the same span annotated twice (two categories of one step) is one step and no note
    same = rank_of(tmp_path, [step(5, 0, 50), step(5, 0, 50), launch(1, 1), kernel(GEMM, 10, 6, corr=1)])
    assert len(same.steps) == 1 and not any("repeat" in n for n in same.notes)
