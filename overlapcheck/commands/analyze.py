"""`overlapcheck analyze PATH...`: measure overlap per rank, step and collective; diagnose; render."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import click

from overlapcheck.commands.once import OnceCommand
from overlapcheck.commands.paths import a_file_path, a_path, format_for
from overlapcheck.report.present import safe_path

if TYPE_CHECKING:
    from overlapcheck.selection import Numbers

FORMATS = click.Choice(["text", "json", "markdown", "html"])  # as `compare --format`
SCHEDULER = click.option(
    "--scheduler",
    metavar="ADDRESS",
    help="Analyze the ranks on the Dask cluster whose scheduler is at ADDRESS (tcp://host:8786, or a scheduler "
    "file); its workers read the traces from the shared file system (docs/scale.md; pip install "
    "'overlapcheck[dask]').",
)


def report_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """Options shared by `analyze` and `report`."""
    for option in reversed(
        [
            click.option(
                "--format",
                "fmt",
                type=FORMATS,
                help="Terminal text, the JSON report document (docs/report-schema.md), Markdown, or the HTML page "
                "(as --html writes it). Default: what -o's extension names (.json, .html, .md), else text.",
            ),
            click.option(
                "-o", "--output", metavar="FILE", callback=a_path, help="Write the report to FILE (`-` for stdout)."
            ),
            click.option(
                "--html",
                "html_path",
                metavar="FILE",
                callback=a_file_path,
                help="Also write a self-contained HTML report.",
            ),
            click.option(
                "--perfetto",
                "perfetto_path",
                metavar="FILE",
                callback=a_file_path,
                help="Also write every rank's timeline as one Chrome-trace JSON (.json, or .json.gz: gzip) for "
                "ui.perfetto.dev or chrome://tracing. `report RUN_DIR` then reads the ranks' traces.",
            ),
            click.option(
                "--steps",
                metavar="STEPS",
                callback=lambda ctx, param, value: parse_numbers(value, ":", "--steps"),
                help="Analyze only these ProfilerSteps, e.g. 5:7 (5 to 7, inclusive) or 5,6: every number of the "
                "report covers only the GPU work those steps issued (docs/metrics.md).",
            ),
            click.option(
                "--ranks",
                metavar="RANKS",
                callback=lambda ctx, param, value: parse_numbers(value, "-", "--ranks"),
                help="Analyze only these ranks, e.g. 0-3,8: other ranks' files are not read.",
            ),
            click.option(
                "--rank-from",
                metavar="REGEX",
                help="Read each trace's rank from its file name (else its path) instead of distributedInfo: the "
                r"first group of REGEX, e.g. 'node\d+-gpu(\d+)' or 'worker_(\d+)'.",
            ),
            click.option(
                "--ds-config", metavar="FILE", callback=a_file_path, help="The DeepSpeed config the job used."
            ),
            click.option(
                "--network",
                metavar="LINKSxRATE",
                help="Each node's inter-node network, e.g. 4x200Gbps, 400Gbps, 8x25GB/s: inter-node busbw is "
                "compared with its per-GPU share (docs/metrics.md).",
            ),
            click.option(
                "-j", "--jobs", type=click.IntRange(1), help="Ranks analyzed in parallel (default: all cores)."
            ),
            click.option("--force", is_flag=True, help="Overwrite existing output files."),
            SCHEDULER,
        ]
    ):
        func = option(func)
    return func


@click.command("analyze", cls=OnceCommand)
@click.argument("paths", nargs=-1, required=True, type=click.Path(), callback=a_path)
@report_options
def command(paths: tuple[str, ...], **options: Any) -> None:
    """Measure how much communication overlaps compute in per-rank Kineto traces.

    PATHS are trace files (.json, .json.gz) or folders of per-rank traces (or `overlapcheck run` folders).
    Exit code 0 when every input was read, 2 when an input could not be read (the others are still reported).

    \b
    Examples:
      overlapcheck analyze traces/
      overlapcheck analyze traces/ --ds-config ds.json --html report.html
      overlapcheck analyze traces/ --format json -o report.json --steps 5:7 --ranks 0-7
      overlapcheck analyze traces/ --rank-from 'gpu([0-9]+)' --network 4x200Gbps
    """
    run_report(list(paths), **options)


def run_report(
    paths: list[str],
    fmt: str | None,
    output: str | None,
    html_path: str | None,
    ds_config: str | None,
    jobs: int | None,
    force: bool,
    perfetto_path: str | None = None,
    steps: Numbers | None = None,
    ranks: Numbers | None = None,
    network: str | None = None,
    rank_from: str | None = None,
    scheduler: str | None = None,
) -> None:
    """Analyze, render, and exit 2 if any input was unreadable."""
    from overlapcheck import pipeline
    from overlapcheck.fsutil import atomic_write
    from overlapcheck.job import parse_network
    from overlapcheck.report import renderer

    fmt = format_for(fmt, output)
    output = None if output == "-" else output
    targets = [t for t in (output, html_path, perfetto_path) if t]
    inputs = pipeline.find_inputs(paths)
    # fail before a long analysis, not after; an output is never one of the files read, even with --force
    check_outputs(targets, force, [*inputs.files, *([ds_config] if ds_config else [])])
    stated = parse_network(network) if network is not None else None
    config = pipeline.read_ds_config(ds_config) if ds_config else None
    job = pipeline.job_context(inputs, config, stated)
    options = pipeline.Options(
        timelines=bool(html_path or perfetto_path or fmt == "html"),
        steps=steps,
        ranks=ranks,
        prefer_traces=bool(perfetto_path),
        config_given=config is not None,
        rank_from=rank_from,
    )
    if perfetto_path and any(s.trace is not None for s in inputs.summaries):
        click.echo("--perfetto: reading the ranks' traces (summaries carry no events)", err=True)
    report = _with_progress(inputs, job, options, jobs, scheduler)
    timeline = (
        _perfetto(report, perfetto_path, bool(inputs.summaries)) if perfetto_path else None
    )  # before any output is written
    if output:
        atomic_write(output, _text(renderer(fmt), report), force)
    elif fmt == "text":
        from overlapcheck.report.terminal import TerminalRenderer, stdout_console

        shown = TerminalRenderer(errors=False).renderables(report)  # each error goes to stderr, once (below)
        if shown:  # nothing read: the errors alone, no empty line on stdout
            stdout_console(shown).print(*shown)
    else:
        sys.stdout.writelines(_text(renderer(fmt), report))
    if perfetto_path and timeline is not None:
        atomic_write(perfetto_path, timeline, force)
        missing = [r.rank for r in report.ranks if r.rank not in report.timelines]
        click.echo(f"Perfetto trace: {safe_path(perfetto_path)} (open it in https://ui.perfetto.dev)", err=True)
        if missing:
            from overlapcheck.report.present import rank_ranges

            click.echo(
                f"--perfetto: no events for rank(s) {rank_ranges(missing)} (a summary without a trace)", err=True
            )
    if html_path:
        import os

        from overlapcheck.report.html import HtmlRenderer

        link = (
            os.path.relpath(os.path.abspath(perfetto_path), os.path.dirname(os.path.abspath(html_path)))
            if perfetto_path
            else None
        )
        atomic_write(html_path, HtmlRenderer(perfetto=link).render(report), force)
        click.echo(f"HTML report: {safe_path(html_path)}", err=True)
    if report.errors:
        from overlapcheck.report.present import safe_line

        said: set[str] = set()
        for err in report.errors:
            # one error that names every file it is of ("rank 0 is claimed by several files (a, b)") is said once
            reason = err.error.removeprefix(f"{err.source}: ")
            if reason not in said or err.source not in reason:
                said.add(reason)
                click.echo(f"overlapcheck: error: {safe_line(err.error)}", err=True)
        sys.exit(2)


def _perfetto(report: Any, path: str, summaries: bool) -> str | bytes | None:
    """The Perfetto file's content, or the UserError that says, in the CLI's words, why there is none; None when
    no input could be read (the errors say why). `summaries`: some ranks were read from summaries."""
    from overlapcheck.errors import UserError
    from overlapcheck.report.perfetto import PerfettoRenderer

    if not report.ranks and report.errors:
        return None
    if report.ranks and not report.timelines:
        why = (
            "each was read from a summary without its trace"
            if summaries
            else "the traces hold no activity to draw (no GPU kernel or memcpy, and no CPU-side collective)"
        )
        raise UserError(f"--perfetto: no rank has events to export: {why}")
    return PerfettoRenderer.for_path(path).render(report)


def _text(render: Any, report: Any) -> Any:
    """The report's text: as a stream of pieces when the renderer writes one (JSON: docs/scale.md)."""
    stream = getattr(render, "stream", None)
    return stream(report) if stream is not None else str(render.render(report))


def parse_numbers(text: str | None, dash: str, option: str) -> Numbers | None:
    """'5:7' or '5,6' (--steps, dash ':'), '0-3,8' (--ranks, dash '-'): the numbers, ranges inclusive, held as
    ranges (overlapcheck/selection.py), so that no selection, however wide, is expanded in memory."""
    from overlapcheck.errors import UserError
    from overlapcheck.selection import parse_numbers as parse

    if text is None:
        return None
    try:
        return parse(text, dash, option)
    except UserError as exc:
        raise click.BadParameter(str(exc).split(": ", 1)[-1], param_hint=option) from None


def check_outputs(targets: list[str], force: bool, inputs: list[str] | None = None) -> None:
    """Each output may be written (UserError otherwise); no two outputs are the same file, and no output is
    one of the `inputs` (even with --force: writing a report over its trace or baseline loses it). `inputs` are
    files, or folders, which stand for every file that reading them reads (traces, summaries, run.json,
    ds_config.json, model.json). The same file is recognized through symbolic and hard links."""
    from overlapcheck.errors import UserError
    from overlapcheck.fsutil import check_target

    seen: dict[object, str] = {}
    for path in input_files(inputs or []):
        for key in _identities(path):
            seen[key] = "an input"
    for target in targets:
        keys = _identities(target)
        if clash := next((seen[k] for k in keys if k in seen), None):
            raise UserError(f"is also {clash}: give each output its own file", target)
        if (named := _documents_name(target)) is not None:
            raise UserError(
                f"is named as {named}, which reading its folder would take it for: choose another name", target
            )
        check_target(target, force)
        for key in keys:
            seen[key] = "another output"


def _documents_name(path: str) -> str | None:
    """What reading a folder takes a file of this name for ("a job's run.json", "rank 2's summary"), if any: an
    output so named, even a new one, would be read back as it (`report RUN` then failed on a 16-rank summary)."""
    import os

    from overlapcheck.fsutil import PROTECTED_NAMES
    from overlapcheck.pipeline import SUMMARY_NAME

    name = os.path.basename(path)
    if name in PROTECTED_NAMES:
        return f"a job's {name}"
    if m := SUMMARY_NAME.match(name):
        return f"rank {int(m.group(1))}'s summary"
    return None


def check_appendable(path: str, what: str, inputs: list[str], outputs: Sequence[str] = ()) -> None:
    """UserError unless `path` (`what` names it: "$GITHUB_STEP_SUMMARY") may be appended to: a regular file or
    none yet (a FIFO would block the append forever), none of the `inputs` (appending to the report it checks
    made that report invalid JSON) or `outputs` (a `--junit` file replaced by the XML, then appended to), and no
    job's input (a trace, a ds_config.json: `check_target`)."""
    import os

    from overlapcheck.errors import UserError
    from overlapcheck.fsutil import check_target, not_a_file

    if os.path.realpath(path) == os.devnull:
        return  # the way to say "nowhere"
    if (kind := not_a_file(path)) is not None:
        raise UserError(f"{what} is {kind}, not a file to append to", path)
    keys = set(_identities(path))
    if any(keys & set(_identities(p)) for p in input_files(inputs)):
        raise UserError(f"{what} is also an input of this command: it is never appended to", path)
    if any(keys & set(_identities(p)) for p in outputs):
        raise UserError(f"{what} is also an output of this command: give each its own file", path)
    if os.path.exists(path):
        try:
            check_target(path, force=True)  # a trace or a job's document is never written to
        except UserError as exc:
            raise UserError(f"{what} {str(exc).removeprefix(path + ': ')}", path) from None


def input_files(paths: list[str]) -> list[str]:
    """The files that reading `paths` reads: a file itself, a folder every input file found in it."""
    import os

    from overlapcheck.errors import UserError
    from overlapcheck.pipeline import find_inputs

    out: list[str] = []
    for path in paths:
        if os.path.isdir(path):
            try:
                out += find_inputs([path]).files
            except UserError:
                continue  # reading it reports the problem, after the outputs were checked
        out.append(path)
    return out


def _identities(path: str) -> list[object]:
    """What names the file `path` is (or would be): its real path and, when it exists, its device and inode."""
    import os

    keys: list[object] = [os.path.realpath(path)]
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return keys
    keys.append((st.st_dev, st.st_ino))
    return keys


def _with_progress(inputs: Any, job: Any, options: Any, jobs: int | None, scheduler: str | None = None) -> Any:
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn, TransferSpeedColumn

    from overlapcheck.pipeline import analyze_inputs
    from overlapcheck.report.terminal import console_environ

    console = Console(stderr=True, _environ=console_environ())
    if not console.is_terminal or inputs.count == 0:
        return analyze_inputs(inputs, job, options, jobs, scheduler=scheduler)
    columns = (
        TextColumn(f"reading {inputs.count} file(s)"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("read", total=inputs.total_bytes)
        advance = lambda n: progress.advance(task, n)  # noqa: E731
        return analyze_inputs(inputs, job, options, jobs, on_bytes=advance, scheduler=scheduler)
