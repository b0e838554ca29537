"""Inherent exposure is only the transfer no change removes (facts/coverage.py, docs/rules.md "Inherent
exposure"): each step's first all-gather and last bucket at the best rate measured, never the waiting for peers,
never the reductions queued behind the last bucket; hand-built traces with each number computed by hand."""

from __future__ import annotations

from pathlib import Path

import pytest
from builders import cpu_op, kernel, launch, step, write_trace

from overlapcheck.analysis.metrics import analyze_model
from overlapcheck.diagnose.facts.coverage import coverage
from overlapcheck.diagnose.facts.view import RankFacts
from overlapcheck.pipeline import analyze
from overlapcheck.trace.reader import load_trace

GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n"
AR = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
RS = "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
BACKWARD = "autograd::engine::evaluate_function: MmBackward0"
SIZE = {"In msg nelems": 8_000_000, "Out msg nelems": 8_000_000, "dtype": "BFloat16", "Group size": 8}


def ddp_step(last_us: float, size: dict | None = None) -> list[dict]:
    """One DDP step: compute [0, 2000); a bucket's all-reduce [1000, 1500) hidden behind it; the last bucket's
    all-reduce [2000, 2000 + last_us) alone after it, with no compute after (the step's tail)."""
    size = SIZE if size is None else size
    return [
        step(1, 0, 2000 + last_us + 100),
        launch(0, 1),
        kernel(GEMM, 0, 2000, corr=1),
        cpu_op("c10d::allreduce_", 990, 8),
        launch(995, 2),
        kernel(AR, 1000, 500, stream=20, corr=2, **size),
        cpu_op("c10d::allreduce_", 1990, 8),
        launch(1995, 3),
        kernel(AR, 2000, last_us, stream=20, corr=3, **size),
    ]


def facts_of(path: Path) -> RankFacts:
    model = load_trace(str(path))
    return RankFacts(model, analyze_model(model))


def test_the_last_bucket_is_inherent_only_at_the_best_rate_of_its_size(tmp_path: Path) -> None:
    # the same 16 MB all-reduce took 500 µs earlier in the step: of the last one's 1500 µs, 500 are its transfer
    path = write_trace(tmp_path, "rank0.trace.json.gz", ddp_step(1500), rank=0, world_size=1)
    cov = coverage(facts_of(path), [])
    assert (cov.exposed_us, cov.inherent_us, cov.unexplained_us) == (1500.0, 500.0, 1000.0)
    # the transfer is the end of the kernel: the first 1000 µs are the rest
    assert list(zip(cov.unexplained.starts.tolist(), cov.unexplained.ends.tolist(), strict=True)) == [(2000, 3000)]
    f = next(f for f in analyze(tmp_path, jobs=1).findings if f.rule == "unexplained-exposure")
    assert f.cost_us == 1000.0 and f.evidence["inherent_us_per_step"] == 500.0


def test_a_last_bucket_as_fast_as_its_peers_is_all_inherent(tmp_path: Path) -> None:
    path = write_trace(tmp_path, "rank0.trace.json.gz", ddp_step(500), rank=0, world_size=1)
    cov = coverage(facts_of(path), [])
    assert (cov.exposed_us, cov.inherent_us, cov.unexplained_us) == (500.0, 500.0, 0.0)
    assert analyze(tmp_path, jobs=1).findings == []


def test_of_unknown_size_a_kernel_is_its_own_best(tmp_path: Path) -> None:
    path = write_trace(tmp_path, "rank0.trace.json.gz", ddp_step(1500, size={}), rank=0, world_size=1)
    cov = coverage(facts_of(path), [])
    assert (cov.inherent_us, cov.unexplained_us) == (1500.0, 0.0)


def zero3_tail(queued: bool) -> list[dict]:
    """Backward compute [0, 3000) (an autograd op around its launch); three same-size reduce-scatters on stream 30,
    each 600 µs: [2000, 2600), then [2600, 3200) and [3200, 3800) after backward compute ended at 3000. `queued`:
    the host issued all three at 1900-1910 (they ran back to back); else the last two were issued only when they
    start (late, not queued)."""
    issue = (1900, 1905, 1910) if queued else (1900, 2599, 3199)
    events = [step(1, 0, 4000), cpu_op(BACKWARD, 0, 2990), launch(0, 1), kernel(GEMM, 0, 3000, corr=1)]
    for n, (t, start) in enumerate(zip(issue, (2000, 2600, 3200), strict=True)):
        events += [launch(t, 10 + n), kernel(RS, start, 600, stream=30, corr=10 + n, **SIZE)]
    return events


def test_reductions_queued_behind_the_last_bucket_are_a_bandwidth_limit(tmp_path: Path) -> None:
    write_trace(tmp_path, "rank0.trace.json.gz", zero3_tail(queued=True), rank=0, world_size=1)
    report = analyze(tmp_path, jobs=1)
    (limit,) = [f for f in report.findings if f.rule == "reduce-transfer-bound"]
    # exposed: [3000, 3800); the last bucket's 600 µs are inherent, the queued one's 200 µs after backward the limit
    assert limit.cost_us == 200.0 and limit.severity == "info"
    assert limit.evidence["queued_reductions_per_step"] == 1.0
    assert not [f for f in report.findings if f.rule == "unexplained-exposure"]


@pytest.mark.symptom_without_cause("reduce-transfer-bound")
def test_late_issued_reductions_after_backward_are_no_bandwidth_limit(tmp_path: Path) -> None:
    # the symptom (reductions exposed after backward) without the cause (they were not queued): not a limit
    write_trace(tmp_path, "rank0.trace.json.gz", zero3_tail(queued=False), rank=0, world_size=1)
    assert not [f for f in analyze(tmp_path, jobs=1).findings if f.rule == "reduce-transfer-bound"]


def two_ranks(folder: Path, first_us: tuple[tuple[float, float], ...], world_size: int = 2) -> Path:
    """Two ranks, two steps; each step's first all-gather (issued with nothing queued) takes `first_us[r][s]` on
    rank r in step s, then compute; the shorter one is the transfer, the rest is waiting for the peer."""
    ag = "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
    for rank, durations in enumerate(first_us):
        events = []
        for s, dur in enumerate(durations):
            t = 10_000.0 * s
            events += [step(5 + s, t, 9000), launch(t + 10, 1 + 10 * s)]
            events.append(kernel(ag, t + 20, dur, stream=40, corr=1 + 10 * s, **SIZE))
            events += [launch(t + 30, 2 + 10 * s), kernel(GEMM, t + 20 + dur, 8000 - dur, corr=2 + 10 * s)]
        write_trace(folder, f"rank{rank}.trace.json.gz", events, rank=rank, world_size=world_size)
    return folder


def test_waiting_for_peers_inside_a_gather_counted_inherent_is_never_inherent(tmp_path: Path) -> None:
    # ranks 0-1 wait 600 µs beyond the 400 µs transfer at every step's first gather (so their own fastest is
    # 1000 µs); the last to arrive rotates over ranks 2-5, so none of them is a straggler
    late = [(1000.0,) * 4] * 2 + [tuple(400.0 if s == k else 700.0 for s in range(4)) for k in range(4)]
    report = analyze(two_ranks(tmp_path, tuple(late), world_size=6), jobs=1)
    assert not [f for f in report.findings if f.rule == "straggler"]
    (peer,) = [f for f in report.findings if f.rule == "peer-wait"]
    assert peer.ranks == [0, 1] and peer.cost_us == 600.0 and peer.severity == "warning"
    assert peer.evidence["wait_us_per_step"] == {"min": 0.0, "median": 0.0, "max": 600.0}
    assert peer.evidence["by_kind_us_per_step"] == {"all_gather": 600.0}


@pytest.mark.symptom_without_cause("peer-wait")
def test_a_rank_whose_own_fastest_gather_is_the_transfer_needs_no_peer(tmp_path: Path) -> None:
    # the ranks take turns arriving late: each rank's own fast gather caps its slow one, so the wait is
    # unexplained on the rank already (located), and peer-wait has nothing to move
    report = analyze(two_ranks(tmp_path, ((1800.0, 400.0), (400.0, 1800.0))), jobs=1)
    assert not [f for f in report.findings if f.rule in ("peer-wait", "straggler")]
    (rest,) = [f for f in report.findings if f.rule == "unexplained-exposure"]
    assert rest.cost_us == 700.0 and rest.evidence["inherent_us_per_step"] == 400.0


def test_a_straggler_explains_the_others_waiting_for_it(tmp_path: Path) -> None:
    # rank 1 is late at every step: the straggler owns rank 0's waiting, peer-wait says nothing more
    report = analyze(two_ranks(tmp_path, ((1000.0, 1000.0), (400.0, 400.0))), jobs=1)
    assert [f.ranks for f in report.findings if f.rule == "straggler"] == [[1]]
    assert not [f for f in report.findings if f.rule == "peer-wait"]


def test_a_partial_job_gives_both_readings(tmp_path: Path) -> None:
    folder = tmp_path / "one"
    folder.mkdir()
    write_trace(folder, "rank0.trace.json.gz", ddp_step(1500), rank=0, world_size=8)
    (note,) = [n for n in analyze(folder, jobs=1).notes or [] if n.startswith("one rank of 8")]
    assert "read as a slow link, all of it is transfer and inherent" in note
    assert "only 0.50 ms/step is" in note and "1.00 ms/step is counted unexplained" in note
