"""From paths to the Report: find the inputs once, build the job context, analyze and diagnose each rank in
parallel, merge.

    paths -> Inputs (find_inputs) -> JobContext (job_context)
          -> per trace, in a worker: TraceModel -> RankMetrics -> findings + signature (+ timeline) = RankResult
          -> per summary: the RankResult it holds
          -> merge_findings over every RankResult -> Report

The parent only merges small objects, so memory stays per file and ranks use every core. docs/architecture.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import math
import operator
import os
import re
import stat
import zlib
from collections.abc import Callable, Iterable, Sequence, Set
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

import numpy as np

from overlapcheck import __version__
from overlapcheck.analysis.activities import activities_of
from overlapcheck.analysis.bandwidth import with_bandwidth, with_topology
from overlapcheck.analysis.crossrank import job_notes, summarize
from overlapcheck.analysis.metrics import analyze_model
from overlapcheck.analysis.modules import ModuleIndex, merge_modules, module_comm
from overlapcheck.analysis.select import restrict_to_steps
from overlapcheck.analysis.timeline import timeline_of
from overlapcheck.compact import with_packed_steps
from overlapcheck.diagnose import accounting_notes, diagnose_rank, diagnose_rank_located, merge_findings
from overlapcheck.diagnose.facts.job import JobFacts
from overlapcheck.diagnose.locate import finding_key
from overlapcheck.errors import UserError
from overlapcheck.executors import Outcome, executor
from overlapcheck.fsutil import file_size, is_own_json, json_document, not_a_file, read_bytes, read_json_file
from overlapcheck.job import JobContext, Network, sanitize_run
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
from overlapcheck.rank_pattern import check_rank_pattern, rank_by_pattern
from overlapcheck.selection import API, CLI, MAX_NUMBER, Caller, Numbers, how_many
from overlapcheck.trace.model import TraceModel
from overlapcheck.trace.reader import MAX_RANK, load_trace, rank_from_name, valid_world

_TRACE_FILE = re.compile(r"\.json(\.gz)?$", re.IGNORECASE)
_NOT_TRACES = re.compile(
    r"(^run\.json$|^truth\.json$|^ds_config\.json$|^model\.json$|\.summary\.json$|\.status\.json$)", re.IGNORECASE
)
# a name that says it is a report or a baseline, not a trace, unless it also states a rank (`node-baseline_rank1`)
_REPORT_WORDS = re.compile(r"report|baseline", re.IGNORECASE)
SUMMARY_NAME = re.compile(r"^rank([0-9]+)\.summary\.json$")  # a rank's summary, by name (ASCII digits)
_RANK_FILE = re.compile(r"^rank([0-9]+)\.")


@dataclass(frozen=True)
class Summary:
    """A per-rank summary written by `overlapcheck run`, and the rank's trace to read if it is unreadable."""

    path: str
    trace: str | None = None
    sha256: str | None = None  # the digest the run recorded for it (run.json, else status/), if any


@dataclass
class Inputs:
    """What a set of paths holds: trace files, per-rank summaries, and the job's documents found beside them."""

    traces: list[str] = field(default_factory=list)
    summaries: list[Summary] = field(default_factory=list)
    run: dict[str, Any] | None = None  # run.json
    ds_config: dict[str, Any] | None = None  # ds_config.json beside the traces
    model: dict[str, Any] | None = None  # model.json beside the traces
    sizes: dict[str, int] = field(default_factory=dict)  # bytes of each file to read
    documents: list[str] = field(default_factory=list)  # the paths of run.json, ds_config.json, model.json read
    notes: list[str] = field(default_factory=list)  # documents found and not read (a FIFO named ds_config.json)

    @property
    def total_bytes(self) -> int:
        return sum(self.sizes.values())

    @property
    def count(self) -> int:
        return len(self.traces) + len(self.summaries)

    @property
    def files(self) -> list[str]:
        """Every file these inputs read or may read (a summary's trace too): what no output may replace."""
        out = [*self.traces, *self.documents]
        for s in self.summaries:
            out += [s.path] + ([s.trace] if s.trace is not None else [])
        return out


@dataclass(frozen=True)
class Options:
    """What to compute beyond the metrics."""

    diagnose: bool = True
    timelines: bool = False  # every selected step of each rank, for the HTML page and the Perfetto file
    signatures: bool = False  # keep each rank's collective signature in the Report (per-rank summaries)
    steps: Set[int] | None = None  # analyze only these ProfilerSteps (--steps; analysis/select.py)
    ranks: Set[int] | None = None  # analyze only these ranks (--ranks): other ranks' files are not read
    prefer_traces: bool = False  # read a rank's trace rather than its summary when both are there
    config_given: bool = False  # a ds_config given by the caller: a summary holds findings under the run's own
    rank_from: str | None = None  # --rank-from REGEX: each trace's rank is the number it matches in the file's path
    caller: Caller = CLI  # how errors name the selection: the CLI's options or the API's parameters


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
    _drop_repeats(found)
    for path in found.traces + [s.path for s in found.summaries]:
        found.sizes[path] = file_size(path)  # 0 when unreadable: reading it reports the problem
    found.notes.extend(_resized_traces(found))
    return found


def _resized_traces(found: Inputs) -> list[str]:
    """A note when traces of a run folder are not the size run.json records for them (`capture.trace_bytes`):
    traces of another job, or of a rerun, copied over the run's."""
    run_json = next((d for d in found.documents if os.path.basename(d) == "run.json"), None)
    entries = (found.run or {}).get("ranks")
    if run_json is None or not isinstance(entries, list):
        return []
    folder = os.path.dirname(run_json)
    recorded: dict[str, int] = {}
    for entry in entries:
        capture = entry.get("capture") if isinstance(entry, dict) else None
        trace, size = (capture.get("trace"), capture.get("trace_bytes")) if isinstance(capture, dict) else (None, None)
        if isinstance(trace, str) and isinstance(size, int) and not isinstance(size, bool):
            recorded[os.path.normpath(os.path.join(folder, trace))] = size
    paths = found.traces + [s.trace for s in found.summaries if s.trace is not None]
    now = {p: found.sizes.get(p) or file_size(p) for p in paths if os.path.normpath(p) in recorded}
    moved = [
        (p, recorded[os.path.normpath(p)], size) for p, size in now.items() if size != recorded[os.path.normpath(p)]
    ]
    if not moved:
        return []
    shown = "; ".join(f"{os.path.basename(p)}: {was:,} bytes in run.json, {now:,} now" for p, was, now in moved[:3])
    more = f" and {len(moved) - 3} more" if len(moved) > 3 else ""
    return [f"traces differ from what run.json records ({shown}{more}): are they of the run that wrote it?"]


def _drop_repeats(found: Inputs) -> None:
    """A file named twice (the same path, a folder and a file in it, or a link to it) is read once."""
    seen: set[str] = set()

    def first(path: str) -> bool:
        key = os.path.realpath(path)
        if key in seen:
            return False
        seen.add(key)
        return True

    found.traces = [p for p in found.traces if first(p)]
    found.summaries = [s for s in found.summaries if first(s.path)]


TRACES_DIR = "traces"  # where `overlapcheck run` puts the traces of a run folder (capture/layout.py)
STATUS_DIR = "status"  # and its ranks' status records, named like traces (rank0.json) and never traces


def _scan_folder(folder: str, found: Inputs) -> None:
    """A folder of traces, or a run folder: summaries and run.json at the top, the traces in `traces/`."""
    names = _visible(folder)
    summaries: dict[int, str] = {}
    for n in names:
        if (m := SUMMARY_NAME.match(n)) and (other := summaries.setdefault(int(m.group(1)), n)) != n:
            raise UserError(f"{other} and {n} both name rank {int(m.group(1))}: keep one", folder)
    _read_documents(folder, found)
    paths = [os.path.join(folder, n) for n in names]
    # a run folder (run.json, traces/): run.json even when it cannot be read (a FIFO: the note says it)
    if os.path.lexists(os.path.join(folder, "run.json")) and os.path.isdir(os.path.join(folder, TRACES_DIR)):
        paths += [os.path.join(folder, TRACES_DIR, n) for n in _visible(os.path.join(folder, TRACES_DIR))]
    traces = [p for p in paths if _trace_name(os.path.basename(p))]
    found.notes.extend(_skipped_by_name(paths) + _skipped_by_suffix(paths))
    own = [p for p in traces if _own_output(p)]
    traces = [p for p in traces if p not in own]
    trace_of_rank: dict[int, str] = {}
    for path in traces:
        m = _RANK_FILE.match(os.path.basename(path))
        if m and int(m.group(1)) in summaries:
            rank = int(m.group(1))
            if rank in trace_of_rank:
                raise UserError(f"{trace_of_rank[rank]} and {path} are both the trace of rank {rank}: keep one")
            trace_of_rank[rank] = path  # the rank's own summary stands for it
            continue
        found.traces.append(path)
    digests = _summary_digests(found.run) if os.path.join(folder, "run.json") in found.documents else {}
    for rank, name in summaries.items():
        digest = digests.get(rank) or _status_digest(folder, rank)
        found.summaries.append(Summary(os.path.join(folder, name), trace_of_rank.get(rank), digest))
    if not traces and not summaries:
        skipped = (
            f" (only overlapcheck's own outputs: {', '.join(os.path.basename(p) for p in own[:3])})" if own else ""
        )
        if os.path.lexists(os.path.join(folder, "run.json")) and os.path.isdir(os.path.join(folder, TRACES_DIR)):
            # a run folder: its status/ holds run's own JSON files, no traces to point at
            raise UserError(f"no trace files (*.json, *.json.gz) in this run folder's {TRACES_DIR}/{skipped}", folder)
        raise UserError(f"no trace files (*.json, *.json.gz) in this folder{skipped}{_below(folder, names)}", folder)


def _summary_digests(run: dict[str, Any] | None) -> dict[int, str]:
    """rank -> the sha256 of the summary `overlapcheck run` wrote for it, as run.json records it (runs of
    overlapcheck 0.x before the digest, and hand-written run.json files, record none)."""
    out: dict[int, str] = {}
    entries = (run or {}).get("ranks")
    for entry in entries if isinstance(entries, list) else []:
        summary = entry.get("summary") if isinstance(entry, dict) else None
        digest = summary.get("sha256") if isinstance(summary, dict) else None
        rank = entry.get("rank") if isinstance(entry, dict) else None
        if isinstance(digest, str) and isinstance(rank, int) and not isinstance(rank, bool):
            out[rank] = digest
    return out


def _status_digest(folder: str, rank: int) -> str | None:
    """The sha256 a run folder's summary process recorded for rank `rank`'s summary in
    `status/rank<R>.summary.json` (capture/layout.py), for a summary that run.json does not record (it was still
    being written when run.json was): None when there is none to read."""
    path = os.path.join(folder, "status", f"rank{rank}.summary.json")
    if not os.path.isfile(path):
        return None
    try:
        record = read_json_file(path, "a summary's status record")
    except UserError:
        return None
    digest = record.get("sha256") if isinstance(record, dict) else None
    return digest if isinstance(digest, str) else None


def _trace_name(name: str) -> bool:
    """Whether a file name in a folder names a trace (*.json, *.json.gz, none of the job's own documents, and not
    named as a report or baseline unless it states a rank: `_report_named`)."""
    return bool(_TRACE_FILE.search(name)) and not _NOT_TRACES.search(name) and not _report_named(name)


def _skipped_by_name(paths: list[str]) -> list[str]:
    """A note naming the *.json(.gz) files of a folder skipped as named reports or baselines that are not
    overlapcheck's own (those are skipped unsaid): another tool's report, or a trace whose name states no rank."""
    skipped = [
        os.path.basename(p)
        for p in paths
        if _TRACE_FILE.search(p) and _report_named(os.path.basename(p)) and not _own_output(p)
    ]
    if not skipped:
        return []
    shown = ", ".join(skipped[:3]) + (f" and {len(skipped) - 3} more" if len(skipped) > 3 else "")
    return [f"not read as traces: {shown} (named as a report or baseline; give a file by name to read it)"]


_OTHER_SUFFIX = re.compile(r"\.json\.(gzip|bz2|xz|zst|zstd|lz4|zip|tgz|7z)$", re.IGNORECASE)


def _skipped_by_suffix(paths: list[str]) -> list[str]:
    """A note naming the files of a folder that look like traces kept under another suffix (`rank3.json.gzip`,
    `rank3.json.zst`), which a folder's scan does not read: the ranks they hold would be missing unsaid."""
    skipped = [os.path.basename(p) for p in paths if _OTHER_SUFFIX.search(os.path.basename(p))]
    if not skipped:
        return []
    shown = ", ".join(skipped[:3]) + (f" and {len(skipped) - 3} more" if len(skipped) > 3 else "")
    return [f"not read as traces: {shown} (a folder's traces are *.json or *.json.gz: rename or decompress them)"]


def _report_named(name: str) -> bool:
    """Whether a *.json(.gz) name says it is a report or a baseline (`report.json`, `baseline-a100.json`), not a
    trace: a name that also states a rank is a trace's (a host named `baseline-3` keeps its ranks)."""
    if not _REPORT_WORDS.search(name):
        return False
    try:
        return rank_from_name(name) is None
    except UserError:
        return False  # names several ranks: read, and the reader says so


def _below(folder: str, names: list[str]) -> str:
    """'; sub/ holds 2 trace files: give that folder' for the first few subfolders of `folder` that hold
    traces (what a "no trace files" error lists), '' when none does. One level down, regular names only."""
    held: list[str] = []
    run_folder = os.path.isfile(os.path.join(folder, "run.json"))
    for n in names:
        sub = os.path.join(folder, n)
        if run_folder and n == STATUS_DIR:
            continue
        if len(held) == 3 or not os.path.isdir(sub) or os.path.islink(sub):
            continue
        try:
            count = sum(1 for m in _visible(sub) if _trace_name(m))
        except OSError:
            continue
        if count:
            held.append(f"{n}/ holds {count} trace file(s)")
    return f"; {', '.join(held)}: give that folder" if held else ""


def _own_output(path: str) -> bool:
    """Whether the .json / .json.gz file `path` in a folder of traces is one of overlapcheck's own outputs (a
    report, a comparison, a Perfetto export written beside the traces), which scanning the folder skips: read
    as a trace it was an error, and every later `analyze FOLDER` exited 2. Reads the first bytes of a regular file
    only (opening a FIFO would block until a writer comes: the reader reports it)."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return False
        with open(path, "rb") as fh:
            head = fh.read(512)
        if head[:2] == b"\x1f\x8b":
            head = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(head, 512)
    except (OSError, zlib.error):
        return False  # reading it as a trace says what is wrong
    return is_own_json(head)


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
        if getattr(found, attr) is not None:
            found.notes.extend(_another_document(path, name, getattr(found, attr), found.documents))
        elif (why := not_a_file(path)) is not None:
            found.notes.append(f"{path} is {why}, not {WHAT[name]}: not read (the job is analyzed without it)")
        elif os.path.isfile(path):
            doc = read_json_file(path, WHAT[name])
            if attr in ("ds_config", "run") and not isinstance(doc, dict):
                raise UserError(f"{WHAT[name]} must be a JSON object", path)
            if attr == "run" and isinstance(doc, dict):
                doc, notes = sanitize_run(doc)
                found.notes.extend(notes)
            setattr(found, attr, doc if isinstance(doc, dict) else None)
            found.documents.append(path)


def _another_document(path: str, name: str, used: dict[str, Any], documents: list[str]) -> list[str]:
    """A note when a later input folder holds a `name` (ds_config.json, run.json, model.json) other than the one
    read: the first one found is used, and which one that is must not depend on the order of the arguments
    unsaid."""
    first = next((d for d in documents if os.path.basename(d) == name), None)
    if first is None or not os.path.isfile(path) or os.path.samefile(first, path):
        return []
    try:
        same = read_json_file(path, WHAT[name]) == used
    except UserError:
        same = False
    return [] if same else [f"{path} differs from {first}, which is used: are these inputs of one job?"]


def read_ds_config(path: str) -> dict[str, Any]:
    """A DeepSpeed config given by `--ds-config`."""
    config = read_json_file(path, "a DeepSpeed config")
    if not isinstance(config, dict):
        raise UserError("a DeepSpeed config must be a JSON object", path)
    return config


def job_context(inputs: Inputs, ds_config: dict[str, Any] | None = None, network: Network | None = None) -> JobContext:
    """The job context: `ds_config` (given by the user) wins over the one found beside the traces; `network` is
    `--network`."""
    config = ds_config if ds_config is not None else inputs.ds_config
    return JobContext.build(config, inputs.run, inputs.model, network, found=inputs.notes)


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
    named = rank_by_pattern(path, options.rank_from, options.caller) if options.rank_from is not None else None
    model = load_trace(path, progress, workers)
    model.notes.extend(_long_names(model) + _precision_notes(model))
    in_trace = tuple(sorted({int(n) for n in model.steps.number}))
    if options.steps is not None:
        model = restrict_to_steps(model, [n for n in in_trace if n in options.steps])  # the selection is not expanded
    acts = activities_of(model)
    metrics = analyze_model(model, acts)
    modules = module_comm(model, acts)
    index = ModuleIndex.of(model, acts) if options.diagnose else None
    del acts
    if named is not None and named != metrics.rank:
        said = f"distributedInfo.rank {metrics.rank}" if metrics.rank is not None else "no rank"
        option = options.caller.option("rank_from").rstrip("=")
        note = f"rank {named} from the file's path ({option}); the trace says {said}"
        metrics = dataclasses.replace(metrics, rank=named, notes=[*metrics.notes, note])
    metrics = with_bandwidth(model, metrics, job)
    if options.steps is not None:
        metrics = dataclasses.replace(metrics, notes=[*metrics.notes, steps_note(options.steps, metrics)])
    blames: list[Blame] = []
    findings: list[Finding]
    signature: CollectiveSignature | None
    if not options.diagnose:
        findings, signature = [], None
    elif options.timelines:
        findings, signature, blames = diagnose_rank_located(model, metrics, job or JobContext(), index)
    else:
        findings, signature = diagnose_rank(model, metrics, job or JobContext(), index)
    timeline = timeline_of(model, metrics, blames) if options.timelines else None
    return RankResult(
        metrics, findings, signature, timeline, blames, trace_steps=in_trace, modules=modules,
        clock_base_us=_clock_base_us(model.metadata),
    )  # fmt: skip


def _clock_base_us(metadata: dict[str, Any]) -> float:
    """Kineto's `baseTimeNanoseconds` in µs: torch 2's traces count `ts` from it (one per process, so ranks on
    two hosts, or two runs, can share `ts` yet be hours apart); 0 where there is none (torch 1.x writes `ts` since
    the epoch) or it is not a time."""
    base = metadata.get("baseTimeNanoseconds")
    if isinstance(base, bool) or not isinstance(base, int | float) or not math.isfinite(base) or base < 0:
        return 0.0
    return float(base) / 1000.0


MAX_NAME = 8192  # characters of a name in the outputs (a 1 MB name made a 200 MB page; C++ templates reach 5,000)
FINE_US = 1.0  # a timestamp's float step (µs) from which sub-µs durations are lost (trace/model.py: COARSE_US)


def _long_names(model: TraceModel) -> list[str]:
    """Cut names longer than MAX_NAME (in place; each keeps its length and a checksum, so that two long names
    stay apart) and say so. Classification happened at the reader, on the whole name."""
    cut = 0
    for i, name in enumerate(model.names):
        if len(name) > MAX_NAME:
            tag = f"... [{len(name)} characters, crc {zlib.crc32(name.encode('utf-8', 'replace')):08x}]"
            model.names[i] = name[: MAX_NAME - len(tag)] + tag
            cut += 1
    return [f"{cut} names longer than {MAX_NAME} characters were cut to {MAX_NAME} in every output"] if cut else []


def _precision_notes(model: TraceModel) -> list[str]:
    """A note when the timestamps are so large that float64 cannot tell sub-µs apart (2^52 µs and beyond: every
    duration shorter than the float step is lost). The reader has already left out the times where nothing can
    be measured (beyond 2^62 µs, a 1 ms step) and refused a trace whose GPU work lies there (trace/model.py)."""
    largest = 0.0
    for table in (model.gpu, model.runtime, model.ops, model.syncs, model.steps):
        for column in ("start", "end"):
            values = getattr(table, column, None)
            if values is not None and len(values):
                largest = max(largest, float(np.max(np.abs(values))))
    step = float(np.spacing(largest)) if largest > 0 else 0.0
    if step < FINE_US:
        return []
    return [
        f"timestamps reach {largest:.3g} µs, where a float64 time moves in steps of {step:.3g} µs: durations and "
        "gaps shorter than that are lost or rounded (is the trace's clock in µs since the epoch or boot?)"
    ]


def steps_note(steps: Set[int], metrics: RankMetrics) -> str:
    """The note a step-restricted rank carries in its `notes` (docs/metrics.md, "Selected steps and ranks")."""
    have = {s.step for s in metrics.steps}
    text = f"analysis restricted to steps {format_numbers(steps)} (--steps): every number covers only them"
    if not have:
        return text + "; none of them is in this trace"
    wanted, found = how_many(steps), sum(1 for s in have if s in steps)
    if found == wanted:
        return text
    if wanted <= 10_000:
        return text + f"; step(s) {format_numbers({s for s in steps if s not in have})} not in this trace"
    return text + f"; {found} of the {wanted:,} steps selected are in this trace"


def format_numbers(numbers: Set[int], dash: str = "-") -> str:
    """{0, 1, 2, 3, 8} -> '0-3,8'."""
    return (numbers if isinstance(numbers, Numbers) else Numbers.of(numbers)).text(dash)


def _worker(
    path: str, job: JobContext, options: Options, progress: Callable[[int], None] | None = None, workers: int = 1
) -> Outcome:
    try:
        result = analyze_trace(path, job, options, progress, workers)
        if options.ranks is not None and result.metrics.rank not in options.ranks:
            return path, [], None  # a file whose name does not say its rank: read, and it was another rank's
        return path, [with_packed_steps(result)], None
    except UserError as exc:
        return path, [], str(exc)
    except MemoryError:
        return path, [], f"{path}: out of memory while reading this trace"


def read_summary(summary: Summary) -> Outcome:
    """The ranks a per-rank summary holds (its findings are that rank's own)."""
    what = "an overlapcheck summary"
    try:
        data = read_bytes(summary.path, what)
        if summary.sha256 is not None and hashlib.sha256(data).hexdigest() != summary.sha256:
            raise UserError(
                "not the summary this run wrote (the run recorded another sha256): another job's, or edited?",
                summary.path,
            )
        report = Report.from_dict(json_document(data, summary.path, what), summary.path)
    except UserError as exc:
        return summary.path, [], str(exc)
    named = SUMMARY_NAME.match(os.path.basename(summary.path))
    if len(report.ranks) != 1:  # a summary is its rank's own one-rank report (capture/summary.py)
        return summary.path, [], f"{summary.path}: holds {len(report.ranks)} ranks, not its own one rank"
    if named and report.ranks[0].rank != int(named.group(1)):
        said = report.ranks[0].rank
        return summary.path, [], f"{summary.path}: holds rank {said}, and its name says rank {int(named.group(1))}"
    sigs = report.collective_signatures or {}
    out = []
    modules = report.modules if len(report.ranks) == 1 else None  # a one-rank summary's modules are that rank's
    for metrics in report.ranks:
        findings = [f for f in report.findings if metrics.rank in f.ranks]
        out.append(RankResult(metrics, findings, sigs.get(str(metrics.rank)), modules=modules))
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
    everything = inputs
    if options.rank_from is not None:  # a bad pattern is one error, not one per file
        check_rank_pattern(inputs.traces, options.rank_from, options.caller)
    inputs = select_ranks(inputs, options.ranks, options.rank_from, options.caller)
    if options.ranks is not None and not inputs.count:
        raise UserError(
            f"{options.caller.numbers('ranks', options.ranks)} selects none of the inputs: "
            + _ranks_held(everything, options.rank_from)
        )
    outcomes: list[Outcome] = []
    advance = on_bytes or (lambda n: None)
    summaries = inputs.summaries
    # summaries carry no events, cover every step, and hold findings under the run's own ds_config
    if options.prefer_traces or options.steps is not None or options.config_given:
        inputs = dataclasses.replace(inputs, traces=inputs.traces + [s.trace for s in summaries if s.trace is not None])
        summaries = [s for s in summaries if s.trace is None]
    if options.steps is not None and summaries and not inputs.traces:
        raise UserError(
            f"{options.caller.numbers('steps', options.steps)} needs the ranks' traces, and these inputs hold only "
            f"per-rank summaries ({len(summaries)}), which cover every step: analyze a run whose traces were kept"
        )
    for summary in summaries:
        outcome = read_summary(summary)
        if options.steps is not None and outcome[2] is None:
            note = "--steps not applied: this rank has a summary and no trace beside it"
            outcome = (outcome[0], [_noted(r, note) for r in outcome[1]], None)
        if options.config_given and outcome[2] is None:
            note = (
                f"{options.caller.option('ds_config')} not applied: this rank has a summary and no trace beside it "
                "(its findings are under the run's own ds_config)"
            )
            outcome = (outcome[0], [_noted(r, note) for r in outcome[1]], None)
        if outcome[2] is not None and summary.trace is not None:  # an unreadable summary: read the rank's trace
            why = safe_reason(outcome[2], summary.path)
            outcome = _worker(summary.trace, job, options)
            if outcome[2] is None:
                note = f"read from its trace: its summary {os.path.basename(summary.path)} was not used ({why})"
                outcome = (outcome[0], [_noted(r, note) for r in outcome[1]], None)
        outcomes.append(outcome)
        advance(inputs.sizes.get(summary.path, 0))
    outcomes += executor(scheduler, jobs).run(_worker, inputs.traces, job, options, inputs.sizes, advance)
    report = build_report(outcomes, inputs, job, options)
    if options.ranks is not None and not report.ranks and not report.errors:
        raise UserError(
            f"{options.caller.numbers('ranks', options.ranks)} selects no rank of the traces read: "
            + _ranks_held(everything, options.rank_from)
        )
    if options.ranks is not None and report.ranks and (absent := _absent_ranks(report, options)):
        report = dataclasses.replace(report, notes=[*(report.notes or []), *absent])
    if options.ranks is None and (missing := _missing_ranks(report)):
        report = dataclasses.replace(report, notes=[*(report.notes or []), *missing])
    if options.steps is not None and report.ranks and not any(r.steps for r in report.ranks):
        held = sorted({n for _, results, _ in outcomes for r in results for n in r.trace_steps})
        there = f"the traces hold steps {format_numbers(set(held))}" if held else "the traces have no ProfilerStep"
        raise UserError(f"{options.caller.numbers('steps', options.steps)} selects no step of any rank: {there}")
    return report


def _absent_ranks(report: Report, options: Options) -> list[str]:
    """A note naming the selected ranks that are not in the report (`--ranks 1-5` of a 2-rank job): a partial
    selection is said, as an empty one is an error. Up to a million selected ranks are spelled out."""
    selected = options.ranks
    if selected is None or how_many(selected) > 1_000_000:
        return []
    absent = set(selected) - {r.rank for r in report.ranks}
    if not absent:
        return []
    world = next((w for r in report.ranks if (w := valid_world(r.world_size)) is not None), None)
    beyond = f" (the job's world size is {world})" if world is not None and max(absent) >= world else ""
    return [
        f"{options.caller.numbers('ranks', selected)}: rank(s) {format_numbers(absent)} not in these inputs{beyond}"
    ]


def _missing_ranks(report: Report) -> list[str]:
    """A note naming the ranks of the job's world size that the report lacks (4 traces of a 16-rank job): its
    cross-rank figures are then of the ranks read. Not an error: one rank's trace is often analyzed on purpose."""
    worlds = {w for r in report.ranks if (w := valid_world(r.world_size)) is not None}
    if not worlds and (stated := valid_world((report.run or {}).get("world_size"))) is not None:
        worlds = {stated}  # traces that say no world size (torch 1.x, CPU runs): run.json's
    if len(worlds) != 1:
        return []
    (world,) = worlds
    gaps, start = [], 0
    for rank in sorted({r.rank for r in report.ranks if r.rank is not None and 0 <= r.rank < world}):
        if rank > start:
            gaps.append((start, rank - 1))
        start = rank + 1
    if start < world:
        gaps.append((start, world - 1))
    if not gaps:
        return []
    read = len(report.ranks)
    return [
        f"rank(s) {Numbers(tuple(gaps)).text()} of the job's world size {world} are not in this report (not given, "
        f"or unreadable): the worst rank, stragglers and slow nodes are of the {read} rank(s) read"
    ]


def _ranks_held(inputs: Inputs, rank_from: str | None = None) -> str:
    """'the inputs hold ranks 0-7' from the file names, as --rank-from reads them when given (what a --ranks
    error lists)."""
    named: set[int] = set()
    unnamed = 0
    for path in inputs.traces + [s.path for s in inputs.summaries]:
        try:
            rank = rank_from_name(path) if rank_from is None else rank_by_pattern(path, rank_from)
        except UserError:
            rank = None
        if rank is None:
            unnamed += 1
        else:
            named.add(rank)
    held = f"the inputs hold rank(s) {format_numbers(named)}" if named else "no file name states a rank"
    return held + (f" ({unnamed} file(s) whose name states none)" if unnamed and named else "")


def select_ranks(inputs: Inputs, ranks: Set[int] | None, rank_from: str | None = None, caller: Caller = CLI) -> Inputs:
    """`inputs` less the files of ranks not in `ranks`: by the rank in the file name (a trace whose name states
    none is read, then kept only if its distributedInfo rank is selected), or the one `rank_from` reads there."""
    if ranks is None:
        return inputs

    def wanted(path: str) -> bool:
        try:
            rank = rank_from_name(path) if rank_from is None else rank_by_pattern(path, rank_from, caller)
        except UserError:
            return True  # reading it reports the problem
        return rank is None or rank in ranks

    traces = [t for t in inputs.traces if wanted(t)]
    summaries = [
        s for s in inputs.summaries if (m := SUMMARY_NAME.match(os.path.basename(s.path))) and int(m.group(1)) in ranks
    ]
    kept = set(traces) | {s.path for s in summaries}
    return dataclasses.replace(
        inputs, traces=traces, summaries=summaries, sizes={k: v for k, v in inputs.sizes.items() if k in kept}
    )


def safe_reason(error: str, path: str) -> str:
    """An input error without the path it starts with (said once, in the note that names the file)."""
    return error[len(path) + 2 :] if error.startswith(f"{path}: ") else error


def _noted(result: RankResult, note: str) -> RankResult:
    m = result.metrics
    return dataclasses.replace(result, metrics=dataclasses.replace(m, notes=[*m.notes, note]))


def build_report(outcomes: list[Outcome], inputs: Inputs, job: JobContext, options: Options) -> Report:
    """Resolve ranks, merge the findings and assemble the Report."""
    errors = [InputError(path, err) for path, _, err in outcomes if err]
    results = _resolve_ranks([r for _, rs, _ in outcomes for r in rs], errors)
    check_one_job(results, inputs.run)
    results.sort(key=lambda r: r.metrics.rank if r.metrics.rank is not None else -1)
    results = with_topology(results, job)  # where the ranks are: intra- or inter-node collectives, their peaks
    facts = JobFacts(results, job)  # the job-wide facts the cross-rank rules and the report share
    findings, share = merge_findings(facts) if options.diagnose else ([], None)
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
        bandwidth=facts.bandwidth,
        notes=[
            *job.notes,
            *_host_notes(ranks, job.hosts),
            *job_notes(ranks),
            *(accounting_notes(results) if options.diagnose else []),
        ]
        or None,
        modules=merge_modules([r.modules for r in results]),
    )


def _host_notes(ranks: list[RankMetrics], hosts: dict[int, str]) -> list[str]:
    """A note when run.json puts ranks on other hosts than their traces say (names compared up to the first dot:
    `node1` is `node1.cluster`): traces of a rerun copied over another run's folder, or another job's."""
    short = lambda name: name.split(".", 1)[0].lower()  # noqa: E731
    moved = [
        (r.rank, hosts[r.rank], r.host)
        for r in ranks
        if r.rank in hosts and r.host and short(hosts[r.rank]) != short(r.host)
    ]
    if not moved:
        return []
    shown = "; ".join(f"rank {rank}: {said} in run.json, {seen} in its trace" for rank, said, seen in moved[:3])
    more = f" and {len(moved) - 3} more" if len(moved) > 3 else ""
    return [f"run.json and the traces disagree on hosts ({shown}{more}): are the traces of the run that wrote it?"]


def _files(sources: list[str]) -> str:
    names = [os.path.basename(s) for s in sorted(sources)]
    return ", ".join(names[:2]) + (f" and {len(names) - 2} more" if len(names) > 2 else "")


def check_one_job(results: list[RankResult], run: dict[str, Any] | None) -> None:
    """UserError unless the ranks are of one job: one world size over every trace (and run.json's, when it says
    one), and, with several ranks, every rank below it. Each job's own analysis is what the user needs then."""
    worlds: dict[int, list[str]] = {}
    for r in results:
        if (w := valid_world(r.metrics.world_size)) is not None:
            worlds.setdefault(w, []).append(r.metrics.source)
    if len(worlds) > 1:
        parts = "; ".join(f"world size {w} in {_files(sources)}" for w, sources in sorted(worlds.items()))
        raise UserError(f"these traces are of more than one job ({parts}): analyze each job's traces on their own")
    stated = valid_world((run or {}).get("world_size"))
    if worlds and stated is not None and stated not in worlds:
        (w,) = worlds
        raise UserError(f"run.json says world size {stated}, the traces say {w}: are they of the run that wrote it?")
    _check_one_time(results)
    world = next(iter(worlds), stated)
    if world is None or len(results) < 2:
        return
    foreign = [r for r in results if r.metrics.rank is not None and r.metrics.rank >= world]
    if foreign:
        r = foreign[0]
        raise UserError(
            f"rank {r.metrics.rank} ({os.path.basename(r.metrics.source)}) is not below the job's world size "
            f"{world}: a trace of another job? (--rank-from REGEX reads ranks from file names)"
        )


APART_US = 300e6  # ranks of one job profile the same steps together; hosts' clocks differ by far less


def _check_one_time(results: list[RankResult]) -> None:
    """UserError when the ranks' profiled steps fall into stretches of time more than APART_US apart: the
    traces of two runs (of the same world size) put together, whose cross-rank findings (a straggler) would be
    made of nothing but the time between the runs. Times are since the epoch, `ts` plus the trace's base time, when
    every rank has one (a summary has none: then `ts` alone)."""
    windows = []
    known = all(r.clock_base_us for r in results if len(r.metrics.steps))  # a summary holds no base time
    for r in results:
        steps = r.metrics.steps
        if len(steps) and r.metrics.rank is not None:
            first, last = steps[0], steps[-1]
            base = r.clock_base_us if known else 0.0
            windows.append((base + first.start_us, base + last.start_us + last.duration_us, r.metrics.rank))
    windows.sort()
    end, before = -math.inf, None
    for start, stop, rank in windows:
        if before is not None and start - end > APART_US:
            raise UserError(
                f"these traces are of more than one run: rank {rank}'s steps start {(start - end) / 1e6:,.0f} s "
                f"after rank {before}'s end: analyze each run's traces on their own (--ranks selects some)"
            )
        if stop > end:
            end, before = stop, rank


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
    steps: Iterable[int | str] | None = None,
    ranks: Iterable[int | str] | None = None,
    rank_from: str | None = None,
    scheduler: str | None = None,
) -> Report:
    """Analyze trace files and folders (or `overlapcheck run` folders) into a Report, as `overlapcheck analyze`
    does: `Report.to_dict()` is its JSON document. `ds_config` is the DeepSpeed config (a dict or a JSON
    file); by default the one found beside the traces. Bad input raises `overlapcheck.UserError`; files that
    cannot be read are listed in `Report.errors` and the other ranks are still reported. `steps` and `ranks`
    restrict the analysis as `--steps` and `--ranks` do (docs/metrics.md, "Selected steps and ranks"); `rank_from`
    is `--rank-from`; `scheduler` runs the per-rank work on a Dask cluster, as `--scheduler` does (docs/scale.md)."""
    if isinstance(paths, str | os.PathLike):
        paths = [paths]
    if not isinstance(paths, Iterable) or isinstance(paths, bytes):
        raise UserError(f"paths must be a path or a list of paths, not {type(paths).__name__}")
    paths = list(paths)
    if not paths or not all(isinstance(p, str | os.PathLike) for p in paths):
        raise UserError("paths must be a non-empty list of trace files or folders (str or os.PathLike)")
    for flag, value in (("diagnose", diagnose), ("timelines", timelines)):
        whole = isinstance(value, int) or type(value).__name__ in ("bool", "bool_")  # numpy's bool too
        if not whole or value not in (0, 1):  # diagnose='no' was taken for True
            raise UserError(f"{flag} must be True or False, not {value!r}")
    if jobs is not None and (isinstance(jobs, bool) or not isinstance(jobs, int) or not 1 <= jobs <= 4096):
        raise UserError(f"jobs must be a whole number from 1 to 4096, not {jobs!r}")
    if rank_from is not None and not isinstance(rank_from, str):
        raise UserError(f"rank_from must be a regular expression (str), not {type(rank_from).__name__}")
    if scheduler is not None and not isinstance(scheduler, str):
        raise UserError(
            f"scheduler must be an address or a scheduler file's path (str), not {type(scheduler).__name__}"
        )
    config = read_ds_config(os.fspath(ds_config)) if isinstance(ds_config, str | os.PathLike) else ds_config
    if config is not None and not isinstance(config, dict):
        raise UserError(f"ds_config must be a dict or the path of a JSON file, not {type(config).__name__}")
    inputs = find_inputs(paths)
    options = Options(
        diagnose=bool(diagnose),
        timelines=bool(timelines),
        steps=_api_numbers(steps, "steps"),
        ranks=_api_numbers(ranks, "ranks"),
        rank_from=rank_from,
        config_given=config is not None,
        caller=API,
    )
    return analyze_inputs(inputs, job_context(inputs, config), options, jobs, scheduler=scheduler)


MAX_STEPS = 2**31  # step numbers one selection may hold: at a step a second, 68 years of training
MAX_LISTED = 1_000_000  # numbers an API selection is read one by one (a range is held as one, unread)


def _api_numbers(values: Iterable[int | str] | None, what: str) -> Numbers | None:
    """`steps` / `ranks` of the API: whole numbers, or strings of digits ('0'), as --steps / --ranks take them.
    A range is held as its bounds, never expanded; other iterables are read up to MAX_LISTED numbers."""
    if values is None:
        return None
    if isinstance(values, str | bytes) or not isinstance(values, Iterable):
        raise UserError(f"{what} must be a list of numbers, such as [0, 1], not {type(values).__name__}")
    most = MAX_RANK + 1 if what == "ranks" else MAX_STEPS
    if isinstance(values, range):
        count = max(0, (values.stop - values.start + values.step - (1 if values.step > 0 else -1)) // values.step)
        if count > most:
            raise UserError(
                f"{what}={values!r} holds {count:,} numbers, more than a job has {what} (at most {most:,}): "
                "select the ones the traces hold"
            )
        if count and abs(values.step) == 1:
            lo, hi = min(values[0], values[-1]), max(values[0], values[-1])
            for bad in (lo, hi):
                _api_number(bad, what)
            return Numbers(((lo, hi),))
    out = [_api_number(v, what) for v in islice(values, MAX_LISTED + 1)]
    if len(out) > MAX_LISTED:
        raise UserError(
            f"{what}: more than {MAX_LISTED:,} numbers, listed one by one: give a range (range(a, b)) for more"
        )
    return Numbers.of(out)


def _api_number(v: Any, what: str) -> int:
    """One number of an API selection (an int, a numpy integer or a digit string), else UserError."""
    number: int | None = None
    if isinstance(v, str) and v.strip().isascii() and v.strip().isdigit() and len(v.strip()) <= 19:
        number = int(v)
    elif not isinstance(v, bool | str | bytes):
        with contextlib.suppress(TypeError):
            number = operator.index(v)  # int, numpy integers
    if number is None or not 0 <= number <= MAX_NUMBER:
        raise UserError(f"{what}: {str(v)[:40]!r} is not a {what[:-1]} number (a whole number >= 0)")
    return number


__all__ = ["Inputs", "Options", "ReportFormatError", "analyze", "analyze_inputs", "analyze_trace", "find_inputs"]
