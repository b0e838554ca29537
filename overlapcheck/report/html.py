"""The self-contained HTML report: one file, no network, every trace string escaped.

`render_html(report)` turns the report document (docs/report-schema.md), plus the optional `timelines`
key (kernel intervals of one step per rank, never written to JSON), into one HTML page. Python computes
everything the page shows (a view model); the jinja2 template (autoescape on) lays it out with inline SVG;
a small vanilla script adds table sorting, copy buttons and the canvas timeline. Data for the script is
embedded as JSON in `<script type="application/json">` blocks (with `<`, `>`, `&` escaped), one block per
rank's timeline so that only the selected rank is parsed. A Content-Security-Policy with the hashes of the
inline script and style means that injected markup could not run code even if escaping failed.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import os
import shlex
import statistics
from pathlib import Path
from typing import Any

from overlapcheck.errors import UserError
from overlapcheck.report.gate import COLLECTIVE_KINDS, fmt_pct, fmt_us, rank_overlap, reduce_ranks

HERE = Path(__file__).parent
MAX_EVENTS_TOTAL = 240_000  # events embedded over all ranks' timelines
MAX_EVENTS_RANK = 40_000  # ... and per rank
MIN_EVENTS_RANK = 2_500  # a rank keeps at least this many even with many ranks
MAX_EXPOSED_RANK = 20_000  # exposed intervals per rank
STRAGGLER_MARGIN = 0.05  # compute this much above the median (relative and ...
STRAGGLER_MIN_US = 100.0  # ... absolute) marks a possible straggler

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
    "reduce_scatter": "RS",
    "all_gather": "AG",
    "all_reduce": "AR",
    "all_to_all": "A2A",
    "send_recv": "P2P",
    "broadcast": "BC",
    "other": "other",
}
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
HIDDEN_COLOR = "#3aa675"
LANE_ORDER = {"compute": 0, "mixed": 1, "comm": 2, "memcpy": 3, "cpu": 4}


# ------------------------------------------------------------------------------------------- writing


def write_html(report: dict, path: str, force: bool = False) -> None:
    """Render the report and write it atomically to `path` (UserError if it exists and not `force`)."""
    from overlapcheck.fsutil import atomic_write

    if not force and os.path.exists(path):  # fail before rendering
        raise UserError("already exists; pass --force to overwrite it", path)
    atomic_write(path, render_html(report), force)


# ----------------------------------------------------------------------------------------- rendering


def render_html(report: dict) -> str:
    """The whole page as a string."""
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(HERE / "templates")),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.policies["json.dumps_kwargs"] = {"separators": (",", ":"), "allow_nan": False}
    env.filters.update(us=fmt_us, pct=fmt_pct, ranges=rank_ranges)
    css = (HERE / "assets" / "report.css").read_text(encoding="utf-8")
    js = (HERE / "assets" / "report.js").read_text(encoding="utf-8")
    view = build_view(report)
    return env.get_template("report.html.j2").render(
        view=view,
        css=jinja2.utils.markupsafe.Markup(css),
        js=jinja2.utils.markupsafe.Markup(js),
        csp=f"default-src 'none'; script-src '{_sha256(js)}'; style-src '{_sha256(css)}'; img-src data:",
    )


def _sha256(text: str) -> str:
    return "sha256-" + base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode("ascii")


def build_view(report: dict) -> dict[str, Any]:
    """Everything the template shows, computed from the report document."""
    ranks = [r for r in report.get("ranks") or [] if isinstance(r, dict)]
    timelines = timelines_view(report.get("timelines") or {}, ranks)
    view = {
        "tool": report.get("tool") or {},
        "run": _scalars(report.get("run")),
        "n_ranks": len(ranks),
        "verdict": verdict(report, ranks),
        "ranks": rank_rows(ranks, timelines),
        "kind_columns": kind_columns(ranks),
        "collectives": collective_bars(ranks),
        "crossrank": crossrank(ranks, report.get("findings") or []),
        "findings": [finding_view(f) for f in report.get("findings") or [] if isinstance(f, dict)],
        "combined_patch": combined_patch(report.get("findings") or []),
        "explain_share": _num(report.get("findings_explain_share")),
        "errors": [e for e in report.get("errors") or [] if isinstance(e, dict)],
        "notes": [(r.get("rank"), n) for r in ranks for n in r.get("notes") or []],
        "timelines": timelines,
        "legend": [{"label": _class_label(c), "color": _class_color(c)} for c in _classes_in(timelines)],
        "colors": {"exposed": EXPOSED_COLOR, "hidden": HIDDEN_COLOR},
    }
    view["config"] = {
        "classColors": {c: _class_color(c) for c in _classes_in(timelines)},
        "classLabels": {c: _class_label(c) for c in _classes_in(timelines)},
        "exposedColor": EXPOSED_COLOR,
        "initialRank": timelines["initial"],
    }
    return view


# ------------------------------------------------------------------------------------------- verdict


def verdict(report: dict, ranks: list[dict]) -> dict[str, Any]:
    """The headline: overlap and exposed share (median rank), the worst rank, the top finding."""
    med = reduce_ranks(report, lambda r: rank_overlap(r, "all"), "median", higher_is_worse=False)
    worst = reduce_ranks(report, lambda r: rank_overlap(r, "all"), "worst", higher_is_worse=False)
    share = reduce_ranks(report, lambda r: _num(r.get("exposed_share")), "median", higher_is_worse=True)
    worst_share = reduce_ranks(report, lambda r: _num(r.get("exposed_share")), "worst", higher_is_worse=True)
    exposed = [_num(_split(r, "all").get("exposed_us")) or 0.0 for r in ranks]
    findings = [f for f in report.get("findings") or [] if isinstance(f, dict)]
    if med.value is None:
        level, headline = "none", "No communication was measured"
    elif share.value is not None:
        level = "good" if share.value < 0.05 else "warn" if share.value < 0.15 else "bad"
        headline = {
            "good": "Communication is well hidden behind compute",
            "warn": "Some communication is exposed",
            "bad": "Exposed communication is costing step time",
        }[level]
    else:
        level = "good" if med.value >= 0.8 else "warn" if med.value >= 0.5 else "bad"
        headline = {
            "good": "Communication is well hidden behind compute",
            "warn": "Communication is partly hidden",
            "bad": "Communication is mostly exposed",
        }[level]
    return {
        "level": level,
        "headline": headline,
        "overlap": med.value,
        "overlap_worst": worst.value,
        "worst_rank": worst.rank,
        "exposed_share": share.value,
        "exposed_share_worst": worst_share.value,
        "exposed_share_worst_rank": worst_share.rank,
        "exposed_median_us": statistics.median(exposed) if exposed else None,
        "top_finding": finding_view(findings[0]) if findings else None,
        "n_findings": len(findings),
    }


# --------------------------------------------------------------------------------------------- ranks


def rank_rows(ranks: list[dict], timelines: dict) -> list[dict[str, Any]]:
    """One row per rank for the overlap table, worst (lowest overlap) marked."""
    worst = min(
        (r for r in ranks if rank_overlap(r, "all") is not None),
        key=lambda r: rank_overlap(r, "all") or 0.0,
        default=None,
    )
    has_tl = {t["rank"] for t in timelines["ranks"]}
    kinds = kind_columns(ranks)
    rows = []
    for r in ranks:
        allc = _split(r, "all")
        rows.append(
            {
                "rank": r.get("rank"),
                "host": r.get("host"),
                "lanes": r.get("lanes"),
                "source": r.get("source"),
                "steps": len(r.get("steps") or []),
                "step_time_us": _num(r.get("step_time_us")),
                "compute_us": _num(r.get("compute_us")),
                "comm_us": _num(allc.get("time_us")),
                "exposed_us": _num(allc.get("exposed_us")),
                "overlap": _num(allc.get("overlap")),
                "kinds": [_num(_split(r, kind).get("overlap")) for kind, _, _ in kinds],
                "exposed_share": _num(r.get("exposed_share")),
                "idle_us": _num(r.get("idle_us")),
                "worst": worst is r,
                "timeline": r.get("rank") in has_tl,
            }
        )
    return rows


def kind_columns(ranks: list[dict]) -> list[tuple[str, str, str]]:
    """(kind, short label, tooltip) for each collective kind (not `all`) that some rank has."""
    return [
        (k, KIND_SHORT[k], f"{KIND_LABELS[k]} overlap")
        for k in COLLECTIVE_KINDS[1:]
        if any(_num(_split(r, k).get("count")) or _num(_split(r, k).get("time_us")) for r in ranks)
    ]


def collective_bars(ranks: list[dict], width: float = 470.0) -> list[dict[str, Any]]:
    """Exposed vs hidden time per collective kind, mean per rank, as SVG bar geometry."""
    rows = []
    n = max(len(ranks), 1)
    for kind in COLLECTIVE_KINDS:
        splits = [_split(r, kind) for r in ranks]
        count = sum(int(_num(s.get("count")) or 0) for s in splits)
        time = sum(_num(s.get("time_us")) or 0.0 for s in splits)
        if not count and not time:
            continue
        hidden = sum(_num(s.get("overlapped_us")) or 0.0 for s in splits)
        exposed = sum(_num(s.get("exposed_us")) or 0.0 for s in splits)
        rows.append(
            {
                "kind": kind,
                "label": KIND_LABELS.get(kind, kind),
                "count": count,
                "time_us": time / n,
                "hidden_us": hidden / n,
                "exposed_us": exposed / n,
                "overlap": hidden / time if time > 0 else None,
            }
        )
    scale = max((r["hidden_us"] + r["exposed_us"] for r in rows), default=0.0)
    for r in rows:
        r["hidden_w"] = width * r["hidden_us"] / scale if scale > 0 else 0.0
        r["exposed_w"] = width * r["exposed_us"] / scale if scale > 0 else 0.0
    return rows


def crossrank(ranks: list[dict], findings: list, height: float = 150.0) -> dict[str, Any]:
    """Per-rank stacked columns (compute / exposed / other), lowest-overlap ranks and possible stragglers."""
    cols = []
    tops = [_num(r.get("step_time_us")) or 0.0 for r in ranks]
    scale = max(tops, default=0.0)
    bar_w = max(4.0, min(44.0, 900.0 / max(len(ranks), 1)))
    for i, r in enumerate(ranks):
        total = _num(r.get("step_time_us")) or 0.0
        compute = min(_num(r.get("compute_us")) or 0.0, total)
        exposed = min(_num(_split(r, "all").get("exposed_us")) or 0.0, max(total - compute, 0.0))
        other = max(total - compute - exposed, 0.0)
        k = height / scale if scale > 0 else 0.0
        cols.append(
            {
                "rank": r.get("rank"),
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
    by_overlap = sorted(
        (r for r in ranks if rank_overlap(r, "all") is not None), key=lambda r: rank_overlap(r, "all") or 0.0
    )
    computes = [c for r in ranks if (c := _num(r.get("compute_us"))) is not None]
    median_compute = statistics.median(computes) if computes else None
    stragglers = []
    if median_compute:
        for r in ranks:
            c = _num(r.get("compute_us"))
            if c is not None and c > median_compute * (1 + STRAGGLER_MARGIN) and c - median_compute >= STRAGGLER_MIN_US:
                stragglers.append(
                    {"rank": r.get("rank"), "host": r.get("host"), "compute_us": c, "excess": c / median_compute - 1}
                )
        stragglers.sort(key=lambda s: -s["excess"])
    step_times = [t for t in tops if t > 0]
    return {
        "columns": cols,
        "width": max(len(ranks), 1) * bar_w,
        "height": height,
        "bar_w": bar_w,
        "worst": [
            {
                "rank": r.get("rank"),
                "host": r.get("host"),
                "overlap": rank_overlap(r, "all"),
                "exposed_share": _num(r.get("exposed_share")),
                "exposed_us": _num(_split(r, "all").get("exposed_us")),
            }
            for r in by_overlap[:5]
        ],
        "stragglers": stragglers[:8],
        "n_stragglers": len(stragglers),
        "median_compute_us": median_compute,
        "spread": max(step_times) / min(step_times) - 1 if len(step_times) > 1 else None,
        "findings": [
            (i, finding_view(f))
            for i, f in enumerate(f for f in findings if isinstance(f, dict))
            if "straggl" in str(f.get("rule", "")).lower()
        ],
    }


# ------------------------------------------------------------------------------------------ findings


def finding_view(f: dict) -> dict[str, Any]:
    """A finding with its evidence flattened for display and its fix as ds_config patch and shell lines."""
    fix = f.get("fix") if isinstance(f.get("fix"), dict) else {}
    config = fix.get("config") if isinstance(fix.get("config"), dict) else {}
    env = fix.get("env") if isinstance(fix.get("env"), dict) else {}
    severity = str(f.get("severity", "info"))
    return {
        "rule": str(f.get("rule", "")),
        "severity": severity if severity in ("critical", "warning") else "info",
        "title": str(f.get("title", "")),
        "why": str(f.get("why", "")),
        "cost_us": _num(f.get("cost_us")),
        "ranks": [r for r in f.get("ranks") or [] if isinstance(r, int)],
        "steps": [s for s in f.get("steps") or [] if isinstance(s, int)],
        "evidence": evidence_rows(f.get("evidence")),
        "patch": json.dumps(config_patch(config), indent=2) if config else None,
        "env": env_lines(env),
        "upgrade": f"pip install {shlex.quote(str(fix['upgrade']))}" if fix.get("upgrade") else None,
    }


def evidence_rows(evidence: object) -> list[tuple[str, str, bool]]:
    """(key, text, is_block): scalars inline, lists and dicts as pretty JSON blocks."""
    if not isinstance(evidence, dict):
        return [] if evidence is None else [("evidence", _pretty(evidence), True)]
    rows = []
    for key, value in evidence.items():
        if isinstance(value, (dict, list)):
            rows.append((str(key), _pretty(value), True))
        elif isinstance(value, float):
            rows.append((str(key), f"{value:.6g}", False))
        else:
            rows.append((str(key), str(value), "\n" in str(value)))
    return rows


def config_patch(dotted: dict) -> dict:
    """{'zero_optimization.reduce_bucket_size': 5e7} -> {'zero_optimization': {'reduce_bucket_size': 5e7}}."""
    out: dict = {}
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


def combined_patch(findings: list) -> str | None:
    """One ds_config patch for all findings; where two set the same key, the costlier finding wins."""
    merged: dict = {}
    for f in reversed([f for f in findings if isinstance(f, dict)]):  # ranked costliest first
        fix = f.get("fix") if isinstance(f.get("fix"), dict) else {}
        if isinstance(fix.get("config"), dict):
            merged.update(fix["config"])
    return json.dumps(config_patch(merged), indent=2) if merged else None


def env_lines(env: dict) -> list[str]:
    """Shell lines: `export NAME=value`, or `unset NAME` for null."""
    return [
        f"unset {name}" if value is None else f"export {name}={shlex.quote(str(value))}" for name, value in env.items()
    ]


def rank_ranges(ranks: list[int]) -> str:
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


# ----------------------------------------------------------------------------------------- timelines


def timelines_view(timelines: dict, ranks: list[dict]) -> dict[str, Any]:
    """Pack each rank's timeline for the page: events grouped per lane, capped to a budget per rank."""
    items = []
    for key, tl in timelines.items():
        try:
            rank = int(key)
        except (TypeError, ValueError):
            continue
        if isinstance(tl, dict):
            items.append((rank, tl))
    items.sort(key=lambda kv: kv[0])
    budget = max(MIN_EVENTS_RANK, min(MAX_EVENTS_RANK, MAX_EVENTS_TOTAL // max(len(items), 1)))
    packed = [pack_timeline(rank, tl, budget) for rank, tl in items]
    worst = min(
        (r for r in ranks if rank_overlap(r, "all") is not None),
        key=lambda r: rank_overlap(r, "all") or 0.0,
        default=None,
    )
    have = [p["rank"] for p in packed]
    initial = worst["rank"] if worst is not None and worst.get("rank") in have else (have[0] if have else None)
    return {
        "ranks": [{"rank": p["rank"], "step": p["step"], "events": p["n"], "omitted": p["omitted"]} for p in packed],
        "data": packed,
        "initial": initial,
        "budget": budget,
    }


def pack_timeline(rank: int, tl: dict, budget: int) -> dict[str, Any]:
    """Validate and pack one rank's timeline; keeps communication first, then the longest events."""
    lanes_in = [ln for ln in tl.get("lanes") or [] if isinstance(ln, dict)]
    lanes_in.sort(key=lambda ln: LANE_ORDER.get(str(ln.get("kind")), 9))
    lane_pos = {ln.get("id"): i for i, ln in enumerate(lanes_in)}
    names_in = tl.get("names") or []
    rows = []
    for ev in tl.get("events") or []:
        if not isinstance(ev, (list, tuple)) or len(ev) < 4 or ev[0] not in lane_pos:
            continue
        start, dur = _num(ev[1]), _num(ev[2])
        if start is None or dur is None or dur < 0:
            continue
        name = ev[4] if len(ev) > 4 and isinstance(ev[4], int) and 0 <= ev[4] < len(names_in) else None
        rows.append((lane_pos[ev[0]], start, dur, str(ev[3]), name))
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
    lanes = [
        {
            "label": str(ln.get("label", ln.get("id"))),
            "kind": str(ln.get("kind", "")),
            "s": [],
            "d": [],
            "c": [],
            "n": [],
            "maxd": 0.0,
        }
        for ln in lanes_in
    ]
    end = 0.0
    for lane, start, dur, cls, name in rows:
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
        out["maxd"] = max(out["maxd"], round(dur, 3))
        end = max(end, start + dur)
    exposed = []
    for iv in (tl.get("exposed") or [])[:MAX_EXPOSED_RANK]:
        if isinstance(iv, (list, tuple)) and len(iv) >= 2:
            s, e = _num(iv[0]), _num(iv[1])
            if s is not None and e is not None and e > s:
                exposed.extend((round(s, 3), round(e, 3)))
                end = max(end, e)
    step = tl.get("step")
    return {
        "rank": rank,
        "step": step if isinstance(step, int) else None,
        "t0": _num(tl.get("t0")),
        "lanes": lanes,
        "classes": classes,
        "names": names,
        "exposed": exposed,
        "end": round(end, 3),
        "n": len(rows),
        "omitted": omitted,
    }


def _classes_in(timelines: dict) -> list[str]:
    seen: dict[str, None] = {}
    for p in timelines["data"]:
        for c in p["classes"]:
            seen.setdefault(c, None)
    order = ["compute"] + [f"comm:{k}" for k in COLLECTIVE_KINDS] + ["memcpy", "memset", "cpu"]
    return sorted(seen, key=lambda c: (order.index(c) if c in order else len(order), c))


def _class_color(cls: str) -> str:
    return CLASS_COLORS.get(cls) or (CLASS_COLORS["comm"] if cls.startswith("comm") else "#9aa5b1")


def _class_label(cls: str) -> str:
    if cls.startswith("comm:"):
        return KIND_LABELS.get(cls[5:], cls[5:])
    return CLASS_LABELS.get(cls, cls)


# ------------------------------------------------------------------------------------------- helpers


def _split(rank: dict, kind: str) -> dict:
    value = (rank.get("collectives") or {}).get(kind)
    return value if isinstance(value, dict) else {}


def _num(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _pretty(value: object) -> str:
    return json.dumps(value, indent=2, default=str, ensure_ascii=False)


def _scalars(run: object) -> list[tuple[str, str]]:
    """The run manifest's scalar fields, for a small key/value list."""
    if not isinstance(run, dict):
        return []
    return [
        (str(k), str(v)) for k, v in run.items() if isinstance(v, (str, int, float, bool)) and not isinstance(v, dict)
    ][:12]
