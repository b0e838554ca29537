"""--rank-from: the regular expression that reads each trace's rank from its file's path, and the checks that
refuse, once and before any file is read, a pattern that is empty, does not compile, can take exponential or
just very long time on a name, or reads no rank in any path."""

from __future__ import annotations

import contextlib
import functools
import importlib
import json
import os
import re
import subprocess
import sys
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

from overlapcheck.errors import UserError
from overlapcheck.selection import CLI, Caller
from overlapcheck.trace.reader import MAX_RANK


def compile_rank_pattern(pattern: str, caller: Caller = CLI) -> re.Pattern[str]:
    """The regex of --rank-from: its first group (else the whole match) must be the rank's digits. An empty one
    matches nothing but '' in every path, and one that nests repetitions can take exponential time on a name:
    refused once, not once per file. Errors name it as `caller` wrote it."""
    if not pattern:
        raise UserError(f"{caller.pattern('')} is empty: give a regular expression whose first group is the rank")
    try:
        regex = re.compile(pattern)
    except (re.error, RecursionError, OverflowError) as exc:
        raise UserError(f"{caller.pattern(pattern[:60])} is not a regular expression ({exc})") from None
    shape = _exponential_shape(pattern)
    if shape == "nested":
        raise UserError(
            f"{caller.pattern(pattern[:60])} nests repetitions, which can take exponential time on a file's "
            "name (Python's re backtracks through every split): repeat once, as a+ for (a+)+"
        )
    if shape == "branches":
        raise UserError(
            f"{caller.pattern(pattern[:60])} repeats alternatives that can match alike, which can take exponential "
            "time on a file's name (Python's re tries every way to split it among them): make them start "
            "differently, as (?:a)+ for (a|a?)+"
        )
    return regex


_REPEATS = ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT")


@functools.lru_cache(maxsize=64)
def _exponential_shape(pattern: str) -> str | None:
    """Whether an unbounded repeat of `pattern` holds another unbounded repeat (`(a+)+`, `(a*)*`, `(x|y+)*`), or
    an alternation whose branches may start alike (`(a|a?)+`, `(ab|a)*`: the parser has already merged the
    common prefixes and single characters of the rest): the shapes that backtrack exponentially. Read from the
    parsed pattern: "nested", "branches", or None (also where the parser is unavailable)."""
    parser = _regex_parser()
    if parser is None:
        return None
    try:
        tree = parser.parse(pattern)
        unbounded = int(parser.MAXREPEAT)
    except Exception:  # a private module: whatever it raises, the pattern compiled and is used as it is
        return None
    stack: list[tuple[Any, bool]] = [(tree, False)]
    found: str | None = None
    while stack:
        node, inside = stack.pop()
        for op, av in _items(node):
            repeat = str(op) in _REPEATS and int(av[1]) == unbounded
            if repeat and inside:
                return "nested"
            if inside and str(op) == "BRANCH" and not _distinct_starts(av[1]):
                found = "branches"  # unless a nested repeat is found too: that one is named
            backtracks = repeat and str(op) != "POSSESSIVE_REPEAT"  # a possessive repeat gives nothing back
            stack.extend((sub, inside or backtracks) for sub in _subpatterns(av))
    return found


def _distinct_starts(branches: Any) -> bool:
    """Whether every branch of an alternation starts with a literal character no other branch starts with."""
    firsts = []
    for branch in branches:
        items = _items(branch)
        if not items or str(items[0][0]) != "LITERAL":
            return False
        firsts.append(items[0][1])
    return len(set(firsts)) == len(firsts)


def _regex_parser() -> Any:
    """Python's regex parser (re._parser from 3.11, sre_parse before), or None if neither is there."""
    for name in ("re._parser", "sre_parse"):
        with contextlib.suppress(ImportError), warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            return importlib.import_module(name)
    return None


def _items(node: Any) -> list[tuple[Any, Any]]:
    """The (opcode, argument) items of a parsed subpattern."""
    return list(getattr(node, "data", node))


def _subpatterns(value: Any) -> Iterator[Any]:
    """The subpatterns held anywhere in an item's argument (a group's body, a branch's alternatives, ...)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if hasattr(item, "data"):
            yield item
        elif isinstance(item, list | tuple):
            stack.extend(item)


def rank_by_pattern(path: str, pattern: str, caller: Caller = CLI) -> int:
    """The rank --rank-from reads in `path` (searched in the file name, then in the whole path)."""
    rank = _pattern_rank(path, compile_rank_pattern(pattern, caller))
    if isinstance(rank, str):
        raise UserError(f"{caller.pattern(pattern)} {rank}", path)
    return rank


def _pattern_rank(path: str, regex: re.Pattern[str]) -> int | str:
    """The rank `regex` reads in `path`, or why it reads none."""
    m = regex.search(os.path.basename(path)) or regex.search(path)
    if m is None:
        return "does not match this file's path"
    text = (m.group(1) if regex.groups else m.group(0)) or ""  # an optional group may match nothing
    if not (text and text.isascii() and text.isdigit() and len(text) <= 10 and int(text) <= MAX_RANK):
        return f"matches {text[:40]!r}, not a rank number"
    return int(text)


def check_rank_pattern(traces: Sequence[str], pattern: str, caller: Caller = CLI) -> None:
    """One UserError when `pattern` reads a rank in none of the traces' paths (else one error per file), or when
    reading them takes longer than MATCH_SECONDS: a pattern that backtracks polynomially (`\\d*\\d*\\d*X`) is
    not one the shape check refuses, yet can run for hours on a 40-character name."""
    regex = compile_rank_pattern(pattern, caller)
    if not traces:
        return
    if not _matches_in_time(pattern, traces, MATCH_SECONDS):
        raise UserError(
            f"{caller.pattern(pattern[:60])} took more than {MATCH_SECONDS:g} s to search the traces' paths: "
            "Python's re backtracks through every way to split a name among its repeats (as in \\d*\\d*\\d*X); "
            "give one repeat per part of the name, as gpu(\\d+)"
        )
    reasons = [_pattern_rank(path, regex) for path in traces]
    if any(isinstance(why, int) for why in reasons):
        return
    name = os.path.basename(traces[0])
    whys = [why for why in reasons if isinstance(why, str)]
    if all(why.startswith("does not match") for why in whys):
        raise UserError(
            f"{caller.pattern(pattern)} does not match any of the {len(traces)} traces' paths (such as {name}): "
            "its first group (else the whole match) must be the rank's digits"
        )
    first = next(why for why in whys if not why.startswith("does not match"))
    raise UserError(
        f"{caller.pattern(pattern)} reads no rank in any of the {len(traces)} traces' paths ({name}: {first})"
    )


MATCH_SECONDS = 5.0  # the most time --rank-from may take to search every trace's path (a thousand take ~10 ms)

# The searches _pattern_rank makes, in a child process that can be stopped: Python's re cannot be interrupted
# from another thread, and a signal would take over the caller's SIGALRM.
_SEARCHES = """
import json, os, re, sys
pattern, paths = json.load(sys.stdin)
regex = re.compile(pattern)
for path in paths:
    regex.search(os.path.basename(path)) or regex.search(path)
"""


def _matches_in_time(pattern: str, paths: Sequence[str], seconds: float) -> bool:
    """Whether `pattern` searches every path (as _pattern_rank does) within `seconds`. True, unchecked, where no
    child Python can run (an embedded or frozen interpreter)."""
    if not sys.executable:
        return True
    try:
        subprocess.run(
            [sys.executable, "-I", "-S", "-c", _SEARCHES],
            input=json.dumps([pattern, list(paths)]),  # lone surrogates of undecodable names travel as \udcxx
            capture_output=True, text=True, timeout=seconds, check=True,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return False
    except (OSError, subprocess.SubprocessError):
        return True  # the child could not run; the pattern compiled and is used as it is
    return True
