"""Options that take one value are given once: click keeps the last of repeated ones without a word, so a CI line
that appends a looser `--max-exposed-share 0.9` after the project's strict 0.1, or `--ranks 0 --ranks 1`, changed
the result silently. Every subcommand is an `OnceCommand`; a repeat is one usage line, exit code 2."""

from __future__ import annotations

from collections import Counter

import click


class OnceCommand(click.Command):
    """A click command that refuses a single-value option given more than once (flags may repeat)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        repeated = _repeated(self, ctx, args)
        if repeated is not None:
            shown = "/".join(repeated.opts)
            raise click.UsageError(f"{shown} is given more than once: give it once (only one value is used)", ctx)
        return super().parse_args(ctx, args)


def _repeated(command: click.Command, ctx: click.Context, args: list[str]) -> click.Option | None:
    """The first single-value option that `args` give more than once, if any."""
    try:
        _, _, order = command.make_parser(ctx).parse_args(args=list(args))
    except click.UsageError:
        return None  # the real parse says what is wrong
    counts = Counter(id(p) for p in order)
    for param in order:
        if (
            isinstance(param, click.Option)
            and not (param.multiple or param.is_flag or param.count)
            and counts[id(param)] > 1
        ):
            return param
    return None
