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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from overlapcheck.errors import UserError

if TYPE_CHECKING:
    import pandas as pd

SCHEMA = "overlapcheck.report/1"
SCHEMA_PREFIX = "overlapcheck.report/"
SCHEMA_MAJOR = 1
INT_MIN, INT_MAX = -(2**63), 2**63 - 1  # a report's integers: a trace's are int64 (its reader refuses the rest)

ALL = "all"
COLLECTIVE_KINDS = ("reduce_scatter", "all_gather", "all_reduce", "all_to_all", "send_recv", "broadcast", "other")
COLLECTIVE_KEYS = (ALL, *COLLECTIVE_KINDS)  # the keys of every COLLECTIVES object
PHASES = ("forward", "backward", "optimizer")
SEVERITIES = ("critical", "warning", "info")

T = TypeVar("T")


class ReportFormatError(UserError):
    """A JSON document that is not an `overlapcheck.report/1` document of the right shape."""


# -- the document ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Split:
    """One collective kind's communication: count, time_us = |C|, overlapped_us = |C ∩ P|, exposed_us = the
    rest, overlap = overlapped / time (None without communication). docs/metrics.md."""

    count: int
    time_us: float
    overlapped_us: float
    exposed_us: float
    overlap: float | None


Collectives = Mapping[str, Split]  # COLLECTIVE_KEYS -> Split


@dataclass(frozen=True, slots=True)
class Copies:
    """memcpy or memset: count, time_us = |M|, exposed_us = |M − (compute ∪ communication)|."""

    count: int
    time_us: float
    exposed_us: float


@dataclass(frozen=True, slots=True)
class StreamStats:
    """One GPU stream (or CPU lane): its activities, busy time and activity classes."""

    stream: int
    kernels: int
    busy_us: float
    classes: dict[str, int]


@dataclass(frozen=True, slots=True)
class PhaseMetrics:
    """Forward, backward or optimizer of one step."""

    compute_us: float
    collectives: Collectives


@dataclass(frozen=True, slots=True)
class StepMetrics:
    """One `ProfilerStep#N` of one rank. Its activities are those it launched; its period is the stretch of the
    rank's timeline it accounts for (from the end of the previous step's GPU work to the end of its own), and
    the periods of a rank's steps tile its timeline without overlapping (docs/metrics.md)."""

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
    period_start_us: float | None = None  # None only in documents written before the field existed
    period_us: float | None = None


@dataclass(frozen=True, slots=True)
class OutsideSteps:
    """The activities of a rank that belong to no profiled step (or, `before_first_step`, the part of them that
    the previous, unprofiled iteration left running): counted in the rank's totals, in no step."""

    count: int
    busy_us: float
    compute_us: float
    collectives: Collectives
    memcpy: Copies
    memset: Copies


@dataclass(frozen=True, slots=True)
class KindBandwidth:
    """One collective kind's bytes and bandwidth on one rank (docs/metrics.md, Bandwidth): the kernels whose
    message size is known, their group size, bytes per step, the median and spread of algbw and busbw (GB/s,
    1e9 bytes/s, from each kernel's own duration, waiting included), whether the group stays inside a node, and
    the peak it is compared with (None: no known peak, never a guess)."""

    count: int
    group_size: int | None
    bytes_per_step: float
    algbw_gbps: float | None
    busbw_gbps: float | None
    busbw_min_gbps: float | None
    busbw_max_gbps: float | None
    scope: str | None  # "intra-node", "inter-node", None when unknown
    peak_gbps: float | None = None
    peak: str | None = None  # what the peak is ("NVLink 3 (A100), per direction", "--network 4x200Gbps ...")
    gpu: str | None = None  # the GPU model the trace names (deviceProperties), for the NVLink peak


@dataclass(frozen=True)
class PhaseHideability:
    """Per step (mean over steps) on one phase of a ZeRO-3 step: the compute beside the phase's collectives, their
    transfer time at the measured bandwidth, their exposed time, and its split into the floor (no schedule could
    hide it at this bandwidth) and the schedulable rest (docs/metrics.md, Hideability)."""

    compute_us: float
    transfer_us: float
    exposed_us: float
    floor_us: float
    schedulable_us: float


@dataclass(frozen=True)
class JobKindBandwidth:
    """One collective kind across ranks: collectives matched on every rank, their transfer time (the shortest
    duration across ranks) and the wait (the rest, per rank), per step; busbw at the transfer time (median and
    spread over collectives)."""

    collectives: int
    bytes_per_step: float
    transfer_us_per_step: float | None  # None: not matched across ranks (one rank)
    wait_us_per_step: float | None
    busbw_gbps: float | None
    busbw_min_gbps: float | None
    busbw_max_gbps: float | None
    scope: str | None
    peak_gbps: float | None = None
    peak: str | None = None


@dataclass(frozen=True)
class JobBandwidth:
    """The BANDWIDTH object: per kind across ranks, the hideability per phase (median over ranks), and the network
    the user stated (`--network`), if any."""

    kinds: dict[str, JobKindBandwidth]
    hideability: dict[str, PhaseHideability]
    floor_us: float
    schedulable_us: float
    network: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class ModuleComm:
    """The communication one module is served by, of one collective kind in one phase (docs/metrics.md, Per
    module): how many collectives serve it, and its share of their time, exposed and hidden (overlapped) µs. A
    collective that serves several modules (a gradient bucket) is counted once for each and its time is split
    evenly among them, so the rows of a rank add up to its collectives' time, each µs once. `module` is the
    module's path (`mlp.0`, from the capture's annotations) or the chain of the profiler's module frames
    (`Net_0.Sequential_0.Linear_1`), or the forward frame that called it; None: no module found. `source` says
    which (MODULE_SOURCES)."""

    module: str | None
    kind: str
    phase: str | None  # forward, backward, optimizer; None outside steps or without phases
    source: str
    count: int
    time_us: float
    exposed_us: float
    hidden_us: float
    cls: str | None = None  # the module's class, when the source names it


MODULE_SOURCES = ("annotation", "gradient hooks", "module frame", "forward frame", "none")


@dataclass(frozen=True)
class Modules:
    """The MODULES object: per module, kind and phase, the communication that serves it, summed over the ranks
    that have communication (`ranks`) and their profiled steps (`rank_steps`: per rank and step, divide by it).
    `notes` say what the attribution rests on, or why there is none."""

    ranks: int
    rank_steps: int
    rows: list[ModuleComm]
    notes: list[str] = field(default_factory=list)


ModuleKey = tuple[str | None, str, str | None, str, str | None]  # (module, kind, phase, source, cls)


@dataclass(frozen=True, slots=True)
class PackedModules:
    """One rank's MODULES as the main process holds it until the report is written (overlapcheck/compact.py): a
    key per row, each key tuple shared by every rank that has it, and the values as arrays (`counts` int64;
    `values` float64, one row of time, exposed, hidden per key); `rows` gives the ModuleComm rows back, every
    value unchanged. In memory only."""

    ranks: int
    rank_steps: int
    keys: tuple[ModuleKey, ...]
    counts: Any
    values: Any
    notes: tuple[str, ...] = ()

    @property
    def rows(self) -> list[ModuleComm]:
        return [
            ModuleComm(m, kind, ph, source, int(n), float(v[0]), float(v[1]), float(v[2]), cls)
            for (m, kind, ph, source, cls), n, v in zip(self.keys, self.counts.tolist(), self.values, strict=True)
        ]


@dataclass(frozen=True, slots=True)
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
    # a list as analyzed; held as columns once in the main process (overlapcheck/compact.py, packed.py)
    steps: Sequence[StepMetrics] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    before_first_step: OutsideSteps | None = None  # None: the trace has no steps (or an older document)
    outside_steps: OutsideSteps | None = None
    bandwidth: dict[str, KindBandwidth] = field(default_factory=dict)  # per collective kind with a known size
    # communication activities per source of their collective kind: "launching op" (the op that launched it:
    # its Collective name, nccl:* / c10d::* / gloo:* op) or "kernel name" (the fallback; trace/launch.py)
    kind_from: dict[str, int] = field(default_factory=dict)

    def __repr__(self) -> str:  # the whole rank is kilobytes of steps and streams: a notebook shows this line
        overlap = self.overlap()
        shown = f"{overlap:.1%}" if overlap is not None else "n/a"
        return (
            f"RankMetrics(rank={self.rank}, overlap={shown}, steps={len(self.steps)}, "
            f"step_time_us={self.step_time_us:.6g}, source={self.source!r})"
        )

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


@dataclass(frozen=True, slots=True)
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
    # in memory, per-rank findings only: the windows [start, end) (the rank's trace µs) where the compute idle
    # this finding charges lies; the diagnosis reads them for the share it explains and the unexplained rest
    covers: Any = field(default=None, compare=False, repr=False, metadata={"json": False})
    # the finding names the rank the others wait for (a straggler: its first rank sets the job's pace); written only
    # when true
    paces: bool | None = field(default=None, metadata={"omit_none": True})


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


@dataclass(frozen=True, slots=True)
class CollectiveSignature:
    """One rank's collectives in issue order, for the cross-rank rules (stragglers): each collective's key
    (`<process group>|<kind>|<n-th of that kind on that group>`), kernel duration (µs), the share of it that no
    compute covered, and whether it ran inside a profiled step; plus the host's lead-in to each step, which tells a
    rank whose host starts its steps late. Written in per-rank summaries only."""

    keys: list[str]
    dur: Sequence[float]  # a list, or an array once in the main process (overlapcheck/compact.py)
    exposed: Sequence[float]  # a list, or an array once in the main process (overlapcheck/compact.py)
    in_step: list[bool]
    steps: int
    bytes: Sequence[int] = field(
        default_factory=list
    )  # message bytes (nccl-tests size), -1 unknown; [] in old summaries
    group: Sequence[int] = field(default_factory=list)  # group size, -1 unknown
    # the host's lead-in to its steps (diagnose/facts/hostgap.py): mean CPU time per step from the start of
    # `ProfilerStep#N` to the step's first GPU launch, less syncs; None without steps (and in old summaries)
    host_gap_us: float | None = None
    host_gap_frames: list[str] = field(default_factory=list)  # the Python frames that spend it, most first (≤ 3)
    host_gap_frame_us: Sequence[float] = field(default_factory=list)  # their time per step, in the same order
    # the rank's exposed communication per step (facts/coverage.py): all of it, the part its own findings cover,
    # and the inherent part no finding covers; None in old summaries
    exposed_us: float | None = None
    explained_us: float | None = None
    inherent_us: float | None = None
    # per collective, the exposed µs of it counted inherent on this rank (a step's first all-gather or last bucket
    # at the rank's best rate, no finding covering it), and of those kernels the exposed µs read as all transfer
    # (facts/coverage.py); [] in old summaries
    inherent_parts_us: Sequence[float] = field(default_factory=list)
    tail_us: Sequence[float] = field(default_factory=list)


@dataclass(frozen=True)
class TimelineLane:
    id: int
    label: str
    kind: str
    stream: int | None = None  # the CUDA stream (GPU lanes), else None


@dataclass(frozen=True)
class TimelineStep:
    """One selected `ProfilerStep#N` on a timeline: its GPU window `[start, end)` and CPU span, and per phase
    (`forward`, `backward`, `optimizer`) the GPU span `[start, end]` of the activities it issued, all relative
    to the timeline's t0."""

    step: int
    start: float
    end: float
    cpu_start: float
    cpu_end: float
    phases: dict[str, list[float]] = field(default_factory=dict)
    period_start: float | None = None  # the step's period (docs/metrics.md) `[period_start, period_end)`
    period_end: float | None = None


@dataclass(frozen=True)
class Blame:
    """A host-side event that a finding blames (a host sync, a compute-stream wait, a late launch), for the
    timelines (in memory only, never written to JSON). Times are the trace's own clock (µs). `key` names the
    finding on its rank (the rule and the evidence fields that tell its findings apart); `finding` is the index
    of the merged finding in `Report.findings`, set when the Report is assembled (-1: none)."""

    rule: str
    key: str
    kind: str  # "sync", "wait", "late-launch" or "exposed" (communication a finding charges, on its stream)
    start: float
    end: float
    thread: int  # the host thread's tid (a wait: the stream held), -1 when unknown
    call: str  # the call (cudaStreamSynchronize, ...), or what a wait waited for
    step: int | None
    cost_us: float = 0.0
    finding: int = -1


@dataclass(frozen=True)
class Timeline:
    """The selected steps of one rank, lane by lane, for the HTML page and the Perfetto file (never written to
    JSON). `events` rows are `[lane id, start − t0, duration, class, name index, step, nelems, nbytes, module]`
    (step -1 when none, sizes -1 when the trace has none, module: the modules a collective serves as one line,
    `layers.0; layers.1`, None when none or not a collective; docs/metrics.md, Per module), at most a bounded
    number per rank (communication and the longest kernels first; `omitted` counts the rest); `exposed` are
    `[start − t0, end − t0]` pairs: the union of communication minus the union of compute, whose lengths add up
    to the rank's `collectives.all.exposed_us`.
    `step` is the step shown first (the one with the most exposed communication); `steps` are every selected
    step; `host` the blamed host events; `anchors` the first collectives as `(key, absolute end)` pairs, for
    aligning the clocks of ranks."""

    step: int | None
    t0: float
    duration: float
    lanes: list[TimelineLane]
    events: list[list[Any]]
    names: list[str]
    exposed: list[list[float]]
    steps: list[TimelineStep] = field(default_factory=list)
    host: list[Blame] = field(default_factory=list)
    anchors: list[tuple[str, float]] = field(default_factory=list)
    omitted: int = 0


@dataclass(frozen=True)
class RankResult:
    """One rank's part of the report, as its worker returns it: the metrics, the rank's own findings
    (severity against its own step), its collective signature and, for the HTML page, its timeline."""

    metrics: RankMetrics
    findings: list[Finding] = field(default_factory=list)
    signature: CollectiveSignature | None = None
    timeline: Timeline | None = None
    blames: list[Blame] = field(default_factory=list)  # what the findings blame (in memory, with timelines)
    trace_steps: tuple[int, ...] = ()  # the ProfilerSteps its trace holds, selected or not (in memory only)
    # the rank's per-module communication (None: it has no communication); packed once it reaches the main process
    modules: Modules | PackedModules | None = None
    # the trace's baseTimeNanoseconds in µs (0 without one): base + ts is the time since the epoch (in memory only)
    clock_base_us: float = 0.0


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
    bandwidth: JobBandwidth | None = field(default=None, metadata={"omit_none": True})
    # of the whole job, not of one rank: its ds_config's values left out or resolved, uneven captures, rules that
    # could not apply, ...; absent when there is nothing to say
    notes: list[str] | None = field(default=None, metadata={"omit_none": True})
    # per module, the communication that serves it (analysis/modules.py); absent when no rank has communication
    modules: Modules | None = field(default=None, metadata={"omit_none": True})

    def to_dict(self) -> dict[str, Any]:
        """The JSON document (docs/report-schema.md); floats as computed (the JSON renderer rounds them)."""
        out: dict[str, Any] = {"schema": self.schema}
        out.update((k, v) for k, v in _to_plain(self).items() if k != "schema")
        return out

    @classmethod
    def from_dict(cls, doc: object, source: str | None = None) -> Report:
        """Validate and read a report document; ReportFormatError names the first field of the wrong shape."""
        schema = doc.get("schema") if isinstance(doc, dict) else None
        if isinstance(schema, str) and schema.startswith("overlapcheck.") and not schema.startswith(SCHEMA_PREFIX):
            raise ReportFormatError(
                f"an overlapcheck document of schema {schema[:60]!r}, not a report ({SCHEMA})", source
            )
        if not isinstance(schema, str) or not schema.startswith(SCHEMA_PREFIX):
            raise ReportFormatError(f'not an overlapcheck report (expected "schema": "{SCHEMA}")', source)
        if schema[len(SCHEMA_PREFIX) :].split(".")[0] != str(SCHEMA_MAJOR):
            raise ReportFormatError(
                f"report schema {schema!r} is not supported; this overlapcheck reads {SCHEMA}", source
            )
        try:
            report: Report = _from_plain(cls, doc, "")
            first: dict[int, int] = {}
            for i, r in enumerate(report.ranks):
                if r.rank is None:
                    raise _Shape(f"ranks[{i}].rank is not an integer")
                if (j := first.setdefault(r.rank, i)) != i:  # two jobs' reports pasted together, or one rank twice
                    raise _Shape(f"ranks[{i}] and ranks[{j}] are both rank {r.rank}")
            return report
        except _Shape as exc:
            raise ReportFormatError(f"malformed report: {exc}", source) from None

    def __repr__(self) -> str:  # the whole report is hundreds of kilobytes: a notebook shows this line
        return (
            f"<Report {self.schema}: {len(self.ranks)} ranks, {len(self.findings)} findings, "
            f"{len(self.errors)} errors; .to_dict(), .dataframe('ranks' | 'collectives' | 'steps' | 'phases' | "
            "'modules' | 'findings')>"
        )

    def rank(self, number: int) -> RankMetrics | None:
        return next((r for r in self.ranks if r.rank == number), None)

    def dataframe(self, level: str = "ranks") -> pd.DataFrame:
        """A pandas DataFrame of one level of the report: `ranks`, `collectives`, `steps`, `phases`, `modules`
        or `findings` (docs/api.md lists the columns)."""
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
    if isinstance(value, list | tuple) or (isinstance(value, Sequence) and not isinstance(value, str | bytes)):
        return [_to_plain(v) for v in value]  # a PackedList or array (overlapcheck/compact.py) as the list it holds
    return value


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


MAX_TIME_US = 2.0**62  # the reader's bound (trace/model.py): no time it reads reaches it


def _check_split(fields: dict[str, Any], path: str) -> None:
    """A collective kind's numbers that no trace can give: a negative count or time, a time beyond the reader's
    bound (`time_us` 1e308 passed a gate), an overlap outside [0, 1] (a summary or report edited by hand, or
    another tool's; read as they were, they passed a gate at 750%)."""
    for name in ("count", "time_us", "overlapped_us", "exposed_us"):
        if fields.get(name, 0) < -1e-3:
            raise _Shape(f"{path}.{name} is negative ({_number(fields[name])})")
        if name != "count" and fields.get(name, 0) >= MAX_TIME_US:
            raise _Shape(f"{path}.{name} is {_number(fields[name])} µs, beyond 2^62 µs: no trace gives it")
    overlap = fields.get("overlap")
    if overlap is not None and not -1e-6 <= overlap <= 1 + 1e-6:
        raise _Shape(f"{path}.overlap is {_number(overlap)}, not a fraction from 0 to 1")


def _number(value: int | float) -> str:
    """A number for a message, never raising: `:g` converts an integer to a float, which overflows past 1e308
    (and str() refuses an integer of over 4,300 digits)."""
    try:
        return f"{value:g}"
    except OverflowError:
        return f"about {'-' if value < 0 else ''}10^{int(abs(int(value)).bit_length() * math.log10(2))}"


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
        _check_finite(value, path)
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
        if tp is Split:
            _check_split(kwargs, path)
        share = kwargs.get("exposed_share") if tp in (RankMetrics, StepMetrics) else None
        if share is not None and share < -1e-6:  # a share of step time: a hand-edited -0.5 passed a gate at -50%
            raise _Shape(f"{path}.exposed_share is {_number(share)}, a negative share of step time")
        return tp(**kwargs)
    if origin in (list, tuple, Sequence):
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
        if not INT_MIN <= value <= INT_MAX:
            raise _Shape(f"{path} is {_number(value)}, beyond a 64-bit integer: no trace gives it")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float) or not _finite(value):
            raise _Shape(f"{path} is not a finite number")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise _Shape(f"{path} is not a string")
        return value
    raise TypeError(f"no conversion for {tp!r}")  # a bug in this module, not bad input


def _check_finite(value: Any, path: str) -> None:
    """_Shape if a free-form value (a finding's evidence, run.json) holds NaN or an infinity anywhere: JSON has
    no such number (Python's parser takes them), and a report that holds one was edited or is not ours."""
    stack = [(value, path)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            raise _Shape(f"{where} is {item}, not a finite number")
        if isinstance(item, dict):
            stack.extend((v, f"{where}.{k}") for k, v in item.items())
        elif isinstance(item, list):
            stack.extend((v, f"{where}[{i}]") for i, v in enumerate(item))


def _finite(value: int | float) -> bool:
    """Whether a JSON number is a finite float: an integer beyond a float's range (a 400-digit literal, valid
    JSON) is not one, and math.isfinite raises OverflowError on it."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False
