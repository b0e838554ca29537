"""The interface every renderer shares: a name, a file extension, and `render(document) -> str | bytes`, for the
Report and the Comparison alike (`Renderer[Report]`, `Renderer[Comparison]`)."""

from __future__ import annotations

from typing import Protocol, TypeVar

from overlapcheck.model import Report

Document = TypeVar("Document", contravariant=True)


class Renderer(Protocol[Document]):
    """One output format of a document (pyinstrument's renderer pattern)."""

    name: str  # what `--format` calls it
    extension: str  # the usual file extension, with its dot

    def render(self, document: Document) -> str | bytes:
        """The whole output for `document`."""
        ...


ReportRenderer = Renderer[Report]
