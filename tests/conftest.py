"""Shared fixtures. Helpers (tiny traces, report builders, the CLI, the page parser) live in builders.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from builders import shared_traces_dir


@pytest.fixture
def shared_traces() -> Path:
    """The real traces in ../shared/traces (skips the test when they are not there)."""
    path = shared_traces_dir()
    if path is None:
        pytest.skip("../shared/traces is not present")
    return path


@pytest.fixture(autouse=True)
def _no_color(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("COLUMNS", os.environ.get("COLUMNS", "120"))
