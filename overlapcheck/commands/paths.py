"""Click callbacks for the options and arguments that name files: an empty path is refused (it would name no
file, and was read as "not given": `-o ''` printed to stdout, `--ds-config ''` was ignored, `simulate --out ''`
wrote into the current folder), and so is `-` where it does not mean stdout (`--html -` wrote a file named `-`).
Each refusal is one line (cli.py's usage error), before anything is read or written."""

from __future__ import annotations

from typing import Any

import click

STDOUT_HINT = "`-` (stdout) is only for -o/--output; give a file path"


def _check(value: Any, stdout_ok: bool) -> None:
    for item in value if isinstance(value, (tuple, list)) else [value]:
        if item is None:
            continue
        text = str(item) if not isinstance(item, str) else item
        if text.strip() == "":
            raise click.BadParameter(f"{text!r} is an empty path; give a file or folder")
        if text == "-" and not stdout_ok:
            raise click.BadParameter(STDOUT_HINT)


def a_path(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """A path that must not be empty (`-` is taken as the option takes it)."""
    _check(value, stdout_ok=True)
    return value


def a_file_path(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """A path that must not be empty, nor `-`: a file the command writes or reads by name."""
    _check(value, stdout_ok=False)
    return value


_FORMAT_OF_SUFFIX = {".json": "json", ".html": "html", ".htm": "html", ".md": "markdown", ".markdown": "markdown"}


def format_for(fmt: str | None, output: str | None) -> str:
    """The output format: `--format` when given, else what -o's extension names (`-o report.html` wrote terminal
    text into a .html file), else terminal text."""
    if fmt is not None:
        return fmt
    suffix = output.lower().rsplit(".", 1)[-1] if output and "." in output.rsplit("/", 1)[-1] else ""
    return _FORMAT_OF_SUFFIX.get(f".{suffix}", "text")
