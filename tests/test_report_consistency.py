"""The terminal, Markdown and HTML reports show the same per-step numbers, with the same labels and units, in the
same order (lowest overlap first), for real sample sets; each number is recomputed here from the JSON document
(docs/metrics.md), not from the renderers' shared helpers."""

from __future__ import annotations

import statistics
from html.parser import HTMLParser
from pathlib import Path

import pytest

from overlapcheck.pipeline import analyze
from overlapcheck.report.html import HtmlRenderer
from overlapcheck.report.markdown import MarkdownRenderer
from overlapcheck.report.terminal import TerminalRenderer

ROOT = Path(__file__).resolve().parents[1]
SETS = [
    ROOT / "sample_traces" / "same-communicator",
    ROOT / "sample_traces" / "straggler",
    ROOT / "tests" / "data" / "gloo-2rank",
]


class Tables(HTMLParser):
    """The header and body cells (visible text) of every <table id=...> of a page."""

    def __init__(self, html: str):
        super().__init__(convert_charrefs=True)
        self.tables: dict[str, dict[str, list]] = {}
        self._table: str | None = None
        self._row: list[str] | None = None
        self._cell: list[str] | None = None
        self._head = False
        self.texts: list[str] = []  # <text> elements of the SVGs
        self._text: list[str] | None = None
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "table":
            self._table = a.get("id") or f"table{len(self.tables)}"
            self.tables[self._table] = {"head": [], "rows": []}
        elif tag == "thead":
            self._head = True
        elif tag == "tr" and self._table:
            self._row = []
        elif tag in ("td", "th") and self._row is not None:
            self._cell = []
        elif tag == "text":
            self._text = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None and self._row is not None:
            self._row.append(" ".join("".join(self._cell).split()))
            self._cell = None
        elif tag == "tr" and self._row is not None and self._table:
            self.tables[self._table]["head" if self._head else "rows"].append(self._row)
            self._row = None
        elif tag == "thead":
            self._head = False
        elif tag == "table":
            self._table = None
        elif tag == "text" and self._text is not None:
            self.texts.append("".join(self._text))
            self._text = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)
        if self._text is not None:
            self._text.append(data)


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def _ms(us: float) -> str:
    return f"{us / 1000:.2f}"


def expected_rows(doc: dict) -> list[tuple[int, dict[str, str]]]:
    """Per rank, lowest overlap first: overlap, exposed ms/step (mean over the steps), exposed % of step, step
    ms/step (the mean period), idle ms total, from the JSON document."""
    out = []
    for r in doc["ranks"]:
        steps = r["steps"]
        exposed = statistics.fmean(s["collectives"]["all"]["exposed_us"] for s in steps)
        period = sum(s["period_us"] for s in steps) / len(steps)
        assert period == pytest.approx(r["step_time_us"] / len(steps))
        cells = {
            "overlap": _pct(r["collectives"]["all"]["overlap"]),
            "exposed ms/step": _ms(exposed),
            "exposed % of step": _pct(r["exposed_share"]),
            "step ms/step": _ms(period),
            "idle ms total": _ms(r["idle_us"]),
        }
        out.append((r["collectives"]["all"]["overlap"], r["rank"], cells))
    out.sort(key=lambda t: (t[0], t[1]))
    return [(rank, cells) for _, rank, cells in out]


COLUMNS = ("overlap", "exposed ms/step", "exposed % of step", "step ms/step", "idle ms total")


@pytest.mark.parametrize("folder", SETS, ids=[p.name for p in SETS])
def test_terminal_markdown_and_html_show_the_same_per_step_numbers(folder: Path) -> None:
    report = analyze(folder, jobs=1, timelines=True)
    doc = report.to_dict()
    want = expected_rows(doc)
    kinds = [
        k
        for k in ("reduce_scatter", "all_gather", "all_reduce")
        if any(r["collectives"][k]["count"] for r in doc["ranks"])
    ]

    # terminal: every rank's row (up to 16), in order, with the columns after the per-kind overlaps
    text = TerminalRenderer(width=240).render(report)
    table = text.split("Per rank", 1)[1]
    header = next(line for line in table.splitlines() if "┃ rank" in line)
    assert [c.strip() for c in header.strip("┃ ").split("┃")][-4:] == list(COLUMNS[1:])
    term_rows = []
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("│").split("│")]
        if len(cells) == 2 + len(kinds) + 4 and cells[0].isdigit():
            term_rows.append((int(cells[0]), dict(zip(COLUMNS, [cells[1], *cells[-4:]], strict=True))))
    assert term_rows == want

    # Markdown: the 5 lowest-overlap ranks (for more than one rank), the same columns and texts
    md = MarkdownRenderer().render(report)
    assert "| rank (lowest overlap first) | " + " | ".join(COLUMNS) + " |" in md
    md_rows = []
    for line in md.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 1 + len(COLUMNS) and cells[0].isdigit():
            md_rows.append((int(cells[0]), dict(zip(COLUMNS, cells[1:], strict=True))))
    assert md_rows == want[:5]

    # HTML: the sortable rank table, every rank, the same texts under headers with the same units
    page = Tables(HtmlRenderer().render(report))
    t = page.tables["oc-rank-table"]
    (head,) = t["head"]
    for col in (
        "step ms/step",
        "compute ms/step",
        "comm ms/step",
        "exposed ms/step",
        "overlap",
        "exposed % of step",
        "idle ms total",
    ):
        assert col in head
    html_rows = []
    for row in t["rows"]:
        cell = dict(zip(head, row, strict=False))
        html_rows.append((int(cell["rank"].split()[0]), {col: cell[col] for col in COLUMNS}))
    assert html_rows == want

    # the per-collective numbers: the same texts in the three outputs
    medians = {}
    having = [r for r in doc["ranks"] if r["collectives"]["all"]["count"]]
    for kind in ("all", *kinds):
        ranks = [r for r in having if r["collectives"][kind]["count"]]
        exposed = statistics.median(
            statistics.fmean(s["collectives"][kind]["exposed_us"] for s in r["steps"]) for r in ranks
        )
        total = statistics.median(
            statistics.fmean(s["collectives"][kind]["time_us"] for s in r["steps"]) for r in ranks
        )
        overlap = doc["summary"]["metrics"][f"{kind}.overlap"]["median"]
        medians[kind] = (_pct(overlap), _ms(exposed), _ms(total))
    for kind, (overlap, exposed, total) in medians.items():
        label = {
            "all": "all",
            "reduce_scatter": "reduce-scatter",
            "all_gather": "all-gather",
            "all_reduce": "all-reduce",
        }[kind]
        term_line = next(
            line
            for line in text.splitlines()
            if line.strip("│ ").startswith(label + " ") or line.strip("│ ").startswith(label + "│")
        )
        term_cells = [c.strip() for c in term_line.strip().strip("│").split("│")]
        assert (term_cells[2], term_cells[4], term_cells[5]) == (overlap, exposed, total), kind
        assert any(
            line.startswith(f"| {label} |") and f"| {overlap} |" in line and f"| {exposed} | {total} |" in line
            for line in md.splitlines()
        ), kind
        assert f"{overlap} hidden · {exposed} exposed of {total} ms/step" in page.texts, kind
