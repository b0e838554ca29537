"""The terminal report (rich): verdict, per-collective and per-rank tables, findings, notes and errors."""

from __future__ import annotations

import io
import os

from rich.console import Console, Group, RenderableType
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from overlapcheck.model import ALL, Finding, Report
from overlapcheck.report import present as P
from overlapcheck.report.base import expect_report

_SEVERITY_STYLE = {"critical": "bold red", "warning": "yellow", "info": "cyan"}
_LEVEL_STYLE = {"good": "green", "warn": "yellow", "bad": "red", "none": "blue"}


MAX_PIPE_WIDTH = 240  # off a terminal: as wide as the widest table, up to this
COLUMNS_RANGE = (20, 1000)  # a COLUMNS outside it is ignored: 0 printed nothing at all, 10^9 never finished


def console_environ() -> dict[str, str]:
    """The environment a rich Console reads its width from: without a COLUMNS outside COLUMNS_RANGE (or not a
    number), which is then as if unset."""
    env = dict(os.environ)
    text = env.get("COLUMNS", "").strip()
    if "COLUMNS" in env and not (text.isascii() and text.isdigit() and len(text) < 8 and _usable(int(text))):
        del env["COLUMNS"]
    elif "COLUMNS" in env:
        env["COLUMNS"] = text  # " 100" is 100 (rich would drop it)
    return env


def _usable(columns: int) -> bool:
    return COLUMNS_RANGE[0] <= columns <= COLUMNS_RANGE[1]


def stdout_console(renderables: list[RenderableType], **kwargs: object) -> Console:
    """The Console for stdout. On a terminal, its width; off one (CI logs, pipes, `| less`) rich would take 80
    columns and cut headers to "collec…": there, as wide as the widest table needs (COLUMNS still wins, when it
    is a width at all: `console_environ`)."""
    env = console_environ()
    kwargs = {"_environ": env, **kwargs}
    console = Console(**kwargs)  # type: ignore[arg-type]
    if console.is_terminal or env.get("COLUMNS"):
        return console
    tables: list[Table] = []
    todo = list(renderables)
    while todo:
        r = todo.pop()
        if isinstance(r, Table):
            tables.append(r)
        elif isinstance(r, Group):
            todo += r.renderables
    widest = max(
        (console.measure(t, options=console.options.update_width(MAX_PIPE_WIDTH)).maximum for t in tables), default=0
    )
    return Console(width=min(MAX_PIPE_WIDTH, max(console.width, widest)), **kwargs)  # type: ignore[arg-type]


class TerminalRenderer:
    """The report as rich renderables (`renderables`) or as plain text (`render`, `width` columns)."""

    name = "text"
    extension = ".txt"

    def __init__(self, width: int = 120, errors: bool = True):
        self.width = width
        self.errors = errors  # False where the CLI prints each error on stderr already (never twice)

    def render(self, report: Report) -> str:
        report = expect_report(report)
        console = Console(record=True, width=self.width, file=io.StringIO())
        console.print(*self.renderables(report))
        return console.export_text()

    def renderables(self, report: Report) -> list[RenderableType]:
        out: list[RenderableType] = []
        if report.ranks or not report.errors:  # no rank and no error: say so, as the Markdown does
            out.append(_verdict(report))
        out += [Text(f"capture: {P.safe_line(note)}", style="bold yellow") for note in P.capture_notes(report)]
        if report.ranks:
            out += [_collective_table(report), _rank_table(report)]
            if modules := _module_table(report):
                out.append(modules)
            if line := P.outside_steps_line(report):
                out.append(Text(P.safe_line(line)))
            if line := P.bandwidth_line(report):
                out.append(Text(P.safe_line(line)))
        if report.findings:
            out.append(_findings(report))
        out += [Text(f"note: {P.safe(note)}", style="yellow") for note in report.notes or []]
        out += [Text(f"note: {P.safe(note)}", style="dim") for note in (report.modules.notes if report.modules else [])]
        for note in sorted({note for r in report.ranks for note in r.notes}):
            out.append(Text(f"note: {P.safe(note)}", style="dim"))
        for err in report.errors if self.errors else []:
            out.append(Text.assemble(("error: ", "red"), P.safe(err.error)))
        # each line on its own: rich prints consecutive Text objects of one print() call on one line
        return [Group(r) if isinstance(r, Text) else r for r in out]


def _cell(value: str) -> Text:
    """A table cell or caption as plain text: rich reads a str as markup, and a module, host or kernel name from
    a trace may hold brackets (`ff[/]` raised MarkupError; `[red]` would have been drawn red)."""
    return Text(value)


def _overlap_text(value: float | None) -> Text:
    if value is None:
        return Text("n/a", style="dim")
    style = "green" if value >= P.GOOD_OVERLAP else "yellow" if value >= P.FAIR_OVERLAP else "red"
    return Text(P.pct(value), style=style)


def _verdict(report: Report) -> Panel:
    v = P.verdict(report)
    return Panel(Text(v.sentence()), title="overlapcheck", border_style=_LEVEL_STYLE[v.level])


def _collective_table(report: Report) -> Table:
    table = Table(title="Per collective (median rank)", title_justify="left")
    columns = P.kind_columns(report)
    for col in columns:
        table.add_column(col, justify="left" if col == "collective" else "right")
    for row in P.kind_rows(report):
        cells: list[RenderableType] = [_cell(P.kind_cells(row)[col]) for col in columns]
        cells[columns.index("overlap")] = _overlap_text(row.overlap)
        table.add_row(*cells, style="bold" if row.kind == ALL else None)
    table.caption = _cell(P.kind_caption(report))
    return table


def _rank_table(report: Report) -> Table:
    ranks = report.ranks
    shown = P.worst_first(ranks)[: P.MAX_RANK_ROWS]
    title = "Per rank, lowest overlap first"
    if len(ranks) > P.MAX_RANK_ROWS:
        title = f"Per rank: the {P.MAX_RANK_ROWS} with the lowest overlap of {len(ranks)}"
    kinds = P.present_kinds(ranks)
    table = Table(title=title, title_justify="left")
    header = ("rank", "overlap", *(f"{P.KIND_SHORT[k]} overlap" for k in kinds), *P.RANK_COLUMNS[1:])
    for col in header:
        table.add_column(col, justify="left" if col == "rank" else "right")
    for r in shown:
        c = r.collectives
        cells = P.rank_cells(r)
        table.add_row(
            str(r.rank),
            _overlap_text(c[ALL].overlap),
            *(_overlap_text(c[k].overlap) for k in kinds),
            *(_cell(cells[col]) for col in P.RANK_COLUMNS[1:]),
        )
    table.caption = _cell(P.RANK_CAPTION)
    return table


def _module_table(report: Report) -> Table | None:
    rows = P.module_rows(report)
    if not rows:
        return None
    table = Table(title="Per module, most exposed first (per rank and step)", title_justify="left")
    for col in P.MODULE_COLUMNS:
        table.add_column(col, justify="left" if col in ("module", "collective", "phase", "from") else "right")
    for row in rows:
        table.add_row(*(_cell(row[col]) for col in P.MODULE_COLUMNS))  # module names are the model's: not markup
    caption = P.module_caption(report)
    table.caption = _cell(caption) if caption else None
    return table


def _findings(report: Report) -> Panel:
    parts: list[RenderableType] = []
    shown, folded = P.costly(report)
    for i, f in enumerate(shown, 1):
        parts += _finding(i, f)
    if line := P.folded_line(folded):
        parts.append(Text(line[0].upper() + line[1:] + ".", style="dim"))
    title = "Findings" + (f" ({text})" if (text := P.explained(report)) else "")
    return Panel(Group(*parts), title=escape(title), title_align="left", border_style="yellow")


def _finding(i: int, f: Finding) -> list[RenderableType]:
    style = _SEVERITY_STYLE.get(f.severity, "")
    head = Text.assemble(
        (f"{i}. [{f.severity}] ", style),
        (P.safe_line(f.title), "bold"),
        f"  ({f.rule}, {P.ms(f.cost_us)} ms/step, rank{'s' if len(f.ranks) != 1 else ''} {P.rank_ranges(f.ranks)})",
    )
    out: list[RenderableType] = [head]
    if f.why:
        out.append(Text("   " + P.safe_line(f.why)))
    if line := P.finding_modules_line(f):
        out.append(Text("   " + line, style="cyan"))
    out += [Text(f"   fix: {line}", style="green") for line in P.fix_lines(f.fix)]
    return out
