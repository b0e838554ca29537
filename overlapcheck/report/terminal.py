"""The terminal report (rich): verdict, per-collective and per-rank tables, findings, notes and errors."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console, Group
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from overlapcheck.analysis.metrics import COLLECTIVE_KEYS

MAX_RANK_ROWS = 16
GOOD, FAIR = 0.8, 0.5
_SEVERITY_STYLE = {"critical": "bold red", "warning": "yellow", "info": "cyan"}


def render(report: dict[str, Any], console: Console) -> None:
    """Print the report."""
    ranks = report["ranks"]
    if ranks:
        console.print(_verdict(report))
        console.print(_collective_table(report))
        console.print(_rank_table(ranks))
    if report.get("findings"):
        console.print(_findings(report))
    notes = sorted({note for r in ranks for note in r.get("notes", [])})
    for note in notes:
        console.print(f"[dim]note: {escape(note)}[/dim]")
    for err in report.get("errors", []):
        console.print(f"[red]error:[/red] {escape(err['error'])}")


def pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def ms(us: float | None) -> str:
    return "n/a" if us is None else f"{us / 1000:.2f}"


def _overlap_text(value: float | None) -> Text:
    if value is None:
        return Text("n/a", style="dim")
    style = "green" if value >= GOOD else "yellow" if value >= FAIR else "red"
    return Text(pct(value), style=style)


def _verdict(report: dict[str, Any]) -> Panel:
    metrics = report["summary"]["metrics"]
    overall = metrics.get("all.overlap")
    share = metrics.get("exposed_share")
    n = report["summary"]["ranks"]
    if overall is None:
        line = Text(f"{n} rank(s): no communication to measure.")
    else:
        med = overall["median"]
        word = "hidden well" if med >= GOOD else "partly hidden" if med >= FAIR else "mostly exposed"
        line = Text.assemble(
            "Communication is ",
            (word, "bold"),
            f": median {pct(med)} overlapped across {n} rank(s)",
            f" (worst rank {overall['worst_rank']}: {pct(overall['min'])})",
        )
        if share is not None:
            line.append(f"; exposed communication is {pct(share['median'])} of step time (median).")
    return Panel(line, title="overlapcheck", border_style="blue")


SHORT = {
    "reduce_scatter": "RS",
    "all_gather": "AG",
    "all_reduce": "AR",
    "all_to_all": "A2A",
    "send_recv": "P2P",
    "broadcast": "bcast",
    "other": "other",
}


def present_kinds(ranks: list[dict[str, Any]]) -> list[str]:
    """Collective kinds (not `all`) that some rank has."""
    return [k for k in COLLECTIVE_KEYS[1:] if any(r["collectives"][k]["count"] for r in ranks)]


def _collective_table(report: dict[str, Any]) -> Table:
    table = Table(title="Per collective (per rank, across ranks)", title_justify="left")
    for col in ("collective", "kernels", "overlap", "worst (rank)", "exposed ms", "total ms"):
        table.add_column(col, justify="left" if col == "collective" else "right")
    metrics = report["summary"]["metrics"]
    ranks = report["ranks"]
    for kind in ("all", *present_kinds(ranks)):
        o = metrics.get(f"{kind}.overlap")
        if o is None:
            continue
        counts = sorted(r["collectives"][kind]["count"] for r in ranks)
        table.add_row(
            kind,
            str(counts[len(counts) // 2]),
            _overlap_text(o["median"]),
            f"{pct(o['min'])} ({o['worst_rank']})",
            ms(metrics[f"{kind}.exposed_us"]["median"]),
            ms(metrics[f"{kind}.time_us"]["median"]),
            style="bold" if kind == "all" else None,
        )
    steps = sorted(len(r["steps"]) for r in ranks)[len(ranks) // 2]
    over = f"the {steps} profiled steps of a rank" if steps else "each rank's trace"
    table.caption = f"kernels, exposed and total: sums over {over}; every column: median over ranks"
    return table


def _rank_table(ranks: list[dict[str, Any]]) -> Table:
    shown = ranks
    title = "Per rank"
    if len(ranks) > MAX_RANK_ROWS:
        shown = sorted(ranks, key=lambda r: _sort_overlap(r))[:MAX_RANK_ROWS]
        shown.sort(key=lambda r: r["rank"])
        title = f"Per rank: the {MAX_RANK_ROWS} with the lowest overlap of {len(ranks)}"
    kinds = present_kinds(ranks)
    table = Table(title=title, title_justify="left")
    for col in ("rank", "overlap", *(SHORT[k] for k in kinds), "exposed ms", "exp/step", "idle ms"):
        table.add_column(col, justify="left" if col == "rank" else "right")
    for r in shown:
        c = r["collectives"]
        table.add_row(
            str(r["rank"]),
            _overlap_text(c["all"]["overlap"]),
            *(_overlap_text(c[k]["overlap"]) for k in kinds),
            ms(c["all"]["exposed_us"]),
            pct(r["exposed_share"]),
            ms(r["idle_us"]),
        )
    return table


def _sort_overlap(rank: dict[str, Any]) -> float:
    value = rank["collectives"]["all"]["overlap"]
    return 2.0 if value is None else value


def _findings(report: dict[str, Any]) -> Panel:
    parts = []
    for i, f in enumerate(report["findings"], 1):
        style = _SEVERITY_STYLE.get(f.get("severity", "info"), "")
        head = Text.assemble(
            (f"{i}. [{f.get('severity', 'info')}] ", style),
            (f.get("title", f["rule"]), "bold"),
            f"  ({f['rule']}, {ms(f.get('cost_us'))} ms/step)",
        )
        parts.append(head)
        if f.get("why"):
            parts.append(Text("   " + f["why"]))
        fix = f.get("fix") or {}
        for key, value in (fix.get("config") or {}).items():
            parts.append(Text(f"   fix: set {key} = {json.dumps(value)}", style="green"))
        for key, value in (fix.get("env") or {}).items():
            parts.append(Text(f"   fix: {'unset ' + key if value is None else f'export {key}={value}'}", style="green"))
        if fix.get("upgrade"):
            parts.append(Text(f"   fix: upgrade to {fix['upgrade']}", style="green"))
    share = report.get("findings_explain_share")
    title = "Findings" + (f" (explain {pct(share)} of exposed communication)" if share is not None else "")
    return Panel(Group(*parts), title=title, title_align="left", border_style="yellow")
