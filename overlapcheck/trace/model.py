"""TraceModel: one rank's trace as compact numpy arrays, one table per event family.

Built in a single pass over the decoded event batches; no list of event dicts is ever kept. String fields
(names, process groups, dtypes) are interned into `names` and stored as indices.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from overlapcheck.trace import classify as C
from overlapcheck.trace.events import Event

_STEP = re.compile(r"^ProfilerStep#(\d+)$")
_STREAM_IN_TID = re.compile(r"(\d+)")


class Table:
    """A column table: equal-length numpy arrays, accessed as attributes."""

    def __init__(self, columns: dict[str, np.ndarray]):
        self.__dict__.update(columns)
        self._columns = list(columns)

    def __len__(self) -> int:
        return len(getattr(self, self._columns[0])) if self._columns else 0

    def take(self, index: np.ndarray) -> Table:
        return Table({c: getattr(self, c)[index] for c in self._columns})


# column name -> dtype, per family
GPU_COLUMNS = {
    "start": np.float64, "end": np.float64, "stream": np.int64, "device": np.int32, "correlation": np.int64,
    "cls": np.int8, "coll": np.int8, "name": np.int32, "pg": np.int32, "nelems": np.int64, "dtype": np.int32,
    "nbytes": np.int64,
}  # fmt: skip
RUNTIME_COLUMNS = {"start": np.float64, "end": np.float64, "thread": np.int32, "correlation": np.int64,
                   "name": np.int32}  # fmt: skip
OP_COLUMNS = {"start": np.float64, "end": np.float64, "thread": np.int32, "name": np.int32, "kind": np.int8}
SYNC_COLUMNS = {"start": np.float64, "end": np.float64, "stream": np.int64, "name": np.int32,
                "wait_on_stream": np.int64, "correlation": np.int64}  # fmt: skip
FLOW_COLUMNS = {"start": np.float64, "thread": np.int32, "correlation": np.int64}

# kinds of CPU-side ops
CPU_OP, ANNOTATION, PYTHON = 0, 1, 2
_OP_KIND = {"cpu_op": CPU_OP, "Operator": CPU_OP, "user_annotation": ANNOTATION, "python_function": PYTHON}
_FLOW_CATS = {"ac2g", "async_cpu_to_gpu", "async"}


@dataclass
class TraceModel:
    """Everything the analysis and the diagnosis read from one rank's trace."""

    source: str
    metadata: dict[str, Any]
    names: list[str]
    gpu: Table  # kernels, memcpy, memset (see GPU_COLUMNS); cls from classify, coll index into COLLECTIVES
    runtime: Table  # cuda_runtime / cuda_driver calls (launches, syncs, event records)
    ops: Table  # cpu_op, user_annotation, python_function
    syncs: Table  # cuda_sync events (Stream Wait Event, Event Sync, Stream Sync, Context Sync)
    flows: Table  # ac2g flow starts: CPU side of a correlation
    steps: Table  # ProfilerStep#N annotations: number, start, end
    threads: list[tuple[Any, Any, str]]  # thread index -> (pid, tid, thread name)
    notes: list[str] = field(default_factory=list)

    def name(self, index: int) -> str:
        return self.names[index] if index >= 0 else ""

    def name_index(self, text: str) -> int:
        try:
            return self.names.index(text)
        except ValueError:
            return -1

    @property
    def distributed(self) -> dict[str, Any]:
        info = self.metadata.get("distributedInfo")
        return info if isinstance(info, dict) else {}


class _Columns:
    """Row-wise appends into per-column Python lists, flushed into numpy arrays batch by batch."""

    def __init__(self, columns: dict[str, type]):
        self.columns = columns
        self.rows: list[tuple] = []
        self.parts: list[np.ndarray] = []  # structured arrays

    def flush(self) -> None:
        if self.rows:
            dtype = np.dtype(list(self.columns.items()))
            self.parts.append(np.array(self.rows, dtype=dtype))
            self.rows = []

    def table(self) -> Table:
        self.flush()
        dtype = np.dtype(list(self.columns.items()))
        data = np.concatenate(self.parts) if self.parts else np.zeros(0, dtype=dtype)
        return Table({c: np.ascontiguousarray(data[c]) for c in self.columns})


class ModelBuilder:
    """Accumulates decoded event batches into a TraceModel."""

    def __init__(self, source: str):
        self.source = source
        self.names: list[str] = []
        self._index: dict[str, int] = {}
        self.gpu = _Columns(GPU_COLUMNS)
        self.runtime = _Columns(RUNTIME_COLUMNS)
        self.ops = _Columns(OP_COLUMNS)
        self.syncs = _Columns(SYNC_COLUMNS)
        self.flows = _Columns(FLOW_COLUMNS)
        self.steps: list[tuple[int, float, float]] = []
        self._threads: dict[tuple[Any, Any], int] = {}
        self._thread_names: dict[tuple[Any, Any], str] = {}

    def intern(self, text: str | None) -> int:
        if text is None:
            return -1
        idx = self._index.get(text)
        if idx is None:
            idx = self._index[text] = len(self.names)
            self.names.append(text)
        return idx

    def thread(self, pid: Any, tid: Any) -> int:
        key = (pid, tid)
        idx = self._threads.get(key)
        if idx is None:
            idx = self._threads[key] = len(self._threads)
        return idx

    def add(self, events: list[Event]) -> None:
        """Add one decoded batch. Hot loop: keep it flat."""
        gpu_rows, rt_rows, op_rows = self.gpu.rows, self.runtime.rows, self.ops.rows
        intern, thread = self.intern, self.thread
        for ev in events:
            ph = ev.ph
            if ph != "X":
                if ph == "s" and ev.cat in _FLOW_CATS and ev.ts is not None:
                    corr = _as_int(ev.id)
                    if corr is not None:
                        self.flows.rows.append((ev.ts, thread(ev.pid, ev.tid), corr))
                elif ph == "M" and ev.name == "thread_name" and ev.args is not None and ev.args.name:
                    self._thread_names[(ev.pid, ev.tid)] = ev.args.name
                continue
            cat = ev.cat
            ts = ev.ts
            if ts is None:
                continue
            dur = ev.dur if ev.dur is not None and ev.dur > 0 else 0.0
            args = ev.args
            name = ev.name or ""
            if cat in C.GPU_CATS:
                self._add_gpu(gpu_rows, cat, name, ts, dur, args, ev.tid)
            elif cat in C.RUNTIME_CATS:
                corr = args.correlation if args is not None and args.correlation is not None else -1
                rt_rows.append((ts, ts + dur, thread(ev.pid, ev.tid), corr, intern(name)))
            elif cat in _OP_KIND:
                kind = _OP_KIND[cat]
                op_rows.append((ts, ts + dur, thread(ev.pid, ev.tid), intern(name), kind))
                if kind != PYTHON and name.startswith("ProfilerStep#"):
                    m = _STEP.match(name)
                    if m:
                        self.steps.append((int(m.group(1)), ts, ts + dur))
            elif cat == "cuda_sync":
                a = args
                self.syncs.rows.append((
                    ts, ts + dur, _stream_of(a, ev.tid), intern(name),
                    a.wait_on_stream if a is not None and a.wait_on_stream is not None else -1,
                    a.correlation if a is not None and a.correlation is not None else -1,
                ))  # fmt: skip
        for cols in (self.gpu, self.runtime, self.ops, self.syncs, self.flows):
            cols.flush()

    def _add_gpu(self, rows: list, cat: str, name: str, ts: float, dur: float, args: Any, tid: Any) -> None:
        coll = C.NO_COLLECTIVE
        pg = nelems = dtype = -1
        nbytes = -1
        if cat in C.KERNEL_CATS:
            if C.is_comm_kernel(name):
                cls = C.COMM
                collective_arg = args.collective if args is not None else None
                coll = C.COLLECTIVES.index(C.collective_of(name, collective_arg))
            else:
                cls = C.COMPUTE
        else:
            cls = C.MEMCPY if cat in C.MEMCPY_CATS else C.MEMSET
        if args is not None:
            pg_value = args.pg_name if args.pg_name is not None else args.pg_id
            pg = self.intern(str(pg_value)) if pg_value is not None else -1
            n = args.in_nelems if args.in_nelems is not None else args.in_size
            nelems = n if n is not None else -1
            dtype = self.intern(args.dtype)
            nbytes = args.nbytes if args.nbytes is not None else -1
            corr = args.correlation if args.correlation is not None else -1
            device = _as_int(args.device)
        else:
            corr, device = -1, None
        rows.append((ts, ts + dur, _stream_of(args, tid), device if device is not None else -1, corr, cls, coll,
                     self.intern(name), pg, nelems, dtype, nbytes))  # fmt: skip

    def build(self, metadata: dict[str, Any]) -> TraceModel:
        steps = sorted(self.steps, key=lambda s: s[1])
        threads = [("", "", "")] * len(self._threads)
        for (pid, tid), idx in self._threads.items():
            threads[idx] = (pid, tid, self._thread_names.get((pid, tid), ""))
        return TraceModel(
            source=self.source,
            metadata=metadata,
            names=self.names,
            gpu=self.gpu.table(),
            runtime=self.runtime.table(),
            ops=self.ops.table(),
            syncs=self.syncs.table(),
            flows=self.flows.table(),
            steps=Table({
                "number": np.array([s[0] for s in steps], dtype=np.int64),
                "start": np.array([s[1] for s in steps], dtype=np.float64),
                "end": np.array([s[2] for s in steps], dtype=np.float64),
            }),  # fmt: skip
            threads=threads,
        )


def _as_int(value: Any) -> int | None:
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        m = _STREAM_IN_TID.search(value)
        return int(m.group(1)) if m else None
    return None


def _stream_of(args: Any, tid: Any) -> int:
    """The CUDA stream of a GPU activity: `args.stream`, else the number in its tid (`stream 7` in torch 1.8)."""
    if args is not None and args.stream is not None:
        value = _as_int(args.stream)
        if value is not None:
            return value
    value = _as_int(tid)
    return value if value is not None else -1
