"""run.json: the run manifest, merged by the launcher from the per-rank and per-launcher status files.

Each rank writes only `status/rank<R>.json`, each summary process only `status/rank<R>.summary.json`, each
`overlapcheck run` process only `status/launcher<N>.json`; `merge()` reads them all and every launcher
rewrites run.json atomically when it finishes, so the last one to finish writes the complete view.
"""

from __future__ import annotations

import datetime as _dt
import glob
import importlib.metadata
import os
import re
import sys
from typing import Any

from overlapcheck import __version__
from overlapcheck.capture import layout
from overlapcheck.capture.atomic import read_json
from overlapcheck.job import RUN_SCHEMA

SCHEMA = RUN_SCHEMA
_RANK_FILE = re.compile(r"rank([0-9]+)\.json$")
_SUMMARY_FILE = re.compile(r"rank([0-9]+)\.summary\.json$")
_LAUNCHER_FILE = re.compile(r"launcher([0-9]+)\.json$")


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def installed_versions() -> dict[str, str | None]:
    """Package versions as installed for the launcher's Python (without importing them)."""
    out: dict[str, str | None] = {"python": sys.version.split()[0], "overlapcheck": __version__}
    for dist in ("torch", "deepspeed"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = None
    return out


def read_statuses(out: str) -> tuple[dict[int, dict], dict[int, dict], dict[int, dict], list[dict]]:
    """(rank statuses, summary statuses, launcher statuses, errors) found in the run folder."""
    ranks: dict[int, dict] = {}
    summaries: dict[int, dict] = {}
    launchers: dict[int, dict] = {}
    errors: list[dict] = []
    for path in sorted(glob.glob(os.path.join(out, layout.STATUS_DIR, "*.json"))):
        name = os.path.basename(path)
        doc = read_json(path)
        if not isinstance(doc, dict):
            errors.append({"source": os.path.relpath(path, out), "error": "unreadable status file"})
            continue
        if m := _SUMMARY_FILE.match(name):
            summaries[int(m.group(1))] = doc
        elif m := _RANK_FILE.match(name):
            ranks[int(m.group(1))] = doc
        elif m := _LAUNCHER_FILE.match(name):
            launchers[int(m.group(1))] = doc
    return ranks, summaries, launchers, errors


def rank_entry(out: str, rank: int, status: dict, summary: dict | None) -> dict[str, Any]:
    """One rank's line in run.json: where it ran, whether its capture and summary succeeded."""
    capture = dict(_dict(status.get("capture")))
    trace = layout.trace_path(out, rank)
    capture["trace"] = os.path.relpath(trace, out) if os.path.isfile(trace) else None
    if capture.get("status") in ("waiting", "recording") and capture["trace"] is None:
        capture["error"] = capture.get("error") or (
            f"the rank stopped while its capture was {capture['status']!r} (killed, or the job failed)"
        )
    summ = dict(_dict(status.get("summary")) or {"status": "not_started"})
    if summary is not None:
        summ = {**summ, **summary}
    summ.pop("pid", None)
    summ.pop("host", None)
    summ["file"] = os.path.basename(layout.summary_path(out, rank)) if summ.get("status") == "ok" else None
    capture.setdefault("steps_captured", None)
    capture["complete"] = capture.get("status") == "ok" and capture.get("complete", True) is not False
    return {
        "rank": rank,
        "host": status.get("host"),
        "local_rank": status.get("local_rank"),
        "pid": status.get("pid"),
        "driver": status.get("driver"),
        "gpu": status.get("gpu"),
        "capture": capture,
        "summary": summ,
        "errors": status.get("errors") if isinstance(status.get("errors"), list) else [],
    }


# A status file is this tool's, yet may be cut short or edited: every field merge() reads is taken only where it
# has the type the rank or launcher wrote, so that a bad one costs that field, never run.json (nor the job's
# exit status, which the launcher returns after merging).


def _dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _world(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= 1 << 31 else 0


def merge(out: str, own_launcher: dict[str, Any]) -> dict[str, Any]:
    """Build run.json from everything in the run folder; `own_launcher` is this process's status."""
    ranks, summaries, launchers, errors = read_statuses(out)
    launchers[int(own_launcher["node_rank"])] = own_launcher
    first = launchers[min(launchers)]
    by_rank = [ranks[r] for r in sorted(ranks)]
    lead = by_rank[0] if by_rank else {}
    world = max([_world(s.get("world_size")) for s in by_rank], default=0) or None
    versions = {"cuda": None, "nccl": None, **_dict(first.get("versions"))}
    versions.update({k: v for k, v in _dict(lead.get("versions")).items() if v is not None})
    ds_config = next((s["ds_config"] for s in by_rank if isinstance(s.get("ds_config"), dict)), None)
    named = [*(s.get("host") for s in by_rank), *(lt.get("host") for lt in launchers.values())]
    hosts = sorted({host for h in named if (host := _text(h))})
    unfinished = [n for n, lt in launchers.items() if lt.get("finished_at") is None]
    entries = [rank_entry(out, r, ranks[r], summaries.get(r)) for r in sorted(ranks)]
    return {
        "schema": SCHEMA,
        "tool": {"name": "overlapcheck", "version": __version__},
        "status": "running" if unfinished else "finished",
        "command": first.get("command"),
        "launcher": first.get("kind"),
        "cwd": first.get("cwd"),
        "started_at": min(_text(lt.get("started_at")) or "" for lt in launchers.values()) or None,
        "finished_at": None if unfinished else max(_text(lt.get("finished_at")) or "" for lt in launchers.values()),
        "exit_code": first.get("exit_code"),
        "profiler": {**_dict(first.get("profiler")), "cuda_sync_events": lead.get("cuda_sync_events")},
        "versions": versions,
        "env": _dict(lead.get("env")) or _dict(first.get("env")),
        "ds_config": ds_config,
        "world_size": world,
        "backend": lead.get("backend"),
        "hosts": hosts,
        "gpus": sorted({gpu for s in by_rank if (gpu := _text(s.get("gpu")))}),
        "launches": [launchers[n] for n in sorted(launchers)],
        "ranks": entries,
        "missing_ranks": sorted(set(range(world or 0)) - set(ranks)),
        "incomplete_ranks": incomplete_ranks(entries),
        "notes": [],  # what `overlapcheck run` said about the capture (filled in by the launcher)
        "errors": errors,
    }


def incomplete_ranks(entries: list[dict[str, Any]]) -> list[int]:
    """Ranks that were to be captured but whose trace lacks steps of the window (or is missing)."""
    return [e["rank"] for e in entries if e["capture"].get("status") != "skipped" and not e["capture"]["complete"]]
