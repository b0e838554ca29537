"""The interface every renderer shares: a name, a file extension, and `render(report) -> str | bytes`."""

from __future__ import annotations

from typing import Protocol

from overlapcheck.model import Report


class Renderer(Protocol):
    """One output format of the Report (pyinstrument's renderer pattern)."""

    name: str  # what `--format` calls it
    extension: str  # the usual file extension, with its dot

    def render(self, report: Report) -> str | bytes:
        """The whole output for `report`."""
        ...
