"""Shared fixtures. Helpers (tiny traces, report builders, the CLI, the page parser) live in builders.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from builders import SimulatedSets, shared_traces_dir


@pytest.fixture
def shared_traces() -> Path:
    """The real traces in ../shared/traces (skips the test when they are not there)."""
    path = shared_traces_dir()
    if path is None:
        pytest.skip("../shared/traces is not present")
    return path


@pytest.fixture(scope="session")
def simulated(tmp_path_factory: pytest.TempPathFactory) -> SimulatedSets:
    """Simulated sets written once per session: one folder for all xdist workers (the parent of each worker's
    basetemp is the session's), so that each set is simulated once (builders.SimulatedSets)."""
    base = tmp_path_factory.getbasetemp()
    return SimulatedSets((base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "simulated")


@pytest.fixture(autouse=True)
def _no_color(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("COLUMNS", "120")  # never the terminal's (xdist's workers say 80): outputs as in CI


# Tests that start processes of their own which must not run beside each other's (real DeepSpeed / torchrun
# jobs with their rendezvous, Dask clusters, a browser) run in one xdist worker each, one after the other; the
# rest spread over the workers (`-n auto --dist loadgroup`, pyproject.toml).
_SERIAL_GROUPS = {"launcher": "launcher", "browser": "browser", "hta": "hta"}
_SERIAL_MODULES = {"test_dask": "dask", "test_capture_launch": "launcher"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        group = next((g for mark, g in _SERIAL_GROUPS.items() if item.get_closest_marker(mark)), None)
        group = group or _SERIAL_MODULES.get(item.module.__name__ if item.module else "")
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
    # The launcher group is the longest serial chain (minutes of real jobs): it goes first, so that its worker
    # starts it at once and the other worker spreads the rest around it. Started last, the run would take the
    # rest's time plus the chain's. (xdist's loadgroup queues the groups in the order of their first test.)
    items.sort(key=lambda item: _group(item) != FIRST_GROUP)  # stable: the order within each part stays


FIRST_GROUP = "launcher"


def _group(item: pytest.Item) -> str | None:
    mark = item.get_closest_marker("xdist_group")
    return mark.args[0] if mark and mark.args else None
