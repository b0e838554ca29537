"""Property-based fuzzing of the trace reader: Hypothesis mutates small real traces (bytes, values, gzip) and
`load_trace` must return a model or raise UserError, never anything else, whatever the chunking.

The seed is a sample of sample_traces/straggler/rank0.trace.json.gz (every category of event, the metadata
around the array). The stream's chunk sizes are drawn too, so that the boundary guess, the exact scan and
the resumed scan all meet the mutations at every offset; where two chunkings both read a file, their models
must be the same.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from overlapcheck.errors import UserError  # noqa: E402
from overlapcheck.trace import jsonstream  # noqa: E402
from overlapcheck.trace.model import TraceModel  # noqa: E402
from overlapcheck.trace.reader import load_trace  # noqa: E402

SEED = Path(__file__).resolve().parents[1] / "sample_traces" / "straggler" / "rank0.trace.json.gz"
FUZZ = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=True,  # the same examples on every run: a failure in CI is a failure here
)


@cache
def seed_doc() -> dict[str, Any]:
    """A small real trace: its metadata and every 12th event (a few hundred, every category)."""
    doc = json.loads(gzip.decompress(SEED.read_bytes()))
    events = doc.pop("traceEvents")
    sample = [e for e in events if e.get("ph") == "M"] + events[::12]
    return {**doc, "traceEvents": sample}


@cache
def seed_bytes() -> bytes:
    return json.dumps(seed_doc()).encode()


NASTY_INTS = st.sampled_from([0, -1, 1, 2**31, 2**32 + 1, 2**53 + 1, 2**63 - 1, 2**63, 2**64, -(2**63) - 1, 10**30])
NASTY_VALUES = st.one_of(
    NASTY_INTS,
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([1e308, -1e308, 5e-324, -0.0]),
    st.text(max_size=20),
    st.sampled_from(["", "9" * 30, "stream 99999999999999999999", "cuda:1", "ProfilerStep#" + "9" * 40, "\x00"]),
    st.booleans(),
    st.none(),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
)
FIELDS = st.sampled_from(["ph", "cat", "name", "pid", "tid", "ts", "dur", "id", "args"])
ARGS = st.sampled_from(
    ["stream", "correlation", "device", "External id", "Collective name", "Process Group Name", "In msg nelems",
     "In msg size", "Group size", "dtype", "name", "wait_on_stream", "bytes", "cuda_sync_kind"]
)  # fmt: skip


@st.composite
def value_mutations(draw: st.DrawFn) -> bytes:
    """The seed with a few fields of a few events (or of its metadata) set to nasty values."""
    doc = json.loads(seed_bytes())
    events = doc["traceEvents"]
    for _ in range(draw(st.integers(1, 6))):
        where = draw(st.sampled_from(["event", "args", "meta", "rank", "insert", "delete"]))
        i = draw(st.integers(0, max(0, len(events) - 1)))
        value = draw(NASTY_VALUES)
        event = events[i] if i < len(events) and isinstance(events[i], dict) else {}
        if where == "event":
            event[draw(FIELDS)] = value
        elif where == "args":
            args = event.setdefault("args", {})
            if isinstance(args, dict):
                args[draw(ARGS)] = value
        elif where == "meta":
            doc[draw(st.sampled_from(["distributedInfo", "deviceProperties", "traceName", "schemaVersion"]))] = value
        elif where == "rank":
            info = doc.setdefault("distributedInfo", {})
            if isinstance(info, dict):
                info[draw(st.sampled_from(["rank", "world_size"]))] = value
        elif where == "insert":
            events.insert(i, value)
        elif i < len(events):
            del events[i]
    return json.dumps(doc).encode()


@st.composite
def byte_mutations(draw: st.DrawFn) -> bytes:
    """The seed's bytes with a few flips, inserts, deletions, duplications or a truncation."""
    data = bytearray(seed_bytes())
    specials = st.sampled_from([b"{", b"}", b"[", b"]", b",", b'"', b"\\", b":", b" " * 200, b"\n", b"\x00", b"\xff"])
    for _ in range(draw(st.integers(1, 5))):
        if not data:
            break
        op = draw(st.sampled_from(["flip", "insert", "delete", "duplicate", "truncate"]))
        at = draw(st.integers(0, len(data) - 1))
        if op == "flip":
            data[at] = draw(st.integers(0, 255))
        elif op == "insert":
            data[at:at] = draw(st.one_of(specials, st.binary(min_size=1, max_size=8)))
        elif op == "delete":
            del data[at : at + draw(st.integers(1, 64))]
        elif op == "duplicate":
            data[at:at] = data[at : at + draw(st.integers(1, 256))]
        else:
            del data[at:]
    return bytes(data)


@st.composite
def gzip_mutations(draw: st.DrawFn) -> bytes:
    """A (possibly mutated) trace gzipped, then possibly cut or corrupted."""
    raw = draw(st.one_of(st.just(seed_bytes()), value_mutations(), byte_mutations()))
    data = bytearray(gzip.compress(raw, compresslevel=1, mtime=0))
    op = draw(st.sampled_from(["none", "cut", "flip", "append"]))
    at = draw(st.integers(0, len(data) - 1))
    if op == "cut":
        del data[at:]
    elif op == "flip":
        data[at] ^= 1 << draw(st.integers(0, 7))
    elif op == "append":
        data += draw(st.binary(max_size=16))
    return bytes(data)


CHUNKS = st.sampled_from([64, 100, 257, 1000, 4096, 1 << 16])


def _read(data: bytes, suffix: str, chunk: int) -> TraceModel | UserError:
    """load_trace over `data` with the given chunk size; the UserError when it refuses the file."""
    with tempfile.TemporaryDirectory() as folder, pytest.MonkeyPatch.context() as mp:
        mp.setattr(jsonstream, "CHUNK", chunk)
        mp.setattr(jsonstream, "TAIL", max(16, chunk // 4))
        path = os.path.join(folder, "rank0" + suffix)
        with open(path, "wb") as f:
            f.write(data)
        try:
            model = load_trace(path)
        except UserError as exc:
            assert "\n" not in str(exc) and path in str(exc), str(exc)
            return exc
    _check_model(model)
    return model


def _check_model(model: TraceModel) -> None:
    for family in ("gpu", "runtime", "ops", "syncs", "flows", "steps"):
        table = getattr(model, family)
        assert np.isfinite(table.start).all(), family
        if hasattr(table, "end"):
            assert np.isfinite(table.end).all() and (table.end >= table.start).all(), family
    for text in model.notes:
        assert isinstance(text, str) and "\n" not in text


def _same(a: TraceModel, b: TraceModel) -> None:
    assert a.names == b.names and a.notes == b.notes and a.threads == b.threads
    for family in ("gpu", "runtime", "ops", "syncs", "flows", "steps"):
        ta, tb = getattr(a, family), getattr(b, family)
        for column in ta._columns:
            assert np.array_equal(getattr(ta, column), getattr(tb, column)), (family, column)


def _property(data: bytes, suffix: str, chunk: int) -> None:
    small = _read(data, suffix, chunk)
    whole = _read(data, suffix, 1 << 22)
    assert isinstance(small, UserError) == isinstance(whole, UserError), (small, whole)
    if isinstance(small, TraceModel) and isinstance(whole, TraceModel):
        _same(small, whole)


@FUZZ
@given(data=value_mutations(), chunk=CHUNKS)
def test_value_mutations_never_raise_anything_but_user_error(data: bytes, chunk: int):
    _property(data, ".json", chunk)


@FUZZ
@given(data=byte_mutations(), chunk=CHUNKS)
def test_byte_mutations_never_raise_anything_but_user_error(data: bytes, chunk: int):
    _property(data, ".json", chunk)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(data=gzip_mutations(), chunk=CHUNKS)
def test_gzip_mutations_never_raise_anything_but_user_error(data: bytes, chunk: int):
    _property(data, ".json.gz", chunk)


def test_the_seed_reads_the_same_at_every_chunk_size():
    models = [_read(seed_bytes(), ".json", chunk) for chunk in (64, 1000, 1 << 22)]
    assert all(isinstance(m, TraceModel) for m in models)
    for m in models[1:]:
        _same(models[0], m)  # type: ignore[arg-type]
    assert len(models[0].gpu) > 0 and not math.isnan(float(models[0].gpu.start.sum()))
