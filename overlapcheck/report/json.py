"""The JSON report: the `overlapcheck.report/1` document (docs/report-schema.md) is `Report.to_dict()`.

`JsonRenderer.stream` writes it as a stream of pieces, one rank at a time, byte for byte the text of
`render` (which joins them): the whole document never exists as one object, so writing the report of 50,000
ranks holds one rank's text at a time, not the document's three copies (docs/scale.md).

A rank is written by `_Writer`, straight from its objects: the text `json.dumps(indent=2)` writes for
`_clean(_to_plain(rank))` (`document_json`, the reference), without the plain dict, its rounded copy and the
pure-Python encoder's generators in between, and each frozen object of scalars (a `Split`, a `Copies`) written
once per depth however many ranks share it (overlapcheck/compact.py). tests/test_json_writer.py holds the two
equal on real reports and on odd values.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from overlapcheck.model import Report
from overlapcheck.report.base import expect_report


class JsonRenderer:
    """`Report.to_dict()` as JSON: floats rounded to `digits` decimals (None: as computed), non-finite
    numbers as null."""

    name = "json"
    extension = ".json"

    def __init__(self, digits: int | None = 6):
        self.digits = digits

    def render(self, report: Report) -> str:
        report = expect_report(report)
        return "".join(self.stream(report))

    def stream(self, report: Report) -> Iterator[str]:
        """The text of `document_json(report.to_dict())`, in pieces: `json.dumps(indent=2)` writes a value nested
        at depth d as it writes it alone, with d * 2 more spaces after each newline (strings hold no raw one)."""
        doc = dataclasses.replace(report, ranks=[]).to_dict()
        writer = _Writer(self.digits)
        yield "{"
        for i, (key, value) in enumerate(doc.items()):
            yield ("\n  " if i == 0 else ",\n  ") + json.dumps(key, ensure_ascii=False) + ": "
            if key != "ranks" or not report.ranks:
                yield writer.text(value, 1)
                continue
            for j, rank in enumerate(report.ranks):
                yield ("[\n    " if j == 0 else ",\n    ") + writer.text(rank, 2)
            yield "\n  ]"
        yield "\n}\n"


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


_STR = json.encoder.encode_basestring  # what json.dumps(ensure_ascii=False) escapes strings with (C when built)
_SCALARS = (str, int, float, bool, type(None))
SHARED_TEXTS = 4096  # at most this many objects' texts kept by a _Writer (it starts over when full)


class _Writer:
    """`text(value, depth)` is, byte for byte, the text
    `json.dumps(_clean(_to_plain(value), digits), indent=2, ensure_ascii=False)` writes, each newline followed
    by 2 x depth more spaces, written from `value`'s objects in one pass.

    The steps of that reference, in its order: `_to_plain` (a dataclass instance: its fields less those marked
    `json: False` and the None ones marked `omit_none`; a Mapping: its items with str() keys, later equal keys
    replacing earlier ones in the first one's place; a list or tuple: a list), `_clean` (a float: null when not
    finite, else rounded to `digits`), then json's own encoder (str, None, True, False, int, float, else a
    TypeError). An object of a frozen dataclass whose fields are all str, int, float, bool or None has one text
    per depth: it is kept (with the object, so that its id is not reused) and written again as it is."""

    def __init__(self, digits: int | None) -> None:
        self.digits = digits
        self._plans: dict[type, tuple[bool, tuple[tuple[str, str, bool], ...]]] = {}
        self._texts: dict[tuple[int, int], tuple[object, str]] = {}
        self._newlines: list[str] = []

    def text(self, value: Any, depth: int = 0) -> str:
        out: list[str] = []
        self._value(value, depth, out)
        return "".join(out)

    def _newline(self, depth: int) -> str:
        while len(self._newlines) <= depth:
            self._newlines.append("\n" + "  " * len(self._newlines))
        return self._newlines[depth]

    def _float(self, value: float) -> str:
        if not math.isfinite(value):
            return "null"
        rounded = round(value, self.digits) if self.digits is not None else value
        return float.__repr__(rounded) if type(rounded) is float else _json_scalar(rounded)

    def _value(self, value: Any, depth: int, out: list[str]) -> None:
        t = type(value)
        if t is str:
            out.append(_STR(value))
        elif t is float:
            out.append(self._float(value))
        elif t is int:
            out.append(int.__repr__(value))
        elif value is None:
            out.append("null")
        elif t is bool:
            out.append("true" if value else "false")
        elif t is dict:
            self._mapping(value, depth, out)
        elif t is list or t is tuple:
            self._list(value, depth, out)
        elif t in self._plans or (dataclasses.is_dataclass(value) and not isinstance(value, type)):
            self._dataclass(value, depth, out)
        elif isinstance(value, Mapping):
            self._mapping(value, depth, out)
        elif isinstance(value, list | tuple):
            self._list(value, depth, out)
        elif isinstance(value, Sequence) and not isinstance(value, str | bytes):  # a PackedList, an array
            self._list(list(value), depth, out)
        elif isinstance(value, float):
            out.append(self._float(value))
        else:
            out.append(_json_scalar(value))

    def _list(self, values: list[Any] | tuple[Any, ...], depth: int, out: list[str]) -> None:
        if not values:
            out.append("[]")
            return
        inner = self._newline(depth + 1)
        sep = "[" + inner
        for item in values:
            out.append(sep)
            self._value(item, depth + 1, out)
            sep = "," + inner
        out.append(self._newline(depth) + "]")

    def _mapping(self, mapping: Mapping[Any, Any], depth: int, out: list[str]) -> None:
        if not mapping:
            out.append("{}")
            return
        mark = len(out)
        inner = self._newline(depth + 1)
        sep = "{" + inner
        for key, item in mapping.items():
            if type(key) is not str:  # str() keys, as _to_plain makes them: equal ones collapse, as in a dict
                del out[mark:]
                self._mapping({str(k): v for k, v in mapping.items()}, depth, out)
                return
            out.append(sep + _STR(key) + ": ")
            self._value(item, depth + 1, out)
            sep = "," + inner
        out.append(self._newline(depth) + "}")

    def _dataclass(self, obj: Any, depth: int, out: list[str]) -> None:
        kept = self._texts.get((id(obj), depth))
        if kept is not None and kept[0] is obj:
            out.append(kept[1])
            return
        plan = self._plans.get(type(obj))
        if plan is None:
            plan = self._plans[type(obj)] = _plan(type(obj))
        frozen, fields = plan
        mark = len(out)
        leaf = frozen
        inner = self._newline(depth + 1)
        sep = "{" + inner
        for name, key, omit_none in fields:
            item = getattr(obj, name)
            if item is None and omit_none:
                continue
            out.append(sep + key)
            if type(item) is float:
                out.append(self._float(item))
            else:
                leaf = leaf and type(item) in _SCALARS
                self._value(item, depth + 1, out)
            sep = "," + inner
        if len(out) == mark:
            out.append("{}")
        else:
            out.append(self._newline(depth) + "}")
        if leaf:
            if len(self._texts) >= SHARED_TEXTS:
                self._texts.clear()
            self._texts[(id(obj), depth)] = (obj, "".join(out[mark:]))


def _plan(cls: type) -> tuple[bool, tuple[tuple[str, str, bool], ...]]:
    """Of a dataclass: whether it is frozen, and its fields as written (name, its key's text, omit when None)."""
    params = getattr(cls, "__dataclass_params__", None)
    fields = tuple(
        (f.name, _STR(f.name) + ": ", bool(f.metadata.get("omit_none")))
        for f in dataclasses.fields(cls)
        if f.metadata.get("json") is not False
    )
    return bool(params is not None and params.frozen), fields


def _json_scalar(value: Any) -> str:
    """A value that is no container as json's encoder writes it (json.encoder's checks, in its order)."""
    if isinstance(value, str):
        return _STR(value)
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return int.__repr__(value)
    if isinstance(value, float):
        if value != value:
            return "NaN"
        if value in (math.inf, -math.inf):
            return "Infinity" if value > 0 else "-Infinity"
        return float.__repr__(value)
    raise TypeError(f"Object of type {value.__class__.__name__} is not JSON serializable")
