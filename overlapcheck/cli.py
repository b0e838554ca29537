"""Command-line entry point: one click group, one small module per subcommand in `overlapcheck.commands`."""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from typing import Any, NoReturn

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

    def main(self, *args: Any, **kwargs: Any) -> Any:
        _open_standard_fds()
        _tolerant_streams()
        out = sys.stdout = _PipeSafe(sys.stdout, "standard output")
        sys.stderr = _PipeSafe(sys.stderr, "standard error")
        try:
            result = super().main(*args, **kwargs)
        except SystemExit:
            _check_written(out)
            raise
        _check_written(out)
        return result

    def make_context(self, info_name: str | None, args: list[str], parent: click.Context | None = None, **extra):
        try:
            return super().make_context(info_name, args, parent, **extra)
        except click.UsageError as exc:
            _usage_error(exc)

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except UserError as exc:
            from overlapcheck.report.present import safe_line

            click.echo(f"overlapcheck: error: {safe_line(exc)}", err=True)
            sys.exit(2)
        except click.UsageError as exc:
            _usage_error(exc)


def _tolerant_streams() -> None:
    """stdout and stderr write what their encoding cannot hold as escapes (`\u2265`), never raise: an ASCII or
    Latin-1 locale (`LANG=C`, `PYTHONIOENCODING=ascii`) made the gate's '≥' a traceback and exit code 1, which
    CI cannot tell from a failed gate."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None and (getattr(stream, "encoding", None) or "").lower().replace("-", "") != "utf8":
            with contextlib.suppress(ValueError, OSError):  # a stream that cannot change is left as it is
                reconfigure(errors="backslashreplace")


def _open_standard_fds() -> None:
    """A standard file descriptor the caller closed (`>&-`) is opened on /dev/null, so that no file the command
    opens takes its number (a job's output, or a print, would land in a report being written)."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            with contextlib.suppress(OSError):
                opened = os.open(os.devnull, os.O_RDWR)
                if opened != fd:  # a lower descriptor was free too: it is opened in its own turn
                    os.dup2(opened, fd)
                    os.close(opened)


class _PipeSafe:
    """stdout or stderr that no failure of the file behind it stops. A closed reader (`gate report.json | head
    -1`) is no failure: the rest goes to /dev/null, the command's files (--junit, --html) are still written and its
    exit code is its own (click made it 1, which CI cannot tell from a failed gate). Any other failure (a full disk,
    an I/O error, a stream closed before the command began) is remembered, and `_check_written` ends the command
    with one line and exit code 2 once its files are written."""

    def __init__(self, stream: Any, name: str) -> None:
        self._name = name
        self.failure: str | None = None
        if stream is None:  # Python found the descriptor closed: it is /dev/null now
            stream = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115 - lives as long as the process
            self._closed = True
        else:
            self._closed = False
        self._stream = stream

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)

    def write(self, text: str) -> int:
        if self._closed and text and self.failure is None:
            self.failure = f"{self._name} is closed: nothing written to it"
        try:
            return int(self._stream.write(text))
        except OSError as exc:
            self._failed(exc)
            return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as exc:
            self._failed(exc)

    def _failed(self, exc: OSError) -> None:
        if not isinstance(exc, BrokenPipeError) and self.failure is None:
            self.failure = f"cannot write to {self._name}: {exc.strerror or exc}"
        self._to_null()

    def _to_null(self) -> None:
        """Point the stream's file descriptor at /dev/null, so that what is buffered, and the interpreter's flush
        at exit, succeed without a word."""
        with contextlib.suppress(OSError, ValueError, AttributeError):
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, self._stream.fileno())
            os.close(null)


def _check_written(out: _PipeSafe) -> None:
    """What the command wrote to stdout is flushed; if it could not be written, one line and exit code 2."""
    out.flush()
    if out.failure is not None:
        click.echo(f"overlapcheck: error: {out.failure}", err=True)
        sys.exit(2)


def _usage_error(exc: click.UsageError) -> NoReturn:
    """A command line click cannot parse: one line on stderr naming the help to read, and exit code 2."""
    from overlapcheck.report.present import safe_line

    names, ctx = [], exc.ctx
    while ctx is not None and ctx.parent is not None:
        names.append(ctx.info_name or "")
        ctx = ctx.parent
    where = " ".join(["overlapcheck", *reversed(names)])
    click.echo(f"overlapcheck: error: {safe_line(exc.format_message())} (see '{where} --help')", err=True)
    sys.exit(2)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="overlapcheck")
def main() -> None:
    """Does your DeepSpeed ZeRO-3 job hide its communication behind compute? If not, why?"""
