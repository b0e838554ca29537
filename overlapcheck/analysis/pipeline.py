"""From paths to the report document: find the per-rank inputs, analyze them in parallel, merge.

trace file -> TraceModel -> RANK (+ that rank's findings and timeline) in a worker process; the parent only
merges small documents, so memory stays per-file and ranks use every core.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import Any

from overlapcheck import __version__
from overlapcheck.analysis.crossrank import summarize
from overlapcheck.analysis.metrics import analyze_model
from overlapcheck.errors import UserError
from overlapcheck.trace.reader import load_trace

SCHEMA = "overlapcheck.report/1"
_TRACE_FILE = re.compile(r"\.json(\.gz)?$", re.IGNORECASE)
_NOT_TRACES = re.compile(
    r"(^run\.json$|^truth\.json$|^ds_config\.json$|^model\.json$|\.summary\.json$|\.status\.json$|report|baseline)",
    re.IGNORECASE,
)
_SUMMARY = re.compile(r"^rank(\d+)\.summary\.json$")


@dataclass
class Inputs:
    traces: list[str] = field(default_factory=list)
    summaries: list[str] = field(default_factory=list)
    run: dict[str, Any] | None = None
    config: dict[str, Any] | None = None  # ds_config found beside the traces


def input_bytes(inputs: Inputs) -> int:
    """Total size of the files to read."""
    return sum(os.path.getsize(p) for p in inputs.traces + inputs.summaries)


def find_inputs(paths: list[str]) -> Inputs:
    """Expand files and folders into trace files and (for `overlapcheck run` folders) per-rank summaries."""
    found = Inputs()
    for path in paths:
        if os.path.isfile(path):
            found.traces.append(path)
        elif os.path.isdir(path):
            _scan_folder(path, found)
        else:
            raise UserError("no such file or folder", path)
    return found


def _scan_folder(folder: str, found: Inputs) -> None:
    names = sorted(os.listdir(folder))
    summaries = {int(m.group(1)): n for n in names if (m := _SUMMARY.match(n))}
    run_json = os.path.join(folder, "run.json")
    if os.path.isfile(run_json):
        found.run = _read_json(run_json)
    ds_config = os.path.join(folder, "ds_config.json")
    if os.path.isfile(ds_config):
        found.config = _read_json(ds_config)
    if found.config is None and isinstance(found.run, dict) and isinstance(found.run.get("ds_config"), dict):
        found.config = found.run["ds_config"]
    traces = [n for n in names if _TRACE_FILE.search(n) and not _NOT_TRACES.search(n)]
    for name in traces:
        m = re.match(r"^rank(\d+)\.", name)
        if m and int(m.group(1)) in summaries:
            continue  # the rank's own summary stands for it
        found.traces.append(os.path.join(folder, name))
    found.summaries.extend(os.path.join(folder, n) for n in summaries.values())
    if not traces and not summaries:
        raise UserError("no trace files (*.json, *.json.gz) in this folder", folder)


def _read_json(path: str) -> Any:
    try:
        with open(path, "rb") as f:
            return json.load(f)
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot read JSON ({exc})", path) from None


@dataclass
class Options:
    timelines: bool = False
    diagnose: bool = True
    config: dict[str, Any] | None = None


def analyze_trace(
    path: str, options: Options | None = None, progress: Callable[[int], None] | None = None, workers: int = 1
) -> dict[str, Any]:
    """One trace file -> its RANK document (with `_findings` / `_timeline` extras when asked).

    `progress(n)` is called with the number of file bytes read so far; `workers` processes decode it."""
    options = options or Options()
    model = load_trace(path, progress, workers)
    rank = analyze_model(model)
    if options.diagnose:
        from overlapcheck.diagnose import rank_findings

        rank["_findings"] = rank_findings(model, rank, options.config)
    if options.timelines:
        from overlapcheck.analysis.timeline import timeline_of

        rank["_timeline"] = timeline_of(model, rank)
    return rank


Result = tuple[str, dict[str, Any] | None, str | None]  # (source, RANK document or None, error or None)


def _worker(path: str, options: Options, progress: Callable[[int], None] | None = None, workers: int = 1) -> Result:
    try:
        return path, analyze_trace(path, options, progress, workers), None
    except UserError as exc:
        return path, None, str(exc)
    except MemoryError:
        return path, None, f"{path}: out of memory while reading this trace"


def analyze_paths(
    paths: list[str],
    jobs: int | None = None,
    options: Options | None = None,
    on_bytes: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """The report document for the traces and run folders in `paths`. Unreadable inputs are listed in
    `errors` and left out; the other ranks are still reported.

    `on_bytes(n)` is called as input bytes are consumed (n = bytes since the last call; the total is the sum
    of the input files' sizes): byte by byte within a file when ranks are read in this process, a whole
    file at a time when they are read in parallel."""
    options = options or Options()
    inputs = find_inputs(paths)
    if options.config is None:
        options.config = inputs.config
    results: list[tuple[str, dict[str, Any] | None, str | None]] = []
    advance = on_bytes or (lambda n: None)
    for path in inputs.summaries:
        results.extend(_read_summary(path))
        advance(os.path.getsize(path))
    cores = jobs or os.cpu_count() or 1
    jobs = max(1, min(cores, len(inputs.traces)))
    if jobs == 1:
        for path in inputs.traces:
            seen = [0]

            def progress(n: int, seen: list[int] = seen) -> None:
                advance(n - seen[0])
                seen[0] = n

            # a single file gets every core (fewer files than cores: see the pool below)
            results.append(_worker(path, options, progress, cores if len(inputs.traces) == 1 else 1))
            advance(os.path.getsize(path) - seen[0])
    else:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            per_file = max(1, cores // len(inputs.traces))  # 2 files on 8 cores: 4 processes decode each
            futures = [pool.submit(_worker, path, options, None, per_file) for path in inputs.traces]
            for fut in as_completed(futures):
                results.append(fut.result())
                advance(os.path.getsize(results[-1][0]))
    return build_report(results, inputs, options)


def _read_summary(path: str) -> list[tuple[str, dict[str, Any] | None, str | None]]:
    doc = _read_json(path)
    if not isinstance(doc, dict) or not str(doc.get("schema", "")).startswith("overlapcheck.report/"):
        return [(path, None, f"{path}: not an overlapcheck summary")]
    out = []
    for rank in doc.get("ranks", []):
        rank = dict(rank)
        rank["_findings"] = doc.get("findings", [])
        out.append((path, rank, None))
    return out


def build_report(
    results: list[tuple[str, dict[str, Any] | None, str | None]], inputs: Inputs, options: Options
) -> dict[str, Any]:
    errors = [{"source": path, "error": err} for path, _, err in results if err]
    ranks = [r for _, r, err in results if r is not None]
    ranks = _resolve_ranks(ranks, errors)
    ranks.sort(key=lambda r: r["rank"])
    report: dict[str, Any] = {
        "schema": SCHEMA,
        "tool": {"name": "overlapcheck", "version": __version__},
        "run": inputs.run,
        "ranks": ranks,
        "summary": summarize(ranks),
        "findings": [],
        "findings_explain_share": None,
        "errors": sorted(errors, key=lambda e: e["source"]),
    }
    if options.diagnose:
        from overlapcheck.diagnose import merge_findings

        report["findings"], report["findings_explain_share"] = merge_findings(report, options.config)
    if options.timelines:
        report["timelines"] = {str(r["rank"]): r["_timeline"] for r in ranks if r.get("_timeline")}
    for r in ranks:
        r.pop("_findings", None)
        r.pop("_timeline", None)
    return report


def _resolve_ranks(ranks: list[dict[str, Any]], errors: list[dict[str, str]]) -> list[dict[str, Any]]:
    """Give every rank document a rank number; drop (as errors) files that claim the same rank or none."""
    if len(ranks) == 1 and ranks[0]["rank"] is None:
        ranks[0]["rank"] = 0
        ranks[0]["notes"].append("rank unknown (no distributedInfo.rank, no rank in the file name): assumed 0")
        return ranks
    by_rank: dict[int, list[dict[str, Any]]] = {}
    for r in ranks:
        if r["rank"] is None:
            errors.append(
                {
                    "source": r["source"],
                    "error": f"{r['source']}: cannot tell the rank: no "
                    "distributedInfo.rank and no rank-N/workerN in the file name",
                }
            )
            continue
        by_rank.setdefault(r["rank"], []).append(r)
    out = []
    for rank, docs in by_rank.items():
        if len(docs) == 1:
            out.append(docs[0])
            continue
        sources = ", ".join(d["source"] for d in docs)
        for d in docs:
            errors.append(
                {"source": d["source"], "error": f"{d['source']}: rank {rank} is claimed by several files ({sources})"}
            )
    return out
