"""Command-line entry point: one click group, one small module per subcommand in `overlapcheck.commands`."""

from __future__ import annotations

import importlib
import sys

import click

from overlapcheck import __version__
from overlapcheck.errors import UserError

# subcommand name -> module in overlapcheck.commands that defines `command`
COMMANDS = {
    "analyze": "analyze",
    "report": "report",
    "simulate": "simulate",
    "run": "run",
    "gate": "gate",
    "baseline": "baseline",
    "compare": "compare",
}


class _Group(click.Group):
    """Loads subcommands lazily and turns UserError into one line on stderr and exit code 2."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        try:
            module = importlib.import_module(f"overlapcheck.commands.{COMMANDS[name]}")
        except ModuleNotFoundError as exc:
            if exc.name and exc.name.startswith("overlapcheck.commands."):
                return None  # subcommand not built yet
            raise
        return module.command

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except UserError as exc:
            from overlapcheck.report.present import safe_line

            click.echo(f"overlapcheck: error: {safe_line(exc)}", err=True)
            sys.exit(2)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="overlapcheck")
def main() -> None:
    """Does your DeepSpeed ZeRO-3 job hide its communication behind compute? If not, why?"""
