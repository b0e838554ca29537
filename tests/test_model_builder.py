"""ModelBuilder's fast loop builds exactly the model that the plain, one-event-at-a-time rules build."""

from __future__ import annotations

import glob
import json
import os
import re
from typing import Any

import numpy as np
import pytest
from builders import shared_traces_dir

from overlapcheck.trace import classify as C
from overlapcheck.trace import jsonstream
from overlapcheck.trace.events import EVENTS_DECODER, Event
from overlapcheck.trace.jsonstream import TraceStream
from overlapcheck.trace.model import OP_COLUMNS, PYTHON, ModelBuilder, TraceModel, _as_int, _stream_of

SHARED = shared_traces_dir()
TRACES = sorted(str(p) for p in SHARED.rglob("*.json*")) if SHARED else []
_OP_KIND = {"cpu_op": 0, "Operator": 0, "user_annotation": 1, "python_function": PYTHON}
assert set(OP_COLUMNS) == {"start", "end", "thread", "name", "kind"}


class PlainBuilder(ModelBuilder):
    """The rules of docs/metrics.md's reader, one event at a time, no shortcuts (the reference)."""

    def add(self, events: list[Event]) -> None:
        for ev in events:
            self._one(ev)
        for cols in (self.gpu, self.runtime, self.ops, self.syncs, self.flows):
            cols.flush()

    def _one(self, ev: Event) -> None:
        flow = ev.ph == "s" and ev.cat in {"ac2g", "async_cpu_to_gpu", "async"} and ev.ts is not None
        if flow and _as_int(ev.id) is not None:
            self.flows.rows.append((ev.ts, self.thread(ev.pid, ev.tid), _as_int(ev.id)))
        if ev.ph == "M" and ev.name == "thread_name" and ev.args is not None and ev.args.name:
            self._thread_names[(ev.pid, ev.tid)] = ev.args.name
        if ev.ph != "X" or ev.ts is None:
            return
        ts, cat, name, a = ev.ts, ev.cat, ev.name or "", ev.args
        end = ts + (ev.dur if ev.dur is not None and ev.dur > 0 else 0.0)
        corr = a.correlation if a is not None and a.correlation is not None else -1
        if cat in C.GPU_CATS:
            self.gpu.rows.append(self._gpu(cat, name, ts, end, a, ev.tid))
        elif cat in C.RUNTIME_CATS:
            self.runtime.rows.append((ts, end, self.thread(ev.pid, ev.tid), corr, self.intern(name)))
        elif cat in _OP_KIND:
            thread = self.thread(ev.pid, ev.tid)
            self.ops.rows.append((ts, end, thread, self.intern(name), _OP_KIND[cat]))
            # the sizes the kernels may lack, kept aside as the reader keeps them (its own rules, shared)
            if name == "record_param_comms":
                self._add_comms(ts, end, thread, ev)
            elif name.startswith("nccl:"):
                self._add_shapes(ts, end, thread, ev)
            m = re.match(r"^ProfilerStep#(\d+)$", name)
            if m and _OP_KIND[cat] != PYTHON:
                self.steps.append((int(m.group(1)), ts, end))
        elif cat == "cuda_sync":
            wait = a.wait_on_stream if a is not None and a.wait_on_stream is not None else -1
            self.syncs.rows.append((ts, end, _stream_of(a, ev.tid), self.intern(name), wait, corr))

    def _gpu(self, cat: str, name: str, ts: float, end: float, a: Any, tid: Any) -> tuple:
        if cat not in C.KERNEL_CATS:
            cls, coll = (C.MEMCPY if cat in C.MEMCPY_CATS else C.MEMSET), C.NO_COLLECTIVE
        elif C.is_comm_kernel(name):
            cls, coll = C.COMM, C.COLLECTIVES.index(C.collective_of(name, a.collective if a else None))
        else:
            cls, coll = C.COMPUTE, C.NO_COLLECTIVE
        if a is None:
            return (ts, end, _stream_of(a, tid), -1, -1, cls, coll, self.intern(name), -1, -1, -1, -1, -1, -1)
        pg_value = a.pg_name if a.pg_name is not None else a.pg_id
        pg = self.intern(str(pg_value)) if pg_value is not None else -1  # interned before dtype, then name
        n = a.in_nelems if a.in_nelems is not None else a.in_size
        dtype = self.intern(a.dtype)
        device = _as_int(a.device)
        return (
            ts,
            end,
            _stream_of(a, tid),
            -1 if device is None else device,
            -1 if a.correlation is None else a.correlation,
            cls,
            coll,
            self.intern(name),
            pg,
            -1 if n is None else n,
            dtype,
            -1 if a.nbytes is None else a.nbytes,
            a.out_nelems if a.out_nelems is not None else (-1 if a.out_size is None else a.out_size),
            a.group_size if isinstance(a.group_size, int) else -1,
        )


def build(path: str, builder: type[ModelBuilder]) -> TraceModel:
    stream = TraceStream(path, EVENTS_DECODER)
    b = builder(path)
    for batch in stream.batches():
        b.add(batch)
    return b.build(stream.metadata)


def assert_same_model(a: TraceModel, b: TraceModel) -> None:
    assert a.names == b.names
    assert a.threads == b.threads
    assert a.metadata == b.metadata
    for family in ("gpu", "runtime", "ops", "syncs", "flows", "steps"):
        ta, tb = getattr(a, family), getattr(b, family)
        assert ta._columns == tb._columns
        for col in ta._columns:
            x, y = getattr(ta, col), getattr(tb, col)
            assert x.dtype == y.dtype, (family, col)
            assert np.array_equal(x, y, equal_nan=True), (family, col)


@pytest.mark.parametrize("path", TRACES, ids=lambda p: os.path.relpath(p, str(SHARED)))
def test_fast_builder_matches_plain_rules(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jsonstream, "CHUNK", 256 << 10)  # many batches: state carried across them
    assert_same_model(build(path, ModelBuilder), build(path, PlainBuilder))


def test_fast_builder_matches_plain_rules_on_a_simulated_job(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from overlapcheck.cli import main

    result = CliRunner().invoke(
        main,
        [
            "simulate",
            "--scenario",
            "comms-logger",
            "--out",
            str(tmp_path),
            "--nodes",
            "1",
            "--gpus-per-node",
            "2",
            "--steps",
            "2",
        ],
    )
    assert result.exit_code == 0, result.output
    monkeypatch.setattr(jsonstream, "CHUNK", 64 << 10)
    for path in sorted(glob.glob(str(tmp_path / "rank*.trace.json*"))):
        assert_same_model(build(path, ModelBuilder), build(path, PlainBuilder))


@pytest.mark.parametrize("path", TRACES[::3], ids=lambda p: os.path.relpath(p, str(SHARED)))
def test_parallel_reader_builds_the_same_model(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Several processes, many runs each: the merged model is the one a single builder makes."""
    from overlapcheck.trace.fastpath import load_parallel
    from overlapcheck.trace.reader import load_trace

    monkeypatch.setattr(jsonstream, "CHUNK", 128 << 10)
    assert_same_model(load_parallel(path, workers=2), load_trace(path))


def test_parallel_reader_survives_a_wrong_guess(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every run ends at a `},{` inside a nested value: workers fail to decode, the plain reader takes over."""
    from overlapcheck.trace.fastpath import load_parallel
    from overlapcheck.trace.reader import load_trace

    ev = {"ph": "X", "cat": "cpu_op", "name": "op", "ts": 1, "dur": 1, "args": {"x": [{"a": 1}, {"b": 2}]}}
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": [dict(ev, ts=i) for i in range(300)]}, separators=(",", ":")))
    monkeypatch.setattr(jsonstream, "CHUNK", 1000)
    monkeypatch.setattr(jsonstream, "TAIL", 30)
    model = load_parallel(str(path), workers=2)
    assert len(model.ops) == 300
    assert_same_model(model, load_trace(str(path)))


def test_parallel_reader_reports_malformed_input_like_the_plain_one(tmp_path, monkeypatch) -> None:
    from overlapcheck.errors import UserError
    from overlapcheck.trace.fastpath import load_parallel

    path = tmp_path / "bad.json"
    path.write_bytes(b'{"traceEvents": [' + b'{"ph": "X", "name": "a"},' * 200 + b'{"ph": "X", "ts": "x"}]}')
    monkeypatch.setattr(jsonstream, "CHUNK", 500)
    with pytest.raises(UserError, match="unexpected event field type"):
        load_parallel(str(path), workers=2)
