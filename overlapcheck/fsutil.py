"""Safe file output: never overwrite without consent, never leave a half-written file."""

from __future__ import annotations

import contextlib
import os
import tempfile

from overlapcheck.errors import UserError


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
