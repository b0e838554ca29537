"""`overlapcheck gate` and `overlapcheck baseline save` through the CLI: exit codes 0/1/2 and the files written."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest
from builders import report_doc
from click.testing import CliRunner

from overlapcheck.cli import main


@pytest.fixture
def write(tmp_path):
    def _write(name: str, doc) -> str:
        path = tmp_path / name
        path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
        return str(path)

    return _write


def gate(*args: str, env: dict | None = None):
    return CliRunner().invoke(main, ["gate", *args], env=env or {"GITHUB_STEP_SUMMARY": ""})


def test_pass_exit_0_with_table(write):
    report = write("r.json", report_doc(4, overlaps=[0.9, 0.85, 0.82, 0.88]))
    result = gate(report, "--min-overlap", "all=0.8", "--max-exposed-share", "25%")
    assert result.exit_code == 0, result.output
    assert "PASS" in result.output and "all overlap (worst)" in result.output
    assert "gate: PASS (3 checks)" in result.output


def test_threshold_missed_exit_1(write):
    report = write("r.json", report_doc(4, overlaps=[0.9, 0.85, 0.6, 0.88]))
    result = gate(report, "--min-overlap", "reduce_scatter=0.8", "--min-overlap", "all=0.5")
    assert result.exit_code == 1
    assert "FAIL" in result.output and "gate: FAIL (1 of 3 checks failed)" in result.output


def test_across_median(write):
    report = write("r.json", report_doc(4, overlaps=[0.9, 0.85, 0.6, 0.88]))
    assert gate(report, "--min-overlap", "all=0.8", "--across", "median").exit_code == 0


def test_baseline_regression_exit_1_and_junit_markdown(write, tmp_path):
    base = write("base.json", report_doc(4, overlaps=[0.8] * 4))
    cur = write("cur.json", report_doc(4, overlaps=[0.8, 0.8, 0.7, 0.8]))
    junit, md, summary = tmp_path / "gate.xml", tmp_path / "gate.md", tmp_path / "summary.md"
    result = gate(
        cur,
        "--baseline",
        base,
        "--max-exposed-regression",
        "10%",
        "--across",
        "worst",
        "--junit",
        str(junit),
        "--markdown",
        str(md),
        env={"GITHUB_STEP_SUMMARY": str(summary)},
    )
    assert result.exit_code == 1, result.output
    cases = ET.parse(junit).getroot().findall("testsuite/testcase")
    assert [(c.get("name"), c.find("failure") is not None) for c in cases] == [
        ("inputs", False),
        ("baseline-comparable", False),
        ("exposed-regression.all", True),
    ]
    assert md.read_text().startswith("### ❌ overlapcheck gate failed: 1 of 3 checks")
    assert summary.read_text() == md.read_text()


def test_baseline_unchanged_passes(write):
    base = write("base.json", report_doc(4))
    current = write("current.json", report_doc(4))  # a copy: the report itself as its baseline is refused
    result = gate(current, "--baseline", base)
    assert result.exit_code == 0
    # inputs, the world size, then exposed regression and overlap drop of all, reduce-scatter and all-gather
    assert "gate: PASS (8 checks)" in result.output


def test_overlap_drop_exit_1(write):
    base = write("base.json", report_doc(4, overlaps=[0.8] * 4))
    cur = write("cur.json", report_doc(4, overlaps=[0.72] * 4))
    result = gate(cur, "--baseline", base, "--max-overlap-drop", "5%")
    assert result.exit_code == 1 and "-8.0 pts" in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["missing.json", "--min-overlap", "all=0.5"], "missing.json: no such file"),
        (["{dir}/notjson.json", "--min-overlap", "all=0.5"], "not JSON"),
        (["{dir}/other.json", "--min-overlap", "all=0.5"], "not an overlapcheck report"),
        (["{dir}/v2.json", "--min-overlap", "all=0.5"], "not supported"),
        (["{dir}/ok.json", "--min-overlap", "all=high"], "not a number"),
        (["{dir}/ok.json", "--min-overlap", "rs=0.5"], "unknown collective"),
        (["{dir}/ok.json", "--max-exposed-share", "20"], "above 1"),
        (["{dir}/ok.json", "--max-exposed-regression", "10%"], "need --baseline"),
        (["{dir}/ok.json", "--baseline", "{dir}/v2.json"], "not supported"),
        (["{dir}/ok.json", "--baseline", "{dir}/ok.json", "--ignore-below-us", "x"], "not a number"),
        (["{dir}/ok.json"], "nothing to check"),
    ],
)
def test_bad_input_exit_2_one_line(write, tmp_path, args, message):
    write("notjson.json", "{nope")
    write("other.json", {"traceEvents": []})
    write("v2.json", {**report_doc(1), "schema": "overlapcheck.report/2"})
    write("ok.json", report_doc(1))
    result = CliRunner().invoke(main, ["gate", *[a.format(dir=tmp_path) for a in args]])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("overlapcheck: error: ") and message in lines[0]


def test_baseline_save_refuses_overwrite(write, tmp_path):
    report = write("r.json", report_doc(2))
    target = tmp_path / "base.json"
    result = CliRunner().invoke(main, ["baseline", "save", report, str(target)])
    assert result.exit_code == 0, result.output
    assert json.loads(target.read_text()) == json.loads((tmp_path / "r.json").read_text())
    assert "saved baseline" in result.output
    again = CliRunner().invoke(main, ["baseline", "save", report, str(target)])
    assert again.exit_code == 2 and "--force" in again.output
    forced = CliRunner().invoke(main, ["baseline", "save", report, str(target), "--force"])
    assert forced.exit_code == 0


def test_baseline_save_rejects_non_reports(write, tmp_path):
    bad = write("bad.json", {"schema": "something/1"})
    result = CliRunner().invoke(main, ["baseline", "save", bad, str(tmp_path / "b.json")])
    assert result.exit_code == 2 and "not an overlapcheck report" in result.output
    assert not (tmp_path / "b.json").exists()


def test_outputs_are_never_overwritten_without_force(write, tmp_path):
    report = write("r.json", report_doc(2))
    junit = tmp_path / "gate.xml"
    junit.write_text("precious")
    result = gate(report, "--min-overlap", "all=0.5", "--junit", str(junit))
    assert result.exit_code == 2 and "already exists" in result.output and "--force" in result.output
    assert junit.read_text() == "precious"
    forced = gate(report, "--min-overlap", "all=0.5", "--junit", str(junit), "--force")
    assert forced.exit_code == 0, forced.output
    assert ET.parse(junit).getroot().find("testsuite") is not None


@pytest.mark.parametrize("option", ["--junit", "--markdown"])
@pytest.mark.parametrize("target", ["report", "baseline"])
def test_an_output_never_replaces_an_input_even_with_force(write, tmp_path, option, target):
    report = write("r.json", report_doc(2))
    base = write("base.json", report_doc(2))
    before = {p: (tmp_path / p).read_text() for p in ("r.json", "base.json")}
    output = report if target == "report" else base
    result = gate(report, "--baseline", base, option, output, "--force")
    assert result.exit_code == 2 and "is also an input" in result.output, result.output
    assert {p: (tmp_path / p).read_text() for p in before} == before
