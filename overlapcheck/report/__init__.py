"""Renderers: each turns the Report into one output format, behind one interface (`base.Renderer`).

`renderer(name)` picks one by the name `--format` uses: `text` (rich terminal), `json` (the documented
document), `markdown` (for pull-request comments), `html` (one self-contained page); `perfetto` (a Chrome-trace
JSON of every rank's timeline, `--perfetto`). Labels, units, number formats and the verdict live in `present`,
shared by all of them and by the gate's outputs.
"""

from __future__ import annotations

import importlib

from overlapcheck.report.base import Renderer, ReportRenderer

# name -> (module, class); modules are imported on first use (jinja2 and rich only when needed)
RENDERERS = {
    "text": ("overlapcheck.report.terminal", "TerminalRenderer"),
    "json": ("overlapcheck.report.json", "JsonRenderer"),
    "markdown": ("overlapcheck.report.markdown", "MarkdownRenderer"),
    "html": ("overlapcheck.report.html", "HtmlRenderer"),
    "perfetto": ("overlapcheck.report.perfetto", "PerfettoRenderer"),
}


def renderer(name: str) -> ReportRenderer:
    """The renderer called `name` (one of RENDERERS); UserError for another name."""
    if not isinstance(name, str) or name not in RENDERERS:
        from overlapcheck.errors import UserError

        raise UserError(f"unknown renderer {name!r}: one of {', '.join(RENDERERS)}")
    module, cls = RENDERERS[name]
    instance: ReportRenderer = getattr(importlib.import_module(module), cls)()
    return instance


__all__ = ["RENDERERS", "Renderer", "ReportRenderer", "renderer"]
