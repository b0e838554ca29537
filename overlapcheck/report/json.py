"""The JSON report: the `overlapcheck.report/1` document (docs/report-schema.md)."""

from __future__ import annotations

import json
import math
from typing import Any

# keys that live only in memory (for the HTML renderer), never in the JSON contract
IN_MEMORY_KEYS = ("timelines",)


def to_json(report: dict[str, Any]) -> str:
    """Serialize the report; floats are rounded to 6 decimals, non-finite numbers become null."""
    doc = {k: v for k, v in report.items() if k not in IN_MEMORY_KEYS}
    return json.dumps(_clean(doc), indent=2, ensure_ascii=False) + "\n"


def _clean(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, 6) if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value
