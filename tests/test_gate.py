"""The gate's checks, threshold parsing, baseline comparison, JUnit XML and Markdown (no CLI here)."""

from __future__ import annotations

import dataclasses
import re
import xml.etree.ElementTree as ET

import pytest
from builders import as_report, make_report, report_doc

from overlapcheck.errors import UserError
from overlapcheck.gate import (
    GateConfig,
    append_step_summary,
    exit_code,
    parse_fraction,
    parse_min_overlap,
    parse_regressions,
    run_checks,
)
from overlapcheck.model import Report, ReportFormatError
from overlapcheck.report.junit import render_junit
from overlapcheck.report.markdown import render_gate_markdown


def by_id(checks):
    return {c.id: c for c in checks}


# ------------------------------------------------------------------------------------------- parsing


@pytest.mark.parametrize(("text", "value"), [("0.8", 0.8), ("80%", 0.8), (" 1 ", 1.0), ("0", 0.0), ("12.5%", 0.125)])
def test_parse_fraction(text, value):
    assert parse_fraction(text, "x") == pytest.approx(value)


@pytest.mark.parametrize("text", ["", "abc", "80", "-0.1", "nan", "inf", "150%", "0.8%%"])
def test_parse_fraction_rejects(text):
    with pytest.raises(UserError):
        parse_fraction(text, "--min-overlap")


def test_parse_min_overlap_kinds():
    assert parse_min_overlap(["reduce_scatter=0.8", "all-gather=75%", "all=0.5"]) == pytest.approx(
        {"reduce_scatter": 0.8, "all_gather": 0.75, "all": 0.5}
    )
    for bad in (["reduce_scatter"], ["allreduce=0.5"], ["all_gather=high"]):
        with pytest.raises(UserError):
            parse_min_overlap(bad)


def test_parse_regressions_defaults_to_all_and_allows_over_100_percent():
    assert parse_regressions(["10%"]) == pytest.approx({"all": 0.1})
    assert parse_regressions(["all_gather=150%", "0.05"]) == pytest.approx({"all_gather": 1.5, "all": 0.05})
    with pytest.raises(UserError):
        parse_regressions(["10"])  # ambiguous: 10 = 1000 %? must be written 10% or 0.1


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ([], "not an overlapcheck report"),
        ({"schema": "other/1"}, "not an overlapcheck report"),
        ({"schema": "overlapcheck.report/2", "ranks": []}, "not supported"),
        ({**report_doc(1), "ranks": {}}, "malformed report: ranks is not a list"),
        (
            {**report_doc(1), "ranks": [{k: v for k, v in report_doc(1)["ranks"][0].items() if k != "collectives"}]},
            "malformed report: ranks[0].collectives is missing",
        ),
    ],
)
def test_validate_report_rejects(doc, message):
    with pytest.raises(ReportFormatError, match=re.escape(message)):
        Report.from_dict(doc)
    assert issubclass(ReportFormatError, UserError)  # one line, exit code 2


def test_validate_report_accepts_minor_additions():
    report = report_doc(2)
    report["schema"] = "overlapcheck.report/1.3"
    report["something_new"] = {"added": "in a later 1.x"}
    report["ranks"][0]["new_metric"] = 1.0
    assert Report.from_dict(report).ranks[0].rank == 0


# -------------------------------------------------------------------------------------------- checks


def test_thresholds_pass_and_fail_on_worst_rank():
    report = make_report(4, overlaps=[0.9, 0.85, 0.6, 0.88])
    checks = by_id(run_checks(report, GateConfig(min_overlap={"all": 0.8, "all_gather": 0.65})))
    assert checks["inputs"].passed
    assert not checks["min-overlap.all"].passed
    assert "worst rank 2" in checks["min-overlap.all"].detail
    assert checks["min-overlap.all"].measured == "60.0%"
    assert checks["min-overlap.all_gather"].passed  # worst all-gather overlap is 0.6 + 0.1 = 0.7
    assert exit_code(list(checks.values())) == 1


def test_median_tolerates_one_outlier_rank():
    report = make_report(4, overlaps=[0.9, 0.85, 0.6, 0.88])
    checks = run_checks(report, GateConfig(min_overlap={"all": 0.8}, across="median"))
    assert exit_code(checks) == 0
    assert by_id(checks)["min-overlap.all"].measured == "86.5%"
    assert "median of 4 ranks" in by_id(checks)["min-overlap.all"].detail


def test_missing_collective_fails_with_reason():
    report = make_report(2)
    check = by_id(run_checks(report, GateConfig(min_overlap={"all_to_all": 0.5})))["min-overlap.all_to_all"]
    assert not check.passed and "no rank has all_to_all" in check.detail


def test_max_exposed_share():
    report = make_report(2, overlaps=[0.7, 0.7])
    share = report.ranks[0].exposed_share
    assert exit_code(run_checks(report, GateConfig(max_exposed_share=share + 0.001))) == 0
    assert exit_code(run_checks(report, GateConfig(max_exposed_share=share - 0.001))) == 1


def test_unreadable_inputs_and_empty_reports_fail():
    report = make_report(2, errors=[{"source": "rank7.json", "error": "truncated"}])
    check = by_id(run_checks(report, GateConfig(max_exposed_share=1.0)))["inputs"]
    assert not check.passed and "rank7.json" in check.detail
    empty = dataclasses.replace(make_report(1), ranks=[])
    assert not by_id(run_checks(empty, GateConfig(max_exposed_share=1.0)))["inputs"].passed


# ---------------------------------------------------------------------------------------- regressions


def test_exposed_per_step_is_mean_over_steps():
    rank = make_report(1).ranks[0]
    per_step = [s.collectives["all"].exposed_us for s in rank.steps]
    assert rank.exposed_per_step("all") == pytest.approx(sum(per_step) / len(per_step))
    assert rank.exposed_per_step("all") == pytest.approx(rank.collectives["all"].exposed_us / 2)  # 2 equal steps
    rank = dataclasses.replace(rank, steps=[])
    assert rank.exposed_per_step("all") == pytest.approx(rank.collectives["all"].exposed_us)


def test_baseline_regression_fails_beyond_relative_tolerance():
    base = make_report(4, overlaps=[0.8] * 4)
    worse = make_report(4, overlaps=[0.8, 0.8, 0.7, 0.8])  # rank 2: 20 % -> 30 % exposed: +50 %
    config = GateConfig(max_exposed_regression={"all": 0.1}, across="worst")
    check = by_id(run_checks(worse, config, baseline=base))["exposed-regression.all"]
    assert not check.passed
    assert "+50.0%" in check.measured and "worst rank 2" in check.detail
    assert exit_code(run_checks(make_report(4, overlaps=[0.8] * 4), config, baseline=base)) == 0


def test_baseline_comparisons_default_to_the_median_rank():
    base = make_report(4, overlaps=[0.8] * 4)
    one_rank = make_report(4, overlaps=[0.8, 0.8, 0.7, 0.8])  # one rank worse: the median rank is unchanged
    checks = by_id(run_checks(one_rank, GateConfig(), baseline=base))
    assert checks["exposed-regression.all"].passed and "median of 4" in checks["exposed-regression.all"].detail
    all_ranks = make_report(4, overlaps=[0.7] * 4)
    assert not by_id(run_checks(all_ranks, GateConfig(), baseline=base))["exposed-regression.all"].passed


def test_overlap_drop_in_points():
    base = make_report(4, overlaps=[0.8] * 4)
    checks = by_id(run_checks(make_report(4, overlaps=[0.76] * 4), GateConfig(), baseline=base))
    drop = checks["overlap-drop.all"]
    assert drop.passed and "-4.0 pts" in drop.measured and drop.limit == "drop ≤ 5.0 pts"
    checks = by_id(
        run_checks(
            make_report(4, overlaps=[0.7] * 4),
            GateConfig(max_overlap_drop={"all": 0.05, "all_gather": 0.2}),
            baseline=base,
        )
    )
    assert not checks["overlap-drop.all"].passed and checks["overlap-drop.all_gather"].passed
    assert "exposed-regression.all" not in checks  # explicit baseline checks replace the defaults
    vanished = by_id(run_checks(base, GateConfig(max_overlap_drop={"all_to_all": 0.0}), baseline=base))
    assert vanished["overlap-drop.all_to_all"].passed


def test_baseline_default_tolerance_is_10_percent():
    base = make_report(2, overlaps=[0.8, 0.8])
    slightly = make_report(2, overlaps=[0.79, 0.79])  # exposed 20 % -> 21 %: +5 %
    checks = run_checks(slightly, GateConfig(ignore_below_us=0), baseline=base)
    # every collective kind of the baseline is checked by default, not only `all`
    assert [c.id for c in checks] == [
        "inputs",
        "baseline-comparable",
        "exposed-regression.all",
        "exposed-regression.reduce_scatter",
        "exposed-regression.all_gather",
        "overlap-drop.all",
        "overlap-drop.reduce_scatter",
        "overlap-drop.all_gather",
    ]
    assert exit_code(checks) == 0
    worse = by_id(run_checks(make_report(2, overlaps=[0.77, 0.77]), GateConfig(ignore_below_us=0), baseline=base))
    assert not worse["exposed-regression.all"].passed  # +15 %
    assert not worse["exposed-regression.all_gather"].passed  # +30 %
    assert worse["exposed-regression.reduce_scatter"].passed  # +8.6 %


def test_noise_floor_absorbs_small_absolute_regressions():
    base = make_report(1, overlaps=[0.85])
    cur = make_report(1, overlaps=[0.8])  # exposed per step 2250 µs -> 3000 µs: +33 %, +750 µs
    strict = run_checks(cur, GateConfig(max_exposed_regression={"all": 0.1}, ignore_below_us=0), baseline=base)
    assert exit_code(strict) == 1
    loose = by_id(
        run_checks(cur, GateConfig(max_exposed_regression={"all": 0.1}, ignore_below_us=1000), baseline=base)
    )["exposed-regression.all"]
    assert loose.passed and "noise floor" in loose.detail


def test_improvement_passes_and_vanished_collective_is_zero():
    base = make_report(2, overlaps=[0.6, 0.6])
    better = make_report(2, overlaps=[0.9, 0.9])
    assert exit_code(run_checks(better, GateConfig(max_exposed_regression={"all": 0.0}), baseline=base)) == 0
    new_kind = run_checks(base, GateConfig(max_exposed_regression={"all_to_all": 0.1}), baseline=base)
    assert exit_code(new_kind) == 0


def test_regression_without_baseline_is_a_user_error():
    with pytest.raises(UserError, match="need --baseline"):
        run_checks(make_report(1), GateConfig(max_exposed_regression={"all": 0.1}))


# ------------------------------------------------------------------------------------- JUnit, Markdown


def _mixed_checks():
    base = make_report(4, overlaps=[0.8] * 4)
    cur = make_report(4, overlaps=[0.8, 0.8, 0.5, 0.8])
    config = GateConfig(
        min_overlap={"all": 0.6, "reduce_scatter": 0.5},
        max_exposed_share=0.5,
        max_exposed_regression={"all": 0.1},
        across="worst",
    )
    return run_checks(cur, config, baseline=base)


def test_junit_has_one_case_per_check_and_failures():
    checks = _mixed_checks()
    root = ET.fromstring(render_junit(checks).encode("utf-8"))
    suite = root.find("testsuite")
    cases = suite.findall("testcase")
    assert [c.get("name") for c in cases] == [
        "inputs",
        "min-overlap.all",
        "min-overlap.reduce_scatter",
        "max-exposed-share",
        "baseline-comparable",
        "exposed-regression.all",
    ]
    failed = {c.get("name") for c in cases if c.find("failure") is not None}
    assert failed == {"min-overlap.all", "min-overlap.reduce_scatter", "exposed-regression.all"}
    assert suite.get("tests") == "6" and suite.get("failures") == "3"
    assert "50.0%" in cases[1].find("failure").get("message")


def test_junit_escapes_strings():
    report = make_report(1, errors=[{"source": '<rank&1>"]]>.json', "error": "bad"}])
    xml = render_junit(run_checks(report, GateConfig(max_exposed_share=1.0)))
    failure = ET.fromstring(xml.encode("utf-8")).find("testsuite/testcase/failure")
    assert '<rank&1>"]]>.json' in failure.text


def test_markdown_summary_table():
    md = render_gate_markdown(_mixed_checks(), "out/report.json", "base|line.json")
    lines = md.splitlines()
    assert lines[0] == "### ❌ overlapcheck gate failed: 3 of 6 checks"
    assert "baseline `base|line.json`" in md
    rows = [ln for ln in lines if ln.startswith("| ✅") or ln.startswith("| ❌")]
    assert len(rows) == 6
    assert all(ln.replace("\\|", "").count("|") == 6 for ln in rows)
    assert rows[0].startswith("| ✅ | inputs read")
    ok = render_gate_markdown(run_checks(make_report(1), GateConfig(max_exposed_share=1.0)), "r.json")
    assert ok.startswith("### ✅ overlapcheck gate passed: 2 checks")


def test_markdown_cells_cannot_break_the_table():
    report = make_report(1, errors=[{"source": "a|b\nc<script>.json", "error": "x"}])
    md = render_gate_markdown(run_checks(report, GateConfig(max_exposed_share=1.0)), "r.json")
    row = [ln for ln in md.splitlines() if ln.startswith("| ❌")][0]
    assert "a\\|b c\\<script\\>.json" in row
    assert row.replace("\\|", "").count("|") == 6


def test_step_summary_appends(tmp_path):
    target = tmp_path / "summary.md"
    target.write_text("earlier step\n")
    assert append_step_summary("### table", {"GITHUB_STEP_SUMMARY": str(target)}) == str(target)
    assert target.read_text() == "earlier step\n### table\n"
    assert append_step_summary("x", {}) is None


def test_communication_the_baseline_had_and_the_report_lost_fails():
    base = make_report(2)
    doc = report_doc(2)
    for rank in doc["ranks"]:  # a capture that lost the all-gathers (other steps, NCCL not profiled)
        rank["collectives"]["all_gather"] = {"count": 0, "time_us": 0.0, "overlapped_us": 0.0, "exposed_us": 0.0}
        rank["collectives"]["all_gather"]["overlap"] = None
    lost = by_id(run_checks(as_report(doc), GateConfig(), baseline=base))["overlap-drop.all_gather"]
    assert not lost.passed and "has none: was it captured" in lost.detail
    # a kind neither side has is nothing to compare, and passes
    assert by_id(run_checks(base, GateConfig(max_overlap_drop={"all_to_all": 0.0}), baseline=base))[
        "overlap-drop.all_to_all"
    ].passed


def test_a_baseline_of_another_world_size_fails_its_own_check():
    # was: a baseline of 8 ranks gating a report of 2 passed, with only "rank count differs" in a detail line
    def sized(n: int) -> Report:
        report = make_report(n, overlaps=[0.8] * n)
        return dataclasses.replace(report, ranks=[dataclasses.replace(r, world_size=n) for r in report.ranks])

    base, cur = sized(8), sized(2)
    checks = by_id(run_checks(cur, GateConfig(), baseline=base))
    same = checks["baseline-comparable"]
    assert not same.passed and "another number of ranks" in same.detail
    assert (same.measured, same.limit) == ("2 ranks, per step", "8 ranks, per step")
    assert by_id(run_checks(base, GateConfig(), baseline=base))["baseline-comparable"].passed


def test_a_baseline_without_profiler_steps_is_not_like_for_like():
    # was: a baseline whose trace had no ProfilerStep held whole-trace totals (7.9 ms vs 15.7 ms "per step"), and a
    # report N times worse passed
    stepped = make_report(2, overlaps=[0.8, 0.8])
    whole = dataclasses.replace(stepped, ranks=[dataclasses.replace(r, steps=[]) for r in stepped.ranks])
    check = by_id(run_checks(stepped, GateConfig(), baseline=whole))["baseline-comparable"]
    assert not check.passed and "the baseline has no ProfilerStep" in check.detail, check
    assert check.limit.endswith("whole trace") and check.measured.endswith("per step")
    assert exit_code(run_checks(stepped, GateConfig(), baseline=whole)) == 1


def test_a_baseline_with_no_rank_in_common_is_not_like_for_like():
    # was: rank 0 gated against a baseline of rank 1 only passed, with "no rank in common" in a detail line
    report = make_report(2, overlaps=[0.8, 0.8])
    only = lambda n: dataclasses.replace(report, ranks=[r for r in report.ranks if r.rank == n])  # noqa: E731
    check = by_id(run_checks(only(0), GateConfig(), baseline=only(1)))["baseline-comparable"]
    assert not check.passed and "no rank is in both" in check.detail, check
