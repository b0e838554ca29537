"""The self-contained HTML report: one file, no network, every trace string escaped.

`HtmlRenderer().render(report)` turns the Report, with its in-memory timelines (kernel intervals of one step
per rank, never written to JSON), into one HTML page. Labels, units and the verdict come from `present`. Python computes
everything the page shows (a view model); the jinja2 template (autoescape on) lays it out with inline SVG;
a small vanilla script adds table sorting, copy buttons and the canvas timeline. Data for the script is
embedded as JSON in `<script type="application/json">` blocks (with `<`, `>`, `&` escaped), one block per
rank's timeline so that only the selected rank is parsed. A Content-Security-Policy with the hashes of the
inline script and style means that injected markup could not run code even if escaping failed.
"""

from __future__ import annotations

import json
import math
import shlex
from typing import Any

from overlapcheck.model import ALL, COLLECTIVE_KEYS, Finding, RankMetrics, Report, Timeline
from overlapcheck.report import page
from overlapcheck.report import present as P
from overlapcheck.report.base import expect_report

MAX_RANKS_SHOWN = 512  # ranks in the table, the per-rank columns and the bandwidth plot: the lowest overlap first
MAX_EVENTS_TOTAL = 240_000  # events embedded over all ranks' timelines
MAX_EVENTS_RANK = 40_000  # ... and per rank
MIN_EVENTS_RANK = 2_500  # a rank keeps at least this many even with many ranks
MAX_EXPOSED_RANK = 20_000  # exposed intervals per rank

CLASS_COLORS = {
    "compute": "#4f7fd9",
    "comm:reduce_scatter": "#f08c2e",
    "comm:all_gather": "#8e5bd6",
    "comm:all_reduce": "#1aa39a",
    "comm:all_to_all": "#c9a400",
    "comm:send_recv": "#9a6b45",
    "comm:broadcast": "#d465b3",
    "comm:other": "#7b8794",
    "comm": "#7b8794",
    "memcpy": "#58b368",
    "memset": "#a1cf6b",
    "cpu": "#9aa5b1",
}
CLASS_LABELS = {"compute": "compute", "memcpy": "memcpy", "memset": "memset", "cpu": "CPU"}
EXPOSED_COLOR = "#e03e3e"
HOST_COLORS = {"sync": "#c0392b", "wait": "#d68910", "late-launch": "#7d3c98", "exposed": "#b03a6f"}
PHASE_COLORS = {"forward": "#d6e4f5", "backward": "#f5e3d0", "optimizer": "#dcefdc"}
MAX_HOST_RANK = 5_000  # blamed host events per rank
HIDDEN_COLOR = "#3aa675"
LANE_ORDER = {"compute": 0, "mixed": 1, "comm": 2, "memcpy": 3, "cpu": 4}


class HtmlRenderer:
    """One self-contained page: no network, every trace string escaped, scripts allowed only by hash."""

    name = "html"
    extension = ".html"

    def __init__(self, perfetto: str | None = None) -> None:
        self.perfetto = perfetto  # a relative link to the Perfetto file written in the same run, if any

    def render(self, report: Report) -> str:
        report = expect_report(report)
        import markupsafe

        env = page.environment()
        env.policies["json.dumps_kwargs"] = {"separators": (",", ":"), "allow_nan": False}
        env.filters.update(us=P.duration, ms=P.ms, pct=P.pct, ranges=P.rank_ranges)
        css, js = page.asset("report.css"), page.asset("report.js")
        return env.get_template("report.html.j2").render(
            view=build_view(report, self.perfetto),
            css=markupsafe.Markup(css),
            js=markupsafe.Markup(js),
            csp=page.csp(css, js),
        )


def build_view(report: Report, perfetto: str | None = None) -> dict[str, Any]:
    """Everything the template shows, computed from the Report (numbers made finite or None); `perfetto` is a
    relative link to the Perfetto file written beside the page."""
    ranks = report.ranks
    timelines = timelines_view(report.timelines, ranks, report.findings)
    classes = _classes_in(timelines)
    v = P.verdict(report)
    shown, folded = P.costly_indices(report)
    n_costly = len(shown)
    view = {
        "tool": {"name": report.tool.name, "version": report.tool.version},
        "run": _scalars(report.run),
        "n_ranks": len(ranks),
        "verdict": {
            "level": v.level,
            "headline": v.headline,
            "overlap": _num(v.overlap),
            "overlap_worst": _num(v.worst_overlap),
            "worst_rank": v.worst_rank,
            "exposed_share": _num(v.exposed_share),
            "exposed_share_worst": _num(v.worst_exposed_share),
            "exposed_share_worst_rank": v.worst_share_rank,
            "exposed_median_us": _num(v.exposed_us_per_step),
            "top_finding": finding_view(v.top_finding) if v.top_finding else None,
            "n_findings": n_costly,
        },
        "ranks": rank_rows(ranks, timelines),
        "outside_steps": P.outside_steps_line(report),
        "kind_columns": [(k, P.KIND_SHORT[k], f"{P.KIND_LABELS[k]} overlap") for k in P.present_kinds(ranks)],
        "collectives": collective_bars(report),
        "crossrank": crossrank(report),
        "bandwidth": bandwidth_view(report),
        "modules": modules_view(report),
        "findings": [finding_view(f) for f in report.findings],
        "n_costly": n_costly,
        "shown_findings": shown,  # indices into findings, in report order: cards
        "folded_findings": folded,  # no measurable cost: folded (whatever their position)
        "finding_numbers": P.finding_numbers(report),  # as the terminal and the Perfetto tracks number them
        "combined_patch": _pretty(patch) if (patch := P.combined_patch(report.findings)) else None,
        "explain_share": _num(report.findings_explain_share),
        "errors": [{"source": e.source, "error": e.error} for e in report.errors],
        "capture_notes": P.capture_notes(report),
        "notes": P.notes(report),
        "timelines": timelines,
        "legend": [{"label": _class_label(c), "color": _class_color(c)} for c in classes],
        "colors": {"exposed": EXPOSED_COLOR, "hidden": HIDDEN_COLOR},
        "perfetto": perfetto,
    }
    view["config"] = {
        "classColors": {c: _class_color(c) for c in classes},
        "classLabels": {c: _class_label(c) for c in classes},
        "exposedColor": EXPOSED_COLOR,
        "hostColors": HOST_COLORS,
        "phaseColors": PHASE_COLORS,
        "initialRank": timelines["initial"],
    }
    return view


# --------------------------------------------------------------------------------------------- ranks


def rank_rows(ranks: list[RankMetrics], timelines: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per rank for the overlap table, per profiled step, lowest overlap first; the worst marked."""
    ordered = P.worst_first(ranks)
    worst = ordered[0] if ordered and ordered[0].overlap() is not None else None
    ordered = ordered[:MAX_RANKS_SHOWN]  # every rank is in the JSON report
    has_tl = {t["rank"] for t in timelines["ranks"]}
    kinds = P.present_kinds(ranks)
    rows = []
    for r in ordered:
        rows.append(
            {
                "rank": r.rank,
                "host": r.host,
                "lanes": r.lanes,
                "source": r.source,
                "steps": len(r.steps),
                "step_time_us": _num(P.mean_step_us(r)),
                "compute_us": _num(P.compute_per_step(r)),
                "comm_us": _num(P.per_step(r, ALL, "time_us")),
                "exposed_us": _num(P.per_step(r, ALL, "exposed_us")),
                "overlap": _num(r.overlap()),
                "kinds": [_num(r.overlap(kind)) for kind in kinds],
                "exposed_share": _num(r.exposed_share),
                "idle_us": _num(r.idle_us),
                "worst": worst is r,
                "timeline": r.rank in has_tl,
            }
        )
    return rows


def _shown(ranks: list[RankMetrics]) -> list[RankMetrics]:
    """The ranks a per-rank chart shows: all of them, or past MAX_RANKS_SHOWN the lowest overlap, in rank order."""
    if len(ranks) <= MAX_RANKS_SHOWN:
        return ranks
    keep = {id(r) for r in P.worst_first(ranks)[:MAX_RANKS_SHOWN]}
    return [r for r in ranks if id(r) in keep]


def collective_bars(report: Report, width: float = 400.0) -> list[dict[str, Any]]:
    """Exposed vs hidden time per collective kind, per step on the median rank, as SVG bar geometry."""
    rows: list[dict[str, Any]] = []
    for k in P.kind_rows(report):
        hidden, exposed = _num(k.hidden_us_per_step) or 0.0, _num(k.exposed_us_per_step) or 0.0
        rows.append(
            {
                "kind": k.kind,
                "label": k.label,
                "count": k.count_per_step,
                "time_us": _num(k.time_us_per_step),
                "hidden_us": hidden,
                "exposed_us": exposed,
                "overlap": _num(k.overlap),
                "count_text": P.kind_cells(k)["kernels/step"],
                "worst": P.kind_cells(k)["worst overlap (rank)"],
            }
        )
    scale = max((r["hidden_us"] + r["exposed_us"] for r in rows), default=0.0)
    for r in rows:
        r["hidden_w"] = width * r["hidden_us"] / scale if scale > 0 else 0.0
        r["exposed_w"] = width * r["exposed_us"] / scale if scale > 0 else 0.0
    return rows


def crossrank(report: Report, height: float = 150.0) -> dict[str, Any]:
    """Per-rank stacked columns per step (compute / exposed / other), the lowest-overlap ranks, and the
    stragglers the diagnosis found."""
    every = report.ranks
    all_tops = [_num(P.mean_step_us(r)) or 0.0 for r in every]
    ranks = _shown(every)
    cols = []
    tops = [_num(P.mean_step_us(r)) or 0.0 for r in ranks] if len(ranks) < len(every) else all_tops
    scale = max(tops, default=0.0)
    bar_w = max(4.0, min(44.0, 900.0 / max(len(ranks), 1)))
    for i, r in enumerate(ranks):
        total = tops[i]
        compute = min(_num(P.compute_per_step(r)) or 0.0, total)
        exposed = min(_num(P.per_step(r, ALL, "exposed_us")) or 0.0, max(total - compute, 0.0))
        other = max(total - compute - exposed, 0.0)
        k = height / scale if scale > 0 else 0.0
        cols.append(
            {
                "rank": r.rank,
                "x": i * bar_w,
                "w": max(bar_w - 2, 1.0),
                "compute_h": compute * k,
                "exposed_h": exposed * k,
                "other_h": other * k,
                "total_us": total,
                "compute_us": compute,
                "exposed_us": exposed,
                "label": i % max(1, math.ceil(len(ranks) / 32)) == 0,
            }
        )
    lowest = [r for r in P.worst_first(ranks) if r.overlap() is not None][:5]
    step_times = [t for t in all_tops if t > 0]
    spread = max(step_times) / min(step_times) - 1 if len(step_times) > 1 else None
    indexed = {id(f): i for i, f in enumerate(report.findings)}
    return {
        "columns": cols,
        "width": max(len(ranks), 1) * bar_w,
        "height": height,
        "bar_w": bar_w,
        "worst": [
            {
                "rank": r.rank,
                "host": r.host,
                "overlap": _num(r.overlap()),
                "exposed_share": _num(r.exposed_share),
                "exposed_us": _num(P.per_step(r, ALL, "exposed_us")),
            }
            for r in lowest
        ],
        "spread": spread if spread is not None and spread >= 0.0005 else None,
        "stragglers": [(indexed[id(f)], finding_view(f)) for f in P.stragglers(report)],
    }


_KIND_COLORS = {
    "reduce_scatter": "#d9534f",
    "all_gather": "#4f7fd9",
    "all_reduce": "#8e44ad",
    "all_to_all": "#16a085",
    "send_recv": "#e67e22",
    "broadcast": "#7f8c8d",
    "other": "#34495e",
}


def bandwidth_view(report: Report, width: float = 520.0, height: float = 200.0) -> dict[str, Any]:
    """Message size (log) against busbw, one point per rank and collective kind (docs/metrics.md, Bandwidth);
    the stated or known peaks as dashed lines."""
    raw = []
    for r in _shown(report.ranks):
        for kind, b in r.bandwidth.items():
            per_step = P.per_step(r, kind, "count")
            size = b.bytes_per_step / per_step if per_step > 0 else None
            if size and size > 0 and b.busbw_gbps is not None:
                raw.append((r.rank, kind, size, b))
    if not raw:
        return {"points": []}
    xs = [math.log10(x[2]) for x in raw]
    x_lo, x_hi = math.floor(min(xs)), math.ceil(max(xs))
    if x_hi == x_lo:
        x_hi += 1
    peaks = {(b.peak_gbps, b.peak) for _, _, _, b in raw if b.peak_gbps is not None}
    top = max([b.busbw_max_gbps or b.busbw_gbps or 0.0 for _, _, _, b in raw] + [p for p, _ in peaks]) or 1.0
    top *= 1.1

    def y(v: float | None) -> float:
        return height - (v or 0.0) / top * height

    points = [
        {
            "rank": rank,
            "label": P.KIND_LABELS[kind],
            "color": _KIND_COLORS.get(kind, "#34495e"),
            "x": (math.log10(size) - x_lo) / (x_hi - x_lo) * width,
            "y": y(b.busbw_gbps),
            "y_lo": y(b.busbw_min_gbps),
            "y_hi": y(b.busbw_max_gbps),
            "size": f"{P.mbytes(size / 1e6)} MB",
            "busbw": P.gbps(b.busbw_gbps),
            "spread": f"{P.gbps(b.busbw_min_gbps)}-{P.gbps(b.busbw_max_gbps)} GB/s",
        }
        for rank, kind, size, b in raw
    ]
    kinds = sorted({k for _, k, _, _ in raw}, key=list(_KIND_COLORS).index)
    return {
        "points": points,
        "kinds": [{"label": P.KIND_LABELS[k], "color": _KIND_COLORS[k]} for k in kinds],
        "width": width,
        "height": height,
        "x_unit": "bytes",
        "y_unit": "GB/s",
        "x_ticks": [
            {"x": (e - x_lo) / (x_hi - x_lo) * width, "label": _bytes_label(10**e)} for e in range(x_lo, x_hi + 1)
        ],
        "y_ticks": [{"y": y(top * f / 1.1), "label": P.gbps(top * f / 1.1)} for f in (0.0, 0.25, 0.5, 0.75, 1.0)],
        "peaks": [{"y": y(p), "label": f"peak {p:g} GB/s: {what}"} for p, what in sorted(peaks, key=str)],
        "line": P.bandwidth_line(report),
    }


def _bytes_label(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:g} {unit}"
    return f"{n:g} B"


# ------------------------------------------------------------------------------------------ findings


MAX_MODULE_NODES = 2_000  # modules in the HTML table (the most exposed first; their ancestors come with them)


def modules_view(report: Report) -> dict[str, Any] | None:
    """The module table: a tree by path (`layers.3.attn` under `layers.3` under `layers`; a frame chain
    `Net_0.Linear_1` likewise), each node with its own and its subtree's exposed and hidden ms per rank and step,
    and its rows per collective and phase; the unattributed time as one row. None without MODULES."""
    m = report.modules
    if m is None:
        return None
    per = m.rank_steps or m.ranks or 1
    root: dict[str, Any] = {"children": {}}
    unattributed = {"exposed": 0.0, "hidden": 0.0, "count": 0}
    named = [r for r in m.rows if r.module is not None]
    keep = {r.module for r in named[:MAX_MODULE_NODES]}
    for r in m.rows:
        if r.module is None or r.module not in keep:
            unattributed["exposed"] += r.exposed_us / per
            unattributed["hidden"] += r.hidden_us / per
            unattributed["count"] += r.count
            continue
        parts = r.module.split(".") if not r.module.endswith(": forward") else [r.module]
        node = root
        for i in range(len(parts)):
            path = ".".join(parts[: i + 1])
            node = node["children"].setdefault(
                parts[i],
                {
                    "name": parts[i],
                    "path": path,
                    "cls": None,
                    "children": {},
                    "rows": [],
                    "exposed": 0.0,
                    "hidden": 0.0,
                },
            )
            node["exposed"] += r.exposed_us / per
            node["hidden"] += r.hidden_us / per
        node["cls"] = r.cls
        node["rows"].append(
            {
                "kind": P.KIND_LABELS.get(r.kind, r.kind),
                "phase": r.phase or "-",
                "source": r.source,
                "count": r.count / per,
                "exposed": r.exposed_us / per,
                "hidden": r.hidden_us / per,
            }
        )

    def ordered(node: dict[str, Any]) -> list[dict[str, Any]]:
        out = sorted(node["children"].values(), key=lambda n: (-n["exposed"], n["name"]))
        for child in out:
            child["children"] = ordered(child)
        return out

    return {
        "tree": ordered(root),
        "unattributed": unattributed if unattributed["count"] else None,
        "caption": P.module_caption(report),
        "notes": list(m.notes),
    }


def finding_view(f: Finding) -> dict[str, Any]:
    """A finding with its evidence flattened for display and its fix as ds_config patch and shell lines."""
    fix = f.fix
    return {
        "rule": f.rule,
        "severity": f.severity if f.severity in ("critical", "warning") else "info",
        "title": f.title,
        "why": f.why,
        "cost_us": _num(f.cost_us),
        "ranks": f.ranks,
        "steps": f.steps,
        "evidence": evidence_rows(f.evidence),
        "patch": _pretty(P.config_patch(fix.config)) if fix.config else None,
        "env": P.env_lines(fix.env or {}),
        "upgrade": f"pip install {shlex.quote(fix.upgrade)}" if fix.upgrade else None,
    }


def evidence_rows(evidence: dict[str, Any]) -> list[tuple[str, str, bool]]:
    """(key, text, is_block): scalars inline, lists and dicts as pretty JSON blocks."""
    rows = []
    for key, value in evidence.items():
        if isinstance(value, dict | list):
            rows.append((str(key), _pretty(value), True))
        elif isinstance(value, float):
            rows.append((str(key), f"{value:.6g}", False))
        else:
            rows.append((str(key), str(value), "\n" in str(value)))
    return rows


# ----------------------------------------------------------------------------------------- timelines


def timelines_view(
    timelines: dict[int, Timeline], ranks: list[RankMetrics], findings: list[Finding] | None = None
) -> dict[str, Any]:
    """Pack each rank's timeline for the page: events grouped per lane, capped to a budget per rank (over all
    of its selected steps)."""
    items = sorted(timelines.items())
    budget = max(MIN_EVENTS_RANK, min(MAX_EVENTS_RANK, MAX_EVENTS_TOTAL // max(len(items), 1)))
    packed = [pack_timeline(rank, tl, budget, findings or []) for rank, tl in items]
    have = [p["rank"] for p in packed]
    worst = next((r for r in P.worst_first(ranks) if r.overlap() is not None), None)
    initial = worst.rank if worst is not None and worst.rank in have else (have[0] if have else None)
    return {
        "ranks": [
            {
                "rank": p["rank"],
                "step": p["step"],
                "steps": [s["step"] for s in p["steps"]],
                "events": p["n"],
                "omitted": p["omitted"],
            }
            for p in packed
        ],
        "data": packed,
        "initial": initial,
        "budget": budget,
    }


def pack_timeline(rank: int, tl: Timeline, budget: int, findings: list[Finding] | None = None) -> dict[str, Any]:
    """Validate and pack one rank's timeline; keeps communication first, then the longest events. Each event
    carries its stream (its lane's) and, for collectives, its size (`b` bytes, `e` elements; -1 unknown)."""
    lanes_in = sorted(tl.lanes, key=lambda ln: LANE_ORDER.get(ln.kind, 9))
    lane_pos = {ln.id: i for i, ln in enumerate(lanes_in)}
    names_in = tl.names
    rows: list[tuple[int, float, float, str, int | None, int, int, str | None]] = []
    for ev in tl.events:
        if len(ev) < 4 or ev[0] not in lane_pos:
            continue
        start, dur = _num(ev[1]), _num(ev[2])
        if start is None or dur is None or dur < 0:
            continue
        name = ev[4] if len(ev) > 4 and isinstance(ev[4], int) and 0 <= ev[4] < len(names_in) else None
        module = ev[8] if len(ev) > 8 and isinstance(ev[8], str) else None
        rows.append((lane_pos[ev[0]], start, dur, str(ev[3]), name, _size(ev, 7), _size(ev, 6), module))
    omitted = 0
    if len(rows) > budget:
        rows.sort(key=lambda e: (not e[3].startswith("comm"), -e[2]))
        omitted = len(rows) - budget
        rows = rows[:budget]
    rows.sort(key=lambda e: (e[0], e[1]))
    classes: list[str] = []
    class_idx: dict[str, int] = {}
    names: list[str] = []
    name_idx: dict[int, int] = {}
    lanes: list[dict[str, Any]] = [
        {
            "label": ln.label,
            "kind": ln.kind,
            "stream": ln.stream,
            "s": [],
            "d": [],
            "c": [],
            "n": [],
            "b": [],
            "e": [],
            "m": [],
            "maxd": 0.0,
        }
        for ln in lanes_in
    ]
    end = 0.0
    modules: list[str] = []
    module_idx: dict[str, int] = {}
    for lane, start, dur, cls, name, nbytes, nelems, module in rows:
        if module is not None and module not in module_idx:
            module_idx[module] = len(modules)
            modules.append(module)
        if cls not in class_idx:
            class_idx[cls] = len(classes)
            classes.append(cls)
        if name is not None and name not in name_idx:
            name_idx[name] = len(names)
            names.append(str(names_in[name]))
        out = lanes[lane]
        out["s"].append(round(start, 3))
        out["d"].append(round(dur, 3))
        out["c"].append(class_idx[cls])
        out["n"].append(name_idx.get(name, -1) if name is not None else -1)
        out["b"].append(nbytes)
        out["e"].append(nelems)
        out["m"].append(module_idx[module] if module is not None else -1)
        out["maxd"] = max(out["maxd"], round(dur, 3))
        end = max(end, start + dur)
    exposed: list[float] = []
    for pair in tl.exposed[:MAX_EXPOSED_RANK]:
        a, b = _num(pair[0]), _num(pair[1])
        if a is not None and b is not None and b > a:
            exposed.extend((round(a, 3), round(b, 3)))
            end = max(end, b)
    steps = []
    for st in tl.steps:
        a, b = _num(st.start), _num(st.end)
        if a is None or b is None or b < a:
            continue
        phases = [
            [name, round(w[0], 3), round(w[1], 3)]
            for name in ("forward", "backward", "optimizer")
            if len(w := [x for x in (_num(v) for v in st.phases.get(name, [])) if x is not None]) == 2 and w[1] >= w[0]
        ]
        period = [_num(st.period_start), _num(st.period_end)]
        step_view = {"step": st.step, "start": round(a, 3), "end": round(b, 3), "phases": phases}
        if period[0] is not None and period[1] is not None and period[1] >= period[0]:
            step_view["period"] = [round(period[0], 3), round(period[1], 3)]
        steps.append(step_view)
        end = max(end, b)
    host: dict[str, list[Any]] = {"s": [], "d": [], "k": [], "call": [], "f": [], "cost": [], "title": []}
    titles = [f.title for f in findings or []]
    t0 = _num(tl.t0) or 0.0
    for bl in sorted(sorted(tl.host, key=lambda x: -x.cost_us)[:MAX_HOST_RANK], key=lambda x: x.start):
        a, b = _num(bl.start), _num(bl.end)
        if a is None or b is None or b < a or bl.kind not in HOST_COLORS:
            continue
        host["s"].append(round(a - t0, 3))
        host["d"].append(round(b - a, 3))
        host["k"].append(bl.kind)
        host["call"].append(bl.call)
        host["f"].append(bl.finding if 0 <= bl.finding < len(titles) else -1)
        host["cost"].append(_num(round(bl.cost_us, 3)))
        host["title"].append(titles[bl.finding] if 0 <= bl.finding < len(titles) else bl.rule)
    return {
        "rank": rank,
        "step": tl.step,
        "steps": steps,
        "host": host,
        "t0": _num(tl.t0),
        "lanes": lanes,
        "classes": classes,
        "names": names,
        "modules": modules,
        "exposed": exposed,
        "end": round(end, 3),
        "n": len(rows),
        "omitted": omitted,
    }


def _size(ev: list[Any], i: int) -> int:
    """Column `i` of an event row as a size, -1 when absent or not a non-negative integer."""
    v = ev[i] if len(ev) > i else -1
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else -1


def _classes_in(timelines: dict[str, Any]) -> list[str]:
    seen: dict[str, None] = {}
    for p in timelines["data"]:
        for c in p["classes"]:
            seen.setdefault(c, None)
    order = ["compute"] + [f"comm:{k}" for k in COLLECTIVE_KEYS] + ["memcpy", "memset", "cpu"]
    return sorted(seen, key=lambda c: (order.index(c) if c in order else len(order), c))


def _class_color(cls: str) -> str:
    return CLASS_COLORS.get(cls) or (CLASS_COLORS["comm"] if cls.startswith("comm") else "#9aa5b1")


def _class_label(cls: str) -> str:
    if cls.startswith("comm:"):
        return P.KIND_LABELS.get(cls[5:], cls[5:])
    return CLASS_LABELS.get(cls, cls)


# ------------------------------------------------------------------------------------------- helpers


def _num(value: object) -> float | None:
    """A finite number, else None (the page shows n/a)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def _pretty(value: object) -> str:
    return json.dumps(_finite(value), indent=2, default=str, ensure_ascii=False, allow_nan=False)


def _finite(value: object) -> object:
    """`value` with non-finite numbers as None (JSON has no infinity)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def _scalars(run: dict[str, Any] | None) -> list[tuple[str, str]]:
    """The run manifest's scalar fields, for a small key/value list."""
    if not isinstance(run, dict):
        return []
    return [(str(k), str(v)) for k, v in run.items() if isinstance(v, str | int | float | bool)][:12]
