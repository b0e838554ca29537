"""Markdown summary of the gate (for $GITHUB_STEP_SUMMARY, PR comments and --markdown FILE)."""

from __future__ import annotations

from overlapcheck.report.gate import Check


def _cell(text: str) -> str:
    """One table cell: no line breaks, pipes and markup characters escaped."""
    out = " ".join(str(text).split())
    for ch in "\\|`*_<>[]":
        out = out.replace(ch, "\\" + ch)
    return out or " "


def render_markdown(checks: list[Check], report_path: str, baseline_path: str | None = None) -> str:
    """A heading with the verdict, what was compared, and a table with one row per check."""
    failed = [c for c in checks if not c.passed]
    head = (
        f"### ❌ overlapcheck gate failed: {len(failed)} of {len(checks)} checks"
        if failed
        else f"### ✅ overlapcheck gate passed: {len(checks)} checks"
    )
    lines = [
        head,
        "",
        f"Report `{_code(report_path)}`"
        + (f" compared with baseline `{_code(baseline_path)}`" if baseline_path else "")
        + ".",
        "",
        "| | check | measured | limit | detail |",
        "|---|---|---|---|---|",
    ]
    for c in checks:
        mark = "✅" if c.passed else "❌"
        lines.append(f"| {mark} | {_cell(c.name)} | {_cell(c.measured)} | {_cell(c.limit)} | {_cell(c.detail)} |")
    return "\n".join(lines) + "\n"


def _code(text: str) -> str:
    return " ".join(str(text).split()).replace("`", "'")
