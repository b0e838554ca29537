"""`overlapcheck analyze PATH...`: measure overlap per rank, step and collective; diagnose; render."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import click

FORMATS = click.Choice(["text", "json", "markdown"])


def report_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """Options shared by `analyze` and `report`."""
    for option in reversed(
        [
            click.option(
                "--format",
                "fmt",
                type=FORMATS,
                default="text",
                show_default=True,
                help="Terminal text, the JSON report document (docs/report-schema.md), or Markdown.",
            ),
            click.option("-o", "--output", type=click.Path(dir_okay=False), help="Write the report to FILE."),
            click.option(
                "--html", "html_path", type=click.Path(dir_okay=False), help="Also write a self-contained HTML report."
            ),
            click.option("--ds-config", type=click.Path(dir_okay=False), help="The DeepSpeed config the job used."),
            click.option(
                "-j", "--jobs", type=click.IntRange(1), help="Ranks analyzed in parallel (default: all cores)."
            ),
            click.option("--force", is_flag=True, help="Overwrite existing output files."),
        ]
    ):
        func = option(func)
    return func


@click.command("analyze")
@click.argument("paths", nargs=-1, required=True, type=click.Path())
@report_options
def command(paths: tuple[str, ...], **options: Any) -> None:
    """Measure how much communication overlaps compute in per-rank Kineto traces.

    PATHS are trace files (.json, .json.gz) or folders of per-rank traces (or `overlapcheck run` folders).
    Exit code 0 when every input was read, 2 when an input could not be read (the others are still reported).
    """
    run_report(list(paths), **options)


def run_report(
    paths: list[str],
    fmt: str,
    output: str | None,
    html_path: str | None,
    ds_config: str | None,
    jobs: int | None,
    force: bool,
) -> None:
    """Analyze, render, and exit 2 if any input was unreadable."""
    from overlapcheck import pipeline
    from overlapcheck.fsutil import atomic_write
    from overlapcheck.report import renderer

    targets = [t for t in (output, html_path) if t]
    check_outputs(targets, force)  # fail before a long analysis, not after
    config = pipeline.read_ds_config(ds_config) if ds_config else None
    inputs = pipeline.find_inputs(paths)
    job = pipeline.job_context(inputs, config)
    report = _with_progress(inputs, job, pipeline.Options(timelines=bool(html_path)), jobs)
    if output:
        atomic_write(output, renderer(fmt).render(report), force)
    elif fmt == "text":
        from rich.console import Console

        from overlapcheck.report.terminal import TerminalRenderer

        Console().print(*TerminalRenderer().renderables(report))
    else:
        sys.stdout.write(str(renderer(fmt).render(report)))
    if html_path:
        atomic_write(html_path, renderer("html").render(report), force)
        click.echo(f"HTML report: {html_path}", err=True)
    if report.errors:
        from overlapcheck.report.present import safe_line

        for err in report.errors:
            click.echo(f"overlapcheck: error: {safe_line(err.error)}", err=True)
        sys.exit(2)


def check_outputs(targets: list[str], force: bool, inputs: list[str] | None = None) -> None:
    """Each output may be written (UserError otherwise); no two outputs are the same file, and no output is
    one of the `inputs` (even with --force: writing a report over its baseline loses the baseline)."""
    import os

    from overlapcheck.errors import UserError
    from overlapcheck.fsutil import check_target

    seen: dict[str, str] = {}
    for path in inputs or []:
        seen[os.path.realpath(path)] = "an input"
    for target in targets:
        key = os.path.realpath(target)
        if key in seen:
            raise UserError(f"is also {seen[key]}: give each output its own file", target)
        check_target(target, force)
        seen[key] = "another output"


def _with_progress(inputs: Any, job: Any, options: Any, jobs: int | None) -> Any:
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn, TransferSpeedColumn

    from overlapcheck.pipeline import analyze_inputs

    console = Console(stderr=True)
    if not console.is_terminal or inputs.count == 0:
        return analyze_inputs(inputs, job, options, jobs)
    columns = (
        TextColumn(f"reading {inputs.count} file(s)"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("read", total=inputs.total_bytes)
        return analyze_inputs(inputs, job, options, jobs, on_bytes=lambda n: progress.advance(task, n))
