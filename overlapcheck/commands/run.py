"""`overlapcheck run`: profile an unmodified training job on every rank (docs/capture.md)."""

from __future__ import annotations

import sys
from typing import Any

import click

from overlapcheck.capture.settings import CaptureSettings, Schedule, parse_ranks
from overlapcheck.commands.once import OnceCommand
from overlapcheck.commands.paths import a_file_path
from overlapcheck.errors import UserError

_COMMAND = "overlapcheck.run.command"  # ctx.meta key: the words after `--`


class _RunCommand(OnceCommand):
    """`overlapcheck run [OPTIONS] -- COMMAND...`: everything before `--` is parsed strictly as our options (a
    mistyped one is an error, with click's suggestion), and the job's command starts only after `--`."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        takes_value = {
            opt
            for param in self.params
            if isinstance(param, click.Option) and not param.is_flag
            for opt in (*param.opts, *param.secondary_opts)
        }
        i = 0
        first_word = None  # the first word that is neither an option of ours nor its value
        while i < len(args) and args[i] != "--":
            if first_word is None and not args[i].startswith("-"):
                first_word = i
            i += 2 if args[i] in takes_value else 1  # `--out --` names a folder, it does not end the options
        if i == len(args) and first_word is not None:  # `run deepspeed train.py --deepspeed ds.json`: no `--`
            job = " ".join(args[first_word:])
            raise click.UsageError(
                f"put `--` before the command to run: overlapcheck run {' '.join(args[:first_word])} -- "
                f"{job if len(job) <= 80 else job[:77] + '...'}".replace("run  --", "run --"),
                ctx,
            )
        ctx.meta[_COMMAND] = args[i + 1 :] if i < len(args) else None
        return super().parse_args(ctx, args[:i])


MAX_SUMMARY_TIMEOUT = 7 * 86400.0  # a week: beyond it (inf) the launcher would never give up on a stuck summary


@click.command(
    cls=_RunCommand,
    context_settings={"allow_extra_args": True},
    options_metavar="[OPTIONS] -- COMMAND [ARGS]...",
)
@click.option(
    "--out", "out", default=None, callback=a_file_path, help="Run folder (default: overlapcheck-run-<timestamp>)."
)
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
@click.option(
    "--with-modules",
    is_flag=True,
    help="Record module frames (torch.profiler with_stack and with_modules): per-module attribution without "
    "DeepSpeed's hooks, and of the forward pass's module hierarchy (bigger traces).",
)
@click.option("--ranks", default="all", help="Ranks to profile: all, or a list like 0,3,8-15.")
@click.option("--force", is_flag=True, help="Replace the run files in an existing run folder.")
@click.option(
    "--summary-timeout",
    type=float,
    default=120.0,
    show_default=True,
    help="Seconds to wait for the per-rank summaries after the job ends.",
)
@click.pass_context
def command(
    ctx: click.Context,
    out: str | None,
    wait: int | None,
    warmup: int | None,
    active: int | None,
    steps: str | None,
    with_stack: bool,
    with_modules: bool,
    ranks: str,
    force: bool,
    summary_timeout: float,
) -> None:
    """Run COMMAND (deepspeed, torchrun, srun or python ...) and profile every rank.

    Example: overlapcheck run --steps 10:12 -- deepspeed --num_gpus 8 train.py --deepspeed ds.json
    """
    from overlapcheck.capture import session, supervisor

    argv = _command_words(ctx)
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
    if not ranks.strip():  # an empty --ranks "$RANKS" profiled every rank: say so instead
        raise UserError("--ranks is empty: give 'all' or a list like 0,2,8-15")
    parse_ranks(ranks)  # validate early
    if not 0 <= summary_timeout <= MAX_SUMMARY_TIMEOUT:  # NaN too: a NaN deadline is never reached (a hang)
        raise click.BadParameter(
            f"{summary_timeout!r} is not a number of seconds from 0 to {MAX_SUMMARY_TIMEOUT:.0f}",
            param_hint="--summary-timeout",
        )
    settings = CaptureSettings(
        out=out or session.default_out(),
        schedule=schedule,
        with_stack=with_stack or with_modules,
        ranks=ranks,
        with_modules=with_modules,
    )
    code = session.run(argv, settings, force=force, out_given=out is not None, summary_timeout=summary_timeout)
    sys.exit(supervisor.exit_like(code))


def _command_words(ctx: click.Context) -> list[str]:
    """The job's command: the words after `--`. Words before it that are not our options are refused."""
    words: Any = ctx.meta.get(_COMMAND)
    if ctx.args:
        raise click.UsageError(
            f"unexpected {' '.join(ctx.args)!r} before `--`: the command to run goes after it, as in "
            "overlapcheck run [OPTIONS] -- deepspeed train.py ...",
            ctx,
        )
    if not words:
        raise click.UsageError("no command given: overlapcheck run [OPTIONS] -- <your launch command>", ctx)
    return list(words)
