"""`overlapcheck report RUN_DIR`: the report of an `overlapcheck run` folder (uses per-rank summaries)."""

from __future__ import annotations

from typing import Any

import click

from overlapcheck.commands.analyze import report_options, run_report
from overlapcheck.commands.once import OnceCommand
from overlapcheck.commands.paths import a_file_path


@click.command("report", cls=OnceCommand)
@click.argument("run_dir", type=click.Path(file_okay=False), callback=a_file_path)
@report_options
def command(run_dir: str, **options: Any) -> None:
    """Report on a run folder written by `overlapcheck run`.

    Reads each rank's small summary when present and its trace otherwise, so a report over
    thousands of ranks reads thousands of small files, not thousands of traces.

    \b
    Examples:
      overlapcheck report runs/a
      overlapcheck report runs/a --html a.html --perfetto a.json.gz
    """
    run_report([run_dir], **options)
