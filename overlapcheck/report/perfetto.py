"""A Chrome-trace JSON of every rank, for Perfetto UI (ui.perfetto.dev) and chrome://tracing.

`PerfettoRenderer().render(report)` writes the Report's in-memory timelines (`Report.timelines`, built with
`--perfetto` or `--html`) as one trace: one process per rank (`rank N (host)`), under it a track per GPU stream
with the original kernels, copies and collectives, a `steps` track (each `ProfilerStep#N` and its forward /
backward / optimizer phases), an `exposed communication` track whose slices are exactly the intervals the
metrics count as exposed (their durations add up to the rank's `collectives.all.exposed_us`), a track per
finding (a slice on each window of the rank where it blames events, else on each step where it occurs, with its
title, cost, fix and `drawn_on` in args), and
host tracks with the syncs, waits and late launches the findings blame. The clocks of ranks are aligned on a
collective every rank ran (docs/metrics.md, "Aligning ranks"); the shift of each rank is in `metadata`.
"""

from __future__ import annotations

import gzip
import heapq
import json
import math
from typing import Any

from overlapcheck.errors import UserError
from overlapcheck.model import Blame, Finding, Report, Timeline
from overlapcheck.report import present as P
from overlapcheck.report.base import expect_report

MAX_EVENTS_TOTAL = 3_000_000  # activity slices over all ranks ...
MAX_EVENTS_RANK = 60_000  # ... and per rank; a rank keeps at least MIN_EVENTS_RANK
MIN_EVENTS_RANK = 5_000

# track ids (tid) of the tracks that are not GPU streams, in display order
STEPS_TID = 1_000_000_000
EXPOSED_TID = 1_000_000_001
FINDING_TID = 1_000_001_000  # + the finding's index
HOST_TIDS = {"sync": 1_000_002_000, "wait": 1_000_002_001, "late-launch": 1_000_002_002, "exposed": 1_000_002_003}
HOST_LABELS = {
    "sync": "host: blamed syncs",
    "wait": "host: blamed stream waits",
    "late-launch": "host: late launches (compute idle)",
    "exposed": "blamed exposed communication",
}


class PerfettoRenderer:
    """Every rank's timeline as one Chrome-trace JSON document; gzip-compressed bytes when `compress`."""

    name = "perfetto"
    extension = ".json"

    def __init__(self, compress: bool = False) -> None:
        self.compress = compress

    def render(self, report: Report) -> str | bytes:
        """The document; a UserError when the report holds no timeline (it was analyzed without them: an empty
        trace would look like a job with no events), or no rank at all."""
        report = expect_report(report)
        if not report.ranks:
            raise UserError("the report has no ranks: no timeline to export")
        if not report.timelines:
            raise UserError(
                "the report has no timelines: analyze with timelines=True (the CLI's --perfetto does) to export them"
            )
        text = json.dumps(trace_document(report), separators=(",", ":"), allow_nan=False)
        return gzip.compress(text.encode("utf-8"), mtime=0) if self.compress else text

    @classmethod
    def for_path(cls, path: str) -> PerfettoRenderer:
        """The renderer for an output file: gzip when it ends with .gz."""
        return cls(compress=path.lower().endswith(".gz"))


def clock_shifts(timelines: dict[int, Timeline]) -> tuple[dict[int, float], str]:
    """Per rank, the µs to add to its times so that the end of the first collective every rank has (matched by
    process group, kind and order, the lowest rank's order; send/recv only when there is no other) coincides
    with the lowest rank's; and how."""
    ranks = sorted(timelines)
    if len(ranks) < 2:
        return dict.fromkeys(ranks, 0.0), "one rank: no alignment needed"
    ends = {r: dict(reversed(timelines[r].anchors)) for r in ranks}  # the first end of each key
    ref = ranks[0]
    # a collective's kernels end together on every rank; point-to-point transfers need not: they come last
    keys = sorted((k for k, _ in timelines[ref].anchors), key=lambda k: k.split("|")[1] == "send_recv")
    for key in keys:
        if all(key in ends[r] for r in ranks):
            return (
                {r: ends[ref][key] - ends[r][key] for r in ranks},
                f"aligned on the end of collective {key!r} (process group|kind|n-th), shared by every rank, "
                f"at rank {ref}'s time",
            )
    return dict.fromkeys(ranks, 0.0), "not aligned: no collective shared by every rank; each rank's own clock"


def trace_document(report: Report) -> dict[str, Any]:
    """The Chrome-trace JSON object (traceEvents, displayTimeUnit, metadata)."""
    timelines = report.timelines
    shifts, how = clock_shifts(timelines)
    origin = min((tl.t0 + shifts[r] for r, tl in timelines.items()), default=0.0)
    budget = max(MIN_EVENTS_RANK, min(MAX_EVENTS_RANK, MAX_EVENTS_TOTAL // max(len(timelines), 1)))
    hosts = {r.rank: r.host for r in report.ranks}
    events: list[dict[str, Any]] = []
    omitted: dict[str, int] = {}
    for rank, tl in sorted(timelines.items()):
        offset = tl.t0 + shifts[rank] - origin  # rank time - t0 + offset = trace time
        n = _rank_events(events, report, rank, hosts.get(rank), tl, offset, shifts[rank] - origin, budget)
        if n:
            omitted[str(rank)] = n
    return {  # metadata first: `analyze FOLDER` knows this file by its first bytes (pipeline._own_output)
        "metadata": {
            "generator": f"overlapcheck {report.tool.version}",
            "clock_alignment": how,
            "clock_shift_us": {str(r): round(s, 3) for r, s in sorted(shifts.items())},
            "time_origin_us": round(origin, 3),
            "ranks": sorted(timelines),
            "ranks_without_events": [r.rank for r in report.ranks if r.rank not in timelines],
            "omitted_short_activities": omitted,
            "exposed_track": "exposed communication = union of communication minus union of compute "
            "(docs/metrics.md); its slices add up to each rank's collectives.all.exposed_us",
        },
        "displayTimeUnit": "ms",
        "traceEvents": events,
    }


def _rank_events(
    out: list[dict[str, Any]],
    report: Report,
    rank: int,
    host: str | None,
    tl: Timeline,
    offset: float,
    abs_offset: float,
    budget: int,
) -> int:
    pid = rank + 1  # pid 0 is special to some viewers
    label = f"rank {rank} ({host})" if host else f"rank {rank}"
    out.append(_meta(pid, None, "process_name", {"name": label}))
    out.append(_meta(pid, None, "process_sort_index", {"sort_index": rank}))

    def thread(tid: int, name: str, order: int) -> None:
        out.append(_meta(pid, tid, "thread_name", {"name": name}))
        out.append(_meta(pid, tid, "thread_sort_index", {"sort_index": order}))

    def ts(t: float) -> float:
        return round(t + offset, 3)

    # steps and phases (phases made contiguous so that they nest under their step)
    if tl.steps:
        thread(STEPS_TID, "steps and phases", 0)
    for s in tl.steps:
        out.append(
            _slice(
                pid,
                STEPS_TID,
                f"ProfilerStep#{s.step}",
                "step",
                ts(s.start),
                s.end - s.start,
                {"step": s.step, "cpu_start_us": ts(s.cpu_start), "cpu_end_us": ts(s.cpu_end)},
            )
        )
        prev = s.start
        for phase in ("forward", "backward", "optimizer"):
            if phase not in s.phases:
                continue
            a, b = max(s.phases[phase][0], prev), min(s.phases[phase][1], s.end)
            if b > a:
                out.append(_slice(pid, STEPS_TID, phase, "phase", ts(a), b - a, {"step": s.step}))
                prev = b

    # findings: a slice on each window of this rank's timeline the finding blames, else on each of its steps
    numbers = P.finding_numbers(report)  # as the terminal, the Markdown and the HTML page number them
    for i, f in enumerate(report.findings):
        if rank not in f.ranks:
            continue
        tid = FINDING_TID + i
        thread(tid, f"finding {numbers[i]}: {P.safe_line(f.title)[:80]}", numbers[i])
        windows, drawn_on = finding_windows(i, f, tl)
        shown = {**_finding_args(f, i, numbers[i]), "drawn_on": drawn_on}
        for a, b in windows:
            out.append(_slice(pid, tid, P.safe_line(f.title), f"finding:{f.severity}", ts(a), b - a, shown))

    # exposed communication: every interval, never capped (the metric adds them up)
    thread(EXPOSED_TID, "exposed communication", 1 + len(report.findings))
    for (a, b), where in zip(tl.exposed, _exposed_args(tl), strict=True):
        out.append(_slice(pid, EXPOSED_TID, "exposed communication", "exposed", ts(a), b - a, where))

    # GPU streams (or gloo CPU lanes)
    base = 10 + len(report.findings)
    tids = {}
    for n, lane in enumerate(tl.lanes):
        tid = lane.stream if lane.stream is not None else -(n + 1) % 1_000_000
        tids[lane.id] = tid
        thread(tid, P.safe_line(lane.label), base + n)
    rows = tl.events
    omitted = tl.omitted
    if len(rows) > budget:
        rows = sorted(rows, key=lambda e: (not str(e[3]).startswith("comm"), -e[2]))[:budget]
        omitted += len(tl.events) - budget
    for ev in rows:
        lane, start, dur, cls, name = ev[0], ev[1], ev[2], str(ev[3]), ev[4]
        args: dict[str, Any] = {"class": cls.split(":")[0]}
        if cls.startswith("comm:"):
            args["collective"] = cls[5:]
        if lane in tids and tl.lanes[lane].stream is not None:
            args["stream"] = tl.lanes[lane].stream
        if len(ev) > 5 and ev[5] >= 0:
            args["step"] = ev[5]
        if len(ev) > 6 and ev[6] >= 0:
            args["nelems"] = ev[6]
        if len(ev) > 7 and ev[7] >= 0:
            args["bytes"] = ev[7]
        if len(ev) > 8 and isinstance(ev[8], str):
            args["module"] = P.safe_line(ev[8])
        text = tl.names[name] if isinstance(name, int) and 0 <= name < len(tl.names) else cls
        out.append(_slice(pid, tids.get(lane, 0), text, cls, ts(start), dur, args))

    # host events the findings blame (absolute trace times)
    kinds = sorted({b.kind for b in tl.host}, key=list(HOST_TIDS).index)
    for k, kind in enumerate(kinds):
        thread(HOST_TIDS[kind], HOST_LABELS[kind], base + len(tl.lanes) + k)
    for bl in tl.host:
        out.append(
            _slice(
                pid,
                HOST_TIDS[bl.kind],
                P.safe_line(bl.call),
                f"blame:{bl.kind}",
                round(bl.start + abs_offset, 3),
                bl.end - bl.start,
                _blame_args(bl, report, numbers),
            )
        )
    return omitted


def _exposed_args(tl: Timeline) -> list[dict[str, Any]]:
    """Per exposed interval, the collectives (and up to 3 kernel names) whose kernels it lies in: one sweep over
    the communication events by start, keeping those not yet ended (the intervals are sorted and disjoint)."""
    comm = sorted(
        (float(e[1]), float(e[1]) + float(e[2]), str(e[3])[5:], int(e[4]))
        for e in tl.events
        if str(e[3]).startswith("comm:")
    )
    out: list[dict[str, Any]] = []
    active: list[tuple[float, int]] = []
    j = 0
    for a, b in tl.exposed:
        while j < len(comm) and comm[j][0] < b:
            heapq.heappush(active, (comm[j][1], j))
            j += 1
        while active and active[0][0] <= a:
            heapq.heappop(active)
        hits = sorted(k for _, k in active)
        kinds = sorted({comm[k][2] for k in hits})
        names = list(dict.fromkeys(P.safe_line(tl.names[comm[k][3]])[:200] for k in hits if comm[k][3] >= 0))
        out.append({"collectives": kinds, "kernels": names[:3]} if kinds else {})
    return out


def finding_windows(index: int, f: Finding, tl: Timeline) -> tuple[list[tuple[float, float]], str]:
    """Where finding `index` is drawn on a rank's timeline (times relative to `tl.t0`), and how that was chosen.
    A finding that blames events on the rank (its host syncs, the waits and late launches it reports, the exposed
    communication it charges: `Timeline.host`) is drawn on them, overlapping ones merged into one slice; one that
    blames none on the rank (a cross-rank finding such as a straggler, a bandwidth finding: they carry no time
    windows out of the diagnosis) on each step it occurs in, or the whole timeline when it has no steps."""
    mine = sorted((b.start - tl.t0, b.end - tl.t0) for b in tl.host if b.finding == index)
    if mine:
        merged: list[list[float]] = []
        for a, b in mine:
            if merged and a <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        return [(a, b) for a, b in merged], f"the {len(mine)} events it blames on this rank"
    step_window = {s.step: (s.start, s.end) for s in tl.steps}
    windows = [step_window[s] for s in f.steps if s in step_window]
    if windows:
        return windows, "each step it occurs in (it blames no event on this rank)"
    if not tl.steps:
        return [(0.0, tl.duration)], "the whole timeline (no steps, no event it blames)"
    return [], "nowhere: none of its steps is on this timeline"


def _finding_args(f: Finding, index: int, number: int) -> dict[str, Any]:
    return {
        "finding": number,  # the number every output shows
        "finding_index": index,  # into the JSON report's findings
        "rule": f.rule,
        "severity": f.severity,
        "title": f.title,
        "cost_us": _finite(f.cost_us),
        "fix": "; ".join(P.fix_lines(f.fix)) or "none: see why",
        "why": f.why,
        "html_anchor": f"#finding-{index}",
    }


def _blame_args(b: Blame, report: Report, numbers: list[int]) -> dict[str, Any]:
    args: dict[str, Any] = {"rule": b.rule, "call": b.call, "cost_us": _finite(round(b.cost_us, 3))}
    if b.thread >= 0:
        args["thread" if b.kind == "sync" else "stream"] = b.thread
    if b.step is not None:
        args["step"] = b.step
    if 0 <= b.finding < len(report.findings):
        args["finding"] = numbers[b.finding]
        args["finding_index"] = b.finding
        args["title"] = report.findings[b.finding].title
    return args


def _slice(
    pid: int, tid: int, name: str, cat: str, ts: float, dur: float, args: dict[str, Any] | None
) -> dict[str, Any]:
    ev: dict[str, Any] = {
        "ph": "X",
        "pid": pid,
        "tid": tid,
        "name": name,
        "cat": cat,
        "ts": ts,
        "dur": round(max(_finite(dur) or 0.0, 0.0), 3),
    }
    if args:
        ev["args"] = args
    return ev


def _meta(pid: int, tid: int | None, name: str, args: dict[str, Any]) -> dict[str, Any]:
    ev: dict[str, Any] = {"ph": "M", "pid": pid, "name": name, "args": args}
    if tid is not None:
        ev["tid"] = tid
    return ev


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None
