"""Atomic file writes: write a temp file in the target's folder, then rename it over the target."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from typing import Any


def atomic_write_bytes(path: str, data: bytes) -> None:
    """Write `data` to `path` so that readers see either the old file or the whole new one."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)  # no fsync: readers need a whole file, not one that survives a power cut
        os.replace(tmp, path)
    except BaseException:
        _remove_quietly(tmp)
        raise


def atomic_write_json(path: str, obj: Any) -> None:
    """Write `obj` as indented JSON to `path` atomically."""
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n").encode())


def read_json(path: str) -> Any | None:
    """Read a JSON file; None when it is missing or not (yet) valid JSON."""
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def _remove_quietly(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)
