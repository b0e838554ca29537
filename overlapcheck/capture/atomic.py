"""Atomic file writes: write a temp file in the target's folder, then rename it over the target."""

from __future__ import annotations

import json
import os
from typing import Any

from overlapcheck.errors import UserError
from overlapcheck.fsutil import atomic_write


def atomic_write_bytes(path: str, data: bytes) -> None:
    """Write `data` to `path` so that readers see either the old file or the whole new one (replacing it)."""
    atomic_write(path, data, force=True, durable=False)


def atomic_write_json(path: str, obj: Any) -> None:
    """Write `obj` as indented JSON to `path` atomically."""
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n").encode())


def create_json(path: str, obj: Any) -> bool:
    """Create `path` holding `obj`, atomically and only if it does not exist yet: True when this call created
    it, False when it existed (another process got there first). Readers never see it half-written."""
    try:
        atomic_write(path, (json.dumps(obj, default=str) + "\n").encode(), force=False, durable=False)
    except UserError:
        if os.path.lexists(path):
            return False
        raise
    return True


def read_json(path: str) -> Any | None:
    """Read a JSON file; None when it is missing or not (yet) valid JSON."""
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None
