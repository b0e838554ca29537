"""`overlapcheck analyze PATH...`: measure overlap per rank, step and collective; diagnose; render."""

from __future__ import annotations

import io
import json
import sys
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn, TransferSpeedColumn

from overlapcheck.errors import UserError

HELP_FORMATS = click.Choice(["text", "json"])


def report_options(func):
    """Options shared by `analyze` and `report`."""
    for option in reversed(
        [
            click.option(
                "--format",
                "fmt",
                type=HELP_FORMATS,
                default="text",
                show_default=True,
                help="Terminal text, or the JSON report document (docs/report-schema.md).",
            ),
            click.option("-o", "--output", type=click.Path(dir_okay=False), help="Write the text/JSON report to FILE."),
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
    from overlapcheck.analysis import Options
    from overlapcheck.fsutil import atomic_write, check_target

    for target in (output, html_path):
        if target:
            check_target(target, force)  # fail before a long analysis, not after
    options = Options(timelines=bool(html_path), config=_read_config(ds_config) if ds_config else None)
    report = _with_progress(paths, jobs, options)
    if fmt == "json":
        from overlapcheck.report.json import to_json

        text = to_json(report)
        if output:
            atomic_write(output, text, force)
        else:
            sys.stdout.write(text)
    else:
        from overlapcheck.report.terminal import render

        if output:
            console = Console(record=True, width=120, file=io.StringIO())
            render(report, console)
            atomic_write(output, console.export_text(), force)
        else:
            render(report, Console())
    if html_path:
        from overlapcheck.report.html import write_html

        write_html(report, html_path, force)
        click.echo(f"HTML report: {html_path}", err=True)
    if report["errors"]:
        for err in report["errors"]:
            click.echo(f"overlapcheck: error: {err['error']}", err=True)
        sys.exit(2)


def _read_config(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except FileNotFoundError:
        raise UserError("no such file", path) from None
    except (OSError, ValueError) as exc:
        raise UserError(f"not a readable JSON DeepSpeed config ({exc})", path) from None
    if not isinstance(config, dict):
        raise UserError("a DeepSpeed config must be a JSON object", path)
    return config


def _with_progress(paths: list[str], jobs: int | None, options) -> dict[str, Any]:
    from overlapcheck.analysis import analyze_paths
    from overlapcheck.analysis.pipeline import find_inputs, input_bytes

    inputs = find_inputs(paths)  # validates paths early, for a clean error
    count = len(inputs.traces) + len(inputs.summaries)
    console = Console(stderr=True)
    if not console.is_terminal or count == 0:
        return analyze_paths(paths, jobs=jobs, options=options)
    columns = (
        TextColumn(f"reading {count} file(s)"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("read", total=input_bytes(inputs))
        return analyze_paths(paths, jobs=jobs, options=options, on_bytes=lambda n: progress.advance(task, n))
