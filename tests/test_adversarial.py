"""The adversarial corpus: crafted trace inputs, built here by a generator, each read by the reader and by
`overlapcheck analyze`. Nothing may raise a traceback or hang: a file is either read (its doubtful values said
in the rank's `notes`) or refused with one line on stderr and exit code 2, the other ranks still reported.

Families: integers beyond 64 bits in every numeric field, nesting 10^5 deep, negative / huge / infinite
times, duplicate `traceEvents` keys and duplicated events, a second GPU's activity, bad ranks, truncated and corrupt gzip, whitespace and bracket runs,
FIFOs, devices, broken links and loops, wrong field types, malformed JSON.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import builders
import pytest
from click.testing import CliRunner

import overlapcheck
from overlapcheck.cli import main
from overlapcheck.errors import UserError
from overlapcheck.trace import jsonstream
from overlapcheck.trace.reader import load_trace

GEMM = "volta_sgemm_128x64_nn"
NCCL = "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
BIG = (2**63, 2**64, -(2**63) - 1, 10**30)  # each overflows an int64 column
DEEP = 100_000
SMALL_CHUNK = 64 << 10  # the stream's limits, scaled down so that the size families stay fast
SMALL_LIMIT = 1 << 20


# ---- building blocks -----------------------------------------------------------------------------------


def kernel(name: str = GEMM, ts: float = 10, dur: float = 40, stream: Any = 7, **args: Any) -> dict[str, Any]:
    """builders.kernel with this corpus's defaults (and any value for the stream, hostile ones included)."""
    return builders.kernel(name, ts, dur, stream, corr=1, **args)


def good_events() -> list[dict[str, Any]]:
    return [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#5", "pid": 100, "tid": 100, "ts": 0, "dur": 100},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 100, "tid": 100, "ts": 1, "dur": 2,
         "args": {"correlation": 1}},
        {"ph": "s", "cat": "ac2g", "id": 1, "pid": 100, "tid": 100, "ts": 1},
        kernel(GEMM, 10, 40),
        kernel(NCCL, 30, 40, stream=20, **{"In msg nelems": 1024, "dtype": "BFloat16", "Group size": 2}),
        {"ph": "X", "cat": "cuda_sync", "name": "Stream Wait Event", "pid": 0, "tid": 7, "ts": 60, "dur": 1,
         "args": {"stream": 7, "wait_on_stream": 20, "correlation": 3}},
        {"ph": "M", "name": "thread_name", "pid": 100, "tid": 100, "args": {"name": "python"}},
    ]  # fmt: skip


def doc_bytes(events: list[Any] | None = None, rank: Any = 0, world: Any = 2, **top: Any) -> bytes:
    doc: dict[str, Any] = {"schemaVersion": 1, **top}
    if rank is not None:
        doc["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": world}
    doc["traceEvents"] = good_events() if events is None else events
    return json.dumps(doc).encode()


def nested(depth: int, open_: bytes = b"[", close: bytes = b"]") -> bytes:
    return open_ * depth + close * depth


def gz_repeat(parts: list[tuple[bytes, int]]) -> bytes:
    """gzip of the concatenation of `piece * times`, without building the uncompressed bytes."""
    c = zlib.compressobj(6, zlib.DEFLATED, 31)
    out = []
    for piece, times in parts:
        block = piece * max(1, min(times, (1 << 20) // len(piece)))
        left = times * len(piece)
        while left > 0:
            take = block[: min(len(block), left)]
            out.append(c.compress(take))
            left -= len(take)
    out.append(c.flush())
    return b"".join(out)


@dataclass
class Case:
    """One crafted input. `make(folder)` writes it and returns the path to analyze.

    expect: "ok" (read, exit 0), "error" (refused: exit 2, one line naming the file), "either".
    note / message: a substring of the rank's notes (when read) / of the error line (when refused).
    """

    id: str
    make: Callable[[Path], Path]
    expect: str = "either"
    note: str | None = None
    message: str | None = None
    small_limits: bool = False  # run with SMALL_CHUNK / SMALL_LIMIT (the size families)


def file_case(id: str, data: bytes, name: str = "rank0.json", **kw: Any) -> Case:
    def make(folder: Path) -> Path:
        path = folder / name
        path.write_bytes(data)
        return path

    return Case(id, make, **kw)


# ---- the generator -------------------------------------------------------------------------------------


def _overflow_cases() -> Iterator[Case]:
    note = "out of range"
    for value in BIG:
        v = f"{value:+d}".replace("+", "p").replace("-", "m")[:8]
        fields: dict[str, list[dict[str, Any]]] = {
            "kernel.correlation": [kernel(correlation=value)],
            "kernel.stream": [kernel(stream=value)],
            "kernel.device": [kernel(device=value)],
            "kernel.bytes": [kernel(NCCL, bytes=value)],
            "kernel.in_nelems": [kernel(NCCL, **{"In msg nelems": value})],
            "kernel.in_size": [kernel(NCCL, **{"In msg size": value})],
            "runtime.correlation": [
                {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 1, "dur": 1,
                 "args": {"correlation": value}},
            ],
            "sync.wait_on_stream": [
                {"ph": "X", "cat": "cuda_sync", "name": "Stream Wait Event", "pid": 0, "tid": 7, "ts": 1, "dur": 1,
                 "args": {"stream": 7, "wait_on_stream": value}},
            ],
            "sync.stream": [
                {"ph": "X", "cat": "cuda_sync", "name": "Stream Sync", "pid": 0, "tid": 7, "ts": 1, "dur": 1,
                 "args": {"stream": value}},
            ],
            "flow.id": [{"ph": "s", "cat": "ac2g", "id": value, "pid": 1, "tid": 1, "ts": 1}],
        }  # fmt: skip
        for field, extra in fields.items():
            yield file_case(f"overflow-{field}-{v}", doc_bytes(good_events() + extra), expect="ok", note=note)
        # pid / tid are thread keys (never columns): read as they are
        thread = {**kernel(), "pid": value, "tid": value}
        yield file_case(f"overflow-pid-tid-{v}", doc_bytes(good_events() + [thread]), expect="ok")
    for digits in (20, 400, 5000):
        big = "9" * digits
        strings: dict[str, list[dict[str, Any]]] = {
            "device-str": [kernel(device=f"cuda:{big}")],
            "stream-str": [kernel(stream=f"stream {big}")],
            "tid-str": [{**kernel(), "tid": f"stream {big}", "args": {"correlation": 1}}],
            "flow-id-str": [{"ph": "s", "cat": "ac2g", "id": f"id{big}", "pid": 1, "tid": 1, "ts": 1}],
        }
        for field, extra in strings.items():
            yield file_case(f"overflow-{field}-{digits}", doc_bytes(good_events() + extra), expect="ok", note=note)
        step = {
            "ph": "X",
            "cat": "user_annotation",
            "name": f"ProfilerStep#{big}",
            "pid": 1,
            "tid": 1,
            "ts": 0,
            "dur": 9,
        }
        yield file_case(f"overflow-step-{digits}", doc_bytes(good_events() + [step]), expect="ok", note="ProfilerStep")
    for digits in (400, 5000):  # an integer literal that long in a typed field
        text = doc_bytes().replace(b'"correlation": 1}', b'"correlation": ' + b"9" * digits + b"}", 1)
        yield file_case(f"overflow-literal-{digits}", text, expect="either")


def _nesting_cases() -> Iterator[Case]:
    deep_list, deep_obj = nested(DEEP), b'{"a":' * DEEP + b"1" + b"}" * DEEP
    ev = b'{"ph":"X","cat":"kernel","name":"k","ts":1,"dur":1,"pid":0,"tid":7'
    places = {
        "args-list": ev + b',"args":{"x":' + deep_list + b"}}",
        "args-object": ev + b',"args":{"x":' + deep_obj + b"}}",
        "event-field": ev + b',"unknown":' + deep_list + b"}",
        "args-itself": ev + b',"args":' + deep_list + b"}",
    }
    for where, event in places.items():
        yield file_case(f"deep-{where}", b'{"traceEvents": [' + event + b"]}", expect="error", message="deep")
    yield file_case("deep-event-array", b'{"traceEvents": [' + deep_list + b"]}", expect="error")
    yield file_case("deep-bare-list", b"[" + deep_list + b"]", expect="error")
    good = doc_bytes()[1:]  # without its opening brace
    yield file_case("deep-metadata-before", b'{"deviceProperties": ' + deep_list + b", " + good, expect="error")
    yield file_case("deep-metadata-after", doc_bytes()[:-1] + b', "extra": ' + deep_obj + b"}", expect="error")
    info = b'{"distributedInfo": {"rank": 0, "x": ' + deep_list + b'}, "traceEvents": []}'
    yield file_case("deep-distributed-info", info, expect="error")
    shallow = b'{"traceEvents": [' + ev + b',"args":{"x":' + nested(200) + b"}}]}"
    yield file_case("nested-200-in-args", shallow, expect="ok")
    yield file_case("nested-200-metadata", doc_bytes()[:-1] + b', "extra": ' + nested(200) + b"}", expect="ok")


def _time_cases() -> Iterator[Case]:
    variants: dict[str, tuple[dict[str, Any], str, str | None]] = {
        "negative-dur": ({"dur": -5}, "ok", "negative duration"),
        "huge-negative-dur": ({"dur": -1e308}, "ok", "negative duration"),
        "infinite-end": ({"ts": 1e308, "dur": 1.7e308}, "ok", "infinite or NaN"),
        "huge-ts": ({"ts": 1e308, "dur": 1}, "ok", "beyond 2^62 µs"),
        "huge-dur": ({"dur": 1e308}, "ok", "beyond 2^62 µs"),  # was: read, its end at 1e308 µs
        "ts-1e30": ({"ts": 1e30}, "ok", "beyond 2^62 µs"),  # was: read, a float step of 1.4e14 µs
        "negative-ts": ({"ts": -1e15, "dur": 5}, "ok", None),
        "zero-dur": ({"dur": 0}, "ok", None),
        "ts-1e999": ({"ts": "__1e999__"}, "error", "out of range"),
        "dur-minus-1e999": ({"dur": "__-1e999__"}, "error", "out of range"),
        "no-ts": ({"ts": None}, "ok", None),
        "no-dur": ({"dur": None}, "ok", None),
    }
    for name, (change, expect, text) in variants.items():
        events = good_events()
        events.append({**kernel(), **change})
        data = doc_bytes(events).replace(b'"__', b"").replace(b'__"', b"")
        yield file_case(f"time-{name}", data, expect=expect, note=text if expect == "ok" else None,
                        message=text if expect == "error" else None)  # fmt: skip
    step = {
        "ph": "X",
        "cat": "user_annotation",
        "name": "ProfilerStep#9",
        "pid": 1,
        "tid": 1,
        "ts": 1e308,
        "dur": 1e308,
    }
    yield file_case("time-infinite-step", doc_bytes(good_events() + [step]), expect="ok", note="infinite or NaN")
    # was: OverflowError (fsum of the exposed times, hideability)
    wild = [kernel(NCCL, 100 + i, 1e308, stream=20, **{"In msg nelems": 1024, "dtype": "BFloat16"}) for i in (0, 1)]
    yield file_case("time-huge-dur-collectives", doc_bytes(good_events() + wild), expect="ok", note="beyond 2^62 µs")


def _duplicate_cases() -> Iterator[Case]:
    ev = json.dumps(kernel()).encode()
    dup = "second traceEvents"
    yield file_case(
        "dup-two-arrays", b'{"traceEvents": [' + ev + b'], "traceEvents": [' + ev + b"]}", expect="ok", note=dup
    )
    yield file_case("dup-scalar-first", b'{"traceEvents": 5, "traceEvents": [' + ev + b"]}", expect="ok", note=dup)
    yield file_case("dup-empty-second", b'{"traceEvents": [' + ev + b'], "traceEvents": []}', expect="ok", note=dup)
    yield file_case("dup-nested-key", b'{"x": {"traceEvents": [1]}, "traceEvents": [' + ev + b"]}", expect="ok")
    yield file_case("key-in-a-string", b'{"x": "\\"traceEvents\\": [", "traceEvents": [' + ev + b"]}", expect="ok")
    # was: every count, byte and transfer time doubled, without a word
    twice = good_events() + [e for e in good_events() if e["ph"] != "M"]
    yield file_case("dup-every-event", doc_bytes(twice), expect="ok", note="exact copies of earlier ones")
    yield file_case("dup-kernel", doc_bytes(good_events() + [kernel()]), expect="ok", note="1 GPU activity")
    yield file_case("events-an-object", b'{"traceEvents": {"a": 1}}', expect="error", message="not a trace")
    yield file_case("events-a-string", b'{"traceEvents": "[]"}', expect="error", message="not a trace")


def _device_cases() -> Iterator[Case]:
    # was: a second GPU's compute was read as the rank's own and hid its communication, without a word
    other = dict(kernel(GEMM, 30, 40, device=1), pid=1)
    note = "GPU activity on 2 devices (0, 1)"
    yield file_case("device-second-gpu-compute", doc_bytes(good_events() + [other]), expect="ok", note=note)
    cuda1 = dict(kernel(GEMM, 30, 40, device="cuda:1"), pid=1)
    yield file_case("device-second-gpu-string", doc_bytes(good_events() + [cuda1]), expect="ok", note=note)
    unknown = dict(kernel(GEMM, 30, 40, device=None), pid=1)
    yield file_case("device-unknown", doc_bytes(good_events() + [unknown]), expect="ok")


def _rank_cases() -> Iterator[Case]:
    bad = {
        "minus-one": -1,
        "int64-max-plus": 2**63,
        "huge": 10**30,
        "word": "abc",
        "bool": True,
        "digits-5000": "9" * 5000,
        "unicode-digit": "\u0663",
        "float": 1.5,
        "null": None,
        "object": {"a": 1},
    }
    for name, rank in bad.items():
        data = doc_bytes(rank=0)
        data = data.replace(b'"rank": 0', b'"rank": ' + json.dumps(rank).encode(), 1)
        yield file_case(f"rank-{name}", data, name="rank3.json", expect="ok", note="not a rank number")
    yield file_case("rank-equals-world", doc_bytes(rank=2, world=2), expect="ok", note="not below its world_size")
    yield file_case("rank-above-world", doc_bytes(rank=70, world=8), expect="ok", note="not below its world_size")
    for world in (0, -1, "x", 2**70, True, 1.5, None, [8]):  # each was taken silently (a world size of -1, True)
        yield file_case(f"world-{str(world)[:6]}", doc_bytes(rank=0, world=world), expect="ok", note="not a world size")
    yield file_case("rank-in-name-huge", doc_bytes(rank=None), name=f"rank{'9' * 200}.json", expect="ok")
    yield file_case("distributed-info-a-list", doc_bytes(rank=None, distributedInfo=[1, 2]), expect="ok")


def _gzip_cases() -> Iterator[Case]:
    gz = gzip.compress(doc_bytes())
    for cut in (2, 10, len(gz) // 2, len(gz) - 8, len(gz) - 1):
        yield file_case(f"gzip-cut-{cut}", gz[:cut], name="rank0.json.gz", expect="error")
    flipped = bytearray(gz)
    flipped[len(gz) // 2] ^= 0xFF
    yield file_case("gzip-flipped-byte", bytes(flipped), name="rank0.json.gz", expect="error")
    yield file_case("gzip-of-gzip", gzip.compress(gz), name="rank0.json.gz", expect="error", message="not a trace")
    yield file_case("gzip-empty", gzip.compress(b""), name="rank0.json.gz", expect="error", message="empty")
    yield file_case("gzip-two-members", gz + gzip.compress(b" "), name="rank0.json.gz", expect="ok")
    yield file_case("gzip-trailing-garbage", gz + b"garbage!", name="rank0.json.gz", expect="either")
    yield file_case("gzip-magic-only", b"\x1f\x8b", name="rank0.json.gz", expect="error")
    import bz2
    import lzma

    # was: "malformed or truncated JSON" for a .json.gz that is another compression
    for kind, data in (("bzip2", bz2.compress(doc_bytes())), ("xz", lzma.compress(doc_bytes())),
                       ("zstd", b"\x28\xb5\x2f\xfd" + bytes(20)), ("zip", b"PK\x03\x04" + bytes(20))):  # fmt: skip
        yield file_case(f"{kind}-named-gz", data, name="rank0.json.gz", expect="error", message=f"a {kind} file")


def _size_cases() -> Iterator[Case]:
    ev = json.dumps(kernel()).encode()
    many = 3 * SMALL_LIMIT
    yield file_case("ws-between-events", b'{"traceEvents": [' + ev + b"," + b" " * many + ev + b"]}", expect="ok",
                    small_limits=True)  # fmt: skip
    yield file_case("newlines-between-events", b'{"traceEvents": [' + ev + b",\n" + b"\n\t" * many + ev + b"]}",
                    expect="ok", small_limits=True)  # fmt: skip
    yield file_case("ws-inside-event", b'{"traceEvents": [{"ph": "X",' + b" " * many + b'"ts": 1}]}', expect="error",
                    message="no complete event", small_limits=True)  # fmt: skip
    yield file_case("ws-before-document", b" " * many + doc_bytes(), expect="error", message="first",
                    small_limits=True)  # fmt: skip
    yield file_case("ws-before-key", b"{" + b" " * (SMALL_LIMIT // 2) + doc_bytes()[1:], expect="ok", small_limits=True)
    yield file_case("ws-after-document", doc_bytes() + b" " * many, expect="error", message="after the event array",
                    small_limits=True)  # fmt: skip
    yield file_case("gzip-brackets", gz_repeat([(b"[", 4 * SMALL_LIMIT)]), name="rank0.json.gz", expect="error",
                    message="no complete event", small_limits=True)  # fmt: skip
    yield file_case("gzip-object-then-brackets", gz_repeat([(b'{"traceEvents": ', 1), (b"[", 4 * SMALL_LIMIT)]),
                    name="rank0.json.gz", expect="error", message="no complete event", small_limits=True)  # fmt: skip
    yield file_case("braces-header", b"{" * many, expect="error", small_limits=True)
    yield file_case("long-string-event", b'{"traceEvents": [{"name": "' + b"x" * many + b'"}]}', expect="error",
                    small_limits=True)  # fmt: skip
    yield file_case("escaped-quotes-run", b'{"traceEvents": [{"name": "' + b'\\"' * many + b'"}]}', expect="error",
                    small_limits=True)  # fmt: skip
    yield file_case("backslash-run", b'{"traceEvents": [{"name": "' + b"\\\\" * 5000 + b'"}, ' + ev + b"]}",
                    expect="ok", small_limits=True)  # fmt: skip
    events = [kernel(ts=i, dur=1) for i in range(3000)]
    yield file_case("many-events-small-chunks", doc_bytes(events), expect="ok", small_limits=True)
    yield file_case("big-string-name", doc_bytes(good_events() + [kernel(name="k" * 200_000)]), expect="ok")


def _special_file_cases() -> Iterator[Case]:
    def fifo(folder: Path) -> Path:
        os.mkfifo(folder / "rank0.json")
        return folder / "rank0.json"

    def fifo_in_folder(folder: Path) -> Path:
        (folder / "rank1.json").write_bytes(doc_bytes(rank=1))
        os.mkfifo(folder / "rank0.trace.json.gz")
        return folder

    def link(target: str | Path, name: str = "rank0.json") -> Callable[[Path], Path]:
        def make(folder: Path) -> Path:
            (folder / name).symlink_to(target if not isinstance(target, Path) else folder / target)
            return folder / name

        return make

    def loop(folder: Path) -> Path:
        (folder / "rank0.json").symlink_to(folder / "rank1.json")
        (folder / "rank1.json").symlink_to(folder / "rank0.json")
        return folder / "rank0.json"

    def good_link(folder: Path) -> Path:
        (folder / "real.json").write_bytes(doc_bytes())
        (folder / "rank0.json").symlink_to(folder / "real.json")
        return folder / "rank0.json"

    def broken_in_folder(folder: Path) -> Path:
        (folder / "rank1.json").write_bytes(doc_bytes(rank=1))
        (folder / "rank0.json").symlink_to(folder / "gone.json")
        return folder

    def dev_in_folder(folder: Path) -> Path:
        (folder / "rank1.json").write_bytes(doc_bytes(rank=1))
        (folder / "rank0.json").symlink_to("/dev/zero")
        return folder

    def folder_link(folder: Path) -> Path:
        (folder / "real").mkdir()
        (folder / "real" / "rank0.json").write_bytes(doc_bytes())
        (folder / "traces").symlink_to(folder / "real")
        return folder / "traces"

    yield Case("fifo-as-path", fifo, expect="error")
    yield Case("fifo-in-folder", fifo_in_folder, expect="error", message="FIFO")
    yield Case("dev-zero-as-path", lambda folder: Path("/dev/zero"), expect="error")
    yield Case("link-broken", link(Path("gone.json")), expect="error")
    yield Case("link-loop", loop, expect="error")
    yield Case("link-to-dev-zero", link("/dev/zero"), expect="error")
    yield Case("link-to-good-trace", good_link, expect="ok")
    yield Case("link-broken-in-folder", broken_in_folder, expect="error", message="broken symbolic link")
    yield Case("link-to-dev-in-folder", dev_in_folder, expect="error", message="character device")
    yield Case("link-to-a-folder", folder_link, expect="ok")


def _malformed_cases() -> Iterator[Case]:
    ev = json.dumps(kernel()).encode()
    data = {
        "empty": (b"", "error"),
        "blank": (b" \n\t ", "error"),
        "null": (b"null", "error"),
        "number": (b"42", "error"),
        "empty-object": (b"{}", "error"),
        "empty-bare-list": (b"[]", "ok"),
        "empty-events": (b'{"traceEvents": []}', "ok"),
        "bom": (b"\xef\xbb\xbf" + doc_bytes(), "ok"),
        "utf16": (doc_bytes().decode().encode("utf-16"), "error"),
        "nul-bytes": (b"\0" * 100, "error"),
        "bad-utf8-in-name": (doc_bytes(good_events() + [kernel(name="__X__")]).replace(b"__X__", b"\xff\xfe"), "error"),
        "events-not-objects": (b'{"traceEvents": [1, 2, 3]}', "error"),
        "event-null": (b'{"traceEvents": [null]}', "error"),
        "missing-comma": (b'{"traceEvents": [' + ev + ev + b"]}", "error"),
        "double-comma": (b'{"traceEvents": [' + ev + b",," + ev + b"]}", "error"),
        "trailing-comma": (b'{"traceEvents": [' + ev + b",]}", "either"),
        "garbage-after": (doc_bytes() + b" trailing garbage", "error"),
        "unclosed-object": (doc_bytes()[:-1], "error"),
        "unclosed-array": (b'{"traceEvents": [' + ev, "error"),
        "unclosed-string": (b'{"traceEvents": [{"name": "abc', "error"),
        "closing-too-many": (b'{"traceEvents": [' + ev + b"]]]}", "error"),
        "key-without-array": (b'{"traceEvents": ', "error"),
        "bare-list-garbage": (b"[" + ev + b"] tail", "either"),
        "escaped-in-strings": (doc_bytes(good_events() + [kernel(name='a\\"b}{][')]), "ok"),
    }
    for name, (content, expect) in data.items():
        yield file_case(f"malformed-{name}", content, expect=expect)
    types = {
        "ph-number": {"ph": 5},
        "ph-list": {"ph": []},
        "name-list": {"name": ["x"]},
        "ts-string": {"ts": "1"},
        "dur-object": {"dur": {}},
        "args-list": {"args": [1]},
        "args-string": {"args": "x"},
        "cat-number": {"cat": 7},
        "pid-object": {"pid": {}},
        "tid-list": {"tid": [1]},
        "id-float": {"ph": "s", "cat": "ac2g", "id": 1.5},
        "correlation-string": {"args": {"correlation": "7"}},
        "stream-float": {"args": {"stream": 1.5}},
        "collective-number": {"args": {"Collective name": 5}},
        "bool-ts": {"ts": True},
    }
    for name, change in types.items():
        yield file_case(f"type-{name}", doc_bytes(good_events() + [{**kernel(), **change}]), expect="either")


def adversarial_cases() -> list[Case]:
    """The whole corpus (built lazily by each case's `make`)."""
    families = (_overflow_cases, _nesting_cases, _time_cases, _duplicate_cases, _device_cases, _rank_cases,
                _gzip_cases, _size_cases, _special_file_cases, _malformed_cases)  # fmt: skip
    return [case for family in families for case in family()]


CASES = adversarial_cases()


def test_the_corpus_is_large_and_its_ids_unique():
    ids = [c.id for c in CASES]
    assert len(ids) >= 100 and len(set(ids)) == len(ids)


# ---- running it ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cli_works(tmp_path_factory: pytest.TempPathFactory) -> bool:
    """Whether `analyze` runs at all on a good trace (the report layers may be mid-refactor)."""
    path = tmp_path_factory.mktemp("good") / "rank0.json"
    path.write_bytes(doc_bytes())
    result = CliRunner().invoke(main, ["analyze", str(path), "--format", "json", "-j", "1"])
    return result.exit_code == 0


def analyze(path: Path, *extra: str) -> tuple[int, str, str, BaseException | None]:
    result = CliRunner().invoke(main, ["analyze", str(path), "--format", "json", "-j", "1", *extra])
    exc = result.exception if not isinstance(result.exception, SystemExit) else None
    return result.exit_code, result.stdout, result.stderr, exc


def _notes(stdout: str) -> list[str]:
    report = json.loads(stdout)
    return [note for rank in report["ranks"] for note in rank.get("notes", [])]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_adversarial_input(case: Case, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli_works: bool):
    if case.small_limits:
        for name, value in (("CHUNK", SMALL_CHUNK), ("TAIL", SMALL_CHUNK // 4), ("MAX_EVENT", SMALL_LIMIT),
                            ("MAX_METADATA", SMALL_LIMIT)):  # fmt: skip
            monkeypatch.setattr(jsonstream, name, value)
    path = case.make(tmp_path)

    # the reader alone: a model, or a UserError naming the file
    files = sorted(p for p in path.iterdir() if not p.is_dir()) if path.is_dir() else [path]
    read_notes: list[str] = []
    refused: list[str] = []
    for f in files:
        try:
            read_notes += load_trace(str(f)).notes
        except UserError as exc:
            assert "\n" not in str(exc) and str(f) in str(exc), str(exc)
            refused.append(str(exc))
    if case.expect == "ok":
        assert not refused, refused
        if case.note:
            assert any(case.note in n for n in read_notes), read_notes
    elif case.expect == "error":
        assert refused, read_notes
        if case.message:
            assert any(case.message in r for r in refused), refused

    if not cli_works:
        pytest.skip("`overlapcheck analyze` does not run on a good trace right now: only the reader was checked")
    code, stdout, stderr, exc = analyze(path)
    assert exc is None, f"{type(exc).__name__}: {exc}"
    assert "Traceback" not in stdout + stderr
    errors = [line for line in stderr.splitlines() if line.startswith("overlapcheck: error:")]
    if case.expect == "ok":
        assert code == 0 and not errors, stderr
        if case.note:
            assert any(case.note in n for n in _notes(stdout)), _notes(stdout)
    elif case.expect == "error":
        assert code == 2, stderr
        assert len(errors) == 1, stderr
        if case.message:
            assert case.message in errors[0], errors[0]
    else:
        assert code in (0, 2) and (code == 0) == (not errors), (code, stderr)
        if code == 2:
            assert len(errors) == 1, stderr


def test_one_bad_file_of_each_kind_and_the_good_ranks_are_still_reported(tmp_path: Path, cli_works: bool):
    """A run folder where rank 0 is good, rank 1 is read with a note, and every other file is refused."""
    (tmp_path / "rank0.json").write_bytes(doc_bytes(rank=0, world=8))
    (tmp_path / "rank1.json").write_bytes(doc_bytes(good_events() + [kernel(correlation=2**64)], rank=1, world=8))
    (tmp_path / "rank2.json.gz").write_bytes(gzip.compress(doc_bytes(rank=2, world=8))[:-20])
    (tmp_path / "rank3.json").write_bytes(b'{"traceEvents": [' + nested(DEEP) + b"]}")
    os.mkfifo(tmp_path / "rank4.json")
    (tmp_path / "rank5.json").symlink_to(tmp_path / "gone.json")
    (tmp_path / "rank6.json").symlink_to("/dev/zero")
    (tmp_path / "rank7.json").write_bytes(b"[" * 1000)
    (tmp_path / ".rank1.host.123.tmp.gz").write_bytes(b"a killed export: never read")
    if not cli_works:
        pytest.skip("`overlapcheck analyze` does not run on a good trace right now")
    for jobs in ("1", "2"):
        result = CliRunner().invoke(main, ["analyze", str(tmp_path), "--format", "json", "-j", jobs])
        assert result.exit_code == 2 and "Traceback" not in result.output
        report = json.loads(result.stdout)
        assert [r["rank"] for r in report["ranks"]] == [0, 1]
        assert any("out of range" in n for n in report["ranks"][1]["notes"])
        errors = [line for line in result.stderr.splitlines() if line.startswith("overlapcheck: error:")]
        named = sorted(os.path.basename(e.split(": ")[2]) for e in errors)
        assert named == ["rank2.json.gz", "rank3.json", "rank4.json", "rank5.json", "rank6.json", "rank7.json"], errors


def test_outputs_race_and_links(tmp_path: Path, cli_works: bool):
    """`-o` is never clobbered without --force, never replaces a symlink, and a bad target is one line."""
    if not cli_works:
        pytest.skip("`overlapcheck analyze` does not run on a good trace right now")
    trace = tmp_path / "rank0.json"
    trace.write_bytes(doc_bytes())
    out = tmp_path / "report.json"
    code, _, stderr, exc = analyze(trace, "-o", str(out))
    assert code == 0 and exc is None and out.exists()
    first = out.read_bytes()
    code, _, stderr, exc = analyze(trace, "-o", str(out))
    assert code == 2 and exc is None and "already exists" in stderr and out.read_bytes() == first
    real = tmp_path / "real.json"
    real.write_text("keep")
    link = tmp_path / "latest.json"
    link.symlink_to(real)
    code, _, stderr, exc = analyze(trace, "-o", str(link))
    assert code == 2 and exc is None and "symbolic link" in stderr and real.read_text() == "keep"
    code, _, stderr, exc = analyze(trace, "-o", str(link), "--force")
    assert code == 0 and link.is_symlink() and json.loads(real.read_text())["schema"].startswith("overlapcheck.report")
    (tmp_path / "dangling.json").symlink_to(tmp_path / "nowhere.json")
    code, _, stderr, exc = analyze(trace, "-o", str(tmp_path / "dangling.json"), "--force")
    assert code == 2 and exc is None and "does not exist" in stderr and not (tmp_path / "nowhere.json").exists()
    leftovers = [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]
    assert leftovers == []


def test_the_parallel_reader_notes_the_same_values(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Values kept out by worker processes are counted there and noted once, as the plain reader notes them."""
    from overlapcheck.trace.fastpath import load_parallel

    events = []
    for i in range(400):
        events.append(kernel(ts=i * 100, dur=-1 if i % 50 == 0 else 10, correlation=2**64 if i % 7 == 0 else i))
    events.append({**kernel(), "ts": 1e308, "dur": 1.7e308})
    path = tmp_path / "rank0.json"
    path.write_bytes(doc_bytes(events))
    monkeypatch.setattr(jsonstream, "CHUNK", 4096)
    monkeypatch.setattr(jsonstream, "TAIL", 1024)
    plain, parallel = load_trace(str(path)), load_parallel(str(path), workers=2)
    assert plain.notes == parallel.notes
    assert any("gpu.correlation (58)" in n for n in plain.notes), plain.notes
    assert any("8 events with a negative duration" in n for n in plain.notes), plain.notes
    assert any("1 events with an infinite" in n for n in plain.notes), plain.notes
    assert len(plain.gpu) == len(parallel.gpu) == 400


# ---- round 3: no output replaces an input -----------------------------------------------------------------


def cli(*args: str) -> tuple[int, str, str]:
    """`overlapcheck ARGS...` in this process: exit code, stdout, stderr; never a traceback."""
    result = CliRunner().invoke(main, list(args))
    exc = result.exception if not isinstance(result.exception, SystemExit) else None
    assert exc is None, f"{type(exc).__name__}: {exc}"
    assert "Traceback" not in result.stdout + result.stderr
    return result.exit_code, result.stdout, result.stderr


def job_folder(folder: Path, world: int = 2, config: dict[str, Any] | None = None) -> Path:
    """A folder of `world` tiny rank traces (and a ds_config.json when given)."""
    folder.mkdir(parents=True, exist_ok=True)
    for r in range(world):
        (folder / f"rank{r}.json").write_bytes(doc_bytes(rank=r, world=world))
    if config is not None:
        (folder / "ds_config.json").write_text(json.dumps(config))
    return folder


def _refused_as_input(code: int, stderr: str) -> None:
    errors = [line for line in stderr.splitlines() if line.startswith("overlapcheck: error:")]
    assert code == 2 and len(errors) == 1 and "is also an input" in errors[0], stderr


@pytest.mark.parametrize("option", ["-o", "--html", "--perfetto"])
@pytest.mark.parametrize("victim", ["rank0.json", "ds_config.json", "--ds-config", "the-file-given", "hard-link"])
@pytest.mark.parametrize("force", [False, True])
def test_analyze_never_writes_over_an_input(tmp_path: Path, option: str, victim: str, force: bool) -> None:
    folder = job_folder(tmp_path / "job", config={"zero_optimization": {"stage": 3}})
    given = tmp_path / "given.json"
    given.write_text(json.dumps({"zero_optimization": {"stage": 3}}))
    args = ["analyze", str(folder), "--format", "json", "-j", "1"]
    target = folder / victim
    if victim == "--ds-config":
        args += ["--ds-config", str(given)]
        target = given
    elif victim == "the-file-given":
        args = ["analyze", str(folder / "rank1.json"), "--format", "json", "-j", "1"]
        target = folder / "rank1.json"
    elif victim == "hard-link":
        os.link(folder / "rank1.json", tmp_path / "alias.json")
        target = tmp_path / "alias.json"
    before = {p: p.read_bytes() for p in (folder / "rank0.json", folder / "rank1.json", folder / "ds_config.json")}
    code, _, stderr = cli(*args, option, str(target), *(["--force"] if force else []))
    _refused_as_input(code, stderr)
    assert {p: p.read_bytes() for p in before} == before and given.read_text().startswith("{")


@pytest.mark.parametrize("option", ["-o", "--html", "--perfetto"])
def test_report_never_writes_over_a_summary_run_json_or_trace(tmp_path: Path, option: str) -> None:
    run = tmp_path / "run"
    traces = job_folder(run / "traces")
    (run / "run.json").write_text(json.dumps({"ranks": []}))
    for victim in (run / "run.json", traces / "rank0.json"):
        before = victim.read_bytes()
        code, _, stderr = cli("report", str(run), "--format", "json", "-j", "1", option, str(victim), "--force")
        _refused_as_input(code, stderr)
        assert victim.read_bytes() == before


@pytest.mark.parametrize("option", ["-o", "--html", "--json", "--markdown"])
@pytest.mark.parametrize("side", [0, 1])
def test_compare_never_writes_over_a_file_inside_a_side(tmp_path: Path, option: str, side: int) -> None:
    sides = [job_folder(tmp_path / "a"), job_folder(tmp_path / "b")]
    victim = sides[side] / "rank0.json"
    before = victim.read_bytes()
    code, _, stderr = cli("compare", str(sides[0]), str(sides[1]), option, str(victim), "--force")
    _refused_as_input(code, stderr)
    assert victim.read_bytes() == before


@pytest.mark.parametrize("option", ["--junit", "--markdown"])
@pytest.mark.parametrize("victim", ["report", "baseline", "symlink"])
def test_gate_never_writes_over_its_report_or_baseline(tmp_path: Path, option: str, victim: str) -> None:
    code, _, _ = cli("analyze", str(job_folder(tmp_path / "job")), "--format", "json", "-j", "1", "-o",
                     str(tmp_path / "r.json"))  # fmt: skip
    assert code == 0
    (tmp_path / "base.json").write_bytes((tmp_path / "r.json").read_bytes())
    (tmp_path / "link.xml").symlink_to(tmp_path / "base.json")
    target = {"report": "r.json", "baseline": "base.json", "symlink": "link.xml"}[victim]
    before = (tmp_path / "base.json").read_bytes(), (tmp_path / "r.json").read_bytes()
    args = ["gate", str(tmp_path / "r.json"), "--baseline", str(tmp_path / "base.json")]
    code, _, stderr = cli(*args, option, str(tmp_path / target), "--force")
    _refused_as_input(code, stderr)
    assert ((tmp_path / "base.json").read_bytes(), (tmp_path / "r.json").read_bytes()) == before
    code, _, stderr = cli("baseline", "save", str(tmp_path / "r.json"), str(tmp_path / "r.json"), "--force")
    _refused_as_input(code, stderr)


@pytest.mark.parametrize("spelling", ["same", "dot", "link"])
def test_gate_refuses_a_baseline_that_is_the_report_itself(tmp_path: Path, spelling: str) -> None:
    # was: `gate r.json --baseline r.json` compared the report with itself and always passed, silently
    code, _, _ = cli("analyze", str(job_folder(tmp_path / "job")), "--format", "json", "-j", "1", "-o",
                     str(tmp_path / "r.json"))  # fmt: skip
    assert code == 0
    (tmp_path / "link.json").symlink_to(tmp_path / "r.json")
    baseline = {"same": "r.json", "dot": "./r.json", "link": "link.json"}[spelling]
    code, stdout, stderr = cli("gate", str(tmp_path / "r.json"), "--baseline", str(tmp_path / baseline))
    assert code == 2 and stdout == "" and len(stderr.splitlines()) == 1, stderr
    assert "is the report itself" in stderr, stderr
    (tmp_path / "copy.json").write_bytes((tmp_path / "r.json").read_bytes())  # a saved copy is a baseline
    code, _, stderr = cli("gate", str(tmp_path / "r.json"), "--baseline", str(tmp_path / "copy.json"))
    assert code == 0, stderr


# ---- round 3: ds_config values users really write ---------------------------------------------------------

SAMPLES = Path(__file__).resolve().parents[1] / "sample_traces"
READ_KEYS = ("reduce_bucket_size", "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold",
             "zero_hpz_partition_size", "overlap_comm")  # fmt: skip
BAD_VALUES = {
    "auto": "auto",
    "list": [5],
    "string": "5e8",
    "nan": math.nan,
    "infinity": math.inf,
    "minus-infinity": -math.inf,
    "bool": True,
    "huge": 10**30,
    "negative": -5,
    "object": {"a": 1},
}


def hostile_config(value: Any) -> dict[str, Any]:
    """A ds_config with `value` at every key a rule reads."""
    return {
        "train_micro_batch_size_per_gpu": value,
        "communication_data_type": value,
        "zero_optimization": {"stage": 3, **{k: value for k in READ_KEYS}},
        "timers": {"throughput": value},
        "comms_logger": value,
    }


@pytest.mark.parametrize("value", BAD_VALUES.values(), ids=BAD_VALUES.keys())
def test_api_ds_config_values_are_noted_never_a_crash(value: Any) -> None:
    import overlapcheck

    for name in ("reduce-throttle", "no-prefetch", "bucket-too-large", "throughput-timer"):
        report = overlapcheck.analyze(SAMPLES / name, ds_config=hostile_config(value), jobs=1)
        notes = " ".join(report.notes or [])
        assert "zero_optimization.stage3_prefetch_bucket_size" in notes, notes
        assert ("auto" in notes) == (value == "auto")
        assert report.ranks and not report.errors


@pytest.mark.parametrize("route", ["--ds-config", "beside"])
@pytest.mark.parametrize("value", ["auto", [5], math.nan, math.inf, False], ids=["auto", "list", "nan", "inf", "bool"])
def test_cli_ds_config_values_are_noted_never_a_crash(tmp_path: Path, route: str, value: Any) -> None:
    folder = tmp_path / "job"
    folder.mkdir()
    for trace in (SAMPLES / "reduce-throttle").glob("rank*.trace.json.gz"):
        (folder / trace.name).write_bytes(trace.read_bytes())
    config = tmp_path / "ds.json" if route == "--ds-config" else folder / "ds_config.json"
    config.write_text(json.dumps(hostile_config(value)))  # NaN and Infinity as Python's json writes them
    extra = ["--ds-config", str(config)] if route == "--ds-config" else []
    code, stdout, stderr = cli("analyze", str(folder), "--format", "json", "-j", "1", *extra)
    assert code == 0, stderr
    notes = json.loads(stdout)["notes"]
    assert any("zero_optimization.reduce_bucket_size" in n for n in notes), notes
    code, stdout, _ = cli("analyze", str(folder), "-j", "1", *extra)
    assert code == 0 and "note: ds_config" in stdout


def test_auto_takes_the_value_the_engine_resolved_in_run_json(tmp_path: Path) -> None:
    import overlapcheck

    resolved = json.loads((SAMPLES / "reduce-throttle" / "ds_config.json").read_text())
    folder = tmp_path / "job"
    folder.mkdir()
    for trace in (SAMPLES / "reduce-throttle").glob("rank*.trace.json.gz"):
        (folder / trace.name).write_bytes(trace.read_bytes())
    auto = json.loads(json.dumps(resolved))
    auto["zero_optimization"]["reduce_bucket_size"] = "auto"
    auto["zero_optimization"]["stage3_prefetch_bucket_size"] = "auto"
    (folder / "run.json").write_text(json.dumps({"schema": "overlapcheck.run/1", "ds_config": resolved}))
    report = overlapcheck.analyze(folder, ds_config=auto, jobs=1)
    expected = overlapcheck.analyze(folder, ds_config=resolved, jobs=1)
    assert report.findings == expected.findings
    assert report.notes and all("from run.json" in n for n in report.notes), report.notes
    assert expected.notes is None  # a good config says nothing, and the JSON document is as before


def test_api_ds_config_of_the_wrong_type_is_a_user_error() -> None:
    import overlapcheck

    with pytest.raises(UserError, match="ds_config must be a dict"):
        overlapcheck.analyze(SAMPLES / "straggler", ds_config=[1, 2])  # type: ignore[arg-type]


# ---- round 3: selections, sizes and numbers beyond reason ------------------------------------------------


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--ranks", "99", "--ranks 99 selects none of the inputs: the inputs hold rank(s) 0-1"),
        ("--steps", "99", "--steps 99 selects no step of any rank: the traces hold steps 5"),
        ("--steps", "9" * 40, "beyond any step number"),
        ("--ranks", "1-" + "9" * 40, "beyond any rank number"),
    ],
)
def test_a_selection_that_matches_nothing_is_an_error_listing_what_there_is(
    tmp_path: Path, option: str, value: str, message: str
) -> None:
    code, stdout, stderr = cli("analyze", str(job_folder(tmp_path / "job")), "-j", "1", option, value)
    assert code == 2 and message in stderr, stderr
    assert "Traceback" not in stderr and stdout == ""


def test_forty_huge_rank_ranges_are_never_expanded(tmp_path: Path) -> None:
    import tracemalloc

    ranges = ",".join(f"{i * 10**15}-{i * 10**15 + 10**14}" for i in range(40))
    tracemalloc.start()
    code, stdout, stderr = cli("analyze", str(job_folder(tmp_path / "job")), "-j", "1", "--format", "json",
                               "--ranks", ranges)  # fmt: skip
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert code == 0, stderr
    assert [r["rank"] for r in json.loads(stdout)["ranks"]] == [0, 1]
    assert peak < 200 << 20, peak  # the old parser built 4e15 integers (MemoryError at 2.2 GB with 40 x 1e6)


def test_api_selections_take_digit_strings_and_refuse_what_matches_nothing(tmp_path: Path) -> None:
    import numpy as np

    import overlapcheck

    folder = job_folder(tmp_path / "job")
    assert [r.rank for r in overlapcheck.analyze(folder, ranks=["0"], jobs=1).ranks] == [0]
    assert [r.rank for r in overlapcheck.analyze(folder, ranks=np.array([1]), jobs=1).ranks] == [1]
    with pytest.raises(UserError, match="hold rank"):
        overlapcheck.analyze(folder, ranks=[99], jobs=1)
    with pytest.raises(UserError, match="is not a rank number"):
        overlapcheck.analyze(folder, ranks=["zero"], jobs=1)  # type: ignore[list-item]


def test_gate_refuses_a_huge_baseline_without_reading_it(tmp_path: Path) -> None:
    code, _, _ = cli("analyze", str(job_folder(tmp_path / "job")), "--format", "json", "-j", "1", "-o",
                     str(tmp_path / "r.json"))  # fmt: skip
    assert code == 0
    huge = tmp_path / "huge.json"
    with open(huge, "wb") as f:
        f.truncate(900 << 20)  # sparse: 900 MB that the old gate read and parsed (MemoryError at 3.9 GB)
    code, _, stderr = cli("gate", str(tmp_path / "r.json"), "--baseline", str(huge))
    assert code == 2 and "900 MiB, larger than 256 MiB: too big for an overlapcheck report" in stderr, stderr


@pytest.mark.parametrize("name", ["rank0.json", "rank0.json.gz"])
def test_gate_on_a_trace_says_to_analyze_it_first(tmp_path: Path, name: str) -> None:
    trace = tmp_path / name
    trace.write_bytes(gzip.compress(doc_bytes()) if name.endswith(".gz") else doc_bytes())
    code, _, stderr = cli("gate", str(trace), "--min-overlap", "all=0.5")
    assert code == 2 and "run `overlapcheck analyze TRACES --format json -o report.json` first" in stderr, stderr


def test_megabyte_kernel_names_are_cut_in_every_output(tmp_path: Path) -> None:
    huge = [kernel(name=f"k{i}" + "x" * 1_000_000, ts=100 + 50 * i, dur=5) for i in range(3)]
    (tmp_path / "rank0.json").write_bytes(doc_bytes(good_events() + huge))
    code, stdout, stderr = cli("analyze", str(tmp_path / "rank0.json"), "-j", "1", "--format", "json",
                               "--html", str(tmp_path / "r.html"), "--perfetto", str(tmp_path / "p.json"))  # fmt: skip
    assert code == 0, stderr
    assert any("3 names longer than 8192 characters were cut" in n for n in _notes(stdout))
    for out in (stdout.encode(), (tmp_path / "r.html").read_bytes(), (tmp_path / "p.json").read_bytes()):
        assert len(out) < 1_000_000 and b"x" * 8193 not in out


@pytest.mark.parametrize("origin", [2.0**53, 1e17])
def test_timestamps_too_large_for_float_precision_are_noted(tmp_path: Path, origin: float) -> None:
    events = [dict(e, ts=e["ts"] + origin) if "ts" in e else e for e in good_events()]
    (tmp_path / "rank0.json").write_bytes(doc_bytes(events))
    code, stdout, stderr = analyze(tmp_path / "rank0.json", "--html", str(tmp_path / "r.html"))[:3]
    assert code == 0, stderr
    assert any("where a float64 time moves in steps of" in n for n in _notes(stdout)), _notes(stdout)
    assert b"Infinity" not in (tmp_path / "r.html").read_bytes()


@pytest.mark.parametrize("origin", [2.0**62, 2.0**63, 1e300])
def test_timestamps_where_nothing_can_be_measured_are_an_error(tmp_path: Path, origin: float) -> None:
    # a 1 ms float step or coarser: every duration is lost, and a verdict (or a passing gate) would be made up
    events = [dict(e, ts=e["ts"] + origin) if "ts" in e else e for e in good_events()]
    (tmp_path / "rank0.json").write_bytes(doc_bytes(events))
    code, stdout, stderr = cli("analyze", str(tmp_path / "rank0.json"), "-j", "1")
    assert code == 2 and "no kernel's duration can be measured" in stderr and "Traceback" not in stderr
    # real clocks (1.7e15 µs since the epoch, a 0.25 µs float step) are fine and say nothing
    events = [dict(e, ts=e["ts"] + 1.7e15) if "ts" in e else e for e in good_events()]
    (tmp_path / "rank0.json").write_bytes(doc_bytes(events))
    code, stdout, _ = analyze(tmp_path / "rank0.json")[:3]
    assert code == 0 and not any("float64" in n for n in _notes(stdout))


# ---- round 3: what a newcomer trips on ---------------------------------------------------------------------


def test_an_unreadable_input_is_said_once(tmp_path: Path) -> None:
    folder = job_folder(tmp_path / "job")
    (folder / "rank1.json").write_text("garbage")
    code, stdout, stderr = cli("analyze", str(folder), "-j", "1")
    assert code == 2 and "rank1.json" in stderr
    assert "rank1.json" not in stdout  # the text report on stdout does not repeat the stderr line


def test_off_a_terminal_tables_are_as_wide_as_they_need(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    code, stdout, _ = cli("analyze", str(SAMPLES / "seed-5201"), "-j", "1")
    assert code == 0
    assert "collective" in stdout and "exposed ms/step" in stdout and "collec…" not in stdout


# ---- round 3: several jobs taken for one ------------------------------------------------------------------


def test_traces_of_two_jobs_in_one_folder_are_refused(tmp_path: Path) -> None:
    folder = job_folder(tmp_path / "mixed")
    for r in range(2, 4):
        (folder / f"rank{r}.json").write_bytes(doc_bytes(rank=r, world=8))  # another job's ranks 2 and 3
    code, stdout, stderr = cli("analyze", str(folder), "-j", "1")
    assert code == 2 and stdout == "", stderr
    assert (
        "more than one job (world size 2 in rank0.json, rank1.json; world size 8 in rank2.json, rank3.json)" in stderr
    )


def test_a_foreign_rank_beyond_the_world_size_is_refused(tmp_path: Path) -> None:
    folder = job_folder(tmp_path / "job")
    (folder / "rank-x.json").write_bytes(doc_bytes(rank=5, world=8).replace(b'"world_size": 8', b'"world_size": 2'))
    code, _, stderr = cli("analyze", str(folder), "-j", "1")
    assert code == 2 and "rank 5 (rank-x.json) is not below the job's world size 2" in stderr, stderr


def test_run_json_that_disagrees_with_the_traces_is_refused(tmp_path: Path) -> None:
    folder = job_folder(tmp_path / "job")
    (folder / "run.json").write_text(json.dumps({"world_size": 16}))
    code, _, stderr = cli("analyze", str(folder), "-j", "1")
    assert code == 2 and "run.json says world size 16, the traces say 2" in stderr, stderr


def test_rank01_and_rank1_summaries_are_refused_not_one_dropped(tmp_path: Path) -> None:
    run = tmp_path / "run"
    job_folder(run / "traces")
    (run / "run.json").write_text(json.dumps({"ranks": []}))
    for name in ("rank1.summary.json", "rank01.summary.json"):
        (run / name).write_text("{}")
    code, _, stderr = cli("report", str(run), "-j", "1")
    assert code == 2 and "rank01.summary.json and rank1.summary.json both name rank 1" in stderr, stderr


def test_duplicate_ranks_by_name_are_each_an_error(tmp_path: Path) -> None:
    folder = tmp_path / "job"
    folder.mkdir()
    for name in ("rank1.json", "rank01.json", "rank0.json"):
        (folder / name).write_bytes(doc_bytes(rank=None))
    code, stdout, stderr = cli("analyze", str(folder), "-j", "1", "--format", "json")
    assert code == 2 and "rank 1 is claimed by several files" in stderr
    assert [r["rank"] for r in json.loads(stdout)["ranks"]] == [0]


def test_rank_from_names_ranks_the_reader_cannot_place(tmp_path: Path) -> None:
    folder = tmp_path / "job"
    folder.mkdir()
    for gpu in (0, 1):  # both traces say rank 0 (a launcher that never set RANK)
        (folder / f"host-a.gpu{gpu}.json").write_bytes(doc_bytes(rank=0, world=2))
    code, _, stderr = cli("analyze", str(folder), "-j", "1")
    assert code == 2 and "claimed by several files" in stderr
    code, stdout, stderr = cli("analyze", str(folder), "-j", "1", "--format", "json", "--rank-from", r"gpu(\d+)")
    assert code == 0, stderr
    ranks = json.loads(stdout)["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1]
    assert any("rank 1 from the file's path (--rank-from)" in n for n in ranks[1]["notes"])
    api = overlapcheck.analyze(folder, rank_from=r"gpu(\d+)", jobs=1)  # the API's note names its parameter
    assert any("rank 1 from the file's path (rank_from)" in n for n in api.ranks[1].notes), api.ranks[1].notes
    code, _, stderr = cli("analyze", str(folder), "-j", "1", "--rank-from", r"gpu(\d+")
    assert code == 2 and "not a regular expression" in stderr and len(stderr.splitlines()) == 1
    code, _, stderr = cli("analyze", str(folder), "-j", "1", "--rank-from", r"node(\d+)")
    assert code == 2 and "does not match" in stderr
    code, _, stderr = cli("analyze", str(folder), "-j", "1", "--rank-from", r"host-(x)?")  # the group matches nothing
    assert code == 2 and "not a rank number" in stderr


def test_run_without_the_double_dash_says_where_it_goes() -> None:
    code, stdout, stderr = cli("run", "deepspeed", "train.py", "--deepspeed", "ds.json")
    assert code == 2 and "No such option" not in stdout + stderr
    assert "put `--` before the command to run: overlapcheck run -- deepspeed train.py" in stdout + stderr


def test_analyze_format_html_is_the_page(tmp_path: Path) -> None:
    code, stdout, stderr = cli("analyze", str(job_folder(tmp_path / "job")), "-j", "1", "--format", "html")
    assert code == 0, stderr
    assert stdout.lstrip().lower().startswith("<!doctype html") and "oc-config" in stdout


def test_a_notebook_sees_short_reprs_dir_and_no_float_noise() -> None:
    import dataclasses

    import overlapcheck

    assert "analyze" in dir(overlapcheck) and "Report" in dir(overlapcheck)
    report = overlapcheck.analyze(SAMPLES / "no-prefetch", jobs=1)
    assert len(repr(report)) < 300 and "2 ranks" in repr(report)
    assert len(repr(report.ranks[0])) < 300

    def tiny(value: Any) -> list[float]:
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return [x for f in dataclasses.fields(value) for x in tiny(getattr(value, f.name))]
        if isinstance(value, dict):
            return [x for v in value.values() for x in tiny(v)]
        if isinstance(value, list):
            return [x for v in value for x in tiny(v)]
        return [value] if isinstance(value, float) and 0 < abs(value) < 1e-6 else []

    assert tiny(report.ranks) == []  # was overlapped_us=2.3e-10 where nothing overlaps


def test_every_command_shows_examples_in_its_help() -> None:
    for name in ("analyze", "report", "gate", "compare", "simulate", "run"):
        code, stdout, _ = cli(name, "--help")
        assert code == 0 and f"overlapcheck {name}" in stdout.split("Options:")[0].split("\n", 1)[1], name


def test_a_report_with_one_rank_twice_is_refused_by_gate_and_compare(tmp_path: Path) -> None:
    code, _, _ = cli("analyze", str(job_folder(tmp_path / "job")), "--format", "json", "-j", "1", "-o",
                     str(tmp_path / "r.json"))  # fmt: skip
    doc = json.loads((tmp_path / "r.json").read_text())
    doc["ranks"][1]["rank"] = 0
    (tmp_path / "twice.json").write_text(json.dumps(doc))
    code, _, stderr = cli("gate", str(tmp_path / "twice.json"), "--min-overlap", "all=0.1")
    assert code == 2 and "ranks[1] and ranks[0] are both rank 0" in stderr, stderr
    code, _, stderr = cli("compare", str(tmp_path / "r.json"), str(tmp_path / "twice.json"))
    assert code == 2 and "are both rank 0" in stderr, stderr


def test_markdown_carries_each_findings_explanation() -> None:
    from builders import make_finding, make_report

    from overlapcheck.report import renderer

    report = make_report(2, findings=[make_finding(why="every gradient fits in one bucket")])
    assert "   - why: every gradient fits in one bucket" in str(renderer("markdown").render(report))


@pytest.mark.parametrize("parameters", [10**400, -5, 0, 1.5, True, "1e9"])
def test_model_json_parameter_counts_beyond_reason_are_unknown(tmp_path: Path, parameters: Any) -> None:
    folder = tmp_path / "job"
    folder.mkdir()
    for trace in (SAMPLES / "reduce-throttle").glob("rank*.trace.json.gz"):
        (folder / trace.name).write_bytes(trace.read_bytes())
    (folder / "model.json").write_text(json.dumps({"parameters": parameters}))
    code, stdout, stderr = cli("analyze", str(folder), "-j", "1", "--format", "json")
    assert code == 0, stderr


def test_compare_says_first_when_the_runs_are_not_like_for_like(tmp_path: Path) -> None:
    code, stdout, stderr = cli("compare", str(job_folder(tmp_path / "a", world=2)),
                               str(job_folder(tmp_path / "b", world=4)), "--format", "json")  # fmt: skip
    assert code == 0, stderr
    verdict = json.loads(stdout)["verdict"]
    assert verdict.startswith("Not like for like: before ran on 2 ranks, after on 4"), verdict


def test_every_output_folds_the_same_findings_by_cost_not_position() -> None:
    """seed-5201: the 10.41 ms/step allgather-transfer-bound comes after two sub-0.1 % findings in report order;
    the HTML page showed those as cards and folded it (and its nav counted 5 findings where the verdict said 3)."""
    from builders import make_finding, make_report

    from overlapcheck.report import present as P
    from overlapcheck.report import renderer

    findings = [
        make_finding(rule="reduce-scatter-deferred", cost_us=25_000.0),
        make_finding(rule="cross-stream-wait", cost_us=0.5),
        make_finding(rule="host-sync", cost_us=0.4),
        make_finding(rule="allgather-transfer-bound", cost_us=10_000.0),
    ]
    report = make_report(2, findings=findings)
    shown, folded = P.costly_indices(report)
    assert (shown, folded) == ([0, 3], [1, 2])
    page = str(renderer("html").render(report))
    cards = page.split('<section id="findings"', 1)[1].split('class="folded"', 1)[0]
    assert "allgather-transfer-bound" in cards and "cross-stream-wait" not in cards
    assert "Also seen, no measurable cost (2)" in page and 'Findings <span class="count">2<' in page
    for name in ("text", "markdown"):
        out = str(renderer(name).render(report))
        assert "no measurable cost: cross-stream-wait, host-sync" in out.replace("\n", " "), name


def test_perfetto_numbers_findings_as_the_terminal_and_names_the_exposed_collectives(tmp_path: Path) -> None:
    import gzip as gz

    code, stdout, stderr = cli("analyze", str(SAMPLES / "seed-5201"), "-j", "2", "--ranks", "0-1",
                               "--perfetto", str(tmp_path / "p.json.gz"))  # fmt: skip
    assert code == 0, stderr
    doc = json.loads(gz.decompress((tmp_path / "p.json.gz").read_bytes()))
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    tracks = {e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "thread_name"}
    # the terminal lists "3. [info] Prefetched all-gathers take longer ..." (it is 5th in the JSON's order)
    assert "3. [info] Prefetched all-gathers" in stdout.replace("\n", " ")
    assert any(t.startswith("finding 3: Prefetched all-gathers") for t in tracks), sorted(tracks)
    exposed = [e for e in events if e.get("cat") == "exposed"]
    assert exposed and all(e["args"]["collectives"] for e in exposed if e.get("args"))
    assert {"reduce_scatter", "all_gather"} <= {k for e in exposed for k in e.get("args", {}).get("collectives", [])}


# -- round 3, second pass: a hostile user on the merged main ----------------------------------------------------


def _kineto_copy(src: Path, dst: Path) -> Path:
    shutil.copyfile(src, dst)
    return dst


@pytest.mark.parametrize("name", ["trace.json.gz", "ds_config.json", "truth.json", "run.json", "rank0.summary.json"])
def test_force_never_replaces_a_jobs_input_that_this_command_does_not_read(tmp_path: Path, name: str) -> None:
    # the file is no input of this command, so the input check cannot see it: --force still may not replace it
    sample = SAMPLES / "healthy"
    victim = tmp_path / name
    if name.endswith(".gz"):
        _kineto_copy(sample / "rank0.trace.json.gz", victim)
    else:
        victim.write_text('{"train_micro_batch_size_per_gpu": 4}\n')
    before = victim.read_bytes()
    r = builders.run_cli("analyze", str(sample), "-j", "1", "--format", "json", "-o", str(victim), "--force")
    refused = "never replaced" in r.stderr or "choose another name" in r.stderr  # by what it holds, or its name
    assert r.returncode == 2 and refused and "Traceback" not in r.stderr
    assert victim.read_bytes() == before


def test_force_never_replaces_a_trace_through_a_symbolic_link(tmp_path: Path) -> None:
    trace = _kineto_copy(SAMPLES / "healthy" / "rank0.trace.json.gz", tmp_path / "rank0.trace.json.gz")
    report = tmp_path / "report.json"
    assert (
        builders.run_cli(
            "analyze", str(SAMPLES / "healthy"), "-j", "1", "--format", "json", "-o", str(report)
        ).returncode
        == 0
    )
    link = tmp_path / "link.json.gz"
    link.symlink_to(trace)
    before = trace.read_bytes()
    r = builders.run_cli("baseline", "save", str(report), str(link), "--force")
    assert r.returncode == 2 and "never replaced" in r.stderr
    assert trace.read_bytes() == before


def test_force_still_replaces_its_own_earlier_report(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    for _ in range(2):
        r = builders.run_cli(
            "analyze", str(SAMPLES / "healthy"), "-j", "1", "--format", "json", "-o", str(out), "--force"
        )
        assert r.returncode == 0, r.stderr


@pytest.mark.parametrize(
    "config",
    [
        {"zero_optimization": {"reduce_bucket_size": 10**400}},
        {"gradient_accumulation_steps": 10**400},
        {"train_micro_batch_size_per_gpu": -(10**400)},
    ],
)
def test_integers_beyond_a_float_in_ds_config_are_a_note(config: dict) -> None:
    report = overlapcheck.analyze(SAMPLES / "healthy", ds_config=config, jobs=1)
    assert report.notes and any("larger than" in n or "negative" in n for n in report.notes)


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"paths": None}, "paths must be"),
        ({"paths": 5}, "paths must be"),
        ({"paths": b"/tmp"}, "paths must be"),
        ({"paths": [b"/tmp"]}, "paths must be"),
        ({"paths": []}, "non-empty"),
        ({"jobs": "2"}, "jobs must be"),
        ({"jobs": 1.5}, "jobs must be"),
        ({"jobs": 0}, "jobs must be"),
        ({"jobs": True}, "jobs must be"),
        ({"rank_from": 5}, "rank_from must be"),
    ],
)
def test_api_arguments_of_the_wrong_type_are_a_user_error(kwargs: dict, fragment: str) -> None:
    args = {"paths": SAMPLES / "healthy", **kwargs}
    with pytest.raises(overlapcheck.UserError, match=fragment):
        overlapcheck.analyze(args.pop("paths"), **args)


@pytest.mark.parametrize("network", ["1" + "0" * 400 + "x1Gbps", "4x1e400Gbps"])
def test_a_network_beyond_reason_is_one_line(network: str) -> None:
    r = builders.run_cli("analyze", str(SAMPLES / "healthy"), "-j", "1", "--network", network)
    assert r.returncode == 2 and "Traceback" not in r.stderr and "--network" in r.stderr


def test_a_scheduler_file_that_is_no_schedulers_is_one_line(tmp_path: Path) -> None:
    pytest.importorskip("distributed")
    bogus = tmp_path / "not-a-scheduler.json"
    bogus.write_text('{"zero_optimization": {}}')
    r = builders.run_cli("analyze", str(SAMPLES / "healthy"), "-j", "1", "--scheduler", str(bogus))
    assert r.returncode == 2 and "Traceback" not in r.stderr and "scheduler" in r.stderr


def test_simulate_sizes_beyond_reason_are_refused() -> None:
    r = builders.run_cli("simulate", "--out", "/tmp/never-written", "--nodes", "99999999999", "--steps", "1")
    assert r.returncode == 2 and "Traceback" not in r.stderr


# -- round 4 (red3): empty paths, `-` that is no stdout, repeated thresholds, simulate over real traces ---------


@pytest.mark.parametrize(
    "args",
    [
        ["analyze", "JOB", "-o", ""],
        ["analyze", "JOB", "--html", ""],
        ["analyze", "JOB", "--perfetto", ""],
        ["analyze", "JOB", "--ds-config", ""],
        ["analyze", ""],
        ["report", ""],
        ["compare", "", "JOB"],
        ["compare", "JOB", "JOB", "--json", ""],
        ["gate", "", "--min-overlap", "all=0.5"],
        ["gate", "REPORT", "--baseline", ""],
        ["gate", "REPORT", "--min-overlap", "all=0.5", "--junit", ""],
        ["baseline", "save", "REPORT", ""],
        ["simulate", "--out", "", "--steps", "1", "--nodes", "1", "--gpus-per-node", "1"],
        ["run", "--out", "", "--", "python", "-c", "1"],  # was: the default overlapcheck-run-<timestamp>, and a run
    ],
    ids=lambda a: "-".join(x or "EMPTY" for x in a[:1] + a[2:] if not x.startswith("all=")),
)
def test_an_empty_path_is_refused_not_taken_as_not_given(tmp_path: Path, args: list[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    # was: `-o ''` printed to stdout, `--ds-config ''` / `--html ''` / `--junit ''` were ignored, `simulate --out ''`
    # wrote into the current folder
    job = job_folder(tmp_path / "job")
    code, _, _ = cli("analyze", str(job), "--format", "json", "-j", "1", "-o", str(tmp_path / "r.json"))
    assert code == 0
    monkeypatch.chdir(tmp_path)
    names = {"JOB": str(job), "REPORT": str(tmp_path / "r.json")}
    before = sorted(os.listdir(tmp_path))
    code, stdout, stderr = cli(*[names.get(a, a) for a in args])
    errors = [line for line in stderr.splitlines() if line.startswith("overlapcheck: error:")]
    assert code == 2 and len(errors) == 1 and "is an empty path" in errors[0], stderr
    assert stdout == "" and sorted(os.listdir(tmp_path)) == before


@pytest.mark.parametrize(
    "args",
    [
        ["analyze", "JOB", "--html", "-"],
        ["analyze", "JOB", "--perfetto", "-"],
        ["compare", "JOB", "JOB", "--html", "-"],
        ["compare", "JOB", "JOB", "--markdown", "-"],
        ["gate", "REPORT", "--min-overlap", "all=0.5", "--junit", "-"],
        ["gate", "REPORT", "--min-overlap", "all=0.5", "--markdown", "-"],
        ["baseline", "save", "REPORT", "-"],
    ],
    ids=lambda a: "-".join(a[:1] + [x for x in a[2:] if x.startswith("--")]),
)
def test_a_dash_where_it_is_no_stdout_writes_no_file_named_dash(tmp_path: Path, args: list[str],
                                                                monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    job = job_folder(tmp_path / "job")
    code, _, _ = cli("analyze", str(job), "--format", "json", "-j", "1", "-o", str(tmp_path / "r.json"))
    monkeypatch.chdir(tmp_path)
    names = {"JOB": str(job), "REPORT": str(tmp_path / "r.json")}
    code, _, stderr = cli(*[names.get(a, a) for a in args])
    assert code == 2 and "only for -o/--output" in stderr, stderr
    assert not (tmp_path / "-").exists()
    code, stdout, _ = cli("analyze", str(job), "-j", "1", "--format", "json", "-o", "-")  # -o - is still stdout
    assert code == 0 and json.loads(stdout)["ranks"] and not (tmp_path / "-").exists()


@pytest.mark.parametrize("option", ["--min-overlap", "--max-exposed-regression", "--max-overlap-drop"])
def test_a_threshold_given_twice_with_two_values_is_refused(tmp_path: Path, option: str) -> None:
    # was: the later value won silently (`--min-overlap all=0.9 --min-overlap all=0.5` gated at 50% and passed)
    code, _, _ = cli("analyze", str(job_folder(tmp_path / "job")), "--format", "json", "-j", "1", "-o",
                     str(tmp_path / "r.json"))  # fmt: skip
    report, baseline = str(tmp_path / "r.json"), str(tmp_path / "baseline.json")
    shutil.copyfile(report, baseline)
    code, _, stderr = cli("gate", report, "--baseline", baseline, option, "all=0.9", option, "all=0.5")
    assert code == 2 and "all is given twice (0.9 and 0.5)" in stderr, stderr
    code, _, stderr = cli("gate", report, "--baseline", baseline, option, "all=0.5", option, "all=50%")
    assert code in (0, 1), stderr  # the same value twice is no contradiction


def test_an_empty_rank_from_is_one_error_not_one_per_file(tmp_path: Path) -> None:
    code, _, stderr = cli("analyze", str(job_folder(tmp_path / "job")), "-j", "1", "--rank-from", "")
    assert code == 2 and len(stderr.splitlines()) == 1 and "--rank-from '' is empty" in stderr, stderr
    with pytest.raises(UserError, match="is empty"):
        overlapcheck.analyze(tmp_path / "job", rank_from="", jobs=1)


def test_api_scheduler_of_the_wrong_type_is_a_user_error(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="scheduler must be"):
        overlapcheck.analyze(job_folder(tmp_path / "job"), scheduler=5, jobs=1)  # type: ignore[arg-type]


def test_simulate_force_never_replaces_a_folder_of_real_traces(tmp_path: Path) -> None:
    # was: `simulate --out traces/ --force` deleted the folder's rank*.trace.json.gz and wrote its ds_config.json
    folder = tmp_path / "real"
    folder.mkdir()
    for name in ("rank0.trace.json.gz", "ds_config.json"):
        shutil.copyfile(SAMPLES / "healthy" / name, folder / name)
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    small = ["--steps", "1", "--nodes", "1", "--gpus-per-node", "1"]
    code, _, stderr = cli("simulate", "--out", str(folder), *small, "--force")
    assert code == 2 and "never replaced, even with --force" in stderr, stderr
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    sim = tmp_path / "sim"
    for _ in range(2):  # an earlier simulation is still replaced
        code, _, stderr = cli("simulate", "--out", str(sim), *small, "--force")
        assert code == 0, stderr


@pytest.mark.parametrize("name", ["rank5.trace.json.gz", "rank0.trace.json.gz"])
def test_simulate_force_never_deletes_a_real_trace_put_into_an_earlier_simulation(tmp_path: Path, name: str) -> None:
    # was: truth.json made the folder the simulator's, and --force deleted every rank*.trace.json.gz in it
    small = ["--steps", "1", "--nodes", "1", "--gpus-per-node", "1"]
    sim = tmp_path / "sim"
    assert cli("simulate", "--out", str(sim), *small)[0] == 0
    real = sim / name
    real.write_bytes((SAMPLES / "healthy" / "rank1.trace.json.gz").read_bytes())  # another rank, or a newer rank0
    later = (sim / "truth.json").stat().st_mtime_ns + 10**9
    os.utime(real, ns=(later, later))
    code, _, stderr = cli("simulate", "--out", str(sim), *small, "--force")
    assert code == 2 and name in stderr and "never deleted, even with --force" in stderr, stderr
    assert real.read_bytes() == (SAMPLES / "healthy" / "rank1.trace.json.gz").read_bytes()


@pytest.mark.parametrize("shape", [["--steps", "99999999999999999999"], ["--nodes", "1024", "--gpus-per-node", "64",
                                                                        "--steps", "1000"]])  # fmt: skip
def test_simulate_steps_beyond_memory_are_refused_at_once(tmp_path: Path, shape: list[str]) -> None:
    # was: --steps 1e20 ran forever, 1024 x 64 x 1000 was killed for memory
    code, _, stderr = cli("simulate", "--out", str(tmp_path / "sim"), *shape)
    assert code == 2 and "rank-steps" in stderr and not (tmp_path / "sim").exists(), stderr


def _run_with_summaries(folder: Path, tamper: Callable[[int, dict[str, Any]], dict[str, Any]],
                        traces: bool = True) -> Path:  # fmt: skip
    """An `overlapcheck run` folder of two ranks: their traces (if `traces`) and summaries, each `tamper`ed."""
    from overlapcheck.capture.summary import summarize
    from overlapcheck.report.json import JsonRenderer

    (folder / "traces").mkdir(parents=True)
    for r in range(2):
        trace = folder / "traces" / f"rank{r}.json"
        trace.write_bytes(doc_bytes(rank=r, world=2))
        doc = json.loads(JsonRenderer(digits=None).render(summarize(str(trace))))
        (folder / f"rank{r}.summary.json").write_text(json.dumps(tamper(r, doc)))
        if not traces:
            trace.unlink()
    (folder / "run.json").write_text(json.dumps({"ranks": []}))
    return folder


def _swap(r: int, doc: dict[str, Any]) -> dict[str, Any]:
    doc["ranks"][0]["rank"] = 1 - r
    return doc


def _no_ranks(r: int, doc: dict[str, Any]) -> dict[str, Any]:
    doc["ranks"] = []
    return doc


def _overlap(r: int, doc: dict[str, Any]) -> dict[str, Any]:
    doc["ranks"][0]["collectives"]["all"]["overlap"] = 7.5
    return doc


def _negative(r: int, doc: dict[str, Any]) -> dict[str, Any]:
    doc["ranks"][0]["collectives"]["all"]["exposed_us"] = -5.0
    return doc


def _huge(r: int, doc: dict[str, Any]) -> dict[str, Any]:
    doc["ranks"][0]["collectives"]["all"]["time_us"] = 1e308
    return doc


LIES = {
    "swapped-ranks": (_swap, "holds rank 1, and its name says rank 0"),
    "time-1e308": (_huge, "time_us is 1e+308 µs, beyond 2^62 µs"),
    "no-ranks": (_no_ranks, "holds 0 ranks, not its own one rank"),
    "overlap-750%": (_overlap, "overlap is 7.5, not a fraction from 0 to 1"),
    "negative-exposed": (_negative, "exposed_us is negative"),
}


@pytest.mark.parametrize("lie", LIES, ids=LIES)
def test_a_summary_that_lies_is_not_used_and_that_is_said(tmp_path: Path, lie: str) -> None:
    # was: swapped summaries were taken as they said, empty ones gave an empty report with exit 0, an overlap of
    # 750% was reported (and passed any gate); an unreadable summary fell back to its trace without a word
    tamper, said = LIES[lie]
    run = _run_with_summaries(tmp_path / "run", tamper)
    code, stdout, stderr = cli("report", str(run), "-j", "1", "--format", "json")
    assert code == 0, stderr
    ranks = json.loads(stdout)["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1]
    assert all(r["collectives"]["all"]["overlap"] == 0.5 for r in ranks)  # as its trace says
    assert any(said in n and "rank0.summary.json was not used" in n for n in ranks[0]["notes"]), ranks[0]["notes"]
    bare = _run_with_summaries(tmp_path / "bare", tamper, traces=False)
    code, stdout, stderr = cli("report", str(bare), "-j", "1", "--format", "json")
    errors = [line for line in stderr.splitlines() if line.startswith("overlapcheck: error:")]
    assert code == 2 and len(errors) == 2 and said in errors[0], stderr


def test_gate_refuses_a_report_whose_overlap_is_no_fraction(tmp_path: Path) -> None:
    code, _, _ = cli("analyze", str(job_folder(tmp_path / "job")), "--format", "json", "-j", "1", "-o",
                     str(tmp_path / "r.json"))  # fmt: skip
    doc = json.loads((tmp_path / "r.json").read_text())
    doc["ranks"][0]["collectives"]["all"]["overlap"] = 7.5
    (tmp_path / "lie.json").write_text(json.dumps(doc))
    code, _, stderr = cli("gate", str(tmp_path / "lie.json"), "--min-overlap", "all=0.9")
    assert code == 2 and "ranks[0].collectives.all.overlap is 7.5" in stderr, stderr


@pytest.mark.parametrize("where", ["rank", "step"])
def test_gate_refuses_a_report_whose_exposed_share_is_negative(tmp_path: Path, where: str) -> None:
    # was: ranks[*].exposed_share = -0.5 read as it was: "exposed share of step time (worst) -50.0% <= 10.0% PASS"
    code, _, _ = cli("analyze", str(job_folder(tmp_path / "job")), "--format", "json", "-j", "1", "-o",
                     str(tmp_path / "r.json"))  # fmt: skip
    doc = json.loads((tmp_path / "r.json").read_text())
    for rank in doc["ranks"]:
        target = rank if where == "rank" else rank["steps"][0]
        target["exposed_share"] = -0.5
    (tmp_path / "lie.json").write_text(json.dumps(doc))
    code, stdout, stderr = cli("gate", str(tmp_path / "lie.json"), "--max-exposed-share", "0.1")
    assert code == 2 and "exposed_share is -0.5, a negative share" in stderr and "PASS" not in stdout, stderr


def test_outputs_written_beside_the_traces_are_not_read_as_traces_next_time(tmp_path: Path) -> None:
    # was: `analyze job --perfetto job/timeline.json.gz` (or -o job/out.json, compare --json job/c.json), then every
    # later `analyze job` exited 2: "cannot tell the rank" / "not a trace" for overlapcheck's own files
    job = job_folder(tmp_path / "job")
    outputs = [("--perfetto", "timeline.json.gz"), ("--perfetto", "rank0-timeline.json"), ("-o", "out.json")]
    for option, name in outputs:
        code, _, stderr = cli("analyze", str(job), "-j", "1", "--format", "json", option, str(job / name))
        assert code == 0, stderr
    code, _, stderr = cli("compare", str(job), str(job), "-j", "1", "--json", str(job / "c.json"))
    assert code == 0, stderr
    code, stdout, stderr = cli("analyze", str(job), "-j", "1", "--format", "json")
    assert code == 0 and stderr == "", stderr
    assert [r["rank"] for r in json.loads(stdout)["ranks"]] == [0, 1]
    only = tmp_path / "only"
    only.mkdir()
    shutil.copyfile(job / "timeline.json.gz", only / "timeline.json.gz")
    code, _, stderr = cli("analyze", str(only), "-j", "1")
    assert code == 2 and "only overlapcheck's own outputs: timeline.json.gz" in stderr, stderr


@pytest.mark.parametrize(
    ("data", "said"),
    [
        (doc_bytes().decode().encode("utf-16"), "the file is UTF-16 text; save it as UTF-8"),
        (doc_bytes().decode().encode("utf-16-le"), "the file is UTF-16 text"),
        (doc_bytes().decode().encode("utf-32"), "the file is UTF-32 text"),
        (doc_bytes().replace(b'"dur": 40', b'"dur": NaN', 1), "NaN is not a JSON number"),
        (doc_bytes().replace(b'"dur": 40', b'"dur": -Infinity', 1), "-Infinity is not a JSON number"),
        (doc_bytes()[:-1] + b', "x": NaN}', "NaN is not a JSON number"),
        (b"\0" * 100, "malformed or truncated JSON"),  # NUL bytes are no UTF-16
    ],
    ids=["utf16-bom", "utf16-le", "utf32", "nan-dur", "minus-infinity", "nan-metadata", "nul-bytes"],
)
def test_a_wide_encoding_or_a_nan_is_named_in_the_one_line(tmp_path: Path, data: bytes, said: str) -> None:
    # was: "malformed or truncated JSON with no traceEvents array" / "invalid character (byte 101)"
    (tmp_path / "rank0.json").write_bytes(data)
    code, _, stderr = cli("analyze", str(tmp_path / "rank0.json"), "-j", "1")
    assert code == 2 and len(stderr.splitlines()) == 1 and said in stderr, stderr


@pytest.mark.parametrize("name", ["bogus", "", None, 5])
def test_api_an_unknown_renderer_is_a_user_error(name: Any) -> None:
    from overlapcheck.report import renderer

    with pytest.raises(UserError, match="unknown renderer"):  # was: KeyError
        renderer(name)


# ---- round 4: a fresh hostile round --------------------------------------------------------------------------


def _config_not_a_file(folder: Path, kind: str) -> None:
    path = folder / "ds_config.json"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    elif kind == "broken-link":
        path.symlink_to(folder / "nowhere.json")
    else:
        path.symlink_to(path)  # a link loop


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
@pytest.mark.parametrize(
    ("kind", "said"),
    [("fifo", "is a FIFO"), ("folder", "is a directory"), ("broken-link", "broken symbolic link"), ("loop", "loop")],
)
def test_a_ds_config_json_that_is_no_file_is_a_note_never_a_hang_or_silence(
    tmp_path: Path, kind: str, said: str
) -> None:
    folder = job_folder(tmp_path / "job")
    _config_not_a_file(folder, kind)
    code, stdout, stderr = cli("analyze", str(folder), "-j", "1", "--format", "json")
    assert code == 0, stderr
    notes = [n for n in json.loads(stdout)["notes"] or [] if "ds_config.json" in n]
    assert len(notes) == 1 and said in notes[0] and "not read" in notes[0], notes
    report = overlapcheck.analyze(folder, jobs=1)
    assert any(said in n and "ds_config.json" in n for n in report.notes or []), report.notes


def test_an_unreadable_ds_config_json_is_one_error_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = job_folder(tmp_path / "job", config={"zero_optimization": {"stage": 3}})
    real_open = os.open

    def no_access(path: Any, *args: Any, **kwargs: Any) -> int:
        if os.fspath(path).endswith("ds_config.json"):
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", no_access)  # as root, chmod 000 reads on: the refusal is what is tested
    code, stdout, stderr = cli("analyze", str(folder), "-j", "1")
    assert code == 2 and "ds_config.json" in stderr and "Permission denied" in stderr and stdout == "", stderr


def test_a_run_json_of_another_schema_is_noted_beside_a_ds_config(tmp_path: Path) -> None:
    folder = job_folder(tmp_path / "job", config={"zero_optimization": {"stage": 3}})
    (folder / "run.json").write_text(json.dumps({"schema": "someone-else/9"}))
    report = overlapcheck.analyze(folder, jobs=1)
    assert any("someone-else/9" in n for n in report.notes or []), report.notes  # sanitize_config's notes replaced it


def test_a_report_written_as_ds_config_json_is_not_read_as_the_config(tmp_path: Path) -> None:
    """`analyze DIR -o DIR/ds_config.json --format json`: the next analysis of DIR must not read its own report
    as the job's DeepSpeed config (its keys would silently stand for none of the config's)."""
    folder = job_folder(tmp_path / "job")
    code, _, stderr = cli("analyze", str(folder), "-j", "1", "--format", "json", "-o", str(tmp_path / "r.json"))
    assert code == 0, stderr
    shutil.copy(tmp_path / "r.json", folder / "ds_config.json")  # `-o DIR/ds_config.json` is refused (below); cp is not
    report = overlapcheck.analyze(folder, jobs=1)
    assert any("overlapcheck document" in n and "ignored" in n for n in report.notes or []), report.notes


@pytest.mark.parametrize(
    ("kwargs", "api_said", "cli_args", "cli_said"),
    [
        ({"ranks": []}, "ranks=[] selects none of the inputs", None, None),
        ({"steps": []}, "steps=[] selects no step", None, None),
        ({"ranks": [99]}, "ranks=[99] selects none", ["--ranks", "99"], "--ranks 99 selects none"),
        ({"steps": [9, 10]}, "steps=[9, 10] selects no step", ["--steps", "9,10"], "--steps 9:10 selects no step"),
        ({"ranks": range(100, 10**6)}, "ranks=[100, 101,", ["--ranks", "100-999999"], "--ranks 100-999999 selects"),
        ({"rank_from": ""}, "rank_from='' is empty", ["--rank-from", ""], "--rank-from '' is empty"),
        ({"rank_from": "("}, "rank_from='(' is not a regular", ["--rank-from", "("], "--rank-from '(' is not a"),
    ],
)
def test_a_selection_error_names_it_as_its_caller_wrote_it(
    tmp_path: Path, kwargs: dict, api_said: str, cli_args: list[str] | None, cli_said: str | None
) -> None:
    folder = job_folder(tmp_path / "job")
    with pytest.raises(UserError) as caught:
        overlapcheck.analyze(folder, jobs=1, **kwargs)
    assert api_said in str(caught.value) and "--" not in str(caught.value), caught.value  # was: "--ranks  selects"
    if cli_args is not None:
        code, stdout, stderr = cli("analyze", str(folder), "-j", "1", *cli_args)
        assert code == 2 and cli_said in stderr and stdout == "", stderr


def test_a_rank_from_that_matches_no_path_names_the_api_parameter(tmp_path: Path) -> None:
    # round 3 (r3-api): one UserError, no longer a report with one error per file
    with pytest.raises(UserError, match=r"^rank_from=r'gpu\(\\d\+\)' does not match any of the 2 traces' paths"):
        overlapcheck.analyze(job_folder(tmp_path / "job"), jobs=1, rank_from="gpu(\\d+)")


def test_a_rank_selection_with_rank_from_lists_the_ranks_the_pattern_reads(tmp_path: Path) -> None:
    folder = tmp_path / "job"
    folder.mkdir()
    for r in range(2):
        (folder / f"gpu{r}-x.json").write_bytes(doc_bytes(rank=r, world=2))
    code, stdout, stderr = cli("analyze", str(folder), "-j", "1", "--rank-from", r"gpu(\d+)", "--ranks", "5")
    assert code == 2 and "--ranks 5 selects none of the inputs: the inputs hold rank(s) 0-1" in stderr, stderr
    # was: "... no file name states a rank", though --rank-from reads 0 and 1 in them


@pytest.mark.parametrize("command", ["gate", "compare", "baseline"])
def test_a_report_with_an_integer_beyond_a_float_is_malformed_not_a_traceback(tmp_path: Path, command: str) -> None:
    report = tmp_path / "report.json"
    code, _, stderr = cli("analyze", str(job_folder(tmp_path / "job")), "-j", "1", "--format", "json", "-o",
                          str(report))  # fmt: skip
    assert code == 0, stderr
    doc = json.loads(report.read_text())
    doc["ranks"][0]["span_us"] = 0  # then written as a 400-digit integer: valid JSON, beyond any float
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(doc).replace('"span_us": 0', '"span_us": ' + "9" * 400, 1))
    args = {
        "gate": ["gate", str(edited), "--min-overlap", "all=0.5"],
        "compare": ["compare", str(edited), str(report)],
        "baseline": ["gate", str(report), "--baseline", str(edited)],
    }[command]
    code, _, stderr = cli(*args)  # was: OverflowError (int too large to convert to float)
    assert code == 2 and "ranks[0].span_us is not a finite number" in stderr, stderr


def test_a_report_without_ranks_is_refused_as_a_baseline(tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    code, _, stderr = cli("analyze", str(job_folder(tmp_path / "job")), "-j", "1", "--format", "json", "-o",
                          str(report))  # fmt: skip
    doc = json.loads(report.read_text())
    doc["ranks"] = []
    report.write_text(json.dumps(doc))
    code, stdout, stderr = cli("baseline", "save", str(report), str(tmp_path / "base.json"))
    assert code == 2 and "no ranks" in stderr and stdout == "", stderr  # was: "saved baseline: 0 ranks", exit 0
    assert not (tmp_path / "base.json").exists()


@pytest.mark.parametrize("run_json", [None, "{}", '{"schema": "someone-else/1"}', "fifo"])
def test_run_force_never_empties_a_folder_that_is_no_earlier_run(tmp_path: Path, run_json: str | None) -> None:
    # was: `run --out traces/ --force` deleted the folder's rank*.trace.json.gz, its traces/ and its summaries
    folder = tmp_path / "real"
    (folder / "traces").mkdir(parents=True)
    (folder / "rank0.trace.json.gz").write_bytes(b"real trace")
    (folder / "traces" / "rank1.pt.trace.json.gz").write_bytes(b"another")
    (folder / "rank0.summary.json").write_text("{}")
    if run_json == "fifo":
        if not hasattr(os, "mkfifo"):
            pytest.skip("needs FIFOs")
        os.mkfifo(folder / "run.json")
    elif run_json is not None:
        (folder / "run.json").write_text(run_json)
    before = sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))
    code, _, stderr = cli("run", "--out", str(folder), "--force", "--summary-timeout", "1", "--", "true")
    assert code == 2 and "never replaced, even with --force" in stderr, stderr
    assert sorted(str(p.relative_to(folder)) for p in folder.rglob("*")) == before
    assert (folder / "rank0.trace.json.gz").read_bytes() == b"real trace"


def test_run_force_replaces_an_earlier_run_and_keeps_a_trace_beside_it(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    args = ["run", "--out", str(folder), "--summary-timeout", "1", "--", "true"]
    assert cli(*args)[0] == 0
    (folder / "rank0.trace.json.gz").write_bytes(b"copied here by hand")  # run writes traces in traces/ only
    code, _, stderr = cli(*args[:3], "--force", *args[3:])
    assert code == 0, stderr
    assert (folder / "rank0.trace.json.gz").read_bytes() == b"copied here by hand"


@pytest.mark.parametrize("folder_name", ["traces", "status"])
def test_run_force_never_writes_through_a_linked_traces_or_status_folder(tmp_path: Path, folder_name: str) -> None:
    # was: rmtree failed on the link silently, and the new trace replaced another folder's rank0.pt.trace.json.gz
    folder = tmp_path / "run"
    args = ["run", "--out", str(folder), "--summary-timeout", "1", "--", "true"]
    assert cli(*args)[0] == 0
    other = tmp_path / "other"
    other.mkdir()
    (other / "rank0.pt.trace.json.gz").write_bytes(b"another job's trace")
    shutil.rmtree(folder / folder_name, ignore_errors=True)
    (folder / folder_name).symlink_to(other)
    code, _, stderr = cli(*args[:3], "--force", *args[3:])
    assert code == 2 and "symbolic link" in stderr and len(stderr.splitlines()) == 1, stderr
    assert (other / "rank0.pt.trace.json.gz").read_bytes() == b"another job's trace"
    assert (folder / "run.json").exists()  # refused before anything was deleted


@pytest.mark.parametrize("foreign", ["traces/NOTES.txt", "traces/other-job-rank3.json.gz", "traces/keep/x.txt",
                                     "status/mine.txt"])  # fmt: skip
def test_run_force_deletes_only_the_files_run_wrote_and_refuses_a_folder_with_others(
    tmp_path: Path, foreign: str
) -> None:
    # was: --force deleted the whole traces/ and status/, a note, another job's trace and a subfolder with them
    folder = tmp_path / "run"
    args = ["run", "--out", str(folder), "--summary-timeout", "1", "--", "true"]
    assert cli(*args)[0] == 0
    (folder / "traces").mkdir(exist_ok=True)
    (folder / "traces" / "rank0.pt.trace.json.gz").write_bytes(b"the earlier run's trace")
    (folder / foreign).parent.mkdir(parents=True, exist_ok=True)
    (folder / foreign).write_text("the user's")
    code, _, stderr = cli(*args[:3], "--force", *args[3:])
    assert code == 2 and "never deleted, even with --force" in stderr and Path(foreign).parts[1] in stderr, stderr
    assert (folder / foreign).read_text() == "the user's"
    assert (folder / "traces" / "rank0.pt.trace.json.gz").exists()  # nothing deleted on a refusal
    (folder / foreign).unlink()
    if len(Path(foreign).parts) > 2:
        (folder / foreign).parent.rmdir()
    code, _, stderr = cli(*args[:3], "--force", *args[3:])
    assert code == 0, stderr
    assert not (folder / "traces" / "rank0.pt.trace.json.gz").exists()  # its own files are replaced


@pytest.mark.parametrize("seconds", ["nan", "inf", "-1", "1e300"])
def test_a_summary_timeout_that_never_ends_is_refused_before_the_job_runs(tmp_path: Path, seconds: str) -> None:
    # was: accepted; a NaN deadline is never reached, so a stuck summary made the launcher wait forever
    marker = tmp_path / "ran"
    code, _, stderr = cli("run", "--out", str(tmp_path / "run"), "--summary-timeout", seconds, "--",
                          "touch", str(marker))  # fmt: skip
    assert code == 2 and "--summary-timeout" in stderr, stderr
    assert not marker.exists() and not (tmp_path / "run").exists()


@pytest.mark.parametrize("shape", ["broken-link", "link-loop", "under-a-file"])
def test_simulate_into_a_folder_that_cannot_be_made_is_one_line(tmp_path: Path, shape: str) -> None:
    out = tmp_path / "out"
    if shape == "broken-link":
        out.symlink_to(tmp_path / "nowhere")
    elif shape == "link-loop":
        out.symlink_to(out)
    else:
        (tmp_path / "afile").write_text("x")
        out = tmp_path / "afile" / "sub"
    code, _, stderr = cli("simulate", "--out", str(out), "--steps", "1", "--nodes", "1", "--gpus-per-node", "1")
    assert code == 2 and str(out) in stderr and len(stderr.splitlines()) == 1, stderr  # was: FileExistsError


def test_simulate_force_over_a_folder_named_like_a_trace_is_one_line(tmp_path: Path) -> None:
    small = ["--steps", "1", "--nodes", "1", "--gpus-per-node", "2"]
    sim = tmp_path / "sim"
    assert cli("simulate", "--out", str(sim), *small)[0] == 0
    (sim / "rank7.trace.json.gz").mkdir()
    (sim / "rank7.trace.json.gz" / "kept.txt").write_text("the user's")
    code, _, stderr = cli("simulate", "--out", str(sim), *small, "--force")
    assert code == 2 and "rank7.trace.json.gz" in stderr and len(stderr.splitlines()) == 1, (
        stderr
    )  # was: IsADirectoryError
    assert (sim / "rank7.trace.json.gz" / "kept.txt").read_text() == "the user's"
    assert (sim / "rank0.trace.json.gz").exists()  # refused before anything was deleted


@pytest.mark.parametrize("name", ["ds_config.json", "truth.json"])
def test_simulate_force_never_writes_through_a_link_into_another_folder(tmp_path: Path, name: str) -> None:
    small = ["--steps", "1", "--nodes", "1", "--gpus-per-node", "1"]
    sim = tmp_path / "sim"
    assert cli("simulate", "--out", str(sim), *small)[0] == 0
    other = tmp_path / "other"
    other.mkdir()
    (other / name).write_bytes((sim / name).read_bytes())  # another job's file (a simulation's, for truth.json)
    before = (other / name).read_bytes()
    (sim / name).unlink()
    (sim / name).symlink_to(other / name)
    code, _, stderr = cli("simulate", "--out", str(sim), *small, "--seed", "7", "--scenario", "no-prefetch",
                          "--force")  # fmt: skip
    assert code == 0, stderr
    assert (other / name).read_bytes() == before  # was: replaced through the link
    assert not (sim / name).is_symlink() and json.loads((sim / name).read_text())


@pytest.mark.parametrize("command", ["analyze", "gate", "compare"])
@pytest.mark.parametrize("columns", ["0", "5", "-5"])
def test_a_columns_that_is_no_width_is_ignored_never_an_empty_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: str, columns: str
) -> None:
    folder = job_folder(tmp_path / "job")
    report = tmp_path / "report.json"
    assert cli("analyze", str(folder), "-j", "1", "--format", "json", "-o", str(report))[0] == 0
    monkeypatch.setenv("COLUMNS", columns)
    args = {
        "analyze": ["analyze", str(folder), "-j", "1"],
        "gate": ["gate", str(report), "--min-overlap", "all=0.1"],
        "compare": ["compare", str(report), str(report)],
    }[command]
    code, stdout, stderr = cli(*args)
    assert code in (0, 1) and "overlap" in stdout and len(stdout) > 500, (stdout, stderr)  # was: nothing, exit 0


def test_a_columns_of_a_billion_is_ignored_never_a_hang(tmp_path: Path) -> None:
    import subprocess
    import sys

    folder = job_folder(tmp_path / "job")
    env = {**os.environ, "COLUMNS": "999999999", "PYTHONPATH": str(Path(overlapcheck.__file__).parent.parent)}
    done = subprocess.run([sys.executable, "-m", "overlapcheck", "analyze", str(folder), "-j", "1"], env=env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0 and "overlap" in done.stdout, done.stderr  # was: still rendering after 60 s


@pytest.mark.parametrize("victim", ["report", "baseline", "trace", "ds_config"])
def test_the_step_summary_is_never_appended_to_an_input(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, victim: str
) -> None:
    # was: GITHUB_STEP_SUMMARY naming the gated report appended Markdown to it (no longer JSON), and a trace's
    # gzip got Markdown at its end
    folder = job_folder(tmp_path / "job", config={"zero_optimization": {"stage": 3}})
    report, base = tmp_path / "report.json", tmp_path / "base.json"
    for out in (report, base):
        assert cli("analyze", str(folder), "-j", "1", "--format", "json", "-o", str(out))[0] == 0
    (folder / "rank0.trace.json.gz").write_bytes(gzip.compress(doc_bytes(rank=0)))
    target = {"report": report, "baseline": base, "trace": folder / "rank0.trace.json.gz",
              "ds_config": folder / "ds_config.json"}[victim]  # fmt: skip
    before = {p: p.read_bytes() for p in (report, base, *folder.iterdir()) if p.is_file()}
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(target))
    code, _, stderr = cli("gate", str(report), "--baseline", str(base), "--min-overlap", "all=0.1")
    assert code == 2 and "$GITHUB_STEP_SUMMARY" in stderr and str(target) in stderr, stderr
    assert {p: p.read_bytes() for p in before} == before


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_step_summary_that_is_a_fifo_is_refused_never_a_hang(tmp_path: Path) -> None:
    import subprocess
    import sys

    report = tmp_path / "report.json"
    assert cli("analyze", str(job_folder(tmp_path / "job")), "-j", "1", "--format", "json", "-o", str(report))[0] == 0
    os.mkfifo(tmp_path / "fifo")
    env = {**os.environ, "GITHUB_STEP_SUMMARY": str(tmp_path / "fifo"),
           "PYTHONPATH": str(Path(overlapcheck.__file__).parent.parent)}  # fmt: skip
    done = subprocess.run([sys.executable, "-m", "overlapcheck", "gate", str(report), "--min-overlap", "all=0.1"],
                          env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 2 and "is a FIFO" in done.stderr, done.stderr  # was: blocked in open() forever


def test_the_step_summary_still_appends_to_its_file_and_dev_null_is_nowhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    report = tmp_path / "report.json"
    assert cli("analyze", str(job_folder(tmp_path / "job")), "-j", "1", "--format", "json", "-o", str(report))[0] == 0
    summary = tmp_path / "summary.md"
    summary.write_text("earlier step\n")
    for target in (summary, Path(os.devnull)):
        monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(target))
        code, _, stderr = cli("gate", str(report), "--min-overlap", "all=0.1")
        assert code in (0, 1), stderr
    assert summary.read_text().startswith("earlier step\n### ")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_run_folder_whose_run_json_is_a_fifo_is_read_with_a_note(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "traces").mkdir(parents=True)
    for r in range(2):
        (run / "traces" / f"rank{r}.pt.trace.json").write_bytes(doc_bytes(rank=r, world=2))
    os.mkfifo(run / "run.json")
    code, stdout, stderr = cli("report", str(run), "-j", "1", "--format", "json")
    assert code == 0, stderr  # was: "no trace files in this folder", the traces in traces/ unseen
    doc = json.loads(stdout)
    assert [r["rank"] for r in doc["ranks"]] == [0, 1]
    assert any("run.json is a FIFO" in n for n in doc["notes"]), doc["notes"]


def test_no_trace_files_in_a_folder_lists_the_subfolders_that_hold_some(tmp_path: Path) -> None:
    job_folder(tmp_path / "top" / "job")
    code, _, stderr = cli("analyze", str(tmp_path / "top"), "-j", "1")
    assert code == 2 and "job/ holds 2 trace file(s): give that folder" in stderr, stderr


@pytest.mark.parametrize("name", ["text", "json", "markdown", "html", "perfetto"])
@pytest.mark.parametrize("document", [None, {"schema": "overlapcheck.report/1"}, "report.json"])
def test_api_a_renderer_given_no_report_is_a_user_error(name: str, document: Any) -> None:
    from overlapcheck.report import renderer

    with pytest.raises(UserError, match="a renderer takes a Report"):  # was: AttributeError / TypeError inside
        renderer(name).render(document)


@pytest.mark.parametrize("address", ["", "tcp://", "inproc://x", "file:///etc/passwd"])
def test_a_scheduler_address_that_is_no_address_is_one_line_and_no_exit_traceback(address: str) -> None:
    # was: a Client was built for each, its one-line error followed, 20 s later, by a Client.__del__ traceback;
    # '' was taken as not given and ran locally
    r = builders.run_cli("analyze", str(SAMPLES / "healthy"), "-j", "1", "--scheduler", address)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "neither a scheduler address" in r.stderr


def test_api_perfetto_of_a_report_without_ranks_is_a_user_error_not_an_empty_trace() -> None:
    # was: an empty traceEvents list whose metadata said "one rank: no alignment needed", without a word
    import dataclasses

    from builders import make_report

    from overlapcheck.report import renderer

    report = dataclasses.replace(make_report(), ranks=[])
    with pytest.raises(UserError, match="no ranks"):
        renderer("perfetto").render(report)


@pytest.mark.parametrize("option", ["-o", "--html", "--perfetto"])
def test_report_never_writes_over_a_run_folders_status_record(tmp_path: Path, option: str) -> None:
    # was: `report RUN -o RUN/status/launcher0.json --force` replaced the launcher's record with the report
    run = _run_with_summaries(tmp_path / "run", lambda r, doc: doc)
    record = run / "status" / "launcher0.json"
    record.parent.mkdir(exist_ok=True)
    record.write_text('{"node_rank": 0}')
    code, _, stderr = cli("report", str(run), "-j", "1", option, str(record), "--force")
    assert code == 2 and "status record" in stderr, stderr
    assert record.read_text() == '{"node_rank": 0}'


def test_api_text_of_a_report_without_ranks_or_errors_says_nothing_was_measured() -> None:
    # was: the text renderer printed only a note about module frames: no verdict, no word of 0 ranks
    import dataclasses

    from builders import make_report

    from overlapcheck.analysis.crossrank import summarize
    from overlapcheck.report import renderer

    report = dataclasses.replace(make_report(), ranks=[], findings=[], errors=[], summary=summarize([]))
    assert "0 rank(s): no communication to measure" in renderer("text").render(report)


# ---- round 5: the leftovers of round 2 -----------------------------------------------------------------------


def _digests_in_run_json(run: Path) -> None:
    """run.json as `overlapcheck run` writes it: each rank's summary with the sha256 of its file."""
    import hashlib

    ranks = [{"rank": r, "summary": {"status": "ok", "file": f"rank{r}.summary.json",
                                     "sha256": hashlib.sha256((run / f"rank{r}.summary.json").read_bytes()).hexdigest()}}
             for r in range(2)]  # fmt: skip
    (run / "run.json").write_text(json.dumps({"world_size": 2, "ranks": ranks}))


@pytest.mark.parametrize("traces", [True, False], ids=["with-traces", "summaries-only"])
def test_another_jobs_summary_in_a_run_folder_is_not_taken_for_this_ones(tmp_path: Path, traces: bool) -> None:
    # was: a rank1.summary.json copied from another job of the same world size was reported as this run's rank 1
    run = _run_with_summaries(tmp_path / "run", lambda r, doc: doc, traces=traces)
    _digests_in_run_json(run)
    other = _run_with_summaries(tmp_path / "other", _another_jobs_numbers)
    shutil.copy(other / "rank1.summary.json", run / "rank1.summary.json")
    code, stdout, stderr = cli("report", str(run), "-j", "1", "--format", "json")
    if traces:
        assert code == 0, stderr
        ranks = json.loads(stdout)["ranks"]
        assert [r["collectives"]["all"]["overlap"] for r in ranks] == [0.5, 0.5]  # rank 1 as its own trace says
        assert any("rank1.summary.json was not used" in n and "not the summary this run wrote" in n
                   for n in ranks[1]["notes"]), ranks[1]["notes"]  # fmt: skip
    else:
        assert code == 2 and "rank1.summary.json: not the summary this run wrote" in stderr, stderr


def _another_jobs_numbers(r: int, doc: dict[str, Any]) -> dict[str, Any]:
    doc["ranks"][0]["collectives"]["all"]["overlap"] = 0.99  # another job's number, plausible on its face
    return doc


def test_the_run_folders_own_summaries_pass_the_digest(tmp_path: Path) -> None:
    run = _run_with_summaries(tmp_path / "run", lambda r, doc: doc, traces=False)
    _digests_in_run_json(run)
    code, stdout, stderr = cli("report", str(run), "-j", "1", "--format", "json")
    assert code == 0 and len(json.loads(stdout)["ranks"]) == 2, stderr


def test_the_summary_process_records_the_digest_of_what_it_wrote(tmp_path: Path) -> None:
    import hashlib

    from overlapcheck.capture.summary import write_summary

    trace = tmp_path / "rank0.json"
    trace.write_bytes(doc_bytes(rank=0, world=2))
    out, status = tmp_path / "rank0.summary.json", tmp_path / "status.json"
    assert write_summary(str(trace), str(out), str(status))
    assert json.loads(status.read_text())["sha256"] == hashlib.sha256(out.read_bytes()).hexdigest()


@pytest.mark.parametrize("where", ["evidence", "run"])
@pytest.mark.parametrize("command", ["gate", "compare"])
def test_a_nan_in_a_reports_free_form_fields_is_malformed(tmp_path: Path, where: str, command: str) -> None:
    # was: NaN in a finding's evidence (or in run) was read, and shown as "nan" by every renderer
    from builders import make_report

    doc = make_report().to_dict()
    assert doc["findings"], "the builder's report has findings"
    if where == "evidence":
        doc["findings"][0]["evidence"]["bytes"] = float("nan")
    else:
        doc["run"] = {"world_size": 2, "launches": [{"seconds": float("inf")}]}
    (tmp_path / "r.json").write_text(json.dumps(doc))  # json writes NaN / Infinity, as an editor might
    args = (
        ["gate", str(tmp_path / "r.json"), "--min-overlap", "all=0.1"]
        if command == "gate"
        else ["compare", *[str(tmp_path / "r.json")] * 2]
    )
    code, _, stderr = cli(*args)
    assert code == 2 and "not a finite number" in stderr, stderr


def test_perfetto_of_summaries_without_traces_says_so_in_the_clis_words_and_writes_nothing(tmp_path: Path) -> None:
    # was: "analyze with timelines=True (the CLI's --perfetto does)", the API's flag, after -o was written
    run = _run_with_summaries(tmp_path / "run", lambda r, doc: doc, traces=False)
    out, timeline = tmp_path / "r.json", tmp_path / "t.json.gz"
    code, _, stderr = cli(
        "report", str(run), "-j", "1", "-o", str(out), "--format", "json", "--perfetto", str(timeline)
    )
    assert code == 2 and "--perfetto: no rank has events" in stderr and "timelines=True" not in stderr, stderr
    assert not out.exists() and not timeline.exists()


def test_perfetto_of_unreadable_inputs_lists_each_inputs_error(tmp_path: Path) -> None:
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "rank0.json").write_text("{")
    code, _, stderr = cli("analyze", str(tmp_path / "job"), "--perfetto", str(tmp_path / "t.json"))
    assert code == 2 and "rank0.json: " in stderr and "no ranks" not in stderr, stderr


@pytest.mark.parametrize("name", ["rank2.summary.json", "run.json", "ds_config.json", "model.json", "truth.json"])
@pytest.mark.parametrize("option", ["-o", "--html", "--perfetto"])
def test_an_output_is_never_named_as_a_document_its_folder_is_read_for(tmp_path: Path, name: str, option: str) -> None:
    # was: `report RUN -o RUN/rank2.summary.json` was written, and every later `report RUN` failed on it
    run = _run_with_summaries(tmp_path / "run", lambda r, doc: doc)
    target = run / name
    existed = target.exists()
    before = target.read_bytes() if existed else None
    code, _, stderr = cli("report", str(run), "-j", "1", option, str(target))
    assert code == 2 and ("choose another name" in stderr or existed and "is also an input" in stderr), stderr
    assert (target.read_bytes() if target.exists() else None) == before
    code, _, stderr = cli("report", str(run), "-j", "1", "--format", "json")
    assert code == 0, stderr


def test_a_trace_of_another_size_than_run_json_records_is_said(tmp_path: Path) -> None:
    # was: a run folder's traces/ could hold another job's trace of the same world size, read without a word
    run = _run_with_summaries(tmp_path / "run", lambda r, doc: doc)
    for r in range(2):
        (run / f"rank{r}.summary.json").unlink()
    sizes = {r: (run / "traces" / f"rank{r}.json").stat().st_size for r in range(2)}
    ranks = [{"rank": r, "capture": {"trace": f"traces/rank{r}.json", "trace_bytes": sizes[r]}} for r in range(2)]
    (run / "run.json").write_text(json.dumps({"world_size": 2, "ranks": ranks}))
    assert not any("run.json records" in n for n in overlapcheck.analyze(run, jobs=1).notes or [])
    (run / "traces" / "rank1.json").write_bytes(doc_bytes(rank=1, world=2) + b"\n" * 7)  # another job's, as said
    notes = overlapcheck.analyze(run, jobs=1).notes or []
    said = [n for n in notes if "traces differ from what run.json records" in n]
    assert said and f"rank1.json: {sizes[1]:,} bytes in run.json, {sizes[1] + 7:,} now" in said[0], notes


# ---- round 3 (r3-main): what the third hostile round found ------------------------------------------------------


@pytest.mark.parametrize("module", ["ff[/]", "[red]mlp", "[link=x]h"])
def test_module_names_with_brackets_are_shown_as_written_never_as_markup(tmp_path: Path, module: str) -> None:
    # was: a model's `nn.ModuleDict({"ff[/]": ...})` made the text report raise rich's MarkupError (exit 1)
    from builders import frame, launch, step, write_trace

    events = [
        step(1, 0, 1000),
        frame("nn.Module: Net_0", 20, 800),
        frame(f"nn.Module: {module}", 100, 100),
        launch(110, corr=1),
        kernel("ncclDevKernel_AllGather_RING_LL", 200, 100, stream=20),
        builders.kernel(GEMM, 250, 100, 7),
    ]
    trace = write_trace(tmp_path, "rank0.json.gz", events, world_size=1)
    code, stdout, stderr = cli("analyze", str(trace), "-j", "1")
    assert code == 0 and "Traceback" not in stderr, stderr
    assert f"Net_0.{module}" in stdout, stdout


def _bare_list_trace() -> bytes:  # torch 1.8: no top-level object, no Kineto keys
    return json.dumps(good_events()).encode()


def _metadata_first_trace() -> bytes:  # a TraceLens-style export: other keys first, then traceEvents
    return json.dumps({"otherData": {"tool": "x"}, "traceEvents": good_events()}).encode()


def _bom_bare_list_trace() -> bytes:  # torch 1.8's list, saved by an editor with a byte order mark
    return b"\xef\xbb\xbf" + _bare_list_trace()


def _long_first_event_trace() -> bytes:  # the first event's "ph" key is past the 64 KiB that are looked at
    events = good_events()
    events[0] = {"args": {"note": "x" * 70000}, **events[0]}
    return json.dumps(events).encode()


@pytest.mark.parametrize(
    "make",
    [_bare_list_trace, _metadata_first_trace, _bom_bare_list_trace, _long_first_event_trace],
    ids=["bare-list", "metadata-first", "bom-bare-list", "long-first-event"],
)
@pytest.mark.parametrize("gz", [False, True], ids=["json", "gz"])
@pytest.mark.parametrize("option", ["-o", "--html", "--perfetto"])
def test_force_never_replaces_a_trace_without_kinetos_keys(
    tmp_path: Path, make: Callable[[], bytes], gz: bool, option: str
) -> None:
    # was: `-o worker0.pt.trace.json.gz --force` replaced torch 1.8's trace (its head has none of Kineto's keys)
    data = gzip.compress(make()) if gz else make()
    victim = tmp_path / ("worker0.pt.trace.json" + (".gz" if gz else ""))
    victim.write_bytes(data)
    assert overlapcheck.analyze(victim, jobs=1).ranks  # a trace overlapcheck reads
    extra = ["--format", "json"] if option == "-o" else []
    code, _, stderr = cli(
        "analyze", str(job_folder(tmp_path / "job")), "-j", "1", *extra, option, str(victim), "--force"
    )
    assert code == 2 and "is a profiler trace" in stderr, stderr
    assert victim.read_bytes() == data


@pytest.mark.parametrize("option", ["-o", "--html", "--perfetto"])
def test_force_still_replaces_each_of_its_own_outputs(tmp_path: Path, option: str) -> None:
    folder = job_folder(tmp_path / "job")
    target = tmp_path / ("out.json" if option != "--html" else "out.html")
    extra = ["--format", "json"] if option == "-o" else []
    for _ in range(2):
        code, _, stderr = cli("analyze", str(folder), "-j", "1", *extra, option, str(target), "--force")
        assert code == 0, stderr


@pytest.mark.parametrize("option", ["--junit", "--markdown"])
def test_the_step_summary_is_never_also_an_output(tmp_path: Path, option: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # was: GITHUB_STEP_SUMMARY=S gate r.json --junit S --force replaced the earlier steps' summary by the XML,
    # then appended the Markdown to it
    code, _, _ = cli("analyze", str(job_folder(tmp_path / "job")), "--format", "json", "-j", "1", "-o",
                     str(tmp_path / "r.json"))  # fmt: skip
    summary = tmp_path / "summary.md"
    summary.write_text("## Earlier CI step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    code, _, stderr = cli("gate", str(tmp_path / "r.json"), "--min-overlap", "all=0.1", option, str(summary), "--force")
    assert code == 2 and "is also an output of this command" in stderr, stderr
    assert summary.read_text() == "## Earlier CI step\n"


@pytest.mark.parametrize("encoding", ["ascii", "latin-1"])
def test_an_output_stream_that_cannot_hold_unicode_gets_escapes_never_a_traceback(
    tmp_path: Path, encoding: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # was: PYTHONIOENCODING=ascii gate ... raised UnicodeEncodeError on '≥' and exited 1, as a failed gate does
    import subprocess
    import sys

    code, _, _ = cli("analyze", str(job_folder(tmp_path / "job")), "--format", "json", "-j", "1", "-o",
                     str(tmp_path / "r.json"))  # fmt: skip
    monkeypatch.setenv("PYTHONIOENCODING", encoding)
    for args in (["gate", str(tmp_path / "r.json"), "--min-overlap", "all=0.1"],
                 ["compare", str(tmp_path / "r.json"), str(tmp_path / "r.json")],
                 ["analyze", str(tmp_path / "job"), "-j", "1", "--format", "markdown"]):  # fmt: skip
        r = subprocess.run([sys.executable, "-m", "overlapcheck", *args], capture_output=True, timeout=120)
        assert r.returncode == 0 and b"Traceback" not in r.stderr, (args, r.stderr[-500:])
        assert r.stdout.strip(), args


@pytest.mark.parametrize("traces", [True, False], ids=["with-traces", "summaries-only"])
def test_a_ds_config_given_to_report_is_applied_or_said_not_to_be(tmp_path: Path, traces: bool) -> None:
    # was: `report RUN --ds-config X` took each summary's findings, made under the run's own config, and X was
    # silently applied to none of them (the README's CI line)
    run = _run_with_summaries(tmp_path / "run", _another_jobs_numbers, traces=traces)
    config = tmp_path / "ds.json"
    config.write_text(json.dumps({"zero_optimization": {"stage": 3, "overlap_comm": True}}))
    code, stdout, stderr = cli("report", str(run), "-j", "1", "--format", "json", "--ds-config", str(config))
    assert code == 0, stderr
    ranks = json.loads(stdout)["ranks"]
    if traces:  # read from the traces, under the config given
        assert [r["collectives"]["all"]["overlap"] for r in ranks] == [0.5, 0.5]
    else:
        assert all(any("--ds-config not applied" in n for n in r["notes"]) for r in ranks), ranks
    api = overlapcheck.analyze(run, ds_config=json.loads(config.read_text()), jobs=1)
    assert traces or any("ds_config= not applied" in n for n in api.ranks[0].notes)


def test_two_folders_with_different_ds_configs_say_which_one_is_used(tmp_path: Path) -> None:
    # was: the first folder's ds_config.json won silently, so the fix depended on the order of the arguments
    a = job_folder(tmp_path / "node0", config={"zero_optimization": {"stage": 3, "reduce_bucket_size": 10**9}})
    b = tmp_path / "node1"
    b.mkdir()
    (a / "rank1.json").rename(b / "rank1.json")
    (b / "ds_config.json").write_text(json.dumps({"zero_optimization": {"stage": 3, "reduce_bucket_size": 5 * 10**7}}))
    for first, second in ((a, b), (b, a)):
        notes = overlapcheck.analyze([first, second], jobs=1).notes or []
        said = [n for n in notes if "differs from" in n]
        assert said and f"{second / 'ds_config.json'} differs from {first / 'ds_config.json'}, which is used" in said[0]
    (b / "ds_config.json").write_text((a / "ds_config.json").read_text())  # the same config: nothing to say
    assert not any("differs from" in n for n in overlapcheck.analyze([a, b], jobs=1).notes or [])


def test_a_trace_whose_name_holds_report_or_baseline_is_read_when_it_states_a_rank(tmp_path: Path) -> None:
    # was: `node-baseline_rank1.pt.trace.json.gz` was skipped for the word "baseline": rank 1 vanished, exit 0
    folder = tmp_path / "job"
    folder.mkdir()
    (folder / "node-a_rank0.pt.trace.json").write_bytes(doc_bytes(rank=0, world=2))
    (folder / "node-baseline_rank1.pt.trace.json").write_bytes(doc_bytes(rank=1, world=2))
    (folder / "Report.json").write_bytes(doc_bytes(rank=None))  # a name that states no rank: skipped, and said
    report = overlapcheck.analyze(folder, jobs=1)
    assert [r.rank for r in report.ranks] == [0, 1]
    assert any("not read as traces: Report.json" in n for n in report.notes or []), report.notes
    code, _, _ = cli("analyze", str(folder), "-j", "1", "--format", "json", "-o", str(folder / "report.json"))
    assert code == 0  # overlapcheck's own report beside the traces is skipped unsaid
    (said,) = [n for n in overlapcheck.analyze(folder, jobs=1).notes or [] if "not read as traces" in n]
    assert "Report.json" in said and "report.json" not in said, said


def _shifted(events: list[dict[str, Any]], by_us: float) -> list[dict[str, Any]]:
    return [{**e, "ts": e["ts"] + by_us} if "ts" in e else e for e in events]


@pytest.mark.parametrize(("apart_s", "refused"), [(3600, True), (301, True), (20, False)])
def test_traces_of_two_runs_of_one_world_size_are_not_taken_for_one_job(
    tmp_path: Path, apart_s: float, refused: bool
) -> None:
    # was: rank 1 of a run an hour later beside rank 0: exit 0, a straggler "found" in the hour between them
    folder = tmp_path / "job"
    folder.mkdir()
    (folder / "rank0.json").write_bytes(doc_bytes(rank=0, world=2))
    (folder / "rank1.json").write_bytes(doc_bytes(_shifted(good_events(), apart_s * 1e6), rank=1, world=2))
    code, _, stderr = cli("analyze", str(folder), "-j", "1")
    if refused:
        assert code == 2 and "more than one run: rank 1's steps start" in stderr, stderr
    else:  # clocks of two hosts a few seconds apart: one job
        assert code == 0, stderr


@pytest.mark.parametrize(("base_apart_s", "ts_apart_s", "refused"), [
    (86400, 0, True),  # torch 2: ts count from each process's base time; two runs a day apart share their ts
    (0, 0, False),
    (3600, -3600, False),  # two hosts whose base times differ, ts make up for it: the same moments
])  # fmt: skip
def test_traces_of_two_runs_apart_only_in_their_base_time_are_not_taken_for_one_job(
    tmp_path: Path, base_apart_s: float, ts_apart_s: float, refused: bool
) -> None:
    # was: only ts compared, so a run a day later (its baseTimeNanoseconds a day on) was read as the same job
    base = 1_790_000_000_000_000_000
    folder = tmp_path / "job"
    folder.mkdir()
    (folder / "rank0.json").write_bytes(doc_bytes(rank=0, world=2, baseTimeNanoseconds=base))
    later = base + int(base_apart_s * 1e9)
    events = _shifted(good_events(), ts_apart_s * 1e6)
    (folder / "rank1.json").write_bytes(doc_bytes(events, rank=1, world=2, baseTimeNanoseconds=later))
    code, _, stderr = cli("analyze", str(folder), "-j", "1")
    if refused:
        assert code == 2 and "more than one run: rank 1's steps start 86,400 s" in stderr, stderr
    else:
        assert code == 0, stderr


def test_a_rank_selection_that_matches_only_some_says_which_are_absent(tmp_path: Path) -> None:
    # was: `--ranks 1-5` of a 2-rank job reported rank 1 and said nothing of ranks 2-5
    folder = job_folder(tmp_path / "job")
    code, stdout, stderr = cli("analyze", str(folder), "-j", "1", "--ranks", "1-5", "--format", "json")
    assert code == 0, stderr
    doc = json.loads(stdout)
    assert [r["rank"] for r in doc["ranks"]] == [1]
    assert "--ranks 1-5: rank(s) 2-5 not in these inputs (the job's world size is 2)" in doc["notes"], doc["notes"]
    assert not any("not in these inputs" in n for n in overlapcheck.analyze(folder, ranks=[0, 1], jobs=1).notes or [])


def test_a_summary_run_json_does_not_record_is_checked_against_its_status_record(tmp_path: Path) -> None:
    # run.json is written when the launcher ends; a summary still being written then is recorded in status/ only
    import hashlib

    run = _run_with_summaries(tmp_path / "run", lambda r, doc: doc)
    (run / "status").mkdir()
    for r in range(2):
        digest = hashlib.sha256((run / f"rank{r}.summary.json").read_bytes()).hexdigest()
        (run / "status" / f"rank{r}.summary.json").write_text(json.dumps({"status": "ok", "sha256": digest}))
    other = _run_with_summaries(tmp_path / "other", _another_jobs_numbers)
    shutil.copy(other / "rank1.summary.json", run / "rank1.summary.json")
    code, stdout, stderr = cli("report", str(run), "-j", "1", "--format", "json")
    assert code == 0, stderr
    ranks = json.loads(stdout)["ranks"]
    assert [r["collectives"]["all"]["overlap"] for r in ranks] == [0.5, 0.5]
    assert any("not the summary this run wrote" in n for n in ranks[1]["notes"]), ranks[1]["notes"]


def test_a_comparison_given_as_a_report_is_named_as_what_it_is(tmp_path: Path) -> None:
    # was: "not an overlapcheck report": it is one of overlapcheck's documents, a comparison
    job = job_folder(tmp_path / "job")
    code, _, stderr = cli("compare", str(job), str(job), "--json", str(tmp_path / "c.json"))
    assert code == 0, stderr
    code, _, stderr = cli("gate", str(tmp_path / "c.json"), "--min-overlap", "all=0.1")
    assert code == 2 and "an overlapcheck document of schema 'overlapcheck.compare/1', not a report" in stderr, stderr


# ---- round 3 (r3-api): integers past int64, unbounded API selections, a bad dataframe level, ----------------
# ---- backtracking --rank-from patterns, a baseline of a report with errors --------------------------------------

NINES = "9" * 400  # valid JSON, beyond a float and any int64


def _report_with_count(tmp_path: Path, literal: str) -> tuple[Path, Path]:
    """A good report of two ranks, and a copy whose rank 0 `collectives.all.count` is the JSON `literal`."""
    report = tmp_path / "report.json"
    code, _, stderr = cli("analyze", str(job_folder(tmp_path / "job")), "-j", "1", "--format", "json", "-o",
                          str(report))  # fmt: skip
    assert code == 0, stderr
    doc = json.loads(report.read_text())
    doc["ranks"][0]["collectives"]["all"]["count"] = 777777
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(doc).replace('"count": 777777', f'"count": {literal}', 1))
    return report, edited


@pytest.mark.parametrize("sign", ["", "-"], ids=["huge", "huge-negative"])
@pytest.mark.parametrize("command", ["gate", "compare", "baseline-gate", "baseline-save"])
def test_an_integer_beyond_int64_in_a_reports_integer_field_is_malformed(
    tmp_path: Path, sign: str, command: str
) -> None:
    # was: OverflowError (int too large to convert to float) in report/present.per_step, or, negative, while
    # formatting "is negative ({:g})" in model._check_split
    report, edited = _report_with_count(tmp_path, sign + NINES)
    args = {
        "gate": ["gate", str(edited), "--min-overlap", "all=0.1"],
        "compare": ["compare", str(edited), str(report)],
        "baseline-gate": ["gate", str(report), "--min-overlap", "all=0.1", "--baseline", str(edited)],
        "baseline-save": ["baseline", "save", str(edited), str(tmp_path / "base.json")],
    }[command]
    code, stdout, stderr = cli(*args)
    assert code == 2 and "ranks[0].collectives.all.count is about " in stderr, stderr
    assert "beyond a 64-bit integer" in stderr and stderr.count("\n") == 1, stderr
    assert not (tmp_path / "base.json").exists()


def test_an_int64_count_is_still_read(tmp_path: Path) -> None:
    _, edited = _report_with_count(tmp_path, str(2**63 - 1))
    assert overlapcheck.Report.from_dict(json.loads(edited.read_text())).ranks[0].collectives["all"].count == 2**63 - 1


def test_a_summary_with_an_integer_beyond_int64_is_refused_in_one_line(tmp_path: Path) -> None:
    # was: `report RUN` raised OverflowError when a rank's summary held a 400-digit step count
    def tamper(r: int, doc: dict[str, Any]) -> dict[str, Any]:
        if r == 1:
            doc["ranks"][0]["steps"][0]["collectives"]["all"]["count"] = 777777
        return doc

    run = _run_with_summaries(tmp_path / "run", tamper, traces=False)
    summary = run / "rank1.summary.json"
    summary.write_text(summary.read_text().replace('"count": 777777', f'"count": {NINES}', 1))
    code, _, stderr = cli("report", str(run), "-j", "1")
    assert code == 2 and "rank1.summary.json" in stderr and "beyond a 64-bit integer" in stderr, stderr


def test_api_report_from_dict_refuses_an_integer_no_json_parser_would_even_print(tmp_path: Path) -> None:
    # was: Report.from_dict took it; every reader of the Report then raised OverflowError
    from builders import make_report

    from overlapcheck.model import ReportFormatError

    doc = make_report().to_dict()
    doc["ranks"][0]["collectives"]["all"]["count"] = -(10**5000)  # beyond str()'s 4,300 digits too
    with pytest.raises(ReportFormatError, match=r"collectives\.all\.count is about -10\^5000, beyond a 64-bit"):
        overlapcheck.Report.from_dict(doc)


@pytest.mark.parametrize("value", [-(10**400), -1e300, float("-inf"), -5])
def test_a_negative_splits_message_never_raises(value: float) -> None:
    # was: f"{value:g}" raised OverflowError on an integer beyond a float
    from overlapcheck.model import _check_split, _Shape

    with pytest.raises(_Shape, match=r"x\.time_us is negative \("):
        _check_split({"time_us": value}, "x")
    with pytest.raises(_Shape, match=r"x\.overlap is .*, not a fraction"):
        _check_split({"overlap": -value}, "x")


def _endless(limit: int) -> Iterator[int]:
    """0, 1, 2, ...: consumed past `limit`, the test fails instead of running out of memory."""
    yield from range(limit + 1)
    raise AssertionError(f"the selection was iterated past {limit:,} numbers")


@contextmanager
def _within(seconds: int) -> Iterator[None]:
    """TimeoutError if the block runs longer than `seconds` (a Python loop is interrupted; C code is not)."""
    import signal

    def expired(signum: int, frame: Any) -> None:
        raise TimeoutError(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize("what", ["ranks", "steps"])
@pytest.mark.parametrize("shape", ["range", "generator", "stepped-range"])
def test_api_a_selection_of_more_numbers_than_a_job_has_is_refused_at_once(what: str, shape: str) -> None:
    # was: ranks=range(10**12) expanded one number at a time: a hang with unbounded memory
    values: Any = {
        "range": range(10**12),
        "generator": _endless(5_000_000),
        "stepped-range": range(0, 10**13, 7),
    }[shape]
    with _within(20), pytest.raises(UserError, match=f"^{what}[=:]") as caught:
        overlapcheck.analyze("sample_traces/bucket-too-large", jobs=1, **{what: values})
    assert "more than" in str(caught.value) and "\n" not in str(caught.value), caught.value


def test_api_a_range_selection_is_held_as_a_range() -> None:
    from overlapcheck.pipeline import _api_numbers
    from overlapcheck.selection import Numbers

    assert _api_numbers(range(100, 10**6), "ranks") == Numbers.from_ranges([(100, 10**6 - 1)])
    assert _api_numbers(range(10, 0, -1), "steps") == Numbers.of(range(1, 11))
    assert _api_numbers(range(0, 10, 3), "steps") == Numbers.of([0, 3, 6, 9])
    assert _api_numbers(range(5, 5), "steps") == Numbers.of([])
    with pytest.raises(UserError, match="ranks: '-1' is not a rank number"):
        _api_numbers(range(-1, 5), "ranks")
    with pytest.raises(UserError, match="steps: '9223372036854775808' is not a step number"):
        _api_numbers(range(2**63 - 2, 2**63 + 1), "steps")


def test_api_a_dataframe_of_an_unknown_level_is_a_user_error_listing_the_levels() -> None:
    # was: a builtin ValueError, not the package's UserError
    from builders import make_report

    for level in ("rank", ["ranks"], None):
        with pytest.raises(UserError, match="ranks, collectives, steps, phases, modules, findings"):
            make_report().dataframe(level)  # type: ignore[arg-type]


@pytest.mark.parametrize("pattern", ["(a+)+c", "(a*)*", "(?:x|y+)*z", r"rank(\d+)(-(a|b+)*)+", "((ab)*c+)+?"])
def test_a_rank_from_that_nests_repetitions_is_refused_at_once(tmp_path: Path, pattern: str) -> None:
    # was: `--rank-from '(a+)+c'` on a file named rank0-aaaa...a.json.gz never ended (exponential backtracking)
    folder = tmp_path / "job"
    folder.mkdir()
    (folder / f"rank0-{'a' * 20}.json").write_bytes(doc_bytes(rank=0, world=1))  # 32 a's: past 130 s
    code, stdout, stderr = cli("analyze", str(folder), "-j", "1", "--rank-from", pattern)
    assert code == 2 and stdout == "", stderr
    assert f"--rank-from '{pattern}' nests repetitions, which can take exponential time" in stderr, stderr
    with pytest.raises(UserError, match="^rank_from=.* nests repetitions"):
        overlapcheck.analyze(folder, jobs=1, rank_from=pattern)


@pytest.mark.parametrize("pattern", ["(a|a?)+c", "(ab|a)*c", r"rank(\d+)(?:-(?:a|ab))+x"])
def test_a_rank_from_that_repeats_alternatives_matching_alike_is_refused_at_once(tmp_path: Path, pattern: str) -> None:
    # was: `--rank-from '(a|a?)+c'` passed the nesting check (the inner `a?` is bounded) and took exponential time
    # on a name of a's: every way to split them between the two branches is tried
    folder = tmp_path / "job"
    folder.mkdir()
    (folder / f"rank0-{'a' * 20}.json").write_bytes(doc_bytes(rank=0, world=1))
    code, stdout, stderr = cli("analyze", str(folder), "-j", "1", "--rank-from", pattern)
    assert code == 2 and stdout == "", stderr
    assert f"--rank-from '{pattern}' repeats alternatives that can match alike" in stderr, stderr
    with pytest.raises(UserError, match="^rank_from=.* repeats alternatives"):
        overlapcheck.analyze(folder, jobs=1, rank_from=pattern)


@pytest.mark.parametrize(
    "pattern",
    [
        r"gpu(\d+)",
        r"(?:ab)*gpu(\d+)",
        r"^.*?/gpu(\d{1,6})\.json",
        r"(?:g|p|u)+?(\d+)(?:\.json)+",
        r"(?:gpu|rank)+(\d+)",
        r"(?:x|\d)*?gpu(\d+)",
    ],
)
def test_a_rank_from_without_nested_repetitions_is_read(tmp_path: Path, pattern: str) -> None:
    folder = tmp_path / "job"
    folder.mkdir()
    for r in range(2):
        (folder / f"gpu{r}.json").write_bytes(doc_bytes(rank=r, world=2))
    ranks = [r.rank for r in overlapcheck.analyze(folder, jobs=1, rank_from=pattern).ranks]
    assert ranks == [0, 1]


def test_a_rank_pattern_is_checked_without_the_private_parser(monkeypatch: pytest.MonkeyPatch) -> None:
    from overlapcheck import rank_pattern

    monkeypatch.setattr(rank_pattern, "_regex_parser", lambda: None)
    rank_pattern._exponential_shape.cache_clear()
    assert rank_pattern.compile_rank_pattern("(a+)+c").pattern == "(a+)+c"  # no parser: no refusal, no crash
    rank_pattern._exponential_shape.cache_clear()


@pytest.mark.parametrize("pattern", [r"(\d*\d*\d*\d*\d*\d*\d*\d*\d*)X", r"gpu\d*\d*\d*\d*\d*\d*\d*\d*(\d+)X"])
def test_a_rank_from_that_backtracks_polynomially_is_stopped_in_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pattern: str
) -> None:
    # was: sequential repeats over the same digits pass the shape check (none is nested, no alternation) and
    # `--rank-from '(\d*\d*...\d*)X'` on gpu111...1.json.gz ran for hours (30^9 ways to split the digits)
    from overlapcheck import rank_pattern

    monkeypatch.setattr(rank_pattern, "MATCH_SECONDS", 1.0)
    folder = tmp_path / "job"
    folder.mkdir()
    (folder / ("gpu" + "1" * 30 + ".json.gz")).write_bytes(gzip.compress(doc_bytes(rank=0, world=1)))
    started = time.monotonic()
    code, stdout, stderr = cli("analyze", str(folder), "-j", "1", "--rank-from", pattern)
    assert time.monotonic() - started < 30
    assert code == 2 and stdout == "" and len(stderr.splitlines()) == 1, stderr
    assert "took more than 1 s to search the traces' paths" in stderr and "gpu(\\d+)" in stderr, stderr
    with pytest.raises(UserError, match="^rank_from=.* took more than 1 s"):
        overlapcheck.analyze(folder, jobs=1, rank_from=pattern)


def test_a_rank_from_is_searched_in_time_on_names_python_cannot_decode(tmp_path: Path) -> None:
    from overlapcheck import rank_pattern

    name = os.fsdecode(b"gpu7-\xff.json")  # a lone surrogate, as Python reads an undecodable name
    assert rank_pattern._matches_in_time(r"gpu(\d+)", [str(tmp_path / name)], 10.0)
    assert not rank_pattern._matches_in_time(r"(\d*\d*\d*\d*\d*\d*\d*\d*\d*\d*)X", ["1" * 40], 0.5)


def test_a_rank_from_that_matches_no_path_is_one_line_written_as_typed(tmp_path: Path) -> None:
    # was: one error per file (each read in full first), each printing the regex with doubled backslashes
    folder = job_folder(tmp_path / "job", world=3)
    code, _, stderr = cli("analyze", str(folder), "-j", "1", "--rank-from", r"gpu(\d+)")
    errors = [line for line in stderr.splitlines() if "error" in line]
    assert code == 2 and len(errors) == 1, stderr
    assert r"--rank-from 'gpu(\d+)' does not match any of the 3 traces' paths (such as rank0.json)" in errors[0]
    code, _, stderr = cli("analyze", str(folder), "-j", "1", "--rank-from", r"rank(x)?")
    assert code == 2 and len(stderr.splitlines()) == 1, stderr
    assert "--rank-from 'rank(x)?' reads no rank in any of the 3 traces' paths (rank0.json: matches ''" in stderr


def test_a_rank_from_that_matches_some_paths_lists_each_other_file(tmp_path: Path) -> None:
    folder = job_folder(tmp_path / "job")
    (folder / "rank1.json").rename(folder / "gpu1.json")
    code, stdout, stderr = cli("analyze", str(folder), "-j", "1", "--format", "json", "--rank-from", r"rank(\d+)")
    assert code == 2 and [r["rank"] for r in json.loads(stdout)["ranks"]] == [0], stderr
    assert r"gpu1.json: --rank-from 'rank(\d+)' does not match this file's path" in stderr, stderr


def test_a_baseline_of_a_report_that_lists_unreadable_inputs_is_refused(tmp_path: Path) -> None:
    # was: `analyze` exited 2 and wrote the report with 1 error; `baseline save` then said "saved baseline: 1 ranks"
    folder = job_folder(tmp_path / "job")
    (folder / "rank1.json").write_text("garbage")
    report = tmp_path / "r.json"
    code, _, _ = cli("analyze", str(folder), "-j", "1", "--format", "json", "-o", str(report))
    assert code == 2 and len(json.loads(report.read_text())["errors"]) == 1
    code, stdout, stderr = cli("baseline", "save", str(report), str(tmp_path / "base.json"))
    assert code == 2 and stdout == "", stderr
    assert "the report lists 1 unreadable input" in stderr and "a baseline must be whole" in stderr, stderr
    assert not (tmp_path / "base.json").exists()


def test_communication_that_lasts_no_time_is_said(tmp_path: Path) -> None:
    # was: every kernel at dur 0: "no communication to measure", and no word of the 22 kernels that were there
    events = [{**e, "dur": 0} if e.get("cat") == "kernel" else e for e in good_events()]
    trace = tmp_path / "rank0.json"
    trace.write_bytes(doc_bytes(events, rank=0, world=1))
    notes = overlapcheck.analyze(trace, jobs=1).ranks[0].notes
    assert any("all 1 communication activities last 0 µs" in n for n in notes), notes


# ---- round 3 (r3-trace): duplicated events, a second GPU, times beyond reason ------------------------------


def _sample_copy(folder: Path, change: Callable[[int, dict[str, Any]], None], name: str = "bucket-too-large") -> Path:
    """The sample set `name`'s rank traces, each changed in place by `change(rank, document)`, written as JSON."""
    folder.mkdir(parents=True)
    for trace in sorted((SAMPLES / name).glob("rank*.trace.json.gz")):
        rank = int(trace.name.split(".")[0][4:])
        doc = json.loads(gzip.decompress(trace.read_bytes()))
        change(rank, doc)
        (folder / f"rank{rank}.json").write_text(json.dumps(doc))
    return folder


def _without_notes(report: dict[str, Any]) -> dict[str, Any]:
    """A JSON report without what tells two copies of the same traces apart: the notes and the file names."""
    out = json.loads(json.dumps(report))
    out.pop("notes", None)
    for rank in out["ranks"]:
        rank.pop("notes", None)
        rank.pop("source", None)
    return out


def _report(path: Path) -> dict[str, Any]:
    code, stdout, stderr, exc = analyze(path)
    assert exc is None and code == 0, stderr
    return json.loads(stdout)


def test_every_event_twice_is_counted_once_and_said(tmp_path: Path) -> None:
    # was: 22 collectives read as 44, bytes and transfer time per step doubled, and a reduce-transfer-bound
    # finding appeared, without a word
    def twice(rank: int, doc: dict[str, Any]) -> None:
        doc["traceEvents"] += [e for e in doc["traceEvents"] if e.get("ph") != "M"]

    plain = _report(_sample_copy(tmp_path / "plain", lambda r, d: None))
    doubled = _report(_sample_copy(tmp_path / "doubled", twice))
    assert _without_notes(doubled) == _without_notes(plain)
    for rank in doubled["ranks"]:
        said = [n for n in rank["notes"] if "exact copies of earlier ones" in n]
        assert said and "GPU activities" in said[0], rank["notes"]
    assert not any("exact copies" in n for rank in plain["ranks"] for n in rank["notes"])


def test_a_second_gpus_compute_does_not_hide_a_ranks_communication(tmp_path: Path) -> None:
    # was: compute kernels copied to device 1 (pid 1) raised the rank's overlap from 0.535 to 0.728, without a note
    def second_gpu(rank: int, doc: dict[str, Any]) -> None:
        extra = []
        for e in doc["traceEvents"]:
            if e.get("cat") == "kernel" and "nccl" not in e["name"]:
                copy = json.loads(json.dumps(e))
                copy["pid"], copy["args"]["device"], copy["ts"] = 1, 1, e["ts"] + 3000.0
                copy["args"].pop("correlation", None)
                extra.append(copy)
        doc["traceEvents"] += extra

    plain = _report(_sample_copy(tmp_path / "plain", lambda r, d: None))
    two = _report(_sample_copy(tmp_path / "two", second_gpu))
    assert _without_notes(two) == _without_notes(plain)
    for rank in two["ranks"]:
        said = [n for n in rank["notes"] if n.startswith("GPU activity on 2 devices (0, 1)")]
        assert said and "only device 0's" in said[0], rank["notes"]
    assert not any("devices" in n for rank in plain["ranks"] for n in rank["notes"])


def test_nccl_kernels_on_two_devices_are_said_and_all_measured(tmp_path: Path) -> None:
    # was: a rank whose communication ran on two GPUs was measured as one GPU's, without a note
    events = good_events() + [
        dict(kernel(GEMM, 200, 40, device=1), pid=1),
        dict(kernel(NCCL, 210, 40, stream=20, device=1, **{"In msg nelems": 1024, "dtype": "BFloat16"}), pid=1),
    ]
    (tmp_path / "rank0.json").write_bytes(doc_bytes(events))
    report = overlapcheck.analyze(tmp_path / "rank0.json", jobs=1)
    rank = report.ranks[0]
    said = [n for n in rank.notes if n.startswith("GPU activity on 2 devices (0, 1)")]
    assert said and "its NCCL kernels run on devices 0, 1" in said[0], rank.notes
    assert rank.collectives["all"].count == 2


@pytest.mark.parametrize("where", ["dur", "ts"])
def test_times_beyond_reason_are_left_out_with_a_note_cli_and_api(tmp_path: Path, where: str) -> None:
    # was: both ReduceScatter kernels with "dur": 1e308 crashed with OverflowError (fsum, hideability); every
    # python_function at "ts": 1e30 with IndexError (launched_in)
    def wild(rank: int, doc: dict[str, Any]) -> None:
        if rank:
            return
        for e in doc["traceEvents"]:
            if where == "dur" and e.get("cat") == "kernel" and "ReduceScatter" in e["name"]:
                e["dur"] = 1e308
            if where == "ts" and e.get("cat") == "python_function":
                e["ts"] = 1e30

    folder = _sample_copy(tmp_path / "t", wild)
    code, stdout, stderr = cli("analyze", str(folder), "-j", "1", "--format", "json")
    assert code == 0 and "Traceback" not in stderr, stderr
    notes = json.loads(stdout)["ranks"][0]["notes"]
    assert any("beyond 2^62 µs" in n and "were left out" in n for n in notes), notes
    report = overlapcheck.analyze(folder, jobs=1)
    assert any("beyond 2^62 µs" in n for n in report.ranks[0].notes)


def test_python_frames_without_duration_are_no_crash(tmp_path: Path) -> None:
    # was: every python_function with "dur": 0 (an instant) crashed reduce-scatter-deferred with IndexError
    def instants(rank: int, doc: dict[str, Any]) -> None:
        for e in doc["traceEvents"]:
            if e.get("cat") == "python_function":
                e["dur"] = 0

    report = overlapcheck.analyze(_sample_copy(tmp_path / "t", instants), jobs=1)
    assert [r.rank for r in report.ranks] == [0, 1]


# ---- round 4's rough edges ----------------------------------------------------------------------------------


@pytest.mark.parametrize("threshold, verdict", [("all=0.0", 0), ("all=0.999", 1)])
def test_a_reader_that_stops_early_changes_neither_the_verdict_nor_the_files(
    tmp_path: Path, threshold: str, verdict: int
) -> None:
    # was: `gate r.json | head -1` exited 1 whatever the verdict (click's broken-pipe exit), and the JUnit file,
    # written after the table, was never written
    import subprocess
    import sys

    report = tmp_path / "r.json"
    code, _, stderr = cli(
        "analyze", str(job_folder(tmp_path / "job")), "--format", "json", "-j", "1", "-o", str(report)
    )
    assert code == 0, stderr
    junit = tmp_path / "gate.xml"
    args = ["gate", str(report), "--min-overlap", threshold, "--junit", str(junit)]
    env = {k: v for k, v in os.environ.items() if k != "GITHUB_STEP_SUMMARY"}
    proc = subprocess.Popen([sys.executable, "-m", "overlapcheck", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env)  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before the first line
    stderr_bytes = proc.stderr.read()
    assert proc.wait(timeout=120) == verdict, stderr_bytes[-500:]
    assert stderr_bytes == b"" and junit.read_text().startswith("<?xml")


def test_a_rank_written_in_other_scripts_digits_is_no_rank(tmp_path: Path) -> None:
    # was: `rank٣.json` (Arabic-Indic three) was read as rank 3 by name, as int() reads it
    from overlapcheck.trace.reader import rank_from_name

    assert rank_from_name("rank\u0663.json") is None and rank_from_name("rank3.json") == 3
    folder = tmp_path / "job"
    code, _, stderr = cli("analyze", str(job_folder(folder)), "-j", "1", "--format", "json",
                          "-o", str(folder / "rank\u0663.summary.json"))  # fmt: skip
    assert code == 0, stderr  # not the name of a summary, so no document a later read takes it for


@pytest.mark.parametrize("value", ["\u0660.\u0665", "all=\u0660.\u0665", "1_0"])
def test_thresholds_are_ascii_numbers(tmp_path: Path, value: str) -> None:
    # was: --max-exposed-share '٠.٥' gated at 0.5, as float() reads Arabic-Indic digits
    report = tmp_path / "r.json"
    cli("analyze", str(job_folder(tmp_path / "job")), "--format", "json", "-j", "1", "-o", str(report))
    option = "--min-overlap" if "=" in value else "--max-exposed-share"
    code, stdout, stderr = cli("gate", str(report), option, value)
    assert code == 2 and "is not a number" in stderr, stderr
    code, _, stderr = cli("gate", str(report), "--ignore-below-us", "\u0661", "--max-exposed-share", "0.5")
    assert code == 2 and "is not a number of microseconds" in stderr, stderr


@pytest.mark.parametrize("ranks", ["", "  ", "\u0663", "1_0"])
def test_run_refuses_an_empty_or_foreign_rank_list(tmp_path: Path, ranks: str) -> None:
    # was: `run --ranks ""` (an unset "$RANKS") profiled every rank, and `--ranks ٣` rank 3
    code, _, stderr = cli("run", "--out", str(tmp_path / "out"), "--ranks", ranks, "--", "python", "-c", "pass")
    assert code == 2 and "--ranks" in stderr, stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("flag", ["diagnose", "timelines"])
@pytest.mark.parametrize("value", ["no", None, 2, 0.5])
def test_api_flags_are_booleans(tmp_path: Path, flag: str, value: Any) -> None:
    # was: analyze(..., diagnose='no') diagnosed, a non-empty string being true
    with pytest.raises(UserError, match=f"{flag} must be True or False"):
        overlapcheck.analyze(job_folder(tmp_path / "job"), jobs=1, **{flag: value})


def test_api_flags_take_numpy_booleans_and_zero(tmp_path: Path) -> None:
    import numpy as np

    folder = job_folder(tmp_path / "job")
    assert overlapcheck.analyze(folder, jobs=1, diagnose=0).findings == []
    assert len(overlapcheck.analyze(folder, jobs=1, diagnose=np.False_).ranks) == 2


def test_an_output_name_of_255_bytes_is_written(tmp_path: Path) -> None:
    # was: its temp name (".NAME.XXXX.tmp") was longer than a file name may be: "cannot write: File name too long"
    for name in ("r" * 250 + ".json", "\u00e9" * 122 + ".json"):  # 255 bytes; 249 of them in two-byte letters
        assert len(name.encode()) <= 255
        code, _, stderr = cli("analyze", str(job_folder(tmp_path / "job")), "--format", "json", "-j", "1",
                              "-o", str(tmp_path / name))  # fmt: skip
        assert code == 0, stderr
        assert json.loads((tmp_path / name).read_text())["ranks"]
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]


@pytest.mark.parametrize("group", [10**6, 3])
def test_a_group_larger_than_the_world_is_said_and_its_bandwidth_is_the_worlds(tmp_path: Path, group: int) -> None:
    # was: "Group size": 1e6 in a 2-rank job gave a bus bandwidth ~1e6/2 times too high, with no note
    def with_group(size: int) -> list[dict[str, Any]]:
        events = good_events()
        for e in events:
            if e.get("cat") == "kernel" and "nccl" in e["name"]:
                e["args"]["Group size"] = size
        return events

    for name, size in (("bad", group), ("good", 2)):
        folder = tmp_path / name
        folder.mkdir()
        for r in range(2):
            (folder / f"rank{r}.json").write_bytes(doc_bytes(with_group(size), rank=r, world=2))
    bad, good = (overlapcheck.analyze(tmp_path / n, jobs=1).ranks[0] for n in ("bad", "good"))
    assert any(f"Group size of up to {group}, more than the world size 2" in n for n in bad.notes), bad.notes
    assert not any("Group size" in n for n in good.notes)
    assert bad.bandwidth == good.bandwidth and bad.bandwidth


def test_copies_with_other_ids_are_said(tmp_path: Path) -> None:
    # was: every kernel copied with a new correlation id (not an exact copy, so not dropped) doubled the counts
    # and times without a word; one CUDA stream cannot run two kernels at once
    def renumbered(rank: int, doc: dict[str, Any]) -> None:
        copies = []
        for e in doc["traceEvents"]:
            if e.get("cat") == "kernel":
                copy = json.loads(json.dumps(e))
                copy.setdefault("args", {})["correlation"] = 10**9 + len(copies)
                copies.append(copy)
        doc["traceEvents"] += copies

    plain = _report(_sample_copy(tmp_path / "plain", lambda r, d: None))
    copied = _report(_sample_copy(tmp_path / "copied", renumbered))
    for rank in copied["ranks"]:
        said = [n for n in rank["notes"] if "start before the one before them on their stream ended" in n]
        assert said, rank["notes"]
    assert not any("on their stream ended" in n for rank in plain["ranks"] for n in rank["notes"])

    # back to back on a stream, touching within CUPTI's slack, is no overlap
    def touching(rank: int, doc: dict[str, Any]) -> None:
        kernels = [e for e in doc["traceEvents"] if e.get("cat") == "kernel"]
        kernels[1]["ts"] = kernels[0]["ts"] + kernels[0]["dur"] - 0.5
        kernels[1]["args"]["stream"] = kernels[0]["args"]["stream"]
        kernels[1]["tid"] = kernels[0]["tid"]

    near = _report(_sample_copy(tmp_path / "near", touching))
    assert not any("on their stream ended" in n for rank in near["ranks"] for n in rank["notes"])


@pytest.mark.skipif(not hasattr(signal, "SIGTERM") or os.name != "posix", reason="needs POSIX signals")
def test_sigterm_during_a_write_leaves_no_temp_file_and_still_kills(tmp_path: Path) -> None:
    # was: SIGTERM (a CI timeout) killed the process before `finally`, leaving .NAME.xxxx.tmp beside the output
    script = (
        "import os, signal\n"
        "from overlapcheck.fsutil import atomic_write\n"
        "def pieces():\n"
        "    yield 'x' * 100000\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    yield 'never written'\n"
        f"atomic_write({str(tmp_path / 'out.json')!r}, pieces())\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == -signal.SIGTERM, proc.stderr  # died of the signal, as it would have
    assert sorted(p.name for p in tmp_path.iterdir()) == [], proc.stderr


@pytest.mark.skipif(not os.path.exists("/dev/stdout"), reason="needs /dev/stdout")
@pytest.mark.parametrize("name", ["/dev/stdout", "/dev/fd/1", "/proc/self/fd/1"])
def test_an_output_to_this_process_stream_never_replaces_the_file_behind_it(tmp_path: Path, name: str) -> None:
    # was: `-o /dev/stdout --force >> log.txt` replaced log.txt (the link chain led to it) and the log was lost
    if not os.path.exists(name):
        pytest.skip(f"no {name} here")
    folder = job_folder(tmp_path / "job")
    log = tmp_path / "log.txt"
    log.write_text("line 1 of my CI log\n")
    with open(log, "a") as out:
        proc = subprocess.run(
            [sys.executable, "-m", "overlapcheck", "analyze", str(folder), "-j", "1", "-o", name, "--force"],
            stdout=out, stderr=subprocess.PIPE, text=True, timeout=120,
        )  # fmt: skip
    assert proc.returncode == 2 and "is a stream of this process" in proc.stderr, proc.stderr
    assert log.read_text().startswith("line 1 of my CI log\n")


@pytest.mark.skipif(not os.path.exists(os.devnull) or os.name != "posix", reason="needs /dev/null")
@pytest.mark.parametrize("option", ["-o", "--html", "--perfetto"])
def test_an_output_to_the_null_device_is_discarded(tmp_path: Path, option: str) -> None:
    # was: "is a character device; choose a file path" (while $GITHUB_STEP_SUMMARY=/dev/null was "nowhere")
    code, _, stderr = cli("analyze", str(job_folder(tmp_path / "job")), "-j", "1", option, os.devnull)
    assert code == 0, stderr


@pytest.mark.parametrize(
    ("command", "twice"),
    [
        ("gate", ["--max-exposed-share", "0.1", "--max-exposed-share", "0.9"]),
        ("gate", ["--ignore-below-us", "5", "--ignore-below-us", "100000"]),
        ("analyze", ["--ranks", "0", "--ranks", "1"]),
        ("analyze", ["--steps", "1", "--steps", "2"]),
        ("analyze", ["-o", "x1.txt", "--output", "x2.txt"]),
        ("analyze", ["--format", "json", "--format", "text"]),
        ("compare", ["--format", "json", "--format", "text"]),
        ("run", ["--active", "2", "--active", "3"]),
        ("simulate", ["--steps", "1", "--steps", "2"]),
    ],
)
def test_an_option_of_one_value_given_twice_is_refused_never_last_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: str, twice: list[str]
) -> None:
    # was: the last value won without a word: a strict gate followed by a looser default passed
    monkeypatch.chdir(tmp_path)
    folder = job_folder(tmp_path / "job")
    report = tmp_path / "report.json"
    assert cli("analyze", str(folder), "-j", "1", "--format", "json", "-o", str(report))[0] == 0
    args = {
        "gate": ["gate", str(report)],
        "analyze": ["analyze", str(folder), "-j", "1"],
        "compare": ["compare", str(report), str(report)],
        "run": ["run", "--out", str(tmp_path / "run")],
        "simulate": ["simulate", "--out", str(tmp_path / "sim")],
    }[command]
    tail = ["--", "true"] if command == "run" else []
    code, stdout, stderr = cli(*args, *twice, *tail)
    assert code == 2 and "is given more than once" in stderr and twice[0].lstrip("-") in stderr, stderr
    assert stdout == "" and not (tmp_path / "x1.txt").exists() and not (tmp_path / "x2.txt").exists()
    assert not (tmp_path / "run").exists() and not (tmp_path / "sim").exists()


def test_a_repeated_option_in_the_jobs_own_arguments_is_the_jobs(tmp_path: Path) -> None:
    marker = tmp_path / "args.txt"
    script = f"import sys; open({str(marker)!r}, 'w').write(' '.join(sys.argv[1:]))"
    code, _, stderr = cli("run", "--out", str(tmp_path / "run"), "--summary-timeout", "1", "--", sys.executable,
                          "-c", script, "--steps", "1", "--steps", "2")  # fmt: skip
    assert "given more than once" not in stderr, stderr
    assert marker.read_text() == "--steps 1 --steps 2"


def test_a_partial_job_says_which_ranks_it_lacks_and_which_files_it_skipped(tmp_path: Path) -> None:
    # was: 4 traces of a 16-rank job (and a rank4.json.gzip skipped unsaid): "worst rank 3" of 4, no word
    folder = tmp_path / "job"
    folder.mkdir()
    for r in range(4):
        (folder / f"rank{r}.json").write_bytes(doc_bytes(rank=r, world=16))
    (folder / "rank4.json.gzip").write_bytes(gzip.compress(doc_bytes(rank=4, world=16)))
    report = overlapcheck.analyze(folder, jobs=1)
    assert [r.rank for r in report.ranks] == [0, 1, 2, 3]
    notes = report.notes or []
    assert any("rank(s) 4-15 of the job's world size 16 are not in this report" in n for n in notes), notes
    assert any("not read as traces: rank4.json.gzip" in n for n in notes), notes
    whole = job_folder(tmp_path / "whole")
    assert not any("not in this report" in n for n in overlapcheck.analyze(whole, jobs=1).notes or [])


def test_diagnosis_reads_the_gradient_copies_once_per_rank_not_once_per_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # was: 20,000 steps took 63 s, 48 of them in inherent_windows (a name scan of every event per step's last
    # bucket, and the inherent windows re-merged once per step: quadratic); now linear (5,000 steps 7.7 -> 3.7 s)
    from overlapcheck.diagnose.facts import sizing

    events: list[dict[str, Any]] = []
    corr = 1
    for s in range(60):
        t = s * 100.0
        events += [builders.step(s, t, 100), builders.cpu_op("autograd::engine::evaluate_function: X", t + 5, 30)]
        for off, make in (
            (0, lambda c, t=t: builders.kernel("ncclDevKernel_AllGather_RING_LL", t + 2, 10, stream=20, corr=c)),
            (8, lambda c, t=t: builders.kernel("ampere_sgemm_128x64_nn", t + 12, 50, stream=7, corr=c)),
            (20, lambda c, t=t: builders.memcpy(t + 63, 2, stream=20, corr=c)),
            (30, lambda c, t=t: builders.kernel("ncclDevKernel_ReduceScatter_RING_LL", t + 66, 20, stream=20, corr=c)),
        ):
            events += [builders.launch(t + off + 1, corr), make(corr)]
            corr += 1
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps({"traceEvents": events, "distributedInfo": {"rank": 0, "world_size": 1}}))
    calls: list[int] = []
    scan = sizing._gradient_copies
    monkeypatch.setattr(sizing, "_gradient_copies", lambda view: calls.append(1) or scan(view))
    report = overlapcheck.analyze(path, jobs=1)
    assert len(report.ranks[0].steps) == 60 and report.ranks[0].exposed_share > 0
    assert len(calls) == 1


@pytest.mark.parametrize(
    ("name", "head"), [("r.html", "<!DOCTYPE html>"), ("r.JSON", "{"), ("r.md", "### "), ("r.txt", "")]
)
def test_an_output_without_format_is_written_as_its_extension_names(tmp_path: Path, name: str, head: str) -> None:
    # was: `-o report.html` wrote the terminal's boxes into report.html (and `compare ... -o c.json` too)
    sample = Path(__file__).resolve().parents[1] / "sample_traces" / "straggler"
    for cmd in (["analyze", str(sample)], ["compare", str(sample), str(sample)]):
        out = tmp_path / f"{cmd[0]}-{name}"
        proc = builders.run_cli(*cmd, "-o", str(out))
        assert proc.returncode == 0, proc.stderr
        text = out.read_text()
        assert text.startswith(head) and (head or not text.lstrip().startswith(("{", "<", "#"))), text[:80]
    explicit = tmp_path / "explicit.json"
    assert builders.run_cli("analyze", str(sample), "--format", "markdown", "-o", str(explicit)).returncode == 0
    assert explicit.read_text().startswith("### ")  # --format, when given, decides


def test_infinite_times_are_left_out_before_any_arithmetic_without_a_warning_or_a_made_up_note(tmp_path: Path) -> None:
    # was: numpy's "RuntimeWarning: invalid value encountered in subtract" on stderr, and an infinite end on
    # stream 7 made "1 GPU activities start before the one before them on their stream ended"
    import warnings

    events = [
        builders.step(0, 0, 100),
        builders.launch(1, 1),
        builders.kernel("ncclDevKernel_AllGather_RING_LL", 2, 10, stream=20, corr=1),
        builders.kernel("sgemm", 3, "inf", corr=2),
        builders.kernel("sgemm", "Infinity", 5, corr=3),
        builders.kernel("sgemm", 1e308, 1e308, corr=4),
        builders.kernel("sgemm", 40, 5, corr=5),
    ]
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps({"traceEvents": events, "distributedInfo": {"rank": 0, "world_size": 1}}))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        report = overlapcheck.analyze(path, jobs=1)
    assert report.ranks[0].notes == ["3 events with an infinite or NaN time or end were left out"]


def test_a_run_folder_without_traces_does_not_point_at_its_status_folder(tmp_path: Path) -> None:
    # was: "no trace files ... in this folder; status/ holds 1 trace file(s): give that folder" (run's own JSON)
    run = tmp_path / "run"
    (run / "traces").mkdir(parents=True)
    (run / "status").mkdir()
    (run / "run.json").write_text(json.dumps({"schema": "overlapcheck.run/1", "world_size": 1}))
    (run / "status" / "launcher0.json").write_text(json.dumps({"node_rank": 0, "exit_code": 0}))
    for cmd in ("report", "analyze"):
        proc = builders.run_cli(cmd, str(run))
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert "no trace files (*.json, *.json.gz) in this run folder's traces/" in proc.stderr
        assert "status/" not in proc.stderr, proc.stderr


def test_an_error_that_names_all_its_files_is_said_once_and_alike_errors_of_other_files_each(tmp_path: Path) -> None:
    # was: "rank 0 is claimed by several files (a/x/..., a/y/...)" printed once per file, the same words twice
    sample = Path(__file__).resolve().parents[1] / "sample_traces" / "straggler" / "rank0.trace.json.gz"
    for sub in ("x", "y"):
        (tmp_path / sub).mkdir()
        shutil.copy(sample, tmp_path / sub / "rank0.trace.json.gz")
    proc = builders.run_cli("analyze", str(tmp_path / "x"), str(tmp_path / "y"))
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "rank 0 is claimed by several files" in lines[0], lines
    for name in ("rank0.json", "rank1.json"):
        (tmp_path / name).write_text("not json")
    proc = builders.run_cli("analyze", str(tmp_path / "rank0.json"), str(tmp_path / "rank1.json"))
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 2, proc.stderr  # one per file


def test_perfetto_of_traces_without_activity_does_not_blame_summaries(tmp_path: Path) -> None:
    # was: "--perfetto: no rank has events to export: each was read from a summary without its trace" of a trace
    path = tmp_path / "rank0.json"
    events = [builders.step(0, 0, 100), builders.cpu_op("aten::mm", 5, 10)]
    path.write_text(json.dumps({"traceEvents": events, "distributedInfo": {"rank": 0, "world_size": 1}}))
    proc = builders.run_cli("analyze", str(path), "--perfetto", str(tmp_path / "p.json"))
    assert proc.returncode == 2 and "summary" not in proc.stderr, proc.stderr
    assert "no GPU kernel or memcpy, and no CPU-side collective" in proc.stderr
    assert not (tmp_path / "p.json").exists()


def test_runs_closing_lines_say_what_an_incomplete_rank_holds_never_none(capsys: pytest.CaptureFixture[str]) -> None:
    # was: "overlapcheck:   rank 1: None" for a rank whose capture ended early without an error
    from overlapcheck.capture import session

    window = {"first_step": 7, "last_step": 9}
    doc = {
        "world_size": 3,
        "incomplete_ranks": [1, 2],
        "ranks": [
            {"rank": 0, "capture": {"status": "ok", "trace": "traces/rank0.pt.trace.json.gz", "complete": True}},
            {
                "rank": 1,
                "capture": {
                    "status": "ok",
                    "trace": "t1",
                    "complete": False,
                    "error": None,
                    **window,
                    "steps_captured": {"first": 7, "last": 8},
                },
            },  # fmt: skip
            {"rank": 2, "capture": {"status": "ok", "trace": "t2", "complete": False, **window}},
        ],
    }
    session._tell("out", doc)
    err = capsys.readouterr().err
    assert "None" not in err, err
    assert "rank 1: incomplete: its trace holds steps 7..8 of the window 7..9" in err
    assert "rank 2: incomplete: its trace holds no whole step of the window 7..9" in err


def test_a_decode_error_deep_in_a_big_trace_shows_the_text_there_not_an_offset_into_a_chunk(tmp_path: Path) -> None:
    # was: "expected ',' or '}' (byte 456245)" of an error 13,039,090 bytes into the file
    events = [builders.step(0, 0, 100)] + [builders.kernel("sgemm", i, 1) for i in range(100_000)]
    text = json.dumps({"traceEvents": events, "distributedInfo": {"rank": 0, "world_size": 1}})
    text = text.replace('"ts": 90000,', '"ts": 9x0000,')
    (tmp_path / "rank0.json").write_text(text)
    proc = builders.run_cli("analyze", str(tmp_path / "rank0.json"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "near" in proc.stderr and '"ts": 9x0000' in proc.stderr and "(byte" not in proc.stderr, proc.stderr


def test_a_lone_surrogate_in_the_metadata_is_read_as_in_events(tmp_path: Path) -> None:
    # was: "malformed JSON around the event array (... surrogate pair ...)", exit 2, of valid JSON
    events = [builders.step(0, 0, 100), builders.launch(1, 1), builders.kernel("sgemm\ud800", 3, 50, corr=1)]
    doc = {"traceEvents": events, "distributedInfo": {"rank": 0, "world_size": 1, "backend": "nccl\ud800"}}
    (tmp_path / "rank0.json").write_text(json.dumps(doc))  # json.dumps writes the escapes
    report = overlapcheck.analyze(tmp_path / "rank0.json", jobs=1)
    assert not report.errors and report.ranks[0].backend == "nccl\ufffd"
    assert (
        "2 lone UTF-16 surrogate escapes in strings (no Unicode character) were read as U+FFFD" in report.ranks[0].notes
    )


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
@pytest.mark.parametrize("kind", ["analyze", "gate", "closed"])
def test_a_stdout_that_cannot_be_written_is_one_line_and_exit_2_after_the_files(tmp_path: Path, kind: str) -> None:
    # was: OSError (No space left on device) or AttributeError ('NoneType' ... 'writelines') tracebacks, exit 1/120
    folder = job_folder(tmp_path / "job")
    report = tmp_path / "report.json"
    assert cli("analyze", str(folder), "-j", "1", "--format", "json", "-o", str(report))[0] == 0
    args = {"analyze": ["analyze", str(folder), "-j", "1"], "closed": ["analyze", str(folder), "-j", "1", "-o", "-"],
            "gate": ["gate", str(report), "--min-overlap", "all=0.1", "--junit", str(tmp_path / "j.xml")]}[kind]  # fmt: skip
    with open("/dev/full", "w") as full:
        proc = subprocess.run(
            [sys.executable, "-m", "overlapcheck", *args], stderr=subprocess.PIPE, text=True, timeout=120,
            stdout=full if kind != "closed" else None, preexec_fn=(lambda: os.close(1)) if kind == "closed" else None,
        )  # fmt: skip
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    expected = "standard output is closed" if kind == "closed" else "cannot write to standard output: No space left"
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"overlapcheck: error: {expected}"), proc.stderr
    if kind == "gate":
        assert (tmp_path / "j.xml").is_file()  # the gate's files are written all the same


def test_a_closed_stdout_takes_no_file_s_descriptor(tmp_path: Path) -> None:
    # fd 1 closed by the caller: the report's temporary file would have been fd 1, the next print inside it
    folder = job_folder(tmp_path / "job")
    out = tmp_path / "r.json"
    proc = subprocess.run([sys.executable, "-m", "overlapcheck", "analyze", str(folder), "-j", "1", "-o", str(out)],
                          stderr=subprocess.PIPE, text=True, timeout=120, preexec_fn=lambda: os.close(1))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert json.loads(out.read_text())["schema"]


@pytest.mark.parametrize("ranks", ["0-9223372036854775807", "0-9223372036854775806,9223372036854775807"])
def test_every_int64_rank_selected_is_the_whole_job_not_an_overflow(tmp_path: Path, ranks: str) -> None:
    # was: OverflowError (cannot fit 'int' into an index-sized integer) from len() of the selection
    code, out, stderr = cli("analyze", str(job_folder(tmp_path / "job")), "-j", "1", "--ranks", ranks)
    assert code == 0 and "Traceback" not in stderr and out, stderr


# ---- round 6: run.json fields of the wrong type ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "said"),
    [
        ("world_size", "one", 'world_size is a string "one", not a positive integer'),
        ("world_size", -1, "world_size is a number -1, not a positive integer"),
        ("ds_config", [1, 2], "ds_config is a list, not an object"),
        ("hosts", "node0,node1", 'hosts is a string "node0,node1", not a list of strings'),
        ("launches", 5, "launches is a number 5, not a list of objects"),
        ("profiler", "on", 'profiler is a string "on", not an object'),
        ("ranks", [1, "x"], "ranks is a list, not a list of objects"),
    ],
)
def test_a_run_json_field_of_the_wrong_type_is_named_in_a_note(
    tmp_path: Path, field: str, value: Any, said: str
) -> None:
    # was: `report` dropped each such field silently (world_size 'one', a string of hosts, launches 5)
    folder = job_folder(tmp_path / "job")
    (folder / "run.json").write_text(json.dumps({"schema": "overlapcheck.run/1", "world_size": 2, field: value}))
    code, stdout, stderr = cli("analyze", str(folder), "-j", "1", "--format", "json")
    assert code == 0, stderr
    notes = json.loads(stdout)["notes"]
    assert any(said in n and "ignored" in n for n in notes), notes


def test_run_json_s_world_size_names_the_missing_ranks_when_the_traces_say_none(tmp_path: Path) -> None:
    # was: traces without distributedInfo.world_size (torch 1.x, CPU) never said that ranks 2-3 were missing
    folder = tmp_path / "job"
    folder.mkdir()
    for r in range(2):
        (folder / f"rank{r}.json").write_bytes(doc_bytes(rank=r, world=None))
    (folder / "run.json").write_text(json.dumps({"schema": "overlapcheck.run/1", "world_size": 4}))
    code, stdout, stderr = cli("analyze", str(folder), "-j", "1", "--format", "json")
    assert code == 0, stderr
    notes = json.loads(stdout)["notes"]
    assert any("rank(s) 2-3 of the job's world size 4 are not in this report" in n for n in notes), notes


@pytest.mark.parametrize("config", [{"model": "llama", "lr": 0.1}, {"zero_optimisation": {"stage": 3}}])
def test_a_ds_config_with_none_of_deepspeeds_keys_is_named_in_a_note(tmp_path: Path, config: dict[str, Any]) -> None:
    # was: a JSON object of another tool's (or a misspelt zero_optimization) was taken as an empty ds_config, silently
    path = tmp_path / "c.json"
    path.write_text(json.dumps(config))
    code, stdout, _ = cli("analyze", str(job_folder(tmp_path / "job")), "-j", "1", "--ds-config", str(path))
    assert code == 0 and "holds none of DeepSpeed's keys" in " ".join(stdout.split()), stdout
    report = overlapcheck.analyze(job_folder(tmp_path / "api", config=config), jobs=1)
    assert any("none of DeepSpeed's keys" in n for n in report.notes or [])
    kept = overlapcheck.analyze(job_folder(tmp_path / "ok", config={"train_batch_size": 8, **config}), jobs=1)
    assert not any("none of DeepSpeed's keys" in n for n in kept.notes or [])


@pytest.mark.parametrize("empty_side", ["after", "before"])
def test_compare_with_a_run_that_measured_nothing_is_not_comparable(tmp_path: Path, empty_side: str) -> None:
    # was: an empty AFTER read as every exposure removed: "✅ ... reduce-scatter exposed -5.32 ms/step (step -38 ms)"
    empty = tmp_path / "empty"
    empty.mkdir()
    for r in range(2):
        (empty / f"rank{r}.json").write_text(json.dumps({"distributedInfo": {"rank": r, "world_size": 2},
                                                          "traceEvents": []}))  # fmt: skip
    real = SAMPLES / "straggler"
    sides = [str(real), str(empty)] if empty_side == "after" else [str(empty), str(real)]
    code, stdout, _ = cli("compare", *sides, "--format", "markdown")
    assert code == 0 and stdout.startswith("### ℹ️"), stdout
    assert f"Not comparable: {empty_side} measured no communication" in stdout and "ms/step (step" not in stdout
    code, stdout, _ = cli("compare", *sides, "--format", "json")
    doc = json.loads(stdout)
    assert all(k["exposed_us_per_step"]["change"] is None for k in doc["kinds"]) and doc["ranks"] == []
    assert any(f"{empty_side} measured no communication on any rank" in n for n in doc["notes"])


def test_output_paths_in_confirmation_lines_cannot_act_on_the_terminal(tmp_path: Path) -> None:
    # was: `--html $'\e]0;pwn\a.html'` echoed "HTML report: <the escape, raw>" to the terminal
    evil = "o\x1b]0;pwn\x07\u202e\nx"
    job = str(job_folder(tmp_path / "job"))
    code, stdout, stderr = cli("analyze", job, "-j", "1", "--format", "json", "-o", str(tmp_path / "r.json"),
                               "--html", str(tmp_path / f"{evil}.html"), "--perfetto", str(tmp_path / f"{evil}.json"))  # fmt: skip
    assert code == 0, stderr
    assert (tmp_path / f"{evil}.html").is_file() and (tmp_path / f"{evil}.json").is_file()
    code, stdout2, _ = cli("baseline", "save", str(tmp_path / "r.json"), str(tmp_path / f"b{evil}.json"))
    assert code == 0
    code, stdout3, _ = cli("simulate", "--out", str(tmp_path / f"s{evil}"), "--steps", "1", "--nodes", "1",
                           "--gpus-per-node", "1")  # fmt: skip
    for text in (stdout + stderr, stdout2, stdout3):
        assert "\x1b" not in text and "\x07" not in text and "\u202e" not in text and "\\x1b]0;pwn" in text, text
        assert "\\x0ax" in text


def test_a_selected_step_that_is_not_in_the_traces_is_named(tmp_path: Path) -> None:
    # was: `--steps 5:6,9` on traces of steps 5-6 said "restricted to steps 5-6,9" and nothing of step 9
    code, stdout, _ = cli("analyze", str(SAMPLES / "straggler"), "-j", "1", "--steps", "5:6,9")
    assert code == 0 and "step(s) 9 not in this trace" in " ".join(stdout.split()), stdout
    code, stdout, _ = cli("analyze", str(SAMPLES / "straggler"), "-j", "1", "--steps", "5:6")
    assert code == 0 and "not in this trace" not in stdout


@pytest.mark.parametrize("traces", ["file", "missing"])
def test_a_run_folder_whose_traces_is_no_folder_does_not_point_at_its_status_records(
    tmp_path: Path, traces: str
) -> None:
    # was: "status/ holds 2 trace file(s): give that folder" where traces/ is a file or gone (status/rank0.json)
    run = tmp_path / "run"
    (run / "status").mkdir(parents=True)
    if traces == "file":
        (run / "traces").write_text("x")
    (run / "run.json").write_text(json.dumps({"schema": "overlapcheck.run/1", "world_size": 2}))
    for r in range(2):
        (run / "status" / f"rank{r}.json").write_text(json.dumps({"rank": r, "world_size": 2}))
    for cmd in ("report", "analyze"):
        proc = builders.run_cli(cmd, str(run))
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert "give that folder" not in proc.stderr and len(proc.stderr.splitlines()) == 1, proc.stderr


def test_a_ds_config_count_that_is_not_a_whole_number_is_ignored_with_a_note(tmp_path: Path) -> None:
    # was: reduce_bucket_size 0.5 was taken, and shown as "reduce_bucket_size 0"; 5e8 (a float in JSON) is a count
    from overlapcheck.job import sanitize_config

    config = {"zero_optimization": {"reduce_bucket_size": 0.5, "stage3_prefetch_bucket_size": 5e8}}
    kept, notes = sanitize_config(config)
    assert "reduce_bucket_size" not in kept["zero_optimization"]
    assert kept["zero_optimization"]["stage3_prefetch_bucket_size"] == 5e8
    assert notes == [
        "ds_config zero_optimization.reduce_bucket_size = 0.5 is not a whole number: ignored (the diagnosis treats "
        "it as unset)"
    ]
