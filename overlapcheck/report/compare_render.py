"""The comparison of two runs (`report.compare.Comparison`) in four formats, one renderer class each (name,
extension, render): `text` (rich terminal), `json` (the `overlapcheck.compare/1` document), `markdown` (for a
pull-request comment), `html` (the two runs side by side, one self-contained page). Labels and number formats
come from `present`."""

from __future__ import annotations

import io
import math
from collections.abc import Callable
from typing import Any

from overlapcheck.compare import Comparison, Delta, FindingChange, signed_ms
from overlapcheck.model import ALL
from overlapcheck.report import page
from overlapcheck.report import present as P
from overlapcheck.report.base import Renderer
from overlapcheck.report.json import document_json

MAX_RANK_ROWS = P.MAX_RANK_ROWS  # ranks listed (largest change of exposed time first)
STATUS_MARK = {"appeared": "new", "disappeared": "gone", "changed": "changed", "same": "same"}


CompareRenderer = Renderer[Comparison]  # the one renderer interface (report/base.py), over the Comparison


# ------------------------------------------------------------------------------------------------ helpers


def signed_pts(change: float | None) -> str:
    """An overlap change in percentage points: +1.2 pts, −75.6 pts."""
    if change is None or not math.isfinite(change):
        return "n/a"
    value = round(100 * change, 1) or 0.0  # no "−0.0"
    return f"{value:+.1f} pts".replace("-", "−")


def kind_label(kind: str) -> str:
    return P.KIND_LABELS.get(kind, kind)


def ranks_by_change(c: Comparison, limit: int = MAX_RANK_ROWS) -> list[Any]:
    """Compared ranks, largest change of exposed time per step first."""
    return sorted(c.ranks, key=lambda r: (-abs(r.kinds[ALL].exposed_us_per_step.change or 0.0), r.rank))[:limit]


def cost_change(f: FindingChange) -> str:
    if f.status == "appeared":
        return f"{P.ms(f.cost_us.after)} ms/step"
    if f.status == "disappeared":
        return f"was {P.ms(f.cost_us.before)} ms/step"
    return f"{P.ms(f.cost_us.before)} → {P.ms(f.cost_us.after)} ms/step ({signed_ms(f.cost_us.change)})"


def finding_ranks(f: FindingChange) -> str:
    return P.rank_ranges(f.ranks_after or f.ranks_before)


# ------------------------------------------------------------------------------------------------- JSON


class CompareJsonRenderer:
    """`Comparison.to_dict()` as JSON: floats rounded to 6 decimals, non-finite numbers as null."""

    name = "json"
    extension = ".json"

    def __init__(self, digits: int | None = 6):
        self.digits = digits

    def render(self, comparison: Comparison) -> str:
        return document_json(comparison.to_dict(), self.digits)


# --------------------------------------------------------------------------------------------- terminal


class CompareTerminalRenderer:
    """The verdict, per-collective, per-phase and per-rank deltas, the finding changes and the notes."""

    name = "text"
    extension = ".txt"

    def __init__(self, width: int = 120):
        self.width = width

    def render(self, comparison: Comparison) -> str:
        from rich.console import Console

        console = Console(record=True, width=self.width, file=io.StringIO())
        console.print(self.group(comparison))
        return console.export_text()

    def group(self, comparison: Comparison) -> Any:
        """Every renderable, one below the other."""
        from rich.console import Group

        return Group(*self.renderables(comparison))

    def renderables(self, c: Comparison) -> list[Any]:
        from rich.panel import Panel
        from rich.table import Table
        from rich.text import Text

        def change_text(us: float | None) -> Text:
            style = "" if us is None or abs(us) < 100 else ("red" if us > 0 else "green")
            return Text(signed_ms(us), style=style)

        b, a = P.safe_line(c.before.source or "before"), P.safe_line(c.after.source or "after")
        out: list[Any] = [Panel(Text(P.safe_line(c.verdict)), title="overlapcheck compare", border_style="cyan")]
        kinds = Table(title=f"Per collective (median rank): {b} → {a}", title_justify="left")
        for col in ("collective", "overlap", "Δ overlap", "exposed ms/step", "Δ exposed", "total ms/step"):
            kinds.add_column(col, justify="left" if col == "collective" else "right")
        for k in c.kinds:
            kinds.add_row(
                kind_label(k.kind),
                f"{P.pct(k.overlap.before)} → {P.pct(k.overlap.after)}",
                signed_pts(k.overlap.change),
                f"{P.ms(k.exposed_us_per_step.before)} → {P.ms(k.exposed_us_per_step.after)}",
                change_text(k.exposed_us_per_step.change),
                f"{P.ms(k.time_us_per_step.before)} → {P.ms(k.time_us_per_step.after)}",
                style="bold" if k.kind == ALL else None,
            )
        sp = c.step_period_us
        kinds.caption = (
            f"step {P.ms(sp.before)} → {P.ms(sp.after)} ms ({signed_ms(sp.change)}); exposed share of step "
            f"{P.pct(c.exposed_share.before)} → {P.pct(c.exposed_share.after)}"
        )
        out.append(kinds)
        if c.phases:
            phases = Table(title="Per phase (median rank)", title_justify="left")
            for col in ("phase", "collective", "overlap", "Δ overlap", "exposed ms/step", "Δ exposed"):
                phases.add_column(col, justify="left" if col in ("phase", "collective") else "right")
            for p in c.phases:
                phases.add_row(
                    p.phase,
                    kind_label(p.kind),
                    f"{P.pct(p.overlap.before)} → {P.pct(p.overlap.after)}",
                    signed_pts(p.overlap.change),
                    f"{P.ms(p.exposed_us_per_step.before)} → {P.ms(p.exposed_us_per_step.after)}",
                    change_text(p.exposed_us_per_step.change),
                )
            out.append(phases)
        if c.ranks:
            shown = ranks_by_change(c)
            title = "Per rank, largest change first"
            if len(c.ranks) > len(shown):
                title = f"Per rank: the {len(shown)} largest changes of {len(c.ranks)}"
            ranks = Table(title=title, title_justify="left")
            for col in ("rank", "overlap", "exposed ms/step", "Δ exposed", "step ms", "Δ step"):
                ranks.add_column(col, justify="left" if col == "rank" else "right")
            for r in shown:
                k = r.kinds[ALL]
                ranks.add_row(
                    str(r.rank),
                    f"{P.pct(k.overlap.before)} → {P.pct(k.overlap.after)}",
                    f"{P.ms(k.exposed_us_per_step.before)} → {P.ms(k.exposed_us_per_step.after)}",
                    change_text(k.exposed_us_per_step.change),
                    f"{P.ms(r.step_period_us.before)} → {P.ms(r.step_period_us.after)}",
                    change_text(r.step_period_us.change),
                )
            out.append(ranks)
        changed = [f for f in c.findings if f.status != "same"]
        if changed:
            table = Table(title="Findings that changed", title_justify="left")
            for col in ("", "finding", "rule", "cost", "ranks"):
                table.add_column(col)
            styles = {"appeared": "bold red", "disappeared": "green", "changed": "yellow"}
            for f in changed:
                table.add_row(
                    Text(STATUS_MARK[f.status], style=styles.get(f.status, "")),
                    Text(P.safe_line(f.title)),
                    Text(P.safe_line(f.rule)),
                    Text(cost_change(f)),
                    Text(finding_ranks(f)),
                )
            out.append(table)
            for f in c.changes("appeared"):
                for line in P.fix_lines(f.fix):
                    out.append(Text(f"fix ({P.safe_line(f.rule)}): {line}", style="green"))
        same = len(c.changes("same"))
        if same:
            out.append(Text(f"{same} finding(s) in both runs at about the same cost", style="dim"))
        for note in c.notes:
            out.append(Text(f"note: {P.safe_line(note)}", style="dim"))
        return out


# --------------------------------------------------------------------------------------------- Markdown


def _cell(text: object) -> str:
    from overlapcheck.report.markdown import cell

    return cell(text)


class CompareMarkdownRenderer:
    """For a pull-request comment: the verdict, the per-collective deltas, the finding changes with fixes."""

    name = "markdown"
    extension = ".md"

    def render(self, c: Comparison) -> str:
        from overlapcheck.report.markdown import code

        total = c.kind(ALL)
        worse = total is not None and (total.exposed_us_per_step.change or 0.0) >= 100.0
        better = total is not None and (total.exposed_us_per_step.change or 0.0) <= -100.0
        measured = total is not None and None not in (total.exposed_us_per_step.before, total.exposed_us_per_step.after)
        mark = "ℹ️" if not measured else "❌" if worse or c.changes("appeared") else "✅" if better else "ℹ️"
        b, a = _cell(c.before.source or "before"), _cell(c.after.source or "after")
        lines = [f"### {mark} overlapcheck compare: {b} → {a}", "", _cell(c.verdict), ""]
        lines += [
            "| collective | overlap | Δ overlap | exposed ms/step | Δ exposed ms/step | total ms/step |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for k in c.kinds:
            lines.append(
                f"| {_cell(kind_label(k.kind))} | {P.pct(k.overlap.before)} → {P.pct(k.overlap.after)} | "
                f"{signed_pts(k.overlap.change)} | {P.ms(k.exposed_us_per_step.before)} → "
                f"{P.ms(k.exposed_us_per_step.after)} | {signed_ms(k.exposed_us_per_step.change)} | "
                f"{P.ms(k.time_us_per_step.before)} → {P.ms(k.time_us_per_step.after)} |"
            )
        sp = c.step_period_us
        lines += [
            "",
            f"Step {P.ms(sp.before)} → {P.ms(sp.after)} ms ({signed_ms(sp.change)}). Per step: the mean over a "
            "rank's profiled steps; each column: the median rank.",
            "",
        ]
        changed = [f for f in c.findings if f.status != "same"]
        if changed:
            lines.append("**Findings**:")
            lines.append("")
            for f in changed:
                lines.append(
                    f"- **{STATUS_MARK[f.status]}**: {_cell(f.title)} (`{code(f.rule)}`, {_cell(cost_change(f))}, "
                    f"ranks {finding_ranks(f)})"
                )
                if f.status == "appeared":
                    lines += [f"  - fix: `{code(line)}`" for line in P.fix_lines(f.fix)]
            lines.append("")
        if (same := len(c.changes("same"))) > 0:
            lines += [f"{same} finding(s) in both runs at about the same cost.", ""]
        for note in c.notes:
            lines.append(f"- note: {_cell(note)}")
        return "\n".join(lines).rstrip("\n") + "\n"


# ------------------------------------------------------------------------------------------------- HTML


def _delta_view(d: Delta, unit: str) -> dict[str, Any]:
    """Before, after and change as display strings, with a direction for colouring (worse / better)."""
    fmt: Callable[[float | None], str]
    chg: Callable[[float | None], str]
    if unit == "pct":
        fmt, chg = P.pct, signed_pts
        worse = d.change is not None and d.change < -0.005
        better = d.change is not None and d.change > 0.005
    else:
        fmt, chg = P.ms, signed_ms
        worse = d.change is not None and d.change >= 100.0
        better = d.change is not None and d.change <= -100.0
    return {
        "before": fmt(d.before),
        "after": fmt(d.after),
        "change": chg(d.change),
        "cls": "worse" if worse else "better" if better else "",
    }


def _finding_view(f: FindingChange) -> dict[str, Any]:
    return {
        "status": f.status,
        "mark": STATUS_MARK[f.status],
        "rule": f.rule,
        "title": f.title,
        "severity_before": f.severity_before,
        "severity_after": f.severity_after,
        "cost_before": P.ms(f.cost_us.before) if f.cost_us.before is not None else None,
        "cost_after": P.ms(f.cost_us.after) if f.cost_us.after is not None else None,
        "change": signed_ms(f.cost_us.change),
        "ranks": finding_ranks(f),
        "fix": P.fix_lines(f.fix),
    }


def build_view(c: Comparison) -> dict[str, Any]:
    """Everything the page shows, as strings (jinja2 escapes them)."""
    findings = [_finding_view(f) for f in c.findings]
    return {
        "verdict": c.verdict,
        "before": dataclass_dict(c.before),
        "after": dataclass_dict(c.after),
        "step": _delta_view(c.step_period_us, "ms"),
        "share": {
            "before": P.pct(c.exposed_share.before),
            "after": P.pct(c.exposed_share.after),
            "change": signed_pts(c.exposed_share.change),
        },
        "kinds": [
            {
                "label": kind_label(k.kind),
                "all": k.kind == ALL,
                "overlap": _delta_view(k.overlap, "pct"),
                "exposed": _delta_view(k.exposed_us_per_step, "ms"),
                "time": _delta_view(k.time_us_per_step, "ms"),
            }
            for k in c.kinds
        ],
        "phases": [
            {
                "phase": p.phase,
                "label": kind_label(p.kind),
                "overlap": _delta_view(p.overlap, "pct"),
                "exposed": _delta_view(p.exposed_us_per_step, "ms"),
            }
            for p in c.phases
        ],
        "ranks": [
            {
                "rank": r.rank,
                "overlap": _delta_view(r.kinds[ALL].overlap, "pct"),
                "exposed": _delta_view(r.kinds[ALL].exposed_us_per_step, "ms"),
                "step": _delta_view(r.step_period_us, "ms"),
            }
            for r in ranks_by_change(c, 64)
        ],
        "n_ranks": len(c.ranks),
        "findings_before": [f for f in findings if f["status"] in ("disappeared", "changed", "same")],
        "findings_after": [f for f in findings if f["status"] in ("appeared", "changed", "same")],
        "notes": list(c.notes),
        "schema": c.schema,
    }


def dataclass_dict(value: Any) -> dict[str, Any]:
    import dataclasses

    return dataclasses.asdict(value)


class CompareHtmlRenderer:
    """The two runs side by side on one self-contained page: no script, no network, the one inline style
    allowed by its hash, every string escaped."""

    name = "html"
    extension = ".html"

    def render(self, comparison: Comparison) -> str:
        import markupsafe

        css = page.asset("compare.css")
        return (
            page.environment()
            .get_template("compare.html.j2")
            .render(view=build_view(comparison), css=markupsafe.Markup(css), csp=page.csp(css))
        )


RENDERERS: dict[str, type[Any]] = {
    "text": CompareTerminalRenderer,
    "json": CompareJsonRenderer,
    "markdown": CompareMarkdownRenderer,
    "html": CompareHtmlRenderer,
}


def compare_renderer(name: str) -> CompareRenderer:
    instance: CompareRenderer = RENDERERS[name]()
    return instance
