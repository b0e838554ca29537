"""How the report reads to a person, in one place for every output (terminal, HTML, Markdown, JUnit, gate):
labels, units, number formats, the verdict, fix lines, and text made safe to print.

Conventions: times are per profiled step (ms/step) unless labelled `total`; a value across ranks is the
median rank unless labelled (`worst`); every column header carries its unit.
"""

from __future__ import annotations

import json
import re
import shlex
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from overlapcheck.model import ALL, COLLECTIVE_KEYS, COLLECTIVE_KINDS, Finding, Fix, RankMetrics, Report

KIND_LABELS = {
    "all": "all",
    "reduce_scatter": "reduce-scatter",
    "all_gather": "all-gather",
    "all_reduce": "all-reduce",
    "all_to_all": "all-to-all",
    "send_recv": "send/recv",
    "broadcast": "broadcast",
    "other": "other",
}
KIND_SHORT = {
    "all": "all",
    "reduce_scatter": "RS",
    "all_gather": "AG",
    "all_reduce": "AR",
    "all_to_all": "A2A",
    "send_recv": "P2P",
    "broadcast": "BC",
    "other": "other",
}
GOOD_OVERLAP, FAIR_OVERLAP = 0.8, 0.5  # overlap at or above: hidden well / partly hidden
GOOD_SHARE, FAIR_SHARE = 0.05, 0.15  # exposed share of the step below: well hidden / some exposed
MAX_RANK_ROWS = 16  # ranks listed in the terminal and Markdown (worst first)


# -- numbers ---------------------------------------------------------------------------------------------------


def pct(value: float | None) -> str:
    """0.123 -> '12.3%'."""
    return "n/a" if value is None else f"{100 * value:.1f}%"


def ms(us: float | None) -> str:
    """Microseconds as milliseconds with two decimals: 1234.5 -> '1.23'."""
    return "n/a" if us is None else f"{us / 1000:.2f}"


def duration(us: float | None) -> str:
    """Microseconds for people: 850 µs, 12.3 ms, 1.20 s."""
    if us is None:
        return "n/a"
    if abs(us) >= 1e6:
        return f"{us / 1e6:.2f} s"
    if abs(us) >= 1e3:
        return f"{us / 1e3:.1f} ms"
    return f"{us:.0f} µs"


def rank_ranges(ranks: Iterable[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> '0-2, 5, 7-8'."""
    values = sorted(set(ranks))
    parts, i = [], 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[j] + 1:
            j += 1
        parts.append(str(values[i]) if i == j else f"{values[i]}-{values[j]}")
        i = j + 1
    return ", ".join(parts)


# C0/C1 controls (ANSI and OSC escapes start with them) and the bidirectional controls that reorder what a
# reader sees ("Trojan Source": U+202A-U+202E, U+2066-U+2069, the marks U+200E, U+200F, U+061C)
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _shown(char: str) -> str:
    code = ord(char)
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def safe(text: object) -> str:
    """A string from a trace made safe for a terminal or a text file: control characters (ANSI and OSC
    escapes among them) and bidirectional overrides are shown as `\\xNN` / `\\uNNNN` instead of acting."""
    return _CONTROL.sub(lambda m: _shown(m.group()), str(text))


def safe_path(path: object) -> str:
    """A file name the user gave or a trace named, as a confirmation line shows it: `safe`, with its newlines and
    tabs shown too (a name is never reflowed)."""
    return safe(path).replace("\n", "\\x0a").replace("\t", "\\x09")


def safe_line(text: object) -> str:
    """`safe`, on one line."""
    return safe(" ".join(str(text).split()))


# -- per-step values -------------------------------------------------------------------------------------------


def steps_of(rank: RankMetrics) -> int:
    """Profiled steps of a rank (a trace without steps counts as one)."""
    return max(1, len(rank.steps))


def per_step(rank: RankMetrics, kind: str, metric: str) -> float:
    """A collective metric (`count`, `time_us`, `exposed_us`, `overlapped_us`) per profiled step: the mean over
    the rank's steps, or the whole trace when it has none."""
    if rank.steps:
        return sum(float(getattr(s.collectives[kind], metric)) for s in rank.steps) / len(rank.steps)
    return float(getattr(rank.collectives[kind], metric))


def median(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def present_kinds(ranks: Sequence[RankMetrics]) -> list[str]:
    """Collective kinds (not `all`) that some rank has, in report order."""
    return [k for k in COLLECTIVE_KINDS if any(r.collectives[k].count for r in ranks)]


def worst_first(ranks: Sequence[RankMetrics]) -> list[RankMetrics]:
    """Ranks by overlap, lowest first (ranks without communication last), then by rank."""
    return sorted(ranks, key=lambda r: (r.overlap() is None, r.overlap() or 0.0, r.rank or 0))


def mean_step_us(rank: RankMetrics) -> float:
    """The rank's step time per profiled step: the mean step period (docs/metrics.md), the span without steps."""
    return rank.step_time_us / steps_of(rank)


def compute_per_step(rank: RankMetrics) -> float:
    """Compute launched per profiled step (µs): the mean of the steps' own compute, the whole trace without steps."""
    return sum(s.compute_us for s in rank.steps) / len(rank.steps) if rank.steps else rank.compute_us


# the per-rank columns every output shows (terminal, Markdown, HTML), with their units, and their texts
RANK_COLUMNS = ("overlap", "exposed ms/step", "exposed % of step", "step ms/step", "idle ms total")
RANK_CAPTION = (
    "per step: the mean over the rank's profiled steps; step: the step's period, from the end of the previous "
    "step's GPU work to the end of its own; idle: total over the trace"
)


def rank_cells(rank: RankMetrics) -> dict[str, str]:
    """The texts of RANK_COLUMNS for one rank, identical in every output."""
    return {
        "overlap": pct(rank.overlap()),
        "exposed ms/step": ms(per_step(rank, ALL, "exposed_us")),
        "exposed % of step": pct(rank.exposed_share),
        "step ms/step": ms(mean_step_us(rank)),
        "idle ms total": ms(rank.idle_us),
    }


def outside_steps_line(report: Report) -> str | None:
    """What the ranks ran outside their profiled steps (docs/metrics.md), when any did: counted in the
    whole-trace numbers, in no step. Values of the median rank among those that have any (the lower median,
    so that every value is one rank's)."""
    having = [r.outside_steps for r in report.ranks if r.outside_steps is not None and r.outside_steps.count]
    if not having:
        return None
    before = [r.before_first_step.count if r.before_first_step else 0 for r in report.ranks if r.outside_steps]
    n = len(report.ranks)
    which = f"{len(having)} of {n} ranks" if len(having) != n else f"all {n} rank{'s' if n != 1 else ''}"
    count = statistics.median_low(o.count for o in having)
    comm = statistics.median_low(o.collectives[ALL].count for o in having)
    exposed = statistics.median_low(o.collectives[ALL].exposed_us for o in having)
    return (
        f"outside the profiled steps ({which}, median): {count} GPU activities, {statistics.median_low(before)} "
        "of them before the first step (launched before it or without a launch in the trace: the tail of the "
        f"unprofiled iteration before it), {comm} communication kernels, {ms(exposed)} ms exposed in total; "
        "counted in the whole-trace numbers, in no step"
    )


@dataclass(frozen=True)
class KindRow:
    """One collective kind across ranks: medians per step, and the worst rank's overlap."""

    kind: str
    label: str
    count_per_step: float
    overlap: float | None
    worst_overlap: float | None
    worst_rank: int | None
    exposed_us_per_step: float
    time_us_per_step: float
    hidden_us_per_step: float
    mb_per_step: float | None = None  # bytes per step (1e6), median rank; None: sizes unknown
    busbw_gbps: float | None = None  # at the transfer time across ranks, else the median rank's own kernels


def kind_rows(report: Report) -> list[KindRow]:
    """`all` and each collective kind present, across ranks (median rank; worst = lowest overlap)."""
    rows = []
    ranks = report.ranks
    for kind in (ALL, *present_kinds(ranks)):
        stat = report.summary.metrics.get(f"{kind}.overlap")
        having = [r for r in ranks if r.collectives[kind].count]
        if stat is None or not having:
            continue
        rows.append(
            KindRow(
                kind=kind,
                label=KIND_LABELS[kind],
                count_per_step=median(per_step(r, kind, "count") for r in having) or 0.0,
                overlap=stat.median,
                worst_overlap=stat.min,
                worst_rank=stat.worst_rank,
                exposed_us_per_step=median(per_step(r, kind, "exposed_us") for r in having) or 0.0,
                time_us_per_step=median(per_step(r, kind, "time_us") for r in having) or 0.0,
                hidden_us_per_step=median(per_step(r, kind, "overlapped_us") for r in having) or 0.0,
                **_bandwidth_of(report, kind),
            )
        )
    return rows


def _bandwidth_of(report: Report, kind: str) -> dict[str, float | None]:
    """MB/step and busbw of one kind (docs/metrics.md, Bandwidth); `all` sums the bytes and has no busbw."""
    kinds = [kind] if kind != ALL else list(COLLECTIVE_KINDS)
    sized = [r for r in report.ranks if any(k in r.bandwidth for k in kinds)]
    if not sized:
        return {}
    mb = median(sum(r.bandwidth[k].bytes_per_step for k in kinds if k in r.bandwidth) for r in sized)
    busbw = None
    if kind != ALL:
        job = report.bandwidth.kinds.get(kind) if report.bandwidth is not None else None
        busbw = job.busbw_gbps if job is not None and job.busbw_gbps is not None else None
        if busbw is None:
            busbw = median(r.bandwidth[kind].busbw_gbps for r in sized)
    return {"mb_per_step": mb / 1e6 if mb is not None else None, "busbw_gbps": busbw}


def gbps(value: float | None) -> str:
    """A bandwidth in GB/s (1e9 bytes/s): 3 significant digits; '-' when unknown."""
    if value is None:
        return "-"
    if value < 0.01:
        return "<0.01"
    return f"{value:.3g}" if value < 100 else f"{value:.0f}"


def mbytes(value: float | None) -> str:
    """Bytes per step in MB (1e6 bytes); '-' when unknown."""
    if value is None:
        return "-"
    return f"{value:.1f}" if value < 1000 else f"{value:,.0f}"


def bandwidth_line(report: Report) -> str | None:
    """One line on hideability: the exposed time no schedule could hide at the measured bandwidth (the floor)
    against the part a better schedule could, and the peak used (docs/metrics.md, Hideability)."""
    bw = report.bandwidth
    if bw is None or not bw.hideability:
        return None
    exposed = bw.floor_us + bw.schedulable_us
    if exposed <= 0:
        return None
    line = (
        f"hideability: of {ms(exposed)} ms/step exposed, {ms(bw.floor_us)} ms is the bandwidth floor (no schedule "
        f"hides it at the measured busbw) and {ms(bw.schedulable_us)} ms a better schedule could hide"
    )
    peaks = sorted({f"{k.peak_gbps:g} GB/s ({k.peak})" for k in bw.kinds.values() if k.peak_gbps is not None})
    if peaks:
        line += "; peak: " + ", ".join(peaks)
    return line


# the per-collective columns every output shows, and their texts
KIND_COLUMNS = ("collective", "kernels/step", "overlap", "worst overlap (rank)", "exposed ms/step", "total ms/step")
BANDWIDTH_COLUMNS = ("MB/step", "busbw GB/s")  # shown when some collective's message size is known


def kind_columns(report: Report) -> tuple[str, ...]:
    """The per-collective columns of this report: KIND_COLUMNS, plus BANDWIDTH_COLUMNS when it has sizes."""
    return KIND_COLUMNS + (BANDWIDTH_COLUMNS if any(r.bandwidth for r in report.ranks) else ())


def kind_cells(row: KindRow) -> dict[str, str]:
    """The texts of KIND_COLUMNS for one collective kind, identical in every output."""
    return {
        "collective": row.label,
        "kernels/step": f"{row.count_per_step:.1f}".removesuffix(".0"),
        "overlap": pct(row.overlap),
        "worst overlap (rank)": f"{pct(row.worst_overlap)} ({row.worst_rank})",
        "exposed ms/step": ms(row.exposed_us_per_step),
        "total ms/step": ms(row.time_us_per_step),
        "MB/step": mbytes(row.mb_per_step),
        "busbw GB/s": gbps(row.busbw_gbps),
    }


def kind_caption(report: Report) -> str:
    """What 'per step' and the columns of the per-collective table mean."""
    counts = sorted({len(r.steps) for r in report.ranks})
    steps = sorted(len(r.steps) for r in report.ranks)[len(report.ranks) // 2] if report.ranks else 0
    if len(counts) > 1:
        over = f"the mean over each rank's own profiled steps ({counts[0]} to {counts[-1]}: the capture is uneven)"
    elif steps:
        over = f"the mean over a rank's {steps} profiled steps"
    else:
        over = "each rank's whole trace (no steps)"
    return f"per step: {over}; each column: the median rank, except worst"


# -- the verdict -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    """The headline every output leads with."""

    level: str  # good, warn, bad, none
    headline: str
    ranks: int
    overlap: float | None  # median rank
    worst_overlap: float | None
    worst_rank: int | None
    exposed_share: float | None  # median rank: exposed communication / step time
    worst_exposed_share: float | None
    worst_share_rank: int | None
    exposed_us_per_step: float | None  # median rank
    step_us: float | None  # median rank's mean step time
    top_finding: Finding | None

    def sentence(self) -> str:
        """The verdict as one line of text."""
        if self.overlap is None:
            return f"{self.ranks} rank(s): no communication to measure."
        line = (
            f"{self.headline}: median {pct(self.overlap)} of communication overlapped across {self.ranks} "
            f"rank(s) (worst rank {self.worst_rank}: {pct(self.worst_overlap)})"
        )
        if self.exposed_share is not None:
            line += f"; exposed communication is {pct(self.exposed_share)} of step time (median rank)"
        return line + "."


def verdict(report: Report) -> Verdict:
    """Good / warn / bad from the exposed share of step time (the cost), else from the overlap."""
    metrics = report.summary.metrics
    overlap, share = metrics.get("all.overlap"), metrics.get("exposed_share")
    if overlap is None:
        level, headline = "none", "No communication was measured"
    elif share is not None:
        level = "good" if share.median < GOOD_SHARE else "warn" if share.median < FAIR_SHARE else "bad"
        headline = {
            "good": "Communication is well hidden behind compute",
            "warn": "Some communication is exposed",
            "bad": "Exposed communication is costing step time",
        }[level]
    else:
        level = "good" if overlap.median >= GOOD_OVERLAP else "warn" if overlap.median >= FAIR_OVERLAP else "bad"
        headline = {
            "good": "Communication is well hidden behind compute",
            "warn": "Communication is partly hidden",
            "bad": "Communication is mostly exposed",
        }[level]
    having = [r for r in report.ranks if r.collectives[ALL].count]
    return Verdict(
        level=level,
        headline=headline,
        ranks=len(report.ranks),
        overlap=overlap.median if overlap else None,
        worst_overlap=overlap.min if overlap else None,
        worst_rank=overlap.worst_rank if overlap else None,
        exposed_share=share.median if share else None,
        worst_exposed_share=share.max if share else None,
        worst_share_rank=share.worst_rank if share else None,
        exposed_us_per_step=median(per_step(r, ALL, "exposed_us") for r in having),
        step_us=median(mean_step_us(r) for r in report.ranks),
        top_finding=next(iter(costly(report)[0]), None),
    )


def capture_notes(report: Report) -> list[str]:
    """What `overlapcheck run` recorded about the capture in run.json `notes`: ranks whose trace misses steps
    of the window (the job ended inside it), ranks without a trace, and why."""
    run = report.run or {}
    return [str(n) for n in run.get("notes") or [] if isinstance(n, str)]


def notes(report: Report, limit: int = 200) -> list[str]:
    """The job's notes, then each distinct rank note once (`rank 3: ...`, or `ranks 0-7: ...` when several ranks
    have it), at most `limit`: what was assumed, what was not recorded, why a number is null."""
    return [*(report.notes or []), *rank_notes(report, limit)][:limit]


def rank_notes(report: Report, limit: int = 200) -> list[str]:
    """Each distinct rank note once, `rank 3: ...` or `ranks 0-7: ...` when several ranks have it, at most `limit`."""
    by_note: dict[str, list[int]] = {}
    for r in report.ranks:
        for note in r.notes:
            by_note.setdefault(note, []).append(r.rank if r.rank is not None else -1)
    out = []
    for note, ranks in by_note.items():
        who = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {rank_ranges(sorted(set(ranks)))}"
        out.append(f"{who}: {note}")
    return out[:limit]


def stragglers(report: Report) -> list[Finding]:
    """The straggler findings of the report (the diagnosis decides what a straggler is)."""
    return [f for f in report.findings if f.paces]


# -- fixes -----------------------------------------------------------------------------------------------------


def fix_lines(fix: Fix) -> list[str]:
    """`set zero_optimization.reduce_bucket_size = 50000000`, `unset X`, `export X=1`, `upgrade to ...`."""
    out = [f"set {safe_line(k)} = {safe_line(json.dumps(v))}" for k, v in (fix.config or {}).items()]
    out += [safe_line(line) for line in env_lines(fix.env or {})]
    if fix.upgrade:
        out.append(f"upgrade to {safe_line(fix.upgrade)}")
    return out


def env_lines(env: dict[str, Any]) -> list[str]:
    """Shell lines: `export NAME=value`, or `unset NAME` for null."""
    return [
        f"unset {name}" if value is None else f"export {name}={shlex.quote(str(value))}" for name, value in env.items()
    ]


def config_patch(dotted: dict[str, Any]) -> dict[str, Any]:
    """{'zero_optimization.reduce_bucket_size': 5e7} -> {'zero_optimization': {'reduce_bucket_size': 5e7}}."""
    out: dict[str, Any] = {}
    for key, value in dotted.items():
        parts = [p for p in str(key).split(".") if p] or [str(key)]
        node = out
        for part in parts[:-1]:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        if not isinstance(node.get(parts[-1]), dict):  # a deeper key already set wins over a scalar
            node[parts[-1]] = value
    return out


def combined_patch(findings: Sequence[Finding]) -> dict[str, Any] | None:
    """One ds_config patch for all findings; where two set the same key, the costlier finding wins."""
    merged: dict[str, Any] = {}
    for f in reversed(findings):  # ranked costliest first
        merged.update(f.fix.config or {})
    return config_patch(merged) if merged else None


NO_COST_SHARE = 0.001  # a finding below this share of the step (or under 1 µs per step) costs nothing measurable
NO_COST_US = 1.0


def costly(report: Report) -> tuple[list[Finding], list[Finding]]:
    """The findings that cost something measurable, and those that do not ("also seen, no measurable cost":
    folded in the terminal, the Markdown and the HTML; the JSON keeps every finding). Both in report order."""
    shown, folded = costly_indices(report)
    return [report.findings[i] for i in shown], [report.findings[i] for i in folded]


def costly_indices(report: Report) -> tuple[list[int], list[int]]:
    """`costly` as indices into `report.findings` (what the HTML page's anchors and timeline links use): one
    folding rule, by cost and never by position, for every output."""
    step = median(mean_step_us(r) for r in report.ranks if r.collectives[ALL].count) or 0.0
    floor = max(NO_COST_US, NO_COST_SHARE * step)
    shown = [i for i, f in enumerate(report.findings) if f.cost_us >= floor]
    return shown, [i for i, f in enumerate(report.findings) if not f.cost_us >= floor]


def finding_numbers(report: Report) -> list[int]:
    """The number each finding (by index into `report.findings`) is shown with, the same in every output: the
    costly ones 1..k in report order, as the terminal and Markdown list them, then the folded ones k+1..n."""
    shown, folded = costly_indices(report)
    numbers = [0] * len(report.findings)
    for n, i in enumerate([*shown, *folded], 1):
        numbers[i] = n
    return numbers


def folded_line(findings: Sequence[Finding]) -> str | None:
    """'also seen, no measurable cost: host-sync (2), epilogue-sync' for the folded findings."""
    if not findings:
        return None
    counts: dict[str, int] = {}
    for f in findings:
        counts[f.rule] = counts.get(f.rule, 0) + 1
    rules = ", ".join(f"{rule} ({n})" if n > 1 else rule for rule, n in counts.items())
    return f"also seen, no measurable cost: {rules}"


def explained(report: Report) -> str | None:
    """'explain 76.9% of exposed communication' when the report says."""
    share = report.findings_explain_share
    return None if share is None else f"explain {pct(share)} of exposed communication"


__all__ = [
    "COLLECTIVE_KEYS",
    "KIND_COLUMNS",
    "KIND_LABELS",
    "KIND_SHORT",
    "RANK_CAPTION",
    "RANK_COLUMNS",
    "KindRow",
    "Verdict",
    "combined_patch",
    "compute_per_step",
    "config_patch",
    "duration",
    "env_lines",
    "fix_lines",
    "kind_caption",
    "kind_cells",
    "kind_rows",
    "mean_step_us",
    "ms",
    "outside_steps_line",
    "pct",
    "per_step",
    "present_kinds",
    "rank_cells",
    "rank_ranges",
    "safe",
    "safe_line",
    "stragglers",
    "verdict",
    "worst_first",
]


# -- per module ----------------------------------------------------------------------------------------------

MAX_MODULE_ROWS = 8  # modules listed in the terminal (most exposed first)
MODULE_COLUMNS = ("module", "collective", "phase", "count/step", "exposed ms/step", "hidden ms/step", "from")


def module_rows(report: Report, limit: int = MAX_MODULE_ROWS) -> list[dict[str, str]]:
    """The most exposed (module, collective, phase) rows that name a module, per rank and step; [] when no row
    names one."""
    m = report.modules
    if m is None:
        return []
    per = m.rank_steps or m.ranks or 1
    out = []
    for r in [r for r in m.rows if r.module is not None][:limit]:
        module = r.module or ""
        name = module if r.cls is None or module.rsplit(".", 1)[-1].startswith(r.cls) else f"{module} ({r.cls})"
        out.append(
            {
                "module": safe_line(name),
                "collective": KIND_LABELS.get(r.kind, r.kind),
                "phase": r.phase or "-",
                "count/step": f"{r.count / per:.3g}",
                "exposed ms/step": ms(r.exposed_us / per),
                "hidden ms/step": ms(r.hidden_us / per),
                "from": r.source,
            }
        )
    return out


def finding_modules_line(f: Finding) -> str | None:
    """'modules: embed 2.47 ms, layers.0 1.99 ms': the modules whose exposed collectives a finding explains, with
    their part of its cost per step (evidence.modules); None when it names none."""
    named = f.evidence.get("modules")
    if not isinstance(named, list) or not named:
        return None
    parts = []
    for m in named:
        if isinstance(m, dict) and isinstance(m.get("module"), str) and isinstance(m.get("cost_us"), int | float):
            parts.append(f"{safe_line(m['module'])} {ms(float(m['cost_us']))} ms")
    return "modules: " + ", ".join(parts) if parts else None


def module_caption(report: Report) -> str | None:
    """What the module table covers: the share of communication time with a module, and how many rows are left."""
    m = report.modules
    if m is None:
        return None
    total = sum(r.time_us for r in m.rows)
    named = [r for r in m.rows if r.module is not None]
    share = sum(r.time_us for r in named) / total if total > 0 else 0.0
    text = f"{pct(share)} of the communication time is attributed to a module; a shared bucket's time is split evenly"
    if len(named) > MAX_MODULE_ROWS:
        text += f"; {len(named) - MAX_MODULE_ROWS} more rows in the JSON report (modules)"
    return text
