"""The typed report: what the `overlapcheck.report/1` JSON document holds (docs/report-schema.md).

Every stage builds or reads these frozen dataclasses: analysis fills `RankMetrics`, diagnosis `Finding`s,
the pipeline the `Report`, the renderers read it. `to_dict()` is the JSON document (field order is key order);
`from_dict()` validates a document and raises `ReportFormatError` (a one-line user error) when its shape is
wrong. Unknown keys are ignored, as the schema's versioning rule asks of every consumer.

This module is the single home of the schema id and of the list of collective kinds; it imports no stage.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from overlapcheck.errors import UserError

if TYPE_CHECKING:
    import pandas as pd

SCHEMA = "overlapcheck.report/1"
SCHEMA_PREFIX = "overlapcheck.report/"
SCHEMA_MAJOR = 1

ALL = "all"
COLLECTIVE_KINDS = ("reduce_scatter", "all_gather", "all_reduce", "all_to_all", "send_recv", "broadcast", "other")
COLLECTIVE_KEYS = (ALL, *COLLECTIVE_KINDS)  # the keys of every COLLECTIVES object
PHASES = ("forward", "backward", "optimizer")
SEVERITIES = ("critical", "warning", "info")

T = TypeVar("T")


class ReportFormatError(UserError):
    """A JSON document that is not an `overlapcheck.report/1` document of the right shape."""


# -- the document ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Split:
    """One collective kind's communication: count, time_us = |C|, overlapped_us = |C ∩ P|, exposed_us = the
    rest, overlap = overlapped / time (None without communication). docs/metrics.md."""

    count: int
    time_us: float
    overlapped_us: float
    exposed_us: float
    overlap: float | None


Collectives = Mapping[str, Split]  # COLLECTIVE_KEYS -> Split


@dataclass(frozen=True)
class Copies:
    """memcpy or memset: count, time_us = |M|, exposed_us = |M − (compute ∪ communication)|."""

    count: int
    time_us: float
    exposed_us: float


@dataclass(frozen=True)
class StreamStats:
    """One GPU stream (or CPU lane): its activities, busy time and activity classes."""

    stream: int
    kernels: int
    busy_us: float
    classes: dict[str, int]


@dataclass(frozen=True)
class PhaseMetrics:
    """Forward, backward or optimizer of one step."""

    compute_us: float
    collectives: Collectives


@dataclass(frozen=True)
class StepMetrics:
    """One `ProfilerStep#N` of one rank."""

    step: int
    start_us: float
    duration_us: float
    cpu_duration_us: float
    compute_us: float
    exposed_share: float | None
    collectives: Collectives
    memcpy: Copies
    memset: Copies
    phases: dict[str, PhaseMetrics] = field(default_factory=dict)


@dataclass(frozen=True)
class RankMetrics:
    """One rank's measurements (the RANK object)."""

    rank: int | None
    source: str
    world_size: int | None
    backend: str | None
    host: str | None
    lanes: str
    span_us: float
    busy_us: float
    compute_us: float
    idle_us: float
    step_time_us: float
    exposed_share: float | None
    collectives: Collectives
    memcpy: Copies
    memset: Copies
    streams: list[StreamStats] = field(default_factory=list)
    steps: list[StepMetrics] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def overlap(self, kind: str = ALL) -> float | None:
        return self.collectives[kind].overlap if kind in self.collectives else None

    def exposed_per_step(self, kind: str = ALL) -> float:
        """Exposed communication of `kind` per profiled step (µs): the mean over steps, else the whole trace."""
        if self.steps:
            return sum(s.collectives[kind].exposed_us for s in self.steps) / len(self.steps)
        return self.collectives[kind].exposed_us if kind in self.collectives else 0.0


@dataclass(frozen=True)
class Fix:
    """A machine-applicable fix: dotted ds_config paths -> values, environment variables -> values (None: unset
    it), a pip requirement. Absent parts are omitted from the document."""

    config: dict[str, Any] | None = field(default=None, metadata={"omit_none": True})
    env: dict[str, str | None] | None = field(default=None, metadata={"omit_none": True})
    upgrade: str | None = field(default=None, metadata={"omit_none": True})

    def __bool__(self) -> bool:
        return bool(self.config or self.env or self.upgrade)


@dataclass(frozen=True)
class Finding:
    """What blocks the overlap, what it costs per step, and the fix (docs/rules.md)."""

    rule: str
    severity: str
    title: str
    why: str
    cost_us: float
    ranks: list[int]
    steps: list[int]
    evidence: dict[str, Any]
    fix: Fix = field(default_factory=Fix)


@dataclass(frozen=True)
class Stat:
    """One metric across ranks."""

    min: float
    median: float
    max: float
    worst_rank: int | None


@dataclass(frozen=True)
class Summary:
    """Cross-rank statistics: `metrics` maps `<kind>.<metric>` and rank metrics to their spread."""

    ranks: int
    metrics: dict[str, Stat]


@dataclass(frozen=True)
class InputError:
    """An input that could not be read, and why (one line)."""

    source: str
    error: str


@dataclass(frozen=True)
class Tool:
    name: str
    version: str


@dataclass(frozen=True)
class CollectiveSignature:
    """One rank's collectives in issue order, for the cross-rank rules (stragglers): each collective's key
    (`<process group>|<kind>|<n-th of that kind on that group>`), kernel duration (µs), the share of it that no
    compute covered, and whether it ran inside a profiled step. Written in per-rank summaries only."""

    keys: list[str]
    dur: list[float]
    exposed: list[float]
    in_step: list[bool]
    steps: int


@dataclass(frozen=True)
class TimelineLane:
    id: int
    label: str
    kind: str


@dataclass(frozen=True)
class Timeline:
    """One step of one rank, lane by lane, for the HTML page (never written to JSON). `events` rows are
    `[lane id, start − t0, duration, class, name index]`; `exposed` are `[start − t0, end − t0]` pairs."""

    step: int | None
    t0: float
    duration: float
    lanes: list[TimelineLane]
    events: list[list[Any]]
    names: list[str]
    exposed: list[list[float]]


@dataclass(frozen=True)
class RankResult:
    """One rank's part of the report, as its worker returns it: the metrics, the rank's own findings
    (severity against its own step), its collective signature and, for the HTML page, its timeline."""

    metrics: RankMetrics
    findings: list[Finding] = field(default_factory=list)
    signature: CollectiveSignature | None = None
    timeline: Timeline | None = None


@dataclass(frozen=True)
class Report:
    """The whole report. `collective_signatures` is set in per-rank summaries only; `timelines` lives in
    memory for the HTML renderer and is never part of the JSON document."""

    tool: Tool
    run: dict[str, Any] | None
    ranks: list[RankMetrics]
    summary: Summary
    findings: list[Finding]
    findings_explain_share: float | None
    errors: list[InputError]
    schema: str = SCHEMA
    collective_signatures: dict[str, CollectiveSignature] | None = field(default=None, metadata={"omit_none": True})
    timelines: dict[int, Timeline] = field(default_factory=dict, metadata={"json": False})

    def to_dict(self) -> dict[str, Any]:
        """The JSON document (docs/report-schema.md); floats as computed (the JSON renderer rounds them)."""
        out: dict[str, Any] = {"schema": self.schema}
        out.update((k, v) for k, v in _to_plain(self).items() if k != "schema")
        return out

    @classmethod
    def from_dict(cls, doc: object, source: str | None = None) -> Report:
        """Validate and read a report document; ReportFormatError names the first field of the wrong shape."""
        schema = doc.get("schema") if isinstance(doc, dict) else None
        if not isinstance(schema, str) or not schema.startswith(SCHEMA_PREFIX):
            raise ReportFormatError(f'not an overlapcheck report (expected "schema": "{SCHEMA}")', source)
        if schema[len(SCHEMA_PREFIX) :].split(".")[0] != str(SCHEMA_MAJOR):
            raise ReportFormatError(
                f"report schema {schema!r} is not supported; this overlapcheck reads {SCHEMA}", source
            )
        try:
            report: Report = _from_plain(cls, doc, "")
            for i, r in enumerate(report.ranks):
                if r.rank is None:
                    raise _Shape(f"ranks[{i}].rank is not an integer")
            return report
        except _Shape as exc:
            raise ReportFormatError(f"malformed report: {exc}", source) from None

    def rank(self, number: int) -> RankMetrics | None:
        return next((r for r in self.ranks if r.rank == number), None)

    def dataframe(self, level: str = "ranks") -> pd.DataFrame:
        """A pandas DataFrame of one level of the report: `ranks`, `collectives`, `steps`, `phases` or
        `findings` (docs/api.md lists the columns)."""
        from overlapcheck.frames import dataframe

        return dataframe(self, level)


# -- dict conversion -------------------------------------------------------------------------------------------


class _Shape(Exception):
    """A field of the wrong shape, at a dotted path."""


def _to_plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = {}
        for f in dataclasses.fields(value):
            item = getattr(value, f.name)
            if f.metadata.get("json") is False or (item is None and f.metadata.get("omit_none")):
                continue
            out[f.name] = _to_plain(item)
        return out
    if isinstance(value, Mapping):
        return {str(k): _to_plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_to_plain(v) for v in value]
    return value


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def _from_plain(tp: Any, value: Any, path: str) -> Any:
    """`value` (parsed JSON) as type `tp`, or _Shape naming `path`."""
    origin = typing.get_origin(tp)
    if origin is typing.Union or origin is types.UnionType:
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _from_plain(inner[0], value, path)
    if tp is Any:
        return value
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise _Shape(f"{path or 'the document'} is not an object")
        kwargs = {}
        for f in dataclasses.fields(tp):
            if f.metadata.get("json") is False:
                continue
            where = f"{path}.{f.name}" if path else f.name
            if f.name not in value:
                if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING:
                    continue
                raise _Shape(f"{where} is missing")
            kwargs[f.name] = _from_plain(_hints(tp)[f.name], value[f.name], where)
        return tp(**kwargs)
    if origin in (list, tuple):
        if not isinstance(value, list):
            raise _Shape(f"{path} is not a list")
        (item,) = typing.get_args(tp)[:1]
        return [_from_plain(item, v, f"{path}[{i}]") for i, v in enumerate(value)]
    if origin in (dict, Mapping):
        if not isinstance(value, dict):
            raise _Shape(f"{path} is not an object")
        _, item = typing.get_args(tp)
        if item is Split and (missing := [k for k in COLLECTIVE_KEYS if k not in value]):
            raise _Shape(f"{path} has no {missing[0]!r}")
        return {str(k): _from_plain(item, v, f"{path}.{k}") for k, v in value.items()}
    if tp is bool:
        if not isinstance(value, bool):
            raise _Shape(f"{path} is not true or false")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _Shape(f"{path} is not an integer")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise _Shape(f"{path} is not a finite number")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise _Shape(f"{path} is not a string")
        return value
    raise TypeError(f"no conversion for {tp!r}")  # a bug in this module, not bad input
