"""`overlapcheck run`: profile an unmodified training job on every rank (docs/capture.md)."""

from __future__ import annotations

import sys

import click

from overlapcheck.capture.settings import CaptureSettings, Schedule, parse_ranks
from overlapcheck.errors import UserError


@click.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--out", "out", default=None, help="Run folder (default: overlapcheck-run-<timestamp>).")
@click.option("--wait", type=int, default=None, help="Optimizer steps before the profiler starts [5].")
@click.option("--warmup", type=int, default=None, help="Profiler warm-up steps (not recorded) [2].")
@click.option("--active", type=int, default=None, help="Steps recorded [3].")
@click.option(
    "--steps",
    default=None,
    metavar="FIRST:LAST",
    help="Record steps FIRST..LAST (inclusive) instead of --wait/--warmup/--active.",
)
@click.option("--with-stack/--no-stack", default=False, help="Record Python call stacks (bigger traces).")
@click.option("--ranks", default="all", help="Ranks to profile: all, or a list like 0,3,8-15.")
@click.option("--force", is_flag=True, help="Replace the run files in an existing run folder.")
@click.option(
    "--summary-timeout",
    type=float,
    default=120.0,
    show_default=True,
    help="Seconds to wait for the per-rank summaries after the job ends.",
)
@click.argument("command", nargs=-1, type=click.UNPROCESSED, required=True)
def command(
    out: str | None,
    wait: int | None,
    warmup: int | None,
    active: int | None,
    steps: str | None,
    with_stack: bool,
    ranks: str,
    force: bool,
    summary_timeout: float,
    command: tuple[str, ...],
) -> None:
    """Run COMMAND (deepspeed, torchrun, srun or python ...) and profile every rank.

    Example: overlapcheck run --steps 10:12 -- deepspeed --num_gpus 8 train.py --deepspeed ds.json
    """
    from overlapcheck.capture import session, supervisor

    if steps is not None:
        if any(v is not None for v in (wait, warmup, active)):
            raise UserError("use either --steps or --wait/--warmup/--active, not both")
        schedule = Schedule.from_steps(steps)
    else:
        default = Schedule()
        schedule = Schedule(
            wait=default.wait if wait is None else wait,
            warmup=default.warmup if warmup is None else warmup,
            active=default.active if active is None else active,
        )
    parse_ranks(ranks)  # validate early
    argv = list(command)
    if argv and argv[0] == "--":
        argv = argv[1:]
    settings = CaptureSettings(out=out or session.default_out(), schedule=schedule, with_stack=with_stack, ranks=ranks)
    code = session.run(argv, settings, force=force, out_given=out is not None, summary_timeout=summary_timeout)
    sys.exit(supervisor.exit_like(code))
