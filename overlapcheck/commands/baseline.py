"""`overlapcheck baseline save`: keep a report as the baseline that `overlapcheck gate --baseline` compares with."""

from __future__ import annotations

import click

from overlapcheck.commands.once import OnceCommand
from overlapcheck.commands.paths import a_file_path
from overlapcheck.report.present import safe_path


@click.group("baseline")
def command() -> None:
    """Manage gate baselines."""


@command.command("save", cls=OnceCommand)
@click.argument("report_path", metavar="REPORT.json", callback=a_file_path)
@click.argument("baseline_path", metavar="BASE.json", callback=a_file_path)
@click.option("--force", is_flag=True, help="Overwrite BASE.json if it exists.")
def save(report_path: str, baseline_path: str, force: bool) -> None:
    """Validate REPORT.json and save it as BASE.json (refuses to overwrite without --force).

    \b
    Example:
      overlapcheck baseline save report.json ci/overlap-baseline.json
    """
    from overlapcheck.commands.analyze import check_outputs
    from overlapcheck.errors import UserError
    from overlapcheck.fsutil import atomic_write
    from overlapcheck.gate import read_report, reduce_ranks
    from overlapcheck.report.present import pct

    check_outputs([baseline_path], force, inputs=[report_path])
    report, raw = read_report(report_path)
    if not report.ranks:  # every later gate would compare with nothing; gate fails such a report too
        raise UserError("the report has no ranks (nothing was measured): it cannot be a baseline", report_path)
    if report.errors:  # its ranks are a part of the job: every later gate would compare the whole job with a part
        n, first = len(report.errors), " ".join(report.errors[0].error.split())[:200]
        raise UserError(
            f"the report lists {n} unreadable input{'s' if n != 1 else ''} (first: {first}): "
            "a baseline must be whole; analyze the job again once every input reads",
            report_path,
        )
    atomic_write(baseline_path, raw, force)
    median = reduce_ranks(report, lambda r: r.overlap(), "median", higher_is_worse=False)
    shown = safe_path(baseline_path)
    click.echo(f"saved baseline {shown}: {len(report.ranks)} ranks, overlap (median) {pct(median.value)}")
