"""What the findings explain of the exposed communication (facts/coverage.py), the `unexplained-exposure` finding,
on hand-built traces."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from builders import cpu_op, kernel, launch, step, write_trace

from overlapcheck.analysis import intervals as iv
from overlapcheck.analysis.metrics import analyze_model
from overlapcheck.diagnose import _explained, _less_cross_explained, merge_findings
from overlapcheck.diagnose.facts.coverage import coverage
from overlapcheck.diagnose.facts.job import JobFacts
from overlapcheck.diagnose.facts.view import RankFacts
from overlapcheck.diagnose.finding import finding
from overlapcheck.job import JobContext
from overlapcheck.model import Finding
from overlapcheck.pipeline import analyze, analyze_trace
from overlapcheck.trace.reader import load_trace

GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n"
AR = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
RS = "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"


def ddp_trace(folder: Path, rank: int = 0, world_size: int = 1) -> Path:
    """One step: compute [0, 1000) and [2004, 2500) on stream 7; all-reduces on stream 20 at [1000, 2000) and
    [2500, 3000), each launched inside `c10d::allreduce_` just before it starts; the second compute kernel is
    launched only when the first all-reduce ends and starts 4 µs later (the host was late: no sync, no stream
    wait, no kernel held by another): nothing explains the first all-reduce's 1000 µs of exposure (plus the
    4 µs launch gap, which no communication fills), and the second is the step's last gradient reduction
    (inherent)."""
    events = [
        step(1, 0, 3200),
        launch(0, 1),
        kernel(GEMM, 0, 1000, corr=1),
        cpu_op("c10d::allreduce_", 990, 8),
        launch(995, 2),
        kernel(AR, 1000, 1000, stream=20, corr=2),
        launch(2000, 3),
        kernel(GEMM, 2004, 496, corr=3),
        cpu_op("c10d::allreduce_", 2490, 8),
        launch(2495, 4),
        kernel(AR, 2500, 500, stream=20, corr=4),
    ]
    folder.mkdir(parents=True, exist_ok=True)
    return write_trace(folder, f"rank{rank}.trace.json.gz", events, rank=rank, world_size=world_size)


def facts_of(path: Path) -> RankFacts:
    model = load_trace(str(path))
    return RankFacts(model, analyze_model(model))


def test_exposure_splits_into_explained_inherent_and_unexplained(tmp_path: Path) -> None:
    facts = facts_of(ddp_trace(tmp_path))
    cov = coverage(facts, [])
    assert (cov.exposed_us, cov.inherent_us, cov.explained_us) == (1500.0, 500.0, 0.0)
    assert cov.unexplained_us == 1000.0
    assert list(zip(cov.unexplained.starts.tolist(), cov.unexplained.ends.tolist(), strict=True)) == [(1000, 2000)]


def test_findings_that_cover_the_same_window_count_once(tmp_path: Path) -> None:
    facts = facts_of(ddp_trace(tmp_path))

    def covering(rule: str, lo: float, hi: float) -> Finding:
        return finding(rule, rule, "", hi - lo, [0], [1], {}, covers=iv.union(np.array([lo]), np.array([hi])))

    both = [covering("host-sync", 1000, 1800), covering("cross-stream-wait", 1200, 2000)]
    cov = coverage(facts, both)
    assert cov.explained_us == 1000.0  # the union [1000, 2000), not 800 + 800
    assert cov.unexplained_us == 0.0
    zero = finding("host-sync", "t", "", 0.0, [0], [1], {}, covers=iv.union(np.array([1000.0]), np.array([2000.0])))
    assert coverage(facts, [zero]).explained_us == 0.0  # a finding that costs nothing explains nothing


def test_unexplained_exposure_is_located_by_collective_and_call_site(tmp_path: Path) -> None:
    ddp_trace(tmp_path)
    report = analyze(tmp_path, jobs=1)
    f = next(f for f in report.findings if f.rule == "unexplained-exposure")
    assert f.cost_us == 1000.0
    assert f.severity == "warning"  # a third of the 3000 µs step, capped: it names where, not why
    assert f.fix.config is None and f.fix.env is None
    assert f.evidence["exposed_us_per_step"] == 1500.0
    assert f.evidence["inherent_us_per_step"] == 500.0
    top = f.evidence["by_location"][0]
    assert top == {
        "collective": "all_reduce",
        "phase": None,
        "call_site": "c10d::allreduce_",
        "exposed_us_per_step": 1000.0,
    }
    assert "all_reduce" in f.title and "c10d::allreduce_" in f.why
    assert report.findings_explain_share == 0.0  # the unexplained finding explains nothing


@pytest.mark.symptom_without_cause("unexplained-exposure")
def test_no_unexplained_finding_when_the_rest_is_inherent(tmp_path: Path) -> None:
    # the same step with the first all-reduce hidden behind compute: only the last bucket is exposed
    events = [
        step(1, 0, 3200),
        launch(0, 1),
        kernel(GEMM, 0, 2000, corr=1),
        launch(950, 2),
        kernel(AR, 1000, 1000, stream=20, corr=2),
        launch(1990, 3),
        kernel(GEMM, 2000, 500, corr=3),
        launch(2400, 4),
        kernel(AR, 2500, 500, stream=20, corr=4),
    ]
    write_trace(tmp_path, "rank0.trace.json.gz", events, rank=0, world_size=1)
    assert [f.rule for f in analyze(tmp_path, jobs=1).findings] == []


def test_cross_rank_findings_explain_the_rest_of_each_rank(tmp_path: Path) -> None:
    results = [analyze_trace(str(ddp_trace(tmp_path, rank=r, world_size=2)), JobContext()) for r in (0, 1)]
    findings, share = merge_findings(JobFacts(results, JobContext()))
    assert [f.rule for f in findings] == ["unexplained-exposure"]
    assert share == 0.0
    # a cross-rank finding that explains 600 µs on each rank: 400 µs stay unexplained (13 % of the 3000 µs step,
    # so still reported), and the share counts the 600 once per rank
    across = {0: 600.0, 1: 600.0}
    rest = _less_cross_explained(results[0].findings[0], results[0], across)
    assert rest is not None and rest.cost_us == 400.0
    assert _explained(results, across) == pytest.approx(600.0 / 1500.0)
    assert _less_cross_explained(results[0].findings[0], results[0], {0: 990.0}) is None  # 10 µs left: dropped


def test_a_collective_that_compute_follows_is_not_the_steps_tail(tmp_path: Path) -> None:
    # one stream, no backward ops: compute, an all-reduce, compute again; the all-reduce is no last bucket
    events = [
        step(1, 0, 3200),
        launch(0, 1),
        kernel(GEMM, 0, 1000, corr=1),
        launch(995, 2),
        kernel(AR, 1000, 1000, corr=2),
        launch(1000, 3),
        kernel(GEMM, 2000, 1000, corr=3),
    ]
    write_trace(tmp_path, "rank0.trace.json.gz", events, rank=0, world_size=1)
    cov = coverage(facts_of(tmp_path / "rank0.trace.json.gz"), [])
    assert (cov.exposed_us, cov.inherent_us, cov.unexplained_us) == (1000.0, 0.0, 1000.0)
    assert "unexplained-exposure" in {f.rule for f in analyze(tmp_path, jobs=1).findings}


def test_a_collective_issued_inside_the_optimizer_step_is_located_there(tmp_path: Path) -> None:
    # real clocks are ~1.7e15 µs, where a float64 step is 0.25 µs: the phase must not rely on sub-µs offsets
    t0 = 1.6827259e15
    events = [
        {**e, "ts": e["ts"] + t0}
        for e in [
            step(1, 0, 3200),
            cpu_op("autograd::engine::evaluate_function: MmBackward0", 0, 900),
            launch(0, 1),
            kernel(GEMM, 0, 1000, corr=1),
            launch(50, 5),  # a reduce-scatter hidden behind backward: the all-reduces are no gradient buckets
            kernel(RS, 100, 200, stream=17, corr=5),
            {**step(0, 950, 150), "name": "Optimizer.step#AdamW.step"},
            launch(995, 2),
            kernel(AR, 1000, 1000, stream=20, corr=2),
            launch(2000, 3),
            kernel(GEMM, 2004, 496, corr=3),
            launch(2495, 4),
            kernel(AR, 2500, 500, stream=20, corr=4),
        ]
    ]
    write_trace(tmp_path, "rank0.trace.json.gz", events, rank=0, world_size=1)
    f = next(f for f in analyze(tmp_path, jobs=1).findings if f.rule == "unexplained-exposure")
    assert f.evidence["by_location"][0]["phase"] == "optimizer"
    assert "in optimizer" in f.title
