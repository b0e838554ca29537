"""The streamed reader yields exactly the events `json.load` sees, wherever the chunks happen to split the file.

The reader guesses each run's last event boundary (`},{`) and lets the decoder check the guess; these tests put
chunk boundaries everywhere (tiny CHUNK and TAIL) and feed it the JSON that could fool a guess: braces, brackets
and `},{` inside strings, escaped quotes and backslashes, unicode, nested arrays of objects in args.
"""

from __future__ import annotations

import gzip
import json
import os
from typing import Any

import msgspec
import pytest
from builders import shared_traces_dir

from overlapcheck.trace import jsonstream
from overlapcheck.trace.events import EVENTS_DECODER, NO_VALUE, Args, Event
from overlapcheck.trace.jsonstream import TraceStream

SHARED = shared_traces_dir()
TRACES = sorted(str(p) for p in SHARED.rglob("*.json*")) if SHARED else []
ANY_EVENTS = msgspec.json.Decoder(list[Any])


def stream(path: str, decoder: msgspec.json.Decoder = ANY_EVENTS) -> tuple[list, dict[str, Any], bool]:
    s = TraceStream(path, decoder)
    events = [ev for batch in s.batches() for ev in batch]
    return events, s.metadata, s.bare_list


def reference(data: bytes) -> tuple[list, dict[str, Any], bool]:
    """What `json.load` sees: (events, metadata, whether the file is a bare list of events)."""
    doc = json.loads(data)
    if isinstance(doc, list):
        return doc, {}, True
    events = doc.pop("traceEvents")
    return events, doc, False


def read(path: str) -> bytes:
    with open(path, "rb") as f:
        data = f.read()
    return gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data


@pytest.fixture
def chunks(monkeypatch: pytest.MonkeyPatch):
    """Set the reader's chunk and tail sizes."""

    def set_sizes(chunk: int, tail: int | None = None) -> None:
        monkeypatch.setattr(jsonstream, "CHUNK", chunk)
        monkeypatch.setattr(jsonstream, "TAIL", tail if tail is not None else max(1, chunk // 4))

    return set_sizes


@pytest.mark.parametrize("path", TRACES, ids=lambda p: os.path.relpath(p, str(SHARED)))
def test_real_traces_stream_like_json_load(path: str, chunks) -> None:
    """At the default chunk size and at one that splits the file at odd places (a prime), against one
    `json.loads` of the file (decoding it is half of the test's time: once for both sizes)."""
    want_events, want_meta, want_bare = reference(read(path))
    for chunk in (4 << 20, 40009):
        chunks(chunk)
        events, metadata, bare = stream(path)
        assert bare == want_bare, chunk
        assert len(events) == len(want_events), chunk
        assert events == want_events, chunk
        assert metadata == want_meta, chunk


@pytest.mark.parametrize("path", TRACES, ids=lambda p: os.path.relpath(p, str(SHARED)))
def test_real_traces_typed_events_match_conversion(path: str, chunks) -> None:
    """The typed decoder keeps exactly what msgspec.convert keeps from json.load's dicts; its raw fields (kept
    undecoded, `Args.RAW_FIELDS`) hold exactly the JSON values of those keys."""
    chunks(32 << 10)
    events, _, _ = stream(path, EVENTS_DECODER)
    dicts = reference(read(path))[0]
    raw_keys = {Args.__struct_encode_fields__[Args.__struct_fields__.index(f)]: f for f in Args.RAW_FIELDS}
    raw_values = [{k: a[k] for k in raw_keys if k in a} if isinstance(a := d.get("args"), dict) else {} for d in dicts]
    stripped = [
        {**d, "args": {k: v for k, v in d["args"].items() if k not in raw_keys}} if raw else d
        for d, raw in zip(dicts, raw_values, strict=True)
    ]
    want = msgspec.convert(stripped, list[Event], strict=False)
    got = [
        msgspec.structs.replace(e, args=msgspec.structs.replace(e.args, **dict.fromkeys(Args.RAW_FIELDS, NO_VALUE)))
        if e.args is not None
        else e
        for e in events
    ]
    assert got == want
    decoded = [
        {k: msgspec.json.decode(raw) for k, f in raw_keys.items() if (raw := getattr(e.args, f))}
        if e.args is not None
        else {}
        for e in events
    ]
    assert decoded == raw_values


# Events written to fool a boundary guess: every `{`, `}`, `[`, `]`, `,` and quote here sits inside a string or a
# nested value, so a cut there is not between two events.
ADVERSARIAL = [
    {"ph": "X", "cat": "cpu_op", "name": "a}, {b", "ts": 1, "dur": 2, "args": {"x": '}, {"ph": "X"}'}},
    {"ph": "X", "cat": "cpu_op", "name": 'quote " and \\ backslash \\\\', "ts": 2.5, "dur": 1},
    {
        "ph": "X",
        "cat": "kernel",
        "name": "ncclDevKernel_AllGather_RING_LL(x)",
        "pid": 0,
        "tid": 7,
        "ts": 3,
        "dur": 4,
        "args": {"stream": 7, "correlation": 11, "list": [{"a": 1}, {"b": [2, {"c": "]}"}]}]},
    },
    {"ph": "X", "cat": "python_function", "name": "ünïcødé ☃ \u2028 \U0001f600 \\u0041", "ts": 4, "dur": 0},
    {
        "ph": "X",
        "cat": "cuda_runtime",
        "name": "cudaLaunchKernel",
        "ts": 5,
        "dur": 1,
        "args": {"correlation": 11, "weird": '\\"}, {\\"'},
    },
    {"ph": "s", "cat": "ac2g", "id": 11, "pid": 1, "tid": 1, "ts": 5, "name": "[{]},{\\"},
    {"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "main },{ thread"}},
    {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#3", "ts": 0, "dur": 10, "args": {}},
    {"ph": "i", "name": "", "ts": 6, "args": {"nested": {"deeper": {"deepest": [[], [{}], "}{"]}}}},
    {},
]
METADATA = {
    "schemaVersion": 1,
    "deviceProperties": [{"id": 0}, {"id": 1, "name": "}, {"}],
    "distributedInfo": {"rank": 3, "pg_config": [{"ranks": [0, 1]}, {"ranks": []}]},
}


def layouts() -> dict[str, bytes]:
    """The same trace written the ways real writers do (and a few they do not)."""
    pretty = json.dumps({**METADATA, "traceEvents": ADVERSARIAL}, indent=2, ensure_ascii=False).encode()
    return {
        "pretty, events last": pretty,
        "minified": json.dumps({**METADATA, "traceEvents": ADVERSARIAL}, separators=(",", ":")).encode(),
        "ascii escapes": json.dumps({"traceEvents": ADVERSARIAL, **METADATA}).encode(),
        "events first, metadata after": json.dumps({"traceEvents": ADVERSARIAL, **METADATA}, indent=1).encode(),
        "events in the middle": json.dumps(
            {"a": [1, {"b": "}, {"}], "traceEvents": ADVERSARIAL, "z": {"q": []}}
        ).encode(),
        "bare list": json.dumps(ADVERSARIAL, indent=4).encode(),
        "bare list minified": json.dumps(ADVERSARIAL, separators=(",", ":")).encode(),
        "kineto-like spacing": b'{\n  "schemaVersion": 1,\n  "traceEvents": [\n  '
        + b",\n  ".join(json.dumps(e).encode() for e in ADVERSARIAL)
        + b'\n  ],\n  "traceName": "x"\n}\n',
        "empty array": b'{"traceEvents": [], "x": 1}',
        "one event": b'{"traceEvents":[{"ph":"X","name":"},{"}]}',
    }


@pytest.mark.parametrize("layout", list(layouts()))
def test_every_chunk_boundary(layout: str, chunks, tmp_path) -> None:
    """Every chunk size from 1 byte to the whole file, so that chunks end at every position."""
    data = layouts()[layout]
    path = tmp_path / "t.json"
    path.write_bytes(data)
    want_events, want_meta, _ = reference(data)
    for size in range(1, len(data) + 2):
        chunks(size, tail=max(1, size // 3))
        events, metadata, _ = stream(str(path))
        assert events == want_events, size
        assert metadata == want_meta, size


@pytest.mark.parametrize("layout", ["pretty, events last", "minified", "bare list"])
def test_gzipped_at_every_chunk_boundary(layout: str, chunks, tmp_path) -> None:
    data = layouts()[layout]
    path = tmp_path / "t.json.gz"
    path.write_bytes(gzip.compress(data))
    want_events, want_meta, _ = reference(data)
    for size in range(1, len(data) + 2, 7):
        chunks(size)
        assert stream(str(path))[:2] == (want_events, want_meta), size


def test_many_events_many_chunks(chunks, tmp_path) -> None:
    """Thousands of events over hundreds of chunks: runs of events, not single ones, are decoded."""
    events = [dict(ADVERSARIAL[i % len(ADVERSARIAL)], ts=i) for i in range(5000)]
    data = json.dumps({"traceEvents": events, **METADATA}, indent=2).encode()
    path = tmp_path / "t.json"
    path.write_bytes(data)
    for size in (997, 4096, 65536):
        chunks(size, tail=256)
        assert stream(str(path)) == reference(data), size


def test_a_wrong_guess_falls_back_to_the_exact_scan(chunks, tmp_path) -> None:
    """A chunk whose only `},{` lies inside a nested value: the guess fails to decode and the scan takes over."""
    ev = {"ph": "X", "name": "n", "args": {"list": [{"a": 1}, {"b": 2}]}}
    data = json.dumps({"traceEvents": [ev] * 50}, separators=(",", ":")).encode()
    path = tmp_path / "t.json"
    path.write_bytes(data)
    for size in range(20, 200):
        chunks(size, tail=size)
        assert stream(str(path)) == reference(data), size


@pytest.mark.parametrize(
    "data",
    [
        b'{"traceEvents": [{"ph": "X"}, {"ph": "X", "name": "unterminated}]}',
        b'{"traceEvents": [{"ph": "X"}, {"ph": "X"}',
        b'{"traceEvents": [{"ph": "X"} {"ph": "X"}]}',
        b'{"traceEvents": [{"ph": "X", "ts": "not a number"}, {"ph": "X"}]}',
    ],
)
def test_malformed_input_is_a_user_error(data: bytes, chunks, tmp_path) -> None:
    from overlapcheck.errors import UserError

    path = tmp_path / "bad.json"
    path.write_bytes(data)
    for size in (5, 16, 4096):
        chunks(size)
        with pytest.raises(UserError):
            stream(str(path), EVENTS_DECODER)


def test_shape_fields_stay_raw_until_a_nccl_op_reads_them() -> None:
    """`Input Dims` / `Input type` are on every op of a record_shapes trace and read only on `nccl:*` ops: decoded
    eagerly as lists they took half of the decoding time (docs/performance.md, round 4)."""
    run = b'[{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1, "dur": 2, "args": {"Input Dims": [[4, 8], [8, 2]], "Input type": ["float", "float"]}}]'
    (event,) = EVENTS_DECODER.decode(run)
    assert event.args is not None
    assert isinstance(event.args.input_dims, msgspec.Raw) and isinstance(event.args.input_type, msgspec.Raw)
    assert msgspec.json.decode(event.args.input_dims) == [[4, 8], [8, 2]]


def test_a_lone_surrogate_escape_is_read_as_the_replacement_character_with_a_note(tmp_path) -> None:
    """`"\\ud800"` is valid JSON (Python's json.dump writes it for a lone surrogate) but no Unicode character:
    msgspec refuses the whole run ("truncated"). The trace is read, each lone escape as U+FFFD, with a note; a
    surrogate pair and an escaped backslash before `ud800` stay what they are."""
    events = [
        {"ph": "X", "cat": "kernel", "name": "k\ud800x", "pid": 0, "tid": 7, "ts": 1, "dur": 2},
        {"ph": "X", "cat": "cpu_op", "name": "pair \ud83d\ude00, low \udc00, text \\ud800", "ts": 1, "dur": 2},
    ]
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps({"traceEvents": events}))
    with pytest.raises(msgspec.DecodeError):
        EVENTS_DECODER.decode(json.dumps(events).encode())
    ts = TraceStream(str(path), EVENTS_DECODER)
    names = [e.name for batch in ts.batches() for e in batch]
    assert names == ["k\ufffdx", "pair \U0001f600, low \ufffd, text \\ud800"]
    assert ts.notes == ["2 lone UTF-16 surrogate escapes in strings (no Unicode character) were read as U+FFFD"]
