"""`overlapcheck report RUN_DIR` on the run folder layout of docs/capture.md: summaries and run.json at the top,
the traces alone in traces/; what run.json says about an incomplete capture reaches every output."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from builders import run_cli

SAMPLE = Path(__file__).resolve().parents[1] / "sample_traces" / "straggler"
NOTE = "capture incomplete on 1 of 2 ranks: rank 1: failed: the job ended after 4 optimizer steps, inside the window"


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """A run folder as `overlapcheck run` lays it out, with the straggler sample's traces."""
    out = tmp_path / "run"
    (out / "traces").mkdir(parents=True)
    for rank in (0, 1):
        shutil.copy(SAMPLE / f"rank{rank}.trace.json.gz", out / "traces" / f"rank{rank}.pt.trace.json.gz")
    run = {"schema": "overlapcheck.run/1", "world_size": 2, "incomplete_ranks": [1], "notes": [NOTE]}
    run["ds_config"] = json.loads((SAMPLE / "ds_config.json").read_text())
    (out / "run.json").write_text(json.dumps(run))
    (out / "traces" / ".rank0.host.123.tmp.json.gz").write_bytes(b"a killed export of an older version")
    return out


def _json(*args: str) -> dict:
    proc = run_cli(*args, "--format", "json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_report_reads_the_traces_folder_and_ignores_hidden_temp_files(run_dir: Path) -> None:
    doc = _json("report", str(run_dir))
    assert [r["rank"] for r in doc["ranks"]] == [0, 1] and doc["errors"] == []
    assert doc["run"]["incomplete_ranks"] == [1]
    direct = _json("analyze", str(SAMPLE))
    assert [r["collectives"] for r in doc["ranks"]] == [r["collectives"] for r in direct["ranks"]]


def _summarize(run_dir: Path, rank: int) -> None:
    """What each rank's summary process does after its export."""
    trace, out, status = (
        run_dir / "traces" / f"rank{rank}.pt.trace.json.gz",
        run_dir / f"rank{rank}.summary.json",
        run_dir / "st",
    )
    cmd = [sys.executable, "-m", "overlapcheck.capture.summary", "--trace", str(trace), "--out", str(out)]
    subprocess.run([*cmd, "--status", str(status)], check=True)


def test_summaries_stand_for_their_traces_and_a_bad_one_falls_back_to_the_trace(run_dir: Path) -> None:
    for rank in (0, 1):
        _summarize(run_dir, rank)
    from_summaries = _json("report", str(run_dir))
    assert from_summaries["errors"] == [] and [r["source"] for r in from_summaries["ranks"]] == [
        "rank0.pt.trace.json.gz",
        "rank1.pt.trace.json.gz",
    ]  # read from the summaries (which name their trace), not from traces/
    (run_dir / "rank1.summary.json").write_text('{"schema": "overlapcheck.report/1", "ranks": "broken"}')
    with_fallback = _json("report", str(run_dir))
    assert with_fallback["errors"] == []
    assert with_fallback["ranks"][1]["source"].endswith("traces/rank1.pt.trace.json.gz")
    assert with_fallback["ranks"][1]["collectives"] == from_summaries["ranks"][1]["collectives"]
    assert with_fallback["findings"] == from_summaries["findings"]


@pytest.mark.parametrize("fmt", ["text", "markdown"])
def test_an_incomplete_capture_is_said_on_top(run_dir: Path, fmt: str) -> None:
    proc = run_cli("report", str(run_dir), "--format", fmt)
    assert proc.returncode == 0, proc.stderr
    text = " ".join(proc.stdout.split())
    assert "capture: capture incomplete on 1 of 2 ranks: rank 1" in text
    assert text.index("capture:") < text.index("reduce-scatter")  # before the tables


def test_an_incomplete_capture_is_said_in_the_html(run_dir: Path, tmp_path: Path) -> None:
    page = tmp_path / "r.html"
    proc = run_cli("report", str(run_dir), "--html", str(page))
    assert proc.returncode == 0, proc.stderr
    assert "capture: capture incomplete on 1 of 2 ranks" in page.read_text()


def test_steps_over_summaries_without_traces_is_an_error(run_dir: Path) -> None:
    for rank in (0, 1):
        _summarize(run_dir, rank)
    shutil.rmtree(run_dir / "traces")  # traces deleted after the run, to save space
    proc = run_cli("report", str(run_dir), "--steps", "5:6")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "--steps 5:6 needs the ranks' traces" in proc.stderr
    assert run_cli("report", str(run_dir)).returncode == 0  # without --steps the summaries are the report
