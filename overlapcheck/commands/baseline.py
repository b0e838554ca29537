"""`overlapcheck baseline save`: keep a report as the baseline that `overlapcheck gate --baseline` compares with."""

from __future__ import annotations

import click


@click.group("baseline")
def command() -> None:
    """Manage gate baselines."""


@command.command("save")
@click.argument("report_path", metavar="REPORT.json")
@click.argument("baseline_path", metavar="BASE.json")
@click.option("--force", is_flag=True, help="Overwrite BASE.json if it exists.")
def save(report_path: str, baseline_path: str, force: bool) -> None:
    """Validate REPORT.json and save it as BASE.json (refuses to overwrite without --force)."""
    from overlapcheck.fsutil import atomic_write
    from overlapcheck.report.gate import fmt_pct, load_report, rank_overlap, reduce_ranks

    report = load_report(report_path)
    with open(report_path, encoding="utf-8") as fh:
        text = fh.read()
    atomic_write(baseline_path, text, force)
    median = reduce_ranks(report, lambda r: rank_overlap(r, "all"), "median", higher_is_worse=False)
    click.echo(
        f"saved baseline {baseline_path}: {len(report['ranks'])} ranks, overlap (median) {fmt_pct(median.value)}"
    )
