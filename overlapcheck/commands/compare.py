"""`overlapcheck compare BEFORE AFTER`: what changed between two runs (exit 0; 2 on bad input)."""

from __future__ import annotations

import os
import sys

import click

from overlapcheck.commands.analyze import SCHEDULER
from overlapcheck.commands.once import OnceCommand
from overlapcheck.commands.paths import a_file_path, a_path, format_for
from overlapcheck.errors import UserError
from overlapcheck.fsutil import same_file
from overlapcheck.model import Report
from overlapcheck.report.present import safe_path

FORMATS = click.Choice(["text", "json", "markdown", "html"])


def distinct_by() -> dict[str, tuple[str, ...]]:
    """The evidence fields that tell findings of one rule apart (the diagnosis's table)."""
    from overlapcheck.diagnose.registry import RULES

    return {rule.id: rule.distinct_by for rule in RULES}


def load_side(path: str, jobs: int | None = None, scheduler: str | None = None) -> Report:
    """A folder of traces or an `overlapcheck run` folder (analyzed now), or a JSON report (validated).
    Any problem, an unreadable trace among them, is a UserError."""
    from overlapcheck import pipeline
    from overlapcheck.gate import read_report

    if os.path.isdir(path):
        report = pipeline.analyze(path, jobs=jobs, scheduler=scheduler)
        if report.errors:
            more = f" (and {len(report.errors) - 1} more unreadable inputs)" if len(report.errors) > 1 else ""
            raise UserError(f"cannot compare: {report.errors[0].error}{more}")
    elif os.path.lexists(path) and not path.lower().endswith(".json"):
        raise UserError("give a folder of traces, an `overlapcheck run` folder or a JSON report (.json)", path)
    else:
        report = read_report(path)[0]
    if not report.ranks:
        raise UserError("the report has no ranks: nothing to compare", path)
    return report


@click.command("compare", cls=OnceCommand)
@click.argument("before", metavar="BEFORE", callback=a_file_path)
@click.argument("after", metavar="AFTER", callback=a_file_path)
@click.option(
    "--format",
    "fmt",
    type=FORMATS,
    help="Terminal text, the JSON comparison (docs/compare-schema.md), Markdown (a PR comment) or HTML. Default: "
    "what -o's extension names (.json, .html, .md), else text.",
)
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False),
    callback=a_path,
    help="Write the comparison to FILE (`-` for stdout).",
)
@click.option(
    "--html",
    "html_path",
    type=click.Path(dir_okay=False),
    callback=a_file_path,
    help="Also write the side-by-side HTML page.",
)
@click.option(
    "--json", "json_path", type=click.Path(dir_okay=False), callback=a_file_path, help="Also write the JSON comparison."
)
@click.option(
    "--markdown",
    "markdown_path",
    type=click.Path(dir_okay=False),
    callback=a_file_path,
    help="Also write the Markdown.",
)
@click.option("-j", "--jobs", type=click.IntRange(1), help="Ranks analyzed in parallel (default: all cores).")
@click.option("--force", is_flag=True, help="Overwrite existing output files.")
@SCHEDULER
def command(
    before: str,
    after: str,
    fmt: str | None,
    output: str | None,
    html_path: str | None,
    json_path: str | None,
    markdown_path: str | None,
    jobs: int | None,
    force: bool,
    scheduler: str | None,
) -> None:
    """Compare two runs: per collective kind, phase and rank, the change in overlap, exposed time per step and
    step time, and the findings that appeared, disappeared or changed cost.

    BEFORE and AFTER are each a folder of per-rank traces, an `overlapcheck run` folder, or a JSON report
    (`analyze --format json`). Exit code 0; 2 on bad input.

    \b
    Examples:
      overlapcheck compare runs/before runs/after
      overlapcheck compare before.json after.json --format markdown -o pr-comment.md
    """
    from overlapcheck.commands.analyze import check_outputs
    from overlapcheck.compare import compare
    from overlapcheck.fsutil import atomic_write
    from overlapcheck.report.compare_render import compare_renderer

    fmt = format_for(fmt, output)
    output = None if output == "-" else output
    extra = [(p, name) for p, name in ((html_path, "html"), (json_path, "json"), (markdown_path, "markdown")) if p]
    outputs = [(output, fmt)] if output else []
    outputs += extra
    check_outputs([p for p, _ in outputs], force, inputs=[before, after])
    sides = load_side(before, jobs, scheduler), load_side(after, jobs, scheduler)
    comparison = compare(*sides, distinct_by(), sources=(before, after), same_input=same_file(before, after))
    for path, name in outputs:
        atomic_write(path, compare_renderer(name).render(comparison), force)
    if not output:
        if fmt == "text":
            from overlapcheck.report.compare_render import CompareTerminalRenderer
            from overlapcheck.report.terminal import stdout_console

            group = CompareTerminalRenderer().group(comparison)
            stdout_console([group], highlight=False).print(group)
        else:
            out = compare_renderer(fmt).render(comparison)
            sys.stdout.write(out if isinstance(out, str) else out.decode())
    for path, name in extra:
        click.echo(f"{name}: {safe_path(path)}", err=True)
