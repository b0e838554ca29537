"""The interface every renderer shares: a name, a file extension, and `render(document) -> str | bytes`, for the
Report and the Comparison alike (`Renderer[Report]`, `Renderer[Comparison]`)."""

from __future__ import annotations

from typing import Protocol, TypeVar

from overlapcheck.errors import UserError
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


def expect_report(document: object) -> Report:
    """`document` when it is a Report; UserError otherwise (each Report renderer's first line: a dict from
    `json.load` or None gave an AttributeError deep inside the renderer)."""
    if isinstance(document, Report):
        return document
    hint = ": Report.from_dict(doc) reads a JSON report" if isinstance(document, dict) else ""
    raise UserError(f"a renderer takes a Report (from overlapcheck.analyze), not {type(document).__name__}{hint}")
