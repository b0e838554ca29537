"""The JSON report: the `overlapcheck.report/1` document (docs/report-schema.md) is `Report.to_dict()`.

`JsonRenderer.stream` writes it as a stream of pieces, one rank at a time, byte for byte the text of
`render` (which joins them): the whole document never exists as one object, so writing the report of 50,000
ranks holds one rank's dict and text at a time, not the document's three copies (docs/scale.md).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterator
from typing import Any

from overlapcheck.model import Report, _to_plain


class JsonRenderer:
    """`Report.to_dict()` as JSON: floats rounded to `digits` decimals (None: as computed), non-finite
    numbers as null."""

    name = "json"
    extension = ".json"

    def __init__(self, digits: int | None = 6):
        self.digits = digits

    def render(self, report: Report) -> str:
        return "".join(self.stream(report))

    def stream(self, report: Report) -> Iterator[str]:
        """The text of `document_json(report.to_dict())`, in pieces: `json.dumps(indent=2)` writes a value nested
        at depth d as it writes it alone, with d * 2 more spaces after each newline (strings hold no raw one)."""
        doc = dataclasses.replace(report, ranks=[]).to_dict()
        yield "{"
        for i, (key, value) in enumerate(doc.items()):
            yield ("\n  " if i == 0 else ",\n  ") + json.dumps(key, ensure_ascii=False) + ": "
            if key != "ranks" or not report.ranks:
                yield _dumps(value, self.digits, "\n  ")
                continue
            for j, rank in enumerate(report.ranks):
                yield ("[\n    " if j == 0 else ",\n    ") + _dumps(_to_plain(rank), self.digits, "\n    ")
            yield "\n  ]"
        yield "\n}\n"


def document_json(doc: dict[str, Any], digits: int | None = 6) -> str:
    """A JSON document (the report, the comparison) as text: floats rounded to `digits` decimals (None: as
    computed), non-finite numbers as null, indented, UTF-8 as is."""
    return json.dumps(_clean(doc, digits), indent=2, ensure_ascii=False) + "\n"


def _dumps(value: Any, digits: int | None, newline: str) -> str:
    return json.dumps(_clean(value, digits), indent=2, ensure_ascii=False).replace("\n", newline)


def _clean(value: Any, digits: int | None) -> Any:
    if isinstance(value, float):
        if not math.isfinite(value):
            return None
        return round(value, digits) if digits is not None else value
    if isinstance(value, dict):
        return {str(k): _clean(v, digits) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v, digits) for v in value]
    return value
