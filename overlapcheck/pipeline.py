"""From paths to the Report: find the inputs once, build the job context, analyze and diagnose each rank in
parallel, merge.

    paths -> Inputs (find_inputs) -> JobContext (job_context)
          -> per trace, in a worker: TraceModel -> RankMetrics -> findings + signature (+ timeline) = RankResult
          -> per summary: the RankResult it holds
          -> merge_findings over every RankResult -> Report

The parent only merges small objects, so memory stays per file and ranks use every core. docs/architecture.md.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from overlapcheck import __version__
from overlapcheck.analysis.bandwidth import job_bandwidth, with_bandwidth, with_topology
from overlapcheck.analysis.crossrank import summarize
from overlapcheck.analysis.metrics import analyze_model
from overlapcheck.analysis.select import restrict_to_steps
from overlapcheck.analysis.timeline import timeline_of
from overlapcheck.diagnose import diagnose_rank, diagnose_rank_located, merge_findings
from overlapcheck.diagnose.locate import finding_key
from overlapcheck.errors import UserError
from overlapcheck.executors import Outcome, executor
from overlapcheck.fsutil import file_size, read_json_file
from overlapcheck.job import JobContext, Network
from overlapcheck.model import (
    Blame,
    CollectiveSignature,
    Finding,
    InputError,
    RankMetrics,
    RankResult,
    Report,
    ReportFormatError,
    Tool,
)
from overlapcheck.trace.reader import load_trace, rank_from_name

_TRACE_FILE = re.compile(r"\.json(\.gz)?$", re.IGNORECASE)
_NOT_TRACES = re.compile(
    r"(^run\.json$|^truth\.json$|^ds_config\.json$|^model\.json$|\.summary\.json$|\.status\.json$|report|baseline)",
    re.IGNORECASE,
)
_SUMMARY = re.compile(r"^rank(\d+)\.summary\.json$")
_RANK_FILE = re.compile(r"^rank(\d+)\.")


@dataclass(frozen=True)
class Summary:
    """A per-rank summary written by `overlapcheck run`, and the rank's trace to read if it is unreadable."""

    path: str
    trace: str | None = None


@dataclass
class Inputs:
    """What a set of paths holds: trace files, per-rank summaries, and the job's documents found beside them."""

    traces: list[str] = field(default_factory=list)
    summaries: list[Summary] = field(default_factory=list)
    run: dict[str, Any] | None = None  # run.json
    ds_config: dict[str, Any] | None = None  # ds_config.json beside the traces
    model: dict[str, Any] | None = None  # model.json beside the traces
    sizes: dict[str, int] = field(default_factory=dict)  # bytes of each file to read

    @property
    def total_bytes(self) -> int:
        return sum(self.sizes.values())

    @property
    def count(self) -> int:
        return len(self.traces) + len(self.summaries)


@dataclass(frozen=True)
class Options:
    """What to compute beyond the metrics."""

    diagnose: bool = True
    timelines: bool = False  # every selected step of each rank, for the HTML page and the Perfetto file
    signatures: bool = False  # keep each rank's collective signature in the Report (per-rank summaries)
    steps: frozenset[int] | None = None  # analyze only these ProfilerSteps (--steps; analysis/select.py)
    ranks: frozenset[int] | None = None  # analyze only these ranks (--ranks): other ranks' files are not read
    prefer_traces: bool = False  # read a rank's trace rather than its summary when both are there


def find_inputs(paths: Sequence[str | os.PathLike[str]]) -> Inputs:
    """Expand files and folders into trace files and (for `overlapcheck run` folders) per-rank summaries, and
    read the job's documents (run.json, ds_config.json, model.json) found beside them."""
    found = Inputs()
    for raw in paths:
        path = os.fspath(raw)
        if os.path.isfile(path):
            found.traces.append(path)
            _read_documents(os.path.dirname(os.path.abspath(path)), found, ("model.json",))
        elif os.path.isdir(path):
            _scan_folder(path, found)
        elif os.path.lexists(path):
            raise UserError("not a regular file or folder (a broken link, a FIFO, a device?)", path)
        else:
            raise UserError("no such file or folder", path)
    for path in found.traces + [s.path for s in found.summaries]:
        found.sizes[path] = file_size(path)  # 0 when unreadable: reading it reports the problem
    return found


TRACES_DIR = "traces"  # where `overlapcheck run` puts the traces of a run folder (capture/layout.py)


def _scan_folder(folder: str, found: Inputs) -> None:
    """A folder of traces, or a run folder: summaries and run.json at the top, the traces in `traces/`."""
    names = _visible(folder)
    summaries = {int(m.group(1)): n for n in names if (m := _SUMMARY.match(n))}
    _read_documents(folder, found)
    paths = [os.path.join(folder, n) for n in names]
    if os.path.isfile(os.path.join(folder, "run.json")) and os.path.isdir(os.path.join(folder, TRACES_DIR)):
        paths += [os.path.join(folder, TRACES_DIR, n) for n in _visible(os.path.join(folder, TRACES_DIR))]
    traces = [p for p in paths if _TRACE_FILE.search(p) and not _NOT_TRACES.search(os.path.basename(p))]
    trace_of_rank: dict[int, str] = {}
    for path in traces:
        m = _RANK_FILE.match(os.path.basename(path))
        if m and int(m.group(1)) in summaries:
            trace_of_rank[int(m.group(1))] = path  # the rank's own summary stands for it
            continue
        found.traces.append(path)
    for rank, name in summaries.items():
        found.summaries.append(Summary(os.path.join(folder, name), trace_of_rank.get(rank)))
    if not traces and not summaries:
        raise UserError("no trace files (*.json, *.json.gz) in this folder", folder)


DOCUMENTS = {"run.json": "run", "ds_config.json": "ds_config", "model.json": "model"}
WHAT = {"run.json": "a run manifest", "ds_config.json": "a DeepSpeed config", "model.json": "a model description"}


def _visible(folder: str) -> list[str]:
    """The names in a folder, sorted, without hidden ones (temp files of interrupted writes, editors' files)."""
    return sorted(n for n in os.listdir(folder) if not n.startswith("."))


def _read_documents(folder: str, found: Inputs, names: Sequence[str] = tuple(DOCUMENTS)) -> None:
    """The job's documents in a folder (all of them beside a folder of traces; only model.json beside a trace
    file given by name), each the first one found over all inputs."""
    for name in names:
        attr = DOCUMENTS[name]
        path = os.path.join(folder, name)
        if getattr(found, attr) is None and os.path.isfile(path):
            doc = read_json_file(path, WHAT[name])
            if attr == "ds_config" and not isinstance(doc, dict):
                raise UserError("a DeepSpeed config must be a JSON object", path)
            setattr(found, attr, doc if isinstance(doc, dict) else None)


def read_ds_config(path: str) -> dict[str, Any]:
    """A DeepSpeed config given by `--ds-config`."""
    config = read_json_file(path, "a DeepSpeed config")
    if not isinstance(config, dict):
        raise UserError("a DeepSpeed config must be a JSON object", path)
    return config


def job_context(inputs: Inputs, ds_config: dict[str, Any] | None = None, network: Network | None = None) -> JobContext:
    """The job context: `ds_config` (given by the user) wins over the one found beside the traces; `network` is
    `--network`."""
    return JobContext.build(ds_config if ds_config is not None else inputs.ds_config, inputs.run, inputs.model, network)


# -- one rank --------------------------------------------------------------------------------------------------


def analyze_trace(
    path: str,
    job: JobContext | None = None,
    options: Options | None = None,
    progress: Callable[[int], None] | None = None,
    workers: int = 1,
) -> RankResult:
    """One trace file -> its metrics, findings, collective signature and (when asked) timeline.

    `progress(n)` is called with the number of file bytes read so far; `workers` processes decode it."""
    options = options or Options()
    model = load_trace(path, progress, workers)
    if options.steps is not None:
        model = restrict_to_steps(model, options.steps)
    metrics = analyze_model(model)
    metrics = with_bandwidth(model, metrics, job)
    if options.steps is not None:
        metrics = dataclasses.replace(metrics, notes=[*metrics.notes, steps_note(options.steps, metrics)])
    blames: list[Blame] = []
    findings: list[Finding]
    signature: CollectiveSignature | None
    if not options.diagnose:
        findings, signature = [], None
    elif options.timelines:
        findings, signature, blames = diagnose_rank_located(model, metrics, job or JobContext())
    else:
        findings, signature = diagnose_rank(model, metrics, job or JobContext())
    timeline = timeline_of(model, metrics, blames) if options.timelines else None
    return RankResult(metrics, findings, signature, timeline, blames)


def steps_note(steps: frozenset[int], metrics: RankMetrics) -> str:
    """The note a step-restricted rank carries in its `notes` (docs/metrics.md, "Selected steps and ranks")."""
    have = [s.step for s in metrics.steps]
    text = f"analysis restricted to steps {format_numbers(steps)} (--steps): every number covers only them"
    return text + ("" if have else "; none of them is in this trace")


def format_numbers(numbers: frozenset[int] | set[int]) -> str:
    """{0, 1, 2, 3, 8} -> '0-3,8'."""
    out: list[str] = []
    for n in sorted(numbers):
        if out and (last := out[-1].split("-")[-1]) and int(last) == n - 1:
            out[-1] = f"{out[-1].split('-')[0]}-{n}"
        else:
            out.append(str(n))
    return ",".join(out)


def _worker(
    path: str, job: JobContext, options: Options, progress: Callable[[int], None] | None = None, workers: int = 1
) -> Outcome:
    try:
        result = analyze_trace(path, job, options, progress, workers)
        if options.ranks is not None and result.metrics.rank not in options.ranks:
            return path, [], None  # a file whose name does not say its rank: read, and it was another rank's
        return path, [result], None
    except UserError as exc:
        return path, [], str(exc)
    except MemoryError:
        return path, [], f"{path}: out of memory while reading this trace"


def read_summary(summary: Summary) -> Outcome:
    """The ranks a per-rank summary holds (its findings are that rank's own)."""
    try:
        report = Report.from_dict(read_json_file(summary.path, "an overlapcheck summary"), summary.path)
    except UserError as exc:
        return summary.path, [], str(exc)
    sigs = report.collective_signatures or {}
    out = []
    for metrics in report.ranks:
        findings = [f for f in report.findings if metrics.rank in f.ranks]
        out.append(RankResult(metrics, findings, sigs.get(str(metrics.rank))))
    return summary.path, out, None


# -- every rank -------------------------------------------------------------------------------------------------


def analyze_inputs(
    inputs: Inputs,
    job: JobContext,
    options: Options | None = None,
    jobs: int | None = None,
    on_bytes: Callable[[int], None] | None = None,
    scheduler: str | None = None,
) -> Report:
    """The Report of `inputs`. Unreadable inputs are listed in `errors` and left out; the other ranks are still
    reported.

    `on_bytes(n)` is called as input bytes are consumed (n = bytes since the last call; the total is
    `inputs.total_bytes`): byte by byte within a file when ranks are read in this process, a whole file at a
    time when they are read in parallel. `scheduler`: the Dask scheduler whose workers analyze the traces
    (overlapcheck/executors.py; default: this machine, `jobs` processes)."""
    options = options or Options()
    inputs = select_ranks(inputs, options.ranks)
    outcomes: list[Outcome] = []
    advance = on_bytes or (lambda n: None)
    summaries = inputs.summaries
    if options.prefer_traces or options.steps is not None:  # summaries carry no events and cover every step
        inputs = dataclasses.replace(inputs, traces=inputs.traces + [s.trace for s in summaries if s.trace is not None])
        summaries = [s for s in summaries if s.trace is None]
    for summary in summaries:
        outcome = read_summary(summary)
        if options.steps is not None and outcome[2] is None:
            note = "--steps not applied: this rank has a summary and no trace beside it"
            outcome = (outcome[0], [_noted(r, note) for r in outcome[1]], None)
        if outcome[2] is not None and summary.trace is not None:
            outcome = _worker(summary.trace, job, options)  # an unreadable summary: read the rank's trace
        outcomes.append(outcome)
        advance(inputs.sizes.get(summary.path, 0))
    outcomes += executor(scheduler, jobs).run(_worker, inputs.traces, job, options, inputs.sizes, advance)
    return build_report(outcomes, inputs, job, options)


def select_ranks(inputs: Inputs, ranks: frozenset[int] | None) -> Inputs:
    """`inputs` less the files of ranks not in `ranks`: by the rank in the file name (a trace whose name states
    none is read, then kept only if its distributedInfo rank is selected)."""
    if ranks is None:
        return inputs

    def wanted(path: str) -> bool:
        try:
            rank = rank_from_name(path)
        except UserError:
            return True  # reading it reports the problem
        return rank is None or rank in ranks

    traces = [t for t in inputs.traces if wanted(t)]
    summaries = [
        s for s in inputs.summaries if (m := _SUMMARY.match(os.path.basename(s.path))) and int(m.group(1)) in ranks
    ]
    kept = set(traces) | {s.path for s in summaries}
    return dataclasses.replace(
        inputs, traces=traces, summaries=summaries, sizes={k: v for k, v in inputs.sizes.items() if k in kept}
    )


def _noted(result: RankResult, note: str) -> RankResult:
    m = result.metrics
    return dataclasses.replace(result, metrics=dataclasses.replace(m, notes=[*m.notes, note]))


def build_report(outcomes: list[Outcome], inputs: Inputs, job: JobContext, options: Options) -> Report:
    """Resolve ranks, merge the findings and assemble the Report."""
    errors = [InputError(path, err) for path, _, err in outcomes if err]
    results = _resolve_ranks([r for _, rs, _ in outcomes for r in rs], errors)
    results.sort(key=lambda r: r.metrics.rank if r.metrics.rank is not None else -1)
    results = with_topology(results, job)  # where the ranks are: intra- or inter-node collectives, their peaks
    findings, share = merge_findings(results, job) if options.diagnose else ([], None)
    if options.timelines and findings:
        results = [_link_blames(r, findings) for r in results]
    ranks = [r.metrics for r in results]
    return Report(
        tool=Tool("overlapcheck", __version__),
        run=inputs.run,
        ranks=ranks,
        summary=summarize(ranks),
        findings=findings,
        findings_explain_share=share,
        errors=sorted(errors, key=lambda e: e.source),
        collective_signatures={str(r.metrics.rank): r.signature for r in results if r.signature is not None}
        if options.signatures
        else None,
        timelines={
            r.metrics.rank: r.timeline for r in results if r.timeline is not None and r.metrics.rank is not None
        },
        bandwidth=job_bandwidth(results, job),
    )


def _link_blames(result: RankResult, findings: list[Finding]) -> RankResult:
    """Point each blamed host event of a rank at its merged finding (index in `findings`), by finding identity;
    drop those whose finding is not reported."""
    if not result.blames:
        return result
    index: dict[str, int] = {}
    for i, f in enumerate(findings):
        index.setdefault(finding_key(f), i)
    # a rank's finding that the merge dropped (an inherent cause that costs too little) blames nothing
    blames = [dataclasses.replace(b, finding=index[b.key]) for b in result.blames if b.key in index]
    timeline = dataclasses.replace(result.timeline, host=blames) if result.timeline is not None else None
    return dataclasses.replace(result, blames=blames, timeline=timeline)


def _resolve_ranks(results: list[RankResult], errors: list[InputError]) -> list[RankResult]:
    """Give every rank a number; drop (as errors) files that claim the same rank or none."""
    if len(results) == 1 and results[0].metrics.rank is None:
        m = results[0].metrics
        note = "rank unknown (no distributedInfo.rank, no rank in the file name): assumed 0"
        return [dataclasses.replace(results[0], metrics=dataclasses.replace(m, rank=0, notes=[*m.notes, note]))]
    by_rank: dict[int, list[RankResult]] = {}
    for r in results:
        if r.metrics.rank is None:
            source = r.metrics.source
            errors.append(
                InputError(
                    source,
                    f"{source}: cannot tell the rank: no distributedInfo.rank and no rank-N/workerN in the file name",
                )
            )
            continue
        by_rank.setdefault(r.metrics.rank, []).append(r)
    out = []
    for rank, same in by_rank.items():
        if len(same) == 1:
            out.append(same[0])
            continue
        sources = ", ".join(r.metrics.source for r in same)
        for r in same:
            errors.append(
                InputError(r.metrics.source, f"{r.metrics.source}: rank {rank} is claimed by several files ({sources})")
            )
    return out


# -- the public entry point ----------------------------------------------------------------------------------------


def analyze(
    paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    ds_config: dict[str, Any] | str | os.PathLike[str] | None = None,
    *,
    diagnose: bool = True,
    timelines: bool = False,
    jobs: int | None = None,
    steps: Sequence[int] | None = None,
    ranks: Sequence[int] | None = None,
    scheduler: str | None = None,
) -> Report:
    """Analyze trace files and folders (or `overlapcheck run` folders) into a Report, as `overlapcheck analyze`
    does: `Report.to_dict()` is its JSON document. `ds_config` is the DeepSpeed config (a dict or a JSON
    file); by default the one found beside the traces. Bad input raises `overlapcheck.UserError`; files that
    cannot be read are listed in `Report.errors` and the other ranks are still reported. `steps` and `ranks`
    restrict the analysis as `--steps` and `--ranks` do (docs/metrics.md, "Selected steps and ranks");
    `scheduler` runs the per-rank work on a Dask cluster, as `--scheduler` does (docs/scale.md)."""
    if isinstance(paths, str | os.PathLike):
        paths = [paths]
    config = read_ds_config(os.fspath(ds_config)) if isinstance(ds_config, str | os.PathLike) else ds_config
    inputs = find_inputs(paths)
    options = Options(
        diagnose=diagnose,
        timelines=timelines,
        steps=frozenset(steps) if steps is not None else None,
        ranks=frozenset(ranks) if ranks is not None else None,
    )
    return analyze_inputs(inputs, job_context(inputs, config), options, jobs, scheduler=scheduler)


__all__ = ["Inputs", "Options", "ReportFormatError", "analyze", "analyze_inputs", "analyze_trace", "find_inputs"]
