"""End to end on real traces: `analyze --format json --html`, then the HTML page and the gate on that report."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from builders import Page, shared_traces_dir
from click.testing import CliRunner

from overlapcheck.cli import main

SHARED = shared_traces_dir()
DLRM = SHARED / "dlrm-8rank-v100" if SHARED is not None else None

pytestmark = pytest.mark.skipif(DLRM is None or not DLRM.is_dir(), reason="needs ../shared/traces/dlrm-8rank-v100")


@pytest.fixture(scope="module")
def analyzed(tmp_path_factory) -> tuple[Path, Path]:
    out = tmp_path_factory.mktemp("dlrm")
    report, html = out / "report.json", out / "report.html"
    result = CliRunner().invoke(
        main, ["analyze", str(DLRM), "--format", "json", "-o", str(report), "--html", str(html)]
    )
    assert result.exit_code == 0, result.output
    return report, html


def test_real_report_page(analyzed):
    report_path, html_path = analyzed
    report = json.loads(report_path.read_text())
    page = Page(html_path.read_text(encoding="utf-8"))
    timelines = [b for b in page.json_blocks() if "lanes" in b]
    assert sorted(t["rank"] for t in timelines) == list(range(8))
    assert all(t["n"] > 0 and t["exposed"] for t in timelines)
    rows = [a for t, a in page.tags if t == "tr" and a.get("class") == "worst"]
    assert len(rows) == 1
    worst = report["summary"]["metrics"]["all.overlap"]["worst_rank"]
    assert f"rank {worst}" in page.visible()  # the verdict names the analyzer's worst rank
    assert json.loads(page.scripts[0][1])["initialRank"] == worst


def test_gate_on_real_report(analyzed, tmp_path):
    report_path, _ = analyzed
    runner = CliRunner()
    baseline = tmp_path / "baseline.json"
    shutil.copyfile(report_path, baseline)  # the report itself as its baseline is refused; a copy is not
    same = runner.invoke(main, ["gate", str(report_path), "--baseline", str(baseline)], env={"GITHUB_STEP_SUMMARY": ""})
    assert same.exit_code == 0, same.output
    # MANIFEST.md: worker4 overlaps 0.56 %, every rank under 10 %
    low = runner.invoke(main, ["gate", str(report_path), "--min-overlap", "all=0.005"], env={"GITHUB_STEP_SUMMARY": ""})
    assert low.exit_code == 0, low.output
    high = runner.invoke(
        main,
        ["gate", str(report_path), "--min-overlap", "all=0.01", "--junit", str(tmp_path / "j.xml")],
        env={"GITHUB_STEP_SUMMARY": ""},
    )
    assert high.exit_code == 1 and "worst rank 4 of 8" in high.output
    saved = runner.invoke(main, ["baseline", "save", str(report_path), str(tmp_path / "base.json")])
    assert saved.exit_code == 0 and "8 ranks" in saved.output
