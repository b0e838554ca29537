"""`overlapcheck analyze`: the JSON document keeps its documented shape; the text report shows the numbers."""

from __future__ import annotations

import json

from builders import kernel, launch, run_cli, step, write_trace

from overlapcheck.model import COLLECTIVE_KEYS

SPLIT_KEYS = {"count", "time_us", "overlapped_us", "exposed_us", "overlap"}
RANK_KEYS = {
    "rank",
    "source",
    "world_size",
    "backend",
    "host",
    "lanes",
    "span_us",
    "busy_us",
    "compute_us",
    "idle_us",
    "step_time_us",
    "exposed_share",
    "collectives",
    "memcpy",
    "memset",
    "streams",
    "steps",
    "notes",
    "before_first_step",
    "outside_steps",
}
STEP_KEYS = {
    "step",
    "start_us",
    "duration_us",
    "cpu_duration_us",
    "compute_us",
    "exposed_share",
    "collectives",
    "memcpy",
    "memset",
    "period_start_us",
    "period_us",
}


def make_set(tmp_path):
    for rank in range(2):
        write_trace(
            tmp_path,
            f"rank{rank}.trace.json.gz",
            [
                step(7, 0, 100),
                launch(0, corr=1, dur=0.5),  # a kernel belongs to the step whose span holds its launch
                launch(0.5, corr=2, dur=0.5),
                kernel("sm90_xmma_gemm_bf16", 0, 10, corr=1),
                kernel("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL", 5, 10, stream=20, corr=2),
            ],
            rank=rank,
        )
    return tmp_path


def test_json_report_schema(tmp_path):
    proc = run_cli("analyze", str(make_set(tmp_path)), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["schema"] == "overlapcheck.report/1"
    assert {"schema", "tool", "run", "ranks", "summary", "findings", "findings_explain_share", "errors"} <= set(doc)
    for rank in doc["ranks"]:
        assert set(rank) >= RANK_KEYS
        assert set(rank["collectives"]) == set(COLLECTIVE_KEYS)
        for split in rank["collectives"].values():
            assert set(split) == SPLIT_KEYS
        assert rank["collectives"]["reduce_scatter"]["overlap"] == 0.5
        assert len(rank["steps"]) == 1 and set(rank["steps"][0]) >= STEP_KEYS
        assert set(rank["steps"][0]["collectives"]) == set(COLLECTIVE_KEYS)
    assert doc["summary"]["ranks"] == 2
    assert doc["summary"]["metrics"]["reduce_scatter.overlap"]["median"] == 0.5
    assert "timelines" not in doc


def test_text_report(tmp_path):
    proc = run_cli("analyze", str(make_set(tmp_path)))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "50.0%" in out and "reduce-scatter" in out and "RS overlap" in out
    # the verdict weighs the exposed share of the step: 5 of the step's 15 µs are exposed communication
    assert "Exposed communication is costing step time" in out and "33.3% of step time" in out
    for column in ("kernels/step", "worst overlap (rank)", "exposed ms/step", "total ms/step"):
        assert column in out
    assert "Per rank, lowest overlap first" in out
    for column in ("exposed % of step", "step ms/step", "idle ms total"):
        assert column in out


def test_text_report_to_file(tmp_path):
    out = tmp_path / "report.txt"
    proc = run_cli("analyze", str(make_set(tmp_path / ".")), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "reduce-scatter" in out.read_text() and "50.0%" in out.read_text()
