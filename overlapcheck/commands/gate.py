"""`overlapcheck gate`: fail a CI build when communication becomes less hidden (exit 0 pass, 1 fail, 2 bad input)."""

from __future__ import annotations

import os

import click

from overlapcheck.commands.once import OnceCommand
from overlapcheck.commands.paths import a_file_path
from overlapcheck.errors import UserError
from overlapcheck.gate import (
    ACROSS,
    GateConfig,
    append_step_summary,
    exit_code,
    load_report,
    parse_fraction,
    parse_min_overlap,
    parse_regressions,
    parse_us,
    render_table,
    run_checks,
    verdict_line,
)


@click.command("gate", cls=OnceCommand)
@click.argument("report_path", metavar="REPORT.json", callback=a_file_path)
@click.option(
    "--baseline",
    "baseline_path",
    metavar="BASE.json",
    callback=a_file_path,
    help="Compare with this report (see `overlapcheck baseline save`).",
)
@click.option(
    "--min-overlap",
    multiple=True,
    metavar="KIND=FRACTION",
    help="Require collectives.KIND.overlap >= FRACTION (0.8 or 80%); repeatable. KIND: all, "
    "reduce_scatter, all_gather, all_reduce, ...",
)
@click.option("--max-exposed-share", metavar="FRACTION", help="Require exposed communication / step time <= FRACTION.")
@click.option(
    "--max-exposed-regression",
    multiple=True,
    metavar="[KIND=]PERCENT",
    help="Allowed growth of exposed communication per step over the baseline (default 10% for all and "
    "every collective kind of the baseline when --baseline is given); repeatable.",
)
@click.option(
    "--max-overlap-drop",
    multiple=True,
    metavar="[KIND=]POINTS",
    help="Allowed fall of the overlap below the baseline's, in percentage points (5% or 0.05; "
    "default 5% for all and every collective kind of the baseline when --baseline is given); repeatable.",
)
@click.option(
    "--ignore-below-us",
    default="100",
    show_default=True,
    metavar="US",
    help="Never fail a regression smaller than this many µs per step (noise floor).",
)
@click.option(
    "--across",
    type=click.Choice(ACROSS),
    default=None,
    help="Reduce ranks to their worst or their median rank for every check (default: worst rank "
    "for thresholds, median rank for baseline comparisons).",
)
@click.option(
    "--junit", "junit_path", metavar="FILE", callback=a_file_path, help="Write JUnit XML, one test case per check."
)
@click.option("--markdown", "markdown_path", metavar="FILE", callback=a_file_path, help="Write a Markdown summary.")
@click.option("--force", is_flag=True, help="Overwrite existing --junit / --markdown files.")
@click.pass_context
def command(
    ctx: click.Context,
    report_path: str,
    baseline_path: str | None,
    min_overlap: tuple[str, ...],
    max_exposed_share: str | None,
    max_exposed_regression: tuple[str, ...],
    max_overlap_drop: tuple[str, ...],
    ignore_below_us: str,
    across: str | None,
    junit_path: str | None,
    markdown_path: str | None,
    force: bool,
) -> None:
    """Check REPORT.json (from `analyze --format json`) against thresholds and a baseline.

    \b
    Examples:
      overlapcheck analyze traces/ --format json -o report.json
      overlapcheck gate report.json --min-overlap all=80% --max-exposed-share 0.1
      overlapcheck gate report.json --baseline base.json --junit gate.xml
    """
    from overlapcheck.commands.analyze import check_appendable, check_outputs
    from overlapcheck.fsutil import atomic_write, same_file
    from overlapcheck.report.junit import render_junit
    from overlapcheck.report.markdown import render_gate_markdown
    from overlapcheck.report.terminal import stdout_console

    config = GateConfig(
        min_overlap=parse_min_overlap(min_overlap),
        max_exposed_share=(
            parse_fraction(max_exposed_share, "--max-exposed-share") if max_exposed_share is not None else None
        ),
        max_exposed_regression=parse_regressions(max_exposed_regression),
        max_overlap_drop=parse_regressions(max_overlap_drop, "--max-overlap-drop", allow_over_one=False),
        ignore_below_us=parse_us(ignore_below_us, "--ignore-below-us"),
        across=across,
    )
    if (config.max_exposed_regression or config.max_overlap_drop) and not baseline_path:
        raise UserError("--max-exposed-regression and --max-overlap-drop need --baseline BASE.json")
    if not (config.min_overlap or config.max_exposed_share is not None or baseline_path):
        raise UserError("nothing to check: give --baseline, --min-overlap or --max-exposed-share")
    if baseline_path and same_file(report_path, baseline_path):
        raise UserError(
            "is the report itself: a report compared with itself always passes; give the baseline saved "
            "from an earlier run (`overlapcheck baseline save`)",
            baseline_path,
        )
    outputs = [p for p in (junit_path, markdown_path) if p]
    inputs = [p for p in (report_path, baseline_path) if p]
    check_outputs(outputs, force, inputs=inputs)
    if summary := os.environ.get("GITHUB_STEP_SUMMARY"):
        check_appendable(summary, "$GITHUB_STEP_SUMMARY", inputs, outputs)
    report = load_report(report_path)
    baseline = load_report(baseline_path) if baseline_path else None
    checks = run_checks(report, config, baseline)

    table = render_table(checks)
    console = stdout_console([table], highlight=False)
    console.print(table)
    code = exit_code(checks)
    console.print(verdict_line(checks), style="bold green" if code == 0 else "bold red")

    markdown = render_gate_markdown(checks, report_path, baseline_path)
    if junit_path:
        atomic_write(junit_path, render_junit(checks), force)
    if markdown_path:
        atomic_write(markdown_path, markdown, force)
    append_step_summary(markdown)
    ctx.exit(code)
