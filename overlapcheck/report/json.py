"""The JSON report: the `overlapcheck.report/1` document (docs/report-schema.md) is `Report.to_dict()`."""

from __future__ import annotations

import json
import math
from typing import Any

from overlapcheck.model import Report


class JsonRenderer:
    """`Report.to_dict()` as JSON: floats rounded to `digits` decimals (None: as computed), non-finite
    numbers as null."""

    name = "json"
    extension = ".json"

    def __init__(self, digits: int | None = 6):
        self.digits = digits

    def render(self, report: Report) -> str:
        return document_json(report.to_dict(), self.digits)


def document_json(doc: dict[str, Any], digits: int | None = 6) -> str:
    """A JSON document (the report, the comparison) as text: floats rounded to `digits` decimals (None: as
    computed), non-finite numbers as null, indented, UTF-8 as is."""
    return json.dumps(_clean(doc, digits), indent=2, ensure_ascii=False) + "\n"


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
