"""The sync rules on hand-built traces: a call is a host sync only when the trace shows it waited for GPU work,
the profiler's own syncs and those outside the steps are not findings, and a sync that made its thread issue
an all-gather late owns the compute stall on that gather (docs/rules.md, Host syncs; facts/delays.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from builders import cpu_op, frame, kernel, launch, runtime, step, write_trace
from builders import diagnose_events as diagnose

from overlapcheck.analysis import intervals as iv
from overlapcheck.analysis.metrics import analyze_model
from overlapcheck.diagnose.facts.view import RankFacts
from overlapcheck.diagnose.registry import BY_ID
from overlapcheck.model import Finding, Report
from overlapcheck.pipeline import analyze
from overlapcheck.trace.reader import load_trace

GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n"
RS = "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
AG = "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
WAITS = "allgather-not-prefetched"
THROTTLE = "deepspeed/runtime/zero/stage3.py(1667): __reduce_and_partition_ipg_grads"


def copy(name: str, ts: float, dur: float, corr: int, stream: int = 7) -> dict[str, Any]:
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


def rank_finding(folder: Path, rule: str) -> Finding:
    """The rank's finding of one sync rule, before the merge (which keeps no `covers`)."""
    model = load_trace(str(folder / "rank0.trace.json.gz"))
    find = BY_ID[rule].find
    assert find is not None
    (f,) = find(RankFacts(model, analyze_model(model)))
    return f


def sync_findings(report: Report) -> list[Finding]:
    return [f for f in report.findings if f.rule in ("host-sync", "reduce-event-throttle", "epilogue-sync")]


# -- (a) copies -------------------------------------------------------------------------------------------


@pytest.mark.symptom_without_cause("host-sync")
def test_device_to_device_copy_returning_before_its_copy_starts_is_no_host_sync(tmp_path: Path) -> None:
    # the cudaMemcpyAsync call [10, 60) lasts 50 µs, most of its 60 µs copy, but the copy runs [100, 160),
    # after the call returned: the host did not wait (the old "call >= half its copy" test flagged it)
    events = [
        step(1, 0, 400),
        launch(0, 1),
        kernel(GEMM, 0, 100, corr=1),
        runtime("cudaMemcpyAsync", 10, 50, 2),
        copy("Memcpy DtoD (Device -> Device)", 100, 60, 2),
        launch(170, 3),
        kernel(GEMM, 175, 50, corr=3),
    ]
    assert sync_findings(diagnose(tmp_path, events)) == []


def test_pageable_device_to_host_copy_that_returns_after_its_copy_is_a_host_sync(tmp_path: Path) -> None:
    # `.cpu()` into pageable memory: the call [10, 125) waits for the GEMM queued on the stream (ends at 100),
    # then for its copy [100, 120); the next kernel is launched at 130 and starts at 135, so the compute stream
    # starves over [120, 135): 15 µs
    events = [
        step(1, 0, 400),
        launch(0, 1),
        kernel(GEMM, 0, 100, corr=1),
        runtime("cudaMemcpyAsync", 10, 115, 2),
        copy("Memcpy DtoH (Device -> Pageable)", 100, 20, 2),
        launch(130, 3),
        kernel(GEMM, 135, 50, corr=3),
    ]
    (f,) = sync_findings(diagnose(tmp_path, events))
    assert f.rule == "host-sync" and f.evidence["calls"] == ["cudaMemcpyAsync"]
    assert f.cost_us == 15.0
    assert f.evidence["waited_calls"] == 1 and f.evidence["host_blocked_us"] == 115.0
    assert f.evidence["awaited"] == {"memcpy": 1}  # the copy ended last (after the queued GEMM)
    assert iv.length(rank_finding(tmp_path, "host-sync").covers) == 15.0  # the starvation window [120, 135)


# -- (b) a sync with nothing to wait for -----------------------------------------------------------------


def test_stream_sync_with_no_gpu_work_pending_is_no_finding(tmp_path: Path) -> None:
    # the GEMM ends at 100; the cudaStreamSynchronize [120, 150) returns without waiting for anything (nothing
    # ends inside it), though it returns inside the starved stretch [100, 165): overhead, not a sync
    events = [
        step(1, 0, 400),
        launch(0, 1),
        kernel(GEMM, 0, 100, corr=1),
        runtime("cudaStreamSynchronize", 120, 30, 2),
        launch(160, 3),
        kernel(GEMM, 165, 50, corr=3),
    ]
    assert sync_findings(diagnose(tmp_path, events)) == []


def test_stream_sync_that_waits_is_a_finding_with_its_awaited_work(tmp_path: Path) -> None:
    # the same sync begun at 60, while the GEMM runs until 100: it waits 40 µs; the stream starves [100, 165)
    events = [
        step(1, 0, 400),
        launch(0, 1),
        kernel(GEMM, 0, 100, corr=1),
        runtime("cudaStreamSynchronize", 60, 90, 2),
        launch(160, 3),
        kernel(GEMM, 165, 50, corr=3),
    ]
    (f,) = sync_findings(diagnose(tmp_path, events))
    assert f.cost_us == 65.0 and f.evidence["awaited"] == {"compute": 1}


# -- (c) the profiler's own syncs ------------------------------------------------------------------------


def test_device_sync_after_the_last_profiler_step_is_no_finding(tmp_path: Path) -> None:
    # torch.profiler stops after ProfilerStep#1 [0, 200) and synchronizes the device over [210, 410), waiting
    # for the kernel that runs until 400; the host launches more work afterwards (it is outside every step)
    events = [
        step(1, 0, 200),
        launch(0, 1),
        kernel(GEMM, 0, 100, corr=1),
        launch(150, 2),
        kernel(GEMM, 150, 250, corr=2),
        runtime("cudaDeviceSynchronize", 210, 200, 3),
        launch(420, 4),
        kernel(GEMM, 425, 50, corr=4),
    ]
    assert sync_findings(diagnose(tmp_path, events)) == []


def test_profiler_frames_mark_its_own_sync(tmp_path: Path) -> None:
    # inside the step, under torch/autograd/profiler.py __exit__: the profiler's sync, not the program's
    events = [
        step(1, 0, 1000),
        launch(0, 1),
        kernel(GEMM, 0, 100, corr=1),
        frame("torch/autograd/profiler.py(363): __exit__", 40, 80),
        frame("torch/cuda/__init__.py(975): synchronize", 45, 70),
        runtime("cudaDeviceSynchronize", 50, 60, 2),
        launch(130, 3),
        kernel(GEMM, 135, 50, corr=3),
    ]
    assert sync_findings(diagnose(tmp_path, events)) == []


# -- (d, e) a throttle that issues the next all-gathers late -----------------------------------------------


def backward(throttle: bool, cycles: int = 2, stall: float = 200.0) -> list[dict[str, Any]]:
    """One step on one thread: GEMM A [0, 300) and an early all-gather [5, 50) hidden behind it, then `cycles`
    times: a reduce-scatter launched at t (370 µs), the throttle (`throttle`: cudaEventSynchronize from t + 10
    until that reduce-scatter ends), an all-gather launched 10 µs later that runs `stall` µs as soon as it is
    launched, and the compute kernel that needs it launched 2 µs after it: compute stalls until the gather ends.
    """
    events = [
        step(1, 0, 5000),
        launch(0, 1),
        kernel(GEMM, 0, 300, corr=1),
        launch(1, 2),
        kernel(AG, 5, 45, stream=21, corr=2),
    ]
    t, corr = 40.0, 3
    for _ in range(cycles):
        rs_end = t + 10 + 350
        events += [launch(t, corr), kernel(RS, t + 10, 350, stream=17, corr=corr)]
        if throttle:
            events += [
                frame(THROTTLE, t + 5, rs_end - t),
                runtime("cudaEventSynchronize", t + 10, rs_end - t - 10, corr + 1),
            ]
        ag = rs_end + 10
        events += [
            launch(ag, corr + 2),
            kernel(AG, ag + 4, stall, stream=21, corr=corr + 2),
            launch(ag + 2, corr + 3),
            kernel(GEMM, ag + 4 + stall, 50, corr=corr + 3),
        ]
        t, corr = ag + 10, corr + 4
    return events


@pytest.mark.symptom_without_cause("allgather-not-prefetched")
def test_throttle_owns_the_stalls_on_the_gathers_it_delayed(tmp_path: Path) -> None:
    # cycle 1: the throttle [50, 400) waits for the reduce-scatter [50, 400); the gather is launched at 410 and
    # runs [414, 614); compute stalls [412, 614): 202 µs, all of it explained (the block is 350 µs).
    # cycle 2: the throttle [430, 780), the gather launched at 790 runs [794, 994); compute stalls [792, 994):
    # 202 µs. With that block alone gone, the gather could start no earlier than the previous one's end (614),
    # 180 µs earlier; but the rule's cost is what removing all its calls saves, and then the previous gather
    # ends 350 µs earlier too (at 264): the whole stall.
    report = diagnose(tmp_path, backward(throttle=True))
    found = {f.rule: f for f in report.findings}
    top = report.findings[0]
    assert top.rule == "reduce-event-throttle"
    assert top.cost_us == 404.0
    assert "allgather-not-prefetched" not in found  # the gathers were late because the host was blocked
    assert "cross-stream-wait" not in found
    ev = top.evidence
    assert ev["count"] == 2 and ev["waited_calls"] == 2
    assert ev["host_blocked_us"] == 700.0  # 350 + 350
    assert ev["awaited"] == {"reduce_scatter": 2}
    assert ev["delayed_collectives"] == {"all_gather": {"per_step": 2.0, "stall_us_per_step": 404.0}}
    assert ev["call_site"] == THROTTLE
    covers = rank_finding(tmp_path, "reduce-event-throttle").covers
    assert iv.length(covers) == 404.0 and covers.starts.tolist() == [412.0, 792.0]  # [412, 614), [792, 994)


def test_gathers_launched_late_without_a_sync_are_not_prefetched(tmp_path: Path) -> None:
    # the same launches with no sync before them: really on-demand fetches, 202 µs each; but with nothing the
    # host waited for, it launched the second cycle late on its own (the GPU ran dry at 664, the launch came at
    # 790): prefetched, the first stall's work would wait for that launch instead, so only the second's is saved
    report = diagnose(tmp_path, backward(throttle=False))
    found = {f.rule: f for f in report.findings}
    assert "reduce-event-throttle" not in found
    f = found["allgather-not-prefetched"]
    assert f.cost_us == 202.0 and f.evidence["on_demand_fetches_per_step"] == 2.0


def test_throttle_and_on_demand_fetches_are_ranked_by_cost(tmp_path: Path) -> None:
    # cycle 1 delayed by the throttle (202 µs stall); then two gathers of 400 µs issued when their module runs
    # (on demand), 402 µs stalls each. Without the 350 µs block every later launch comes 350 µs earlier: the
    # first stall takes 202 of that lead, the next 148 (its gather could start 148 µs earlier: the gather
    # stream is free from 264 then); the rest, 254 + 402 µs, is the missing prefetch
    events = backward(throttle=True, cycles=1)
    t, corr = 670.0, 50
    prev_gemm_end = 664.0
    for _ in range(2):
        events += [
            launch(t, corr),
            kernel(AG, t + 4, 400, stream=21, corr=corr),
            launch(t + 2, corr + 1),
            kernel(GEMM, t + 404, 50, corr=corr + 1),
        ]
        assert t + 404 > prev_gemm_end
        prev_gemm_end = t + 454
        t, corr = t + 460, corr + 2
    report = diagnose(tmp_path, events)
    found = {f.rule: f for f in report.findings}
    assert found["reduce-event-throttle"].cost_us == 350.0
    # the wait rules share the 656 µs left (allgather-transfer-bound may take part of the missing prefetch's)
    assert 0.0 < found[WAITS].cost_us <= 656.0


def test_throttle_explains_only_how_much_earlier_the_gather_could_have_run(tmp_path: Path) -> None:
    # one cycle, with a gather prefetched at 2 that occupies the gather stream until 410: launched 350 µs
    # earlier, the delayed gather [414, 614) could still start only at 410, 4 µs earlier; of its 202 µs stall
    # the throttle explains the last 4 µs [610, 614)
    events = backward(throttle=True, cycles=1)
    events += [launch(2, 90), kernel(AG, 300, 110, stream=21, corr=90)]
    report = diagnose(tmp_path, events)
    found = {f.rule: f for f in report.findings}
    f = found["reduce-event-throttle"]
    assert f.cost_us == 4.0
    assert f.evidence["delayed_collectives"] == {"all_gather": {"per_step": 1.0, "stall_us_per_step": 4.0}}
    assert iv.length(rank_finding(tmp_path, "reduce-event-throttle").covers) == 4.0


# -- (f) a run of throttle calls: their leads add up ------------------------------------------------------


def throttle_run(between: bool = False) -> list[dict[str, Any]]:
    """One step on one thread: GEMM A [0, 500) keeps the compute stream busy while the host blocks twice in the
    throttle, [20, 220) for reduce-scatter 1 [20, 220) and [230, 330) for reduce-scatter 2 [230, 330); then the
    slow host (its Python) launches GEMM B at 700 ([705, 805)) and GEMM C at 1000 ([1005, 1105)): the compute
    stream starves [500, 705) and [805, 1005), after both calls returned. `between`: a `.item()`-like
    cudaStreamSynchronize [222, 228) that waits for a copy [221, 226) sits between the two calls."""
    events = [
        step(1, 0, 5000),
        launch(0, 1),
        kernel(GEMM, 0, 500, corr=1),
        launch(10, 2),
        kernel(RS, 20, 200, stream=17, corr=2),
        frame(THROTTLE, 15, 210),
        runtime("cudaEventSynchronize", 20, 200, 3),
        launch(225, 4),
        kernel(RS, 230, 100, stream=17, corr=4),
        frame(THROTTLE, 226, 106),
        runtime("cudaEventSynchronize", 230, 100, 5),
        launch(700, 6),
        kernel(GEMM, 705, 100, corr=6),
        launch(1000, 7),
        kernel(GEMM, 1005, 100, corr=7),
    ]
    if between:
        events += [launch(220.5, 8), copy("Memcpy DtoD (Device -> Device)", 221, 5, 8, stream=9)]
        events += [runtime("cudaStreamSynchronize", 222, 6, 9)]
    return events


def test_a_run_of_throttle_calls_delays_the_later_launches_by_all_their_blocks(tmp_path: Path) -> None:
    # without both calls the host is 200 + 100 = 300 µs earlier from 330 on: GEMM B, launched at 400, starts
    # when GEMM A ends (500), 205 µs earlier; GEMM C, launched at 700, starts at 705, 300 µs earlier: the 405 µs
    # of starvation shrink to 105 ([600, 705)), 300 µs saved. The first call's lead (200) is not lost at the
    # second call (gone too): it fills the last 200 µs of [500, 705); the second's 100 µs fill the 5 µs left
    # there and the last 95 µs of [805, 1005). (Each call alone stopping at the next, the rule got 100.)
    report = diagnose(tmp_path, throttle_run())
    (f,) = [f for f in report.findings if f.rule == "reduce-event-throttle"]
    assert f.cost_us == 300.0
    assert f.evidence["host_blocked_us"] == 300.0 and f.evidence["waited_calls"] == 2
    assert f.evidence["later_starvation"] == {"windows_per_step": 3.0, "idle_us_per_step": 300.0}
    covers = rank_finding(tmp_path, "reduce-event-throttle").covers
    assert covers.starts.tolist() == [505.0, 910.0] and covers.ends.tolist() == [705.0, 1005.0]


def test_another_rules_sync_between_them_realigns_the_host(tmp_path: Path) -> None:
    # a cudaStreamSynchronize [222, 228) of another owner waits for a copy that ends at 226 inside it: it would
    # wait for that copy without the throttle too, so the first call's lead ends there (the copy does not move:
    # no compute-stream activity is launched in [220, 222)); only the second call's 100 µs reach the windows
    report = diagnose(tmp_path, throttle_run(between=True))
    (f,) = [f for f in report.findings if f.rule == "reduce-event-throttle"]
    assert f.cost_us == 100.0
    assert f.evidence["later_starvation"] == {"windows_per_step": 1.0, "idle_us_per_step": 100.0}


# -- (g) a sync on the main thread delays backward on the autograd thread ---------------------------------

ENGINE = "torch/autograd/graph.py(829): _engine_run_backward"
AUTOGRAD = 101  # torch's autograd engine runs backward on its own thread


def item_before_backward(engine: bool = True, busy_during_block: bool = False) -> list[dict[str, Any]]:
    """One step: forward's gather [5, 50) and GEMM [0, 300) launched by the main thread; `loss.item()` blocks
    it in a cudaStreamSynchronize [12, 304) until the GEMM ends; then (`engine`) the main thread enters
    `loss.backward()` at 306 ([306, 1500)) and the autograd thread, idle so far, launches backward's first
    gather at 320 ([324, 524), as soon as launched) and the GEMM that needs it at 322: compute stalls on the
    gather [322, 524). `busy_during_block`: the autograd thread runs an op [150, 170) while the main thread blocks."""
    events = [
        step(1, 0, 3000),
        launch(0, 1),
        kernel(GEMM, 0, 300, corr=1),
        launch(1, 2),
        kernel(AG, 5, 45, stream=21, corr=2),
        frame("train.py(66): log_loss", 10, 296),
        runtime("cudaStreamSynchronize", 12, 292, 3),
        frame("torch/autograd/function.py(307): apply", 318, 10, tid=AUTOGRAD),
        launch(320, 4, tid=AUTOGRAD),
        kernel(AG, 324, 200, stream=21, corr=4),
        launch(322, 5, tid=AUTOGRAD),
        kernel(GEMM, 524, 50, corr=5),
    ]
    if engine:
        events.append(frame(ENGINE, 306, 1194))
    if busy_during_block:
        events.append(cpu_op("aten::add", 150, 20, tid=AUTOGRAD))
    return events


def test_sync_delays_the_work_its_thread_hands_to_the_autograd_thread(tmp_path: Path) -> None:
    # the main thread returns at 304 and starts backward at 306; the autograd thread did nothing during the
    # block and begins inside that call: its launches come 292 µs late with the sync. Issued 292 µs earlier,
    # the gather could start at 50 (its stream predecessor's end), 274 µs earlier: the whole stall on it is the
    # sync's, not a missing prefetch
    report = diagnose(tmp_path, item_before_backward())
    found = {f.rule: f for f in report.findings}
    assert WAITS not in found
    f = found["host-sync"]
    stall = iv.length(rank_finding(tmp_path, "host-sync").covers)
    assert f.cost_us == stall == 202.0  # [322, 524)
    assert f.evidence["delayed_collectives"] == {"all_gather": {"per_step": 1.0, "stall_us_per_step": 202.0}}


@pytest.mark.symptom_without_cause("host-sync")
@pytest.mark.parametrize("engine, busy", [(False, False), (True, True)])
def test_another_threads_own_work_is_not_delayed_by_the_sync(tmp_path: Path, engine: bool, busy: bool) -> None:
    # the same stall, but the autograd thread's work is not the blocked thread's: it starts on its own (no call
    # of the main thread after the return holds it), or it was busy while the main thread blocked
    report = diagnose(tmp_path, item_before_backward(engine=engine, busy_during_block=busy))
    found = {f.rule: f for f in report.findings}
    assert "host-sync" not in found or found["host-sync"].cost_us == 0.0
    # the gather's exposure [324, 524) stays with the wait rules (one fetch: too little to call it on-demand)
    assert WAITS not in found and found["unexplained-exposure"].cost_us == 200.0


# -- (h) a throttle that waits for reductions slowed by a straggler ---------------------------------------

RS_ARGS = {
    "Collective name": "_reduce_scatter_base",
    "Process Group Name": "0",
    "In msg nelems": 16384,
    "dtype": "BFloat16",
}


def throttled_ranks(slow: int | None, ranks: int = 4, buckets: int = 5) -> list[list[dict[str, Any]]]:
    """`ranks` ranks, 2 steps of `buckets` gradient buckets each: GEMM A (1000 µs), the bucket's reduce-scatter
    after it (lockstep: it ends 200 µs after the last rank arrives), GEMM B (160 µs) queued behind A, then the
    reduce throttle blocks the host on the reduce-scatter until it ends (+2 µs) and the host launches the next
    bucket (+1 µs; it starts 2 µs later). Rank `slow` computes 1.3x slower (1300 and 208 µs): its GEMM B runs 8 µs
    past its reduction's end, so its throttle costs it nothing, while the others wait 300 µs and more for it in
    every reduce-scatter, their compute starving while their throttle blocks. Without a slow rank, every throttle
    waits for the 200 µs transfer, GEMM B done 40 µs before it ends: a real throttle."""
    out: list[list[dict[str, Any]]] = [[] for _ in range(ranks)]
    corr = [0] * ranks
    for s in range(2):
        base = 20_000.0 * s
        host = [base + 10.0] * ranks
        g = [base + 100.0] * ranks
        for r in range(ranks):
            out[r].append(step(s + 1, base, 19_000))
        for _ in range(buckets):
            pace = [1.3 if r == slow else 1.0 for r in range(ranks)]
            rs_end = max(g[r] + 1000 * pace[r] for r in range(ranks)) + 200.0
            for r in range(ranks):
                h, c, a_end, b = host[r], corr[r], g[r] + 1000 * pace[r], 160 * pace[r]
                out[r] += [
                    launch(h, c + 1),
                    kernel(GEMM, g[r], 1000 * pace[r], corr=c + 1),
                    launch(h + 1, c + 2),
                    kernel(RS, a_end, rs_end - a_end, stream=17, corr=c + 2, **RS_ARGS),
                    launch(h + 2, c + 3),
                    kernel(GEMM, a_end, b, corr=c + 3),
                    frame(THROTTLE, h + 2.5, rs_end + 0.5 - h),
                    runtime("cudaEventSynchronize", h + 3, rs_end + 2 - h - 3, c + 4),
                ]
                corr[r] = c + 4
                host[r] = rs_end + 3
                g[r] = max(rs_end + 5, a_end + b)
    return out


def throttled_report(folder: Path, slow: int | None) -> tuple[Report, list[float]]:
    """The report of `throttled_ranks(slow)` and each rank's own reduce-event-throttle cost (before the merge)."""
    folder.mkdir(parents=True, exist_ok=True)
    traces = throttled_ranks(slow)
    own = []
    for rank, events in enumerate(traces):
        path = write_trace(folder, f"rank{rank}.trace.json.gz", events, rank=rank, world_size=len(traces))
        model = load_trace(str(path))
        find = BY_ID["reduce-event-throttle"].find
        assert find is not None
        own.append(sum(f.cost_us for f in find(RankFacts(model, analyze_model(model)))))
    return analyze(folder, jobs=1), own


def test_a_straggler_explains_the_throttle_waiting_for_it(tmp_path: Path) -> None:
    # ranks 0-2 starve from GEMM B's end to the next GEMM A (345 µs and more per bucket) while their throttle
    # blocks, inside the reduce-scatter that waits for rank 3; rank 3's throttle costs nothing. The straggler's
    # `covers` (the others' exposed waiting for it) are taken off the others' throttle: what is left is what
    # its exposure model does not attribute to the wait, far below the throttle's own measure
    report, own = throttled_report(tmp_path, slow=3)
    found = {f.rule: f for f in report.findings}
    straggler = found["straggler"]
    assert straggler.ranks == [3]
    assert own[3] == 0.0 and min(own[:3]) > 1000.0
    waited = straggler.evidence["others_wait_us_per_step"]["median"]  # the others' exposed wait, per rank
    f = found["reduce-event-throttle"]
    assert f.evidence["explained_by"] == "straggler"
    assert f.cost_us == pytest.approx(sum(max(0.0, c - waited) for c in own[:3]) / 3, abs=1e-3)
    assert f.cost_us < own[0] / 2 and f.severity == "info"


@pytest.mark.symptom_without_cause("reduce-event-throttle")
def test_a_throttle_with_healthy_peers_keeps_its_cost(tmp_path: Path) -> None:
    # no slow rank: every reduce-scatter is its 200 µs transfer; the throttle blocks on it with GEMM B done
    # 40 µs before it ends: nothing cross-rank explains that, the throttle keeps its own cost on every rank
    report, own = throttled_report(tmp_path, slow=None)
    found = {f.rule: f for f in report.findings}
    assert "straggler" not in found and "bandwidth-bound" not in found
    f = found["reduce-event-throttle"]
    assert "explained_by" not in f.evidence
    assert min(own) > 0.0 and f.cost_us == pytest.approx(sum(own) / len(own), abs=1e-3)


# -- (i) a throttle whose reductions cannot keep up with backward at this bandwidth ------------------------------


def throttled_backward(reduce_us: float, nelems: int = 1 << 24) -> list[dict[str, Any]]:
    """One step, its backward pass one autograd op [0, 4000): GEMM 1 [5, 305); three reduce-scatters launched at
    10, 12, 14 run back to back from 20, `reduce_us` each; the throttle blocks the host from 16 until the first
    ends (20 + reduce_us); then GEMMs 2-6, 300 µs each, are launched one after another: compute idles from 305
    until GEMM 2 starts (30 + reduce_us), and backward computes 1800 µs in all. Each reduce-scatter moves
    `nelems` bf16 elements (32 MiB by default: large enough that its bytes, not NCCL's latency, set its time)."""
    first_end = 20 + reduce_us
    events = [
        step(1, 0, 6000),
        cpu_op("autograd::engine::evaluate_function: MmBackward0", 0, 4000),
        launch(1, 1),
        kernel(GEMM, 5, 300, corr=1),
        frame(THROTTLE, 15, first_end - 14),
        runtime("cudaEventSynchronize", 16, first_end - 16, 90),
    ]
    for i in range(3):
        rs = kernel(RS, 20 + i * reduce_us, reduce_us, stream=17, corr=2 + i, **{**RS_ARGS, "In msg nelems": nelems})
        events += [launch(10 + 2 * i, 2 + i), rs]
    t = first_end + 10
    for i in range(5):
        events += [launch(t - 5 + i, 10 + i), kernel(GEMM, t + 300 * i, 300, corr=10 + i)]
    return events


@pytest.mark.symptom_without_cause("reduce-event-throttle")
def test_a_throttle_of_reductions_that_outlast_backward_gets_no_bucket_fix(tmp_path: Path) -> None:
    # 400 µs reductions (1200 in all) inside an 1800 µs backward: the throttle's 125 µs idle [305, 430) is what
    # larger buckets save, and they are the fix
    found = {f.rule: f for f in diagnose(tmp_path / "fast", throttled_backward(400)).findings}
    f = found["reduce-event-throttle"]
    assert f.cost_us == 125.0 and "zero_optimization.reduce_bucket_size" in (f.fix.config or {})
    assert "reduction_transfer_us_per_step" not in f.evidence
    # 700 µs reductions (2100 in all) outlast the 1800 µs of backward compute: the throttle idles compute
    # 425 µs [305, 730), but unthrottled backward would still end before the reductions do: of the 425 µs only
    # 1800 + 425 - 2100 = 125 can be saved, and by no bucket size
    found = {f.rule: f for f in diagnose(tmp_path / "slow", throttled_backward(700)).findings}
    f = found["reduce-event-throttle"]
    assert f.cost_us == 125.0 and not f.fix.config
    assert f.evidence["reduction_transfer_us_per_step"] == 2100.0
    assert f.evidence["backward_compute_us_per_step"] == 1800.0
    assert f.evidence["cost_before_transfer_bound_us"] == 425.0
    assert "cannot keep up" in f.title and "larger buckets do not shorten them" in f.why
    # at 900 µs (2700 in all) nothing is left to save: no finding
    found = {f.rule: f for f in diagnose(tmp_path / "slower", throttled_backward(900)).findings}
    assert "reduce-event-throttle" not in found
    # 700 µs for 16 Ki elements each: NCCL's per-call latency, not the bytes (no large reduce-scatter, no sizes
    # apart to fit): nothing says bigger buckets would not shorten them, so the bucket fix stands
    found = {f.rule: f for f in diagnose(tmp_path / "latency", throttled_backward(700, 16384)).findings}
    f = found["reduce-event-throttle"]
    assert f.cost_us == 425.0 and "zero_optimization.reduce_bucket_size" in (f.fix.config or {})
