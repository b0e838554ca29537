"""TraceModel: one rank's trace as compact numpy arrays, one table per event family.

Built in a single pass over the decoded event batches; no list of event dicts is ever kept. String fields
(names, process groups, dtypes) are interned into `names` and stored as indices.

Values that do not fit are kept out without per-event checks, and said in `notes`: an integer outside its
column's range (a correlation, stream or byte count >= 2**63, a digit string of any length) is read as
unknown (-1) when a batch's one-shot conversion overflows; events whose time or end is not finite, or beyond
MAX_TIME_US, are dropped by a vectorized check at the end; negative durations are counted on the
zero-duration path only. Exact copies of a GPU activity, runtime call, cuda_sync event or flow (a trace
concatenated or merged twice) are counted once, and the activities of a second GPU are left out when the
rank's NCCL kernels tell which device is its own (`_own_device`): both said in `notes`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec
import numpy as np

from overlapcheck.errors import UserError
from overlapcheck.trace import classify as C
from overlapcheck.trace.events import Event
from overlapcheck.trace.launch import enclosing, kinds_from_launch, launches

_STEP = re.compile(r"^ProfilerStep#(\d+)$")
_STREAM_IN_TID = re.compile(r"(\d+)")
_MAX_DIGITS = 19  # a longer digit string does not fit an int64 column (and int() refuses over 4300 digits)
_INT64 = 1 << 63
_TOO_BIG = 1 << 64  # what such a string reads as: out of every column's range, so it is noted and dropped
COARSE_US = 1000.0  # a float64 time's step (µs) from which nothing can be measured (kernels last µs to ms)
MAX_TIME_US = 2.0**62  # where that step is reached (1024 µs; 146,000 years): a time at or beyond it is no time


class Table:
    """A column table: equal-length numpy arrays, accessed as attributes."""

    def __init__(self, columns: dict[str, np.ndarray]):
        self.__dict__.update(columns)
        self._columns = list(columns)

    def __len__(self) -> int:
        return len(getattr(self, self._columns[0])) if self._columns else 0

    def take(self, index: np.ndarray) -> Table:
        return Table({c: getattr(self, c)[index] for c in self._columns})

    def with_column(self, name: str, values: np.ndarray) -> Table:
        return Table({**{c: getattr(self, c) for c in self._columns}, name: values})

    if TYPE_CHECKING:

        def __getattr__(self, name: str) -> np.ndarray: ...  # the columns (for the type checker)


# column name -> dtype, per family
GPU_COLUMNS = {
    "start": np.float64,
    "end": np.float64,
    "stream": np.int64,
    "device": np.int32,
    "correlation": np.int64,
    "cls": np.int8,
    "coll": np.int8,
    "name": np.int32,
    "pg": np.int32,
    "nelems": np.int64,
    "dtype": np.int32,
    "nbytes": np.int64,
    "out_nelems": np.int64,  # a collective's `Out msg nelems` (`Out msg size`), -1 when absent
    "group": np.int32,  # a collective's `Group size`, -1 when absent
}
RUNTIME_COLUMNS = {
    "start": np.float64,
    "end": np.float64,
    "thread": np.int32,
    "correlation": np.int64,
    "name": np.int32,
}
OP_COLUMNS = {"start": np.float64, "end": np.float64, "thread": np.int32, "name": np.int32, "kind": np.int8}
SYNC_COLUMNS = {
    "start": np.float64,
    "end": np.float64,
    "stream": np.int64,
    "name": np.int32,
    "wait_on_stream": np.int64,
    "correlation": np.int64,
}
FLOW_COLUMNS = {"start": np.float64, "thread": np.int32, "correlation": np.int64}
# the op torch wraps each collective in, with the message sizes it records: the fallback for NCCL kernels without
# size args, resolved in `ModelBuilder._build` (its few rows kept aside, not a table of the TraceModel)
RECORD_PARAM_COMMS = "record_param_comms"
# torch < 2.1 recorded no sizes on record_param_comms; with record_shapes the `nccl:*` range ProcessGroupNCCL
# opens carries its input tensor's `Input Dims` / `Input type`: the second fallback, after record_param_comms
SHAPES_NOTE = "message sizes from the Input Dims of the nccl:* ops"
_TORCH_DTYPE = {
    "c10::BFloat16": "BFloat16",
    "c10::Half": "Half",
    "float": "Float",
    "double": "Double",
    "long int": "Long",
    "int": "Int",
    "signed char": "Char",
    "unsigned char": "Byte",
}

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
    gpu: Table  # kernels, memcpy, memset (GPU_COLUMNS and `kind_from`, trace/launch.py); cls from classify,
    # coll index into COLLECTIVES, named by the launching op
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
    """Row tuples appended batch by batch, flushed into one contiguous array per column and batch."""

    def __init__(self, columns: Mapping[str, type]):
        self.columns = dict(columns)
        self.dtype = np.dtype(list(columns.items()))
        self.rows: list[tuple] = []
        self.parts: dict[str, list[np.ndarray]] = {c: [] for c in columns}
        self.clamped: dict[str, int] = {}  # column -> integers out of its range, read as -1

    def flush(self) -> None:
        if self.rows:
            try:
                batch = np.fromiter(self.rows, dtype=self.dtype, count=len(self.rows))
            except OverflowError:  # an integer beyond its column's range: this batch the slow way
                batch = np.fromiter(self._clamped_rows(), dtype=self.dtype, count=len(self.rows))
            self.rows = []
            for c, parts in self.parts.items():
                parts.append(np.ascontiguousarray(batch[c]))

    def _clamped_rows(self) -> list[tuple]:
        """The rows with every integer outside its column's range replaced by -1 (unknown), counted in `clamped`."""
        bounds = [
            (i, c, int(np.iinfo(t).min), int(np.iinfo(t).max))
            for i, (c, t) in enumerate(self.columns.items())
            if np.issubdtype(t, np.integer)
        ]
        out = []
        for row in self.rows:
            if any(not lo <= row[i] <= hi for i, _, lo, hi in bounds):
                fixed = list(row)
                for i, c, lo, hi in bounds:
                    if not lo <= fixed[i] <= hi:
                        fixed[i] = -1
                        self.clamped[c] = self.clamped.get(c, 0) + 1
                row = tuple(fixed)
            out.append(row)
        return out

    def append(self, columns: dict[str, np.ndarray]) -> None:
        """Append rows given as one array per column (cast to this table's dtypes)."""
        for c, parts in self.parts.items():
            parts.append(columns[c].astype(self.columns[c], copy=False))

    def column(self, name: str) -> np.ndarray:
        """One column of everything flushed so far; its batches are released (use once per column)."""
        parts = self.parts[name]
        out = parts[0] if len(parts) == 1 else np.concatenate(parts) if parts else np.zeros(0, self.columns[name])
        parts.clear()
        return out

    def table(self) -> Table:
        """The columns, each concatenated from its batches, which are freed column by column: the peak is the
        table plus one column's batches, not twice the table."""
        self.flush()
        columns = {}
        for c in self.columns:
            columns[c] = self.column(c)
            release_free_memory()  # the batches' small buffers are heap holes the next column cannot reuse
        return Table(columns)


# what the builder does with an `X` event, by category
_KERNEL, _MEMCPY, _MEMSET, _RUNTIME, _SYNC = 0, 1, 2, 3, 4
_OP = 5  # _OP + kind for cpu_op / user_annotation / python_function
_FAMILY: dict[str | None, int] = {
    **dict.fromkeys(C.KERNEL_CATS, _KERNEL),
    **dict.fromkeys(C.MEMCPY_CATS, _MEMCPY),
    **dict.fromkeys(C.MEMSET_CATS, _MEMSET),
    **dict.fromkeys(C.RUNTIME_CATS, _RUNTIME),
    "cuda_sync": _SYNC,
    **{cat: _OP + kind for cat, kind in _OP_KIND.items()},
}
_COLLECTIVE_INDEX = {kind: i for i, kind in enumerate(C.COLLECTIVES)}
# columns that index the builder's names / threads, per family (remapped when builders merge)
_FAMILIES = ("gpu", "runtime", "ops", "syncs", "flows")
_NAME_COLUMNS = {
    "gpu": ("name", "pg", "dtype"),
    "runtime": ("name",),
    "ops": ("name",),
    "syncs": ("name",),
    "flows": (),
}
_THREAD_COLUMNS = {"gpu": (), "runtime": ("thread",), "ops": ("thread",), "syncs": (), "flows": ("thread",)}


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
        # record_param_comms: (start, end, thread, nelems, out_nelems, dtype, group size, process group)
        self.comms: list[tuple[float, float, int, int, int, str | None, int, str | None]] = []
        self.shapes: list[tuple[float, float, int, int, int, str | None, int, str | None]] = []  # same, nccl:*
        self.steps: list[tuple[int, float, float]] = []
        self._threads: dict[tuple[Any, Any], int] = {}
        self._thread_names: dict[tuple[Any, Any], str] = {}
        self._is_comm: dict[str, bool] = {}  # kernel name -> NCCL/RCCL kernel
        self.bad_durations = 0  # negative durations, read as 0
        self.bad_steps = 0  # ProfilerStep#N whose N does not fit 64 bits, left out

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
        """Add one decoded batch.

        The hot loop of the reader (about 1 us an event): one dict lookup dispatches on the category, names and
        threads are looked up inline, each row is one tuple.
        """
        gpu_rows, rt_rows, op_rows = self.gpu.rows, self.runtime.rows, self.ops.rows
        index, intern, threads = self._index, self.intern, self._threads
        family_of = _FAMILY.get
        bad_durations = 0
        for ev in events:
            ph = ev.ph
            if ph != "X":
                if ph == "s" or ph == "M":
                    self._add_other(ev)
                continue
            family = family_of(ev.cat)
            if family is None:
                continue
            ts = ev.ts
            if ts is None:
                continue
            dur = ev.dur
            if dur is not None and dur > 0:
                end = ts + dur
            else:
                end = ts + 0.0
                if dur:  # negative (NaN too, though JSON cannot spell it)
                    bad_durations += 1
            name = ev.name or ""
            if family >= _OP:
                key = (ev.pid, ev.tid)
                thread = threads.get(key)
                if thread is None:
                    thread = threads[key] = len(threads)
                idx = index.get(name)
                if idx is None:
                    idx = intern(name)
                kind = family - _OP
                op_rows.append((ts, end, thread, idx, kind))
                if name == RECORD_PARAM_COMMS:
                    self._add_comms(ts, end, thread, ev)
                elif name.startswith("nccl:"):
                    self._add_shapes(ts, end, thread, ev)
                elif kind != PYTHON and name.startswith("ProfilerStep#"):
                    m = _STEP.match(name)
                    if m:
                        if len(m.group(1)) <= _MAX_DIGITS - 1:
                            self.steps.append((int(m.group(1)), ts, end))
                        else:
                            self.bad_steps += 1
            elif family == _RUNTIME:
                key = (ev.pid, ev.tid)
                thread = threads.get(key)
                if thread is None:
                    thread = threads[key] = len(threads)
                args = ev.args
                corr = args.correlation if args is not None else None
                idx = index.get(name)
                if idx is None:
                    idx = intern(name)
                rt_rows.append((ts, end, thread, corr if corr is not None else -1, idx))
            elif family == _SYNC:
                a = ev.args
                self.syncs.rows.append(
                    (
                        ts,
                        end,
                        _stream_of(a, ev.tid),
                        intern(name),
                        a.wait_on_stream if a is not None and a.wait_on_stream is not None else -1,
                        a.correlation if a is not None and a.correlation is not None else -1,
                    )
                )
            else:
                gpu_rows.append(self._gpu_row(family, name, ts, end, ev))
        self.bad_durations += bad_durations
        for cols in (self.gpu, self.runtime, self.ops, self.syncs, self.flows):
            cols.flush()

    def _add_comms(self, ts: float, end: float, thread: int, ev: Event) -> None:
        """A `record_param_comms` op with a message size: the sizes, dtype, group size and process group torch
        records on it (-1 / None when absent). Its strings are interned only if a kernel takes them."""
        a = ev.args
        if a is None:
            return
        n = a.in_nelems if a.in_nelems is not None else a.in_size
        out_n = a.out_nelems if a.out_nelems is not None else a.out_size
        if n is None and out_n is None:
            return
        pg_value = a.pg_name if a.pg_name is not None else a.pg_id
        self.comms.append(
            (
                ts,
                end,
                thread,
                n if n is not None else -1,
                out_n if out_n is not None else -1,
                a.dtype,
                a.group_size if type(a.group_size) is int else -1,
                str(pg_value) if pg_value is not None else None,
            )
        )

    def _add_shapes(self, ts: float, end: float, thread: int, ev: Event) -> None:
        """A `nccl:*` op with the shape of its input tensor (`record_shapes=True`): its elements and dtype, the
        collective's input size (reduce-scatter: the whole buffer; all-gather: this rank's shard)."""
        a = ev.args
        if a is None or not a.input_dims:
            return
        try:
            dims = msgspec.json.decode(a.input_dims)
            types = msgspec.json.decode(a.input_type) if a.input_type else None
        except RecursionError:  # nested beyond the decoder's limit: no shape to read
            return
        if not (dims and isinstance(dims[0], list) and dims[0]):
            return
        if not all(type(d) is int and d >= 0 for d in dims[0]):
            return
        n = 1
        for d in dims[0]:
            n *= d
        dtype = _TORCH_DTYPE.get(types[0]) if isinstance(types, list) and types and isinstance(types[0], str) else None
        self.shapes.append((ts, end, thread, n if n < _INT64 else -1, -1, dtype, -1, None))

    def _add_other(self, ev: Event) -> None:
        """A flow start (CPU side of a correlation) or a thread_name metadata event."""
        if ev.ph == "s":
            if ev.cat in _FLOW_CATS and ev.ts is not None:
                corr = _as_int(ev.id)
                if corr is not None:
                    self.flows.rows.append((ev.ts, self.thread(ev.pid, ev.tid), corr))
        elif ev.name == "thread_name" and ev.args is not None and ev.args.name:
            self._thread_names[(ev.pid, ev.tid)] = ev.args.name

    def _gpu_row(self, family: int, name: str, ts: float, end: float, ev: Event) -> tuple:
        args = ev.args
        coll = C.NO_COLLECTIVE
        if family == _KERNEL:
            is_comm = self._is_comm.get(name)
            if is_comm is None:
                is_comm = self._is_comm[name] = C.is_comm_kernel(name)
            if is_comm:
                cls = C.COMM
                coll = _COLLECTIVE_INDEX[C.collective_of(name, args.collective if args is not None else None)]
            else:
                cls = C.COMPUTE
        else:
            cls = C.MEMCPY if family == _MEMCPY else C.MEMSET
        if args is None:
            return (ts, end, _stream_of(None, ev.tid), -1, -1, cls, coll, self.intern(name), -1, -1, -1, -1, -1, -1)
        intern = self.intern
        pg_value = args.pg_name if args.pg_name is not None else args.pg_id
        pg = intern(str(pg_value)) if pg_value is not None else -1
        n = args.in_nelems if args.in_nelems is not None else args.in_size
        dtype = intern(args.dtype)
        device = args.device if type(args.device) is int else _as_int(args.device)
        stream = args.stream if type(args.stream) is int else _stream_of(args, ev.tid)
        return (
            ts,
            end,
            stream,
            device if device is not None else -1,
            args.correlation if args.correlation is not None else -1,
            cls,
            coll,
            intern(name),
            pg,
            n if n is not None else -1,
            dtype,
            args.nbytes if args.nbytes is not None else -1,
            out_n if (out_n := args.out_nelems if args.out_nelems is not None else args.out_size) is not None else -1,
            args.group_size if type(args.group_size) is int else -1,
        )

    def part(self) -> dict[str, Any]:
        """What this builder holds, as plain picklable data, for `merge` into the builder of the whole file.

        Name and thread columns hold this builder's own indices; `merge` maps them to the receiver's.
        """
        tables: dict[str, dict[str, np.ndarray] | None] = {}
        for family in _FAMILIES:
            cols = getattr(self, family)
            cols.flush()
            tables[family] = {c: cols.column(c) for c in cols.columns} if cols.parts[next(iter(cols.columns))] else None
        return {
            "names": self.names,
            "threads": list(self._threads),
            "thread_names": self._thread_names,
            "steps": self.steps,
            "comms": self.comms,
            "shapes": self.shapes,
            "tables": tables,
            "counts": self._counts(),
        }

    def _counts(self) -> dict[str, int]:
        """What was kept out or changed while reading, by kind (for the notes; summed when builders merge)."""
        counts = {"bad_durations": self.bad_durations, "bad_steps": self.bad_steps}
        for family in _FAMILIES:
            for column, n in getattr(self, family).clamped.items():
                counts[f"{family}.{column}"] = n
        return counts

    def merge(self, part: dict[str, Any]) -> None:
        """Append a `part()` built from the events that follow this builder's, as if `add` had seen them."""
        # index -1 (no name) maps to -1 through the extra last entry
        names = np.array([self.intern(n) for n in part["names"]] + [-1], dtype=np.int64)
        threads = np.array([self.thread(pid, tid) for pid, tid in part["threads"]] + [-1], dtype=np.int64)
        for family, data in part["tables"].items():
            if data is None:
                continue
            for col in _NAME_COLUMNS[family]:
                data[col] = names[data[col]]
            for col in _THREAD_COLUMNS[family]:
                data[col] = threads[data[col]]
            getattr(self, family).append(data)
        self.steps.extend(part["steps"])
        self.comms.extend((*c[:2], int(threads[c[2]]), *c[3:]) for c in part.get("comms", []))
        self.shapes.extend((*c[:2], int(threads[c[2]]), *c[3:]) for c in part.get("shapes", []))
        self._thread_names.update(part["thread_names"])
        for key, n in part.get("counts", {}).items():
            if key == "bad_durations":
                self.bad_durations += n
            elif key == "bad_steps":
                self.bad_steps += n
            else:
                family, column = key.split(".", 1)
                clamped = getattr(self, family).clamped
                clamped[column] = clamped.get(column, 0) + n

    def build(self, metadata: dict[str, Any]) -> TraceModel:
        """The model; then the memory that reading freed goes back to the system (see `release_free_memory`)."""
        model = self._build(metadata)
        release_free_memory()
        return model

    def _build(self, metadata: dict[str, Any]) -> TraceModel:
        steps, repeated = _first_of_each_number(self.steps)
        threads = [("", "", "")] * len(self._threads)
        for (pid, tid), idx in self._threads.items():
            threads[idx] = (pid, tid, self._thread_names.get((pid, tid), ""))
        # flushed before the counts are read: the last batch's clamped integers are counted at its flush
        tables = {family: getattr(self, family).table() for family in _FAMILIES}
        notes = self._notes()
        if repeated:
            notes.append(
                f"ProfilerStep numbers repeat ({repeated}; a profiler restarted, or traces joined?): only the first "
                "step of each number is a step, the later ones' activity counts outside steps"
            )
        notes += _drop_copies(tables)
        tables["gpu"], device_note = _own_device(tables["gpu"])
        notes += device_note + _same_stream_overlaps(tables["gpu"])
        if self.comms and len(tables["gpu"]):
            self._sizes_from_comms(tables["gpu"], tables["runtime"], self.comms)
        if self.shapes and len(tables["gpu"]):
            filled = self._sizes_from_comms(tables["gpu"], tables["runtime"], self.shapes)
            if filled:
                notes.append(f"{SHAPES_NOTE} ({filled} collectives; the traces have no record_param_comms sizes)")
        kind_from = kinds_from_launch(self.names, tables["gpu"], tables["runtime"], tables["ops"])
        tables["gpu"] = tables["gpu"].with_column("kind_from", kind_from)
        steps_table = Table(
            {
                "number": np.array([s[0] for s in steps], dtype=np.int64),
                "start": np.array([s[1] for s in steps], dtype=np.float64),
                "end": np.array([s[2] for s in steps], dtype=np.float64),
            }
        )
        tables["steps"] = steps_table
        notes += _sensible_times(tables, self.source)
        return TraceModel(
            source=self.source,
            metadata=metadata,
            names=self.names,
            gpu=tables["gpu"],
            runtime=tables["runtime"],
            ops=tables["ops"],
            syncs=tables["syncs"],
            flows=tables["flows"],
            steps=tables["steps"],
            threads=threads,
            notes=notes,
        )

    def _sizes_from_comms(self, gpu: Table, runtime: Table, rows: list[tuple]) -> int:
        """Fill in place, for the NCCL kernels without `In msg nelems` / `Out msg nelems` (torch < 2.2), the
        sizes, dtype, group size and process group of the `record_param_comms` op that launched them: the
        innermost one on the launching thread enclosing the kernel's launch (its runtime call, by correlation).
        That is the op Kineto's `External id` names, or the one around it when the External id names an op
        inside record_param_comms. Values the kernel has stay; only its unknown (-1) ones are taken. `rows`:
        self.comms, or self.shapes (the nccl:* ops' Input Dims) for the kernels still without sizes. Returns how
        many kernels got sizes."""
        need = np.flatnonzero((gpu.cls == C.COMM) & (gpu.nelems < 0) & (gpu.out_nelems < 0))
        if not len(need) or not len(runtime):
            return 0
        c_start = np.array([r[0] for r in rows], dtype=np.float64)
        c_end = np.array([r[1] for r in rows], dtype=np.float64)
        c_thread = np.array([r[2] for r in rows], dtype=np.int64)
        need, launch = launches(need, gpu, runtime)
        found = enclosing(runtime.start[launch], runtime.thread[launch], c_start, c_end, c_thread)
        filled = 0
        for row, src in zip(need[found >= 0].tolist(), found[found >= 0].tolist(), strict=True):
            _, _, _, n, out_n, dtype, group, pg = rows[src]
            if not (-1 <= n < _INT64 and -1 <= out_n < _INT64):
                continue  # out of the column's range: left unknown
            filled += 1
            gpu.nelems[row], gpu.out_nelems[row] = n, out_n
            if gpu.dtype[row] < 0 and dtype is not None:
                gpu.dtype[row] = self.intern(dtype)
            if gpu.group[row] < 0 and 0 < group < 1 << 31:
                gpu.group[row] = group
            if gpu.pg[row] < 0 and pg is not None:
                gpu.pg[row] = self.intern(pg)
        return filled

    def _notes(self) -> list[str]:
        counts = self._counts()
        notes = []
        if counts.pop("bad_durations"):
            notes.append(f"{self.bad_durations} events with a negative duration were read as instants (duration 0)")
        if counts.pop("bad_steps"):
            notes.append(f"{self.bad_steps} ProfilerStep annotations with a step number beyond 64 bits were left out")
        if counts:
            fields = ", ".join(f"{key} ({n})" for key, n in sorted(counts.items()))
            notes.append(f"integers out of range, read as unknown (-1): {fields}")
        return notes


def _sensible_times(tables: dict[str, Table], source: str) -> list[str]:
    """Drop, in `tables`, the events whose time or end is infinite, NaN or at least MAX_TIME_US away from 0 (one
    vectorized pass per column), and say how many. A UserError when the GPU work's typical time is that far
    (every kernel's duration lost: any verdict would be made up); one wild event among good ones is only noted."""
    _refuse_coarse_clock(tables, source)
    infinite = beyond = 0
    for family, table in tables.items():
        ok = np.abs(table.start) < MAX_TIME_US  # False for NaN
        if hasattr(table, "end"):
            ok &= np.abs(table.end) < MAX_TIME_US
        if ok.all():
            continue
        bad = np.flatnonzero(~ok)
        finite = np.isfinite(table.start[bad])
        if hasattr(table, "end"):
            finite &= np.isfinite(table.end[bad])
        infinite += int(len(bad) - finite.sum())
        beyond += int(finite.sum())
        tables[family] = table.take(ok)
    notes = []
    if infinite:
        notes.append(f"{infinite} events with an infinite or NaN time or end were left out")
    if beyond:
        notes.append(
            f"{beyond} events with a time or end beyond 2^62 µs (146,000 years, where a float64 time moves in steps "
            "of a millisecond: no duration can be measured) were left out"
        )
    return notes


def _refuse_coarse_clock(tables: dict[str, Table], source: str) -> None:
    """The UserError of a trace whose typical time (the median GPU start, else CPU op start, else the largest
    time) is where a float64 time moves in steps of COARSE_US or more."""
    typical = 0.0
    for family in ("gpu", "ops"):
        starts = tables[family].start
        starts = np.abs(starts[np.isfinite(starts)])
        if len(starts):
            typical = float(np.median(starts))
            break
    else:
        for family in ("gpu", "runtime", "ops", "syncs", "steps"):
            for column in ("start", "end"):
                values = getattr(tables[family], column, None)
                if values is not None and len(values := np.abs(values[np.isfinite(values)])):
                    typical = max(typical, float(values.max()))
    if np.spacing(typical) >= COARSE_US:
        raise UserError(
            f"timestamps reach {typical:.3g} µs, where a float64 time moves in steps of {np.spacing(typical):.3g} "
            "µs: no kernel's duration can be measured (is the trace's clock in µs since the epoch or boot?)",
            source,
        )


# the families whose exact copies are one event: a GPU activity, or a host record with its correlation (unique
# per CUDA call); the CPU ops are not among them (nested ops of one thread can share every column the model
# keeps: whole-µs times, one name, as `aten::zeros` inside `aten::zeros` in real traces)
_COPIES = {
    "gpu": ("GPU activity", "GPU activities"),
    "runtime": ("runtime call", "runtime calls"),
    "syncs": ("cuda_sync event", "cuda_sync events"),
    "flows": ("flow start", "flow starts"),
}


def _drop_copies(tables: dict[str, Table]) -> list[str]:
    """Drop, in `tables`, every row equal in each column to an earlier row of its family (a GPU activity, or a
    host record with a known correlation), and say how many of each family were copies."""
    counts = []
    for family, (one, many) in _COPIES.items():
        table = tables[family]
        copies = _later_copies(table)
        if copies is not None and family != "gpu":
            copies &= table.correlation >= 0
        if copies is None or not copies.any():
            continue
        n = int(copies.sum())
        counts.append(f"{n} {one if n == 1 else many}")
        tables[family] = table.take(~copies)
    if not counts:
        return []
    return [f"events that are exact copies of earlier ones were counted once: {', '.join(counts)} (a trace joined "
            "or merged twice?)"]  # fmt: skip


def _later_copies(table: Table) -> np.ndarray | None:
    """Which rows equal an earlier row in every column; None when no two rows share a start. One stable sort
    by start (near-linear on a trace's time-ordered runs); only the rows sharing a start are compared whole."""
    n = len(table)
    if n < 2:
        return None
    order = np.argsort(table.start, kind="stable")
    start = table.start[order]
    tie = start[1:] == start[:-1]
    if not tie.any():
        return None
    in_tie = np.zeros(n, dtype=bool)
    in_tie[1:] |= tie
    in_tie[:-1] |= tie
    rows = np.sort(order[in_tie])  # in file order: of equal rows, the first is kept
    columns = [getattr(table, c)[rows] for c in table._columns]
    key = np.lexsort(columns[::-1])  # stable: equal rows stay in file order
    same = np.ones(len(rows) - 1, dtype=bool)
    for values in columns:
        v = values[key]
        same &= v[1:] == v[:-1]
    copies = np.zeros(n, dtype=bool)
    copies[rows[key[1:][same]]] = True
    return copies


SAME_STREAM_SLACK_US = 1.0  # CUPTI's timestamps of back-to-back kernels may touch; the real traces overlap by 0


def _same_stream_overlaps(gpu: Table) -> list[str]:
    """A note when GPU activities overlap an earlier one on their own stream by more than SAME_STREAM_SLACK_US:
    one CUDA stream runs one at a time, so these are copies with other ids (not `_drop_copies`' exact ones) or
    traces merged with clocks apart, and their time is counted as many times as they repeat. None of the real
    traces in ../shared/traces has one."""
    sensible = (np.abs(gpu.start) < MAX_TIME_US) & (np.abs(gpu.end) < MAX_TIME_US)  # as _sensible_times keeps
    if not sensible.all():
        gpu = gpu.take(sensible)
    if len(gpu) < 2:
        return []
    order = np.lexsort((gpu.start, gpu.stream))
    stream, start, end = gpu.stream[order], gpu.start[order], gpu.end[order]
    same = stream[1:] == stream[:-1]
    # the latest end so far on each stream: a running maximum that restarts at each stream's first row
    reach = end.copy()
    first = np.flatnonzero(np.r_[True, ~same])
    for a, b in zip(first.tolist(), [*first[1:].tolist(), len(end)], strict=True):
        reach[a:b] = np.maximum.accumulate(end[a:b])
    over = same & (reach[:-1] - start[1:] > SAME_STREAM_SLACK_US)
    n = int(over.sum())
    if not n:
        return []
    streams = np.unique(stream[1:][over])
    return [
        f"{n} GPU activities start before the one before them on their stream ended (streams "
        f"{', '.join(map(str, streams[:5].tolist()))}{', ...' if len(streams) > 5 else ''}), which one CUDA stream "
        "cannot run: copies with other ids, or traces merged? Their time counts each time they appear"
    ]


def _own_device(gpu: Table) -> tuple[Table, list[str]]:
    """The GPU activities of the rank's own device, and a note, when they ran on several: a rank drives one
    device, the one its NCCL kernels run on; another device's compute must not count as hiding its
    communication. When the NCCL kernels run on several devices, or on none, all are kept and the note says so.
    Activities of unknown device (-1) are kept."""
    known = gpu.device[gpu.device >= 0]
    if not len(known) or known.min() == known.max():
        return gpu, []
    devices = np.unique(known).tolist()
    listed = f"GPU activity on {len(devices)} devices ({', '.join(map(str, devices))})"
    comm = np.unique(gpu.device[(gpu.cls == C.COMM) & (gpu.device >= 0)]).tolist()
    if len(comm) != 1:
        why = f"its NCCL kernels run on devices {', '.join(map(str, comm))}" if comm else "no NCCL kernel on any"
        return gpu, [f"{listed}: all measured as one rank's ({why}); a rank drives one device"]
    own = comm[0]
    other = (gpu.device >= 0) & (gpu.device != own)
    n = int(other.sum())
    return gpu.take(~other), [
        f"{listed}: only device {own}'s, where the rank's NCCL kernels run, is measured ({n} activities of the "
        "other devices left out: a rank drives one device)"
    ]


def _first_of_each_number(steps: list[tuple[int, float, float]]) -> tuple[list[tuple[int, float, float]], str]:
    """The steps in time order, each number once (its first span; the same span annotated twice is one step),
    and the repeated numbers with their counts ('' when none), e.g. '#5 x2, #6 x2'."""
    kept: dict[int, tuple[int, float, float]] = {}
    extra: dict[int, int] = {}
    for s in sorted(steps, key=lambda s: s[1]):
        first = kept.setdefault(s[0], s)
        if first is not s and first[1:] != s[1:]:
            extra[s[0]] = extra.get(s[0], 1) + 1
    text = ", ".join(f"#{n} x{k}" for n, k in list(extra.items())[:5])
    return sorted(kept.values(), key=lambda s: s[1]), text + (f" and {len(extra) - 5} more" if len(extra) > 5 else "")


def release_free_memory() -> None:
    """Return the C heap's free pages to the system (glibc `malloc_trim`; nothing elsewhere). Reading allocates
    and frees millions of small objects and thousands of batch buffers between the long-lived columns; glibc
    keeps most of what was freed, about as much again as the model on big traces, and the analysis that
    follows would then stack its own peak on top of it."""
    global _malloc_trim
    if _malloc_trim is None:
        import ctypes
        import ctypes.util

        try:
            _malloc_trim = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
        except (OSError, AttributeError):
            _malloc_trim = False
    if _malloc_trim:
        _malloc_trim(0)


_malloc_trim: Any = None  # glibc's malloc_trim once looked up, False where there is none


def _as_int(value: Any) -> int | None:
    """An int, or the first number in a string (`stream 7`, `cuda:1`); None when there is none. A number too
    long for 64 bits reads as _TOO_BIG, which the column's conversion then notes and drops."""
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        m = _STREAM_IN_TID.search(value)
        if m is None:
            return None
        digits = m.group(1)
        return int(digits) if len(digits) <= _MAX_DIGITS else _TOO_BIG
    return None


def _stream_of(args: Any, tid: Any) -> int:
    """The CUDA stream of a GPU activity: `args.stream`, else the number in its tid (`stream 7` in torch 1.8)."""
    if args is not None and args.stream is not None:
        value = _as_int(args.stream)
        if value is not None:
            return value
    value = _as_int(tid)
    return value if value is not None else -1
