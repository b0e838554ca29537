"""Markdown: the report for a pull-request comment, and the gate's summary (for $GITHUB_STEP_SUMMARY)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from overlapcheck.model import Report
from overlapcheck.report import present as P
from overlapcheck.report.base import expect_report

if TYPE_CHECKING:
    from overlapcheck.gate import Check


def cell(text: object) -> str:
    """One table cell: one line, control characters shown, pipes and markup characters escaped."""
    out = P.safe_line(text)
    for ch in "\\|`*_<>[]":
        out = out.replace(ch, "\\" + ch)
    return out or " "


def code(text: object) -> str:
    return P.safe_line(text).replace("`", "'")


class MarkdownRenderer:
    """The verdict, the per-collective table, the worst ranks and the findings with their fixes."""

    name = "markdown"
    extension = ".md"

    def render(self, report: Report) -> str:
        report = expect_report(report)
        v = P.verdict(report)
        mark = {"good": "✅", "warn": "⚠️", "bad": "❌", "none": "ℹ️"}[v.level]
        lines = [f"### {mark} overlapcheck: {cell(v.headline)}", "", cell(v.sentence()), ""]
        if notes := P.capture_notes(report):
            lines += [*(f"> ⚠️ capture: {cell(note)}" for note in notes), ""]
        if report.notes:
            lines += [*(f"> note: {cell(note)}" for note in report.notes), ""]
        rows = P.kind_rows(report)
        if rows:
            columns = P.kind_columns(report)
            lines += ["| " + " | ".join(columns) + " |", "|---|" + "---:|" * (len(columns) - 1)]
            for row in rows:
                cells = P.kind_cells(row)
                lines.append("| " + " | ".join(cell(cells[col]) for col in columns) + " |")
            caption = P.kind_caption(report)
            lines += ["", cell(caption[0].upper() + caption[1:]) + ".", ""]
        worst = P.worst_first(report.ranks)[:5]
        if len(report.ranks) > 1 and worst:
            lines += [
                "| rank (lowest overlap first) | " + " | ".join(P.RANK_COLUMNS) + " |",
                "|---|" + "---:|" * len(P.RANK_COLUMNS),
            ]
            for r in worst:
                cells = P.rank_cells(r)
                lines.append(f"| {r.rank} | " + " | ".join(cells[col] for col in P.RANK_COLUMNS) + " |")
            lines += ["", cell(P.RANK_CAPTION[0].upper() + P.RANK_CAPTION[1:]) + ".", ""]
        if outside := P.outside_steps_line(report):
            lines += [cell(outside[0].upper() + outside[1:]) + ".", ""]
        if report.findings:
            lines.append(f"**Findings** ({cell(P.explained(report) or 'ranked by cost')}):")
            lines.append("")
            shown, folded = P.costly(report)
            for i, f in enumerate(shown, 1):
                lines.append(
                    f"{i}. **[{f.severity}] {cell(f.title)}** (`{code(f.rule)}`, {P.ms(f.cost_us)} ms/step, "
                    f"ranks {P.rank_ranges(f.ranks)})"
                )
                if f.why:
                    lines.append(f"   - why: {cell(f.why)}")  # the explanation the terminal and HTML give
                lines += [f"   - fix: `{code(line)}`" for line in P.fix_lines(f.fix)]
            if line := P.folded_line(folded):
                lines += ["", cell(line[0].upper() + line[1:]) + "."]
            lines.append("")
        for err in report.errors:
            lines.append(f"- error: {cell(err.error)}")
        if notes := P.rank_notes(report, limit=20):
            lines += ["", "Notes:", "", *(f"- {cell(note)}" for note in notes)]
        return "\n".join(lines).rstrip("\n") + "\n"


def render_gate_markdown(checks: Sequence[Check], report_path: str, baseline_path: str | None = None) -> str:
    """A heading with the gate's verdict, what was compared, and a table with one row per check."""
    failed = [c for c in checks if not c.passed]
    head = (
        f"### ❌ overlapcheck gate failed: {len(failed)} of {len(checks)} checks"
        if failed
        else f"### ✅ overlapcheck gate passed: {len(checks)} checks"
    )
    compared = f" compared with baseline `{code(baseline_path)}`" if baseline_path else ""
    lines = [head, "", f"Report `{code(report_path)}`{compared}.", "", "| | check | measured | limit | detail |"]
    lines.append("|---|---|---|---|---|")
    for c in checks:
        mark = "✅" if c.passed else "❌"
        lines.append(f"| {mark} | {cell(c.name)} | {cell(c.measured)} | {cell(c.limit)} | {cell(c.detail)} |")
    return "\n".join(lines) + "\n"
