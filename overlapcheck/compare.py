"""What changed between two runs: the typed comparison of two Reports (`overlapcheck compare`, and the gate's
baseline checks). docs/compare-schema.md documents its JSON document, `overlapcheck.compare/1`.

`compare(before, after)` takes two Reports and never reads a file. Every value is per profiled step, from the
helpers the reports print with (`present.per_step`, medians across ranks), so that the numbers of a comparison
are the numbers the two reports show:

- ranks are compared on what the two reports share: the ranks present in both (a different world size is
  noted), each rank per step (a different number of profiled steps is noted). Two reports without a rank in
  common are compared on all ranks of each;
- per collective kind (and per phase): the median rank's overlap, exposed and total time per step, kernels per
  step, over the ranks that have that kind; a kind absent from one report counts as 0 µs, overlap n/a;
- per rank: its step period, exposed share, and per kind its overlap and exposed time per step;
- findings are matched by rule and by the evidence fields that tell findings of one rule apart (`distinct_by`,
  passed in by the caller: the diagnosis owns that table): appeared, disappeared, changed cost, or same.

Bus bandwidth (`bus_bandwidth_gbps`, per kind): the report's busbw at the transfer time across ranks, else the
median rank's (docs/metrics.md, Bandwidth); omitted when neither report has message sizes for that kind.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from overlapcheck.model import ALL, COLLECTIVE_KINDS, PHASES, Finding, Fix, RankMetrics, Report
from overlapcheck.report import present as P

SCHEMA = "overlapcheck.compare/1"
NOISE_US = 100.0  # per step: a change in exposed time or a finding's cost below this is not worth a headline
CHANGED_REL = 0.10  # ... and a finding's cost changed when it moved by more than 10 % and more than NOISE_US

DistinctBy = Mapping[str, Sequence[str]]  # rule id -> evidence fields that tell its findings apart


# ---------------------------------------------------------------------------------------------- the model


@dataclass(frozen=True)
class Delta:
    """One value before and after, and the change (after − before; None when either is unknown)."""

    before: float | None
    after: float | None
    change: float | None

    @classmethod
    def of(cls, before: float | None, after: float | None) -> Delta:
        change = after - before if before is not None and after is not None else None
        return cls(before, after, change)

    @property
    def zero(self) -> bool:
        return not self.change


@dataclass(frozen=True)
class KindDelta:
    """One collective kind (or `all`), across the compared ranks: the median rank of each report."""

    kind: str
    overlap: Delta
    exposed_us_per_step: Delta
    time_us_per_step: Delta
    count_per_step: Delta
    # busbw (GB/s) of this kind in each report (docs/metrics.md, Bandwidth); omitted when neither has sizes
    bus_bandwidth_gbps: Delta | None = field(default=None, metadata={"omit_none": True})


@dataclass(frozen=True)
class PhaseDelta:
    """One collective kind within one phase (forward, backward, optimizer), per step, median rank."""

    phase: str
    kind: str
    overlap: Delta
    exposed_us_per_step: Delta
    time_us_per_step: Delta


@dataclass(frozen=True)
class RankKindDelta:
    overlap: Delta
    exposed_us_per_step: Delta
    time_us_per_step: Delta


@dataclass(frozen=True)
class RankDelta:
    """One rank present in both reports."""

    rank: int
    steps: Delta  # profiled steps
    step_period_us: Delta
    exposed_share: Delta
    kinds: dict[str, RankKindDelta]


@dataclass(frozen=True)
class FindingChange:
    """One finding matched across the two reports by `key` (rule + distinguishing evidence)."""

    status: str  # appeared, disappeared, changed, same
    rule: str
    key: str
    title: str
    severity_before: str | None = None
    severity_after: str | None = None
    cost_us: Delta = field(default_factory=lambda: Delta(None, None, None))
    ranks_before: list[int] = field(default_factory=list)
    ranks_after: list[int] = field(default_factory=list)
    fix: Fix = field(default_factory=Fix)  # the after finding's fix (the before's when it disappeared)


@dataclass(frozen=True)
class Side:
    """What one report held."""

    label: str  # "before" or "after"
    source: str | None  # what was read: a folder or a JSON report
    schema: str
    ranks: int
    world_size: int | None
    steps: int | None  # the median rank's profiled steps
    findings: int
    errors: int


@dataclass(frozen=True)
class Shared:
    """What the comparison was made on."""

    ranks: list[int]  # compared ranks (present in both); empty: all ranks of each were compared
    only_before: list[int]
    only_after: list[int]
    kinds: list[str]  # `all` and every kind present in either report
    phases: list[str]


@dataclass(frozen=True)
class RankValues:
    """One rank of one report, per step (in memory only: what the gate reduces by worst or median rank)."""

    rank: int
    steps: int
    step_period_us: float
    exposed_share: float | None
    count: dict[str, float]
    time_us: dict[str, float]
    exposed_us: dict[str, float]
    overlap: dict[str, float | None]


@dataclass(frozen=True)
class Comparison:
    """BEFORE against AFTER."""

    before: Side
    after: Side
    shared: Shared
    verdict: str
    step_period_us: Delta  # median rank
    exposed_share: Delta  # median rank
    kinds: list[KindDelta]
    phases: list[PhaseDelta]
    ranks: list[RankDelta]
    findings: list[FindingChange]
    notes: list[str]
    schema: str = SCHEMA
    before_values: list[RankValues] = field(default_factory=list, metadata={"json": False})
    after_values: list[RankValues] = field(default_factory=list, metadata={"json": False})

    def to_dict(self) -> dict[str, Any]:
        """The `overlapcheck.compare/1` document (docs/compare-schema.md); floats as computed."""
        out: dict[str, Any] = {"schema": self.schema}
        out.update((k, v) for k, v in _plain(self).items() if k != "schema")
        return out

    def kind(self, kind: str) -> KindDelta | None:
        return next((k for k in self.kinds if k.kind == kind), None)

    def changes(self, status: str) -> list[FindingChange]:
        return [f for f in self.findings if f.status == status]

    def values(self, side: str, kind: str, metric: str) -> list[tuple[int, float]]:
        """(rank, value) over one side's compared ranks: `exposed_us`/`time_us`/`count` per step over the ranks
        that have `kind` (a report without it: every rank at 0), `overlap` over the ranks where it is defined,
        `step_period_us` and `exposed_share` of every rank."""
        ranks = self.before_values if side == "before" else self.after_values
        if metric in ("step_period_us", "exposed_share"):
            return [(r.rank, v) for r in ranks if (v := getattr(r, metric)) is not None]
        if metric == "overlap":
            return [(r.rank, v) for r in ranks if (v := r.overlap.get(kind)) is not None]
        having = [r for r in ranks if r.count.get(kind, 0.0) > 0]
        if not having:
            return [(r.rank, 0.0) for r in ranks]
        return [(r.rank, getattr(r, metric)[kind]) for r in having]


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = {}
        for f in dataclasses.fields(value):
            item = getattr(value, f.name)
            if f.metadata.get("json") is False or (item is None and f.metadata.get("omit_none")):
                continue
            out[f.name] = _plain(item)
        if isinstance(value, Fix):
            out = {k: v for k, v in out.items() if v is not None}
        return out
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


# ------------------------------------------------------------------------------------------ per-rank values


def step_period_us(rank: RankMetrics) -> float:
    """The rank's step time per profiled step: the mean of its steps' periods when the report has them
    (`StepMetrics.period_us`), else its step time over its steps, as the reports print it."""
    periods = [float(p) for s in rank.steps if isinstance(p := getattr(s, "period_us", None), int | float)]
    if periods and len(periods) == len(rank.steps):
        return sum(periods) / len(periods)
    return rank.step_time_us / P.steps_of(rank)


def rank_values(rank: RankMetrics, kinds: Iterable[str]) -> RankValues:
    kinds = list(kinds)
    return RankValues(
        rank=rank.rank if rank.rank is not None else -1,
        steps=len(rank.steps),
        step_period_us=step_period_us(rank),
        exposed_share=rank.exposed_share,
        count={k: P.per_step(rank, k, "count") for k in kinds},
        time_us={k: P.per_step(rank, k, "time_us") for k in kinds},
        exposed_us={k: P.per_step(rank, k, "exposed_us") for k in kinds},
        overlap={k: rank.overlap(k) for k in kinds},
    )


def phase_split(rank: RankMetrics, phase: str, kind: str) -> tuple[float, float, float] | None:
    """(time, exposed, overlapped) µs per step of `kind` in `phase`, over the rank's steps that have phases;
    None when none has this phase."""
    having = [s.phases[phase].collectives[kind] for s in rank.steps if phase in s.phases]
    if not having:
        return None
    n = len(having)
    return (
        sum(c.time_us for c in having) / n,
        sum(c.exposed_us for c in having) / n,
        sum(c.overlapped_us for c in having) / n,
    )


def _med(pairs: Sequence[tuple[int, float]]) -> float | None:
    return statistics.median(v for _, v in pairs) if pairs else None


def _median_steps(ranks: Sequence[RankMetrics]) -> int | None:
    counts = sorted(len(r.steps) for r in ranks)
    return counts[len(counts) // 2] if counts else None


# ------------------------------------------------------------------------------------------------- findings


def finding_key(finding: Finding, distinct_by: DistinctBy) -> str:
    """The rule, and the evidence fields of `distinct_by[rule]` (as JSON, so a report read back from its document
    matches the one analyzed in memory): `host-sync|["cudaStreamSynchronize"]|"stage3.py(2418): f"`."""
    fields = distinct_by.get(finding.rule, ())
    parts = [json.dumps(finding.evidence.get(f), sort_keys=True, default=str) for f in fields]
    return "|".join([finding.rule, *parts])


def _match_findings(before: Report, after: Report, distinct_by: DistinctBy) -> list[FindingChange]:
    def index(report: Report) -> dict[str, Finding]:
        out: dict[str, Finding] = {}
        for f in report.findings:  # ranked costliest first: the first of a key wins
            out.setdefault(finding_key(f, distinct_by), f)
        return out

    b, a = index(before), index(after)
    out = []
    for key in [*a, *(k for k in b if k not in a)]:
        fb, fa = b.get(key), a.get(key)
        one = fa or fb
        assert one is not None
        cost = Delta.of(fb.cost_us if fb else None, fa.cost_us if fa else None)
        if fb is None:
            status = "appeared"
        elif fa is None:
            status = "disappeared"
        else:
            change = abs(fa.cost_us - fb.cost_us)
            status = "changed" if change > max(CHANGED_REL * abs(fb.cost_us), NOISE_US) else "same"
        out.append(
            FindingChange(
                status=status,
                rule=one.rule,
                key=key,
                title=one.title,
                severity_before=fb.severity if fb else None,
                severity_after=fa.severity if fa else None,
                cost_us=cost,
                ranks_before=list(fb.ranks) if fb else [],
                ranks_after=list(fa.ranks) if fa else [],
                fix=one.fix,
            )
        )
    order = {"appeared": 0, "changed": 1, "disappeared": 2, "same": 3}

    def weight(c: FindingChange) -> float:
        if c.status == "changed":
            return abs(c.cost_us.change or 0.0)
        return max(c.cost_us.before or 0.0, c.cost_us.after or 0.0)

    out.sort(key=lambda c: (order[c.status], -weight(c), c.key))
    return out


# ---------------------------------------------------------------------------------------------- compare


def _busbw(report: Report, kind: str) -> float | None:
    """A kind's busbw (GB/s) in one report: at the transfer time across ranks, else the median rank's own
    kernels (docs/metrics.md, Bandwidth); None when the report has no message sizes for it."""
    job = report.bandwidth.kinds.get(kind) if report.bandwidth is not None else None
    if job is not None and job.busbw_gbps is not None:
        return job.busbw_gbps
    values = sorted(v for r in report.ranks if (b := r.bandwidth.get(kind)) and (v := b.busbw_gbps) is not None)
    return values[len(values) // 2] if values else None


def _busbw_delta(before: Report, after: Report, kind: str) -> Delta | None:
    """The bus bandwidth slot of a KindDelta; None (omitted) when neither report measures it."""
    b, a = _busbw(before, kind), _busbw(after, kind)
    return None if b is None and a is None else Delta.of(b, a)


def compare(
    before: Report,
    after: Report,
    distinct_by: DistinctBy | None = None,
    sources: tuple[str | None, str | None] = (None, None),
    same_input: bool = False,
) -> Comparison:
    """What changed from `before` to `after` (docs/compare-schema.md). `same_input`: both sides were read from one
    file or folder (said first in the notes: nothing can have changed)."""
    distinct_by = distinct_by or {}
    labels = ("before", "after")
    notes: list[str] = []
    if same_input:
        notes.append(f"{labels[0]} and {labels[1]} are the same input: nothing can have changed")
    b_ranks = {r.rank: r for r in before.ranks if r.rank is not None}
    a_ranks = {r.rank: r for r in after.ranks if r.rank is not None}
    shared = sorted(set(b_ranks) & set(a_ranks))
    only_b = sorted(set(b_ranks) - set(a_ranks))
    only_a = sorted(set(a_ranks) - set(b_ranks))
    if shared:
        b_used, a_used = [b_ranks[r] for r in shared], [a_ranks[r] for r in shared]
        if only_b or only_a:
            notes.append(
                f"{labels[0]} has {len(b_ranks)} ranks, {labels[1]} {len(a_ranks)}: compared on the "
                f"{len(shared)} ranks in both ({P.rank_ranges(shared)})"
            )
    else:
        b_used, a_used = list(b_ranks.values()), list(a_ranks.values())
        if b_used and a_used:
            notes.append(
                f"no rank is in both reports ({labels[0]}: {P.rank_ranges(b_ranks)}, {labels[1]}: "
                f"{P.rank_ranges(a_ranks)}): compared the median rank of each"
            )
    b_world = _world_size(before)
    a_world = _world_size(after)
    if b_world is not None and a_world is not None and b_world != a_world:
        notes.append(f"world size differs: {b_world} ({labels[0]}) vs {a_world} ({labels[1]})")
    b_steps, a_steps = _median_steps(b_used), _median_steps(a_used)
    if b_steps != a_steps:
        notes.append(
            f"{labels[0]} profiled {b_steps} steps per rank, {labels[1]} {a_steps}: compared per step "
            "(the mean over each rank's steps)"
        )
    for label, report in zip(labels, (before, after), strict=True):
        if report.errors:
            notes.append(f"{label}: {len(report.errors)} input(s) could not be read when it was analyzed")

    # a side with no communication on any rank (no GPU kernels, an empty capture) has nothing to compare: its
    # values are left out, never taken as zeros (an empty AFTER would read as every exposure removed)
    empty = [label for label, used in zip(labels, (b_used, a_used), strict=True) if used and not _measured(used)]
    if empty:
        notes.append(
            f"{' and '.join(empty)} measured no communication on any rank (no NCCL kernels or gloo collectives in "
            "its traces: an empty capture, or a window with no collective?): nothing to compare"
        )
        b_used, a_used = ([] if "before" in empty else b_used), ([] if "after" in empty else a_used)
    kinds = [ALL, *(k for k in COLLECTIVE_KINDS if k in set(P.present_kinds(b_used)) | set(P.present_kinds(a_used)))]
    b_vals = [rank_values(r, kinds) for r in b_used]
    a_vals = [rank_values(r, kinds) for r in a_used]
    skeleton = Comparison(
        before=_side(before, labels[0], sources[0]),
        after=_side(after, labels[1], sources[1]),
        shared=Shared(shared, only_b, only_a, kinds, []),
        verdict="",
        step_period_us=Delta(None, None, None),
        exposed_share=Delta(None, None, None),
        kinds=[],
        phases=[],
        ranks=[],
        findings=[],
        notes=notes,
        before_values=b_vals,
        after_values=a_vals,
    )

    def med(side: str, kind: str, metric: str) -> float | None:
        return _med(skeleton.values(side, kind, metric))

    kind_deltas = []
    for kind in kinds:
        kind_deltas.append(
            KindDelta(
                kind=kind,
                overlap=Delta.of(med("before", kind, "overlap"), med("after", kind, "overlap")),
                exposed_us_per_step=Delta.of(med("before", kind, "exposed_us"), med("after", kind, "exposed_us")),
                time_us_per_step=Delta.of(med("before", kind, "time_us"), med("after", kind, "time_us")),
                count_per_step=Delta.of(med("before", kind, "count"), med("after", kind, "count")),
                bus_bandwidth_gbps=_busbw_delta(before, after, kind),
            )
        )
    phases, phase_deltas = _phases(b_used, a_used, kinds)
    rank_deltas = []
    if shared and not empty:
        by_b = {v.rank: v for v in b_vals}
        by_a = {v.rank: v for v in a_vals}
        for r in shared:
            vb, va = by_b[r], by_a[r]
            rank_deltas.append(
                RankDelta(
                    rank=r,
                    steps=Delta.of(vb.steps, va.steps),
                    step_period_us=Delta.of(vb.step_period_us, va.step_period_us),
                    exposed_share=Delta.of(vb.exposed_share, va.exposed_share),
                    kinds={
                        k: RankKindDelta(
                            overlap=Delta.of(vb.overlap[k], va.overlap[k]),
                            exposed_us_per_step=Delta.of(vb.exposed_us[k], va.exposed_us[k]),
                            time_us_per_step=Delta.of(vb.time_us[k], va.time_us[k]),
                        )
                        for k in kinds
                    },
                )
            )
    result = dataclasses.replace(
        skeleton,
        shared=Shared(shared, only_b, only_a, kinds, phases),
        step_period_us=Delta.of(med("before", ALL, "step_period_us"), med("after", ALL, "step_period_us")),
        exposed_share=Delta.of(med("before", ALL, "exposed_share"), med("after", ALL, "exposed_share")),
        kinds=kind_deltas,
        phases=phase_deltas,
        ranks=rank_deltas,
        findings=_match_findings(before, after, distinct_by),
    )
    verdict = verdict_line(result)
    if empty:
        verdict = (
            f"Not comparable: {' and '.join(empty)} measured no communication (an empty capture?), so no change "
            "can be told; compare again once both runs hold their communication kernels"
        )
    elif b_world is not None and a_world is not None and b_world != a_world:
        # said first: a world-size change moves every per-step number, whatever the change under test did
        verdict = (
            f"Not like for like: {labels[0]} ran on {b_world} ranks, {labels[1]} on {a_world} (another job?), so "
            f"step times and exposure differ for that alone. {verdict}"
        )
    return dataclasses.replace(result, verdict=verdict)


def _measured(ranks: Sequence[RankMetrics]) -> bool:
    """Whether any of `ranks` holds a collective."""
    return any(r.collectives[ALL].count for r in ranks)


def _world_size(report: Report) -> int | None:
    sizes = {r.world_size for r in report.ranks if r.world_size is not None}
    return max(sizes) if sizes else None


def _side(report: Report, label: str, source: str | None) -> Side:
    return Side(
        label=label,
        source=source,
        schema=report.schema,
        ranks=len(report.ranks),
        world_size=_world_size(report),
        steps=_median_steps(report.ranks),
        findings=len(report.findings),
        errors=len(report.errors),
    )


def _phases(
    b_used: Sequence[RankMetrics], a_used: Sequence[RankMetrics], kinds: Sequence[str]
) -> tuple[list[str], list[PhaseDelta]]:
    phases: list[str] = []
    out: list[PhaseDelta] = []
    for phase in PHASES:
        rows = []
        for kind in kinds:
            sides = []
            for ranks in (b_used, a_used):
                splits = [s for r in ranks if (s := phase_split(r, phase, kind)) is not None]
                having = [s for s in splits if s[0] > 0] or splits
                sides.append(
                    (
                        _median_of(s[0] for s in having),
                        _median_of(s[1] for s in having),
                        _median_of(s[2] / s[0] for s in having if s[0] > 0),
                    )
                )
            (bt, be, bo), (at, ae, ao) = sides
            if bt is None and at is None:
                continue
            if not (bt or at):  # no such communication in this phase on either side
                continue
            rows.append(PhaseDelta(phase, kind, Delta.of(bo, ao), Delta.of(be, ae), Delta.of(bt, at)))
        if rows:
            phases.append(phase)
            out += rows
    return phases, out


def _median_of(values: Iterable[float]) -> float | None:
    v = list(values)
    return statistics.median(v) if v else None


# ----------------------------------------------------------------------------------------------- verdict


def signed_ms(us: float | None) -> str:
    """+11.9 ms/step style: −0.12, +4.94 (ms, two decimals)."""
    if us is None or not math.isfinite(us):
        return "n/a"
    value = round(us / 1000, 2) or 0.0  # no "−0.00"
    return f"{value:+.2f}".replace("-", "−")


def verdict_line(c: Comparison) -> str:
    """One line: the biggest changes of exposed time per step (per kind), the findings that appeared and
    disappeared, and the fix of the costliest new finding."""
    after = c.after.label
    parts: list[str] = []
    moved = sorted(
        (k for k in c.kinds if k.kind != ALL and abs(k.exposed_us_per_step.change or 0.0) >= NOISE_US),
        key=lambda k: -abs(k.exposed_us_per_step.change or 0.0),
    )
    if moved:
        text = ", ".join(
            f"{P.KIND_LABELS[k.kind]} exposed {signed_ms(k.exposed_us_per_step.change)} ms/step" for k in moved[:2]
        )
        step = c.step_period_us.change
        if step is not None and abs(step) >= NOISE_US:
            text += f" (step {signed_ms(step)} ms)"
        parts.append(text)
    else:
        total = c.kind(ALL)
        change = total.exposed_us_per_step.change if total else None
        parts.append(
            "exposed communication unchanged"
            + (f" ({signed_ms(change)} ms/step)" if change and abs(change) >= 1.0 else "")
        )
    new = c.changes("appeared")
    if new:
        text = "new: " + ", ".join(f"{f.rule} ({P.ms(f.cost_us.after)} ms/step)" for f in new[:3])
        if len(new) > 3:
            text += f" and {len(new) - 3} more"
        fixes = P.fix_lines(new[0].fix)
        if fixes:
            text += f", fix: {fixes[0]}"
        parts.append(text)
    gone = c.changes("disappeared")
    if gone:
        parts.append("gone: " + ", ".join(f.rule for f in gone[:3]) + (" ..." if len(gone) > 3 else ""))
    changed = c.changes("changed")
    if changed and not new and not gone:
        f = changed[0]
        parts.append(f"{f.rule} {signed_ms(f.cost_us.change)} ms/step")
    if not new and not gone and not changed:
        parts.append("same findings")
    return f"{after}: " + "; ".join(parts)


__all__ = [
    "SCHEMA",
    "Comparison",
    "Delta",
    "FindingChange",
    "KindDelta",
    "PhaseDelta",
    "RankDelta",
    "compare",
    "finding_key",
    "step_period_us",
    "verdict_line",
]
