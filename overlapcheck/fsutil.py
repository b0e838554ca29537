"""Safe file output: never overwrite without consent, never leave a half-written file."""

from __future__ import annotations

import contextlib
import os
import tempfile
from typing import BinaryIO

from overlapcheck.errors import UserError


def open_input(path: str | os.PathLike[str], expected: str) -> BinaryIO:
    """Open a user-given input file for binary reading; a missing, directory or unreadable path is a UserError
    (`expected` names what the path should have been, e.g. "a trace file")."""
    try:
        return open(path, "rb")  # noqa: SIM115 - returned to the caller
    except FileNotFoundError:
        raise UserError("no such file", os.fspath(path)) from None
    except IsADirectoryError:
        raise UserError(f"is a directory, not {expected}", os.fspath(path)) from None
    except OSError as exc:
        raise UserError(f"cannot read: {exc.strerror}", os.fspath(path)) from None


def check_target(path: str | os.PathLike[str], force: bool = False) -> None:
    """Raise UserError unless `path` may be written: it must not exist (or `force`), and its folder must."""
    path = os.fspath(path)
    if not force and os.path.exists(path):
        raise UserError("already exists; pass --force to overwrite it", path)
    if not os.path.isdir(os.path.dirname(os.path.abspath(path))):
        raise UserError("its folder does not exist", path)


def atomic_write(path: str | os.PathLike[str], data: str | bytes, force: bool = False, durable: bool = True) -> None:
    """Write `data` to `path` through a temp file in the same folder and a rename, so that readers see either
    the old file or the whole new one.

    Raises UserError when `path` exists and `force` is false, or when its folder cannot be written.
    `durable` fsyncs before the rename (reports); capture's own status files skip it (a sync per file costs
    the training step ~100 ms on a busy disk, and they are rewritten anyway).
    """
    path = os.fspath(path)
    check_target(path, force)
    folder = os.path.dirname(os.path.abspath(path))
    raw = data.encode("utf-8") if isinstance(data, str) else data
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise UserError(f"cannot write: {exc.strerror}", path) from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
