"""Findings without measurable cost are folded in the terminal, the Markdown and the HTML, and kept in the JSON."""

from __future__ import annotations

from builders import make_finding, make_report

from overlapcheck.report import present as P
from overlapcheck.report import renderer


def test_findings_without_measurable_cost_are_folded_in_text_and_html_but_kept_in_json() -> None:
    report = make_report(
        findings=[make_finding("reduce-scatter-deferred", 4_200.0), make_finding("host-sync", 0.0, title="a sync")]
    )
    shown, folded = P.costly(report)
    assert [f.rule for f in shown] == ["reduce-scatter-deferred"]
    assert [f.rule for f in folded] == ["host-sync"]
    text = renderer("text").render(report)
    assert "Also seen, no measurable cost: host-sync." in text
    assert "a sync" not in text
    markdown = renderer("markdown").render(report)
    assert "Also seen, no measurable cost: host-sync." in markdown
    html = renderer("html").render(report)
    assert '<details class="folded"><summary>Also seen, no measurable cost (1)</summary>' in html
    assert "a sync" in html  # still there, folded
    assert [f["rule"] for f in report.to_dict()["findings"]] == ["reduce-scatter-deferred", "host-sync"]
    assert P.verdict(report).top_finding is not None and P.verdict(report).top_finding.rule != "host-sync"


def test_only_findings_without_cost_make_no_top_finding() -> None:
    report = make_report(findings=[make_finding("host-sync", 0.0)])
    assert P.verdict(report).top_finding is None
