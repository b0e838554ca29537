"""Safe file output: never overwrite without consent, never leave a half-written file."""

from __future__ import annotations

import os
import tempfile

from overlapcheck.errors import UserError


def atomic_write(path: str, data: str | bytes, force: bool = False) -> None:
    """Write `data` to `path` through a temp file in the same folder and a rename.

    Raises UserError when `path` exists and `force` is false, or when the folder cannot be written.
    """
    if os.path.exists(path) and not force:
        raise UserError("already exists; pass --force to overwrite it", path)
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise UserError("its folder does not exist", path)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    try:
        fd, tmp = tempfile.mkstemp(prefix=".overlapcheck-", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise UserError(f"cannot write: {exc.strerror}", path) from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
