"""What the report says that no single number shows: collectives issued without their kernels recorded, ranks
that captured other steps than the rest, and CPU (gloo) ranks no rule could diagnose; said in JSON, text,
Markdown and HTML (issue 19, items 4-6)."""

from __future__ import annotations

from pathlib import Path

import pytest
from builders import cpu_op, kernel, launch, step, write_trace

from overlapcheck import analyze
from overlapcheck.diagnose.registry import RULES
from overlapcheck.report import renderer

GLOO_2RANK = Path(__file__).parent / "data" / "gloo-2rank"
RS = "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
GEMM = "ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_32x5_nn"


def said_everywhere(report, fragment: str) -> None:
    """The fragment is in the JSON and in the text, Markdown and HTML renderings."""
    for name in ("json", "text", "markdown", "html"):
        out = renderer(name).render(report)
        text = out.decode() if isinstance(out, bytes) else out
        flat = " ".join(text.split())
        assert fragment in flat, f"{name} does not say {fragment!r}"


def test_collectives_issued_without_kernels_recorded_are_said(tmp_path):
    events = [step(1, 0, 100), kernel(GEMM, 0, 50)]
    for i in range(3):
        events += [cpu_op("record_param_comms", 10 + 20 * i, 5), cpu_op("nccl:all_reduce", 11 + 20 * i, 3)]
    events += [cpu_op("record_param_comms", 80, 5), cpu_op("nccl:broadcast", 81, 3)]
    write_trace(tmp_path, "rank0.json.gz", events)
    report = analyze(tmp_path)
    (note,) = [n for n in report.ranks[0].notes if "issued" in n]
    assert note.startswith("4 collectives were issued (all_reduce 3, broadcast 1)")
    said_everywhere(report, "4 collectives were issued")


def test_no_collective_op_no_claim(tmp_path):
    write_trace(tmp_path, "rank0.json.gz", [step(1, 0, 100), kernel(GEMM, 0, 50)])
    assert "no communication kernels: overlap is null" in analyze(tmp_path).ranks[0].notes


def _rank(folder: Path, rank: int, steps: int, world_size: int = 3) -> None:
    events = []
    for s in range(steps):
        t = 1000.0 * s
        events += [step(5 + s, t, 900), kernel(GEMM, t, 400), launch(t + 500, corr=s + 1)]
        events.append(kernel(RS, t + 501, 100, stream=20, corr=s + 1))
    write_trace(folder, f"rank{rank}.json.gz", events, rank=rank, world_size=world_size)


def test_a_rank_with_fewer_steps_is_said(tmp_path):
    for rank, steps in ((0, 3), (1, 3), (2, 2)):
        _rank(tmp_path, rank, steps)
    report = analyze(tmp_path)
    (note,) = report.notes or []
    assert note.startswith("uneven capture: 2 ranks profiled 3 steps (5, 6, 7), but rank 2: 2 steps (5, 6)")
    said_everywhere(report, "uneven capture: 2 ranks profiled 3 steps")
    assert "the capture is uneven" in renderer("text").render(report)


def test_even_captures_have_no_job_note(tmp_path):
    for rank in range(2):
        _rank(tmp_path, rank, 3, world_size=2)
    assert analyze(tmp_path).notes is None


@pytest.mark.skipif(not GLOO_2RANK.is_dir(), reason="no real gloo capture in tests/data")
def test_cpu_ranks_say_which_rules_could_not_apply():
    report = analyze(GLOO_2RANK)
    assert all(r.lanes == "cpu" for r in report.ranks)
    (note,) = [n for n in report.notes or [] if "CPU (gloo) lanes" in n]
    assert f"{len(RULES) - 1} of the {len(RULES)} rules (all but bandwidth-bound) read GPU streams" in note
    said_everywhere(report, "were measured on CPU (gloo) lanes:")
    # the rule that reads only sizes and durations applies, and its documented precondition holds here: the
    # floor is more than half of the exposed communication (27.4 ms/step, 24.4 of it the floor)
    (bw,) = [f for f in report.findings if f.rule == "bandwidth-bound"]
    assert bw.evidence["floor_us_per_step"] > 0.5 * (
        bw.evidence["floor_us_per_step"] + bw.evidence["schedulable_us_per_step"]
    )
