"""An independent reference for the overlap metric, used by the real-trace and HTA tests.

Plain Python: the trace is read with `json`, intervals are measured with a simple sweep line. It imports nothing
from `overlapcheck.analysis` or `overlapcheck.trace`, so it can check them.

Three definitions of "communication" and "compute" are implemented:

- MANIFEST (`/work/shared/traces/MANIFEST.md`): NCCL = `kernel` named `(^nccl.*)|(.*ncclKernel.*)`; compute = any
  other kernel whose name contains none of memcpy, memset, sync, launch, nccl (case-insensitive).
- OURS (`docs/metrics.md`): communication = an NCCL/RCCL kernel of any generation; compute = every other kernel.
- HTA 0.5.0 `get_comm_comp_overlap`, rule by rule (`HtaRules`), so that each rule's effect can be measured alone.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import re
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

KERNEL_CATS = ("kernel", "Kernel")
Interval = tuple[float, float]


@dataclass
class Kernel:
    name: str
    start: float
    end: float
    args: dict[str, Any]


@dataclass
class Trace:
    path: str
    metadata: dict[str, Any]
    events: list[dict[str, Any]]

    @property
    def rank(self) -> int | None:
        info = self.metadata.get("distributedInfo")
        rank = info.get("rank") if isinstance(info, dict) else None
        return rank if isinstance(rank, int) else None

    def kernels(self, cats: Iterable[str] = KERNEL_CATS) -> list[Kernel]:
        cats = set(cats)
        out = []
        for e in self.events:
            if e.get("ph") == "X" and e.get("cat") in cats and e.get("ts") is not None:
                dur = e.get("dur") or 0
                out.append(Kernel(e.get("name", ""), e["ts"], e["ts"] + max(dur, 0), e.get("args") or {}))
        return out


def load(path: str) -> Trace:
    """A trace file (.json or .json.gz; a Kineto object or a torch 1.8 bare event list)."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        doc = json.load(f)
    if isinstance(doc, list):
        return Trace(path, {}, doc)
    return Trace(path, {k: v for k, v in doc.items() if k != "traceEvents"}, doc.get("traceEvents", []))


# ---- interval measure ---------------------------------------------------------------------------------------


def union_length(intervals: Iterable[Interval]) -> float:
    """|∪ intervals|."""
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted(iv for iv in intervals if iv[1] > iv[0]):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def overlap_length(comm: Iterable[Interval], compute: Iterable[Interval]) -> tuple[float, float]:
    """(|∪comm|, |∪comm ∩ ∪compute|) by a sweep line over all interval boundaries."""
    points: list[tuple[float, int, int]] = []  # (time, d_comm, d_compute)
    for s, e in comm:
        if e > s:
            points += [(s, 1, 0), (e, -1, 0)]
    for s, e in compute:
        if e > s:
            points += [(s, 0, 1), (e, 0, -1)]
    points.sort()
    n_comm = n_comp = 0
    comm_len = both_len = 0.0
    for i, (t, dc, dp) in enumerate(points):
        n_comm += dc
        n_comp += dp
        if i + 1 < len(points):
            seg = points[i + 1][0] - t
            if n_comm > 0:
                comm_len += seg
                if n_comp > 0:
                    both_len += seg
    return comm_len, both_len


@dataclass
class Result:
    comm_us: float
    overlapped_us: float
    comm_count: int
    excluded: list[str] = field(default_factory=list)  # kernels that are neither comm nor compute

    @property
    def overlap(self) -> float | None:
        return self.overlapped_us / self.comm_us if self.comm_us > 0 else None

    @property
    def pct(self) -> float | None:
        return None if self.overlap is None else 100.0 * self.overlap


def measure(kernels: list[Kernel], is_comm: Callable[[str], bool], is_compute: Callable[[str], bool]) -> Result:
    comm = [(k.start, k.end) for k in kernels if is_comm(k.name)]
    compute = [(k.start, k.end) for k in kernels if not is_comm(k.name) and is_compute(k.name)]
    excluded = sorted({k.name for k in kernels if not is_comm(k.name) and not is_compute(k.name)})
    comm_us, both = overlap_length(comm, compute)
    return Result(comm_us, both, len(comm), excluded)


# ---- the MANIFEST definition --------------------------------------------------------------------------------

_MANIFEST_NCCL = re.compile(r"(^nccl.*)|(.*ncclKernel.*)")
_MANIFEST_NOT_COMPUTE = ("memcpy", "memset", "sync", "launch", "nccl")


def manifest_is_comm(name: str) -> bool:
    return _MANIFEST_NCCL.match(name) is not None


def manifest_is_compute(name: str) -> bool:
    low = name.lower()
    return not any(word in low for word in _MANIFEST_NOT_COMPUTE)


def manifest_overlap(trace: Trace) -> Result:
    """The MANIFEST table's definition (only `kernel` events)."""
    return measure(trace.kernels(("kernel",)), manifest_is_comm, manifest_is_compute)


# ---- overlapcheck's definition (docs/metrics.md), restated -------------------------------------------------


def ours_is_comm(name: str) -> bool:
    """An NCCL/RCCL kernel of any generation: `nccl*`/`rccl*` (maybe after `void `), or `nccl[Dev]Kernel` inside."""
    low = name.lower()
    return (
        low.removeprefix("void ").lstrip().startswith(("nccl", "rccl")) or "ncclkernel" in low or "nccldevkernel" in low
    )


def ours_overlap(trace: Trace) -> Result:
    """docs/metrics.md: communication = NCCL kernels, compute = every other kernel."""
    return measure(trace.kernels(), ours_is_comm, lambda _name: True)


_KIND_OF_TOKEN = {
    "allreduce": "all_reduce",
    "allgather": "all_gather",
    "reducescatter": "reduce_scatter",
    "alltoall": "all_to_all",
    "sendrecv": "send_recv",
    "send": "send_recv",
    "recv": "send_recv",
    "broadcast": "broadcast",
}


def collective_kind(k: Kernel, launching_op: str | None = None) -> str:
    """A communication kernel's collective: its `Collective name` arg when present, else the collective op that
    launched it (`launching_op`, e.g. `nccl:all_reduce`), else the kernel name token (`ncclKernel_AllReduce_...`,
    `ncclDevKernel_SendRecv...`); `other` when none names a known one."""
    token = str(k.args.get("Collective name") or "")
    kind = _KIND_OF_TOKEN.get(_bare(token), "other") if token else "other"
    if kind == "other" and launching_op:
        kind = _KIND_OF_TOKEN.get(_bare(launching_op.split(":")[-1]), "other")
    if kind == "other":
        m = re.search(r"Kernel_([A-Za-z]+?)(?:_|\(|$)", k.name)
        kind = _KIND_OF_TOKEN.get((m.group(1) if m else "").lower(), "other")
    return kind


def _bare(token: str) -> str:
    """`_all_gather_base` / `allgather_base_` / `reduce_scatter_tensor_coalesced` -> `allgather` / ..."""
    t = token.lower().strip("_")
    for suffix in ("_coalesced", "_tensor", "_into", "_base", "_single"):
        t = t.removesuffix(suffix).strip("_")
    for suffix in ("_coalesced", "_tensor", "_into", "_base", "_single"):
        t = t.removesuffix(suffix).strip("_")
    return t.replace("_", "")


def launching_ops(trace: Trace) -> dict[int, str]:
    """Kernel correlation id -> the innermost `nccl:*` / `c10d::*` / `gloo:*` op around its launch (a runtime
    call with the same correlation, on the same thread), by brute force."""
    ops: dict[tuple[Any, Any], list[tuple[float, float, str]]] = {}
    launches = []
    for e in trace.events:
        if e.get("ph") != "X" or e.get("ts") is None:
            continue
        name = str(e.get("name", ""))
        if e.get("cat") in ("cpu_op", "Operator", "user_annotation") and re.match(r"(nccl:|c10d::|gloo:)", name):
            ops.setdefault((e.get("pid"), e.get("tid")), []).append((e["ts"], e["ts"] + (e.get("dur") or 0), name))
        elif e.get("cat") in RUNTIME_CATS and isinstance((e.get("args") or {}).get("correlation"), int):
            launches.append((e["args"]["correlation"], e.get("pid"), e.get("tid"), e["ts"]))
    out = {}
    for corr, pid, tid, ts in launches:
        around = [op for op in ops.get((pid, tid), []) if op[0] <= ts <= op[1]]
        if around:
            out[corr] = max(around, key=lambda op: op[0])[2]
    return out


def _kinds(trace: Trace) -> list[tuple[Kernel, str]]:
    ops = launching_ops(trace)
    return [
        (k, collective_kind(k, ops.get(k.args.get("correlation"))))  # type: ignore[arg-type]
        for k in trace.kernels()
        if ours_is_comm(k.name)
    ]


def collective_counts(trace: Trace) -> Counter[str]:
    """Communication kernels per collective kind."""
    return Counter(kind for _, kind in _kinds(trace))


def collective_times(trace: Trace) -> dict[str, float]:
    """|∪ kernels| per collective kind."""
    by_kind: dict[str, list[Interval]] = {}
    for k, kind in _kinds(trace):
        by_kind.setdefault(kind, []).append((k.start, k.end))
    return {kind: union_length(ivs) for kind, ivs in by_kind.items()}


RUNTIME_CATS = ("cuda_runtime", "cuda_driver", "Runtime")
FLOW_CATS = ("ac2g", "async_cpu_to_gpu", "async")
STEP_CATS = ("user_annotation", "cpu_op", "Operator")
GPU_CATS = {
    "kernel": "kernel",
    "Kernel": "kernel",
    "gpu_memcpy": "memcpy",
    "Memcpy": "memcpy",
    "gpu_memset": "memset",
    "Memset": "memset",
}


@dataclass
class Activity:
    """A GPU activity: class (`compute`, `comm`, `memcpy`, `memset`), interval, and the CPU time of its launch
    (None when the trace holds neither its runtime call nor its flow)."""

    cls: str
    start: float
    end: float
    launch: float | None


def profiler_steps(trace: Trace) -> list[tuple[float, float, int]]:
    """(start, end, number) of each `ProfilerStep#N` CPU annotation, by start."""
    steps = []
    for e in trace.events:
        m = re.fullmatch(r"ProfilerStep#(\d+)", str(e.get("name", "")))
        if m and e.get("ph") == "X" and e.get("cat") in STEP_CATS:
            steps.append((e["ts"], e["ts"] + (e.get("dur") or 0), int(m.group(1))))
    return sorted(steps)


def gpu_activities(trace: Trace) -> list[Activity]:
    """Every kernel, memcpy and memset, with its launch: the runtime call with the same correlation id, else the
    flow start (`ac2g`, `async_cpu_to_gpu`, torch 1.8 `async`) whose id is that correlation id."""
    runtime: dict[Any, float] = {}
    flows: dict[Any, float] = {}
    for e in trace.events:
        if e.get("cat") in RUNTIME_CATS and e.get("ph") == "X":
            corr = (e.get("args") or {}).get("correlation")
            if corr is not None:
                runtime.setdefault(corr, e["ts"])
        elif e.get("ph") == "s" and e.get("cat") in FLOW_CATS and e.get("id") is not None:
            flows.setdefault(e["id"], e["ts"])
    out = []
    for e in trace.events:
        kind = GPU_CATS.get(e.get("cat"))
        if e.get("ph") != "X" or kind is None or e.get("ts") is None:
            continue
        if kind == "kernel":
            kind = "comm" if ours_is_comm(e.get("name", "")) else "compute"
        corr = (e.get("args") or {}).get("correlation")
        launch = runtime.get(corr, flows.get(corr)) if corr is not None and corr != -1 else None
        out.append(Activity(kind, e["ts"], e["ts"] + max(e.get("dur") or 0, 0), launch))
    return out


def step_of(steps: list[tuple[float, float, int]], t: float | None) -> int | None:
    """The step whose CPU span [start, end) holds time t; None for no time or no such step."""
    if t is None:
        return None
    for start, end, number in steps:
        if start <= t < end:
            return number
    return None


def kernels_per_step(trace: Trace) -> dict[int, tuple[int, int]]:
    """{step number: (kernels, communication kernels)} by the ProfilerStep#N whose CPU span contains the kernel's
    launch (runtime call with the same correlation id, else its flow); a kernel without a launch in the trace is
    in no step."""
    steps = profiler_steps(trace)
    out: dict[int, tuple[int, int]] = {}
    for a in gpu_activities(trace):
        number = step_of(steps, a.launch)
        if a.cls in ("compute", "comm") and number is not None:
            n, c = out.get(number, (0, 0))
            out[number] = (n + 1, c + (a.cls == "comm"))
    return out


@dataclass
class Part:
    """The measures of a set of GPU activities (a step, or the activities of no step)."""

    count: int = 0  # activities
    comm_count: int = 0
    comm_us: float = 0.0  # |C|
    overlapped_us: float = 0.0  # |C ∩ P|, P = all compute of the rank
    compute_us: float = 0.0  # |own compute|
    memcpy_count: int = 0
    memcpy_us: float = 0.0

    @property
    def exposed_us(self) -> float:
        return self.comm_us - self.overlapped_us


@dataclass
class StepRef:
    number: int
    cpu_start: float
    cpu_duration: float
    start: float  # first start of its own activity (the CPU start without activity)
    duration: float  # last end - first start of its own activity (the CPU duration without activity)
    period_start: float
    period: float
    part: Part

    @property
    def exposed_share(self) -> float | None:
        return self.part.exposed_us / self.period if self.period > 0 and self.part.comm_count else None


@dataclass
class StepsRef:
    steps: list[StepRef]
    step_time_us: float
    exposed_share: float | None
    span_us: float
    before_first_step: Part
    outside_steps: Part


def _part(acts: list[Activity], compute_all: list[Interval]) -> Part:
    comm = [(a.start, a.end) for a in acts if a.cls == "comm"]
    comm_us, both = overlap_length(comm, compute_all)
    copies = [(a.start, a.end) for a in acts if a.cls == "memcpy"]
    return Part(
        count=len(acts),
        comm_count=len(comm),
        comm_us=comm_us,
        overlapped_us=both,
        compute_us=union_length((a.start, a.end) for a in acts if a.cls == "compute"),
        memcpy_count=len(copies),
        memcpy_us=union_length(copies),
    )


def step_reference(trace: Trace) -> StepsRef:
    """docs/metrics.md "Per step", restated: activities by the step that launched them; each step's period from
    the end of the GPU work of it and every earlier step (the first step with activity: from its first kernel);
    the activities of no step, and those of them launched before the first step or without a launch in the
    trace."""
    steps = profiler_steps(trace)
    acts = gpu_activities(trace)
    compute_all = [(a.start, a.end) for a in acts if a.cls == "compute"]
    own: dict[int, list[Activity]] = {number: [] for _, _, number in steps}
    outside, before = [], []
    first_cpu = steps[0][0] if steps else None
    for a in acts:
        number = step_of(steps, a.launch)
        if number is not None:
            own[number].append(a)
        else:
            outside.append(a)
            if a.launch is None or (first_cpu is not None and a.launch < first_cpu):
                before.append(a)
    active = [own[n] for _, _, n in steps if own[n]]
    out = []
    if active:
        kernels = [a.start for a in active[0] if a.cls in ("compute", "comm")]
        end = min(kernels) if kernels else min(a.start for a in active[0])
    for cpu_start, cpu_end, number in steps:
        mine = own[number]
        start = min((a.start for a in mine), default=cpu_start)
        duration = max(a.end for a in mine) - start if mine else cpu_end - cpu_start
        if active:
            period_start = end
            end = max([end] + [a.end for a in mine])
            period = end - period_start
        else:
            period_start, period = cpu_start, cpu_end - cpu_start
        part = _part(mine, compute_all)
        out.append(StepRef(number, cpu_start, cpu_end - cpu_start, start, duration, period_start, period, part))
    everything = [(a.start, a.end) for a in acts]
    span = max(e for _, e in everything) - min(s for s, _ in everything) if everything else 0.0
    step_time = sum(s.period for s in out) if out else span
    exposed = sum(s.part.exposed_us for s in out)
    has_comm = any(a.cls == "comm" for a in acts)
    return StepsRef(
        steps=out,
        step_time_us=step_time,
        exposed_share=exposed / step_time if out and step_time > 0 and has_comm else None,
        span_us=span,
        before_first_step=_part(before, compute_all),
        outside_steps=_part(outside, compute_all),
    )


# ---- the MANIFEST table -------------------------------------------------------------------------------------


@dataclass
class ManifestRow:
    path: str  # trace set folder, or folder/stem of one file
    nccl_union_us: list[float]
    overlap_pct: list[float]
    hta_pct: list[float]  # "same" -> overlap_pct


def _numbers(cell: str) -> list[float]:
    return [float(x) for x in re.findall(r"\d+(?:\.\d+)?", cell)]


def manifest_rows(manifest_path: str) -> list[ManifestRow]:
    """The rows of the `## Reference numbers` table, one per trace set, values in rank order."""
    with open(manifest_path, encoding="utf-8") as f:
        text = f.read()
    section = text.split("## Reference numbers", 1)[1]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 4 or not cells[0] or cells[0] == "trace" or set(cells[0]) <= {"-"}:
            continue
        overlap = _numbers(cells[2])
        hta = overlap if cells[3].strip().lower() == "same" else _numbers(cells[3])
        rows.append(ManifestRow(cells[0].split()[0], _numbers(cells[1]), overlap, hta))
    return rows


def files_of(traces_dir: str, row_path: str, rank_of: Callable[[str], int | None] | None = None) -> list[str]:
    """The trace files a MANIFEST row stands for: a folder's traces, or one file; in rank order when `rank_of`
    (path -> rank) is given, else by name."""
    path = os.path.join(traces_dir, row_path)
    if os.path.isdir(path):
        files = sorted(os.path.join(path, n) for n in os.listdir(path) if n.endswith((".json", ".json.gz")))
        if rank_of is not None:
            files.sort(key=lambda p: rank_of(p) or 0)
        return files
    for ext in (".json.gz", ".json"):
        if os.path.isfile(path + ext):
            return [path + ext]
    raise FileNotFoundError(path)


# ---- HTA 0.5.0 get_comm_comp_overlap, rule by rule ----------------------------------------------------------

_HTA_COMM = re.compile(r"^nccl.*Kernel")  # hta.utils.utils.NCCL_KERNEL_RE
_HTA_MEMORY = re.compile(r"(^Memcpy)|(^Memset)|(^dma)")  # MEMORY_KERNEL_RE
_HTA_NOT_COMPUTE = re.compile(r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)")  # NCCL_COMPUTE_KERNEL_RE


@dataclass(frozen=True)
class HtaRules:
    """Each way HTA 0.5.0 differs from docs/metrics.md; all True = HTA, all False = overlapcheck."""

    names: bool = True  # comm = ^nccl.*Kernel; compute excludes .*Memcpy, ^Memset, .*Sync (case-sensitive)
    ns_rounding: bool = True  # trace_parser.round_down_time_stamps: float `ts` column -> ts=ceil, end=floor
    last_step_filter: bool = True  # Trace._filter_irrelevant_gpu_kernels: keep kernels launched before last step


ALL_HTA_RULES = ("names", "ns_rounding", "last_step_filter")


def hta_is_comm(name: str) -> bool:
    return _HTA_COMM.match(name) is not None


def hta_is_compute(name: str) -> bool:
    return not hta_is_comm(name) and _HTA_MEMORY.match(name) is None and _HTA_NOT_COMPUTE.match(name) is None


def has_float_ts(trace: Trace) -> bool:
    """Whether pandas makes HTA's `ts` column float64: some event has a non-integer or missing `ts`."""
    return any(not isinstance(e.get("ts"), int) or isinstance(e.get("ts"), bool) for e in trace.events)


def launched_before_last_step(trace: Trace, rounding: bool = False) -> set[int] | None:
    """Correlation ids of CPU rows (launches) that start before this rank's last ProfilerStep begins, as
    Trace._filter_irrelevant_gpu_kernels keeps them; None when HTA keeps every kernel (fewer than two
    ProfilerStep names: HTA decides on its job-wide symbol table). `rounding`: compare ceil'd starts, as HTA
    does after round_down_time_stamps."""

    def start(e: dict[str, Any]) -> float:
        return math.ceil(e["ts"]) if rounding else e["ts"]

    rows = [
        e
        for e in trace.events
        if e.get("dur") is not None
        and e.get("cat") not in (None, "Trace")
        and e.get("ts") is not None
        and not _hta_is_gpu_row(e)
    ]
    steps = [e for e in rows if "ProfilerStep" in str(e.get("name", ""))]
    if len({e["name"] for e in steps}) < 2:
        return None
    last_start = max(start(e) for e in steps)
    keep = set()
    for e in rows:
        corr = (e.get("args") or {}).get("correlation")
        if isinstance(corr, int) and start(e) < last_start:
            keep.add(corr)
    return keep


def _hta_stream(e: dict[str, Any]) -> int:
    try:
        return int((e.get("args") or {}).get("stream", -1))
    except (TypeError, ValueError):
        return -1


def _hta_is_gpu_row(e: dict[str, Any]) -> bool:
    """HTA's GPUKernelFilter: stream >= 0 and correlation >= 0, or an Event/Context Sync."""
    corr = (e.get("args") or {}).get("correlation", -1)
    return (_hta_stream(e) >= 0 and isinstance(corr, int) and corr >= 0) or e.get("name") in (
        "Event Sync",
        "Context Sync",
    )


def hta_merge(intervals: list[Interval]) -> list[Interval]:
    """hta.utils.utils.merge_kernel_intervals: sort by start; a row opens a new group when its start is beyond
    every earlier end; each group is (min start, max end). Keeps negative-length rows, as HTA does."""
    groups: list[list[float]] = []
    reach = -math.inf
    for s, e in sorted(intervals, key=lambda iv: iv[0]):
        if not groups or s > reach:
            groups.append([s, e])
        else:
            groups[-1][1] = max(groups[-1][1], e)
        reach = max(reach, e)
    return [(g[0], g[1]) for g in groups]


def hta_measure(comm: list[Interval], compute: list[Interval]) -> tuple[float, float]:
    """HTA's sweep: merged comm counts 1, merged compute 2; time where the running sum is exactly 3 overlaps;
    the denominator is the sum of the merged comm groups' (end - start)."""
    comm_m, comp_m = hta_merge(comm), hta_merge(compute)
    delta: dict[float, int] = {}
    for groups, weight in ((comm_m, 1), (comp_m, 2)):
        for s, e in groups:
            delta[s] = delta.get(s, 0) + weight
            delta[e] = delta.get(e, 0) - weight
    times = sorted(delta)
    running, both = 0, 0.0
    for t, t_next in pairwise(times):
        running += delta[t]
        if running == 3:
            both += t_next - t
    return sum(e - s for s, e in comm_m), both


def hta_overlap(trace: Trace, rules: HtaRules = HtaRules(), job_step_names: int | None = None) -> Result:
    """HTA's get_comm_comp_overlap on this rank, with the chosen HTA rules on (the rest as in docs/metrics.md).

    `job_step_names`: distinct ProfilerStep names across the whole job (HTA decides on the job); default: this
    file's. With every rule off, this is overlapcheck's definition (GPU rows: every event with a stream)."""
    rounding = rules.ns_rounding and has_float_ts(trace)
    keep = launched_before_last_step(trace, rounding) if rules.last_step_filter else None
    if rules.last_step_filter and job_step_names is not None and job_step_names < 2:
        keep = None
    comm: list[Interval] = []
    compute: list[Interval] = []
    excluded: set[str] = set()
    for e in trace.events:
        if e.get("dur") is None or e.get("cat") is None or e.get("ts") is None or _hta_stream(e) == -1:
            continue
        if keep is not None and _hta_is_gpu_row(e) and (e.get("args") or {}).get("correlation") not in keep:
            continue
        name, cat = e.get("name", ""), e.get("cat")
        if rules.names:
            is_comm, is_compute = hta_is_comm(name), hta_is_compute(name)
        else:
            is_kernel = cat in KERNEL_CATS
            is_comm, is_compute = is_kernel and ours_is_comm(name), is_kernel and not ours_is_comm(name)
        start, end = e["ts"], e["ts"] + e["dur"]
        if rounding:
            start, end = math.ceil(start), math.floor(end)
        if is_comm:
            comm.append((start, end))
        elif is_compute:
            compute.append((start, end))
        elif cat in KERNEL_CATS:
            excluded.add(name)
    comm_us, both = hta_measure(comm, compute)
    return Result(comm_us, both, len(comm), sorted(excluded))
