"""Run the launch command as a child, forward signals to it, and return its exit status unchanged."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from types import FrameType

from overlapcheck.errors import UserError

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


def _terminal_sent_it() -> bool:
    """True when we are the terminal's foreground group: a Ctrl-C there already reached the child."""
    try:
        fd = sys.stdin.fileno()
        return os.isatty(fd) and os.tcgetpgrp(fd) == os.getpgrp()
    except (OSError, ValueError, AttributeError):
        return False


def run_child(argv: list[str], env: Mapping[str, str]) -> int:
    """Run `argv` with `env` and wait; SIGTERM/SIGINT/SIGHUP/SIGUSR1/2 sent to us are forwarded
    (except those this process was started with ignored).

    Returns the child's exit code, or -N when signal N killed it (as subprocess does).
    """
    try:
        proc = subprocess.Popen(argv, env=dict(env))
    except FileNotFoundError:
        raise UserError(f"command not found: {argv[0]}") from None
    except PermissionError:
        raise UserError(f"command is not executable: {argv[0]}") from None

    def forward(signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGINT and _terminal_sent_it():
            return
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signum)

    # a signal we were started with ignored (nohup, a background job's SIGINT) stays ignored
    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED if signal.getsignal(sig) != signal.SIG_IGN}
    try:
        return proc.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def process_alive(pid: int) -> bool:
    """Whether process `pid` on this host still runs (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except OSError:
            return True  # it exists, owned by another user
        return True


def exit_like(code: int) -> int:
    """Exit the way the child did: re-raise the signal that killed it, else return its code."""
    if code >= 0:
        return code
    sig = -code
    try:
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    except (OSError, ValueError):
        pass
    return 128 + sig
