"""Which module each collective serves, and per module the communication time, exposed and hidden.

Where the program issued a collective (its launch, or the c10d op on the gloo lanes: `Activities.origin`) is
looked up among the CPU spans of its thread, best source first:

1. `annotation`: the `overlapcheck.module: <path> (<class>)` ranges (cpu_op or user_annotation) that
   `overlapcheck run` opens around DeepSpeed's parameter fetch (PartitionedParameterCoordinator's
   `fetch_sub_module`, called by the pre-forward and pre-backward hooks; capture/modules.py). An all-gather
   issued inside one serves that module: the module whose hook needed (or prefetched on its behalf) the
   parameters. Inside it, the `overlapcheck.params: <path> (<class>); ...` range around the gather itself
   (`__all_gather_params`) names the modules whose parameters it fetches (a prefetch: the next modules), and
   wins.
2. `gradient hooks`: a reduce-scatter or all-reduce (a gradient bucket) serves the modules whose gradient hooks
   (`overlapcheck.grad: <path> (<class>)` ranges, around DeepSpeed's
   `reduce_ready_partitions_and_remove_grads`, on any thread) ended since the previous bucket and before it
   was issued. A hook that issues a bucket adds its own gradient to the next one (stage3.py
   `reduce_independent_p_g_buckets_and_remove_grads` flushes a full bucket before adding), hence "ended".
3. `module frame`: the innermost `nn.Module: <Class>_<n>` frames torch's Python tracer records (`with_stack`):
   the chain of enclosing ones (`Net_0.Sequential_0.Linear_1`; DeepSpeedEngine / DDP wrappers left out). In the
   forward pass a pre-forward hook runs inside its module's frame; the backward pass runs outside every module
   frame, so its collectives need 1 or 2.
4. `forward frame`: without module frames, the innermost `<file>(<line>): forward` frame outside torch and
   DeepSpeed (`train.py(38): forward`): the forward that called the module, not the module itself.
5. `none`: nothing of the above encloses it.

Per module the collectives' time is split evenly among the modules they serve, so a rank's rows add up to the
sum of its collectives' durations (docs/metrics.md, Per module).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from overlapcheck.analysis import intervals as iv
from overlapcheck.analysis.activities import PHASES, Activities
from overlapcheck.analysis.metrics import NOISE_US
from overlapcheck.model import ModuleComm, Modules, PackedModules
from overlapcheck.trace import classify as C
from overlapcheck.trace.model import ANNOTATION, CPU_OP, PYTHON, TraceModel

MODULE_ANNOTATION = "overlapcheck.module: "
PARAMS_ANNOTATION = "overlapcheck.params: "
GRAD_ANNOTATION = "overlapcheck.grad: "
SEPARATOR = "; "
MODULE_FRAME = "nn.Module: "
_WRAPPERS = re.compile(r"^(DeepSpeedEngine|DistributedDataParallel|FullyShardedDataParallel|PipelineEngine)_\d+$")
_FORWARD = re.compile(r"^(?P<file>.+)\((?P<line>\d+)\): forward$")
_LIBRARY = re.compile(r"(^|/)(torch|deepspeed|transformers|accelerate|megatron|apex)/")
_ANNOTATED = re.compile(r"^(?P<path>.*?)(?: \((?P<cls>[^()]*)\))?$")
BUCKET_KINDS = ("reduce_scatter", "all_reduce")
_RANGES = (CPU_OP, ANNOTATION)  # the capture's ranges: cpu_op (_RecordFunctionFast) or user_annotation

NO_MODULE_INFO = (
    "no module information in the traces (no nn.Module or forward frames): per-module attribution needs "
    "`overlapcheck run --with-modules`, or with_stack=True (with_modules=True) in your own torch.profiler"
)
NO_BACKWARD_INFO = (
    "collectives issued outside every module frame (the backward pass's gradient buckets and pre-backward "
    "fetches, the optimizer step's) have no module: `overlapcheck run` annotates DeepSpeed's hooks with the "
    "module they serve"
)


@dataclass
class _Spans:
    """CPU spans of one kind on one thread, sorted by start, with each one's enclosing span of the same kind."""

    start: np.ndarray
    end: np.ndarray
    label: list[str]
    parent: np.ndarray

    @classmethod
    def of(cls, start: np.ndarray, end: np.ndarray, labels: list[str]) -> _Spans:
        order = np.lexsort((-end, start))
        s, e = start[order], end[order]
        lab = [labels[i] for i in order.tolist()]
        parent = np.full(len(s), -1, dtype=np.int64)
        stack: list[int] = []
        for i in range(len(s)):
            while stack and e[stack[-1]] < e[i]:  # spans nest on one thread; a span ending first is no parent
                stack.pop()
            if stack and s[i] < e[stack[-1]]:
                parent[i] = stack[-1]
            stack.append(i)
        return cls(s, e, lab, parent)

    def around(self, t: float) -> int:
        """The innermost span with start <= t < end (ties: the one that starts last), -1 if none."""
        i = int(np.searchsorted(self.start, t, "right")) - 1
        while i >= 0 and not t < self.end[i]:
            i = int(self.parent[i])
        return i

    def chain(self, i: int) -> list[str]:
        out = []
        while i >= 0:
            out.append(self.label[i])
            i = int(self.parent[i])
        return out[::-1]


def _spans_by_thread(model: TraceModel, rows: np.ndarray, labels: list[str]) -> dict[int, _Spans]:
    o = model.ops
    out = {}
    threads = o.thread[rows]
    for t in np.unique(threads).tolist():
        sel = np.flatnonzero(threads == t)
        out[int(t)] = _Spans.of(o.start[rows[sel]], o.end[rows[sel]], [labels[i] for i in sel.tolist()])
    return out


def _named(model: TraceModel, kinds: tuple[int, ...], predicate) -> tuple[np.ndarray, list[str]]:
    """The ops of `kinds` whose name passes `predicate` (tested once per distinct name) and their names."""
    o = model.ops
    good = np.array([predicate(n) for n in model.names] + [False], dtype=bool)
    rows = np.flatnonzero(np.isin(o.kind, kinds) & good[np.where(o.name >= 0, o.name, len(model.names))])
    return rows, [model.names[i] for i in o.name[rows].tolist()]


def _split_annotation(label: str, prefix: str) -> tuple[str, str | None]:
    m = _ANNOTATED.match(label[len(prefix) :])
    assert m is not None  # the pattern matches every string
    return m.group("path"), m.group("cls")


def overlapped_each(starts: np.ndarray, ends: np.ndarray, busy: iv.Intervals) -> np.ndarray:
    """|[start, end) ∩ busy| for each interval (busy: disjoint and sorted), from the cumulative measure of busy."""
    if not len(busy) or not len(starts):
        return np.zeros(len(starts))
    cum = np.concatenate([[0.0], np.cumsum(busy.ends - busy.starts)])

    def measure_before(t: np.ndarray) -> np.ndarray:
        i = np.searchsorted(busy.starts, t, "right")  # intervals starting at or before t
        j = np.maximum(i - 1, 0)
        partial = np.clip(t - busy.starts[j], 0.0, busy.ends[j] - busy.starts[j])
        return cum[j] + np.where(i > 0, partial, 0.0)

    return np.maximum(measure_before(ends) - measure_before(starts), 0.0)


Served = list[tuple[str | None, str | None]]  # (path, class) of each module a collective serves


def served_by(model: TraceModel, acts: Activities) -> tuple[np.ndarray, list[Served], list[str], bool, bool]:
    """The communication activities (indices into `acts`), the modules each serves and the source that says so;
    and whether the trace has python frames, and the capture's annotations."""
    comm = np.flatnonzero(acts.cls == C.COMM)
    if not len(comm):
        return comm, [], [], False, False
    origin = acts.origin[comm] if acts.origin is not None else np.full(len(comm), np.nan)
    thread = acts.origin_thread[comm] if acts.origin_thread is not None else np.full(len(comm), -1)

    rows, labels = _named(model, _RANGES, lambda n: n.startswith(MODULE_ANNOTATION))
    fetches = _spans_by_thread(model, rows, labels)
    rows, labels = _named(model, _RANGES, lambda n: n.startswith(PARAMS_ANNOTATION))
    gathers = _spans_by_thread(model, rows, labels)
    rows, labels = _named(model, _RANGES, lambda n: n.startswith(GRAD_ANNOTATION))
    # one bucket per process, filled by hooks on the autograd engine's threads (CUDA's backward runs on a device
    # thread) and flushed by the last hook or the epilogue on the main thread: the windows are over all threads
    grads = _Spans.of(model.ops.start[rows], model.ops.end[rows], labels) if len(rows) else None
    rows, labels = _named(model, (PYTHON,), lambda n: n.startswith(MODULE_FRAME))
    frames = _spans_by_thread(model, rows, labels)
    forwards: dict[int, _Spans] = {}
    if not frames:
        rows, labels = _named(model, (PYTHON,), lambda n: bool(_FORWARD.match(n)) and not _LIBRARY.search(n))
        forwards = _spans_by_thread(model, rows, labels)
    has_python = bool((model.ops.kind == PYTHON).any()) if len(model.ops) else False

    # per communication activity: its modules (path, class) and the source they came from
    served: list[list[tuple[str | None, str | None]]] = []
    sources: list[str] = []
    last_bucket = [-np.inf]
    order = np.argsort(np.where(np.isnan(origin), np.inf, origin), kind="stable")
    found: dict[int, tuple[list[tuple[str | None, str | None]], str]] = {}
    for k in order.tolist():
        t, th = float(origin[k]), int(thread[k])
        kind = C.COLLECTIVES[int(acts.coll[comm[k]])]
        found[k] = _attribute(t, th, kind, (gathers, fetches), grads, frames, forwards, last_bucket)
    for k in range(len(comm)):
        mods, source = found[k]
        served.append(mods)
        sources.append(source)
    return comm, served, sources, has_python, bool(fetches or gathers or grads)


MAX_FINDING_MODULES = 3  # modules a finding names (the most exposed in its windows)
MIN_FINDING_US = 1.0  # per step: a module's exposed time below this is not named


@dataclass
class ModuleIndex:
    """One rank's collectives with the modules they serve, for naming the modules of a finding (its windows)."""

    start: np.ndarray
    end: np.ndarray
    served: list[Served]
    compute: iv.Intervals

    @classmethod
    def of(cls, model: TraceModel, acts: Activities) -> ModuleIndex | None:
        """None when no collective serves a named module."""
        comm, served, _, _, _ = served_by(model, acts)
        if not any(path is not None for mods in served for path, _ in mods):
            return None
        compute = iv.union(acts.start[acts.cls == C.COMPUTE], acts.end[acts.cls == C.COMPUTE])
        return cls(acts.start[comm], acts.end[comm], served, compute)

    def named_in(self, windows: iv.Intervals, cost_us: float) -> list[dict[str, object]]:
        """The modules whose collectives are exposed inside `windows` (a finding's covers), most first, with
        their part of the finding's cost per step (`cost_us` shared in proportion to each module's exposed µs
        there, a shared collective's split evenly: the parts add up to the cost, each µs once); at most
        MAX_FINDING_MODULES, none under MIN_FINDING_US."""
        exposed = overlapped_each(self.start, self.end, iv.subtract(windows, self.compute))
        per: dict[str, float] = {}
        for k in np.flatnonzero(exposed > 0).tolist():
            mods = [path for path, _ in self.served[k] if path is not None]
            for path in mods:
                per[path] = per.get(path, 0.0) + float(exposed[k]) / len(mods)
        total = float(exposed.sum())
        if total <= 0 or cost_us <= 0:
            return []
        ranked = sorted(per.items(), key=lambda kv: (-kv[1], kv[0]))
        return [
            {"module": path, "cost_us": round(cost_us * us / total, 3), "share": round(us / total, 4)}
            for path, us in ranked[:MAX_FINDING_MODULES]
            if cost_us * us / total >= MIN_FINDING_US
        ]


def label_of(mods: Served) -> str | None:
    """The modules of one collective as one line (`layers.0; layers.1`), None when none."""
    names = [path for path, _ in mods if path is not None]
    return "; ".join(names) if names else None


def module_comm(model: TraceModel, acts: Activities) -> Modules | None:
    """The rank's MODULES object (one rank); None when it has no communication."""
    comm, served, sources, has_python, annotated = served_by(model, acts)
    if not len(comm):
        return None
    compute = iv.union(acts.start[acts.cls == C.COMPUTE], acts.end[acts.cls == C.COMPUTE])
    start, end = acts.start[comm], acts.end[comm]
    duration = np.maximum(end - start, 0.0)
    hidden = np.minimum(overlapped_each(start, end, compute), duration)
    # float noise of the cumulative sums is no overlap (as in metrics.split): snap below a picosecond
    hidden = np.where(hidden < NOISE_US, 0.0, np.where(duration - hidden < NOISE_US, duration, hidden))
    phase = acts.phase[comm] if acts.phase is not None else np.full(len(comm), -1)

    table: dict[tuple[str | None, str, str | None, str], list] = {}
    for k in range(len(comm)):
        kind = C.COLLECTIVES[int(acts.coll[comm[k]])]
        ph = PHASES[int(phase[k])] if phase[k] >= 0 else None
        mods = served[k] or [(None, None)]
        share = 1.0 / len(mods)
        d, h = float(duration[k]) * share, float(hidden[k]) * share
        for path, cls in mods:
            key = (path, kind, ph, sources[k])
            row = table.get(key)
            if row is None:
                row = table[key] = [0, 0.0, 0.0, cls]
            row[0] += 1
            row[1] += d
            row[2] += h
    out = [
        ModuleComm(path, kind, ph, source, n, time, time - hid, hid, cls)
        for (path, kind, ph, source), (n, time, hid, cls) in table.items()
    ]
    notes = []
    if not has_python and not annotated:
        notes.append(NO_MODULE_INFO)
    elif not annotated and any(s == "none" for (_, _, _, s) in table):
        notes.append(NO_BACKWARD_INFO)
    steps = len(model.steps)
    return Modules(ranks=1, rank_steps=steps, rows=sort_rows(out), notes=notes)


def _attribute(
    t: float,
    th: int,
    kind: str,
    fetches: tuple[dict[int, _Spans], dict[int, _Spans]],
    grads: _Spans | None,
    frames: dict[int, _Spans],
    forwards: dict[int, _Spans],
    last_bucket: list[float],
) -> tuple[list[tuple[str | None, str | None]], str]:
    """The modules one collective serves and the source that says so (module docstring, 1-5)."""
    if np.isnan(t) or th < 0:
        return [], "none"
    gathers, hooks = fetches
    spans = gathers.get(th)
    if spans is not None and (i := spans.around(t)) >= 0:  # the modules whose parameters the gather fetches
        text = spans.label[i][len(PARAMS_ANNOTATION) :]
        parts = [_split_annotation(p, "") for p in text.split(SEPARATOR) if p and not p.startswith("... ")]
        if parts:
            return list(dict(parts).items()), "annotation"
    spans = hooks.get(th)
    if spans is not None and (i := spans.around(t)) >= 0:
        return [_split_annotation(spans.label[i], MODULE_ANNOTATION)], "annotation"
    if kind in BUCKET_KINDS and grads is not None:
        spans, since = grads, last_bucket[0]
        last_bucket[0] = t
        ended = np.flatnonzero((spans.end > since) & (spans.end <= t))
        if len(ended):
            mods: dict[str, str | None] = {}
            for i in ended.tolist():
                path, cls = _split_annotation(spans.label[i], GRAD_ANNOTATION)
                mods.setdefault(path, cls)
            return list(mods.items()), "gradient hooks"
    spans = frames.get(th)
    if spans is not None and (i := spans.around(t)) >= 0:
        chain = [lab[len(MODULE_FRAME) :] for lab in spans.chain(i)]
        chain = [c for c in chain if not _WRAPPERS.match(c)] or chain
        return [(".".join(chain), chain[-1].rsplit("_", 1)[0])], "module frame"
    spans = forwards.get(th)
    if spans is not None and (i := spans.around(t)) >= 0:
        return [(spans.label[i], None)], "forward frame"
    return [], "none"


def sort_rows(rows: list[ModuleComm]) -> list[ModuleComm]:
    """Most exposed first; ties in a fixed order (module, kind, phase, source)."""
    return sorted(rows, key=lambda r: (-r.exposed_us, r.module or "", r.kind, r.phase or "", r.source))


def merge_modules(parts: list[Modules | PackedModules | None]) -> Modules | None:
    """The job's MODULES object: the ranks' rows summed by (module, kind, phase, source), in the given (rank)
    order, so that merging per-rank summaries gives the same numbers as merging the ranks' own results."""
    present = [p for p in parts if p is not None]
    if not present:
        return None
    table: dict[tuple[str | None, str, str | None, str], list] = {}
    notes: list[str] = []
    for p in present:
        for r in p.rows:
            key = (r.module, r.kind, r.phase, r.source)
            row = table.get(key)
            if row is None:
                table[key] = [r.count, r.time_us, r.exposed_us, r.hidden_us, r.cls]
            else:
                row[0] += r.count
                row[1] += r.time_us
                row[2] += r.exposed_us
                row[3] += r.hidden_us
        notes.extend(n for n in p.notes if n not in notes)
    rows = [
        ModuleComm(m, kind, ph, source, n, time, exposed, hidden, cls)
        for (m, kind, ph, source), (n, time, exposed, hidden, cls) in table.items()
    ]
    return Modules(
        ranks=sum(p.ranks for p in present),
        rank_steps=sum(p.rank_steps for p in present),
        rows=sort_rows(rows),
        notes=notes,
    )


def attributed_share(modules: Modules) -> float | None:
    """The share of the communication time that some module is named for."""
    total = sum(r.time_us for r in modules.rows)
    if total <= 0:
        return None
    return sum(r.time_us for r in modules.rows if r.module is not None) / total
